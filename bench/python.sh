#!/usr/bin/env bash
# torch.distributed on coll against Gloo (Debian's torch), from Python: one process per
# pod on loopback agents, every variant of a cell in the same processes, taking turns
# (bench/python_bench.py), quiet then under load (loadgen, as compare.sh), then a table
# (bench/python_report.py). Not part of the product.
#
#   bench/python.sh [-b BUILD] [-p "2 4"] [-s SIZES] [-r ROUNDS] [-n ITERS] [-l LOADS] [-d OUT]
#
# DDP=1: also a small model's DistributedDataParallel step over coll and over Gloo;
# DDP_ONLY=1: that alone. AGENT_EXTRA: lines for the agents' agent section.
# Defaults: build-test, 2 pods, 8 B to 64 MiB, 3 rounds, 200 iterations up to 1 MiB,
# loads "quiet loaded"; writes OUT/raw.txt and OUT/table.md (OUT default: a new folder
# under /tmp).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=$root/build-test pods="2" sizes=8,32768,2097152,67108864 rounds=3 iters=200
loads="quiet loaded" out=""
while getopts b:p:s:r:n:l:d: o; do
    case $o in
    b) build=$OPTARG ;; p) pods=$OPTARG ;; s) sizes=$OPTARG ;; r) rounds=$OPTARG ;;
    n) iters=$OPTARG ;; l) loads=$OPTARG ;; d) out=$OPTARG ;;
    *) sed -n 2,12p "$0"; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
out=${out:-$(mktemp -d /tmp/coll-python-bench-XXXX)}
mkdir -p "$out"
tmp=$(mktemp -d)
AGENT_PIDS=() LOAD_PIDS=()
. "$here/agents.sh"
trap 'stop_load; stop_agents; rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/loadgen" "$here/loadgen.c"
export COLL_LIB=$build/libcoll.so.0 PYTHONPATH=$root/python COLL_GROUP=bench
raw=$out/raw.txt
: >"$raw"
echo "# python.sh: pods [$pods] sizes [$sizes] rounds $rounds iters $iters loads [$loads] $(nproc) CPUs $(date -u +%FT%TZ) $(git -C "$root" rev-parse --short HEAD)" | tee -a "$raw"
for n in $pods; do
    for load in $loads; do
        start_agents "$build" "$n" "$tmp" $((21000 + RANDOM % 20000)) "${AGENT_EXTRA:-}"
        [ "$load" = loaded ] && start_load "$tmp/loadgen"
        port=$((21000 + RANDOM % 20000))
        IFS=, read -ra socks <<<"$AGENT_SOCKS"
        pids=()
        for i in $(seq 0 $((n - 1))); do
            COLL_AGENT_SOCKET=${socks[$i]} timeout 1800 /usr/bin/python3 "$here/python_bench.py" \
                "$i" "$n" "$port" "$sizes" "$rounds" "$iters" "$load/$n" >>"$raw" 2>"$tmp/rank$i.err" &
            pids+=($!)
        done
        rc=0
        for p in "${pids[@]}"; do wait "$p" || rc=$?; done
        stop_load
        stop_agents
        [ $rc = 0 ] || { cat "$tmp"/rank*.err >&2; exit 1; }
    done
done
/usr/bin/python3 "$here/python_report.py" "$raw" | tee "$out/table.md"
echo "raw figures: $raw; table: $out/table.md"
