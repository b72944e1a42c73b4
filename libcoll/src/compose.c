/*
 * compose.c: composite requests, ops made of tagged sends and receives posted at once and
 * a local step once they are all done (a reduction in rank order), whose ids have bit 31
 * of the low word set (coll_wait and the others hand them here); children across pods
 * (span.c) run every op so. On them, gather, scatter and all-to-all with blocks of any
 * size for every host group: on the group's own sends and receives for a group with an
 * agent handle, its root's for a child across pods. Each op posts
 * all its sends and receives at once under a lock, on one tag of coll's own, so the n-th
 * such op of two ranks pairs with the n-th of the other whatever else runs. A block whose
 * sizes disagree between sender and receiver fails both with MISMATCH (the sends and
 * receives' own check).
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc.h"
#include "lcgpu.h"
#include "reduce.h"

/* the tag of a group with an agent handle: above every child's (span.c: ids below
 * LC_SPAN_IDS) and below creation's */
#define COMPOSE_TAG (LC_SPAN_TAG_BASE | LC_SPAN_IDS << 13 | (LC_SPAN_SUB_OPS - 1))

static pthread_mutex_t compose_posting = PTHREAD_MUTEX_INITIALIZER;

/* ---- composite requests ---------------------------------------------------------- */

/* [p, p + bytes) lies in coll memory (bytes 0: anything goes) */
coll_err lc_cop_in_coll(coll_group *g, const char *what, const void *p, size_t bytes)
{
    if (!bytes) return COLL_OK;
    if (!p) return lc_fail(COLL_ERR_INVALID, "%s buffer is NULL", what);
    pthread_mutex_lock(&g->conn->lock);
    coll_buffer *b = lc_find_buffer(g->conn, p, bytes);
    pthread_mutex_unlock(&g->conn->lock);
    if (!b)
        return lc_fail(COLL_ERR_INVALID,
                       "%s range %p + %zu bytes is not inside a buffer shared with the agent", what,
                       p, bytes);
    return COLL_OK;
}

/* A free composite request slot for an op of g that posts need sends and receives, taken;
 * NULL and *rc (LIMIT) when none is free or the connection lacks the requests. */
struct lc_cop *lc_cop_new(coll_group *g, int need, int *idx, coll_err *rc)
{
    coll_conn *c = g->conn;
    pthread_mutex_lock(&c->lock);
    if (!c->sops) c->sops = calloc(LC_COP_OPS, sizeof(*c->sops));
    int k = -1;
    for (int i = 0; c->sops && i < LC_COP_OPS && k < 0; i++)
        if (!c->sops[i].used) k = i;
    if (k < 0 || need > LC_COP_SUBS || c->nfree < (uint32_t)need) {
        pthread_mutex_unlock(&c->lock);
        *rc = lc_fail(COLL_ERR_LIMIT,
                      !c->sops             ? "no memory for composite ops (%d, %d)"
                      : need > LC_COP_SUBS ? "an op of %d sends and receives: at most %d"
                                           : "%d composite ops, or %d requests, in flight: wait "
                                             "for some first",
                      need > LC_COP_SUBS ? need : LC_COP_OPS,
                      need > LC_COP_SUBS ? LC_COP_SUBS : WIRE_RING_ENTRIES);
        return NULL;
    }
    struct lc_cop *op = &c->sops[k];
    uint32_t gen = op->gen + 1;
    memset(op, 0, sizeof(*op));
    op->gen = gen;
    op->used = 1;
    op->g = g;
    op->sig = -1;
    pthread_mutex_unlock(&c->lock);
    *idx = k;
    return op;
}

coll_request lc_cop_req(const struct lc_cop *op, int idx)
{
    return (coll_request){(uint64_t)op->gen << 32 | 0x80000000u | (uint32_t)idx};
}

/* ---- completion ------------------------------------------------------------------- */

