/*
 * tcp_tiny.c: tiny ops between pods (tcp.h: TCP_TINY_BYTES and the pair and doubling
 * limits) as resumable state, so that the engine can run one with a time budget and
 * hand it, half done, to the net thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reduce.h"
#include "coll/coll.h"
#include "tcp_priv.h"
#include "wire.h"

/* ---- tiny ops, resumable ------------------------------------------------------------ */

/*
 * An allreduce of a few KiB or a barrier is one direct exchange between the local
 * reduction and the pod-order reduction, or, when the number of pods is a power of two
 * of at least 4, recursive doubling: in step k each pod swaps its running result with
 * pod (me XOR 2^k) and folds the other's into its own, so every pod sends log2(pods)
 * messages instead of pods - 1 (on small machines each send is several microseconds of
 * CPU). Every pod combines the same two operands at each step, and the reductions are
 * commutative, so all pods hold the same bits. Allgather doubles the same way (swapping
 * the 2^k blocks each side has), and reduce_scatter halves (giving away the half of its
 * remaining blocks that the partner keeps, folding in the partner's copy of its own).
 * Small reduces, reduce_scatters and all-to-alls are one direct exchange each. The
 * op's state lives in struct tcp_tiny, so the engine thread can start it and, if the
 * peers are slow, hand it to the net thread half done (tcp_tiny_progress picks up where
 * the last call stopped).
 */

/* Set up step s->step of doubling (allreduce, allgather) or halving (reduce_scatter)
 * with the partner of that step; what arrives is folded in as it comes. */
static void rd_step(struct tcp_tiny *s)
{
    int me = s->c.me, p;
    size_t hl = sizeof(s->o.hdr), b = s->bytes;
    s->nx = 0;
    if (s->o.t->kind == WIRE_OP_ALLGATHER) {
        /* both sides hold 2^step blocks (of bytes each), aligned: swap them (step 0 may
         * send our input from where it is, copying it into place as it goes) */
        int w = 1 << s->step;
        p = me ^ w;
        char *mine = s->vec + (size_t)(me & ~(w - 1)) * b;
        char *theirs = s->vec + (size_t)(p & ~(w - 1)) * b;
        tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, hl, b ? s->src ? s->src : mine : NULL,
                   (size_t)w * b);
        if (s->src) s->x[0].copy_to = mine;
        s->src = NULL;
        tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], hl, b ? theirs : NULL, (size_t)w * b);
        return;
    }
    if (s->o.t->kind == WIRE_OP_REDUCE_SCATTER) {
        /* recursive halving: of the 2h blocks still ours, give the partner the half that
         * holds its block and fold its copy of our half into ours */
        int h = s->c.nodes >> (s->step + 1), lo = me & ~(2 * h - 1);
        int keep = me & h ? lo + h : lo, give = me & h ? lo : lo + h;
        /* the first step reads our contribution where it is; the last folds our block
         * where it ends (keep is then me) */
        const char *from = s->step == 0 ? s->src : s->vec;
        p = me ^ h;
        tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, hl, b ? from + (size_t)give * b : NULL,
                   (size_t)h * b);
        tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], hl, b ? s->tmp + (size_t)keep * b : NULL,
                   (size_t)h * b);
        if (b)
            tcp_x_fold(&s->x[1], s->step == s->nsteps - 1 ? s->out : s->vec + (size_t)keep * b,
                       from + (size_t)keep * b);
        return;
    }
    /* the first step may send our input where it is and fold into the result beside it;
     * later ones send the running result, folding only behind what has gone */
    const char *from = s->step == 0 && s->src ? s->src : s->vec;
    p = me ^ (1 << s->step);
    if (!s->vec) b = 0;
    tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, hl, b ? from : NULL, b);
    tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], hl, b ? s->tmp : NULL, b);
    if (b) {
        tcp_x_fold(&s->x[1], s->vec, from != s->vec ? from : NULL);
        if (from == s->vec) s->x[1].red_after = &s->x[0];
    }
}

