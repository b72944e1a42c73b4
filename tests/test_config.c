/*
 * test_config.c: the strict YAML loader. A full config loads with every value where
 * it belongs; each kind of mistake gives one line with file:line:column and the key
 * path; every key of the schema is documented in config/README.md; every example
 * loads.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "identity.h"
#include "harness.h"

static struct config *load_ok(const char *yaml)
{
    struct config *c = config_new();
    char *err = NULL;
    int rc = config_load_string(c, yaml, strlen(yaml), "t.yaml", &err);
    if (rc != 0) fail_msg("unexpected errors:\n%s", err ? err : "?");
    free(err);
    return c;
}

/* Load yaml, expect failure, and expect the first error line to equal want_prefix
 * up to its length. Returns the number of error lines. */
static int load_bad(const char *yaml, const char *want)
{
    struct config *c = config_new();
    char *err = NULL;
    int rc = config_load_string(c, yaml, strlen(yaml), "t.yaml", &err);
    assert_int_equal(rc, -1);
    assert_non_null(err);
    if (!strstr(err, want)) fail_msg("errors:\n%s\ndo not contain: %s", err, want);
    int lines = 0;
    for (char *p = err; *p; p++)
        lines += *p == '\n';
    free(err);
    config_free(&c);
    return lines;
}

static void full_config_lands_in_the_struct(void **state)
{
    (void)state;
    setenv("COLL_TEST_POD", "pod-7", 1);
    struct config *c = load_ok("agent:\n"
                               "  socket: /run/coll/a.sock\n"
                               "  socket_mode: 0600\n"
                               "  allowed_uids: [1000, 1001]\n"
                               "  allowed_gids: [50]\n"
                               "  log_level: debug\n"
                               "  log_format: json\n"
                               "  spin_us: 10\n"
                               "  max_sessions: 8\n"
                               "  handshake_timeout_ms: 100\n"
                               "node:\n"
                               "  index: 0\n"
                               "  name: ${COLL_TEST_POD}\n"
                               "discovery:\n"
                               "  mode: static\n"
                               "  peers: [\"10.0.0.1:7100\"]\n"
                               "groups:\n"
                               "  - name: train\n"
                               "    backend: host\n"
                               "    devices: [cpu, cpu]\n"
                               "    timeouts: {op_ms: 1234, join_ms: 99}\n"
                               "  - name: infer.v2\n");
    assert_string_equal(c->agent.socket, "/run/coll/a.sock");
    assert_int_equal(c->agent.socket_mode, 0600);
    assert_int_equal(c->agent.nallowed_uids, 2);
    assert_int_equal(c->agent.allowed_uids[1], 1001);
    assert_int_equal(c->agent.allowed_gids[0], 50);
    assert_int_equal(c->agent.log_level, 0);
    assert_int_equal(c->agent.log_format, 1);
    assert_int_equal(c->agent.spin_us, 10);
    assert_string_equal(c->node.name, "pod-7");
    assert_int_equal(c->discovery.npeers, 1);
    assert_int_equal(c->ngroups, 2);
    assert_string_equal(c->groups[0].name, "train");
    assert_int_equal(c->groups[0].backend, CONFIG_BACKEND_HOST);
    assert_int_equal(c->groups[0].local_slots, 2); /* from devices */
    assert_int_equal(c->groups[0].op_timeout_ms, 1234);
    assert_int_equal(c->groups[0].join_timeout_ms, 99);
    /* defaults */
    assert_int_equal(c->groups[1].backend, CONFIG_BACKEND_AUTO);
    assert_int_equal(c->groups[1].local_slots, 1);
    assert_int_equal(c->groups[1].members, 1);
    assert_int_equal(c->groups[1].op_timeout_ms, 30000);
    assert_int_equal(c->groups[1].line, 22);
    config_free(&c);
}

