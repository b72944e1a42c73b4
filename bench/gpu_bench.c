/*
 * gpu_bench.c: GPU collectives through the agent, side by side with direct in-process
 * NCCL on the same GPUs, same sizes, same communicator size, in one run.
 *
 *   coll-gpu-bench -s SOCKET[,SOCKET...] [-p PROCS] [-o OP] [-b MIN] [-e MAX] [-f FACTOR]
 *                  [-n ITERS] [-l LAT_ITERS] [-g GROUP] [-V VERIFY_ITERS]
 *
 * Forks PROCS processes (default 1); process i drives GPU i (CUDA_VISIBLE_DEVICES
 * order) and attaches to socket i % count. For each size, rounds alternate between
 * the two paths:
 *   latency:    one op, then cudaStreamSynchronize (host clock), median of LAT_ITERS;
 *   throughput: ITERS ops back to back on the stream, one synchronize, time per op.
 * Through the agent each op is coll_<op>(..., stream) + coll_wait_stream: the app's
 * stream is what waits, as an application would use it. Rank 0 prints one line per
 * size: latencies (direct, agent, added), time per op and busbw (direct, agent,
 * ratio), and wrong elements from a checked run. -V repeats a checked run (fill, op,
 * read back, all on the stream, no host wait in between) that many times per size.
 * The first op through the agent (communicator creation) and direct
 * ncclCommInitRank are timed once.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "coll/coll.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_COUNT };
static const char *const op_names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast"};

struct opts {
    size_t minb, maxb;
    double factor;
    int op, iters, lat_iters, procs, verify;
    const char *group, *socks;
    ncclUniqueId id;
};

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)
#define NK(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, ncclGetErrorString(r_));            \
            exit(4);                                                                               \
        }                                                                                          \
    } while (0)
#define AK(call)                                                                                   \
    do {                                                                                           \
        coll_err a_ = (call);                                                                      \
        if (a_ != COLL_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, coll_strerror(a_),             \
                    coll_last_error());                                                            \
            exit(5);                                                                               \
        }                                                                                          \
    } while (0)

struct rank_ctx {
    const struct opts *o;
    int rank, n;
    cudaStream_t st;
    ncclComm_t comm;
    coll_conn *c;
    coll_group *g;
    void *as, *ar; /* agent buffers (cuMem through libcoll) */
    void *ds, *dr; /* direct buffers (cudaMalloc) */
    coll_request pending[256];
    int npending;
};

/* elements each rank sends and receives for a message of `bytes` (nccl-tests sizes:
 * bytes is the largest buffer of the op) */
static void shape(int op, size_t bytes, int n, size_t *count, size_t *sbytes, size_t *rbytes)
{
    size_t elems = bytes / 4;
    switch (op) {
    case OP_ALLGATHER:
        *count = elems / (size_t)n;
        *sbytes = *count * 4;
        *rbytes = *count * 4 * (size_t)n;
        break;
    case OP_REDUCE_SCATTER:
        *count = elems / (size_t)n;
        *sbytes = *count * 4 * (size_t)n;
        *rbytes = *count * 4;
        break;
    default:
        *count = elems;
        *sbytes = *rbytes = elems * 4;
        break;
    }
}

static double busbw_factor(int op, int n)
{
    if (op == OP_ALLREDUCE) return 2.0 * (n - 1) / n;
    if (op == OP_BROADCAST) return 1.0;
    return (double)(n - 1) / n;
}

static void direct_op(struct rank_ctx *x, size_t count)
{
    switch (x->o->op) {
    case OP_ALLREDUCE:
        NK(ncclAllReduce(x->ds, x->dr, count, ncclFloat32, ncclSum, x->comm, x->st));
        break;
    case OP_ALLGATHER:
        NK(ncclAllGather(x->ds, x->dr, count, ncclFloat32, x->comm, x->st));
        break;
    case OP_REDUCE_SCATTER:
        NK(ncclReduceScatter(x->ds, x->dr, count, ncclFloat32, ncclSum, x->comm, x->st));
        break;
    default:
        NK(ncclBroadcast(x->ds, x->dr, count, ncclFloat32, 0, x->comm, x->st));
        break;
    }
}

