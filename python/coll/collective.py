"""The functions of ray.util.collective over coll: a Ray actor (or any process) that used

    import ray.util.collective as col
switches with
    import coll.collective as col

and keeps its calls. Groups are coll groups: init_collective_group(world_size, rank,
backend, group_name) opens the slot that gives `rank` in the coll group called
group_name ("default" means $COLL_GROUP, else "world"), and checks that its size is
world_size. backend is accepted for compatibility: the agent runs the group on the
backend its YAML names (host, or NCCL for GPU groups).

The *_multigpu functions take one tensor per local slot: a process that says
init_collective_group(..., slots=n) (the one addition to Ray's signature) holds n
consecutive ranks (rank x n + i for its i-th tensor; the coll group then has
world_size x n ranks), as Ray's NCCL groups number one rank per GPU.

create_collective_group(actors, ...) is Ray's driver-side declaration through its actor
handles; without Ray there are no handles, so it raises and says so (docs/python.md
says how it would plug into Ray).
"""
import os
import threading

from ._core import connect


class ReduceOp:
    """ray.util.collective.types.ReduceOp."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3


_OPNAME = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min",
           ReduceOp.MAX: "max"}

_lock = threading.Lock()
_conn = None
_groups = {}  # group_name -> _Group


class _Group:
    def __init__(self, name, world_size, rank, timeout, slots):
        self.coll_name = (os.environ.get("COLL_GROUP") or "world") if name == "default" \
            else name
        self.world_size, self.rank = world_size, rank
        self.slots = []
        try:
            for i in range(slots):
                self.slots.append(_connection().open(self.coll_name, rank=rank * slots + i,
                                                     timeout=timeout))
        except BaseException:
            self.close()
            raise
        if self.slots[0].size != world_size * slots:
            size = self.slots[0].size
            self.close()
            raise ValueError("coll group '%s' has %d ranks, not world_size %d x %d slots" %
                             (self.coll_name, size, world_size, slots))

    @property
    def g(self):
        if len(self.slots) != 1:
            raise ValueError("group '%s' holds %d slots in this process: use the _multigpu "
                             "functions" % (self.coll_name, len(self.slots)))
        return self.slots[0]

    def multi(self, n):
        if n != len(self.slots):
            raise ValueError("%d tensors: this process holds %d slots of group '%s' "
                             "(init_collective_group's slots)" %
                             (n, len(self.slots), self.coll_name))
        return self.slots

    def close(self):
        for h in self.slots:
            h.close()


def _connection():
    global _conn
    if _conn is None or not _conn._h:
        _conn = connect(os.environ.get("COLL_AGENT_SOCKET"))
    return _conn


def _group(name):
    g = _groups.get(name)
    if g is None:
        raise RuntimeError("collective group '%s' is not initialized: call "
                           "init_collective_group first" % name)
    return g


def _op(op):
    if op in _OPNAME:
        return _OPNAME[op]
    if hasattr(op, "value") and op.value in _OPNAME:  # Ray's own enum
        return _OPNAME[op.value]
    raise ValueError("reduction %r: ReduceOp.SUM, PRODUCT, MIN or MAX" % (op,))


def _wait_all(reqs):
    err = None
    for q in reqs:
        try:
            q.wait()
        except Exception as e:  # every request is waited for, the first failure raised
            err = err or e
    if err:
        raise err


# ---- groups -------------------------------------------------------------------------


def init_collective_group(world_size, rank, backend="nccl", group_name="default",
                          timeout=None, slots=1):
    """Join group_name as rank (of world_size). timeout: this process's op timeout in
    seconds (None: the group's). slots (an addition to Ray's signature): the tensors this
    process passes to the _multigpu functions, one rank each."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError("world_size %r must be a positive int" % (world_size,))
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError("rank %r must be in 0..%d" % (rank, world_size - 1))
    with _lock:
        if group_name in _groups:
            raise RuntimeError("collective group '%s' is initialized already" % group_name)
        _groups[group_name] = _Group(group_name, world_size, rank, timeout, slots)


def create_collective_group(actors, world_size, ranks, backend="nccl", group_name="default"):
    raise NotImplementedError(
        "create_collective_group declares a group through Ray actor handles, and Ray is not "
        "here: call init_collective_group(world_size, rank, ...) in each process instead "
        "(docs/python.md, 'Ray')")


def destroy_collective_group(group_name="default"):
    with _lock:
        g = _groups.pop(group_name, None)
    if g is not None:
        g.close()


def is_group_initialized(group_name="default"):
    return group_name in _groups


def get_rank(group_name="default"):
    """This process's rank in the group, -1 if it is not initialized."""
    g = _groups.get(group_name)
    return g.rank if g else -1


def get_collective_group_size(group_name="default"):
    """The group's world size, -1 if it is not initialized."""
    g = _groups.get(group_name)
    return g.world_size if g else -1


