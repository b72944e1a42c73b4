#!/usr/bin/env bash
# Print the folder holding the Kubernetes API schemas (npm kubernetes-models 5.x and the
# Prometheus operator's models, pinned in tests/chart/models/package-lock.json), installed
# once with `npm ci` into BUILD_DIR/k8s-models. Exit 77 with the reason when node or npm
# is missing or the registry cannot be reached. Usage: models.sh BUILD_DIR
here=$(cd "$(dirname "$0")" && pwd)
dir=$1/k8s-models
command -v node >/dev/null && command -v npm >/dev/null ||
    { echo "no node and npm to install the Kubernetes API schemas with"; exit 77; }
if ! cmp -s "$here/models/package-lock.json" "$dir/package-lock.json" ||
    [ ! -d "$dir/node_modules/kubernetes-models" ]; then
    rm -rf "$dir" && mkdir -p "$dir" && cp "$here/models/package.json" "$here/models/package-lock.json" "$dir/" ||
        exit 1
    if ! (cd "$dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1); then
        echo "npm ci of the Kubernetes API schemas failed (no registry?): $(tail -3 "$dir/npm.log")"
        rm -rf "$dir/node_modules"
        exit 77
    fi
fi
echo "$dir"
