/*
 * test_ops.c: every op x dtype x reduction through a real agent, with 1 to 4
 * application processes attached as local participants of one pod, checked element
 * by element (tests/opcheck.c): odd counts, zero counts, counts across the kernels'
 * chunk boundary, in place and out of place, with a guard element after every result.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "harness.h"
#include "opcheck.h"

static void run_procs(int n, int explicit_slot)
{
    struct agent a;
    char body[256];
    snprintf(body, sizeof(body),
             "groups:\n  - name: g\n    backend: host\n    local_slots: %d\n"
             "    timeouts: {op_ms: 60000}\n",
             n);
    assert_int_equal(agent_start(&a, NULL, body), 0);
    pid_t pids[8];
    struct opcheck_job jobs[8];
    for (int i = 0; i < n; i++) {
        jobs[i] =
            (struct opcheck_job){.sock = a.sock, .explicit_slot = explicit_slot, .slot = n - 1 - i};
        pids[i] = child_run(opcheck_rank_main, &jobs[i]);
    }
    for (int i = 0; i < n; i++)
        assert_int_equal(child_wait(pids[i], 600000), 0);
    assert_int_equal(agent_log_count(&a, "protocol_error"), 0);
    assert_int_equal(agent_log_count(&a, "group.mismatch"), 0);
    assert_int_equal(agent_stop(&a), 0);
}

static void ops_1_process(void **state)
{
    (void)state;
    run_procs(1, 0);
}

static void ops_2_processes(void **state)
{
    (void)state;
    run_procs(2, 0);
}

static void ops_3_processes_explicit_slots(void **state)
{
    (void)state;
    run_procs(3, 1);
}

static void ops_4_processes(void **state)
{
    (void)state;
    run_procs(4, 0);
}

/* ---- threads sharing one connection ----------------------------------------------- */

#define SHARED_THREADS 4
#define SHARED_ITERS 3000

struct shared_job {
    coll_conn *c;
    int slot;
    int failures;
    int done;
    char err[160];
};

static void *shared_rank(void *arg)
{
    struct shared_job *j = arg;
    coll_group *g;
    coll_buffer *b;
    if (coll_group_open(&g, j->c, "g", j->slot) || coll_mem_alloc(&b, j->c, 64, COLL_DEVICE_HOST)) {
        snprintf(j->err, sizeof(j->err), "setup: %s", coll_last_error());
        j->failures++;
        return NULL;
    }
    int32_t *p = coll_mem_ptr(b);
    for (int i = 0; i < SHARED_ITERS && !j->failures; i++) {
        p[0] = j->slot + i;
        coll_request r;
        coll_err e = coll_allreduce(g, p, p + 1, 1, COLL_INT32, COLL_SUM, NULL, &r);
        if (!e) e = coll_wait(j->c, r, -1); /* without limit: a lost completion hangs here */
        int want = SHARED_THREADS * i + SHARED_THREADS * (SHARED_THREADS - 1) / 2;
        if (e || p[1] != want) {
            snprintf(j->err, sizeof(j->err), "iteration %d: %s, got %d want %d", i,
                     coll_strerror(e), p[1], want);
            j->failures++;
        }
    }
    coll_mem_release(&b);
    coll_group_close(&g);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* coll.h: a connection may be used from several threads. Found on c65a60e: with
 * several threads waiting on one connection, a completion reaped by one thread for
 * another was never reported and coll_wait(-1) hung. Each thread waits without limit;
 * the test gives them 240 s in all and fails (rather than hangs) if one is stuck. */
static void run_shared(const char *spin)
{
    struct agent a;
    char body[256];
    snprintf(body, sizeof(body),
             "groups:\n  - name: g\n    backend: host\n    local_slots: %d\n"
             "    timeouts: {op_ms: 600000}\n",
             SHARED_THREADS);
    assert_int_equal(agent_start(&a, NULL, body), 0);
    if (spin) setenv("COLL_SPIN_US", spin, 1);
    coll_conn *c;
    assert_int_equal(coll_connect(&c, a.sock, 5000), COLL_OK);
    unsetenv("COLL_SPIN_US");
    pthread_t th[SHARED_THREADS];
    struct shared_job jobs[SHARED_THREADS];
    for (int k = 0; k < SHARED_THREADS; k++) {
        jobs[k] = (struct shared_job){.c = c, .slot = k};
        assert_int_equal(pthread_create(&th[k], NULL, shared_rank, &jobs[k]), 0);
    }
    for (int k = 0; k < SHARED_THREADS; k++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 240;
        int rc = pthread_timedjoin_np(th[k], NULL, &ts);
        if (rc) fail_msg("thread %d still waiting after 240 s: a completion was lost", k);
        if (jobs[k].failures) fail_msg("thread %d: %s", k, jobs[k].err);
    }
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
}

static void threads_share_one_connection(void **state)
{
    (void)state;
    run_shared(NULL);
}

static void threads_share_one_connection_sleeping(void **state)
{
    (void)state;
    run_shared("0"); /* every wait sleeps on the doorbell at once */
}

/* libcoll refuses a pointer that is not aligned to its element type (the reductions
 * read elements as their type), saying so, and the connection stays usable. */
static void misaligned_pointers_are_refused(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(agent_start(&a, NULL, "groups:\n  - name: g\n    backend: host\n"), 0);
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    coll_request r;
    assert_int_equal(coll_connect(&c, a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "g", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_mem_alloc(&b, c, 4096, COLL_DEVICE_HOST), COLL_OK);
    char *p = coll_mem_ptr(b);
    assert_int_equal(coll_allreduce(g, p + 2, p + 512, 4, COLL_FLOAT32, COLL_SUM, NULL, &r),
                     COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "not aligned to its element type"));
    assert_int_equal(coll_allreduce(g, p, p + 516, 4, COLL_FLOAT64, COLL_SUM, NULL, &r),
                     COLL_ERR_INVALID);
    /* bytes have no alignment; aligned pointers go on working */
    assert_int_equal(coll_broadcast(g, p + 1, p + 101, 5, COLL_UINT8, 0, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 10000), COLL_OK);
    assert_int_equal(coll_allreduce(g, p + 8, p + 512, 4, COLL_FLOAT64, COLL_SUM, NULL, &r),
                     COLL_OK);
    assert_int_equal(coll_wait(c, r, 10000), COLL_OK);
    /* a send and a receive that overlap without being in place: refused (the agent's
     * copies would read what they write; under ASan, memcpy's check once ended it) */
    assert_int_equal(coll_broadcast(g, p + 1, p + 3, 5, COLL_UINT8, 0, NULL, &r), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "overlap"));
    assert_int_equal(coll_allgather(g, p + 8, p, 4, COLL_FLOAT32, NULL, &r), COLL_ERR_INVALID);
    /* the in-place forms go on: allgather's send at recv + rank * count (rank 0 here) */
    assert_int_equal(coll_allgather(g, p, p, 4, COLL_FLOAT32, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 10000), COLL_OK);
    coll_disconnect(&c);
    assert_int_equal(agent_log_count(&a, "protocol_error"), 0);
    assert_int_equal(agent_stop(&a), 0);
}

