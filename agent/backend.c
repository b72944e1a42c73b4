/*
 * backend.c: choosing a group's backend.
 */
#include "backend.h"

#include <stdio.h>

#include "config.h"

const struct backend_ops *backend_choose(int config_backend, char *why, size_t whylen)
{
    char reason[192];
    if (config_backend == CONFIG_BACKEND_HOST) {
        snprintf(why, whylen, "configured as host");
        return &backend_host;
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
