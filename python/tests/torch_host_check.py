#!/usr/bin/env python3
"""torch.distributed on coll's host backend where there is no pytest (the GPU host, whose
torch is 2.x, while this machine's pytest runs Debian's 1.13): four ranks on one pod,
point to point with and without a source (torch's recv_anysource and the Work's
_source_rank), and an all_reduce. Prints one line per check; exits 1 on a failure.

    COLL_AGENT=build/coll-agent COLL_LIB=build/libcoll.so.0 PYTHONPATH=python \
        python3 python/tests/torch_host_check.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import free_port, one_pod, run_ranks  # noqa: E402

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
    if r == 0:
        got = {}
        for k in range(size - 1):
            x = torch.zeros(2)
            if k % 2:
                w = dist.irecv(x, tag=4)
                w.wait()
                src = w._source_rank()
            else:
                src = dist.recv(x, tag=4)
            got[src] = x.tolist()
        assert got == {k: [10.0 * k] * 2 for k in range(1, size)}, got
        x = torch.zeros(2)
        assert dist.recv(x, 2, tag=5) == 2 and x.tolist() == [5.0, 5.0]
    else:
        dist.send(torch.full((2,), 10.0 * r), 0, tag=4)
        if r == 2:
            dist.send(torch.full((2,), 5.0), 0, tag=5)
    dist.barrier()
    dist.destroy_process_group()


def main():
    size = 4
    agent = one_pod(size)
    try:
        run_ranks(_rank, size, agent.sock, free_port(), size, timeout=120)
        print("ok   torch %s on a host group of %d ranks: all_reduce, send, recv and irecv "
              "with and without a source" % (torch.__version__, size), flush=True)
    except AssertionError as e:
        print("FAIL torch %s: %s" % (torch.__version__, e), flush=True)
        return 1
    finally:
        agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
