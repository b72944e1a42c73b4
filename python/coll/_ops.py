"""The collectives of a Group. Each takes arrays (see _core.view), submits one op
(alltoallv, gather and scatter: coll.h's composite ones, made of sends and receives),
and returns its result, or a Request when async_op is true. Arrays outside coll memory are staged,
but where the op runs in this process (a host group's direct ops, coll.h): there libcoll
takes host memory as it is, and the op is tried so first (_raw_first).

GPU arrays: the op follows the work already queued on the stream (default: torch's
current stream of the array's device); staged outputs are copied back on that stream.
"""
import ctypes
import functools
import threading
import weakref

from . import _arrays
from . import _lib as L
from ._core import CollError, _check, _dtype_of, _redop_code, bare, c_args, lib, redop, view
from ._request import Request, _coll_wait

__all__ = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
           "alltoallv", "gather", "scatter", "send", "recv", "recv_any", "barrier"]


class _C:
    """One C call of an op, all its arguments but the request pointer, which submitting
    it passes."""

    __slots__ = ("name", "args")

    def __init__(self, name, *args):
        self.name, self.args = name, args

    def __call__(self, r):
        return getattr(lib(), self.name)(*self.args, r)


# async_op's value when Group.prepare calls an op: checked and resolved, not submitted
PREPARE = object()


class Prepared:
    """An op whose arguments were checked and resolved once (Group.prepare): calling it
    submits the same op again and waits for it; start() submits it and returns a Request.
    Its arrays stay where they are, in coll memory, and every run reads and writes them
    as the op does. One thread at a time runs a Prepared; the group must stay open."""

    def __init__(self, g, what, call, result, keep):
        self._g, self._what, self._result, self._keep = g, what, result, keep
        self._call = call
        # the arguments made C values once: a run converts nothing
        self._fn, self._wait = bare(call.name), bare("coll_wait")
        self._r = L.Request()
        self._args = c_args(call.name, call.args) + (ctypes.byref(self._r),)
        self._conn = g.conn.handle
        self._forever = ctypes.c_int(-1)

    def __call__(self):
        if not self._g._h:
            raise CollError(L.ERRORS["INVALID"], "the group is closed", self._what)
        rc = self._fn(*self._args)
        if rc == 0:
            rc = self._wait(self._conn, self._r, self._forever)
            if rc == 0:
                return self._result
        raise CollError(rc, lib().coll_last_error().decode(errors="replace"), self._what)

    def start(self):
        """Submit the op; a Request to wait for (the arrays are the caller's again then)."""
        if not self._g._h:
            raise CollError(L.ERRORS["INVALID"], "the group is closed", self._what)
        r = L.Request()
        _check(self._call(ctypes.byref(r)), self._what)
        return Request(self._g.conn, self._what, [r], [], [], self._keep, self._result, False)

    def __repr__(self):
        return "<coll.Prepared %s>" % self._what


# what libcoll says of host memory outside coll buffers where the op does not run in this
# process (refused at submission, nothing sent): the op is then staged
_RAW_REFUSED = "host memory outside coll buffers"
_raw = threading.local()


def _raw_first(fn):
    """An op of one C call on a host group that may run in this process: submitted first
    with host arrays as they are; staged where libcoll refuses them."""

    @functools.wraps(fn)
    def op(self, *args, **kwargs):
        if not self._raw_try or kwargs.get("async_op") is PREPARE:
            return fn(self, *args, **kwargs)
        _raw.on = True
        try:
            return fn(self, *args, **kwargs)
        except CollError as e:
            if _RAW_REFUSED not in str(e) or e.name not in ("INVALID", "TIMEOUT"):
                raise
            if e.name == "INVALID" and "runs no ops in this process" in str(e):
                self._raw_try = False  # the agent lends this group's connections to nobody
        finally:
            _raw.on = False
        return fn(self, *args, **kwargs)

    return op


# Blocking in-place ops on one numpy array in coll memory (allreduce, broadcast): the op
# is prepared (checked, its C arguments made) once per array object, its shape, strides
# and dtype and the op's arguments, and later calls are its two C calls. The array is
# held weakly: a binding whose array died is made again for whatever object has its id
# now. (A numpy array over coll memory owns no data: its address never changes.)
_BOUND_MAX = 64  # bindings per group; past that they are all dropped and made again
try:
    from numpy import ndarray as _ndarray
except ImportError:  # pragma: no cover - numpy is a dependency
    _ndarray = None


