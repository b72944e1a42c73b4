/*
 * test_reduce.c: the host backend's kernels for every dtype and reduction, and the
 * float16 / bfloat16 conversions against an independent reference.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "coll/coll.h"
#include "harness.h"
#include "wire.h"
#include "reduce.h"
#include "values.h"

/* Reference half -> float by the definition: (-1)^s * 2^(e-15) * 1.m, or subnormal. */
static double half_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void half_conversions_match_the_definition(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = half_ref((uint16_t)h);
        float got = reduce_half_to_float((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(got));
            continue;
        }
        assert_true((double)got == want);
        /* and back: every non-NaN half survives the round trip */
        assert_int_equal(reduce_float_to_half(got), h);
    }
    /* rounding: halfway cases go to even, overflow goes to infinity */
    assert_int_equal(reduce_float_to_half(1.0f + 1.0f / 2048), 0x3c00); /* tie, even */
    assert_int_equal(reduce_float_to_half(1.0f + 3.0f / 2048), 0x3c02); /* tie, up */
    assert_int_equal(reduce_float_to_half(65520.0f), 0x7c00);
    assert_int_equal(reduce_float_to_half(65519.0f), 0x7bff);
    assert_int_equal(reduce_float_to_half(ldexpf(1, -25)), 0x0000); /* tie to zero */
    assert_int_equal(reduce_float_to_half(ldexpf(3, -26)), 0x0001);
}

static void bf16_conversions_round_to_nearest_even(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = reduce_bf16_to_float((uint16_t)b);
        if (isnan(f)) continue;
        assert_int_equal(reduce_float_to_bf16(f), b);
    }
    assert_int_equal(reduce_float_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie, even */
    assert_int_equal(reduce_float_to_bf16(1.0f + 3.0f / 256), 0x3f82); /* tie, up */
    assert_true(isnan(reduce_bf16_to_float(reduce_float_to_bf16(NAN))));
}

static void every_kernel_matches_a_scalar_reference(void **state)
{
    (void)state;
    enum { N = 1031, SRC = 5 };
    static uint64_t bufs[SRC][N], dst[N];
    for (int dt = 0; dt < COLL_DTYPE_COUNT; dt++) {
        for (int op = 0; op < COLL_REDOP_COUNT; op++) {
            int floating = !val_is_int(dt) && dt != COLL_BOOL;
            if ((op >= COLL_BAND && floating) || (dt == COLL_BOOL && op == COLL_AVG))
                continue; /* never asked for (wire_redop_fits) */
            for (int nsrc = 1; nsrc <= SRC; nsrc++) {
                const void *srcs[SRC];
                for (int k = 0; k < nsrc; k++) {
                    for (size_t i = 0; i < N; i++)
                        val_put(bufs[k], i, dt,
                                op == COLL_PROD ? 1 + (double)((i + (size_t)k) % 2)
                                                : (double)((i * 7 + (size_t)k * 3) % 9));
                    srcs[k] = bufs[k];
                }
                reduce_n(dt, op, dst, srcs, nsrc, N, (uint32_t)nsrc);
                for (size_t i = 0; i < N; i++) {
                    double acc = val_get(srcs[0], i, dt);
                    for (int k = 1; k < nsrc; k++)
                        acc = val_fold(dt, op, acc, val_get(srcs[k], i, dt));
                    if (op == COLL_AVG)
                        acc = val_is_int(dt) ? (double)((long long)acc / nsrc) : acc / nsrc;
                    double got = val_get(dst, i, dt),
                           tol = dt == COLL_FLOAT16 || dt == COLL_BFLOAT16 ? 8e-3 * fabs(acc)
                                                                           : 1e-6 * fabs(acc);
                    if (fabs(got - acc) > tol)
                        fail_msg("dtype %s op %s nsrc %d i %zu: got %g want %g",
                                 coll_dtype_name(dt), coll_redop_name(op), nsrc, i, got, acc);
                }
            }
        }
    }
}

/* The two pods of a pair fold the same two operands each with its own first: min and max
 * of floats must not depend on that order (-0 and +0, NaNs), or the pods' results differ;
 * and they are C's fmin and fmax otherwise. Every pair of special values, both ways,
 * every floating dtype. */
