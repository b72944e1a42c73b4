#!/usr/bin/env bash
# coll's own Python call against the same op from C: 2 pods on loopback agents, an 8 B
# allreduce (or -s BYTES) in coll memory, coll-bench's ranks and bench/python_call.py's
# taking turns, ROUNDS rounds, the order flipping every round; prints each round and the
# median of the per-round Python/C ratios. Not part of the product.
#
#   bench/python_c.sh [-b BUILD] [-s BYTES] [-r ROUNDS] [-n ITERS] [-l quiet|loaded]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=$root/build-test bytes=8 rounds=7 iters=5000 load=quiet
while getopts b:s:r:n:l: o; do
    case $o in
    b) build=$OPTARG ;; s) bytes=$OPTARG ;; r) rounds=$OPTARG ;; n) iters=$OPTARG ;;
    l) load=$OPTARG ;; *) sed -n 2,7p "$0"; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
tmp=$(mktemp -d)
AGENT_PIDS=() LOAD_PIDS=()
. "$here/agents.sh"
trap 'stop_load; stop_agents; rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/loadgen" "$here/loadgen.c"
export COLL_LIB=$build/libcoll.so.0 PYTHONPATH=$root/python
start_agents "$build" 2 "$tmp" "$(free_port)"
IFS=, read -ra socks <<<"$AGENT_SOCKS"
[ "$load" = loaded ] && start_load "$tmp/loadgen"
c_run() {
    timeout 300 "$build/coll-bench" -s "$AGENT_SOCKS" -p 2 -g bench -o allreduce -L "$bytes" \
        -n "$iters" -c 0 2>&1 | awk '$1 ~ /^[0-9]+$/ {print "c", $3}'
}
py_run() {
    local pids=() i
    for i in 0 1; do
        timeout 300 /usr/bin/python3 "$here/python_call.py" "${socks[$i]}" bench "$bytes" "$iters" \
            >"$tmp/py$i.out" 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    cat "$tmp/py0.out"
}
echo "# python_c.sh: $bytes B allreduce, 2 pods, $iters iters, $rounds rounds, $load, $(git -C "$root" rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then c=$(c_run); p=$(py_run); else p=$(py_run); c=$(c_run); fi
    echo "round $r $c $p"
done | tee "$tmp/rounds"
awk '{ c = $4; p = $6; print p / c, p - c }' "$tmp/rounds" | sort -n | awk '
    { r[NR] = $1; d[NR] = $2 } END { m = int((NR + 1) / 2);
      printf "median python/c %.3f (per-round ratios %.3f..%.3f)\n", r[m], r[1], r[NR] }'