/* Recursive doubling (allreduce, allgather) or halving (reduce_scatter): for a power of
 * two of at least 4 pods, where log2(pods) messages per pod beat pods - 1. */
static int doubling(const struct tcp_comm *c)
{
    return c->nodes >= 4 && (c->nodes & (c->nodes - 1)) == 0;
}

/* Doubling or halving for an op of per_pod bytes per pod: below TCP_DIRECT_BYTES one
 * direct exchange with every pod is faster (one wait instead of log2(pods) in a row:
 * on a node whose CPUs go idle between messages each wait is a wake-up, 30-57 us on
 * the VMs measured; bench/RESULTS.md). Only where every pair is connected anyway. */
static int use_doubling(const struct tcp_comm *c, size_t per_pod)
{
    return doubling(c) && (per_pod > TCP_DIRECT_BYTES || c->nodes > TCP_EAGER_ALL);
}

static void start_steps(struct tcp_tiny *s, char *vec, size_t bytes)
{
    s->nsteps = 0;
    while ((1 << s->nsteps) < s->c.nodes)
        s->nsteps++;
    s->step = 0;
    s->vec = vec;
    s->bytes = bytes;
    rd_step(s);
}

size_t tcp_tiny_size(void)
{
    return sizeof(struct tcp_tiny);
}

int tcp_tiny_fits(const struct tcp_comm *c, const struct net_task *t)
{
    size_t es = coll_dtype_size((coll_dtype)t->dtype);
    size_t bytes = t->count * es, L = (size_t)c->nlocal;
    /* two pods exchange no more than a ring would: the direct way serves mid sizes too;
     * doubling and halving serve mid sizes among 4, 8, ... pods */
    size_t ar_limit = c->nodes == 2 ? TCP_PAIR_ALLREDUCE_BYTES
                      : doubling(c) ? TCP_DOUBLING_ALLREDUCE_BYTES
                                    : TCP_TINY_BYTES;
    size_t vec_limit = doubling(c)     ? TCP_DOUBLING_BYTES
                       : c->nodes == 2 ? TCP_PAIR_INLINE_BYTES
                                       : TCP_TINY_BYTES;
    /* an allgather between two pods sends each block once: the pair limit per block */
    if (c->nodes == 2 && t->kind == WIRE_OP_ALLGATHER) vec_limit = 2 * TCP_PAIR_INLINE_BYTES;
    /* a broadcast between two pods is one send however it goes (the chain has nothing to
     * relay): the pair limit; among more, the chain's */
    size_t bc_limit = c->nodes == 2 ? TCP_PAIR_INLINE_BYTES : TCP_CHAIN_INLINE_BYTES;
    int ok = t->kind == WIRE_OP_BARRIER || (t->kind == WIRE_OP_ALLREDUCE && bytes <= ar_limit) ||
             (t->kind == WIRE_OP_BROADCAST && bytes <= bc_limit) ||
             (t->kind == WIRE_OP_REDUCE && bytes <= TCP_TINY_BYTES) ||
             ((t->kind == WIRE_OP_ALLGATHER || t->kind == WIRE_OP_REDUCE_SCATTER) &&
              bytes * L * (size_t)c->nodes <= vec_limit) ||
             (t->kind == WIRE_OP_ALLTOALL && bytes * L * L * (size_t)c->nodes <= TCP_TINY_BYTES);
    return ok;
}

