/*
 * test_api.c: what frameworks drive libcoll with, against a real agent: coll_wait_any,
 * the connection's descriptor for event loops (coll_conn_fd), coll_mem_find, and a
 * handle's own op timeout (coll_group_open_opts).
 *
 * Each test holds two connections to one agent, slots 0 and 1 of a local group: an op
 * completes only once both slots have submitted it, so a test decides when a
 * completion can exist by when it submits the second half, whatever the scheduler does.
 */
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"

struct pair {
    struct agent a;
    coll_conn *c[2];
    coll_group *g[2];
    coll_buffer *b[2];
    float *x[2];
};

static void pair_open(struct pair *p)
{
    memset(p, 0, sizeof(*p));
    assert_int_equal(agent_start(&p->a, "  drain_ms: 300\n",
                                 "groups:\n  - name: g\n    local_slots: 2\n    members: 1\n"),
                     0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(coll_connect(&p->c[i], p->a.sock, 5000), COLL_OK);
        assert_int_equal(coll_group_open(&p->g[i], p->c[i], "g", i), COLL_OK);
        assert_int_equal(coll_mem_alloc(&p->b[i], p->c[i], 2 << 20, COLL_DEVICE_HOST), COLL_OK);
        p->x[i] = coll_mem_ptr(p->b[i]);
    }
}

static void pair_close(struct pair *p)
{
    for (int i = 0; i < 2; i++)
        coll_disconnect(&p->c[i]);
    assert_int_equal(agent_stop(&p->a), 0);
}

/* slot i's allreduce of 16 floats at element offset off (in place), each element i+1 */
static coll_request submit(struct pair *p, int i, size_t off)
{
    coll_request r;
    for (int k = 0; k < 16; k++)
        p->x[i][off + (size_t)k] = (float)(i + 1);
    assert_int_equal(
        coll_allreduce(p->g[i], p->x[i] + off, p->x[i] + off, 16, COLL_FLOAT32, COLL_SUM, NULL, &r),
        COLL_OK);
    return r;
}

static int readable(int fd, int ms)
{
    struct pollfd q = {.fd = fd, .events = POLLIN};
    return poll(&q, 1, ms) == 1 && (q.revents & POLLIN);
}

static void wait_any_returns_the_one_that_completed(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p);
    /* slot 0 has two ops in flight; slot 1 submits only the first: the second cannot
     * complete, the first must */
    coll_request mine[2];
    mine[0] = submit(&p, 0, 0);
    mine[1] = submit(&p, 0, 64);
    coll_request theirs = submit(&p, 1, 0);
    coll_request order[2] = {mine[1], mine[0]};
    size_t idx = 99;
    assert_int_equal(coll_wait_any(p.c[0], order, 2, &idx, 10000), COLL_OK);
    assert_int_equal(idx, 1);
    for (int k = 0; k < 16; k++)
        assert_true(p.x[0][k] == 3.0f);
    /* the other stays pending: a look, and a bounded wait, both say TIMEOUT */
    idx = 99;
    assert_int_equal(coll_wait_any(p.c[0], order, 1, &idx, 0), COLL_ERR_TIMEOUT);
    assert_int_equal(coll_wait_any(p.c[0], order, 1, &idx, 50), COLL_ERR_TIMEOUT);
    assert_int_equal(idx, 99);
    /* the consumed one is unknown now; its index is named */
    assert_int_equal(coll_wait_any(p.c[0], (coll_request[]){mine[1], mine[0]}, 2, &idx, 0),
                     COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "request 1"));
    assert_int_equal(coll_wait_any(p.c[0], order, 0, &idx, 0), COLL_ERR_INVALID);
    assert_int_equal(coll_wait_any(p.c[0], NULL, 1, &idx, 0), COLL_ERR_INVALID);
    /* slot 1 submits the second; the wait that had nothing now has it */
    coll_request theirs2 = submit(&p, 1, 64);
    assert_int_equal(coll_wait_any(p.c[0], order, 1, &idx, 10000), COLL_OK);
    assert_int_equal(idx, 0);
    assert_int_equal(coll_wait(p.c[1], theirs, 10000), COLL_OK);
    assert_int_equal(coll_wait(p.c[1], theirs2, 10000), COLL_OK);
    pair_close(&p);
}

