/*
 * lc.h: libcoll's private header: the objects behind the public handles and the few
 * functions its files share (prefix lc_, never exported: the library is built with
 * hidden visibility). Its files in layers, bottom to top, each calling only those below
 * it (tests/structure checks):
 *   conn.c      the connection, its socket, the errors, reaping completions;
 *   buffers.c   the shared buffers;
 *   direct.c    direct ops (a lent group's tiny ops run in this process);
 *   wait.c      one request's completion and the waiting policy, coll_wait_stream;
 *   submit.c    one op into the ring (or a direct op);
 *   compose.c   composite requests; gather, scatter, alltoallv;
 *   requests.c  coll_wait, coll_test, coll_wait_any over both kinds of request;
 *   span.c      children across pods;
 *   ops.c       the coll_* op calls;
 *   groups.c    group handles, coll_disconnect.
 */
#ifndef LIBCOLL_LC_H
#define LIBCOLL_LC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "coll/coll.h"
#include "cpus.h"
#include "lcgpu.h"
#include "ring.h"
#include "spin.h"
#include "util.h"
#include "wire.h"

#define DEFAULT_SOCKET "/tmp/coll-agent.sock"
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_SPIN_US 50
/* With fewer CPUs than this to keep busy (cpus.h), an op between pods sleeps at once:
 * its spinning would take the CPU from the agent threads that produce its result. With
 * more, it spins first like any op (bench/RESULTS.md: 2x faster on a 16-CPU host, 25%
 * slower on 2). */
#define SPIN_MIN_CPUS 4
/* submission with every request slot taken, some by ops only streams wait for */
#define SLOT_WAIT_NS (30LL * 1000000000)

enum req_state { REQ_FREE = 0, REQ_PENDING, REQ_DONE };

struct req {
    uint32_t gen;
    uint8_t state;
    uint8_t rang;         /* submission woke a sleeping agent: sleep at once, don't spin */
    uint8_t gpu;          /* a GPU op: its done word can be waited on by a stream */
    uint8_t detached;     /* handed to a stream (coll_wait_stream): freed when it completes */
    uint8_t agent_failed; /* the agent failed it: its reason is in the shared region */
    uint32_t group;       /* handle of the group it was submitted to */
    int32_t status;
    coll_buffer *sb, *rb;
    /* a direct op (direct.c): run here on the group's lent connections, not by the agent */
    uint8_t direct;
    uint8_t kind, dtype, redop;
    int32_t root;
    uint64_t count;
    uint64_t premul; /* redop WIRE_REDOP_PREMUL: this rank's scalar */
    const void *send;
    void *recv;
    int *src_out;         /* a receive from any rank: where its consumer writes the sender */
    int64_t t0, deadline; /* submitted at, and its deadline */
    coll_group *dg;
    char why[WIRE_WHY_MAX]; /* a failed direct op's reason */
};

struct coll_buffer {
    coll_conn *conn;
    uint32_t id;
    int device;
    int kind;               /* enum wire_mem_kind */
    struct lcgpu_mem *gmem; /* CUMEM_FD buffers libcoll allocated */
    void *ptr;
    size_t size;
    uint32_t inflight; /* ops in flight that use it; guarded by conn->lock */
    int hooked;        /* coll_alloc_hook's block: coll_free_hook may release it */
};

/* A premultiplied sum's slot of a group handle (coll_redop_create_premul_sum): set once,
 * under conn->lock, and never changed (the agent holds the same value). set is written
 * last (release) and read first (acquire) by submissions, which take no lock. */
struct lc_premul {
    _Atomic uint8_t set;
    uint8_t dtype;
    uint32_t refs; /* ops the caller holds: informative (a slot is never given back) */
    uint64_t bits; /* the scalar's bits, zero-extended */
};

struct coll_group {
    coll_conn *conn;
    uint32_t handle;
    int gpu;        /* the group runs on NCCL: its ops take GPU buffers and a stream */
    uint32_t epoch; /* the agent's own epoch of the group when opened: ring entries carry it */
    coll_group_info info;
    struct lc_direct *d; /* direct ops' state (direct.c); NULL: the group never runs them */
    int *parent_ranks;   /* a child's ranks in its parent (coll_group_create) */
    int nparent_ranks;
    struct lc_span *span;  /* a child across pods (span.c); NULL: the agent runs the group */
    uint32_t next_span_id; /* a group with an agent handle: the id its next span child
                            * proposes (span.c); guarded by conn->lock */
    struct lc_premul premul[WIRE_PREMUL_SLOTS];
    coll_group *next;
};

