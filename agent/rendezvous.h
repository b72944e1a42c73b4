/*
 * rendezvous.h: the rendezvous of one group that spans several pods, as a state
 * machine with no sockets and no clock of its own (DESIGN.md section 6).
 *
 * In: decoded frames (rendezvous_frame), the time (rendezvous_tick, rendezvous_heartbeat), and
 * what the owner saw on the data plane (rendezvous_formed, rendezvous_end). Out, through the
 * callbacks of struct rendezvous_io: frames to send, a committed epoch to connect, the end of
 * an epoch. Node 0 is the coordinator: members send JOIN until they get COMMIT; when
 * every index is present the coordinator commits its next epoch (rdv_wire.h: its
 * incarnation and count, moved by nobody else) with the member table and a fresh secret. Heartbeats
 * go both ways; silence for 3 intervals, a member that joins again or leaves, or an ABORT end the
 * epoch, and everybody joins again.
 *
 * Identity: JOIN carries the pod's UID. The same index with the same UID is a rejoin;
 * a different UID replaces the pod on record once, and the replaced UID is refused
 * (with the reason) while the new pod holds the index, so two pods that claim one index
 * cost one epoch, not a storm. A refused member backs off with jitter before it asks
 * again.
 *
 * The owner (the net thread) calls in from one thread. A callback may call back in
 * (rendezvous_end from io.end, say); the machine reads its state again after each call.
 */
#ifndef AGENT_RENDEZVOUS_H
#define AGENT_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "rdv_wire.h"

#define RDV_ID_MAX 256 /* a member's ZeroMQ routing id */
#define RDV_BACKOFF_MIN_NS (50 * 1000000LL)
#define RDV_BACKOFF_MAX_NS (2000 * 1000000LL)

struct rendezvous_io {
    void *ctx;
    /* Send m to the member whose routing id this is, or (id NULL) to the coordinator. */
    void (*send)(void *ctx, const unsigned char *id, size_t idlen, union rdv_msg *m);
    /* Epoch c->h.epoch is committed: set up its data connections; call rendezvous_formed
     * when they are up. */
    void (*commit)(void *ctx, const struct rdv_commit *c);
    /* Another pod, or a deadline, ends the epoch. drain: the ops every pod holds may
     * finish first (RDV_DRAIN; RDV_DRAIN_SILENT where a pod went silent: what it did
     * not send will not come, so only work the owner moves itself is worth finishing).
     * The owner calls rendezvous_end (tell 0) once it has ended. */
    void (*end)(void *ctx, int code, const char *why, int drain);
    /* n random bytes (secrets, jitter). */
    void (*random)(void *ctx, void *buf, size_t n);
    /* Coordinator of a GPU group: a fresh communicator id for the next epoch, without
     * waiting: 0; 1 when it is not made yet (the commit waits for a later tick); or -1
     * with why (the epoch then commits without one). May be NULL. */
    int (*commid)(void *ctx, uint8_t *id, char *why, size_t whylen);
    /* The answer to a rendezvous_child_ask of this pod: code COLL_OK and the child's
     * communicator id, or a coll_err and why. May be NULL (no GPU group). */
    void (*child_id)(void *ctx, uint64_t hash, uint32_t nth, int code, const uint8_t *id,
                     const char *why);
};

/* Coordinator: the children of its epoch, one id each (rendezvous_child.c). An entry is
 * done once every pod that holds one of its ranks has its answer, and stays (a pod that
 * lost its answer and asks again gets the same id) until its room is needed; they all go
 * with the epoch. At most RDV_CHILD_TABLE are being made at once (a pod whose members
 * never ask leaves one behind until the epoch ends). */
#define RDV_CHILD_TABLE 128
struct rdv_child_entry {
    int used, has_id, pods, answered;
    uint64_t done; /* made (every pod told): when, counted; kept until its room is needed */
    uint64_t hash;
    uint32_t nth, n;
    uint32_t ranks[RDV_CHILD_MAX];
    uint8_t id[RDV_COMMID_BYTES];
    uint8_t asked[RDV_MAX_NODES / 8]; /* pods owed the answer */
    uint8_t told[RDV_MAX_NODES / 8];  /* ... given it */
};

struct rendezvous_settings {
    const char *group, *pod, *data_addr, *uid; /* copied; uid: the pod's UID (never empty) */
    int nodes, me, nlocal;
    uint64_t config_hash;
    struct rdv_settings settings; /* what config_hash covers, for refusals that say what */
    int heartbeat_ms, join_ms;
    int gpu;                 /* commits carry a communicator id */
    struct log_limit *limit; /* for the coordinator's refusals; may be NULL */
    struct rdv_place place;  /* where this pod runs (rdv_wire.h); zeroed: not known */
};

struct rdv_peer {
    int present;
    unsigned char id[RDV_ID_MAX];
    size_t idlen;
    int64_t last_heard;
    struct rdv_join join;
    char displaced[RDV_NAME_MAX]; /* the UID this index's pod replaced: refused while it holds */
};

