/*
 * group_p2p.c: sends and receives that pair within the pod, and receives from any rank.
 * A send meets the receive posted first that takes it (one that names its rank, or one
 * from any rank); a receive the first send kept for it. What waits is kept in the
 * group's lists (p2p_*: sends and named receives, any_*: receives from any rank), one
 * pool entry each, until its partner comes, the epoch ends or its deadline passes.
 *
 * A receive from any rank in a group across pods is also lent, as a twin, to the net
 * thread, where another pod's message may take it. Each side claims it before it takes a
 * send for it (net.h: net_any_claim); the net thread gives back a twin the engine paired,
 * untouched, and the entry here of one the net thread completed goes with its completion
 * (group_p2p_twin_done).
 */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "group.h"
#include "log.h"

void group_describe(const struct wire_sqe *s, char *buf, size_t n)
{
    char sig[48];
    if (s->flags & WIRE_SQE_F_SIG) /* a part of a collective: which one */
        snprintf(buf, n, "%s %s count=%llu of=\"%s\" peer=%d", wire_kind_name(s->kind),
                 coll_dtype_name((coll_dtype)s->dtype), (unsigned long long)s->count,
                 wire_sig_name(s->redop, sig, sizeof(sig)), s->peer);
    else
        snprintf(buf, n, "%s %s count=%llu op=%s root=%d", wire_kind_name(s->kind),
                 coll_dtype_name((coll_dtype)s->dtype), (unsigned long long)s->count,
                 coll_redop_name((coll_redop)s->redop), s->peer);
}

/* Whether receive r (from its peer, or any rank) takes send s. */
static int p2p_takes(const struct op *r, const struct op *s)
{
    return s->sqe.peer == r->rank && s->sqe.p2p_tag == r->sqe.p2p_tag &&
           (r->sqe.peer == WIRE_ANY_SOURCE || r->sqe.peer == s->rank);
}

/* A send and its receive, both of this pod: move the data, complete both. */
static void p2p_pair(struct group *g, struct op *snd, struct op *rcv)
{
    int status = COLL_OK;
    unsigned ss = wire_sqe_sig(&snd->sqe), rs = wire_sqe_sig(&rcv->sqe);
    char why[160] = "";
    if (snd->sqe.count != rcv->sqe.count || snd->sqe.dtype != rcv->sqe.dtype || ss != rs) {
        char a[128], b[128];
        group_describe(&snd->sqe, a, sizeof(a));
        group_describe(&rcv->sqe, b, sizeof(b));
        log_msg(LOG_WARN, "group.mismatch", "group=%s send=\"%s\" recv=\"%s\"", g->cfg->name, a, b);
        status = COLL_ERR_MISMATCH;
        if (ss != rs) wire_sig_why(why, sizeof(why), snd->rank, ss, rcv->rank, rs);
    } else {
        status = g->be->pair(g, snd, rcv);
    }
    rcv->source = snd->rank;
    g->op_done(g, snd, status, why[0] ? why : NULL);
    g->op_done(g, rcv, status, why[0] ? why : NULL);
}

/* The first op of list that pairs with op (a send: a receive that takes it; a receive:
 * a send it takes); NULL if none. A receive from any rank whose twin the net thread
 * claimed is skipped: it completes there. */
static struct op *p2p_find(struct op *list, const struct op *op)
{
    int is_send = op->sqe.kind == WIRE_OP_SEND;
    for (struct op *o = list; o; o = o->next) {
        if ((o->sqe.kind == WIRE_OP_SEND) == is_send ||
            !(is_send ? p2p_takes(o, op) : p2p_takes(op, o)))
            continue;
        if (o->any_task && atomic_load(&o->any_task->any_claim) == NET_ANY_NET) continue;
        return o;
    }
    return NULL;
}

/* Take o out of list (head, tail); 1 if it was there. */
static int p2p_unlink(struct op **head, struct op **tail, struct op *o)
{
    struct op *prev = NULL;
    for (struct op **pp = head; *pp; prev = *pp, pp = &(*pp)->next) {
        if (*pp != o) continue;
        *pp = o->next;
        if (*tail == o) *tail = prev;
        o->next = NULL;
        return 1;
    }
    return 0;
}

static struct op *p2p_keep(struct group *g, struct op *op, struct op **head, struct op **tail)
{
    struct op *q = g->p2p_free;
    if (!q) {
        g->op_done(g, op, COLL_ERR_LIMIT, "too many sends and receives wait for their partners");
        return NULL;
    }
    g->p2p_free = q->next;
    *q = *op;
    q->next = NULL;
    if (*tail)
        (*tail)->next = q;
    else
        *head = q;
    *tail = q;
    return q;
}

