/*
 * tcp.c: collectives between pods over TCP (see tcp.h).
 *
 * Every pod runs the same ops of a group in the same order over one connection per
 * pair of pods, so the byte streams stay in step without framing; each op's first
 * message to a peer carries a header (kind, dtype, count, reduction, root, number in
 * the epoch) and a peer that disagrees fails the op with COLL_ERR_MISMATCH instead of
 * misreading the stream. Results are identical on every pod: the direct exchange
 * reduces contributions in pod order everywhere, and the ring reduces each chunk once
 * and then circulates it.
 *
 * All transfers of a step run at once through one poll loop (exchange()); a ring
 * step reduces each segment as soon as it has arrived, so reduction overlaps the
 * network. A send may relay a receive (gate): the broadcast chain and the allgather
 * ring pass bytes on as they arrive instead of going step by step.
 */
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../net.h" /* struct net_task only */
#include "../rdv_wire.h"
#include "../reduce.h"
#include "coll/coll.h"
#include "wire.h"
#include "util.h"

#define SEG_BYTES (256 * 1024) /* reduce-on-arrival granularity */
#define EXCHANGE_SPINS 50

/* ---- transfers ---------------------------------------------------------------------- */

struct xfer {
    int peer;
    int is_send;
    struct iovec iov[3]; /* a header, then the payload in up to two pieces */
    int niov;
    size_t hl; /* header bytes */
    size_t total, done;
    /* receive with reduction: payload lands in iov[niov-1] (a scratch area) and is
     * folded into red_dst segment by segment */
    void *red_dst;
    size_t red_done;
    /* when red_dst is also being sent (by this transfer), fold only what it has sent */
    const struct xfer *red_after;
    /* our own operand, when it is not red_dst: red_dst = red_src op what arrives */
    const void *red_src;
    /* a send that relays what a receive brings in: its payload runs no further than
     * gate_base plus what of gate's payload has arrived */
    const struct xfer *gate;
    size_t gate_base;
    /* a receive whose header is checked against ours as soon as it is in */
    int check_hdr;
};

/* Payload bytes x has moved (its header excluded). */
static size_t x_payload_done(const struct xfer *x)
{
    return x->done > x->hl ? x->done - x->hl : 0;
}

/* How far x may move now: all of it, or for a relay, its header and what has arrived. */
static size_t x_limit(const struct xfer *x)
{
    if (!x->gate) return x->total;
    size_t lim = x->hl + x->gate_base + x_payload_done(x->gate);
    return lim < x->total ? lim : x->total;
}

struct opctx {
    struct tcp_comm *c;
    struct net_task *t;
    size_t es;
    int red_op; /* the reduction between pods (sum for avg) */
    struct data_op_hdr hdr, peer_hdr[RDV_MAX_NODES];
    char *why;
    size_t whylen;
};

static void x_send(struct xfer *x, int peer, const void *hdr, size_t hl, const void *p, size_t n)
{
    memset(x, 0, sizeof(*x));
    x->peer = peer;
    x->is_send = 1;
    if (hdr) x->iov[x->niov++] = (struct iovec){(void *)hdr, hl};
    if (n) x->iov[x->niov++] = (struct iovec){(void *)p, n};
    x->hl = hdr ? hl : 0;
    x->total = x->hl + n;
}

static void x_recv(struct xfer *x, int peer, void *hdr, size_t hl, void *p, size_t n)
{
    memset(x, 0, sizeof(*x));
    x->peer = peer;
    if (hdr) x->iov[x->niov++] = (struct iovec){hdr, hl};
    if (n) x->iov[x->niov++] = (struct iovec){p, n};
    x->hl = hdr ? hl : 0;
    x->total = x->hl + n;
    x->check_hdr = hdr != NULL;
}

/* The iovec of x from its current offset up to limit. */
static int x_iov(const struct xfer *x, size_t limit, struct iovec *out)
{
    size_t skip = x->done, room = limit - x->done;
    int n = 0;
    for (int i = 0; i < x->niov && room; i++) {
        if (skip >= x->iov[i].iov_len) {
            skip -= x->iov[i].iov_len;
            continue;
        }
        size_t len = x->iov[i].iov_len - skip;
        if (len > room) len = room;
        out[n].iov_base = (char *)x->iov[i].iov_base + skip;
        out[n].iov_len = len;
        room -= len;
        skip = 0;
        n++;
    }
    return n;
}

