/*
 * test_rendezvous.c: the rendezvous state machine (agent/rendezvous.c), driven directly:
 * a coordinator and members exchange real encoded frames through an in-memory bus, on
 * a clock the test moves. No sockets, no threads, no sleeping: each scenario runs in
 * microseconds and says exactly which frames, commits and ends it expects.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll/coll.h"
#include "harness.h"
#include "net_commid.h"
#include "rdv_wire.h"
#include "rendezvous.h"
#include "wire.h"

#define HB_MS 100
#define JOIN_MS 1000
#define MS 1000000LL
#define MAX_NODES 4
#define BUS_MAX 256

struct node {
    struct rendezvous sm;
    int index, gen; /* index: slot in nodes[] (routing); gen: restarts, part of the routing id */
    int me;         /* the node index it claims (its slot, unless a test says otherwise) */
    int up;         /* 0: its frames are lost (a dead or partitioned pod) */
    int auto_form;  /* its data connections come up as soon as it commits */
    int commits, ends;
    uint32_t commit_epoch;
    uint8_t secret[RDV_SECRET_BYTES];
    struct rdv_member members[RDV_MAX_NODES];
    int end_code, end_drain;
    int has_commid, commid0; /* the last COMMIT's id (its first byte) */
    char end_why[RDV_MSG_MAX];
    int sent[RDV_TYPE_END];
    /* answers to its children's asks (io.child_id), in order */
    int nanswers;
    struct answer {
        uint64_t hash;
        uint32_t nth;
        int code;
        uint8_t id[RDV_COMMID_BYTES];
        char why[RDV_MSG_MAX];
    } answers[8];
};

struct frame {
    int from, to; /* node indices */
    unsigned char bytes[sizeof(union rdv_msg)];
    size_t len;
};

static struct node nodes[MAX_NODES];
static int nnodes;
static struct frame bus[BUS_MAX];
static int nbus;
static int64_t now;
static uint64_t config_hash = 42;
static uint32_t rnd = 1;
static struct rdv_place places[MAX_NODES]; /* where each slot's pod says it runs */

static void id_of(const struct node *x, char *id, size_t cap)
{
    snprintf(id, cap, "member-%d-gen-%d", x->index, x->gen);
}

static void io_send(void *ctx, const unsigned char *id, size_t idlen, union rdv_msg *m)
{
    struct node *x = ctx;
    int to = 0;
    if (id) { /* the coordinator to a member: find it by its routing id */
        to = -1;
        for (int i = 1; i < nnodes; i++) {
            char want[64];
            id_of(&nodes[i], want, sizeof(want));
            if (strlen(want) == idlen && memcmp(want, id, idlen) == 0) to = i;
        }
        if (to < 0) return; /* gone: ZeroMQ drops it too */
    }
    x->sent[m->h.type]++;
    assert_true(nbus < BUS_MAX);
    struct frame *f = &bus[nbus++];
    m->h.len = (uint32_t)rdv_size(m);
    f->from = x->index;
    f->to = to;
    f->len = m->h.len;
    memcpy(f->bytes, m, f->len);
}

static void io_commit(void *ctx, const struct rdv_commit *c)
{
    struct node *x = ctx;
    x->commits++;
    x->has_commid = c->has_commid;
    x->commid0 = c->commid[0];
    x->commit_epoch = c->h.epoch;
    memcpy(x->secret, c->secret, sizeof(x->secret));
    memcpy(x->members, c->members, sizeof(struct rdv_member) * c->nodes);
    if (x->auto_form) rendezvous_formed(&x->sm);
}

/* As the net thread does with no op in flight: end at once. */
static void io_end(void *ctx, int code, const char *why, int drain)
{
    struct node *x = ctx;
    x->ends++;
    x->end_code = code;
    x->end_drain = drain;
    snprintf(x->end_why, sizeof(x->end_why), "%s", why);
    rendezvous_end(&x->sm, code, why, 0, now);
}

/* GPU groups: the coordinator's ids come from a thread of the owner's; this one has
 * none ready for the first ids_late asks. */
static int gpu_groups, ids_late, ids_asked, ids_made;
static int io_commid(void *ctx, uint8_t *id, char *why, size_t whylen)
{
    (void)ctx;
    (void)why;
    (void)whylen;
    if (ids_asked++ < ids_late) return 1;
    memset(id, 0x5a, RDV_COMMID_BYTES);
    id[1] = (uint8_t)++ids_made; /* each one its own */
    return 0;
}

static void io_child_id(void *ctx, uint64_t hash, uint32_t nth, int code, const uint8_t *id,
                        const char *why)
{
    struct node *x = ctx;
    assert_true(x->nanswers < 8);
    struct answer *a = &x->answers[x->nanswers++];
    a->hash = hash;
    a->nth = nth;
    a->code = code;
    if (id) memcpy(a->id, id, RDV_COMMID_BYTES);
    snprintf(a->why, sizeof(a->why), "%s", why ? why : "");
}

static void io_random(void *ctx, void *buf, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        rnd = rnd * 1103515245u + 12345u;
        ((uint8_t *)buf)[i] = (uint8_t)(rnd >> 16);
    }
}

/* Start the node in slot i claiming node index me (a pod's UID follows slot and gen). */
static void start_node_as(int i, int me, int nodes_total, uint64_t hash)
{
    struct node *x = &nodes[i];
    int gen = x->gen;
    memset(x, 0, sizeof(*x));
    x->index = i;
    x->me = me;
    x->gen = gen;
    x->up = 1;
    x->auto_form = 1;
    char pod[32], addr[32], uid[32];
    snprintf(pod, sizeof(pod), "pod-%d", i);
    snprintf(addr, sizeof(addr), "10.0.0.%d:7000", i + 1);
    snprintf(uid, sizeof(uid), "uid-%d-%d", i, gen);
    struct rendezvous_settings st = {.group = "g",
                                     .pod = pod,
                                     .data_addr = addr,
                                     .uid = uid,
                                     .nodes = nodes_total,
                                     .me = me,
                                     .nlocal = 1,
                                     .config_hash = hash,
                                     .heartbeat_ms = HB_MS,
                                     .join_ms = JOIN_MS,
                                     .gpu = gpu_groups,
                                     .place = places[i]};
    struct rendezvous_io io = {.ctx = x,
                               .send = io_send,
                               .commit = io_commit,
                               .end = io_end,
                               .random = io_random,
                               .commid = gpu_groups ? io_commid : NULL,
                               .child_id = io_child_id};
    rendezvous_init(&x->sm, &st, &io);
}

