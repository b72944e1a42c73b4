/*
 * ops.c: the coll_* op calls of coll.h: each builds its arguments, checks them once
 * (submit.c: lc_op_check) and submits the op: to the ring (submit.c) or, on a child
 * across pods, as its root's sends and receives (span.c). Above both.
 */
#include "lc.h"

static coll_err submit_op(coll_group *g, const struct op_args *a, coll_request *req)
{
    if (!g || !req) return lc_fail(COLL_ERR_INVALID, "NULL group or request");
    req->id = 0;
    coll_err rc = lc_op_check(g, a);
    if (rc != COLL_OK) return rc;
    if (g->span) /* a child across pods: its ops are sends and receives of its root */
        return lc_span_submit(g, a->kind, a->dtype, a->redop, a->peer, a->count,
                              a->send_used ? a->send : NULL, a->recv_used ? a->recv : NULL, a->tag,
                              req);
    return lc_submit(g, a, req);
}

static int rank_of(const coll_group *g)
{
    return g ? g->info.rank : -1;
}

coll_err coll_allreduce(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                        coll_redop op, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_ALLREDUCE, dt, op, 0, count, send, recv, 1, 1};
    a.stream = stream;
    return submit_op(g, &a, req);
}

coll_err coll_broadcast(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                        int root, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_BROADCAST, dt, 0, root, count, send, recv, rank_of(g) == root, 1};
    a.stream = stream;
    return submit_op(g, &a, req);
}

coll_err coll_reduce(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                     coll_redop op, int root, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_REDUCE, dt, op, root, count, send, recv, 1, rank_of(g) == root};
    a.stream = stream;
    return submit_op(g, &a, req);
}

coll_err coll_allgather(coll_group *g, const void *send, void *recv, size_t sendcount,
                        coll_dtype dt, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_ALLGATHER, dt, 0, 0, sendcount, send, recv, 1, 1};
    a.stream = stream;
    return submit_op(g, &a, req);
}

coll_err coll_reduce_scatter(coll_group *g, const void *send, void *recv, size_t recvcount,
                             coll_dtype dt, coll_redop op, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_REDUCE_SCATTER, dt, op, 0, recvcount, send, recv, 1, 1};
    a.stream = stream;
    return submit_op(g, &a, req);
}

coll_err coll_alltoall(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                       void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_ALLTOALL, dt, 0, 0, count, send, recv, 1, 1};
    a.stream = stream;
    return submit_op(g, &a, req);
}

coll_err coll_send(coll_group *g, const void *send, size_t count, coll_dtype dt, int peer,
                   void *stream, coll_request *req)
{
    return coll_send_tag(g, send, count, dt, peer, 0, stream, req);
}

coll_err coll_recv(coll_group *g, void *recv, size_t count, coll_dtype dt, int peer, void *stream,
                   coll_request *req)
{
    return coll_recv_tag(g, recv, count, dt, peer, 0, stream, req);
}

/* a tag the op may carry: 0..COLL_TAG_MAX, and on a GPU group 0 only */
static coll_err tag_ok(const coll_group *g, int tag)
{
    if (!g) return COLL_OK; /* submit says so */
    if (tag < 0 || tag > COLL_TAG_MAX)
        return lc_fail(COLL_ERR_INVALID, "tag %d: 0 to %d (the tags above are coll's own)", tag,
                       COLL_TAG_MAX);
    if (tag && g->gpu)
        return lc_fail(COLL_ERR_UNSUPPORTED,
                       "tag %d: NCCL pairs a GPU group's sends and receives in order only (tag 0)",
                       tag);
    return COLL_OK;
}

coll_err coll_send_tag(coll_group *g, const void *send, size_t count, coll_dtype dt, int peer,
                       int tag, void *stream, coll_request *req)
{
    coll_err e = tag_ok(g, tag);
    if (e != COLL_OK) return e;
    struct op_args a = {WIRE_OP_SEND, dt, 0, peer, count, send, NULL, 1, 0};
    a.stream = stream;
    a.tag = tag;
    return submit_op(g, &a, req);
}

coll_err coll_recv_tag(coll_group *g, void *recv, size_t count, coll_dtype dt, int peer, int tag,
                       void *stream, coll_request *req)
{
    coll_err e = tag_ok(g, tag);
    if (e != COLL_OK) return e;
    struct op_args a = {WIRE_OP_RECV, dt, 0, peer, count, NULL, recv, 0, 1};
    a.stream = stream;
    a.tag = tag;
    return submit_op(g, &a, req);
}

coll_err coll_recv_any(coll_group *g, void *recv, size_t count, coll_dtype dt, int tag, int *source,
                       void *stream, coll_request *req)
{
    coll_err e = tag_ok(g, tag);
    if (e != COLL_OK) return e;
    struct op_args a = {WIRE_OP_RECV, dt, 0, COLL_ANY_SOURCE, count, NULL, recv, 0, 1};
    a.stream = stream;
    a.tag = tag;
    a.source = source;
    return submit_op(g, &a, req);
}

coll_err coll_barrier(coll_group *g, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_BARRIER, 0, 0, 0, 0, NULL, NULL, 0, 0};
    a.stream = stream;
    return submit_op(g, &a, req);
}