static void fold(struct opctx *o, struct xfer *x, int final)
{
    if (!x->red_dst) return;
    struct iovec *pl = &x->iov[x->niov - 1]; /* one piece: a scratch area */
    size_t have = x_payload_done(x);
    size_t upto = final ? have : (have / SEG_BYTES) * SEG_BYTES;
    if (x->red_after) {
        size_t sent = x_payload_done(x->red_after);
        if (upto > sent) upto = sent;
    }
    upto -= upto % o->es;
    while (x->red_done < upto) {
        size_t len = upto - x->red_done;
        size_t max = (size_t)REDUCE_CHUNK * o->es;
        if (len > max) len = max;
        char *d = (char *)x->red_dst + x->red_done;
        const void *mine = x->red_src ? (const char *)x->red_src + x->red_done : d;
        const void *srcs[2] = {mine, (char *)pl->iov_base + x->red_done};
        reduce_n(o->t->dtype, o->red_op, d, srcs, 2, len / o->es, 1);
        x->red_done += len;
    }
}

static int failf(struct opctx *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int failf(struct opctx *o, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->why, o->whylen, fmt, ap);
    va_end(ap);
    return code;
}

static int check_hdr(struct opctx *o, int peer);

/* Move every transfer to completion, checking each received header against ours as
 * soon as it is in (so callers need not). Relays (sends with a gate) go after the
 * receives that feed them, so what arrives is passed on in the same pass. */
static int exchange(struct opctx *o, struct xfer *x, int nx)
{
    struct tcp_comm *c = o->c;
    struct pollfd pf[2 * RDV_MAX_NODES + 2];
    int idx[2 * RDV_MAX_NODES + 2];
    int spins = 0;
    for (;;) {
        int left = 0, np = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < nx; i++) {
                struct xfer *t = &x[i];
                if ((t->gate != NULL) != pass) continue;
                /* try first: most small transfers complete without a poll */
                size_t lim;
                while (t->done < (lim = x_limit(t))) {
                    struct iovec v[3];
                    int nv = x_iov(t, lim, v);
                    ssize_t r = t->is_send ? writev(c->fds[t->peer], v, nv)
                                           : readv(c->rfds[t->peer], v, nv);
                    if (r > 0) {
                        t->done += (size_t)r;
                        if (t->is_send) continue;
                        if (t->check_hdr && t->done >= t->hl) {
                            t->check_hdr = 0;
                            int st = check_hdr(o, t->peer);
                            if (st != COLL_OK) return st;
                        }
                        fold(o, t, 0);
                        continue;
                    }
                    if (r == 0 && !t->is_send)
                        return failf(o, COLL_ERR_PEER_LOST, "node %d closed the data connection",
                                     t->peer);
                    if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
                    if (r < 0 && t->is_send && (errno == EPIPE || errno == ECONNRESET)) {
                        /* the peer closed: it either finished this op and left (and needs
                         * nothing more from us) or failed; our own result depends only on
                         * what we receive, so carry on and let the receives decide */
                        t->done = t->total;
                        break;
                    }
                    return failf(o, COLL_ERR_PEER_LOST, "data connection to node %d: %s", t->peer,
                                 r < 0 ? strerror(errno) : "closed");
                }
                if (t->done < t->total) {
                    left++;
                    if (t->done >= lim) continue; /* a relay waiting for its receive */
                    pf[np] = (struct pollfd){.fd = t->is_send ? c->fds[t->peer] : c->rfds[t->peer],
                                             .events = t->is_send ? POLLOUT : POLLIN};
                    idx[np++] = i;
                } else if (!t->is_send && t->red_dst && t->red_done < t->total) {
                    fold(o, t, 1);
                }
            }
        }
        if (!left) {
            /* every send is done: folds held back behind one (red_after) can finish */
            for (int i = 0; i < nx; i++)
                if (!x[i].is_send) fold(o, &x[i], 1);
            return COLL_OK;
        }
        /* the peers are usually microseconds behind: look again a few times before
         * sleeping in poll, yielding the CPU to whoever must produce the bytes */
        if (spins < EXCHANGE_SPINS) {
            spins++;
            sched_yield();
            continue;
        }
        spins = 0;
        int64_t t = now_ns(), rem = c->deadline_ns - t;
        if (rem <= 0) return failf(o, COLL_ERR_TIMEOUT, "op did not complete before its deadline");
        if (c->budget_until && t >= c->budget_until) return TCP_AGAIN;
        int ms = rem > 20000000 ? 20 : (int)(rem / 1000000) + 1;
        if (c->budget_until) ms = 0; /* on the engine thread: never sleep, give up instead */
        int r = poll(pf, (nfds_t)np, ms);
        if (r < 0 && errno != EINTR)
            return failf(o, COLL_ERR_INTERNAL, "poll: %s", strerror(errno));
        char ended[160];
        int st =
            c->budget_until || !c->service ? 0 : c->service(c->service_ctx, ended, sizeof(ended));
        if (st) return failf(o, st, "%s", ended);
        for (int i = 0; i < np; i++)
            if (pf[i].revents & (POLLERR | POLLNVAL))
                return failf(o, COLL_ERR_PEER_LOST, "data connection to node %d failed",
                             x[idx[i]].peer);
    }
}

/* ---- headers -------------------------------------------------------------------------- */

