/*
 * tcp.c: the transfers of collectives between pods over TCP (see tcp.h): the exchange
 * loop, headers, the acks a broadcast root goes on without, and the local helpers;
 * tcp_ops.c builds the collectives from them.
 *
 * Every pod runs the same ops of a group in the same order over one connection per
 * pair of pods, so the byte streams stay in step without framing; each op's first
 * message to a peer carries a header (kind, dtype, count, reduction, root, number in
 * the epoch) and a peer that disagrees fails the op with COLL_ERR_MISMATCH instead of
 * misreading the stream. Results are identical on every pod: the direct exchange
 * reduces contributions in pod order everywhere, and the ring reduces each chunk once
 * and then circulates it.
 *
 * All transfers of a step run at once through one poll loop (exchange()); a ring
 * step reduces each segment as soon as it has arrived, so reduction overlaps the
 * network. A send may relay a receive (gate): the broadcast chain and the allgather
 * ring pass bytes on as they arrive instead of going step by step.
 */
#include "tcp_priv.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../reduce.h"
#include "ring.h"
#include "coll/coll.h"
#include "wire.h"
#include "util.h"

#define SEG_BYTES (256 * 1024)       /* reduce-on-arrival granularity */
#define CALL_BYTES ((size_t)1 << 20) /* a transfer's share of one pass (tcp_exchange) */

/* Payload bytes x has moved (its header excluded). */
static size_t x_payload_done(const struct xfer *x)
{
    return x->done > x->hl ? x->done - x->hl : 0;
}

/* How far x may move now: all of it, or for a relay, its header and what has arrived. */
static size_t x_limit(const struct xfer *x)
{
    if (!x->gate) return x->total;
    size_t lim = x->hl + x->gate_base + x_payload_done(x->gate);
    return lim < x->total ? lim : x->total;
}

/* A send with copy_to has moved from done_before to done: copy what went of its first
 * payload piece (TCP_COPY_AS_SENT_BYTES). */
static void x_copy_sent(const struct xfer *x, size_t done_before)
{
    const struct iovec *pl = &x->iov[x->hl ? 1 : 0];
    size_t from = done_before > x->hl ? done_before - x->hl : 0;
    size_t to = x_payload_done(x);
    if (to > pl->iov_len) to = pl->iov_len;
    if (to > from) memcpy(x->copy_to + from, (const char *)pl->iov_base + from, to - from);
}

void tcp_x_send(struct xfer *x, int peer, const void *hdr, size_t hl, const void *p, size_t n)
{
    memset(x, 0, sizeof(*x));
    x->peer = peer;
    x->is_send = 1;
    if (hdr) x->iov[x->niov++] = (struct iovec){(void *)hdr, hl};
    if (n) x->iov[x->niov++] = (struct iovec){(void *)p, n};
    x->hl = hdr ? hl : 0;
    x->total = x->hl + n;
}

void tcp_x_recv(struct xfer *x, int peer, void *hdr, size_t hl, void *p, size_t n)
{
    memset(x, 0, sizeof(*x));
    x->peer = peer;
    if (hdr) x->iov[x->niov++] = (struct iovec){hdr, hl};
    if (n) x->iov[x->niov++] = (struct iovec){p, n};
    x->hl = hdr ? hl : 0;
    x->total = x->hl + n;
    x->check_hdr = hdr != NULL;
}

void tcp_x_fold(struct xfer *x, void *dst, const void *mine)
{
    x->red_dst = dst;
    x->red_src = mine;
    /* a separate operand of ours: what arrives lands in dst and is folded there, so no
     * scratch passes through the caches */
    if (mine && mine != dst && x->total > x->hl) x->iov[x->niov - 1].iov_base = dst;
}

