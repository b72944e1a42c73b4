"""coll.collective (ray.util.collective's functions) against real agents."""
import os

import numpy as np
import pytest

import coll.collective as col
from conftest import run_ranks


def _single(i, sock):
    os.environ["COLL_AGENT_SOCKET"] = sock
    assert col.get_rank() == -1 and col.get_collective_group_size() == -1
    col.init_collective_group(2, i, backend="nccl")
    assert col.is_group_initialized() and col.get_rank() == i
    assert col.get_collective_group_size() == 2
    with pytest.raises(RuntimeError, match="initialized already"):
        col.init_collective_group(2, i)
    with pytest.raises(NotImplementedError, match="Ray actor handles"):
        col.create_collective_group([], 2, [0, 1])
    x = np.full(4, i + 1.0, np.float32)
    col.allreduce(x)
    assert x.tolist() == [3.0] * 4
    y = np.array([i + 2], np.int64)
    col.allreduce(y, op=col.ReduceOp.PRODUCT)
    assert y[0] == 6
    b = np.array([10.0 * i])
    col.broadcast(b, src_rank=1)
    assert b[0] == 10.0
    r = np.array([i + 5.0])
    col.reduce(r, dst_rank=0, op=col.ReduceOp.MAX)
    if i == 0:
        assert r[0] == 6.0
    outs = [np.zeros(3) for _ in range(2)]
    col.allgather(outs, np.full(3, float(i)))
    assert [o.tolist() for o in outs] == [[0.0] * 3, [1.0] * 3]
    rs = np.zeros(2)
    col.reducescatter(rs, [np.full(2, 1.0 + k) for k in range(2)])
    assert rs.tolist() == [2.0 * (1 + i)] * 2
    if i == 0:
        col.send(np.array([7, 8], np.int32), 1)
    else:
        got = np.zeros(2, np.int32)
        col.recv(got, 0)
        assert got.tolist() == [7, 8]
    col.barrier()
    col.destroy_collective_group()
    assert col.get_rank() == -1
    with pytest.raises(RuntimeError, match="not initialized"):
        col.allreduce(x)


def test_the_ray_functions_across_two_pods(two_pods):
    run_ranks(lambda i: _single(i, two_pods[i].sock), 2)


def _multi(i, sock):
    import torch

    os.environ["COLL_AGENT_SOCKET"] = sock
    col.init_collective_group(2, i, group_name="world", slots=2)
    # two tensors per process: ranks 2i and 2i + 1 of the coll group of 4
    ts = [torch.full((3,), float(2 * i + k)) for k in range(2)]
    col.allreduce_multigpu(ts, group_name="world")
    assert all(t.tolist() == [6.0] * 3 for t in ts)
    bs = [torch.full((2,), float(2 * i + k)) for k in range(2)]
    col.broadcast_multigpu(bs, src_rank=1, src_tensor=1, group_name="world")
    assert all(t.tolist() == [3.0, 3.0] for t in bs)
    rd = [torch.tensor([float(2 * i + k)]) for k in range(2)]
    col.reduce_multigpu(rd, dst_rank=0, dst_tensor=1, group_name="world", op=col.ReduceOp.MAX)
    if i == 0:
        assert rd[1].item() == 3.0
    outs = [[torch.zeros(1) for _ in range(4)] for _ in range(2)]
    col.allgather_multigpu(outs, [torch.tensor([float(2 * i + k)]) for k in range(2)],
                           group_name="world")
    assert all([t.item() for t in o] == [0.0, 1.0, 2.0, 3.0] for o in outs)
    rs = [torch.zeros(2) for _ in range(2)]
    col.reducescatter_multigpu(rs, [[torch.full((2,), 1.0) for _ in range(4)]
                                    for _ in range(2)], group_name="world")
    assert all(t.tolist() == [4.0, 4.0] for t in rs)
    with pytest.raises(ValueError, match="use the _multigpu functions"):
        col.allreduce(torch.zeros(1), group_name="world")
    col.destroy_collective_group("world")


def test_one_tensor_per_slot(agent4):
    pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
    run_ranks(_multi, 2, agent4.sock)
