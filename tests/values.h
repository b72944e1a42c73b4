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

static inline void val_put(void *p, size_t i, int dt, double v)
{
    switch (dt) {
    case COLL_INT8:
        ((int8_t *)p)[i] = (int8_t)v;
        break;
    case COLL_UINT8:
        ((uint8_t *)p)[i] = (uint8_t)v;
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
    }
}

static inline double val_get(const void *p, size_t i, int dt)
{
    switch (dt) {
    case COLL_INT8:
        return ((const int8_t *)p)[i];
    case COLL_UINT8:
        return ((const uint8_t *)p)[i];
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
    default:
        return ((const double *)p)[i];
    }
}

#endif