static void float_min_and_max_ignore_the_order_of_operands(void **state)
{
    (void)state;
    static const uint64_t f64[] = {0,
                                   0x8000000000000000u,
                                   0x7ff8000000000000u,
                                   0xfff8000000000000u,
                                   0x7ff8000000000123u,
                                   0x7ff0000000000000u,
                                   0xfff0000000000000u,
                                   0x3ff0000000000000u,
                                   0xc004000000000000u,
                                   1};
    static const uint64_t f32[] = {0,          0x80000000, 0x7fc00000, 0xffc00000, 0x7fc00123,
                                   0x7f800000, 0xff800000, 0x3f800000, 0xc0200000, 1};
    static const uint64_t f16[] = {0,      0x8000, 0x7e00, 0xfe00, 0x7e01,
                                   0x7c00, 0xfc00, 0x3c00, 0xc100, 1};
    static const uint64_t b16[] = {0,      0x8000, 0x7fc0, 0xffc0, 0x7fc1,
                                   0x7f80, 0xff80, 0x3f80, 0xc020, 1};
    enum { K = 10, NP = K * K };
    const struct {
        int dt;
        const uint64_t *v;
    } cases[] = {
        {COLL_FLOAT64, f64}, {COLL_FLOAT32, f32}, {COLL_FLOAT16, f16}, {COLL_BFLOAT16, b16}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int dt = cases[c].dt;
        size_t es = coll_dtype_size((coll_dtype)dt);
        unsigned char a[NP * 8], b[NP * 8], ab[NP * 8], ba[NP * 8];
        for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) { /* little-endian: the low es bytes */
                memcpy(a + (size_t)(i * K + j) * es, &cases[c].v[i], es);
                memcpy(b + (size_t)(i * K + j) * es, &cases[c].v[j], es);
            }
        for (int op = COLL_MIN; op <= COLL_MAX; op++) {
            const void *s1[2] = {a, b}, *s2[2] = {b, a};
            reduce_n(dt, op, ab, s1, 2, NP, 2);
            reduce_n(dt, op, ba, s2, 2, NP, 2);
            for (int k = 0; k < NP; k++) {
                if (memcmp(ab + (size_t)k * es, ba + (size_t)k * es, es) != 0)
                    fail_msg("dtype %s op %s pair %d,%d: the result depends on the order",
                             coll_dtype_name(dt), coll_redop_name(op), k / K, k % K);
                double x = val_get(a, (size_t)k, dt), y = val_get(b, (size_t)k, dt),
                       got = val_get(ab, (size_t)k, dt);
                if (isnan(x) && isnan(y)) {
                    assert_true(isnan(got));
                } else if (isnan(x) || isnan(y)) { /* a NaN gives way to a number, as fmin */
                    assert_true(got == (isnan(x) ? y : x));
                } else if (x == y && x == 0) { /* -0 for min, +0 for max, if either is */
                    int neg = op == COLL_MIN ? signbit(x) || signbit(y) : signbit(x) && signbit(y);
                    assert_true(got == 0 && !signbit(got) == !neg);
                } else {
                    assert_true(got == (op == COLL_MIN ? fmin(x, y) : fmax(x, y)));
                }
            }
        }
    }
}

static void destination_may_be_the_first_source(void **state)
{
    (void)state;
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    const void *srcs[2] = {a, b};
    reduce_n(COLL_FLOAT32, COLL_MAX, a, srcs, 2, 8, 2);
    for (int i = 0; i < 8; i++)
        assert_true(a[i] == (i < 4 ? 8 - i : i + 1));
}

/* The host backend's all-to-all (one pod) for every mix of ranks in place and out of
 * place, blocks larger than its scratch chunk among them: found at 242e584, an in-place
 * rank's whole buffer was copied into a malloc'd snapshot on the engine thread; now
 * pairs of blocks trade places, and the result must be the same in every mix. */
static void host_alltoall_in_every_mix_of_in_place_ranks(void **state)
{
    (void)state;
    static const uint64_t counts[] = {1, 3, HOST_SCRATCH_BYTES / 4 + 5};
    for (int n = 1; n <= 5; n++)
        for (size_t ci = 0; ci < 3; ci++)
            for (unsigned mask = 0; mask < (1u << n); mask++) {
                uint64_t count = counts[ci];
                size_t len = (size_t)n * count;
                int32_t *in[5], *out[5];
                void *send[5], *recv[5];
                for (int r = 0; r < n; r++) {
                    in[r] = malloc(len * 4);
                    out[r] = (mask >> r) & 1 ? in[r] : malloc(len * 4);
                    assert_non_null(in[r]);
                    assert_non_null(out[r]);
                    for (size_t i = 0; i < len; i++)
                        in[r][i] = (int32_t)(r * 1000003 + (int)i);
                    send[r] = in[r];
                    recv[r] = out[r];
                }
                static uint64_t scratch[HOST_SCRATCH_BYTES / 8];
                struct backend_task t = {.kind = WIRE_OP_ALLTOALL,
                                         .dtype = COLL_INT32,
                                         .count = count,
                                         .nranks = n,
                                         .send = send,
                                         .recv = recv};
                assert_int_equal(host_run(scratch, &t), COLL_OK);
                for (int r = 0; r < n; r++)
                    for (int j = 0; j < n; j++)
                        for (uint64_t i = 0; i < count; i++) /* j's block r */
                            if (out[r][(size_t)j * count + i] !=
                                (int32_t)(j * 1000003 + (int)(r * count + i)))
                                fail_msg("n=%d count=%llu in-place mask 0x%x: rank %d block %d "
                                         "[%llu]",
                                         n, (unsigned long long)count, mask, r, j,
                                         (unsigned long long)i);
                for (int r = 0; r < n; r++) {
                    if (out[r] != in[r]) free(out[r]);
                    free(in[r]);
                }
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(half_conversions_match_the_definition),
        cmocka_unit_test(bf16_conversions_round_to_nearest_even),
        cmocka_unit_test(every_kernel_matches_a_scalar_reference),
        cmocka_unit_test(float_min_and_max_ignore_the_order_of_operands),
        cmocka_unit_test(destination_may_be_the_first_source),
        cmocka_unit_test(host_alltoall_in_every_mix_of_in_place_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
