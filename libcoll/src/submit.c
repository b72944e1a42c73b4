/*
 * submit.c: turning one op into a ring entry (or a direct op): range checks, buffer
 * lookups, request slots, the doorbell; and one send or receive of a composite op.
 * Above conn.c, buffers.c, direct.c and wait.c; ops.c (the coll_* calls), compose.c,
 * rsag.c and span.c call here.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lc.h"

/* A range outside coll buffers where the op could run in this process: submit again,
 * raw (not a coll_err, never reported). */
#define RESOLVE_RAW (-1)

/* raw: 1, the op runs in this process (direct), where host memory outside coll buffers
 * will do: such a range gives no buffer, and its address is checked instead; 0, it
 * could (RESOLVE_RAW); -1, it cannot. */
static int resolve(coll_conn *c, const char *what, const void *p, uint64_t elems, size_t esize,
                   int used, int raw, coll_buffer **b, uint64_t *off, uint32_t *id)
{
    *b = NULL;
    *off = 0;
    *id = WIRE_BUF_NONE;
    if (!used || elems == 0) return COLL_OK;
    if (!p) return lc_fail(COLL_ERR_INVALID, "%s buffer is NULL", what);
    if (elems > UINT64_MAX / esize) return lc_fail(COLL_ERR_INVALID, "%s size overflows", what);
    coll_buffer *buf = lc_find_buffer(c, p, elems * esize);
    if (!buf && raw == 0) return RESOLVE_RAW;
    if (!buf && raw > 0) {
        if ((uintptr_t)p > UINTPTR_MAX - elems * esize)
            return lc_fail(COLL_ERR_INVALID, "%s range %p + %llu bytes wraps around", what, p,
                           (unsigned long long)(elems * esize));
        if ((uintptr_t)p % esize)
            return lc_fail(COLL_ERR_INVALID,
                           "%s pointer %p is not aligned to its element type (%zu bytes)", what, p,
                           esize);
        return COLL_OK; /* the caller checks overlap on addresses */
    }
    if (!buf)
        return lc_fail(COLL_ERR_INVALID,
                       "%s range %p + %llu bytes is not inside a buffer shared with the agent "
                       "(only ops that run in this process take host memory outside coll "
                       "buffers: coll.h, direct ops)",
                       what, p, (unsigned long long)(elems * esize));
    uint64_t o = (uint64_t)((uintptr_t)p - (uintptr_t)buf->ptr);
    /* buffers start on a page: an element-aligned offset is an element-aligned address,
     * which the reductions read as the element type */
    if (o % esize)
        return lc_fail(COLL_ERR_INVALID,
                       "%s pointer %p is not aligned to its element type (%zu bytes)", what, p,
                       esize);
    *b = buf;
    *off = o;
    *id = buf->id;
    return COLL_OK;
}

/* Request slot r (the last free one) is this op's, pending; caller holds c->lock. */
static void take_slot(coll_conn *c, struct req *r, uint32_t group, int gpu, coll_buffer *sb,
                      coll_buffer *rb)
{
    c->nfree--;
    r->gen++;
    r->gpu = (uint8_t)gpu;
    r->detached = 0;
    r->group = group;
    r->state = REQ_PENDING;
    r->status = COLL_OK;
    r->sb = sb;
    r->rb = rb;
    r->src_out = NULL;
    if (sb) sb->inflight++;
    if (rb) rb->inflight++;
}