static void the_descriptor_turns_readable_on_completion_only(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p);
    assert_int_equal(coll_conn_fd(NULL), -1);
    int fd = coll_conn_fd(p.c[0]);
    assert_true(fd >= 0);
    assert_int_equal(coll_conn_fd(p.c[0]), fd); /* the connection's, every time */
    for (int round = 0; round < 3; round++) {
        coll_request r0 = submit(&p, 0, 0);
        /* nothing can complete before slot 1 submits: not readable */
        assert_false(readable(fd, 100));
        int done = 1;
        assert_int_equal(coll_test(p.c[0], r0, &done), COLL_OK);
        assert_int_equal(done, 0);
        coll_request r1 = submit(&p, 1, 0);
        assert_true(readable(fd, 10000));
        assert_int_equal(coll_test(p.c[0], r0, &done), COLL_OK);
        assert_int_equal(done, 1);
        for (int k = 0; k < 16; k++)
            assert_true(p.x[0][k] == 3.0f);
        /* the look cleared it: quiet until the next completion */
        assert_false(readable(fd, 0));
        assert_int_equal(coll_wait(p.c[1], r1, 10000), COLL_OK);
    }
    /* coll_wait, which may sleep on the same doorbell, leaves it quiet too */
    coll_request r0 = submit(&p, 0, 0), r1 = submit(&p, 1, 0);
    assert_int_equal(coll_wait(p.c[0], r0, 10000), COLL_OK);
    assert_int_equal(coll_wait(p.c[1], r1, 10000), COLL_OK);
    size_t idx;
    coll_request none = submit(&p, 0, 64);
    assert_int_equal(coll_wait_any(p.c[0], &none, 1, &idx, 0), COLL_ERR_TIMEOUT);
    assert_false(readable(fd, 0));
    /* the agent stops (its drain gives up on the op slot 1 never joins): readable, and
     * the op says why */
    kill(p.a.pid, SIGTERM);
    assert_true(readable(fd, 10000));
    assert_int_equal(coll_wait_any(p.c[0], &none, 1, &idx, 10000), COLL_ERR_SHUTDOWN);
    assert_int_equal(child_wait(p.a.pid, 10000), 0);
    p.a.pid = 0;
    for (int i = 0; i < 2; i++)
        coll_disconnect(&p.c[i]);
    unlink(p.a.cfg);
}

static void mem_find_names_the_buffer_and_offset(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p);
    coll_buffer *second;
    assert_int_equal(coll_mem_alloc(&second, p.c[0], 8192, COLL_DEVICE_HOST), COLL_OK);
    char *base = coll_mem_ptr(second);
    coll_buffer *b = NULL;
    size_t off = 99;
    assert_int_equal(coll_mem_find(p.c[0], base + 100, &b, &off), COLL_OK);
    assert_ptr_equal(b, second);
    assert_int_equal(off, 100);
    assert_int_equal(coll_mem_find(p.c[0], base, &b, &off), COLL_OK);
    assert_int_equal(off, 0);
    assert_int_equal(coll_mem_find(p.c[0], base + 8191, &b, &off), COLL_OK);
    assert_int_equal(off, 8191);
    assert_int_equal(coll_mem_find(p.c[0], p.x[0] + 3, &b, &off), COLL_OK);
    assert_ptr_equal(b, p.b[0]);
    assert_int_equal(off, 12);
    /* one past the end, memory of its own, another connection's buffer */
    int mine = 0;
    assert_int_equal(coll_mem_find(p.c[0], base + 8192, &b, &off), COLL_ERR_NOT_FOUND);
    assert_int_equal(coll_mem_find(p.c[0], &mine, &b, &off), COLL_ERR_NOT_FOUND);
    assert_int_equal(coll_mem_find(p.c[0], p.x[1], &b, &off), COLL_ERR_NOT_FOUND);
    assert_non_null(strstr(coll_last_error(), "no buffer of this connection holds"));
    assert_int_equal(coll_mem_find(NULL, base, &b, &off), COLL_ERR_INVALID);
    assert_int_equal(coll_mem_find(p.c[0], base, NULL, &off), COLL_ERR_INVALID);
    /* released: gone */
    assert_int_equal(coll_mem_release(&second), COLL_OK);
    assert_int_equal(coll_mem_find(p.c[0], base + 100, &b, &off), COLL_ERR_NOT_FOUND);
    pair_close(&p);
}

/* The allocation hooks of frameworks' memory pools (torch's CUDAPluggableAllocator), on
 * host memory here (device -1): a block is a coll buffer of the bound connection, an op
 * runs on it in place, the free hook waits out an op in flight before it releases the
 * block, and leaves alone what it did not hand out. */
static coll_err joined;

static void *join_later(void *arg)
{
    struct pair *p = arg;
    joined = coll_wait(p->c[1], submit(p, 1, 0), 10000);
    return NULL;
}