struct rendezvous {
    /* settings */
    char group[RDV_NAME_MAX], pod[RDV_POD_MAX], data_addr[RDV_ADDR_MAX], uid[RDV_NAME_MAX];
    int nodes, me, nlocal, gpu;
    uint64_t config_hash;
    struct rdv_settings settings;
    int64_t hb_ns, join_ns;
    struct log_limit *limit;
    struct rdv_place place;
    struct rendezvous_io io;
    /* state */
    uint32_t epoch;       /* committed epoch, or the last one (0: never) */
    uint64_t inc;         /* ... of this coordinator incarnation (members: 0 before a commit) */
    int committed;        /* epoch is current (its data connections may still form) */
    int formed;           /* ... and they are up */
    int ending;           /* io.end was called, rendezvous_end not yet */
    int commit_waiting;   /* coordinator: every pod is here, the commit waits for its id */
    int64_t join_backoff; /* members: wait before the next JOIN after a failed epoch */
    int join_unanswered;  /* members: a JOIN went out since the last refusal */
    int64_t next_join, next_hb, coord_heard, form_deadline;
    struct rdv_peer peers[RDV_MAX_NODES];             /* coordinator: who has joined */
    char last_reject[RDV_MSG_MAX];                    /* members: the last refusal, logged once */
    struct rdv_child_entry children[RDV_CHILD_TABLE]; /* coordinator */
    int nchildren;                                    /* ... being made (not done) */
    uint64_t children_done;                           /* ... made so far (done's clock) */
    uint64_t commits, ends;                           /* counters for tests and metrics */
};

void rendezvous_init(struct rendezvous *s, const struct rendezvous_settings *st,
                     const struct rendezvous_io *io);
/* A decoded frame for this group: from the member with routing id (coordinator), or
 * from the coordinator (id NULL). */
void rendezvous_frame(struct rendezvous *s, const unsigned char *id, size_t idlen,
                      const union rdv_msg *m, int64_t now);
/* Timers: heartbeats, JOINs, silent peers, the formation deadline. */
void rendezvous_tick(struct rendezvous *s, int64_t now);
/* Heartbeats only (called while a long op of this group runs). */
void rendezvous_heartbeat(struct rendezvous *s, int64_t now);
/* Whether a pod this one hears from has been silent for 3 heartbeat intervals (the
 * coordinator, for a member; any member, for the coordinator): 1 with why. For the
 * owner's long ops, which only send heartbeats meanwhile (rendezvous_heartbeat). */
int rendezvous_silent(const struct rendezvous *s, int64_t now, char *why, size_t whylen);
/* The committed epoch's data connections are up. */
void rendezvous_formed(struct rendezvous *s);
/* Something the owner saw (a broken data connection) ends the committed epoch: as if
 * the machine had decided it: ABORT to the others (tell), then io.end with drain. */
enum { RDV_DRAIN = 1, RDV_DRAIN_SILENT = 2 };
void rendezvous_fail(struct rendezvous *s, int code, const char *why, int tell, int drain);
/* The owner ends the epoch (an op failed, a deadline, or after io.end): tell the
 * other pods (tell), forget who joined (coordinator) or join again (members: at once
 * after a formed epoch, with backoff and jitter after one that never formed). */
void rendezvous_end(struct rendezvous *s, int code, const char *why, int tell, int64_t now);
/* This pod is stopping: a member tells the coordinator (LEAVE), the coordinator tells
 * every member (ABORT), so nobody waits for silence. */
void rendezvous_leave(struct rendezvous *s);
/*
 * Children across pods of a GPU group (rdv_wire.h: CHILD_ASK). This pod made the nth
 * child of the list ranks[n] (parent ranks) in the committed epoch: ask the coordinator
 * for its communicator id (the coordinator itself answers at once, or when its id
 * thread has one). The answer comes through io.child_id, at most once per ask; asking
 * again (a lost frame) is safe, and is the owner's to do, at most every heartbeat. Asks
 * of an epoch that ended get no answer: the owner fails them with the epoch.
 */
void rendezvous_child_ask(struct rendezvous *s, const uint32_t *ranks, uint32_t n, uint32_t nth);
/* rendezvous_frame's part for CHILD_ASK (coordinator, from member from) and CHILD_ID. */
void rendezvous_child_frame(struct rendezvous *s, int from, const union rdv_msg *m);
/* Coordinator: answer the asks whose id the id thread had not made yet (tick); forget
 * every child of the epoch (its end). */
void rendezvous_child_tick(struct rendezvous *s);
void rendezvous_child_clear(struct rendezvous *s);

/* Coordinator: answer a JOIN for a group it does not have. */
void rendezvous_reject_unknown(const struct rendezvous_io *io, const unsigned char *id,
                               size_t idlen, const struct rdv_join *j, struct log_limit *limit);

#endif
