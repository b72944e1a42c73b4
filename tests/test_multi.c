/*
 * test_multi.c: groups that span several agents ("pods") on loopback, with real
 * agent and application processes: the op matrix with 2, 3, 4 and 8 agents and
 * several local participants per agent; an agent that arrives late; an agent killed
 * mid-op (the survivors fail within the timeout and the group re-forms when it is
 * back); configs that disagree; garbage on the rendezvous port.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "backends/tcp.h" /* TCP_ACK_EVERY, TCP_ACK_WINDOW */
#include "coll/coll.h"
#include "harness.h"
#include "opcheck.h"
#include "rdv_wire.h"
#include "security.h" /* sec_mac: the test's own acceptor proves the secret */

#define MAXA 32

/* Start agent `index` of a group g of `members` pods with `slots` local slots. */
/* The agent's own path for a test's ranks (children inherit it): clients that run no
 * direct ops, as older libcoll and groups of several slots per pod. */
static void agent_path(int on)
{
    if (on)
        setenv("COLL_DIRECT", "0", 1);
    else
        unsetenv("COLL_DIRECT");
}

/* Agent section lines for the members a test starts (direct ops' tests turn them on). */
static const char *member_agent;

static int start_member(struct agent *a, int port, int index, int members, int slots,
                        const char *extra)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "node:\n  index: %d\n  name: pod-%d\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: g\n    backend: host\n    members: %d\n    local_slots: %d\n"
             "    timeouts: {op_ms: %d, heartbeat_ms: %d, join_ms: 5000}\n%s",
             index, index, port, members, slots, 20000, TEST_HB_MS, extra ? extra : "");
    return agent_start(a, member_agent, body);
}

static void start_all(struct agent *a, int n, int slots, int *port)
{
    *port = free_port();
    for (int i = 0; i < n; i++)
        assert_int_equal(start_member(&a[i], *port, i, n, slots, NULL), 0);
}

static void stop_all(struct agent *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].pid) assert_int_equal(agent_stop(&a[i]), 0);
}

/* fn once per job (n jobs of size bytes each, one per pod's application) in child
 * processes, all at once; each must exit 0 within ms. */
static void run_ranks(int (*fn)(void *), void *jobs, size_t size, int n, int ms)
{
    pid_t p[MAXA];
    for (int i = 0; i < n; i++)
        p[i] = child_run(fn, (char *)jobs + (size_t)i * size);
    for (int i = 0; i < n; i++)
        assert_int_equal(child_wait(p[i], ms), 0);
}

static void matrix(int n, int slots)
{
    struct agent a[MAXA];
    int port;
    start_all(a, n, slots, &port);
    pid_t pids[MAXA * 4];
    struct opcheck_job jobs[MAXA * 4];
    int np = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < slots; s++) {
            jobs[np] = (struct opcheck_job){.sock = a[i].sock, .explicit_slot = 1, .slot = s};
            pids[np] = child_run(opcheck_rank_main, &jobs[np]);
            np++;
        }
    for (int i = 0; i < np; i++)
        assert_int_equal(child_wait(pids[i], 1500000), 0);
    for (int i = 0; i < n; i++) {
        assert_int_equal(agent_log_count(&a[i], "protocol_error"), 0);
        assert_true(agent_log_count(&a[i], "group.formed") >= 1);
    }
    stop_all(a, n);
}

static void ops_2_agents(void **state)
{
    (void)state;
    matrix(2, 1);
}

static void ops_2_agents_3_slots(void **state)
{
    (void)state;
    matrix(2, 3);
}

static void ops_3_agents_2_slots(void **state)
{
    (void)state;
    matrix(3, 2);
}

static void ops_4_agents(void **state)
{
    (void)state;
    matrix(4, 1);
}

/* doubling and halving with two participants per pod (blocks of two ranks each) */
static void ops_4_agents_2_slots(void **state)
{
    (void)state;
    matrix(4, 2);
}

static void ops_8_agents(void **state)
{
    (void)state;
    matrix(8, 1);
}

/* ---- one allreduce per rank, for the failure tests --------------------------------------- */

/* A rank's start: connect to sock, open group "g", share bytes of host memory. 0, or
 * the exit code that says which step failed (100 connect, 101 open, 102 memory). */
static int rank_open(const char *sock, size_t bytes, coll_conn **c, coll_group **g,
                     coll_group_info *info, void **mem)
{
    coll_buffer *b;
    if (coll_connect(c, sock, 5000)) return 100;
    if (coll_group_open(g, *c, "g", COLL_SLOT_ANY)) return 101;
    if (coll_mem_alloc(&b, *c, bytes, COLL_DEVICE_HOST)) return 102;
    coll_group_info_get(*g, info);
    *mem = coll_mem_ptr(b);
    return 0;
}

struct one {
    const char *sock;
    int expect;       /* coll_err expected from the allreduce */
    int delay_ms;     /* sleep this long before submitting */
    int times;        /* allreduces in one session (0: one) */
    const char *hold; /* keep the session open until this file exists */
    const char *why;  /* a failure's coll_last_error must hold this */
    const char *gate; /* submit once this file exists (30 s at most) */
};

/* Whether path exists within ms (looked for every 10 ms). */
static int wait_file(const char *path, int ms)
{
    for (int i = 0; i < ms / 10 && access(path, F_OK) != 0; i++)
        usleep(10 * 1000);
    return access(path, F_OK) == 0;
}

/* Say that rank's ops are done (file path.rRANK), then wait for path to exist. */
static void hold_until(const char *path, int rank)
{
    if (!path) return;
    char done[160];
    snprintf(done, sizeof(done), "%s.r%d", path, rank);
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    for (int i = 0; i < 3000 && access(path, F_OK) != 0; i++)
        usleep(10 * 1000);
}

/* Wait until the n ranks of hold_until(path) are done. */
static void wait_ranks_done(const char *path, int n)
{
    for (int r = 0; r < n; r++) {
        char done[160];
        snprintf(done, sizeof(done), "%s.r%d", path, r);
        for (int i = 0; i < 3000 && access(done, F_OK) != 0; i++)
            usleep(10 * 1000);
        assert_int_equal(access(done, F_OK), 0);
        unlink(done);
    }
}

static int allreduce_once(void *arg)
{
    struct one *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    for (int k = 0; k < (o->times ? o->times : 1); k++) {
        for (int i = 0; i < 16; i++)
            x[i] = (float)(info.rank + 1);
        coll_request r;
        if (o->delay_ms) usleep((useconds_t)o->delay_ms * 1000);
        if (o->gate) wait_file(o->gate, 30000);
        coll_err e = coll_allreduce(g, x, x + 16, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        if (e != (coll_err)o->expect) {
            fprintf(stderr, "allreduce: %s (%s), expected %s\n", coll_strerror(e),
                    coll_last_error(), coll_strerror((coll_err)o->expect));
            return 103;
        }
        if (e != COLL_OK && o->why && !strstr(coll_last_error(), o->why)) {
            fprintf(stderr, "allreduce: %s (%s), expected a reason with '%s'\n", coll_strerror(e),
                    coll_last_error(), o->why);
            return 105;
        }
        if (e == COLL_OK) {
            float want = (float)(info.size * (info.size + 1) / 2);
            for (int i = 0; i < 16; i++)
                if (x[16 + i] != want) return 104;
        }
    }
    hold_until(o->hold, info.rank);
    coll_disconnect(&c);
    return 0;
}

/* ---- bitwise allreduces: two pods folding on arrival, 4 and 8 by doubling ------------- */

/* Pseudo-random floats with full 24-bit mantissas over a range of exponents, so that
 * sums round: another order of the operands, or an element folded twice or not at all,
 * gives other bits. */
static float tree_input(int rank, size_t i)
{
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)((rank + 1) * 0x85ebca6bu);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    float m = (float)((x & 0xffffffu) | 0x800000u);
    return ldexpf(x & 0x80000000u ? -m : m, (int)((x >> 24) & 7u) - 24);
}

/* What recursive doubling yields over pods lo .. lo+n-1 (n a power of two): the pairwise
 * tree ((a0 + a1) + (a2 + a3)) + ..., whichever side each pod adds first. */
static float tree_sum(int lo, int n, size_t i)
{
    return n == 1 ? tree_input(lo, i) : tree_sum(lo, n / 2, i) + tree_sum(lo + n / 2, n / 2, i);
}

struct bitwise {
    const char *sock;
    int delay_ms;         /* before the first op: late pods make the early ones hand over */
    const size_t *counts; /* allreduces of these counts, each in and out of place */
    int ncounts;
};

/* Allreduces whose every element must have the bits of the pairwise tree of the pods'
 * inputs (with two pods, simply a0 + a1). */
static size_t largest(const size_t *v, int n)
{
    size_t m = 0;
    for (int k = 0; k < n; k++)
        if (v[k] > m) m = v[k];
    return m;
}

static int bitwise_rank_main(void *arg)
{
    const struct bitwise *o = arg;
    size_t maxc = largest(o->counts, o->ncounts);
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, maxc * 4 * 2, &c, &g, &info, &mem);
    if (rc) return rc;
    float *in = mem, *out = in + maxc;
    if (o->delay_ms) usleep((useconds_t)o->delay_ms * 1000);
    for (int k = 0; k < o->ncounts; k++)
        for (int inplace = 0; inplace < 2; inplace++) {
            size_t n = o->counts[k];
            for (size_t i = 0; i < n; i++)
                in[i] = tree_input(info.rank, i);
            float *dst = inplace ? in : out;
            coll_request r;
            coll_err e = coll_allreduce(g, in, dst, n, COLL_FLOAT32, COLL_SUM, NULL, &r);
            if (e == COLL_OK) e = coll_wait(c, r, 30000);
            if (e != COLL_OK) {
                fprintf(stderr, "rank %d: allreduce count %zu: %s (%s)\n", info.rank, n,
                        coll_strerror(e), coll_last_error());
                return 103;
            }
            for (size_t i = 0; i < n; i++) {
                float want = tree_sum(0, info.size, i);
                if (memcmp(&dst[i], &want, 4) != 0) {
                    fprintf(stderr,
                            "rank %d: allreduce count %zu inplace %d: element %zu is %a, "
                            "want %a\n",
                            info.rank, n, inplace, i, (double)dst[i], (double)want);
                    return 104;
                }
            }
        }
    coll_disconnect(&c);
    return 0;
}

/* Two pods, mid sizes: the one-step exchange that folds on arrival. 64 KiB + 4 (past
 * the tiny limit), segments folded while still sending, the two-pod limit exactly, and
 * one element past it (the ring). */
static void two_pods_mid_sizes_bitwise(void **state)
{
    (void)state;
    static const size_t counts[] = {16385, 300001, 524288, 524289};
    struct agent a[2];
    int port;
    start_all(a, 2, 1, &port);
    struct bitwise jobs[2];
    for (int i = 0; i < 2; i++)
        jobs[i] = (struct bitwise){a[i].sock, 0, counts, 4};
    run_ranks(bitwise_rank_main, jobs, sizeof(jobs[0]), 2, 120000);
    stop_all(a, 2);
}

/* Every pod gets the same bits (the tree's), with 4 pods and with 8; with 4, the second
 * pair is 300 ms late, so the first pair's engines finish step one and hand step two to
 * their net threads half done. */
static void four_and_eight_pods_double_bitwise(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) { /* 4 and 8 pods, through the agents */
        int n = k & 1 ? 8 : 4, direct = k >= 2;
        agent_path(!direct);
        struct agent a[8];
        int port;
        start_all(a, n, 1, &port);
        for (int i = 0; i < n; i++) /* ready, so that the ops are not simply queued */
            assert_true(agent_log_wait(&a[i], "group.formed", 1, 10000));
        /* one element, an odd count, and the tiny limit exactly (64 KiB) */
        static const size_t counts[] = {1, 1001, 16384};
        struct bitwise jobs[8];
        for (int i = 0; i < n; i++)
            jobs[i] = (struct bitwise){a[i].sock, n == 4 && i >= 2 ? 300 : 0, counts, 3};
        run_ranks(bitwise_rank_main, jobs, sizeof(jobs[0]), n, 60000);
        agent_path(0);
        stop_all(a, n);
        if (n == 4 && !direct) { /* the first op was handed over, or queued if the net
                                  * thread was busy at that instant: not every op ran on
                                  * the engine */
            assert_int_equal(agent_log_count(&a[0], "group.stats"), 1);
            assert_int_equal(agent_log_count(&a[0], "handed_over=0 queued=0"), 0);
        }
    }
}

/* ---- allgather: the input is sent from where it is and copied into place as it goes -- */

/* Allgathers of each of counts, out of place (the input apart from the result) and in
 * place: every block has the bits of its pod's input, the input is left as it was, and
 * nothing past the result is written. */
static int allgather_rank_main(void *arg)
{
    const struct bitwise *o = arg;
    size_t maxc = largest(o->counts, o->ncounts);
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    const size_t maxn = 4; /* pods */
    int rc = rank_open(o->sock, maxc * 4 * (maxn + 2), &c, &g, &info, &mem);
    if (rc) return rc;
    float *in = mem, *out = in + maxc; /* out: maxn blocks and a guard block */
    for (int k = 0; k < o->ncounts; k++)
        for (int inplace = 0; inplace < 2; inplace++) {
            size_t n = o->counts[k], np = (size_t)info.size;
            for (size_t i = 0; i < n * (np + 1); i++)
                out[i] = -3.0f;
            float *src = inplace ? out + (size_t)info.rank * n : in;
            for (size_t i = 0; i < n; i++)
                src[i] = tree_input(info.rank, i);
            coll_request r;
            coll_err e = coll_allgather(g, src, out, n, COLL_FLOAT32, NULL, &r);
            if (e == COLL_OK) e = coll_wait(c, r, 30000);
            if (e != COLL_OK) {
                fprintf(stderr, "rank %d: allgather count %zu: %s (%s)\n", info.rank, n,
                        coll_strerror(e), coll_last_error());
                return 103;
            }
            for (size_t p = 0; p < np; p++)
                for (size_t i = 0; i < n; i++) {
                    float want = tree_input((int)p, i), got = out[p * n + i];
                    if (memcmp(&got, &want, 4) != 0) {
                        fprintf(stderr,
                                "rank %d: allgather count %zu inplace %d: block %zu element "
                                "%zu is %a, want %a\n",
                                info.rank, n, inplace, p, i, (double)got, (double)want);
                        return 104;
                    }
                }
            for (size_t i = 0; i < n; i++) {
                float want = tree_input(info.rank, i);
                if (!inplace && memcmp(&in[i], &want, 4) != 0) {
                    fprintf(stderr, "rank %d: allgather count %zu changed its input at %zu\n",
                            info.rank, n, i);
                    return 105;
                }
                if (out[np * n + i] != -3.0f) {
                    fprintf(stderr, "rank %d: allgather count %zu wrote past its result\n",
                            info.rank, n);
                    return 106;
                }
            }
        }
    coll_disconnect(&c);
    return 0;
}

/* Two, three and four pods, one participant each, every way an allgather goes, with its
 * input copied first (results under TCP_COPY_AS_SENT_BYTES) and as it is sent: two pods
 * one exchange (up to 524288 floats, the pair limit) and the ring past it (524289),
 * three pods the ring from 64 KiB, four pods doubling up to 1 MiB in all (65536) and
 * the ring past it. */
static void allgathers_copy_the_input_into_place_as_it_is_sent(void **state)
{
    (void)state;
    static const size_t counts[] = {1, 16385, 65536, 524288, 524289};
    for (int n = 2; n <= 4; n++) {
        struct agent a[4];
        int port;
        start_all(a, n, 1, &port);
        struct bitwise jobs[4];
        for (int i = 0; i < n; i++)
            jobs[i] = (struct bitwise){a[i].sock, 0, counts, 5};
        run_ranks(allgather_rank_main, jobs, sizeof(jobs[0]), n, 120000);
        stop_all(a, n);
    }
}

/* ---- broadcast chains: each pod relays bytes as they arrive -------------------------- */

struct bc {
    const char *sock;
    size_t count;         /* this rank's count for the mismatch test; 0: the full run */
    const size_t *counts; /* the full run's counts (NULL: bcast_rank_main's own) */
    int ncounts;
};

static int bcast_rank_main(void *arg)
{
    const struct bc *o = arg;
    /* just past the tiny limit, and a few MiB (many socket buffers in flight) */
    static const size_t own_counts[] = {16385, 1000003};
    const size_t *counts = o->counts ? o->counts : own_counts;
    int ncounts = o->counts ? o->ncounts : 2;
    const size_t maxc = 1000003;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, maxc * 4 * 2, &c, &g, &info, &mem);
    if (rc) return rc;
    float *in = mem, *out = in + maxc;
    for (int root = 0; root < info.size; root++)
        for (int k = 0; k < ncounts; k++)
            for (int inplace = 0; inplace < 2; inplace++) {
                size_t n = counts[k];
                for (size_t i = 0; i < n; i++) {
                    in[i] = info.rank == root ? tree_input(root, i) : -1.0f;
                    out[i] = -2.0f;
                }
                float *dst = inplace ? in : out;
                coll_request r;
                coll_err e = coll_broadcast(g, in, dst, n, COLL_FLOAT32, root, NULL, &r);
                if (e == COLL_OK) e = coll_wait(c, r, 30000);
                if (e != COLL_OK) {
                    fprintf(stderr, "broadcast root %d count %zu: %s (%s)\n", root, n,
                            coll_strerror(e), coll_last_error());
                    return 103;
                }
                for (size_t i = 0; i < n; i++) {
                    float want = tree_input(root, i);
                    if (memcmp(&dst[i], &want, 4) != 0) {
                        fprintf(stderr,
                                "rank %d: broadcast root %d count %zu inplace %d: "
                                "element %zu is %a, want %a\n",
                                info.rank, root, n, inplace, i, (double)dst[i], (double)want);
                        return 104;
                    }
                }
            }
    /* a root is done once its bytes are sent: leaving then would end the epoch under
     * pods still receiving. The barrier's own end is the same for the last to finish it:
     * the first pod to leave ends the epoch at once (an ABORT does not drain), so a
     * late pod's barrier may fail, retryably, after every broadcast was checked */
    coll_request r;
    coll_err e = coll_barrier(g, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    if (e != COLL_OK && !coll_err_retryable(e)) {
        fprintf(stderr, "rank %d: barrier after the broadcasts: %s (%s)\n", info.rank,
                coll_strerror(e), coll_last_error());
        return 105;
    }
    coll_disconnect(&c);
    return 0;
}

static void four_pods_broadcast_relays(void **state)
{
    (void)state;
    /* and two pods: up to 2 MiB on the engine (524288 floats: the pair limit exactly),
     * past it the chain */
    static const size_t pair_counts[] = {16385, 262144, 524288, 524289};
    for (int n = 4; n >= 2; n -= 2) {
        struct agent a[4];
        int port;
        start_all(a, n, 1, &port);
        struct bc jobs[4];
        for (int i = 0; i < n; i++)
            jobs[i] =
                (struct bc){.sock = a[i].sock, .counts = n == 2 ? pair_counts : NULL, .ncounts = 4};
        run_ranks(bcast_rank_main, jobs, sizeof(jobs[0]), n, 120000);
        stop_all(a, n);
    }
}

/* One pod's count disagrees with its neighbour's: that pod's application gets an error
 * that names both sides' values, nobody hangs, and the group serves the next op. */
/* An allreduce of n elements (x[0..n) = rank + 1, result at x + 64) after a failure that
 * may have ended the epoch: a handle of the old epoch is reopened and the op retried
 * while the errors are retryable (20 tries, 50 ms apart). NOT_FOUND if the reopen fails. */
static coll_err allreduce_after_reform(coll_conn *c, coll_group **g, float *x, size_t n, int rank)
{
    coll_err e;
    for (int attempt = 0;; attempt++) {
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rank + 1);
        coll_request r;
        e = coll_allreduce(*g, x, x + 64, n, COLL_FLOAT32, COLL_SUM, NULL, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        if (e == COLL_OK || !coll_err_retryable(e) || attempt == 20) return e;
        if (e == COLL_ERR_EPOCH) {
            coll_group_close(g);
            if (coll_group_open(g, c, "g", COLL_SLOT_ANY)) return COLL_ERR_NOT_FOUND;
        }
        usleep(50000);
    }
}

static int bcast_mismatch_main(void *arg)
{
    const struct bc *o = arg;
    const size_t maxc = 1 << 20;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, maxc * 4, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    coll_request r;
    coll_err e = coll_broadcast(g, x, x, o->count, COLL_FLOAT32, 0, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    if (info.rank == 2) {
        if (e != COLL_ERR_MISMATCH) {
            fprintf(stderr, "rank 2: %s, want a mismatch\n", coll_strerror(e));
            return 103;
        }
        char want[64];
        snprintf(want, sizeof(want), "count %zu", o->count);
        if (!strstr(coll_last_error(), want) || !strstr(coll_last_error(), "count 1000000")) {
            fprintf(stderr, "rank 2: error does not name both counts: %s\n", coll_last_error());
            return 104;
        }
    }
    /* the others may finish (what they received is right) or fail with the epoch */
    /* the next op: the group re-forms for it if the mismatch ended the epoch */
    e = allreduce_after_reform(c, &g, x, 64, info.rank);
    if (e == COLL_ERR_NOT_FOUND) return 106;
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: op after the mismatch: %s (%s)\n", info.rank, coll_strerror(e),
                coll_last_error());
        return 107;
    }
    if (x[64] != 6.0f || x[127] != 6.0f) return 108;
    coll_disconnect(&c);
    return 0;
}

static void broadcast_count_mismatch_is_named(void **state)
{
    (void)state;
    struct agent a[3];
    int port;
    start_all(a, 3, 1, &port);
    struct bc jobs[3] = {{a[0].sock, 1000000}, {a[1].sock, 1000000}, {a[2].sock, 999999}};
    run_ranks(bcast_mismatch_main, jobs, sizeof(jobs[0]), 3, 60000);
    assert_true(agent_log_count(&a[2], "mismatch") + agent_log_count(&a[2], "runs broadcast") >= 1);
    stop_all(a, 3);
}

/* A small op starts on the engine thread of the pod that is ready first; its peer is
 * late, so the engine hands it to the net thread half done, which finishes it. */
static void slow_peer_hands_a_small_op_to_the_net_thread(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 1, &port);
    for (int i = 0; i < 2; i++) /* ready, so that the op is not simply queued */
        assert_true(agent_log_wait(&a[i], "group.formed", 1, 10000));
    struct one fast_slow[2] = {{.sock = a[0].sock}, {.sock = a[1].sock, .delay_ms = 300}};
    agent_path(1); /* the agent's engine and net thread are what is under test */
    run_ranks(allreduce_once, fast_slow, sizeof(fast_slow[0]), 2, 30000);
    agent_path(0);
    stop_all(a, 2);
    /* handed over, unless the net thread was busy at that instant and it was queued:
     * the op is right either way (checked above); the hand-over is the usual path */
    assert_int_equal(agent_log_count(&a[0], "handed_over=1") + agent_log_count(&a[0], "queued=1"),
                     1);
}

