"""The torch.distributed backend "coll" against real agents: init_process_group with
torch's own init methods, every collective torch exposes, object collectives, new_group
through run-time children, futures, and DDP against a single-process reference."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
import torch.distributed as dist  # noqa: E402

import coll.torch  # noqa: E402,F401
from coll import _bound  # noqa: E402
from conftest import free_port, run_ranks, torch_recv_from_any  # noqa: E402


def _init(i, sock, size, port):
    os.environ["COLL_AGENT_SOCKET"] = sock
    dist.init_process_group("coll", init_method="tcp://127.0.0.1:%d" % port, rank=i,
                            world_size=size)
    assert dist.get_rank() == i and dist.get_world_size() == size
    assert dist.get_backend() == "coll"


def _every_collective(i, socks, port):
    size = len(socks)
    _init(i, socks[i], size, port)
    r = dist.get_rank()
    t = torch.arange(4, dtype=torch.float32) + r
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(4, dtype=torch.float32) * size + sum(range(size)))
    t = torch.tensor([r + 1])
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    assert t.item() == 2 if size == 2 else True
    b = torch.full((3,), float(r))
    dist.broadcast(b, src=size - 1)
    assert torch.equal(b, torch.full((3,), float(size - 1)))
    red = torch.tensor([float(r)])
    dist.reduce(red, dst=0, op=dist.ReduceOp.MAX)
    if r == 0:
        assert red.item() == size - 1
    outs = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(outs, torch.tensor([r, 10 * r]))
    assert [o.tolist() for o in outs] == [[k, 10 * k] for k in range(size)]
    flat = torch.zeros(size * 2)
    dist._all_gather_base(flat, torch.tensor([float(r), 1.0]))
    assert flat.tolist() == sum([[float(k), 1.0] for k in range(size)], [])
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(k + r)) for k in range(size)])
    assert rs.tolist() == [float(size * r + sum(range(size)))] * 2
    rsb = torch.zeros(1)
    dist._reduce_scatter_base(rsb, torch.arange(size, dtype=torch.float32))
    assert rsb.item() == size * r
    a2a = torch.zeros(size)
    dist.all_to_all_single(a2a, torch.arange(size, dtype=torch.float32) + 100 * r)
    assert a2a.tolist() == [100.0 * k + r for k in range(size)]
    # unequal splits (MoE): rank r sends j + 1 rows to rank j
    ins = [j + 1 for j in range(size)]
    outs_n = [r + 1] * size
    x = torch.cat([torch.full((ins[j], 2), float(10 * r + j)) for j in range(size)])
    y = torch.zeros(sum(outs_n), 2)
    dist.all_to_all_single(y, x, outs_n, ins)
    want = torch.cat([torch.full((outs_n[k], 2), float(10 * k + r)) for k in range(size)])
    assert torch.equal(y, want)
    lo = [torch.zeros(k + 1) for k in range(size)]
    dist.all_to_all(lo, [torch.full((r + 1,), float(j)) for j in range(size)])
    assert [t.tolist() for t in lo] == [[float(r)] * (k + 1) for k in range(size)]
    g = [torch.zeros(2) for _ in range(size)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), g, dst=0)
    if r == 0:
        assert [t.tolist() for t in g] == [[float(k)] * 2 for k in range(size)]
    sc = torch.zeros(3)
    dist.scatter(sc, [torch.full((3,), float(k)) for k in range(size)] if r == 1 else None, src=1)
    assert sc.tolist() == [float(r)] * 3
    # point to point, tagged, and torch's batched form
    if r == 0:
        dist.send(torch.tensor([5.0]), 1, tag=3)
    elif r == 1:
        got = torch.zeros(1)
        dist.recv(got, 0, tag=3)
        assert got.item() == 5.0
    nxt, prv = (r + 1) % size, (r - 1) % size
    inbox = torch.zeros(2)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(r)), nxt),
           dist.P2POp(dist.irecv, inbox, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert inbox.tolist() == [float(prv)] * 2
    torch_recv_from_any(r, size, 4)  # torch's recv and irecv without src
    # object collectives through torch's own helpers (pickles over allgather/broadcast)
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": r, "name": "pod-%d" % r})
    assert objs == [{"rank": k, "name": "pod-%d" % k} for k in range(size)]
    lst = [("hello", r)] if r == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [("hello", 0)]
    # async work with a future
    t = torch.ones(1000)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    assert fut.wait()[0] is t and t[0].item() == size
    assert w.is_completed()
    dist.barrier()
    dist.destroy_process_group()


def test_premul_sum_says_why_it_is_refused():
    from coll.torch import _redop

    assert _redop(dist.ReduceOp.SUM) == "sum" and _redop(dist.ReduceOp.BXOR) == "bxor"
    if hasattr(dist, "_make_nccl_premul_sum"):
        with pytest.raises(ValueError, match="does not hand its factor"):
            _redop(dist._make_nccl_premul_sum(2.0))


def test_mem_pool_says_what_it_needs():
    # the pool itself runs on the GPU host (python/tests/gpu_check.py); here: its refusals
    if not hasattr(torch.cuda, "MemPool"):
        with pytest.raises(RuntimeError, match="torch 2.5 or newer"):
            coll.torch.mem_pool()
    else:
        with pytest.raises(RuntimeError, match="init_process_group"):
            coll.torch.mem_pool()


def _split(i, sock, port):
    _init(i, sock, 4, port)
    r = dist.get_rank()
    pg = dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cpu"))  # what torch 2.x's split_group asks first
    assert be.supports_splitting and be.comm_split_count() == 0
    # torch 2.x's split_group calls this with the sorted ranks of this rank's part
    half = pg.split_group([0, 1] if r < 2 else [3, 2], group_name="half-%d" % (r // 2))
    assert half.group_name == "half-%d" % (r // 2) and half.size() == 2
    assert half.rank() == r % 2 and be.comm_split_count() == 1
    t = torch.tensor([float(r)])
    half.allreduce([t]).wait()
    assert t.item() == (1.0 if r < 2 else 5.0)
    # a rank in no part gets None, and takes part all the same
    low = pg.split_group([0, 1], group_name="low")
    assert (low is None) == (r >= 2)
    if low is not None:
        t = torch.ones(2)
        low.allreduce([t]).wait()
        assert t.tolist() == [2.0, 2.0]
    dist.barrier()
    dist.destroy_process_group()


def test_split_group_as_torch_2_calls_it(agent4):
    run_ranks(_split, 4, agent4.sock, free_port(), timeout=120)


def test_every_collective_across_two_pods(two_pods):
    run_ranks(_every_collective, 2, [a.sock for a in two_pods], free_port(), timeout=120)


def test_every_collective_on_four_slots_of_one_pod(agent4):
    run_ranks(_every_collective, 4, [agent4.sock] * 4, free_port(), timeout=120)


def _bound_ops(i, socks, port):
    """Ops on contiguous tensors are bound once (coll/_bound.py): right every time, in
    coll memory and, where the group's ops run in the process, in ordinary memory; a
    tensor that is not contiguous is not bound; a binding libcoll refuses (its memory no
    longer what it was) is dropped and the op goes the general way."""
    size = len(socks)
    _init(i, socks[i], size, port)
    r = dist.get_rank()
    pg = coll.torch._state["world"]
    cg, bd = pg.coll, pg._bound
    x = cg.conn.zeros(64, torch.float32)
    y = torch.zeros(64)
    out = cg.conn.zeros(64 * size, torch.float32)
    for k in range(20):
        x.fill_(k + r)
        dist.all_reduce(x)
        assert torch.equal(x, torch.full((64,), float(size * k + sum(range(size)))))
        y.fill_(k * r)
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        assert torch.equal(y, torch.full((64,), float(k * (size - 1))))
        x.fill_(r)
        dist.broadcast(x, src=size - 1)
        assert x[63].item() == size - 1
        x.fill_(r + k)
        dist._all_gather_base(out, x)
        assert out[::64].tolist() == [float(j + k) for j in range(size)]
        dist._reduce_scatter_base(x, out)
        assert x[0].item() == size * (r + k)
    key = (0, x.data_ptr(), 64, torch.float32, -1, "sum")
    assert bd.ops[key] is not _bound._NONE
    ykey = (0, y.data_ptr(), 64, torch.float32, -1, "max")
    assert (bd.ops[ykey] is _bound._NONE) == (not cg._raw_try)
    n = len(bd.ops)
    nt = cg.conn.zeros((8, 8), torch.float32).t()
    nt.fill_(1.0)
    dist.all_reduce(nt)
    assert len(bd.ops) == n and nt[3, 5].item() == size
    if not cg._raw_try:  # ordinary memory is refused here: a binding to it is stale
        z = torch.full((16,), float(r))
        zkey = (0, z.data_ptr(), 16, torch.float32, -1, "sum")
        fn, args = bd._fn("coll_allreduce", (cg._h, z.data_ptr(), z.data_ptr(), 16,
                                              coll._lib.DTYPES["float32"],
                                              coll._lib.REDOPS["sum"]))
        bd.ops[zkey] = (fn, args, -1, "allreduce (stale)")
        dist.all_reduce(z)
        assert zkey not in bd.ops and z[15].item() == sum(range(size))
    dist.barrier()
    # a bound op that fails (counts that differ: MISMATCH) raises through wait(), and
    # its Work says so, through its future too (across pods the mismatch ended the
    # epoch: the ops after it fail with EPOCH; on one pod they fail alike)
    bad = cg.conn.zeros(8 + r, torch.float32)
    with pytest.raises(coll.CollError) as e:
        dist.all_reduce(bad)
    assert e.value.name == "MISMATCH" and e.value.retryable
    then = "EPOCH" if cg.nodes > 1 else "MISMATCH"
    w = dist.all_reduce(bad, async_op=True)
    with pytest.raises(coll.CollError, match=then):
        w.get_future().wait()
    assert w.is_completed() and not w.is_success() and w.exception() is not None
    w = dist.all_reduce(bad, async_op=True)
    with pytest.raises(coll.CollError, match=then):
        w.wait()
    assert w.is_completed() and not w.is_success()
    dist.destroy_process_group()


def test_ops_on_contiguous_tensors_are_bound_across_pods(two_pods):
    run_ranks(_bound_ops, 2, [a.sock for a in two_pods], free_port(), timeout=120)


def test_ops_on_contiguous_tensors_are_bound_on_four_slots(agent4):
    run_ranks(_bound_ops, 4, [agent4.sock] * 4, free_port(), timeout=120)


def _new_groups(i, sock, port):
    _init(i, sock, 4, port)
    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    mine = evens if i % 2 == 0 else odds
    # each group answers to the name torch gave it (DeviceMesh and FSDP2 ask for it)
    c10d = dist.distributed_c10d
    names = c10d._world.pg_names if hasattr(c10d, "_world") else c10d._pg_names
    world = c10d._get_default_group()
    for pg in (world, mine):
        assert pg.group_name == names[pg], (pg.group_name, names[pg])
    assert world.group_name != mine.group_name
    t = torch.tensor([float(i)])
    dist.all_reduce(t, group=mine)
    assert t.item() == (2.0 if i % 2 == 0 else 4.0)
    # group ranks in send/recv: rank 1 of evens is global rank 2
    if i == 0:
        dist.send(torch.tensor([42.0]), 2, group=evens)
    elif i == 2:
        got = torch.zeros(1)
        dist.recv(got, 0, group=evens)
        assert got.item() == 42.0
    dist.barrier()
    dist.destroy_process_group()


def test_new_group_makes_children(agent4):
    run_ranks(_new_groups, 4, agent4.sock, free_port(), timeout=120)


def _cross_pod_child(i, socks, port):
    _init(i, socks[i], 4, port)
    # ranks 1 and 2 are on different pods (two ranks a pod): a child across pods, run by
    # libcoll over the world's sends and receives; 0 and 3 are not members
    g = dist.new_group([1, 2])
    both = dist.new_group([0, 1, 2, 3])
    t = torch.full((1000,), float(i + 1))
    if i in (1, 2):
        dist.all_reduce(t, group=g)
        assert t[0].item() == 5.0 and t[-1].item() == 5.0
        out = [torch.zeros(3) for _ in range(2)]
        dist.all_gather(out, torch.full((3,), float(i)), group=g)
        assert [o[0].item() for o in out] == [1.0, 2.0]
    t = torch.full((4,), float(i))
    dist.broadcast(t, 3, group=both)
    assert t[0].item() == 3.0
    # ranks 0, 1 (pod 0) and 2 (pod 1): a 1 MiB all_reduce runs in two steps (libcoll's
    # rsag.c), its second step sent from whichever wait comes next: here a small
    # all_reduce's, waited for before the large one
    g3 = dist.new_group([0, 1, 2])
    if i < 3:
        ref = torch.arange(1 << 18, dtype=torch.float32) % 97
        big = ref + i
        w = dist.all_reduce(big, group=g3, async_op=True)
        small = torch.full((4,), float(i))
        dist.all_reduce(small, group=g3)
        w.wait()
        assert small[0].item() == 3.0 and torch.equal(big, ref * 3 + 3)
    dist.barrier()
    dist.destroy_process_group()


def test_new_group_across_pods(two_pods_two_slots):
    run_ranks(_cross_pod_child, 4, [a.sock for a in two_pods_two_slots for _ in range(2)],
              free_port(), timeout=120)


def _too_many_children(i, sock, port):
    _init(i, sock, 2, port)
    # a session holds 64 group handles: the world and 63 children; the 64th child cannot
    # be made, which new_group must not raise (the other member would wait in torch's
    # store barrier for good): its first op says why
    gs = [dist.new_group([0, 1]) for _ in range(64)]
    t = torch.ones(1)
    dist.all_reduce(t, group=gs[62])
    assert t.item() == 2.0
    with pytest.raises(coll.CollError) as e:
        dist.all_reduce(t, group=gs[63])
    assert e.value.name == "LIMIT" and "64 groups" in e.value.reason
    dist.barrier()
    dist.destroy_process_group()


def test_a_child_that_cannot_be_made_fails_on_use_not_in_new_group(agent2):
    run_ranks(_too_many_children, 2, agent2.sock, free_port(), timeout=120)


def test_a_failed_op_raises_coll_error_through_torch(agent2):
    port = free_port()

    def body(i):
        _init(i, agent2.sock, 2, port)
        with pytest.raises(coll.CollError) as e:
            dist.all_reduce(torch.zeros(3 + i))
        assert e.value.name == "MISMATCH" and e.value.retryable
        assert "count=3" in e.value.reason and "count=4" in e.value.reason
        w = dist.all_reduce(torch.zeros(5 + i), async_op=True)
        with pytest.raises(coll.CollError, match="MISMATCH"):
            w.get_future().wait()
        assert w.is_completed() and not w.is_success()

    run_ranks(body, 2)


def test_a_rank_of_another_pod_is_refused_by_name(two_pods):
    def body(i):
        os.environ["COLL_AGENT_SOCKET"] = two_pods[1].sock  # pod 1 holds rank 1 only
        with pytest.raises(coll.CollError) as e:
            coll.torch._open_world(0, 2, None)
        assert e.value.name == "NOT_FOUND"
        assert "rank 0 of group 'world' is another pod's" in e.value.reason
        with pytest.raises(RuntimeError, match="has 2 ranks but torch's world has 3"):
            coll.torch._open_world(1, 3, None)

    run_ranks(body, 1)


def _ddp(i, socks, port, steps):
    _init(i, socks[i], 2, port)
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    mk = lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),  # noqa: E731
                                     torch.nn.Linear(16, 1))
    model, ref, gm = mk(), mk(), mk()
    ref.load_state_dict(model.state_dict())
    gm.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    gddp = torch.nn.parallel.DistributedDataParallel(gm, process_group=gloo)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gopt = torch.optim.SGD(gddp.parameters(), lr=0.05)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        xs = torch.randn(2, 4, 8, generator=g)  # both ranks' batches, the same on each
        ys = torch.randn(2, 4, 1, generator=g)
        for d, o in ((ddp, opt), (gddp, gopt)):  # coll, and the same steps on Gloo
            o.zero_grad()
            torch.nn.functional.mse_loss(d(xs[i]), ys[i]).backward()
            o.step()
        # the reference: one process, the mean of both ranks' gradients
        ropt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(xs[k]), ys[k]) for k in range(2)) / 2
        loss.backward()
        ropt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    # two ranks: a sum of two floats is the same in any order, so coll and Gloo agree
    # bit for bit
    for p, q in zip(model.parameters(), gm.parameters()):
        assert torch.equal(p, q)
    # both ranks hold the same parameters
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    both = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(both, flat)
    assert torch.equal(both[0], both[1])
    # every Work was waited for or had its future set: none kept
    assert not coll.torch._alive, len(coll.torch._alive)
    dist.destroy_process_group()


def test_ddp_trains_as_one_process_would(two_pods):
    run_ranks(_ddp, 2, [a.sock for a in two_pods], free_port(), 20, timeout=180)
