/*
 * coll_bench.c: collective benchmark through the agent, in the style of nccl-tests.
 *
 *   coll-bench [-b MIN] [-e MAX] [-f FACTOR] [-o OP] [-d DTYPE] [-n ITERS] [-w WARMUP]
 *              [-p PROCS] [-g GROUP] [-s SOCKET[,SOCKET...]] [-G GAP_US] [-c 0|1] [-a] [-i]
 *              [-L SIZE,SIZE...] [-T MIN_MS] [-O PREFIX] [-C]
 *
 * With several sockets (one per agent), process i attaches to socket i % count.
 * Forks PROCS application processes (default 1) that open GROUP; rank 0 prints one line
 * per size: bytes, count, time per op in us (the loop's time at rank 0, ended by a
 * barrier, so that it counts until every rank is done; with -G the mean op), algbw and
 * busbw in GB/s, wrong elements, then the median and 90th percentile of single-op
 * round trips. -G sleeps
 * GAP_US between iterations, so the agent is idle (asleep) when each op arrives.
 * -a pins process i to CPU i mod count (one CPU per pod). -i runs allreduce or broadcast
 * in place (one buffer, as MPI_Bcast has), where the default is two buffers.
 * -L runs the listed sizes instead of MIN..MAX, ITERS times up to 1 MiB and fewer above
 * (256 MiB / size, at least 3: bench_iters(), the same rule as mpi_bench.c), as
 * bench/compare.sh runs both; warmup as bench_warmup() says (the first listed size's
 * ops are a fresh process's, so it warms up longer).
 * -T runs each size at least MIN_MS: rank 0 times the second half of its warmup (two ops
 * above 1 MiB) and, where ITERS ops would take less, broadcasts a larger count (at most
 * BENCH_ITERS_MAX) before the timed loop (mpi_bench.c and gloo_bench.py do the same): a
 * cell of 2000 ops of 10 us is 20 ms, two periods of compare.sh's neighbour, and one
 * kernel thread's slice moves it by 10%.
 * -O writes every rank's single-op times of each size to PREFIX.BYTES.RANK
 * (bench_dump_ops; mpi_bench -O the same).
 * -C runs on a child of GROUP made at run time (coll_group_split, one color, key the
 * rank: the same ranks in the same order) instead of GROUP itself, and rank 0 prints
 * "# child: split to first op N us" (the split, then one barrier on the child), for the
 * A/B of a child against the YAML group it equals (bench/children.sh). -K K: children of
 * K consecutive ranks each (color rank / K) instead of one; -X: each made by its members
 * alone (coll_group_create of its K ranks) instead of the split ("create to first op");
 * rank 0 prints its own child's time and, with -K, the slowest child's ("slowest").
 * The ops then run on those children.
 * -M reduces with a premultiplied sum (coll_redop_create_premul_sum) whose scalar is one
 * on every rank instead of COLL_SUM: the same results (-c checks them), the scaling's
 * cost (bench/premul.sh).
 * -o sendrecv (two ranks): rank 1 sends, rank 0 receives, from rank 1 or, with -A, from
 * any rank (coll_recv_any; the sender it names is checked): bench/anysource.sh.
 */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_iters.h"
#include "coll/coll.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static const char *const op_names[] = {"allreduce",      "broadcast", "reduce",  "allgather",
                                       "reduce_scatter", "alltoall",  "barrier", "gather",
                                       "sendrecv",       NULL};

struct opts {
    size_t minb, maxb;
    size_t sizes[32];
    int nsizes; /* -L: these sizes, in order */
    double factor;
    int op, dtype, iters, warmup, procs, check, inplace;
    long gap_us, min_ms;
    const char *group, *sock;
    const char *dump; /* -O: the per-op times' file prefix */
    int child;        /* -C: run on a child split from the group */
    int child_ranks;  /* -K: of this many consecutive ranks (0: all) */
    int create;       /* -X: made by coll_group_create, not split */
    int premul;       /* -M: a premultiplied sum by one instead of COLL_SUM */
    int any;          /* -A: sendrecv's receive is from any rank */
};

/* The reduction of the ops (-M: a premultiplied sum made once the group is open). */
static coll_redop bench_redop = COLL_SUM;
static int bench_rank;       /* this process's rank in the group */
static int bench_source = 1; /* sendrecv -A: who the last receive said sent */

