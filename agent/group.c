/*
 * group.c: slots, epochs and op matching.
 *
 * Every slot's collectives are numbered in submission order within an epoch; round
 * n gathers op n of every slot. Rounds are created in order (a slot posts n before
 * n+1), so the oldest pending round has the earliest deadline, and rounds finish in
 * order. The window of rounds equals the ring size: a session never has more ops in
 * flight than that.
 */
#include "group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "coll/coll.h"
#include "log.h"
#include "net.h"
#include "backend.h"
#include "util.h"

#define WMASK (WIRE_RING_ENTRIES - 1u)

static void finish_op(struct group *g, struct op *op, int status, const char *why);
static void children_orphan(struct group *g, const char *why);
static void children_free(struct group *g);

int group_init(struct group *g, const struct group_config *cfg, int node_index,
               const struct group_up *up)
{
    memset(g, 0, sizeof(*g));
    g->cfg = cfg;
    g->up = up;
    g->nslots = cfg->local_slots;
    g->nodes = cfg->members;
    g->node_index = node_index;
    g->size = g->nodes * g->nslots;
    g->epoch = 1;
    /* every block hangs off g as soon as it exists, so group_fini frees whatever a
     * failure part way left behind */
    size_t nops = (size_t)WIRE_RING_ENTRIES * (size_t)g->nslots;
    g->slots = calloc((size_t)g->nslots, sizeof(*g->slots));
    g->rounds[0].ops = calloc(nops, sizeof(struct op));
    g->rounds[0].present = calloc(nops, 1);
    g->p2p_pool = calloc(nops, sizeof(struct op));
    if (!g->slots || !g->rounds[0].ops || !g->rounds[0].present || !g->p2p_pool) goto fail_memory;
    struct op *ops = g->rounds[0].ops;
    uint8_t *present = g->rounds[0].present;
    for (unsigned i = 0; i < WIRE_RING_ENTRIES; i++) {
        g->rounds[i].ops = ops + (size_t)i * (size_t)g->nslots;
        g->rounds[i].present = present + (size_t)i * (size_t)g->nslots;
    }
    for (size_t i = 0; i < nops; i++) {
        g->p2p_pool[i].next = g->p2p_free;
        g->p2p_free = &g->p2p_pool[i];
    }
    g->op_done = finish_op;
    g->fail = group_break;
    g->idle = group_child_release;
    g->be = backend_choose(cfg, g->backend_why, sizeof(g->backend_why));
    if (g->be && g->be->init(g) < 0) {
        g->be->fini(g);
        g->be = NULL;
    }
    log_msg(g->be ? LOG_INFO : LOG_ERROR, "group.backend", "group=%s backend=%s reason=\"%s\"",
            cfg->name, g->be ? g->be->name : "none", g->backend_why);
    return g->be ? 0 : -1;
fail_memory:
    snprintf(g->backend_why, sizeof(g->backend_why), "out of memory");
    log_msg(LOG_ERROR, "group.backend", "group=%s backend=none reason=\"out of memory\"",
            cfg->name);
    return -1;
}

void group_fini(struct group *g)
{
    if (!g->cfg) return; /* zeroed or finished already */
    children_free(g);
    if (g->be) g->be->fini(g);
    free(g->rounds[0].ops);
    free(g->rounds[0].present);
    free(g->p2p_pool);
    free(g->slots);
    free(g->slot_rank);
    free(g->seqs);
    memset(g, 0, sizeof(*g));
}

struct group *group_find(struct group *groups, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(groups[i].cfg->name, name) == 0) return &groups[i];
    return NULL;
}

static struct group *child_by_index(struct group *g, int index)
{
    for (struct group *c = g->children; c; c = c->next_child) {
        if (c->index == index) return c;
        struct group *d = child_by_index(c, index);
        if (d) return d;
    }
    return NULL;
}

struct group *group_by_index(struct group *groups, int n, int index)
{
    if (index >= 0 && index < n) return &groups[index];
    for (int i = 0; i < n && index >= GROUP_CHILD_INDEX_BASE; i++) {
        struct group *c = child_by_index(&groups[i], index);
        if (c) return c;
    }
    return NULL;
}

