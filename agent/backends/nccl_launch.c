/*
 * nccl_launch.c: the launcher thread of each GPU (issue ops in one order, complete them
 * by an event of the agent's own, deadlines and async errors) and the engine-facing
 * side of gpu.h: submit, collect, start, stop.
 */
#include "nccl_priv.h"

static int p2p(const struct gpu_task *t)
{
    return t->kind == WIRE_OP_SEND || t->kind == WIRE_OP_RECV;
}

/* Enqueue ts[0..n) on c's stream: wait for each op's ready word, then the NCCL calls
 * (in one group when n > 1: sends and receives that wait for each other must be issued
 * together). COLL_OK with NCCL's result in *nr (ncclInProgress: not settled yet), or
 * an error with t0->why. */
static int issue_calls(struct launcher *l, struct comm *c, struct gpu_task **ts, int n,
                       ncclResult_t *nr)
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
        if (n > 1) {
            r = nccl_launch(c, ts[i]);
            continue;
        }
        uint64_t made = l->graphs_made, replayed = l->replayed;
        r = nccl_graph_launch(l, c, ts[i]);
        /* the engine counts them per group from the task (the launcher's own counters
           are its thread's alone) */
        ts[i]->replayed = l->graphs_made != made ? 2 : l->replayed != replayed ? 1 : 0;
    }
    if (n > 1) {
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess || r == ncclInProgress) r = e;
    }
    *nr = r;
    return COLL_OK;
}

