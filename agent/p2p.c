/*
 * p2p.c: sends and receives between pods. Pods do not run them in the same order, so
 * they never wait in the lockstep queue: each is a framed message (a header that names
 * both ranks, then the payload) on the pair's P2P connection, matched here with the
 * posted receive or kept as an unexpected message (bounded: UNX_*), and acknowledged
 * by the receiver, so that a send completes when its receive has taken it (a send
 * flagged P2P_F_NOACK, libcoll's on a child across pods, completes once written: its
 * receiver says nothing back, and the op's own receives carry any disagreement). A large send
 * (over UNX_SMALL) first asks (P2P_RTS, a header alone, kept like a small message) and
 * sends its payload (P2P_DATA) only when the receiver, its receive posted, says clear to
 * send (P2P_CTS): a payload never sits in the stream ahead of other ranks' messages.
 * The engine thread runs these too, under coll_lock (p2p_engine.c): what would end the
 * epoch or close a socket is then left in p2p_def for the net thread (p2p_end).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "coll/coll.h"
#include "net_priv.h"
#include "wire.h"

/* Charge the group and its sender for early message u (or forget it: sign -1). */
static void unx_charge(struct ngroup *g, const struct unexpected *u, int sign)
{
    g->unx_bytes += sign > 0 ? u->cost : -u->cost;
    g->unx_from[u->from] += sign > 0 ? u->cost : -u->cost;
    g->unx_n += sign > 0 ? 1u : -1u;
    g->unx_n_from[u->from] += sign > 0 ? 1u : -1u;
    atomic_store_explicit(&g->unx_pub, g->unx_bytes, memory_order_relaxed);
}

static void unx_free(struct ngroup *g, struct unexpected *u)
{
    unx_charge(g, u, -1);
    p2p_keep_give(g, u->data, u->cap);
    free(u);
}

/* Whether an early message of plen payload bytes from peer may be kept (UNX_*). */
static int unx_fits(const struct ngroup *g, int peer, size_t plen)
{
    size_t cost = plen + UNX_MSG_COST;
    return plen <= UNX_SMALL && g->unx_from[peer] + cost <= UNX_PEER_MAX &&
           g->unx_bytes + cost <= UNX_GROUP_MAX && g->unx_n_from[peer] < UNX_PEER_MSGS &&
           g->unx_n < UNX_GROUP_MSGS;
}

/* Fail every send and receive in flight and forget half-read messages. */
void p2p_reset(struct net *n, struct ngroup *g, int code, const char *why)
{
    g->p2p_def.set = 0; /* the epoch ends anyway, with its connections */
    for (int p = 0; p < RDV_MAX_NODES; p++) {
        struct p2p_out *o = &g->out[p];
        net_return_list(n, &o->head, &o->tail, code, why);
        o->done = 0;
        net_return_list(n, &o->wait_head, &o->wait_tail, code, why);
        net_return_list(n, &o->rts_head, &o->rts_tail, code, why);
        o->nacks = o->acks_done = 0;
        struct p2p_in *in = &g->in[p];
        if (in->task) net_return_task(n, in->task, code, why);
        if (in->unx) unx_free(g, in->unx);
        memset(in, 0, sizeof(*in));
    }
    net_return_list(n, &g->posted_head, &g->posted_tail, code, why);
    net_return_list(n, &g->cts_head, &g->cts_tail, code, why);
    while (g->unx_head) {
        struct unexpected *u = g->unx_head;
        g->unx_head = u->next;
        unx_free(g, u);
    }
    g->unx_tail = NULL;
}

static int my_rank(const struct ngroup *g, const struct net_task *t)
{
    return g->me * g->nlocal + t->local_slot;
}

static int p2p_any(const struct net_task *t)
{
    return t->root == WIRE_ANY_SOURCE;
}

/* Does receive t take the message described by h? 1 yes, 0 not for it. */
static int p2p_matches(const struct ngroup *g, const struct net_task *t,
                       const struct data_op_hdr *h)
{
    return (p2p_any(t) || h->src_rank == (uint32_t)t->root) &&
           h->dst_rank == (uint32_t)my_rank(g, t) &&
           (h->seq & 0xffffffffu) == t->seq; /* a send or receive's seq is its tag */
}

