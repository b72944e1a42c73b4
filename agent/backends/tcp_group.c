/*
 * tcp_group.c: the backend of host groups that span several pods. A matched op (this
 * pod's participants) becomes one net task, lent to the net thread, which runs it with
 * the other pods over TCP (backends/tcp.c) and hands it back; a tiny one the engine
 * may run itself (net_inline). Sends and receives whose partner is in this pod are
 * paired by the group and copied here.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../group.h"
#include "../log.h"
#include "../net.h"
#include "coll/coll.h"

#define NET_LONG_BYTES (64 * 1024) /* a net op this large takes longer than a spin is worth */

/* Engine thread only. */
struct tcp_group {
    struct net_task *pool; /* WIRE_RING_ENTRIES x nslots tasks, each with nslots ops */
    struct op *pool_ops;
    struct net_task *free;
    struct net_task *in_net;  /* lent to the net thread (engine_next list) */
    uint64_t inline_count[3]; /* by net_inline's answer: queued, run here, handed over */
};

static void tcp_stats(const struct group *g, struct backend_stats *out)
{
    const struct tcp_group *x = g->be_ctx;
    out->queued = x->inline_count[0];
    out->inline_ran = x->inline_count[1];
    out->handed_over = x->inline_count[2];
}

static int tcp_probe(char *why, size_t whylen)
{
    snprintf(why, whylen, "always");
    return 0;
}

static int tcp_init(struct group *g)
{
    /* one task per op in flight: every slot may have a ring's worth of sends and
     * receives with other pods, each its own task */
    size_t ntasks = (size_t)WIRE_RING_ENTRIES * (size_t)g->nslots;
    struct tcp_group *x = calloc(1, sizeof(*x));
    if (!x) goto no_memory;
    g->be_ctx = x;
    x->pool = calloc(ntasks, sizeof(struct net_task));
    x->pool_ops = calloc(ntasks * (size_t)g->nslots, sizeof(struct op));
    if (!x->pool || !x->pool_ops) goto no_memory;
    for (size_t i = 0; i < ntasks; i++) {
        x->pool[i].ops = x->pool_ops + i * (size_t)g->nslots;
        x->pool[i].engine_next = x->free;
        x->free = &x->pool[i];
    }
    return 0;
no_memory:
    snprintf(g->backend_why, sizeof(g->backend_why), "out of memory");
    return -1;
}

static void tcp_fini(struct group *g)
{
    struct tcp_group *x = g->be_ctx;
    if (!x) return;
    log_msg(LOG_INFO, "group.stats",
            "group=%s ops_done=%llu ops_failed=%llu inline=%llu handed_over=%llu queued=%llu "
            "direct=%llu leases=%llu read_ahead_lent=%llu read_ahead_back=%llu",
            g->cfg->name, (unsigned long long)g->ops_done, (unsigned long long)g->ops_failed,
            (unsigned long long)x->inline_count[NET_INLINE_DONE],
            (unsigned long long)x->inline_count[NET_INLINE_HANDED],
            (unsigned long long)x->inline_count[NET_INLINE_NO], (unsigned long long)g->direct_ops,
            (unsigned long long)g->leases, (unsigned long long)g->stash_lent,
            (unsigned long long)g->stash_back);
    free(x->pool_ops);
    free(x->pool);
    free(x);
    g->be_ctx = NULL;
}

static int tcp_accept(const struct group *g, int slot, const struct op *op, char *why,
                      size_t whylen)
{
    return backend_check_placement(g, slot, op, -1, why, whylen);
}

static void give_back(struct tcp_group *x, struct net_task *t)
{
    t->nops = 0;
    t->engine_next = x->free;
    x->free = t;
}

/* Lend a matched op (its ops copied into a task) to the net thread; a tiny one the
 * engine may run itself (net_inline) when nothing of the group is with the net thread,
 * which keeps the group's ops in order. Returns the task, NULL when done already. */
