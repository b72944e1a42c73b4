/*
 * session.c: one client's control messages (handshake, groups, buffers, leases) and
 * what it holds; its submission ring is session_ops.c's. Everything the client wrote
 * is copied out before it is checked, and every check that fails is a protocol
 * violation that ends this session only.
 */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "coll/coll.h"
#include "gpu.h"
#include "log.h"
#include "ring.h"
#include "util.h"

/* SESSION_BUF_PENDING (session.h) points here */
struct buffer session_pending_marker;

struct session *session_new(struct session_env *env, int fd, pid_t pid, uid_t uid, gid_t gid)
{
    struct session *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->env = env;
    s->fd = fd;
    s->efd_agent = s->efd_client = -1;
    s->hello_memfd = -1;
    s->pid = pid;
    s->uid = uid;
    s->gid = gid;
    s->id = ++env->next_id;
    s->handshake_deadline_ns = now_ns() + env->cfg->agent.handshake_timeout_ms * NS_PER_MS;
    s->ev_sock.s = s;
    s->ev_bell.s = s;
    return s;
}

void session_destroy(struct session **sp)
{
    if (!sp || !*sp) return;
    struct session *s = *sp;
    *sp = NULL;
    s->state = SESSION_DEAD; /* completions from here on are dropped */
    for (int h = 0; h < SESSION_MAX_HANDLES; h++) {
        if (s->handles[h].g) {
            group_detach(s->handles[h].g, s->handles[h].slot);
            s->handles[h].g = NULL;
        }
        free(s->handles[h].premul);
        s->handles[h].premul = NULL;
    }
    /* ops lent to the net thread outlive us: they must not complete to freed memory */
    for (int i = 0; i < s->env->ngroups; i++)
        group_forget_session(&s->env->groups[i], s);
    for (uint32_t i = 0; i < s->nbufs; i++)
        if (s->bufs[i] != SESSION_BUF_PENDING) buffer_unref(&s->bufs[i]);
    free(s->bufs);
    if (s->hello_memfd >= 0) close(s->hello_memfd);
    /* GPU ops in flight keep the region (their streams use its words) */
    if (s->shm_buf) {
        atomic_store(&s->shm_buf->gone, 1);
        buffer_unref(&s->shm_buf);
    } else if (s->shm) {
        munmap(s->shm, s->shm_size);
    }
    /* the client holds duplicates of the doorbell: closing ours alone would leave it
     * in the epoll set, so remove it first */
    if (s->efd_agent >= 0) epoll_ctl(s->env->epfd, EPOLL_CTL_DEL, s->efd_agent, NULL);
    if (s->fd >= 0) epoll_ctl(s->env->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    if (s->efd_agent >= 0) close(s->efd_agent);
    if (s->efd_client >= 0) close(s->efd_client);
    if (s->fd >= 0) close(s->fd);
    free(s);
}

/* ---- handshake ---------------------------------------------------------------- */

/* Send HELLO_OK with the region and both doorbells; memfd is closed. */
static int hello_reply(struct session *s, uint64_t req_id, int memfd)
{
    union wire_msg m;
    wire_init(&m, WIRE_HELLO_OK, req_id);
    m.hello_ok.session_id = s->id;
    m.hello_ok.shm_size = s->shm_size;
    m.hello_ok.ring_entries = WIRE_RING_ENTRIES;
    m.hello_ok.flags = (s->env->gpu ? WIRE_HELLO_F_GPU : 0u) |
                       (s->env->cfg->agent.direct_ops ? WIRE_HELLO_F_LEASE : 0u) |
                       WIRE_HELLO_F_NOACK | WIRE_HELLO_F_SIG;
    snprintf(m.hello_ok.agent_version, sizeof(m.hello_ok.agent_version), "%s", coll_version());
    int fds[3] = {memfd, s->efd_agent, s->efd_client};
    int rc = session_reply(s, &m, fds, 3);
    close(memfd);
    if (rc < 0) return session_violation(s, "cannot answer the handshake: %s", strerror(errno));
    s->state = SESSION_READY;
    log_msg(LOG_INFO, "session.ready", "session=%llu pid=%d uid=%u gid=%u client=\"%s\" gpu=%s",
            (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid, (unsigned)s->gid,
            LOG_Q(s->client), s->shm_gpu > 0 ? "yes" : "no");
    return 0;
}

static int on_hello(struct session *s, const struct wire_hello *h)
{
    snprintf(s->client, sizeof(s->client), "%s", h->client);
    int memfd = memfd_create("coll-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd < 0)
        return session_violation(s, "agent cannot create the rings: %s", strerror(errno));
    s->shm_size = (sizeof(struct wire_shm) + 4095) & ~(size_t)4095;
    int err = 0;
    if (ftruncate(memfd, (off_t)s->shm_size) < 0 ||
        fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        err = errno;
    if (!err) {
        s->shm = mmap(NULL, s->shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (s->shm == MAP_FAILED) {
            s->shm = NULL;
            err = errno;
        }
    }
    s->efd_agent = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->efd_client = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!err && (s->efd_agent < 0 || s->efd_client < 0)) err = errno;
    if (err) {
        close(memfd);
        return session_violation(s, "agent cannot set up the session: %s", strerror(err));
    }
    s->shm->magic = WIRE_MAGIC;
    s->shm->version = WIRE_VERSION;
    s->shm->entries = WIRE_RING_ENTRIES;
    s->shm_buf = calloc(1, sizeof(*s->shm_buf));
    if (!s->shm_buf) {
        close(memfd);
        return session_violation(s, "agent out of memory");
    }
    s->shm_buf->refs = 1;
    s->shm_buf->device = -1;
    s->shm_buf->map = s->shm;
    s->shm_buf->size = s->shm_size;
    /* edge-triggered: every write is an edge, so the doorbell never needs draining */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = &s->ev_bell};
    if (epoll_ctl(s->env->epfd, EPOLL_CTL_ADD, s->efd_agent, &ev) < 0) {
        close(memfd);
        return session_violation(s, "agent cannot watch the doorbell: %s", strerror(errno));
    }
    if (!s->env->gpu) return hello_reply(s, h->h.req_id, memfd);
    /* GPU agent: the region's words are the stream order of GPU ops, so CUDA maps it
     * before the client may submit one; the worker does that and HELLO_OK waits */
    struct gpu_job *j = calloc(1, sizeof(*j));
    if (!j) {
        close(memfd);
        return session_violation(s, "agent out of memory");
    }
    j->type = GPU_JOB_REGISTER;
    j->session = s->id;
    j->req_id = h->h.req_id;
    j->fd = -1;
    j->hold = buffer_ref(s->shm_buf);
    s->hello_memfd = memfd;
    s->hello_req = h->h.req_id;
    gpu_job_submit(s->env->gpu, j);
    return 0;
}

/* ---- requests ------------------------------------------------------------------- */

static int reply_opened(struct session *s, uint32_t req_id, int h);

static int on_group_open(struct session *s, const struct wire_group_open *o)
{
    struct group *g = group_find(s->env->groups, s->env->ngroups, o->name);
    if (!g)
        return session_refuse(s, o->h.req_id, COLL_ERR_NOT_FOUND, "no group named '%s'", o->name);
    if (!g->be)
        return session_refuse(s, o->h.req_id, COLL_ERR_UNSUPPORTED,
                              "group '%s' cannot run here: %s", o->name, g->backend_why);
    int h = 0;
    while (h < SESSION_MAX_HANDLES && s->handles[h].g)
        h++;
    if (h == SESSION_MAX_HANDLES)
        return session_refuse(s, o->h.req_id, COLL_ERR_LIMIT, "a session holds at most %d groups",
                              SESSION_MAX_HANDLES);
    if (o->op_ms > WIRE_OP_MS_MAX)
        return session_refuse(s, o->h.req_id, COLL_ERR_INVALID, "op timeout %u ms: at most %u",
                              o->op_ms, WIRE_OP_MS_MAX);
    if (o->slot < -1 || o->slot >= g->nslots)
        return session_refuse(s, o->h.req_id, COLL_ERR_INVALID,
                              "slot %d: group '%s' has slots 0..%d", o->slot, o->name,
                              g->nslots - 1);
    int want = o->slot;
    if (o->rank != -1) { /* a rank: the slot that gives it here */
        int lo = g->node_index * g->nslots;
        if (o->rank < -1 || o->rank >= g->size || o->slot != -1)
            return session_refuse(s, o->h.req_id, COLL_ERR_INVALID,
                                  "rank %d (slot %d): group '%s' has ranks 0..%d, and a rank "
                                  "excludes a slot",
                                  o->rank, o->slot, o->name, g->size - 1);
        if (o->rank < lo || o->rank >= lo + g->nslots)
            return session_refuse(
                s, o->h.req_id, COLL_ERR_NOT_FOUND,
                "rank %d of group '%s' is another pod's: this pod (node index %d) "
                "holds ranks %d..%d",
                o->rank, o->name, g->node_index, lo, lo + g->nslots - 1);
        want = o->rank - lo;
    }
    int slot = group_attach(g, s, want);
    if (slot < 0)
        return session_refuse(s, o->h.req_id, -slot, "group '%s': %s", o->name,
                              want < 0 ? "every slot is taken" : "slot is taken");
    s->handles[h] =
        (struct session_handle){.g = g,
                                .slot = slot,
                                .epoch = g->epoch,
                                .op_ms = o->op_ms ? (int)o->op_ms : g->cfg->op_timeout_ms};
    return reply_opened(s, o->h.req_id, h);
}

/* The reply to an open or a create: the handle and what the client shows of it. */
static int reply_opened(struct session *s, uint32_t req_id, int h)
{
    const struct group *g = s->handles[h].g;
    int slot = s->handles[h].slot;
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_OPEN_OK, req_id);
    m.group_open_ok.handle = (uint32_t)h;
    m.group_open_ok.epoch = g->epoch; /* the agent's own: ring entries carry it */
    m.group_open_ok.rank = (uint32_t)group_slot_rank(g, slot);
    m.group_open_ok.size = (uint32_t)g->size;
    m.group_open_ok.local_slot = (uint32_t)slot;
    m.group_open_ok.local_slots = (uint32_t)g->nslots;
    m.group_open_ok.node_index = (uint32_t)g->node_index;
    m.group_open_ok.nodes = (uint32_t)g->nodes;
    snprintf(m.group_open_ok.backend, sizeof(m.group_open_ok.backend), "%s", g->be->name);
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

/* coll_group_create: a child of the group open on handle parent (group_child.c). */
static int on_group_create(struct session *s, const struct wire_group_create *q)
{
    if (q->parent >= SESSION_MAX_HANDLES || !s->handles[q->parent].g)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "no open group with handle %u",
                              q->parent);
    struct session_handle *ph = &s->handles[q->parent];
    struct group *p = ph->g;
    if (ph->epoch != p->epoch)
        return session_refuse(s, q->h.req_id, COLL_ERR_EPOCH,
                              "group '%s' was re-formed since this handle was opened: reopen it",
                              p->cfg->name);
    if (q->op_ms > WIRE_OP_MS_MAX)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "op timeout %u ms: at most %u",
                              q->op_ms, WIRE_OP_MS_MAX);
    int h = 0;
    while (h < SESSION_MAX_HANDLES && s->handles[h].g)
        h++;
    if (h == SESSION_MAX_HANDLES)
        return session_refuse(s, q->h.req_id, COLL_ERR_LIMIT, "a session holds at most %d groups",
                              SESSION_MAX_HANDLES);
    int slot = 0, err = 0;
    char why[WIRE_ERRMSG_MAX - 32];
    struct group *c = group_child_join(p, q->ranks, (int)q->n, group_slot_rank(p, ph->slot), s,
                                       &slot, &err, why, sizeof(why));
    if (!c)
        return session_refuse(s, q->h.req_id, err, "a child of group '%s': %s", p->cfg->name, why);
    s->handles[h] = (struct session_handle){
        .g = c, .slot = slot, .epoch = c->epoch, .op_ms = q->op_ms ? (int)q->op_ms : ph->op_ms};
    return reply_opened(s, q->h.req_id, h);
}

static int on_group_close(struct session *s, const struct wire_group_close *c)
{
    if (c->handle >= SESSION_MAX_HANDLES || !s->handles[c->handle].g)
        return session_refuse(s, c->h.req_id, COLL_ERR_INVALID, "no open group with handle %u",
                              c->handle);
    struct session_handle *h = &s->handles[c->handle];
    group_detach(h->g, h->slot);
    h->g = NULL;
    free(h->premul);
    h->premul = NULL;
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_CLOSE_OK, c->h.req_id);
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

static int reply_buf(struct session *s, uint64_t req_id, uint32_t i)
{
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG_OK, req_id);
    m.mem_reg_ok.buf_id = i + 1;
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

/* A premultiplied sum's slot of a handle: checked whole before it is stored; a slot is
 * set once (the client hands out a pair it set again), so a ring entry written before a
 * set never meets a value written after it. */
static int on_redop_set(struct session *s, const struct wire_redop_set *q)
{
    if (q->handle >= SESSION_MAX_HANDLES || !s->handles[q->handle].g)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "no open group with handle %u",
                              q->handle);
    struct session_handle *h = &s->handles[q->handle];
    size_t es = q->dtype < COLL_DTYPE_COUNT ? coll_dtype_size((coll_dtype)q->dtype) : 0;
    if (q->slot >= WIRE_PREMUL_SLOTS)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "premultiplied sum slot %u of %u",
                              q->slot, WIRE_PREMUL_SLOTS);
    if (!es || !wire_redop_fits(WIRE_OP_ALLREDUCE, q->dtype, WIRE_REDOP_PREMUL))
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "a premultiplied sum of dtype %u",
                              q->dtype);
    if (es < 8 && (q->scalar >> (8 * es)) != 0)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID,
                              "scalar 0x%llx has bits past its %zu-byte dtype",
                              (unsigned long long)q->scalar, es);
    if (h->premul && h->premul[q->slot].set)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "premultiplied sum slot %u is set",
                              q->slot);
    if (!h->premul) {
        h->premul = calloc(WIRE_PREMUL_SLOTS, sizeof(*h->premul));
        if (!h->premul)
            return session_refuse(s, q->h.req_id, COLL_ERR_NOMEM,
                                  "no memory for premultiplied sums");
    }
    h->premul[q->slot] =
        (struct session_premul){.set = 1, .dtype = (uint8_t)q->dtype, .scalar = q->scalar};
    union wire_msg m;
    wire_init(&m, WIRE_REDOP_SET_OK, q->h.req_id);
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

