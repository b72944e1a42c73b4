#!/usr/bin/python3
"""torch.distributed on coll against Gloo, from one process per pod (bench/python.sh
starts the agents and the ranks). Not part of the product.

    python_bench.py RANK WORLD PORT SIZES ROUNDS ITERS [LABEL]

Per round, per op and size, the variants take turns (the order rotates every round), all
in these processes, on the same agents:
  coll         dist.* on backend coll, tensors in coll memory (coll.zeros)
  coll-plain   dist.* on backend coll, ordinary tensors, taken as they are where the op
               runs in this process (the backend's COLL_DIRECT=all)
  coll-staged  the same, copied in and out of coll memory (as coll-plain was before
               libcoll took memory outside its buffers; the group's _raw_try off)
  coll-py      coll's own Python API (Group.allreduce ...) on coll memory, no torch
  gloo         dist.* on a Gloo group of the same ranks
  null         dist.* on a backend that does nothing: torch's own dispatch cost
Rank 0 prints "LABEL ROUND OP BYTES VARIANT US" per cell (microseconds per op).
With DDP=1 in the environment, also "ddp_step": one training step of a small model
(two linear layers, 526k parameters, 2.1 MB of gradients in DDP's buckets, batch 32) under
DistributedDataParallel over coll (DDP's buckets are torch's memory: coll-plain and
coll-staged) and over Gloo, taking turns the same way; BYTES is the gradients' size.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import coll
import coll.torch
from torch._C._distributed_c10d import _create_work_from_future

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sizes = [int(x) for x in sys.argv[4].split(",")]
rounds, iters0 = int(sys.argv[5]), int(sys.argv[6])
label = sys.argv[7] if len(sys.argv) > 7 else "-"


class NullPG(dist.ProcessGroup):
    """Every op done at once: what torch costs around a Python backend."""

    def __init__(self, rank, size):
        super().__init__(rank, size)

    def getBackendName(self):
        return "null"

    def _done(self, v):
        f = torch.futures.Future()
        f.set_result(v)
        return _create_work_from_future(f)

    def allreduce(self, t, opts=None):
        return self._done(t)

    def broadcast(self, t, opts=None):
        return self._done(t)

    def allgather(self, o, i, opts=None):
        return self._done(o)

    def _reduce_scatter_base(self, o, i, opts=None):
        return self._done([o])

    def barrier(self, opts=None):
        return self._done([])


dist.Backend.register_backend("null", lambda o, p=None: NullPG(o.group_rank, o.group_size),
                              extended_api=True)
dist.init_process_group("coll", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                        world_size=world)
gloo = dist.new_group(backend="gloo")
null = dist.new_group(backend="null")
cg = coll.torch._state["world"].coll  # the coll group behind the default group
conn = cg.conn

OPS = ["all_reduce", "all_gather", "broadcast", "reduce_scatter"]


def tensors(op, n, where):
    mk = (lambda k: conn.zeros(k, torch.float32)) if where == "coll" else \
        (lambda k: torch.zeros(k))
    x = mk(n * (world if op == "reduce_scatter" else 1))
    x.fill_(1.0)
    out = mk(n * world) if op == "all_gather" else mk(n)
    return x, out


def runner(op, variant, n):
    where = "coll" if variant in ("coll", "coll-py") else "plain"
    cg._raw_try = variant != "coll-staged"
    x, out = tensors(op, n, where)
    if variant == "coll-py":
        if op == "all_reduce":
            return lambda: cg.allreduce(x)
        if op == "all_gather":
            return lambda: cg.allgather(x, out=out)
        if op == "broadcast":
            return lambda: cg.broadcast(x)
        return lambda: cg.reduce_scatter(x, out=out)
    group = {"gloo": gloo, "null": null}.get(variant)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(x, 0, group=group)
    if op == "all_gather":  # the list form: Gloo (torch 1.13) has no _allgather_base
        outs = list(out.chunk(world))
        return lambda: dist.all_gather(outs, x, group=group)
    if variant == "gloo":
        return None  # Gloo (torch 1.13) has no reduce_scatter
    return lambda: dist._reduce_scatter_base(out, x, group=group)


def ddp_runner(variant):
    from torch import nn

    torch.manual_seed(0)  # the same parameters on every rank
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
    cg._raw_try = variant != "coll-staged"
    ddp = nn.parallel.DistributedDataParallel(model, process_group=gloo if variant == "gloo"
                                              else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 256, generator=g), torch.randn(32, 256, generator=g)

    def step():
        opt.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
    return step


VARIANTS = ["coll", "coll-plain", "coll-staged", "coll-py", "gloo", "null"]
if os.environ.get("DDP") == "1":
    ddp_bytes = 4 * (256 * 1024 + 1024 + 1024 * 256 + 256)
    for r in range(rounds):
        order = ["coll-plain", "coll-staged", "gloo"]
        order = order[r % 3:] + order[:r % 3]
        for v in order:
            f = ddp_runner(v)
            dist.barrier(group=gloo)
            for _ in range(5):
                f()
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            steps = max(10, iters0 // 4)
            for _ in range(steps):
                f()
            us = (time.perf_counter() - t0) / steps * 1e6
            if rank == 0:
                print("%s %d ddp_step %d %s %.2f" % (label, r, ddp_bytes, v, us), flush=True)
    if os.environ.get("DDP_ONLY") == "1":
        rounds = 0
for r in range(rounds):
    for op in OPS:
        for size in sizes:
            n = max(1, size // 4)
            iters = iters0 if size <= 1 << 20 else max(3, min(iters0, (256 << 20) // size))
            k = (r + OPS.index(op)) % len(VARIANTS)
            for v in VARIANTS[k:] + VARIANTS[:k]:
                f = runner(op, v, n)
                if f is None:
                    continue
                dist.barrier(group=gloo)
                for _ in range(max(2, iters // 10)):
                    f()
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                for _ in range(iters):
                    f()
                us = (time.perf_counter() - t0) / iters * 1e6
                if rank == 0:
                    print("%s %d %s %d %s %.2f" % (label, r, op, size, v, us), flush=True)
dist.barrier(group=gloo)
dist.destroy_process_group()