int group_attach(struct group *g, struct session *s, int slot)
{
    if (!g->be) return -COLL_ERR_UNSUPPORTED;
    if (slot >= g->nslots) return -COLL_ERR_INVALID;
    if (slot < 0) {
        for (slot = 0; slot < g->nslots && g->slots[slot].s; slot++)
            ;
        if (slot == g->nslots) return -COLL_ERR_BUSY;
    }
    if (g->slots[slot].s) return -COLL_ERR_BUSY;
    g->slots[slot].s = s;
    g->slots[slot].epoch = g->epoch;
    g->slots[slot].next_seq = 0;
    g->attached++;
    log_msg(LOG_INFO, "group.attach", "group=%s slot=%d epoch=%u attached=%d/%d", g->cfg->name,
            slot, g->epoch, g->attached, g->nslots);
    return slot;
}

void group_detach(struct group *g, int slot)
{
    if (slot < 0 || slot >= g->nslots || !g->slots[slot].s) return;
    uint32_t e = g->slots[slot].epoch;
    if (g->lent_to == g->slots[slot].s) group_void_lease(g, COLL_ERR_PEER_LOST, "it left");
    if (g->dc_s == g->slots[slot].s) { /* its last counts, while its region is there */
        group_direct_fold(g);
        g->dc_s = NULL;
    }
    g->slots[slot].s = NULL;
    g->attached--;
    log_msg(LOG_INFO, "group.detach", "group=%s slot=%d epoch=%u attached=%d/%d", g->cfg->name,
            slot, e, g->attached, g->nslots);
    if (e == g->epoch) group_break(g, COLL_ERR_PEER_LOST, "a participant left");
    group_child_release(g); /* a child nobody holds goes (g with it: touch it no more) */
}

const double group_hist_bounds[GROUP_HIST_BUCKETS] = WIRE_HIST_BOUNDS;

static void count_op(struct group *g, const struct op *op, int status)
{
    struct group_metrics *m = &g->m;
    unsigned kind = op->sqe.kind < WIRE_OP_KIND_COUNT ? op->sqe.kind : 0;
    unsigned st = status >= 0 && status < GROUP_STATUS_MAX ? (unsigned)status : COLL_ERR_INTERNAL;
    m->ops[kind][st]++;
    if (status == COLL_OK && op->sqe.dtype < COLL_DTYPE_COUNT)
        m->bytes[kind] += op->sqe.count * coll_dtype_size((coll_dtype)op->sqe.dtype);
    int64_t submitted = op->deadline_ns - (int64_t)op->timeout_ms * NS_PER_MS;
    double s = (double)(now_ns() - submitted) / 1e9;
    if (s < 0) s = 0;
    int b = 0;
    while (b < GROUP_HIST_BUCKETS && s > group_hist_bounds[b])
        b++;
    m->hist[b]++;
    m->count++;
    m->sum_s += s;
}

static void finish_op(struct group *g, struct op *op, int status, const char *why)
{
    /* op->s is NULL when its session ended while the op was with the net thread;
     * complete() then only drops the buffer references */
    if (status == COLL_OK)
        g->ops_done++;
    else
        g->ops_failed++;
    if (op->any_task) group_p2p_twin_done(g, op);
    count_op(g, op, status);
    g->up->complete(op, status, status == COLL_OK ? NULL : why);
}

static void send_mark(struct group *g);

static void break_local(struct group *g, int err, const char *why);

void group_break(struct group *g, int err, const char *why)
{
    break_local(g, err, why);
    if (g->net) {
        /* the net thread ends the epoch on our word and posts no event of it: not formed
         * from now until its next "formed" (/readyz, leases) */
        g->net_formed = 0;
        g->mark_pending = 1;
        g->mark_pending_abort = 1;
        g->mark_code = err;
        send_mark(g);
    }
}

void group_net_broken(struct group *g, int err, const char *why)
{
    break_local(g, err, why);
    g->mark_pending = 1; /* the net waits for our new epoch before taking more ops */
    send_mark(g);
}

/* One mark at a time: a mark asked for while one is out goes when it returns, with
 * the epoch current then. */
