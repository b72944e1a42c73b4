/*
 * test_tcp.c: the host backend's waiting, below the agent: two "pods" run a tiny
 * allreduce over real nonblocking socket pairs, one as the engine runs it (a budget, a
 * nap, wake fds) and one as the net thread does, started late or not at all; and the
 * spin tuner (tcp.h) fed op sequences and op times; and a connection's read-ahead
 * (struct tcp_stash) on a real socket.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "backends/tcp.h"
#include "backends/tcp_priv.h" /* tcp_exchange, to read through a stash */
#include "coll/coll.h"
#include "harness.h"
#include "net.h"
#include "wire.h"

#define N 512 /* floats: 2 KiB, a tiny op */

static int64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct pod {
    int fds[2], rfds[2];
    struct tcp_comm c;
    struct tcp_scratch scratch;
    struct net_task t;
    float in[N], out[N];
    int delay_ms; /* the peer thread: start this late */
    int st;
};

/* Pod me of two, nlocal participants, as the net thread sees it: the peer's connection
 * in fds/rfds (the pod's own slots -1), a deadline 20 s away, no service or budget. */
static struct tcp_comm comm_init(int me, int nlocal, int *fds, int *rfds, int send_fd, int recv_fd,
                                 struct tcp_scratch *scratch)
{
    fds[0] = fds[1] = rfds[0] = rfds[1] = -1;
    fds[1 - me] = send_fd;
    rfds[1 - me] = recv_fd;
    return (struct tcp_comm){.nodes = 2,
                             .me = me,
                             .nlocal = nlocal,
                             .fds = fds,
                             .rfds = rfds,
                             .deadline_ns = clock_ns() + 20000000000LL,
                             .scratch = scratch,
                             .wake_fd = {-1, -1}};
}

static void pod_init(struct pod *p, int me, int send_fd, int recv_fd)
{
    memset(p, 0, sizeof(*p));
    p->c = comm_init(me, 1, p->fds, p->rfds, send_fd, recv_fd, &p->scratch);
    for (int i = 0; i < N; i++) {
        p->in[i] = (float)(1000 * me + i);
        p->out[i] = -1.0f;
    }
    p->t = (struct net_task){.type = NET_TASK_OP,
                             .kind = WIRE_OP_ALLREDUCE,
                             .dtype = COLL_FLOAT32,
                             .redop = COLL_SUM,
                             .count = N,
                             .deadline_ns = p->c.deadline_ns};
    p->t.send[0] = p->in;
    p->t.recv[0] = p->out;
}

static void pod_fini(struct pod *p)
{
    free(p->scratch.p[0]);
    free(p->scratch.p[1]);
}

static void check_sum(const struct pod *p)
{
    for (int i = 0; i < N; i++)
        assert_true(p->out[i] == (float)(1000 + 2 * i));
}

/* the net thread's way: no budget, waits as long as the deadline allows */
/* An eventfd the peer thread waits for (10 s at most) before its delay, or -1: a test
 * that must see the engine act before the peer's bytes come says when. */
static int peer_gate = -1;

static void *peer_main(void *arg)
{
    struct pod *p = arg;
    struct pollfd g = {.fd = peer_gate, .events = POLLIN};
    if (peer_gate >= 0 && poll(&g, 1, 10000) != 1) {
        p->st = COLL_ERR_TIMEOUT; /* never let go: kit_finish says so */
        return NULL;
    }
    if (p->delay_ms) usleep((useconds_t)p->delay_ms * 1000);
    char why[160] = "";
    p->st = tcp_run(&p->c, &p->t, why, sizeof(why));
    if (p->st != COLL_OK) fprintf(stderr, "peer: %s\n", why);
    return NULL;
}

static int naps_on, naps_off, nap_answer;
static int nap(void *ctx, int asleep)
{
    (void)ctx;
    if (asleep)
        naps_on++;
    else
        naps_off++;
    return asleep ? nap_answer : 0;
}

