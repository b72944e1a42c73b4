"""The Python shape of libcoll: connections, groups, buffers, requests and errors.

Arrays: numpy arrays, torch tensors (CPU and CUDA) and any object with __dlpack__. An op
runs in place on memory that lives in coll memory (Connection.empty and friends); any
other array is staged: copied into a coll buffer of the connection before the op, and
its output copied back when the op completes (host) or on the op's stream (GPU).
"""
import ctypes
import os
import threading
import weakref

from . import _lib as L

_lib = None
_lib_lock = threading.Lock()


def lib():
    """libcoll, loaded once (see _lib.load for where it is looked for)."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = L.load()
    return _lib


_bare = {}


def bare(name):
    """libcoll's function name through a handle of its own without argtypes, made once:
    called with C values (c_args), it converts nothing (about 0.5 µs less a call)."""
    fn = _bare.get(name)
    if fn is None:
        fn = lib()[name]
        fn.restype = getattr(lib(), name).restype
        _bare[name] = fn
    return fn


def c_args(name, args):
    """args made the C values the table of function name says (None stays None)."""
    return tuple(a if a is None or isinstance(a, t) else t(a)
                 for a, t in zip(args, getattr(lib(), name).argtypes))


_ERRNAME = {v: k for k, v in L.ERRORS.items()}


class CollError(RuntimeError):
    """A libcoll call failed. code: the coll_err value; name: its name ("TIMEOUT");
    reason: the agent's or libcoll's own words; retryable: whether the same call may
    succeed after reopening the group (or the connection)."""

    def __init__(self, code, reason="", what=""):
        self.code = int(code)
        self.name = _ERRNAME.get(self.code, "UNKNOWN")
        self.reason = reason
        self.what = what
        self.retryable = bool(lib().coll_err_retryable(self.code))
        text = lib().coll_strerror(self.code).decode()
        msg = "%s: %s" % (what, text) if what else text
        if reason:
            msg += ": " + reason
        msg += " [COLL_ERR_%s%s]" % (self.name, ", retryable" if self.retryable else "")
        super().__init__(msg)


def _check(rc, what):
    if rc != 0:
        raise CollError(rc, lib().coll_last_error().decode(errors="replace"), what)


def version():
    """libcoll's version, "major.minor.patch"."""
    return lib().coll_version().decode()


# ---- arrays -------------------------------------------------------------------------

_COMPLEX = ("complex64", "complex128")


class _View:
    """What an op needs of an array: address, size, type, device, and the array."""

    __slots__ = ("obj", "ptr", "nbytes", "dtype", "device", "contig", "lib", "numel")

    def __init__(self, obj, ptr, nbytes, dtype, device, contig, lib_, numel):
        self.obj, self.ptr, self.nbytes, self.dtype = obj, ptr, nbytes, dtype
        self.device, self.contig, self.lib, self.numel = device, contig, lib_, numel


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


_NP_NAMES = {}


def view(x):
    """The _View of x (numpy array, torch tensor, __dlpack__ object or writable buffer).
    Raises TypeError for anything else."""
    if isinstance(x, _View):
        return x
    if _is_torch(x):
        dev = x.device
        return _View(x, x.data_ptr(), x.element_size() * x.numel(), str(x.dtype)[6:],
                     dev.index if dev.type == "cuda" else L.DEVICE_HOST, x.is_contiguous(),
                     "torch", x.numel())
    import numpy as np

    if isinstance(x, np.ndarray):
        dt = x.dtype
        name = _NP_NAMES.get(dt)
        if name is None:
            name = _NP_NAMES[dt] = dt.name  # numpy computes it in Python each time
        return _View(x, x.__array_interface__["data"][0], x.nbytes, name,
                     L.DEVICE_HOST, x.flags.c_contiguous, "numpy", x.size)
    if hasattr(x, "__dlpack__"):
        kind, _ = x.__dlpack_device__()
        if kind == 1:  # kDLCPU
            return view(np.from_dlpack(x))
        import torch

        return view(torch.from_dlpack(x))
    try:
        mv = memoryview(x)
    except TypeError:
        raise TypeError("%s is not an array: coll takes numpy arrays, torch tensors, "
                        "__dlpack__ objects and writable buffers" % type(x).__name__)
    return view(np.frombuffer(mv, dtype=np.uint8) if mv.readonly else np.asarray(mv))


