/*
 * nccl.c: the NCCL backend's probe and the imports of client memory; with nccl_comm.c,
 * nccl_graph.c and nccl_launch.c (nccl_priv.h) it is the agent's GPU side (gpu.h), and
 * these are the only agent files that include CUDA or NCCL headers.
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
#include "nccl_priv.h"

#include <sys/mman.h>

int gpu_probe(char *why, size_t whylen)
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
atomic_uint nccl_buf_gen;

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

int gpu_register_host(void *p, size_t size, intptr_t *dev_delta, char *why, size_t whylen)
{
    return lcgpu_register(p, size, dev_delta, why, whylen);
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