/* NCCL settled the calls with r: then each op's done word and the fence. */
static int issue_finish(struct launcher *l, struct comm *c, struct gpu_task **ts, int n,
                        ncclResult_t r)
{
    const struct cudrv *d = l->g->drv;
    struct gpu_task *t0 = ts[0];
    if (r != ncclSuccess) {
        snprintf(t0->why, sizeof(t0->why), "NCCL %s%s: %s", wire_kind_name(t0->kind),
                 n > 1 ? " (grouped)" : "", ncclGetErrorString(r));
        if (r == ncclInProgress)
            snprintf(t0->why, sizeof(t0->why), "NCCL %s%s did not finish launching in %lld ms",
                     wire_kind_name(t0->kind), n > 1 ? " (grouped)" : "",
                     (long long)(ISSUE_WAIT_NS / 1000000));
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
        ts[i]->fence = nccl_fence_get(c);
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

/* ts[0..n) were issued with result rc: in flight on c, or failed. */
static void land(struct launcher *l, struct comm *c, struct gpu_task **ts, int n, int rc)
{
    struct gpu_task *t = ts[0];
    if (rc == COLL_ERR_INVALID) {
        /* refused before anything ran: the communicator is fine */
        char w[160];
        snprintf(w, sizeof(w), "%s", t->why);
        for (int i = 0; i < n; i++)
            nccl_fail_task(l->g, ts[i], rc, 0, w);
        return;
    }
    for (int i = 0; i < n; i++) {
        ts[i]->next = NULL;
        if (c->fly_tail)
            c->fly_tail->next = ts[i];
        else
            c->fly_head = ts[i];
        c->fly_tail = ts[i];
    }
    if (rc != COLL_OK) {
        char w[160];
        snprintf(w, sizeof(w), "%s", t->why);
        nccl_comm_break(l, c, rc, w);
    }
}

/* c's launch NCCL left in progress: finish it once settled (or past its deadline).
 * Returns 1 when it is over. */
static int poll_settle(struct launcher *l, struct comm *c, int64_t now)
{
    ncclResult_t r = ncclInProgress;
    if (ncclCommGetAsyncError(c->c, &r) != ncclSuccess) r = ncclInternalError;
    if (r == ncclInProgress && now < c->settle_deadline) return 0;
    int n = c->nsettle;
    struct gpu_task *ts[64];
    memcpy(ts, c->settle, (size_t)n * sizeof(ts[0]));
    c->nsettle = 0;
    land(l, c, ts, n, issue_finish(l, c, ts, n, r));
    return 1;
}

/* Whether task a runs on t's communicator. */
static int same_comm(const struct gpu_task *a, const struct gpu_task *t)
{
    return a->type == GPU_TASK_OP && a->group == t->group && a->gen == t->gen;
}

/* Unlink *pp (prev before it) from the pending list. */
static struct gpu_task *unlink_pending(struct launcher *l, struct gpu_task **pp,
                                       struct gpu_task *prev)
{
    struct gpu_task *t = *pp;
    *pp = t->next;
    if (l->pend_tail == t) l->pend_tail = prev;
    t->next = NULL;
    return t;
}

/* A DROP for (group, gen) at *pp: ops of that generation still pending before it
 * (their communicator was being created) fail with the epoch, not on a new one. */
static void fail_dropped(struct launcher *l, const struct gpu_task *d)
{
    struct gpu_task *prev = NULL;
    for (struct gpu_task **pp = &l->pend_head; *pp && *pp != d;) {
        struct gpu_task *t = *pp;
        if (t->type == GPU_TASK_OP && t->group == d->group && (int32_t)(t->gen - d->gen) <= 0) {
            nccl_fail_task(l->g, unlink_pending(l, pp, prev), COLL_ERR_PEER_LOST, 1,
                           "the group's epoch ended");
            continue;
        }
        prev = t;
        pp = &t->next;
    }
}

/* Issue what is pending, in order per communicator. An op whose communicator is being
 * created, or whose previous launch NCCL has not settled, stays pending with every
 * later op of that communicator; other groups' ops go past it, so one communicator
 * that is slow to form never holds up another group on this GPU. Returns 1 if
 * anything moved. */
static int issue_pending(struct launcher *l)
{
    int moved = 0;
    int64_t now = now_ns();
    uint64_t pass = ++l->pass;
    for (struct comm *c = l->comms; c; c = c->next)
        if (c->nsettle) moved |= poll_settle(l, c, now);
    struct gpu_task *prev = NULL;
    struct gpu_task **pp = &l->pend_head;
    while (*pp) {
        struct gpu_task *t = *pp;
        if (t->type == GPU_TASK_DROP || t->type == GPU_TASK_FORGET) {
            fail_dropped(l, t);
            /* the list before t may have changed: find t again */
            prev = NULL;
            for (pp = &l->pend_head; *pp != t; pp = &(*pp)->next)
                prev = *pp;
            unlink_pending(l, pp, prev);
            if (t->type == GPU_TASK_FORGET)
                nccl_forget_group(l, t->group);
            else
                nccl_drop_generation(l, t->group, t->gen);
            t->status = COLL_OK;
            nccl_post(l->g, t);
            moved = 1;
            continue;
        }
        struct comm *c = nccl_comm_get(l, t);
        if (!c) {
            nccl_fail_task(l->g, unlink_pending(l, pp, prev), COLL_ERR_NOMEM, 0, "out of memory");
            moved = 1;
            continue;
        }
        if (c->held_pass == pass || c->nsettle ||
            ((c->state == COMM_INIT || c->state == COMM_SPLIT) && nccl_comm_progress(l, c))) {
            /* stays, in its place; so does every later op of c in this pass, even if c
             * becomes ready meanwhile */
            c->held_pass = pass;
            prev = t;
            pp = &t->next;
            continue;
        }
        unlink_pending(l, pp, prev);
        moved = 1;
        if (c->state == COMM_BROKEN) {
            nccl_fail_task(l->g, t, COLL_ERR_PEER_LOST, 1, c->why);
            continue;
        }
        /* sends and receives queued together go out in one NCCL group; a lone one
         * waits a few microseconds for its partners (a send and a receive submitted
         * back to back would otherwise wait for each other on the stream) */
        if (p2p(t) && !*pp) {
            int64_t until = now_ns() + P2P_GATHER_NS;
            while (!pull(l) && now_ns() < until)
                ring_cpu_relax();
        }
        struct gpu_task *batch[NCCL_BATCH_MAX];
        int n = 0;
        batch[n++] = t;
        while (p2p(t) && n < NCCL_BATCH_MAX && *pp && (*pp)->type == GPU_TASK_OP && p2p(*pp) &&
               (*pp)->group == t->group && (*pp)->gen == t->gen)
            batch[n++] = unlink_pending(l, pp, prev);
        /* one that says more follow (libcoll's gather, scatter, alltoallv): the rest of its
         * NCCL group, past other communicators' ops but never past one of its own that is
         * not a send or receive, waited for a while (a client that stops half way: what
         * came goes alone, and its op ends at its deadline) */
        int64_t more_until = 0;
        while (p2p(t) && n < NCCL_BATCH_MAX && batch[n - 1]->more) {
            struct gpu_task **q = pp, *qprev = prev;
            while (*q && (*q)->group != t->group) {
                qprev = *q;
                q = &(*q)->next;
            }
            if (*q && same_comm(*q, t) && p2p(*q)) {
                batch[n++] = unlink_pending(l, q, qprev);
                continue;
            }
            if (*q) break; /* anything else of its group comes first: nothing goes past it */
            if (!more_until) more_until = now_ns() + P2P_MORE_NS;
            if (now_ns() >= more_until) break;
            if (!pull(l)) ring_cpu_relax();
        }
        ncclResult_t nr = ncclSuccess;
        int rc = issue_calls(l, c, batch, n, &nr);
        if (rc == COLL_OK) {
            nr = nccl_settle(c->c, nr, SPIN_NS); /* most launches settle at once */
            if (nr == ncclInProgress) {
                /* not yet: polled above on later passes; its later ops wait behind */
                memcpy(c->settle, batch, (size_t)n * sizeof(batch[0]));
                c->nsettle = n;
                c->settle_deadline = now_ns() + ISSUE_WAIT_NS;
                continue;
            }
            rc = issue_finish(l, c, batch, n, nr);
        }
        land(l, c, batch, n, rc);
    }
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
                nccl_fence_put(c, t, 1);
                t->status = COLL_OK;
                nccl_post(l->g, t);
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
            nccl_comm_break(l, c, COLL_ERR_TIMEOUT, w);
            moved = 1;
        } else if (now >= c->next_check && c->c) {
            c->next_check = now + CHECK_NS;
            ncclResult_t r = ncclSuccess;
            ncclCommGetAsyncError(c->c, &r);
            if (r != ncclSuccess && r != ncclInProgress) {
                char w[160];
                snprintf(w, sizeof(w), "NCCL async error: %s", ncclGetErrorString(r));
                nccl_comm_break(l, c, COLL_ERR_PEER_LOST, w);
                moved = 1;
            }
        }
    }
    return moved;
}

