/*
 * rdv_wire.c: encoders and strict decoders of the control plane and data-plane
 * headers (see rdv_wire.h).
 */
#include "rdv_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>

#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "wire.h"

_Static_assert(sizeof(struct rdv_hdr) == 88, "rendezvous header is frozen");
_Static_assert(RDV_CHILD_MAX == WIRE_CHILD_MAX, "a child's list fits an ask");
_Static_assert(sizeof(union rdv_msg) <= RDV_FRAME_MAX, "every frame fits ZMQ_MAXMSGSIZE");

static size_t fixed_size(unsigned t)
{
    switch (t) {
    case RDV_JOIN:
        return sizeof(struct rdv_join);
    case RDV_REJECT:
        return sizeof(struct rdv_reject);
    case RDV_HEARTBEAT:
        return sizeof(struct rdv_heartbeat);
    case RDV_ABORT:
        return sizeof(struct rdv_abort);
    case RDV_LEAVE:
        return sizeof(struct rdv_leave);
    case RDV_CHILD_ASK:
        return sizeof(struct rdv_child_ask);
    case RDV_CHILD_ID:
        return sizeof(struct rdv_child_id);
    default:
        return 0;
    }
}

static size_t commit_size(uint32_t nodes)
{
    return offsetof(struct rdv_commit, members) + (size_t)nodes * sizeof(struct rdv_member);
}

struct host_of {
    uint64_t host;
    int i;
};

static int by_host(const void *a, const void *b)
{
    const struct host_of *x = a, *y = b;
    if (x->host != y->host) return x->host < y->host ? -1 : 1;
    return x->i - y->i;
}

static int place_has_cpus(const struct rdv_place *p)
{
    for (int b = 0; b < RDV_CPUS_BYTES; b++)
        if (p->cpus[b]) return 1;
    return 0;
}

int rdv_mark_shared(const struct rdv_place *place, int n, uint16_t *flags)
{
    struct host_of *h = n > 0 ? malloc((size_t)n * sizeof(*h)) : NULL;
    uint16_t *cnt = calloc(RDV_CPUS_BYTES * 8, sizeof(*cnt));
    int anywhere = 0; /* a pod that does not know its host may be on any */
    for (int i = 0; i < n; i++) {
        flags[i] |= RDV_MEMBER_CPU_SHARED;
        if (!place[i].host) anywhere = 1;
    }
    if (!h || !cnt || anywhere) {
        free(h);
        free(cnt);
        return h && cnt ? 0 : -1;
    }
    for (int i = 0; i < n; i++)
        h[i] = (struct host_of){place[i].host, i};
    qsort(h, (size_t)n, sizeof(*h), by_host);
    for (int a = 0, b; a < n; a = b) {
        for (b = a; b < n && h[b].host == h[a].host; b++)
            ;
        /* pods a..b-1 share a host: count, per CPU, the pods that may run on it (one
         * that does not say may run on any); n <= RDV_MAX_NODES fits the counters */
        memset(cnt, 0, RDV_CPUS_BYTES * 8 * sizeof(*cnt));
        for (int k = a; k < b; k++) {
            const struct rdv_place *p = &place[h[k].i];
            int all = !place_has_cpus(p);
            for (int c = 0; c < RDV_CPUS_BYTES * 8; c++)
                if (all || (p->cpus[c / 8] >> (c % 8) & 1)) cnt[c]++;
        }
        for (int k = a; k < b; k++) {
            const struct rdv_place *p = &place[h[k].i];
            int all = !place_has_cpus(p), shared = 0;
            for (int c = 0; c < RDV_CPUS_BYTES * 8 && !shared; c++)
                if ((all || (p->cpus[c / 8] >> (c % 8) & 1)) && cnt[c] > 1) shared = 1;
            if (!shared) flags[h[k].i] &= (uint16_t)~RDV_MEMBER_CPU_SHARED;
        }
    }
    free(h);
    free(cnt);
    return 0;
}

void rdv_member_addr(const struct rdv_member *m, char *out, size_t cap)
{
    struct in_addr a = {.s_addr = m->ip};
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, ip, sizeof(ip));
    snprintf(out, cap, "%s:%u", ip, (unsigned)m->port);
}

int rdv_member_set(struct rdv_member *m, const char *addr)
{
    struct sockaddr_in sa;
    memset(m, 0, sizeof(*m));
    if (rdv_addr_parse(addr, &sa) < 0) return -1;
    m->ip = sa.sin_addr.s_addr;
    m->port = ntohs(sa.sin_port);
    return 0;
}