static int check_hdr(struct opctx *o, int peer)
{
    const struct data_op_hdr *a = &o->hdr, *b = &o->peer_hdr[peer];
    int ok = b->magic == DATA_MAGIC && b->kind == a->kind && b->dtype == a->dtype &&
             b->count == a->count && b->seq == a->seq;
    if (ok && wire_kind_reduces(a->kind)) ok = b->redop == a->redop;
    if (ok && wire_kind_rooted(a->kind)) ok = b->root == a->root;
    if (ok) return COLL_OK;
    return failf(o, COLL_ERR_MISMATCH,
                 "node %d runs %s dtype %u count %llu op %u root %d (#%llu), this node %s dtype "
                 "%u count %llu op %u root %d (#%llu)",
                 peer, wire_kind_name(b->kind), b->dtype, (unsigned long long)b->count, b->redop,
                 b->root, (unsigned long long)b->seq, wire_kind_name(a->kind), a->dtype,
                 (unsigned long long)a->count, a->redop, a->root, (unsigned long long)a->seq);
}

/* ---- local helpers ------------------------------------------------------------------- */

static void *scratch(struct tcp_comm *c, int k, size_t bytes)
{
    if (bytes == 0) bytes = 1;
    struct tcp_scratch *sc = c->scratch;
    if (sc->cap[k] < bytes) {
        void *p = realloc(sc->p[k], bytes);
        if (!p) return NULL;
        sc->p[k] = p;
        sc->cap[k] = bytes;
    }
    return sc->p[k];
}

/* dst[i] = op over srcs (n of them, count elements), chunked; dst may be srcs[0]. */
static void reduce_all(struct opctx *o, void *dst, const void *const *srcs, int n, size_t count)
{
    size_t es = o->es;
    const void *s[RDV_MAX_NODES + NET_MAX_LOCAL];
    for (size_t off = 0; off < count; off += REDUCE_CHUNK) {
        size_t len = count - off < REDUCE_CHUNK ? count - off : REDUCE_CHUNK;
        for (int k = 0; k < n; k++)
            s[k] = (const char *)srcs[k] + off * es;
        /* dst may alias srcs[0] only, which reduce_n allows */
        reduce_n(o->t->dtype, o->red_op, (char *)dst + off * es, s, n, len, 1);
    }
}

/* mine = the reduction, in pod order, of every pod's contribution: ours in mine, pod p's
 * at in + p * bytes (our own slot there is unused and serves as the output). The same
 * order on every pod is what makes the results identical everywhere. */
static void reduce_in_pod_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count)
{
    const void *srcs[RDV_MAX_NODES];
    for (int p = 0; p < o->c->nodes; p++)
        srcs[p] = p == o->c->me ? (const void *)mine : in + (size_t)p * bytes;
    void *out = in + (size_t)o->c->me * bytes;
    reduce_all(o, out, srcs, o->c->nodes, count);
    if (bytes) memcpy(mine, out, bytes);
}

/* dst = reduction of the local participants' send buffers at element offset off. */
static void local_reduce(struct opctx *o, void *dst, size_t off, size_t count)
{
    const void *srcs[NET_MAX_LOCAL];
    for (int s = 0; s < o->c->nlocal; s++)
        srcs[s] = (const char *)o->t->send[s] + off * o->es;
    if (o->c->nlocal == 1) {
        if (dst != srcs[0] && count) memcpy(dst, srcs[0], count * o->es);
        return;
    }
    /* an in-place participant's send may be dst itself: put it first */
    for (int s = 1; s < o->c->nlocal; s++) {
        if (srcs[s] == dst) {
            const void *tmp = srcs[0];
            srcs[0] = srcs[s];
            srcs[s] = tmp;
        }
    }
    reduce_all(o, dst, srcs, o->c->nlocal, count);
}

static void finish_avg(struct opctx *o, void *buf, size_t count)
{
    if (o->t->redop != COLL_AVG || !count) return;
    uint32_t world = (uint32_t)(o->c->nodes * o->c->nlocal);
    for (size_t off = 0; off < count; off += REDUCE_CHUNK) {
        size_t len = count - off < REDUCE_CHUNK ? count - off : REDUCE_CHUNK;
        char *p = (char *)buf + off * o->es;
        const void *srcs[1] = {p};
        reduce_n(o->t->dtype, COLL_AVG, p, srcs, 1, len, world);
    }
}

static void copy_to_locals(struct opctx *o, const void *src, size_t bytes)
{
    for (int s = 0; bytes && s < o->c->nlocal; s++)
        if (o->t->recv[s] && o->t->recv[s] != src) memcpy(o->t->recv[s], src, bytes);
}

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
 * chunk(count/unit...)*unit), so that blocks can follow pod boundaries. */
