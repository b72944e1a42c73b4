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
 * groups do meanwhile. Its request is composite (compose.c): done when every send and
 * receive is, after a local step (a reduction in rank order, so every rank holds the
 * same bits).
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

#define SPAN_SCRATCH_MIN (64 << 10)

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
    coll_request sub[LC_COP_SUBS];
    int k = 0;
    char why[WIRE_ERRMSG_MAX] = "";
    uint32_t tag = lc_span_tag(LC_SPAN_IDS, LC_SPAN_SUB_OPS);
    for (int j = 0; j < n && rc == COLL_OK; j++) {
        if (j == me) continue;
        rc = lc_p2p(root, WIRE_OP_RECV, NULL, &w[2 * j], 2, COLL_UINT64, rr[j], tag, NULL, 0, -1,
                    &sub[k]);
        if (rc == COLL_OK) k++;
        if (rc == COLL_OK)
            rc = lc_p2p(root, WIRE_OP_SEND, &w[2 * me], NULL, 2, COLL_UINT64, rr[j], tag, NULL, 0,
                        -1, &sub[k]);
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
    if (root->gpu) { /* the agent's too: on NCCL, with an id from the coordinator */
        free(rr);
        return 0;
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

/* memmove that takes nothing from nowhere: a count of 0 may come with NULL buffers */
static void move(void *dst, const void *src, size_t n)
{
    if (n) memmove(dst, src, n);
}

/* dst = src times this rank's scalar (the dtype's bits), count elements, rounded to the
 * dtype as a premultiplied sum rounds each product; dst is scratch, apart from src */
static void scale(int dtype, void *dst, const void *src, uint64_t scalar, size_t count)
{
    const void *srcs[1] = {src};
    if (count) reduce_premul_n(dtype, dst, srcs, &scalar, 1, count);
}

/* An allreduce in two steps (rsag.c): this rank's contribution in recv (scaled for a
 * premultiplied sum), block me of every rank's in scratch, the first step posted. */
static coll_err rsag_submit(coll_group *g, coll_group *root, int dtype, int redop, uint64_t count,
                            const void *send, void *recv, coll_request *req)
{
    struct lc_span *sp = g->span;
    coll_conn *c = g->conn;
    int n = sp->n, idx;
    size_t es = coll_dtype_size((coll_dtype)dtype);
    size_t slot = (count + (size_t)n - 1) / (size_t)n * es;
    coll_err rc;
    struct lc_cop *op = lc_cop_new(g, 2 * (n - 1), &idx, &rc);
    if (!op) return rc;
    if (!(op->sc = scratch_take(g, slot * (size_t)n, &rc))) {
        pthread_mutex_lock(&c->lock);
        op->used = 0;
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    int premul = (unsigned)redop >= WIRE_REDOP_PREMUL;
    if (premul)
        scale(dtype, recv, send, g->premul[(unsigned)redop - WIRE_REDOP_PREMUL].bits, count);
    else if ((const void *)recv != send)
        move(recv, send, count * es);
    op->rsag = (struct lc_rsag){.on = 1,
                                .n = n,
                                .me = sp->me,
                                .ranks = sp->ranks,
                                .root = root,
                                .dtype = dtype,
                                .redop = premul ? COLL_SUM : redop,
                                .es = es,
                                .count = count,
                                .acc = recv,
                                .tmp = coll_mem_ptr(op->sc->b)};
    if (c->agent_noack) op->send_flags = WIRE_SQE_F_NOACK; /* each receives what it sends */
    op->sig = WIRE_SIG(WIRE_OP_ALLREDUCE, op->rsag.redop);
    pthread_mutex_lock(&sp->posting);
    op->rsag.tag = lc_span_tag(sp->id, LC_SPAN_STAGED + sp->staged++ % LC_SPAN_STAGED);
    pthread_mutex_unlock(&sp->posting);
    lc_rsag_begin(c, op);
    *req = lc_cop_req(op, idx);
    return COLL_OK;
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
                      lc_span_tag(sp->id, (uint32_t)tag), NULL, 0, -1, req);
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
    coll_err rc = lc_cop_in_coll(g, "send", send, in);
    if (rc == COLL_OK) rc = lc_cop_in_coll(g, "recv", recv, out);
    if (rc != COLL_OK) return rc;
    if (kind == WIRE_OP_ALLREDUCE && lc_rsag_fits(n, bytes))
        return rsag_submit(g, root, dtype, redop, count, send, recv, req);
    int idx;
    struct lc_cop *op = lc_cop_new(g, 2 * (n - 1), &idx, &rc);
    if (!op) return rc;

    uint32_t t = lc_span_tag(sp->id, LC_SPAN_SUB_OPS);
    const int *rr = sp->ranks;
    /* every rank receives from each rank it sends to: a disagreement (counts, dtypes)
     * fails every rank through its receives, so its sends need no word back and complete
     * once written (broadcast and reduce have lone senders: theirs do) */
    if (c->agent_noack && kind != WIRE_OP_BROADCAST && kind != WIRE_OP_REDUCE)
        op->send_flags = WIRE_SQE_F_NOACK;
    int reduce = kind == WIRE_OP_ALLREDUCE || kind == WIRE_OP_REDUCE_SCATTER ||
                 (kind == WIRE_OP_REDUCE && me == peer);
    int inplace_a2a = kind == WIRE_OP_ALLTOALL && (const char *)send < (char *)recv + all &&
                      (char *)recv < (const char *)send + all;
    /* a premultiplied sum: this rank's input times its own scalar, in scratch, is what it
     * sends and adds; the sum of those is then COLL_SUM's, bit for bit the agent's (each
     * product rounded to the type, summed as COLL_SUM sums, in rank order) */
    int premul = wire_kind_reduces(kind) && (unsigned)redop >= WIRE_REDOP_PREMUL;
    uint64_t scalar = premul ? g->premul[(unsigned)redop - WIRE_REDOP_PREMUL].bits : 0;
    if (reduce || inplace_a2a || premul || kind == WIRE_OP_BARRIER) {
        size_t need_b = kind == WIRE_OP_BARRIER                    ? (size_t)n
                        : premul && kind == WIRE_OP_REDUCE_SCATTER ? 2 * all
                        : premul && !reduce                        ? bytes
                                                                   : all;
        op->sc = scratch_take(g, need_b ? need_b : 1, &rc);
        if (!op->sc) {
            pthread_mutex_lock(&c->lock);
            op->used = 0;
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
    }
    char *S = op->sc ? coll_mem_ptr(op->sc->b) : NULL;
    /* every part says which op it is of: ranks that run different ops (an allreduce and an
     * allgather move the same blocks) or reduce differently fail, not mix their bytes */
    op->sig = WIRE_SIG(kind, wire_kind_reduces(kind) ? (premul ? COLL_SUM : redop) : 0);
    pthread_mutex_lock(&sp->posting);
    const char *sb = send;
    char *rb = recv;
    switch (kind) {
    case WIRE_OP_ALLREDUCE:
    case WIRE_OP_REDUCE:
        if (kind == WIRE_OP_REDUCE && me != peer) {
            if (premul) {
                scale(dtype, S, sb, scalar, count);
                sb = S;
            }
            lc_cop_post(op, root, WIRE_OP_SEND, sb, NULL, count, dtype, rr[peer], t);
            break;
        }
        if (premul) /* ours, apart: send may be recv */
            scale(dtype, S + (size_t)me * bytes, sb, scalar, count);
        else
            move(S + (size_t)me * bytes, sb, bytes);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            lc_cop_post(op, root, WIRE_OP_RECV, NULL, S + (size_t)j * bytes, count, dtype, rr[j],
                        t);
            if (kind == WIRE_OP_ALLREDUCE)
                lc_cop_post(op, root, WIRE_OP_SEND, S + (size_t)me * bytes, NULL, count, dtype,
                            rr[j], t);
        }
        break;
    case WIRE_OP_REDUCE_SCATTER:
        if (premul) { /* every block times the scalar, after the blocks received */
            scale(dtype, S + all, sb, scalar, count * (size_t)n);
            sb = S + all;
        }
        move(S + (size_t)me * bytes, sb + (size_t)me * bytes, bytes);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            lc_cop_post(op, root, WIRE_OP_RECV, NULL, S + (size_t)j * bytes, count, dtype, rr[j],
                        t);
            lc_cop_post(op, root, WIRE_OP_SEND, sb + (size_t)j * bytes, NULL, count, dtype, rr[j],
                        t);
        }
        break;
    case WIRE_OP_BROADCAST:
        if (me == peer) {
            if (rb != sb) move(rb, sb, bytes);
            for (int j = 0; j < n; j++)
                if (j != me) lc_cop_post(op, root, WIRE_OP_SEND, rb, NULL, count, dtype, rr[j], t);
        } else {
            lc_cop_post(op, root, WIRE_OP_RECV, NULL, rb, count, dtype, rr[peer], t);
        }
        break;
    case WIRE_OP_ALLGATHER:
        if (rb + (size_t)me * bytes != sb) move(rb + (size_t)me * bytes, sb, bytes);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            lc_cop_post(op, root, WIRE_OP_RECV, NULL, rb + (size_t)j * bytes, count, dtype, rr[j],
                        t);
            lc_cop_post(op, root, WIRE_OP_SEND, rb + (size_t)me * bytes, NULL, count, dtype, rr[j],
                        t);
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
            lc_cop_post(op, root, WIRE_OP_RECV, NULL, rb + (size_t)j * bytes, count, dtype, rr[j],
                        t);
            lc_cop_post(op, root, WIRE_OP_SEND, sb + (size_t)j * bytes, NULL, count, dtype, rr[j],
                        t);
        }
        break;
    case WIRE_OP_BARRIER:
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            lc_cop_post(op, root, WIRE_OP_RECV, NULL, S + j, 1, COLL_UINT8, rr[j], t);
            lc_cop_post(op, root, WIRE_OP_SEND, S + me, NULL, 1, COLL_UINT8, rr[j], t);
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
        op->redop = premul ? COLL_SUM : redop;
        op->nsrc = n;
    }
    *req = lc_cop_req(op, idx);
    return COLL_OK;
}

/* ---- endings ------------------------------------------------------------------------ */

void lc_span_close(coll_group *g)
{
    lc_cop_drain(g); /* its ops finish first: they use its scratch */
    for (int i = 0; i < SPAN_SCRATCH; i++)
        if (g->span->scratch[i].b) coll_mem_release(&g->span->scratch[i].b);
    pthread_mutex_destroy(&g->span->posting);
    free(g->span->ranks);
    free(g->span);
    g->span = NULL;
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
