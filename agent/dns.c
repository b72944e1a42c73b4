/*
 * dns.c: the watch of the headless service's name (dns.h).
 */
#include "dns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "security.h"
#include "util.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

struct dns_watch {
    char name[256];
    int resolve_ms, refresh_ms;
    pthread_t thread;
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t cond;
    int stop;
    uint32_t addrs[DNS_MAX_ADDRS];
    int count, failing;
    uint64_t gen;
};

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = ntohl(*(const uint32_t *)a), y = ntohl(*(const uint32_t *)b);
    return x < y ? -1 : x > y;
}

/* One lookup: the IPv4 addresses of name, sorted and unique. Returns the count, or
 * -1 with the resolver's words in why. */
static int lookup(const char *name, uint32_t *out, int max, char *why, size_t whylen)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(name, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(why, whylen, "%s", rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return -1;
    }
    int n = 0;
    for (struct addrinfo *a = res; a && n < max; a = a->ai_next)
        out[n++] = ((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr;
    freeaddrinfo(res);
    qsort(out, (size_t)n, sizeof(*out), cmp_u32);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (!u || out[u - 1] != out[i]) out[u++] = out[i];
    return u;
}

/* Wait ms unless stopped; returns 1 when stopping. Called with the lock held. */
static int nap(struct dns_watch *w, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock, &ts) != ETIMEDOUT) {
    }
    return w->stop;
}

static void *watch_main(void *arg)
{
    struct dns_watch *w = arg;
    static uint32_t found[DNS_MAX_ADDRS]; /* one watch per agent */
    int backoff = 0, warned = 0, tries = 0;
    int64_t t0 = now_ns(), failing_since = t0;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        pthread_mutex_unlock(&w->lock);
        char why[160];
        int n = lookup(w->name, found, DNS_MAX_ADDRS, why, sizeof(why));
        tries++;
        int64_t now = now_ns();
        pthread_mutex_lock(&w->lock);
        int wait_ms;
        if (n < 0) {
            if (!w->failing) failing_since = now;
            w->failing = 1;
            log_msg(LOG_DEBUG, "discovery.dns_retry", "name=%s try=%d error=\"%s\"", w->name, tries,
                    why);
            if (!warned && now - failing_since > (int64_t)w->resolve_ms * NS_PER_MS) {
                log_msg(LOG_WARN, "discovery.dns_failing",
                        "name=%s for_ms=%lld tries=%d error=\"%s\" detail=\"still trying; check "
                        "the headless service's name and that its pods are selected\"",
                        w->name, (long long)((now - failing_since) / NS_PER_MS), tries, why);
                warned = 1;
            }
            backoff = backoff ? 2 * backoff : BACKOFF_MIN_MS;
            if (backoff > BACKOFF_MAX_MS) backoff = BACKOFF_MAX_MS;
            uint32_t r = 0;
            sec_random(&r, sizeof(r));
            wait_ms = backoff / 2 + (int)(r % (uint32_t)(backoff / 2 + 1));
        } else {
            int changed = n != w->count || memcmp(found, w->addrs, (size_t)n * sizeof(*found));
            if (changed || w->failing) {
                char list[256] = "";
                for (int i = 0; i < n && strlen(list) < sizeof(list) - 20; i++) {
                    char ip[INET_ADDRSTRLEN];
                    inet_ntop(AF_INET, &found[i], ip, sizeof(ip));
                    snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? "," : "",
                             ip);
                }
                log_msg(LOG_INFO, "discovery.dns", "name=%s pods=%d addresses=%s%s after_ms=%lld",
                        w->name, n, list, n > 0 && strlen(list) >= sizeof(list) - 20 ? ",..." : "",
                        (long long)((now - t0) / NS_PER_MS));
            }
            if (changed) {
                memcpy(w->addrs, found, (size_t)n * sizeof(*found));
                w->count = n;
                w->gen++;
            }
            w->failing = 0;
            warned = 0;
            backoff = 0;
            wait_ms = w->refresh_ms;
        }
        if (nap(w, wait_ms)) break;
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

struct dns_watch *dns_watch_start(const char *name, int resolve_ms, int refresh_ms, char *why,
                                  size_t whylen)
{
    struct dns_watch *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->resolve_ms = resolve_ms;
    w->refresh_ms = refresh_ms;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        snprintf(why, whylen, "cannot start the DNS thread");
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
        free(w);
        return NULL;
    }
    return w;
}

void dns_watch_stop(struct dns_watch **wp)
{
    struct dns_watch *w = wp ? *wp : NULL;
    if (!w) return;
    *wp = NULL;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    /* a lookup in progress finishes first: glibc's resolver has its own timeouts
     * (resolv.conf's timeout x attempts, 5 s x 2 by default) */
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
}

uint64_t dns_watch_get(struct dns_watch *w, uint32_t *out, int max, int *count, int *failing)
{
    pthread_mutex_lock(&w->lock);
    int n = w->count < max ? w->count : max;
    memcpy(out, w->addrs, (size_t)n * sizeof(*out));
    *count = w->count;
    *failing = w->failing;
    uint64_t gen = w->gen;
    pthread_mutex_unlock(&w->lock);
    return gen;
}
