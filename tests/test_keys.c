/*
 * test_keys.c: the rendezvous' keys as a default install has them, with real agents: a
 * deployment's seed (security.seed) gives every pod the same CURVE keys, a pod with
 * another seed gets nowhere, and an agent without keys that would listen where other
 * hosts reach it refuses to start unless told it may (security.insecure).
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "harness.h"

static void write_seed(char *path, size_t cap, int n, const char *text)
{
    tmp_path(path, cap, "seed", n);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int start_pod(struct agent *a, int port, int index, const char *address,
                     const char *security)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "node:\n  index: %d\n  name: pod-%d\n  address: %s\n"
             "discovery:\n  peers: [\"%s:%d\"]\n"
             "security:\n%s"
             "groups:\n  - name: g\n    backend: host\n    members: 2\n"
             "    timeouts: {op_ms: 20000, heartbeat_ms: %d, join_ms: 5000}\n",
             index, index, address, address, port, security, TEST_HB_MS);
    return agent_start(a, NULL, body);
}

struct rank {
    const char *sock;
};

static int allreduce_main(void *arg)
{
    struct rank *r = arg;
    coll_conn *c;
    coll_group *g;
    coll_buffer *b;
    coll_group_info info;
    coll_request q;
    if (coll_connect(&c, r->sock, 10000) != COLL_OK) return 100;
    if (coll_group_open(&g, c, "g", COLL_SLOT_ANY) != COLL_OK) return 101;
    if (coll_group_wait(g, 20000) != COLL_OK || coll_group_info_get(g, &info) != COLL_OK)
        return 102;
    if (coll_mem_alloc(&b, c, 4096, COLL_DEVICE_HOST) != COLL_OK) return 103;
    float *x = coll_mem_ptr(b);
    for (int i = 0; i < 16; i++)
        x[i] = (float)(info.rank + 1);
    if (coll_allreduce(g, x, x + 16, 16, COLL_FLOAT32, COLL_SUM, NULL, &q) != COLL_OK ||
        coll_wait(c, q, 20000) != COLL_OK)
        return 104;
    for (int i = 0; i < 16; i++)
        if (x[16 + i] != 3.0f) return 105;
    coll_disconnect(&c);
    return 0;
}

/* Two pods with the deployment's seed form under CURVE and run; a third with a seed of
 * its own, claiming a member's index, is refused before any JOIN is read. */
static void a_seed_gives_every_pod_the_deployments_keys(void **state)
{
    (void)state;
    char seed[256], other[256], sec[512];
    write_seed(seed, sizeof(seed), 0, "q1W2e3R4t5Y6u7I8o9P0a1S2d3F4g5H6j7K8l9Z0x1C2v3B4\n");
    write_seed(other, sizeof(other), 1, "m1N2b3V4c5X6z7L8k9J0h1G2f3D4s5A6p7O8i9U0y1T2r3E4\n");
    struct agent a[3];
    int port = free_port();
    snprintf(sec, sizeof(sec), "  seed: %s\n  require_keys: true\n", seed);
    for (int i = 0; i < 2; i++)
        assert_int_equal(start_pod(&a[i], port, i, "127.0.0.1", sec), 0);
    struct rank r[2] = {{a[0].sock}, {a[1].sock}};
    pid_t p[2];
    for (int i = 0; i < 2; i++)
        p[i] = child_run(allreduce_main, &r[i]);
    for (int i = 0; i < 2; i++)
        assert_int_equal(child_wait(p[i], 60000), 0);
    assert_int_equal(agent_log_count(&a[0], "curve=on"), 1);
    /* the stranger: keys of its own seed (so another server key too: its handshake
     * fails before any ZAP request), the member's index; given 2 s, it gets no COMMIT
     * and the coordinator reads no JOIN of it */
    snprintf(sec, sizeof(sec), "  seed: %s\n", other);
    assert_int_equal(start_pod(&a[2], port, 1, "127.0.0.1", sec), 0);
    usleep(2000 * 1000);
    assert_int_equal(agent_stop(&a[2]), 0);
    assert_int_equal(agent_log_count(&a[2], "event=rendezvous.commit"), 0);
    assert_int_equal(agent_log_count(&a[2], "event=group.formed"), 0);
    /* its data address, as its JOIN would carry it: never in the coordinator's log */
    char line[512] = "", want[96];
    FILE *f = fopen(a[2].log, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) && !strstr(line, "event=net.start"))
        ;
    fclose(f);
    const char *d = strstr(line, " data=");
    assert_non_null(d);
    snprintf(want, sizeof(want), "%.*s ", (int)strcspn(d + 1, " "), d + 1);
    assert_int_equal(agent_log_count(&a[0], want), 0);
    /* and the group runs on */
    for (int i = 0; i < 2; i++)
        p[i] = child_run(allreduce_main, &r[i]);
    for (int i = 0; i < 2; i++)
        assert_int_equal(child_wait(p[i], 60000), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
    unlink(seed);
    unlink(other);
}

/* An IPv4 address of this machine other than loopback, or "" where it has none. */
static void own_address(char *out, size_t cap)
{
    struct ifaddrs *ifs, *i;
    out[0] = '\0';
    if (getifaddrs(&ifs) < 0) return;
    for (i = ifs; i && !out[0]; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct in_addr in = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if ((ntohl(in.s_addr) >> 24) == 127) continue;
        inet_ntop(AF_INET, &in, out, (socklen_t)cap);
    }
    freeifaddrs(ifs);
}

/* Protected mode: no keys and an address other hosts reach: the agent refuses to start
 * and says what to do; told security.insecure it starts, and says it loudly. */
static void no_keys_beyond_loopback_needs_insecure(void **state)
{
    (void)state;
    char addr[64];
    own_address(addr, sizeof(addr));
    if (!addr[0]) {
        fprintf(stderr, "SKIP: this machine has no IPv4 address but loopback\n");
        return;
    }
    struct agent a;
    int port = free_port();
    assert_int_equal(start_pod(&a, port, 0, addr, "  data: none\n"), -1);
    assert_true(agent_log_count(&a, "is reachable from other hosts and no CURVE keys") >= 1);
    assert_true(agent_log_count(&a, "security.insecure: true") >= 1);
    assert_int_equal(start_pod(&a, port, 0, addr, "  insecure: true\n"), 0);
    assert_true(agent_log_count(&a, "level=error event=security.unauthenticated") >= 1);
    assert_int_equal(agent_stop(&a), 0);
    /* loopback alone needs no word: nothing beyond this host reaches it */
    assert_int_equal(start_pod(&a, port, 0, "127.0.0.1", "  data: none\n"), 0);
    assert_true(agent_log_count(&a, "level=warn event=security.unauthenticated") >= 1);
    assert_int_equal(agent_stop(&a), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_seed_gives_every_pod_the_deployments_keys),
        cmocka_unit_test(no_keys_beyond_loopback_needs_insecure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