/* Receive t may take a message here: a named one always, one from any rank unless the
 * engine paired it in the pod first (net.h), which gets it back untouched. */
static int p2p_claim(struct net *n, struct net_task *t)
{
    if (!p2p_any(t) || net_any_claim(t, NET_ANY_NET)) return 1;
    net_return_task(n, t, COLL_OK, "");
    return 0;
}

/* The oldest posted receive that takes the message of header h, out of the list (NULL:
 * none); receives from any rank that the engine paired meanwhile go back on the way. */
static struct net_task *posted_take(struct net *n, struct ngroup *g, const struct data_op_hdr *h)
{
    struct net_task **pp = &g->posted_head, *prev = NULL;
    while (*pp) {
        struct net_task *t = *pp;
        if (!p2p_matches(g, t, h)) {
            prev = t;
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        if (g->posted_tail == t) g->posted_tail = prev;
        t->next = NULL;
        if (p2p_claim(n, t)) return t;
    }
    return NULL;
}

void p2p_purge(struct net *n, struct ngroup *g)
{
    struct net_task **pp = &g->posted_head, *prev = NULL;
    while (*pp) {
        struct net_task *t = *pp;
        if (!p2p_any(t) || atomic_load(&t->any_claim) != NET_ANY_ENGINE) {
            prev = t;
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        if (g->posted_tail == t) g->posted_tail = prev;
        t->next = NULL;
        net_return_task(n, t, COLL_OK, "");
    }
}

static int p2p_agree(const struct net_task *t, const struct data_op_hdr *h)
{
    return h->count == t->count && h->dtype == t->dtype && (uint32_t)h->root == t->p2p_sig;
}

static void p2p_write(struct net *n, struct ngroup *g, int peer);
static void p2p_read(struct net *n, struct ngroup *g, int peer);

/* End g's epoch for what its sends and receives met, lost: the pod whose connection broke
 * (closed here), or -1; later: the queued collectives may finish first. On the engine's
 * turn it is only noted, the first such end (the engine touches neither the rendezvous
 * nor a socket the net thread may be polling), and the net thread acts on it next. */
static void p2p_end(struct net *n, struct ngroup *g, int lost, int code, const char *why, int later)
{
    if (net_engine_turn) {
        if (g->p2p_def.set) return;
        g->p2p_def.set = 1;
        g->p2p_def.code = code;
        g->p2p_def.lost = lost;
        g->p2p_def.later = later;
        snprintf(g->p2p_def.why, sizeof(g->p2p_def.why), "%s", why);
        return;
    }
    if (lost >= 0 && g->pfds[lost] >= 0) {
        close(g->pfds[lost]);
        g->pfds[lost] = -1;
    }
    if (later)
        n->epoch->end_later(n, g, code, why, 1);
    else
        n->epoch->end(n, g, code, why, 0, 1);
}

void p2p_settle(struct net *n, struct ngroup *g)
{
    if (!g->p2p_def.set) return;
    char why[sizeof(g->p2p_def.why)];
    snprintf(why, sizeof(why), "%s", g->p2p_def.why);
    g->p2p_def.set = 0;
    p2p_end(n, g, g->p2p_def.lost, g->p2p_def.code, why, g->p2p_def.later);
}

static void q_append(struct net_task **head, struct net_task **tail, struct net_task *t)
{
    t->next = NULL;
    if (*tail)
        (*tail)->next = t;
    else
        *head = t;
    *tail = t;
}

/* A frame's seq: the tag, and above it the number of the send among the sender's
 * messages to that pod, which acks and CTSs echo, so each finds its own send whatever
 * order receives complete in. */
static uint64_t wire_seq(const struct net_task *t)
{
    return t->seq | (uint64_t)t->p2p_no << 32;
}

/* The task of the list whose ranks and frame seq are these (ours: mine, the other
 * pod's: theirs), taken out; NULL if none. */
static struct net_task *q_take(const struct ngroup *g, struct net_task **head,
                               struct net_task **tail, uint32_t theirs, uint32_t mine, uint64_t seq)
{
    struct net_task **pp = head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        struct net_task *t = *pp;
        int peer = p2p_any(t) ? t->source : t->root; /* a cleared receive from any rank */
        if ((uint32_t)peer != theirs || (uint32_t)my_rank(g, t) != mine || wire_seq(t) != seq)
            continue;
        *pp = t->next;
        if (*tail == t) *tail = prev;
        t->next = NULL;
        return t;
    }
    return NULL;
}

/* Queue a header-only frame (an ack or a CTS) to peer; written between messages. */
static void p2p_say(struct net *n, struct ngroup *g, int peer, const struct data_op_hdr *h)
{
    struct p2p_out *o = &g->out[peer];
    if (o->nacks == o->capacks) {
        size_t cap = o->capacks ? 2 * o->capacks : 16;
        struct data_op_hdr *a = realloc(o->acks, cap * sizeof(*a));
        if (!a) {
            p2p_end(n, g, -1, COLL_ERR_NOMEM, "no memory to answer a message", 0);
            return;
        }
        o->acks = a;
        o->capacks = cap;
    }
    o->acks[o->nacks++] = *h;
    p2p_write(n, g, peer);
}

/* Complete receive t with the message of header h: matched, or a mismatch named; the
 * sender is told either way (an ack: kind RECV, root = status, the receive's count). */
static void p2p_finish(struct net *n, struct ngroup *g, struct net_task *t,
                       const struct data_op_hdr *h)
{
    char w[160] = "";
    int ok = p2p_agree(t, h);
    if (!ok && (uint32_t)h->root != t->p2p_sig)
        wire_sig_why(w, sizeof(w), (int)h->src_rank, (unsigned)h->root, (int)h->dst_rank,
                     t->p2p_sig);
    else if (!ok)
        snprintf(w, sizeof(w), "rank %u sent %llu of %s; the receive on rank %u is for %llu of %s",
                 h->src_rank, (unsigned long long)h->count, coll_dtype_name((coll_dtype)h->dtype),
                 h->dst_rank, (unsigned long long)t->count, coll_dtype_name((coll_dtype)t->dtype));
    struct data_op_hdr ack = {.magic = DATA_MAGIC,
                              .kind = WIRE_OP_RECV,
                              .dtype = t->dtype,
                              .root = ok ? COLL_OK : COLL_ERR_MISMATCH,
                              .src_rank = h->dst_rank,
                              .dst_rank = h->src_rank,
                              .seq = h->seq, /* the frame's own */
                              .count = t->count};
    t->source = (int)h->src_rank;
    net_return_task(n, t, ok ? COLL_OK : COLL_ERR_MISMATCH, w);
    if (!(h->flags & P2P_F_NOACK) || h->redop == P2P_RTS) /* an ask waits for its answer */
        p2p_say(n, g, (int)(h->src_rank / (uint32_t)g->nlocal), &ack);
}

/* Receive t meets the ask (RTS) h of a large send: clear to send, and t waits for the
 * payload; or, when they disagree, the mismatch is said at once (no payload comes). */
static void p2p_clear(struct net *n, struct ngroup *g, struct net_task *t,
                      const struct data_op_hdr *h)
{
    if (!p2p_agree(t, h)) {
        p2p_finish(n, g, t, h);
        return;
    }
    struct data_op_hdr cts = {.magic = DATA_MAGIC,
                              .kind = WIRE_OP_RECV,
                              .dtype = t->dtype,
                              .redop = P2P_CTS,
                              .root = COLL_OK,
                              .src_rank = h->dst_rank,
                              .dst_rank = h->src_rank,
                              .seq = h->seq,
                              .count = t->count};
    t->p2p_no = (uint32_t)(h->seq >> 32); /* its DATA comes with this seq */
    t->source = (int)h->src_rank;         /* ... from this rank (one from any rank) */
    q_append(&g->cts_head, &g->cts_tail, t);
    p2p_say(n, g, (int)(h->src_rank / (uint32_t)g->nlocal), &cts);
}

/* A CTS from peer: the oldest large send of that pair and tag that asked goes out. */
static int p2p_cleared(struct net *n, struct ngroup *g, int peer, const struct data_op_hdr *h)
{
    struct p2p_out *o = &g->out[peer];
    struct net_task *t = q_take(g, &o->rts_head, &o->rts_tail, h->src_rank, h->dst_rank, h->seq);
    if (!t) return -1;
    t->p2p_phase = P2P_DATA;
    q_append(&o->head, &o->tail, t);
    p2p_write(n, g, peer);
    return 0;
}

/* An ack from peer for one of our sends (its header h, checked): the oldest send of
 * that pair waiting for one completes with the receiver's verdict. */
static int p2p_acked(struct net *n, struct ngroup *g, int peer, const struct data_op_hdr *h)
{
    struct p2p_out *o = &g->out[peer];
    struct net_task *t = q_take(g, &o->wait_head, &o->wait_tail, h->src_rank, h->dst_rank, h->seq);
    if (!t) /* a large send's receive disagreed: the verdict comes instead of a CTS */
        t = q_take(g, &o->rts_head, &o->rts_tail, h->src_rank, h->dst_rank, h->seq);
    if (!t) return -1;
    char w[160] = "";
    int st = h->root == COLL_OK ? COLL_OK : COLL_ERR_MISMATCH;
    if (st != COLL_OK)
        snprintf(w, sizeof(w), "rank %u sent %llu of %s; the receive on rank %u is for %llu of %s",
                 h->dst_rank, (unsigned long long)t->count, coll_dtype_name((coll_dtype)t->dtype),
                 h->src_rank, (unsigned long long)h->count, coll_dtype_name((coll_dtype)h->dtype));
    net_return_task(n, t, st, w);
    return 0;
}

/* The send/recv connection to peer broke: that pod is leaving. Collectives already
 * queued may still complete, so the epoch ends once they have (ng_abort_later). */
static void p2p_lost(struct net *n, struct ngroup *g, int peer, const char *why)
{
    p2p_end(n, g, peer, COLL_ERR_PEER_LOST, why, 1);
}

void p2p_post(struct net *n, struct ngroup *g, struct net_task *t)
{
    t->next = NULL;
    if (!net_engine_turn) p2p_settle(n, g); /* an end the engine met first */
    if (!g->ready) {
        net_return_task(n, t, COLL_ERR_PEER_LOST, "the group's epoch ended");
        return;
    }
    if (t->kind == WIRE_OP_SEND) {
        int peer = t->root / g->nlocal;
        t->p2p_phase = P2P_EAGER; /* p2p_write decides */
        q_append(&g->out[peer].head, &g->out[peer].tail, t);
        p2p_write(n, g, peer);
        return;
    }
    /* a receive (from any rank: unless the engine paired it in the pod meanwhile) */
    if (p2p_any(t) && atomic_load(&t->any_claim) == NET_ANY_ENGINE) {
        net_return_task(n, t, COLL_OK, "");
        return;
    }
    /* the message may be here already */
    struct unexpected **pp = &g->unx_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        struct unexpected *u = *pp;
        if (!p2p_matches(g, t, &u->hdr)) continue;
        if (!p2p_claim(n, t)) return;
        *pp = u->next;
        if (g->unx_tail == u) g->unx_tail = prev;
        if (u->hdr.redop == P2P_RTS) { /* a large send asked: clear it */
            struct data_op_hdr h = u->hdr;
            unx_free(g, u);
            p2p_clear(n, g, t, &h);
            return;
        }
        int ok = p2p_agree(t, &u->hdr);
        if (ok && t->count)
            memcpy(t->recv[t->local_slot], u->data,
                   t->count * coll_dtype_size((coll_dtype)t->dtype));
        struct data_op_hdr h = u->hdr;
        unx_free(g, u);
        p2p_finish(n, g, t, &h);
        return;
    }
    /* or parked in its sender's socket (any sender's, for a receive from any rank): read
     * it straight into this receive */
    int first = p2p_any(t) ? 0 : t->root / g->nlocal;
    int last = p2p_any(t) ? g->nodes - 1 : first;
    for (int from = first; from <= last; from++) {
        struct p2p_in *in = &g->in[from];
        if (from == g->me || !in->parked || !p2p_matches(g, t, &in->hdr)) continue;
        if (!p2p_claim(n, t)) return;
        if (in->hdr.redop == P2P_RTS) {
            struct data_op_hdr h = in->hdr; /* an ask, parked for want of room: done with */
            memset(in, 0, sizeof(*in));
            p2p_clear(n, g, t, &h);
        } else {
            in->parked = 0;
            in->task = t;
            in->discard = !p2p_agree(t, &in->hdr);
        }
        p2p_read(n, g, from);
        return;
    }
    if (g->posted_tail)
        g->posted_tail->next = t;
    else
        g->posted_head = t;
    g->posted_tail = t;
}