/* The iovec of x from its current offset up to limit. */
static int x_iov(const struct xfer *x, size_t limit, struct iovec *out)
{
    size_t skip = x->done, room = limit - x->done;
    int n = 0;
    for (int i = 0; i < x->niov && room; i++) {
        if (skip >= x->iov[i].iov_len) {
            skip -= x->iov[i].iov_len;
            continue;
        }
        size_t len = x->iov[i].iov_len - skip;
        if (len > room) len = room;
        out[n].iov_base = (char *)x->iov[i].iov_base + skip;
        out[n].iov_len = len;
        room -= len;
        skip = 0;
        n++;
    }
    return n;
}

static void fold(struct opctx *o, struct xfer *x, int final)
{
    if (!x->red_dst) return;
    struct iovec *pl = &x->iov[x->niov - 1]; /* one piece: a scratch area */
    size_t have = x_payload_done(x);
    size_t upto = final ? have : (have / SEG_BYTES) * SEG_BYTES;
    if (x->red_after) {
        size_t sent = x_payload_done(x->red_after);
        if (upto > sent) upto = sent;
    }
    upto -= upto % o->es;
    while (x->red_done < upto) {
        size_t len = upto - x->red_done;
        size_t max = (size_t)REDUCE_CHUNK * o->es;
        if (len > max) len = max;
        char *d = (char *)x->red_dst + x->red_done, *in = (char *)pl->iov_base + x->red_done;
        const void *mine = x->red_src ? (const char *)x->red_src + x->red_done : d;
        /* landed in red_dst itself: folded where it is (the arrived operand first) */
        const void *srcs[2] = {in == d ? (const void *)in : mine, in == d ? mine : in};
        reduce_n(o->t->dtype, o->red_op, d, srcs, 2, len / o->es, 1);
        x->red_done += len;
    }
}

int tcp_failf(struct opctx *o, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->why, o->whylen, fmt, ap);
    va_end(ap);
    return code;
}

void tcp_stash_drop(struct tcp_stash *s, int n)
{
    for (int i = 0; s && i < n; i++)
        s[i].off = s[i].len = 0;
}

size_t tcp_stash_front(struct tcp_stash *s)
{
    if (s->off) memmove(s->b, s->b + s->off, s->len);
    s->off = 0;
    return s->len;
}

/* Read node p's bytes into v[0..nv) (nv at most 4, as x_iov makes) as recvmsg would,
 * without waiting: first what was read ahead, then the socket, offering it the stash too
 * when little is asked for. */
static ssize_t conn_read(struct tcp_comm *c, int p, const struct iovec *v, int nv)
{
    if (c->io) return c->io->recv(c->io->ctx, p, c->rfds[p], v, nv);
    struct tcp_stash *s = c->stash ? &c->stash[p] : NULL;
    struct iovec w[5];
    size_t got = 0, rest = 0;
    int nw = 0;
    for (int i = 0; i < nv && i < 4; i++) {
        size_t take = !s ? 0 : s->len < v[i].iov_len ? s->len : v[i].iov_len;
        if (take) {
            memcpy(v[i].iov_base, s->b + s->off, take);
            s->off += (uint32_t)take;
            s->len -= (uint32_t)take;
            got += take;
        }
        if (take < v[i].iov_len) {
            w[nw++] = (struct iovec){(char *)v[i].iov_base + take, v[i].iov_len - take};
            rest += v[i].iov_len - take;
        }
    }
    if (!nw) return (ssize_t)got;
    if (s) s->off = 0; /* empty: every asked-for byte it held is taken */
    if (s && rest <= TCP_STASH_BYTES) w[nw++] = (struct iovec){s->b, sizeof(s->b)};
    struct msghdr mh = {.msg_iov = w, .msg_iovlen = (size_t)nw};
    ssize_t r = recvmsg(c->rfds[p], &mh, MSG_DONTWAIT);
    if (r <= 0) return got ? (ssize_t)got : r; /* a close or an error shows on the next call */
    if ((size_t)r > rest) {
        s->len = (uint32_t)((size_t)r - rest);
        r = (ssize_t)rest;
    }
    return (ssize_t)got + r;
}

