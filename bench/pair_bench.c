/*
 * pair_bench.c: coll and MPI timed in one process, block by block, so that both meet the
 * same node: the same CPUs, the same placement of the vCPUs, the same phase of the
 * neighbours' load. Each MPI rank is also pod i's application (it attaches to agent i
 * through libcoll), and per size the two systems take turns in blocks of about BLOCK_MS
 * each, the order flipping every pair of blocks. bench/compare.sh runs it (its default;
 * -S runs the two apart), built there with mpicc against libcoll (agents.sh:
 * build_pair_bench); not part of the product.
 *
 * Why: run one after the other, coll and MPI meet different phases of a load that comes
 * in 5 ms slices and different placements of the two vCPUs (the host moves them every
 * few seconds to a minute, and every two-pod exchange is 1.2-1.8x slower in the far one:
 * bench/RESULTS.md), so one cell's ratio moved 0.35-2.7 from round to round. Blocks of
 * 25 ms, alternating for the whole run, sample both alike.
 *
 *   mpirun -np N pair_bench -s SOCK[,SOCK...] -g GROUP [-o OP] [-L SIZE,...] [-n ITERS]
 *          [-w WARMUP] [-T MIN_MS] [-k BLOCK_MS] [-m FIRST]
 *
 * Rank i attaches to SOCK i % count. -L, -n, -w and -T as coll-bench's and mpi_bench's
 * (bench_iters.h): each system runs at least its count of ops and MIN_MS, in the same
 * number of blocks; -m coll|mpi: which system runs the first block. Broadcast runs in
 * place in both (as MPI_Bcast does; coll-bench -i). Per size rank 0 prints two sections,
 * "### pods N op OP system coll" with coll-bench's columns and "... system mpi" with
 * mpi_bench's, each system's time per op being its blocks' time over their ops (rank 0,
 * each block ended by the system's own barrier), and with BENCH_RUSAGE=1 each rank's
 * "#rusage" line per system, over its blocks. coll's #wrong counts the elements of one
 * op's result, after the timed blocks, that differ from MPI's on the same input.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_iters.h"
#include "coll/coll.h"

enum { COLL = 0, MPI = 1 };
static const char *const sys_names[2] = {"coll", "mpi"};

struct ctx {
    const char *op;
    int rank, n;
    coll_conn *c;
    coll_group *g;
    float *cs, *cr; /* coll's buffers (shared with its agent) */
    float *ms, *mr; /* MPI's */
};

