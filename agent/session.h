/*
 * session.h: one connected application process. Owns its socket, its shared rings
 * and doorbells, the buffers it shared and the group slots it holds; everything is
 * released when the socket closes, even with ops in flight.
 */
#ifndef AGENT_SESSION_H
#define AGENT_SESSION_H

#include <stdint.h>
#include <sys/types.h>

#include "group.h"
#include "wire.h"

struct buffer;
struct log_limit;
struct config;
struct gpu;

/* What a session needs of the engine that owns it, handed in at creation: the engine's
 * memory, outliving every session. A session reaches the engine through this alone. */
struct session_env {
    const struct config *cfg;
    int epfd;             /* the engine's epoll: a session's doorbell joins it */
    struct gpu *gpu;      /* NULL, or the agent's GPUs: clients may share GPU buffers */
    struct group *groups; /* the agent's groups, which OPEN_GROUP names */
    int ngroups;
    struct log_limit *lim_request, *lim_violation;
    uint64_t next_id; /* the engine thread's, as every session */
    int draining;     /* SIGTERM: new ops fail with SHUTDOWN, those in flight finish */
};

#define SESSION_MAX_HANDLES 64
#define SESSION_MAX_BUFFERS 4096
#define SESSION_MAX_IMPORTS 8 /* GPU buffer imports of one session on the worker at once */

/* CLOSING: refused at accept; kept until the client hangs up or the handshake deadline
 * passes, so that the refusal is read before the socket resets. */
enum session_state { SESSION_HANDSHAKE = 0, SESSION_READY, SESSION_CLOSING, SESSION_DEAD };

/* An epoll tag; the server tells the socket from the doorbell by the tag's address. */
struct session_ev {
    struct session *s;
};

/* A buffer slot whose GPU import is still on the worker. */
extern struct buffer session_pending_marker;
#define SESSION_BUF_PENDING (&session_pending_marker)

/* A premultiplied sum's slot of a handle (WIRE_REDOP_SET): set once, never changed. */
struct session_premul {
    uint8_t set, dtype;
    uint64_t scalar;
};

struct session_handle {
    struct group *g; /* NULL: free */
    int slot;
    uint32_t epoch;
    int op_ms; /* its ops' timeout: the client's (coll_group_opts) or the group's */
    struct session_premul *premul; /* [WIRE_PREMUL_SLOTS] once one is set; freed at close */
};

struct session {
    struct session_env *env;
    struct session *next, *prev;
    enum session_state state;
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    char client[WIRE_NAME_MAX];
    int fd, efd_agent, efd_client;
    struct wire_shm *shm;
    size_t shm_size;
    struct buffer *shm_buf; /* the region as a buffer: GPU ops in flight hold references */
    int shm_gpu;            /* 1: registered with CUDA (GPU agents, at HELLO), -1: failed */
    int hello_memfd;        /* >= 0: HELLO_OK waits for the worker's registration */
    uint64_t hello_req;
    uint32_t imports; /* GPU imports on the worker (their slots hold SESSION_BUF_PENDING) */
    uint32_t sq_head, cq_tail; /* next sq entry to take, next cq entry to fill */
    uint32_t cq_head_seen;     /* the client's cq consumption count, as last read */
    uint32_t inflight;         /* taken from the sq, completion not yet posted */
    int64_t handshake_deadline_ns;
    struct session_ev ev_sock, ev_bell;
    struct session_handle handles[SESSION_MAX_HANDLES];
    struct buffer **bufs; /* index = id - 1 */
    uint32_t nbufs;
    uint64_t ops_submitted;
};

/* A session for an accepted, credential-checked socket (takes fd). NULL on OOM. */
struct session *session_new(struct session_env *env, int fd, pid_t pid, uid_t uid, gid_t gid);
/* Release everything: slots (breaking their groups' epochs), buffers, rings, fds.
 * Completions for this session are discarded from here on. Sets *s to NULL. */
void session_destroy(struct session **s);

/* The socket is readable: handle one control message. Returns 0, or -1 when the
 * session must be destroyed (hang-up or protocol violation, already logged). */
int session_on_message(struct session *s);
/* Take new ops from the submission ring. Returns how many, or -1 when the session
 * broke the ring protocol and must be destroyed (logged). */
int session_poll(struct session *s);
/* Whether the next sq entry is published (no side effects). */
int session_has_work(struct session *s);
/* A job of a session's is back from the GPU worker (s NULL: the session is gone; what
 * the job made is released). Returns -1 when s must be destroyed (logged). */
struct gpu_job;
int session_job_done(struct session_env *env, struct session *s, struct gpu_job *j);
/* GPU buffers the session has open (imports done). */
int session_gpu_buffers(const struct session *s);
/* Post the completion of op (group callback). */
void session_complete(struct op *op, int status, const char *why);
/* Lease lease_id of this session's ended on the agent's side with code (why): say so
 * in its region. */
void session_lease_void(struct session *s, uint64_t lease_id, int code, const char *why);
/* The two above, as the groups' way up (group_init). */
extern const struct group_up session_group_up;
/* The agent stops: ask s's client to give the lease of handle back once its direct ops
 * under way are done (wire.h: lease_q's drain)... */
void session_lease_recall(struct session *s, uint32_t handle);
/* ... and whether it has some under way (its busy word, read after the recall). */
int session_lease_busy(const struct session *s, uint32_t handle);
/* ---- session_reply.c: what the agent says to the client ---- */
/* Send one message (and nfds descriptors, at most WIRE_LEASE_MAX_FDS) without blocking:
 * 0, or -1 when it did not go whole. */
int session_reply(struct session *s, const union wire_msg *m, const int *fds, int nfds);
/* Tell the client why it is being dropped (best effort, never blocks). */
void session_send_error(struct session *s, uint32_t req_id, int code, const char *msg);
/* A request the client may retry or correct: log it (rate-limited), answer with an
 * error of code, keep the session; returns 0. */
int session_refuse(struct session *s, uint32_t req_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A protocol violation: log it (rate-limited), tell the client, and return -1, which
 * has the engine drop the session. session.c's control messages and session_ops.c's
 * ring entries report through it. */
int session_violation(struct session *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
