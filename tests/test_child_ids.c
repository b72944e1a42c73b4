/*
 * test_child_ids.c: the ids of GPU children across pods (decision 32) through the agent's
 * real net threads: three pods' net threads in this process, on loopback, with real
 * ZeroMQ rendezvous and data connections. The test plays each pod's engine: it asks
 * (NET_TASK_CHILD) and collects the answers. No GPU takes part: the coordinator's ids
 * come from the test's id function, which the test can hold back.
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll/coll.h"
#include "config.h"
#include "harness.h"
#include "net.h"
#include "rdv_wire.h"
#include "spin.h"
#include "util.h"

#define PODS 3

struct pod {
    struct config *cfg;
    struct net *net;
    struct spin_gate gate;
    int formed;
    struct net_task *done[16]; /* answers, in the order they came */
    int ndone;
};

static struct pod pods[PODS];

/* The coordinator's ids (only node 0 makes them): a count in the first bytes; the one
 * past limit is held back (as ncclGetUniqueId may wait for NCCL's bootstrap) until the
 * test raises it, at most 20 s. */
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t id_cond = PTHREAD_COND_INITIALIZER;
static int limit, made;

static int make_id(uint8_t *id, char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    pthread_mutex_lock(&id_lock);
    int64_t until = now_ns() + 20000 * NS_PER_MS;
    while (made >= limit && now_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&id_cond, &id_lock, &ts);
    }
    memset(id, 0, 128);
    int k = ++made;
    memcpy(id, &k, sizeof(k));
    pthread_mutex_unlock(&id_lock);
    return 0;
}

static void set_limit(int v)
{
    pthread_mutex_lock(&id_lock);
    limit = v;
    pthread_cond_broadcast(&id_cond);
    pthread_mutex_unlock(&id_lock);
}

static void start_pod(int i, int port, int join_ms)
{
    struct pod *p = &pods[i];
    memset(p, 0, sizeof(*p));
    char body[512], *err = NULL;
    int len = snprintf(body, sizeof(body),
                       "node: {index: %d, name: pod-%d}\n"
                       "discovery: {peers: [\"127.0.0.1:%d\"]}\n"
                       "groups:\n  - {name: g, backend: nccl, members: %d, local_slots: 1,\n"
                       "     timeouts: {op_ms: 20000, heartbeat_ms: 100, join_ms: %d}}\n",
                       i, i, port, PODS, join_ms);
    p->cfg = config_new();
    assert_non_null(p->cfg);
    if (config_load_string(p->cfg, body, (size_t)len, "test", &err) < 0) fail_msg("%s", err);
    const uint8_t gpu_group[CONFIG_MAX_GROUPS] = {1};
    char why[256];
    p->net = net_start(p->cfg, gpu_group, make_id, &p->gate, why, sizeof(why));
    if (!p->net) fail_msg("net_start: %s", why);
}

static void stop_pod(int i)
{
    struct pod *p = &pods[i];
    if (!p->net) return;
    net_stop(p->net);
    struct net_task *done;
    struct net_event *ev;
    net_collect(p->net, &done, &ev);
    while (done) {
        struct net_task *next = done->next;
        free(done);
        done = next;
    }
    while (ev) {
        struct net_event *next = ev->next;
        net_event_release(p->net, ev);
        ev = next;
    }
    net_free(&p->net);
    for (int k = 0; k < p->ndone; k++)
        free(p->done[k]);
    config_free(&p->cfg);
}

/* The engine's part: take what came back and the events, for up to ms. */
static void collect(int i, int ms)
{
    struct pod *p = &pods[i];
    struct pollfd pf = {.fd = net_notify_fd(p->net), .events = POLLIN};
    poll(&pf, 1, ms);
    uint64_t v;
    ssize_t r = read(pf.fd, &v, sizeof(v));
    (void)r;
    struct net_task *done;
    struct net_event *ev;
    net_collect(p->net, &done, &ev);
    while (done) {
        struct net_task *next = done->next;
        assert_int_equal(done->type, NET_TASK_CHILD);
        assert_true(p->ndone < 16);
        p->done[p->ndone++] = done;
        done = next;
    }
    while (ev) {
        struct net_event *next = ev->next;
        p->formed = !ev->broken;
        net_event_release(p->net, ev);
        ev = next;
    }
}

/* Until pod i has n answers (or 20 s). */
static void wait_answers(int i, int n)
{
    int64_t until = now_ns() + 20000 * NS_PER_MS;
    while (pods[i].ndone < n && now_ns() < until)
        collect(i, 50);
    assert_int_equal(pods[i].ndone, n);
}

static void wait_formed(void)
{
    int64_t until = now_ns() + 20000 * NS_PER_MS;
    for (int i = 0; i < PODS; i++)
        while (!pods[i].formed && now_ns() < until)
            collect(i, 50);
    for (int i = 0; i < PODS; i++)
        assert_true(pods[i].formed);
}

