"""torch.distributed backend "coll": importing this module registers it.

    import coll.torch
    torch.distributed.init_process_group("coll", init_method="env://")

The default process group is the coll group $COLL_GROUP (default "world") of the agent
at $COLL_AGENT_SOCKET; the backend opens the slot that gives torch's rank on this pod
(coll_group_opts.rank) and refuses clearly when that rank is another pod's or the sizes
differ. torch's store is not used: the agents find each other. new_group() makes a
coll child of the members (coll_group_create); a failure there is kept for the group's
first op, never raised in the creator (torch's other members would wait in its barrier).

Work: wait() waits in the caller's thread (no hand-off) and raises coll.CollError on
failure; get_future() completes from a thread of this module. CUDA tensors: an op starts
after the work queued on the current stream, and the current stream waits for it on the
GPU at once (no host wait: later kernels on that stream see the result, as after
ProcessGroupNCCL's wait()).
"""
import collections
import os
import queue
import threading

import torch
import torch.distributed as dist

from ._core import CollError, connect
from . import _arrays, _bound
from ._request import One as _One, ready

_OPS = [("SUM", "sum"), ("PRODUCT", "prod"), ("MIN", "min"), ("MAX", "max"),
        ("AVG", "avg"), ("BAND", "band"), ("BOR", "bor"), ("BXOR", "bxor")]

# torch's ReduceOp values and ours, made once (SUM first: the common one)
_OPS_OF = [(getattr(dist.ReduceOp, name), ours) for name, ours in _OPS
           if hasattr(dist.ReduceOp, name)]


def _by_hash():
    """ours by the hash of torch's value, where those hashes tell every value apart (torch
    1.13's are the op's number): a look-up costs a fifth of a comparison"""
    try:
        theirs = [t for t, _ in _OPS_OF] + [getattr(dist.ReduceOp, n) for n in
                                            ("PREMUL_SUM", "UNUSED") if hasattr(dist.ReduceOp, n)]
        hs = [hash(t) for t in theirs]
    except TypeError:
        return {}
    if len(set(hs)) != len(hs):
        return {}
    return {hash(t): (type(t), ours) for t, ours in _OPS_OF}


_OPS_BY_HASH = _by_hash()


def _redop(op):
    if op is None:
        return "sum"
    try:
        hit = _OPS_BY_HASH.get(hash(op))
    except TypeError:
        hit = None
    if hit is not None and type(op) is hit[0]:
        return hit[1]
    for theirs, ours in _OPS_OF:
        if op == theirs:
            return ours
    if hasattr(dist.ReduceOp, "PREMUL_SUM") and getattr(op, "op", op) == dist.ReduceOp.PREMUL_SUM:
        # torch keeps PREMUL_SUM's factor in C++, out of a Python backend's reach: scale the
        # tensor by the factor first and reduce with SUM (what NCCL does)
        raise ValueError("coll: PREMUL_SUM is not supported: torch does not hand its factor to "
                         "a Python backend; multiply by the factor, then reduce with SUM")
    raise ValueError("coll: reduction %r is not supported" % (op,))


def _opt(opts, name, default):
    return getattr(opts, name, default) if opts is not None else default


_WorkBase = getattr(dist, "_Work", None) or dist.Work


class _Completer:
    """The thread that completes the futures of Work objects whose get_future() was
    called (DDP's buckets): it waits for whichever pending request completes first
    (never one behind another, so ops of different groups cannot wait on each other)."""

    def __init__(self):
        self.q = queue.Queue()
        self.t = None
        self.lock = threading.Lock()

    def add(self, work):
        with self.lock:
            if self.t is None or not self.t.is_alive():
                self.t = threading.Thread(target=self._run, name="coll-futures", daemon=True)
                self.t.start()
        self.q.put(work)

    def _run(self):
        pending = []
        while True:
            if not pending:
                pending.append(self.q.get())
            while True:
                try:
                    pending.append(self.q.get_nowait())
                except queue.Empty:
                    break
            conn = pending[0]._req.conn  # ready() looks at one connection's requests
            mine = [w for w in pending if w._req.conn is conn]
            k = ready(conn, [w._req for w in mine], 0.001)
            if k is not None:
                w = mine[k]
                pending.remove(w)
                w._settle()


