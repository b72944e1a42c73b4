/*
 * tcp_ops.c: the collectives between pods (tcp.h: tcp_run) built from tcp.c's transfers:
 * the ring's reduce-scatter and allgather, the direct exchange for small ops, broadcast,
 * reduce, all-to-all (their shared steps in tcp_steps.c); and which pods an op talks to.
 * The top of the backend's layers (tcp_priv.h).
 */
#include "tcp_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "util.h"
#include "wire.h"

/* ---- building blocks between pods --------------------------------------------------- */

/* Chunk k of n over count elements: [*off, *off + *len). */
static void chunk(size_t count, int n, int k, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    *off = (size_t)k * base + ((size_t)k < rem ? (size_t)k : rem);
    *len = base + ((size_t)k < rem);
}

/* Ring reduce-scatter over buf (count elements, blocks by chunk()); afterwards this node
 * holds the reduction of chunk `me`. unit: elements per block unit (block k spans
 * chunk(count/unit...)*unit), so that blocks can follow pod boundaries. src: when not
 * NULL, this pod's contribution, laid out as buf, which then starts empty: each chunk
 * is read from src the first time (sent, or folded with what arrives), never copied
 * into buf first. last: when not NULL, where chunk `me` is folded instead of buf. */
static int ring_reduce_scatter(struct opctx *o, void *buf, size_t units, size_t unit,
                               const void *src, void *last)
{
    struct tcp_comm *c = o->c;
    int n = c->nodes, me = c->me, right = (me + 1) % n, left = (me + n - 1) % n;
    size_t es = o->es * unit;
    size_t maxlen = units / (size_t)n + 1;
    void *tmp = tcp_scratch(c, 1, maxlen * es);
    if (!tmp) return tcp_failf(o, COLL_ERR_NOMEM, "scratch of %zu bytes", maxlen * es);
    for (int s = 0; s < n - 1; s++) {
        int sc = ((me - s - 1) % n + n) % n, rc = ((me - s - 2) % n + n) % n;
        size_t so, sl, ro, rl;
        chunk(units, n, sc, &so, &sl);
        chunk(units, n, rc, &ro, &rl);
        struct xfer x[2];
        /* chunk me - 1 goes first, untouched; every later one was folded here */
        const char *from = s == 0 && src ? (const char *)src : (const char *)buf;
        tcp_x_send(&x[0], right, s == 0 ? &o->hdr : NULL, sizeof(o->hdr), from + so * es, sl * es);
        tcp_x_recv(&x[1], left, s == 0 ? &o->peer_hdr[left] : NULL, sizeof(o->hdr), tmp, rl * es);
        if (rl) /* with src, each chunk is received once: folded with src's */
            tcp_x_fold(&x[1], rc == me && last ? (char *)last : (char *)buf + ro * es,
                       src ? (const char *)src + ro * es : NULL);
        int st = tcp_exchange(o, x, 2);
        if (st != COLL_OK) return st;
    }
    return COLL_OK;
}

/* Append to x's payload chunks k0, k0 + 1, ... (cnt of them, wrapping past the last)
 * of buf split by chunk() over units of es bytes: at most two contiguous pieces. */
static void x_add_chunks(struct xfer *x, char *buf, size_t units, int n, int k0, int cnt, size_t es)
{
    while (cnt > 0) {
        int run = k0 + cnt <= n ? cnt : n - k0; /* up to the last chunk */
        size_t o0, l0, o1, l1;
        chunk(units, n, k0, &o0, &l0);
        chunk(units, n, k0 + run - 1, &o1, &l1);
        size_t len = (o1 + l1 - o0) * es;
        if (len) {
            x->iov[x->niov++] = (struct iovec){buf + o0 * es, len};
            x->total += len;
        }
        cnt -= run;
        k0 = 0;
    }
}

/* Ring allgather: this node holds chunk `me`; afterwards every chunk. One exchange:
 * chunks travel leftwards, and each pod passes on what it receives from its right as it
 * arrives, so no step waits for the slowest pod of the one before. */
static int ring_allgather(struct opctx *o, void *buf, size_t units, size_t unit, int with_hdr,
                          const char *own)
{
    struct tcp_comm *c = o->c;
    int n = c->nodes, me = c->me, right = (me + 1) % n, left = (me + n - 1) % n;
    size_t es = o->es * unit, off, len;
    struct xfer x[2];
    /* in: chunks me+1 .. me+n-1; out: chunks me .. me+n-2, the first ours, the rest as
     * they come in (out's position len(me) + j is in's position j). own: our chunk is
     * read there and copied into buf as it is sent */
    tcp_x_recv(&x[0], right, with_hdr ? &o->peer_hdr[right] : NULL, sizeof(o->hdr), NULL, 0);
    x_add_chunks(&x[0], buf, units, n, (me + 1) % n, n - 1, es);
    chunk(units, n, me, &off, &len);
    tcp_x_send(&x[1], left, with_hdr ? &o->hdr : NULL, sizeof(o->hdr), own, own ? len * es : 0);
    if (own && len) x[1].copy_to = (char *)buf + off * es;
    x_add_chunks(&x[1], buf, units, n, own ? (me + 1) % n : me, own ? n - 2 : n - 1, es);
    x[1].gate = &x[0];
    x[1].gate_base = len * es;
    return tcp_exchange(o, x, 2);
}

