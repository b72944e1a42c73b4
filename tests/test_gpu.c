/*
 * test_gpu.c (CTest label gpu): the NCCL backend through a real agent process, with
 * application processes that own GPU buffers. Skips (exit 77, with a message) on a
 * machine without a GPU; on a host with several GPUs every check runs with one rank
 * per GPU (up to 4), one process each.
 *
 * The parent never initialises CUDA (children are forked); a child reports the GPUs.
 */
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "coll/coll.h"
#include "cudrv.h"
#include "harness.h"
#include "opcheck.h"
#include "wire.h"

static int ngpu;
static char uuid0[64];

/* ---- helpers used inside children --------------------------------------------- */

#define CHECK(cond, code)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #cond,                  \
                    coll_last_error());                                                            \
            return code;                                                                           \
        }                                                                                          \
    } while (0)

/* A word in mapped host memory that a stream can wait on: the test's gate. */
struct gate {
    volatile uint64_t *word;
    void *dev;
};

static int gate_make(struct gate *g)
{
    void *p;
    if (cudaHostAlloc(&p, 64, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess)
        return -1;
    memset(p, 0, 64);
    g->word = p;
    return cudaHostGetDevicePointer(&g->dev, p, 0) == cudaSuccess ? 0 : -1;
}

/* Block stream until the gate is opened from the CPU. */
static int gate_block(struct gate *g, cudaStream_t st)
{
    const struct cudrv *d = cudrv_get(NULL, 0);
    return d && d->wait_value64((CUstream)st, (CUdeviceptr)(uintptr_t)g->dev, 1,
                                CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS
               ? 0
               : -1;
}

struct job {
    const char *sock;
    const char *group;
    int device;
    int hold_fd; /* killed child: write a byte here once the op is submitted */
    int back_fd; /* read a byte here before going on */
};

/* One allreduce of float32 count elements, in place, on device buffers; values
 * checked (a one-rank group, or n ranks with input rank + 1). */
static int small_allreduce(coll_conn *c, coll_group *g, int device, int n)
{
    const size_t count = 1000;
    coll_buffer *b;
    CHECK(cudaSetDevice(device) == cudaSuccess, 9);
    CHECK(coll_mem_alloc(&b, c, count * 4, device) == COLL_OK, 10);
    float h[1000];
    coll_group_info info;
    coll_group_info_get(g, &info);
    for (size_t i = 0; i < count; i++)
        h[i] = (float)(info.rank + 1);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 11);
    CHECK(cudaMemcpyAsync(coll_mem_ptr(b), h, sizeof(h), cudaMemcpyHostToDevice, st) == 0, 12);
    coll_request r;
    CHECK(coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), count, COLL_FLOAT32, COLL_SUM, st,
                         &r) == COLL_OK,
          13);
    CHECK(coll_wait_stream(c, r, st) == COLL_OK, 14);
    CHECK(cudaMemcpyAsync(h, coll_mem_ptr(b), sizeof(h), cudaMemcpyDeviceToHost, st) == 0, 15);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, 16);
    float want = (float)n * (float)(n + 1) / 2;
    for (size_t i = 0; i < count; i++)
        CHECK(h[i] == want, 17);
    cudaStreamDestroy(st);
    CHECK(coll_mem_release(&b) == COLL_OK, 18);
    return 0;
}

static int small_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, j->group ? j->group : "g", 0) == COLL_OK, 3);
    int rc = small_allreduce(c, g, 0, 1);
    coll_disconnect(&c);
    return rc;
}

/* ---- probe ------------------------------------------------------------------------- */

static int probe_main(void *arg)
{
    int fd = *(int *)arg;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    uint8_t u[16];
    char s[64] = "";
    if (n > 0 && cudrv_device_uuid(0, u) == 0) cudrv_uuid_str(u, s, sizeof(s));
    dprintf(fd, "%d %s\n", n, s);
    return 0;
}

static void probe(void)
{
    int p[2];
    if (pipe(p) < 0) return;
    pid_t pid = child_run(probe_main, &p[1]);
    close(p[1]);
    char buf[128] = "";
    ssize_t n = read(p[0], buf, sizeof(buf) - 1);
    close(p[0]);
    child_wait(pid, 60000);
    if (n > 0) {
        buf[n] = '\0';
        sscanf(buf, "%d %63s", &ngpu, uuid0);
    }
}

static int ranks(void)
{
    return ngpu < 4 ? ngpu : 4;
}

/* An agent with one group "g" on NCCL: n slots on GPUs 0..n-1, the given op timeout. */
static int start_gpu_agent(struct agent *a, int n, int op_ms)
{
    char devs[128] = "", body[512];
    for (int k = 0; k < n; k++) {
        char d[24];
        snprintf(d, sizeof(d), "%s\"%d\"", k ? ", " : "", k);
        strcat(devs, d);
    }
    snprintf(body, sizeof(body),
             "groups:\n  - name: g\n    backend: nccl\n    devices: [%s]\n"
             "    timeouts: {op_ms: %d}\n",
             devs, op_ms);
    return agent_start(a, NULL, body);
}

/* ---- the op matrix -------------------------------------------------------------------- */

static void matrix(int ipc)
{
    int n = ranks();
    struct agent a;
    assert_int_equal(start_gpu_agent(&a, n, 60000), 0);
    pid_t pids[4];
    struct opcheck_job jobs[4];
    for (int k = 0; k < n; k++) {
        jobs[k] = (struct opcheck_job){
            .sock = a.sock, .explicit_slot = 1, .slot = k, .on_gpu = 1, .device = k, .ipc = ipc};
        pids[k] = child_run(opcheck_rank_main, &jobs[k]);
    }
    for (int k = 0; k < n; k++)
        assert_int_equal(child_wait(pids[k], 600000), 0);
    /* one communicator per GPU for the whole matrix: every later op hit the cache */
    assert_int_equal(agent_log_count(&a, "gpu.comm_init"), n);
    assert_int_equal(agent_log_count(&a, "gpu.comm_abort"), 0);
    assert_int_equal(agent_log_count(&a, "protocol_error"), 0);
    assert_int_equal(agent_stop(&a), 0);
}

static void ops_cumem_buffers(void **state)
{
    (void)state;
    matrix(0);
}

static void ops_legacy_ipc_buffers(void **state)
{
    (void)state;
    matrix(1);
}

/* ---- backend choice, by UUID ------------------------------------------------------------ */

