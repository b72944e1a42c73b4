/*
 * libcoll.c: the client side of the local plane. Owns the connection to the agent
 * (socket, shared rings, doorbells), the registry of shared buffers that turns
 * pointers into (buffer id, offset), and the request table that completions land in.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "cpus.h"
#include "lcgpu.h"
#include "ring.h"
#include "wire.h"
#include "util.h"

#define DEFAULT_SOCKET "/tmp/coll-agent.sock"
#define DEFAULT_TIMEOUT_MS 10000
#define DEFAULT_SPIN_US 50
#define SPIN_PAUSE_NS 3000
/* With fewer CPUs than this to keep busy (cpus.h), an op between pods sleeps at once:
 * its spinning would take the CPU from the agent threads that produce its result. With
 * more, it spins first like any op (bench/RESULTS.md: 2x faster on a 16-CPU host, 25%
 * slower on 2). */
#define SPIN_MIN_CPUS 4
/* submission with every request slot taken, some by ops only streams wait for */
#define SLOT_WAIT_NS (30LL * 1000000000)

/* ---- errors ---------------------------------------------------------------- */

static __thread char last_error[256];

static coll_err fail(coll_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static coll_err fail(coll_err e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return e;
}

const char *coll_last_error(void)
{
    return last_error;
}

/* ---- objects ---------------------------------------------------------------- */

enum req_state { REQ_FREE = 0, REQ_PENDING, REQ_DONE };

struct req {
    uint32_t gen;
    uint8_t state;
    uint8_t rang;         /* submission woke a sleeping agent: sleep at once, don't spin */
    uint8_t gpu;          /* a GPU op: its done word can be waited on by a stream */
    uint8_t detached;     /* handed to a stream (coll_wait_stream): freed when it completes */
    uint8_t agent_failed; /* the agent failed it: its reason is in the shared region */
    uint32_t group;       /* handle of the group it was submitted to */
    int32_t status;
    coll_buffer *sb, *rb;
};

struct coll_buffer {
    coll_conn *conn;
    uint32_t id;
    int device;
    int kind;               /* enum wire_mem_kind */
    struct lcgpu_mem *gmem; /* CUMEM_FD buffers libcoll allocated */
    void *ptr;
    size_t size;
    uint32_t inflight; /* ops in flight that use it; guarded by conn->lock */
};

struct coll_group {
    coll_conn *conn;
    uint32_t handle;
    int gpu; /* the group runs on NCCL: its ops take GPU buffers and a stream */
    coll_group_info info;
    coll_group *next;
};

struct coll_conn {
    pthread_mutex_t lock;
    /* Waiting threads: at most one (the poller) sleeps on the doorbell and the socket;
     * the others sleep on cv, which is broadcast whenever completions are reaped or the
     * poller leaves. With several threads in epoll on one edge-triggered doorbell, the
     * edge woke one of them and a completion reaped for another thread was never seen. */
    pthread_cond_t cv; /* CLOCK_MONOTONIC; guarded by lock */
    int poller;        /* a thread sleeps in epoll; guarded by lock */
    int cv_waiters;    /* threads sleeping on cv; guarded by lock */
    int fd, efd_agent, efd_client;
    int epfd; /* efd_client (edge-triggered: never drained) and the socket */
    struct wire_shm *shm;
    size_t shm_size;
    uint32_t sq_next, cq_head; /* next sq entry to fill, next cq entry to read */
    uint32_t rpc_id;
    int timeout_ms;
    int spin_us;
    int spin_set;  /* COLL_SPIN_US was given: spin that long for every op */
    int few_cpus;  /* fewer than SPIN_MIN_CPUS to run on: ops between pods sleep at once */
    coll_err lost; /* COLL_OK while the agent is there */
    char lost_msg[WIRE_ERRMSG_MAX];
    struct req reqs[WIRE_RING_ENTRIES];
    uint32_t free_idx[WIRE_RING_ENTRIES];
    uint32_t nfree;
    uint32_t ndetached;        /* requests only a stream waits for (coll_wait_stream) */
    int agent_gpu;             /* the agent imports GPU buffers */
    int shm_gpu;               /* the region is registered with CUDA */
    intptr_t shm_delta;        /* host -> GPU address of the region */
    coll_err stream_err;       /* a failed op that was handed to a stream, not yet reported */
    uint32_t stream_err_group; /* its group: closing that group forgets the error */
    char stream_err_msg[256];
    coll_buffer **bufs; /* sorted by ptr */
    size_t nbufs, capbufs;
    coll_group *groups;
};

static void reap(coll_conn *c);
static void sleep_for_completion(coll_conn *c, int64_t deadline, coll_request req);

static int env_int(const char *name, int def)
{
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    long v = strtol(s, &end, 10);
    return *end ? def : (int)v;
}

/* ---- socket messages ---------------------------------------------------------- */

static int send_msg(int fd, const union wire_msg *m, int pass_fd)
{
    struct iovec iov = {.iov_base = (void *)m, .iov_len = m->h.len};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = sizeof(u.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    ssize_t n;
    do {
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)m->h.len ? 0 : -1;
}

/* Receive one message and up to 3 fds before the deadline. Returns bytes, 0 on
 * orderly close, -1 on error (errno ETIMEDOUT at the deadline). */
static ssize_t recv_msg(int fd, void *buf, size_t cap, int *fds, int *nfds, int64_t deadline)
{
    *nfds = 0;
    for (;;) {
        int64_t left = deadline - now_ns();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)((left + 999999) / 1000000));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) continue;
        union {
            char b[CMSG_SPACE(3 * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n < 0) return -1;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
            int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < cnt; i++) {
                int f;
                memcpy(&f, CMSG_DATA(cm) + (size_t)i * sizeof(int), sizeof(int));
                if (*nfds < 3)
                    fds[(*nfds)++] = f;
                else
                    close(f);
            }
        }
        if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
            errno = EMSGSIZE;
            return -1;
        }
        return n;
    }
}

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* Store the newest tag of every request slot into the done words from the CPU, so
 * that no stream waits for an agent that will not write them. */
static void release_streams(coll_conn *c)
{
    if (!c->shm_gpu) return;
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++) {
        ring_store_max64(&c->shm->done[i], ((uint64_t)c->reqs[i].gen << 32) | (i + 1));
    }
}