def _dtype_of(v, reducing):
    """coll's dtype code for the array's dtype (checked against the reduction)."""
    name = v.dtype
    if name in _COMPLEX and reducing not in (None, "sum", "avg", "prod"):
        raise TypeError("%s with %s: complex numbers reduce with sum, avg and prod only" %
                        (name, reducing))
    code = L.DTYPES.get(L.DTYPE_ALIASES.get(name, name))
    if code is None:
        raise TypeError("dtype %s: coll carries %s" % (name, ", ".join(L.DTYPES)))
    return code


def redop(op):
    """coll's reduction code for "sum"/"prod"/"min"/"max"/"avg"/"band"/"bor"/"bxor"
    (or the code itself), or ("premul_sum", scalar): this rank's input times its own
    scalar, then summed (coll_redop_create_premul_sum)."""
    if isinstance(op, (tuple, list)) and len(op) == 2 and str(op[0]).lower() == "premul_sum":
        import numbers

        if isinstance(op[1], bool) or not isinstance(op[1], numbers.Real):
            raise ValueError("premul_sum: the scalar is a number, not %r" % (op[1],))
        return ("premul_sum", float(op[1]) if isinstance(op[1], float) else op[1])
    if isinstance(op, str) and op.lower() in L.REDOPS:
        return op.lower()
    if isinstance(op, int) and op in L.REDOPS.values():
        return [k for k, v in L.REDOPS.items() if v == op][0]
    raise ValueError("reduction %r: one of %s, or (\"premul_sum\", scalar)" %
                     (op, ", ".join(L.REDOPS)))


_PACK = {"int8": "<b", "uint8": "<B", "int16": "<h", "uint16": "<H", "int32": "<i",
         "uint32": "<I", "int64": "<q", "uint64": "<Q", "float16": "<e", "float32": "<f",
         "float64": "<d"}


def _scalar_bytes(value, dt):
    """value as one element of coll dtype dt (its bytes)."""
    import struct

    name = [k for k, v in L.DTYPES.items() if v == dt][0]
    if name in _PACK:
        fmt = _PACK[name]
        if fmt[1] in "bBhHiIqQ":  # modulo 2^bits, as the products are
            if int(value) != value:
                raise ValueError("premul_sum: scalar %r for %s is not an integer" % (value, name))
            return struct.pack(fmt.upper(), int(value) % (1 << (8 * struct.calcsize(fmt))))
        return struct.pack(fmt, float(value))
    if name == "bfloat16":  # float32's top half, rounded to nearest even
        u = struct.unpack("<I", struct.pack("<f", value))[0]
        return struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    if name.startswith("float8"):
        import torch

        tdt = torch.float8_e4m3fn if name == "float8_e4m3" else torch.float8_e5m2
        return bytes([int(torch.tensor([value]).to(tdt).view(torch.uint8)[0])])
    raise TypeError("premul_sum: dtype %s takes no premultiplied sum" % name)


def _redop_code(g, op, dt):
    """The C value of a premultiplied sum (redop's ("premul_sum", scalar)) for an op of
    dtype dt on group g: the same pair again is the same value, at no round trip."""
    b = ctypes.create_string_buffer(_scalar_bytes(op[1], dt), 8)
    out = ctypes.c_int()
    _check(lib().coll_redop_create_premul_sum(g.handle, b, dt, ctypes.byref(out)),
           "premul_sum(%r)" % (op[1],))
    return out.value