static int tiny_setup(struct tcp_tiny *s, const struct tcp_comm *c, struct net_task *t)
{
    size_t es = coll_dtype_size((coll_dtype)t->dtype);
    size_t bytes = t->count * es, L = (size_t)c->nlocal;
    if (!tcp_tiny_fits(c, t)) return -1;
    s->c = *c;
    tcp_init_ctx(&s->o, &s->c, t, s->why, sizeof(s->why));
    s->why[0] = '\0';
    s->nx = 0;
    s->tmp = NULL;
    s->nsteps = 0;
    s->src = NULL;
    if (t->kind == WIRE_OP_BROADCAST) {
        int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
        char *buf = t->recv[0];
        /* every pod hears every pod it deals with, so pods that disagree on the root (or
         * count) all fail with MISMATCH instead of sending past each other and reporting
         * success (in a run of the same broadcast, every TCP_ACK_EVERY-th op only, taken
         * later: tcp.h) */
        int plan = tcp_ack_plan(&s->c, &s->o.hdr);
        if (c->nodes > 2) { /* the chain, as the net thread's, at every size (measured) */
            s->nx = tcp_bcast_chain(&s->o, plan, s->x);
            return 0;
        }
        /* two pods: one send, and a bare header back to the root */
        if (c->me == rnode) {
            /* an input apart from the result is sent from where it is and copied into
             * place by the first send (tcp_priv.h: TCP_COPY_AS_SENT_BYTES) */
            const char *own =
                bytes >= TCP_COPY_AS_SENT_BYTES && tcp_apart(t->send[rslot], bytes, buf, bytes)
                    ? t->send[rslot]
                    : NULL;
            if (!own && t->send[rslot] != buf && bytes) memcpy(buf, t->send[rslot], bytes);
            for (int p = 0; p < c->nodes; p++) {
                if (p == c->me) continue;
                tcp_x_send(&s->x[s->nx], p, &s->o.hdr, sizeof(s->o.hdr), own ? own : buf, bytes);
                if (own && s->nx == 0) s->x[0].copy_to = buf;
                s->nx++;
                if (plan == TCP_ACK_LATE)
                    tcp_owe(&s->c, p, &s->o.hdr);
                else if (!plan)
                    tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr), NULL, 0);
            }
            s->o.late_acks = plan != 0;
        } else {
            tcp_x_recv(&s->x[s->nx++], rnode, &s->o.peer_hdr[rnode], sizeof(s->o.hdr), buf, bytes);
            if (!(plan & TCP_ACK_NONE))
                tcp_x_send(&s->x[s->nx++], rnode, &s->o.hdr, sizeof(s->o.hdr), NULL, 0);
        }
        return 0;
    }
    if (t->kind == WIRE_OP_ALLTOALL) {
        size_t total = tcp_alltoall_pair_bytes(&s->o) * (size_t)c->nodes;
        s->vec = tcp_scratch(&s->c, 0, total);
        s->tmp = tcp_scratch(&s->c, 1, total);
        if (!s->vec || !s->tmp) return -2;
        /* at most TCP_TINY_BYTES: no turn, so no error */
        (void)tcp_alltoall_setup(&s->o, s->vec, s->tmp, s->x, &s->nx);
        return 0;
    }
    if (t->kind == WIRE_OP_REDUCE) {
        /* every pod sends its reduced vector to the root's pod, which reduces them in
         * pod order */
        int rnode = t->root / c->nlocal;
        s->vec = tcp_scratch(&s->c, 0, bytes);
        if (c->me == rnode) s->tmp = tcp_scratch(&s->c, 1, bytes * (size_t)c->nodes);
        if (!s->vec || (c->me == rnode && !s->tmp)) return -2;
        tcp_local_reduce(&s->o, s->vec, 0, t->count);
        /* and a bare header back from the root, as for broadcast */
        if (c->me != rnode) {
            tcp_x_send(&s->x[s->nx++], rnode, &s->o.hdr, sizeof(s->o.hdr), s->vec, bytes);
            tcp_x_recv(&s->x[s->nx++], rnode, &s->o.peer_hdr[rnode], sizeof(s->o.hdr), NULL, 0);
            return 0;
        }
        for (int p = 0; p < c->nodes; p++)
            if (p != c->me) {
                tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
                           s->tmp + (size_t)p * bytes, bytes);
                tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), NULL, 0);
            }
        return 0;
    }
    if (t->kind == WIRE_OP_REDUCE_SCATTER) {
        /* each pod sends block p of its reduced vector to pod p and reduces the blocks
         * it gets for itself in pod order (or halves, above) */
        size_t block = L * t->count, bb = block * s->o.es, N = (size_t)c->nodes;
        int halve = use_doubling(c, bb);
        s->vec = tcp_scratch(&s->c, 0, bb * N);
        s->tmp = tcp_scratch(&s->c, 1, bb * N);
        if (!s->vec || !s->tmp) return -2;
        /* one participant with its buffers apart, and a fold of two operands at a time
         * (halving, or two pods): its input is sent and folded where it is and its
         * block folded straight into its result, with no copy of either (each fold
         * takes the same two operands as it would in vec; reduce.c's reductions give the
         * same bits in either order, but for which NaN a sum of two keeps) */
        int direct = L == 1 && bb && t->recv[0] && (halve || c->nodes == 2) && tcp_input_as_is(t) &&
                     tcp_apart(t->send[0], bb * N, t->recv[0], bb);
        s->src = direct ? t->send[0] : s->vec;
        s->out = direct ? t->recv[0] : s->vec + (size_t)c->me * bb;
        if (!direct) tcp_local_reduce(&s->o, s->vec, 0, block * N);
        if (halve) {
            start_steps(s, s->vec, bb);
            return 0;
        }
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), s->src + (size_t)p * bb, bb);
            tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
                       s->tmp + (size_t)p * bb, bb);
        }
        if (direct) /* two pods: fold the other's copy of our block as it arrives */
            tcp_x_fold(&s->x[1], s->out, s->src + (size_t)c->me * bb);
        return 0;
    }
    if (t->kind == WIRE_OP_ALLGATHER) {
        char *buf = t->recv[0];
        size_t bb = L * bytes, all = bb * (size_t)c->nodes; /* per pod, in all */
        /* one participant whose input lies outside the result: sent from where it is and
         * copied into place by the first send (tcp_priv.h: TCP_COPY_AS_SENT_BYTES) */
        int direct = L == 1 && bytes && all >= TCP_COPY_AS_SENT_BYTES &&
                     tcp_apart(t->send[0], bytes, buf, all);
        s->src = direct ? t->send[0] : NULL;
        for (size_t k = 0; !direct && bytes && k < L; k++) {
            char *dst = buf + ((size_t)c->me * L + k) * bytes;
            if (t->send[k] != dst) memcpy(dst, t->send[k], bytes);
        }
        if (use_doubling(c, bb)) {
            start_steps(s, buf, bb);
            return 0;
        }
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr),
                       direct ? s->src
                       : bb   ? buf + (size_t)c->me * bb
                              : NULL,
                       bb);
            if (direct && s->nx == 1) s->x[0].copy_to = buf + (size_t)c->me * bb;
            tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
                       bb ? buf + (size_t)p * bb : NULL, bb);
        }
        return 0;
    }
    void *buf = NULL;
    const char *own = t->send[0];
    /* two pods or doubling's first step, one participant, two buffers apart: send
     * straight from its send buffer and fold into its result, with no copy between them
     * first (the same two operands in the same order) */
    int direct = (c->nodes == 2 || use_doubling(c, bytes)) && L == 1 &&
                 t->kind == WIRE_OP_ALLREDUCE && tcp_input_as_is(t) && bytes &&
                 tcp_apart(own, bytes, t->recv[0], bytes);
    s->src = direct ? own : NULL;
    if (t->kind == WIRE_OP_ALLREDUCE) {
        buf = t->recv[0];
        if (!direct) tcp_local_reduce(&s->o, buf, 0, t->count);
        s->tmp = tcp_scratch(&s->c, 1, bytes * (size_t)s->c.nodes);
        if (!s->tmp) return -2;
    }
    if (use_doubling(c, bytes)) {
        start_steps(s, buf, bytes);
        return 0;
    }
    for (int p = 0; p < s->c.nodes; p++) {
        if (p == s->c.me) continue;
        tcp_x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), direct ? own : buf,
                   buf ? bytes : 0);
        tcp_x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
                   s->tmp ? s->tmp + (size_t)p * bytes : NULL, buf ? bytes : 0);
    }
    if (buf && bytes && s->c.nodes == 2) {
        /* two pods: fold the other's vector into ours as it arrives, behind what we have
         * sent of ours; both add the same two operands, so the results are identical */
        tcp_x_fold(&s->x[1], buf, direct ? own : NULL);
        if (!direct) s->x[1].red_after = &s->x[0];
    }
    return 0;
}