static void mark_lost(coll_conn *c, coll_err why, const char *msg)
{
    if (c->lost) return;
    c->lost = why;
    snprintf(c->lost_msg, sizeof(c->lost_msg), "%s", msg);
    release_streams(c);
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++) {
        struct req *r = &c->reqs[i];
        if (r->state == REQ_PENDING) {
            r->state = REQ_DONE;
            r->status = why;
            r->agent_failed = 0;
            if (r->sb) r->sb->inflight--;
            if (r->rb) r->rb->inflight--;
            r->sb = r->rb = NULL;
        }
    }
    pthread_cond_broadcast(&c->cv);
}

/*
 * One request/reply exchange with the agent; caller holds c->lock. reply_type is the
 * expected success type; an ERROR reply returns its code with its text as detail.
 */
static coll_err rpc(coll_conn *c, union wire_msg *m, int pass_fd, unsigned reply_type,
                    union wire_msg *reply, int *fds, int *nfds)
{
    int dummy_fds[3], dummy_n;
    if (!fds) {
        fds = dummy_fds;
        nfds = &dummy_n;
    }
    *nfds = 0;
    if (c->lost) return fail(c->lost, "agent connection lost: %s", c->lost_msg);
    m->h.req_id = ++c->rpc_id;
    if (send_msg(c->fd, m, pass_fd) < 0) {
        /* an agent that refuses us (credentials, limits) says why, then hangs up */
        int e = errno;
        char buf[WIRE_MAX_MSG], err[160];
        ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0 && wire_decode(buf, (size_t)n, reply, NULL, err, sizeof(err)) == 0 &&
            reply->h.type == WIRE_ERROR && coll_strerror((coll_err)reply->error.code)) {
            mark_lost(c, COLL_ERR_AGENT_LOST, reply->error.msg);
            return fail((coll_err)reply->error.code, "agent: %s", reply->error.msg);
        }
        errno = e;
        mark_lost(c, COLL_ERR_AGENT_LOST, "send to agent failed");
        return fail(COLL_ERR_AGENT_LOST, "sending to the agent: %s", strerror(errno));
    }
    char buf[WIRE_MAX_MSG];
    int64_t deadline = now_ns() + (int64_t)c->timeout_ms * 1000000;
    ssize_t n = recv_msg(c->fd, buf, sizeof(buf), fds, nfds, deadline);
    if (n <= 0) {
        int e = errno;
        mark_lost(c, COLL_ERR_AGENT_LOST, n == 0 ? "agent closed the connection" : strerror(e));
        if (n < 0 && e == ETIMEDOUT)
            return fail(COLL_ERR_TIMEOUT, "no reply from the agent within %d ms", c->timeout_ms);
        return fail(COLL_ERR_AGENT_LOST, "agent closed the connection");
    }
    char err[160];
    if (wire_decode(buf, (size_t)n, reply, NULL, err, sizeof(err)) < 0) {
        close_fds(fds, *nfds);
        *nfds = 0;
        mark_lost(c, COLL_ERR_PROTOCOL, err);
        return fail(COLL_ERR_PROTOCOL, "bad reply from the agent: %s", err);
    }
    if (reply->h.type == WIRE_ERROR) {
        close_fds(fds, *nfds);
        *nfds = 0;
        coll_err code = (coll_err)reply->error.code;
        if (code == COLL_OK || !coll_strerror(code)) code = COLL_ERR_PROTOCOL;
        return fail(code, "agent: %s", reply->error.msg);
    }
    if (reply->h.type != reply_type || reply->h.req_id != m->h.req_id) {
        close_fds(fds, *nfds);
        *nfds = 0;
        mark_lost(c, COLL_ERR_PROTOCOL, "unexpected reply");
        return fail(COLL_ERR_PROTOCOL, "agent replied with type %u to request %u", reply->h.type,
                    m->h.req_id);
    }
    return COLL_OK;
}

/* ---- connection --------------------------------------------------------------- */

/* Whether an agent running as uid may serve this process: its own uid (real or
 * effective), root, or one listed in $COLL_AGENT_UIDS (comma-separated). Whoever binds
 * the socket path first would otherwise be "the agent" and see every buffer. */
static int agent_uid_allowed(uid_t uid)
{
    if (uid == 0 || uid == getuid() || uid == geteuid()) return 1;
    const char *list = getenv("COLL_AGENT_UIDS");
    while (list && *list) {
        char *end;
        unsigned long v = strtoul(list, &end, 10);
        if (end != list && (*end == ',' || *end == '\0') && v == (unsigned long)uid) return 1;
        list = strchr(list, ',');
        if (list) list++;
    }
    return 0;
}

