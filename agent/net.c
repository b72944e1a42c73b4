/*
 * net.c: the net thread. It owns the ZeroMQ sockets of the rendezvous, the data-plane
 * listener and connections, and the queue of ops from the engine. One loop: wait on
 * the sockets and the engine's doorbell, run the rendezvous state machines, set up
 * the connections of a freshly committed epoch, and run ready ops one at a time per
 * group (backends/tcp.c), servicing the rendezvous while an op's bytes move.
 *
 * Rendezvous (DESIGN.md section 6): node 0 is the coordinator and binds a ROUTER;
 * the others connect a DEALER and send JOIN until they get COMMIT. When every index
 * is present the coordinator commits epoch = max(seen) + 1 with the member table.
 * Heartbeats go both ways; silence for 3 intervals, a broken data connection, an op
 * past its deadline, a mismatch, or a member that rejoins end the epoch with ABORT,
 * and everybody joins again.
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <sodium.h>
#include <zmq.h>

#include "backends/tcp.h"
#include "coll/coll.h"
#include "gpu.h"
#include "log.h"
#include "rdv_wire.h"
#include "security.h"
#include "wire.h"
#include "util.h"

#define ZMQ_ID_MAX 256
#define MAX_PENDING_ACCEPTS 256
#define PENDING_HELLO_NS (3000 * NS_PER_MS)   /* a connection must say who it is this fast */
#define PENDING_FUTURE_NS (10000 * NS_PER_MS) /* a proven-looking hello may wait for its epoch */
/* Messages that arrive before their receive is posted are copied into memory of ours only
 * while small and within these bounds; any other waits in the sender's socket (TCP flow
 * control holds the sender back) until its receive is posted, and is then read straight
 * into the receive's buffer. A peer can make the agent hold at most this much. */
#define UNX_SMALL (64u << 10)
#define UNX_PEER_MAX (4u << 20)
#define UNX_GROUP_MAX (16u << 20)
/* zmq_poll items: send/recv connections, outgoing set-ups, pending accepts, 4 more */
#define ITEMS_MAX (256 + DATA_CH_COUNT * RDV_MAX_NODES + MAX_PENDING_ACCEPTS + 4)
#define EV_POOL 16 /* events a group may have waiting for the engine before malloc */
#define JOIN_BACKOFF_MIN_NS (50 * NS_PER_MS)
#define JOIN_BACKOFF_MAX_NS (2000 * NS_PER_MS)
#define NET_SPIN_NS 200000LL     /* keep looking for ops this long after the last one */
#define INLINE_BUDGET_NS 50000LL /* the engine gives a tiny op this long, then hands it over */

struct coord_peer {
    int present;
    unsigned char id[ZMQ_ID_MAX];
    size_t idlen;
    int64_t last_heard;
    struct rdv_join join;
};

/* Sends to one pod: a FIFO, the head partly written. */
struct p2p_out {
    struct net_task *head, *tail;
    size_t done; /* bytes of header + payload of head written */
    struct data_op_hdr hdr;
    /* the receiver's word on each message: a send completes when its receive has
     * taken it (as within a pod), with MISMATCH when the receive disagreed */
    struct net_task *wait_head, *wait_tail; /* sent, waiting for their acks */
    struct data_op_hdr *acks; /* acks to write, in order; the first acks_done bytes in */
    size_t nacks, capacks, acks_done;
};

/* A message that arrived before its receive was posted. */
struct unexpected {
    struct unexpected *next;
    struct data_op_hdr hdr;
    void *data;
    int from; /* the pod it came from (for the per-peer bound) */
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

struct ngroup {
    const struct group_config *cfg;
    int index; /* in cfg->groups */
    int nodes, me, nlocal;
    uint64_t config_hash, name_hash;
    /* epoch state */
    uint32_t epoch; /* committed epoch, or the last one (0: never) */
    int committed, ready;
    int awaiting_mark;        /* aborted by the net: hold ops until the engine's mark */
    int abort_pending;        /* the epoch is ending: finish the ops all pods have, then abort */
    struct net_task *running; /* the op tcp_run is moving, off the queue */
    /* tiny ops the engine runs itself (net_inline) */
    struct tcp_tiny *tiny;
    struct net_task *handoff; /* started by the engine, to be finished here */
    int inline_abort;         /* the engine's tiny op failed: end the epoch */
    char inline_why[160];
    int abort_code;
    char abort_why[RDV_MSG_MAX];
    uint32_t floor; /* ops of engine epochs below this fail */
    int gpu;        /* the group runs on NCCL: epochs carry a communicator id */
    int has_commid;
    uint8_t commid[RDV_COMMID_BYTES];
    uint8_t secret[RDV_SECRET_BYTES]; /* the committed epoch's data-plane secret */
    int64_t join_backoff;             /* members: wait before the next JOIN after an abort */
    /* data connections of an epoch that ended in a mismatch, closed at grave_until: a pod
     * still reading from us then fails through the ABORT (MISMATCH), not on a closed
     * socket (PEER_LOST) */
    /* our connections of the committed epoch still being set up (connect, then the
     * peer's challenge), moved on by progress_outgoing from the poll loop: nothing
     * waits for a peer, so heartbeats and other groups' ops go on meanwhile */
    struct outgoing {
        int fd, peer, ch;
        int connected; /* the TCP connect has completed */
        size_t got;    /* challenge bytes read */
        struct data_challenge chal;
    } og[DATA_CH_COUNT * RDV_MAX_NODES];
    int nog;
    int grave[DATA_CH_COUNT * RDV_MAX_NODES];
    int ngrave;
    int64_t grave_until;
    struct rdv_member members[RDV_MAX_NODES];
    /* events for the engine, preallocated so that none is ever lost to a failed
     * allocation (a lost "formed" would hold GPU ops until their deadline); guarded by
     * the net's out_lock */
    struct net_event evpool[EV_POOL];
    struct net_event *evfree;
    int fds[RDV_MAX_NODES];  /* collectives, in lockstep: our bytes to node i */
    int rfds[RDV_MAX_NODES]; /* collectives: node i's bytes to us */
    int pfds[RDV_MAX_NODES]; /* sends and receives, framed */
    struct p2p_out out[RDV_MAX_NODES];
    struct p2p_in in[RDV_MAX_NODES];
    struct net_task *posted_head, *posted_tail; /* receives waiting for their message */
    struct unexpected *unx_head, *unx_tail;     /* messages waiting for their receive */
    size_t unx_bytes, unx_from[RDV_MAX_NODES];  /* what they hold, in all and by peer */
    int64_t form_deadline;
    int64_t next_join, next_hb, coord_heard;
    char last_reject[RDV_MSG_MAX];
    /* coordinator */
    struct coord_peer peers[RDV_MAX_NODES];
    /* ops */
    struct net_task *q_head, *q_tail;
    uint64_t ops_done;
    void *scratch[2];
    size_t scratch_cap[2];
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
    pthread_t thread;
    int started;
    _Atomic int stop;
    void *zctx, *router, *dealer;
    int lfd;
    char data_addr[RDV_ADDR_MAX];
    struct ngroup **groups; /* by cfg group index; NULL for one-pod groups */
    int ngroups;
    /* engine -> net */
    pthread_mutex_t in_lock;
    struct net_task *in_head, *in_tail;
    int in_efd;
    _Atomic int in_pending; /* cheap look for the spin loop */
    /* net -> engine */
    pthread_mutex_t out_lock;
    struct net_task *done_head, *done_tail;
    struct net_event *ev_head, *ev_tail;
    int out_efd;
    _Atomic int results;
    _Atomic int sleeping; /* the net thread may be asleep in zmq_poll */
    /* held by the net thread while it works (not while it waits or spins), and by the
     * engine while it runs a tiny op: whoever holds it owns the groups' connections */
    pthread_mutex_t coll_lock;
    int64_t inline_ns, inline_n;
    struct pending_conn pend[MAX_PENDING_ACCEPTS];
    int npend;
    struct sec_keys keys;
    void *zap; /* coordinator with keys: the ZAP handler */
    struct log_limit lim_hello, lim_claim, lim_frame, lim_reject;
    int64_t last_service;
};

/* ---- queues -------------------------------------------------------------------- */

void net_submit(struct net *n, struct net_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&n->in_lock);
    if (n->in_tail)
        n->in_tail->next = t;
    else
        n->in_head = t;
    n->in_tail = t;
    pthread_mutex_unlock(&n->in_lock);
    atomic_store_explicit(&n->in_pending, 1, memory_order_release);
    /* the full fence pairs with the net thread's: it either sees in_pending or is
     * announced asleep, and then gets the doorbell */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&n->sleeping, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t w = write(n->in_efd, &one, sizeof(one));
        (void)w;
    }
}

int net_notify_fd(const struct net *n)
{
    return n->out_efd;
}

int net_has_results(struct net *n)
{
    return atomic_load_explicit(&n->results, memory_order_acquire);
}

void net_collect(struct net *n, struct net_task **done, struct net_event **events)
{
    pthread_mutex_lock(&n->out_lock);
    *done = n->done_head;
    *events = n->ev_head;
    n->done_head = n->done_tail = NULL;
    n->ev_head = n->ev_tail = NULL;
    atomic_store_explicit(&n->results, 0, memory_order_release);
    pthread_mutex_unlock(&n->out_lock);
}

