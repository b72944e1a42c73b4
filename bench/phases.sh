#!/usr/bin/env bash
# One cell of bench/compare.sh (PODS pods, one op, one size), run RUNS times with coll and
# OpenMPI alternating (the order flips every run), bound as compare.sh binds them (pod and
# rank i on CPU i mod nproc), each op timed alone (coll-bench/mpi_bench -O): per run the
# loop's time per op (what compare.sh reports), the median and 90th percentile single op,
# and per system how many runs are in a slow phase (a median single op over 1.5x that
# system's lowest of the set). It tells runs whose every op is slower (a phase: the median
# moves) from runs with rare long ops (preemptions: the mean moves, the median does not).
# With two pods each run also times the bare exchange under both, system "tcp":
# coll-floors -S, two processes on CPUs 0 and 1 swapping the bytes a pod sends in the op
# (half the size for reduce_scatter and allgather, all of it otherwise) over a fresh
# loopback connection. OpenMPI runs under agents.sh's MPI_MALLOC_ENV (MPI_MALLOC=default:
# glibc's own malloc). Not part of the product.
#
# Usage: bench/phases.sh [-b BUILD] [-p PODS] [-o OP] [-s BYTES] [-n ITERS] [-r RUNS]
#                        [-l quiet|loaded] [-D 0|1|all] [-d OUTDIR]
#   defaults: build-bench, 2 pods, reduce_scatter, 262144, 3000 ops, 8 runs, quiet,
#   COLL_DIRECT=all; OUTDIR (default: a temporary one, removed) keeps the per-op files
#   (SYSTEM-RUN.BYTES.RANK) and the printed table (phases.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build-bench pods=2 op=reduce_scatter size=262144 iters=3000 runs=8 load=quiet direct=all out=""
while getopts "b:p:o:s:n:r:l:D:d:h" c; do
    case $c in
    b) build=$OPTARG ;; p) pods=$OPTARG ;; o) op=$OPTARG ;; s) size=$OPTARG ;; n) iters=$OPTARG ;;
    r) runs=$OPTARG ;; l) load=$OPTARG ;; D) direct=$OPTARG ;; d) out=$OPTARG ;;
    *) sed -n 2,19p "$0"; exit 2 ;;
    esac
done
bad() { echo "phases.sh: $*" >&2; exit 2; }
case $op in allreduce | allgather | reduce_scatter | broadcast) ;; *) bad "op must be allreduce, allgather, reduce_scatter or broadcast, not '$op'" ;; esac
case $load in quiet | loaded) ;; *) bad "-l must be quiet or loaded, not '$load'" ;; esac
case $direct in 0 | 1 | all) ;; *) bad "-D must be 0, 1 or all, not '$direct'" ;; esac
for v in pods size iters runs; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || bad "-${v:0:1} must be a positive integer, not '${!v}'"
done
[ "$pods" -ge 2 ] || bad "-p must be at least 2"
if [ ! -x "$build/coll-bench" ] || [ ! -x "$build/coll-agent" ] || [ ! -x "$build/coll-floors" ]; then
    bad "no coll-bench, coll-agent and coll-floors in '$build' (build it first)"