static struct lc_cop *op_of(coll_conn *c, coll_request req)
{
    uint32_t idx = (uint32_t)req.id & 0x7fffffffu, gen = (uint32_t)(req.id >> 32);
    if (!c->sops || idx >= LC_COP_OPS) return NULL;
    struct lc_cop *op = &c->sops[idx];
    return op->used && op->gen == gen ? op : NULL;
}

/* Take the op to move it: NULL (and INVALID) when it is unknown, *busy when another
 * thread moves it. */
static struct lc_cop *take(coll_conn *c, coll_request req, int *busy)
{
    for (;;) {
        pthread_mutex_lock(&c->lock);
        struct lc_cop *op = op_of(c, req);
        int moved = op && op->rsag.moving; /* its second step, for a moment (rsag.c) */
        *busy = op && op->waiting;
        if (op && !*busy && !moved) op->waiting = 1;
        pthread_mutex_unlock(&c->lock);
        if (!moved) return op;
        sched_yield();
    }
}

/* Every send and receive is done: the local step, then the op's slot is free. */
static coll_err finish(coll_conn *c, struct lc_cop *op)
{
    if (op->st == COLL_OK && op->reduce) {
        const void *srcs[WIRE_CHILD_MAX];
        size_t es = coll_dtype_size((coll_dtype)op->dtype);
        for (uint64_t off = 0; off < op->count; off += REDUCE_CHUNK) {
            size_t k = op->count - off < REDUCE_CHUNK ? (size_t)(op->count - off) : REDUCE_CHUNK;
            for (int j = 0; j < op->nsrc; j++)
                srcs[j] = op->src + (size_t)j * op->bytes + off * es;
            reduce_n(op->dtype, op->redop, (char *)op->dst + off * es, srcs, op->nsrc, k,
                     (uint32_t)op->nsrc);
        }
    }
    coll_err st = op->st;
    char why[WIRE_ERRMSG_MAX];
    snprintf(why, sizeof(why), "%s", op->why);
    /* an op in two steps whose first went well here, refused in its second */
    int told = op->rsag.on && op->rsag.step == 1 && !op->rsag.bad1;
    pthread_mutex_lock(&c->lock);
    if (op->rsag.live) atomic_fetch_sub(&c->staged, 1); /* failed in its first step */
    op->rsag.live = 0;
    if (op->sc) op->sc->busy = 0;
    op->used = 0;
    op->waiting = 0;
    pthread_mutex_unlock(&c->lock);
    if (st == COLL_ERR_MISMATCH && told)
        return lc_fail(st,
                       "allreduce in two steps: another rank's first step disagreed "
                       "(counts, dtypes or ops differ across ranks): %s",
                       why);
    return st == COLL_OK ? COLL_OK : lc_fail(st, "%s", why);
}

static void let_go(coll_conn *c, struct lc_cop *op)
{
    pthread_mutex_lock(&c->lock);
    op->waiting = 0;
    pthread_mutex_unlock(&c->lock);
}

coll_err lc_cop_wait(coll_conn *c, coll_request req, int timeout_ms)
{
    int busy;
    struct lc_cop *op = take(c, req, &busy);
    if (!op) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (busy) return lc_fail(COLL_ERR_INVALID, "another thread waits for this request");
    int64_t deadline = timeout_ms >= 0 ? now_ns() + (int64_t)timeout_ms * NS_PER_MS : 0;
    do { /* an op in two steps: the second once the first is done (rsag.c) */
        for (int i = 0; i < op->nsub; i++) {
            if (op->subdone[i]) continue;
            int left = -1;
            if (deadline) {
                int64_t l = deadline - now_ns();
                left = l <= 0 ? 0 : (int)(l / NS_PER_MS);
            }
            coll_err st = lc_wait_one(c, op->sub[i], left);
            if (lc_req_live(c, op->sub[i])) { /* still pending: the time given is up */
                let_go(c, op);
                return lc_fail(COLL_ERR_TIMEOUT, "request still pending after %d ms", timeout_ms);
            }
            lc_cop_sub_done(op, i, st);
        }
    } while (op->rsag.on && lc_rsag_next(c, op));
    return finish(c, op);
}

