/*
 * dataconn.c: the data connections of the epochs: the listener, accepted connections
 * until their hello proves who they are (challenge, HMAC over our nonce with the epoch's
 * secret, the member's listed address), and our own connections to the pods of lower
 * index, set up without waiting from the net thread's poll loop. Nothing here blocks:
 * a peer that never answers is ended by the formation deadline (join_ms).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll/coll.h"
#include "net_priv.h"
#include "seal.h"

void dataconn_close_grave(struct ngroup *g)
{
    /* shut down first: a client that held them (direct ops) has its own descriptors of
     * the same sockets, and its wait on them ends here */
    for (int i = 0; i < g->ngrave; i++) {
        shutdown(g->grave[i], SHUT_RDWR);
        close(g->grave[i]);
    }
    g->ngrave = 0;
}

/* Like dataconn_close, a heartbeat interval later (see grave). */
void dataconn_bury(struct ngroup *g)
{
    dataconn_close_grave(g);
    tcp_stash_drop(g->stash, g->nodes); /* what was read ahead goes with them */
    for (int i = 0; i < g->nog; i++)
        if (g->og[i].fd >= 0) close(g->og[i].fd);
    g->nog = 0;
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        int *f[3] = {&g->fds[i], &g->rfds[i], &g->pfds[i]};
        for (int k = 0; k < 3; k++)
            if (*f[k] >= 0) {
                g->grave[g->ngrave++] = *f[k];
                *f[k] = -1;
            }
        if (g->seal_mode) dataconn_seals_free(g, i); /* no lease in that mode: nobody reads on */
    }
    g->grave_until = now_ns() + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
}

void dataconn_close(struct ngroup *g)
{
    tcp_stash_drop(g->stash, g->nodes); /* what was read ahead goes with them */
    for (int i = 0; i < g->nog; i++)
        if (g->og[i].fd >= 0) close(g->og[i].fd);
    g->nog = 0;
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        if (g->fds[i] >= 0) close(g->fds[i]);
        if (g->rfds[i] >= 0) close(g->rfds[i]);
        if (g->pfds[i] >= 0) close(g->pfds[i]);
        g->fds[i] = g->rfds[i] = g->pfds[i] = -1;
        if (g->seal_mode) dataconn_seals_free(g, i);
    }
}

/* The congestion control of data connections (node.tcp_congestion, "" for the node's
 * own). Reno by default: these connections stay within a cluster, every kernel allows
 * reno to every process, and BBR, the default of some nodes, paces every burst with a
 * timer wherever no fq qdisc does it (loopback, a pod's veth): on the 2-CPU VM of issue
 * 16 a 2 MiB allgather among 4 pods took 2.8 ms with reno or cubic and 4.3 with BBR, a
 * 64 MiB one between two pods 29.1, 30.0 and 41.6 ms (bench/RESULTS.md). A name the node
 * does not allow without CAP_NET_ADMIN falls back to reno. Set on a socket before its
 * connection exists (the connecting side's, and the listener, whose connections inherit
 * it): switched on a live connection, it keeps what the node's started there, BBR's
 * pacing included (4 pods, 256 KiB allreduce: 452 us switched, 235 us set before). */
static void set_congestion(struct net *n, int fd)
{
    const char *want = n->cfg->node.tcp_congestion;
    if (!want[0] || setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, want, (socklen_t)strlen(want)) == 0)
        return;
    int e = errno;
    int reno =
        strcmp(want, "reno") != 0 && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4) == 0;
    if (!n->cc_warned)
        log_msg(LOG_WARN, "dataconn.congestion", "want=%s error=\"%s\" using=%s", want, strerror(e),
                reno ? "reno" : "the node's default");
    n->cc_warned = 1;
}

/* A non-blocking connect to addr ("ip:port", numeric: checked when the member table
 * arrived, so nothing is resolved here) from our node.address, the address the member
 * table lists for us and which the peer checks. */
