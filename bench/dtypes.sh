#!/usr/bin/env bash
# What a dtype costs: allreduce (sum) of the same bytes in each dtype against float32,
# between N agents (pods) of one rank each, the dtypes taking turns ROUNDS times, the
# order rotating every round. Prints, per size and dtype, the median time per op and the
# ratio float32/dtype (above 1: the dtype is faster). float8s and bool are run without
# the result check (their sums leave exactness); the others are checked.
# DTYPES="...": the dtypes (float32 uint8 float8_e4m3 float8_e5m2 bfloat16 complex64
# complex128). SIZES=a,b,...: the sizes (65536,1048576,16777216). LOAD=1: under
# compare.sh's load (bench/loadgen.c) all along.
# Usage: bench/dtypes.sh BUILD ROUNDS [N]   e.g. bench/dtypes.sh build 5 2
set -euo pipefail
[ $# -ge 2 ] || { sed -n "2,10p" "$0"; exit 2; }
B=$1 rounds=$2 n=${3:-2}
dtypes=${DTYPES:-float32 uint8 float8_e4m3 float8_e5m2 bfloat16 complex64 complex128}
sizes=${SIZES:-65536,1048576,16777216}
out=$(mktemp /tmp/coll-dtypes-XXXX)
LOAD_PIDS=()
. "$(dirname "$0")/agents.sh"
AGENT_PIDS=()
dir=$(mktemp -d /tmp/coll-dtypes-XXXX)
trap 'rm -rf "$out" "$out.loadgen" "$dir"; stop_load; stop_agents' EXIT
load_if_asked "$out.loadgen"
start_agents "$B" "$n" "$dir" "$(free_port)"
read -r -a list <<<"$dtypes"
k=${#list[@]}
for r in $(seq "$rounds"); do
    for j in $(seq 0 $((k - 1))); do
        dt=${list[$(((j + r) % k))]}
        check=1
        case $dt in float8_* | bool) check=0 ;; esac
        timeout 600 "$B/coll-bench" -s "$AGENT_SOCKS" -g bench -p "$n" -o allreduce -d "$dt" \
            -L "$sizes" -n 50 -c "$check" >"$dir/run" ||
            { echo "dtypes.sh: coll-bench failed ($dt)" >&2; exit 1; }
        awk -v d="$dt" '$1 ~ /^[0-9]+$/ {print d, $1, $3, $6}' "$dir/run" >>"$out"
    done
done
/usr/bin/python3 - "$out" "$n" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
wrong = sum(int(r[3]) for r in rows)
if wrong:
    sys.exit("dtypes.sh: %d wrong elements" % wrong)
dts = list(dict.fromkeys(r[0] for r in rows))
print("allreduce sum, %s pods, median us per op (float32/dtype)" % sys.argv[2])
print("| bytes | " + " | ".join(dts) + " |")
print("|---:|" + "---:|" * len(dts))
for b in sorted({int(r[1]) for r in rows}):
    t = {d: statistics.median(float(r[2]) for r in rows if r[0] == d and int(r[1]) == b)
         for d in dts}
    ref = t.get("float32", t[dts[0]])
    print("| %d | " % b + " | ".join("%.1f (%.2f)" % (t[d], ref / t[d]) for d in dts) + " |")
PY
