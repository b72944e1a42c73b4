/*
 * wire.h: the local plane's formats, shared by libcoll and the agent.
 *
 * Control messages travel over a SOCK_SEQPACKET socket: a fixed 16-byte header that
 * never changes between protocol versions, then a fixed-size body per type. Ops and
 * completions travel through two single-producer rings in a shared-memory region
 * the agent creates per session. Everything a peer sends is checked by the decoders
 * here before use: a message that fails is a protocol error for that session only.
 */
#ifndef COLL_WIRE_H
#define COLL_WIRE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC 0x4c4c4f43u /* "COLL" little-endian */
#define WIRE_VERSION 6
#define WIRE_NAME_MAX 64
#define WIRE_ERRMSG_MAX 192
#define WIRE_WHY_MAX 160       /* the reason of a failed op, in the shared region */
#define WIRE_MAX_MSG 512       /* no control message is larger */
#define WIRE_DIRECT_HANDLES 16 /* ... of which may run direct ops (the first) */
#define WIRE_STATUS_COUNT 18   /* COLL_OK .. COLL_ERR_INTERNAL */
/* the op-duration histogram's upper bounds, in seconds (agent: group_hist_bounds) */
#define WIRE_HIST_BUCKETS 14
#define WIRE_HIST_BOUNDS                                                                           \
    {                                                                                              \
        5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 2.5e-3, 1e-2, 2.5e-2, 0.1, 0.5, 2.5, 10      \
    }
#define WIRE_RING_ENTRIES 256               /* ops in flight per session */
#define WIRE_MAX_BUFFER ((uint64_t)1 << 46) /* bytes one shared buffer may hold (64 TiB) */

enum wire_type {
    WIRE_HELLO = 1,      /* client -> agent */
    WIRE_HELLO_OK,       /* agent -> client, with fds: shm, agent doorbell, client doorbell */
    WIRE_ERROR,          /* agent -> client: the request failed */
    WIRE_GROUP_OPEN,     /* client -> agent */
    WIRE_GROUP_OPEN_OK,  /* agent -> client */
    WIRE_GROUP_CLOSE,    /* client -> agent */
    WIRE_GROUP_CLOSE_OK, /* agent -> client */
    WIRE_MEM_REG,        /* client -> agent, with fd */
    WIRE_MEM_REG_OK,     /* agent -> client */
    WIRE_MEM_RELEASE,    /* client -> agent */
    WIRE_MEM_RELEASE_OK, /* agent -> client */
    WIRE_GROUP_STATE,    /* client -> agent */
    WIRE_GROUP_STATE_OK, /* agent -> client */
    WIRE_LEASE,          /* client -> agent (only to an agent that says WIRE_HELLO_F_LEASE) */
    WIRE_LEASE_OK,       /* agent -> client, with the epoch's collective connections */
    WIRE_LEASE_BACK,     /* client -> agent */
    WIRE_LEASE_BACK_OK,  /* agent -> client */
    WIRE_GROUP_CREATE,   /* client -> agent; answered with WIRE_GROUP_OPEN_OK */
    WIRE_REDOP_SET,      /* client -> agent */
    WIRE_REDOP_SET_OK,   /* agent -> client */
    WIRE_TYPE_END
};

struct wire_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t len;    /* whole message, header included */
    uint32_t req_id; /* echoed by the reply */
};

struct wire_hello {
    struct wire_hdr h;
    uint32_t pid;
    uint32_t flags;
    char client[WIRE_NAME_MAX]; /* free-form name for logs */
};

#define WIRE_HELLO_F_GPU 1u   /* the agent can import GPU buffers */
#define WIRE_HELLO_F_LEASE 2u /* the agent lends a host group's connections (WIRE_LEASE) */
#define WIRE_HELLO_F_NOACK 4u /* the agent takes sends flagged WIRE_SQE_F_NOACK */
#define WIRE_HELLO_F_SIG 8u   /* ... and sends and receives flagged WIRE_SQE_F_SIG */

struct wire_hello_ok {
    struct wire_hdr h;
    uint64_t session_id;
    uint64_t shm_size;
    uint32_t ring_entries;
    uint32_t flags; /* WIRE_HELLO_F_* */
    char agent_version[32];
};