struct kit {
    struct pod eng, peer;
    pthread_t th;
    struct tcp_tiny *tiny;
    int wake[2];
};

/* Pod 0 as the engine runs it (budget_ms from now, the nap, two eventfds to wake it),
 * pod 1 on a thread of its own, delay_ms late. */
static void kit_start(struct kit *k, int budget_ms, int delay_ms)
{
    int a[2], b[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, b), 0);
    pod_init(&k->eng, 0, a[0], b[1]);
    pod_init(&k->peer, 1, b[0], a[1]);
    for (int i = 0; i < 2; i++) {
        k->wake[i] = eventfd(0, EFD_NONBLOCK);
        assert_true(k->wake[i] >= 0);
    }
    k->eng.c.budget_until = clock_ns() + (int64_t)budget_ms * 1000000;
    k->eng.c.nap = nap;
    k->eng.c.wake_fd[0] = k->wake[0];
    k->eng.c.wake_fd[1] = k->wake[1];
    naps_on = naps_off = nap_answer = 0;
    k->tiny = malloc(tcp_tiny_size());
    assert_non_null(k->tiny);
    assert_int_equal(tcp_tiny_start(k->tiny, &k->eng.c, &k->eng.t), 0);
    k->peer.delay_ms = delay_ms;
    assert_int_equal(pthread_create(&k->th, NULL, peer_main, &k->peer), 0);
}

/* What the engine got back: finish the op as the net thread would, check both. */
static void kit_finish(struct kit *k, int st)
{
    if (st == TCP_AGAIN) {
        k->eng.c.budget_until = 0;
        k->eng.c.nap = NULL;
        char why[160] = "";
        st = tcp_tiny_progress(k->tiny, &k->eng.c, why, sizeof(why));
    }
    assert_int_equal(st, COLL_OK);
    pthread_join(k->th, NULL);
    assert_int_equal(k->peer.st, COLL_OK);
    check_sum(&k->eng);
    check_sum(&k->peer);
    assert_int_equal(naps_on, naps_off); /* every nap ends with a wake-up */
    for (int i = 0; i < 2; i++) {
        close(k->eng.fds[i]);
        close(k->eng.rfds[i]);
        close(k->peer.fds[i]);
        close(k->peer.rfds[i]);
        close(k->wake[i]);
    }
    free(k->tiny);
    pod_fini(&k->eng);
    pod_fini(&k->peer);
}

static int progress(struct kit *k)
{
    char why[160] = "";
    int st = tcp_tiny_progress(k->tiny, &k->eng.c, why, sizeof(why));
    if (st != COLL_OK && st != TCP_AGAIN) fprintf(stderr, "engine: %s\n", why);
    return st;
}

/* A peer 30 ms late, a budget of 2 s: the engine sleeps in the op (a nap, no hand-over)
 * and finishes it when the bytes come. */
static void engine_sleeps_in_an_op_until_its_bytes_come(void **state)
{
    (void)state;
    struct kit k;
    kit_start(&k, 2000, 30);
    int64_t t0 = clock_ns();
    int st = progress(&k);
    int64_t took = clock_ns() - t0;
    assert_int_equal(st, COLL_OK);
    assert_true(naps_on >= 1);
    /* slept until the bytes came (30 ms), within the budget: a budget run out would
     * have handed the op over (TCP_AGAIN), so no upper bound on time is asserted */
    assert_true(took >= 20000000);
    kit_finish(&k, st);
}

/* Opens the peer's gate. */
static void let_the_peer_go(void)
{
    uint64_t one = 1;
    assert_int_equal(write(peer_gate, &one, sizeof(one)), (ssize_t)sizeof(one));
}

/* The same op with a budget of 20 ms and the peer silent until the op is back: handed
 * over when the budget ends (nothing else can end it), finished by the net thread's
 * way. */
