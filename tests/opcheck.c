/*
 * opcheck.c: one application rank that runs every op x dtype x reduction through its
 * agent and checks each result element against a reference computed from every
 * rank's (deterministic) input. Shared by test_ops (one pod) and test_multi (several
 * pods): inputs and expectations depend only on the global rank and the group size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "opcheck.h"
#include "reduce.h"
#include "values.h"
#include "wire.h"

#ifdef COLL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static const size_t counts[] = {0, 1, 7, 4097, 20011};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))
#define MAXC 20011
#define GUARD 0xEE

/* Inputs are small integers, so every partial result is exact (a float8 holds the
 * integers to 8 (e5m2) or 16 (e4m3) exactly: 0 or 1 there, at most 8 ones in 16 ranks). */
static double val(int rank, size_t i, int redop, int dt)
{
    if (redop == COLL_PROD) return 1 + (double)((rank + i) % 2);
    if (dt == COLL_FLOAT8_E4M3 || dt == COLL_FLOAT8_E5M2) return (double)((rank + i) % 2);
    return (double)((rank * 3 + i * 5) % 4);
}

static double expect_red(int n, size_t i, int redop, int dt)
{
    double acc = val(0, i, redop, dt);
    if (dt == COLL_BOOL) acc = acc != 0;
    for (int k = 1; k < n; k++)
        acc = val_fold(dt, redop, acc, val(k, i, redop, dt));
    if (redop == COLL_AVG) acc = val_is_int(dt) ? (double)((long long)acc / n) : acc / n;
    return acc;
}

static int close_enough(double got, double want, int dt)
{
    double tol = 0;
    if (dt == COLL_FLOAT16) tol = 1e-3;
    if (dt == COLL_BFLOAT16) tol = 8e-3;
    if (dt == COLL_FLOAT32 || dt == COLL_COMPLEX64) tol = 1e-6;
    if (dt == COLL_FLOAT64 || dt == COLL_COMPLEX128) tol = 1e-12;
    if (dt == COLL_FLOAT8_E4M3) tol = 0.0625; /* an average, rounded once: half a unit */
    if (dt == COLL_FLOAT8_E5M2) tol = 0.125;
    double d = got - want;
    if (d < 0) d = -d;
    return d <= tol * (want < 0 ? -want : want) + (tol ? 1e-30 : 0);
}

struct ctx {
    coll_conn *c;
    coll_group *g;
    int rank, n;
    unsigned char *S, *R;
    int failures;
    /* GPU mode: device twins of S and R, the stream, and how results are awaited */
    int gpu;
    unsigned char *dS, *dR;
    void *stream;
    size_t bytes;
    int iter;
};

/* The address the op uses for host address p of S or R. */
static void *dev(const struct ctx *x, const void *p)
{
    if (!x->gpu || !p) return (void *)p;
    const unsigned char *c = p;
    if (c >= x->S && c < x->S + x->bytes) return x->dS + (c - x->S);
    return x->dR + (c - x->R);
}