static void defaults_need_only_a_group(void **state)
{
    (void)state;
    unsetenv("COLL_AGENT_SOCKET");
    struct config *c = load_ok("groups:\n  - name: g\n");
    assert_string_equal(c->agent.socket, CONFIG_DEFAULT_SOCKET);
    assert_int_equal(c->agent.socket_mode, 0660);
    assert_int_equal(c->agent.spin_us, 200);
    assert_int_equal(c->agent.handshake_timeout_ms, 5000);
    assert_string_equal(c->node.tcp_congestion, "reno");
    assert_int_equal(c->node.tcp_buffer_bytes, 4 << 20);
    config_free(&c);
    c = load_ok("node:\n  tcp_buffer_bytes: 0\ngroups:\n  - name: g\n");
    assert_int_equal(c->node.tcp_buffer_bytes, 0);
    config_free(&c);
}

static void embedded_default_loads(void **state)
{
    (void)state;
    struct config *c = load_ok(config_default_yaml);
    assert_non_null(config_find_group(c, "demo"));
    assert_int_equal(config_find_group(c, "demo")->members, 4);
    assert_int_equal(config_find_group(c, "demo")->local_slots, 1);
    assert_int_equal(c->discovery.npeers, 1);
    config_free(&c);
}

static void syntax_error_has_position(void **state)
{
    (void)state;
    load_bad("groups:\n  - name: [unclosed\n", "t.yaml:3:1: syntax error");
}

static void unknown_key_names_the_path(void **state)
{
    (void)state;
    load_bad("groups:\n  - name: g\n    timeouts:\n      op_sm: 5\n",
             "t.yaml:4:7: groups[0].timeouts.op_sm: unknown key 'op_sm' (known here: op_ms, "
             "join_ms, heartbeat_ms)");
    load_bad("agnet:\n  socket: x\ngroups:\n  - name: g\n", "t.yaml:1:1: agnet: unknown key");
}

static void wrong_types_are_reported(void **state)
{
    (void)state;
    load_bad("agent:\n  spin_us: fast\ngroups:\n  - name: g\n",
             "t.yaml:2:12: agent.spin_us: expected an integer, got 'fast'");
    load_bad("agent:\n  socket: {a: 1}\ngroups:\n  - name: g\n",
             "t.yaml:2:11: agent.socket: expected a string, got a mapping");
    load_bad("groups:\n  name: g\n", "t.yaml:2:3: groups: expected a list, got a mapping");
    load_bad("groups:\n  - name: g\n    backend: gpu\n",
             "groups[0].backend: expected one of host, nccl, auto; got 'gpu'");
    load_bad("groups:\n  - g\n", "t.yaml:2:5: groups[0]: expected a mapping, got a scalar");
    load_bad("- a\n- b\n", "t.yaml:1:1: the top level must be a mapping");
}

static void out_of_range_values_are_reported(void **state)
{
    (void)state;
    load_bad("groups:\n  - name: g\n    local_slots: 0\n",
             "t.yaml:3:18: groups[0].local_slots: value 0 is out of range [1, 64]");
    load_bad("agent:\n  socket_mode: 01777\ngroups:\n  - name: g\n",
             "agent.socket_mode: value 1023 is out of range [0, 511]");
    load_bad("agent:\n  allowed_uids: [-1]\ngroups:\n  - name: g\n",
             "agent.allowed_uids[0]: value -1 is out of range");
    load_bad("node:\n  tcp_congestion: \"cubic; reboot\"\ngroups:\n  - name: g\n",
             "node.tcp_congestion: 'cubic; reboot' is not a congestion control's name");
    load_bad("node:\n  tcp_congestion: a_name_of_sixteen\ngroups:\n  - name: g\n",
             "node.tcp_congestion");
    load_bad("node:\n  tcp_buffer_bytes: -1\ngroups:\n  - name: g\n",
             "t.yaml:2:21: node.tcp_buffer_bytes: value -1 is out of range [0, 1073741824]");
    load_bad("node:\n  tcp_buffer_bytes: 4MiB\ngroups:\n  - name: g\n", "node.tcp_buffer_bytes");
}

/* A coordinator's name as long as DNS allows (253) with its port: what the chart renders
 * for a 53-character release (issue 41: the agent refused its own chart's config past
 * 127 bytes). One byte more than the field holds is refused, saying so. */
