/*
 * net.h: the agent's side of the network, on a thread of its own: the ZeroMQ
 * rendezvous (control plane) and the TCP connections between agents (data plane).
 * The engine hands it matched ops of groups that span several pods and gets them
 * back completed, through two queues with eventfd doorbells; it never blocks on the
 * network itself.
 */
#ifndef AGENT_NET_H
#define AGENT_NET_H

#include <stdatomic.h>
#include <stdint.h>

#include "backends/tcp.h"
#include "config.h"
#include "wire.h"

#define NET_MAX_LOCAL 64

struct net;
struct op;
struct spin_gate;

enum net_task_kind {
    NET_TASK_OP = 0, /* a matched op (kind below) */
    NET_TASK_MARK,   /* the engine moved the group to epoch `lepoch`; abort says whether
                        the net must end the cluster-wide epoch too */
    NET_TASK_CHILD,  /* a child across pods of a GPU group (child): the coordinator's id for
                        its communicator, asked for once the group is formed, and again
                        every heartbeat until it comes, the epoch ends or deadline_ns */
};

/* What NET_TASK_CHILD asks for (rdv_wire.h: CHILD_ASK), the engine's, lent with its task. */
struct net_child {
    uint32_t n, nth; /* the nth child of ranks[n] (parent ranks) this pod made in the epoch */
    uint64_t hash;   /* rdv_child_hash(ranks, n) */
    uint32_t ranks[WIRE_CHILD_MAX];
    int index;           /* the engine's group index of the child */
    uint8_t commid[128]; /* the answer (status COLL_OK) */
};

/* One op for the network. Owned by the engine; lent to the net thread between
 * net_submit and its return through net_collect. */
struct net_task {
    struct net_task *next;
    int type;
    int group;       /* index into cfg->groups */
    uint32_t lepoch; /* the engine's epoch of the group when the op was matched */
    int abort;       /* NET_TASK_MARK */
    int code;        /* NET_TASK_MARK with abort: why */
    uint64_t seq;
    uint64_t order; /* when the engine handed it over (net_submit) or ran it (net_inline):
                       the net thread runs the collectives of all groups in this order */
    uint8_t kind, dtype, redop;
    int root; /* global rank; send/recv: the remote peer's global rank */
    uint64_t count;
    int local_slot;          /* send/recv: the local participant */
    struct net_child *child; /* NET_TASK_CHILD */
    uint8_t p2p_phase;       /* a send between pods: its frame (P2P_EAGER, P2P_RTS, P2P_DATA) */
    uint8_t p2p_noack;       /* ... that completes once written (WIRE_SQE_F_NOACK: no ack comes) */
    uint16_t p2p_sig;        /* send/recv: wire_sqe_sig, in a send's frames, compared on arrival */
    uint32_t p2p_no;         /* ... and its number among the frames to that pod (p2p.c) */
    void *send[NET_MAX_LOCAL], *recv[NET_MAX_LOCAL]; /* per local slot */
    uint64_t premul[NET_MAX_LOCAL]; /* redop WIRE_REDOP_PREMUL: per local slot, its scalar */
    int64_t deadline_ns;
    int status;    /* set by the net thread */
    char why[160]; /* with a failed status: what failed and where, or "" */
    int source;    /* a receive: the rank whose send it took (net thread) */
    /* a receive from any rank (root WIRE_ANY_SOURCE): the engine holds it too, for the
     * pod's own sends; the side that claims it first completes it (net_any_claim) */
    _Atomic int any_claim;
    /* engine-owned */
    struct op *ops;
    int nops;
    struct net_task *engine_next;
};

/* A receive from any rank lives on both threads: the engine pairs it with a send of its
 * pod, the net thread with a message from another pod. Each side claims it before it
 * takes a send for it; 1 if who (NET_ANY_NET, NET_ANY_ENGINE) has it now. The net thread
 * returns a receive the engine claimed without touching it; the engine claims for the
 * net one that comes back unclaimed (failed: the epoch ended, or it timed out). */
