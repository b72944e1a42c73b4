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

/* The engine gives a tiny op at most this long (spinning, then asleep on it: tcp.h's
 * nap), then hands it over to the net thread; sooner when it has other work or the net
 * thread wants coll_lock */
#define INLINE_BUDGET_NS 20000000LL

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
    net_epoch_child_timers(n, g, t);
    char why[160];
    p2p_purge(n, g);
    if (p2p_oldest_deadline(g) <= t) {
        snprintf(why, sizeof(why), "a send or receive found no partner within its op timeout");
        net_epoch_end(n, g, COLL_ERR_TIMEOUT, why, 0, g->rdv.committed);
        return;
    }
    if (g->q_head && g->q_head->deadline_ns <= t) {
        snprintf(why, sizeof(why), "op %llu waited its op timeout for the group to form",
                 (unsigned long long)g->q_head->seq);
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
static void post_queued_p2p(struct net *n, struct ngroup *g);

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
    net_take_p2p(n); /* the engine's sends and receives wait for no collective */
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *o = n->groups[i];
        if (!o) continue;
        post_queued_p2p(n, o);
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
    return (struct tcp_comm){.io = g->seal_mode ? &g->seal_io : NULL,
                             .service = service,
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

/* Which pods t talks to, in g->need; 0 when it talks to every pod and all pairs are up
 * since formation. Called with coll_lock. */
static int mark_needed(struct ngroup *g, const struct net_task *t)
{
    if (g->nodes <= TCP_EAGER_ALL) return 0; /* all connected at formation */
    memset(g->need, 0, (size_t)g->nodes);
    tcp_op_peers(g->nodes, g->me, g->nlocal, t, g->need);
    return 1;
}

/* Whether the pairs t needs are up, without asking for any (the engine's inline run:
 * it never enters the connection code). */
static int pairs_up(struct ngroup *g, const struct net_task *t)
{
    if (!mark_needed(g, t)) return 1;
    for (int p = 0; p < g->nodes; p++)
        if (g->need[p] && (g->fds[p] < 0 || g->rfds[p] < 0 || g->pfds[p] < 0)) return 0;
    return 1;
}

/* Whether the pairs t needs are up, asking for the missing ones (the net thread). */
static int peers_ready(struct net *n, struct ngroup *g, const struct net_task *t)
{
    return !mark_needed(g, t) || dataconn_need(n, g, g->need);
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
        !g->handoff && !g->inline_abort && !g->lent && t->lepoch >= g->floor && pairs_up(g, t)) {
        struct tcp_comm c = comm_for(g, t);
        t->order = atomic_fetch_add_explicit(&n->order, 1, memory_order_relaxed) + 1;
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
            for (struct net_task **a = &g->ask_head, *prev = NULL; *a;) {
                struct net_task *x = *a;
                if (x->lepoch >= g->floor) {
                    prev = x;
                    a = &x->next;
                    continue;
                }
                *a = x->next;
                if (g->ask_tail == x) g->ask_tail = prev;
                net_return_task(n, x, COLL_ERR_EPOCH, "asked in an epoch that has ended");
            }
            net_return_task(n, t, COLL_OK, NULL);
        } else if (t->lepoch < g->floor) {
            net_return_task(n, t, COLL_ERR_EPOCH, "submitted in an epoch that has ended");
        } else if (t->type == NET_TASK_CHILD) {
            net_epoch_child_ask(n, g, t);
        } else {
            t->next = NULL;
            if (g->q_tail)
                g->q_tail->next = t;
            else
                g->q_head = t;
            g->q_tail = t;
            g->q_p2p += net_task_is_p2p(t);
        }
        t = next;
    }
}

/* Send or receive t (off the queue) posted: it waits for its connection, which it asks
 * for; the group's epoch ended (posting an earlier one may end it): handed back. */
static void post_one(struct net *n, struct ngroup *g, struct net_task *t)
{
    t->next = NULL; /* off every list */
    peers_ready(n, g, t);
    if (g->ready)
        p2p_post(n, g, t);
    else
        net_return_task(n, t, COLL_ERR_PEER_LOST, "the group's epoch ended");
}

