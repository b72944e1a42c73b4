/*
 * span.c: children whose ranks span pods (coll_group_create and coll_group_split over a
 * host group). The agent runs the groups of one pod; a child across pods runs here, in
 * the application, over its root group's tagged sends and receives: the root's data
 * connections between pods, with no rendezvous of its own
 * (docs/decisions/0025-children-across-pods.md).
 *
 * Each op of such a child posts every send and receive it needs at once (a direct
 * exchange: each rank's part to every other rank), all on the child's own tag, so the
 * n-th op of the child between two ranks meets the n-th of the other whatever other
 * groups do meanwhile. Its request is composite: done when every send and receive is,
 * after a local step (a reduction in rank order, so every rank holds the same bits).
 *
 * Creation is collective over the listed ranks: each sends every other the hash of its
 * list and the id it proposes; lists that differ fail with MISMATCH, and the child takes
 * the largest id proposed. Each rank proposes one more than any id it took before, so
 * two children that share a rank never share an id, hence never a tag.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc.h"
#include "reduce.h"

#define SPAN_SCRATCH 8 /* scratch buffers of a child: ops in flight that need one */
#define SPAN_SUBS (2 * WIRE_CHILD_MAX)
#define SPAN_SCRATCH_MIN (64 << 10)

struct span_scratch {
    coll_buffer *b;
    int busy; /* guarded by conn->lock */
};

struct lc_span {
    coll_group *root; /* whose sends and receives carry ours; NULL once it closed (lock) */
    int *ranks;       /* the root rank of each rank of the child */
    int n, me;
    uint32_t id;
    struct span_scratch scratch[SPAN_SCRATCH];
    /* held while an op posts its sends and receives: each op's are contiguous, so ops
     * submitted one after the other pair in that order on every rank */
    pthread_mutex_t posting;
};

struct lc_span_op {
    uint32_t gen;
    uint8_t used, waiting; /* guarded by conn->lock */
    coll_group *g;
    int nsub;
    coll_request sub[SPAN_SUBS];
    uint8_t subdone[SPAN_SUBS];
    coll_err st;
    char why[WIRE_ERRMSG_MAX];
    /* the local step, once every send and receive is done: dst = reduce(nsrc blocks of
     * src, in rank order) */
    int reduce;
    void *dst;
    const char *src;
    uint64_t count;
    size_t bytes;
    int dtype, redop, nsrc;
    struct span_scratch *sc;
};

static uint32_t span_tag(uint32_t id, uint32_t sub)
{
    return LC_SPAN_TAG_BASE | id << 13 | sub;
}

static uint64_t list_hash(const int *rr, int n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)rr[i];
        for (int k = 0; k < 4; k++) {
            h ^= (v >> (8 * k)) & 0xff;
            h *= 1099511628211ull;
        }
    }
    return h ^ (uint64_t)n;
}

/* ---- creation ---------------------------------------------------------------------- */

/* Wait for the n requests (-1: none); the first failure's code, its reason in why. */
static coll_err wait_all(coll_conn *c, coll_request *reqs, int n, char *why, size_t cap)
{
    coll_err first = COLL_OK;
    for (int i = 0; i < n; i++) {
        coll_err st = coll_wait(c, reqs[i], -1);
        if (st != COLL_OK && first == COLL_OK) {
            first = st;
            snprintf(why, cap, "%s", coll_last_error());
        }
    }
    return first;
}

/* The info of a child of root ranks rr, this rank at me. */
static void child_info(coll_group *g, const coll_group *root, const int *rr, int n, int me)
{
    int slots = root->info.local_slots, mine = rr[me] / slots;
    int pods[WIRE_CHILD_MAX], np = 0, below = 0, local = 0, before = 0;
    for (int i = 0; i < n; i++) {
        int p = rr[i] / slots, seen = 0;
        for (int k = 0; k < np; k++)
            seen |= pods[k] == p;
        if (!seen) {
            pods[np++] = p;
            below += p < mine;
        }
        if (p == mine) {
            before += i < me;
            local++;
        }
    }
    g->info.rank = me;
    g->info.size = n;
    g->info.local_slot = before;
    g->info.local_slots = local;
    g->info.node_index = below;
    g->info.nodes = np;
    g->info.epoch = root->info.epoch;
    snprintf(g->info.backend, sizeof(g->info.backend), "host");
}