coll_err coll_connect(coll_conn **out, const char *socket_path, int timeout_ms)
{
    if (!out) return fail(COLL_ERR_INVALID, "out is NULL");
    *out = NULL;
    if (!socket_path) socket_path = getenv("COLL_AGENT_SOCKET");
    if (!socket_path || !*socket_path) socket_path = DEFAULT_SOCKET;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof(sa.sun_path))
        return fail(COLL_ERR_INVALID, "socket path '%s' is too long", socket_path);
    strcpy(sa.sun_path, socket_path);

    coll_conn *c = calloc(1, sizeof(*c));
    if (!c) return fail(COLL_ERR_NOMEM, "allocating the connection");
    c->fd = c->efd_agent = c->efd_client = c->epfd = -1;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
    c->spin_us = env_int("COLL_SPIN_US", DEFAULT_SPIN_US);
    c->spin_set = env_int("COLL_SPIN_US", -1) >= 0;
    c->few_cpus = coll_usable_cpus() < SPIN_MIN_CPUS;
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++)
        c->free_idx[i] = WIRE_RING_ENTRIES - 1 - i;
    c->nfree = WIRE_RING_ENTRIES;

    coll_err rc;
    c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        rc = fail(COLL_ERR_SYSTEM, "socket: %s", strerror(errno));
        goto fail_conn;
    }
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = fail(COLL_ERR_CONNECT, "connect to %s: %s", socket_path, strerror(errno));
        goto fail_conn;
    }
    struct ucred cred;
    socklen_t credlen = sizeof(cred);
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) < 0) {
        rc = fail(COLL_ERR_CONNECT, "who serves %s: %s", socket_path, strerror(errno));
        goto fail_conn;
    }
    if (!agent_uid_allowed(cred.uid)) {
        rc = fail(COLL_ERR_CONNECT,
                  "%s is served by uid %u (pid %d), which is neither this process's uid %u, "
                  "root, nor listed in COLL_AGENT_UIDS",
                  socket_path, (unsigned)cred.uid, (int)cred.pid, (unsigned)geteuid());
        goto fail_conn;
    }
    union wire_msg m, reply;
    wire_init(&m, WIRE_HELLO, 0);
    m.hello.pid = (uint32_t)getpid();
    snprintf(m.hello.client, sizeof(m.hello.client), "%s",
             getenv("COLL_CLIENT_NAME") ? getenv("COLL_CLIENT_NAME") : "libcoll");
    int fds[3], nfds = 0;
    rc = rpc(c, &m, -1, WIRE_HELLO_OK, &reply, fds, &nfds);
    if (rc != COLL_OK) goto fail_conn;
    if (nfds != 3) {
        close_fds(fds, nfds);
        rc = fail(COLL_ERR_PROTOCOL, "handshake carried %d descriptors, expected 3", nfds);
        goto fail_conn;
    }
    c->efd_agent = fds[1];
    c->efd_client = fds[2];
    c->agent_gpu = (reply.hello_ok.flags & WIRE_HELLO_F_GPU) != 0;
    struct stat st;
    if (fstat(fds[0], &st) < 0 || (uint64_t)st.st_size < reply.hello_ok.shm_size ||
        reply.hello_ok.shm_size < sizeof(struct wire_shm) ||
        reply.hello_ok.ring_entries != WIRE_RING_ENTRIES) {
        close(fds[0]);
        rc = fail(COLL_ERR_PROTOCOL, "handshake: shared region of the wrong size or shape");
        goto fail_conn;
    }
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = c->efd_client};
    if (c->epfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->efd_client, &ev) < 0) {
        close(fds[0]);
        rc = fail(COLL_ERR_SYSTEM, "epoll: %s", strerror(errno));
        goto fail_conn;
    }
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = c->fd};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
        close(fds[0]);
        rc = fail(COLL_ERR_SYSTEM, "epoll: %s", strerror(errno));
        goto fail_conn;
    }
    c->shm_size = reply.hello_ok.shm_size;
    c->shm = mmap(NULL, c->shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    close(fds[0]);
    if (c->shm == MAP_FAILED) {
        c->shm = NULL;
        rc = fail(COLL_ERR_SYSTEM, "mapping the rings: %s", strerror(errno));
        goto fail_conn;
    }
    if (c->shm->magic != WIRE_MAGIC || c->shm->version != WIRE_VERSION ||
        c->shm->entries != WIRE_RING_ENTRIES) {
        rc = fail(COLL_ERR_PROTOCOL, "handshake: shared region has a bad header");
        goto fail_conn;
    }
    *out = c;
    return COLL_OK;
fail_conn:
    coll_disconnect(&c);
    return rc;
}

static void buffer_free(coll_buffer *b)
{
    if (b->kind == WIRE_MEM_MEMFD && b->ptr) munmap(b->ptr, b->size);
    if (b->gmem) lcgpu_free(b->gmem);
    free(b);
}

