/*
 * nccl_graph.c: launching an op on a communicator, eagerly or replayed from a captured
 * CUDA graph, and waiting out NCCL's in-progress state.
 */
#include "nccl_priv.h"

static const ncclDataType_t nccl_dtype[COLL_DTYPE_COUNT] = {
    [COLL_INT8] = ncclInt8,
    [COLL_UINT8] = ncclUint8,
    [COLL_INT32] = ncclInt32,
    [COLL_UINT32] = ncclUint32,
    [COLL_INT64] = ncclInt64,
    [COLL_UINT64] = ncclUint64,
    [COLL_FLOAT16] = ncclFloat16,
    [COLL_BFLOAT16] = ncclBfloat16,
    [COLL_FLOAT32] = ncclFloat32,
    [COLL_FLOAT64] = ncclFloat64,
    [COLL_BOOL] = ncclUint8,
#if NCCL_VERSION_CODE >= 22400
    [COLL_FLOAT8_E4M3] = ncclFloat8e4m3,
    [COLL_FLOAT8_E5M2] = ncclFloat8e5m2,
#endif
    /* complex: pairs of their real type (nccl_launch); COLL_INT16, COLL_UINT16: none in
     * NCCL (wire_nccl_refuses) */
    [COLL_COMPLEX64] = ncclFloat32,
    [COLL_COMPLEX128] = ncclFloat64,
};

static const ncclRedOp_t nccl_redop[COLL_REDOP_COUNT] = {
    [COLL_SUM] = ncclSum, [COLL_PROD] = ncclProd, [COLL_MIN] = ncclMin,
    [COLL_MAX] = ncclMax, [COLL_AVG] = ncclAvg,
};

/*
 * NCCL's host-side launch of a small op costs more than the op (6 us for 8 bytes on an
 * H200; a captured graph of it launches in 3: bench/RESULTS.md). So an op seen twice
 * with the same arguments is captured once and replayed from then on. Lifetimes: a
 * multi-rank capture holds persistent NCCL plans, and NCCL's destroy and abort wait until
 * every graph referencing the communicator is gone, so the graphs are always destroyed
 * first (comm_abort, comm_destroy; work in flight finishes or is aborted, then the
 * graph is freed). Captures do not register user buffers (NCCL_GRAPH_REGISTER=0 unless
 * set otherwise), so a replay reads and writes addresses exactly as an eager launch
 * does, and the graphs are dropped whenever a buffer import goes away.
 * COLL_NCCL_GRAPHS=0 turns replay off; =1 limits it to one-rank communicators.
 */
int nccl_graphs_on = 2; /* 0 off, 1 one-rank communicators, 2 all */

void nccl_graph_flush(struct comm *c)
{
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec); /* freed when done */
        memset(&c->graphs[i], 0, sizeof(c->graphs[i]));
    }
}

/* Wait out a call NCCL left in progress (non-blocking communicator), up to wait_ns;
 * ncclInProgress if it is still not done. */
ncclResult_t nccl_settle(ncclComm_t comm, ncclResult_t r, int64_t wait_ns)
{
    int64_t end = now_ns() + wait_ns;
    while (r == ncclInProgress && now_ns() < end) {
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
    }
    return r;
}