static void start_node(int i, int nodes_total, uint64_t hash)
{
    start_node_as(i, i, nodes_total, hash);
}

static void cluster(int n)
{
    memset(nodes, 0, sizeof(nodes));
    nnodes = n;
    nbus = 0;
    now = 1000 * MS;
    for (int i = 0; i < n; i++)
        start_node(i, n, config_hash);
}

/* Deliver what is on the bus (and what that provokes), through the real decoder. */
static void deliver(void)
{
    for (int k = 0; k < nbus; k++) {
        struct frame f = bus[k];
        struct node *src = &nodes[f.from], *dst = &nodes[f.to];
        if (!src->up || !dst->up) continue;
        union rdv_msg m;
        char why[160];
        assert_int_equal(rdv_decode(f.bytes, f.len, &m, why, sizeof(why)), 0);
        char id[64];
        id_of(src, id, sizeof(id));
        if (f.to == 0)
            rendezvous_frame(&dst->sm, (const unsigned char *)id, strlen(id), &m, now);
        else
            rendezvous_frame(&dst->sm, NULL, 0, &m, now);
    }
    nbus = 0;
}

/* Move the clock on by ms in steps of 10 ms, ticking every live node. */
static void run_for(int ms)
{
    for (int t = 0; t < ms; t += 10) {
        now += 10 * MS;
        for (int i = 0; i < nnodes; i++)
            if (nodes[i].up) rendezvous_tick(&nodes[i].sm, now);
        deliver();
    }
}

static void assert_formed_n(uint32_t epoch, int n)
{
    for (int i = 0; i < n; i++) {
        assert_true(nodes[i].sm.committed);
        assert_true(nodes[i].sm.formed);
        assert_int_equal(nodes[i].sm.epoch, epoch);
        assert_int_equal(nodes[i].commit_epoch, epoch);
        assert_memory_equal(nodes[i].secret, nodes[0].secret, RDV_SECRET_BYTES);
    }
}

static void assert_formed(uint32_t epoch)
{
    assert_formed_n(epoch, nnodes);
}

/* Three pods: members join, the coordinator commits epoch 1 with one member table and
 * one secret for all, and heartbeats then keep the epoch alive indefinitely. */
static void three_pods_form_one_epoch(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(nodes[i].commits, 1);
        for (int j = 0; j < 3; j++) {
            char want[32], got[RDV_ADDR_MAX];
            snprintf(want, sizeof(want), "10.0.0.%d:7000", j + 1);
            rdv_member_addr(&nodes[i].members[j], got, sizeof(got));
            assert_string_equal(got, want);
        }
    }
    run_for(5000); /* 50 heartbeat intervals */
    assert_formed(1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(nodes[i].ends, 0);
    assert_true(nodes[0].sent[RDV_HEARTBEAT] >= 2 * 45);
    assert_true(nodes[1].sent[RDV_HEARTBEAT] >= 45);
}

/* The coordinator waits for the last member however late, then commits. */
static void a_late_member_is_waited_for(void **state)
{
    (void)state;
    cluster(3);
    nodes[2].up = 0; /* not started yet */
    run_for(3000);
    assert_false(nodes[0].sm.committed);
    assert_false(nodes[1].sm.committed);
    assert_int_equal(nodes[0].commits + nodes[1].commits, 0);
    assert_true(nodes[1].sent[RDV_JOIN] >= 25); /* it keeps asking, once per interval */
    start_node(2, 3, config_hash);
    run_for(50);
    assert_formed(1);
}

/* A member that stops talking for 3 heartbeat intervals ends the epoch everywhere
 * (PEER_LOST, naming it); the others are formed again as soon as it is back. */
static void a_silent_member_ends_the_epoch(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    nodes[2].up = 0;
    run_for(150);
    assert_int_equal(nodes[0].ends, 0); /* under three intervals: not yet */
    run_for(250);
    assert_int_equal(nodes[0].ends, 1);
    assert_int_equal(nodes[0].end_code, COLL_ERR_PEER_LOST);
    assert_non_null(strstr(nodes[0].end_why, "node 2 (pod-2) silent"));
    assert_int_equal(nodes[1].ends, 1); /* told by the coordinator's ABORT */
    assert_int_equal(nodes[1].end_code, COLL_ERR_PEER_LOST);
    assert_non_null(strstr(nodes[1].end_why, "silent"));
    /* ... that the pod went silent: node 1 waits for none of its bytes either (found at
     * 242e584: members drained as for a pod that left, and their ops waited on their
     * sockets' keepalive, 3.9-5.1 s at a 1 s heartbeat) */
    assert_int_equal(nodes[0].end_drain, RDV_DRAIN_SILENT);
    assert_int_equal(nodes[1].end_drain, RDV_DRAIN_SILENT);
    assert_false(nodes[1].sm.committed);
    nodes[2].up = 1;
    run_for(3 * HB_MS + 300); /* it finds its coordinator silent, then joins again */
    assert_formed(2);
}

/* A member whose group settings differ is refused with the reason (and no hash), and
 * never commits; the coordinator keeps no state for it. */
static void a_config_mismatch_is_refused(void **state)
{
    (void)state;
    cluster(2);
    start_node(1, 2, config_hash + 1);
    run_for(500);
    assert_false(nodes[0].sm.committed);
    assert_false(nodes[1].sm.committed);
    assert_true(nodes[0].sent[RDV_REJECT] >= 4);
    assert_int_equal(nodes[0].sent[RDV_COMMIT], 0);
    assert_false(nodes[0].sm.peers[1].present);
    /* same values, another hash: what the values do not show */
    assert_non_null(strstr(nodes[1].sm.last_reject, "pod pod-1's settings differ from the "
                                                    "coordinator's (pod pod-0)"));
    assert_non_null(strstr(nodes[1].sm.last_reject, "device list"));
    /* an upgrade that changed timeouts: the refusal names each key, both values */
    cluster(2);
    nodes[0].sm.settings.op_ms = 10000;
    nodes[0].sm.settings.heartbeat_ms = 1000;
    start_node(1, 2, config_hash + 1);
    nodes[1].sm.settings.op_ms = 5000;
    nodes[1].sm.settings.heartbeat_ms = 1000;
    run_for(200);
    assert_non_null(strstr(nodes[1].sm.last_reject, ": op_ms 5000, not 10000"));
    assert_null(strstr(nodes[1].sm.last_reject, "heartbeat_ms"));
    /* a world size that differs is named as such */
    cluster(2);
    start_node(1, 3, config_hash);
    run_for(200);
    assert_non_null(strstr(nodes[1].sm.last_reject, "world size"));
    assert_false(nodes[0].sm.committed);
}

