/*
 * nccl.c: the NCCL backend. The only agent file that includes CUDA or NCCL headers.
 * This version probes the CUDA runtime and NCCL (so the agent links both, starts
 * without a GPU driver and reports why NCCL is unusable); the GPU data path lands
 * with the GPU issue, and until then the probe reports that it is missing so that
 * `auto` groups fall back to the host backend.
 */
#include <stdio.h>

#include "../backend.h"
#include "coll/coll.h"

#ifdef COLL_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

static int nccl_probe(char *why, size_t whylen)
{
#ifdef COLL_HAVE_NCCL
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess) {
        snprintf(why, whylen, "no usable GPU (cudaGetDeviceCount: %s)", cudaGetErrorString(ce));
        return -1;
    }
    int ver = 0;
    ncclGetVersion(&ver);
    snprintf(why, whylen, "NCCL %d and %d GPU(s) found, but this build has no GPU data path yet",
             ver, ndev);
    return -1;
#else
    snprintf(why, whylen, "built without CUDA and NCCL");
    return -1;
#endif
}

static void *nccl_ctx_new(void)
{
    return NULL;
}

static void nccl_ctx_free(void *ctx)
{
    (void)ctx;
}

static int nccl_run(void *ctx, const struct backend_task *t)
{
    (void)ctx;
    (void)t;
    return COLL_ERR_UNSUPPORTED;
}

const struct backend_ops backend_nccl = {
    .name = "nccl",
    .probe = nccl_probe,
    .ctx_new = nccl_ctx_new,
    .ctx_free = nccl_ctx_free,
    .run = nccl_run,
};