static void send_mark(struct group *g)
{
    if (g->mark_busy || !g->mark_pending) return;
    struct net_task *m = &g->mark;
    memset(m, 0, sizeof(*m));
    m->type = NET_TASK_MARK;
    m->group = g->index;
    m->lepoch = g->epoch;
    m->abort = g->mark_pending_abort;
    m->code = g->mark_code;
    g->mark_busy = 1;
    g->mark_pending = g->mark_pending_abort = 0;
    net_submit(g->net, m);
}

void group_set_net(struct group *g, struct net *n, int index)
{
    g->net = n;
    g->index = index;
}

void group_set_gpu(struct group *g, struct gpu *gpu, int index)
{
    g->gpu = gpu;
    g->index = index;
}

void group_forget_session(struct group *g, const struct session *s)
{
    if (g->dc_s == s) {
        group_direct_fold(g);
        g->dc_s = NULL;
    }
    if (g->be) g->be->forget_session(g, s);
    for (struct group *c = g->children; c; c = c->next_child)
        group_forget_session(c, s);
}

/* What w grew by since *seen (0 if it did not: a client only raises its counts). */
static uint64_t grew(const _Atomic uint64_t *w, uint64_t *seen)
{
    uint64_t v = atomic_load_explicit(w, memory_order_relaxed), d = v > *seen ? v - *seen : 0;
    *seen = v > *seen ? v : *seen;
    return d;
}

/* What the client's counts grew by since the last look, added to m (NULL: only looked). */
static void take_counts(struct group *g, struct group_metrics *m)
{
    const struct wire_direct_counts *k = g->dc_counts;
    struct group_metrics none = {0};
    if (!m) m = &none;
    uint64_t ops = 0;
    for (int o = 0; o < WIRE_OP_KIND_COUNT; o++) {
        for (int st = 0; st < GROUP_STATUS_MAX; st++) {
            uint64_t d = grew(&k->ops[o][st], &g->dc_seen.ops[o][st]);
            m->ops[o][st] += d;
            ops += d;
        }
        m->bytes[o] += grew(&k->bytes[o], &g->dc_seen.bytes[o]);
    }
    for (int b = 0; b <= GROUP_HIST_BUCKETS; b++) {
        uint64_t d = grew(&k->hist[b], &g->dc_seen.hist[b]);
        m->hist[b] += d;
        m->count += d;
    }
    m->sum_s += (double)grew(&k->sum_ns, &g->dc_seen.sum_ns) / 1e9;
    if (m != &none) g->direct_ops += ops;
}

void group_direct_fold(struct group *g)
{
    if (g->dc_s && g->dc_counts) take_counts(g, &g->m);
}

void group_direct_follow(struct group *g, struct session *s, uint32_t handle,
                         const struct wire_direct_counts *counts)
{
    if (g->dc_s == s && g->dc_handle == handle) return;
    group_direct_fold(g); /* the one before, if any */
    g->dc_s = s;
    g->dc_handle = handle;
    g->dc_counts = counts;
    /* from now on: what the words say already was never this group's */
    memset(&g->dc_seen, 0, sizeof(g->dc_seen));
    take_counts(g, NULL);
}

void group_net_mark_done(struct group *g)
{
    /* an abort the net has acted on: a "formed" it posted before it (of the epoch that
     * ended) may have come in since group_break; its next one comes after this */
    if (g->mark.abort) g->net_formed = 0;
    g->mark_busy = 0;
    send_mark(g);
}

int group_idle(const struct group *g)
{
    for (int k = 0; k < g->nslots; k++)
        if (g->slots[k].s && g->slots[k].next_seq != g->lo_seq) return 0;
    return 1;
}

void group_void_lease(struct group *g, int err, const char *why)
{
    if (!g->lent_to) return;
    g->up->lease_void(g->lent_to, g->lease_id, err, why);
    /* its region may go next (the session ends): the net must not look at it again
     * (no net: stopped, its thread gone) */
    if (g->net) net_lease_forget(g->net, g->index, g->lease_id);
    g->lent_to = NULL;
}

