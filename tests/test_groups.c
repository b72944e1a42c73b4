/*
 * test_groups.c: groups made at run time (coll_group_split, coll_group_create) against
 * real agents, each rank a process of its own: children of every shape on one pod
 * (4x2, 2x4, nested), members-only creation with the others never waited for, ops on a
 * parent and its children interleaved, a split that one rank answers with another op,
 * a parent that moves on under its children, limits and bad arguments; and across four
 * pods of two ranks each, children across pods (libcoll's: span.c) of both shapes through
 * the whole op matrix, nested in each other and with children of one pod, beside ops
 * on the parent, and premultiplied sums on children of both kinds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"
#include "opcheck.h"
#include "util.h"

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

/* fn for each of the n jobs (stride bytes apart), each a process; whether any did not
 * exit 0 within ms */
static int run_jobs(int (*fn)(void *), void *jobs, size_t stride, int n, int ms)
{
    pid_t p[RANKS];
    for (int i = 0; i < n; i++)
        p[i] = child_run(fn, (char *)jobs + (size_t)i * stride);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st = child_wait(p[i], ms);
        if (st) fprintf(stderr, "rank %d exited %d\n", i, st);
        bad |= st != 0;
    }
    return bad;
}

static void run(int (*fn)(void *), struct job *jobs, int n)
{
    assert_false(run_jobs(fn, jobs, sizeof(*jobs), n, 120000));
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

/* /metrics counts a child's ops under the child's name, apart from its parent's: ranks
 * 0 and 1 of 2 make the child of both and run 5 allreduces on it, then hold it (a child
 * nobody holds goes, and its series with it) until the test has read the count. */
static int metrics_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *k;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    const int both[2] = {0, 1};
    if (coll_group_create(g, both, 2, &k) != COLL_OK) return 120;
    for (int i = 0; i < 5; i++)
        if ((rc = sum_check(c, k, x, j->rank, 3)) != 0) return rc;
    char done[160];
    snprintf(done, sizeof(done), "%s.%d", j->hold, j->rank);
    FILE *f = fopen(done, "w");
    if (!f) return 121;
    fclose(f);
    struct stat st;
    for (int i = 0; i < 3000 && stat(j->hold, &st) != 0; i++)
        usleep(10000);
    coll_disconnect(&c);
    return 0;
}

/* the value of the series named line (its whole name and labels) in file, or -1 */
static long series(const char *file, const char *line)
{
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char buf[512];
    long v = -1;
    size_t n = strlen(line);
    while (fgets(buf, sizeof(buf), f))
        if (!strncmp(buf, line, n) && buf[n] == ' ') v = atol(buf + n + 1);
    fclose(f);
    return v;
}

