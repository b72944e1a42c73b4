/*
 * floors.c: the reference round trips between two bare processes, to set the
 * agent's latency against.
 *
 *   coll-floors [-n ITERS] [-G GAP_US] [-c CPU,CPU] [-S BYTES] [-x]
 *
 * -x runs shm_spin alone (two CPUs named): the round trip of one cache line between the
 * two CPUs, which on a VM says where the host has put its vCPUs (on the 2-vCPU VMs,
 * about 0.11 us and 0.48 us, changing while a run goes on: bench/RESULTS.md).
 * syscall:   one bare system call (getppid), for scale.
 * shm_spin:  both sides spin on a word in shared memory (left out when -c names one CPU
 *            twice: a side that never yields would hold it for a whole time slice).
 * shm_yield: the same, calling sched_yield(2) between looks: on one CPU, each round trip
 *            is two switches between processes.
 * eventfd:   both sides sleep in read(2) on an eventfd and wake the other by write(2).
 * epoll:     both sides sleep in epoll_wait(2) on an edge-triggered eventfd, as the agent
 *            and libcoll wait for each other's doorbells.
 * futex:     both sides sleep in FUTEX_WAIT on a shared word and wake the other with
 *            FUTEX_WAKE: the cheapest way for one process to sleep until another says so.
 * futex_thread: the same between two threads of one process (no address-space switch:
 *            what an agent running as a thread inside the application would pay).
 * tcp_swap:  both sides send 8 bytes and receive the other's 8 over one loopback TCP
 *            connection (non-blocking, looking again with a yield): what an 8-byte
 *            allreduce between two processes costs at the least over TCP.
 * tcp_send:  one side sends 48 bytes (a coll op header and 8 bytes of data) per round
 *            over loopback TCP, not waiting for an answer, while the other reads all it
 *            can; a round is one send (again after a yield when the socket is full).
 *            tcp_stream: the time per send of the whole stream, until the reader has
 *            every byte: what a 2-pod 8-byte broadcast whose root sends each op as it
 *            is submitted costs per op at the least, while the reader lags.
 *            tcp_feed: the same stream over 4 MiB buffers, read as a coll receiver that
 *            keeps up reads it (spinning on poll, up to 4 KiB a call): what each send
 *            costs while the reader's process runs on the other CPU (bench/RESULTS.md).
 * copy:      with two CPUs named, both sides copy 2 MiB, in step: a round ends when both
 *            have copied (two CPU-bound pods in a collective, for what a load on the node
 *            costs work that needs all of its CPU; the mean is the figure under a load
 *            that comes and goes).
 * tcp_swap_128K: with two CPUs named, both sides send 128 KiB and receive the other's
 *            over a loopback TCP connection of their own (4 MiB buffers, as coll's data
 *            connections), spinning: what a two-pod op of 128 KiB a pod each way (a 256
 *            KiB reduce_scatter's or allgather's) costs at the least, with no
 *            collective library in the way. -S BYTES runs only this, of BYTES each way
 *            (bench/phases.sh: on the 2-vCPU VM its median sits at one of two or three
 *            levels, changing from one fresh connection to the next).
 * -G sleeps GAP_US between round trips (the same gap coll-bench -G uses), so both
 * CPUs have gone idle when each round trip starts. -c pins the timing side to the first
 * CPU and its partner to the second (bench/latency.sh pins the agent and its client the
 * same way), so that both are measured across the same pair of CPUs. Prints p50 / p10 /
 * p90 and the mean in us.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int cpu_parent = -1, cpu_child = -1;

static void pin(int cpu)
{
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

/* Sleep until *w is v (FUTEX_WAIT while it is not), and set *to to v, waking its
 * sleeper: one half of a futex round trip. */
static void futex_until(_Atomic uint32_t *w, uint32_t v, int priv)
{
    uint32_t cur;
    while ((cur = atomic_load_explicit(w, memory_order_acquire)) != v)
        syscall(SYS_futex, w, priv ? FUTEX_WAIT_PRIVATE : FUTEX_WAIT, cur, NULL, NULL, 0);
}

