/*
 * bench_iters.h: what coll-bench and mpi_bench share (gloo_bench.py spells the same in
 * Python), so that the systems bench/compare.sh sets side by side time the same amount
 * of work and report it alike: how many timed ops a size gets, and where their time
 * went (BENCH_RUSAGE).
 */
#ifndef COLL_BENCH_ITERS_H
#define COLL_BENCH_ITERS_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#define BENCH_ITERS_MAX 100000

/* Iterations for a size with -L: ITERS up to 1 MiB, then about 256 MiB of data, at
 * least 3. */
static inline int bench_iters(size_t bytes, int iters)
{
    if (bytes <= (1u << 20)) return iters;
    size_t k = (256u << 20) / bytes;
    return k < 3 ? 3 : k < (size_t)iters ? (int)k : iters;
}

/* Untimed ops before a size's loop: WARMUP up to 1 MiB, above it 2 with -T (the second
 * timed for the pace: a size's first op finds its buffers cold) or 1; a run's first size
 * (first) 10x that up to 1 MiB, as its ops are a fresh process's (connections, an agent's
 * first slice under load before it stops yielding: libcoll/src/spin.h), 2x above (where
 * 10x made a run of one size, compare.sh's, warm up 20 ops of up to a second each). */
static inline int bench_warmup(size_t bytes, int warmup, long min_ms, int first)
{
    if (bytes > (1u << 20)) return (min_ms > 0 ? 2 : 1) * (first ? 2 : 1);
    return first ? 10 * warmup : warmup;
}

/* -T: the iterations that make a size's loop last min_ms at warm_us per op (rank 0's
 * warmup pace), never fewer than iters (bench_iters' count) nor more than
 * BENCH_ITERS_MAX. */
static inline int long_enough(int iters, double warm_us, long min_ms)
{
    if (min_ms <= 0 || warm_us <= 0) return iters;
    double want = (double)min_ms * 1e3 / warm_us;
    if (want > BENCH_ITERS_MAX) want = BENCH_ITERS_MAX;
    return want > iters ? (int)want : iters;
}

/* BENCH_RUSAGE=1 (bench/compare.sh sets it): every rank says on stderr, for each size's
 * timed loop, how often per op it slept (voluntary switches: a wait in poll, epoll or a
 * futex) and was preempted (involuntary ones: a yield, or the scheduler giving its CPU
 * to another task), and its CPU time per op: where an op's time went, side by side for
 * the systems compared (compare_report.py's "Where the time went"). */
struct bench_ru {
    int on;
    struct rusage u;
};

/* Whether BENCH_RUSAGE=1 asks for the #rusage lines. */
static inline int bench_ru_wanted(void)
{
    const char *e = getenv("BENCH_RUSAGE");
    return e && *e == '1';
}

static inline void bench_ru_start(struct bench_ru *r)
{
    r->on = bench_ru_wanted() && getrusage(RUSAGE_SELF, &r->u) == 0;
}

static inline double bench_ru_cpu_us(const struct rusage *u)
{
    return (double)(u->ru_utime.tv_sec + u->ru_stime.tv_sec) * 1e6 +
           (double)(u->ru_utime.tv_usec + u->ru_stime.tv_usec);
}

/* One #rusage line: sys's ops on rank, with their sleeps (voluntary switches),
 * preemptions (involuntary ones), CPU time and page faults (minor: memory taken fresh,
 * which a VM may charge dearly for), in all. */
static inline void bench_ru_line(const char *sys, int rank, size_t bytes, long ops, long sleeps,
                                 long preempted, double cpu_us, long faults)
{
    double n = (double)ops;
    fprintf(stderr,
            "#rusage %s rank %d bytes %zu ops %ld sleeps/op %.4f preempted/op %.4f cpu_us/op "
            "%.3f faults/op %.3f\n",
            sys, rank, bytes, ops, (double)sleeps / n, (double)preempted / n, cpu_us / n,
            (double)faults / n);
}

static inline void bench_ru_end(const struct bench_ru *r, const char *sys, int rank, size_t bytes,
                                long ops)
{
    struct rusage u;
    if (!r->on || ops <= 0 || getrusage(RUSAGE_SELF, &u) != 0) return;
    bench_ru_line(sys, rank, bytes, ops, u.ru_nvcsw - r->u.ru_nvcsw, u.ru_nivcsw - r->u.ru_nivcsw,
                  bench_ru_cpu_us(&u) - bench_ru_cpu_us(&r->u), u.ru_minflt - r->u.ru_minflt);
}

/* -O PREFIX: each rank writes the time of every op of a size's timed loop (us, one per
 * line, in the order run) to PREFIX.BYTES.RANK, so that phases within a cell show (a run
 * whose ops are all twice as slow against one with rare long ones: bench/phases.sh).
 * Returns 0, or -1 (with a message) where the file cannot be written. */
static inline int bench_dump_ops(const char *prefix, size_t bytes, int rank, const double *us,
                                 int n)
{
    char fn[4096];
    snprintf(fn, sizeof fn, "%s.%zu.%d", prefix, bytes, rank);
    FILE *f = fopen(fn, "w");
    if (!f) {
        perror(fn);
        return -1;
    }
    for (int i = 0; i < n; i++)
        fprintf(f, "%.2f\n", us[i]);
    if (fclose(f) != 0) {
        perror(fn);
        return -1;
    }
    return 0;
}

#endif