static void a_spent_budget_hands_the_op_over(void **state)
{
    (void)state;
    struct kit k;
    peer_gate = eventfd(0, EFD_NONBLOCK);
    assert_true(peer_gate >= 0);
    kit_start(&k, 20, 0);
    /* measured against the budget's end, which kit_start set: under a sanitizer on a busy
     * machine kit_start itself can take a good part of the 20 ms */
    int64_t end = k.eng.c.budget_until;
    int st = progress(&k);
    int64_t past = clock_ns() - end; /* how long after the budget's end it came back */
    let_the_peer_go();
    if (st != TCP_AGAIN || past < -1000000)
        fprintf(stderr, "progress: %d, back %.1f ms after the budget's end\n", st, past / 1e6);
    assert_int_equal(st, TCP_AGAIN);
    assert_true(past >= -1000000); /* not before it */
    kit_finish(&k, st);
    close(peer_gate);
    peer_gate = -1;
}

static void *knock_main(void *arg)
{
    usleep(20000);
    uint64_t one = 1;
    assert_int_equal(write(*(int *)arg, &one, sizeof(one)), (ssize_t)sizeof(one));
    return NULL;
}

/* Asleep in the op with 10 s of budget, the engine is wanted (its epoll set, or the
 * net thread wanting its lock): either fd hands the op over at once. The peer sends
 * only once the op is back (peer_gate), so its bytes cannot finish it first however the
 * threads are scheduled. */
static void either_wake_fd_hands_the_op_over(void **state)
{
    (void)state;
    for (int w = 0; w < 2; w++) {
        struct kit k;
        peer_gate = eventfd(0, EFD_NONBLOCK); /* the peer's bytes only after the hand-over */
        assert_true(peer_gate >= 0);
        kit_start(&k, 10000, 0);
        pthread_t knocker;
        assert_int_equal(pthread_create(&knocker, NULL, knock_main, &k.wake[w]), 0);
        int64_t t0 = clock_ns();
        int st = progress(&k);
        int64_t took = clock_ns() - t0;
        let_the_peer_go();
        pthread_join(knocker, NULL);
        assert_int_equal(st, TCP_AGAIN);
        assert_true(naps_on >= 1);
        /* the knock (after 20 ms) handed it over: the peer's bytes come only after */
        assert_true(took >= 15000000);
        kit_finish(&k, st);
        close(peer_gate);
        peer_gate = -1;
    }
}

/* When the engine may not sleep (work waits already: the nap says so; or it never set a
 * nap up) the op is handed over at once, and a nap that was asked for is ended. */
static void an_engine_that_may_not_sleep_hands_over_at_once(void **state)
{
    (void)state;
    for (int no_nap = 0; no_nap < 2; no_nap++) {
        struct kit k;
        kit_start(&k, 10000, 100);
        nap_answer = 1;
        if (no_nap) k.eng.c.nap = NULL;
        int64_t t0 = clock_ns();
        int st = progress(&k);
        assert_int_equal(st, TCP_AGAIN);
        assert_true(clock_ns() - t0 < 80000000);
        assert_int_equal(naps_on, !no_nap);
        kit_finish(&k, st);
    }
}

/* ---- the spin tuner ------------------------------------------------------------------ */

static struct net_task op_of(int kind, uint64_t count)
{
    return (struct net_task){.kind = (uint8_t)kind, .dtype = COLL_FLOAT32, .count = count};
}

#define TRIAL (2 * TCP_TUNE_TURNS * TCP_TUNE_RUN)

/* Run ops of one class through tu: op i takes learnt_ns or short_ns by the way it waits;
 * returns the way of the last. */
static int feed(struct tcp_tune *tu, const struct net_task *t, int ops, int64_t learnt_ns,
                int64_t short_ns, int64_t *clock)
{
    int way = -1;
    for (int i = 0; i < ops; i++) {
        way = tcp_tune_start(tu, t, *clock);
        *clock += way == TCP_TUNE_SHORT ? short_ns : learnt_ns;
        tcp_tune_end(tu, 1, *clock);
        *clock += 1000; /* the application between ops */
    }
    return way;
}

/* The warm-up and the trial's turns are a function of the op's number in its class
 * only: pods whose op times differ try the same way at the same op. */
