/*
 * nccl.c: the NCCL backend and the agent's GPU side (gpu.h). The only agent file
 * that includes CUDA or NCCL headers.
 *
 * One launcher thread per GPU owns everything NCCL and CUDA-stream related for that
 * GPU: its communicators (a cache keyed by group, generation and device, touched by
 * no other thread, which is what makes it safe), a stream per communicator, and the
 * order in which NCCL calls are issued. For every op it enqueues, on the
 * communicator's stream: a wait until the client's stream has written the op's ready
 * word, the NCCL call, a write of the op's done word, which the client's stream can
 * wait on (coll_wait_stream), and a CUDA event of the agent's own, which the launcher
 * polls to post the host-side completion (the done word is in memory the client can
 * write, so it proves nothing to the agent). No interprocess event and no host round
 * trip sits between the two streams. Builds without CUDA use nccl_none.c instead.
 *
 * Failures: communicators are created non-blocking and polled against a deadline;
 * one with several ranks is then split (also non-blocking, same deadline) into a
 * blocking child that ops are launched on, since NCCL finishes every launch on a
 * non-blocking communicator on a thread of its own (about 60 us per op, against 18 us
 * blocking; bench/handoff_bench.c). Async errors are polled while ops are in flight; an
 * op past its deadline, an async error or an abandoned generation aborts the
 * communicator, and every op on it is failed with the words stored from the CPU, so
 * neither side's stream stays blocked.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../backend.h"
#include "../buffer.h"
#include "../gpu.h"
#include "../log.h"
#include "coll/coll.h"
#include "ring.h"
#include "wire.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cudrv.h"
#include "lcgpu.h"
#include "util.h"

/* ---- backend table (probe only: the data path is the launchers below) ---------- */

static int nccl_probe(char *why, size_t whylen)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess) {
        snprintf(why, whylen, "no usable GPU (cudaGetDeviceCount: %s)", cudaGetErrorString(ce));
        return -1;
    }
    if (ndev == 0) {
        snprintf(why, whylen, "no GPU visible");
        return -1;
    }
    char dwhy[160];
    if (!cudrv_get(dwhy, sizeof(dwhy))) {
        snprintf(why, whylen, "CUDA driver: %s", dwhy);
        return -1;
    }
    int ver = 0;
    ncclGetVersion(&ver);
    snprintf(why, whylen, "NCCL %d, %d GPU(s)", ver, ndev);
    return 0;
}

static int dummy_ctx;

static void *nccl_ctx_new(void)
{
    return &dummy_ctx;
}

static void nccl_ctx_free(void *ctx)
{
    (void)ctx;
}

static int nccl_run(void *ctx, const struct backend_task *t)
{
    (void)ctx;
    (void)t;
    return COLL_ERR_UNSUPPORTED; /* GPU ops go through gpu_submit */
}

const struct backend_ops backend_nccl = {
    .name = "nccl",
    .probe = nccl_probe,
    .ctx_new = nccl_ctx_new,
    .ctx_free = nccl_ctx_free,
    .run = nccl_run,
};

/* ---- devices and imports --------------------------------------------------------- */

int gpu_resolve_device(const char *spec, char *why, size_t whylen)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        snprintf(why, whylen, "no GPU visible");
        return -1;
    }
    uint8_t u[16];
    if (cudrv_uuid_parse(spec, u) == 0) {
        int d = cudrv_device_by_uuid(u);
        if (d < 0) snprintf(why, whylen, "no GPU with UUID %s is visible to the agent", spec);
        return d;
    }
    char *end;
    long v = strtol(spec, &end, 10);
    if (*spec && !*end && v >= 0 && v < n) return (int)v;
    snprintf(why, whylen, "device '%s' is neither a GPU UUID nor an ordinal below %d", spec, n);
    return -1;
}

/* Bumped when a GPU buffer import goes away: launchers drop their replayable graphs,
 * which name buffers by address. */
static atomic_uint buf_gen;

static void release_cumem(struct buffer *b)
{
    atomic_fetch_add(&buf_gen, 1);
    struct cumem *m = b->priv;
    cumem_free(m);
    free(m);
}

struct buffer *gpu_import_cumem(int fd, size_t size, const uint8_t uuid[16], char *why,
                                size_t whylen, int *code)
{
    char us[48];
    cudrv_uuid_str(uuid, us, sizeof(us));
    int dev = cudrv_device_by_uuid(uuid);
    if (dev < 0) {
        snprintf(why, whylen, "buffer on %s, a GPU the agent cannot see", us);
        *code = COLL_ERR_INVALID;
        return NULL;
    }
    struct cumem *m = calloc(1, sizeof(*m));
    struct buffer *b = calloc(1, sizeof(*b));
    char w[160];
    if (!m || !b || cumem_import_fd(m, fd, size, dev, w, sizeof(w)) < 0) {
        if (m && b)
            snprintf(why, whylen, "importing a %zu-byte cuMem buffer on %s: %s", size, us, w);
        else
            snprintf(why, whylen, "out of memory");
        *code = m && b ? COLL_ERR_INVALID : COLL_ERR_NOMEM;
        free(m);
        free(b);
        return NULL;
    }
    b->refs = 1;
    b->device = dev;
    b->map = (void *)(uintptr_t)m->ptr;
    b->size = size;
    b->release = release_cumem;
    b->priv = m;
    return b;
}

static void release_ipc(struct buffer *b)
{
    atomic_fetch_add(&buf_gen, 1);
    cudaIpcCloseMemHandle(b->priv);
}