/* Every kind of small op, with one pod 200 ms late for each: the early pod's engine
 * starts it, hands it to its net thread half done, and the result is still right. */
static int late_kinds_main(void *arg)
{
    const struct one *o = arg;
    enum { K = 12 }; /* elements per block */
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    int n = info.size, me = info.rank;
    float *in = mem, *out = in + 2 * K * n;
    for (int kind = 0; kind < 6; kind++) {
        for (int i = 0; i < K * n; i++) {
            in[i] = (float)(100 * me + i);
            out[i] = -1.0f;
        }
        if (o->delay_ms) usleep((useconds_t)o->delay_ms * 1000);
        coll_request r;
        coll_err e;
        switch (kind) {
        case 0:
            e = coll_reduce_scatter(g, in, out, K, COLL_FLOAT32, COLL_SUM, NULL, &r);
            break;
        case 1:
            e = coll_reduce(g, in, out, K, COLL_FLOAT32, COLL_SUM, 0, NULL, &r);
            break;
        case 2:
            e = coll_alltoall(g, in, out, K, COLL_FLOAT32, NULL, &r);
            break;
        case 3:
            e = coll_allgather(g, in, out, K, COLL_FLOAT32, NULL, &r);
            break;
        case 4:
            e = coll_broadcast(g, in, out, K, COLL_FLOAT32, 0, NULL, &r);
            break;
        default:
            e = coll_barrier(g, NULL, &r);
            break;
        }
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        if (e != COLL_OK) {
            fprintf(stderr, "rank %d kind %d: %s (%s)\n", me, kind, coll_strerror(e),
                    coll_last_error());
            return 103;
        }
        for (int i = 0; i < K * n && kind < 5; i++) {
            float want = -1.0f; /* elements the op must not touch stay as they were */
            int blk = i / K, j = i % K;
            if ((kind == 0 || (kind == 1 && me == 0)) && i < K) {
                /* reduce_scatter: block me of every rank's input; reduce: block 0 */
                want = 0.0f;
                for (int p = 0; p < n; p++)
                    want += (float)(100 * p + (kind == 0 ? me * K : 0) + j);
            }
            if (kind == 2) want = (float)(100 * blk + me * K + j); /* block me of rank blk */
            if (kind == 3) want = (float)(100 * blk + j);          /* rank blk's first block */
            if (kind == 4 && i < K) want = (float)i;               /* rank 0's */
            if (out[i] != want) {
                fprintf(stderr, "rank %d kind %d: element %d is %g, want %g\n", me, kind, i,
                        (double)out[i], (double)want);
                return 104;
            }
        }
    }
    coll_disconnect(&c);
    return 0;
}

/* The value after key on the agent's group.stats line, or -1. */
static long group_stat(const struct agent *a, const char *key)
{
    FILE *f = fopen(a->log, "r");
    if (!f) return -1;
    char line[1024];
    long v = -1;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "event=group.stats");
        p = p ? strstr(p, key) : NULL;
        if (p) v = atol(p + strlen(key));
    }
    fclose(f);
    return v;
}

static void slow_peer_hands_over_every_small_kind(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 1, &port);
    for (int i = 0; i < 2; i++)
        assert_true(agent_log_wait(&a[i], "group.formed", 1, 10000));
    struct one fast_slow[2] = {{.sock = a[0].sock}, {.sock = a[1].sock, .delay_ms = 200}};
    agent_path(1);
    run_ranks(late_kinds_main, fast_slow, sizeof(fast_slow[0]), 2, 30000);
    agent_path(0);
    stop_all(a, 2);
    /* six ops, each handed over, or queued when the net thread was busy at that instant
     * (it spins a while after each op); they cannot all have run whole on the engine */
    long handed = group_stat(&a[0], "handed_over="), queued = group_stat(&a[0], "queued=");
    long inl = group_stat(&a[0], "inline=");
    assert_true(handed >= 0 && queued >= 0 && inl >= 0);
    assert_true(handed + queued >= 1);
    assert_int_equal(handed + queued + inl, 6);
}

static void late_agent_completes_the_group(void **state)
{
    (void)state;
    struct agent a[3];
    int port = free_port();
    assert_int_equal(start_member(&a[0], port, 0, 3, 1, NULL), 0);
    assert_int_equal(start_member(&a[1], port, 1, 3, 1, NULL), 0);
    struct one ok0 = {.sock = a[0].sock}, ok1 = {.sock = a[1].sock};
    pid_t p0 = child_run(allreduce_once, &ok0), p1 = child_run(allreduce_once, &ok1);
    usleep(500000); /* their ops wait for the third pod */
    assert_int_equal(start_member(&a[2], port, 2, 3, 1, NULL), 0);
    struct one ok2 = {.sock = a[2].sock};
    pid_t p2 = child_run(allreduce_once, &ok2);
    assert_int_equal(child_wait(p0, 30000), 0);
    assert_int_equal(child_wait(p1, 30000), 0);
    assert_int_equal(child_wait(p2, 30000), 0);
    assert_true(agent_log_count(&a[0], "rendezvous.commit") >= 1);
    stop_all(a, 3);
}

static void killed_agent_fails_survivors_then_group_reforms(void **state)
{
    (void)state;
    struct agent a[3];
    int port;
    start_all(a, 3, 1, &port);
    /* pods 0 and 1 submit; pod 2's agent dies before its application does */
    struct one lost0 = {.sock = a[0].sock, .expect = COLL_ERR_PEER_LOST};
    struct one lost1 = {.sock = a[1].sock, .expect = COLL_ERR_PEER_LOST};
    pid_t p0 = child_run(allreduce_once, &lost0), p1 = child_run(allreduce_once, &lost1);
    assert_true(agent_log_wait(&a[0], "group.attach", 1, 5000));
    assert_true(agent_log_wait(&a[1], "group.attach", 1, 5000));
    usleep(200000);
    kill(a[2].pid, SIGKILL);
    child_wait(a[2].pid, 5000);
    a[2].pid = 0;
    double t0 = now_ms();
    /* well inside op_ms (20 s): the heartbeat (3 intervals) notices */
    assert_int_equal(child_wait(p0, 30000), 0);
    assert_int_equal(child_wait(p1, 30000), 0);
    assert_true(now_ms() - t0 < 10000);
    assert_true(agent_log_wait(&a[0], "rendezvous.abort", 1, 2000));
    /* it comes back: the group re-forms and runs */
    assert_int_equal(start_member(&a[2], port, 2, 3, 1, NULL), 0);
    struct one ok[3] = {{.sock = a[0].sock}, {.sock = a[1].sock}, {.sock = a[2].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 3, 30000);
    stop_all(a, 3);
}

/* Found at 242e584: with one pod cut off silently (no reset), the coordinator noticed
 * within 3 heartbeats, but the other members drained as for a pod that left, their
 * ops waiting for the silent pod's bytes until their sockets' keepalive gave up (3.9-5.1
 * s at a 1 s heartbeat). Now the coordinator's ABORT says the pod went silent, and a
 * member's op stops at its next turn with the coordinator's reason. */
static void a_frozen_pod_fails_the_others_ops_at_the_coordinators_word(void **state)
{
    (void)state;
    struct agent a[3];
    int port;
    start_all(a, 3, 1, &port);
    for (int i = 0; i < 3; i++)
        assert_true(agent_log_wait(&a[i], "event=group.formed ", 1, 10000));
    agent_path(1);           /* the op runs on the member's net thread, which must stop it */
    kill(a[2].pid, SIGSTOP); /* silent: no reset, no LEAVE */
    struct one lost0 = {.sock = a[0].sock, .expect = COLL_ERR_PEER_LOST, .why = "silent"};
    struct one lost1 = {.sock = a[1].sock, .expect = COLL_ERR_PEER_LOST, .why = "silent"};
    pid_t p0 = child_run(allreduce_once, &lost0), p1 = child_run(allreduce_once, &lost1);
    assert_int_equal(child_wait(p0, 30000), 0);
    assert_int_equal(child_wait(p1, 30000), 0);
    agent_path(0);
    kill(a[2].pid, SIGCONT);
    stop_all(a, 3);
}

/* ---- a long op of one group and the engine ------------------------------------------ */

struct stall {
    const char *sock, *group, *flag; /* flag.go: the big op may start on pod 1 */
    int role;                        /* 0: big op, pod 0; 1: big op, pod 1; 2: small group */
};

static void touch(const char *path)
{
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}

static int stall_main(void *arg)
{
    const struct stall *o = arg;
    char path[256];
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    coll_request r;
    if (coll_connect(&c, o->sock, 5000) || coll_group_open(&g, c, o->group, COLL_SLOT_ANY) ||
        coll_mem_alloc(&b, c, 4 << 20, COLL_DEVICE_HOST) || coll_group_wait(g, 10000))
        return 100;
    int32_t *x = coll_mem_ptr(b);
    if (o->role < 2) { /* the big op: pod 0 at once, pod 1 when the test says */
        snprintf(path, sizeof(path), "%s.go", o->flag);
        if (o->role == 1 && !wait_file(path, 60000)) return 101;
        for (size_t i = 0; i < (1u << 20); i++)
            x[i] = (int32_t)i;
        if (coll_allreduce(g, x, x, 1u << 20, COLL_INT32, COLL_SUM, NULL, &r)) return 102;
        snprintf(path, sizeof(path), "%s.big%d", o->flag, o->role);
        touch(path);
        if (coll_wait(c, r, 60000)) return 103;
        for (size_t i = 0; i < (1u << 20); i++)
            if (x[i] != 2 * (int32_t)i) return 104;
    } else { /* once pod 0's big op is under way: a direct op, then the lease back */
        snprintf(path, sizeof(path), "%s.big0", o->flag);
        if (!wait_file(path, 20000)) return 105;
        x[0] = 5;
        if (coll_allreduce(g, x, x + 1, 1, COLL_INT32, COLL_SUM, NULL, &r) ||
            coll_wait(c, r, 20000) || x[1] != 10)
            return 106;
        coll_group_close(&g); /* gives the lease back: the engine answers */
        snprintf(path, sizeof(path), "%s.small", o->flag);
        touch(path);
    }
    coll_disconnect(&c);
    return 0;
}

/* Found at 242e584: the net thread held coll_lock through every op it ran, and the
 * engine took it to take a lease back (net_unlend), so while one group's long op ran,
 * a client of another group that gave its connections back waited for it, and so did
 * every session behind that client on the engine. Now an op runs without the lock:
 * pod 0's big op waits for pod 1, which the test holds back, while the other group's
 * clients run a direct op and give the lease back, and only then does pod 1 start. */
static void a_long_op_of_one_group_holds_no_other_back(void **state)
{
    (void)state;
    int port = free_port();
    struct agent a[2];
    for (int i = 0; i < 2; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n"
                 "  - name: big\n    backend: host\n    members: 2\n"
                 "    timeouts: {op_ms: 60000, heartbeat_ms: %d, join_ms: 5000}\n"
                 "  - name: small\n    backend: host\n    members: 2\n"
                 "    timeouts: {op_ms: 60000, heartbeat_ms: %d, join_ms: 5000}\n",
                 i, i, port, TEST_HB_MS, TEST_HB_MS);
        assert_int_equal(agent_start(&a[i], "  direct_ops: true\n", body), 0);
    }
    char flag[128], path[256];
    tmp_path(flag, sizeof(flag), "stall", 0);
    setenv("COLL_DIRECT_WAIT_MS", "10000", 1);
    struct stall jobs[4] = {{a[0].sock, "big", flag, 0},
                            {a[1].sock, "big", flag, 1},
                            {a[0].sock, "small", flag, 2},
                            {a[1].sock, "small", flag, 2}};
    pid_t p[4];
    for (int i = 0; i < 4; i++)
        p[i] = child_run(stall_main, &jobs[i]);
    snprintf(path, sizeof(path), "%s.small", flag);
    int small_done = wait_file(path, 30000); /* before pod 1 may start the big op */
    snprintf(path, sizeof(path), "%s.go", flag);
    touch(path);
    for (int i = 0; i < 4; i++)
        assert_int_equal(child_wait(p[i], 60000), 0);
    unsetenv("COLL_DIRECT_WAIT_MS");
    assert_true(small_done);
    stop_all(a, 2);
    const char *ext[] = {".go", ".big0", ".big1", ".small"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s%s", flag, ext[i]);
        unlink(path);
    }
}

/* ---- direct ops (docs/decisions/0011-direct-ops.md) --------------------------------- */

struct mix {
    const char *sock;
    int agent_path; /* this rank's client runs no direct ops (COLL_DIRECT=0) */
    int all;        /* ... or every collective itself, large ones too (COLL_DIRECT=all) */
    int rounds;
    const char *flag; /* a path the case's ranks may signal each other with (flag.ROUND) */
    int raw;          /* its ops' memory is malloc's, outside coll buffers (with all) */
};
static unsigned mix_raw_mask; /* mix_case: the ranks whose jobs get raw */

#define MIX_BIG ((size_t)1 << 18) /* int32s: 1 MiB, past what runs direct */

static int mix_fail(int rank, const char *what, coll_err e)
{
    fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, coll_strerror(e), coll_last_error());
    return 150;
}

static coll_err mix_wait(coll_conn *c, coll_err e, coll_request r)
{
    return e == COLL_OK ? coll_wait(c, r, 10000) : e;
}

/* A mix rank's start: its path, its connection, group and buffer (in, then out, MIX_BIG
 * int32s each), the group formed; 0, or the rank's exit code. */
static int mix_open(const struct mix *o, coll_conn **c, coll_group **g, coll_group_info *info,
                    int32_t **in)
{
    if (o->agent_path) setenv("COLL_DIRECT", "0", 1);
    if (o->all) setenv("COLL_DIRECT", "all", 1);
    /* a lease the agent refuses for now (its net thread busy for a moment) is asked for
     * again, not done without: where each op runs follows from the mix alone, whatever
     * the threads' interleaving, and the counts below are exact */
    setenv("COLL_DIRECT_WAIT_MS", "10000", 1);
    void *mem;
    int rc = rank_open(o->sock, MIX_BIG * 4 * 2, c, g, info, &mem);
    if (rc) return rc;
    if (coll_group_wait(*g, 10000) != COLL_OK) return 151;
    *in = mem;
    if (o->raw && !(*in = aligned_alloc(64, MIX_BIG * 4 * 2))) return 149;
    return 0;
}

/* One case of a mix: n pods' agents, fn once per pod with its rank's mix (agent_mask:
 * the ranks whose clients go through their agents), the agents stopped; their logs stay
 * in a for the caller's checks. */
static void mix_case(struct agent *a, struct mix *jobs, int n, unsigned agent_mask,
                     unsigned all_mask, int rounds, int (*fn)(void *), int ms)
{
    int port;
    static char flag[128];
    tmp_path(flag, sizeof(flag), "mix", 0);
    start_all(a, n, 1, &port);
    for (int i = 0; i < n; i++)
        jobs[i] =
            (struct mix){a[i].sock, (int)(agent_mask >> i) & 1,  (int)(all_mask >> i) & 1, rounds,
                         flag,      (int)(mix_raw_mask >> i) & 1};
    fprintf(stderr, "case: %d pods, through the agent: mask 0x%x, all direct: mask 0x%x\n", n,
            agent_mask, all_mask);
    run_ranks(fn, jobs, sizeof(jobs[0]), n, ms);
    stop_all(a, n);
}

/* What pod i's agent counted at its stop: the ops its client ran direct (returned) and
 * those it ran itself, inline, handed over or queued (*agent). */
static long mix_counts(const struct agent *a, int i, long *agent)
{
    long direct = group_stat(a, "direct="), inl = group_stat(a, "inline=");
    long handed = group_stat(a, "handed_over="), queued = group_stat(a, "queued=");
    fprintf(stderr, "  pod %d: direct=%ld inline=%ld handed_over=%ld queued=%ld\n", i, direct, inl,
            handed, queued);
    *agent = inl + handed + queued;
    return direct;
}

/* Every kind of tiny op, a run of broadcasts from changing roots, a send and receive
 * while the connections are lent, and an allreduce too large to run direct (the
 * connections go back to the agent and come out again), each result checked exactly.
 * Pods may mix clients that run direct ops with clients that go through their agents:
 * the bytes on the wire are the same. */
static int direct_mix_main(void *arg)
{
    const struct mix *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    int32_t *in;
    int rc = mix_open(o, &c, &g, &info, &in);
    if (rc) return rc;
    int n = info.size, me = info.rank;
    int32_t *out = in + MIX_BIG;
    coll_request r;
    coll_err e;
    for (int round = 0; round < o->rounds; round++) {
        static const size_t counts[] = {1, 100, 4096, 16384}; /* 16384: 64 KiB, the limit */
        for (size_t k = 0; k < 4; k++) {
            size_t cnt = counts[k];
            for (size_t i = 0; i < cnt; i++)
                in[i] = me * 1000 + (int32_t)i + round;
            e = mix_wait(c, coll_allreduce(g, in, out, cnt, COLL_INT32, COLL_SUM, NULL, &r), r);
            if (e) return mix_fail(me, "allreduce", e);
            for (size_t i = 0; i < cnt; i++)
                if (out[i] != 1000 * n * (n - 1) / 2 + n * ((int32_t)i + round)) return 152;
        }
        for (int i = 0; i < 64; i++)
            in[i] = me * 100 + i + round;
        e = mix_wait(c, coll_allgather(g, in, out, 64, COLL_INT32, NULL, &r), r);
        if (e) return mix_fail(me, "allgather", e);
        for (int p = 0; p < n; p++)
            for (int i = 0; i < 64; i++)
                if (out[p * 64 + i] != p * 100 + i + round) return 153;
        for (int j = 0; j < 64 * n; j++)
            in[j] = me + j;
        e = mix_wait(c, coll_reduce_scatter(g, in, out, 64, COLL_INT32, COLL_SUM, NULL, &r), r);
        if (e) return mix_fail(me, "reduce_scatter", e);
        for (int i = 0; i < 64; i++)
            if (out[i] != n * (n - 1) / 2 + n * (me * 64 + i)) return 154;
        for (int k = 0; k < 10; k++) { /* a run of the same broadcast, then its root moves */
            int root = (round + k / 5) % n;
            for (int i = 0; me == root && i < 256; i++)
                in[i] = root * 10000 + k * 100 + i;
            e = mix_wait(c, coll_broadcast(g, in, out, 256, COLL_INT32, root, NULL, &r), r);
            if (e) return mix_fail(me, "broadcast", e);
            for (int i = 0; i < 256; i++)
                if (out[i] != root * 10000 + k * 100 + i) return 155;
        }
        for (int i = 0; i < 32; i++)
            in[i] = me + i;
        e = mix_wait(c, coll_reduce(g, in, out, 32, COLL_INT32, COLL_SUM, 1, NULL, &r), r);
        if (e) return mix_fail(me, "reduce", e);
        for (int i = 0; me == 1 && i < 32; i++)
            if (out[i] != n * (n - 1) / 2 + n * i) return 156;
        for (int j = 0; j < 8 * n; j++)
            in[j] = me * 1000 + j;
        e = mix_wait(c, coll_alltoall(g, in, out, 8, COLL_INT32, NULL, &r), r);
        if (e) return mix_fail(me, "alltoall", e);
        for (int p = 0; p < n; p++)
            for (int i = 0; i < 8; i++)
                if (out[p * 8 + i] != p * 1000 + me * 8 + i) return 157;
        if (me < 2) { /* its own connection: runs beside the lent ones */
            for (int i = 0; i < 16; i++)
                in[i] = 7 * i + round;
            e = me == 0 ? coll_send(g, in, 16, COLL_INT32, 1, NULL, &r)
                        : coll_recv(g, out, 16, COLL_INT32, 0, NULL, &r);
            e = mix_wait(c, e, r);
            if (e) return mix_fail(me, "send/recv", e);
            for (int i = 0; me == 1 && i < 16; i++)
                if (out[i] != 7 * i + round) return 158;
        }
        e = mix_wait(c, coll_barrier(g, NULL, &r), r);
        if (e) return mix_fail(me, "barrier", e);
        for (size_t i = 0; i < MIX_BIG; i++)
            in[i] = (int32_t)(i & 1023) + me;
        e = mix_wait(c, coll_allreduce(g, in, out, MIX_BIG, COLL_INT32, COLL_SUM, NULL, &r), r);
        if (e) return mix_fail(me, "large allreduce", e);
        for (size_t i = 0; i < MIX_BIG; i += 4099)
            if (out[i] != n * (int32_t)(i & 1023) + n * (n - 1) / 2) return 159;
    }
    coll_disconnect(&c);
    return 0;
}

/* Tiny ops run in the applications that may (direct=N on their agents' group.stats:
 * the ops came back counted), through the agent for the others, bit for bit the same
 * results in every mix; the agent runs only what is not tiny for a direct client. */
static void direct_ops_match_the_agent_path_in_every_mix(void **state)
{
    (void)state;
    const struct {
        int pods;
        unsigned agent_mask; /* ranks whose clients go through their agents */
    } cases[] = {{2, 0}, {2, 2}, {3, 0}, {4, 0}, {4, 0xa}};
    enum { ROUNDS = 3, TINY = 4 + 1 + 1 + 10 + 1 + 1 + 1 }; /* per round */
    member_agent = "  direct_ops: true\n";
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k].pods;
        struct agent a[4];
        struct mix jobs[4];
        mix_case(a, jobs, n, cases[k].agent_mask, 0, ROUNDS, direct_mix_main, 120000);
        for (int i = 0; i < n; i++) {
            long agent, direct = mix_counts(&a[i], i, &agent);
            /* every op ran once, here or there: the tiny ones, the large allreduce,
             * and on ranks 0 and 1 a send or a receive, each round */
            assert_int_equal(direct + agent, ROUNDS * (TINY + 1 + (i < 2)));
            if (jobs[i].agent_path) /* none */
                assert_int_equal(direct, 0);
            else /* every tiny one (COLL_DIRECT_WAIT_MS: mix_open) */
                assert_int_equal(direct, ROUNDS * TINY);
        }
    }
    member_agent = NULL;
}

/* COLL_DIRECT=all: every kind of large op (256 KiB to 1 MiB a pod), one moved on by
 * coll_test alone, and a large broadcast queued between two tiny allreduces and waited
 * for last, each result checked exactly; pods may mix such clients with ones that go
 * through their agents. */