static void a_childs_ops_are_counted_under_its_name(void **state)
{
    (void)state;
    struct agent a;
    char body[256], extra[96];
    int hport = http_extra(extra, sizeof(extra), 0);
    snprintf(body, sizeof(body),
             "%sgroups:\n  - name: g\n    local_slots: 2\n    timeouts: {op_ms: 20000}\n", extra);
    assert_int_equal(agent_start(&a, NULL, body), 0);
    char hold[128], scrape[128], url[96];
    tmp_path(hold, sizeof(hold), "hold", 0);
    tmp_path(scrape, sizeof(scrape), "metrics", 0);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", hport);
    struct job jobs[2] = {{.sock = a.sock, .hold = hold, .rank = 0},
                          {.sock = a.sock, .hold = hold, .rank = 1}};
    pid_t p[2];
    for (int i = 0; i < 2; i++)
        p[i] = child_run(metrics_main, &jobs[i]);
    struct stat st;
    char d0[160], d1[160];
    snprintf(d0, sizeof(d0), "%s.0", hold);
    snprintf(d1, sizeof(d1), "%s.1", hold);
    for (int i = 0; i < 2000 && (stat(d0, &st) != 0 || stat(d1, &st) != 0); i++)
        usleep(10000);
    /* the published text is up to a second old: read until the child's ops are there */
    const char *child = "coll_ops_total{group=\"g/0+1\",kind=\"allreduce\",status=\"ok\"}";
    const char *parent = "coll_ops_total{group=\"g\",kind=\"allreduce\",status=\"ok\"}";
    long got = -1;
    for (int i = 0; i < 50 && got != 10; i++) {
        assert_int_equal(http_get(url, scrape), 200);
        got = series(scrape, child);
        if (got != 10) usleep(100 * 1000);
    }
    assert_int_equal(got, 10); /* 5 ops of each of its 2 ranks */
    assert_int_equal(series(scrape, parent), 0);
    FILE *f = fopen(hold, "w");
    assert_non_null(f);
    fclose(f);
    for (int i = 0; i < 2; i++)
        assert_int_equal(child_wait(p[i], 30000), 0);
    unlink(hold);
    unlink(d0);
    unlink(d1);
    unlink(scrape);
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

/* ---- children across pods --------------------------------------------------------- */

#define PODS 4

/* PODS agents of one host group g, 2 slots each: ranks 0..7, rank r on pod r / 2 */
static void start_pods(struct agent *a, int op_ms)
{
    int port = free_port();
    for (int i = 0; i < PODS; i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: host\n    members: %d\n"
                 "    local_slots: 2\n"
                 "    timeouts: {op_ms: %d, heartbeat_ms: %d, join_ms: 5000}\n",
                 i, i, port, PODS, op_ms, TEST_HB_MS);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
}

static void stop_pods(struct agent *a)
{
    for (int i = 0; i < PODS; i++)
        if (a[i].pid) agent_stop(&a[i]);
}

/* the op matrix (every op, dtype, reduction, count, in and out of place) on children
 * of the 8-rank world: split_mod children, color (rank / split_div) % split_mod */
static void matrix_on_children(int split_mod, int split_div)
{
    struct agent a[PODS];
    start_pods(a, 20000);
    struct opcheck_job jobs[RANKS];
    for (int r = 0; r < RANKS; r++)
        jobs[r] = (struct opcheck_job){.sock = a[r / 2].sock,
                                       .explicit_slot = 1,
                                       .slot = r % 2,
                                       .split_mod = split_mod,
                                       .split_div = split_div};
    int bad = run_jobs(opcheck_rank_main, jobs, sizeof(jobs[0]), RANKS, 600000);
    for (int i = 0; i < PODS; i++)
        bad |= agent_log_count(&a[i], "protocol_error") != 0;
    stop_pods(a);
    assert_false(bad);
}

/* 2x4: halves {0,2,4,6} and {1,3,5,7}, each across all four pods */
static void halves_across_four_pods_run_the_op_matrix(void **state)
{
    (void)state;
    matrix_on_children(2, 1);
}

/* 4x2: pairs {r, r + 4}, each across two pods */
static void pairs_across_two_pods_run_the_op_matrix(void **state)
{
    (void)state;
    matrix_on_children(4, 1);
}

/* A world across pods: children across pods and of one pod, nested both ways, their
 * info, async ops on the parent and on a child at once, tagged sends and receives on a
 * child, and the create handshake (a second create of the same list is a second child) */
static int world_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *halves, *pod, *quarter, *local;
    float *x;
    int rc = open_rank(j, &c, &g, &x); /* j->rank: the slot on its pod */
    if (rc) return rc;
    coll_group_info gi;
    coll_group_info_get(g, &gi);
    int r = gi.rank;
    /* halves across pods (key: parent order) and a pod's pair (one pod: the agent's) */
    if (coll_group_split(g, r % 2, r, &halves) != COLL_OK) return 140;
    if (coll_group_split(g, r / 2, r, &pod) != COLL_OK) return 141;
    coll_group_info hi, pi;
    coll_group_info_get(halves, &hi);
    coll_group_info_get(pod, &pi);
    if (hi.size != 4 || hi.rank != r / 2 || hi.nodes != 4 || hi.node_index != r / 2 ||
        hi.local_slots != 1 || strcmp(hi.backend, "host"))
        return 142;
    if (pi.size != 2 || pi.nodes != 1 || pi.rank != r % 2) return 143;
    int pr[4];
    if (coll_group_parent_ranks(halves, pr, 4) != 4 || pr[3] != 6 + r % 2) return 144;
    /* nested in a child across pods: its ranks 0,1 (parent ranks r%2, r%2 + 2: pods 0
     * and 1) and 2,3 (pods 2 and 3): across pods again */
    if (coll_group_split(halves, hi.rank / 2, hi.rank, &quarter) != COLL_OK) return 145;
    coll_group_info qi;
    coll_group_info_get(quarter, &qi);
    if (qi.size != 2 || qi.nodes != 2 || qi.rank != hi.rank % 2) return 146;
    /* a child of one pod made from a child across pods: ranks of the half on this pod
     * (one each), so a child of one */
    const int mine[1] = {hi.rank};
    if (coll_group_create(halves, mine, 1, &local) != COLL_OK) return 147;
    coll_group_info li;
    coll_group_info_get(local, &li);
    if (li.size != 1 || li.nodes != 1 || coll_group_parent_ranks(local, pr, 4) != 1 ||
        pr[0] != hi.rank)
        return 148;
    for (int round = 0; round < 5; round++) {
        /* halves: sum of (k + 1) over {0,2,4,6} = 16, over {1,3,5,7} = 20 */
        if ((rc = sum_check(c, halves, x, r, r % 2 ? 20.0f : 16.0f))) return rc;
        if ((rc = sum_check(c, pod, x, r, (float)(4 * (r / 2) + 3)))) return rc;
        if ((rc = sum_check(c, g, x, r, 36.0f))) return rc;
        int q0 = r % 2 + 4 * (hi.rank / 2); /* the quarter's parent ranks q0, q0 + 2 */
        if ((rc = sum_check(c, quarter, x, r, (float)(q0 + 1 + q0 + 3)))) return rc;
        if ((rc = sum_check(c, local, x, r, (float)(r + 1)))) return rc;
    }
    /* at once: an allreduce on the parent and one on a half, then tagged sends and
     * receives on the half in the other order of tags */
    float *y = x + 1024, *z = x + 2048;
    for (int k = 0; k < 64; k++) {
        x[k] = 1.0f;
        y[k] = (float)r;
    }
    coll_request ra, rb, rs[4];
    if (coll_allreduce(g, x, x, 64, COLL_FLOAT32, COLL_SUM, NULL, &ra) != COLL_OK) return 150;
    if (coll_allreduce(halves, y, y, 64, COLL_FLOAT32, COLL_MAX, NULL, &rb) != COLL_OK) return 151;
    size_t idx;
    if (coll_wait_any(c, (coll_request[]){rb}, 1, &idx, 20000) != COLL_OK) return 152;
    if (coll_wait(c, ra, 20000) != COLL_OK) return 153;
    if (x[63] != 8.0f || y[0] != (float)(6 + r % 2)) return 154;
    int right = (hi.rank + 1) % 4, left = (hi.rank + 3) % 4;
    z[0] = (float)(100 * r + 1);
    z[1] = (float)(100 * r + 2);
    if (coll_recv_tag(halves, z + 8, 1, COLL_FLOAT32, left, 2, NULL, &rs[0]) != COLL_OK ||
        coll_recv_tag(halves, z + 9, 1, COLL_FLOAT32, left, 1, NULL, &rs[1]) != COLL_OK ||
        coll_send_tag(halves, z, 1, COLL_FLOAT32, right, 1, NULL, &rs[2]) != COLL_OK ||
        coll_send_tag(halves, z + 1, 1, COLL_FLOAT32, right, 2, NULL, &rs[3]) != COLL_OK)
        return 155;
    if (coll_wait_all(c, rs, 4, 20000) != COLL_OK) return 156;
    int from = left * 2 + r % 2; /* the left neighbour's parent rank */
    if (z[8] != (float)(100 * from + 2) || z[9] != (float)(100 * from + 1)) return 157;
    /* a child's tags stop below its collectives' own */
    if (coll_send_tag(halves, z, 1, COLL_FLOAT32, right, 8191, NULL, &rs[0]) != COLL_ERR_INVALID ||
        !strstr(coll_last_error(), "tags 0..8190"))
        return 158;
    if (coll_send_tag(g, z, 1, COLL_FLOAT32, 0, COLL_TAG_MAX + 1, NULL, &rs[0]) != COLL_ERR_INVALID)
        return 159;
    /* the second create of one list: another child, with a tag of its own */
    coll_group *again;
    const int evens[4] = {r % 2, r % 2 + 2, r % 2 + 4, r % 2 + 6};
    if (coll_group_create(g, evens, 4, &again) != COLL_OK) return 160;
    if ((rc = sum_check(c, again, x, r, r % 2 ? 20.0f : 16.0f))) return rc;
    if ((rc = sum_check(c, halves, x, r, r % 2 ? 20.0f : 16.0f))) return rc;
    coll_request r0;
    if (coll_barrier(g, NULL, &r0) != COLL_OK || coll_wait(c, r0, 20000) != COLL_OK) return 161;
    coll_group_close(&again);
    coll_group_close(&local);
    coll_group_close(&quarter);
    coll_group_close(&pod);
    coll_group_close(&halves);
    coll_disconnect(&c);
    return 0;
}

