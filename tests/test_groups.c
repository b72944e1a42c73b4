/*
 * test_groups.c: groups made at run time (coll_group_split, coll_group_create) against
 * real agents, each rank a process of its own: children of every shape on one pod
 * (4x2, 2x4, nested), members-only creation with the others never waited for, ops on a
 * parent and its children interleaved, a split that one rank answers with another op,
 * a parent that moves on under its children, limits and bad arguments, and a child
 * across pods refused by name.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"

#define RANKS 8

struct job {
    const char *sock;
    const char *hold; /* non-members wait for this file before leaving the parent */
    int rank;
};

/* each rank's process: open the parent (slot = rank), run fn, report through the exit
 * status (0: all checks held) */
static int open_rank(const struct job *j, coll_conn **c, coll_group **g, float **x)
{
    if (coll_connect(c, j->sock, 5000) != COLL_OK) return 100;
    if (coll_group_open(g, *c, "g", j->rank) != COLL_OK) return 101;
    coll_buffer *b;
    if (coll_mem_alloc(&b, *c, 1 << 16, COLL_DEVICE_HOST) != COLL_OK) return 102;
    *x = coll_mem_ptr(b);
    return 0;
}

/* allreduce of 16 floats of (parent rank + 1) on g; 0 if every element is want */
static int sum_check(coll_conn *c, coll_group *g, float *x, int prank, float want)
{
    for (int k = 0; k < 16; k++)
        x[k] = (float)(prank + 1);
    coll_request r;
    coll_err e = coll_allreduce(g, x, x, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 20000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: allreduce: %s (%s)\n", prank, coll_strerror(e),
                coll_last_error());
        return 110;
    }
    for (int k = 0; k < 16; k++)
        if (x[k] != want) {
            fprintf(stderr, "rank %d: element %d is %g, expected %g\n", prank, k, x[k], want);
            return 111;
        }
    return 0;
}

static void run(int (*fn)(void *), struct job *jobs, int n)
{
    pid_t p[RANKS];
    for (int i = 0; i < n; i++)
        p[i] = child_run(fn, &jobs[i]);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st = child_wait(p[i], 60000);
        if (st) fprintf(stderr, "rank %d exited %d\n", i, st);
        bad |= st != 0;
    }
    assert_false(bad);
}

static void start8(struct agent *a)
{
    assert_int_equal(agent_start(a, NULL,
                                 "groups:\n  - name: g\n    local_slots: 8\n"
                                 "    timeouts: {op_ms: 20000}\n"),
                     0);
}

static void jobs8(struct job *jobs, const struct agent *a, const char *hold)
{
    for (int i = 0; i < RANKS; i++)
        jobs[i] = (struct job){.sock = a->sock, .hold = hold, .rank = i};
}

/* split 4x2 (color rank / 2) and 2x4 (color rank % 2), nest the 2x4 into 2x2, and run
 * ops on all of them and the parent, interleaved; each child's info and its ranks in the
 * parent as MPI orders them (key, then parent rank) */
