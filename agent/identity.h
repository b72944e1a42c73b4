/*
 * identity.h: which pod this agent is. node.index: auto is resolved from the first
 * stable source that Kubernetes gives the pod, in this order:
 *
 *   1. an explicit integer in node.index;
 *   2. LWS_WORKER_INDEX (LeaderWorkerSet);
 *   3. JobSet: the jobset.sigs.k8s.io/job-global-index label (or env JOB_GLOBAL_INDEX)
 *      x node.pods_per_job + JOB_COMPLETION_INDEX;
 *   4. JOB_COMPLETION_INDEX (an Indexed Job);
 *   5. the apps.kubernetes.io/pod-index label (StatefulSet) from the downward-API labels
 *      file node.labels_file;
 *   6. the ordinal suffix of the pod's name (POD_NAME, else HOSTNAME): "train-3" is 3.
 *
 * Two sources that state the same fact must agree: the Job's completion index in env
 * and in its batch.kubernetes.io/job-completion-index label; the StatefulSet's pod-index
 * label and the pod name's ordinal. A disagreement is a startup error that names both;
 * so is finding no source when some group spans several pods (never index 0 by
 * default: a second coordinator would split the group).
 */
#ifndef AGENT_IDENTITY_H
#define AGENT_IDENTITY_H

#include <stddef.h>

#include "config.h"

/* Where the sources are read from (tests give their own). */
struct identity_env {
    const char *(*get)(void *ctx, const char *name); /* an environment variable, or NULL */
    void *ctx;
    const char *labels_file; /* NULL: the config's node.labels_file */
};

struct identity {
    int index;        /* resolved, >= 0 */
    char source[160]; /* where it came from, for --check-config and the start log */
};

/* Resolve cfg->node.index (writing it back) and say where it came from. env NULL: the
 * process environment. 0, or -1 with why. */
int identity_resolve(struct config *cfg, const struct identity_env *env, struct identity *out,
                     char *why, size_t whylen);

/* A value of a downward-API labels file (lines key="value", Go-quoted): 0 and the
 * unquoted value, or -1 if the file or the key is not there. */
int identity_label(const char *file, const char *key, char *out, size_t outlen);

#endif
