#!/usr/bin/env bash
# Groups made at run time in a large world: N agents (pods) of one rank each on loopback,
# one host group across them; every rank makes its child of K consecutive ranks (the
# tensor-parallel groups of a data-parallel world), by coll_group_split (collective over
# the world) and by coll_group_create (its members alone), taking turns ROUNDS times,
# and runs ITERS 8-byte allreduces on it. Prints, per N, K and way, rank 0's time from
# the call to the child's first completed op and the slowest child's, each the median of
# the rounds, and the 8 B allreduce on the child. HEARTBEAT_MS: the agents' heartbeat
# (agents.sh; 256 agents and 256 ranks on two vCPUs starve a 1 s one). Not part of the
# product.
# Usage: bench/split_scale.sh BUILD ROUNDS K N...   e.g. bench/split_scale.sh build 3 8 16 256
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,9p "$0"; exit 2; }
B=$1 rounds=$2 k=$3
shift 3
ulimit -n 65536 2>/dev/null || true
out=$(mktemp /tmp/coll-split-scale-XXXX)
. "$(dirname "$0")/agents.sh"
AGENT_PIDS=()
trap 'rm -f "$out"; stop_agents' EXIT
for n in "$@"; do
    dir=$(mktemp -d /tmp/coll-split-scale-XXXX)
    start_agents "$B" "$n" "$dir" "$(free_port)"
    for r in $(seq "$rounds"); do
        order="split create"
        [ $((r % 2)) = 0 ] && order="create split"
        for way in $order; do
            flag=
            [ "$way" = create ] && flag=-X
            timeout 900 "$B/coll-bench" -s "$AGENT_SOCKS" -g bench -p "$n" -o allreduce -L 8 \
                -n 50 -w 5 -c 1 -K "$k" $flag >"$dir/run" ||
                { echo "split_scale.sh: coll-bench failed ($way, $n pods)" >&2; exit 1; }
            awk -v n="$n" -v w="$way" '
                /to first op [0-9.]+ us$/ && !/slowest/ {print n, w, "rank0", $(NF-1)}
                /slowest/ {print n, w, "slowest", $(NF-1)}
                $1 == 8 {print n, w, "op8", $3}' "$dir/run" >>"$out"
        done
    done
    stop_agents
    rm -rf "$dir"
done
echo "# bench/split_scale.sh $B rounds $rounds, children of $k ranks, $(nproc) CPUs, $(date -u +%FT%TZ)"
echo "| pods | way | rank 0: call to first op (ms) | slowest child (ms) | 8 B allreduce on the child (us) |"
echo "|---:|---|---:|---:|---:|"
python3 - "$out" <<'PY'
import statistics, sys
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1]):
    n, w, what, x = line.split()
    v[(int(n), w, what)].append(float(x))
for n, w in sorted({(n, w) for n, w, _ in v}):
    m = lambda what, s=1.0: "%.1f" % (statistics.median(v[(n, w, what)]) / s) if v[(n, w, what)] else "-"
    print("| %d | %s | %s | %s | %s |" % (n, w, m("rank0", 1000), m("slowest", 1000), m("op8")))
PY
