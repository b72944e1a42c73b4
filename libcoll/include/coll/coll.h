/*
 * coll.h: the whole public API of libcoll, the client library of coll-agent.
 *
 * An application connects to its pod's agent, opens the groups it takes part in,
 * shares buffers with the agent and submits collectives that complete
 * asynchronously. Every call returns a coll_err; results come back through a
 * leading out-pointer. On failure coll_last_error() gives a one-line detail for
 * the calling thread.
 *
 * Threads: a coll_conn and everything opened through it may be used from several
 * threads; submissions and completions serialise on a per-connection lock. Handles
 * must not be used after the call that destroys them.
 *
 * Buffers: an op reads and writes memory that libcoll shared with the agent
 * (coll_mem_alloc / coll_mem_register_fd), at addresses aligned to the op's element
 * type (COLL_ERR_INVALID otherwise). The caller must neither modify an op's
 * input nor read its output before the op completes; libcoll refuses to release a
 * buffer while an op that uses it is in flight.
 *
 * How this header grows (what a binding that mirrors it, as Python's ctypes does, may
 * rely on): functions are only added; an enum's values never change meaning (new ones
 * come before its _COUNT, which bindings must not mirror as a constant); coll_request
 * and coll_group_info keep their layout (new facts about a group come through new
 * functions, as coll_group_parent_ranks); option structs carry their own size as their
 * first field and grow only at their end (coll_group_opts). libcoll/abi.txt lists the
 * layout and values a binding mirrors; test_api checks them against this header.
 */
#ifndef COLL_COLL_H
#define COLL_COLL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define COLL_API __attribute__((visibility("default")))
#else
#define COLL_API
#endif

#define COLL_VERSION_MAJOR 0
#define COLL_VERSION_MINOR 3
#define COLL_VERSION_PATCH 0

/*
 * Errors. X(name, value, retryable, message). Retryable errors mean the group
 * changed under the caller (a member left, the agent restarted): close the group
 * (or connection), open it again and resubmit.
 */
#define COLL_ERRORS(X)                                                                             \
    X(COLL_OK, 0, 0, "success")                                                                    \
    X(COLL_ERR_INVALID, 1, 0, "invalid argument")                                                  \
    X(COLL_ERR_NOMEM, 2, 0, "out of memory")                                                       \
    X(COLL_ERR_SYSTEM, 3, 0, "system call failed")                                                 \
    X(COLL_ERR_CONNECT, 4, 1, "cannot connect to the agent")                                       \
    X(COLL_ERR_PROTOCOL, 5, 0, "protocol error between libcoll and the agent")                     \
    X(COLL_ERR_DENIED, 6, 0, "permission denied by the agent")                                     \
    X(COLL_ERR_NOT_FOUND, 7, 0, "not found (no such group or buffer)")                             \
    X(COLL_ERR_BUSY, 8, 0, "resource busy")                                                        \
    X(COLL_ERR_TIMEOUT, 9, 1, "timed out")                                                         \
    X(COLL_ERR_MISMATCH, 10, 1, "participants disagree on the operation")                          \
    X(COLL_ERR_PEER_LOST, 11, 1, "a participant of the group left")                                \
    X(COLL_ERR_EPOCH, 12, 1, "the group was re-formed; reopen it")                                 \
    X(COLL_ERR_AGENT_LOST, 13, 1, "the connection to the agent was lost")                          \
    X(COLL_ERR_SHUTDOWN, 14, 1, "the agent is shutting down")                                      \
    X(COLL_ERR_UNSUPPORTED, 15, 0, "not supported by this group's backend")                        \
    X(COLL_ERR_LIMIT, 16, 0, "a limit was reached")                                                \
    X(COLL_ERR_INTERNAL, 17, 0, "internal error")

typedef enum coll_err {
#define COLL_X_ENUM(name, value, retry, msg) name = value,
    COLL_ERRORS(COLL_X_ENUM)
#undef COLL_X_ENUM
} coll_err;

/* Static English text for err; never NULL. Thread-safe. */
COLL_API const char *coll_strerror(coll_err err);
/* 1 if a failed op or open may succeed after reopening the group or connection. */
COLL_API int coll_err_retryable(coll_err err);
/* Detail of the last failure of a coll_* call on this thread ("" if none). The string
 * belongs to libcoll and stays valid until the thread's next coll_* call. */
