/*
 * identity.c: node.index: auto (identity.h says the order and the rules).
 */
#include "identity.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env_get(const struct identity_env *e, const char *name)
{
    const char *v = e && e->get ? e->get(e->ctx, name) : getenv(name);
    return v && *v ? v : NULL;
}

/* A decimal index in 0..65535 with nothing around it; -1 otherwise. */
static int parse_index(const char *s)
{
    if (!s || !isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || errno || v > 65535) return -1;
    return (int)v;
}

int identity_label(const char *file, const char *key, char *out, size_t outlen)
{
    FILE *f = file && *file ? fopen(file, "re") : NULL;
    if (!f) return -1;
    char line[1024];
    size_t klen = strlen(key);
    int found = -1;
    while (found < 0 && fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, klen) != 0 || line[klen] != '=') continue;
        const char *p = line + klen + 1;
        size_t n = 0;
        if (*p == '"') { /* Go's %q: \" and \\ are the escapes a label value can need */
            for (p++; *p && *p != '"' && n + 1 < outlen; p++) {
                if (*p == '\\' && p[1]) p++;
                out[n++] = *p;
            }
        } else {
            for (; *p && *p != '\n' && n + 1 < outlen; p++)
                out[n++] = *p;
        }
        out[n] = '\0';
        found = 0;
    }
    fclose(f);
    return found;
}

/* The ordinal of a StatefulSet pod's name: the digits after the last '-'. */
static int name_ordinal(const char *name)
{
    const char *dash = name ? strrchr(name, '-') : NULL;
    return dash && dash != name ? parse_index(dash + 1) : -1;
}

