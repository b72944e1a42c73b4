#!/usr/bin/env bash
# The house has no circles and no source file over 700 lines (tools/structure.py), and the
# tool itself sees a circle when there is one: two files that call each other, compiled
# here into a build tree of their own; and the small op the engine runs between pods never
# enters the rendezvous, the connection set-up or p2p (tools/op_path.py).
# run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tool="$src/tools/structure.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/CMakeFiles/coll.dir/x" "$tmp/CMakeFiles/coll_agent_core.dir/x"
printf 'int b_f(void);\nint a_f(void) { return b_f() + 1; }\n' > "$tmp/a.c"
printf 'int a_f(void);\nint b_f(void) { return 2; }\nint b_g(void) { return a_f(); }\n' > "$tmp/b.c"
printf 'int c_f(void) { return 3; }\n' > "$tmp/c.c"
cc -c "$tmp/a.c" -o "$tmp/CMakeFiles/coll.dir/x/a.c.o"
cc -c "$tmp/b.c" -o "$tmp/CMakeFiles/coll.dir/x/b.c.o"
cc -c "$tmp/c.c" -o "$tmp/CMakeFiles/coll_agent_core.dir/x/c.c.o"
if out=$(python3 "$tool" "$tmp" --strict); then
    echo "FAIL: the tool passed a build where a.c and b.c call each other:"; echo "$out"; exit 1
fi
grep -q "circle (coll): x/a.c x/b.c" <<<"$out" || { echo "FAIL: circle not named:"; echo "$out"; exit 1; }
echo "ok: the tool names a circle of two files"
python3 "$tool" "$build" --strict
# the small op the engine runs between pods stays out of the rendezvous, the connection
# set-up and the sends and receives;
python3 "$src/tools/op_path.py" net_inline --check
# the engine's turn at sends and receives between pods stays out of the rendezvous, the
# epochs' ends and the connection set-up (p2p.c notes an end there for the net thread)
for f in net_p2p_post net_p2p_watch; do
    python3 "$src/tools/op_path.py" "$f" --check \
        --avoid agent/rendezvous.c,agent/net_epoch.c,agent/dataconn.c
done
