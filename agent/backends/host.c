/*
 * host.c: the host backend for participants inside one pod. Every rank's buffer is
 * mapped in the agent, so a collective is a set of copies and one reduction pass
 * per chunk, straight from the senders' memory into the receivers' with one
 * cache-resident scratch chunk in between (that also makes in-place use safe).
 * It is the floor of the backends: the tcp backend pairs its in-pod sends and
 * receives with host_pair, and every backend checks placement with
 * backend_check_placement; nothing here calls up into backend.c or another backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../buffer.h"
#include "../group.h"
#include "../log.h"
#include "../reduce.h"
#include "util.h"
#include "coll/coll.h"
#include "wire.h"

int backend_check_placement(const struct group *g, int slot, const struct op *op, int want,
                            char *why, size_t whylen)
{
    int gpu_group = want >= 0;
    int gpu_op = (op->sqe.flags & WIRE_SQE_F_GPU) != 0;
    const struct buffer *bad = op->sb && op->sb->device != want   ? op->sb
                               : op->rb && op->rb->device != want ? op->rb
                                                                  : NULL;
    if (gpu_group != gpu_op)
        snprintf(why, whylen, "group '%s' runs on %s: its ops need %s", g->cfg->name, g->be->name,
                 gpu_group ? "GPU buffers and a stream" : "host buffers");
    else if (bad)
        snprintf(why, whylen, "slot %d of group '%s' runs on %s %d; a buffer of the op is on %s %d",
                 slot, g->cfg->name, want < 0 ? "the host" : "GPU", want,
                 bad->device < 0 ? "the host" : "GPU", bad->device);
    else
        return 0;
    return -1;
}

/* memmove: a client may hand the agent ranges that overlap (its own send and receive);
 * the result is then its own business, but never undefined behaviour in the agent */
static void copy(void *dst, const void *src, size_t n)
{
    if (dst != src && n) memmove(dst, src, n);
}

/* Reduce elements [e0, e0 + n) of block `block` (count elements) of every rank's send
 * into dsts (one or all), at the same elements. */
static void reduce_range(void *scratch, const struct backend_task *t, size_t block, size_t e0,
                         size_t n, void *const *dsts, int ndst, int dst_rank)
{
    size_t es = coll_dtype_size(t->dtype);
    const void *srcs[64];
    int nr = t->nranks;
    for (size_t off = e0; off < e0 + n; off += REDUCE_CHUNK) {
        size_t len = e0 + n - off < REDUCE_CHUNK ? e0 + n - off : REDUCE_CHUNK;
        size_t boff = (block * t->count + off) * es;
        for (int r = 0; r < nr; r++)
            srcs[r] = (const char *)t->send[r] + boff;
        if (t->redop == WIRE_REDOP_PREMUL)
            reduce_premul_n(t->dtype, scratch, srcs, t->premul, nr, len);
        else
            reduce_n(t->dtype, t->redop, scratch, srcs, nr, len, (uint32_t)nr);
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

/* Rank r's block j of the result is rank j's block r of the input (blocks of bytes);
 * bytes [b0, b0 + bl) of every block. Each pair of ranks trades two blocks, and a rank
 * in place (send == recv) reads a block of its own the other rank writes, so the order
 * of the pair's two copies is chosen for it (both in place: a swap through the scratch
 * chunk). No copy of a whole buffer, no allocation: the same bytes move as out of
 * place. */
static void alltoall(void *scratch, const struct backend_task *t, size_t bytes, size_t b0,
                     size_t bl)
{
    int n = t->nranks;
    for (int r = 0; r < n; r++) {
        copy((char *)t->recv[r] + (size_t)r * bytes + b0,
             (const char *)t->send[r] + (size_t)r * bytes + b0, bl);
        for (int j = r + 1; j < n; j++) {
            char *a = (char *)t->recv[r] + (size_t)j * bytes + b0; /* <- j's block r */
            char *b = (char *)t->recv[j] + (size_t)r * bytes + b0; /* <- r's block j */
            const char *sa = (const char *)t->send[j] + (size_t)r * bytes + b0;
            const char *sb = (const char *)t->send[r] + (size_t)j * bytes + b0;
            int r_in = t->send[r] == t->recv[r], j_in = t->send[j] == t->recv[j];
            if (r_in && j_in) {
                swap(scratch, a, b, bl);
            } else if (r_in) { /* sb is a: read it before a is written */
                copy(b, sb, bl);
                copy(a, sa, bl);
            } else { /* j in place (sa is b: read it first), or neither */
                copy(a, sa, bl);
                copy(b, sb, bl);
            }
        }
    }
}

static int kind_known(int kind)
{
    switch (kind) {
    case WIRE_OP_ALLREDUCE:
    case WIRE_OP_REDUCE:
    case WIRE_OP_BROADCAST:
    case WIRE_OP_ALLGATHER:
    case WIRE_OP_REDUCE_SCATTER:
    case WIRE_OP_ALLTOALL:
    case WIRE_OP_SEND:
    case WIRE_OP_BARRIER:
        return 1;
    default:
        return 0;
    }
}

/* Op t on elements [e0, e0 + n) of each of its blocks (of t->count elements): every op
 * is independent between such ranges, in place too, so a large one can run in slices. */
static void run_range(void *x, const struct backend_task *t, size_t e0, size_t n)
{
    size_t es = coll_dtype_size(t->dtype);
    size_t bytes = (size_t)t->count * es, b0 = e0 * es, bl = n * es;
    int nr = t->nranks;
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        if (nr == 1 && t->redop != COLL_AVG && t->redop != WIRE_REDOP_PREMUL)
            copy((char *)t->recv[0] + b0, (const char *)t->send[0] + b0, bl);
        else
            reduce_range(x, t, 0, e0, n, t->recv, nr, 0);
        break;
    case WIRE_OP_REDUCE:
        reduce_range(x, t, 0, e0, n, t->recv, 1, t->root);
        break;
    case WIRE_OP_BROADCAST:
        for (int r = 0; r < nr; r++)
            copy((char *)t->recv[r] + b0, (const char *)t->send[t->root] + b0, bl);
        break;
    case WIRE_OP_ALLGATHER:
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < nr; j++)
                copy((char *)t->recv[r] + (size_t)j * bytes + b0, (const char *)t->send[j] + b0,
                     bl);
        break;
    case WIRE_OP_REDUCE_SCATTER:
        for (int r = 0; r < nr; r++) {
            void *dst[64] = {0};
            dst[r] = t->recv[r];
            reduce_range(x, t, (size_t)r, e0, n, dst, 1, r);
        }
        break;
    case WIRE_OP_ALLTOALL:
        alltoall(x, t, bytes, b0, bl);
        break;
    case WIRE_OP_SEND:
        copy((char *)t->recv[0] + b0, (const char *)t->send[0] + b0, bl);
        break;
    default: /* a barrier moves nothing */
        break;
    }
}