coll_err lc_cop_test(coll_conn *c, coll_request req, int *done)
{
    int busy;
    *done = 0;
    struct lc_cop *op = take(c, req, &busy);
    if (!op) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (busy) return COLL_OK; /* another thread moves it: pending for this one */
    int all = lc_cop_try_subs(c, op);
    if (!all || (op->rsag.on && lc_rsag_next(c, op))) {
        let_go(c, op); /* its second step is out */
        return COLL_OK;
    }
    *done = 1;
    return finish(c, op);
}

size_t lc_cop_subs(coll_conn *c, coll_request req, coll_request *out, size_t cap)
{
    size_t k = 0;
    pthread_mutex_lock(&c->lock);
    struct lc_cop *op = op_of(c, req);
    for (int i = 0; op && i < op->nsub && k < cap; i++)
        if (!op->subdone[i]) out[k++] = op->sub[i];
    pthread_mutex_unlock(&c->lock);
    return k;
}

coll_err lc_cop_wait_stream(coll_conn *c, coll_request req, void *stream, int keep)
{
    pthread_mutex_lock(&c->lock);
    struct lc_cop *op = op_of(c, req);
    int gpu = op && op->g->gpu;
    pthread_mutex_unlock(&c->lock);
    if (!op) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (!gpu) return lc_fail(COLL_ERR_INVALID, "not a GPU op: wait for it with coll_wait");
    if (!keep)
        return lc_fail(COLL_ERR_INVALID,
                       "a GPU group's gather, scatter or alltoallv: coll_wait_stream_keep, then "
                       "coll_wait or coll_test on the host");
    coll_request subs[LC_COP_SUBS];
    size_t n = lc_cop_subs(c, req, subs, LC_COP_SUBS);
    for (size_t i = 0; i < n; i++) {
        coll_err e = lc_wait_stream(c, subs[i], stream, 1);
        if (e != COLL_OK) return e;
    }
    return COLL_OK;
}

void lc_cop_drain(coll_group *g)
{
    coll_conn *c = g->conn;
    for (int i = 0; i < LC_COP_OPS; i++) {
        pthread_mutex_lock(&c->lock);
        struct lc_cop *op = c->sops && c->sops[i].used && c->sops[i].g == g ? &c->sops[i] : NULL;
        coll_request r = op ? lc_cop_req(op, i) : (coll_request){0};
        pthread_mutex_unlock(&c->lock);
        if (op) lc_cop_wait(c, r, -1);
    }
}

/* ---- gather, scatter, alltoallv ------------------------------------------------------ */

enum { GATHER, SCATTER, ALLTOALLV };
static const char *const names[] = {"gather", "scatter", "alltoallv"};

struct vop {
    int kind, dtype, root;
    const char *send;
    char *recv;
    size_t count; /* gather, scatter */
    const size_t *sc, *sd, *rc, *rd;
};

/* elements x es, or -1 on overflow */
static int bytes_of(size_t elems, size_t es, size_t *out)
{
    if (es && elems > SIZE_MAX / es) return -1;
    *out = elems * es;
    return 0;
}

/* The extent in elements of blocks (counts, displs) of n ranks; -1 on overflow. */
static int extent(const size_t *counts, const size_t *displs, int n, size_t *out)
{
    size_t end = 0;
    for (int j = 0; j < n; j++) {
        if (displs[j] > SIZE_MAX - counts[j]) return -1;
        if (counts[j] && displs[j] + counts[j] > end) end = displs[j] + counts[j];
    }
    *out = end;
    return 0;
}

