"""Requests: one op's completion (several of libcoll's for the ops composed of sends
and receives), with what must happen when it completes: staged outputs copied back,
staging buffers returned, the arrays it uses kept alive until then."""
import ctypes
import threading
import time

from . import _lib as L
from ._core import CollError, bare, lib

_TIMEOUT = L.ERRORS["TIMEOUT"]


def _ms(deadline):
    if deadline is None:
        return -1
    return max(0, int((deadline - time.monotonic()) * 1000))


class Request:
    """An op in flight. wait() blocks until it completes and returns its result (the
    output array, or None), raising CollError if it failed; test() looks without
    blocking. Safe to wait on from several threads: one does the waiting, the others
    then see the outcome."""

    def __init__(self, conn, what, reqs, backs=(), stages=(), keep=(), result=None,
                 gpu=False):
        self.conn = conn
        self.what = what
        self._pending = list(reqs)
        self._backs = list(backs)  # (original, staged view): copied back on success
        self._stages = list(stages)
        self._keep = keep
        self._result = result
        self._gpu = gpu
        self._err = None
        self._source = None  # a receive from any rank: the ctypes int libcoll fills
        self.stream = None  # GPU ops: the cudaStream_t (an int) they were submitted on
        self._lock = threading.Lock()
        self._done = not self._pending
        if self._done:
            self._finish()

    @property
    def done(self):
        return self._done

    @property
    def result(self):
        return self._result

    @property
    def source(self):
        """A receive from any rank that completed well: the rank whose send it took
        (None before, after a failure, and for other ops)."""
        if self._source is None or not self._done or self._err is not None:
            return None
        return self._source.value

    def _fail(self, rc, reason):
        if self._err is None:
            self._err = CollError(rc, reason, self.what)

    def _finish(self):
        if self._err is None and self._backs:
            from ._arrays import copy

            for orig, staged in self._backs:
                copy(orig, staged)
        for b in self._stages:
            self.conn._stage_give(b)
        self._backs = self._stages = []
        self._keep = None
        self._done = True

    def _outcome(self):
        if self._err is not None:
            raise self._err
        return self._result

    def _wait_one(self, r, deadline):
        """Wait for r; True when it completed (its failure recorded), False on timeout."""
        rc = lib().coll_wait(self.conn.handle, r, _ms(deadline))
        if rc == _TIMEOUT and deadline is not None:
            reason = lib().coll_last_error().decode(errors="replace")
            done = ctypes.c_int()
            if lib().coll_test(self.conn.handle, r, ctypes.byref(done)) != 0 or done.value:
                self._fail(_TIMEOUT, reason)  # the op's own timeout: it was consumed
                return True
            return False
        if rc != 0:
            self._fail(rc, lib().coll_last_error().decode(errors="replace"))
        return True

    def wait(self, timeout=None):
        """Block until the op completes (timeout in seconds; None: no limit, though the
        agent ends every op within its op timeout). Returns the result; raises
        CollError for a failure, and TimeoutError (the op still pending) when timeout
        passes first."""
        if timeout is None:  # the common case: each C request waited for in turn
            with self._lock:
                while self._pending:
                    rc = _coll_wait(self.conn._h, self._pending[0], -1)
                    if rc != 0:  # the op's own failure (its timeout included): consumed
                        self._fail(rc, lib().coll_last_error().decode(errors="replace"))
                    self._pending.pop(0)
                if not self._done:
                    self._finish()
                return self._outcome()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else max(0, timeout)):
            raise TimeoutError("%s: still in flight after %s s" % (self.what, timeout))
        try:
            while self._pending:
                if not self._wait_one(self._pending[0], deadline):
                    raise TimeoutError("%s: still in flight after %s s" % (self.what, timeout))
                self._pending.pop(0)
            if not self._done:
                self._finish()
            return self._outcome()
        finally:
            self._lock.release()

    def test(self):
        """True when the op has completed (raises CollError if it failed)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            while self._pending:
                done = ctypes.c_int()
                rc = lib().coll_test(self.conn.handle, self._pending[0], ctypes.byref(done))
                if not done.value and rc == 0:
                    return False
                if rc != 0:
                    self._fail(rc, lib().coll_last_error().decode(errors="replace"))
                self._pending.pop(0)
            if not self._done:
                self._finish()
            self._outcome()
            return True
        finally:
            self._lock.release()

    def wait_stream(self, stream):
        """GPU ops: make stream (a torch.cuda.Stream or a cudaStream_t address) wait for
        the op on the GPU, without blocking the host; the request can still be tested
        or waited on."""
        s = getattr(stream, "cuda_stream", stream)
        with self._lock:
            for r in self._pending:
                rc = lib().coll_wait_stream_keep(self.conn.handle, r, s)
                if rc != 0:
                    raise CollError(rc, lib().coll_last_error().decode(errors="replace"),
                                    self.what)


class One(Request):
    """A Request of one C request with nothing to copy back nor give back (a bound op,
    _bound.py): made with the few fields that differ, the rest the class's."""

    _backs = _stages = ()
    _gpu = False
    _err = _source = stream = None
    _done = False

    def __init__(self, conn, what, r, keep, result):  # pylint: disable=super-init-not-called
        self.conn = conn
        self.what = what
        self._pending = [r]
        self._keep = keep
        self._result = result
        self._lock = threading.Lock()

    def wait_forever(self):
        """wait() without a timeout: the C wait and its outcome (its failure raised)."""
        with self._lock:
            if self._pending:
                rc = _coll_wait(self.conn._h, self._pending[0], -1)
                self._pending = []
                if rc != 0:  # the op's own failure (its timeout included): consumed
                    self._fail(rc, lib().coll_last_error().decode(errors="replace"))
                self._keep = None
                self._done = True
        if self._err is not None:
            raise self._err
        return self._result