static int shapes_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *pairs, *halves, *quarter;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    int r = j->rank;
    if (coll_group_split(g, r / 2, 0, &pairs) != COLL_OK) return 120;
    /* key reverses the order within a half */
    if (coll_group_split(g, r % 2, RANKS - r, &halves) != COLL_OK) return 121;
    coll_group_info info;
    coll_group_info_get(pairs, &info);
    if (info.size != 2 || info.rank != r % 2) return 122;
    coll_group_info_get(halves, &info);
    if (info.size != 4 || info.rank != 3 - r / 2) return 123;
    int pr[8];
    if (coll_group_parent_ranks(halves, pr, 8) != 4) return 124;
    for (int i = 0; i < 4; i++)
        if (pr[i] != r % 2 + 2 * (3 - i)) return 125; /* 6,4,2,0 or 7,5,3,1 */
    if (coll_group_parent_ranks(g, pr, 8) != 0) return 126;
    /* nested: halves split by their own rank / 2 */
    if (coll_group_split(halves, info.rank / 2, info.rank, &quarter) != COLL_OK) return 127;
    coll_group_info qi;
    coll_group_info_get(quarter, &qi);
    if (qi.size != 2 || qi.rank != info.rank % 2) return 128;
    for (int round = 0; round < 3; round++) {
        /* a pair {2p, 2p+1}: (2p+1) + (2p+2) */
        if ((rc = sum_check(c, pairs, x, r, (float)(4 * (r / 2) + 3)))) return rc;
        /* a half {r%2, r%2+2, ...}: sum of (k + 1) over it */
        if ((rc = sum_check(c, halves, x, r, r % 2 ? 20.0f : 16.0f))) return rc;
        if ((rc = sum_check(c, g, x, r, 36.0f))) return rc;
        /* a quarter: two ranks of a half, their parent ranks p and p + 2 (or p + 4...) */
        int qr[2];
        if (coll_group_parent_ranks(quarter, qr, 2) != 2) return 129;
        int hr[4];
        coll_group_parent_ranks(halves, hr, 4);
        if ((rc = sum_check(c, quarter, x, r, (float)(hr[qr[0]] + hr[qr[1]] + 2)))) return rc;
    }
    /* every rank done before any leaves the parent (which would end the children) */
    coll_request r0;
    if (coll_barrier(g, NULL, &r0) != COLL_OK || coll_wait(c, r0, 20000) != COLL_OK) return 119;
    coll_group_close(&quarter);
    coll_group_close(&pairs);
    coll_group_close(&halves);
    coll_disconnect(&c);
    return 0;
}

static void splits_of_every_shape_run_every_op(void **state)
{
    (void)state;
    struct agent a;
    start8(&a);
    struct job jobs[RANKS];
    jobs8(jobs, &a, NULL);
    run(shapes_main, jobs, RANKS);
    assert_true(agent_log_count(&a, "event=group.child ") >= 4 + 2 + 4);
    assert_int_equal(agent_stop(&a), 0);
}

/* ranks 1, 3 and 6 create a child in the order 6, 1, 3; the others never call it and
 * are never waited for (they hold the parent open until the members are done) */
static int members_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *k;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    static const int list[3] = {6, 1, 3};
    int me = j->rank == 6 ? 0 : j->rank == 1 ? 1 : j->rank == 3 ? 2 : -1;
    if (me < 0) {
        struct stat st;
        for (int i = 0; i < 3000 && stat(j->hold, &st) != 0; i++)
            usleep(10000);
        coll_disconnect(&c);
        return 0;
    }
    if (coll_group_create(g, list, 3, &k) != COLL_OK) return 130;
    if (coll_group_wait(k, 10000) != COLL_OK) return 131;
    coll_group_info info;
    coll_group_info_get(k, &info);
    if (info.rank != me || info.size != 3) return 132;
    for (int i = 0; i < 5; i++)
        if ((rc = sum_check(c, k, x, j->rank, 7.0f + 2.0f + 4.0f))) return rc;
    /* the second create of the same list: a second child, not the first again */
    coll_group *k2;
    if (coll_group_create(g, list, 3, &k2) != COLL_OK) return 133;
    if ((rc = sum_check(c, k2, x, j->rank, 13.0f))) return rc;
    if ((rc = sum_check(c, k, x, j->rank, 13.0f))) return rc;
    coll_group_close(&k2);
    coll_group_close(&k);
    char done[160];
    snprintf(done, sizeof(done), "%s.%d", j->hold, j->rank);
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    /* the parent stays until every member is done (leaving it ends the children) */
    struct stat st;
    for (int i = 0; i < 3000 && stat(j->hold, &st) != 0; i++)
        usleep(10000);
    coll_disconnect(&c);
    return 0;
}

static int members_done(const char *hold)
{
    char p[160];
    struct stat st;
    int n = 0;
    for (int r = 0; r < RANKS; r++) {
        snprintf(p, sizeof(p), "%s.%d", hold, r);
        n += stat(p, &st) == 0;
    }
    return n;
}

