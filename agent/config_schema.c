/*
 * config_schema.c: every key of the config in one table per mapping: its type, range,
 * default and where it lands in struct config. The loader (config.c) walks these
 * tables; the dump of the effective config and the list of key paths come from them
 * too, so the three never disagree.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "config_priv.h"

static const char *const backend_names[] = {"host", "nccl", "auto", NULL};
static const char *const level_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const format_names[] = {"logfmt", "json", NULL};
static const char *const discovery_names[] = {"static", "kubernetes", NULL};
static const char *const index_words[] = {"auto", NULL}; /* -1, -2, ... */
static const char *const bool_names[] = {"false", "true", NULL};
static const char *const seal_names[] = {"none", "mac", "encrypt", NULL}; /* seal.h's order */

#define AG(m) offsetof(struct config, agent.m)
#define GR(m) offsetof(struct group_config, m)

static const struct field timeouts_fields[] = {
    {"op_ms", T_INT, GR(op_timeout_ms), 0, 1, 3600000, NULL, "30000", NULL, 0, 0, 0},
    {"join_ms", T_INT, GR(join_timeout_ms), 0, 1, 3600000, NULL, "60000", NULL, 0, 0, 0},
    {"heartbeat_ms", T_INT, GR(heartbeat_ms), 0, 10, 600000, NULL, "1000", NULL, 0, 0, 0},
    {0},
};

static const struct field group_fields[] = {
    {"name", T_STR, GR(name), CONFIG_NAME_MAX, 0, 0, NULL, NULL, NULL, 0, 0, 1},
    {"backend", T_ENUM, GR(backend), 0, 0, 0, backend_names, "auto", NULL, 0, 0, 0},
    {"members", T_INT, GR(members), 0, 1, 4096, NULL, "1", NULL, 0, 0, 0},
    {"local_slots", T_INT, GR(local_slots), 0, 1, 64, NULL, NULL, NULL, 0, 0, 0},
    {"devices", T_STR_LIST, GR(devices), CONFIG_NAME_MAX, 0, 0, NULL, NULL, NULL, GR(ndevices),
     CONFIG_MAX_DEVICES, 0},
    {"timeouts", T_MAP, 0, 0, 0, 0, NULL, NULL, timeouts_fields, 0, 0, 0},
    {0},
};

static const struct field agent_fields[] = {
    {"socket", T_STR, AG(socket), CONFIG_PATH_MAX, 0, 0, NULL,
     "${COLL_AGENT_SOCKET:-" CONFIG_DEFAULT_SOCKET "}", NULL, 0, 0, 0},
    {"socket_mode", T_INT, AG(socket_mode), 0, 0, 0777, NULL, "0660", NULL, 0, 0, 0},
    {"allowed_uids", T_INT_LIST, AG(allowed_uids), sizeof(long long), 0, 4294967294LL, NULL, NULL,
     NULL, AG(nallowed_uids), CONFIG_MAX_IDS, 0},
    {"allowed_gids", T_INT_LIST, AG(allowed_gids), sizeof(long long), 0, 4294967294LL, NULL, NULL,
     NULL, AG(nallowed_gids), CONFIG_MAX_IDS, 0},
    {"log_level", T_ENUM, AG(log_level), 0, 0, 0, level_names, "info", NULL, 0, 0, 0},
    {"log_format", T_ENUM, AG(log_format), 0, 0, 0, format_names, "logfmt", NULL, 0, 0, 0},
    {"spin_us", T_INT, AG(spin_us), 0, 0, 1000000, NULL, "200", NULL, 0, 0, 0},
    {"direct_ops", T_ENUM, AG(direct_ops), 0, 0, 0, bool_names, "true", NULL, 0, 0, 0},
    {"max_sessions", T_INT, AG(max_sessions), 0, 1, 4096, NULL, "256", NULL, 0, 0, 0},
    {"drain_ms", T_INT, AG(drain_ms), 0, 0, 600000, NULL, "10000", NULL, 0, 0, 0},
    {"handshake_timeout_ms", T_INT, AG(handshake_timeout_ms), 0, 1, 600000, NULL, "5000", NULL, 0,
     0, 0},
    {0},
};

