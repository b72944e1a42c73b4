/*
 * net_priv.h: the net thread's state, shared by the files that make it up and by
 * nobody else:
 *   net.c        the loop and op scheduling (net_setup.c: making and stopping it);
 *   net_epoch.c  the ZeroMQ sockets, the rendezvous state machine of each group
 *                (rendezvous.c) and what an epoch's end does here;
 *   dataconn.c   the data connections: listener, accepts and hellos, outgoing set-ups;
 *   p2p.c        framed sends and receives between pods, with the unexpected queue;
 *   p2p_engine.c the engine's turn at them (it posts and reads while it spins);
 *   net_queue.c  the queues to and from the engine.
 * Layers, top to bottom, each calling only those below it: net.c; net_epoch.c;
 * p2p_engine.c; dataconn.c and p2p.c (which reach net_epoch.c only through struct
 * net's epoch calls, and never from the engine's turn); net_queue.c.
 * Every field below is the net thread's unless its comment names another owner or a
 * lock: the engine reaches the net only through net.h.
 */
#ifndef AGENT_NET_PRIV_H
#define AGENT_NET_PRIV_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/tcp.h"
#include "log.h"
#include "net.h"
#include "net_commid.h"
#include "rdv_wire.h"
#include "rendezvous.h"
#include "security.h"
#include "util.h"

#define MAX_PENDING_ACCEPTS 256
#define PENDING_HELLO_NS (3000 * NS_PER_MS)   /* a connection must say who it is this fast */
#define PENDING_FUTURE_NS (10000 * NS_PER_MS) /* a proven-looking hello may wait for its epoch */
/* Hellos for an epoch not committed here yet, kept per source address and claimed
 * connection (group, node, channel); one more is answered NOT_YET, never by dropping one
 * already kept (a newer hello from the same address proves nothing until the commit). */
#define CLAIMS_PER_SOURCE 2
#define RETRY_FIRST_NS (1 * NS_PER_MS) /* a NOT_YET: connect again after this, doubling */
#define RETRY_MAX_NS (64 * NS_PER_MS)
/* A send of more than UNX_SMALL bytes between pods asks first (P2P_RTS: a header alone)
 * and sends its payload once the receive is posted (P2P_CTS), so that no payload waits in
 * the stream ahead of other ranks' messages (one that did could tie up the pods: a
 * receive posted late behind a send that waited for it). Messages and asks that arrive
 * before their receive is posted are kept in memory of ours within these bounds; beyond
 * them the stream waits (TCP flow control holds the sender back) until the receive is
 * posted. A peer can make the agent hold at most this much. */
#define UNX_SMALL (1u << 20) /* an RTS's round trip: +16% at 256 KiB, +3% at 2 MiB (RESULTS) */
#define UNX_PEER_MAX (4u << 20)
#define UNX_GROUP_MAX (16u << 20)
/* Each kept message is charged its payload plus this (its record and the allocator's
 * share), and counted: a flood of empty sends costs what it holds, and at most
 * UNX_PEER_MSGS from one peer, UNX_GROUP_MSGS in all, are kept (242e584: a million
 * empty ones were charged nothing and held 106.8 MiB). */
#define UNX_MSG_COST 128u
#define P2P_KEEP 4 /* early messages' buffers a group keeps for the next ones (p2p_keep.c) */
#define UNX_PEER_MSGS 1024u
#define UNX_GROUP_MSGS 4096u
/* zmq_poll items: send/recv connections, outgoing set-ups, pending accepts, and 5 more
 * (ZAP, the ROUTER, the DEALER, the data listener, the engine's eventfd); poll_set counts
 * the fixed ones first, so the bound holds whatever a node has */
#define ITEMS_MAX (256 + DATA_CH_COUNT * RDV_MAX_NODES + MAX_PENDING_ACCEPTS + 5)
#define EV_POOL 16 /* events a group may have waiting for the engine before malloc */

/* Sends to one pod: a FIFO, the head partly written. */
struct p2p_out {
    struct net_task *head, *tail;
    size_t done; /* bytes of header + payload of head written */
    struct data_op_hdr hdr;
    /* the receiver's word on each message: a send completes when its receive has
     * taken it (as within a pod), with MISMATCH when the receive disagreed */
    struct net_task *wait_head, *wait_tail; /* sent, waiting for their acks */
    struct net_task *rts_head, *rts_tail;   /* large: asked to send, waiting for a CTS */
    uint32_t msgno;                         /* sends framed to this pod so far (p2p.c) */
    struct data_op_hdr *acks; /* acks to write, in order; the first acks_done bytes in */
    size_t nacks, capacks, acks_done;
};

