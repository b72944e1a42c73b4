#!/usr/bin/env python3
"""The house's shape, read from a build: which source files call each other in
circles, and which source files are over the size limit.

A file A calls a file B when A's object needs a symbol B's object defines (nm: U in
A, T/D/B/R in B). Objects are those of one library target (the agent's core and
libcoll), so a symbol defined twice (the test build's copies) never joins two
libraries. A circle is a strongly connected set of two or more files. Static
functions are invisible here on purpose: calls inside a file are the file's own
business.

    tools/structure.py BUILD_DIR [--max-lines N] [--strict]

prints each circle and each file over the limit; --strict exits 1 when there is any.
"""
import os
import subprocess
import sys

TARGETS = ("coll_agent_core.dir", "coll.dir")


def objects(build, target):
    root = os.path.join(build, "CMakeFiles", target)
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".c.o"):
                full = os.path.join(d, f)
                out.append((os.path.relpath(full, root)[: -len(".o")], full))
    return sorted(out)


def symbols(path):
    res = subprocess.run(["nm", "-P", path], capture_output=True, text=True, check=True)
    defined, needed = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            needed.add(name)
        elif kind in "TDBRVW":
            defined.add(name)
    return defined, needed


def graph(build, target):
    objs = objects(build, target)
    defs, needs = {}, {}
    owner = {}
    for src, path in objs:
        d, n = symbols(path)
        defs[src], needs[src] = d, n
        for s in d:
            owner.setdefault(s, src)
    edges = {src: set() for src, _ in objs}
    for src in edges:
        for s in needs[src]:
            o = owner.get(s)
            if o and o != src:
                edges[src].add(o)
    return edges


def circles(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = argv[1]
    limit = 700
    if "--max-lines" in argv:
        limit = int(argv[argv.index("--max-lines") + 1])
    strict = "--strict" in argv
    bad = 0
    for target in TARGETS:
        edges = graph(build, target)
        if not edges:
            print(f"{target}: no objects under {build} (build it first)", file=sys.stderr)
            return 2
        for comp in circles(edges):
            bad += 1
            print(f"circle ({target[:-4]}): " + " ".join(comp))
            for a in comp:
                back = sorted(b for b in edges[a] if b in comp)
                print(f"    {a} -> {', '.join(back)}")
    src_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in ("agent", "libcoll/src"):
        for dirpath, _, files in os.walk(os.path.join(src_root, d)):
            for f in sorted(files):
                if f.endswith(".c"):
                    p = os.path.join(dirpath, f)
                    with open(p, encoding="utf-8") as fh:
                        n = sum(1 for _ in fh)
                    if n > limit:
                        bad += 1
                        print(f"too big: {os.path.relpath(p, src_root)} {n} lines (limit {limit})")
    if bad == 0:
        print("no circles; no source file over", limit, "lines")
    return 1 if (strict and bad) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
