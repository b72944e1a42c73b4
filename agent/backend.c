/*
 * backend.c: choosing a group's backend. It sits above the backends (it names
 * each one's ops table); what the backends share lives below it, in backends/host.c.
 */
#include "backend.h"

#include <stdio.h>
#include <string.h>

#include "config.h"

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