#define LARGE_OPS 10 /* per round */
static int large_mix_main(void *arg)
{
    const struct mix *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    int32_t *in;
    int rc = mix_open(o, &c, &g, &info, &in);
    if (rc) return rc;
    const int n = info.size, me = info.rank;
    const size_t L = MIX_BIG / 4; /* 256 KiB of int32s: n * L fits MIX_BIG up to 4 pods */
    int32_t *out = in + MIX_BIG;
    coll_request r, q[3];
    coll_err e;
    for (int round = 0; round < o->rounds; round++) {
        for (size_t i = 0; i < MIX_BIG; i++)
            in[i] = (int32_t)(i & 1023) + me + round;
        e = mix_wait(c, coll_allreduce(g, in, out, MIX_BIG, COLL_INT32, COLL_SUM, NULL, &r), r);
        if (e) return mix_fail(me, "allreduce", e);
        for (size_t i = 0; i < MIX_BIG; i++)
            if (out[i] != n * ((int32_t)(i & 1023) + round) + n * (n - 1) / 2) return 170;
        for (size_t i = 0; i < L; i++)
            in[i] = me * 7 + (int32_t)i + round;
        e = mix_wait(c, coll_allgather(g, in, out, L, COLL_INT32, NULL, &r), r);
        if (e) return mix_fail(me, "allgather", e);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < L; i++)
                if (out[(size_t)p * L + i] != p * 7 + (int32_t)i + round) return 171;
        for (size_t j = 0; j < (size_t)n * L; j++)
            in[j] = me + (int32_t)j + round;
        e = mix_wait(c, coll_reduce_scatter(g, in, out, L, COLL_INT32, COLL_SUM, NULL, &r), r);
        if (e) return mix_fail(me, "reduce_scatter", e);
        for (size_t i = 0; i < L; i++)
            if (out[i] != n * (n - 1) / 2 + n * ((int32_t)((size_t)me * L + i) + round)) return 172;
        int root = round % n;
        for (size_t i = 0; i < MIX_BIG; i++)
            in[i] = me == root ? root * 3 + (int32_t)i + round : -1;
        e = mix_wait(c, coll_broadcast(g, in, out, MIX_BIG, COLL_INT32, root, NULL, &r), r);
        if (e) return mix_fail(me, "broadcast", e);
        for (size_t i = 0; i < MIX_BIG; i++)
            if (out[i] != root * 3 + (int32_t)i + round) return 173;
        for (size_t i = 0; i < MIX_BIG; i++)
            in[i] = me + (int32_t)i;
        e = mix_wait(c, coll_reduce(g, in, out, MIX_BIG, COLL_INT32, COLL_SUM, 1, NULL, &r), r);
        if (e) return mix_fail(me, "reduce", e);
        for (size_t i = 0; me == 1 && i < MIX_BIG; i++)
            if (out[i] != n * (n - 1) / 2 + n * (int32_t)i) return 174;
        for (size_t j = 0; j < (size_t)n * L; j++)
            in[j] = me * 100000 + (int32_t)j + round;
        e = mix_wait(c, coll_alltoall(g, in, out, L, COLL_INT32, NULL, &r), r);
        if (e) return mix_fail(me, "alltoall", e);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < L; i++)
                if (out[(size_t)p * L + i] != p * 100000 + (int32_t)((size_t)me * L + i) + round)
                    return 175;
        /* moved on by coll_test only (a large direct op runs whole in the first call) */
        for (size_t i = 0; i < MIX_BIG; i++)
            in[i] = (int32_t)(i % 77) * (me + 1);
        e = coll_allreduce(g, in, out, MIX_BIG, COLL_INT32, COLL_SUM, NULL, &r);
        if (e) return mix_fail(me, "allreduce (tested)", e);
        int done = 0;
        double until = now_ms() + 10000;
        while (!done && now_ms() < until) {
            e = coll_test(c, r, &done);
            if (e) return mix_fail(me, "coll_test", e);
            if (!done) usleep(100);
        }
        if (!done) return 176;
        for (size_t i = 0; i < MIX_BIG; i++)
            if (out[i] != (int32_t)(i % 77) * n * (n + 1) / 2) return 177;
        /* three queued: tiny, large, tiny; the last waited for first */
        const size_t B = MIX_BIG / 2, T = 16; /* the tiny ones beyond the broadcast */
        root = (round + 1) % n;
        for (size_t i = 0; i < B; i++)
            in[i] = me == root ? 5 * (int32_t)i + round : 0;
        for (size_t i = 0; i < 2 * T; i++)
            in[B + i] = me + (int32_t)i;
        if (coll_allreduce(g, in + B, out + B, T, COLL_INT32, COLL_SUM, NULL, &q[0]) ||
            coll_broadcast(g, in, out, B, COLL_INT32, root, NULL, &q[1]) ||
            coll_allreduce(g, in + B + T, out + B + T, T, COLL_INT32, COLL_SUM, NULL, &q[2]))
            return mix_fail(me, "queued submission", COLL_ERR_INTERNAL);
        for (int k = 2; k >= 0; k--) {
            e = coll_wait(c, q[k], 10000);
            if (e) return mix_fail(me, "queued op", e);
        }
        for (size_t i = 0; i < B; i++)
            if (out[i] != 5 * (int32_t)i + round) return 178;
        for (size_t i = 0; i < 2 * T; i++)
            if (out[B + i] != n * (n - 1) / 2 + n * (int32_t)i) return 179;
    }
    coll_disconnect(&c);
    if (o->raw) free(in);
    return 0;
}

/* COLL_DIRECT=all: the agent runs none of an all-direct client's collectives while it
 * lends (its group.stats: the ops came back counted as direct), and every result is
 * exact in every mix with clients that go through their agents or run only tiny ops
 * directly. */
static void every_op_runs_in_the_application_with_direct_all(void **state)
{
    (void)state;
    const struct {
        int pods;
        unsigned agent_mask, all_mask;
    } cases[] = {{2, 0, 3}, {2, 2, 1}, {2, 0, 1}, {3, 0, 7}, {4, 0, 0xf}, {4, 0xa, 0x5}};
    enum { ROUNDS = 2 };
    member_agent = "  direct_ops: true\n";
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k].pods;
        struct agent a[4];
        struct mix jobs[4];
        mix_case(a, jobs, n, cases[k].agent_mask, cases[k].all_mask, ROUNDS, large_mix_main,
                 120000);
        for (int i = 0; i < n; i++) {
            long agent, direct = mix_counts(&a[i], i, &agent);
            assert_int_equal(direct + agent, ROUNDS * LARGE_OPS);
            if (jobs[i].agent_path)
                assert_int_equal(direct, 0);
            else if (jobs[i].all) /* all of them (a refused lease is asked for again:
                                   * COLL_DIRECT_WAIT_MS, mix_open) */
                assert_int_equal(direct, ROUNDS * LARGE_OPS);
            else /* the first tiny one of the three queued; the second too where the large
                  * one between them was done by the time it came (a preempted client) */
                assert_true(direct >= ROUNDS && direct <= 2 * ROUNDS);
        }
    }
    member_agent = NULL;
}

/* An op that runs in the application takes its host memory as it is: every kind of
 * large op on malloc's memory (COLL_DIRECT=all), exact, and all of them run direct;
 * beside a pod whose client goes through its agent, in coll memory. */
static void direct_ops_take_memory_outside_coll_buffers(void **state)
{
    (void)state;
    const struct {
        int pods;
        unsigned agent_mask, all_mask;
    } cases[] = {{2, 0, 3}, {3, 2, 5}};
    enum { ROUNDS = 2 };
    member_agent = "  direct_ops: true\n";
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k].pods;
        struct agent a[3];
        struct mix jobs[3];
        mix_raw_mask = cases[k].all_mask;
        mix_case(a, jobs, n, cases[k].agent_mask, cases[k].all_mask, ROUNDS, large_mix_main,
                 120000);
        for (int i = 0; i < n; i++) {
            long agent, direct = mix_counts(&a[i], i, &agent);
            assert_int_equal(direct + agent, ROUNDS * LARGE_OPS);
            assert_int_equal(direct, jobs[i].raw ? ROUNDS * LARGE_OPS : 0);
        }
    }
    mix_raw_mask = 0;
    member_agent = NULL;
}

/* ---- premultiplied sums ------------------------------------------------------------------ */

/* Every rank multiplies by a scalar of its own (opcheck_premul), on every path. */
static int premul_main(void *arg)
{
    const struct mix *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    int32_t *mem;
    int rc = mix_open(o, &c, &g, &info, &mem);
    if (rc) return rc;
    rc = opcheck_premul(c, g, mem, mem + MIX_BIG, MIX_BIG / 16);
    coll_disconnect(&c);
    return rc;
}

/* Premultiplied sums between pods: each rank's own scalar, every path an op may take
 * (direct in the application, through the agent, both in one op, several slots per pod,
 * one pod's slots alone), checked exactly. */
static void premultiplied_sums_on_every_path(void **state)
{
    (void)state;
    const struct {
        int pods, slots;
        unsigned agent_mask, all_mask;
    } cases[] = {{2, 1, 0, 0}, {3, 1, 2, 5}, {2, 2, 0, 0}, {1, 3, 0, 0}};
    member_agent = "  direct_ops: true\n";
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k].pods, slots = cases[k].slots, port;
        struct agent a[3];
        struct mix jobs[6];
        static char flag[128];
        tmp_path(flag, sizeof(flag), "premul", 0);
        start_all(a, n, slots, &port);
        int nj = 0;
        for (int i = 0; i < n; i++)
            for (int s = 0; s < slots; s++, nj++)
                jobs[nj] = (struct mix){a[i].sock,
                                        (int)(cases[k].agent_mask >> i) & 1,
                                        (int)(cases[k].all_mask >> i) & 1,
                                        1,
                                        flag,
                                        0};
        fprintf(stderr, "case: %d pods x %d slots, agent mask 0x%x, all mask 0x%x\n", n, slots,
                cases[k].agent_mask, cases[k].all_mask);
        run_ranks(premul_main, jobs, sizeof(jobs[0]), nj, 120000);
        for (int i = 0; i < n; i++)
            assert_int_equal(agent_log_count(&a[i], "protocol_error"), 0);
        stop_all(a, n);
    }
    member_agent = NULL;
}

/* Memory outside coll buffers where the op would not run in the application: refused
 * at submission, with why, before anything is sent; the group serves on. */
static int raw_refusals_main(void *arg)
{
    const struct mix *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    int32_t *in;
    int rc = mix_open(o, &c, &g, &info, &in);
    if (rc) return rc;
    const int n = info.size, me = info.rank;
    int32_t *m = aligned_alloc(64, MIX_BIG * 4);
    if (!m) return 160;
    coll_request r;
    coll_err e;
    for (int i = 0; i < 32; i++)
        m[i] = me + i;
    /* tiny: runs direct, so malloc's memory will do */
    e = mix_wait(c, coll_allreduce(g, m, m + 16, 16, COLL_INT32, COLL_SUM, NULL, &r), r);
    if (e) return mix_fail(me, "tiny allreduce on malloc's memory", e);
    for (int i = 0; i < 16; i++)
        if (m[16 + i] != n * (n - 1) / 2 + n * i) return 161;
    struct {
        const char *what, *says;
        coll_err e;
        int said;
    } refused[4] = {{"1 MiB allreduce (it runs in the agent)", "only ops that run in this process"},
                    {"send (it runs in the agent)", "only ops that run in this process"},
                    {"misaligned", "aligned"},
                    {"overlapping, not in place", "overlap"}};
    for (int k = 0; k < 4; k++) {
        if (k == 0)
            refused[k].e = coll_allreduce(g, m, m, MIX_BIG, COLL_INT32, COLL_SUM, NULL, &r);
        else if (k == 1)
            refused[k].e = coll_send(g, m, 4, COLL_INT32, (me + 1) % n, NULL, &r);
        else if (k == 2)
            refused[k].e = coll_allreduce(g, (int32_t *)((char *)m + 2), m + 16, 4, COLL_INT32,
                                          COLL_SUM, NULL, &r);
        else
            refused[k].e = coll_allreduce(g, m, m + 1, 16, COLL_INT32, COLL_SUM, NULL, &r);
        refused[k].said = strstr(coll_last_error(), refused[k].says) != NULL;
        if (refused[k].e != COLL_ERR_INVALID || !refused[k].said) {
            fprintf(stderr, "rank %d: %s: %s (%s), not INVALID saying \"%s\"\n", me,
                    refused[k].what, coll_strerror(refused[k].e), coll_last_error(),
                    refused[k].says);
            return 162 + k;
        }
    }
    /* nothing of those was sent: the next op of every rank meets the others' */
    for (int i = 0; i < 8; i++)
        in[i] = me * 10 + i;
    e = mix_wait(c, coll_allreduce(g, in, in + 8, 8, COLL_INT32, COLL_MAX, NULL, &r), r);
    if (e) return mix_fail(me, "allreduce after the refusals", e);
    for (int i = 0; i < 8; i++)
        if (in[8 + i] != (n - 1) * 10 + i) return 170;
    free(m);
    coll_disconnect(&c);
    return 0;
}

static void memory_outside_coll_buffers_refused_where_the_agent_runs_the_op(void **state)
{
    (void)state;
    member_agent = "  direct_ops: true\n";
    struct agent a[2];
    struct mix jobs[2];
    mix_case(a, jobs, 2, 0, 0, 1, raw_refusals_main, 60000);
    member_agent = NULL;
}

/* A run of four 8-byte broadcasts from pod 0 owes the root no pod's word (tcp.h:
 * TCP_ACK_EVERY), so it sends them and goes on at once to a broadcast too large to run
 * direct, through its agent, while the others sleep after the first: each then finds
 * the rest of the run and the large op's first bytes in its socket, and its first read
 * takes them all (read-ahead, tcp.h: struct tcp_stash). What was read ahead is the
 * stream's: it must go back to the agent with the lease, which reads the large op from
 * it, and out again with the next. Then a tiny allreduce, direct again. */
#define AHEAD_RUN 4
static int read_ahead_main(void *arg)
{
    const struct mix *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    int32_t *in;
    int rc = mix_open(o, &c, &g, &info, &in);
    if (rc) return rc;
    int n = info.size, me = info.rank;
    int32_t *out = in + MIX_BIG;
    coll_request r;
    coll_err e;
    for (int round = 0; round < o->rounds; round++) {
        char sent[160];
        snprintf(sent, sizeof(sent), "%s.%d", o->flag, round);
        for (int k = 0; k < AHEAD_RUN; k++) {
            in[0] = round * 1000 + k;
            in[1] = -k;
            e = mix_wait(c, coll_broadcast(g, in, out, 2, COLL_INT32, 0, NULL, &r), r);
            if (e) return mix_fail(me, "8-byte broadcast", e);
            if (out[0] != round * 1000 + k || out[1] != -k) {
                fprintf(stderr, "rank %d: broadcast %d of round %d: %d %d\n", me, k, round, out[0],
                        out[1]);
                return 152;
            }
            if (k == 0 && me != 0) { /* until the root has sent the large op on its way */
                double until = now_ms() + 20000;
                while (access(sent, F_OK) != 0 && now_ms() < until)
                    usleep(1000);
                usleep(250000);
            }
        }
        for (size_t i = 0; i < MIX_BIG; i++)
            in[i] = me == 0 ? (int32_t)(i * 7 + (size_t)round) : -1;
        e = coll_broadcast(g, in, out, MIX_BIG, COLL_INT32, 0, NULL, &r);
        if (e == COLL_OK && me == 0) {
            FILE *f = fopen(sent, "w");
            if (f) fclose(f);
        }
        e = mix_wait(c, e, r);
        if (e) return mix_fail(me, "large broadcast", e);
        for (size_t i = 0; i < MIX_BIG; i++)
            if (out[i] != (int32_t)(i * 7 + (size_t)round)) {
                fprintf(stderr, "rank %d: large broadcast of round %d: [%zu] = %d\n", me, round, i,
                        out[i]);
                return 153;
            }
        for (int i = 0; i < 4; i++)
            in[i] = me + i + round;
        e = mix_wait(c, coll_allreduce(g, in, out, 4, COLL_INT32, COLL_SUM, NULL, &r), r);
        if (e) return mix_fail(me, "allreduce", e);
        for (int i = 0; i < 4; i++)
            if (out[i] != n * (n - 1) / 2 + n * (i + round)) return 154;
    }
    coll_disconnect(&c);
    return 0;
}

static void read_ahead_travels_with_the_lease(void **state)
{
    (void)state;
    const struct {
        int pods;
        unsigned agent_mask; /* ranks whose clients go through their agents */
    } cases[] = {{2, 0}, {2, 1}, {2, 2}, {4, 0}, {4, 0xa}};
    enum { ROUNDS = 3 };
    member_agent = "  direct_ops: true\n";
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k].pods;
        struct agent a[4];
        struct mix jobs[4];
        mix_case(a, jobs, n, cases[k].agent_mask, 0, ROUNDS, read_ahead_main, 60000);
        for (int i = 0; i < n; i++) {
            long back = group_stat(&a[i], "read_ahead_back="),
                 lent = group_stat(&a[i], "read_ahead_lent="),
                 leases = group_stat(&a[i], "leases="), direct = group_stat(&a[i], "direct=");
            fprintf(stderr,
                    "  pod %d: read_ahead_back=%ld read_ahead_lent=%ld leases=%ld direct=%ld\n", i,
                    back, lent, leases, direct);
            assert_true(back >= 0 && lent >= 0);
            if (jobs[i].agent_path) assert_int_equal(back + lent, 0);
        }
        /* pod 1 reads from the root: a direct client there that read the run's second op
         * itself gives bytes of the large op back with the lease (or its agent reads
         * ahead, and they go out with the next lease). Whether the large op's first bytes
         * arrive before the tiny op's read is the scheduler's to say (CI saw pod 2's
         * only, of 4; a loaded run none): what must hold whatever the timing is asserted
         * above and in the ranks (every result exact, no read-ahead where no lease went
         * out); the stash itself is tested on a real socket in test_tcp */
        long ahead = 0;
        for (int i = 1; i < n; i++)
            if (!jobs[i].agent_path)
                ahead +=
                    group_stat(&a[i], "read_ahead_back=") + group_stat(&a[i], "read_ahead_lent=");
        if (!jobs[1].agent_path && ahead == 0)
            fprintf(stderr, "  (no bytes were read ahead this time: the large op came late)\n");
    }
    member_agent = NULL;
}

/* ---- where pods run (rdv_wire.h: RDV_MEMBER_CPU_SHARED) ------------------------------ */

struct placed {
    const char *sock;
    int cpu;         /* the rank pins itself here, beside its agent */
    int delay_us;    /* sleep this long before each op */
    const char *out; /* rank 0 writes the CPU time its measured ops took (us) here */
};

#define PLACED_WARM 10
#define PLACED_OPS 40
#define PLACED_LATE_US 5000 /* rank 1's delay: longer than a held spin */

/* 8-byte allreduces, direct; rank 1 comes late to every one, so rank 0 waits for its
 * bytes each time, and its CPU time over the measured ops says how long it spun. */
static int placed_main(void *arg)
{
    const struct placed *o = arg;
    if (pin_to_cpu(o->cpu) != 0) return 170;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    if (coll_group_wait(g, 10000) != COLL_OK) return 171;
    int32_t *x = mem;
    struct rusage r0 = {0}, r1;
    for (int k = 0; k < PLACED_WARM + PLACED_OPS; k++) {
        if (k == PLACED_WARM) getrusage(RUSAGE_SELF, &r0);
        if (o->delay_us) usleep((useconds_t)o->delay_us);
        x[0] = k;
        x[1] = info.rank;
        coll_request q;
        coll_err e = mix_wait(c, coll_allreduce(g, x, x + 2, 2, COLL_INT32, COLL_SUM, NULL, &q), q);
        if (e) return mix_fail(info.rank, "allreduce", e);
        if (x[2] != 2 * k || x[3] != 1) return 172;
    }
    getrusage(RUSAGE_SELF, &r1);
    if (o->out) {
        long us =
            (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) *
                1000000L +
            (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
        FILE *f = fopen(o->out, "w");
        if (!f) return 173;
        fprintf(f, "%ld\n", us);
        fclose(f);
    }
    coll_disconnect(&c);
    return 0;
}

/* Two pods whose agents (and applications) run on CPUs of their own are told so at
 * the commit (cpu_shared=0, and coll_group_cpu_shared 0 in /metrics), and a direct
 * op's wait then spins its whole budget (TCP_SPIN_HOLD_NS) before it sleeps, every
 * time: next to other work a learnt spin falls to zero and each sleep hands that work
 * the CPU. Two pods on one CPU are told they share it, and their waits learn to sleep
 * at once, which lets the pod they wait for run. Measured by rank 0's CPU time while
 * it waits 40 times for a late peer. */
static void pods_on_cpus_of_their_own_hold_their_spin(void **state)
{
    (void)state;
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        fprintf(stderr, "skipped: needs 2 CPUs to place two pods apart\n");
        skip();
    }
    cpu_set_t old;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    if (!CPU_ISSET(0, &old) || !CPU_ISSET(1, &old)) {
        fprintf(stderr, "skipped: this process may not run on CPUs 0 and 1\n");
        skip();
    }
    long cpu_us[2];
    member_agent = "  direct_ops: true\n";
    for (int apart = 1; apart >= 0; apart--) {
        struct agent a[2];
        int port = free_port();
        char extra[128], scrape[128], figures[4096];
        int hport = http_extra(extra, sizeof(extra), port);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(pin_to_cpu(apart ? i : 0), 0); /* the agent inherits it */
            assert_int_equal(start_member(&a[i], port, i, 2, 1, i ? NULL : extra), 0);
        }
        assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
        for (int i = 0; i < 2; i++)
            assert_true(agent_log_wait(&a[i], "group.formed", 1, 10000));
        /* what the commit said, in /metrics too (the published text is up to 1 s old) */
        tmp_path(scrape, sizeof(scrape), "scrape", apart);
        assert_int_equal(metrics_fresh(hport, scrape, 10000), 200);
        int parsed = metrics_parse(scrape, figures, sizeof(figures));
        unlink(scrape);
        if (parsed == 77) {
            fprintf(stderr, "coll_group_cpu_shared not checked: %s", figures);
        } else {
            assert_int_equal(parsed, 0);
            assert_int_equal(metric_of(figures, "cpu_shared_g"), !apart);
        }
        char out[128];
        tmp_path(out, sizeof(out), "placed", apart);
        struct placed jobs[2] = {{a[0].sock, 0, 0, out},
                                 {a[1].sock, apart ? 1 : 0, PLACED_LATE_US, NULL}};
        run_ranks(placed_main, jobs, sizeof(jobs[0]), 2, 60000);
        stop_all(a, 2);
        for (int i = 0; i < 2; i++)
            assert_int_equal(agent_log_number(&a[i], "rendezvous.commit", "cpu_shared"), !apart);
        FILE *f = fopen(out, "r");
        assert_non_null(f);
        assert_int_equal(fscanf(f, "%ld", &cpu_us[apart]), 1);
        fclose(f);
        unlink(out);
        assert_true(group_stat(&a[0], "direct=") >= PLACED_OPS);
    }
    member_agent = NULL;
    fprintf(stderr, "rank 0's CPU time over %d waits: apart %ld us, on one CPU %ld us\n",
            PLACED_OPS, cpu_us[1], cpu_us[0]);
    /* apart, over what the same waits cost on one CPU (their calls): at least a quarter
     * of 40 held spins (a learnt spin is at zero after the 10 warm-up waits, so without
     * the hold the two differ by the calls alone, about 1 ms). A held spin is timed by
     * the clock, and the CPU time it gets is the scheduler's share: half next to one
     * busy loop per CPU, a third with a second suite running beside this one (which
     * once failed a bound of one half); a quarter keeps the margin whatever the load */
    assert_true(cpu_us[1] - cpu_us[0] >= PLACED_OPS * (TCP_SPIN_HOLD_NS / 1000) / 4);
    /* ... and the hold ends: each wait then sleeps out the rest of rank 1's delay */
    assert_true(cpu_us[1] < PLACED_OPS * PLACED_LATE_US * 9 / 10);
}

