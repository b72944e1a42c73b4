/*
 * mpi_bench.c: the reference for coll-bench across agents: the same ops, sizes and
 * output columns through MPI (OpenMPI's TCP transport in bench/compare.sh), so the two
 * are measured side by side. Built only when mpicc is present (bench/compare.sh builds
 * it); not part of the product.
 *
 *   mpirun -np N mpi_bench [-b MIN] [-e MAX] [-f FACTOR] [-o OP] [-n ITERS] [-w WARMUP]
 *                          [-L SIZE,SIZE...] [-T MIN_MS] [-O PREFIX]
 * -L: the listed sizes, with coll-bench's rules for iterations (bench_iters) and warmup
 * (bench_warmup); -T as coll-bench's (at least MIN_MS per size). The time
 * per op is rank 0's loop ended by a barrier, as coll-bench's: a broadcast's root, whose
 * eager sends complete at once, would otherwise time only itself. -O as coll-bench's:
 * every rank's single-op times (bench_dump_ops); without it no op is timed alone.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_iters.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t minb = 8, maxb = 8;
    double factor = 2;
    int iters = 100, warmup = 10, c;
    long min_ms = 0;
    const char *op = "allreduce", *dump = NULL;
    size_t sizes[32];
    int nsizes = 0;
    while ((c = getopt(argc, argv, "b:e:f:o:n:w:L:T:O:")) != -1) {
        if (c == 'L') {
            char *save = NULL;
            for (char *t = strtok_r(optarg, ",", &save); t && nsizes < 32;
                 t = strtok_r(NULL, ",", &save))
                sizes[nsizes++] = strtoull(t, NULL, 0);
            maxb = 0;
            for (int i = 0; i < nsizes; i++)
                if (sizes[i] > maxb) maxb = sizes[i];
        }
        if (c == 'b') minb = strtoull(optarg, NULL, 0);
        if (c == 'e') maxb = strtoull(optarg, NULL, 0);
        if (c == 'f') factor = atof(optarg);
        if (c == 'o') op = optarg;
        if (c == 'n') iters = atoi(optarg);
        if (c == 'w') warmup = atoi(optarg);
        if (c == 'T') min_ms = atol(optarg);
        if (c == 'O') dump = optarg;
    }
    size_t elems = maxb / 4 * (size_t)n + 1;
    float *s = malloc(elems * 4), *r = malloc(elems * 4);
    if (!s || !r) MPI_Abort(MPI_COMM_WORLD, 1);
    /* every page written, as coll-bench's fill() does: pages of a fresh calloc that are
     * only read are all the one zero page, so a send or a broadcast root would read 4 KiB
     * from the caches over and over instead of its buffer (the root of an 8 MiB broadcast
     * then took 0.8 of the time of one whose buffer holds data) */
    for (size_t i = 0; i < elems; i++) {
        s[i] = (float)(rank + 1);
        r[i] = 0.0f;
    }
    if (rank == 0) {
        printf("# mpi_bench: op %s ranks %d float32 iters %d\n", op, n, iters);
        printf("%12s %12s %10s %10s %10s %8s\n", "bytes", "count", "time(us)", "algbw", "busbw",
               "iters");
    }
    for (int si = 0;; si++) {
        if (nsizes && si >= nsizes) break;
        size_t bytes = nsizes ? sizes[si] : minb;
        if (!nsizes)
            for (int k = 0; k < si; k++)
                bytes = (size_t)((double)bytes * factor);
        if (!nsizes && bytes > maxb) break;
        int count = (int)(bytes / 4);
        int it = nsizes ? bench_iters(bytes, iters) : iters;
        int wu = nsizes ? bench_warmup(bytes, warmup, min_ms, si == 0) : warmup;
        double t0 = 0, w0 = MPI_Wtime(), *lat = NULL;
        struct bench_ru ru;
        for (int i = -wu; i < it; i++) {
            if (i == -(wu - wu / 2)) w0 = MPI_Wtime(); /* the warmup's second half */
            if (i == 0) {
                if (min_ms > 0) { /* rank 0's count for all */
                    int timed = wu - wu / 2;
                    long k = long_enough(it, timed ? (MPI_Wtime() - w0) * 1e6 / timed : 0, min_ms);
                    MPI_Bcast(&k, 1, MPI_LONG, 0, MPI_COMM_WORLD);
                    it = (int)k;
                }
                if (dump && !(lat = malloc(sizeof(double) * (size_t)it)))
                    MPI_Abort(MPI_COMM_WORLD, 1);
                MPI_Barrier(MPI_COMM_WORLD);
                bench_ru_start(&ru);
                t0 = MPI_Wtime();
            }
            double o0 = lat ? MPI_Wtime() : 0;
            if (!strcmp(op, "allreduce"))
                MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (!strcmp(op, "allgather"))
                MPI_Allgather(s, count, MPI_FLOAT, r, count, MPI_FLOAT, MPI_COMM_WORLD);
            else if (!strcmp(op, "broadcast"))
                MPI_Bcast(s, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "reduce_scatter"))
                MPI_Reduce_scatter_block(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (lat && i >= 0) lat[i] = (MPI_Wtime() - o0) * 1e6;
        }
        MPI_Barrier(MPI_COMM_WORLD); /* until every rank is done, as coll-bench */
        double t = (MPI_Wtime() - t0) / it * 1e6;
        bench_ru_end(&ru, "mpi", rank, bytes, it);
        if (lat && bench_dump_ops(dump, bytes, rank, lat, it) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
        free(lat);
        double algbw = (double)bytes / t / 1e3, f = 1;
        if (!strcmp(op, "allreduce")) f = 2.0 * (n - 1) / n;
        if (!strcmp(op, "allgather") || !strcmp(op, "reduce_scatter")) {
            algbw *= n;
            f = (double)(n - 1) / n;
        }
        if (rank == 0)
            printf("%12zu %12d %10.2f %10.3f %10.3f %8d\n", bytes, count, t, algbw, algbw * f, it);
        if (!nsizes && bytes == maxb) break;
    }
    MPI_Finalize();
    return 0;
}