static int ring_reduce_scatter(struct opctx *o, void *buf, size_t units, size_t unit)
{
    struct tcp_comm *c = o->c;
    int n = c->nodes, me = c->me, right = (me + 1) % n, left = (me + n - 1) % n;
    size_t es = o->es * unit;
    size_t maxlen = units / (size_t)n + 1;
    void *tmp = scratch(c, 1, maxlen * es);
    if (!tmp) return failf(o, COLL_ERR_NOMEM, "scratch of %zu bytes", maxlen * es);
    for (int s = 0; s < n - 1; s++) {
        int sc = ((me - s - 1) % n + n) % n, rc = ((me - s - 2) % n + n) % n;
        size_t so, sl, ro, rl;
        chunk(units, n, sc, &so, &sl);
        chunk(units, n, rc, &ro, &rl);
        struct xfer x[2];
        x_send(&x[0], right, s == 0 ? &o->hdr : NULL, sizeof(o->hdr), (char *)buf + so * es,
               sl * es);
        x_recv(&x[1], left, s == 0 ? &o->peer_hdr[left] : NULL, sizeof(o->hdr), tmp, rl * es);
        x[1].red_dst = rl ? (char *)buf + ro * es : NULL;
        int st = exchange(o, x, 2);
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
static int ring_allgather(struct opctx *o, void *buf, size_t units, size_t unit, int with_hdr)
{
    struct tcp_comm *c = o->c;
    int n = c->nodes, me = c->me, right = (me + 1) % n, left = (me + n - 1) % n;
    size_t es = o->es * unit, off, len;
    struct xfer x[2];
    /* in: chunks me+1 .. me+n-1; out: chunks me .. me+n-2, the first ours, the rest as
     * they come in (out's position len(me) + j is in's position j) */
    x_recv(&x[0], right, with_hdr ? &o->peer_hdr[right] : NULL, sizeof(o->hdr), NULL, 0);
    x_add_chunks(&x[0], buf, units, n, (me + 1) % n, n - 1, es);
    x_send(&x[1], left, with_hdr ? &o->hdr : NULL, sizeof(o->hdr), NULL, 0);
    x_add_chunks(&x[1], buf, units, n, me, n - 1, es);
    chunk(units, n, me, &off, &len);
    x[1].gate = &x[0];
    x[1].gate_base = len * es;
    return exchange(o, x, 2);
}

/* ---- ops ---------------------------------------------------------------------------------- */

static int op_allreduce(struct opctx *o)
{
    struct net_task *t = o->t;
    size_t count = t->count, bytes = count * o->es;
    void *buf = t->recv[0];
    local_reduce(o, buf, 0, count);
    /* small ones went the tiny way (tcp_run) */
    int st = ring_reduce_scatter(o, buf, count, 1);
    if (st == COLL_OK) st = ring_allgather(o, buf, count, 1, 0);
    if (st != COLL_OK) return st;
    finish_avg(o, buf, count);
    copy_to_locals(o, buf, bytes);
    return COLL_OK;
}

static int op_reduce_scatter(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, L = (size_t)c->nlocal, N = (size_t)c->nodes;
    size_t block = L * count; /* elements per pod */
    size_t bb = block * o->es;
    char *T = scratch(c, 0, bb * N);
    if (!T) return failf(o, COLL_ERR_NOMEM, "scratch");
    local_reduce(o, T, 0, block * N);
    char *mine = T + (size_t)c->me * bb;
    /* small ones went the tiny way (a direct exchange of blocks) */
    int st = ring_reduce_scatter(o, T, N, block);
    if (st != COLL_OK) return st;
    finish_avg(o, mine, block);
    for (size_t s = 0; s < L; s++)
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
    for (size_t s = 0; s < L; s++) {
        char *dst = buf + ((size_t)c->me * L + s) * count * o->es;
        if (t->send[s] != dst && count) memcpy(dst, t->send[s], count * o->es);
    }
    int st = ring_allgather(o, buf, N, L * count, 1); /* small ones went the tiny way */
    if (st != COLL_OK) return st;
    copy_to_locals(o, buf, bb * N);
    return COLL_OK;
}

static int op_broadcast(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t bytes = t->count * o->es;
    int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
    char *buf = t->recv[0];
    if (c->me == rnode && t->send[rslot] != buf && bytes) memcpy(buf, t->send[rslot], bytes);
    int n = c->nodes, pos = (c->me - rnode + n) % n;
    int next = (c->me + 1) % n, prev = (c->me + n - 1) % n;
    /* a chain from the root; each pod passes bytes on as they arrive (small ones went
     * the tiny way) */
    /* the ring closes with a bare header from the last pod to the root, so every pod
     * hears its left neighbour: pods that disagree on the op fail with MISMATCH */
    struct xfer x[2];
    int nx = 0;
    x_recv(&x[nx++], prev, &o->peer_hdr[prev], sizeof(o->hdr), pos != 0 ? buf : NULL,
           pos != 0 ? bytes : 0);
    x_send(&x[nx], next, &o->hdr, sizeof(o->hdr), pos != n - 1 ? buf : NULL,
           pos != n - 1 ? bytes : 0);
    if (pos != 0 && pos != n - 1) x[nx].gate = &x[0];
    nx++;
    int st = exchange(o, x, nx);
    if (st != COLL_OK) return st;
    copy_to_locals(o, buf, bytes);
    return COLL_OK;
}

static int op_reduce(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, bytes = count * o->es;
    int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
    char *T = scratch(c, 0, bytes);
    if (!T) return failf(o, COLL_ERR_NOMEM, "scratch");
    local_reduce(o, T, 0, count);
    /* small ones went the tiny way (every pod's vector straight to the root) */
    int st = ring_reduce_scatter(o, T, count, 1);
    if (st != COLL_OK) return st;
    /* gather the reduced chunks at the root */
    struct xfer x[RDV_MAX_NODES];
    int nx = 0;
    size_t off, len;
    if (c->me == rnode) {
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            chunk(count, c->nodes, p, &off, &len);
            x_recv(&x[nx++], p, NULL, 0, T + off * o->es, len * o->es);
        }
    } else {
        chunk(count, c->nodes, c->me, &off, &len);
        x_send(&x[nx++], rnode, NULL, 0, T + off * o->es, len * o->es);
    }
    st = exchange(o, x, nx);
    if (st != COLL_OK || c->me != rnode) return st;
    finish_avg(o, T, count);
    if (t->recv[rslot] && bytes) memcpy(t->recv[rslot], T, bytes);
    return COLL_OK;
}

/* All-to-all packs one message per pair of pods: alltoall_setup packs (for pod k,
 * [s][j] = local s's block for rank k*L + j) into out and sets up the exchange into in;
 * after it, alltoall_unpack spreads in over the local participants' results. */
static size_t alltoall_pair_bytes(const struct opctx *o)
{
    size_t L = (size_t)o->c->nlocal;
    return L * L * o->t->count * o->es;
}

static void alltoall_setup(struct opctx *o, char *out, char *in, struct xfer *x, int *nx)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t L = (size_t)c->nlocal, N = (size_t)c->nodes, cb = t->count * o->es;
    size_t pb = alltoall_pair_bytes(o);
    for (size_t k = 0; k < N; k++)
        for (size_t s = 0; s < L; s++)
            for (size_t j = 0; j < L; j++)
                if (cb)
                    memcpy(out + k * pb + (s * L + j) * cb,
                           (const char *)t->send[s] + (k * L + j) * cb, cb);
    *nx = 0;
    for (int p = 0; p < c->nodes; p++) {
        if (p == c->me) continue;
        x_send(&x[(*nx)++], p, &o->hdr, sizeof(o->hdr), out + (size_t)p * pb, pb);
        x_recv(&x[(*nx)++], p, &o->peer_hdr[p], sizeof(o->hdr), in + (size_t)p * pb, pb);
    }
}