static void wake_engine(struct net *n)
{
    atomic_store_explicit(&n->results, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(n->out_efd, &one, sizeof(one));
    (void)w;
}

/* Hand t back to the engine with status and, for a failure, the reason (NULL: none). */
static void return_task_why(struct net *n, struct net_task *t, int status, const char *why)
{
    t->status = status;
    t->why[0] = '\0';
    if (status != COLL_OK && why) snprintf(t->why, sizeof(t->why), "%s", why);
    t->next = NULL;
    pthread_mutex_lock(&n->out_lock);
    if (n->done_tail)
        n->done_tail->next = t;
    else
        n->done_head = t;
    n->done_tail = t;
    pthread_mutex_unlock(&n->out_lock);
    wake_engine(n);
}

static void return_task(struct net *n, struct net_task *t, int status)
{
    return_task_why(n, t, status, NULL);
}

void net_event_release(struct net *n, struct net_event *e)
{
    if (e->heap) {
        free(e);
        return;
    }
    struct ngroup *g = n->groups[e->group];
    pthread_mutex_lock(&n->out_lock);
    e->next = g->evfree;
    g->evfree = e;
    pthread_mutex_unlock(&n->out_lock);
}

static void post_event(struct net *n, struct ngroup *g, int broken, int code, const char *why)
{
    pthread_mutex_lock(&n->out_lock);
    struct net_event *e = g->evfree;
    if (e) g->evfree = e->next;
    pthread_mutex_unlock(&n->out_lock);
    if (e) {
        memset(e, 0, sizeof(*e));
    } else if ((e = calloc(1, sizeof(*e))) != NULL) {
        e->heap = 1; /* the engine has not collected EV_POOL events: rare */
    } else {
        log_msg(LOG_ERROR, "net.event_lost", "group=%s broken=%d", g->cfg->name, broken);
        return;
    }
    e->group = g->index;
    e->broken = broken;
    e->code = code;
    e->epoch = g->epoch;
    snprintf(e->why, sizeof(e->why), "%s", why);
    if (!broken && g->has_commid) {
        e->has_commid = 1;
        memcpy(e->commid, g->commid, sizeof(e->commid));
    }
    pthread_mutex_lock(&n->out_lock);
    if (n->ev_tail)
        n->ev_tail->next = e;
    else
        n->ev_head = e;
    n->ev_tail = e;
    pthread_mutex_unlock(&n->out_lock);
    wake_engine(n);
}

/* ---- epochs ------------------------------------------------------------------------ */

static void close_grave(struct ngroup *g)
{
    for (int i = 0; i < g->ngrave; i++)
        close(g->grave[i]);
    g->ngrave = 0;
}

/* Like close_data, a heartbeat interval later (see grave). */
static void bury_data(struct ngroup *g)
{
    close_grave(g);
    for (int i = 0; i < g->nog; i++)
        close(g->og[i].fd);
    g->nog = 0;
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        int *f[3] = {&g->fds[i], &g->rfds[i], &g->pfds[i]};
        for (int k = 0; k < 3; k++)
            if (*f[k] >= 0) {
                g->grave[g->ngrave++] = *f[k];
                *f[k] = -1;
            }
    }
    g->grave_until = now_ns() + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
}

static void close_data(struct ngroup *g)
{
    for (int i = 0; i < g->nog; i++)
        close(g->og[i].fd);
    g->nog = 0;
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        if (g->fds[i] >= 0) close(g->fds[i]);
        if (g->rfds[i] >= 0) close(g->rfds[i]);
        if (g->pfds[i] >= 0) close(g->pfds[i]);
        g->fds[i] = g->rfds[i] = g->pfds[i] = -1;
    }
}

/* ---- sends and receives between pods ----------------------------------------------- */

static void ng_abort(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                     int tell_others);

static void unx_free(struct ngroup *g, struct unexpected *u)
{
    size_t bytes = u->hdr.count * coll_dtype_size((coll_dtype)u->hdr.dtype);
    g->unx_bytes -= bytes;
    g->unx_from[u->from] -= bytes;
    free(u->data);
    free(u);
}

/* Fail every send and receive in flight and forget half-read messages. */
static void p2p_reset(struct net *n, struct ngroup *g, int code, const char *why)
{
    for (int p = 0; p < RDV_MAX_NODES; p++) {
        struct p2p_out *o = &g->out[p];
        while (o->head) {
            struct net_task *t = o->head;
            o->head = t->next;
            return_task_why(n, t, code, why);
        }
        o->tail = NULL;
        o->done = 0;
        while (o->wait_head) {
            struct net_task *t = o->wait_head;
            o->wait_head = t->next;
            return_task_why(n, t, code, why);
        }
        o->wait_tail = NULL;
        o->nacks = o->acks_done = 0;
        struct p2p_in *in = &g->in[p];
        if (in->task) return_task_why(n, in->task, code, why);
        if (in->unx) unx_free(g, in->unx);
        memset(in, 0, sizeof(*in));
    }
    while (g->posted_head) {
        struct net_task *t = g->posted_head;
        g->posted_head = t->next;
        return_task_why(n, t, code, why);
    }
    g->posted_tail = NULL;
    while (g->unx_head) {
        struct unexpected *u = g->unx_head;
        g->unx_head = u->next;
        unx_free(g, u);
    }
    g->unx_tail = NULL;
}

static int my_rank(const struct ngroup *g, const struct net_task *t)
{
    return g->me * g->nlocal + t->local_slot;
}

/* Does receive t take the message described by h? 1 yes, 0 not for it. */
static int p2p_matches(const struct ngroup *g, const struct net_task *t,
                       const struct data_op_hdr *h)
{
    return h->src_rank == (uint32_t)t->root && h->dst_rank == (uint32_t)my_rank(g, t);
}

static int p2p_agree(const struct net_task *t, const struct data_op_hdr *h)
{
    return h->count == t->count && h->dtype == t->dtype;
}

/* Complete receive t with the message of header h: matched, or a mismatch named. */
static void p2p_write(struct net *n, struct ngroup *g, int peer);
static void p2p_read(struct net *n, struct ngroup *g, int peer);
static void ng_abort(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                     int tell_others);
static void ng_abort_later(struct net *n, struct ngroup *g, int code, const char *why,
                           int tell_others);

/* Complete receive t with the message of header h: matched, or a mismatch named; the
 * sender is told either way (an ack: kind RECV, root = status, the receive's count). */
static void p2p_finish(struct net *n, struct ngroup *g, struct net_task *t,
                       const struct data_op_hdr *h)
{
    char w[160] = "";
    int ok = p2p_agree(t, h);
    if (!ok)
        snprintf(w, sizeof(w), "rank %u sent %llu of %s; the receive on rank %u is for %llu of %s",
                 h->src_rank, (unsigned long long)h->count, coll_dtype_name((coll_dtype)h->dtype),
                 h->dst_rank, (unsigned long long)t->count, coll_dtype_name((coll_dtype)t->dtype));
    struct data_op_hdr ack = {.magic = DATA_MAGIC,
                              .kind = WIRE_OP_RECV,
                              .dtype = t->dtype,
                              .root = ok ? COLL_OK : COLL_ERR_MISMATCH,
                              .src_rank = h->dst_rank,
                              .dst_rank = h->src_rank,
                              .count = t->count};
    return_task_why(n, t, ok ? COLL_OK : COLL_ERR_MISMATCH, w);
    int peer = (int)(h->src_rank / (uint32_t)g->nlocal);
    struct p2p_out *o = &g->out[peer];
    if (o->nacks == o->capacks) {
        size_t cap = o->capacks ? 2 * o->capacks : 16;
        struct data_op_hdr *a = realloc(o->acks, cap * sizeof(*a));
        if (!a) {
            ng_abort(n, g, COLL_ERR_NOMEM, "no memory to acknowledge a message", 0, 1);
            return;
        }
        o->acks = a;
        o->capacks = cap;
    }
    o->acks[o->nacks++] = ack;
    p2p_write(n, g, peer);
}

/* An ack from peer for one of our sends (its header h, checked): the oldest send of
 * that pair waiting for one completes with the receiver's verdict. */
static int p2p_acked(struct net *n, struct ngroup *g, int peer, const struct data_op_hdr *h)
{
    struct p2p_out *o = &g->out[peer];
    struct net_task **pp = &o->wait_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        struct net_task *t = *pp;
        if ((uint32_t)t->root != h->src_rank || (uint32_t)my_rank(g, t) != h->dst_rank) continue;
        *pp = t->next;
        if (o->wait_tail == t) o->wait_tail = prev;
        char w[160] = "";
        int st = h->root == COLL_OK ? COLL_OK : COLL_ERR_MISMATCH;
        if (st != COLL_OK)
            snprintf(
                w, sizeof(w), "rank %u sent %llu of %s; the receive on rank %u is for %llu of %s",
                h->dst_rank, (unsigned long long)t->count, coll_dtype_name((coll_dtype)t->dtype),
                h->src_rank, (unsigned long long)h->count, coll_dtype_name((coll_dtype)h->dtype));
        return_task_why(n, t, st, w);
        return 0;
    }
    return -1;
}

/* The send/recv connection to peer broke: that pod is leaving. Collectives already
 * queued may still complete, so the epoch ends once they have (ng_abort_later). */
static void p2p_lost(struct net *n, struct ngroup *g, int peer, const char *why)
{
    close(g->pfds[peer]);
    g->pfds[peer] = -1;
    ng_abort_later(n, g, COLL_ERR_PEER_LOST, why, 1);
}

static void p2p_post(struct net *n, struct ngroup *g, struct net_task *t)
{
    t->next = NULL;
    if (t->kind == WIRE_OP_SEND) {
        int peer = t->root / g->nlocal;
        struct p2p_out *o = &g->out[peer];
        if (o->tail)
            o->tail->next = t;
        else
            o->head = t;
        o->tail = t;
        p2p_write(n, g, peer);
        return;
    }
    /* a receive: the message may be here already */
    struct unexpected **pp = &g->unx_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        struct unexpected *u = *pp;
        if (!p2p_matches(g, t, &u->hdr)) continue;
        *pp = u->next;
        if (g->unx_tail == u) g->unx_tail = prev;
        int ok = p2p_agree(t, &u->hdr);
        if (ok && t->count)
            memcpy(t->recv[t->local_slot], u->data,
                   t->count * coll_dtype_size((coll_dtype)t->dtype));
        struct data_op_hdr h = u->hdr;
        unx_free(g, u);
        p2p_finish(n, g, t, &h);
        return;
    }
    /* or parked in its sender's socket: read it straight into this receive */
    int from = t->root / g->nlocal;
    struct p2p_in *in = &g->in[from];
    if (in->parked && p2p_matches(g, t, &in->hdr)) {
        in->parked = 0;
        in->task = t;
        in->discard = !p2p_agree(t, &in->hdr);
        p2p_read(n, g, from);
        return;
    }
    if (g->posted_tail)
        g->posted_tail->next = t;
    else
        g->posted_head = t;
    g->posted_tail = t;
}