#define BENCH_PROCS_MAX 512 /* -p, and the sockets of -s */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fill for checking: small integers, exact in every dtype. */
static void fill(void *p, size_t count, int dt, int rank)
{
    for (size_t i = 0; i < count; i++) {
        int v = (rank + 1 + (int)(i % 3)) % 4;
        switch (dt) {
        case COLL_INT8:
        case COLL_UINT8:
        case COLL_BOOL:
            ((uint8_t *)p)[i] = (uint8_t)v;
            break;
        case COLL_INT16:
        case COLL_UINT16:
            ((uint16_t *)p)[i] = (uint16_t)v;
            break;
        case COLL_INT32:
        case COLL_UINT32:
            ((uint32_t *)p)[i] = (uint32_t)v;
            break;
        case COLL_INT64:
        case COLL_UINT64:
            ((uint64_t *)p)[i] = (uint64_t)v;
            break;
        case COLL_FLOAT32:
            ((float *)p)[i] = (float)v;
            break;
        case COLL_FLOAT64:
            ((double *)p)[i] = (double)v;
            break;
        case COLL_COMPLEX64: /* v + 0i */
            ((float *)p)[2 * i] = (float)v, ((float *)p)[2 * i + 1] = 0;
            break;
        case COLL_COMPLEX128:
            ((double *)p)[2 * i] = (double)v, ((double *)p)[2 * i + 1] = 0;
            break;
        case COLL_FLOAT8_E4M3: { /* 0..3 as bit patterns (no checks: sums leave exactness) */
            static const uint8_t e4m3[4] = {0, 0x38, 0x40, 0x44};
            ((uint8_t *)p)[i] = e4m3[v];
            break;
        }
        case COLL_FLOAT8_E5M2: {
            static const uint8_t e5m2[4] = {0, 0x3c, 0x40, 0x42};
            ((uint8_t *)p)[i] = e5m2[v];
            break;
        }
        default: /* float16 / bfloat16: 0..3 in half and bfloat bit patterns */
            ((uint16_t *)p)[i] = dt == COLL_FLOAT16 ? (uint16_t)(v ? 0x3c00 + (v == 2   ? 0x400
                                                                               : v == 3 ? 0x600
                                                                                        : 0)
                                                                   : 0)
                                                    : (uint16_t)(v ? 0x3f80 + (v == 2   ? 0x80
                                                                               : v == 3 ? 0xc0
                                                                                        : 0)
                                                                   : 0);
            break;
        }
    }
}