/* A member that joins again while the epoch is formed (its pod restarted: a new routing
 * id, last epoch 0) ends the epoch; the next epoch is newer than any seen. */
static void a_member_that_joins_again_ends_the_epoch(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    nodes[1].gen++;
    start_node(1, 3, config_hash);
    run_for(10);
    assert_int_equal(nodes[0].ends, 1);
    assert_non_null(strstr(nodes[0].end_why, "node 1 (pod-1) joined again"));
    assert_int_equal(nodes[2].ends, 1);
    run_for(100);
    assert_formed(2);
    /* the same JOIN twice (a retransmission before COMMIT arrived) changes nothing */
    union rdv_msg m;
    rdv_init(&m, RDV_JOIN, "g", 0);
    m.h.inc = nodes[0].sm.inc;
    m.join.config_hash = config_hash;
    m.join.nodes = 3;
    m.join.node_index = 2;
    m.join.local_slots = 1;
    m.join.last_epoch = 1;
    snprintf(m.join.pod, sizeof(m.join.pod), "pod-2");
    snprintf(m.join.data_addr, sizeof(m.join.data_addr), "10.0.0.3:7000");
    snprintf(m.join.uid, sizeof(m.join.uid), "uid-2-0");
    char id[64];
    id_of(&nodes[2], id, sizeof(id));
    rendezvous_frame(&nodes[0].sm, (const unsigned char *)id, strlen(id), &m, now);
    deliver();
    assert_int_equal(nodes[0].ends, 1);
    assert_formed(2);
}

/* The coordinator restarts (nobody present): members find it silent, join again, and
 * take the new coordinator's first epoch, of an incarnation they have not seen. */
static void a_restarted_coordinator_starts_a_new_incarnation(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    /* move on to epoch 3 first, so that "past" means something */
    for (int k = 0; k < 2; k++) {
        rendezvous_fail(&nodes[1].sm, COLL_ERR_PEER_LOST, "test", 1, 0);
        run_for(100);
    }
    assert_formed(3);
    uint64_t old = nodes[0].sm.inc;
    start_node(0, 3, config_hash);
    assert_true(nodes[0].sm.inc != 0 && nodes[0].sm.inc != old);
    run_for(2 * HB_MS);
    assert_int_equal(nodes[1].ends, 2); /* not yet */
    run_for(2 * HB_MS + 100);
    assert_int_equal(nodes[1].ends, 3);
    assert_string_equal(nodes[1].end_why, "the coordinator is silent");
    run_for(200);
    assert_formed(1);
    for (int i = 1; i < 3; i++)
        assert_true(nodes[i].sm.inc == nodes[0].sm.inc);
}

/* Found at 242e584: one JOIN with last_epoch 0xFFFFFFFE made the coordinator commit
 * 0xFFFFFFFF, then wrap to 0, and the members dropped every later COMMIT as old. What
 * a member says of its last epoch no longer moves the count: the group forms on the
 * coordinator's next epoch, and again and again after that. */
static void a_members_last_epoch_does_not_move_the_count(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    /* node 2's pod restarts and says it last committed epoch 0xFFFFFFFE (through the
     * decoder, as from the network) */
    nodes[2].gen++;
    start_node(2, 3, config_hash);
    nodes[2].sm.inc = 0x1234;
    nodes[2].sm.epoch = 0xFFFFFFFEu;
    run_for(200);
    assert_formed(2);
    for (int k = 0; k < 5; k++) { /* and it keeps coming back */
        nodes[2].gen++;
        start_node(2, 3, config_hash);
        nodes[2].sm.inc = 0x1234;
        nodes[2].sm.epoch = 0xFFFFFFFEu;
        run_for(200);
        assert_formed((uint32_t)(3 + k));
    }
    /* the coordinator's count at its end: a new incarnation, from 1, and every member
     * takes it */
    uint64_t old = nodes[0].sm.inc;
    for (int i = 0; i < 3; i++)
        nodes[i].sm.epoch = UINT32_MAX - 1;
    rendezvous_fail(&nodes[1].sm, COLL_ERR_PEER_LOST, "test", 1, 0);
    run_for(200);
    assert_formed(UINT32_MAX);
    rendezvous_fail(&nodes[1].sm, COLL_ERR_PEER_LOST, "test", 1, 0);
    run_for(200);
    assert_formed(1);
    assert_true(nodes[0].sm.inc != old);
}

/* The decoder refuses what no agent sends: a COMMIT without an incarnation or an epoch,
 * a JOIN whose last epoch has no incarnation (or the other way round), and names with
 * bytes that would forge log lines. */
static void the_decoder_refuses_epochs_and_names_no_agent_sends(void **state)
{
    (void)state;
    union rdv_msg m, out;
    char why[160];
    rdv_init(&m, RDV_COMMIT, "g", 1);
    m.commit.nodes = 1;
    rdv_member_set(&m.commit.members[0], "10.0.0.1:7000");
    m.h.len = (uint32_t)rdv_size(&m);
    m.h.inc = 0;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "incarnation"));
    m.h.inc = 5;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    m.h.epoch = 0;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    rdv_init(&m, RDV_JOIN, "g", 0);
    m.join.nodes = 2;
    m.join.node_index = 1;
    snprintf(m.join.pod, sizeof(m.join.pod), "pod-1");
    snprintf(m.join.uid, sizeof(m.join.uid), "uid-1");
    snprintf(m.join.data_addr, sizeof(m.join.data_addr), "10.0.0.2:7000");
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    m.join.last_epoch = 3; /* of no incarnation */
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    m.h.inc = 9;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    m.join.last_epoch = 0; /* an incarnation without an epoch */
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    m.join.last_epoch = 3;
    snprintf(m.join.pod, sizeof(m.join.pod), "x\" level=error event=agent.stopped");
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "printable"));
    snprintf(m.join.pod, sizeof(m.join.pod), "pod-1\nts=x level=error event=agent.stopped");
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    snprintf(m.join.pod, sizeof(m.join.pod), "pod-1");
    snprintf(m.join.uid, sizeof(m.join.uid), "uid\x01");
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
}

