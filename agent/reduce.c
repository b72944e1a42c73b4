/*
 * reduce.c: reduction kernels. Plain loops the compiler vectorises; one pass per
 * source over a chunk that stays in cache.
 */
#include "reduce.h"

#include <string.h>

#include "coll/coll.h"

float reduce_half_to_float(uint16_t h)
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

uint16_t reduce_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t man = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) ... keeps 10 bits at 2^-24 steps */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)(sign | half);
}

float reduce_bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t reduce_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
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

/* float16 / bfloat16: widen into a float chunk, reduce there, narrow once. */
static void reduce_16(int dtype, int op, void *dst, const void *const *srcs, int nsrc, size_t n,
                      uint32_t avg_div)
{
    float acc[REDUCE_CHUNK], tmp[REDUCE_CHUNK];
    int half = dtype == COLL_FLOAT16;
    for (int k = 0; k < nsrc; k++) {
        const uint16_t *s = srcs[k];
        float *out = k == 0 ? acc : tmp;
        if (half)
            for (size_t i = 0; i < n; i++)
                out[i] = reduce_half_to_float(s[i]);
        else
            for (size_t i = 0; i < n; i++)
                out[i] = reduce_bf16_to_float(s[i]);
        if (k == 0) continue;
        const void *pair[2] = {acc, tmp};
        reduce_f32(op == COLL_AVG ? COLL_SUM : op, acc, pair, 2, n, 1);
    }
    if (op == COLL_AVG) div_f32(acc, n, avg_div);
    uint16_t *d = dst;
    if (half)
        for (size_t i = 0; i < n; i++)
            d[i] = reduce_float_to_half(acc[i]);
    else
        for (size_t i = 0; i < n; i++)
            d[i] = reduce_float_to_bf16(acc[i]);
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
        reduce_16(dtype, op, dst, srcs, nsrc, n, avg_div);
        break;
    }
}