static void every_pod_tries_the_same_way_at_the_same_op(void **state)
{
    (void)state;
    struct tcp_tune *a = tcp_tune_new(), *b = tcp_tune_new();
    assert_non_null(a);
    assert_non_null(b);
    struct net_task t = op_of(WIRE_OP_ALLREDUCE, 8192);
    int64_t ca = 0, cb = 5000000;
    for (int i = 0; i < TCP_TUNE_WARM + TRIAL; i++) {
        int wa = tcp_tune_start(a, &t, ca), wb = tcp_tune_start(b, &t, cb);
        assert_int_equal(wa, wb);
        int want = i < TCP_TUNE_WARM                        ? TCP_TUNE_LEARNT
                   : (i - TCP_TUNE_WARM) / TCP_TUNE_RUN % 2 ? TCP_TUNE_SHORT
                                                            : TCP_TUNE_LEARNT;
        assert_int_equal(wa, want);
        ca += 1000 + (i % 7) * 300;
        cb += 40000 - (i % 5) * 900;
        tcp_tune_end(a, 1, ca);
        tcp_tune_end(b, 1, cb);
    }
    uint64_t l, s;
    tcp_tune_counts(a, &l, &s);
    assert_int_equal(l + s, TCP_TUNE_WARM + TRIAL);
    assert_int_equal(s, TRIAL / 2);
    free(a);
    free(b);
}

/* After a trial: the short spin where it was clearly faster, the learnt where it was not
 * (or only within the margin), and a later trial changes the way only where the other is
 * clearly faster. */
