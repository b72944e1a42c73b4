/*
 * test_ops.c: every op x dtype x reduction through a real agent, with 1 to 4
 * application processes attached as local participants of one pod, checked element
 * by element (tests/opcheck.c): odd counts, zero counts, counts across the kernels'
 * chunk boundary, in place and out of place, with a guard element after every result.
 */
#include <stdio.h>

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
        jobs[i] = (struct opcheck_job){
            .sock = a.sock, .explicit_slot = explicit_slot, .slot = n - 1 - i};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ops_1_process),
        cmocka_unit_test(ops_2_processes),
        cmocka_unit_test(ops_3_processes_explicit_slots),
        cmocka_unit_test(ops_4_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
