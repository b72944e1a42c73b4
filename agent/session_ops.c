/*
 * session_ops.c: a client's submission ring: each entry copied out of shared memory,
 * validated once (its group, buffers, ranges and placement), handed to the group, and
 * completions posted back. Any check that fails is a protocol violation that ends this
 * session only (session_violation).
 */
#include "session.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "buffer.h"
#include "coll/coll.h"
#include "gpu.h"
#include "log.h"
#include "ring.h"
#include "util.h"

/* ---- ops ---------------------------------------------------------------------------- */

void session_complete(struct op *op, int status, const char *why)
{
    struct session *s = op->s;
    buffer_unref(&op->sb);
    buffer_unref(&op->rb);
    struct wire_shm *w = op->sync ? op->sync->map : s && s->state != SESSION_DEAD ? s->shm : NULL;
    uint32_t idx = (uint32_t)(op->sqe.tag & 0xffffffffu) - 1; /* checked for GPU ops */
    if (w && (op->sqe.flags & WIRE_SQE_F_GPU) && status != COLL_OK && idx < WIRE_RING_ENTRIES)
        ring_store_max64(&w->done[idx], op->sqe.tag); /* release a client stream waiting */
    buffer_unref(&op->sync);
    if (!s || s->state == SESSION_DEAD) return;
    struct wire_shm *shm = s->shm;
    if (status != COLL_OK && idx < WIRE_RING_ENTRIES) /* read by the client after the cqe */
        snprintf(shm->why[idx], sizeof(shm->why[idx]), "%s", why ? why : "");
    if (op->sqe.peer == WIRE_ANY_SOURCE && idx < WIRE_RING_ENTRIES) /* read after the cqe */
        shm->src[idx] = op->source; /* a receive from any rank's sender (no other op names -1) */
    struct wire_cqe *slot = &shm->cq[s->cq_tail & RING_MASK];
    slot->tag = op->sqe.tag;
    slot->status = status;
    ring_publish(&slot->seq, s->cq_tail);
    s->cq_tail++;
    s->inflight--;
    if (ring_peer_sleeping(&shm->client_sleeping)) {
        uint64_t one = 1;
        ssize_t wr = write(s->efd_client, &one, sizeof(one));
        (void)wr;
    }
}

const struct group_up session_group_up = {
    .complete = session_complete,
    .lease_void = session_lease_void,
};

/* Where one side of an op lands: buffer slot and byte range, checked. */
struct sqe_side {
    struct buffer *b; /* NULL: the side is unused */
    uint64_t off;
};

/* Check one side of an op against the session's buffers (no side effects). */
static int check_side(struct session *s, const char *what, uint32_t id, uint64_t off,
                      uint64_t elems, size_t es, int used, struct sqe_side *out)
{
    out->b = NULL;
    out->off = 0;
    if (!used || elems == 0) return 0;
    uint32_t i = id - 1;
    if (id == WIRE_BUF_NONE || i >= s->nbufs || !s->bufs[i] || s->bufs[i] == SESSION_BUF_PENDING)
        return session_violation(s, "%s buffer id %u is not registered", what, id);
    struct buffer *b = s->bufs[i];
    if (elems > UINT64_MAX / es || off > b->size || elems * es > b->size - off)
        return session_violation(
            s, "%s range [%llu, +%llu elements) exceeds buffer %u of %zu bytes", what,
            (unsigned long long)off, (unsigned long long)elems, id, b->size);
    if (off % es) /* the reductions read elements as their type (libcoll refuses it first) */
        return session_violation(
            s, "%s offset %llu in buffer %u is not aligned to its %zu-byte elements", what,
            (unsigned long long)off, id, es);
    out->b = b;
    out->off = off;
    return 0;
}

/*
 * The one validation pass over a ring entry, before anything else happens to it: every
 * field the client wrote is checked here (ranges, group handle, GPU flag and request
 * slot, peer rank, buffer ids and extents). Returns 0 with the group handle and both
 * sides resolved, or -1 for a protocol violation (logged, the session is dropped).
 * Nothing is referenced, completed or indexed with a client value before it returns 0.
 */
