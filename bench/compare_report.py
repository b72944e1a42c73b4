#!/usr/bin/python3
"""The report of a bench/compare.sh run, from its raw.txt: results.csv (every
measurement), rusage.csv (every rank's sleeps, preemptions and CPU time per op and
size, where the run has them), table.md (medians over rounds and the ratios, quiet and loaded side by
side, and the issue's targets checked), time.png and busbw.png (one panel per op, pod
count and load; one line per system, the loopback ceiling in busbw).

    compare_report.py OUTDIR

Ratios are taken within a round (the systems ran interleaved) and the median of the
per-round ratios is reported: ratio = the reference's time over coll's (above 1, coll is
faster), with the range of the per-round ratios beside it: on a VM that moves its vCPUs
between host cores a cell's rounds can differ by 2x, and a target missed by less than
that range is told apart from one missed in every round. "steady" = the loaded ratio
over the quiet one (1: load costs coll what it costs the reference); in a run whose loads
are paired (a cell's quiet and loaded figures measured back to back, on the same agents:
the raw header says "loads paired"), the median of the per-round quotients, with their
range, so that a level of the machine that holds for one round weighs on both sides."""
import collections
import csv
import re
import statistics
import sys

out = sys.argv[1]
rows, ceil = [], collections.defaultdict(list)
floors = collections.defaultdict(list)  # (load, where, name) -> p50 us
copy_mean = collections.defaultdict(list)  # load -> mean us of coll-floors' copy round
rus = []  # every rank's #rusage line: where its ops' time went
header = []
rnd = load = pods = op = sysname = probe = None
for line in open(out + "/raw.txt"):
    m = re.match(r"#probe shm_spin_us (\S+)", line)
    if m:  # where the next run started: the vCPUs' cache-line round trip
        probe = float(m.group(1))
        continue
    if line.startswith("# ") and rnd is None:
        header.append(line[2:].rstrip())
    m = re.match(r"## round (\d+) load (\S+) ceiling_gbit (\S*)", line)
    if m:
        rnd, load = int(m.group(1)), m.group(2)
        if m.group(3):
            ceil[load].append(float(m.group(3)) / 8)  # GB/s
        continue
    m = re.match(r"#floor (\S+) floor (\S+) .*p50_us=(\S+)", line)
    if m:
        floors[(load, m.group(1), m.group(2))].append(float(m.group(3)))
        m2 = re.search(r"mean_us=(\S+)", line)
        if m2 and m.group(2) == "copy":  # a load that comes and goes: the mean counts
            copy_mean[load].append(float(m2.group(1)))
        continue
    m = re.match(r"### pods (\d+) op (\S+) system (\S+)", line)
    if m:
        pods, op, sysname = int(m.group(1)), m.group(2), m.group(3)
        continue
    m = re.match(r"#rusage (\S+) rank (\d+) bytes (\d+) ops (\d+) sleeps/op (\S+) "
                 r"preempted/op (\S+) cpu_us/op (\S+)(?: faults/op (\S+))?", line)
    if m and pods:
        rus.append(dict(round=rnd, load=load, pods=pods, op=op, system=m.group(1),
                        rank=int(m.group(2)), bytes=int(m.group(3)), ops=int(m.group(4)),
                        sleeps=float(m.group(5)), preempted=float(m.group(6)),
                        cpu_us=float(m.group(7)),
                        faults=float(m.group(8)) if m.group(8) else None))
        continue
    f = line.split()
    if sysname and len(f) >= 5 and f[0].isdigit() and not line.startswith("#"):
        wrong = int(f[5]) if sysname == "coll" and len(f) > 5 else 0
        rows.append(dict(round=rnd, load=load, pods=pods, op=op, system=sysname,
                         bytes=int(f[0]), time_us=float(f[2]), busbw=float(f[4]), wrong=wrong,
                         probe_us=probe))
        probe = None

