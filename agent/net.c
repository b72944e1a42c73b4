/*
 * net.c: the net thread. It owns the ZeroMQ sockets of the rendezvous, the data-plane
 * listener and connections, and the queue of ops from the engine. One loop: wait on
 * the sockets and the engine's doorbell, feed the rendezvous state machines
 * (net_epoch.c), move data connections on (dataconn.c) and sends and receives
 * (p2p.c), and run ready collectives one at a time per group (backends/tcp.c), whose
 * long transfers call back into service() so that heartbeats and other groups go on.
 * Nothing on this thread waits for a peer: every connection is non-blocking and every
 * wait is bounded by a deadline (DESIGN.md section 6).
 */
#include "net.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sodium.h>
#include <zmq.h>

#include "coll/coll.h"
#include "net_priv.h"

#include "cpus.h"
#include "dns.h"
#include "ring.h"
#include "wire.h"

#define NET_SPIN_NS 200000LL /* look for the next op at most this long (spin.h) */
/* The engine gives a tiny op at most this long (spinning, then asleep on it: tcp.h's
 * nap), then hands it over to the net thread; sooner when it has other work or the net
 * thread wants coll_lock */
#define INLINE_BUDGET_NS 20000000LL

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
void net_return_task(struct net *n, struct net_task *t, int status, const char *why)
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

void net_post_event(struct net *n, struct ngroup *g, int broken, int code, const char *why)
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
    e->epoch = g->rdv.epoch;
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

void net_fail_queue(struct net *n, struct ngroup *g, int code, const char *why)
{
    if (g->handoff) {
        net_return_task(n, g->handoff, code, why);
        g->handoff = NULL;
    }
    while (g->q_head) {
        struct net_task *t = g->q_head;
        g->q_head = t->next;
        net_return_task(n, t, code, why);
    }
    g->q_tail = NULL;
}

/* ---- deadlines ------------------------------------------------------------------- */

/* The rendezvous' timers, and ops past their deadline: a send or receive with no
 * partner, or the oldest queued op (it bounds every other one's wait). */
static void timers(struct net *n, struct ngroup *g, int64_t t)
{
    if (g->rdv.committed && !g->rdv.formed && !g->rdv.ending && t > g->rdv.form_deadline) {
        /* the tick below ends the epoch: say first what did not come up */
        char what[1024];
        dataconn_describe(g, what, sizeof(what));
        log_msg(LOG_WARN, "data.not_up", "group=%s epoch=%u pending=\"%s\"", g->cfg->name,
                g->rdv.epoch, LOG_Q(what));
    }
    rendezvous_tick(&g->rdv, t);
    char why[160];
    if (p2p_oldest_deadline(g) <= t) {
        snprintf(why, sizeof(why), "a send or receive found no partner in %d ms",
                 g->cfg->op_timeout_ms);
        net_epoch_end(n, g, COLL_ERR_TIMEOUT, why, 0, g->rdv.committed);
        return;
    }
    if (g->q_head && g->q_head->deadline_ns <= t) {
        snprintf(why, sizeof(why), "op %llu waited %d ms for the group to form",
                 (unsigned long long)g->q_head->seq, g->cfg->op_timeout_ms);
        net_epoch_end(n, g, COLL_ERR_TIMEOUT, why, 0, g->rdv.committed);
    }
}

/* ---- ops ------------------------------------------------------------------------------------ */

/* Take coll_lock from the engine, which may hold it asleep in a tiny op: knock (it
 * hands the op over and lets go), then take the knock back. */
static void lock_from_engine(struct net *n)
{
    if (pthread_mutex_trylock(&n->coll_lock) == 0) return;
    uint64_t v = 1;
    ssize_t w = write(n->knock_efd, &v, sizeof(v));
    pthread_mutex_lock(&n->coll_lock);
    w = read(n->knock_efd, &v, sizeof(v));
    (void)w;
}

static int service_turn(struct ngroup *g, int64_t t, char *why, size_t whylen);

