/*
 * wait.c: one request's completion and the waiting policy: spinning then sleeping (one
 * poller per connection, the others on its condition variable), lc_wait_stream and
 * the pollable descriptor. Above conn.c (reaping the completion ring) and direct.c
 * (this thread moves a direct op on); requests.c's coll_wait and coll_test, and
 * compose.c's parts, come here for requests that are not composite.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>

#include "lc.h"

/* ---- completion ------------------------------------------------------------------ */

/* The request's slot if req is live; caller holds the lock. */
static struct req *lookup(coll_conn *c, coll_request req)
{
    uint32_t idx = (uint32_t)(req.id & 0xffffffffu) - 1;
    uint32_t gen = (uint32_t)(req.id >> 32);
    if (idx >= WIRE_RING_ENTRIES) return NULL;
    struct req *r = &c->reqs[idx];
    if (r->gen != gen || r->state == REQ_FREE) return NULL;
    return r;
}

static coll_err consume(coll_conn *c, struct req *r)
{
    coll_err st = (coll_err)r->status;
    r->state = REQ_FREE;
    if (r->src_out && st == COLL_OK) /* only receives from any rank set it (agent_any) */
        *r->src_out = c->shm->src[r - c->reqs];
    c->free_idx[c->nfree++] = (uint32_t)(r - c->reqs);
    if (st != COLL_OK) {
        char why[WIRE_WHY_MAX] = "";
        if (r->agent_failed) lc_agent_why(c, (uint32_t)(r - c->reqs), why);
        if (r->direct && r->why[0])
            lc_fail(st, "the op failed (%s): %s", coll_strerror(st), r->why);
        else if (st == c->lost) /* failed when the connection was marked lost */
            lc_fail_lost(c);
        else if (why[0])
            lc_fail(st, "the agent failed the op (%s): %s", coll_strerror(st), why);
        else
            lc_fail(st, "the agent failed the op: %s", coll_strerror(st));
    }
    return st;
}

/* What the agent said on the socket, unprompted: it only speaks so when it drops us
 * (a goodbye, or nothing: hung up). Lock held. */
static void socket_said(coll_conn *c)
{
    char buf[WIRE_MAX_MSG];
    union wire_msg m;
    ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        lc_reap(c);
        if (lc_goodbye(c) == COLL_OK) /* no goodbye after all: lost */
            lc_mark_lost(c, COLL_ERR_AGENT_LOST, "agent closed the connection");
    } else if (n > 0) {
        char err[128];
        lc_reap(c);
        if (wire_decode(buf, (size_t)n, &m, NULL, err, sizeof(err)) == 0 && m.h.type == WIRE_ERROR)
            lc_mark_lost(
                c, m.error.code == COLL_ERR_SHUTDOWN ? COLL_ERR_SHUTDOWN : COLL_ERR_AGENT_LOST,
                m.error.msg);
        else
            lc_mark_lost(c, COLL_ERR_PROTOCOL, "unexpected message from the agent");
    }
}

/* An armed connection (coll_conn_fd): take what made its descriptor readable, so that
 * it turns readable again only for what comes next; a doorbell taken from under a
 * thread asleep on it is rung again for that thread. Lock held. */
static void harvest(coll_conn *c)
{
    if (!c->armed || c->lost) return;
    struct epoll_event evs[2];
    int n = epoll_wait(c->epfd, evs, 2, 0);
    int bell = 0, sock = 0;
    for (int i = 0; i < n; i++) {
        bell |= evs[i].data.fd == c->efd_client;
        sock |= evs[i].data.fd == c->fd;
    }
    if (sock) socket_said(c);
    if (bell && c->poller) {
        uint64_t one = 1;
        if (write(c->efd_client, &one, sizeof(one)) < 0) { /* a full counter rings anyway */
        }
    }
}