static void alloc_hooks_hand_out_coll_buffers(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p);
    assert_null(coll_alloc_hook(4096, COLL_DEVICE_HOST, NULL));
    assert_non_null(strstr(coll_last_error(), "no connection is bound"));
    assert_int_equal(coll_hooks_bind(p.c[0]), COLL_OK);
    assert_null(coll_alloc_hook(0, COLL_DEVICE_HOST, NULL));
    assert_non_null(strstr(coll_last_error(), "size 0"));
    float *blk = coll_alloc_hook(1 << 20, COLL_DEVICE_HOST, NULL);
    assert_non_null(blk);
    coll_buffer *b;
    size_t off;
    assert_int_equal(coll_mem_find(p.c[0], blk + 7, &b, &off), COLL_OK);
    assert_int_equal(off, 7 * sizeof(float));
    /* slot 0's allreduce on the block; the free hook waits until slot 1 joins it */
    coll_request r0;
    for (int k = 0; k < 16; k++)
        blk[k] = 1.0f;
    assert_int_equal(coll_allreduce(p.g[0], blk, blk, 16, COLL_FLOAT32, COLL_SUM, NULL, &r0),
                     COLL_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, join_later, &p), 0);
    coll_free_hook(blk, 1 << 20, COLL_DEVICE_HOST, NULL);
    pthread_join(t, NULL);
    assert_int_equal(coll_mem_find(p.c[0], blk, &b, &off), COLL_ERR_NOT_FOUND);
    assert_int_equal(coll_wait(p.c[0], r0, 10000), COLL_OK);
    assert_int_equal(joined, COLL_OK);
    assert_true(p.x[1][0] == 3.0f && p.x[1][15] == 3.0f);
    /* a buffer coll_mem_alloc made, and a pointer inside a block, are not the hooks' */
    coll_free_hook(p.x[0], 4096, COLL_DEVICE_HOST, NULL);
    assert_int_equal(coll_mem_find(p.c[0], p.x[0], &b, &off), COLL_OK);
    float *blk2 = coll_alloc_hook(4096, COLL_DEVICE_HOST, NULL);
    assert_non_null(blk2);
    coll_free_hook(blk2 + 1, 4096, COLL_DEVICE_HOST, NULL);
    assert_int_equal(coll_mem_find(p.c[0], blk2, &b, &off), COLL_OK);
    /* the connection goes: its blocks with it, and nothing is bound */
    pair_close(&p);
    assert_null(coll_alloc_hook(4096, COLL_DEVICE_HOST, NULL));
    assert_non_null(strstr(coll_last_error(), "no connection is bound"));
    coll_free_hook(blk2, 4096, COLL_DEVICE_HOST, NULL); /* ignored */
}

/* coll_redop_create_premul_sum: what it refuses, that a pair made again is the same op,
 * that a handle holds 128 pairs, that an op belongs to its handle and dtype, and the
 * sum itself between two slots of one pod with a scalar each. */
static void premultiplied_sums_are_checked_and_bounded(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p);
    coll_redop op, op2;
    float two = 2.0f, three = 3.0f;
    uint8_t yes = 1;
    assert_int_equal(coll_redop_create_premul_sum(NULL, &two, COLL_FLOAT32, &op), COLL_ERR_INVALID);
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], NULL, COLL_FLOAT32, &op),
                     COLL_ERR_INVALID);
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], &yes, COLL_BOOL, &op), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "takes no bool"));
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], &two, COLL_COMPLEX64, &op),
                     COLL_ERR_INVALID);
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], &two, (coll_dtype)99, &op),
                     COLL_ERR_INVALID);
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], &two, COLL_FLOAT32, &op), COLL_OK);
    assert_true(op >= COLL_PREMUL_SUM_FIRST);
    assert_string_equal(coll_redop_name(op), "premul_sum");
    assert_int_equal(coll_redop_create_premul_sum(p.g[1], &three, COLL_FLOAT32, &op2), COLL_OK);
    /* slot 0 times 2, slot 1 times 3 */
    for (int k = 0; k < 16; k++) {
        p.x[0][k] = (float)k;
        p.x[1][k] = (float)(k + 1);
    }
    coll_request r0, r1;
    assert_int_equal(coll_allreduce(p.g[0], p.x[0], p.x[0] + 16, 16, COLL_FLOAT32, op, NULL, &r0),
                     COLL_OK);
    assert_int_equal(coll_allreduce(p.g[1], p.x[1], p.x[1] + 16, 16, COLL_FLOAT32, op2, NULL, &r1),
                     COLL_OK);
    assert_int_equal(coll_wait(p.c[0], r0, 10000), COLL_OK);
    assert_int_equal(coll_wait(p.c[1], r1, 10000), COLL_OK);
    for (int k = 0; k < 16; k++) {
        assert_true(p.x[0][16 + k] == 2.0f * k + 3.0f * (k + 1));
        assert_true(p.x[1][16 + k] == p.x[0][16 + k]);
    }
    /* an op of another dtype, or of another handle, is refused before it is sent */
    assert_int_equal(coll_allreduce(p.g[0], p.x[0], p.x[0] + 16, 4, COLL_INT32, op, NULL, &r0),
                     COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "was made for float32"));
    coll_redop op3;
    int32_t i5 = 5;
    assert_int_equal(coll_redop_create_premul_sum(p.g[1], &i5, COLL_INT32, &op3), COLL_OK);
    assert_int_equal(coll_allreduce(p.g[0], p.x[0], p.x[0] + 16, 4, COLL_INT32, op3, NULL, &r0),
                     COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "no premultiplied sum of this group handle"));
    /* a slot never made on this handle is refused */
    assert_int_equal(coll_allreduce(p.g[0], p.x[0], p.x[0] + 16, 4, COLL_FLOAT32,
                                    (coll_redop)(COLL_PREMUL_SUM_FIRST + 127), NULL, &r0),
                     COLL_ERR_INVALID);
    /* 128 pairs a handle; the 129th is refused, a pair already made is not */
    for (int k = 1; k < 128; k++) {
        float v = (float)k + 0.5f;
        assert_int_equal(coll_redop_create_premul_sum(p.g[0], &v, COLL_FLOAT32, &op3), COLL_OK);
    }
    float more = -1.0f;
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], &more, COLL_FLOAT32, &op3),
                     COLL_ERR_LIMIT);
    assert_non_null(strstr(coll_last_error(), "holds 128 premultiplied sums"));
    assert_int_equal(coll_redop_destroy(p.g[0], op), COLL_OK);
    assert_int_equal(coll_redop_destroy(p.g[0], op), COLL_ERR_INVALID);
    assert_int_equal(coll_redop_create_premul_sum(p.g[0], &two, COLL_FLOAT32, &op3), COLL_OK);
    assert_int_equal(op3, op);
    assert_int_equal(coll_redop_destroy(p.g[0], COLL_SUM), COLL_ERR_INVALID);
    pair_close(&p);
}

