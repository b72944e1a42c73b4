/*
 * net_epoch.c: the control plane as the net thread runs it: the ZeroMQ sockets of
 * the rendezvous (ROUTER on the coordinator, DEALER on members, CURVE when keys are
 * set), frames in to each group's state machine (rendezvous.c), its decisions out to
 * the sockets, the data connections and the engine, and what ending an epoch does
 * here: connections closed, ops failed, the engine told.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "coll/coll.h"
#include "net_priv.h"
#include "wire.h"

static void send_rdv(struct net *n, const unsigned char *id, size_t idlen, union rdv_msg *m)
{
    size_t len = rdv_size(m);
    m->h.len = (uint32_t)len;
    if (id) {
        if (!n->router || zmq_send(n->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return;
        zmq_send(n->router, m, len, ZMQ_DONTWAIT);
    } else if (n->dealer) {
        zmq_send(n->dealer, m, len, ZMQ_DONTWAIT);
    }
}

/* ---- the state machine's callbacks (ctx: the group) --------------------------------- */

static void io_send(void *ctx, const unsigned char *id, size_t idlen, union rdv_msg *m)
{
    struct ngroup *g = ctx;
    send_rdv(g->net, id, idlen, m);
}

static void io_send_net(void *ctx, const unsigned char *id, size_t idlen, union rdv_msg *m)
{
    send_rdv(ctx, id, idlen, m);
}

static void io_commit(void *ctx, const struct rdv_commit *c)
{
    struct ngroup *g = ctx;
    struct net *n = g->net;
    g->commit_ns = now_ns();
    g->ready = 0;
    g->ops_done = 0; /* numbers the ops of this epoch, checked in each op's header */
    tcp_acks_reset(g->acks);
    tcp_tune_reset(g->tune);
    g->has_commid = c->has_commid != 0;
    memcpy(g->commid, c->commid, sizeof(g->commid));
    memcpy(g->secret, c->secret, sizeof(g->secret));
    memcpy(g->members, c->members, sizeof(struct rdv_member) * (size_t)g->nodes);
    g->cpu_shared = (c->members[g->me].flags & RDV_MEMBER_CPU_SHARED) != 0;
    pthread_mutex_lock(&n->out_lock);
    g->rdv_s = (double)(g->commit_ns - g->wait_since) / 1e9;
    g->pub_cpu_shared = g->cpu_shared;
    pthread_mutex_unlock(&n->out_lock);
    log_msg(LOG_INFO, "rendezvous.commit",
            "group=%s epoch=%u inc=%016llx nodes=%d node=%d cpu_shared=%d", g->cfg->name,
            c->h.epoch, (unsigned long long)c->h.inc, g->nodes, g->me, g->cpu_shared);
    char why[160];
    if (dataconn_open(n, g, why, sizeof(why)) < 0)
        net_epoch_end(n, g, COLL_ERR_PEER_LOST, why, 0, 1);
}

/* The machine ends the epoch (it already told whom it had to). With drain, ops every
 * pod holds may still complete: a pod that finished an op and then left has delivered
 * its bytes before closing. So run what is queued until it completes or fails on its
 * sockets, and only then end (net_epoch_end_finish). */
