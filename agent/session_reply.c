/*
 * session_reply.c: what the agent says to one client on its socket: replies (with
 * descriptors), errors that keep the session (a request it may retry or correct) and
 * protocol violations that end it. The bottom of the session files: session.c and
 * session_ops.c call down here, and nothing here calls up.
 */
#include "session.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "coll/coll.h"
#include "log.h"

int session_reply(struct session *s, const union wire_msg *m, const int *fds, int nfds)
{
    struct iovec iov = {.iov_base = (void *)m, .iov_len = m->h.len};
    union {
        char buf[CMSG_SPACE(WIRE_LEASE_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > WIRE_LEASE_MAX_FDS) return -1;
    if (nfds > 0) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    return n == (ssize_t)m->h.len ? 0 : -1;
}

void session_send_error(struct session *s, uint32_t req_id, int code, const char *msg)
{
    union wire_msg m;
    wire_init(&m, WIRE_ERROR, req_id);
    m.error.code = code;
    snprintf(m.error.msg, sizeof(m.error.msg), "%s", msg);
    session_reply(s, &m, NULL, 0);
}

int session_refuse(struct session *s, uint32_t req_id, int code, const char *fmt, ...)
{
    char msg[WIRE_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    unsigned long long dropped;
    if (log_limit_pass(s->env->lim_request, &dropped))
        log_msg(LOG_INFO, "session.refuse",
                "session=%llu pid=%d error=\"%s\" detail=\"%s\" suppressed=%llu",
                (unsigned long long)s->id, (int)s->pid, coll_strerror((coll_err)code), LOG_Q(msg),
                dropped);
    session_send_error(s, req_id, code, msg);
    return 0;
}

/* A protocol violation: log once, tell the client, and have the server drop it. */
int session_violation(struct session *s, const char *fmt, ...)
{
    char msg[WIRE_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    unsigned long long dropped;
    if (log_limit_pass(s->env->lim_violation, &dropped))
        log_msg(LOG_WARN, "session.protocol_error",
                "session=%llu pid=%d client=\"%s\" detail=\"%s\" suppressed=%llu",
                (unsigned long long)s->id, (int)s->pid, LOG_Q(s->client), LOG_Q(msg), dropped);
    session_send_error(s, 0, COLL_ERR_PROTOCOL, msg);
    return -1;
}