/* tcp_run's service, called from inside an op's transfer loop: keep the rendezvous
 * and the other groups alive, and say whether the op must stop (its error code, 0 to
 * go on). The op runs without coll_lock (run_op); a turn takes it. */
static int service(void *ctx, char *why, size_t whylen)
{
    struct ngroup *g = ctx;
    struct net *n = g->net;
    int64_t t = now_ns();
    if (atomic_load(&n->stop)) {
        snprintf(why, whylen, "the agent is stopping");
        return COLL_ERR_SHUTDOWN;
    }
    if (t - n->last_service < 20 * NS_PER_MS) return 0;
    n->last_service = t;
    lock_from_engine(n);
    int st = service_turn(g, t, why, whylen);
    pthread_mutex_unlock(&n->coll_lock);
    return st;
}

static int service_turn(struct ngroup *g, int64_t t, char *why, size_t whylen)
{
    struct net *n = g->net;
    atomic_store_explicit(&n->alive_ns, t, memory_order_relaxed); /* a long op turns too */
    uint64_t commits = g->rdv.commits; /* the epoch, whatever its number */
    dataconn_accept(n);                /* other groups form meanwhile */
    dataconn_progress_pending(n);
    net_epoch_drain(n);
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *o = n->groups[i];
        if (!o) continue;
        p2p_progress(n, o);
        if (o != g) {
            if (o->nog) dataconn_progress_outgoing(n, o);
            timers(n, o, t);
        } else {
            rendezvous_heartbeat(&g->rdv, t);
        }
    }
    if (g->abort_pending && g->abort_code == COLL_ERR_MISMATCH) {
        /* a pod found that the pods disagree on an op: this one cannot complete */
        snprintf(why, whylen, "%s", g->abort_why);
        return COLL_ERR_MISMATCH;
    }
    if (g->abort_pending && g->abort_silent) {
        /* a pod went silent: what it owes this op will not come */
        snprintf(why, whylen, "%s", g->abort_why);
        return COLL_ERR_PEER_LOST;
    }
    if (!g->rdv.committed || g->rdv.commits != commits) {
        snprintf(why, whylen, "the group's epoch ended during the op");
        return COLL_ERR_PEER_LOST;
    }
    /* a pod whose node vanished without a reset sends nothing: stop waiting for its
     * bytes after 3 heartbeat intervals (its epoch then ends on the next tick) */
    if (rendezvous_silent(&g->rdv, t, why, whylen)) return COLL_ERR_PEER_LOST;
    return 0;
}

/* The view of g's connections that op t runs with. */
static struct tcp_comm comm_for(struct ngroup *g, const struct net_task *t)
{
    return (struct tcp_comm){.service = service,
                             .service_ctx = g,
                             .nodes = g->nodes,
                             .me = g->me,
                             .nlocal = g->nlocal,
                             .fds = g->fds,
                             .rfds = g->rfds,
                             .seq = g->ops_done,
                             .deadline_ns = t->deadline_ns,
                             .scratch = &g->scratch,
                             .spin = g->spin,
                             .gate = g->net->gate,
                             .acks = g->acks,
                             .stash = g->stash,
                             .wake_fd = {-1, -1},
                             .short_spin = tcp_tune_way(g->tune)};
}

/* Whether the pairs t needs are up (asking for the missing ones when on the net
 * thread). Called with coll_lock. */
static int peers_ready(struct net *n, struct ngroup *g, const struct net_task *t, int ask)
{
    if (g->nodes <= TCP_EAGER_ALL) return 1; /* all connected at formation */
    memset(g->need, 0, (size_t)g->nodes);
    tcp_op_peers(g->nodes, g->me, g->nlocal, t, g->need);
    if (ask) return dataconn_need(n, g, g->need);
    for (int p = 0; p < g->nodes; p++)
        if (g->need[p] && (g->fds[p] < 0 || g->rfds[p] < 0 || g->pfds[p] < 0)) return 0;
    return 1;
}

void net_engine_nap(struct net *n, int fd, net_nap_fn nap, void *ctx)
{
    n->engine_fd = fd;
    n->nap = nap;
    n->nap_ctx = ctx;
}

