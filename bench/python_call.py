#!/usr/bin/python3
"""coll's own Python call against the same op from C (bench/python_c.sh runs it beside
coll-bench). One process per pod: N allreduces of COUNT float32 in coll memory, timed
on rank 0 after a barrier, printed as "python US" (µs per op). Not part of the product.

    python_call.py SOCKET GROUP BYTES ITERS [raw|prepared|torch|null]

raw: the two C calls through ctypes, without the package; prepared: Group.prepare's op;
torch: dist.all_reduce on the torch backend "coll" (a tensor in coll memory; $TORCH_PORT:
the TCP store's port); null: dist.all_reduce on a backend that does nothing (torch's own
dispatch).
"""
import sys
import time

import numpy as np

import coll

sock, group, nbytes, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else ""
conn = coll.connect(sock)
g = conn.open(group)
x = conn.zeros(max(1, nbytes // 4), np.float32)
for _ in range(50):
    g.allreduce(x)
g.barrier()
if mode in ("torch", "null"):
    import os

    import torch
    import torch.distributed as dist

    import coll.torch

    rank, size = g.rank, g.size
    g.close()
    conn.close()
    os.environ.update(COLL_AGENT_SOCKET=sock, COLL_GROUP=group)
    if mode == "null":  # as bench/python_bench.py's: every op done at once
        from torch._C._distributed_c10d import _create_work_from_future

        class _Null(dist.ProcessGroup):
            def getBackendName(self):
                return "null"

            def allreduce(self, tensors, opts=None):
                f = torch.futures.Future()
                f.set_result(tensors)
                return _create_work_from_future(f)

        dist.Backend.register_backend("null", lambda o, p=None: _Null(o.group_rank, o.group_size),
                                      extended_api=True)
    dist.init_process_group("coll", init_method="tcp://127.0.0.1:%s" % os.environ["TORCH_PORT"],
                            rank=rank, world_size=size)
    g = coll.torch._state["world"].coll
    t = g.conn.zeros(max(1, nbytes // 4), torch.float32)
    pg = dist.new_group(backend="null") if mode == "null" else None
    for _ in range(50):
        dist.all_reduce(t, group=pg)
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=pg)
elif mode == "raw":  # the two C calls alone, through ctypes
    import ctypes

    from coll import _lib as L

    lib, r, h, c, p = coll.lib(), L.Request(), g.handle, conn.handle, x.ctypes.data
    pr, n = ctypes.byref(r), x.size
    t0 = time.perf_counter()
    for _ in range(iters):
        lib.coll_allreduce(h, p, p, n, 8, 0, None, pr)
        lib.coll_wait(c, r, -1)
elif mode == "prepared":
    op = g.prepare("allreduce", x)
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
else:
    t0 = time.perf_counter()
    for _ in range(iters):
        g.allreduce(x)
us = (time.perf_counter() - t0) / iters * 1e6
g.barrier()
if g.rank == 0:
    print("python %.2f" % us, flush=True)
if mode in ("torch", "null"):
    dist.destroy_process_group()
else:
    conn.close()
