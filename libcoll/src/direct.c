/*
 * direct.c: direct ops. A host group with one slot per pod may run its tiny ops in this
 * process, on the epoch's collective connections that the agent lends (WIRE_LEASE),
 * with the agent's own code for them (agent/backends/tcp_tiny.c and tcp.c, compiled in):
 * the bytes on the wire are the ones the agent would send, and the two switches per op
 * between this process and the agent are gone. docs/decisions/0011-direct-ops.md.
 *
 * The lease is taken at a tiny op's submission when no op of the group is with the
 * agent, and given back (with where the op numbering and the broadcast acks stand)
 * before any op that is not tiny (sends and receives excepted: they have their own
 * connections) and at coll_group_close. Ops queue per group in submission order: the
 * first is started at submission (what it can send goes at once), and coll_wait and
 * coll_test move them on. A failed op gives the lease back with its failure, which ends
 * the epoch on every pod as a failed op of the agent's would; an epoch that ends on the
 * agent's side shuts the sockets down under us and bumps the region's lease_void.
 *
 * COLL_DIRECT=all: every collective runs here, the large ones too (tcp_run, the agent's
 * pipelined ring and chain): a large op does not start at submission but runs whole in
 * the first coll_wait or coll_test that reaches it, as an MPI rank's does in its wait.
 * It saves the two switches per op between this process and the agent (where they share
 * a CPU, each is a chance for another task to take it) and gives up the overlap of the
 * op with this process's work that the agent's thread gives.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/tcp.h"
#include "lc.h"
#include "net.h"

#define DIRECT_BYTES ((uint64_t)64 << 10) /* what an op moves here, at most (but "all") */
#define DIRECT_SLICE_NS (20 * 1000000LL)  /* a wait looks up at least this often */
#define RETRY_BUSY_NS (1000000LL)         /* the agent said not now: ask again after */
#define RETRY_OWN_NS (1000000LL)          /* ... or our ops were still with the agent */
/* a connection that fails under an op may be the agent ending the epoch (it shuts the
 * sockets down first, then says why in the region): wait this long for its word */
#define END_WORD_NS (250 * 1000000LL)
/* an op on host memory outside coll buffers runs here or nowhere: it waits this long
 * for the lease (the group forming, the agent finishing our ops) */
#define RAW_WAIT_NS (10 * 1000000000LL)

struct lc_direct {
    pthread_mutex_t lock; /* whoever moves the ops or the lease holds it */
    int held, never;
    int64_t retry_ns;
    uint64_t lease_id;
    uint32_t void_seen;  /* the region's lease_void when the lease came */
    uint32_t drain_seen; /* ... and our handle's drain word (wire.h: lease_q) */
    int nodes, me;
    int own_cpus;    /* the lease's WIRE_LEASE_F_OWN_CPUS: waits hold their spin */
    int *fds, *rfds; /* by node index, ours (-1 at me) */
    uint64_t seq;    /* the next op's number in the epoch */
    int64_t op_ns;
    struct tcp_acks *acks;
    struct tcp_scratch scratch;
    struct spin_adapt *spin; /* by node */
    struct tcp_stash *stash; /* by node: read ahead of its connection (travels with the lease) */
    struct tcp_tiny *tiny;
    struct net_task task; /* the head op's */
    int started;          /* ... and it is under way */
    int end_code;         /* how the lease last ended, for the ops queued behind */
    char end_why[WIRE_WHY_MAX];
    uint32_t q[WIRE_RING_ENTRIES];
    uint32_t qh, qt; /* request slots, oldest first */
};

static void direct_free(struct lc_direct *d)
{
    if (!d) return;
    free(d->scratch.p[0]);
    free(d->scratch.p[1]);
    free(d->fds);
    free(d->rfds);
    free(d->spin);
    free(d->stash);
    free(d->acks);
    free(d->tiny);
    free(d);
}

