/*
 * cpus.c: see cpus.h.
 */
#include "cpus.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int coll_cpus_from_quota(long long quota, long long period)
{
    if (quota <= 0 || period <= 0) return 0;
    long long n = (quota + period - 1) / period;
    return n > 1 << 20 ? 1 << 20 : (int)n;
}

int coll_cpus_from_cpu_max(const char *line)
{
    char q[32];
    long long period;
    if (!line || sscanf(line, "%31s %lld", q, &period) != 2 || !strcmp(q, "max")) return 0;
    char *end;
    long long quota = strtoll(q, &end, 10);
    return *end ? 0 : coll_cpus_from_quota(quota, period);
}

static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    return ok ? 0 : -1;
}

/* Our cgroup's CPU quota as a CPU count, 0 if none is found. */
static int cgroup_cpus(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[4096], path[4200], a[64], b[64];
    int cpus = 0;
    while (!cpus && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        /* "hierarchy-id:controller-list:path" */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1, *cg = c2 + 1;
        if (!strcmp(line, "0") && !*ctrls) { /* v2 */
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/cpu.max", cg);
            if (read_line(path, a, sizeof(a)) == 0) cpus = coll_cpus_from_cpu_max(a);
            continue;
        }
        int has_cpu = 0; /* v1: is "cpu" in the controller list? */
        for (const char *s = ctrls; *s;) {
            size_t n = strcspn(s, ",");
            if (n == 3 && !strncmp(s, "cpu", 3)) has_cpu = 1;
            s += n + (s[n] == ',');
        }
        if (!has_cpu) continue;
        const char *mounts[] = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
        for (int m = 0; m < 2 && !cpus; m++) {
            snprintf(path, sizeof(path), "%s%s/cpu.cfs_quota_us", mounts[m], cg);
            if (read_line(path, a, sizeof(a)) != 0) continue;
            snprintf(path, sizeof(path), "%s%s/cpu.cfs_period_us", mounts[m], cg);
            if (read_line(path, b, sizeof(b)) != 0) continue;
            cpus = coll_cpus_from_quota(atoll(a), atoll(b));
        }
    }
    fclose(f);
    return cpus;
}

int coll_usable_cpus(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    int cap = cgroup_cpus();
    if (cap > 0 && cap < n) n = cap;
    return n > 0 ? n : 1;
}