static void a_handle_s_op_timeout_is_its_own(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(agent_start(&a, NULL,
                                 "groups:\n  - name: g\n    local_slots: 2\n"
                                 "    timeouts: {op_ms: 60000}\n"),
                     0);
    coll_conn *c;
    coll_group *g = NULL;
    assert_int_equal(coll_connect(&c, a.sock, 5000), COLL_OK);
    coll_group_opts o = COLL_GROUP_OPTS_INIT;
    /* refused before anything is sent: a size no header had, timeouts out of range */
    o.size = 0;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "coll_group_opts.size 0"));
    o = (coll_group_opts)COLL_GROUP_OPTS_INIT;
    o.op_timeout_ms = -1;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_INVALID);
    o.op_timeout_ms = 86400001;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_INVALID);
    assert_int_equal(coll_group_open_opts(&g, c, "g", NULL), COLL_ERR_INVALID);
    assert_null(g);
    /* an older header's struct (no op_timeout_ms): its fields read, the rest defaults */
    o = (coll_group_opts)COLL_GROUP_OPTS_INIT;
    o.size = offsetof(coll_group_opts, op_timeout_ms);
    o.slot = 1;
    o.op_timeout_ms = 5; /* beyond its size: never read */
    coll_group *g1;
    assert_int_equal(coll_group_open_opts(&g1, c, "g", &o), COLL_OK);
    coll_group_info info;
    coll_group_info_get(g1, &info);
    assert_int_equal(info.local_slot, 1);
    /* slot 0 with 300 ms: its op, which slot 1 never joins, fails then, not in 60 s */
    o = (coll_group_opts)COLL_GROUP_OPTS_INIT;
    o.op_timeout_ms = 300;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_OK);
    coll_request r;
    assert_int_equal(coll_barrier(g, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 30000), COLL_ERR_TIMEOUT);
    assert_non_null(strstr(coll_last_error(), "waited 300 ms for 1 of 2 participants"));
    coll_group_close(&g);
    coll_group_close(&g1);
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
}

/* a framework's rank names the slot (torch's RANK): on pod 1 of 2 with 2 slots, ranks 2
 * and 3 are here, the others refused by name */
static void a_rank_names_its_slot(void **state)
{
    (void)state;
    struct agent a;
    char body[512];
    snprintf(body, sizeof(body),
             "node:\n  index: 1\n  name: pod-1\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: g\n    backend: host\n    members: 2\n    local_slots: 2\n",
             free_port());
    assert_int_equal(agent_start(&a, NULL, body), 0);
    coll_conn *c;
    coll_group *g3 = NULL, *g2 = NULL, *g = NULL;
    assert_int_equal(coll_connect(&c, a.sock, 5000), COLL_OK);
    coll_group_opts o = COLL_GROUP_OPTS_INIT;
    o.rank = 3;
    assert_int_equal(coll_group_open_opts(&g3, c, "g", &o), COLL_OK);
    coll_group_info info;
    coll_group_info_get(g3, &info);
    assert_int_equal(info.rank, 3);
    assert_int_equal(info.local_slot, 1);
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_BUSY);
    o.rank = 0;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_NOT_FOUND);
    assert_non_null(strstr(coll_last_error(), "rank 0 of group 'g' is another pod's"));
    assert_non_null(strstr(coll_last_error(), "holds ranks 2..3"));
    o.rank = 4;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "has ranks 0..3"));
    o.rank = -2;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_INVALID);
    o.rank = 2;
    o.slot = 0;
    assert_int_equal(coll_group_open_opts(&g, c, "g", &o), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "name one of the two"));
    assert_null(g);
    o.slot = COLL_SLOT_ANY;
    assert_int_equal(coll_group_open_opts(&g2, c, "g", &o), COLL_OK);
    coll_group_info_get(g2, &info);
    assert_int_equal(info.rank, 2);
    assert_int_equal(info.local_slot, 0);
    coll_group_close(&g2);
    coll_group_close(&g3);
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
}