static int on_group_state(struct session *s, const struct wire_group_state *q)
{
    if (q->handle >= SESSION_MAX_HANDLES || !s->handles[q->handle].g)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "no open group with handle %u",
                              q->handle);
    struct group *g = s->handles[q->handle].g;
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_STATE_OK, q->h.req_id);
    int formed = 0;
    group_state(g, &formed, &m.group_state_ok.epoch, m.group_state_ok.detail,
                sizeof(m.group_state_ok.detail));
    m.group_state_ok.formed = (uint32_t)formed;
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

/* ---- direct ops: lending a group's connections (net.h: net_lend) ------------------- */

void session_lease_void(struct session *s, uint64_t lease_id, int code, const char *why)
{
    if (!s->shm) return;
    s->shm->lease_end.lease_id = lease_id;
    s->shm->lease_end.code = code;
    snprintf(s->shm->lease_end.why, sizeof(s->shm->lease_end.why), "%s", why ? why : "");
    atomic_fetch_add_explicit(&s->shm->lease_void, 1, memory_order_release);
}

void session_lease_recall(struct session *s, uint32_t handle)
{
    /* bump drain, then look at busy (session_lease_busy); the client stores busy, then
     * looks at drain: the handshake of an epoch that ends for a pod that left
     * (net_epoch.c) */
    atomic_fetch_add_explicit(&s->shm->lease_q[handle].drain, 1, memory_order_seq_cst);
}