coll_err lc_direct_init(coll_group *g)
{
    coll_conn *c = g->conn;
    if (!c->agent_lease || g->gpu || g->info.nodes < 2 || g->info.local_slots != 1 ||
        g->info.nodes > TCP_EAGER_ALL || g->handle >= WIRE_DIRECT_HANDLES)
        return COLL_OK;
    struct lc_direct *d = calloc(1, sizeof(*d));
    int n = g->info.nodes;
    if (d) {
        d->fds = malloc((size_t)n * sizeof(int));
        d->rfds = malloc((size_t)n * sizeof(int));
        d->spin = calloc((size_t)n, sizeof(*d->spin));
        d->stash = calloc((size_t)n, sizeof(*d->stash));
        d->acks = tcp_acks_new(n);
        d->tiny = malloc(tcp_tiny_size());
    }
    if (!d || !d->fds || !d->rfds || !d->spin || !d->stash || !d->acks || !d->tiny) {
        direct_free(d);
        return lc_fail(COLL_ERR_NOMEM, "no memory for the group's direct ops");
    }
    for (int p = 0; p < n; p++) {
        d->fds[p] = d->rfds[p] = -1;
        spin_init(&d->spin[p], TCP_SPIN_START_NS);
    }
    pthread_mutex_init(&d->lock, NULL);
    g->d = d;
    return COLL_OK;
}

int lc_direct_wants(const coll_group *g, unsigned kind, unsigned dtype, uint64_t count,
                    uint64_t bytes)
{
    if (!g->d || g->d->never || kind == WIRE_OP_SEND || kind == WIRE_OP_RECV) return 0;
    if (__atomic_load_n(&g->conn->armed, __ATOMIC_RELAXED)) return 0; /* coll_conn_fd */
    if (g->conn->direct_all) return 1; /* a large one runs whole in a wait (run) */
    struct tcp_comm cm = {.nodes = g->info.nodes, .me = g->info.node_index, .nlocal = 1};
    struct net_task t = {.kind = (uint8_t)kind, .dtype = (uint8_t)dtype, .count = count};
    return bytes <= DIRECT_BYTES && tcp_tiny_fits(&cm, &t);
}

static int nap_here(void *ctx, int asleep)
{
    (void)ctx;
    (void)asleep;
    return 0; /* nothing else to do: sleep on the op's sockets until the slice ends */
}

static struct tcp_comm comm_of(struct lc_direct *d, int64_t deadline, int64_t until)
{
    return (struct tcp_comm){.nodes = d->nodes,
                             .me = d->me,
                             .nlocal = 1,
                             .fds = d->fds,
                             .rfds = d->rfds,
                             .seq = d->seq,
                             .deadline_ns = deadline,
                             .scratch = &d->scratch,
                             .budget_until = until,
                             .nap = until > now_ns() ? nap_here : NULL,
                             .wake_fd = {-1, -1},
                             .spin = d->spin,
                             .spin_hold = d->own_cpus,
                             .acks = d->acks,
                             .stash = d->stash};
}

/* ---- the lease ----------------------------------------------------------------------- */

static void drop(struct lc_direct *d)
{
    for (int p = 0; p < d->nodes; p++) {
        if (d->fds[p] >= 0) close(d->fds[p]);
        if (d->rfds[p] >= 0) close(d->rfds[p]);
        d->fds[p] = d->rfds[p] = -1;
    }
    tcp_stash_drop(d->stash, d->nodes); /* what was read ahead goes with the connections */
    d->held = 0;
    d->started = 0;
}

static int voided(const coll_group *g)
{
    return atomic_load_explicit(&g->conn->shm->lease_void, memory_order_acquire) != g->d->void_seen;
}

/* Our lease itself ended on the agent's side (lease_void is the session's, for any of
 * its leases: lease_end says whose). */
static int ended_under(const coll_group *g)
{
    return g->d->held && voided(g) && g->conn->shm->lease_end.lease_id == g->d->lease_id;
}

static struct wire_lease_words *words(const coll_group *g)
{
    return &g->conn->shm->lease_q[g->handle];
}

/* The agent asked for the lease back: a pod left, and the epoch ends once our ops are. */
static int drained(const coll_group *g)
{
    return atomic_load_explicit(&words(g)->drain, memory_order_seq_cst) != g->d->drain_seen;
}