static int check_hdr(struct opctx *o, int peer);
static int peek_acks(struct opctx *o, const struct xfer *x, int nx);

/* Move every transfer to completion, checking each received header against ours as
 * soon as it is in (so callers need not). Relays (sends with a gate) go after the
 * receives that feed them, so what arrives is passed on in the same pass. */
int tcp_exchange(struct opctx *o, struct xfer *x, int nx)
{
    struct tcp_comm *c = o->c;
    struct pollfd pf[2 * RDV_MAX_NODES + 4]; /* the transfers' sockets, and wake_fd */
    int idx[2 * RDV_MAX_NODES + 2];
    int64_t wait_from = 0, budget = 0; /* the wait now under way (0: none) and its spin */
    int slept = 0;                     /* ... and whether it slept in poll */
    int capped = 0;                    /* ... and whether the short way capped its spin */
    for (;;) {
        int left = 0, np = 0, moved = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < nx; i++) {
                struct xfer *t = &x[i];
                if ((t->gate != NULL) != pass) continue;
                /* try first: most small transfers complete without a poll. One call
                 * of at most CALL_BYTES per transfer and pass: sends and
                 * receives take turns, so what one pod sends is read by the other while
                 * it is still in the caches (a send that fills the socket buffers
                 * first measured 25% slower at 64 MiB) */
                size_t lim;
                int calls = 0;
                while (t->done < (lim = x_limit(t)) && !calls++) {
                    struct iovec v[4];
                    if (lim - t->done > CALL_BYTES) lim = t->done + CALL_BYTES;
                    int nv = x_iov(t, lim, v);
                    /* a send never raises SIGPIPE: this code also runs inside the
                     * application (direct ops), whose signals are not ours */
                    struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)nv};
                    ssize_t r = !t->is_send ? conn_read(c, t->peer, v, nv)
                                : c->io ? c->io->send(c->io->ctx, t->peer, c->fds[t->peer], v, nv)
                                        : sendmsg(c->fds[t->peer], &mh, MSG_NOSIGNAL);
                    if (r > 0) {
                        t->done += (size_t)r;
                        if (t->copy_to) x_copy_sent(t, t->done - (size_t)r);
                        /* what ended the wait (a short spin tells nothing of the learnt) */
                        if (wait_from && c->spin && !capped && !moved)
                            spin_learn(&c->spin[t->peer], !slept, TCP_SPIN_MAX_NS);
                        moved = 1;
                        if (t->is_send) continue;
                        if (t->check_hdr && t->done >= t->hl) {
                            t->check_hdr = 0;
                            int st = check_hdr(o, t->peer);
                            if (st != COLL_OK) return st;
                        }
                        fold(o, t, 0);
                        continue;
                    }
                    if (r == 0 && !t->is_send)
                        return tcp_failf(o, COLL_ERR_PEER_LOST,
                                         "node %d closed the data connection", t->peer);
                    if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
                    if (r < 0 && t->is_send && (errno == EPIPE || errno == ECONNRESET)) {
                        /* the peer closed: it either finished this op and left (and needs
                         * nothing more from us) or failed; our own result depends only on
                         * what we receive, so carry on and let the receives decide */
                        size_t before = t->done;
                        t->done = t->total;
                        if (t->copy_to) x_copy_sent(t, before);
                        break;
                    }
                    if (r < 0 && (errno == EBADMSG || errno == EPROTO))
                        return tcp_failf(o, COLL_ERR_PEER_LOST,
                                         "node %d's bytes failed their check (security.data)",
                                         t->peer);
                    return tcp_failf(o, COLL_ERR_PEER_LOST, "data connection to node %d: %s",
                                     t->peer, r < 0 ? strerror(errno) : "closed");
                }
                if (t->done < t->total) {
                    left++;
                    if (t->done >= lim) continue; /* a relay waiting for its receive */
                    pf[np] = (struct pollfd){.fd = t->is_send ? c->fds[t->peer] : c->rfds[t->peer],
                                             .events = t->is_send ? POLLOUT : POLLIN};
                    idx[np++] = i;
                } else if (!t->is_send && t->red_dst && t->red_done < t->total) {
                    fold(o, t, 1);
                }
            }
        }
        if (!left) {
            /* every send is done: folds held back behind one (red_after) can finish */
            for (int i = 0; i < nx; i++)
                if (!x[i].is_send) fold(o, &x[i], 1);
            return COLL_OK;
        }
        if (moved) { /* look again at once: more is usually there */
            wait_from = 0;
            slept = 0;
            capped = 0;
            continue;
        }
        /* Nothing moved: spin (yielding while safe, spin.h) for as long as the slowest learner
         * among the pods we wait for allows, then sleep in poll, which lets whoever must
         * produce the bytes run if it shares this CPU. */
        int64_t t = now_ns();
        if (!wait_from) {
            wait_from = t;
            /* a held spin ignores the learners (tcp.h, spin_hold) */
            int learnt = c->spin && !c->spin_hold;
            budget = c->spin ? (learnt ? INT64_MAX : TCP_SPIN_HOLD_NS) : 0;
            for (int i = 0; learnt && i < np; i++) {
                int64_t b = spin_budget(&c->spin[x[idx[i]].peer]);
                if (b < budget) budget = b;
            }
            if (budget == INT64_MAX) budget = 0;
            /* the short way keeps a pausing spin off a neighbour's CPU time; a yielding
             * one gives it way at every look */
            capped = c->short_spin && budget > TCP_SPIN_SHORT_NS && !spin_yields(c->gate, t);
            if (capped) budget = TCP_SPIN_SHORT_NS;
        }
        if (t - wait_from < budget && (!c->budget_until || t < c->budget_until)) {
            /* spin on readiness, not on the calls: a readv that finds nothing takes the
             * socket's lock, which the kernel delivering into that socket then waits
             * for (4 pods on 2 CPUs: 290 empty readv per pod and op before; small ops
             * 2-6% faster, large ones level: bench/ab.sh) */
            int r;
            while ((r = poll(pf, (nfds_t)np, 0)) == 0) {
                t = spin_relax(c->gate, t);
                if (t - wait_from >= budget || (c->budget_until && t >= c->budget_until)) break;
            }
            if (r != 0) continue; /* ready (or failed: the calls say how) */
        }
        if (o->late_acks) { /* the pods may have told us they disagree */
            int st = peek_acks(o, x, nx);
            if (st != COLL_OK) return st;
        }
        int64_t rem = c->deadline_ns - t;
        if (rem <= 0)
            return tcp_failf(o, COLL_ERR_TIMEOUT, "op did not complete before its deadline");
        int ms = rem > 20000000 ? 20 : (int)(rem / 1000000) + 1;
        int nw = np;
        if (c->budget_until) {
            /* on the engine thread: asleep here until the budget ends, unless it has
             * other work (nap, wake_fd); then the net thread takes the op over. Handing
             * it over at once cost two wake-ups per pod and op (4 pods on 2 CPUs, 32 KiB
             * allreduce: bench/RESULTS.md). No timeout shorter than the budget: arming a
             * short timer on a VM's CPU and taking it back cost more than that */
            int64_t until = c->budget_until - t;
            if (!c->nap || until <= 0 || c->nap(c->nap_ctx, 1)) {
                if (c->nap && until > 0) c->nap(c->nap_ctx, 0);
                return TCP_AGAIN;
            }
            for (int k = 0; k < 2; k++)
                if (c->wake_fd[k] >= 0)
                    pf[nw++] = (struct pollfd){.fd = c->wake_fd[k], .events = POLLIN};
            ms = until > rem ? ms : (int)(until / 1000000) + 1;
        }
        int r = poll(pf, (nfds_t)nw, ms);
        if (c->budget_until) {
            c->nap(c->nap_ctx, 0);
            for (int k = np; r > 0 && k < nw; k++)
                if (pf[k].revents) return TCP_AGAIN;
        }
        slept = 1;
        if (r < 0 && errno != EINTR)
            return tcp_failf(o, COLL_ERR_INTERNAL, "poll: %s", strerror(errno));
        char ended[160];
        int st =
            c->budget_until || !c->service ? 0 : c->service(c->service_ctx, ended, sizeof(ended));
        if (st) return tcp_failf(o, st, "%s", ended);
        for (int i = 0; i < np; i++)
            if (pf[i].revents & (POLLERR | POLLNVAL)) {
                int err = 0;
                socklen_t len = sizeof(err);
                if (pf[i].revents & POLLERR) getsockopt(pf[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
                return tcp_failf(o, COLL_ERR_PEER_LOST, "data connection to node %d failed (%s)",
                                 x[idx[i]].peer,
                                 pf[i].revents & POLLNVAL ? "not open" : strerror(err));
            }
    }
}

