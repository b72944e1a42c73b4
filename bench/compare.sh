#!/usr/bin/env bash
# The host path against its references, in one run: coll (agents on loopback TCP, one
# per pod), OpenMPI over TCP (ob1, tcp+self) and, where torch is installed, Gloo, round by
# round interleaved (the order flips every round), on a quiet machine and under load
# (loadgen: a nice-19 busy loop pinned to every CPU, and a normal-priority neighbour busy
# half of every 10 ms; a cell's two loads run back to back on the same agents, so its
# "steady" figure compares like with like), with the loopback ceiling (iperf3, one stream) measured in the
# same rounds, and the floors of a small op (coll-floors: a hand-off on one CPU, an
# 8-byte swap over TCP between two, a stream of one small send per op, its reader
# lagging or keeping up), of a two-pod
# exchange (a bare 128 KiB swap each way over a fresh connection: bench/phases.sh) and of
# CPU-bound work (both CPUs copying in step). coll and OpenMPI run in one process per
# pod (pair_bench: MPI rank i is also pod i's application), taking turns in blocks of
# about 25 ms for the whole run, so that both meet the same placement of the vCPUs and
# the same phases of the load; -S runs them one after the other instead (coll-bench,
# then mpi_bench). Bound (default): pod i's agent and application, and
# MPI rank i, on CPU i mod nproc; -u: nothing bound. Writes raw.txt, results.csv,
# table.md, time.png and busbw.png to OUTDIR (bench/compare_report.py rebuilds the last
# four from raw.txt).
#
# Usage: bench/compare.sh [-b BUILD] [-p "2 4"] [-o OPS] [-s SIZES] [-r ROUNDS]
#                         [-l "quiet loaded"] [-n ITERS] [-w WARMUP] [-t MIN_MS] [-u] [-d OUTDIR]
#                         [-D 0|1|all] [-S]
#   defaults: build, "2 4", "allreduce allgather reduce_scatter broadcast",
#   8,32768,262144,2097152,8388608,67108864, 5 rounds, both loads, 2000 iterations up to
#   1 MiB (fewer above: bench_iters; 200 made a loaded run of a small op shorter than the
#   neighbour's 10 ms period, so it fell in its busy or idle half by chance), 100 untimed
#   ops first for every system (above 1 MiB 1, or 2 with -t, the second timed for the
#   pace; 1000 for a run's first size: its processes
#   are fresh; coll tries two ways of waiting on its first 64 ops of a kind and size,
#   agent/backends/tcp.h, and under load an agent loses one slice before it stops
#   yielding, libcoll/src/spin.h), every size run for at least 300 ms (-t: more iterations
#   where ITERS would take less at the warmup's pace, coll-bench -T; a 2000-op cell of
#   10 µs ops was 20 ms, two periods of the neighbour, and its rounds spread 0.3-1.6x),
#   bench/results/host-<UTC date>
#   GLOO=0: no Gloo rounds even where torch imports
#   MPI_MALLOC=default: OpenMPI's ranks on glibc's default malloc, which maps the
#   temporary buffers of its large ops fresh on every call; without it they run under
#   MPI_MALLOC_ENV (agents.sh), which keeps them, as coll keeps its scratch
#   every rank of every system reports per size its sleeps, preemptions and CPU time per
#   op (#rusage lines in raw.txt; BENCH_RUSAGE=0 turns that off)
#   -D MODE: which of coll's ops its applications run themselves (libcoll's COLL_DIRECT):
#   1, the default: tiny ones (up to 64 KiB), the rest through the agent; all: every
#   collective (a large one in the application's wait, as an MPI rank's); 0: none.
#   Several ("1 all"): each cell runs once per mode, the modes taking turns (the order
#   flipping every round), each mode's runs in OUTDIR/mode-MODE (its own raw.txt, table
#   and plots; the floors and the references' runs shared), and OUTDIR/modes.md puts
#   the modes' ratios and steadiness side by side (bench/compare_modes.py)
#   -S: coll and OpenMPI in runs of their own, one after the other (before 2026-12-04)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build pods="2 4" ops="allreduce allgather reduce_scatter broadcast"
sizes=8,32768,262144,2097152,8388608,67108864 rounds=5 loads="quiet loaded" iters=2000 warmup=100
min_ms=300 bind=1 out="" direct=1 pair=1
while getopts "b:p:o:s:r:l:n:w:t:ud:D:S" c; do
    case $c in
    b) build=$OPTARG ;; p) pods=$OPTARG ;; o) ops=$OPTARG ;; s) sizes=$OPTARG ;;
    r) rounds=$OPTARG ;; l) loads=$OPTARG ;; n) iters=$OPTARG ;; w) warmup=$OPTARG ;; t) min_ms=$OPTARG ;; u) bind=0 ;; d) out=$OPTARG ;; D) direct=$OPTARG ;; S) pair=0 ;;
    *) sed -n '2,45p' "$0"; exit 2 ;;
    esac