/* a turn at what a connection's waits move for others (rsag.c's two-step ops) */
typedef void (*lc_progress_fn)(coll_conn *c);

struct coll_conn {
    pthread_mutex_t lock;
    /* Waiting threads: at most one (the poller) sleeps on the doorbell and the socket;
     * the others sleep on cv, which is broadcast whenever completions are reaped or the
     * poller leaves. With several threads in epoll on one edge-triggered doorbell, the
     * edge woke one of them and a completion reaped for another thread was never seen. */
    pthread_cond_t cv; /* CLOCK_MONOTONIC; guarded by lock */
    int poller;        /* a thread sleeps in epoll; guarded by lock */
    int cv_waiters;    /* threads sleeping on cv; guarded by lock */
    int fd, efd_agent, efd_client;
    int epfd;  /* efd_client (edge-triggered: never drained) and the socket */
    int armed; /* coll_conn_fd was called: counted as sleeping for good (the agent rings
                * every completion), no new direct ops; set once under lock, read atomically */
    struct wire_shm *shm;
    size_t shm_size;
    uint32_t sq_next, cq_head; /* next sq entry to fill, next cq entry to read */
    uint32_t rpc_id;
    int timeout_ms;
    int spin_us;
    struct spin_adapt spin; /* coll_wait's: how long to spin before sleeping (c->lock) */
    int spin_set;           /* COLL_SPIN_US was given: spin that long for every op */
    int few_cpus;           /* fewer than SPIN_MIN_CPUS to run on: ops between pods sleep at once */
    cpu_set_t cpus;         /* ... unless the agent says it runs outside these (submit.c) */
    coll_err lost;          /* COLL_OK while the agent is there */
    char lost_msg[WIRE_ERRMSG_MAX];
    struct req reqs[WIRE_RING_ENTRIES];
    uint32_t free_idx[WIRE_RING_ENTRIES];
    uint32_t nfree;
    uint32_t ndetached;        /* requests only a stream waits for (coll_wait_stream) */
    int agent_gpu;             /* the agent imports GPU buffers */
    int agent_lease;           /* the agent lends host groups' connections (direct.c) */
    int agent_noack;           /* the agent takes WIRE_SQE_F_NOACK sends (span.c) */
    int agent_sig;             /* ... and WIRE_SQE_F_SIG sends and receives */
    int agent_any;             /* the agent says who sent (wire_shm.src): receives from any rank */
    int direct_all;            /* COLL_DIRECT=all: every collective may run here (direct.c) */
    int64_t direct_wait_ns;    /* COLL_DIRECT_WAIT_MS: how long a refused lease is asked again */
    int shm_gpu;               /* the region is registered with CUDA */
    intptr_t shm_delta;        /* host -> GPU address of the region */
    coll_err stream_err;       /* a failed op that was handed to a stream, not yet reported */
    uint32_t stream_err_group; /* its group: closing that group forgets the error */
    char stream_err_msg[256];
    coll_buffer **bufs; /* sorted by ptr */
    size_t nbufs, capbufs;
    coll_group *groups;
    struct lc_cop *sops; /* composite requests (span.c), LC_COP_OPS; guarded by lock */
    atomic_int staged;   /* ops in steps with a step left to post (rsag.c) */
    /* what moves them (set by rsag.c before staged first rises: wait.c calls up through
     * it, never by name) */
    _Atomic lc_progress_fn stage_progress;
};

/* A turn at the ops in steps that no thread waits for (rsag.c, through the pointer it
 * set: the waits that call this are below it), one load when there are none. Every wait
 * that blocks gives one at least every STAGED_SLICE_NS: a peer may wait for this rank's
 * second step before it joins the op waited for. */
#define STAGED_SLICE_NS (200 * 1000LL)
static inline void lc_staged_turn(coll_conn *c)
{
    if (!atomic_load_explicit(&c->staged, memory_order_relaxed)) return;
    lc_progress_fn f = atomic_load_explicit(&c->stage_progress, memory_order_acquire);
    if (f) f(c);
}