/* Pod i asks for the nth child of ranks[n], its answer due within ms. */
static void ask(int i, const uint32_t *ranks, uint32_t n, uint32_t nth, int ms)
{
    struct ask {
        struct net_task t;
        struct net_child c;
    } *a = calloc(1, sizeof(*a));
    assert_non_null(a);
    a->t.type = NET_TASK_CHILD;
    a->t.group = 0;
    a->t.lepoch = 1;
    a->t.deadline_ns = now_ns() + (int64_t)ms * NS_PER_MS;
    a->t.child = &a->c;
    a->c.n = n;
    a->c.nth = nth;
    a->c.hash = rdv_child_hash(ranks, n);
    memcpy(a->c.ranks, ranks, n * sizeof(*ranks));
    net_submit(pods[i].net, &a->t);
}

static int id_of(const struct net_task *t)
{
    int k;
    memcpy(&k, t->child->commid, sizeof(k));
    return k;
}

/* Asks made before the group formed wait for it; every pod of a child gets the one id
 * the coordinator made for it (the coordinator's own pod among them), and another child
 * (another list, or the same list's next) gets another. */
static void the_pods_of_a_child_get_one_id(void **state)
{
    (void)state;
    made = 0;
    set_limit(1000);
    int port = free_port();
    const uint32_t a[] = {2, 1}, all[] = {0, 1, 2};
    for (int i = 0; i < PODS; i++)
        start_pod(i, port, 5000);
    ask(1, a, 2, 1, 20000); /* before anything formed */
    ask(2, a, 2, 1, 20000);
    for (int i = 0; i < PODS; i++)
        ask(i, all, 3, 1, 20000);
    wait_formed();
    wait_answers(0, 1);
    wait_answers(1, 2);
    wait_answers(2, 2);
    for (int i = 0; i < PODS; i++)
        for (int k = 0; k < pods[i].ndone; k++)
            assert_int_equal(pods[i].done[k]->status, COLL_OK);
    /* which answer is which: by list */
    int id_a[PODS] = {0}, id_all[PODS] = {0};
    for (int i = 0; i < PODS; i++)
        for (int k = 0; k < pods[i].ndone; k++) {
            struct net_task *t = pods[i].done[k];
            if (t->child->n == 2)
                id_a[i] = id_of(t);
            else
                id_all[i] = id_of(t);
        }
    assert_int_equal(id_a[1], id_a[2]);
    assert_int_equal(id_all[0], id_all[1]);
    assert_int_equal(id_all[1], id_all[2]);
    assert_true(id_a[1] > 0 && id_all[0] > 0 && id_a[1] != id_all[0]);
    /* the list's second child: a new id */
    ask(1, a, 2, 2, 20000);
    ask(2, a, 2, 2, 20000);
    wait_answers(1, 3);
    wait_answers(2, 3);
    assert_int_equal(pods[1].done[2]->status, COLL_OK);
    assert_int_equal(id_of(pods[1].done[2]), id_of(pods[2].done[2]));
    assert_true(id_of(pods[1].done[2]) != id_a[1] && id_of(pods[1].done[2]) != id_all[0]);
    for (int i = PODS - 1; i >= 0; i--)
        stop_pod(i);
}

/* An ask the coordinator cannot answer yet fails at its deadline, with TIMEOUT, and
 * one whose epoch ends (a pod of the group stops) fails with the epoch, at once: none
 * waits for an id that will not come. */
static void an_ask_fails_at_its_deadline_or_with_its_epoch(void **state)
{
    (void)state;
    made = 0;
    set_limit(2); /* the first commit's, and the one kept ready after it */
    int port = free_port();
    for (int i = 0; i < PODS; i++)
        start_pod(i, port, 5000);
    wait_formed();
    const uint32_t a[] = {1, 2}, b[] = {2, 1}, c[] = {0, 1};
    ask(1, c, 2, 1, 20000);
    wait_answers(1, 1);
    assert_int_equal(pods[1].done[0]->status, COLL_OK);
    ask(1, a, 2, 1, 300);
    wait_answers(1, 2);
    assert_int_equal(pods[1].done[1]->status, COLL_ERR_TIMEOUT);
    assert_non_null(strstr(pods[1].done[1]->why, "within join_ms"));
    ask(2, b, 2, 1, 20000);
    collect(2, 200);
    assert_int_equal(pods[2].ndone, 0); /* waiting for the id */
    stop_pod(1);
    wait_answers(2, 1);
    assert_true(pods[2].done[0]->status == COLL_ERR_PEER_LOST ||
                pods[2].done[0]->status == COLL_ERR_EPOCH);
    assert_non_null(strstr(pods[2].done[0]->why, "epoch"));
    set_limit(1000);
    stop_pod(2);
    stop_pod(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_pods_of_a_child_get_one_id),
        cmocka_unit_test(an_ask_fails_at_its_deadline_or_with_its_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
