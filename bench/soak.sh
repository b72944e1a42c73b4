#!/usr/bin/env bash
# The group always comes back: the namespaces harness's soak scenario (tests/k8s/e2e.sh)
# at full length, 100 failures of the coordinator (SIGKILL and a new IP, a silent cut of
# 8 s, a new coordinator whose DNS record comes 10 s late) and of members (SIGKILL and a
# new IP, a silent cut) in random order, 4 pods with checking applications; then the
# times back, per kind of failure. As root (network namespaces, dnsmasq).
# Usage: bench/soak.sh [-b BUILD_DIR] [-n FAILURES] [-d RESULTS_DIR]
set -euo pipefail
build=build n=100 dir=
while getopts b:n:d: o; do
    case $o in
    b) build=$OPTARG ;;
    n) n=$OPTARG ;;
    d) dir=$OPTARG ;;
    *) echo "usage: $0 [-b BUILD_DIR] [-n FAILURES] [-d RESULTS_DIR]" >&2; exit 2 ;;
    esac
done
src=$(cd "$(dirname "$0")/.." && pwd)
dir=${dir:-$src/bench/results/soak-$(date +%Y%m%d-%H%M)}
mkdir -p "$dir"
[ -x "$build/coll-agent" ] && [ -x "$build/tests/k8s_app" ] ||
    { echo "no $build/coll-agent or $build/tests/k8s_app: build first (cmake --build $build)" >&2; exit 2; }
echo "soak: $n failures; results in $dir"
rc=0
COLL_E2E_SOAK=$n COLL_E2E_SOAK_OUT="$dir/soak.tsv" \
    bash "$src/tests/k8s/e2e.sh" "$build/coll-agent" "$build/tests/k8s_app" soak | tee "$dir/run.log" || rc=$?
{
    echo "# soak: $n failures at $(git -C "$src" rev-parse --short HEAD) on $(nproc) CPUs"
    echo
    echo "Time back (ms): from every pod being there with its DNS record to every application's next checked allreduce."
    echo
    echo "| failure | count | median | p90 | max | over 2 s | never |"
    echo "|---|---|---|---|---|---|---|"
    awk -F'\t' 'NR > 1 { k = $2 " " $3; n[k]++; if ($5 == "never") nv[k]++; else { v[k, ++m[k]] = $5; if ($5 > 2000) o[k]++ } }
        END { for (k in n) {
                c = m[k]; for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[k, j] < v[k, i]) { t = v[k, i]; v[k, i] = v[k, j]; v[k, j] = t }
                printf "| %s | %d | %s | %s | %s | %d | %d |\n", k, n[k], c ? v[k, int((c + 1) / 2)] : "-",
                    c ? v[k, int(c * 0.9 + 0.999)] : "-", c ? v[k, c] : "-", o[k], nv[k] } }' "$dir/soak.tsv" | sort
} >"$dir/summary.md"
cat "$dir/summary.md"
exit "$rc"
