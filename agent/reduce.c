/*
 * reduce.c: reduction kernels. Plain loops the compiler vectorises; one pass per
 * source over a chunk that stays in cache.
 */
#include "reduce.h"

#include <string.h>

#include "coll/coll.h"

static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, free of branches (the kernels' loops vectorise): a normal
 * rounds its mantissa in the integers (a carry moves into the exponent on its own, and
 * past the largest finite into the infinity); below the least normal the float adder
 * rounds |f| in units of the least subnormal (2^-24); a NaN stays a quiet NaN. */
static inline uint16_t float_to_half(float f)
{
    uint32_t x, one = 0x4b000000u; /* 2^23 */
    memcpy(&x, &f, 4);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    int32_t normal = (int32_t)(r >> 13) - (int32_t)(112u << 10);
    float fa, scale, two23;
    uint32_t sb = 151u << 23; /* 2^24 */
    memcpy(&fa, &ax, 4);
    memcpy(&scale, &sb, 4);
    memcpy(&two23, &one, 4);
    float scaled = fa * scale + two23;
    uint32_t sbits;
    memcpy(&sbits, &scaled, 4);
    int32_t sub = (int32_t)(sbits - one);
    int32_t out = ax < 0x38800000u ? sub : normal;
    out = out > 0x7c00 ? 0x7c00 : out;
    out = ax > 0x7f800000u ? 0x7e00 : out;
    return (uint16_t)(((x >> 16) & 0x8000u) | (uint32_t)out);
}

static inline float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float16 widens through a table of its 65536 values (256 KiB), filled when the library
 * or the agent is loaded, before any thread runs: a load beats the branches above. */
static float half_wide[65536];
__attribute__((constructor)) static void half_table(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        half_wide[h] = half_to_float((uint16_t)h);
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

/* The conversions as the tests see them. The kernels call the static ones: an exported
 * function in position-independent code may be interposed, so the compiler would not
 * inline it, and a call per element made bfloat16 and float16 7x slower than float32 per
 * byte between pods. */
float reduce_half_to_float(uint16_t h)
{
    return half_to_float(h);
}

uint16_t reduce_float_to_half(float f)
{
    return float_to_half(f);
}

float reduce_bf16_to_float(uint16_t b)
{
    return bf16_to_float(b);
}

uint16_t reduce_float_to_bf16(float f)
{
    return float_to_bf16(f);
}

/* The OCP 8-bit floats: e4m3 (bias 7, no infinity, S.1111.111 the NaN, largest 448) and
 * e5m2 (bias 15, IEEE-like: infinities and NaNs at the top exponent, largest 57344).
 * Both conversions are free of branches, so the kernels' loops vectorise; the formats'
 * constants fold in (MBITS, BIAS are literals at every call). */
static inline float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f8_to_float(uint8_t b, int mbits, int bias)
{
    uint32_t e = b & 0x7fu, top = 0x7fu >> mbits;
    /* a normal: the exponent and mantissa move up into place and the bias changes */
    float normal = bits_float((e << (23 - mbits)) + ((uint32_t)(127 - bias) << 23));
    /* a subnormal: mantissa x 2^(1 - bias - mbits), exact */
    float sub =
        (float)(b & ((1u << mbits) - 1)) * bits_float((uint32_t)(127 + 1 - bias - mbits) << 23);
    float v = (e >> mbits) == 0 ? sub : normal;
    if (mbits == 3) /* e4m3: S.1111.111 is its NaN, and there is no infinity */
        v = e == 0x7fu ? __builtin_nanf("") : v;
    else /* e5m2: the top exponent holds the infinities and NaNs */
        v = (e >> mbits) == top ? ((e & 3u) ? __builtin_nanf("") : __builtin_inff()) : v;
    return bits_float(float_bits(v) | (uint32_t)(b & 0x80u) << 24);
}

/* Round to nearest even; out of range (infinities too) saturates to max_bits, a NaN
 * becomes nan_bits. */
static inline uint8_t float_to_f8(float v, int mbits, int bias, uint32_t max_bits,
                                  uint32_t nan_bits)
{
    uint32_t x = float_bits(v), ax = x & 0x7fffffffu, sh = (uint32_t)(23 - mbits);
    /* a normal: round the mantissa in the integers (a carry moves into the exponent on
     * its own), then change the bias */
    uint32_t r = ax + ((1u << (sh - 1)) - 1) + ((ax >> sh) & 1u);
    int32_t normal = (int32_t)(r >> sh) - (int32_t)((uint32_t)(127 - bias) << mbits);
    /* below the least normal: |v| in units of the least subnormal, rounded by adding 2^23
     * (the float adder rounds to nearest even); one rounded up to the least normal
     * encodes as it */
    float scaled = bits_float(ax) * bits_float((uint32_t)(127 + bias - 1 + mbits) << 23);
    int32_t sub = (int32_t)(float_bits(scaled + 0x1p23f) - float_bits(0x1p23f));
    int32_t out = ax < ((uint32_t)(127 - bias + 1) << 23) ? sub : normal;
    out = out > (int32_t)max_bits ? (int32_t)max_bits : out;
    out = ax > 0x7f800000u ? (int32_t)nan_bits : out;
    return (uint8_t)(((x >> 24) & 0x80u) | (uint32_t)out);
}

/* Both ways go through tables, filled when the library or the agent is loaded, before
 * any thread runs: widening reads the 256 values (a load beats the arithmetic by about
 * 3x); narrowing reads the result for the float's exponent, the mantissa bits a float8
 * keeps, the next bit and whether any bit below it is set, which is all that rounding to
 * nearest even looks at (a float8 subnormal keeps fewer bits, and those are among them).
 * 13 bits of index for e4m3 (8 KiB), 12 for e5m2. */
#define F8_INDEX(ax, mbits)                                                                        \
    ((((ax) >> (22 - (mbits))) << 1) | (((ax) & ((1u << (22 - (mbits))) - 1)) != 0))
static float e4m3_wide[256], e5m2_wide[256];
static uint8_t e4m3_narrow[1u << 13], e5m2_narrow[1u << 12];
__attribute__((constructor)) static void f8_tables(void)
{
    for (int b = 0; b < 256; b++) {
        e4m3_wide[b] = f8_to_float((uint8_t)b, 3, 7);
        e5m2_wide[b] = f8_to_float((uint8_t)b, 2, 15);
    }
    for (uint32_t i = 0; i < (1u << 13); i++) /* a float of the class: its sticky bit lowest */
        e4m3_narrow[i] = float_to_f8(bits_float(((i >> 1) << 19) | (i & 1u)), 3, 7, 0x7e, 0x7f);
    for (uint32_t i = 0; i < (1u << 12); i++)
        e5m2_narrow[i] = float_to_f8(bits_float(((i >> 1) << 20) | (i & 1u)), 2, 15, 0x7b, 0x7e);
}
static inline uint8_t narrow(float f, const uint8_t *table, int mbits)
{
    uint32_t x = float_bits(f);
    return (uint8_t)(((x >> 24) & 0x80u) | table[F8_INDEX(x & 0x7fffffffu, mbits)]);
}
#define E4M3_TO_FLOAT(b) e4m3_wide[(uint8_t)(b)]
#define E5M2_TO_FLOAT(b) e5m2_wide[(uint8_t)(b)]
#define FLOAT_TO_E4M3(f) narrow(f, e4m3_narrow, 3)
#define FLOAT_TO_E5M2(f) narrow(f, e5m2_narrow, 2)

float reduce_e4m3_to_float(uint8_t b)
{
    return f8_to_float(b, 3, 7); /* the definition, which test_reduce checks the table by */
}
uint8_t reduce_float_to_e4m3(float f)
{
    return FLOAT_TO_E4M3(f); /* what the kernels use (test_reduce checks it) */
}
float reduce_e5m2_to_float(uint8_t b)
{
    return f8_to_float(b, 2, 15);
}
uint8_t reduce_float_to_e5m2(float f)
{
    return FLOAT_TO_E5M2(f);
}

#define OP_SUM(a, b) ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MIN(a, b) ((b) < (a) ? (b) : (a))
#define OP_MAX(a, b) ((b) > (a) ? (b) : (a))
#define OP_BAND(a, b) ((a) & (b))
#define OP_BOR(a, b) ((a) | (b))
#define OP_BXOR(a, b) ((a) ^ (b))

/* Min and max of floats as C's fmin and fmax (a NaN gives way to a number; -0 is below
 * +0), and with the same bits whichever operand comes first, so that the two pods of a
 * pair, each folding its own operand first, agree: equal operands (-0 and +0 among them)
 * and two NaNs are settled on their bits (OR for min, which makes -0 win; AND for max,
 * which makes +0 win; OR for two NaNs, which stays a NaN). */
#define DEF_FMINMAX(T, U)                                                                          \
    static inline T tie_##T(T a, T b, int and_bits)                                                \
    {                                                                                              \
        U x, y;                                                                                    \
        memcpy(&x, &a, sizeof(x));                                                                 \
        memcpy(&y, &b, sizeof(y));                                                                 \
        U t = and_bits ? x & y : x | y;                                                            \
        T r;                                                                                       \
        memcpy(&r, &t, sizeof(t));                                                                 \
        return r;                                                                                  \
    }                                                                                              \
    static inline T min_sym_##T(T a, T b)                                                          \
    {                                                                                              \
        T tie = tie_##T(a, b, 0), r = a < b ? a : b; /* equal or unordered: b, mended below */     \
        r = a == b ? tie : r;                                                                      \
        r = a != a ? (b != b ? tie : b) : r;                                                       \
        return b != b && a == a ? a : r;                                                           \
    }                                                                                              \
    static inline T max_sym_##T(T a, T b)                                                          \
    {                                                                                              \
        T tie = tie_##T(a, b, a == b), r = a > b ? a : b;                                          \
        r = a == b ? tie : r;                                                                      \
        r = a != a ? (b != b ? tie : b) : r;                                                       \
        return b != b && a == a ? a : r;                                                           \
    }
DEF_FMINMAX(float, uint32_t)
DEF_FMINMAX(double, uint64_t)
#define OP_FMIN(a, b) min_sym_float(a, b)
#define OP_FMAX(a, b) max_sym_float(a, b)
#define OP_DMIN(a, b) min_sym_double(a, b)
#define OP_DMAX(a, b) max_sym_double(a, b)

/* One kernel per (type, op): dst = srcs[0] op srcs[1] op ... */
#define DEF_KERNEL(T, NAME, OPM)                                                                   \
    static void NAME(T *restrict dst, const void *const *srcs, int nsrc, size_t n)                 \
    {                                                                                              \
        const T *a = srcs[0];                                                                      \
        if (nsrc == 1) {                                                                           \
            if (dst != a) memcpy(dst, a, n * sizeof(T));                                           \
            return;                                                                                \
        }                                                                                          \
        const T *b = srcs[1];                                                                      \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = OPM(a[i], b[i]);                                                              \
        for (int k = 2; k < nsrc; k++) {                                                           \
            const T *restrict c = srcs[k];                                                         \
            for (size_t i = 0; i < n; i++)                                                         \
                dst[i] = OPM(dst[i], c[i]);                                                        \
        }                                                                                          \
    }

/* The bitwise reductions of an integer type; none for floats (never asked for). */
#define DEF_BITWISE(T, SUF)                                                                        \
    DEF_KERNEL(T, band_##SUF, OP_BAND)                                                             \
    DEF_KERNEL(T, bor_##SUF, OP_BOR)                                                               \
    DEF_KERNEL(T, bxor_##SUF, OP_BXOR)                                                             \
    static void bitwise_##SUF(int op, void *dst, const void *const *srcs, int nsrc, size_t n)      \
    {                                                                                              \
        if (op == COLL_BAND) band_##SUF(dst, srcs, nsrc, n);                                       \
        if (op == COLL_BOR) bor_##SUF(dst, srcs, nsrc, n);                                         \
        if (op == COLL_BXOR) bxor_##SUF(dst, srcs, nsrc, n);                                       \
    }
#define DEF_NO_BITWISE(SUF)                                                                        \
    static void bitwise_##SUF(int op, void *dst, const void *const *srcs, int nsrc, size_t n)      \
    {                                                                                              \
        (void)op, (void)dst, (void)srcs, (void)nsrc, (void)n;                                      \
    }

#define DEF_TYPE(T, SUF, MINOP, MAXOP)                                                             \
    DEF_KERNEL(T, sum_##SUF, OP_SUM)                                                               \
    DEF_KERNEL(T, prod_##SUF, OP_PROD)                                                             \
    DEF_KERNEL(T, min_##SUF, MINOP)                                                                \
    DEF_KERNEL(T, max_##SUF, MAXOP)                                                                \
    static void div_##SUF(T *dst, size_t n, uint32_t d)                                            \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            dst[i] = (T)(dst[i] / (T)d);                                                           \
    }                                                                                              \
    static void reduce_##SUF(int op, void *dst, const void *const *srcs, int nsrc, size_t n,       \
                             uint32_t avg_div)                                                     \
    {                                                                                              \
        switch (op) {                                                                              \
        case COLL_SUM:                                                                             \
            sum_##SUF(dst, srcs, nsrc, n);                                                         \
            break;                                                                                 \
        case COLL_PROD:                                                                            \
            prod_##SUF(dst, srcs, nsrc, n);                                                        \
            break;                                                                                 \
        case COLL_MIN:                                                                             \
            min_##SUF(dst, srcs, nsrc, n);                                                         \
            break;                                                                                 \
        case COLL_MAX:                                                                             \
            max_##SUF(dst, srcs, nsrc, n);                                                         \
            break;                                                                                 \
        case COLL_AVG:                                                                             \
            sum_##SUF(dst, srcs, nsrc, n);                                                         \
            div_##SUF(dst, n, avg_div);                                                            \
            break;                                                                                 \
        default: /* bitwise: integers only (wire_redop_fits) */                                    \
            bitwise_##SUF(op, dst, srcs, nsrc, n);                                                 \
            break;                                                                                 \
        }                                                                                          \
    }

DEF_BITWISE(int8_t, i8)
DEF_BITWISE(uint8_t, u8)
DEF_BITWISE(int16_t, i16)
DEF_BITWISE(uint16_t, u16)
DEF_BITWISE(int32_t, i32)
DEF_BITWISE(uint32_t, u32)
DEF_BITWISE(int64_t, i64)
DEF_BITWISE(uint64_t, u64)
DEF_NO_BITWISE(f32)
DEF_NO_BITWISE(f64)
DEF_TYPE(int8_t, i8, OP_MIN, OP_MAX)
DEF_TYPE(uint8_t, u8, OP_MIN, OP_MAX)
DEF_TYPE(int16_t, i16, OP_MIN, OP_MAX)
DEF_TYPE(uint16_t, u16, OP_MIN, OP_MAX)
DEF_TYPE(int32_t, i32, OP_MIN, OP_MAX)
DEF_TYPE(uint32_t, u32, OP_MIN, OP_MAX)
DEF_TYPE(int64_t, i64, OP_MIN, OP_MAX)
DEF_TYPE(uint64_t, u64, OP_MIN, OP_MAX)
DEF_TYPE(float, f32, OP_FMIN, OP_FMAX)
DEF_TYPE(double, f64, OP_DMIN, OP_DMAX)

/* bool: each byte read as its truth; sum and max an or, prod and min an and, and the
 * bitwise ones the logical ones (as torch reduces bools); results are 0 or 1 */
static void reduce_bool(int op, void *dst, const void *const *srcs, int nsrc, size_t n)
{
    uint8_t *d = dst;
    int any = op == COLL_SUM || op == COLL_MAX || op == COLL_BOR, x = op == COLL_BXOR;
    const uint8_t *a = srcs[0];
    for (size_t i = 0; i < n; i++)
        d[i] = a[i] != 0;
    for (int k = 1; k < nsrc; k++) {
        const uint8_t *restrict s = srcs[k];
        if (x)
            for (size_t i = 0; i < n; i++)
                d[i] ^= s[i] != 0;
        else if (any)
            for (size_t i = 0; i < n; i++)
                d[i] |= s[i] != 0;
        else
            for (size_t i = 0; i < n; i++)
                d[i] &= s[i] != 0;
    }
}

/* The narrow floats (float16, bfloat16, the float8s): each source widened into a float
 * chunk, reduced there, the result narrowed once. T: the storage type; WIDE_A/NARROW_A
 * the conversions when `a` (the first of the two formats) is set, WIDE_B/NARROW_B
 * otherwise. */
#define DEF_NARROW(NAME, T, WIDE_A, WIDE_B, NARROW_A, NARROW_B)                                    \
    static void NAME(int a, int op, void *dst, const void *const *srcs, int nsrc, size_t n,        \
                     uint32_t avg_div)                                                             \
    {                                                                                              \
        float acc[REDUCE_CHUNK], tmp[REDUCE_CHUNK];                                                \
        for (int k = 0; k < nsrc; k++) {                                                           \
            const T *s = srcs[k];                                                                  \
            float *out = k == 0 ? acc : tmp;                                                       \
            if (a)                                                                                 \
                for (size_t i = 0; i < n; i++)                                                     \
                    out[i] = WIDE_A(s[i]);                                                         \
            else                                                                                   \
                for (size_t i = 0; i < n; i++)                                                     \
                    out[i] = WIDE_B(s[i]);                                                         \
            if (k == 0) continue;                                                                  \
            const void *pair[2] = {acc, tmp};                                                      \
            reduce_f32(op == COLL_AVG ? COLL_SUM : op, acc, pair, 2, n, 1);                        \
        }                                                                                          \
        if (op == COLL_AVG) div_f32(acc, n, avg_div);                                              \
        T *d = dst;                                                                                \
        if (a)                                                                                     \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = NARROW_A(acc[i]);                                                           \
        else                                                                                       \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = NARROW_B(acc[i]);                                                           \
    }
#define HALF_WIDE(h) half_wide[h]
DEF_NARROW(reduce_16, uint16_t, HALF_WIDE, bf16_to_float, float_to_half, float_to_bf16)
DEF_NARROW(reduce_8, uint8_t, E4M3_TO_FLOAT, E5M2_TO_FLOAT, FLOAT_TO_E4M3, FLOAT_TO_E5M2)

/* Complex numbers: sum and average lane by lane; the product as (ac - bd, ad + bc), which
 * gives the same bits whichever operand comes first (reduce.c is built without
 * contraction into fused multiply-adds, which would break that). */
#define DEF_CPROD(T, SUF)                                                                          \
    static void cprod_##SUF(T *restrict d, const void *const *srcs, int nsrc, size_t n)            \
    {                                                                                              \
        const T *a = srcs[0];                                                                      \
        if (d != a) memcpy(d, a, 2 * n * sizeof(T));                                               \
        for (int k = 1; k < nsrc; k++) {                                                           \
            const T *restrict b = srcs[k];                                                         \
            for (size_t i = 0; i < n; i++) {                                                       \
                T ar = d[2 * i], ai = d[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1];              \
                d[2 * i] = ar * br - ai * bi;                                                      \
                d[2 * i + 1] = ar * bi + ai * br;                                                  \
            }                                                                                      \
        }                                                                                          \
    }
DEF_CPROD(float, f32)
DEF_CPROD(double, f64)

static void reduce_complex(int dtype, int op, void *dst, const void *const *srcs, int nsrc,
                           size_t n, uint32_t avg_div)
{
    int wide = dtype == COLL_COMPLEX128;
    if (op == COLL_PROD) {
        if (wide)
            cprod_f64(dst, srcs, nsrc, n);
        else
            cprod_f32(dst, srcs, nsrc, n);
        return;
    }
    if (wide) /* sum or average (wire_redop_fits) */
        reduce_f64(op, dst, srcs, nsrc, 2 * n, avg_div);
    else
        reduce_f32(op, dst, srcs, nsrc, 2 * n, avg_div);
}

void reduce_n(int dtype, int op, void *dst, const void *const *srcs, int nsrc, size_t n,
              uint32_t avg_div)
{
    switch (dtype) {
    case COLL_INT8:
        reduce_i8(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_UINT8:
        reduce_u8(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_INT16:
        reduce_i16(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_UINT16:
        reduce_u16(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_BOOL:
        reduce_bool(op, dst, srcs, nsrc, n);
        break;
    case COLL_INT32:
        reduce_i32(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_UINT32:
        reduce_u32(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_INT64:
        reduce_i64(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_UINT64:
        reduce_u64(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_FLOAT32:
        reduce_f32(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_FLOAT64:
        reduce_f64(op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_FLOAT16:
    case COLL_BFLOAT16:
        reduce_16(dtype == COLL_FLOAT16, op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_FLOAT8_E4M3:
    case COLL_FLOAT8_E5M2:
        reduce_8(dtype == COLL_FLOAT8_E4M3, op, dst, srcs, nsrc, n, avg_div);
        break;
    case COLL_COMPLEX64:
    case COLL_COMPLEX128:
        reduce_complex(dtype, op, dst, srcs, nsrc, n, avg_div);
        break;
    }
}

/* ---- premultiplied sums ------------------------------------------------------------- */

/* Integers: each product and the sum modulo 2^bits (unsigned arithmetic, no overflow). */
#define DEF_PREMUL_INT(T, U, SUF)                                                                  \
    static void premul_##SUF(void *dst, const void *const *srcs, const uint64_t *scalars,          \
                             int nsrc, size_t n)                                                   \
    {                                                                                              \
        T *d = dst;                                                                                \
        for (int k = 0; k < nsrc; k++) {                                                           \
            const T *a = srcs[k];                                                                  \
            uint64_t s = (U)scalars[k];                                                            \
            for (size_t i = 0; i < n; i++) {                                                       \
                uint64_t p = (uint64_t)(U)a[i] * s;                                                \
                d[i] = (T)(U)(k ? (uint64_t)(U)d[i] + p : p);                                      \
            }                                                                                      \
        }                                                                                          \
    }
DEF_PREMUL_INT(int8_t, uint8_t, i8)
DEF_PREMUL_INT(uint8_t, uint8_t, u8)
DEF_PREMUL_INT(int16_t, uint16_t, i16)
DEF_PREMUL_INT(uint16_t, uint16_t, u16)
DEF_PREMUL_INT(int32_t, uint32_t, i32)
DEF_PREMUL_INT(uint32_t, uint32_t, u32)
DEF_PREMUL_INT(int64_t, uint64_t, i64)
DEF_PREMUL_INT(uint64_t, uint64_t, u64)

/* float32 and float64: each product in the type, summed in rank order. */
#define DEF_PREMUL_FLOAT(T, U, SUF)                                                                \
    static void premul_##SUF(void *dst, const void *const *srcs, const uint64_t *scalars,          \
                             int nsrc, size_t n)                                                   \
    {                                                                                              \
        T *d = dst;                                                                                \
        for (int k = 0; k < nsrc; k++) {                                                           \
            const T *a = srcs[k];                                                                  \
            U bits = (U)scalars[k];                                                                \
            T s;                                                                                   \
            memcpy(&s, &bits, sizeof(s));                                                          \
            for (size_t i = 0; i < n; i++)                                                         \
                d[i] = k ? d[i] + a[i] * s : a[i] * s;                                             \
        }                                                                                          \
    }
DEF_PREMUL_FLOAT(float, uint32_t, f32)
DEF_PREMUL_FLOAT(double, uint64_t, f64)

/* The narrow floats: each product in float32, rounded to the type (as a product of two
 * such numbers in their own type would be: it is exact in float32), then summed in
 * float32 and rounded once, as their COLL_SUM. */
static float narrow_to_float(int dtype, const void *p, size_t i)
{
    switch (dtype) {
    case COLL_FLOAT16:
        return half_to_float(((const uint16_t *)p)[i]);
    case COLL_BFLOAT16:
        return bf16_to_float(((const uint16_t *)p)[i]);
    case COLL_FLOAT8_E4M3:
        return reduce_e4m3_to_float(((const uint8_t *)p)[i]);
    default:
        return reduce_e5m2_to_float(((const uint8_t *)p)[i]);
    }
}

static void float_to_narrow(int dtype, void *p, size_t i, float v)
{
    switch (dtype) {
    case COLL_FLOAT16:
        ((uint16_t *)p)[i] = float_to_half(v);
        break;
    case COLL_BFLOAT16:
        ((uint16_t *)p)[i] = float_to_bf16(v);
        break;
    case COLL_FLOAT8_E4M3:
        ((uint8_t *)p)[i] = reduce_float_to_e4m3(v);
        break;
    default:
        ((uint8_t *)p)[i] = reduce_float_to_e5m2(v);
        break;
    }
}

static void premul_narrow(int dtype, void *dst, const void *const *srcs, const uint64_t *scalars,
                          int nsrc, size_t n)
{
    enum { STEP = 256 };
    float acc[STEP], s[64];
    uint8_t one[8]; /* the scalar rounded through the type: its own bits */
    for (int k = 0; k < nsrc && k < 64; k++) {
        memcpy(one, &scalars[k], sizeof(one));
        s[k] = narrow_to_float(dtype, one, 0);
    }
    uint8_t tmp[2];
    for (size_t i0 = 0; i0 < n; i0 += STEP) {
        size_t m = n - i0 < STEP ? n - i0 : STEP;
        for (int k = 0; k < nsrc; k++)
            for (size_t i = 0; i < m; i++) {
                float_to_narrow(dtype, tmp, 0, narrow_to_float(dtype, srcs[k], i0 + i) * s[k]);
                float v = narrow_to_float(dtype, tmp, 0);
                acc[i] = k ? acc[i] + v : v;
            }
        for (size_t i = 0; i < m; i++)
            float_to_narrow(dtype, dst, i0 + i, acc[i]);
    }
}

typedef void (*premul_fn)(void *, const void *const *, const uint64_t *, int, size_t);
static const premul_fn premul_of[COLL_DTYPE_COUNT] = {
    [COLL_INT8] = premul_i8,     [COLL_UINT8] = premul_u8,   [COLL_INT16] = premul_i16,
    [COLL_UINT16] = premul_u16,  [COLL_INT32] = premul_i32,  [COLL_UINT32] = premul_u32,
    [COLL_INT64] = premul_i64,   [COLL_UINT64] = premul_u64, [COLL_FLOAT32] = premul_f32,
    [COLL_FLOAT64] = premul_f64,
};

void reduce_premul_n(int dtype, void *dst, const void *const *srcs, const uint64_t *scalars,
                     int nsrc, size_t n)
{
    if (dtype == COLL_FLOAT16 || dtype == COLL_BFLOAT16 || dtype == COLL_FLOAT8_E4M3 ||
        dtype == COLL_FLOAT8_E5M2)
        premul_narrow(dtype, dst, srcs, scalars, nsrc, n);
    else if (dtype >= 0 && dtype < COLL_DTYPE_COUNT && premul_of[dtype])
        premul_of[dtype](dst, srcs, scalars, nsrc, n);
    /* bool, complex: never asked for (wire_redop_fits) */
}