static void members_create_without_the_others(void **state)
{
    (void)state;
    struct agent a;
    start8(&a);
    char hold[128];
    tmp_path(hold, sizeof(hold), "hold", 0);
    struct job jobs[RANKS];
    jobs8(jobs, &a, hold);
    pid_t p[RANKS];
    for (int i = 0; i < RANKS; i++)
        p[i] = child_run(members_main, &jobs[i]);
    /* the members finish while the others only hold the parent */
    for (int i = 0; i < 2000 && members_done(hold) < 3; i++)
        usleep(10000);
    assert_int_equal(members_done(hold), 3);
    FILE *f = fopen(hold, "w");
    assert_non_null(f);
    fclose(f);
    for (int i = 0; i < RANKS; i++)
        assert_int_equal(child_wait(p[i], 30000), 0);
    unlink(hold);
    for (int r = 0; r < RANKS; r++) {
        char d[160];
        snprintf(d, sizeof(d), "%s.%d", hold, r);
        unlink(d);
    }
    assert_int_equal(agent_stop(&a), 0);
}

/* two ranks: one splits, the other runs an allreduce: both fail with MISMATCH, and an
 * agreed split works after it */
static int mismatch_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *k = NULL;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    coll_err e;
    if (j->rank == 0) {
        e = coll_group_split(g, 0, 0, &k);
    } else {
        coll_request r;
        e = coll_allreduce(g, x, x, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 20000);
    }
    if (e != COLL_ERR_MISMATCH || k) {
        fprintf(stderr, "rank %d: %s (%s), expected MISMATCH\n", j->rank, coll_strerror(e),
                coll_last_error());
        return 140;
    }
    /* one pod's disagreement fails the round only: the handles go on */
    if (coll_group_split(g, 0, -j->rank, &k) != COLL_OK) return 142;
    coll_group_info info;
    coll_group_info_get(k, &info);
    if (info.rank != 1 - j->rank) return 143;
    if ((rc = sum_check(c, k, x, j->rank, 3.0f))) return rc;
    coll_disconnect(&c);
    return 0;
}

static void a_split_answered_by_another_op_fails_on_both(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(agent_start(&a, NULL, "groups:\n  - name: g\n    local_slots: 2\n"), 0);
    struct job jobs[2] = {{a.sock, NULL, 0}, {a.sock, NULL, 1}};
    run(mismatch_main, jobs, 2);
    assert_int_equal(agent_stop(&a), 0);
}

/* the parent moves on (a member closes it): the child's next op fails with EPOCH, and
 * says why; the child, closed, can be made again from the reopened parent */
static int orphan_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *k;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    static const int both[2] = {0, 1};
    if (j->rank < 2) { /* rank 2 is not a member */
        if (coll_group_create(g, both, 2, &k) != COLL_OK) return 150;
        if ((rc = sum_check(c, k, x, j->rank, 3.0f))) return rc;
    }
    /* everyone done with the first op: rank 2 leaves the parent */
    coll_request r;
    if (coll_barrier(g, NULL, &r) != COLL_OK || coll_wait(c, r, 20000) != COLL_OK) return 151;
    if (j->rank == 2) {
        coll_disconnect(&c);
        return 0;
    }
    /* the child's epoch ended with the parent's: every later op says so */
    coll_err e = COLL_OK;
    for (int i = 0; i < 500 && e == COLL_OK; i++) {
        if (coll_allreduce(k, x, x, 16, COLL_FLOAT32, COLL_SUM, NULL, &r) == COLL_OK)
            e = coll_wait(c, r, 20000);
        else
            e = COLL_ERR_EPOCH;
        usleep(1000);
    }
    if (e != COLL_ERR_EPOCH) {
        fprintf(stderr, "rank %d: child op: %s (%s)\n", j->rank, coll_strerror(e),
                coll_last_error());
        return 152;
    }
    coll_group_close(&k);
    /* a create on the parent handle of the ended epoch is refused with EPOCH */
    if (coll_group_create(g, both, 2, &k) != COLL_ERR_EPOCH) return 153;
    coll_disconnect(&c);
    return 0;
}

static void a_parent_that_moves_on_ends_its_children(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(agent_start(&a, NULL, "groups:\n  - name: g\n    local_slots: 3\n"), 0);
    struct job jobs[3] = {{a.sock, NULL, 0}, {a.sock, NULL, 1}, {a.sock, NULL, 2}};
    run(orphan_main, jobs, 3);
    assert_true(agent_log_count(&a, "its parent group ended its epoch") >= 1);
    /* every child went with its last member */
    assert_int_equal(agent_log_count(&a, "event=group.child "),
                     agent_log_count(&a, "event=group.child_end"));
    assert_int_equal(agent_stop(&a), 0);
}

