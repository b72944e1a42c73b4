/*
 * tcp.c: collectives between pods over TCP (see tcp.h).
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

static struct data_op_hdr op_hdr(const struct tcp_comm *c, const struct net_task *t)
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
    struct data_op_hdr h = op_hdr(c, t);
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

/* dst[i] = op over srcs (n of them, count elements), chunked; dst may be srcs[0]. */
static void reduce_all(struct opctx *o, void *dst, const void *const *srcs, int n, size_t count)
{
    size_t es = o->es;
    const void *s[RDV_MAX_NODES + NET_MAX_LOCAL];
    for (size_t off = 0; off < count; off += REDUCE_CHUNK) {
        size_t len = count - off < REDUCE_CHUNK ? count - off : REDUCE_CHUNK;
        for (int k = 0; k < n; k++)
            s[k] = (const char *)srcs[k] + off * es;
        /* dst may alias srcs[0] only, which reduce_n allows */
        reduce_n(o->t->dtype, o->red_op, (char *)dst + off * es, s, n, len, 1);
    }
}

/* mine = the reduction, in pod order, of every pod's contribution: ours in mine, pod p's
 * at in + p * bytes (our own slot there is unused and serves as the output). The same
 * order on every pod is what makes the results identical everywhere. */
void tcp_reduce_in_pod_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count)
{
    const void *srcs[RDV_MAX_NODES];
    for (int p = 0; p < o->c->nodes; p++)
        srcs[p] = p == o->c->me ? (const void *)mine : in + (size_t)p * bytes;
    void *out = in + (size_t)o->c->me * bytes;
    reduce_all(o, out, srcs, o->c->nodes, count);
    if (bytes) memcpy(mine, out, bytes);
}

void tcp_reduce_in_tree_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count)
{
    int n = o->c->nodes;
    if (bytes) memcpy(in + (size_t)o->c->me * bytes, mine, bytes);
    for (int w = 1; w < n; w *= 2)
        for (int p = 0; p + w < n; p += 2 * w) {
            void *a = in + (size_t)p * bytes;
            const void *srcs[2] = {a, in + (size_t)(p + w) * bytes};
            reduce_all(o, a, srcs, 2, count);
        }
    if (bytes) memcpy(mine, in, bytes);
}

/* dst = reduction of the local participants' send buffers at element offset off. */
void tcp_local_reduce(struct opctx *o, void *dst, size_t off, size_t count)
{
    const void *srcs[NET_MAX_LOCAL];
    for (int s = 0; s < o->c->nlocal; s++)
        srcs[s] = (const char *)o->t->send[s] + off * o->es;
    if (o->c->nlocal == 1) {
        if (dst != srcs[0] && count) memcpy(dst, srcs[0], count * o->es);
        return;
    }
    /* an in-place participant's send may be dst itself: put it first */
    for (int s = 1; s < o->c->nlocal; s++) {
        if (srcs[s] == dst) {
            const void *tmp = srcs[0];
            srcs[0] = srcs[s];
            srcs[s] = tmp;
        }
    }
    reduce_all(o, dst, srcs, o->c->nlocal, count);
}

void tcp_finish_avg(struct opctx *o, void *buf, size_t count)
{
    if (o->t->redop != COLL_AVG || !count) return;
    uint32_t world = (uint32_t)(o->c->nodes * o->c->nlocal);
    for (size_t off = 0; off < count; off += REDUCE_CHUNK) {
        size_t len = count - off < REDUCE_CHUNK ? count - off : REDUCE_CHUNK;
        char *p = (char *)buf + off * o->es;
        const void *srcs[1] = {p};
        reduce_n(o->t->dtype, COLL_AVG, p, srcs, 1, len, world);
    }
}

/* A long local step (packing, unpacking, copying to the local participants) gives the
 * net thread's service (heartbeats, other groups, the control socket) a turn once per
 * TCP_TURN_BYTES copied: a 2.5 MiB all-to-all's copies once took 0.8 s (ThreadSanitizer,
 * fresh pages), past 3 heartbeats, and the peers called the pod silent. since counts
 * bytes since the last turn; COLL_OK, or the service's error (o->why says it). Never on
 * the engine (a budget) or without a service (an application's direct op). */