static const struct field node_fields[] = {
    {"index", T_INT, offsetof(struct config, node.index), 0, 0, 65535, index_words, "auto", NULL, 0,
     0, 0},
    {"name", T_STR, offsetof(struct config, node.name), CONFIG_POD_MAX, 0, 0, NULL,
     "${HOSTNAME:-localhost}", NULL, 0, 0, 0},
    {"address", T_STR, offsetof(struct config, node.address), CONFIG_ADDR_MAX, 0, 0, NULL,
     "${POD_IP:-127.0.0.1}", NULL, 0, 0, 0},
    {"data_port", T_INT, offsetof(struct config, node.data_port), 0, 0, 65535, NULL, "0", NULL, 0,
     0, 0},
    {"uid", T_STR, offsetof(struct config, node.uid), CONFIG_NAME_MAX, 0, 0, NULL, "${POD_UID:-}",
     NULL, 0, 0, 0},
    {"labels_file", T_STR, offsetof(struct config, node.labels_file), CONFIG_PATH_MAX, 0, 0, NULL,
     "${COLL_LABELS_FILE:-/etc/podinfo/labels}", NULL, 0, 0, 0},
    {"pods_per_job", T_INT, offsetof(struct config, node.pods_per_job), 0, 1, 65535, NULL, "1",
     NULL, 0, 0, 0},
    {"tcp_congestion", T_STR, offsetof(struct config, node.tcp_congestion), 16, 0, 0, NULL, "reno",
     NULL, 0, 0, 0},
    {"tcp_buffer_bytes", T_INT, offsetof(struct config, node.tcp_buffer_bytes), 0, 0, 1 << 30, NULL,
     "4194304", NULL, 0, 0, 0},
    {0},
};

static const struct field http_fields[] = {
    {"address", T_STR, offsetof(struct config, http.address), CONFIG_ADDR_MAX, 0, 0, NULL,
     "0.0.0.0", NULL, 0, 0, 0},
    {"port", T_INT, offsetof(struct config, http.port), 0, 0, 65535, NULL, "0", NULL, 0, 0, 0},
    {0},
};

static const struct field discovery_fields[] = {
    {"mode", T_ENUM, offsetof(struct config, discovery.mode), 0, 0, 0, discovery_names, "static",
     NULL, 0, 0, 0},
    {"coordinator", T_STR, offsetof(struct config, discovery.coordinator), CONFIG_ADDR_MAX, 0, 0,
     NULL, NULL, NULL, 0, 0, 0},
    {"service", T_STR, offsetof(struct config, discovery.service), CONFIG_ADDR_MAX, 0, 0, NULL,
     NULL, NULL, 0, 0, 0},
    {"resolve_ms", T_INT, offsetof(struct config, discovery.resolve_ms), 0, 1, 3600000, NULL,
     "60000", NULL, 0, 0, 0},
    {"peers", T_STR_LIST, offsetof(struct config, discovery.peers), CONFIG_ADDR_MAX, 0, 0, NULL,
     NULL, NULL, offsetof(struct config, discovery.npeers), CONFIG_MAX_PEERS, 0},
    {0},
};

static const struct field security_fields[] = {
    {"keys", T_STR, offsetof(struct config, security.keys), CONFIG_PATH_MAX, 0, 0, NULL,
     "${COLL_KEYS_DIR:-}", NULL, 0, 0, 0},
    {"seed", T_STR, offsetof(struct config, security.seed), CONFIG_PATH_MAX, 0, 0, NULL,
     "${COLL_SEED_FILE:-}", NULL, 0, 0, 0},
    {"require_keys", T_ENUM, offsetof(struct config, security.require_keys), 0, 0, 0, bool_names,
     "false", NULL, 0, 0, 0},
    {"insecure", T_ENUM, offsetof(struct config, security.insecure), 0, 0, 0, bool_names, "false",
     NULL, 0, 0, 0},
    {"data", T_ENUM, offsetof(struct config, security.data), 0, 0, 0, seal_names, "none", NULL, 0,
     0, 0},
    {0},
};