/* ---- headers -------------------------------------------------------------------------- */

/* Whether b (a peer's header) agrees with a (ours); else why says both. */
static int hdr_agree(char *why, size_t whylen, int peer, const struct data_op_hdr *a,
                     const struct data_op_hdr *b)
{
    int ok = b->magic == DATA_MAGIC && b->kind == a->kind && b->dtype == a->dtype &&
             b->count == a->count && b->seq == a->seq;
    if (ok && wire_kind_reduces(a->kind)) ok = b->redop == a->redop;
    if (ok && wire_kind_rooted(a->kind)) ok = b->root == a->root;
    if (ok) return COLL_OK;
    snprintf(why, whylen,
             "node %d runs %s dtype %u count %llu op %u root %d (#%llu), this node %s dtype "
             "%u count %llu op %u root %d (#%llu)",
             peer, wire_kind_name(b->kind), b->dtype, (unsigned long long)b->count, b->redop,
             b->root, (unsigned long long)b->seq, wire_kind_name(a->kind), a->dtype,
             (unsigned long long)a->count, a->redop, a->root, (unsigned long long)a->seq);
    return COLL_ERR_MISMATCH;
}

static int check_hdr(struct opctx *o, int peer)
{
    return hdr_agree(o->why, o->whylen, peer, &o->hdr, &o->peer_hdr[peer]);
}

