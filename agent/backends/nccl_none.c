/*
 * nccl_none.c: the agent's GPU side (gpu.h) in a build without CUDA and NCCL (CMake
 * picks this file instead of nccl.c and its siblings): the probe says so, and groups
 * that ask for NCCL are refused with that reason.
 */
#include <stdint.h>
#include <stdio.h>

#include "../gpu.h"
#include "coll/coll.h"

int gpu_probe(char *why, size_t whylen)
{
    snprintf(why, whylen, "built without CUDA and NCCL");
    return -1;
}

/* ---- without CUDA: every entry point says so ------------------------------------ */

struct gpu *gpu_start(const int *devices, int ndevices, char *why, size_t whylen)
{
    (void)devices, (void)ndevices;
    snprintf(why, whylen, "built without CUDA and NCCL");
    return NULL;
}
void gpu_stop(struct gpu *g)
{
    (void)g;
}
void gpu_free(struct gpu **g)
{
    if (g) *g = NULL;
}
void gpu_submit(struct gpu *g, struct gpu_task *t)
{
    (void)g;
    (void)t;
}
void gpu_forget_group(struct gpu *g, int group, const int *devices, int n)
{
    (void)g, (void)group, (void)devices, (void)n;
}

void gpu_engine_sleeping(struct gpu *g, int v)
{
    (void)g, (void)v;
}
int gpu_notify_fd(const struct gpu *g)
{
    (void)g;
    return -1;
}
struct gpu_task *gpu_collect(struct gpu *g)
{
    (void)g;
    return NULL;
}
int gpu_has_results(struct gpu *g)
{
    (void)g;
    return 0;
}
int gpu_new_commid(uint8_t id[GPU_COMMID_BYTES], char *why, size_t whylen)
{
    (void)id;
    snprintf(why, whylen, "built without NCCL");
    return -1;
}
int gpu_resolve_device(const char *spec, char *why, size_t whylen)
{
    (void)spec;
    snprintf(why, whylen, "built without CUDA");
    return -1;
}
/* gpu_start never succeeds here, so the engine has no struct gpu to submit to */
void gpu_job_submit(struct gpu *g, struct gpu_job *j)
{
    (void)g, (void)j;
}
struct gpu_job *gpu_collect_jobs(struct gpu *g)
{
    (void)g;
    return NULL;
}
void gpu_region_registered(struct gpu *g, struct buffer *region, intptr_t delta)
{
    (void)g, (void)region, (void)delta;
}