struct lost {
    const char *sock;
    const char *ready; /* touched once this rank has run direct ops for a while */
    int survivor;      /* 1: runs until an op fails, then re-forms; 0: runs until killed */
    int big;           /* COLL_DIRECT=all, and the ops until then 1 MiB allreduces */
};

#define LOST_BIG ((size_t)1 << 18) /* floats */

/* After the re-form: more tiny ops, which take the new epoch's connections. */
/* One tiny allreduce of two pods (x[0..16) = rank + 1, the sum at x + 64). */
static coll_err allreduce16(coll_conn *c, coll_group *g, float *x, int rank)
{
    for (int i = 0; i < 16; i++)
        x[i] = (float)(rank + 1);
    coll_request r;
    coll_err e = coll_allreduce(g, x, x + 64, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
    return e == COLL_OK ? coll_wait(c, r, 15000) : e;
}

static int more_allreduces(coll_conn *c, coll_group *g, float *x, int rank)
{
    for (int k = 0; k < 200; k++)
        if (allreduce16(c, g, x, rank) != COLL_OK || x[64] != 3.0f) return 166;
    return 0;
}

/* Tiny allreduces until one fails: it must fail, retryably and well inside the op
 * timeout (20 s), never hang; then the group re-forms with the pod's replacement. */
static int direct_lost_main(void *arg)
{
    const struct lost *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    if (o->big) setenv("COLL_DIRECT", "all", 1);
    int rc = rank_open(o->sock, o->big ? LOST_BIG * 8 : 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    if (coll_group_wait(g, 10000) != COLL_OK) return 160;
    float *x = mem;
    coll_err e = COLL_OK;
    double last = now_ms();
    for (long k = 0; e == COLL_OK; k++) {
        last = now_ms();
        if (o->big) {
            coll_request r;
            for (size_t i = 0; i < LOST_BIG; i++)
                x[i] = (float)(info.rank + 1);
            e = coll_allreduce(g, x, x + LOST_BIG, LOST_BIG, COLL_FLOAT32, COLL_SUM, NULL, &r);
            if (e == COLL_OK) e = coll_wait(c, r, 15000);
            if (e == COLL_OK && (x[LOST_BIG] != 3.0f || x[2 * LOST_BIG - 1] != 3.0f)) return 161;
        } else {
            e = allreduce16(c, g, x, info.rank);
            if (e == COLL_OK && x[64] != 3.0f) return 161;
        }
        if (k == (o->big ? 50 : 2000)) {
            FILE *f = fopen(o->ready, "w");
            if (f) fclose(f);
        }
    }
    double ms = now_ms() - last;
    fprintf(stderr, "rank %d: %s after %.0f ms (%s)\n", info.rank, coll_strerror(e), ms,
            coll_last_error());
    if (!o->survivor) return 162;
    /* a pod that died is no disagreement: an op the ending epoch still ran once read a
     * header the dead pod's client had sent with an op number from the lease's start */
    if (!coll_err_retryable(e) || e == COLL_ERR_MISMATCH || ms > 5000) return 163;
    e = allreduce_after_reform(c, &g, x, 16, info.rank);
    if (e != COLL_OK || x[64] != 3.0f) {
        fprintf(stderr, "rank %d: after the re-form: %s\n", info.rank, coll_strerror(e));
        return 164;
    }
    if (more_allreduces(c, g, x, info.rank)) return 166;
    coll_disconnect(&c);
    return 0;
}

static int reform_main(void *arg)
{
    const struct lost *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    coll_err e = allreduce_after_reform(c, &g, mem, 16, info.rank);
    if (e != COLL_OK || ((float *)mem)[64] != 3.0f) return 165;
    if (more_allreduces(c, g, mem, info.rank)) return 166;
    coll_disconnect(&c);
    return 0;
}

/* Two pods run direct ops (tiny ones, or with COLL_DIRECT=all 1 MiB allreduces, which
 * run whole in the application's wait); then pod 1's application is killed (what it
 * held ends with it), or pod 1's agent (its sockets close under both). Pod 0's op in
 * flight fails at once with a retryable error, its agent ends the epoch, and with a new
 * application (and agent) on pod 1 the group re-forms and runs. */
static void a_direct_op_ends_retryably_when_a_pod_dies(void **state)
{
    (void)state;
    member_agent = "  direct_ops: true\n";
    for (int run = 0; run < 4; run++) {
        int kill_agent = run & 1, big = run >> 1;
        struct agent a[2];
        int port;
        start_all(a, 2, 1, &port);
        char ready[128];
        tmp_path(ready, sizeof(ready), "ready", 0);
        struct lost l0 = {a[0].sock, ready, 1, big}, l1 = {a[1].sock, ready, 0, big};
        pid_t p0 = child_run(direct_lost_main, &l0), p1 = child_run(direct_lost_main, &l1);
        double until = now_ms() + 20000;
        while (access(ready, F_OK) != 0 && now_ms() < until)
            usleep(10000);
        assert_int_equal(access(ready, F_OK), 0);
        unlink(ready);
        fprintf(stderr, "case: kill pod 1's %s (%s ops)\n", kill_agent ? "agent" : "application",
                big ? "1 MiB" : "tiny");
        if (kill_agent) {
            kill(a[1].pid, SIGKILL);
            child_wait(a[1].pid, 5000);
            a[1].pid = 0;
        }
        kill(p1, SIGKILL);
        child_wait(p1, 5000);
        if (kill_agent) assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
        struct lost again = {a[1].sock, ready, 0};
        pid_t p2 = child_run(reform_main, &again);
        assert_int_equal(child_wait(p0, 30000), 0);
        assert_int_equal(child_wait(p2, 30000), 0);
        stop_all(a, 2);
        assert_true(group_stat(&a[0], "leases=") >= 2); /* before and after */
    }
    member_agent = NULL;
}

struct late {
    const char *sock;
    int kind;              /* 0 allreduce, 1 allgather */
    const char *drain_log; /* between submitting the last op and waiting for it, wait
                              until this agent's log says the epoch drains */
    int leave;             /* submit the last op late, close and go as soon as it is done */
};

/* Warm tiny ops (they take the lease), then one more: submitted, and waited for once
 * drain_log says the drain began. Four pods double: pod 1's second step is a send it
 * makes only in its wait (its first step's partner, pod 0, submits 50 ms after it). */
static int late_main(void *arg)
{
    const struct late *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 65536, &c, &g, &info, &mem);
    if (rc) return rc;
    if (coll_group_wait(g, 10000) != COLL_OK) return 160;
    float *x = mem;
    for (int k = 0; k < 50; k++) {
        coll_err e = allreduce16(c, g, x, info.rank);
        if (e != COLL_OK) {
            fprintf(stderr, "rank %d: warm op %d: %s\n", info.rank, k, coll_last_error());
            return 161;
        }
    }
    enum { N = 2048 }; /* 8 KiB a pod: above TCP_DIRECT_BYTES, so four pods double */
    for (int i = 0; i < N; i++)
        x[i] = (float)(info.rank + 1);
    /* the leavers last: pod 1's first step then finds nothing to read at submission */
    if (o->leave) usleep(50 * 1000);
    coll_request r;
    coll_err e = o->kind ? coll_allgather(g, x, x + N, N, COLL_FLOAT32, NULL, &r)
                         : coll_allreduce(g, x, x + N, N, COLL_FLOAT32, COLL_SUM, NULL, &r);
    if (e != COLL_OK) return 162;
    for (int i = 0; o->drain_log && i < 1000 && !file_has(o->drain_log, "event=rendezvous.drain");
         i++)
        usleep(10 * 1000);
    e = coll_wait(c, r, 15000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: the last op: %s (%s)\n", info.rank, coll_strerror(e),
                coll_last_error());
        return 163;
    }
    for (int i = 0; i < (o->kind ? 4 * N : N); i++) {
        float want = o->kind ? (float)(i / N + 1) : 10.0f;
        if (x[N + i] != want) return 164;
    }
    if (!o->leave) usleep(300 * 1000); /* the others leave first */
    coll_group_close(&g);
    coll_disconnect(&c);
    return 0;
}

/* A pod that finished an op and left had delivered its bytes: a pod still in that op
 * finishes it, direct as through its agent. Four pods, pod 1 slow to wait for its last
 * op, pods 0 and 2 done with it and gone before pod 1 makes its second step's send
 * (pod 1 waits for its agent's drain to begin, not for a time to pass): pod 1's agent
 * waits for its client's op before it ends the epoch (rendezvous.drain lent=1), and
 * pods 1 and 3 get the right result. */
static void a_late_pod_finishes_its_direct_op_when_others_leave(void **state)
{
    (void)state;
    member_agent = "  direct_ops: true\n";
    for (int kind = 0; kind < 2; kind++) {
        struct agent a[4];
        int port;
        start_all(a, 4, 1, &port);
        struct late jobs[4] = {{a[0].sock, kind, NULL, 1},
                               {a[1].sock, kind, a[1].log, 0},
                               {a[2].sock, kind, NULL, 1},
                               {a[3].sock, kind, NULL, 0}};
        fprintf(stderr, "case: %s\n", kind ? "allgather" : "allreduce");
        run_ranks(late_main, jobs, sizeof(jobs[0]), 4, 60000);
        assert_true(agent_log_wait(&a[1], "event=rendezvous.drain", 1, 5000));
        assert_true(agent_log_count(&a[1], "lent=1") >= 1);
        stop_all(a, 4);
    }
    member_agent = NULL;
}

static void mismatched_configs_are_rejected(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, NULL), 0);
    assert_int_equal(start_member(&a[1], port, 1, 2, 2, NULL), 0); /* 2 local slots */
    /* which setting, both values, and the member's own summary (its /readyz) says so */
    assert_true(agent_log_wait(
        &a[1], "differ from the coordinator's (pod pod-0): local_slots 2, not 1", 1, 5000));
    assert_true(agent_log_wait(&a[1], "state=\"refused by the coordinator: group 'g'", 1, 5000));
    assert_true(agent_log_wait(&a[0], "rendezvous.reject", 1, 5000));
    assert_int_equal(agent_log_count(&a[1], "hash"), 0); /* found on c65a60e: it was told */
    assert_int_equal(agent_stop(&a[1]), 0);
    /* world size: three pods against two */
    char body[512];
    snprintf(body, sizeof(body),
             "node:\n  index: 1\ndiscovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: g\n    backend: host\n    members: 3\n"
             "    timeouts: {op_ms: 20000, heartbeat_ms: %d, join_ms: 5000}\n",
             port, TEST_HB_MS);
    assert_int_equal(agent_start(&a[1], NULL, body), 0);
    assert_true(agent_log_wait(&a[1], "world size (members) 3, coordinator has 2", 1, 5000));
    assert_int_equal(agent_log_count(&a[0], "rendezvous.commit"), 0);
    stop_all(a, 2);
}

/* The data-plane port an agent logged at start ("data=host:port"), or -1. */
static int data_port_of(const struct agent *a)
{
    FILE *f = fopen(a->log, "r");
    if (!f) return -1;
    char line[1024];
    int port = -1;
    while (port < 0 && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "event=net.start");
        p = p ? strstr(p, " data=") : NULL;
        p = p ? strrchr(p, ':') : NULL;
        if (p) port = atoi(p + 1);
    }
    fclose(f);
    return port;
}

static void garbage_frames_are_dropped(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, NULL), 0);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(d, ep), 0);
    char junk[300];
    for (int i = 0; i < 300; i++)
        junk[i] = (char)(i * 7);
    zmq_send(d, junk, 3, 0);            /* short */
    zmq_send(d, junk, sizeof(junk), 0); /* bad magic */
    /* another version, JOIN */
    uint32_t hdr[sizeof(struct rdv_hdr) / 4] = {0x56445243u, (RDV_VERSION + 1) | (1u << 16)};
    zmq_send(d, hdr, sizeof(hdr), 0);
    zmq_send(d, junk, 10, ZMQ_SNDMORE); /* two frames */
    zmq_send(d, junk, 10, 0);
    union rdv_msg ask; /* a child's ask that lists a rank twice */
    rdv_init(&ask, RDV_CHILD_ASK, "g", 1);
    ask.child_ask.node_index = 1;
    ask.child_ask.nth = 1;
    ask.child_ask.n = 2;
    ask.child_ask.ranks[0] = ask.child_ask.ranks[1] = 1;
    zmq_send(d, &ask, rdv_size(&ask), 0);
    assert_true(agent_log_wait(&a[0], "rendezvous.bad_frame", 5, 5000));
    assert_int_equal(agent_log_count(&a[0], "CHILD_ASK from index 1: rank 1 listed twice"), 1);
    char other[64];
    snprintf(other, sizeof(other), "rendezvous version %d", RDV_VERSION + 1);
    assert_true(agent_log_wait(&a[0], other, 1, 1000));
    zmq_close(d);
    zmq_ctx_term(ctx);
    /* the data-plane listener too: a hello for a channel that does not exist, one of
     * another version, and bytes that are no hello at all */
    int dport = data_port_of(&a[0]);
    assert_true(dport > 0);
    struct data_hello bad[2] = {
        {.magic = DATA_MAGIC, .version = RDV_VERSION, .channel = DATA_CH_COUNT, .from_index = 1},
        {.magic = DATA_MAGIC, .version = RDV_VERSION + 1}};
    for (int i = 0; i < 3; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)dport),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        const void *msg = i < 2 ? (const void *)&bad[i] : (const void *)junk;
        assert_int_equal(write(fd, msg, sizeof(struct data_hello)), sizeof(struct data_hello));
        close(fd);
    }
    assert_true(agent_log_wait(&a[0], "data.refused", 3, 5000));
    assert_int_equal(agent_log_count(&a[0], "hello for channel 3"), 1);
    /* the coordinator still forms the group and runs ops */
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    stop_all(a, 2);
}

/* ---- disagreements between pods --------------------------------------------------------- */

enum {
    MM_BCAST_ROOTS,
    MM_REDUCE_ROOTS,
    MM_ALLREDUCE_VS_BCAST,
    MM_BIG_BCAST_ROOTS,
    MM_ALLGATHER_COUNTS,
    MM_SEND_COUNTS,
    MM_CASES
};

struct mm {
    const char *sock;
};

/* Rank r's op in case k (two pods, one participant each). */
static coll_err mm_submit(coll_group *g, int k, int r, float *x, coll_request *req)
{
    switch (k) {
    case MM_BCAST_ROOTS:
        return coll_broadcast(g, x, x, 16, COLL_FLOAT32, r, NULL, req);
    case MM_REDUCE_ROOTS:
        return coll_reduce(g, x, x + 64, 16, COLL_FLOAT32, COLL_SUM, r, NULL, req);
    case MM_ALLREDUCE_VS_BCAST:
        return r == 0 ? coll_allreduce(g, x, x + 64, 16, COLL_FLOAT32, COLL_SUM, NULL, req)
                      : coll_broadcast(g, x, x, 16, COLL_FLOAT32, 1, NULL, req);
    case MM_BIG_BCAST_ROOTS:
        return coll_broadcast(g, x, x, 1 << 20, COLL_FLOAT32, r, NULL, req);
    case MM_ALLGATHER_COUNTS:
        return coll_allgather(g, x, x + 64, 16 + (size_t)r, COLL_FLOAT32, NULL, req);
    default: /* a send of 50 against a receive of 100 */
        return r == 0 ? coll_send(g, x, 50, COLL_FLOAT32, 1, NULL, req)
                      : coll_recv(g, x, 100, COLL_FLOAT32, 0, NULL, req);
    }
}

static int mismatch_main(void *arg)
{
    const struct mm *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, (size_t)4 << 20, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    for (int k = 0; k < MM_CASES; k++) {
        coll_request r;
        double t0 = now_ms();
        coll_err e = mm_submit(g, k, info.rank, x, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        double ms = now_ms() - t0;
        if (e != COLL_ERR_MISMATCH || ms > 5000) {
            fprintf(stderr, "case %d rank %d: %s after %.0f ms (%s), want MISMATCH at once\n", k,
                    info.rank, coll_strerror(e), ms, coll_last_error());
            return 110 + k;
        }
        const char *both = k == MM_SEND_COUNTS
                               ? "sent 50 of float32; the receive on rank 1 is for 100"
                               : "this node";
        if (!strstr(coll_last_error(), both)) { /* both sides' ops in the text */
            fprintf(stderr, "case %d rank %d: '%s' does not name both ops\n", k, info.rank,
                    coll_last_error());
            return 120 + k;
        }
        /* the group serves the next op once reopened (the epoch moved on) */
        e = allreduce_after_reform(c, &g, x, 16, info.rank);
        if (e == COLL_ERR_NOT_FOUND) return 130;
        if (e != COLL_OK || x[64] != 3.0f) {
            fprintf(stderr, "case %d rank %d: next op %s\n", k, info.rank, coll_strerror(e));
            return 140 + k;
        }
    }
    coll_disconnect(&c);
    return 0;
}

/* Found on c65a60e: across two pods, broadcast with different roots returned OK on both
 * with nothing exchanged, reduce with different roots waited for its timeout, allreduce
 * against broadcast gave PEER_LOST to one rank, a send of 50 against a receive of 100 gave
 * the sender OK. Now every rank gets MISMATCH at once, naming both ops, and the group
 * serves the next op. */
static void disagreements_between_pods_are_mismatches(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 1, &port);
    struct mm jobs[2] = {{a[0].sock}, {a[1].sock}};
    run_ranks(mismatch_main, jobs, sizeof(jobs[0]), 2, 120000);
    stop_all(a, 2);
}

/* In a run of the same broadcast, the root does not wait for its peers' word on each op
 * (tcp.h: TCP_ACK_EVERY, TCP_ACK_WINDOW). A pod that turns away mid-run, to a broadcast
 * of its own (it reads nothing from the root) or to an allreduce, must still make every
 * rank fail with MISMATCH, the root within its window, and nobody wait for a deadline. */
#define RUN_AGREED 10
#define RUN_LATEST (RUN_AGREED + TCP_ACK_WINDOW * TCP_ACK_EVERY + TCP_ACK_EVERY + 1)
#define RUN_OPS (RUN_LATEST + 16) /* small ones run ahead as far as the window lets them */
#define RUN_AFTER 40              /* the run in the next epoch */

struct run {
    const char *sock;
    size_t count; /* floats per broadcast: tiny (direct) or the chain */
    int turn;     /* what rank 1 runs from op RUN_AGREED on: 0 its own broadcast, 1 allreduce */
};

