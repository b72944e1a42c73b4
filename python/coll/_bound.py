"""The torch backend's ops on contiguous tensors, bound once (its common case).

The first op on a given (tensor address, size, dtype, device, reduction or root) checks
its arrays as any op does (coll._ops) and keeps the C arguments made C values; every
later op of the same makes one C call (GPU: two, the op on torch's current stream and
that stream's wait for it) and one Request. Bound: CUDA tensors in coll memory, and host
tensors in coll memory or, on a group whose ops may run in this process (direct ops),
anywhere. Nothing here is trusted for long: libcoll looks every op's addresses up again
at submission, so a binding whose memory went back to the agent (a pool block torch
freed), or host memory the op may not take as it is after all, is refused there,
dropped, and the op goes the general way (coll._ops: staged where it must be), as do
tensors that are not contiguous. Not part of the public API.
"""
import ctypes

from . import _lib as L
from ._core import CollError, _dtype_of, bare, c_args, lib, view
from ._ops import _raw_stream, _what
from ._request import One, Request

_MAX = 1024  # bindings per group; past that they are all dropped and made again
# refusals the general way may get past: memory no longer coll's (INVALID), or host
# memory outside coll buffers where the op did not run in this process after all
_AGAIN = (L.ERRORS["INVALID"], L.ERRORS["TIMEOUT"])
_NONE = object()  # a key whose tensors take the general way
_Req, _byref = L.Request, ctypes.byref


class Binder:
    """One GPU group's bindings (one thread at a time submits, as torch does)."""

    def __init__(self, g):
        self.g = g
        self.conn = g.conn
        self.ops = {}
        self._keep = bare("coll_wait_stream_keep")

    def _fn(self, name, args):
        """The C function without argtypes, and args made C values (_core.bare)."""
        return bare(name), c_args(name, args)

    def _views(self, *tensors):
        """The tensors' views where all are contiguous, on one device, and in coll memory
        (host memory: or where the group's ops may run in this process)."""
        vs = [view(t) for t in tensors]
        dev = vs[0].device
        for v in vs:
            if not v.contig or v.device != dev or \
                    not (self.conn._in_coll(v) or dev < 0 and self.g._raw_try):
                return None
        return vs

    def _keep_binding(self, key, b):
        if len(self.ops) >= _MAX:
            self.ops.clear()
        self.ops[key] = b
        return b

    def _run(self, key, b, keep, value):
        """Submit a binding: a Request (GPU: whose stream wait is done), or None for the
        general way."""
        if b is _NONE or not self.g._h:  # (closed: the general way says so)
            return None
        fn, args, dev, what = b
        r = _Req()
        if dev < 0:  # a host op: one C call
            rc = fn(*args, None, _byref(r))
            if rc == 0:
                return One(self.conn, what, r, keep, value)
            return self._refused(key, rc, what)
        s = _raw_stream(dev)
        cs = ctypes.c_void_p(s)
        rc = fn(*args, cs, ctypes.byref(r))
        if rc:
            return self._refused(key, rc, what)
        rc = self._keep(self.conn._h, r, cs)
        if rc:
            e = CollError(rc, lib().coll_last_error().decode(errors="replace"), what)
            lib().coll_wait(self.conn._h, r, -1)  # in flight: it ends before we raise
            raise e
        q = Request(self.conn, what, [r], (), (), keep, value, True)
        q.stream = s
        return q

    def _refused(self, key, rc, what):
        self.ops.pop(key, None)
        if rc in _AGAIN:  # its memory is no longer coll's, or another refusal:
            return None  # the general way stages, or raises the reason
        raise CollError(rc, lib().coll_last_error().decode(errors="replace"), what)

    # each op: its key, then its binding (made on the first op of that key)

    def allreduce(self, t, op, value):
        if not t.is_contiguous():
            return None
        key = (0, t.data_ptr(), t.numel(), t.dtype, t.get_device(), op)
        b = self.ops.get(key) or self._keep_binding(key, self._allreduce(t, op))
        return self._run(key, b, (t,), value)

    def _allreduce(self, t, op):
        vs = self._views(t)
        if vs is None or type(op) is not str:
            return _NONE
        v, g = vs[0], self.g
        fn, args = self._fn("coll_allreduce", (g._h, v.ptr, v.ptr, v.numel, _dtype_of(v, op),
                                               L.REDOPS[op]))
        return fn, args, v.device, _what(g, "allreduce")

    def broadcast(self, t, root, value):
        if not t.is_contiguous():
            return None
        key = (1, t.data_ptr(), t.numel(), t.dtype, t.get_device(), root)
        b = self.ops.get(key) or self._keep_binding(key, self._broadcast(t, root))
        return self._run(key, b, (t,), value)

    def _broadcast(self, t, root):
        vs = self._views(t)
        if vs is None:
            return _NONE
        v, g = vs[0], self.g
        fn, args = self._fn("coll_broadcast", (g._h, v.ptr, v.ptr, v.numel, _dtype_of(v, None),
                                               root))
        return fn, args, v.device, _what(g, "broadcast")

    def allgather(self, out, x, value):
        if not (x.is_contiguous() and out.is_contiguous()):
            return None
        key = (2, x.data_ptr(), x.numel(), out.data_ptr(), out.numel(), x.dtype, out.dtype,
               x.get_device())
        b = self.ops.get(key) or self._keep_binding(key, self._allgather(out, x))
        return self._run(key, b, (x, out), value)

    def _allgather(self, out, x):
        vs = self._views(x, out)
        g = self.g
        if vs is None or vs[0].dtype != vs[1].dtype or vs[1].numel != vs[0].numel * g.size:
            return _NONE  # the general way checks and says what is wrong
        fn, args = self._fn("coll_allgather", (g._h, vs[0].ptr, vs[1].ptr, vs[0].numel,
                                               _dtype_of(vs[0], None)))
        return fn, args, vs[0].device, _what(g, "allgather")

    def reduce_scatter(self, out, x, op, value):
        if not (x.is_contiguous() and out.is_contiguous()):
            return None
        key = (3, x.data_ptr(), x.numel(), out.data_ptr(), out.numel(), x.dtype, out.dtype,
               x.get_device(), op)
        b = self.ops.get(key) or self._keep_binding(key, self._reduce_scatter(out, x, op))
        return self._run(key, b, (x, out), value)

    def _reduce_scatter(self, out, x, op):
        vs = self._views(x, out)
        g = self.g
        if vs is None or type(op) is not str or vs[0].dtype != vs[1].dtype or \
                vs[0].numel != vs[1].numel * g.size:
            return _NONE
        fn, args = self._fn("coll_reduce_scatter", (g._h, vs[0].ptr, vs[1].ptr, vs[1].numel,
                                                    _dtype_of(vs[0], op), L.REDOPS[op]))
        return fn, args, vs[0].device, _what(g, "reduce_scatter")