int session_lease_busy(const struct session *s, uint32_t handle)
{
    return atomic_load_explicit(&s->shm->lease_q[handle].busy, memory_order_seq_cst) != 0;
}

static int on_lease(struct session *s, const struct wire_lease *q)
{
    if (q->handle >= SESSION_MAX_HANDLES || !s->handles[q->handle].g)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "no open group with handle %u",
                              q->handle);
    struct session_handle *h = &s->handles[q->handle];
    struct group *g = h->g;
    if (!s->env->cfg->agent.direct_ops || !g->net || g->gpu || g->nslots != 1 ||
        q->handle >= WIRE_DIRECT_HANDLES)
        return session_refuse(s, q->h.req_id, COLL_ERR_UNSUPPORTED,
                              "group '%s' does not lend its connections (direct ops: a host group "
                              "across pods with one slot per pod, among a session's first %d, "
                              "agent.direct_ops)",
                              g->cfg->name, WIRE_DIRECT_HANDLES);
    if (s->env->draining) /* what it would run goes through us, and is refused */
        return session_refuse(s, q->h.req_id, COLL_ERR_SHUTDOWN, "the agent is stopping");
    if (h->epoch != g->epoch) /* as its ops would be: the handle is over */
        return session_refuse(s, q->h.req_id, COLL_ERR_EPOCH,
                              "group '%s' was re-formed since this handle was opened: reopen it",
                              g->cfg->name);
    if (!g->net_formed || g->lent_to || !group_idle(g))
        return session_refuse(s, q->h.req_id, COLL_ERR_BUSY, "group '%s' is not formed and idle",
                              g->cfg->name);
    struct net_lease l;
    char why[160] = "";
    int rc = net_lend(g->net, g->index, &s->shm->lease_q[q->handle], &l,
                      &s->shm->lease_stash[q->handle], why, sizeof(why));
    if (rc != COLL_OK)
        return session_refuse(s, q->h.req_id, rc, "group '%s': %s", g->cfg->name, why);
    union wire_msg m;
    wire_init(&m, WIRE_LEASE_OK, q->h.req_id);
    m.lease_ok.lease_id = l.id;
    m.lease_ok.seq = l.seq;
    m.lease_ok.op_ms = (uint32_t)h->op_ms;
    m.lease_ok.nodes = (uint32_t)l.nodes;
    m.lease_ok.me = (uint32_t)l.me;
    m.lease_ok.nfds = (uint32_t)l.nfds;
    m.lease_ok.has_prev = l.has_prev;
    m.lease_ok.run = l.run;
    _Static_assert(sizeof(m.lease_ok.prev) == sizeof(l.prev), "the ack state travels whole");
    memcpy(m.lease_ok.prev, l.prev, sizeof(l.prev));
    m.lease_ok.lease_void = atomic_load_explicit(&s->shm->lease_void, memory_order_relaxed);
    m.lease_ok.flags = l.own_cpus ? WIRE_LEASE_F_OWN_CPUS : 0;
    memcpy(m.lease_ok.stash_len, l.stash_len, sizeof(l.stash_len));
    /* before the reply: the client may count its first direct op before we look again */
    group_direct_follow(g, s, q->handle, &s->shm->direct[q->handle]);
    if (session_reply(s, &m, l.fds, l.nfds) < 0) {
        net_unlend(g->net, g->index, l.id, l.seq, l.has_prev, l.run, l.prev, l.stash_len,
                   &s->shm->lease_stash[q->handle], COLL_OK, "", why, sizeof(why));
        return session_violation(s, "cannot hand over the group's connections: %s",
                                 strerror(errno));
    }
    g->lent_to = s;
    g->lease_id = l.id;
    g->lent_handle = q->handle;
    g->leases++;
    for (int p = 0; p < WIRE_STASH_NODES; p++)
        g->stash_lent += l.stash_len[p];
    log_msg(LOG_DEBUG, "session.lease", "session=%llu group=%s lease=%llu seq=%llu",
            (unsigned long long)s->id, g->cfg->name, (unsigned long long)l.id,
            (unsigned long long)l.seq);
    return 0;
}

