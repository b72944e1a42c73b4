#!/usr/bin/env bash
# Round trip of a small op through the agent against the two floors, in one run:
#   shm_spin: two bare processes ping-pong on shared memory, both spinning
#   eventfd:  two bare processes ping-pong on eventfds, both sleeping in read(2)
# "busy": ops back to back (the agent is still spinning when the next arrives);
# "idle": GAP_US of sleep before each op, longer than the agent's spin_us, so the agent
# is asleep on its doorbell when the op arrives (the floors get the same gap).
# Usage: bench/latency.sh [BUILD_DIR] [ITERS] [GAP_US]
set -euo pipefail
build=${1:-build}
iters=${2:-20000}
gap=${3:-2000}
sock=/tmp/coll-bench-$$.sock
cfg=$(mktemp /tmp/coll-bench-XXXX.yaml)
cat >"$cfg" <<YAML
agent:
  socket: $sock
  log_level: warn
groups:
  - name: solo
    backend: host
YAML
"$build/coll-agent" --config "$cfg" &
agent=$!
trap 'kill $agent 2>/dev/null; rm -f "$cfg"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

idle_iters=$((iters / 10))
echo "## $(date -u +%FT%TZ) $(nproc) CPUs, iters $iters (idle: $idle_iters, gap ${gap} us)"
"$build/coll-floors" -n "$iters" | tee /tmp/floors-busy.$$
"$build/coll-floors" -n "$idle_iters" -G "$gap" | tee /tmp/floors-idle.$$
t0=$(awk '{print $14+$15}' /proc/$agent/stat)
"$build/coll-bench" -s "$sock" -g solo -b 8 -e 8 -n "$iters" -w 1000 | tee /tmp/agent-busy.$$
"$build/coll-bench" -s "$sock" -g solo -b 8 -e 8 -n "$idle_iters" -w 10 -G "$gap" | tee /tmp/agent-idle.$$
sleep 1
t1=$(awk '{print $14+$15}' /proc/$agent/stat)
sleep 2
t2=$(awk '{print $14+$15}' /proc/$agent/stat)
p50() { grep -oE 'p50_us=[0-9.]+' "$1" | grep -n . | awk -F'[=:]' -v n="$2" '$1==n{print $3}'; }
spin=$(grep shm_spin /tmp/floors-busy.$$ | grep -oE 'p50_us=[0-9.]+' | cut -d= -f2)
efd=$(grep eventfd /tmp/floors-idle.$$ | grep -oE 'p50_us=[0-9.]+' | cut -d= -f2)
busy=$(awk '$1==8 {print $7}' /tmp/agent-busy.$$)
idle=$(awk '$1==8 {print $7}' /tmp/agent-idle.$$)
echo
echo "agent busy p50 ${busy} us vs shm_spin floor ${spin} us: ratio $(awk -v a="$busy" -v b="$spin" 'BEGIN{printf "%.2f", a/b}')"
echo "agent idle p50 ${idle} us vs eventfd floor ${efd} us (same gap): ratio $(awk -v a="$idle" -v b="$efd" 'BEGIN{printf "%.2f", a/b}')"
echo "agent CPU while idle: $((t2 - t1)) ticks in 2 s (after the runs: $((t1 - t0)) ticks)"
rm -f /tmp/floors-busy.$$ /tmp/floors-idle.$$ /tmp/agent-busy.$$ /tmp/agent-idle.$$
