#!/usr/bin/env bash
# Render the chart's example workloads (one per kind) into config/examples/kubernetes,
# the manifests docs/kubernetes.md points to. --check: fail if a committed one differs
# from what the chart renders now (test_chart runs that). HELM: the helm to use.
# Usage: tools/render-examples.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
helm=${HELM:-helm}
out=config/examples/kubernetes
check=0
[ "${1:-}" = --check ] && check=1
mkdir -p "$out"
status=0
for pair in statefulset:default indexed-job:indexedjob jobset:jobset \
    leaderworkerset:leaderworkerset pytorchjob:pytorchjob; do
    name=${pair%%:*} values=charts/coll-agent/ci/${pair#*:}-values.yaml
    new=$({
        echo "# helm template train charts/coll-agent -n ml -f $values"
        echo "# (rendered by tools/render-examples.sh; test_chart checks it is current)"
        # the seed helm install makes at random: not in files anyone may apply as they are
        # (an agent refuses an empty seed and says how to make one)
        "$helm" template train charts/coll-agent -n ml -f "$values" |
            sed -E 's|^  seed: [A-Za-z0-9+/=]+$|  seed: "" # helm install makes one; here: head -c 48 /dev/urandom \| base64 -w0 \| base64 -w0|'
    })
    if [ $check = 1 ]; then
        if ! diff -u "$out/$name.yaml" <(echo "$new") >/dev/null 2>&1; then
            echo "$out/$name.yaml is not what the chart renders: run tools/render-examples.sh"
            diff -u "$out/$name.yaml" <(echo "$new") | head -20 || true
            status=1
        fi
    else
        echo "$new" >"$out/$name.yaml"
        echo "wrote $out/$name.yaml"
    fi
done
exit $status