coll_err lc_op_check(const coll_group *g, const struct op_args *a)
{
    if ((unsigned)a->dtype >= COLL_DTYPE_COUNT)
        return lc_fail(COLL_ERR_INVALID, "dtype %d out of range", a->dtype);
    if ((unsigned)a->redop >= WIRE_REDOP_PREMUL && wire_kind_reduces(a->kind)) {
        unsigned k = (unsigned)a->redop - WIRE_REDOP_PREMUL;
        if (k >= WIRE_PREMUL_SLOTS ||
            !atomic_load_explicit(&g->premul[k].set, memory_order_acquire))
            return lc_fail(COLL_ERR_INVALID,
                           "reduction %d is no premultiplied sum of this group handle "
                           "(coll_redop_create_premul_sum)",
                           a->redop);
        if (g->premul[k].dtype != a->dtype)
            return lc_fail(
                COLL_ERR_INVALID, "%s: premultiplied sum %d was made for %s; the op is of %s",
                wire_kind_name(a->kind), a->redop, coll_dtype_name((coll_dtype)g->premul[k].dtype),
                coll_dtype_name((coll_dtype)a->dtype));
    } else if ((unsigned)a->redop >= COLL_REDOP_COUNT) {
        return lc_fail(COLL_ERR_INVALID, "reduction %d out of range", a->redop);
    }
    if (!wire_redop_fits(a->kind, (unsigned)a->dtype, (unsigned)a->redop))
        return lc_fail(COLL_ERR_INVALID, "%s: reduction %s of %s (%s)", wire_kind_name(a->kind),
                       coll_redop_name((coll_redop)a->redop), coll_dtype_name((coll_dtype)a->dtype),
                       wire_redop_rule());
    const char *nccl_no = g->gpu ? wire_nccl_refuses(a->kind, (unsigned)a->dtype,
                                                     (unsigned)a->redop, (uint32_t)a->tag)
                                 : NULL;
    if (nccl_no)
        return lc_fail(COLL_ERR_UNSUPPORTED, "%s of %s with %s (tag %d) on a GPU group: %s",
                       wire_kind_name(a->kind), coll_dtype_name((coll_dtype)a->dtype),
                       coll_redop_name((coll_redop)a->redop), a->tag, nccl_no);
    if (a->kind == WIRE_OP_RECV && a->peer == COLL_ANY_SOURCE) {
        const char *no = g->gpu    ? "a GPU group's (NCCL has no receive from any rank)"
                         : g->span ? "a child across pods' (its receives name their rank)"
                         : !g->conn->agent_any ? "this agent's (it is older than such receives)"
                                               : NULL;
        if (no) return lc_fail(COLL_ERR_UNSUPPORTED, "a receive from any rank is not %s", no);
    } else if ((a->kind == WIRE_OP_BROADCAST || a->kind == WIRE_OP_REDUCE ||
                a->kind == WIRE_OP_SEND || a->kind == WIRE_OP_RECV) &&
               (a->peer < 0 || a->peer >= g->info.size))
        return lc_fail(COLL_ERR_INVALID, "%s: rank %d is outside the group (size %d)",
                       wire_kind_name(a->kind), a->peer, g->info.size);
    return COLL_OK;
}

