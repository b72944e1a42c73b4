/*
 * test_robust.c: bad clients and failures against a real agent. In every case the
 * agent logs, drops the offender (or fails the op for everyone involved) and keeps
 * serving: a bystander session opened before the bad act still runs collectives
 * after it, and a new client can still connect.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"
#include "ring.h"
#include "wire.h"

static const char *const GROUPS = "groups:\n"
                                  "  - name: solo\n"
                                  "    backend: host\n"
                                  "  - name: pair\n"
                                  "    backend: host\n"
                                  "    local_slots: 2\n"
                                  "    timeouts: {op_ms: 500}\n";

struct fixture {
    struct agent a;
    coll_conn *keep;
    coll_group *kg;
    coll_buffer *kb;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    if (agent_start(&f->a, "  handshake_timeout_ms: 300\n", GROUPS) != 0) return -1;
    if (coll_connect(&f->keep, f->a.sock, 5000) || coll_group_open(&f->kg, f->keep, "solo", 0) ||
        coll_mem_alloc(&f->kb, f->keep, 4096, COLL_DEVICE_HOST))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    coll_disconnect(&f->keep);
    int rc = f->a.pid ? agent_stop(&f->a) : 0;
    free(f);
    return rc == 0 ? 0 : -1;
}

/* The bystander session still works, and so does a brand-new client. */
static void assert_serving(struct fixture *f)
{
    int32_t *p = coll_mem_ptr(f->kb);
    for (int i = 0; i < 16; i++)
        p[i] = i;
    coll_request r;
    assert_int_equal(coll_allreduce(f->kg, p, p + 16, 16, COLL_INT32, COLL_SUM, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(f->keep, r, 5000), COLL_OK);
    for (int i = 0; i < 16; i++)
        assert_int_equal(p[16 + i], i);
    coll_conn *c;
    assert_int_equal(coll_connect(&c, f->a.sock, 5000), COLL_OK);
    coll_disconnect(&c);
}

/* ---- raw protocol client --------------------------------------------------------- */

static int raw_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void raw_send(int fd, const void *buf, size_t n, int pass_fd)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.b;
        mh.msg_controllen = sizeof(u.b);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    assert_int_equal(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)n);
}

/* Next message: 0 and *m, 1 on EOF, -1 on timeout. fds received are returned. */
static int raw_recv(int fd, union wire_msg *m, int *fds, int *nfds, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0) return -1;
    char buf[WIRE_MAX_MSG];
    union {
        char b[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
    ssize_t n = recvmsg(fd, &mh, 0);
    if (n <= 0) return 1;
    if (nfds) *nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < cnt; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + (size_t)i * sizeof(int), sizeof(int));
            if (fds && *nfds < 4)
                fds[(*nfds)++] = f;
            else
                close(f);
        }
    }
    char err[128];
    assert_int_equal(wire_decode(buf, (size_t)n, m, NULL, err, sizeof(err)), 0);
    return 0;
}

/* The agent answers with an ERROR of code (its text holding needle) and hangs up. */
static void expect_dropped(int fd, int code, const char *needle)
{
    union wire_msg m;
    int r = raw_recv(fd, &m, NULL, NULL, 3000);
    assert_int_equal(r, 0);
    assert_int_equal(m.h.type, WIRE_ERROR);
    assert_int_equal(m.error.code, code);
    if (needle && !strstr(m.error.msg, needle)) fail_msg("'%s' lacks '%s'", m.error.msg, needle);
    assert_int_equal(raw_recv(fd, &m, NULL, NULL, 3000), 1);
    close(fd);
}

/* Send m on fd and expect it refused, the session kept: WIRE_ERROR with code and a
 * reason that holds needle (case n of a table, for the failure's message). */
static void expect_refused(int fd, union wire_msg *m, int code, const char *needle, size_t n)
{
    raw_send(fd, m, m->h.len, -1);
    assert_int_equal(raw_recv(fd, m, NULL, NULL, 3000), 0);
    assert_int_equal(m->h.type, WIRE_ERROR);
    assert_int_equal(m->error.code, code);
    if (!strstr(m->error.msg, needle))
        fail_msg("case %zu: '%s' lacks '%s'", n, m->error.msg, needle);
}

struct raw {
    int fd, efd;
    struct wire_shm *shm;
};

static void raw_hello(struct raw *r, const char *sock)
{
    r->fd = raw_connect(sock);
    union wire_msg m;
    wire_init(&m, WIRE_HELLO, 1);
    snprintf(m.hello.client, sizeof(m.hello.client), "raw");
    raw_send(r->fd, &m, m.h.len, -1);
    int fds[4], n = 0;
    assert_int_equal(raw_recv(r->fd, &m, fds, &n, 3000), 0);
    assert_int_equal(m.h.type, WIRE_HELLO_OK);
    assert_int_equal(n, 3);
    r->shm = mmap(NULL, m.hello_ok.shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    assert_true(r->shm != MAP_FAILED);
    close(fds[0]);
    close(fds[2]);
    r->efd = fds[1];
}

static void raw_submit(struct raw *r, const struct wire_sqe *q, uint32_t seq)
{
    memcpy(&r->shm->sq[0], q, offsetof(struct wire_sqe, seq));
    atomic_store(&r->shm->sq[0].seq, seq);
    uint64_t one = 1;
    assert_int_equal(write(r->efd, &one, 8), 8);
}

/* ---- malformed socket traffic ----------------------------------------------------- */

static void garbage_message_is_dropped(void **state)
{
    struct fixture *f = *state;
    int fd = raw_connect(f->a.sock);
    char junk[40];
    for (int i = 0; i < 40; i++)
        junk[i] = (char)(i * 37 + 11);
    raw_send(fd, junk, sizeof(junk), -1);
    expect_dropped(fd, COLL_ERR_PROTOCOL, "magic");
    assert_true(agent_log_wait(&f->a, "session.protocol_error", 1, 2000));
    assert_serving(f);
}

static void truncated_message_is_dropped(void **state)
{
    struct fixture *f = *state;
    int fd = raw_connect(f->a.sock);
    union wire_msg m;
    wire_init(&m, WIRE_HELLO, 1);
    raw_send(fd, &m, 20, -1);
    expect_dropped(fd, COLL_ERR_PROTOCOL, "length");
    assert_serving(f);
}

static void oversized_message_is_dropped(void **state)
{
    struct fixture *f = *state;
    int fd = raw_connect(f->a.sock);
    char big[WIRE_MAX_MSG * 4];
    memset(big, 0, sizeof(big));
    union wire_msg m;
    wire_init(&m, WIRE_HELLO, 1);
    memcpy(big, &m, m.h.len);
    raw_send(fd, big, sizeof(big), -1);
    expect_dropped(fd, COLL_ERR_PROTOCOL, "larger");
    assert_serving(f);
}

static void other_protocol_version_is_rejected(void **state)
{
    struct fixture *f = *state;
    int fd = raw_connect(f->a.sock);
    union wire_msg m;
    wire_init(&m, WIRE_HELLO, 1);
    m.h.version = WIRE_VERSION + 1;
    raw_send(fd, &m, m.h.len, -1);
    char want[64];
    snprintf(want, sizeof(want), "protocol version %d is not supported", WIRE_VERSION + 1);
    expect_dropped(fd, COLL_ERR_PROTOCOL, want);
    snprintf(want, sizeof(want), "protocol version %d", WIRE_VERSION + 1);
    assert_true(agent_log_wait(&f->a, want, 1, 2000));
    assert_serving(f);
}

static void silent_client_times_out(void **state)
{
    struct fixture *f = *state;
    int fd = raw_connect(f->a.sock);
    expect_dropped(fd, COLL_ERR_TIMEOUT, "HELLO");
    assert_true(agent_log_wait(&f->a, "session.handshake_timeout", 1, 2000));
    assert_serving(f);
}

static void request_before_hello_is_dropped(void **state)
{
    struct fixture *f = *state;
    int fd = raw_connect(f->a.sock);
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_OPEN, 1);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "solo");
    raw_send(fd, &m, m.h.len, -1);
    expect_dropped(fd, COLL_ERR_PROTOCOL, "HELLO first");
    assert_serving(f);
}

static void stray_descriptor_is_dropped(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_OPEN, 2);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "solo");
    raw_send(r.fd, &m, m.h.len, r.efd);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "descriptors");
    assert_serving(f);
}

static void unsealed_memfd_is_refused(void **state)
{
    struct fixture *f = *state;
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    assert_int_equal(ftruncate(fd, 4096), 0);
    coll_buffer *b;
    assert_int_equal(coll_mem_register_fd(&b, f->keep, fd, 4096), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "F_SEAL_SHRINK"));
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), -1); /* not a sealable memfd */
    close(fd);
    fd = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, 4096), 0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    assert_int_equal(coll_mem_register_fd(&b, f->keep, fd, 4096), COLL_OK);
    assert_int_equal(coll_mem_release(&b), COLL_OK);
    close(fd);
    assert_serving(f); /* same connection kept working */
}

/* ---- malformed rings ------------------------------------------------------------------ */