/* the new dtypes and bitwise reductions through a real agent, and what is refused */
static void bitwise_reductions_and_small_types(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p);
    coll_request r[2];
    /* int16 bxor, uint16 band, bool bor (and sum: an or) */
    int16_t *a = (int16_t *)(void *)p.x[0], *b = (int16_t *)(void *)p.x[1];
    a[0] = 0x0f0f, b[0] = 0x00ff;
    for (int i = 0; i < 2; i++)
        assert_int_equal(coll_allreduce(p.g[i], (int16_t *)(void *)p.x[i],
                                        (int16_t *)(void *)p.x[i] + 8, 1, COLL_INT16, COLL_BXOR,
                                        NULL, &r[i]),
                         COLL_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(coll_wait(p.c[i], r[i], 10000), COLL_OK);
    assert_int_equal(a[8], 0x0ff0);
    assert_int_equal(b[8], 0x0ff0);
    uint16_t *ua = (uint16_t *)(void *)p.x[0], *ub = (uint16_t *)(void *)p.x[1];
    ua[0] = 0xfff0, ub[0] = 0x0fff;
    for (int i = 0; i < 2; i++)
        assert_int_equal(coll_allreduce(p.g[i], (uint16_t *)(void *)p.x[i],
                                        (uint16_t *)(void *)p.x[i] + 8, 1, COLL_UINT16, COLL_BAND,
                                        NULL, &r[i]),
                         COLL_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(coll_wait(p.c[i], r[i], 10000), COLL_OK);
    assert_int_equal(ua[8], 0x0ff0);
    uint8_t *ba = (uint8_t *)(void *)p.x[0], *bb = (uint8_t *)(void *)p.x[1];
    const uint8_t in_a[4] = {0, 1, 0, 7}, in_b[4] = {0, 0, 1, 1}; /* 7 reads as true */
    const int ops[3] = {COLL_SUM, COLL_PROD, COLL_BXOR};
    const uint8_t want[3][4] = {{0, 1, 1, 1}, {0, 0, 0, 1}, {0, 1, 1, 0}};
    for (int k = 0; k < 3; k++) {
        memcpy(ba, in_a, 4);
        memcpy(bb, in_b, 4);
        for (int i = 0; i < 2; i++)
            assert_int_equal(coll_allreduce(p.g[i], (uint8_t *)(void *)p.x[i],
                                            (uint8_t *)(void *)p.x[i] + 16, 4, COLL_BOOL,
                                            (coll_redop)ops[k], NULL, &r[i]),
                             COLL_OK);
        for (int i = 0; i < 2; i++)
            assert_int_equal(coll_wait(p.c[i], r[i], 10000), COLL_OK);
        assert_memory_equal(ba + 16, want[k], 4);
        assert_memory_equal(bb + 16, want[k], 4);
    }
    /* refused at submission, with what and why */
    assert_int_equal(
        coll_allreduce(p.g[0], p.x[0], p.x[0] + 8, 1, COLL_FLOAT32, COLL_BAND, NULL, &r[0]),
        COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "reduction band of float32"));
    assert_int_equal(
        coll_allreduce(p.g[0], p.x[0], p.x[0] + 8, 1, COLL_BOOL, COLL_AVG, NULL, &r[0]),
        COLL_ERR_INVALID);
    assert_int_equal(
        coll_allreduce(p.g[0], p.x[0], p.x[0] + 8, 1, COLL_COMPLEX64, COLL_MAX, NULL, &r[0]),
        COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "reduction max of complex64"));
    assert_non_null(strstr(coll_last_error(), "complex numbers no min or max"));
    assert_string_equal(coll_dtype_name(COLL_FLOAT8_E4M3), "float8_e4m3");
    assert_int_equal(coll_dtype_size(COLL_COMPLEX128), 16);
    assert_string_equal(coll_dtype_name(COLL_BOOL), "bool");
    assert_string_equal(coll_redop_name(COLL_BXOR), "bxor");
    assert_int_equal(coll_dtype_size(COLL_UINT16), 2);
    pair_close(&p);
}

/* rank 0 sends tag 1 then tag 2 (and a small tag 3 last); rank 1 receives 3, 2, then 1:
 * each receive gets its own tag's message, whatever the order (c[i], g[i], x[i]: rank i) */
