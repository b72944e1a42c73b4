"""Arrays and tensors over coll memory: numpy and torch views of a Buffer, kept alive
by the views; GPU memory reaches torch through a DLPack capsule made here."""
import atexit
import ctypes

from ._core import _device_arg


def _np_dtype(dtype):
    import numpy as np

    return np.dtype(dtype)


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype if isinstance(dtype, str) else _np_dtype(dtype).name
    t = getattr(torch, name, None)
    if not isinstance(t, torch.dtype):
        raise TypeError("dtype %r has no torch equivalent" % (dtype,))
    return t


def _is_torch_dtype(dtype):
    return type(dtype).__module__.split(".")[0] == "torch"


def _host_bytes(buf, nbytes):
    """A ctypes array over the buffer that keeps the Buffer alive."""
    a = (ctypes.c_char * nbytes).from_address(buf.ptr)
    a._coll_buffer = buf
    return a


def host_view(buf, nbytes, dtype, shape, like):
    raw = _host_bytes(buf, max(nbytes, 1))
    if like == "torch":
        import torch

        t = torch.frombuffer(raw, dtype=torch.uint8, count=nbytes) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        return t.view(_torch_dtype(dtype)).reshape(shape)
    import numpy as np

    return np.frombuffer(raw, dtype=np.uint8, count=nbytes).view(_np_dtype(dtype)).reshape(shape)


# ---- DLPack (the stable v0 ABI: DLManagedTensor in a "dltensor" capsule) --------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManaged))
_DLManaged._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                       ("deleter", _DELETER)]

_live = {}  # id(managed) -> what the capsule keeps alive until the consumer's deleter


@_DELETER
def _deleter(p):
    _live.pop(ctypes.addressof(p.contents), None)


def _at_exit():
    """The interpreter is going: a tensor torch frees from now on (its teardown's garbage
    collection) must neither call back into Python nor find its DLPack struct freed
    under it: each live struct gets no deleter (DLPack allows NULL) and is kept for good.
    Before, 3 runs in 6 of gpu_check.py ended in a segfault after every check passed."""
    keep = ctypes.pythonapi.Py_IncRef
    keep.argtypes = [ctypes.py_object]
    keep.restype = None
    for m, shape, _ in list(_live.values()):
        m.deleter = _DELETER()  # NULL
        keep(m)
        keep(shape)


atexit.register(_at_exit)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def device_bytes(buf, nbytes):
    """A torch uint8 tensor over nbytes of the GPU buffer (through DLPack), keeping the
    Buffer alive as long as torch holds the memory."""
    return device_view(buf.ptr, nbytes, buf.device, buf)


def device_view(ptr, nbytes, device, keep=None):
    """A torch uint8 tensor over nbytes of GPU memory at ptr; keep stays alive as long
    as torch holds it."""
    import torch

    m = _DLManaged()
    shape = (ctypes.c_int64 * 1)(nbytes)
    m.dl_tensor.data = ptr
    m.dl_tensor.device = _DLDevice(2, device)  # kDLCUDA
    m.dl_tensor.ndim = 1
    m.dl_tensor.dtype = _DLDataType(1, 8, 1)  # uint8
    m.dl_tensor.shape = shape
    m.dl_tensor.strides = None
    m.dl_tensor.byte_offset = 0
    m.deleter = _deleter
    _live[ctypes.addressof(m)] = (m, shape, keep)
    cap = _capsule_new(ctypes.addressof(m), b"dltensor", None)
    return torch.utils.dlpack.from_dlpack(cap)


def empty(conn, shape, dtype, device, like):
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    dev = _device_arg(device)
    torchy = like == "torch" or _is_torch_dtype(dtype) or dev >= 0
    if torchy:
        import torch

        tdt = _torch_dtype(dtype)
        itemsize = torch.empty(0, dtype=tdt).element_size()
    else:
        itemsize = _np_dtype(dtype).itemsize
    n = 1
    for s in shape:
        n *= s
    nbytes = n * itemsize
    buf = conn.alloc(max(nbytes, 1), dev if dev >= 0 else None)
    if dev < 0:
        return host_view(buf, nbytes, dtype, shape, "torch" if torchy else "numpy")
    return device_bytes(buf, max(nbytes, 1))[:nbytes].view(tdt).reshape(shape)


def _device_u8(buf):
    """The whole GPU buffer as a torch uint8 tensor, made once per buffer (a DLPack
    capsule and torch's import of it cost tens of microseconds); Buffer.release drops it."""
    t = getattr(buf, "_u8", None)
    if t is None:
        t = buf._u8 = device_bytes(buf, buf.size)
    return t


def staging_view(buf, v):
    """An array of v's kind, dtype and shape over the staging buffer buf."""
    shape = tuple(v.obj.shape)
    if buf.device >= 0:
        return _device_u8(buf)[:v.nbytes].view(v.obj.dtype).reshape(shape)
    if v.lib == "torch":
        return host_view(buf, v.nbytes, v.obj.dtype, shape, "torch")
    return host_view(buf, v.nbytes, v.obj.dtype, shape, "numpy")


def copy(dst, src):
    """dst[...] = src for two arrays of one kind (numpy or torch)."""
    if hasattr(dst, "copy_"):
        dst.copy_(src)
    else:
        import numpy as np

        np.copyto(dst, src)


def new_like(v, shape):
    """A new ordinary array of v's kind, dtype and device with this shape."""
    if v.lib == "torch":
        import torch

        return torch.empty(shape, dtype=v.obj.dtype, device=v.obj.device)
    import numpy as np

    return np.empty(shape, dtype=v.obj.dtype)


def scratch(conn, shape, like):
    """A torch tensor of like's dtype and device and this shape over a staging buffer
    of conn (coll memory: ops on it never stage), and the buffer, which the caller gives
    back (conn._stage_give) once no op uses it."""
    import torch

    n = 1
    for d in shape:
        n *= d
    nbytes = n * like.element_size()
    dev = like.device.index if like.is_cuda else -1
    if dev is None:
        dev = torch.cuda.current_device()
    buf = conn._stage_take(max(nbytes, 1), dev)
    if dev >= 0:
        t = _device_u8(buf)[:nbytes]
    else:
        t = host_view(buf, nbytes, "uint8", (nbytes,), "torch")
    return t.view(like.dtype).reshape(shape), buf