static void bad_op_in_ring_is_dropped(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    struct wire_sqe q = {.kind = 99};
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "op kind 99");
    assert_serving(f);
}

static void unpublished_ring_entries_are_ignored(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    struct wire_sqe q = {.kind = 99};
    raw_submit(&r, &q, 1000); /* not entry 0's sequence number: not an op */
    union wire_msg m;
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 300), -1); /* no reply, not dropped */
    assert_int_equal(atomic_load(&r.shm->cq[0].seq), 0);
    assert_serving(f);
    raw_submit(&r, &q, 1); /* now published: a bad op */
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "op kind 99");
}

static void out_of_bounds_op_is_dropped(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_OPEN, 2);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "solo");
    m.group_open.slot = -1;
    raw_send(r.fd, &m, m.h.len, -1);
    /* solo's only slot is the bystander's: BUSY, and the session lives on */
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_ERROR);
    assert_int_equal(m.error.code, COLL_ERR_BUSY);
    /* an op timeout past a day: refused, the session lives on */
    wire_init(&m, WIRE_GROUP_OPEN, 3);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "pair");
    m.group_open.slot = -1;
    m.group_open.op_ms = 0xffffffffu;
    raw_send(r.fd, &m, m.h.len, -1);
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_ERROR);
    assert_int_equal(m.error.code, COLL_ERR_INVALID);
    assert_non_null(strstr(m.error.msg, "op timeout 4294967295 ms"));
    wire_init(&m, WIRE_GROUP_OPEN, 3);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "pair");
    m.group_open.slot = -1;
    raw_send(r.fd, &m, m.h.len, -1);
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_GROUP_OPEN_OK);
    uint32_t handle = m.group_open_ok.handle, epoch = m.group_open_ok.epoch;
    int mfd = memfd_create("b", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(mfd, 4096), 0);
    assert_int_equal(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    wire_init(&m, WIRE_MEM_REG, 4);
    m.mem_reg.size = 4096;
    m.mem_reg.device = -1;
    raw_send(r.fd, &m, m.h.len, mfd);
    close(mfd);
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_MEM_REG_OK);
    struct wire_sqe q = {.kind = WIRE_OP_ALLREDUCE,
                         .dtype = COLL_FLOAT32,
                         .count = 2000, /* 8000 bytes into a 4096-byte buffer */
                         .group = handle,
                         .epoch = epoch,
                         .send_buf = m.mem_reg_ok.buf_id,
                         .recv_buf = m.mem_reg_ok.buf_id};
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "exceeds buffer");
    assert_serving(f);
}

/* Open "pair" on a raw session: returns the handle, *epoch its epoch. */
static uint32_t raw_open_pair(struct raw *r, uint32_t *epoch)
{
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_OPEN, 3);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "pair");
    m.group_open.slot = -1;
    raw_send(r->fd, &m, m.h.len, -1);
    assert_int_equal(raw_recv(r->fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_GROUP_OPEN_OK);
    *epoch = m.group_open_ok.epoch;
    return m.group_open_ok.handle;
}

/* A forged GROUP_OPEN naming a rank (coll_group_opts.rank): a rank below -1, a rank
 * beside a slot, a rank past the group and a rank whose slot is taken are each refused
 * with a reason, the session lives on, and the rank it may take opens its slot. */
static void forged_rank_in_group_open_is_refused(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    static const struct {
        int32_t slot, rank;
        int code;
        const char *why;
    } bad[] = {
        {-1, -2, COLL_ERR_INVALID, "rank -2 (slot -1): group 'pair' has ranks 0..1"},
        {-1, INT32_MIN, COLL_ERR_INVALID, "rank -2147483648"},
        {0, 1, COLL_ERR_INVALID, "a rank excludes a slot"},
        {-1, 2, COLL_ERR_INVALID, "rank 2 (slot -1): group 'pair' has ranks 0..1"},
        {-1, INT32_MAX, COLL_ERR_INVALID, "rank 2147483647"},
        {-2, 0, COLL_ERR_INVALID, "slot -2: group 'pair' has slots 0..1"},
    };
    union wire_msg m;
    uint32_t id = 10;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        wire_init(&m, WIRE_GROUP_OPEN, id++);
        snprintf(m.group_open.name, sizeof(m.group_open.name), "pair");
        m.group_open.slot = bad[i].slot;
        m.group_open.rank = bad[i].rank;
        expect_refused(r.fd, &m, bad[i].code, bad[i].why, i);
    }
    for (int k = 0; k < 2; k++) { /* rank 1 opens slot 1; the second time it is taken */
        wire_init(&m, WIRE_GROUP_OPEN, id++);
        snprintf(m.group_open.name, sizeof(m.group_open.name), "pair");
        m.group_open.slot = -1;
        m.group_open.rank = 1;
        raw_send(r.fd, &m, m.h.len, -1);
        assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
        if (k == 0) {
            assert_int_equal(m.h.type, WIRE_GROUP_OPEN_OK);
            assert_int_equal(m.group_open_ok.rank, 1);
            assert_int_equal(m.group_open_ok.local_slot, 1);
        } else {
            assert_int_equal(m.h.type, WIRE_ERROR);
            assert_int_equal(m.error.code, COLL_ERR_BUSY);
            assert_non_null(strstr(m.error.msg, "slot is taken"));
        }
    }
    /* the other slot is still free for a client that asks for any */
    coll_conn *c;
    coll_group *g;
    assert_int_equal(coll_connect(&c, f->a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "pair", 0), COLL_OK);
    coll_group_info gi;
    assert_int_equal(coll_group_info_get(g, &gi), COLL_OK);
    assert_int_equal(gi.rank, 0);
    coll_disconnect(&c);
    close(r.fd);
    assert_serving(f);
}

/* Found on c65a60e: a GPU-flagged entry of a stale epoch was completed (done[idx]
 * written with the client's index) before its tag was checked: SIGSEGV of the agent. */
static void gpu_flag_on_host_agent_is_dropped(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    uint32_t epoch;
    uint32_t handle = raw_open_pair(&r, &epoch);
    struct wire_sqe q = {.kind = WIRE_OP_BARRIER,
                         .group = handle,
                         .epoch = epoch + 7, /* stale: used to complete at once */
                         .flags = WIRE_SQE_F_GPU,
                         .tag = 0x00000001fffffff0ull}; /* slot 2^32 - 17 */
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "GPU op");
    assert_true(agent_log_wait(&f->a, "GPU op for group 'pair'", 1, 2000));
    assert_serving(f);
}

/* A ring entry of kind, peer and flags on a session of its own is a violation: the client
 * is dropped saying why, and nothing completes. */
static void expect_entry_dropped_redop(struct fixture *f, uint8_t kind, int32_t peer, uint8_t flags,
                                       uint8_t redop, const char *why)
{
    struct raw r;
    raw_hello(&r, f->a.sock);
    uint32_t epoch;
    uint32_t handle = raw_open_pair(&r, &epoch);
    struct wire_sqe q = {.kind = kind,
                         .dtype = COLL_INT32,
                         .group = handle,
                         .epoch = epoch,
                         .peer = peer,
                         .flags = flags,
                         .redop = redop,
                         .tag = 1};
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, why);
    assert_int_equal(atomic_load(&r.shm->cq[0].seq), 0); /* nothing was completed */
    close(r.efd);
}

static void expect_entry_dropped(struct fixture *f, uint8_t kind, int32_t peer, uint8_t flags,
                                 const char *why)
{
    expect_entry_dropped_redop(f, kind, peer, flags, 0, why);
}

/* A flag on the wrong op is a violation: MORE (one NCCL group goes on) belongs to a GPU
 * send or receive alone, NOACK (no word back) to a host send alone, SIG to a host send or
 * receive whose signature names a collective. The client is dropped, nothing completes,
 * and the agent serves everyone else on. */
static void flags_on_the_wrong_op_are_dropped(void **state)
{
    struct fixture *f = *state;
    expect_entry_dropped(f, WIRE_OP_SEND, 1, WIRE_SQE_F_MORE, "flag MORE on a host send");
    assert_serving(f);
    expect_entry_dropped(f, WIRE_OP_RECV, 1, WIRE_SQE_F_NOACK, "flag NOACK on a recv");
    assert_serving(f);
    /* SIG (the collective a send or receive is part of): on a host send or receive,
     * naming a collective */
    expect_entry_dropped(f, WIRE_OP_ALLREDUCE, 1, WIRE_SQE_F_SIG, "flag SIG on a allreduce");
    assert_serving(f);
    expect_entry_dropped_redop(f, WIRE_OP_SEND, 1, WIRE_SQE_F_SIG, WIRE_SIG(WIRE_OP_RECV, 0),
                               "names no op");
    assert_serving(f);
    expect_entry_dropped_redop(f, WIRE_OP_RECV, 1, WIRE_SQE_F_SIG, 0xff, "names no op");
    assert_serving(f);
}

