/*
 * engine_accept.c: new clients on the engine's listening socket: each one's
 * credentials (SO_PEERCRED) against agent.allowed_uids / allowed_gids, the session
 * budget and the drain, then a session on the engine's epoll; a refused one is told
 * why and lingers until it has read it.
 */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll/coll.h"
#include "log.h"
#include "session.h"

static int allowed(const struct config *cfg, uid_t uid, gid_t gid)
{
    int nu = cfg->agent.nallowed_uids, ng = cfg->agent.nallowed_gids;
    if (nu == 0 && ng == 0) return uid == geteuid() || uid == 0;
    for (int i = 0; i < nu; i++)
        if ((long long)uid == cfg->agent.allowed_uids[i]) return 1;
    for (int i = 0; i < ng; i++)
        if ((long long)gid == cfg->agent.allowed_gids[i]) return 1;
    return 0;
}

static void reject(int fd, int code, const char *msg)
{
    union wire_msg m;
    wire_init(&m, WIRE_ERROR, 0);
    m.error.code = code;
    snprintf(m.error.msg, sizeof(m.error.msg), "%s", msg);
    ssize_t n = send(fd, &m, m.h.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    close(fd);
}

static void add_session(struct engine *eng, struct session *s)
{
    s->next = eng->sessions;
    if (s->next) s->next->prev = s;
    eng->sessions = s;
    eng->nsessions++;
}

/* Refuse a client: send why, then keep the socket (reading and discarding) until the
 * client hangs up or the handshake deadline passes. Closing at once would reset the
 * connection if the client's HELLO is already queued, and the client would never
 * read the reason. Past a bound on lingering sockets, close at once. */
static void refuse_client(struct engine *eng, int fd, struct ucred *cr, int code, const char *msg)
{
    struct session *s =
        eng->nclosing < 64 ? session_new(&eng->senv, fd, cr->pid, cr->uid, cr->gid) : NULL;
    if (!s) {
        reject(fd, code, msg);
        return;
    }
    session_send_error(s, 0, code, msg);
    s->state = SESSION_CLOSING;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->ev_sock};
    if (epoll_ctl(eng->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        session_destroy(&s);
        return;
    }
    add_session(eng, s);
    eng->nclosing++; /* outside the session budget: refusals must not lock others out */
}

void engine_on_accept(struct engine *eng)
{
    for (;;) {
        int fd = accept4(eng->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                log_msg(LOG_WARN, "agent.accept", "error=\"%s\"", strerror(errno));
            return;
        }
        struct ucred cr;
        socklen_t len = sizeof(cr);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
            reject(fd, COLL_ERR_SYSTEM, "cannot read peer credentials");
            continue;
        }
        if (!allowed(eng->cfg, cr.uid, cr.gid)) {
            char msg[128];
            snprintf(msg, sizeof(msg),
                     "uid %u gid %u is not allowed (agent.allowed_uids / agent.allowed_gids)",
                     (unsigned)cr.uid, (unsigned)cr.gid);
            unsigned long long dropped;
            if (log_limit_pass(&eng->lim_refuse, &dropped))
                log_msg(LOG_WARN, "session.denied", "pid=%d uid=%u gid=%u suppressed=%llu",
                        (int)cr.pid, (unsigned)cr.uid, (unsigned)cr.gid, dropped);
            refuse_client(eng, fd, &cr, COLL_ERR_DENIED, msg);
            continue;
        }
        if (eng->draining) {
            refuse_client(eng, fd, &cr, COLL_ERR_SHUTDOWN, "the agent is stopping");
            continue;
        }
        if (eng->nsessions - eng->nclosing >= eng->cfg->agent.max_sessions) {
            unsigned long long dropped;
            if (log_limit_pass(&eng->lim_refuse, &dropped))
                log_msg(LOG_WARN, "session.limit", "pid=%d max_sessions=%d suppressed=%llu",
                        (int)cr.pid, eng->cfg->agent.max_sessions, dropped);
            refuse_client(eng, fd, &cr, COLL_ERR_LIMIT,
                          "the agent serves its maximum number of sessions");
            continue;
        }
        struct session *s = session_new(&eng->senv, fd, cr.pid, cr.uid, cr.gid);
        if (!s) {
            reject(fd, COLL_ERR_NOMEM, "agent out of memory");
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->ev_sock};
        if (epoll_ctl(eng->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            session_destroy(&s);
            continue;
        }
        add_session(eng, s);
        eng->stats.sessions_opened++;
    }
}
