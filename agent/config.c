/*
 * config.c: the strict YAML loader. libyaml builds the node tree; the schema
 * (config_schema.c) says, for every key, its type, range, default and where it lands
 * in struct config. Errors carry file:line:column and the key path, and loading goes on past
 * an error so that one run reports every problem.
 */
#include "config.h"
#include "config_priv.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* Bounds on what a config file may make the loader do: whatever the file, loading takes
 * milliseconds and a few MB, and reports a clear file:line:col error. */
#define CONFIG_MAX_BYTES (1u << 20) /* a config is a few KiB; 1 MiB is generous */
#define CONFIG_MAX_DEPTH 32         /* nesting of lists and mappings */
#define CONFIG_MAX_ALIASES 64       /* *alias references */
#define CONFIG_MAX_ERRORS 50        /* reported; the rest are counted */

/* ---- error collection ------------------------------------------------------ */

struct loader {
    const char *name;
    yaml_document_t *doc;
    char *err;
    size_t errlen, errcap;
    int nerr;
    int more; /* errors past CONFIG_MAX_ERRORS, counted only */
};

static void add_error(struct loader *ld, const yaml_mark_t *mark, const char *path, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));

static void add_error(struct loader *ld, const yaml_mark_t *mark, const char *path, const char *fmt,
                      ...)
{
    if (ld->nerr >= CONFIG_MAX_ERRORS) {
        ld->more++;
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    char line[800];
    int n;
    if (mark)
        n = snprintf(line, sizeof(line), "%s:%zu:%zu: %s%s%s\n", ld->name, mark->line + 1,
                     mark->column + 1, path ? path : "", path && *path ? ": " : "", msg);
    else
        n = snprintf(line, sizeof(line), "%s: %s%s%s\n", ld->name, path ? path : "",
                     path && *path ? ": " : "", msg);
    if (n < 0) return;
    if ((size_t)n >= sizeof(line)) n = sizeof(line) - 1;
    if (ld->errlen + (size_t)n + 1 > ld->errcap) {
        size_t cap = ld->errcap ? ld->errcap * 2 : 1024;
        while (cap < ld->errlen + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(ld->err, cap);
        if (!p) return;
        ld->err = p;
        ld->errcap = cap;
    }
    memcpy(ld->err + ld->errlen, line, (size_t)n);
    ld->errlen += (size_t)n;
    ld->err[ld->errlen] = '\0';
    ld->nerr++;
}

/* ---- scalar handling -------------------------------------------------------- */

/* Expand ${VAR}, ${VAR:-default} and $$ in s into out. Returns 0 or -1 with *bad set
 * to the name of the unset variable (or "" for a malformed reference). */
static int expand_env(const char *s, char *out, size_t cap, char *bad, size_t badcap)
{
    size_t o = 0;
    for (const char *p = s; *p;) {
        if (p[0] == '$' && p[1] == '$') {
            if (o + 1 >= cap) goto toolong;
            out[o++] = '$';
            p += 2;
            continue;
        }
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p + 2, '}');
            if (!end) {
                snprintf(bad, badcap, "unterminated ${ in '%s'", s);
                return -1;
            }
            char var[128];
            size_t vlen = (size_t)(end - (p + 2));
            if (vlen == 0 || vlen >= sizeof(var)) {
                snprintf(bad, badcap, "malformed variable reference in '%s'", s);
                return -1;
            }
            memcpy(var, p + 2, vlen);
            var[vlen] = '\0';
            const char *def = NULL;
            char *colon = strstr(var, ":-");
            if (colon) {
                *colon = '\0';
                def = colon + 2;
            }
            for (const char *q = var; *q; q++) {
                if (!(isalnum((unsigned char)*q) || *q == '_')) {
                    snprintf(bad, badcap, "malformed variable name '%s'", var);
                    return -1;
                }
            }
            const char *val = getenv(var);
            if (!val || (def && !*val)) val = def;
            if (!val) {
                snprintf(bad, badcap, "environment variable %s is not set", var);
                return -1;
            }
            size_t l = strlen(val);
            if (o + l >= cap) goto toolong;
            memcpy(out + o, val, l);
            o += l;
            p = end + 1;
            continue;
        }
        if (o + 1 >= cap) goto toolong;
        out[o++] = *p++;
    }
    out[o] = '\0';
    return 0;
toolong:
    snprintf(bad, badcap, "value is longer than %zu bytes after expansion", cap - 1);
    return -1;
}