/* A premultiplied sum's slot (WIRE_REDOP_SET) is checked whole before it is stored: a
 * closed handle, a slot past the table, bool, complex, a dtype past the end, bits past
 * the dtype's bytes and a slot set twice are each refused with why, and the session
 * lives on. A ring entry that names a slot set for another dtype, or never set, or a
 * premultiplied sum on an op that does not reduce, is a violation: the client is
 * dropped, nothing completes, the agent serves on. */
static void forged_premultiplied_sums_are_refused(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    uint32_t epoch;
    uint32_t handle = raw_open_pair(&r, &epoch);
    static const struct {
        uint32_t handle_delta, slot, dtype;
        uint64_t scalar;
        const char *why;
    } bad[] = {
        {9, 0, COLL_INT32, 1, "no open group with handle"},
        {0, WIRE_PREMUL_SLOTS, COLL_INT32, 1, "premultiplied sum slot 128 of 128"},
        {0, 0, COLL_BOOL, 1, "a premultiplied sum of dtype 12"},
        {0, 0, COLL_COMPLEX64, 1, "a premultiplied sum of dtype 15"},
        {0, 0, 200, 1, "a premultiplied sum of dtype 200"},
        {0, 0, COLL_INT16, 0x10000, "bits past its 2-byte dtype"},
        {0, 3, COLL_FLOAT32, 0x40000000, NULL}, /* set: 2.0f */
        {0, 3, COLL_FLOAT32, 0x40000000, "slot 3 is set"},
    };
    union wire_msg m;
    uint32_t id = 40;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        wire_init(&m, WIRE_REDOP_SET, id++);
        m.redop_set.handle = handle + bad[i].handle_delta;
        m.redop_set.slot = bad[i].slot;
        m.redop_set.dtype = bad[i].dtype;
        m.redop_set.scalar = bad[i].scalar;
        if (bad[i].why) {
            expect_refused(r.fd, &m, COLL_ERR_INVALID, bad[i].why, i);
            continue;
        }
        raw_send(r.fd, &m, m.h.len, -1);
        assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
        assert_int_equal(m.h.type, WIRE_REDOP_SET_OK);
    }
    /* slot 3 holds a float32 scalar: an int32 op naming it is forged */
    struct wire_sqe q = {.kind = WIRE_OP_ALLREDUCE,
                         .dtype = COLL_INT32,
                         .redop = WIRE_REDOP_PREMUL + 3,
                         .group = handle,
                         .epoch = epoch,
                         .tag = 1};
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "premultiplied sum 3, made for another dtype");
    assert_int_equal(atomic_load(&r.shm->cq[0].seq), 0);
    /* a slot never set */
    raw_hello(&r, f->a.sock);
    handle = raw_open_pair(&r, &epoch);
    q.group = handle;
    q.epoch = epoch;
    q.dtype = COLL_FLOAT32;
    q.redop = WIRE_REDOP_PREMUL + 5;
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "premultiplied sum 5, never set");
    assert_int_equal(atomic_load(&r.shm->cq[0].seq), 0);
    /* on a broadcast, a premultiplied sum is no reduction at all */
    raw_hello(&r, f->a.sock);
    handle = raw_open_pair(&r, &epoch);
    q.group = handle;
    q.epoch = epoch;
    q.kind = WIRE_OP_BROADCAST;
    q.redop = WIRE_REDOP_PREMUL;
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "reduction 128 out of range");
    assert_serving(f);
}

/* Every field is checked before anything happens: a wild tag on a stale-epoch op
 * of a host group is still a violation, not a completion. */
static void stale_epoch_op_is_validated_first(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    uint32_t epoch;
    uint32_t handle = raw_open_pair(&r, &epoch);
    struct wire_sqe q = {.kind = WIRE_OP_BROADCAST,
                         .dtype = COLL_INT32,
                         .count = 4,
                         .group = handle,
                         .epoch = epoch + 1,
                         .peer = 1000, /* no such rank */
                         .tag = 1};
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "names rank 1000");
    assert_int_equal(atomic_load(&r.shm->cq[0].seq), 0); /* nothing was completed */
    assert_serving(f);
}

/* Only a receive may be from any rank: a send, broadcast or reduce naming rank -1
 * (WIRE_ANY_SOURCE) or a receive naming -2 is a violation; nothing completes. */