/* fn in every rank of the four pods' world (rank r: pod r / 2, slot r % 2), within ms;
 * whether any rank failed or any agent logged a protocol error */
static int run_world(int (*fn)(void *), int ms)
{
    struct agent a[PODS];
    start_pods(a, 20000);
    struct job jobs[RANKS];
    for (int r = 0; r < RANKS; r++)
        jobs[r] = (struct job){.sock = a[r / 2].sock, .rank = r % 2};
    int bad = run_jobs(fn, jobs, sizeof(jobs[0]), RANKS, ms);
    for (int i = 0; i < PODS; i++)
        bad |= agent_log_count(&a[i], "protocol_error") != 0;
    stop_pods(a);
    return bad;
}

static void a_world_across_pods_splits_nests_and_mixes(void **state)
{
    (void)state;
    assert_false(run_world(world_main, 120000));
}

/* A child across pods' large allreduce runs in two steps (rsag.c), its second posted by
 * whichever wait comes: on halves across the four pods (one rank a pod), two of them (a
 * sum and an average) in flight with a small allreduce and tagged sends and receives,
 * each rank waiting for them in an order of its own (odd ranks the small ops first, so
 * their peers' second steps go out from other waits). Each element checked exactly. Then
 * counts that disagree fail every rank with MISMATCH, and the next op runs. */
