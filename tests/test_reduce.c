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

/* Reference float8 -> double by the definition: e4m3 (bias 7, S.1111.111 the NaN, no
 * infinity) and e5m2 (bias 15, the top exponent infinities and NaNs). */
static double f8_ref(uint8_t b, int mbits)
{
    int bias = mbits == 3 ? 7 : 15, top = mbits == 3 ? 15 : 31;
    int s = b >> 7, e = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
    double v;
    if (mbits == 3 && e == top && m == 7)
        v = NAN;
    else if (mbits == 2 && e == top)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - bias - mbits);
    else
        v = ldexp((1 << mbits) + m, e - bias - mbits);
    return s ? -v : v;
}

/* Reference float -> float8 by the definition: the nearest value of the format (ties to
 * the even encoding), out of range (infinities too) the largest finite, NaN a NaN. */
static int f8_round_ref(float f, int mbits)
{
    int bias = mbits == 3 ? 7 : 15;
    double max = mbits == 3 ? 448 : 57344;
    if (isnan(f)) return -1;
    double a = fabs((double)f);
    int e;
    frexp(a, &e);                                          /* a = m x 2^e, m in [0.5, 1) */
    int q = (e - 1 < 1 - bias ? 1 - bias : e - 1) - mbits; /* the quantum's exponent */
    double r = nearbyint(ldexp(a, -q));                    /* ties to even */
    double v = ldexp(r, q);
    if (v > max) v = max;
    /* encode v */
    int bits;
    if (v < ldexp(1, 1 - bias)) {
        bits = (int)ldexp(v, bias - 1 + mbits);
    } else {
        frexp(v, &e);
        bits = ((e - 1 + bias) << mbits) + (int)(ldexp(v, mbits - (e - 1)) - (1 << mbits));
    }
    return (signbit(f) ? 0x80 : 0) | bits;
}

/* Reference float -> float16 by the definition: the nearest half (ties to the even
 * encoding); past the largest finite (65504) after rounding, an infinity; NaN: -1. */
static int half_round_ref(float f)
{
    if (isnan(f)) return -1;
    double a = fabs((double)f);
    int e;
    frexp(a, &e);
    int q = (e - 1 < -14 ? -14 : e - 1) - 10;
    double v = ldexp(nearbyint(ldexp(a, -q)), q);
    int bits;
    if (v > 65504)
        bits = 0x7c00;
    else if (v < ldexp(1, -14))
        bits = (int)ldexp(v, 24);
    else {
        frexp(v, &e);
        bits = ((e - 1 + 15) << 10) + (int)(ldexp(v, 10 - (e - 1)) - 1024);
    }
    return (signbit(f) ? 0x8000 : 0) | bits;
}

static void narrowing_matches_the_definition_across_the_floats(void **state)
{
    (void)state;
    /* every 61st float bit pattern (about 70 million), and every float near the formats'
     * range ends and ties */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 61) {
        uint32_t x = (uint32_t)u;
        float f;
        memcpy(&f, &x, 4);
        int hw = half_round_ref(f);
        uint16_t hg = reduce_float_to_half(f);
        if (hw < 0 ? !isnan(reduce_half_to_float(hg)) : hg != hw)
            fail_msg("float16 of float 0x%08x (%g): 0x%04x, want 0x%04x", x, (double)f, hg, hw);
        for (int fmt = 0; fmt < 2; fmt++) {
            int want = f8_round_ref(f, fmt == 0 ? 3 : 2);
            uint8_t got = fmt == 0 ? reduce_float_to_e4m3(f) : reduce_float_to_e5m2(f);
            float back = fmt == 0 ? reduce_e4m3_to_float(got) : reduce_e5m2_to_float(got);
            if (want < 0 ? !isnan(back) : got != want)
                fail_msg("%s of float 0x%08x (%g): 0x%02x, want 0x%02x", fmt == 0 ? "e4m3" : "e5m2",
                         x, (double)f, got, want);
        }
    }
}

