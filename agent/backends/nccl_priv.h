/*
 * nccl_priv.h: what the files of the NCCL backend share (never included elsewhere):
 * the launcher's objects and the functions that cross files. Layers, bottom to top,
 * each calling only those below it:
 *   nccl.c         the probe, devices, host registration, NCCL ids;
 *   nccl_post.c    tasks handed to the engine, its doorbell, the ops' fence events;
 *   nccl_worker.c  the worker thread: imports of client memory, registrations, releases;
 *   nccl_graph.c   eager and replayed (CUDA graph) launches;
 *   nccl_comm.c    the communicator cache, its creation, aborts (on reaper threads) and
 *                  generations;
 *   nccl_launch.c  the launcher thread per GPU, issuing, completion by event, and the
 *                  engine-facing API of gpu.h.
 */
#ifndef AGENT_BACKENDS_NCCL_PRIV_H
#define AGENT_BACKENDS_NCCL_PRIV_H

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../backend.h"
#include "../buffer.h"
#include "../gpu.h"
#include "../log.h"
#include "coll/coll.h"
#include "ring.h"
#include "wire.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cudrv.h"
#include "lcgpu.h"
#include "util.h"

/*
 * The GPU side's error-path convention. A CUDA or NCCL call whose failure ends the
 * step goes through CUDA_TRY / NCCL_TRY: why (whylen bytes, both in scope, as
 * libcoll's cudrv.c TRY) gets what was being done and the library's words, CUDA's sticky-free error
 * is cleared, and control jumps to label, named after what must be undone (labels fall through in
 * reverse order of the steps). A cleanup call whose failure changes nothing goes through CUDA_WARN,
 * which logs it: no result is dropped silently.
 */
#define CUDA_TRY(call, what, label)                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            cudaGetLastError();                                                                    \
            snprintf(why, whylen, "%s: %s", what, cudaGetErrorString(e_));                         \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)
#define NCCL_TRY(call, what, label)                                                                \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess && r_ != ncclInProgress) {                                           \
            snprintf(why, whylen, "%s: %s", what, ncclGetErrorString(r_));                         \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)
#define CUDA_WARN(call, event)                                                                     \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            cudaGetLastError();                                                                    \
            log_msg(LOG_WARN, event, "call=\"%s\" error=\"%s\"", #call, cudaGetErrorString(e_));   \
        }                                                                                          \
    } while (0)

#define NCCL_BATCH_MAX WIRE_RING_ENTRIES /* tasks issued as one NCCL group, at most */

/* An op's launch captured as a CUDA graph, keyed by everything the launch reads. */
#define GRAPH_SLOTS 32
struct cgraph {
    int used, seen, failed;
    uint8_t kind, dtype, redop;
    int32_t peer;
    uint64_t count;
    const void *send;
    void *recv;
    cudaGraphExec_t exec;
    uint64_t last;
};

/* INIT: the root communicator is being created; SPLIT: its blocking child is being
 * split off (several ranks only); READY: ops run on c. */
enum comm_state { COMM_INIT = 0, COMM_SPLIT, COMM_READY, COMM_BROKEN };

struct comm {
    struct comm *next;
    int group;
    uint32_t gen;
    int nranks, rank;
    enum comm_state state;
    ncclComm_t root;   /* non-blocking, made from the coordinator's id */
    ncclComm_t *child; /* blocking, split from root; NCCL's thread writes it, so the
                          slot outlives an abort that interrupts the split */
    ncclComm_t c;      /* what ops are launched on: root (one rank) or child */
    cudaStream_t stream;
    void *scratch; /* barrier's element */
    void *tmp;     /* in-place all-to-all's copy of the input */
    size_t tmp_size;
    int64_t init_deadline, next_check;
    int64_t created_ns;
    char why[160];
    struct gpu_task *fly_head, *fly_tail; /* issued, in stream order */
    cudaEvent_t *evfree;                  /* fences of finished ops, for the next ones */
    int nevfree, capevfree;
    /* ops that repeat are replayed as CUDA graphs (graph_launch) */
    struct cgraph graphs[GRAPH_SLOTS];
    uint64_t graph_tick;
    unsigned graph_bufgen;
    /* a launch NCCL left in progress (non-blocking communicator): its ops wait here,
     * polled by the launcher's loop, and c's later ops wait behind them */
    struct gpu_task *settle[NCCL_BATCH_MAX];
    int nsettle;
    int64_t settle_deadline;
    uint64_t held_pass; /* the launcher's pass that left an op of c pending */
};