void coll_disconnect(coll_conn **conn)
{
    if (!conn || !*conn) return;
    coll_conn *c = *conn;
    *conn = NULL;
    if (c->fd >= 0) close(c->fd); /* the agent tears the session down on hang-up */
    if (c->efd_agent >= 0) close(c->efd_agent);
    if (c->efd_client >= 0) close(c->efd_client);
    if (c->epfd >= 0) close(c->epfd);
    /* A stream may still wait on the region's words: release them and keep the
     * region mapped (and registered) for the life of the process. */
    release_streams(c);
    if (c->shm && !c->shm_gpu) munmap(c->shm, c->shm_size);
    for (size_t i = 0; i < c->nbufs; i++)
        buffer_free(c->bufs[i]);
    free(c->bufs);
    while (c->groups) {
        coll_group *g = c->groups;
        c->groups = g->next;
        free(g);
    }
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* ---- groups ------------------------------------------------------------------ */

coll_err coll_group_open(coll_group **out, coll_conn *c, const char *name, int slot)
{
    if (!out || !c || !name) return fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (strlen(name) == 0 || strlen(name) >= WIRE_NAME_MAX)
        return fail(COLL_ERR_INVALID, "group name must be 1 to %d bytes", WIRE_NAME_MAX - 1);
    if (slot < COLL_SLOT_ANY) return fail(COLL_ERR_INVALID, "slot %d is negative", slot);
    coll_group *g = calloc(1, sizeof(*g));
    if (!g) return fail(COLL_ERR_NOMEM, "allocating the group");
    union wire_msg m, r;
    wire_init(&m, WIRE_GROUP_OPEN, 0);
    m.group_open.slot = slot;
    strcpy(m.group_open.name, name);
    pthread_mutex_lock(&c->lock);
    coll_err rc = rpc(c, &m, -1, WIRE_GROUP_OPEN_OK, &r, NULL, NULL);
    if (rc == COLL_OK) {
        g->next = c->groups;
        c->groups = g;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc != COLL_OK) {
        free(g);
        return rc;
    }
    const struct wire_group_open_ok *o = &r.group_open_ok;
    if (o->size == 0 || o->rank >= o->size || o->local_slot >= o->local_slots) {
        /* keep the slot accounting honest: the agent holds the slot until close */
        g->conn = c;
        g->handle = o->handle;
        coll_group_close(&g);
        return fail(COLL_ERR_PROTOCOL, "agent described an impossible group");
    }
    g->conn = c;
    g->handle = o->handle;
    g->info.rank = (int)o->rank;
    g->info.size = (int)o->size;
    g->info.local_slot = (int)o->local_slot;
    g->info.local_slots = (int)o->local_slots;
    g->info.node_index = (int)o->node_index;
    g->info.nodes = (int)o->nodes;
    g->info.epoch = o->epoch;
    snprintf(g->info.backend, sizeof(g->info.backend), "%s", o->backend);
    g->gpu = strcmp(g->info.backend, "nccl") == 0;
    snprintf(g->info.name, sizeof(g->info.name), "%s", name);
    *out = g;
    return COLL_OK;
}

coll_err coll_group_info_get(const coll_group *g, coll_group_info *out)
{
    if (!g || !out) return fail(COLL_ERR_INVALID, "NULL argument");
    *out = g->info;
    return COLL_OK;
}

void coll_group_close(coll_group **group)
{
    if (!group || !*group) return;
    coll_group *g = *group;
    *group = NULL;
    coll_conn *c = g->conn;
    union wire_msg m, r;
    wire_init(&m, WIRE_GROUP_CLOSE, 0);
    m.group_close.handle = g->handle;
    pthread_mutex_lock(&c->lock);
    if (!c->lost) rpc(c, &m, -1, WIRE_GROUP_CLOSE_OK, &r, NULL, NULL);
    if (!c->lost) reap(c);
    if (c->stream_err && c->stream_err_group == g->handle) c->stream_err = COLL_OK;
    for (coll_group **p = &c->groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    free(g);
}

/* ---- buffers ------------------------------------------------------------------- */

/* Register the session region with CUDA once (caller holds the lock). */
static coll_err shm_for_gpu(coll_conn *c)
{
    if (c->shm_gpu) return COLL_OK;
    char why[160];
    if (lcgpu_register(c->shm, c->shm_size, &c->shm_delta, why, sizeof(why)) < 0)
        return fail(COLL_ERR_UNSUPPORTED, "%s", why);
    c->shm_gpu = 1;
    return COLL_OK;
}

/* Share b (ptr, size, device, kind set) with the agent through m (fd: -1 or the
 * descriptor to pass) and add it to the table. Frees b on failure. */
static coll_err register_buffer(coll_buffer **out, coll_conn *c, coll_buffer *b, union wire_msg *m,
                                int fd)
{
    union wire_msg r;
    void *ptr = b->ptr;
    b->conn = c;
    m->mem_reg.kind = b->kind;
    m->mem_reg.device = b->device;
    pthread_mutex_lock(&c->lock);
    coll_err rc = COLL_OK;
    if (b->kind != WIRE_MEM_MEMFD) {
        if (!c->agent_gpu)
            rc = fail(COLL_ERR_UNSUPPORTED, "the agent has no GPU group (GPU buffers need the "
                                            "NCCL backend)");
        else
            rc = shm_for_gpu(c);
    }
    if (c->nbufs == c->capbufs) {
        size_t cap = c->capbufs ? c->capbufs * 2 : 16;
        coll_buffer **nb = realloc(c->bufs, cap * sizeof(*nb));
        if (!nb)
            rc = fail(COLL_ERR_NOMEM, "growing the buffer table");
        else {
            c->bufs = nb;
            c->capbufs = cap;
        }
    }
    if (rc == COLL_OK) rc = rpc(c, m, fd, WIRE_MEM_REG_OK, &r, NULL, NULL);
    if (rc == COLL_OK) {
        b->id = r.mem_reg_ok.buf_id;
        size_t i = c->nbufs;
        while (i > 0 && (uintptr_t)c->bufs[i - 1]->ptr > (uintptr_t)ptr) {
            c->bufs[i] = c->bufs[i - 1];
            i--;
        }
        c->bufs[i] = b;
        c->nbufs++;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc != COLL_OK) {
        buffer_free(b);
        return rc;
    }
    *out = b;
    return COLL_OK;
}

static coll_err register_fd(coll_buffer **out, coll_conn *c, int fd, size_t size)
{
    void *ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ptr == MAP_FAILED)
        return fail(errno == ENOMEM ? COLL_ERR_NOMEM : COLL_ERR_INVALID, "mmap of %zu bytes: %s",
                    size, strerror(errno));
    coll_buffer *b = calloc(1, sizeof(*b));
    if (!b) {
        munmap(ptr, size);
        return fail(COLL_ERR_NOMEM, "allocating the buffer");
    }
    b->ptr = ptr;
    b->size = size;
    b->device = COLL_DEVICE_HOST;
    b->kind = WIRE_MEM_MEMFD;
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 0);
    m.mem_reg.size = size;
    return register_buffer(out, c, b, &m, fd);
}

static coll_err gpu_alloc(coll_buffer **out, coll_conn *c, size_t size, int device)
{
    if (device < 0) return fail(COLL_ERR_INVALID, "device %d", device);
    coll_buffer *b = calloc(1, sizeof(*b));
    if (!b) return fail(COLL_ERR_NOMEM, "allocating the buffer");
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 0);
    size_t mapped = 0;
    int fd = -1;
    char why[160];
    if (lcgpu_alloc(device, size, &b->ptr, &mapped, &fd, m.mem_reg.uuid, &b->gmem, why,
                    sizeof(why)) < 0) {
        free(b);
        return fail(COLL_ERR_UNSUPPORTED, "GPU buffer of %zu bytes on device %d: %s", size, device,
                    why);
    }
    b->size = size;
    b->device = device;
    b->kind = WIRE_MEM_CUMEM_FD;
    m.mem_reg.size = mapped;
    coll_err rc = register_buffer(out, c, b, &m, fd);
    close(fd);
    return rc;
}

coll_err coll_mem_register_cuda(coll_buffer **out, coll_conn *c, void *ptr, size_t size)
{
    if (!out || !c || !ptr) return fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (size == 0) return fail(COLL_ERR_INVALID, "size is 0");
    coll_buffer *b = calloc(1, sizeof(*b));
    if (!b) return fail(COLL_ERR_NOMEM, "allocating the buffer");
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 0);
    char why[160];
    int device = -1;
    if (lcgpu_ipc(ptr, size, &device, m.mem_reg.uuid, m.mem_reg.ipc, &m.mem_reg.offset, why,
                  sizeof(why)) < 0) {
        free(b);
        return fail(COLL_ERR_INVALID, "%s", why);
    }
    b->ptr = ptr;
    b->size = size;
    b->device = device;
    b->kind = WIRE_MEM_CUDA_IPC;
    m.mem_reg.size = size;
    return register_buffer(out, c, b, &m, -1);
}