/* Ask for the lease (direct lock held, c->lock not). COLL_DIRECT_WAIT_MS: where the
 * agent says not now (its connections are busy for a moment, or the group is between
 * epochs), ask again every millisecond for up to that long before the op goes to the
 * agent; where each op runs then no longer depends on how the threads interleave (the
 * tests' mixes count them exactly). Off by default: an op never waits for a lease it
 * can do without. */
static coll_err take(coll_group *g, int64_t wait_ns, int insist)
{
    struct lc_direct *d = g->d;
    coll_conn *c = g->conn;
    int64_t now = now_ns(), wait_until = now + wait_ns;
    /* no lc_fail where the op then goes to the agent: a message costs on the fast path */
    if (d->never) return COLL_ERR_UNSUPPORTED;
    if (now < d->retry_ns && !wait_ns) return COLL_ERR_BUSY;
    struct timespec ms = {.tv_nsec = 1000000};
again:
    pthread_mutex_lock(&c->lock);
    if (c->lost) {
        coll_err lost = lc_fail_lost(c);
        pthread_mutex_unlock(&c->lock);
        return lost;
    }
    /* the agent lends only while it runs nothing of ours on the group (insist: wait
     * for those to finish, within the wait) */
    lc_reap(c);
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++) {
        const struct req *r = &c->reqs[i];
        if (r->state == REQ_PENDING && !r->direct && r->group == g->handle &&
            r->kind != WIRE_OP_SEND && r->kind != WIRE_OP_RECV) {
            pthread_mutex_unlock(&c->lock);
            if (insist && now_ns() < wait_until) {
                nanosleep(&ms, NULL);
                goto again;
            }
            d->retry_ns = now + RETRY_OWN_NS;
            return insist ? lc_fail(COLL_ERR_BUSY, "ops of the group were with the agent")
                          : COLL_ERR_BUSY;
        }
    }
    union wire_msg m, r;
    wire_init(&m, WIRE_LEASE, 0);
    m.lease.handle = g->handle;
    int fds[WIRE_LEASE_MAX_FDS], nfds = WIRE_LEASE_MAX_FDS;
    coll_err rc = lc_rpc(c, &m, -1, WIRE_LEASE_OK, &r, fds, &nfds);
    pthread_mutex_unlock(&c->lock);
    if (rc == COLL_ERR_UNSUPPORTED) d->never = 1;
    if (rc == COLL_ERR_BUSY && now_ns() < wait_until) {
        nanosleep(&ms, NULL);
        goto again;
    }
    if (rc != COLL_OK) {
        d->retry_ns = now + RETRY_BUSY_NS;
        return rc;
    }
    const struct wire_lease_ok *l = &r.lease_ok;
    if ((int)l->nodes != g->info.nodes || (int)l->me != g->info.node_index ||
        nfds != (int)l->nfds) {
        /* not the group we asked about: never again, and the agent ends the epoch */
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        d->never = 1;
        union wire_msg b;
        wire_init(&b, WIRE_LEASE_BACK, 0);
        b.lease_back.handle = g->handle;
        b.lease_back.lease_id = l->lease_id;
        b.lease_back.code = COLL_ERR_PROTOCOL;
        snprintf(b.lease_back.why, sizeof(b.lease_back.why), "a lease for another group shape");
        pthread_mutex_lock(&c->lock);
        lc_rpc(c, &b, -1, WIRE_LEASE_BACK_OK, &r, NULL, NULL);
        pthread_mutex_unlock(&c->lock);
        return lc_fail(COLL_ERR_PROTOCOL, "the agent lent the connections of another shape");
    }
    d->nodes = (int)l->nodes;
    d->me = (int)l->me;
    d->own_cpus = (l->flags & WIRE_LEASE_F_OWN_CPUS) != 0;
    _Static_assert(TCP_STASH_BYTES == WIRE_STASH_BYTES, "a stash travels whole");
    for (int p = 0, k = 0; p < d->nodes; p++) {
        /* what the agent read ahead (wire_decode checked the counts) */
        memcpy(d->stash[p].b, c->shm->lease_stash[g->handle][p], l->stash_len[p]);
        d->stash[p].off = 0;
        d->stash[p].len = l->stash_len[p];
        if (p == d->me) continue;
        d->fds[p] = fds[k++];
        d->rfds[p] = fds[k++];
    }
    d->lease_id = l->lease_id;
    d->void_seen = l->lease_void;
    d->drain_seen = atomic_load_explicit(&words(g)->drain, memory_order_seq_cst);
    d->seq = l->seq;
    d->op_ns = (int64_t)l->op_ms * 1000000;
    tcp_acks_import(d->acks, l->has_prev, l->run, l->prev);
    d->held = 1;
    d->started = 0;
    d->end_code = 0;
    return COLL_OK;
}

