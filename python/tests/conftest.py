"""What the Python tests share: real coll-agent processes on private sockets (configs
written on the fly, as tests/harness.c does for C), and ranks run as forked processes
that report back, each with a deadline.

$COLL_AGENT names the agent binary and $COLL_LIB the library (CTest sets both); without
them the build directory next to the sources is tried.
"""
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import pytest
except ImportError:  # gpu_check.py runs without it (the GPU host has no pytest)
    pytest = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))


def _find(env, name):
    p = os.environ.get(env)
    if p:
        return p
    for d in ("build-test", "build"):
        c = os.path.join(ROOT, d, name)
        if os.path.exists(c):
            return c
    msg = "%s not found: build the project or set $%s" % (name, env)
    if pytest is None:
        raise SystemExit(msg)
    pytest.skip(msg, allow_module_level=True)


AGENT = _find("COLL_AGENT", "coll-agent")
os.environ.setdefault("COLL_LIB", _find("COLL_LIB", "libcoll.so.0"))


def free_port():
    """A TCP port below the ephemeral range that was free a moment ago."""
    lo = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except OSError:
        pass
    rnd = int.from_bytes(os.urandom(2), "little")
    for i in range(2000):
        port = 10000 + (rnd + i * 7919) % max(1, lo - 10000)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port")


class Agent:
    """A coll-agent process on its own socket, config and log."""

    def __init__(self, body, extra=""):
        self.tail = None  # the log's last 4000 characters, once stopped
        self.dir = tempfile.mkdtemp(prefix="coll-py-")
        self.sock = os.path.join(self.dir, "agent.sock")
        self.cfg = os.path.join(self.dir, "agent.yaml")
        self.log = os.path.join(self.dir, "agent.log")
        with open(self.cfg, "w") as f:
            f.write("agent:\n  socket: %s\n  socket_mode: 0666\n%s%s" %
                    (self.sock, extra, body))
        logf = open(self.log, "w")
        self.proc = subprocess.Popen([AGENT, "--config", self.cfg], stdout=logf,
                                     stderr=subprocess.STDOUT)
        logf.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the agent exited (%d):\n%s" % (self.proc.returncode,
                                                                   self.read_log()))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(self.sock)
                return
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        self.stop()
        raise RuntimeError("the agent is not accepting within 30 s:\n" + self.read_log())

    def read_log(self):
        if self.tail is not None:
            return self.tail
        with open(self.log) as f:
            return f.read()[-4000:]

    def stop(self):
        """SIGTERM (SIGKILL after 10 s); the exit status. The directory goes, its log's
        tail stays for read_log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tail is None:
            self.tail = self.read_log()
            shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


def torch_recv_from_any(rank, size, tag):
    """torch's recv and irecv without src (in turn) on rank 0, a send of 10 x rank from
    every other rank: each receive says its sender, each sender's value lands."""
    import torch
    import torch.distributed as dist

    if rank != 0:
        dist.send(torch.full((2,), 10.0 * rank), 0, tag=tag)
        return
    got = {}
    for k in range(size - 1):
        x = torch.zeros(2)
        if k % 2:
            w = dist.irecv(x, tag=tag)
            w.wait()
            src = w._source_rank()
        else:
            src = dist.recv(x, tag=tag)
        got[src] = x.tolist()
    assert got == {k: [10.0 * k] * 2 for k in range(1, size)}, got


def one_pod(slots, name="world", extra_group=""):
    """An agent holding a host group of `slots` local slots on one pod."""
    return Agent("groups:\n  - name: %s\n    backend: host\n    local_slots: %d\n%s" %
                 (name, slots, extra_group))


def pods(n, slots=1, name="world", op_ms=20000):
    """n agents, one per pod, on loopback: a host group of n x slots ranks."""
    port = free_port()
    out = []
    try:
        for i in range(n):
            out.append(Agent(
                "node:\n  index: %d\n  name: pod-%d\n"
                "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                "groups:\n  - name: %s\n    backend: host\n    members: %d\n"
                "    local_slots: %d\n"
                "    timeouts: {op_ms: %d, heartbeat_ms: 250, join_ms: 5000}\n" %
                (i, i, port, name, n, slots, op_ms)))
    except BaseException:
        for a in out:
            a.stop()
        raise
    return out


def _child(fn, w, i, args):
    try:
        fn(i, *args)
        w.send(None)
    except BaseException:
        w.send(traceback.format_exc())
    finally:
        os._exit(0)  # skip the parent's atexit handlers and pytest's teardown


def run_ranks(fn, n, *args, timeout=60):
    """fn(i, *args) in n forked processes at once; raises with every failing rank's
    traceback, or when one is still running after timeout seconds (then killed)."""
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
    procs = [ctx.Process(target=_child, args=(fn, pipes[i][1], i, args)) for i in range(n)]
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()
    results = {}
    readers = {pipes[i][0]: i for i in range(n)}
    deadline = time.monotonic() + timeout
    try:
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for r in multiprocessing.connection.wait(list(readers), timeout=left):
                i = readers.pop(r)
                try:
                    results[i] = r.recv()
                except EOFError:
                    results[i] = "exited without a word (code %s)" % procs[i].exitcode
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
    errors = ["rank %d:\n%s" % (i, e) for i, e in sorted(results.items()) if e]
    missing = [i for i in range(n) if i not in results]
    if missing:
        errors.append("ranks %s did not finish within %s s" % (missing, timeout))
    if errors:
        raise AssertionError("\n".join(errors))


if pytest is not None:
    @pytest.fixture
    def agent2():
        """One pod with a host group "world" of two slots."""
        a = one_pod(2)
        yield a
        assert a.stop() == 0, a.read_log()


    @pytest.fixture
    def agent4():
        a = one_pod(4)
        yield a
        assert a.stop() == 0, a.read_log()


    @pytest.fixture
    def two_pods():
        """Two pods (agents) of one slot each: a host group "world" of two ranks."""
        ags = pods(2)
        yield ags
        for a in ags:
            assert a.stop() == 0, a.read_log()

    @pytest.fixture
    def two_pods_two_slots():
        """Two pods (agents) of two slots each: ranks 0, 1 on the first, 2, 3 on the
        second."""
        ags = pods(2, slots=2)
        yield ags
        for a in ags:
            assert a.stop() == 0, a.read_log()
