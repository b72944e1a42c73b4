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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