static void alltoall_unpack(struct opctx *o, const char *out, char *in)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t L = (size_t)c->nlocal, N = (size_t)c->nodes, cb = t->count * o->es;
    size_t pb = alltoall_pair_bytes(o);
    memcpy(in + (size_t)c->me * pb, out + (size_t)c->me * pb, pb);
    /* unpack: from pod k, [s][j] = rank k*L + s's block for our local j */
    for (size_t k = 0; k < N; k++)
        for (size_t s = 0; s < L; s++)
            for (size_t j = 0; j < L; j++)
                if (cb)
                    memcpy((char *)t->recv[j] + (k * L + s) * cb, in + k * pb + (s * L + j) * cb,
                           cb);
}

static int op_alltoall(struct opctx *o)
{
    size_t pb = alltoall_pair_bytes(o), N = (size_t)o->c->nodes;
    char *out = scratch(o->c, 0, pb * N), *in = scratch(o->c, 1, pb * N);
    if (!out || !in) return failf(o, COLL_ERR_NOMEM, "scratch");
    struct xfer x[2 * RDV_MAX_NODES];
    int nx;
    alltoall_setup(o, out, in, x, &nx);
    int st = exchange(o, x, nx);
    if (st != COLL_OK) return st;
    alltoall_unpack(o, out, in);
    return COLL_OK;
}

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
struct tcp_tiny {
    struct tcp_comm c;
    struct opctx o;
    struct xfer x[2 * RDV_MAX_NODES];
    int nx;
    char *tmp;
    int step, nsteps; /* doubling or halving: the step under way, and how many (0: none) */
    size_t bytes;     /* doubling or halving: bytes per block (allreduce: of the vector) */
    char *vec;        /* the pod's vector, one block per pod: reduced (reduce_scatter, reduce),
                       * packed (all-to-all), or the result itself (allgather, and allreduce
                       * by doubling: its running result; NULL for a barrier) */
    char why[160];
};

/* Set up step s->step of doubling (allreduce, allgather) or halving (reduce_scatter)
 * with the partner of that step; what arrives is folded in as it comes. */