static void coordinator_names_as_long_as_dns_allows(void **state)
{
    (void)state;
    char name[254], yaml[1024];
    memset(name, 'a', 253);
    for (int i = 63; i < 253; i += 64)
        name[i] = '.'; /* labels of 63 */
    name[253] = '\0';
    snprintf(yaml, sizeof(yaml),
             "discovery:\n  coordinator: \"%s:7100\"\ngroups:\n  - name: g\n    members: 2\n",
             name);
    struct config *c = load_ok(yaml);
    assert_int_equal(strlen(c->discovery.coordinator), 253 + 5);
    config_free(&c);
    char big[CONFIG_ADDR_MAX + 8];
    memset(big, 'b', CONFIG_ADDR_MAX);
    big[CONFIG_ADDR_MAX] = '\0';
    snprintf(yaml, sizeof(yaml), "discovery:\n  coordinator: \"%s\"\ngroups:\n  - name: g\n", big);
    load_bad(yaml, "discovery.coordinator: value is longer than 259 bytes");
}

static void duplicates_are_reported(void **state)
{
    (void)state;
    load_bad("groups:\n  - name: a\n  - name: b\n  - name: a\n",
             "t.yaml:4:5: groups[2]: duplicate group name 'a' (first declared at line 2)");
    load_bad("agent:\n  spin_us: 1\n  spin_us: 2\ngroups:\n  - name: g\n",
             "t.yaml:3:3: agent.spin_us: duplicate key 'spin_us'");
}

static void missing_and_inconsistent_values_are_reported(void **state)
{
    (void)state;
    load_bad("agent:\n  spin_us: 1\n", "t.yaml:1:1: missing required key 'groups'");
    load_bad("groups:\n  - backend: host\n", "groups[0]: missing required key 'name'");
    load_bad("groups:\n  - name: g\n    local_slots: 3\n    devices: [a, b]\n",
             "groups[0]: local_slots is 3 but devices lists 2 entries");
    load_bad("groups:\n  - name: bad/name\n", "may hold only letters");
    load_bad("groups:\n  - name: g\n    members: 2\n",
             "discovery.coordinator (or discovery.peers[0])");
    load_bad("discovery:\n  peers: [\"nohost\"]\ngroups:\n  - name: g\n",
             "discovery.peers[0]: 'nohost' is not host:port");
    load_bad("", "the document is empty");
    load_bad("groups:\n  - name: g\n---\ngroups: []\n", "only one YAML document");
}

static void all_errors_are_reported_at_once(void **state)
{
    (void)state;
    int lines = load_bad("agent:\n  spin_us: x\n  bogus: 1\ngroups:\n  - name: g\n    members: y\n",
                         "agent.spin_us");
    assert_int_equal(lines, 3);
}

static void environment_is_expanded(void **state)
{
    (void)state;
    setenv("COLL_T_NS", "prod", 1);
    unsetenv("COLL_T_UNSET");
    struct config *c = load_ok("node:\n  name: ${COLL_T_NS}-$${x}-${COLL_T_UNSET:-dflt}\n"
                               "groups:\n  - name: g\n");
    assert_string_equal(c->node.name, "prod-${x}-dflt");
    config_free(&c);
    load_bad("node:\n  name: ${COLL_T_UNSET}\ngroups:\n  - name: g\n",
             "t.yaml:2:9: node.name: environment variable COLL_T_UNSET is not set");
    load_bad("node:\n  name: ${COLL_T_NS\ngroups:\n  - name: g\n", "unterminated ${");
    setenv("COLL_T_IDX", "3", 1);
    load_bad("node:\n  index: ${COLL_T_IDX}\ndiscovery:\n  peers: [\"a:1\"]\n"
             "groups:\n  - name: g\n    members: 2\n",
             "node.index 3 is not a member");
}

static void dump_round_trips(void **state)
{
    (void)state;
    struct config *c = load_ok("agent:\n  socket: /tmp/x.sock\ngroups:\n  - name: g\n"
                               "    devices: [cpu]\n");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_dump(c, f);
    fclose(f);
    assert_non_null(strstr(buf, "socket: \"/tmp/x.sock\""));
    assert_non_null(strstr(buf, "socket_mode: 0660"));
    struct config *d = load_ok(strchr(buf, '\n') + 1); /* skip the comment line */
    assert_string_equal(d->agent.socket, "/tmp/x.sock");
    assert_int_equal(d->groups[0].local_slots, 1);
    assert_string_equal(d->groups[0].devices[0], "cpu");
    free(buf);
    config_free(&c);
    config_free(&d);
}