static coll_err make(coll_group *parent, coll_group *root, int *rr, const int *ranks, int n,
                     coll_group **child)
{
    coll_conn *c = root->conn;
    int me = 0;
    while (rr[me] != root->info.rank)
        me++;
    /* the handshake: [hash, proposed id] of every member, on creation's own tag */
    pthread_mutex_lock(&c->lock);
    uint64_t propose = root->next_span_id;
    pthread_mutex_unlock(&c->lock);
    coll_buffer *b;
    coll_err rc = coll_mem_alloc(&b, c, (size_t)n * 2 * sizeof(uint64_t), COLL_DEVICE_HOST);
    if (rc != COLL_OK) return rc;
    uint64_t *w = coll_mem_ptr(b);
    uint64_t h = list_hash(rr, n);
    w[2 * me] = h;
    w[2 * me + 1] = propose;
    coll_request sub[SPAN_SUBS];
    int k = 0;
    char why[WIRE_ERRMSG_MAX] = "";
    uint32_t tag = span_tag(LC_SPAN_IDS, LC_SPAN_SUB_OPS);
    for (int j = 0; j < n && rc == COLL_OK; j++) {
        if (j == me) continue;
        rc = lc_p2p(root, WIRE_OP_RECV, NULL, &w[2 * j], 2, COLL_UINT64, rr[j], tag, &sub[k]);
        if (rc == COLL_OK) k++;
        if (rc == COLL_OK)
            rc = lc_p2p(root, WIRE_OP_SEND, &w[2 * me], NULL, 2, COLL_UINT64, rr[j], tag, &sub[k]);
        if (rc == COLL_OK) k++;
    }
    if (rc != COLL_OK) snprintf(why, sizeof(why), "%s", coll_last_error());
    coll_err wr = wait_all(c, sub, k, why[0] ? NULL : why, why[0] ? 0 : sizeof(why));
    if (rc == COLL_OK) rc = wr;
    uint64_t id = propose;
    for (int j = 0; j < n && rc == COLL_OK; j++) {
        if (w[2 * j] != h) {
            rc = COLL_ERR_MISMATCH;
            snprintf(why, sizeof(why),
                     "parent rank %d lists other ranks for this child than parent rank %d", rr[j],
                     rr[me]);
        }
        if (w[2 * j + 1] > id) id = w[2 * j + 1];
    }
    coll_mem_release(&b);
    if (rc == COLL_OK && id >= LC_SPAN_IDS) {
        rc = COLL_ERR_LIMIT;
        snprintf(why, sizeof(why), "%u children across pods made from group '%s' already",
                 LC_SPAN_IDS, root->info.name);
    }
    if (rc != COLL_OK) return lc_fail(rc, "creating a child across pods: %s", why);
    pthread_mutex_lock(&c->lock);
    if (root->next_span_id <= id) root->next_span_id = (uint32_t)id + 1;
    pthread_mutex_unlock(&c->lock);

    coll_group *g = calloc(1, sizeof(*g));
    struct lc_span *sp = calloc(1, sizeof(*sp));
    int *pr = malloc((size_t)n * sizeof(int));
    if (!g || !sp || !pr) {
        free(g);
        free(sp);
        free(pr);
        return lc_fail(COLL_ERR_NOMEM, "creating a child across pods");
    }
    memcpy(pr, ranks, (size_t)n * sizeof(int));
    *sp = (struct lc_span){.root = root, .ranks = rr, .n = n, .me = me, .id = (uint32_t)id};
    pthread_mutex_init(&sp->posting, NULL);
    g->conn = c;
    g->handle = UINT32_MAX; /* no handle of the agent's */
    g->epoch = root->epoch;
    g->span = sp;
    g->parent_ranks = pr;
    g->nparent_ranks = n;
    child_info(g, root, rr, n, me);
    snprintf(g->info.name, sizeof(g->info.name), "%.40s/%d+%d", parent->info.name, ranks[0], n - 1);
    pthread_mutex_lock(&c->lock);
    g->next = c->groups;
    c->groups = g;
    pthread_mutex_unlock(&c->lock);
    *child = g;
    return COLL_OK;
}