/* ---- ops ---------------------------------------------------------------------------------- */

static int op_allreduce(struct opctx *o)
{
    struct net_task *t = o->t;
    size_t count = t->count, bytes = count * o->es;
    void *buf = t->recv[0];
    /* one participant here: its input is read where it is (no copy into buf first),
     * unless it is scaled first (a premultiplied sum) */
    const void *src =
        o->c->nlocal == 1 && tcp_input_as_is(t) && tcp_apart(t->send[0], bytes, buf, bytes)
            ? t->send[0]
            : NULL;
    if (!src) tcp_local_reduce(o, buf, 0, count);
    /* small ones went the tiny way (tcp_run) */
    int st = ring_reduce_scatter(o, buf, count, 1, src, NULL);
    if (st == COLL_OK) st = ring_allgather(o, buf, count, 1, 0, NULL);
    if (st != COLL_OK) return st;
    tcp_finish_avg(o, buf, count);
    return tcp_copy_to_locals(o, buf, bytes);
}

static int op_reduce_scatter(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, L = (size_t)c->nlocal, N = (size_t)c->nodes;
    size_t block = L * count; /* elements per pod */
    size_t bb = block * o->es;
    char *T = tcp_scratch(c, 0, bb * N);
    if (!T) return tcp_failf(o, COLL_ERR_NOMEM, "scratch");
    /* one participant here: its input is read where it is, and our block is folded
     * straight into its result */
    int direct = L == 1 && t->recv[0] && count && tcp_input_as_is(t) &&
                 tcp_apart(t->send[0], bb * N, t->recv[0], bb);
    if (!direct) tcp_local_reduce(o, T, 0, block * N);
    char *mine = direct ? t->recv[0] : T + (size_t)c->me * bb;
    /* small ones went the tiny way (a direct exchange of blocks) */
    int st = ring_reduce_scatter(o, T, N, block, direct ? t->send[0] : NULL, direct ? mine : NULL);
    if (st != COLL_OK) return st;
    tcp_finish_avg(o, mine, block);
    for (size_t s = 0; !direct && s < L; s++)
        if (t->recv[s] && count) memcpy(t->recv[s], mine + s * count * o->es, count * o->es);
    return COLL_OK;
}

static int op_allgather(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, L = (size_t)c->nlocal, N = (size_t)c->nodes;
    size_t bb = L * count * o->es; /* bytes per pod */
    char *buf = t->recv[0];
    /* one participant whose input lies outside the result: sent from where it is */
    int direct = L == 1 && count && bb * N >= TCP_COPY_AS_SENT_BYTES &&
                 tcp_apart(t->send[0], bb, buf, bb * N);
    for (size_t s = 0; !direct && s < L; s++) {
        char *dst = buf + ((size_t)c->me * L + s) * count * o->es;
        if (t->send[s] != dst && count) memcpy(dst, t->send[s], count * o->es);
    }
    /* small ones went the tiny way */
    int st = ring_allgather(o, buf, N, L * count, 1, direct ? t->send[0] : NULL);
    if (st != COLL_OK) return st;
    return tcp_copy_to_locals(o, buf, bb * N);
}

static int op_broadcast(struct opctx *o, int plan)
{
    struct xfer x[2];
    int st = tcp_exchange(o, x, tcp_bcast_chain(o, plan, x)); /* small ones went the tiny way */
    if (st != COLL_OK) return st;
    return tcp_copy_to_locals(o, o->t->recv[0], o->t->count * o->es);
}

