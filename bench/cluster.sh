#!/usr/bin/env bash
# Collectives across N agents on this machine (loopback TCP), side by side in one run with
# OpenMPI's TCP transport on the same sizes, Gloo (torch.distributed, when Debian's
# python3-torch is installed), and the loopback TCP ceiling (iperf3 --bidir). Broadcast
# runs in place (coll-bench -i), as MPI_Bcast and torch's broadcast have one buffer.
# PIN=1 gives each pod (agent i and application i) CPU i mod nproc, as mpirun binds its
# ranks when there are no more of them than CPUs.
# Usage: bench/cluster.sh [BUILD_DIR] [AGENTS] [OPS] [MIN] [MAX] [ITERS]
#   e.g. bench/cluster.sh build 2 "allreduce allgather" 8 67108864 20
set -euo pipefail
build=${1:-build}
n=${2:-2}
ops=${3:-"allreduce reduce_scatter allgather broadcast"}
minb=${4:-8}
maxb=${5:-67108864}
iters=${6:-20}
dir=$(mktemp -d /tmp/coll-cluster-XXXX)
port=$((20000 + $$ % 20000))
AGENT_PIDS=()
cleanup() { for p in "${AGENT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
. "$(dirname "$0")/agents.sh"
start_agents "$build" "$n" "$dir" "$port"
socks=$AGENT_SOCKS
mpicc -O2 -o "$dir/mpi_bench" "$(dirname "$0")/mpi_bench.c"
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $n agents / ranks, float32, iters $iters"
if command -v iperf3 >/dev/null; then
    iperf3 -s -1 -p $((port + 1)) >/dev/null 2>&1 &
    sleep 0.3
    iperf3 -c 127.0.0.1 -p $((port + 1)) -t 3 --bidir -f g 2>/dev/null | grep -E "sender|receiver" | tail -4 | sed 's/^/# iperf3 /'
fi
for op in $ops; do
    "$build/coll-bench" -s "$socks" -p "$n" -g bench -o "$op" -b "$minb" -e "$maxb" -f 8 -n "$iters" -w 3 -c 1 \
        $([ "${PIN:-0}" = 1 ] && echo -a) $([ "$op" = broadcast ] && echo -i)
    mpirun --allow-run-as-root --oversubscribe -np "$n" --mca pml ob1 --mca btl tcp,self \
        --mca btl_tcp_if_include lo "$dir/mpi_bench" -o "$op" -b "$minb" -e "$maxb" -f 8 -n "$iters" -w 3
    if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
        gport=$((port + 2 + RANDOM % 100))
        gpids=()
        for r in $(seq 0 $((n - 1))); do
            /usr/bin/python3 "$(dirname "$0")/gloo_bench.py" "$r" "$n" "$gport" "$op" "$minb" "$maxb" "$iters" &
            gpids+=($!)
        done
        for p in "${gpids[@]}"; do wait "$p" || true; done
    fi
done
