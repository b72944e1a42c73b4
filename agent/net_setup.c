/*
 * net_setup.c: starting and stopping the net thread (net.h): its groups, sockets,
 * keys, the discovery watch and the NCCL id thread, then the loop (net_main, net.c);
 * and taking it all down again.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <sodium.h>

#include "coll/coll.h"
#include "net_priv.h"
#include "seal.h"

#include "cpus.h"
#include "dns.h"

#define NET_SPIN_NS 200000LL /* look for the next op at most this long (spin.h) */

/* ---- setup ------------------------------------------------------------------------------ */

static int sodium_ready(char *why, size_t whylen)
{
    if (sodium_init() < 0) {
        snprintf(why, whylen, "libsodium cannot start");
        return -1;
    }
    return 0;
}

/* Where this pod runs (rdv_wire.h: struct rdv_place): the host by its boot id, which
 * every container of one kernel reads alike, and the CPUs the agent may run on, which
 * stand for the pod's (its application's spins run there or on CPUs of their own).
 * What cannot be read is left 0: not known, which the coordinator takes as shared. */
/* Whether a = "127.x.y.z": only this host reaches what listens there. */
static int loopback(const char *a)
{
    struct in_addr in;
    return inet_pton(AF_INET, a, &in) == 1 && (ntohl(in.s_addr) >> 24) == 127;
}

static void net_place(struct rdv_place *p)
{
    memset(p, 0, sizeof(*p));
    char id[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(id, sizeof(id), f)) id[0] = '\0';
        fclose(f);
    }
    size_t len = strcspn(id, "\n");
    if (len) p->host = rdv_fnv1a(id, len, RDV_FNV_INIT) | 1; /* never 0, the unknown */
    cpu_set_t mask;
    if (coll_affinity(&mask) == 0)
        for (int c = 0; c < RDV_CPUS_BYTES * 8 && c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &mask)) p->cpus[c / 8] |= (uint8_t)(1u << (c % 8));
}

struct net *net_start(const struct config *cfg, const uint8_t *gpu_group, net_commid_fn commid,
                      struct spin_gate *gate, char *why, size_t whylen)
{
    /* JOIN's identity: the pod's UID, else one of this process (a restart is a new pod) */
    char uid_buf[RDV_NAME_MAX];
    if (cfg->node.uid[0]) {
        snprintf(uid_buf, sizeof(uid_buf), "%s", cfg->node.uid);
    } else {
        uint8_t r[8];
        sec_random(r, sizeof(r));
        snprintf(uid_buf, sizeof(uid_buf), "process-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1],
                 r[2], r[3], r[4], r[5], r[6], r[7]);
    }
    why[0] = '\0';
    int any = 0;
    for (int i = 0; i < cfg->ngroups; i++)
        any |= cfg->groups[i].members > 1;
    if (!any) return NULL;
    struct net *n = calloc(1, sizeof(*n));
    if (n) n->spin_cap = coll_usable_cpus() < 2 ? 0 : NET_SPIN_NS; /* as the engine's */
    if (n) n->gate = gate;
    if (n) spin_init(&n->idle, n->spin_cap < 50000 ? (int32_t)n->spin_cap : 50000);
    if (!n) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    n->cfg = cfg;
    n->epoch = &net_epoch_calls;
    n->commid = commid;
    net_place(&n->place);
    n->lfd = n->in_efd = n->out_efd = n->engine_fd = n->knock_efd = -1;
    pthread_mutex_init(&n->in_lock, NULL);
    pthread_mutex_init(&n->out_lock, NULL);
    pthread_mutex_init(&n->coll_lock, NULL);
    n->ngroups = cfg->ngroups;
    n->groups = calloc((size_t)cfg->ngroups, sizeof(*n->groups));
    n->in_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    n->out_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    n->knock_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!n->groups || n->in_efd < 0 || n->out_efd < 0 || n->knock_efd < 0) {
        snprintf(why, whylen, "setting up the net thread: %s", strerror(errno));
        goto free_net;
    }
    /* the keys first: an agent that must not listen without them never does */
    if (sodium_ready(why, whylen) < 0) goto free_net;
    n->seal_ciphers = seal_ciphers();
    if (cfg->security.data != SEAL_NONE && !n->seal_ciphers) {
        snprintf(why, whylen, "security.data: libsodium offers no cipher here");
        goto free_net;
    }
    if (cfg->security.keys[0] && cfg->security.seed[0]) {
        snprintf(why, whylen, "security.keys and security.seed are both set: name one");
        goto free_net;
    }
    if (cfg->security.keys[0]) {
        if (sec_load_keys(cfg->security.keys, &n->keys, why, whylen) < 0) goto free_net;
    } else if (cfg->security.seed[0]) {
        if (sec_seed_keys(cfg->security.seed, &n->keys, why, whylen) < 0) goto free_net;
    } else if (cfg->security.require_keys) {
        snprintf(why, whylen,
                 "security.require_keys is true but neither security.keys nor security.seed "
                 "is set");
        goto free_net;
    } else if (!loopback(cfg->node.address) && !cfg->security.insecure) {
        /* protected mode: listening where other hosts reach it, without keys, only when
         * told so */
        snprintf(why, whylen,
                 "node.address %s is reachable from other hosts and no CURVE keys are set "
                 "(security.keys or security.seed): anyone who reaches its ports could join "
                 "the group and read and write its data. Give the deployment's keys, or set "
                 "security.insecure: true to run without them",
                 cfg->node.address);
        goto free_net;
    } else {
        log_msg(cfg->security.insecure ? LOG_ERROR : LOG_WARN, "security.unauthenticated",
                "address=%s insecure=%d detail=\"no CURVE keys (security.keys, security.seed): "
                "anyone who reaches the rendezvous port can join, and COMMIT with each epoch's "
                "data-plane secret travels in clear; for development only\"",
                cfg->node.address, cfg->security.insecure);
    }
    if (dataconn_bind(n, why, whylen) < 0) goto free_net;
    for (int i = 0; i < cfg->ngroups; i++) {
        const struct group_config *gc = &cfg->groups[i];
        if (gc->members <= 1) continue;
        struct ngroup *g = calloc(1, sizeof(*g));
        if (!g) goto free_net;
        g->cfg = gc;
        g->index = i;
        g->nodes = gc->members;
        g->me = cfg->node.index;
        g->nlocal = gc->local_slots;
        g->pub_cpu_shared = -1;
        for (int k = 0; k < RDV_MAX_NODES; k++)
            spin_init(&g->spin[k], TCP_SPIN_START_NS);
        g->gpu = gpu_group && gpu_group[i];
        g->tiny = malloc(tcp_tiny_size());
        g->acks = tcp_acks_new(g->nodes);
        g->tune = tcp_tune_new();
        if (g->nodes <= TCP_EAGER_ALL) g->stash = calloc((size_t)g->nodes, sizeof(*g->stash));
        if (!g->tiny || !g->acks || !g->tune || (g->nodes <= TCP_EAGER_ALL && !g->stash)) {
            free(g->tiny);
            free(g->acks);
            free(g->tune);
            free(g->stash);
            free(g);
            goto free_net;
        }
        g->name_hash = rdv_fnv1a(gc->name, strlen(gc->name), RDV_FNV_INIT);
        g->seal_mode = cfg->security.data;
        g->seal_io = (struct tcp_io){dataconn_seal_send, dataconn_seal_recv, g};
        for (int k = 0; k < EV_POOL; k++) {
            g->evpool[k].next = g->evfree;
            g->evfree = &g->evpool[k];
        }
        for (int k = 0; k < RDV_MAX_NODES; k++)
            g->fds[k] = g->rfds[k] = g->pfds[k] = -1;
        n->groups[i] = g;
        if (!n->uid[0]) snprintf(n->uid, sizeof(n->uid), "%s", uid_buf);
        net_epoch_group_init(n, g);
    }
    if (net_epoch_open(n, why, whylen) < 0) goto free_net;
    /* the coordinator of a GPU group across pods: its ids come from a thread of their own */
    int ids = 0;
    for (int i = 0; i < n->ngroups; i++)
        ids |= n->groups[i] && n->groups[i]->gpu && n->groups[i]->me == 0;
    if (ids && n->commid && !(n->ids = net_commid_start(n->commid, n->in_efd, why, whylen)))
        goto free_net;
    if (cfg->discovery.service[0] &&
        !(n->dns = dns_watch_start(cfg->discovery.service, cfg->discovery.resolve_ms, 2000, why,
                                   whylen)))
        goto free_net;
    atomic_store(&n->alive_ns, now_ns()); /* /livez: turning from the start */
    if (pthread_create(&n->thread, NULL, net_main, n) != 0) {
        snprintf(why, whylen, "cannot start the net thread");
        goto free_net;
    }
    n->started = 1;
    return n;
