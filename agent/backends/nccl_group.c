/*
 * nccl_group.c: the backend of groups on GPUs. Each rank's part of a matched op
 * becomes a gpu_task for the launcher of its GPU (gpu.h), which issues it on the
 * group's communicator for the current generation and hands it back. Within one pod
 * the agent makes each generation's NCCL id itself; across pods the coordinator makes
 * one per epoch and COMMIT carries it, so ops matched before the epoch formed wait
 * here (bounded by their deadline) for nccl_group_formed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../buffer.h"
#include "../gpu.h"
#include "../group.h"
#include "../log.h"
#include "../net.h"
#include "coll/coll.h"

/* A GPU task and the op it carries (the task first, so a returned task is its gtask). */
struct gtask {
    struct gpu_task t;
    struct op op;
    struct gtask *free_next;
    int live;
};

/* Engine thread only. */
struct nccl_group {
    int *dev; /* [nslots] the agent's GPU ordinal of each slot */
    struct gtask *pool, *free;
    size_t count;
    uint32_t comm_gen; /* one pod: bumped when a communicator breaks; several: the
                          net epoch whose id commid is */
    int formed;        /* several pods: the net epoch is formed, commid is valid (a child
                          across pods: its id came) */
    int ended;         /* a child across pods whose id failed or whose epoch ended: ops
                          fail (why) until it is made again */
    int ended_code;
    char ended_why[160];
    struct gtask *wait_head, *wait_tail; /* matched before the epoch formed */
    uint32_t commid_gen;                 /* generation commid belongs to (0: none yet) */
    uint32_t commid_asked;               /* one pod: the generation the worker makes an id for */
    uint8_t commid[GPU_COMMID_BYTES];
    uint64_t inflight, comms_created, graph_replays, graphs_captured;
    uint32_t drops; /* DROPs out on the launchers: a child stays until they are back */
};

static int nccl_init(struct group *g)
{
    const struct group_config *cfg = g->cfg;
    struct nccl_group *x = calloc(1, sizeof(*x));
    g->be_ctx = x;
    if (x) {
        x->dev = calloc((size_t)g->nslots, sizeof(int));
        x->count = 2 * (size_t)WIRE_RING_ENTRIES * (size_t)g->nslots;
        x->pool = calloc(x->count, sizeof(struct gtask));
    }
    if (!x || !x->dev || !x->pool) {
        snprintf(g->backend_why, sizeof(g->backend_why), "out of memory");
        return -1;
    }
    for (int k = 0; k < g->nslots; k++) {
        char why[160], spec[16];
        if (!cfg->ndevices) snprintf(spec, sizeof(spec), "%d", k);
        x->dev[k] = gpu_resolve_device(cfg->ndevices ? cfg->devices[k] : spec, why, sizeof(why));
        if (x->dev[k] < 0) {
            snprintf(g->backend_why, sizeof(g->backend_why), "slot %d: %s", k, why);
            return -1;
        }
        for (int j = 0; j < k; j++)
            if (x->dev[j] == x->dev[k]) {
                snprintf(g->backend_why, sizeof(g->backend_why),
                         "slots %d and %d are on the same GPU (NCCL takes one rank per GPU)", j, k);
                return -1;
            }
    }
    for (size_t i = 0; i < x->count; i++) {
        x->pool[i].free_next = x->free;
        x->free = &x->pool[i];
    }
    x->comm_gen = 1;
    return 0;
}

static void nccl_fini(struct group *g)
{
    struct nccl_group *x = g->be_ctx;
    if (!x) return;
    /* a child that goes: its communicators (made from its own ids) go with it */
    if (g->parent && g->gpu && x->commid_gen) gpu_forget_group(g->gpu, g->index, x->dev, g->nslots);
    log_msg(LOG_INFO, "group.stats", "group=%s ops_done=%llu ops_failed=%llu comm_generations=%u",
            g->cfg->name, (unsigned long long)g->ops_done, (unsigned long long)g->ops_failed,
            x->comm_gen);
    free(x->dev);
    free(x->pool);
    free(x);
    g->be_ctx = NULL;
}