/* raw as resolve's: 1 the op runs here on host memory outside coll buffers. */
static coll_err submit(coll_group *g, const struct op_args *a, coll_request *req, int raw)
{
    coll_conn *c = g->conn;
    struct wire_sqe s = {.count = a->count,
                         .group = g->handle,
                         .epoch = g->epoch,
                         .kind = a->kind,
                         .dtype = (uint8_t)a->dtype,
                         .redop = (uint8_t)a->redop,
                         .peer = a->peer,
                         .p2p_tag = (uint32_t)a->tag};
    size_t es = coll_dtype_size((coll_dtype)a->dtype);
    uint64_t selems, relems;
    if (wire_sqe_extent(&s, 0, (uint32_t)g->info.size, &selems) < 0 ||
        wire_sqe_extent(&s, 1, (uint32_t)g->info.size, &relems) < 0)
        return lc_fail(COLL_ERR_INVALID, "count %llu overflows", (unsigned long long)a->count);
    coll_buffer *sb, *rb;
    int gpu = g->gpu;
    /* a tiny op of a group whose connections the agent lends runs here (direct.c); any
     * other collective first finishes those and gives the connections back. An op on
     * host memory outside coll buffers runs here or not at all. */
    int direct = 0, wants = 0;
    if (g->d) {
        uint64_t most = selems > relems ? selems : relems;
        uint64_t bytes = most > UINT64_MAX / es ? UINT64_MAX : most * es;
        wants = lc_direct_wants(g, a->kind, (unsigned)a->dtype, a->count, bytes);
        if (raw > 0) {
            coll_err e = lc_direct_begin_raw(g);
            if (e != COLL_OK) return e;
            direct = 1;
        } else if (wants) {
            direct = lc_direct_begin(g);
        } else if (a->kind != WIRE_OP_SEND && a->kind != WIRE_OP_RECV) {
            lc_direct_give_back(g);
        }
    }
    if (raw == 0 && !wants) raw = -1; /* this op never runs here */
    pthread_mutex_lock(&c->lock);
    coll_err rc;
    if (c->lost) {
        rc = lc_fail_lost(c);
        goto out;
    }
    if (c->stream_err) {
        rc = lc_fail(c->stream_err, "%s", c->stream_err_msg);
        c->stream_err = COLL_OK;
        goto out;
    }
    if (c->nfree == 0) lc_reap(c);
    if (c->nfree == 0 && c->ndetached > 0) {
        /* streams wait for some of the slots' ops and nobody else will: they free
         * themselves as they complete, so wait for one (bounded; before any buffer is
         * looked up, as the lock is let go meanwhile) */
        int64_t deadline = now_ns() + SLOT_WAIT_NS;
        while (c->nfree == 0 && !c->lost && now_ns() < deadline) {
            pthread_mutex_unlock(&c->lock);
            lc_sleep_for_completion(c, deadline, NULL, 0);
            pthread_mutex_lock(&c->lock);
            lc_reap(c);
        }
        if (c->lost) {
            rc = lc_fail_lost(c);
            goto out;
        }
    }
    rc = resolve(c, "send", a->send, selems, es, a->send_used, raw, &sb, &s.send_off, &s.send_buf);
    if (rc) goto out;
    rc = resolve(c, "recv", a->recv, relems, es, a->recv_used, raw, &rb, &s.recv_off, &s.recv_buf);
    if (rc) goto out;
    if (raw > 0) { /* addresses, whatever holds them */
        s.send_off = a->send_used && selems ? (uint64_t)(uintptr_t)a->send : 0;
        s.recv_off = a->recv_used && relems ? (uint64_t)(uintptr_t)a->recv : 0;
    }
    if (((sb && sb == rb) || (raw > 0 && s.send_off && s.recv_off)) &&
        !wire_ranges_ok(a->kind, s.send_off, selems * es, s.recv_off, relems * es,
                        (uint64_t)g->info.rank, a->count * es)) {
        rc = lc_fail(COLL_ERR_INVALID,
                     "send %p and receive %p overlap, and not in place (coll.h: in-place use)",
                     a->send, a->recv);
        goto out;
    }
    if ((sb && (sb->device >= 0) != gpu) || (rb && (rb->device >= 0) != gpu)) {
        rc = lc_fail(
            COLL_ERR_INVALID,
            gpu ? "group '%s' runs on NCCL: its ops take GPU buffers (coll_mem_alloc with a "
                  "device, or coll_mem_register_cuda)"
                : "group '%s' runs on the host backend: its ops take host buffers",
            g->info.name);
        goto out;
    }
    if (c->nfree == 0) {
        rc = lc_fail(COLL_ERR_LIMIT, "%d requests are pending: wait for some first",
                     WIRE_RING_ENTRIES);
        goto out;
    }
    uint32_t idx = c->free_idx[c->nfree - 1];
    struct req *r = &c->reqs[idx];
    s.tag = ((uint64_t)(r->gen + 1) << 32) | (idx + 1);
    r->kind = a->kind;
    r->direct = (uint8_t)direct;
    if (direct) {
        take_slot(c, r, g->handle, 0, sb, rb);
        r->rang = 0;
        r->dtype = (uint8_t)a->dtype;
        r->redop = (uint8_t)a->redop;
        if (r->redop >= WIRE_REDOP_PREMUL) { /* a reduction's (lc_op_check) */
            r->premul = g->premul[r->redop - WIRE_REDOP_PREMUL].bits;
            r->redop = WIRE_REDOP_PREMUL;
        }
        r->root = a->peer;
        r->count = a->count;
        r->send = a->send_used ? a->send : NULL;
        r->recv = a->recv_used ? a->recv : NULL;
        r->t0 = now_ns();
        r->deadline = r->t0 + lc_direct_op_ns(g);
        r->dg = g;
        req->id = s.tag;
        pthread_mutex_unlock(&c->lock);
        lc_direct_queue(g, idx); /* lets the direct lock go */
        return COLL_OK;
    }
    if (gpu) {
        /* the agent's stream starts the op once this stream has written ready */
        char why[160];
        rc = lc_shm_for_gpu(c);
        if (rc) goto out;
        if (lcgpu_stream_idle(a->stream)) {
            /* nothing is pending on the stream: the op may start at once; saying so
             * from the CPU spares both streams a memory operation */
            atomic_store_explicit(&c->shm->ready[idx], s.tag, memory_order_release);
        } else {
            void *word = (char *)&c->shm->ready[idx] + c->shm_delta;
            if (lcgpu_write(a->stream, word, s.tag, why, sizeof(why)) < 0) {
                rc = lc_fail(COLL_ERR_INVALID, "%s", why);
                goto out;
            }
        }
        s.flags |= WIRE_SQE_F_GPU | (a->flags & WIRE_SQE_F_MORE);
    } else {
        /* span.c's: no word back (sends), the op's signature (sends and receives), where
         * the agent takes them */
        s.flags |= a->flags & (a->kind == WIRE_OP_SEND   ? WIRE_SQE_F_NOACK | WIRE_SQE_F_SIG
                               : a->kind == WIRE_OP_RECV ? WIRE_SQE_F_SIG
                                                         : 0u);
    }
    take_slot(c, r, g->handle, gpu, sb, rb);
    r->src_out = a->source;
    struct wire_sqe *slot = &c->shm->sq[c->sq_next & RING_MASK];
    memcpy(slot, &s, offsetof(struct wire_sqe, seq));
    ring_publish(&slot->seq, c->sq_next);
    c->sq_next++;
    /* on a small machine an op that crosses pods takes longer than a spin is worth:
     * sleep at once and leave the CPU to the agent's threads (measured: bench/RESULTS.md,
     * issue 3), unless the agent said it runs where we may not, so that our spin takes
     * nothing from it. And say where we run, for the agent's same choice. */
    ring_say_cpu(&c->shm->client_sleeping, sched_getcpu());
    int agent_elsewhere = coll_cpu_outside(&c->cpus, ring_peer_cpu(&c->shm->agent_sleeping));
    r->rang = g->info.nodes > 1 && !c->spin_set && c->few_cpus && !agent_elsewhere;
    if (ring_peer_sleeping(&c->shm->agent_sleeping)) {
        uint64_t one = 1;
        ssize_t w = write(c->efd_agent, &one, sizeof(one));
        (void)w;
        /* the agent needs tens of microseconds to wake: where it may share our CPU, a
         * spin meanwhile only delays it; elsewhere, a spin sees its answer at once (and
         * lets it keep spinning for our next op) */
        if (!agent_elsewhere) r->rang = 1;
    }
    req->id = s.tag;
out:
    pthread_mutex_unlock(&c->lock);
    if (direct) lc_direct_unlock(g);
    if (rc == (coll_err)RESOLVE_RAW) return submit(g, a, req, 1);
    return rc;
}