/* Found at 242e584: the coordinator of a GPU group called ncclGetUniqueId on the net
 * thread every epoch (the first call also starts NCCL's bootstrap). Now the id comes
 * from a thread of its own without waiting: not made yet, the commit waits for a later
 * tick, with every pod still present, and carries the id when it is there. */
static void a_commit_waits_for_its_id_without_blocking(void **state)
{
    (void)state;
    gpu_groups = 1;
    ids_late = 3;
    ids_asked = 0;
    cluster(3);
    run_for(20); /* every JOIN in, the id not made */
    assert_false(nodes[0].sm.committed);
    assert_true(nodes[0].sm.commit_waiting);
    assert_true(ids_asked >= 1 && ids_asked <= 3);
    run_for(100);
    assert_formed(1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(nodes[i].has_commid, 1);
        assert_int_equal(nodes[i].commid0, 0x5a);
    }
    assert_false(nodes[0].sm.commit_waiting);
    gpu_groups = 0;
}

/* The id thread: an id not made yet is "not yet" at once (the id function here waits
 * for the test's word, as ncclGetUniqueId may wait for NCCL's bootstrap), the net
 * thread is woken through its eventfd when it is made, and it is taken once; a failure
 * says why once, and the next take asks again. */
static int gate[2], slow_calls;
static int slow_id(uint8_t *id, char *why, size_t whylen)
{
    char b;
    if (read(gate[0], &b, 1) != 1) b = 'x';
    if (b == 'f') {
        snprintf(why, whylen, "no NCCL here");
        return -1;
    }
    memset(id, ++slow_calls, RDV_COMMID_BYTES);
    return 0;
}

static void the_id_thread_never_makes_the_net_thread_wait(void **state)
{
    (void)state;
    assert_int_equal(pipe(gate), 0);
    int efd = eventfd(0, EFD_CLOEXEC);
    char why[160];
    struct net_commid *c = net_commid_start(slow_id, efd, why, sizeof(why));
    assert_non_null(c);
    uint8_t id[RDV_COMMID_BYTES];
    uint64_t v;
    assert_int_equal(net_commid_take(c, id, why, sizeof(why)), 1); /* not made: not yet */
    assert_int_equal(write(gate[1], "o", 1), 1);
    assert_int_equal(read(efd, &v, sizeof(v)), (ssize_t)sizeof(v)); /* woken when made */
    assert_int_equal(net_commid_take(c, id, why, sizeof(why)), 0);
    assert_int_equal(id[0], 1);
    assert_int_equal(net_commid_take(c, id, why, sizeof(why)), 1); /* the next: not yet */
    assert_int_equal(write(gate[1], "f", 1), 1);
    assert_int_equal(read(efd, &v, sizeof(v)), (ssize_t)sizeof(v));
    assert_int_equal(net_commid_take(c, id, why, sizeof(why)), -1);
    assert_string_equal(why, "no NCCL here");
    assert_int_equal(write(gate[1], "o", 1), 1); /* asked again */
    assert_int_equal(read(efd, &v, sizeof(v)), (ssize_t)sizeof(v));
    assert_int_equal(net_commid_take(c, id, why, sizeof(why)), 0);
    assert_int_equal(id[0], 2);
    assert_int_equal(write(gate[1], "o", 1), 1); /* lets the spare it makes finish */
    net_commid_stop(&c);
    assert_null(c);
    close(efd);
    close(gate[0]);
    close(gate[1]);
}

/* Frames of an epoch that is over change nothing: an old COMMIT, an old ABORT, a
 * heartbeat from a stranger. A newer COMMIT ends the current epoch first. */
static void stale_frames_are_ignored(void **state)
{
    (void)state;
    cluster(2);
    run_for(50);
    assert_formed(1);
    union rdv_msg m;
    const uint64_t inc = nodes[0].sm.inc;
    rdv_init(&m, RDV_COMMIT, "g", 1);
    m.h.inc = inc;
    m.commit.nodes = 2;
    rendezvous_frame(&nodes[1].sm, NULL, 0, &m, now);
    rdv_init(&m, RDV_COMMIT, "g", 0);
    m.h.inc = inc;
    m.commit.nodes = 2;
    rendezvous_frame(&nodes[1].sm, NULL, 0, &m, now);
    rdv_init(&m, RDV_ABORT, "g", 0);
    m.h.inc = inc;
    m.abort.code = COLL_ERR_PEER_LOST;
    rendezvous_frame(&nodes[1].sm, NULL, 0, &m, now);
    rendezvous_frame(&nodes[0].sm, (const unsigned char *)"stranger", 8, &m, now);
    /* the current epoch's number, of another incarnation */
    rdv_init(&m, RDV_ABORT, "g", 1);
    m.h.inc = inc + 1;
    m.abort.code = COLL_ERR_PEER_LOST;
    rendezvous_frame(&nodes[1].sm, NULL, 0, &m, now);
    rdv_init(&m, RDV_HEARTBEAT, "g", 1);
    m.h.inc = inc;
    rendezvous_frame(&nodes[0].sm, (const unsigned char *)"stranger", 8, &m, now);
    assert_int_equal(nodes[0].ends + nodes[1].ends, 0);
    assert_int_equal(nodes[1].commits, 1);
    assert_formed(1);
    /* an ABORT for the current epoch from a member that is not the one on record */
    rdv_init(&m, RDV_ABORT, "g", 1);
    m.h.inc = inc;
    rendezvous_frame(&nodes[0].sm, (const unsigned char *)"stranger", 8, &m, now);
    assert_int_equal(nodes[0].ends, 0);
    /* a newer commit: the old epoch ends, the new one is taken */
    rdv_init(&m, RDV_COMMIT, "g", 7);
    m.h.inc = inc;
    m.commit.nodes = 2;
    rendezvous_frame(&nodes[1].sm, NULL, 0, &m, now);
    assert_int_equal(nodes[1].ends, 1);
    assert_int_equal(nodes[1].commits, 2);
    assert_int_equal(nodes[1].sm.epoch, 7);
}

/* Data connections that do not come up within join_ms end the epoch with ABORT to the
 * others; a member that never formed backs off (with jitter) before joining again. */