static int auto_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g, *h;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "gpu-auto", COLL_SLOT_ANY) == COLL_OK, 3);
    CHECK(coll_group_open(&h, c, "host-auto", COLL_SLOT_ANY) == COLL_OK, 4);
    coll_group_info gi, hi;
    coll_group_info_get(g, &gi);
    coll_group_info_get(h, &hi);
    CHECK(strcmp(gi.backend, "nccl") == 0, 5);
    CHECK(strcmp(hi.backend, "host") == 0, 6);
    int rc = small_allreduce(c, g, 0, 1);
    if (rc) return rc;
    /* buffers in the wrong place are refused with a reason */
    coll_buffer *hb, *db;
    CHECK(coll_mem_alloc(&hb, c, 64, COLL_DEVICE_HOST) == COLL_OK, 20);
    CHECK(coll_mem_alloc(&db, c, 64, 0) == COLL_OK, 21);
    coll_request r;
    CHECK(coll_allreduce(g, coll_mem_ptr(hb), coll_mem_ptr(hb), 4, COLL_FLOAT32, COLL_SUM, NULL,
                         &r) == COLL_ERR_INVALID,
          22);
    CHECK(strstr(coll_last_error(), "GPU buffers") != NULL, 23);
    /* NCCL has no receive from any rank: refused before anything is sent */
    int src = -1;
    CHECK(coll_recv_any(g, coll_mem_ptr(db), 4, COLL_FLOAT32, 0, &src, NULL, &r) ==
              COLL_ERR_UNSUPPORTED,
          60);
    CHECK(strstr(coll_last_error(), "NCCL has no receive from any rank") != NULL, 61);
    CHECK(coll_allreduce(h, coll_mem_ptr(db), coll_mem_ptr(db), 4, COLL_FLOAT32, COLL_SUM, NULL,
                         &r) == COLL_ERR_INVALID,
          24);
    /* host ops are not for streams */
    CHECK(coll_allreduce(h, coll_mem_ptr(hb), coll_mem_ptr(hb), 4, COLL_FLOAT32, COLL_SUM, NULL,
                         &r) == COLL_OK,
          25);
    CHECK(coll_wait_stream(c, r, NULL) == COLL_ERR_INVALID, 26);
    CHECK(coll_wait(c, r, 10000) == COLL_OK, 27);
    CHECK(coll_mem_release(&hb) == COLL_OK && coll_mem_release(&db) == COLL_OK, 28);
    coll_group_close(&g);
    coll_group_close(&h);
    coll_disconnect(&c);
    return 0;
}

static void auto_backend_and_uuid(void **state)
{
    (void)state;
    struct agent a;
    char body[512];
    snprintf(body, sizeof(body),
             "groups:\n  - name: gpu-auto\n    devices: [\"%s\"]\n"
             "  - name: host-auto\n",
             uuid0);
    assert_int_equal(agent_start(&a, NULL, body), 0);
    assert_true(agent_log_wait(&a, "backend=nccl", 1, 5000));
    struct job j = {.sock = a.sock};
    assert_int_equal(child_wait(child_run(auto_main, &j), 120000), 0);
    assert_int_equal(agent_stop(&a), 0);
}

/* ---- stream order ----------------------------------------------------------------------- */

static int order_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    /* warm up: the communicator exists before the timed part */
    int rc = small_allreduce(c, g, 0, 1);
    if (rc) return rc;
    enum { N = 1 << 20 };
    coll_buffer *sb, *rb;
    CHECK(coll_mem_alloc(&sb, c, N * 4, 0) == COLL_OK, 4);
    CHECK(coll_mem_alloc(&rb, c, N * 4, 0) == COLL_OK, 5);
    float *in, *out;
    CHECK(cudaMallocHost((void **)&in, N * 4) == 0 && cudaMallocHost((void **)&out, N * 4) == 0, 6);
    for (int i = 0; i < N; i++) {
        in[i] = (float)(i % 1000);
        out[i] = -1;
    }
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 7);
    struct gate gt;
    CHECK(gate_make(&gt) == 0, 8);
    /* the stream: [gate] -> fill send -> allreduce -> (wait done) -> read recv */
    CHECK(gate_block(&gt, st) == 0, 9);
    CHECK(cudaMemcpyAsync(coll_mem_ptr(sb), in, N * 4, cudaMemcpyHostToDevice, st) == 0, 10);
    coll_request r1, r2;
    CHECK(coll_allreduce(g, coll_mem_ptr(sb), coll_mem_ptr(rb), N, COLL_FLOAT32, COLL_SUM, st,
                         &r1) == COLL_OK,
          11);
    CHECK(coll_wait_stream(c, r1, st) == COLL_OK, 12);
    /* a second op, awaited on the host */
    CHECK(coll_allreduce(g, coll_mem_ptr(rb), coll_mem_ptr(rb), N, COLL_FLOAT32, COLL_MAX, st,
                         &r2) == COLL_OK,
          13);
    CHECK(cudaMemcpyAsync(out, coll_mem_ptr(rb), N * 4, cudaMemcpyDeviceToHost, st) == 0, 14);
    /* while the app's stream is held, the agent must not have run the op */
    usleep(200000);
    int done = 1;
    CHECK(coll_test(c, r2, &done) == COLL_OK && done == 0, 15);
    CHECK(out[0] == -1 && out[N - 1] == -1, 16);
    /* a buffer an op still uses cannot be released */
    CHECK(coll_mem_release(&rb) == COLL_ERR_BUSY, 17);
    *gt.word = 1; /* open the gate from the CPU */
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, 18);
    for (int i = 0; i < N; i++)
        CHECK(out[i] == (float)(i % 1000), 19);
    CHECK(coll_wait(c, r2, 10000) == COLL_OK, 20);
    CHECK(coll_mem_release(&sb) == COLL_OK && coll_mem_release(&rb) == COLL_OK, 21);
    coll_group_close(&g);
    coll_disconnect(&c);
    return 0;
}

/* The shared region of this process's (only) connection, found by its memfd's name:
 * what a hostile client can write, whatever libcoll does. */
static struct wire_shm *own_region(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    void *p = NULL;
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, "memfd:coll-session")) {
            p = (void *)(uintptr_t)strtoull(line, NULL, 16);
            break;
        }
    if (f) fclose(f);
    return p;
}

/* Found on c65a60e: the launcher took done[i], which the client writes, as proof that
 * the GPU had finished; a client that stored it early made the agent drop the op's
 * buffer references, the release went through and the import was unmapped while the
 * kernel could still use it. Now completion is an event only the agent records: the
 * early word gains nothing, the release is refused, and another group on the GPU runs. */
static int early_done_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g, *h;
    CHECK(coll_connect(&c, j->sock, 2000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(coll_group_open(&h, c, "h", 0) == COLL_OK, 4);
    int rc = small_allreduce(c, g, 0, 1);
    if (rc) return rc;
    enum { N = 1 << 20 };
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, N * 4, 0) == COLL_OK, 5);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 6);
    struct gate gt;
    CHECK(gate_make(&gt) == 0, 7);
    CHECK(gate_block(&gt, st) == 0, 8);
    CHECK(cudaMemsetAsync(coll_mem_ptr(b), 0, N * 4, st) == cudaSuccess, 9);
    coll_request r;
    CHECK(coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), N, COLL_FLOAT32, COLL_SUM, st, &r) ==
              COLL_OK,
          10);
    struct wire_shm *w = own_region();
    CHECK(w != NULL, 11);
    uint32_t idx = (uint32_t)(r.id & 0xffffffffu) - 1;
    atomic_store(&w->done[idx], r.id); /* the lie: "the GPU has finished" */
    usleep(300000);
    int done = 1;
    CHECK(coll_test(c, r, &done) == COLL_OK && done == 0, 12); /* the agent did not believe it */
    CHECK(coll_mem_release(&b) == COLL_ERR_BUSY, 13);          /* nor let the buffer go */
    /* another group on the same GPU is served meanwhile */
    rc = small_allreduce(c, h, 0, 1);
    if (rc) return 30 + rc;
    *gt.word = 1;
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, 14);
    CHECK(coll_wait(c, r, 10000) == COLL_OK, 15);
    CHECK(coll_mem_release(&b) == COLL_OK, 16);
    rc = small_allreduce(c, g, 0, 1);
    if (rc) return 40 + rc;
    coll_disconnect(&c);
    return 0;
}