/* Hand the lease back with code (COLL_OK: with the state it left). Direct lock held.
 * Returns the agent's code where the epoch was ending already (a pod left: end_why, of
 * WIRE_WHY_MAX, then says why), else 0. */
static int give(coll_group *g, int code, const char *why, char *end_why)
{
    struct lc_direct *d = g->d;
    coll_conn *c = g->conn;
    union wire_msg m, r;
    wire_init(&m, WIRE_LEASE_BACK, 0);
    m.lease_back.handle = g->handle;
    m.lease_back.lease_id = d->lease_id;
    m.lease_back.seq = d->seq;
    if (code == COLL_OK && tcp_acks_export(d->acks, &m.lease_back.has_prev, &m.lease_back.run,
                                           m.lease_back.prev, sizeof(m.lease_back.prev)) < 0) {
        code = COLL_ERR_INTERNAL;
        why = "acks still owed when the lease went back";
    }
    m.lease_back.code = code;
    snprintf(m.lease_back.why, sizeof(m.lease_back.why), "%s", why ? why : "");
    for (int p = 0; code == COLL_OK && p < d->nodes; p++) {
        size_t len = tcp_stash_front(&d->stash[p]);
        memcpy(c->shm->lease_stash[g->handle][p], d->stash[p].b, len);
        m.lease_back.stash_len[p] = (uint16_t)len;
    }
    drop(d);
    pthread_mutex_lock(&c->lock);
    coll_err rc =
        c->lost ? COLL_ERR_AGENT_LOST : lc_rpc(c, &m, -1, WIRE_LEASE_BACK_OK, &r, NULL, NULL);
    pthread_mutex_unlock(&c->lock);
    if (rc != COLL_OK || r.lease_back_ok.code == 0) return 0;
    if (end_why) memcpy(end_why, r.lease_back_ok.why, WIRE_WHY_MAX);
    return r.lease_back_ok.code;
}

/* Settle the acks a broadcast root went on without, then give the lease back (held, the
 * queue empty; direct lock held). */
static void hand_back(coll_group *g)
{
    struct lc_direct *d = g->d;
    struct net_task t = {.type = NET_TASK_OP, .kind = WIRE_OP_BARRIER};
    char why[WIRE_WHY_MAX] = "";
    int st;
    t.deadline_ns = now_ns() + d->op_ns;
    do {
        struct tcp_comm cm = comm_of(d, t.deadline_ns, now_ns() + DIRECT_SLICE_NS);
        st = tcp_settle(&cm, &t, why, sizeof(why));
    } while (st == TCP_AGAIN);
    give(g, st, why, NULL);
}

/* The agent's word on how lease id ended (the region's lease_end), where it is there:
 * replaces *st and why (WIRE_WHY_MAX). */
static void end_word(const coll_group *g, uint64_t id, int *st, char *why)
{
    const struct wire_shm *shm = g->conn->shm;
    if (voided(g) && shm->lease_end.lease_id == id && shm->lease_end.code > 0 &&
        shm->lease_end.code <= COLL_ERR_INTERNAL) {
        *st = shm->lease_end.code;
        memcpy(why, shm->lease_end.why, WIRE_WHY_MAX);
        why[WIRE_WHY_MAX - 1] = '\0';
    }
}

/* Direct op failed with *st (why, WIRE_WHY_MAX): the lease ends. Where the agent ended
 * the epoch, its code and reason replace ours; else ours goes to it, and it ends the
 * epoch with them. Direct lock held (a pod that left: the agent
 * waited for us, and its answer to the give-back says why). */
