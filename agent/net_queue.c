/*
 * net_queue.c: the two queues between the engine and the net thread: ops in (net_submit,
 * its doorbell), finished ops and group events out (net_collect, the engine's eventfd).
 * The floor of the net's files (net_priv.h): it calls none of them.
 */
#include "net.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "net_priv.h"

int net_task_is_p2p(const struct net_task *t)
{
    return t->type == NET_TASK_OP && (t->kind == WIRE_OP_SEND || t->kind == WIRE_OP_RECV);
}

/* A send or a receive is counted while the net holds it (p2p_live). */
void net_p2p_held(struct net *n, const struct net_task *t, int delta)
{
    if (net_task_is_p2p(t)) atomic_fetch_add_explicit(&n->p2p_live, delta, memory_order_relaxed);
}

struct net_task *net_split_p2p(struct net *n, struct net_task **head, struct net_task **tail)
{
    struct net_task *took = NULL, **end = &took, **pp = head, *prev = NULL;
    while (*pp && (*pp)->type != NET_TASK_MARK) {
        struct net_task *t = *pp;
        if (!net_task_is_p2p(t) || t->group >= n->ngroups || !n->groups[t->group]) {
            prev = t;
            pp = &t->next;
            continue;
        }
        *pp = t->next;
        if (*tail == t) *tail = prev;
        t->next = NULL;
        *end = t;
        end = &t->next;
    }
    return took;
}

void net_take_p2p(struct net *n)
{
    pthread_mutex_lock(&n->in_lock);
    struct net_task *took = net_split_p2p(n, &n->in_head, &n->in_tail);
    pthread_mutex_unlock(&n->in_lock);
    while (took) {
        struct net_task *t = took;
        struct ngroup *g = n->groups[t->group];
        took = t->next;
        t->next = NULL;
        if (t->lepoch < g->floor) {
            net_return_task(n, t, COLL_ERR_EPOCH, "submitted in an epoch that has ended");
            continue;
        }
        if (g->q_tail)
            g->q_tail->next = t;
        else
            g->q_head = t;
        g->q_tail = t;
        g->q_p2p++;
    }
}

void net_submit(struct net *n, struct net_task *t)
{
    net_p2p_held(n, t, 1);
    t->next = NULL;
    t->order = atomic_fetch_add_explicit(&n->order, 1, memory_order_relaxed) + 1;
    pthread_mutex_lock(&n->in_lock);
    if (n->in_tail)
        n->in_tail->next = t;
    else
        n->in_head = t;
    n->in_tail = t;
    pthread_mutex_unlock(&n->in_lock);
    atomic_store_explicit(&n->in_pending, 1, memory_order_release);
    /* the full fence pairs with the net thread's: it either sees in_pending or is
     * announced asleep, and then gets the doorbell */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&n->sleeping, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t w = write(n->in_efd, &one, sizeof(one));
        (void)w;
    }
}

void net_knock(struct net *n)
{
    atomic_store_explicit(&n->in_pending, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(n->in_efd, &one, sizeof(one));
    (void)w;
}

int net_notify_fd(const struct net *n)
{
    return n->out_efd;
}

int net_has_results(struct net *n)
{
    return atomic_load_explicit(&n->results, memory_order_acquire);
}

void net_collect(struct net *n, struct net_task **done, struct net_event **events)
{
    pthread_mutex_lock(&n->out_lock);
    *done = n->done_head;
    *events = n->ev_head;
    n->done_head = n->done_tail = NULL;
    n->ev_head = n->ev_tail = NULL;
    atomic_store_explicit(&n->results, 0, memory_order_release);
    pthread_mutex_unlock(&n->out_lock);
}

_Thread_local int net_engine_turn;

static void wake_engine(struct net *n)
{
    atomic_store_explicit(&n->results, 1, memory_order_release);
    if (net_engine_turn) return; /* the engine itself: it looks next */
    uint64_t one = 1;
    ssize_t w = write(n->out_efd, &one, sizeof(one));
    (void)w;
}

/* Hand t back to the engine with status and, for a failure, the reason (NULL: none). */
void net_return_task(struct net *n, struct net_task *t, int status, const char *why)
{
    net_p2p_held(n, t, -1);
    t->status = status;
    t->why[0] = '\0';
    if (status != COLL_OK && why) snprintf(t->why, sizeof(t->why), "%s", why);
    t->next = NULL;
    pthread_mutex_lock(&n->out_lock);
    if (n->done_tail)
        n->done_tail->next = t;
    else
        n->done_head = t;
    n->done_tail = t;
    pthread_mutex_unlock(&n->out_lock);
    wake_engine(n);
}

void net_event_release(struct net *n, struct net_event *e)
{
    if (e->heap) {
        free(e);
        return;
    }
    struct ngroup *g = n->groups[e->group];
    pthread_mutex_lock(&n->out_lock);
    e->next = g->evfree;
    g->evfree = e;
    pthread_mutex_unlock(&n->out_lock);
}

void net_post_event(struct net *n, struct ngroup *g, int broken, int code, const char *why)
{
    pthread_mutex_lock(&n->out_lock);
    struct net_event *e = g->evfree;
    if (e) g->evfree = e->next;
    pthread_mutex_unlock(&n->out_lock);
    if (e) {
        memset(e, 0, sizeof(*e));
    } else if ((e = calloc(1, sizeof(*e))) != NULL) {
        e->heap = 1; /* the engine has not collected EV_POOL events: rare */
    } else {
        log_msg(LOG_ERROR, "net.event_lost", "group=%s broken=%d", g->cfg->name, broken);
        return;
    }
    e->group = g->index;
    e->broken = broken;
    e->code = code;
    e->epoch = g->rdv.epoch;
    snprintf(e->why, sizeof(e->why), "%s", why);
    if (!broken && g->has_commid) {
        e->has_commid = 1;
        memcpy(e->commid, g->commid, sizeof(e->commid));
    }
    pthread_mutex_lock(&n->out_lock);
    if (n->ev_tail)
        n->ev_tail->next = e;
    else
        n->ev_head = e;
    n->ev_tail = e;
    pthread_mutex_unlock(&n->out_lock);
    wake_engine(n);
}

void net_return_list(struct net *n, struct net_task **head, struct net_task **tail, int status,
                     const char *why)
{
    while (*head) {
        struct net_task *t = *head;
        *head = t->next;
        net_return_task(n, t, status, why);
    }
    if (tail) *tail = NULL;
}

void net_fail_queue(struct net *n, struct ngroup *g, int code, const char *why)
{
    if (g->handoff) {
        net_return_task(n, g->handoff, code, why);
        g->handoff = NULL;
    }
    net_return_list(n, &g->q_head, &g->q_tail, code, why);
    net_return_list(n, &g->ask_head, &g->ask_tail, code, why);
}
