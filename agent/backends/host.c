/*
 * host.c: the host backend for participants inside one pod. Every rank's buffer is
 * mapped in the agent, so a collective is a set of copies and one reduction pass
 * per chunk, straight from the senders' memory into the receivers' with one
 * cache-resident scratch chunk in between (that also makes in-place use safe).
 */
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../reduce.h"
#include "coll/coll.h"
#include "wire.h"

struct host_ctx {
    uint64_t scratch[REDUCE_CHUNK]; /* REDUCE_CHUNK elements of the widest dtype */
};

static int host_probe(char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    return 0;
}

static void *host_ctx_new(void)
{
    return malloc(sizeof(struct host_ctx));
}

static void host_ctx_free(void *ctx)
{
    free(ctx);
}

static void copy(void *dst, const void *src, size_t n)
{
    if (dst != src && n) memcpy(dst, src, n);
}

/* Reduce block `block` (count elements) of every rank's send into dsts (one or all). */
static void reduce_block(struct host_ctx *x, const struct backend_task *t, size_t block,
                         void *const *dsts, int ndst, int dst_rank)
{
    size_t es = coll_dtype_size(t->dtype);
    const void *srcs[64];
    int n = t->nranks;
    for (size_t off = 0; off < t->count; off += REDUCE_CHUNK) {
        size_t len = t->count - off < REDUCE_CHUNK ? t->count - off : REDUCE_CHUNK;
        size_t boff = (block * t->count + off) * es;
        for (int r = 0; r < n; r++)
            srcs[r] = (const char *)t->send[r] + boff;
        reduce_n(t->dtype, t->redop, x->scratch, srcs, n, len, (uint32_t)n);
        for (int d = 0; d < ndst; d++) {
            int r = ndst == 1 ? dst_rank : d;
            if (dsts[r]) memcpy((char *)dsts[r] + off * es, x->scratch, len * es);
        }
    }
}

static int host_run(void *ctx, const struct backend_task *t)
{
    struct host_ctx *x = ctx;
    size_t es = coll_dtype_size(t->dtype);
    size_t bytes = (size_t)t->count * es;
    int n = t->nranks;
    if (n > 64) return COLL_ERR_UNSUPPORTED;
    if (t->count == 0 && t->kind != WIRE_OP_BARRIER) return COLL_OK;
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        if (n == 1 && t->redop != COLL_AVG) {
            copy(t->recv[0], t->send[0], bytes);
            break;
        }
        reduce_block(x, t, 0, t->recv, n, 0);
        break;
    case WIRE_OP_REDUCE:
        reduce_block(x, t, 0, t->recv, 1, t->root);
        break;
    case WIRE_OP_BROADCAST:
        for (int r = 0; r < n; r++)
            copy(t->recv[r], t->send[t->root], bytes);
        break;
    case WIRE_OP_ALLGATHER:
        for (int r = 0; r < n; r++)
            for (int j = 0; j < n; j++)
                copy((char *)t->recv[r] + (size_t)j * bytes, t->send[j], bytes);
        break;
    case WIRE_OP_REDUCE_SCATTER:
        for (int r = 0; r < n; r++) {
            void *dst[64] = {0};
            dst[r] = t->recv[r];
            reduce_block(x, t, (size_t)r, dst, 1, r);
        }
        break;
    case WIRE_OP_ALLTOALL: {
        /* In-place ranks read their input from a snapshot taken before any write. */
        void *snap[64] = {0};
        const void *src[64];
        int rc = COLL_OK;
        for (int j = 0; j < n; j++) {
            src[j] = t->send[j];
            if (t->send[j] == t->recv[j]) {
                snap[j] = malloc(bytes * (size_t)n);
                if (!snap[j]) {
                    rc = COLL_ERR_NOMEM;
                    break;
                }
                memcpy(snap[j], t->send[j], bytes * (size_t)n);
                src[j] = snap[j];
            }
        }
        if (rc == COLL_OK)
            for (int r = 0; r < n; r++)
                for (int j = 0; j < n; j++)
                    copy((char *)t->recv[r] + (size_t)j * bytes,
                         (const char *)src[j] + (size_t)r * bytes, bytes);
        for (int j = 0; j < n; j++)
            free(snap[j]);
        return rc;
    }
    case WIRE_OP_SEND:
        copy(t->recv[0], t->send[0], bytes);
        break;
    case WIRE_OP_BARRIER:
        break;
    default:
        return COLL_ERR_UNSUPPORTED;
    }
    return COLL_OK;
}

const struct backend_ops backend_host = {
    .name = "host",
    .probe = host_probe,
    .ctx_new = host_ctx_new,
    .ctx_free = host_ctx_free,
    .run = host_run,
};