static void an_epoch_that_does_not_form_ends_and_backs_off(void **state)
{
    (void)state;
    cluster(2);
    nodes[0].auto_form = nodes[1].auto_form = 0;
    run_for(50);
    assert_true(nodes[1].sm.committed);
    assert_false(nodes[1].sm.formed);
    run_for(JOIN_MS + 50);
    assert_true(nodes[1].ends >= 1);
    assert_string_equal(nodes[1].end_why, "data connections not up within join_ms");
    assert_true(nodes[1].sm.join_backoff >= RDV_BACKOFF_MIN_NS);
    int64_t b = nodes[1].sm.join_backoff;
    run_for(JOIN_MS + 2000);
    assert_true(nodes[1].sm.join_backoff > b); /* it doubles while the group cannot form */
    assert_true(nodes[1].sm.join_backoff <= RDV_BACKOFF_MAX_NS);
    nodes[0].auto_form = nodes[1].auto_form = 1;
    run_for(JOIN_MS + 2 * 2000);
    assert_formed(nodes[0].sm.epoch);
    assert_int_equal(nodes[1].sm.join_backoff, 0);
}

/* Two pods claim node index 1 (a stale pod and its replacement, or a misconfiguration):
 * the later one replaces the first once; the first is refused with a reason that names
 * both and backs off, and the group stays formed: a handful of epochs, not a storm. */
static void two_pods_with_one_index_cost_one_epoch(void **state)
{
    (void)state;
    cluster(3); /* slots 0, 1, 2: a group of 2 pods (indices 0 and 1) plus the intruder */
    nnodes = 3;
    start_node_as(0, 0, 2, config_hash);
    start_node_as(1, 1, 2, config_hash);
    nodes[2].up = 0;
    run_for(50);
    assert_formed_n(1, 2);
    start_node_as(2, 1, 2, config_hash); /* a second pod with index 1 and its own UID */
    run_for(10000);                      /* 100 heartbeat intervals */
    /* the newcomer holds index 1; the first was replaced once and then kept out */
    assert_true(nodes[0].sm.committed && nodes[0].sm.formed);
    assert_true(nodes[2].sm.committed && nodes[2].sm.formed);
    assert_int_equal(nodes[2].sm.epoch, nodes[0].sm.epoch);
    assert_false(nodes[1].sm.committed);
    assert_true(nodes[0].commits <= 3);
    assert_non_null(strstr(nodes[1].sm.last_reject, "two pods claim node index 1"));
    assert_non_null(strstr(nodes[1].sm.last_reject, "uid-1-0"));
    assert_non_null(strstr(nodes[1].sm.last_reject, "uid-2-0"));
    /* refused JOINs come with backoff: far fewer than one per interval */
    printf("the replaced pod sent %d JOINs in 100 intervals; coordinator commits %d\n",
           nodes[1].sent[RDV_JOIN], nodes[0].commits);
    assert_true(nodes[1].sent[RDV_JOIN] < 20);
    assert_true(nodes[1].sm.join_backoff >= RDV_BACKOFF_MAX_NS / 2);
    /* when the newcomer is gone (silent), the first may hold the index again */
    nodes[2].up = 0;
    run_for(3 * HB_MS + 2 * 2000 + 500);
    assert_true(nodes[1].sm.committed && nodes[1].sm.formed);
    assert_int_equal(nodes[1].sm.epoch, nodes[0].sm.epoch);
}

/* A member that stops cleanly says so: the epoch ends at once everywhere, naming it,
 * without waiting 3 heartbeat intervals; a stopping coordinator tells every member. */
static void a_leaving_pod_ends_the_epoch_at_once(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    rendezvous_leave(&nodes[2].sm);
    nodes[2].up = 1;
    deliver();
    nodes[2].up = 0;
    run_for(10); /* one step, far below 3 intervals */
    assert_int_equal(nodes[0].ends, 1);
    assert_non_null(strstr(nodes[0].end_why, "node 2 (pod-2) left"));
    assert_int_equal(nodes[1].ends, 1);
    assert_false(nodes[0].sm.peers[2].present);
    /* the coordinator leaves */
    cluster(3);
    run_for(50);
    assert_formed(1);
    rendezvous_leave(&nodes[0].sm);
    deliver();
    nodes[0].up = 0;
    run_for(10);
    for (int i = 1; i < 3; i++) {
        assert_int_equal(nodes[i].ends, 1);
        assert_non_null(strstr(nodes[i].end_why, "the coordinator is stopping"));
    }
}

/* LEAVE is a frame from the network: from a stranger (no member's routing id) it changes
 * nothing; replayed after the member left, nothing either; a JOIN without a pod UID does
 * not even decode. */
static void forged_and_replayed_leaves_change_nothing(void **state)
{
    (void)state;
    cluster(3);
    run_for(50);
    assert_formed(1);
    union rdv_msg m;
    rdv_init(&m, RDV_LEAVE, "g", 1);
    m.leave.node_index = 1; /* claims to be node 1 */
    rendezvous_frame(&nodes[0].sm, (const unsigned char *)"stranger", 8, &m, now);
    run_for(10);
    assert_int_equal(nodes[0].ends, 0);
    assert_formed(1);
    /* node 2 leaves for real; its LEAVE replayed later is ignored */
    rendezvous_leave(&nodes[2].sm);
    deliver();
    assert_int_equal(nodes[0].ends, 1);
    char id[64];
    id_of(&nodes[2], id, sizeof(id));
    rdv_init(&m, RDV_LEAVE, "g", 1);
    m.leave.node_index = 2;
    rendezvous_frame(&nodes[0].sm, (const unsigned char *)id, strlen(id), &m, now);
    assert_int_equal(nodes[0].ends, 1);
    /* and the group forms again when node 2 joins */
    run_for(300);
    assert_formed(2);
    rdv_init(&m, RDV_JOIN, "g", 0);
    m.join.nodes = 3;
    m.join.node_index = 1;
    snprintf(m.join.data_addr, sizeof(m.join.data_addr), "10.0.0.2:7000");
    m.h.len = (uint32_t)rdv_size(&m);
    union rdv_msg out;
    char why[160];
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "without a pod UID"));
}

/* ---- where pods run ------------------------------------------------------------------ */

static struct rdv_place at(uint64_t host, const int *cpus, int ncpus)
{
    struct rdv_place p = {.host = host};
    for (int k = 0; k < ncpus; k++)
        p.cpus[cpus[k] / 8] |= (uint8_t)(1u << (cpus[k] % 8));
    return p;
}

static int shared(const struct rdv_place *p, int n, int i)
{
    uint16_t flags[8] = {0};
    assert_int_equal(rdv_mark_shared(p, n, flags), 0);
    for (int k = 0; k < n; k++)
        assert_int_equal(flags[k] & ~RDV_MEMBER_FLAGS_KNOWN, 0);
    return (flags[i] & RDV_MEMBER_CPU_SHARED) != 0;
}

