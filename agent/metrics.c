/*
 * metrics.c: the texts the operational endpoints serve, rendered by the engine thread
 * from what it owns (http.h publishes them): /metrics in the Prometheus text format
 * (0.0.4), /readyz's checks. Names are coll_*, units are base units (seconds, bytes),
 * labels are the group, the op kind and the status: bounded by the config.
 */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "coll/coll.h"
#include "group.h"
#include "http.h"
#include "net.h"
#include "wire.h"

static const char *const status_names[GROUP_STATUS_MAX] = {
    "ok",     "invalid",    "nomem",    "system",      "connect",  "protocol",
    "denied", "not_found",  "busy",     "timeout",     "mismatch", "peer_lost",
    "epoch",  "agent_lost", "shutdown", "unsupported", "limit",    "internal"};

struct out {
    char *p;
    size_t cap, len;
};

static void put(struct out *o, const char *fmt, ...)
{
    if (o->len >= o->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
    if (o->len > o->cap) o->len = o->cap;
}

/* The groups of one config group in depth-first order: the group, then its children made
 * at run time (group_child.c), theirs, ...: each with its own op series, under its own
 * name ("<parent>/<first rank>+<n - 1>"). */
static const struct group *next_of(const struct group *root, const struct group *g)
{
    if (g->children) return g->children;
    for (; g && g != root; g = g->parent)
        if (g->next_child) return g->next_child;
    return NULL;
}

size_t metrics_render(const struct metrics_in *in, char *buf, size_t cap)
{
    struct out o = {.p = buf, .cap = cap};
    put(&o, "# HELP coll_build_info The agent's version.\n# TYPE coll_build_info gauge\n");
    put(&o, "coll_build_info{version=\"%s\"} 1\n", coll_version());
    put(&o,
        "# HELP coll_up_seconds Seconds since the agent started.\n"
        "# TYPE coll_up_seconds gauge\ncoll_up_seconds %.3f\n",
        in->up_s);
    put(&o,
        "# HELP coll_draining 1 while the agent stops (SIGTERM): no new sessions or ops.\n"
        "# TYPE coll_draining gauge\ncoll_draining %d\n",
        in->draining);
    put(&o,
        "# HELP coll_ops_in_flight Ops the agent's sessions submitted to it and that have not "
        "finished (direct ops, run by the applications, not counted).\n"
        "# TYPE coll_ops_in_flight gauge\ncoll_ops_in_flight %u\n",
        in->ops_in_flight);
    put(&o,
        "# HELP coll_sessions Connected application sessions.\n"
        "# TYPE coll_sessions gauge\ncoll_sessions %d\n",
        in->sessions);
    put(&o,
        "# HELP coll_sessions_opened_total Sessions accepted since start.\n"
        "# TYPE coll_sessions_opened_total counter\ncoll_sessions_opened_total %llu\n",
        (unsigned long long)in->sessions_opened);
    put(&o,
        "# HELP coll_spin_yield_closed_total Times the agent's spins stopped yielding for a "
        "while: yields handed the CPU to other work for long (a busy node).\n"
        "# TYPE coll_spin_yield_closed_total counter\ncoll_spin_yield_closed_total %llu\n",
        (unsigned long long)in->yield_closed);
    put(&o,
        "# HELP coll_engine_waits_total The agent engine's waits for work, by how they ended: "
        "work found while it spun, or it slept (an agent sharing its clients' CPU never "
        "spins; agent.spin_us).\n"
        "# TYPE coll_engine_waits_total counter\n"
        "coll_engine_waits_total{ended=\"spin\"} %llu\n"
        "coll_engine_waits_total{ended=\"sleep\"} %llu\n",
        (unsigned long long)in->waits_spun, (unsigned long long)in->waits_slept);
    put(&o,
        "# HELP coll_gpu_buffer_imports Client GPU buffers the agent holds open.\n"
        "# TYPE coll_gpu_buffer_imports gauge\ncoll_gpu_buffer_imports %d\n",
        in->gpu_imports);
    put(&o, "# HELP coll_ops_total Ops finished, by group, kind and status (direct ops: as their "
            "clients count them).\n"
            "# TYPE coll_ops_total counter\n");
    for (int i = 0; i < in->ngroups; i++)
        for (const struct group *g = &in->groups[i]; g; g = next_of(&in->groups[i], g))
            for (int k = 0; k < WIRE_OP_KIND_COUNT; k++)
                for (int st = 0; st < GROUP_STATUS_MAX; st++)
                    if (g->m.ops[k][st] || (st == 0 && k == WIRE_OP_ALLREDUCE))
                        put(&o, "coll_ops_total{group=\"%s\",kind=\"%s\",status=\"%s\"} %llu\n",
                            g->cfg->name, wire_kind_name((unsigned)k), status_names[st],
                            (unsigned long long)g->m.ops[k][st]);
    put(&o, "# HELP coll_op_bytes_total Bytes of the ops that finished well (each participant's "
            "count x element size), by group and kind.\n# TYPE coll_op_bytes_total counter\n");
    for (int i = 0; i < in->ngroups; i++)
        for (const struct group *g = &in->groups[i]; g; g = next_of(&in->groups[i], g))
            for (int k = 0; k < WIRE_OP_KIND_COUNT; k++)
                if (g->m.bytes[k] || k == WIRE_OP_ALLREDUCE)
                    put(&o, "coll_op_bytes_total{group=\"%s\",kind=\"%s\"} %llu\n", g->cfg->name,
                        wire_kind_name((unsigned)k), (unsigned long long)g->m.bytes[k]);
    put(&o, "# HELP coll_op_duration_seconds From an op's submission to its completion.\n"
            "# TYPE coll_op_duration_seconds histogram\n");
    for (int i = 0; i < in->ngroups; i++) {
        for (const struct group *g = &in->groups[i]; g; g = next_of(&in->groups[i], g)) {
            uint64_t cum = 0;
            for (int b = 0; b < GROUP_HIST_BUCKETS; b++) {
                cum += g->m.hist[b];
                put(&o, "coll_op_duration_seconds_bucket{group=\"%s\",le=\"%g\"} %llu\n",
                    g->cfg->name, group_hist_bounds[b], (unsigned long long)cum);
            }
            cum += g->m.hist[GROUP_HIST_BUCKETS];
            put(&o, "coll_op_duration_seconds_bucket{group=\"%s\",le=\"+Inf\"} %llu\n",
                g->cfg->name, (unsigned long long)cum);
            put(&o, "coll_op_duration_seconds_sum{group=\"%s\"} %.9f\n", g->cfg->name, g->m.sum_s);
            put(&o, "coll_op_duration_seconds_count{group=\"%s\"} %llu\n", g->cfg->name,
                (unsigned long long)g->m.count);
        }
    }
    /* two families from group_state, one family at a time */
    for (int f = 0; f < 2; f++) {
        put(&o, f == 0 ? "# HELP coll_group_formed 1 when the group stands on every one of "
                         "its pods.\n# TYPE coll_group_formed gauge\n"
                       : "# HELP coll_group_epoch The group's epoch across its pods (one pod: "
                         "the agent's).\n# TYPE coll_group_epoch gauge\n");
        for (int i = 0; i < in->ngroups; i++) {
            int formed = 0;
            uint32_t epoch = 0;
            char detail[8];
            group_state(&in->groups[i], &formed, &epoch, detail, sizeof(detail));
            if (f == 0)
                put(&o, "coll_group_formed{group=\"%s\"} %d\n", in->groups[i].cfg->name,
                    in->groups[i].be ? formed : 0);
            else
                put(&o, "coll_group_epoch{group=\"%s\"} %u\n", in->groups[i].cfg->name, epoch);
        }
    }
    put(&o, "# HELP coll_group_pods Pods the group is declared with.\n"
            "# TYPE coll_group_pods gauge\n");
    for (int i = 0; i < in->ngroups; i++)
        put(&o, "coll_group_pods{group=\"%s\"} %d\n", in->groups[i].cfg->name, in->groups[i].nodes);
    put(&o, "# HELP coll_group_members_joined Pods the coordinator has heard JOIN from for the "
            "epoch it forms (on the coordinator only).\n# TYPE coll_group_members_joined gauge\n");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        struct net_group_stats ns;
        net_group_stats(g->net, g->index, &ns);
        if (g->nodes > 1 && ns.joined >= 0)
            put(&o, "coll_group_members_joined{group=\"%s\"} %d\n", g->cfg->name, ns.joined);
    }
    /* one family at a time: the text format wants each family's samples together */
    static const char *const net_fams[4][3] = {
        {"coll_group_rendezvous_seconds", "gauge",
         "The last epoch's rendezvous: from the end of the one before (or the start) to COMMIT."},
        {"coll_group_formation_seconds", "gauge",
         "The last epoch's formation: COMMIT to every data connection up."},
        {"coll_group_formations_total", "counter", "Epochs formed across pods."},
        {"coll_group_early_bytes", "gauge",
         "Bytes held for sends from other pods that came before their receives (each "
         "charged its payload and 128; a send over 1 MiB is held as its ask alone)."}};
    for (int f = 0; f < 4; f++) {
        put(&o, "# HELP %s %s\n# TYPE %s %s\n", net_fams[f][0], net_fams[f][2], net_fams[f][0],
            net_fams[f][1]);
        for (int i = 0; i < in->ngroups; i++) {
            const struct group *g = &in->groups[i];
            if (g->nodes <= 1 || !g->net) continue;
            struct net_group_stats ns;
            net_group_stats(g->net, g->index, &ns);
            if (f >= 2)
                put(&o, "%s{group=\"%s\"} %llu\n", net_fams[f][0], g->cfg->name,
                    (unsigned long long)(f == 2 ? ns.formations : ns.early_bytes));
            else
                put(&o, "%s{group=\"%s\"} %.6f\n", net_fams[f][0], g->cfg->name,
                    f == 0 ? ns.rendezvous_s : ns.formation_s);
        }
    }
    put(&o, "# HELP coll_group_cpu_shared 1 when another pod of the group may run on this pod's "
            "CPUs, so its host waits learn how long to spin; 0 when none may, so they spin "
            "through a scheduler slice before sleeping (the last commit's; after the first).\n"
            "# TYPE coll_group_cpu_shared gauge\n");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        struct net_group_stats ns;
        if (g->nodes <= 1 || !g->net) continue;
        net_group_stats(g->net, g->index, &ns);
        if (ns.cpu_shared >= 0)
            put(&o, "coll_group_cpu_shared{group=\"%s\"} %d\n", g->cfg->name, ns.cpu_shared);
    }
    put(&o, "# HELP coll_ops_path_total Host ops between pods by where they ran: inline (the "
            "engine), handed_over (started there, finished by the net thread; a send or receive "
            "the engine posted), queued, direct (the application, on lent connections: what "
            "its client counts in its region).\n"
            "# TYPE coll_ops_path_total counter\n");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        struct backend_stats bs = {0};
        if (!g->be || !g->be->stats || g->nodes <= 1) continue;
        g->be->stats(g, &bs);
        if (g->be == &backend_nccl) continue;
        put(&o, "coll_ops_path_total{group=\"%s\",path=\"inline\"} %llu\n", g->cfg->name,
            (unsigned long long)bs.inline_ran);
        put(&o, "coll_ops_path_total{group=\"%s\",path=\"handed_over\"} %llu\n", g->cfg->name,
            (unsigned long long)bs.handed_over);
        put(&o, "coll_ops_path_total{group=\"%s\",path=\"queued\"} %llu\n", g->cfg->name,
            (unsigned long long)bs.queued);
        put(&o, "coll_ops_path_total{group=\"%s\",path=\"direct\"} %llu\n", g->cfg->name,
            (unsigned long long)g->direct_ops);
    }
    static const char *const nccl_help[] = {
        "# HELP coll_comms_created_total NCCL communicators created.\n"
        "# TYPE coll_comms_created_total counter\n",
        "# HELP coll_comm_failures_total NCCL communicators abandoned after a failure "
        "(one-pod groups).\n# TYPE coll_comm_failures_total counter\n",
        "# HELP coll_graph_replays_total Ops launched by replaying a CUDA graph (the first "
        "capture included).\n# TYPE coll_graph_replays_total counter\n",
        "# HELP coll_graphs_captured_total CUDA graphs captured for repeated ops.\n"
        "# TYPE coll_graphs_captured_total counter\n",
    };
    for (int f = 0; f < 4; f++) {
        put(&o, "%s", nccl_help[f]);
        for (int i = 0; i < in->ngroups; i++) {
            const struct group *g = &in->groups[i];
            struct backend_stats bs = {0};
            if (g->be != &backend_nccl || !g->be->stats) continue;
            g->be->stats(g, &bs);
            if (f == 0)
                put(&o, "coll_comms_created_total{group=\"%s\"} %llu\n", g->cfg->name,
                    (unsigned long long)bs.comms_created);
            else if (f == 1)
                put(&o, "coll_comm_failures_total{group=\"%s\"} %llu\n", g->cfg->name,
                    (unsigned long long)(g->nodes > 1 ? 0 : bs.comm_generations - 1));
            else if (f == 2)
                put(&o, "coll_graph_replays_total{group=\"%s\"} %llu\n", g->cfg->name,
                    (unsigned long long)bs.graph_replays);
            else
                put(&o, "coll_graphs_captured_total{group=\"%s\"} %llu\n", g->cfg->name,
                    (unsigned long long)bs.graphs_captured);
        }
    }
    put(&o, "# HELP coll_group_epochs_total Epochs the group went through here.\n"
            "# TYPE coll_group_epochs_total counter\n");
    for (int i = 0; i < in->ngroups; i++)
        put(&o, "coll_group_epochs_total{group=\"%s\"} %u\n", in->groups[i].cfg->name,
            in->groups[i].epoch - 1);
    return o.len;
}

size_t metrics_readyz(const struct metrics_in *in, char *buf, size_t cap, unsigned *failing)
{
    struct out o = {.p = buf, .cap = cap};
    *failing = in->draining ? READYZ_POD : 0;
    put(&o, "[%s] agent: %s\n", in->draining ? "-" : "+",
        in->draining ? "stopping (SIGTERM): finishing what is in flight" : "serving");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        int formed = 0;
        uint32_t epoch = 0;
        char detail[WIRE_ERRMSG_MAX] = "";
        if (!g->be) {
            put(&o, "[-] group %s: cannot run here: %s\n", g->cfg->name, g->backend_why);
            *failing |= READYZ_POD;
            continue;
        }
        group_state(g, &formed, &epoch, detail, sizeof(detail));
        if (!formed) *failing |= READYZ_FORMED;
        put(&o, "[%s] group %s: %s%s%s\n", formed ? "+" : "-", g->cfg->name,
            formed ? "formed" : "not formed", detail[0] ? ": " : "", detail);
    }
    return o.len;
}
