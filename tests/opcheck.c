/*
 * opcheck.c: one application rank that runs every op x dtype x reduction through its
 * agent and checks each result element against a reference computed from every
 * rank's (deterministic) input. Shared by test_ops (one pod) and test_multi (several
 * pods): inputs and expectations depend only on the global rank and the group size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "opcheck.h"
#include "reduce.h"
#include "values.h"

static const size_t counts[] = {0, 1, 7, 4097, 20011};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))
#define MAXC 20011
#define GUARD 0xEE


static double val(int rank, size_t i, int redop)
{
    if (redop == COLL_PROD) return 1 + (double)((rank + i) % 2);
    return (double)((rank * 3 + i * 5) % 4);
}

static int is_int(int dt)
{
    return dt <= COLL_UINT64;
}

static double expect_red(int n, size_t i, int redop, int dt)
{
    double acc = val(0, i, redop);
    for (int k = 1; k < n; k++) {
        double v = val(k, i, redop);
        switch (redop) {
        case COLL_PROD: acc *= v; break;
        case COLL_MIN: acc = v < acc ? v : acc; break;
        case COLL_MAX: acc = v > acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (redop == COLL_AVG) acc = is_int(dt) ? (double)((long long)acc / n) : acc / n;
    return acc;
}

static int close_enough(double got, double want, int dt)
{
    double tol = 0;
    if (dt == COLL_FLOAT16) tol = 1e-3;
    if (dt == COLL_BFLOAT16) tol = 8e-3;
    if (dt == COLL_FLOAT32) tol = 1e-6;
    if (dt == COLL_FLOAT64) tol = 1e-12;
    double d = got - want;
    if (d < 0) d = -d;
    return d <= tol * (want < 0 ? -want : want) + (tol ? 1e-30 : 0);
}

struct ctx {
    coll_conn *c;
    coll_group *g;
    int rank, n;
    unsigned char *S, *R;
    int failures;
};

static void report(struct ctx *x, const char *what, int kind_dt, size_t count, int inplace,
                   size_t i, double got, double want)
{
    if (x->failures++ < 5)
        fprintf(stderr, "rank %d: %s dtype=%s count=%zu inplace=%d: element %zu is %g, want %g\n",
                x->rank, what, coll_dtype_name(kind_dt), count, inplace, i, got, want);
}

static int guard_ok(const unsigned char *p, size_t off)
{
    return p[off] == GUARD;
}

/* One op with one dtype, count, reduction and placement; checks the result. */
static int run_one(struct ctx *x, int kind, int dt, int redop, size_t count, int inplace, int root)
{
    size_t es = coll_dtype_size(dt);
    int n = x->n, rank = x->rank;
    memset(x->S, 0, (size_t)MAXC * (size_t)n * 8);
    memset(x->R, GUARD, (size_t)MAXC * (size_t)n * 8 + 64);
    unsigned char *send = x->S, *recv = x->R;
    size_t in_elems = count;
    if (kind == 4 || kind == 5) in_elems = count * (size_t)n; /* reduce_scatter, alltoall */
    /* where this rank's input goes */
    unsigned char *in = send;
    if (inplace) {
        in = recv;
        if (kind == 3) in = recv + (size_t)rank * count * es; /* allgather */
        send = in;
        if (kind == 4) recv = x->R + (size_t)rank * count * es; /* reduce_scatter */
    }
    for (size_t i = 0; i < in_elems; i++)
        val_put(in, i, dt, val(rank, i, redop));
    coll_request req, req2;
    coll_err e;
    const void *sp = count ? send : NULL;
    void *rp = count ? recv : NULL;
    const char *names[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                           "alltoall", "sendrecv", "barrier"};
    switch (kind) {
    case 0: e = coll_allreduce(x->g, sp, rp, count, dt, redop, NULL, &req); break;
    case 1: e = coll_broadcast(x->g, sp, rp, count, dt, root, NULL, &req); break;
    case 2: e = coll_reduce(x->g, sp, rp, count, dt, redop, root, NULL, &req); break;
    case 3: e = coll_allgather(x->g, sp, rp, count, dt, NULL, &req); break;
    case 4: e = coll_reduce_scatter(x->g, sp, rp, count, dt, redop, NULL, &req); break;
    case 5: e = coll_alltoall(x->g, sp, rp, count, dt, NULL, &req); break;
    case 6:
        e = coll_send(x->g, sp, count, dt, (rank + 1) % n, NULL, &req);
        if (e == COLL_OK) e = coll_recv(x->g, rp, count, dt, (rank + n - 1) % n, NULL, &req2);
        if (e == COLL_OK) e = coll_wait(x->c, req2, 60000);
        break;
    default: e = coll_barrier(x->g, NULL, &req); break;
    }
    if (e == COLL_OK) e = coll_wait(x->c, req, 60000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: %s dtype=%s count=%zu: %s (%s)\n", rank, names[kind],
                coll_dtype_name(dt), count, coll_strerror(e), coll_last_error());
        x->failures++;
        return -1;
    }
    size_t out_elems = count;
    if (kind == 3 || kind == 5) out_elems = count * (size_t)n;
    if (kind == 7 || (kind == 2 && rank != root)) return 0;
    for (size_t i = 0; i < out_elems; i++) {
        double want;
        switch (kind) {
        case 0:
        case 2: want = expect_red(n, i, redop, dt); break;
        case 1: want = val(root, i, redop); break;
        case 3: want = val((int)(i / count), i % count, redop); break;
        case 4: want = expect_red(n, (size_t)rank * count + i, redop, dt); break;
        case 5: want = val((int)(i / count), (size_t)rank * count + i % count, redop); break;
        default: want = val((rank + n - 1) % n, i, redop); break;
        }
        double got = val_get(recv, i, dt);
        if (!close_enough(got, want, dt)) {
            report(x, names[kind], dt, count, inplace, i, got, want);
            return -1;
        }
    }
    /* nothing written past the result (reduce_scatter in place writes inside its input) */
    if (!(inplace && kind == 4) && count && !guard_ok(recv, out_elems * es)) {
        report(x, "guard", dt, count, inplace, out_elems, recv[out_elems * es], GUARD);
        return -1;
    }
    return 0;
}

