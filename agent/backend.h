/*
 * backend.h: the seam between the agent's op matching and the code that moves data.
 * A backend is one ops table; groups pick one at start (config: host, nccl, auto).
 * Only backends/nccl.c includes CUDA or NCCL headers.
 */
#ifndef AGENT_BACKEND_H
#define AGENT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* One matched op: the buffers of every rank, resolved to addresses in the agent.
 * send[r] / recv[r] are NULL where rank r does not use them (or count is 0). For
 * send/recv the task holds one pair: send[0] is copied into recv[0]. */
struct backend_task {
    uint8_t kind, dtype, redop;
    int root;
    uint64_t count;
    int nranks;
    void *const *send;
    void *const *recv;
};

struct backend_ops {
    const char *name;
    /* Whether the backend can run here. Does not block (beyond driver queries); 0, or
     * -1 with a one-line reason. Called once per group at agent start. */
    int (*probe)(char *why, size_t whylen);
    /* Per-group state; NULL on failure. */
    void *(*ctx_new)(void);
    void (*ctx_free)(void *ctx);
    /* Run one matched op to completion on the calling thread; returns a coll_err.
     * Holds no locks; the caller guarantees the buffers stay mapped. */
    int (*run)(void *ctx, const struct backend_task *t);
};

extern const struct backend_ops backend_host;
extern const struct backend_ops backend_nccl;

struct group_config;
/*
 * The backend for a group: host for `host`; nccl for `nccl` when it probes fine (NULL,
 * why says why, when it cannot run); for `auto` nccl when the group's devices are GPUs
 * (a list without `cpu`) and NCCL probes fine, host otherwise. why always receives the
 * reason for the choice, for the log.
 */
const struct backend_ops *backend_choose(const struct group_config *gc, char *why, size_t whylen);

#endif