done
for m in $direct; do
    case $m in 0 | 1 | all) ;; *) echo "compare.sh: -D takes 0, 1 or all, not '$m' (or several: \"1 all\")"; exit 2 ;; esac
done
modes=($direct)
[ ${#modes[@]} -gt 1 ] && [ $pair = 0 ] && { echo "compare.sh: several modes need the paired runs (no -S)"; exit 2; }
build=$(cd "$build" && pwd)
out=${out:-$here/results/host-$(date -u +%Y%m%dT%H%M)}
mkdir -p "$out"
for t in mpicc mpirun iperf3 taskset; do
    command -v $t >/dev/null || { echo "compare.sh needs $t (openmpi-bin libopenmpi-dev iperf3)"; exit 2; }
done
export BENCH_RUSAGE=${BENCH_RUSAGE:-1} # bench_iters.h: where each op's time went
tmp=$(mktemp -d /tmp/coll-compare-XXXX)
. "$here/agents.sh" # start_agents, start_load, stop_load
LOAD_PIDS=() AGENT_PIDS=()
trap 'stop_load; stop_agents; rm -rf "$tmp"' EXIT
mpicc -O2 -o "$tmp/mpi_bench" "$here/mpi_bench.c"
[ $pair = 1 ] && build_pair_bench "$tmp/pair_bench" "$build"
cc -O2 -o "$tmp/loadgen" "$here/loadgen.c"
ncpu=$(nproc)
gloo=0 # GLOO=0 in the environment: leave Gloo out even where torch is installed
[ "${GLOO:-1}" != 0 ] && /usr/bin/python3 -c "import torch.distributed" 2>/dev/null && gloo=1
raw=$out/raw.txt
declare -A rawof # mode -> its raw.txt
if [ ${#modes[@]} -gt 1 ]; then
    for m in "${modes[@]}"; do mkdir -p "$out/mode-$m"; rawof[$m]=$out/mode-$m/raw.txt; done
else
    rawof[${modes[0]}]=$raw
fi
raws() { printf '%s\n' "${rawof[@]}"; }
to_all() { # stdin appended to every mode's raw.txt
    local f
    f=$(mktemp "$tmp/all-XXXX")
    cat >"$f"
    while read -r r; do cat "$f" >>"$r"; done < <(raws)
    rm -f "$f"
}
{
    echo "# compare.sh $(date -u +%FT%TZ) on $(hostname): $ncpu CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
    echo "# kernel $(uname -r); $(mpirun --version 2>&1 | head -1); $(iperf3 --version | head -1)"
    echo "# pods [$pods] ops [$ops] sizes [$sizes] rounds $rounds loads [$loads] iters $iters warmup $warmup min_ms $min_ms bind $bind gloo $gloo"
    echo "# tcp congestion control: node default $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo '?') (MPI, Gloo, iperf3), coll's data connections ${NODE_EXTRA:-reno (node.tcp_congestion)}"
    echo "# OpenMPI's malloc: ${MPI_MALLOC_ENV[*]:-the glibc default (MPI_MALLOC=default)}"
    echo "# coll's applications run their ops themselves: COLL_DIRECT=MODE ($([ "$direct" = all ] && echo 'every collective' || { [ "$direct" = 1 ] && echo 'up to 64 KiB, the rest through the agent'; } || { [ "$direct" = 0 ] && echo 'none'; } || echo "each of: $direct, taking turns"))"
    [ $pair = 1 ] && echo "# coll and mpi in one process (pair_bench): per size, blocks of about 25 ms taking turns, the first flipping every round"
    echo "# loads paired: per op, each load in turn on the same agents, per size each system in turn, the orders flipping every round"
    echo "# command: bench/compare.sh $*"
} >"$tmp/head"
while read -r r; do
    m=$(basename "$(dirname "$r")"); m=${m#mode-}
    [ ${#modes[@]} -gt 1 ] || m=$direct
    sed "s/COLL_DIRECT=MODE/COLL_DIRECT=$m/" "$tmp/head" >"$r"
done < <(raws)
sed "s/COLL_DIRECT=MODE/COLL_DIRECT=$direct/" "$tmp/head"

ceiling() { # one TCP stream over loopback, server and client as two pods
    local port s=() c=() spid
    port=$(free_port)
    [ $bind = 1 ] && s=(taskset -c 0) c=(taskset -c $((1 % ncpu)))
    "${s[@]}" iperf3 -s -1 -p $port >/dev/null 2>&1 &
    spid=$!
    sleep 0.3
    "${c[@]}" iperf3 -c 127.0.0.1 -p $port -t 2 -f g 2>/dev/null |
        awk '/receiver/ {print $(NF-2)}' | tail -1
    wait "$spid" 2>/dev/null || true
}
run_coll() { # N OP SIZE
    local n=$1 op=$2 sizes=$3
    COLL_DIRECT=$direct timeout 900 "$build/coll-bench" -s "$AGENT_SOCKS" -p "$n" -g bench -o "$op" -L "$sizes" \
        -n "$iters" -w "$warmup" -T "$min_ms" -c 1 $([ $bind = 1 ] && echo -a) $([ "$op" = broadcast ] && echo -i) 2>&1
}
mpi_run() { # N COMMAND: N ranks of OpenMPI (ob1, tcp+self, loopback), rank i bound as pod i
    local wrap=""
    [ $bind = 1 ] && wrap="exec taskset -c \$((OMPI_COMM_WORLD_RANK % $ncpu))"
    "${MPI_MALLOC_ENV[@]}" timeout 900 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$1" \
        --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo sh -c "$wrap $2"
}
run_mpi() { # N OP SIZE
    mpi_run "$1" "$tmp/mpi_bench -o $2 -L $3 -n $iters -w $warmup -T $min_ms" 2>&1
}
run_pair() { # N OP SIZE FIRST MODE: coll and mpi (pair_bench), each section after its probe
    local p
    p=$(probe)
    echo "### pods $1 op $2 system pair" # (the ranks' #rusage lines come first)
    COLL_DIRECT=$5 mpi_run "$1" "$tmp/pair_bench -s $AGENT_SOCKS -g bench -o $2 -L $3 -n $iters -w $warmup -T $min_ms -m $4" 2>&1 |
        awk -v p="$p" '{ print } /^### / && p != "" { print p }'
}
run_gloo() { # N OP SIZE: each rank's lines in a file of its own (lines of ranks that
    # share one pipe can be cut into each other), printed in rank order once all ended;
    # every rank has a deadline (its store's connect included: gloo_bench.py)
    local n=$1 op=$2 sizes=$3 port r pids=() pin=()
    port=$(free_port)
    for r in $(seq 0 $((n - 1))); do
        pin=()
        [ $bind = 1 ] && pin=(taskset -c $((r % ncpu)))
        "${pin[@]}" timeout 900 /usr/bin/python3 "$here/gloo_bench.py" "$r" "$n" "$port" "$op" "$sizes" \
            "$iters" "$warmup" "$min_ms" >"$tmp/gloo.$r.out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    for r in $(seq 0 $((n - 1))); do cat "$tmp/gloo.$r.out"; done
}

probe() { # where the host has put the two vCPUs: one cache line's round trip between them
    [ $bind = 1 ] && [ "$ncpu" -ge 2 ] || return 0
    "$build/coll-floors" -c 0,1 -n 5000 -x | awk '{ split($4, a, "="); print "#probe shm_spin_us " a[2] }'
}
floors() { # LOAD: the round's loopback ceiling and floors under LOAD (the load is on)
    local line
    line="## round $r load $1 ceiling_gbit $(ceiling)"
    echo "$line"
    echo "$line" | to_all
    # the floors of a small op: a hand-off between two processes on one CPU (what a
    # pod whose application and agent share its CPU pays twice per op) and an 8-byte
    # swap over loopback TCP between two CPUs (what any exchange between pods costs);
    # with two CPUs also what the load costs CPU-bound work (the copy floor) and the
    # bare 128 KiB exchange (tcp_swap_128K)
    if [ $bind = 1 ]; then
        "$build/coll-floors" -n 20000 -c 0,0 | sed 's/^/#floor one_cpu /' | to_all
        "$build/coll-floors" -n 20000 -c 0,$((1 % ncpu)) | sed 's/^/#floor two_cpus /' | to_all
    fi
}

# A round: the ceiling and floors under each load, then per pod count one set of agents
# (their connections, as a pod's, live through the round), per op each load in turn, and
# under it per size every system, one run each: a cell's systems run back to back, and
# its quiet and loaded figures come from the same connections, seconds apart. On the
# 2-vCPU VMs the host moves the two vCPUs between places where a cache line crosses
# between them in 0.11 or 0.48 us, every few seconds to every minute, and every two-pod
# exchange is about 1.7x slower in the far place (bench/RESULTS.md): each run says where
# it started (#probe). The order of the loads, as of the systems, flips every round.
for r in $(seq "$rounds"); do
    order=$loads
    [ $((r % 2)) = 0 ] && order=$(echo "$loads" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
    for load in $order; do
        [ "$load" = loaded ] && start_load "$tmp/loadgen"
        floors "$load"
        [ "$load" = loaded ] && stop_load
    done
    for n in $pods; do
        PIN=$bind start_agents "$build" "$n" "$tmp" $((21000 + RANDOM % 20000))
        for op in $ops; do
            systems="coll mpi"
            [ $((r % 2)) = 0 ] && systems="mpi coll"
            [ $gloo = 1 ] && systems="$systems gloo"
            for load in $order; do
                [ "$load" = loaded ] && start_load "$tmp/loadgen"
                echo "## round $r load $load ceiling_gbit " | to_all # (measured above)
                morder=("${modes[@]}")
                [ $((r % 2)) = 0 ] && morder=($(printf '%s\n' "${modes[@]}" | tac))
                for size in ${sizes//,/ }; do
                    if [ $pair = 1 ]; then
                        for m in "${morder[@]}"; do
                            run_pair "$n" "$op" "$size" "${systems%% *}" "$m" >>"${rawof[$m]}" ||
                                echo "# pair failed" >>"${rawof[$m]}"
                        done
                        [ $gloo = 1 ] || continue
                    fi
                    for sys in $systems; do
                        [ $pair = 1 ] && [ "$sys" != gloo ] && continue
                        {
                            echo "### pods $n op $op system $sys"
                            probe
                            "run_$sys" "$n" "$op" "$size" 2>&1 || echo "# $sys failed"
                        } | to_all
                    done
                done
                [ "$load" = loaded ] && stop_load
            done
            echo "round $r: $n pods $op done"
        done
        stop_agents
    done
done
if [ ${#modes[@]} -gt 1 ]; then
    for m in "${modes[@]}"; do /usr/bin/python3 "$here/compare_report.py" "$out/mode-$m"; done
    /usr/bin/python3 "$here/compare_modes.py" "$out" "${modes[@]}" | tee "$out/modes.md"
else
    /usr/bin/python3 "$here/compare_report.py" "$out"
fi