static void rd_step(struct tcp_tiny *s)
{
    int me = s->c.me, p;
    size_t hl = sizeof(s->o.hdr), b = s->bytes;
    s->nx = 0;
    if (s->o.t->kind == WIRE_OP_ALLGATHER) {
        /* both sides hold 2^step blocks (of bytes each), aligned: swap them */
        int w = 1 << s->step;
        p = me ^ w;
        char *mine = s->vec + (size_t)(me & ~(w - 1)) * b;
        char *theirs = s->vec + (size_t)(p & ~(w - 1)) * b;
        x_send(&s->x[s->nx++], p, &s->o.hdr, hl, b ? mine : NULL, (size_t)w * b);
        x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], hl, b ? theirs : NULL, (size_t)w * b);
        return;
    }
    if (s->o.t->kind == WIRE_OP_REDUCE_SCATTER) {
        /* recursive halving: of the 2h blocks still ours, give the partner the half that
         * holds its block and fold its copy of our half into ours */
        int h = s->c.nodes >> (s->step + 1), lo = me & ~(2 * h - 1);
        int keep = me & h ? lo + h : lo, give = me & h ? lo : lo + h;
        p = me ^ h;
        x_send(&s->x[s->nx++], p, &s->o.hdr, hl, b ? s->vec + (size_t)give * b : NULL,
               (size_t)h * b);
        x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], hl, b ? s->tmp + (size_t)keep * b : NULL,
               (size_t)h * b);
        if (b) s->x[1].red_dst = s->vec + (size_t)keep * b;
        return;
    }
    p = me ^ (1 << s->step);
    if (!s->vec) b = 0;
    x_send(&s->x[s->nx++], p, &s->o.hdr, hl, s->vec, b);
    x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], hl, b ? s->tmp : NULL, b);
    if (b) {
        s->x[1].red_dst = s->vec;
        s->x[1].red_after = &s->x[0];
    }
}

/* Recursive doubling (allreduce, allgather) or halving (reduce_scatter): for a power of
 * two of at least 4 pods, where log2(pods) messages per pod beat pods - 1. */