def _device_arg(device):
    """-1 (host) or a CUDA ordinal from None/"cpu"/"cuda"/"cuda:N"/N/torch.device."""
    if device is None:
        return L.DEVICE_HOST
    if isinstance(device, int):
        return device
    s = str(device)
    if s == "cpu":
        return L.DEVICE_HOST
    if s == "cuda":
        return 0
    if s.startswith("cuda:"):
        return int(s[5:])
    raise ValueError("device %r: 'cpu', 'cuda', 'cuda:N' or an ordinal" % (device,))


# ---- connection ---------------------------------------------------------------------


class _Closes:
    """with-blocks and garbage collection close it (close() must be idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Connection(_Closes):
    """A connection to this pod's agent (coll_connect). socket: the agent's socket
    (None: $COLL_AGENT_SOCKET, else the default path); timeout in seconds. Closing it
    (close, or leaving a with block) ends every group, buffer and request it opened."""

    def __init__(self, socket=None, timeout=10.0):
        self._h = ctypes.c_void_p()
        _check(lib().coll_connect(ctypes.byref(self._h),
                                  socket.encode() if socket else None,
                                  int(timeout * 1000) if timeout else 0),
               "connecting to the agent at %s" %
               (socket or os.environ.get("COLL_AGENT_SOCKET") or "the default socket"))
        self._owned = weakref.WeakSet()  # groups and buffers: ended with the connection
        self._stage = {}  # device -> [Buffer], free staging buffers
        self._stage_lock = threading.Lock()
        self._spans = {}  # address -> its coll buffer's span; emptied by every release
        # starts of this object's Buffers: only their spans are cached (a block of a
        # memory pool, coll_alloc_hook's, is released in C where no cache is emptied)
        self._starts = set()

    @property
    def handle(self):
        if not self._h:
            raise CollError(L.ERRORS["INVALID"], "the connection is closed", "coll")
        return self._h

    def close(self):
        """Disconnect; every group and buffer of the connection ends with it."""
        if self._h:
            for o in list(self._owned):
                o._orphan()
            for free in self._stage.values():
                for b in free:
                    b.__dict__.pop("_u8", None)
            self._stage = {}
            lib().coll_disconnect(ctypes.byref(self._h))

    def fileno(self):
        """The descriptor that turns readable when an op completes (coll_conn_fd); from
        then on every op goes through the agent."""
        return lib().coll_conn_fd(self.handle)

    # groups
    def open(self, name=None, slot=None, rank=None, timeout=None):
        """Take a slot of the group called name (None: $COLL_GROUP, else "world"): the
        lowest free one, the given slot, or the one that gives this rank. timeout: this
        handle's op timeout in seconds (None: the group's timeouts.op_ms)."""
        name = name or os.environ.get("COLL_GROUP") or "world"
        o = L.GroupOpts(ctypes.sizeof(L.GroupOpts), L.SLOT_ANY if slot is None else slot,
                        0 if timeout is None else max(1, int(timeout * 1000)),
                        L.RANK_ANY if rank is None else rank)
        h = ctypes.c_void_p()
        _check(lib().coll_group_open_opts(ctypes.byref(h), self.handle, name.encode(),
                                          ctypes.byref(o)), "opening group '%s'" % name)
        return Group(self, h)

    # memory
    def alloc(self, nbytes, device=None):
        """A Buffer of nbytes shared with the agent (host memory, or GPU memory of the
        given CUDA device)."""
        h = ctypes.c_void_p()
        dev = _device_arg(device)
        _check(lib().coll_mem_alloc(ctypes.byref(h), self.handle, int(nbytes), dev),
               "allocating %d bytes of coll memory" % nbytes)
        return Buffer(self, h, dev)

    def empty(self, shape, dtype="float32", device=None, like=None):
        """An array in coll memory: numpy for host memory unless dtype is a torch dtype or
        like == "torch"; a torch tensor for GPU memory. Ops on it never stage."""
        from . import _arrays

        return _arrays.empty(self, shape, dtype, device, like)

    def zeros(self, shape, dtype="float32", device=None, like=None):
        a = self.empty(shape, dtype, device, like)
        a[...] = 0
        return a

    def empty_like(self, x):
        v = view(x)
        return self.empty(tuple(x.shape), x.dtype, v.device if v.device >= 0 else None,
                          v.lib)

    def find(self, x):
        """(Buffer address, offset) of the coll buffer that holds x's first byte, or None
        when x is not in this connection's coll memory."""
        v = view(x)
        b = ctypes.c_void_p()
        off = ctypes.c_size_t()
        rc = lib().coll_mem_find(self.handle, v.ptr, ctypes.byref(b), ctypes.byref(off))
        return None if rc else (b.value, off.value)

    def _in_coll(self, v):
        if not v.contig:
            return False
        if v.nbytes == 0:
            return True
        hit = self._spans.get(v.ptr)  # (start, end) of the buffer that held v.ptr
        if hit is None:
            b = ctypes.c_void_p()
            off = ctypes.c_size_t()
            if lib().coll_mem_find(self._h, v.ptr, ctypes.byref(b), ctypes.byref(off)):
                return False
            start = v.ptr - off.value
            hit = (start, start + lib().coll_mem_size(b))
            if start not in self._starts:
                return v.ptr + v.nbytes <= hit[1]
            if len(self._spans) > 4096:
                self._spans.clear()
            self._spans[v.ptr] = hit
        return v.ptr + v.nbytes <= hit[1]

    # staging: a small pool of buffers per device, each reused by one op at a time
    def _stage_take(self, nbytes, device):
        with self._stage_lock:
            free = self._stage.setdefault(device, [])
            for i, b in enumerate(free):
                if b.size >= nbytes:
                    return free.pop(i)
        size = 1 << max(16, (int(nbytes) - 1).bit_length())
        return self.alloc(size, device if device >= 0 else None)

    def _stage_give(self, b):
        with self._stage_lock:
            free = self._stage.setdefault(b.device, [])
            free.append(b)
            free.sort(key=lambda x: x.size)
            while sum(x.size for x in free) > STAGE_KEEP_BYTES and len(free) > 1:
                free.pop(0).release()

    # completion
    def wait_any(self, requests, timeout=None):
        """The first of requests to complete (it is then done; its failure raised)."""
        from ._request import wait_any

        return wait_any(self, requests, timeout)


