#!/usr/bin/python3
"""The table of bench/python.sh: per load, pods, op and size, the median over rounds of
each variant (microseconds per op), and the ratios that say who leads (> 1: coll ahead).

    python_report.py RAW
"""
import statistics
import sys
from collections import defaultdict

cells = defaultdict(list)
head = ""
for line in open(sys.argv[1]):
    if line.startswith("#"):
        head = line.strip("# \n")
        continue
    w = line.split()
    if len(w) != 6:
        continue
    label, _, op, size, var, us = w
    cells[(label, op, int(size), var)].append(float(us))

med = {k: statistics.median(v) for k, v in cells.items()}
print("bench/python.sh: %s\n" % head)
print("Medians over rounds, microseconds per op. gloo/coll > 1: coll ahead of Gloo "
      "(tensors in coll memory; plain: ordinary tensors, taken as they are; staged: copied "
      "in and out). staged/plain: what taking them as they are saves. torch: what dist.* "
      "adds to coll's own Python call (coll - coll-py), beside torch's dispatch into a "
      "backend that does nothing (null).\n")
print("| load/pods | op | bytes | coll | coll-plain | coll-staged | coll-py | gloo | null | "
      "gloo/coll | gloo/plain | staged/plain | torch adds |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
keys = sorted({k[:3] for k in med}, key=lambda k: (k[0], k[1], k[2]))
for label, op, size in keys:
    g = lambda v: med.get((label, op, size, v))  # noqa: E731
    f = lambda x: "%.1f" % x if x is not None else "-"  # noqa: E731
    ratio = lambda a, b: "%.2f" % (a / b) if a and b else "-"  # noqa: E731
    adds = g("coll") - g("coll-py") if g("coll") and g("coll-py") else None
    print("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        label, op, size, f(g("coll")), f(g("coll-plain")), f(g("coll-staged")),
        f(g("coll-py")), f(g("gloo")), f(g("null")), ratio(g("gloo"), g("coll")),
        ratio(g("gloo"), g("coll-plain")), ratio(g("coll-staged"), g("coll-plain")),
        f(adds)))
