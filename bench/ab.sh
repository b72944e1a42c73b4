#!/usr/bin/env bash
# Two builds of the agent side by side: N agents of build A, then N of build B, ROUNDS
# times alternating, the same coll-bench each time; prints per size the median time per
# op of each and the median of the per-round ratios B/A (below 1: B is faster). These
# 2-CPU VMs swing by 2x between runs, so only ratios taken within one round count; the
# order flips every round.
# PIN=1: one CPU per pod (see agents.sh). Extra agent config lines for one side: EXTRA_A / EXTRA_B (e.g. EXTRA_B="  spin_us: 0"),
# extra node lines: NODE_EXTRA_A / NODE_EXTRA_B (e.g. NODE_EXTRA_B="  tcp_buffer_bytes: 0").
# BENCH_ARGS: more coll-bench options for both (e.g. -i: in place, as compare.sh runs broadcast).
# ENV_A / ENV_B: environment for one side's applications (e.g. ENV_B=COLL_DIRECT=all, with
# the same build for A and B).
# LOAD=1: under compare.sh's load all along (bench/loadgen.c: a nice-19 busy loop pinned to
# every CPU, and a normal-priority neighbour busy half of every 10 ms).
# Usage: bench/ab.sh BUILD_A BUILD_B AGENTS OP MIN MAX ITERS ROUNDS
#   e.g. bench/ab.sh /tmp/base/build build-rel 4 broadcast 1048576 67108864 5 5
set -euo pipefail
[ $# -eq 8 ] || { sed -n "2,14p" "$0"; exit 2; }
A=$1 B=$2 n=$3 op=$4 minb=$5 maxb=$6 iters=$7 rounds=$8
out=$(mktemp /tmp/coll-ab-XXXX)
LOAD_PIDS=()
. "$(dirname "$0")/agents.sh"
trap 'rm -f "$out" "$out.run" "$out.loadgen"; stop_load' EXIT
load_if_asked "$out.loadgen"
run() { # build label
    local build=$1 lab=$2 dir extra envv nextra
    dir=$(mktemp -d /tmp/coll-ab-XXXX)
    extra=EXTRA_$lab envv=ENV_$lab nextra=NODE_EXTRA_$lab
    AGENT_PIDS=()
    NODE_EXTRA=${!nextra:-${NODE_EXTRA:-}} start_agents "$build" "$n" "$dir" $((21000 + RANDOM % 20000)) "${!extra:-}"
    echo "## $lab" >>"$out"
    if ! env ${!envv:-} "$build/coll-bench" -s "$AGENT_SOCKS" -p "$n" -g bench -o "$op" -b "$minb" -e "$maxb" -f 8 \
        -n "$iters" -w 3 -c 1 $([ "${PIN:-0}" = 1 ] && echo -a) ${BENCH_ARGS:-} >"$out.run" 2>&1; then
        # its round is lost (no ratio for it); say why
        echo "ab.sh: coll-bench of $lab failed:" >&2
        tail -5 "$out.run" >&2
        for i in $(seq 0 $((n - 1))); do grep -h "level=error" "$dir/$i.log" >&2 || true; done
        echo "# coll-bench failed" >>"$out"
    fi
    cat "$out.run" >>"$out"
    kill "${AGENT_PIDS[@]}" 2>/dev/null || true
    for p in "${AGENT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
for r in $(seq "$rounds"); do # the order flips every round (the second run of a pair was
    if [ $((r % 2)) = 1 ]; then # 20% faster at 32 KiB among 4 pods with A = B)
        run "$A" A
        run "$B" B
    else
        run "$B" B
        run "$A" A
    fi
done
python3 - "$out" <<'PY'
import statistics, sys
cur, d = None, {}
for line in open(sys.argv[1]):
    if line.startswith("## "):
        cur = line.split()[1]
        continue
    f = line.split()
    if cur and len(f) >= 5 and f[0].isdigit():
        d.setdefault(int(f[0]), {}).setdefault(cur, []).append(float(f[2]))
print(f"{'bytes':>10} {'A_us':>10} {'B_us':>10} {'B/A':>6}  per-round B/A")
for b in sorted(d):
    a, bb = d[b].get("A", []), d[b].get("B", [])
    rs = [y / x for x, y in zip(a, bb)]
    if not rs:
        continue
    print(f"{b:>10} {statistics.median(a):10.1f} {statistics.median(bb):10.1f} "
          f"{statistics.median(rs):6.2f}  " + " ".join(f"{r:.2f}" for r in rs))
PY