static void early_done_word_gains_nothing(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(
        agent_start(&a, NULL,
                    "groups:\n"
                    "  - {name: g, backend: nccl, devices: [\"0\"], timeouts: {op_ms: 60000}}\n"
                    "  - {name: h, backend: nccl, devices: [\"0\"], timeouts: {op_ms: 60000}}\n"),
        0);
    struct job j = {.sock = a.sock, .hold_fd = -1};
    assert_int_equal(child_wait(child_run(early_done_main, &j), 120000), 0);
    assert_int_equal(agent_log_count(&a, "illegal"), 0);
    assert_int_equal(agent_log_count(&a, "gpu.comm_abort"), 0);
    assert_int_equal(agent_stop(&a), 0);
}

/* Start a one-GPU agent (op timeout op_ms) and run fn as its one client, which must
 * succeed; the agent is left running for the caller's checks of its log. */
static void one_client(struct agent *a, int op_ms, int (*fn)(void *))
{
    assert_int_equal(start_gpu_agent(a, 1, op_ms), 0);
    struct job j = {.sock = a->sock, .hold_fd = -1};
    assert_int_equal(child_wait(child_run(fn, &j), 120000), 0);
}

static void stream_order_both_ways(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, order_main);
    assert_int_equal(agent_log_count(&a, "gpu.comm_init"), 1);
    assert_int_equal(agent_stop(&a), 0);
}

/* More ops than request slots, each handed to the stream (coll_wait_stream), behind a
 * gate: nobody can wait for them on the host, so submission must wait for slots to
 * free themselves (the gate opens from another thread), not fail with LIMIT. */
static void *open_later(void *arg)
{
    usleep(300000);
    *((struct gate *)arg)->word = 1;
    return NULL;
}

static int many_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(coll_mem_alloc(&b, c, 4096, 0) == COLL_OK, 4);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 5);
    float ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1.0f;
    float *x = coll_mem_ptr(b);
    CHECK(cudaMemcpy(x, ones, sizeof(ones), cudaMemcpyHostToDevice) == cudaSuccess, 6);
    struct gate gt;
    CHECK(gate_make(&gt) == 0 && gate_block(&gt, st) == 0, 7);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, open_later, &gt) == 0, 8);
    double t0 = now_ms();
    for (int i = 0; i < 600; i++) {
        coll_request r;
        /* out of place, ping-pong: each op reads what the one before wrote */
        float *src = x + (i % 2) * 16, *dst = x + ((i + 1) % 2) * 16;
        coll_err e = coll_allreduce(g, src, dst, 16, COLL_FLOAT32, COLL_SUM, st, &r);
        if (e == COLL_OK) e = coll_wait_stream(c, r, st);
        if (e != COLL_OK) {
            fprintf(stderr, "op %d: %s (%s)\n", i, coll_strerror(e), coll_last_error());
            return 9;
        }
    }
    double waited = now_ms() - t0;
    pthread_join(th, NULL);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, 10);
    float got[16];
    CHECK(cudaMemcpy(got, x, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess, 11);
    fprintf(stderr, "600 stream-waited ops behind a gate submitted in %.0f ms\n", waited);
    CHECK(got[0] == 1.0f && got[15] == 1.0f, 12);
    CHECK(waited >= 250, 13); /* the 257th waited for the gate */
    CHECK(coll_mem_release(&b) == COLL_OK, 14);
    coll_disconnect(&c);
    return 0;
}

/* coll_wait_stream_keep: the stream waits for the op on the GPU, and the host can still
 * look: not done while a gate holds the stream's earlier work (the op cannot have
 * started), done after it opens, with the result the stream's later work reads. */
static int keep_main(void *arg)
{
    struct job *j = arg;
    enum { N = 1024 };
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(coll_mem_alloc(&b, c, 2 * N * 4, 0) == COLL_OK, 4);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 5);
    static float h[N];
    for (int i = 0; i < N; i++)
        h[i] = (float)i;
    float *in = coll_mem_ptr(b), *out = in + N;
    struct gate gt;
    CHECK(gate_make(&gt) == 0 && gate_block(&gt, st) == 0, 6);
    CHECK(cudaMemcpyAsync(in, h, sizeof(h), cudaMemcpyHostToDevice, st) == cudaSuccess, 7);
    coll_request r;
    CHECK(coll_allreduce(g, in, out, N, COLL_FLOAT32, COLL_SUM, st, &r) == COLL_OK, 8);
    CHECK(coll_wait_stream_keep(c, r, st) == COLL_OK, 9);
    CHECK(cudaMemsetAsync(in, 0, N * 4, st) == cudaSuccess, 10); /* after the op, on the GPU */
    usleep(200000);
    int done = 1;
    CHECK(coll_test(c, r, &done) == COLL_OK && done == 0, 11); /* the gate holds it */
    *gt.word = 1;
    CHECK(coll_wait(c, r, 20000) == COLL_OK, 12); /* reported on the host, consumed */
    CHECK(coll_test(c, r, &done) == COLL_ERR_INVALID, 13);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, 14);
    static float got[N];
    CHECK(cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess, 15);
    for (int i = 0; i < N; i++)
        CHECK(got[i] == (float)i, 16);
    CHECK(cudaMemcpy(got, in, sizeof(got), cudaMemcpyDeviceToHost) == cudaSuccess, 17);
    CHECK(got[0] == 0.0f && got[N - 1] == 0.0f, 18); /* the stream's later work ran after */
    CHECK(coll_mem_release(&b) == COLL_OK, 19);
    coll_disconnect(&c);
    return 0;
}

static void a_kept_stream_wait_still_answers_the_host(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, keep_main);
    assert_int_equal(agent_stop(&a), 0);
}

static void stream_waited_ops_free_their_slots(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, many_main);
    assert_int_equal(agent_stop(&a), 0);
}

/* The same op again and again (one rank: replayed from a captured graph after the
 * second time), with new inputs each time, then on a new buffer after the old one is
 * released: every result is checked, for each op kind that replays. */
