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

int coll_cgroup2_cpus(const char *mnt, const char *root, const char *cg)
{
    /* cg is relative to our cgroup namespace's root, and so is the mount's root */
    const char *rel = cg;
    size_t rl = strlen(root);
    if (strcmp(root, "/") != 0) {
        if (strncmp(cg, root, rl) != 0 || (cg[rl] != '/' && cg[rl] != '\0')) return 0;
        rel = cg + rl;
    }
    if (rel[0] != '/' && rel[0] != '\0') return 0;
    if (strstr(rel, "/..")) return 0; /* outside the namespace: nothing we can read */
    char path[4200], line[64];
    size_t ml = strlen(mnt);
    snprintf(path, sizeof(path), "%s%s", mnt, strcmp(rel, "/") ? rel : "");
    int best = 0;
    for (;;) {
        size_t pl = strlen(path);
        snprintf(path + pl, sizeof(path) - pl, "/cpu.max");
        int n = read_line(path, line, sizeof(line)) == 0 ? coll_cpus_from_cpu_max(line) : 0;
        path[pl] = '\0';
        if (n > 0 && (best == 0 || n < best)) best = n;
        if (pl <= ml) break;
        char *slash = strrchr(path, '/');
        if (!slash || (size_t)(slash - path) < ml) break;
        *slash = '\0';
    }
    return best;
}

/* Where cgroup v2 is mounted and which cgroup is the mount's root (/proc/self/mountinfo:
 * "id parent major:minor root mountpoint options ... - cgroup2 source ..."). */
static int cgroup2_mount(char *mnt, size_t mcap, char *root, size_t rcap)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return -1;
    char line[4096];
    int found = -1;
    while (found < 0 && fgets(line, sizeof(line), f)) {
        char *dash = strstr(line, " - cgroup2 ");
        if (!dash) continue;
        char r[2048], m[2048];
        if (sscanf(line, "%*s %*s %*s %2047s %2047s", r, m) != 2) continue;
        snprintf(root, rcap, "%s", r);
        snprintf(mnt, mcap, "%s", m);
        found = 0;
    }
    fclose(f);
    return found;
}

/* Our cgroup's CPU quota as a CPU count, 0 if none is found. v2: the lowest quota of our
 * cgroup and its ancestors up to the mount's root (a Kubernetes limit may sit on the
 * container's cgroup or the pod's; with a cgroup namespace the mount's root is the
 * container's own cgroup). v1: our cgroup's quota. */
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
        *c1 = *c2 = '\0';
        const char *ctrls = c1 + 1, *cg = c2 + 1;
        if (!strcmp(line, "0") && !*ctrls) { /* v2 */
            char mnt[2048] = "/sys/fs/cgroup", root[2048] = "/";
            cgroup2_mount(mnt, sizeof(mnt), root, sizeof(root));
            cpus = coll_cgroup2_cpus(mnt, root, cg);
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

int coll_affinity(cpu_set_t *out)
{
    if (sched_getaffinity(0, sizeof(*out), out) == 0) return 0;
    for (int i = 0; i < CPU_SETSIZE; i++)
        CPU_SET(i, out);
    return -1;
}

int coll_cpu_outside(const cpu_set_t *mask, int cpu)
{
    return cpu >= 0 && cpu < CPU_SETSIZE && !CPU_ISSET(cpu, mask);
}