struct buffer *gpu_import_ipc(const uint8_t handle[64], uint64_t offset, size_t size,
                              const uint8_t uuid[16], char *why, size_t whylen, int *code)
{
    char us[48];
    cudrv_uuid_str(uuid, us, sizeof(us));
    const struct cudrv *d = cudrv_get(why, whylen);
    int dev = d ? cudrv_device_by_uuid(uuid) : -1;
    *code = COLL_ERR_INVALID;
    if (dev < 0) {
        if (d) snprintf(why, whylen, "buffer on %s, a GPU the agent cannot see", us);
        return NULL;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    void *p = NULL;
    cudaSetDevice(dev);
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        /* a sticky-free error: clear it so later calls on this thread are unaffected */
        cudaGetLastError();
        snprintf(why, whylen,
                 "opening a CUDA IPC handle on %s: %s (legacy IPC needs a shared PID namespace)",
                 us, cudaGetErrorString(e));
        return NULL;
    }
    CUdeviceptr base = 0;
    size_t asize = 0;
    if (d->addr_range(&base, &asize, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS || offset > asize ||
        size > asize - offset) {
        cudaIpcCloseMemHandle(p);
        snprintf(why, whylen, "buffer of %zu bytes at offset %llu exceeds its %zu-byte allocation",
                 size, (unsigned long long)offset, asize);
        return NULL;
    }
    struct buffer *b = calloc(1, sizeof(*b));
    if (!b) {
        cudaIpcCloseMemHandle(p);
        snprintf(why, whylen, "out of memory");
        *code = COLL_ERR_NOMEM;
        return NULL;
    }
    b->refs = 1;
    b->device = dev;
    b->map = (char *)p + offset;
    b->size = size;
    b->release = release_ipc;
    b->priv = p;
    return b;
}

int gpu_register_host(void *p, size_t size, intptr_t *dev_delta, char *why, size_t whylen)
{
    return lcgpu_register(p, size, dev_delta, why, whylen);
}

void gpu_unregister_host(void *p)
{
    cudaHostUnregister(p);
}

int gpu_new_commid(uint8_t id[GPU_COMMID_BYTES], char *why, size_t whylen)
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        snprintf(why, whylen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return -1;
    }
    _Static_assert(sizeof(u) == GPU_COMMID_BYTES, "NCCL unique id size");
    memcpy(id, &u, sizeof(u));
    return 0;
}

/* ---- launchers ------------------------------------------------------------------- */

/* An op's launch captured as a CUDA graph, keyed by everything the launch reads. */
#define GRAPH_SLOTS 32
struct cgraph {
    int used, seen, failed;
    uint8_t kind, dtype, redop;
    int32_t peer;
    uint64_t count;
    const void *send;
    void *recv;
    cudaGraphExec_t exec;
    uint64_t last;
};

/* INIT: the root communicator is being created; SPLIT: its blocking child is being
 * split off (several ranks only); READY: ops run on c. */
enum comm_state { COMM_INIT = 0, COMM_SPLIT, COMM_READY, COMM_BROKEN };

struct comm {
    struct comm *next;
    int group;
    uint32_t gen;
    int nranks, rank;
    enum comm_state state;
    ncclComm_t root;   /* non-blocking, made from the coordinator's id */
    ncclComm_t *child; /* blocking, split from root; NCCL's thread writes it, so the
                          slot outlives an abort that interrupts the split */
    ncclComm_t c;      /* what ops are launched on: root (one rank) or child */
    cudaStream_t stream;
    void *scratch; /* barrier's element */
    void *tmp;     /* in-place all-to-all's copy of the input */
    size_t tmp_size;
    int64_t init_deadline, next_check;
    int64_t created_ns;
    char why[160];
    struct gpu_task *fly_head, *fly_tail; /* issued, in stream order */
    cudaEvent_t *evfree;                  /* fences of finished ops, for the next ones */
    int nevfree, capevfree;
    /* ops that repeat are replayed as CUDA graphs (graph_launch) */
    struct cgraph graphs[GRAPH_SLOTS];
    uint64_t graph_tick;
    unsigned graph_bufgen;
};

static void fence_put(struct comm *c, struct gpu_task *t, int finished);
static void fences_free(struct comm *c);

struct launcher {
    struct gpu *g;
    int device;
    pthread_t thread;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct gpu_task *in_head, *in_tail;     /* from the engine */
    int sleeping;                           /* guarded by lock */
    struct gpu_task *pend_head, *pend_tail; /* taken, not yet issued */
    struct comm *comms;
    uint64_t created, issued, graphs_made, replayed;
};

struct gpu {
    const struct cudrv *drv;
    int nl;
    struct launcher *l;
    int by_device[CONFIG_MAX_DEVICES * 4];
    atomic_int stop;
    pthread_mutex_t out_lock;
    struct gpu_task *out_head, *out_tail;
    atomic_int has_out;
    atomic_int engine_sleeping;
    int out_efd;
};

#define SPIN_NS 200000LL   /* keep polling this long after the last progress */
#define CHECK_NS 1000000LL /* async-error poll interval per communicator */
#define ISSUE_WAIT_NS 5000000000LL
#define P2P_GATHER_NS                                                                              \
    20000LL /* a lone send or receive waits this long for partners */ /* an enqueue NCCL leaves in \
                                                                         progress gets this long   \
                                                                       */

static const ncclDataType_t nccl_dtype[COLL_DTYPE_COUNT] = {
    [COLL_INT8] = ncclInt8,       [COLL_UINT8] = ncclUint8,       [COLL_INT32] = ncclInt32,
    [COLL_UINT32] = ncclUint32,   [COLL_INT64] = ncclInt64,       [COLL_UINT64] = ncclUint64,
    [COLL_FLOAT16] = ncclFloat16, [COLL_BFLOAT16] = ncclBfloat16, [COLL_FLOAT32] = ncclFloat32,
    [COLL_FLOAT64] = ncclFloat64,
};

static const ncclRedOp_t nccl_redop[COLL_REDOP_COUNT] = {
    [COLL_SUM] = ncclSum, [COLL_PROD] = ncclProd, [COLL_MIN] = ncclMin,
    [COLL_MAX] = ncclMax, [COLL_AVG] = ncclAvg,
};