ncclResult_t nccl_launch(struct comm *c, const struct gpu_task *t)
{
    ncclDataType_t dt = nccl_dtype[t->dtype];
    /* one rank: the average is the value itself; the plain copy path is exact and
     * skips NCCL's scaling kernel */
    int premul = t->redop == WIRE_REDOP_PREMUL; /* reductions only (the agent's intake) */
    ncclRedOp_t op = premul                                   ? ncclSum
                     : c->nranks == 1 && t->redop == COLL_AVG ? ncclSum
                     : t->redop < COLL_REDOP_COUNT            ? nccl_redop[t->redop]
                                                              : ncclSum;
    if (t->dtype == COLL_BOOL) /* 0 or 1 bytes: or is the max, and the min */
        op = t->redop == COLL_SUM || t->redop == COLL_MAX ? ncclMax : ncclMin;
    size_t n = (size_t)t->count;
    if (t->dtype == COLL_COMPLEX64 || t->dtype == COLL_COMPLEX128)
        n *= 2; /* sum and average lane by lane (the product is refused) */
#if NCCL_VERSION_CODE < 22400
    if (t->dtype == COLL_FLOAT8_E4M3 || t->dtype == COLL_FLOAT8_E5M2) return ncclInvalidArgument;
#endif
    ncclResult_t r = ncclSuccess;
    /* a premultiplied sum: NCCL's own, this rank's scalar taken at the launch (host
     * immediate; the dtype's bits are the low bytes), given back once it is enqueued */
    uint64_t scalar = t->premul;
    if (premul && (r = ncclRedOpCreatePreMulSum(&op, &scalar, dt, ncclScalarHostImmediate, c->c)) !=
                      ncclSuccess)
        return r;
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        r = ncclAllReduce(t->send, t->recv, n, dt, op, c->c, c->stream);
        break;
    case WIRE_OP_BROADCAST:
        r = ncclBroadcast(t->send, t->recv, n, dt, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_REDUCE:
        r = ncclReduce(t->send, t->recv, n, dt, op, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_ALLGATHER:
        r = ncclAllGather(t->send, t->recv, n, dt, c->c, c->stream);
        break;
    case WIRE_OP_REDUCE_SCATTER:
        r = ncclReduceScatter(t->send, t->recv, n, dt, op, c->c, c->stream);
        break;
    case WIRE_OP_ALLTOALL: {
        size_t bytes = (size_t)t->count * coll_dtype_size((coll_dtype)t->dtype);
        const void *src = t->send;
        if (t->send == t->recv && c->nranks > 1) {
            /* in place: blocks would be overwritten before they are sent; send from a
             * copy (the communicator's scratch, grown on demand) */
            size_t total = bytes * (size_t)c->nranks;
            if (c->tmp_size < total) {
                if (c->tmp) cudaFree(c->tmp);
                c->tmp = NULL;
                c->tmp_size = 0;
                if (cudaMalloc(&c->tmp, total) != cudaSuccess) {
                    cudaGetLastError();
                    return ncclSystemError;
                }
                c->tmp_size = total;
            }
            if (cudaMemcpyAsync(c->tmp, t->send, total, cudaMemcpyDeviceToDevice, c->stream) !=
                cudaSuccess)
                return ncclUnhandledCudaError;
            src = c->tmp;
        }
        r = ncclGroupStart();
        for (int p = 0; p < c->nranks && r == ncclSuccess; p++) {
            r = ncclSend((const char *)src + (size_t)p * bytes, n, dt, p, c->c, c->stream);
            if (r == ncclSuccess)
                r = ncclRecv((char *)t->recv + (size_t)p * bytes, n, dt, p, c->c, c->stream);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
        break;
    }
    case WIRE_OP_SEND:
        r = ncclSend(t->send, n, dt, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_RECV:
        r = ncclRecv(t->recv, n, dt, t->peer, c->c, c->stream);
        break;
    case WIRE_OP_BARRIER:
        r = ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->c, c->stream);
        break;
    default:
        r = ncclInvalidArgument;
        break;
    }
    if (premul) ncclRedOpDestroy(op, c->c);
    return r;
}

static int graph_key_eq(const struct cgraph *e, const struct gpu_task *t)
{
    return e->used && e->kind == t->kind && e->dtype == t->dtype && e->redop == t->redop &&
           e->peer == t->peer && e->count == t->count && e->send == t->send && e->recv == t->recv;
}

/* t's entry: found, or a free or least recently used one made over for t. */
static struct cgraph *graph_entry(struct comm *c, const struct gpu_task *t)
{
    struct cgraph *victim = &c->graphs[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        struct cgraph *e = &c->graphs[i];
        if (graph_key_eq(e, t)) return e;
        if (!e->used || (victim->used && e->last < victim->last)) victim = e;
    }
    if (victim->exec) cudaGraphExecDestroy(victim->exec);
    *victim = (struct cgraph){.used = 1,
                              .kind = t->kind,
                              .dtype = t->dtype,
                              .redop = t->redop,
                              .peer = t->peer,
                              .count = t->count,
                              .send = t->send,
                              .recv = t->recv};
    return victim;
}

static ncclResult_t graph_run(cudaGraphExec_t x, cudaStream_t st)
{
    if (cudaGraphLaunch(x, st) == cudaSuccess) return ncclSuccess;
    cudaGetLastError();
    return ncclUnhandledCudaError;
}

/* Launch t on c, from a graph when it repeats (see above). */
ncclResult_t nccl_graph_launch(struct launcher *l, struct comm *c, const struct gpu_task *t)
{
    /* a premultiplied sum's operator lives for one launch: never captured */
    int kind_ok = (t->kind == WIRE_OP_ALLREDUCE || t->kind == WIRE_OP_BROADCAST ||
                   t->kind == WIRE_OP_REDUCE || t->kind == WIRE_OP_ALLGATHER ||
                   t->kind == WIRE_OP_REDUCE_SCATTER) &&
                  t->redop != WIRE_REDOP_PREMUL;
    if (!nccl_graphs_on || (nccl_graphs_on == 1 && c->nranks != 1) || !kind_ok)
        return nccl_launch(c, t);
    unsigned bg = atomic_load(&nccl_buf_gen);
    if (bg != c->graph_bufgen) {
        nccl_graph_flush(c);
        c->graph_bufgen = bg;
    }
    struct cgraph *e = graph_entry(c, t);
    e->last = ++c->graph_tick;
    if (e->exec) {
        l->replayed++;
        return graph_run(e->exec, c->stream);
    }
    if (e->failed || ++e->seen < 2) return nccl_launch(c, t);
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        e->failed = 1;
        return nccl_launch(c, t);
    }
    ncclResult_t r = nccl_launch(c, t);
    cudaGraph_t gr = NULL;
    cudaError_t ce = cudaStreamEndCapture(c->stream, &gr);
    if (r == ncclSuccess && ce == cudaSuccess && gr &&
        cudaGraphInstantiate(&e->exec, gr, 0) == cudaSuccess) {
        cudaGraphDestroy(gr);
        l->graphs_made++;
        l->replayed++;
        return graph_run(e->exec, c->stream);
    }
    if (gr) cudaGraphDestroy(gr);
    cudaGetLastError();
    e->exec = NULL;
    e->failed = 1;
    /* captured but not run: run it now; a launch that failed fails the same way */
    return r == ncclSuccess ? nccl_launch(c, t) : r;
}