struct wire_error {
    struct wire_hdr h;
    int32_t code; /* coll_err */
    uint32_t pad;
    char msg[WIRE_ERRMSG_MAX];
};

#define WIRE_OP_MS_MAX 86400000u /* a handle's op timeout: a day at most */
#define WIRE_ANY_SOURCE (-1)    /* a receive's peer: whichever rank sends first (COLL_ANY_SOURCE) */
#define WIRE_TAG_MAX 0x7fffffff /* sends and receives pair by tag, 0 to this */
struct wire_group_open {
    struct wire_hdr h;
    int32_t slot;   /* -1: any */
    uint32_t op_ms; /* this handle's ops' timeout (1..WIRE_OP_MS_MAX); 0: the group's */
    int32_t rank;   /* -1: as slot says; else the group rank whose slot to take (slot -1) */
    uint32_t pad;
    char name[WIRE_NAME_MAX];
};

struct wire_group_open_ok {
    struct wire_hdr h;
    uint32_t handle;
    uint32_t epoch;
    uint32_t rank, size, local_slot, local_slots, node_index, nodes;
    char backend[16];
};

/* A child of the group open on handle parent: the n ranks of the parent listed, in
 * the child's rank order (coll_group_create). */
#define WIRE_CHILD_MAX 96
struct wire_group_create {
    struct wire_hdr h;
    uint32_t parent;
    uint32_t n;
    uint32_t op_ms; /* as in wire_group_open */
    uint32_t pad;
    uint32_t ranks[WIRE_CHILD_MAX];
};

struct wire_group_close {
    struct wire_hdr h;
    uint32_t handle;
    uint32_t pad;
};

struct wire_group_state {
    struct wire_hdr h;
    uint32_t handle;
    uint32_t pad;
};

/* Whether the group stands across its pods (formed), its epoch, and what formation
 * waits for when it does not ("waiting for node indexes 2,3; DNS shows 3 of 4 pods"). */
struct wire_group_state_ok {
    struct wire_hdr h;
    uint32_t formed;
    uint32_t epoch;
    char detail[WIRE_ERRMSG_MAX];
};

/*
 * Direct ops (docs/decisions/0011-direct-ops.md). A client whose group has one slot per
 * pod, on the host backend, asks for the epoch's collective connections; the agent
 * lends them (SCM_RIGHTS: for every other pod in node order, our bytes to it, then its
 * bytes to us) with where the epoch's op numbering and broadcast-ack state stand, or
 * refuses with WIRE_ERROR (BUSY: not now, ask again later; UNSUPPORTED: never for this
 * group). The client then runs its tiny ops itself on them, and gives them back with the
 * state it left (and, code nonzero, the failure that ends the epoch) before any other op.
 */
#define WIRE_LEASE_STATE 48 /* the agent's broadcast-ack state, opaque to libcoll */
#define WIRE_LEASE_MAX_FDS 30
/* The bytes read ahead of each pod's connection (agent/backends/tcp.h: struct tcp_stash)
 * are the stream's and travel with the lease both ways: their counts in the message, by
 * node index, the bytes in the region's lease_stash[handle][node]. */
#define WIRE_STASH_NODES 16 /* WIRE_LEASE_MAX_FDS / 2 + 1 */
#define WIRE_STASH_BYTES 4096
typedef uint8_t wire_stash[WIRE_STASH_NODES][WIRE_STASH_BYTES];
struct wire_lease {
    struct wire_hdr h;
    uint32_t handle;
    uint32_t pad;
};

struct wire_lease_ok {
    struct wire_hdr h;
    uint64_t lease_id;
    uint64_t seq;   /* the next op's number in the epoch */
    uint32_t op_ms; /* the group's op timeout */
    uint32_t nodes, me, nfds;
    uint32_t has_prev, run; /* the broadcast-ack state (agent/backends/tcp_priv.h) */
    uint8_t prev[WIRE_LEASE_STATE];
    uint32_t lease_void; /* the session's lease_void word when lent (struct wire_shm) */
    uint32_t flags;      /* WIRE_LEASE_F_* */
    uint16_t stash_len[WIRE_STASH_NODES];
};
/* No other pod of the group may run on this pod's CPUs (agent/rdv_wire.h,
 * RDV_MEMBER_CPU_SHARED): a wait for a pod's bytes may spin its whole budget every time
 * (agent/backends/tcp.h: tcp_comm's spin_hold). Agents from before the flag leave it 0,
 * which keeps the learnt spin. */