COLL_API const char *coll_last_error(void);
/* Version of the library as "major.minor.patch". Static string. */
COLL_API const char *coll_version(void);

typedef enum coll_dtype {
    COLL_INT8 = 0,
    COLL_UINT8,
    COLL_INT32,
    COLL_UINT32,
    COLL_INT64,
    COLL_UINT64,
    COLL_FLOAT16,
    COLL_BFLOAT16,
    COLL_FLOAT32,
    COLL_FLOAT64,
    COLL_INT16, /* host groups only (NCCL has no 16-bit integers) */
    COLL_UINT16,
    COLL_BOOL,        /* one byte, 0 or 1 (the host backend reads any other value as 1) */
    COLL_FLOAT8_E4M3, /* OCP 8-bit floats: e4m3 (torch's float8_e4m3fn: no infinity, */
    COLL_FLOAT8_E5M2, /* largest 448) and e5m2 (largest 57344); see below */
    COLL_COMPLEX64,   /* two float32: real, imaginary (C's float complex) */
    COLL_COMPLEX128,  /* two float64 */
    COLL_DTYPE_COUNT
} coll_dtype;
/* (new dtypes and reductions are added at the end: a value never changes meaning) */

/* Reductions. COLL_AVG is the sum divided by the group size (integer division for
 * integer types). float16, bfloat16 and the float8s are reduced in float32 and rounded
 * once per step to nearest even; a float8 result out of range (an infinity included)
 * becomes the largest finite value of its sign, a NaN stays a NaN (NCCL's saturating
 * conversion). On the host backend, COLL_MIN and COLL_MAX of floats are C's fmin and fmax
 * (a NaN gives way to a number), with -0 below +0. Complex numbers take SUM, AVG and
 * PROD (the textbook (ac - bd, ad + bc), no recovery of infinities as C's Annex G does;
 * host groups only: NCCL has no complex product), never MIN, MAX or the bitwise ones. */
typedef enum coll_redop {
    COLL_SUM = 0,
    COLL_PROD,
    COLL_MIN,
    COLL_MAX,
    COLL_AVG,
    COLL_BAND, /* bitwise and, or, xor: integer dtypes and bool, host groups only */
    COLL_BOR,
    COLL_BXOR,
    COLL_REDOP_COUNT
} coll_redop;
/* bool: SUM and MAX are a logical or, PROD and MIN a logical and (as torch reduces
 * bools), BAND, BOR and BXOR the logical ones; AVG is refused. */

/* Bytes per element of dt, 0 for an invalid dt. */
COLL_API size_t coll_dtype_size(coll_dtype dt);
/* "float32", "sum", ...; "?" when out of range. Static strings. */
COLL_API const char *coll_dtype_name(coll_dtype dt);
COLL_API const char *coll_redop_name(coll_redop op);

typedef struct coll_conn coll_conn;
typedef struct coll_group coll_group;
typedef struct coll_buffer coll_buffer;

/* A submitted operation. A value handle: copying it is fine; it is consumed by the
 * coll_wait / coll_test / coll_wait_all call that reports its completion. */
typedef struct coll_request {
    uint64_t id;
} coll_request;

/* ---- connection ------------------------------------------------------------ */

/* Connect to the agent listening on socket_path (NULL: $COLL_AGENT_SOCKET, else the
 * agent's default path) and complete the handshake. Blocks for at most timeout_ms
 * (<= 0: 10 s). On success *out is a new connection the caller owns. The process that
 * listens on the socket must run as this process's uid, as root, or as a uid listed in
 * $COLL_AGENT_UIDS (comma-separated), checked with SO_PEERCRED before anything is sent.
 * Errors: CONNECT (no agent, or one of another uid), DENIED (uid/gid not allowed),
 * PROTOCOL (version). */
COLL_API coll_err coll_connect(coll_conn **out, const char *socket_path, int timeout_ms);
/* Close the connection and release every group, buffer and request opened through
 * it; ops still in flight are abandoned (the agent fails them for the other
 * participants). Sets *conn to NULL; NULL or *conn == NULL is a no-op. Does not block
 * on the agent. */
