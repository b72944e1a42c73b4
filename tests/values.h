/*
 * values.h: reading and writing one element of any dtype as a double, for the tests
 * that build inputs and check results (float16 / bfloat16 through the agent's
 * conversions, which test_reduce checks against their definition).
 */
#ifndef TESTS_VALUES_H
#define TESTS_VALUES_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "reduce.h"

/* Integer dtypes (exact, integer division for the average, bitwise reductions). */
static inline int val_is_int(int dt)
{
    return dt <= COLL_UINT64 || dt == COLL_INT16 || dt == COLL_UINT16;
}

/* complex dtypes: element v of a test is v x (1 - 2i), so a product of n of them is their
 * real product times (1 - 2i)^n (val_cscale) */
static inline int val_is_complex(int dt)
{
    return dt == COLL_COMPLEX64 || dt == COLL_COMPLEX128;
}

/* (1 - 2i)^n, or 1 - 2i for n < 0 (what a value is scaled by) */
static inline void val_cscale(int n, double *re, double *im)
{
    double r = 1, i = 0;
    for (int k = 0; k < (n < 0 ? 1 : n); k++) {
        double t = r * 1 - i * -2;
        i = r * -2 + i * 1;
        r = t;
    }
    *re = r, *im = i;
}

/* a op b as the agent reduces two elements of dt (a double holds them exactly: the
 * tests' values are small); AVG sums (the caller divides) */
static inline double val_fold(int dt, int op, double a, double b)
{
    if (dt == COLL_BOOL) {
        int x = a != 0, y = b != 0;
        if (op == COLL_BXOR) return x ^ y;
        if (op == COLL_SUM || op == COLL_MAX || op == COLL_BOR) return x | y;
        return x & y;
    }
    long long p = (long long)a, q = (long long)b;
    switch (op) {
    case COLL_PROD:
        return a * b;
    case COLL_MIN:
        return b < a ? b : a;
    case COLL_MAX:
        return b > a ? b : a;
    case COLL_BAND:
        return (double)(p & q);
    case COLL_BOR:
        return (double)(p | q);
    case COLL_BXOR:
        return (double)(p ^ q);
    default:
        return a + b;
    }
}

static inline void val_put(void *p, size_t i, int dt, double v)
{
    switch (dt) {
    case COLL_INT8:
        ((int8_t *)p)[i] = (int8_t)v;
        break;
    case COLL_UINT8:
        ((uint8_t *)p)[i] = (uint8_t)v;
        break;
    case COLL_INT16:
        ((int16_t *)p)[i] = (int16_t)v;
        break;
    case COLL_UINT16:
        ((uint16_t *)p)[i] = (uint16_t)v;
        break;
    case COLL_BOOL: /* its truth */
        ((uint8_t *)p)[i] = v != 0;
        break;
    case COLL_INT32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    case COLL_UINT32:
        ((uint32_t *)p)[i] = (uint32_t)v;
        break;
    case COLL_INT64:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    case COLL_UINT64:
        ((uint64_t *)p)[i] = (uint64_t)v;
        break;
    case COLL_FLOAT16:
        ((uint16_t *)p)[i] = reduce_float_to_half((float)v);
        break;
    case COLL_BFLOAT16:
        ((uint16_t *)p)[i] = reduce_float_to_bf16((float)v);
        break;
    case COLL_FLOAT32:
        ((float *)p)[i] = (float)v;
        break;
    case COLL_FLOAT64:
        ((double *)p)[i] = v;
        break;
    case COLL_FLOAT8_E4M3:
        ((uint8_t *)p)[i] = reduce_float_to_e4m3((float)v);
        break;
    case COLL_FLOAT8_E5M2:
        ((uint8_t *)p)[i] = reduce_float_to_e5m2((float)v);
        break;
    case COLL_COMPLEX64:
        ((float *)p)[2 * i] = (float)v;
        ((float *)p)[2 * i + 1] = (float)(-2 * v);
        break;
    case COLL_COMPLEX128:
        ((double *)p)[2 * i] = v;
        ((double *)p)[2 * i + 1] = -2 * v;
        break;
    }
}

/* The imaginary part of complex element i (0 for other dtypes). */
static inline double val_get_im(const void *p, size_t i, int dt)
{
    if (dt == COLL_COMPLEX64) return ((const float *)p)[2 * i + 1];
    if (dt == COLL_COMPLEX128) return ((const double *)p)[2 * i + 1];
    return 0;
}

static inline double val_get(const void *p, size_t i, int dt)
{
    switch (dt) {
    case COLL_INT8:
        return ((const int8_t *)p)[i];
    case COLL_UINT8:
    case COLL_BOOL:
        return ((const uint8_t *)p)[i];
    case COLL_INT16:
        return ((const int16_t *)p)[i];
    case COLL_UINT16:
        return ((const uint16_t *)p)[i];
    case COLL_INT32:
        return ((const int32_t *)p)[i];
    case COLL_UINT32:
        return ((const uint32_t *)p)[i];
    case COLL_INT64:
        return (double)((const int64_t *)p)[i];
    case COLL_UINT64:
        return (double)((const uint64_t *)p)[i];
    case COLL_FLOAT16:
        return reduce_half_to_float(((const uint16_t *)p)[i]);
    case COLL_BFLOAT16:
        return reduce_bf16_to_float(((const uint16_t *)p)[i]);
    case COLL_FLOAT32:
        return ((const float *)p)[i];
    case COLL_FLOAT8_E4M3:
        return reduce_e4m3_to_float(((const uint8_t *)p)[i]);
    case COLL_FLOAT8_E5M2:
        return reduce_e5m2_to_float(((const uint8_t *)p)[i]);
    case COLL_COMPLEX64: /* the real part */
        return ((const float *)p)[2 * i];
    case COLL_COMPLEX128:
        return ((const double *)p)[2 * i];
    default:
        return ((const double *)p)[i];
    }
}

#endif
