/*
 * util.h: the few helpers both sides use: the monotonic clock in nanoseconds and its
 * units. Internal (never installed); the agent includes it through coll_proto.
 */
#ifndef COLL_UTIL_H
#define COLL_UTIL_H

#include <stdint.h>
#include <time.h>

#define NS_PER_US 1000LL
#define NS_PER_MS 1000000LL
#define NS_PER_S 1000000000LL

/* CLOCK_MONOTONIC in nanoseconds: deadlines, spins, timings. */
static inline int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * NS_PER_S + t.tv_nsec;
}

#endif