#define BIG (256u << 10) /* floats: 1 MiB, which 4 ranks run in two steps */

static int two_steps_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *halves;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    coll_group_info gi, hi;
    coll_group_info_get(g, &gi);
    int r = gi.rank;
    coll_buffer *b;
    if (coll_mem_alloc(&b, c, 2 * BIG * sizeof(float), COLL_DEVICE_HOST) != COLL_OK) return 170;
    float *s = coll_mem_ptr(b), *a = s + BIG, *y = x, *z = x + 64;
    if (coll_group_split(g, r % 2, r, &halves) != COLL_OK) return 171;
    coll_group_info_get(halves, &hi);
    float ranks = r % 2 ? 16.0f : 12.0f; /* the sum of the half's parent ranks */
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < BIG; i++) {
            s[i] = (float)(i % 97 + (size_t)r);
            a[i] = 4.0f * (float)(i % 89 + (size_t)r);
        }
        for (int k = 0; k < 16; k++)
            y[k] = (float)(r * 10 + round);
        z[0] = (float)(100 * r + round);
        int right = (hi.rank + 1) % 4, left = (hi.rank + 3) % 4;
        coll_request q[6]; /* q[5]: the barrier */
        if (coll_allreduce(halves, s, s, BIG, COLL_FLOAT32, COLL_SUM, NULL, &q[0]) ||
            coll_allreduce(halves, a, a, BIG, COLL_FLOAT32, COLL_AVG, NULL, &q[1]) ||
            coll_allreduce(halves, y, y, 16, COLL_FLOAT32, COLL_MAX, NULL, &q[2]) ||
            coll_recv_tag(halves, z + 1, 1, COLL_FLOAT32, left, 5, NULL, &q[3]) ||
            coll_send_tag(halves, z, 1, COLL_FLOAT32, right, 5, NULL, &q[4]))
            return 172;
        /* 5: a barrier, submitted there: odd ranks wait for it before their large ops,
         * which their peers wait for before they submit it */
        static const int orders[2][6] = {{0, 1, 2, 3, 4, 5}, {2, 4, 3, 5, 1, 0}};
        for (int k = 0; k < 6; k++) {
            int o = orders[hi.rank % 2][k];
            coll_err e = o == 5 ? coll_barrier(halves, NULL, &q[5]) : COLL_OK;
            if (e == COLL_OK) e = coll_wait(c, q[o], 20000);
            if (e != COLL_OK) {
                fprintf(stderr, "rank %d, round %d, op %d: %s (%s)\n", r, round, o,
                        coll_strerror(e), coll_last_error());
                return 173;
            }
        }
        for (size_t i = 0; i < BIG; i++)
            if (s[i] != 4.0f * (float)(i % 97) + ranks || a[i] != 4.0f * (float)(i % 89) + ranks) {
                fprintf(stderr, "rank %d, round %d, element %zu: %g and %g\n", r, round, i,
                        (double)s[i], (double)a[i]);
                return 174;
            }
        if (y[15] != (float)((6 + r % 2) * 10 + round) ||
            z[1] != (float)(100 * (left * 2 + r % 2) + round))
            return 175;
    }
    /* counts that disagree: rank 1 of each half one element short, so only block 3
     * differs and only rank 3's first step fails; the second step it posts anyway fails
     * the others, all with MISMATCH, none at op_ms; then the half serves on */
    for (int round = 0; round < 2; round++) {
        size_t cnt = round == 0 && hi.rank == 1 ? BIG - 1 : BIG;
        for (size_t i = 0; i < BIG; i++)
            s[i] = (float)(i % 97 + (size_t)r);
        coll_request q;
        coll_err e = coll_allreduce(halves, s, s, cnt, COLL_FLOAT32, COLL_SUM, NULL, &q);
        if (e == COLL_OK) e = coll_wait(c, q, 20000);
        /* rank 3's reason is its own receive; the others say another rank disagreed */
        const char *says = hi.rank == 3 ? "sent 65535 of float32" : "another rank's first step";
        if (e != (round == 0 ? COLL_ERR_MISMATCH : COLL_OK) ||
            (round == 0 && !strstr(coll_last_error(), says))) {
            fprintf(stderr, "rank %d: %s allreduce: %s (%s)\n", r,
                    round ? "a good" : "a disagreeing", coll_strerror(e), coll_last_error());
            return 177 + round;
        }
    }
    for (size_t i = 0; i < BIG; i++)
        if (s[i] != 4.0f * (float)(i % 97) + ranks) return 179;
    coll_request q; /* every rank stays until all are done (one that leaves ends the epoch) */
    if (coll_barrier(g, NULL, &q) != COLL_OK || coll_wait(c, q, 60000) != COLL_OK) return 176;
    coll_group_close(&halves);
    coll_mem_release(&b);
    coll_disconnect(&c);
    return 0;
}

