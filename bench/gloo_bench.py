#!/usr/bin/python3
"""Second reference for coll-bench across agents: torch.distributed with the Gloo backend
(Debian's python3-torch), the same ops, sizes and columns. bench/compare.sh runs it when
torch imports. Not part of the product.

    gloo_bench.py RANK WORLD PORT OP SIZE,SIZE... ITERS [WARMUP [MIN_MS]]

ITERS up to 1 MiB, then about 256 MiB of data per size, at least 3 (coll-bench -L's rule);
WARMUP untimed ops first (default 3; 1 above 1 MiB; 10x for the first size; as coll-bench
and mpi_bench); with MIN_MS, more iterations where ITERS would take less than MIN_MS
at rank 0's warmup time per op (at most 100000; coll-bench -T).
"""
import datetime
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

rank, world, port, op = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sizes, iters0 = [int(x) for x in sys.argv[5].split(",")], int(sys.argv[6])
warmup0 = int(sys.argv[7]) if len(sys.argv) > 7 else 3
min_ms = int(sys.argv[8]) if len(sys.argv) > 8 else 0
# a deadline for the store and every op: a rank whose peer never came (its port taken)
# ends instead of waiting for good
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=120))
if rank == 0:
    print(f"# gloo_bench: op {op} ranks {world} float32 iters {iters0}")
    print("%12s %12s %10s %10s %10s %8s" % ("bytes", "count", "time(us)", "algbw", "busbw",
                                           "iters"))
for size in sizes:
    iters = iters0 if size <= 1 << 20 else max(3, min(iters0, (256 << 20) // size))
    count = max(size // 4, 1)
    s = torch.ones(count * (world if op == "reduce_scatter" else 1))
    r = torch.zeros(count)
    outs = [torch.zeros(count) for _ in range(world)]
    ins = list(s.chunk(world)) if op == "reduce_scatter" else None

    def run():
        if op == "allreduce":
            dist.all_reduce(s)
        elif op == "allgather":
            dist.all_gather(outs, s)
        elif op == "broadcast":
            dist.broadcast(s, 0)
        elif op == "reduce_scatter":
            dist.reduce_scatter(r, ins)  # Gloo may not implement it

    try:
        big = (2 if min_ms > 0 else 1) * (2 if size == sizes[0] else 1)  # bench_warmup
        wu = warmup0 * (10 if size == sizes[0] else 1) if size <= 1 << 20 else big
        w0 = time.perf_counter()
        for i in range(wu):
            if i == wu // 2:  # the pace of the warmup's second half (coll-bench -T)
                w0 = time.perf_counter()
            run()
        if min_ms > 0 and wu:  # rank 0's count for all
            per_us = max((time.perf_counter() - w0) / (wu - wu // 2) * 1e6, 1e-3)
            k = torch.tensor([min(100000, max(iters, int(min_ms * 1e3 / per_us)))],
                             dtype=torch.int64)
            dist.broadcast(k, 0)
            iters = int(k.item())
        dist.barrier()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        dist.barrier()  # until every rank is done, as coll-bench and mpi_bench
        t = (time.perf_counter() - t0) / iters * 1e6
        if os.environ.get("BENCH_RUSAGE") == "1":  # as bench_iters.h's bench_ru_end
            ru = resource.getrusage(resource.RUSAGE_SELF)
            cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
            print("#rusage gloo rank %d bytes %d ops %d sleeps/op %.4f preempted/op %.4f "
                  "cpu_us/op %.3f faults/op %.3f"
                  % (rank, size, iters, (ru.ru_nvcsw - ru0.ru_nvcsw) / iters,
                     (ru.ru_nivcsw - ru0.ru_nivcsw) / iters, cpu * 1e6 / iters,
                     (ru.ru_minflt - ru0.ru_minflt) / iters),
                  file=sys.stderr, flush=True)
    except RuntimeError as e:
        if rank == 0:
            print(f"# {op}: {str(e).splitlines()[0]}")
        break
    algbw = size / t / 1e3
    f = 2.0 * (world - 1) / world if op == "allreduce" else 1.0
    if op in ("allgather", "reduce_scatter"):
        algbw *= world
        f = (world - 1) / world
    if rank == 0:
        print("%12d %12d %10.2f %10.3f %10.3f %8d" % (size, count, t, algbw, algbw * f, iters),
              flush=True)
dist.destroy_process_group()