free_net:
    net_free(&n);
    if (!why[0]) snprintf(why, whylen, "out of memory");
    return NULL;
}

void net_stop(struct net *n)
{
    if (n && n->started) {
        atomic_store(&n->stop, 1);
        pthread_join(n->thread, NULL);
        n->started = 0;
    }
}

void net_free(struct net **np)
{
    if (!np || !*np) return;
    struct net *n = *np;
    *np = NULL;
    net_stop(n);
    net_commid_stop(&n->ids);
    dns_watch_stop(&n->dns);
    /* events the engine did not collect (pool ones live in their groups) */
    struct net_event *e = n->ev_head;
    while (e) {
        struct net_event *x = e->next;
        if (e->heap) free(e);
        e = x;
    }
    for (int i = 0; i < n->ngroups; i++) {
        if (!n->groups || !n->groups[i]) continue;
        dataconn_close(n->groups[i]);
        dataconn_close_grave(n->groups[i]);
        p2p_free(n->groups[i]);
        uint64_t learnt = 0, shrt = 0;
        if (n->groups[i]->tune) tcp_tune_counts(n->groups[i]->tune, &learnt, &shrt);
        if (learnt + shrt)
            log_msg(LOG_INFO, "net.spin", "group=%s ops_learnt_spin=%llu ops_short_spin=%llu",
                    n->groups[i]->cfg->name, (unsigned long long)learnt, (unsigned long long)shrt);
        free(n->groups[i]->tiny);
        free(n->groups[i]->acks);
        free(n->groups[i]->stash);
        free(n->groups[i]->tune);
        free(n->groups[i]->scratch.p[0]);
        free(n->groups[i]->scratch.p[1]);
        free(n->groups[i]);
    }
    free(n->groups);
    dataconn_free(n);
    if (n->inline_n)
        log_msg(LOG_INFO, "net.inline", "ops=%lld mean_us=%.1f", (long long)n->inline_n,
                (double)n->inline_ns / (double)n->inline_n / 1000.0);
    net_epoch_close(n);
    if (n->in_efd >= 0) close(n->in_efd);
    if (n->knock_efd >= 0) close(n->knock_efd);
    /* tasks the engine did not collect are its own memory */
    if (n->out_efd >= 0) close(n->out_efd);
    pthread_mutex_destroy(&n->in_lock);
    pthread_mutex_destroy(&n->out_lock);
    pthread_mutex_destroy(&n->coll_lock);
    free(n);
}
