"""libcoll through ctypes: where the library is found, and one table of its functions.

The table mirrors coll.h; the layouts of the structs and the values of the enums are
those libcoll/abi.txt lists (tests/test_abi.py compares them). Nothing here but the
declarations: the classes of _core.py give them a Python shape.
"""
import ctypes
import os

# ---- the structs a binding mirrors (abi.txt) ---------------------------------------


class Request(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64)]


class GroupInfo(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("local_slot", ctypes.c_int),
        ("local_slots", ctypes.c_int),
        ("node_index", ctypes.c_int),
        ("nodes", ctypes.c_int),
        ("epoch", ctypes.c_uint32),
        ("backend", ctypes.c_char * 16),
        ("name", ctypes.c_char * 64),
    ]


class GroupOpts(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("slot", ctypes.c_int),
        ("op_timeout_ms", ctypes.c_int),
        ("rank", ctypes.c_int),
    ]


SLOT_ANY = -1
RANK_ANY = -1
TAG_MAX = (1 << 30) - 1  # COLL_TAG_MAX: the tags above are coll's own
SPLIT_NOCOLOR = -1
DEVICE_HOST = -1
ANY_SOURCE = -1  # COLL_ANY_SOURCE: a receive from whichever rank sends first
PREMUL_SUM_FIRST = 128  # COLL_PREMUL_SUM_FIRST: the first premultiplied sum a handle makes

# enum coll_dtype and coll_redop (values never change meaning)
DTYPES = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "bfloat16": 7, "float32": 8, "float64": 9, "int16": 10,
    "uint16": 11, "bool": 12, "float8_e4m3": 13, "float8_e5m2": 14, "complex64": 15,
    "complex128": 16,
}
DTYPE_ALIASES = {"float8_e4m3fn": "float8_e4m3"}  # torch's name for it
REDOPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4, "band": 5, "bor": 6, "bxor": 7}
# enum coll_err: name -> value
ERRORS = {
    "OK": 0, "INVALID": 1, "NOMEM": 2, "SYSTEM": 3, "CONNECT": 4, "PROTOCOL": 5,
    "DENIED": 6, "NOT_FOUND": 7, "BUSY": 8, "TIMEOUT": 9, "MISMATCH": 10, "PEER_LOST": 11,
    "EPOCH": 12, "AGENT_LOST": 13, "SHUTDOWN": 14, "UNSUPPORTED": 15, "LIMIT": 16,
    "INTERNAL": 17,
}

# ---- the functions: name, result, arguments -----------------------------------------

_p = ctypes.c_void_p
_pp = ctypes.POINTER(ctypes.c_void_p)
_i = ctypes.c_int
_sz = ctypes.c_size_t
_s = ctypes.c_char_p
_req = Request
_preq = ctypes.POINTER(Request)

FUNCTIONS = [
    ("coll_strerror", _s, [_i]),
    ("coll_err_retryable", _i, [_i]),
    ("coll_last_error", _s, []),
    ("coll_version", _s, []),
    ("coll_dtype_size", _sz, [_i]),
    ("coll_connect", _i, [_pp, _s, _i]),
    ("coll_disconnect", None, [_pp]),
    ("coll_group_open", _i, [_pp, _p, _s, _i]),
    ("coll_group_open_opts", _i, [_pp, _p, _s, ctypes.POINTER(GroupOpts)]),
    ("coll_group_info_get", _i, [_p, ctypes.POINTER(GroupInfo)]),
    ("coll_group_wait", _i, [_p, _i]),
    ("coll_group_create", _i, [_p, ctypes.POINTER(_i), _i, _pp]),
    ("coll_group_split", _i, [_p, _i, _i, _pp]),
    ("coll_group_parent_ranks", _i, [_p, ctypes.POINTER(_i), _i]),
    ("coll_group_close", None, [_pp]),
    ("coll_mem_alloc", _i, [_pp, _p, _sz, _i]),
    ("coll_mem_ptr", _p, [_p]),
    ("coll_mem_size", _sz, [_p]),
    ("coll_mem_release", _i, [_pp]),
    ("coll_mem_find", _i, [_p, _p, _pp, ctypes.POINTER(_sz)]),
    ("coll_hooks_bind", _i, [_p]),
    ("coll_redop_create_premul_sum", _i, [_p, _p, _i, ctypes.POINTER(_i)]),
    ("coll_allreduce", _i, [_p, _p, _p, _sz, _i, _i, _p, _preq]),
    ("coll_broadcast", _i, [_p, _p, _p, _sz, _i, _i, _p, _preq]),
    ("coll_reduce", _i, [_p, _p, _p, _sz, _i, _i, _i, _p, _preq]),
    ("coll_allgather", _i, [_p, _p, _p, _sz, _i, _p, _preq]),
    ("coll_reduce_scatter", _i, [_p, _p, _p, _sz, _i, _i, _p, _preq]),
    ("coll_alltoall", _i, [_p, _p, _p, _sz, _i, _p, _preq]),
    ("coll_send_tag", _i, [_p, _p, _sz, _i, _i, _i, _p, _preq]),
    ("coll_recv_tag", _i, [_p, _p, _sz, _i, _i, _i, _p, _preq]),
    ("coll_recv_any", _i, [_p, _p, _sz, _i, _i, ctypes.POINTER(_i), _p, _preq]),
    ("coll_barrier", _i, [_p, _p, _preq]),
    ("coll_gather", _i, [_p, _p, _p, _sz, _i, _i, _p, _preq]),
    ("coll_scatter", _i, [_p, _p, _p, _sz, _i, _i, _p, _preq]),
    ("coll_alltoallv", _i, [_p, _p, _p, _p, _p, _p, _p, _i, _p, _preq]),
    ("coll_wait", _i, [_p, _req, _i]),
    ("coll_test", _i, [_p, _req, ctypes.POINTER(_i)]),
    ("coll_wait_stream_keep", _i, [_p, _req, _p]),
    ("coll_wait_any", _i, [_p, _preq, _sz, ctypes.POINTER(_sz), _i]),
    ("coll_conn_fd", _i, [_p]),
]


def _candidates():
    """Where libcoll may be, in the order tried: $COLL_LIB, the prefix this package was
    installed under (cmake --install puts it in <prefix>/lib/python3/dist-packages/coll,
    the library in <prefix>/lib), then the loader's own search."""
    env = os.environ.get("COLL_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for up in (3, 4):  # lib/python3/dist-packages/coll, lib/python3.11/site-packages/coll
        d = os.path.normpath(os.path.join(here, *([".."] * up)))
        for sub in ("", "x86_64-linux-gnu", "aarch64-linux-gnu"):
            out.append(os.path.join(d, sub, "libcoll.so.0"))
    out.append("libcoll.so.0")
    out.append("libcoll.so")
    return out


def load():
    """The library with every function of the table declared. Raises OSError naming
    every place tried."""
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, res, args in FUNCTIONS:
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise OSError("%s has no %s: it is older than this package" % (path, name))
            f.restype = res
            f.argtypes = args
        lib.coll_path = path
        return lib
    raise OSError("libcoll not found; set COLL_LIB to its path. Tried: " + "; ".join(tried))
