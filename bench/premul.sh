#!/usr/bin/env bash
# A premultiplied sum against a plain sum: N agents (pods) of one rank each on loopback,
# coll-bench's allreduce and reduce_scatter of DTYPE with COLL_SUM and with a
# premultiplied sum by one (-M: the same results, checked), taking turns ROUNDS times,
# the order flipping every round. Prints, per size, each one's median time and
# premul/sum. The rank's scaling is one pass over its input where the local
# contributions are reduced; between pods both are sums. LOAD=1: under compare.sh's load
# all along (bench/loadgen.c). CHILD=1: on a child split from the group (-C: the same
# ranks; across pods it is libcoll's, whose ranks scale their own input before they
# send). Not part of the product.
# Usage: bench/premul.sh BUILD ROUNDS PODS [DTYPE]   e.g. bench/premul.sh build 5 2 float32
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
B=$1 rounds=$2 n=$3 dt=${4:-float32}
out=$(mktemp /tmp/coll-premul-XXXX)
dir=$(mktemp -d /tmp/coll-premul-XXXX)
. "$(dirname "$0")/agents.sh"
AGENT_PIDS=()
LOAD_PIDS=()
trap 'stop_load; stop_agents; rm -f "$out"; rm -rf "$dir"' EXIT
load_if_asked "$dir/loadgen"
start_agents "$B" "$n" "$dir" "$(free_port)"
for r in $(seq "$rounds"); do
    order="sum premul"
    [ $((r % 2)) = 0 ] && order="premul sum"
    for op in allreduce reduce_scatter; do
        for way in $order; do
            flag=
            [ "$way" = premul ] && flag=-M
            [ "${CHILD:-0}" = 1 ] && flag="$flag -C"
            timeout 600 "$B/coll-bench" -s "$AGENT_SOCKS" -g bench -p "$n" -o "$op" -d "$dt" \
                -L 8,4096,262144,4194304 -n 200 -w 20 -T 200 -c 1 $flag >"$dir/run" ||
                { echo "premul.sh: coll-bench failed ($op $way)" >&2; exit 1; }
            awk -v op="$op" -v w="$way" '$1 ~ /^[0-9]+$/ {if ($6 != 0) exit 1; print op, w, $1, $3}' \
                "$dir/run" >>"$out" || { echo "premul.sh: wrong elements ($op $way)" >&2; exit 1; }
        done
    done
done
echo "# bench/premul.sh $B rounds $rounds, $n pods, $dt, LOAD=${LOAD:-0}, CHILD=${CHILD:-0}, $(nproc) CPUs, $(date -u +%FT%TZ)"
echo "| op | bytes | sum (us) | premul_sum (us) | premul/sum |"
echo "|---|---:|---:|---:|---:|"
python3 - "$out" <<'PY'
import statistics, sys
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1]):
    op, w, b, t = line.split()
    v[(op, int(b), w)].append(float(t))
for op, b in sorted({(op, b) for op, b, _ in v}):
    s, p = statistics.median(v[(op, b, "sum")]), statistics.median(v[(op, b, "premul")])
    print("| %s | %d | %.1f | %.1f | %.2f |" % (op, b, s, p, p / s))
PY