static void every_key_is_documented(void **state)
{
    (void)state;
    FILE *f = fopen(COLL_SOURCE_DIR "/config/README.md", "r");
    assert_non_null(f);
    static char doc[1 << 16];
    size_t n = fread(doc, 1, sizeof(doc) - 1, f);
    doc[n] = '\0';
    fclose(f);
    for (const char *const *p = config_key_paths(); *p; p++) {
        char want[128];
        snprintf(want, sizeof(want), "`%s`", *p);
        if (!strstr(doc, want)) fail_msg("config/README.md does not document %s", want);
    }
}

static void every_example_loads(void **state)
{
    (void)state;
    DIR *d = opendir(COLL_SOURCE_DIR "/config/examples");
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    setenv("POD_NAME", "pod-0", 1);
    setenv("POD_NAMESPACE", "default", 1);
    setenv("POD_INDEX", "0", 1);
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".yaml")) continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/config/examples/%s", COLL_SOURCE_DIR, e->d_name);
        struct config *c = config_new();
        char *err = NULL;
        if (config_load_file(c, path, &err) != 0) fail_msg("%s", err);
        free(err);
        config_free(&c);
        n++;
    }
    closedir(d);
    assert_true(n >= 2);
}

/* ---- hostile files (found on c65a60e) -------------------------------------------- */

static char *repeat(const char *unit, size_t times, const char *head, const char *tail)
{
    size_t ul = strlen(unit), hl = strlen(head), tl = strlen(tail);
    char *s = malloc(hl + ul * times + tl + 1);
    memcpy(s, head, hl);
    for (size_t i = 0; i < times; i++)
        memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * times, tail, tl + 1);
    return s;
}

/* 200,000 nested '[' ran for over a minute in libyaml's loader. */
static void deep_nesting_is_refused(void **state)
{
    (void)state;
    char *y = repeat("[", 200000, "groups: ", "");
    assert_int_equal(load_bad(y, "t.yaml:1:40: nested deeper than 32 levels"), 1);
    free(y);
}

/* Aliases multiplied errors: a 209 KB file made 178 MB of them. */
static void alias_bombs_are_refused(void **state)
{
    (void)state;
    char *y = repeat("  - *a\n", 100, "x: &a {k: 1}\ngroups:\n", "");
    load_bad(y, "more than 64 aliases");
    free(y);
    /* without aliases, errors are bounded too: 50 lines and a count */
    y = repeat("  - {name: g, bogus: 1}\n", 60, "groups:\n", "");
    struct config *c = config_new();
    char *err = NULL;
    assert_int_equal(config_load_string(c, y, strlen(y), "t.yaml", &err), -1);
    int lines = 0;
    for (char *p = err; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 51);
    assert_non_null(strstr(err, "... and "));
    free(err);
    free(y);
    config_free(&c);
}

static void write_file(const char *path, const char *head, size_t pad, const char *tail)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(head, f);
    for (size_t i = 0; i < pad; i++)
        fputc('#', f);
    fputs(tail, f);
    fclose(f);
}

/* A file over 16 MiB was cut silently: a bad key after 17 MiB passed --check-config. */
static void oversized_and_odd_files_are_refused(void **state)
{
    (void)state;
    char path[128];
    tmp_path(path, sizeof(path), "big.yaml", 0);
    write_file(path, "groups: [{name: g}]\n", 17u << 20, "\nbogus: 1\n");
    struct config *c = config_new();
    char *err = NULL;
    assert_int_equal(config_load_file(c, path, &err), -1);
    if (!strstr(err, "a config may hold at most 1048576")) fail_msg("%s", err);
    free(err);
    /* just under the limit loads; one byte over does not */
    write_file(path, "groups: [{name: g}]\n", (1u << 20) - 21, "\n");
    assert_int_equal(config_load_file(c, path, &err), 0);
    free(err);
    write_file(path, "groups: [{name: g}]\n", (1u << 20) - 20, "\n");
    assert_int_equal(config_load_file(c, path, &err), -1);
    free(err);
    unlink(path);
    /* a directory used to give "the document is empty", with no position */
    assert_int_equal(config_load_file(c, "/tmp", &err), -1);
    assert_string_equal(err, "/tmp: not a regular file\n");
    free(err);
    config_free(&c);
}