static int doubling(const struct tcp_comm *c)
{
    return c->nodes >= 4 && (c->nodes & (c->nodes - 1)) == 0;
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

static void init_ctx(struct opctx *o, struct tcp_comm *c, struct net_task *t, char *why,
                     size_t whylen);

static int tiny_setup(struct tcp_tiny *s, const struct tcp_comm *c, struct net_task *t)
{
    size_t es = coll_dtype_size((coll_dtype)t->dtype);
    size_t bytes = t->count * es, L = (size_t)c->nlocal;
    /* two pods exchange no more than a ring would: the direct way serves mid sizes too;
     * doubling and halving serve mid sizes among 4, 8, ... pods */
    size_t ar_limit = c->nodes == 2 ? TCP_PAIR_INLINE_BYTES
                      : doubling(c) ? TCP_DOUBLING_ALLREDUCE_BYTES
                                    : TCP_TINY_BYTES;
    size_t vec_limit = doubling(c)     ? TCP_DOUBLING_BYTES
                       : c->nodes == 2 ? TCP_PAIR_INLINE_BYTES
                                       : TCP_TINY_BYTES;
    /* an allgather between two pods sends each block once: the pair limit per block */
    if (c->nodes == 2 && t->kind == WIRE_OP_ALLGATHER) vec_limit = 2 * TCP_PAIR_INLINE_BYTES;
    int ok =
        t->kind == WIRE_OP_BARRIER || (t->kind == WIRE_OP_ALLREDUCE && bytes <= ar_limit) ||
        ((t->kind == WIRE_OP_BROADCAST || t->kind == WIRE_OP_REDUCE) && bytes <= TCP_TINY_BYTES) ||
        ((t->kind == WIRE_OP_ALLGATHER || t->kind == WIRE_OP_REDUCE_SCATTER) &&
         bytes * L * (size_t)c->nodes <= vec_limit) ||
        (t->kind == WIRE_OP_ALLTOALL && bytes * L * L * (size_t)c->nodes <= TCP_TINY_BYTES);
    if (!ok) return -1;
    s->c = *c;
    init_ctx(&s->o, &s->c, t, s->why, sizeof(s->why));
    s->why[0] = '\0';
    s->nx = 0;
    s->tmp = NULL;
    s->nsteps = 0;
    if (t->kind == WIRE_OP_BROADCAST) {
        int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
        char *buf = t->recv[0];
        /* every pod hears every pod it deals with: the root takes a bare header back from
         * each, so pods that disagree on the root (or count) all fail with MISMATCH
         * instead of sending past each other and reporting success */
        if (c->me == rnode) {
            if (t->send[rslot] != buf && bytes) memcpy(buf, t->send[rslot], bytes);
            for (int p = 0; p < c->nodes; p++) {
                if (p == c->me) continue;
                x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), buf, bytes);
                x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr), NULL, 0);
            }
        } else {
            x_recv(&s->x[s->nx++], rnode, &s->o.peer_hdr[rnode], sizeof(s->o.hdr), buf, bytes);
            x_send(&s->x[s->nx++], rnode, &s->o.hdr, sizeof(s->o.hdr), NULL, 0);
        }
        return 0;
    }
    if (t->kind == WIRE_OP_ALLTOALL) {
        size_t total = alltoall_pair_bytes(&s->o) * (size_t)c->nodes;
        s->vec = scratch(&s->c, 0, total);
        s->tmp = scratch(&s->c, 1, total);
        if (!s->vec || !s->tmp) return -2;
        alltoall_setup(&s->o, s->vec, s->tmp, s->x, &s->nx);
        return 0;
    }
    if (t->kind == WIRE_OP_REDUCE) {
        /* every pod sends its reduced vector to the root's pod, which reduces them in
         * pod order */
        int rnode = t->root / c->nlocal;
        s->vec = scratch(&s->c, 0, bytes);
        if (c->me == rnode) s->tmp = scratch(&s->c, 1, bytes * (size_t)c->nodes);
        if (!s->vec || (c->me == rnode && !s->tmp)) return -2;
        local_reduce(&s->o, s->vec, 0, t->count);
        /* and a bare header back from the root, as for broadcast */
        if (c->me != rnode) {
            x_send(&s->x[s->nx++], rnode, &s->o.hdr, sizeof(s->o.hdr), s->vec, bytes);
            x_recv(&s->x[s->nx++], rnode, &s->o.peer_hdr[rnode], sizeof(s->o.hdr), NULL, 0);
            return 0;
        }
        for (int p = 0; p < c->nodes; p++)
            if (p != c->me) {
                x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
                       s->tmp + (size_t)p * bytes, bytes);
                x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), NULL, 0);
            }
        return 0;
    }
    if (t->kind == WIRE_OP_REDUCE_SCATTER) {
        /* each pod sends block p of its reduced vector to pod p and reduces the blocks
         * it gets for itself in pod order (or halves, above) */
        size_t block = L * t->count, bb = block * s->o.es, N = (size_t)c->nodes;
        s->vec = scratch(&s->c, 0, bb * N);
        s->tmp = scratch(&s->c, 1, bb * N);
        if (!s->vec || !s->tmp) return -2;
        local_reduce(&s->o, s->vec, 0, block * N);
        if (doubling(c)) {
            start_steps(s, s->vec, bb);
            return 0;
        }
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), s->vec + (size_t)p * bb, bb);
            x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr), s->tmp + (size_t)p * bb,
                   bb);
        }
        return 0;
    }
    if (t->kind == WIRE_OP_ALLGATHER) {
        char *buf = t->recv[0];
        size_t bb = L * bytes; /* per pod */
        for (size_t k = 0; bytes && k < L; k++) {
            char *dst = buf + ((size_t)c->me * L + k) * bytes;
            if (t->send[k] != dst) memcpy(dst, t->send[k], bytes);
        }
        if (doubling(c)) {
            start_steps(s, buf, bb);
            return 0;
        }
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr),
                   bb ? buf + (size_t)c->me * bb : NULL, bb);
            x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
                   bb ? buf + (size_t)p * bb : NULL, bb);
        }
        return 0;
    }
    void *buf = NULL;
    const char *own = t->send[0];
    /* two pods, one participant, two buffers apart: send straight from its send buffer
     * and fold into its result, with no copy between them first */
    int direct =
        c->nodes == 2 && L == 1 && t->kind == WIRE_OP_ALLREDUCE && bytes &&
        (own + bytes <= (const char *)t->recv[0] || (const char *)t->recv[0] + bytes <= own);
    if (t->kind == WIRE_OP_ALLREDUCE) {
        buf = t->recv[0];
        if (!direct) local_reduce(&s->o, buf, 0, t->count);
        s->tmp = scratch(&s->c, 1, bytes * (size_t)s->c.nodes);
        if (!s->tmp) return -2;
    }
    if (doubling(c)) {
        start_steps(s, buf, bytes);
        return 0;
    }
    for (int p = 0; p < s->c.nodes; p++) {
        if (p == s->c.me) continue;
        x_send(&s->x[s->nx++], p, &s->o.hdr, sizeof(s->o.hdr), direct ? own : buf, buf ? bytes : 0);
        x_recv(&s->x[s->nx++], p, &s->o.peer_hdr[p], sizeof(s->o.hdr),
               s->tmp ? s->tmp + (size_t)p * bytes : NULL, buf ? bytes : 0);
    }
    if (buf && bytes && s->c.nodes == 2) {
        /* two pods: fold the other's vector into ours as it arrives, behind what we have
         * sent of ours; both add the same two operands, so the results are identical */
        s->x[1].red_dst = buf;
        if (direct)
            s->x[1].red_src = own;
        else
            s->x[1].red_after = &s->x[0];
    }
    return 0;
}