#ifdef COLL_HAVE_CUDA
static int copy(struct ctx *x, int to_dev)
{
    cudaStream_t st = (cudaStream_t)x->stream;
    cudaError_t e;
    if (to_dev) {
        e = cudaMemcpyAsync(x->dS, x->S, x->bytes, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(x->dR, x->R, x->bytes, cudaMemcpyHostToDevice, st);
    } else {
        e = cudaMemcpyAsync(x->R, x->dR, x->bytes, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    }
    if (e != cudaSuccess)
        fprintf(stderr, "rank %d: CUDA copy: %s\n", x->rank, cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : -1;
}
#else
static int copy(struct ctx *x, int to_dev)
{
    (void)x, (void)to_dev;
    return -1;
}
#endif

static void report(struct ctx *x, const char *what, int kind_dt, int redop, size_t count,
                   int inplace, size_t i, double got, double want)
{
    if (x->failures++ < 5)
        fprintf(stderr,
                "rank %d: %s dtype=%s op=%s count=%zu inplace=%d: element %zu is %g, want %g\n",
                x->rank, what, coll_dtype_name(kind_dt), coll_redop_name(redop), count, inplace, i,
                got, want);
}

static int guard_ok(const unsigned char *p, size_t off)
{
    return p[off] == GUARD;
}

/* One op with one dtype, count, reduction and placement; checks the result. */
static int run_one(struct ctx *x, int kind, int dt, int redop, size_t count, int inplace, int root)
{
    size_t es = coll_dtype_size(dt);
    int n = x->n, rank = x->rank;
    memset(x->S, 0, (size_t)MAXC * (size_t)n * 16);
    memset(x->R, GUARD, (size_t)MAXC * (size_t)n * 16 + 64);
    unsigned char *send = x->S, *recv = x->R;
    size_t in_elems = count;
    if (kind == 4 || kind == 5) in_elems = count * (size_t)n; /* reduce_scatter, alltoall */
    /* where this rank's input goes */
    unsigned char *in = send;
    if (inplace) {
        in = recv;
        if (kind == 3) in = recv + (size_t)rank * count * es; /* allgather */
        send = in;
        if (kind == 4) recv = x->R + (size_t)rank * count * es; /* reduce_scatter */
    }
    for (size_t i = 0; i < in_elems; i++)
        val_put(in, i, dt, val(rank, i, redop, dt));
    coll_request req, req2;
    coll_err e;
    const void *sp = count ? dev(x, send) : NULL;
    void *rp = count ? dev(x, recv) : NULL;
    void *st = x->stream;
    /* GPU: half the ops are awaited by the stream alone (no host sync until the copy
     * back), the others on the host */
    int by_stream = x->gpu && (x->iter++ % 2 == 0);
    if (x->gpu && copy(x, 1) < 0) {
        x->failures++;
        return -1;
    }
    const char *names[] = {"allreduce",      "broadcast", "reduce",   "allgather",
                           "reduce_scatter", "alltoall",  "sendrecv", "barrier"};
    switch (kind) {
    case 0:
        e = coll_allreduce(x->g, sp, rp, count, dt, redop, st, &req);
        break;
    case 1:
        e = coll_broadcast(x->g, sp, rp, count, dt, root, st, &req);
        break;
    case 2:
        e = coll_reduce(x->g, sp, rp, count, dt, redop, root, st, &req);
        break;
    case 3:
        e = coll_allgather(x->g, sp, rp, count, dt, st, &req);
        break;
    case 4:
        e = coll_reduce_scatter(x->g, sp, rp, count, dt, redop, st, &req);
        break;
    case 5:
        e = coll_alltoall(x->g, sp, rp, count, dt, st, &req);
        break;
    case 6:
        e = coll_send(x->g, sp, count, dt, (rank + 1) % n, st, &req);
        if (e == COLL_OK) e = coll_recv(x->g, rp, count, dt, (rank + n - 1) % n, st, &req2);
        if (e == COLL_OK)
            e = by_stream ? coll_wait_stream(x->c, req2, st) : coll_wait(x->c, req2, 60000);
        break;
    default:
        e = coll_barrier(x->g, st, &req);
        break;
    }
    if (e == COLL_OK) e = by_stream ? coll_wait_stream(x->c, req, st) : coll_wait(x->c, req, 60000);
    if (e == COLL_OK && x->gpu && copy(x, 0) < 0) e = COLL_ERR_INTERNAL;
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: %s dtype=%s count=%zu: %s (%s)\n", rank, names[kind],
                coll_dtype_name(dt), count, coll_strerror(e), coll_last_error());
        x->failures++;
        return -1;
    }
    size_t out_elems = count;
    if (kind == 3 || kind == 5) out_elems = count * (size_t)n;
    if (kind == 7 || (kind == 2 && rank != root)) return 0;
    for (size_t i = 0; i < out_elems; i++) {
        double want;
        switch (kind) {
        case 0:
        case 2:
            want = expect_red(n, i, redop, dt);
            break;
        case 1:
            want = val(root, i, redop, dt);
            break;
        case 3:
            want = val((int)(i / count), i % count, redop, dt);
            break;
        case 4:
            want = expect_red(n, (size_t)rank * count + i, redop, dt);
            break;
        case 5:
            want = val((int)(i / count), (size_t)rank * count + i % count, redop, dt);
            break;
        default:
            want = val((rank + n - 1) % n, i, redop, dt);
            break;
        }
        if (dt == COLL_BOOL) want = want != 0; /* a bool holds its truth */
        if (val_is_complex(dt)) {              /* v x (1 - 2i), and a product of n: x (1 - 2i)^n */
            double cre, cim;
            val_cscale(redop == COLL_PROD && (kind == 0 || kind == 2 || kind == 4) ? n : -1, &cre,
                       &cim);
            double gim = val_get_im(recv, i, dt);
            if (!close_enough(gim, want * cim, dt)) {
                report(x, "imaginary part", dt, redop, count, inplace, i, gim, want * cim);
                return -1;
            }
            want *= cre;
        }
        double got = val_get(recv, i, dt);
        if (!close_enough(got, want, dt)) {
            report(x, names[kind], dt, redop, count, inplace, i, got, want);
            return -1;
        }
    }
    /* nothing written past the result (reduce_scatter in place writes inside its input) */
    if (!(inplace && kind == 4) && count && !guard_ok(recv, out_elems * es)) {
        report(x, "guard", dt, redop, count, inplace, out_elems, recv[out_elems * es], GUARD);
        return -1;
    }
    return 0;
}

/* alltoallv: rank r sends rank j this many elements (both sides compute it) */
static size_t vcount(size_t count, int r, int j)
{
    return count ? (count + (size_t)r + 2 * (size_t)j) % (count + 1) : 0;
}

/* gather (8), scatter (9), alltoallv (10): byte movers, composed of sends and receives;
 * alltoallv's blocks are of unequal sizes with a gap of one element between them */
static int run_v(struct ctx *x, int kind, int dt, size_t count, int inplace, int root)
{
    static const char *const vnames[] = {"gather", "scatter", "alltoallv"};
    const char *name = vnames[kind - 8];
    size_t es = coll_dtype_size(dt);
    int n = x->n, rank = x->rank;
    memset(x->S, 0, (size_t)MAXC * (size_t)n * 16);
    memset(x->R, GUARD, (size_t)MAXC * (size_t)n * 16 + 64);
    unsigned char *send = x->S, *recv = x->R;
    size_t sc[64], sd[64], rc[64], rd[64], out_elems = 0;
    coll_request req;
    coll_err e;
    if (kind == 10) {
        size_t so = 0, ro = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = vcount(count, rank, j), sd[j] = so, so += sc[j] + 1;
            rc[j] = vcount(count, j, rank), rd[j] = ro, ro += rc[j] + 1;
            for (size_t i = 0; i < sc[j]; i++)
                val_put(send, sd[j] + i, dt, val(rank, (size_t)j * 7 + i, COLL_SUM, dt));
        }
        out_elems = ro;
        e = coll_alltoallv(x->g, send, sc, sd, recv, rc, rd, dt, NULL, &req);
    } else {
        int ip = inplace && rank == root; /* in place: the root's own block */
        if (kind == 8) {
            unsigned char *in = ip ? recv + (size_t)rank * count * es : send;
            for (size_t i = 0; i < count; i++)
                val_put(in, i, dt, val(rank, i, COLL_SUM, dt));
            out_elems = rank == root ? count * (size_t)n : 0;
            e = coll_gather(x->g, count ? in : NULL, recv, count, dt, root, NULL, &req);
        } else {
            if (rank == root)
                for (size_t i = 0; i < count * (size_t)n; i++)
                    val_put(
                        send, i, dt,
                        val((int)(i / (count ? count : 1)), i % (count ? count : 1), COLL_SUM, dt));
            unsigned char *out = ip ? send + (size_t)rank * count * es : recv;
            if (ip) recv = out;
            out_elems = count;
            e = coll_scatter(x->g, send, count ? out : NULL, count, dt, root, NULL, &req);
        }
    }
    if (e == COLL_OK) e = coll_wait(x->c, req, 60000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: %s dtype=%s count=%zu: %s (%s)\n", rank, name,
                coll_dtype_name(dt), count, coll_strerror(e), coll_last_error());
        x->failures++;
        return -1;
    }
    for (int j = 0; kind == 10 && j < n; j++) {
        for (size_t i = 0; i < rc[j]; i++) {
            double want = val(j, (size_t)rank * 7 + i, COLL_SUM, dt),
                   got = val_get(recv, rd[j] + i, dt);
            if (!close_enough(got, want, dt)) {
                report(x, name, dt, 0, count, inplace, rd[j] + i, got, want);
                return -1;
            }
        }
        if (guard_ok(recv, (rd[j] + rc[j]) * es) == 0) { /* the gap is untouched */
            report(x, "alltoallv gap", dt, 0, count, inplace, rd[j] + rc[j], 0, GUARD);
            return -1;
        }
    }
    for (size_t i = 0; kind != 10 && i < out_elems; i++) {
        /* gather: block j is rank j's input; scatter: this rank's block of the root's */
        double want =
            kind == 8 ? val((int)(i / count), i % count, COLL_SUM, dt) : val(rank, i, COLL_SUM, dt);
        double got = val_get(recv, i, dt);
        if (!close_enough(got, want, dt)) {
            report(x, name, dt, 0, count, inplace, i, got, want);
            return -1;
        }
    }
    if (kind == 8 && out_elems && !guard_ok(recv, out_elems * es)) {
        report(x, "guard", dt, 0, count, inplace, out_elems, recv[out_elems * es], GUARD);
        return -1;
    }
    return 0;
}