static void io_end(void *ctx, int code, const char *why, int drain)
{
    struct ngroup *g = ctx;
    int wait = drain && g->ready && !g->lent && (g->q_head || g->running || g->handoff);
    /* (not for a mismatch, which ends the epoch's ops everywhere, nor a silent pod, whose
     * bytes will not come: the client's op waits for them on its own sockets) */
    if (drain == RDV_DRAIN && g->ready && g->lent && g->lease_w && code != COLL_ERR_MISMATCH) {
        /* lent: the same for the ops the client has under way. Bump drain, then look at
         * busy (the client stores busy, then looks at drain: one of us sees the other).
         * Not busy: end at once (a later op of its fails on the shut sockets and reads
         * why in the region); busy: it gives the lease back when they are done, or by
         * drain_until */
        atomic_fetch_add_explicit(&g->lease_w->drain, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&g->lease_w->busy, memory_order_seq_cst)) {
            wait = 1;
            g->drain_until = now_ns() + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
        }
    }
    if (wait) {
        g->abort_pending = 1;
        g->abort_silent = drain == RDV_DRAIN_SILENT; /* service() ends a running op */
        g->abort_code = code;
        snprintf(g->abort_why, sizeof(g->abort_why), "%s", why);
        log_msg(LOG_INFO, "rendezvous.drain", "group=%s epoch=%u lent=%d reason=\"%s\"",
                g->cfg->name, g->rdv.epoch, g->lent, LOG_Q(why));
        return;
    }
    net_epoch_end(g->net, g, code, why, 0, 0);
}

static void io_random(void *ctx, void *buf, size_t n)
{
    (void)ctx;
    sec_random(buf, n);
}

static int io_commid(void *ctx, uint8_t *id, char *why, size_t whylen)
{
    struct ngroup *g = ctx;
    if (!g->net->ids) {
        snprintf(why, whylen, "no communicator id thread");
        return -1;
    }
    return net_commid_take(g->net->ids, id, why, whylen);
}

static uint64_t group_config_hash(const struct group_config *gc, int data_seal)
{
    char buf[512];
    int len = snprintf(buf, sizeof(buf), "%s|%d|%d|%d|%d|%d|%d|%d|%d", gc->name, gc->backend,
                       gc->members, gc->local_slots, gc->ndevices, gc->op_timeout_ms,
                       gc->join_timeout_ms, gc->heartbeat_ms, data_seal);
    return rdv_fnv1a(buf, (size_t)len, RDV_FNV_INIT);
}

static void io_child_id(void *ctx, uint64_t hash, uint32_t nth, int code, const uint8_t *id,
                        const char *why);

void net_epoch_group_init(struct net *n, struct ngroup *g)
{
    struct rendezvous_settings st = {.group = g->cfg->name,
                                     .pod = n->cfg->node.name,
                                     .data_addr = n->data_addr,
                                     .uid = n->uid,
                                     .nodes = g->nodes,
                                     .me = g->me,
                                     .nlocal = g->nlocal,
                                     .config_hash = group_config_hash(g->cfg, g->seal_mode),
                                     .settings = {.backend = (uint32_t)g->cfg->backend,
                                                  .local_slots = (uint32_t)g->cfg->local_slots,
                                                  .ndevices = (uint32_t)g->cfg->ndevices,
                                                  .op_ms = (uint32_t)g->cfg->op_timeout_ms,
                                                  .join_ms = (uint32_t)g->cfg->join_timeout_ms,
                                                  .heartbeat_ms = (uint32_t)g->cfg->heartbeat_ms,
                                                  .data_seal = (uint32_t)g->seal_mode},
                                     .heartbeat_ms = g->cfg->heartbeat_ms,
                                     .join_ms = g->cfg->join_timeout_ms,
                                     .gpu = g->gpu,
                                     .limit = &n->lim_reject,
                                     .place = n->place};
    struct rendezvous_io io = {.ctx = g,
                               .send = io_send,
                               .commit = io_commit,
                               .end = io_end,
                               .random = io_random,
                               .commid = n->commid ? io_commid : NULL,
                               .child_id = io_child_id};
    g->net = n;
    g->wait_since = now_ns();
    g->joined = -1;
    rendezvous_init(&g->rdv, &st, &io);
}

/* ---- epochs ------------------------------------------------------------------------- */