static int sqe_validate(struct session *s, const struct wire_sqe *q, struct session_handle **hp,
                        struct sqe_side *send, struct sqe_side *recv)
{
    char err[128];
    if (wire_sqe_check(q, err, sizeof(err)) < 0) return session_violation(s, "bad op: %s", err);
    if (q->group >= SESSION_MAX_HANDLES || !s->handles[q->group].g)
        return session_violation(s, "op for group handle %u, which is not open", q->group);
    struct session_handle *h = &s->handles[q->group];
    struct group *g = h->g;
    unsigned k = q->kind;
    if (wire_kind_reduces(k) && q->redop >= WIRE_REDOP_PREMUL) { /* (wire_sqe_check) */
        const struct session_premul *p =
            h->premul ? &h->premul[q->redop - WIRE_REDOP_PREMUL] : NULL;
        if (!p || !p->set || p->dtype != q->dtype)
            return session_violation(
                s, "op with premultiplied sum %u, %s for handle %u", q->redop - WIRE_REDOP_PREMUL,
                p && p->set ? "made for another dtype" : "never set", q->group);
    }
    if (q->flags & WIRE_SQE_F_GPU) {
        if (!s->env->gpu || g->be != &backend_nccl)
            return session_violation(s, "GPU op for group '%s', which runs on %s", g->cfg->name,
                                     g->be->name);
        uint32_t idx = (uint32_t)(q->tag & 0xffffffffu) - 1;
        if (idx >= WIRE_RING_ENTRIES)
            return session_violation(s, "GPU op tag %llx names no request slot",
                                     (unsigned long long)q->tag);
    }
    const char *nccl_no =
        g->be == &backend_nccl ? wire_nccl_refuses(k, q->dtype, q->redop, q->p2p_tag) : NULL;
    if (nccl_no)
        return session_violation(s, "%s of %s with %s (tag %u) for group '%s': %s",
                                 wire_kind_name(k), coll_dtype_name((coll_dtype)q->dtype),
                                 coll_redop_name((coll_redop)q->redop), q->p2p_tag, g->cfg->name,
                                 nccl_no);
    int needs_peer =
        k == WIRE_OP_BROADCAST || k == WIRE_OP_REDUCE || k == WIRE_OP_SEND || k == WIRE_OP_RECV;
    if (k == WIRE_OP_RECV && q->peer == WIRE_ANY_SOURCE) {
        if (g->be == &backend_nccl)
            return session_violation(s, "a receive from any rank for group '%s', on NCCL",
                                     g->cfg->name);
    } else if (needs_peer && (q->peer < 0 || q->peer >= g->size)) {
        return session_violation(s, "%s names rank %d; the group has %d", wire_kind_name(k),
                                 q->peer, g->size);
    }
    int rank = group_slot_rank(g, h->slot);
    int send_used =
        k != WIRE_OP_RECV && k != WIRE_OP_BARRIER && !(k == WIRE_OP_BROADCAST && rank != q->peer);
    int recv_used =
        k != WIRE_OP_SEND && k != WIRE_OP_BARRIER && !(k == WIRE_OP_REDUCE && rank != q->peer);
    uint64_t se, re;
    if (wire_sqe_extent(q, 0, (uint32_t)g->size, &se) < 0 ||
        wire_sqe_extent(q, 1, (uint32_t)g->size, &re) < 0)
        return session_violation(s, "op count %llu overflows", (unsigned long long)q->count);
    size_t es = coll_dtype_size((coll_dtype)q->dtype);
    if (check_side(s, "send", q->send_buf, q->send_off, se, es, send_used, send) < 0 ||
        check_side(s, "recv", q->recv_buf, q->recv_off, re, es, recv_used, recv) < 0)
        return -1;
    if (send->b && send->b == recv->b &&
        !wire_ranges_ok(k, q->send_off, se * es, q->recv_off, re * es, (uint64_t)rank,
                        q->count * es))
        return session_violation(
            s,
            "send [%llu, +%llu) and receive [%llu, +%llu) of buffer %u overlap, "
            "and not in place",
            (unsigned long long)q->send_off, (unsigned long long)(se * es),
            (unsigned long long)q->recv_off, (unsigned long long)(re * es), q->send_buf);
    *hp = h;
    return 0;
}

/* Buffers must live where the group runs: GPU groups take GPU ops (device buffers on
 * the slot's GPU, stream-order words), host groups host buffers. A misplaced op fails
 * with INVALID (the session stays). Returns 1 when op may run, 0 when it was failed
 * here. */