int opcheck_rank_main(void *arg)
{
    struct opcheck_job *j = arg;
    struct ctx x = {0};
    coll_buffer *sb, *rb;
    if (coll_connect(&x.c, j->sock, 10000) != COLL_OK) {
        fprintf(stderr, "connect: %s\n", coll_last_error());
        return 100;
    }
    if (coll_group_open(&x.g, x.c, j->group ? j->group : "g",
                        j->explicit_slot ? j->slot : COLL_SLOT_ANY) != COLL_OK) {
        fprintf(stderr, "open: %s\n", coll_last_error());
        return 101;
    }
    coll_group_info info;
    coll_group_info_get(x.g, &info);
    if (j->explicit_slot && info.local_slot != j->slot) return 102;
    coll_group *parent = NULL;
    if (j->split_mod > 0) {
        parent = x.g;
        int color = (info.rank / (j->split_div > 0 ? j->split_div : 1)) % j->split_mod;
        if (coll_group_split(parent, color, -info.rank, &x.g) != COLL_OK) {
            fprintf(stderr, "rank %d: split: %s\n", info.rank, coll_last_error());
            return 107;
        }
        coll_group_info_get(x.g, &info);
    }
    x.rank = info.rank;
    x.n = info.size;
    size_t bytes = (size_t)MAXC * (size_t)x.n * 16 + 64;
    x.bytes = bytes;
    void *ipc_mem[2] = {NULL, NULL};
    if (!j->on_gpu) {
        if (coll_mem_alloc(&sb, x.c, bytes, COLL_DEVICE_HOST) ||
            coll_mem_alloc(&rb, x.c, bytes, COLL_DEVICE_HOST))
            return 103;
        x.S = coll_mem_ptr(sb);
        x.R = coll_mem_ptr(rb);
    } else {
#ifdef COLL_HAVE_CUDA
        x.gpu = 1;
        cudaStream_t st;
        if (cudaSetDevice(j->device) != cudaSuccess || cudaStreamCreate(&st) != cudaSuccess ||
            cudaMallocHost((void **)&x.S, bytes) != cudaSuccess ||
            cudaMallocHost((void **)&x.R, bytes) != cudaSuccess)
            return 104;
        x.stream = st;
        coll_err e1, e2;
        if (j->ipc) {
            if (cudaMalloc(&ipc_mem[0], bytes) != cudaSuccess ||
                cudaMalloc(&ipc_mem[1], bytes) != cudaSuccess)
                return 105;
            e1 = coll_mem_register_cuda(&sb, x.c, ipc_mem[0], bytes);
            e2 = e1 ? e1 : coll_mem_register_cuda(&rb, x.c, ipc_mem[1], bytes);
        } else {
            e1 = coll_mem_alloc(&sb, x.c, bytes, j->device);
            e2 = e1 ? e1 : coll_mem_alloc(&rb, x.c, bytes, j->device);
        }
        if (e1 || e2) {
            fprintf(stderr, "rank %d: GPU buffers: %s\n", x.rank, coll_last_error());
            return 106;
        }
        x.dS = coll_mem_ptr(sb);
        x.dR = coll_mem_ptr(rb);
#else
        return 104;
#endif
    }
    int iter = 0;
    for (int kind = 0; kind <= 7; kind++) {
        if (kind == 6 && x.gpu && x.n == 1) continue; /* NCCL: no send to oneself */
        int reducing = kind == 0 || kind == 2 || kind == 4;
        for (int dt = 0; dt < COLL_DTYPE_COUNT; dt++) {
            for (int redop = 0; redop < (reducing ? COLL_REDOP_COUNT : 1); redop++) {
                unsigned wk = kind == 6   ? WIRE_OP_SEND /* the wire's kinds */
                              : kind == 7 ? WIRE_OP_BARRIER
                                          : (unsigned)kind;
                if (!wire_redop_fits(wk, (unsigned)dt, (unsigned)redop) ||
                    (x.gpu && wire_nccl_refuses(wk, (unsigned)dt, (unsigned)redop, 0)))
                    continue; /* refused (test_ops: refused_reductions) */
                for (size_t ci = 0; ci < NCOUNTS; ci++) {
                    for (int inplace = 0; inplace < (kind == 6 || kind == 7 ? 1 : 2); inplace++) {
                        int root = iter++ % x.n;
                        run_one(&x, kind, dt, redop, counts[ci], inplace, root);
                        if (x.failures > 20) goto out;
                    }
                    if (kind == 7) break;
                }
            }
            if (kind == 7) break;
        }
    }
    /* gather, scatter, alltoallv: host groups; one dtype of each size */
    static const int vdts[] = {COLL_INT8, COLL_FLOAT16, COLL_FLOAT32, COLL_COMPLEX128};
    for (int kind = 8; kind <= 10 && !x.gpu && x.n <= 64; kind++)
        for (size_t d = 0; d < sizeof(vdts) / sizeof(vdts[0]); d++)
            for (size_t ci = 0; ci < NCOUNTS; ci++)
                for (int inplace = 0; inplace < (kind == 10 ? 1 : 2); inplace++) {
                    run_v(&x, kind, vdts[d], counts[ci], inplace, iter++ % x.n);
                    if (x.failures > 20) goto out;
                }
out:
    if (!x.gpu && x.failures == 0) {
        /* every rank done before any leaves (leaving ends the epoch): a rank's gather,
         * scatter or alltoallv is done when its own sends and receives are, while others
         * may still be exchanging among themselves */
        coll_request r;
        if (coll_barrier(x.g, NULL, &r) != COLL_OK || coll_wait(x.c, r, 60000) != COLL_OK) {
            fprintf(stderr, "rank %d: the last barrier: %s\n", x.rank, coll_last_error());
            x.failures++;
        }
    }
    if (coll_mem_release(&sb) || coll_mem_release(&rb)) x.failures++;
#ifdef COLL_HAVE_CUDA
    if (x.gpu) {
        cudaFree(ipc_mem[0]);
        cudaFree(ipc_mem[1]);
        cudaFreeHost(x.S);
        cudaFreeHost(x.R);
        cudaStreamDestroy((cudaStream_t)x.stream);
    }
#else
    (void)ipc_mem;
#endif
    coll_group_close(&x.g);
    if (parent) { /* every rank done with its child before any leaves the parent */
        coll_request r;
        if (coll_barrier(parent, NULL, &r) != COLL_OK || coll_wait(x.c, r, 60000) != COLL_OK)
            x.failures++;
        coll_group_close(&parent);
    }
    coll_disconnect(&x.c);
    return x.failures > 99 ? 99 : x.failures;
}