static void any_rank_only_on_a_receive(void **state)
{
    struct fixture *f = *state;
    const struct {
        uint8_t kind;
        int32_t peer;
        const char *why;
    } cases[] = {{WIRE_OP_SEND, WIRE_ANY_SOURCE, "send names rank -1"},
                 {WIRE_OP_BROADCAST, WIRE_ANY_SOURCE, "broadcast names rank -1"},
                 {WIRE_OP_REDUCE, WIRE_ANY_SOURCE, "reduce names rank -1"},
                 {WIRE_OP_RECV, -2, "recv names rank -2"}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
        expect_entry_dropped(f, cases[k].kind, cases[k].peer, 0, cases[k].why);
    assert_serving(f);
}

/* ---- a hostile client: random entries and messages against the live agent ----------- */

static uint64_t rnd(uint64_t *st)
{
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return *st;
}

/* Share a 4 KiB sealed memfd on a raw session; returns its buffer id. */
static uint32_t raw_share(struct raw *r)
{
    int mfd = memfd_create("b", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(mfd, 4096), 0);
    assert_int_equal(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 4);
    m.mem_reg.size = 4096;
    m.mem_reg.device = -1;
    raw_send(r->fd, &m, m.h.len, mfd);
    close(mfd);
    assert_int_equal(raw_recv(r->fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_MEM_REG_OK);
    return m.mem_reg_ok.buf_id;
}

/* A raw client of "pair" submits an allreduce of count floats from send_off to recv_off
 * of one buffer; the agent must drop it, saying want, and serve everyone else. */
static void bad_ranges_are_dropped(struct fixture *f, uint64_t count, uint64_t send_off,
                                   uint64_t recv_off, const char *want)
{
    struct raw r;
    raw_hello(&r, f->a.sock);
    uint32_t epoch;
    uint32_t handle = raw_open_pair(&r, &epoch);
    uint32_t buf = raw_share(&r);
    struct wire_sqe q = {.kind = WIRE_OP_ALLREDUCE,
                         .dtype = COLL_FLOAT32,
                         .redop = COLL_SUM,
                         .count = count,
                         .group = handle,
                         .epoch = epoch,
                         .send_buf = buf,
                         .recv_buf = buf,
                         .send_off = send_off,
                         .recv_off = recv_off};
    raw_submit(&r, &q, 1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, want);
    assert_serving(f);
}

/* Found at 242e584: a send or receive offset that was not a multiple of the element size
 * reached the reductions as a misaligned float pointer (undefined behaviour). libcoll
 * refuses such a pointer (test_ops); a client that writes one into the ring anyway is
 * dropped, saying why, and everyone else is served. */
static void misaligned_offset_is_dropped(void **state)
{
    /* inside the buffer, half a float in */
    bad_ranges_are_dropped(*state, 16, 2, 512, "not aligned to its 4-byte elements");
}

/* A send range that overlaps the receive range without being in place: the agent's
 * copies would read what they write (memcpy with overlap, undefined). libcoll refuses it
 * (test_ops); written into the ring anyway, it drops the session. */
static void overlapping_ranges_are_dropped(void **state)
{
    /* 256 bytes each, half of them shared */
    bad_ranges_are_dropped(*state, 64, 0, 128, "overlap, and not in place");
}

/* Ring entries half random, half plausible (right handle, epoch or buffer, small counts)
 * so that they reach past the first checks: under ASan every one ends in a completion,
 * a refusal or a dropped session, never a fault, and the bystander is served after. */
static void random_ring_entries_never_hurt_the_agent(void **state)
{
    struct fixture *f = *state;
    uint64_t st = 0x9e3779b97f4a7c15ull;
    int dropped = 0, completed = 0;
    for (int i = 0; i < 300; i++) {
        struct raw r;
        raw_hello(&r, f->a.sock);
        uint32_t epoch;
        uint32_t handle = raw_open_pair(&r, &epoch);
        uint32_t buf = raw_share(&r);
        struct wire_sqe q;
        uint64_t words[8];
        for (int k = 0; k < 8; k++)
            words[k] = rnd(&st);
        memcpy(&q, words, offsetof(struct wire_sqe, seq));
        if (i % 2 == 0) { /* plausible: each field wrong one time in eight */
#define BAD (rnd(&st) % 8 == 0)
            q.kind = (uint8_t)(BAD ? rnd(&st) : rnd(&st) % WIRE_OP_KIND_COUNT);
            q.dtype = (uint8_t)(BAD ? rnd(&st) : rnd(&st) % COLL_DTYPE_COUNT);
            q.redop = (uint8_t)(BAD ? rnd(&st) : rnd(&st) % COLL_REDOP_COUNT);
            q.flags = (uint8_t)(BAD ? rnd(&st) % 4 : 0);
            q.p2p_tag = BAD ? (uint32_t)rnd(&st) : 0;
            q.group = BAD ? (uint32_t)rnd(&st) : handle;
            q.epoch = BAD ? epoch + (uint32_t)(rnd(&st) % 3) - 1 : epoch;
            q.send_buf = BAD ? (uint32_t)(rnd(&st) % 3) : buf;
            q.recv_buf = BAD ? (uint32_t)(rnd(&st) % 3) : buf;
            q.count = BAD ? rnd(&st) : rnd(&st) % 600;
            if (q.kind == WIRE_OP_BARRIER && !BAD) q.count = 0;
            q.send_off = BAD ? rnd(&st) : rnd(&st) % 256 * 8; /* aligned for every type */
            q.recv_off = BAD ? rnd(&st) : q.send_off; /* in place: ranges may not overlap else */
            q.peer = BAD ? (int32_t)rnd(&st) : (int32_t)(rnd(&st) % 2);
            q.tag = BAD ? rnd(&st) : 1 + rnd(&st) % 256;
#undef BAD
        }
        raw_submit(&r, &q, 1);
        union wire_msg m;
        for (int t = 0; t < 40; t++) {
            if (atomic_load(&r.shm->cq[0].seq) == 1) {
                completed++;
                break;
            }
            struct pollfd p = {.fd = r.fd, .events = POLLIN};
            if (poll(&p, 1, 5) == 1) {
                if (raw_recv(r.fd, &m, NULL, NULL, 100) == 0) dropped += m.h.type == WIRE_ERROR;
                break;
            }
        }
        munmap(r.shm, sizeof(struct wire_shm));
        close(r.efd);
        close(r.fd);
    }
    int waiting = 300 - dropped - completed; /* taken, waiting for the pair's other slot */
    print_message("300 entries: %d sessions dropped, %d completed, %d taken and waiting\n", dropped,
                  completed, waiting);
    assert_true(dropped > 50);
    assert_true(completed + waiting > 30); /* some got past every check */
    assert_int_equal(kill(f->a.pid, 0), 0);
    assert_serving(f);
}

/* Control messages: random lengths and bytes, some with a valid header in front. */
static void random_messages_never_hurt_the_agent(void **state)
{
    struct fixture *f = *state;
    uint64_t st = 0x1234567887654321ull;
    for (int i = 0; i < 300; i++) {
        int fd = raw_connect(f->a.sock);
        char buf[WIRE_MAX_MSG];
        size_t n = 1 + rnd(&st) % sizeof(buf);
        for (size_t k = 0; k < n; k++)
            buf[k] = (char)rnd(&st);
        if (i % 2 == 0 && n >= sizeof(struct wire_hdr)) {
            union wire_msg m;
            unsigned t = 1 + (unsigned)(rnd(&st) % (WIRE_TYPE_END + 1));
            wire_init(&m, (enum wire_type)(i % 4 ? WIRE_HELLO : t), 1);
            if (rnd(&st) % 2) m.h.len = (uint32_t)n;
            memcpy(buf, &m, sizeof(m.h));
            if (i % 4 == 0 && wire_size(t) && wire_size(t) <= sizeof(buf)) n = wire_size(t);
        }
        raw_send(fd, buf, n, -1);
        union wire_msg m;
        raw_recv(fd, &m, NULL, NULL, 200); /* a reply, a refusal or nothing */
        close(fd);
    }
    assert_int_equal(kill(f->a.pid, 0), 0);
    assert_serving(f);
}

/* ---- participants that fail ------------------------------------------------------------ */

/* A new client holding a slot of "pair" and a 4 KiB buffer. */
static void join_pair(struct fixture *f, coll_conn **c, coll_group **g, coll_buffer **b)
{
    assert_int_equal(coll_connect(c, f->a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(g, *c, "pair", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_mem_alloc(b, *c, 4096, COLL_DEVICE_HOST), COLL_OK);
}

struct partner {
    const char *sock;
    int ready_fd;
    int submit; /* submit an allreduce before announcing readiness */
    int count;
};

/* Opens pair, optionally submits, says ready, then waits to be killed or for its op. */
static int partner_main(void *arg)
{
    struct partner *p = arg;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    if (coll_connect(&c, p->sock, 5000) || coll_group_open(&g, c, "pair", COLL_SLOT_ANY) ||
        coll_mem_alloc(&b, c, 4096, COLL_DEVICE_HOST))
        return 10;
    float *x = coll_mem_ptr(b);
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f;
    coll_request r;
    int rc = 0;
    if (p->submit &&
        coll_allreduce(g, x, x + 64, (size_t)p->count, COLL_FLOAT32, COLL_SUM, NULL, &r))
        return 11;
    char one = 1;
    if (write(p->ready_fd, &one, 1) != 1) return 12;
    if (p->submit) {
        coll_err e = coll_wait(c, r, 10000);
        rc = e == COLL_OK ? 0 : 20 + (int)e;
    } else {
        pause();
    }
    coll_disconnect(&c);
    return rc;
}

static pid_t start_partner(struct partner *p, const char *sock, int submit, int count)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    *p = (struct partner){.sock = sock, .ready_fd = fds[1], .submit = submit, .count = count};
    pid_t pid = child_run(partner_main, p);
    close(fds[1]);
    char c;
    struct pollfd pf = {.fd = fds[0], .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 5000), 1);
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    return pid;
}

static void client_killed_mid_op_fails_partner_promptly(void **state)
{
    struct fixture *f = *state;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    join_pair(f, &c, &g, &b);
    float *x = coll_mem_ptr(b);
    struct partner p;
    pid_t pid = start_partner(&p, f->a.sock, 0, 0);
    coll_request r;
    assert_int_equal(coll_allreduce(g, x, x + 64, 64, COLL_FLOAT32, COLL_SUM, NULL, &r), COLL_OK);
    kill(pid, SIGKILL);
    child_wait(pid, 5000);
    /* PEER_LOST (or EPOCH, when the agent saw the hang-up before it took our op from the
     * ring), never TIMEOUT: the agent noticed the hang-up, not the deadline */
    coll_err e = coll_wait(c, r, 5000);
    if (e != COLL_ERR_PEER_LOST && e != COLL_ERR_EPOCH) fail_msg("got %s", coll_strerror(e));
    assert_true(coll_err_retryable(e));
    assert_true(agent_log_wait(&f->a, "a participant left", 1, 2000));
    assert_int_equal(coll_allreduce(g, x, x + 64, 64, COLL_FLOAT32, COLL_SUM, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 5000), COLL_ERR_EPOCH);
    /* reopen and run with a new partner */
    coll_group_close(&g);
    assert_int_equal(coll_group_open(&g, c, "pair", COLL_SLOT_ANY), COLL_OK);
    coll_group_info info;
    coll_group_info_get(g, &info);
    assert_true(info.epoch >= 2);
    for (int i = 0; i < 64; i++)
        x[i] = 2.0f;
    pid = start_partner(&p, f->a.sock, 1, 64);
    assert_int_equal(coll_allreduce(g, x, x + 64, 64, COLL_FLOAT32, COLL_SUM, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 5000), COLL_OK);
    assert_true(x[64] == 3.0f && x[127] == 3.0f);
    assert_int_equal(child_wait(pid, 5000), 0);
    coll_disconnect(&c);
    assert_serving(f);
}

static void client_killed_with_op_in_flight(void **state)
{
    struct fixture *f = *state;
    struct partner p;
    pid_t pid = start_partner(&p, f->a.sock, 1, 64); /* its op waits for a partner */
    kill(pid, SIGKILL);
    assert_int_equal(child_wait(pid, 5000), 128 + SIGKILL);
    assert_true(agent_log_wait(&f->a, "session.closed", 1, 3000));
    assert_true(agent_log_wait(&f->a, "failed_ops=1", 1, 3000));
    assert_serving(f);
}

static void disagreement_is_an_error_for_everyone(void **state)
{
    struct fixture *f = *state;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    join_pair(f, &c, &g, &b);
    float *x = coll_mem_ptr(b);
    struct partner p;
    pid_t pid = start_partner(&p, f->a.sock, 1, 5); /* count 5 against our 4 */
    coll_request r;
    assert_int_equal(coll_allreduce(g, x, x + 64, 4, COLL_FLOAT32, COLL_SUM, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 5000), COLL_ERR_MISMATCH);
    /* the application is told what each side submitted */
    const char *why = coll_last_error();
    if (!strstr(why, "count=4") || !strstr(why, "count=5")) fail_msg("error: %s", why);
    assert_int_equal(child_wait(pid, 5000), 20 + COLL_ERR_MISMATCH);
    assert_true(agent_log_wait(&f->a, "group.mismatch", 1, 2000));
    coll_disconnect(&c);
    assert_serving(f);
}

static void lone_participant_times_out_then_reopens(void **state)
{
    struct fixture *f = *state;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    join_pair(f, &c, &g, &b);
    float *x = coll_mem_ptr(b);
    coll_request r;
    assert_int_equal(coll_allreduce(g, x, x + 64, 4, COLL_FLOAT32, COLL_SUM, NULL, &r), COLL_OK);
    /* the buffer cannot go while the op that uses it is in flight */
    assert_int_equal(coll_mem_release(&b), COLL_ERR_BUSY);
    assert_non_null(b);
    assert_int_equal(coll_wait(c, r, 5000), COLL_ERR_TIMEOUT);
    assert_true(agent_log_wait(&f->a, "waited 500 ms", 1, 2000));
    assert_int_equal(coll_barrier(g, NULL, &r), COLL_OK);
    assert_int_equal(coll_wait(c, r, 5000), COLL_ERR_EPOCH);
    assert_int_equal(coll_mem_release(&b), COLL_OK);
    assert_null(b);
    coll_disconnect(&c);
    assert_serving(f);
}

static void in_flight_limit_is_reported(void **state)
{
    struct fixture *f = *state;
    coll_conn *c;
    coll_group *g;
    assert_int_equal(coll_connect(&c, f->a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "pair", COLL_SLOT_ANY), COLL_OK);
    coll_request r[WIRE_RING_ENTRIES];
    for (int i = 0; i < WIRE_RING_ENTRIES; i++)
        assert_int_equal(coll_barrier(g, NULL, &r[i]), COLL_OK);
    coll_request extra;
    assert_int_equal(coll_barrier(g, NULL, &extra), COLL_ERR_LIMIT);
    assert_int_equal(coll_wait_all(c, r, WIRE_RING_ENTRIES, 5000), COLL_ERR_TIMEOUT);
    coll_disconnect(&c);
    assert_serving(f);
}

static void lookups_fail_cleanly(void **state)
{
    struct fixture *f = *state;
    coll_conn *c;
    coll_group *g, *g2;
    assert_int_equal(coll_connect(&c, f->a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "nope", COLL_SLOT_ANY), COLL_ERR_NOT_FOUND);
    assert_non_null(strstr(coll_last_error(), "nope"));
    assert_int_equal(coll_group_open(&g, c, "pair", 7), COLL_ERR_INVALID);
    assert_int_equal(coll_group_open(&g, c, "pair", 1), COLL_OK);
    assert_int_equal(coll_group_open(&g2, c, "pair", 1), COLL_ERR_BUSY);
    coll_group_info info;
    assert_int_equal(coll_group_info_get(g, &info), COLL_OK);
    assert_int_equal(info.rank, 1);
    assert_int_equal(info.size, 2);
    assert_string_equal(info.backend, "host");
    coll_request r;
    assert_int_equal(coll_allreduce(g, (void *)16, (void *)32, 4, COLL_FLOAT32, COLL_SUM, NULL, &r),
                     COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "not inside a buffer"));
    assert_int_equal(coll_broadcast(g, NULL, NULL, 0, COLL_FLOAT32, 2, NULL, &r), COLL_ERR_INVALID);
    assert_int_equal(coll_allreduce(g, NULL, NULL, 0, 99, COLL_SUM, NULL, &r), COLL_ERR_INVALID);
    /* found on c65a60e: narrowed to 8 bits first, 264 was taken as float32 (8) */
    assert_int_equal(coll_allreduce(g, NULL, NULL, 0, (coll_dtype)264, COLL_SUM, NULL, &r),
                     COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "dtype 264"));
    assert_int_equal(coll_allreduce(g, NULL, NULL, 0, COLL_FLOAT32, (coll_redop)256, NULL, &r),
                     COLL_ERR_INVALID);
    assert_int_equal(coll_mem_alloc(NULL, c, 16, COLL_DEVICE_HOST), COLL_ERR_INVALID);
    coll_buffer *b;
    /* found on c65a60e: SYSTEM, which coll.h does not list */
    assert_int_equal(coll_mem_alloc(&b, c, (size_t)1 << 62, COLL_DEVICE_HOST), COLL_ERR_INVALID);
    assert_non_null(strstr(coll_last_error(), "exceeds"));
    assert_int_equal(coll_mem_alloc(&b, c, 16, 0), COLL_ERR_UNSUPPORTED);
    coll_disconnect(&c);
    assert_serving(f);
}

