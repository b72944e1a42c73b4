#!/usr/bin/env bash
# The main job: install what is missing, build, start a local cluster of four coll-agents
# on loopback (each on the embedded default config: node index 0..3, rendezvous on
# 127.0.0.1), attach one application process to each through libcoll, and run
# collectives across the four "pods" on shared host buffers, verified, with bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/deps.sh
coll_install_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

pods=${COLL_DEMO_PODS:-4}
export COLL_DEMO_PODS=$pods
export COLL_RDV_PORT=${COLL_RDV_PORT:-$((20000 + $$ % 20000))}
dir=$(mktemp -d /tmp/coll-demo-XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
socks=""
for i in $(seq 0 $((pods - 1))); do
    COLL_NODE_INDEX=$i COLL_AGENT_SOCKET="$dir/agent-$i.sock" build/coll-agent 2>"$dir/agent-$i.log" &
    pids+=($!)
    socks="${socks:+$socks,}$dir/agent-$i.sock"
done
for i in $(seq 0 $((pods - 1))); do # wait for every socket, 10 s at most
    for _ in $(seq 100); do [ -S "$dir/agent-$i.sock" ] && break; sleep 0.1; done
    [ -S "$dir/agent-$i.sock" ] || { cat "$dir/agent-$i.log"; exit 1; }
done
echo "coll-agent $(build/coll-agent --version | cut -d' ' -f2): $pods agents on loopback, rendezvous 127.0.0.1:$COLL_RDV_PORT, logs in $dir"
echo
status=0
build/coll-demo -n "$pods" -s "$socks" -e "${COLL_DEMO_MAX_BYTES:-16777216}" || status=$?
for p in "${pids[@]}"; do kill -TERM "$p"; done
for p in "${pids[@]}"; do wait "$p" || status=1; done
pids=()
echo "agents stopped cleanly; the coordinator's log:"
grep -E "event=(net.start|rendezvous.join|rendezvous.commit|group.formed)" "$dir/agent-0.log" | head -8
exit $status