/* g's queued sends and receives, posted in their order, wherever they stand in the
 * queue: they go on connections of their own (pfds), and the pods post them in orders of
 * their own, so one never waits behind a collective that this pod holds (its peers may
 * be waiting for the send before they join the collective: a child's two-step allreduce
 * and then an op of its parent). The collectives stay queued in their order. */
static void post_queued_p2p(struct net *n, struct ngroup *g)
{
    if (!g->q_p2p || !g->ready || g->awaiting_mark) return;
    g->q_p2p = 0; /* it may count some the queue no longer holds (ended epochs): a look */
    struct net_task *took = net_split_p2p(n, &g->q_head, &g->q_tail); /* (no marks here) */
    while (took) {
        struct net_task *t = took;
        took = t->next;
        post_one(n, g, t);
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

/* The formed group whose collective comes next, *handoff whether it is the tiny op the
 * engine started (g->handoff) or else its queue's head; NULL: none. Of them all, the one
 * the engine handed over first (order): pods whose ranks submit the ops of several groups
 * in one order run them in that order, whatever each net thread's turns took at once (by
 * group index, two pods once ran 8 MiB allreduces of two groups in opposite orders, each
 * waiting for the other until op_ms). Sends and receives are posted on the way. */
static struct ngroup *next_op(struct net *n, int *handoff)
{
    struct ngroup *best = NULL;
    uint64_t first = UINT64_MAX;
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        if (!g) continue;
        post_queued_p2p(n, g);
        while (g->ready && !g->awaiting_mark && g->q_head && net_task_is_p2p(g->q_head)) {
            struct net_task *t = g->q_head; /* every one is counted: defensive only */
            g->q_head = t->next;
            if (!g->q_head) g->q_tail = NULL;
            post_one(n, g, t);
        }
        if (!g->ready) continue;
        const struct net_task *t = g->handoff ? g->handoff : !g->awaiting_mark ? g->q_head : NULL;
        if (t && t->order < first) {
            first = t->order;
            best = g;
            *handoff = g->handoff != NULL;
        }
    }
    return best;
}

/* Ends what op t of g left: its status back to the engine, the epoch's end it waited for
 * (after a handoff at once, else once the queue drained or an op failed), or the one its
 * failure starts. */
static void op_ran(struct net *n, struct ngroup *g, struct net_task *t, int handoff, int st,
                   const char *why)
{
    tcp_tune_end(g->tune, st == COLL_OK, now_ns());
    g->running = NULL;
    if (handoff) g->handoff = NULL;
    net_return_task(n, t, st, why); /* t is the engine's from here on */
    g->ops_done++;
    if (g->abort_pending && (handoff || st != COLL_OK || !g->q_head))
        net_epoch_end_finish(n, g);
    else if (st != COLL_OK)
        net_epoch_op_failed(n, g, st, why[0] ? why : coll_strerror((coll_err)st));
}

/* The formed groups' collectives, in the order the engine handed them over (next_op), each
 * to its end. Returns the number of ops started. */
static int run_ready_ops(struct net *n)
{
    int ran = 0, handoff = 0;
    struct ngroup *g;
    while ((g = next_op(n, &handoff)) != NULL) {
        char why[160] = "";
        if (handoff) { /* a tiny op the engine started */
            struct net_task *t = g->handoff;
            struct tcp_comm c = comm_for(g, t);
            g->running = t;
            op_ran(n, g, t, 1, run_op(n, &c, t, 1, why, sizeof(why)), why);
            ran++;
            continue;
        }
        struct net_task *t = g->q_head;
        if (g->lent) { /* the client holds the connections: it gives them back first */
            g->q_head = t->next;
            if (!g->q_head) g->q_tail = NULL;
            net_return_task(n, t, COLL_ERR_INVALID,
                            "the group's connections are lent to its client (direct ops): "
                            "it gives them back before any other collective");
            continue;
        }
        /* its pairs first: the op waits in the queue (its deadline runs) while they
         * connect, and the ops handed over after it wait too (they would run in another
         * order than on the pods that have the pairs) */
        if (!peers_ready(n, g, t)) break;
        struct tcp_comm c = comm_for(g, t);
        /* off the queue while it runs: an abort meanwhile must not hand it back to the
         * engine while its buffers are in use */
        g->q_head = t->next;
        if (!g->q_head) g->q_tail = NULL;
        g->running = t;
        ran++;
        c.short_spin = tcp_tune_start(g->tune, t, now_ns());
        op_ran(n, g, t, 0, run_op(n, &c, t, 0, why, sizeof(why)), why);
    }
    return ran;
}

/* ---- the loop -------------------------------------------------------------------------- */

/* Whether to spin on instead of sleeping: ops flowed within the learnt budget and the
 * engine has handed nothing over (spin.h), like the engine's own loop. */
static int spin_on(struct net *n, int64_t last_work, int64_t budget)
{
    int64_t now = now_ns();
    if (now - last_work >= budget || atomic_load_explicit(&n->in_pending, memory_order_acquire))
        return 0;
    spin_relax(n->gate, now);
    return 1;
}

/* The poll set: every P2P connection of a formed group, every connection on its way up,
 * then the fixed ones (ZAP, the rendezvous socket, the data listener, the engine's
 * eventfd) and the accepts pending. The fixed ones and the accepts are counted first, so
 * the bound holds whatever this node is (ITEMS_MAX). *retry: a connection is to be
 * opened again shortly (the peer said NOT_YET), so the wait must be short. */
static int poll_set(struct net *n, zmq_pollitem_t *items, int *retry)
{
    void *fixed_socks[3] = {n->zap, n->router, n->dealer};
    int fixed = 2; /* the data listener and the engine's eventfd */
    for (int k = 0; k < 3; k++)
        fixed += fixed_socks[k] != NULL;
    for (int i = 0; i < n->npend; i++)
        fixed += n->pend[i].fd >= 0;
    int room = ITEMS_MAX - fixed, ni = 0;
    *retry = 0;
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        for (int p = 0; g && g->ready && p < g->nodes && ni < room; p++)
            if (g->pfds[p] >= 0)
                items[ni++] = (zmq_pollitem_t){
                    .fd = g->pfds[p],
                    .events = (short)((g->in[p].parked ? 0 : ZMQ_POLLIN) |
                                      (g->out[p].head || g->out[p].nacks ? ZMQ_POLLOUT : 0))};
    }
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        for (int k = 0; g && k < g->nog && ni < room; k++) {
            if (g->og[k].fd < 0) {
                *retry = 1;
                continue;
            }
            items[ni++] =
                (zmq_pollitem_t){.fd = g->og[k].fd,
                                 .events = (short)(g->og[k].connected ? ZMQ_POLLIN : ZMQ_POLLOUT)};
        }
    }
    for (int k = 0; k < 3; k++)
        if (fixed_socks[k])
            items[ni++] = (zmq_pollitem_t){.socket = fixed_socks[k], .events = ZMQ_POLLIN};
    items[ni++] = (zmq_pollitem_t){.fd = n->lfd, .events = ZMQ_POLLIN};
    items[ni++] = (zmq_pollitem_t){.fd = n->in_efd, .events = ZMQ_POLLIN};
    for (int i = 0; i < n->npend; i++)
        if (n->pend[i].fd >= 0)
            items[ni++] = (zmq_pollitem_t){.fd = n->pend[i].fd, .events = ZMQ_POLLIN};
    return ni;
}