static void post(struct gpu *g, struct gpu_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&g->out_lock);
    if (g->out_tail)
        g->out_tail->next = t;
    else
        g->out_head = t;
    g->out_tail = t;
    atomic_store_explicit(&g->has_out, 1, memory_order_release);
    pthread_mutex_unlock(&g->out_lock);
    /* a spinning engine sees has_out; ring only one that may sleep (ring.h's order:
     * publish, full fence, then look at the sleeping word) */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&g->engine_sleeping, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t w = write(g->out_efd, &one, sizeof(one));
        (void)w;
    }
}

void gpu_engine_sleeping(struct gpu *g, int v)
{
    atomic_store_explicit(&g->engine_sleeping, v, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
}

/* Fail t without the GPU: release both streams (ours may wait for ready, the client's
 * for done) and hand it back. */
static void fail_task(struct gpu *g, struct gpu_task *t, int code, int comm_failed, const char *why)
{
    if (t->type == GPU_TASK_OP) {
        ring_store_max64(t->ready, t->tag);
        ring_store_max64(t->done, t->tag);
    }
    t->status = code;
    t->comm_failed = comm_failed;
    snprintf(t->why, sizeof(t->why), "%s", why);
    post(g, t);
}

/* ---- replayed launches --------------------------------------------------------------- */

/*
 * NCCL's host-side launch of a small op costs more than the op (6 us for 8 bytes on an
 * H200; a captured graph of it launches in 3: bench/RESULTS.md). So an op seen twice
 * with the same arguments is captured once and replayed from then on. Lifetimes: a
 * multi-rank capture holds persistent NCCL plans, and NCCL's destroy and abort wait until
 * every graph referencing the communicator is gone, so the graphs are always destroyed
 * first (comm_abort, comm_destroy; work in flight finishes or is aborted, then the
 * graph is freed). Captures do not register user buffers (NCCL_GRAPH_REGISTER=0 unless
 * set otherwise), so a replay reads and writes addresses exactly as an eager launch
 * does, and the graphs are dropped whenever a buffer import goes away.
 * COLL_NCCL_GRAPHS=0 turns replay off; =1 limits it to one-rank communicators.
 */
static int graphs_on = 2; /* 0 off, 1 one-rank communicators, 2 all */

static void graph_flush(struct comm *c)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec); /* freed when done */
        memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
    }
}

/* An abort handed to a thread of its own: ncclCommAbort of a blocking communicator
 * whose kernel waits for a dead peer can take long (or, inside NCCL, never end), and
 * the launcher must keep serving its GPU's other groups. */
struct reap {
    ncclComm_t root, child;
    cudaStream_t stream; /* freed after the aborts: cudaFree and cudaStreamDestroy */
    void *scratch, *tmp; /* may wait for the kernels the aborts end */
    ncclComm_t *slot;    /* the split's result slot, read after the root's abort */
    int split_pending;
    int device, group;
    uint32_t gen;
};

static atomic_int reapers_live; /* gpu_stop waits (bounded) for these */

/* Abort and free what r holds (on whichever thread calls it). */
static void reap_run(struct reap *r)
{
    cudaSetDevice(r->device);
    int64_t t0 = now_ns();
    if (r->child) ncclCommAbort(r->child);
    int64_t t1 = now_ns();
    if (r->root) ncclCommAbort(r->root);
    if (r->split_pending && r->slot) {
        /* the root's abort ended the split: a child it produced is aborted too; the
         * slot is left allocated (NCCL's thread may have held it) */
        ncclComm_t ch = __atomic_load_n(r->slot, __ATOMIC_ACQUIRE);
        if (ch) ncclCommAbort(ch);
    } else {
        free(r->slot);
    }
    if (r->scratch) cudaFree(r->scratch);
    if (r->tmp) cudaFree(r->tmp);
    if (r->stream) cudaStreamDestroy(r->stream);
    if (r->root || r->child || r->slot)
        log_msg(LOG_INFO, "gpu.comm_aborted",
                "device=%d group=%d gen=%u child_ms=%.1f root_ms=%.1f", r->device, r->group, r->gen,
                (t1 - t0) / 1e6, (now_ns() - t1) / 1e6);
}

static void *reaper_main(void *arg)
{
    reap_run(arg);
    free(arg);
    atomic_fetch_sub(&reapers_live, 1);
    return NULL;
}

/* Abort c's communicators, off the launcher thread (the child first: it holds the
 * kernels; then the root, which also stops a split in progress). Local: never waits
 * on peers. */
static void comm_abort(struct launcher *l, struct comm *c)
{
    graph_flush(c); /* before the abort, which waits for graphs that use c's communicator */
    if (!c->root && !c->child && !c->stream && !c->scratch && !c->tmp) return;
    struct reap h = {.root = c->root,
                     .slot = c->child,
                     .child = c->child && c->state != COMM_SPLIT ? *c->child : NULL,
                     .split_pending = c->state == COMM_SPLIT,
                     .device = l->device,
                     .group = c->group,
                     .gen = c->gen,
                     .stream = c->stream,
                     .scratch = c->scratch,
                     .tmp = c->tmp};
    c->child = NULL;
    c->root = c->c = NULL;
    c->stream = NULL;
    c->scratch = c->tmp = NULL;
    c->tmp_size = 0;
    struct reap *r = malloc(sizeof(*r));
    if (!r) {
        reap_run(&h); /* no memory for a thread's copy: abort here */
        return;
    }
    *r = h;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&reapers_live, 1);
    if (pthread_create(&th, &at, reaper_main, r) != 0) reaper_main(r); /* here, then */
    pthread_attr_destroy(&at);
}

/* Abort c: every op on it fails with code. The entry stays (BROKEN) so that later
 * ops of the same generation fail fast until the engine moves to a new one. */
