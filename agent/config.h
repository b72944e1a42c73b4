/*
 * config.h: the agent's configuration, loaded from YAML by a strict, table-driven
 * loader. One table (config.c) drives parsing, validation, defaults, the dump of the
 * effective config and the documentation test.
 */
#ifndef AGENT_CONFIG_H
#define AGENT_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#define CONFIG_NAME_MAX 64
#define CONFIG_POD_MAX 254  /* node.name: a pod's name, a DNS subdomain of up to 253 */
#define CONFIG_PATH_MAX 108 /* sun_path */
#define CONFIG_MAX_IDS 32
#define CONFIG_MAX_GROUPS 64
#define CONFIG_MAX_DEVICES 16
#define CONFIG_MAX_PEERS 64
/* a DNS name (253) with its port, ":65535" (issue 41: a 53-character release name made
 * the chart's coordinator longer than the 127 bytes before) */
#define CONFIG_ADDR_MAX 260
#define CONFIG_DEFAULT_SOCKET "/tmp/coll-agent.sock"

enum config_backend { CONFIG_BACKEND_HOST = 0, CONFIG_BACKEND_NCCL, CONFIG_BACKEND_AUTO };
enum config_discovery { CONFIG_DISCOVERY_STATIC = 0, CONFIG_DISCOVERY_KUBERNETES };
#define CONFIG_INDEX_AUTO (-1) /* node.index: auto (identity.c resolves it) */

struct group_config {
    char name[CONFIG_NAME_MAX];
    int backend;
    int members;
    int local_slots;
    char devices[CONFIG_MAX_DEVICES][CONFIG_NAME_MAX];
    int ndevices;
    int op_timeout_ms;
    int join_timeout_ms;
    int heartbeat_ms;
    int line, column; /* where the group was declared, for messages */
};

struct config {
    char source[256];
    struct {
        char socket[CONFIG_PATH_MAX];
        int socket_mode;
        long long allowed_uids[CONFIG_MAX_IDS];
        int nallowed_uids;
        long long allowed_gids[CONFIG_MAX_IDS];
        int nallowed_gids;
        int log_level;
        int log_format;
        int spin_us;
        int direct_ops; /* lend host groups' connections to their one client (WIRE_LEASE) */
        int max_sessions;
        int handshake_timeout_ms;
        int drain_ms; /* SIGTERM: how long ops in flight may finish before the agent stops */
    } agent;
    struct {
        int index; /* CONFIG_INDEX_AUTO until identity_resolve */
        char name[CONFIG_POD_MAX];
        char uid[CONFIG_NAME_MAX];         /* the pod's UID (downward API), "" if unknown */
        char labels_file[CONFIG_PATH_MAX]; /* the pod's labels (downward API) */
        int pods_per_job;                  /* JobSet: pods of each child Job */
        char tcp_congestion[16];       /* data connections' congestion control ("": the node's) */
        int tcp_buffer_bytes;          /* their SO_SNDBUF/SO_RCVBUF (0: the kernel's autotuning) */
        char address[CONFIG_ADDR_MAX]; /* advertised for the data plane */
        int data_port;                 /* 0: any free port */
    } node;
    struct {
        int mode;
        char coordinator[CONFIG_ADDR_MAX]; /* host:port of node 0's rendezvous; "": peers[0] */
        char service[CONFIG_ADDR_MAX];     /* kubernetes: the headless service's name */
        int resolve_ms;                    /* how long DNS may say NXDOMAIN before a warning */
        char peers[CONFIG_MAX_PEERS][CONFIG_ADDR_MAX];
        int npeers;
    } discovery;
    struct {
        char keys[CONFIG_PATH_MAX]; /* directory of the CURVE key files; "": none */
        char seed[CONFIG_PATH_MAX]; /* a file the keys derive from (sec_seed_keys); "": none */
        int require_keys;           /* 1: refuse to start without keys */
        int insecure;               /* 1: may listen beyond loopback without keys (development) */
        int data; /* the data connections' records (seal.h: SEAL_NONE, _MAC, _ENCRYPT) */
    } security;
    struct {
        char address[CONFIG_ADDR_MAX]; /* the operational endpoints' address */
        int port;                      /* 0: off */
    } http;
    struct group_config groups[CONFIG_MAX_GROUPS];
    int ngroups;
};

/* A new config holding every default. Caller owns it; NULL when out of memory. */
struct config *config_new(void);
void config_free(struct config **c);

/*
 * Load YAML text into c (which must come from config_new). name is used in messages
 * ("file:line:col: key.path: problem"). Returns 0, or -1 with *err set to one line per
 * problem (malloc'd, caller frees). Unset ${VAR} references are errors.
 */
int config_load_string(struct config *c, const char *text, size_t len, const char *name,
                       char **err);
int config_load_file(struct config *c, const char *path, char **err);

/* Write the effective config as YAML. */
void config_dump(const struct config *c, FILE *out);

/* The embedded default config (config/default.yaml). */
extern const char config_default_yaml[];

/* Every documented key path ("agent.socket", "groups[].timeouts.op_ms", ...), for the
 * documentation test; NULL-terminated, static. */
const char *const *config_key_paths(void);

const char *config_backend_name(int backend);
/* node 0's rendezvous address: discovery.coordinator, else discovery.peers[0], else "". */
const char *config_coordinator(const struct config *c);
/* Whether some group spans several pods (then the node index matters). */
int config_multi_pod(const struct config *c);
struct group_config *config_find_group(struct config *c, const char *name);

#endif