/* ---- acks a broadcast root goes on without (tcp.h) ------------------------------------ */

struct tcp_acks *tcp_acks_new(int nodes)
{
    struct tcp_acks *a = calloc(1, sizeof(*a) + (size_t)nodes * sizeof(a->peer[0]));
    if (a) a->nodes = nodes;
    return a;
}

void tcp_acks_reset(struct tcp_acks *a)
{
    if (!a) return;
    /* every pod: bytes a blocked root read from one that owed nothing (peek_acks) are
     * kept with nothing owed, and belong to the old connections */
    for (int p = 0; p < a->nodes; p++) {
        a->peer[p].n = 0;
        a->peer[p].got = 0;
    }
    a->owed = 0;
    a->has_prev = 0;
}

int tcp_acks_export(const struct tcp_acks *a, uint32_t *has_prev, uint32_t *run, void *prev,
                    size_t cap)
{
    _Static_assert(sizeof(struct data_op_hdr) <= TCP_ACKS_STATE, "the state fits");
    if (!a || a->owed || cap < TCP_ACKS_STATE) return -1;
    for (int p = 0; p < a->nodes; p++)
        if (a->peer[p].n || a->peer[p].got) return -1;
    *has_prev = (uint32_t)a->has_prev;
    *run = a->run;
    memset(prev, 0, TCP_ACKS_STATE);
    memcpy(prev, &a->prev, sizeof(a->prev));
    return 0;
}

