/*
 * net_lease.c: the lease of a host group's connections to its one client (direct ops):
 * lending them (the engine, on WIRE_LEASE), taking them back with where the op numbering
 * and the broadcast acks stand, and forgetting a lease whose client went away. Called by
 * the engine under coll_lock; it calls nothing of the net thread's loop (net.c), only
 * knocks on its doorbell.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "net_priv.h"

int net_lend(struct net *n, int group, struct wire_lease_words *words, struct net_lease *out,
             wire_stash *stash_out, char *why, size_t whylen)
{
    struct ngroup *g = group >= 0 && group < n->ngroups ? n->groups[group] : NULL;
    if (!g || g->gpu || g->nlocal != 1 || g->nodes > TCP_EAGER_ALL ||
        2 * (g->nodes - 1) > NET_LEASE_FDS) {
        snprintf(why, whylen,
                 "only a host group of up to %d pods with one slot per pod lends "
                 "its connections",
                 TCP_EAGER_ALL);
        return COLL_ERR_UNSUPPORTED;
    }
    if (g->seal_mode) {
        snprintf(why, whylen, "security.data seals the group's bytes: they stay in the agent");
        return COLL_ERR_UNSUPPORTED;
    }
    if (pthread_mutex_trylock(&n->coll_lock) != 0) {
        snprintf(why, whylen, "the group's connections are in use");
        return COLL_ERR_BUSY;
    }
    int rc = COLL_ERR_BUSY;
    if (!g->ready || g->abort_pending || g->awaiting_mark || g->inline_abort)
        snprintf(why, whylen, "the group is not formed");
    else if (g->q_head || g->running || g->handoff || g->lent)
        snprintf(why, whylen, "an op of the group is under way");
    else if (tcp_acks_export(g->acks, &out->has_prev, &out->run, out->prev, sizeof(out->prev)) < 0)
        snprintf(why, whylen, "a broadcast root's acks are still owed");
    else {
        out->nfds = 0;
        for (int p = 0; p < g->nodes; p++)
            if (p != g->me) {
                out->fds[out->nfds++] = g->fds[p];
                out->fds[out->nfds++] = g->rfds[p];
            }
        rc = COLL_OK;
        for (int i = 0; i < out->nfds; i++)
            if (out->fds[i] < 0) rc = COLL_ERR_BUSY;
        if (rc) {
            snprintf(why, whylen, "the group's connections are not all up");
        } else {
            _Static_assert(TCP_STASH_BYTES == WIRE_STASH_BYTES, "a stash travels whole");
            _Static_assert(TCP_EAGER_ALL <= WIRE_STASH_NODES, "every pod's stash travels");
            memset(out->stash_len, 0, sizeof(out->stash_len));
            for (int p = 0; p < g->nodes; p++) {
                size_t len = tcp_stash_front(&g->stash[p]);
                memcpy((*stash_out)[p], g->stash[p].b, len);
                out->stash_len[p] = (uint16_t)len;
                g->stash[p].len = 0;
            }
            g->lent = 1;
            g->lease_w = words;
            g->lease_id = ++n->lease_next;
            out->id = g->lease_id;
            out->seq = g->ops_done;
            out->nodes = g->nodes;
            out->me = g->me;
            out->own_cpus = !g->cpu_shared;
        }
    }
    pthread_mutex_unlock(&n->coll_lock);
    return rc;
}

int net_unlend(struct net *n, int group, uint64_t id, uint64_t seq, uint32_t has_prev, uint32_t run,
               const uint8_t *prev, const uint16_t *stash_len, const wire_stash *stash, int code,
               const char *why, char *end_why, size_t end_whylen)
{
    struct ngroup *g = group >= 0 && group < n->ngroups ? n->groups[group] : NULL;
    if (!g) return 0;
    int end = 0, knock = 0;
    pthread_mutex_lock(&n->coll_lock);
    if (g->lent && g->lease_id == id) {
        g->lent = 0;
        g->lease_w = NULL;
        /* the client's word on how far it went: numbers only go forward (a false one
         * makes the pods disagree on the next op, which ends the epoch there) */
        if (code == COLL_OK && seq < g->ops_done) {
            code = COLL_ERR_PROTOCOL;
            why = "the client gave the connections back with an op number from the past";
        }
        if (code == COLL_OK) {
            /* kept even where the epoch is ending: an op the drain still runs (one the
             * client submits next) goes on from here, not from the lease's start */
            g->ops_done = seq;
            tcp_acks_import(g->acks, has_prev, run, prev);
            /* the counts are checked (wire_decode); the bytes are the peers' stream as
             * the client read it, which it could have made up anyway: the ops that read
             * them check their headers like any others */
            for (int p = 0; p < g->nodes; p++) {
                size_t len = stash_len[p] <= TCP_STASH_BYTES && p != g->me ? stash_len[p] : 0;
                memcpy(g->stash[p].b, (*stash)[p], len);
                g->stash[p].off = 0;
                g->stash[p].len = (uint32_t)len;
            }
        }
        if (g->abort_pending) {
            /* the epoch is ending (a pod left) and waited for the client's ops: end it
             * now with the reason it ends for (the client's failure, if any, came of it) */
            end = g->abort_code;
            snprintf(end_why, end_whylen, "%s", g->abort_why);
            knock = 1; /* the net thread ends it */
        } else if (code != COLL_OK) {
            g->inline_abort = code;
            snprintf(g->inline_why, sizeof(g->inline_why), "%s", why);
            knock = 1;
        }
    } /* else an ended lease: its epoch is gone already */
    pthread_mutex_unlock(&n->coll_lock);
    if (knock) net_knock(n);
    return end;
}

void net_lease_forget(struct net *n, int group, uint64_t id)
{
    struct ngroup *g = n && group >= 0 && group < n->ngroups ? n->groups[group] : NULL;
    if (!g) return;
    pthread_mutex_lock(&n->coll_lock);
    if (g->lease_id == id) {
        g->lease_w = NULL;
        g->drain_until = 0; /* nobody will give it back: a drain ends now */
    }
    pthread_mutex_unlock(&n->coll_lock);
    net_knock(n);
}