/* libcoll checks who serves the socket (SO_PEERCRED) before it sends anything: found
 * on c65a60e, whoever bound the default path first was "the agent". */
static void agent_of_another_uid_is_refused(void **state)
{
    struct fixture *f = *state;
    (void)f;
    if (geteuid() != 0) {
        print_message("skipped: needs root to listen as another uid\n");
        skip();
    }
    char path[108];
    tmp_path(path, sizeof(path), "impostor", 0);
    unlink(path);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) { /* an impostor: listens as nobody, never answers */
        if (setgid(65534) || setuid(65534)) _exit(1);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 4)) _exit(2);
        chmod(path, 0666);
        if (write(ready[1], "x", 1) != 1) _exit(3);
        pause();
        _exit(0);
    }
    char x;
    assert_int_equal(read(ready[0], &x, 1), 1);
    coll_conn *c = NULL;
    assert_int_equal(coll_connect(&c, path, 2000), COLL_ERR_CONNECT);
    assert_null(c);
    assert_non_null(strstr(coll_last_error(), "served by uid 65534"));
    /* named by the application: trusted, and then it times out (it never answers) */
    setenv("COLL_AGENT_UIDS", "1234,65534", 1);
    assert_int_equal(coll_connect(&c, path, 300), COLL_ERR_TIMEOUT);
    unsetenv("COLL_AGENT_UIDS");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(path);
    close(ready[0]);
    close(ready[1]);
}

static void denied_uid_is_refused(void **state)
{
    struct fixture *f = *state;
    if (geteuid() != 0) {
        print_message("skipped: needs root to connect as another uid\n");
        skip();
    }
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) || setuid(65534)) _exit(1);
        coll_conn *c;
        coll_err e = coll_connect(&c, f->a.sock, 5000);
        _exit(e == COLL_ERR_DENIED && strstr(coll_last_error(), "uid 65534") ? 0 : 2);
    }
    assert_int_equal(child_wait(pid, 10000), 0);
    assert_true(agent_log_wait(&f->a, "session.denied", 1, 2000));
    assert_serving(f);
}

/* Found on c65a60e: 20 refused connections of another uid held max_sessions (8) slots
 * while they lingered, and root's own client failed with LIMIT. Refused clients are
 * outside the budget; 2000 bad requests give at most a few dozen log lines. */
static void refusals_neither_lock_out_nor_flood_the_log(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("skipped: needs root to connect as another uid\n");
        skip();
    }
    struct agent a;
    assert_int_equal(agent_start(&a, "  max_sessions: 8\n  handshake_timeout_ms: 20000\n", GROUPS),
                     0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) || setuid(65534)) _exit(1);
        int fds[20];
        for (int i = 0; i < 20; i++)
            fds[i] = raw_connect(a.sock); /* refused (uid), kept open: they linger */
        if (write(ready[1], "x", 1) != 1) _exit(3);
        pause();
        (void)fds;
        _exit(0);
    }
    char x;
    assert_int_equal(read(ready[0], &x, 1), 1);
    assert_true(agent_log_wait(&a, "session.denied", 1, 3000));
    coll_conn *c[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(coll_connect(&c[i], a.sock, 5000), COLL_OK);
    /* a client that sends 2000 bad requests, each one refused */
    coll_group *g;
    for (int i = 0; i < 2000; i++)
        assert_int_equal(coll_group_open(&g, c[0], "nope", COLL_SLOT_ANY), COLL_ERR_NOT_FOUND);
    for (int i = 0; i < 4; i++)
        coll_disconnect(&c[i]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int lines = agent_log_count(&a, "session.refuse");
    if (lines > 100) fail_msg("2000 refusals wrote %d log lines", lines);
    assert_true(lines >= 1);
    assert_int_equal(agent_stop(&a), 0);
    close(ready[0]);
    close(ready[1]);
}

static void agent_death_is_noticed(void **state)
{
    struct fixture *f = *state;
    coll_conn *c;
    coll_group *g;
    assert_int_equal(coll_connect(&c, f->a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "pair", COLL_SLOT_ANY), COLL_OK);
    coll_request r;
    assert_int_equal(coll_barrier(g, NULL, &r), COLL_OK);
    kill(f->a.pid, SIGKILL);
    child_wait(f->a.pid, 5000);
    f->a.pid = 0;
    double t0 = now_ms();
    assert_int_equal(coll_wait(c, r, 10000), COLL_ERR_AGENT_LOST);
    assert_true(now_ms() - t0 < 5000);
    assert_int_equal(coll_barrier(g, NULL, &r), COLL_ERR_AGENT_LOST);
    coll_disconnect(&c);
}

/* The first SIGTERM drains (the barrier, waiting for a partner that never comes, stays
 * in flight; new sessions are refused); a second one stops at once: the op fails with
 * SHUTDOWN, the agent exits 0 and removes its socket. */
static void sigterm_fails_ops_with_shutdown(void **state)
{
    struct fixture *f = *state;
    coll_conn *c, *c2;
    coll_group *g;
    assert_int_equal(coll_connect(&c, f->a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "pair", COLL_SLOT_ANY), COLL_OK);
    coll_request r;
    assert_int_equal(coll_barrier(g, NULL, &r), COLL_OK);
    kill(f->a.pid, SIGTERM);
    assert_true(agent_log_wait(&f->a, "action=drain ops_in_flight=1", 1, 5000));
    assert_int_equal(coll_connect(&c2, f->a.sock, 5000), COLL_ERR_SHUTDOWN);
    int done = 1;
    assert_int_equal(coll_test(c, r, &done), COLL_OK);
    assert_int_equal(done, 0); /* still in flight while draining */
    kill(f->a.pid, SIGTERM);
    assert_int_equal(child_wait(f->a.pid, 10000), 0);
    f->a.pid = 0;
    assert_int_equal(coll_wait(c, r, 10000), COLL_ERR_SHUTDOWN);
    struct stat st;
    assert_int_equal(stat(f->a.sock, &st), -1); /* socket removed */
    coll_disconnect(&c);
}

/* GROUP_STATE (coll_group_wait's request) is a client message like any: a handle that is
 * not open is refused and the session stays; a truncated one ends the session only. */
static void group_state_requests_are_checked(void **state)
{
    struct fixture *f = *state;
    struct raw r;
    raw_hello(&r, f->a.sock);
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_STATE, 7);
    m.group_state.handle = 9999;
    raw_send(r.fd, &m, m.h.len, -1);
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_ERROR);
    assert_int_equal(m.error.code, COLL_ERR_INVALID);
    assert_non_null(strstr(m.error.msg, "no open group with handle 9999"));
    wire_init(&m, WIRE_GROUP_STATE, 8);
    m.group_state.handle = 0;
    raw_send(r.fd, &m, sizeof(struct wire_hdr) + 2, -1); /* cut short */
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, NULL);
    close(r.efd);
    munmap(r.shm, sizeof(*r.shm));
    assert_serving(f);
}

