#!/usr/bin/env bash
# Two builds of coll, each against OpenMPI in the same processes (pair_bench), quiet and
# under compare.sh's load: per round and build N fresh agents of that build, bound as
# compare.sh binds them (pod i's agent, its application and MPI rank i on CPU i mod
# nproc), then for each op both loads back to back (their order and which build goes
# first flip every round, and so does which system starts each size). Prints per op and
# size, for each build, the median over the rounds of its ratio to OpenMPI quiet and
# loaded and of "steady" (the loaded ratio over the quiet one, per round) with its
# range, and the median per-round B/A of coll's time per op, quiet and loaded (below 1:
# B is faster), and for each build the sleeps per op of coll's ranks (BENCH_RUSAGE).
# It answers "does this change hold coll's lead under load" without the run-to-run
# swings of a VM: A and B meet the same placement and load phases in every round.
# OpenMPI runs under agents.sh's MPI_MALLOC_ENV (MPI_MALLOC=default: glibc's own malloc).
#
# Usage: bench/ab_pair.sh [-p PODS] [-r ROUNDS] [-o OPS] [-s SIZES] [-D 0|1|all]
#                         [-n ITERS] [-T MIN_MS] [-k BLOCK_MS] [-f RAW] BUILD_A BUILD_B
#   defaults: 2 pods, 4 rounds, "allreduce allgather reduce_scatter broadcast",
#   32768,262144,2097152,8388608, -D all, 2000 ops, 300 ms, 25 ms blocks; RAW keeps the
#   output (default: a temporary file). Both builds unsanitized (OpenMPI loads them).
#   e.g. bench/ab_pair.sh -p 4 -r 3 /tmp/base/build-bench build-bench
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pods=2 rounds=4 ops="allreduce allgather reduce_scatter broadcast" sizes=32768,262144,2097152,8388608
direct=all iters=2000 min_ms=300 block_ms=25 raw=""
usage() { sed -n '2,20p' "$0"; exit 2; }
while getopts "p:r:o:s:D:n:T:k:f:" c; do
    case $c in
    p) pods=$OPTARG ;; r) rounds=$OPTARG ;; o) ops=$OPTARG ;; s) sizes=$OPTARG ;;
    D) direct=$OPTARG ;; n) iters=$OPTARG ;; T) min_ms=$OPTARG ;; k) block_ms=$OPTARG ;;
    f) raw=$OPTARG ;; *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || usage
case $direct in 0 | 1 | all) ;; *) echo "ab_pair.sh: -D takes 0, 1 or all, not '$direct'"; exit 2 ;; esac
for t in mpicc mpirun taskset; do
    command -v $t >/dev/null || { echo "ab_pair.sh needs $t (openmpi-bin libopenmpi-dev)"; exit 2; }
done
A=$(cd "$1" && pwd) B=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/coll-abpair-XXXX)
raw=${raw:-$tmp/raw.txt}
: >"$raw"
. "$here/agents.sh"
LOAD_PIDS=() AGENT_PIDS=()
trap 'stop_load; stop_agents; rm -rf "$tmp"' EXIT
build_pair_bench "$tmp/pair_bench" "$A" # libcoll comes from each build (LD_LIBRARY_PATH)
cc -O2 -o "$tmp/loadgen" "$here/loadgen.c"
ncpu=$(nproc)
export BENCH_RUSAGE=1
for r in $(seq "$rounds"); do
    builds="A B" loads="quiet loaded" first=coll
    [ $((r % 2)) = 0 ] && builds="B A" loads="loaded quiet" first=mpi
    for b in $builds; do
        build=$A
        [ "$b" = B ] && build=$B
        mkdir -p "$tmp/ag$b"
        PIN=1 start_agents "$build" "$pods" "$tmp/ag$b" $((21000 + RANDOM % 20000))
        for op in $ops; do
            for load in $loads; do
                [ "$load" = loaded ] && start_load "$tmp/loadgen"
                echo "## round $r build $b load $load op $op" >>"$raw"
                LD_LIBRARY_PATH=$build COLL_DIRECT=$direct "${MPI_MALLOC_ENV[@]}" timeout 900 mpirun --allow-run-as-root \
                    --oversubscribe --bind-to none -np "$pods" --mca pml ob1 --mca btl tcp,self \
                    --mca btl_tcp_if_include lo -x COLL_DIRECT -x LD_LIBRARY_PATH -x BENCH_RUSAGE \
                    sh -c "exec taskset -c \$((OMPI_COMM_WORLD_RANK % $ncpu)) $tmp/pair_bench \
                        -s $AGENT_SOCKS -g bench -o $op -L $sizes -n $iters -w 100 -T $min_ms \
                        -k $block_ms -m $first" >>"$raw" 2>&1 || echo "# pair_bench failed" >>"$raw"
                [ "$load" = loaded ] && stop_load
            done
        done
        stop_agents
    done
done
grep -q "^# pair_bench failed" "$raw" && { echo "ab_pair.sh: a run failed (raw: $raw)"; grep -B3 "^# pair_bench failed" "$raw" | head -20; exit 1; }
python3 "$here/ab_pair_report.py" "$raw"