/* ---- large local ops: run in slices of the engine's turns, and right ---------------- */

#define BIG_N ((size_t)300007)   /* floats per block: 1.2 MB, five steps of a slice */
#define HUGE_N ((size_t)8 << 20) /* floats: a 32 MiB allreduce per rank, many turns */

/* Rank r's element i of block k: small integers, so that every sum is exact */
static float val(int r, int k, size_t i)
{
    return (float)((size_t)(r * 7 + k * 3) + i % 1000);
}

struct big_job {
    const char *sock;
    int slot;
};

/* 1: every element of p[0..n) is what want(arg, i) says, else 0 (and says where) */
static int check(const char *what, int inplace, const float *p, size_t n, int r, int nr, int kind)
{
    for (size_t i = 0; i < n; i++) {
        float w = 0;
        size_t blk = i / BIG_N, e = i % BIG_N;
        switch (kind) {
        case 0: /* sum over ranks of block 0 */
            for (int q = 0; q < nr; q++)
                w += val(q, 0, e);
            break;
        case 1: /* the root's (nr - 1) block 0 */
            w = val(nr - 1, 0, e);
            break;
        case 2: /* allgather: block blk from rank blk */
            w = val((int)blk, 0, e);
            break;
        case 3: /* reduce_scatter: sum over ranks of block r */
            for (int q = 0; q < nr; q++)
                w += val(q, r, e);
            break;
        case 4: /* alltoall: block blk is rank blk's block r */
            w = val((int)blk, r, e);
            break;
        }
        if (p[i] != w) {
            fprintf(stderr, "rank %d: %s (%s): element %zu is %g, not %g\n", r, what,
                    inplace ? "in place" : "out of place", i, (double)p[i], (double)w);
            return 0;
        }
    }
    return 1;
}