/* A pod shares when another one of the group is on its host with CPUs that meet its
 * own, or when either does not say where it runs (host 0: anywhere; no CPUs: any of
 * its host's). */
static void the_coordinator_tells_which_pods_may_share_a_cpu(void **state)
{
    (void)state;
    const int c0[] = {0}, c1[] = {1}, c01[] = {0, 1}, c1023[] = {1023}, c8[] = {8};
    /* two hosts, the same CPUs: nobody shares */
    struct rdv_place two_hosts[] = {at(7, c0, 1), at(9, c0, 1)};
    assert_false(shared(two_hosts, 2, 0));
    assert_false(shared(two_hosts, 2, 1));
    /* one host, a CPU each (the benchmark's two pods) */
    struct rdv_place apart[] = {at(7, c0, 1), at(7, c1, 1)};
    assert_false(shared(apart, 2, 0));
    assert_false(shared(apart, 2, 1));
    /* four pods on two CPUs: every one shares */
    struct rdv_place four[] = {at(7, c0, 1), at(7, c1, 1), at(7, c0, 1), at(7, c1, 1)};
    for (int i = 0; i < 4; i++)
        assert_true(shared(four, 4, i));
    /* one pod on both CPUs meets both others; a pod on another host meets nobody; the
     * highest CPU and one past a byte count like any other */
    struct rdv_place mixed[] = {at(7, c01, 2), at(7, c1, 1), at(5, c1, 1),   at(7, c1023, 1),
                                at(5, c8, 1),  at(7, c0, 1), at(3, c1023, 1)};
    assert_true(shared(mixed, 7, 0));
    assert_true(shared(mixed, 7, 1));
    assert_false(shared(mixed, 7, 2));
    assert_false(shared(mixed, 7, 3));
    assert_false(shared(mixed, 7, 4));
    assert_true(shared(mixed, 7, 5));
    assert_false(shared(mixed, 7, 6));
    /* no CPUs said: any of its host's, so it meets every pod there and no other */
    struct rdv_place any_cpu[] = {at(7, NULL, 0), at(7, c1023, 1), at(9, c0, 1)};
    assert_true(shared(any_cpu, 3, 0));
    assert_true(shared(any_cpu, 3, 1));
    assert_false(shared(any_cpu, 3, 2));
    /* a pod that does not know its host may be on anyone's: all share */
    struct rdv_place nowhere[] = {at(0, c0, 1), at(7, c1, 1), at(9, c1, 1)};
    for (int i = 0; i < 3; i++)
        assert_true(shared(nowhere, 3, i));
    /* one pod alone shares with nobody */
    assert_false(shared(apart, 1, 0));
}

/* The flags travel in COMMIT to every member, each pod's the same everywhere, and a
 * pod that re-forms in another place is told anew. */
/* The send/recv frames' phases (p2p.c): a send's payload follows its eager or DATA
 * header, an ask (RTS), an ack and a CTS carry none; other phases are refused, named. */
static void send_frames_say_their_phase_and_payload(void **state)
{
    (void)state;
    struct data_op_hdr h = {.magic = DATA_MAGIC,
                            .kind = WIRE_OP_SEND,
                            .dtype = COLL_FLOAT32,
                            .src_rank = 2, /* node 1 of 2 ranks each, to node 0 */
                            .dst_rank = 0,
                            .count = 100000};
    uint64_t bytes = 1;
    char why[128];
    const struct {
        uint8_t kind, phase;
        int ok;
        uint64_t bytes;
    } cases[] = {
        {WIRE_OP_SEND, P2P_EAGER, 1, 400000}, {WIRE_OP_SEND, P2P_RTS, 1, 0},
        {WIRE_OP_SEND, P2P_DATA, 1, 400000},  {WIRE_OP_SEND, 3, 0, 0},
        {WIRE_OP_RECV, P2P_ACK, 1, 0},        {WIRE_OP_RECV, P2P_CTS, 1, 0},
        {WIRE_OP_RECV, P2P_DATA, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        h.kind = cases[i].kind;
        h.redop = cases[i].phase;
        int rc = data_send_hdr_check(&h, 2, 1, 0, &bytes, why, sizeof(why));
        assert_int_equal(rc == 0, cases[i].ok);
        if (cases[i].ok)
            assert_int_equal(bytes, cases[i].bytes);
        else
            assert_non_null(strstr(why, "phase"));
    }
    /* root: a send's frames carry 0 or WIRE_SIG_ON | a signature that names an op */
    h.kind = WIRE_OP_SEND;
    h.redop = P2P_EAGER;
    const struct {
        uint32_t root;
        int ok;
    } sigs[] = {{0, 1},
                {WIRE_SIG_ON | WIRE_SIG(WIRE_OP_ALLREDUCE, COLL_SUM), 1},
                {WIRE_SIG_ON | WIRE_SIG(WIRE_OP_BARRIER, 0), 1},
                {WIRE_SIG(WIRE_OP_ALLREDUCE, COLL_MAX), 0},
                {WIRE_SIG_ON | WIRE_SIG(WIRE_OP_SEND, 0), 0},
                {WIRE_SIG_ON | WIRE_SIG(WIRE_OP_ALLGATHER, COLL_MAX), 0},
                {0x200u | WIRE_SIG(WIRE_OP_ALLREDUCE, COLL_SUM), 0},
                {0xffffffffu, 0}};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        h.root = (int32_t)sigs[i].root;
        assert_int_equal(data_send_hdr_check(&h, 2, 1, 0, &bytes, why, sizeof(why)) == 0,
                         sigs[i].ok);
        if (!sigs[i].ok) assert_non_null(strstr(why, "signature"));
    }
    h.root = 0;
    /* flags: a send's frames may say no ack (P2P_F_NOACK); nothing else, and no ack or
     * CTS carries any */
    h.redop = P2P_EAGER;
    for (uint8_t kind = WIRE_OP_SEND; kind <= WIRE_OP_RECV; kind++) {
        h.kind = kind;
        for (unsigned f = 1; f < 256; f <<= 1) {
            h.flags = (uint8_t)f;
            int ok = kind == WIRE_OP_SEND && f == P2P_F_NOACK;
            assert_int_equal(data_send_hdr_check(&h, 2, 1, 0, &bytes, why, sizeof(why)) == 0, ok);
            if (!ok) assert_non_null(strstr(why, "flags"));
        }
    }
}