static void p2p_write(struct net *n, struct ngroup *g, int peer)
{
    struct p2p_out *o = &g->out[peer];
    while (o->done == 0 && o->nacks && g->pfds[peer] >= 0) { /* acks go between messages */
        ssize_t r = write(g->pfds[peer], (char *)&o->acks[0] + o->acks_done,
                          sizeof(o->acks[0]) - o->acks_done);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (r < 0) {
            char why[128];
            snprintf(why, sizeof(why), "ack to node %d: %s", peer, strerror(errno));
            p2p_lost(n, g, peer, why);
            return;
        }
        o->acks_done += (size_t)r;
        if (o->acks_done < sizeof(o->acks[0])) return;
        o->acks_done = 0;
        memmove(o->acks, o->acks + 1, (o->nacks - 1) * sizeof(*o->acks));
        o->nacks--;
    }
    while (o->head && g->pfds[peer] >= 0) {
        struct net_task *t = o->head;
        size_t bytes = t->count * coll_dtype_size((coll_dtype)t->dtype);
        if (o->done == 0)
            o->hdr = (struct data_op_hdr){.magic = DATA_MAGIC,
                                          .kind = WIRE_OP_SEND,
                                          .dtype = t->dtype,
                                          .src_rank = (uint32_t)my_rank(g, t),
                                          .dst_rank = (uint32_t)t->root,
                                          .count = t->count};
        struct iovec v[2];
        int nv = 0;
        if (o->done < sizeof(o->hdr))
            v[nv++] = (struct iovec){(char *)&o->hdr + o->done, sizeof(o->hdr) - o->done};
        size_t pdone = o->done > sizeof(o->hdr) ? o->done - sizeof(o->hdr) : 0;
        if (bytes > pdone)
            v[nv++] = (struct iovec){(char *)t->send[t->local_slot] + pdone, bytes - pdone};
        ssize_t r = nv ? writev(g->pfds[peer], v, nv) : 0;
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (r < 0) {
            char why[128];
            snprintf(why, sizeof(why), "send to node %d: %s", peer, strerror(errno));
            p2p_lost(n, g, peer, why);
            return;
        }
        o->done += (size_t)r;
        if (o->done == sizeof(o->hdr) + bytes) {
            o->head = t->next;
            if (!o->head) o->tail = NULL;
            o->done = 0;
            t->next = NULL; /* now its receive's ack completes it */
            if (o->wait_tail)
                o->wait_tail->next = t;
            else
                o->wait_head = t;
            o->wait_tail = t;
            if (o->nacks) {
                p2p_write(n, g, peer); /* acks queued meanwhile */
                return;
            }
        }
    }
}