coll_err coll_mem_alloc(coll_buffer **out, coll_conn *c, size_t size, int device)
{
    if (!out || !c) return fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (size == 0) return fail(COLL_ERR_INVALID, "size is 0");
    if ((uint64_t)size > WIRE_MAX_BUFFER)
        return fail(COLL_ERR_INVALID, "size %zu exceeds the %llu bytes a buffer may hold", size,
                    (unsigned long long)WIRE_MAX_BUFFER);
    if (device != COLL_DEVICE_HOST) return gpu_alloc(out, c, size, device);
    int fd = memfd_create("coll-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return fail(COLL_ERR_SYSTEM, "memfd_create: %s", strerror(errno));
    coll_err rc;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = fail(COLL_ERR_NOMEM, "sizing a %zu-byte buffer: %s", size, strerror(errno));
        goto out;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        rc = fail(COLL_ERR_SYSTEM, "sealing the buffer: %s", strerror(errno));
        goto out;
    }
    rc = register_fd(out, c, fd, size);
out:
    close(fd);
    return rc;
}

coll_err coll_mem_register_fd(coll_buffer **out, coll_conn *c, int fd, size_t size)
{
    if (!out || !c) return fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (size == 0 || fd < 0) return fail(COLL_ERR_INVALID, "fd %d, size %zu", fd, size);
    return register_fd(out, c, fd, size);
}

void *coll_mem_ptr(const coll_buffer *b)
{
    return b ? b->ptr : NULL;
}

size_t coll_mem_size(const coll_buffer *b)
{
    return b ? b->size : 0;
}

/* Whether every pending op that uses b is a GPU op whose done word the agent's stream
 * has written (so its completion is on its way). Caller holds the lock. */
static int gpu_work_done(coll_conn *c, const coll_buffer *b)
{
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++) {
        const struct req *r = &c->reqs[i];
        if (r->state != REQ_PENDING || (r->sb != b && r->rb != b)) continue;
        uint64_t tag = ((uint64_t)r->gen << 32) | (i + 1);
        if (!r->gpu || (int64_t)(atomic_load(&c->shm->done[i]) - tag) < 0) return 0;
    }
    return 1;
}

coll_err coll_mem_release(coll_buffer **buf)
{
    if (!buf || !*buf) return fail(COLL_ERR_INVALID, "NULL buffer");
    coll_buffer *b = *buf;
    coll_conn *c = b->conn;
    pthread_mutex_lock(&c->lock);
    if (b->inflight && !c->lost) reap(c); /* ops handed to streams finish unseen */
    /* GPU ops whose stream work is done may not be reported yet: wait for that */
    int64_t until = now_ns() + (int64_t)c->timeout_ms * 1000000;
    while (b->inflight && !c->lost && gpu_work_done(c, b) && now_ns() < until) {
        pthread_mutex_unlock(&c->lock);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->lock);
        reap(c);
    }
    if (b->inflight) {
        uint32_t n = b->inflight;
        pthread_mutex_unlock(&c->lock);
        return fail(COLL_ERR_BUSY, "%u ops in flight use this buffer", n);
    }
    union wire_msg m, r;
    wire_init(&m, WIRE_MEM_RELEASE, 0);
    m.mem_release.buf_id = b->id;
    coll_err rc = c->lost ? COLL_OK : rpc(c, &m, -1, WIRE_MEM_RELEASE_OK, &r, NULL, NULL);
    if (rc == COLL_OK || c->lost) {
        for (size_t i = 0; i < c->nbufs; i++) {
            if (c->bufs[i] == b) {
                memmove(&c->bufs[i], &c->bufs[i + 1], (c->nbufs - i - 1) * sizeof(*c->bufs));
                c->nbufs--;
                break;
            }
        }
        rc = COLL_OK;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == COLL_OK) {
        buffer_free(b);
        *buf = NULL;
    }
    return rc;
}

/* ---- submission ----------------------------------------------------------------- */

/* The registered buffer that holds [p, p + bytes), or NULL. Caller holds the lock. */
static coll_buffer *find_buffer(coll_conn *c, const void *p, uint64_t bytes)
{
    size_t lo = 0, hi = c->nbufs;
    uintptr_t a = (uintptr_t)p;
    while (lo < hi) { /* last buffer whose start is <= a */
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)c->bufs[mid]->ptr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return NULL;
    coll_buffer *b = c->bufs[lo - 1];
    uintptr_t off = a - (uintptr_t)b->ptr;
    if (off > b->size || bytes > b->size - off) return NULL;
    return b;
}

/* The agent's reason for failing request slot idx (written before its cqe). */
static void agent_why(const coll_conn *c, uint32_t idx, char out[WIRE_WHY_MAX])
{
    memcpy(out, c->shm->why[idx], WIRE_WHY_MAX);
    out[WIRE_WHY_MAX - 1] = '\0'; /* whatever the agent left there */
}

/* Reap every completion the agent has posted; caller holds the lock. */
static void reap(coll_conn *c)
{
    uint32_t start = c->cq_head;
    for (;;) {
        struct wire_cqe *slot = &c->shm->cq[c->cq_head & RING_MASK];
        if (!ring_ready(&slot->seq, c->cq_head)) break;
        struct wire_cqe e;
        e.tag = slot->tag;
        e.status = slot->status;
        c->cq_head++;
        uint32_t idx = (uint32_t)(e.tag & 0xffffffffu) - 1;
        uint32_t gen = (uint32_t)(e.tag >> 32);
        if (idx < WIRE_RING_ENTRIES && c->reqs[idx].gen == gen &&
            c->reqs[idx].state == REQ_PENDING) {
            struct req *r = &c->reqs[idx];
            r->state = REQ_DONE;
            r->status = e.status;
            r->agent_failed = e.status != COLL_OK;
            if (r->sb) r->sb->inflight--;
            if (r->rb) r->rb->inflight--;
            r->sb = r->rb = NULL;
            if (r->detached) { /* its stream waits for it; nobody else will ask */
                if (e.status != COLL_OK && !c->stream_err) {
                    c->stream_err = (coll_err)e.status;
                    c->stream_err_group = r->group;
                    char why[WIRE_WHY_MAX];
                    agent_why(c, idx, why);
                    snprintf(c->stream_err_msg, sizeof(c->stream_err_msg),
                             "an op handed to a stream earlier failed (%s)%s%s",
                             coll_strerror((coll_err)e.status), why[0] ? ": " : "", why);
                }
                r->state = REQ_FREE;
                r->detached = 0;
                c->ndetached--;
                c->free_idx[c->nfree++] = idx;
            }
        }
    }
    if (c->cq_head != start) {
        ring_store_release(&c->shm->cq_head, c->cq_head);
        if (c->cv_waiters) pthread_cond_broadcast(&c->cv); /* some may be theirs */
    }
}

