#!/usr/bin/env python3
"""torch.distributed on coll's host backend where there is no pytest (the GPU host, whose
torch is 2.x, while this machine's pytest runs Debian's 1.13): four ranks on one pod,
point to point with and without a source (torch's recv_anysource and the Work's
_source_rank), an all_reduce, and (torch 2.x with CUDA) dist.split_group. Prints one line per check; exits 1 on a failure.

    COLL_AGENT=build/coll-agent COLL_LIB=build/libcoll.so.0 PYTHONPATH=python \
        python3 python/tests/torch_host_check.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import free_port, one_pod, run_ranks, torch_recv_from_any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import coll.torch  # noqa: E402,F401


def _rank(i, sock, port, size):
    os.environ["COLL_AGENT_SOCKET"] = sock
    dist.init_process_group("coll", init_method="tcp://127.0.0.1:%d" % port, rank=i,
                            world_size=size)
    r = dist.get_rank()
    t = torch.full((3,), float(r))
    dist.all_reduce(t)
    assert t.tolist() == [float(sum(range(size)))] * 3, t
    torch_recv_from_any(r, size, 4)
    if r == 0:
        x = torch.zeros(2)
        assert dist.recv(x, 2, tag=5) == 2 and x.tolist() == [5.0, 5.0]
    elif r == 2:
        dist.send(torch.full((2,), 5.0), 0, tag=5)
    if hasattr(dist, "split_group") and torch.cuda.is_available():
        # torch 2.x's split_group wants the default group bound to a device (as
        # init_process_group(device_id=...) binds it); the ops stay on the CPU
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
        half = dist.split_group(split_ranks=[[0, 1], [2, 3]])
        assert dist.get_world_size(half) == 2 and dist.get_rank(half) == r % 2
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=half)
        assert t.item() == (1.0 if r < 2 else 5.0), t
        low = dist.split_group(split_ranks=[[0, 1]])
        assert (low is None) == (r >= 2), low
        if low is not None:
            t = torch.ones(2)
            dist.all_reduce(t, group=low)
            assert t.tolist() == [2.0, 2.0], t
    dist.barrier()
    dist.destroy_process_group()


def main():
    size = 4
    agent = one_pod(size)
    try:
        run_ranks(_rank, size, agent.sock, free_port(), size, timeout=120)
        print("ok   torch %s on a host group of %d ranks: all_reduce, send, recv and irecv "
              "with and without a source%s" % (
                  torch.__version__, size,
                  ", split_group" if hasattr(dist, "split_group") and torch.cuda.is_available()
                  else " (no split_group here: torch 2.x with CUDA has it)"), flush=True)
    except AssertionError as e:
        print("FAIL torch %s: %s" % (torch.__version__, e), flush=True)
        return 1
    finally:
        agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