static void comm_break(struct launcher *l, struct comm *c, int code, const char *why)
{
    /* release our stream first: an op still waiting for a ready word would keep the
     * abort from finishing */
    for (struct gpu_task *t = c->fly_head; t; t = t->next)
        ring_store_max64(t->ready, t->tag);
    if (c->state != COMM_BROKEN) {
        log_msg(LOG_WARN, "gpu.comm_abort", "device=%d group=%d gen=%u rank=%d/%d reason=\"%s\"",
                l->device, c->group, c->gen, c->rank, c->nranks, why);
        snprintf(c->why, sizeof(c->why), "%s", why);
        comm_abort(l, c);
        c->state = COMM_BROKEN;
    }
    while (c->fly_head) {
        struct gpu_task *t = c->fly_head;
        c->fly_head = t->next;
        fence_put(NULL, t, 0);
        fail_task(l->g, t, code, 1, why);
    }
    c->fly_tail = NULL;
}

static void comm_destroy(struct launcher *l, struct comm *c)
{
    graph_flush(c); /* before NCCL's destroy, which waits for graphs that use c */
    if (c->state == COMM_READY && c->c == c->root && c->root) {
        /* one rank, nothing in flight: finalize (non-blocking, polled briefly) */
        ncclCommFinalize(c->root);
        int64_t end = now_ns() + 1000000000LL;
        ncclResult_t r = ncclInProgress;
        while (now_ns() < end && ncclCommGetAsyncError(c->root, &r) == ncclSuccess &&
               r == ncclInProgress)
            sched_yield();
        if (r == ncclSuccess) {
            ncclCommDestroy(c->root);
            c->root = c->c = NULL;
        }
    }
    /* a blocking child's destroy waits for the other ranks on this host: abort, which
     * is local (nothing is in flight when a communicator is destroyed) */
    comm_abort(l, c); /* takes the stream and buffers too */
    fences_free(c);
    free(c);
}

static struct comm *comm_find(struct launcher *l, int group, uint32_t gen)
{
    for (struct comm *c = l->comms; c; c = c->next)
        if (c->group == group && c->gen == gen) return c;
    return NULL;
}

/* The communicator for t, created (non-blocking) if it is not cached. */
static struct comm *comm_get(struct launcher *l, struct gpu_task *t)
{
    struct comm *c = comm_find(l, t->group, t->gen);
    if (c) return c;
    /* a newer generation of the group makes older ones useless */
    for (struct comm **pp = &l->comms; *pp;) {
        struct comm *o = *pp;
        if (o->group == t->group && !o->fly_head) {
            *pp = o->next;
            comm_destroy(l, o);
        } else {
            pp = &o->next;
        }
    }
    c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->group = t->group;
    c->gen = t->gen;
    c->nranks = t->nranks;
    c->rank = t->rank;
    c->created_ns = now_ns();
    c->init_deadline = c->created_ns + t->init_ms * 1000000LL;
    c->next = l->comms;
    l->comms = c;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc(&c->scratch, 16);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(c->why, sizeof(c->why), "CUDA stream or scratch: %s", cudaGetErrorString(e));
        c->state = COMM_BROKEN;
        return c;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* polled against its deadline */
    ncclUniqueId id;
    memcpy(&id, t->commid, sizeof(id));
    ncclResult_t r = ncclCommInitRankConfig(&c->root, t->nranks, id, t->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(c->why, sizeof(c->why), "ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        comm_abort(l, c);
        c->state = COMM_BROKEN;
        return c;
    }
    l->created++;
    t->created_comm = 1;
    log_msg(LOG_INFO, "gpu.comm_init", "device=%d group=%d gen=%u rank=%d/%d", l->device, t->group,
            t->gen, t->rank, t->nranks);
    return c;
}

/* Wait out a call NCCL left in progress (non-blocking communicator). */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r)
{
    int64_t end = now_ns() + ISSUE_WAIT_NS;
    while (r == ncclInProgress && now_ns() < end) {
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
    }
    return r;
}

