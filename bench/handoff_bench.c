/*
 * handoff_bench.c: what it costs to hand a GPU op from one stream to another and
 * back, by the mechanisms the agent could use for stream order across processes.
 * One process, one GPU, two streams: A plays the application's stream, B the agent's.
 * The op is a one-rank NCCL allreduce (what the agent runs on a one-GPU pod).
 *
 *   coll-handoff-bench [-n ITERS] [-l LAT_ITERS]
 *
 * For each size (8 B and 64 MiB) and each mechanism it prints:
 *   lat_us:  one op issued on an idle stream, then cudaStreamSynchronize(A), median;
 *   dep_us:  time per op of ITERS ops where A waits for each op before releasing
 *            the next (the chain a dependent application builds);
 * Mechanisms:
 *   direct:  the op on A itself (the reference; no hand-off);
 *   host:    ready/done words in mapped host memory, cuStreamWriteValue64/WaitValue64;
 *   device:  the same words in device memory;
 *   event:   cudaEventRecord + cudaStreamWaitEvent both ways.
 * The figures decide where the agent keeps its stream-order words (see
 * docs/decisions/0019-gpu-stream-order.md).
 *
 * With two or more GPUs it also measures launch modes of a two-rank communicator
 * (one thread per GPU): 8 B allreduce + synchronize, median, on a non-blocking
 * communicator (how the agent creates them, for the deadline), then on blocking
 * children made from it with ncclCommSplit (splitShare 0 and 1), and the time each
 * split takes.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define NK(x)                                                                                      \
    do {                                                                                           \
        ncclResult_t r_ = (x);                                                                     \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define DK(x)                                                                                      \
    do {                                                                                           \
        CUresult c_ = (x);                                                                         \
        if (c_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s: driver error %d\n", __FILE__, __LINE__, #x, (int)c_);      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef CUresult (*wait_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*write_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

enum mech { M_DIRECT, M_HOST, M_DEVICE, M_EVENT, M_IPCEV, M_SPINH, M_SPIND, M_COUNT };
static const char *mech_name[M_COUNT] = {"direct",   "host",     "device", "event",
                                         "ipcevent", "spinhost", "spindev"};

/* A one-thread kernel that returns once the 64-bit word at addr is >= val (wrap-safe
 * signed difference), then fences: the wait side of a stream-order word done by a
 * polling kernel instead of cuStreamWaitValue64. PTX, JIT-compiled by the driver. */
static const char spin_ptx[] = ".version 7.0\n"
                               ".target sm_70\n"
                               ".address_size 64\n"
                               ".visible .entry coll_wait_geq(.param .u64 addr, .param .u64 val)\n"
                               "{\n"
                               "  .reg .pred p;\n"
                               "  .reg .b64 a, v, x, d;\n"
                               "  ld.param.u64 a, [addr];\n"
                               "  ld.param.u64 v, [val];\n"
                               "LOOP:\n"
                               "  ld.relaxed.sys.global.u64 x, [a];\n"
                               "  sub.s64 d, x, v;\n"
                               "  setp.lt.s64 p, d, 0;\n"
                               "  @p bra LOOP;\n"
                               "  fence.acq_rel.sys;\n"
                               "  ret;\n"
                               "}\n";