#define TCP_TURN_BYTES ((size_t)4 << 20)
static int tcp_local_turn(struct opctx *o, size_t *since, size_t bytes)
{
    struct tcp_comm *c = o->c;
    *since += bytes;
    if (*since < TCP_TURN_BYTES || c->budget_until || !c->service) return COLL_OK;
    *since = 0;
    char ended[160];
    int st = c->service(c->service_ctx, ended, sizeof(ended));
    return st ? tcp_failf(o, st, "%s", ended) : COLL_OK;
}

int tcp_copy_to_locals(struct opctx *o, const void *src, size_t bytes)
{
    size_t since = 0;
    for (int s = 0; bytes && s < o->c->nlocal; s++)
        if (o->t->recv[s] && o->t->recv[s] != src) {
            memcpy(o->t->recv[s], src, bytes);
            int st = tcp_local_turn(o, &since, bytes);
            if (st != COLL_OK) return st;
        }
    return COLL_OK;
}

/* ---- building blocks between pods --------------------------------------------------- */

/* Chunk k of n over count elements: [*off, *off + *len). */
static void chunk(size_t count, int n, int k, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    *off = (size_t)k * base + ((size_t)k < rem ? (size_t)k : rem);
    *len = base + ((size_t)k < rem);
}

/* Ring reduce-scatter over buf (count elements, blocks by chunk()); afterwards this node
 * holds the reduction of chunk `me`. unit: elements per block unit (block k spans
 * chunk(count/unit...)*unit), so that blocks can follow pod boundaries. src: when not
 * NULL, this pod's contribution, laid out as buf, which then starts empty: each chunk
 * is read from src the first time (sent, or folded with what arrives), never copied
 * into buf first. last: when not NULL, where chunk `me` is folded instead of buf. */
static int ring_reduce_scatter(struct opctx *o, void *buf, size_t units, size_t unit,
                               const void *src, void *last)
{
    struct tcp_comm *c = o->c;
    int n = c->nodes, me = c->me, right = (me + 1) % n, left = (me + n - 1) % n;
    size_t es = o->es * unit;
    size_t maxlen = units / (size_t)n + 1;
    void *tmp = tcp_scratch(c, 1, maxlen * es);
    if (!tmp) return tcp_failf(o, COLL_ERR_NOMEM, "scratch of %zu bytes", maxlen * es);
    for (int s = 0; s < n - 1; s++) {
        int sc = ((me - s - 1) % n + n) % n, rc = ((me - s - 2) % n + n) % n;
        size_t so, sl, ro, rl;
        chunk(units, n, sc, &so, &sl);
        chunk(units, n, rc, &ro, &rl);
        struct xfer x[2];
        /* chunk me - 1 goes first, untouched; every later one was folded here */
        const char *from = s == 0 && src ? (const char *)src : (const char *)buf;
        tcp_x_send(&x[0], right, s == 0 ? &o->hdr : NULL, sizeof(o->hdr), from + so * es, sl * es);
        tcp_x_recv(&x[1], left, s == 0 ? &o->peer_hdr[left] : NULL, sizeof(o->hdr), tmp, rl * es);
        if (rl) /* with src, each chunk is received once: folded with src's */
            tcp_x_fold(&x[1], rc == me && last ? (char *)last : (char *)buf + ro * es,
                       src ? (const char *)src + ro * es : NULL);
        int st = tcp_exchange(o, x, 2);
        if (st != COLL_OK) return st;
    }
    return COLL_OK;
}

/* Append to x's payload chunks k0, k0 + 1, ... (cnt of them, wrapping past the last)
 * of buf split by chunk() over units of es bytes: at most two contiguous pieces. */