void rdv_init(union rdv_msg *m, enum rdv_type t, const char *group, uint32_t epoch)
{
    /* the fixed part only: a COMMIT for 4096 pods is 32 KiB, and heartbeats go out by
     * the thousand */
    memset(m, 0, t == RDV_COMMIT ? commit_size(0) : fixed_size(t) ? fixed_size(t) : sizeof(m->h));
    m->h.magic = RDV_MAGIC;
    m->h.version = RDV_VERSION;
    m->h.type = (uint16_t)t;
    m->h.epoch = epoch;
    snprintf(m->h.group, sizeof(m->h.group), "%s", group);
    m->h.len = (uint32_t)(t == RDV_COMMIT ? commit_size(0) : fixed_size(t));
}

size_t rdv_size(const union rdv_msg *m)
{
    return m->h.type == RDV_COMMIT ? commit_size(m->commit.nodes) : fixed_size(m->h.type);
}

static int terminated(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

/* A name that logs and metrics print as it is: no control bytes, quotes or backslashes
 * (pod names and UIDs are DNS labels and UUIDs; anything else is forged). */
static int plain(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x21 || (unsigned char)*s >= 0x7f || *s == '"' || *s == '\\')
            return 0;
    return 1;
}

uint64_t rdv_child_hash(const uint32_t *ranks, uint32_t n)
{
    return rdv_fnv1a(ranks, (size_t)n * sizeof(*ranks), RDV_FNV_INIT);
}

/* A child's list: 1..RDV_CHILD_MAX distinct ranks, zeros past them (whether they are
 * the group's ranks is the coordinator's to check: it knows its size). */
static int child_ask_check(const struct rdv_child_ask *a, char *why, size_t whylen)
{
    if (!a->nth || a->pad || a->n == 0 || a->n > RDV_CHILD_MAX) {
        snprintf(why, whylen, "CHILD_ASK from index %u: child %u of %u ranks (1..%d)",
                 a->node_index, a->nth, a->n, RDV_CHILD_MAX);
        return -1;
    }
    for (uint32_t i = 0; i < RDV_CHILD_MAX; i++) {
        if (i >= a->n) {
            if (a->ranks[i]) {
                snprintf(why, whylen, "CHILD_ASK from index %u: ranks[%u] past its %u ranks",
                         a->node_index, i, a->n);
                return -1;
            }
            continue;
        }
        for (uint32_t j = 0; j < i; j++)
            if (a->ranks[j] == a->ranks[i]) {
                snprintf(why, whylen, "CHILD_ASK from index %u: rank %u listed twice",
                         a->node_index, a->ranks[i]);
                return -1;
            }
    }
    return 0;
}