COLL_API void coll_disconnect(coll_conn **conn);

/* ---- groups ----------------------------------------------------------------- */

#define COLL_SLOT_ANY (-1)

typedef struct coll_group_info {
    int rank;         /* this participant's rank in the group */
    int size;         /* number of ranks: nodes x local slots */
    int local_slot;   /* this participant's slot on its node */
    int local_slots;  /* slots per node */
    int node_index;   /* index of this pod in the group */
    int nodes;        /* pods in the group */
    uint32_t epoch;   /* the group's epoch across its pods (the rendezvous epoch, the same
                         on every pod; 0 before it first formed), as of coll_group_open or
                         the last coll_group_wait; one pod: the agent's own epoch */
    char backend[16]; /* "host" or "nccl": what the agent chose */
    char name[64];    /* the group's name */
} coll_group_info;

/* Take a local slot of the group called name (slot COLL_SLOT_ANY: the lowest free
 * one). Blocks for one round trip to the agent (at most the connect timeout). On
 * success *out is a new group handle owned by the caller.
 * Errors: NOT_FOUND, BUSY (slot taken or none free), INVALID, AGENT_LOST. */
COLL_API coll_err coll_group_open(coll_group **out, coll_conn *conn, const char *name, int slot);
/* Options of coll_group_open_opts. The struct grows at its end and never changes what
 * is there: set size to sizeof(coll_group_opts) as your header has it
 * (COLL_GROUP_OPTS_INIT does); libcoll reads the fields that size covers, and the ones
 * a newer libcoll has beyond it take their defaults. */
typedef struct coll_group_opts {
    size_t size;       /* sizeof(coll_group_opts) */
    int slot;          /* COLL_SLOT_ANY (the default) or the slot to take */
    int op_timeout_ms; /* this handle's ops fail with TIMEOUT after this long (1 ms to a
                        * day; torch's and Ray's per-group timeout); 0 (the default): the
                        * group's timeouts.op_ms. Other pods keep their own. */
    int rank;          /* COLL_RANK_ANY (the default) or the group rank to take: the slot
                        * that gives it on this pod (rank - node_index x local_slots), for
                        * frameworks that assign ranks themselves (torch's RANK). With
                        * slot, one of the two only (INVALID). NOT_FOUND when the rank is
                        * another pod's (the message says which ranks this pod holds). */
} coll_group_opts;
#define COLL_RANK_ANY (-1)
#define COLL_GROUP_OPTS_INIT                                                                       \
    {                                                                                              \
        sizeof(coll_group_opts), COLL_SLOT_ANY, 0, COLL_RANK_ANY                                   \
    }
/* coll_group_open with options (above). Blocks as coll_group_open does.
 * Errors: as coll_group_open; INVALID also for a size too small, a timeout out of
 * range, a rank out of the group's range, or both a slot and a rank; NOT_FOUND also
 * for a rank of another pod. */
COLL_API coll_err coll_group_open_opts(coll_group **out, coll_conn *conn, const char *name,
                                       const coll_group_opts *opts);
/* Copy the group's description into *out. Does not block. */
COLL_API coll_err coll_group_info_get(const coll_group *group, coll_group_info *out);
/* Wait until the group stands on every one of its pods (always at once for a group of
 * one pod), at most timeout_ms (-1: no limit), asking the agent every few milliseconds.
 * Updates the epoch that coll_group_info_get reports. Not needed before ops (an op
 * submitted earlier waits for formation within the group's op timeout), but it says
 * why when formation is late.
 * Errors: TIMEOUT (the message says what formation waits for, e.g. "waiting for node
 * indexes 2,3; DNS shows 3 of 4 pods"), AGENT_LOST, INVALID. */
