/*
 * net_discovery.c: what the net thread says about a group that has not formed: which
 * node indexes it waits for, against which pod addresses DNS shows for the headless
 * service (dns.h). The summary is logged at info whenever it changes and kept in the
 * group (g->discovery) for the health endpoints.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "dns.h"
#include "net_priv.h"

#define REPORT_NS (500 * NS_PER_MS)

/* The IPv4 address (network order) of a data address "ip:port", or 0. */
static uint32_t ip_of(const char *data_addr)
{
    struct sockaddr_in sa;
    return rdv_addr_parse(data_addr, &sa) == 0 ? sa.sin_addr.s_addr : 0;
}

static int listed(const uint32_t *a, int n, uint32_t ip)
{
    for (int i = 0; i < n; i++)
        if (a[i] == ip) return 1;
    return 0;
}

/* Build g's summary into out. */
static void summarise(struct net *n, struct ngroup *g, const uint32_t *dns, int ndns, int dns_gen,
                      int dns_failing, char *out, size_t cap)
{
    const struct rendezvous *r = &g->rdv;
    size_t k = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (k < cap) k += (size_t)snprintf(out + k, cap - k, __VA_ARGS__);                         \
    } while (0)
    if (r->formed) {
        PUT("formed (epoch %u)", r->epoch);
    } else if (g->me == 0) {
        int w = 0;
        for (int i = 1; i < g->nodes; i++)
            if (!r->peers[i].present) {
                if (w < 16) PUT("%s%d", w ? "," : "waiting for node indexes ", i);
                w++;
            }
        if (w > 16) PUT(",... (%d in all)", w);
        if (!w) PUT("every node joined; connecting (epoch %u)", r->epoch);
    } else if (!r->committed && r->last_reject[0]) {
        PUT("refused by the coordinator: %s", r->last_reject); /* what to fix */
    } else {
        PUT(r->committed ? "connecting (epoch %u)" : "waiting for the coordinator's commit",
            r->epoch);
    }
    if (!n->dns) return;
    if (!dns_gen) {
        PUT("; DNS shows no pod yet%s", dns_failing ? " (the name does not resolve)" : "");
        return;
    }
    PUT("; DNS shows %d of %d pods", ndns, g->nodes);
    if (g->me != 0 || r->formed) return;
    /* pods DNS shows that have not joined: the ones to look at first */
    uint32_t have[RDV_MAX_NODES];
    int nh = 0;
    have[nh++] = ip_of(n->data_addr);
    for (int i = 1; i < g->nodes; i++)
        if (r->peers[i].present) have[nh++] = ip_of(r->peers[i].join.data_addr);
    int shown = 0;
    for (int i = 0; i < ndns && shown < 8; i++) {
        if (listed(have, nh, dns[i])) continue;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &dns[i], ip, sizeof(ip));
        PUT("%s%s", shown++ ? "," : " (not joined: ", ip);
    }
    if (shown) PUT(")");
#undef PUT
}

void net_discovery_tick(struct net *n, int64_t now)
{
    if (now < n->next_report) return;
    n->next_report = now + REPORT_NS;
    static uint32_t dns[DNS_MAX_ADDRS]; /* the net thread's */
    int ndns = 0, failing = 0;
    uint64_t gen = n->dns ? dns_watch_get(n->dns, dns, DNS_MAX_ADDRS, &ndns, &failing) : 0;
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        if (!g) continue;
        char s[sizeof(g->discovery)];
        summarise(n, g, dns, ndns, gen != 0, failing, s, sizeof(s));
        int joined = -1;
        if (g->me == 0) {
            joined = 1;
            for (int k = 1; k < g->nodes; k++)
                joined += g->rdv.peers[k].present;
        }
        if (joined != g->joined) {
            pthread_mutex_lock(&n->out_lock);
            g->joined = joined;
            pthread_mutex_unlock(&n->out_lock);
        }
        if (strcmp(s, g->discovery) == 0) continue;
        pthread_mutex_lock(&n->out_lock); /* read by the engine's health snapshot */
        memcpy(g->discovery, s, sizeof(s));
        pthread_mutex_unlock(&n->out_lock);
        log_msg(LOG_INFO, "discovery.summary", "group=%s node=%d state=\"%s\"", g->cfg->name, g->me,
                LOG_Q(s));
    }
}

void net_group_detail(struct net *n, int index, char *out, size_t cap)
{
    out[0] = '\0';
    if (!n || index < 0 || index >= n->ngroups || !n->groups[index]) return;
    pthread_mutex_lock(&n->out_lock);
    snprintf(out, cap, "%s", n->groups[index]->discovery);
    pthread_mutex_unlock(&n->out_lock);
}

const _Atomic int64_t *net_alive(const struct net *n)
{
    return &n->alive_ns;
}

void net_group_stats(struct net *n, int index, struct net_group_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->joined = -1;
    out->cpu_shared = -1;
    if (!n || index < 0 || index >= n->ngroups || !n->groups[index]) return;
    const struct ngroup *g = n->groups[index];
    pthread_mutex_lock(&n->out_lock);
    out->joined = g->joined;
    out->rendezvous_s = g->rdv_s;
    out->formation_s = g->form_s;
    out->formations = g->formations;
    out->cpu_shared = g->pub_cpu_shared;
    pthread_mutex_unlock(&n->out_lock);
    out->early_bytes = atomic_load_explicit(&g->unx_pub, memory_order_relaxed);
}
