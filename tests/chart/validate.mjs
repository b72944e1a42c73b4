// Validate rendered Kubernetes objects against the API's schemas, and refuse fields the
// schemas do not know (which the schemas' validators accept silently).
//
// Usage: node validate.mjs MODELS_DIR FILE.json...   (each file: a JSON array of objects)
// MODELS_DIR holds node_modules with kubernetes-models 5.x (core and resource.k8s.io/v1
// included) and @kubernetes-models/prometheus-operator. Prints one line per object; exits
// 1 when any object fails.
//
// Unknown fields: the validators are compiled JSON schemas that read each property the
// schema names (`data.spec`, `data.replicas`...) and enumerate the keys of maps. Each
// object is handed to them behind a Proxy that records the reads; a key of an object the
// validator looked into but never read is a field the schema does not have. An object
// the validator never looked into is free-form (a map of strings, a raw extension) and is
// not judged. For the workload CRDs without a published model (JobSet, LeaderWorkerSet,
// PyTorchJob), the envelope is checked against the fields listed below, from their API
// references, and the pod templates inside against the core schemas.
import path from "node:path";
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [models, ...files] = process.argv.slice(2);
if (!models || files.length === 0) {
    console.error("usage: node validate.mjs MODELS_DIR FILE.json...");
    process.exit(2);
}
const nm = path.join(models, "node_modules");
const load = async (pkg, name) =>
    (await import(pathToFileURL(path.join(nm, pkg, "_schemas", name + ".js")).href)).validate;
const core = (name) => load("kubernetes-models", name);

const SCHEMAS = {
    "v1/ConfigMap": () => core("IoK8sApiCoreV1ConfigMap"),
    "v1/Service": () => core("IoK8sApiCoreV1Service"),
    "v1/Secret": () => core("IoK8sApiCoreV1Secret"),
    "v1/Pod": () => core("IoK8sApiCoreV1Pod"),
    "apps/v1/StatefulSet": () => core("IoK8sApiAppsV1StatefulSet"),
    "batch/v1/Job": () => core("IoK8sApiBatchV1Job"),
    "policy/v1/PodDisruptionBudget": () => core("IoK8sApiPolicyV1PodDisruptionBudget"),
    "networking.k8s.io/v1/NetworkPolicy": () => core("IoK8sApiNetworkingV1NetworkPolicy"),
    "resource.k8s.io/v1/ResourceClaimTemplate": () =>
        core("IoK8sApiResourceV1ResourceClaimTemplate"),
    "monitoring.coreos.com/v1/PodMonitor": () =>
        load("@kubernetes-models/prometheus-operator",
             "ComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoringV1PodMonitor"),
};

// The CRDs' envelopes: a tree of the fields each level may have; "pod" and "job" mark a
// core PodTemplateSpec or JobTemplateSpec, "*" any key (a map), true a leaf.
const META = { name: true, namespace: true, labels: true, annotations: true };
const ENVELOPES = {
    // jobset.x-k8s.io/v1alpha2 JobSetSpec
    "jobset.x-k8s.io/v1alpha2/JobSet": {
        apiVersion: true, kind: true, metadata: META,
        spec: {
            replicatedJobs: [{ name: true, groupName: true, replicas: true, dependsOn: true,
                               template: "job" }],
            network: { enableDNSHostnames: true, subdomain: true, publishNotReadyAddresses: true },
            successPolicy: { operator: true, targetReplicatedJobs: true },
            failurePolicy: { maxRestarts: true, restartStrategy: true, rules: true },
            startupPolicy: { startupPolicyOrder: true },
            suspend: true, coordinator: true, managedBy: true,
            ttlSecondsAfterFinished: true,
        },
    },
    // leaderworkerset.x-k8s.io/v1 LeaderWorkerSetSpec
    "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet": {
        apiVersion: true, kind: true, metadata: META,
        spec: {
            replicas: true, startupPolicy: true, networkConfig: { subdomainPolicy: true },
            rolloutStrategy: true,
            leaderWorkerTemplate: { size: true, restartPolicy: true, subGroupPolicy: true,
                                    leaderTemplate: "pod", workerTemplate: "pod",
                                    resizePolicy: true, volumeClaimTemplates: true },
        },
    },
    // kubeflow.org/v1 PyTorchJobSpec
    "kubeflow.org/v1/PyTorchJob": {
        apiVersion: true, kind: true, metadata: META,
        spec: {
            runPolicy: { cleanPodPolicy: true, ttlSecondsAfterFinished: true,
                         activeDeadlineSeconds: true, backoffLimit: true,
                         schedulingPolicy: true, suspend: true, managedBy: true },
            elasticPolicy: true, nprocPerNode: true,
            pytorchReplicaSpecs: { "*": { replicas: true, restartPolicy: true,
                                          template: "pod" } },
        },
    },
};