struct launcher {
    struct gpu *g;
    int device;
    pthread_t thread;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct gpu_task *in_head, *in_tail;     /* from the engine */
    int sleeping;                           /* guarded by lock */
    struct gpu_task *pend_head, *pend_tail; /* taken, not yet issued */
    struct comm *comms;
    uint64_t pass; /* issue_pending's passes */
    uint64_t created, issued, graphs_made, replayed;
};

struct gpu {
    const struct cudrv *drv;
    int nl;
    struct launcher *l;
    int by_device[CONFIG_MAX_DEVICES * 4];
    atomic_int stop;
    pthread_mutex_t out_lock;
    struct gpu_task *out_head, *out_tail;
    atomic_int has_out;
    atomic_int engine_sleeping;
    int out_efd;
    struct gpu_job *jout_head, *jout_tail; /* finished jobs, guarded by out_lock */
    /* the worker (nccl_worker.c) */
    pthread_t wk;
    int wk_started, wk_stop; /* guarded by wk_lock */
    pthread_mutex_t wk_lock;
    pthread_cond_t wk_cond;
    struct gpu_job *wk_head, *wk_tail;
};

/* A job the worker makes for itself (never returned): release what a buffer held. */
#define GPU_JOB_RELEASE 100
enum { RELEASE_CUMEM = 1, RELEASE_IPC, RELEASE_REGION };

#define SPIN_NS 200000LL           /* keep polling this long after the last progress */
#define CHECK_NS 1000000LL         /* async-error poll interval per communicator */
#define ISSUE_WAIT_NS 5000000000LL /* a launch NCCL leaves in progress gets this long */
#define P2P_GATHER_NS 20000LL      /* a lone send or receive waits this long for partners */
#define P2P_MORE_NS 100000000LL    /* ... one that says more follow (MORE), for those */

/* nccl.c */
extern atomic_uint nccl_buf_gen; /* bumped when an import goes away: graphs are dropped */
int gpu_register_host(void *p, size_t size, intptr_t *dev_delta, char *why, size_t whylen);

/* nccl_post.c */
void nccl_post(struct gpu *g, struct gpu_task *t);
void nccl_ring_engine(struct gpu *g); /* after publishing under out_lock */
void nccl_fail_task(struct gpu *g, struct gpu_task *t, int code, int comm_failed, const char *why);
cudaEvent_t nccl_fence_get(struct comm *c); /* from c's free list, else new; NULL on failure */
void nccl_fence_put(struct comm *c, struct gpu_task *t, int finished);
void nccl_fences_free(struct comm *c);

/* nccl_worker.c: imports and releases (run by the worker), the worker */
struct buffer *gpu_import_cumem(struct gpu *g, int fd, size_t size, const uint8_t uuid[16],
                                char *why, size_t whylen, int *code);
struct buffer *gpu_import_ipc(struct gpu *g, const uint8_t handle[64], uint64_t offset, size_t size,
                              const uint8_t uuid[16], char *why, size_t whylen, int *code);
void nccl_release_run(struct gpu_job *j);
int nccl_worker_start(struct gpu *g, char *why, size_t whylen);
void nccl_worker_stop(struct gpu *g);
void nccl_worker_queue(struct gpu *g, struct gpu_job *j); /* any thread */

/* nccl_comm.c: launcher thread only */
extern atomic_int nccl_reapers_live; /* aborts still running on reaper threads */
void nccl_comm_abort(struct launcher *l, struct comm *c);
void nccl_comm_break(struct launcher *l, struct comm *c, int code, const char *why);
void nccl_comm_destroy(struct launcher *l, struct comm *c);
struct comm *nccl_comm_find(struct launcher *l, int group, uint32_t gen);
struct comm *nccl_comm_get(struct launcher *l, struct gpu_task *t);
void nccl_drop_generation(struct launcher *l, int group, uint32_t gen);
void nccl_forget_group(struct launcher *l, int group); /* it went: destroy its communicators */
int nccl_comm_progress(struct launcher *l, struct comm *c);

/* nccl_graph.c: launcher thread only */
extern int nccl_graphs_on; /* 0 off, 1 one-rank communicators, 2 all (COLL_NCCL_GRAPHS) */
void nccl_graph_flush(struct comm *c);
ncclResult_t nccl_settle(ncclComm_t comm, ncclResult_t r, int64_t wait_ns);
ncclResult_t nccl_launch(struct comm *c, const struct gpu_task *t);
ncclResult_t nccl_graph_launch(struct launcher *l, struct comm *c, const struct gpu_task *t);

#endif
