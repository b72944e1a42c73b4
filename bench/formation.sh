#!/usr/bin/env bash
# Time for a group of N agents on loopback to form (every JOIN in, COMMIT sent, every data
# connection up) once all N are started. Reads the agents' own log timestamps: from the
# start of the last agent to the last "group.formed".
# Usage: bench/formation.sh [BUILD_DIR] [AGENTS] [ROUNDS]
set -euo pipefail
build=${1:-build}
n=${2:-8}
rounds=${3:-5}
ts() { sed -E 's/.*ts=[0-9-]+T([0-9]+):([0-9]+):([0-9.]+)Z.*/\1 \2 \3/' | awk '{printf "%.6f\n", $1*3600+$2*60+$3}'; }
for r in $(seq "$rounds"); do
    dir=$(mktemp -d /tmp/coll-form-XXXX)
    port=$((20000 + (RANDOM % 20000)))
    pids=()
    for i in $(seq 0 $((n - 1))); do
        printf 'agent:\n  socket: %s/%d.sock\nnode:\n  index: %d\ndiscovery:\n  peers: ["127.0.0.1:%d"]\ngroups:\n  - name: g\n    backend: host\n    members: %d\n    timeouts: {heartbeat_ms: 200}\n' \
            "$dir" "$i" "$i" "$port" "$n" >"$dir/$i.yaml"
        "$build/coll-agent" --config "$dir/$i.yaml" 2>"$dir/$i.log" &
        pids+=($!)
    done
    for _ in $(seq 200); do
        [ "$(cat "$dir"/*.log | grep -c group.formed)" -ge "$n" ] && break
        sleep 0.05
    done
    started=$(grep -h event=agent.start "$dir"/*.log | ts | sort -n | tail -1)
    formed=$(grep -h event=group.formed "$dir"/*.log | ts | sort -n | tail -1)
    count=$(cat "$dir"/*.log | grep -c group.formed)
    echo "round $r: $count/$n agents formed epoch 1, $(awk -v a="$formed" -v b="$started" 'BEGIN{printf "%.1f", (a-b)*1000}') ms after the last agent started"
    for p in "${pids[@]}"; do kill "$p"; done
    wait
    rm -rf "$dir"
done