static int check_placement(struct session *s, struct group *g, int slot, struct op *op)
{
    char why[192] = "";
    int gpu_op = (op->sqe.flags & WIRE_SQE_F_GPU) != 0;
    g->be->accept(g, slot, op, why, sizeof(why));
    if (gpu_op) {
        if (!why[0] && s->shm_gpu <= 0)
            snprintf(why, sizeof(why), "the session region could not be registered with CUDA");
        if (s->shm_gpu > 0) op->sync = buffer_ref(s->shm_buf);
    }
    if (why[0]) {
        log_msg(LOG_INFO, "session.refuse_op", "session=%llu pid=%d detail=\"%s\"",
                (unsigned long long)s->id, (int)s->pid, LOG_Q(why));
        session_complete(op, COLL_ERR_INVALID, why);
        return 0;
    }
    return 1;
}

static int handle_sqe(struct session *s, const struct wire_sqe *q)
{
    struct session_handle *h = NULL;
    struct sqe_side sd, rv;
    if (sqe_validate(s, q, &h, &sd, &rv) < 0) return -1;
    struct group *g = h->g;
    struct op op = {.s = s, .sqe = *q};
    s->ops_submitted++;
    if (q->epoch != h->epoch || h->epoch != g->epoch) {
        session_complete(&op, COLL_ERR_EPOCH,
                         "the group was re-formed since this handle was opened");
        return 0;
    }
    op.rank = group_slot_rank(g, h->slot);
    if (wire_kind_reduces(q->kind) && q->redop >= WIRE_REDOP_PREMUL) { /* one value for
                                                                        * every rank */
        op.premul = h->premul[q->redop - WIRE_REDOP_PREMUL].scalar;
        op.sqe.redop = WIRE_REDOP_PREMUL;
    }
    if (sd.b) {
        op.sb = buffer_ref(sd.b);
        op.send = (char *)sd.b->map + sd.off;
    }
    if (rv.b) {
        op.rb = buffer_ref(rv.b);
        op.recv = (char *)rv.b->map + rv.off;
    }
    op.timeout_ms = h->op_ms;
    op.deadline_ns = now_ns() + (int64_t)h->op_ms * NS_PER_MS;
    if (g->lent_to == s && q->kind != WIRE_OP_SEND && q->kind != WIRE_OP_RECV) {
        session_complete(&op, COLL_ERR_INVALID,
                         "the group's connections are lent to this client (direct ops): give "
                         "them back before any other collective");
        return 0;
    }
    if (s->env->draining) { /* stopping: what is in flight finishes, nothing new starts */
        session_complete(&op, COLL_ERR_SHUTDOWN, "the agent is stopping");
        return 0;
    }
    if (check_placement(s, g, h->slot, &op) > 0) group_submit(g, h->slot, &op);
    return 0;
}

int session_poll(struct session *s)
{
    if (s->state != SESSION_READY) return 0;
    struct wire_shm *shm = s->shm;
    int n = 0;
    for (;;) {
        struct wire_sqe *slot = &shm->sq[s->sq_head & RING_MASK];
        if (!ring_ready(&slot->seq, s->sq_head)) break;
        /* every op taken must find room for its completion: look at what the client has
         * consumed only when the cached count says the cq might be full */
        if (s->inflight + (s->cq_tail - s->cq_head_seen) >= WIRE_RING_ENTRIES) {
            uint32_t head = ring_load_acquire(&shm->cq_head);
            if (s->cq_tail - head > WIRE_RING_ENTRIES || head - s->cq_head_seen > WIRE_RING_ENTRIES)
                return session_violation(s, "completion count %u is out of range", head);
            s->cq_head_seen = head;
            if (s->inflight + (s->cq_tail - head) >= WIRE_RING_ENTRIES) break;
        }
        struct wire_sqe q;
        memcpy(&q, slot, offsetof(struct wire_sqe, seq));
        atomic_signal_fence(memory_order_seq_cst); /* use the copy, never re-read shm */
        s->sq_head++;
        s->inflight++;
        n++;
        if (handle_sqe(s, &q) < 0) return -1;
    }
    return n;
}

int session_has_work(struct session *s)
{
    return s->state == SESSION_READY &&
           ring_ready(&s->shm->sq[s->sq_head & RING_MASK].seq, s->sq_head);
}

int session_gpu_buffers(const struct session *s)
{
    int n = 0;
    for (uint32_t i = 0; i < s->nbufs; i++)
        n += s->bufs[i] && s->bufs[i] != SESSION_BUF_PENDING && s->bufs[i]->device >= 0;
    return n;
}