/* ---- the CPU a client says it runs on -------------------------------------------- */

#define HINT_OPS 600

/* HINT_OPS 8-byte allreduces of c, each checked. */
static void ops_of_a_client(coll_conn *c, coll_group *g, float *x)
{
    for (int i = 0; i < HINT_OPS; i++) {
        x[0] = (float)i;
        x[1] = 2.0f;
        coll_request r;
        assert_int_equal(coll_allreduce(g, x, x + 2, 2, COLL_FLOAT32, COLL_SUM, NULL, &r), COLL_OK);
        assert_int_equal(coll_wait(c, r, 10000), COLL_OK);
        assert_true(x[2] == (float)i && x[3] == 2.0f);
    }
}

/* The CPU a client says it runs on (wire.h: the sleeping word's cpu) is a hint the agent
 * reads from shared memory the client writes. A client that claims to run elsewhere, or
 * writes values no CPU has, must not make an agent bound to one CPU spin against an
 * honest client on that CPU (which it would hold off), nor hurt the agent: no wait
 * of its engine ends in a spin, and it serves everyone. */
static void a_client_s_false_cpu_never_makes_the_agent_spin_against_others(void **state)
{
    (void)state;
    cpu_set_t old;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    int cpu = 0;
    while (!CPU_ISSET(cpu, &old))
        cpu++;
    assert_int_equal(pin_to_cpu(cpu), 0); /* the agent and the honest client share it */
    struct agent a;
    assert_int_equal(agent_start(&a, "  spin_us: 2000\n", "groups:\n  - name: g\n"), 0);
    struct raw liar;
    raw_hello(&liar, a.sock);
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    assert_int_equal(coll_connect(&c, a.sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g, c, "g", 0), COLL_OK);
    assert_int_equal(coll_mem_alloc(&b, c, 64, COLL_DEVICE_HOST), COLL_OK);
    float *x = coll_mem_ptr(b);
    /* elsewhere (the next CPU up), then values no CPU has: all ones, past any mask, the
     * sign bit, past INT32_MAX by one */
    const uint32_t lies[] = {(uint32_t)cpu + 2, 0xffffffffu, (uint32_t)CPU_SETSIZE + 1, 0x80000000u,
                             0x80000001u};
    ops_of_a_client(c, g, x); /* warm up */
    for (size_t k = 0; k < sizeof(lies) / sizeof(lies[0]); k++) {
        atomic_store(&liar.shm->client_sleeping.cpu, lies[k]);
        ops_of_a_client(c, g, x);
    }
    assert_int_equal(agent_log_count(&a, "protocol_error"), 0);
    coll_mem_release(&b);
    coll_group_close(&g);
    coll_disconnect(&c);
    close(liar.fd);
    close(liar.efd);
    munmap(liar.shm, sizeof(*liar.shm));
    assert_int_equal(agent_stop(&a), 0);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
    /* not one wait a spin ended, whatever the liar said: its sleeps would not say it
     * (where the woken client preempts the agent, the next op is there when it runs
     * again: 286 sleeps in 600 ops under ASan, with no spin) */
    long spun = agent_log_number(&a, "agent.stopped", "spun");
    if (spun != 0)
        fail_msg("the agent spun for %ld of %d ops of a client on its CPU while another lied "
                 "about its CPU",
                 spun, 6 * HINT_OPS);
}

/* ---- a client that holds its group's connections (direct ops) ---------------------- */

static int start_duo_with(struct agent *a, int port, int index, const char *extra)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "node:\n  index: %d\n  name: pod-%d\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "groups:\n  - name: duo\n    backend: host\n    members: 2\n"
             "    timeouts: {op_ms: 5000, heartbeat_ms: 250, join_ms: 5000}\n"
             "  - name: solo\n    backend: host\n%s",
             index, index, port, extra);
    return agent_start(a, "  direct_ops: true\n", body);
}

static int start_duo(struct agent *a, int port, int index)
{
    return start_duo_with(a, port, index, "");
}

static void raw_request(struct raw *r, union wire_msg *m, union wire_msg *reply, int *fds,
                        int *nfds)
{
    raw_send(r->fd, m, m->h.len, -1);
    assert_int_equal(raw_recv(r->fd, reply, fds, nfds, 5000), 0);
}

static uint32_t raw_open(struct raw *r, const char *name, uint32_t *epoch)
{
    union wire_msg m, q;
    wire_init(&m, WIRE_GROUP_OPEN, 3);
    snprintf(m.group_open.name, sizeof(m.group_open.name), "%s", name);
    m.group_open.slot = -1;
    raw_request(r, &m, &q, NULL, NULL);
    assert_int_equal(q.h.type, WIRE_GROUP_OPEN_OK);
    *epoch = q.group_open_ok.epoch;
    return q.group_open_ok.handle;
}

/* Ask for handle's connections until the agent lends them (the group forms first). */
static void raw_lease(struct raw *r, uint32_t handle, union wire_msg *ok, int *fds)
{
    double until = now_ms() + 10000;
    for (;;) {
        union wire_msg m;
        wire_init(&m, WIRE_LEASE, 4);
        m.lease.handle = handle;
        int nfds = 0;
        raw_request(r, &m, ok, fds, &nfds);
        if (ok->h.type == WIRE_LEASE_OK) {
            assert_int_equal(nfds, 2);
            return;
        }
        assert_int_equal(ok->h.type, WIRE_ERROR);
        assert_int_equal(ok->error.code, COLL_ERR_BUSY); /* not formed yet */
        assert_true(now_ms() < until);
        usleep(20000);
    }
}

/* A tiny allreduce on the honest pod: its result, or the error it ends with. */
static coll_err honest_allreduce(coll_conn *c, coll_group *g, int32_t *p, double *ms)
{
    for (int i = 0; i < 16; i++)
        p[i] = i;
    coll_request r;
    double t0 = now_ms();
    coll_err e = coll_allreduce(g, p, p + 16, 16, COLL_INT32, COLL_SUM, NULL, &r);
    if (e == COLL_OK) e = coll_wait(c, r, 10000);
    if (ms) *ms = now_ms() - t0;
    return e;
}

/* An honest client on pod 0 (sock0) and hc's group hg on pod 1 re-form the pair and
 * run a checked allreduce (reopening on EPOCH: an epoch may end as the pair forms). */