static void futex_set(_Atomic uint32_t *w, uint32_t v, int priv)
{
    atomic_store_explicit(w, v, memory_order_release);
    syscall(SYS_futex, w, priv ? FUTEX_WAKE_PRIVATE : FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* Read an edge-triggered non-blocking eventfd, sleeping in epoll_wait until it has
 * something. */
static int epoll_take(int ep, int fd)
{
    uint64_t v;
    struct epoll_event ev;
    while (read(fd, &v, sizeof(v)) != sizeof(v)) {
        if (errno != EAGAIN) return -1;
        if (epoll_wait(ep, &ev, 1, -1) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

static int epoll_on(int fd)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) return -1;
    return ep;
}

struct futex_peer {
    _Atomic uint32_t *w; /* w[0]: the round the timing side started, w[1]: ended */
    int n;
};

static void *futex_thread_main(void *arg)
{
    struct futex_peer *fp = arg;
    pin(cpu_child);
    for (uint32_t i = 1; i <= (uint32_t)fp->n; i++) {
        futex_until(&fp->w[0], i, 1);
        futex_set(&fp->w[1], i, 1);
    }
    return NULL;
}

/* A connected pair of loopback TCP sockets, non-blocking, Nagle off. */
static int tcp_pair(int sv[2])
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    sv[0] = socket(AF_INET, SOCK_STREAM, 0);
    if (sv[0] < 0 || connect(sv[0], (struct sockaddr *)&sa, sizeof(sa)) != 0) return -1;
    sv[1] = accept(l, NULL, NULL);
    close(l);
    for (int k = 0; k < 2; k++) {
        if (sv[k] < 0) return -1;
        setsockopt(sv[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fcntl(sv[k], F_SETFL, O_NONBLOCK);
    }
    return 0;
}

/* Send n bytes of out on fd and receive the peer's n into in; between looks spin, or
 * yield (yield set). */
static int swap_bulk(int fd, const char *out, char *in, size_t n, int yield)
{
    size_t sent = 0, got = 0;
    while (sent < n || got < n) {
        ssize_t r = 0;
        if (sent < n && (r = send(fd, out + sent, n - sent, MSG_NOSIGNAL)) > 0)
            sent += (size_t)r;
        else if (r < 0 && errno != EAGAIN)
            return -1;
        if (got < n && (r = recv(fd, in + got, n - got, 0)) > 0)
            got += (size_t)r;
        else if (r == 0 || (r < 0 && errno != EAGAIN))
            return -1;
        if (yield && (sent < n || got < n)) sched_yield();
    }
    return 0;
}

/* Send 8 bytes on fd and receive the peer's 8, looking again with a yield. */
static int swap8(int fd)
{
    uint64_t out = 1, in;
    return swap_bulk(fd, (const char *)&out, (char *)&in, 8, 1);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *lat, int n, long gap)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += lat[i];
    qsort(lat, (size_t)n, sizeof(double), cmp);
    printf("floor %-12s gap_us=%-6ld p50_us=%.2f p10_us=%.2f p90_us=%.2f mean_us=%.2f\n", name, gap,
           lat[n / 2], lat[n / 10], lat[(n * 9) / 10], sum / n);
}

/* n round trips of swap_bulk of bytes each way, over a connection set up as two pods set
 * up theirs: the partner, on cpu_child, connects from its own socket; we accept on
 * ours; each sets no Nagle and 4 MiB buffers once connected (agent/dataconn.c). Reported
 * as tcp_swap_<KiB>K. */
static int bulk_floor(double *lat, int n, size_t bytes, long gap)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), buf = 4 << 20, one = 1,
        yield = cpu_parent == cpu_child;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    char *mem = malloc(2 * bytes), name[32];
    if (!mem || l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    memset(mem, 1, 2 * bytes);
    int warm = n / 10 > 10 ? n / 10 : 10;
    pid_t p = fork();
    int fd = -1;
    if (p == 0) {
        pin(cpu_child);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) _exit(1);
    } else if (p < 0 || (fd = accept(l, NULL, NULL)) < 0) {
        return -1;
    }
    close(l);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (p == 0) {
        for (int i = 0; i < warm + n; i++)
            if (swap_bulk(fd, mem, mem + bytes, bytes, yield) != 0) _exit(1);
        _exit(0);
    }
    for (int i = -warm; i < n; i++) {
        if (gap && i >= 0) usleep((useconds_t)gap);
        double t0 = now_us();
        if (swap_bulk(fd, mem, mem + bytes, bytes, yield) != 0) return -1;
        if (i >= 0) lat[i] = now_us() - t0;
    }
    int st;
    if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    close(fd);
    free(mem);
    snprintf(name, sizeof name, "tcp_swap_%zuK", bytes >> 10);
    report(name, lat, n, gap);
    return 0;
}

/* n rounds: in each both sides copy COPY_BYTES (buffers of their own), and the round
 * ends when both have (w[0]: the round started, w[1]: the round the other side ended). */
#define COPY_BYTES ((size_t)2 << 20)
static int copy_floor(double *lat, int n, _Atomic uint32_t *w)
{
    char *buf = malloc(2 * COPY_BYTES);
    if (!buf) return -1;
    memset(buf, 1, 2 * COPY_BYTES);
    atomic_store(&w[0], 0);
    atomic_store(&w[1], 0);
    pid_t p = fork();
    if (p == 0) {
        pin(cpu_child);
        for (uint32_t i = 1; i <= (uint32_t)n; i++) {
            while (atomic_load_explicit(&w[0], memory_order_acquire) != i)
                ;
            memcpy(buf + COPY_BYTES, buf, COPY_BYTES);
            atomic_store_explicit(&w[1], i, memory_order_release);
        }
        _exit(0);
    }
    for (uint32_t i = 1; i <= (uint32_t)n; i++) {
        double t0 = now_us();
        atomic_store_explicit(&w[0], i, memory_order_release);
        memcpy(buf + COPY_BYTES, buf, COPY_BYTES);
        while (atomic_load_explicit(&w[1], memory_order_acquire) != i)
            ;
        lat[i - 1] = now_us() - t0;
    }
    waitpid(p, NULL, 0);
    free(buf);
    return 0;
}

/* tcp_feed: the stream of tcp_stream over a connection of coll's data connections'
 * buffers (4 MiB), read as a coll receiver that keeps up reads it: spinning on poll(2)
 * with a zero timeout and taking up to 4 KiB a call (tcp.h: TCP_STASH_BYTES). The time
 * per send until the reader has every byte, or -1. */
static double feed_floor(int n, int cpu_reader)
{
    int sv[2], buf = 4 << 20;
    if (tcp_pair(sv) != 0) return -1;
    for (int k = 0; k < 2; k++) {
        setsockopt(sv[k], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
        setsockopt(sv[k], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    }
    pid_t p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        pin(cpu_reader);
        char b[4096];
        size_t want = (size_t)n * 48, got = 0;
        struct pollfd pf = {.fd = sv[1], .events = POLLIN};
        while (got < want) {
            while (poll(&pf, 1, 0) == 0) {
            }
            ssize_t r = recv(sv[1], b, sizeof(b), 0);
            if (r > 0)
                got += (size_t)r;
            else if (r == 0 || errno != EAGAIN)
                _exit(1);
        }
        if (send(sv[1], "k", 1, MSG_NOSIGNAL) != 1) _exit(1);
        _exit(0);
    }
    char msg[48] = {1};
    double s0 = now_us();
    for (int i = 0; i < n; i++) {
        size_t sent = 0;
        while (sent < sizeof(msg)) {
            ssize_t r = send(sv[0], msg + sent, sizeof(msg) - sent, MSG_NOSIGNAL);
            if (r > 0)
                sent += (size_t)r;
            else if (r < 0 && errno != EAGAIN)
                return -1;
            else
                sched_yield();
        }
    }
    for (char k;;) {
        ssize_t r = recv(sv[0], &k, 1, 0);
        if (r == 1) break;
        if (r == 0 || errno != EAGAIN) return -1;
        sched_yield();
    }
    double per = (now_us() - s0) / n;
    int st = 0;
    waitpid(p, &st, 0);
    close(sv[0]);
    close(sv[1]);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? per : -1;
}

int main(int argc, char **argv)
{
    int n = 2000;
    long gap = 0;
    int c;
    long bulk = 0;
    int only_spin = 0;
    while ((c = getopt(argc, argv, "n:G:c:S:x")) != -1) {
        if (c == 'x')
            only_spin = 1;
        else if (c == 'n')
            n = atoi(optarg);
        else if (c == 'S' && (bulk = atol(optarg)) >= 1024 && bulk <= (64L << 20) &&
                 bulk % 1024 == 0)
            ;
        else if (c == 'G')
            gap = atol(optarg);
        else if (c == 'c' && sscanf(optarg, "%d,%d", &cpu_parent, &cpu_child) == 2)
            ;
        else {
            fprintf(stderr,
                    "usage: coll-floors [-n ITERS] [-G GAP_US] [-c CPU,CPU] [-S BYTES] [-x]\n"
                    "  (-S: a multiple of 1024 from 1 KiB to 64 MiB; -x: two CPUs)\n");
            return 2;
        }
    }
    if (only_spin && (cpu_parent < 0 || cpu_child < 0 || cpu_parent == cpu_child)) {
        fprintf(stderr, "coll-floors: -x needs two CPUs (-c CPU,CPU)\n");
        return 2;
    }
    /* Every line out before the next fork: a child's _exit flushes its copy of a pending
     * buffer under ThreadSanitizer, which printed lines twice (CI: "not one tcp_stream"). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    pin(cpu_parent);
    if (n < 10) n = 10;
    double *lat = calloc((size_t)n, sizeof(double));
    _Atomic uint32_t *w =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!lat || w == MAP_FAILED) return 1;
    if (bulk) {
        int rc = bulk_floor(lat, n, (size_t)bulk, gap) == 0 ? 0 : 1;
        free(lat);
        return rc;
    }

    for (int i = 0; !only_spin && i < n; i++) {
        double t0 = now_us();
        for (int k = 0; k < 100; k++)
            syscall(SYS_getppid);
        lat[i] = (now_us() - t0) / 100;
    }
    if (!only_spin) report("syscall", lat, n, 0);

    /* shared-memory spin, then the same with a yield between looks */
    for (int yield = cpu_parent >= 0 && cpu_parent == cpu_child; yield < 2 - only_spin; yield++) {
        atomic_store(w, 0);
        pid_t p = fork();
        if (p == 0) {
            pin(cpu_child);
            for (uint32_t i = 0; i < (uint32_t)n; i++) {
                while (atomic_load_explicit(w, memory_order_acquire) != 2 * i + 1)
                    if (yield) sched_yield();
                atomic_store_explicit(w, 2 * i + 2, memory_order_release);
            }
            _exit(0);
        }
        for (uint32_t i = 0; i < (uint32_t)n; i++) {
            if (gap) usleep((useconds_t)gap);
            double t0 = now_us();
            atomic_store_explicit(w, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(w, memory_order_acquire) != 2 * i + 2)
                if (yield) sched_yield();
            lat[i] = now_us() - t0;
        }
        waitpid(p, NULL, 0);
        report(yield ? "shm_yield" : "shm_spin", lat, n, gap);
    }
    if (only_spin) {
        free(lat);
        return 0;
    }

    /* eventfd, both sides asleep */
    int a = eventfd(0, EFD_CLOEXEC), b = eventfd(0, EFD_CLOEXEC);
    pid_t p = fork();
    if (p == 0) {
        pin(cpu_child);
        uint64_t v;
        for (int i = 0; i < n; i++) {
            if (read(a, &v, 8) != 8) _exit(1);
            v = 1;
            if (write(b, &v, 8) != 8) _exit(1);
        }
        _exit(0);
    }
    for (int i = 0; i < n; i++) {
        uint64_t v = 1;
        if (gap) usleep((useconds_t)gap);
        double t0 = now_us();
        if (write(a, &v, 8) != 8 || read(b, &v, 8) != 8) return 1;
        lat[i] = now_us() - t0;
    }
    waitpid(p, NULL, 0);
    report("eventfd", lat, n, gap);

    /* the same asleep in epoll_wait, as the agent and libcoll wait */
    int ea = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), eb = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p = fork();
    if (p == 0) {
        pin(cpu_child);
        int ep = epoll_on(ea);
        uint64_t v = 1;
        for (int i = 0; i < n; i++)
            if (ep < 0 || epoll_take(ep, ea) != 0 || write(eb, &v, 8) != 8) _exit(1);
        _exit(0);
    }
    int ep = epoll_on(eb);
    for (int i = 0; i < n; i++) {
        uint64_t v = 1;
        if (gap) usleep((useconds_t)gap);
        double t0 = now_us();
        if (ep < 0 || write(ea, &v, 8) != 8 || epoll_take(ep, eb) != 0) return 1;
        lat[i] = now_us() - t0;
    }
    waitpid(p, NULL, 0);
    close(ep);
    report("epoll", lat, n, gap);

    /* futex on a shared word: between processes, then between two threads of one */
    for (int thr = 0; thr < 2; thr++) {
        atomic_store(&w[0], 0);
        atomic_store(&w[1], 0);
        struct futex_peer fp = {.w = w, .n = n};
        pthread_t th;
        if (thr) {
            if (pthread_create(&th, NULL, futex_thread_main, &fp) != 0) return 1;
        } else if ((p = fork()) == 0) {
            pin(cpu_child);
            for (uint32_t i = 1; i <= (uint32_t)n; i++) {
                futex_until(&w[0], i, 0);
                futex_set(&w[1], i, 0);
            }
            _exit(0);
        }
        for (uint32_t i = 1; i <= (uint32_t)n; i++) {
            if (gap) usleep((useconds_t)gap);
            double t0 = now_us();
            futex_set(&w[0], i, thr);
            futex_until(&w[1], i, thr);
            lat[i - 1] = now_us() - t0;
        }
        if (thr)
            pthread_join(th, NULL);
        else
            waitpid(p, NULL, 0);
        report(thr ? "futex_thread" : "futex", lat, n, gap);
    }

    int sv[2];
    if (tcp_pair(sv) != 0) return 1;
    p = fork();
    if (p == 0) {
        pin(cpu_child);
        for (int i = 0; i < n; i++)
            if (swap8(sv[1]) != 0) _exit(1);
        _exit(0);
    }
    for (int i = 0; i < n; i++) {
        if (gap) usleep((useconds_t)gap);
        double t0 = now_us();
        if (swap8(sv[0]) != 0) return 1;
        lat[i] = now_us() - t0;
    }
    waitpid(p, NULL, 0);
    report("tcp_swap", lat, n, gap);

    /* a stream of 48-byte sends, the other side reading; it says when it has them all */
    p = fork();
    if (p == 0) {
        pin(cpu_child);
        char buf[65536];
        size_t want = (size_t)n * 48, got = 0;
        while (got < want) {
            ssize_t r = recv(sv[1], buf, sizeof(buf), 0);
            if (r > 0)
                got += (size_t)r;
            else if (r == 0 || errno != EAGAIN)
                _exit(1);
            else
                sched_yield();
        }
        if (send(sv[1], "k", 1, MSG_NOSIGNAL) != 1) _exit(1);
        _exit(0);
    }
    char msg[48] = {1};
    double s0 = now_us();
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        size_t sent = 0;
        while (sent < sizeof(msg)) {
            ssize_t r = send(sv[0], msg + sent, sizeof(msg) - sent, MSG_NOSIGNAL);
            if (r > 0)
                sent += (size_t)r;
            else if (r < 0 && errno != EAGAIN)
                return 1;
            else
                sched_yield();
        }
        lat[i] = now_us() - t0;
    }
    for (char k;;) { /* the stream's end: the reader has every byte */
        ssize_t r = recv(sv[0], &k, 1, 0);
        if (r == 1) break;
        if (r == 0 || errno != EAGAIN) return 1;
        sched_yield();
    }
    double per = (now_us() - s0) / n;
    waitpid(p, NULL, 0);
    report("tcp_send", lat, n, 0);
    /* the rate the stream kept, until the reader had it all: one figure */
    printf("floor %-12s gap_us=%-6d p50_us=%.2f p10_us=%.2f p90_us=%.2f mean_us=%.2f\n",
           "tcp_stream", 0, per, per, per, per);
    close(sv[0]);
    close(sv[1]);
    per = feed_floor(n, cpu_child);
    if (per < 0) return 1;
    printf("floor %-12s gap_us=%-6d p50_us=%.2f p10_us=%.2f p90_us=%.2f mean_us=%.2f\n", "tcp_feed",
           0, per, per, per, per);

    if (cpu_parent >= 0 && cpu_child >= 0 && cpu_parent != cpu_child) {
        int nc = n / 4 > 100 ? n / 4 : 100; /* 20000: about half a second */
        if (copy_floor(lat, nc, w) != 0) return 1;
        report("copy", lat, nc, 0);
        if (bulk_floor(lat, nc, 128 << 10, 0) != 0) return 1;
    }
    free(lat);
    return 0;
}