static void p2p_write(struct net *n, struct ngroup *g, int peer)
{
    struct p2p_out *o = &g->out[peer];
    while (o->done == 0 && o->nacks && g->pfds[peer] >= 0) { /* acks go between messages */
        struct iovec a = {(char *)&o->acks[0] + o->acks_done, sizeof(o->acks[0]) - o->acks_done};
        ssize_t r = dataconn_p2p_send(g, peer, &a, 1);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (r < 0) {
            char why[128];
            snprintf(why, sizeof(why), "ack to node %d: %s", peer, strerror(errno));
            p2p_lost(n, g, peer, why);
            return;
        }
        o->acks_done += (size_t)r;
        if (o->acks_done < sizeof(o->acks[0])) return;
        o->acks_done = 0;
        memmove(o->acks, o->acks + 1, (o->nacks - 1) * sizeof(*o->acks));
        o->nacks--;
    }
    while (o->head && g->pfds[peer] >= 0) {
        struct net_task *t = o->head;
        size_t bytes = t->count * coll_dtype_size((coll_dtype)t->dtype);
        if (o->done == 0) {
            if (t->p2p_phase != P2P_DATA) { /* its first frame: eager, or an ask */
                t->p2p_no = ++o->msgno;
                t->p2p_phase = bytes > UNX_SMALL ? P2P_RTS : P2P_EAGER;
            }
            o->hdr = (struct data_op_hdr){.magic = DATA_MAGIC,
                                          .kind = WIRE_OP_SEND,
                                          .dtype = t->dtype,
                                          .redop = t->p2p_phase,
                                          .flags = t->p2p_noack ? P2P_F_NOACK : 0u,
                                          .root = (int32_t)t->p2p_sig,
                                          .src_rank = (uint32_t)my_rank(g, t),
                                          .dst_rank = (uint32_t)t->root,
                                          .seq = wire_seq(t),
                                          .count = t->count};
        }
        if (t->p2p_phase == P2P_RTS) bytes = 0; /* the header alone */
        struct iovec v[2];
        int nv = 0;
        if (o->done < sizeof(o->hdr))
            v[nv++] = (struct iovec){(char *)&o->hdr + o->done, sizeof(o->hdr) - o->done};
        size_t pdone = o->done > sizeof(o->hdr) ? o->done - sizeof(o->hdr) : 0;
        if (bytes > pdone)
            v[nv++] = (struct iovec){(char *)t->send[t->local_slot] + pdone, bytes - pdone};
        ssize_t r = nv ? dataconn_p2p_send(g, peer, v, nv) : 0;
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (r < 0) {
            char why[128];
            snprintf(why, sizeof(why), "send to node %d: %s", peer, strerror(errno));
            p2p_lost(n, g, peer, why);
            return;
        }
        o->done += (size_t)r;
        if (o->done == sizeof(o->hdr) + bytes) {
            o->head = t->next;
            if (!o->head) o->tail = NULL;
            o->done = 0;
            if (t->p2p_phase == P2P_RTS) /* its CTS sends it again, with the payload */
                q_append(&o->rts_head, &o->rts_tail, t);
            else if (t->p2p_noack) /* written: done (no word comes back) */
                net_return_task(n, t, COLL_OK, "");
            else /* now its receive's ack completes it */
                q_append(&o->wait_head, &o->wait_tail, t);
            if (o->nacks) {
                p2p_write(n, g, peer); /* acks queued meanwhile */
                return;
            }
        }
    }
}