static const char *type_word(yaml_node_type_t t)
{
    switch (t) {
    case YAML_SCALAR_NODE:
        return "a scalar";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_MAPPING_NODE:
        return "a mapping";
    default:
        return "nothing";
    }
}

/* The expanded text of a scalar node, or NULL after reporting an error. */
static const char *scalar_text(struct loader *ld, yaml_node_t *n, const char *path,
                               const char *what, char *buf, size_t cap)
{
    if (n->type != YAML_SCALAR_NODE) {
        add_error(ld, &n->start_mark, path, "expected %s, got %s", what, type_word(n->type));
        return NULL;
    }
    char bad[256];
    if (expand_env((const char *)n->data.scalar.value, buf, cap, bad, sizeof(bad)) < 0) {
        add_error(ld, &n->start_mark, path, "%s", bad);
        return NULL;
    }
    return buf;
}

static int parse_int(struct loader *ld, yaml_node_t *n, const char *path, long long min,
                     long long max, long long *out)
{
    char buf[256];
    const char *s = scalar_text(ld, n, path, "an integer", buf, sizeof(buf));
    if (!s) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (!*s || *end || errno) {
        add_error(ld, &n->start_mark, path, "expected an integer, got '%s'", s);
        return -1;
    }
    if (v < min || v > max) {
        add_error(ld, &n->start_mark, path, "value %lld is out of range [%lld, %lld]", v, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_str(struct loader *ld, yaml_node_t *n, const char *path, char *dst, size_t cap)
{
    char buf[1024];
    const char *s = scalar_text(ld, n, path, "a string", buf, sizeof(buf));
    if (!s) return -1;
    if (strlen(s) >= cap) {
        add_error(ld, &n->start_mark, path, "value is longer than %zu bytes", cap - 1);
        return -1;
    }
    strcpy(dst, s);
    return 0;
}

static int parse_enum(struct loader *ld, yaml_node_t *n, const char *path, const char *const *names,
                      int *out)
{
    char buf[256];
    const char *s = scalar_text(ld, n, path, "a word", buf, sizeof(buf));
    if (!s) return -1;
    for (int i = 0; names[i]; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    char list[256] = "";
    for (int i = 0; names[i]; i++) {
        strncat(list, i ? ", " : "", sizeof(list) - strlen(list) - 1);
        strncat(list, names[i], sizeof(list) - strlen(list) - 1);
    }
    add_error(ld, &n->start_mark, path, "expected one of %s; got '%s'", list, s);
    return -1;
}

/* ---- the walker -------------------------------------------------------------- */

static void apply_defaults(const struct field *fields, void *base);
static void load_map(struct loader *ld, yaml_node_t *map, const struct field *fields, void *base,
                     const char *path);

static void set_default(const struct field *f, void *base)
{
    char *p = (char *)base + f->off;
    switch (f->type) {
    case T_STR:
        if (f->def) {
            char bad[128];
            if (expand_env(f->def, p, f->size, bad, sizeof(bad)) < 0) p[0] = '\0';
        }
        break;
    case T_INT:
        if (f->def) *(int *)p = (int)strtol(f->def, NULL, 0);
        for (int i = 0; f->def && f->enums && f->enums[i]; i++)
            if (strcmp(f->enums[i], f->def) == 0) *(int *)p = -1 - i;
        break;
    case T_ENUM:
        if (f->def)
            for (int i = 0; f->enums[i]; i++)
                if (strcmp(f->enums[i], f->def) == 0) *(int *)p = i;
        break;
    case T_MAP:
        apply_defaults(f->sub, base);
        break;
    default:
        break;
    }
}

static void apply_defaults(const struct field *fields, void *base)
{
    for (const struct field *f = fields; f->key; f++)
        set_default(f, base);
}

static void child_path(char *out, size_t cap, const char *path, const char *key)
{
    snprintf(out, cap, "%s%s%s", path, *path ? "." : "", key);
}

static void load_field(struct loader *ld, const struct field *f, yaml_node_t *v, void *base,
                       const char *path)
{
    char *p = (char *)base + f->off;
    long long iv;
    switch (f->type) {
    case T_STR:
        parse_str(ld, v, path, p, f->size);
        break;
    case T_INT:
        if (f->enums && v->type == YAML_SCALAR_NODE) { /* a keyword instead of a number */
            char buf[64];
            const char *w = scalar_text(ld, v, path, "an integer", buf, sizeof(buf));
            if (!w) break;
            int k = -1;
            for (int i = 0; f->enums[i]; i++)
                if (strcmp(f->enums[i], w) == 0) k = i;
            if (k >= 0) {
                *(int *)p = -1 - k;
                break;
            }
        }
        if (parse_int(ld, v, path, f->min, f->max, &iv) == 0) *(int *)p = (int)iv;
        break;
    case T_ENUM:
        parse_enum(ld, v, path, f->enums, (int *)p);
        break;
    case T_MAP:
        if (v->type != YAML_MAPPING_NODE) {
            add_error(ld, &v->start_mark, path, "expected a mapping, got %s", type_word(v->type));
            break;
        }
        load_map(ld, v, f->sub, base, path);
        break;
    case T_INT_LIST:
    case T_STR_LIST:
    case T_MAP_LIST: {
        int *count = (int *)((char *)base + f->count_off);
        if (v->type != YAML_SEQUENCE_NODE) {
            add_error(ld, &v->start_mark, path, "expected a list, got %s", type_word(v->type));
            break;
        }
        *count = 0;
        int i = 0;
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
             it++, i++) {
            yaml_node_t *item = yaml_document_get_node(ld->doc, *it);
            char ipath[280];
            snprintf(ipath, sizeof(ipath), "%.240s[%d]", path, i);
            if (i >= f->cap) {
                add_error(ld, &item->start_mark, ipath, "list holds more than %d items", f->cap);
                break;
            }
            char *elem = p + (size_t)i * f->size;
            if (f->type == T_INT_LIST) {
                if (parse_int(ld, item, ipath, f->min, f->max, &iv) == 0) *(long long *)elem = iv;
            } else if (f->type == T_STR_LIST) {
                parse_str(ld, item, ipath, elem, f->size);
            } else {
                memset(elem, 0, f->size);
                apply_defaults(f->sub, elem);
                if (item->type != YAML_MAPPING_NODE) {
                    add_error(ld, &item->start_mark, ipath, "expected a mapping, got %s",
                              type_word(item->type));
                } else {
                    struct group_config *g = (struct group_config *)elem;
                    g->line = (int)item->start_mark.line + 1;
                    g->column = (int)item->start_mark.column + 1;
                    load_map(ld, item, f->sub, elem, ipath);
                }
            }
            *count = i + 1;
        }
        break;
    }
    }
}

static void load_map(struct loader *ld, yaml_node_t *map, const struct field *fields, void *base,
                     const char *path)
{
    unsigned char seen[32] = {0};
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = yaml_document_get_node(ld->doc, pr->key);
        yaml_node_t *v = yaml_document_get_node(ld->doc, pr->value);
        if (k->type != YAML_SCALAR_NODE) {
            add_error(ld, &k->start_mark, path, "keys must be plain words, got %s",
                      type_word(k->type));
            continue;
        }
        const char *key = (const char *)k->data.scalar.value;
        char kpath[256];
        child_path(kpath, sizeof(kpath), path, key);
        const struct field *f = fields;
        int idx = 0;
        for (; f->key; f++, idx++)
            if (strcmp(f->key, key) == 0) break;
        if (!f->key) {
            char known[256] = "";
            for (const struct field *g = fields; g->key; g++) {
                strncat(known, g == fields ? "" : ", ", sizeof(known) - strlen(known) - 1);
                strncat(known, g->key, sizeof(known) - strlen(known) - 1);
            }
            add_error(ld, &k->start_mark, kpath, "unknown key '%s' (known here: %s)", key, known);
            continue;
        }
        if (seen[idx]) {
            add_error(ld, &k->start_mark, kpath, "duplicate key '%s'", key);
            continue;
        }
        seen[idx] = 1;
        load_field(ld, f, v, base, kpath);
    }
    int idx = 0;
    for (const struct field *f = fields; f->key; f++, idx++)
        if (f->required && !seen[idx])
            add_error(ld, &map->start_mark, path, "missing required key '%s'", f->key);
}

/* ---- checks across keys ------------------------------------------------------ */

/* "host:port" with a port in 1..65535 and a non-empty host. */
static int host_port(const char *a)
{
    const char *colon = strrchr(a, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    return colon && colon != a && end && !*end && port >= 1 && port <= 65535;
}

static void check_semantics(struct loader *ld, struct config *c)
{
    for (int i = 0; i < c->ngroups; i++) {
        struct group_config *g = &c->groups[i];
        yaml_mark_t m = {.line = (size_t)(g->line - 1), .column = (size_t)(g->column - 1)};
        char path[64];
        snprintf(path, sizeof(path), "groups[%d]", i);
        if (!g->name[0]) continue; /* already reported as missing */
        for (const char *p = g->name; *p; p++) {
            if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '_' || *p == '.')) {
                add_error(ld, &m, path,
                          "group name '%s' may hold only letters, digits, '-', '_' and '.'",
                          g->name);
                break;
            }
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(c->groups[j].name, g->name) == 0) {
                add_error(ld, &m, path, "duplicate group name '%s' (first declared at line %d)",
                          g->name, c->groups[j].line);
                break;
            }
        }
        if (g->ndevices && g->local_slots && g->local_slots != g->ndevices)
            add_error(ld, &m, path, "local_slots is %d but devices lists %d entries",
                      g->local_slots, g->ndevices);
        if (!g->local_slots) g->local_slots = g->ndevices ? g->ndevices : 1;
        if (g->members > 1 && !config_coordinator(c)[0])
            add_error(ld, &m, path,
                      "members is %d, so discovery.coordinator (or discovery.peers[0]) must be "
                      "node 0's rendezvous address",
                      g->members);
        if (c->node.index >= 0 && g->members > 1 && c->node.index >= g->members)
            add_error(ld, &m, path, "node.index %d is not a member (members: %d)", c->node.index,
                      g->members);
    }
    if (!c->agent.socket[0]) add_error(ld, NULL, "agent.socket", "must not be empty");
    for (const char *p = c->node.tcp_congestion; *p; p++) {
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '_')) {
            add_error(ld, NULL, "node.tcp_congestion",
                      "'%s' is not a congestion control's name (lower-case letters, digits, '_')",
                      c->node.tcp_congestion);
            break;
        }
    }
    if (c->discovery.coordinator[0] && !host_port(c->discovery.coordinator))
        add_error(ld, NULL, "discovery.coordinator", "'%s' is not host:port",
                  c->discovery.coordinator);
    if (c->discovery.mode == CONFIG_DISCOVERY_KUBERNETES && config_multi_pod(c) &&
        !c->discovery.coordinator[0])
        add_error(ld, NULL, "discovery.coordinator",
                  "discovery.mode is kubernetes: name node 0's rendezvous address (its pod's DNS "
                  "name through the headless service, with the port)");
    for (int i = 0; i < c->discovery.npeers; i++) {
        if (!host_port(c->discovery.peers[i])) {
            char path[64];
            snprintf(path, sizeof(path), "discovery.peers[%d]", i);
            add_error(ld, NULL, path, "'%s' is not host:port", c->discovery.peers[i]);
        }
    }
}