/* ---- premultiplied sums ------------------------------------------------------------------ */

/* Element i of rank r's input, and rank r's scalar, as numbers (exact in every dtype
 * below: small integers, and floats that are multiples of a quarter). */
static double pm_x(int r, size_t i)
{
    return (double)(i % 61) + r;
}

static double pm_scalar(coll_dtype dt, int r)
{
    switch (dt) {
    case COLL_INT32:
        return r + 2;
    case COLL_UINT8:
        return 200 + r; /* products past 255: modulo 2^8 */
    case COLL_FLOAT32:
        return 0.5 * (r + 1);
    default:
        return 0.25 * (r + 3);
    }
}

static void pm_put(coll_dtype dt, void *p, size_t i, double v)
{
    switch (dt) {
    case COLL_INT32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    case COLL_UINT8:
        ((uint8_t *)p)[i] = (uint8_t)(long)v;
        break;
    case COLL_FLOAT32:
        ((float *)p)[i] = (float)v;
        break;
    default:
        ((double *)p)[i] = v;
        break;
    }
}

static double pm_get(coll_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case COLL_INT32:
        return ((const int32_t *)p)[i];
    case COLL_UINT8:
        return ((const uint8_t *)p)[i];
    case COLL_FLOAT32:
        return ((const float *)p)[i];
    default:
        return ((const double *)p)[i];
    }
}

