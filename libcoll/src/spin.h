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
 * (agent/backends/tcp.h).
 *
 * The spin is pause instructions only, never sched_yield(2): a yield hands the CPU to any
 * runnable task, a nice-19 batch job included, which then keeps it until the scheduler's
 * next tick (milliseconds), while a sleeping thread that is woken preempts such a task
 * at once. Not thread-safe: one waiter per struct spin_adapt.
 */
#ifndef COLL_SPIN_H
#define COLL_SPIN_H

#include <stdint.h>

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

#endif