static void p2p_read(struct net *n, struct ngroup *g, int peer)
{
    struct p2p_in *in = &g->in[peer];
    char sink[4096];
    for (;;) {
        if (g->pfds[peer] < 0 || in->parked) return;
        void *dst;
        size_t want;
        if (in->hgot < sizeof(in->hdr)) {
            dst = (char *)&in->hdr + in->hgot;
            want = sizeof(in->hdr) - in->hgot;
        } else {
            if (in->discard)
                dst = sink;
            else if (in->task)
                dst = (char *)in->task->recv[in->task->local_slot] + in->pgot;
            else
                dst = (char *)in->unx->data + in->pgot;
            want = in->plen - in->pgot;
            if (in->discard && want > sizeof(sink)) want = sizeof(sink);
        }
        ssize_t r = want ? read(g->pfds[peer], dst, want) : 0;
        if (want && r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (want && r <= 0) {
            char why[128];
            snprintf(why, sizeof(why), "node %d closed its send/recv connection", peer);
            p2p_lost(n, g, peer, why);
            return;
        }
        if (in->hgot < sizeof(in->hdr)) {
            in->hgot += (size_t)r;
            if (in->hgot < sizeof(in->hdr)) continue;
            struct data_op_hdr *h = &in->hdr;
            uint64_t plen;
            char hw[128];
            if (data_send_hdr_check(h, (uint32_t)g->nlocal, (uint32_t)peer, (uint32_t)g->me, &plen,
                                    hw, sizeof(hw)) < 0) {
                char why[200];
                snprintf(why, sizeof(why), "bad send header from node %d: %s", peer, hw);
                ng_abort(n, g, COLL_ERR_PROTOCOL, why, 0, 1);
                return;
            }
            in->plen = (size_t)plen;
            if (h->kind == WIRE_OP_RECV) { /* an ack: no payload */
                struct data_op_hdr ack = *h;
                memset(in, 0, sizeof(*in));
                if (p2p_acked(n, g, peer, &ack) < 0) {
                    char why[160];
                    snprintf(why, sizeof(why), "node %d acknowledged a send it was never sent",
                             peer);
                    ng_abort(n, g, COLL_ERR_PROTOCOL, why, 0, 1);
                    return;
                }
                continue;
            }
            in->pgot = 0;
            struct net_task **pp = &g->posted_head, *prev = NULL;
            for (; *pp; prev = *pp, pp = &(*pp)->next) {
                if (!p2p_matches(g, *pp, h)) continue;
                in->task = *pp;
                *pp = in->task->next;
                if (g->posted_tail == in->task) g->posted_tail = prev;
                in->discard = !p2p_agree(in->task, h);
                break;
            }
            if (!in->task) {
                if (in->plen > UNX_SMALL || g->unx_from[peer] + in->plen > UNX_PEER_MAX ||
                    g->unx_bytes + in->plen > UNX_GROUP_MAX) {
                    in->parked = 1; /* read on when its receive is posted */
                    return;
                }
                in->unx = calloc(1, sizeof(*in->unx));
                if (in->unx) in->unx->data = malloc(in->plen ? in->plen : 1);
                if (!in->unx || !in->unx->data) {
                    if (in->unx) free(in->unx);
                    in->unx = NULL;
                    ng_abort(n, g, COLL_ERR_NOMEM, "no memory for an early message", 0, 1);
                    return;
                }
                in->unx->hdr = *h;
                in->unx->from = peer;
                g->unx_bytes += in->plen;
                g->unx_from[peer] += in->plen;
            }
        } else {
            in->pgot += (size_t)r;
        }
        if (in->pgot < in->plen) continue;
        /* a whole message */
        if (in->task) {
            p2p_finish(n, g, in->task, &in->hdr);
        } else {
            /* its receive may have been posted while the bytes were arriving */
            struct unexpected *u = in->unx;
            struct net_task **pp = &g->posted_head, *prev = NULL, *match = NULL;
            for (; *pp; prev = *pp, pp = &(*pp)->next) {
                if (!p2p_matches(g, *pp, &u->hdr)) continue;
                match = *pp;
                *pp = match->next;
                if (g->posted_tail == match) g->posted_tail = prev;
                break;
            }
            if (match) {
                if (p2p_agree(match, &u->hdr) && match->count)
                    memcpy(match->recv[match->local_slot], u->data, in->plen);
                struct data_op_hdr h = u->hdr;
                unx_free(g, u);
                p2p_finish(n, g, match, &h);
            } else {
                u->next = NULL;
                if (g->unx_tail)
                    g->unx_tail->next = u;
                else
                    g->unx_head = u;
                g->unx_tail = u;
            }
        }
        memset(in, 0, sizeof(*in));
    }
}

/* Move every send and receive of g as far as the sockets allow, without blocking. */
static void p2p_progress(struct net *n, struct ngroup *g)
{
    if (!g->ready) return;
    for (int p = 0; p < g->nodes; p++) {
        if (p == g->me) continue;
        p2p_read(n, g, p);
        if (!g->ready) return;
        p2p_write(n, g, p);
        if (!g->ready) return;
    }
}

static void fail_queue(struct net *n, struct ngroup *g, int code, const char *why)
{
    if (g->handoff) {
        return_task_why(n, g->handoff, code, why);
        g->handoff = NULL;
    }
    while (g->q_head) {
        struct net_task *t = g->q_head;
        g->q_head = t->next;
        return_task_why(n, t, code, why);
    }
    g->q_tail = NULL;
}

static void send_rdv(struct net *n, const unsigned char *id, size_t idlen, union rdv_msg *m)
{
    size_t len = rdv_size(m);
    m->h.len = (uint32_t)len;
    if (id) {
        if (zmq_send(n->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
        zmq_send(n->router, m, len, ZMQ_DONTWAIT);
    } else if (n->dealer) {
        zmq_send(n->dealer, m, len, ZMQ_DONTWAIT);
    }
}

static void send_join(struct net *n, struct ngroup *g)
{
    union rdv_msg m;
    rdv_init(&m, RDV_JOIN, g->cfg->name, 0);
    m.join.config_hash = g->config_hash;
    m.join.nodes = (uint32_t)g->nodes;
    m.join.node_index = (uint32_t)g->me;
    m.join.local_slots = (uint32_t)g->nlocal;
    m.join.last_epoch = g->epoch;
    snprintf(m.join.pod, sizeof(m.join.pod), "%s", n->cfg->node.name);
    snprintf(m.join.data_addr, sizeof(m.join.data_addr), "%s", n->data_addr);
    send_rdv(n, NULL, 0, &m);
    g->next_join = now_ns() + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
}

static void coord_commit(struct net *n, struct ngroup *g);

/* Tell the other pods that this epoch of g is over: the coordinator tells every member,
 * a member tells the coordinator (which tells the rest). */
static void send_abort(struct net *n, struct ngroup *g, int code, const char *why)
{
    union rdv_msg m;
    rdv_init(&m, RDV_ABORT, g->cfg->name, g->epoch);
    m.abort.code = code;
    m.abort.node_index = (uint32_t)g->me;
    snprintf(m.abort.why, sizeof(m.abort.why), "%s", why);
    if (g->me == 0) {
        for (int i = 1; i < g->nodes; i++)
            if (g->peers[i].present) send_rdv(n, g->peers[i].id, g->peers[i].idlen, &m);
    } else {
        send_rdv(n, NULL, 0, &m);
    }
}

/*
 * End the current epoch of g: close its connections, fail its queued ops with code,
 * tell the engine (from_engine: it already knows), tell the other agents, and start
 * joining again.
 */
static void ng_abort(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                     int tell_others)
{
    int had = g->committed, was_ready = g->ready;
    g->abort_pending = 0;
    log_msg(had ? LOG_WARN : LOG_INFO, "rendezvous.abort",
            "group=%s epoch=%u code=\"%s\" reason=\"%s\"", g->cfg->name, g->epoch,
            coll_strerror((coll_err)code), why);
    if (code == COLL_ERR_MISMATCH && had)
        bury_data(g);
    else
        close_data(g);
    g->committed = g->ready = 0;
    char w[160];
    snprintf(w, sizeof(w), "epoch %u ended: %s", g->epoch, why);
    fail_queue(n, g, code, w);
    p2p_reset(n, g, code, w);
    if (!from_engine) {
        g->awaiting_mark = 1;
        post_event(n, g, 1, code, why);
    }
    if (tell_others) send_abort(n, g, code, why);
    if (g->me == 0) {
        /* every member must join again; we are present at once */
        for (int i = 1; i < g->nodes; i++)
            g->peers[i].present = 0;
    } else if (had && was_ready) {
        g->join_backoff = 0; /* a formed epoch ended: join again at once */
        send_join(n, g);
    } else {
        /* the epoch never formed (or we were refused): back off with jitter, so that a
         * group that cannot form does not commit and abort in a tight loop */
        g->join_backoff = g->join_backoff ? g->join_backoff * 2 : JOIN_BACKOFF_MIN_NS;
        if (g->join_backoff > JOIN_BACKOFF_MAX_NS) g->join_backoff = JOIN_BACKOFF_MAX_NS;
        uint32_t r;
        sec_random(&r, sizeof(r));
        g->next_join = now_ns() + g->join_backoff / 2 +
                       (int64_t)(r % (uint32_t)(g->join_backoff / NS_PER_MS + 1)) * NS_PER_MS;
    }
}

/*
 * The epoch ends because of another pod (it left, went silent, or said ABORT). Ops
 * already queued here may still complete: a pod that finished an op and then left has
 * delivered its bytes before closing. So tell the others now, but run what is queued
 * until it completes or fails on its sockets, and only then abort (ng_abort_finish).
 */
static void ng_abort_later(struct net *n, struct ngroup *g, int code, const char *why,
                           int tell_others)
{
    if (g->abort_pending) return;
    if (!g->ready || (!g->q_head && !g->running && !g->handoff)) {
        ng_abort(n, g, code, why, 0, tell_others);
        return;
    }
    if (tell_others) send_abort(n, g, code, why);
    g->abort_pending = 1;
    g->abort_code = code;
    snprintf(g->abort_why, sizeof(g->abort_why), "%s", why);
}

static void ng_abort_finish(struct net *n, struct ngroup *g)
{
    if (!g->abort_pending) return;
    g->abort_pending = 0;
    ng_abort(n, g, g->abort_code, g->abort_why, 0, 0);
}

/* An op of g failed here with code: the epoch ends, and the others are told why. */
static void ng_op_failed(struct net *n, struct ngroup *g, int code, const char *why)
{
    if (g->committed) ng_abort(n, g, code, why, 0, 1);
}

/* A non-blocking connect to addr ("ip:port") from our node.address, the address the
 * member table lists for us and which the peer checks. */
static int connect_to(const char *self, const char *addr, char *why, size_t whylen)
{
    char host[RDV_ADDR_MAX];
    snprintf(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    if (!colon) {
        snprintf(why, whylen, "bad data address '%s'", addr);
        return -1;
    }
    *colon = '\0';
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc) {
        snprintf(why, whylen, "resolving %s: %s", addr, gai_strerror(rc));
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    if (fd >= 0 && inet_pton(AF_INET, self, &src.sin_addr) == 1 &&
        bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0) {
        snprintf(why, whylen, "binding to node.address %s: %s", self, strerror(errno));
        freeaddrinfo(res);
        close(fd);
        return -1;
    }
    if (fd < 0 || (connect(fd, res->ai_addr, res->ai_addrlen) < 0 && errno != EINPROGRESS)) {
        snprintf(why, whylen, "connecting to %s: %s", addr, strerror(errno));
        freeaddrinfo(res);
        if (fd >= 0) close(fd);
        return -1;
    }
    freeaddrinfo(res);
    return fd;
}

static void tune_socket(int fd)
{
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

/* Where the connection of channel ch with node peer goes: opened by us (opener) or
 * by the peer. COLL carries the opener's bytes, COLL_BACK the other side's. */
static int *conn_slot(struct ngroup *g, int ch, int peer, int opener)
{
    if (ch == DATA_CH_P2P) return &g->pfds[peer];
    return (ch == DATA_CH_COLL) == opener ? &g->fds[peer] : &g->rfds[peer];
}

static void check_ready(struct net *n, struct ngroup *g)
{
    (void)n;
    if (!g->committed || g->ready) return;
    for (int i = 0; i < g->nodes; i++)
        if (i != g->me && (g->fds[i] < 0 || g->rfds[i] < 0 || g->pfds[i] < 0)) return;
    g->ready = 1;
    g->join_backoff = 0;
    log_msg(LOG_INFO, "group.formed", "group=%s epoch=%u nodes=%d node=%d", g->cfg->name, g->epoch,
            g->nodes, g->me);
    post_event(n, g, 0, 0, "formed");
}

static void apply_commit(struct net *n, struct ngroup *g, const struct rdv_commit *c)
{
    close_data(g);
    g->epoch = c->h.epoch;
    g->committed = 1;
    g->ready = 0;
    g->ops_done = 0; /* numbers the ops of this epoch, checked in each op's header */
    g->has_commid = c->has_commid != 0;
    memcpy(g->commid, c->commid, sizeof(g->commid));
    memcpy(g->secret, c->secret, sizeof(g->secret));
    memcpy(g->members, c->members, sizeof(struct rdv_member) * (size_t)g->nodes);
    g->form_deadline = now_ns() + (int64_t)g->cfg->join_timeout_ms * NS_PER_MS;
    g->coord_heard = now_ns();
    for (int jc = 0; jc < DATA_CH_COUNT * g->me; jc++) {
        int j = jc / DATA_CH_COUNT, ch = jc % DATA_CH_COUNT;
        char why[160];
        int fd = connect_to(n->cfg->node.address, g->members[j].data_addr, why, sizeof(why));
        if (fd < 0) {
            ng_abort(n, g, COLL_ERR_PEER_LOST, why, 0, 1);
            return;
        }
        tune_socket(fd);
        g->og[g->nog++] = (struct outgoing){.fd = fd, .peer = j, .ch = ch};
    }
    log_msg(LOG_INFO, "rendezvous.commit", "group=%s epoch=%u nodes=%d node=%d", g->cfg->name,
            g->epoch, g->nodes, g->me);
    check_ready(n, g);
}

/* Move our connections of the committed epoch on, without waiting: connected? the
 * peer's challenge in? then the hello that proves the epoch's secret over its nonce,
 * and the connection takes its slot. A failure ends the epoch; one that takes too long
 * is ended by the formation deadline (join_ms, timers). */
static void progress_outgoing(struct net *n, struct ngroup *g)
{
    for (int i = 0; i < g->nog;) {
        struct outgoing *o = &g->og[i];
        const char *step = NULL;
        int err = 0, done = 0;
        char why[160];
        if (!o->connected) {
            struct pollfd p = {.fd = o->fd, .events = POLLOUT};
            if (poll(&p, 1, 0) <= 0) {
                i++; /* still connecting */
                continue;
            }
            socklen_t el = sizeof(err);
            if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) err = errno;
            o->connected = !err;
        }
        if (err) {
            step = "connect";
        } else {
            ssize_t r = read(o->fd, (char *)&o->chal + o->got, sizeof(o->chal) - o->got);
            if (r > 0) o->got += (size_t)r;
            if (r == 0) {
                step = "waiting for its challenge";
                err = ECONNRESET;
            } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
                step = "waiting for its challenge";
                err = errno;
            } else if (o->got == sizeof(o->chal)) {
                struct data_hello h = {.magic = DATA_MAGIC,
                                       .version = RDV_VERSION,
                                       .channel = (uint16_t)o->ch,
                                       .group_hash = g->name_hash,
                                       .epoch = g->epoch,
                                       .from_index = (uint32_t)g->me};
                if (data_challenge_check(&o->chal, why, sizeof(why)) < 0) {
                    step = why;
                    err = EPROTO;
                } else {
                    sec_mac(h.mac, g->secret, o->chal.nonce, &h, DATA_HELLO_SIGNED);
                    /* a fresh socket takes the hello whole */
                    if (write(o->fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
                        step = "hello";
                        err = errno ? errno : EAGAIN;
                    } else {
                        done = 1;
                    }
                }
            }
        }
        if (step) {
            char w[300];
            snprintf(w, sizeof(w), "data connection to node %d (%s): %s: %s", o->peer,
                     g->members[o->peer].data_addr, step, strerror(err));
            ng_abort(n, g, COLL_ERR_PEER_LOST, w, 0, 1); /* closes every og */
            return;
        }
        if (!done) {
            i++;
            continue;
        }
        *conn_slot(g, o->ch, o->peer, 1) = o->fd;
        g->og[i] = g->og[--g->nog];
        check_ready(n, g);
    }
}

/* ---- coordinator ---------------------------------------------------------------------- */

static void coord_commit(struct net *n, struct ngroup *g)
{
    uint32_t e = g->epoch;
    for (int i = 1; i < g->nodes; i++)
        if (g->peers[i].join.last_epoch > e) e = g->peers[i].join.last_epoch;
    union rdv_msg m;
    rdv_init(&m, RDV_COMMIT, g->cfg->name, e + 1);
    m.commit.nodes = (uint32_t)g->nodes;
    sec_random(m.commit.secret, sizeof(m.commit.secret));
    snprintf(m.commit.members[0].pod, RDV_NAME_MAX, "%s", n->cfg->node.name);
    snprintf(m.commit.members[0].data_addr, RDV_ADDR_MAX, "%s", n->data_addr);
    for (int i = 1; i < g->nodes; i++) {
        memcpy(m.commit.members[i].pod, g->peers[i].join.pod, RDV_NAME_MAX);
        memcpy(m.commit.members[i].data_addr, g->peers[i].join.data_addr, RDV_ADDR_MAX);
    }
    if (g->gpu) {
        /* only the coordinator makes the id, once per epoch (as in the seed) */
        char why[160];
        if (gpu_new_commid(m.commit.commid, why, sizeof(why)) == 0)
            m.commit.has_commid = 1;
        else
            log_msg(LOG_ERROR, "rendezvous.commid", "group=%s error=\"%s\"", g->cfg->name, why);
    }
    for (int i = 1; i < g->nodes; i++)
        send_rdv(n, g->peers[i].id, g->peers[i].idlen, &m);
    apply_commit(n, g, &m.commit);
}

static void coord_on_join(struct net *n, const unsigned char *id, size_t idlen,
                          const struct rdv_join *j)
{
    struct ngroup *g = NULL;
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i] && strcmp(n->groups[i]->cfg->name, j->h.group) == 0) g = n->groups[i];
    union rdv_msg r;
    rdv_init(&r, RDV_REJECT, j->h.group, 0);
    if (!g) {
        snprintf(r.reject.why, sizeof(r.reject.why),
                 "no group '%s' spans several pods on the coordinator", j->h.group);
    } else if (j->nodes != (uint32_t)g->nodes) {
        snprintf(r.reject.why, sizeof(r.reject.why),
                 "group '%s': member has world size (members) %u, coordinator has %d", j->h.group,
                 j->nodes, g->nodes);
    } else if (j->config_hash != g->config_hash) {
        /* no hash in the text: it is all a spoofed JOIN would need */
        snprintf(r.reject.why, sizeof(r.reject.why),
                 "group '%s': the member's group settings (backend, members, slots, devices, "
                 "timeouts) differ from the coordinator's",
                 j->h.group);
    } else if (j->node_index == 0) {
        snprintf(r.reject.why, sizeof(r.reject.why),
                 "group '%s': node index 0 is the coordinator itself", j->h.group);
    }
    if (r.reject.why[0]) {
        unsigned long long dropped;
        if (log_limit_pass(&n->lim_reject, &dropped))
            log_msg(LOG_WARN, "rendezvous.reject",
                    "node=%u pod=\"%s\" reason=\"%s\" suppressed=%llu", j->node_index, j->pod,
                    r.reject.why, dropped);
        send_rdv(n, id, idlen, &r);
        return;
    }
    struct coord_peer *p = &g->peers[j->node_index];
    int same = p->present && p->idlen == idlen && memcmp(p->id, id, idlen) == 0;
    if (g->committed && same && j->last_epoch < g->epoch) {
        /* sent before our COMMIT reached it: nothing new */
        p->last_heard = now_ns();
        return;
    }
    if (g->committed) {
        char why[160];
        snprintf(why, sizeof(why), "node %u (%s) joined again", j->node_index, j->pod);
        ng_abort_later(n, g, COLL_ERR_PEER_LOST, why, 1);
    }
    p->present = 1;
    memcpy(p->id, id, idlen);
    p->idlen = idlen;
    p->join = *j;
    p->last_heard = now_ns();
    log_msg(LOG_INFO, "rendezvous.join", "group=%s node=%u pod=\"%s\" data=%s last_epoch=%u",
            g->cfg->name, j->node_index, j->pod, j->data_addr, j->last_epoch);
    if (g->committed) return; /* the old epoch is still draining: commit after it ends */
    for (int i = 1; i < g->nodes; i++)
        if (!g->peers[i].present) return;
    coord_commit(n, g);
}

/* ---- frames ------------------------------------------------------------------------------ */

static struct ngroup *group_named(struct net *n, const char *name)
{
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i] && strcmp(n->groups[i]->cfg->name, name) == 0) return n->groups[i];
    return NULL;
}

