#!/usr/bin/env bash
# One group of N agents (processes) on loopback: how long it takes to form, to form again
# after one member restarts, what the coordinator spends per member (CPU, memory) and
# how many sockets a pod holds. Times come from the agents' own log timestamps.
# Usage: bench/scale.sh [BUILD_DIR] [AGENTS] [HEARTBEAT_MS]
set -euo pipefail
build=${1:-build}
n=${2:-256}
hb=${3:-1000}
ts() { sed -E 's/.*ts=[0-9-]+T([0-9]+):([0-9]+):([0-9.]+)Z.*/\1 \2 \3/' | awk '{printf "%.6f\n", $1*3600+$2*60+$3}'; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.0f", (a-b)*1000}'; }
ulimit -n 65536 2>/dev/null || true
dir=$(mktemp -d /tmp/coll-scale-XXXX)
port=$((20000 + (RANDOM % 20000)))
pids=()
cfg() {
    printf 'agent:\n  socket: %s/%d.sock\n  log_level: info\nnode:\n  index: %d\n  name: pod-%d\ndiscovery:\n  coordinator: "127.0.0.1:%d"\ngroups:\n  - name: g\n    backend: host\n    members: %d\n    timeouts: {heartbeat_ms: %d, join_ms: 120000, op_ms: 120000}\n' \
        "$dir" "$1" "$1" "$1" "$port" "$n" "$hb" >"$dir/$1.yaml"
}
start() {
    "$build/coll-agent" --config "$dir/$1.yaml" 2>>"$dir/$1.log" &
    pids[$1]=$!
    disown "${pids[$1]}" # no job-control chatter when one is killed
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
sockets() { find "/proc/$1/fd" -lname 'socket:*' 2>/dev/null | wc -l; }
formed_count() { cat "$dir"/*.log | grep -c 'event=group.formed' || true; }
wait_formed() { # COUNT SECONDS
    for _ in $(seq $(($2 * 20))); do
        [ "$(formed_count)" -ge "$1" ] && return 0
        sleep 0.05
    done
    return 1
}
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.01; done; done
    rm -rf "$dir"
}
trap cleanup EXIT

for i in $(seq 0 $((n - 1))); do cfg "$i"; done
start 0
sleep 0.2
c0=$(cpu_ticks "${pids[0]}")
r0=$(rss_kb "${pids[0]}")
for i in $(seq 1 $((n - 1))); do start "$i"; done
wait_formed "$n" 120 || { echo "only $(formed_count) of $n formed"; exit 1; }
first=$(grep -h event=agent.start "$dir"/*.log | ts | sort -n | head -1)
last=$(grep -h event=agent.start "$dir"/*.log | ts | sort -n | tail -1)
formed=$(grep -h event=group.formed "$dir"/*.log | ts | sort -n | tail -1)
sleep 2 # a few heartbeat intervals of steady state
c1=$(cpu_ticks "${pids[0]}")
r1=$(rss_kb "${pids[0]}")
hz=$(getconf CLK_TCK)
echo "agents: $n, heartbeat ${hb} ms, $(nproc) CPUs"
echo "formation: $(ms "$formed" "$first") ms from the first agent's start, $(ms "$formed" "$last") ms from the last's"
echo "coordinator: CPU $(awk -v a="$c1" -v b="$c0" -v h="$hz" 'BEGIN{printf "%.0f", (a-b)*1000/h}') ms from its start to 2 s after formation," \
    "RSS $r0 -> $r1 KiB ($(awk -v a="$r1" -v b="$r0" -v n="$n" 'BEGIN{printf "%.1f", (a-b)/n}') KiB per member)"
s=$(sockets "${pids[$((n / 2))]}")
echo "sockets of pod $((n / 2)): $s (data pairs $(grep -o 'pairs=[0-9]*' "$dir/$((n / 2)).log" | head -1))"

# one member restarts: from its agent's start to the group formed again everywhere
k=$((n / 3))
kill -9 "${pids[$k]}"
while kill -0 "${pids[$k]}" 2>/dev/null; do sleep 0.01; done
sleep $(((3 * hb + 999) / 1000 + 1)) # the others notice (3 heartbeats)
mv "$dir/$k.log" "$dir/$k.old"
before=$(formed_count)
start "$k"
wait_formed $((before + n)) 120 || { echo "no re-formation: $(formed_count) of $((before + n))"; exit 1; }
restart=$(grep -h event=agent.start "$dir/$k.log" | ts | tail -1)
reformed=$(cat "$dir"/*.log | grep -h event=group.formed | ts | sort -n | tail -1)
echo "member $k restarted: the group formed again $(ms "$reformed" "$restart") ms after its agent started"
