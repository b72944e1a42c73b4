#!/usr/bin/python3
"""Parse an agent's /metrics text with the Prometheus client's own parser (not a grep)
and check what must hold of any scrape: every family typed, histogram buckets that
never decrease, +Inf equal to _count. Prints the figures the C test asserts on, one
"name value" per line. Usage: check_metrics.py FILE"""
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("SKIP: no prometheus_client for /usr/bin/python3 (Debian: python3-prometheus-client)")
    sys.exit(77)

text = open(sys.argv[1]).read()
families = {f.name: f for f in text_string_to_metric_families(text)}
out = {}


def fail(msg):
    print("invalid metrics: " + msg)
    sys.exit(1)


for name in ("coll_build_info", "coll_ops", "coll_op_duration_seconds", "coll_group_formed",
             "coll_group_epoch", "coll_sessions", "coll_draining", "coll_spin_yield_closed",
             "coll_engine_waits", "coll_ops_in_flight"):
    if name not in families:
        fail("no family " + name)
if families["coll_ops"].type != "counter" or families["coll_op_duration_seconds"].type != "histogram" \
        or families["coll_spin_yield_closed"].type != "counter" \
        or families["coll_engine_waits"].type != "counter" \
        or families["coll_ops_in_flight"].type != "gauge":
    fail("wrong types")
for s in families["coll_ops"].samples:
    if s.name == "coll_ops_total":
        key = "ops_%s_%s_%s" % (s.labels["group"], s.labels["kind"], s.labels["status"])
        out[key] = int(s.value)
for s in families["coll_op_bytes"].samples if "coll_op_bytes" in families else []:
    if s.name == "coll_op_bytes_total":
        out["bytes_%s_%s" % (s.labels["group"], s.labels["kind"])] = int(s.value)
hist = {}
for s in families["coll_op_duration_seconds"].samples:
    g = s.labels["group"]
    h = hist.setdefault(g, {"buckets": [], "count": None, "sum": None})
    if s.name.endswith("_bucket"):
        h["buckets"].append((float(s.labels["le"]), s.value))
    elif s.name.endswith("_count"):
        h["count"] = s.value
    elif s.name.endswith("_sum"):
        h["sum"] = s.value
for g, h in hist.items():
    b = sorted(h["buckets"])
    if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
        fail("buckets of %s decrease" % g)
    if b[-1][0] != float("inf") or b[-1][1] != h["count"]:
        fail("+Inf bucket of %s is not its count" % g)
    out["hist_count_" + g] = int(h["count"])
    out["hist_sum_positive_" + g] = int(h["sum"] > 0)
for s in families["coll_group_formed"].samples:
    out["formed_" + s.labels["group"]] = int(s.value)
for s in families["coll_group_epoch"].samples:
    out["epoch_" + s.labels["group"]] = int(s.value)
for s in families["coll_engine_waits"].samples:
    if s.name == "coll_engine_waits_total":
        out["waits_" + s.labels["ended"]] = int(s.value)
out["draining"] = int(families["coll_draining"].samples[0].value)
out["in_flight"] = int(families["coll_ops_in_flight"].samples[0].value)
for fam, key, label in (("coll_group_members_joined", "joined", None),
                        ("coll_group_formations", "formations", None),
                        ("coll_group_cpu_shared", "cpu_shared", None),
                        ("coll_group_early_bytes", "early_bytes", None),
                        ("coll_ops_path", "path", "path"),
                        ("coll_graph_replays", "graph_replays", None),
                        ("coll_graphs_captured", "graphs_captured", None),
                        ("coll_comms_created", "comms_created", None)):
    for s in families[fam].samples if fam in families else []:
        if s.name.endswith("_created"):
            continue
        k = "%s_%s" % (key, s.labels["group"]) + ("_" + s.labels[label] if label else "")
        out[k] = int(s.value)
if "coll_group_formation_seconds" in families:
    for s in families["coll_group_formation_seconds"].samples:
        out["formation_positive_" + s.labels["group"]] = int(s.value > 0)
for k in sorted(out):
    print(k, out[k])