static void on_frame(struct net *n, const unsigned char *id, size_t idlen, const void *buf,
                     size_t len)
{
    union rdv_msg m;
    char why[160];
    if (rdv_decode(buf, len, &m, why, sizeof(why)) < 0) {
        unsigned long long dropped;
        if (log_limit_pass(&n->lim_frame, &dropped))
            log_msg(LOG_WARN, "rendezvous.bad_frame",
                    "from=%s bytes=%zu reason=\"%s\" suppressed=%llu",
                    id ? "member" : "coordinator", len, why, dropped);
        return;
    }
    if (id && m.h.type == RDV_JOIN) {
        coord_on_join(n, id, idlen, &m.join);
        return;
    }
    struct ngroup *g = group_named(n, m.h.group);
    if (!g) return;
    int64_t t = now_ns();
    if (id) { /* coordinator side: from a member */
        int from = -1;
        for (int i = 1; i < g->nodes; i++)
            if (g->peers[i].present && g->peers[i].idlen == idlen &&
                memcmp(g->peers[i].id, id, idlen) == 0)
                from = i;
        if (from < 0) return; /* not a member of this group (any more) */
        g->peers[from].last_heard = t;
        if (m.h.type == RDV_ABORT && g->committed && m.h.epoch == g->epoch)
            ng_abort_later(n, g, m.abort.code, m.abort.why, 1);
        return;
    }
    /* member side: from the coordinator */
    g->coord_heard = t;
    switch (m.h.type) {
    case RDV_COMMIT:
        if (m.commit.nodes != (uint32_t)g->nodes) return;
        if (g->committed && m.h.epoch == g->epoch) return;
        if (m.h.epoch <= g->epoch) return; /* an old commit */
        apply_commit(n, g, &m.commit);
        break;
    case RDV_REJECT:
        if (strcmp(g->last_reject, m.reject.why) != 0) {
            log_msg(LOG_ERROR, "rendezvous.rejected", "group=%s reason=\"%s\"", g->cfg->name,
                    m.reject.why);
            snprintf(g->last_reject, sizeof(g->last_reject), "%s", m.reject.why);
        }
        break;
    case RDV_ABORT:
        if (g->committed && m.h.epoch == g->epoch)
            ng_abort_later(n, g, m.abort.code, m.abort.why, 0);
        break;
    default:
        break;
    }
}

static void drain_zmq(struct net *n, void *sock, int is_router)
{
    for (;;) {
        unsigned char id[ZMQ_ID_MAX];
        size_t idlen = 0;
        zmq_msg_t msg;
        if (is_router) {
            int r = zmq_recv(sock, id, sizeof(id), ZMQ_DONTWAIT);
            if (r < 0) return;
            idlen = (size_t)(r > ZMQ_ID_MAX ? ZMQ_ID_MAX : r);
            int more = 0;
            size_t ml = sizeof(more);
            zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
            if (!more) continue; /* an id with no body */
        }
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            return;
        }
        int more = zmq_msg_more(&msg);
        on_frame(n, is_router ? id : NULL, idlen, zmq_msg_data(&msg), zmq_msg_size(&msg));
        zmq_msg_close(&msg);
        while (more) { /* extra frames: drop them */
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0)
                more = 0;
            else
                more = zmq_msg_more(&msg);
            zmq_msg_close(&msg);
        }
    }
}

/* ---- timers ------------------------------------------------------------------------------ */

/* Heartbeats due now; also sent while an op of g runs, however long it takes. */
static void heartbeat(struct net *n, struct ngroup *g, int64_t t)
{
    if (t < g->next_hb) return;
    union rdv_msg m;
    rdv_init(&m, RDV_HEARTBEAT, g->cfg->name, g->epoch);
    if (g->me == 0) {
        for (int i = 1; i < g->nodes; i++)
            if (g->peers[i].present) send_rdv(n, g->peers[i].id, g->peers[i].idlen, &m);
    } else if (g->committed) {
        m.heartbeat.node_index = (uint32_t)g->me;
        send_rdv(n, NULL, 0, &m);
    } else {
        return;
    }
    g->next_hb = t + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
}