int rdv_decode(const void *buf, size_t n, union rdv_msg *out, char *why, size_t whylen)
{
    struct rdv_hdr h;
    if (n < sizeof(h)) {
        snprintf(why, whylen, "frame of %zu bytes is shorter than the header", n);
        return -1;
    }
    memcpy(&h, buf, sizeof(h));
    if (h.magic != RDV_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x", h.magic);
        return -1;
    }
    if (h.version != RDV_VERSION) {
        snprintf(why, whylen, "rendezvous version %u is not supported (this agent speaks %u)",
                 h.version, RDV_VERSION);
        return -1;
    }
    if (!terminated(h.group, sizeof(h.group)) || !h.group[0]) {
        snprintf(why, whylen, "group name is empty or not terminated");
        return -1;
    }
    size_t want;
    if (h.type == RDV_COMMIT) {
        if (n < commit_size(0)) {
            snprintf(why, whylen, "COMMIT of %zu bytes is truncated", n);
            return -1;
        }
        uint32_t nodes;
        memcpy(&nodes, (const char *)buf + offsetof(struct rdv_commit, nodes), sizeof(nodes));
        if (nodes == 0 || nodes > RDV_MAX_NODES) {
            snprintf(why, whylen, "COMMIT for %u nodes (1..%d)", nodes, RDV_MAX_NODES);
            return -1;
        }
        want = commit_size(nodes);
    } else {
        want = fixed_size(h.type);
        if (!want) {
            snprintf(why, whylen, "unknown frame type %u", h.type);
            return -1;
        }
    }
    if (h.len != n || n != want) {
        snprintf(why, whylen, "frame type %u: length field %u, received %zu, expected %zu", h.type,
                 h.len, n, want);
        return -1;
    }
    /* exactly the frame's size (checked above): nothing past it is ever read, and a
     * union that holds a COMMIT of 4096 pods is not cleared per heartbeat */
    memcpy(out, buf, n);
    switch (h.type) {
    case RDV_JOIN:
        if (!terminated(out->join.pod, RDV_POD_MAX) ||
            !terminated(out->join.data_addr, RDV_ADDR_MAX) ||
            !terminated(out->join.uid, RDV_NAME_MAX))
            goto unterminated;
        if (!plain(out->join.pod) || !plain(out->join.uid) || !plain(out->join.h.group)) {
            snprintf(why, whylen,
                     "JOIN from index %u: pod name, UID or group has a byte that is "
                     "not a printable non-space character",
                     out->join.node_index);
            return -1;
        }
        if (!out->join.uid[0]) {
            snprintf(why, whylen, "JOIN from index %u without a pod UID", out->join.node_index);
            return -1;
        }
        if (rdv_addr_parse(out->join.data_addr, NULL) < 0) {
            snprintf(why, whylen, "JOIN: data address '%.64s' is not ipv4:port",
                     out->join.data_addr);
            return -1;
        }
        if (!out->join.h.inc != !out->join.last_epoch) {
            snprintf(why, whylen, "JOIN: last epoch %u of incarnation %llx", out->join.last_epoch,
                     (unsigned long long)out->join.h.inc);
            return -1;
        }
        if (out->join.nodes == 0 || out->join.nodes > RDV_MAX_NODES ||
            out->join.node_index >= out->join.nodes) {
            snprintf(why, whylen, "JOIN from index %u of %u nodes", out->join.node_index,
                     out->join.nodes);
            return -1;
        }
        break;
    case RDV_COMMIT:
        if (!out->commit.h.inc || !out->commit.h.epoch) {
            snprintf(why, whylen, "COMMIT of epoch %u of incarnation %llx", out->commit.h.epoch,
                     (unsigned long long)out->commit.h.inc);
            return -1;
        }
        for (uint32_t i = 0; i < out->commit.nodes; i++)
            if (!out->commit.members[i].ip || !out->commit.members[i].port) {
                snprintf(why, whylen, "COMMIT: member %u has no data address", i);
                return -1;
            } else if (out->commit.members[i].flags & ~RDV_MEMBER_FLAGS_KNOWN) {
                snprintf(why, whylen, "COMMIT: member %u has unknown flags 0x%x", i,
                         out->commit.members[i].flags);
                return -1;
            }
        break;
    case RDV_REJECT:
        if (!terminated(out->reject.why, RDV_MSG_MAX)) goto unterminated;
        break;
    case RDV_CHILD_ASK:
        return child_ask_check(&out->child_ask, why, whylen);
    case RDV_CHILD_ID:
        if (!terminated(out->child_id.why, RDV_MSG_MAX)) goto unterminated;
        if (out->child_id.code < 0 || out->child_id.code > COLL_ERR_INTERNAL ||
            !out->child_id.nth) {
            snprintf(why, whylen, "CHILD_ID with code %d for child %u", out->child_id.code,
                     out->child_id.nth);
            return -1;
        }
        break;
    case RDV_ABORT:
        if (!terminated(out->abort.why, RDV_MSG_MAX)) goto unterminated;
        if (out->abort.silent > 1 || out->abort.pad) {
            snprintf(why, whylen, "ABORT with silent=%u pad=%u", out->abort.silent, out->abort.pad);
            return -1;
        }
        break;
    }
    return 0;
unterminated:
    snprintf(why, whylen, "frame type %u: string field is not terminated", h.type);
    return -1;
}

int data_hello_check(const struct data_hello *h, char *why, size_t whylen)
{
    if (h->magic != DATA_MAGIC || h->version != RDV_VERSION) {
        snprintf(why, whylen, "not a data-plane hello (magic 0x%08x version %u)", h->magic,
                 h->version);
        return -1;
    }
    if (h->channel >= DATA_CH_COUNT) {
        snprintf(why, whylen, "hello for channel %u", h->channel);
        return -1;
    }
    if (h->from_index >= RDV_MAX_NODES) {
        snprintf(why, whylen, "hello from node index %u", h->from_index);
        return -1;
    }
    if (h->seal > 2 || h->ciphers > 3 || (h->seal != 0) != (h->ciphers != 0) || h->pad != 0) {
        snprintf(why, whylen, "hello with seal %u, ciphers 0x%x", h->seal, h->ciphers);
        return -1;
    }
    return 0;
}

