/*
 * backend.c: choosing a group's backend, and the placement rule they share.
 */
#include "backend.h"

#include <stdio.h>
#include <string.h>

#include "buffer.h"
#include "config.h"
#include "group.h"
#include "wire.h"

int backend_check_placement(const struct group *g, int slot, const struct op *op, int want,
                            char *why, size_t whylen)
{
    int gpu_group = want >= 0;
    int gpu_op = (op->sqe.flags & WIRE_SQE_F_GPU) != 0;
    const struct buffer *bad = op->sb && op->sb->device != want   ? op->sb
                               : op->rb && op->rb->device != want ? op->rb
                                                                  : NULL;
    if (gpu_group != gpu_op)
        snprintf(why, whylen, "group '%s' runs on %s: its ops need %s", g->cfg->name, g->be->name,
                 gpu_group ? "GPU buffers and a stream" : "host buffers");
    else if (bad)
        snprintf(why, whylen, "slot %d of group '%s' runs on %s %d; a buffer of the op is on %s %d",
                 slot, g->cfg->name, want < 0 ? "the host" : "GPU", want,
                 bad->device < 0 ? "the host" : "GPU", bad->device);
    else
        return 0;
    return -1;
}

const struct backend_ops *backend_choose(const struct group_config *gc, char *why, size_t whylen)
{
    char reason[192];
    int config_backend = gc->backend;
    const struct backend_ops *host = gc->members > 1 ? &backend_tcp : &backend_host;
    if (config_backend == CONFIG_BACKEND_HOST) {
        snprintf(why, whylen, "configured as host");
        return host;
    }
    if (config_backend == CONFIG_BACKEND_AUTO) {
        int gpus = gc->ndevices > 0;
        for (int i = 0; i < gc->ndevices; i++)
            if (strcmp(gc->devices[i], "cpu") == 0) gpus = 0;
        if (!gpus) {
            snprintf(why, whylen, "auto chose host: the group's devices are not GPUs");
            return host;
        }
    }
    if (backend_nccl.probe(reason, sizeof(reason)) == 0) {
        snprintf(why, whylen, "nccl usable: %s", reason);
        return &backend_nccl;
    }
    if (config_backend == CONFIG_BACKEND_NCCL) {
        snprintf(why, whylen, "nccl required but unusable: %s", reason);
        return NULL;
    }
    snprintf(why, whylen, "auto chose host: %s", reason);
    return host;
}
