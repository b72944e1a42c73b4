#!/usr/bin/env python3
"""Two ranks of the torch backend on NCCL, each on a pod of its own (its own agent), on a
host with one GPU: every agent and every rank names a host of its own to NCCL
(NCCL_HOSTID), so the two ranks talk over NCCL's network transport as pods on two nodes
do, and NCCL does not refuse them as two ranks on one GPU of one host (test_gpu's
two_pods_one_gpu_each does the same in C). Where the host has two GPUs, rank i takes GPU i.

Checks, on both ranks, each element exactly: all_reduce (staged and in coll memory),
all_gather_into_tensor, reduce_scatter_tensor, broadcast, all_to_all_single, send/recv,
a chain of 50 dependent all_reduces with no host wait, new_group([0, 1]) (a child across
pods on a communicator of its own, its id from the coordinator) with an all_reduce and a
broadcast from rank 1, and DDP: 5 steps in coll memory (torch's pool) bit for bit equal to the same 5 steps on
ProcessGroupNCCL. Then timings against ProcessGroupNCCL in the same processes, each op
synchronized, interleaved rounds. Prints one line per check; exits 1 on a failure, 77
without CUDA.

    COLL_AGENT=build/coll-agent COLL_LIB=build/libcoll.so.0 PYTHONPATH=python \\
        python3 python/tests/gpu_pair_check.py [ITERS]
"""
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def rank_main(rank, sock, init, iters):
    os.environ["COLL_AGENT_SOCKET"] = sock
    os.environ["NCCL_HOSTID"] = "coll-pair-rank-%d" % rank  # for ProcessGroupNCCL
    import torch
    import torch.distributed as dist

    import coll
    import coll.torch

    def check(what, cond):
        print("%-4s rank %d: %s" % ("ok" if cond else "FAIL", rank, what), flush=True)
        if not cond:
            raise SystemExit(1)

    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("coll", init_method=init, rank=rank, world_size=2)
    cg = coll.torch._state["world"].coll
    conn = cg.conn
    check("backend coll on %s, torch %s, group %r" % (torch.cuda.get_device_name(dev),
                                                      torch.__version__, cg),
          cg.backend == "nccl" and cg.size == 2 and cg.rank == rank)
    cuda = "cuda:%d" % dev
    other = 1 - rank

    t = torch.full((1000,), float(rank + 1), device=cuda)
    dist.all_reduce(t)
    check("all_reduce of an ordinary tensor (staged)", bool((t == 3.0).all()))
    n = 1 << 18
    x = conn.zeros(n, torch.float32, device=cuda)
    x.copy_(torch.arange(n, device=cuda, dtype=torch.float32) * (rank + 1))
    dist.all_reduce(x)
    check("all_reduce in coll memory (1 MiB)",
          torch.equal(x, torch.arange(n, device=cuda, dtype=torch.float32) * 3))
    out = conn.zeros(2 * n, torch.float32, device=cuda)
    dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=cuda))
    check("all_gather_into_tensor", float(out[n - 1]) == 0.0 and float(out[n]) == 1.0)
    rs = conn.zeros(n, torch.float32, device=cuda)
    src = torch.arange(2 * n, device=cuda, dtype=torch.float32) + rank
    dist.reduce_scatter_tensor(rs, src)
    want = 2 * torch.arange(rank * n, (rank + 1) * n, device=cuda, dtype=torch.float32) + 1
    check("reduce_scatter_tensor", torch.equal(rs, want))
    b = torch.full((77,), float(rank * 10 + 5), device=cuda)
    dist.broadcast(b, 1)
    check("broadcast from rank 1", bool((b == 15.0).all()))
    a2a_in = torch.tensor([rank * 2.0, rank * 2.0 + 1], device=cuda)
    a2a_out = torch.zeros(2, device=cuda)
    dist.all_to_all_single(a2a_out, a2a_in)
    check("all_to_all_single", a2a_out.tolist() == [float(rank), float(2 + rank)])
    p = torch.arange(33, device=cuda, dtype=torch.float32) * (rank + 1)
    if rank == 0:
        dist.send(p, 1)
    else:
        dist.recv(p, 0)
    check("send/recv", torch.equal(p, torch.arange(33, device=cuda, dtype=torch.float32)))
    c = conn.zeros(4096, torch.float32, device=cuda)
    c.fill_(1.0)
    for _ in range(50):  # 1 + 1 = 2, halved: 1 again, only if every op saw the last
        dist.all_reduce(c)
        c.div_(2)
    torch.cuda.synchronize()
    check("50 dependent all_reduces, no host wait", bool((c == 1.0).all()))
    # a child across pods of a GPU group: its own communicator, ranks in the list's order
    sub = dist.new_group([0, 1])
    x = torch.full((9,), float(rank + 1), device=cuda)
    dist.all_reduce(x, group=sub)
    y = torch.full((9,), float(10 + rank), device=cuda)
    dist.broadcast(y, src=1, group=sub)
    torch.cuda.synchronize()
    check("new_group([0, 1]) across pods of a GPU group: all_reduce and broadcast",
          bool((x == 3.0).all()) and bool((y == 11.0).all()))
    dist.barrier()

    nccl = dist.new_group(backend="nccl")
    pool = coll.torch.mem_pool() if hasattr(torch.cuda, "MemPool") else None

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 10)).to(cuda)

    DDP = torch.nn.parallel.DistributedDataParallel

    def steps(m, losses):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        torch.manual_seed(1 + rank)  # each rank its own data
        for _ in range(5):
            inp = torch.randn(32, 256, device=cuda)
            loss = m(inp).square().mean()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    lc, ln = [], []
    if pool is not None:
        with torch.cuda.use_mem_pool(pool):
            mine = DDP(make(), device_ids=[dev], gradient_as_bucket_view=True)
            steps(mine, lc)
    else:
        mine = DDP(make(), device_ids=[dev])
        steps(mine, lc)
    ref = DDP(make(), device_ids=[dev], process_group=nccl)
    steps(ref, ln)
    same = all(torch.equal(u, v) for u, v in zip(mine.parameters(), ref.parameters()))
    check("DDP%s: 5 steps equal to ProcessGroupNCCL's bit for bit (losses %s / %s)"
          % (" in coll memory" if pool is not None else "", lc[-1], ln[-1]),
          same and lc == ln)

    sizes = [8, 1 << 20, 64 << 20]
    cells = {}
    for r in range(5):
        for size in sizes:
            cnt = max(1, size // 4)
            bufs = {"coll": conn.zeros(cnt, torch.float32, device=cuda),
                    "nccl": torch.zeros(cnt, device=cuda)}
            it = iters if size <= 1 << 20 else max(5, iters // 20)
            order = ["coll", "nccl"] if r % 2 == 0 else ["nccl", "coll"]
            for v in order:
                buf, grp = bufs[v], nccl if v == "nccl" else None
                for _ in range(5):
                    dist.all_reduce(buf, group=grp)
                    torch.cuda.synchronize()
                dist.barrier(group=grp)
                t0 = time.perf_counter()
                for _ in range(it):
                    dist.all_reduce(buf, group=grp)
                    torch.cuda.synchronize()
                cells.setdefault((size, v), []).append((time.perf_counter() - t0) / it * 1e6)
    if rank == 0:
        print("\ndist.all_reduce, 2 ranks (two agents, NCCL_HOSTID) on %d GPU(s): %s, "
              "torch %s, synchronized after each op, median of 5 interleaved rounds "
              "(us per op; rounds' nccl/coll)" % (torch.cuda.device_count(),
                                                   torch.cuda.get_device_name(dev),
                                                   torch.__version__))
        print("| bytes | coll | nccl | nccl/coll | rounds |")
        print("|---:|---:|---:|---:|---|")
        for size in sizes:
            co, nc = cells[(size, "coll")], cells[(size, "nccl")]
            print("| %d | %.1f | %.1f | %.2f | %s |" % (
                size, statistics.median(co), statistics.median(nc),
                statistics.median(nc) / statistics.median(co),
                " ".join("%.2f" % (b / a) for a, b in zip(co, nc))), flush=True)
    dist.destroy_process_group()


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    from conftest import Agent, free_port

    probe = subprocess.run([sys.executable, "-c",
                            "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        print("skipped: %s has no torch" % sys.executable)
        return 77
    if int(probe.stdout.strip() or 0) < 1:
        print("skipped: no CUDA device")
        return 77
    ngpu = int(probe.stdout.strip())
    port, agents = free_port(), []
    try:
        for i in range(2):
            os.environ["NCCL_HOSTID"] = "coll-pair-pod-%d" % i
            agents.append(Agent(
                "node:\n  index: %d\n  name: pod-%d\n"
                "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                "groups:\n  - name: world\n    backend: nccl\n    members: 2\n"
                "    devices: [\"%d\"]\n"
                "    timeouts: {op_ms: 60000, heartbeat_ms: 250, join_ms: 30000}\n"
                % (i, i, port, i % ngpu)))
        os.environ.pop("NCCL_HOSTID", None)
        init = "tcp://127.0.0.1:%d" % free_port()
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank",
                                   str(i), agents[i].sock, init, str(iters)])
                 for i in range(2)]
        deadline, rcs = time.monotonic() + 400, []
        for pr in procs:
            try:
                rcs.append(pr.wait(max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                print("FAIL a rank is still running after 400 s")
                rcs.append(1)
    finally:
        for a in agents:
            if a.stop() != 0:
                print(a.read_log())
    if any(rcs):
        print("FAIL rank exit codes %s" % rcs)
        for a in agents:
            print(a.read_log())
        return 1
    print("gpu pair checks passed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
        sys.exit(0)
    sys.exit(main())