def _bound_first(fn):
    @functools.wraps(fn)
    def op(self, x, *args, **kwargs):
        if type(x) is not _ndarray or len(args) > 1 or kwargs and (
                kwargs.get("async_op") or kwargs.get("out") is not None or
                kwargs.get("stream") is not None):
            return fn(self, x, *args, **kwargs)
        try:
            key = (fn, id(x), x.shape, x.strides, x.dtype, args,
                   tuple(kwargs.items()) if kwargs else ())
            b = self._binds.get(key)
        except TypeError:  # arguments that do not hash
            return fn(self, x, *args, **kwargs)
        if b is None or b[0]() is not x:
            b = _bind(self, fn, key, x, args, kwargs)
        if b[1] is None:  # not in coll memory, on a GPU, or not an array weakly held
            return fn(self, x, *args, **kwargs)
        if not self._h:
            raise CollError(L.ERRORS["INVALID"], "the group is closed", b[3])
        r = L.Request()
        rc = b[1](*b[2], ctypes.byref(r))
        if rc == 0:
            rc = _coll_wait(self.conn._h, r, -1)
            if rc == 0:
                return x
        raise CollError(rc, lib().coll_last_error().decode(errors="replace"), b[3])

    return op


def _bind(g, fn, key, x, args, kwargs):
    """(weak reference to x, C function, its arguments but the request, what) for op fn
    on x, or with no function where it is not to be bound."""
    try:
        ref = weakref.ref(x)
    except TypeError:
        return (None, None, None, None)
    b = (ref, None, None, None)
    v = view(x)
    if v.device < 0 and g.conn._in_coll(v):
        kw = dict(kwargs)
        kw["async_op"] = PREPARE
        try:
            p = fn(g, x, *args, **kw)
        except ValueError:  # it cannot be prepared; the general call says why, if wrong
            p = None
        if p is not None:
            b = (ref, p._fn, p._args[:-1], p._what)
    if len(g._binds) >= _BOUND_MAX:
        g._binds.clear()
    g._binds[key] = b
    return b


_current_raw = None