static void a_large_allreduce_of_a_child_runs_in_two_steps(void **state)
{
    (void)state;
    assert_false(run_world(two_steps_main, 180000));
}

/* The op matrix on the halves, every allreduce in two steps (COLL_RSAG=1: whatever its
 * size) */
static void halves_run_the_op_matrix_in_two_steps(void **state)
{
    (void)state;
    setenv("COLL_RSAG", "1", 1);
    matrix_on_children(2, 1);
    unsetenv("COLL_RSAG");
}

/* Premultiplied sums on children: halves across all four pods, their nested quarters
 * across two, and a pod's pair (one pod: the agent's), every rank with a scalar of its
 * own (opcheck_premul), each element checked exactly; then one scalar on every rank. */
static int premul_children_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *halves, *quarter, *pod;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    coll_group_info gi;
    coll_group_info_get(g, &gi);
    int r = gi.rank;
    coll_buffer *b;
    const size_t big = 4096; /* per block: 32 KiB of float64s */
    if (coll_mem_alloc(&b, c, big * 8 * 5, COLL_DEVICE_HOST) != COLL_OK) return 180;
    char *in = coll_mem_ptr(b), *out = in + big * 8 * 4;
    if (coll_group_split(g, r % 2, r, &halves) != COLL_OK) return 181;
    coll_group_info hi;
    coll_group_info_get(halves, &hi);
    if (coll_group_split(halves, hi.rank / 2, hi.rank, &quarter) != COLL_OK) return 182;
    if (coll_group_split(g, r / 2, r, &pod) != COLL_OK) return 183;
    if ((rc = opcheck_premul(c, halves, in, out, big))) return rc;
    if ((rc = opcheck_premul(c, quarter, in, out, big))) return rc;
    if ((rc = opcheck_premul(c, pod, in, out, big))) return rc;
    /* a scalar that opcheck_premul did not use: a new op of the half's own */
    float two = 2.0f;
    coll_redop op_h;
    if (coll_redop_create_premul_sum(halves, &two, COLL_FLOAT32, &op_h) != COLL_OK) return 184;
    coll_request q;
    /* 2 x (r + 1) summed over the half: 2 x 16 (evens) or 2 x 20 (odds) */
    for (int k = 0; k < 16; k++)
        x[k] = (float)(r + 1);
    coll_err e = coll_allreduce(halves, x, x, 16, COLL_FLOAT32, op_h, NULL, &q);
    if (e == COLL_OK) e = coll_wait(c, q, 20000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: premultiplied allreduce on the half: %s (%s)\n", r,
                coll_strerror(e), coll_last_error());
        return 186;
    }
    for (int k = 0; k < 16; k++)
        if (x[k] != (r % 2 ? 40.0f : 32.0f)) {
            fprintf(stderr, "rank %d: premultiplied half [%d] = %g\n", r, k, x[k]);
            return 187;
        }
    /* the halves end apart: a rank that left the parent now would end its epoch under
     * the other half's op, so the whole parent meets once more first */
    if (coll_barrier(g, NULL, &q) != COLL_OK || coll_wait(c, q, 20000) != COLL_OK) return 188;
    coll_group_close(&pod);
    coll_group_close(&quarter);
    coll_group_close(&halves);
    coll_mem_release(&b);
    coll_disconnect(&c);
    return 0;
}

