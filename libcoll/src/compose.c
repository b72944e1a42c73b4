/*
 * compose.c: gather, scatter and all-to-all with blocks of any size, for every host group,
 * as composite requests of tagged sends and receives (span.c's machinery): the group's own
 * for a group with an agent handle, its root's for a child across pods. Each op posts
 * all its sends and receives at once under a lock, on one tag of coll's own, so the n-th
 * such op of two ranks pairs with the n-th of the other whatever else runs. A block whose
 * sizes disagree between sender and receiver fails both with MISMATCH (the sends and
 * receives' own check).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "lc.h"

/* the tag of a group with an agent handle: above every child's (span.c: ids below
 * LC_SPAN_IDS) and below creation's */
#define COMPOSE_TAG (LC_SPAN_TAG_BASE | LC_SPAN_IDS << 13 | (LC_SPAN_SUB_OPS - 1))

static pthread_mutex_t compose_posting = PTHREAD_MUTEX_INITIALIZER;

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
    if (g->gpu)
        return lc_fail(COLL_ERR_UNSUPPORTED,
                       "%s on GPU group '%s': host groups only (not yet on NCCL)", what,
                       g->info.name);
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
    coll_err rc = lc_span_in_coll(g, "send", v->send, in);
    return rc == COLL_OK ? lc_span_in_coll(g, "recv", v->recv, out) : rc;
}

static coll_err vsubmit(coll_group *g, struct vop *v, coll_request *req)
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
    if (g->span) {
        lc_span_route(g, &on, &ranks, &tag, &posting);
        if (!on)
            return lc_fail(COLL_ERR_INVALID,
                           "group '%s': the group it was made from is closed; close this one too",
                           g->info.name);
    }
    int need = v->kind == ALLTOALLV ? 2 * (n - 1) : me == v->root ? n - 1 : 1;
    if (n == 1) need = 0;
    int idx;
    struct lc_span_op *op = lc_span_op_new(g, need, &idx, &rc);
    if (!op) return rc;
    size_t bytes = v->count * es;
    pthread_mutex_lock(posting);
    for (int j = 0; j < n; j++) {
        int peer = ranks ? ranks[j] : j;
        if (v->kind == ALLTOALLV) {
            if (j == me) {
                if (v->sc[j])
                    memmove(v->recv + v->rd[j] * es, v->send + v->sd[j] * es, v->sc[j] * es);
                continue;
            }
            lc_span_post(op, on, WIRE_OP_RECV, NULL, v->recv + v->rd[j] * es, v->rc[j], v->dtype,
                         peer, tag);
            lc_span_post(op, on, WIRE_OP_SEND, v->send + v->sd[j] * es, NULL, v->sc[j], v->dtype,
                         peer, tag);
        } else if (me != v->root) { /* one send or receive, with the root */
            if (j != v->root) continue;
            if (v->kind == GATHER)
                lc_span_post(op, on, WIRE_OP_SEND, v->send, NULL, v->count, v->dtype, peer, tag);
            else
                lc_span_post(op, on, WIRE_OP_RECV, NULL, v->recv, v->count, v->dtype, peer, tag);
        } else if (j == me) { /* the root's own block; in place: already there */
            char *dst = v->kind == GATHER ? v->recv + (size_t)j * bytes : v->recv;
            const char *src = v->kind == GATHER ? v->send : v->send + (size_t)j * bytes;
            if (bytes && dst != src) memmove(dst, src, bytes);
        } else if (v->kind == GATHER) {
            lc_span_post(op, on, WIRE_OP_RECV, NULL, v->recv + (size_t)j * bytes, v->count,
                         v->dtype, peer, tag);
        } else {
            lc_span_post(op, on, WIRE_OP_SEND, v->send + (size_t)j * bytes, NULL, v->count,
                         v->dtype, peer, tag);
        }
    }
    pthread_mutex_unlock(posting);
    *req = lc_span_op_req(op, idx);
    return COLL_OK;
}

coll_err coll_gather(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                     int root, void *stream, coll_request *req)
{
    (void)stream;
    struct vop v = {
        .kind = GATHER, .dtype = dt, .root = root, .send = send, .recv = recv, .count = count};
    return vsubmit(g, &v, req);
}

coll_err coll_scatter(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                      int root, void *stream, coll_request *req)
{
    (void)stream;
    struct vop v = {
        .kind = SCATTER, .dtype = dt, .root = root, .send = send, .recv = recv, .count = count};
    return vsubmit(g, &v, req);
}

coll_err coll_alltoallv(coll_group *g, const void *send, const size_t *send_counts,
                        const size_t *send_displs, void *recv, const size_t *recv_counts,
                        const size_t *recv_displs, coll_dtype dt, void *stream, coll_request *req)
{
    (void)stream;
    struct vop v = {.kind = ALLTOALLV,
                    .dtype = dt,
                    .send = send,
                    .recv = recv,
                    .sc = send_counts,
                    .sd = send_displs,
                    .rc = recv_counts,
                    .rd = recv_displs};
    return vsubmit(g, &v, req);
}