static void timers(struct net *n, struct ngroup *g, int64_t t)
{
    int64_t hb = (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
    heartbeat(n, g, t);
    if (g->me == 0) {
        for (int i = 1; i < g->nodes; i++) {
            if (!g->peers[i].present || t - g->peers[i].last_heard < 3 * hb) continue;
            char why[160];
            snprintf(why, sizeof(why), "node %d (%s) silent for %lld ms", i, g->peers[i].join.pod,
                     (long long)((t - g->peers[i].last_heard) / NS_PER_MS));
            g->peers[i].present = 0;
            if (g->committed) ng_abort_later(n, g, COLL_ERR_PEER_LOST, why, 1);
        }
    } else {
        if (!g->committed && t >= g->next_join) send_join(n, g);
        if (g->committed && t - g->coord_heard > 3 * hb)
            ng_abort_later(n, g, COLL_ERR_PEER_LOST, "the coordinator is silent", 0);
    }
    if (g->committed && !g->ready && t > g->form_deadline)
        ng_abort(n, g, COLL_ERR_PEER_LOST, "data connections not up within join_ms", 0, 1);
    /* sends and receives in flight */
    int64_t oldest = INT64_MAX;
    if (g->posted_head) oldest = g->posted_head->deadline_ns;
    for (int p = 0; p < g->nodes; p++) {
        if (g->out[p].head && g->out[p].head->deadline_ns < oldest)
            oldest = g->out[p].head->deadline_ns;
        if (g->out[p].wait_head && g->out[p].wait_head->deadline_ns < oldest)
            oldest = g->out[p].wait_head->deadline_ns;
    }
    if (oldest <= t) {
        char why[160];
        snprintf(why, sizeof(why), "a send or receive found no partner in %d ms",
                 g->cfg->op_timeout_ms);
        ng_abort(n, g, COLL_ERR_TIMEOUT, why, 0, g->committed);
        return;
    }
    /* the oldest queued op bounds every other one's wait */
    if (g->q_head && g->q_head->deadline_ns <= t) {
        char why[160];
        snprintf(why, sizeof(why), "op %llu waited %d ms for the group to form",
                 (unsigned long long)g->q_head->seq, g->cfg->op_timeout_ms);
        ng_abort(n, g, COLL_ERR_TIMEOUT, why, 0, g->committed);
    }
}

/* ---- data-plane accepts ---------------------------------------------------------------- */

/* A stranger's connections must not crowd out a member's: when the table is full the
 * oldest connection that has not even said hello is dropped, then the oldest of all. */
static void evict_pending(struct net *n)
{
    int victim = 0;
    for (int i = 1; i < n->npend; i++) {
        int vi = n->pend[victim].got == sizeof(struct data_hello);
        int ii = n->pend[i].got == sizeof(struct data_hello);
        if (ii < vi || (ii == vi && n->pend[i].deadline < n->pend[victim].deadline)) victim = i;
    }
    close(n->pend[victim].fd);
    n->pend[victim] = n->pend[--n->npend];
}

static void accept_conns(struct net *n)
{
    for (;;) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(n->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (n->npend == MAX_PENDING_ACCEPTS) evict_pending(n);
        tune_socket(fd);
        struct pending_conn *p = &n->pend[n->npend];
        *p = (struct pending_conn){
            .fd = fd, .from = sa.sin_addr, .deadline = now_ns() + PENDING_HELLO_NS};
        struct data_challenge c = {.magic = DATA_MAGIC, .version = RDV_VERSION};
        sec_random(c.nonce, sizeof(c.nonce));
        memcpy(p->nonce, c.nonce, sizeof(p->nonce));
        /* a fresh socket takes 40 bytes without blocking */
        if (write(fd, &c, sizeof(c)) != (ssize_t)sizeof(c)) {
            close(fd);
            continue;
        }
        n->npend++;
    }
}

static void refuse_hello(struct log_limit *lim, const struct pending_conn *p, const char *why)
{
    unsigned long long dropped;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &p->from, ip, sizeof(ip));
    if (log_limit_pass(lim, &dropped))
        log_msg(LOG_WARN, "data.refused",
                "from=%s node=%u channel=%u epoch=%u reason=\"%s\" suppressed=%llu", ip,
                p->hello.from_index, p->hello.channel, p->hello.epoch, why, dropped);
}

static void bad_hello(struct net *n, const struct pending_conn *p, const char *why)
{
    refuse_hello(&n->lim_hello, p, why);
}

/* Whether the connection came from the address the member table lists for node i
 * (names that are not numeric addresses are not compared). */
static int from_member(const struct ngroup *g, int i, struct in_addr from)
{
    char host[RDV_ADDR_MAX];
    snprintf(host, sizeof(host), "%s", g->members[i].data_addr);
    char *colon = strrchr(host, ':');
    if (colon) *colon = '\0';
    struct in_addr want;
    if (inet_pton(AF_INET, host, &want) != 1) return 1;
    return want.s_addr == from.s_addr;
}

/* Pending connection i says it is a connection of an epoch not committed here yet. At
 * most one such claim is kept per source address and claimed connection (group, node,
 * channel): an older one from the same address is closed, so a source cannot hold more
 * than that many pre-connections, whatever it sends. */
static void forget_older_claims(struct net *n, int i)
{
    const struct pending_conn *p = &n->pend[i];
    for (int j = 0; j < n->npend; j++) {
        struct pending_conn *q = &n->pend[j];
        if (j == i || q->got != sizeof(q->hello) || q->from.s_addr != p->from.s_addr ||
            q->hello.group_hash != p->hello.group_hash ||
            q->hello.from_index != p->hello.from_index || q->hello.channel != p->hello.channel ||
            q->deadline > p->deadline)
            continue;
        /* q is older: the newer claim wins */
        /* its own rate limit: a claim flood must not hide the refusals of forgeries */
        refuse_hello(&n->lim_claim, q,
                     "a newer hello for the same connection came from the same address");
        close(q->fd);
        q->fd = -1; /* removed by progress_pending's next look at it */
    }
}

/*
 * Hellos of accepted connections. One proven for the committed epoch (mac over our
 * nonce with the epoch's secret, a member's index, from that member's address, a free
 * slot) takes its slot; one for an epoch not committed here yet waits (bounded: the
 * table, PENDING_FUTURE_NS) and is checked when the commit arrives; anything else is
 * refused and logged (rate-limited).
 */
static void progress_pending(struct net *n)
{
    int64_t t = now_ns();
    for (int i = 0; i < n->npend;) {
        struct pending_conn *p = &n->pend[i];
        if (p->fd < 0) { /* closed by forget_older_claims */
            n->pend[i] = n->pend[--n->npend];
            continue;
        }
        int drop = 0, keep = 1, fresh = 0;
        if (p->got < sizeof(p->hello)) {
            ssize_t r = read(p->fd, (char *)&p->hello + p->got, sizeof(p->hello) - p->got);
            if (r > 0)
                p->got += (size_t)r;
            else if (r == 0 || (errno != EAGAIN && errno != EINTR))
                drop = 1;
            if (p->got == sizeof(p->hello)) {
                p->deadline = t + PENDING_FUTURE_NS;
                fresh = 1;
            }
        }
        if (!drop && p->got == sizeof(p->hello)) {
            char why[128];
            struct ngroup *g = NULL;
            if (data_hello_check(&p->hello, why, sizeof(why)) < 0) {
                bad_hello(n, p, why);
                drop = 1;
            } else {
                for (int k = 0; k < n->ngroups; k++)
                    if (n->groups[k] && n->groups[k]->name_hash == p->hello.group_hash)
                        g = n->groups[k];
                int from = (int)p->hello.from_index;
                int *slot = NULL;
                if (g && from > g->me && from < g->nodes)
                    slot = conn_slot(g, p->hello.channel, from, 0);
                if (!slot) {
                    bad_hello(n, p, "no such group or node index");
                    drop = 1;
                } else if (p->hello.epoch < g->epoch ||
                           (!g->committed && p->hello.epoch == g->epoch)) {
                    bad_hello(n, p, "an epoch that is over");
                    drop = 1;
                } else if (g->committed && p->hello.epoch == g->epoch) {
                    if (!sec_mac_ok(p->hello.mac, g->secret, p->nonce, &p->hello,
                                    DATA_HELLO_SIGNED)) {
                        bad_hello(n, p, "the hello does not prove the epoch's secret");
                        drop = 1;
                    } else if (!from_member(g, from, p->from)) {
                        bad_hello(n, p, "not from the address the member table lists");
                        drop = 1;
                    } else if (*slot >= 0) {
                        bad_hello(n, p, "that connection is already up");
                        drop = 1;
                    } else {
                        *slot = p->fd;
                        keep = 0;
                        check_ready(n, g);
                    }
                } else if (fresh)
                    forget_older_claims(n, i);
                /* else: for an epoch we have not been told of yet: keep it until then,
                 * one per source address and claimed connection */
            }
        }
        if (!drop && keep && t > p->deadline) drop = 1;
        if (drop) close(p->fd);
        if (drop || !keep) {
            n->pend[i] = n->pend[--n->npend];
            continue;
        }
        i++;
    }
}

/* ---- ops ------------------------------------------------------------------------------------ */

/* Called from inside an op's transfer loop: keep the rendezvous alive, and say whether
 * the op must stop (returns its error code, 0 to go on). */
int net_service(struct net *n, struct ngroup *g, char *why, size_t whylen)
{
    int64_t t = now_ns();
    if (atomic_load(&n->stop)) {
        snprintf(why, whylen, "the agent is stopping");
        return COLL_ERR_SHUTDOWN;
    }
    if (t - n->last_service < 20 * NS_PER_MS) return 0;
    n->last_service = t;
    uint32_t epoch = g->epoch;
    accept_conns(n); /* other groups form meanwhile */
    progress_pending(n);
    if (n->zap) sec_zap_serve(n->zap, &n->keys);
    if (n->router) drain_zmq(n, n->router, 1);
    if (n->dealer) drain_zmq(n, n->dealer, 0);
    for (int i = 0; i < n->ngroups; i++) {
        if (!n->groups[i]) continue;
        p2p_progress(n, n->groups[i]);
        if (n->groups[i] != g) {
            if (n->groups[i]->nog) progress_outgoing(n, n->groups[i]);
            timers(n, n->groups[i], t);
        } else {
            heartbeat(n, g, t);
        }
    }
    if (g->abort_pending && g->abort_code == COLL_ERR_MISMATCH) {
        /* a pod found that the pods disagree on an op: this one cannot complete */
        snprintf(why, whylen, "%s", g->abort_why);
        return COLL_ERR_MISMATCH;
    }
    if (!g->committed || g->epoch != epoch) {
        snprintf(why, whylen, "the group's epoch ended during the op");
        return COLL_ERR_PEER_LOST;
    }
    return 0;
}