static void premultiplied_sums_on_children(void **state)
{
    (void)state;
    assert_false(run_world(premul_children_main, 300000));
}

/* Across two pods of one rank each: lists that differ fail create with MISMATCH on
 * both ranks; a child made right runs, and its ops of counts that disagree fail on both
 * ranks; then rank 1 dies (its process exits, no close)
 * while rank 0 waits in an op of their child: rank 0's op fails, retryably, within the
 * heartbeats' notice, never a hang. */
static int dying_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *k;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    coll_group_info gi;
    coll_group_info_get(g, &gi);
    int r = gi.rank;
    const int up[2] = {0, 1}, down[2] = {1, 0};
    coll_err e = coll_group_create(g, r ? down : up, 2, &k);
    if (e != COLL_ERR_MISMATCH || !strstr(coll_last_error(), "lists other ranks")) {
        fprintf(stderr, "rank %d: create of differing lists: %s (%s)\n", r, coll_strerror(e),
                coll_last_error());
        return 170;
    }
    if (coll_group_create(g, up, 2, &k) != COLL_OK) return 171;
    if ((rc = sum_check(c, k, x, r, 3.0f))) return rc;
    /* counts that disagree fail every rank with MISMATCH: an allreduce's and an
     * allgather's through their receives (their sends wait for no word back), and a
     * broadcast's lone sender through its ack; the child serves on */
    for (int kind = 0; kind < 3; kind++) {
        coll_request q;
        size_t cnt = r ? 32 : 16;
        e = kind == 0   ? coll_allreduce(k, x, x, cnt, COLL_FLOAT32, COLL_SUM, NULL, &q)
            : kind == 1 ? coll_allgather(k, x, x + 64, cnt, COLL_FLOAT32, NULL, &q)
                        : coll_broadcast(k, x, x, cnt, COLL_FLOAT32, 0, NULL, &q);
        if (e == COLL_OK) e = coll_wait(c, q, 20000);
        if (e != COLL_ERR_MISMATCH) {
            fprintf(stderr, "rank %d: op %d of counts that disagree: %s (%s)\n", r, kind,
                    coll_strerror(e), coll_last_error());
            return 174 + kind;
        }
    }
    if ((rc = sum_check(c, k, x, r, 3.0f))) return rc;
    if (r == 1) {
        usleep(300000);
        _exit(0); /* dies: no close, no goodbye */
    }
    coll_request q;
    if (coll_allreduce(k, x, x, 16, COLL_FLOAT32, COLL_SUM, NULL, &q) != COLL_OK) return 172;
    int64_t t0 = now_ns();
    e = coll_wait(c, q, 20000);
    double s = (double)(now_ns() - t0) / 1e9;
    if (e == COLL_OK || e == COLL_ERR_TIMEOUT || !coll_err_retryable(e)) {
        fprintf(stderr, "rank 0: op of a child whose peer died: %s after %.2f s (%s)\n",
                coll_strerror(e), s, coll_last_error());
        return 173;
    }
    coll_group_close(&k);
    coll_disconnect(&c);
    return 0;
}

/* n pods of one rank each (a host group g of n ranks), fn run by each rank's process;
 * whether any failed or any agent logged a protocol error */
static int one_rank_pods(int n, int (*fn)(void *), int ms)
{
    struct agent a[4];
    int port = free_port();
    for (int i = 0; i < n; i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: host\n    members: %d\n"
                 "    timeouts: {op_ms: 20000, heartbeat_ms: %d, join_ms: 5000}\n",
                 i, i, port, n, TEST_HB_MS);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    struct job jobs[4];
    for (int i = 0; i < n; i++)
        jobs[i] = (struct job){.sock = a[i].sock, .rank = 0};
    int bad = run_jobs(fn, jobs, sizeof(jobs[0]), n, ms);
    for (int i = 0; i < n; i++)
        bad |= agent_log_count(&a[i], "protocol_error") != 0;
    for (int i = 0; i < n; i++)
        agent_stop(&a[i]);
    return bad;
}

static void a_child_across_pods_fails_cleanly(void **state)
{
    (void)state;
    assert_false(one_rank_pods(2, dying_main, 120000));
}