/* Every argument checked before anything is sent. */
static coll_err check(coll_group *g, const struct vop *v, int n, int me, size_t es)
{
    const char *what = names[v->kind];
    if (v->kind != ALLTOALLV && (v->root < 0 || v->root >= n))
        return lc_fail(COLL_ERR_INVALID, "%s: root %d is outside the group (size %d)", what,
                       v->root, n);
    size_t in = 0, out = 0, all;
    if (v->kind != ALLTOALLV) {
        if (bytes_of(v->count, es, &in) < 0 || bytes_of(in, (size_t)n, &all) < 0)
            return lc_fail(COLL_ERR_INVALID, "%s: count %zu overflows", what, v->count);
        out = in;
        if (me == v->root) {
            if (v->kind == GATHER)
                out = all;
            else
                in = all;
        } else if (v->kind == GATHER) {
            out = 0;
        } else {
            in = 0;
        }
    } else {
        if (!v->sc || !v->sd || !v->rc || !v->rd)
            return lc_fail(COLL_ERR_INVALID, "alltoallv: a NULL count or displacement array");
        size_t se, re;
        if (extent(v->sc, v->sd, n, &se) < 0 || extent(v->rc, v->rd, n, &re) < 0 ||
            bytes_of(se, es, &in) < 0 || bytes_of(re, es, &out) < 0)
            return lc_fail(COLL_ERR_INVALID, "alltoallv: a count plus its displacement overflows");
        if (v->rc[me] != v->sc[me])
            return lc_fail(COLL_ERR_INVALID,
                           "alltoallv: this rank sends itself %zu elements and receives %zu",
                           v->sc[me], v->rc[me]);
        if (in && out && v->send < v->recv + out && v->recv < v->send + in)
            return lc_fail(COLL_ERR_INVALID, "alltoallv: send and recv overlap (no in-place form)");
    }
    coll_err rc = lc_cop_in_coll(g, "send", v->send, in);
    return rc == COLL_OK ? lc_cop_in_coll(g, "recv", v->recv, out) : rc;
}

/* The op fails with e (said: lc_fail), what it posted already running on. */
static void cop_fail(struct lc_cop *op, coll_err e)
{
    op->st = e;
    snprintf(op->why, sizeof(op->why), "%s", coll_last_error());
}

/* A block of this rank's own, from src to dst (a GPU group's: on the op's stream). */
static coll_err own_block(const coll_group *g, void *stream, void *dst, const void *src,
                          size_t bytes)
{
    if (!bytes || dst == src) return COLL_OK;
    if (!g->gpu) {
        memmove(dst, src, bytes);
        return COLL_OK;
    }
    char why[160];
    if (lcgpu_copy_on(stream, dst, src, bytes, why, sizeof(why)) < 0)
        return lc_fail(COLL_ERR_INVALID, "%s", why);
    return COLL_OK;
}

