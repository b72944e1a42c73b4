/*
 * conn.c: the connection to the agent: errors, socket messages and their
 * exchange, the handshake (checking who serves the socket). Groups are groups.c's, above
 * this file: it calls lc_rpc and lc_fail here, nothing here calls it.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "lc.h"

/* ---- errors ---------------------------------------------------------------- */

static __thread char last_error[256];

coll_err lc_fail(coll_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
coll_err lc_fail(coll_err e, const char *fmt, ...)
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

int lc_env_int(const char *name, int def)
{
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    long v = strtol(s, &end, 10);
    return *end ? def : (int)v;
}

/* ---- completions -------------------------------------------------------------- */

/* The agent's reason for failing request slot idx (written before its cqe). */
void lc_agent_why(const coll_conn *c, uint32_t idx, char out[WIRE_WHY_MAX])
{
    memcpy(out, c->shm->why[idx], WIRE_WHY_MAX);
    out[WIRE_WHY_MAX - 1] = '\0'; /* whatever the agent left there */
}

/* Reap every completion the agent has posted; caller holds the lock. */
void lc_reap(coll_conn *c)
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
                    lc_agent_why(c, idx, why);
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
static ssize_t recv_msg(int fd, void *buf, size_t cap, int *fds, int maxfds, int *nfds,
                        int64_t deadline)
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
            char b[CMSG_SPACE(WIRE_LEASE_MAX_FDS * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n < 0) return -1;
        *nfds = wire_take_fds(&mh, fds, maxfds); /* any beyond are closed */
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

coll_err lc_goodbye(coll_conn *c)
{
    /* a reset is reported once, ahead of what is still queued (the agent hung up with
     * a request of ours unread): look past it */
    for (int i = 0; i < 4; i++) {
        char buf[WIRE_MAX_MSG], err[160];
        union wire_msg m;
        ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) continue; /* the reset */
        if (n <= 0) return COLL_OK;
        if (wire_decode(buf, (size_t)n, &m, NULL, err, sizeof(err)) == 0 &&
            m.h.type == WIRE_ERROR && m.error.code != COLL_OK &&
            coll_strerror((coll_err)m.error.code)) {
            coll_err code = (coll_err)m.error.code;
            lc_mark_lost(c, code == COLL_ERR_SHUTDOWN ? COLL_ERR_SHUTDOWN : COLL_ERR_AGENT_LOST,
                         m.error.msg);
            return code;
        }
    }
    return COLL_OK;
}

coll_err lc_fail_lost(const coll_conn *c)
{
    if (c->lost == COLL_ERR_SHUTDOWN) return lc_fail(c->lost, "the agent stopped: %s", c->lost_msg);
    return lc_fail(c->lost, "agent connection lost: %s", c->lost_msg);
}

void lc_mark_lost(coll_conn *c, coll_err why, const char *msg)
{
    if (c->lost) return;
    c->lost = why;
    snprintf(c->lost_msg, sizeof(c->lost_msg), "%s", msg);
    release_streams(c);
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++) {
        struct req *r = &c->reqs[i];
        if (r->state == REQ_PENDING && !r->direct) { /* direct ops end on their sockets */
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
 * fds: room for *nfds descriptors (NULL: none expected), and on return how many came.
 */
coll_err lc_rpc(coll_conn *c, union wire_msg *m, int pass_fd, unsigned reply_type,
                union wire_msg *reply, int *fds, int *nfds)
{
    int dummy_fds[1], dummy_n;
    if (!fds) {
        fds = dummy_fds;
        nfds = &dummy_n;
        dummy_n = 0;
    }
    int maxfds = *nfds;
    *nfds = 0;
    if (c->lost) return lc_fail_lost(c);
    m->h.req_id = ++c->rpc_id;
    if (send_msg(c->fd, m, pass_fd) < 0) {
        /* an agent that refuses us (credentials, limits) says why, then hangs up */
        int e = errno;
        coll_err code = lc_goodbye(c);
        if (code != COLL_OK) return lc_fail(code, "agent: %s", c->lost_msg);
        errno = e;
        lc_mark_lost(c, COLL_ERR_AGENT_LOST, "send to agent failed");
        return lc_fail(COLL_ERR_AGENT_LOST, "sending to the agent: %s", strerror(errno));
    }
    char buf[WIRE_MAX_MSG];
    int64_t deadline = now_ns() + (int64_t)c->timeout_ms * 1000000;
    ssize_t n = recv_msg(c->fd, buf, sizeof(buf), fds, maxfds, nfds, deadline);
    if (n <= 0) {
        int e = errno;
        if (e != ETIMEDOUT && lc_goodbye(c) != COLL_OK) return lc_fail_lost(c);
        lc_mark_lost(c, COLL_ERR_AGENT_LOST, n == 0 ? "agent closed the connection" : strerror(e));
        if (n < 0 && e == ETIMEDOUT)
            return lc_fail(COLL_ERR_TIMEOUT, "no reply from the agent within %d ms", c->timeout_ms);
        return lc_fail(COLL_ERR_AGENT_LOST, "agent closed the connection");
    }
    char err[160];
    if (wire_decode(buf, (size_t)n, reply, NULL, err, sizeof(err)) < 0) {
        close_fds(fds, *nfds);
        *nfds = 0;
        lc_mark_lost(c, COLL_ERR_PROTOCOL, err);
        return lc_fail(COLL_ERR_PROTOCOL, "bad reply from the agent: %s", err);
    }
    if (reply->h.type == WIRE_ERROR) {
        close_fds(fds, *nfds);
        *nfds = 0;
        coll_err code = (coll_err)reply->error.code;
        if (code == COLL_OK || !coll_strerror(code)) code = COLL_ERR_PROTOCOL;
        if (reply->h.req_id == 0) /* not an answer: the agent's goodbye before it hangs up */
            lc_mark_lost(c, code == COLL_ERR_SHUTDOWN ? COLL_ERR_SHUTDOWN : COLL_ERR_AGENT_LOST,
                         reply->error.msg);
        return lc_fail(code, "agent: %s", reply->error.msg);
    }
    if (reply->h.type != reply_type || reply->h.req_id != m->h.req_id) {
        close_fds(fds, *nfds);
        *nfds = 0;
        lc_mark_lost(c, COLL_ERR_PROTOCOL, "unexpected reply");
        return lc_fail(COLL_ERR_PROTOCOL, "agent replied with type %u to request %u", reply->h.type,
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
    if (!out) return lc_fail(COLL_ERR_INVALID, "out is NULL");
    *out = NULL;
    if (!socket_path) socket_path = getenv("COLL_AGENT_SOCKET");
    if (!socket_path || !*socket_path) socket_path = DEFAULT_SOCKET;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof(sa.sun_path))
        return lc_fail(COLL_ERR_INVALID, "socket path '%s' is too long", socket_path);
    strcpy(sa.sun_path, socket_path);

    coll_conn *c = calloc(1, sizeof(*c));
    if (!c) return lc_fail(COLL_ERR_NOMEM, "allocating the connection");
    c->fd = c->efd_agent = c->efd_client = c->epfd = -1;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
    c->spin_us = lc_env_int("COLL_SPIN_US", DEFAULT_SPIN_US);
    c->spin_set = lc_env_int("COLL_SPIN_US", -1) >= 0;
    spin_init(&c->spin, c->spin_us > 0 ? c->spin_us * 1000 : 0);
    c->few_cpus = coll_usable_cpus() < SPIN_MIN_CPUS;
    coll_affinity(&c->cpus);
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
        rc = lc_fail(COLL_ERR_SYSTEM, "socket: %s", strerror(errno));
        goto fail_conn;
    }
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = lc_fail(COLL_ERR_CONNECT, "connect to %s: %s", socket_path, strerror(errno));
        goto fail_conn;
    }
    struct ucred cred;
    socklen_t credlen = sizeof(cred);
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) < 0) {
        rc = lc_fail(COLL_ERR_CONNECT, "who serves %s: %s", socket_path, strerror(errno));
        goto fail_conn;
    }
    if (!agent_uid_allowed(cred.uid)) {
        rc = lc_fail(COLL_ERR_CONNECT,
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
    int fds[3], nfds = 3;
    rc = lc_rpc(c, &m, -1, WIRE_HELLO_OK, &reply, fds, &nfds);
    if (rc != COLL_OK) goto fail_conn;
    if (nfds != 3) {
        close_fds(fds, nfds);
        rc = lc_fail(COLL_ERR_PROTOCOL, "handshake carried %d descriptors, expected 3", nfds);
        goto fail_conn;
    }
    c->efd_agent = fds[1];
    c->efd_client = fds[2];
    c->agent_gpu = (reply.hello_ok.flags & WIRE_HELLO_F_GPU) != 0;
    /* COLL_DIRECT: 0 none, 1 (the default) tiny ops, "all" every collective */
    const char *dv = getenv("COLL_DIRECT");
    c->direct_all = dv && strcmp(dv, "all") == 0;
    c->direct_wait_ns = (int64_t)lc_env_int("COLL_DIRECT_WAIT_MS", 0) * 1000000;
    c->agent_lease = (reply.hello_ok.flags & WIRE_HELLO_F_LEASE) != 0 &&
                     reply.hello_ok.shm_size >= sizeof(struct wire_shm) &&
                     (c->direct_all || lc_env_int("COLL_DIRECT", 1));
    c->agent_any = reply.hello_ok.shm_size >= sizeof(struct wire_shm);
    c->agent_noack = (reply.hello_ok.flags & WIRE_HELLO_F_NOACK) != 0;
    c->agent_sig = (reply.hello_ok.flags & WIRE_HELLO_F_SIG) != 0;
    struct stat st;
    if (fstat(fds[0], &st) < 0 || (uint64_t)st.st_size < reply.hello_ok.shm_size ||
        reply.hello_ok.shm_size < WIRE_SHM_MIN ||
        reply.hello_ok.ring_entries != WIRE_RING_ENTRIES) {
        close(fds[0]);
        rc = lc_fail(COLL_ERR_PROTOCOL, "handshake: shared region of the wrong size or shape");
        goto fail_conn;
    }
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = c->efd_client};
    if (c->epfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->efd_client, &ev) < 0) {
        close(fds[0]);
        rc = lc_fail(COLL_ERR_SYSTEM, "epoll: %s", strerror(errno));
        goto fail_conn;
    }
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = c->fd};
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
        close(fds[0]);
        rc = lc_fail(COLL_ERR_SYSTEM, "epoll: %s", strerror(errno));
        goto fail_conn;
    }
    c->shm_size = reply.hello_ok.shm_size;
    c->shm = mmap(NULL, c->shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    close(fds[0]);
    if (c->shm == MAP_FAILED) {
        c->shm = NULL;
        rc = lc_fail(COLL_ERR_SYSTEM, "mapping the rings: %s", strerror(errno));
        goto fail_conn;
    }
    if (c->shm->magic != WIRE_MAGIC || c->shm->version != WIRE_VERSION ||
        c->shm->entries != WIRE_RING_ENTRIES) {
        rc = lc_fail(COLL_ERR_PROTOCOL, "handshake: shared region has a bad header");
        goto fail_conn;
    }
    /* where we run, before any op: the agent spins for our ops only while we are off its
     * CPUs (agent/engine.c, engine_spin_cap) */
    ring_say_cpu(&c->shm->client_sleeping, sched_getcpu());
    *out = c;
    return COLL_OK;
fail_conn: /* no buffers, no groups yet */
    lc_conn_hang_up(c);
    lc_conn_free(c);
    return rc;
}

void lc_conn_hang_up(coll_conn *c)
{
    if (c->fd >= 0) close(c->fd); /* the agent tears the session down on hang-up */
    if (c->efd_agent >= 0) close(c->efd_agent);
    if (c->efd_client >= 0) close(c->efd_client);
    if (c->epfd >= 0) close(c->epfd);
    c->fd = c->efd_agent = c->efd_client = c->epfd = -1;
    /* A stream may still wait on the region's words: release them and keep the
     * region mapped (and registered) for the life of the process. */
    release_streams(c);
    if (c->shm && !c->shm_gpu) munmap(c->shm, c->shm_size);
    c->shm = NULL;
}

void lc_conn_free(coll_conn *c)
{
    free(c->sops);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cv);
    free(c);
}