static void lease_failed(coll_group *g, int *st, char *why)
{
    struct lc_direct *d = g->d;
    if (d->held) {
        int64_t until = now_ns() + END_WORD_NS;
        uint64_t id = d->lease_id;
        while (*st == COLL_ERR_PEER_LOST && !voided(g) && !drained(g) && now_ns() < until)
            usleep(200);
        if (!voided(g) && drained(g)) { /* the epoch ends for a pod that left: its word */
            char end_why[WIRE_WHY_MAX];
            int end = give(g, *st, why[0] ? why : coll_strerror((coll_err)*st), end_why);
            if (end > 0) {
                *st = end;
                memcpy(why, end_why, WIRE_WHY_MAX);
                why[WIRE_WHY_MAX - 1] = '\0';
            } else { /* it had ended already (the wait ran out): its word comes next */
                while (*st == COLL_ERR_PEER_LOST && !voided(g) && now_ns() < until)
                    usleep(200);
                end_word(g, id, st, why);
            }
        } else if (voided(g)) {
            end_word(g, id, st, why);
            drop(d);
        } else {
            give(g, *st, why[0] ? why : coll_strerror((coll_err)*st), NULL);
        }
    }
    d->end_code = *st;
    snprintf(d->end_why, sizeof(d->end_why), "an op before it failed: %s", why);
}

int lc_direct_begin(coll_group *g)
{
    struct lc_direct *d = g->d;
    pthread_mutex_lock(&d->lock);
    /* the agent ended the lease's epoch: drop it once nothing queued needs it (those
     * ops fail in turn on the closed sockets) */
    if (d->held && d->qh == d->qt && voided(g)) drop(d);
    if (d->held && d->qh == d->qt && drained(g)) hand_back(g); /* the epoch is ending */
    if (!d->held && d->qh == d->qt) take(g, g->conn->direct_wait_ns, 0);
    if (d->held || d->qh != d->qt) return 1; /* queued ops stay in order behind the head */
    pthread_mutex_unlock(&d->lock);
    return 0;
}

coll_err lc_direct_begin_raw(coll_group *g)
{
    struct lc_direct *d = g->d;
    pthread_mutex_lock(&d->lock);
    if (d->held && d->qh == d->qt && voided(g)) drop(d);
    if (d->held && d->qh == d->qt && drained(g)) hand_back(g);
    coll_err rc = COLL_OK;
    char why[WIRE_ERRMSG_MAX] = "";
    if (!d->held && d->qh == d->qt) {
        rc = take(g, RAW_WAIT_NS, 1);
        if (rc != COLL_OK) snprintf(why, sizeof(why), "%s", coll_last_error());
    }
    if (d->held || d->qh != d->qt) return COLL_OK;
    pthread_mutex_unlock(&d->lock);
    if (rc == COLL_ERR_UNSUPPORTED)
        return lc_fail(COLL_ERR_INVALID,
                       "group '%s' runs no ops in this process (the agent lends none of its "
                       "connections), and only those take host memory outside coll buffers",
                       g->info.name);
    if (rc == COLL_ERR_BUSY || rc == COLL_OK)
        return lc_fail(COLL_ERR_TIMEOUT,
                       "group '%s': the agent did not lend its connections within %d ms (%s); "
                       "an op on host memory outside coll buffers runs only in this process",
                       g->info.name, (int)(RAW_WAIT_NS / 1000000), why);
    return lc_fail(rc, "group '%s': %s", g->info.name, why);
}

int64_t lc_direct_op_ns(const coll_group *g)
{
    return g->d->op_ns;
}

void lc_direct_unlock(coll_group *g)
{
    pthread_mutex_unlock(&g->d->lock);
}

/* ---- running ops ------------------------------------------------------------------------ */

static const double hist_bounds[WIRE_HIST_BUCKETS] = WIRE_HIST_BOUNDS;

static void add(_Atomic uint64_t *w, uint64_t v)
{
    /* one writer (the direct lock): a load and a store, no locked add */
    atomic_store_explicit(w, atomic_load_explicit(w, memory_order_relaxed) + v,
                          memory_order_relaxed);
}

