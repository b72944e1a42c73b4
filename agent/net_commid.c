/*
 * net_commid.c: the coordinator's NCCL communicator ids, made on a thread of their own.
 * ncclGetUniqueId opens a listening socket and, the first time, starts NCCL's bootstrap:
 * neither may hold up the net thread, which keeps every group's heartbeats and ops
 * moving. One id is kept ready; a commit takes it, and the thread makes the next.
 */
#include "net_commid.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct net_commid {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    net_commid_fn fn;
    int wake_fd;
    int ready, failed, stop; /* guarded by lock */
    uint8_t id[RDV_COMMID_BYTES];
    char why[160];
};

static void *commid_main(void *arg)
{
    struct net_commid *c = arg;
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        if (c->ready || c->failed) {
            pthread_cond_wait(&c->cond, &c->lock);
            continue;
        }
        pthread_mutex_unlock(&c->lock);
        uint8_t id[RDV_COMMID_BYTES];
        char why[160] = "";
        int rc = c->fn(id, why, sizeof(why));
        pthread_mutex_lock(&c->lock);
        if (rc == 0) {
            memcpy(c->id, id, sizeof(id));
            c->ready = 1;
        } else {
            snprintf(c->why, sizeof(c->why), "%s", why);
            c->failed = 1;
        }
        uint64_t one = 1; /* the net thread commits on its next turn */
        ssize_t w = write(c->wake_fd, &one, sizeof(one));
        (void)w;
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

struct net_commid *net_commid_start(net_commid_fn fn, int wake_fd, char *why, size_t whylen)
{
    struct net_commid *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(why, whylen, "no memory for the communicator id thread");
        return NULL;
    }
    c->fn = fn;
    c->wake_fd = wake_fd;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    if (pthread_create(&c->thread, NULL, commid_main, c) != 0) {
        snprintf(why, whylen, "cannot start the communicator id thread");
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
    }
    return c;
}

int net_commid_take(struct net_commid *c, uint8_t *id, char *why, size_t whylen)
{
    int rc = 1;
    pthread_mutex_lock(&c->lock);
    if (c->ready) {
        memcpy(id, c->id, RDV_COMMID_BYTES);
        c->ready = 0;
        rc = 0;
    } else if (c->failed) {
        snprintf(why, whylen, "%s", c->why);
        c->failed = 0; /* the next commit asks again */
        rc = -1;
    }
    if (rc <= 0) pthread_cond_signal(&c->cond); /* make the next */
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void net_commid_stop(struct net_commid **cp)
{
    struct net_commid *c = *cp;
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
    *cp = NULL;
}