struct op_args {
    uint8_t kind;
    int dtype, redop; /* as the caller passed them: range-checked before they narrow */
    int32_t peer;
    uint64_t count;
    const void *send;
    void *recv;
    int send_used, recv_used; /* whether this rank reads send / writes recv */
    void *stream;
};

static coll_err resolve(coll_conn *c, const char *what, const void *p, uint64_t elems, size_t esize,
                        int used, coll_buffer **b, uint64_t *off, uint32_t *id)
{
    *b = NULL;
    *off = 0;
    *id = WIRE_BUF_NONE;
    if (!used || elems == 0) return COLL_OK;
    if (!p) return fail(COLL_ERR_INVALID, "%s buffer is NULL", what);
    if (elems > UINT64_MAX / esize) return fail(COLL_ERR_INVALID, "%s size overflows", what);
    coll_buffer *buf = find_buffer(c, p, elems * esize);
    if (!buf)
        return fail(COLL_ERR_INVALID,
                    "%s range %p + %llu bytes is not inside a buffer shared with the agent", what,
                    p, (unsigned long long)(elems * esize));
    *b = buf;
    *off = (uint64_t)((uintptr_t)p - (uintptr_t)buf->ptr);
    *id = buf->id;
    return COLL_OK;
}

static coll_err submit(coll_group *g, const struct op_args *a, coll_request *req)
{
    if (!g || !req) return fail(COLL_ERR_INVALID, "NULL group or request");
    req->id = 0;
    if ((unsigned)a->dtype >= COLL_DTYPE_COUNT)
        return fail(COLL_ERR_INVALID, "dtype %d out of range", a->dtype);
    if ((unsigned)a->redop >= COLL_REDOP_COUNT)
        return fail(COLL_ERR_INVALID, "reduction %d out of range", a->redop);
    if ((a->kind == WIRE_OP_BROADCAST || a->kind == WIRE_OP_REDUCE || a->kind == WIRE_OP_SEND ||
         a->kind == WIRE_OP_RECV) &&
        (a->peer < 0 || a->peer >= g->info.size))
        return fail(COLL_ERR_INVALID, "%s: rank %d is outside the group (size %d)",
                    wire_kind_name(a->kind), a->peer, g->info.size);
    coll_conn *c = g->conn;
    struct wire_sqe s = {.count = a->count,
                         .group = g->handle,
                         .epoch = g->info.epoch,
                         .kind = a->kind,
                         .dtype = (uint8_t)a->dtype,
                         .redop = (uint8_t)a->redop,
                         .peer = a->peer};
    size_t es = coll_dtype_size((coll_dtype)a->dtype);
    uint64_t selems, relems;
    if (wire_sqe_extent(&s, 0, (uint32_t)g->info.size, &selems) < 0 ||
        wire_sqe_extent(&s, 1, (uint32_t)g->info.size, &relems) < 0)
        return fail(COLL_ERR_INVALID, "count %llu overflows", (unsigned long long)a->count);
    coll_buffer *sb, *rb;
    int gpu = g->gpu;
    pthread_mutex_lock(&c->lock);
    coll_err rc;
    if (c->lost) {
        rc = fail(c->lost, "agent connection lost: %s", c->lost_msg);
        goto out;
    }
    if (c->stream_err) {
        rc = fail(c->stream_err, "%s", c->stream_err_msg);
        c->stream_err = COLL_OK;
        goto out;
    }
    if (c->nfree == 0) reap(c);
    if (c->nfree == 0 && c->ndetached > 0) {
        /* streams wait for some of the slots' ops and nobody else will: they free
         * themselves as they complete, so wait for one (bounded; before any buffer is
         * looked up, as the lock is let go meanwhile) */
        int64_t deadline = now_ns() + SLOT_WAIT_NS;
        while (c->nfree == 0 && !c->lost && now_ns() < deadline) {
            pthread_mutex_unlock(&c->lock);
            sleep_for_completion(c, deadline, (coll_request){0});
            pthread_mutex_lock(&c->lock);
            reap(c);
        }
        if (c->lost) {
            rc = fail(c->lost, "agent connection lost: %s", c->lost_msg);
            goto out;
        }
    }
    rc = resolve(c, "send", a->send, selems, es, a->send_used, &sb, &s.send_off, &s.send_buf);
    if (rc) goto out;
    rc = resolve(c, "recv", a->recv, relems, es, a->recv_used, &rb, &s.recv_off, &s.recv_buf);
    if (rc) goto out;
    if ((sb && (sb->device >= 0) != gpu) || (rb && (rb->device >= 0) != gpu)) {
        rc = fail(COLL_ERR_INVALID,
                  gpu ? "group '%s' runs on NCCL: its ops take GPU buffers (coll_mem_alloc with a "
                        "device, or coll_mem_register_cuda)"
                      : "group '%s' runs on the host backend: its ops take host buffers",
                  g->info.name);
        goto out;
    }
    if (c->nfree == 0) {
        rc =
            fail(COLL_ERR_LIMIT, "%d requests are pending: wait for some first", WIRE_RING_ENTRIES);
        goto out;
    }
    uint32_t idx = c->free_idx[c->nfree - 1];
    struct req *r = &c->reqs[idx];
    s.tag = ((uint64_t)(r->gen + 1) << 32) | (idx + 1);
    if (gpu) {
        /* the agent's stream starts the op once this stream has written ready */
        char why[160];
        rc = shm_for_gpu(c);
        if (rc) goto out;
        if (lcgpu_stream_idle(a->stream)) {
            /* nothing is pending on the stream: the op may start at once; saying so
             * from the CPU spares both streams a memory operation */
            atomic_store_explicit(&c->shm->ready[idx], s.tag, memory_order_release);
        } else {
            void *word = (char *)&c->shm->ready[idx] + c->shm_delta;
            if (lcgpu_write(a->stream, word, s.tag, why, sizeof(why)) < 0) {
                rc = fail(COLL_ERR_INVALID, "%s", why);
                goto out;
            }
        }
        s.flags |= WIRE_SQE_F_GPU;
    }
    c->nfree--;
    r->gen++;
    r->gpu = (uint8_t)gpu;
    r->detached = 0;
    r->group = g->handle;
    r->state = REQ_PENDING;
    r->status = COLL_OK;
    r->sb = sb;
    r->rb = rb;
    if (sb) sb->inflight++;
    if (rb) rb->inflight++;
    struct wire_sqe *slot = &c->shm->sq[c->sq_next & RING_MASK];
    memcpy(slot, &s, offsetof(struct wire_sqe, seq));
    ring_publish(&slot->seq, c->sq_next);
    c->sq_next++;
    /* on a small machine an op that crosses pods takes longer than a spin is worth:
     * sleep at once and leave the CPU to the agent's threads (measured: bench/RESULTS.md,
     * issue 3) */
    r->rang = g->info.nodes > 1 && !c->spin_set && c->few_cpus;
    if (ring_peer_sleeping(&c->shm->agent_sleeping)) {
        uint64_t one = 1;
        ssize_t w = write(c->efd_agent, &one, sizeof(one));
        (void)w;
        r->rang = 1;
    }
    req->id = s.tag;
out:
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int rank_of(const coll_group *g)
{
    return g ? g->info.rank : -1;
}

coll_err coll_allreduce(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                        coll_redop op, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_ALLREDUCE, dt, op, 0, count, send, recv, 1, 1};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_broadcast(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                        int root, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_BROADCAST, dt, 0, root, count, send, recv, rank_of(g) == root, 1};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_reduce(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                     coll_redop op, int root, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_REDUCE, dt, op, root, count, send, recv, 1, rank_of(g) == root};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_allgather(coll_group *g, const void *send, void *recv, size_t sendcount,
                        coll_dtype dt, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_ALLGATHER, dt, 0, 0, sendcount, send, recv, 1, 1};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_reduce_scatter(coll_group *g, const void *send, void *recv, size_t recvcount,
                             coll_dtype dt, coll_redop op, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_REDUCE_SCATTER, dt, op, 0, recvcount, send, recv, 1, 1};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_alltoall(coll_group *g, const void *send, void *recv, size_t count, coll_dtype dt,
                       void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_ALLTOALL, dt, 0, 0, count, send, recv, 1, 1};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_send(coll_group *g, const void *send, size_t count, coll_dtype dt, int peer,
                   void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_SEND, dt, 0, peer, count, send, NULL, 1, 0};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_recv(coll_group *g, void *recv, size_t count, coll_dtype dt, int peer, void *stream,
                   coll_request *req)
{
    struct op_args a = {WIRE_OP_RECV, dt, 0, peer, count, NULL, recv, 0, 1};
    a.stream = stream;
    return submit(g, &a, req);
}

coll_err coll_barrier(coll_group *g, void *stream, coll_request *req)
{
    struct op_args a = {WIRE_OP_BARRIER, 0, 0, 0, 0, NULL, NULL, 0, 0};
    a.stream = stream;
    return submit(g, &a, req);
}

/* ---- completion ------------------------------------------------------------------ */

/* The request's slot if req is live; caller holds the lock. */
static struct req *lookup(coll_conn *c, coll_request req)
{
    uint32_t idx = (uint32_t)(req.id & 0xffffffffu) - 1;
    uint32_t gen = (uint32_t)(req.id >> 32);
    if (idx >= WIRE_RING_ENTRIES) return NULL;
    struct req *r = &c->reqs[idx];
    if (r->gen != gen || r->state == REQ_FREE) return NULL;
    return r;
}

static coll_err consume(coll_conn *c, struct req *r)
{
    coll_err st = (coll_err)r->status;
    r->state = REQ_FREE;
    c->free_idx[c->nfree++] = (uint32_t)(r - c->reqs);
    if (st != COLL_OK) {
        char why[WIRE_WHY_MAX] = "";
        if (r->agent_failed) agent_why(c, (uint32_t)(r - c->reqs), why);
        if (st == COLL_ERR_AGENT_LOST || st == COLL_ERR_PROTOCOL)
            fail(st, "agent connection lost: %s", c->lost_msg);
        else if (why[0])
            fail(st, "the agent failed the op (%s): %s", coll_strerror(st), why);
        else
            fail(st, "the agent failed the op: %s", coll_strerror(st));
    }
    return st;
}

/* Non-blocking look: 1 and *st if done (consumed), 0 if pending, -1 if unknown. */
static int try_complete(coll_conn *c, coll_request req, coll_err *st)
{
    pthread_mutex_lock(&c->lock);
    struct req *r = lookup(c, req);
    if (!r) {
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    if (r->state == REQ_PENDING && !c->lost) reap(c);
    int done = r->state == REQ_DONE;
    if (done) *st = consume(c, r);
    pthread_mutex_unlock(&c->lock);
    return done;
}

/* Another thread is the poller: sleep until it reaps something, leaves, or the
 * deadline (0: none) passes. Caller holds the lock; returns with it held. */
static void follow(coll_conn *c, int64_t deadline)
{
    c->cv_waiters++;
    if (deadline > 0) {
        struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
        pthread_cond_timedwait(&c->cv, &c->lock, &ts);
    } else {
        pthread_cond_wait(&c->cv, &c->lock);
    }
    c->cv_waiters--;
}

/* Whether a wait for req (id 0: for a free request slot) is over; caller holds the lock. */
static int wait_over(coll_conn *c, coll_request req)
{
    if (c->lost) return 1;
    if (req.id == 0) return c->nfree > 0;
    struct req *r = lookup(c, req);
    return !r || r->state != REQ_PENDING;
}

/* Sleep until the agent posts a completion, the socket says something, or the
 * deadline passes, unless the wait for req (id 0: a free request slot) is over already.
 * Detects a lost agent. One thread at a time sleeps on the doorbell and reaps for all;
 * the others follow it (see struct coll_conn). Every check of req is made under the
 * lock that reaping holds, after this thread is counted as sleeping: a completion
 * reaped by another thread is seen, and one not yet posted rings the doorbell. */
static void sleep_for_completion(coll_conn *c, int64_t deadline, coll_request req)
{
    pthread_mutex_lock(&c->lock);
    if (wait_over(c, req)) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    if (c->poller) {
        follow(c, deadline);
        pthread_mutex_unlock(&c->lock);
        return;
    }
    c->poller = 1;
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_add(&c->shm->client_sleeping.v, 1);
    ring_full_fence();
    pthread_mutex_lock(&c->lock);
    int skip = wait_over(c, req) || ring_ready(&c->shm->cq[c->cq_head & RING_MASK].seq, c->cq_head);
    pthread_mutex_unlock(&c->lock);
    if (!skip) {
        int ms = -1;
        if (deadline > 0) {
            int64_t left = deadline - now_ns();
            ms = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
        }
        struct epoll_event evs[2];
        int r = epoll_wait(c->epfd, evs, 2, ms);
        int sock = 0;
        for (int i = 0; i < r; i++)
            sock |= evs[i].data.fd == c->fd;
        if (sock) {
            /* the agent only speaks unprompted when it drops us */
            char buf[WIRE_MAX_MSG];
            union wire_msg m;
            pthread_mutex_lock(&c->lock);
            ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                reap(c);
                mark_lost(c, COLL_ERR_AGENT_LOST, "agent closed the connection");
            } else if (n > 0) {
                char err[128];
                reap(c);
                if (wire_decode(buf, (size_t)n, &m, NULL, err, sizeof(err)) == 0 &&
                    m.h.type == WIRE_ERROR)
                    mark_lost(c,
                              m.error.code == COLL_ERR_SHUTDOWN ? COLL_ERR_SHUTDOWN
                                                                : COLL_ERR_AGENT_LOST,
                              m.error.msg);
                else
                    mark_lost(c, COLL_ERR_PROTOCOL, "unexpected message from the agent");
            }
            pthread_mutex_unlock(&c->lock);
        }
    }
    atomic_fetch_sub(&c->shm->client_sleeping.v, 1);
    pthread_mutex_lock(&c->lock);
    if (!c->lost) reap(c); /* what woke us may be another thread's */
    c->poller = 0;
    if (c->cv_waiters) pthread_cond_broadcast(&c->cv); /* one of them takes over */
    pthread_mutex_unlock(&c->lock);
}

coll_err coll_wait(coll_conn *c, coll_request req, int timeout_ms)
{
    if (!c) return fail(COLL_ERR_INVALID, "NULL connection");
    coll_err st;
    int r = try_complete(c, req, &st);
    if (r < 0) return fail(COLL_ERR_INVALID, "unknown or already completed request");
    if (r > 0) return st;
    int64_t start = now_ns();
    int64_t deadline = timeout_ms >= 0 ? start + (int64_t)timeout_ms * 1000000 : 0;
    /* An agent that had to be woken for this op needs tens of microseconds; giving it
     * this CPU (sleeping at once) beats spinning against it on a small machine. */
    pthread_mutex_lock(&c->lock);
    struct req *rq = lookup(c, req);
    int rang = rq && rq->rang;
    pthread_mutex_unlock(&c->lock);
    int64_t spin_until = start + (rang ? 0 : (int64_t)c->spin_us * 1000);
    for (;;) {
        int64_t t = now_ns();
        if (t < spin_until) {
            /* pause briefly; past that, yield, so that on a machine with fewer CPUs than
             * busy processes the partners (and the agent) get to run */
            if (t - start < SPIN_PAUSE_NS)
                ring_cpu_relax();
            else
                sched_yield();
        } else {
            sleep_for_completion(c, deadline, req);
        }
        r = try_complete(c, req, &st);
        if (r != 0) return r > 0 ? st : fail(COLL_ERR_INVALID, "request vanished");
        if (deadline && now_ns() >= deadline)
            return fail(COLL_ERR_TIMEOUT, "request still pending after %d ms", timeout_ms);
    }
}

coll_err coll_test(coll_conn *c, coll_request req, int *done)
{
    if (!c || !done) return fail(COLL_ERR_INVALID, "NULL argument");
    coll_err st = COLL_OK;
    int r = try_complete(c, req, &st);
    if (r < 0) return fail(COLL_ERR_INVALID, "unknown or already completed request");
    *done = r;
    return r ? st : COLL_OK;
}

coll_err coll_wait_stream(coll_conn *c, coll_request req, void *stream)
{
    if (!c) return fail(COLL_ERR_INVALID, "NULL connection");
    pthread_mutex_lock(&c->lock);
    struct req *r = lookup(c, req);
    coll_err rc = COLL_OK;
    if (!r || r->detached) {
        rc = fail(COLL_ERR_INVALID, "unknown or already completed request");
    } else if (!r->gpu) {
        rc = fail(COLL_ERR_INVALID, "not a GPU op: wait for it with coll_wait");
    } else {
        uint32_t idx = (uint32_t)(r - c->reqs);
        char why[160];
        void *word = (char *)&c->shm->done[idx] + c->shm_delta;
        if (lcgpu_wait(stream, word, req.id, why, sizeof(why)) < 0) {
            rc = fail(COLL_ERR_INVALID, "%s", why);
        } else if (r->state == REQ_DONE) {
            rc = consume(c, r); /* the stream passes at once */
        } else {
            r->detached = 1;
            c->ndetached++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

coll_err coll_wait_all(coll_conn *c, coll_request *reqs, size_t n, int timeout_ms)
{
    if (!c || (n && !reqs)) return fail(COLL_ERR_INVALID, "NULL argument");
    coll_err first = COLL_OK;
    int64_t deadline = timeout_ms >= 0 ? now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    for (size_t i = 0; i < n; i++) {
        int left = -1;
        if (deadline) {
            int64_t l = deadline - now_ns();
            left = l <= 0 ? 0 : (int)(l / 1000000);
        }
        coll_err st = coll_wait(c, reqs[i], left);
        if (st == COLL_ERR_TIMEOUT && deadline && now_ns() >= deadline) return st;
        if (st != COLL_OK && first == COLL_OK) first = st;
    }
    if (first != COLL_OK) fail(first, "at least one op failed: %s", coll_strerror(first));
    return first;
}
