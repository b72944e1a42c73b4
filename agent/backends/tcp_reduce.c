/*
 * tcp_reduce.c: the reductions of the tcp backend's ops on this side: the local
 * participants' contributions into one (a premultiplied sum scales them there), the
 * pods' contributions in pod order or in a tree, and an average's division at the end.
 * Pure computation over struct opctx: nothing here moves bytes or calls back into tcp.c.
 */
#include "tcp_priv.h"

#include <string.h>

#include "../reduce.h"
#include "coll/coll.h"
#include "wire.h"

/* dst[i] = op over srcs (n of them, count elements), chunked; dst may be srcs[0]. With
 * scalars, each source's own (the local contributions of a premultiplied sum): scaled as
 * they are summed. */
static void reduce_all(struct opctx *o, void *dst, const void *const *srcs, const uint64_t *scalars,
                       int n, size_t count)
{
    size_t es = o->es;
    const void *s[RDV_MAX_NODES + NET_MAX_LOCAL];
    for (size_t off = 0; off < count; off += REDUCE_CHUNK) {
        size_t len = count - off < REDUCE_CHUNK ? count - off : REDUCE_CHUNK;
        for (int k = 0; k < n; k++)
            s[k] = (const char *)srcs[k] + off * es;
        /* dst may alias srcs[0] only, which both kernels allow */
        if (scalars)
            reduce_premul_n(o->t->dtype, (char *)dst + off * es, s, scalars, n, len);
        else
            reduce_n(o->t->dtype, o->red_op, (char *)dst + off * es, s, n, len, 1);
    }
}

/* mine = the reduction, in pod order, of every pod's contribution: ours in mine, pod p's
 * at in + p * bytes (our own slot there is unused and serves as the output). The same
 * order on every pod is what makes the results identical everywhere. */
void tcp_reduce_in_pod_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count)
{
    const void *srcs[RDV_MAX_NODES];
    for (int p = 0; p < o->c->nodes; p++)
        srcs[p] = p == o->c->me ? (const void *)mine : in + (size_t)p * bytes;
    void *out = in + (size_t)o->c->me * bytes;
    reduce_all(o, out, srcs, NULL, o->c->nodes, count);
    if (bytes) memcpy(mine, out, bytes);
}

void tcp_reduce_in_tree_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count)
{
    int n = o->c->nodes;
    if (bytes) memcpy(in + (size_t)o->c->me * bytes, mine, bytes);
    for (int w = 1; w < n; w *= 2)
        for (int p = 0; p + w < n; p += 2 * w) {
            void *a = in + (size_t)p * bytes;
            const void *srcs[2] = {a, in + (size_t)(p + w) * bytes};
            reduce_all(o, a, srcs, NULL, 2, count);
        }
    if (bytes) memcpy(mine, in, bytes);
}

/* dst = reduction of the local participants' send buffers at element offset off. */
void tcp_local_reduce(struct opctx *o, void *dst, size_t off, size_t count)
{
    int n = o->c->nlocal, premul = o->t->redop == WIRE_REDOP_PREMUL;
    const void *srcs[NET_MAX_LOCAL];
    uint64_t sc[NET_MAX_LOCAL];
    for (int s = 0; s < n; s++) {
        srcs[s] = (const char *)o->t->send[s] + off * o->es;
        sc[s] = o->t->premul[s];
    }
    if (n == 1 && !premul) {
        if (dst != srcs[0] && count) memcpy(dst, srcs[0], count * o->es);
        return;
    }
    /* an in-place participant's send may be dst itself: put it first (with its scalar) */
    for (int s = 1; s < n; s++) {
        if (srcs[s] == dst) {
            const void *tmp = srcs[0];
            uint64_t t = sc[0];
            srcs[0] = srcs[s];
            srcs[s] = tmp;
            sc[0] = sc[s];
            sc[s] = t;
        }
    }
    reduce_all(o, dst, srcs, premul ? sc : NULL, n, count);
}

void tcp_finish_avg(struct opctx *o, void *buf, size_t count)
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
