/*
 * http.c: the operational endpoints (http.h) on libmicrohttpd: its own thread, its own
 * HTTP parser (never one of ours), a bounded number of connections with a timeout.
 */
#include "http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

#define ALIVE_NS (5 * NS_PER_S)

struct http_server {
    struct MHD_Daemon *d;
    int port;
    const _Atomic int64_t *engine_alive, *net_alive;
    pthread_mutex_t lock; /* the published texts: held for a copy only */
    char *metrics, *readyz;
    size_t mlen, rlen;
    int ready;
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

static enum MHD_Result has_key(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value)
{
    (void)kind, (void)value;
    if (strcmp(key, "verbose") == 0) *(int *)cls = 1;
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    (void)version, (void)upload, (void)con_cls;
    struct http_server *h = cls;
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
        int verbose = 0, metrics = url[1] == 'm';
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, has_key, &verbose);
        pthread_mutex_lock(&h->lock);
        size_t len = metrics ? h->mlen : h->rlen;
        char *copy = malloc(len ? len : 1);
        if (copy && len) memcpy(copy, metrics ? h->metrics : h->readyz, len);
        int ready = h->ready;
        pthread_mutex_unlock(&h->lock);
        if (!copy) return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, "no memory\n", 10);
        enum MHD_Result rc;
        if (metrics)
            rc = reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", copy, len);
        else if (verbose)
            rc = reply(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, copy, len);
        else
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
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL,
                            NULL, handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)5,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)65536, MHD_OPTION_END);
    if (!h->d) {
        snprintf(why, whylen, "cannot serve HTTP on %s:%d (in use, or not an address here)",
                 address, port);
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
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->lock);
    free(h->metrics);
    free(h->readyz);
    free(h);
}

void http_publish(struct http_server *h, const char *metrics, size_t mlen, const char *readyz,
                  size_t rlen, int ready)
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
    h->ready = ready;
    pthread_mutex_unlock(&h->lock);
    free(om);
    free(orr);
}

int http_port(const struct http_server *h)
{
    return h->port;
}