static double get(const void *p, size_t i, int dt)
{
    switch (dt) {
    case COLL_INT8:
        return ((const int8_t *)p)[i];
    case COLL_UINT8:
    case COLL_BOOL:
        return ((const uint8_t *)p)[i];
    case COLL_INT16:
        return ((const int16_t *)p)[i];
    case COLL_UINT16:
        return ((const uint16_t *)p)[i];
    case COLL_INT32:
        return ((const int32_t *)p)[i];
    case COLL_UINT32:
        return ((const uint32_t *)p)[i];
    case COLL_INT64:
        return (double)((const int64_t *)p)[i];
    case COLL_UINT64:
        return (double)((const uint64_t *)p)[i];
    case COLL_FLOAT32:
        return ((const float *)p)[i];
    case COLL_FLOAT64:
    case COLL_COMPLEX128: /* the real part (the fill's imaginary parts are 0) */
        return ((const double *)p)[(dt == COLL_COMPLEX128 ? 2 : 1) * i];
    case COLL_COMPLEX64:
        return ((const float *)p)[2 * i];
    default: {
        uint16_t h = ((const uint16_t *)p)[i];
        uint32_t bits;
        if (dt == COLL_BFLOAT16) {
            bits = (uint32_t)h << 16;
        } else { /* normal halves only (the fill uses 0..3 and sums stay small) */
            if (!h) return 0;
            bits = ((uint32_t)(h & 0x8000) << 16) | ((((h >> 10) & 0x1f) + 112u) << 23) |
                   ((uint32_t)(h & 0x3ff) << 13);
        }
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    }
}

static int submit(const struct opts *o, coll_group *g, void *s, void *r, size_t count,
                  coll_request *req)
{
    switch (o->op) {
    case 0:
        return coll_allreduce(g, s, r, count, o->dtype, bench_redop, NULL, req);
    case 1:
        return coll_broadcast(g, s, r, count, o->dtype, 0, NULL, req);
    case 2:
        return coll_reduce(g, s, r, count, o->dtype, bench_redop, 0, NULL, req);
    case 3:
        return coll_allgather(g, s, r, count, o->dtype, NULL, req);
    case 4:
        return coll_reduce_scatter(g, s, r, count, o->dtype, bench_redop, NULL, req);
    case 5:
        return coll_alltoall(g, s, r, count, o->dtype, NULL, req);
    case 7: /* to rank 0: sends and receives between pods */
        return coll_gather(g, s, r, count, o->dtype, 0, NULL, req);
    case 8: /* rank 1 to rank 0 */
        if (bench_rank == 1) return coll_send(g, s, count, o->dtype, 0, NULL, req);
        if (o->any) return coll_recv_any(g, r, count, o->dtype, 0, &bench_source, NULL, req);
        return coll_recv(g, r, count, o->dtype, 1, NULL, req);
    default:
        return coll_barrier(g, NULL, req);
    }
}

/* Wrong elements of this rank's result, for inputs from fill(). */
static long check(const struct opts *o, const void *r, size_t count, int rank, int n)
{
    long wrong = 0;
    size_t total = o->op == 3 || o->op == 5 || o->op == 7 ? count * (size_t)n : count;
    if ((o->op == 2 || o->op == 7 || o->op == 8) && rank != 0) return 0;
    if (o->op == 8 && bench_source != 1) return (long)total; /* it named another sender */
    if (o->op == 6) return 0;
    for (size_t i = 0; i < total; i++) {
        double want = 0;
        size_t idx = i;
        switch (o->op) {
        case 0:
        case 2:
        case 4:
            if (o->op == 4) idx = i + (size_t)rank * count;
            for (int k = 0; k < n; k++)
                want += (k + 1 + (int)(idx % 3)) % 4;
            break;
        case 1:
            want = (1 + (int)(i % 3)) % 4;
            break;
        case 8: /* rank 1's block */
            want = 2 + (int)(i % 3);
            want = (int)want % 4;
            break;
        case 3:
        case 7:
            want = (int)(i / count) + 1 + (int)((i % count) % 3);
            want = (int)want % 4;
            break;
        case 5: {
            size_t j = i / count, e = (size_t)rank * count + i % count;
            want = (int)(j + 1 + e % 3) % 4;
            break;
        }
        }
        if (fabs(get(r, i, o->dtype) - want) > 1e-6) wrong++;
    }
    return wrong;
}

static int run_rank(const struct opts *o)
{
    coll_conn *c;
    coll_group *g;
    coll_err e = coll_connect(&c, o->sock, 5000);
    if (e) {
        fprintf(stderr, "coll-bench: connect: %s (%s)\n", coll_strerror(e), coll_last_error());
        return 1;
    }
    e = coll_group_open(&g, c, o->group, COLL_SLOT_ANY);
    if (e) {
        fprintf(stderr, "coll-bench: open %s: %s (%s)\n", o->group, coll_strerror(e),
                coll_last_error());
        return 1;
    }
    coll_group_info info;
    coll_group *parent = NULL;
    coll_group_info_get(g, &info);
    if (o->child) {
        /* every rank in, then the split and the first op on the child, timed at rank 0 */
        coll_request q;
        if (coll_barrier(g, NULL, &q) || coll_wait(c, q, -1)) {
            fprintf(stderr, "coll-bench: barrier: %s\n", coll_last_error());
            return 1;
        }
        int kr = o->child_ranks > 0 && o->child_ranks < info.size ? o->child_ranks : info.size;
        int color = info.rank / kr, first = color * kr;
        int members = first + kr <= info.size ? kr : info.size - first;
        int *list = malloc((size_t)members * sizeof(int));
        if (!list) return 1;
        for (int i = 0; i < members; i++)
            list[i] = first + i;
        double t0 = now_us();
        coll_group *k;
        e = o->create ? coll_group_create(g, list, members, &k)
                      : coll_group_split(g, color, info.rank, &k);
        free(list);
        if (e == COLL_OK) e = coll_barrier(k, NULL, &q);
        if (e == COLL_OK) e = coll_wait(c, q, -1);
        if (e) {
            fprintf(stderr, "coll-bench: %s: %s (%s)\n", o->create ? "create" : "split",
                    coll_strerror(e), coll_last_error());
            return 1;
        }
        double took = now_us() - t0;
        const char *what = o->create ? "create" : "split";
        if (info.rank == 0) printf("# child: %s to first op %.1f us\n", what, took);
        if (kr < info.size) { /* the slowest child's, through the parent (its next op) */
            coll_buffer *tb;
            if (coll_mem_alloc(&tb, c, sizeof(double), COLL_DEVICE_HOST) == COLL_OK) {
                double *tv = coll_mem_ptr(tb);
                *tv = took;
                if (coll_allreduce(g, tv, tv, 1, COLL_FLOAT64, COLL_MAX, NULL, &q) == COLL_OK &&
                    coll_wait(c, q, -1) == COLL_OK && info.rank == 0)
                    printf("# child: %d children of %d: %s to first op, slowest %.1f us\n",
                           (info.size + kr - 1) / kr, kr, what, *tv);
                coll_mem_release(&tb);
            }
        }
        parent = g;
        g = k; /* the parent stays open: the child lives in its epoch */
        coll_group_info_get(g, &info);
    }
    if (o->premul) {
        uint64_t one = 0; /* 1 in the dtype */
        switch (o->dtype) {
        case COLL_FLOAT32: {
            float f = 1.0f;
            memcpy(&one, &f, sizeof(f));
            break;
        }
        case COLL_FLOAT64: {
            double d = 1.0;
            memcpy(&one, &d, sizeof(d));
            break;
        }
        case COLL_FLOAT16:
            one = 0x3c00;
            break;
        case COLL_BFLOAT16:
            one = 0x3f80;
            break;
        default: /* the integers */
            one = 1;
            break;
        }
        e = coll_redop_create_premul_sum(g, &one, o->dtype, &bench_redop);
        if (e) {
            fprintf(stderr, "coll-bench: premul_sum: %s (%s)\n", coll_strerror(e),
                    coll_last_error());
            return 1;
        }
    }
    int rank = info.rank, n = info.size;
    bench_rank = rank;
    if (o->op == 8 && n != 2) {
        fprintf(stderr, "coll-bench: sendrecv runs on two ranks (the group has %d)\n", n);
        return 1;
    }
    size_t es = coll_dtype_size(o->dtype);
    size_t maxc = o->maxb / es ? o->maxb / es : 1;
    coll_buffer *sb, *rb;
    if (coll_mem_alloc(&sb, c, maxc * es * (size_t)n, COLL_DEVICE_HOST) ||
        coll_mem_alloc(&rb, c, maxc * es * (size_t)n, COLL_DEVICE_HOST)) {
        fprintf(stderr, "coll-bench: buffers: %s\n", coll_last_error());
        return 1;
    }
    void *s = coll_mem_ptr(sb), *r = coll_mem_ptr(rb);
    if (rank == 0) {
        printf("# coll-bench: op %s dtype %s ranks %d backend %s iters %d warmup %d gap_us %ld\n",
               op_names[o->op], coll_dtype_name(o->dtype), n, info.backend, o->iters, o->warmup,
               o->gap_us);
        printf("%12s %12s %10s %10s %10s %8s %10s %10s %8s\n", "bytes", "count", "time(us)",
               "algbw", "busbw", "#wrong", "p50(us)", "p90(us)", "iters");
    }
    double *lat = calloc((size_t)(o->min_ms > 0 ? BENCH_ITERS_MAX : o->iters) + 1, sizeof(double));
    int rc = 0;
    for (size_t bytes = o->nsizes ? o->sizes[0] : o->minb, si = 0; bytes <= o->maxb;) {
        size_t count = bytes / es;
        int iters = o->nsizes ? bench_iters(bytes, o->iters) : o->iters;
        int warmup = o->nsizes ? bench_warmup(bytes, o->warmup, o->min_ms, si == 0) : o->warmup;
        if (o->op == 6) count = 0;
        coll_request req;
        fill(s, count * (size_t)n, o->dtype, rank);
        void *dst = o->inplace ? s : r;
        double w0 = now_us();
        for (int i = 0; i < warmup; i++) {
            if (i == warmup / 2) w0 = now_us();
            if (submit(o, g, s, dst, count, &req) || coll_wait(c, req, -1)) goto fail;
        }
        if (o->min_ms > 0) { /* rank 0's count for all (r is written by the ops anyway) */
            int64_t *k = r;
            int timed = warmup - warmup / 2;
            *k = long_enough(iters, timed ? (now_us() - w0) / timed : 0, o->min_ms);
            if (coll_broadcast(g, k, k, 1, COLL_INT64, 0, NULL, &req) || coll_wait(c, req, -1))
                goto fail;
            if (*k < 1 || *k > BENCH_ITERS_MAX) {
                fprintf(stderr, "coll-bench: rank 0 sent %lld iterations\n", (long long)*k);
                goto fail;
            }
            iters = (int)*k;
        }
        if (coll_barrier(g, NULL, &req) || coll_wait(c, req, -1)) goto fail;
        struct bench_ru ru;
        bench_ru_start(&ru);
        double total = 0, start = now_us();
        for (int i = 0; i < iters; i++) {
            if (o->gap_us) usleep((useconds_t)o->gap_us);
            double t0 = now_us();
            if (submit(o, g, s, dst, count, &req) || coll_wait(c, req, -1)) goto fail;
            lat[i] = now_us() - t0;
            total += lat[i];
        }
        /* the loop ends when every rank has finished it: a broadcast's root may finish
         * its sends long before the others have their data (mpi_bench does the same) */
        if (coll_barrier(g, NULL, &req) || coll_wait(c, req, -1)) goto fail;
        if (!o->gap_us) total = now_us() - start;
        bench_ru_end(&ru, "coll", rank, count * es, iters);
        long wrong = 0;
        if (o->check) {
            if (o->inplace)
                fill(r, count, o->dtype, rank);
            else
                memset(r, 0, count * es * (size_t)n);
            if (submit(o, g, o->inplace ? r : s, r, count, &req) || coll_wait(c, req, -1))
                goto fail;
            wrong = check(o, r, count, rank, n);
        }
        if (coll_barrier(g, NULL, &req) || coll_wait(c, req, -1)) goto fail;
        if (o->dump && bench_dump_ops(o->dump, count * es, rank, lat, iters) != 0) goto fail;
        qsort(lat, (size_t)iters, sizeof(double), cmp_double);
        double t = total / iters;
        double algbw = (double)(count * es) / t / 1e3;
        double f = 1;
        if (o->op == 0) f = 2.0 * (n - 1) / n;
        if (o->op == 3 || o->op == 4 || o->op == 5) f = (double)(n - 1) / n;
        if (o->op == 3 || o->op == 4 || o->op == 5) algbw *= n; /* nccl-tests: total bytes */
        if (rank == 0)
            printf("%12zu %12zu %10.2f %10.3f %10.3f %8ld %10.2f %10.2f %8d\n", count * es, count,
                   t, algbw, algbw * f, wrong, lat[iters / 2], lat[(iters * 9) / 10], iters);
        fflush(stdout);
        if (wrong) rc = 1;
        if (o->nsizes) {
            if (++si >= (size_t)o->nsizes) break;
            bytes = o->sizes[si];
            continue;
        }
        size_t next = (size_t)((double)bytes * o->factor);
        bytes = next > bytes ? next : bytes + 1;
    }
    free(lat);
    coll_mem_release(&sb);
    coll_mem_release(&rb);
    if (parent) { /* every child done before any rank leaves the parent (its epoch) */
        coll_request q;
        if (coll_barrier(parent, NULL, &q) == COLL_OK) coll_wait(c, q, -1);
    }
    coll_group_close(&g);
    coll_disconnect(&c);
    fflush(stdout);
    return rc;
fail:
    fprintf(stderr, "coll-bench rank %d: %s\n", rank, coll_last_error());
    return 1;
}

/* -a: process i runs on CPU i mod (CPUs this process may use), as bench/agents.sh pins
 * agent i when PIN=1, so that each "pod" (an agent and its application) has a CPU of its
 * own, as pods on separate machines would, and as mpirun binds its ranks. */
static int pin_to_cpu(int i)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    int n = CPU_COUNT(&allowed), k = i % n;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed) || k-- != 0) continue;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) == 0) return 0;
        fprintf(stderr, "coll-bench: cannot pin process %d to CPU %d: %s\n", i, cpu,
                strerror(errno));
        return -1;
    }
    return -1;
}