static int on_lease_back(struct session *s, const struct wire_lease_back *q)
{
    if (q->handle >= SESSION_MAX_HANDLES || !s->handles[q->handle].g)
        return session_refuse(s, q->h.req_id, COLL_ERR_INVALID, "no open group with handle %u",
                              q->handle);
    struct group *g = s->handles[q->handle].g;
    if (q->code < 0 || q->code > COLL_ERR_INTERNAL)
        return session_violation(s, "lease given back with status %d", q->code);
    for (int p = 0; p < WIRE_STASH_NODES; p++) /* wire_decode saw to the sizes */
        if (q->stash_len[p] && (p >= g->cfg->members || p == g->node_index))
            return session_violation(
                s,
                "lease given back with %u bytes read ahead of node %d (group '%s': "
                "%d pods, this one %d)",
                q->stash_len[p], p, g->cfg->name, g->cfg->members, g->node_index);
    union wire_msg m;
    wire_init(&m, WIRE_LEASE_BACK_OK, q->h.req_id);
    if (g->lent_to == s && g->lease_id == q->lease_id) {
        g->lent_to = NULL;
        for (int p = 0; q->code == COLL_OK && p < WIRE_STASH_NODES; p++)
            g->stash_back += q->stash_len[p];
        /* the epoch may have been waiting for it to end (a pod left): say why */
        m.lease_back_ok.code = net_unlend(
            g->net, g->index, q->lease_id, q->seq, q->has_prev, q->run, q->prev, q->stash_len,
            &s->shm->lease_stash[q->handle], q->code, q->why[0] ? q->why : "a direct op failed",
            m.lease_back_ok.why, sizeof(m.lease_back_ok.why));
    } /* else the lease ended already (its epoch did): nothing to take back */
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

static int on_mem_reg(struct session *s, const struct wire_mem_reg *r, int fd)
{
    if ((r->kind == WIRE_MEM_MEMFD) != (r->device == -1))
        return session_refuse(s, r->h.req_id, COLL_ERR_INVALID, "buffer kind %u with device %d",
                              r->kind, r->device);
    if (r->kind != WIRE_MEM_MEMFD && !s->env->gpu)
        return session_refuse(
            s, r->h.req_id, COLL_ERR_UNSUPPORTED,
            "device %d: this agent has no GPU group (GPU buffers need the NCCL backend)",
            r->device);
    if ((r->kind == WIRE_MEM_CUDA_IPC) != (fd < 0))
        return session_refuse(s, r->h.req_id, COLL_ERR_INVALID, "buffer kind %u %s a descriptor",
                              r->kind, fd < 0 ? "without" : "with");
    if (r->size == 0 || r->size > WIRE_MAX_BUFFER)
        return session_refuse(s, r->h.req_id, COLL_ERR_INVALID, "buffer size %llu",
                              (unsigned long long)r->size);
    uint32_t i = 0;
    while (i < s->nbufs && s->bufs[i])
        i++;
    if (i == s->nbufs) {
        if (s->nbufs == SESSION_MAX_BUFFERS)
            return session_refuse(s, r->h.req_id, COLL_ERR_LIMIT,
                                  "a session shares at most %d buffers", SESSION_MAX_BUFFERS);
        uint32_t cap = s->nbufs ? s->nbufs * 2 : 16;
        if (cap > SESSION_MAX_BUFFERS) cap = SESSION_MAX_BUFFERS;
        struct buffer **nb = realloc(s->bufs, cap * sizeof(*nb));
        if (!nb) return session_refuse(s, r->h.req_id, COLL_ERR_NOMEM, "agent out of memory");
        memset(nb + s->nbufs, 0, (cap - s->nbufs) * sizeof(*nb));
        s->bufs = nb;
        s->nbufs = cap;
    }
    if (r->kind == WIRE_MEM_MEMFD) {
        char why[160];
        int code = 0;
        struct buffer *b = buffer_import_memfd(fd, (size_t)r->size, why, sizeof(why), &code);
        if (!b) return session_refuse(s, r->h.req_id, code, "%s", why);
        s->bufs[i] = b;
        return reply_buf(s, r->h.req_id, i);
    }
    /* a GPU buffer: opened on the worker, answered when it is back (session_job_done) */
    if (s->shm_gpu <= 0)
        return session_refuse(s, r->h.req_id, COLL_ERR_UNSUPPORTED,
                              "the session region could not be registered with CUDA");
    if (s->imports >= SESSION_MAX_IMPORTS)
        return session_refuse(s, r->h.req_id, COLL_ERR_LIMIT,
                              "a session has at most %d GPU buffer registrations pending",
                              SESSION_MAX_IMPORTS);
    struct gpu_job *j = calloc(1, sizeof(*j));
    int jfd = fd >= 0 && j ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (!j || (fd >= 0 && jfd < 0)) {
        free(j);
        return session_refuse(s, r->h.req_id, COLL_ERR_NOMEM, "agent out of memory or descriptors");
    }
    j->type = r->kind == WIRE_MEM_CUMEM_FD ? GPU_JOB_IMPORT_CUMEM : GPU_JOB_IMPORT_IPC;
    j->session = s->id;
    j->req_id = r->h.req_id;
    j->slot = i;
    j->fd = jfd;
    j->size = (size_t)r->size;
    j->offset = r->offset;
    memcpy(j->uuid, r->uuid, sizeof(j->uuid));
    memcpy(j->ipc, r->ipc, sizeof(j->ipc));
    s->bufs[i] = SESSION_BUF_PENDING;
    s->imports++;
    gpu_job_submit(s->env->gpu, j);
    return 0;
}

/* A job is back from the worker: register (HELLO_OK waited for it) or an import. */
int session_job_done(struct session_env *env, struct session *s, struct gpu_job *j)
{
    if (j->type == GPU_JOB_REGISTER) {
        if (j->status == COLL_OK) gpu_region_registered(env->gpu, j->hold, j->delta);
        buffer_unref(&j->hold);
        if (!s || s->hello_memfd < 0) return 0;
        if (j->status != COLL_OK)
            log_msg(LOG_WARN, "session.gpu_region", "session=%llu error=\"%s\"",
                    (unsigned long long)s->id, j->why);
        s->shm_gpu = j->status == COLL_OK ? 1 : -1;
        int memfd = s->hello_memfd;
        s->hello_memfd = -1;
        return hello_reply(s, s->hello_req, memfd);
    }
    if (!s || j->slot >= s->nbufs || s->bufs[j->slot] != SESSION_BUF_PENDING) {
        buffer_unref(&j->buf); /* the session is gone: release it (on the worker) */
        return 0;
    }
    s->imports--;
    if (!j->buf) {
        s->bufs[j->slot] = NULL;
        return session_refuse(s, j->req_id, j->status ? j->status : COLL_ERR_INTERNAL, "%s",
                              j->why);
    }
    struct buffer *b = j->buf;
    j->buf = NULL;
    s->bufs[j->slot] = b;
    log_msg(LOG_INFO, "session.gpu_buffer", "session=%llu kind=%s device=%d bytes=%zu",
            (unsigned long long)s->id, j->type == GPU_JOB_IMPORT_CUMEM ? "cumem" : "cuda_ipc",
            b->device, b->size);
    return reply_buf(s, j->req_id, j->slot);
}

static int on_mem_release(struct session *s, const struct wire_mem_release *r)
{
    uint32_t i = r->buf_id - 1;
    if (r->buf_id == WIRE_BUF_NONE || i >= s->nbufs || !s->bufs[i] ||
        s->bufs[i] == SESSION_BUF_PENDING)
        return session_refuse(s, r->h.req_id, COLL_ERR_INVALID, "no buffer with id %u", r->buf_id);
    if (s->bufs[i]->refs > 1)
        return session_refuse(s, r->h.req_id, COLL_ERR_BUSY,
                              "buffer %u is used by %u ops in flight", r->buf_id,
                              s->bufs[i]->refs - 1);
    buffer_unref(&s->bufs[i]);
    union wire_msg m;
    wire_init(&m, WIRE_MEM_RELEASE_OK, r->h.req_id);
    return session_reply(s, &m, NULL, 0) < 0 ? session_violation(s, "cannot reply") : 0;
}

int session_on_message(struct session *s)
{
    char buf[WIRE_MAX_MSG];
    union {
        char b[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
    ssize_t n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (s->state == SESSION_CLOSING) { /* refused: discard until the client hangs up */
        if (n > 0) wire_take_fds(&mh, NULL, 0);
        return n > 0 ? 0 : -1;
    }
    if (n <= 0) {
        log_msg(LOG_INFO, "session.closed", "session=%llu pid=%d inflight=%u",
                (unsigned long long)s->id, (int)s->pid, s->inflight);
        return -1;
    }
    int fds[4];
    int nfds = wire_take_fds(&mh, fds, 4);
    int rc;
    union wire_msg m;
    char err[160];
    unsigned version = 0;
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        rc = session_violation(s, "message larger than %d bytes or with too many descriptors",
                               WIRE_MAX_MSG);
    } else if (wire_decode(buf, (size_t)n, &m, &version, err, sizeof(err)) < 0) {
        rc = session_violation(s, "%s", err);
    } else if (s->state == SESSION_HANDSHAKE && m.h.type != WIRE_HELLO) {
        rc = session_violation(s, "expected HELLO first, got message type %u", m.h.type);
    } else if ((s->state != SESSION_HANDSHAKE || s->hello_memfd >= 0) && m.h.type == WIRE_HELLO) {
        rc = session_violation(s, "second HELLO");
    } else if (s->hello_memfd >= 0) {
        rc = session_violation(s, "request before HELLO_OK");
    } else if (m.h.type == WIRE_MEM_REG ? nfds > 1 : nfds != 0) {
        rc = session_violation(s, "message type %u carried %d descriptors", m.h.type, nfds);
    } else {
        switch (m.h.type) {
        case WIRE_HELLO:
            rc = on_hello(s, &m.hello);
            break;
        case WIRE_GROUP_OPEN:
            rc = on_group_open(s, &m.group_open);
            break;
        case WIRE_GROUP_CLOSE:
            rc = on_group_close(s, &m.group_close);
            break;
        case WIRE_GROUP_CREATE:
            rc = on_group_create(s, &m.group_create);
            break;
        case WIRE_GROUP_STATE:
            rc = on_group_state(s, &m.group_state);
            break;
        case WIRE_MEM_REG:
            rc = on_mem_reg(s, &m.mem_reg, nfds ? fds[0] : -1);
            break;
        case WIRE_MEM_RELEASE:
            rc = on_mem_release(s, &m.mem_release);
            break;
        case WIRE_LEASE:
            rc = on_lease(s, &m.lease);
            break;
        case WIRE_LEASE_BACK:
            rc = on_lease_back(s, &m.lease_back);
            break;
        case WIRE_REDOP_SET:
            rc = on_redop_set(s, &m.redop_set);
            break;
        default:
            rc = session_violation(s, "message type %u is not a request", m.h.type);
            break;
        }
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    return rc;
}
