#!/usr/bin/env bash
# What a large local op does to everyone else in the pod: one agent, two groups; two
# processes run BIG-byte allreduces in group "big" (10 alone, timed; then 30 more) while
# two others run 2000 8-byte allreduces in group "small", whose single-op round trips
# (coll-bench -O) give the median, 99th percentile and maximum. Agents of build A and
# build B take turns, ROUNDS times, the order flipping every round; the same coll-bench
# (from B) for both.
# PIN=1: the agent on CPU 0, the applications on the others (so that what the small ops
# wait for is the agent, not a CPU the big ones' processes hold).
# LOAD=1: under compare.sh's load (bench/loadgen.c) all along.
# Usage: bench/turns.sh BUILD_A BUILD_B BIG ROUNDS
#   e.g. bench/turns.sh /tmp/base/build build 268435456 5
set -euo pipefail
[ $# -eq 4 ] || { sed -n "2,9p" "$0"; exit 2; }
A=$1 B=$2 big=$3 rounds=$4
out=$(mktemp /tmp/coll-turns-XXXX)
AGENT_PIN= APP_PIN=
if [ "${PIN:-0}" = 1 ]; then AGENT_PIN="taskset -c 0" APP_PIN="taskset -c 1-$(($(nproc) - 1))"; fi
LOAD_PIDS=()
. "$(dirname "$0")/agents.sh"
trap 'rm -f "$out" "$out.loadgen"; stop_load' EXIT
load_if_asked "$out.loadgen"
run() { # build label
    local build=$1 lab=$2 dir pid bigpid
    dir=$(mktemp -d /tmp/coll-turns-XXXX)
    cat >"$dir/a.yaml" <<YAML
agent:
  socket: $dir/a.sock
  log_level: warn
groups:
  - name: big
    backend: host
    local_slots: 2
    timeouts: {op_ms: 120000}
  - name: small
    backend: host
    local_slots: 2
    timeouts: {op_ms: 120000}
YAML
    $AGENT_PIN "$build/coll-agent" --config "$dir/a.yaml" 2>"$dir/a.log" &
    pid=$!
    for _ in $(seq 200); do [ -S "$dir/a.sock" ] && break; sleep 0.05; done
    # the big op alone: what the slicing costs it
    echo "$lab-big $($APP_PIN "$B/coll-bench" -s "$dir/a.sock" -g big -p 2 -o allreduce -b "$big" -e "$big" \
        -n 10 -w 1 -c 0 | awk -v b="$big" '$1 == b {print $3}')" >>"$out"
    # then next to the small ones: 30 big ops, the small ones from the third on
    $APP_PIN "$B/coll-bench" -s "$dir/a.sock" -g big -p 2 -o allreduce -b "$big" -e "$big" -n 30 -w 1 -c 0 \
        >/dev/null 2>&1 &
    bigpid=$!
    sleep 0.3
    $APP_PIN "$B/coll-bench" -s "$dir/a.sock" -g small -p 2 -o allreduce -b 8 -e 8 -n 2000 -w 100 -c 1 \
        -O "$dir/small" >/dev/null
    echo "$lab $(tr '\n' ' ' <"$dir/small.8.0")" >>"$out"
    wait "$bigpid" || echo "turns.sh: the big ops of $lab failed" >&2
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}
for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then run "$A" A; run "$B" B; else run "$B" B; run "$A" A; fi
done
python3 - "$out" <<'PY'
import statistics, sys
d = {}
big = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0].endswith("-big"):
        big.setdefault(f[0][0], []).append(float(f[1]))
        continue
    v = sorted(float(x) for x in f[1:])
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    d.setdefault(f[0], []).append((q(0.5), q(0.99), v[-1], sum(v) / 1000))
print("8 B round trips (us) next to the big ops, medians over rounds; ms: the 2000 ops' total")
print(f"{'':2} {'p50':>9} {'p99':>9} {'max':>9} {'ms':>9}")
for lab in ("A", "B"):
    rows = d.get(lab, [])
    if rows:
        print(f"{lab:2} " + " ".join(f"{statistics.median(r[i] for r in rows):9.1f}" for i in range(4)))
    for r in rows:
        print("   round: " + " ".join(f"{x:9.1f}" for x in r))
a, b = big.get("A", []), big.get("B", [])
if a and b:
    rs = [y / x for x, y in zip(a, b)]
    print(f"the big op alone, us: A {statistics.median(a):.0f}, B {statistics.median(b):.0f}, "
          f"B/A {statistics.median(rs):.2f} (per round: " + " ".join(f"{r:.2f}" for r in rs) + ")")
PY