coll_err lc_submit(coll_group *g, const struct op_args *a, coll_request *req)
{
    return submit(g, a, req, 0);
}

coll_err lc_p2p(coll_group *g, unsigned kind, const void *send, void *recv, uint64_t count,
                int dtype, int peer, uint32_t tag, void *stream, unsigned flags, int sig,
                coll_request *req)
{
    struct op_args a = {
        (uint8_t)kind,       dtype, 0, peer, count, send, recv, kind == WIRE_OP_SEND,
        kind == WIRE_OP_RECV};
    a.tag = (int)tag;
    a.stream = stream;
    a.flags = flags;
    req->id = 0;
    coll_err rc = lc_op_check(g, &a);
    if (rc != COLL_OK) return rc;
    if (sig >= 0 && g->conn->agent_sig) { /* checked as a plain send or receive, then signed */
        a.flags |= WIRE_SQE_F_SIG;
        a.redop = sig;
    }
    return lc_submit(g, &a, req);
}

/* One send or receive of composite op op (compose.c, rsag.c), its request kept in op; a
 * failure is the op's result and posts nothing more. */
void lc_cop_post(struct lc_cop *op, coll_group *root, unsigned kind, const void *send, void *recv,
                 uint64_t count, int dtype, int peer, uint32_t tag)
{
    if (op->st != COLL_OK) return;
    unsigned flags = op->more_left > 1 ? WIRE_SQE_F_MORE : 0;
    if (op->more_left > 0) op->more_left--;
    if (kind == WIRE_OP_SEND) flags |= op->send_flags;
    coll_err rc = lc_p2p(root, kind, send, recv, count, dtype, peer, tag, op->stream, flags,
                         op->sig, &op->sub[op->nsub]);
    if (rc == COLL_OK) {
        op->nsub++;
    } else {
        op->st = rc;
        snprintf(op->why, sizeof(op->why), "%s", coll_last_error());
    }
}

void lc_cop_sub_done(struct lc_cop *op, int i, coll_err st)
{
    op->subdone[i] = 1;
    if (st != COLL_OK && op->st == COLL_OK) {
        op->st = st;
        snprintf(op->why, sizeof(op->why), "%s", coll_last_error());
    }
}

int lc_cop_try_subs(coll_conn *c, struct lc_cop *op)
{
    int all = 1;
    for (int i = 0; i < op->nsub; i++) {
        if (op->subdone[i]) continue;
        coll_err st = COLL_OK;
        if (lc_try_one(c, op->sub[i], &st, NULL) > 0)
            lc_cop_sub_done(op, i, st);
        else
            all = 0;
    }
    return all;
}
