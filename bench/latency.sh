#!/usr/bin/env bash
# Round trip of a small op (8-byte allreduce) through the agent against two floors
# measured in the same run between two bare processes:
#   shm_spin: ping-pong on a word in shared memory, both sides spinning
#   eventfd:  ping-pong on eventfds, both sides asleep in read(2)
# busy: ops back to back (the agent is still spinning when the next one arrives);
# idle: GAP_US of sleep before each op, longer than the agent's spin_us, so that the agent
#       sleeps on its doorbell when the op arrives (the floors get the same gap).
# These VMs move vCPUs between host cores, so one pair of numbers can be off by 2x from
# the next; the script interleaves ROUNDS rounds (floor, agent, floor, agent, ...) and
# reports the median of the per-round medians. PIN=1 pins the client (and the floors'
# timing side) to CPU 0 and the agent (and the floors' partner) to CPU 1.
# Usage: [PIN=1] bench/latency.sh [BUILD_DIR] [ROUNDS] [ITERS] [GAP_US]
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
iters=${3:-10000}
gap=${4:-2000}
idle_iters=$((iters / 20))
sock=/tmp/coll-bench-$$.sock
cfg=$(mktemp /tmp/coll-bench-XXXX.yaml)
out=$(mktemp -d /tmp/coll-lat-XXXX)
cat >"$cfg" <<YAML
agent:
  socket: $sock
  log_level: warn
groups:
  - name: solo
    backend: host
YAML
a_pin=() c_pin=() f_pin=()
if [ "${PIN:-0}" = 1 ]; then a_pin=(taskset -c 1); c_pin=(taskset -c 0); f_pin=(-c 0,1); fi
"${a_pin[@]}" "$build/coll-agent" --config "$cfg" &
agent=$!
trap 'kill $agent 2>/dev/null; rm -rf "$cfg" "$out"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

p50_floor() { grep "floor $1" | grep -oE 'p50_us=[0-9.]+' | cut -d= -f2; }
p50_bench() { awk '$1 == 8 {print $7}'; }
for r in $(seq "$rounds"); do
    "$build/coll-floors" "${f_pin[@]}" -n "$iters" >"$out/fb"
    p50_floor shm_spin <"$out/fb" >>"$out/spin"
    "${c_pin[@]}" "$build/coll-bench" -s "$sock" -g solo -b 8 -e 8 -n "$iters" -w 500 |
        p50_bench >>"$out/busy"
    "$build/coll-floors" "${f_pin[@]}" -n "$idle_iters" -G "$gap" >"$out/fi"
    p50_floor eventfd <"$out/fi" >>"$out/efd"
    "${c_pin[@]}" "$build/coll-bench" -s "$sock" -g solo -b 8 -e 8 -n "$idle_iters" -w 5 -G "$gap" |
        p50_bench >>"$out/idle"
done
t1=$(awk '{print $14+$15}' /proc/$agent/stat)
sleep 2
t2=$(awk '{print $14+$15}' /proc/$agent/stat)

median() { sort -g "$1" | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
spin=$(median "$out/spin") busy=$(median "$out/busy")
efd=$(median "$out/efd") idle=$(median "$out/idle")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, pinned: ${PIN:-0}, $rounds rounds of $iters busy / $idle_iters idle round trips, gap $gap us"
echo "per-round p50 (us): shm_spin $(paste -sd' ' "$out/spin") | agent busy $(paste -sd' ' "$out/busy")"
echo "per-round p50 (us): eventfd $(paste -sd' ' "$out/efd") | agent idle $(paste -sd' ' "$out/idle")"
echo "busy: agent $busy us / shm_spin floor $spin us = $(ratio "$busy" "$spin")"
echo "idle: agent $idle us / eventfd floor $efd us = $(ratio "$idle" "$efd")"
echo "agent CPU while idle: $((t2 - t1)) ticks in 2 s"
