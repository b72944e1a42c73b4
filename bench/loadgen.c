/*
 * loadgen.c: the background load bench/compare.sh runs its loaded rounds under, the
 * neighbours a Kubernetes node always has:
 *
 *   loadgen spin CPU          a busy loop pinned to CPU at nice 19 (batch work that
 *                             takes whatever CPU is left)
 *   loadgen duty PERCENT      a normal-priority neighbour, not pinned, busy PERCENT of
 *                             every 10 ms and asleep the rest (a web server, a sidecar)
 *
 * Runs until killed. Not part of the product.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "spin")) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(atoi(argv[2]), &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0 || setpriority(PRIO_PROCESS, 0, 19) != 0) {
            perror("loadgen spin");
            return 1;
        }
        for (volatile unsigned long x = 0;; x++) {
        }
    }
    if (argc == 3 && !strcmp(argv[1], "duty")) {
        long long period = 10000000LL, busy = period * atoi(argv[2]) / 100;
        for (;;) {
            long long t0 = now_ns();
            while (now_ns() - t0 < busy) {
            }
            struct timespec rest = {0, (long)(period - busy)};
            nanosleep(&rest, NULL);
        }
    }
    fprintf(stderr, "usage: loadgen spin CPU | loadgen duty PERCENT\n");
    return 2;
}