enum { NET_ANY_FREE = 0, NET_ANY_NET, NET_ANY_ENGINE };
static inline int net_any_claim(struct net_task *t, int who)
{
    int was = NET_ANY_FREE;
    return atomic_compare_exchange_strong(&t->any_claim, &was, who) || was == who;
}

/* Something the engine must act on. */
struct net_event {
    struct net_event *next;
    int group;
    int broken; /* 1: the group's epoch ended (code, why); 0: formed (epoch) */
    int code;
    uint32_t epoch;
    char why[192];
    int has_commid; /* formed, NCCL group: the epoch's communicator id */
    uint8_t commid[128];
    int heap; /* net-internal: from malloc (the group's pool was empty) */
};

/* Makes a fresh communicator id (the NCCL backend's); 0, or -1 with why. */
typedef int (*net_commid_fn)(uint8_t *id, char *why, size_t whylen);

/*
 * Start the net thread for cfg's groups that span several pods. Binds the data-plane
 * listener (node.address:node.data_port) and, on node 0, the rendezvous ROUTER. For a
 * group with gpu_group[i] set (it runs on NCCL) the coordinator makes an id (commid) for
 * every epoch and COMMIT carries it; the formed event hands it to the engine.
 * Returns NULL (why filled) on failure. With no such group, returns NULL and sets why
 * to "".
 */
struct net *net_start(const struct config *cfg, const uint8_t *gpu_group, net_commid_fn commid,
                      struct spin_gate *gate, char *why, size_t whylen);
/* Stop the thread: what is in flight is abandoned (its transfers see the stop within
 * ~20 ms) and every task comes back with COLL_ERR_SHUTDOWN; collect them with
 * net_collect, then net_free. */
void net_stop(struct net *n);
void net_free(struct net **n);

/* Engine thread. Queue t (FIFO per group). Never blocks. */
void net_submit(struct net *n, struct net_task *t);
/* Any thread: the net thread takes a turn soon (its loop runs once more, its groups'
 * timers included), asleep or not. Never blocks. */
void net_knock(struct net *n);
/* Engine thread, once: how a tiny op the engine runs itself (net_inline) may sleep
 * there instead of going to the net thread when its peers are slow. fd (the engine's
 * epoll set) becomes readable when the engine has other work, once nap(ctx, 1) has told
 * its clients that it sleeps; nap returns nonzero if work is waiting already (it does not
 * sleep then), and nap(ctx, 0) is called on waking. Without it, such an op is handed
 * over at the end of its spin. */
typedef int (*net_nap_fn)(void *ctx, int asleep);
void net_engine_nap(struct net *n, int fd, net_nap_fn nap, void *ctx);
/*
 * Engine thread: run t (an op that crosses pods) right here if it is tiny (an allreduce
 * of a few KiB, a barrier), the group is formed and idle, and the net thread is not
 * busy; one hand-off fewer per pod for the ops where latency is everything. Returns
 * NET_INLINE_DONE (t->status set), NET_INLINE_HANDED (peers were slow: the net thread
 * finishes t and returns it through net_collect), or NET_INLINE_NO (submit it).
 */
enum { NET_INLINE_NO = 0, NET_INLINE_DONE, NET_INLINE_HANDED };
int net_inline(struct net *n, struct net_task *t);
/*
 * Engine thread (p2p_engine.c): post send or receive t right here when the group
 * is formed, the net thread is not at work and holds nothing of this pod's before it:
 * 1, and t comes back through net_collect as if submitted; else 0 (submit it). And,
 * while the engine spins, read the sockets of the pods that the sends and receives with
 * the net wait to hear from: a message or an ack that arrives completes its op with no
 * net thread to wake.
 */
