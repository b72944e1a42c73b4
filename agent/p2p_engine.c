/*
 * p2p_engine.c: the engine's turn at sends and receives between pods. Left to the net
 * thread alone, a small send waits for that thread to wake on both pods (to post it,
 * and when its message arrives), each a sleeping thread's wake-up, where a small
 * collective is run by the engine itself (net_inline). Here the engine posts a send or
 * a receive itself when the net thread is not at work (net_p2p_post), and while it
 * spins it reads the sockets of the pods it waits to hear from (net_p2p_watch). Both
 * take coll_lock by trylock (the net thread at work keeps its turn, and the op goes the
 * usual way) and set net_engine_turn: an end they meet is noted for the net thread
 * (p2p_def), which they knock, as they do when a socket did not take a whole message.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "coll/coll.h"
#include "net_priv.h"
#include "wire.h"

#define WATCH_MAX 16  /* pods a watch reads per group */
#define WATCH_SCAN 64 /* pods it looks through for sends waiting for their word */

/* Whether g takes the engine's work now: formed, and no end pending or noted. */
static int open_to_engine(const struct ngroup *g)
{
    return g->ready && !g->abort_pending && !g->awaiting_mark && !g->p2p_def.set;
}

/* After the engine's turn at pod peer: whether the net thread must come (an end to act
 * on, or bytes the socket did not take, for which it polls for room). */
static int needs_net(const struct ngroup *g, int peer)
{
    return g->p2p_def.set || g->out[peer].head || g->out[peer].nacks;
}

static int queued(struct net *n)
{
    pthread_mutex_lock(&n->in_lock);
    int any = n->in_head != NULL;
    pthread_mutex_unlock(&n->in_lock);
    return any;
}

int net_p2p_post(struct net *n, struct net_task *t)
{
    struct ngroup *g = t->group < n->ngroups ? n->groups[t->group] : NULL;
    if (!g || pthread_mutex_trylock(&n->coll_lock) != 0) return 0;
    int any = t->root == WIRE_ANY_SOURCE, peer = any ? -1 : t->root / g->nlocal;
    int posted = 0, knock = 0;
    /* in order: nothing of this pod's ahead of it with the net thread */
    if (open_to_engine(g) && t->lepoch >= g->floor && !g->q_head && peer != g->me &&
        (any || g->pfds[peer] >= 0) && !queued(n)) {
        int parked = !any && g->in[peer].parked;
        net_engine_turn = 1;
        net_p2p_held(n, t, 1);
        p2p_post(n, g, t);
        net_engine_turn = 0;
        /* from any rank: its ack or clearance may have gone to any pod, and be left; a
         * stream this receive let go on: the net thread polls it for reading again (a
         * parked one is left out of its poll set) */
        knock = any || needs_net(g, peer) || (parked && !g->in[peer].parked);
        posted = 1;
    }
    pthread_mutex_unlock(&n->coll_lock);
    if (knock) net_knock(n);
    return posted;
}

static void add_peer(int *peers, int *k, int max, int p)
{
    for (int i = 0; i < *k; i++)
        if (peers[i] == p) return;
    if (*k < max) peers[(*k)++] = p;
}

/* Pods whose word the net holds sends and receives for, up to max, into peers: receives
 * posted (from any rank: every pod), cleared or partly read, and sends waiting for an ack
 * or a clearance. */
static int to_hear(const struct ngroup *g, int *peers, int max)
{
    int k = 0;
    for (const struct net_task *t = g->posted_head; t && k < max; t = t->next)
        if (t->root != WIRE_ANY_SOURCE)
            add_peer(peers, &k, max, t->root / g->nlocal);
        else /* from any rank: every pod (the first max) */
            for (int p = 0; p < g->nodes && k < max; p++)
                if (p != g->me) add_peer(peers, &k, max, p);
    for (const struct net_task *t = g->cts_head; t && k < max; t = t->next)
        add_peer(peers, &k, max, t->source / g->nlocal);
    for (int p = 0; p < g->nodes && p < WATCH_SCAN && k < max; p++)
        if (g->out[p].wait_head || g->out[p].rts_head || (g->in[p].task && !g->in[p].parked))
            add_peer(peers, &k, max, p); /* ... or a message read into a receive, partly */
    return k;
}

void net_p2p_watch(struct net *n)
{
    if (!atomic_load_explicit(&n->p2p_live, memory_order_relaxed) ||
        pthread_mutex_trylock(&n->coll_lock) != 0)
        return;
    int knock = 0;
    net_engine_turn = 1;
    for (int i = 0; i < n->ngroups; i++) {
        struct ngroup *g = n->groups[i];
        int peers[WATCH_MAX], np = g && open_to_engine(g) ? to_hear(g, peers, WATCH_MAX) : 0;
        for (int k = 0; k < np && !g->p2p_def.set; k++) {
            if (peers[k] == g->me || g->pfds[peers[k]] < 0) continue;
            const struct p2p_out *o = &g->out[peers[k]];
            const struct net_task *head = o->head;
            size_t done = o->done, nacks = o->nacks;
            p2p_peer(n, g, peers[k]);
            /* the net thread's poll set is as it left it: knock when that is no longer
             * enough (an end noted, or writes left that were not there or moved on) */
            knock |= g->p2p_def.set || (needs_net(g, peers[k]) &&
                                        (o->head != head || o->done != done || o->nacks != nacks));
        }
    }
    net_engine_turn = 0;
    pthread_mutex_unlock(&n->coll_lock);
    if (knock) net_knock(n);
}