void net_epoch_end(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                   int tell)
{
    int had = g->rdv.committed;
    g->abort_pending = g->abort_silent = 0;
    int lent = g->lent;
    if (lent) {
        /* the client runs its ops on these sockets: end our side of them under it now (a
         * send of its fails at once, and the pods hear the end), but let it read what the
         * pods sent before they left until the grave closes them (dataconn_bury) */
        for (int p = 0; p < g->nodes; p++) {
            if (g->fds[p] >= 0) shutdown(g->fds[p], SHUT_WR);
            if (g->rfds[p] >= 0) shutdown(g->rfds[p], SHUT_WR);
        }
        g->lent = 0;
        g->lease_w = NULL;
    }
    log_msg(had ? LOG_WARN : LOG_INFO, "rendezvous.abort",
            "group=%s epoch=%u code=\"%s\" reason=\"%s\"", g->cfg->name, g->rdv.epoch,
            coll_strerror((coll_err)code), LOG_Q(why));
    if ((code == COLL_ERR_MISMATCH && had) || lent)
        dataconn_bury(g);
    else
        dataconn_close(g);
    g->ready = 0;
    g->wait_since = now_ns();
    char w[160];
    snprintf(w, sizeof(w), "epoch %u ended: %s", g->rdv.epoch, why);
    net_fail_queue(n, g, code, w);
    p2p_reset(n, g, code, w);
    if (!from_engine) {
        g->awaiting_mark = 1;
        net_post_event(n, g, 1, code, why);
    }
    rendezvous_end(&g->rdv, code, why, tell, now_ns());
}

void net_epoch_end_later(struct net *n, struct ngroup *g, int code, const char *why, int tell)
{
    if (!g->rdv.committed) {
        net_epoch_end(n, g, code, why, 0, tell);
        return;
    }
    rendezvous_fail(&g->rdv, code, why, tell, 1);
}

void net_epoch_end_finish(struct net *n, struct ngroup *g)
{
    if (!g->abort_pending) return;
    g->abort_pending = g->abort_silent = 0;
    net_epoch_end(n, g, g->abort_code, g->abort_why, 0, 0);
}

void net_epoch_op_failed(struct net *n, struct ngroup *g, int code, const char *why)
{
    if (g->rdv.committed) net_epoch_end(n, g, code, why, 0, 1);
}

void net_epoch_formed(struct net *n, struct ngroup *g)
{
    g->ready = 1;
    pthread_mutex_lock(&n->out_lock);
    g->form_s = (double)(now_ns() - g->commit_ns) / 1e9;
    g->formations++;
    pthread_mutex_unlock(&n->out_lock);
    rendezvous_formed(&g->rdv);
    static const char *const seals[] = {"none", "mac", "encrypt"};
    log_msg(LOG_INFO, "group.formed", "group=%s epoch=%u nodes=%d node=%d pairs=%d data=%s",
            g->cfg->name, g->rdv.epoch, g->nodes, g->me, dataconn_pairs(g),
            seals[g->seal_mode % 3]);
    net_post_event(n, g, 0, 0, "formed");
    g->ask_next = 0; /* children's asks that waited for it go now */
    net_epoch_child_timers(n, g, now_ns());
}

/* ---- children across pods (GPU groups) ------------------------------------------------ */

/* The coordinator's answer to one of our asks: the task that asked goes back with it. An
 * answer nobody waits for (asked twice, or its task failed meanwhile) is dropped. */
static void io_child_id(void *ctx, uint64_t hash, uint32_t nth, int code, const uint8_t *id,
                        const char *why)
{
    struct ngroup *g = ctx;
    for (struct net_task **a = &g->ask_head, *prev = NULL; *a; prev = *a, a = &(*a)->next) {
        struct net_task *t = *a;
        if (t->child->hash != hash || t->child->nth != nth) continue;
        *a = t->next;
        if (g->ask_tail == t) g->ask_tail = prev;
        if (code == COLL_OK) memcpy(t->child->commid, id, sizeof(t->child->commid));
        net_return_task(g->net, t, code, why);
        return;
    }
}