static void x_add_chunks(struct xfer *x, char *buf, size_t units, int n, int k0, int cnt, size_t es)
{
    while (cnt > 0) {
        int run = k0 + cnt <= n ? cnt : n - k0; /* up to the last chunk */
        size_t o0, l0, o1, l1;
        chunk(units, n, k0, &o0, &l0);
        chunk(units, n, k0 + run - 1, &o1, &l1);
        size_t len = (o1 + l1 - o0) * es;
        if (len) {
            x->iov[x->niov++] = (struct iovec){buf + o0 * es, len};
            x->total += len;
        }
        cnt -= run;
        k0 = 0;
    }
}

/* Ring allgather: this node holds chunk `me`; afterwards every chunk. One exchange:
 * chunks travel leftwards, and each pod passes on what it receives from its right as it
 * arrives, so no step waits for the slowest pod of the one before. */
static int ring_allgather(struct opctx *o, void *buf, size_t units, size_t unit, int with_hdr,
                          const char *own)
{
    struct tcp_comm *c = o->c;
    int n = c->nodes, me = c->me, right = (me + 1) % n, left = (me + n - 1) % n;
    size_t es = o->es * unit, off, len;
    struct xfer x[2];
    /* in: chunks me+1 .. me+n-1; out: chunks me .. me+n-2, the first ours, the rest as
     * they come in (out's position len(me) + j is in's position j). own: our chunk is
     * read there and copied into buf as it is sent */
    tcp_x_recv(&x[0], right, with_hdr ? &o->peer_hdr[right] : NULL, sizeof(o->hdr), NULL, 0);
    x_add_chunks(&x[0], buf, units, n, (me + 1) % n, n - 1, es);
    chunk(units, n, me, &off, &len);
    tcp_x_send(&x[1], left, with_hdr ? &o->hdr : NULL, sizeof(o->hdr), own, own ? len * es : 0);
    if (own && len) x[1].copy_to = (char *)buf + off * es;
    x_add_chunks(&x[1], buf, units, n, own ? (me + 1) % n : me, own ? n - 2 : n - 1, es);
    x[1].gate = &x[0];
    x[1].gate_base = len * es;
    return tcp_exchange(o, x, 2);
}

/* ---- ops ---------------------------------------------------------------------------------- */

static int op_allreduce(struct opctx *o)
{
    struct net_task *t = o->t;
    size_t count = t->count, bytes = count * o->es;
    void *buf = t->recv[0];
    /* one participant here: its input is read where it is (no copy into buf first) */
    const void *src =
        o->c->nlocal == 1 && tcp_apart(t->send[0], bytes, buf, bytes) ? t->send[0] : NULL;
    if (!src) tcp_local_reduce(o, buf, 0, count);
    /* small ones went the tiny way (tcp_run) */
    int st = ring_reduce_scatter(o, buf, count, 1, src, NULL);
    if (st == COLL_OK) st = ring_allgather(o, buf, count, 1, 0, NULL);
    if (st != COLL_OK) return st;
    tcp_finish_avg(o, buf, count);
    return tcp_copy_to_locals(o, buf, bytes);
}

static int op_reduce_scatter(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, L = (size_t)c->nlocal, N = (size_t)c->nodes;
    size_t block = L * count; /* elements per pod */
    size_t bb = block * o->es;
    char *T = tcp_scratch(c, 0, bb * N);
    if (!T) return tcp_failf(o, COLL_ERR_NOMEM, "scratch");
    /* one participant here: its input is read where it is, and our block is folded
     * straight into its result */
    int direct = L == 1 && t->recv[0] && count && tcp_apart(t->send[0], bb * N, t->recv[0], bb);
    if (!direct) tcp_local_reduce(o, T, 0, block * N);
    char *mine = direct ? t->recv[0] : T + (size_t)c->me * bb;
    /* small ones went the tiny way (a direct exchange of blocks) */
    int st = ring_reduce_scatter(o, T, N, block, direct ? t->send[0] : NULL, direct ? mine : NULL);
    if (st != COLL_OK) return st;
    tcp_finish_avg(o, mine, block);
    for (size_t s = 0; !direct && s < L; s++)
        if (t->recv[s] && count) memcpy(t->recv[s], mine + s * count * o->es, count * o->es);
    return COLL_OK;
}