static int repeat_main(void *arg)
{
    struct job *j = arg;
    enum { N = 4099 };
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 4);
    static float h[2 * N];
    for (int round = 0; round < 2; round++) {
        coll_buffer *b;
        CHECK(coll_mem_alloc(&b, c, 2 * N * 4, 0) == COLL_OK, 5);
        float *in = coll_mem_ptr(b), *out = in + N;
        for (int kind = 0; kind < 5; kind++) {
            for (int k = 0; k < 5; k++) {
                for (int i = 0; i < N; i++) {
                    h[i] = (float)(i % 97) + (float)(100 * k + 10 * kind + round);
                    h[N + i] = -1.0f;
                }
                CHECK(cudaMemcpyAsync(in, h, sizeof(h), cudaMemcpyHostToDevice, st) == 0, 6);
                coll_request r;
                coll_err e;
                switch (kind) {
                case 0:
                    e = coll_allreduce(g, in, out, N, COLL_FLOAT32, COLL_AVG, st, &r);
                    break;
                case 1:
                    e = coll_broadcast(g, in, out, N, COLL_FLOAT32, 0, st, &r);
                    break;
                case 2:
                    e = coll_reduce(g, in, out, N, COLL_FLOAT32, COLL_MAX, 0, st, &r);
                    break;
                case 3:
                    e = coll_allgather(g, in, out, N, COLL_FLOAT32, st, &r);
                    break;
                default:
                    e = coll_reduce_scatter(g, in, out, N, COLL_FLOAT32, COLL_SUM, st, &r);
                    break;
                }
                CHECK(e == COLL_OK, 7);
                CHECK(coll_wait_stream(c, r, st) == COLL_OK, 8);
                CHECK(cudaMemcpyAsync(h + N, out, N * 4, cudaMemcpyDeviceToHost, st) == 0, 9);
                CHECK(cudaStreamSynchronize(st) == cudaSuccess, 10);
                for (int i = 0; i < N; i++) {
                    float want = (float)(i % 97) + (float)(100 * k + 10 * kind + round);
                    if (h[N + i] != want) {
                        fprintf(stderr, "round %d kind %d pass %d: element %d is %g, want %g\n",
                                round, kind, k, i, (double)h[N + i], (double)want);
                        return 11;
                    }
                }
            }
        }
        CHECK(coll_mem_release(&b) == COLL_OK, 12);
    }
    cudaStreamDestroy(st);
    coll_disconnect(&c);
    return 0;
}

static void repeated_ops_replay(void **state)
{
    (void)state;
    struct agent a;
    int hport = free_port();
    char body[256], file[128], out[4096];
    snprintf(body, sizeof(body),
             "http:\n  address: 127.0.0.1\n  port: %d\n"
             "groups:\n  - name: g\n    backend: nccl\n    devices: [\"0\"]\n",
             hport);
    assert_int_equal(agent_start(&a, NULL, body), 0);
    struct job j = {.sock = a.sock, .hold_fd = -1};
    assert_int_equal(child_wait(child_run(repeat_main, &j), 120000), 0);
    /* the operator's view: replays and captures per group in /metrics */
    tmp_path(file, sizeof(file), "metrics", 0);
    assert_int_equal(metrics_fresh(hport, file, 10000), 200);
    int rc = metrics_parse(file, out, sizeof(out));
    printf("%s", out);
    long replays = metric_of(out, "graph_replays_g"), made = metric_of(out, "graphs_captured_g");
    unlink(file);
    assert_int_equal(agent_stop(&a), 0);
    /* replayed: the launcher's closing line counts graphs and replays */
    assert_int_equal(agent_log_count(&a, "gpu.launcher_stopped"), 1);
    assert_int_equal(agent_log_count(&a, "replayed=0"), 0);
    assert_int_equal(agent_log_count(&a, " graphs=0 "), 0);
    if (rc == 77) skip(); /* said why: no Prometheus parser here */
    assert_int_equal(rc, 0);
    /* 2 rounds x 5 kinds: captured on the 2nd of 5 passes, replayed on the 3 after;
       the group's figures are the launcher's own (one group on the GPU) */
    char want[96];
    snprintf(want, sizeof(want), " graphs=%ld replayed=%ld", made, replays);
    assert_int_equal(agent_log_count(&a, want), 1);
    assert_int_equal(made, 10);
    assert_int_equal(replays, 40);
}

/* ---- groups made at run time ------------------------------------------------------------ */

/* Children of a GPU group on this pod: split and created, nested, run on NCCL with
 * communicators of their own, interleaved with the parent's ops; closed and made again. */
static int children_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g, *k, *kk, *none = (coll_group *)1;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(cudaSetDevice(0) == cudaSuccess, 4);
    int rc = small_allreduce(c, g, 0, 1);
    if (rc) return rc;
    /* NOCOLOR: the split takes part, and no group comes back */
    CHECK(coll_group_split(g, COLL_SPLIT_NOCOLOR, 0, &none) == COLL_OK && none == NULL, 5);
    for (int round = 0; round < 2; round++) {
        CHECK(coll_group_split(g, 7, 0, &k) == COLL_OK, 20);
        coll_group_info info;
        CHECK(coll_group_info_get(k, &info) == COLL_OK, 21);
        CHECK(info.size == 1 && info.rank == 0 && strcmp(info.backend, "nccl") == 0, 22);
        int pr[2] = {-1, -1};
        CHECK(coll_group_parent_ranks(k, pr, 2) == 1 && pr[0] == 0, 23);
        rc = small_allreduce(c, k, 0, 1);
        if (rc) return 100 + rc;
        rc = small_allreduce(c, g, 0, 1); /* the parent's communicator still serves */
        if (rc) return 200 + rc;
        int one = 0;
        CHECK(coll_group_create(k, &one, 1, &kk) == COLL_OK, 24); /* a child's child */
        CHECK(coll_group_info_get(kk, &info) == COLL_OK && strcmp(info.backend, "nccl") == 0, 25);
        rc = small_allreduce(c, kk, 0, 1);
        if (rc) return 300 + rc;
        rc = small_allreduce(c, k, 0, 1);
        if (rc) return 400 + rc;
        coll_group_close(&kk);
        coll_group_close(&k);
    }
    rc = small_allreduce(c, g, 0, 1);
    if (rc) return 500 + rc;
    coll_disconnect(&c);
    return 0;
}

/* gather, scatter and alltoallv on a GPU group (coll.h's composite ops; one rank: its
 * own blocks, copied on the op's stream after the work before it), waited for on the
 * stream (keep) and then on the host. */