static ncclResult_t launch(struct comm *c, const struct gpu_task *t)
{
    ncclDataType_t dt = nccl_dtype[t->dtype];
    /* one rank: the average is the value itself; the plain copy path is exact and
     * skips NCCL's scaling kernel */
    ncclRedOp_t op = c->nranks == 1 && t->redop == COLL_AVG ? ncclSum : nccl_redop[t->redop];
    size_t n = (size_t)t->count;
    ncclResult_t r = ncclSuccess;
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        r = ncclAllReduce(t->send, t->recv, n, dt, op, c->c, c->stream);
        break;
    case WIRE_OP_BROADCAST:
        r = ncclBroadcast(t->send, t->recv, n, dt, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_REDUCE:
        r = ncclReduce(t->send, t->recv, n, dt, op, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_ALLGATHER:
        r = ncclAllGather(t->send, t->recv, n, dt, c->c, c->stream);
        break;
    case WIRE_OP_REDUCE_SCATTER:
        r = ncclReduceScatter(t->send, t->recv, n, dt, op, c->c, c->stream);
        break;
    case WIRE_OP_ALLTOALL: {
        size_t bytes = n * coll_dtype_size((coll_dtype)t->dtype);
        const void *src = t->send;
        if (t->send == t->recv && c->nranks > 1) {
            /* in place: blocks would be overwritten before they are sent; send from a
             * copy (the communicator's scratch, grown on demand) */
            size_t total = bytes * (size_t)c->nranks;
            if (c->tmp_size < total) {
                if (c->tmp) cudaFree(c->tmp);
                c->tmp = NULL;
                c->tmp_size = 0;
                if (cudaMalloc(&c->tmp, total) != cudaSuccess) {
                    cudaGetLastError();
                    return ncclSystemError;
                }
                c->tmp_size = total;
            }
            if (cudaMemcpyAsync(c->tmp, t->send, total, cudaMemcpyDeviceToDevice, c->stream) !=
                cudaSuccess)
                return ncclUnhandledCudaError;
            src = c->tmp;
        }
        r = ncclGroupStart();
        for (int p = 0; p < c->nranks && r == ncclSuccess; p++) {
            r = ncclSend((const char *)src + (size_t)p * bytes, n, dt, p, c->c, c->stream);
            if (r == ncclSuccess)
                r = ncclRecv((char *)t->recv + (size_t)p * bytes, n, dt, p, c->c, c->stream);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
        break;
    }
    case WIRE_OP_SEND:
        r = ncclSend(t->send, n, dt, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_RECV:
        r = ncclRecv(t->recv, n, dt, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_BARRIER:
        r = ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->c, c->stream);
        break;
    default:
        r = ncclInvalidArgument;
        break;
    }
    return r;
}

static int graph_key_eq(const struct cgraph *e, const struct gpu_task *t)
{
    return e->used && e->kind == t->kind && e->dtype == t->dtype && e->redop == t->redop &&
           e->peer == t->peer && e->count == t->count && e->send == t->send && e->recv == t->recv;
}

/* t's entry: found, or a free or least recently used one made over for t. */
static struct cgraph *graph_entry(struct comm *c, const struct gpu_task *t)
{
    struct cgraph *victim = &c->graphs[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        struct cgraph *e = &c->graphs[i];
        if (graph_key_eq(e, t)) return e;
        if (!e->used || (victim->used && e->last < victim->last)) victim = e;
    }
    if (victim->exec) cudaGraphExecDestroy(victim->exec);
    *victim = (struct cgraph){.used = 1,
                              .kind = t->kind,
                              .dtype = t->dtype,
                              .redop = t->redop,
                              .peer = t->peer,
                              .count = t->count,
                              .send = t->send,
                              .recv = t->recv};
    return victim;
}

static ncclResult_t graph_run(cudaGraphExec_t x, cudaStream_t st)
{
    if (cudaGraphLaunch(x, st) == cudaSuccess) return ncclSuccess;
    cudaGetLastError();
    return ncclUnhandledCudaError;
}

/* Launch t on c, from a graph when it repeats (see above). */
static ncclResult_t graph_launch(struct launcher *l, struct comm *c, const struct gpu_task *t)
{
    int kind_ok = t->kind == WIRE_OP_ALLREDUCE || t->kind == WIRE_OP_BROADCAST ||
                  t->kind == WIRE_OP_REDUCE || t->kind == WIRE_OP_ALLGATHER ||
                  t->kind == WIRE_OP_REDUCE_SCATTER;
    if (!graphs_on || (graphs_on == 1 && c->nranks != 1) || !kind_ok) return launch(c, t);
    unsigned bg = atomic_load(&buf_gen);
    if (bg != c->graph_bufgen) {
        graph_flush(c);
        c->graph_bufgen = bg;
    }
    struct cgraph *e = graph_entry(c, t);
    e->last = ++c->graph_tick;
    if (e->exec) {
        l->replayed++;
        return graph_run(e->exec, c->stream);
    }
    if (e->failed || ++e->seen < 2) return launch(c, t);
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        e->failed = 1;
        return launch(c, t);
    }
    ncclResult_t r = launch(c, t);
    cudaGraph_t gr = NULL;
    cudaError_t ce = cudaStreamEndCapture(c->stream, &gr);
    if (r == ncclSuccess && ce == cudaSuccess && gr &&
        cudaGraphInstantiate(&e->exec, gr, 0) == cudaSuccess) {
        cudaGraphDestroy(gr);
        l->graphs_made++;
        l->replayed++;
        return graph_run(e->exec, c->stream);
    }
    if (gr) cudaGraphDestroy(gr);
    cudaGetLastError();
    e->exec = NULL;
    e->failed = 1;
    /* captured but not run: run it now; a launch that failed fails the same way */
    return r == ncclSuccess ? launch(c, t) : r;
}

/* An event to record after an op (from c's free list, else new); NULL on failure. */
static cudaEvent_t fence_get(struct comm *c)
{
    if (c->nevfree) return c->evfree[--c->nevfree];
    cudaEvent_t e = NULL;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return e;
}

/* t is done with its fence: keep it for the next op (finished), or destroy it (its
 * stream may never reach it; destroying a pending event is allowed). */
static void fence_put(struct comm *c, struct gpu_task *t, int finished)
{
    cudaEvent_t e = t->fence;
    t->fence = NULL;
    if (!e) return;
    if (finished && c && c->nevfree < c->capevfree) {
        c->evfree[c->nevfree++] = e;
        return;
    }
    if (finished && c) {
        int cap = c->capevfree ? 2 * c->capevfree : 16;
        cudaEvent_t *p = realloc(c->evfree, (size_t)cap * sizeof(*p));
        if (p) {
            c->evfree = p;
            c->capevfree = cap;
            c->evfree[c->nevfree++] = e;
            return;
        }
    }
    cudaEventDestroy(e);
}

static void fences_free(struct comm *c)
{
    for (int i = 0; i < c->nevfree; i++)
        cudaEventDestroy(c->evfree[i]);
    free(c->evfree);
    c->evfree = NULL;
    c->nevfree = c->capevfree = 0;
}

static int p2p(const struct gpu_task *t)
{
    return t->kind == WIRE_OP_SEND || t->kind == WIRE_OP_RECV;
}

/* Enqueue ts[0..n) on c's stream: wait for each op's ready word, the NCCL calls (in one
 * group when n > 1: sends and receives that wait for each other must be issued
 * together), then each op's done word. */
static int issue(struct launcher *l, struct comm *c, struct gpu_task **ts, int n)
{
    const struct cudrv *d = l->g->drv;
    struct gpu_task *t0 = ts[0];
    for (int i = 0; i < n; i++) {
        struct gpu_task *t = ts[i];
        /* skipped when the client said its stream had nothing pending */
        if ((int64_t)(atomic_load_explicit(t->ready, memory_order_acquire) - t->tag) >= 0) continue;
        CUresult cr = d->wait_value64((CUstream)c->stream, (CUdeviceptr)(uintptr_t)t->ready_dev,
                                      t->tag, CU_STREAM_WAIT_VALUE_GEQ);
        if (cr != CUDA_SUCCESS) {
            snprintf(t0->why, sizeof(t0->why), "cuStreamWaitValue64: %s", cudrv_str(cr));
            return COLL_ERR_INTERNAL;
        }
    }
    ncclResult_t r = ncclSuccess;
    if (n > 1) r = ncclGroupStart();
    for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
        if (ts[i]->count == 0 && ts[i]->kind != WIRE_OP_BARRIER) continue;
        r = n == 1 ? graph_launch(l, c, ts[i]) : launch(c, ts[i]);
    }
    if (n > 1) {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess || r == ncclInProgress) r = e;
    }
    r = settle(c->c, r);
    if (r != ncclSuccess) {
        snprintf(t0->why, sizeof(t0->why), "NCCL %s%s: %s", wire_kind_name(t0->kind),
                 n > 1 ? " (grouped)" : "", ncclGetErrorString(r));
        return r == ncclInvalidArgument || r == ncclInvalidUsage ? COLL_ERR_INVALID
                                                                 : COLL_ERR_INTERNAL;
    }
    for (int i = 0; i < n; i++) {
        CUresult cr = d->write_value64((CUstream)c->stream, (CUdeviceptr)(uintptr_t)ts[i]->done_dev,
                                       ts[i]->tag, CU_STREAM_WRITE_VALUE_DEFAULT);
        if (cr != CUDA_SUCCESS) {
            snprintf(t0->why, sizeof(t0->why), "cuStreamWriteValue64: %s", cudrv_str(cr));
            return COLL_ERR_INTERNAL;
        }
    }
    /* what says the op is finished, in memory the client cannot touch */
    for (int i = 0; i < n; i++) {
        ts[i]->fence = fence_get(c);
        cudaError_t e =
            ts[i]->fence ? cudaEventRecord(ts[i]->fence, c->stream) : cudaErrorMemoryAllocation;
        if (e != cudaSuccess) {
            cudaGetLastError();
            snprintf(t0->why, sizeof(t0->why), "cudaEventRecord: %s", cudaGetErrorString(e));
            return COLL_ERR_INTERNAL;
        }
    }
    l->issued += (uint64_t)n;
    return COLL_OK;
}