/* A rank blocked on a direct op (COLL_DIRECT: the application runs its pod's side of the
 * parent's tiny ops) still sends its two-step ops' second steps: three pods of one rank
 * each, a child of all three; rank 0 submits the child's allreduce (in two steps:
 * COLL_RSAG=1) and then a tiny allreduce of the parent, and either waits for the tiny
 * one first (even rounds) or submits a large allreduce of the parent first, which gives
 * the connections back once the tiny one is done (odd rounds); ranks 1 and 2 wait for
 * the child's op before they submit theirs. Rank 0's wait, or its give-back, must post
 * its second step, or every rank waits until op_ms. */
static int direct_wait_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *all;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    coll_group_info gi;
    coll_group_info_get(g, &gi);
    int r = gi.rank;
    if (coll_group_split(g, 0, r, &all) != COLL_OK) return 190;
    if ((rc = sum_check(c, g, x, r, 6.0f))) return rc; /* the parent's tiny ops run here */
    enum { BIGN = 3000, LARGE = 20000 }; /* LARGE floats: 80 KB, an op of the agent's */
    coll_buffer *zb;
    if (coll_mem_alloc(&zb, c, LARGE * sizeof(float), COLL_DEVICE_HOST) != COLL_OK) return 197;
    for (int round = 0; round < 4; round++) {
        float *big = x + 64, *y = x, *z = coll_mem_ptr(zb);
        int give_back = round % 2;
        for (int i = 0; i < BIGN; i++)
            big[i] = (float)(i + r);
        for (int i = 0; i < LARGE; i++)
            z[i] = (float)(r + i % 7);
        y[0] = (float)(r + round);
        coll_request qa, qy, qz = {0};
        if (coll_allreduce(all, big, big, BIGN, COLL_FLOAT32, COLL_SUM, NULL, &qa) != COLL_OK)
            return 191;
        coll_err e = COLL_OK;
        if (r == 0) {
            e = coll_allreduce(g, y, y, 1, COLL_FLOAT32, COLL_SUM, NULL, &qy);
            if (e == COLL_OK && give_back)
                e = coll_allreduce(g, z, z, LARGE, COLL_FLOAT32, COLL_SUM, NULL, &qz);
            if (e == COLL_OK) e = coll_wait(c, qy, 20000);
            if (e == COLL_OK && give_back) e = coll_wait(c, qz, 20000);
            if (e == COLL_OK) e = coll_wait(c, qa, 20000);
        } else {
            e = coll_wait(c, qa, 20000);
            if (e == COLL_OK) e = coll_allreduce(g, y, y, 1, COLL_FLOAT32, COLL_SUM, NULL, &qy);
            if (e == COLL_OK && give_back)
                e = coll_allreduce(g, z, z, LARGE, COLL_FLOAT32, COLL_SUM, NULL, &qz);
            if (e == COLL_OK) e = coll_wait(c, qy, 20000);
            if (e == COLL_OK && give_back) e = coll_wait(c, qz, 20000);
        }
        if (e != COLL_OK) {
            fprintf(stderr, "rank %d, round %d: %s (%s)\n", r, round, coll_strerror(e),
                    coll_last_error());
            return 192;
        }
        for (int i = 0; i < BIGN; i++)
            if (big[i] != (float)(3 * i + 3)) return 193;
        if (y[0] != (float)(3 + 3 * round)) return 194;
        for (int i = 0; give_back && i < LARGE; i++)
            if (z[i] != (float)(3 + 3 * (i % 7))) return 196;
    }
    coll_request q;
    if (coll_barrier(g, NULL, &q) != COLL_OK || coll_wait(c, q, 20000) != COLL_OK) return 195;
    coll_group_close(&all);
    coll_mem_release(&zb);
    coll_disconnect(&c);
    return 0;
}

static void a_direct_wait_sends_second_steps(void **state)
{
    (void)state;
    setenv("COLL_RSAG", "1", 1);
    int bad = one_rank_pods(3, direct_wait_main, 120000);
    unsetenv("COLL_RSAG");
    assert_false(bad);
}

/* The same where the agent runs every op (COLL_DIRECT=0): the agent holds rank 0's tiny
 * allreduce of the parent, which waits for ranks 1 and 2, while rank 0's second step
 * comes after it. Sends and receives never queue behind a collective on the net thread,
 * or every rank waits until op_ms. */
static void an_agent_op_does_not_hold_second_steps(void **state)
{
    (void)state;
    setenv("COLL_RSAG", "1", 1);
    setenv("COLL_DIRECT", "0", 1);
    int bad = one_rank_pods(3, direct_wait_main, 120000);
    unsetenv("COLL_DIRECT");
    unsetenv("COLL_RSAG");
    assert_false(bad);
}