static int nccl_accept(const struct group *g, int slot, const struct op *op, char *why,
                       size_t whylen)
{
    const struct nccl_group *x = g->be_ctx;
    return backend_check_placement(g, slot, op, x->dev[slot], why, whylen);
}

static void recycle(struct nccl_group *x, struct gtask *t)
{
    t->live = 0;
    t->free_next = x->free;
    x->free = t;
}

/* Hand one rank's op to the launcher of its GPU. */
static void to_gpu(struct group *g, struct op *op)
{
    struct nccl_group *x = g->be_ctx;
    struct gtask *gt = x->free;
    if (x->ended) {
        g->op_done(g, op, x->ended_code, x->ended_why);
        return;
    }
    if (!gt || !g->gpu || !op->sync) {
        g->op_done(g, op, !gt ? COLL_ERR_LIMIT : COLL_ERR_INTERNAL,
                   !gt ? "too many GPU ops in flight in this group" : "no GPU launcher");
        return;
    }
    int need_id = g->nodes == 1 && x->commid_gen != x->comm_gen;
    if (need_id && x->commid_asked != x->comm_gen) {
        /* this pod is the whole group: it makes the generation's id itself, on the GPU
         * worker (ncclGetUniqueId opens sockets); ops wait here for it */
        struct gpu_job *j = calloc(1, sizeof(*j));
        if (!j) {
            g->op_done(g, op, COLL_ERR_NOMEM, "out of memory");
            return;
        }
        j->type = GPU_JOB_COMMID;
        j->group = g->index;
        j->gen = x->comm_gen;
        j->fd = -1;
        x->commid_asked = x->comm_gen;
        gpu_job_submit(g->gpu, j);
    }
    x->free = gt->free_next;
    gt->live = 1;
    gt->op = *op;
    struct gpu_task *t = &gt->t;
    memset(t, 0, sizeof(*t));
    int slot = group_rank_slot(g, op->rank);
    t->type = GPU_TASK_OP;
    t->group = g->index;
    t->gen = x->comm_gen;
    t->nranks = g->size;
    t->rank = op->rank;
    memcpy(t->commid, x->commid, sizeof(t->commid));
    t->device = x->dev[slot];
    t->kind = op->sqe.kind;
    t->dtype = op->sqe.dtype;
    t->redop = op->sqe.redop;
    t->premul = op->premul;
    t->peer = op->sqe.peer;
    t->more = (op->sqe.flags & WIRE_SQE_F_MORE) != 0;
    t->count = op->sqe.count;
    t->send = op->send;
    t->recv = op->recv;
    /* the stream-order words live in the session's region, mapped for the GPU at
     * host address + (priv - 1) */
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
    x->inflight++;
    if ((g->nodes > 1 && !x->formed) || need_id) {
        /* the pods have not agreed on the epoch (and its id) yet, or the worker has not
         * made this pod's: hold it here */
        gt->free_next = NULL;
        if (x->wait_tail)
            x->wait_tail->free_next = gt;
        else
            x->wait_head = gt;
        x->wait_tail = gt;
        return;
    }
    gpu_submit(g->gpu, t);
}

static void nccl_collective(struct group *g, struct op *ops, uint64_t seq, int64_t deadline_ns)
{
    (void)seq, (void)deadline_ns;
    for (int k = 0; k < g->nslots; k++)
        to_gpu(g, &ops[k]);
}

static int nccl_p2p(struct group *g, struct op *op)
{
    to_gpu(g, op); /* NCCL pairs sends with receives itself, in issue order */
    return 1;
}

static int nccl_pair(struct group *g, struct op *snd, struct op *rcv)
{
    (void)g, (void)snd, (void)rcv;
    return COLL_ERR_INTERNAL; /* never called: nccl_p2p takes every op */
}