static void float8_conversions_match_the_definition(void **state)
{
    (void)state;
    for (int fmt = 0; fmt < 2; fmt++) {
        int mbits = fmt == 0 ? 3 : 2;
        float (*to_float)(uint8_t) = fmt == 0 ? reduce_e4m3_to_float : reduce_e5m2_to_float;
        uint8_t (*from_float)(float) = fmt == 0 ? reduce_float_to_e4m3 : reduce_float_to_e5m2;
        for (uint32_t b = 0; b < 256; b++) {
            double want = f8_ref((uint8_t)b, mbits);
            float got = to_float((uint8_t)b);
            if (isnan(want)) {
                assert_true(isnan(got));
                assert_true(isnan(to_float(from_float(got)))); /* a NaN stays one */
                continue;
            }
            assert_true((double)got == want);
            if (!isinf(want)) assert_int_equal(from_float(got), b); /* every finite survives */
        }
    }
    /* e4m3: ties to even, in the normals and the subnormals; saturation, infinities too */
    assert_int_equal(reduce_float_to_e4m3(1.0f + 1.0f / 16), 0x38); /* tie, even */
    assert_int_equal(reduce_float_to_e4m3(1.0f + 3.0f / 16), 0x3a); /* tie, up */
    assert_int_equal(reduce_float_to_e4m3(ldexpf(1, -10)), 0x00);   /* tie to zero */
    assert_int_equal(reduce_float_to_e4m3(ldexpf(3, -10)), 0x02);
    assert_int_equal(reduce_float_to_e4m3(ldexpf(15, -10)), 0x08); /* up to the least normal */
    assert_int_equal(reduce_float_to_e4m3(448), 0x7e);
    assert_int_equal(reduce_float_to_e4m3(1e9f), 0x7e);
    assert_int_equal(reduce_float_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(reduce_float_to_e4m3(ldexpf(1, -127)), 0x00); /* a float subnormal */
    /* e5m2 */
    assert_int_equal(reduce_float_to_e5m2(1.0f + 1.0f / 8), 0x3c);
    assert_int_equal(reduce_float_to_e5m2(1.0f + 3.0f / 8), 0x3e);
    assert_int_equal(reduce_float_to_e5m2(57344), 0x7b);
    assert_int_equal(reduce_float_to_e5m2(61440), 0x7b); /* rounds to infinity: saturates */
    assert_int_equal(reduce_float_to_e5m2(INFINITY), 0x7b);
    assert_int_equal(reduce_float_to_e5m2(-1e30f), 0xfb);
    assert_int_equal(reduce_float_to_e5m2(ldexpf(1, -17)), 0x00);
    assert_int_equal(reduce_float_to_e5m2(ldexpf(3, -17)), 0x02);
}

static void every_kernel_matches_a_scalar_reference(void **state)
{
    (void)state;
    enum { N = 1031, SRC = 5 };
    static uint64_t bufs[SRC][2 * N], dst[2 * N];
    for (int dt = 0; dt < COLL_DTYPE_COUNT; dt++) {
        for (int op = 0; op < COLL_REDOP_COUNT; op++) {
            if (!wire_redop_fits(WIRE_OP_ALLREDUCE, (unsigned)dt, (unsigned)op))
                continue; /* never asked for */
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
                double cre, cim; /* what a complex result is scaled by */
                val_cscale(op == COLL_PROD ? nsrc : -1, &cre, &cim);
                for (size_t i = 0; i < N; i++) {
                    double acc = val_get(srcs[0], i, dt);
                    for (int k = 1; k < nsrc; k++)
                        acc = val_fold(dt, op, acc, val_get(srcs[k], i, dt));
                    if (op == COLL_AVG)
                        acc = val_is_int(dt) ? (double)((long long)acc / nsrc) : acc / nsrc;
                    double rel = 1e-6;
                    if (dt == COLL_FLOAT16 || dt == COLL_BFLOAT16) rel = 8e-3;
                    if (dt == COLL_FLOAT8_E4M3) rel = 0.0625; /* half a unit: 2^-4 */
                    if (dt == COLL_FLOAT8_E5M2) rel = 0.125;
                    double got = val_get(dst, i, dt), want = acc;
                    if (val_is_complex(dt)) {
                        want = acc * cre;
                        double wim = acc * cim, gim = val_get_im(dst, i, dt);
                        if (fabs(gim - wim) > rel * fabs(wim))
                            fail_msg("dtype %s op %s nsrc %d i %zu: imaginary %g want %g",
                                     coll_dtype_name(dt), coll_redop_name(op), nsrc, i, gim, wim);
                    }
                    if (fabs(got - want) > rel * fabs(want))
                        fail_msg("dtype %s op %s nsrc %d i %zu: got %g want %g",
                                 coll_dtype_name(dt), coll_redop_name(op), nsrc, i, got, want);
                }
            }
        }
    }
}

/* The two pods of a pair fold the same two complex operands each with its own first: the
 * product must give the same bits both ways (no fused multiply-add on one side only). */
