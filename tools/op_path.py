#!/usr/bin/env python3
"""Which functions, in which files, a call can reach: the agent's host sources compiled
with gcc -fcallgraph-info (no optimisation, so the graph is the source's), the graph
walked from one function. Calls through pointers (the net's service callback, the
seal's io table, the engine's nap) are listed, not followed: where they lead depends
on what the caller set.

    tools/op_path.py [FUNCTION] [--check] [--avoid FILE,FILE...]

The inline small op between pods (net_inline, the default) is meant to stay out of the
rendezvous (rendezvous.c, rdv_wire.c), the connection set-up (dataconn.c) and the sends
and receives (p2p.c); --check fails when it reaches any of them, or of the files given
with --avoid instead (the engine's turn at sends and receives, net_p2p_post and
net_p2p_watch, must stay out of the rendezvous, the epochs and the set-up).
"""
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AVOID = ("agent/rendezvous.c", "agent/rdv_wire.c", "agent/dataconn.c", "agent/p2p.c")


def sources():
    out = sorted(glob.glob(os.path.join(ROOT, "agent", "*.c")))
    out += sorted(glob.glob(os.path.join(ROOT, "agent", "backends", "*.c")))
    out = [s for s in out if os.path.basename(s) != "nccl.c"]
    # the CUDA side needs CUDA's headers and is not on a host op's path
    return [s for s in out if not os.path.basename(s).startswith("nccl_")
            or os.path.basename(s) in ("nccl_group.c", "nccl_none.c")]


def graph(tmp):
    inc = ["-I" + os.path.join(ROOT, d) for d in ("agent", "libcoll/include", "libcoll/src")]
    for s in sources():
        obj = os.path.join(tmp, os.path.basename(s) + ".o")
        r = subprocess.run(["gcc", "-D_GNU_SOURCE", "-O0", "-fcallgraph-info", "-c", s, "-o", obj]
                           + inc, cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(f"{s}: does not compile alone, left out\n")
    nodes, edges = {}, collections.defaultdict(list)
    for ci in glob.glob(os.path.join(tmp, "*.ci")):
        with open(ci, encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r'node: \{ title: "([^"]+)" label: "[^\\]*\\n([^:]+):\d+', line)
                if m and "shape" not in line:
                    nodes[m.group(1)] = os.path.relpath(m.group(2), ROOT)
                m = re.match(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)" label: "([^"]+)"',
                             line)
                if m:
                    edges[m.group(1)].append((m.group(2), m.group(3)))
    return nodes, edges


def main(argv):
    avoid = AVOID
    if "--avoid" in argv:
        i = argv.index("--avoid")
        avoid = tuple(argv[i + 1].split(","))
        argv = argv[:i] + argv[i + 2:]
    args = [a for a in argv[1:] if not a.startswith("--")]
    start = args[0] if args else "net_inline"
    with tempfile.TemporaryDirectory() as tmp:
        nodes, edges = graph(tmp)
    if start not in nodes:
        print(f"{start}: no such function among the agent's sources", file=sys.stderr)
        return 2
    seen, todo, indirect = {start}, [start], []
    while todo:
        v = todo.pop()
        for t, where in edges[v]:
            if t == "__indirect_call":
                indirect.append((v.split(":")[-1], os.path.relpath(where.rsplit(":", 2)[0], ROOT)
                                 + ":" + where.rsplit(":", 2)[1]))
            elif t in nodes and t not in seen:
                seen.add(t)
                todo.append(t)
    files = collections.Counter(nodes[f] for f in seen)
    print(f"{start} reaches {len(seen)} functions in {len(files)} files")
    for f, n in sorted(files.items()):
        print(f"  {f}: {n}")
    print("through pointers (not followed):")
    for fn, where in sorted(set(indirect)):
        print(f"  {fn} at {where}")
    bad = [f for f in files if f in avoid]
    if bad:
        print("reaches " + ", ".join(bad))
    return 1 if bad and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
