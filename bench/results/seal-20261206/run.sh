#!/usr/bin/env bash
# A/B of security.data at 8 B, 2 MiB, 64 MiB between two pods (same build both sides)
cd "$(dirname "$0")/../../.."
B=build-test
for load in 0 1; do
for mode in mac encrypt; do
  for spec in "8 2000 5" "2097152 100 5" "67108864 5 5"; do
    set -- $spec
    echo "=== load=$load mode=$mode size=$1 iters=$2 rounds=$3"
    LOAD=$load PIN=1 EXTRA_B=$'security:\n  data: '$mode bench/ab.sh $B $B 2 allreduce $1 $1 $2 $3 2>&1 | tail -3
  done
done
done
