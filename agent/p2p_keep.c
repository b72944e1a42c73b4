/*
 * p2p_keep.c: the buffers of early messages between pods (p2p.c), kept for the next
 * ones. A message that comes before its receive is read into memory of the agent's;
 * freed, glibc hands a large one back to the kernel (munmap, or a trim of the arena), and
 * the next is read into fresh pages, a fault per 4 KiB: the net thread of a pod whose 3
 * peers' 900 KB messages all came early spent 3 ms reading each and 2 ms copying it on,
 * and a 4-pod child's exchange of 896 KiB vectors took 10.7 ms, 3.1 with the buffers
 * kept (bench/RESULTS.md, "Sends and receives between pods"). A group keeps up to
 * P2P_KEEP buffers of 64 KiB to UNX_SMALL (sizes in powers of two), at most 4 MiB.
 */
#include <stdlib.h>

#include "net_priv.h"

#define KEEP_MIN (64u << 10) /* smaller ones come and go in the allocator's arena */

void *p2p_keep_take(struct ngroup *g, size_t bytes, size_t *cap)
{
    if (bytes < KEEP_MIN) {
        *cap = bytes;
        return malloc(bytes ? bytes : 1);
    }
    int best = -1;
    for (int i = 0; i < P2P_KEEP; i++)
        if (g->keep[i] && g->keep_cap[i] >= bytes &&
            (best < 0 || g->keep_cap[i] < g->keep_cap[best]))
            best = i;
    if (best >= 0) {
        void *p = g->keep[best];
        *cap = g->keep_cap[best];
        g->keep[best] = NULL;
        return p;
    }
    size_t c = KEEP_MIN;
    while (c < bytes)
        c *= 2;
    *cap = c;
    return malloc(c);
}

void p2p_keep_give(struct ngroup *g, void *p, size_t cap)
{
    if (p && cap >= KEEP_MIN && cap <= UNX_SMALL) {
        int slot = -1;
        for (int i = 0; i < P2P_KEEP && slot < 0; i++)
            if (!g->keep[i]) slot = i;
        if (slot < 0) /* none free: a larger one replaces the smallest */
            for (int i = 0; i < P2P_KEEP; i++)
                if (g->keep_cap[i] < cap && (slot < 0 || g->keep_cap[i] < g->keep_cap[slot]))
                    slot = i;
        if (slot >= 0) {
            free(g->keep[slot]);
            g->keep[slot] = p;
            g->keep_cap[slot] = cap;
            return;
        }
    }
    free(p);
}

void p2p_keep_free(struct ngroup *g)
{
    for (int i = 0; i < P2P_KEEP; i++) {
        free(g->keep[i]);
        g->keep[i] = NULL;
    }
}