int lc_span_create(coll_group *parent, const int *ranks, int n, coll_group **child, coll_err *rc,
                   coll_group **on, int **mapped)
{
    *on = parent;
    *mapped = NULL;
    if (parent->parent_ranks && !parent->span) return 0; /* a child of one pod's: so are its */
    coll_group *root = parent;
    if (parent->span) {
        pthread_mutex_lock(&parent->conn->lock);
        root = parent->span->root;
        pthread_mutex_unlock(&parent->conn->lock);
        if (!root) {
            *rc = lc_fail(COLL_ERR_INVALID, "group '%s': the group it was made from is closed",
                          parent->info.name);
            return 1;
        }
    }
    int *rr = malloc((size_t)n * sizeof(int));
    if (!rr) {
        *rc = lc_fail(COLL_ERR_NOMEM, "creating a child");
        return 1;
    }
    int slots = root->info.local_slots > 0 ? root->info.local_slots : 1, spans = 0;
    for (int i = 0; i < n; i++) {
        rr[i] = parent->span ? parent->span->ranks[ranks[i]] : ranks[i];
        spans |= rr[i] / slots != rr[0] / slots;
    }
    if (!spans) { /* one pod's: the agent makes it, from the root's ranks */
        if (parent->span) {
            *on = root;
            *mapped = rr;
        } else {
            free(rr);
        }
        return 0;
    }
    if (root->gpu) {
        free(rr);
        *rc = lc_fail(COLL_ERR_UNSUPPORTED,
                      "a child across pods of GPU group '%s': not supported yet (host groups "
                      "only)",
                      root->info.name);
        return 1;
    }
    *rc = make(parent, root, rr, ranks, n, child);
    if (*rc != COLL_OK) free(rr);
    return 1;
}

/* ---- ops ---------------------------------------------------------------------------- */