void tcp_acks_import(struct tcp_acks *a, uint32_t has_prev, uint32_t run, const void *prev)
{
    if (!a) return;
    tcp_acks_reset(a);
    a->has_prev = has_prev != 0;
    a->run = run;
    memcpy(&a->prev, prev, sizeof(a->prev));
}

int tcp_acks_owed(const struct tcp_acks *a)
{
    return a ? a->owed : 0;
}

/* Whether h repeats the previous op (all but its number). */
static int repeats(const struct tcp_acks *a, const struct data_op_hdr *h)
{
    if (!a || !a->has_prev) return 0;
    struct data_op_hdr p = a->prev;
    p.seq = h->seq;
    return memcmp(&p, h, sizeof(p)) == 0;
}

int tcp_ack_plan(const struct tcp_comm *c, const struct data_op_hdr *h)
{
    if (h->kind != WIRE_OP_BROADCAST || !repeats(c->acks, h)) return 0;
    int plan = h->root / c->nlocal == c->me ? TCP_ACK_LATE : 0;
    if ((c->acks->run + 1) % TCP_ACK_EVERY) plan |= TCP_ACK_NONE;
    return plan;
}

void tcp_note_op(struct tcp_comm *c, const struct data_op_hdr *h)
{
    struct tcp_acks *a = c->acks;
    if (!a) return;
    a->run = repeats(a, h) ? a->run + 1 : 0;
    a->prev = *h;
    a->has_prev = 1;
}

void tcp_owe(struct tcp_comm *c, int p, const struct data_op_hdr *h)
{
    struct tcp_owed *w = &c->acks->peer[p];
    w->exp[w->n++] = *h; /* below the window: tcp_settle saw to it */
    c->acks->owed++;
}

/* Check the acks of pod p that are in, oldest first. */
static int owed_check(struct tcp_comm *c, int p, char *why, size_t whylen)
{
    struct tcp_owed *w = &c->acks->peer[p];
    const size_t hl = sizeof(w->in[0]);
    while (w->n && w->got >= hl) {
        int st = hdr_agree(why, whylen, p, &w->exp[0], &w->in[0]);
        if (st != COLL_OK) return st; /* stays owed: the epoch ends on it */
        memmove(&w->exp[0], &w->exp[1], (size_t)(w->n - 1) * hl);
        memmove(&w->in[0], &w->in[1], w->got - hl);
        w->n--;
        w->got -= hl;
        c->acks->owed--;
    }
    return COLL_OK;
}

/* Read up to want bytes of what pod p sent us, without waiting, after what is in, and
 * check the owed acks now complete. */
static int owed_read(struct tcp_comm *c, int p, size_t want, char *why, size_t whylen)
{
    struct tcp_owed *w = &c->acks->peer[p];
    struct iovec v = {(char *)w->in + w->got, want};
    ssize_t r = conn_read(c, p, &v, 1);
    if (r == 0) {
        snprintf(why, whylen, "node %d closed the data connection", p);
        return COLL_ERR_PEER_LOST;
    }
    if (r < 0 && errno != EAGAIN && errno != EINTR) {
        snprintf(why, whylen, "data connection to node %d: %s", p, strerror(errno));
        return COLL_ERR_PEER_LOST;
    }
    if (r > 0) w->got += (size_t)r;
    return owed_check(c, p, why, whylen);
}

/* A broadcast root whose sends block, in a run (o->late_acks): read what the pods it
 * sends to have sent it, without waiting. Only owed acks are expected; a header beyond
 * them is a pod that runs another op and will not read ours. */
