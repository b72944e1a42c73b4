/*
 * backend.h: the seam between a group (slots, epochs, matching: group.c) and the code
 * that moves data. Every transport is one ops table; a group picks one at start
 * (backend_choose) and from then on reaches it only through the table:
 *   host  participants inside one pod, host buffers (backends/host.c), run inline
 *         (a large op a slice per engine turn: backend_ops.turn);
 *   tcp   host buffers across pods (backends/tcp_group.c): the net thread runs them;
 *   nccl  GPU buffers, in a pod or across pods (backends/nccl_group.c): the GPU
 *         launchers run them.
 * All entries are called on the engine thread. None blocks: work that waits goes to
 * the net thread or a launcher, and comes back through the engine's doorbells. Every
 * op handed to a backend completes exactly once, through g->op_done (now or later).
 */
#ifndef AGENT_BACKEND_H
#define AGENT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct group;
struct op;
struct session;
struct group_config;

/* What /metrics says of a group's backend. */
struct backend_stats {
    uint64_t inline_ran, handed_over, queued; /* tcp: ops run on the engine, finished by the
                                                 net thread after starting there, queued */
    uint64_t comms_created;                   /* nccl: communicators created */
    uint64_t comm_generations;                /* nccl: generations (one more per failure) */
    uint64_t graph_replays, graphs_captured;  /* nccl: ops launched from CUDA graphs, and
                                                 the graphs captured for them */
};

struct backend_ops {
    const char *name;
    /* Whether the backend can run on this machine. Does not block (beyond driver
     * queries); 0, or -1 with a one-line reason. */
    int (*probe)(char *why, size_t whylen);
    /* Per-group state (g->be_ctx) and resources; 0, or -1 with g->backend_why set. fini
     * undoes whatever init did, also after a failed init. */
    int (*init)(struct group *g);
    void (*fini)(struct group *g);
    /* Placement: may op (buffers resolved) run from this slot of g? 0, or -1 with why;
     * the op then fails with INVALID and nothing else happens. */
    int (*accept)(const struct group *g, int slot, const struct op *op, char *why, size_t whylen);
    /* A matched collective whose participants agree: ops[0..g->nslots), round seq. */
    void (*collective)(struct group *g, struct op *ops, uint64_t seq, int64_t deadline_ns);
    /* A send or receive: 1 when the backend takes it (its partner is on another pod, or
     * the backend pairs them itself), 0 when the group pairs it within the pod and
     * then calls pair. A receive from any rank comes once the group keeps it: the
     * backend may lend it to other pods too (op->any_task) and returns 0, or 1 when it
     * failed it. */
    int (*p2p)(struct group *g, struct op *op);
    /* A send and its receive, both in this pod and agreeing: move the bytes. Returns a
     * coll_err; the group completes both. */
    int (*pair)(struct group *g, struct op *snd, struct op *rcv);
    /* The group's epoch ended (err, why): fail what the backend holds that has not
     * started, and let go of the epoch's resources. May be NULL. */
    void (*epoch_over)(struct group *g, int err, const char *why);
    /* The earliest deadline of ops the backend holds before they start (INT64_MAX:
     * none); past it, the group ends the epoch with TIMEOUT. May be NULL. */
    int64_t (*held_deadline)(const struct group *g);
    /* Ops of g out on another thread: 0 none, 1 some, 2 some on long transfers (the
     * engine then sleeps instead of spinning). May be NULL (never any). */
    int (*outstanding)(const struct group *g);
    /* Whether tasks of g are out on another thread, in memory of g's backend state: a
     * child then stays until they are back (group_child_release). May be NULL (never). */
    int (*busy)(const struct group *g);
    /* A turn of the backend's own work on the engine thread (a large local op, a slice
     * at a time), until about until_ns; nonzero when it did some (the engine then looks
     * at its rings and comes back). May be NULL. */
    int (*turn)(struct group *g, int64_t until_ns);
    /* s is going away: ops the backend holds must not complete to it. */
    void (*forget_session)(struct group *g, const struct session *s);
    /* The GPUs the group's slots use (ordinals, at most max); 0 for host groups. */
    int (*devices)(const struct group *g, int *devs, int max);
    /* counters for /metrics (engine thread; NULL: none) */
    void (*stats)(const struct group *g, struct backend_stats *out);
};

extern const struct backend_ops backend_host;
extern const struct backend_ops backend_tcp;
extern const struct backend_ops backend_nccl;

/*
 * The backend for a group: host (tcp across pods) for `host`; nccl for `nccl` when it
 * probes fine (NULL, why says why, when it cannot run); for `auto` nccl when the
 * group's devices are GPUs (a list without `cpu`) and NCCL probes fine, host (tcp)
 * otherwise. why always receives the reason for the choice, for the log.
 */
const struct backend_ops *backend_choose(const struct group_config *gc, char *why, size_t whylen);

/* Buffers must live where the group runs: want -1 (host groups: host buffers, no GPU
 * flag) or the slot's GPU (GPU flag, buffers on that GPU). 0, or -1 with why. */
int backend_check_placement(const struct group *g, int slot, const struct op *op, int want,
                            char *why, size_t whylen);

/* The data movement of the host backend, also the tcp backend's within a pod. */
struct backend_task {
    uint8_t kind, dtype, redop;
    int root;
    uint64_t count;
    int nranks;
    void *const *send;
    void *const *recv;
    const uint64_t *premul; /* redop WIRE_REDOP_PREMUL: each rank's scalar, else unused */
};
/* Run one matched op over buffers all mapped here; a coll_err. Scratch: at least
 * HOST_SCRATCH_BYTES, 8-byte aligned. */
#define HOST_SCRATCH_BYTES (16 * 4096)
int host_run(void *scratch, const struct backend_task *t);
int host_pair(struct group *g, struct op *snd, struct op *rcv);
/* The engine's turn for backends that slice their work (backend_ops.turn). */
#define BACKEND_TURN_NS 50000

/* Completions for the engine to route (backends/tcp_group.c, nccl_group.c). */
struct net_task;
struct net_event;
struct gpu_task;
void tcp_group_done(struct group *g, struct net_task *t);
void nccl_group_formed(struct group *g, const struct net_event *ev);
/* A child across pods got its communicator's id from the coordinator (code COLL_OK), or
 * will not (its held ops fail with code and why). */
void nccl_child_formed(struct group *g, int code, const uint8_t *id, const char *why);
struct gpu_job;
void nccl_group_commid(struct group *g, const struct gpu_job *j);
void nccl_group_done(struct group *g, struct gpu_task *t);

#endif