_completer = _Completer()

# Work objects torch's C++ side may still call: torch keeps only the C++ half of a
# Python Work, and once the Python half is collected a later wait() reaches the base
# class and blocks for good (torch 1.13). So each stays here until it was waited for,
# or its future (the only thing DDP keeps) was set. (A dict's store and pop are atomic:
# _alive_lock guards _gpu_pending's looks that pop or remove.)
_alive = {}
_alive_lock = threading.Lock()


class Work(_WorkBase):
    """One op of the backend (one request; list forms copy into their outputs once it
    completes). wait() waits in the caller's thread and raises CollError on failure;
    CUDA ops: the current stream waits for the op on the GPU at submission (as after
    ProcessGroupNCCL's wait(), no host wait) and wait() returns at once."""

    _bufs = ()
    _post = _fut = _exc = None

    def __init__(self, req, value, post=None, bufs=(), waited=False):
        super().__init__()
        self._req = req
        self._bufs = bufs  # scratch in coll memory, given back once done
        self._value = value  # the output tensors (the future's value)
        self._post = post  # copies into list outputs, once, on success
        self._fut = None
        self._exc = None
        self._lock = threading.Lock()
        if req._gpu:  # submitted on torch's current stream (the tensor's device's)
            if not waited:  # (a bound op's stream waits already: _bound.py)
                req.wait_stream(req.stream)
            if post is not None:
                post()  # on the stream, after the op
                self._post = None
            # the host's side of it (its request's slot) is settled later, by the
            # submitter (_reap), or by the completer thread for a future; until then
            # _gpu_pending (or the completer) keeps the Work alive, as _alive does below.
            # (A deque's append is atomic: the lock guards the looks that pop or remove.)
            _gpu_pending.append(self)
            if bufs or req._stages or len(_gpu_pending) >= _reap_at[0]:
                _reap()  # staging memory goes back at once (the next op takes it)
        else:
            _alive[id(self)] = self

    def _forget(self):
        _alive.pop(id(self), None)

    @classmethod
    def _bound_host(cls, q, value):
        """The Work of a bound host op (q a _request.One: one C request, nothing to copy
        nor give back): the fields Work's __init__ would set to nothing are the class's."""
        w = cls.__new__(cls)
        _WorkBase.__init__(w)
        w._req = q
        w._value = value
        w._lock = threading.Lock()
        _alive[id(w)] = w
        return w

    def _finish(self, timeout=None):
        """Wait on the host; run the copies; keep the failure. Raises it."""
        with self._lock:
            if self._exc is None:
                try:
                    self._req.wait(timeout)
                except CollError as e:
                    self._exc = e
                if self._exc is None and self._post is not None:
                    self._post()
                    self._post = None
                for b in self._bufs:
                    self._req.conn._stage_give(b)
                self._bufs = []
            if self._exc is not None:
                raise self._exc

    def _settle(self):
        """The op completed: set the future (if any) and let the Work go."""
        try:
            self._finish()
        except Exception as e:
            if self._fut is not None:
                self._fut.set_exception(e)
        else:
            if self._fut is not None:
                self._fut.set_result(self._value)
        self._forget()

    def _settle_gpu(self):
        """A GPU Work without a future, taken off _gpu_pending (so no other thread
        settles it): its request consumed on the host, its failure kept, its scratch
        given back. Its copies ran on the stream at submission."""
        q = self._req
        if not q._done:
            try:
                q.wait()
            except CollError as e:
                self._exc = e
        elif q._err is not None:
            self._exc = q._err
        for b in self._bufs:
            q.conn._stage_give(b)
        self._bufs = ()

    def wait(self, timeout=None):
        if self._req._gpu:  # the stream waits already; a failure seen is raised
            if self._exc is not None:
                raise self._exc
            return True
        q = self._req
        if not timeout and self._exc is None and self._post is None and type(q) is _One:
            try:  # a bound host op (Work._bound_host): its request alone
                q.wait_forever()
            except CollError as e:
                self._exc = e
                raise
            finally:
                _alive.pop(id(self), None)
            return True
        # torch's "no timeout" is a timedelta of 0
        t = timeout.total_seconds() if timeout and hasattr(timeout, "total_seconds") else None
        try:
            if self._post is None and not self._bufs and not t and self._exc is None:
                try:  # the common case: the request alone, no copies nor scratch
                    self._req.wait()
                except CollError as e:
                    self._exc = e
                    raise
            else:
                self._finish(t if t else None)
        finally:
            if self._req.done:
                self._forget()
        return True

    def is_completed(self):
        try:
            done = self._req.test()
        except CollError as e:
            self._exc = e
            return True
        return done

    def is_success(self):
        return self.is_completed() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._value

    def _source_rank(self):
        """A receive from any rank (recv_anysource), once waited for: who sent."""
        src = self._req.source
        if src is None:
            raise RuntimeError("coll: _source_rank() is for a completed receive from any rank")
        return src

    def get_future(self):
        with self._lock:
            if self._fut is not None:
                return self._fut
            self._fut = torch.futures.Future()
        if self._req._gpu:
            with _alive_lock:
                mine = self in _gpu_pending
                if mine:
                    _gpu_pending.remove(self)
            if not mine:  # settled already
                if self._exc is not None:
                    self._fut.set_exception(self._exc)
                else:
                    self._fut.set_result(self._value)
                return self._fut
        _completer.add(self)
        return self._fut