static coll_err vsubmit(coll_group *g, struct vop *v, void *stream, coll_request *req)
{
    if (!req) return lc_fail(COLL_ERR_INVALID, "%s: NULL request", names[v->kind]);
    req->id = 0;
    if (!g) return lc_fail(COLL_ERR_INVALID, "%s: NULL group", names[v->kind]);
    if ((unsigned)v->dtype >= COLL_DTYPE_COUNT)
        return lc_fail(COLL_ERR_INVALID, "%s: dtype %d out of range", names[v->kind], v->dtype);
    int n = g->info.size, me = g->info.rank;
    size_t es = coll_dtype_size((coll_dtype)v->dtype);
    coll_err rc = check(g, v, n, me, es);
    if (rc != COLL_OK) return rc;
    coll_group *on = g;
    const int *ranks = NULL;
    uint32_t tag = COMPOSE_TAG;
    pthread_mutex_t *posting = &compose_posting;
    if (g->span) { /* a child across pods: its root's sends and receives, on its own tag */
        pthread_mutex_lock(&g->conn->lock);
        on = g->span->root;
        pthread_mutex_unlock(&g->conn->lock);
        ranks = g->span->ranks;
        tag = lc_span_tag(g->span->id, LC_SPAN_SUB_OPS);
        posting = &g->span->posting;
        if (!on)
            return lc_fail(COLL_ERR_INVALID,
                           "group '%s': the group it was made from is closed; close this one too",
                           g->info.name);
    }
    if (g->gpu) tag = 0; /* NCCL pairs them in order, by peer alone */
    int need = v->kind == ALLTOALLV ? 2 * (n - 1) : me == v->root ? n - 1 : 1;
    if (n == 1) need = 0;
    int idx;
    struct lc_cop *op = lc_cop_new(g, need, &idx, &rc);
    if (!op) return rc;
    if (g->gpu) { /* on the stream; posted as one NCCL group */
        op->stream = stream;
        op->more_left = need;
    }
    size_t bytes = v->count * es;
    pthread_mutex_lock(posting);
    for (int j = 0; j < n; j++) {
        int peer = ranks ? ranks[j] : j;
        if (v->kind == ALLTOALLV) {
            if (j == me) {
                if (op->st == COLL_OK) {
                    coll_err e = own_block(g, stream, v->recv + v->rd[j] * es,
                                           v->send + v->sd[j] * es, v->sc[j] * es);
                    if (e != COLL_OK) cop_fail(op, e);
                }
                continue;
            }
            lc_cop_post(op, on, WIRE_OP_RECV, NULL, v->recv + v->rd[j] * es, v->rc[j], v->dtype,
                        peer, tag);
            lc_cop_post(op, on, WIRE_OP_SEND, v->send + v->sd[j] * es, NULL, v->sc[j], v->dtype,
                        peer, tag);
        } else if (me != v->root) { /* one send or receive, with the root */
            if (j != v->root) continue;
            if (v->kind == GATHER)
                lc_cop_post(op, on, WIRE_OP_SEND, v->send, NULL, v->count, v->dtype, peer, tag);
            else
                lc_cop_post(op, on, WIRE_OP_RECV, NULL, v->recv, v->count, v->dtype, peer, tag);
        } else if (j == me) { /* the root's own block; in place: already there */
            char *dst = v->kind == GATHER ? v->recv + (size_t)j * bytes : v->recv;
            const char *src = v->kind == GATHER ? v->send : v->send + (size_t)j * bytes;
            if (op->st == COLL_OK) {
                coll_err e = own_block(g, stream, dst, src, bytes);
                if (e != COLL_OK) cop_fail(op, e);
            }
        } else if (v->kind == GATHER) {
            lc_cop_post(op, on, WIRE_OP_RECV, NULL, v->recv + (size_t)j * bytes, v->count, v->dtype,
                        peer, tag);
        } else {
            lc_cop_post(op, on, WIRE_OP_SEND, v->send + (size_t)j * bytes, NULL, v->count, v->dtype,
                        peer, tag);
        }
    }
    pthread_mutex_unlock(posting);
    *req = lc_cop_req(op, idx);
    return COLL_OK;
}

coll_err coll_gather(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                     int root, void *stream, coll_request *req)
{
    struct vop v = {
        .kind = GATHER, .dtype = dt, .root = root, .send = send, .recv = recv, .count = count};
    return vsubmit(g, &v, stream, req);
}

coll_err coll_scatter(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                      int root, void *stream, coll_request *req)
{
    struct vop v = {
        .kind = SCATTER, .dtype = dt, .root = root, .send = send, .recv = recv, .count = count};
    return vsubmit(g, &v, stream, req);
}

coll_err coll_alltoallv(coll_group *g, const void *send, const size_t *send_counts,
                        const size_t *send_displs, void *recv, const size_t *recv_counts,
                        const size_t *recv_displs, coll_dtype dt, void *stream, coll_request *req)
{
    struct vop v = {.kind = ALLTOALLV,
                    .dtype = dt,
                    .send = send,
                    .recv = recv,
                    .sc = send_counts,
                    .sd = send_displs,
                    .rc = recv_counts,
                    .rd = recv_displs};
    return vsubmit(g, &v, stream, req);
}
