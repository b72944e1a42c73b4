/*
 * rsag.c: a large allreduce of a child across pods in two steps. The direct exchange
 * (span.c) sends every rank's whole vector to every other rank: (n - 1) vectors in and
 * out of each. Here the vector is cut into n nearly equal blocks; first each rank sends
 * block j to rank j and receives block me from every rank, and reduces them, in rank
 * order as the exchange does (so the bits are the exchange's); then it sends that block
 * to every rank and receives theirs: 2 (n - 1) / n of a vector each way, for one more
 * crossing. The second step needs the first's reduction, so it is posted once the first
 * completed, by whichever wait or test of the connection comes first
 * (lc_rsag_progress): a rank's second step goes out while it waits or tests for
 * anything, as MPI progresses its nonblocking collectives.
 *
 * Each such op pairs on a tag of its own (LC_SPAN_STAGED + its number among the child's
 * ops in steps), so the child's ops posted between its two steps never meet its second.
 * Counts that disagree fail some ranks' first step with MISMATCH; those post a second
 * step that every receive refuses, so every rank fails with MISMATCH, none waits until
 * op_ms, and nothing is left unpaired on the tag.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc.h"
#include "reduce.h"

/* What a rank's two steps save over the exchange, (n - 1) (n - 2) / n of the vector, over
 * n (their second crossing costs more the more pods wait on one another), from which they
 * pay: on the 2-vCPU VM's loopback 3 pods broke even at 768 KiB (171 KiB) and gained at 1
 * MiB (228), 4 pods gained at 512 KiB (192) and lost at 256, 8 pods broke even at 256 KiB
 * (168) and lost at 128 (bench/RESULTS.md, "Children across pods") */
#define RSAG_SAVES (192u << 10)

int lc_rsag_fits(int n, size_t bytes)
{
    static int mode = -2; /* -1: by size; 0: never; 1: whenever it may */
    if (mode == -2) {
        const char *e = getenv("COLL_RSAG");
        mode = e && e[0] == '0' ? 0 : e && e[0] == '1' ? 1 : -1;
    }
    if (mode == 0 || n < 3) return 0; /* two ranks: the exchange moves no more */
    return mode == 1 || (double)bytes * (n - 1) * (n - 2) / ((double)n * n) >= (double)RSAG_SAVES;
}

/* Block b of the vector: its first element and its count. */
static void block(const struct lc_rsag *r, int b, size_t *off, size_t *cnt)
{
    size_t base = r->count / (size_t)r->n, rem = r->count % (size_t)r->n;
    *off = (size_t)b * base + ((size_t)b < rem ? (size_t)b : rem);
    *cnt = base + ((size_t)b < rem);
}

/* the bytes of one slot of tmp: the largest block */
static size_t slot_bytes(const struct lc_rsag *r)
{
    return (size_t)((r->count + (uint64_t)r->n - 1) / (uint64_t)r->n) * r->es;
}

void lc_rsag_begin(coll_conn *c, struct lc_cop *op)
{
    struct lc_rsag *r = &op->rsag;
    size_t mo, mc, slot = slot_bytes(r);
    block(r, r->me, &mo, &mc);
    if (mc) memcpy(r->tmp + (size_t)r->me * slot, r->acc + mo * r->es, mc * r->es);
    r->step = 0;
    for (int j = 0; j < r->n; j++) {
        if (j == r->me) continue;
        size_t o, k;
        block(r, j, &o, &k);
        lc_cop_post(op, r->root, WIRE_OP_RECV, NULL, r->tmp + (size_t)j * slot, mc, r->dtype,
                    r->ranks[j], r->tag);
        lc_cop_post(op, r->root, WIRE_OP_SEND, r->acc + o * r->es, NULL, k, r->dtype, r->ranks[j],
                    r->tag);
    }
    if (op->st == COLL_OK) {
        atomic_store_explicit(&c->stage_progress, lc_rsag_progress, memory_order_release);
        pthread_mutex_lock(&c->lock);
        r->live = 1;
        atomic_fetch_add(&c->staged, 1);
        pthread_mutex_unlock(&c->lock);
    }
}

