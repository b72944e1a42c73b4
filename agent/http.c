/*
 * http.c: the operational endpoints (http.h) on libmicrohttpd: its own thread, its own
 * HTTP parser (never one of ours). What a client may hold is bounded so that the
 * kubelet's probes are answered within their 1 s timeout whatever else connects: at most
 * HTTP_PER_IP connections from one address and HTTP_CONNS in all, a request must arrive
 * whole within HTTP_REQUEST_NS of its connection's start (or of the last answer on it),
 * and an idle connection goes after HTTP_IDLE_S. At 242e584, 32 connections that sent
 * a header line every 2 s took every slot, and /livez timed out.
 */
#include "http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "util.h"

#define ALIVE_NS (5 * NS_PER_S)
#define HTTP_CONNS 1024u
#define HTTP_PER_IP 16u
#define HTTP_IDLE_S 2u
#define HTTP_REQUEST_NS (2 * NS_PER_S)
#define HTTP_SWEEP_NS (250 * NS_PER_MS)

/* A connection, from its start to its close (libmicrohttpd's socket context). */
struct conn {
    struct conn *prev, *next;
    int fd;
    _Atomic int64_t since; /* its start, or its last answer: the request under way began */
};

struct http_server {
    struct MHD_Daemon *d;
    int port;
    pthread_t sweeper; /* shuts down connections whose request takes too long to arrive */
    pthread_mutex_t conns_lock;
    pthread_cond_t stop_cond;
    int stop;
    struct conn conns;      /* a ring: conns.next is the oldest */
    unsigned long long cut; /* connections cut for taking too long */
    const _Atomic int64_t *engine_alive, *net_alive;
    pthread_mutex_t lock; /* the published texts: held for a copy only */
    char *metrics, *readyz;
    size_t mlen, rlen;
    unsigned failing; /* READYZ_ bits */
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

struct query {
    int verbose;
    unsigned exclude; /* READYZ_ bits */
    const char *unknown;
};

static enum MHD_Result has_key(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value)
{
    (void)kind;
    struct query *q = cls;
    if (strcmp(key, "verbose") == 0)
        q->verbose = 1;
    else if (strcmp(key, "exclude") == 0 && value && strcmp(value, "formed") == 0)
        q->exclude |= READYZ_FORMED;
    else if (strcmp(key, "exclude") == 0)
        q->unknown = "exclude: the one check that can be left out is \"formed\"\n";
    return MHD_YES;
}

/* libmicrohttpd's thread: a connection starts or closes. */
static void on_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                    enum MHD_ConnectionNotificationCode code)
{
    struct http_server *h = cls;
    struct conn *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *i =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k = i ? calloc(1, sizeof(*k)) : NULL;
        *socket_context = k;
        if (!k) return; /* not watched: the idle timeout still ends it */
        k->fd = i->connect_fd;
        atomic_store(&k->since, now_ns());
        pthread_mutex_lock(&h->conns_lock);
        k->prev = h->conns.prev;
        k->next = &h->conns;
        h->conns.prev->next = k;
        h->conns.prev = k;
        pthread_mutex_unlock(&h->conns_lock);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && k) {
        /* before libmicrohttpd closes the descriptor: the sweeper never shuts down a
         * number the kernel has given to another connection */
        pthread_mutex_lock(&h->conns_lock);
        k->prev->next = k->next;
        k->next->prev = k->prev;
        pthread_mutex_unlock(&h->conns_lock);
        free(k);
        *socket_context = NULL;
    }
}

/* Every HTTP_SWEEP_NS: shut down the connections whose request has not arrived whole
 * within HTTP_REQUEST_NS (libmicrohttpd then reads the end and closes them). */
static void *sweeper_main(void *arg)
{
    struct http_server *h = arg;
    pthread_mutex_lock(&h->conns_lock);
    while (!h->stop) {
        int64_t now = now_ns();
        for (struct conn *k = h->conns.next; k != &h->conns; k = k->next)
            if (k->fd >= 0 && now - atomic_load(&k->since) > HTTP_REQUEST_NS) {
                shutdown(k->fd, SHUT_RDWR);
                k->fd = -1; /* once */
                h->cut++;
            }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += HTTP_SWEEP_NS;
        if (t.tv_nsec >= NS_PER_S) {
            t.tv_sec++;
            t.tv_nsec -= NS_PER_S;
        }
        pthread_cond_timedwait(&h->stop_cond, &h->conns_lock, &t);
    }
    pthread_mutex_unlock(&h->conns_lock);
    return NULL;
}

/* The request on c was answered: the next one's time starts now. */
static void answered(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn *k = i ? i->socket_context : NULL;
    if (k) atomic_store(&k->since, now_ns());
}

static enum MHD_Result route(struct http_server *h, struct MHD_Connection *c, const char *url,
                             const char *method, size_t *upload_size);

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version, (void)upload, (void)con_cls;
    enum MHD_Result rc = route(cls, c, url, method, upload_size);
    answered(c);
    return rc;
}

