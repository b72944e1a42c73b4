/*
 * tcp_steps.c: the steps of collectives between pods that both the whole-op path
 * (tcp_ops.c) and the tiny ops' resumable path (tcp_tiny.c) take: giving the net
 * thread its turn in a long local step, copying a result to the local participants,
 * the broadcast chain, all-to-all's packing and unpacking.
 *
 * Layers, bottom to top: tcp.c (transfers, headers, acks, scratch and reductions),
 * this file, tcp_tiny.c, tcp_ops.c (tcp_run, which hands small ops to tcp_tiny.c).
 * Each calls only the files below it.
 */
#include "tcp_priv.h"

#include <string.h>

#include "coll/coll.h"
#include "util.h"

/* A long local step (packing, unpacking, copying to the local participants) gives the
 * net thread's service (heartbeats, other groups, the control socket) a turn once per
 * TCP_TURN_BYTES copied: a 2.5 MiB all-to-all's copies once took 0.8 s (ThreadSanitizer,
 * fresh pages), past 3 heartbeats, and the peers called the pod silent. since counts
 * bytes since the last turn; COLL_OK, or the service's error (o->why says it). Never on
 * the engine (a budget) or without a service (an application's direct op). */
int tcp_local_turn(struct opctx *o, size_t *since, size_t bytes)
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
