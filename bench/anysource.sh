#!/usr/bin/env bash
# A receive from any rank against a named one: PODS agents (pods) on loopback holding two
# ranks between them (PODS 2: one each, the net threads pair them; PODS 1: both on one
# pod, the engine pairs them), coll-bench's sendrecv (rank 1 sends, rank 0 receives,
# checked) with coll_recv(.., 1, ..) and with coll_recv_any (-A), taking turns ROUNDS
# times, the order flipping every round. Prints, per size, each one's median time and
# any/named. LOAD=1: under compare.sh's load all along (bench/loadgen.c). Not part of the
# product.
# Usage: bench/anysource.sh BUILD ROUNDS PODS   e.g. bench/anysource.sh build 5 2
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
B=$1 rounds=$2 n=$3
out=$(mktemp /tmp/coll-any-XXXX)
dir=$(mktemp -d /tmp/coll-any-XXXX)
. "$(dirname "$0")/agents.sh"
AGENT_PIDS=()
LOAD_PIDS=()
trap 'stop_load; stop_agents; rm -f "$out"; rm -rf "$dir"' EXIT
load_if_asked "$dir/loadgen"
[ "$n" = 1 ] && export GROUP_EXTRA="    local_slots: 2"
start_agents "$B" "$n" "$dir" "$(free_port)"
for r in $(seq "$rounds"); do
    order="named any"
    [ $((r % 2)) = 0 ] && order="any named"
    for way in $order; do
        flag=
        [ "$way" = any ] && flag=-A
        timeout 600 "$B/coll-bench" -s "$AGENT_SOCKS" -g bench -p 2 -o sendrecv \
            -L 8,4096,262144,4194304 -n 200 -w 20 -T 200 -c 1 $flag >"$dir/run" ||
            { echo "anysource.sh: coll-bench failed ($way)" >&2; exit 1; }
        awk -v w="$way" '$1 ~ /^[0-9]+$/ {if ($6 != 0) exit 1; print w, $1, $3}' "$dir/run" \
            >>"$out" || { echo "anysource.sh: wrong elements ($way)" >&2; exit 1; }
    done
done
echo "# bench/anysource.sh $B rounds $rounds, $n pods, LOAD=${LOAD:-0}, $(nproc) CPUs, $(date -u +%FT%TZ)"
echo "| bytes | named (us) | any (us) | any/named |"
echo "|---:|---:|---:|---:|"
python3 - "$out" <<'PY'
import statistics, sys
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1]):
    w, b, t = line.split()
    v[(int(b), w)].append(float(t))
for b in sorted({b for b, _ in v}):
    s, p = statistics.median(v[(b, "named")]), statistics.median(v[(b, "any")])
    print("| %d | %.1f | %.1f | %.2f |" % (b, s, p, p / s))
PY