/* A message that arrived before its receive was posted. */
struct unexpected {
    struct unexpected *next;
    struct data_op_hdr hdr;
    void *data;
    size_t cap;  /* data's size (p2p_keep.c) */
    int from;    /* the pod it came from (for the per-peer bound) */
    size_t cost; /* what it is charged: its payload and UNX_MSG_COST */
};

/* Receiving from one pod: header, then payload into a posted buffer or a copy. */
struct p2p_in {
    struct data_op_hdr hdr;
    size_t hgot, pgot, plen;
    struct net_task *task;  /* the matched receive, or NULL */
    struct unexpected *unx; /* or where the payload goes */
    int discard;            /* mismatched: read and drop the payload */
    int parked;             /* header read, no receive, too large to copy: wait for one */
};

/* One of our connections of the committed epoch still being set up (connect, then the
 * peer's challenge), moved on by dataconn_progress_outgoing from the poll loop. */
/* One of our data connections on its way up (rdv_wire.h: the handshake). */
struct outgoing {
    int fd, peer, ch; /* fd -1: the peer said NOT_YET; connect again at retry_at */
    int connected;    /* the TCP connect has completed */
    int hello_sent;   /* the challenge came and our hello went: the welcome is due */
    size_t got;       /* bytes of the message due (challenge, then welcome) */
    union {
        struct data_challenge chal;
        struct data_welcome wel;
    } in;
    uint8_t nonce[SEC_NONCE_BYTES];      /* our hello's: the welcome proves the secret over it */
    uint8_t chal_nonce[SEC_NONCE_BYTES]; /* the challenge's (security.data keys, seal.h) */
    int64_t retry_at, backoff_ns;
};