static void limits_and_bad_arguments_are_refused(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(agent_start(&a, NULL, "groups:\n  - name: g\n    local_slots: 2\n"), 0);
    coll_conn *c;
    coll_group *g, *k = NULL;
    assert_int_equal(coll_connect(&c, a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "g", 0), COLL_OK);
    const int bad_range[2] = {0, 2}, twice[2] = {0, 0}, without_me[1] = {1}, me[1] = {0};
    assert_int_equal(coll_group_create(g, bad_range, 2, &k), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "ranks[1] = 2"));
    assert_int_equal(coll_group_create(g, twice, 2, &k), COLL_ERR_INVALID);
    assert_int_equal(coll_group_create(g, without_me, 1, &k), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "only the members"));
    assert_int_equal(coll_group_create(g, me, 0, &k), COLL_ERR_INVALID);
    assert_int_equal(coll_group_create(NULL, me, 1, &k), COLL_ERR_INVALID);
    assert_int_equal(coll_group_split(g, -5, 0, &k), COLL_ERR_INVALID);
    assert_null(k);
    /* one-rank children of this rank: 64 at most under one group */
    coll_group *kids[64];
    int n = 0;
    coll_err e = COLL_OK;
    while (n < 64 && (e = coll_group_create(g, me, 1, &kids[n])) == COLL_OK)
        n++;
    /* a session holds 64 handles, the parent among them: 63 children, then LIMIT from
     * the session; a second connection takes the agent's limit per group */
    assert_int_equal(e, COLL_ERR_LIMIT);
    assert_int_equal(n, 63);
    coll_conn *c2;
    coll_group *g2, *k2;
    assert_int_equal(coll_connect(&c2, a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g2, c2, "g", 1), COLL_OK);
    const int one[1] = {1};
    assert_int_equal(coll_group_create(g2, one, 1, &k2), COLL_OK);
    assert_int_equal(coll_group_create(g2, one, 1, &k), COLL_ERR_LIMIT);
    assert_non_null(strstr(coll_last_error(), "has 64 children already"));
    /* a one-rank child runs alone */
    float *x;
    coll_buffer *b;
    assert_int_equal(coll_mem_alloc(&b, c, 4096, COLL_DEVICE_HOST), COLL_OK);
    x = coll_mem_ptr(b);
    x[0] = 5;
    coll_request r;
    assert_int_equal(coll_allreduce(kids[0], x, x + 1, 1, COLL_FLOAT32, COLL_SUM, NULL, &r),
                     COLL_OK);
    assert_int_equal(coll_wait(c, r, 10000), COLL_OK);
    assert_true(x[1] == 5.0f);
    for (int i = 0; i < n; i++)
        coll_group_close(&kids[i]);
    assert_int_equal(coll_group_create(g2, one, 1, &k), COLL_OK); /* room again */
    coll_disconnect(&c2);
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
}

/* a child whose ranks span pods: refused by name (not supported yet), nothing hangs */
static void a_child_across_pods_is_refused_by_name(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: host\n    members: 2\n"
                 "    timeouts: {op_ms: 20000, heartbeat_ms: 250, join_ms: 5000}\n",
                 i, i, port);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    coll_conn *c;
    coll_group *g, *k = NULL;
    assert_int_equal(coll_connect(&c, a[0].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "g", 0), COLL_OK);
    const int both[2] = {0, 1}, me[1] = {0};
    assert_int_equal(coll_group_create(g, both, 2, &k), COLL_ERR_UNSUPPORTED);
    assert_non_null(strstr(coll_last_error(), "rank 1 is on another pod"));
    assert_null(k);
    /* this pod's own ranks make a child across nothing */
    assert_int_equal(coll_group_create(g, me, 1, &k), COLL_OK);
    coll_disconnect(&c);
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(splits_of_every_shape_run_every_op),
        cmocka_unit_test(members_create_without_the_others),
        cmocka_unit_test(a_split_answered_by_another_op_fails_on_both),
        cmocka_unit_test(a_parent_that_moves_on_ends_its_children),
        cmocka_unit_test(limits_and_bad_arguments_are_refused),
        cmocka_unit_test(a_child_across_pods_is_refused_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