/* Count a direct op in the region, where the agent's /metrics reads it (wire.h). */
static void count(coll_group *g, const struct req *r, int st)
{
    struct wire_direct_counts *k = &g->conn->shm->direct[g->handle];
    unsigned kind = r->kind < WIRE_OP_KIND_COUNT ? r->kind : 0;
    add(&k->ops[kind][st >= 0 && st < WIRE_STATUS_COUNT ? st : COLL_ERR_INTERNAL], 1);
    if (st == COLL_OK && r->dtype < COLL_DTYPE_COUNT)
        add(&k->bytes[kind], r->count * coll_dtype_size((coll_dtype)r->dtype));
    int64_t ns = now_ns() - r->t0;
    if (ns < 0) ns = 0;
    int b = 0;
    while (b < WIRE_HIST_BUCKETS && (double)ns > hist_bounds[b] * 1e9)
        b++;
    add(&k->hist[b], 1);
    add(&k->sum_ns, (uint64_t)ns);
}

/* Request idx is done with st (why: its reason). Direct lock held. */
static void finish(coll_group *g, uint32_t idx, int st, const char *why)
{
    coll_conn *c = g->conn;
    count(g, &c->reqs[idx], st);
    pthread_mutex_lock(&c->lock);
    struct req *r = &c->reqs[idx];
    r->state = REQ_DONE;
    r->status = st;
    r->agent_failed = 0;
    if (st != COLL_OK && why) /* a formatted copy only where there is a reason */
        snprintf(r->why, sizeof(r->why), "%s", why);
    else
        r->why[0] = '\0';
    if (r->sb) r->sb->inflight--;
    if (r->rb) r->rb->inflight--;
    r->sb = r->rb = NULL;
    pthread_mutex_unlock(&c->lock);
}

/* The queue ran empty: not busy; and where the agent asked for the lease back meanwhile
 * (a pod left), it goes back now (wire.h: lease_q). Direct lock held. */
static void went_idle(coll_group *g)
{
    atomic_store_explicit(&words(g)->busy, 0, memory_order_seq_cst);
    if (g->d->held && !voided(g) && drained(g)) hand_back(g);
}

/* Whether the lease's epoch ended under a large op (tcp_service_fn, every ~20 ms). */
static int ended_service(void *ctx, char *why, size_t whylen)
{
    if (!ended_under(ctx)) return 0;
    snprintf(why, whylen, "the group's epoch ended under this op");
    return COLL_ERR_PEER_LOST;
}

/* An op that is not tiny (COLL_DIRECT=all) runs whole, with the agent's code for it: the
 * pipelined ring or chain, as the agent's net thread would run it, bounded by the op's
 * deadline. Direct lock held. */
static int run_large(coll_group *g, struct net_task *t, int64_t deadline, char *why, size_t whylen)
{
    struct lc_direct *d = g->d;
    struct tcp_comm cm = comm_of(d, deadline, 0);
    cm.service = ended_service;
    cm.service_ctx = g;
    int st = tcp_run(&cm, t, why, whylen);
    d->seq++;
    return st;
}

/* Run the head op as far as until allows (see lc_direct_progress); returns 1 when the
 * queue is empty or req idx is done, 0 when the slice ran out. whole: a large op may run
 * (it takes as long as it takes; 0 at submission, which never blocks). Direct lock held. */