const struct field config_root_fields[] = {
    {"agent", T_MAP, 0, 0, 0, 0, NULL, NULL, agent_fields, 0, 0, 0},
    {"node", T_MAP, 0, 0, 0, 0, NULL, NULL, node_fields, 0, 0, 0},
    {"http", T_MAP, 0, 0, 0, 0, NULL, NULL, http_fields, 0, 0, 0},
    {"discovery", T_MAP, 0, 0, 0, 0, NULL, NULL, discovery_fields, 0, 0, 0},
    {"security", T_MAP, 0, 0, 0, 0, NULL, NULL, security_fields, 0, 0, 0},
    {"groups", T_MAP_LIST, offsetof(struct config, groups), sizeof(struct group_config), 0, 0, NULL,
     NULL, group_fields, offsetof(struct config, ngroups), CONFIG_MAX_GROUPS, 1},
    {0},
};

/* ---- dump -------------------------------------------------------------------- */

static void dump_fields(const struct field *fields, const void *base, FILE *out, int indent)
{
    for (const struct field *f = fields; f->key; f++) {
        const char *p = (const char *)base + f->off;
        fprintf(out, "%*s%s:", indent, "", f->key);
        switch (f->type) {
        case T_STR:
            fprintf(out, " \"%s\"\n", p);
            break;
        case T_INT:
            if (f->enums && *(const int *)p < 0)
                fprintf(out, " %s\n", f->enums[-1 - *(const int *)p]);
            else if (strcmp(f->key, "socket_mode") == 0)
                fprintf(out, " 0%o\n", *(const int *)p);
            else
                fprintf(out, " %d\n", *(const int *)p);
            break;
        case T_ENUM:
            fprintf(out, " %s\n", f->enums[*(const int *)p]);
            break;
        case T_MAP:
            fprintf(out, "\n");
            dump_fields(f->sub, base, out, indent + 2);
            break;
        case T_INT_LIST:
        case T_STR_LIST:
        case T_MAP_LIST: {
            int n = *(const int *)((const char *)base + f->count_off);
            if (n == 0) {
                fprintf(out, " []\n");
                break;
            }
            fprintf(out, "\n");
            for (int i = 0; i < n; i++) {
                const char *e = p + (size_t)i * f->size;
                if (f->type == T_INT_LIST)
                    fprintf(out, "%*s- %lld\n", indent + 2, "", *(const long long *)e);
                else if (f->type == T_STR_LIST)
                    fprintf(out, "%*s- \"%s\"\n", indent + 2, "", e);
                else {
                    fprintf(out, "%*s-\n", indent + 2, "");
                    dump_fields(f->sub, e, out, indent + 4);
                }
            }
            break;
        }
        }
    }
}

void config_dump(const struct config *c, FILE *out)
{
    fprintf(out, "# effective config from %s\n", c->source);
    dump_fields(config_root_fields, c, out, 0);
}

/* ---- helpers ------------------------------------------------------------------- */

static void collect_paths(const struct field *fields, const char *prefix, const char **out, int *n,
                          char (*store)[96])
{
    for (const struct field *f = fields; f->key; f++) {
        snprintf(store[*n], 96, "%s%s%s%s", prefix, *prefix ? "." : "", f->key,
                 f->type == T_MAP_LIST ? "[]" : "");
        out[*n] = store[*n];
        (*n)++;
        if (f->sub) collect_paths(f->sub, store[*n - 1], out, n, store);
    }
}

const char *const *config_key_paths(void)
{
    static const char *paths[64];
    static char store[64][96];
    static int done;
    if (!done) {
        int n = 0;
        collect_paths(config_root_fields, "", paths, &n, store);
        paths[n] = NULL;
        done = 1;
    }
    return paths;
}

const char *config_backend_name(int backend)
{
    return backend >= 0 && backend <= CONFIG_BACKEND_AUTO ? backend_names[backend] : "?";
}