static int op_reduce(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, bytes = count * o->es;
    int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
    char *T = tcp_scratch(c, 0, bytes);
    if (!T) return tcp_failf(o, COLL_ERR_NOMEM, "scratch");
    tcp_local_reduce(o, T, 0, count);
    /* small ones went the tiny way (every pod's vector straight to the root) */
    int st = ring_reduce_scatter(o, T, count, 1, NULL, NULL);
    if (st != COLL_OK) return st;
    /* gather the reduced chunks at the root */
    struct xfer x[RDV_MAX_NODES];
    int nx = 0;
    size_t off, len;
    if (c->me == rnode) {
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            chunk(count, c->nodes, p, &off, &len);
            tcp_x_recv(&x[nx++], p, NULL, 0, T + off * o->es, len * o->es);
        }
    } else {
        chunk(count, c->nodes, c->me, &off, &len);
        tcp_x_send(&x[nx++], rnode, NULL, 0, T + off * o->es, len * o->es);
    }
    st = tcp_exchange(o, x, nx);
    if (st != COLL_OK || c->me != rnode) return st;
    tcp_finish_avg(o, T, count);
    if (t->recv[rslot] && bytes) memcpy(t->recv[rslot], T, bytes);
    return COLL_OK;
}

static int op_alltoall(struct opctx *o)
{
    size_t pb = tcp_alltoall_pair_bytes(o), N = (size_t)o->c->nodes;
    char *out = tcp_scratch(o->c, 0, pb * N), *in = tcp_scratch(o->c, 1, pb * N);
    if (!out || !in) return tcp_failf(o, COLL_ERR_NOMEM, "scratch");
    struct xfer x[2 * RDV_MAX_NODES];
    int nx;
    int st = tcp_alltoall_setup(o, out, in, x, &nx);
    if (st == COLL_OK) st = tcp_exchange(o, x, nx);
    return st == COLL_OK ? tcp_alltoall_unpack(o, out, in) : st;
}

int tcp_run(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen)
{
    /* the acks a broadcast root went on without, first (tcp.h) */
    int rc = tcp_settle(c, t, why, whylen);
    if (rc != COLL_OK) return rc;
    struct tcp_tiny tiny;
    rc = tcp_tiny_start(&tiny, c, t);
    if (rc == 0) return tcp_tiny_progress(&tiny, c, why, whylen);
    if (rc == -2) {
        snprintf(why, whylen, "no memory for a %s of %llu elements", wire_kind_name(t->kind),
                 (unsigned long long)t->count);
        return COLL_ERR_NOMEM;
    }
    struct opctx o;
    tcp_init_ctx(&o, c, t, why, whylen);
    int plan = tcp_ack_plan(c, &o.hdr); /* before this op becomes the previous one */
    tcp_note_op(c, &o.hdr);
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        return op_allreduce(&o);
    case WIRE_OP_REDUCE_SCATTER:
        return op_reduce_scatter(&o);
    case WIRE_OP_ALLGATHER:
        return op_allgather(&o);
    case WIRE_OP_BROADCAST:
        return op_broadcast(&o, plan);
    case WIRE_OP_REDUCE:
        return op_reduce(&o);
    case WIRE_OP_ALLTOALL:
        return op_alltoall(&o);
    default:
        return tcp_failf(&o, COLL_ERR_UNSUPPORTED, "op kind %u", t->kind);
    }
}

/* ---- which pods an op talks to ------------------------------------------------------ */

static int pow2(int n)
{
    return n > 0 && (n & (n - 1)) == 0;
}

int tcp_eager_peer(int nodes, int me, int p)
{
    if (p == me || p < 0 || p >= nodes) return 0;
    if (nodes <= TCP_EAGER_ALL) return 1;
    if (p == (me + 1) % nodes || p == (me + nodes - 1) % nodes) return 1;
    return pow2(nodes) && pow2(me ^ p);
}

int tcp_op_peers(int nodes, int me, int nlocal, const struct net_task *t, uint8_t *need)
{
    int marked = 0;
#define MARK(p)                                                                                    \
    do {                                                                                           \
        int p_ = (p);                                                                              \
        if (p_ != me && p_ >= 0 && p_ < nodes && !need[p_]) {                                      \
            need[p_] = 1;                                                                          \
            marked++;                                                                              \
        }                                                                                          \
    } while (0)
    int all = 0;
    switch (t->kind) {
    case WIRE_OP_SEND:
    case WIRE_OP_RECV:
        if (t->root >= 0) MARK(t->root / nlocal); /* from any rank: the senders connect */
        return marked;
    case WIRE_OP_ALLTOALL:
        all = 1;
        break;
    case WIRE_OP_BROADCAST:
    case WIRE_OP_REDUCE: {
        int rnode = t->root / nlocal;
        all = me == rnode;
        MARK(rnode);
        break;
    }
    default: /* allreduce, barrier, allgather, reduce_scatter: doubling or direct */
        all = !pow2(nodes) || nodes < 4;
        for (int k = 1; !all && k < nodes; k <<= 1)
            MARK(me ^ k);
        break;
    }
    MARK((me + 1) % nodes); /* the ring of large ops */
    MARK((me + nodes - 1) % nodes);
    for (int p = 0; all && p < nodes; p++)
        MARK(p);
#undef MARK
    return marked;
}