static int flying(const struct launcher *l)
{
    for (const struct comm *c = l->comms; c; c = c->next)
        if (c->fly_head || c->nsettle) return 1;
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
        nccl_fail_task(g, t, COLL_ERR_SHUTDOWN, 0, "the agent is stopping");
    }
    while (l->comms) {
        struct comm *c = l->comms;
        l->comms = c->next;
        if (c->fly_head || c->nsettle)
            nccl_comm_break(l, c, COLL_ERR_SHUTDOWN, "the agent is stopping");
        nccl_comm_destroy(l, c);
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
        nccl_fail_task(g, t, COLL_ERR_INTERNAL, 0, "no launcher for that device");
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

void gpu_forget_group(struct gpu *g, int group, const int *devices, int n)
{
    if (atomic_load(&g->stop)) return; /* the engine's own gpu_stop: never set after this */
    for (int k = 0; k < n; k++) {
        struct gpu_task *t = calloc(1, sizeof(*t));
        if (!t) { /* its communicators stay cached until the agent stops */
            log_msg(LOG_WARN, "gpu.forget", "group=%d error=\"out of memory\"", group);
            return;
        }
        t->type = GPU_TASK_FORGET;
        t->group = group;
        t->device = devices[k];
        gpu_submit(g, t);
    }
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
    atomic_store_explicit(&g->has_out, g->jout_head != NULL, memory_order_relaxed);
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
    nccl_graphs_on = gv && (strcmp(gv, "0") == 0 || strcmp(gv, "1") == 0) ? atoi(gv) : 2;
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
    pthread_mutex_init(&g->wk_lock, NULL);
    pthread_cond_init(&g->wk_cond, NULL);
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
    if (nccl_worker_start(g, why, whylen) < 0) {
        gpu_stop(g);
        gpu_free(&g);
        return NULL;
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
                nccl_graphs_on == 2 ? "on"
                : nccl_graphs_on    ? "one-rank"
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
    while (atomic_load(&nccl_reapers_live) > 0 && now_ns() < end)
        usleep(1000);
    if (atomic_load(&nccl_reapers_live) > 0)
        log_msg(LOG_WARN, "gpu.abort_unfinished", "count=%d", atomic_load(&nccl_reapers_live));
    /* after the launchers: what the worker has queued is finished, later releases run
     * on the thread that lets the buffer go */
    nccl_worker_stop(g);
}

void gpu_free(struct gpu **gp)
{
    if (!gp || !*gp) return;
    struct gpu *g = *gp;
    *gp = NULL;
    while (g->jout_head) { /* never collected */
        struct gpu_job *j = g->jout_head;
        g->jout_head = j->next;
        if (j->buf) buffer_unref(&j->buf);
        if (j->hold) buffer_unref(&j->hold);
        free(j);
    }
    for (int i = 0; i < g->nl; i++) {
        pthread_mutex_destroy(&g->l[i].lock);
        pthread_cond_destroy(&g->l[i].cond);
    }
    pthread_mutex_destroy(&g->out_lock);
    pthread_mutex_destroy(&g->wk_lock);
    pthread_cond_destroy(&g->wk_cond);
    close(g->out_efd);
    free(g->l);
    free(g);
}