with open(out + "/results.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["round"])
    w.writeheader()
    w.writerows(rows)

if rus:
    with open(out + "/rusage.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rus[0]))
        w.writeheader()
        w.writerows(rus)

by = collections.defaultdict(dict)  # (load, pods, op, bytes, system) -> {round: row}
for r in rows:
    by[(r["load"], r["pods"], r["op"], r["bytes"], r["system"])][r["round"]] = r
loads = sorted({r["load"] for r in rows}, key=lambda x: x != "quiet")
podss = sorted({r["pods"] for r in rows})
ops = list(dict.fromkeys(r["op"] for r in rows))
sizes = sorted({r["bytes"] for r in rows})
systems = list(dict.fromkeys(r["system"] for r in rows))
refs = [s for s in systems if s != "coll"]
paired = any(h.startswith("loads paired") for h in header)


def med_time(load, pods, op, b, s):
    d = by.get((load, pods, op, b, s))
    return statistics.median(x["time_us"] for x in d.values()) if d else None


def ratio(load, pods, op, b, ref):
    """Median over rounds of ref time / coll time, and the per-round values."""
    c, m = by.get((load, pods, op, b, "coll")), by.get((load, pods, op, b, ref))
    if not c or not m:
        return None, []
    rs = [m[k]["time_us"] / c[k]["time_us"] for k in sorted(c) if k in m and c[k]["time_us"] > 0]
    return (statistics.median(rs) if rs else None), rs


def steady(pods, op, b, ref):
    """Loaded ratio over quiet ratio: per round where the loads are paired (the median of
    the quotients and their values), else of the medians (and no values)."""
    q, qs = ratio(loads[0], pods, op, b, ref)
    l, ls = ratio(loads[1], pods, op, b, ref)
    if not q or not l:
        return None, []
    if not paired:
        return l / q, []
    per = []
    for k in sorted(by.get((loads[0], pods, op, b, "coll"), {})):
        rq = [by.get((ld, pods, op, b, s), {}).get(k) for ld in loads for s in ("coll", ref)]
        if all(x and x["time_us"] > 0 for x in rq):
            per.append((rq[3]["time_us"] / rq[2]["time_us"]) / (rq[1]["time_us"] / rq[0]["time_us"]))
    return (statistics.median(per) if per else None), per


ru_by = collections.defaultdict(lambda: collections.defaultdict(list))
for x in rus:
    ru_by[(x["load"], x["pods"], x["op"], x["bytes"], x["system"])][x["round"]].append(x)


def ru_med(key, field):
    per_round = [statistics.mean(f) for f in
                 ([x[field] for x in v if x[field] is not None] for v in ru_by[key].values()) if f]
    return statistics.median(per_round) if per_round else None


def faults_note(pods, op, b, ref):
    """Page faults per op and rank of coll and ref, quiet, where the raw has them."""
    f = [ru_med((loads[0], pods, op, b, x), "faults") for x in ("coll", ref)]
    if f[0] is None or f[1] is None:
        return ""
    return f"; page faults per op and rank, quiet: coll {f[0]:.1f}, {ref} {f[1]:.1f}"


probes = [r["probe_us"] for r in rows if r["probe_us"] is not None]
far_us = 2.5 * min(probes) if probes else None  # a run that started in the far place


def far_note(pods, op, b, ref):
    """How many of a cell's runs started with the vCPUs far apart, per system and load."""
    if far_us is None:
        return ""
    parts = []
    for s in ("coll", ref):
        for ld in loads:
            d = by.get((ld, pods, op, b, s), {})
            k = [x["probe_us"] > far_us for x in d.values() if x["probe_us"] is not None]
            parts.append(f"{s} {ld} {sum(k)}/{len(k)}")
    return "; runs started far: " + ", ".join(parts)


def fmt_size(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def fmt_r(r, rs):
    """A median ratio with the range of its rounds: 1.12 (0.95-1.30)."""
    if r is None:
        return "-"
    return f"{r:.2f} ({min(rs):.2f}-{max(rs):.2f})" if len(rs) > 1 else f"{r:.2f}"


def rounds_note(rs, target):
    """How many rounds missed target, for a miss's line."""
    n = sum(1 for x in rs if x < target)
    return f"; {n} of {len(rs)} rounds below {target:g}" if len(rs) > 1 else ""


def small_floor(load, op, ref):
    """What an 8 B op between two pods costs at the least over TCP, for a miss's line:
    coll runs it in the application (direct ops), so its floor is the bare socket's, the
    two_cpus floors of this run: for broadcast a stream of one send per op (tcp_stream:
    a root that sends each op as it is submitted, to a reader that lags; and tcp_feed,
    to one that keeps up, where the run has it), for the others one 8-byte exchange
    (tcp_swap). Runs before tcp_stream existed: the floor then, the reference plus one
    one-CPU hand-off (the agent path's)."""
    c, m = med_time(load, 2, op, 8, "coll"), med_time(load, 2, op, 8, ref)
    if c is None or m is None:
        return ""
    if (load, "two_cpus", "tcp_stream") in floors:  # a run with direct ops' floors
        name = "tcp_stream" if op == "broadcast" else "tcp_swap"
        f = statistics.median(floors[(load, "two_cpus", name)])
        line = (f"; floor two_cpus {name} {f:.1f} µs: coll {c:.1f} µs ({c / f:.2f}x it), "
                f"{ref} {m:.1f} µs ({m / f:.2f}x it)")
        if op == "broadcast" and (load, "two_cpus", "tcp_feed") in floors:
            k = statistics.median(floors[(load, "two_cpus", "tcp_feed")])
            line += (f"; with a reader that keeps up, as coll's does (tcp_feed), {k:.1f} µs: "
                     f"coll {c / k:.2f}x it")
        return line
    for name in ("epoll", "eventfd"):
        v = floors.get((load, "one_cpu", name))
        if v:
            break
    else:
        return ""
    h = statistics.median(v)
    f = m + h
    return (f"; floor {ref} {m:.1f} + one-CPU hand-off ({name}) {h:.1f} = {f:.1f} µs, "
            f"coll {c:.1f} µs ({c / f:.2f}x the floor)")


def added(pods, op, b, s):
    """What the load added to an op's time: the loaded median less the quiet one (µs)."""
    q, l = med_time(loads[0], pods, op, b, s), med_time(loads[1], pods, op, b, s)
    return None if q is None or l is None else l - q


def fmt_add(t):
    return "-" if t is None else f"{t:+.1f} µs" if abs(t) < 100 else f"{t:+.0f} µs"


def fmt_t(t):
    return "-" if t is None else (f"{t:.1f}" if t < 100 else f"{t:.0f}")


lines = ["# Host path: coll against " + ", ".join(refs), ""]
lines += ["    " + h for h in header] + [""]
for load in loads:
    if ceil[load]:
        lines.append(f"Loopback ceiling ({load}, iperf3 one stream, per round): " +
                     ", ".join(f"{x:.2f}" for x in ceil[load]) + " GB/s")
for load in loads:
    fl = {k[1] + " " + k[2]: statistics.median(v) for k, v in floors.items() if k[0] == load}
    if fl:
        lines.append(f"Floors ({load}, coll-floors p50, median of rounds): " +
                     ", ".join(f"{k} {v:.2f} µs" for k, v in sorted(fl.items())))
for load in loads:  # the bare two-pod exchange: its level changes per connection, so per round
    bulk = {k[2]: v for k, v in floors.items() if k[0] == load and k[2].startswith("tcp_swap_")}
    for name, v in sorted(bulk.items()):
        lines.append(f"Bare exchange ({load}, coll-floors {name}: two processes on two CPUs "
                     f"swap {name[9:-1]} KiB each way over a fresh loopback connection, p50 per "
                     f"round): " + ", ".join(f"{x:.1f}" for x in v) + " µs")
if far_us is not None:
    for load in loads:
        v = [r["probe_us"] for r in rows if r["load"] == load and r["probe_us"] is not None]
        if v:
            lines.append(f"Placement ({load}, coll-floors -x before every run: one cache line's "
                         f"round trip between the two CPUs): {min(v):.2f}-{max(v):.2f} µs; "
                         f"{sum(x > far_us for x in v)} of {len(v)} runs started far (above "
                         f"{far_us:.2f} µs: 2.5x the run's lowest)")
if far_us is not None:
    # what the far placement costs each system: per cell (pods, op, size, load) with runs
    # that started near and runs that started far, the far runs' median time over the near
    # runs'; the median of those over the cells of a pod count and size
    slow = collections.defaultdict(list)
    for (load, pods, op, b, s), d in by.items():
        near = [x["time_us"] for x in d.values() if x["probe_us"] is not None and x["probe_us"] <= far_us]
        far = [x["time_us"] for x in d.values() if x["probe_us"] is not None and x["probe_us"] > far_us]
        if near and far:
            slow[(pods, s, b)].append(statistics.median(far) / statistics.median(near))
    for pods in podss:
        for s in systems:
            v = [f"{fmt_size(b)} {statistics.median(slow[(pods, s, b)]):.2f}x"
                 for b in sizes if slow.get((pods, s, b))]
            if v:
                lines.append(f"Far over near ({pods} pods, {s}: a cell's far runs' median time over "
                             f"its near runs', median over the cells of a size): " + ", ".join(v))
keep_copy = None
if len(loads) == 2 and copy_mean[loads[0]] and copy_mean[loads[1]]:
    cq, cl = statistics.median(copy_mean[loads[0]]), statistics.median(copy_mean[loads[1]])
    keep_copy = cq / cl
    lines.append(f"CPU-bound floor (coll-floors copy: both CPUs copy 2 MiB in step, mean, median "
                 f"of rounds): {cq:.1f} µs {loads[0]}, {cl:.1f} µs {loads[1]}: work that needs "
                 f"all of its CPU keeps {keep_copy:.2f} of its speed under this load")
lines += ["", "Times are per op in µs, medians over rounds; ratio = reference time / coll time "
          "(median of the per-round ratios, their range in brackets; above 1, coll is faster); "
          "steady = loaded ratio / quiet ratio" +
          (", per round (the loads ran back to back on the same agents), the median and "
           "range of the rounds." if paired else "."), ""]
bad, bound = [], []
for ref in refs:
    for pods in podss:
        lines.append(f"## {pods} pods, against {ref}")
        lines.append("")
        cols = ["op", "size"]
        for load in loads:
            cols += [f"coll µs {load}", f"{ref} µs {load}", f"ratio {load}"]
        if len(loads) == 2:
            cols += ["steady"]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for op in ops:
            for b in sizes:
                cells, rq = [op, fmt_size(b)], {}
                for load in loads:
                    r, rs = ratio(load, pods, op, b, ref)
                    rq[load] = r
                    cells += [fmt_t(med_time(load, pods, op, b, "coll")),
                              fmt_t(med_time(load, pods, op, b, ref)), fmt_r(r, rs)]
                    if r is None:
                        continue
                    if b >= 32768 and r < 1:
                        bad.append(f"{pods} pods {op} {fmt_size(b)} {load}: {r:.2f} against {ref}"
                                   f"{rounds_note(rs, 1)}")
                    if op == "reduce_scatter" and b >= 8 << 20 and r < 2:
                        bad.append(f"{pods} pods reduce_scatter {fmt_size(b)} {load}: {r:.2f}, "
                                   f"not 2x {ref}{rounds_note(rs, 2)}")
                    if b == 8 and pods == 2 and r < 1:
                        bad.append(f"2 pods {op} 8 B {load}: {r:.2f} against {ref}"
                                   f"{rounds_note(rs, 1)}{small_floor(load, op, ref)}")
                if len(loads) == 2:
                    q, l = rq.get(loads[0]), rq.get(loads[1])
                    st, sts = steady(pods, op, b, ref)
                    cells.append("-" if st is None else fmt_r(st, sts))
                    if st is not None and st < 0.90:
                        # what each keeps of its quiet speed, beside what CPU-bound work keeps
                        keep = [med_time(loads[0], pods, op, b, x) /
                                med_time(loads[1], pods, op, b, x) for x in ("coll", ref)]
                        floor = "" if keep_copy is None else f", CPU-bound work {keep_copy:.2f}"
                        add = [added(pods, op, b, x) for x in ("coll", ref)]
                        line = (f"{pods} pods {op} {fmt_size(b)}: loaded ratio {l:.2f} vs "
                                f"quiet {q:.2f} against {ref} (steady {st:.2f}"
                                f"{rounds_note(sts, 0.9)}{far_note(pods, op, b, ref)}; speed kept "
                                f"under load: coll {keep[0]:.2f}, {ref} {keep[1]:.2f}{floor}; "
                                f"time the load added per op: coll {fmt_add(add[0])}, "
                                f"{ref} {fmt_add(add[1])}{faults_note(pods, op, b, ref)})")
                        # coll lost no more than work that needs all of its CPU: it is
                        # CPU-bound, and the load takes what it takes from any such work
                        # (the reference, slower, waited more than it worked)
                        if keep_copy is not None and keep[0] >= 0.95 * keep_copy and r >= 1:
                            bound.append(line)
                        else:
                            bad.append(line)
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
# Where a small op's time went: per system and load, the ranks' mean per op of CPU time,
# sleeps (voluntary switches) and preemptions (involuntary ones), medians over rounds;
# off-CPU = the op's time less the CPU time: what the rank spent neither running nor
# (mostly, with few sleeps) asleep by choice, i.e. waiting for a CPU the load held
small = [b for b in sizes if b <= 32768]
if rus and small:
    lines += ["## Where a small op's time went", "",
              "Per rank and op, mean over ranks, median over rounds: the op's time (rank 0's "
              "loop), CPU time, off-CPU (time less CPU: waiting to run or asleep), sleeps "
              "(voluntary switches: waits in poll, epoll or a futex) and preemptions "
              "(involuntary: a yield, or the CPU given to another task); from the ranks' "
              "getrusage around each timed loop (BENCH_RUSAGE).", "",
              "| pods | op | size | load | system | µs/op | CPU µs/op | off-CPU µs/op | "
              "sleeps/op | preempted/op |", "|---|---|---|---|---|---|---|---|---|---|"]
    for pods in podss:
        for op in ops:
            for b in small:
                for load in loads:
                    for sname in systems:
                        key = (load, pods, op, b, sname)
                        t, cpu = med_time(load, pods, op, b, sname), ru_med(key, "cpu_us")
                        if t is None or cpu is None:
                            continue
                        lines.append(f"| {pods} | {op} | {fmt_size(b)} | {load} | {sname} | "
                                     f"{t:.2f} | {cpu:.2f} | {t - cpu:.2f} | "
                                     f"{ru_med(key, 'sleeps'):.3f} | "
                                     f"{ru_med(key, 'preempted'):.4f} |")
    lines.append("")
big = [b for b in sizes if b >= 262144]
if big and any(x["faults"] is not None for x in rus):
    lines += ["## Page faults of a large op", "",
              "Minor page faults per op and rank (memory an op takes fresh: a system that "
              "allocates its temporary buffers per call faults on every op, which some VMs "
              "charge dearly for), mean over ranks, median over rounds, quiet / loaded.", "",
              "| pods | op | size | " + " | ".join(systems) + " |",
              "|---|---|---|" + "---|" * len(systems)]
    for pods in podss:
        for op in ops:
            for b in big:
                cells = []
                for sname in systems:
                    f = [ru_med((ld, pods, op, b, sname), "faults") for ld in loads]
                    cells.append(" / ".join("-" if x is None else f"{x:.1f}" for x in f))
                lines.append(f"| {pods} | {op} | {fmt_size(b)} | " + " | ".join(cells) + " |")
    lines.append("")
wrong = [r for r in rows if r["wrong"]]
lines.append("## Targets")
lines.append("")
lines.append("Checked: coll at or ahead in every cell of 32 KiB and above; reduce_scatter at "
             "8 MiB and above at least 2x; no loaded ratio more than 10% below its quiet one "
             "(load costs coll at most 10% more than it costs the reference; where it costs "
             "the reference more, steady is above 1); 8 B between two pods no slower.")
lines.append("")
lines += [f"- missed: {x}" for x in bad] or ["- all met"]
if bound:
    lines += ["", "Steady misses at the CPU-bound floor (coll kept at least 0.95 of what "
              "CPU-bound work keeps under this load, and is ahead loaded: no waiting policy "
              "gives a CPU-bound op more of a shared CPU):", ""]
    lines += [f"- at the floor: {x}" for x in bound]
if len(loads) == 2:
    # steady is a ratio of ratios: where coll is k times faster, it holds only if the load
    # adds at most 1/k of the reference's added time. The time itself, beside it:
    for ref in refs:
        for pods in podss:
            more = []
            n = 0
            for op in ops:
                for b in sizes:
                    a, m = added(pods, op, b, "coll"), added(pods, op, b, ref)
                    if a is None or m is None:
                        continue
                    n += 1
                    if a > m:
                        more.append(f"{op} {fmt_size(b)} ({fmt_add(a)} vs {fmt_add(m)})")
            if n:
                lines += ["", f"Time the load added per op, {pods} pods (loaded median less "
                          f"quiet): coll's at most {ref}'s in {n - len(more)} of {n} cells"
                          + (f"; more in {', '.join(more)}" if more else "")]
if wrong:
    lines.append(f"- WRONG RESULTS in {len(wrong)} coll measurements")
open(out + "/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("no matplotlib (Debian: python3-matplotlib): no plots")
    sys.exit(0)
panels = [(p, l) for p in podss for l in loads]
colors = {"coll": "tab:blue", "mpi": "tab:orange", "gloo": "tab:green"}
direct = next((h.split("COLL_DIRECT=")[1].split()[0] for h in header if "COLL_DIRECT=" in h), "")
names = {"coll": "coll (agents" + (f", COLL_DIRECT={direct}" if direct else "") + ")",
         "mpi": "OpenMPI TCP", "gloo": "Gloo"}
for metric, ylabel in (("time_us", "time per op (µs)"), ("busbw", "busbw (GB/s)")):
    fig, axes = plt.subplots(len(ops), len(panels), figsize=(4.2 * len(panels), 3.2 * len(ops)),
                             squeeze=False, sharex=True)
    for i, op in enumerate(ops):
        for j, (pods, load) in enumerate(panels):
            ax = axes[i][j]
            for s in systems:
                xs, ys, lo, hi = [], [], [], []
                for b in sizes:
                    d = by.get((load, pods, op, b, s))
                    if not d:
                        continue
                    v = [x[metric] for x in d.values()]
                    xs.append(b)
                    ys.append(statistics.median(v))
                    lo.append(ys[-1] - min(v))
                    hi.append(max(v) - ys[-1])
                if xs:
                    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ms=3, capsize=2,
                                color=colors.get(s), label=names.get(s, s))
            if metric == "busbw" and ceil[load]:
                ax.axhline(statistics.median(ceil[load]), color="grey", ls="--", lw=1,
                           label="loopback ceiling")
            ax.set_xscale("log", base=2)
            if metric == "time_us":
                ax.set_yscale("log")
            ax.set_title(f"{op}, {pods} pods, {load}", fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(ylabel)
            if i == len(ops) - 1:
                ax.set_xlabel("bytes")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("coll vs " + ", ".join(names.get(r, r) for r in refs) +
                 " (median of rounds; bars: min-max)", fontsize=11)
    fig.tight_layout()
    fig.savefig(f"{out}/{'time' if metric == 'time_us' else 'busbw'}.png", dpi=80)
print(f"wrote {out}/results.csv, {'rusage.csv, ' if rus else ''}table.md, time.png, busbw.png")