static void complex_product_ignores_the_order_of_operands(void **state)
{
    (void)state;
    enum { N = 4096 };
    static double a[2 * N], b[2 * N], ab[2 * N], ba[2 * N];
    static float fa[2 * N], fb[2 * N], fab[2 * N], fba[2 * N];
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < 2 * N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a[i] = (double)(x >> 11) / 9007199254740992.0 * 200 - 100;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (double)(x >> 11) / 9007199254740992.0 * 200 - 100;
        fa[i] = (float)a[i], fb[i] = (float)b[i];
    }
    const void *s1[2] = {a, b}, *s2[2] = {b, a}, *f1[2] = {fa, fb}, *f2[2] = {fb, fa};
    reduce_n(COLL_COMPLEX128, COLL_PROD, ab, s1, 2, N, 2);
    reduce_n(COLL_COMPLEX128, COLL_PROD, ba, s2, 2, N, 2);
    reduce_n(COLL_COMPLEX64, COLL_PROD, fab, f1, 2, N, 2);
    reduce_n(COLL_COMPLEX64, COLL_PROD, fba, f2, 2, N, 2);
    assert_memory_equal(ab, ba, sizeof(ab));
    assert_memory_equal(fab, fba, sizeof(fab));
    /* and it is the product: (1 + 2i)(3 - i) = 5 + 5i */
    double p[2] = {1, 2}, q[2] = {3, -1}, r[2];
    const void *pq[2] = {p, q};
    reduce_n(COLL_COMPLEX128, COLL_PROD, r, pq, 2, 1, 2);
    assert_true(r[0] == 5 && r[1] == 5);
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

/* The premultiplied sum's kernel: integers wrap, each narrow float's product is rounded
 * to its type before the float32 sum (which is rounded once), and dst may be srcs[0]. */
static void premultiplied_sums_round_each_product(void **state)
{
    (void)state;
    int8_t a[3] = {100, -7, 1}, b[3] = {3, 2, -128};
    const void *srcs[2] = {a, b};
    uint64_t sc[2] = {(uint8_t)3, (uint8_t)(int8_t)-2};
    reduce_premul_n(COLL_INT8, a, srcs, sc, 2, 3); /* in place on the first source */
    assert_int_equal(a[0], (int8_t)(uint8_t)(300 - 6));
    assert_int_equal(a[1], (int8_t)(-21 - 4));
    assert_int_equal(a[2], (int8_t)(uint8_t)(3 + 256));
    /* float16: 1 + 2^-10 times 3 is 3 + 3 * 2^-10, between two halves (2^-9 apart): the
     * product rounds to even first, then the two products add */
    uint16_t h[2] = {reduce_float_to_half(1.0f + 0x1p-10f), reduce_float_to_half(1.0f + 0x1p-10f)};
    uint16_t out;
    const void *hs[2] = {&h[0], &h[1]};
    uint64_t three = reduce_float_to_half(3.0f);
    uint64_t hsc[2] = {three, three};
    reduce_premul_n(COLL_FLOAT16, &out, hs, hsc, 2, 1);
    float p = reduce_half_to_float(reduce_float_to_half((1.0f + 0x1p-10f) * 3.0f));
    assert_true(p != (1.0f + 0x1p-10f) * 3.0f); /* the product was rounded */
    assert_int_equal(out, reduce_float_to_half(p + p));
    /* bfloat16 and float64 */
    uint16_t bb[1] = {reduce_float_to_bf16(1.5f)}, bout;
    const void *bs[1] = {bb};
    uint64_t bsc[1] = {reduce_float_to_bf16(-0.25f)};
    reduce_premul_n(COLL_BFLOAT16, &bout, bs, bsc, 1, 1);
    assert_true(reduce_bf16_to_float(bout) == -0.375f);
    double d0[2] = {1.5, -2.0}, d1[2] = {4.0, 8.0}, dout[2];
    const void *ds[2] = {d0, d1};
    double s0 = 2.0, s1 = 0.125;
    uint64_t dsc[2];
    memcpy(&dsc[0], &s0, 8);
    memcpy(&dsc[1], &s1, 8);
    reduce_premul_n(COLL_FLOAT64, dout, ds, dsc, 2, 2);
    assert_true(dout[0] == 3.5 && dout[1] == -3.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(half_conversions_match_the_definition),
        cmocka_unit_test(bf16_conversions_round_to_nearest_even),
        cmocka_unit_test(float8_conversions_match_the_definition),
        cmocka_unit_test(premultiplied_sums_round_each_product),
        cmocka_unit_test(narrowing_matches_the_definition_across_the_floats),
        cmocka_unit_test(every_kernel_matches_a_scalar_reference),
        cmocka_unit_test(complex_product_ignores_the_order_of_operands),
        cmocka_unit_test(float_min_and_max_ignore_the_order_of_operands),
        cmocka_unit_test(destination_may_be_the_first_source),
        cmocka_unit_test(host_alltoall_in_every_mix_of_in_place_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