int host_run(void *x, const struct backend_task *t)
{
    if (t->nranks > 64 || !kind_known(t->kind)) return COLL_ERR_UNSUPPORTED;
    if (t->count == 0) return COLL_OK;
    run_range(x, t, 0, t->count);
    return COLL_OK;
}

/* ---- the backend of groups inside one pod ----------------------------------------- */

static int host_probe(char *why, size_t whylen)
{
    snprintf(why, whylen, "always");
    return 0;
}

/*
 * A large op runs in slices, one per turn of the engine's loop (host_turn, at most
 * BACKEND_TURN_NS each), so that one group's GiB allreduce never holds the agent's other
 * sessions back: between two slices the engine serves every ring. The ops of a group
 * run in the order they matched, so once one is sliced the ops after it wait behind it.
 */
#define HOST_SLICE_BYTES ((size_t)1 << 20)  /* an op that moves more runs in slices */
#define HOST_STEP_BYTES ((size_t)256 << 10) /* bytes of each block per step of a slice */

struct host_job {
    struct host_job *next;
    struct backend_task t;
    void *send[64], *recv[64];
    uint64_t premul[64];
    uint64_t at; /* elements of each block done */
    uint32_t turns;
    struct op ops[]; /* copies (a session that ends meanwhile is forgotten here) */
};

struct host_ctx {
    uint64_t scratch[HOST_SCRATCH_BYTES / sizeof(uint64_t)];
    struct host_job *head, *tail;
};

static int host_init(struct group *g)
{
    _Static_assert(HOST_SCRATCH_BYTES >= REDUCE_CHUNK * 16, "scratch too small (complex128)");
    g->be_ctx = calloc(1, sizeof(struct host_ctx));
    if (!g->be_ctx) {
        snprintf(g->backend_why, sizeof(g->backend_why), "out of memory");
        return -1;
    }
    return 0;
}

/* Fail every op waiting or under way with err (the epoch ended, the agent stops). */
static void host_epoch_over(struct group *g, int err, const char *why)
{
    struct host_ctx *h = g->be_ctx;
    while (h && h->head) {
        struct host_job *j = h->head;
        h->head = j->next;
        for (int k = 0; k < j->t.nranks; k++)
            g->op_done(g, &j->ops[k], err, why);
        free(j);
    }
    if (h) h->tail = NULL;
}