static void p2p_release(struct group *g, struct op *o)
{
    o->next = g->p2p_free;
    g->p2p_free = o;
}

/* A send or receive whose partner is in this pod, or a receive from any rank: paired
 * with the first that waits for it (a send: the receive posted first, named or from any
 * rank), else kept until one comes. A receive from any rank also lends its twin to the
 * net thread (the backend's p2p), and the side that claims it first completes it. */
void group_p2p_submit(struct group *g, struct op *op)
{
    op->p2p_no = g->p2p_count++;
    int any = op->sqe.kind == WIRE_OP_RECV && op->sqe.peer == WIRE_ANY_SOURCE;
    if (!any && g->be->p2p(g, op)) return; /* the backend pairs it (another pod, or NCCL) */
    struct op *o = p2p_find(g->p2p_head, op);
    int from_any = 0;
    while (op->sqe.kind == WIRE_OP_SEND) { /* ... or a receive from any rank that came first */
        struct op *a = p2p_find(g->any_head, op);
        if (!a || (o && o->p2p_no < a->p2p_no)) break;
        /* a failed claim is the net's (p2p_find skips it from now on) */
        if (a->any_task && !net_any_claim(a->any_task, NET_ANY_ENGINE)) continue;
        if (a->any_task) net_knock(g->net); /* its twin comes back at the net's next turn */
        o = a;
        from_any = 1;
        break;
    }
    if (o) {
        if (from_any)
            p2p_unlink(&g->any_head, &g->any_tail, o);
        else
            p2p_unlink(&g->p2p_head, &g->p2p_tail, o);
        p2p_pair(g, op->sqe.kind == WIRE_OP_SEND ? op : o, op->sqe.kind == WIRE_OP_SEND ? o : op);
        p2p_release(g, o);
        return;
    }
    if (!any) {
        p2p_keep(g, op, &g->p2p_head, &g->p2p_tail);
        return;
    }
    struct op *q = p2p_keep(g, op, &g->any_head, &g->any_tail);
    if (q && g->be->p2p(g, q)) { /* the backend failed it: kept no more */
        p2p_unlink(&g->any_head, &g->any_tail, q);
        p2p_release(g, q);
    }
}

int group_p2p_fail(struct group *g, int err, const char *why)
{
    int failed = 0;
    while (g->p2p_head) {
        struct op *op = g->p2p_head;
        g->p2p_head = op->next;
        g->op_done(g, op, err, why);
        p2p_release(g, op);
        failed++;
    }
    g->p2p_tail = NULL;
    while (g->any_head) { /* one whose twin the net claimed completes there */
        struct op *op = g->any_head;
        g->any_head = op->next;
        if (!op->any_task || net_any_claim(op->any_task, NET_ANY_ENGINE)) {
            op->any_task = NULL;
            g->op_done(g, op, err, why);
            failed++;
        }
        p2p_release(g, op);
    }
    g->any_tail = NULL;
    return failed;
}

void group_p2p_twin_done(struct group *g, const struct op *op)
{
    for (struct op *o = g->any_head; o; o = o->next) {
        if (o == op || o->any_task != op->any_task) continue;
        p2p_unlink(&g->any_head, &g->any_tail, o);
        p2p_release(g, o);
        return;
    }
}

/* The one whose deadline group_p2p_deadline gives: the oldest kept op (a receive from
 * any rank with a twin: the net thread keeps its time). */
static const struct op *p2p_oldest(const struct group *g)
{
    const struct op *a = g->any_head && !g->any_head->any_task ? g->any_head : NULL;
    const struct op *p = g->p2p_head;
    if (!a) return p;
    if (!p) return a;
    return a->deadline_ns < p->deadline_ns ? a : p;
}

int64_t group_p2p_deadline(const struct group *g)
{
    const struct op *o = p2p_oldest(g);
    return o ? o->deadline_ns : INT64_MAX;
}

void group_p2p_late(const struct group *g, char *why, size_t n)
{
    const struct op *o = p2p_oldest(g);
    if (!o)
        snprintf(why, n, "no send or receive is late");
    else if (o->sqe.peer == WIRE_ANY_SOURCE)
        snprintf(why, n, "a receive from any rank on rank %d found no send in %d ms", o->rank,
                 o->timeout_ms);
    else
        snprintf(why, n, "%s from rank %d to rank %d found no partner in %d ms",
                 wire_kind_name(o->sqe.kind), o->rank, o->sqe.peer, o->timeout_ms);
}
