/*
 * backend.c: choosing a group's backend.
 */
#include "backend.h"

#include <stdio.h>
#include <string.h>

#include "config.h"

const struct backend_ops *backend_choose(const struct group_config *gc, char *why, size_t whylen)
{
    char reason[192];
    int config_backend = gc->backend;
    if (config_backend == CONFIG_BACKEND_HOST) {
        snprintf(why, whylen, "configured as host");
        return &backend_host;
    }
    if (config_backend == CONFIG_BACKEND_AUTO) {
        int gpus = gc->ndevices > 0;
        for (int i = 0; i < gc->ndevices; i++)
            if (strcmp(gc->devices[i], "cpu") == 0) gpus = 0;
        if (!gpus) {
            snprintf(why, whylen, "auto chose host: the group's devices are not GPUs");
            return &backend_host;
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
    return &backend_host;
}
