/*
 * nccl.c: the NCCL backend's probe, devices, host registration and NCCL ids: the floor
 * of the backend's files (nccl_priv.h), which together are the agent's GPU side (gpu.h)
 * and the only agent files that include CUDA or NCCL headers.
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