#define WIRE_LEASE_F_OWN_CPUS 1u

struct wire_lease_back {
    struct wire_hdr h;
    uint32_t handle;
    int32_t code; /* COLL_OK, or why the epoch must end (a direct op failed) */
    uint64_t lease_id;
    uint64_t seq;
    uint32_t has_prev, run;
    uint8_t prev[WIRE_LEASE_STATE];
    uint16_t stash_len[WIRE_STASH_NODES];
    char why[WIRE_WHY_MAX];
};

/* The reply to WIRE_LEASE_BACK. code nonzero: the lease's epoch was ending already (a pod
 * left: the agent waited for the ops the client had under way, struct wire_shm's
 * lease_q), and this is why; the client reports it for an op that failed on the way. */
struct wire_lease_back_ok {
    struct wire_hdr h;
    int32_t code;
    uint32_t pad;
    char why[WIRE_WHY_MAX];
};

/* How a shared buffer travels. */
enum wire_mem_kind {
    WIRE_MEM_MEMFD = 0, /* host memory: a sealed memfd (the fd) */
    WIRE_MEM_CUMEM_FD,  /* GPU memory: a cuMem allocation exported as a POSIX fd */
    WIRE_MEM_CUDA_IPC,  /* GPU memory: a legacy cudaIpcMemHandle_t (no fd) */
    WIRE_MEM_KIND_COUNT
};

struct wire_mem_reg {
    struct wire_hdr h;
    uint64_t size;    /* bytes the client uses, from the start of the buffer */
    uint64_t offset;  /* CUDA_IPC: where the buffer starts in the allocation the handle names */
    int32_t device;   /* -1: host; else the client's ordinal (for logs: the uuid names the GPU) */
    uint32_t kind;    /* enum wire_mem_kind */
    uint8_t uuid[16]; /* GPU kinds: the device's UUID */
    uint8_t ipc[64];  /* CUDA_IPC: the handle */
};

struct wire_mem_reg_ok {
    struct wire_hdr h;
    uint32_t buf_id;
    uint32_t pad;
};

struct wire_mem_release {
    struct wire_hdr h;
    uint32_t buf_id;
    uint32_t pad;
};

/*
 * A premultiplied sum (coll_redop_create_premul_sum): ring entries name one by a redop
 * of WIRE_REDOP_PREMUL + slot, and WIRE_REDOP_SET gives a slot of a group handle its
 * dtype and scalar first. A slot is set once for the handle's life and never changes
 * (libcoll hands out a pair it already set again), so no ring entry can meet a value
 * set after it was written. scalar: the dtype's own bits in the low bytes (integers
 * and floats of 1 to 8 bytes), the rest zero.
 */
#define WIRE_REDOP_PREMUL 128u
#define WIRE_PREMUL_SLOTS 128u

struct wire_redop_set {
    struct wire_hdr h;
    uint32_t handle;
    uint32_t slot;
    uint32_t dtype;
    uint32_t pad;
    uint64_t scalar;
};

/* Any control message, decoded. */
union wire_msg {
    struct wire_hdr h;
    struct wire_hello hello;
    struct wire_hello_ok hello_ok;
    struct wire_error error;
    struct wire_group_open group_open;
    struct wire_group_open_ok group_open_ok;
    struct wire_group_close group_close;
    struct wire_group_create group_create;
    struct wire_group_state group_state;
    struct wire_group_state_ok group_state_ok;
    struct wire_mem_reg mem_reg;
    struct wire_mem_reg_ok mem_reg_ok;
    struct wire_mem_release mem_release;
    struct wire_lease lease;
    struct wire_lease_ok lease_ok;
    struct wire_lease_back lease_back;
    struct wire_lease_back_ok lease_back_ok;
    struct wire_redop_set redop_set;
};

/* Fill the header of m for type (its length comes from the type). */
void wire_init(union wire_msg *m, enum wire_type type, uint32_t req_id);
/* Size of a message of type t, 0 if t is unknown. */
size_t wire_size(unsigned t);
/*
 * Check n received bytes and copy them into *out. Returns 0, or -1 with a one-line
 * reason in err: short or oversized message, bad magic, other version (version_out
 * then holds the peer's, so the caller can say so), unknown type, length field that
 * disagrees with the type or with n, unterminated string.
 */