int tcp_tiny_start(struct tcp_tiny *s, struct tcp_comm *c, struct net_task *t)
{
    int rc = tiny_setup(s, c, t);
    if (rc == 0) tcp_note_op(&s->c, &s->o.hdr); /* it runs: the previous op from now on */
    return rc;
}

int tcp_tiny_progress(struct tcp_tiny *s, struct tcp_comm *c, char *why, size_t whylen)
{
    /* the caller's view, whole: the same group and op, waited for its own way (budget and
     * nap on the engine, service on the net thread; s->o points at s->c, not at c) */
    s->c = *c;
    int st = tcp_exchange(&s->o, s->x, s->nx);
    while (st == COLL_OK && s->nsteps && ++s->step < s->nsteps) {
        rd_step(s);
        st = tcp_exchange(&s->o, s->x, s->nx);
    }
    if (st == TCP_AGAIN) return st;
    struct net_task *t = s->o.t;
    if (st == COLL_OK && (t->kind == WIRE_OP_BROADCAST || t->kind == WIRE_OP_ALLGATHER)) {
        size_t total = t->count * s->o.es *
                       (t->kind == WIRE_OP_ALLGATHER ? (size_t)(s->c.nlocal * s->c.nodes) : 1);
        st = tcp_copy_to_locals(&s->o, t->recv[0], total);
    }
    if (st == COLL_OK && t->kind == WIRE_OP_ALLTOALL)
        st = tcp_alltoall_unpack(&s->o, s->vec, s->tmp);
    if (st == COLL_OK && t->kind == WIRE_OP_REDUCE && s->c.me == t->root / s->c.nlocal) {
        size_t bytes = t->count * s->o.es;
        tcp_reduce_in_pod_order(&s->o, s->vec, s->tmp, bytes, t->count);
        tcp_finish_avg(&s->o, s->vec, t->count);
        if (t->recv[t->root % s->c.nlocal] && bytes)
            memcpy(t->recv[t->root % s->c.nlocal], s->vec, bytes);
    }
    if (st == COLL_OK && t->kind == WIRE_OP_REDUCE_SCATTER) {
        size_t L = (size_t)s->c.nlocal, block = L * t->count, bb = block * s->o.es;
        char *mine = s->out;
        int direct = s->src != s->vec; /* read and folded in the participant's buffers */
        if (!s->nsteps && !direct)     /* halving and direct folded on arrival */
            tcp_reduce_in_pod_order(&s->o, mine, s->tmp, bb, block);
        tcp_finish_avg(&s->o, mine, block);
        for (size_t k = 0; !direct && k < L; k++)
            if (t->recv[k] && t->count)
                memcpy(t->recv[k], mine + k * t->count * s->o.es, t->count * s->o.es);
    }
    if (st == COLL_OK && t->kind == WIRE_OP_ALLREDUCE) {
        size_t bytes = t->count * s->o.es;
        if (s->c.nodes > 2 && !s->nsteps && doubling(&s->c)) /* doubling's bits */
            tcp_reduce_in_tree_order(&s->o, t->recv[0], s->tmp, bytes, t->count);
        else if (s->c.nodes > 2 && !s->nsteps) /* two pods and doubling fold on arrival */
            tcp_reduce_in_pod_order(&s->o, t->recv[0], s->tmp, bytes, t->count);
        tcp_finish_avg(&s->o, t->recv[0], t->count);
        st = tcp_copy_to_locals(&s->o, t->recv[0], bytes);
    }
    if (st != COLL_OK) snprintf(why, whylen, "%s", s->why);
    return st;
}