# ---- one tensor per process ---------------------------------------------------------


def allreduce(tensor, group_name="default", op=ReduceOp.SUM):
    _group(group_name).g.allreduce(tensor, op=_op(op))


def barrier(group_name="default"):
    _group(group_name).g.barrier()


def reduce(tensor, dst_rank=0, group_name="default", op=ReduceOp.SUM):
    _group(group_name).g.reduce(tensor, root=dst_rank, op=_op(op))


def broadcast(tensor, src_rank=0, group_name="default"):
    _group(group_name).g.broadcast(tensor, root=src_rank)


def allgather(tensor_list, tensor, group_name="default"):
    """tensor_list[i] (world_size tensors shaped as tensor) gets rank i's tensor."""
    g = _group(group_name)
    if len(tensor_list) != g.world_size:
        raise ValueError("tensor_list holds %d tensors for a group of %d" %
                         (len(tensor_list), g.world_size))
    flat = g.g.allgather(tensor)
    for i, t in enumerate(tensor_list):
        t[...] = flat[i]


def reducescatter(tensor, tensor_list, group_name="default", op=ReduceOp.SUM):
    """tensor gets the reduction of every rank's tensor_list[rank]."""
    g = _group(group_name)
    if len(tensor_list) != g.world_size:
        raise ValueError("tensor_list holds %d tensors for a group of %d" %
                         (len(tensor_list), g.world_size))
    g.g.reduce_scatter(_stack(tensor_list), out=tensor, op=_op(op))


def send(tensor, dst_rank, group_name="default"):
    _group(group_name).g.send(tensor, dst_rank)


def recv(tensor, src_rank, group_name="default"):
    _group(group_name).g.recv(tensor, src_rank)


def _stack(ts):
    if hasattr(ts[0], "data_ptr"):
        import torch

        return torch.stack(list(ts))
    import numpy as np

    return np.stack(ts)


# ---- one tensor per local slot (Ray's one rank per GPU) -----------------------------


def allreduce_multigpu(tensor_list, group_name="default", op=ReduceOp.SUM):
    slots = _group(group_name).multi(len(tensor_list))
    _wait_all([s.allreduce(t, op=_op(op), async_op=True) for s, t in zip(slots, tensor_list)])


def reduce_multigpu(tensor_list, dst_rank=0, dst_tensor=0, group_name="default",
                    op=ReduceOp.SUM):
    slots = _group(group_name).multi(len(tensor_list))
    root = dst_rank * len(slots) + dst_tensor
    _wait_all([s.reduce(t, root=root, op=_op(op), async_op=True)
               for s, t in zip(slots, tensor_list)])


def broadcast_multigpu(tensor_list, src_rank=0, src_tensor=0, group_name="default"):
    slots = _group(group_name).multi(len(tensor_list))
    root = src_rank * len(slots) + src_tensor
    _wait_all([s.broadcast(t, root=root, async_op=True) for s, t in zip(slots, tensor_list)])


def allgather_multigpu(output_tensor_lists, input_tensor_list, group_name="default"):
    slots = _group(group_name).multi(len(input_tensor_list))
    qs = [s.allgather(t, async_op=True) for s, t in zip(slots, input_tensor_list)]
    _wait_all(qs)
    for q, outs in zip(qs, output_tensor_lists):
        for i, t in enumerate(outs):
            t[...] = q.result[i]


def reducescatter_multigpu(output_tensor_list, input_tensor_lists, group_name="default",
                           op=ReduceOp.SUM):
    slots = _group(group_name).multi(len(output_tensor_list))
    _wait_all([s.reduce_scatter(_stack(ins), out=out, op=_op(op), async_op=True)
               for s, out, ins in zip(slots, output_tensor_list, input_tensor_lists)])


def _slot_of(g, tensor):
    dev = getattr(tensor, "device", None)
    i = dev.index if getattr(dev, "type", "cpu") == "cuda" else 0
    return g.slots[i if i < len(g.slots) else 0]


def send_multigpu(tensor, dst_rank, dst_gpu_index, group_name="default", n_elements=0):
    """tensor (from the slot of its GPU) to GPU dst_gpu_index of process dst_rank;
    n_elements > 0 sends only the first n_elements."""
    g = _group(group_name)
    n = len(g.slots)
    t = tensor.reshape(-1)[:n_elements] if n_elements else tensor
    _slot_of(g, tensor).send(t, dst_rank * n + dst_gpu_index)


def recv_multigpu(tensor, src_rank, src_gpu_index, group_name="default", n_elements=0):
    g = _group(group_name)
    n = len(g.slots)
    t = tensor.reshape(-1)[:n_elements] if n_elements else tensor
    _slot_of(g, tensor).recv(t, src_rank * n + src_gpu_index)