static void host_fini(struct group *g)
{
    host_epoch_over(g, COLL_ERR_SHUTDOWN, "agent stopping");
    free(g->be_ctx);
    g->be_ctx = NULL;
}

static int host_accept(const struct group *g, int slot, const struct op *op, char *why,
                       size_t whylen)
{
    return backend_check_placement(g, slot, op, -1, why, whylen);
}

/* The bytes op t moves, roughly: what decides whether it runs in slices. */
static size_t moved(const struct backend_task *t)
{
    size_t v = (size_t)t->count * coll_dtype_size(t->dtype) * (size_t)t->nranks;
    int blocks = t->kind == WIRE_OP_ALLGATHER || t->kind == WIRE_OP_REDUCE_SCATTER ||
                 t->kind == WIRE_OP_ALLTOALL;
    return blocks ? v * (size_t)t->nranks : v;
}

static void host_collective(struct group *g, struct op *ops, uint64_t seq, int64_t deadline_ns)
{
    (void)seq, (void)deadline_ns;
    struct host_ctx *h = g->be_ctx;
    const struct wire_sqe *s = &ops[0].sqe;
    int n = g->nslots;
    struct backend_task t = {.kind = s->kind,
                             .dtype = s->dtype,
                             .redop = s->redop,
                             .root = s->peer,
                             .count = s->count,
                             .nranks = n};
    struct host_job *j = NULL;
    if (n <= 64 && kind_known(s->kind) && s->count && (h->head || moved(&t) > HOST_SLICE_BYTES))
        j = malloc(sizeof(*j) + (size_t)n * sizeof(struct op));
    void *send[64], *recv[64];
    uint64_t premul[64];
    void **sp = j ? j->send : send, **rp = j ? j->recv : recv;
    uint64_t *pp = j ? j->premul : premul;
    for (int k = 0; k < n && k < 64; k++) {
        sp[k] = ops[k].send;
        rp[k] = ops[k].recv;
        pp[k] = ops[k].premul;
    }
    t.send = sp;
    t.recv = rp;
    t.premul = pp;
    if (!j) { /* small, nothing ahead of it (or no memory for a job: at once, as before) */
        int status = n <= 64 ? host_run(h->scratch, &t) : COLL_ERR_UNSUPPORTED;
        for (int k = 0; k < n; k++)
            g->op_done(g, &ops[k], status, NULL);
        return;
    }
    j->next = NULL;
    j->t = t;
    j->at = 0;
    j->turns = 0;
    memcpy(j->ops, ops, (size_t)n * sizeof(struct op));
    if (h->tail)
        h->tail->next = j;
    else
        h->head = j;
    h->tail = j;
}

static int host_turn(struct group *g, int64_t until_ns)
{
    struct host_ctx *h = g->be_ctx;
    struct host_job *j = h ? h->head : NULL;
    if (!j) return 0;
    size_t es = coll_dtype_size(j->t.dtype);
    size_t step = HOST_STEP_BYTES / es ? HOST_STEP_BYTES / es : 1;
    do {
        size_t n = j->t.count - j->at < step ? j->t.count - j->at : step;
        run_range(h->scratch, &j->t, j->at, n);
        j->at += n;
    } while (j->at < j->t.count && now_ns() < until_ns);
    j->turns++;
    if (j->at < j->t.count) return 1;
    h->head = j->next;
    if (!h->head) h->tail = NULL;
    if (LOG_DEBUG_ON())
        log_msg(LOG_DEBUG, "host.sliced", "group=%s kind=%s count=%llu turns=%u", g->cfg->name,
                wire_kind_name(j->t.kind), (unsigned long long)j->t.count, j->turns);
    for (int k = 0; k < j->t.nranks; k++)
        g->op_done(g, &j->ops[k], COLL_OK, NULL);
    free(j);
    return 1;
}

static int host_outstanding(const struct group *g)
{
    const struct host_ctx *h = g->be_ctx;
    return h && h->head ? 1 : 0;
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
    struct host_ctx *h = g->be_ctx;
    for (struct host_job *j = h ? h->head : NULL; j; j = j->next)
        for (int k = 0; k < j->t.nranks; k++)
            if (j->ops[k].s == s) j->ops[k].s = NULL; /* its buffers stay held until done */
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
    .epoch_over = host_epoch_over,
    .outstanding = host_outstanding,
    .turn = host_turn,
    .forget_session = host_forget,
    .devices = host_devices,
};
