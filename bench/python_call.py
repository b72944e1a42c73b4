#!/usr/bin/python3
"""coll's own Python call against the same op from C (bench/python_c.sh runs it beside
coll-bench). One process per pod: N allreduces of COUNT float32 in coll memory, timed
on rank 0 after a barrier, printed as "python US" (µs per op). Not part of the product.

    python_call.py SOCKET GROUP BYTES ITERS [raw|prepared]

raw: the two C calls through ctypes, without the package; prepared: Group.prepare's op.
"""
import sys
import time

import numpy as np

import coll

sock, group, nbytes, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conn = coll.connect(sock)
g = conn.open(group)
x = conn.zeros(max(1, nbytes // 4), np.float32)
for _ in range(50):
    g.allreduce(x)
g.barrier()
if len(sys.argv) > 5 and sys.argv[5] == "raw":  # the two C calls alone, through ctypes
    import ctypes

    from coll import _lib as L

    lib, r, h, c, p = coll.lib(), L.Request(), g.handle, conn.handle, x.ctypes.data
    pr, n = ctypes.byref(r), x.size
    t0 = time.perf_counter()
    for _ in range(iters):
        lib.coll_allreduce(h, p, p, n, 8, 0, None, pr)
        lib.coll_wait(c, r, -1)
elif len(sys.argv) > 5 and sys.argv[5] == "prepared":
    op = g.prepare("allreduce", x)
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
else:
    t0 = time.perf_counter()
    for _ in range(iters):
        g.allreduce(x)
us = (time.perf_counter() - t0) / iters * 1e6
g.barrier()
if g.rank == 0:
    print("python %.2f" % us, flush=True)
conn.close()