int net_inline(struct net *n, struct net_task *t)
{
    struct ngroup *g = t->group < n->ngroups ? n->groups[t->group] : NULL;
    if (!g || pthread_mutex_trylock(&n->coll_lock) != 0) return NET_INLINE_NO;
    int rc = NET_INLINE_NO;
    if (g->ready && !g->abort_pending && !g->awaiting_mark && !g->q_head && !g->running &&
        !g->handoff && !g->inline_abort && !g->lent && t->lepoch >= g->floor &&
        peers_ready(n, g, t, 0)) {
        struct tcp_comm c = comm_for(g, t);
        if (n->nap) {
            c.nap = n->nap;
            c.nap_ctx = n->nap_ctx;
            c.wake_fd[0] = n->engine_fd;
            c.wake_fd[1] = n->knock_efd;
        }
        char why0[160];
        /* acks a broadcast root went on without, within the budget (else the net thread
         * waits for the rest) */
        c.budget_until = now_ns() + INLINE_BUDGET_NS;
        int started =
            tcp_settle(&c, t, why0, sizeof(why0)) == COLL_OK ? tcp_tiny_start(g->tiny, &c, t) : -1;
        if (started == 0) {
            int64_t t0 = now_ns();
            c.short_spin = tcp_tune_start(g->tune, t, t0);
            char why[160] = "";
            c.budget_until = now_ns() + INLINE_BUDGET_NS;
            int st = tcp_tiny_progress(g->tiny, &c, why, sizeof(why));
            n->inline_ns += now_ns() - t0;
            n->inline_n++;
            if (st == TCP_AGAIN) { /* slow peers: the net thread finishes it */
                g->handoff = t;
                rc = NET_INLINE_HANDED;
            } else {
                tcp_tune_end(g->tune, st == COLL_OK, now_ns());
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

static void knock_net(struct net *n)
{
    atomic_store_explicit(&n->in_pending, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(n->in_efd, &one, sizeof(one));
    (void)w;
}

int net_lend(struct net *n, int group, struct wire_lease_words *words, struct net_lease *out,
             wire_stash *stash_out, char *why, size_t whylen)
{
    struct ngroup *g = group >= 0 && group < n->ngroups ? n->groups[group] : NULL;
    if (!g || g->gpu || g->nlocal != 1 || g->nodes > TCP_EAGER_ALL ||
        2 * (g->nodes - 1) > NET_LEASE_FDS) {
        snprintf(why, whylen,
                 "only a host group of up to %d pods with one slot per pod lends "
                 "its connections",
                 TCP_EAGER_ALL);
        return COLL_ERR_UNSUPPORTED;
    }
    if (pthread_mutex_trylock(&n->coll_lock) != 0) {
        snprintf(why, whylen, "the group's connections are in use");
        return COLL_ERR_BUSY;
    }
    int rc = COLL_ERR_BUSY;
    if (!g->ready || g->abort_pending || g->awaiting_mark || g->inline_abort)
        snprintf(why, whylen, "the group is not formed");
    else if (g->q_head || g->running || g->handoff || g->lent)
        snprintf(why, whylen, "an op of the group is under way");
    else if (tcp_acks_export(g->acks, &out->has_prev, &out->run, out->prev, sizeof(out->prev)) < 0)
        snprintf(why, whylen, "a broadcast root's acks are still owed");
    else {
        out->nfds = 0;
        for (int p = 0; p < g->nodes; p++)
            if (p != g->me) {
                out->fds[out->nfds++] = g->fds[p];
                out->fds[out->nfds++] = g->rfds[p];
            }
        rc = COLL_OK;
        for (int i = 0; i < out->nfds; i++)
            if (out->fds[i] < 0) rc = COLL_ERR_BUSY;
        if (rc) {
            snprintf(why, whylen, "the group's connections are not all up");
        } else {
            _Static_assert(TCP_STASH_BYTES == WIRE_STASH_BYTES, "a stash travels whole");
            _Static_assert(TCP_EAGER_ALL <= WIRE_STASH_NODES, "every pod's stash travels");
            memset(out->stash_len, 0, sizeof(out->stash_len));
            for (int p = 0; p < g->nodes; p++) {
                size_t len = tcp_stash_front(&g->stash[p]);
                memcpy((*stash_out)[p], g->stash[p].b, len);
                out->stash_len[p] = (uint16_t)len;
                g->stash[p].len = 0;
            }
            g->lent = 1;
            g->lease_w = words;
            g->lease_id = ++n->lease_next;
            out->id = g->lease_id;
            out->seq = g->ops_done;
            out->nodes = g->nodes;
            out->me = g->me;
            out->own_cpus = !g->cpu_shared;
        }
    }
    pthread_mutex_unlock(&n->coll_lock);
    return rc;
}

int net_unlend(struct net *n, int group, uint64_t id, uint64_t seq, uint32_t has_prev, uint32_t run,
               const uint8_t *prev, const uint16_t *stash_len, const wire_stash *stash, int code,
               const char *why, char *end_why, size_t end_whylen)
{
    struct ngroup *g = group >= 0 && group < n->ngroups ? n->groups[group] : NULL;
    if (!g) return 0;
    int end = 0, knock = 0;
    pthread_mutex_lock(&n->coll_lock);
    if (g->lent && g->lease_id == id) {
        g->lent = 0;
        g->lease_w = NULL;
        /* the client's word on how far it went: numbers only go forward (a false one
         * makes the pods disagree on the next op, which ends the epoch there) */
        if (code == COLL_OK && seq < g->ops_done) {
            code = COLL_ERR_PROTOCOL;
            why = "the client gave the connections back with an op number from the past";
        }
        if (code == COLL_OK) {
            /* kept even where the epoch is ending: an op the drain still runs (one the
             * client submits next) goes on from here, not from the lease's start */
            g->ops_done = seq;
            tcp_acks_import(g->acks, has_prev, run, prev);
            /* the counts are checked (wire_decode); the bytes are the peers' stream as
             * the client read it, which it could have made up anyway: the ops that read
             * them check their headers like any others */
            for (int p = 0; p < g->nodes; p++) {
                size_t len = stash_len[p] <= TCP_STASH_BYTES && p != g->me ? stash_len[p] : 0;
                memcpy(g->stash[p].b, (*stash)[p], len);
                g->stash[p].off = 0;
                g->stash[p].len = (uint32_t)len;
            }
        }
        if (g->abort_pending) {
            /* the epoch is ending (a pod left) and waited for the client's ops: end it
             * now with the reason it ends for (the client's failure, if any, came of it) */
            end = g->abort_code;
            snprintf(end_why, end_whylen, "%s", g->abort_why);
            knock = 1; /* the net thread ends it */
        } else if (code != COLL_OK) {
            g->inline_abort = code;
            snprintf(g->inline_why, sizeof(g->inline_why), "%s", why);
            knock = 1;
        }
    } /* else an ended lease: its epoch is gone already */
    pthread_mutex_unlock(&n->coll_lock);
    if (knock) knock_net(n);
    return end;
}

void net_lease_forget(struct net *n, int group, uint64_t id)
{
    struct ngroup *g = n && group >= 0 && group < n->ngroups ? n->groups[group] : NULL;
    if (!g) return;
    pthread_mutex_lock(&n->coll_lock);
    if (g->lease_id == id) {
        g->lease_w = NULL;
        g->drain_until = 0; /* nobody will give it back: a drain ends now */
    }
    pthread_mutex_unlock(&n->coll_lock);
    knock_net(n);
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
            net_return_task(n, t, COLL_ERR_INTERNAL, NULL);
        } else if (t->type == NET_TASK_MARK) {
            /* everything queued before the mark belongs to an older engine epoch */
            g->floor = t->lepoch;
            g->awaiting_mark = 0;
            if (t->abort && (g->rdv.committed || g->q_head))
                net_epoch_end(n, g, t->code, "a participant on this pod left or failed", 1,
                              g->rdv.committed);
            struct net_task *q = g->q_head, *keep_h = NULL, *keep_t = NULL;
            while (q) {
                struct net_task *qn = q->next;
                if (q->lepoch < g->floor)
                    net_return_task(n, q, COLL_ERR_EPOCH, "submitted in an epoch that has ended");
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
            net_return_task(n, t, COLL_OK, NULL);
        } else if (t->lepoch < g->floor) {
            net_return_task(n, t, COLL_ERR_EPOCH, "submitted in an epoch that has ended");
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

/* Run op t (tiny: the rest of one the engine started) of the group c is of, whose
 * running it is, without coll_lock: the engine lends, takes back and runs inline the
 * ops of other groups meanwhile, and never waits behind a long transfer (a GiB op of one
 * group once stalled every session); service() takes the lock for each turn. Nothing
 * of this group is touched by the engine while it runs (its checks find it running).
 * Called and returns with coll_lock. */
static int run_op(struct net *n, struct tcp_comm *c, struct net_task *t, int tiny, char *why,
                  size_t whylen)
{
    struct ngroup *g = c->service_ctx;
    pthread_mutex_unlock(&n->coll_lock);
    int st = tiny ? tcp_tiny_progress(g->tiny, c, why, whylen) : tcp_run(c, t, why, whylen);
    lock_from_engine(n);
    return st;
}

/* Returns the number of ops started. */
static int run_ready_ops(struct net *n)
{
    int ran = 0;
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        if (g && g->handoff && g->ready) { /* a tiny op the engine started */
            struct net_task *t = g->handoff;
            struct tcp_comm c = comm_for(g, t);
            char why[160] = "";
            g->running = t;
            int st = run_op(n, &c, t, 1, why, sizeof(why));
            tcp_tune_end(g->tune, st == COLL_OK, now_ns());
            g->running = NULL;
            g->handoff = NULL;
            net_return_task(n, t, st, why);
            g->ops_done++;
            ran++;
            if (g->abort_pending)
                net_epoch_end_finish(n, g);
            else if (st != COLL_OK)
                net_epoch_op_failed(n, g, st, why[0] ? why : coll_strerror((coll_err)st));
        }
        while (g && g->ready && !g->awaiting_mark && !g->handoff && g->q_head) {
            struct net_task *t = g->q_head;
            if (t->kind == WIRE_OP_SEND || t->kind == WIRE_OP_RECV) {
                /* pods do not run sends and receives in the same order: they never
                 * hold up the lockstep queue (the message waits for its connection) */
                g->q_head = t->next;
                if (!g->q_head) g->q_tail = NULL;
                peers_ready(n, g, t, 1);
                if (g->ready)
                    p2p_post(n, g, t);
                else
                    net_return_task(n, t, COLL_ERR_PEER_LOST, "the group's epoch ended");
                continue;
            }
            if (g->lent) { /* the client holds the connections: it gives them back first */
                g->q_head = t->next;
                if (!g->q_head) g->q_tail = NULL;
                net_return_task(n, t, COLL_ERR_INVALID,
                                "the group's connections are lent to its client (direct ops): "
                                "it gives them back before any other collective");
                continue;
            }
            /* its pairs first: the op waits in the queue (its deadline runs) while
             * they connect, and other groups go on */
            if (!peers_ready(n, g, t, 1)) break;
            struct tcp_comm c = comm_for(g, t);
            char why[160] = "";
            /* off the queue while it runs: an abort meanwhile must not hand it back
             * to the engine while its buffers are in use */
            g->q_head = t->next;
            if (!g->q_head) g->q_tail = NULL;
            g->running = t;
            ran++;
            c.short_spin = tcp_tune_start(g->tune, t, now_ns());
            int st = run_op(n, &c, t, 0, why, sizeof(why));
            tcp_tune_end(g->tune, st == COLL_OK, now_ns());
            g->running = NULL;
            net_return_task(n, t, st, why); /* t is the engine's from here on */
            g->ops_done++;
            if (g->abort_pending && (st != COLL_OK || !g->q_head))
                net_epoch_end_finish(n, g);
            else if (st != COLL_OK)
                net_epoch_op_failed(n, g, st, why[0] ? why : coll_strerror((coll_err)st));
        }
    }
    return ran;
}

static void *net_main(void *arg)
{
    struct net *n = arg;
    int64_t last_work = 0, budget = 0;
    int slept = 0; /* since the last op ran */
    while (!atomic_load(&n->stop)) {
        atomic_store_explicit(&n->alive_ns, now_ns(), memory_order_relaxed);
        /* spin while ops flow, like the engine (as long as spinning has paid, yielding
         * while safe: spin.h), then sleep in zmq_poll */
        int64_t now = now_ns();
        if (now - last_work < budget &&
            !atomic_load_explicit(&n->in_pending, memory_order_acquire)) {
            spin_relax(n->gate, now);
            continue;
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
        int retry = 0; /* a connection to open again shortly (NOT_YET): look up soon */
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            for (int k = 0; g && k < g->nog && ni < ITEMS_MAX - 4 - MAX_PENDING_ACCEPTS; k++) {
                if (g->og[k].fd < 0) {
                    retry = 1;
                    continue;
                }
                items[ni++] = (zmq_pollitem_t){
                    .fd = g->og[k].fd,
                    .events = (short)(g->og[k].connected ? ZMQ_POLLIN : ZMQ_POLLOUT)};
            }
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
        slept |= !busy;
        zmq_poll(items, ni, busy ? 0 : retry ? 1 : 20);
        atomic_store_explicit(&n->sleeping, 0, memory_order_relaxed);
        lock_from_engine(n); /* the engine may run a tiny op, asleep in it */
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            if (g && g->inline_abort) {
                int code = g->inline_abort;
                g->inline_abort = 0;
                net_epoch_op_failed(n, g, code, g->inline_why);
            }
            if (g && g->ngrave && now_ns() >= g->grave_until) dataconn_close_grave(g);
        }
        net_epoch_drain(n);
        dataconn_accept(n);
        dataconn_progress_pending(n);
        for (int i = 0; i < n->ngroups; i++)
            if (n->groups[i] && n->groups[i]->nog) dataconn_progress_outgoing(n, n->groups[i]);
        take_engine_tasks(n);
        int64_t t = now_ns();
        for (int i = 0; i < n->ngroups; i++) {
            if (!n->groups[i]) continue;
            timers(n, n->groups[i], t);
            p2p_progress(n, n->groups[i]);
        }
        if (run_ready_ops(n)) {
            spin_learn(&n->idle, !slept, (int32_t)n->spin_cap);
            budget = spin_budget(&n->idle);
            slept = 0;
            last_work = now_ns();
        }
        net_discovery_tick(n, t);
        for (int i = 0; i < n->ngroups; i++) {
            struct ngroup *g = n->groups[i];
            if (g && g->abort_pending && !g->handoff &&
                (!g->q_head || !g->ready || g->awaiting_mark) &&
                (!g->lent || now_ns() >= g->drain_until))
                net_epoch_end_finish(n, g); /* lent: the client gave up, or never gave back */
        }
        pthread_mutex_unlock(&n->coll_lock);
    }
    /* stopping: say goodbye (LEAVE, or the coordinator's ABORT), so that peers move on at
     * once instead of waiting for silence; the sockets linger briefly to send it */
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i]) rendezvous_leave(&n->groups[i]->rdv);
    /* stopping: hand back everything */
    pthread_mutex_lock(&n->coll_lock);
    take_engine_tasks(n);
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i]) {
            net_fail_queue(n, n->groups[i], COLL_ERR_SHUTDOWN, "the agent is stopping");
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

/* Where this pod runs (rdv_wire.h: struct rdv_place): the host by its boot id, which
 * every container of one kernel reads alike, and the CPUs the agent may run on, which
 * stand for the pod's (its application's spins run there or on CPUs of their own).
 * What cannot be read is left 0: not known, which the coordinator takes as shared. */
static void net_place(struct rdv_place *p)
{
    memset(p, 0, sizeof(*p));
    char id[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(id, sizeof(id), f)) id[0] = '\0';
        fclose(f);
    }
    size_t len = strcspn(id, "\n");
    if (len) p->host = rdv_fnv1a(id, len, RDV_FNV_INIT) | 1; /* never 0, the unknown */
    cpu_set_t mask;
    if (coll_affinity(&mask) == 0)
        for (int c = 0; c < RDV_CPUS_BYTES * 8 && c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &mask)) p->cpus[c / 8] |= (uint8_t)(1u << (c % 8));
}

struct net *net_start(const struct config *cfg, const uint8_t *gpu_group, net_commid_fn commid,
                      struct spin_gate *gate, char *why, size_t whylen)
{
    /* JOIN's identity: the pod's UID, else one of this process (a restart is a new pod) */
    char uid_buf[RDV_NAME_MAX];
    if (cfg->node.uid[0]) {
        snprintf(uid_buf, sizeof(uid_buf), "%s", cfg->node.uid);
    } else {
        uint8_t r[8];
        sec_random(r, sizeof(r));
        snprintf(uid_buf, sizeof(uid_buf), "process-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1],
                 r[2], r[3], r[4], r[5], r[6], r[7]);
    }
    why[0] = '\0';
    int any = 0;
    for (int i = 0; i < cfg->ngroups; i++)
        any |= cfg->groups[i].members > 1;
    if (!any) return NULL;
    struct net *n = calloc(1, sizeof(*n));
    if (n) n->spin_cap = coll_usable_cpus() < 2 ? 0 : NET_SPIN_NS; /* as the engine's */
    if (n) n->gate = gate;
    if (n) spin_init(&n->idle, n->spin_cap < 50000 ? (int32_t)n->spin_cap : 50000);
    if (!n) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    n->cfg = cfg;
    n->commid = commid;
    net_place(&n->place);
    n->lfd = n->in_efd = n->out_efd = n->engine_fd = n->knock_efd = -1;
    pthread_mutex_init(&n->in_lock, NULL);
    pthread_mutex_init(&n->out_lock, NULL);
    pthread_mutex_init(&n->coll_lock, NULL);
    n->ngroups = cfg->ngroups;
    n->groups = calloc((size_t)cfg->ngroups, sizeof(*n->groups));
    n->in_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    n->out_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    n->knock_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!n->groups || n->in_efd < 0 || n->out_efd < 0 || n->knock_efd < 0) {
        snprintf(why, whylen, "setting up the net thread: %s", strerror(errno));
        goto free_net;
    }
    if (dataconn_bind(n, why, whylen) < 0) goto free_net;
    for (int i = 0; i < cfg->ngroups; i++) {
        const struct group_config *gc = &cfg->groups[i];
        if (gc->members <= 1) continue;
        struct ngroup *g = calloc(1, sizeof(*g));
        if (!g) goto free_net;
        g->cfg = gc;
        g->index = i;
        g->nodes = gc->members;
        g->me = cfg->node.index;
        g->nlocal = gc->local_slots;
        g->pub_cpu_shared = -1;
        for (int k = 0; k < RDV_MAX_NODES; k++)
            spin_init(&g->spin[k], TCP_SPIN_START_NS);
        g->gpu = gpu_group && gpu_group[i];
        g->tiny = malloc(tcp_tiny_size());
        g->acks = tcp_acks_new(g->nodes);
        g->tune = tcp_tune_new();
        if (g->nodes <= TCP_EAGER_ALL) g->stash = calloc((size_t)g->nodes, sizeof(*g->stash));
        if (!g->tiny || !g->acks || !g->tune || (g->nodes <= TCP_EAGER_ALL && !g->stash)) {
            free(g->tiny);
            free(g->acks);
            free(g->tune);
            free(g->stash);
            free(g);
            goto free_net;
        }
        g->name_hash = rdv_fnv1a(gc->name, strlen(gc->name), RDV_FNV_INIT);
        for (int k = 0; k < EV_POOL; k++) {
            g->evpool[k].next = g->evfree;
            g->evfree = &g->evpool[k];
        }
        for (int k = 0; k < RDV_MAX_NODES; k++)
            g->fds[k] = g->rfds[k] = g->pfds[k] = -1;
        n->groups[i] = g;
        if (!n->uid[0]) snprintf(n->uid, sizeof(n->uid), "%s", uid_buf);
        net_epoch_group_init(n, g);
    }
    if (sodium_ready(why, whylen) < 0) goto free_net;
    if (cfg->security.keys[0]) {
        if (sec_load_keys(cfg->security.keys, &n->keys, why, whylen) < 0) goto free_net;
    } else if (cfg->security.require_keys) {
        snprintf(why, whylen,
                 "security.require_keys is true but security.keys names no key "
                 "directory");
        goto free_net;
    } else {
        log_msg(LOG_WARN, "security.unauthenticated",
                "detail=\"no CURVE keys (security.keys): anyone who reaches the rendezvous port "
                "can join, and COMMIT with each epoch's data-plane secret travels in clear; "
                "for development only\"");
    }
    if (net_epoch_open(n, why, whylen) < 0) goto free_net;
    /* the coordinator of a GPU group across pods: its ids come from a thread of their own */
    int ids = 0;
    for (int i = 0; i < n->ngroups; i++)
        ids |= n->groups[i] && n->groups[i]->gpu && n->groups[i]->me == 0;
    if (ids && n->commid && !(n->ids = net_commid_start(n->commid, n->in_efd, why, whylen)))
        goto free_net;
    if (cfg->discovery.service[0] &&
        !(n->dns = dns_watch_start(cfg->discovery.service, cfg->discovery.resolve_ms, 2000, why,
                                   whylen)))
        goto free_net;
    atomic_store(&n->alive_ns, now_ns()); /* /livez: turning from the start */
    if (pthread_create(&n->thread, NULL, net_main, n) != 0) {
        snprintf(why, whylen, "cannot start the net thread");
        goto free_net;
    }
    n->started = 1;
    return n;
free_net:
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
    net_commid_stop(&n->ids);
    dns_watch_stop(&n->dns);
    /* events the engine did not collect (pool ones live in their groups) */
    struct net_event *e = n->ev_head;
    while (e) {
        struct net_event *x = e->next;
        if (e->heap) free(e);
        e = x;
    }
    for (int i = 0; i < n->ngroups; i++) {
        if (!n->groups || !n->groups[i]) continue;
        dataconn_close(n->groups[i]);
        dataconn_close_grave(n->groups[i]);
        p2p_free(n->groups[i]);
        uint64_t learnt = 0, shrt = 0;
        if (n->groups[i]->tune) tcp_tune_counts(n->groups[i]->tune, &learnt, &shrt);
        if (learnt + shrt)
            log_msg(LOG_INFO, "net.spin", "group=%s ops_learnt_spin=%llu ops_short_spin=%llu",
                    n->groups[i]->cfg->name, (unsigned long long)learnt, (unsigned long long)shrt);
        free(n->groups[i]->tiny);
        free(n->groups[i]->acks);
        free(n->groups[i]->stash);
        free(n->groups[i]->tune);
        free(n->groups[i]->scratch.p[0]);
        free(n->groups[i]->scratch.p[1]);
        free(n->groups[i]);
    }
    free(n->groups);
    dataconn_free(n);
    if (n->inline_n)
        log_msg(LOG_INFO, "net.inline", "ops=%lld mean_us=%.1f", (long long)n->inline_n,
                (double)n->inline_ns / (double)n->inline_n / 1000.0);
    net_epoch_close(n);
    if (n->in_efd >= 0) close(n->in_efd);
    if (n->knock_efd >= 0) close(n->knock_efd);
    /* tasks the engine did not collect are its own memory */
    if (n->out_efd >= 0) close(n->out_efd);
    pthread_mutex_destroy(&n->in_lock);
    pthread_mutex_destroy(&n->out_lock);
    pthread_mutex_destroy(&n->coll_lock);
    free(n);
}
