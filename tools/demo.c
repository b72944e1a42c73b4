/*
 * demo.c: the main job's application side. Forks N application processes that each
 * attach to the agent through libcoll, take a slot of one group, run collectives on
 * shared host buffers, check every element against the expected value and print
 * (from rank 0) the time and bandwidth of each op.
 *
 *   coll-demo [-n PROCS] [-g GROUP] [-s SOCKET[,SOCKET...]] [-e MAX_BYTES] [-i ITERS]
 *
 * With several sockets (one per agent, i.e. per pod), process i attaches to socket
 * i % count: that is how the main job puts one application on each of four agents.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        coll_err e_ = (call);                                                                      \
        if (e_ != COLL_OK) {                                                                       \
            fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, coll_strerror(e_),       \
                    coll_last_error());                                                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int run_rank(const char *sock, const char *group, size_t max_bytes, int iters)
{
    int rank = -1;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, sock, 5000));
    CHECK(coll_group_open(&g, c, group, COLL_SLOT_ANY));
    coll_group_info info;
    coll_group_info_get(g, &info);
    rank = info.rank;
    int n = info.size;
    if (rank == 0)
        printf("group '%s': %d ranks on %d pod(s), backend %s, epoch %u\n\n"
               "%-15s %12s %12s %12s %10s %8s\n",
               info.name, n, info.nodes, info.backend, info.epoch, "op", "bytes", "time(us)",
               "algbw(GB/s)", "busbw", "check");
    size_t maxc = max_bytes / sizeof(float);
    coll_buffer *sb, *rb;
    CHECK(coll_mem_alloc(&sb, c, maxc * sizeof(float) * (size_t)n, COLL_DEVICE_HOST));
    CHECK(coll_mem_alloc(&rb, c, maxc * sizeof(float) * (size_t)n, COLL_DEVICE_HOST));
    float *s = coll_mem_ptr(sb), *r = coll_mem_ptr(rb);
    const char *ops[] = {"allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall"};
    int failures = 0;
    for (int o = 0; o < 5; o++) {
        for (size_t count = 256; count <= maxc; count *= 16) {
            coll_request req;
            double best = 1e30;
            long wrong = 0;
            for (int it = 0; it < iters; it++) {
                size_t total = count * (size_t)n;
                for (size_t i = 0; i < total; i++)
                    s[i] = (float)(rank + 1) + (float)(i % 7);
                memset(r, 0, total * sizeof(float));
                CHECK(coll_barrier(g, NULL, &req));
                CHECK(coll_wait(c, req, -1));
                double t0 = now_us();
                switch (o) {
                case 0:
                    CHECK(coll_allreduce(g, s, r, count, COLL_FLOAT32, COLL_SUM, NULL, &req));
                    break;
                case 1:
                    CHECK(coll_allgather(g, s, r, count, COLL_FLOAT32, NULL, &req));
                    break;
                case 2:
                    CHECK(coll_broadcast(g, s, r, count, COLL_FLOAT32, 0, NULL, &req));
                    break;
                case 3:
                    CHECK(coll_reduce_scatter(g, s, r, count, COLL_FLOAT32, COLL_SUM, NULL, &req));
                    break;
                default:
                    CHECK(coll_alltoall(g, s, r, count / (size_t)n ? count / (size_t)n : 1,
                                        COLL_FLOAT32, NULL, &req));
                    break;
                }
                CHECK(coll_wait(c, req, -1));
                double dt = now_us() - t0;
                if (dt < best) best = dt;
                float sumr = (float)(n * (n + 1) / 2);
                size_t per = count / (size_t)n ? count / (size_t)n : 1;
                for (size_t i = 0; i < count; i++) {
                    float want;
                    switch (o) {
                    case 0:
                        want = sumr + (float)n * (float)(i % 7);
                        break;
                    case 1:
                        want = 0; /* checked below over the whole receive buffer */
                        break;
                    case 2:
                        want = 1.0f + (float)(i % 7);
                        break;
                    case 3:
                        want = sumr + (float)n * (float)((i + (size_t)rank * count) % 7);
                        break;
                    default:
                        if (i >= per * (size_t)n) continue;
                        want = (float)(i / per + 1) + (float)(((size_t)rank * per + i % per) % 7);
                        break;
                    }
                    if (o != 1 && r[i] != want) wrong++;
                }
                if (o == 1)
                    for (size_t i = 0; i < count * (size_t)n; i++)
                        if (r[i] != (float)(i / count + 1) + (float)((i % count) % 7)) wrong++;
            }
            size_t bytes = count * sizeof(float);
            double factor = o == 0 ? 2.0 * (n - 1) / n : (o == 2 ? 1.0 : (double)(n - 1) / n);
            double algbw = (double)bytes / best / 1e3;
            if (wrong) failures++;
            if (rank == 0)
                printf("%-15s %12zu %12.1f %12.3f %10.3f %8s\n", ops[o], bytes, best, algbw,
                       algbw * factor, wrong ? "WRONG" : "ok");
        }
    }
    coll_mem_release(&sb);
    coll_mem_release(&rb);
    coll_group_close(&g);
    coll_disconnect(&c);
    fflush(stdout);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    int procs = 4, iters = 5;
    const char *group = "demo", *sock = NULL;
    size_t max_bytes = 4u << 20;
    int o;
    while ((o = getopt(argc, argv, "n:g:s:e:i:h")) != -1) {
        switch (o) {
        case 'n':
            procs = atoi(optarg);
            break;
        case 'g':
            group = optarg;
            break;
        case 's':
            sock = optarg;
            break;
        case 'e':
            max_bytes = strtoull(optarg, NULL, 0);
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: coll-demo [-n PROCS] [-g GROUP] [-s SOCKET] [-e MAX_BYTES] "
                            "[-i ITERS]\n");
            return 2;
        }
    }
    if (procs < 1 || procs > 64 || iters < 1 || max_bytes < 1024) {
        fprintf(stderr, "coll-demo: bad arguments\n");
        return 2;
    }
    char *socks[64];
    int nsocks = 0;
    char *list = sock ? strdup(sock) : NULL, *save = NULL;
    for (char *t = list ? strtok_r(list, ",", &save) : NULL; t && nsocks < 64;
         t = strtok_r(NULL, ",", &save))
        socks[nsocks++] = t;
    pid_t pids[64];
    fflush(stdout);
    for (int i = 0; i < procs; i++) {
        pids[i] = fork();
        if (pids[i] == 0)
            _exit(run_rank(nsocks ? socks[i % nsocks] : NULL, group, max_bytes, iters));
    }
    int bad = 0;
    for (int i = 0; i < procs; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    }
    printf("\n%d application processes on %d agent(s), %d failed: %s\n", procs, nsocks ? nsocks : 1,
           bad, bad ? "FAILED" : "all results verified");
    free(list);
    return bad ? 1 : 0;
}
