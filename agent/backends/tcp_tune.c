/*
 * tcp_tune.c: which spin an op class waits with, chosen by measuring (tcp.h).
 *
 * Every pod of an epoch sees the same ops in the same order, so an op's number within
 * its class is the same on every pod, and so is the way it tries: all pods try the
 * learnt spin together, then the short one together, which is what the choice is about
 * (one pod spinning shorter alone changes little when its neighbour still spins).
 * The choice itself is each pod's own (its own medians).
 */
#include "tcp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "net.h"

#define TRIAL (2 * TCP_TUNE_TURNS * TCP_TUNE_RUN) /* ops of one trial */

struct tune_class {
    uint32_t key;      /* tune_key; 0: free */
    uint32_t n;        /* ops of this class in the epoch so far */
    uint32_t trial_at; /* ... when the next trial starts */
    uint32_t trials;   /* ... and how many have been */
    uint64_t used;     /* the tuner's op count when last used (the least recent goes first) */
    uint8_t best;      /* the way kept: TCP_TUNE_LEARNT or TCP_TUNE_SHORT */
    uint8_t got[2];
    int64_t turn_t0;               /* the start of the turn under way */
    int64_t ns[2][TCP_TUNE_TURNS]; /* this trial's turns, first start to last end */
};

struct tcp_tune {
    struct tune_class c[TCP_TUNE_CLASSES];
    uint64_t ops;           /* in this epoch */
    uint64_t total[2];      /* ops by the way they waited, since the start (not reset) */
    struct tune_class *cur; /* the op under way ends a turn (NULL: not) */
    int way;                /* the op under way's (or the last one's) */
    int ok;                 /* every op of the turn under way went well */
};

struct tcp_tune *tcp_tune_new(void)
{
    return calloc(1, sizeof(struct tcp_tune));
}

void tcp_tune_reset(struct tcp_tune *tu)
{
    memset(tu->c, 0, sizeof(tu->c));
    tu->ops = 0;
    tu->cur = NULL;
}

void tcp_tune_counts(const struct tcp_tune *tu, uint64_t *learnt, uint64_t *shrt)
{
    *learnt = tu->total[TCP_TUNE_LEARNT];
    *shrt = tu->total[TCP_TUNE_SHORT];
}

/* kind and the op's size to a power of two: ops that differ less wait alike */
static uint32_t tune_key(const struct net_task *t)
{
    uint64_t bytes = (uint64_t)t->count * coll_dtype_size((coll_dtype)t->dtype);
    uint32_t lg = 63 - (uint32_t)__builtin_clzll(bytes | 1); /* floor(log2), 0 for 0 */
    return ((uint32_t)t->kind << 8 | lg) + 1;
}

static struct tune_class *tune_find(struct tcp_tune *tu, uint32_t key)
{
    struct tune_class *old = &tu->c[0];
    for (int i = 0; i < TCP_TUNE_CLASSES; i++) {
        if (tu->c[i].key == key) return &tu->c[i];
        if (tu->c[i].used < old->used) old = &tu->c[i];
    }
    /* new, or in the place of the least recently used (by op count: every pod picks
     * the same one, and the class starts again from its first op everywhere) */
    memset(old, 0, sizeof(*old));
    old->key = key;
    old->trial_at = TCP_TUNE_WARM;
    return old;
}

static int64_t median(int64_t *v, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: a handful */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int64_t x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return n ? v[n / 2] : 0;
}

int tcp_tune_start(struct tcp_tune *tu, const struct net_task *t, int64_t now)
{
    if (!tu) return TCP_TUNE_LEARNT;
    tu->cur = NULL;
    struct tune_class *k = tune_find(tu, tune_key(t));
    k->used = ++tu->ops;
    uint32_t i = k->n++;
    if (i < k->trial_at || i - k->trial_at >= TRIAL) {
        tu->total[k->best]++;
        return tu->way = k->best;
    }
    /* trying: turns of TCP_TUNE_RUN ops, each way in turn. A turn is timed whole, from
     * its first op's start to its last op's end: the gaps between ops count (a spin that
     * keeps a neighbour off the CPU shows there), and in a loop of ops every pod times
     * the same span, so that they tend to choose alike */
    uint32_t p = i - k->trial_at;
    int way = tu->way = (int)(p / TCP_TUNE_RUN % 2);
    tu->total[way]++;
    if (p % TCP_TUNE_RUN == 0) {
        k->turn_t0 = now;
        tu->ok = 1;
    }
    if (p % TCP_TUNE_RUN == TCP_TUNE_RUN - 1) tu->cur = k;
    return way;
}

int tcp_tune_way(const struct tcp_tune *tu)
{
    return tu ? tu->way : TCP_TUNE_LEARNT;
}

void tcp_tune_end(struct tcp_tune *tu, int ok, int64_t now)
{
    if (!tu) return;
    tu->ok &= ok != 0;
    struct tune_class *k = tu->cur;
    if (!k) return;
    tu->cur = NULL;
    if (tu->ok && k->got[tu->way] < TCP_TUNE_TURNS)
        k->ns[tu->way][k->got[tu->way]++] = now - k->turn_t0;
    if (k->n - k->trial_at != TRIAL) return;
    /* the trial's last op: the other way only where it is clearly faster (from the
     * learnt at first; a pod that changes alone slows the others) */
    if (k->got[0] && k->got[1]) {
        int64_t t[2] = {median(k->ns[0], k->got[0]), median(k->ns[1], k->got[1])};
        int other = !k->best;
        if (t[other] * 100 < t[k->best] * (100 - TCP_TUNE_MARGIN_PCT)) k->best = (uint8_t)other;
    }
    k->got[0] = k->got[1] = 0;
    /* the next trial: soon at first, then ever later */
    uint32_t keep = k->trials < 4 ? TCP_TUNE_KEEP >> (4 - k->trials) : TCP_TUNE_KEEP;
    k->trials++;
    k->trial_at = k->n + keep;
}