COLL_API coll_err coll_group_wait(coll_group *group, int timeout_ms);
/* ---- groups made at run time ---------------------------------------------------- */
/*
 * A child holds some ranks of its parent group and lives inside the parent's epoch:
 * when the parent moves to a new epoch (a pod re-formed it, a participant left), the
 * child's ops fail with COLL_ERR_EPOCH for good; close it (and make it again from the
 * reopened parent). Children nest (a child is a parent like any group) and are closed
 * with coll_group_close. The child's info: rank (its position in the list), size (the
 * list's length), name "<parent>/<first rank>+<n - 1>"; coll_group_parent_ranks gives
 * the list. A child takes one of the session's 64 group handles, and a group has at
 * most 64 children at once (LIMIT), so an agent holds at most agent.max_sessions x 64.
 * A child whose ranks are all on this pod is run by the agent (its local plane). A child
 * of a host group whose ranks span pods is run by libcoll in the application, over the
 * root group's tagged sends and receives (its data connections; no rendezvous): every op
 * is a direct exchange between its ranks (each rank's part to every other), then a local
 * step (reductions in rank order: the same bits on every rank), but a large allreduce of
 * 3 ranks or more, which runs in two steps (each rank's block reduced by that rank, then
 * sent to all; the same bits): its second step is posted by the first coll_wait,
 * coll_test or coll_wait_any of the connection to find the first done, so a rank that
 * computes between submitting it and waiting holds its peers' second step back that long
 * ($COLL_RSAG=0: never in two steps); its coll_group_info has
 * no slot layout (local_slots: its ranks on this pod), its sends and receives take tags
 * 0..8190, it holds no handle of the agent's, and its ops count against the connection's
 * 256 requests (2 x (size - 1) each) and 64 such ops in flight. Making one blocks until
 * every member has called (within the root's op timeout) and fails with MISMATCH where
 * the lists differ. A child of a GPU group on this pod runs on NCCL, each rank on its
 * parent rank's GPU, with communicators of its own (made on its first op). So does a
 * child across pods of a GPU group, the agents' too: its communicator, of its members,
 * is made on its first op from an id the root's coordinator gives each member pod
 * (creating it does not wait for the other members; lists that differ between pods
 * fail the first op with TIMEOUT within the root's join timeout).
 */

/* Make the child of ranks[0..n) of parent (the child's rank i is parent rank ranks[i]).
 * Called by the listed ranks only, each with the same list; the k-th create of a list
 * by each member forms one child with the k-th of the others. Ranks not listed do
 * nothing and are never waited for. Blocks for one round trip; the child forms once
 * every member has called (coll_group_wait waits for that; ops submitted before wait
 * for the others within the op timeout). On success *child is a new handle the caller
 * owns. Errors: INVALID (a rank out of range or twice, the caller not listed, n out of
 * 1..min(96, size)), EPOCH (the parent was re-formed since it was opened), UNSUPPORTED,
 * LIMIT, AGENT_LOST. */
COLL_API coll_err coll_group_create(coll_group *parent, const int *ranks, int n,
                                    coll_group **child);
/* MPI_Comm_split / ncclCommSplit: collective over every rank of parent (it runs one
 * allgather of the parent, so the n-th op of every rank must be this split). Ranks of
 * one color (0 or more) form one child, ordered by key, then by parent rank; color
 * COLL_SPLIT_NOCOLOR takes part and gets no child (*child NULL, COLL_OK). Blocks until
 * the allgather completes (the parent's op timeout bounds it), then as create. A rank
 * that submits another op instead makes every rank's split fail with MISMATCH.
 * A GPU group's allgather runs on the calling thread's current CUDA device.
 * Errors: as coll_group_create and as the allgather's; INVALID (a negative color other
 * than COLL_SPLIT_NOCOLOR). */
#define COLL_SPLIT_NOCOLOR (-1)
COLL_API coll_err coll_group_split(coll_group *parent, int color, int key, coll_group **child);
/* A child's ranks in its parent, in child rank order: copies up to cap into out and
 * returns how many there are (0 for a group from the config; -1 for a NULL group). */
COLL_API int coll_group_parent_ranks(const coll_group *group, int *out, int cap);

/* Give the slot back and free the handle; sets *group to NULL. The group's other
 * participants see COLL_ERR_PEER_LOST for ops in flight and must reopen. Blocks for
 * one round trip at most, after the group's direct ops (above) have finished. */
COLL_API void coll_group_close(coll_group **group);