static void pair_reforms(const char *sock0, coll_conn *hc, coll_group **hg, coll_buffer *hb)
{
    coll_conn *c0;
    coll_group *g0;
    coll_buffer *b0;
    assert_int_equal(coll_connect(&c0, sock0, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&g0, c0, "duo", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_mem_alloc(&b0, c0, 4096, COLL_DEVICE_HOST), COLL_OK);
    pid_t p = fork();
    if (p == 0) {
        coll_err pe = COLL_ERR_TIMEOUT;
        for (int k = 0; k < 50 && pe != COLL_OK; k++) {
            pe = honest_allreduce(c0, g0, coll_mem_ptr(b0), NULL);
            if (pe == COLL_ERR_EPOCH) {
                coll_group_close(&g0);
                coll_group_open(&g0, c0, "duo", COLL_SLOT_ANY);
            }
        }
        _exit(pe == COLL_OK && ((int32_t *)coll_mem_ptr(b0))[16 + 3] == 6 ? 0 : 1);
    }
    coll_err he = COLL_ERR_TIMEOUT;
    for (int k = 0; k < 50 && he != COLL_OK; k++) {
        he = honest_allreduce(hc, *hg, coll_mem_ptr(hb), NULL);
        if (he == COLL_ERR_EPOCH) {
            coll_group_close(hg);
            assert_int_equal(coll_group_open(hg, hc, "duo", COLL_SLOT_ANY), COLL_OK);
        }
    }
    assert_int_equal(he, COLL_OK);
    assert_int_equal(((int32_t *)coll_mem_ptr(hb))[16 + 3], 6);
    assert_int_equal(child_wait(p, 20000), 0);
    coll_disconnect(&c0);
}

/* Found nowhere yet, tried on purpose: a client that holds the connections of its pod
 * (direct ops) writes garbage on them, asks twice, asks for a group it did not open,
 * submits through the ring meanwhile, and gives them back with a status no error has.
 * It can end its own group's epoch and nothing more: the other pod's op fails at once
 * and retryably, the lease's end reaches the offender's region, both agents serve the
 * bystander group and re-form the pair with an honest client. */
static void a_client_holding_the_connections_hurts_only_its_group(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    assert_int_equal(start_duo(&a[0], port, 0), 0);
    assert_int_equal(start_duo(&a[1], port, 1), 0);
    /* the honest client on pod 1, and a bystander on pod 0 */
    coll_conn *hc, *bc;
    coll_group *hg, *bg;
    coll_buffer *hb, *bb;
    assert_int_equal(coll_connect(&hc, a[1].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&hg, hc, "duo", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_mem_alloc(&hb, hc, 4096, COLL_DEVICE_HOST), COLL_OK);
    assert_int_equal(coll_connect(&bc, a[0].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&bg, bc, "solo", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_mem_alloc(&bb, bc, 4096, COLL_DEVICE_HOST), COLL_OK);
    struct raw r;
    raw_hello(&r, a[0].sock);
    uint32_t epoch;
    uint32_t h = raw_open(&r, "duo", &epoch);
    union wire_msg m, q;
    int fds[4], nfds = 0;
    /* a group it did not open: refused, the session stays */
    wire_init(&m, WIRE_LEASE, 5);
    m.lease.handle = 63;
    raw_request(&r, &m, &q, fds, &nfds);
    assert_int_equal(q.h.type, WIRE_ERROR);
    assert_int_equal(q.error.code, COLL_ERR_INVALID);
    assert_int_equal(nfds, 0);
    raw_lease(&r, h, &q, fds);
    assert_int_equal(q.lease_ok.nodes, 2);
    assert_int_equal(q.lease_ok.me, 0);
    uint64_t lease = q.lease_ok.lease_id;
    uint32_t void0 = atomic_load(&r.shm->lease_void);
    /* twice: busy, nothing more lent */
    wire_init(&m, WIRE_LEASE, 6);
    m.lease.handle = h;
    raw_request(&r, &m, &q, NULL, &nfds);
    assert_int_equal(q.h.type, WIRE_ERROR);
    assert_int_equal(q.error.code, COLL_ERR_BUSY);
    /* a collective through the ring meanwhile: failed, not run on the lent sockets */
    struct wire_sqe sq = {.tag = 77, .group = h, .epoch = epoch, .kind = WIRE_OP_BARRIER};
    raw_submit(&r, &sq, 1);
    double until = now_ms() + 5000;
    while (!ring_ready(&r.shm->cq[0].seq, 0) && now_ms() < until)
        usleep(1000);
    assert_true(ring_ready(&r.shm->cq[0].seq, 0));
    assert_int_equal(r.shm->cq[0].tag, 77);
    assert_int_equal(r.shm->cq[0].status, COLL_ERR_INVALID);
    assert_non_null(strstr(r.shm->why[76], "lent"));
    /* garbage on both connections: the honest pod's op fails at once, retryably */
    char junk[4096];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (char)(i * 131 + 7);
    assert_int_equal(send(fds[0], junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    (void)!send(fds[1], junk, sizeof(junk), MSG_NOSIGNAL);
    double ms;
    coll_err e = honest_allreduce(hc, hg, coll_mem_ptr(hb), &ms);
    fprintf(stderr, "honest pod: %s after %.0f ms (%s)\n", coll_strerror(e), ms, coll_last_error());
    /* at once, by the garbage: not by the op's deadline (a timeout) */
    assert_true(e != COLL_OK && e != COLL_ERR_TIMEOUT && coll_err_retryable(e));
    /* the end reaches the offender: its region says so, its sockets end */
    until = now_ms() + 5000;
    while (atomic_load(&r.shm->lease_void) == void0 && now_ms() < until)
        usleep(1000);
    assert_int_not_equal(atomic_load(&r.shm->lease_void), void0);
    assert_int_equal(r.shm->lease_end.lease_id, lease);
    assert_true(coll_err_retryable((coll_err)r.shm->lease_end.code));
    char sink[8192];
    ssize_t got = -1;
    until = now_ms() + 5000; /* what is left to read, then the end (a heartbeat later) */
    while (now_ms() < until) {
        struct pollfd pf = {.fd = fds[1], .events = POLLIN};
        poll(&pf, 1, 100);
        got = recv(fds[1], sink, sizeof(sink), MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) break;
    }
    assert_true(got == 0 || (got < 0 && errno != EAGAIN));
    close(fds[0]);
    close(fds[1]);
    /* giving back a lease that ended: answered, nothing else */
    wire_init(&m, WIRE_LEASE_BACK, 9);
    m.lease_back.handle = h;
    m.lease_back.lease_id = lease;
    raw_request(&r, &m, &q, NULL, NULL);
    assert_int_equal(q.h.type, WIRE_LEASE_BACK_OK);
    /* a status no error has: a protocol violation, the offender is dropped */
    wire_init(&m, WIRE_LEASE_BACK, 10);
    m.lease_back.handle = h;
    m.lease_back.code = 1000;
    raw_send(r.fd, &m, m.h.len, -1);
    expect_dropped(r.fd, COLL_ERR_PROTOCOL, "status");
    munmap(r.shm, sizeof(struct wire_shm));
    close(r.efd);
    /* bytes read ahead that no lease can carry back (wire.h: stash_len): of this pod's
     * own connection, or more than a stash holds; the offender is dropped each time */
    const struct {
        int node;
        uint16_t len;
    } lies[] = {{0, 8}, {1, WIRE_STASH_BYTES + 1}, {5, 1}};
    for (size_t k = 0; k < sizeof(lies) / sizeof(lies[0]); k++) {
        struct raw r2;
        raw_hello(&r2, a[0].sock);
        uint32_t h2 = raw_open(&r2, "duo", &epoch);
        wire_init(&m, WIRE_LEASE_BACK, 11);
        m.lease_back.handle = h2;
        m.lease_back.stash_len[lies[k].node] = lies[k].len;
        raw_send(r2.fd, &m, m.h.len, -1);
        char needle[64];
        snprintf(needle, sizeof(needle), "bytes read ahead of node %d", lies[k].node);
        expect_dropped(r2.fd, COLL_ERR_PROTOCOL, needle);
        munmap(r2.shm, sizeof(struct wire_shm));
        close(r2.efd);
    }
    /* both agents serve: the bystander, and the pair with an honest client on pod 0 */
    int32_t *bp = coll_mem_ptr(bb);
    assert_int_equal(honest_allreduce(bc, bg, bp, NULL), COLL_OK);
    assert_int_equal(bp[16 + 5], 5);
    coll_group_close(&hg);
    assert_int_equal(coll_group_open(&hg, hc, "duo", COLL_SLOT_ANY), COLL_OK);
    pair_reforms(a[0].sock, hc, &hg, hb);
    coll_disconnect(&hc);
    coll_disconnect(&bc);
    assert_int_equal(agent_stop(&a[0]), 0);
    assert_int_equal(agent_stop(&a[1]), 0);
}

/* A host group's children across pods are libcoll's: a client that asks the agent for
 * one anyway (a forged GROUP_CREATE) is told so, as is one that lists a rank the group
 * lacks, and the agent serves on (the one-pod child of the same handle included). */
static void a_host_child_across_pods_is_refused_by_the_agent(void **state)
{
    (void)state;
    struct agent a;
    assert_int_equal(start_duo(&a, free_port(), 0), 0);
    struct raw r;
    raw_hello(&r, a.sock);
    uint32_t epoch;
    uint32_t h = raw_open(&r, "duo", &epoch);
    static const struct {
        uint32_t n, ranks[2];
        int code;
        const char *why;
    } bad[] = {
        {2, {0, 1}, COLL_ERR_UNSUPPORTED, "1 of its 2 ranks are on other pods: the agent makes"},
        {2, {1, 0}, COLL_ERR_UNSUPPORTED, "children across pods of GPU groups only"},
        {2, {0, 5}, COLL_ERR_INVALID, "ranks[1] = 5: group 'duo' has ranks 0..1"},
    };
    union wire_msg m;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        wire_init(&m, WIRE_GROUP_CREATE, 20 + (uint32_t)i);
        m.group_create.parent = h;
        m.group_create.n = bad[i].n;
        memcpy(m.group_create.ranks, bad[i].ranks, sizeof(bad[i].ranks));
        expect_refused(r.fd, &m, bad[i].code, bad[i].why, i);
    }
    wire_init(&m, WIRE_GROUP_CREATE, 30);
    m.group_create.parent = h;
    m.group_create.n = 1;
    raw_send(r.fd, &m, m.h.len, -1);
    assert_int_equal(raw_recv(r.fd, &m, NULL, NULL, 3000), 0);
    assert_int_equal(m.h.type, WIRE_GROUP_OPEN_OK);
    assert_int_equal(m.group_open_ok.size, 1);
    close(r.fd);
    assert_int_equal(agent_stop(&a), 0);
}

/* Tried on purpose: a client that holds its group's connections says it is busy for
 * ever (the lease's busy word) and never gives them back. When the other pod leaves, its
 * agent waits for it a heartbeat interval (250 ms here) and no more: the lease ends, the
 * region says so, and the pair re-forms with the other pod's next client. */
static void a_client_busy_for_ever_holds_its_group_back_a_heartbeat(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    assert_int_equal(start_duo(&a[0], port, 0), 0);
    assert_int_equal(start_duo(&a[1], port, 1), 0);
    coll_conn *hc;
    coll_group *hg;
    assert_int_equal(coll_connect(&hc, a[1].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&hg, hc, "duo", COLL_SLOT_ANY), COLL_OK);
    struct raw r;
    raw_hello(&r, a[0].sock);
    uint32_t epoch;
    uint32_t h = raw_open(&r, "duo", &epoch);
    union wire_msg q;
    int fds[4];
    raw_lease(&r, h, &q, fds);
    uint32_t void0 = atomic_load(&r.shm->lease_void);
    uint32_t drain0 = atomic_load(&r.shm->lease_q[h].drain);
    atomic_store(&r.shm->lease_q[h].busy, 1);
    /* the other pod leaves: its agent tells the coordinator (pod 0), which drains */
    double t0 = now_ms();
    coll_group_close(&hg);
    double until = t0 + 5000;
    while (atomic_load(&r.shm->lease_void) == void0 && now_ms() < until)
        usleep(1000);
    double ms = now_ms() - t0;
    fprintf(stderr, "lease ended %.0f ms after the other pod left\n", ms);
    assert_int_not_equal(atomic_load(&r.shm->lease_void), void0);
    assert_int_not_equal(atomic_load(&r.shm->lease_q[h].drain), drain0); /* it was asked */
    assert_true(ms >= 250); /* it waited a heartbeat for the client (a timer: no race) */
    assert_true(coll_err_retryable((coll_err)r.shm->lease_end.code));
    assert_true(agent_log_count(&a[0], "event=rendezvous.drain") >= 1);
    close(fds[0]);
    close(fds[1]);
    /* the pair re-forms: the offender goes, honest clients on both pods */
    close(r.fd);
    munmap(r.shm, sizeof(struct wire_shm));
    close(r.efd);
    coll_buffer *hb;
    assert_int_equal(coll_group_open(&hg, hc, "duo", COLL_SLOT_ANY), COLL_OK);
    assert_int_equal(coll_mem_alloc(&hb, hc, 4096, COLL_DEVICE_HOST), COLL_OK);
    pair_reforms(a[0].sock, hc, &hg, hb);
    coll_disconnect(&hc);
    assert_int_equal(agent_stop(&a[0]), 0);
    assert_int_equal(agent_stop(&a[1]), 0);
}

/* /metrics of the agent at hport, parsed (metrics_parse) into out; 0, or 77 without the
 * parser. A text published after the call. */
static int scrape(int hport, char *out, size_t cap)
{
    char file[128];
    tmp_path(file, sizeof(file), "metrics", 0);
    assert_int_equal(metrics_fresh(hport, file, 10000), 200);
    int rc = metrics_parse(file, out, cap);
    unlink(file);
    return rc;
}

/* Tried on purpose: the counts of direct ops live in the client's region, so a client can
 * forge them. It can raise its own group's counters (as running ops would), never make
 * one go back: lowered, then raised past the old value, the agent's counters only grow,
 * and a fresh lease does not count what the words held before it. */
static void a_client_s_forged_counts_never_make_a_counter_go_back(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    char extra[96];
    int hport = http_extra(extra, sizeof(extra), port);
    assert_int_equal(start_duo_with(&a[0], port, 0, extra), 0);
    assert_int_equal(start_duo(&a[1], port, 1), 0);
    coll_conn *hc;
    coll_group *hg;
    assert_int_equal(coll_connect(&hc, a[1].sock, 5000), COLL_OK);
    assert_int_equal(coll_group_open(&hg, hc, "duo", COLL_SLOT_ANY), COLL_OK);
    struct raw r;
    raw_hello(&r, a[0].sock);
    uint32_t epoch;
    uint32_t h = raw_open(&r, "duo", &epoch);
    struct wire_direct_counts *k = &r.shm->direct[h];
    /* before any lease: not the group's */
    atomic_store(&k->ops[WIRE_OP_ALLREDUCE][COLL_OK], 1000);
    union wire_msg q;
    int fds[4];
    raw_lease(&r, h, &q, fds);
    char out[4096];
    int rc = scrape(hport, out, sizeof(out));
    if (rc == 77) {
        printf("%s", out);
        close(fds[0]);
        close(fds[1]);
        coll_disconnect(&hc);
        assert_int_equal(agent_stop(&a[0]), 0);
        assert_int_equal(agent_stop(&a[1]), 0);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_int_equal(metric_of(out, "ops_duo_allreduce_ok"), 0);
    /* seven forged ops, then fewer, then more */
    const uint64_t steps[] = {1007, 1003, 1010};
    const long want[] = {7, 7, 10};
    for (int i = 0; i < 3; i++) {
        atomic_store(&k->ops[WIRE_OP_ALLREDUCE][COLL_OK], steps[i]);
        atomic_store(&k->hist[0], steps[i] - 1000);
        atomic_store(&k->bytes[WIRE_OP_ALLREDUCE], (steps[i] - 1000) * 64);
        assert_int_equal(scrape(hport, out, sizeof(out)), 0);
        assert_int_equal(metric_of(out, "ops_duo_allreduce_ok"), want[i]);
        assert_int_equal(metric_of(out, "hist_count_duo"), want[i]);
        assert_int_equal(metric_of(out, "bytes_duo_allreduce"), want[i] * 64);
        assert_int_equal(metric_of(out, "path_duo_direct"), want[i]);
    }
    /* the agent serves on: the pair re-forms with an honest client on pod 0 */
    close(fds[0]);
    close(fds[1]);
    close(r.fd);
    munmap(r.shm, sizeof(struct wire_shm));
    close(r.efd);
    coll_buffer *hb;
    assert_int_equal(coll_mem_alloc(&hb, hc, 4096, COLL_DEVICE_HOST), COLL_OK);
    pair_reforms(a[0].sock, hc, &hg, hb);
    coll_disconnect(&hc);
    assert_int_equal(agent_stop(&a[0]), 0);
    assert_int_equal(agent_stop(&a[1]), 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(garbage_message_is_dropped),
        T(truncated_message_is_dropped),
        T(oversized_message_is_dropped),
        T(other_protocol_version_is_rejected),
        T(silent_client_times_out),
        T(request_before_hello_is_dropped),
        T(group_state_requests_are_checked),
        T(stray_descriptor_is_dropped),
        T(unsealed_memfd_is_refused),
        T(bad_op_in_ring_is_dropped),
        T(unpublished_ring_entries_are_ignored),
        T(out_of_bounds_op_is_dropped),
        T(misaligned_offset_is_dropped),
        T(overlapping_ranges_are_dropped),
        T(gpu_flag_on_host_agent_is_dropped),
        T(flags_on_the_wrong_op_are_dropped),
        T(forged_premultiplied_sums_are_refused),
        T(stale_epoch_op_is_validated_first),
        T(any_rank_only_on_a_receive),
        T(forged_rank_in_group_open_is_refused),
        T(random_ring_entries_never_hurt_the_agent),
        T(random_messages_never_hurt_the_agent),
        T(client_killed_mid_op_fails_partner_promptly),
        T(client_killed_with_op_in_flight),
        T(disagreement_is_an_error_for_everyone),
        T(lone_participant_times_out_then_reopens),
        T(in_flight_limit_is_reported),
        T(lookups_fail_cleanly),
        T(denied_uid_is_refused),
        T(agent_of_another_uid_is_refused),
        T(refusals_neither_lock_out_nor_flood_the_log),
        T(agent_death_is_noticed),
        T(sigterm_fails_ops_with_shutdown),
        cmocka_unit_test(a_client_s_false_cpu_never_makes_the_agent_spin_against_others),
        cmocka_unit_test(a_client_holding_the_connections_hurts_only_its_group),
        cmocka_unit_test(a_client_busy_for_ever_holds_its_group_back_a_heartbeat),
        cmocka_unit_test(a_client_s_forged_counts_never_make_a_counter_go_back),
        cmocka_unit_test(a_host_child_across_pods_is_refused_by_the_agent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