/* ---- node.index: auto ---------------------------------------------------------------- */

/* A fake environment: NAME=value pairs, NULL-terminated. */
static const char *fake_get(void *ctx, const char *name)
{
    const char *const *kv = ctx;
    size_t n = strlen(name);
    for (; kv && *kv; kv++)
        if (strncmp(*kv, name, n) == 0 && (*kv)[n] == '=') return *kv + n + 1;
    return NULL;
}

/* Resolve node.index: auto for a config of members pods; returns the index or -1 with
 * why in err. */
static int resolve(int members, const char *const *env, const char *labels, char *src, char *err)
{
    char yaml[256];
    snprintf(yaml, sizeof(yaml),
             "node:\n  pods_per_job: 4\ndiscovery:\n  coordinator: \"c.:7\"\n"
             "groups:\n  - name: g\n    members: %d\n",
             members);
    struct config *c = load_ok(yaml);
    char lpath[128] = "";
    if (labels) {
        tmp_path(lpath, sizeof(lpath), "labels", 0);
        write_file(lpath, labels, 0, "");
    }
    struct identity_env e = {.get = fake_get, .ctx = (void *)env, .labels_file = lpath};
    struct identity id;
    err[0] = src[0] = 0;
    int rc = identity_resolve(c, &e, &id, err, 512);
    if (rc == 0) {
        assert_int_equal(c->node.index, id.index);
        strcpy(src, id.source);
    }
    config_free(&c);
    if (labels) unlink(lpath);
    return rc == 0 ? id.index : -1;
}

static void node_index_auto_takes_the_first_source(void **state)
{
    (void)state;
    char src[160], err[512];
    const char *lws[] = {"LWS_WORKER_INDEX=3", "JOB_COMPLETION_INDEX=1", "POD_NAME=x-2", NULL};
    assert_int_equal(resolve(16, lws, NULL, src, err), 3);
    assert_string_equal(src, "LWS_WORKER_INDEX=3");
    /* JobSet: job 2 of pods_per_job 4, completion index 1 */
    const char *js[] = {"JOB_COMPLETION_INDEX=1", "POD_NAME=js-w-2-1-abcde", NULL};
    assert_int_equal(resolve(16, js, "jobset.sigs.k8s.io/job-global-index=\"2\"\n", src, err), 9);
    assert_non_null(strstr(src, "JobSet"));
    const char *job[] = {"JOB_COMPLETION_INDEX=5", NULL};
    assert_int_equal(resolve(16, job, "batch.kubernetes.io/job-completion-index=\"5\"\n", src, err),
                     5);
    const char *sts[] = {"POD_NAME=train-4", NULL};
    assert_int_equal(
        resolve(16, sts, "app=\"train\"\napps.kubernetes.io/pod-index=\"4\"\n", src, err), 4);
    assert_non_null(strstr(src, "apps.kubernetes.io/pod-index"));
    /* LeaderWorkerSet's label when its env is absent; PyTorchJob's master and workers */
    const char *lwsl[] = {"POD_NAME=lws-0-3", NULL};
    assert_int_equal(
        resolve(16, lwsl, "leaderworkerset.sigs.k8s.io/worker-index=\"3\"\n", src, err), 3);
    assert_non_null(strstr(src, "worker-index"));
    const char *ptj[] = {"POD_NAME=train-worker-0", NULL};
    const char *master = "training.kubeflow.org/replica-index=\"0\"\n"
                         "training.kubeflow.org/replica-type=\"master\"\n";
    assert_int_equal(resolve(16, ptj, master, src, err), 0);
    const char *w2 = "training.kubeflow.org/replica-index=\"2\"\n"
                     "training.kubeflow.org/replica-type=\"worker\"\n";
    assert_int_equal(resolve(16, ptj, w2, src, err), 3);
    assert_non_null(strstr(src, "PyTorchJob: worker replica 2 in "));
    const char *name[] = {"HOSTNAME=train-7", NULL};
    assert_int_equal(resolve(16, name, NULL, src, err), 7);
    assert_string_equal(src, "the ordinal of pod name 'train-7'");
}