static int run_turns_main(void *arg)
{
    const struct run *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, (o->count + 64) * 2 * sizeof(float), &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem, *y = x + o->count + 64;
    int failed_at = -1;
    /* start the run together: a pod still starting when the others have run ahead and
     * turned away finds the epoch ended (EPOCH) before its ops are even submitted */
    coll_request r0;
    coll_err e = coll_group_wait(g, 10000);
    if (e == COLL_OK) e = coll_barrier(g, NULL, &r0);
    if (e == COLL_OK) e = coll_wait(c, r0, 30000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: barrier before the run: %s\n", info.rank, coll_strerror(e));
        return 117;
    }
    for (int k = 0; k < RUN_OPS && failed_at < 0; k++) {
        for (size_t i = 0; info.rank == 0 && i < o->count; i++)
            x[i] = (float)(k + 1);
        coll_request r;
        double t0 = now_ms();
        if (info.rank == 1 && k >= RUN_AGREED && o->turn == 1)
            e = coll_allreduce(g, x, y, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
        else
            e = coll_broadcast(g, x, y, o->count, COLL_FLOAT32,
                               info.rank == 1 && k >= RUN_AGREED ? 1 : 0, NULL, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        double ms = now_ms() - t0;
        if (ms > 5000) {
            fprintf(stderr, "rank %d op %d: %s after %.0f ms, want no wait for a deadline\n",
                    info.rank, k, coll_strerror(e), ms);
            return 110;
        }
        if (e != COLL_OK) failed_at = k;
        if (e == COLL_OK && info.rank == 1 &&
            (y[0] != (float)(k + 1) || y[o->count - 1] != (float)(k + 1))) {
            fprintf(stderr, "rank 1 op %d: got %g, want %d\n", k, y[0], k + 1);
            return 111;
        }
    }
    /* rank 1 at once; the root within its window: MISMATCH where it reads the other's
     * header itself, EPOCH where rank 1 ended the epoch on it first (retryable: the
     * group re-formed; the logs name both ops) */
    /* (a third pod downstream of rank 1 in the chain may lag any number of ops behind
     * it: rank 1 relays each broadcast into that pod's socket and goes on, so on a busy
     * CPU rank 1 can turn while the third pod is still at op 0 or 1; the third pod then
     * finds the epoch ended, EPOCH, at whatever op it had reached. Found in CI under a
     * busy loop: EPOCH at op 1) */
    int latest = info.rank == 1 ? RUN_AGREED : RUN_LATEST;
    int earliest = info.rank >= 2 && e == COLL_ERR_EPOCH ? 0 : RUN_AGREED;
    int want = e == COLL_ERR_MISMATCH || (info.rank != 1 && e == COLL_ERR_EPOCH);
    if (failed_at < earliest || failed_at > latest || !want) {
        fprintf(stderr, "rank %d: %s at op %d (%s), want MISMATCH%s at op %d..%d\n", info.rank,
                coll_strerror(e), failed_at, coll_last_error(), info.rank != 1 ? " or EPOCH" : "",
                earliest, latest);
        return 112;
    }
    fprintf(stderr, "rank %d: %s at op %d\n", info.rank, coll_strerror(e), failed_at);
    /* the group serves the next op once reopened */
    e = allreduce_after_reform(c, &g, x, 16, info.rank);
    if (e == COLL_ERR_NOT_FOUND) return 113;
    if (e != COLL_OK || x[64] != (float)(info.size * (info.size + 1) / 2)) {
        fprintf(stderr, "rank %d: op after the mismatch: %s, %g\n", info.rank, coll_strerror(e),
                x[64]);
        return 114;
    }
    /* and a run of broadcasts in the new epoch, whose acks nothing of the old one spoils */
    for (int k = 0; k < RUN_AFTER; k++) {
        for (size_t i = 0; info.rank == 0 && i < o->count; i++)
            x[i] = (float)(100 + k);
        coll_request r;
        e = coll_broadcast(g, x, y, o->count, COLL_FLOAT32, 0, NULL, &r);
        if (e == COLL_OK) e = coll_wait(c, r, 30000);
        if (e != COLL_OK || y[0] != (float)(100 + k) || y[o->count - 1] != (float)(100 + k)) {
            fprintf(stderr, "rank %d: broadcast %d after the mismatch: %s (%s)\n", info.rank, k,
                    coll_strerror(e), coll_last_error());
            return 115;
        }
    }
    /* a root that leaves right after a run may leave the others' last ops of it
     * undelivered (they fail with EPOCH: docs/decisions/0009-broadcast-runs.md); any other op ends
     * the run */
    coll_request r;
    e = coll_barrier(g, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    if (e != COLL_OK) {
        fprintf(stderr, "rank %d: barrier after the run: %s (%s)\n", info.rank, coll_strerror(e),
                coll_last_error());
        return 116;
    }
    coll_disconnect(&c);
    return 0;
}

static void a_pod_that_turns_away_mid_run_is_a_mismatch(void **state)
{
    (void)state;
    /* two pods (one send each way) and three (the chain, small and large) */
    const struct {
        size_t count;
        int turn, pods;
    } cases[] = {{16, 0, 2}, {16, 1, 2}, {(size_t)1 << 20, 0, 2}, {(size_t)1 << 20, 1, 2},
                 {16, 0, 3}, {16, 1, 3}, {(size_t)1 << 20, 1, 3}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k].pods;
        struct agent a[3];
        int port;
        start_all(a, n, 1, &port);
        struct run jobs[3];
        for (int i = 0; i < n; i++)
            jobs[i] = (struct run){a[i].sock, cases[k].count, cases[k].turn};
        fprintf(stderr, "case: %d pods, %zu floats, rank 1 turns to %s\n", n, cases[k].count,
                cases[k].turn ? "an allreduce" : "its own broadcast");
        run_ranks(run_turns_main, jobs, sizeof(jobs[0]), n, 120000);
        int named = 0;
        for (int i = 0; i < n; i++)
            named += agent_log_count(&a[i], "this node");
        assert_true(named >= 1);
        stop_all(a, n);
    }
}

/* node.tcp_congestion: a name the kernel does not have falls back to reno, said once in
 * the log, and "" keeps the node's; the group works either way. */
static void data_connections_take_the_configured_congestion_control(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    const char *cc[2] = {"nonesuch", ""};
    for (int i = 0; i < 2; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n  tcp_congestion: \"%s\"\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: host\n    members: 2\n"
                 "    timeouts: {op_ms: 20000, heartbeat_ms: 250, join_ms: 5000}\n",
                 i, i, cc[i], port);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    assert_int_equal(agent_log_count(&a[0], "dataconn.congestion"), 1);
    assert_int_equal(agent_log_count(&a[0], "using=reno"), 1);
    assert_int_equal(agent_log_count(&a[1], "dataconn.congestion"), 0);
    stop_all(a, 2);
}

/* How many established TCP sockets of process pid `ss` shows with receive and send
 * buffers of exactly bytes each (the kernel doubles what SO_RCVBUF/SO_SNDBUF ask); -1
 * where there is no ss (iproute2). */
static int sockets_with_buffers(pid_t pid, long bytes)
{
    FILE *f = popen("ss -tmnpH state established 2>/dev/null", "r");
    if (!f) return -1;
    char line[512], owner[64], rb[32], tb[32];
    snprintf(owner, sizeof(owner), "pid=%d,", (int)pid);
    snprintf(rb, sizeof(rb), ",rb%ld,", bytes);
    snprintf(tb, sizeof(tb), ",tb%ld,", bytes);
    int n = 0, lines = 0, mine = 0;
    while (fgets(line, sizeof(line), f)) {
        lines++;
        if (line[0] != '\t') { /* a socket; its skmem follows on the next line */
            mine = strstr(line, owner) != NULL;
            continue;
        }
        if (mine && strstr(line, rb) && strstr(line, tb)) n++;
        mine = 0;
    }
    return pclose(f) == 0 && lines ? n : -1;
}

/* node.tcp_buffer_bytes: the data connections get that buffer each way (the kernel
 * doubles it), 0 leaves them to the kernel's autotuning; the group works either way. */
static void data_connections_take_the_configured_buffer_size(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    const int buf[2] = {98304, 0}; /* under the kernel's default cap (net.core.rmem_max) */
    for (int i = 0; i < 2; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n  tcp_buffer_bytes: %d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: host\n    members: 2\n"
                 "    timeouts: {op_ms: 20000, heartbeat_ms: 250, join_ms: 5000}\n",
                 i, i, buf[i], port);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    /* the connections go back to the agent once the application's lease of them ends
     * (direct ops): look for up to 5 s */
    int n0 = sockets_with_buffers(a[0].pid, 2 * 98304);
    for (int tries = 0; n0 >= 0 && n0 != 3 && tries < 50; tries++) {
        usleep(100 * 1000);
        n0 = sockets_with_buffers(a[0].pid, 2 * 98304);
    }
    int n1 = sockets_with_buffers(a[1].pid, 2 * 98304);
    stop_all(a, 2);
    if (n0 < 0) {
        printf("no ss (iproute2) to read the sockets' buffers: not checked\n");
        skip();
    }
    assert_int_equal(n0, 3); /* the pair's three connections (net.h: DATA_CH_COUNT) */
    assert_int_equal(n1, 0); /* autotuned: the kernel's own sizes, not ours */
}

/* ---- early messages ------------------------------------------------------------------ */

#define EARLY_FLOATS (4u << 20) /* 16 MiB */

struct early {
    const char *sock;
    pid_t agent; /* rank 0: its agent, whose memory it watches */
    int hport;   /* ... and its endpoints' port */
    char file[128];
};

/* The early bytes the agent serving its endpoints at hport holds for group g
 * (coll_group_early_bytes), read into file, from a text it published after this call
 * when fresh; -1 when none came within 10 s. */
static long early_bytes(int hport, const char *file, int fresh)
{
    char url[96], key[] = "\ncoll_group_early_bytes{group=\"g\"} ";
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", hport);
    if ((fresh ? metrics_fresh(hport, file, 10000) : http_get(url, file)) != 200) return -1;
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    static char text[65536];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = 0;
    const char *at = strstr(text, key);
    return at ? strtol(at + strlen(key), NULL, 10) : -1;
}

static long rss_kib(pid_t pid)
{
    return proc_status(pid, 0, "VmRSS");
}

static int early_rank_main(void *arg)
{
    struct early *e = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(e->sock, (size_t)EARLY_FLOATS * 4, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    coll_request r;
    if (info.rank == 1) {
        for (size_t i = 0; i < EARLY_FLOATS; i++)
            x[i] = (float)(i % 1000);
        if (coll_send(g, x, EARLY_FLOATS, COLL_FLOAT32, 0, NULL, &r) || coll_wait(c, r, 30000))
            return 110;
    } else {
        long before = rss_kib(e->agent), held = 0;
        /* the agent holds the ask (an RTS: 128 bytes) once it came; the payload waits in
         * the sender's socket, however long this receive is not posted */
        double end = now_ms() + 30000;
        while ((held = early_bytes(e->hport, e->file, 0)) <= 0 && now_ms() < end)
            usleep(20 * 1000); /* none yet, or no answer yet (-1) */
        if (held == 128) held = early_bytes(e->hport, e->file, 1); /* and a second later */
        if (held != 128) {
            fprintf(stderr, "agent 0 holds %ld bytes for an early 16 MiB send (128: its ask)\n",
                    held);
            return 111;
        }
        long after = rss_kib(e->agent);
        if (before < 0 || after < 0 || after - before > 8 * 1024) {
            fprintf(stderr, "agent 0 grew from %ld to %ld KiB holding an early message\n", before,
                    after);
            return 112;
        }
        if (coll_recv(g, x, EARLY_FLOATS, COLL_FLOAT32, 1, NULL, &r) || coll_wait(c, r, 30000))
            return 113;
        for (size_t i = 0; i < EARLY_FLOATS; i++)
            if (x[i] != (float)(i % 1000)) return 114;
    }
    coll_disconnect(&c);
    return 0;
}

/* Receives from any rank on 2 pods of 2 ranks, rank 0 receiving. Rounds: ranks 1 (its
 * pod's: the engine pairs it) and 2 (the other pod's: the net thread) each send one
 * message of the round's tag to two receives from any rank, posted 32 rounds at a time,
 * so that both threads race for the same receives; each must take exactly one message,
 * say its sender and hold that sender's value. Then large messages (asked for first, then
 * cleared) from ranks 1, 2 and 3 to three such receives; then 20 messages of rank 3 to
 * receives from any rank and named ones in turn, which meet them in the order sent. */
#define ANY_ROUNDS 320
#define ANY_WINDOW 32
#define ANY_BIG (300u * 1024u) /* floats: 1.2 MB, over the early-message limit */

static int any_rank_main(void *arg)
{
    const char *sock = *(const char **)arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(sock, (size_t)4 * ANY_BIG * 4, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    coll_request r[2 * ANY_WINDOW];
    int src[2 * ANY_WINDOW];
    if (info.rank == 0) {
        for (int w = 0; w < ANY_ROUNDS; w += ANY_WINDOW) {
            for (int k = 0; k < 2 * ANY_WINDOW; k++)
                if (coll_recv_any(g, x + k, 1, COLL_FLOAT32, 1 + w + k / 2, &src[k], NULL, &r[k]))
                    return 110;
            for (int k = 0; k < 2 * ANY_WINDOW; k++)
                if (coll_wait(c, r[k], 30000)) {
                    fprintf(stderr, "rank 0: %s\n", coll_last_error());
                    return 111;
                }
            for (int k = 0; k < 2 * ANY_WINDOW; k += 2) {
                int round = w + k / 2;
                if (src[k] + src[k + 1] != 3 || (src[k] != 1 && src[k] != 2)) {
                    fprintf(stderr, "round %d: sources %d and %d\n", round, src[k], src[k + 1]);
                    return 112;
                }
                for (int j = 0; j < 2; j++)
                    if (x[k + j] != (float)(src[k + j] * 1000 + round)) return 113;
            }
        }
        for (int k = 0; k < 3; k++)
            if (coll_recv_any(g, x + (size_t)(k + 1) * ANY_BIG, ANY_BIG, COLL_FLOAT32, 9000,
                              &src[k], NULL, &r[k]))
                return 114;
        for (int k = 0; k < 3; k++)
            if (coll_wait(c, r[k], 30000)) {
                fprintf(stderr, "rank 0, large: %s\n", coll_last_error());
                return 115;
            }
        if (src[0] + src[1] + src[2] != 6 || src[0] * src[1] * src[2] != 6) return 116;
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < ANY_BIG; i++)
                if (x[(size_t)(k + 1) * ANY_BIG + i] != (float)(src[k] * 7 + (int)(i % 1009)))
                    return 117;
        for (int k = 0; k < 20; k++) {
            int rc2 = k % 2 ? coll_recv_tag(g, x + k, 1, COLL_FLOAT32, 3, 9001, NULL, &r[k])
                            : coll_recv_any(g, x + k, 1, COLL_FLOAT32, 9001, &src[k], NULL, &r[k]);
            if (rc2) return 118;
        }
        for (int k = 0; k < 20; k++) {
            if (coll_wait(c, r[k], 30000)) return 119;
            if (x[k] != (float)k || (k % 2 == 0 && src[k] != 3)) {
                fprintf(stderr, "message %d: %g from %d\n", k, (double)x[k], src[k]);
                return 120;
            }
        }
    } else {
        if (info.rank < 3)
            for (int round = 0; round < ANY_ROUNDS; round++) {
                x[0] = (float)(info.rank * 1000 + round);
                if (coll_send_tag(g, x, 1, COLL_FLOAT32, 0, 1 + round, NULL, &r[0]) ||
                    coll_wait(c, r[0], 30000)) {
                    fprintf(stderr, "rank %d: %s\n", info.rank, coll_last_error());
                    return 121;
                }
            }
        for (size_t i = 0; i < ANY_BIG; i++)
            x[i] = (float)(info.rank * 7 + (int)(i % 1009));
        if (coll_send_tag(g, x, ANY_BIG, COLL_FLOAT32, 0, 9000, NULL, &r[0]) ||
            coll_wait(c, r[0], 30000))
            return 122;
        if (info.rank == 3) {
            for (int k = 0; k < 20; k++) {
                x[ANY_BIG + (size_t)k] = (float)k;
                if (coll_send_tag(g, x + ANY_BIG + k, 1, COLL_FLOAT32, 0, 9001, NULL, &r[k]))
                    return 123;
            }
            for (int k = 0; k < 20; k++)
                if (coll_wait(c, r[k], 30000)) return 124;
        }
    }
    /* nobody leaves before rank 0 is done: a rank leaving ends the epoch */
    if (coll_barrier(g, NULL, &r[0]) || coll_wait(c, r[0], 30000)) return 125;
    coll_disconnect(&c);
    return 0;
}

static void receives_from_any_rank_across_pods(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 2, &port);
    const char *socks[4] = {a[0].sock, a[0].sock, a[1].sock, a[1].sock};
    run_ranks(any_rank_main, socks, sizeof(socks[0]), 4, 120000);
    stop_all(a, 2);
}

/* A receive from any rank waiting in both threads when the other pod dies: pods of 2
 * ranks, rank 0's receive (its entry in the engine, its twin with the net thread) and
 * one from rank 2 by name fail with a retryable error, never complete twice or hang;
 * with pod 1 back, the group re-forms and a receive from any rank takes sends from both
 * pods again. */
struct anylost {
    const char *sock;
    const char *ready; /* touched once rank 0's receive is posted */
    int doomed;        /* 1: pod 1's first ranks, killed while they wait */
};

static int anylost_main(void *arg)
{
    const struct anylost *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    coll_request r;
    if (o->ready) { /* the first epoch */
        if (coll_barrier(g, NULL, &r) || coll_wait(c, r, 30000)) return 130;
        if (o->doomed) {
            sleep(60); /* killed meanwhile */
            return 131;
        }
        if (info.rank == 0) {
            int src = -5;
            coll_request named;
            if (coll_recv_any(g, x + 200, 1, COLL_FLOAT32, 11, &src, NULL, &r)) return 132;
            /* and one from rank 2 by name: the engine reads its socket while it spins */
            if (coll_recv(g, x + 210, 1, COLL_FLOAT32, 2, NULL, &named)) return 132;
            FILE *f = fopen(o->ready, "w");
            if (!f) return 133;
            fclose(f);
            coll_err e = coll_wait(c, r, 30000);
            if (!coll_err_retryable(e) || src != -5) {
                fprintf(stderr, "rank 0: %s (%s), source %d\n", coll_strerror(e), coll_last_error(),
                        src);
                return 134;
            }
            e = coll_wait(c, named, 30000);
            if (!coll_err_retryable(e)) {
                fprintf(stderr, "rank 0, named: %s (%s)\n", coll_strerror(e), coll_last_error());
                return 134;
            }
        }
    }
    coll_err e = allreduce_after_reform(c, &g, x, 16, info.rank);
    if (e != COLL_OK || x[64] != 10.0f) {
        fprintf(stderr, "re-form: %s (%s), %g\n", coll_strerror(e), coll_last_error(),
                (double)x[64]);
        return 135;
    }
    coll_group_info_get(g, &info); /* the ranks may have moved between pod 0's two */
    int src[2] = {-1, -1};
    coll_request q[2];
    if (info.rank == 0) {
        for (int k = 0; k < 2; k++)
            if (coll_recv_any(g, x + 300 + k, 1, COLL_FLOAT32, 12, &src[k], NULL, &q[k]))
                return 136;
        for (int k = 0; k < 2; k++)
            if (coll_wait(c, q[k], 30000)) return 137;
        if (src[0] + src[1] != 3 || src[0] * src[1] != 2) return 138;
        for (int k = 0; k < 2; k++)
            if (x[300 + k] != (float)(40 + src[k])) return 139;
    } else if (info.rank <= 2) {
        x[300] = (float)(40 + info.rank);
        if (coll_send_tag(g, x + 300, 1, COLL_FLOAT32, 0, 12, NULL, &q[0]) ||
            coll_wait(c, q[0], 30000))
            return 140;
    }
    if (coll_barrier(g, NULL, &r) || coll_wait(c, r, 30000)) return 141;
    coll_disconnect(&c);
    return 0;
}

static void a_receive_from_any_rank_fails_retryably_when_a_pod_dies(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 2, &port);
    char ready[128];
    tmp_path(ready, sizeof(ready), "ready", 0);
    struct anylost pod0 = {a[0].sock, ready, 0}, pod1 = {a[1].sock, ready, 1};
    pid_t p[4] = {child_run(anylost_main, &pod0), child_run(anylost_main, &pod0),
                  child_run(anylost_main, &pod1), child_run(anylost_main, &pod1)};
    double until = now_ms() + 20000;
    while (access(ready, F_OK) != 0 && now_ms() < until)
        usleep(10000);
    assert_int_equal(access(ready, F_OK), 0);
    unlink(ready);
    usleep(100 * 1000); /* its twin posted with the net thread */
    kill(a[1].pid, SIGKILL);
    child_wait(a[1].pid, 5000);
    a[1].pid = 0;
    for (int i = 2; i < 4; i++) {
        kill(p[i], SIGKILL);
        child_wait(p[i], 5000);
    }
    assert_int_equal(start_member(&a[1], port, 1, 2, 2, NULL), 0);
    struct anylost again = {a[1].sock, NULL, 0};
    p[2] = child_run(anylost_main, &again);
    p[3] = child_run(anylost_main, &again);
    for (int i = 0; i < 4; i++)
        assert_int_equal(child_wait(p[i], 60000), 0);
    stop_all(a, 2);
}

/* Found on c65a60e: a message sent before its receive was posted was copied into memory
 * the net thread allocated, whatever size its header announced (up to 1 TiB). Now only
 * small ones are, within per-peer and per-group bounds; a large one waits in the
 * sender's socket and lands straight in the receive's buffer. */
static void early_large_send_waits_in_the_socket(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    char extra[128];
    struct early e[2] = {{.hport = http_extra(extra, sizeof(extra), port)}};
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, extra), 0);
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
    e[0].sock = a[0].sock, e[0].agent = a[0].pid, e[1].sock = a[1].sock;
    tmp_path(e[0].file, sizeof(e[0].file), "early-metrics", 0);
    run_ranks(early_rank_main, e, sizeof(e[0]), 2, 60000);
    unlink(e[0].file);
    stop_all(a, 2);
}

/* Found by the gather sweep on bf2af60: a large message whose receive was not posted yet
 * waited in the stream from its pod, and every later message of that pod to ours waited
 * behind it, other ranks' too; a receive that had to complete before the large one's
 * was posted then never could. Pods of 2 ranks: rank 0 sends 8 MiB to rank 2, which
 * posts its receive only after rank 3 has received rank 1's small message (sent after
 * rank 0's). Now a large send asks first and its payload follows the receive. */
#define HOL_FLOATS (2u << 20)

struct hol {
    const char *sock;
    char done[128]; /* rank 3 made it: its receive completed */
};

static int hol_rank_main(void *arg)
{
    struct hol *h = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(h->sock, (size_t)HOL_FLOATS * 4, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    coll_request r;
    switch (info.rank) {
    case 0:
        for (size_t i = 0; i < HOL_FLOATS; i++)
            x[i] = (float)(i % 977);
        if (coll_send(g, x, HOL_FLOATS, COLL_FLOAT32, 2, NULL, &r) || coll_wait(c, r, 30000)) {
            fprintf(stderr, "rank 0: %s\n", coll_last_error());
            return 110;
        }
        break;
    case 1:
        usleep(300 * 1000); /* behind rank 0's message, most likely */
        x[0] = 1, x[1] = 2, x[2] = 3, x[3] = 4;
        if (coll_send(g, x, 4, COLL_FLOAT32, 3, NULL, &r) || coll_wait(c, r, 30000)) return 111;
        break;
    case 2: {
        double end = now_ms() + 30000; /* rank 3 first */
        while (access(h->done, F_OK) != 0 && now_ms() < end)
            usleep(10 * 1000);
        if (access(h->done, F_OK) != 0) return 112;
        if (coll_recv(g, x, HOL_FLOATS, COLL_FLOAT32, 0, NULL, &r) || coll_wait(c, r, 30000))
            return 113;
        for (size_t i = 0; i < HOL_FLOATS; i++)
            if (x[i] != (float)(i % 977)) return 114;
        break;
    }
    default:
        if (coll_recv(g, x, 4, COLL_FLOAT32, 1, NULL, &r) || coll_wait(c, r, 30000)) {
            fprintf(stderr, "rank 3: %s\n", coll_last_error());
            return 115;
        }
        if (x[0] != 1 || x[3] != 4) return 116;
        FILE *f = fopen(h->done, "w");
        if (!f) return 117;
        fclose(f);
        break;
    }
    /* stay until every rank is done (a participant that leaves ends the epoch) */
    char mine[160], other[160];
    snprintf(mine, sizeof(mine), "%s.r%d", h->done, info.rank);
    FILE *f = fopen(mine, "w");
    if (!f) return 118;
    fclose(f);
    for (int k = 0; k < 4; k++) {
        snprintf(other, sizeof(other), "%s.r%d", h->done, k);
        double end = now_ms() + 30000;
        while (access(other, F_OK) != 0 && now_ms() < end)
            usleep(10 * 1000);
    }
    coll_disconnect(&c);
    return 0;
}

static void a_large_early_send_holds_no_other_rank_back(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 2, &port);
    struct hol h[4];
    char done[128];
    tmp_path(done, sizeof(done), "hol-done", 0);
    unlink(done);
    for (int i = 0; i < 4; i++) {
        h[i].sock = a[i / 2].sock;
        snprintf(h[i].done, sizeof(h[i].done), "%s", done);
    }
    run_ranks(hol_rank_main, h, sizeof(h[0]), 4, 60000);
    unlink(done);
    for (int k = 0; k < 4; k++) {
        char r[160];
        snprintf(r, sizeof(r), "%s.r%d", done, k);
        unlink(r);
    }
    stop_all(a, 2);
}

/* ---- hostile peers ------------------------------------------------------------------- */