struct ngroup {
    struct net *net; /* the owner */
    const struct group_config *cfg;
    int index; /* in cfg->groups */
    int nodes, me, nlocal;
    uint64_t config_hash, name_hash;
    int gpu; /* the group runs on NCCL: epochs carry a communicator id */
    /* the rendezvous: rdv.epoch is the net epoch (committed, or the last one), which
     * the engine's group epoch follows but does not equal */
    struct rendezvous rdv;
    char discovery[256]; /* net_discovery.c: what formation waits for; out_lock to read */
    /* for /metrics, written under out_lock: pods joined (coordinator; -1 elsewhere), the
     * last epoch's rendezvous (waiting to commit) and formation (commit to formed), the
     * last commit's cpu_shared (-1 before the first) */
    int joined;
    double rdv_s, form_s;
    uint64_t formations;
    int pub_cpu_shared;
    int64_t wait_since, commit_ns; /* net thread's */
    int ready;                     /* rdv.committed and every data connection is up */
    int awaiting_mark;             /* aborted by the net: hold ops until the engine's mark */
    int abort_pending;        /* the epoch is ending: finish the ops all pods have, then abort */
    int abort_silent;         /* ... a pod went silent: running ops stop at their next turn */
    struct net_task *running; /* the op tcp_run is moving, off the queue */
    /* tiny ops the engine runs itself (net_inline); coll_lock guards these and the lease */
    struct tcp_tiny *tiny;
    struct net_task *handoff; /* started by the engine, to be finished here */
    /* NET_TASK_CHILD: asks for children's ids, until their answers (net_epoch.c) */
    struct net_task *ask_head, *ask_tail;
    int64_t ask_next; /* when they go (again) */
    int inline_abort; /* the engine's tiny op failed: end the epoch */
    int lent;         /* the collective connections are lent (net_lend) */
    uint64_t lease_id;
    struct wire_lease_words *lease_w; /* the lease's words in the client's region, or NULL */
    int64_t drain_until;              /* abort_pending while lent: the client has until then */
    char inline_why[160];
    int abort_code;
    char abort_why[RDV_MSG_MAX];
    uint32_t floor; /* ops of engine epochs below this fail */
    int has_commid;
    uint8_t commid[RDV_COMMID_BYTES];
    uint8_t secret[RDV_SECRET_BYTES]; /* the committed epoch's data-plane secret */
    struct rdv_member members[RDV_MAX_NODES];
    int cpu_shared; /* the commit's RDV_MEMBER_CPU_SHARED for this pod */
    /* data connections */
    struct outgoing og[DATA_CH_COUNT * RDV_MAX_NODES];
    int nog;
    /* connections of an epoch that ended in a mismatch or while lent, closed at
     * grave_until: a pod
     * still reading from us then fails through the ABORT (MISMATCH), not on a closed
     * socket (PEER_LOST) */
    int grave[DATA_CH_COUNT * RDV_MAX_NODES];
    int ngrave;
    int64_t grave_until;
    int fds[RDV_MAX_NODES];  /* collectives, in lockstep: our bytes to node i */
    int rfds[RDV_MAX_NODES]; /* collectives: node i's bytes to us */
    int pfds[RDV_MAX_NODES]; /* sends and receives, framed */
    /* security.data mac or encrypt (seal.h): the records of each connection, one seal
     * per direction (fds: tx, rfds: rx, pfds: both), made as the connection comes up
     * and freed with it; all NULL with SEAL_NONE */
    int seal_mode;
    struct seal *seal_tx[RDV_MAX_NODES], *seal_rx[RDV_MAX_NODES];
    struct seal *pseal_tx[RDV_MAX_NODES], *pseal_rx[RDV_MAX_NODES];
    struct tcp_io seal_io;       /* the collectives' way through them (tcp.h) */
    uint8_t need[RDV_MAX_NODES]; /* scratch of whoever holds coll_lock: an op's pods */
    /* events for the engine, preallocated so that none is ever lost to a failed
     * allocation (a lost "formed" would hold GPU ops until their deadline); guarded by
     * the net's out_lock */
    struct net_event evpool[EV_POOL];
    struct net_event *evfree;
    /* sends and receives */
    struct p2p_out out[RDV_MAX_NODES];
    struct p2p_in in[RDV_MAX_NODES];
    struct net_task *posted_head, *posted_tail; /* receives waiting for their message */
    /* an end the engine's turn at the sends and receives met (p2p_engine.c), left for the
     * net thread's next turn (p2p_settle): the code, the pod whose connection broke (-1:
     * none), and whether the queued collectives finish first */
    struct {
        int set, code, lost, later;
        char why[160];
    } p2p_def;
    struct net_task *cts_head, *cts_tail;      /* ... told clear to send: for its DATA */
    struct unexpected *unx_head, *unx_tail;    /* messages waiting for their receive */
    size_t unx_bytes, unx_from[RDV_MAX_NODES]; /* what they cost, in all and by peer */
    uint32_t unx_n, unx_n_from[RDV_MAX_NODES]; /* ... and how many there are */
    _Atomic size_t unx_pub;                    /* unx_bytes, for /metrics to read */
    void *keep[P2P_KEEP];                      /* their buffers, kept (p2p_keep.c) */
    size_t keep_cap[P2P_KEEP];
    /* collectives */
    struct net_task *q_head, *q_tail;
    int q_p2p; /* sends and receives queued since post_queued_p2p last looked (or more) */
    uint64_t ops_done;
    struct tcp_scratch scratch; /* the TCP backend's, kept between ops */
    struct tcp_acks *acks;      /* ... and the acks broadcast roots are owed (tcp.h) */
    struct tcp_stash *stash;    /* ... and what was read ahead of each pod (groups of up to
                                 * TCP_EAGER_ALL pods; else NULL), dropped with the connections */
    struct tcp_tune *tune;      /* ... and the spin each op class waits with (tcp.h) */
    /* how long to spin for each pod's bytes before sleeping in poll (spin.h), learnt
     * by whoever holds coll_lock */
    struct spin_adapt spin[RDV_MAX_NODES];
};

struct pending_conn {
    int fd;
    size_t got;
    struct data_hello hello;
    uint8_t nonce[SEC_NONCE_BYTES]; /* the challenge we sent */
    struct in_addr from;
    int64_t deadline;
};