/* The group's epoch ended on some pod: its communicators up to gen can hang on a peer
 * that is gone; abort them now rather than at each op's deadline. */
static void drop_generation(struct launcher *l, int group, uint32_t gen)
{
    for (struct comm **pp = &l->comms; *pp;) {
        struct comm *c = *pp;
        if (c->group == group && (int32_t)(c->gen - gen) <= 0) {
            comm_break(l, c, COLL_ERR_PEER_LOST, "the group's epoch ended");
            *pp = c->next;
            comm_destroy(l, c);
        } else {
            pp = &c->next;
        }
    }
}

/* Advance c's creation (INIT or SPLIT). Returns 1 while it is still in progress and
 * within its deadline; 0 once it is READY or BROKEN. */
static int comm_progress(struct launcher *l, struct comm *c)
{
    ncclResult_t r = ncclInProgress;
    const char *what = "creating the communicator";
    if (ncclCommGetAsyncError(c->root, &r) != ncclSuccess) r = ncclInternalError;
    if (c->state == COMM_INIT && r == ncclSuccess) {
        if (c->nranks == 1) {
            c->c = c->root; /* one rank: NCCL launches inline, nothing to gain */
            goto ready;
        }
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 1;
        cfg.splitShare = 0;
        c->child = calloc(1, sizeof(*c->child));
        r = c->child ? ncclCommSplit(c->root, 0, c->rank, c->child, &cfg) : ncclSystemError;
        c->state = COMM_SPLIT;
        if (r == ncclSuccess) r = ncclInProgress; /* the child appears later */
    }
    if (c->state == COMM_SPLIT && r == ncclSuccess) {
        what = "splitting the blocking communicator";
        ncclComm_t child = __atomic_load_n(c->child, __ATOMIC_ACQUIRE);
        r = ncclInProgress;
        if (child && ncclCommGetAsyncError(child, &r) != ncclSuccess) r = ncclInternalError;
        if (r == ncclSuccess) {
            c->c = child;
            goto ready;
        }
    } else if (c->state == COMM_SPLIT && r != ncclInProgress) {
        what = "splitting the blocking communicator";
    }
    if (r == ncclInProgress && now_ns() < c->init_deadline) return 1;
    char w[160];
    snprintf(w, sizeof(w), "%s: %s", what,
             r == ncclInProgress ? "deadline passed" : ncclGetErrorString(r));
    comm_break(l, c, r == ncclInProgress ? COLL_ERR_TIMEOUT : COLL_ERR_INTERNAL, w);
    return 0;
ready:
    c->state = COMM_READY;
    log_msg(LOG_INFO, "gpu.comm_ready", "device=%d group=%d gen=%u rank=%d/%d ms=%.1f launch=%s",
            l->device, c->group, c->gen, c->rank, c->nranks, (now_ns() - c->created_ns) / 1e6,
            c->c == c->root ? "non-blocking" : "blocking");
    return 0;
}

/* Move what the engine queued to the pending list; returns 1 if there was any. */
static int pull(struct launcher *l)
{
    pthread_mutex_lock(&l->lock);
    int any = l->in_head != NULL;
    if (any) {
        if (l->pend_tail)
            l->pend_tail->next = l->in_head;
        else
            l->pend_head = l->in_head;
        l->pend_tail = l->in_tail;
        l->in_head = l->in_tail = NULL;
    }
    pthread_mutex_unlock(&l->lock);
    return any;
}