static struct net_task *to_net(struct group *g, const struct op *ops, int nops,
                               const struct wire_sqe *s, uint64_t seq, int64_t deadline)
{
    struct tcp_group *x = g->be_ctx;
    struct net_task *t = x->free;
    if (!t) { /* cannot happen: each task holds an op in flight of some session */
        for (int k = 0; k < nops; k++) {
            struct op tmp = ops[k];
            g->op_done(g, &tmp, COLL_ERR_INTERNAL, "no free network task");
        }
        return NULL;
    }
    x->free = t->engine_next;
    struct op *keep = t->ops;
    memset(t, 0, offsetof(struct net_task, ops));
    t->ops = keep;
    t->type = NET_TASK_OP;
    t->group = g->index;
    t->lepoch = g->epoch;
    t->seq = seq;
    t->kind = s->kind;
    t->p2p_noack = s->kind == WIRE_OP_SEND && (s->flags & WIRE_SQE_F_NOACK);
    t->p2p_sig = (uint16_t)wire_sqe_sig(s);
    t->dtype = s->dtype;
    t->redop = s->redop;
    t->root = s->peer;
    t->count = s->count;
    t->deadline_ns = deadline;
    t->nops = nops;
    for (int k = 0; k < nops; k++) {
        t->ops[k] = ops[k];
        int slot = ops[k].rank - g->node_index * g->nslots;
        t->send[slot] = ops[k].send;
        t->recv[slot] = ops[k].recv;
        t->premul[slot] = ops[k].premul;
        t->local_slot = slot;
    }
    if (t->kind == WIRE_OP_RECV && t->root == WIRE_ANY_SOURCE) t->ops[0].any_task = t;
    int rc = NET_INLINE_NO, p2p = s->kind == WIRE_OP_SEND || s->kind == WIRE_OP_RECV;
    if (!x->in_net && !g->mark_busy && !g->mark_pending && nops == g->nslots &&
        !p2p) /* those wait for their partner */
        rc = net_inline(g->net, t);
    else if (p2p && !g->mark_busy && !g->mark_pending && net_p2p_post(g->net, t))
        rc = NET_INLINE_HANDED; /* posted here, finished by whoever hears its partner */
    x->inline_count[rc]++;
    if (rc == NET_INLINE_DONE) {
        for (int k = 0; k < t->nops; k++)
            g->op_done(g, &t->ops[k], t->status, t->why);
        give_back(x, t);
        return NULL;
    }
    t->engine_next = x->in_net;
    x->in_net = t;
    if (rc == NET_INLINE_NO) net_submit(g->net, t);
    return t;
}

static void tcp_collective(struct group *g, struct op *ops, uint64_t seq, int64_t deadline_ns)
{
    to_net(g, ops, g->nslots, &ops[0].sqe, seq, deadline_ns);
}

static int tcp_p2p(struct group *g, struct op *op)
{
    if (op->sqe.peer == WIRE_ANY_SOURCE) { /* kept in the group: its twin waits here */
        op->any_task = to_net(g, op, 1, &op->sqe, op->sqe.p2p_tag, op->deadline_ns);
        return !op->any_task; /* none: to_net failed it */
    }
    if (op->sqe.peer / g->nslots == g->node_index) return 0;      /* the partner is here */
    to_net(g, op, 1, &op->sqe, op->sqe.p2p_tag, op->deadline_ns); /* seq: the tag */
    return 1;
}

void tcp_group_done(struct group *g, struct net_task *t)
{
    struct tcp_group *x = g->be_ctx;
    for (struct net_task **pp = &x->in_net; *pp; pp = &(*pp)->engine_next) {
        if (*pp == t) {
            *pp = t->engine_next;
            break;
        }
    }
    /* a receive from any rank the engine paired in the pod comes back untouched; one
     * nobody claimed (failed) is the net's to complete */
    if (t->kind == WIRE_OP_RECV && t->root == WIRE_ANY_SOURCE && !net_any_claim(t, NET_ANY_NET)) {
        give_back(x, t);
        return;
    }
    for (int k = 0; k < t->nops; k++) {
        if (t->kind == WIRE_OP_RECV) t->ops[k].source = t->source;
        g->op_done(g, &t->ops[k], t->status, t->why);
    }
    give_back(x, t);
}

static int tcp_outstanding(const struct group *g)
{
    const struct tcp_group *x = g->be_ctx;
    int out = 0;
    for (const struct net_task *t = x->in_net; t; t = t->engine_next) {
        out = 1;
        if (t->count * coll_dtype_size((coll_dtype)t->dtype) >= NET_LONG_BYTES) return 2;
    }
    return out;
}

static void tcp_forget(struct group *g, const struct session *s)
{
    struct tcp_group *x = g->be_ctx;
    for (struct net_task *t = x->in_net; t; t = t->engine_next)
        for (int k = 0; k < t->nops; k++)
            if (t->ops[k].s == s) t->ops[k].s = NULL;
}

static int tcp_devices(const struct group *g, int *devs, int max)
{
    (void)g, (void)devs, (void)max;
    return 0;
}

/* Named after the configuration's backend (host); the transport between pods is TCP. */
const struct backend_ops backend_tcp = {
    .name = "host",
    .probe = tcp_probe,
    .init = tcp_init,
    .fini = tcp_fini,
    .accept = tcp_accept,
    .collective = tcp_collective,
    .p2p = tcp_p2p,
    .pair = host_pair,
    .outstanding = tcp_outstanding,
    .forget_session = tcp_forget,
    .devices = tcp_devices,
    .stats = tcp_stats,
};
