/*
 * nccl_worker.c: the GPU worker thread (gpu.h's jobs). Registering a session region
 * with CUDA, opening a client's buffer (cudaIpcOpenMemHandle, cuMem import), closing
 * them again and minting an NCCL id each take the driver milliseconds, and
 * cudaIpcOpenMemHandle changes the calling thread's current device: none of it may
 * run on the engine, which serves every session's ring. The worker does them one
 * after another and posts finished jobs to the engine through the launchers' queue
 * and doorbell. Releases are fire-and-forget: the worker frees their jobs itself.
 * Before the worker starts and after it stops, jobs run on the caller's thread.
 */
#include "nccl_priv.h"

static void post_job(struct gpu *g, struct gpu_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&g->out_lock);
    if (g->jout_tail)
        g->jout_tail->next = j;
    else
        g->jout_head = j;
    g->jout_tail = j;
    atomic_store_explicit(&g->has_out, 1, memory_order_release);
    pthread_mutex_unlock(&g->out_lock);
    nccl_ring_engine(g);
}

/* Run j on this thread. Returns 1 when j goes back to the engine, 0 when it was a
 * release (freed here). */
static int run_job(struct gpu *g, struct gpu_job *j)
{
    j->status = COLL_OK;
    j->why[0] = 0;
    switch (j->type) {
    case GPU_JOB_REGISTER:
        if (gpu_register_host(j->hold->map, j->hold->size, &j->delta, j->why, sizeof(j->why)) < 0)
            j->status = COLL_ERR_UNSUPPORTED;
        return 1;
    case GPU_JOB_IMPORT_CUMEM:
        j->buf = gpu_import_cumem(g, j->fd, j->size, j->uuid, j->why, sizeof(j->why), &j->status);
        if (j->fd >= 0) close(j->fd);
        j->fd = -1;
        return 1;
    case GPU_JOB_IMPORT_IPC:
        j->buf = gpu_import_ipc(g, j->ipc, j->offset, j->size, j->uuid, j->why, sizeof(j->why),
                                &j->status);
        return 1;
    case GPU_JOB_COMMID:
        if (gpu_new_commid(j->commid, j->why, sizeof(j->why)) < 0) j->status = COLL_ERR_INTERNAL;
        return 1;
    case GPU_JOB_RELEASE:
        nccl_release_run(j);
        free(j);
        return 0;
    }
    j->status = COLL_ERR_INTERNAL;
    snprintf(j->why, sizeof(j->why), "unknown GPU job type %d", j->type);
    return 1;
}

static void *worker_main(void *arg)
{
    struct gpu *g = arg;
    pthread_mutex_lock(&g->wk_lock);
    for (;;) {
        while (!g->wk_head && !g->wk_stop)
            pthread_cond_wait(&g->wk_cond, &g->wk_lock);
        if (!g->wk_head) break; /* stopping, and everything queued is done */
        struct gpu_job *j = g->wk_head;
        g->wk_head = j->next;
        if (!g->wk_head) g->wk_tail = NULL;
        pthread_mutex_unlock(&g->wk_lock);
        if (run_job(g, j)) post_job(g, j);
        pthread_mutex_lock(&g->wk_lock);
    }
    pthread_mutex_unlock(&g->wk_lock);
    return NULL;
}

void nccl_worker_queue(struct gpu *g, struct gpu_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&g->wk_lock);
    int on = g->wk_started && !g->wk_stop;
    if (on) {
        if (g->wk_tail)
            g->wk_tail->next = j;
        else
            g->wk_head = j;
        g->wk_tail = j;
        pthread_cond_signal(&g->wk_cond);
    }
    pthread_mutex_unlock(&g->wk_lock);
    if (!on && run_job(g, j)) post_job(g, j);
}

void gpu_job_submit(struct gpu *g, struct gpu_job *j)
{
    if (j->type == GPU_JOB_RELEASE) { /* not the engine's to ask */
        j->status = COLL_ERR_INTERNAL;
        snprintf(j->why, sizeof(j->why), "release is not a job the engine submits");
        post_job(g, j);
        return;
    }
    nccl_worker_queue(g, j);
}

struct gpu_job *gpu_collect_jobs(struct gpu *g)
{
    pthread_mutex_lock(&g->out_lock);
    struct gpu_job *h = g->jout_head;
    g->jout_head = g->jout_tail = NULL;
    atomic_store_explicit(&g->has_out, g->out_head != NULL, memory_order_relaxed);
    pthread_mutex_unlock(&g->out_lock);
    return h;
}

/* gpu_start initialised wk_lock and wk_cond. */
int nccl_worker_start(struct gpu *g, char *why, size_t whylen)
{
    if (pthread_create(&g->wk, NULL, worker_main, g) != 0) {
        snprintf(why, whylen, "cannot start the GPU worker thread");
        return -1;
    }
    g->wk_started = 1;
    return 0;
}

/* Finish what is queued, then stop; later jobs run on their caller's thread. */
void nccl_worker_stop(struct gpu *g)
{
    pthread_mutex_lock(&g->wk_lock);
    int on = g->wk_started;
    g->wk_stop = 1;
    pthread_cond_signal(&g->wk_cond);
    pthread_mutex_unlock(&g->wk_lock);
    if (on) pthread_join(g->wk, NULL);
    g->wk_started = 0;
}