/*
 * A premultiplied sum (NCCL's ncclRedOpCreatePreMulSum, torch's PREMUL_SUM): every rank's
 * input is multiplied by a scalar of that rank's own, then summed. The scalar is one
 * element of dt at *scalar (host memory, read at the call). Floats of 16 bits and less
 * multiply in float32 and round the product to dt, then sum as COLL_SUM does; integers
 * multiply modulo 2^bits; bool and complex numbers are refused (INVALID). The op it
 * returns in *op is a value from COLL_PREMUL_SUM_FIRST up, for reductions of dt on this
 * group handle only (any other dtype or handle: INVALID at submission); every rank of an
 * op passes one, each with its own scalar. Blocks for one round trip the first time a
 * (dt, scalar) pair is made on the handle; the same pair again returns the same op at no
 * cost. A handle holds 128 distinct pairs (LIMIT past that) for its life: a destroyed
 * op's pair stays and comes back at no cost. A child across pods of a host group makes
 * it without a round trip and multiplies in this process, before its sends. Errors:
 * INVALID (NULL argument, dt), LIMIT, the connection's.
 */
#define COLL_PREMUL_SUM_FIRST 128
COLL_API coll_err coll_redop_create_premul_sum(coll_group *g, const void *scalar, coll_dtype dt,
                                               coll_redop *op);
/* Give the op back (ops already submitted with it are unaffected). INVALID if op is not
 * one of this handle's. Does not block. */
COLL_API coll_err coll_redop_destroy(coll_group *g, coll_redop op);

/* ---- buffers ---------------------------------------------------------------- */

#define COLL_DEVICE_HOST (-1)

/* Allocate size bytes shared with the agent, mapped read-write in this process.
 * device COLL_DEVICE_HOST: host memory in a sealed memfd, zero-filled. device >= 0 (a
 * CUDA ordinal of this process): GPU memory allocated with cuMem and shared with the
 * agent as a file descriptor (no shared PID namespace needed; the agent finds the GPU
 * by UUID), contents undefined. Blocks for one round trip. The caller owns *out and
 * frees it with coll_mem_release.
 * Errors: INVALID (size 0 or over 2^46 bytes), NOMEM, SYSTEM (no memfd), UNSUPPORTED (GPU buffers
 * need CUDA here and a GPU group in the agent), LIMIT. */
COLL_API coll_err coll_mem_alloc(coll_buffer **out, coll_conn *conn, size_t size, int device);
/* Share host memory the caller already holds as a file descriptor (memfd or shm),
 * size bytes from offset 0. libcoll maps it and duplicates fd; the caller keeps fd.
 * The fd must be sealed against shrinking (F_SEAL_SHRINK), so the agent never faults
 * on it. Blocks for one round trip. The caller owns *out. */
COLL_API coll_err coll_mem_register_fd(coll_buffer **out, coll_conn *conn, int fd, size_t size);
/* Share a range of GPU memory the caller allocated with cudaMalloc (or a framework
 * allocator built on it) through a legacy CUDA IPC handle. Opt-in: the agent can open
 * the handle only when it shares the caller's PID namespace (Kubernetes:
 * shareProcessNamespace: true). The caller keeps ownership of the memory and must not
 * free it before coll_mem_release. Blocks for one round trip. The caller owns *out.
 * Errors: INVALID (not device memory, range past its allocation, or the agent cannot
 * open the handle), UNSUPPORTED (no GPU support on either side). */
COLL_API coll_err coll_mem_register_cuda(coll_buffer **out, coll_conn *conn, void *ptr,
                                         size_t size);
/* Address of the buffer in this process (a device address for GPU buffers); valid
 * until the buffer is released. */
COLL_API void *coll_mem_ptr(const coll_buffer *buf);
COLL_API size_t coll_mem_size(const coll_buffer *buf);
/* Unshare and unmap the buffer; sets *buf to NULL. Returns BUSY (and keeps the buffer)
 * while an op that uses it is in flight. Blocks for one round trip. */
COLL_API coll_err coll_mem_release(coll_buffer **buf);
/* The buffer shared through conn that holds ptr (a host or device address), and ptr's
 * offset in it: for bindings handed a pointer (a tensor's data) that must know whether
 * an op on it can run in place or must stage through coll memory. The buffer stays the
 * connection's (not a new reference). Does not block; thread-safe.
 * Errors: NOT_FOUND (no buffer of this connection holds ptr), INVALID (NULL argument). */
COLL_API coll_err coll_mem_find(coll_conn *conn, const void *ptr, coll_buffer **buf,
                                size_t *offset);