static int op_allgather(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, L = (size_t)c->nlocal, N = (size_t)c->nodes;
    size_t bb = L * count * o->es; /* bytes per pod */
    char *buf = t->recv[0];
    /* one participant whose input lies outside the result: sent from where it is */
    int direct = L == 1 && count && bb * N >= TCP_COPY_AS_SENT_BYTES &&
                 tcp_apart(t->send[0], bb, buf, bb * N);
    for (size_t s = 0; !direct && s < L; s++) {
        char *dst = buf + ((size_t)c->me * L + s) * count * o->es;
        if (t->send[s] != dst && count) memcpy(dst, t->send[s], count * o->es);
    }
    /* small ones went the tiny way */
    int st = ring_allgather(o, buf, N, L * count, 1, direct ? t->send[0] : NULL);
    if (st != COLL_OK) return st;
    return tcp_copy_to_locals(o, buf, bb * N);
}

int tcp_bcast_chain(struct opctx *o, int plan, struct xfer *x)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t bytes = t->count * o->es;
    int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
    char *buf = t->recv[0];
    /* the root's input, apart from its result: sent from where it is, copied as it goes */
    const char *own = c->me == rnode && bytes >= TCP_COPY_AS_SENT_BYTES &&
                              tcp_apart(t->send[rslot], bytes, buf, bytes)
                          ? t->send[rslot]
                          : NULL;
    if (c->me == rnode && !own && t->send[rslot] != buf && bytes)
        memcpy(buf, t->send[rslot], bytes);
    int n = c->nodes, pos = (c->me - rnode + n) % n;
    int next = (c->me + 1) % n, prev = (c->me + n - 1) % n;
    /* a chain from the root; each pod passes bytes on as they arrive */
    /* the ring closes with a bare header from the last pod to the root, so every pod
     * hears its left neighbour: pods that disagree on the op fail with MISMATCH (in a
     * run of the same broadcast, the root takes it later, and every TCP_ACK_EVERY-th
     * op only: tcp.h) */
    int nx = 0;
    if (pos != 0 || !(plan & TCP_ACK_LATE))
        tcp_x_recv(&x[nx++], prev, &o->peer_hdr[prev], sizeof(o->hdr), pos != 0 ? buf : NULL,
                   pos != 0 ? bytes : 0);
    if (pos != n - 1 || !(plan & TCP_ACK_NONE)) {
        tcp_x_send(&x[nx], next, &o->hdr, sizeof(o->hdr), pos != n - 1 ? own ? own : buf : NULL,
                   pos != n - 1 ? bytes : 0);
        if (own) x[nx].copy_to = buf;
        if (pos != 0 && pos != n - 1) x[nx].gate = &x[0];
        nx++;
    }
    o->late_acks = pos == 0 && (plan & TCP_ACK_LATE);
    if (pos == 0 && plan == TCP_ACK_LATE) tcp_owe(c, prev, &o->hdr); /* before it can come */
    return nx;
}

static int op_broadcast(struct opctx *o, int plan)
{
    struct xfer x[2];
    int st = tcp_exchange(o, x, tcp_bcast_chain(o, plan, x)); /* small ones went the tiny way */
    if (st != COLL_OK) return st;
    return tcp_copy_to_locals(o, o->t->recv[0], o->t->count * o->es);
}

