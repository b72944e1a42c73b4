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
        close(g->og[i].fd);
    g->nog = 0;
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        int *f[3] = {&g->fds[i], &g->rfds[i], &g->pfds[i]};
        for (int k = 0; k < 3; k++)
            if (*f[k] >= 0) {
                g->grave[g->ngrave++] = *f[k];
                *f[k] = -1;
            }
    }
    g->grave_until = now_ns() + (int64_t)g->cfg->heartbeat_ms * NS_PER_MS;
}

void dataconn_close(struct ngroup *g)
{
    tcp_stash_drop(g->stash, g->nodes); /* what was read ahead goes with them */
    for (int i = 0; i < g->nog; i++)
        close(g->og[i].fd);
    g->nog = 0;
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        if (g->fds[i] >= 0) close(g->fds[i]);
        if (g->rfds[i] >= 0) close(g->rfds[i]);
        if (g->pfds[i] >= 0) close(g->pfds[i]);
        g->fds[i] = g->rfds[i] = g->pfds[i] = -1;
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
    net_epoch_formed(n, g);
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
            net_epoch_end(n, g, COLL_ERR_PEER_LOST, why, 0, 1);
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

/* Move our connections of the committed epoch on, without waiting: connected? the
 * peer's challenge in? then the hello that proves the epoch's secret over its nonce,
 * and the connection takes its slot. A failure ends the epoch; one that takes too long
 * is ended by the formation deadline (join_ms, timers). */
void dataconn_progress_outgoing(struct net *n, struct ngroup *g)
{
    for (int i = 0; i < g->nog;) {
        struct outgoing *o = &g->og[i];
        const char *step = NULL;
        int err = 0, done = 0;
        char why[160];
        if (!o->connected) {
            struct pollfd p = {.fd = o->fd, .events = POLLOUT};
            if (poll(&p, 1, 0) <= 0) {
                i++; /* still connecting */
                continue;
            }
            socklen_t el = sizeof(err);
            if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) err = errno;
            o->connected = !err;
        }
        if (err) {
            step = "connect";
        } else {
            ssize_t r = read(o->fd, (char *)&o->chal + o->got, sizeof(o->chal) - o->got);
            if (r > 0) o->got += (size_t)r;
            if (r == 0) {
                step = "waiting for its challenge";
                err = ECONNRESET;
            } else if (r < 0 && errno != EAGAIN && errno != EINTR) {
                step = "waiting for its challenge";
                err = errno;
            } else if (o->got == sizeof(o->chal)) {
                struct data_hello h = {.magic = DATA_MAGIC,
                                       .version = RDV_VERSION,
                                       .channel = (uint16_t)o->ch,
                                       .group_hash = g->name_hash,
                                       .epoch = g->rdv.epoch,
                                       .from_index = (uint32_t)g->me};
                if (data_challenge_check(&o->chal, why, sizeof(why)) < 0) {
                    step = why;
                    err = EPROTO;
                } else {
                    sec_mac(h.mac, g->secret, o->chal.nonce, &h, DATA_HELLO_SIGNED);
                    /* a fresh socket takes the hello whole */
                    if (write(o->fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
                        step = "hello";
                        err = errno ? errno : EAGAIN;
                    } else {
                        done = 1;
                    }
                }
            }
        }
        if (step) {
            char w[300], addr[RDV_ADDR_MAX];
            rdv_member_addr(&g->members[o->peer], addr, sizeof(addr));
            snprintf(w, sizeof(w), "data connection to node %d (%s): %s: %s", o->peer, addr, step,
                     strerror(err));
            net_epoch_end(n, g, COLL_ERR_PEER_LOST, w, 0, 1); /* closes every og */
            return;
        }
        if (!done) {
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

/* Pending connection i says it is a connection of an epoch not committed here yet. At
 * most one such claim is kept per source address and claimed connection (group, node,
 * channel): an older one from the same address is closed, so a source cannot hold more
 * than that many pre-connections, whatever it sends. */
static void forget_older_claims(struct net *n, int i)
{
    const struct pending_conn *p = &n->pend[i];
    for (int j = 0; j < n->npend; j++) {
        struct pending_conn *q = &n->pend[j];
        if (j == i || q->got != sizeof(q->hello) || q->from.s_addr != p->from.s_addr ||
            q->hello.group_hash != p->hello.group_hash ||
            q->hello.from_index != p->hello.from_index || q->hello.channel != p->hello.channel ||
            q->deadline > p->deadline)
            continue;
        /* q is older: the newer claim wins */
        /* its own rate limit: a claim flood must not hide the refusals of forgeries */
        refuse_hello(&n->lim_claim, q,
                     "a newer hello for the same connection came from the same address");
        close(q->fd);
        q->fd = -1; /* removed by progress_pending's next look at it */
    }
}

/*
 * Hellos of accepted connections. One proven for the committed epoch (mac over our
 * nonce with the epoch's secret, a member's index, from that member's address, a free
 * slot) takes its slot; one for an epoch not committed here yet waits (bounded: the
 * table, PENDING_FUTURE_NS) and is checked when the commit arrives; anything else is
 * refused and logged (rate-limited).
 */
void dataconn_progress_pending(struct net *n)
{
    int64_t t = now_ns();
    for (int i = 0; i < n->npend;) {
        struct pending_conn *p = &n->pend[i];
        if (p->fd < 0) { /* closed by forget_older_claims */
            n->pend[i] = n->pend[--n->npend];
            continue;
        }
        int drop = 0, keep = 1, fresh = 0;
        if (p->got < sizeof(p->hello)) {
            ssize_t r = read(p->fd, (char *)&p->hello + p->got, sizeof(p->hello) - p->got);
            if (r > 0)
                p->got += (size_t)r;
            else if (r == 0 || (errno != EAGAIN && errno != EINTR))
                drop = 1;
            if (p->got == sizeof(p->hello)) {
                p->deadline = t + PENDING_FUTURE_NS;
                fresh = 1;
            }
        }
        if (!drop && p->got == sizeof(p->hello)) {
            char why[128];
            struct ngroup *g = NULL;
            if (data_hello_check(&p->hello, why, sizeof(why)) < 0) {
                bad_hello(n, p, why);
                drop = 1;
            } else {
                for (int k = 0; k < n->ngroups; k++)
                    if (n->groups[k] && n->groups[k]->name_hash == p->hello.group_hash)
                        g = n->groups[k];
                int from = (int)p->hello.from_index;
                int *slot = NULL;
                if (g && from > g->me && from < g->nodes)
                    slot = conn_slot(g, p->hello.channel, from, 0);
                if (!slot) {
                    bad_hello(n, p, "no such group or node index");
                    drop = 1;
                } else if (p->hello.epoch < g->rdv.epoch ||
                           (!g->rdv.committed && p->hello.epoch == g->rdv.epoch)) {
                    bad_hello(n, p, "an epoch that is over");
                    drop = 1;
                } else if (g->rdv.committed && p->hello.epoch == g->rdv.epoch) {
                    if (!sec_mac_ok(p->hello.mac, g->secret, p->nonce, &p->hello,
                                    DATA_HELLO_SIGNED)) {
                        bad_hello(n, p, "the hello does not prove the epoch's secret");
                        drop = 1;
                    } else if (!from_member(g, from, p->from)) {
                        bad_hello(n, p, "not from the address the member table lists");
                        drop = 1;
                    } else if (*slot >= 0) {
                        bad_hello(n, p, "that connection is already up");
                        drop = 1;
                    } else {
                        *slot = p->fd;
                        keep = 0;
                        check_ready(n, g);
                    }
                } else if (fresh)
                    forget_older_claims(n, i);
                /* else: for an epoch we have not been told of yet: keep it until then,
                 * one per source address and claimed connection */
            }
        }
        if (!drop && keep && t > p->deadline) drop = 1;
        if (drop) close(p->fd);
        if (drop || !keep) {
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
