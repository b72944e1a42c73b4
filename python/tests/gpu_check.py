#!/usr/bin/env python3
"""GPU checks of the Python package and the torch backend, on a host with CUDA and the
host's own torch (no pytest needed: the GPU host has none). One GPU: a one-rank NCCL
group. Prints one line per check and the timings; exits 1 on the first failure, 77 when
there is no GPU.

    COLL_AGENT=build/coll-agent COLL_LIB=build/libcoll.so.0 python3 python/tests/gpu_check.py

Timings (interleaved rounds, each op synchronized, as a training step would see one):
dist.all_reduce through coll (coll memory and staged) against ProcessGroupNCCL in the
same process, 8 B to 256 MiB.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Agent, free_port  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    print("skipped: %s has no torch" % sys.executable)
    sys.exit(77)

if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402

import coll  # noqa: E402
import coll.torch  # noqa: E402


def check(what, cond):
    print("%-4s %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        raise SystemExit(1)


agent = Agent('groups:\n  - {name: world, backend: nccl, devices: ["0"], '
              'timeouts: {op_ms: 60000}}\n')
os.environ["COLL_AGENT_SOCKET"] = agent.sock
try:
    torch.cuda.set_device(0)
    dist.init_process_group("coll", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1)
    cg = coll.torch._state["world"].coll
    check("backend %s, torch %s, group %r" % (dist.get_backend(), torch.__version__, cg),
          cg.backend == "nccl")
    conn = cg.conn
    # coll memory on the GPU, through DLPack
    x = conn.zeros(1024, torch.float32, device="cuda:0")
    check("coll.zeros on cuda:0 is a CUDA tensor in coll memory",
          x.is_cuda and conn.find(x) is not None and float(x.sum()) == 0.0)
    # the op follows the stream's earlier work: a slow kernel, then the fill, then the op
    s = torch.cuda.current_stream()
    y = conn.zeros(1024, torch.float32, device="cuda:0")
    torch.cuda._sleep(50_000_000)
    x.fill_(3.0)
    w = cg.allreduce(x, out=y, async_op=True)
    w.wait_stream(s)
    z = y * 2  # on the stream, after the op
    check("an op starts after the stream's earlier work, and the stream waits for it",
          float(z[0]) == 6.0 and float(z[-1]) == 6.0)
    w.wait()
    # torch tensors outside coll memory: staged on the GPU, results back on the stream
    t = torch.arange(1000, device="cuda", dtype=torch.float32)
    dist.all_reduce(t)
    check("dist.all_reduce on an ordinary CUDA tensor (staged)",
          torch.equal(t, torch.arange(1000, device="cuda", dtype=torch.float32)))
    owned = len(conn._owned)
    for _ in range(50):  # each staged op gives its staging memory back for the next
        dist.all_reduce(t)
    check("50 staged ops reuse their staging memory (%d buffers made)"
          % (len(conn._owned) - owned), len(conn._owned) - owned <= 2)
    outs = [torch.zeros(7, device="cuda")]
    dist.all_gather(outs, torch.full((7,), 2.5, device="cuda"))
    check("dist.all_gather (list) on CUDA tensors", float(outs[0][3]) == 2.5)
    o = torch.zeros(5, device="cuda", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(o, torch.full((5,), 1.5, device="cuda",
                                             dtype=torch.bfloat16))
    check("all_gather_into_tensor, bfloat16", float(o[4]) == 1.5)
    fut = dist.all_reduce(torch.ones(3, device="cuda"), async_op=True).get_future()
    check("a CUDA op's future completes", fut.wait()[0].is_cuda)
    # bound ops (coll/_bound.py): a tensor in coll memory is checked once, then each op
    # is two C calls; out of place, so a stream that did not wait would read stale data
    pgw = coll.torch._state["world"]
    bd = pgw._bound
    bx = conn.zeros(256, torch.float32, device="cuda:0")
    bo = conn.zeros(256, torch.float32, device="cuda:0")
    good = True
    for k in range(3):
        torch.cuda._sleep(20_000_000)
        bx.fill_(k + 1.0)
        dist.all_gather_into_tensor(bo, bx)
        z = bo * 2
        bo2 = conn.zeros(256, torch.float32, device="cuda:0")
        dist.reduce_scatter_tensor(bo2, bo)
        dist.broadcast(bo2, 0)
        dist.all_reduce(bo2)
        good = good and float(z[255]) == 2 * (k + 1.0) and float(bo2[7]) == k + 1.0
    check("bound ops (all_gather_into_tensor, reduce_scatter_tensor, broadcast, "
          "all_reduce) follow the stream and it waits for them (%d bindings)" % len(bd.ops),
          good and bd is not None and len(bd.ops) >= 4)
    for _ in range(300):  # no host wait: settled in batches, at most 128 left
        dist.all_reduce(bx)
    check("300 bound ops without a host wait: %d Works left unsettled"
          % len(coll.torch._gpu_pending), len(coll.torch._gpu_pending) <= 129)
    torch.cuda.synchronize()
    nt = conn.zeros((16, 16), torch.float32, device="cuda:0").t()
    nb = len(bd.ops)
    dist.all_reduce(nt)
    check("a tensor that is not contiguous is not bound", len(bd.ops) == nb)
    i16 = conn.zeros(4, torch.int16, device="cuda:0")
    try:
        dist.all_reduce(i16)
        check("int16 on NCCL refused by a bound op", False)
    except coll.CollError as e:
        check("int16 on NCCL refused by a bound op: %s" % e, e.name == "UNSUPPORTED")
    # a binding whose memory is no longer coll's (a pool block torch gave back, its
    # address reused): libcoll refuses it at submission, the binding goes, the op stages
    ot = torch.arange(64, device="cuda", dtype=torch.float32)
    okey = (0, ot.data_ptr(), ot.numel(), ot.dtype, ot.get_device(), "sum")
    fn, args = bd._fn("coll_allreduce", (cg._h, ot.data_ptr(), ot.data_ptr(), 64,
                                          coll._lib.DTYPES["float32"], coll._lib.REDOPS["sum"]))
    bd.ops[okey] = (fn, args, 0, "allreduce (stale)")
    dist.all_reduce(ot)
    check("a stale binding is refused, dropped, and the op staged",
          okey not in bd.ops and torch.equal(ot, torch.arange(64, device="cuda",
                                                              dtype=torch.float32)))

    # the float8s (NCCL's own) and complex numbers (pairs of floats for NCCL; no product)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        fdt = getattr(torch, name, None)
        if fdt is None:
            print("skip %s: torch %s has no such dtype" % (name, torch.__version__))
            continue
        f8 = torch.tensor([0.5, -3.0, 448.0 if name == "float8_e4m3fn" else 57344.0],
                          device="cuda").to(fdt)
        want = f8.clone()
        cg.allreduce(f8, op="max")
        check("allreduce of %s (max, one rank: its own bits)" % name,
              torch.equal(f8.view(torch.uint8), want.view(torch.uint8)))
    cz = torch.tensor([1 + 2j, -3j], device="cuda", dtype=torch.complex64)
    cg.allreduce(cz, op="avg")
    check("allreduce of complex64 (avg)",
          torch.equal(cz, torch.tensor([1 + 2j, -3j], device="cuda", dtype=torch.complex64)))
    try:
        cg.allreduce(cz, op="prod")
        check("a complex product on a GPU group is refused", False)
    except coll.CollError as e:
        check("a complex product on a GPU group is refused: %s" % e,
              e.name == "UNSUPPORTED" and "complex product" in str(e))

    # gather, scatter, alltoallv on a GPU group: coll.h's composite ops, on the stream
    gx = torch.arange(6, device="cuda", dtype=torch.float32)
    gout = cg.gather(gx, root=0)
    sc = torch.zeros(6, device="cuda")
    cg.scatter(gout, sc, root=0)
    av = torch.zeros(6, device="cuda")
    cg.alltoallv(gx, av, [6], [6])
    check("gather, scatter and alltoallv of CUDA tensors (one rank: its own blocks)",
          torch.equal(gout[0], gx) and torch.equal(sc, gx) and torch.equal(av, gx))

    # groups made at run time on a GPU group: children on NCCL, with their own
    # communicators (coll_group_split, and torch's new_group through coll_group_create)
    k = cg.split(0)
    kt = conn.zeros(64, torch.float32, device="cuda:0")
    kt.fill_(1.5)
    k.allreduce(kt)
    check("cg.split(0) of a GPU group is a child on %s; its allreduce" % k.backend,
          k.backend == "nccl" and float(kt[63]) == 1.5)
    k.close()
    sub = dist.new_group([0])
    try:
        kind = sub._get_backend(torch.device("cuda")).coll.backend
    except Exception as e:  # torch 1.x has no per-device backends
        kind = "unknown (%s)" % type(e).__name__
    st = torch.arange(10, device="cuda", dtype=torch.float32)
    dist.all_reduce(st, group=sub)
    check("dist.new_group([0]) on a GPU group: all_reduce on the child (backend %s)" % kind,
          torch.equal(st, torch.arange(10, device="cuda", dtype=torch.float32)))

    nccl = dist.new_group(backend="nccl")

    # a torch memory pool in coll memory (coll_alloc_hook behind CUDAPluggableAllocator):
    # tensors made in it, DDP's parameters and buckets, never stage
    takes = []
    stage_take = conn._stage_take
    conn._stage_take = lambda n, d: (takes.append(n), stage_take(n, d))[1]
    calls = {"allreduce": 0}
    pg_allreduce = coll.torch.ProcessGroupColl.allreduce

    def counted(self, *a, **k):
        calls["allreduce"] += 1
        return pg_allreduce(self, *a, **k)

    coll.torch.ProcessGroupColl.allreduce = counted
    pool = None
    if hasattr(torch.cuda, "MemPool"):
        pool = coll.torch.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            pt = torch.full((1 << 20,), 2.0, device="cuda")
        check("a tensor made in coll.torch.mem_pool() is in coll memory",
              conn.find(pt) is not None)
        dist.all_reduce(pt)
        torch.cuda.synchronize()
        check("dist.all_reduce on it runs in place (no staging)",
              not takes and float(pt[12345]) == 2.0)

        def make():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 10)).cuda()

        DDP = torch.nn.parallel.DistributedDataParallel
        with torch.cuda.use_mem_pool(pool):
            mine = DDP(make(), device_ids=[0], gradient_as_bucket_view=True)
        ref = DDP(make(), device_ids=[0], gradient_as_bucket_view=True, process_group=nccl)
        losses = {}
        n0, t0 = calls["allreduce"], len(takes)

        def steps(name, m):
            opt = torch.optim.SGD(m.parameters(), lr=0.05)
            torch.manual_seed(1)
            for _ in range(5):
                x = torch.randn(32, 256, device="cuda")
                loss = m(x).square().mean()
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
                losses.setdefault(name, []).append(float(loss.detach()))

        # the steps too: DDP rebuilds its buckets in the first backward
        with torch.cuda.use_mem_pool(pool):
            steps("coll", mine)
        steps("nccl", ref)
        same = all(torch.equal(a, b) for a, b in zip(mine.parameters(), ref.parameters()))
        check("DDP in the pool: 5 steps equal to DDP on ProcessGroupNCCL bit for bit "
              "(losses %s / %s)" % (losses["coll"][-1], losses["nccl"][-1]),
              same and losses["coll"] == losses["nccl"])
        check("DDP in the pool: %d bucket allreduces, %d staged (%d at DDP's construction), "
              "its parameters in coll memory" % (calls["allreduce"] - n0, len(takes) - t0, t0),
              calls["allreduce"] > n0 and len(takes) == t0 and
              all(conn.find(p) is not None for p in mine.parameters()))
    else:
        print("skip the memory pool: torch %s has no torch.cuda.MemPool" % torch.__version__)

    # timings: coll (coll memory), coll on a child of the same rank, coll (staged) and
    # ProcessGroupNCCL, interleaved
    sizes = [8, 1 << 20, 64 << 20, 256 << 20]
    rounds = 5
    cells = {}
    for r in range(rounds):
        for size in sizes:
            n = max(1, size // 4)
            bufs = {"coll": conn.zeros(n, torch.float32, device="cuda:0"),
                    "coll-child": conn.zeros(n, torch.float32, device="cuda:0"),
                    "coll-py": conn.zeros(n, torch.float32, device="cuda:0"),
                    "coll-staged": torch.zeros(n, device="cuda"),
                    "nccl": torch.zeros(n, device="cuda")}
            bufs["coll-unbound"] = conn.zeros(n, torch.float32, device="cuda:0")
            order = ["coll", "coll-staged", "coll-py", "nccl", "coll-child", "coll-unbound"]
            if pool is not None:  # torch's tensor in the pool: coll memory too
                with torch.cuda.use_mem_pool(pool):
                    bufs["coll-pool"] = torch.zeros(n, device="cuda")
                order.append("coll-pool")
            iters = 200 if size <= 1 << 20 else 10
            k = r % len(order)
            for v in order[k:] + order[:k]:
                buf, grp = bufs[v], {"nccl": nccl, "coll-child": sub}.get(v)

                def one():
                    if v == "coll-py":  # coll's own API, the same stream discipline
                        q = cg.allreduce(buf, async_op=True)
                        q.wait_stream(torch.cuda.current_stream())
                        torch.cuda.synchronize()
                        q.wait()
                    elif v == "coll-unbound":  # the general way (no binding), for A/B
                        pgw._bound = None
                        dist.all_reduce(buf)
                        pgw._bound = bd
                        torch.cuda.synchronize()
                    else:
                        dist.all_reduce(buf, group=grp)
                        torch.cuda.synchronize()

                for _ in range(5):
                    one()
                t0 = time.perf_counter()
                for _ in range(iters):
                    one()
                cells.setdefault((size, v), []).append((time.perf_counter() - t0) / iters * 1e6)
    print("\ndist.all_reduce, one rank on %s, synchronized after each op, median of %d "
          "interleaved rounds (us per op)" % (torch.cuda.get_device_name(0), rounds))
    print("| bytes | coll | coll-staged | coll-py | nccl | nccl/coll | nccl/staged "
          "| coll-child | child/coll | coll-pool | coll-unbound | unbound/coll |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sizes:
        m = {v: statistics.median(cells[(size, v)])
             for v in ("coll", "coll-staged", "coll-py", "nccl", "coll-child", "coll-pool",
                       "coll-unbound")
             if (size, v) in cells}
        print("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %.2f | %s | %.1f | %.2f |"
              % (size, m["coll"], m["coll-staged"], m["coll-py"], m["nccl"],
                 m["nccl"] / m["coll"], m["nccl"] / m["coll-staged"], m["coll-child"],
                 m["coll-child"] / m["coll"],
                 "%.1f" % m["coll-pool"] if "coll-pool" in m else "-", m["coll-unbound"],
                 m["coll-unbound"] / m["coll"]))

    # FSDP on the coll backend (one rank: its collectives run, the sums are of one),
    # the model's memory in the pool; against the same model trained alone
    if pool is not None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def train(m):
            opt = torch.optim.SGD(m.parameters(), lr=0.05)
            torch.manual_seed(1)
            out = []
            for _ in range(5):
                x = torch.randn(32, 256, device="cuda")
                loss = m(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                out.append(float(loss.detach()))
            return out

        n0 = len(takes)
        with torch.cuda.use_mem_pool(pool):
            f1 = FSDP(make(), device_id=0)
        a, b = train(f1), train(make())
        check("FSDP (FullyShardedDataParallel) on coll, in the pool: losses %s, alone %s, "
              "%d staged" % (a[-1], b[-1], len(takes) - n0),
              max(abs(x - y) for x, y in zip(a, b)) <= 1e-6 * max(abs(y) for y in b))
        fully_shard = getattr(torch.distributed.fsdp, "fully_shard", None)
        if fully_shard is not None:
            m2 = make()
            fully_shard(m2)
            a2 = train(m2)
            check("FSDP2 (fully_shard) on coll: losses %s, alone %s" % (a2[-1], b[-1]),
                  max(abs(x - y) for x, y in zip(a2, b)) <= 1e-6 * max(abs(y) for y in b))
        else:
            print("skip FSDP2: torch %s has no fully_shard" % torch.__version__)
    coll.torch.ProcessGroupColl.allreduce = pg_allreduce
    conn._stage_take = stage_take

    # torch's split_group, as init_process_group(device_id=...) enables it (and DeviceMesh
    # then takes it for its dimensions): a child of the GPU group, then FSDP2 on a mesh
    if hasattr(dist, "split_group"):
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
        sp = dist.split_group(split_ranks=[[0]])
        st = torch.arange(6, device="cuda", dtype=torch.float32)
        dist.all_reduce(st, group=sp)
        check("dist.split_group([[0]]) of a GPU group: a coll child (%s), its all_reduce" %
              sp._get_backend(torch.device("cuda")).coll.backend,
              torch.equal(st, torch.arange(6, device="cuda", dtype=torch.float32)))
        fully_shard = getattr(torch.distributed.fsdp, "fully_shard", None)
        if fully_shard is not None and pool is not None:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("dp", "tp"))
            m3 = make()
            fully_shard(m3, mesh=mesh["dp"])
            a3 = train(m3)
            check("FSDP2 on a 2-D DeviceMesh of coll (its groups by split_group): losses %s, "
                  "alone %s" % (a3[-1], b[-1]),
                  max(abs(x - y) for x, y in zip(a3, b)) <= 1e-6 * max(abs(y) for y in b))
    else:
        print("skip split_group: torch %s has none" % torch.__version__)
    dist.destroy_process_group()
finally:
    rc = agent.stop()
    if rc != 0:
        print(agent.read_log())
print("gpu checks passed")