static coll_request agent_submit(struct rank_ctx *x, size_t count)
{
    coll_request r;
    switch (x->o->op) {
    case OP_ALLREDUCE:
        AK(coll_allreduce(x->g, x->as, x->ar, count, COLL_FLOAT32, COLL_SUM, x->st, &r));
        break;
    case OP_ALLGATHER:
        AK(coll_allgather(x->g, x->as, x->ar, count, COLL_FLOAT32, x->st, &r));
        break;
    case OP_REDUCE_SCATTER:
        AK(coll_reduce_scatter(x->g, x->as, x->ar, count, COLL_FLOAT32, COLL_SUM, x->st, &r));
        break;
    default:
        AK(coll_broadcast(x->g, x->as, x->ar, count, COLL_FLOAT32, 0, x->st, &r));
        break;
    }
    return r;
}

static void agent_op(struct rank_ctx *x, size_t count)
{
    AK(coll_wait_stream(x->c, agent_submit(x, count), x->st));
}

static int cmp_double(const void *a, const void *b)
{
    double p = *(const double *)a, q = *(const double *)b;
    return p < q ? -1 : p > q;
}

/* Median single-op latency (host clock, op + synchronize). */
static double latency(struct rank_ctx *x, int agent, size_t count, int iters, double *samples)
{
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        if (agent)
            agent_op(x, count);
        else
            direct_op(x, count);
        CK(cudaStreamSynchronize(x->st));
        samples[i] = now_us() - t0;
    }
    qsort(samples, (size_t)iters, sizeof(double), cmp_double);
    return samples[iters / 2];
}

/* Time per op of iters ops back to back (agent 2: the stream waits only for the
 * last op, as when consecutive ops do not depend on each other). */
static double throughput(struct rank_ctx *x, int agent, size_t count, int iters)
{
    CK(cudaStreamSynchronize(x->st));
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        if (agent == 2 && i + 1 < iters)
            x->pending[x->npending++] = agent_submit(x, count);
        else if (agent)
            agent_op(x, count);
        else
            direct_op(x, count);
    }
    CK(cudaStreamSynchronize(x->st));
    double t = (now_us() - t0) / iters;
    AK(coll_wait_all(x->c, x->pending, (size_t)x->npending, 10000));
    x->npending = 0;
    return t;
}

/* A checked op through the agent: fill, op, read back, all on the stream. Returns
 * the number of wrong elements. Input of rank r: r + 1 + (i % 5). */
static long verify(struct rank_ctx *x, size_t count, size_t sbytes, size_t rbytes, float *hs,
                   float *hr)
{
    size_t se = sbytes / 4, re = rbytes / 4;
    for (size_t i = 0; i < se; i++)
        hs[i] = (float)(x->rank + 1 + (int)(i % 5));
    for (size_t i = 0; i < re; i++)
        hr[i] = -7.0f;
    CK(cudaMemcpyAsync(x->as, hs, sbytes, cudaMemcpyHostToDevice, x->st));
    CK(cudaMemcpyAsync(x->ar, hr, rbytes, cudaMemcpyHostToDevice, x->st));
    agent_op(x, count);
    CK(cudaMemcpyAsync(hr, x->ar, rbytes, cudaMemcpyDeviceToHost, x->st));
    CK(cudaStreamSynchronize(x->st));
    long wrong = 0;
    int n = x->n;
    for (size_t i = 0; i < re; i++) {
        double want;
        switch (x->o->op) {
        case OP_ALLREDUCE:
            want = (double)n * (n + 1) / 2 + (double)n * (double)(i % 5);
            break;
        case OP_ALLGATHER:
            want = (double)(i / count) + 1 + (double)((i % count) % 5);
            break;
        case OP_REDUCE_SCATTER: {
            size_t gi = (size_t)x->rank * count + i;
            want = (double)n * (n + 1) / 2 + (double)n * (double)(gi % 5);
            break;
        }
        default:
            want = 1 + (double)(i % 5);
            break;
        }
        if (hr[i] != (float)want) wrong++;
    }
    return wrong;
}