fi
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then bad "needs OpenMPI (mpicc, mpirun)"; fi
tmp=$(mktemp -d /tmp/coll-phases-XXXX)
[ -n "$out" ] || out=$tmp/out
mkdir -p "$out"
ncpu=$(nproc)
LOAD_PIDS=() AGENT_PIDS=()
cleanup() {
    for p in "${LOAD_PIDS[@]}" "${AGENT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
cc -O2 -o "$tmp/loadgen" "$here/loadgen.c"
. "$here/agents.sh"
mpicc -O2 -o "$tmp/mpi_bench" "$here/mpi_bench.c"
[ "$load" = loaded ] && start_load "$tmp/loadgen" # compare.sh's (agents.sh)
run_coll() { # RUN
    local d=$tmp/a$1 inplace=()
    [ "$op" = broadcast ] && inplace=(-i)
    mkdir -p "$d"
    AGENT_PIDS=()
    PIN=1 start_agents "$build" "$pods" "$d" $((21000 + RANDOM % 20000))
    COLL_DIRECT=$direct timeout 600 "$build/coll-bench" -s "$AGENT_SOCKS" -p "$pods" -g bench -o "$op" -L "$size" \
        -n "$iters" -w 100 -c 1 -a "${inplace[@]}" -O "$out/coll-$1" | awk -v r="$1" '$1 ~ /^[0-9]+$/ {print "coll", r, $3}'
    kill "${AGENT_PIDS[@]}" 2>/dev/null || true
    for p in "${AGENT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    AGENT_PIDS=()
}
run_tcp() { # RUN: the bare exchange (two pods only)
    local b=$size
    case $op in reduce_scatter | allgather) b=$((size / 2)) ;; esac
    b=$(((b + 1023) / 1024 * 1024))
    "$build/coll-floors" -c 0,$((1 % ncpu)) -n "$iters" -S "$b" |
        awk -v r="$1" '{for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}
            print "tcp", r, v["mean_us"], v["p50_us"], v["p90_us"]}'
}
run_mpi() { # RUN
    "${MPI_MALLOC_ENV[@]}" timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$pods" \
        --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
        sh -c "exec taskset -c \$((OMPI_COMM_WORLD_RANK % $ncpu)) $tmp/mpi_bench -o $op -L $size -n $iters -w 100 -O $out/mpi-$1" 2>&1 |
        awk -v r="$1" '$1 ~ /^[0-9]+$/ {print "mpi", r, $3}'
}
: >"$tmp/loops"
for r in $(seq "$runs"); do
    if [ $((r % 2)) = 1 ]; then
        run_coll "$r" >>"$tmp/loops"
        run_mpi "$r" >>"$tmp/loops"
        if [ "$pods" = 2 ]; then run_tcp "$r" >>"$tmp/loops"; fi
    else
        if [ "$pods" = 2 ]; then run_tcp "$r" >>"$tmp/loops"; fi
        run_mpi "$r" >>"$tmp/loops"
        run_coll "$r" >>"$tmp/loops"
    fi
done
python3 - "$tmp/loops" "$out" "$size" "$pods $op $size B, $load, COLL_DIRECT=$direct, $runs runs of $iters ops" <<'PY' | tee "$out/phases.txt"
import os, statistics, sys
loops, out, size, title = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
mean = {}
stats = {}
for line in open(loops):
    f = line.split()
    mean[(f[0], int(f[1]))] = float(f[2])
    if len(f) == 5:  # tcp: coll-floors' own median and 90th percentile
        stats[(f[0], int(f[1]))] = (float(f[3]), float(f[4]))
print(f"# phases: {title}")
print(f"{'system':>6} {'run':>4} {'loop us/op':>11} {'p50 us':>8} {'p90 us':>8}")
rows = {}
for (s, r), t in sorted(mean.items()):
    if (s, r) in stats:
        p50, p90 = stats[(s, r)]
    else:
        ops = sorted(float(x) for x in open(os.path.join(out, f"{s}-{r}.{size}.0")))
        p50, p90 = ops[len(ops) // 2], ops[len(ops) * 9 // 10]
    rows.setdefault(s, []).append((r, t, p50, p90))
    print(f"{s:>6} {r:>4} {t:>11.1f} {p50:>8.1f} {p90:>8.1f}")
for s, rs in rows.items():
    low = min(p for _, _, p, _ in rs)
    slow = [r for r, _, p, _ in rs if p > 1.5 * low]
    t = [x for _, x, _, _ in rs]
    print(f"# {s}: loop us/op {min(t):.1f}-{max(t):.1f} (median {statistics.median(t):.1f}); "
          f"median op {low:.1f}-{max(p for _, _, p, _ in rs):.1f}; "
          f"{len(slow)} of {len(rs)} runs in a slow phase (median op > 1.5x the lowest)")
PY