struct msghdr;
/* The descriptors a received message carried (SCM_RIGHTS): the first max go to fds, any
 * beyond are closed at once (max 0: close them all). Returns how many went to fds. */
int wire_take_fds(struct msghdr *mh, int *fds, int max);

int wire_decode(const void *buf, size_t n, union wire_msg *out, unsigned *version_out, char *err,
                size_t errlen);

/* ---- ops ------------------------------------------------------------------- */

enum wire_kind {
    WIRE_OP_ALLREDUCE = 0,
    WIRE_OP_BROADCAST,
    WIRE_OP_REDUCE,
    WIRE_OP_ALLGATHER,
    WIRE_OP_REDUCE_SCATTER,
    WIRE_OP_ALLTOALL,
    WIRE_OP_SEND,
    WIRE_OP_RECV,
    WIRE_OP_BARRIER,
    WIRE_OP_KIND_COUNT
};

const char *wire_kind_name(unsigned kind);
/* A collective's signature, which each of its sends and receives on a child across pods
 * carries (WIRE_SQE_F_SIG): kind in the high four bits, reduction in the low four (0
 * where the op reduces nothing). wire_sig_ok: whether sig names a kind and a reduction;
 * wire_sig_name: "allreduce (max)", "allgather" into buf. */
#define WIRE_SIG(kind, redop) ((uint8_t)((kind) << 4 | (redop)))
int wire_sig_ok(unsigned sig);
const char *wire_sig_name(unsigned sig, char *buf, size_t cap);
/* Whether ops of kind take a reduction (allreduce, reduce, reduce_scatter) / a root
 * (broadcast, reduce): what participants must agree on beyond kind, dtype and count. */
static inline int wire_kind_reduces(unsigned kind)
{
    return kind == WIRE_OP_ALLREDUCE || kind == WIRE_OP_REDUCE || kind == WIRE_OP_REDUCE_SCATTER;
}
static inline int wire_kind_rooted(unsigned kind)
{
    return kind == WIRE_OP_BROADCAST || kind == WIRE_OP_REDUCE;
}

#define WIRE_BUF_NONE 0u

/* sqe flags */
#define WIRE_SQE_F_GPU                                                                             \
    1u /* GPU op: the client's stream writes ready[i] = tag before the op may                      \
          start, and the agent writes done[i] = tag after it, where                                \
          i = (tag & 0xffffffff) - 1 (see struct wire_shm) */
#define WIRE_SQE_F_MORE                                                                            \
    2u /* a GPU group's send or receive whose NCCL group goes on: the group's next send or         \
          receive is its part (libcoll's gather, scatter and alltoallv); the agent issues          \
          them as one NCCL group (a send and a receive would wait for each other otherwise) */
#define WIRE_SQE_F_NOACK                                                                           \
    4u /* a host send between pods whose receiver says nothing back: it completes once its         \
          bytes are written (libcoll's collectives on a child across pods in which every rank      \
          also receives from each rank it sends to, so a disagreement fails every rank             \
          through its receives); only where the agent says WIRE_HELLO_F_NOACK */
#define WIRE_SQE_F_SIG                                                                             \
    8u /* a host send or receive that is one part of libcoll's collective on a child across        \
          pods: redop holds that collective's signature (WIRE_SIG: its kind and reduction),        \
          carried to the receiver, and a pair whose signatures differ fails with MISMATCH          \
          (ranks that ran different ops, or one reduction each, never mix their bytes); only       \
          where the agent says WIRE_HELLO_F_SIG */
#define WIRE_SQE_F_ALL (WIRE_SQE_F_GPU | WIRE_SQE_F_MORE | WIRE_SQE_F_NOACK | WIRE_SQE_F_SIG)

/* One submitted op; 64 bytes, one cache line. seq is written last (release) and says
 * the entry is complete: the n-th entry (from 0) carries seq n + 1. */