/* No second step to post (any more): progress passes it by. */
static void settled(coll_conn *c, struct lc_rsag *r)
{
    pthread_mutex_lock(&c->lock);
    if (r->live) atomic_fetch_sub(&c->staged, 1);
    r->live = 0;
    pthread_mutex_unlock(&c->lock);
}

int lc_rsag_next(coll_conn *c, struct lc_cop *op)
{
    struct lc_rsag *r = &op->rsag;
    coll_err failed = op->st;
    if (r->step > 0 || (failed != COLL_OK && failed != COLL_ERR_MISMATCH)) {
        settled(c, r);
        return 0;
    }
    size_t mo, mc, slot = slot_bytes(r);
    block(r, r->me, &mo, &mc);
    const void *srcs[WIRE_CHILD_MAX];
    for (size_t off = 0; !failed && off < mc; off += REDUCE_CHUNK) { /* in rank order */
        size_t k = mc - off < REDUCE_CHUNK ? mc - off : REDUCE_CHUNK;
        for (int j = 0; j < r->n; j++)
            srcs[j] = r->tmp + (size_t)j * slot + off * r->es;
        reduce_n(r->dtype, r->redop, r->acc + (mo + off) * r->es, srcs, r->n, k, (uint32_t)r->n);
    }
    /* After a MISMATCH the second step is posted all the same, so that no rank waits for
     * this one's blocks until op_ms: its receives take what comes into tmp, and each of
     * its sends is 0 elements of another dtype, which every receive refuses (MISMATCH,
     * as the sends' and receives' check says it). The first step's reason is the op's. */
    char why[WIRE_ERRMSG_MAX];
    if (failed) snprintf(why, sizeof(why), "%s", op->why);
    int poison = r->dtype == COLL_UINT8 ? COLL_INT8 : COLL_UINT8;
    r->step = 1;
    r->bad1 = failed != COLL_OK;
    op->st = COLL_OK;
    op->nsub = 0;
    memset(op->subdone, 0, sizeof(op->subdone));
    for (int j = 0; j < r->n; j++) {
        if (j == r->me) continue;
        size_t o, k;
        block(r, j, &o, &k);
        char *in = failed ? r->tmp + (size_t)j * slot : r->acc + o * r->es;
        lc_cop_post(op, r->root, WIRE_OP_RECV, NULL, in, k, r->dtype, r->ranks[j], r->tag);
        if (failed)
            lc_cop_post(op, r->root, WIRE_OP_SEND, NULL, NULL, 0, poison, r->ranks[j], r->tag);
        else
            lc_cop_post(op, r->root, WIRE_OP_SEND, r->acc + mo * r->es, NULL, mc, r->dtype,
                        r->ranks[j], r->tag);
    }
    if (failed) {
        op->st = failed;
        snprintf(op->why, sizeof(op->why), "%s", why);
    }
    settled(c, r);
    return 1;
}

static _Thread_local int moving; /* this thread is in lc_rsag_progress already */

void lc_rsag_progress(coll_conn *c)
{
    if (moving || !atomic_load_explicit(&c->staged, memory_order_relaxed)) return;
    moving = 1;
    for (int i = 0; i < LC_COP_OPS; i++) {
        pthread_mutex_lock(&c->lock);
        struct lc_cop *op = c->sops ? &c->sops[i] : NULL;
        int mine = op && op->used && op->rsag.live && !op->waiting && !op->rsag.moving;
        if (mine) op->rsag.moving = 1;
        pthread_mutex_unlock(&c->lock);
        if (!mine) continue;
        if (lc_cop_try_subs(c, op))
            lc_rsag_next(c, op);
        else if (op->st != COLL_OK && op->st != COLL_ERR_MISMATCH)
            settled(c, &op->rsag); /* its own wait reports it */
        pthread_mutex_lock(&c->lock);
        op->rsag.moving = 0;
        pthread_mutex_unlock(&c->lock);
    }
    moving = 0;
}