/* A deployment's CURVE keys, made by the real `coll-agent keygen`, in a fresh directory. */
static void make_keys(char *dir, size_t cap)
{
    tmp_path(dir, cap, "keys", 0);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && '%s' keygen '%s' >/dev/null", dir, COLL_AGENT_PATH,
             dir);
    assert_int_equal(system(cmd), 0);
}

/* The incarnation of the last epoch the agent committed (its rendezvous.commit line). */
static uint64_t inc_of(const struct agent *a)
{
    FILE *f = fopen(a->log, "r");
    if (!f) return 0;
    char line[1024];
    uint64_t inc = 0;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "event=rendezvous.commit ");
        p = p ? strstr(p, " inc=") : NULL;
        if (p) inc = strtoull(p + 5, NULL, 16);
    }
    fclose(f);
    return inc;
}

/* A hostile process on the data port: reads the agent's challenge and answers with a
 * hello that claims to be node from_index for (inc, epoch), without the epoch's secret. */
static int forge_hello(int dport, uint64_t inc, uint32_t epoch, uint16_t channel,
                       uint32_t from_index)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)dport),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) return -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct data_challenge c;
    if (read(fd, &c, sizeof(c)) != (ssize_t)sizeof(c) || c.magic != DATA_MAGIC) return -1;
    struct data_hello h = {.magic = DATA_MAGIC,
                           .version = RDV_VERSION,
                           .channel = channel,
                           .group_hash = rdv_fnv1a("g", 1, RDV_FNV_INIT),
                           .inc = inc,
                           .epoch = epoch,
                           .from_index = from_index};
    memcpy(h.mac, c.nonce, sizeof(h.mac)); /* any guess */
    if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) return -1;
    return fd; /* kept open: the agent decides */
}

/* What the agent answered a forged hello: a welcome's status, 0 for a close without
 * one, -1 for nothing within 10 s. */
static int answer_of(int fd)
{
    struct data_welcome w;
    ssize_t r = read(fd, &w, sizeof(w));
    if (r == 0) return 0;
    if (r != (ssize_t)sizeof(w)) return -1;
    return w.status;
}

/* Found on c65a60e: a process that connected to pod 0's data port before pod 1 did and
 * sent an op's bytes turned 1+1 into 1001, both pods reporting success. Now every data
 * connection proves the epoch's secret over a fresh nonce: forged hellos for the current
 * epoch are refused and logged. Found at 242e584: a newer hello for an epoch to come,
 * from the same address, displaced the one kept before it, a genuine member's as well
 * as a forgery's. Now none displaces another: a few per source and claimed connection
 * wait for their epoch, one more is told NOT_YET, and a member that shares the
 * forger's address (loopback here) still connects when its epoch comes; the group's
 * results stay exact, before and after it re-forms. */
static void forged_data_hellos_are_refused(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 1, &port);
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    /* the ranks' leaving ends epoch 1 (and, when the engine's mark comes after the next
     * commit, epoch 2 too): forge once the group has formed again, or a hello for epoch
     * 1 can land after it ended ("over") while the next is not committed, and no forgery
     * meets a committed epoch (seen under TSan in CI) */
    assert_true(agent_log_wait(&a[0], "event=group.formed ", 2, 10000));
    int dport = data_port_of(&a[0]);
    assert_true(dport > 0);
    uint64_t inc = inc_of(&a[0]);
    long e = agent_log_number(&a[0], "rendezvous.commit", "epoch");
    assert_true(inc != 0 && e >= 2);
    /* the current epoch, every channel: refused, and closed without a welcome */
    for (uint16_t ch = 0; ch < DATA_CH_COUNT; ch++) {
        int fd = forge_hello(dport, inc, (uint32_t)e, ch, 1);
        assert_true(fd >= 0);
        assert_int_equal(answer_of(fd), 0);
        close(fd);
    }
    assert_true(agent_log_wait(&a[0], "does not prove the epoch's secret", 3, 5000));
    /* epochs to come on one connection (COLL from node 1): CLAIMS_PER_SOURCE (2) wait,
     * the next ones are told NOT_YET, and the waiting ones are not dropped for them */
    int fds[4];
    for (int k = 0; k < 4; k++) {
        fds[k] = forge_hello(dport, inc, (uint32_t)e + 1, DATA_CH_COLL, 1);
        assert_true(fds[k] >= 0);
    }
    for (int k = 2; k < 4; k++)
        assert_int_equal(answer_of(fds[k]), DATA_WELCOME_NOT_YET);
    for (int k = 0; k < 2; k++) { /* still waiting: nothing to read yet */
        char b;
        assert_int_equal(recv(fds[k], &b, 1, MSG_DONTWAIT), -1);
        assert_int_equal(errno, EAGAIN);
    }
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    usleep(1100 * 1000); /* past the log's rate-limit window (10 lines a second) */
    /* pod 1 restarts: the next epochs commit while the forged hellos for them wait, and
     * pod 1's own, from the same address, are not displaced by them (nor they by it).
     * Epoch e + 1 commits on pod 0 by then (the ranks' leaving above may have ended
     * epoch e already; the restart surely does): both forgeries were judged at it */
    assert_int_equal(agent_stop(&a[1]), 0);
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    assert_true(agent_log_wait(&a[0], "does not prove the epoch's secret", 3 + 2, 5000));
    for (int k = 0; k < 2; k++)
        assert_int_equal(answer_of(fds[k]), 0); /* refused, without a welcome */
    for (int k = 0; k < 4; k++)
        close(fds[k]);
    stop_all(a, 2);
}

/* A node 0 of the test's own: a ZeroMQ ROUTER that speaks the rendezvous and a data
 * listener that speaks the handshake, for a real member agent (node 1 of 2) to meet.
 * It knows the epoch's secret (it makes it), so it can be a member that misbehaves. */
struct fake0 {
    void *ctx, *router;
    int lfd, port;
    uint8_t id[256];
    int idlen;
    union rdv_msg commit;
    int fds[DATA_CH_COUNT]; /* by channel, once up */
};

static void fake0_open(struct fake0 *f)
{
    memset(f, 0, sizeof(*f));
    f->port = free_port();
    f->ctx = zmq_ctx_new();
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", f->port);
    assert_int_equal(zmq_bind(f->router, ep), 0);
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(f->lfd, 8), 0);
    for (int k = 0; k < DATA_CH_COUNT; k++)
        f->fds[k] = -1;
}

static void fake0_close(struct fake0 *f)
{
    for (int k = 0; k < DATA_CH_COUNT; k++)
        if (f->fds[k] >= 0) close(f->fds[k]);
    close(f->lfd);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
}

/* A heartbeat of the committed epoch to the member. */
static void fake0_beat(struct fake0 *f)
{
    union rdv_msg hb;
    rdv_init(&hb, RDV_HEARTBEAT, "g", f->commit.h.epoch);
    hb.h.inc = f->commit.h.inc;
    zmq_send(f->router, f->id, (size_t)f->idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(f->router, &hb, rdv_size(&hb), ZMQ_DONTWAIT);
    char drop[512]; /* and whatever the member sent meanwhile */
    while (zmq_recv(f->router, drop, sizeof(drop), ZMQ_DONTWAIT) >= 0)
        ;
}

/* Wait for the member's JOIN and commit the next epoch with it. 0, or -1. */
static int fake0_commit(struct fake0 *f)
{
    union rdv_msg m;
    f->idlen = -1;
    for (int t = 0; t < 100 && f->idlen < 0; t++) {
        zmq_pollitem_t it = {.socket = f->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        int l = zmq_recv(f->router, f->id, sizeof(f->id), 0);
        int n = zmq_recv(f->router, &m, sizeof(m), 0);
        char why[160];
        if (l > 0 && n > 0 && rdv_decode(&m, (size_t)n, &m, why, sizeof(why)) == 0 &&
            m.h.type == RDV_JOIN)
            f->idlen = l;
    }
    if (f->idlen < 0) return -1;
    for (;;) { /* connections of a round before, closed by the member: none of this one */
        struct pollfd p = {.fd = f->lfd, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0) break;
        close(accept(f->lfd, NULL, NULL));
    }
    char self[64];
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    getsockname(f->lfd, (struct sockaddr *)&sa, &sl);
    snprintf(self, sizeof(self), "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    uint32_t epoch = f->commit.h.epoch + 1;
    union rdv_msg *c = &f->commit;
    rdv_init(c, RDV_COMMIT, "g", epoch);
    c->h.inc = 0x5eed;
    c->commit.nodes = 2;
    for (int i = 0; i < RDV_SECRET_BYTES; i++)
        c->commit.secret[i] = (uint8_t)(i * 3 + (int)epoch);
    rdv_member_set(&c->commit.members[0], self);
    rdv_member_set(&c->commit.members[1], m.join.data_addr);
    c->commit.members[0].flags = c->commit.members[1].flags = RDV_MEMBER_CPU_SHARED;
    c->h.len = (uint32_t)rdv_size(c);
    zmq_send(f->router, f->id, (size_t)f->idlen, ZMQ_SNDMORE);
    zmq_send(f->router, c, rdv_size(c), 0);
    return 0;
}

/* Take the member's connections (node 1 opens them): our challenge, its hello, our
 * welcome, whose mac proves the secret (right) or not. 1: all three up and the member
 * formed; 0: the member refused our first welcome and ended the epoch; -1: the dance
 * broke. */
static int fake0_accept(struct fake0 *f, const struct agent *member, int right)
{
    int formed_before = agent_log_count(member, "event=group.formed ");
    int ended_before = agent_log_count(member, "its welcome does not prove");
    for (int k = 0; k < DATA_CH_COUNT; k++) {
        struct pollfd p = {.fd = f->lfd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) return -1;
        int fd = accept(f->lfd, NULL, NULL);
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        struct data_challenge ch = {.magic = DATA_MAGIC, .version = RDV_VERSION};
        for (int i = 0; i < 32; i++)
            ch.nonce[i] = (uint8_t)(i + k);
        struct data_hello h;
        if (write(fd, &ch, sizeof(ch)) != (ssize_t)sizeof(ch) ||
            read(fd, &h, sizeof(h)) != (ssize_t)sizeof(h) || h.channel >= DATA_CH_COUNT)
            return -1;
        struct data_welcome w = {.magic = DATA_MAGIC,
                                 .version = RDV_VERSION,
                                 .status = DATA_WELCOME_OK,
                                 .channel = h.channel,
                                 .to_index = 0,
                                 .group_hash = h.group_hash,
                                 .inc = h.inc,
                                 .epoch = h.epoch};
        /* the mac: HMAC-SHA256(secret, hello nonce || welcome before mac), or a guess */
        uint8_t key[RDV_SECRET_BYTES];
        memcpy(key, f->commit.commit.secret, sizeof(key));
        if (!right) key[0] ^= 1;
        sec_mac(w.mac, key, h.nonce, &w, DATA_WELCOME_SIGNED);
        if (write(fd, &w, sizeof(w)) != (ssize_t)sizeof(w)) return -1;
        if (!right) {
            close(fd);
            return agent_log_wait(member, "its welcome does not prove", ended_before + 1, 5000)
                       ? 0
                       : -1;
        }
        f->fds[h.channel] = fd;
    }
    return agent_log_wait(member, "event=group.formed ", formed_before + 1, 5000);
}

/* The test's node 0 and a real member (node 1 of 2, one slot; with hport, serving its
 * endpoints there), formed: the member's connections are in f->fds. */
static void fake0_with_member(struct fake0 *f, struct agent *member, int *hport)
{
    fake0_open(f);
    char extra[128] = "";
    if (hport) *hport = http_extra(extra, sizeof(extra), f->port);
    assert_int_equal(start_member(member, f->port, 1, 2, 1, extra), 0);
    assert_int_equal(fake0_commit(f), 0);
    assert_int_equal(fake0_accept(f, member, 1), 1);
}

/* Found at 242e584: only the connecting side proved the epoch's secret, yet it read
 * COLL_BACK and P2P bytes from the other side. Now the accepting side proves it too
 * (its welcome, over the hello's fresh nonce): a listener at the listed address without
 * the secret gets no connection, one with it does. */
static void the_accepting_side_proves_the_secret_too(void **state)
{
    (void)state;
    struct fake0 f;
    fake0_open(&f);
    struct agent a;
    assert_int_equal(start_member(&a, f.port, 1, 2, 1, NULL), 0);
    assert_int_equal(fake0_commit(&f), 0);
    assert_int_equal(fake0_accept(&f, &a, 0), 0); /* a guess: refused */
    assert_int_equal(agent_log_count(&a, "event=group.formed "), 0);
    assert_int_equal(fake0_commit(&f), 0);
    assert_int_equal(fake0_accept(&f, &a, 1), 1); /* the secret: formed */
    assert_int_equal(agent_stop(&a), 0);
    fake0_close(&f);
}

/* Found at 242e584: sends of no bytes that come before their receives were never charged
 * against the bound on what a peer may make the agent keep: a million of them grew the
 * net thread's heap by 106.8 MiB. Now each is charged its record and counted, and past
 * UNX_PEER_MSGS the rest wait in the sender's socket: a member (the test's node 0, with
 * the epoch's secret) that sends a million finds its socket full long before, and the
 * agent's memory stays where it was. */
static void a_flood_of_empty_early_sends_is_bounded(void **state)
{
    (void)state;
    struct fake0 f;
    struct agent a;
    char file[128];
    int hport;
    tmp_path(file, sizeof(file), "flood-metrics", 0);
    fake0_with_member(&f, &a, &hport);
    long rss0 = proc_status(a.pid, 0, "VmRSS");
    assert_true(rss0 > 0);
    int fd = f.fds[DATA_CH_P2P];
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int small = 64 << 10; /* what waits in the sockets: the agent's 8 MiB receive buffer */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    /* rank 0 (us) to rank 1 (the member's slot), no payload: 40 bytes each */
    enum { BATCH = 1024, FLOOD = 1000000 };
    static struct data_op_hdr h[BATCH];
    for (int i = 0; i < BATCH; i++)
        h[i] = (struct data_op_hdr){.magic = DATA_MAGIC,
                                    .kind = WIRE_OP_SEND,
                                    .dtype = COLL_INT32,
                                    .src_rank = 0,
                                    .dst_rank = 1,
                                    .count = 0};
    size_t sent = 0, want = (size_t)FLOOD * sizeof(h[0]);
    double until = now_ms() + 10000, beat = 0;
    while (sent < want && now_ms() < until) {
        if (now_ms() > beat) { /* keep the epoch: the member hears its coordinator */
            fake0_beat(&f);
            beat = now_ms() + 100;
        }
        size_t chunk = want - sent < sizeof(h) ? want - sent : sizeof(h);
        ssize_t w = write(fd, (const char *)h + sent % sizeof(h[0]), chunk - sent % sizeof(h[0]));
        if (w > 0)
            sent += (size_t)w;
        else if (w < 0 && errno != EAGAIN)
            fail_msg("the member closed the connection: %s", strerror(errno));
        else
            usleep(1000);
    }
    long rss1 = proc_status(a.pid, 0, "VmRSS");
    fprintf(stderr, "  sent %zu of %zu messages; agent VmRSS %ld -> %ld kB\n", sent / sizeof(h[0]),
            (size_t)FLOOD, rss0, rss1);
    /* the socket filled: what the agent keeps (UNX_PEER_MSGS) and both sockets' buffers */
    assert_true(sent < want / 2);
    assert_true(rss1 - rss0 < 16 * 1024);
    /* what it holds from this peer is the bound's, exactly: UNX_PEER_MSGS records (the
     * texts are a second old at most; its coordinator keeps beating meanwhile) */
    long held = -1;
    for (int k = 0; k < 50 && held != 1024 * 128; k++) {
        fake0_beat(&f);
        held = early_bytes(hport, file, 0);
        usleep(100 * 1000);
    }
    unlink(file);
    assert_int_equal(held, 1024 * 128);
    assert_int_equal(agent_stop(&a), 0);
    fake0_close(&f);
}

/* Read n bytes from fd within ms, keeping the member's epoch meanwhile (heartbeats as
 * its coordinator). 0, or -1 (closed, or not in time). */
static int fake0_read(struct fake0 *f, int fd, void *buf, size_t n, int ms)
{
    size_t got = 0;
    double until = now_ms() + ms;
    while (got < n && now_ms() < until) {
        fake0_beat(f);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return got == n ? 0 : -1;
}

/* A frame of node 0's sends and receives to rank 1 (the member's slot). */
static struct data_op_hdr p2p_frame(unsigned kind, unsigned phase, uint64_t seq, uint64_t count)
{
    return (struct data_op_hdr){.magic = DATA_MAGIC,
                                .kind = (uint8_t)kind,
                                .dtype = COLL_FLOAT32,
                                .redop = (uint8_t)phase,
                                .src_rank = 0,
                                .dst_rank = 1,
                                .seq = seq,
                                .count = count};
}

/* Found in review of d7df3f4: the payload of a large send (DATA, after the receiver's
 * CTS) was written into the cleared receive for as many bytes as its own header said,
 * not the receive's: a member whose DATA claimed twice the count it asked for wrote past
 * the application's buffer. Now a DATA that disagrees with its receive is read into
 * nothing and the receive fails with MISMATCH, both sides told; the bytes beyond the
 * receive are untouched. Then answers to sends never made end the epoch (PROTOCOL), as
 * does a payload nobody cleared; the agent serves on and forms again. */
static void forged_large_send_frames_are_refused(void **state)
{
    (void)state;
    struct fake0 f;
    struct agent a;
    fake0_with_member(&f, &a, NULL);
    enum { N = 512 * 1024 }; /* 2 MiB of float32: over UNX_SMALL, so it asks first */
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem = NULL;
    assert_int_equal(rank_open(a.sock, 3 * (size_t)N * 4, &c, &g, &info, &mem), 0);
    assert_int_equal(info.rank, 1);
    memset(mem, 0x5a, 3 * (size_t)N * 4);
    coll_request req;
    assert_int_equal(coll_recv_tag(g, mem, N, COLL_FLOAT32, 0, 7, NULL, &req), COLL_OK);
    int fd = f.fds[DATA_CH_P2P];
    uint64_t seq = 7 | (uint64_t)1 << 32; /* tag 7, our first message to that pod */
    struct data_op_hdr rts = p2p_frame(WIRE_OP_SEND, P2P_RTS, seq, N), cts;
    assert_int_equal(write(fd, &rts, sizeof(rts)), (ssize_t)sizeof(rts));
    assert_int_equal(fake0_read(&f, fd, &cts, sizeof(cts), 5000), 0);
    assert_int_equal(cts.kind, WIRE_OP_RECV);
    assert_int_equal(cts.redop, P2P_CTS);
    assert_true(cts.seq == seq && cts.count == N);
    /* the payload, claiming twice the count: 4 MiB of 0x11 */
    struct data_op_hdr data = p2p_frame(WIRE_OP_SEND, P2P_DATA, seq, 2 * (uint64_t)N);
    assert_int_equal(write(fd, &data, sizeof(data)), (ssize_t)sizeof(data));
    static char ones[1 << 20];
    memset(ones, 0x11, sizeof(ones));
    for (size_t sent = 0; sent < 2 * (size_t)N * 4;) {
        fake0_beat(&f);
        ssize_t w = write(fd, ones, sizeof(ones));
        assert_true(w > 0);
        sent += (size_t)w;
    }
    struct data_op_hdr ack;
    assert_int_equal(fake0_read(&f, fd, &ack, sizeof(ack), 5000), 0);
    assert_int_equal(ack.kind, WIRE_OP_RECV);
    assert_int_equal(ack.redop, P2P_ACK);
    assert_int_equal(ack.root, COLL_ERR_MISMATCH);
    assert_int_equal(coll_wait(c, req, 5000), COLL_ERR_MISMATCH);
    const unsigned char *b = mem;
    for (size_t i = 0; i < 3 * (size_t)N * 4; i++)
        if (b[i] != 0x5a) fail_msg("byte %zu of the buffer changed to 0x%02x", i, b[i]);
    /* a CTS for a send the member never asked to make */
    struct data_op_hdr stray = p2p_frame(WIRE_OP_RECV, P2P_CTS, 3 | (uint64_t)9 << 32, 4);
    stray.src_rank = 0; /* the receiver: us */
    stray.dst_rank = 1;
    assert_int_equal(write(fd, &stray, sizeof(stray)), (ssize_t)sizeof(stray));
    assert_true(agent_log_wait(&a, "cleared a send it was never asked for", 1, 5000));
    /* the next epoch: a payload nobody cleared */
    assert_int_equal(fake0_commit(&f), 0);
    assert_int_equal(fake0_accept(&f, &a, 1), 1);
    fd = f.fds[DATA_CH_P2P];
    data = p2p_frame(WIRE_OP_SEND, P2P_DATA, 5 | (uint64_t)1 << 32, 4);
    assert_int_equal(write(fd, &data, sizeof(data)), (ssize_t)sizeof(data));
    assert_int_equal(write(fd, ones, 16), 16);
    assert_true(agent_log_wait(&a, "sent a payload nobody cleared", 1, 5000));
    /* and the member forms again: it serves on */
    assert_int_equal(fake0_commit(&f), 0);
    assert_int_equal(fake0_accept(&f, &a, 1), 1);
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
    fake0_close(&f);
}

/* A send that says it wants no ack (P2P_F_NOACK, libcoll's on a child across pods) is
 * taken as any other and answered with nothing: the next message's ack is the first
 * frame back. A frame with flags the protocol does not have ends the epoch (PROTOCOL),
 * named; the member forms again. */
static void sends_without_acks_and_unknown_flags(void **state)
{
    (void)state;
    struct fake0 f;
    struct agent a;
    fake0_with_member(&f, &a, NULL);
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem = NULL;
    assert_int_equal(rank_open(a.sock, 4096, &c, &g, &info, &mem), 0);
    float *x = mem;
    coll_request r0, r1;
    assert_int_equal(coll_recv_tag(g, x, 4, COLL_FLOAT32, 0, 7, NULL, &r0), COLL_OK);
    assert_int_equal(coll_recv_tag(g, x + 4, 4, COLL_FLOAT32, 0, 7, NULL, &r1), COLL_OK);
    int fd = f.fds[DATA_CH_P2P];
    const float one[4] = {1, 2, 3, 4}, two[4] = {5, 6, 7, 8};
    struct data_op_hdr h = p2p_frame(WIRE_OP_SEND, P2P_EAGER, 7 | (uint64_t)1 << 32, 4);
    h.flags = P2P_F_NOACK;
    assert_int_equal(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_int_equal(write(fd, one, sizeof(one)), (ssize_t)sizeof(one));
    h = p2p_frame(WIRE_OP_SEND, P2P_EAGER, 7 | (uint64_t)2 << 32, 4);
    assert_int_equal(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_int_equal(write(fd, two, sizeof(two)), (ssize_t)sizeof(two));
    assert_int_equal(coll_wait(c, r0, 5000), COLL_OK);
    assert_int_equal(coll_wait(c, r1, 5000), COLL_OK);
    assert_memory_equal(x, one, sizeof(one));
    assert_memory_equal(x + 4, two, sizeof(two));
    struct data_op_hdr ack;
    assert_int_equal(fake0_read(&f, fd, &ack, sizeof(ack), 5000), 0);
    assert_int_equal(ack.kind, WIRE_OP_RECV);
    assert_int_equal(ack.redop, P2P_ACK);
    assert_true(ack.seq == (7 | (uint64_t)2 << 32)); /* the second's: none for the first */
    assert_int_equal(ack.root, COLL_OK);
    /* flags the protocol has not: the epoch ends, named */
    h = p2p_frame(WIRE_OP_SEND, P2P_EAGER, 7 | (uint64_t)3 << 32, 4);
    h.flags = 2;
    assert_int_equal(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_true(agent_log_wait(&a, "send frame with flags 0x2", 1, 5000));
    assert_int_equal(fake0_commit(&f), 0);
    assert_int_equal(fake0_accept(&f, &a, 1), 1);
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
    fake0_close(&f);
}

/* A send frame carries the signature of the collective it is part of (decision 30): a
 * receive whose own differs (here a plain one) fails with MISMATCH naming both, and the
 * sender is told so; a signature that names no op ends the epoch (PROTOCOL), named, and
 * the member forms again. */
static void signed_sends_meet_their_receives(void **state)
{
    (void)state;
    struct fake0 f;
    struct agent a;
    fake0_with_member(&f, &a, NULL);
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem = NULL;
    assert_int_equal(rank_open(a.sock, 4096, &c, &g, &info, &mem), 0);
    float *x = mem;
    coll_request r0;
    assert_int_equal(coll_recv_tag(g, x, 4, COLL_FLOAT32, 0, 7, NULL, &r0), COLL_OK);
    int fd = f.fds[DATA_CH_P2P];
    const float one[4] = {1, 2, 3, 4};
    struct data_op_hdr h = p2p_frame(WIRE_OP_SEND, P2P_EAGER, 7 | (uint64_t)1 << 32, 4);
    h.root = (int32_t)(WIRE_SIG_ON | WIRE_SIG(WIRE_OP_ALLREDUCE, COLL_MAX));
    assert_int_equal(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_int_equal(write(fd, one, sizeof(one)), (ssize_t)sizeof(one));
    assert_int_equal(coll_wait(c, r0, 5000), COLL_ERR_MISMATCH);
    assert_non_null(strstr(coll_last_error(), "part of allreduce (max)"));
    assert_non_null(strstr(coll_last_error(), "of no collective"));
    struct data_op_hdr ack;
    assert_int_equal(fake0_read(&f, fd, &ack, sizeof(ack), 5000), 0);
    assert_int_equal(ack.kind, WIRE_OP_RECV);
    assert_int_equal(ack.root, COLL_ERR_MISMATCH);
    /* a signature that names no op (a send is no collective): the epoch ends, named */
    h = p2p_frame(WIRE_OP_SEND, P2P_EAGER, 7 | (uint64_t)2 << 32, 4);
    h.root = (int32_t)(WIRE_SIG_ON | WIRE_SIG(WIRE_OP_SEND, 0));
    assert_int_equal(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
    assert_true(agent_log_wait(&a, "send frame with signature 0x160", 1, 5000));
    assert_int_equal(fake0_commit(&f), 0);
    assert_int_equal(fake0_accept(&f, &a, 1), 1);
    coll_disconnect(&c);
    assert_int_equal(agent_stop(&a), 0);
    fake0_close(&f);
}

static int connect_idle(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    return fd;
}

/* Found on c65a60e: 300 idle connections to the data port made the agent close every
 * new one, and the agents re-formed in a tight loop (4,434 commits in 7 s). Now the idle
 * ones are evicted first and a member that cannot form backs off: with the flood still
 * open, a restarted pod re-forms and the group runs; oversized rendezvous frames are
 * refused by ZeroMQ before they are buffered. */
static void floods_delay_no_member(void **state)
{
    (void)state;
    struct agent a[2];
    int port;
    start_all(a, 2, 1, &port);
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    int dport = data_port_of(&a[0]);
    int idle[300];
    for (int i = 0; i < 300; i++)
        idle[i] = connect_idle(dport);
    /* frames of 64 MiB at the rendezvous port */
    long rss0 = rss_kib(a[0].pid);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(d, ep), 0);
    size_t big = (size_t)64 << 20;
    char *junk = calloc(1, big);
    for (int i = 0; i < 4; i++)
        zmq_send(d, junk, big, ZMQ_DONTWAIT);
    usleep(1000 * 1000);
    long grown = rss_kib(a[0].pid) - rss0;
    if (grown > 32 * 1024) fail_msg("the coordinator grew by %ld KiB on oversized frames", grown);
    zmq_close(d);
    zmq_ctx_term(ctx);
    free(junk);
    int commits0 = agent_log_count(&a[1], "rendezvous.commit");
    assert_int_equal(agent_stop(&a[1]), 0);
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    int commits = agent_log_count(&a[1], "rendezvous.commit");
    if (commits > 10) fail_msg("%d commits to re-form once (was %d before)", commits, commits0);
    for (int i = 0; i < 300; i++)
        close(idle[i]);
    stop_all(a, 2);
}

/* Data connections are taken only from the address the member table lists: a pod whose
 * node.address is 127.0.0.2 connects from it (it binds it), so pod 0 takes its
 * connections; from any other source they would be refused. */
static void data_connections_come_from_the_listed_address(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, NULL), 0);
    char body[1024];
    snprintf(body, sizeof(body),
             "node:\n  index: 1\n  name: pod-1\n  address: 127.0.0.2\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: g\n    backend: host\n    members: 2\n    local_slots: 1\n"
             "    timeouts: {op_ms: 20000, heartbeat_ms: %d, join_ms: 5000}\n",
             port, TEST_HB_MS);
    assert_int_equal(agent_start(&a[1], NULL, body), 0);
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    assert_true(agent_log_count(&a[0], "data=127.0.0.2:") >= 1);
    assert_int_equal(agent_log_count(&a[0], "not from the address the member table lists"), 0);
    stop_all(a, 2);
}

/* ZeroMQ frames from a ROUTER: the sender's id, then the frame; returns its size or -1
 * after ms. */
static int router_recv(void *r, void *buf, size_t cap, int ms)
{
    zmq_pollitem_t it = {.socket = r, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, ms) != 1) return -1;
    char id[256];
    if (zmq_recv(r, id, sizeof(id), 0) < 0) return -1;
    return zmq_recv(r, buf, cap, 0);
}

/* Found on c65a60e: the net thread set up an epoch's data connections one after another,
 * waiting up to join_ms for each, and sent no heartbeats meanwhile. A fake coordinator
 * commits an epoch whose node 0 listens but never answers: the member keeps sending
 * heartbeats while it waits, and gives the epoch up at join_ms. */
static void a_silent_peer_does_not_stop_the_net_thread(void **state)
{
    (void)state;
    int port = free_port();
    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_bind(r, ep), 0);
    /* node 0's data port: connections are taken by the kernel, never by anyone */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 16), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    struct agent a;
    char body[1024];
    snprintf(body, sizeof(body),
             "node:\n  index: 1\n  name: pod-1\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: g\n    backend: host\n    members: 2\n"
             "    timeouts: {op_ms: 20000, heartbeat_ms: 100, join_ms: 3000}\n",
             port);
    assert_int_equal(agent_start(&a, NULL, body), 0);
    union rdv_msg m;
    char buf[sizeof(m)];
    int len = router_recv(r, buf, sizeof(buf), 5000);
    char why[160];
    assert_true(len > 0);
    assert_int_equal(rdv_decode(buf, (size_t)len, &m, why, sizeof(why)), 0);
    assert_int_equal(m.h.type, RDV_JOIN);
    char member_addr[RDV_ADDR_MAX];
    snprintf(member_addr, sizeof(member_addr), "%s", m.join.data_addr);
    rdv_init(&m, RDV_COMMIT, "g", 1);
    m.h.inc = 1;
    m.commit.nodes = 2;
    char coord_addr[RDV_ADDR_MAX];
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", ntohs(sa.sin_port));
    assert_int_equal(rdv_member_set(&m.commit.members[0], coord_addr), 0);
    assert_int_equal(rdv_member_set(&m.commit.members[1], member_addr), 0);
    m.h.len = (uint32_t)rdv_size(&m);
    /* to the member: its routing id is whatever sent the JOIN; a ROUTER needs it first */
    zmq_pollitem_t it = {.socket = r, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&it, 1, 5000), 1); /* its next JOIN, one heartbeat later */
    char id[256];
    int idlen = zmq_recv(r, id, sizeof(id), 0);
    assert_true(idlen > 0);
    assert_true(zmq_recv(r, buf, sizeof(buf), 0) > 0);
    assert_int_equal(zmq_send(r, id, (size_t)idlen, ZMQ_SNDMORE), idlen);
    assert_int_equal(zmq_send(r, &m, rdv_size(&m), 0), (int)rdv_size(&m));
    assert_true(agent_log_wait(&a, "rendezvous.commit", 1, 3000));
    /* while the member waits for node 0's challenge, heartbeats keep coming (and ours
     * go out, so that it does not take the coordinator for lost) */
    int beats = 0;
    double t0 = now_ms();
    union rdv_msg hb;
    rdv_init(&hb, RDV_HEARTBEAT, "g", 1);
    hb.h.inc = 1;
    while (now_ms() - t0 < 1500 ||
           (now_ms() - t0 < 6000 && !agent_log_count(&a, "data connections not up"))) {
        zmq_send(r, id, (size_t)idlen, ZMQ_SNDMORE);
        zmq_send(r, &hb, rdv_size(&hb), 0);
        len = router_recv(r, buf, sizeof(buf), 100);
        if (len > 0 && rdv_decode(buf, (size_t)len, &m, why, sizeof(why)) == 0 &&
            m.h.type == RDV_HEARTBEAT && now_ms() - t0 < 1500)
            beats++;
    }
    if (beats < 5) fail_msg("%d heartbeats in 1.5 s at a 100 ms interval", beats);
    /* and the formation deadline (join_ms) ends the epoch, the log saying first which
     * connection did not come up and where it stood */
    assert_true(agent_log_count(&a, "data connections not up within join_ms") >= 1);
    assert_true(agent_log_count(&a, "event=data.not_up group=g epoch=1 pending=\"to node 0 "
                                    "channel 0: waiting for its challenge") >= 1);
    assert_int_equal(agent_stop(&a), 0);
    close(lfd);
    zmq_close(r);
    zmq_ctx_term(ctx);
}

/* An op on group b, which cannot form (its third pod never comes): it waits for b
 * until its deadline, and fails with TIMEOUT. */
static int stuck_b_op(void *arg)
{
    const char *sock = arg;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    if (coll_connect(&c, sock, 5000) || coll_group_open(&g, c, "b", COLL_SLOT_ANY) ||
        coll_mem_alloc(&b, c, 4096, COLL_DEVICE_HOST))
        return 100;
    float *x = coll_mem_ptr(b);
    coll_request r;
    coll_err e = coll_allreduce(g, x, x + 16, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    coll_disconnect(&c);
    return e == COLL_ERR_TIMEOUT ? 0 : 103;
}

/* Two groups on the same two agents: b spans three pods and its third never comes, so
 * b keeps joining and an op on it waits for its deadline (a minute: far beyond g's five
 * ops on a busy machine, and cut short by killing its application); g forms and its ops
 * run to completion meanwhile, however long b takes. */
static void a_group_that_cannot_form_delays_no_other(void **state)
{
    (void)state;
    const char *b = "  - name: b\n    backend: host\n    members: 3\n"
                    "    timeouts: {op_ms: 60000, heartbeat_ms: 250, join_ms: 1000}\n";
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_member(&a[i], port, i, 2, 1, b), 0);
    pid_t stuck = child_run(stuck_b_op, (void *)a[0].sock);
    usleep(300 * 1000); /* its op is in, waiting for b */
    /* one session per pod for all five: a session that leaves ends the epoch, and the
     * next one's op could meet that end */
    struct one ok[2] = {{.sock = a[0].sock, .times = 5}, {.sock = a[1].sock, .times = 5}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    /* g ran 5 allreduces while b's op was still waiting */
    assert_int_equal(waitpid(stuck, NULL, WNOHANG), 0);
    kill(stuck, SIGKILL);
    assert_int_equal(child_wait(stuck, 20000), 128 + SIGKILL);
    assert_int_equal(agent_log_count(&a[0], "group.formed group=b"), 0); /* b never formed */
    assert_true(agent_log_count(&a[0], "group.formed group=g") >= 1);
    stop_all(a, 2);
}

/* With CURVE keys the group forms and runs; a stranger that holds the server's public
 * key but not the deployment's client key is refused by the ZAP handler before any
 * JOIN is read, and the group never notices. */
static void curve_keys_admit_members_only(void **state)
{
    (void)state;
    char dir[128], extra[256];
    make_keys(dir, sizeof(dir));
    snprintf(extra, sizeof(extra), "security:\n  keys: %s\n  require_keys: true\n", dir);
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_member(&a[i], port, i, 2, 1, extra), 0);
    struct one ok[2] = {{.sock = a[0].sock}, {.sock = a[1].sock}};
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    assert_int_equal(agent_log_count(&a[0], "curve=on"), 1);
    /* the stranger: the right server key, its own client key pair */
    char spub[64] = "", cpub[41], csec[41], path[256];
    snprintf(path, sizeof(path), "%s/server.pub", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(spub, sizeof(spub), f));
    fclose(f);
    spub[40] = '\0';
    assert_int_equal(zmq_curve_keypair(cpub, csec), 0);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, spub, 40);
    zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, cpub, 40);
    zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, csec, 40);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(d, ep), 0);
    union rdv_msg m;
    rdv_init(&m, RDV_JOIN, "g", 0);
    m.join.nodes = 2;
    m.join.node_index = 1;
    snprintf(m.join.data_addr, sizeof(m.join.data_addr), "127.0.0.1:1");
    zmq_send(d, &m, rdv_size(&m), ZMQ_DONTWAIT);
    assert_true(agent_log_wait(&a[0], "rendezvous.unauthenticated", 1, 5000));
    /* and a client without CURVE at all gets nowhere either */
    void *plain = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(plain, ZMQ_LINGER, &linger, sizeof(linger));
    assert_int_equal(zmq_connect(plain, ep), 0);
    zmq_send(plain, &m, rdv_size(&m), ZMQ_DONTWAIT);
    usleep(500 * 1000);
    zmq_close(d);
    zmq_close(plain);
    zmq_ctx_term(ctx);
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    assert_int_equal(agent_log_count(&a[0], "node=1 pod=\"\""), 0); /* the spoofed JOIN */
    assert_int_equal(agent_log_count(&a[0], "data=127.0.0.1:1 "), 0);
    stop_all(a, 2);
}