typedef CUresult (*modload_fn)(CUmodule *, const void *);
typedef CUresult (*getfn_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

struct ctx {
    cudaStream_t a, b;
    ncclComm_t comm;
    float *src, *dst;
    wait_fn wait64;
    write_fn write64;
    CUdeviceptr ready[M_COUNT], done[M_COUNT];
    cudaEvent_t ea, eb;   /* plain events */
    cudaEvent_t ia, ib;   /* interprocess events, as created */
    cudaEvent_t ia2, ib2; /* the same events opened from their IPC handles */
    uint64_t tag;
    CUfunction spin;
    launch_fn launch;
};

static void spin_wait(struct ctx *c, cudaStream_t s, CUdeviceptr addr, uint64_t v)
{
    void *args[2] = {&addr, &v};
    DK(c->launch(c->spin, 1, 1, 1, 1, 1, 1, 0, (CUstream)s, args, NULL));
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *p, const void *q)
{
    double x = *(const double *)p, y = *(const double *)q;
    return x < y ? -1 : x > y;
}

static void op(struct ctx *c, cudaStream_t s, size_t count)
{
    NK(ncclAllReduce(c->src, c->dst, count, ncclFloat32, ncclSum, c->comm, s));
}

/* One op through mechanism m. dep: A's next work must wait for it, and A releases
 * it (otherwise B starts at once, as when the app's stream was idle at submit). */
static void one(struct ctx *c, enum mech m, size_t count, int dep)
{
    uint64_t t = ++c->tag;
    switch (m) {
    case M_DIRECT:
        op(c, c->a, count);
        return;
    case M_HOST:
    case M_DEVICE:
        if (dep) {
            DK(c->write64((CUstream)c->a, c->ready[m], t, CU_STREAM_WRITE_VALUE_DEFAULT));
            DK(c->wait64((CUstream)c->b, c->ready[m], t, CU_STREAM_WAIT_VALUE_GEQ));
        }
        op(c, c->b, count);
        DK(c->write64((CUstream)c->b, c->done[m], t, CU_STREAM_WRITE_VALUE_DEFAULT));
        DK(c->wait64((CUstream)c->a, c->done[m], t, CU_STREAM_WAIT_VALUE_GEQ));
        return;
    case M_SPINH:
    case M_SPIND: {
        enum mech w = m == M_SPINH ? M_HOST : M_DEVICE;
        if (dep) {
            DK(c->write64((CUstream)c->a, c->ready[w], t, CU_STREAM_WRITE_VALUE_DEFAULT));
            spin_wait(c, c->b, c->ready[w], t);
        }
        op(c, c->b, count);
        DK(c->write64((CUstream)c->b, c->done[w], t, CU_STREAM_WRITE_VALUE_DEFAULT));
        spin_wait(c, c->a, c->done[w], t);
        return;
    }
    case M_EVENT:
        if (dep) {
            CK(cudaEventRecord(c->ea, c->a));
            CK(cudaStreamWaitEvent(c->b, c->ea, 0));
        }
        op(c, c->b, count);
        CK(cudaEventRecord(c->eb, c->b));
        CK(cudaStreamWaitEvent(c->a, c->eb, 0));
        return;
    case M_IPCEV:
        /* recorded through one handle, waited on through the other, as two
         * processes would */
        if (dep) {
            CK(cudaEventRecord(c->ia, c->a));
            CK(cudaStreamWaitEvent(c->b, c->ia2, 0));
        }
        op(c, c->b, count);
        CK(cudaEventRecord(c->ib2, c->b));
        CK(cudaStreamWaitEvent(c->a, c->ib, 0));
        return;
    default:
        return;
    }
}

/* ---- launch modes of a two-rank communicator ---- */

struct lrank {
    int rank;
    ncclUniqueId id;
    pthread_barrier_t *bar;
    double lat_nb, lat_child[2], split_ms[2], init_ms;
    double mem_parent, mem_child[2]; /* MiB of device memory each took */
};

static ncclResult_t settle(ncclComm_t comm, ncclResult_t r)
{
    while (r == ncclInProgress)
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
    return r;
}

static double lat2(ncclComm_t comm, cudaStream_t st, float *buf, int n, pthread_barrier_t *bar)
{
    double *s = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < 20; i++) {
        NK(settle(comm, ncclAllReduce(buf, buf + 2, 2, ncclFloat32, ncclSum, comm, st)));
        CK(cudaStreamSynchronize(st));
    }
    pthread_barrier_wait(bar);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        NK(settle(comm, ncclAllReduce(buf, buf + 2, 2, ncclFloat32, ncclSum, comm, st)));
        CK(cudaStreamSynchronize(st));
        s[i] = now_us() - t0;
    }
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    double m = s[n / 2];
    free(s);
    pthread_barrier_wait(bar);
    return m;
}