/* Ranks that run different ops on a child across pods fail with MISMATCH, all of them,
 * naming both ops, instead of mixing their bytes: each send carries its op's signature
 * (kind and reduction) and the receive compares it, between pods (p2p.c) and within one
 * (the engine's pairing). A child of the whole four-pod world: rank 5 takes max where
 * the others sum (an allreduce moves the same bytes either way), rank 2 gathers where
 * the others reduce, then rank 5 takes max again in a two-step allreduce; after each,
 * an op they agree on runs and its result is exact. */
static int sigs_main(void *arg)
{
    const struct job *j = arg;
    coll_conn *c;
    coll_group *g, *all;
    float *x;
    int rc = open_rank(j, &c, &g, &x);
    if (rc) return rc;
    coll_group_info gi;
    coll_group_info_get(g, &gi);
    int r = gi.rank;
    if (coll_group_split(g, 0, r, &all) != COLL_OK) return 180;
    coll_buffer *b;
    if (coll_mem_alloc(&b, c, BIG * sizeof(float), COLL_DEVICE_HOST) != COLL_OK) return 181;
    float *big = coll_mem_ptr(b);
    for (int round = 0; round < 3; round++) {
        coll_request q;
        coll_err e;
        const char *says;
        if (round == 0) { /* 16 floats: an exchange */
            for (int k = 0; k < 16; k++)
                x[k] = (float)r;
            e = coll_allreduce(all, x, x, 16, COLL_FLOAT32, r == 5 ? COLL_MAX : COLL_SUM, NULL, &q);
            says = "allreduce (max)";
        } else if (round == 1) {
            e = r == 2 ? coll_allgather(all, x, x + 32, 2, COLL_FLOAT32, NULL, &q)
                       : coll_allreduce(all, x, x, 2, COLL_FLOAT32, COLL_SUM, NULL, &q);
            says = "allgather";
        } else { /* 1 MiB over 8 ranks: in two steps */
            for (size_t i = 0; i < BIG; i++)
                big[i] = (float)r;
            e = coll_allreduce(all, big, big, BIG, COLL_FLOAT32, r == 5 ? COLL_MAX : COLL_SUM, NULL,
                               &q);
            says = "allreduce (max)";
        }
        if (e == COLL_OK) e = coll_wait(c, q, 20000);
        if (e != COLL_ERR_MISMATCH || !strstr(coll_last_error(), says)) {
            fprintf(stderr, "rank %d, round %d: %s (%s)\n", r, round, coll_strerror(e),
                    coll_last_error());
            return 182;
        }
        if ((rc = sum_check(c, all, x, r, 36.0f))) return rc; /* 1 + 2 + ... + 8 */
    }
    coll_request q; /* every rank stays until all are done (one that leaves ends the epoch) */
    if (coll_barrier(g, NULL, &q) != COLL_OK || coll_wait(c, q, 60000) != COLL_OK) return 183;
    coll_group_close(&all);
    coll_mem_release(&b);
    coll_disconnect(&c);
    return 0;
}

static void different_ops_on_a_child_fail_every_rank(void **state)
{
    (void)state;
    assert_false(run_world(sigs_main, 120000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(splits_of_every_shape_run_every_op),
        cmocka_unit_test(members_create_without_the_others),
        cmocka_unit_test(a_childs_ops_are_counted_under_its_name),
        cmocka_unit_test(a_split_answered_by_another_op_fails_on_both),
        cmocka_unit_test(a_parent_that_moves_on_ends_its_children),
        cmocka_unit_test(limits_and_bad_arguments_are_refused),
        cmocka_unit_test(a_world_across_pods_splits_nests_and_mixes),
        cmocka_unit_test(pairs_across_two_pods_run_the_op_matrix),
        cmocka_unit_test(halves_across_four_pods_run_the_op_matrix),
        cmocka_unit_test(a_child_across_pods_fails_cleanly),
        cmocka_unit_test(premultiplied_sums_on_children),
        cmocka_unit_test(a_large_allreduce_of_a_child_runs_in_two_steps),
        cmocka_unit_test(halves_run_the_op_matrix_in_two_steps),
        cmocka_unit_test(a_direct_wait_sends_second_steps),
        cmocka_unit_test(an_agent_op_does_not_hold_second_steps),
        cmocka_unit_test(different_ops_on_a_child_fail_every_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