// Wrap value so that every read and key enumeration is recorded in `seen`.
function track(value, where, seen) {
    if (value === null || typeof value !== "object") return value;
    const rec = { where, value, read: new Set(), listed: false };
    seen.push(rec);
    const kids = new Map();
    return new Proxy(value, {
        get(t, k, r) {
            const v = Reflect.get(t, k, r);
            if (typeof k !== "string") return v;
            rec.read.add(k);
            if (v === null || typeof v !== "object") return v;
            if (!kids.has(k)) kids.set(k, track(v, `${where}/${k}`, seen));
            return kids.get(k);
        },
        has(t, k) {
            if (typeof k === "string") rec.read.add(k);
            return Reflect.has(t, k);
        },
        ownKeys(t) {
            rec.listed = true;
            return Reflect.ownKeys(t);
        },
    });
}

// Run a compiled validator over obj; returns the list of problems, unknown fields included.
function check(validate, obj, where) {
    const seen = [];
    const ok = validate(track(obj, where, seen));
    const problems = ok ? [] : validate.errors.map(
        (e) => `${where}${e.instancePath}: ${e.message || e.keyword} ${JSON.stringify(e.params)}`);
    for (const r of seen) {
        if (Array.isArray(r.value) || r.listed || r.read.size === 0) continue;
        for (const k of Object.keys(r.value))
            if (!r.read.has(k)) problems.push(`${r.where}/${k}: not a field of the schema`);
    }
    return problems;
}

async function envelope(tree, obj, where, out) {
    if (tree === true) return;
    if (tree === "pod" || tree === "job") {
        const v = await core(tree === "pod" ? "IoK8sApiCoreV1PodTemplateSpec"
                                            : "IoK8sApiBatchV1JobTemplateSpec");
        out.push(...check(v, obj, where));
        return;
    }
    if (Array.isArray(tree)) {
        if (!Array.isArray(obj)) return out.push(`${where}: expected a list`);
        for (let i = 0; i < obj.length; i++) await envelope(tree[0], obj[i], `${where}/${i}`, out);
        return;
    }
    if (obj === null || typeof obj !== "object" || Array.isArray(obj))
        return out.push(`${where}: expected an object`);
    for (const [k, v] of Object.entries(obj)) {
        const sub = tree["*"] ?? tree[k];
        if (sub === undefined) out.push(`${where}/${k}: not a field of the schema`);
        else await envelope(sub, v, `${where}/${k}`, out);
    }
}

let failed = 0, count = 0;
for (const file of files) {
    for (const obj of JSON.parse(readFileSync(file, "utf8"))) {
        const key = `${obj.apiVersion}/${obj.kind}`;
        const name = `${path.basename(file, ".json")}: ${obj.kind} ${obj.metadata?.name}`;
        let problems = [];
        if (SCHEMAS[key]) problems = check(await SCHEMAS[key](), obj, "");
        else if (ENVELOPES[key]) await envelope(ENVELOPES[key], obj, "", problems);
        else problems = [`no schema for ${key}`];
        count++;
        if (problems.length) {
            failed++;
            console.log(`FAIL ${name}`);
            for (const p of problems.slice(0, 20)) console.log(`    ${p}`);
        } else {
            console.log(`ok   ${name} (${SCHEMAS[key] ? "API schema" : "CRD fields + core templates"})`);
        }
    }
}
console.log(`${count - failed} of ${count} objects valid`);
process.exit(failed ? 1 : 0);