def _coll_wait(conn, r, ms):
    """coll_wait through _core.bare (converting nothing), looked up at the first call,
    which puts the C function itself in this name's place."""
    global _coll_wait
    _coll_wait = bare("coll_wait")
    return _coll_wait(conn, r, ms)


def _settled(q):
    """Whether q completed (its failure kept in it, not raised)."""
    try:
        return q.test()
    except CollError:
        return True


def ready(conn, requests, timeout=None):
    """The index of one of requests (coll.Request) that has completed (the lowest one
    found), waiting up to timeout seconds (None: no limit); None when none completed in
    time. Failures stay in the request: its wait() raises them."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        heads = []
        for k, q in enumerate(requests):
            if q._done or _settled(q):
                return k
            heads.append(q._pending[0] if q._pending else None)
        live = [(k, r) for k, r in enumerate(heads) if r is not None]
        left = _ms(deadline)
        if deadline is not None and left == 0:
            return None
        if not live:  # another thread is waiting on each: look again shortly
            time.sleep(0.001)
            continue
        arr = (L.Request * len(live))(*[r for _, r in live])
        idx = ctypes.c_size_t(len(live))  # untouched when none completed
        rc = lib().coll_wait_any(conn.handle, arr, len(live), ctypes.byref(idx),
                                 50 if left < 0 else min(left, 50))
        if rc == _TIMEOUT and idx.value >= len(live):
            continue
        k = live[idx.value][0]
        q = requests[k]
        with q._lock:
            if q._pending and q._pending[0].id == arr[idx.value].id:
                q._pending.pop(0)
                if rc != 0:
                    q._fail(rc, lib().coll_last_error().decode(errors="replace"))
        if _settled(q):
            return k


def wait_any(conn, requests, timeout=None):
    """The first of requests (coll.Request) to complete: returned once done, its failure
    raised. TimeoutError when none completes within timeout seconds."""
    if not requests:
        raise ValueError("wait_any of no requests")
    k = ready(conn, requests, timeout)
    if k is None:
        raise TimeoutError("none of %d requests completed in %s s" % (len(requests), timeout))
    requests[k].wait()
    return requests[k]