static int run(coll_group *g, uint32_t want, int64_t until, int whole)
{
    struct lc_direct *d = g->d;
    coll_conn *c = g->conn;
    while (d->qh != d->qt) {
        uint32_t idx = d->q[d->qh & RING_MASK];
        struct req *r = &c->reqs[idx]; /* its fields are ours while it is queued */
        char why[WIRE_WHY_MAX] = "";
        int st;
        if (!d->started) {
            if (!d->held) {
                st = d->end_code ? d->end_code : COLL_ERR_PEER_LOST;
                snprintf(why, sizeof(why), "%s",
                         d->end_code ? d->end_why : "the group's epoch ended before this op ran");
            } else if (voided(g)) {
                st = COLL_ERR_PEER_LOST;
                snprintf(why, sizeof(why), "the group's epoch ended before this op ran");
                lease_failed(g, &st, why);
            } else {
                struct net_task *t = &d->task;
                memset(t, 0, offsetof(struct net_task, send));
                t->type = NET_TASK_OP;
                t->kind = r->kind;
                t->dtype = r->dtype;
                t->redop = r->redop;
                t->premul[0] = r->premul;
                t->root = r->root;
                t->count = r->count;
                t->send[0] = (void *)r->send;
                t->recv[0] = r->recv;
                t->deadline_ns = r->deadline;
                struct tcp_comm cm = comm_of(d, r->deadline, until ? until : now_ns());
                st = tcp_settle(&cm, t, why, sizeof(why));
                if (st == TCP_AGAIN) return 0;
                if (st == COLL_OK) {
                    int s0 = tcp_tiny_start(d->tiny, &cm, t);
                    if (s0 == 0) {
                        d->started = 1;
                    } else if (s0 == -2) {
                        st = COLL_ERR_NOMEM;
                        snprintf(why, sizeof(why), "no memory for the op");
                    } else if (!whole) {
                        return 0; /* not tiny (COLL_DIRECT=all): it runs in a wait */
                    } else {
                        st = run_large(g, t, r->deadline, why, sizeof(why));
                    }
                }
            }
        }
        if (d->started && ended_under(g)) {
            /* the agent ended this lease's epoch without waiting for us (a mismatch, a
             * silent pod, a drain that ran out): what we wait for will not come */
            d->started = 0;
            st = COLL_ERR_PEER_LOST;
            snprintf(why, sizeof(why), "the group's epoch ended under this op");
        } else if (d->started) {
            struct tcp_comm cm = comm_of(d, r->deadline, until ? until : now_ns());
            st = tcp_tiny_progress(d->tiny, &cm, why, sizeof(why));
            if (st == TCP_AGAIN) return 0;
            d->started = 0;
            d->seq++;
        }
        d->qh++;
        if (st != COLL_OK && d->held) lease_failed(g, &st, why);
        finish(g, idx, st, why);
        if (d->qh == d->qt) went_idle(g);
        if (idx == want) return 1;
    }
    return 1;
}

void lc_direct_queue(coll_group *g, uint32_t idx)
{
    struct lc_direct *d = g->d;
    d->q[d->qt++ & RING_MASK] = idx;
    if (d->qt - d->qh == 1) {
        /* under way from here: an epoch that ends for a pod that left waits for us */
        atomic_store_explicit(&words(g)->busy, 1, memory_order_seq_cst);
        run(g, UINT32_MAX, 0, 0); /* send what it can now */
    }
    pthread_mutex_unlock(&d->lock);
}

void lc_direct_progress(coll_group *g, uint32_t idx, int64_t deadline, int try)
{
    struct lc_direct *d = g->d;
    if (try) {
        if (pthread_mutex_trylock(&d->lock) != 0) return;
    } else {
        pthread_mutex_lock(&d->lock);
    }
    if (!deadline) {
        run(g, idx, 0, 1);
    } else {
        for (;;) {
            int64_t now = now_ns(), until = now + DIRECT_SLICE_NS;
            if (until > deadline) until = deadline;
            if (until <= now || run(g, idx, until, 1)) break;
        }
    }
    pthread_mutex_unlock(&d->lock);
}

void lc_direct_give_back(coll_group *g)
{
    struct lc_direct *d = g->d;
    if (!d) return;
    pthread_mutex_lock(&d->lock);
    while (d->qh != d->qt) { /* every queued op ends by its deadline */
        int staged = atomic_load_explicit(&g->conn->staged, memory_order_relaxed);
        if (run(g, UINT32_MAX, now_ns() + (staged ? STAGED_SLICE_NS : DIRECT_SLICE_NS), 1)) break;
        lc_staged_turn(g->conn); /* a peer may wait for a second step of ours first */
    }
    if (d->held && voided(g)) drop(d);
    if (d->held) hand_back(g); /* with the acks a broadcast root went on without */
    pthread_mutex_unlock(&d->lock);
}

void lc_direct_fini(coll_group *g, int give_back)
{
    struct lc_direct *d = g->d;
    if (!d) return;
    if (give_back) lc_direct_give_back(g);
    pthread_mutex_lock(&d->lock);
    drop(d);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_destroy(&d->lock);
    direct_free(d);
    g->d = NULL;
}