/* Allocation hooks for frameworks whose memory pools take a pluggable allocator by
 * symbol name, with torch's signatures (CUDAPluggableAllocator(path to libcoll,
 * "coll_alloc_hook", "coll_free_hook"); size is torch's ssize_t, the same width): each
 * block a pool asks for is a coll buffer of the bound connection (coll_mem_alloc on
 * that device), so ops on tensors in the pool never stage. One connection per process:
 * coll_hooks_bind names it (NULL unbinds; coll_disconnect unbinds its own). Free every
 * block (torch: release the pool) before the connection goes: coll_disconnect unmaps
 * the blocks that are left. The hooks are thread-safe and block as coll_mem_alloc and
 * coll_mem_release do. coll_alloc_hook returns NULL on failure, coll_last_error saying
 * why (no bound connection, or coll_mem_alloc's error; torch then raises out of
 * memory). coll_free_hook ignores a pointer that is not the start of a block of the
 * bound connection, and waits for ops in flight that use the block (up to the
 * connection's timeout; past it the block stays registered until the disconnect).
 * stream is not used: the pool frees only blocks whose work is done. */
COLL_API coll_err coll_hooks_bind(coll_conn *conn);
COLL_API void *coll_alloc_hook(size_t size, int device, void *stream);
COLL_API void coll_free_hook(void *ptr, size_t size, int device, void *stream);

/* ---- operations ------------------------------------------------------------- */
/*
 * Every op is non-blocking: it validates its arguments, queues the op for the agent
 * and returns a request in *req. Direct ops: in a host group with one slot per pod, an
 * op that moves at most 64 KiB here runs in this process on connections the agent lends
 * (COLL_DIRECT=0 turns that off): it starts at submission and coll_wait / coll_test move
 * it on; any other collective of the group first waits for the group's direct ops to
 * finish (within the op timeout). COLL_DIRECT=all: every collective runs here, a larger
 * one whole inside the first coll_wait or coll_test that reaches it (that call returns
 * when the op is done, within the op timeout, whatever its own timeout): fewer switches
 * per op, but no progress while the application does other work. Pointers must lie
 * inside buffers shared through the same connection (a count of 0 allows NULL), but for
 * an op that runs in this process (a direct op, above): it takes any host memory of
 * this process, as an MPI rank's op does, and libcoll alone touches it, from submission
 * until the op completes (the application must neither write its send nor read or free
 * its recv before coll_wait or coll_test says so). Such an op runs here or not at all:
 * where the agent has not lent the group's connections, it waits up to 10 s for them
 * (the group forming, the agent finishing this process's earlier ops of the group), then
 * fails with TIMEOUT (retryable); in a group whose ops never run here it fails with
 * INVALID. In-place
 * use means send == recv (for allgather send == recv + rank * count, for reduce_scatter
 * recv == send + rank * count); send and recv that overlap in any other way are
 * refused (INVALID).
 * The n-th op of every rank of a group is matched with the n-th op of the others;
 * they must agree on kind, dtype, count, reduction and root, or every rank gets
 * COLL_ERR_MISMATCH. send/recv pair in order per (sender, receiver).
 * stream: for groups on the NCCL backend (GPU buffers), the CUDA stream (cudaStream_t;
 * NULL: the legacy default stream) whose earlier work the op must follow: the agent
 * starts the op only after that work is done, with no host synchronisation. Ignored
 * for host groups.
 * Errors at submission: INVALID, EPOCH, LIMIT (256 ops in flight: wait for some first;
 * when streams wait for some of them, coll_wait_stream, submission waits up to 30 s for
 * one of those to finish first), AGENT_LOST.
 */
COLL_API coll_err coll_allreduce(coll_group *g, const void *send, void *recv, size_t count,
                                 coll_dtype dt, coll_redop op, void *stream, coll_request *req);
/* root's send is copied into every rank's recv (send is read on root only). */
COLL_API coll_err coll_broadcast(coll_group *g, const void *send, void *recv, size_t count,
                                 coll_dtype dt, int root, void *stream, coll_request *req);
/* The reduction lands in root's recv only. */
COLL_API coll_err coll_reduce(coll_group *g, const void *send, void *recv, size_t count,
                              coll_dtype dt, coll_redop op, int root, void *stream,
                              coll_request *req);