static void tags_pair(coll_conn **c, coll_group **g, float **x)
{
    coll_request s[3], r[3];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 16; i++)
            x[0][64 * k + i] = (float)(k + 1);
    for (int k = 0; k < 3; k++)
        assert_int_equal(
            coll_send_tag(g[0], x[0] + 64 * k, 16, COLL_FLOAT32, 1, k + 1, NULL, &s[k]), COLL_OK);
    for (int k = 2; k >= 0; k--)
        assert_int_equal(
            coll_recv_tag(g[1], x[1] + 64 * k, 16, COLL_FLOAT32, 0, k + 1, NULL, &r[k]), COLL_OK);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(coll_wait(c[1], r[k], 20000), COLL_OK);
        assert_int_equal(coll_wait(c[0], s[k], 20000), COLL_OK);
        for (int i = 0; i < 16; i++)
            assert_true(x[1][64 * k + i] == (float)(k + 1));
    }
    /* a count that differs is still named, tag and all */
    assert_int_equal(coll_send_tag(g[0], x[0], 16, COLL_FLOAT32, 1, 7, NULL, &s[0]), COLL_OK);
    assert_int_equal(coll_recv_tag(g[1], x[1], 8, COLL_FLOAT32, 0, 7, NULL, &r[0]), COLL_OK);
    assert_int_equal(coll_wait(c[1], r[0], 20000), COLL_ERR_MISMATCH);
    assert_int_equal(coll_wait(c[0], s[0], 20000), COLL_ERR_MISMATCH);
    assert_int_equal(coll_send_tag(g[0], x[0], 1, COLL_FLOAT32, 1, -1, NULL, &s[0]),
                     COLL_ERR_INVALID);
}

/* Receives from any rank, rank 1 receiving what rank 0 sends (c[i], g[i], x[i]: rank i):
 * each says who sent; they meet sends in the order both were posted, a named receive
 * included; a count that disagrees fails both; bad tags are refused. */
static void any_pair(coll_conn **c, coll_group **g, float **x)
{
    coll_request s[3], r[3];
    int src[3] = {-7, -7, -7};
    for (int k = 0; k < 3; k++)
        x[0][64 * k] = (float)(10 + k);
    /* two from any rank (the second without a source), then one naming rank 0: the sends
     * go in that order */
    assert_int_equal(coll_recv_any(g[1], x[1], 1, COLL_FLOAT32, 4, &src[0], NULL, &r[0]), COLL_OK);
    assert_int_equal(coll_recv_any(g[1], x[1] + 64, 1, COLL_FLOAT32, 4, NULL, NULL, &r[1]),
                     COLL_OK);
    assert_int_equal(coll_recv_tag(g[1], x[1] + 128, 1, COLL_FLOAT32, 0, 4, NULL, &r[2]), COLL_OK);
    for (int k = 0; k < 3; k++)
        assert_int_equal(coll_send_tag(g[0], x[0] + 64 * k, 1, COLL_FLOAT32, 1, 4, NULL, &s[k]),
                         COLL_OK);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(coll_wait(c[1], r[k], 20000), COLL_OK);
        assert_int_equal(coll_wait(c[0], s[k], 20000), COLL_OK);
        assert_true(x[1][64 * k] == (float)(10 + k));
    }
    assert_int_equal(src[0], 0);
    /* a send that came first (kept until a receive takes it), and a large one */
    enum { BIG = 300000 }; /* 1.2 MB: over the early-message limit between pods */
    assert_int_equal(coll_send_tag(g[0], x[0], 1, COLL_FLOAT32, 1, 5, NULL, &s[0]), COLL_OK);
    usleep(20 * 1000);
    assert_int_equal(coll_recv_any(g[1], x[1], 1, COLL_FLOAT32, 5, &src[1], NULL, &r[0]), COLL_OK);
    assert_int_equal(coll_wait(c[1], r[0], 20000), COLL_OK);
    assert_int_equal(coll_wait(c[0], s[0], 20000), COLL_OK);
    assert_int_equal(src[1], 0);
    for (int i = 0; i < BIG; i++)
        x[0][i] = (float)(i % 1021);
    assert_int_equal(coll_recv_any(g[1], x[1], BIG, COLL_FLOAT32, 6, &src[2], NULL, &r[0]),
                     COLL_OK);
    assert_int_equal(coll_send_tag(g[0], x[0], BIG, COLL_FLOAT32, 1, 6, NULL, &s[0]), COLL_OK);
    assert_int_equal(coll_wait(c[1], r[0], 20000), COLL_OK);
    assert_int_equal(coll_wait(c[0], s[0], 20000), COLL_OK);
    assert_int_equal(src[2], 0);
    for (int i = 0; i < BIG; i++)
        if (x[1][i] != (float)(i % 1021)) fail_msg("element %d: %g", i, (double)x[1][i]);
    /* a count that disagrees: both fail, and the source is left alone */
    src[0] = -7;
    assert_int_equal(coll_recv_any(g[1], x[1], 8, COLL_FLOAT32, 7, &src[0], NULL, &r[0]), COLL_OK);
    assert_int_equal(coll_send_tag(g[0], x[0], 16, COLL_FLOAT32, 1, 7, NULL, &s[0]), COLL_OK);
    assert_int_equal(coll_wait(c[1], r[0], 20000), COLL_ERR_MISMATCH);
    assert_int_equal(coll_wait(c[0], s[0], 20000), COLL_ERR_MISMATCH);
    assert_int_equal(src[0], -7);
    assert_int_equal(coll_recv_any(g[1], x[1], 1, COLL_FLOAT32, -1, &src[0], NULL, &r[0]),
                     COLL_ERR_INVALID);
    assert_int_equal(
        coll_recv_any(g[1], x[1], 1, COLL_FLOAT32, COLL_TAG_MAX + 1, NULL, NULL, &r[0]),
        COLL_ERR_INVALID);
    assert_int_equal(coll_recv_tag(g[1], x[1], 1, COLL_FLOAT32, -2, 0, NULL, &r[0]),
                     COLL_ERR_INVALID);
}

