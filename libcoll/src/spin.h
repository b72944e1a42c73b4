/*
 * spin.h: how long to spin before sleeping, learnt per thing waited for (a peer's
 * bytes, the next op, the agent's answer), for the agent and libcoll alike.
 *
 * Spinning pays only when what we wait for is being produced on another CPU: then the
 * answer comes in microseconds, where a sleep costs a wake-up from another CPU (tens of
 * microseconds on the VMs measured, bench/RESULTS.md). When the producer needs our CPU
 * (a client and its agent on a one-CPU pod, two pods on one CPU) every microsecond spun
 * is a microsecond it cannot run, and only sleeping lets it run. Nobody can tell from
 * here which case holds, so each waiter learns it: a wait that ended while spinning
 * doubles the next spin (up to a cap), one that had to sleep halves it; at zero it sleeps
 * at once and, one wait in SPIN_PROBE_EVERY, spins SPIN_PROBE_NS (longer than a small
 * exchange takes, so that a producer on another CPU is noticed again) to learn anew.
 * What this cannot see is whom a spin keeps off the CPU while it ends "in time"; the
 * agent's exchanges therefore also measure a short cap against it, per op class
 * (agent/backends/tcp.h). Nor can it tell a peer late for want of our CPU from one late
 * because work outside the group took its own: where the rendezvous says no pod of the
 * group may run on ours, a direct op's waits spin their whole cap instead
 * (agent/backends/tcp.h: tcp_comm's spin_hold).
 *
 * Not thread-safe: one waiter per struct spin_adapt.
 *
 * Between looks the agent's spins yield the CPU (sched_yield(2)) while that is safe,
 * else pause (spin_relax; libcoll's pause only: the application's CPU is not ours to
 * lend). Where the producer shares our CPU (two pods' agents on one CPU) a pause keeps
 * it off and a sleep costs a wake-up each time, while a yield lets it run at once and
 * costs a context switch (4 pods on 2 CPUs, 8 B to 32 KiB: bench/RESULTS.md). But a
 * yield hands the CPU to any runnable task, a nice-19 batch job included, which then
 * keeps it until the scheduler's next tick: next to a nice-19 busy loop on one CPU, one
 * yield in about 190 took 3-4 ms and every other under 2 µs (a woken sleeper would have
 * preempted it at once; where the tick is shorter, each such slice is shorter and comes
 * as often). A long yield alone proves nothing: on a quiet node kernel threads take
 * the CPU for 0.6-4 ms a few times a second, and those would have run anyway. What marks
 * the batch job is that it comes back: a second long yield (SPIN_YIELD_LONG_NS) within
 * SPIN_YIELD_DENSE yields of the first (beside the busy loop every ~190th yield is one;
 * on a quiet node with 4 pods on 2 CPUs, one in some 20000) turns yielding off for the
 * whole process (every spinner sharing the struct spin_gate) for SPIN_YIELD_OFF_NS,
 * doubling up to SPIN_YIELD_OFF_MAX_NS while the node stays busy, and spins pause only,
 * as they did before yielding was tried. A busy node costs each agent two slices when it
 * starts and then two per SPIN_YIELD_OFF_MAX_NS at most.
 */
#ifndef COLL_SPIN_H
#define COLL_SPIN_H

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ring.h"
#include "util.h"

#define SPIN_PROBE_NS 30000
#define SPIN_PROBE_EVERY 16u
#define SPIN_MIN_NS 4000 /* below this, halving ends at zero */

struct spin_adapt {
    int32_t ns;      /* the spin budget of the next wait */
    uint32_t probes; /* waits at budget zero */
};

static inline void spin_init(struct spin_adapt *s, int32_t ns)
{
    s->ns = ns;
    s->probes = 0;
}

/* The budget of the wait that starts now, in ns (0: sleep at once). */
static inline int64_t spin_budget(struct spin_adapt *s)
{
    if (s->ns > 0) return s->ns;
    return ++s->probes % SPIN_PROBE_EVERY == 0 ? SPIN_PROBE_NS : 0;
}

/* A wait ended: while spinning (within its budget) or after sleeping. cap: the most
 * the budget may grow to (0: never spin). */
static inline void spin_learn(struct spin_adapt *s, int while_spinning, int32_t cap)
{
    if (while_spinning) {
        int64_t n = s->ns > 0 ? (int64_t)s->ns * 2 : SPIN_PROBE_NS;
        s->ns = (int32_t)(n > cap ? cap : n);
    } else {
        s->ns /= 2;
        if (s->ns < SPIN_MIN_NS) s->ns = 0;
    }
}

#define SPIN_YIELD_LONG_NS 500000LL    /* a yield this long: someone else ran a slice */
#define SPIN_YIELD_DENSE 2000u         /* ... and again within this many yields: close */
#define SPIN_YIELD_OFF_NS 4000000000LL /* closed this long at first */
#define SPIN_YIELD_OFF_MAX_NS 64000000000LL

/* Whether a process's spinners may yield; zeroed: they may. Thread-safe (each field on
 * its own; a race between two long yields blurs a count, nothing more). */
struct spin_gate {
    _Atomic int64_t closed_until; /* now_ns() before which spins pause only */
    _Atomic int64_t off_ns;       /* the last closing's length */
    _Atomic uint64_t yields;      /* yields so far */
    _Atomic uint64_t long_at;     /* ... when the last long one ended (0: none since opening) */
    _Atomic uint64_t closed;      /* how many times long yields closed it */
};

/* A yield took d ns, ending at t: close g where it is the second long yield within
 * SPIN_YIELD_DENSE (for SPIN_YIELD_OFF_NS, or twice the last closing up to
 * SPIN_YIELD_OFF_MAX_NS where it closes again within that long of reopening). */
static inline void spin_gate_note(struct spin_gate *g, int64_t d, int64_t t)
{
    uint64_t n = atomic_fetch_add_explicit(&g->yields, 1, memory_order_relaxed) + 1;
    if (d <= SPIN_YIELD_LONG_NS) return;
    uint64_t prev = atomic_exchange_explicit(&g->long_at, n, memory_order_relaxed);
    if (!prev || n - prev >= SPIN_YIELD_DENSE) return; /* a stray: a kernel thread's run */
    int64_t until = atomic_load_explicit(&g->closed_until, memory_order_relaxed);
    int64_t off = atomic_load_explicit(&g->off_ns, memory_order_relaxed);
    if (until && off && t - until < off)
        off = off * 2 > SPIN_YIELD_OFF_MAX_NS ? SPIN_YIELD_OFF_MAX_NS : off * 2;
    else
        off = SPIN_YIELD_OFF_NS;
    atomic_store_explicit(&g->off_ns, off, memory_order_relaxed);
    atomic_store_explicit(&g->closed_until, t + off, memory_order_relaxed);
    atomic_store_explicit(&g->long_at, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&g->closed, 1, memory_order_relaxed);
}

/* Whether a spin at now yields (g NULL: never). */
static inline int spin_yields(struct spin_gate *g, int64_t now)
{
    return g && now >= atomic_load_explicit(&g->closed_until, memory_order_relaxed);
}

/* One step of a spin that began no later than now (now_ns()): a yield if g allows
 * (NULL: pause only), else a pause. Returns now_ns() after it. */
static inline int64_t spin_relax(struct spin_gate *g, int64_t now)
{
    if (!spin_yields(g, now)) {
        ring_cpu_relax();
        return now_ns();
    }
    int64_t t0 = now_ns();
    sched_yield();
    int64_t t = now_ns();
    spin_gate_note(g, t - t0, t);
    return t;
}

#endif