static int composite_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(cudaSetDevice(0) == cudaSuccess, 4);
    enum { N = 4096 };
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, 2 * N * sizeof(int32_t), 0) == COLL_OK, 5);
    int32_t *x = coll_mem_ptr(b), *y = x + N, h[N];
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 6);
    void *z; /* the next input, ready on the device (a pageable source would wait for us) */
    CHECK(cudaMalloc(&z, sizeof(h)) == cudaSuccess, 6);
    for (int kind = 0; kind < 3; kind++) {
        for (int i = 0; i < N; i++)
            h[i] = i * 3 + kind;
        CHECK(cudaMemcpy(z, h, sizeof(h), cudaMemcpyHostToDevice) == cudaSuccess, 6);
        CHECK(cudaMemsetAsync(y, 0xff, N * sizeof(int32_t), st) == cudaSuccess, 7);
        struct gate gt; /* the input is written only once the gate opens, after the call */
        CHECK(gate_make(&gt) == 0 && gate_block(&gt, st) == 0, 8);
        CHECK(cudaMemcpyAsync(x, z, sizeof(h), cudaMemcpyDeviceToDevice, st) == cudaSuccess, 9);
        coll_request r;
        size_t cnt = N, dsp = 0;
        coll_err e = kind == 0 ? coll_gather(g, x, y, N, COLL_INT32, 0, st, &r)
                     : kind == 1
                         ? coll_scatter(g, x, y, N, COLL_INT32, 0, st, &r)
                         : coll_alltoallv(g, x, &cnt, &dsp, y, &cnt, &dsp, COLL_INT32, st, &r);
        CHECK(e == COLL_OK, 10 + kind);
        usleep(50000); /* a copy that did not follow the stream would have run by now */
        *gt.word = 1;
        /* a composite op has nobody to reap it once handed to the stream: refused */
        CHECK(coll_wait_stream(c, r, st) == COLL_ERR_INVALID, 20);
        CHECK(strstr(coll_last_error(), "coll_wait_stream_keep") != NULL, 21);
        CHECK(coll_wait_stream_keep(c, r, st) == COLL_OK, 22);
        int32_t back[N];
        CHECK(cudaMemcpyAsync(back, y, sizeof(back), cudaMemcpyDeviceToHost, st) == 0, 23);
        CHECK(cudaStreamSynchronize(st) == cudaSuccess, 24);
        CHECK(coll_wait(c, r, 30000) == COLL_OK, 25);
        for (int i = 0; i < N; i++)
            if (back[i] != i * 3 + kind) {
                fprintf(stderr, "kind %d: [%d] = %d\n", kind, i, back[i]);
                return 30 + kind;
            }
    }
    cudaStreamDestroy(st);
    cudaFree(z);
    CHECK(coll_mem_release(&b) == COLL_OK, 40);
    coll_disconnect(&c);
    return 0;
}

/* The allocation hooks a framework's memory pool calls (torch's CUDAPluggableAllocator):
 * each block is a coll buffer of the bound connection, an op on it runs in place, and
 * the free hook releases it; nothing is bound once the connection goes. */
static int hooks_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(cudaSetDevice(0) == cudaSuccess, 4);
    CHECK(coll_hooks_bind(c) == COLL_OK, 5);
    enum { N = 3 << 18 }; /* 3 MiB of int32 */
    int32_t *p = coll_alloc_hook(N * sizeof(int32_t), 0, NULL);
    CHECK(p != NULL, 6);
    coll_buffer *b = NULL;
    size_t off = 1;
    CHECK(coll_mem_find(c, p + 5, &b, &off) == COLL_OK && off == 5 * sizeof(int32_t), 7);
    CHECK(coll_mem_size(b) >= N * sizeof(int32_t), 8);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 9);
    CHECK(cudaMemsetAsync(p, 0x01, N * sizeof(int32_t), st) == cudaSuccess, 10);
    coll_request r;
    CHECK(coll_allreduce(g, p, p, N, COLL_INT32, COLL_SUM, st, &r) == COLL_OK, 11);
    CHECK(coll_wait_stream(c, r, st) == COLL_OK, 12);
    int32_t last;
    CHECK(cudaMemcpyAsync(&last, p + N - 1, sizeof(last), cudaMemcpyDeviceToHost, st) == 0, 13);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess && last == 0x01010101, 14);
    /* a pointer inside the block, or one the hooks did not hand out, is left alone */
    coll_free_hook(p + 1, 4, 0, st);
    CHECK(coll_mem_find(c, p, &b, &off) == COLL_OK, 15);
    coll_free_hook(p, N * sizeof(int32_t), 0, st);
    CHECK(coll_mem_find(c, p, &b, &off) == COLL_ERR_NOT_FOUND, 16);
    coll_free_hook(p, N * sizeof(int32_t), 0, st); /* twice: ignored */
    cudaStreamDestroy(st);
    coll_group_close(&g);
    coll_disconnect(&c);
    CHECK(coll_alloc_hook(4096, 0, NULL) == NULL, 17);
    CHECK(strstr(coll_last_error(), "no connection is bound") != NULL, 18);
    return 0;
}

/* A premultiplied sum on NCCL (one rank: its input times its scalar), float32 and
 * int32, allreduce and reduce_scatter, launched again (never replayed from a graph). */
static int premul_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(cudaSetDevice(0) == cudaSuccess, 4);
    enum { N = 1024 };
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, 2 * N * sizeof(float), 0) == COLL_OK, 5);
    float *x = coll_mem_ptr(b), *y = x + N, h[N], back[N];
    float s = 2.5f;
    int32_t si = -3;
    coll_redop op, opi;
    CHECK(coll_redop_create_premul_sum(g, &s, COLL_FLOAT32, &op) == COLL_OK, 6);
    CHECK(coll_redop_create_premul_sum(g, &si, COLL_INT32, &opi) == COLL_OK, 7);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 8);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++)
            h[i] = (float)(i % 97) + round;
        CHECK(cudaMemcpyAsync(x, h, sizeof(h), cudaMemcpyHostToDevice, st) == 0, 9);
        coll_request r;
        int isint = round == 2;
        if (isint) {
            int32_t *xi = (int32_t *)x;
            int32_t hi[N];
            for (int i = 0; i < N; i++)
                hi[i] = i - 500;
            CHECK(cudaMemcpyAsync(xi, hi, sizeof(hi), cudaMemcpyHostToDevice, st) == 0, 10);
            CHECK(cudaStreamSynchronize(st) == 0, 10);
            CHECK(coll_reduce_scatter(g, xi, y, N, COLL_INT32, opi, st, &r) == COLL_OK, 11);
        } else {
            CHECK(coll_allreduce(g, x, y, N, COLL_FLOAT32, op, st, &r) == COLL_OK, 12);
        }
        CHECK(coll_wait_stream(c, r, st) == COLL_OK, 13);
        CHECK(cudaMemcpyAsync(back, y, sizeof(back), cudaMemcpyDeviceToHost, st) == 0, 14);
        CHECK(cudaStreamSynchronize(st) == cudaSuccess, 15);
        for (int i = 0; i < N; i++) {
            int ok = isint ? ((int32_t *)back)[i] == (i - 500) * -3 : back[i] == h[i] * 2.5f;
            if (!ok) {
                fprintf(stderr, "round %d: [%d] wrong\n", round, i);
                return 20 + round;
            }
        }
    }
    cudaStreamDestroy(st);
    CHECK(coll_mem_release(&b) == COLL_OK, 30);
    coll_disconnect(&c);
    return 0;
}

static void premultiplied_sum_on_nccl(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, premul_main);
    assert_int_equal(agent_stop(&a), 0);
}

