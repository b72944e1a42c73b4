#!/usr/bin/env bash
# The main job: install what is missing, build, start coll-agent on its embedded default
# config (group "demo", 4 local slots) and run 4 application processes that attach through
# libcoll and run collectives on shared host buffers, verified, with timings.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/deps.sh
coll_install_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

export COLL_AGENT_SOCKET="${COLL_AGENT_SOCKET:-/tmp/coll-demo-$$.sock}"
log=$(mktemp /tmp/coll-demo-agent-XXXX.log)
build/coll-agent 2>"$log" &
agent=$!
trap 'kill $agent 2>/dev/null || true; wait $agent 2>/dev/null || true' EXIT
for _ in $(seq 100); do # wait for the socket, 10 s at most
    [ -S "$COLL_AGENT_SOCKET" ] && break
    kill -0 $agent 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.1
done
echo "coll-agent $(build/coll-agent --version | cut -d' ' -f2) listening on $COLL_AGENT_SOCKET (log: $log)"
echo
status=0
build/coll-demo -n 4 -e "${COLL_DEMO_MAX_BYTES:-16777216}" || status=$?
kill -TERM $agent
wait $agent || status=1
trap - EXIT
echo "agent stopped cleanly; its log:"
grep -E "event=(agent|group\.backend|session\.ready)" "$log" | head -8
exit $status