/* ---- entry points ------------------------------------------------------------ */

const char *config_coordinator(const struct config *c)
{
    if (c->discovery.coordinator[0]) return c->discovery.coordinator;
    return c->discovery.npeers ? c->discovery.peers[0] : "";
}

int config_multi_pod(const struct config *c)
{
    for (int i = 0; i < c->ngroups; i++)
        if (c->groups[i].members > 1) return 1;
    return 0;
}

struct config *config_new(void)
{
    struct config *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    apply_defaults(config_root_fields, c);
    snprintf(c->source, sizeof(c->source), "<defaults>");
    return c;
}

void config_free(struct config **c)
{
    if (!c || !*c) return;
    free(*c);
    *c = NULL;
}

/* Past CONFIG_MAX_ERRORS, one line says how many more there were. */
static void close_errors(struct loader *ld)
{
    if (!ld->more) return;
    int more = ld->more;
    ld->more = 0;
    ld->nerr--; /* room for the summary line */
    add_error(ld, NULL, NULL, "... and %d more errors", more);
}

/*
 * One pass over the parser's events before the document is built: nesting deeper than
 * CONFIG_MAX_DEPTH and more than CONFIG_MAX_ALIASES aliases are refused (libyaml's loader
 * has no limits of its own: 200,000 nested '[' ran for minutes, and aliases multiply
 * what the walker visits and the errors it reports). Returns 0, or -1 with the error.
 */