static int peek_acks(struct opctx *o, const struct xfer *x, int nx)
{
    struct tcp_comm *c = o->c;
    struct tcp_acks *a = c->acks;
    const size_t hl = sizeof(o->hdr);
    for (int i = 0; a && i < nx; i++) {
        if (!x[i].is_send) continue;
        int p = x[i].peer;
        struct tcp_owed *w = &a->peer[p];
        int st = owed_read(c, p, (w->n ? (size_t)w->n * hl : hl) - w->got, o->why, o->whylen);
        if (st != COLL_OK) return st;
        if (!w->n && w->got >= hl) {
            st = hdr_agree(o->why, o->whylen, p, &o->hdr, &w->in[0]);
            if (st == COLL_OK)
                st = tcp_failf(o, COLL_ERR_MISMATCH, "node %d sent a header (#%llu) unasked", p,
                               (unsigned long long)w->in[0].seq);
            return st;
        }
    }
    return COLL_OK;
}

struct data_op_hdr tcp_op_hdr(const struct tcp_comm *c, const struct net_task *t)
{
    return (struct data_op_hdr){.magic = DATA_MAGIC,
                                .kind = t->kind,
                                .dtype = t->dtype,
                                .redop = t->redop,
                                .root = t->root,
                                .seq = c->seq,
                                .count = t->count};
}

int tcp_settle(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen)
{
    struct tcp_acks *a = c->acks;
    if (!a || !a->owed) return COLL_OK;
    struct data_op_hdr h = tcp_op_hdr(c, t);
    int keep = tcp_ack_plan(c, &h) & TCP_ACK_LATE ? TCP_ACK_WINDOW - 1 : 0;
    const size_t hl = sizeof(h);
    int short_of = 0;
    /* what has arrived, without waiting */
    for (int p = 0; a->owed && p < a->nodes; p++) {
        struct tcp_owed *w = &a->peer[p];
        if (w->n <= keep) continue;
        int st = owed_read(c, p, (size_t)w->n * hl - w->got, why, whylen);
        if (st != COLL_OK) return st;
        short_of += w->n > keep;
    }
    if (!short_of) return COLL_OK;
    /* the rest, pod by pod, as any receive waits (deadline, service, spin; on the
     * engine, its budget: TCP_AGAIN) */
    struct opctx o;
    tcp_init_ctx(&o, c, t, why, whylen);
    for (int p = 0; p < a->nodes; p++) {
        struct tcp_owed *w = &a->peer[p];
        if (w->n <= keep) continue;
        struct xfer x;
        tcp_x_recv(&x, p, NULL, 0, (char *)w->in + w->got, (size_t)(w->n - keep) * hl - w->got);
        int st = tcp_exchange(&o, &x, 1);
        w->got += x.done;
        int ck = owed_check(c, p, why, whylen);
        if (ck != COLL_OK) return ck;
        if (st != COLL_OK) return st;
    }
    return COLL_OK;
}

/* ---- local helpers ------------------------------------------------------------------- */

void tcp_init_ctx(struct opctx *o, struct tcp_comm *c, struct net_task *t, char *why, size_t whylen)
{
    /* field by field: a compound literal would clear peer_hdr, 160 KiB per op */
    o->c = c;
    o->t = t;
    o->why = why;
    o->whylen = whylen;
    o->es = coll_dtype_size((coll_dtype)t->dtype);
    /* an average divides at the end, a premultiplied sum scales where the local
     * contributions are reduced (tcp_local_reduce): between pods both are sums */
    o->red_op = t->redop == COLL_AVG || t->redop == WIRE_REDOP_PREMUL ? COLL_SUM : t->redop;
    o->hdr = tcp_op_hdr(c, t);
    o->late_acks = 0;
}

void *tcp_scratch(struct tcp_comm *c, int k, size_t bytes)
{
    if (bytes == 0) bytes = 1;
    struct tcp_scratch *sc = c->scratch;
    if (sc->cap[k] < bytes) {
        void *p = realloc(sc->p[k], bytes);
        if (!p) return NULL;
        sc->p[k] = p;
        sc->cap[k] = bytes;
    }
    return sc->p[k];
}