struct net {
    const struct config *cfg;
    const struct net_epoch_calls *epoch; /* net_epoch.c's, for the files below it */
    pthread_t thread;
    int started;
    _Atomic int stop;
    void *zctx, *router, *dealer;
    int lfd;
    char data_addr[RDV_ADDR_MAX];
    int hb_ms;              /* the shortest heartbeat_ms of the groups (sockets' keepalive) */
    int cc_warned;          /* node.tcp_congestion could not be set (logged once) */
    char uid[RDV_NAME_MAX]; /* node.uid, else a random id of this process: JOIN's identity */
    struct rdv_place place; /* where this pod runs, for JOIN (net_place) */
    struct ngroup **groups; /* by cfg group index; NULL for one-pod groups */
    int ngroups;
    _Atomic uint64_t order; /* the last net_task.order given */
    /* engine -> net, guarded by in_lock */
    pthread_mutex_t in_lock;
    struct net_task *in_head, *in_tail;
    int in_efd;
    _Atomic int in_pending; /* cheap look for the spin loop */
    struct spin_adapt idle; /* the net thread's: how long to look for the next op */
    int64_t spin_cap;       /* ... at most (0 on one CPU) */
    struct spin_gate *gate; /* the agent's (spin.h): whether spins may yield */
    /* net -> engine, guarded by out_lock */
    pthread_mutex_t out_lock;
    struct net_task *done_head, *done_tail;
    struct net_event *ev_head, *ev_tail;
    int out_efd;
    _Atomic int results;
    _Atomic int sleeping; /* the net thread may be asleep in zmq_poll */
    /* sends and receives the net holds (queued, posted, waiting for an ack): while any,
     * the engine's spin reads their sockets (net_p2p_watch) */
    _Atomic int p2p_live;
    /* held by the net thread while it works (not while it waits or spins), and by the
     * engine while it runs a tiny op: whoever holds it owns the groups' connections */
    pthread_mutex_t coll_lock;
    int64_t inline_ns, inline_n; /* coll_lock */
    uint64_t lease_next;         /* coll_lock: the last lease's id */
    /* net_engine_nap's; and the net thread's knock, readable while it waits for
     * coll_lock: an op asleep on the engine hands itself over then */
    int engine_fd, knock_efd;
    net_nap_fn nap;
    void *nap_ctx;
    struct pending_conn pend[MAX_PENDING_ACCEPTS];
    int npend;
    net_commid_fn commid;   /* NCCL groups: the backend makes each epoch's id ... */
    struct net_commid *ids; /* ... on this thread, for the groups we coordinate */
    struct sec_keys keys;
    void *zap; /* coordinator with keys: the ZAP handler */
    struct log_limit lim_hello, lim_frame, lim_reject;
    int seal_ciphers; /* what this CPU runs (seal_ciphers) */
    int64_t last_service;
    struct dns_watch *dns;    /* discovery.service, watched on its own thread; NULL: none */
    _Atomic int64_t alive_ns; /* the loop's last turn, for /livez */
    int64_t next_report;      /* net_discovery_tick */
};

/* net_discovery.c: the waiting-for / DNS summary of each group, on change */
void net_discovery_tick(struct net *n, int64_t now);

/* net_queue.c */
void net_return_task(struct net *n, struct net_task *t, int status, const char *why);
/* t, taken by the net (delta 1) or handed back (-1): counted in p2p_live if a send or a
 * receive (net_submit and net_return_task count theirs). */
void net_p2p_held(struct net *n, const struct net_task *t, int delta);
/* A send or a receive (WIRE_OP_SEND, WIRE_OP_RECV). */
int net_task_is_p2p(const struct net_task *t);
/* The net thread, holding coll_lock, in an op's service turn: the sends and receives the
 * engine queued (up to its first group mark, which only the loop's take acts on) moved
 * to their groups' queues, in order, or handed back (an ended engine epoch); the rest
 * stays queued for the loop. */
void net_take_p2p(struct net *n);
/* The sends and receives of the list *head .. *tail (linked by next) up to its first group
 * mark, taken out in their order and returned linked; the rest stays, in its order. */
struct net_task *net_split_p2p(struct net *n, struct net_task **head, struct net_task **tail);
/* Every task of the list *head (linked by next) back with status; the list is left empty
 * (*head and *tail NULL; tail may be NULL). */
void net_return_list(struct net *n, struct net_task **head, struct net_task **tail, int status,
                     const char *why);
void net_post_event(struct net *n, struct ngroup *g, int broken, int code, const char *why);
void net_fail_queue(struct net *n, struct ngroup *g, int code, const char *why);

/* net_epoch.c */
int net_epoch_open(struct net *n, char *why, size_t whylen); /* the ZeroMQ sockets */
void net_epoch_close(struct net *n);
void net_epoch_group_init(struct net *n, struct ngroup *g);
void net_epoch_drain(struct net *n); /* frames in, to the groups' state machines */
/* End g's epoch here now: close its connections, fail its ops with code, tell the
 * engine (unless from_engine) and, with tell, the other pods. */
void net_epoch_end(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                   int tell);
/* Another pod ends the epoch: ops all pods hold may finish first (abort_pending). */
void net_epoch_end_later(struct net *n, struct ngroup *g, int code, const char *why, int tell);
/* The epoch was ending while ops ran (abort_pending): end it now. */
void net_epoch_end_finish(struct net *n, struct ngroup *g);
/* An op of g failed here with code: the epoch ends, and the others are told why. */
void net_epoch_op_failed(struct net *n, struct ngroup *g, int code, const char *why);
/* The data connections are up: tell the state machine and the engine. */
void net_epoch_formed(struct net *n, struct ngroup *g);
/* A child's ask from the engine (NET_TASK_CHILD), and the asks' timer: sent once the
 * group is formed, again every heartbeat, failed at their deadline. */