int net_p2p_post(struct net *n, struct net_task *t);
void net_p2p_watch(struct net *n);
/*
 * Direct ops (docs/decisions/0011-direct-ops.md): the collective connections of a formed host group
 * with one participant on this pod, lent to that participant's client. While lent the
 * agent runs no collective of the group (one that comes is failed with INVALID; sends
 * and receives go on, on their own connections). An epoch that ends shuts the sockets
 * down under the client, except where a pod left (the rendezvous drains) while the
 * client had ops under way: then, as for its own queued ops, the agent waits for them,
 * a heartbeat at most, until the client gives the lease back. Engine thread.
 */
#define NET_LEASE_FDS 30 /* 2 (nodes - 1): groups of up to 16 pods */
struct net_lease {
    uint64_t id, seq; /* the next op's number in the epoch */
    int nodes, me, nfds;
    int fds[NET_LEASE_FDS]; /* the agent's own (it keeps them): for each other pod in node
                             * order, our bytes to it, then its bytes to us */
    uint32_t has_prev, run; /* the broadcast-ack state (tcp.h) */
    uint8_t prev[TCP_ACKS_STATE];
    uint16_t stash_len[WIRE_STASH_NODES]; /* what was read ahead, by node (in stash_out) */
    int own_cpus; /* no other pod of the group may run on this pod's CPUs (rdv_wire.h) */
};
/* Lend group's connections: 0 (out filled, and what was read ahead of them moved to
 * stash_out), COLL_ERR_BUSY (not formed, an op under way or acks owed: ask again later;
 * why says which) or COLL_ERR_UNSUPPORTED (never: several participants on this pod, a
 * GPU group, more pods than a lease holds). */
int net_lend(struct net *n, int group, struct wire_lease_words *words, struct net_lease *out,
             wire_stash *stash_out, char *why, size_t whylen);
/* Take lease id back with the state the client left (code: COLL_OK, or the failure of
 * a direct op, which ends the epoch, as why says; with COLL_OK, stash_len[p] bytes of
 * stash[p] are what it read ahead of node p, checked by wire_decode). A lease that already ended
 * (the epoch did) is ignored. Where the epoch was ending already (a pod left while the client had
 * ops under way: words' drain), returns that end's code and fills end_why; else 0. */
int net_unlend(struct net *n, int group, uint64_t id, uint64_t seq, uint32_t has_prev, uint32_t run,
               const uint8_t *prev, const uint16_t *stash_len, const wire_stash *stash, int code,
               const char *why, char *end_why, size_t end_whylen);
/* The client of lease id is gone: forget its words (they are unmapped next; the epoch
 * ends under the lease as the group's break says). Engine thread. */
void net_lease_forget(struct net *n, int group, uint64_t id);

/* Engine thread: readable when tasks or events are ready (edge-triggered use). */
int net_notify_fd(const struct net *n);
/* Engine thread: take every returned task and event (lists, oldest first). */
void net_collect(struct net *n, struct net_task **done, struct net_event **events);
/* Engine thread: give back an event that net_collect handed over. */
void net_event_release(struct net *n, struct net_event *e);
/* Any thread: what group index's formation waits for, as the net thread last
 * summarised it ("waiting for node indexes 2,3; DNS shows 3 of 4 pods"). */
void net_group_detail(struct net *n, int index, char *out, size_t cap);
struct net_group_stats {
    int joined; /* pods joined, as the coordinator sees it; -1 on other pods */
    double rendezvous_s, formation_s; /* the last epoch's */
    uint64_t formations;
    int cpu_shared;       /* the last commit's: 1 when another pod of the group may share this
                           * pod's CPUs (its waits learn their spin), 0 when none may (they hold
                           * it); -1 before the first commit */
    uint64_t early_bytes; /* what sends between pods that came before their receives
                           * hold in this agent (payload + 128 bytes each) */
};
void net_group_stats(struct net *n, int index, struct net_group_stats *out);
/* When the net thread's loop last turned (CLOCK_MONOTONIC ns), for /livez. */
const _Atomic int64_t *net_alive(const struct net *n);
/* Cheap check, without locking, for the engine's spin loop. */
int net_has_results(struct net *n);

#endif