static int op_reduce(struct opctx *o)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t count = t->count, bytes = count * o->es;
    int rnode = t->root / c->nlocal, rslot = t->root % c->nlocal;
    char *T = tcp_scratch(c, 0, bytes);
    if (!T) return tcp_failf(o, COLL_ERR_NOMEM, "scratch");
    tcp_local_reduce(o, T, 0, count);
    /* small ones went the tiny way (every pod's vector straight to the root) */
    int st = ring_reduce_scatter(o, T, count, 1, NULL, NULL);
    if (st != COLL_OK) return st;
    /* gather the reduced chunks at the root */
    struct xfer x[RDV_MAX_NODES];
    int nx = 0;
    size_t off, len;
    if (c->me == rnode) {
        for (int p = 0; p < c->nodes; p++) {
            if (p == c->me) continue;
            chunk(count, c->nodes, p, &off, &len);
            tcp_x_recv(&x[nx++], p, NULL, 0, T + off * o->es, len * o->es);
        }
    } else {
        chunk(count, c->nodes, c->me, &off, &len);
        tcp_x_send(&x[nx++], rnode, NULL, 0, T + off * o->es, len * o->es);
    }
    st = tcp_exchange(o, x, nx);
    if (st != COLL_OK || c->me != rnode) return st;
    tcp_finish_avg(o, T, count);
    if (t->recv[rslot] && bytes) memcpy(t->recv[rslot], T, bytes);
    return COLL_OK;
}

/* All-to-all packs one message per pair of pods: alltoall_setup packs (for pod k,
 * [s][j] = local s's block for rank k*L + j) into out and sets up the exchange into in;
 * after it, alltoall_unpack spreads in over the local participants' results. */
size_t tcp_alltoall_pair_bytes(const struct opctx *o)
{
    size_t L = (size_t)o->c->nlocal;
    return L * L * o->t->count * o->es;
}

int tcp_alltoall_setup(struct opctx *o, char *out, char *in, struct xfer *x, int *nx)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t L = (size_t)c->nlocal, N = (size_t)c->nodes, cb = t->count * o->es, since = 0;
    size_t pb = tcp_alltoall_pair_bytes(o);
    *nx = 0;
    for (size_t k = 0; cb && k < N; k++)
        for (size_t s = 0; s < L; s++)
            for (size_t j = 0; j < L; j++) {
                memcpy(out + k * pb + (s * L + j) * cb, (const char *)t->send[s] + (k * L + j) * cb,
                       cb);
                int st = tcp_local_turn(o, &since, cb);
                if (st != COLL_OK) return st;
            }
    for (int p = 0; p < c->nodes; p++) {
        if (p == c->me) continue;
        tcp_x_send(&x[(*nx)++], p, &o->hdr, sizeof(o->hdr), out + (size_t)p * pb, pb);
        tcp_x_recv(&x[(*nx)++], p, &o->peer_hdr[p], sizeof(o->hdr), in + (size_t)p * pb, pb);
    }
    return COLL_OK;
}

int tcp_alltoall_unpack(struct opctx *o, const char *out, char *in)
{
    struct tcp_comm *c = o->c;
    struct net_task *t = o->t;
    size_t L = (size_t)c->nlocal, N = (size_t)c->nodes, cb = t->count * o->es, since = 0;
    size_t pb = tcp_alltoall_pair_bytes(o);
    memcpy(in + (size_t)c->me * pb, out + (size_t)c->me * pb, pb);
    /* unpack: from pod k, [s][j] = rank k*L + s's block for our local j */
    for (size_t k = 0; cb && k < N; k++)
        for (size_t s = 0; s < L; s++)
            for (size_t j = 0; j < L; j++) {
                memcpy((char *)t->recv[j] + (k * L + s) * cb, in + k * pb + (s * L + j) * cb, cb);
                int st = tcp_local_turn(o, &since, cb);
                if (st != COLL_OK) return st;
            }
    return COLL_OK;
}

static int op_alltoall(struct opctx *o)
{
    size_t pb = tcp_alltoall_pair_bytes(o), N = (size_t)o->c->nodes;
    char *out = tcp_scratch(o->c, 0, pb * N), *in = tcp_scratch(o->c, 1, pb * N);
    if (!out || !in) return tcp_failf(o, COLL_ERR_NOMEM, "scratch");
    struct xfer x[2 * RDV_MAX_NODES];
    int nx;
    int st = tcp_alltoall_setup(o, out, in, x, &nx);
    if (st == COLL_OK) st = tcp_exchange(o, x, nx);
    return st == COLL_OK ? tcp_alltoall_unpack(o, out, in) : st;
}