static void die(const char *what)
{
    fprintf(stderr, "pair_bench: %s: %s\n", what, coll_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One op of sys on count floats. */
static void op_once(struct ctx *x, int sys, int count)
{
    const char *op = x->op;
    if (sys == MPI) {
        if (!strcmp(op, "allreduce"))
            MPI_Allreduce(x->ms, x->mr, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (!strcmp(op, "allgather"))
            MPI_Allgather(x->ms, count, MPI_FLOAT, x->mr, count, MPI_FLOAT, MPI_COMM_WORLD);
        else if (!strcmp(op, "broadcast"))
            MPI_Bcast(x->ms, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        else
            MPI_Reduce_scatter_block(x->ms, x->mr, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
    coll_request req;
    coll_err e;
    if (!strcmp(op, "allreduce"))
        e = coll_allreduce(x->g, x->cs, x->cr, (size_t)count, COLL_FLOAT32, COLL_SUM, NULL, &req);
    else if (!strcmp(op, "allgather"))
        e = coll_allgather(x->g, x->cs, x->cr, (size_t)count, COLL_FLOAT32, NULL, &req);
    else if (!strcmp(op, "broadcast"))
        e = coll_broadcast(x->g, x->cs, x->cs, (size_t)count, COLL_FLOAT32, 0, NULL, &req);
    else
        e = coll_reduce_scatter(x->g, x->cs, x->cr, (size_t)count, COLL_FLOAT32, COLL_SUM, NULL,
                                &req);
    if (e || coll_wait(x->c, req, -1)) die(op);
}

static void barrier(struct ctx *x, int sys)
{
    if (sys == MPI) {
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
    coll_request req;
    if (coll_barrier(x->g, NULL, &req) || coll_wait(x->c, req, -1)) die("barrier");
}

/* Small integers, exact in float32 sums: rank r's element i. */
static void fill(float *p, size_t elems, int rank)
{
    for (size_t i = 0; i < elems; i++)
        p[i] = (float)((rank + 1 + (int)(i % 3)) % 4);
}

/* Elements of one op's result that differ between the systems, on the same input. */
static long compare_results(struct ctx *x, int count)
{
    size_t all = (size_t)count * (size_t)x->n;
    fill(x->cs, all, x->rank);
    fill(x->ms, all, x->rank);
    memset(x->cr, 0, all * sizeof(float));
    memset(x->mr, 0, all * sizeof(float));
    op_once(x, COLL, count);
    op_once(x, MPI, count);
    const float *a = x->cr, *b = x->mr;
    size_t k = (size_t)count;
    if (!strcmp(x->op, "broadcast")) a = x->cs, b = x->ms;
    if (!strcmp(x->op, "allgather")) k = all;
    long wrong = 0;
    for (size_t i = 0; i < k; i++)
        wrong += a[i] != b[i];
    return wrong;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    struct ctx x = {.op = "allreduce"};
    MPI_Comm_rank(MPI_COMM_WORLD, &x.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &x.n);
    const char *socks = NULL, *group = "bench";
    int iters = 100, warmup = 10, first = COLL, c;
    long min_ms = 0, block_ms = 25;
    size_t sizes[32];
    int nsizes = 0;
    while ((c = getopt(argc, argv, "s:g:o:L:n:w:T:k:m:")) != -1) {
        if (c == 's') socks = optarg;
        if (c == 'g') group = optarg;
        if (c == 'o') x.op = optarg;
        if (c == 'n') iters = atoi(optarg);
        if (c == 'w') warmup = atoi(optarg);
        if (c == 'T') min_ms = atol(optarg);
        if (c == 'k') block_ms = atol(optarg);
        if (c == 'm') first = !strcmp(optarg, "mpi") ? MPI : COLL;
        if (c == 'L') {
            char *save = NULL;
            for (char *t = strtok_r(optarg, ",", &save); t && nsizes < 32;
                 t = strtok_r(NULL, ",", &save))
                sizes[nsizes++] = strtoull(t, NULL, 0);
        }
    }
    int known = !strcmp(x.op, "allreduce") || !strcmp(x.op, "allgather") ||
                !strcmp(x.op, "broadcast") || !strcmp(x.op, "reduce_scatter");
    if (!socks || !nsizes || !known || block_ms < 1 || iters < 1 || warmup < 1) {
        if (x.rank == 0)
            fprintf(stderr, "usage: pair_bench -s SOCK[,SOCK...] -L SIZE[,SIZE...] [-g GROUP] "
                            "[-o allreduce|allgather|broadcast|reduce_scatter] [-n ITERS] "
                            "[-w WARMUP] [-T MIN_MS] [-k BLOCK_MS] [-m coll|mpi]\n");
        MPI_Finalize();
        return 2;
    }
    /* rank i's agent: the i-th socket of the list (mod its length) */
    char sock[4096];
    {
        int count = 1;
        for (const char *p = socks; *p; p++)
            count += *p == ',';
        const char *p = socks;
        for (int k = x.rank % count; k > 0; k--)
            p = strchr(p, ',') + 1;
        size_t len = strcspn(p, ",");
        if (len >= sizeof sock) len = sizeof sock - 1;
        memcpy(sock, p, len);
        sock[len] = 0;
    }
    if (coll_connect(&x.c, sock, 5000)) die(sock);
    if (coll_group_open(&x.g, x.c, group, COLL_SLOT_ANY)) die(group);
    coll_group_info info;
    coll_group_info_get(x.g, &info);
    if (info.size != x.n) {
        fprintf(stderr, "pair_bench: group %s has %d ranks, MPI %d\n", group, info.size, x.n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    size_t maxb = 0;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > maxb) maxb = sizes[i];
    size_t elems = maxb / 4 * (size_t)x.n + 1;
    coll_buffer *sb, *rb;
    if (coll_mem_alloc(&sb, x.c, elems * 4, COLL_DEVICE_HOST) ||
        coll_mem_alloc(&rb, x.c, elems * 4, COLL_DEVICE_HOST))
        die("buffers");
    x.cs = coll_mem_ptr(sb);
    x.cr = coll_mem_ptr(rb);
    x.ms = malloc(elems * 4);
    x.mr = malloc(elems * 4);
    if (!x.ms || !x.mr) MPI_Abort(MPI_COMM_WORLD, 1);
    int pods = info.nodes;

    for (int si = 0; si < nsizes; si++) {
        size_t bytes = sizes[si];
        int count = (int)(bytes / 4);
        /* every page written (mpi_bench.c says why) */
        fill(x.cs, elems, x.rank);
        fill(x.ms, elems, x.rank);
        memset(x.cr, 0, elems * 4);
        memset(x.mr, 0, elems * 4);
        /* warm both up; rank 0 times each one's second half for its pace */
        int wu = bench_warmup(bytes, warmup, min_ms, si == 0);
        double pace[2];
        for (int s = 0; s < 2; s++) {
            int sys = s ? !first : first;
            double w0 = MPI_Wtime();
            for (int i = 0; i < wu; i++) {
                if (i == wu / 2) w0 = MPI_Wtime();
                op_once(&x, sys, count);
            }
            int timed = wu - wu / 2;
            pace[sys] = timed ? (MPI_Wtime() - w0) * 1e6 / timed : 0;
        }
        /* rank 0's plan for all: ops per block and blocks, the same for both systems */
        long plan[3];
        if (x.rank == 0) {
            long blocks = 1;
            for (int sys = 0; sys < 2; sys++) {
                long want = long_enough(bench_iters(bytes, iters), pace[sys], min_ms);
                long k = pace[sys] > 0 ? (long)(block_ms * 1e3 / pace[sys]) : want;
                if (k < 1) k = 1;
                if (k > want) k = want;
                plan[sys] = k;
                long b = (want + k - 1) / k;
                if (b > blocks) blocks = b;
            }
            plan[2] = blocks < 2 ? 2 : blocks;
        }
        MPI_Bcast(plan, 3, MPI_LONG, 0, MPI_COMM_WORLD);
        double t[2] = {0, 0};
        long ops[2] = {0, 0};
        long sleeps[2] = {0, 0}, preempted[2] = {0, 0}, faults[2] = {0, 0};
        double cpu[2] = {0, 0};
        for (long b = 0; b < plan[2]; b++) {
            for (int s = 0; s < 2; s++) {
                /* coll mpi, mpi coll, coll mpi, ... from -m's */
                int sys = (s ^ (int)(b & 1)) ? !first : first;
                struct rusage u0, u1;
                barrier(&x, sys);
                getrusage(RUSAGE_SELF, &u0);
                double t0 = MPI_Wtime();
                for (long i = 0; i < plan[sys]; i++)
                    op_once(&x, sys, count);
                barrier(&x, sys);
                t[sys] += MPI_Wtime() - t0;
                getrusage(RUSAGE_SELF, &u1);
                ops[sys] += plan[sys];
                sleeps[sys] += u1.ru_nvcsw - u0.ru_nvcsw;
                preempted[sys] += u1.ru_nivcsw - u0.ru_nivcsw;
                faults[sys] += u1.ru_minflt - u0.ru_minflt;
                cpu[sys] += bench_ru_cpu_us(&u1) - bench_ru_cpu_us(&u0);
            }
        }
        long wrong = compare_results(&x, count);
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (bench_ru_wanted()) {
            for (int sys = 0; sys < 2; sys++)
                bench_ru_line(sys_names[sys], x.rank, bytes, ops[sys], sleeps[sys], preempted[sys],
                              cpu[sys], faults[sys]);
            fflush(stderr);
        }
        MPI_Barrier(MPI_COMM_WORLD); /* the #rusage lines before rank 0's table */
        if (x.rank == 0) {
            double f = 1, scale = 1;
            if (!strcmp(x.op, "allreduce")) f = 2.0 * (x.n - 1) / x.n;
            if (!strcmp(x.op, "allgather") || !strcmp(x.op, "reduce_scatter")) {
                scale = x.n;
                f = (double)(x.n - 1) / x.n;
            }
            for (int s = 0; s < 2; s++) {
                int sys = s ? MPI : COLL;
                double us = t[sys] / (double)ops[sys] * 1e6;
                double algbw = (double)bytes * scale / us / 1e3;
                printf("### pods %d op %s system %s\n", pods, x.op, sys_names[sys]);
                if (sys == COLL)
                    printf("%12zu %12d %10.2f %10.3f %10.3f %8ld %10.2f %10.2f %8ld\n", bytes,
                           count, us, algbw, algbw * f, wrong, us, us, ops[sys]);
                else
                    printf("%12zu %12d %10.2f %10.3f %10.3f %8ld\n", bytes, count, us, algbw,
                           algbw * f, ops[sys]);
            }
            printf("#pair blocks %ld ops/block coll %ld mpi %ld\n", plan[2], plan[COLL], plan[MPI]);
            fflush(stdout);
        }
    }
    coll_mem_release(&sb);
    coll_mem_release(&rb);
    coll_group_close(&x.g);
    coll_disconnect(&x.c);
    free(x.ms);
    free(x.mr);
    MPI_Finalize();
    return 0;
}
