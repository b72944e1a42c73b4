/*
 * metrics.h: the texts of the operational endpoints (/metrics, /readyz), rendered by
 * the engine thread from its own state; http.h serves the last ones published.
 */
#ifndef AGENT_METRICS_H
#define AGENT_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct group;

struct metrics_in {
    const struct group *groups;
    int ngroups;
    int sessions;
    uint64_t sessions_opened;
    uint64_t yield_closed;            /* the agent's spin gate closings (spin.h) */
    uint64_t waits_spun, waits_slept; /* the engine's waits for work, by how they ended */
    int draining;
    unsigned ops_in_flight; /* submitted to the agent by its sessions, not yet done */
    int gpu_imports;
    double up_s;
};

/* The Prometheus text (format 0.0.4) into buf; returns its length (cut at cap). */
size_t metrics_render(const struct metrics_in *in, char *buf, size_t cap);
/* /readyz?verbose: one line per check ("[+] group g: formed", "[-] group train: not
 * formed: waiting for node indexes 2,3; DNS shows 3 of 4 pods"; the server adds the
 * verdict); *failing: the checks that fail, READYZ_POD (stopping, or a group that
 * cannot run here) and READYZ_FORMED (a group not formed). */
size_t metrics_readyz(const struct metrics_in *in, char *buf, size_t cap, unsigned *failing);

#endif