int opcheck_rank_main(void *arg)
{
    struct opcheck_job *j = arg;
    struct ctx x = {0};
    coll_buffer *sb, *rb;
    if (coll_connect(&x.c, j->sock, 10000) != COLL_OK) {
        fprintf(stderr, "connect: %s\n", coll_last_error());
        return 100;
    }
    if (coll_group_open(&x.g, x.c, j->group ? j->group : "g", j->explicit_slot ? j->slot : COLL_SLOT_ANY) != COLL_OK) {
        fprintf(stderr, "open: %s\n", coll_last_error());
        return 101;
    }
    coll_group_info info;
    coll_group_info_get(x.g, &info);
    x.rank = info.rank;
    x.n = info.size;
    if (j->explicit_slot && info.local_slot != j->slot) return 102;
    size_t bytes = (size_t)MAXC * (size_t)x.n * 8 + 64;
    if (coll_mem_alloc(&sb, x.c, bytes, COLL_DEVICE_HOST) ||
        coll_mem_alloc(&rb, x.c, bytes, COLL_DEVICE_HOST))
        return 103;
    x.S = coll_mem_ptr(sb);
    x.R = coll_mem_ptr(rb);
    int iter = 0;
    for (int kind = 0; kind <= 7; kind++) {
        int reducing = kind == 0 || kind == 2 || kind == 4;
        for (int dt = 0; dt < COLL_DTYPE_COUNT; dt++) {
            for (int redop = 0; redop < (reducing ? COLL_REDOP_COUNT : 1); redop++) {
                for (size_t ci = 0; ci < NCOUNTS; ci++) {
                    for (int inplace = 0; inplace < (kind == 6 || kind == 7 ? 1 : 2); inplace++) {
                        int root = iter++ % x.n;
                        run_one(&x, kind, dt, redop, counts[ci], inplace, root);
                        if (x.failures > 20) goto out;
                    }
                    if (kind == 7) break;
                }
            }
            if (kind == 7) break;
        }
    }
out:
    if (coll_mem_release(&sb) || coll_mem_release(&rb)) x.failures++;
    coll_group_close(&x.g);
    coll_disconnect(&x.c);
    return x.failures > 99 ? 99 : x.failures;
}