void net_epoch_child_ask(struct net *n, struct ngroup *g, struct net_task *t);
void net_epoch_child_timers(struct net *n, struct ngroup *g, int64_t now);
/* The three above as dataconn.c and p2p.c reach them: through struct net's epoch
 * (net_setup.c sets it), never by name, as they sit below net_epoch.c. */
struct net_epoch_calls {
    void (*end)(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                int tell);
    void (*end_later)(struct net *n, struct ngroup *g, int code, const char *why, int tell);
    void (*formed)(struct net *n, struct ngroup *g);
};
extern const struct net_epoch_calls net_epoch_calls;

/* dataconn.c */
int dataconn_bind(struct net *n, char *why, size_t whylen);
/* Start our connections of the epoch just committed; -1 with why if one cannot start. */
int dataconn_open(struct net *n, struct ngroup *g, char *why, size_t whylen);
/* The pairs of need (by node index) are up: 1. Else 0, and the ones we open (to lower
 * indexes) are on their way; the others are the peers' to open (an op needs the same
 * pair on both sides). A connection that cannot even start ends the epoch. */
int dataconn_need(struct net *n, struct ngroup *g, const uint8_t *need);
int dataconn_pairs(const struct ngroup *g);

/* net.c: the net thread's loop (net_setup.c starts it). */
void *net_main(void *arg);
/* Which of g's connections are not up yet, and where each of ours stands (for the log
 * when the formation deadline passes). */
void dataconn_describe(const struct ngroup *g, char *out,
                       size_t cap); /* pairs up, for the logs and the bench */
void dataconn_progress_outgoing(struct net *n, struct ngroup *g);
void dataconn_accept(struct net *n);
void dataconn_progress_pending(struct net *n);
/* The bytes of a collective connection with node peer through its seal (g's
 * seal_io, tcp.h's tcp_io), and of the send/recv connection: sealed with
 * security.data, plain without. */
ssize_t dataconn_seal_send(void *g, int peer, int fd, const struct iovec *v, int nv);
ssize_t dataconn_seal_recv(void *g, int peer, int fd, const struct iovec *v, int nv);
ssize_t dataconn_p2p_send(struct ngroup *g, int peer, const struct iovec *v, int nv);
ssize_t dataconn_p2p_recv(struct ngroup *g, int peer, void *buf, size_t len);
/* The seals of a connection just up (ours as opener or not, its cipher, both nonces of
 * its handshake): 0, or -1 out of memory; and those of node i's connections, freed. */
int dataconn_seal_up(struct ngroup *g, int ch, int peer, int opener, int cipher,
                     const uint8_t chal[SEC_NONCE_BYTES], const uint8_t hello[SEC_NONCE_BYTES]);
void dataconn_seals_free(struct ngroup *g, int i);
void dataconn_close(struct ngroup *g);
void dataconn_bury(struct ngroup *g); /* dataconn_close, a heartbeat later */
void dataconn_close_grave(struct ngroup *g);
void dataconn_free(struct net *n);

/* net_queue.c: set while the engine thread works the sends and receives (p2p_engine.c):
 * an end they meet waits for the net thread (p2p_settle), and a finished one wakes no
 * eventfd (the engine looks at the results next) */
extern _Thread_local int net_engine_turn;

/* p2p.c */
void p2p_post(struct net *n, struct ngroup *g, struct net_task *t);
void p2p_progress(struct net *n, struct ngroup *g);
/* Read what pod peer sent and write what waits for it, as far as the socket allows. */
void p2p_peer(struct net *n, struct ngroup *g, int peer);
/* Act on the end an engine's turn left (p2p_def): net thread. */
void p2p_settle(struct net *n, struct ngroup *g);
void p2p_reset(struct net *n, struct ngroup *g, int code, const char *why);
int64_t p2p_oldest_deadline(const struct ngroup *g);
/* Hand the engine back the receives from any rank it paired in the pod (before a look at
 * the deadlines: theirs no longer count). */
void p2p_purge(struct net *n, struct ngroup *g);
void p2p_free(struct ngroup *g);

/* p2p_keep.c: an early message's buffer of at least bytes (its size in *cap), and back */
void *p2p_keep_take(struct ngroup *g, size_t bytes, size_t *cap);
void p2p_keep_give(struct ngroup *g, void *p, size_t cap);
void p2p_keep_free(struct ngroup *g);

#endif
