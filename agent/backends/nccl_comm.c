/*
 * nccl_comm.c: the communicator cache of a launcher: creation (non-blocking, polled
 * against a deadline; several ranks split a blocking child off the root), aborts on
 * reaper threads of their own, breaking and destroying, generations.
 */
#include "nccl_priv.h"

/* An abort handed to a thread of its own: ncclCommAbort of a blocking communicator
 * whose kernel waits for a dead peer can take long (or, inside NCCL, never end), and
 * the launcher must keep serving its GPU's other groups. */
struct reap {
    ncclComm_t root, child;
    cudaStream_t stream; /* freed after the aborts: cudaFree and cudaStreamDestroy */
    void *scratch, *tmp; /* may wait for the kernels the aborts end */
    ncclComm_t *slot;    /* the split's result slot, read after the root's abort */
    int split_pending;
    int finalize; /* one rank, nothing in flight: finalize and destroy root, abort if that
                     does not finish within a second */
    int device, group;
    uint32_t gen;
};

atomic_int nccl_reapers_live; /* gpu_stop waits (bounded) for these */

/* Abort and free what r holds (on whichever thread calls it). */
static void reap_run(struct reap *r)
{
    CUDA_WARN(cudaSetDevice(r->device), "gpu.reaper");
    if (r->finalize && r->root) {
        ncclCommFinalize(r->root); /* non-blocking communicator: polled */
        int64_t end = now_ns() + 1000000000LL;
        ncclResult_t st = ncclInProgress;
        while (now_ns() < end && ncclCommGetAsyncError(r->root, &st) == ncclSuccess &&
               st == ncclInProgress) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        if (st == ncclSuccess) {
            ncclCommDestroy(r->root);
            r->root = NULL;
        }
    }
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
    atomic_fetch_sub(&nccl_reapers_live, 1);
    return NULL;
}

static void retire(struct launcher *l, struct comm *c, int finalize);

/* Abort c's communicators, off the launcher thread (the child first: it holds the
 * kernels; then the root, which also stops a split in progress). Local: never waits
 * on peers. */
void nccl_comm_abort(struct launcher *l, struct comm *c)
{
    retire(l, c, 0);
}