/* The view of g's connections that op t runs with; its scratch comes back to the group
 * through keep_scratch. */
static struct tcp_comm comm_for(struct net *n, struct ngroup *g, const struct net_task *t)
{
    return (struct tcp_comm){.net = n,
                             .g = g,
                             .nodes = g->nodes,
                             .me = g->me,
                             .nlocal = g->nlocal,
                             .fds = g->fds,
                             .rfds = g->rfds,
                             .seq = g->ops_done,
                             .deadline_ns = t->deadline_ns,
                             .scratch = {g->scratch[0], g->scratch[1]},
                             .scratch_cap = {g->scratch_cap[0], g->scratch_cap[1]}};
}

/* The scratch buffers live on with the group, as the op left them. */
static void keep_scratch(struct ngroup *g, const struct tcp_comm *c)
{
    for (int k = 0; k < 2; k++) {
        g->scratch[k] = c->scratch[k];
        g->scratch_cap[k] = c->scratch_cap[k];
    }
}

int net_inline(struct net *n, struct net_task *t)
{
    struct ngroup *g = t->group < n->ngroups ? n->groups[t->group] : NULL;
    if (!g || pthread_mutex_trylock(&n->coll_lock) != 0) return NET_INLINE_NO;
    int rc = NET_INLINE_NO;
    if (g->ready && !g->abort_pending && !g->awaiting_mark && !g->q_head && !g->running &&
        !g->handoff && !g->inline_abort && t->lepoch >= g->floor) {
        struct tcp_comm c = comm_for(n, g, t);
        int started = tcp_tiny_start(g->tiny, &c, t);
        keep_scratch(g, &c);
        if (started == 0) {
            int64_t t0 = now_ns();
            char why[160] = "";
            c.budget_until = now_ns() + INLINE_BUDGET_NS;
            int st = tcp_tiny_progress(g->tiny, &c, why, sizeof(why));
            keep_scratch(g, &c);
            n->inline_ns += now_ns() - t0;
            n->inline_n++;
            if (st == TCP_AGAIN) { /* slow peers: the net thread finishes it */
                g->handoff = t;
                rc = NET_INLINE_HANDED;
            } else {
                g->ops_done++;
                t->status = st;
                t->why[0] = '\0';
                if (st != COLL_OK) {
                    snprintf(t->why, sizeof(t->why), "%s", why);
                    g->inline_abort = st;
                    snprintf(g->inline_why, sizeof(g->inline_why), "%s", why);
                }
                rc = NET_INLINE_DONE;
            }
        }
    }
    pthread_mutex_unlock(&n->coll_lock);
    if (rc == NET_INLINE_HANDED || (rc == NET_INLINE_DONE && t->status != COLL_OK)) {
        atomic_store_explicit(&n->in_pending, 1, memory_order_release);
        uint64_t one = 1;
        ssize_t w = write(n->in_efd, &one, sizeof(one));
        (void)w;
    }
    return rc;
}

static void take_engine_tasks(struct net *n)
{
    uint64_t v;
    ssize_t r = read(n->in_efd, &v, sizeof(v));
    (void)r;
    atomic_store_explicit(&n->in_pending, 0, memory_order_relaxed);
    pthread_mutex_lock(&n->in_lock);
    struct net_task *t = n->in_head;
    n->in_head = n->in_tail = NULL;
    pthread_mutex_unlock(&n->in_lock);
    while (t) {
        struct net_task *next = t->next;
        struct ngroup *g = t->group < n->ngroups ? n->groups[t->group] : NULL;
        if (!g) {
            return_task(n, t, COLL_ERR_INTERNAL);
        } else if (t->type == NET_TASK_MARK) {
            /* everything queued before the mark belongs to an older engine epoch */
            g->floor = t->lepoch;
            g->awaiting_mark = 0;
            if (t->abort && (g->committed || g->q_head))
                ng_abort(n, g, t->code, "a participant on this pod left or failed", 1,
                         g->committed);
            struct net_task *q = g->q_head, *keep_h = NULL, *keep_t = NULL;
            while (q) {
                struct net_task *qn = q->next;
                if (q->lepoch < g->floor)
                    return_task_why(n, q, COLL_ERR_EPOCH, "submitted in an epoch that has ended");
                else {
                    q->next = NULL;
                    if (keep_t)
                        keep_t->next = q;
                    else
                        keep_h = q;
                    keep_t = q;
                }
                q = qn;
            }
            g->q_head = keep_h;
            g->q_tail = keep_t;
            return_task(n, t, COLL_OK);
        } else if (t->lepoch < g->floor) {
            return_task_why(n, t, COLL_ERR_EPOCH, "submitted in an epoch that has ended");
        } else {
            t->next = NULL;
            if (g->q_tail)
                g->q_tail->next = t;
            else
                g->q_head = t;
            g->q_tail = t;
        }
        t = next;
    }
}

/* Returns the number of ops started. */
static int run_ready_ops(struct net *n)
{
    int ran = 0;
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        if (g && g->handoff && g->ready) { /* a tiny op the engine started */
            struct net_task *t = g->handoff;
            struct tcp_comm c = comm_for(n, g, t);
            char why[160] = "";
            g->running = t;
            int st = tcp_tiny_progress(g->tiny, &c, why, sizeof(why));
            g->running = NULL;
            g->handoff = NULL;
            keep_scratch(g, &c);
            return_task_why(n, t, st, why);
            g->ops_done++;
            ran++;
            if (g->abort_pending)
                ng_abort_finish(n, g);
            else if (st != COLL_OK)
                ng_op_failed(n, g, st, why[0] ? why : coll_strerror((coll_err)st));
        }
        while (g && g->ready && !g->awaiting_mark && !g->handoff && g->q_head) {
            struct net_task *t = g->q_head;
            if (t->kind == WIRE_OP_SEND || t->kind == WIRE_OP_RECV) {
                /* pods do not run sends and receives in the same order: they never
                 * hold up the lockstep queue */
                g->q_head = t->next;
                if (!g->q_head) g->q_tail = NULL;
                p2p_post(n, g, t);
                continue;
            }
            struct tcp_comm c = comm_for(n, g, t);
            char why[160] = "";
            /* off the queue while it runs: an abort meanwhile must not hand it back
             * to the engine while its buffers are in use */
            g->q_head = t->next;
            if (!g->q_head) g->q_tail = NULL;
            g->running = t;
            ran++;
            int st = tcp_run(&c, t, why, sizeof(why));
            g->running = NULL;
            keep_scratch(g, &c);
            return_task_why(n, t, st, why); /* t is the engine's from here on */
            g->ops_done++;
            if (g->abort_pending && (st != COLL_OK || !g->q_head))
                ng_abort_finish(n, g);
            else if (st != COLL_OK)
                ng_op_failed(n, g, st, why[0] ? why : coll_strerror((coll_err)st));
        }
    }
    return ran;
}

static void *net_main(void *arg)
{
    struct net *n = arg;
    int64_t last_work = 0;
    while (!atomic_load(&n->stop)) {
        /* spin briefly while ops flow, like the engine, then sleep in zmq_poll */
        if (now_ns() - last_work < NET_SPIN_NS) {
            if (!atomic_load_explicit(&n->in_pending, memory_order_acquire)) {
                sched_yield();
                if (now_ns() - last_work < NET_SPIN_NS &&
                    !atomic_load_explicit(&n->in_pending, memory_order_acquire))
                    continue;
            }
        }
        zmq_pollitem_t items[ITEMS_MAX];
        int ni = 0;
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            for (int p = 0; g && g->ready && p < g->nodes && ni < 256; p++)
                if (g->pfds[p] >= 0)
                    items[ni++] = (zmq_pollitem_t){
                        .fd = g->pfds[p],
                        .events = (short)((g->in[p].parked ? 0 : ZMQ_POLLIN) |
                                          (g->out[p].head || g->out[p].nacks ? ZMQ_POLLOUT : 0))};
        }
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            for (int k = 0; g && k < g->nog && ni < ITEMS_MAX - 4 - MAX_PENDING_ACCEPTS; k++)
                items[ni++] = (zmq_pollitem_t){
                    .fd = g->og[k].fd,
                    .events = (short)(g->og[k].connected ? ZMQ_POLLIN : ZMQ_POLLOUT)};
        }
        if (n->zap) items[ni++] = (zmq_pollitem_t){.socket = n->zap, .events = ZMQ_POLLIN};
        if (n->router) items[ni++] = (zmq_pollitem_t){.socket = n->router, .events = ZMQ_POLLIN};
        if (n->dealer) items[ni++] = (zmq_pollitem_t){.socket = n->dealer, .events = ZMQ_POLLIN};
        items[ni++] = (zmq_pollitem_t){.fd = n->lfd, .events = ZMQ_POLLIN};
        items[ni++] = (zmq_pollitem_t){.fd = n->in_efd, .events = ZMQ_POLLIN};
        for (int i = 0; i < n->npend; i++)
            if (n->pend[i].fd >= 0)
                items[ni++] = (zmq_pollitem_t){.fd = n->pend[i].fd, .events = ZMQ_POLLIN};
        atomic_store_explicit(&n->sleeping, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        int busy = atomic_load_explicit(&n->in_pending, memory_order_relaxed);
        zmq_poll(items, ni, busy ? 0 : 20);
        atomic_store_explicit(&n->sleeping, 0, memory_order_relaxed);
        pthread_mutex_lock(&n->coll_lock);
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            if (g && g->inline_abort) {
                int code = g->inline_abort;
                g->inline_abort = 0;
                ng_op_failed(n, g, code, g->inline_why);
            }
            if (g && g->ngrave && now_ns() >= g->grave_until) close_grave(g);
        }
        if (n->zap) sec_zap_serve(n->zap, &n->keys);
        if (n->router) drain_zmq(n, n->router, 1);
        if (n->dealer) drain_zmq(n, n->dealer, 0);
        accept_conns(n);
        progress_pending(n);
        for (int i = 0; i < n->ngroups; i++)
            if (n->groups[i] && n->groups[i]->nog) progress_outgoing(n, n->groups[i]);
        take_engine_tasks(n);
        int64_t t = now_ns();
        for (int i = 0; i < n->ngroups; i++) {
            if (!n->groups[i]) continue;
            timers(n, n->groups[i], t);
            p2p_progress(n, n->groups[i]);
        }
        if (run_ready_ops(n)) last_work = now_ns();
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            if (g && g->abort_pending && !g->handoff &&
                (!g->q_head || !g->ready || g->awaiting_mark))
                ng_abort_finish(n, g);
        }
        pthread_mutex_unlock(&n->coll_lock);
    }
    /* stopping: hand back everything */
    pthread_mutex_lock(&n->coll_lock);
    take_engine_tasks(n);
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i]) {
            fail_queue(n, n->groups[i], COLL_ERR_SHUTDOWN, "the agent is stopping");
            p2p_reset(n, n->groups[i], COLL_ERR_SHUTDOWN, "the agent is stopping");
        }
    pthread_mutex_unlock(&n->coll_lock);
    return NULL;
}

