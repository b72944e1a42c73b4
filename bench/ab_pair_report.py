#!/usr/bin/env python3
"""The table of bench/ab_pair.sh from its raw output (RAW: "## round R build A|B load L
op O" lines, each followed by pair_bench's sections and #rusage lines).

Per op and size: for each build the median over the rounds of coll's ratio to OpenMPI
(OpenMPI's time over coll's: above 1, coll is ahead) quiet and loaded, and of steady
(that round's loaded ratio over its quiet one) with its range over the rounds; then
the median per-round B/A of coll's time per op, quiet and loaded; then coll's sleeps
per op (the mean over its ranks, median over the rounds) for each build, quiet/loaded.
A cell that lacks a round's figure for either build or load leaves that round out.
"""
import re
import statistics
import sys


def parse(path):
    t, sleeps = {}, {}
    key = sysname = None
    for line in open(path):
        m = re.match(r"## round (\d+) build (\S+) load (\S+) op (\S+)", line)
        if m:
            key = (int(m.group(1)), m.group(2), m.group(3), m.group(4))
            continue
        m = re.match(r"### pods \d+ op \S+ system (\S+)", line)
        if m:
            sysname = m.group(1)
            continue
        m = re.match(r"#rusage coll rank \d+ bytes (\d+) ops \d+ sleeps/op ([0-9.]+)", line)
        if m and key:
            sleeps.setdefault(key + (int(m.group(1)),), []).append(float(m.group(2)))
            continue
        f = line.split()
        if key and sysname and len(f) >= 5 and f[0].isdigit():
            t[key + (int(f[0]), sysname)] = float(f[2])
    return t, sleeps


def med(v, fmt="%.2f"):
    return fmt % statistics.median(v) if v else "-"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ab_pair_report.py RAW")
    t, sleeps = parse(sys.argv[1])
    if not t:
        sys.exit("ab_pair_report.py: no figures in " + sys.argv[1])
    rounds = sorted({k[0] for k in t})
    cells = sorted({(k[3], k[4]) for k in t})
    print("| op | bytes | A quiet | A loaded | A steady (range) | B quiet | B loaded |"
          " B steady (range) | B/A quiet | B/A loaded | sleeps/op A | sleeps/op B |")
    print("|---|---:|---:|---:|---|---:|---:|---|---:|---:|---|---|")
    for op, size in cells:
        row = [op, str(size)]
        for b in "AB":
            q, lo, st = [], [], []
            for r in rounds:
                try:
                    rq = t[(r, b, "quiet", op, size, "mpi")] / t[(r, b, "quiet", op, size, "coll")]
                    rl = t[(r, b, "loaded", op, size, "mpi")] / t[(r, b, "loaded", op, size, "coll")]
                except KeyError:
                    continue
                q.append(rq)
                lo.append(rl)
                st.append(rl / rq)
            rng = " (%.2f-%.2f)" % (min(st), max(st)) if st else ""
            row += [med(q), med(lo), med(st) + rng]
        for load in ("quiet", "loaded"):
            v = [t[(r, "B", load, op, size, "coll")] / t[(r, "A", load, op, size, "coll")]
                 for r in rounds
                 if (r, "B", load, op, size, "coll") in t and (r, "A", load, op, size, "coll") in t]
            row.append(med(v))
        for b in "AB":
            per = []
            for load in ("quiet", "loaded"):
                v = [statistics.mean(sleeps[(r, b, load, op, size)]) for r in rounds
                     if (r, b, load, op, size) in sleeps]
                per.append(med(v, "%.3f"))
            row.append("/".join(per))
        print("| " + " | ".join(row) + " |")


main()