int main(int argc, char **argv)
{
    struct opts o = {.minb = 8,
                     .maxb = 8,
                     .factor = 2,
                     .op = 0,
                     .dtype = COLL_FLOAT32,
                     .iters = 1000,
                     .warmup = 50,
                     .procs = 1,
                     .check = 1,
                     .group = "demo"};
    int c, pin = 0;
    while ((c = getopt(argc, argv, "b:e:f:o:d:n:w:p:g:s:G:c:aiL:T:O:CK:XMAh")) != -1) {
        switch (c) {
        case 'b':
            o.minb = strtoull(optarg, NULL, 0);
            break;
        case 'e':
            o.maxb = strtoull(optarg, NULL, 0);
            break;
        case 'f':
            o.factor = atof(optarg);
            break;
        case 'o':
            o.op = -1;
            for (int i = 0; op_names[i]; i++)
                if (!strcmp(optarg, op_names[i])) o.op = i;
            if (o.op < 0) {
                fprintf(stderr, "coll-bench: unknown op %s\n", optarg);
                return 2;
            }
            break;
        case 'd':
            o.dtype = -1;
            for (int i = 0; i < COLL_DTYPE_COUNT; i++)
                if (!strcmp(optarg, coll_dtype_name(i))) o.dtype = i;
            if (o.dtype < 0) {
                fprintf(stderr, "coll-bench: unknown dtype %s\n", optarg);
                return 2;
            }
            break;
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'w':
            o.warmup = atoi(optarg);
            break;
        case 'p':
            o.procs = atoi(optarg);
            break;
        case 'g':
            o.group = optarg;
            break;
        case 's':
            o.sock = optarg;
            break;
        case 'G':
            o.gap_us = atol(optarg);
            break;
        case 'c':
            o.check = atoi(optarg);
            break;
        case 'a':
            pin = 1;
            break;
        case 'i':
            o.inplace = 1;
            break;
        case 'T':
            o.min_ms = atol(optarg);
            break;
        case 'C':
            o.child = 1;
            break;
        case 'K':
            o.child = 1;
            o.child_ranks = atoi(optarg);
            break;
        case 'X':
            o.child = 1;
            o.create = 1;
            break;
        case 'M':
            o.premul = 1;
            break;
        case 'A':
            o.any = 1;
            break;
        case 'O':
            o.dump = optarg;
            break;
        case 'L': {
            char *save = NULL, *l = strdup(optarg);
            o.nsizes = 0;
            for (char *t = strtok_r(l, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.nsizes == 32) break;
                o.sizes[o.nsizes++] = strtoull(t, NULL, 0);
            }
            free(l);
            o.minb = o.maxb = 0;
            for (int i = 0; i < o.nsizes; i++) {
                if (o.sizes[i] < 1) o.nsizes = 0; /* refused below */
                if (o.sizes[i] > o.maxb) o.maxb = o.sizes[i];
            }
            o.minb = o.nsizes ? 1 : 0;
            break;
        }
        default:
            fprintf(stderr, "usage: coll-bench [-b MIN] [-e MAX] [-f FACTOR] [-o OP] [-d DTYPE] "
                            "[-n ITERS] [-w WARMUP] [-p PROCS] [-g GROUP] [-s SOCKET] "
                            "[-G GAP_US] [-c 0|1] [-a] [-i] [-L SIZE,SIZE...] [-T MIN_MS] "
                            "[-O PREFIX] [-C] [-K CHILD_RANKS] [-X] [-M] [-A]\n");
            return 2;
        }
    }
    if ((o.dtype == COLL_BOOL || o.dtype == COLL_FLOAT8_E4M3 || o.dtype == COLL_FLOAT8_E5M2) &&
        o.check) { /* its fill is 0..3 and sums */
        fprintf(stderr, "coll-bench: %s has no exact sums to check: give -c 0\n",
                coll_dtype_name((coll_dtype)o.dtype));
        return 2;
    }
    if (o.iters < 1 || o.procs < 1 || o.procs > BENCH_PROCS_MAX || o.minb < 1 || o.maxb < o.minb ||
        o.factor <= 1 || o.min_ms < 0 || o.min_ms > 600000 ||
        (o.inplace && o.op != 0 && o.op != 1)) {
        fprintf(stderr, "coll-bench: bad arguments\n");
        return 2;
    }
    char *socks[BENCH_PROCS_MAX];
    int nsocks = 0;
    char *list = o.sock ? strdup(o.sock) : NULL, *save = NULL;
    for (char *t = list ? strtok_r(list, ",", &save) : NULL; t && nsocks < BENCH_PROCS_MAX;
         t = strtok_r(NULL, ",", &save))
        socks[nsocks++] = t;
    if (o.procs == 1) {
        o.sock = nsocks ? socks[0] : NULL;
        int rc = run_rank(&o);
        free(list);
        return rc;
    }
    pid_t pids[BENCH_PROCS_MAX];
    for (int i = 0; i < o.procs; i++) {
        fflush(stdout);
        pids[i] = fork();
        if (pids[i] == 0) {
            o.sock = nsocks ? socks[i % nsocks] : NULL;
            if (pin && pin_to_cpu(i) != 0) _exit(1);
            _exit(run_rank(&o));
        }
    }
    int bad = 0;
    for (int i = 0; i < o.procs; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) bad++;
    }
    free(list);
    return bad ? 1 : 0;
}