/* What waited for the generation's id fails with code and why. */
static void fail_waiting(struct group *g, struct nccl_group *x, int code, const char *why)
{
    while (x->wait_head) {
        struct gtask *gt = x->wait_head;
        x->wait_head = gt->free_next;
        x->inflight--;
        g->op_done(g, &gt->op, code, why);
        recycle(x, gt);
    }
    x->wait_tail = NULL;
}

/* Submit what waited for the generation's id. */
static void release_waiting(struct group *g, struct nccl_group *x)
{
    while (x->wait_head) {
        struct gtask *gt = x->wait_head;
        x->wait_head = gt->free_next;
        gt->t.gen = x->comm_gen;
        memcpy(gt->t.commid, x->commid, sizeof(gt->t.commid));
        gpu_submit(g->gpu, &gt->t);
    }
    x->wait_tail = NULL;
}

void nccl_group_formed(struct group *g, const struct net_event *ev)
{
    struct nccl_group *x = g->be_ctx;
    if (g->be != &backend_nccl || !x) return;
    if (!ev->has_commid) {
        log_msg(LOG_ERROR, "group.commid",
                "group=%s epoch=%u error=\"the coordinator sent no "
                "NCCL id (its backend for this group is not nccl?)\"",
                g->cfg->name, ev->epoch);
        return;
    }
    x->comm_gen = x->commid_gen = ev->epoch;
    memcpy(x->commid, ev->commid, sizeof(x->commid));
    x->formed = 1;
    release_waiting(g, x);
}

void nccl_child_formed(struct group *g, int code, const uint8_t *id, const char *why)
{
    struct nccl_group *x = g->be_ctx;
    if (g->be != &backend_nccl || !x || !g->slot_rank || x->formed || x->ended) return;
    if (code != COLL_OK) {
        log_msg(LOG_ERROR, "group.child_id", "group=%s code=%s error=\"%s\"", g->cfg->name,
                coll_strerror((coll_err)code), LOG_Q(why));
        x->ended = 1;
        x->ended_code = code;
        snprintf(x->ended_why, sizeof(x->ended_why), "no communicator for the child: %s", why);
        fail_waiting(g, x, code, x->ended_why);
        if (!x->inflight && !x->drops) g->idle(g); /* it may go now */
        return;
    }
    x->comm_gen = x->commid_gen = 1; /* its index is its own: one generation */
    memcpy(x->commid, id, sizeof(x->commid));
    x->formed = 1;
    release_waiting(g, x);
}

/* One pod: the worker made an id (job) for generation j->gen. */
void nccl_group_commid(struct group *g, const struct gpu_job *j)
{
    struct nccl_group *x = g->be_ctx;
    if (g->be != &backend_nccl || !x || j->gen != x->comm_gen) return; /* a stale one */
    if (j->status != COLL_OK) {
        log_msg(LOG_ERROR, "group.commid", "group=%s error=\"%s\"", g->cfg->name, j->why);
        x->commid_asked = 0; /* the next op asks again */
        fail_waiting(g, x, COLL_ERR_INTERNAL, j->why);
        return;
    }
    memcpy(x->commid, j->commid, sizeof(x->commid));
    x->commid_gen = x->comm_gen;
    release_waiting(g, x);
}

/* The epoch is over: ops held for an id fail. Several pods: the launchers abort its
 * communicators at once (a peer may be gone: NCCL would wait for it forever). */