int identity_resolve(struct config *cfg, const struct identity_env *env, struct identity *out,
                     char *why, size_t whylen)
{
    const char *labels = env && env->labels_file ? env->labels_file : cfg->node.labels_file;
    char lbuf[64], ri[32];
    memset(out, 0, sizeof(*out));
    out->index = -1;
    if (cfg->node.index >= 0) {
        out->index = cfg->node.index;
        snprintf(out->source, sizeof(out->source), "node.index");
        goto check_range;
    }
    const char *v;
    if ((v = env_get(env, "LWS_WORKER_INDEX"))) {
        if ((out->index = parse_index(v)) < 0) goto bad_value;
        snprintf(out->source, sizeof(out->source), "LWS_WORKER_INDEX=%s", v);
        goto check_range;
    }
    /* the label LWS also sets: a container the webhook did not give the env still has it */
    if (identity_label(labels, "leaderworkerset.sigs.k8s.io/worker-index", lbuf, sizeof(lbuf)) ==
        0) {
        v = lbuf;
        if ((out->index = parse_index(lbuf)) < 0) goto bad_value;
        snprintf(out->source, sizeof(out->source),
                 "label leaderworkerset.sigs.k8s.io/worker-index in %s", labels);
        goto check_range;
    }
    /* Kubeflow's PyTorchJob: the Master is rank 0, Worker i is rank 1 + i (the RANK the
       training operator gives its own container, which a sidecar does not get) */
    if (identity_label(labels, "training.kubeflow.org/replica-type", lbuf, sizeof(lbuf)) == 0) {
        int master = strcmp(lbuf, "master") == 0;
        if (!master && strcmp(lbuf, "worker") != 0) {
            snprintf(why, whylen,
                     "node.index: auto: training.kubeflow.org/replica-type is \"%s\" (%s); only "
                     "master and worker have a rank here, set node.index",
                     lbuf, labels);
            return -1;
        }
        v = ri;
        if (identity_label(labels, "training.kubeflow.org/replica-index", ri, sizeof(ri)) != 0)
            snprintf(ri, sizeof(ri), "(missing)");
        int r = parse_index(ri);
        if (r < 0 || (master && r != 0)) goto bad_value;
        out->index = master ? 0 : r + 1;
        snprintf(out->source, sizeof(out->source), "PyTorchJob: %s replica %d in %s",
                 master ? "master" : "worker", r, labels);
        goto check_range;
    }
    const char *jci = env_get(env, "JOB_COMPLETION_INDEX");
    const char *jgi = env_get(env, "JOB_GLOBAL_INDEX");
    if (!jgi &&
        identity_label(labels, "jobset.sigs.k8s.io/job-global-index", lbuf, sizeof(lbuf)) == 0)
        jgi = lbuf;
    if (jci) {
        char jl[32];
        int c = parse_index(jci);
        v = jci;
        if (c < 0) goto bad_value;
        if (identity_label(labels, "batch.kubernetes.io/job-completion-index", jl, sizeof(jl)) ==
                0 &&
            parse_index(jl) != c) {
            snprintf(why, whylen,
                     "node.index: auto: JOB_COMPLETION_INDEX=%s but the pod's label "
                     "batch.kubernetes.io/job-completion-index is \"%s\" (%s)",
                     jci, jl, labels);
            return -1;
        }
        if (jgi) {
            int j = parse_index(jgi);
            if (j < 0) {
                v = jgi;
                goto bad_value;
            }
            long long idx = (long long)j * cfg->node.pods_per_job + c;
            if (c >= cfg->node.pods_per_job || idx > 65535) {
                snprintf(why, whylen,
                         "node.index: auto: JobSet job %d, completion index %d does not fit "
                         "node.pods_per_job %d",
                         j, c, cfg->node.pods_per_job);
                return -1;
            }
            out->index = (int)idx;
            snprintf(out->source, sizeof(out->source),
                     "JobSet: job-global-index %d x pods_per_job %d + JOB_COMPLETION_INDEX %d", j,
                     cfg->node.pods_per_job, c);
        } else {
            out->index = c;
            snprintf(out->source, sizeof(out->source), "JOB_COMPLETION_INDEX=%s", jci);
        }
        goto check_range;
    }
    const char *pod = env_get(env, "POD_NAME");
    if (!pod) pod = env_get(env, "HOSTNAME");
    int ord = name_ordinal(pod);
    if (identity_label(labels, "apps.kubernetes.io/pod-index", lbuf, sizeof(lbuf)) == 0) {
        v = lbuf;
        if ((out->index = parse_index(lbuf)) < 0) goto bad_value;
        if (ord >= 0 && ord != out->index) {
            snprintf(why, whylen,
                     "node.index: auto: the label apps.kubernetes.io/pod-index is %d (%s) but "
                     "the pod name '%s' ends in %d",
                     out->index, labels, pod, ord);
            return -1;
        }
        snprintf(out->source, sizeof(out->source), "label apps.kubernetes.io/pod-index in %s",
                 labels);
        goto check_range;
    }
    if (ord >= 0) {
        out->index = ord;
        snprintf(out->source, sizeof(out->source), "the ordinal of pod name '%s'", pod);
        goto check_range;
    }
    if (!config_multi_pod(cfg)) { /* one pod: the index is never used */
        out->index = 0;
        snprintf(out->source, sizeof(out->source), "none needed (no group spans pods)");
        goto check_range;
    }
    snprintf(why, whylen,
             "node.index: auto found no source: set node.index, or run where one of "
             "LWS_WORKER_INDEX, JOB_COMPLETION_INDEX, the labels of LeaderWorkerSet, "
             "PyTorchJob or apps.kubernetes.io/pod-index in %s, or a pod name ending in -<ordinal> "
             "(POD_NAME or HOSTNAME, here '%s') "
             "is present",
             labels && *labels ? labels : "(no labels file)", pod ? pod : "");
    return -1;
bad_value:
    snprintf(why, whylen, "node.index: auto: '%s' is not an index in 0..65535", v);
    return -1;
check_range:
    for (int i = 0; i < cfg->ngroups; i++) {
        const struct group_config *g = &cfg->groups[i];
        if (g->members > 1 && out->index >= g->members) {
            snprintf(why, whylen, "node.index %d (from %s) is not a member of group '%s' (%d pods)",
                     out->index, out->source, g->name, g->members);
            return -1;
        }
    }
    cfg->node.index = out->index;
    return 0;
}
