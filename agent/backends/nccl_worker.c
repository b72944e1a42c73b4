/*
 * nccl_worker.c: the GPU worker thread (gpu.h's jobs). Registering a session region
 * with CUDA, opening a client's buffer (cudaIpcOpenMemHandle, cuMem import), closing
 * them again and minting an NCCL id each take the driver milliseconds, and
 * cudaIpcOpenMemHandle changes the calling thread's current device: none of it may
 * run on the engine, which serves every session's ring. The worker does them one
 * after another and posts finished jobs to the engine through the launchers' queue
 * and doorbell. Releases are fire-and-forget: the worker frees their jobs itself.
 * Before the worker starts and after it stops, jobs run on the caller's thread. The
 * imports of client memory and their releases are here too: a release queues a job.
 */
#include "nccl_priv.h"

#include <sys/mman.h>

/* ---- imports and releases ------------------------------------------------------------ */

/* The last reference to a GPU buffer or a registered region went: the worker closes
 * it (buffer_unref frees b itself, so the job carries what the close needs). */
static void release_later(struct buffer *b, int kind)
{
    struct gpu *g = b->rel_ctx;
    struct gpu_job *j = calloc(1, sizeof(*j));
    struct gpu_job local = {0};
    if (!j) j = &local; /* no memory for a job: close it here */
    j->type = GPU_JOB_RELEASE;
    j->slot = (uint32_t)kind;
    j->priv = b->priv;
    j->hold = NULL;
    j->buf = NULL;
    j->offset = (uint64_t)(uintptr_t)b->map;
    j->size = b->size;
    if (j == &local) {
        nccl_release_run(j);
        return;
    }
    nccl_worker_queue(g, j);
}

static void release_cumem(struct buffer *b)
{
    release_later(b, RELEASE_CUMEM);
}

static void release_ipc(struct buffer *b)
{
    release_later(b, RELEASE_IPC);
}

static void release_region(struct buffer *b)
{
    release_later(b, RELEASE_REGION);
}

void nccl_release_run(struct gpu_job *j)
{
    void *map = (void *)(uintptr_t)j->offset;
    switch (j->slot) {
    case RELEASE_CUMEM:
        atomic_fetch_add(&nccl_buf_gen, 1);
        cumem_free(j->priv);
        free(j->priv);
        break;
    case RELEASE_IPC:
        atomic_fetch_add(&nccl_buf_gen, 1);
        CUDA_WARN(cudaIpcCloseMemHandle(j->priv), "gpu.release");
        break;
    case RELEASE_REGION:
        CUDA_WARN(cudaHostUnregister(map), "gpu.release");
        munmap(map, j->size);
        break;
    }
}

void gpu_region_registered(struct gpu *g, struct buffer *region, intptr_t delta)
{
    region->priv = (void *)(delta + 1);
    region->rel_ctx = g;
    region->release = release_region;
}

struct buffer *gpu_import_cumem(struct gpu *g, int fd, size_t size, const uint8_t uuid[16],
                                char *why, size_t whylen, int *code)
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
    b->rel_ctx = g;
    return b;
}

struct buffer *gpu_import_ipc(struct gpu *g, const uint8_t handle[64], uint64_t offset, size_t size,
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
    struct buffer *b = NULL;
    CUDA_TRY(cudaSetDevice(dev), "cudaSetDevice", failed);
    CUDA_TRY(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
             "opening a CUDA IPC handle (legacy IPC needs a shared PID namespace)", failed);
    CUdeviceptr base = 0;
    size_t asize = 0;
    if (d->addr_range(&base, &asize, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS || offset > asize ||
        size > asize - offset) {
        snprintf(why, whylen, "buffer of %zu bytes at offset %llu exceeds its %zu-byte allocation",
                 size, (unsigned long long)offset, asize);
        goto close_handle;
    }
    b = calloc(1, sizeof(*b));
    if (!b) {
        snprintf(why, whylen, "out of memory");
        *code = COLL_ERR_NOMEM;
        goto close_handle;
    }
    b->refs = 1;
    b->device = dev;
    b->map = (char *)p + offset;
    b->size = size;
    b->release = release_ipc;
    b->priv = p;
    b->rel_ctx = g;
    *code = COLL_OK;
    return b;
close_handle:
    CUDA_WARN(cudaIpcCloseMemHandle(p), "gpu.release");
failed:
    return NULL;
}

/* ---- the worker ---------------------------------------------------------------------- */

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