static int big_rank_main(void *arg)
{
    struct big_job *b = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    coll_buffer *buf;
    coll_request q;
    if (coll_connect(&c, b->sock, 10000) != COLL_OK) return 100;
    if (coll_group_open(&g, c, "g", b->slot) != COLL_OK) return 101;
    if (coll_group_info_get(g, &info) != COLL_OK) return 102;
    int nr = info.size, me = info.rank;
    size_t cap = 2 * (size_t)nr * BIG_N * sizeof(float);
    if (cap < 2 * HUGE_N * sizeof(float)) cap = 2 * HUGE_N * sizeof(float);
    if (coll_mem_alloc(&buf, c, cap, COLL_DEVICE_HOST) != COLL_OK) return 103;
    float *s = coll_mem_ptr(buf), *d = s + (size_t)nr * BIG_N;
#define RUN(call)                                                                                  \
    do {                                                                                           \
        if ((call) != COLL_OK || coll_wait(c, q, 120000) != COLL_OK) {                             \
            fprintf(stderr, "rank %d: %s: %s\n", me, #call, coll_last_error());                    \
            return 104;                                                                            \
        }                                                                                          \
    } while (0)
    for (int inpl = 0; inpl < 2; inpl++) {
        float *out = inpl ? s : d;
        /* allreduce, reduce to 0, broadcast from nr - 1 */
        for (size_t i = 0; i < BIG_N; i++)
            s[i] = val(me, 0, i);
        RUN(coll_allreduce(g, s, out, BIG_N, COLL_FLOAT32, COLL_SUM, NULL, &q));
        if (!check("allreduce", inpl, out, BIG_N, me, nr, 0)) return 1;
        for (size_t i = 0; i < BIG_N; i++)
            s[i] = val(me, 0, i);
        RUN(coll_reduce(g, s, out, BIG_N, COLL_FLOAT32, COLL_SUM, 0, NULL, &q));
        if (me == 0 && !check("reduce", inpl, out, BIG_N, me, nr, 0)) return 2;
        for (size_t i = 0; i < BIG_N; i++)
            s[i] = val(me, 0, i);
        RUN(coll_broadcast(g, s, out, BIG_N, COLL_FLOAT32, nr - 1, NULL, &q));
        if (!check("broadcast", inpl, out, BIG_N, me, nr, 1)) return 3;
        /* allgather: in place, our block already at our place in the result */
        float *mine = inpl ? s + (size_t)me * BIG_N : s;
        for (size_t i = 0; i < BIG_N; i++)
            mine[i] = val(me, 0, i);
        RUN(coll_allgather(g, mine, out, BIG_N, COLL_FLOAT32, NULL, &q));
        if (!check("allgather", inpl, out, (size_t)nr * BIG_N, me, nr, 2)) return 4;
        /* reduce_scatter: in place, our block of the result is our block of the input */
        for (int k = 0; k < nr; k++)
            for (size_t i = 0; i < BIG_N; i++)
                s[(size_t)k * BIG_N + i] = val(me, k, i);
        float *rs = inpl ? s + (size_t)me * BIG_N : d;
        RUN(coll_reduce_scatter(g, s, rs, BIG_N, COLL_FLOAT32, COLL_SUM, NULL, &q));
        if (!check("reduce_scatter", inpl, rs, BIG_N, me, nr, 3)) return 5;
        for (int k = 0; k < nr; k++)
            for (size_t i = 0; i < BIG_N; i++)
                s[(size_t)k * BIG_N + i] = val(me, k, i);
        RUN(coll_alltoall(g, s, out, BIG_N, COLL_FLOAT32, NULL, &q));
        if (!check("alltoall", inpl, out, (size_t)nr * BIG_N, me, nr, 4)) return 6;
    }
    /* one op of many turns */
    for (size_t i = 0; i < HUGE_N; i++)
        s[i] = 1.0f;
    RUN(coll_allreduce(g, s, s + HUGE_N, HUGE_N, COLL_FLOAT32, COLL_SUM, NULL, &q));
    for (size_t i = 0; i < HUGE_N; i++)
        if (s[HUGE_N + i] != (float)nr) return 7;
#undef RUN
    coll_mem_release(&buf);
    coll_group_close(&g);
    coll_disconnect(&c);
    return 0;
}

/* Local ops that move over a MiB run a slice per turn of the engine, so that the agent
 * serves every other session between two slices: each kind, in place and out of
 * place, over blocks of five steps each, checked element by element; and a 32 MiB
 * allreduce per rank, which no turn of 200 us can finish, in several. */
static void large_local_ops_run_in_slices(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(agent_start(&a, "  log_level: debug\n",
                                 "groups:\n  - name: g\n    backend: host\n    local_slots: 3\n"
                                 "    timeouts: {op_ms: 120000}\n"),
                     0);
    struct big_job jobs[3];
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (struct big_job){.sock = a.sock, .slot = i};
        pids[i] = child_run(big_rank_main, &jobs[i]);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(child_wait(pids[i], 600000), 0);
    /* 12 kinds and forms, then the big one (the last line) */
    assert_true(agent_log_count(&a, "event=host.sliced") >= 13);
    assert_true(agent_log_number(&a, "host.sliced", "turns") >= 2);
    assert_int_equal(agent_stop(&a), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ops_1_process),
        cmocka_unit_test(ops_2_processes),
        cmocka_unit_test(ops_3_processes_explicit_slots),
        cmocka_unit_test(ops_4_processes),
        cmocka_unit_test(threads_share_one_connection),
        cmocka_unit_test(threads_share_one_connection_sleeping),
        cmocka_unit_test(misaligned_pointers_are_refused),
        cmocka_unit_test(large_local_ops_run_in_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