static int run_rank(const struct opts *o, int rank)
{
    struct rank_ctx x = {.o = o, .rank = rank, .n = o->procs};
    CK(cudaSetDevice(rank));
    CK(cudaStreamCreateWithFlags(&x.st, cudaStreamNonBlocking));
    /* sockets: the rank-th of the list, cyclically */
    char socks[1024], *save = NULL, *sock = NULL;
    snprintf(socks, sizeof(socks), "%s", o->socks);
    int nsock = 0;
    for (char *t = strtok_r(socks, ",", &save); t; t = strtok_r(NULL, ",", &save))
        nsock++;
    snprintf(socks, sizeof(socks), "%s", o->socks);
    save = NULL;
    int want = rank % nsock;
    int k = 0;
    for (char *t = strtok_r(socks, ",", &save); t; t = strtok_r(NULL, ",", &save), k++)
        if (k == want) sock = t;
    AK(coll_connect(&x.c, sock, 10000));
    /* rank i: the (i / sockets)-th slot of its agent, on GPU i */
    AK(coll_group_open(&x.g, x.c, o->group, rank / nsock));
    coll_group_info info;
    coll_group_info_get(x.g, &info);
    if (info.size != o->procs || strcmp(info.backend, "nccl") != 0) {
        fprintf(stderr, "group %s: size %d backend %s; this run has %d procs and wants nccl\n",
                o->group, info.size, info.backend, o->procs);
        return 6;
    }
    x.rank = info.rank;
    size_t maxb = o->maxb;
    /* room for the first ops below (2 elements per rank) whatever the sizes asked */
    size_t cap = maxb < 4096 ? 4096 : maxb;
    coll_buffer *bs, *br;
    AK(coll_mem_alloc(&bs, x.c, cap, rank));
    AK(coll_mem_alloc(&br, x.c, cap, rank));
    x.as = coll_mem_ptr(bs);
    x.ar = coll_mem_ptr(br);
    CK(cudaMalloc(&x.ds, cap));
    CK(cudaMalloc(&x.dr, cap));
    CK(cudaMemset(x.ds, 0, cap));
    CK(cudaMemset(x.as, 0, cap));
    float *hs, *hr;
    CK(cudaMallocHost((void **)&hs, cap));
    CK(cudaMallocHost((void **)&hr, cap));

    /* first ops: communicator creation, both ways */
    double t0 = now_us();
    NK(ncclCommInitRank(&x.comm, o->procs, o->id, x.rank));
    double direct_init = now_us() - t0;
    t0 = now_us();
    agent_op(&x, 2);
    CK(cudaStreamSynchronize(x.st));
    double agent_first = now_us() - t0;
    t0 = now_us();
    agent_op(&x, 2);
    CK(cudaStreamSynchronize(x.st));
    double agent_second = now_us() - t0;
    if (x.rank == 0) {
        printf(
            "# %s, %d rank(s), one GPU each; direct ncclCommInitRank %.1f ms; through the agent: "
            "first op %.1f ms (communicator creation), second op %.1f us\n",
            op_names[o->op], o->procs, direct_init / 1e3, agent_first / 1e3, agent_second);
        printf("# %12s %10s | %9s %9s %8s | %10s %10s %8s %8s %7s | %10s %7s | %6s\n", "bytes",
               "count", "lat_dir", "lat_agt", "added", "t_dir_us", "t_agt_us", "bw_dir", "bw_agt",
               "ratio", "t_nowait", "ratio", "wrong");
        fflush(stdout);
    }
    double *samples = malloc(sizeof(double) * (size_t)(o->lat_iters > 0 ? o->lat_iters : 1));
    for (size_t bytes = o->minb; bytes <= maxb;
         bytes = bytes < maxb && (size_t)((double)bytes * o->factor) > maxb
                     ? maxb
                     : (size_t)((double)bytes * o->factor)) {
        size_t count, sbytes, rbytes;
        shape(o->op, bytes, o->procs, &count, &sbytes, &rbytes);
        if (count == 0) continue;
        int iters = bytes >= (64u << 20) ? 20 : bytes >= (1u << 20) ? 50 : o->iters;
        int lat_iters = bytes >= (64u << 20) ? 10 : o->lat_iters;
        /* warm up both, then alternate: latency, throughput; best of two rounds each */
        throughput(&x, 0, count, 5);
        throughput(&x, 1, count, 5);
        double ld = 1e30, la = 1e30, td = 1e30, ta = 1e30, tn = 1e30;
        if (iters > 200) iters = 200;
        for (int round = 0; round < 2; round++) {
            double v = latency(&x, 0, count, lat_iters, samples);
            ld = v < ld ? v : ld;
            v = latency(&x, 1, count, lat_iters, samples);
            la = v < la ? v : la;
            v = throughput(&x, 0, count, iters);
            td = v < td ? v : td;
            v = throughput(&x, 1, count, iters);
            ta = v < ta ? v : ta;
            v = throughput(&x, 2, count, iters);
            tn = v < tn ? v : tn;
        }
        long wrong = 0;
        int vruns = o->verify > 0 ? o->verify : 1;
        for (int v = 0; v < vruns; v++)
            wrong += verify(&x, count, sbytes, rbytes, hs, hr);
        double f = busbw_factor(o->op, o->procs);
        double bwd = (double)bytes / td / 1e3 * f, bwa = (double)bytes / ta / 1e3 * f;
        if (o->procs == 1) bwd = (double)bytes / td / 1e3, bwa = (double)bytes / ta / 1e3;
        if (x.rank == 0) {
            printf("  %12zu %10zu | %9.2f %9.2f %8.2f | %10.2f %10.2f %8.2f %8.2f %7.3f | %10.2f "
                   "%7.3f | %6ld\n",
                   bytes, count, ld, la, la - ld, td, ta, bwd, bwa, td / ta, tn, td / tn, wrong);
            fflush(stdout);
        }
        if (bytes == maxb) break;
    }
    free(samples);
    ncclCommDestroy(x.comm);
    AK(coll_mem_release(&bs));
    AK(coll_mem_release(&br));
    coll_group_close(&x.g);
    coll_disconnect(&x.c);
    return 0;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    struct opts o = {.minb = 8,
                     .maxb = 256u << 20,
                     .factor = 4,
                     .op = OP_ALLREDUCE,
                     .iters = 200,
                     .lat_iters = 200,
                     .procs = 1,
                     .group = "gpu",
                     .socks = NULL};
    int c;
    while ((c = getopt(argc, argv, "s:p:o:b:e:f:n:l:g:V:h")) != -1) {
        switch (c) {
        case 's':
            o.socks = optarg;
            break;
        case 'p':
            o.procs = atoi(optarg);
            break;
        case 'o':
            for (o.op = 0; o.op < OP_COUNT && strcmp(op_names[o.op], optarg); o.op++)
                ;
            if (o.op == OP_COUNT) {
                fprintf(stderr, "unknown op %s\n", optarg);
                return 2;
            }
            break;
        case 'b':
            o.minb = parse_size(optarg);
            break;
        case 'e':
            o.maxb = parse_size(optarg);
            break;
        case 'f':
            o.factor = atof(optarg);
            break;
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'l':
            o.lat_iters = atoi(optarg);
            break;
        case 'g':
            o.group = optarg;
            break;
        case 'V':
            o.verify = atoi(optarg);
            break;
        default:
            fprintf(stderr,
                    "usage: %s -s SOCKET[,SOCKET...] [-p PROCS] [-o OP] [-b MIN] [-e MAX] "
                    "[-f FACTOR] [-n ITERS] [-l LAT_ITERS] [-g GROUP] [-V VERIFY]\n",
                    argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (!o.socks || o.procs < 1 || o.factor <= 1 || o.minb < 4 || o.maxb < o.minb) {
        fprintf(stderr, "%s: -s is required; sizes and factor must make sense\n", argv[0]);
        return 2;
    }
    /* the direct communicator's id, made before any CUDA work, shared by fork */
    NK(ncclGetUniqueId(&o.id));
    pid_t pids[64];
    for (int r = 0; r < o.procs && r < 64; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(run_rank(&o, r));
    }
    int rc = 0;
    for (int r = 0; r < o.procs && r < 64; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
    }
    return rc;
}