# staging buffers kept for reuse per device (larger ones are kept one at a time)
STAGE_KEEP_BYTES = 256 << 20


class Buffer:
    """Memory shared with the agent (coll_mem_alloc). ptr: its address here (a device
    address for GPU memory); size in bytes. Released when dropped, or by release()."""

    def __init__(self, conn, h, device):
        self.conn = conn
        self._h = h
        self.device = device
        self.ptr = lib().coll_mem_ptr(h)
        self.size = lib().coll_mem_size(h)
        conn._owned.add(self)
        conn._starts.add(self.ptr)

    def _orphan(self):
        self._h = None

    def release(self):
        """Unshare the memory (BUSY while an op uses it)."""
        if self._h:
            self.conn._spans.clear()
            _check(lib().coll_mem_release(ctypes.byref(self._h)), "releasing a buffer")
            self.conn._starts.discard(self.ptr)
            self._h = None
            self.__dict__.pop("_u8", None)  # the cached torch view (_arrays._device_u8)

    def __del__(self):
        if self._h and self.conn._h:
            self.conn._spans.clear()
            if lib().coll_mem_release(ctypes.byref(self._h)) == 0:
                self.conn._starts.discard(self.ptr)


# ---- groups -------------------------------------------------------------------------


class Group(_Closes):
    """A slot of a coll group: its ops and its children. rank, size, name, backend,
    epoch, nodes, node_index, local_slot, local_slots and parent_ranks describe it."""

    def __init__(self, conn, h):
        self.conn = conn
        self._h = h
        conn._owned.add(self)
        self._info()
        n = lib().coll_group_parent_ranks(h, None, 0)
        if n > 0:
            arr = (ctypes.c_int * n)()
            lib().coll_group_parent_ranks(h, arr, n)
            self.parent_ranks = list(arr)
        else:
            self.parent_ranks = None
        # its ops may run in this process (direct ops), where host arrays outside coll
        # memory need no staging (_ops._raw_first); a child's never do
        self._raw_try = (self.backend == "host" and self.nodes > 1 and self.local_slots == 1
                         and self.parent_ranks is None)
        self._binds = {}  # blocking ops on arrays in coll memory, prepared once (_ops.py)

    def _info(self):
        i = L.GroupInfo()
        _check(lib().coll_group_info_get(self.handle, ctypes.byref(i)), "group info")
        for f, _ in L.GroupInfo._fields_:
            v = getattr(i, f)
            setattr(self, f, v.decode() if isinstance(v, bytes) else v)

    @property
    def handle(self):
        if not self._h:
            raise CollError(L.ERRORS["INVALID"], "the group is closed", "coll")
        return self._h

    def _orphan(self):
        self._h = None

    def close(self):
        """Give the slot back (the other ranks' ops in flight fail with PEER_LOST)."""
        if self._h and self.conn._h:
            lib().coll_group_close(ctypes.byref(self._h))
        self._h = None

    def __repr__(self):
        return "<coll.Group %s rank %s of %s (%s)>" % (self.name, self.rank, self.size,
                                                      self.backend)

    def wait_formed(self, timeout=None):
        """Wait until the group stands on every pod (TIMEOUT says what it waits for)."""
        _check(lib().coll_group_wait(self.handle, -1 if timeout is None else
                                     int(timeout * 1000)), "waiting for group '%s'" % self.name)
        self._info()

    def create(self, ranks):
        """The child of these ranks of this group (called by the listed ranks only)."""
        arr = (ctypes.c_int * len(ranks))(*ranks)
        h = ctypes.c_void_p()
        _check(lib().coll_group_create(self.handle, arr, len(ranks), ctypes.byref(h)),
               "creating a child of group '%s' of ranks %s" % (self.name, list(ranks)))
        return Group(self.conn, h)

    def split(self, color, key=None):
        """MPI_Comm_split over every rank: the child of this color (None for color None
        or SPLIT_NOCOLOR), ordered by key (default: this rank)."""
        h = ctypes.c_void_p()
        c = L.SPLIT_NOCOLOR if color is None else color
        _check(lib().coll_group_split(self.handle, c, self.rank if key is None else key,
                                      ctypes.byref(h)), "splitting group '%s'" % self.name)
        return Group(self.conn, h) if h.value else None