/* ---- setup ------------------------------------------------------------------------------ */

static int sodium_ready(char *why, size_t whylen)
{
    if (sodium_init() < 0) {
        snprintf(why, whylen, "libsodium cannot start");
        return -1;
    }
    return 0;
}

static uint64_t group_config_hash(const struct group_config *gc)
{
    char buf[512];
    int len = snprintf(buf, sizeof(buf), "%s|%d|%d|%d|%d|%d|%d|%d", gc->name, gc->backend,
                       gc->members, gc->local_slots, gc->ndevices, gc->op_timeout_ms,
                       gc->join_timeout_ms, gc->heartbeat_ms);
    return rdv_fnv1a(buf, (size_t)len, RDV_FNV_INIT);
}

static int bind_data(struct net *n, char *why, size_t whylen)
{
    n->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(n->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)n->cfg->node.data_port)};
    /* the node's own address, not every interface: a pod network's address, or loopback */
    if (inet_pton(AF_INET, n->cfg->node.address, &sa.sin_addr) != 1) {
        snprintf(why, whylen, "node.address '%s' is not an IPv4 address", n->cfg->node.address);
        return -1;
    }
    socklen_t sl = sizeof(sa);
    if (n->lfd < 0 || bind(n->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(n->lfd, DATA_CH_COUNT * RDV_MAX_NODES + 64) < 0 ||
        getsockname(n->lfd, (struct sockaddr *)&sa, &sl) < 0) {
        snprintf(why, whylen, "data-plane listener on port %d: %s", n->cfg->node.data_port,
                 strerror(errno));
        return -1;
    }
    snprintf(n->data_addr, sizeof(n->data_addr), "%.56s:%u", n->cfg->node.address,
             (unsigned)ntohs(sa.sin_port));
    return 0;
}

struct net *net_start(const struct config *cfg, const uint8_t *gpu_group, char *why, size_t whylen)
{
    why[0] = '\0';
    int any = 0;
    for (int i = 0; i < cfg->ngroups; i++)
        any |= cfg->groups[i].members > 1;
    if (!any) return NULL;
    struct net *n = calloc(1, sizeof(*n));
    if (!n) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    n->cfg = cfg;
    n->lfd = n->in_efd = n->out_efd = -1;
    pthread_mutex_init(&n->in_lock, NULL);
    pthread_mutex_init(&n->out_lock, NULL);
    pthread_mutex_init(&n->coll_lock, NULL);
    n->ngroups = cfg->ngroups;
    n->groups = calloc((size_t)cfg->ngroups, sizeof(*n->groups));
    n->in_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    n->out_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!n->groups || n->in_efd < 0 || n->out_efd < 0) {
        snprintf(why, whylen, "setting up the net thread: %s", strerror(errno));
        goto fail;
    }
    if (bind_data(n, why, whylen) < 0) goto fail;
    for (int i = 0; i < cfg->ngroups; i++) {
        const struct group_config *gc = &cfg->groups[i];
        if (gc->members <= 1) continue;
        struct ngroup *g = calloc(1, sizeof(*g));
        if (!g) goto fail;
        g->cfg = gc;
        g->index = i;
        g->nodes = gc->members;
        g->me = cfg->node.index;
        g->nlocal = gc->local_slots;
        g->gpu = gpu_group && gpu_group[i];
        g->config_hash = group_config_hash(gc);
        g->tiny = malloc(tcp_tiny_size());
        if (!g->tiny) {
            free(g);
            goto fail;
        }
        g->name_hash = rdv_fnv1a(gc->name, strlen(gc->name), RDV_FNV_INIT);
        for (int k = 0; k < EV_POOL; k++) {
            g->evpool[k].next = g->evfree;
            g->evfree = &g->evpool[k];
        }
        for (int k = 0; k < RDV_MAX_NODES; k++)
            g->fds[k] = g->rfds[k] = g->pfds[k] = -1;
        n->groups[i] = g;
    }
    if (sodium_ready(why, whylen) < 0) goto fail;
    if (cfg->security.keys[0]) {
        if (sec_load_keys(cfg->security.keys, &n->keys, why, whylen) < 0) goto fail;
    } else if (cfg->security.require_keys) {
        snprintf(why, whylen,
                 "security.require_keys is true but security.keys names no key "
                 "directory");
        goto fail;
    } else {
        log_msg(LOG_WARN, "security.unauthenticated",
                "detail=\"no CURVE keys (security.keys): anyone who reaches the rendezvous port "
                "can join, and COMMIT with each epoch's data-plane secret travels in clear; "
                "for development only\"");
    }
    n->zctx = zmq_ctx_new();
    int linger = 0;
    int64_t maxmsg = RDV_FRAME_MAX;
    char ep[CONFIG_ADDR_MAX + 16];
    const char *coord = cfg->discovery.peers[0];
    if (cfg->node.index == 0) {
        if (n->keys.loaded && !(n->zap = sec_zap_open(n->zctx, why, whylen))) goto fail;
        n->router = zmq_socket(n->zctx, ZMQ_ROUTER);
        zmq_setsockopt(n->router, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_setsockopt(n->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        if (n->keys.loaded && sec_curve_server(n->router, &n->keys, why, whylen) < 0) goto fail;
        snprintf(ep, sizeof(ep), "tcp://%s:%s", cfg->node.address, strrchr(coord, ':') + 1);
        if (zmq_bind(n->router, ep) < 0) {
            snprintf(why, whylen, "rendezvous bind %s: %s", ep, zmq_strerror(zmq_errno()));
            goto fail;
        }
    } else {
        n->dealer = zmq_socket(n->zctx, ZMQ_DEALER);
        zmq_setsockopt(n->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_setsockopt(n->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        if (n->keys.loaded && sec_curve_client(n->dealer, &n->keys, why, whylen) < 0) goto fail;
        int ivl = 100, max = 1000;
        zmq_setsockopt(n->dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
        zmq_setsockopt(n->dealer, ZMQ_RECONNECT_IVL_MAX, &max, sizeof(max));
        snprintf(ep, sizeof(ep), "tcp://%s", coord);
        if (zmq_connect(n->dealer, ep) < 0) {
            snprintf(why, whylen, "rendezvous connect %s: %s", ep, zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    log_msg(LOG_INFO, "net.start", "node=%d rendezvous=%s role=%s data=%s curve=%s",
            cfg->node.index, ep, cfg->node.index == 0 ? "coordinator" : "member", n->data_addr,
            n->keys.loaded ? "on" : "off");
    if (pthread_create(&n->thread, NULL, net_main, n) != 0) {
        snprintf(why, whylen, "cannot start the net thread");
        goto fail;
    }
    n->started = 1;
    return n;
fail:
    net_free(&n);
    if (!why[0]) snprintf(why, whylen, "out of memory");
    return NULL;
}

void net_stop(struct net *n)
{
    if (n && n->started) {
        atomic_store(&n->stop, 1);
        pthread_join(n->thread, NULL);
        n->started = 0;
    }
}

void net_free(struct net **np)
{
    if (!np || !*np) return;
    struct net *n = *np;
    *np = NULL;
    net_stop(n);
    /* events the engine did not collect (pool ones live in their groups) */
    struct net_event *e = n->ev_head;
    while (e) {
        struct net_event *x = e->next;
        if (e->heap) free(e);
        e = x;
    }
    for (int i = 0; i < n->ngroups; i++) {
        if (!n->groups || !n->groups[i]) continue;
        close_data(n->groups[i]);
        close_grave(n->groups[i]);
        for (int p = 0; p < RDV_MAX_NODES; p++)
            free(n->groups[i]->out[p].acks);
        free(n->groups[i]->tiny);
        free(n->groups[i]->scratch[0]);
        free(n->groups[i]->scratch[1]);
        free(n->groups[i]);
    }
    free(n->groups);
    for (int i = 0; i < n->npend; i++)
        close(n->pend[i].fd);
    if (n->inline_n)
        log_msg(LOG_INFO, "net.inline", "ops=%lld mean_us=%.1f", (long long)n->inline_n,
                (double)n->inline_ns / (double)n->inline_n / 1000.0);
    if (n->router) zmq_close(n->router);
    if (n->dealer) zmq_close(n->dealer);
    if (n->zap) zmq_close(n->zap);
    if (n->zctx) zmq_ctx_term(n->zctx);
    if (n->lfd >= 0) close(n->lfd);
    if (n->in_efd >= 0) close(n->in_efd);
    /* tasks the engine did not collect are its own memory */
    if (n->out_efd >= 0) close(n->out_efd);
    pthread_mutex_destroy(&n->in_lock);
    pthread_mutex_destroy(&n->out_lock);
    pthread_mutex_destroy(&n->coll_lock);
    free(n);
}
