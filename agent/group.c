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
#include "util.h"

#define WMASK (WIRE_RING_ENTRIES - 1u)

/* A GPU task and the op it carries (the task first, so a returned task is its gtask). */
struct gtask {
    struct gpu_task t;
    struct op op;
    struct gtask *free_next;
    int live;
};

/* Devices of the slots and the task pool of a group on the NCCL backend. */
static int gpu_setup(struct group *g)
{
    const struct group_config *cfg = g->cfg;
    g->gpu_dev = calloc((size_t)g->nslots, sizeof(int));
    g->gt_count = 2 * (size_t)WIRE_RING_ENTRIES * (size_t)g->nslots;
    g->gt_pool = calloc(g->gt_count, sizeof(struct gtask));
    if (!g->gpu_dev || !g->gt_pool) {
        snprintf(g->backend_why, sizeof(g->backend_why), "out of memory");
        return -1;
    }
    for (int k = 0; k < g->nslots; k++) {
        char why[160], spec[16];
        if (!cfg->ndevices) snprintf(spec, sizeof(spec), "%d", k);
        g->gpu_dev[k] =
            gpu_resolve_device(cfg->ndevices ? cfg->devices[k] : spec, why, sizeof(why));
        if (g->gpu_dev[k] < 0) {
            snprintf(g->backend_why, sizeof(g->backend_why), "slot %d: %s", k, why);
            return -1;
        }
        for (int j = 0; j < k; j++)
            if (g->gpu_dev[j] == g->gpu_dev[k]) {
                snprintf(g->backend_why, sizeof(g->backend_why),
                         "slots %d and %d are on the same GPU (NCCL takes one rank per GPU)", j, k);
                return -1;
            }
    }
    for (size_t i = 0; i < g->gt_count; i++) {
        g->gt_pool[i].free_next = g->gt_free;
        g->gt_free = &g->gt_pool[i];
    }
    g->comm_gen = 1;
    return 0;
}

int group_init(struct group *g, const struct group_config *cfg, int node_index,
               group_complete_fn complete)
{
    memset(g, 0, sizeof(*g));
    g->cfg = cfg;
    g->complete = complete;
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
    if (g->nodes > 1) {
        /* one task per op in flight: every slot may have a ring's worth of sends and
         * receives with other pods, each its own task */
        size_t ntasks = nops;
        g->task_pool = calloc(ntasks, sizeof(struct net_task));
        if (!g->task_pool) goto fail_memory;
        struct op *tops = calloc(ntasks * (size_t)g->nslots, sizeof(struct op));
        if (!tops) goto fail_memory;
        for (size_t i = 0; i < ntasks; i++) {
            g->task_pool[i].ops = tops + i * (size_t)g->nslots;
            g->task_pool[i].engine_next = g->task_free;
            g->task_free = &g->task_pool[i];
        }
    }
    g->be = backend_choose(cfg, g->backend_why, sizeof(g->backend_why));
    if (g->be == &backend_nccl && gpu_setup(g) < 0) g->be = NULL;
    if (g->be) g->be_ctx = g->be->ctx_new();
    log_msg(g->be ? LOG_INFO : LOG_ERROR, "group.backend", "group=%s backend=%s reason=\"%s\"",
            cfg->name, g->be ? g->be->name : "none", g->backend_why);
    if (g->be && !g->be_ctx) {
        g->be = NULL;
        snprintf(g->backend_why, sizeof(g->backend_why), "backend state: out of memory");
    }
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
    if (g->nodes > 1)
        log_msg(LOG_INFO, "group.stats",
                "group=%s ops_done=%llu ops_failed=%llu inline=%llu handed_over=%llu queued=%llu",
                g->cfg->name, (unsigned long long)g->ops_done, (unsigned long long)g->ops_failed,
                (unsigned long long)g->inline_count[1], (unsigned long long)g->inline_count[2],
                (unsigned long long)g->inline_count[0]);
    if (g->be && g->be_ctx) g->be->ctx_free(g->be_ctx);
    if (g->gpu_dev)
        log_msg(LOG_INFO, "group.stats",
                "group=%s ops_done=%llu ops_failed=%llu comm_generations=%u", g->cfg->name,
                (unsigned long long)g->ops_done, (unsigned long long)g->ops_failed, g->comm_gen);
    free(g->gpu_dev);
    free(g->gt_pool);
    free(g->rounds[0].ops);
    free(g->rounds[0].present);
    free(g->p2p_pool);
    if (g->task_pool) free(g->task_pool[0].ops);
    free(g->task_pool);
    free(g->slots);
    memset(g, 0, sizeof(*g));
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
    g->slots[slot].s = NULL;
    g->attached--;
    log_msg(LOG_INFO, "group.detach", "group=%s slot=%d epoch=%u attached=%d/%d", g->cfg->name,
            slot, e, g->attached, g->nslots);
    if (e == g->epoch) group_break(g, COLL_ERR_PEER_LOST, "a participant left");
}