# GPU Work objects whose request the host has not consumed yet, oldest first. Once
# _REAP_EVERY more have come since the last look, a new one settles those that are done
# (oldest first, stopping at the first still running), and waits for the oldest while
# more than _GPU_PENDING_MAX are left (a connection holds 256 requests). Looking in
# batches, not at every op, spares a look that finds the newest ops still running.
_gpu_pending = collections.deque()
_GPU_PENDING_MAX = 128
_REAP_EVERY = 16
_reap_at = [_REAP_EVERY]  # the length of _gpu_pending at which the next look comes


def _reap():
    while True:
        done, over = [], False
        with _alive_lock:  # the looks do not block: tests of the oldest
            while _gpu_pending and _settled(_gpu_pending[0]._req):
                done.append(_gpu_pending.popleft())
            if len(_gpu_pending) > _GPU_PENDING_MAX:
                over = True
                done.append(_gpu_pending.popleft())
        for w in done:
            if w._fut is None:
                w._settle_gpu()  # waits on the host for the oldest when over the bound
        if not over:
            break
    _reap_at[0] = min(len(_gpu_pending) + _REAP_EVERY, _GPU_PENDING_MAX + 1)


def _settled(q):
    try:
        return q.test()
    except CollError:
        return True


def _work(req, value, post=None, bufs=()):
    return Work(req, value, post, bufs)


class _Splitting:
    """What torch's split_group asks of a group's backend (ProcessGroupNCCL's names), for
    a ProcessGroupColl; the coll group is `coll`."""

    supports_splitting = True

    def __init__(self, pg):
        self.coll = pg.coll
        self._pg = pg
        self.options = _Options(pg)

    def comm_split_count(self):
        return self._pg._splits

    def _set_sequence_number_for_group(self):
        pass

    def _set_default_timeout(self, timeout):
        pass

    def eager_connect_single_device(self, device=None):
        pass

    def name(self):
        return "coll"


class _Options:
    """A backend's options as split_group copies them: the op timeout."""

    def __init__(self, pg):
        self._timeout = getattr(pg.coll, "op_timeout", None)