void net_epoch_child_ask(struct net *n, struct ngroup *g, struct net_task *t)
{
    t->next = NULL;
    if (!g->gpu) {
        net_return_task(n, t, COLL_ERR_UNSUPPORTED, "not a GPU group");
        return;
    }
    if (g->ask_tail)
        g->ask_tail->next = t;
    else
        g->ask_head = t;
    g->ask_tail = t;
    g->ask_next = 0;
    net_epoch_child_timers(n, g, now_ns());
}

void net_epoch_child_timers(struct net *n, struct ngroup *g, int64_t now)
{
    if (!g->ask_head) return;
    for (struct net_task **a = &g->ask_head, *prev = NULL; *a;) {
        struct net_task *t = *a;
        if (t->deadline_ns > now) {
            prev = t;
            a = &t->next;
            continue;
        }
        *a = t->next;
        if (g->ask_tail == t) g->ask_tail = prev;
        net_return_task(n, t, COLL_ERR_TIMEOUT,
                        "the coordinator gave no id for the child's communicator within join_ms");
    }
    if (!g->ready || g->awaiting_mark || now < g->ask_next) return;
    g->ask_next = now + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
    /* (the coordinator's own asks may be answered at once, taking t off the list) */
    for (struct net_task *t = g->ask_head, *next; t; t = next) {
        next = t->next;
        rendezvous_child_ask(&g->rdv, t->child->ranks, t->child->n, t->child->nth);
    }
}

/* ---- frames ------------------------------------------------------------------------- */

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
                    id ? "member" : "coordinator", len, LOG_Q(why), dropped);
        return;
    }
    struct ngroup *g = group_named(n, m.h.group);
    if (!g) {
        if (id && m.h.type == RDV_JOIN) {
            struct rendezvous_io io = {.ctx = n, .send = io_send_net};
            rendezvous_reject_unknown(&io, id, idlen, &m.join, &n->lim_reject);
        }
        return;
    }
    rendezvous_frame(&g->rdv, id, idlen, &m, now_ns());
}