static void break_local(struct group *g, int err, const char *why)
{
    int failed = 0;
    group_void_lease(g, err, why); /* the net ends the epoch's connections under the client */
    for (unsigned i = 0; i < WIRE_RING_ENTRIES; i++) {
        struct round *r = &g->rounds[i];
        if (!r->arrived) continue;
        for (int k = 0; k < g->nslots; k++) {
            if (!r->present[k]) continue;
            r->present[k] = 0;
            finish_op(g, &r->ops[k], r->status ? r->status : err, r->status ? r->why : why);
            failed++;
        }
        r->arrived = 0;
    }
    failed += group_p2p_fail(g, err, why);
    if (g->be && g->be->epoch_over) g->be->epoch_over(g, err, why);
    uint32_t old = g->epoch;
    g->epoch++;
    g->lo_seq = 0;
    for (int k = 0; k < g->nslots; k++)
        g->slots[k].next_seq = 0;
    log_msg(failed && err != COLL_ERR_SHUTDOWN ? LOG_WARN : LOG_INFO, "group.epoch",
            "group=%s epoch=%u next_epoch=%u error=\"%s\" failed_ops=%d reason=\"%s\"",
            g->cfg->name, old, g->epoch, coll_strerror(err), failed, LOG_Q(why));
    children_orphan(g, why); /* they lived in the epoch that ended */
}

static int agree(const struct wire_sqe *a, const struct wire_sqe *b)
{
    if (a->kind != b->kind) return 0;
    if (a->kind == WIRE_OP_BARRIER) return 1;
    if (a->dtype != b->dtype || a->count != b->count) return 0;
    if (wire_kind_reduces(a->kind) && a->redop != b->redop) return 0;
    if (wire_kind_rooted(a->kind) && a->peer != b->peer) return 0;
    return 1;
}

/* Every participant is in: the backend runs the op, or all fail with the round's
 * disagreement. */
static void run_round(struct group *g, struct round *r)
{
    int status = r->status;
    for (int k = 0; k < g->nslots; k++)
        r->present[k] = 0;
    r->arrived = 0;
    g->lo_seq++;
    if (status == COLL_OK) {
        g->be->collective(g, r->ops, r->seq, r->deadline_ns);
        return;
    }
    for (int k = 0; k < g->nslots; k++)
        finish_op(g, &r->ops[k], status, r->why);
    /* the other pods ran (or will run) this op: our sequence no longer matches theirs */
    if (g->nodes > 1) group_break(g, status, "this pod's participants disagree on an op");
}

static void submit_collective(struct group *g, int slot, struct op *op)
{
    uint64_t seq = g->slots[slot].next_seq++;
    struct round *r = &g->rounds[seq & WMASK];
    if (r->arrived == 0) {
        r->seq = seq;
        r->status = COLL_OK;
        r->why[0] = '\0';
        r->deadline_ns = op->deadline_ns;
        r->timeout_ms = op->timeout_ms;
    } else if (r->seq != seq || r->present[slot]) {
        /* cannot happen while sessions respect the in-flight limit the agent enforces */
        log_msg(LOG_ERROR, "group.window", "group=%s slot=%d seq=%llu busy_with=%llu", g->cfg->name,
                slot, (unsigned long long)seq, (unsigned long long)r->seq);
        finish_op(g, op, COLL_ERR_INTERNAL, "the op window of the group is out of step");
        return;
    }
    if (r->arrived > 0 && r->status == COLL_OK) {
        int first = 0;
        while (!r->present[first])
            first++;
        if (!agree(&r->ops[first].sqe, &op->sqe)) {
            char a[128], b[128];
            group_describe(&r->ops[first].sqe, a, sizeof(a));
            group_describe(&op->sqe, b, sizeof(b));
            log_msg(LOG_WARN, "group.mismatch",
                    "group=%s epoch=%u seq=%llu rank=%d op=\"%s\" rank=%d op=\"%s\"", g->cfg->name,
                    g->epoch, (unsigned long long)seq, r->ops[first].rank, a, op->rank, b);
            r->status = COLL_ERR_MISMATCH;
            snprintf(r->why, sizeof(r->why), "rank %d: %.60s; rank %d: %.60s", r->ops[first].rank,
                     a, op->rank, b);
        }
    }
    r->ops[slot] = *op;
    r->present[slot] = 1;
    r->arrived++;
    if (r->arrived == g->nslots) run_round(g, r);
}