static int check_shape(struct loader *ld, const char *text, size_t len)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        add_error(ld, NULL, NULL, "out of memory");
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int depth = 0, aliases = 0, rc = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            yaml_mark_t m = parser.problem_mark;
            add_error(ld, &m, NULL, "syntax error: %s%s%s", parser.problem ? parser.problem : "?",
                      parser.context ? " " : "", parser.context ? parser.context : "");
            rc = -1;
            break;
        }
        yaml_event_type_t t = ev.type;
        yaml_mark_t m = ev.start_mark;
        yaml_event_delete(&ev);
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > CONFIG_MAX_DEPTH) {
                add_error(ld, &m, NULL, "nested deeper than %d levels", CONFIG_MAX_DEPTH);
                rc = -1;
                break;
            }
        } else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (t == YAML_ALIAS_EVENT && ++aliases > CONFIG_MAX_ALIASES) {
            add_error(ld, &m, NULL, "more than %d aliases (*name)", CONFIG_MAX_ALIASES);
            rc = -1;
            break;
        } else if (t == YAML_STREAM_END_EVENT) {
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

int config_load_string(struct config *c, const char *text, size_t len, const char *name, char **err)
{
    struct loader ld = {.name = name};
    yaml_parser_t parser;
    yaml_document_t doc;
    *err = NULL;
    snprintf(c->source, sizeof(c->source), "%s", name);
    if (len > CONFIG_MAX_BYTES) {
        add_error(&ld, NULL, NULL, "%zu bytes; a config may hold at most %u", len,
                  CONFIG_MAX_BYTES);
        *err = ld.err;
        return -1;
    }
    if (check_shape(&ld, text, len) < 0) {
        *err = ld.err;
        return -1;
    }
    if (!yaml_parser_initialize(&parser)) {
        add_error(&ld, NULL, NULL, "out of memory");
        *err = ld.err;
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_mark_t m = parser.problem_mark;
        add_error(&ld, &m, NULL, "syntax error: %s%s%s", parser.problem ? parser.problem : "?",
                  parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        *err = ld.err;
        return -1;
    }
    ld.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        add_error(&ld, NULL, NULL, "the document is empty");
    } else if (root->type != YAML_MAPPING_NODE) {
        add_error(&ld, &root->start_mark, NULL, "the top level must be a mapping, got %s",
                  type_word(root->type));
    } else {
        load_map(&ld, root, config_root_fields, c, "");
        if (ld.nerr == 0) check_semantics(&ld, c);
    }
    /* a second document would be silently ignored: refuse it */
    yaml_document_t extra;
    if (ld.nerr == 0 && yaml_parser_load(&parser, &extra)) {
        if (yaml_document_get_root_node(&extra))
            add_error(&ld, &extra.start_mark, NULL, "only one YAML document is allowed");
        yaml_document_delete(&extra);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    close_errors(&ld);
    *err = ld.err;
    return ld.nerr ? -1 : 0;
}

int config_load_file(struct config *c, const char *path, char **err)
{
    *err = NULL;
    FILE *f = fopen(path, "rb");
    char buf[600];
    struct stat st;
    if (!f) {
        snprintf(buf, sizeof(buf), "%s: cannot open: %s\n", path, strerror(errno));
        *err = strdup(buf);
        return -1;
    }
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(buf, sizeof(buf), "%s: not a regular file\n", path);
        fclose(f);
        *err = strdup(buf);
        return -1;
    }
    /* read one byte past the limit: a file that grew meanwhile is caught too */
    char *text = malloc(CONFIG_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    if (!text || rerr) {
        snprintf(buf, sizeof(buf), "%s: %s\n", path, text ? "read error" : "out of memory");
        free(text);
        *err = strdup(buf);
        return -1;
    }
    if (len > CONFIG_MAX_BYTES) {
        snprintf(buf, sizeof(buf), "%s: %lld bytes; a config may hold at most %u\n", path,
                 (long long)st.st_size, CONFIG_MAX_BYTES);
        free(text);
        *err = strdup(buf);
        return -1;
    }
    int rc = config_load_string(c, text, len, path, err);
    free(text);
    return rc;
}

struct group_config *config_find_group(struct config *c, const char *name)
{
    for (int i = 0; i < c->ngroups; i++)
        if (strcmp(c->groups[i].name, name) == 0) return &c->groups[i];
    return NULL;
}
