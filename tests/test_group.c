/*
 * test_group.c: group set-up and tear-down under a failing allocator. calloc and free
 * of the agent's core are wrapped at link time (-Wl,--wrap): the n-th calloc fails, and
 * every block handed out must be back once group_fini has run, whichever step failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "group.h"
#include "harness.h"

void *__real_calloc(size_t n, size_t size);
void __real_free(void *p);

static int fail_at = -1; /* the calloc that fails, counting from 0; -1: none */
static int calls;
static void *live[256];
static int nlive;

void *__wrap_calloc(size_t n, size_t size)
{
    if (calls++ == fail_at) return NULL;
    void *p = __real_calloc(n, size);
    if (p && nlive < (int)(sizeof(live) / sizeof(live[0]))) live[nlive++] = p;
    return p;
}

void __wrap_free(void *p)
{
    for (int i = 0; p && i < nlive; i++)
        if (live[i] == p) {
            live[i] = live[--nlive];
            break;
        }
    __real_free(p);
}

static void complete_nothing(struct op *op, int status, const char *why)
{
    (void)op;
    (void)status;
    (void)why;
}

static const struct group_up up_nothing = {.complete = complete_nothing};

/* The first test reads as the happy path: a group of two pods, two local slots. */
static void group_sets_up_and_tears_down(void **state)
{
    (void)state;
    struct group_config gc = {.name = "g",
                              .backend = CONFIG_BACKEND_HOST,
                              .members = 2,
                              .local_slots = 2,
                              .op_timeout_ms = 1000};
    struct group g;
    nlive = 0;
    calls = 0;
    fail_at = -1;
    assert_int_equal(group_init(&g, &gc, 1, &up_nothing), 0);
    assert_int_equal(g.size, 4);
    assert_int_equal(group_attach(&g, NULL, 1), 1);
    assert_true(nlive > 0);
    group_fini(&g);
    assert_int_equal(nlive, 0);
    group_fini(&g); /* a finished group is zeroed: a second fini is a no-op */
}

/* Found on c65a60e: a group_init that failed part way leaked what it had allocated. */
static void every_allocation_failure_is_clean(void **state)
{
    (void)state;
    for (int members = 1; members <= 2; members++) {
        struct group_config gc = {.name = "g",
                                  .backend = CONFIG_BACKEND_HOST,
                                  .members = members,
                                  .local_slots = 3,
                                  .op_timeout_ms = 1000};
        /* how many callocs a full set-up makes */
        struct group g;
        calls = 0;
        fail_at = -1;
        nlive = 0;
        assert_int_equal(group_init(&g, &gc, 0, &up_nothing), 0);
        int total = calls;
        group_fini(&g);
        assert_true(total >= 4);
        for (int k = 0; k < total; k++) {
            calls = 0;
            nlive = 0;
            fail_at = k;
            assert_int_equal(group_init(&g, &gc, 0, &up_nothing), -1);
            assert_string_equal(g.backend_why, "out of memory");
            assert_int_equal(group_attach(&g, NULL, 0), -COLL_ERR_UNSUPPORTED);
            group_fini(&g);
            if (nlive != 0)
                fail_msg("members=%d, calloc %d failing: %d blocks leaked", members, k, nlive);
        }
    }
    fail_at = -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(group_sets_up_and_tears_down),
        cmocka_unit_test(every_allocation_failure_is_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