/* Non-blocking look: 1 and *st if done (consumed), 0 if pending, -1 if unknown. */
/* ... and when pending as a direct op (direct.c), its group in *dg (dg may be NULL). */
static int try_complete(coll_conn *c, coll_request req, coll_err *st, coll_group **dg)
{
    pthread_mutex_lock(&c->lock);
    struct req *r = lookup(c, req);
    if (!r) {
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    harvest(c); /* before the look: what completes after it rings again */
    if (r->state == REQ_PENDING && !c->lost) lc_reap(c);
    int done = r->state == REQ_DONE;
    if (done) *st = consume(c, r);
    if (dg) *dg = !done && r->direct ? r->dg : NULL;
    pthread_mutex_unlock(&c->lock);
    return done;
}

/* Another thread is the poller: sleep until it reaps something, leaves, or the
 * deadline (0: none) passes. Caller holds the lock; returns with it held. */
static void follow(coll_conn *c, int64_t deadline)
{
    c->cv_waiters++;
    if (deadline > 0) {
        struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
        pthread_cond_timedwait(&c->cv, &c->lock, &ts);
    } else {
        pthread_cond_wait(&c->cv, &c->lock);
    }
    c->cv_waiters--;
}

/* Whether a wait for one of the n requests (n == 0: for a free request slot) is over;
 * caller holds the lock. */
static int wait_over(coll_conn *c, const coll_request *reqs, size_t n)
{
    if (c->lost) return 1;
    if (n == 0) return c->nfree > 0;
    for (size_t i = 0; i < n; i++) {
        struct req *r = lookup(c, reqs[i]);
        if (!r || r->state != REQ_PENDING) return 1;
    }
    return 0;
}

/* Sleep until the agent posts a completion, the socket says something, or the
 * deadline passes, unless the wait for req (id 0: a free request slot) is over already.
 * Detects a lost agent. One thread at a time sleeps on the doorbell and reaps for all;
 * the others follow it (see struct coll_conn). Every check of req is made under the
 * lock that reaping holds, after this thread is counted as sleeping: a completion
 * reaped by another thread is seen, and one not yet posted rings the doorbell. */
void lc_sleep_for_completion(coll_conn *c, int64_t deadline, const coll_request *reqs, size_t n)
{
    pthread_mutex_lock(&c->lock);
    if (wait_over(c, reqs, n)) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    if (c->poller) {
        follow(c, deadline);
        pthread_mutex_unlock(&c->lock);
        return;
    }
    c->poller = 1;
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_add(&c->shm->client_sleeping.v, 1);
    ring_full_fence();
    pthread_mutex_lock(&c->lock);
    int skip =
        wait_over(c, reqs, n) || ring_ready(&c->shm->cq[c->cq_head & RING_MASK].seq, c->cq_head);
    pthread_mutex_unlock(&c->lock);
    if (!skip) {
        int ms = -1;
        if (deadline > 0) {
            int64_t left = deadline - now_ns();
            ms = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
        }
        struct epoll_event evs[2];
        int r = epoll_wait(c->epfd, evs, 2, ms);
        int sock = 0;
        for (int i = 0; i < r; i++)
            sock |= evs[i].data.fd == c->fd;
        if (sock) {
            pthread_mutex_lock(&c->lock);
            socket_said(c);
            pthread_mutex_unlock(&c->lock);
        }
    }
    atomic_fetch_sub(&c->shm->client_sleeping.v, 1);
    pthread_mutex_lock(&c->lock);
    if (!c->lost) lc_reap(c); /* what woke us may be another thread's */
    c->poller = 0;
    if (c->cv_waiters) pthread_cond_broadcast(&c->cv); /* one of them takes over */
    pthread_mutex_unlock(&c->lock);
}

int lc_req_live(coll_conn *c, coll_request req)
{
    pthread_mutex_lock(&c->lock);
    int live = lookup(c, req) != NULL;
    pthread_mutex_unlock(&c->lock);
    return live;
}

coll_err lc_wait_one(coll_conn *c, coll_request req, int timeout_ms)
{
    coll_err st;
    coll_group *dg;
    int r = try_complete(c, req, &st, &dg);
    if (r < 0) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (r > 0) return st;
    int64_t start = now_ns();
    int64_t deadline = timeout_ms >= 0 ? start + (int64_t)timeout_ms * 1000000 : 0;
    if (dg) { /* this thread runs it, and the group's ops before it; in slices while ops
               * in steps wait for a turn (their peers may wait for them before this op) */
        int64_t end = deadline ? deadline : INT64_MAX;
        for (;;) {
            int64_t until = end;
            if (atomic_load_explicit(&c->staged, memory_order_relaxed)) {
                int64_t s = now_ns() + STAGED_SLICE_NS;
                if (s < until) until = s;
            }
            lc_direct_progress(dg, (uint32_t)(req.id & 0xffffffffu) - 1, until, 0);
            r = try_complete(c, req, &st, NULL);
            if (r != 0 || now_ns() >= end) break;
            lc_staged_turn(c);
        }
        if (r > 0) return st;
        if (r < 0) return lc_fail(COLL_ERR_INVALID, "request vanished");
        return lc_fail(COLL_ERR_TIMEOUT, "request still pending after %d ms", timeout_ms);
    }
    /* An agent that had to be woken for this op needs tens of microseconds; giving it
     * this CPU (sleeping at once) beats spinning against it on a small machine. */
    int64_t cap = (int64_t)c->spin_us * 1000, budget = 0;
    pthread_mutex_lock(&c->lock);
    struct req *rq = lookup(c, req);
    int rang = rq && rq->rang;
    if (!rang && cap > 0) { /* spin as long as spinning has paid (spin.h) */
        budget = spin_budget(&c->spin);
        if (budget > cap) budget = cap;
    }
    pthread_mutex_unlock(&c->lock);
    int64_t spin_until = start + budget;
    int slept = 0;
    for (;;) {
        lc_staged_turn(c); /* another op may wait for this rank's second step */
        int64_t t = now_ns();
        if (t < spin_until) {
            /* pause only: a yield would hand the CPU to any runnable task, a nice-19
             * batch job included, until the scheduler's next tick */
            ring_cpu_relax();
        } else {
            lc_sleep_for_completion(c, deadline, &req, 1);
            slept = 1;
        }
        r = try_complete(c, req, &st, NULL);
        if (r != 0 && !rang && cap > 0) {
            pthread_mutex_lock(&c->lock);
            spin_learn(&c->spin, !slept, (int32_t)cap);
            pthread_mutex_unlock(&c->lock);
        }
        if (r != 0) return r > 0 ? st : lc_fail(COLL_ERR_INVALID, "request vanished");
        if (deadline && now_ns() >= deadline)
            return lc_fail(COLL_ERR_TIMEOUT, "request still pending after %d ms", timeout_ms);
    }
}

int lc_try_one(coll_conn *c, coll_request req, coll_err *st, int *direct)
{
    coll_group *dg;
    lc_staged_turn(c);
    int r = try_complete(c, req, st, &dg);
    if (r == 0 && dg) { /* one pass of its group's ops, without waiting */
        lc_direct_progress(dg, (uint32_t)(req.id & 0xffffffffu) - 1, 0, 1);
        r = try_complete(c, req, st, &dg);
    }
    if (direct) *direct = r == 0 && dg;
    return r;
}

coll_err lc_wait_stream(coll_conn *c, coll_request req, void *stream, int keep)
{
    pthread_mutex_lock(&c->lock);
    struct req *r = lookup(c, req);
    coll_err rc = COLL_OK;
    if (!r || r->detached) {
        rc = lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    } else if (!r->gpu) {
        rc = lc_fail(COLL_ERR_INVALID, "not a GPU op: wait for it with coll_wait");
    } else {
        uint32_t idx = (uint32_t)(r - c->reqs);
        char why[160];
        void *word = (char *)&c->shm->done[idx] + c->shm_delta;
        if (lcgpu_wait(stream, word, req.id, why, sizeof(why)) < 0) {
            rc = lc_fail(COLL_ERR_INVALID, "%s", why);
        } else if (keep) {
            /* pending or done, it is reported by coll_test or coll_wait as any op */
        } else if (r->state == REQ_DONE) {
            rc = consume(c, r); /* the stream passes at once */
        } else {
            r->detached = 1;
            c->ndetached++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int coll_conn_fd(coll_conn *c)
{
    if (!c) {
        lc_fail(COLL_ERR_INVALID, "NULL connection");
        return -1;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->armed) {
        /* asleep for good, as far as the agent is concerned: it rings every completion */
        atomic_fetch_add(&c->shm->client_sleeping.v, 1);
        __atomic_store_n(&c->armed, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->lock);
    return c->epfd;
}