/* A free scratch buffer of at least need bytes, taken; NULL and *rc on failure. */
static struct span_scratch *scratch_take(coll_group *g, size_t need, coll_err *rc)
{
    coll_conn *c = g->conn;
    struct lc_span *sp = g->span;
    struct span_scratch *s = NULL;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < SPAN_SCRATCH && !s; i++)
        if (!sp->scratch[i].busy && sp->scratch[i].b && coll_mem_size(sp->scratch[i].b) >= need)
            s = &sp->scratch[i];
    if (s) {
        s->busy = 1;
        pthread_mutex_unlock(&c->lock);
        return s;
    }
    for (int i = 0; i < SPAN_SCRATCH && !s; i++)
        if (!sp->scratch[i].busy) s = &sp->scratch[i];
    coll_buffer *old = NULL;
    if (s) {
        s->busy = 1;
        old = s->b;
        s->b = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    if (!s) {
        *rc = lc_fail(COLL_ERR_LIMIT, "group '%s': %d ops that need scratch memory in flight",
                      g->info.name, SPAN_SCRATCH);
        return NULL;
    }
    if (old) coll_mem_release(&old);
    size_t size = SPAN_SCRATCH_MIN;
    while (size < need)
        size *= 2;
    *rc = coll_mem_alloc(&s->b, c, size, COLL_DEVICE_HOST);
    if (*rc != COLL_OK) {
        pthread_mutex_lock(&c->lock);
        s->busy = 0;
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    return s;
}

/* [p, p + bytes) lies in coll memory (bytes 0: anything goes) */
coll_err lc_span_in_coll(coll_group *g, const char *what, const void *p, size_t bytes)
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

/* memmove that takes nothing from nowhere: a count of 0 may come with NULL buffers */
static void move(void *dst, const void *src, size_t n)
{
    if (n) memmove(dst, src, n);
}

static void post(struct lc_span_op *op, coll_group *root, unsigned kind, const void *send,
                 void *recv, uint64_t count, int dtype, int peer, uint32_t tag)
{
    if (op->st != COLL_OK) return;
    coll_err rc = lc_p2p(root, kind, send, recv, count, dtype, peer, tag, &op->sub[op->nsub]);
    if (rc == COLL_OK) {
        op->nsub++;
    } else {
        op->st = rc;
        snprintf(op->why, sizeof(op->why), "%s", coll_last_error());
    }
}

/* A free composite request slot for an op of g that posts need sends and receives, taken;
 * NULL and *rc (LIMIT) when none is free or the connection lacks the requests. */
struct lc_span_op *lc_span_op_new(coll_group *g, int need, int *idx, coll_err *rc)
{
    coll_conn *c = g->conn;
    pthread_mutex_lock(&c->lock);
    if (!c->sops) c->sops = calloc(LC_SPAN_OPS, sizeof(*c->sops));
    int k = -1;
    for (int i = 0; c->sops && i < LC_SPAN_OPS && k < 0; i++)
        if (!c->sops[i].used) k = i;
    if (k < 0 || need > SPAN_SUBS || c->nfree < (uint32_t)need) {
        pthread_mutex_unlock(&c->lock);
        *rc = lc_fail(COLL_ERR_LIMIT,
                      !c->sops           ? "no memory for composite ops (%d, %d)"
                      : need > SPAN_SUBS ? "an op of %d sends and receives: at most %d"
                                         : "%d composite ops, or %d requests, in flight: wait "
                                           "for some first",
                      need > SPAN_SUBS ? need : LC_SPAN_OPS,
                      need > SPAN_SUBS ? SPAN_SUBS : WIRE_RING_ENTRIES);
        return NULL;
    }
    struct lc_span_op *op = &c->sops[k];
    uint32_t gen = op->gen + 1;
    memset(op, 0, sizeof(*op));
    op->gen = gen;
    op->used = 1;
    op->g = g;
    pthread_mutex_unlock(&c->lock);
    *idx = k;
    return op;
}

coll_request lc_span_op_req(const struct lc_span_op *op, int idx)
{
    return (coll_request){(uint64_t)op->gen << 32 | 0x80000000u | (uint32_t)idx};
}

void lc_span_post(struct lc_span_op *op, coll_group *on, unsigned kind, const void *send,
                  void *recv, uint64_t count, int dtype, int peer, uint32_t tag)
{
    post(op, on, kind, send, recv, count, dtype, peer, tag);
}

coll_err lc_span_submit(coll_group *g, unsigned kind, int dtype, int redop, int peer,
                        uint64_t count, const void *send, void *recv, int tag, coll_request *req)
{
    struct lc_span *sp = g->span;
    coll_conn *c = g->conn;
    req->id = 0;
    pthread_mutex_lock(&c->lock);
    coll_group *root = sp->root;
    pthread_mutex_unlock(&c->lock);
    if (!root)
        return lc_fail(COLL_ERR_INVALID,
                       "group '%s': the group it was made from is closed; close this one too",
                       g->info.name);
    int n = sp->n, me = sp->me;
    size_t es = coll_dtype_size((coll_dtype)dtype);
    if (kind == WIRE_OP_SEND || kind == WIRE_OP_RECV) {
        if (tag < 0 || (unsigned)tag >= LC_SPAN_SUB_OPS)
            return lc_fail(COLL_ERR_INVALID, "tag %d: a child across pods takes tags 0..%u", tag,
                           LC_SPAN_SUB_OPS - 1);
        return lc_p2p(root, kind, send, recv, count, dtype, sp->ranks[peer],
                      span_tag(sp->id, (uint32_t)tag), req);
    }
    if (count > SIZE_MAX / es / (size_t)n)
        return lc_fail(COLL_ERR_INVALID, "count %llu overflows", (unsigned long long)count);
    size_t bytes = count * es, all = bytes * (size_t)n;
    /* what each op reads and writes (checked before anything is sent) */
    size_t in = 0, out = 0;
    switch (kind) {
    case WIRE_OP_ALLREDUCE:
        in = out = bytes;
        break;
    case WIRE_OP_BROADCAST:
        in = me == peer ? bytes : 0, out = bytes;
        break;
    case WIRE_OP_REDUCE:
        in = bytes, out = me == peer ? bytes : 0;
        break;
    case WIRE_OP_ALLGATHER:
        in = bytes, out = all;
        break;
    case WIRE_OP_REDUCE_SCATTER:
        in = all, out = bytes;
        break;
    case WIRE_OP_ALLTOALL:
        in = out = all;
        break;
    case WIRE_OP_BARRIER:
        break;
    default:
        return lc_fail(COLL_ERR_INVALID, "op kind %u", kind);
    }
    coll_err rc = lc_span_in_coll(g, "send", send, in);
    if (rc == COLL_OK) rc = lc_span_in_coll(g, "recv", recv, out);
    if (rc != COLL_OK) return rc;
    int idx;
    struct lc_span_op *op = lc_span_op_new(g, 2 * (n - 1), &idx, &rc);
    if (!op) return rc;

    uint32_t t = span_tag(sp->id, LC_SPAN_SUB_OPS);
    const int *rr = sp->ranks;
    int reduce = kind == WIRE_OP_ALLREDUCE || kind == WIRE_OP_REDUCE_SCATTER ||
                 (kind == WIRE_OP_REDUCE && me == peer);
    int inplace_a2a = kind == WIRE_OP_ALLTOALL && (const char *)send < (char *)recv + all &&
                      (char *)recv < (const char *)send + all;
    if (reduce || inplace_a2a || kind == WIRE_OP_BARRIER) {
        size_t need_b = kind == WIRE_OP_BARRIER ? (size_t)n : all;
        op->sc = scratch_take(g, need_b ? need_b : 1, &rc);
        if (!op->sc) {
            pthread_mutex_lock(&c->lock);
            op->used = 0;
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
    }
    char *S = op->sc ? coll_mem_ptr(op->sc->b) : NULL;
    pthread_mutex_lock(&sp->posting);
    const char *sb = send;
    char *rb = recv;
    switch (kind) {
    case WIRE_OP_ALLREDUCE:
    case WIRE_OP_REDUCE:
        if (kind == WIRE_OP_REDUCE && me != peer) {
            post(op, root, WIRE_OP_SEND, sb, NULL, count, dtype, rr[peer], t);
            break;
        }
        move(S + (size_t)me * bytes, sb, bytes); /* ours, apart: send may be recv */
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            post(op, root, WIRE_OP_RECV, NULL, S + (size_t)j * bytes, count, dtype, rr[j], t);
            if (kind == WIRE_OP_ALLREDUCE)
                post(op, root, WIRE_OP_SEND, S + (size_t)me * bytes, NULL, count, dtype, rr[j], t);
        }
        break;
    case WIRE_OP_REDUCE_SCATTER:
        move(S + (size_t)me * bytes, sb + (size_t)me * bytes, bytes);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            post(op, root, WIRE_OP_RECV, NULL, S + (size_t)j * bytes, count, dtype, rr[j], t);
            post(op, root, WIRE_OP_SEND, sb + (size_t)j * bytes, NULL, count, dtype, rr[j], t);
        }
        break;
    case WIRE_OP_BROADCAST:
        if (me == peer) {
            if (rb != sb) move(rb, sb, bytes);
            for (int j = 0; j < n; j++)
                if (j != me) post(op, root, WIRE_OP_SEND, rb, NULL, count, dtype, rr[j], t);
        } else {
            post(op, root, WIRE_OP_RECV, NULL, rb, count, dtype, rr[peer], t);
        }
        break;
    case WIRE_OP_ALLGATHER:
        if (rb + (size_t)me * bytes != sb) move(rb + (size_t)me * bytes, sb, bytes);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            post(op, root, WIRE_OP_RECV, NULL, rb + (size_t)j * bytes, count, dtype, rr[j], t);
            post(op, root, WIRE_OP_SEND, rb + (size_t)me * bytes, NULL, count, dtype, rr[j], t);
        }
        break;
    case WIRE_OP_ALLTOALL:
        if (inplace_a2a) {
            move(S, sb, all);
            sb = S;
        }
        move(rb + (size_t)me * bytes, sb + (size_t)me * bytes, bytes);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            post(op, root, WIRE_OP_RECV, NULL, rb + (size_t)j * bytes, count, dtype, rr[j], t);
            post(op, root, WIRE_OP_SEND, sb + (size_t)j * bytes, NULL, count, dtype, rr[j], t);
        }
        break;
    case WIRE_OP_BARRIER:
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            post(op, root, WIRE_OP_RECV, NULL, S + j, 1, COLL_UINT8, rr[j], t);
            post(op, root, WIRE_OP_SEND, S + me, NULL, 1, COLL_UINT8, rr[j], t);
        }
        break;
    }
    pthread_mutex_unlock(&sp->posting);
    if (reduce) {
        op->reduce = 1;
        op->dst = rb;
        op->src = S;
        op->count = count;
        op->bytes = bytes;
        op->dtype = dtype;
        op->redop = redop;
        op->nsrc = n;
    }
    *req = lc_span_op_req(op, idx);
    return COLL_OK;
}