/* Hand what c holds to a reaper thread: finalized (one rank, idle) or aborted. */
static void retire(struct launcher *l, struct comm *c, int finalize)
{
    nccl_graph_flush(c); /* before the abort, which waits for graphs that use c's communicator */
    if (!c->root && !c->child && !c->stream && !c->scratch && !c->tmp) return;
    struct reap h = {.root = c->root,
                     .slot = c->child,
                     .child = c->child && c->state != COMM_SPLIT ? *c->child : NULL,
                     .split_pending = c->state == COMM_SPLIT,
                     .finalize = finalize,
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
    atomic_fetch_add(&nccl_reapers_live, 1);
    if (pthread_create(&th, &at, reaper_main, r) != 0) reaper_main(r); /* here, then */
    pthread_attr_destroy(&at);
}

/* Abort c: every op on it fails with code. The entry stays (BROKEN) so that later
 * ops of the same generation fail fast until the engine moves to a new one. */
void nccl_comm_break(struct launcher *l, struct comm *c, int code, const char *why)
{
    /* release our stream first: an op still waiting for a ready word would keep the
     * abort from finishing */
    for (struct gpu_task *t = c->fly_head; t; t = t->next)
        ring_store_max64(t->ready, t->tag);
    for (int i = 0; i < c->nsettle; i++)
        ring_store_max64(c->settle[i]->ready, c->settle[i]->tag);
    if (c->state != COMM_BROKEN) {
        log_msg(LOG_WARN, "gpu.comm_abort", "device=%d group=%d gen=%u rank=%d/%d reason=\"%s\"",
                l->device, c->group, c->gen, c->rank, c->nranks, why);
        snprintf(c->why, sizeof(c->why), "%s", why);
        nccl_comm_abort(l, c);
        c->state = COMM_BROKEN;
    }
    while (c->fly_head) {
        struct gpu_task *t = c->fly_head;
        c->fly_head = t->next;
        nccl_fence_put(NULL, t, 0);
        nccl_fail_task(l->g, t, code, 1, why);
    }
    c->fly_tail = NULL;
    for (int i = 0; i < c->nsettle; i++) /* its launch never settled: they fail with it */
        nccl_fail_task(l->g, c->settle[i], code, 1, why);
    c->nsettle = 0;
}

void nccl_comm_destroy(struct launcher *l, struct comm *c)
{
    /* one rank with nothing in flight is finalized cleanly; a blocking child's destroy
     * would wait for the other ranks on this host, so everything else is aborted,
     * which is local (nothing is in flight when a communicator is destroyed). Either
     * way on a reaper: the launcher never waits for NCCL's teardown. */
    int finalize = c->state == COMM_READY && c->c == c->root && c->root;
    retire(l, c, finalize); /* takes the stream and buffers too; graphs first */
    nccl_fences_free(c);
    free(c);
}

struct comm *nccl_comm_find(struct launcher *l, int group, uint32_t gen)
{
    for (struct comm *c = l->comms; c; c = c->next)
        if (c->group == group && c->gen == gen) return c;
    return NULL;
}

/* The communicator for t, created (non-blocking) if it is not cached. */
struct comm *nccl_comm_get(struct launcher *l, struct gpu_task *t)
{
    struct comm *c = nccl_comm_find(l, t->group, t->gen);
    if (c) return c;
    /* a newer generation of the group makes older ones useless */
    for (struct comm **pp = &l->comms; *pp;) {
        struct comm *o = *pp;
        if (o->group == t->group && !o->fly_head && !o->nsettle) {
            *pp = o->next;
            nccl_comm_destroy(l, o);
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
    char *why = c->why;
    size_t whylen = sizeof(c->why);
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "CUDA stream", broken);
    CUDA_TRY(cudaMalloc(&c->scratch, 16), "CUDA scratch", abort_comm);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* polled against its deadline */
    ncclUniqueId id;
    memcpy(&id, t->commid, sizeof(id));
    NCCL_TRY(ncclCommInitRankConfig(&c->root, t->nranks, id, t->rank, &cfg),
             "ncclCommInitRankConfig", abort_comm);
    l->created++;
    t->created_comm = 1;
    log_msg(LOG_INFO, "gpu.comm_init", "device=%d group=%d gen=%u rank=%d/%d", l->device, t->group,
            t->gen, t->rank, t->nranks);
    return c;
abort_comm:
    nccl_comm_abort(l, c); /* frees what was made, on a reaper */
broken:
    c->state = COMM_BROKEN;
    return c;
}

/* The group's epoch ended on some pod: its communicators up to gen can hang on a peer
 * that is gone; abort them now rather than at each op's deadline. */
void nccl_drop_generation(struct launcher *l, int group, uint32_t gen)
{
    for (struct comm **pp = &l->comms; *pp;) {
        struct comm *c = *pp;
        if (c->group == group && (int32_t)(c->gen - gen) <= 0) {
            nccl_comm_break(l, c, COLL_ERR_PEER_LOST, "the group's epoch ended");
            *pp = c->next;
            nccl_comm_destroy(l, c);
        } else {
            pp = &c->next;
        }
    }
}

void nccl_forget_group(struct launcher *l, int group)
{
    for (struct comm **pp = &l->comms; *pp;) {
        struct comm *c = *pp;
        if (c->group != group) {
            pp = &c->next;
            continue;
        }
        /* nothing is in flight (the group waited for its tasks); were anything, it
         * fails rather than run on a communicator that is going */
        if (c->fly_head || c->nsettle) nccl_comm_break(l, c, COLL_ERR_EPOCH, "the group went");
        log_msg(LOG_INFO, "gpu.comm_forget", "device=%d group=%d gen=%u rank=%d/%d", l->device,
                c->group, c->gen, c->rank, c->nranks);
        *pp = c->next;
        nccl_comm_destroy(l, c);
    }
}

/* Advance c's creation (INIT or SPLIT). Returns 1 while it is still in progress and
 * within its deadline; 0 once it is READY or BROKEN. */
int nccl_comm_progress(struct launcher *l, struct comm *c)
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
    nccl_comm_break(l, c, r == ncclInProgress ? COLL_ERR_TIMEOUT : COLL_ERR_INTERNAL, w);
    return 0;
ready:
    c->state = COMM_READY;
    log_msg(LOG_INFO, "gpu.comm_ready", "device=%d group=%d gen=%u rank=%d/%d ms=%.1f launch=%s",
            l->device, c->group, c->gen, c->rank, c->nranks, (now_ns() - c->created_ns) / 1e6,
            c->c == c->root ? "non-blocking" : "blocking");
    return 0;
}
