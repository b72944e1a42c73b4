#!/usr/bin/env bash
# The whole test suite: install what is missing, then build and run every test twice,
# in a release build and under AddressSanitizer + UndefinedBehaviorSanitizer.
# Tests that need what this machine lacks (a GPU, root) say so and skip.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/deps.sh
coll_install_deps

jobs=$(nproc)
run() { # NAME CMAKE_ARGS...
    local dir="build-$1"; shift
    echo "== $dir: configure and build"
    cmake -S . -B "$dir" -DCOLL_WERROR=ON "$@" >/dev/null
    cmake --build "$dir" -j"$jobs" >/dev/null
    echo "== $dir: test"
    (cd "$dir" && ctest --output-on-failure --timeout 900)
}
run test -DCMAKE_BUILD_TYPE=RelWithDebInfo
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run asan -DCMAKE_BUILD_TYPE=Debug -DCOLL_SANITIZE=address
echo "all test runs passed"