/* security.require_keys without keys: the agent refuses to start and says why. */
static void required_keys_must_be_there(void **state)
{
    (void)state;
    struct agent a;
    int port = free_port();
    if (start_member(&a, port, 0, 2, 1, "security:\n  require_keys: true\n") == 0)
        assert_int_not_equal(agent_stop(&a), 0);
    assert_true(agent_log_count(&a, "require_keys is true") >= 1);
}

/* coll_group_wait: with one pod of three missing it times out and says which index
 * formation waits for; once the pod is there it returns, and every pod reports the
 * same group epoch (the rendezvous epoch, not each agent's own). */
static int wait_main(void *arg)
{
    const struct agent *a = arg;
    coll_conn *c;
    coll_group *g;
    if (coll_connect(&c, a->sock, 5000) != COLL_OK) return 2;
    if (coll_group_open(&g, c, "g", COLL_SLOT_ANY) != COLL_OK) return 3;
    coll_err e = coll_group_wait(g, 30000);
    coll_group_info info;
    coll_group_info_get(g, &info);
    coll_disconnect(&c);
    return e != COLL_OK ? 4 : (int)info.epoch + 10; /* the epoch, through the exit status */
}

static void group_wait_says_what_formation_waits_for(void **state)
{
    (void)state;
    struct agent a[3];
    int port = free_port();
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_member(&a[i], port, i, 3, 1, NULL), 0);
    coll_conn *c;
    coll_group *g;
    assert_int_equal(coll_connect(&c, a[0].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "g", COLL_SLOT_ANY), COLL_OK);
    coll_group_info info;
    coll_group_info_get(g, &info);
    assert_int_equal(info.epoch, 0); /* never formed */
    /* the net thread's summary has caught up (it logs each new one) */
    assert_true(agent_log_wait(&a[0], "state=\"waiting for node indexes 2\"", 1, 10000));
    double t0 = now_ms();
    assert_int_equal(coll_group_wait(g, 300), COLL_ERR_TIMEOUT);
    double took = now_ms() - t0;
    printf("wait timed out after %.0f ms: %s\n", took, coll_last_error());
    assert_true(took >= 290 && took < 3000);
    assert_non_null(strstr(coll_last_error(), "waiting for node indexes 2"));
    assert_int_equal(start_member(&a[2], port, 2, 3, 1, NULL), 0);
    assert_int_equal(coll_group_wait(g, 30000), COLL_OK);
    coll_group_info_get(g, &info);
    assert_true(info.epoch >= 1);
    /* pod 1's application sees the same epoch (it leaves afterwards, which ends it) */
    assert_int_equal(child_wait(child_run(wait_main, &a[1]), 30000), (int)info.epoch + 10);
    assert_int_equal(coll_group_wait(NULL, 1), COLL_ERR_INVALID);
    assert_int_equal(coll_group_wait(g, -2), COLL_ERR_INVALID);
    coll_group_close(&g);
    coll_disconnect(&c);
    stop_all(a, 3);
}

/* Data sockets of an agent process (its /proc fd table). */
static int sockets_of(pid_t pid)
{
    char dir[64], path[320], link[64];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        ssize_t l = readlink(path, link, sizeof(link) - 1);
        if (l > 0) {
            link[l] = 0;
            n += strncmp(link, "socket:", 7) == 0;
        }
    }
    closedir(d);
    return n;
}

/* Every pod's 16 floats to every pod, checked. */
static int alltoall_once(void *arg)
{
    struct one *o = arg;
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 2 * 32 * 4 * sizeof(float), &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem, *y = x + 4 * info.size;
    for (int i = 0; i < 4 * info.size; i++)
        x[i] = (float)(info.rank * 1000 + i / 4);
    coll_request r;
    coll_err e = coll_alltoall(g, x, y, 4, COLL_FLOAT32, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    if (e != COLL_OK) return 103;
    for (int i = 0; i < 4 * info.size; i++)
        if (y[i] != (float)((i / 4) * 1000 + info.rank)) return 104;
    hold_until(o->hold, info.rank);
    coll_disconnect(&c);
    return 0;
}

/* 32 pods: a pod connects at formation only to its ring neighbours and doubling
 * partners (O(log pods) pairs, 3 sockets each), an allreduce needs nothing more, and
 * an all-to-all connects the rest on first use. */
static void thirty_two_pods_connect_what_they_use(void **state)
{
    (void)state;
    enum { N = 32 };
    struct agent a[N];
    int port = free_port();
    for (int i = 0; i < N; i++)
        assert_int_equal(start_member(&a[i], port, i, N, 1, NULL), 0);
    for (int i = 0; i < N; i++)
        assert_true(agent_log_wait(&a[i], "event=group.formed", 1, 20000));
    int s0[N];
    for (int i = 0; i < N; i++) {
        assert_true(agent_log_count(&a[i], "pairs=6") == 1 ||
                    agent_log_count(&a[i], "pairs=5") == 1 ||
                    agent_log_count(&a[i], "pairs=7") == 1);
        s0[i] = sockets_of(a[i].pid);
    }
    char hold[128];
    tmp_path(hold, sizeof(hold), "hold", 0);
    unlink(hold);
    struct one ok[N];
    for (int i = 0; i < N; i++)
        ok[i] = (struct one){.sock = a[i].sock, .times = 3, .hold = hold};
    /* every pod's application runs 3 allreduces, then holds its session while we look */
    pid_t p[N];
    for (int i = 0; i < N; i++)
        p[i] = child_run(allreduce_once, &ok[i]);
    wait_ranks_done(hold, N);
    int s1[N];
    for (int i = 0; i < N; i++) {
        s1[i] = sockets_of(a[i].pid);
        assert_true(s1[i] <= s0[i] + 1); /* + the session's socket: no data connection more */
    }
    FILE *f = fopen(hold, "w");
    fclose(f);
    for (int i = 0; i < N; i++)
        assert_int_equal(child_wait(p[i], 60000), 0);
    unlink(hold);
    printf("pod 5: %d sockets after formation, %d while its application holds its session "
           "after 3 allreduces\n",
           s0[5], s1[5]);
    for (int i = 0; i < N; i++)
        assert_true(agent_log_wait(&a[i], "event=group.formed", 2, 20000));
    for (int i = 0; i < N; i++)
        p[i] = child_run(alltoall_once, &ok[i]);
    wait_ranks_done(hold, N);
    int s2 = sockets_of(a[5].pid);
    f = fopen(hold, "w");
    fclose(f);
    for (int i = 0; i < N; i++)
        assert_int_equal(child_wait(p[i], 60000), 0);
    unlink(hold);
    printf("pod 5 during an all-to-all: %d sockets\n", s2);
    assert_true(s2 >= s0[5] + 3 * (N - 1 - 7));
    stop_all(a, N);
}

/* Seconds of the day of the first log line of a's that holds needle, or -1. */
static double log_time(const struct agent *a, const char *needle)
{
    FILE *f = fopen(a->log, "r");
    if (!f) return -1;
    char line[2048];
    double t = -1;
    while (t < 0 && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, needle) ? strstr(line, "ts=") : NULL;
        int h, m;
        double sec;
        if (p && sscanf(p, "ts=%*d-%*d-%*dT%d:%d:%lfZ", &h, &m, &sec) == 3)
            t = h * 3600.0 + m * 60.0 + sec;
    }
    fclose(f);
    return t;
}

/* Pod 1's application: an allreduce (pod 0 joins it late: it is in flight when the
 * agent gets SIGTERM and must still complete), then one more, which the stopping agent
 * refuses or cannot serve. */