def connect(socket=None, timeout=10.0):
    """A new Connection (see Connection)."""
    return Connection(socket, timeout)


_default = None
_default_lock = threading.Lock()


def default_connection():
    """The process's shared connection, made on first use ($COLL_AGENT_SOCKET)."""
    global _default
    with _default_lock:
        if _default is None or not _default._h:
            _default = Connection()
        return _default


# the ops (_ops.py) are Group's methods
from . import _ops  # noqa: E402

for _n in _ops.__all__:
    setattr(Group, _n, getattr(_ops, _n))


def _prepare(self, op, *args, **kwargs):
    """One op checked and resolved now, run later as often as wanted, as MPI's persistent
    collectives are: g.prepare("allreduce", x)() runs what g.allreduce(x) runs, without
    checking the arguments again. Every array must be a host array in coll memory (a
    Prepared never stages); op is any op but the composed ones (alltoallv, gather,
    scatter) and recv_any (its answer is its own). Returns a coll.Prepared."""
    if op not in _ops.__all__ or op in ("alltoallv", "gather", "scatter", "recv_any"):
        raise ValueError("prepare: '%s' is not an op that can be prepared" % op)
    if "async_op" in kwargs:
        raise TypeError("prepare: run the Prepared, or its start(), for async_op")
    return getattr(_ops, op)(self, *args, async_op=_ops.PREPARE, **kwargs)


Group.prepare = _prepare