static void each_member_learns_where_the_others_run(void **state)
{
    (void)state;
    const int c0[] = {0}, c1[] = {1}, c2[] = {2};
    places[0] = at(7, c0, 1);
    places[1] = at(7, c1, 1);
    places[2] = at(7, c1, 1);
    cluster(3);
    run_for(50);
    assert_formed(1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(nodes[i].members[0].flags, 0);
        assert_int_equal(nodes[i].members[1].flags, RDV_MEMBER_CPU_SHARED);
        assert_int_equal(nodes[i].members[2].flags, RDV_MEMBER_CPU_SHARED);
    }
    /* pod 2 comes back on a CPU of its own: nobody shares in the next epoch */
    places[2] = at(7, c2, 1);
    nodes[2].gen++;
    start_node(2, 3, config_hash);
    run_for(300);
    assert_formed(2);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            assert_int_equal(nodes[i].members[j].flags, 0);
    memset(places, 0, sizeof(places));
    /* a COMMIT with a flag this agent does not know is refused, saying so */
    union rdv_msg m, out;
    rdv_init(&m, RDV_COMMIT, "g", 3);
    m.h.inc = 1;
    m.commit.nodes = 2;
    for (int i = 0; i < 2; i++)
        assert_int_equal(rdv_member_set(&m.commit.members[i], "10.0.0.1:7000"), 0);
    m.h.len = (uint32_t)rdv_size(&m);
    char why[160];
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    m.commit.members[1].flags = RDV_MEMBER_CPU_SHARED;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    m.commit.members[1].flags = 4;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "member 1 has unknown flags 0x4"));
}

/* ---- children across pods of GPU groups (CHILD_ASK, CHILD_ID) ------------------------- */

/* n pods of a GPU group, formed in epoch 1, with ids made at once. */
static void gpu_cluster(int n)
{
    gpu_groups = 1;
    ids_late = ids_asked = ids_made = 0;
    cluster(n);
    run_for(50);
    assert_formed(1);
}

static void ask(int node, const uint32_t *ranks, uint32_t n, uint32_t nth)
{
    rendezvous_child_ask(&nodes[node].sm, ranks, n, nth);
    deliver();
}

static const struct answer *last_answer(int node)
{
    assert_true(nodes[node].nanswers > 0);
    return &nodes[node].answers[nodes[node].nanswers - 1];
}

/* Every pod that asks for one child (its list and its count of that list) gets one id,
 * made for it: another list, or the same list's next child, gets another; the
 * coordinator forgets a child once each of its pods has had the answer, and all of
 * them with the epoch. */
static void the_pods_of_a_child_get_one_id(void **state)
{
    (void)state;
    gpu_cluster(3);
    const uint32_t a[] = {2, 1}, all[] = {0, 1, 2};
    ask(1, a, 2, 1);
    assert_int_equal(nodes[1].nanswers, 1);
    assert_int_equal(nodes[0].sm.nchildren, 1); /* pod 2 has yet to ask */
    ask(2, a, 2, 1);
    assert_int_equal(nodes[2].nanswers, 1);
    assert_int_equal(nodes[0].sm.nchildren, 0);
    assert_int_equal(last_answer(1)->code, COLL_OK);
    assert_int_equal(last_answer(1)->hash, rdv_child_hash(a, 2));
    assert_int_equal(last_answer(1)->nth, 1);
    assert_memory_equal(last_answer(1)->id, last_answer(2)->id, RDV_COMMID_BYTES);
    /* all three pods, the coordinator among them (it answers itself) */
    for (int i = 0; i < 3; i++)
        ask(i, all, 3, 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(last_answer(i)->code, COLL_OK);
        assert_memory_equal(last_answer(i)->id, last_answer(0)->id, RDV_COMMID_BYTES);
    }
    assert_memory_not_equal(last_answer(0)->id, nodes[1].answers[0].id, RDV_COMMID_BYTES);
    /* the same list again: the second child of it, a new id */
    ask(1, a, 2, 2);
    assert_int_equal(last_answer(1)->nth, 2);
    assert_memory_not_equal(last_answer(1)->id, nodes[1].answers[0].id, RDV_COMMID_BYTES);
    assert_int_equal(nodes[0].sm.nchildren, 1);
    /* an ask whose answer was lost is answered again, with the same id */
    uint8_t first[RDV_COMMID_BYTES];
    memcpy(first, last_answer(1)->id, sizeof(first));
    ask(1, a, 2, 2);
    assert_memory_equal(last_answer(1)->id, first, RDV_COMMID_BYTES);
    /* ... and so is one whose child every pod has (its answer lost in a reconnect), as
     * long as the table has room for it */
    memcpy(first, nodes[1].answers[0].id, sizeof(first));
    ask(1, a, 2, 1);
    assert_int_equal(last_answer(1)->code, COLL_OK);
    assert_memory_equal(last_answer(1)->id, first, RDV_COMMID_BYTES);
    assert_int_equal(nodes[0].sm.nchildren, 1);
    /* the epoch ends: the coordinator forgets what it held */
    nodes[2].up = 0;
    run_for(5 * HB_MS);
    assert_int_equal(nodes[0].sm.nchildren, 0);
    for (int i = 0; i < RDV_CHILD_TABLE; i++)
        assert_false(nodes[0].sm.children[i].used);
    gpu_groups = 0;
}

/* The coordinator's id thread has none ready: the ask waits, the net thread is not held,
 * and the answer goes out on a later tick. */
static void an_ask_waits_for_its_id_without_blocking(void **state)
{
    (void)state;
    gpu_cluster(2);
    ids_late = ids_asked + 2;
    const uint32_t a[] = {0, 1};
    ask(1, a, 2, 1);
    assert_int_equal(nodes[1].nanswers, 0);
    run_for(50);
    assert_int_equal(nodes[1].nanswers, 1);
    assert_int_equal(last_answer(1)->code, COLL_OK);
    gpu_groups = 0;
}

/* Hostile or broken asks: none stores anything it should not, each is answered with what
 * is wrong or dropped, and the pods that ask right are served throughout. */