/* ---- completion ------------------------------------------------------------------- */

static struct lc_span_op *op_of(coll_conn *c, coll_request req)
{
    uint32_t idx = (uint32_t)req.id & 0x7fffffffu, gen = (uint32_t)(req.id >> 32);
    if (!c->sops || idx >= LC_SPAN_OPS) return NULL;
    struct lc_span_op *op = &c->sops[idx];
    return op->used && op->gen == gen ? op : NULL;
}

/* Take the op to move it: NULL (and INVALID) when it is unknown, *busy when another
 * thread moves it. */
static struct lc_span_op *take(coll_conn *c, coll_request req, int *busy)
{
    pthread_mutex_lock(&c->lock);
    struct lc_span_op *op = op_of(c, req);
    *busy = op && op->waiting;
    if (op && !*busy) op->waiting = 1;
    pthread_mutex_unlock(&c->lock);
    return op;
}

static void sub_done(struct lc_span_op *op, int i, coll_err st)
{
    op->subdone[i] = 1;
    if (st != COLL_OK && op->st == COLL_OK) {
        op->st = st;
        snprintf(op->why, sizeof(op->why), "%s", coll_last_error());
    }
}

/* Every send and receive is done: the local step, then the op's slot is free. */
static coll_err finish(coll_conn *c, struct lc_span_op *op)
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
    pthread_mutex_lock(&c->lock);
    if (op->sc) op->sc->busy = 0;
    op->used = 0;
    op->waiting = 0;
    pthread_mutex_unlock(&c->lock);
    return st == COLL_OK ? COLL_OK : lc_fail(st, "%s", why);
}

