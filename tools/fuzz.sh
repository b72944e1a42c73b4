#!/usr/bin/env bash
# Build the libFuzzer harnesses (clang, ASan + UBSan) and run each for SECONDS (default
# 20) from the checked-in seeds; a crash fails the run and leaves its input in
# build-fuzz/findings/. A long run: FUZZ_SECONDS=3600 tools/fuzz.sh. New inputs that found
# coverage stay in build-fuzz/corpus/ (copy the useful ones into tests/fuzz/corpus/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-20}
CC=clang cmake -S . -B build-fuzz -DCOLL_SANITIZE=fuzzer -DCOLL_WITH_CUDA=OFF \
    -DCOLL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_wire fuzz_rdv fuzz_config >build-fuzz/build.log 2>&1 ||
    { tail -30 build-fuzz/build.log; exit 1; }
mkdir -p build-fuzz/findings
for t in wire rdv config; do
    mkdir -p "build-fuzz/corpus/$t"
    cp -n tests/fuzz/corpus/"$t"/* "build-fuzz/corpus/$t/" 2>/dev/null || true
    log="build-fuzz/fuzz_$t.log"
    if ! ASAN_OPTIONS=detect_leaks=1 ./build-fuzz/tests/fuzz/fuzz_$t -max_total_time="$secs" \
        -max_len=20000 -artifact_prefix=build-fuzz/findings/ -print_final_stats=1 \
        "build-fuzz/corpus/$t" >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz_$t: FAILED (input in build-fuzz/findings/)"
        exit 1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
    echo "fuzz_$t: ${execs:-?} executions in ${secs} s, coverage ${cov:-?} edges, 0 crashes"
done