static void the_faster_way_is_kept_until_the_next_trial(void **state)
{
    (void)state;
    struct tcp_tune *tu = tcp_tune_new();
    struct net_task t = op_of(WIRE_OP_ALLGATHER, 2048);
    int64_t clock = 0;
    feed(tu, &t, TCP_TUNE_WARM + TRIAL, 100000, 70000, &clock);
    assert_int_equal(feed(tu, &t, 100, 100000, 70000, &clock), TCP_TUNE_SHORT);
    /* the next trial comes after TCP_TUNE_KEEP / 16 ops: the learnt a little faster now,
     * within the margin: the short is kept */
    feed(tu, &t, TCP_TUNE_KEEP / 16 - 100 + TRIAL, 100000, 102000, &clock);
    assert_int_equal(feed(tu, &t, 1, 1, 1, &clock), TCP_TUNE_SHORT);
    /* ... and the one after it, TCP_TUNE_KEEP / 8 ops on: the short clearly slower */
    feed(tu, &t, TCP_TUNE_KEEP / 8 - 1 + TRIAL, 100000, 150000, &clock);
    assert_int_equal(feed(tu, &t, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    /* within the margin: the learnt */
    tcp_tune_reset(tu);
    feed(tu, &t, TCP_TUNE_WARM + TRIAL, 100000, 100000 - 100000 * TCP_TUNE_MARGIN_PCT / 200,
         &clock);
    assert_int_equal(feed(tu, &t, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    free(tu);
}

/* A failed op spoils its turn: no sample from it (and with no sample of a way, the
 * learnt is kept). */
static void failed_ops_are_not_samples(void **state)
{
    (void)state;
    struct tcp_tune *tu = tcp_tune_new();
    struct net_task t = op_of(WIRE_OP_ALLREDUCE, 64);
    int64_t clock = 0;
    feed(tu, &t, TCP_TUNE_WARM, 1000, 1000, &clock);
    for (int i = 0; i < TRIAL; i++) {
        int way = tcp_tune_start(tu, &t, clock);
        clock += way == TCP_TUNE_SHORT ? 10 : 100000; /* short: far faster, but fails */
        tcp_tune_end(tu, way != TCP_TUNE_SHORT, clock);
    }
    assert_int_equal(feed(tu, &t, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    free(tu);
}

/* Classes by kind and size to a power of two; the least recently used gives way to a
 * new one, which starts from its first op again; a new epoch starts every class again. */
static void classes_are_kept_apart_and_forgotten_in_order(void **state)
{
    (void)state;
    struct tcp_tune *tu = tcp_tune_new();
    int64_t clock = 0;
    struct net_task big = op_of(WIRE_OP_ALLREDUCE, 1 << 20);
    feed(tu, &big, TCP_TUNE_WARM + TRIAL, 100000, 50000, &clock);
    /* another size, another kind: warming (learnt), the first class keeps its way */
    struct net_task small = op_of(WIRE_OP_ALLREDUCE, 1000),
                    other = op_of(WIRE_OP_BROADCAST, 1 << 20);
    assert_int_equal(feed(tu, &small, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    assert_int_equal(feed(tu, &other, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    assert_int_equal(feed(tu, &big, 1, 1, 1, &clock), TCP_TUNE_SHORT);
    /* a count in the same power of two is the same class */
    struct net_task near = op_of(WIRE_OP_ALLREDUCE, (1 << 20) + 1000);
    assert_int_equal(feed(tu, &near, 1, 1, 1, &clock), TCP_TUNE_SHORT);
    /* TCP_TUNE_CLASSES other classes since: big was the least recently used, forgotten */
    for (int k = 0; k < TCP_TUNE_CLASSES; k++) {
        struct net_task t = op_of(WIRE_OP_ALLGATHER, (uint64_t)1 << k);
        feed(tu, &t, 1, 1, 1, &clock);
    }
    assert_int_equal(feed(tu, &big, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    /* a new epoch: from the first op */
    feed(tu, &big, TCP_TUNE_WARM + TRIAL, 100000, 50000, &clock);
    assert_int_equal(feed(tu, &big, 1, 1, 1, &clock), TCP_TUNE_SHORT);
    tcp_tune_reset(tu);
    assert_int_equal(feed(tu, &big, 1, 1, 1, &clock), TCP_TUNE_LEARNT);
    /* no tuner (out of memory at set-up): always the learnt spin */
    assert_int_equal(tcp_tune_start(NULL, &big, clock), TCP_TUNE_LEARNT);
    tcp_tune_end(NULL, 1, clock);
    free(tu);
}

/* Read-ahead (tcp.h: struct tcp_stash) on a real socket: a small read takes what follows,
 * the next reads take it first (across a header and a payload piece, then on into the
 * socket), a read of more than the stash holds takes nothing beyond itself, and a close
 * shows once the stash is spent. */
/* ---- a long local step gives the service its turn ------------------------------------ */

#define A2A_COUNT ((size_t)1 << 18) /* floats per block: 1 MiB; 4 ranks, 2 per pod */

struct a2a_pod {
    int fds[2], rfds[2];
    struct tcp_comm c;
    struct tcp_scratch scratch;
    struct net_task t;
    float *send[2], *recv[2];
    int st;
    char why[160];
};

/* What pod 0's service saw: turns while its pack had not reached its last block, and
 * turns after its unpack had written into a participant's result. */
struct turns {
    const float *out_last, *recv_first;
    int in_pack, in_unpack, calls;
};

static int turn_service(void *ctx, char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    struct turns *tu = ctx;
    tu->calls++;
    tu->in_pack += *tu->out_last == -1.0f;
    tu->in_unpack += *tu->recv_first != -1.0f;
    return 0;
}

static float a2a_value(int from, int to, size_t i)
{
    return (float)(from * 10 + to) + (float)(i % 5) * 100.0f;
}

static void a2a_init(struct a2a_pod *p, int me, int send_fd, int recv_fd)
{
    memset(p, 0, sizeof(*p));
    p->c = comm_init(me, 2, p->fds, p->rfds, send_fd, recv_fd, &p->scratch);
    p->t = (struct net_task){.type = NET_TASK_OP,
                             .kind = WIRE_OP_ALLTOALL,
                             .dtype = COLL_FLOAT32,
                             .count = A2A_COUNT,
                             .deadline_ns = p->c.deadline_ns};
    for (int s = 0; s < 2; s++) {
        p->send[s] = malloc(4 * A2A_COUNT * sizeof(float));
        p->recv[s] = malloc(4 * A2A_COUNT * sizeof(float));
        assert_non_null(p->send[s]);
        assert_non_null(p->recv[s]);
        for (int to = 0; to < 4; to++)
            for (size_t i = 0; i < A2A_COUNT; i++) {
                p->send[s][(size_t)to * A2A_COUNT + i] = a2a_value(me * 2 + s, to, i);
                p->recv[s][(size_t)to * A2A_COUNT + i] = -1.0f;
            }
        p->t.send[s] = p->send[s];
        p->t.recv[s] = p->recv[s];
    }
}

static void *a2a_main(void *arg)
{
    struct a2a_pod *p = arg;
    p->st = tcp_run(&p->c, &p->t, p->why, sizeof(p->why));
    return NULL;
}

/* An all-to-all of 8 MiB per pod through the agent (two participants per pod): the
 * service gets turns while the pack runs, before a byte goes out, and while the unpack
 * runs, after the last byte came in; the results are right. */
static void a_long_pack_and_unpack_give_the_service_turns(void **state)
{
    (void)state;
    int a[2], b[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, b), 0);
    static struct a2a_pod pod[2]; /* peer_hdr: not on the stack */
    a2a_init(&pod[0], 0, a[0], b[1]);
    a2a_init(&pod[1], 1, b[0], a[1]);
    /* pod 0's pack scratch, known before: its last element is the pack's last write */
    size_t total = 2 * 4 * A2A_COUNT * sizeof(float);
    pod[0].scratch.p[0] = malloc(total);
    assert_non_null(pod[0].scratch.p[0]);
    pod[0].scratch.cap[0] = total;
    for (size_t i = 0; i < total / sizeof(float); i++)
        ((float *)pod[0].scratch.p[0])[i] = -1.0f;
    struct turns tu = {.out_last = (const float *)pod[0].scratch.p[0] + total / sizeof(float) - 1,
                       .recv_first = pod[0].recv[0]};
    pod[0].c.service = turn_service;
    pod[0].c.service_ctx = &tu;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, a2a_main, &pod[1]), 0);
    a2a_main(&pod[0]);
    pthread_join(th, NULL);
    for (int k = 0; k < 2; k++)
        if (pod[k].st != COLL_OK) fprintf(stderr, "pod %d: %s\n", k, pod[k].why);
    assert_int_equal(pod[0].st, COLL_OK);
    assert_int_equal(pod[1].st, COLL_OK);
    fprintf(stderr, "service: %d calls, %d in the pack, %d in the unpack\n", tu.calls, tu.in_pack,
            tu.in_unpack);
    assert_true(tu.in_pack >= 1);
    assert_true(tu.in_unpack >= 1);
    for (int me = 0; me < 2; me++)
        for (int j = 0; j < 2; j++)
            for (int from = 0; from < 4; from++)
                for (size_t i = 0; i < A2A_COUNT; i += 4099)
                    assert_true(pod[me].recv[j][(size_t)from * A2A_COUNT + i] ==
                                a2a_value(from, me * 2 + j, i));
    for (int k = 0; k < 2; k++) {
        for (int s = 0; s < 2; s++) {
            free(pod[k].send[s]);
            free(pod[k].recv[s]);
        }
        free(pod[k].scratch.p[0]);
        free(pod[k].scratch.p[1]);
    }
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
}

static struct opctx stash_ctx; /* 160 KiB: not on the stack */
static char stash_why[160];

static int stash_read(struct tcp_comm *c, void *hdr, size_t hl, void *p, size_t n)
{
    static struct net_task t;
    struct xfer x;
    tcp_x_recv(&x, 1, hdr, hl, p, n);
    x.check_hdr = 0; /* raw bytes, no op header */
    c->deadline_ns = clock_ns() + 2000000000LL;
    stash_why[0] = '\0';
    tcp_init_ctx(&stash_ctx, c, &t, stash_why, sizeof(stash_why));
    int st = tcp_exchange(&stash_ctx, &x, 1);
    if (st != COLL_OK) fprintf(stderr, "stash_read: %s\n", stash_why);
    return st;
}

static void a_small_read_keeps_what_follows_for_the_next(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    int fds[2] = {-1, -1}, rfds[2] = {-1, sv[0]};
    struct tcp_scratch scratch = {0};
    struct tcp_stash *stash = calloc(2, sizeof(*stash));
    assert_non_null(stash);
    struct tcp_comm c = {.nodes = 2,
                         .me = 0,
                         .nlocal = 1,
                         .fds = fds,
                         .rfds = rfds,
                         .scratch = &scratch,
                         .wake_fd = {-1, -1},
                         .stash = stash};
    static unsigned char sent[20000], got[20000];
    for (size_t i = 0; i < sizeof(sent); i++)
        sent[i] = (unsigned char)(i * 131 + 7);
    size_t at = 0; /* what has been read, in order */
    assert_int_equal(write(sv[1], sent, 300), 300);
    /* 40 asked: the other 260 come along */
    assert_int_equal(stash_read(&c, NULL, 0, got + at, 40), COLL_OK);
    at += 40;
    assert_int_equal(stash[1].len, 260);
    /* a header and a payload piece, both from the stash */
    assert_int_equal(stash_read(&c, got + at, 40, got + at + 40, 60), COLL_OK);
    at += 100;
    assert_int_equal(stash[1].len, 160);
    /* the stash's 160, then the socket, whose rest (up to the stash's size) comes along */
    assert_int_equal(write(sv[1], sent + 300, 6000), 6000);
    assert_int_equal(stash_read(&c, NULL, 0, got + at, 2000), COLL_OK);
    at += 2000;
    assert_int_equal(stash[1].len, TCP_STASH_BYTES);
    assert_int_equal(stash_read(&c, NULL, 0, got + at, 6300 - at), COLL_OK);
    at = 6300;
    assert_int_equal(stash[1].len, 0);
    /* more than a stash holds: nothing beyond it is taken */
    assert_int_equal(write(sv[1], sent + at, 12000), 12000);
    assert_int_equal(stash_read(&c, NULL, 0, got + at, 8000), COLL_OK);
    at += 8000;
    assert_int_equal(stash[1].len, 0);
    /* the last 4000, then the peer closes: read ahead, taken, and only then the close */
    assert_int_equal(stash_read(&c, NULL, 0, got + at, 10), COLL_OK);
    at += 10;
    assert_int_equal(stash[1].len, 3990);
    close(sv[1]);
    assert_int_equal(stash_read(&c, NULL, 0, got + at, 3990), COLL_OK);
    at += 3990;
    assert_memory_equal(got, sent, at);
    assert_int_equal(at, 18300);
    unsigned char one;
    assert_int_equal(stash_read(&c, NULL, 0, &one, 1), COLL_ERR_PEER_LOST);
    assert_non_null(strstr(stash_why, "node 1 closed the data connection"));
    close(sv[0]);
    free(stash);
    free(scratch.p[0]);
    free(scratch.p[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_small_read_keeps_what_follows_for_the_next),
        cmocka_unit_test(engine_sleeps_in_an_op_until_its_bytes_come),
        cmocka_unit_test(a_spent_budget_hands_the_op_over),
        cmocka_unit_test(either_wake_fd_hands_the_op_over),
        cmocka_unit_test(an_engine_that_may_not_sleep_hands_over_at_once),
        cmocka_unit_test(every_pod_tries_the_same_way_at_the_same_op),
        cmocka_unit_test(the_faster_way_is_kept_until_the_next_trial),
        cmocka_unit_test(failed_ops_are_not_samples),
        cmocka_unit_test(classes_are_kept_apart_and_forgotten_in_order),
        cmocka_unit_test(a_long_pack_and_unpack_give_the_service_turns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