static void *lrank_main(void *arg)
{
    struct lrank *x = arg;
    CK(cudaSetDevice(x->rank));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float *buf;
    CK(cudaMalloc((void **)&buf, 64));
    CK(cudaMemset(buf, 0, 64));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t parent;
    size_t fr0, fr1, tot;
    CK(cudaMemGetInfo(&fr0, &tot));
    double t0 = now_us();
    ncclResult_t r = ncclCommInitRankConfig(&parent, 2, x->id, x->rank, &cfg);
    NK(settle(parent, r));
    x->init_ms = (now_us() - t0) / 1e3;
    CK(cudaMemGetInfo(&fr1, &tot));
    x->mem_parent = ((double)fr0 - (double)fr1) / 1048576.0;
    x->lat_nb = lat2(parent, st, buf, 300, x->bar);
    if (x->rank == 0) printf("  non-blocking parent measured\n");
    for (int share = 0; share < 2; share++) {
        ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
        cc.blocking = 1;
        cc.splitShare = share;
        t0 = now_us();
        ncclComm_t child = NULL;
        CK(cudaMemGetInfo(&fr0, &tot));
        r = ncclCommSplit(parent, 0, x->rank, &child, &cc);
        if (x->rank == 0)
            printf("  split(share=%d): %s, child %p\n", share, ncclGetErrorString(r),
                   (void *)child);
        /* on a non-blocking parent the split runs on NCCL's thread: the child
         * appears later, and the parent reports progress */
        double end = now_us() + 60e6;
        while ((r == ncclSuccess || r == ncclInProgress) && now_us() < end) {
            ncclComm_t ch = __atomic_load_n(&child, __ATOMIC_ACQUIRE);
            ncclResult_t pr;
            if (ncclCommGetAsyncError(parent, &pr) != ncclSuccess) pr = ncclInternalError;
            if (pr != ncclInProgress && pr != ncclSuccess) r = pr;
            if (ch && pr == ncclSuccess) {
                ncclResult_t cr;
                if (ncclCommGetAsyncError(ch, &cr) != ncclSuccess) cr = ncclInternalError;
                if (cr != ncclInProgress) {
                    r = cr;
                    break;
                }
            }
        }
        if (x->rank == 0)
            printf("  split(share=%d) settled: %s, child %p\n", share, ncclGetErrorString(r),
                   (void *)child);
        NK(r);
        if (!child) {
            fprintf(stderr, "split: no child after 60 s\n");
            exit(1);
        }
        x->split_ms[share] = (now_us() - t0) / 1e3;
        x->lat_child[share] = lat2(child, st, buf, 300, x->bar);
        CK(cudaMemGetInfo(&fr1, &tot));
        x->mem_child[share] = ((double)fr0 - (double)fr1) / 1048576.0;
        NK(ncclCommDestroy(child));
    }
    NK(ncclCommDestroy(parent));
    return NULL;
}