static void asks_that_lie_are_refused(void **state)
{
    (void)state;
    gpu_cluster(3);
    /* a child none of whose ranks the asker holds: dropped, nothing kept */
    const uint32_t others[] = {0, 2};
    ask(1, others, 2, 1);
    assert_int_equal(nodes[1].nanswers, 0);
    assert_int_equal(nodes[0].sm.nchildren, 0);
    /* a rank the group does not have */
    const uint32_t far[] = {1, 7};
    ask(1, far, 2, 1);
    assert_int_equal(last_answer(1)->code, COLL_ERR_INVALID);
    assert_non_null(strstr(last_answer(1)->why, "rank 7 of the child"));
    /* an ask in another pod's name, and one of another epoch: dropped */
    union rdv_msg m;
    rdv_init(&m, RDV_CHILD_ASK, "g", nodes[1].sm.epoch);
    m.h.inc = nodes[1].sm.inc;
    m.child_ask.node_index = 2;
    m.child_ask.nth = 1;
    m.child_ask.n = 2;
    m.child_ask.ranks[0] = 2;
    m.child_ask.ranks[1] = 1;
    io_send(&nodes[1], NULL, 0, &m);
    m.child_ask.node_index = 1;
    m.h.epoch--;
    io_send(&nodes[1], NULL, 0, &m);
    deliver();
    assert_int_equal(nodes[1].nanswers, 1);
    assert_int_equal(nodes[0].sm.nchildren, 0);
    /* a flood of children pod 2 never makes: the table fills, the next is refused with
     * LIMIT, and a child of the pods that do ask still forms once one goes */
    uint32_t list[2] = {1, 2};
    uint8_t first[RDV_COMMID_BYTES];
    for (uint32_t k = 1; k <= RDV_CHILD_TABLE; k++) {
        nodes[1].nanswers = 0;
        ask(1, list, 2, k);
        assert_int_equal(last_answer(1)->code, COLL_OK);
        if (k == 1) memcpy(first, last_answer(1)->id, sizeof(first));
    }
    assert_int_equal(nodes[0].sm.nchildren, RDV_CHILD_TABLE);
    ask(1, list, 2, RDV_CHILD_TABLE + 1);
    assert_int_equal(last_answer(1)->code, COLL_ERR_LIMIT);
    assert_non_null(strstr(last_answer(1)->why, "some pods never made theirs"));
    ask(2, list, 2, 1); /* pod 2 makes the first: it goes */
    assert_int_equal(last_answer(2)->code, COLL_OK);
    assert_memory_equal(last_answer(2)->id, first, RDV_COMMID_BYTES);
    assert_int_equal(nodes[0].sm.nchildren, RDV_CHILD_TABLE - 1);
    nodes[1].nanswers = 0;
    ask(1, list, 2, RDV_CHILD_TABLE + 1);
    assert_int_equal(last_answer(1)->code, COLL_OK);
    assert_formed(1); /* none of it ended the epoch */
    gpu_groups = 0;
    /* a host group's children across pods are libcoll's: the coordinator says so */
    cluster(2);
    run_for(50);
    ask(1, list, 1, 1);
    assert_int_equal(last_answer(1)->code, COLL_ERR_UNSUPPORTED);
}

/* The decoder's part: a list of 1..96 distinct ranks, zeros past it, a count from 1; an
 * answer's code a coll_err and its reason terminated. */
static void the_decoder_checks_child_frames(void **state)
{
    (void)state;
    union rdv_msg m, out;
    char why[160];
    rdv_init(&m, RDV_CHILD_ASK, "g", 1);
    m.h.inc = 5;
    m.child_ask.node_index = 1;
    m.child_ask.nth = 1;
    m.child_ask.n = 3;
    m.child_ask.ranks[0] = 4;
    m.child_ask.ranks[1] = 0;
    m.child_ask.ranks[2] = 9;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    assert_int_equal(out.child_ask.ranks[2], 9);
    struct {
        uint32_t field, value;
        const char *says;
    } bad[] = {{0, 0, "child 0 of 3 ranks"},
               {1, 0, "child 1 of 0 ranks"},
               {1, RDV_CHILD_MAX + 1, "of 97 ranks (1..96)"},
               {2, 4, "rank 4 listed twice"},
               {3, 8, "ranks[3] past its 3 ranks"},
               {4, 1, "child 1 of 3 ranks"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        union rdv_msg b = m;
        uint32_t *f[] = {&b.child_ask.nth, &b.child_ask.n, &b.child_ask.ranks[2],
                         &b.child_ask.ranks[3], &b.child_ask.pad};
        *f[bad[i].field] = bad[i].value;
        assert_int_equal(rdv_decode(&b, rdv_size(&b), &out, why, sizeof(why)), -1);
        assert_non_null(strstr(why, bad[i].says));
    }
    rdv_init(&m, RDV_CHILD_ID, "g", 1);
    m.child_id.nth = 2;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), 0);
    m.child_id.code = COLL_ERR_INTERNAL + 1;
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "CHILD_ID with code 18"));
    m.child_id.code = COLL_OK;
    memset(m.child_id.why, 'x', sizeof(m.child_id.why));
    assert_int_equal(rdv_decode(&m, rdv_size(&m), &out, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "not terminated"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(three_pods_form_one_epoch),
        cmocka_unit_test(a_late_member_is_waited_for),
        cmocka_unit_test(a_silent_member_ends_the_epoch),
        cmocka_unit_test(a_config_mismatch_is_refused),
        cmocka_unit_test(a_member_that_joins_again_ends_the_epoch),
        cmocka_unit_test(a_restarted_coordinator_starts_a_new_incarnation),
        cmocka_unit_test(a_members_last_epoch_does_not_move_the_count),
        cmocka_unit_test(the_decoder_refuses_epochs_and_names_no_agent_sends),
        cmocka_unit_test(stale_frames_are_ignored),
        cmocka_unit_test(a_commit_waits_for_its_id_without_blocking),
        cmocka_unit_test(the_id_thread_never_makes_the_net_thread_wait),
        cmocka_unit_test(an_epoch_that_does_not_form_ends_and_backs_off),
        cmocka_unit_test(two_pods_with_one_index_cost_one_epoch),
        cmocka_unit_test(a_leaving_pod_ends_the_epoch_at_once),
        cmocka_unit_test(forged_and_replayed_leaves_change_nothing),
        cmocka_unit_test(the_coordinator_tells_which_pods_may_share_a_cpu),
        cmocka_unit_test(each_member_learns_where_the_others_run),
        cmocka_unit_test(send_frames_say_their_phase_and_payload),
        cmocka_unit_test(the_pods_of_a_child_get_one_id),
        cmocka_unit_test(an_ask_waits_for_its_id_without_blocking),
        cmocka_unit_test(asks_that_lie_are_refused),
        cmocka_unit_test(the_decoder_checks_child_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