static void alloc_hooks_give_coll_memory(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, hooks_main);
    assert_int_equal(agent_stop(&a), 0);
}

static void gather_scatter_alltoallv_on_the_stream(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, composite_main);
    assert_int_equal(agent_stop(&a), 0);
}

static void children_run_on_nccl(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 60000, children_main);
    /* the parent's communicator, and one per child made (2 rounds x a child and its
     * child), each destroyed once its child went */
    assert_int_equal(agent_log_count(&a, "gpu.comm_init"), 5);
    assert_int_equal(agent_log_count(&a, "gpu.comm_forget"), 4);
    assert_int_equal(agent_log_count(&a, "gpu.comm_abort"), 0);
    assert_int_equal(agent_log_count(&a, "/0+0 backend=nccl"), 4);
    assert_int_equal(agent_stop(&a), 0);
}

/* ---- failures ------------------------------------------------------------------------------ */

/* Submit an op behind a gate that stays shut; tell the parent; linger. */
static int held_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    int rc = small_allreduce(c, g, 0, 1);
    if (rc) return rc;
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, 1 << 20, 0) == COLL_OK, 4);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 5);
    struct gate gt;
    CHECK(gate_make(&gt) == 0 && gate_block(&gt, st) == 0, 6);
    coll_request r;
    CHECK(coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), 1 << 18, COLL_FLOAT32, COLL_SUM, st,
                         &r) == COLL_OK,
          7);
    CHECK(coll_wait_stream(c, r, st) == COLL_OK, 8);
    if (j->hold_fd >= 0) {
        CHECK(write(j->hold_fd, "x", 1) == 1, 9);
        pause(); /* killed here */
        return 10;
    }
    /* the op waits for our stream past the group's op timeout: it fails, and both
     * streams are released */
    double t0 = now_ms();
    coll_request r2;
    coll_err e =
        coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), 16, COLL_FLOAT32, COLL_SUM, st, &r2);
    if (e == COLL_OK) e = coll_wait(c, r2, 20000);
    double waited = now_ms() - t0;
    fprintf(stderr, "held op ended with %s after %.0f ms: %s\n", coll_strerror(e), waited,
            coll_last_error());
    CHECK(e == COLL_ERR_TIMEOUT || e == COLL_ERR_PEER_LOST, 11);
    /* the agent said why, not only the code */
    CHECK(strstr(coll_last_error(), "the agent failed the op (") != NULL, 16);
    CHECK(coll_err_retryable(e), 12);
    CHECK(waited < 10000, 13);
    *gt.word = 1;
    double t1 = now_ms();
    cudaError_t q;
    while ((q = cudaStreamQuery(st)) == cudaErrorNotReady && now_ms() - t1 < 10000)
        usleep(1000);
    CHECK(q == cudaSuccess, 14);
    /* reopen (new epoch) and work again, on a new communicator */
    coll_group_close(&g);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 15);
    rc = small_allreduce(c, g, 0, 1);
    if (rc) return rc + 20;
    coll_disconnect(&c);
    return 0;
}

static void client_killed_mid_op(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(start_gpu_agent(&a, 1, 60000), 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    struct job j = {.sock = a.sock, .hold_fd = p[1]};
    pid_t pid = child_run(held_main, &j);
    close(p[1]);
    char x;
    assert_int_equal(read(p[0], &x, 1), 1);
    close(p[0]);
    kill(pid, SIGKILL);
    assert_int_equal(child_wait(pid, 10000), 128 + SIGKILL);
    assert_true(agent_log_wait(&a, "session.closed", 1, 5000));
    /* the agent serves the next client, on the cached communicator */
    struct job j3 = {.sock = a.sock};
    assert_int_equal(child_wait(child_run(small_main, &j3), 60000), 0);
    assert_int_equal(agent_log_count(&a, "gpu.comm_init"), 1);
    assert_int_equal(agent_log_count(&a, "gpu.comm_abort"), 0);
    assert_int_equal(agent_stop(&a), 0);
}

static void op_timeout_releases_streams(void **state)
{
    (void)state;
    struct agent a;
    one_client(&a, 1500, held_main);
    /* the broken communicator was replaced once */
    assert_int_equal(agent_log_count(&a, "gpu.comm_init"), 2);
    assert_true(agent_log_count(&a, "gpu.comm_abort") >= 1);
    assert_int_equal(agent_stop(&a), 0);
}

/* ---- pods: one agent per GPU (one GPU: both on it, NCCL_HOSTID) ----------------------------- */

/* Agent `index` of a two-pod NCCL group "g" on GPU `index` (modulo the GPUs there are).
 * Each agent names a host of its own to NCCL (NCCL_HOSTID): two pods on one GPU then
 * talk over NCCL's network transport, as pods on two nodes do, and NCCL does not refuse
 * them as two ranks on one GPU of one host. */
static int start_pod(struct agent *a, int port, int index)
{
    char body[1024], host[32];
    snprintf(host, sizeof(host), "coll-test-pod-%d", index);
    setenv("NCCL_HOSTID", host, 1);
    int dev = index % (ngpu > 0 ? ngpu : 1);
    snprintf(body, sizeof(body),
             "node:\n  index: %d\n  name: pod-%d\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: g\n    backend: nccl\n    members: 2\n    devices: [\"%d\"]\n"
             "    timeouts: {op_ms: 20000, heartbeat_ms: 250, join_ms: 10000}\n",
             index, index, port, dev);
    int rc = agent_start(a, NULL, body);
    unsetenv("NCCL_HOSTID");
    return rc;
}

static void two_pods_one_gpu_each(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_pod(&a[i], port, i), 0);
    pid_t pids[2];
    struct opcheck_job jobs[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (struct opcheck_job){
            .sock = a[i].sock, .explicit_slot = 1, .slot = 0, .on_gpu = 1, .device = i % ngpu};
        pids[i] = child_run(opcheck_rank_main, &jobs[i]);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(child_wait(pids[i], 120000), 0);
    for (int i = 0; i < 2; i++) {
        /* one epoch, one communicator per pod, its id from the coordinator's COMMIT (the
         * epoch, and its communicator, end when the applications leave) */
        assert_int_equal(agent_log_count(&a[i], "gpu.comm_init"), 1);
        assert_int_equal(agent_log_count(&a[i], "group.commid"), 0);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
}

/* ---- children across pods (decision 32) ------------------------------------------------ */

/* On child k of two ranks: a broadcast from child rank 0 and an allgather of each rank's
 * child rank, checked (the communicator's ranks are the child's, in its list's order). */
static int span_ops(coll_conn *c, coll_group *k, int dev)
{
    enum { N = 256 };
    coll_group_info info;
    CHECK(coll_group_info_get(k, &info) == COLL_OK, 30);
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, 3 * N * sizeof(int32_t), dev) == COLL_OK, 31);
    int32_t *x = coll_mem_ptr(b), h[2 * N];
    for (int i = 0; i < N; i++)
        h[i] = 100 + info.rank;
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 32);
    CHECK(cudaMemcpyAsync(x, h, N * sizeof(int32_t), cudaMemcpyHostToDevice, st) == 0, 33);
    coll_request r;
    CHECK(coll_broadcast(k, x, x, N, COLL_INT32, 0, st, &r) == COLL_OK, 34);
    CHECK(coll_wait_stream(c, r, st) == COLL_OK, 35);
    int32_t mine = info.rank;
    CHECK(cudaMemcpyAsync(x + N, &mine, sizeof(mine), cudaMemcpyHostToDevice, st) == 0, 36);
    CHECK(coll_allgather(k, x + N, x + 2 * N, 1, COLL_INT32, st, &r) == COLL_OK, 37);
    CHECK(coll_wait_stream(c, r, st) == COLL_OK, 38);
    CHECK(cudaMemcpyAsync(h, x, N * sizeof(int32_t), cudaMemcpyDeviceToHost, st) == 0, 39);
    CHECK(cudaMemcpyAsync(h + N, x + 2 * N, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, st) == 0,
          40);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, 41);
    for (int i = 0; i < N; i++)
        CHECK(h[i] == 100, 42);
    CHECK(h[N] == 0 && h[N + 1] == 1, 43);
    cudaStreamDestroy(st);
    CHECK(coll_mem_release(&b) == COLL_OK, 44);
    return 0;
}

