#!/usr/bin/env bash
# coll's own Python call against the same op from C: 2 pods (-p 1: one) on loopback agents, an 8 B
# allreduce (or -s BYTES) in coll memory, coll-bench's ranks and bench/python_call.py's
# taking turns, ROUNDS rounds, the order flipping every round; prints each round and the
# median of the per-round Python/C ratios. Not part of the product.
#
#   bench/python_c.sh [-b BUILD] [-p 1|2] [-s BYTES] [-r ROUNDS] [-n ITERS] [-l quiet|loaded]
#
# TORCH=1: also dist.all_reduce through the torch backend "coll" (torch), and through a
# backend that does nothing (null: torch's own dispatch), and torch's time over C's less
# null's. PKG_B=DIR (with TORCH=1): the same dist.all_reduce through the package in DIR
# (another tree's python/, e.g. a worktree of the commit before) in the same rounds,
# and its time against this tree's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=$root/build-test bytes=8 rounds=7 iters=5000 load=quiet pods=2
while getopts b:p:s:r:n:l: o; do
    case $o in
    b) build=$OPTARG ;; p) pods=$OPTARG ;; s) bytes=$OPTARG ;; r) rounds=$OPTARG ;; n) iters=$OPTARG ;;
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
case $pods in 1 | 2) ;; *) echo "python_c.sh: -p takes 1 or 2"; exit 2 ;; esac
start_agents "$build" "$pods" "$tmp" "$(free_port)"
IFS=, read -ra socks <<<"$AGENT_SOCKS"
[ "$load" = loaded ] && start_load "$tmp/loadgen"
c_run() {
    timeout 300 "$build/coll-bench" -s "$AGENT_SOCKS" -p "$pods" -g bench -o allreduce -L "$bytes" \
        -n "$iters" -c 0 2>&1 | awk '$1 ~ /^[0-9]+$/ {print "c", $3}'
}
py_run() { # [raw|prepared|torch|null]: the two C calls through ctypes alone; Group.prepare's
    # op; TORCH=1 only: dist.all_reduce on the backend "coll", and on one that does nothing
    local pids=() i port
    port=$(free_port)
    for i in $(seq 0 $((pods - 1))); do
        PYTHONPATH=${PY_PATH:-$root/python} TORCH_PORT=$port timeout 300 /usr/bin/python3 \
            "$here/python_call.py" "${socks[$i]}" bench \
            "$bytes" "$iters" ${1:-} >"$tmp/py$i.out" 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    cat "$tmp/py0.out"
}
echo "# python_c.sh: $bytes B allreduce, $pods pods, $iters iters, $rounds rounds, $load, $(git -C "$root" rev-parse --short HEAD)"
for r in $(seq 1 "$rounds"); do
    tt="torch -" nn="null -" tb=""
    if [ $((r % 2)) = 1 ]; then
        c=$(c_run); p=$(py_run); w=$(py_run raw); q=$(py_run prepared)
        [ "${TORCH:-0}" = 1 ] && { tt=$(py_run torch); nn=$(py_run null); }
        [ -n "${PKG_B:-}" ] && tb=$(PY_PATH=$PKG_B py_run torch)
    else
        [ -n "${PKG_B:-}" ] && tb=$(PY_PATH=$PKG_B py_run torch)
        [ "${TORCH:-0}" = 1 ] && { nn=$(py_run null); tt=$(py_run torch); }
        q=$(py_run prepared); w=$(py_run raw); p=$(py_run); c=$(c_run)
    fi
    echo "round $r $c $p ${w/python/ctypes} ${q/python/prepared} ${tt/python/torch} ${nn/python/null} ${tb/python/torchB}"
done | tee "$tmp/rounds"
for f in 6:python 10:prepared; do # the column of each Python variant against C's ($4)
    awk -v k="${f%%:*}" '{ c = $4; p = $k; print p / c, p - c }' "$tmp/rounds" | sort -n | awk -v n="${f#*:}" '
        { r[NR] = $1; d[NR] = $2 } END { m = int((NR + 1) / 2);
          printf "median %s/c %.3f (per-round ratios %.3f..%.3f), %+.2f us\n", n, r[m], r[1], r[NR], d[m] }'
done
if [ "${TORCH:-0}" = 1 ]; then # torch's time less its own dispatch (null) against C's
    awk '{ c = $4; t = $12 - $14; print t / c, t - c }' "$tmp/rounds" | sort -n | awk '
        { r[NR] = $1; d[NR] = $2 } END { m = int((NR + 1) / 2);
          printf "median (torch - null)/c %.3f (per-round ratios %.3f..%.3f), %+.2f us\n", r[m], r[1], r[NR], d[m] }'
fi
if [ -n "${PKG_B:-}" ]; then # the other package's, and this one's against it
    awk '{ c = $4; t = $16 - $14; print t / c, t - c }' "$tmp/rounds" | sort -n | awk '
        { r[NR] = $1; d[NR] = $2 } END { m = int((NR + 1) / 2);
          printf "median (torchB - null)/c %.3f (per-round ratios %.3f..%.3f), %+.2f us\n", r[m], r[1], r[NR], d[m] }'
    awk '{ print $12 / $16, $12 - $16 }' "$tmp/rounds" | sort -n | awk '
        { r[NR] = $1; d[NR] = $2 } END { m = int((NR + 1) / 2);
          printf "median torch/torchB %.3f (per-round ratios %.3f..%.3f), %+.2f us\n", r[m], r[1], r[NR], d[m] }'
fi
