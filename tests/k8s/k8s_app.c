/*
 * k8s_app.c: the application container of the Kubernetes end-to-end test
 * (tests/k8s/e2e.sh). It opens the group, waits until it is formed, and runs checked
 * allreduces (1024 floats of rank + 1; the sum is known) until the file STOP exists or
 * SECONDS pass. A retryable error closes the group and opens it again; anything else
 * ends the run. One line per event on stdout, with milliseconds since start:
 *
 *   <ms> formed epoch=E rank=R size=N
 *   <ms> ok n=K epoch=E            (every 5th success, and the first after a re-form)
 *   <ms> retryable code=C err="..." after_ok=K   (C: the coll_err)
 *   <ms> fatal err="..."
 *   <ms> done ok=K retried=M
 *
 * Usage: k8s_app SOCKET GROUP SECONDS STOPFILE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"

static double t0;

static double ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6 - t0;
}

#define SAY(...)                                                                                   \
    do {                                                                                           \
        printf("%.0f ", ms());                                                                     \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: k8s_app SOCKET GROUP SECONDS STOPFILE\n");
        return 2;
    }
    t0 = ms();
    const char *sock = argv[1], *name = argv[2], *stop = argv[4];
    double until = atof(argv[3]) * 1e3;
    enum { N = 1024 };
    coll_conn *c = NULL;
    coll_group *g = NULL;
    coll_buffer *b = NULL;
    long ok = 0, retried = 0, since = 0;
    int rc = 0;
    while (ms() < until && access(stop, F_OK) != 0) {
        coll_err e = COLL_OK;
        if (!c) {
            e = coll_connect(&c, sock, 2000);
            if (e != COLL_OK) {
                c = NULL;
                usleep(100 * 1000); /* the agent is not up yet */
                continue;
            }
            if ((e = coll_mem_alloc(&b, c, N * sizeof(float), COLL_DEVICE_HOST)) != COLL_OK) break;
        }
        if (!g) {
            e = coll_group_open(&g, c, name, COLL_SLOT_ANY);
            if (e == COLL_OK) e = coll_group_wait(g, 60000);
            if (e != COLL_OK && coll_err_retryable(e)) { /* the agent stops, or restarts */
                SAY("retryable code=%d err=\"%s\" after_ok=%ld", (int)e, coll_last_error(), ok);
                retried++;
                coll_group_close(&g);
                coll_mem_release(&b);
                coll_disconnect(&c);
                usleep(100 * 1000);
                continue;
            }
            if (e != COLL_OK) break;
            coll_group_info info;
            coll_group_info_get(g, &info);
            SAY("formed epoch=%u rank=%d size=%d", info.epoch, info.rank, info.size);
            since = 0;
        }
        coll_group_info info;
        coll_group_info_get(g, &info);
        float *x = coll_mem_ptr(b);
        for (int i = 0; i < N; i++)
            x[i] = (float)(info.rank + 1);
        coll_request r;
        e = coll_allreduce(g, x, x, N, COLL_FLOAT32, COLL_SUM, NULL, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        if (e == COLL_OK) {
            float want = (float)info.size * (float)(info.size + 1) / 2;
            for (int i = 0; i < N; i++)
                if (x[i] != want) {
                    SAY("fatal err=\"element %d is %g, expected %g\"", i, x[i], want);
                    rc = 1;
                    goto out;
                }
            ok++;
            since++;
            if (since == 1 || ok % 5 == 0) SAY("ok n=%ld epoch=%u", ok, info.epoch);
            usleep(20 * 1000);
            continue;
        }
        if (coll_err_retryable(e)) {
            SAY("retryable code=%d err=\"%s\" after_ok=%ld", (int)e, coll_last_error(), ok);
            retried++;
            coll_group_close(&g);
            if (e == COLL_ERR_AGENT_LOST) {
                coll_mem_release(&b);
                coll_disconnect(&c);
            }
            continue;
        }
        SAY("fatal err=\"%s\"", coll_last_error());
        rc = 1;
        goto out;
    }
    if (ms() < until && access(stop, F_OK) != 0) {
        SAY("fatal err=\"%s\"", coll_last_error());
        rc = 1;
    }
out:
    SAY("done ok=%ld retried=%ld", ok, retried);
    coll_group_close(&g);
    coll_mem_release(&b);
    coll_disconnect(&c);
    return rc;
}