int data_welcome_check(const struct data_welcome *w, const struct data_hello *h, uint32_t to_index,
                       char *why, size_t whylen)
{
    if (w->magic != DATA_MAGIC || w->version != RDV_VERSION || w->pad2 != 0) {
        snprintf(why, whylen, "not a data-plane welcome (magic 0x%08x version %u)", w->magic,
                 w->version);
        return -1;
    }
    if (w->status != DATA_WELCOME_OK && w->status != DATA_WELCOME_NOT_YET) {
        snprintf(why, whylen, "welcome with status %u", w->status);
        return -1;
    }
    /* with a seal, OK names one of the ciphers the hello offered; else none */
    int one = w->cipher && !(w->cipher & (w->cipher - 1)) && !(w->cipher & ~h->ciphers);
    if (w->status == DATA_WELCOME_OK ? (h->seal ? !one : w->cipher != 0) : w->cipher != 0) {
        snprintf(why, whylen, "welcome with cipher 0x%x to a hello offering 0x%x", w->cipher,
                 h->ciphers);
        return -1;
    }
    if (w->channel != h->channel || w->to_index != to_index || w->group_hash != h->group_hash ||
        w->inc != h->inc || w->epoch != h->epoch) {
        snprintf(why, whylen, "the welcome answers another hello (node %u, channel %u, epoch %u)",
                 w->to_index, w->channel, w->epoch);
        return -1;
    }
    return 0;
}

int data_challenge_check(const struct data_challenge *c, char *why, size_t whylen)
{
    if (c->magic != DATA_MAGIC || c->version != RDV_VERSION || c->pad != 0) {
        snprintf(why, whylen, "not a data-plane challenge (magic 0x%08x version %u)", c->magic,
                 c->version);
        return -1;
    }
    return 0;
}

int data_send_hdr_check(const struct data_op_hdr *h, uint32_t nlocal, uint32_t peer, uint32_t me,
                        uint64_t *bytes, char *why, size_t whylen)
{
    size_t es = h->dtype < COLL_DTYPE_COUNT ? coll_dtype_size((coll_dtype)h->dtype) : 0;
    if (h->magic != DATA_MAGIC || (h->kind != WIRE_OP_SEND && h->kind != WIRE_OP_RECV) || !es) {
        snprintf(why, whylen, "not a send header or ack (magic 0x%08x kind %u dtype %u)", h->magic,
                 h->kind, h->dtype);
        return -1;
    }
    if (nlocal == 0 || h->src_rank / nlocal != peer || h->dst_rank / nlocal != me) {
        snprintf(why, whylen, "send from rank %u to rank %u on a connection from node %u to %u",
                 h->src_rank, h->dst_rank, peer, me);
        return -1;
    }
    if (h->redop > (h->kind == WIRE_OP_SEND ? P2P_DATA : P2P_CTS)) {
        snprintf(why, whylen, "%s frame of phase %u", h->kind == WIRE_OP_SEND ? "send" : "ack",
                 h->redop);
        return -1;
    }
    if (h->flags & ~(h->kind == WIRE_OP_SEND ? P2P_F_NOACK : 0u)) {
        snprintf(why, whylen, "%s frame with flags 0x%x", h->kind == WIRE_OP_SEND ? "send" : "ack",
                 h->flags);
        return -1;
    }
    if (h->kind == WIRE_OP_SEND && h->root != 0 &&
        (((uint32_t)h->root & ~0xffu) != WIRE_SIG_ON ||
         !wire_sig_ok((uint32_t)h->root & 0xffu))) { /* 0: plain, else WIRE_SIG_ON | sig */
        snprintf(why, whylen, "send frame with signature 0x%x", (unsigned)h->root);
        return -1;
    }
    if (h->count > (1ull << 40) / es) {
        snprintf(why, whylen, "send of %llu elements", (unsigned long long)h->count);
        return -1;
    }
    /* an ack, a CTS and an RTS carry no payload */
    *bytes = h->kind == WIRE_OP_SEND && h->redop != P2P_RTS ? h->count * es : 0;
    return 0;
}

uint64_t rdv_fnv1a(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int rdv_addr_parse(const char *s, struct sockaddr_in *out)
{
    char host[RDV_ADDR_MAX];
    size_t n = strnlen(s, RDV_ADDR_MAX);
    if (n == RDV_ADDR_MAX) return -1;
    memcpy(host, s, n + 1);
    char *colon = strrchr(host, ':'), *end;
    if (!colon || !colon[1]) return -1;
    *colon = '\0';
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || errno || port == 0 || port > 65535 || colon[1] < '0' || colon[1] > '9') return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
    if (out) *out = sa;
    return 0;
}
