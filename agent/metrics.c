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

#include "coll/coll.h"
#include "group.h"
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
        "# HELP coll_sessions Connected application sessions.\n"
        "# TYPE coll_sessions gauge\ncoll_sessions %d\n",
        in->sessions);
    put(&o,
        "# HELP coll_sessions_opened_total Sessions accepted since start.\n"
        "# TYPE coll_sessions_opened_total counter\ncoll_sessions_opened_total %llu\n",
        (unsigned long long)in->sessions_opened);
    put(&o,
        "# HELP coll_gpu_buffer_imports Client GPU buffers the agent holds open.\n"
        "# TYPE coll_gpu_buffer_imports gauge\ncoll_gpu_buffer_imports %d\n",
        in->gpu_imports);
    put(&o, "# HELP coll_ops_total Ops finished, by group, kind and status.\n"
            "# TYPE coll_ops_total counter\n");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        for (int k = 0; k < WIRE_OP_KIND_COUNT; k++)
            for (int st = 0; st < GROUP_STATUS_MAX; st++)
                if (g->m.ops[k][st] || (st == 0 && k == WIRE_OP_ALLREDUCE))
                    put(&o, "coll_ops_total{group=\"%s\",kind=\"%s\",status=\"%s\"} %llu\n",
                        g->cfg->name, wire_kind_name((unsigned)k), status_names[st],
                        (unsigned long long)g->m.ops[k][st]);
    }
    put(&o, "# HELP coll_op_bytes_total Bytes of the ops that finished well (each participant's "
            "count x element size), by group and kind.\n# TYPE coll_op_bytes_total counter\n");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        for (int k = 0; k < WIRE_OP_KIND_COUNT; k++)
            if (g->m.bytes[k] || k == WIRE_OP_ALLREDUCE)
                put(&o, "coll_op_bytes_total{group=\"%s\",kind=\"%s\"} %llu\n", g->cfg->name,
                    wire_kind_name((unsigned)k), (unsigned long long)g->m.bytes[k]);
    }
    put(&o, "# HELP coll_op_duration_seconds From an op's submission to its completion.\n"
            "# TYPE coll_op_duration_seconds histogram\n");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        uint64_t cum = 0;
        for (int b = 0; b < GROUP_HIST_BUCKETS; b++) {
            cum += g->m.hist[b];
            put(&o, "coll_op_duration_seconds_bucket{group=\"%s\",le=\"%g\"} %llu\n", g->cfg->name,
                group_hist_bounds[b], (unsigned long long)cum);
        }
        cum += g->m.hist[GROUP_HIST_BUCKETS];
        put(&o, "coll_op_duration_seconds_bucket{group=\"%s\",le=\"+Inf\"} %llu\n", g->cfg->name,
            (unsigned long long)cum);
        put(&o, "coll_op_duration_seconds_sum{group=\"%s\"} %.9f\n", g->cfg->name, g->m.sum_s);
        put(&o, "coll_op_duration_seconds_count{group=\"%s\"} %llu\n", g->cfg->name,
            (unsigned long long)g->m.count);
    }
    put(&o, "# HELP coll_group_formed 1 when the group stands on every one of its pods.\n"
            "# TYPE coll_group_formed gauge\n");
    for (int i = 0; i < in->ngroups; i++) {
        int formed = 0;
        uint32_t epoch = 0;
        char detail[8];
        group_state(&in->groups[i], &formed, &epoch, detail, sizeof(detail));
        put(&o, "coll_group_formed{group=\"%s\"} %d\n", in->groups[i].cfg->name,
            in->groups[i].be ? formed : 0);
    }
    put(&o, "# HELP coll_group_epoch The group's epoch across its pods (one pod: the agent's).\n"
            "# TYPE coll_group_epoch gauge\n");
    for (int i = 0; i < in->ngroups; i++) {
        int formed = 0;
        uint32_t epoch = 0;
        char detail[8];
        group_state(&in->groups[i], &formed, &epoch, detail, sizeof(detail));
        put(&o, "coll_group_epoch{group=\"%s\"} %u\n", in->groups[i].cfg->name, epoch);
    }
    put(&o, "# HELP coll_group_pods Pods the group is declared with.\n"
            "# TYPE coll_group_pods gauge\n");
    for (int i = 0; i < in->ngroups; i++)
        put(&o, "coll_group_pods{group=\"%s\"} %d\n", in->groups[i].cfg->name, in->groups[i].nodes);
    put(&o, "# HELP coll_group_epochs_total Epochs the group went through here.\n"
            "# TYPE coll_group_epochs_total counter\n");
    for (int i = 0; i < in->ngroups; i++)
        put(&o, "coll_group_epochs_total{group=\"%s\"} %u\n", in->groups[i].cfg->name,
            in->groups[i].epoch - 1);
    return o.len;
}

size_t metrics_readyz(const struct metrics_in *in, char *buf, size_t cap, int *ready)
{
    struct out o = {.p = buf, .cap = cap};
    *ready = !in->draining;
    put(&o, "[%s] agent: %s\n", in->draining ? "-" : "+",
        in->draining ? "stopping (SIGTERM): finishing what is in flight" : "serving");
    for (int i = 0; i < in->ngroups; i++) {
        const struct group *g = &in->groups[i];
        int formed = 0;
        uint32_t epoch = 0;
        char detail[WIRE_ERRMSG_MAX] = "";
        if (!g->be) {
            put(&o, "[-] group %s: cannot run here: %s\n", g->cfg->name, g->backend_why);
            *ready = 0;
            continue;
        }
        group_state(g, &formed, &epoch, detail, sizeof(detail));
        if (!formed) *ready = 0;
        put(&o, "[%s] group %s: %s%s%s\n", formed ? "+" : "-", g->cfg->name,
            formed ? "formed" : "not formed", detail[0] ? ": " : "", detail);
    }
    put(&o, "%s\n", *ready ? "ready" : "not ready");
    return o.len;
}
