"""coll: Python over libcoll, the client library of coll-agent.

    import coll, numpy as np
    conn = coll.connect()                 # $COLL_AGENT_SOCKET
    g = conn.open("world")                # a slot of the YAML group "world"
    x = conn.zeros(1 << 20, np.float32)   # in coll memory: ops never copy it
    g.allreduce(x)                        # in place, blocking
    q = g.allreduce(x, async_op=True); q.wait()

Arrays: numpy arrays, torch tensors (CPU and CUDA) and __dlpack__ objects; those
outside coll memory are staged (copied) through the connection's buffers. Errors raise
coll.CollError with the agent's reason and whether a retry may succeed. docs/python.md
says more; coll.torch is the torch.distributed backend, coll.collective the
ray.util.collective functions.
"""
from ._core import (Buffer, CollError, Connection, Group, connect, default_connection,
                    lib, redop, version)
from ._lib import DEVICE_HOST, SLOT_ANY, SPLIT_NOCOLOR
from ._ops import Prepared
from ._request import Request, wait_any

__all__ = ["Buffer", "CollError", "Connection", "Group", "Prepared", "Request", "connect",
           "default_connection", "empty", "zeros", "empty_like", "wait_any", "version",
           "redop", "lib", "DEVICE_HOST", "SLOT_ANY", "SPLIT_NOCOLOR"]


def empty(shape, dtype="float32", device=None, like=None):
    """An array in coll memory of the default connection (Connection.empty)."""
    return default_connection().empty(shape, dtype, device, like)


def zeros(shape, dtype="float32", device=None, like=None):
    return default_connection().zeros(shape, dtype, device, like)


def empty_like(x):
    return default_connection().empty_like(x)