/* Issue what is pending, in order. Returns 1 if anything moved. */
static int issue_pending(struct launcher *l)
{
    int moved = 0;
    while (l->pend_head) {
        struct gpu_task *t = l->pend_head;
        if (t->type == GPU_TASK_DROP) {
            l->pend_head = t->next;
            if (!l->pend_head) l->pend_tail = NULL;
            drop_generation(l, t->group, t->gen);
            t->status = COLL_OK;
            post(l->g, t);
            moved = 1;
            continue;
        }
        struct comm *c = comm_get(l, t);
        if (!c) {
            l->pend_head = t->next;
            if (!l->pend_head) l->pend_tail = NULL;
            fail_task(l->g, t, COLL_ERR_NOMEM, 0, "out of memory");
            moved = 1;
            continue;
        }
        if ((c->state == COMM_INIT || c->state == COMM_SPLIT) && comm_progress(l, c))
            break; /* later ops of this device wait: one order per device */
        l->pend_head = t->next;
        if (!l->pend_head) l->pend_tail = NULL;
        moved = 1;
        if (c->state == COMM_BROKEN) {
            fail_task(l->g, t, COLL_ERR_PEER_LOST, 1, c->why);
            continue;
        }
        /* sends and receives queued together go out in one NCCL group; a lone one
         * waits a few microseconds for its partners (a send and a receive submitted
         * back to back would otherwise wait for each other on the stream) */
        if (p2p(t) && !l->pend_head) {
            int64_t until = now_ns() + P2P_GATHER_NS;
            while (!pull(l) && now_ns() < until)
                ring_cpu_relax();
        }
        struct gpu_task *batch[64];
        int n = 0;
        batch[n++] = t;
        while (p2p(t) && n < 64 && l->pend_head && l->pend_head->type == GPU_TASK_OP &&
               p2p(l->pend_head) && l->pend_head->group == t->group &&
               l->pend_head->gen == t->gen) {
            batch[n++] = l->pend_head;
            l->pend_head = l->pend_head->next;
            if (!l->pend_head) l->pend_tail = NULL;
        }
        int rc = issue(l, c, batch, n);
        if (rc == COLL_ERR_INVALID) {
            /* refused before anything ran: the communicator is fine */
            char w[160];
            snprintf(w, sizeof(w), "%s", t->why);
            for (int i = 0; i < n; i++)
                fail_task(l->g, batch[i], rc, 0, w);
            continue;
        }
        for (int i = 0; i < n; i++) {
            batch[i]->next = NULL;
            if (c->fly_tail)
                c->fly_tail->next = batch[i];
            else
                c->fly_head = batch[i];
            c->fly_tail = batch[i];
        }
        if (rc != COLL_OK) {
            char w[160];
            snprintf(w, sizeof(w), "%s", t->why);
            comm_break(l, c, rc, w);
        }
    }
    if (!l->pend_head) l->pend_tail = NULL;
    return moved;
}

/* Complete what the GPU finished; enforce deadlines and poll async errors. */
static int poll_flying(struct launcher *l, int64_t now)
{
    int moved = 0;
    for (struct comm *c = l->comms; c; c = c->next) {
        while (c->fly_head) {
            struct gpu_task *t = c->fly_head;
            /* the fence, not the done word: a client that writes done early must not
             * make us drop the op's buffers while its kernel runs */
            cudaError_t q = t->fence ? cudaEventQuery((cudaEvent_t)t->fence) : cudaErrorNotReady;
            if (q == cudaSuccess) {
                c->fly_head = t->next;
                if (!c->fly_head) c->fly_tail = NULL;
                fence_put(c, t, 1);
                t->status = COLL_OK;
                post(l->g, t);
                moved = 1;
                continue;
            }
            if (q != cudaErrorNotReady) cudaGetLastError();
            break;
        }
        if (!c->fly_head) continue;
        /* a client that went away never writes ready: do it, so the stream moves on */
        for (struct gpu_task *t = c->fly_head; t; t = t->next)
            if (atomic_load_explicit(t->client_gone, memory_order_relaxed))
                ring_store_max64(t->ready, t->tag);
        if (c->fly_head->deadline_ns <= now) {
            char w[160];
            snprintf(w, sizeof(w), "%s did not finish on the GPU within the op timeout",
                     wire_kind_name(c->fly_head->kind));
            comm_break(l, c, COLL_ERR_TIMEOUT, w);
            moved = 1;
        } else if (now >= c->next_check && c->c) {
            c->next_check = now + CHECK_NS;
            ncclResult_t r = ncclSuccess;
            ncclCommGetAsyncError(c->c, &r);
            if (r != ncclSuccess && r != ncclInProgress) {
                char w[160];
                snprintf(w, sizeof(w), "NCCL async error: %s", ncclGetErrorString(r));
                comm_break(l, c, COLL_ERR_PEER_LOST, w);
                moved = 1;
            }
        }
    }
    return moved;
}

static int flying(const struct launcher *l)
{
    for (const struct comm *c = l->comms; c; c = c->next)
        if (c->fly_head) return 1;
    return 0;
}

static void *launcher_main(void *arg)
{
    struct launcher *l = arg;
    struct gpu *g = l->g;
    cudaError_t e = cudaSetDevice(l->device);
    if (e != cudaSuccess)
        log_msg(LOG_ERROR, "gpu.launcher", "device=%d error=\"%s\"", l->device,
                cudaGetErrorString(e));
    int64_t last = now_ns();
    while (!atomic_load(&g->stop)) {
        pull(l);
        int64_t now = now_ns();
        int moved = issue_pending(l);
        moved |= poll_flying(l, now);
        if (moved) {
            last = now;
            continue;
        }
        int busy = l->pend_head || flying(l);
        if (now - last < SPIN_NS) {
            ring_cpu_relax();
            continue;
        }
        if (busy) {
            /* an op is on the GPU or a communicator is being created: poll gently */
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        pthread_mutex_lock(&l->lock);
        if (!l->in_head && !atomic_load(&g->stop)) {
            l->sleeping = 1;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&l->cond, &l->lock, &ts);
            l->sleeping = 0;
        }
        pthread_mutex_unlock(&l->lock);
        last = now_ns();
    }
    /* stopping: fail what is queued, abort what is in flight */
    pull(l);
    while (l->pend_head) {
        struct gpu_task *t = l->pend_head;
        l->pend_head = t->next;
        fail_task(g, t, COLL_ERR_SHUTDOWN, 0, "the agent is stopping");
    }
    while (l->comms) {
        struct comm *c = l->comms;
        l->comms = c->next;
        if (c->fly_head) comm_break(l, c, COLL_ERR_SHUTDOWN, "the agent is stopping");
        comm_destroy(l, c);
    }
    log_msg(LOG_INFO, "gpu.launcher_stopped",
            "device=%d comms_created=%llu ops_issued=%llu graphs=%llu replayed=%llu", l->device,
            (unsigned long long)l->created, (unsigned long long)l->issued,
            (unsigned long long)l->graphs_made, (unsigned long long)l->replayed);
    return NULL;
}