static void receives_from_any_rank(void **state)
{
    (void)state;
    struct pair p;
    pair_open(&p); /* two slots of one pod: the agent pairs them */
    any_pair(p.c, p.g, p.x);
    /* a rank's send to itself and one from the other rank, to two receives from any rank */
    coll_request s[2], r[2];
    int src[2] = {-1, -1};
    p.x[0][0] = 3.0f;
    p.x[1][0] = 4.0f;
    assert_int_equal(coll_recv_any(p.g[0], p.x[0] + 8, 1, COLL_FLOAT32, 0, &src[0], NULL, &r[0]),
                     COLL_OK);
    assert_int_equal(coll_recv_any(p.g[0], p.x[0] + 9, 1, COLL_FLOAT32, 0, &src[1], NULL, &r[1]),
                     COLL_OK);
    assert_int_equal(coll_send(p.g[1], p.x[1], 1, COLL_FLOAT32, 0, NULL, &s[1]), COLL_OK);
    assert_int_equal(coll_send(p.g[0], p.x[0], 1, COLL_FLOAT32, 0, NULL, &s[0]), COLL_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(coll_wait(p.c[0], r[i], 20000), COLL_OK);
        assert_int_equal(coll_wait(p.c[i], s[i], 20000), COLL_OK);
    }
    /* the two sessions' sends reach the agent in either order: each receive says which */
    assert_true(src[0] + src[1] == 1 && (src[0] == 0 || src[0] == 1));
    for (int i = 0; i < 2; i++)
        assert_true(p.x[0][8 + i] == (src[i] ? 4.0f : 3.0f));
    pair_close(&p);
    /* one with no sender fails with TIMEOUT at its handle's op timeout, which ends the
     * epoch as a lone named receive does */
    pair_open(&p);
    coll_group *gt;
    coll_group_opts o = {
        .size = sizeof(o), .slot = COLL_SLOT_ANY, .op_timeout_ms = 300, .rank = COLL_RANK_ANY};
    coll_group_close(&p.g[0]);
    assert_int_equal(coll_group_open_opts(&gt, p.c[0], "g", &o), COLL_OK);
    assert_int_equal(coll_recv_any(gt, p.x[0], 1, COLL_FLOAT32, 0, NULL, NULL, &r[0]), COLL_OK);
    assert_int_equal(coll_wait(p.c[0], r[0], 20000), COLL_ERR_TIMEOUT);
    assert_non_null(strstr(coll_last_error(), "receive from any rank on rank"));
    coll_group_close(&gt);
    pair_close(&p);
}

static void sends_and_receives_pair_by_tag(void **state)
{
    (void)state;
    /* two slots of one pod (the agent pairs them) */
    struct pair p;
    pair_open(&p);
    tags_pair(p.c, p.g, p.x);
    pair_close(&p);
    /* two pods (the net thread pairs them, tags in the frames and the acks) */
    struct agent a[2];
    int port = free_port();
    coll_conn *c[2];
    coll_group *g[2];
    float *x[2];
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: host\n    members: 2\n"
                 "    timeouts: {op_ms: 20000, heartbeat_ms: %d, join_ms: 5000}\n",
                 i, i, port, TEST_HB_MS);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    for (int i = 0; i < 2; i++) {
        coll_buffer *b;
        assert_int_equal(coll_connect(&c[i], a[i].sock, 5000), COLL_OK);
        assert_int_equal(coll_group_open(&g[i], c[i], "g", 0), COLL_OK);
        assert_int_equal(coll_mem_alloc(&b, c[i], 2 << 20, COLL_DEVICE_HOST), COLL_OK);
        x[i] = coll_mem_ptr(b);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(coll_group_wait(g[i], 10000), COLL_OK);
    tags_pair(c, g, x);
    any_pair(c, g, x); /* the net thread pairs them */
    for (int i = 0; i < 2; i++)
        coll_disconnect(&c[i]);
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
}

/* libcoll/abi.txt, what bindings mirror, against this header: every line holds, and
 * every fact the test knows is listed there (a new field or value gets its line) */
#define SZ(T)                                                                                      \
    {                                                                                              \
        "sizeof " #T, (long)sizeof(T)                                                              \
    }
#define OFF(T, F)                                                                                  \
    {                                                                                              \
        "offsetof " #T " " #F, (long)offsetof(T, F)                                                \
    }
#define VAL(V)                                                                                     \
    {                                                                                              \
        "value " #V, (long)(V)                                                                     \
    }
