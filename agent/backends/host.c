/*
 * host.c: the host backend for participants inside one pod. Every rank's buffer is
 * mapped in the agent, so a collective is a set of copies and one reduction pass
 * per chunk, straight from the senders' memory into the receivers' with one
 * cache-resident scratch chunk in between (that also makes in-place use safe).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../group.h"
#include "../reduce.h"
#include "coll/coll.h"
#include "wire.h"

/* memmove: a client may hand the agent ranges that overlap (its own send and receive);
 * the result is then its own business, but never undefined behaviour in the agent */
static void copy(void *dst, const void *src, size_t n)
{
    if (dst != src && n) memmove(dst, src, n);
}

/* Reduce block `block` (count elements) of every rank's send into dsts (one or all). */
static void reduce_block(void *scratch, const struct backend_task *t, size_t block,
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
        reduce_n(t->dtype, t->redop, scratch, srcs, n, len, (uint32_t)n);
        for (int d = 0; d < ndst; d++) {
            int r = ndst == 1 ? dst_rank : d;
            if (dsts[r]) memcpy((char *)dsts[r] + off * es, scratch, len * es);
        }
    }
}

/* Swap n bytes of a and b through scratch (HOST_SCRATCH_BYTES). */
static void swap(void *scratch, char *a, char *b, size_t n)
{
    for (size_t off = 0; off < n; off += HOST_SCRATCH_BYTES) {
        size_t len = n - off < HOST_SCRATCH_BYTES ? n - off : HOST_SCRATCH_BYTES;
        memcpy(scratch, a + off, len);
        memcpy(a + off, b + off, len);
        memcpy(b + off, scratch, len);
    }
}

/* Rank r's block j of the result is rank j's block r of the input. Each pair of ranks
 * trades two blocks, and a rank in place (send == recv) reads a block of its own the
 * other rank writes, so the order of the pair's two copies is chosen for it (both in
 * place: a swap through the scratch chunk). No copy of a whole buffer, no allocation:
 * the same bytes move as out of place. */
static void alltoall(void *scratch, const struct backend_task *t, size_t bytes)
{
    int n = t->nranks;
    for (int r = 0; r < n; r++) {
        copy((char *)t->recv[r] + (size_t)r * bytes, (const char *)t->send[r] + (size_t)r * bytes,
             bytes);
        for (int j = r + 1; j < n; j++) {
            char *a = (char *)t->recv[r] + (size_t)j * bytes; /* <- j's block r */
            char *b = (char *)t->recv[j] + (size_t)r * bytes; /* <- r's block j */
            const char *sa = (const char *)t->send[j] + (size_t)r * bytes;
            const char *sb = (const char *)t->send[r] + (size_t)j * bytes;
            int r_in = t->send[r] == t->recv[r], j_in = t->send[j] == t->recv[j];
            if (r_in && j_in) {
                swap(scratch, a, b, bytes);
            } else if (r_in) { /* sb is a: read it before a is written */
                copy(b, sb, bytes);
                copy(a, sa, bytes);
            } else { /* j in place (sa is b: read it first), or neither */
                copy(a, sa, bytes);
                copy(b, sb, bytes);
            }
        }
    }
}

int host_run(void *x, const struct backend_task *t)
{
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
    case WIRE_OP_ALLTOALL:
        alltoall(x, t, bytes);
        break;
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

/* ---- the backend of groups inside one pod ----------------------------------------- */

static int host_probe(char *why, size_t whylen)
{
    snprintf(why, whylen, "always");
    return 0;
}

static int host_init(struct group *g)
{
    _Static_assert(HOST_SCRATCH_BYTES >= REDUCE_CHUNK * sizeof(uint64_t), "scratch too small");
    g->be_ctx = malloc(HOST_SCRATCH_BYTES);
    if (!g->be_ctx) {
        snprintf(g->backend_why, sizeof(g->backend_why), "backend state: out of memory");
        return -1;
    }
    return 0;
}

static void host_fini(struct group *g)
{
    free(g->be_ctx);
    g->be_ctx = NULL;
}

static int host_accept(const struct group *g, int slot, const struct op *op, char *why,
                       size_t whylen)
{
    return backend_check_placement(g, slot, op, -1, why, whylen);
}

static void host_collective(struct group *g, struct op *ops, uint64_t seq, int64_t deadline_ns)
{
    (void)seq, (void)deadline_ns;
    void *send[64], *recv[64];
    int status = COLL_ERR_UNSUPPORTED;
    const struct wire_sqe *s = &ops[0].sqe;
    if (g->nslots <= 64) {
        for (int k = 0; k < g->nslots; k++) {
            send[k] = ops[k].send;
            recv[k] = ops[k].recv;
        }
        struct backend_task t = {.kind = s->kind,
                                 .dtype = s->dtype,
                                 .redop = s->redop,
                                 .root = s->peer,
                                 .count = s->count,
                                 .nranks = g->nslots,
                                 .send = send,
                                 .recv = recv};
        status = host_run(g->be_ctx, &t);
    }
    for (int k = 0; k < g->nslots; k++)
        g->op_done(g, &ops[k], status, NULL);
}

static int host_p2p(struct group *g, struct op *op)
{
    (void)g, (void)op;
    return 0; /* both ends are here: the group pairs them */
}

int host_pair(struct group *g, struct op *snd, struct op *rcv)
{
    (void)g;
    void *s[1] = {snd->send}, *d[1] = {rcv->recv};
    struct backend_task t = {.kind = WIRE_OP_SEND,
                             .dtype = snd->sqe.dtype,
                             .count = snd->sqe.count,
                             .nranks = 1,
                             .send = s,
                             .recv = d};
    return host_run(NULL, &t); /* a copy needs no scratch */
}

static void host_forget(struct group *g, const struct session *s)
{
    (void)g, (void)s; /* ops run to completion inside host_collective */
}

static int host_devices(const struct group *g, int *devs, int max)
{
    (void)g, (void)devs, (void)max;
    return 0;
}

const struct backend_ops backend_host = {
    .name = "host",
    .probe = host_probe,
    .init = host_init,
    .fini = host_fini,
    .accept = host_accept,
    .collective = host_collective,
    .p2p = host_p2p,
    .pair = host_pair,
    .forget_session = host_forget,
    .devices = host_devices,
};