/* Pod j->device's rank of the two-pod group g: a child of both ranks listed backwards
 * (create), the same by split (the key reverses them), and the list again (its second
 * child of the epoch); each runs checked ops, and the parent serves between them. */
static int span_child_main(void *arg)
{
    struct job *j = arg;
    int dev = j->device;
    coll_conn *c;
    coll_group *g, *k;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(cudaSetDevice(dev) == cudaSuccess, 4);
    coll_group_info gi;
    CHECK(coll_group_info_get(g, &gi) == COLL_OK && gi.size == 2, 5);
    int me = gi.rank;
    for (int round = 0; round < 3; round++) {
        int list[2] = {1, 0};
        if (round == 1)
            CHECK(coll_group_split(g, 3, -me, &k) == COLL_OK, 10);
        else
            CHECK(coll_group_create(g, list, 2, &k) == COLL_OK, 11);
        coll_group_info info;
        CHECK(coll_group_info_get(k, &info) == COLL_OK, 12);
        CHECK(info.size == 2 && info.rank == 1 - me && strcmp(info.backend, "nccl") == 0, 13);
        int pr[2] = {-1, -1};
        CHECK(coll_group_parent_ranks(k, pr, 2) == 2 && pr[0] == 1 && pr[1] == 0, 14);
        int rc = small_allreduce(c, k, dev, 2);
        if (rc) return 100 * (round + 1) + rc;
        rc = span_ops(c, k, dev);
        if (rc) return 100 * (round + 1) + rc;
        rc = small_allreduce(c, g, dev, 2);
        if (rc) return 100 * (round + 1) + 50 + rc;
        coll_group_close(&k);
    }
    coll_disconnect(&c);
    return 0;
}

static void children_across_pods_on_nccl(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_pod(&a[i], port, i), 0);
    struct job jobs[2];
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (struct job){.sock = a[i].sock, .device = i % ngpu, .hold_fd = -1};
        pids[i] = child_run(span_child_main, &jobs[i]);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(child_wait(pids[i], 120000), 0);
    for (int i = 0; i < 2; i++) {
        /* three children, each its id from the coordinator, its communicator made and,
         * when its member closed it, destroyed (not aborted); the parent's kept */
        assert_int_equal(agent_log_count(&a[i], "group.child_ask"), 3);
        assert_int_equal(agent_log_count(&a[i], "group.child_id"), 0);
        assert_int_equal(agent_log_count(&a[i], "gpu.comm_init"), 4);
        assert_int_equal(agent_log_count(&a[i], "gpu.comm_forget"), 3);
        assert_int_equal(agent_log_count(&a[i], "gpu.comm_abort"), 0);
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
}

/* ---- a communicator that cannot form holds up no other group on its GPU --------------- */

/* Open the two-pod group g, submit an allreduce that pod 1 never joins (its NCCL
 * communicator waits for rank 1 until join_ms), say so, then wait for its failure. */
static int stuck_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    CHECK(cudaSetDevice(0) == cudaSuccess, 4);
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, 4096, 0) == COLL_OK, 5);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st) == cudaSuccess, 6);
    coll_request r;
    CHECK(coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), 1024, COLL_FLOAT32, COLL_SUM, st,
                         &r) == COLL_OK,
          7);
    CHECK(write(j->hold_fd, "x", 1) == 1, 8);
    coll_err e = coll_wait(c, r, 60000);
    fprintf(stderr, "the stuck op ended with %s: %s\n", coll_strerror(e), coll_last_error());
    CHECK(e != COLL_OK && coll_err_retryable(e), 9);
    coll_disconnect(&c);
    return 0;
}

static void stuck_communicator_delays_no_other_group(void **state)
{
    (void)state;
    /* pod 0 has the two-pod group g and the one-pod group h, both on GPU 0; pod 1 (on
     * the same GPU: it never creates its communicator) forms g and has no client */
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "node:\n  index: %d\n  name: pod-%d\n"
                 "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
                 "groups:\n  - name: g\n    backend: nccl\n    members: 2\n    devices: [\"0\"]\n"
                 "    timeouts: {op_ms: 30000, heartbeat_ms: 250, join_ms: 8000}\n%s",
                 i, i, port,
                 i == 0 ? "  - name: h\n    backend: nccl\n    devices: [\"0\"]\n" : "");
        assert_int_equal(agent_start(&a[i], NULL, body), 0);
    }
    for (int i = 0; i < 2; i++)
        assert_true(agent_log_wait(&a[i], "group.formed", 1, 15000));
    int p[2];
    assert_int_equal(pipe(p), 0);
    struct job js = {.sock = a[0].sock, .hold_fd = p[1]};
    pid_t stuck = child_run(stuck_main, &js);
    close(p[1]);
    char x;
    assert_int_equal(read(p[0], &x, 1), 1);
    close(p[0]);
    assert_true(agent_log_wait(&a[0], "gpu.comm_init", 1, 5000)); /* g's, waiting for rank 1 */
    /* h's ops run on GPU 0 while g's communicator waits */
    struct job jh = {.sock = a[0].sock, .group = "h"};
    double t0 = now_ms();
    assert_int_equal(child_wait(child_run(small_main, &jh), 60000), 0);
    double took = now_ms() - t0;
    int status;
    int stuck_running = waitpid(stuck, &status, WNOHANG) == 0;
    int aborts = agent_log_count(&a[0], "gpu.comm_abort");
    printf("h's client took %.0f ms; g's op still waiting: %s; aborts so far: %d\n", took,
           stuck_running ? "yes" : "no", aborts);
    assert_true(stuck_running);
    assert_int_equal(aborts, 0);
    assert_int_equal(agent_log_count(&a[0], "gpu.comm_init"), 2);
    /* g's op fails at its communicator's deadline, with a retryable error */
    assert_int_equal(child_wait(stuck, 60000), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
}

