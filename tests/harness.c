/*
 * harness.c: process helpers for the tests (see harness.h).
 */
#include "harness.h"

#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* COLL_TEST_FILTER=pattern runs only the matching tests of a file (cmocka globs). */
__attribute__((constructor)) static void filter_from_env(void)
{
    const char *f = getenv("COLL_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
}

double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

long proc_status(pid_t pid, pid_t tid, const char *key)
{
    char path[80], line[256];
    if (tid)
        snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)tid);
    else
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    size_t kl = strlen(key);
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, key, kl) && line[kl] == ':' && sscanf(line + kl + 1, "%ld", &v) == 1)
            break;
    if (f) fclose(f);
    return v;
}

int pin_to_cpu(int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof(one), &one);
}

void tmp_path(char *out, size_t cap, const char *what, int n)
{
    static int seq;
    snprintf(out, cap, "/tmp/coll-t%d-%d-%s%d", (int)getpid(), seq++, what, n);
}

static int can_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

/* Agents still running when the test process exits (a failed assertion jumps past
 * agent_stop) are killed, so no test leaves a process behind. */
#define MAX_LIVE 64
static pid_t live[MAX_LIVE];

static void kill_live(void)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] > 0) {
            kill(live[i], SIGKILL);
            waitpid(live[i], NULL, 0);
            live[i] = 0;
        }
}

static void track(pid_t pid, pid_t old)
{
    static int registered;
    if (!registered) {
        atexit(kill_live);
        registered = 1;
    }
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == old) {
            live[i] = pid;
            return;
        }
}

/* Whether port is free on 127.0.0.1 now. */
static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

int free_port(void)
{
    /* below the kernel's ephemeral range: a port from that range, free a moment ago, may
     * be the next one an agent's connection or data listener is given (a coordinator's
     * bind failed so under ThreadSanitizer) */
    static unsigned seed;
    static int given[256]; /* not twice in one test process */
    static unsigned ngiven;
    int lo = 32768, hi;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; lo > 12000 && tries < 1000; tries++) {
        int port = 10000 + (int)(rand_r(&seed) % (unsigned)(lo - 11000));
        int seen = 0;
        for (unsigned i = 0; i < ngiven && i < 256; i++)
            seen |= given[i] == port;
        if (seen || !port_free(port)) continue;
        given[ngiven++ % 256] = port;
        return port;
    }
    /* no room below the range: one the kernel picks */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(sa);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &l);
    close(fd);
    return ntohs(sa.sin_port);
}

int http_extra(char *extra, size_t cap, int port)
{
    int hport = free_port();
    while (hport == port)
        hport = free_port();
    snprintf(extra, cap, "http:\n  address: 127.0.0.1\n  port: %d\n", hport);
    return hport;
}

int http_get(const char *url, const char *file)
{
    char cmd[512], out[64];
    snprintf(cmd, sizeof(cmd), "curl -s -m 5 -o '%s' -w '%%{http_code}' '%s'", file, url);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int code = -1;
    if (fgets(out, sizeof(out), p)) code = atoi(out);
    pclose(p);
    return code;
}

/* coll_up_seconds of the /metrics text in file, or -1. */
static double up_seconds(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char line[512];
    double up = -1;
    while (up < 0 && fgets(line, sizeof(line), f))
        if (sscanf(line, "coll_up_seconds %lf", &up) != 1) up = -1;
    fclose(f);
    return up;
}

int metrics_fresh(int hport, const char *file, int ms)
{
    char url[96];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", hport);
    double first = -1, end = now_ms() + ms;
    do {
        if (http_get(url, file) == 200) {
            double up = up_seconds(file);
            if (first < 0)
                first = up;
            else if (up >= 0 && up != first)
                return 200; /* published after the first GET, which came after the call */
        }
        usleep(100 * 1000);
    } while (now_ms() < end);
    return -1;
}