void tcp_init_ctx(struct opctx *o, struct tcp_comm *c, struct net_task *t, char *why, size_t whylen)
{
    /* field by field: a compound literal would clear peer_hdr, 160 KiB per op */
    o->c = c;
    o->t = t;
    o->why = why;
    o->whylen = whylen;
    o->es = coll_dtype_size((coll_dtype)t->dtype);
    o->red_op = t->redop == COLL_AVG ? COLL_SUM : t->redop;
    o->hdr = op_hdr(c, t);
    o->late_acks = 0;
}

int tcp_run(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen)
{
    /* the acks a broadcast root went on without, first (tcp.h) */
    int rc = tcp_settle(c, t, why, whylen);
    if (rc != COLL_OK) return rc;
    struct tcp_tiny tiny;
    rc = tcp_tiny_start(&tiny, c, t);
    if (rc == 0) return tcp_tiny_progress(&tiny, c, why, whylen);
    if (rc == -2) {
        snprintf(why, whylen, "no memory for a %s of %llu elements", wire_kind_name(t->kind),
                 (unsigned long long)t->count);
        return COLL_ERR_NOMEM;
    }
    struct opctx o;
    tcp_init_ctx(&o, c, t, why, whylen);
    int plan = tcp_ack_plan(c, &o.hdr); /* before this op becomes the previous one */
    tcp_note_op(c, &o.hdr);
    switch (t->kind) {
    case WIRE_OP_ALLREDUCE:
        return op_allreduce(&o);
    case WIRE_OP_REDUCE_SCATTER:
        return op_reduce_scatter(&o);
    case WIRE_OP_ALLGATHER:
        return op_allgather(&o);
    case WIRE_OP_BROADCAST:
        return op_broadcast(&o, plan);
    case WIRE_OP_REDUCE:
        return op_reduce(&o);
    case WIRE_OP_ALLTOALL:
        return op_alltoall(&o);
    default:
        return tcp_failf(&o, COLL_ERR_UNSUPPORTED, "op kind %u", t->kind);
    }
}

/* ---- which pods an op talks to ------------------------------------------------------ */

static int pow2(int n)
{
    return n > 0 && (n & (n - 1)) == 0;
}

int tcp_eager_peer(int nodes, int me, int p)
{
    if (p == me || p < 0 || p >= nodes) return 0;
    if (nodes <= TCP_EAGER_ALL) return 1;
    if (p == (me + 1) % nodes || p == (me + nodes - 1) % nodes) return 1;
    return pow2(nodes) && pow2(me ^ p);
}

int tcp_op_peers(int nodes, int me, int nlocal, const struct net_task *t, uint8_t *need)
{
    int marked = 0;
#define MARK(p)                                                                                    \
    do {                                                                                           \
        int p_ = (p);                                                                              \
        if (p_ != me && p_ >= 0 && p_ < nodes && !need[p_]) {                                      \
            need[p_] = 1;                                                                          \
            marked++;                                                                              \
        }                                                                                          \
    } while (0)
    int all = 0;
    switch (t->kind) {
    case WIRE_OP_SEND:
    case WIRE_OP_RECV:
        MARK(t->root / nlocal);
        return marked;
    case WIRE_OP_ALLTOALL:
        all = 1;
        break;
    case WIRE_OP_BROADCAST:
    case WIRE_OP_REDUCE: {
        int rnode = t->root / nlocal;
        all = me == rnode;
        MARK(rnode);
        break;
    }
    default: /* allreduce, barrier, allgather, reduce_scatter: doubling or direct */
        all = !pow2(nodes) || nodes < 4;
        for (int k = 1; !all && k < nodes; k <<= 1)
            MARK(me ^ k);
        break;
    }
    MARK((me + 1) % nodes); /* the ring of large ops */
    MARK((me + nodes - 1) % nodes);
    for (int p = 0; all && p < nodes; p++)
        MARK(p);
#undef MARK
    return marked;
}
