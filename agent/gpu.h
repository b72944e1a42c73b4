/*
 * gpu.h: the agent's GPU side, implemented in backends/nccl.c (the only file that
 * includes CUDA or NCCL headers): one launcher thread per GPU that issues every NCCL
 * call for that GPU in one order, the communicator cache, and the import of GPU
 * buffers that applications share. The engine hands it matched ops (struct gpu_task)
 * and takes them back completed, through two queues with an eventfd doorbell, as with
 * the net thread. Declared without CUDA types, so the rest of the agent builds and is
 * tested on machines without CUDA.
 */
#ifndef AGENT_GPU_H
#define AGENT_GPU_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct gpu;
struct buffer;

#define GPU_COMMID_BYTES 128

enum gpu_task_type {
    GPU_TASK_OP = 0, /* run one rank's part of a matched op */
    GPU_TASK_DROP,   /* the group's communicators up to generation gen are over: abort them */
    GPU_TASK_FORGET, /* the group is gone (a child): destroy all its communicators; the
                        task is gpu_forget_group's, freed by the engine when it is back */
};

/* One rank's part of an op, on one GPU. Owned by the engine; lent to the device's
 * launcher between gpu_submit and its return through gpu_collect. */
struct gpu_task {
    struct gpu_task *next;
    int type;
    int group;    /* the group's index (group.h: cfg->groups, then children) */
    uint32_t gen; /* communicator generation of the group: (group, gen, device) is the key */
    int nranks, rank;
    uint8_t commid[GPU_COMMID_BYTES]; /* the generation's NCCL unique id */
    int device;                       /* the agent's ordinal */
    uint8_t kind, dtype, redop;
    uint64_t premul; /* redop WIRE_REDOP_PREMUL: this rank's scalar (the dtype's bits) */
    int peer;        /* root (broadcast, reduce) or peer rank (send, recv) */
    uint8_t more;    /* a send or receive whose NCCL group goes on (WIRE_SQE_F_MORE) */
    uint64_t count;
    void *send, *recv; /* device addresses in the agent */
    /* stream order (struct wire_shm): host addresses of the session's words */
    _Atomic uint64_t *ready, *done;
    void *ready_dev, *done_dev; /* the same words as the GPU addresses them */
    uint64_t tag;
    const atomic_int *client_gone; /* set when the session ends: release our stream */
    void *fence; /* launcher: the event recorded after the op on its stream. The op is
                    finished when that event is, never because of the done word, which
                    lives in memory the client can write */
    int64_t deadline_ns;
    int64_t init_ms; /* deadline for creating the communicator */
    /* set by the launcher */
    int status;
    int created_comm; /* this op waited for the communicator to be created */
    int comm_failed;  /* the communicator broke: the group needs a new generation */
    int replayed;     /* the launch was a CUDA graph replay (1), its first capture (2) */
    char why[160];
};

/* Start a launcher for each distinct GPU ordinal in devices. NULL (why filled) when
 * there is none or CUDA cannot run here. */
/* Whether GPUs and NCCL can be used here (no threads started); 0 with a summary, or
 * -1 with why. */
int gpu_probe(char *why, size_t whylen);

struct gpu *gpu_start(const int *devices, int ndevices, char *why, size_t whylen);
/* Stop the launchers: tasks still queued or in flight come back with
 * COLL_ERR_SHUTDOWN (collect them), communicators are aborted. Then gpu_free. */
void gpu_stop(struct gpu *g);
void gpu_free(struct gpu **g);

/* Engine thread. Queue t on the launcher of t->device. Never blocks. */
void gpu_submit(struct gpu *g, struct gpu_task *t);
/* Engine thread. Group index is gone (a child that went): its communicators on
 * devices[n] go too (GPU_TASK_FORGET). Nothing once gpu_stop began:
 * the stop ends every communicator. */
void gpu_forget_group(struct gpu *g, int group, const int *devices, int n);
/* Engine thread: readable when tasks are back (edge-triggered use). */
int gpu_notify_fd(const struct gpu *g);
/* Engine thread: take every returned task (oldest first per device). */
struct gpu_task *gpu_collect(struct gpu *g);
int gpu_has_results(struct gpu *g);
/* Engine thread: 1 before it may sleep in epoll (then it checks gpu_has_results once
 * more), 0 after; launchers ring the notify fd only while it is 1. */
void gpu_engine_sleeping(struct gpu *g, int v);
/* A new NCCL unique id (the net thread's coordinator; one-pod groups ask the worker
 * with GPU_JOB_COMMID); 0 or -1. */
int gpu_new_commid(uint8_t id[GPU_COMMID_BYTES], char *why, size_t whylen);

/* Resolve a group's device entry (a GPU UUID, or an ordinal of this agent) to an
 * ordinal; -1 with why. */
int gpu_resolve_device(const char *spec, char *why, size_t whylen);

/*
 * The GPU worker: what takes the CUDA driver milliseconds and would stall the engine
 * (registering a session's region, opening a client's buffer, closing both again,
 * minting a one-pod group's NCCL id) runs on one worker thread, in submission order.
 * The engine submits a job and takes it back done from gpu_collect_jobs (the same
 * doorbell as tasks); a job is the worker's in between.
 */
enum gpu_job_type {
    GPU_JOB_REGISTER = 0, /* register the session region hold -> delta */
    GPU_JOB_IMPORT_CUMEM, /* fd (the job's own, closed by the worker), size, uuid -> buf */
    GPU_JOB_IMPORT_IPC,   /* ipc, offset, size, uuid -> buf */
    GPU_JOB_COMMID,       /* -> commid, for group's generation gen */
};

struct gpu_job {
    struct gpu_job *next;
    int type;
    uint64_t session, req_id; /* who asked (register, imports) */
    uint32_t slot;            /* imports: the session's buffer slot it fills */
    int group;                /* commid */
    uint32_t gen;
    struct buffer *hold; /* register: the region, a reference kept while the worker uses it */
    int fd;
    size_t size;
    uint64_t offset;
    uint8_t uuid[16], ipc[64];
    /* results */
    int status; /* COLL_OK or a coll_err, with why */
    char why[160];
    struct buffer *buf; /* imports: one reference; the last unref releases on the worker */
    intptr_t delta;     /* register: add to a host address in the region for the GPU's */
    uint8_t commid[GPU_COMMID_BYTES];
    void *priv; /* the worker's own (releases) */
};

/* Engine thread. Never blocks. */
void gpu_job_submit(struct gpu *g, struct gpu_job *j);
/* Engine thread: take every finished job (in submission order). */
struct gpu_job *gpu_collect_jobs(struct gpu *g);
/* Engine thread: region was registered by a REGISTER job: from now on its last unref
 * unregisters and unmaps it on the worker. */
void gpu_region_registered(struct gpu *g, struct buffer *region, intptr_t delta);

#endif
