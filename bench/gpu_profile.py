#!/usr/bin/env python3
"""Where an 8 B dist.all_reduce on the coll backend spends its time on one GPU, against
ProcessGroupNCCL and a backend that does nothing (torch's own dispatch), in the same
process: the parts of the Python path timed one by one, then a cProfile of the op.

    COLL_AGENT=build/coll-agent COLL_LIB=build/libcoll.so.0 PYTHONPATH=python \
        python3 bench/gpu_profile.py [ITERS]

Prints µs per call (median of 5 interleaved rounds) and the profile's top entries
(PROFILE=0: the timings only). Exits 77 without a GPU.
"""
import cProfile
import ctypes
import inspect
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
from conftest import Agent, free_port  # noqa: E402

import torch  # noqa: E402

if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402

import coll  # noqa: E402
import coll.torch  # noqa: E402
from coll import _lib as L  # noqa: E402
from coll._core import lib, view  # noqa: E402

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 2000


class _NoopWork(dist._Work if hasattr(dist, "_Work") else torch._C._distributed_c10d.Work):
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class _Noop(dist.ProcessGroup):
    """torch's dispatch into a Python backend, and nothing else."""

    def __init__(self, rank, size):
        super().__init__(rank, size)

    def allreduce(self, tensors, opts=None):
        return _NoopWork()

    def getBackendName(self):
        return "noop"


def _noop_create(*a):
    if hasattr(a[0], "group_rank"):  # extended_api: (common options, backend options)
        return _Noop(a[0].group_rank, a[0].group_size)
    return _Noop(a[1], a[2])  # (store, rank, size, timeout)


def timed(fn, iters):
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


agent = Agent('groups:\n  - {name: world, backend: nccl, devices: ["0"], '
              'timeouts: {op_ms: 60000}}\n')
os.environ["COLL_AGENT_SOCKET"] = agent.sock
try:
    torch.cuda.set_device(0)
    kw = {"extended_api": True} if "extended_api" in inspect.signature(
        dist.Backend.register_backend).parameters else {}
    dist.Backend.register_backend("noop", _noop_create, devices=["cpu", "cuda"], **kw)
    dist.init_process_group("coll", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1)
    cg = coll.torch._state["world"].coll
    conn = cg.conn
    nccl = dist.new_group(backend="nccl")
    try:
        noop = dist.new_group(backend="noop")
    except Exception as e:  # noqa: BLE001
        print("noop backend not made: %s: %s" % (type(e).__name__, e))
        noop = None
    x = conn.zeros(2, torch.float32, device="cuda:0")
    y = torch.zeros(2, device="cuda")
    # independent chains: four tensors in turn, no op waiting on the one before's output
    xs = [conn.zeros(2, torch.float32, device="cuda:0") for _ in range(4)]
    ys = [torch.zeros(2, device="cuda") for _ in range(4)]
    turn = [0]

    def round_robin(ts, group=None):
        def f():
            turn[0] = (turn[0] + 1) % 4
            dist.all_reduce(ts[turn[0]], group=group)
        return f

    s = torch.cuda.current_stream()
    h = conn.handle

    wait_stream = lib().coll_wait_stream  # not in the package's table: declared here
    wait_stream.argtypes = [ctypes.c_void_p, L.Request, ctypes.c_void_p]
    wait_stream.restype = ctypes.c_int

    def c_op():  # libcoll's calls alone, as coll-bench's GPU path makes them
        r = L.Request()
        if lib().coll_allreduce(cg.handle, x.data_ptr(), x.data_ptr(), 2, L.DTYPES["float32"],
                                L.REDOPS["sum"], s.cuda_stream, ctypes.byref(r)) or \
                wait_stream(h, r, s.cuda_stream):
            raise RuntimeError(lib().coll_last_error().decode())

    def coll_py():  # coll's own call, the same stream discipline; the host reaps it
        q = cg.allreduce(x, async_op=True)
        q.wait_stream(s)
        torch.cuda.synchronize()
        q.wait()

    def sync(fn):
        def f():
            fn()
            torch.cuda.synchronize()
        return f

    pgw = coll.torch._state["world"]
    bound = pgw._bound

    def unbound():  # the general way, without coll/_bound.py's binding
        pgw._bound = None
        dist.all_reduce(x)
        pgw._bound = bound

    cases = {
        "coll dist.all_reduce": sync(lambda: dist.all_reduce(x)),
        "coll dist.all_reduce, unbound": sync(unbound),
        "coll dist.all_reduce, no sync": lambda: dist.all_reduce(x),
        "nccl dist.all_reduce": sync(lambda: dist.all_reduce(y, group=nccl)),
        "nccl dist.all_reduce, no sync": lambda: dist.all_reduce(y, group=nccl),
        "coll dist.all_reduce, 4 tensors in turn, no sync": round_robin(xs),
        "nccl dist.all_reduce, 4 tensors in turn, no sync": round_robin(ys, nccl),
        "coll g.allreduce async + wait_stream": coll_py,
        "libcoll calls (ctypes)": sync(c_op),
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "torch.cuda.current_stream(0)": lambda: torch.cuda.current_stream(0),
        "view(x)": lambda: view(x),
        "conn._in_coll(view(x))": lambda: conn._in_coll(view(x)),
        "x.data_ptr()": x.data_ptr,
    }
    if noop is not None:
        cases["noop dist.all_reduce"] = lambda: dist.all_reduce(y, group=noop)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        cases["torch._C._cuda_getCurrentRawStream(0)"] = lambda: raw(0)
    cells = {}
    names = list(cases)
    for r in range(5):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            try:
                cells.setdefault(name, []).append(timed(cases[name], ITERS))
            except Exception as e:  # noqa: BLE001
                print("%s: %s: %s" % (name, type(e).__name__, e), flush=True)
                torch.cuda.synchronize()
    print("\n8 B all_reduce on one %s, torch %s, µs per call, median of 5 interleaved rounds "
          "of %d" % (torch.cuda.get_device_name(0), torch.__version__, ITERS))
    print("| what | µs | min | max |\n|---|---:|---:|---:|")
    for name in names:
        v = cells.get(name)
        if not v:
            continue
        print("| %s | %.2f | %.2f | %.2f |" % (name, statistics.median(v), min(v), max(v)))

    if os.environ.get("PROFILE", "1") == "0":
        dist.destroy_process_group()
        sys.exit(0)
    for what, fn in (("coll dist.all_reduce + synchronize", cases["coll dist.all_reduce"]),):
        p = cProfile.Profile()
        p.enable()
        for _ in range(ITERS):
            fn()
        p.disable()
        torch.cuda.synchronize()
        print("\ncProfile: %s, %d calls, by own time" % (what, ITERS))
        pstats.Stats(p, stream=sys.stdout).sort_stats("tottime").print_stats(25)

    dist.destroy_process_group()
finally:
    agent.stop()