/* What element i of the result holds: the sum over ranks of x * scalar (uint8: modulo
 * 2^8, as its products and sums are). */
static double pm_want(coll_dtype dt, int n, size_t i)
{
    double v = 0;
    for (int r = 0; r < n; r++)
        v += pm_x(r, i) * pm_scalar(dt, r);
    return dt == COLL_UINT8 ? (double)(uint8_t)(long)v : v;
}

static int pm_fail(int rank, const char *what, coll_err e)
{
    fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, coll_strerror(e), coll_last_error());
    return 150;
}

/* Every rank multiplies by a scalar of its own: allreduce, reduce and reduce_scatter of
 * four dtypes, tiny (direct where the rank may) and large, each element checked exactly;
 * the same pair again is the same op, a destroyed op's pair comes back, and an op of
 * another dtype is refused before anything is sent. */
int opcheck_premul(coll_conn *c, coll_group *g, void *inbuf, void *outbuf, size_t big)
{
    coll_group_info info;
    coll_group_info_get(g, &info);
    const int n = info.size, me = info.rank;
    char *in = inbuf, *out = outbuf;
    const coll_dtype dts[] = {COLL_INT32, COLL_UINT8, COLL_FLOAT32, COLL_FLOAT64};
    const size_t pm_counts[] = {24, big};
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        coll_dtype dt = dts[d];
        uint64_t sbits = 0;
        pm_put(dt, &sbits, 0, pm_scalar(dt, me));
        coll_redop op, again;
        coll_err e = coll_redop_create_premul_sum(g, &sbits, dt, &op);
        if (e) return pm_fail(me, "create", e);
        if (coll_redop_create_premul_sum(g, &sbits, dt, &again) || again != op) return 160;
        if (strcmp(coll_redop_name(op), "premul_sum") != 0) return 161;
        for (size_t k = 0; k < sizeof(pm_counts) / sizeof(pm_counts[0]); k++) {
            size_t cnt = pm_counts[k];
            for (int kind = 0; kind < 3; kind++) {
                size_t inn = kind == 2 ? cnt * (size_t)n : cnt;
                for (size_t i = 0; i < inn; i++)
                    pm_put(dt, in, i, pm_x(me, i));
                memset(out, 0xa5, cnt * coll_dtype_size(dt));
                coll_request r;
                int root = n - 1;
                e = kind == 0   ? coll_allreduce(g, in, out, cnt, dt, op, NULL, &r)
                    : kind == 1 ? coll_reduce(g, in, out, cnt, dt, op, root, NULL, &r)
                                : coll_reduce_scatter(g, in, out, cnt, dt, op, NULL, &r);
                if (e == COLL_OK) e = coll_wait(c, r, 20000);
                if (e) return pm_fail(me, kind == 0 ? "allreduce" : kind == 1 ? "reduce" : "rs", e);
                if (kind == 1 && me != root) continue;
                size_t base = kind == 2 ? (size_t)me * cnt : 0;
                for (size_t i = 0; i < cnt; i++)
                    if (pm_get(dt, out, i) != pm_want(dt, n, base + i)) {
                        fprintf(stderr, "rank %d %s kind %d count %zu: [%zu] = %g, want %g\n", me,
                                coll_dtype_name(dt), kind, cnt, i, pm_get(dt, out, i),
                                pm_want(dt, n, base + i));
                        return 170 + kind;
                    }
            }
        }
        if (coll_redop_destroy(g, op) || coll_redop_destroy(g, again)) return 162;
        if (coll_redop_destroy(g, op) != COLL_ERR_INVALID) return 163;
        if (coll_redop_create_premul_sum(g, &sbits, dt, &again) || again != op) return 164;
        /* made for this dtype: an op of another is refused, nothing sent */
        coll_request r;
        e = coll_allreduce(g, in, out, 4, dt == COLL_INT32 ? COLL_FLOAT32 : COLL_INT32, op, NULL,
                           &r);
        if (e != COLL_ERR_INVALID || !strstr(coll_last_error(), "was made for")) return 165;
    }
    return 0;
}