/* Pod 0's application: an allreduce with pod 1, then one that pod 1 never joins (its
 * agent is killed): it must fail with a retryable error well inside op_ms; then, when
 * the parent says pod 1 is back, reopen and run again. */
/* times in-place allreduces of 1024 floats on b (rank r starts at r + 1; two ranks), each
 * waited for on the host: the same op every time, so after the second it is replayed
 * from a captured graph. Checks the doubling sums. */
static int repeated_pair_allreduce(coll_conn *c, coll_group *g, coll_buffer *b, int rank, int times)
{
    float h[1024];
    for (int i = 0; i < 1024; i++)
        h[i] = (float)(rank + 1);
    CHECK(cudaMemcpy(coll_mem_ptr(b), h, sizeof(h), cudaMemcpyHostToDevice) == 0, 40);
    for (int k = 0; k < times; k++) {
        coll_request r;
        CHECK(coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), 1024, COLL_FLOAT32, COLL_SUM,
                             NULL, &r) == COLL_OK,
              41);
        CHECK(coll_wait(c, r, 30000) == COLL_OK, 42);
    }
    CHECK(cudaMemcpy(h, coll_mem_ptr(b), sizeof(h), cudaMemcpyDeviceToHost) == 0, 43);
    float want = 3.0f * (float)(1 << (times - 1));
    for (int i = 0; i < 1024; i++)
        CHECK(h[i] == want, 44);
    return 0;
}

static int survivor_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    int rc = small_allreduce(c, g, 0, 2);
    if (rc) return rc;
    coll_buffer *b;
    CHECK(coll_mem_alloc(&b, c, 4096, 0) == COLL_OK, 4);
    /* a few of the same op first: the one the peer's death interrupts is replayed from a
     * graph, whose communicator must still abort */
    rc = repeated_pair_allreduce(c, g, b, 0, 4);
    if (rc) return rc;
    coll_request r;
    CHECK(coll_allreduce(g, coll_mem_ptr(b), coll_mem_ptr(b), 1024, COLL_FLOAT32, COLL_SUM, NULL,
                         &r) == COLL_OK,
          5);
    CHECK(write(j->hold_fd, "a", 1) == 1, 6);
    double t0 = now_ms();
    coll_err e = coll_wait(c, r, 30000);
    double waited = now_ms() - t0;
    fprintf(stderr, "survivor: op ended with %s after %.0f ms: %s\n", coll_strerror(e), waited,
            coll_last_error());
    CHECK(e == COLL_ERR_PEER_LOST && coll_err_retryable(e), 7);
    CHECK(waited < 10000, 8);
    char go;
    CHECK(read(j->back_fd, &go, 1) == 1, 9);
    CHECK(coll_mem_release(&b) == COLL_OK, 10);
    coll_group_close(&g);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 11);
    rc = small_allreduce(c, g, 0, 2);
    if (rc) return rc + 20;
    coll_disconnect(&c);
    return 0;
}

static int pod1_main(void *arg)
{
    struct job *j = arg;
    coll_conn *c;
    coll_group *g;
    CHECK(coll_connect(&c, j->sock, 10000) == COLL_OK, 2);
    CHECK(coll_group_open(&g, c, "g", 0) == COLL_OK, 3);
    int rc = small_allreduce(c, g, 1 % ngpu, 2);
    if (rc == 0 && j->hold_fd >= 0) {
        coll_buffer *b;
        CHECK(coll_mem_alloc(&b, c, 4096, 1 % ngpu) == COLL_OK, 4);
        rc = repeated_pair_allreduce(c, g, b, 1, 4);
        if (rc == 0) pause(); /* stay attached until killed */
    }
    coll_disconnect(&c);
    return rc;
}

static void killed_pod_fails_survivor_then_reforms(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_pod(&a[i], port, i), 0);
    int up[2], back[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(back), 0);
    struct job j0 = {.sock = a[0].sock, .hold_fd = up[1], .back_fd = back[0]};
    struct job j1 = {.sock = a[1].sock, .hold_fd = 1};
    pid_t p0 = child_run(survivor_main, &j0);
    pid_t p1 = child_run(pod1_main, &j1);
    char x;
    assert_int_equal(read(up[0], &x, 1), 1);
    usleep(300000); /* pod 0's op is on its GPU, waiting for pod 1, whose app stays */
    kill(a[1].pid, SIGKILL);
    child_wait(a[1].pid, 5000);
    a[1].pid = 0;
    kill(p1, SIGKILL);
    child_wait(p1, 5000);
    j1.hold_fd = -1;
    assert_true(agent_log_wait(&a[0], "gpu.comm_abort", 1, 10000));
    /* pod 1 comes back: the group re-forms on a new epoch and communicator */
    assert_int_equal(start_pod(&a[1], port, 1), 0);
    assert_int_equal(write(back[1], "g", 1), 1);
    pid_t p1b = child_run(pod1_main, &j1);
    assert_int_equal(child_wait(p1b, 120000), 0);
    assert_int_equal(child_wait(p0, 120000), 0);
    assert_int_equal(agent_log_count(&a[0], "gpu.comm_init"), 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
    /* the interrupted op was a replay (two-rank graphs), and its abort still finished */
    assert_int_equal(agent_log_count(&a[0], "gpu.launcher_stopped"), 1);
    assert_int_equal(agent_log_count(&a[0], "replayed=0"), 0);
}

int main(void)
{
    probe();
    if (ngpu == 0) {
        printf("SKIP: test_gpu needs a GPU; cudaGetDeviceCount found none on this machine\n");
        return 77;
    }
    printf("test_gpu: %d GPU(s), device 0 is %s; ranks per group: %d\n", ngpu, uuid0, ranks());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(auto_backend_and_uuid),
        cmocka_unit_test(stream_order_both_ways),
        cmocka_unit_test(early_done_word_gains_nothing),
        cmocka_unit_test(stream_waited_ops_free_their_slots),
        cmocka_unit_test(a_kept_stream_wait_still_answers_the_host),
        cmocka_unit_test(repeated_ops_replay),
        cmocka_unit_test(children_run_on_nccl),
        cmocka_unit_test(gather_scatter_alltoallv_on_the_stream),
        cmocka_unit_test(alloc_hooks_give_coll_memory),
        cmocka_unit_test(premultiplied_sum_on_nccl),
        cmocka_unit_test(client_killed_mid_op),
        cmocka_unit_test(op_timeout_releases_streams),
        cmocka_unit_test(ops_cumem_buffers),
        cmocka_unit_test(ops_legacy_ipc_buffers),
        cmocka_unit_test(stuck_communicator_delays_no_other_group),
        cmocka_unit_test(two_pods_one_gpu_each),
        cmocka_unit_test(children_across_pods_on_nccl),
        cmocka_unit_test(killed_pod_fails_survivor_then_reforms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
