#!/usr/bin/env bash
# bench/cluster.sh repeated ROUNDS times, reduced to one line per op and size: the median
# busbw and time per op of the agents and of OpenMPI-TCP, and the median of the per-round
# ratios of time, OpenMPI's over ours (the same as ours over OpenMPI's for busbw; each
# round measures both side by side, so a ratio is never taken across rounds). These 2-CPU
# VMs swing by 2x between two runs of the same binary; one run of cluster.sh is an
# anecdote, the median of several is a figure.
# Usage: bench/rounds.sh [BUILD_DIR] [AGENTS] [OPS] [MIN] [MAX] [ITERS] [ROUNDS]
#   e.g. bench/rounds.sh build-rel 2 allreduce 32768 2097152 50 5
set -euo pipefail
build=${1:-build}
n=${2:-2}
ops=${3:-allreduce}
minb=${4:-32768}
maxb=${5:-2097152}
iters=${6:-50}
rounds=${7:-5}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp /tmp/coll-rounds-XXXX)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
    echo "## round $r" >>"$out"
    bash "$here/cluster.sh" "$build" "$n" "$ops" "$minb" "$maxb" "$iters" 2>/dev/null >>"$out"
done
python3 - "$out" "$n" "$rounds" <<'PY'
import re, statistics, sys
path, n, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
coll, mpi = {}, {}  # (round, op, bytes) -> busbw
rnd, op, who = 0, None, None
for line in open(path):
    if line.startswith("## round"):
        rnd = int(line.split()[2])
    m = re.match(r"# coll-bench: op (\S+)", line)
    if m:
        op, who = m.group(1), coll
        continue
    m = re.match(r"# mpi_bench: op (\S+)", line)
    if m:
        op, who = m.group(1), mpi
        continue
    if line.startswith("#"):
        who = None if "gloo" in line else who
        continue
    f = line.split()
    if who is not None and len(f) >= 5 and f[0].isdigit():
        who[(rnd, op, int(f[0]))] = (float(f[4]), float(f[2]))
keys = sorted({(o, b) for (_, o, b) in coll})
print(f"# {n} agents, {rounds} rounds; busbw GB/s and time per op (us), medians;"
      " ratio = median of the per-round ratios of time (mpi/coll: above 1, coll is faster)")
print(f"{'op':<16}{'bytes':>10}{'coll':>9}{'mpi':>9}{'coll_us':>10}{'mpi_us':>10}{'ratio':>8}  per-round ratios")
for o, b in keys:
    rs = [r for (r, oo, bb) in coll if oo == o and bb == b and (r, o, b) in mpi]
    c = [coll[(r, o, b)] for r in rs]
    m = [mpi[(r, o, b)] for r in rs]
    ratios = [y[1] / x[1] for x, y in zip(c, m) if x[1] > 0]
    if not ratios:
        continue
    med = lambda v, k: statistics.median(z[k] for z in v)
    print(f"{o:<16}{b:>10}{med(c, 0):>9.3f}{med(m, 0):>9.3f}{med(c, 1):>10.2f}{med(m, 1):>10.2f}"
          f"{statistics.median(ratios):>8.2f}  " + " ".join(f"{x:.2f}" for x in ratios))
PY
