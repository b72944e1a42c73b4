/*
 * bench_iters.h: how many timed ops a size gets, one rule for coll-bench and mpi_bench
 * (gloo_bench.py spells the same rule in Python), so that the systems bench/compare.sh
 * sets side by side time the same amount of work.
 */
#ifndef COLL_BENCH_ITERS_H
#define COLL_BENCH_ITERS_H

#include <stddef.h>

#define BENCH_ITERS_MAX 100000

/* Iterations for a size with -L: ITERS up to 1 MiB, then about 256 MiB of data, at
 * least 3. */
static inline int bench_iters(size_t bytes, int iters)
{
    if (bytes <= (1u << 20)) return iters;
    size_t k = (256u << 20) / bytes;
    return k < 3 ? 3 : k < (size_t)iters ? (int)k : iters;
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

#endif
