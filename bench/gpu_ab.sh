#!/usr/bin/env bash
# GPU host: build this tree and an older one (BASE_SRC, a source tree: git archive REV),
# run every test here, then the GPU 8 B added latency of both, alternating, 3 rounds.
# Usage: BASE_SRC=DIR OUT=DIR bench/gpu_ab.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
J=16
# the metrics tests' parser, where .deps brought it (python3-prometheus-client, python3-decorator)
d=/opt/deps/usr/lib/python3/dist-packages
[ -d "$d/prometheus_client" ] && export PYTHONPATH=$d${PYTHONPATH:+:$PYTHONPATH}
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$OUT/cfg.log" 2>&1
cmake --build build-gpu -j$J > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
if [ "${SKIP_BASE:-0}" = 0 ]; then
cmake -S "${BASE_SRC:?BASE_SRC: the older source tree}" -B /tmp/base-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$OUT/cfg-base.log" 2>&1
cmake --build /tmp/base-gpu -j$J --target coll-agent coll-gpu-bench > "$OUT/build-base.log" 2>&1 || tail -20 "$OUT/build-base.log"
fi
(cd build-gpu && timeout ${TEST_S:-330} ctest --output-on-failure ${CTEST_ARGS:-} > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?" >> "$OUT/ctest.log")
tail -25 "$OUT/ctest.log"
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
cat > /tmp/gb.yaml <<Y
agent:
  socket: /tmp/gb.sock
groups:
  - {name: gpu, backend: nccl, devices: ["0"]}
Y
for r in 1 2 3; do
  for which in base new; do
    if [ $which = base ]; then B=/tmp/base-gpu; else B=build-gpu; fi
    rm -f /tmp/gb.sock
    $B/coll-agent -c /tmp/gb.yaml > "$OUT/agent-$which-$r.log" 2>&1 &
    ap=$!
    for i in $(seq 50); do [ -S /tmp/gb.sock ] && break; sleep 0.1; done
    echo "round $r $which: $($B/coll-gpu-bench -s /tmp/gb.sock -g gpu -o allreduce -b 8 -e 8 -l 2000 -n 200 -V 1 2>&1 | tail -1)" | tee -a "$OUT/bench.log"
    kill $ap; wait $ap
  done
done
