/*
 * main.c: argv, signals and exit codes of coll-agent; everything else lives in the
 * modules. Exit status: 0 clean stop, 1 runtime failure, 2 bad config or usage.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "coll/coll.h"
#include "config.h"
#include "identity.h"
#include "engine.h"
#include "log.h"
#include "rdv_wire.h"
#include "security.h"
#include "wire.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: coll-agent [--config FILE] [--check-config FILE] [--version] [--help]\n"
                 "       coll-agent keygen DIR\n"
                 "\n"
                 "  keygen DIR               make the CURVE key files of a deployment in DIR\n"
                 "                           (server.pub, server.key, client.pub, client.key;\n"
                 "                           security.keys names DIR; never overwrites)\n"
                 "  -c, --config FILE        load FILE (YAML); without it the embedded default\n"
                 "                           config is used (one pod, group 'demo', 4 slots)\n"
                 "  -k, --check-config FILE  validate FILE, print the effective config, exit\n"
                 "  -V, --version            print the version and exit\n"
                 "  -h, --help               this text\n"
                 "\n"
                 "Exit status: 0 stopped cleanly, 1 failed at run time, 2 bad config or usage.\n"
                 "Config keys: config/README.md. Logs: one line per event on stderr.\n");
}

static struct config *load(const char *path)
{
    struct config *c = config_new();
    if (!c) {
        fprintf(stderr, "coll-agent: out of memory\n");
        return NULL;
    }
    char *err = NULL;
    int rc = path ? config_load_file(c, path, &err)
                  : config_load_string(c, config_default_yaml, strlen(config_default_yaml),
                                       "<embedded default>", &err);
    if (rc < 0) {
        fputs(err ? err : "config: unknown error\n", stderr);
        free(err);
        config_free(&c);
        return NULL;
    }
    free(err);
    return c;
}

/* Descriptors: a server's soft limit is often 1024; the agent holds sessions, data
 * connections and up to 1024 HTTP connections (http.c), so it takes what the hard limit
 * allows (at most 65536). */
static void raise_fd_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
    rlim_t want = r.rlim_max < 65536 ? r.rlim_max : 65536;
    if (r.rlim_cur < want) {
        r.rlim_cur = want;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", required_argument, NULL, 'k'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    if (argc >= 2 && strcmp(argv[1], "keygen") == 0) {
        if (argc != 3) {
            usage(stderr);
            return 2;
        }
        char why[600];
        if (sec_keygen(argv[2], why, sizeof(why)) < 0) {
            fprintf(stderr, "coll-agent keygen: %s\n", why);
            return 1;
        }
        printf("CURVE keys written to %s (give every pod of the deployment the same four "
               "files, e.g. as a Kubernetes Secret)\n",
               argv[2]);
        return 0;
    }
    const char *config_path = NULL, *check_path = NULL;
    int o;
    while ((o = getopt_long(argc, argv, "c:k:Vh", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            config_path = optarg;
            break;
        case 'k':
            check_path = optarg;
            break;
        case 'V':
            /* both protocols a peer must speak: libcoll's (local plane) and the agents' */
            printf("coll-agent %s (local protocol %d, agent protocol %d)\n", coll_version(),
                   WIRE_VERSION, RDV_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "coll-agent: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    struct identity id;
    char why[512];
    if (check_path) {
        struct config *c = load(check_path);
        if (!c) return 2;
        if (identity_resolve(c, NULL, &id, why, sizeof(why)) < 0) {
            fprintf(stderr, "%s: %s\n", check_path, why);
            config_free(&c);
            return 2;
        }
        printf("# node.index %d, from %s\n", id.index, id.source);
        config_dump(c, stdout);
        config_free(&c);
        return 0;
    }
    struct config *cfg = load(config_path);
    if (!cfg) return 2;
    raise_fd_limit();
    log_setup((enum log_level)cfg->agent.log_level, (enum log_format)cfg->agent.log_format);
    if (identity_resolve(cfg, NULL, &id, why, sizeof(why)) < 0) {
        log_msg(LOG_ERROR, "agent.identity", "config=\"%s\" error=\"%s\"", cfg->source, why);
        config_free(&cfg);
        return 2;
    }

    /* signals arrive through the server's signalfd */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    log_msg(LOG_INFO, "agent.start",
            "version=%s config=\"%s\" pid=%d node=%d index_from=\"%s\" uid=%s", coll_version(),
            cfg->source, (int)getpid(), cfg->node.index, id.source,
            cfg->node.uid[0] ? cfg->node.uid : "-");
    struct engine eng;
    int rc = engine_init(&eng, cfg);
    if (rc == 0) rc = engine_run(&eng);
    engine_fini(&eng);
    config_free(&cfg);
    return rc == 0 ? 0 : 1;
}