static int drained_main(void *arg)
{
    struct one *o = arg;
    /* through the agent: the drain is its; a direct op, which a formed group's tiny op
     * would be, is the application's own (a_late_pod_finishes_its_direct_op_...) */
    setenv("COLL_DIRECT", "0", 1);
    coll_conn *c;
    coll_group *g;
    coll_group_info info;
    void *mem;
    int rc = rank_open(o->sock, 4096, &c, &g, &info, &mem);
    if (rc) return rc;
    float *x = mem;
    for (int i = 0; i < 16; i++)
        x[i] = (float)(info.rank + 1);
    coll_request r;
    coll_err e = coll_allreduce(g, x, x + 16, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    if (e != COLL_OK || x[16] != 3.0f) {
        fprintf(stderr, "the drained op: %s (%s)\n", coll_strerror(e), coll_last_error());
        return 110;
    }
    e = coll_allreduce(g, x, x + 16, 16, COLL_FLOAT32, COLL_SUM, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 30000);
    fprintf(stderr, "after SIGTERM: %s (%s)\n", coll_strerror(e), coll_last_error());
    if (e != COLL_ERR_SHUTDOWN && e != COLL_ERR_AGENT_LOST) return 111;
    if (!coll_err_retryable(e)) return 112;
    coll_disconnect(&c);
    return 0;
}

/* SIGTERM: the op in flight finishes, new ones fail with a retryable SHUTDOWN, the
 * agent exits 0, and its LEAVE moves the peers to a new epoch. Each step waits for the
 * one before it to be seen (pod 1's agent counting the op in flight on /metrics, the
 * drain in its log), never for a time to pass: found in CI at 1fe37c0, where 600 ms were
 * not always enough for pod 1's application to start and submit. */
static void sigterm_drains_then_leaves(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    char extra[128], url[128], file[128], gate[128], hold[128];
    int hport = http_extra(extra, sizeof(extra), port);
    tmp_path(file, sizeof(file), "metrics", 0);
    tmp_path(gate, sizeof(gate), "gate", 0);
    tmp_path(hold, sizeof(hold), "hold", 0);
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, NULL), 0);
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, extra), 0);
    for (int i = 0; i < 2; i++)
        assert_true(agent_log_wait(&a[i], "group.formed", 1, 10000));
    struct one j1 = {.sock = a[1].sock}, j0 = {.sock = a[0].sock, .gate = gate, .hold = hold};
    pid_t p1 = child_run(drained_main, &j1);
    pid_t p0 = child_run(allreduce_once, &j0);
    /* pod 1's op is in its agent, waiting for pod 0's (the texts are a second old at most) */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", hport);
    int seen = 0;
    for (int i = 0; i < 300 && !seen; i++) {
        seen = http_get(url, file) == 200 && file_has(file, "\ncoll_ops_in_flight 1\n");
        if (!seen) usleep(100 * 1000);
    }
    assert_true(seen);
    kill(a[1].pid, SIGTERM);
    assert_true(agent_log_wait(&a[1], "action=drain ops_in_flight=1", 1, 10000));
    FILE *f = fopen(gate, "w"); /* now pod 0's op, which completes the drained one */
    assert_non_null(f);
    fclose(f);
    assert_int_equal(child_wait(p1, 30000), 0);
    unlink(gate);
    assert_int_equal(child_wait(a[1].pid, 15000), 0); /* exit status 0 */
    a[1].pid = 0;
    /* pod 0's application stays attached (its leaving would end the epoch too): pod 0
     * ends the epoch on pod 1's goodbye, not on a heartbeat missed. The goodbye is the
     * LEAVE or the data connection's close, whichever the kernel delivers first. */
    assert_true(agent_log_wait(&a[0], "event=group.epoch group=g epoch=1 ", 1, 5000));
    assert_true(agent_log_count(&a[0], "reason=\"node 1 (pod-1) left\"") +
                    agent_log_count(&a[0], "reason=\"node 1 closed its send/recv connection\"") >=
                1);
    assert_int_equal(agent_log_count(&a[0], "silent"), 0);
    double drained = log_time(&a[1], "event=agent.drained"),
           left = log_time(&a[0], "event=group.epoch group=g epoch=1 ");
    printf("pod 1 drained at %.3f, pod 0 ended the epoch %.0f ms later (heartbeat %d ms)\n",
           drained, (left - drained) * 1000, TEST_HB_MS);
    assert_true(drained > 0 && left > 0);
    assert_int_equal(agent_log_count(&a[1], "ops_in_flight=0"), 1); /* drained, not cut */
    FILE *h = fopen(hold, "w");
    assert_non_null(h);
    fclose(h);
    assert_int_equal(child_wait(p0, 30000), 0);
    unlink(hold);
    char done[160];
    snprintf(done, sizeof(done), "%s.r0", hold);
    unlink(done);
    stop_all(a, 2);
}

/* GET url with curl (a real HTTP client) into file; the HTTP status, or -1. */
/* /livez, /readyz (with why) and /metrics, scraped with curl and parsed with the
 * Prometheus client's parser; direct ops in the op counts and latencies as the agent's
 * own; /readyz turns 503 the moment SIGTERM arrives. */
/* One GET of path on 127.0.0.1:port from 127.0.0.1 with a deadline of ms: the status
 * code, or -1 without an answer in time. */
static int get_within(int port, const char *path, int ms)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[128], resp[64] = "";
    int n =
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    int code = -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && write(fd, req, (size_t)n) == n &&
        read(fd, resp, sizeof(resp) - 1) > 12)
        code = atoi(resp + 9); /* "HTTP/1.1 200" */
    close(fd);
    return code;
}

/* Found at 242e584: 32 connections that sent a header line every 2 s took every HTTP
 * slot, and 6 of 6 /livez requests timed out: the kubelet would have restarted the
 * agent. Now one address holds at most 16 connections, 1024 in all, and a request must
 * arrive whole within 2 s: with 500 slow connections held from 40 addresses, /livez
 * answers every probe within a probe's 1 s, and the slow ones are cut. */
static void probes_answer_while_hundreds_of_slow_connections_are_held(void **state)
{
    (void)state;
    struct agent a;
    int port = free_port();
    char extra[128];
    int hport = http_extra(extra, sizeof(extra), port);
    assert_int_equal(start_member(&a, port, 0, 2, 1, extra), 0);
    assert_int_equal(get_within(hport, "/livez", 5000), 200);
    enum { SLOW = 500, ADDRS = 40 };
    static int fd[SLOW];
    int held = 0;
    for (int i = 0; i < SLOW; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in src = {.sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK + 2 + i % ADDRS)};
        struct sockaddr_in dst = {.sin_family = AF_INET,
                                  .sin_port = htons((uint16_t)hport),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        static const char start[] = "GET /livez HTTP/1.1\r\n";
        if (bind(fd[i], (struct sockaddr *)&src, sizeof(src)) == 0 &&
            connect(fd[i], (struct sockaddr *)&dst, sizeof(dst)) == 0 &&
            write(fd[i], start, sizeof(start) - 1) == (ssize_t)sizeof(start) - 1)
            held++;
    }
    assert_int_equal(held, SLOW);
    /* probes while they dribble a header line each every 200 ms (before 2 s are up) */
    int answered = 0;
    for (int k = 0; k < 6; k++) {
        for (int i = 0; i < SLOW; i++) {
            ssize_t w = write(fd[i], "X-Slow: 1\r\n", 11);
            (void)w;
        }
        answered += get_within(hport, "/livez", 1000) == 200;
        usleep(200 * 1000);
    }
    assert_int_equal(answered, 6);
    /* and none is held for ever: each is cut once its request has taken 2 s */
    int closed = 0;
    double until = now_ms() + 15000;
    for (int i = 0; i < SLOW && now_ms() < until;) {
        char b[64];
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fd[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ssize_t r = read(fd[i], b, sizeof(b));
        if (r == 0 || (r < 0 && errno != EAGAIN)) {
            closed++;
            i++;
        }
    }
    for (int i = 0; i < SLOW; i++)
        close(fd[i]);
    assert_int_equal(closed, SLOW);
    assert_int_equal(get_within(hport, "/livez", 5000), 200);
    assert_int_equal(agent_stop(&a), 0);
}

static void http_endpoints_say_health_and_metrics(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    char extra[128], url[128], file[128];
    int hport = http_extra(extra, sizeof(extra), port);
    tmp_path(file, sizeof(file), "http", 0);
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, extra), 0);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/livez", hport);
    assert_int_equal(http_get(url, file), 200);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz", hport);
    assert_int_equal(http_get(url, file), 503);
    assert_int_equal(metrics_fresh(hport, file, 10000), 200); /* /readyz as fresh */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz?verbose", hport);
    assert_int_equal(http_get(url, file), 503);
    assert_true(file_has(file, "[-] group g: not formed: waiting for node indexes 1"));
    assert_true(file_has(file, "\nnot ready\n"));
    /* the chart's readiness probe leaves out the check that waits on peers: this pod is
     * ready to serve, the group's state still listed */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz?verbose&exclude=formed", hport);
    assert_int_equal(http_get(url, file), 200);
    assert_true(file_has(file, "[-] group g: not formed"));
    assert_true(file_has(file, "\nready (formed excluded)\n"));
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz?exclude=agent", hport);
    assert_int_equal(http_get(url, file), 400);
    assert_true(file_has(file, "the one check that can be left out is \"formed\""));
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
    struct one ok[2] = {{.sock = a[0].sock, .times = 5}, {.sock = a[1].sock, .times = 5}};
    agent_path(1); /* the agent's own op counts and latencies first */
    run_ranks(allreduce_once, ok, sizeof(ok[0]), 2, 30000);
    agent_path(0);
    assert_int_equal(metrics_fresh(hport, file, 10000), 200);
    char out[4096];
    int rc = metrics_parse(file, out, sizeof(out));
    printf("%s", out);
    if (rc == 77) { /* said why: no parser on this machine */
        kill(a[0].pid, SIGTERM);
        assert_int_equal(child_wait(a[0].pid, 10000), 0);
        a[0].pid = 0;
        stop_all(a, 2);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(metric_of(out, "ops_g_allreduce_ok"), 5);
    assert_int_equal(metric_of(out, "hist_count_g"), 5);
    assert_int_equal(metric_of(out, "hist_sum_positive_g"), 1);
    assert_true(metric_of(out, "epoch_g") >= 1);
    assert_int_equal(metric_of(out, "draining"), 0);
    assert_int_equal(metric_of(out, "in_flight"), 0); /* all five done */
    /* its engine slept through the idle second before the scrape; spun: 0 or more */
    assert_true(metric_of(out, "waits_sleep") >= 1 && metric_of(out, "waits_spin") >= 0);
    assert_true(metric_of(out, "formations_g") >= 1);
    assert_int_equal(metric_of(out, "formation_positive_g"), 1);
    assert_int_equal(metric_of(out, "cpu_shared_g"), 1);  /* both pods on every CPU */
    assert_int_equal(metric_of(out, "early_bytes_g"), 0); /* no send waits for its receive */
    assert_true(metric_of(out, "joined_g") >= 1 && metric_of(out, "joined_g") <= 2);
    /* every allreduce of pod 0 went one of the three ways */
    assert_int_equal(metric_of(out, "path_g_inline") + metric_of(out, "path_g_handed_over") +
                         metric_of(out, "path_g_queued"),
                     5);
    /* formed again after the applications left, or not yet: either way it says so */
    assert_true(metric_of(out, "formed_g") == 0 || metric_of(out, "formed_g") == 1);
    assert_int_equal(metric_of(out, "bytes_g_allreduce"), 5 * 64);
    /* direct ops, counted by their clients in their regions: in the same families, while
     * the clients are still there (each publish reads them) */
    char hold[128];
    tmp_path(hold, sizeof(hold), "hold", 0);
    struct one direct[2] = {{.sock = a[0].sock, .times = 20, .hold = hold},
                            {.sock = a[1].sock, .times = 20, .hold = hold}};
    pid_t p[2];
    setenv("COLL_DIRECT_WAIT_MS", "10000", 1); /* a busy agent is waited for, not passed */
    for (int i = 0; i < 2; i++)
        p[i] = child_run(allreduce_once, &direct[i]);
    unsetenv("COLL_DIRECT_WAIT_MS");
    wait_ranks_done(hold, 2);
    assert_int_equal(metrics_fresh(hport, file, 10000), 200);
    assert_int_equal(metrics_parse(file, out, sizeof(out)), 0);
    FILE *hf = fopen(hold, "w");
    if (hf) fclose(hf);
    for (int i = 0; i < 2; i++)
        assert_int_equal(child_wait(p[i], 30000), 0);
    unlink(hold);
    printf("%s", out);
    long direct_n = metric_of(out, "path_g_direct");
    assert_int_equal(metric_of(out, "ops_g_allreduce_ok"), 25);
    assert_int_equal(metric_of(out, "hist_count_g"), 25);
    assert_int_equal(metric_of(out, "bytes_g_allreduce"), 25 * 64);
    assert_int_equal(direct_n + metric_of(out, "path_g_inline") +
                         metric_of(out, "path_g_handed_over") + metric_of(out, "path_g_queued"),
                     25);
    assert_int_equal(direct_n, 20); /* every one, whatever the timing (the wait above) */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/nothing", hport);
    assert_int_equal(http_get(url, file), 404);
    /* SIGTERM: not ready at once (nothing in flight: it stops right after) */
    kill(a[0].pid, SIGTERM);
    assert_int_equal(child_wait(a[0].pid, 10000), 0);
    a[0].pid = 0;
    unlink(file);
    stop_all(a, 2);
}

/* GET url into file until it answers want (at most ms); the last status. */
static int http_until(const char *url, const char *file, int want, int ms)
{
    int code = -1;
    for (double end = now_ms() + ms; now_ms() < end; usleep(100 * 1000))
        if ((code = http_get(url, file)) == want) break;
    return code;
}

/* An epoch this pod's engine ends (a participant leaves: group_break) is not formed in
 * /readyz, though the net thread, which ended it on the engine's word, posts no event of
 * it. Found by test_k8s: a pod whose application's direct op failed when a peer stopped
 * said "[+] group train: formed" until the join timeout. Pod 1 is frozen first, so that
 * no new epoch forms before the scrape. */
static void readyz_says_not_formed_once_this_pod_ends_the_epoch(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    char extra[128], url[128], file[128];
    int hport = http_extra(extra, sizeof(extra), port);
    tmp_path(file, sizeof(file), "readyz", 0);
    assert_int_equal(start_member(&a[0], port, 0, 2, 1, extra), 0);
    assert_int_equal(start_member(&a[1], port, 1, 2, 1, NULL), 0);
    coll_conn *c;
    coll_group *g;
    assert_int_equal(coll_connect(&c, a[0].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "g", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_group_wait(g, 10000), COLL_OK);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz?verbose", hport);
    assert_int_equal(http_until(url, file, 200, 5000), 200);
    assert_true(file_has(file, "[+] group g: formed"));
    assert_int_equal(kill(a[1].pid, SIGSTOP), 0);
    coll_group_close(&g); /* its slot's epoch ends here, on the engine's word */
    int code = metrics_fresh(hport, file, 10000) == 200 ? http_get(url, file) : -1;
    assert_int_equal(kill(a[1].pid, SIGCONT), 0);
    if (code != 503 || !file_has(file, "[-] group g: not formed")) {
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "cat %s", file);
        if (system(cmd) != 0) fprintf(stderr, "(could not show %s)\n", file);
        fail_msg("/readyz answered %d after this pod ended its epoch", code);
    }
    coll_disconnect(&c);
    unlink(file);
    stop_all(a, 2);
}

/* Ops of several groups run in the order the engine handed them over, on every pod.
 * Three host groups a, b, c (net indexes 0, 1, 2) over two pods; both ranks submit an
 * 8 MiB allreduce (past what runs inline) of c, then b, then a. Pod 0's net thread is
 * held in c (rank 1 comes 100 ms late) while b and a queue, so it takes them at once;
 * pod 1 takes b alone (a comes 3 ms later). Run by group index, pod 0 ran a while pod 1
 * ran b, each waiting for the other until op_ms; in order, both run c, b, a. */
struct three {
    const char *sock;
    int rank;
};

static int three_groups_main(void *arg)
{
    const struct three *o = arg;
    coll_conn *c;
    coll_group *g[3]; /* a, b, c */
    const char *names[3] = {"a", "b", "c"};
    if (coll_connect(&c, o->sock, 5000) != COLL_OK) return 100;
    for (int k = 0; k < 3; k++)
        if (coll_group_open(&g[k], c, names[k], COLL_SLOT_ANY) != COLL_OK ||
            coll_group_wait(g[k], 10000) != COLL_OK)
            return 101;
    enum { N = 1 << 21 }; /* floats: 8 MiB */
    coll_buffer *b;
    if (coll_mem_alloc(&b, c, 3 * N * sizeof(float), COLL_DEVICE_HOST) != COLL_OK) return 102;
    float *x = coll_mem_ptr(b); /* group k's op on x + k * N */
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < 3 * (size_t)N; i++)
            x[i] = (float)(o->rank + 1 + i % 5);
        coll_request q[3];
        coll_err e = COLL_OK;
        if (o->rank == 1) usleep(100000);
        e = coll_allreduce(g[2], x + 2 * N, x + 2 * N, N, COLL_FLOAT32, COLL_SUM, NULL, &q[2]);
        if (e == COLL_OK && o->rank == 1) e = coll_wait(c, q[2], 20000);
        if (o->rank == 0) usleep(20000);
        if (e == COLL_OK)
            e = coll_allreduce(g[1], x + N, x + N, N, COLL_FLOAT32, COLL_SUM, NULL, &q[1]);
        if (o->rank == 1) usleep(3000);
        if (e == COLL_OK) e = coll_allreduce(g[0], x, x, N, COLL_FLOAT32, COLL_SUM, NULL, &q[0]);
        for (int k = 2 - (o->rank == 1); e == COLL_OK && k >= 0; k--)
            e = coll_wait(c, q[k], 20000);
        if (e != COLL_OK) {
            fprintf(stderr, "rank %d, round %d: %s (%s)\n", o->rank, round, coll_strerror(e),
                    coll_last_error());
            return 103;
        }
        for (size_t i = 0; i < 3 * (size_t)N; i++)
            if (x[i] != (float)(3 + 2 * (i % 5))) return 104;
    }
    coll_mem_release(&b);
    coll_disconnect(&c);
    return 0;
}

static void ops_of_several_groups_run_in_the_order_handed_over(void **state)
{
    (void)state;
    int port = free_port();
    struct agent a[2];
    for (int i = 0; i < 2; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n"
                 "  - {name: a, backend: host, members: 2, timeouts: {op_ms: 20000}}\n"
                 "  - {name: b, backend: host, members: 2, timeouts: {op_ms: 20000}}\n"
                 "  - {name: c, backend: host, members: 2, timeouts: {op_ms: 20000}}\n",
                 i, i, port);
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    agent_path(1); /* every op the agents': 8 MiB runs on the net thread anyway */
    struct three jobs[2] = {{a[0].sock, 0}, {a[1].sock, 1}};
    run_ranks(three_groups_main, jobs, sizeof(jobs[0]), 2, 120000);
    agent_path(0);
    stop_all(a, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ops_2_agents),
        cmocka_unit_test(ops_2_agents_3_slots),
        cmocka_unit_test(ops_3_agents_2_slots),
        cmocka_unit_test(ops_4_agents),
        cmocka_unit_test(ops_4_agents_2_slots),
        cmocka_unit_test(ops_8_agents),
        cmocka_unit_test(two_pods_mid_sizes_bitwise),
        cmocka_unit_test(four_and_eight_pods_double_bitwise),
        cmocka_unit_test(allgathers_copy_the_input_into_place_as_it_is_sent),
        cmocka_unit_test(four_pods_broadcast_relays),
        cmocka_unit_test(broadcast_count_mismatch_is_named),
        cmocka_unit_test(a_pod_that_turns_away_mid_run_is_a_mismatch),
        cmocka_unit_test(data_connections_take_the_configured_congestion_control),
        cmocka_unit_test(data_connections_take_the_configured_buffer_size),
        cmocka_unit_test(slow_peer_hands_a_small_op_to_the_net_thread),
        cmocka_unit_test(slow_peer_hands_over_every_small_kind),
        cmocka_unit_test(late_agent_completes_the_group),
        cmocka_unit_test(killed_agent_fails_survivors_then_group_reforms),
        cmocka_unit_test(a_frozen_pod_fails_the_others_ops_at_the_coordinators_word),
        cmocka_unit_test(a_long_op_of_one_group_holds_no_other_back),
        cmocka_unit_test(direct_ops_match_the_agent_path_in_every_mix),
        cmocka_unit_test(direct_ops_take_memory_outside_coll_buffers),
        cmocka_unit_test(premultiplied_sums_on_every_path),
        cmocka_unit_test(memory_outside_coll_buffers_refused_where_the_agent_runs_the_op),
        cmocka_unit_test(every_op_runs_in_the_application_with_direct_all),
        cmocka_unit_test(read_ahead_travels_with_the_lease),
        cmocka_unit_test(pods_on_cpus_of_their_own_hold_their_spin),
        cmocka_unit_test(a_direct_op_ends_retryably_when_a_pod_dies),
        cmocka_unit_test(a_late_pod_finishes_its_direct_op_when_others_leave),
        cmocka_unit_test(mismatched_configs_are_rejected),
        cmocka_unit_test(garbage_frames_are_dropped),
        cmocka_unit_test(signed_sends_meet_their_receives),
        cmocka_unit_test(ops_of_several_groups_run_in_the_order_handed_over),
        cmocka_unit_test(disagreements_between_pods_are_mismatches),
        cmocka_unit_test(early_large_send_waits_in_the_socket),
        cmocka_unit_test(receives_from_any_rank_across_pods),
        cmocka_unit_test(a_receive_from_any_rank_fails_retryably_when_a_pod_dies),
        cmocka_unit_test(a_large_early_send_holds_no_other_rank_back),
        cmocka_unit_test(forged_data_hellos_are_refused),
        cmocka_unit_test(the_accepting_side_proves_the_secret_too),
        cmocka_unit_test(a_flood_of_empty_early_sends_is_bounded),
        cmocka_unit_test(forged_large_send_frames_are_refused),
        cmocka_unit_test(sends_without_acks_and_unknown_flags),
        cmocka_unit_test(floods_delay_no_member),
        cmocka_unit_test(data_connections_come_from_the_listed_address),
        cmocka_unit_test(a_silent_peer_does_not_stop_the_net_thread),
        cmocka_unit_test(a_group_that_cannot_form_delays_no_other),
        cmocka_unit_test(curve_keys_admit_members_only),
        cmocka_unit_test(required_keys_must_be_there),
        cmocka_unit_test(group_wait_says_what_formation_waits_for),
        cmocka_unit_test(thirty_two_pods_connect_what_they_use),
        cmocka_unit_test(sigterm_drains_then_leaves),
        cmocka_unit_test(http_endpoints_say_health_and_metrics),
        cmocka_unit_test(probes_answer_while_hundreds_of_slow_connections_are_held),
        cmocka_unit_test(readyz_says_not_formed_once_this_pod_ends_the_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