struct wire_sqe {
    uint64_t tag; /* the request id, echoed in the completion */
    uint64_t count;
    uint64_t send_off, recv_off;
    uint32_t group; /* handle from GROUP_OPEN_OK */
    uint32_t epoch;
    uint32_t send_buf, recv_buf; /* ids from MEM_REG_OK, WIRE_BUF_NONE if unused */
    uint8_t kind, dtype, redop, flags;
    int32_t peer;     /* root (broadcast, reduce) or peer rank (send, recv) */
    uint32_t p2p_tag; /* send, recv: the tag they pair by (0..WIRE_TAG_MAX); else 0 */
    _Atomic uint32_t seq;
};

/* A send's or receive's signature as it travels and is compared: 0 for none (a plain
 * send or receive), else WIRE_SIG_ON | its WIRE_SIG (WIRE_SQE_F_SIG). */
#define WIRE_SIG_ON 0x100u
static inline unsigned wire_sqe_sig(const struct wire_sqe *s)
{
    return (s->flags & WIRE_SQE_F_SIG) ? WIRE_SIG_ON | s->redop : 0u;
}
/* Why a send of rank src with signature ss (as wire_sqe_sig) and a receive of rank dst
 * with rs, which differ, do not pair: into buf. */
void wire_sig_why(char *buf, size_t cap, int src, unsigned ss, int dst, unsigned rs);

/* One completion; seq as in wire_sqe. */
struct wire_cqe {
    uint64_t tag;
    int32_t status; /* coll_err */
    _Atomic uint32_t seq;
};

/*
 * Range check of the fields of a snapshot of an sqe that need no session state:
 * kind, dtype, redop, flags, tag. Returns 0 or -1 with a reason.
 */
int wire_sqe_check(const struct wire_sqe *s, char *err, size_t errlen);
/* Whether an op of kind may reduce dtype with redop (bitwise reductions take no
 * floats, complex numbers no min or max, bool no average, a premultiplied sum neither
 * bool nor complex numbers); ops that do not reduce ignore redop. wire_redop_rule says
 * that rule in words, for error messages. */
int wire_redop_fits(unsigned kind, unsigned dtype, unsigned redop);
const char *wire_redop_rule(void);
/* Why a group on the NCCL backend cannot run an op that fits otherwise (16-bit integers,
 * bitwise reductions, the complex product, tagged sends and receives), or NULL. */
const char *wire_nccl_refuses(unsigned kind, unsigned dtype, unsigned redop, uint32_t p2p_tag);
/* Number of elements an op moves through buf: send side or recv side, for a group of
 * size ranks; sets *elems. Returns -1 on overflow. */
int wire_sqe_extent(const struct wire_sqe *s, int recv_side, uint32_t size, uint64_t *elems);
/* Whether an op's send range [send_off, + send_bytes) and receive range [recv_off, +
 * recv_bytes) in one buffer are apart, or one of the in-place forms of coll.h: the same
 * start (allreduce, broadcast, reduce, all-to-all), allgather's send at recv + rank *
 * block, reduce_scatter's receive at send + rank * block (block: count elements in
 * bytes). Any other overlap is refused on both sides: the copies of an op would read
 * what they write. */
int wire_ranges_ok(unsigned kind, uint64_t send_off, uint64_t send_bytes, uint64_t recv_off,
                   uint64_t recv_bytes, uint64_t rank, uint64_t block_bytes);

/* ---- shared-memory rings ----------------------------------------------------- */

#define WIRE_CACHELINE 64

/* cpu: in agent_sleeping and client_sleeping, the CPU that side last ran on, plus one
 * (0: not said; peers from before this field leave it 0, and a side that reads 0 keeps
 * to its rules for an unknown layout). A hint for spinning only: any value is safe. */
struct wire_ring_idx {
    _Atomic uint32_t v;
    _Atomic uint32_t cpu;
    char pad[WIRE_CACHELINE - 2 * sizeof(uint32_t)];
};

/*
 * The direct ops a client ran on one group handle, counted as the agent counts its own
 * (group_metrics): by kind and status, the bytes of those that finished well, and the
 * time from submission to completion. Only the client writes them (one writer: the
 * group's direct lock; relaxed atomic adds); the agent reads them at each /metrics
 * scrape and when the handle closes, and adds only what grew since its last look, so a
 * client can raise its own group's counts (as it could by running ops), never lower them.
 */