/* Sleep in zmq_poll until a socket is ready, the engine knocks or a short while passes
 * (not at all when the engine has work pending); *slept: whether it slept. */
static void wait_for_work(struct net *n, zmq_pollitem_t *items, int ni, int retry, int *slept)
{
    atomic_store_explicit(&n->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    int busy = atomic_load_explicit(&n->in_pending, memory_order_relaxed);
    *slept |= !busy;
    zmq_poll(items, ni, busy ? 0 : retry ? 1 : 20);
    atomic_store_explicit(&n->sleeping, 0, memory_order_relaxed);
}

/* What the engine left while it ran a tiny op inline (an abort to act on), and the
 * connections of ended epochs whose grace is over. */
static void settle_inline(struct net *n)
{
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        if (g && g->inline_abort) {
            int code = g->inline_abort;
            g->inline_abort = 0;
            net_epoch_op_failed(n, g, code, g->inline_why);
        }
        if (g && g->ngrave && now_ns() >= g->grave_until) dataconn_close_grave(g);
    }
}

/* Connections: the rendezvous drained, accepts taken, those on their way up moved on. */
static void move_connections(struct net *n)
{
    net_epoch_drain(n);
    dataconn_accept(n);
    dataconn_progress_pending(n);
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i] && n->groups[i]->nog) dataconn_progress_outgoing(n, n->groups[i]);
}