static int connect_to(struct net *n, const char *self, const char *addr, char *why, size_t whylen)
{
    struct sockaddr_in dst, src = {.sin_family = AF_INET};
    if (rdv_addr_parse(addr, &dst) < 0) {
        snprintf(why, whylen, "bad data address '%s'", addr);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return -1;
    }
    set_congestion(n, fd); /* before the connection exists: see set_congestion */
    if (inet_pton(AF_INET, self, &src.sin_addr) == 1 &&
        bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0) {
        snprintf(why, whylen, "binding to node.address %s: %s", self, strerror(errno));
        goto close_socket;
    }
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 && errno != EINPROGRESS) {
        snprintf(why, whylen, "connecting to %s: %s", addr, strerror(errno));
        goto close_socket;
    }
    return fd;
close_socket:
    close(fd);
    return -1;
}

/* Data connections: no Nagle, large buffers, and keepalive at the group's heartbeat
 * interval (whole seconds; probes after 2 idle intervals, 3 unanswered end it), so a
 * peer whose node vanished without a reset is noticed in seconds, not the kernel's 2
 * hours. No TCP_USER_TIMEOUT: it would also cut a healthy peer whose application is
 * slow to post its op (a full window is not a dead node). */
static void tune_socket(const struct net *n, int fd, int heartbeat_ms)
{
    int one = 1, buf = n->cfg->node.tcp_buffer_bytes;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (buf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    }
    int ivl = (heartbeat_ms + 999) / 1000, idle = 2 * ivl, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &ivl, sizeof(ivl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* Where the connection of channel ch with node peer goes: opened by us (opener) or
 * by the peer. COLL carries the opener's bytes, COLL_BACK the other side's. */
static int *conn_slot(struct ngroup *g, int ch, int peer, int opener)
{
    if (ch == DATA_CH_P2P) return &g->pfds[peer];
    return (ch == DATA_CH_COLL) == opener ? &g->fds[peer] : &g->rfds[peer];
}

static int pair_up(const struct ngroup *g, int p)
{
    return g->fds[p] >= 0 && g->rfds[p] >= 0 && g->pfds[p] >= 0;
}

/* Formed: the pairs the group keeps from the start are up (tcp_eager_peer); the
 * others connect when an op first needs them (dataconn_need). */
static void check_ready(struct net *n, struct ngroup *g)
{
    if (!g->rdv.committed || g->ready) return;
    for (int i = 0; i < g->nodes; i++)
        if (tcp_eager_peer(g->nodes, g->me, i) && !pair_up(g, i)) return;
    n->epoch->formed(n, g);
}

/* Open the three connections of the pair with node j (lower than us: the pod of the
 * higher index opens), unless they are up or on their way. */
static int open_pair(struct net *n, struct ngroup *g, int j, char *why, size_t whylen)
{
    if (pair_up(g, j)) return 0;
    for (int k = 0; k < g->nog; k++)
        if (g->og[k].peer == j) return 0;
    char addr[RDV_ADDR_MAX];
    rdv_member_addr(&g->members[j], addr, sizeof(addr));
    for (int ch = 0; ch < DATA_CH_COUNT; ch++) {
        if (*conn_slot(g, ch, j, 1) >= 0) continue;
        int fd = connect_to(n, n->cfg->node.address, addr, why, whylen);
        if (fd < 0) return -1;
        tune_socket(n, fd, g->cfg->heartbeat_ms);
        g->og[g->nog++] = (struct outgoing){.fd = fd, .peer = j, .ch = ch};
    }
    return 0;
}

int dataconn_open(struct net *n, struct ngroup *g, char *why, size_t whylen)
{
    dataconn_close(g);
    for (int j = 0; j < g->me; j++)
        if (tcp_eager_peer(g->nodes, g->me, j) && open_pair(n, g, j, why, whylen) < 0) return -1;
    check_ready(n, g);
    return 0;
}

int dataconn_need(struct net *n, struct ngroup *g, const uint8_t *need)
{
    int all = 1;
    for (int p = 0; p < g->nodes; p++) {
        if (!need[p] || pair_up(g, p)) continue;
        all = 0;
        char why[200];
        if (p < g->me && open_pair(n, g, p, why, sizeof(why)) < 0) {
            n->epoch->end(n, g, COLL_ERR_PEER_LOST, why, 0, 1);
            return 0;
        }
    }
    return all;
}

int dataconn_pairs(const struct ngroup *g)
{
    int up = 0;
    for (int p = 0; p < g->nodes; p++)
        up += p != g->me && pair_up(g, p);
    return up;
}

/* The hello (or what a welcome must answer) of our connection on channel ch, for the
 * committed epoch: everything but the nonce and the mac. */
static struct data_hello hello_of(const struct ngroup *g, int ch)
{
    return (struct data_hello){.magic = DATA_MAGIC,
                               .version = RDV_VERSION,
                               .channel = (uint16_t)ch,
                               .group_hash = g->name_hash,
                               .inc = g->rdv.inc,
                               .epoch = g->rdv.epoch,
                               .from_index = (uint32_t)g->me,
                               .seal = (uint16_t)g->seal_mode,
                               .ciphers = (uint16_t)(g->seal_mode ? g->net->seal_ciphers : 0)};
}

/* Read what is due of a handshake message into buf (len bytes, *got so far). 1 whole,
 * 0 not yet, -1 with errno (ECONNRESET: the peer closed). */
static int read_due(int fd, void *buf, size_t len, size_t *got)
{
    ssize_t r = read(fd, (char *)buf + *got, len - *got);
    if (r > 0) *got += (size_t)r;
    if (r == 0) {
        errno = ECONNRESET;
        return -1;
    }
    if (r < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    return *got == len;
}

enum { OG_WAIT = 0, OG_UP, OG_RETRY, OG_FAIL };

/* One step of connection o's handshake, without waiting. OG_FAIL sets *step (what
 * failed) and *err. */
static int og_step(struct net *n, struct ngroup *g, struct outgoing *o, const char **step, int *err,
                   char *why, size_t whylen)
{
    if (o->fd < 0) { /* the peer said NOT_YET: connect again when it is time */
        if (now_ns() < o->retry_at) return OG_WAIT;
        char addr[RDV_ADDR_MAX];
        rdv_member_addr(&g->members[o->peer], addr, sizeof(addr));
        o->fd = connect_to(n, n->cfg->node.address, addr, why, whylen);
        if (o->fd < 0) {
            *step = why;
            *err = ECONNREFUSED;
            return OG_FAIL;
        }
        tune_socket(n, o->fd, g->cfg->heartbeat_ms);
        o->connected = o->hello_sent = 0;
        o->got = 0;
    }
    if (!o->connected) {
        struct pollfd p = {.fd = o->fd, .events = POLLOUT};
        if (poll(&p, 1, 0) <= 0) return OG_WAIT; /* still connecting */
        socklen_t el = sizeof(*err);
        if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, err, &el) < 0) *err = errno;
        if (*err) {
            *step = "connect";
            return OG_FAIL;
        }
        o->connected = 1;
    }
    int r;
    if (!o->hello_sent) {
        r = read_due(o->fd, &o->in.chal, sizeof(o->in.chal), &o->got);
        if (r <= 0) {
            *step = "waiting for its challenge";
            *err = errno;
            return r < 0 ? OG_FAIL : OG_WAIT;
        }
        if (data_challenge_check(&o->in.chal, why, whylen) < 0) {
            *step = why;
            *err = EPROTO;
            return OG_FAIL;
        }
        struct data_hello h = hello_of(g, o->ch);
        sec_random(h.nonce, sizeof(h.nonce));
        memcpy(o->nonce, h.nonce, sizeof(o->nonce));
        memcpy(o->chal_nonce, o->in.chal.nonce, sizeof(o->chal_nonce));
        sec_mac(h.mac, g->secret, o->in.chal.nonce, &h, DATA_HELLO_SIGNED);
        /* a fresh socket takes the hello whole */
        if (write(o->fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
            *step = "hello";
            *err = errno ? errno : EAGAIN;
            return OG_FAIL;
        }
        o->hello_sent = 1;
        o->got = 0;
    }
    r = read_due(o->fd, &o->in.wel, sizeof(o->in.wel), &o->got);
    if (r <= 0) {
        *step = "waiting for its welcome (it refused our hello)";
        *err = errno;
        return r < 0 ? OG_FAIL : OG_WAIT;
    }
    struct data_hello sent = hello_of(g, o->ch);
    if (data_welcome_check(&o->in.wel, &sent, (uint32_t)o->peer, why, whylen) < 0) {
        *step = why;
        *err = EPROTO;
        return OG_FAIL;
    }
    if (o->in.wel.status == DATA_WELCOME_NOT_YET) {
        /* it has not been told of our epoch yet: ask again shortly */
        if (LOG_DEBUG_ON())
            log_msg(LOG_DEBUG, "data.not_yet", "group=%s to=%d channel=%d epoch=%u backoff_ms=%lld",
                    g->cfg->name, o->peer, o->ch, g->rdv.epoch,
                    (long long)(o->backoff_ns / NS_PER_MS));
        close(o->fd);
        o->fd = -1;
        o->backoff_ns = o->backoff_ns ? o->backoff_ns * 2 : RETRY_FIRST_NS;
        if (o->backoff_ns > RETRY_MAX_NS) o->backoff_ns = RETRY_MAX_NS;
        o->retry_at = now_ns() + o->backoff_ns;
        return OG_RETRY;
    }
    if (!sec_mac_ok(o->in.wel.mac, g->secret, o->nonce, &o->in.wel, DATA_WELCOME_SIGNED)) {
        *step = "its welcome does not prove the epoch's secret";
        *err = EPROTO;
        return OG_FAIL;
    }
    if (dataconn_seal_up(g, o->ch, o->peer, 1, o->in.wel.cipher, o->chal_nonce, o->nonce) < 0) {
        *step = "sealing its records";
        *err = ENOMEM;
        return OG_FAIL;
    }
    return OG_UP;
}

void dataconn_describe(const struct ngroup *g, char *out, size_t cap)
{
    size_t k = 0;
    out[0] = '\0';
    for (int i = 0; i < g->nog && k < cap; i++) {
        const struct outgoing *o = &g->og[i];
        const char *st = o->fd < 0        ? "told NOT_YET, connecting again"
                         : !o->connected  ? "connecting"
                         : !o->hello_sent ? "waiting for its challenge"
                                          : "waiting for its welcome";
        k += (size_t)snprintf(out + k, cap - k, "%sto node %d channel %d: %s (%lld ms backoff)",
                              k ? "; " : "", o->peer, o->ch, st,
                              (long long)(o->backoff_ns / NS_PER_MS));
    }
    for (int p = g->me + 1; p < g->nodes && k < cap; p++)
        if (tcp_eager_peer(g->nodes, g->me, p) && !pair_up(g, p))
            k += (size_t)snprintf(out + k, cap - k, "%sfrom node %d: not all in (%d %d %d)",
                                  k ? "; " : "", p, g->fds[p] >= 0, g->rfds[p] >= 0,
                                  g->pfds[p] >= 0);
}

/* Move our connections of the committed epoch on, without waiting (rdv_wire.h: the
 * handshake, both ways): a connection takes its slot once the peer has proven the
 * epoch's secret too. A failure ends the epoch; one that takes too long is ended by the
 * formation deadline (join_ms, timers). */
void dataconn_progress_outgoing(struct net *n, struct ngroup *g)
{
    for (int i = 0; i < g->nog;) {
        struct outgoing *o = &g->og[i];
        const char *step = NULL;
        int err = 0;
        char why[160];
        int st = og_step(n, g, o, &step, &err, why, sizeof(why));
        if (st == OG_FAIL) {
            char w[300], addr[RDV_ADDR_MAX];
            rdv_member_addr(&g->members[o->peer], addr, sizeof(addr));
            snprintf(w, sizeof(w), "data connection to node %d (%s): %s: %s", o->peer, addr, step,
                     strerror(err));
            n->epoch->end(n, g, COLL_ERR_PEER_LOST, w, 0, 1); /* closes every og */
            return;
        }
        if (st != OG_UP) {
            i++;
            continue;
        }
        *conn_slot(g, o->ch, o->peer, 1) = o->fd;
        g->og[i] = g->og[--g->nog];
        check_ready(n, g);
    }
}

/* A stranger's connections must not crowd out a member's: when the table is full the
 * oldest connection that has not even said hello is dropped, then the oldest of all. */
static void evict_pending(struct net *n)
{
    int victim = 0;
    for (int i = 1; i < n->npend; i++) {
        int vi = n->pend[victim].got == sizeof(struct data_hello);
        int ii = n->pend[i].got == sizeof(struct data_hello);
        if (ii < vi || (ii == vi && n->pend[i].deadline < n->pend[victim].deadline)) victim = i;
    }
    close(n->pend[victim].fd);
    n->pend[victim] = n->pend[--n->npend];
}

void dataconn_accept(struct net *n)
{
    for (;;) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(n->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (n->npend == MAX_PENDING_ACCEPTS) evict_pending(n);
        tune_socket(n, fd, n->hb_ms); /* the group is not known yet: the shortest interval */
        struct pending_conn *p = &n->pend[n->npend];
        *p = (struct pending_conn){
            .fd = fd, .from = sa.sin_addr, .deadline = now_ns() + PENDING_HELLO_NS};
        struct data_challenge c = {.magic = DATA_MAGIC, .version = RDV_VERSION};
        sec_random(c.nonce, sizeof(c.nonce));
        memcpy(p->nonce, c.nonce, sizeof(p->nonce));
        /* a fresh socket takes 40 bytes without blocking */
        if (write(fd, &c, sizeof(c)) != (ssize_t)sizeof(c)) {
            close(fd);
            continue;
        }
        n->npend++;
    }
}

static void refuse_hello(struct log_limit *lim, const struct pending_conn *p, const char *why)
{
    unsigned long long dropped;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &p->from, ip, sizeof(ip));
    if (log_limit_pass(lim, &dropped))
        log_msg(LOG_WARN, "data.refused",
                "from=%s node=%u channel=%u epoch=%u reason=\"%s\" suppressed=%llu", ip,
                p->hello.from_index, p->hello.channel, p->hello.epoch, why, dropped);
}

static void bad_hello(struct net *n, const struct pending_conn *p, const char *why)
{
    refuse_hello(&n->lim_hello, p, why);
}

/* Whether the connection came from the address the member table lists for node i. */
static int from_member(const struct ngroup *g, int i, struct in_addr from)
{
    return g->members[i].ip == from.s_addr;
}

/* Hellos kept for an epoch not committed here, from the address of pending connection
 * i, for the connection it claims (group, node, channel), i itself left out. */
static int claims_like(const struct net *n, int i)
{
    const struct pending_conn *p = &n->pend[i];
    int k = 0;
    for (int j = 0; j < n->npend; j++) {
        const struct pending_conn *q = &n->pend[j];
        k += j != i && q->fd >= 0 && q->got == sizeof(q->hello) &&
             q->from.s_addr == p->from.s_addr && q->hello.group_hash == p->hello.group_hash &&
             q->hello.from_index == p->hello.from_index && q->hello.channel == p->hello.channel;
    }
    return k;
}

/* Answer pending connection p's hello (the connection's first bytes our way, after the
 * challenge: a fresh socket takes them). OK proves the epoch's secret over its nonce. 0,
 * or -1 if the socket would not take it. */
static int welcome(const struct ngroup *g, const struct pending_conn *p, int status, int cipher)
{
    struct data_welcome w = {.magic = DATA_MAGIC,
                             .version = RDV_VERSION,
                             .status = (uint16_t)status,
                             .channel = p->hello.channel,
                             .to_index = (uint32_t)g->me,
                             .group_hash = p->hello.group_hash,
                             .inc = p->hello.inc,
                             .epoch = p->hello.epoch};
    if (status == DATA_WELCOME_OK) w.cipher = (uint16_t)cipher;
    if (status == DATA_WELCOME_OK)
        sec_mac(w.mac, g->secret, p->hello.nonce, &w, DATA_WELCOME_SIGNED);
    return write(p->fd, &w, sizeof(w)) == (ssize_t)sizeof(w) ? 0 : -1;
}

enum { HELLO_KEEP = 0, HELLO_UP, HELLO_DROP };

/* What to do with pending connection i, whose hello is in: HELLO_UP (it took its slot),
 * HELLO_KEEP (for an epoch not committed here yet) or HELLO_DROP (refused, or told
 * NOT_YET). */
static int judge_hello(struct net *n, int i, int fresh)
{
    struct pending_conn *p = &n->pend[i];
    char why[128];
    if (data_hello_check(&p->hello, why, sizeof(why)) < 0) {
        bad_hello(n, p, why);
        return HELLO_DROP;
    }
    struct ngroup *g = NULL;
    for (int k = 0; k < n->ngroups; k++)
        if (n->groups[k] && n->groups[k]->name_hash == p->hello.group_hash) g = n->groups[k];
    int from = (int)p->hello.from_index;
    int *slot =
        g && from > g->me && from < g->nodes ? conn_slot(g, p->hello.channel, from, 0) : NULL;
    if (!slot) {
        bad_hello(n, p, "no such group or node index");
        return HELLO_DROP;
    }
    /* the epoch: ours, one that is over, or (another incarnation, or a later count) one
     * we have not been told of yet */
    int ours = p->hello.inc == g->rdv.inc;
    if (ours &&
        (p->hello.epoch < g->rdv.epoch || (!g->rdv.committed && p->hello.epoch == g->rdv.epoch))) {
        bad_hello(n, p, "an epoch that is over");
        return HELLO_DROP;
    }
    if (!ours || !g->rdv.committed || p->hello.epoch != g->rdv.epoch) {
        /* kept until its epoch comes, a few per source; never one dropped for another */
        if (fresh && claims_like(n, i) >= CLAIMS_PER_SOURCE) {
            if (LOG_DEBUG_ON())
                log_msg(LOG_DEBUG, "data.claim_not_yet",
                        "from_node=%u channel=%u epoch=%u inc_ours=%d claims=%d",
                        p->hello.from_index, p->hello.channel, p->hello.epoch, ours,
                        claims_like(n, i));
            welcome(g, p, DATA_WELCOME_NOT_YET, 0);
            return HELLO_DROP;
        }
        return HELLO_KEEP;
    }
    if (!sec_mac_ok(p->hello.mac, g->secret, p->nonce, &p->hello, DATA_HELLO_SIGNED)) {
        bad_hello(n, p, "the hello does not prove the epoch's secret");
        return HELLO_DROP;
    }
    if (!from_member(g, from, p->from)) {
        bad_hello(n, p, "not from the address the member table lists");
        return HELLO_DROP;
    }
    if (*slot >= 0) {
        bad_hello(n, p, "that connection is already up");
        return HELLO_DROP;
    }
    /* the same security.data on both sides (the coordinator admits none other; this
     * is the hello's own word, under its mac), and a cipher both run */
    int cipher = g->seal_mode ? seal_pick(n->seal_ciphers, p->hello.ciphers) : 0;
    if (p->hello.seal != g->seal_mode || (g->seal_mode && !cipher)) {
        bad_hello(n, p,
                  p->hello.seal != g->seal_mode ? "its security.data differs from ours"
                                                : "it runs none of our ciphers");
        return HELLO_DROP;
    }
    if (dataconn_seal_up(g, p->hello.channel, from, 0, cipher, p->nonce, p->hello.nonce) < 0) {
        bad_hello(n, p, "no memory to seal its records");
        return HELLO_DROP;
    }
    if (welcome(g, p, DATA_WELCOME_OK, cipher) < 0) return HELLO_DROP; /* it went away */
    *slot = p->fd;
    check_ready(n, g);
    return HELLO_UP;
}

/*
 * Hellos of accepted connections. One proven for the committed epoch (mac over our
 * nonce with the epoch's secret, a member's index, from that member's address, a free
 * slot) is welcomed with our own proof and takes its slot; one for an epoch not
 * committed here yet waits (bounded: CLAIMS_PER_SOURCE, PENDING_FUTURE_NS, the table)
 * and is judged when the commit arrives; anything else is refused and logged
 * (rate-limited).
 */
void dataconn_progress_pending(struct net *n)
{
    int64_t t = now_ns();
    for (int i = 0; i < n->npend;) {
        struct pending_conn *p = &n->pend[i];
        int verdict = HELLO_KEEP, fresh = 0;
        if (p->got < sizeof(p->hello)) {
            size_t before = p->got;
            int r = read_due(p->fd, &p->hello, sizeof(p->hello), &p->got);
            if (r < 0) {
                verdict = HELLO_DROP;
            } else if (r > 0 && before < sizeof(p->hello)) {
                p->deadline = t + PENDING_FUTURE_NS;
                fresh = 1;
            }
        }
        if (verdict == HELLO_KEEP && p->got == sizeof(p->hello)) verdict = judge_hello(n, i, fresh);
        if (verdict == HELLO_KEEP && t > p->deadline) verdict = HELLO_DROP;
        if (verdict == HELLO_DROP) close(p->fd);
        if (verdict != HELLO_KEEP) {
            n->pend[i] = n->pend[--n->npend];
            continue;
        }
        i++;
    }
}

int dataconn_bind(struct net *n, char *why, size_t whylen)
{
    n->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(n->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (n->lfd >= 0) set_congestion(n, n->lfd); /* accepted connections inherit it */
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)n->cfg->node.data_port)};
    /* the node's own address, not every interface: a pod network's address, or loopback */
    if (inet_pton(AF_INET, n->cfg->node.address, &sa.sin_addr) != 1) {
        snprintf(why, whylen, "node.address '%s' is not an IPv4 address", n->cfg->node.address);
        return -1;
    }
    socklen_t sl = sizeof(sa);
    if (n->lfd < 0 || bind(n->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        listen(n->lfd, DATA_CH_COUNT * RDV_MAX_NODES + 64) < 0 ||
        getsockname(n->lfd, (struct sockaddr *)&sa, &sl) < 0) {
        snprintf(why, whylen, "data-plane listener on port %d: %s", n->cfg->node.data_port,
                 strerror(errno));
        return -1;
    }
    snprintf(n->data_addr, sizeof(n->data_addr), "%.56s:%u", n->cfg->node.address,
             (unsigned)ntohs(sa.sin_port));
    return 0;
}

void dataconn_free(struct net *n)
{
    for (int i = 0; i < n->npend; i++)
        close(n->pend[i].fd);
    n->npend = 0;
    if (n->lfd >= 0) close(n->lfd);
    n->lfd = -1;
}