/* conn.c */
/* Set this thread's coll_last_error() text and return e. */
coll_err lc_fail(coll_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One request/reply exchange with the agent; caller holds c->lock. */
coll_err lc_rpc(coll_conn *c, union wire_msg *m, int pass_fd, unsigned reply_type,
                union wire_msg *reply, int *fds, int *nfds);
/* The agent is gone (why): every pending request completes with why; caller holds the
 * lock. */
void lc_mark_lost(coll_conn *c, coll_err why, const char *msg);
/* A call on a connection marked lost: fails with its code and a reason that says
 * whether the agent stopped (SHUTDOWN: it said goodbye) or was lost. */
coll_err lc_fail_lost(const coll_conn *c);
/* The connection failed (hung up, reset): read what the agent said last, where that is
 * a goodbye (WIRE_ERROR): the connection is marked lost with it (SHUTDOWN where the agent
 * stops) and its code returned; else COLL_OK (nothing marked). Caller holds the lock. */
coll_err lc_goodbye(coll_conn *c);
int lc_env_int(const char *name, int def);

/* Reap every completion the agent has posted; caller holds the lock. */
void lc_reap(coll_conn *c);
/* The agent's reason for failing request slot idx. */
void lc_agent_why(const coll_conn *c, uint32_t idx, char out[WIRE_WHY_MAX]);
/* coll_disconnect's first and last steps (groups.c frees groups and buffers between):
 * hang up (the agent ends the session) and unmap the region; free c itself. */
void lc_conn_hang_up(coll_conn *c);
void lc_conn_free(coll_conn *c);

/* buffers.c */
void lc_buffer_free(coll_buffer *b);
/* Register the session region with CUDA once (caller holds the lock). */
coll_err lc_shm_for_gpu(coll_conn *c);
/* The registered buffer that holds [p, p + bytes), or NULL; caller holds the lock. */
coll_buffer *lc_find_buffer(coll_conn *c, const void *p, uint64_t bytes);
/* coll_disconnect: the allocation hooks forget c if it is the bound connection. */
void lc_hooks_forget(coll_conn *c);

/* direct.c: a host group's tiny ops run by this process on connections the agent lent
 * (docs/decisions/0011-direct-ops.md). Lock order: the group's direct lock, then c->lock. */
struct lc_direct;
/* At coll_group_open: set g->d up if the group may run direct ops (NOMEM on failure). */
coll_err lc_direct_init(coll_group *g);
/* Whether the op of kind/dtype/count moving bytes here should run directly. */
int lc_direct_wants(const coll_group *g, unsigned kind, unsigned dtype, uint64_t count,
                    uint64_t bytes);
/* Take g's direct lock and make sure the lease is held: 1 (held: submit directly, then
 * lc_direct_queue and lc_direct_unlock), or 0 (not now: the lock is let go, use the ring).
 * Caller holds no lock. */
int lc_direct_begin(coll_group *g);
/* As lc_direct_begin, for an op on host memory outside coll buffers, which runs here or
 * not at all: waits (bounded) for the lease. COLL_OK with the direct lock held, or a
 * coll_err (lc_fail: why) with no lock held. */
coll_err lc_direct_begin_raw(coll_group *g);
/* Queue request idx (its fields set, state PENDING) and start it; caller holds the direct
 * lock (not c->lock), which this lets go. */
void lc_direct_queue(coll_group *g, uint32_t idx);
void lc_direct_unlock(coll_group *g);
/* The group's op timeout, as the lease said (direct lock held). */
int64_t lc_direct_op_ns(const coll_group *g);
/* Before an op that is not direct: finish g's direct ops and give the lease back. */
void lc_direct_give_back(coll_group *g);
/* Move g's direct ops on: until deadline (0: one pass without waiting, at most wait_ns
 * per call otherwise) or until request slot idx is done. Caller holds no lock. try: give
 * up at once if another thread moves them. */
void lc_direct_progress(coll_group *g, uint32_t idx, int64_t deadline, int try);
/* Group close or disconnect: drop the lease (give it back if give_back) and free g->d. */
void lc_direct_fini(coll_group *g, int give_back);

/* wait.c: one request that is not composite */
/* coll_wait_stream (keep: coll_wait_stream_keep) of a request that is not composite. */
coll_err lc_wait_stream(coll_conn *c, coll_request req, void *stream, int keep);
/* Whether req is still a live (pending or unreported) request. */
int lc_req_live(coll_conn *c, coll_request req);
/* Sleep until a completion, a word from the agent or the deadline (0: none), unless the
 * wait for one of the n requests (n == 0: for a free request slot) is over; caller does
 * not hold the lock. */
void lc_sleep_for_completion(coll_conn *c, int64_t deadline, const coll_request *reqs, size_t n);
/* coll_wait of one op (c not NULL). */
coll_err lc_wait_one(coll_conn *c, coll_request req, int timeout_ms);
/* A look at one op without waiting (a direct op's group moved one pass): 1 and *st if
 * done (its result reported), 0 if pending (*direct: as a direct op, when not NULL),
 * -1 if unknown. */
int lc_try_one(coll_conn *c, coll_request req, coll_err *st, int *direct);

/* submit.c: one op */
struct op_args {
    uint8_t kind;
    int dtype, redop; /* as the caller passed them: range-checked before they narrow */
    int32_t peer;
    uint64_t count;
    const void *send;
    void *recv;
    int send_used, recv_used; /* whether this rank reads send / writes recv */
    void *stream;
    int tag;        /* send, recv */
    unsigned flags; /* WIRE_SQE_F_MORE: a GPU group's send or receive whose NCCL group goes on */
    int *source;    /* a receive from any rank (peer COLL_ANY_SOURCE): where to say who sent */
};
/* The op's arguments, range-checked against g (a failure said). */
coll_err lc_op_check(const coll_group *g, const struct op_args *a);
/* Submit a checked op on g (a group with an agent handle). */
coll_err lc_submit(coll_group *g, const struct op_args *a, coll_request *req);
/* A send or receive on g (a group with an agent handle) with any tag up to WIRE_TAG_MAX,
 * coll's own ones included; sig: the signature (WIRE_SIG) of the collective it is part of,
 * which the receiver's must equal where the agent checks them, or -1. */
coll_err lc_p2p(coll_group *g, unsigned kind, const void *send, void *recv, uint64_t count,
                int dtype, int peer, uint32_t tag, void *stream, unsigned flags, int sig,
                coll_request *req);

/* compose.c: composite requests, ops made of tagged sends and receives posted at once,
 * then a local step (a reduction in rank order); their ids have bit 31 of the low word
 * set. Children across pods run every op so; gather, scatter and alltoallv of every host
 * group too. Tags from LC_SPAN_TAG_BASE on are coll's own. */
#define LC_SPAN_TAG_BASE 0x40000000u /* tags from here on are coll's own (COLL_TAG_MAX) */
#define LC_SPAN_IDS 0xffffu          /* ids 0..LC_SPAN_IDS - 1; LC_SPAN_IDS: creation */
#define LC_SPAN_SUB_OPS 0x1fffu      /* a child's collectives; 0..LC_SPAN_SUB_OPS - 1: its tags */
#define LC_SPAN_STAGED 0x2000u       /* its ops in steps: this + their number mod this */
#define LC_COP_OPS 64                /* composite requests in flight per connection */
#define LC_COP_SUBS (2 * WIRE_CHILD_MAX) /* sends and receives of one composite op */
#define SPAN_SCRATCH 8                   /* scratch buffers of a child: ops that need one */

struct span_scratch {
    coll_buffer *b;
    int busy; /* guarded by conn->lock */
};

/* A child across pods (span.c). */
struct lc_span {
    coll_group *root; /* whose sends and receives carry ours; NULL once it closed (lock) */
    int *ranks;       /* the root rank of each rank of the child */
    int n, me;
    uint32_t id;
    uint32_t staged; /* ops in steps submitted (posting), each on a tag of its own */
    struct span_scratch scratch[SPAN_SCRATCH];
    /* held while an op posts its sends and receives: each op's are contiguous, so ops
     * submitted one after the other pair in that order on every rank */
    pthread_mutex_t posting;
};

/* An allreduce of a child across pods in two steps (rsag.c): each rank's block reduced
 * by its owner (a reduce_scatter), then every owner's block to every rank (an
 * allgather); the second step posted once the first completed. */
struct lc_rsag {
    uint8_t on;     /* this op runs so */
    uint8_t live;   /* its second step is not posted: another wait may move it (lock) */
    uint8_t moving; /* ... and one does now (lock) */
    uint8_t bad1;   /* its first step failed here (MISMATCH): its second refuses */
    int step, n, me;
    const int *ranks; /* the root rank of each rank */
    coll_group *root;
    uint32_t tag;
    int dtype, redop;
    size_t es;
    uint64_t count; /* elements in all: n nearly equal blocks */
    char *acc;      /* the vector: this rank's contribution, then the result */
    char *tmp;      /* block me of every rank, in rank order */
};

/* A composite request: the sends and receives of one op, then its local step. */
struct lc_cop {
    uint32_t gen;
    uint8_t used, waiting; /* guarded by conn->lock */
    coll_group *g;
    int nsub;
    coll_request sub[LC_COP_SUBS];
    uint8_t subdone[LC_COP_SUBS];
    coll_err st;
    char why[WIRE_ERRMSG_MAX];
    /* the local step, once every send and receive is done: dst = reduce(nsrc blocks of
     * src, in rank order) */
    int reduce;
    void *dst;
    const char *src;
    uint64_t count;
    size_t bytes;
    int dtype, redop, nsrc;
    struct span_scratch *sc; /* released when the op is done */
    /* a GPU group's op: the stream its sends and receives follow, and how many of them
     * are still to post (all but the last say more follow: one NCCL group) */
    void *stream;
    int more_left;
    unsigned send_flags; /* on every send posted: WIRE_SQE_F_NOACK where the op allows it */
    int sig; /* on every send and receive posted: the op's WIRE_SIG, or -1 (lc_cop_new's) */
    struct lc_rsag rsag;
};

static inline uint32_t lc_span_tag(uint32_t id, uint32_t sub)
{
    return LC_SPAN_TAG_BASE | id << 14 | sub;
}
static inline int lc_cop_is(coll_request r)
{
    return (r.id & 0x80000000u) != 0;
}
/* A slot for an op of g that posts need sends and receives (NULL and *rc: LIMIT), its
 * request, one send or receive of it on group on (a failure is the op's result), the
 * wait for g's ones in flight (coll_group_close), whether [p, p + bytes) lies in a buffer
 * of g's connection (INVALID with what otherwise), and wait, test and the pending parts
 * (for a sleep) of a composite request. lc_cop_sub_done: part i completed with st (the
 * op keeps its first failure and why); lc_cop_try_subs: a look at every part not done,
 * 1 when all are. */
struct lc_cop *lc_cop_new(coll_group *g, int need, int *idx, coll_err *rc);
coll_request lc_cop_req(const struct lc_cop *op, int idx);
void lc_cop_post(struct lc_cop *op, coll_group *on, unsigned kind, const void *send, void *recv,
                 uint64_t count, int dtype, int peer, uint32_t tag);
void lc_cop_sub_done(struct lc_cop *op, int i, coll_err st);
int lc_cop_try_subs(coll_conn *c, struct lc_cop *op);
void lc_cop_drain(coll_group *g);
coll_err lc_cop_in_coll(coll_group *g, const char *what, const void *p, size_t bytes);
coll_err lc_cop_wait(coll_conn *c, coll_request req, int timeout_ms);
coll_err lc_cop_test(coll_conn *c, coll_request req, int *done);
size_t lc_cop_subs(coll_conn *c, coll_request req, coll_request *out, size_t cap);

/* rsag.c: a child's allreduce in two steps. Whether one of n ranks and bytes in all
 * runs so ($COLL_RSAG: 0 never, 1 whenever it may); its first step posted (op->rsag filled
 * in but for live and step); after its first step completed, the local reduction and
 * the second step posted (1; after a MISMATCH, a second step every receive refuses), or
 * 0 when there is none to post (done, or failed otherwise); and a turn at every
 * such op of c that no thread waits for, from any wait (a rank's second step goes out
 * only while it waits or tests for something). */
int lc_rsag_fits(int n, size_t bytes);
void lc_rsag_begin(coll_conn *c, struct lc_cop *op);
int lc_rsag_next(coll_conn *c, struct lc_cop *op);
void lc_rsag_progress(coll_conn *c);
/* coll_wait_stream_keep of a composite op of a GPU group: the stream waits for each part
 * (keep 0, coll_wait_stream: refused, the op would have nobody to reap it). */
coll_err lc_cop_wait_stream(coll_conn *c, coll_request req, void *stream, int keep);

/* span.c: children whose ranks span pods, run here over their root group's tagged
 * sends and receives (docs/decisions/0025-children-across-pods.md), every op a
 * composite request. */
/* coll_group_create's part for a list that spans pods (parent a host group with an agent
 * handle, or a span child): 1 and *rc when it made (or failed to make) the child here,
 * 0 when the agent makes it (the list is on one pod): from *on (parent, or a span
 * child's root), with the ranks *mapped to on's when set (the caller frees them). */
int lc_span_create(coll_group *parent, const int *ranks, int n, coll_group **child, coll_err *rc,
                   coll_group **on, int **mapped);
/* An op of a span child (kind as the ring's, a tag for send and recv). */
coll_err lc_span_submit(coll_group *g, unsigned kind, int dtype, int redop, int peer,
                        uint64_t count, const void *send, void *recv, int tag, coll_request *req);
/* A span child's root group, or NULL once that closed. */
coll_group *lc_span_root(coll_group *g);
/* A span child closed: its ops finish first. root closed: its span children orphaned. */
void lc_span_close(coll_group *g);
void lc_span_root_closed(coll_group *root);
/* coll_disconnect: free what span.c holds of g (its buffers go with the connection's). */
void lc_span_free(coll_group *g);

#endif