static void drain_socket(struct net *n, void *sock, int is_router)
{
    for (;;) {
        unsigned char id[RDV_ID_MAX];
        size_t idlen = 0;
        zmq_msg_t msg;
        if (is_router) {
            int r = zmq_recv(sock, id, sizeof(id), ZMQ_DONTWAIT);
            if (r < 0) return;
            idlen = (size_t)(r > RDV_ID_MAX ? RDV_ID_MAX : r);
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

void net_epoch_drain(struct net *n)
{
    if (n->zap) sec_zap_serve(n->zap, &n->keys);
    if (n->router) drain_socket(n, n->router, 1);
    if (n->dealer) drain_socket(n, n->dealer, 0);
}

/* ---- sockets ------------------------------------------------------------------------ */

int net_epoch_open(struct net *n, char *why, size_t whylen)
{
    const struct config *cfg = n->cfg;
    n->zctx = zmq_ctx_new();
    int linger = 0;
    int64_t maxmsg = RDV_FRAME_MAX;
    char ep[CONFIG_ADDR_MAX + 16];
    const char *coord = config_coordinator(cfg);
    /* ZeroMQ's own heartbeats on the control connection, both ends: a coordinator whose
     * node vanished without a reset is dropped after 3 intervals, and the member's
     * reconnect looks its name up again (a new pod, a new IP) */
    n->hb_ms = 600000;
    for (int i = 0; i < cfg->ngroups; i++)
        if (cfg->groups[i].members > 1 && cfg->groups[i].heartbeat_ms < n->hb_ms)
            n->hb_ms = cfg->groups[i].heartbeat_ms;
    int hb = n->hb_ms, hb_timeout = 3 * n->hb_ms;
    if (cfg->node.index == 0) {
        if (n->keys.loaded && !(n->zap = sec_zap_open(n->zctx, why, whylen))) return -1;
        n->router = zmq_socket(n->zctx, ZMQ_ROUTER);
        zmq_setsockopt(n->router, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_setsockopt(n->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        zmq_setsockopt(n->router, ZMQ_HEARTBEAT_IVL, &hb, sizeof(hb));
        zmq_setsockopt(n->router, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof(hb_timeout));
        zmq_setsockopt(n->router, ZMQ_HEARTBEAT_TTL, &hb_timeout, sizeof(hb_timeout));
        if (n->keys.loaded && sec_curve_server(n->router, &n->keys, why, whylen) < 0) return -1;
        snprintf(ep, sizeof(ep), "tcp://%s:%s", cfg->node.address, strrchr(coord, ':') + 1);
        if (zmq_bind(n->router, ep) < 0) {
            snprintf(why, whylen, "rendezvous bind %s: %s", ep, zmq_strerror(zmq_errno()));
            return -1;
        }
    } else {
        n->dealer = zmq_socket(n->zctx, ZMQ_DEALER);
        zmq_setsockopt(n->dealer, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_setsockopt(n->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
        zmq_setsockopt(n->dealer, ZMQ_HEARTBEAT_IVL, &hb, sizeof(hb));
        zmq_setsockopt(n->dealer, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof(hb_timeout));
        zmq_setsockopt(n->dealer, ZMQ_HEARTBEAT_TTL, &hb_timeout, sizeof(hb_timeout));
        if (n->keys.loaded && sec_curve_client(n->dealer, &n->keys, why, whylen) < 0) return -1;
        /* a connect to an address that vanished (the old coordinator's, or one cut off)
         * gives up after 250 ms, and the next attempt, at most 250 ms later, looks the
         * name up again: once the coordinator is reachable again, a member is back within
         * half a second. A SYN the network lost is retried by the kernel only after 1 s,
         * doubling, and at 1 s each the group came back 1.8-2.0 s after an 8 s cut
         * (bench/soak.sh); a cluster's round trip is well under 250 ms */
        int ivl = 100, max = 250, ctimeout = 250, hwm = 8;
        zmq_setsockopt(n->dealer, ZMQ_RECONNECT_IVL, &ivl, sizeof(ivl));
        zmq_setsockopt(n->dealer, ZMQ_RECONNECT_IVL_MAX, &max, sizeof(max));
        zmq_setsockopt(n->dealer, ZMQ_CONNECT_TIMEOUT, &ctimeout, sizeof(ctimeout));
        /* a few frames queue while there is no connection (the first JOIN must not wait
         * a heartbeat for the next), not a backlog that would reach a new coordinator
         * all at once: past 8, sends are dropped (JOINs go out again anyway) */
        zmq_setsockopt(n->dealer, ZMQ_SNDHWM, &hwm, sizeof(hwm));
        snprintf(ep, sizeof(ep), "tcp://%s", coord);
        if (zmq_connect(n->dealer, ep) < 0) {
            snprintf(why, whylen, "rendezvous connect %s: %s", ep, zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    log_msg(LOG_INFO, "net.start", "node=%d rendezvous=%s role=%s data=%s curve=%s",
            cfg->node.index, ep, cfg->node.index == 0 ? "coordinator" : "member", n->data_addr,
            n->keys.loaded ? "on" : "off");
    return 0;
}

void net_epoch_close(struct net *n)
{
    int linger = 200; /* LEAVE and the coordinator's ABORT get this long to go out */
    if (n->router) zmq_setsockopt(n->router, ZMQ_LINGER, &linger, sizeof(linger));
    if (n->dealer) zmq_setsockopt(n->dealer, ZMQ_LINGER, &linger, sizeof(linger));
    if (n->router) zmq_close(n->router);
    if (n->dealer) zmq_close(n->dealer);
    if (n->zap) zmq_close(n->zap);
    if (n->zctx) zmq_ctx_term(n->zctx);
    n->router = n->dealer = n->zap = n->zctx = NULL;
}

const struct net_epoch_calls net_epoch_calls = {
    .end = net_epoch_end,
    .end_later = net_epoch_end_later,
    .formed = net_epoch_formed,
};
