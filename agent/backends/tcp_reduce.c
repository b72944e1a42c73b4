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

/* dst[i] = the premultiplied sum of srcs, in chunks; dst may alias one source (it is
 * put first, as reduce_premul_n wants) */
static void premul_all(struct opctx *o, void *dst, const void *const *srcs, const uint64_t *scalars,
                       int n, size_t count)
{
    const void *s[NET_MAX_LOCAL];
    int first = 0;
    for (int k = 0; k < n; k++) /* the one that aliases dst first, with its scalar */
        if (srcs[k] == dst) first = k;
    uint64_t sc[NET_MAX_LOCAL];
    for (int k = 0; k < n; k++) {
        int from = k == 0 ? first : k == first ? 0 : k;
        sc[k] = scalars[from];
    }
    for (size_t off = 0; off < count; off += REDUCE_CHUNK) {
        size_t len = count - off < REDUCE_CHUNK ? count - off : REDUCE_CHUNK;
        for (int k = 0; k < n; k++) {
            int from = k == 0 ? first : k == first ? 0 : k;
            s[k] = (const char *)srcs[from] + off * o->es;
        }
        reduce_premul_n(o->t->dtype, (char *)dst + off * o->es, s, sc, n, len);
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
    reduce_all(o, out, srcs, o->c->nodes, count);
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
            reduce_all(o, a, srcs, 2, count);
        }
    if (bytes) memcpy(mine, in, bytes);
}

/* dst = reduction of the local participants' send buffers at element offset off. */
void tcp_local_reduce(struct opctx *o, void *dst, size_t off, size_t count)
{
    const void *srcs[NET_MAX_LOCAL];
    for (int s = 0; s < o->c->nlocal; s++)
        srcs[s] = (const char *)o->t->send[s] + off * o->es;
    if (o->t->redop == WIRE_REDOP_PREMUL) { /* scaled as they are summed */
        premul_all(o, dst, srcs, o->t->premul, o->c->nlocal, count);
        return;
    }
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
