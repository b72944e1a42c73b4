/*
 * cpus.h: how many CPUs this process can keep busy, for libcoll's choice between
 * spinning and sleeping: its affinity mask, capped by its cgroup's CPU quota (cgroup v2
 * cpu.max, or v1 cpu.cfs_quota_us over cpu.cfs_period_us), which is what a container
 * with a CPU limit and no cpuset has. Compiled into libcoll and coll_proto (tests).
 */
#ifndef COLL_CPUS_H
#define COLL_CPUS_H

#include <sched.h>

/* CPUs this process can keep busy (at least 1). Reads /proc/self/cgroup and the
 * cgroup's quota files under /sys/fs/cgroup; any of them missing means no cap. */
int coll_usable_cpus(void);

/* The CPUs this thread may run on into out; where the kernel will not say, every CPU
 * (then no CPU is outside it) and -1. */
int coll_affinity(cpu_set_t *out);

/* Whether a thread last seen on cpu (-1: not known) is outside mask: a spin by a thread
 * bound to mask then never takes that thread's CPU. cpu may come from the other side of
 * a shared region: any value is checked against the mask's size, and an unknown or
 * impossible one is not outside. */
int coll_cpu_outside(const cpu_set_t *mask, int cpu);

/* The cap a quota of quota microseconds per period gives: CPUs rounded up, or 0 for
 * none (quota < 0, as v1 writes "no limit", or period <= 0). */
int coll_cpus_from_quota(long long quota, long long period);

/* The same from a cgroup v2 cpu.max line: "max 100000" (none, 0), "150000 100000" (2);
 * 0 for anything else. */
int coll_cpus_from_cpu_max(const char *line);

/* The cgroup v2 cap of a process in cgroup cg (as /proc/self/cgroup names it), with
 * cgroup2 mounted at mnt whose root is cgroup root (as /proc/self/mountinfo says): the
 * lowest cpu.max of cg and its ancestors up to the mount; 0 for none. */
int coll_cgroup2_cpus(const char *mnt, const char *root, const char *cg);

#endif