static void nccl_epoch_over(struct group *g, int err, const char *why)
{
    struct nccl_group *x = g->be_ctx;
    if (!g->gpu) return;
    fail_waiting(g, x, err, why);
    if (g->slot_rank && !x->ended) { /* a child across pods is made once */
        x->ended = 1;
        x->ended_code = err;
        snprintf(x->ended_why, sizeof(x->ended_why), "%s", why);
    }
    if (g->nodes == 1 || !x->formed) return;
    x->formed = 0;
    /* a child across pods that its last member here closed (its parent's epoch stands):
     * nothing of ours runs on its communicators, which go with it (FORGET: destroyed,
     * not aborted) */
    if (g->slot_rank && !g->attached && !g->orphan) return;
    for (int k = 0; k < g->nslots; k++) {
        struct gtask *gt = x->free;
        if (!gt) break; /* each op on the communicator still ends at its deadline */
        x->free = gt->free_next;
        gt->live = 1;
        memset(&gt->t, 0, sizeof(gt->t));
        memset(&gt->op, 0, sizeof(gt->op));
        gt->t.type = GPU_TASK_DROP;
        gt->t.group = g->index;
        gt->t.gen = x->comm_gen;
        gt->t.device = x->dev[k];
        x->drops++;
        gpu_submit(g->gpu, &gt->t);
    }
}

void nccl_group_done(struct group *g, struct gpu_task *t)
{
    struct nccl_group *x = g->be_ctx;
    struct gtask *gt = (struct gtask *)t;
    if (t->type == GPU_TASK_OP) {
        x->inflight--;
        x->comms_created += (uint64_t)t->created_comm;
        x->graph_replays += t->replayed != 0;
        x->graphs_captured += t->replayed == 2;
        if (t->status != COLL_OK)
            log_msg(LOG_WARN, "group.gpu_op", "group=%s rank=%d op=%s error=\"%s\" detail=\"%s\"",
                    g->cfg->name, t->rank, wire_kind_name(t->kind),
                    coll_strerror((coll_err)t->status), t->why);
        g->op_done(g, &gt->op, t->status, t->why);
        if (t->comm_failed && t->gen == x->comm_gen && (g->nodes == 1 || x->formed)) {
            /* the communicator is gone: the next op makes a new one, and what is
             * pending now cannot run on it */
            x->comm_gen++;
            g->fail(g, t->status, t->why);
        }
    } else if (t->type == GPU_TASK_DROP) {
        x->drops--;
    }
    recycle(x, gt);
    /* a child that waited for them may go now */
    if (g->parent && !x->inflight && !x->drops) g->idle(g);
}

static int nccl_busy(const struct group *g)
{
    const struct nccl_group *x = g->be_ctx;
    return x && (x->inflight > 0 || x->drops > 0);
}

static int64_t nccl_held_deadline(const struct group *g)
{
    const struct nccl_group *x = g->be_ctx;
    return x->wait_head ? x->wait_head->op.deadline_ns : INT64_MAX;
}

static void nccl_forget(struct group *g, const struct session *s)
{
    struct nccl_group *x = g->be_ctx;
    for (size_t i = 0; i < x->count; i++)
        if (x->pool[i].live && x->pool[i].op.s == s) x->pool[i].op.s = NULL;
}

static int nccl_devices(const struct group *g, int *devs, int max)
{
    const struct nccl_group *x = g->be_ctx;
    int n = 0;
    for (int k = 0; k < g->nslots && n < max; k++)
        devs[n++] = x->dev[k];
    return n;
}

static void nccl_stats(const struct group *g, struct backend_stats *out)
{
    const struct nccl_group *x = g->be_ctx;
    out->comms_created = x->comms_created;
    out->comm_generations = x->comm_gen;
    out->graph_replays = x->graph_replays;
    out->graphs_captured = x->graphs_captured;
}

const struct backend_ops backend_nccl = {
    .name = "nccl",
    .probe = gpu_probe,
    .init = nccl_init,
    .fini = nccl_fini,
    .accept = nccl_accept,
    .collective = nccl_collective,
    .p2p = nccl_p2p,
    .pair = nccl_pair,
    .epoch_over = nccl_epoch_over,
    .held_deadline = nccl_held_deadline,
    .busy = nccl_busy,
    .forget_session = nccl_forget,
    .devices = nccl_devices,
    .stats = nccl_stats,
};
