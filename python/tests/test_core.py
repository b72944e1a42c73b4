"""coll's core against real agents: every op on numpy arrays (in coll memory and
staged), between slots of one pod and between two pods, checked against numpy; async
requests; errors; run-time groups; the layout the binding mirrors."""
import ctypes
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import coll
from coll import _lib as L
from coll._core import view
from conftest import ROOT, run_ranks

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.int16, np.float16]


def test_the_layout_matches_abi_txt():
    """Every struct offset, size and enum value of libcoll/abi.txt as the package has it."""
    structs = {"coll_request": L.Request, "coll_group_info": L.GroupInfo,
               "coll_group_opts": L.GroupOpts}
    values = {"COLL_SLOT_ANY": L.SLOT_ANY, "COLL_RANK_ANY": L.RANK_ANY,
              "COLL_SPLIT_NOCOLOR": L.SPLIT_NOCOLOR, "COLL_DEVICE_HOST": L.DEVICE_HOST,
              "COLL_TAG_MAX": L.TAG_MAX, "COLL_ANY_SOURCE": L.ANY_SOURCE,
              "COLL_PREMUL_SUM_FIRST": L.PREMUL_SUM_FIRST}
    values.update({"COLL_" + k.upper(): v for k, v in L.DTYPES.items()})
    values.update({"COLL_" + k.upper(): v for k, v in L.REDOPS.items()})
    values.update({("COLL_" if k == "OK" else "COLL_ERR_") + k: v for k, v in L.ERRORS.items()})
    seen = set()
    with open(os.path.join(ROOT, "libcoll", "abi.txt")) as f:
        for line in f:
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if w[0] == "sizeof":
                assert ctypes.sizeof(structs[w[1]]) == int(w[2]), line
            elif w[0] == "offsetof":
                assert getattr(structs[w[1]], w[2]).offset == int(w[3]), line
                seen.add((w[1], w[2]))
            else:
                assert values[w[1]] == int(w[2]), line
                seen.add(w[1])
    for s, cls in structs.items():
        for f, _ in cls._fields_:
            assert (s, f) in seen, "abi.txt does not list %s.%s" % (s, f)
    for k in values:
        assert k in seen, "abi.txt does not list " + k