def _raw_stream(device):
    """The cudaStream_t of torch's current stream on device, as an int: torch's own raw
    getter where it has one (no Stream object made per op), else the Stream's."""
    global _current_raw
    if _current_raw is None:
        import torch

        _current_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
            (lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _current_raw(device)


class _Prep:
    """One op's arrays resolved to coll memory: staged where they are not in it (or, in
    _raw_first's first try, host arrays taken as they are)."""

    def __init__(self, g, what, stream):
        self.g, self.conn, self.what = g, g.conn, what
        self.raw = getattr(_raw, "on", False)
        self.backs, self.stages, self.keep = [], [], []
        self.device = None
        self.stream_arg = stream
        self.stream = None
        self.tstream = None

    def _dev(self, v):
        if self.device is None:
            self.device = v.device
            if v.device >= 0:
                s = self.stream_arg
                if s is None:  # torch's current stream: staging copies run there anyway
                    self.tstream = None
                    self.stream = _raw_stream(v.device)
                else:
                    import torch

                    self.tstream = s if hasattr(s, "cuda_stream") else \
                        torch.cuda.ExternalStream(s, device=v.device)
                    self.stream = self.tstream.cuda_stream
        elif v.device != self.device:
            raise ValueError("%s: arrays on device %d and %d: one device per op" %
                             (self.what, self.device, v.device))

    def _stage(self, v, copy_in):
        b = self.conn._stage_take(v.nbytes, v.device)
        self.stages.append(b)
        sv = _arrays.staging_view(b, v)
        if copy_in:
            self._on_stream(_arrays.copy, sv, v.obj)
        return b.ptr, sv

    def _on_stream(self, fn, *a):
        if self.device is not None and self.device >= 0 and self.tstream is not None:
            import torch

            with torch.cuda.stream(self.tstream):
                fn(*a)
        else:
            fn(*a)

    def src(self, v):
        """An input: its address in coll memory."""
        self._dev(v)
        self.keep.append(v.obj)
        if self.conn._in_coll(v) or (self.raw and v.contig and v.device < 0):
            return v.ptr
        return self._stage(v, True)[0]

    def dst(self, v, copy_in=False):
        """An output (copy_in: and an input, in place)."""
        self._dev(v)
        self.keep.append(v.obj)
        if self.conn._in_coll(v) or (self.raw and v.contig and v.device < 0):
            return v.ptr
        ptr, sv = self._stage(v, copy_in)
        self.backs.append((v.obj, sv))
        return ptr

    def submit(self, calls, result, async_op):
        """Run each call (a function of a coll_request pointer); a Request for all."""
        if async_op is PREPARE:
            why = ("it is made of several calls" if len(calls) != 1 else
                   "an array is not in coll memory (it would be staged)" if self.stages else
                   "it runs on a GPU stream" if self.device is not None and self.device >= 0
                   else None)
            if why:
                for b in self.stages:
                    self.conn._stage_give(b)
                raise ValueError("%s: cannot be prepared: %s" % (self.what, why))
            return Prepared(self.g, self.what, calls[0], result, self.keep)
        if not async_op and len(calls) == 1 and not self.stages and \
                (self.device is None or self.device < 0):
            # the common blocking op in coll memory: no Request to build
            r = L.Request()
            _check(calls[0](ctypes.byref(r)), self.what)
            _check(lib().coll_wait(self.conn.handle, r, -1), self.what)
            return result
        reqs = []
        try:
            for c in calls:
                r = L.Request()
                _check(c(ctypes.byref(r)), self.what)
                reqs.append(r)
        except BaseException:
            for r in reqs:  # those already in flight finish before the staging goes
                lib().coll_wait(self.conn.handle, r, -1)
            for b in self.stages:
                self.conn._stage_give(b)
            raise
        backs = self.backs
        if self.device is not None and self.device >= 0 and backs:
            # the copy back follows the op on its stream; the host need not wait
            for r in reqs:
                _check(lib().coll_wait_stream_keep(self.conn.handle, r, self.stream), self.what)
            for orig, sv in backs:
                self._on_stream(_arrays.copy, orig, sv)
            backs = []
        q = Request(self.conn, self.what, reqs, backs, self.stages, self.keep, result,
                    self.device is not None and self.device >= 0)
        q.stream = self.stream
        return q if async_op else q.wait()


def _what(g, op):
    return "%s on group '%s' (rank %d)" % (op, g.name, g.rank)


def _check_numel(what, v, want, name):
    if v.numel != want:
        raise ValueError("%s: %s has %d elements, the op needs %d" % (what, name, v.numel, want))


def _same_dtype(what, a, b):
    if a.dtype != b.dtype:
        raise TypeError("%s: dtypes %s and %s differ" % (what, a.dtype, b.dtype))


def _within(inner, outer):
    return outer.ptr <= inner.ptr and inner.ptr + inner.nbytes <= outer.ptr + outer.nbytes


@_bound_first
@_raw_first
def allreduce(self, x, op="sum", out=None, async_op=False, stream=None):
    """Reduce x over the group; the result in out (default: x, in place)."""
    what = _what(self, "allreduce")
    op = redop(op)
    v = view(x)
    dt = _dtype_of(v, op)
    # a premultiplied sum's op is made before anything is staged
    code = _redop_code(self, op, dt) if type(op) is tuple else L.REDOPS[op]
    p = _Prep(self, what, stream)
    if out is None or view(out).ptr == v.ptr:
        send = recv = p.dst(v, copy_in=True)
        res = x if out is None else out
    else:
        o = view(out)
        _same_dtype(what, v, o)
        _check_numel(what, o, v.numel, "out")
        send, recv, res = p.src(v), p.dst(o), out
    n = v.numel
    return p.submit([_C("coll_allreduce", self.handle, send, recv, n, dt,
                        code, p.stream)], res, async_op)


@_bound_first
@_raw_first
def broadcast(self, x, root=0, async_op=False, stream=None):
    """root's x into every rank's x."""
    what = _what(self, "broadcast")
    v = view(x)
    dt = _dtype_of(v, None)
    p = _Prep(self, what, stream)
    ptr = p.dst(v, copy_in=(self.rank == root))
    n = v.numel
    return p.submit([_C("coll_broadcast", self.handle, ptr, ptr, n, dt, root, p.stream)], x,
                    async_op)


@_raw_first
def reduce(self, x, root=0, op="sum", out=None, async_op=False, stream=None):
    """Reduce x over the group into root's out (default: x, in place)."""
    what = _what(self, "reduce")
    op = redop(op)
    v = view(x)
    dt = _dtype_of(v, op)
    # a premultiplied sum's op is made before anything is staged
    code = _redop_code(self, op, dt) if type(op) is tuple else L.REDOPS[op]
    p = _Prep(self, what, stream)
    if out is None:
        send = recv = p.dst(v, copy_in=True)
        res = x
    else:
        o = view(out)
        _same_dtype(what, v, o)
        _check_numel(what, o, v.numel, "out")
        send, recv, res = p.src(v), p.dst(o), out
    n = v.numel
    return p.submit([_C("coll_reduce", self.handle, send, recv, n, dt,
                        code, root, p.stream)], res, async_op)


@_raw_first
def allgather(self, x, out=None, async_op=False, stream=None):
    """Every rank's x, in rank order, into out (default: a new array of shape
    (size,) + x.shape). x may be out's block of this rank (in place)."""
    what = _what(self, "allgather")
    v = view(x)
    dt = _dtype_of(v, None)
    if out is None:
        out = _arrays.new_like(v, (self.size,) + tuple(x.shape))
    o = view(out)
    _same_dtype(what, v, o)
    _check_numel(what, o, v.numel * self.size, "out")
    p = _Prep(self, what, stream)
    if _within(v, o):
        recv = p.dst(o, copy_in=True)
        send = recv + (v.ptr - o.ptr)
    else:
        send, recv = p.src(v), p.dst(o)
    n = v.numel
    return p.submit([_C("coll_allgather", self.handle, send, recv, n, dt, p.stream)], out,
                    async_op)


@_raw_first
def reduce_scatter(self, x, out=None, op="sum", async_op=False, stream=None):
    """x holds size blocks; rank r gets the reduction of block r in out (default: a new
    array of x.shape[0] // size rows)."""
    what = _what(self, "reduce_scatter")
    op = redop(op)
    v = view(x)
    dt = _dtype_of(v, op)
    # a premultiplied sum's op is made before anything is staged
    code = _redop_code(self, op, dt) if type(op) is tuple else L.REDOPS[op]
    if out is None:
        if not x.shape or x.shape[0] % self.size:
            raise ValueError("%s: x's first dimension must be a multiple of %d" %
                             (what, self.size))
        out = _arrays.new_like(v, (x.shape[0] // self.size,) + tuple(x.shape[1:]))
    o = view(out)
    _same_dtype(what, v, o)
    _check_numel(what, v, o.numel * self.size, "x")
    p = _Prep(self, what, stream)
    if _within(o, v):
        send = p.dst(v, copy_in=True)
        recv = send + (o.ptr - v.ptr)
    else:
        send, recv = p.src(v), p.dst(o)
    n = o.numel
    return p.submit([_C("coll_reduce_scatter", self.handle, send, recv, n, dt,
                        code, p.stream)], out, async_op)


@_raw_first
def alltoall(self, x, out=None, async_op=False, stream=None):
    """Block j of x (size equal blocks) to rank j; block i of out from rank i."""
    what = _what(self, "alltoall")
    v = view(x)
    dt = _dtype_of(v, None)
    if v.numel % self.size:
        raise ValueError("%s: %d elements do not split into %d blocks" %
                         (what, v.numel, self.size))
    if out is None:
        out = _arrays.new_like(v, tuple(x.shape))
    o = view(out)
    _same_dtype(what, v, o)
    _check_numel(what, o, v.numel, "out")
    p = _Prep(self, what, stream)
    if o.ptr == v.ptr:
        send = recv = p.dst(v, copy_in=True)
    else:
        send, recv = p.src(v), p.dst(o)
    n = v.numel // self.size
    return p.submit([_C("coll_alltoall", self.handle, send, recv, n, dt, p.stream)], out,
                    async_op)


def _rows(what, v, x, splits, name):
    """Byte offsets and sizes of the blocks of x that splits (rows of dim 0) cut."""
    rows = x.shape[0] if len(x.shape) else 1
    if sum(splits) != rows:
        raise ValueError("%s: %s %s add up to %d rows, the array has %d" %
                         (what, name, list(splits), sum(splits), rows))
    row = v.nbytes // rows if rows else 0
    out, off = [], 0
    for s in splits:
        out.append((off, s * row))
        off += s * row
    return out


def alltoallv(self, x, out, in_splits=None, out_splits=None, async_op=False, stream=None):
    """All-to-all with unequal blocks (MoE): in_splits[j] rows of x (dim 0) to rank j,
    out_splits[i] rows of out from rank i (None: equal blocks)."""
    what = _what(self, "alltoallv")
    v, o = view(x), view(out)
    _same_dtype(what, v, o)
    dt = _dtype_of(v, None)
    if o.ptr == v.ptr and v.nbytes:
        raise ValueError("%s: in place is not supported: give another out" % what)
    eq = lambda a: [a.shape[0] // self.size] * self.size  # noqa: E731
    ins = _rows(what, v, x, in_splits or eq(x), "in_splits")
    outs = _rows(what, o, out, out_splits or eq(out), "out_splits")
    if len(ins) != self.size or len(outs) != self.size:
        raise ValueError("%s: %d splits for a group of %d" % (what, len(ins), self.size))
    p = _Prep(self, what, stream)
    send, recv = p.src(v), p.dst(o)
    item = lib().coll_dtype_size(dt)
    me = self.rank
    if outs[me][1] != ins[me][1]:
        raise ValueError("%s: rank %d sends itself %d bytes but expects %d" %
                         (what, me, ins[me][1], outs[me][1]))
    # coll.h's own (on a GPU group one NCCL group): counts and displacements in elements
    arr = ctypes.c_size_t * self.size
    sc, sd = arr(*(b // item for _, b in ins)), arr(*(a // item for a, _ in ins))
    rc, rd = arr(*(b // item for _, b in outs)), arr(*(a // item for a, _ in outs))
    # (the call's arguments keep the arrays alive until it is submitted)
    return p.submit([_C("coll_alltoallv", self.handle, send, sc, sd, recv, rc, rd, dt,
                         p.stream)], out, async_op)


def gather(self, x, out=None, root=0, async_op=False, stream=None):
    """Every rank's x into root's out (shape (size,) + x.shape; made when None); other
    ranks get None."""
    what = _what(self, "gather")
    v = view(x)
    dt = _dtype_of(v, None)
    p = _Prep(self, what, stream)
    n = v.numel
    if self.rank != root:
        send = p.src(v)
        return p.submit([_C("coll_gather", self.handle, send, None, n, dt, root, p.stream)],
                        None, async_op)
    if out is None:
        out = _arrays.new_like(v, (self.size,) + tuple(x.shape))
    o = view(out)
    _same_dtype(what, v, o)
    _check_numel(what, o, v.numel * self.size, "out")
    recv, send = p.dst(o), p.src(v)
    return p.submit([_C("coll_gather", self.handle, send, recv, n, dt, root, p.stream)], out,
                    async_op)


def scatter(self, x, out, root=0, async_op=False, stream=None):
    """Block j of root's x (shape (size,) + out.shape) into rank j's out; x is read on
    root only (None elsewhere)."""
    what = _what(self, "scatter")
    o = view(out)
    dt = _dtype_of(o, None)
    p = _Prep(self, what, stream)
    n = o.numel
    if self.rank != root:
        recv = p.dst(o)
        return p.submit([_C("coll_scatter", self.handle, None, recv, n, dt, root, p.stream)],
                        out, async_op)
    v = view(x)
    _same_dtype(what, v, o)
    _check_numel(what, v, o.numel * self.size, "x")
    send, recv = p.src(v), p.dst(o)
    return p.submit([_C("coll_scatter", self.handle, send, recv, n, dt, root, p.stream)], out,
                    async_op)


def send(self, x, peer, tag=0, async_op=False, stream=None):
    """x to rank peer (paired with its recv of the same tag, in order)."""
    what = _what(self, "send to %d" % peer)
    v = view(x)
    dt = _dtype_of(v, None)
    p = _Prep(self, what, stream)
    ptr = p.src(v)
    n = v.numel
    return p.submit([_C("coll_send_tag", self.handle, ptr, n, dt, peer, tag, p.stream)], None,
                    async_op)


def recv(self, x, peer, tag=0, async_op=False, stream=None):
    """Into x from rank peer."""
    what = _what(self, "recv from %d" % peer)
    v = view(x)
    dt = _dtype_of(v, None)
    p = _Prep(self, what, stream)
    ptr = p.dst(v)
    n = v.numel
    return p.submit([_C("coll_recv_tag", self.handle, ptr, n, dt, peer, tag, p.stream)], x,
                    async_op)


def recv_any(self, x, tag=0, async_op=False, stream=None):
    """Into x from whichever rank's send of that tag comes first. Returns the sender's
    rank; async: a Request whose source says it once completed. Host groups only."""
    what = _what(self, "recv from any rank")
    v = view(x)
    dt = _dtype_of(v, None)
    p = _Prep(self, what, stream)
    ptr = p.dst(v)
    src = ctypes.c_int(-1)  # libcoll writes it when the request is consumed (q keeps it)
    q = p.submit([_C("coll_recv_any", self.handle, ptr, v.numel, dt, tag, ctypes.byref(src),
                     p.stream)], x, True)
    q._source = src
    if async_op:
        return q
    q.wait()
    return q.source


def barrier(self, async_op=False, stream=None):
    """Every rank of the group has reached it."""
    p = _Prep(self, _what(self, "barrier"), stream)
    return p.submit([_C("coll_barrier", self.handle, p.stream)], None, async_op)