/* Each group's timers (heartbeats, deadlines) and its sends and receives. */
static void move_groups(struct net *n, int64_t t)
{
    for (int i = 0; i < n->ngroups; i++) {
        if (!n->groups[i]) continue;
        timers(n, n->groups[i], t);
        p2p_progress(n, n->groups[i]);
    }
}

/* Epochs whose end waited for their queue to drain (or for a lender that never gave
 * back), ended. */
static void end_drained_epochs(struct net *n)
{
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        if (g && g->abort_pending && !g->handoff && (!g->q_head || !g->ready || g->awaiting_mark) &&
            (!g->lent || now_ns() >= g->drain_until))
            net_epoch_end_finish(n, g); /* lent: the client gave up, or never gave back */
    }
}

/* Stopping: say goodbye (LEAVE, or the coordinator's ABORT), so that peers move on at
 * once instead of waiting for silence (the sockets linger briefly to send it), then
 * hand back everything. */
static void stop_groups(struct net *n)
{
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i]) rendezvous_leave(&n->groups[i]->rdv);
    pthread_mutex_lock(&n->coll_lock);
    take_engine_tasks(n);
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i]) {
            net_fail_queue(n, n->groups[i], COLL_ERR_SHUTDOWN, "the agent is stopping");
            p2p_reset(n, n->groups[i], COLL_ERR_SHUTDOWN, "the agent is stopping");
        }
    pthread_mutex_unlock(&n->coll_lock);
}

/* The net thread: spin or sleep, then, holding coll_lock (the engine may run a tiny op
 * inline meanwhile, asleep in it), one turn of every step. */
void *net_main(void *arg)
{
    struct net *n = arg;
    int64_t last_work = 0, budget = 0;
    int slept = 0; /* since the last op ran */
    /* the poll set, made at the end of each turn under coll_lock: the engine's turn at
     * sends and receives changes what a pod's connection waits for meanwhile, and knocks
     * when the set no longer does (a fresh lock here would knock an engine asleep in a
     * tiny op into handing it over) */
    zmq_pollitem_t items[ITEMS_MAX];
    int retry, ni;
    lock_from_engine(n);
    ni = poll_set(n, items, &retry);
    pthread_mutex_unlock(&n->coll_lock);
    while (!atomic_load(&n->stop)) {
        atomic_store_explicit(&n->alive_ns, now_ns(), memory_order_relaxed);
        if (spin_on(n, last_work, budget)) continue;
        wait_for_work(n, items, ni, retry, &slept);
        lock_from_engine(n);
        settle_inline(n);
        move_connections(n);
        take_engine_tasks(n);
        int64_t t = now_ns();
        move_groups(n, t);
        if (run_ready_ops(n)) {
            spin_learn(&n->idle, !slept, (int32_t)n->spin_cap);
            budget = spin_budget(&n->idle);
            slept = 0;
            last_work = now_ns();
        }
        net_discovery_tick(n, t);
        end_drained_epochs(n);
        ni = poll_set(n, items, &retry);
        pthread_mutex_unlock(&n->coll_lock);
    }
    stop_groups(n);
    return NULL;
}