class ProcessGroupColl(dist.ProcessGroup):
    """A torch ProcessGroup over a coll group (or a child of one)."""

    def __init__(self, group, error=None, rank=0, size=1):
        if group is not None:
            rank, size = group.rank, group.size
        super().__init__(rank, size)
        self.coll = group
        self._error = error
        # ops on contiguous tensors: bound once, then their C calls alone (_bound.py)
        self._bound = _bound.Binder(group) if group is not None else None
        self._name = None
        self._store = None  # torch's store of the group (split_group asks for it)
        self._splits = 0

    @property
    def group_name(self):
        """torch's name of the group (a ProcessGroup keeps its name in its backends,
        and this one has none of torch's: DeviceMesh and FSDP2 ask it by name)."""
        if self._name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    # torch's split_group (torch 2.6 and later) asks the group's backend whether it
    # splits and then the group to split; a group torch got from a creator is its own
    # backend here (no C++ backend of torch's behind it)
    def _get_backend(self, device=None):
        return _Splitting(self)

    def get_group_store(self):
        if self._store is None:
            raise RuntimeError("coll: this group has no store of torch's")
        return self._store

    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None):
        """torch's split_group: collective over this group, every rank with the sorted
        ranks of its part (a rank in no part: one that does not hold it, and gets None).
        A child of coll's (coll_group_split: color the part's first rank, key the rank)."""
        g = self._g()
        ranks = sorted(ranks)
        mine = g.rank in ranks
        self._splits += 1
        child = g.split(ranks[0] if mine else None, g.rank)
        if child is None:
            return None
        pg = ProcessGroupColl(child)
        pg._name = group_name
        pg._store = self._store
        return pg

    # the group, or the failure kept from its creation
    def _g(self):
        if self._error is not None:
            raise self._error
        return self.coll

    def getBackendName(self):
        return "coll"

    def name(self):
        return "coll"

    def _work(self, req, value, post=None, bufs=()):
        return _work(req, value, post, bufs)

    def _bound_op(self, t, name, *args):
        """An op on contiguous tensors bound once (_bound.py): its Work, or None for the
        general way. args end with the Work's value."""
        b = self._bound
        if b is None or self._error is not None:
            return None
        q = getattr(b, name)(*args)
        if q is None:
            return None
        return Work._bound_host(q, args[-1]) if type(q) is _One else Work(q, args[-1], waited=True)

    def _scratch(self, shape, like):
        """An intermediate tensor in coll memory (list forms): no staging copy."""
        return _arrays.scratch(self._g().conn, tuple(shape), like)

    def _submit(self, fn, value, post, bufs):
        try:
            req = fn()
        except BaseException:
            for b in bufs:
                self._g().conn._stage_give(b)
            raise
        return self._work(req, value, post, bufs)

    def allreduce(self, tensors, opts=None):
        op = _redop(opts.reduceOp) if opts is not None else "sum"
        if len(tensors) != 1:
            raise ValueError("coll: one tensor per process (got %d)" % len(tensors))
        t = tensors[0]
        b = self._bound
        if b is not None and self._error is None:  # _bound_op, inline: the commonest op
            q = b.allreduce(t, op, tensors)
            if q is not None:
                if type(q) is _One:
                    return Work._bound_host(q, tensors)
                return Work(q, tensors, waited=True)
        return self._work(self._g().allreduce(t, op=op, async_op=True), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _redop(_opt(opts, "reduceOp", None))
        g = self._g()
        flat, b = self._scratch((sum(t.numel() for t in tensors),), tensors[0])
        torch.cat([t.reshape(-1) for t in tensors], out=flat)

        def post():
            off = 0
            for t in tensors:
                t.copy_(flat[off:off + t.numel()].view(t.shape))
                off += t.numel()

        return self._submit(lambda: g.allreduce(flat, op=op, async_op=True), tensors, post, [b])

    def broadcast(self, tensors, opts=None):
        root = _opt(opts, "rootRank", 0)
        t = tensors[0]
        w = self._bound_op(t, "broadcast", t, root, tensors)
        if w is not None:
            return w
        return self._work(self._g().broadcast(t, root=root, async_op=True), tensors)

    def reduce(self, tensors, opts=None):
        root = _opt(opts, "rootRank", 0)
        op = _redop(_opt(opts, "reduceOp", None))
        return self._work(self._g().reduce(tensors[0], root=root, op=op, async_op=True),
                          tensors)

    def _allgather_base(self, output, input, opts=None):
        w = self._bound_op(input, "allgather", output, input, [output])
        if w is not None:
            return w
        return self._work(self._g().allgather(input, out=output, async_op=True), [output])

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs, x = output_tensors[0], input_tensors[0]
        flat, b = self._scratch((len(outs),) + tuple(x.shape), x)

        def post():
            for i, t in enumerate(outs):
                t.copy_(flat[i])

        return self._submit(lambda: self._g().allgather(x, out=flat, async_op=True),
                            output_tensors, post, [b])

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _redop(_opt(opts, "reduceOp", None))
        w = self._bound_op(input, "reduce_scatter", output, input, op, [output])
        if w is not None:
            return w
        return self._work(self._g().reduce_scatter(input, out=output, op=op, async_op=True),
                          [output])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _redop(_opt(opts, "reduceOp", None))
        ins = list(input_tensors[0])
        flat, b = self._scratch((len(ins),) + tuple(ins[0].shape), ins[0])
        torch.stack(ins, out=flat)
        return self._submit(lambda: self._g().reduce_scatter(flat, out=output_tensors[0], op=op,
                                                             async_op=True),
                            output_tensors, None, [b])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        g = self._g()
        if not output_split_sizes and not input_split_sizes:
            return self._work(g.alltoall(input, out=output, async_op=True), [output])
        return self._work(g.alltoallv(input, output, list(input_split_sizes) or None,
                                      list(output_split_sizes) or None, async_op=True),
                          [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        g = self._g()
        x, bx = self._scratch((sum(t.numel() for t in input_tensors),), input_tensors[0])
        torch.cat([t.reshape(-1) for t in input_tensors], out=x)
        out, bo = self._scratch((sum(t.numel() for t in output_tensors),), input_tensors[0])

        def post():
            off = 0
            for t in output_tensors:
                t.copy_(out[off:off + t.numel()].view(t.shape))
                off += t.numel()

        return self._submit(lambda: g.alltoallv(x, out, [t.numel() for t in input_tensors],
                                                [t.numel() for t in output_tensors],
                                                async_op=True), output_tensors, post, [bx, bo])

    def gather(self, output_tensors, input_tensors, opts=None):
        g = self._g()
        root = _opt(opts, "rootRank", 0)
        x = input_tensors[0]
        if g.rank != root:
            return self._work(g.gather(x, root=root, async_op=True), [])
        outs = output_tensors[0]
        flat, b = self._scratch((len(outs),) + tuple(x.shape), x)

        def post():
            for i, t in enumerate(outs):
                t.copy_(flat[i])

        return self._submit(lambda: g.gather(x, out=flat, root=root, async_op=True),
                            output_tensors, post, [b])

    def scatter(self, output_tensors, input_tensors, opts=None):
        g = self._g()
        root = _opt(opts, "rootRank", 0)
        src = torch.stack(list(input_tensors[0])) if g.rank == root else None
        return self._work(g.scatter(src, output_tensors[0], root=root, async_op=True),
                          output_tensors)

    def send(self, tensors, dstRank, tag=0):
        return self._work(self._g().send(tensors[0], dstRank, tag=tag, async_op=True), [])

    def recv(self, tensors, srcRank, tag=0):
        return self._work(self._g().recv(tensors[0], srcRank, tag=tag, async_op=True),
                          tensors)

    def recv_anysource(self, tensors, tag=0):
        """dist.recv / irecv without src: torch asks the Work's _source_rank()."""
        return self._work(self._g().recv_any(tensors[0], tag=tag, async_op=True), tensors)

    def barrier(self, opts=None):
        return self._work(self._g().barrier(async_op=True), [])


# ---- the creator torch calls -------------------------------------------------------

_state = {"conn": None, "world": None}
_lock = threading.Lock()


def _timeout_s(timeout):
    try:
        s = timeout.total_seconds()
    except AttributeError:
        return None
    return min(s, 86400.0) if s > 0 else None


def _create(opts, pg_options=None):
    pg = _create_pg(opts)
    # torch uses a ProcessGroup a creator returns as the group itself, unnamed: it takes
    # the name torch gave the group (DeviceMesh, FSDP2 and functional collectives look
    # groups up by it)
    pg._name = getattr(opts, "group_id", None) or None
    pg._store = getattr(opts, "store", None)
    return pg


def _create_pg(opts):
    rank, size = opts.group_rank, opts.group_size
    ranks = list(getattr(opts, "global_ranks_in_group", None) or range(size))
    t = _timeout_s(opts.timeout)
    with _lock:
        world = _state["world"]
        if world is None or world.coll is None or not world.coll._h:
            return _open_world(rank, size, t)
        try:
            child = world.coll.create(ranks)
        except CollError as e:  # kept for the first op: torch's members meet in a barrier
            return ProcessGroupColl(None, e, rank, size)
        return ProcessGroupColl(child)


def _open_world(rank, size, t):
    conn = _state["conn"]
    if conn is None or not conn._h:
        # the backend's connection runs every collective of a host group in this process
        # (COLL_DIRECT=all) unless the environment says otherwise: DDP's bucket
        # allreduces through the agent lost up to a sixth of a step to the hand-offs under
        # load (bench/RESULTS.md, "A DDP training step")
        unset = "COLL_DIRECT" not in os.environ
        if unset:
            os.environ["COLL_DIRECT"] = "all"
        try:
            conn = _state["conn"] = connect(os.environ.get("COLL_AGENT_SOCKET"))
        finally:
            if unset:
                os.environ.pop("COLL_DIRECT", None)
    name = os.environ.get("COLL_GROUP") or "world"
    g = conn.open(name, rank=rank, timeout=t)
    if g.size != size:
        g.close()
        raise RuntimeError("coll: group '%s' has %d ranks but torch's world has %d: set "
                           "WORLD_SIZE to the group's size (nodes x local slots)" %
                           (name, g.size, size))
    pg = ProcessGroupColl(g)
    _state["world"] = pg
    return pg


def _register():
    import inspect

    try:
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            dist.Backend.register_backend("coll", _create, extended_api=True,
                                          devices=["cpu", "cuda"])
        else:
            dist.Backend.register_backend("coll", _create, extended_api=True)
    except TypeError:  # torch without extended_api
        dist.Backend.register_backend(
            "coll", lambda store, rank, size, timeout: _create(
                type("O", (), {"group_rank": rank, "group_size": size, "timeout": timeout,
                               "global_ranks_in_group": None})()))
    except (RuntimeError, ValueError) as e:  # registered already (a reload)
        if "already" not in str(e):
            raise


_register()


# ---- a memory pool in coll memory ---------------------------------------------------


def mem_pool():
    """A torch.cuda.MemPool whose blocks are coll memory of the backend's connection
    (libcoll's coll_alloc_hook and coll_free_hook behind torch's
    CUDAPluggableAllocator): tensors made under `with torch.cuda.use_mem_pool(pool):`
    (a model's parameters, DDP's buckets, FSDP's shards) are in coll memory, so ops on
    them never stage. Call it after init_process_group("coll"); torch caches the blocks
    as for its own pool. Keep the pool until torch is done with its tensors: the
    connection lives as long as the process, and a block goes back to the agent when
    torch frees it (the pool's end, or empty_cache). Needs torch.cuda.MemPool (torch 2.5
    and newer): raises RuntimeError, saying so, where torch lacks it."""
    from ._core import _check, lib

    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        raise RuntimeError("coll.torch.mem_pool needs torch.cuda.MemPool and use_mem_pool "
                           "(torch 2.5 or newer); this is torch %s" % torch.__version__)
    with _lock:
        conn = _state["conn"]
        if conn is None or not conn._h:
            raise RuntimeError("coll.torch.mem_pool: call init_process_group('coll') first "
                               "(the pool's memory is the backend connection's)")
        _check(lib().coll_hooks_bind(conn.handle), "binding the allocation hooks")
        path = lib().coll_path
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            os.path.abspath(path) if os.sep in path else path, "coll_alloc_hook",
            "coll_free_hook")
        _state["allocator"] = alloc  # torch holds the C half; this keeps ours too
        return torch.cuda.MemPool(alloc.allocator())