/* recv (size * sendcount elements) holds every rank's send, in rank order. */
COLL_API coll_err coll_allgather(coll_group *g, const void *send, void *recv, size_t sendcount,
                                 coll_dtype dt, void *stream, coll_request *req);
/* send holds size * recvcount elements; rank r receives the reduction of block r. */
COLL_API coll_err coll_reduce_scatter(coll_group *g, const void *send, void *recv, size_t recvcount,
                                      coll_dtype dt, coll_redop op, void *stream,
                                      coll_request *req);
/* Block j of rank i's send (count elements each) lands in block i of rank j's recv. */
COLL_API coll_err coll_alltoall(coll_group *g, const void *send, void *recv, size_t count,
                                coll_dtype dt, void *stream, coll_request *req);
COLL_API coll_err coll_send(coll_group *g, const void *send, size_t count, coll_dtype dt, int peer,
                            void *stream, coll_request *req);
COLL_API coll_err coll_recv(coll_group *g, void *recv, size_t count, coll_dtype dt, int peer,
                            void *stream, coll_request *req);
COLL_API coll_err coll_barrier(coll_group *g, void *stream, coll_request *req);
/* Gather, scatter and all-to-all with blocks of any size, as sends and receives posted
 * all at once (a composite request: up to 2 x (size - 1) of the connection's 256
 * requests; LIMIT beyond 192). Host groups (a child across pods too): on a tag of coll's
 * own; they pair as collectives do: the n-th of these ops of every rank meets the n-th
 * of the others, and sizes that disagree fail MISMATCH. GPU groups: on tag 0, in order
 * with the group's other sends and receives, one NCCL group per op, after the work
 * queued on stream (the rank's own block is copied on it); the host waits with coll_wait
 * or coll_test, a stream with coll_wait_stream_keep (coll_wait_stream refuses a
 * composite request: nobody would reap it). */
/* Every rank's send (count elements) lands in root's recv, in rank order (size x count
 * elements, written on root only). In place on root: send == recv + root x count. */
COLL_API coll_err coll_gather(coll_group *g, const void *send, void *recv, size_t count,
                              coll_dtype dt, int root, void *stream, coll_request *req);
/* Block i of root's send (size x count elements, read on root only) lands in rank i's
 * recv (count elements). In place on root: recv == send + root x count. */
COLL_API coll_err coll_scatter(coll_group *g, const void *send, void *recv, size_t count,
                               coll_dtype dt, int root, void *stream, coll_request *req);
/* All-to-all with unequal blocks (a mixture of experts' token exchange): send_counts[j]
 * elements at send + send_displs[j] go to rank j, which receives them at recv +
 * recv_displs[i] and must expect as many (recv_counts[i]). Each array holds one entry
 * per rank; displacements count elements. send and recv must not overlap. */
COLL_API coll_err coll_alltoallv(coll_group *g, const void *send, const size_t *send_counts,
                                 const size_t *send_displs, void *recv, const size_t *recv_counts,
                                 const size_t *recv_displs, coll_dtype dt, void *stream,
                                 coll_request *req);
/* Sends and receives that pair by tag too (0 to COLL_TAG_MAX; coll_send and coll_recv
 * are tag 0; the tags above are coll's own, for children across pods): between two ranks, the n-th
 * send of a tag meets the n-th receive of that tag, whatever the order of other tags (torch's and
 * Gloo's tagged send/recv). Between pods, a message that arrives before its receive is kept
 * while it is small (up to 1 MiB, within 4 MiB per pod); a larger one waits at its sender until
 * the receive is posted (the two agents agree first; within the op timeout), holding no other
 * message back. GPU groups: tag 0 only (UNSUPPORTED: NCCL pairs them in order).
 */
#define COLL_TAG_MAX 0x3fffffff
COLL_API coll_err coll_send_tag(coll_group *g, const void *send, size_t count, coll_dtype dt,
                                int peer, int tag, void *stream, coll_request *req);
COLL_API coll_err coll_recv_tag(coll_group *g, void *recv, size_t count, coll_dtype dt, int peer,
                                int tag, void *stream, coll_request *req);