static enum MHD_Result route(struct http_server *h, struct MHD_Connection *c, const char *url,
                             const char *method, size_t *upload_size)
{
    const char *text = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, "GET only\n", 9);
    if (*upload_size) return MHD_NO; /* a GET has no body */
    if (strcmp(url, "/livez") == 0) {
        int64_t now = now_ns();
        int64_t e = atomic_load(h->engine_alive),
                n = h->net_alive ? atomic_load(h->net_alive) : now;
        char body[160];
        int ok = now - e < ALIVE_NS && now - n < ALIVE_NS;
        int len = snprintf(body, sizeof(body), "%s\nengine turned %lld ms ago\nnet %s\n",
                           ok ? "ok" : "stuck", (long long)((now - e) / NS_PER_MS),
                           h->net_alive ? "turning" : "not running (no group spans pods)");
        if (h->net_alive && now - n >= ALIVE_NS)
            len = snprintf(body, sizeof(body), "stuck\nnet thread turned %lld ms ago\n",
                           (long long)((now - n) / NS_PER_MS));
        return reply(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, body, (size_t)len);
    }
    if (strcmp(url, "/readyz") == 0 || strcmp(url, "/metrics") == 0) {
        int metrics = url[1] == 'm';
        struct query q = {0};
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, has_key, &q);
        if (q.unknown && !metrics)
            return reply(c, MHD_HTTP_BAD_REQUEST, text, q.unknown, strlen(q.unknown));
        pthread_mutex_lock(&h->lock);
        size_t len = metrics ? h->mlen : h->rlen;
        char *copy = malloc(len + 64); /* room for the verdict */
        if (copy && len) memcpy(copy, metrics ? h->metrics : h->readyz, len);
        int ready = !(h->failing & ~q.exclude);
        pthread_mutex_unlock(&h->lock);
        if (!copy) return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, "no memory\n", 10);
        enum MHD_Result rc;
        if (metrics)
            rc = reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", copy, len);
        else if (q.verbose) {
            len += (size_t)snprintf(copy + len, 64, "%s%s\n", ready ? "ready" : "not ready",
                                    q.exclude ? " (formed excluded)" : "");
            rc = reply(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, copy, len);
        } else
            rc = reply(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text,
                       ready ? "ready\n" : "not ready\n", ready ? 6 : 10);
        free(copy);
        return rc;
    }
    return reply(c, MHD_HTTP_NOT_FOUND, text, "not found: /livez /readyz /metrics\n", 35);
}

struct http_server *http_start(const char *address, int port, const _Atomic int64_t *engine_alive,
                               const _Atomic int64_t *net_alive, char *why, size_t whylen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
        snprintf(why, whylen, "http.address '%s' is not an IPv4 address", address);
        return NULL;
    }
    struct http_server *h = calloc(1, sizeof(*h));
    if (!h) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    h->port = port;
    h->engine_alive = engine_alive;
    h->net_alive = net_alive;
    pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_init(&h->conns_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->stop_cond, &ca);
    pthread_condattr_destroy(&ca);
    h->conns.next = h->conns.prev = &h->conns;
    /* epoll (MHD_USE_AUTO on Linux): HTTP_CONNS descriptors are no select() set */
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL, NULL, handle, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, HTTP_CONNS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, HTTP_PER_IP, MHD_OPTION_CONNECTION_TIMEOUT, HTTP_IDLE_S,
        MHD_OPTION_NOTIFY_CONNECTION, on_conn, h, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536,
        MHD_OPTION_END);
    if (!h->d || pthread_create(&h->sweeper, NULL, sweeper_main, h) != 0) {
        snprintf(why, whylen, "cannot serve HTTP on %s:%d (in use, or not an address here)",
                 address, port);
        if (h->d) MHD_stop_daemon(h->d);
        pthread_cond_destroy(&h->stop_cond);
        pthread_mutex_destroy(&h->conns_lock);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    log_msg(LOG_INFO, "http.listening", "address=%s port=%d endpoints=/livez,/readyz,/metrics",
            address, port);
    return h;
}

void http_stop(struct http_server **hp)
{
    struct http_server *h = hp ? *hp : NULL;
    if (!h) return;
    *hp = NULL;
    pthread_mutex_lock(&h->conns_lock);
    h->stop = 1;
    pthread_cond_signal(&h->stop_cond);
    pthread_mutex_unlock(&h->conns_lock);
    pthread_join(h->sweeper, NULL);
    MHD_stop_daemon(h->d); /* closes what is left (on_conn frees it) */
    if (h->cut)
        log_msg(LOG_INFO, "http.stopped", "requests_cut=%llu (not whole within %d ms)", h->cut,
                (int)(HTTP_REQUEST_NS / NS_PER_MS));
    pthread_cond_destroy(&h->stop_cond);
    pthread_mutex_destroy(&h->conns_lock);
    pthread_mutex_destroy(&h->lock);
    free(h->metrics);
    free(h->readyz);
    free(h);
}

void http_publish(struct http_server *h, const char *metrics, size_t mlen, const char *readyz,
                  size_t rlen, unsigned failing)
{
    char *m = malloc(mlen ? mlen : 1), *r = malloc(rlen ? rlen : 1);
    if (!m || !r) { /* keep serving the last ones */
        free(m);
        free(r);
        return;
    }
    memcpy(m, metrics, mlen);
    memcpy(r, readyz, rlen);
    pthread_mutex_lock(&h->lock);
    char *om = h->metrics, *orr = h->readyz;
    h->metrics = m;
    h->mlen = mlen;
    h->readyz = r;
    h->rlen = rlen;
    h->failing = failing;
    pthread_mutex_unlock(&h->lock);
    free(om);
    free(orr);
}

int http_port(const struct http_server *h)
{
    return h->port;
}