static void let_go(coll_conn *c, struct lc_span_op *op)
{
    pthread_mutex_lock(&c->lock);
    op->waiting = 0;
    pthread_mutex_unlock(&c->lock);
}

coll_err lc_span_wait(coll_conn *c, coll_request req, int timeout_ms)
{
    int busy;
    struct lc_span_op *op = take(c, req, &busy);
    if (!op) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (busy) return lc_fail(COLL_ERR_INVALID, "another thread waits for this request");
    int64_t deadline = timeout_ms >= 0 ? now_ns() + (int64_t)timeout_ms * NS_PER_MS : 0;
    for (int i = 0; i < op->nsub; i++) {
        if (op->subdone[i]) continue;
        int left = -1;
        if (deadline) {
            int64_t l = deadline - now_ns();
            left = l <= 0 ? 0 : (int)(l / NS_PER_MS);
        }
        coll_err st = coll_wait(c, op->sub[i], left);
        if (lc_req_live(c, op->sub[i])) { /* still pending: the time given is up */
            let_go(c, op);
            return lc_fail(COLL_ERR_TIMEOUT, "request still pending after %d ms", timeout_ms);
        }
        sub_done(op, i, st);
    }
    return finish(c, op);
}

coll_err lc_span_test(coll_conn *c, coll_request req, int *done)
{
    int busy;
    *done = 0;
    struct lc_span_op *op = take(c, req, &busy);
    if (!op) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (busy) return COLL_OK; /* another thread moves it: pending for this one */
    int all = 1;
    for (int i = 0; i < op->nsub; i++) {
        if (op->subdone[i]) continue;
        int d = 0;
        coll_err st = coll_test(c, op->sub[i], &d);
        if (d)
            sub_done(op, i, st);
        else
            all = 0;
    }
    if (!all) {
        let_go(c, op);
        return COLL_OK;
    }
    *done = 1;
    return finish(c, op);
}