static void node_index_auto_refuses_conflicts_and_absence(void **state)
{
    (void)state;
    char src[160], err[512];
    const char *job[] = {"JOB_COMPLETION_INDEX=5", NULL};
    assert_int_equal(resolve(16, job, "batch.kubernetes.io/job-completion-index=\"6\"\n", src, err),
                     -1);
    assert_non_null(strstr(err, "JOB_COMPLETION_INDEX=5"));
    assert_non_null(strstr(err, "job-completion-index is \"6\""));
    const char *sts[] = {"POD_NAME=train-5", NULL};
    assert_int_equal(resolve(16, sts, "apps.kubernetes.io/pod-index=\"4\"\n", src, err), -1);
    assert_non_null(strstr(err, "pod-index is 4"));
    assert_non_null(strstr(err, "'train-5' ends in 5"));
    /* Kubeflow: a type without a rank, a master that is not replica 0, no index */
    const char *ptj[] = {"POD_NAME=x", NULL};
    assert_int_equal(resolve(16, ptj, "training.kubeflow.org/replica-type=\"ps\"\n", src, err), -1);
    assert_non_null(strstr(err, "replica-type is \"ps\""));
    assert_int_equal(resolve(16, ptj,
                             "training.kubeflow.org/replica-index=\"1\"\n"
                             "training.kubeflow.org/replica-type=\"master\"\n",
                             src, err),
                     -1);
    assert_non_null(strstr(err, "'1' is not an index"));
    assert_int_equal(resolve(16, ptj, "training.kubeflow.org/replica-type=\"worker\"\n", src, err),
                     -1);
    assert_non_null(strstr(err, "'(missing)' is not an index"));
    /* nothing at all: an error, never index 0 */
    const char *none[] = {"HOSTNAME=laptop", NULL};
    assert_int_equal(resolve(16, none, NULL, src, err), -1);
    assert_non_null(strstr(err, "found no source"));
    /* ... unless no group spans pods */
    assert_int_equal(resolve(1, none, NULL, src, err), 0);
    const char *bad[] = {"LWS_WORKER_INDEX=two", NULL};
    assert_int_equal(resolve(16, bad, NULL, src, err), -1);
    assert_non_null(strstr(err, "'two' is not an index"));
    const char *big[] = {"LWS_WORKER_INDEX=16", NULL};
    assert_int_equal(resolve(16, big, NULL, src, err), -1);
    assert_non_null(strstr(err, "is not a member of group 'g' (16 pods)"));
    /* the keyword and numbers only */
    load_bad("node:\n  index: sometimes\ngroups:\n  - name: g\n", "expected an integer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_config_lands_in_the_struct),
        cmocka_unit_test(defaults_need_only_a_group),
        cmocka_unit_test(embedded_default_loads),
        cmocka_unit_test(syntax_error_has_position),
        cmocka_unit_test(unknown_key_names_the_path),
        cmocka_unit_test(wrong_types_are_reported),
        cmocka_unit_test(out_of_range_values_are_reported),
        cmocka_unit_test(coordinator_names_as_long_as_dns_allows),
        cmocka_unit_test(duplicates_are_reported),
        cmocka_unit_test(missing_and_inconsistent_values_are_reported),
        cmocka_unit_test(all_errors_are_reported_at_once),
        cmocka_unit_test(environment_is_expanded),
        cmocka_unit_test(dump_round_trips),
        cmocka_unit_test(every_key_is_documented),
        cmocka_unit_test(every_example_loads),
        cmocka_unit_test(deep_nesting_is_refused),
        cmocka_unit_test(alias_bombs_are_refused),
        cmocka_unit_test(oversized_and_odd_files_are_refused),
        cmocka_unit_test(node_index_auto_takes_the_first_source),
        cmocka_unit_test(node_index_auto_refuses_conflicts_and_absence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