static void p2p_read(struct net *n, struct ngroup *g, int peer)
{
    struct p2p_in *in = &g->in[peer];
    char sink[4096];
    for (;;) {
        if (g->pfds[peer] < 0 || in->parked) return;
        void *dst;
        size_t want;
        if (in->hgot < sizeof(in->hdr)) {
            dst = (char *)&in->hdr + in->hgot;
            want = sizeof(in->hdr) - in->hgot;
        } else {
            if (in->discard)
                dst = sink;
            else if (in->task)
                dst = (char *)in->task->recv[in->task->local_slot] + in->pgot;
            else
                dst = (char *)in->unx->data + in->pgot;
            want = in->plen - in->pgot;
            if (in->discard && want > sizeof(sink)) want = sizeof(sink);
        }
        ssize_t r = want ? dataconn_p2p_recv(g, peer, dst, want) : 0;
        if (want && r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (want && r <= 0) {
            char why[128];
            if (r < 0 && (errno == EBADMSG || errno == EPROTO))
                snprintf(why, sizeof(why), "node %d's bytes failed their check (security.data)",
                         peer);
            else
                snprintf(why, sizeof(why), "node %d closed its send/recv connection", peer);
            p2p_lost(n, g, peer, why);
            return;
        }
        if (in->hgot < sizeof(in->hdr)) {
            in->hgot += (size_t)r;
            if (in->hgot < sizeof(in->hdr)) continue;
            struct data_op_hdr *h = &in->hdr;
            uint64_t plen;
            char hw[128];
            if (data_send_hdr_check(h, (uint32_t)g->nlocal, (uint32_t)peer, (uint32_t)g->me, &plen,
                                    hw, sizeof(hw)) < 0) {
                char why[200];
                snprintf(why, sizeof(why), "bad send header from node %d: %s", peer, hw);
                p2p_end(n, g, -1, COLL_ERR_PROTOCOL, why, 0);
                return;
            }
            in->plen = (size_t)plen;
            if (h->kind == WIRE_OP_RECV) { /* an ack or a CTS: no payload */
                struct data_op_hdr ack = *h;
                memset(in, 0, sizeof(*in));
                if ((ack.redop == P2P_CTS ? p2p_cleared(n, g, peer, &ack)
                                          : p2p_acked(n, g, peer, &ack)) < 0) {
                    char why[160];
                    snprintf(why, sizeof(why), "node %d %s a send it was never %s", peer,
                             ack.redop == P2P_CTS ? "cleared" : "acknowledged",
                             ack.redop == P2P_CTS ? "asked for" : "sent");
                    p2p_end(n, g, -1, COLL_ERR_PROTOCOL, why, 0);
                    return;
                }
                continue;
            }
            in->pgot = 0;
            if (h->redop == P2P_DATA) { /* the payload of a send we cleared */
                in->task = q_take(g, &g->cts_head, &g->cts_tail, h->src_rank, h->dst_rank, h->seq);
                if (!in->task) {
                    char why[160];
                    snprintf(why, sizeof(why), "node %d sent a payload nobody cleared", peer);
                    p2p_end(n, g, -1, COLL_ERR_PROTOCOL, why, 0);
                    return;
                }
                /* its own header says how long it is: one that disagrees with the
                 * receive it was cleared for is read into nothing (MISMATCH) */
                in->discard = !p2p_agree(in->task, h);
                continue;
            }
            if (h->redop == P2P_RTS) { /* a large send asks: its receive may be posted */
                struct data_op_hdr rh = *h;
                struct net_task *m = posted_take(n, g, &rh);
                if (!m && !unx_fits(g, peer, 0)) {
                    in->parked = 1; /* no room to keep the ask: the stream waits */
                    return;
                }
                memset(in, 0, sizeof(*in));
                if (m) {
                    p2p_clear(n, g, m, &rh);
                    continue;
                }
                struct unexpected *u = calloc(1, sizeof(*u));
                if (!u) {
                    p2p_end(n, g, -1, COLL_ERR_NOMEM, "no memory for an early message", 0);
                    return;
                }
                u->hdr = rh;
                u->from = peer;
                u->cost = UNX_MSG_COST;
                unx_charge(g, u, 1);
                if (g->unx_tail)
                    g->unx_tail->next = u;
                else
                    g->unx_head = u;
                g->unx_tail = u;
                continue;
            }
            in->task = posted_take(n, g, h);
            if (in->task) in->discard = !p2p_agree(in->task, h);
            if (!in->task) {
                if (!unx_fits(g, peer, in->plen)) {
                    in->parked = 1; /* read on when its receive is posted */
                    return;
                }
                in->unx = calloc(1, sizeof(*in->unx));
                if (in->unx) in->unx->data = p2p_keep_take(g, in->plen, &in->unx->cap);
                if (!in->unx || !in->unx->data) {
                    if (in->unx) free(in->unx);
                    in->unx = NULL;
                    p2p_end(n, g, -1, COLL_ERR_NOMEM, "no memory for an early message", 0);
                    return;
                }
                in->unx->hdr = *h;
                in->unx->from = peer;
                in->unx->cost = in->plen + UNX_MSG_COST;
                unx_charge(g, in->unx, 1);
            }
        } else {
            in->pgot += (size_t)r;
        }
        if (in->pgot < in->plen) continue;
        /* a whole message */
        if (in->task) {
            p2p_finish(n, g, in->task, &in->hdr);
        } else {
            /* its receive may have been posted while the bytes were arriving */
            struct unexpected *u = in->unx;
            struct net_task *match = posted_take(n, g, &u->hdr);
            if (match) {
                if (p2p_agree(match, &u->hdr) && match->count)
                    memcpy(match->recv[match->local_slot], u->data, in->plen);
                struct data_op_hdr h = u->hdr;
                unx_free(g, u);
                p2p_finish(n, g, match, &h);
            } else {
                u->next = NULL;
                if (g->unx_tail)
                    g->unx_tail->next = u;
                else
                    g->unx_head = u;
                g->unx_tail = u;
            }
        }
        memset(in, 0, sizeof(*in));
    }
}

/* Move every send and receive of g as far as the sockets allow, without blocking. */
void p2p_progress(struct net *n, struct ngroup *g)
{
    p2p_settle(n, g);
    if (!g->ready) return;
    for (int p = 0; p < g->nodes; p++) {
        if (p == g->me) continue;
        p2p_read(n, g, p);
        if (!g->ready) return;
        p2p_write(n, g, p);
        if (!g->ready) return;
    }
}

void p2p_peer(struct net *n, struct ngroup *g, int peer)
{
    p2p_read(n, g, peer);
    if (!g->p2p_def.set && g->ready) p2p_write(n, g, peer);
}

/* The earliest deadline of a send or receive in flight (INT64_MAX: none). */
int64_t p2p_oldest_deadline(const struct ngroup *g)
{
    int64_t oldest = INT64_MAX;
    if (g->posted_head) oldest = g->posted_head->deadline_ns;
    for (const struct net_task *t = g->cts_head; t; t = t->next) /* cleared in any order */
        if (t->deadline_ns < oldest) oldest = t->deadline_ns;
    for (int p = 0; p < g->nodes; p++) {
        const struct p2p_out *o = &g->out[p];
        if (o->head && o->head->deadline_ns < oldest) oldest = o->head->deadline_ns;
        for (const struct net_task *t = o->wait_head; t; t = t->next)
            if (t->deadline_ns < oldest) oldest = t->deadline_ns;
        for (const struct net_task *t = o->rts_head; t; t = t->next)
            if (t->deadline_ns < oldest) oldest = t->deadline_ns;
    }
    return oldest;
}

void p2p_free(struct ngroup *g)
{
    for (int p = 0; p < RDV_MAX_NODES; p++)
        free(g->out[p].acks);
    p2p_keep_free(g);
}