def test_a_missing_library_is_named():
    env = dict(os.environ, COLL_LIB="/nonexistent/libcoll.so.0",
               PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", "import coll; coll.version()"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "/nonexistent/libcoll.so.0 (absent)" in r.stderr
    assert "set COLL_LIB" in r.stderr


def _reference(xs, op):
    acc = xs[0].astype(np.float64) if xs[0].dtype.kind == "f" else xs[0].copy()
    for x in xs[1:]:
        if op == "sum":
            acc = acc + x
        elif op == "max":
            acc = np.maximum(acc, x)
        elif op == "min":
            acc = np.minimum(acc, x)
        elif op == "prod":
            acc = acc * x
    return acc.astype(xs[0].dtype)


def _data(rank, n, dt, seed=0):
    rng = np.random.default_rng(1000 * seed + rank)
    if np.dtype(dt).kind == "f":
        return rng.integers(-8, 8, n).astype(dt)  # exact in every float type
    if np.dtype(dt).kind == "u":
        return rng.integers(0, 4, n).astype(dt)
    return rng.integers(-4, 5, n).astype(dt)


def _every_op(i, sock, size, in_coll, direct=None):
    if direct is not None:
        os.environ["COLL_DIRECT"] = direct
    conn = coll.connect(sock)
    g = conn.open("world")
    assert g.size == size
    r = g.rank
    mk = (lambda a: _into(conn, a)) if in_coll else (lambda a: a.copy())
    for dt in DTYPES:
        n = 37
        xs = [_data(k, n, dt) for k in range(size)]
        for op in ("sum", "max", "min", "prod"):
            if op == "prod" and np.dtype(dt).itemsize == 1:
                continue
            x = mk(xs[r])
            g.allreduce(x, op=op)
            np.testing.assert_array_equal(x, _reference(xs, op), err_msg="%s %s" % (dt, op))
        out = mk(np.zeros(n, dt))
        g.allreduce(mk(xs[r]), out=out)
        np.testing.assert_array_equal(out, _reference(xs, "sum"))
        b = mk(xs[r] if r == 1 % size else np.zeros(n, dt))
        g.broadcast(b, root=1 % size)
        np.testing.assert_array_equal(b, xs[1 % size])
        red = mk(xs[r])
        g.reduce(red, root=0)
        if r == 0:
            np.testing.assert_array_equal(red, _reference(xs, "sum"))
        ag = g.allgather(mk(xs[r]), out=mk(np.zeros((size, n), dt)))
        np.testing.assert_array_equal(ag, np.stack(xs))
        blocks = [_data(k, size * 5, dt, seed=2) for k in range(size)]
        rs = g.reduce_scatter(mk(blocks[r]), out=mk(np.zeros(5, dt)))
        np.testing.assert_array_equal(rs, _reference(blocks, "sum")[r * 5:(r + 1) * 5])
        a2a = g.alltoall(mk(blocks[r]), out=mk(np.zeros(size * 5, dt)))
        want = np.concatenate([blocks[k][r * 5:(r + 1) * 5] for k in range(size)])
        np.testing.assert_array_equal(a2a, want)
    # in place allgather: this rank's block of out is the input
    out = mk(np.zeros((size, 3), np.float32))
    out[r] = r + 1
    g.allgather(out[r], out=out)
    np.testing.assert_array_equal(out, np.arange(1, size + 1, dtype=np.float32)[:, None]
                                  * np.ones(3, np.float32))
    # bool or, complex sum and product, bitwise xor
    bl = mk(np.array([r == 0, False, True]))
    g.allreduce(bl, op="max")
    np.testing.assert_array_equal(bl, [True, False, True])
    for cdt in (np.complex64, np.complex128):
        c = mk(np.array([1 + 2j, r * 1j], cdt))
        g.allreduce(c)
        np.testing.assert_array_equal(c, [size * (1 + 2j), sum(range(size)) * 1j])
        c = mk(np.array([1 + 2j, 1j], cdt))
        g.allreduce(c, op="prod")
        np.testing.assert_array_equal(c, [(1 + 2j) ** size, 1j ** size])
    x = mk(np.array([1 << r], np.int32))
    g.allreduce(x, op="bxor")
    assert x[0] == (1 << size) - 1
    with pytest.raises(TypeError, match="complex numbers reduce with sum, avg and prod only"):
        g.allreduce(mk(np.zeros(2, np.complex64)), op="max")
    g.barrier()
    # numpy's memory: taken as it is where the ops run here (COLL_DIRECT=all), else staged
    staged = sum(len(v) for v in conn._stage.values())
    assert in_coll or ((staged == 0) if direct == "all" else (staged >= 1)), staged
    g.close()
    conn.close()


def _into(conn, a):
    x = conn.empty(a.shape, a.dtype)
    x[...] = a
    return x


@pytest.mark.parametrize("in_coll", [True, False], ids=["coll-memory", "staged"])
def test_every_op_between_two_slots_of_one_pod(agent2, in_coll):
    run_ranks(_every_op, 2, agent2.sock, 2, in_coll)


@pytest.mark.parametrize("in_coll,direct", [(True, None), (False, "0"), (False, "all")],
                         ids=["coll-memory", "staged", "numpy-memory-direct"])
def test_every_op_between_two_pods(two_pods, in_coll, direct):
    run_ranks(lambda i: _every_op(i, two_pods[i].sock, 2, in_coll, direct), 2)


def _composed(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world", rank=i)
    s, r = g.size, g.rank
    # alltoallv: rank r sends j + r + 1 rows of width 3 to rank j
    ins = [j + r + 1 for j in range(s)]
    outs = [r + k + 1 for k in range(s)]
    x = np.concatenate([np.full((ins[j], 3), 100 * r + j, np.int64) for j in range(s)])
    out = np.zeros((sum(outs), 3), np.int64)
    g.alltoallv(x, out, ins, outs)
    want = np.concatenate([np.full((outs[k], 3), 100 * k + r, np.int64) for k in range(s)])
    np.testing.assert_array_equal(out, want)
    # gather and scatter, root 1, staged and in coll memory
    for mk in (np.array, lambda a: _into(conn, np.asarray(a))):
        got = g.gather(mk(np.full(4, r, np.float32)), root=1)
        if r == 1:
            np.testing.assert_array_equal(got, np.repeat(np.arange(s, dtype=np.float32), 4)
                                          .reshape(s, 4))
        else:
            assert got is None
        src = mk(np.arange(s * 2, dtype=np.int32).reshape(s, 2)) if r == 1 else None
        dst = mk(np.zeros(2, np.int32))
        g.scatter(src, dst, root=1)
        np.testing.assert_array_equal(dst, [2 * r, 2 * r + 1])
    # tagged sends arrive by tag whatever the order
    if r == 0:
        g.send(np.array([7.0], np.float32), 1, tag=5)
        g.send(np.array([9.0], np.float32), 1, tag=6)
    elif r == 1:
        a, b = np.zeros(1, np.float32), np.zeros(1, np.float32)
        qb = g.recv(b, 0, tag=6, async_op=True)
        qa = g.recv(a, 0, tag=5, async_op=True)
        assert qb.wait(30) is b and qa.wait(30) is a
        assert (a[0], b[0]) == (7.0, 9.0)
    g.barrier()
    conn.close()


def test_alltoallv_gather_scatter_and_tags_across_pods(two_pods):
    run_ranks(lambda i: _composed(i, two_pods[i].sock), 2)


def _any(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world")
    r = g.rank
    if r == 0:  # ranks 1 (this pod) and 2, 3 (the other pod) to receives from any rank
        xs = [conn.zeros(3, np.int32) for _ in range(3)]
        qs = [g.recv_any(xs[0], tag=2, async_op=True), g.recv_any(xs[1], tag=2, async_op=True)]
        assert qs[0].source is None  # not before it completed
        src = g.recv_any(xs[2], tag=2)
        for q in qs:
            assert q.wait(30) is not None
        got = {q.source: x for q, x in zip(qs, xs)}
        got[src] = xs[2]
        assert sorted(got) == [1, 2, 3]
        for s, x in got.items():
            np.testing.assert_array_equal(x, np.full(3, 10 * s, np.int32))
        y = np.zeros(2, np.float64)  # ordinary memory: staged, and the count disagrees
        with pytest.raises(coll.CollError) as e:
            g.recv_any(y, tag=9)
        assert e.value.name == "MISMATCH"
        with pytest.raises(coll.CollError) as e:
            g.recv_any(y, tag=-1)
        assert e.value.name == "INVALID"
        with pytest.raises(ValueError, match="recv_any"):
            g.prepare("recv_any", xs[0])
    else:
        g.send(conn.zeros(3, np.int32) + 10 * r, 0, tag=2)
        if r == 3:
            with pytest.raises(coll.CollError):
                g.send(np.zeros(3, np.float64), 0, tag=9)
    g.barrier()
    conn.close()


def test_receives_from_any_rank_across_pods(two_pods_two_slots):
    socks = [two_pods_two_slots[i // 2].sock for i in range(4)]
    run_ranks(lambda i: _any(i, socks[i]), 4)


def test_alltoallv_gather_scatter_on_four_slots(agent4):
    run_ranks(_composed, 4, agent4.sock)


def _async(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world")
    xs = [_into(conn, np.full(16, k + g.rank, np.float32)) for k in range(4)]
    qs = [g.allreduce(x, async_op=True) for x in xs]
    first = conn.wait_any(qs, timeout=30)
    assert first in qs and first.done
    for k, q in enumerate(qs):
        assert q.wait(30) is xs[k]
        np.testing.assert_array_equal(xs[k], np.full(16, 2 * k + 1, np.float32))
    assert qs[0].test()  # done, and stays done
    # the staging buffer goes back to the pool once a staged op completes
    y = np.ones(1000, np.float64)
    q = g.allreduce(y, async_op=True)
    assert q.wait(30) is y and y[0] == 2.0
    assert sum(len(v) for v in conn._stage.values()) >= 1
    conn.close()


def test_async_requests_wait_any_and_staging_reuse(agent2):
    run_ranks(_async, 2, agent2.sock)


def _prepared(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world")
    n, me, peer = g.size, g.rank, 1 - g.rank
    x = conn.zeros(64, np.float32)
    out = conn.zeros(64 * n, np.float32)
    ar = g.prepare("allreduce", x)
    ag = g.prepare("allgather", x[:8], out=out[:8 * n])
    bc = g.prepare("broadcast", x, root=1)
    sd = g.prepare("send", x[:4], peer, tag=7)
    rv = g.prepare("recv", out[:4], peer, tag=7)
    assert isinstance(ar, coll.Prepared) and "allreduce" in repr(ar)
    for k in range(50):  # new contents every run: the op reads the arrays each time
        x[:] = k + me
        assert ar() is x
        np.testing.assert_array_equal(x, np.full(64, 2 * k + 1, np.float32))
        x[:8] = np.arange(8) + 10 * me
        ag()
        np.testing.assert_array_equal(out[:16], np.r_[np.arange(8), np.arange(8) + 10])
        x[:] = k * 10 + me
        bc()
        assert x[0] == k * 10 + 1
        x[:4] = k + 100 * me
        if me == 0:
            sd()
            rv()
        else:
            rv()
            sd()
        np.testing.assert_array_equal(out[:4], np.full(4, k + 100 * peer, np.float32))
    q = ar.start()
    assert q.wait(30) is x
    # what cannot be prepared says why, and stages nothing for good
    with pytest.raises(ValueError, match="not in coll memory"):
        g.prepare("allreduce", np.ones(4, np.float32))
    with pytest.raises(ValueError, match="'alltoallv' is not an op that can be prepared"):
        g.prepare("alltoallv", x, [32, 32], out, [32, 32])
    with pytest.raises(TypeError, match="async_op"):
        g.prepare("allreduce", x, async_op=True)
    with pytest.raises(ValueError, match="is not an op"):
        g.prepare("nonsense", x)
    g.barrier()
    g.close()
    with pytest.raises(coll.CollError, match="the group is closed"):
        ar()
    with pytest.raises(coll.CollError, match="the group is closed"):
        ar.start()
    conn.close()


def test_prepared_ops_run_again_with_new_contents(two_pods):
    run_ranks(lambda i: _prepared(i, two_pods[i].sock), 2)


def _bound(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world")
    me = g.rank
    x = conn.zeros(64, np.float32)
    for k in range(20):  # the first call binds x; later ones are its two C calls
        x[:] = k + me
        assert g.allreduce(x) is x
        np.testing.assert_array_equal(x, np.full(64, 2 * k + 1, np.float32))
        x[:] = 10 * k + me
        assert g.broadcast(x, 1) is x
        assert x[63] == 10 * k + 1
    assert len(g._binds) == 2 and all(b[1] is not None for b in g._binds.values())
    x.shape = (8, 8)  # another shape: bound again, and right
    x[:] = me
    g.allreduce(x, "max")
    np.testing.assert_array_equal(x, np.ones((8, 8), np.float32))
    assert len(g._binds) == 3
    for k in range(5):  # arrays that die: their bindings are made again for new ones
        y = conn.zeros(16, np.int32)
        y[:] = k + me
        g.allreduce(y)
        np.testing.assert_array_equal(y, np.full(16, 2 * k + 1, np.int32))
        del y
    z = np.full(8, me + 1.0)  # outside coll memory: not bound, the op right all the same
    g.allreduce(z)
    np.testing.assert_array_equal(z, np.full(8, 3.0))
    assert [b[1] for b in g._binds.values() if b[0]() is z] == [None]
    q = g.allreduce(x, "sum", None, True)  # async_op given by position: a Request
    assert isinstance(q, coll.Request) and q.wait(30) is x
    with pytest.raises(ValueError, match="reduction"):
        g.allreduce(x, "bogus")
    g.barrier()
    g.close()
    with pytest.raises(coll.CollError, match="the group is closed"):
        g.allreduce(x)
    conn.close()


def test_blocking_ops_on_coll_memory_bind_once(two_pods):
    run_ranks(lambda i: _bound(i, two_pods[i].sock), 2)


def test_errors_say_what_and_whether_to_retry(agent2):
    conn = coll.connect(agent2.sock)
    with pytest.raises(coll.CollError) as e:
        conn.open("nope")
    assert e.value.name == "NOT_FOUND" and not e.value.retryable
    assert "no group named 'nope'" in e.value.reason
    assert "opening group 'nope'" in str(e.value)
    # slot 1 is held but never joins: slot 0's op ends with its handle's own timeout
    g = conn.open("world", slot=0, timeout=0.5)
    idle = conn.open("world", slot=1)
    with pytest.raises(coll.CollError) as e:
        g.barrier()
    assert e.value.name == "TIMEOUT" and e.value.retryable
    assert "waited 500 ms" in e.value.reason
    with pytest.raises(ValueError, match="reduction 'median'"):
        g.allreduce(np.zeros(1, np.float32), op="median")
    with pytest.raises(TypeError, match="dtype"):
        g.allreduce(np.zeros(1, np.dtype("U1")))
    with pytest.raises(ValueError, match="out has 3 elements, the op needs 2"):
        g.allreduce(np.zeros(2, np.float32), out=np.zeros(3, np.float32))
    with pytest.raises(coll.CollError) as e:
        conn.open("world", rank=7)
    assert e.value.name == "INVALID" and "has ranks 0..1" in e.value.reason
    idle.close()
    conn.close()
    with pytest.raises(coll.CollError, match="the connection is closed"):
        conn.open("world")


def test_mismatched_ops_fail_on_every_rank(agent2):
    def body(i):
        conn = coll.connect(agent2.sock)
        g = conn.open("world", slot=i)
        x = np.zeros(4 if i == 0 else 5, np.float32)
        with pytest.raises(coll.CollError) as e:
            g.allreduce(x)
        assert e.value.name == "MISMATCH" and e.value.retryable
        conn.close()

    run_ranks(body, 2)


def _children(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world", rank=i)
    # split into evens and odds, ordered by descending key
    c = g.split(g.rank % 2, key=-g.rank)
    assert c.size == 2 and c.parent_ranks == sorted([k for k in range(4) if k % 2 == i % 2],
                                                    reverse=True)
    x = np.array([g.rank], np.int64)
    c.allreduce(x)
    assert x[0] == (2 if i % 2 == 0 else 4)
    # ranks 1 and 2 only make a child; 0 and 3 do nothing
    if i in (1, 2):
        k = g.create([2, 1])
        assert k.rank == (0 if i == 2 else 1) and k.parent_ranks == [2, 1]
        y = k.allgather(np.array([i], np.int32))
        np.testing.assert_array_equal(y.ravel(), [2, 1])
        k.close()
    assert g.split(None) is None
    c.close()
    g.barrier()
    conn.close()


def test_split_and_create(agent4):
    run_ranks(_children, 4, agent4.sock)


def test_arrays_in_coll_memory_live_as_long_as_they_are_used(agent2):
    conn = coll.connect(agent2.sock)
    x = conn.zeros((4, 8), np.float32)
    assert conn.find(x) is not None and conn.find(np.zeros(3)) is None
    y = x[1]  # a view keeps the buffer
    addr = y.__array_interface__["data"][0]
    del x
    gc.collect()
    assert conn.find(y) is not None
    del y
    gc.collect()
    b = ctypes.c_void_p()
    off = ctypes.c_size_t()
    assert coll.lib().coll_mem_find(conn.handle, addr, ctypes.byref(b), ctypes.byref(off)) == \
        L.ERRORS["NOT_FOUND"]
    t = conn.zeros(5, "int16", like="torch") if _has_torch() else None
    if t is not None:
        assert str(t.dtype) == "torch.int16" and conn.find(t) is not None
    conn.close()


def _premul(i, sock):
    conn = coll.connect(sock)
    g = conn.open("world", rank=i)
    n, r = g.size, g.rank
    scal = {"float32": lambda k: 0.5 * (k + 1), "float16": lambda k: 0.25 * (k + 3),
            "int8": lambda k: 100 + k, "float64": lambda k: -1.5 * k}
    for dt, s in scal.items():
        xs = [(np.arange(40) % 13 + k).astype(dt) for k in range(n)]
        want = sum(xs[k].astype(np.int64 if dt == "int8" else np.float64) * s(k)
                   for k in range(n))
        want = (want.astype(np.int64) % 256).astype(np.uint8).view(np.int8) if dt == "int8" \
            else want.astype(dt)
        x = _into(conn, xs[r])
        g.allreduce(x, op=("premul_sum", s(r)))
        np.testing.assert_array_equal(x, want, err_msg=dt)
        y = g.reduce_scatter(_into(conn, np.tile(xs[r], n)), out=_into(conn, np.zeros(40, dt)),
                             op=("premul_sum", s(r)))
        np.testing.assert_array_equal(y, want, err_msg=dt)
    with pytest.raises(TypeError, match="no premultiplied sum|complex"):
        g.allreduce(np.zeros(4, np.complex64), op=("premul_sum", 2.0))
    with pytest.raises(ValueError, match="scalar is a number"):
        g.allreduce(np.zeros(4, np.float32), op=("premul_sum", "2"))
    with pytest.raises(ValueError, match="not an integer"):
        g.allreduce(np.zeros(4, np.int32), op=("premul_sum", 2.5))
    x = _into(conn, np.full(3, 2.0, np.float32))  # numpy scalars are numbers too
    g.allreduce(x, op=("premul_sum", np.float32(0.5)))
    np.testing.assert_array_equal(x, np.full(3, 1.0 * n, np.float32))
    conn.close()


def test_premultiplied_sums_each_rank_its_scalar(two_pods):
    run_ranks(lambda i: _premul(i, two_pods[i].sock), 2)


def test_blocks_of_the_allocation_hooks_are_coll_memory_until_freed(agent2):
    # coll_alloc_hook / coll_free_hook (a torch MemPool's allocator), here on host memory:
    # a block is coll memory while it lives, and the package's span cache never keeps a
    # block the hooks freed in C
    conn = coll.connect(agent2.sock)
    lib = coll.lib()
    assert lib.coll_hooks_bind(conn.handle) == 0
    alloc, free = lib.coll_alloc_hook, lib.coll_free_hook
    alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int,
                                                      ctypes.c_void_p]
    free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                         ctypes.c_void_p]
    p = alloc(1 << 16, L.DEVICE_HOST, None)
    assert p
    a = np.ctypeslib.as_array((ctypes.c_float * 16).from_address(p))
    v = view(a)
    assert conn.find(a) is not None and conn.find(a)[1] == 0
    assert conn._in_coll(v) and conn._in_coll(v)  # twice: the second from no cache
    free(p, 1 << 16, L.DEVICE_HOST, None)
    assert conn.find(a) is None
    assert not conn._in_coll(v)
    assert lib.coll_hooks_bind(None) == 0
    assert not alloc(4096, L.DEVICE_HOST, None)
    assert b"no connection is bound" in lib.coll_last_error()
    conn.close()


def _has_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def _torch_cpu(i, sock):
    import torch

    conn = coll.connect(sock)
    g = conn.open("world")
    t = torch.arange(6, dtype=torch.float32) * (g.rank + 1)
    g.allreduce(t)
    assert torch.equal(t, torch.arange(6, dtype=torch.float32) * 3)
    bf = torch.full((8,), 1.5, dtype=torch.bfloat16)
    g.allreduce(bf)
    assert torch.equal(bf, torch.full((8,), 3.0, dtype=torch.bfloat16))
    nc = torch.zeros(4, 3)[:, 1]  # not contiguous: staged both ways
    nc += g.rank + 1
    g.allreduce(nc)
    assert torch.equal(nc, torch.full((4,), 3.0))
    ct = conn.zeros(4, torch.int64)
    ct += g.rank
    g.allreduce(ct, op="max")
    assert ct.tolist() == [1, 1, 1, 1]
    conn.close()


@pytest.mark.skipif(not _has_torch(), reason="torch is not installed (python3-torch)")
def test_torch_cpu_tensors(agent2):
    run_ranks(_torch_cpu, 2, agent2.sock)


def _matrix(i, sock, counts):
    """allreduce over dtype x reduction x count against numpy, in coll memory."""
    conn = coll.connect(sock)
    g = conn.open("world")
    size, r = g.size, g.rank
    ints = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
    floats = [np.float16, np.float32, np.float64]
    for dt in ints + floats + [np.bool_]:
        ops = ["sum", "prod", "min", "max"]
        if dt in ints or dt is np.bool_:
            ops += ["band", "bor", "bxor"]
        if dt in floats:
            ops += ["avg"]
        for op in ops:
            for n in counts:
                xs = [_data(k, n, dt, seed=7).astype(dt) if dt is not np.bool_ else
                      (_data(k, n, np.int32, seed=7) > 0) for k in range(size)]
                x = _into(conn, xs[r])
                g.allreduce(x, op=op)
                if op in ("band", "bor", "bxor") or dt is np.bool_:
                    f = {"sum": np.logical_or, "max": np.logical_or, "prod": np.logical_and,
                         "min": np.logical_and, "band": np.bitwise_and, "bor": np.bitwise_or,
                         "bxor": np.bitwise_xor}[op]
                    if dt is not np.bool_ and op in ("sum", "max", "prod", "min"):
                        want = _reference(xs, op)
                    else:
                        want = xs[0]
                        for k in range(1, size):
                            want = f(want, xs[k])
                elif op == "avg":
                    want = (sum(a.astype(np.float64) for a in xs) / size).astype(dt)
                else:
                    want = _reference(xs, op)
                np.testing.assert_array_equal(x, want, err_msg="%s %s n=%d" % (
                    np.dtype(dt).name, op, n))
    conn.close()


@pytest.mark.parametrize("shape", ["1x1", "4x1"], ids=["one-rank", "four-pods"])
def test_the_dtype_reduction_count_matrix(shape):
    from conftest import one_pod, pods

    ags = [one_pod(1)] if shape == "1x1" else pods(4)
    try:
        run_ranks(lambda i: _matrix(i, ags[i].sock, [1, 1000, 70001]), len(ags), timeout=300)
    finally:
        for a in ags:
            assert a.stop() == 0, a.read_log()