int file_has(const char *file, const char *needle)
{
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

int metrics_parse(const char *file, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/tests/http/check_metrics.py %s",
             COLL_SOURCE_DIR, file);
    FILE *py = popen(cmd, "r");
    if (!py) return -1;
    size_t got = fread(out, 1, cap - 1, py);
    out[got] = 0;
    int rc = pclose(py);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

long metric_of(const char *out, const char *key)
{
    char want[128];
    snprintf(want, sizeof(want), "\n%s ", key); /* a whole line's name, not a suffix */
    size_t n = strlen(want);
    if (strncmp(out, want + 1, n - 1) == 0) return atol(out + n - 1);
    const char *p = strstr(out, want);
    return p ? atol(p + n) : -1;
}

int agent_start(struct agent *a, const char *agent_extra, const char *body)
{
    memset(a, 0, sizeof(*a));
    tmp_path(a->sock, sizeof(a->sock), "sock", 0);
    tmp_path(a->cfg, sizeof(a->cfg), "cfg", 0);
    tmp_path(a->log, sizeof(a->log), "log", 0);
    FILE *f = fopen(a->cfg, "w");
    if (!f) return -1;
    fprintf(f, "agent:\n  socket: %s\n  socket_mode: 0666\n%s%s", a->sock,
            agent_extra ? agent_extra : "", body ? body : "");
    fclose(f);
    return agent_spawn(a, NULL);
}

int agent_spawn(struct agent *a, char *const argv[])
{
    a->pid = fork();
    if (a->pid < 0) return -1;
    if (a->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(a->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (argv)
            execv(argv[0], argv);
        else
            execl(COLL_AGENT_PATH, "coll-agent", "--config", a->cfg, (char *)NULL);
        _exit(127);
    }
    track(a->pid, 0);
    /* generous: a loaded 2-core machine under a sanitizer starts an agent in well under
     * a second, and an agent that exits is seen at once */
    double deadline = now_ms() + 30000;
    const char *why = "its socket did not accept within 30 s";
    while (now_ms() < deadline) {
        if (can_connect(a->sock)) return 0;
        int st;
        if (waitpid(a->pid, &st, WNOHANG) == a->pid) {
            track(0, a->pid);
            a->pid = 0;
            why = "it exited";
            break;
        }
        usleep(2000);
    }
    /* say why, with the agent's own words */
    fprintf(stderr, "agent on %s did not start: %s; its log:\n", a->sock, why);
    FILE *f = fopen(a->log, "r");
    if (f) {
        char line[1024];
        for (int n = 0; n < 40 && fgets(line, sizeof(line), f); n++)
            fprintf(stderr, "  %s", line);
        fclose(f);
    }
    return -1;
}

int agent_stop(struct agent *a)
{
    if (a->pid <= 0) return -1;
    kill(a->pid, SIGTERM);
    int rc = child_wait(a->pid, 10000);
    track(0, a->pid);
    a->pid = 0;
    unlink(a->cfg);
    return rc >= 128 ? -1 : rc;
}

int agent_log_count(const struct agent *a, const char *needle)
{
    FILE *f = fopen(a->log, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

long agent_log_number(const struct agent *a, const char *event, const char *key)
{
    FILE *f = fopen(a->log, "r");
    if (!f) return -1;
    char line[4096], pat[64];
    long v = -1;
    snprintf(pat, sizeof(pat), " %s=", key);
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, event) ? strstr(line, pat) : NULL;
        if (p) v = strtol(p + strlen(pat), NULL, 10);
    }
    fclose(f);
    return v;
}

int agent_log_wait(const struct agent *a, const char *needle, int n, int ms)
{
    double deadline = now_ms() + ms;
    do {
        if (agent_log_count(a, needle) >= n) return 1;
        usleep(2000);
    } while (now_ms() < deadline);
    return 0;
}

pid_t child_run(int (*fn)(void *), void *arg)
{
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) _exit(fn(arg));
    return p;
}

int child_wait(pid_t pid, int ms)
{
    double deadline = now_ms() + ms;
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) return -1;
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return 128 + SIGKILL;
        }
        usleep(1000);
    }
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}