static void finish_op(struct group *g, struct op *op, int status, const char *why)
{
    /* op->s is NULL when its session ended while the op was with the net thread;
     * complete() then only drops the buffer references */
    if (status == COLL_OK)
        g->ops_done++;
    else
        g->ops_failed++;
    g->complete(op, status, status == COLL_OK ? NULL : why);
}

static void send_mark(struct group *g);

static void break_local(struct group *g, int err, const char *why);

void group_break(struct group *g, int err, const char *why)
{
    break_local(g, err, why);
    if (g->net) {
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

/* Hand one rank's op to the launcher of its GPU. */
static void to_gpu(struct group *g, struct op *op)
{
    struct gtask *x = g->gt_free;
    if (!x || !g->gpu || !op->sync) {
        finish_op(g, op, !x ? COLL_ERR_LIMIT : COLL_ERR_INTERNAL,
                  !x ? "too many GPU ops in flight in this group" : "no GPU launcher");
        return;
    }
    if (g->commid_gen != g->comm_gen && g->nodes == 1) {
        /* this pod is the whole group: it makes the generation's id itself */
        char why[160];
        if (gpu_new_commid(g->commid, why, sizeof(why)) < 0) {
            log_msg(LOG_ERROR, "group.commid", "group=%s error=\"%s\"", g->cfg->name, why);
            finish_op(g, op, COLL_ERR_INTERNAL, why);
            return;
        }
        g->commid_gen = g->comm_gen;
    }
    g->gt_free = x->free_next;
    x->live = 1;
    x->op = *op;
    struct gpu_task *t = &x->t;
    memset(t, 0, sizeof(*t));
    int slot = op->rank - g->node_index * g->nslots;
    t->type = GPU_TASK_OP;
    t->group = g->index;
    t->gen = g->comm_gen;
    t->nranks = g->size;
    t->rank = op->rank;
    memcpy(t->commid, g->commid, sizeof(t->commid));
    t->device = g->gpu_dev[slot];
    t->kind = op->sqe.kind;
    t->dtype = op->sqe.dtype;
    t->redop = op->sqe.redop;
    t->peer = op->sqe.peer;
    t->count = op->sqe.count;
    t->send = op->send;
    t->recv = op->recv;
    struct wire_shm *w = op->sync->map;
    uint32_t idx = (uint32_t)(op->sqe.tag & 0xffffffffu) - 1;
    intptr_t delta = (intptr_t)op->sync->priv - 1;
    t->ready = &w->ready[idx];
    t->done = &w->done[idx];
    t->ready_dev = (char *)t->ready + delta;
    t->done_dev = (char *)t->done + delta;
    t->tag = op->sqe.tag;
    t->client_gone = &op->sync->gone;
    t->deadline_ns = op->deadline_ns;
    t->init_ms = g->cfg->join_timeout_ms;
    g->gpu_inflight++;
    if (g->nodes > 1 && !g->gpu_formed) {
        /* the pods have not agreed on the epoch (and its id) yet: hold it here */
        x->free_next = NULL;
        if (g->gwait_tail)
            g->gwait_tail->free_next = x;
        else
            g->gwait_head = x;
        g->gwait_tail = x;
        return;
    }
    gpu_submit(g->gpu, t);
}

void group_net_formed(struct group *g, const struct net_event *ev)
{
    if (!g->gpu_dev) return;
    if (!ev->has_commid) {
        log_msg(LOG_ERROR, "group.commid",
                "group=%s epoch=%u error=\"the coordinator sent no "
                "NCCL id (its backend for this group is not nccl?)\"",
                g->cfg->name, ev->epoch);
        return;
    }
    g->comm_gen = g->commid_gen = ev->epoch;
    memcpy(g->commid, ev->commid, sizeof(g->commid));
    g->gpu_formed = 1;
    while (g->gwait_head) {
        struct gtask *x = g->gwait_head;
        g->gwait_head = x->free_next;
        x->t.gen = g->comm_gen;
        memcpy(x->t.commid, g->commid, sizeof(x->t.commid));
        gpu_submit(g->gpu, &x->t);
    }
    g->gwait_tail = NULL;
}

/* Several pods: the epoch is over. Ops held for it fail; the launchers abort its
 * communicators at once (a peer may be gone: NCCL would wait for it forever). */
static void gpu_epoch_over(struct group *g, int err, const char *why)
{
    while (g->gwait_head) {
        struct gtask *x = g->gwait_head;
        g->gwait_head = x->free_next;
        g->gpu_inflight--;
        finish_op(g, &x->op, err, why);
        x->live = 0;
        x->free_next = g->gt_free;
        g->gt_free = x;
    }
    g->gwait_tail = NULL;
    if (!g->gpu_formed) return;
    g->gpu_formed = 0;
    for (int k = 0; k < g->nslots; k++) {
        struct gtask *x = g->gt_free;
        if (!x) break; /* each op on the communicator still ends at its deadline */
        g->gt_free = x->free_next;
        x->live = 1;
        memset(&x->t, 0, sizeof(x->t));
        memset(&x->op, 0, sizeof(x->op));
        x->t.type = GPU_TASK_DROP;
        x->t.group = g->index;
        x->t.gen = g->comm_gen;
        x->t.device = g->gpu_dev[k];
        gpu_submit(g->gpu, &x->t);
    }
}

void group_gpu_done(struct group *g, struct gpu_task *t)
{
    struct gtask *x = (struct gtask *)t;
    if (t->type == GPU_TASK_OP) {
        g->gpu_inflight--;
        g->comms_created += (uint64_t)t->created_comm;
        if (t->status != COLL_OK)
            log_msg(LOG_WARN, "group.gpu_op", "group=%s rank=%d op=%s error=\"%s\" detail=\"%s\"",
                    g->cfg->name, t->rank, wire_kind_name(t->kind),
                    coll_strerror((coll_err)t->status), t->why);
        finish_op(g, &x->op, t->status, t->why);
        if (t->comm_failed && t->gen == g->comm_gen && (g->nodes == 1 || g->gpu_formed)) {
            /* the communicator is gone: the next op makes a new one, and what is
             * pending now cannot run on it */
            g->comm_gen++;
            group_break(g, t->status, t->why);
        }
    }
    x->live = 0;
    x->free_next = g->gt_free;
    g->gt_free = x;
}

void group_forget_session(struct group *g, const struct session *s)
{
    for (size_t i = 0; i < g->gt_count; i++)
        if (g->gt_pool[i].live && g->gt_pool[i].op.s == s) g->gt_pool[i].op.s = NULL;
    for (struct net_task *t = g->in_net; t; t = t->engine_next)
        for (int k = 0; k < t->nops; k++)
            if (t->ops[k].s == s) t->ops[k].s = NULL;
}

void group_net_done(struct group *g, struct net_task *t)
{
    if (t == &g->mark) {
        g->mark_busy = 0;
        send_mark(g);
        return;
    }
    for (struct net_task **pp = &g->in_net; *pp; pp = &(*pp)->engine_next) {
        if (*pp == t) {
            *pp = t->engine_next;
            break;
        }
    }
    for (int k = 0; k < t->nops; k++)
        finish_op(g, &t->ops[k], t->status, t->why);
    t->nops = 0;
    t->engine_next = g->task_free;
    g->task_free = t;
}

/* Lend a matched op (its ops copied into a task) to the net thread; a tiny one the
 * engine may run itself (net_inline) when nothing of the group is with the net thread,
 * which keeps the group's ops in order. */
static void to_net(struct group *g, const struct op *ops, int nops, const struct wire_sqe *s,
                   uint64_t seq, int64_t deadline)
{
    struct net_task *t = g->task_free;
    if (!t) { /* cannot happen: each task holds an op in flight of some session */
        for (int k = 0; k < nops; k++) {
            struct op tmp = ops[k];
            finish_op(g, &tmp, COLL_ERR_INTERNAL, "no free network task");
        }
        return;
    }
    g->task_free = t->engine_next;
    struct op *keep = t->ops;
    memset(t, 0, offsetof(struct net_task, ops));
    t->ops = keep;
    t->type = NET_TASK_OP;
    t->group = g->index;
    t->lepoch = g->epoch;
    t->seq = seq;
    t->kind = s->kind;
    t->dtype = s->dtype;
    t->redop = s->redop;
    t->root = s->peer;
    t->count = s->count;
    t->deadline_ns = deadline;
    t->nops = nops;
    for (int k = 0; k < nops; k++) {
        t->ops[k] = ops[k];
        int slot = ops[k].rank - g->node_index * g->nslots;
        t->send[slot] = ops[k].send;
        t->recv[slot] = ops[k].recv;
        t->local_slot = slot;
    }
    int rc = NET_INLINE_NO;
    if (!g->in_net && !g->mark_busy && !g->mark_pending && nops == g->nslots)
        rc = net_inline(g->net, t);
    g->inline_count[rc]++;
    if (rc == NET_INLINE_DONE) {
        for (int k = 0; k < t->nops; k++)
            finish_op(g, &t->ops[k], t->status, t->why);
        t->nops = 0;
        t->engine_next = g->task_free;
        g->task_free = t;
        return;
    }
    t->engine_next = g->in_net;
    g->in_net = t;
    if (rc == NET_INLINE_NO) net_submit(g->net, t);
}

static void break_local(struct group *g, int err, const char *why)
{
    int failed = 0;
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
    while (g->p2p_head) {
        struct op *op = g->p2p_head;
        g->p2p_head = op->next;
        finish_op(g, op, err, why);
        op->next = g->p2p_free;
        g->p2p_free = op;
        failed++;
    }
    g->p2p_tail = NULL;
    if (g->gpu_dev && g->gpu && g->nodes > 1) gpu_epoch_over(g, err, why);
    uint32_t old = g->epoch;
    g->epoch++;
    g->lo_seq = 0;
    for (int k = 0; k < g->nslots; k++)
        g->slots[k].next_seq = 0;
    log_msg(failed && err != COLL_ERR_SHUTDOWN ? LOG_WARN : LOG_INFO, "group.epoch",
            "group=%s epoch=%u next_epoch=%u error=\"%s\" failed_ops=%d reason=\"%s\"",
            g->cfg->name, old, g->epoch, coll_strerror(err), failed, why);
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

static void describe(const struct wire_sqe *s, char *buf, size_t n)
{
    snprintf(buf, n, "%s %s count=%llu op=%s root=%d", wire_kind_name(s->kind),
             coll_dtype_name((coll_dtype)s->dtype), (unsigned long long)s->count,
             coll_redop_name((coll_redop)s->redop), s->peer);
}

static void run_round(struct group *g, struct round *r)
{
    void *send[64], *recv[64];
    int status = r->status;
    const struct wire_sqe *s = &r->ops[0].sqe;
    if (status == COLL_OK && g->gpu_dev) {
        for (int k = 0; k < g->nslots; k++) {
            r->present[k] = 0;
            to_gpu(g, &r->ops[k]);
        }
        r->arrived = 0;
        g->lo_seq++;
        return;
    }
    if (status == COLL_OK && g->nodes > 1) {
        to_net(g, r->ops, g->nslots, s, r->seq, r->deadline_ns);
        for (int k = 0; k < g->nslots; k++)
            r->present[k] = 0;
        r->arrived = 0;
        g->lo_seq++;
        return;
    }
    if (status == COLL_OK) {
        if (g->nslots > 64) {
            status = COLL_ERR_UNSUPPORTED;
        } else {
            for (int k = 0; k < g->nslots; k++) {
                send[k] = r->ops[k].send;
                recv[k] = r->ops[k].recv;
            }
            struct backend_task t = {.kind = s->kind,
                                     .dtype = s->dtype,
                                     .redop = s->redop,
                                     .root = s->peer,
                                     .count = s->count,
                                     .nranks = g->nslots,
                                     .send = send,
                                     .recv = recv};
            status = g->be->run(g->be_ctx, &t);
        }
    }
    for (int k = 0; k < g->nslots; k++) {
        r->present[k] = 0;
        finish_op(g, &r->ops[k], status, status == r->status ? r->why : NULL);
    }
    r->arrived = 0;
    g->lo_seq++;
    /* the other pods ran (or will run) this op: our sequence no longer matches theirs */
    if (status != COLL_OK && g->nodes > 1)
        group_break(g, status, "this pod's participants disagree on an op");
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
            describe(&r->ops[first].sqe, a, sizeof(a));
            describe(&op->sqe, b, sizeof(b));
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

static void submit_p2p(struct group *g, struct op *op)
{
    int is_send = op->sqe.kind == WIRE_OP_SEND;
    if (g->gpu_dev) { /* NCCL pairs sends with receives itself, in issue order */
        to_gpu(g, op);
        return;
    }
    if (op->sqe.peer / g->nslots != g->node_index) { /* the partner is on another pod */
        to_net(g, op, 1, &op->sqe, 0, op->deadline_ns);
        return;
    }
    struct op **pp = &g->p2p_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        struct op *o = *pp;
        int o_send = o->sqe.kind == WIRE_OP_SEND;
        if (o_send == is_send || o->rank != op->sqe.peer || o->sqe.peer != op->rank) continue;
        /* matched: unlink, move the data, complete both */
        *pp = o->next;
        if (g->p2p_tail == o) g->p2p_tail = prev;
        struct op *snd = is_send ? op : o, *rcv = is_send ? o : op;
        int status = COLL_OK;
        if (snd->sqe.count != rcv->sqe.count || snd->sqe.dtype != rcv->sqe.dtype) {
            char a[128], b[128];
            describe(&snd->sqe, a, sizeof(a));
            describe(&rcv->sqe, b, sizeof(b));
            log_msg(LOG_WARN, "group.mismatch", "group=%s send=\"%s\" recv=\"%s\"", g->cfg->name, a,
                    b);
            status = COLL_ERR_MISMATCH;
        } else {
            void *s[1] = {snd->send}, *d[1] = {rcv->recv};
            struct backend_task t = {.kind = WIRE_OP_SEND,
                                     .dtype = snd->sqe.dtype,
                                     .count = snd->sqe.count,
                                     .nranks = 1,
                                     .send = s,
                                     .recv = d};
            status = g->be->run(g->be_ctx, &t);
        }
        finish_op(g, snd, status, NULL);
        finish_op(g, rcv, status, NULL);
        if (o != op) {
            o->next = g->p2p_free;
            g->p2p_free = o;
        }
        return;
    }
    struct op *q = g->p2p_free;
    if (!q) {
        finish_op(g, op, COLL_ERR_LIMIT, "too many sends and receives wait for their partners");
        return;
    }
    g->p2p_free = q->next;
    *q = *op;
    q->next = NULL;
    if (g->p2p_tail)
        g->p2p_tail->next = q;
    else
        g->p2p_head = q;
    g->p2p_tail = q;
}

void group_submit(struct group *g, int slot, struct op *op)
{
    if (op->sqe.kind == WIRE_OP_SEND || op->sqe.kind == WIRE_OP_RECV)
        submit_p2p(g, op);
    else
        submit_collective(g, slot, op);
}

int64_t group_check_timeouts(struct group *g, int64_t now)
{
    struct round *r = &g->rounds[g->lo_seq & WMASK];
    if (r->arrived && r->deadline_ns <= now) {
        char why[160];
        snprintf(why, sizeof(why), "op %llu waited %d ms for %d of %d participants",
                 (unsigned long long)r->seq, g->cfg->op_timeout_ms, g->nslots - r->arrived,
                 g->nslots);
        group_break(g, COLL_ERR_TIMEOUT, why);
    } else if (g->gwait_head && g->gwait_head->op.deadline_ns <= now) {
        char why[160];
        snprintf(why, sizeof(why), "the pods did not form the group within %d ms",
                 g->cfg->op_timeout_ms);
        group_break(g, COLL_ERR_TIMEOUT, why);
    } else if (g->p2p_head && g->p2p_head->deadline_ns <= now) {
        char why[160];
        snprintf(why, sizeof(why), "%s from rank %d to rank %d found no partner in %d ms",
                 wire_kind_name(g->p2p_head->sqe.kind), g->p2p_head->rank, g->p2p_head->sqe.peer,
                 g->cfg->op_timeout_ms);
        group_break(g, COLL_ERR_TIMEOUT, why);
    }
    int64_t next = INT64_MAX;
    r = &g->rounds[g->lo_seq & WMASK];
    if (r->arrived) next = r->deadline_ns;
    if (g->p2p_head && g->p2p_head->deadline_ns < next) next = g->p2p_head->deadline_ns;
    if (g->gwait_head && g->gwait_head->op.deadline_ns < next) next = g->gwait_head->op.deadline_ns;
    return next;
}
