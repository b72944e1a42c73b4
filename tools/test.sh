#!/usr/bin/env bash
# The whole test suite: install what is missing, then build and run every test three
# times, in a release build, under AddressSanitizer + UndefinedBehaviorSanitizer and under
# ThreadSanitizer (the release build's multi-agent tests once more under a busy loop per
# CPU); then a short run of every fuzzer (tools/fuzz.sh).
# Tests that need what this machine lacks (a GPU, root) say so and skip.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/deps.sh
coll_install_deps clang libclang-rt-14-dev clang-format dnsmasq-base iproute2 python3-prometheus-client curl podman debootstrap openmpi-bin libopenmpi-dev \
    python3-pytest python3-numpy python3-torch python3-pip python3-setuptools python3-wheel
# node and npm install the Kubernetes API schemas the chart test validates against
# (a newer Node.js from elsewhere is used as it is)
command -v npm >/dev/null || coll_install_deps nodejs npm

echo "== format: clang-format (.clang-format) on every C file"
{ git ls-files '*.c' '*.h' 2>/dev/null || find agent libcoll tests tools bench -name '*.[ch]'; } |
    xargs clang-format --dry-run --Werror

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
# the multi-agent tests once more next to other work, as on a busy node: one busy loop
# per CPU at normal priority (they assert nothing that depends on how threads interleave)
echo "== build-test: the multi-agent tests under a busy loop per CPU"
busy=()
# (under set -e a failing command in the trap would become the script's status)
trap '[ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "$jobs"); do (while :; do :; done) & busy+=($!); done
(cd build-test && ctest --output-on-failure --timeout 1800 -R '^test_(multi|robust|ops)$')
kill "${busy[@]}"
wait "${busy[@]}" 2>/dev/null || true
busy=()
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run asan -DCMAKE_BUILD_TYPE=Debug -DCOLL_SANITIZE=address
# libzmq is not instrumented: tests/tsan.supp hides its internals only
TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp second_deadlock_stack=1" \
    run tsan -DCMAKE_BUILD_TYPE=Debug -DCOLL_SANITIZE=thread
echo "== fuzzers: ${FUZZ_SECONDS:-20} s each"
tools/fuzz.sh
echo "all test runs passed"