static void launch_modes(void)
{
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("launch modes: skipped, this host shows %d GPU(s)\n", n);
        return;
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    struct lrank r[2];
    ncclUniqueId id;
    NK(ncclGetUniqueId(&id));
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (struct lrank){.rank = i, .id = id, .bar = &bar};
        pthread_create(&th[i], NULL, lrank_main, &r[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    printf("launch modes, 2 ranks on GPUs 0-1, 8 B allreduce + synchronize, median us:\n");
    const char *rc = getenv("NCCL_RUNTIME_CONNECT");
    printf("  NCCL_RUNTIME_CONNECT=%s\n", rc ? rc : "(unset)");
    printf("  non-blocking parent: %.2f (init %.1f ms, %.0f MiB)\n", r[0].lat_nb, r[0].init_ms,
           r[0].mem_parent);
    for (int s = 0; s < 2; s++)
        printf("  blocking child, splitShare=%d: %.2f (split %.1f ms, %.0f MiB after its ops)\n", s,
               r[0].lat_child[s], r[0].split_ms[s], r[0].mem_child[s]);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int iters = 200, lat_iters = 500;
    if (argc > 1 && !strcmp(argv[1], "-L")) { /* launch modes only */
        launch_modes();
        return 0;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-l")) lat_iters = atoi(argv[i + 1]);
    }
    struct ctx c = {0};
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&c.a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c.b, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&c.ea, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&c.eb, cudaEventDisableTiming));
    unsigned iflags = cudaEventInterprocess | cudaEventDisableTiming;
    CK(cudaEventCreateWithFlags(&c.ia, iflags));
    CK(cudaEventCreateWithFlags(&c.ib, iflags));
    cudaIpcEventHandle_t ha, hb;
    CK(cudaIpcGetEventHandle(&ha, c.ia));
    CK(cudaIpcGetEventHandle(&hb, c.ib));
    if (cudaIpcOpenEventHandle(&c.ia2, ha) != cudaSuccess ||
        cudaIpcOpenEventHandle(&c.ib2, hb) != cudaSuccess) {
        cudaGetLastError();
        printf("note: IPC event handles cannot be opened in their own process; "
               "ipcevent uses the created events\n");
        c.ia2 = c.ia;
        c.ib2 = c.ib;
    }
    enum cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", (void **)&c.wait64, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", (void **)&c.write64, 12000,
                                        cudaEnableDefault, &q));
    modload_fn modload;
    getfn_fn getfn;
    CK(cudaGetDriverEntryPointByVersion("cuModuleLoadData", (void **)&modload, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuModuleGetFunction", (void **)&getfn, 12000,
                                        cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", (void **)&c.launch, 12000,
                                        cudaEnableDefault, &q));
    CUmodule mod;
    DK(modload(&mod, spin_ptx));
    DK(getfn(&c.spin, mod, "coll_wait_geq"));
    uint64_t *hw;
    CK(cudaHostAlloc((void **)&hw, 2 * sizeof(uint64_t),
                     cudaHostAllocMapped | cudaHostAllocPortable));
    memset(hw, 0, 2 * sizeof(uint64_t));
    void *hd;
    CK(cudaHostGetDevicePointer(&hd, hw, 0));
    c.ready[M_HOST] = (CUdeviceptr)(uintptr_t)hd;
    c.done[M_HOST] = c.ready[M_HOST] + 8;
    void *dw;
    CK(cudaMalloc(&dw, 2 * sizeof(uint64_t)));
    CK(cudaMemset(dw, 0, 2 * sizeof(uint64_t)));
    c.ready[M_DEVICE] = (CUdeviceptr)(uintptr_t)dw;
    c.done[M_DEVICE] = c.ready[M_DEVICE] + 8;

    size_t big = (size_t)64 << 20;
    CK(cudaMalloc((void **)&c.src, big));
    CK(cudaMalloc((void **)&c.dst, big));
    CK(cudaMemset(c.src, 0, big));
    ncclUniqueId id;
    NK(ncclGetUniqueId(&id));
    NK(ncclCommInitRank(&c.comm, 1, id, 0));

    double *s = malloc(sizeof(double) * (size_t)lat_iters);
    size_t sizes[2] = {8, big};
    printf("%-10s %-8s %10s %10s %10s %10s\n", "bytes", "mech", "lat_us", "+lat", "dep_us", "+dep");
    for (int z = 0; z < 2; z++) {
        size_t count = sizes[z] / 4;
        int n = sizes[z] >= big ? iters / 10 : iters;
        int ln = sizes[z] >= big ? lat_iters / 10 : lat_iters;
        double lat[M_COUNT], dep[M_COUNT];
        /* warm every path, then measure the mechanisms round-robin so drift hits all */
        for (int m = 0; m < M_COUNT; m++)
            for (int i = 0; i < 20; i++)
                one(&c, (enum mech)m, count, 1);
        CK(cudaDeviceSynchronize());
        for (int m = 0; m < M_COUNT; m++) {
            for (int i = 0; i < ln; i++) {
                double t0 = now_us();
                one(&c, (enum mech)m, count, 0);
                CK(cudaStreamSynchronize(c.a));
                s[i] = now_us() - t0;
            }
            qsort(s, (size_t)ln, sizeof(double), cmp_double);
            lat[m] = s[ln / 2];
            CK(cudaDeviceSynchronize());
            double t0 = now_us();
            for (int i = 0; i < n; i++)
                one(&c, (enum mech)m, count, 1);
            CK(cudaStreamSynchronize(c.a));
            dep[m] = (now_us() - t0) / n;
        }
        for (int m = 0; m < M_COUNT; m++)
            printf("%-10zu %-8s %10.2f %10.2f %10.2f %10.2f\n", sizes[z], mech_name[m], lat[m],
                   lat[m] - lat[M_DIRECT], dep[m], dep[m] - dep[M_DIRECT]);
    }
    ncclCommDestroy(c.comm);
    free(s);
    launch_modes();
    return 0;
}