static void the_layout_bindings_mirror_holds(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        long v;
    } facts[] = {SZ(coll_request),
                 OFF(coll_request, id),
                 SZ(coll_group_info),
                 OFF(coll_group_info, rank),
                 OFF(coll_group_info, size),
                 OFF(coll_group_info, local_slot),
                 OFF(coll_group_info, local_slots),
                 OFF(coll_group_info, node_index),
                 OFF(coll_group_info, nodes),
                 OFF(coll_group_info, epoch),
                 OFF(coll_group_info, backend),
                 OFF(coll_group_info, name),
                 SZ(coll_group_opts),
                 OFF(coll_group_opts, size),
                 OFF(coll_group_opts, slot),
                 OFF(coll_group_opts, op_timeout_ms),
                 OFF(coll_group_opts, rank),
                 VAL(COLL_SLOT_ANY),
                 VAL(COLL_SPLIT_NOCOLOR),
                 VAL(COLL_RANK_ANY),
                 VAL(COLL_TAG_MAX),
                 VAL(COLL_ANY_SOURCE),
                 VAL(COLL_DEVICE_HOST),
                 VAL(COLL_INT8),
                 VAL(COLL_UINT8),
                 VAL(COLL_INT32),
                 VAL(COLL_UINT32),
                 VAL(COLL_INT64),
                 VAL(COLL_UINT64),
                 VAL(COLL_FLOAT16),
                 VAL(COLL_BFLOAT16),
                 VAL(COLL_FLOAT32),
                 VAL(COLL_FLOAT64),
                 VAL(COLL_INT16),
                 VAL(COLL_UINT16),
                 VAL(COLL_BOOL),
                 VAL(COLL_FLOAT8_E4M3),
                 VAL(COLL_FLOAT8_E5M2),
                 VAL(COLL_COMPLEX64),
                 VAL(COLL_COMPLEX128),
                 VAL(COLL_SUM),
                 VAL(COLL_PROD),
                 VAL(COLL_MIN),
                 VAL(COLL_MAX),
                 VAL(COLL_AVG),
                 VAL(COLL_BAND),
                 VAL(COLL_BOR),
                 VAL(COLL_BXOR),
                 VAL(COLL_PREMUL_SUM_FIRST),
                 VAL(COLL_OK),
                 VAL(COLL_ERR_INVALID),
                 VAL(COLL_ERR_NOMEM),
                 VAL(COLL_ERR_SYSTEM),
                 VAL(COLL_ERR_CONNECT),
                 VAL(COLL_ERR_PROTOCOL),
                 VAL(COLL_ERR_DENIED),
                 VAL(COLL_ERR_NOT_FOUND),
                 VAL(COLL_ERR_BUSY),
                 VAL(COLL_ERR_TIMEOUT),
                 VAL(COLL_ERR_MISMATCH),
                 VAL(COLL_ERR_PEER_LOST),
                 VAL(COLL_ERR_EPOCH),
                 VAL(COLL_ERR_AGENT_LOST),
                 VAL(COLL_ERR_SHUTDOWN),
                 VAL(COLL_ERR_UNSUPPORTED),
                 VAL(COLL_ERR_LIMIT),
                 VAL(COLL_ERR_INTERNAL)};
    enum { NFACTS = sizeof(facts) / sizeof(facts[0]) };
    int seen[NFACTS] = {0};
    FILE *f = fopen(COLL_SOURCE_DIR "/libcoll/abi.txt", "r");
    assert_non_null(f);
    char line[256];
    int lineno = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        line[strcspn(line, "\n")] = '\0';
        if (!line[0] || line[0] == '#') continue;
        char *sp = strrchr(line, ' ');
        assert_non_null(sp);
        *sp = '\0';
        long want = strtol(sp + 1, NULL, 10);
        int k = 0;
        while (k < NFACTS && strcmp(facts[k].what, line) != 0)
            k++;
        if (k == NFACTS) fail_msg("abi.txt:%d: %s: not a fact this test knows", lineno, line);
        if (facts[k].v != want)
            fail_msg("abi.txt:%d: %s is %ld in coll.h, %ld in abi.txt", lineno, line, facts[k].v,
                     want);
        seen[k] = 1;
    }
    fclose(f);
    for (int k = 0; k < NFACTS; k++)
        if (!seen[k]) fail_msg("abi.txt does not list %s", facts[k].what);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wait_any_returns_the_one_that_completed),
        cmocka_unit_test(the_descriptor_turns_readable_on_completion_only),
        cmocka_unit_test(mem_find_names_the_buffer_and_offset),
        cmocka_unit_test(alloc_hooks_hand_out_coll_buffers),
        cmocka_unit_test(premultiplied_sums_are_checked_and_bounded),
        cmocka_unit_test(a_handle_s_op_timeout_is_its_own),
        cmocka_unit_test(a_rank_names_its_slot),
        cmocka_unit_test(bitwise_reductions_and_small_types),
        cmocka_unit_test(sends_and_receives_pair_by_tag),
        cmocka_unit_test(receives_from_any_rank),
        cmocka_unit_test(the_layout_bindings_mirror_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
