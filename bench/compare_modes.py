#!/usr/bin/python3
"""coll's modes side by side, from a bench/compare.sh run with several -D modes (each
mode's results.csv in OUTDIR/mode-MODE, written by compare_report.py): per pods, op and
size, each mode's ratio to the reference (the reference's time over coll's, median of
the per-round ratios, quiet and loaded) and its steadiness (loaded ratio over quiet
ratio, per round, median), and which mode is steadier.

    compare_modes.py OUTDIR MODE MODE...

A malformed row of a results.csv is refused with its file and line number.
"""
import csv
import statistics
import sys
from collections import defaultdict

out, modes = sys.argv[1], sys.argv[2:]
if len(modes) < 2:
    sys.exit("compare_modes.py: two modes or more")

# (mode, load, pods, op, bytes, system) -> {round: time_us}
t = defaultdict(dict)
refs = set()
for m in modes:
    path = "%s/mode-%s/results.csv" % (out, m)
    with open(path, newline="") as fh:
        for n, row in enumerate(csv.DictReader(fh), 2):
            try:
                key = (m, row["load"], int(row["pods"]), row["op"], int(row["bytes"]),
                       row["system"])
                t[key][int(row["round"])] = float(row["time_us"])
            except (KeyError, TypeError, ValueError) as e:
                sys.exit("compare_modes.py: %s:%d: malformed row (%s)" % (path, n, e))
            if row["system"] != "coll":
                refs.add(row["system"])
ref = "mpi" if "mpi" in refs else sorted(refs)[0] if refs else None
if ref is None:
    sys.exit("compare_modes.py: no reference system in %s" % out)


def per_round(m, load, pods, op, b):
    c, r = t.get((m, load, pods, op, b, "coll"), {}), t.get((m, load, pods, op, b, ref), {})
    return {k: r[k] / c[k] for k in c if k in r and c[k] > 0}


def med(v):
    return statistics.median(v) if v else None


def f(x):
    return "%.2f" % x if x is not None else "-"


cells = sorted({k[2:5] for k in t})
print("# coll's modes against %s: %s\n" % (ref, ", ".join("COLL_DIRECT=" + m for m in modes)))
print("ratio: %s time / coll time, median of the rounds (above 1: coll faster); steady: "
      "loaded ratio / quiet ratio per round, median (1: the load costs coll what it costs "
      "%s). The modes ran in the same rounds, taking turns.\n" % (ref, ref))
head = ["pods", "op", "bytes"]
for m in modes:
    name = "default" if m == "1" else m
    head += ["%s quiet" % name, "%s loaded" % name, "%s steady" % name]
head.append("steadier")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for pods, op, b in cells:
    row = [str(pods), op, str(b)]
    st = {}
    for m in modes:
        q, ld = per_round(m, "quiet", pods, op, b), per_round(m, "loaded", pods, op, b)
        st[m] = med([ld[k] / q[k] for k in q if k in ld])
        row += [f(med(list(q.values()))), f(med(list(ld.values()))), f(st[m])]
    known = {m: s for m, s in st.items() if s is not None}
    # the steadier: the mode whose steadiness is nearest 1 from below, or above 1
    best = max(known, key=lambda m: min(known[m], 1.0)) if known else "-"
    best = "default" if best == "1" else best
    row.append(best)
    print("| " + " | ".join(row) + " |")