struct wire_direct_counts {
    _Atomic uint64_t ops[WIRE_OP_KIND_COUNT][WIRE_STATUS_COUNT];
    _Atomic uint64_t bytes[WIRE_OP_KIND_COUNT];
    _Atomic uint64_t hist[WIRE_HIST_BUCKETS + 1]; /* the last: above every bound */
    _Atomic uint64_t sum_ns;
};

/* A lease's two words (struct wire_shm's lease_q). */
struct wire_lease_words {
    _Atomic uint32_t busy;  /* the client's */
    _Atomic uint32_t drain; /* the agent's */
};

/*
 * The region the agent creates per session. sq: the client produces, the agent
 * consumes; cq: the other way round. A consumer polls the seq of the next entry, so
 * an op and its publication travel in one cache line. cq_head is the client's
 * consumption count, which the agent reads only when the cq might be full. The
 * sleeping words say that a side may be asleep on its doorbell, so the other side
 * must ring it after publishing (a store, a full fence, then the load of the word:
 * see ring.h).
 */
struct wire_shm {
    uint32_t magic;
    uint32_t version;
    uint32_t entries;
    uint32_t pad0;
    /* bumped by the agent whenever a lease of this session's ends on its side (the
     * epoch ended): the client drops a lease taken under another value before its next
     * direct op. Older agents leave it 0 (and lend nothing). */
    _Atomic uint32_t lease_void;
    char pad1[WIRE_CACHELINE - 20];
    struct wire_ring_idx agent_sleeping;
    struct wire_ring_idx client_sleeping;
    struct wire_ring_idx cq_head;
    struct wire_sqe sq[WIRE_RING_ENTRIES];
    struct wire_cqe cq[WIRE_RING_ENTRIES];
    /*
     * Stream order of GPU ops, one pair of words per request slot. Both sides register
     * this region with CUDA, so streams read and write it: the client's stream writes
     * ready[i], the agent's stream waits for it (>= tag) before the op; the agent's
     * stream writes done[i] after the op, and the client's stream may wait for it.
     * Values only grow per slot (the tag's generation), so a late write never blocks a
     * waiter. Either side may also store them from the CPU to release the other's stream
     * when an op cannot run (client gone, op failed, agent gone).
     */
    _Atomic uint64_t ready[WIRE_RING_ENTRIES];
    _Atomic uint64_t done[WIRE_RING_ENTRIES];
    /* why[i]: when the op of request slot i fails, the agent's reason (what failed and
     * where), written before its cqe is published; "" when it has none to add */
    char why[WIRE_RING_ENTRIES][WIRE_WHY_MAX];
    /* direct ops: why the agent ended lease lease_id (its epoch ended), written before
     * lease_void is bumped. Agents from before leases make the region end above this
     * (WIRE_SHM_MIN); they lend nothing. */
    struct {
        uint64_t lease_id;
        int32_t code;
        uint32_t pad;
        char why[WIRE_WHY_MAX];
    } lease_end;
    /*
     * direct ops, per group handle: busy is 1 while the client has direct ops of the
     * handle queued; drain is bumped by the agent when the lease's epoch ends (a pod
     * left) and busy was 1, and the agent then waits (a heartbeat at most) for those ops
     * and the lease back, as it finishes its own queued ops before it ends an epoch: a pod
     * that finished an op and left delivered its bytes first. Each side stores its word,
     * fences (seq_cst) and loads the other's, so one of them always sees the other.
     */
    struct wire_lease_words lease_q[WIRE_DIRECT_HANDLES];
    struct wire_direct_counts direct[WIRE_DIRECT_HANDLES];
    /* direct ops: what was read ahead of each pod's connection, handed over with a lease
     * (wire_lease_ok, wire_lease_back: stash_len). Written only by the side that hands
     * the lease over, before its message; the other copies it out once on receipt */
    wire_stash lease_stash[WIRE_DIRECT_HANDLES];
    /* src[i]: the rank whose send the receive of request slot i took, written before
     * its cqe is published (a receive from any rank asks who). Agents from before it
     * make the region end above this: a client offers no such receive then */
    int32_t src[WIRE_RING_ENTRIES];
};
#define WIRE_SHM_MIN offsetof(struct wire_shm, lease_end)

#endif