int tcp_tiny_start(struct tcp_tiny *s, struct tcp_comm *c, struct net_task *t)
{
    return tiny_setup(s, c, t);
}

int tcp_tiny_progress(struct tcp_tiny *s, struct tcp_comm *c, char *why, size_t whylen)
{
    /* the caller's view: budget (engine) or service (net thread) */
    s->c.budget_until = c->budget_until;
    s->c.service = c->service;
    s->c.service_ctx = c->service_ctx;
    int st = exchange(&s->o, s->x, s->nx);
    while (st == COLL_OK && s->nsteps && ++s->step < s->nsteps) {
        rd_step(s);
        st = exchange(&s->o, s->x, s->nx);
    }
    if (st == TCP_AGAIN) return st;
    struct net_task *t = s->o.t;
    if (st == COLL_OK && (t->kind == WIRE_OP_BROADCAST || t->kind == WIRE_OP_ALLGATHER)) {
        size_t total = t->count * s->o.es *
                       (t->kind == WIRE_OP_ALLGATHER ? (size_t)(s->c.nlocal * s->c.nodes) : 1);
        copy_to_locals(&s->o, t->recv[0], total);
    }
    if (st == COLL_OK && t->kind == WIRE_OP_ALLTOALL) alltoall_unpack(&s->o, s->vec, s->tmp);
    if (st == COLL_OK && t->kind == WIRE_OP_REDUCE && s->c.me == t->root / s->c.nlocal) {
        size_t bytes = t->count * s->o.es;
        reduce_in_pod_order(&s->o, s->vec, s->tmp, bytes, t->count);
        finish_avg(&s->o, s->vec, t->count);
        if (t->recv[t->root % s->c.nlocal] && bytes)
            memcpy(t->recv[t->root % s->c.nlocal], s->vec, bytes);
    }
    if (st == COLL_OK && t->kind == WIRE_OP_REDUCE_SCATTER) {
        size_t L = (size_t)s->c.nlocal, block = L * t->count, bb = block * s->o.es;
        char *mine = s->vec + (size_t)s->c.me * bb;
        if (!s->nsteps) /* halving folded on arrival */
            reduce_in_pod_order(&s->o, mine, s->tmp, bb, block);
        finish_avg(&s->o, mine, block);
        for (size_t k = 0; k < L; k++)
            if (t->recv[k] && t->count)
                memcpy(t->recv[k], mine + k * t->count * s->o.es, t->count * s->o.es);
    }
    if (st == COLL_OK && t->kind == WIRE_OP_ALLREDUCE) {
        size_t bytes = t->count * s->o.es;
        if (s->c.nodes > 2 && !s->nsteps) /* two pods and doubling fold on arrival */
            reduce_in_pod_order(&s->o, t->recv[0], s->tmp, bytes, t->count);
        finish_avg(&s->o, t->recv[0], t->count);
        copy_to_locals(&s->o, t->recv[0], bytes);
    }
    if (st != COLL_OK) snprintf(why, whylen, "%s", s->why);
    return st;
}

static void init_ctx(struct opctx *o, struct tcp_comm *c, struct net_task *t, char *why,
                     size_t whylen)
{
    *o = (struct opctx){.c = c, .t = t, .why = why, .whylen = whylen};
    o->es = coll_dtype_size((coll_dtype)t->dtype);
    o->red_op = t->redop == COLL_AVG ? COLL_SUM : t->redop;
    o->hdr = (struct data_op_hdr){.magic = DATA_MAGIC,
                                  .kind = t->kind,
                                  .dtype = t->dtype,
                                  .redop = t->redop,
                                  .root = t->root,
                                  .seq = c->seq,
                                  .count = t->count};
}

int tcp_run(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen)
{
    struct tcp_tiny tiny;
    int rc = tcp_tiny_start(&tiny, c, t);
    if (rc == 0) return tcp_tiny_progress(&tiny, c, why, whylen);
    if (rc == -2) {
        snprintf(why, whylen, "no memory for a %s of %llu elements", wire_kind_name(t->kind),
                 (unsigned long long)t->count);
        return COLL_ERR_NOMEM;
    }
    struct opctx o;
    init_ctx(&o, c, t, why, whylen);
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        return op_allreduce(&o);
    case WIRE_OP_REDUCE_SCATTER:
        return op_reduce_scatter(&o);
    case WIRE_OP_ALLGATHER:
        return op_allgather(&o);
    case WIRE_OP_BROADCAST:
        return op_broadcast(&o);
    case WIRE_OP_REDUCE:
        return op_reduce(&o);
    case WIRE_OP_ALLTOALL:
        return op_alltoall(&o);
    default:
        return failf(&o, COLL_ERR_UNSUPPORTED, "op kind %u", t->kind);
    }
}