/* A receive from any rank (MPI_ANY_SOURCE; torch's recv without a source): it takes the
 * first send of that tag to this rank that reaches the agent, from whichever rank; a
 * rank's own sends to itself included. Between one sender and this rank, sends still meet
 * receives in the order both were posted: a receive from any rank posted before one from
 * rank r takes r's send first if nothing else came. source (may be NULL): where the
 * coll_wait or coll_test that consumes the request writes the sender's rank, on success
 * only; it must stay valid until then (as recv does). A send whose count or dtype
 * disagrees fails both with MISMATCH, as for a named peer. Host groups only:
 * UNSUPPORTED on GPU groups (NCCL has no such receive) and on children across pods. */
#define COLL_ANY_SOURCE (-1)
COLL_API coll_err coll_recv_any(coll_group *g, void *recv, size_t count, coll_dtype dt, int tag,
                                int *source, void *stream, coll_request *req);

/* ---- completion ------------------------------------------------------------- */

/* Block until req completes or timeout_ms passes (< 0: no limit, though the agent fails
 * every op within its group's op timeout and a lost agent is noticed at once).
 * Returns the op's own result; TIMEOUT leaves req pending, anything else consumes it.
 * Spins briefly, then sleeps without using CPU. */
COLL_API coll_err coll_wait(coll_conn *conn, coll_request req, int timeout_ms);
/* Non-blocking: *done = 1 and the op's result if req completed (req is consumed),
 * *done = 0 and COLL_OK otherwise. */
COLL_API coll_err coll_test(coll_conn *conn, coll_request req, int *done);
/* GPU ops: make stream (a cudaStream_t; NULL: the legacy default stream) wait, on the
 * GPU, until the op is done; the host does not wait. Consumes req: its result is not
 * reported by coll_wait/coll_test. If the op fails, the stream is released all the
 * same (the op's output is then undefined) and the failure is returned by the next
 * op submitted on this connection (closing the op's group forgets it: the group was
 * broken anyway). Errors: INVALID (unknown request, host op, a composite request, or the
 * wait could not be enqueued on stream). */
COLL_API coll_err coll_wait_stream(coll_conn *conn, coll_request req, void *stream);
/* As coll_wait_stream, but req stays the caller's: the host may still ask coll_test
 * (a torch Work's is_completed) or coll_wait, which report the op's result and consume
 * it; until one does, the request holds one of the connection's 256 slots (a composite
 * one, gather, scatter or alltoallv: each of its parts). Errors: INVALID (unknown
 * request, host op, or the wait could not be enqueued). */
COLL_API coll_err coll_wait_stream_keep(coll_conn *conn, coll_request req, void *stream);
/* Wait for all n requests; returns COLL_OK or the first failure in array order. Every
 * completed request is consumed, even after a failure; on TIMEOUT the others stay
 * pending. */
COLL_API coll_err coll_wait_all(coll_conn *conn, coll_request *reqs, size_t n, int timeout_ms);
/* Wait until one of the n requests completes, at most timeout_ms (0: look once and
 * return; < 0: no limit, as coll_wait). *index says which (the lowest index among
 * those done); that one is consumed and its result returned, the others stay pending.
 * Direct ops among them are moved on by this call (it then wakes at least every
 * millisecond to move them). Errors: TIMEOUT (none completed; none consumed, *index
 * untouched), INVALID (n == 0, a NULL argument, or a request that is unknown or
 * already completed: the message names its index). */
COLL_API coll_err coll_wait_any(coll_conn *conn, const coll_request *reqs, size_t n, size_t *index,
                                int timeout_ms);
/* A descriptor for event loops (asyncio, libuv, epoll): it turns readable when an op
 * of this connection completes or the agent goes away; then call coll_test or
 * coll_wait_any(..., 0) on the requests you hold. Those calls clear it, so it is
 * readable again only for what comes after them (it stays readable once the
 * connection is lost). From the first call on, every op of the connection goes
 * through the agent (no direct ops: their progress needs a caller) and the agent
 * signals each completion (a system call each). The descriptor is the connection's:
 * never read or close it. Errors: -1 with INVALID (NULL connection). */
COLL_API int coll_conn_fd(coll_conn *conn);

#ifdef __cplusplus
}
#endif
#endif
