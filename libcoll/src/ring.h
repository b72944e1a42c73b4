/*
 * ring.h: the memory-ordering rules of the shared rings, in one place for both
 * sides. A producer fills an entry, then publishes the index with release; a
 * consumer loads the index with acquire, then reads entries. Before deciding whether
 * to ring a doorbell the producer issues a full fence and loads the other side's
 * sleeping word; before sleeping the consumer stores that word, fences, and looks at
 * the ring once more. One of the two always sees the other (Dekker), so no wake-up
 * is lost.
 */
#ifndef COLL_RING_H
#define COLL_RING_H

#include <stdatomic.h>
#include <stdint.h>

#include "wire.h"

#define RING_MASK (WIRE_RING_ENTRIES - 1u)

static inline void ring_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Whether entry n (counting from 0) of a ring has been published. */
static inline int ring_ready(_Atomic uint32_t *seq, uint32_t n)
{
    return atomic_load_explicit(seq, memory_order_acquire) == n + 1;
}

static inline void ring_publish(_Atomic uint32_t *seq, uint32_t n)
{
    atomic_store_explicit(seq, n + 1, memory_order_release);
}

static inline uint32_t ring_load_acquire(struct wire_ring_idx *i)
{
    return atomic_load_explicit(&i->v, memory_order_acquire);
}

static inline void ring_store_release(struct wire_ring_idx *i, uint32_t v)
{
    atomic_store_explicit(&i->v, v, memory_order_release);
}

/* A full barrier between a store and a load of different words. TSan does not model
 * fences (and refuses to compile them), so its builds use a seq_cst read-modify-write
 * on a private word, which orders the same way on every target it supports. */
/* Raise a 64-bit stream-order word (wire_shm ready/done) to v, never lowering it
 * (wrap-safe comparison): late or repeated stores from either side are harmless. */
static inline void ring_store_max64(_Atomic uint64_t *w, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(w, memory_order_acquire);
    while ((int64_t)(cur - v) < 0 && !atomic_compare_exchange_weak_explicit(
                                         w, &cur, v, memory_order_release, memory_order_acquire))
        ;
}

static inline void ring_full_fence(void)
{
#if defined(__SANITIZE_THREAD__)
    static _Atomic uint32_t fence_word;
    atomic_fetch_add_explicit(&fence_word, 0, memory_order_seq_cst);
#else
    atomic_thread_fence(memory_order_seq_cst);
#endif
}

/* Say in i (our side's sleeping word) that we run on cpu (sched_getcpu(); < 0: not
 * known, nothing said). Stores only when it changed, so a pinned side writes the line
 * once. */
static inline void ring_say_cpu(struct wire_ring_idx *i, int cpu)
{
    if (cpu < 0) return;
    uint32_t v = (uint32_t)cpu + 1;
    if (atomic_load_explicit(&i->cpu, memory_order_relaxed) != v)
        atomic_store_explicit(&i->cpu, v, memory_order_relaxed);
}

/* The CPU the other side said it last ran on, from its sleeping word (-1: not said). */
static inline int ring_peer_cpu(struct wire_ring_idx *i)
{
    uint32_t v = atomic_load_explicit(&i->cpu, memory_order_relaxed);
    return v && v <= (uint32_t)INT32_MAX ? (int)(v - 1) : -1;
}

/* After publishing: does the other side need its doorbell rung? */
static inline int ring_peer_sleeping(struct wire_ring_idx *sleeping)
{
    ring_full_fence();
    return atomic_load_explicit(&sleeping->v, memory_order_relaxed) != 0;
}

#endif