void group_submit(struct group *g, int slot, struct op *op)
{
    if (op->sqe.kind == WIRE_OP_SEND || op->sqe.kind == WIRE_OP_RECV)
        group_p2p_submit(g, op);
    else
        submit_collective(g, slot, op);
}

int64_t group_check_timeouts(struct group *g, int64_t now)
{
    int64_t held = g->be && g->be->held_deadline ? g->be->held_deadline(g) : INT64_MAX;
    struct round *r = &g->rounds[g->lo_seq & WMASK];
    if (r->arrived && r->deadline_ns <= now) {
        char why[160];
        snprintf(why, sizeof(why), "op %llu waited %d ms for %d of %d participants",
                 (unsigned long long)r->seq, r->timeout_ms, g->nslots - r->arrived, g->nslots);
        group_break(g, COLL_ERR_TIMEOUT, why);
    } else if (held <= now) {
        char why[160];
        snprintf(why, sizeof(why), "the pods did not form the group within %d ms",
                 g->cfg->op_timeout_ms);
        group_break(g, COLL_ERR_TIMEOUT, why);
    } else if (group_p2p_deadline(g) <= now) {
        char why[160];
        group_p2p_late(g, why, sizeof(why));
        group_break(g, COLL_ERR_TIMEOUT, why);
    }
    int64_t next = INT64_MAX;
    r = &g->rounds[g->lo_seq & WMASK];
    if (r->arrived) next = r->deadline_ns;
    int64_t p2p = group_p2p_deadline(g);
    if (p2p < next) next = p2p;
    held = g->be && g->be->held_deadline ? g->be->held_deadline(g) : INT64_MAX;
    if (held < next) next = held;
    for (struct group *c = g->children; c; c = c->next_child) {
        int64_t d = group_check_timeouts(c, now);
        if (d < next) next = d;
    }
    return next;
}

int group_turn(struct group *g, int64_t until)
{
    int moved = g->be && g->be->turn && g->be->turn(g, until);
    for (struct group *c = g->children; c; c = c->next_child)
        moved |= group_turn(c, until);
    return moved;
}

void group_state(const struct group *g, int *formed, uint32_t *epoch, char *detail, size_t cap)
{
    if (g->nodes <= 1 || !g->net) {
        *formed = 1;
        *epoch = g->epoch;
        snprintf(detail, cap, "one pod");
        return;
    }
    *formed = g->net_formed;
    *epoch = g->net_epoch;
    net_group_detail(g->net, g->index, detail, cap);
}

/* Children (made by group_child.c): how they end and go. */

static void children_orphan(struct group *g, const char *why)
{
    for (struct group *c = g->children; c; c = c->next_child) {
        if (c->orphan) continue;
        c->orphan = 1;
        char msg[160];
        snprintf(msg, sizeof(msg), "its parent group ended its epoch (%s)", why);
        group_break(c, COLL_ERR_EPOCH, msg);
    }
}

static void child_free(struct group *c)
{
    children_free(c); /* none, but for the agent's stop */
    free(c->parent_ranks);
    free(c->taken);
    group_fini(c);
    free(c); /* the child's block begins with its group (group_child.c) */
}

void group_child_release(struct group *c)
{
    /* held by a member, or by a child of its own that a member holds, or by its tasks
     * out on another thread (they live in its backend's state): stays */
    if (!c->parent || c->attached > 0 || c->children || (c->be && c->be->busy && c->be->busy(c)))
        return;
    struct group *parent = c->parent, **p = &parent->children;
    while (*p && *p != c)
        p = &(*p)->next_child;
    if (!*p) return;
    *p = c->next_child;
    parent->nchildren--;
    log_msg(LOG_INFO, "group.child_end", "group=%s parent=%s", c->cfg->name, parent->cfg->name);
    child_free(c);
    group_child_release(parent); /* a child that stayed for this one may go now */
}

static void children_free(struct group *g)
{
    while (g->children) {
        struct group *c = g->children;
        g->children = c->next_child;
        g->nchildren--;
        child_free(c);
    }
}