size_t lc_span_subs(coll_conn *c, coll_request req, coll_request *out, size_t cap)
{
    size_t k = 0;
    pthread_mutex_lock(&c->lock);
    struct lc_span_op *op = op_of(c, req);
    for (int i = 0; op && i < op->nsub && k < cap; i++)
        if (!op->subdone[i]) out[k++] = op->sub[i];
    pthread_mutex_unlock(&c->lock);
    return k;
}

/* ---- endings ------------------------------------------------------------------------ */

void lc_span_drain(coll_group *g)
{
    coll_conn *c = g->conn;
    for (int i = 0; i < LC_SPAN_OPS; i++) {
        pthread_mutex_lock(&c->lock);
        struct lc_span_op *op =
            c->sops && c->sops[i].used && c->sops[i].g == g ? &c->sops[i] : NULL;
        coll_request r = op ? lc_span_op_req(op, i) : (coll_request){0};
        pthread_mutex_unlock(&c->lock);
        if (op) lc_span_wait(c, r, -1);
    }
}

void lc_span_close(coll_group *g)
{
    lc_span_drain(g); /* its ops finish first: they use its scratch */
    for (int i = 0; i < SPAN_SCRATCH; i++)
        if (g->span->scratch[i].b) coll_mem_release(&g->span->scratch[i].b);
    pthread_mutex_destroy(&g->span->posting);
    free(g->span->ranks);
    free(g->span);
    g->span = NULL;
}

void lc_span_route(coll_group *g, coll_group **on, const int **ranks, uint32_t *tag,
                   pthread_mutex_t **posting)
{
    *on = lc_span_root(g);
    *ranks = g->span->ranks;
    *tag = span_tag(g->span->id, LC_SPAN_SUB_OPS);
    *posting = &g->span->posting;
}

coll_group *lc_span_root(coll_group *g)
{
    pthread_mutex_lock(&g->conn->lock);
    coll_group *root = g->span->root;
    pthread_mutex_unlock(&g->conn->lock);
    return root;
}

void lc_span_root_closed(coll_group *root)
{
    coll_conn *c = root->conn;
    pthread_mutex_lock(&c->lock);
    for (coll_group *g = c->groups; g; g = g->next)
        if (g->span && g->span->root == root) g->span->root = NULL;
    pthread_mutex_unlock(&c->lock);
}

void lc_span_free(coll_group *g)
{
    if (!g->span) return;
    pthread_mutex_destroy(&g->span->posting);
    free(g->span->ranks);
    free(g->span);
    g->span = NULL;
}
