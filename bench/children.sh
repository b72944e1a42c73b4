#!/usr/bin/env bash
# Groups made at run time against the groups they equal: one agent, a group "g" of N
# local slots; coll-bench with N processes runs allreduces of each size on g itself
# (YAML) and on a child split from g (-C: the same ranks in the same order), the two
# taking turns ROUNDS times, the order flipping every round, bound to the same CPUs.
# Prints, per N and size, the median time per op of each and child/YAML, and the median
# time from coll_group_split to the child's first completed op.
# SIZES=a,b,...: the sizes (8,65536,1048576). LOAD=1: under compare.sh's load (bench/loadgen.c)
# all along. ACROSS=1: N agents (pods)
# of one rank each instead, a YAML group across them and a child across pods (libcoll's,
# over the group's sends and receives: docs/decisions/0025-children-across-pods.md).
# Usage: bench/children.sh BUILD ROUNDS [N...]   e.g. bench/children.sh build 5 2 4 8
set -euo pipefail
[ $# -ge 2 ] || { sed -n "2,9p" "$0"; exit 2; }
B=$1 rounds=$2
shift 2
ns=${*:-2 4 8}
sizes=${SIZES:-8,65536,1048576}
out=$(mktemp /tmp/coll-children-XXXX)
LOAD_PIDS=()
. "$(dirname "$0")/agents.sh"
AGENT_PIDS=()
trap 'rm -f "$out" "$out.loadgen"; stop_load; stop_agents' EXIT
load_if_asked "$out.loadgen"
for n in $ns; do
    dir=$(mktemp -d /tmp/coll-children-XXXX)
    if [ "${ACROSS:-0}" = 1 ]; then
        start_agents "$B" "$n" "$dir" "$(free_port)"
        socks=$AGENT_SOCKS group=bench pid=
    else
    socks=$dir/a.sock group=g
    cat >"$dir/a.yaml" <<YAML
agent:
  socket: $dir/a.sock
  log_level: warn
groups:
  - name: g
    backend: host
    local_slots: $n
    timeouts: {op_ms: 120000}
YAML
    "$B/coll-agent" --config "$dir/a.yaml" 2>"$dir/a.log" &
    pid=$!
    for _ in $(seq 200); do [ -S "$dir/a.sock" ] && break; sleep 0.05; done
    fi
    for r in $(seq "$rounds"); do
        order="yaml child"
        [ $((r % 2)) = 0 ] && order="child yaml"
        for kind in $order; do
            flag=
            [ "$kind" = child ] && flag=-C
            timeout 600 "$B/coll-bench" -s "$socks" -g "$group" -p "$n" -o allreduce -L "$sizes" -n 200 -c 1 \
                $flag >"$dir/run" || { echo "children.sh: coll-bench failed ($kind, $n)" >&2; exit 1; }
            awk -v n="$n" -v k="$kind" '$1 ~ /^[0-9]+$/ {print n, k, $1, $3, $6}' "$dir/run" >>"$out"
            grep -o 'split to first op [0-9.]*' "$dir/run" | awk -v n="$n" '{print n, "split", 0, $5, 0}' >>"$out" || true
        done
    done
    if [ -n "$pid" ]; then
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    else
        stop_agents
    fi
    rm -rf "$dir"
done
/usr/bin/python3 - "$out" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
wrong = sum(int(r[4]) for r in rows)
if wrong:
    sys.exit("children.sh: %d wrong elements" % wrong)
ns = sorted({int(r[0]) for r in rows})
print("%6s %10s %12s %12s %12s" % ("ranks", "bytes", "yaml(us)", "child(us)", "child/yaml"))
for n in ns:
    sizes = sorted({int(r[2]) for r in rows if int(r[0]) == n and r[1] != "split"})
    for b in sizes:
        t = {k: statistics.median(float(r[3]) for r in rows if int(r[0]) == n and r[1] == k and int(r[2]) == b)
             for k in ("yaml", "child")}
        print("%6d %10d %12.2f %12.2f %12.3f" % (n, b, t["yaml"], t["child"], t["child"] / t["yaml"]))
    sp = [float(r[3]) for r in rows if int(r[0]) == n and r[1] == "split"]
    print("%6d   split to first op: median %.1f us (of %d)" % (n, statistics.median(sp), len(sp)))
PY