void gpu_submit(struct gpu *g, struct gpu_task *t)
{
    int dev = t->device;
    struct launcher *l = NULL;
    if (dev >= 0 && dev < (int)(sizeof(g->by_device) / sizeof(g->by_device[0])) &&
        g->by_device[dev] >= 0)
        l = &g->l[g->by_device[dev]];
    if (!l) {
        fail_task(g, t, COLL_ERR_INTERNAL, 0, "no launcher for that device");
        return;
    }
    t->next = NULL;
    pthread_mutex_lock(&l->lock);
    if (l->in_tail)
        l->in_tail->next = t;
    else
        l->in_head = t;
    l->in_tail = t;
    if (l->sleeping) pthread_cond_signal(&l->cond);
    pthread_mutex_unlock(&l->lock);
}

int gpu_notify_fd(const struct gpu *g)
{
    return g->out_efd;
}

int gpu_has_results(struct gpu *g)
{
    return atomic_load_explicit(&g->has_out, memory_order_acquire);
}

struct gpu_task *gpu_collect(struct gpu *g)
{
    /* the eventfd is watched edge-triggered: it never needs draining */
    pthread_mutex_lock(&g->out_lock);
    struct gpu_task *h = g->out_head;
    g->out_head = g->out_tail = NULL;
    atomic_store_explicit(&g->has_out, 0, memory_order_relaxed);
    pthread_mutex_unlock(&g->out_lock);
    return h;
}

struct gpu *gpu_start(const int *devices, int ndevices, char *why, size_t whylen)
{
    int used[sizeof(((struct gpu *)0)->by_device) / sizeof(int)];
    int nused = 0;
    const int maxdev = (int)(sizeof(used) / sizeof(used[0]));
    memset(used, 0, sizeof(used));
    for (int i = 0; i < ndevices; i++) {
        int d = devices[i];
        if (d >= 0 && d < maxdev && !used[d]) {
            used[d] = 1;
            nused++;
        }
    }
    if (!nused) {
        snprintf(why, whylen, "no group uses a GPU");
        return NULL;
    }
    const char *gv = getenv("COLL_NCCL_GRAPHS");
    graphs_on = gv && (strcmp(gv, "0") == 0 || strcmp(gv, "1") == 0) ? atoi(gv) : 2;
    setenv("NCCL_GRAPH_REGISTER", "0", 0); /* before any capture reads it (see above) */
    struct gpu *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    g->drv = cudrv_get(why, whylen);
    g->out_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    g->l = calloc((size_t)nused, sizeof(*g->l));
    if (!g->drv || g->out_efd < 0 || !g->l) {
        if (g->drv) snprintf(why, whylen, "out of memory or eventfd");
        if (g->out_efd >= 0) close(g->out_efd);
        free(g->l);
        free(g);
        return NULL;
    }
    pthread_mutex_init(&g->out_lock, NULL);
    for (int d = 0; d < maxdev; d++)
        g->by_device[d] = -1;
    for (int d = 0; d < maxdev; d++) {
        if (!used[d]) continue;
        struct launcher *l = &g->l[g->nl];
        l->g = g;
        l->device = d;
        pthread_mutex_init(&l->lock, NULL);
        pthread_cond_init(&l->cond, NULL);
        g->by_device[d] = g->nl++;
    }
    for (int i = 0; i < g->nl; i++) {
        if (pthread_create(&g->l[i].thread, NULL, launcher_main, &g->l[i]) != 0) {
            snprintf(why, whylen, "cannot start a launcher thread");
            gpu_stop(g);
            gpu_free(&g);
            return NULL;
        }
        g->l[i].started = 1;
        log_msg(LOG_INFO, "gpu.launcher", "device=%d graphs=%s", g->l[i].device,
                graphs_on == 2 ? "on"
                : graphs_on    ? "one-rank"
                               : "off");
    }
    return g;
}

void gpu_stop(struct gpu *g)
{
    if (!g) return;
    atomic_store(&g->stop, 1);
    for (int i = 0; i < g->nl; i++) {
        struct launcher *l = &g->l[i];
        if (!l->started) continue;
        pthread_mutex_lock(&l->lock);
        pthread_cond_signal(&l->cond);
        pthread_mutex_unlock(&l->lock);
        pthread_join(l->thread, NULL);
        l->started = 0;
    }
    /* aborts still running on their threads get a few seconds to finish before the
     * process tears CUDA down under them */
    int64_t end = now_ns() + 5000000000LL;
    while (atomic_load(&reapers_live) > 0 && now_ns() < end)
        usleep(1000);
    if (atomic_load(&reapers_live) > 0)
        log_msg(LOG_WARN, "gpu.abort_unfinished", "count=%d", atomic_load(&reapers_live));
}

void gpu_free(struct gpu **gp)
{
    if (!gp || !*gp) return;
    struct gpu *g = *gp;
    *gp = NULL;
    for (int i = 0; i < g->nl; i++) {
        pthread_mutex_destroy(&g->l[i].lock);
        pthread_cond_destroy(&g->l[i].cond);
    }
    pthread_mutex_destroy(&g->out_lock);
    close(g->out_efd);
    free(g->l);
    free(g);
}
