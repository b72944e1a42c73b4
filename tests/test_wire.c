/*
 * test_wire.c: the local plane's decoders accept exactly the messages of this
 * version and say why they refuse the rest; a deterministic fuzz loop feeds them
 * random and mutated bytes. Also libcoll's count of usable CPUs (cpus.c), which shares
 * the library's internal objects.
 */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "cpus.h"
#include "harness.h"
#include "ring.h"
#include "spin.h"
#include "wire.h"

static int decode(const void *buf, size_t n, union wire_msg *m, char *err)
{
    return wire_decode(buf, n, m, NULL, err, 160);
}

static void every_type_round_trips(void **state)
{
    (void)state;
    for (unsigned t = WIRE_HELLO; t < WIRE_TYPE_END; t++) {
        union wire_msg m, out;
        wire_init(&m, (enum wire_type)t, 42);
        if (t == WIRE_LEASE_OK) { /* a lease of no pods is refused (below) */
            m.lease_ok.nodes = 2;
            m.lease_ok.nfds = 2;
        }
        if (t == WIRE_GROUP_CREATE) m.group_create.n = 1; /* a child of no ranks is refused */
        assert_int_equal(m.h.len, wire_size(t));
        char err[160];
        assert_int_equal(decode(&m, m.h.len, &out, err), 0);
        assert_int_equal(out.h.type, t);
        assert_int_equal(out.h.req_id, 42);
    }
}

static void short_messages_are_refused(void **state)
{
    (void)state;
    union wire_msg m, out;
    char err[160];
    wire_init(&m, WIRE_HELLO, 1);
    assert_int_equal(decode(&m, 10, &out, err), -1);
    assert_non_null(strstr(err, "shorter than"));
    assert_int_equal(decode(&m, sizeof(struct wire_hdr), &out, err), -1);
    assert_non_null(strstr(err, "length field"));
}

static void bad_magic_type_and_length_are_refused(void **state)
{
    (void)state;
    union wire_msg m, out;
    char err[160];
    wire_init(&m, WIRE_GROUP_OPEN, 1);
    m.h.magic ^= 1;
    assert_int_equal(decode(&m, m.h.len, &out, err), -1);
    assert_non_null(strstr(err, "magic"));
    wire_init(&m, WIRE_GROUP_OPEN, 1);
    m.h.type = 999;
    assert_int_equal(decode(&m, sizeof(m.group_open), &out, err), -1);
    assert_non_null(strstr(err, "unknown message type 999"));
    wire_init(&m, WIRE_GROUP_OPEN, 1);
    m.h.len += 8;
    assert_int_equal(decode(&m, sizeof(m.group_open), &out, err), -1);
    assert_non_null(strstr(err, "length field"));
}

static void other_versions_are_named(void **state)
{
    (void)state;
    union wire_msg m, out;
    char err[160];
    unsigned v = 0;
    wire_init(&m, WIRE_HELLO, 1);
    m.h.version = 9;
    assert_int_equal(wire_decode(&m, m.h.len, &out, &v, err, sizeof(err)), -1);
    assert_int_equal(v, 9);
    char want[80];
    snprintf(want, sizeof(want), "protocol version 9 is not supported (this side speaks %u)",
             WIRE_VERSION);
    assert_non_null(strstr(err, want));
}

static void unterminated_strings_are_refused(void **state)
{
    (void)state;
    union wire_msg m, out;
    char err[160];
    wire_init(&m, WIRE_GROUP_OPEN, 1);
    memset(m.group_open.name, 'a', sizeof(m.group_open.name));
    assert_int_equal(decode(&m, m.h.len, &out, err), -1);
    assert_non_null(strstr(err, "NUL-terminated"));
}

/* A child's size is checked before the agent reads its ranks: 1..WIRE_CHILD_MAX. */
static void child_sizes_are_checked(void **state)
{
    (void)state;
    union wire_msg m, out;
    char err[160];
    const uint32_t sizes[] = {0, 1, WIRE_CHILD_MAX, WIRE_CHILD_MAX + 1, 0xffffffffu};
    const int ok[] = {0, 1, 1, 0, 0};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        wire_init(&m, WIRE_GROUP_CREATE, 1);
        m.group_create.n = sizes[k];
        assert_int_equal(decode(&m, m.h.len, &out, err), ok[k] ? 0 : -1);
        if (!ok[k]) assert_non_null(strstr(err, "a child of"));
    }
}

/* A lease's shape is checked before libcoll uses it: 2..16 pods, this one among them,
 * two connections per other pod; the reasons a lease comes back with, and the agent's
 * answer, are strings, and the answer's code is an error code. */
static void lease_shapes_are_checked(void **state)
{
    (void)state;
    union wire_msg m, out;
    char err[160];
    const struct {
        uint32_t nodes, me, nfds;
        int ok;
    } cases[] = {{2, 0, 2, 1},   {2, 1, 2, 1},          {16, 15, 30, 1}, {1, 0, 0, 0},
                 {0, 0, 0, 0},   {2, 2, 2, 0},          {2, 0, 3, 0},    {2, 0, 1, 0},
                 {17, 0, 32, 0}, {0x80000001u, 0, 0, 0}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        wire_init(&m, WIRE_LEASE_OK, 1);
        m.lease_ok.nodes = cases[k].nodes;
        m.lease_ok.me = cases[k].me;
        m.lease_ok.nfds = cases[k].nfds;
        int rc = decode(&m, m.h.len, &out, err);
        if (cases[k].ok) {
            assert_int_equal(rc, 0);
            assert_int_equal(out.lease_ok.nodes, cases[k].nodes);
        } else {
            assert_int_equal(rc, -1);
            assert_non_null(strstr(err, "lease of"));
        }
    }
    wire_init(&m, WIRE_LEASE_BACK, 1);
    memset(m.lease_back.why, 'x', sizeof(m.lease_back.why));
    assert_int_equal(decode(&m, m.h.len, &out, err), -1);
    assert_non_null(strstr(err, "NUL-terminated"));
    /* the bytes read ahead that travel with a lease: at most WIRE_STASH_BYTES per pod, and
     * (where the message says who is who) none of this pod's or beyond the group */
    const struct {
        uint32_t nodes, me, at, len;
        int ok;
    } stash[] = {{2, 0, 1, WIRE_STASH_BYTES, 1},
                 {2, 0, 1, WIRE_STASH_BYTES + 1, 0},
                 {2, 0, 0, 1, 0},
                 {2, 0, 2, 1, 0},
                 {16, 3, 15, 48, 1},
                 {16, 3, 3, 48, 0},
                 {4, 1, 0, 0xffff, 0}};
    for (size_t k = 0; k < sizeof(stash) / sizeof(stash[0]); k++) {
        wire_init(&m, WIRE_LEASE_OK, 1);
        m.lease_ok.nodes = stash[k].nodes;
        m.lease_ok.me = stash[k].me;
        m.lease_ok.nfds = 2 * (stash[k].nodes - 1);
        m.lease_ok.stash_len[stash[k].at] = (uint16_t)stash[k].len;
        assert_int_equal(decode(&m, m.h.len, &out, err), stash[k].ok ? 0 : -1);
        if (!stash[k].ok) assert_non_null(strstr(err, "bytes read ahead of node"));
    }
    /* the lease's flags: the one it knows passes, any other bit is refused by name */
    const uint32_t flags[] = {0, WIRE_LEASE_F_OWN_CPUS, 2, WIRE_LEASE_F_OWN_CPUS | 0x80000000u};
    for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++) {
        wire_init(&m, WIRE_LEASE_OK, 1);
        m.lease_ok.nodes = 2;
        m.lease_ok.nfds = 2;
        m.lease_ok.flags = flags[k];
        int ok = (flags[k] & ~WIRE_LEASE_F_OWN_CPUS) == 0;
        assert_int_equal(decode(&m, m.h.len, &out, err), ok ? 0 : -1);
        if (ok)
            assert_int_equal(out.lease_ok.flags, flags[k]);
        else
            assert_non_null(strstr(err, "lease with unknown flags"));
    }
    const uint32_t back[] = {WIRE_STASH_BYTES, WIRE_STASH_BYTES + 1, 0xffff};
    for (size_t k = 0; k < sizeof(back) / sizeof(back[0]); k++) {
        wire_init(&m, WIRE_LEASE_BACK, 1);
        m.lease_back.stash_len[WIRE_STASH_NODES - 1] = (uint16_t)back[k];
        int ok = back[k] <= WIRE_STASH_BYTES;
        assert_int_equal(decode(&m, m.h.len, &out, err), ok ? 0 : -1);
        if (ok)
            assert_int_equal(out.lease_back.stash_len[WIRE_STASH_NODES - 1], back[k]);
        else
            assert_non_null(strstr(err, "bytes read ahead of node 15"));
    }
    /* the answer to a give-back: the end's code is an error code, its reason a string */
    const int32_t codes[] = {0, COLL_ERR_PEER_LOST, COLL_ERR_INTERNAL, -1, COLL_ERR_INTERNAL + 1};
    for (size_t k = 0; k < sizeof(codes) / sizeof(codes[0]); k++) {
        wire_init(&m, WIRE_LEASE_BACK_OK, 1);
        m.lease_back_ok.code = codes[k];
        snprintf(m.lease_back_ok.why, sizeof(m.lease_back_ok.why), "node 1 (pod-1) left");
        int ok = codes[k] >= 0 && codes[k] <= COLL_ERR_INTERNAL;
        assert_int_equal(decode(&m, m.h.len, &out, err), ok ? 0 : -1);
        if (ok)
            assert_string_equal(out.lease_back_ok.why, "node 1 (pod-1) left");
        else
            assert_non_null(strstr(err, "end code"));
    }
    wire_init(&m, WIRE_LEASE_BACK_OK, 1);
    memset(m.lease_back_ok.why, 'x', sizeof(m.lease_back_ok.why));
    assert_int_equal(decode(&m, m.h.len, &out, err), -1);
    assert_non_null(strstr(err, "NUL-terminated"));
}

static void sqe_fields_are_range_checked(void **state)
{
    (void)state;
    char err[128];
    struct wire_sqe s = {.kind = WIRE_OP_ALLREDUCE, .dtype = COLL_FLOAT32, .redop = COLL_SUM};
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.kind = WIRE_OP_KIND_COUNT;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.kind = 0;
    s.dtype = COLL_DTYPE_COUNT;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.dtype = 0;
    s.redop = COLL_REDOP_COUNT;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.redop = 0;
    /* reductions that do not fit their dtype: bitwise of floats, the average of bools;
     * and what does fit */
    s.dtype = COLL_FLOAT32;
    s.redop = COLL_BXOR;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "reduction bxor of float32"));
    s.dtype = COLL_BOOL;
    s.redop = COLL_AVG;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.redop = COLL_BOR;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.dtype = COLL_INT16;
    s.redop = COLL_BAND;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.kind = WIRE_OP_BROADCAST; /* no reduction: the field is not read */
    s.dtype = COLL_FLOAT64;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    /* a tag: sends and receives only, 0..WIRE_TAG_MAX */
    s.dtype = 0;
    s.redop = 0;
    s.kind = WIRE_OP_SEND;
    s.p2p_tag = 5;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.p2p_tag = 0x80000000u;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.kind = WIRE_OP_ALLREDUCE;
    s.p2p_tag = 1;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "tag 1 on a allreduce"));
    s.p2p_tag = 0;
    /* MORE: a GPU send or receive only (part of one NCCL group) */
    s.flags = WIRE_SQE_F_MORE;
    s.kind = WIRE_OP_SEND;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flag MORE on a host send"));
    s.flags = WIRE_SQE_F_MORE | WIRE_SQE_F_GPU;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.kind = WIRE_OP_RECV;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.kind = WIRE_OP_ALLREDUCE;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flag MORE on a allreduce"));
    /* NOACK: a host send only (span.c's: its receiver says nothing back) */
    s.flags = WIRE_SQE_F_NOACK;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flag NOACK on a allreduce"));
    s.kind = WIRE_OP_RECV;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flag NOACK on a recv"));
    s.kind = WIRE_OP_SEND;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    s.flags = WIRE_SQE_F_NOACK | WIRE_SQE_F_GPU;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flag NOACK on a GPU send"));
    /* SIG: a host send or receive alone, whose redop names a collective (a kind that
     * is no send nor receive, a reduction where that kind reduces, none where not) */
    s.flags = WIRE_SQE_F_SIG;
    s.redop = WIRE_SIG(WIRE_OP_ALLREDUCE, COLL_MAX);
    for (unsigned k = 0; k < WIRE_OP_KIND_COUNT; k++) {
        s.kind = (uint8_t)k;
        int ok = k == WIRE_OP_SEND || k == WIRE_OP_RECV;
        assert_int_equal(wire_sqe_check(&s, err, sizeof(err)) == 0, ok);
        if (!ok) assert_non_null(strstr(err, "flag SIG on a"));
    }
    s.kind = WIRE_OP_RECV;
    s.flags = WIRE_SQE_F_SIG | WIRE_SQE_F_GPU;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flag SIG on a GPU recv"));
    s.flags = WIRE_SQE_F_SIG;
    const uint8_t bad_sigs[] = {WIRE_SIG(WIRE_OP_SEND, 0),
                                WIRE_SIG(WIRE_OP_RECV, 0),
                                WIRE_SIG(WIRE_OP_ALLGATHER, COLL_MAX),
                                WIRE_SIG(WIRE_OP_REDUCE, COLL_REDOP_COUNT),
                                WIRE_SIG(WIRE_OP_KIND_COUNT, 0),
                                0xff};
    for (size_t i = 0; i < sizeof(bad_sigs); i++) {
        s.redop = bad_sigs[i];
        assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
        assert_non_null(strstr(err, "names no op"));
    }
    s.redop = WIRE_SIG(WIRE_OP_BARRIER, 0);
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    char name[48];
    assert_string_equal(wire_sig_name(WIRE_SIG(WIRE_OP_REDUCE, COLL_MIN), name, sizeof(name)),
                        "reduce (min)");
    s.redop = 0;
    s.kind = WIRE_OP_ALLREDUCE;
    s.flags = 16;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "unknown flags 0x10"));
    s.flags = 0;
    s.dtype = 0;
    s.redop = 0;
    s.flags = 0x80;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.flags = 0;
    /* a premultiplied sum (WIRE_REDOP_PREMUL + slot): a reduction's, neither of bool nor
     * of complex numbers; NCCL takes it, as it takes no bitwise one */
    s.kind = WIRE_OP_REDUCE_SCATTER;
    s.dtype = COLL_FLOAT16;
    s.redop = WIRE_REDOP_PREMUL + WIRE_PREMUL_SLOTS - 1;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), 0);
    assert_null(wire_nccl_refuses(s.kind, s.dtype, s.redop, 0));
    assert_non_null(wire_nccl_refuses(s.kind, s.dtype, COLL_BOR, 0));
    s.dtype = COLL_BOOL;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.dtype = COLL_COMPLEX128;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.dtype = COLL_INT64;
    s.kind = WIRE_OP_ALLGATHER;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "reduction 255 out of range"));
    s.kind = WIRE_OP_ALLREDUCE;
    s.redop = WIRE_REDOP_PREMUL - 1; /* between the named reductions and the slots */
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
    s.redop = 0;
    s.kind = WIRE_OP_BARRIER;
    s.count = 3;
    assert_int_equal(wire_sqe_check(&s, err, sizeof(err)), -1);
}

static void extents_follow_the_op_and_catch_overflow(void **state)
{
    (void)state;
    struct wire_sqe s = {.kind = WIRE_OP_ALLGATHER, .count = 10};
    uint64_t e;
    assert_int_equal(wire_sqe_extent(&s, 0, 4, &e), 0);
    assert_int_equal(e, 10);
    assert_int_equal(wire_sqe_extent(&s, 1, 4, &e), 0);
    assert_int_equal(e, 40);
    s.kind = WIRE_OP_REDUCE_SCATTER;
    assert_int_equal(wire_sqe_extent(&s, 0, 4, &e), 0);
    assert_int_equal(e, 40);
    assert_int_equal(wire_sqe_extent(&s, 1, 4, &e), 0);
    assert_int_equal(e, 10);
    s.kind = WIRE_OP_SEND;
    assert_int_equal(wire_sqe_extent(&s, 1, 4, &e), 0);
    assert_int_equal(e, 0);
    s.kind = WIRE_OP_ALLTOALL;
    s.count = UINT64_MAX / 2;
    assert_int_equal(wire_sqe_extent(&s, 0, 4, &e), -1);
}

static void fuzzed_bytes_never_crash(void **state)
{
    (void)state;
    srand(12345);
    char buf[WIRE_MAX_MSG];
    union wire_msg out;
    char err[160];
    int accepted = 0;
    for (int i = 0; i < 200000; i++) {
        size_t n = (size_t)(rand() % (int)sizeof(buf));
        if (i % 2) { /* mutate a valid message */
            union wire_msg m;
            wire_init(&m, (enum wire_type)(1 + rand() % (WIRE_TYPE_END - 1)), 1);
            memcpy(buf, &m, m.h.len);
            n = m.h.len;
            buf[rand() % (int)n] ^= (char)(1 << (rand() % 8));
        } else {
            for (size_t k = 0; k < n; k++)
                buf[k] = (char)rand();
        }
        if (decode(buf, n, &out, err) == 0) {
            accepted++;
            assert_int_equal(out.h.len, n);
            assert_int_equal(wire_size(out.h.type), n);
        } else {
            assert_true(strlen(err) > 0);
        }
    }
    assert_true(accepted > 0); /* mutations of payload bytes stay valid */
}

/* ---- how many CPUs libcoll thinks it can keep busy ------------------------------------- */

static void cpu_quotas_are_read(void **state)
{
    (void)state;
    assert_int_equal(coll_cpus_from_quota(-1, 100000), 0); /* v1: no limit */
    assert_int_equal(coll_cpus_from_quota(100000, 100000), 1);
    assert_int_equal(coll_cpus_from_quota(150000, 100000), 2);
    assert_int_equal(coll_cpus_from_quota(50000, 100000), 1);
    assert_int_equal(coll_cpus_from_quota(400000, 0), 0);
    assert_int_equal(coll_cpus_from_cpu_max("max 100000\n"), 0);
    assert_int_equal(coll_cpus_from_cpu_max("300000 100000\n"), 3);
    assert_int_equal(coll_cpus_from_cpu_max("250000 100000"), 3);
    assert_int_equal(coll_cpus_from_cpu_max("12x 100000"), 0);
    assert_int_equal(coll_cpus_from_cpu_max(""), 0);
    assert_int_equal(coll_cpus_from_cpu_max(NULL), 0);
    assert_true(coll_usable_cpus() >= 1);
}

static void put_cpu_max(const char *dir, const char *text)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && printf '%s\\n' > '%s/cpu.max'", dir, text, dir);
    assert_int_equal(system(cmd), 0);
}

/* Found on the GPU host (c65a60e): a process in a nested cgroup v2 (0::/process_api/ID)
 * saw no cap at all, because the v2 line was never recognised. Fake hierarchies, laid
 * out as a Kubernetes node has them: the cap is the lowest quota from the container's
 * cgroup up to the mount, with and without a cgroup namespace. */
static void nested_cgroup_v2_quotas_are_read(void **state)
{
    (void)state;
    char t[128], d[256], cmd[300];
    tmp_path(t, sizeof(t), "cg", 0);
    /* no namespace: the pod's cgroup has the limit (2 CPUs), the container's none */
    snprintf(d, sizeof(d), "%s/kubepods/pod1", t);
    put_cpu_max(d, "200000 100000");
    snprintf(d, sizeof(d), "%s/kubepods/pod1/ctr", t);
    put_cpu_max(d, "max 100000");
    assert_int_equal(coll_cgroup2_cpus(t, "/", "/kubepods/pod1/ctr"), 2);
    /* the container's own limit is lower: it wins */
    put_cpu_max(d, "50000 100000");
    assert_int_equal(coll_cgroup2_cpus(t, "/", "/kubepods/pod1/ctr"), 1);
    /* mounted at the pod's cgroup (root /kubepods/pod1) */
    snprintf(d, sizeof(d), "%s/kubepods/pod1", t);
    assert_int_equal(coll_cgroup2_cpus(d, "/kubepods/pod1", "/kubepods/pod1/ctr"), 1);
    /* a cgroup namespace: we are "/", the mount is our cgroup */
    snprintf(d, sizeof(d), "%s/kubepods/pod1/ctr", t);
    assert_int_equal(coll_cgroup2_cpus(d, "/", "/"), 1);
    /* no limit anywhere, outside the mount, or above the namespace: no cap */
    assert_int_equal(coll_cgroup2_cpus(t, "/", "/elsewhere"), 0);
    assert_int_equal(coll_cgroup2_cpus(d, "/other", "/kubepods/pod1/ctr"), 0);
    assert_int_equal(coll_cgroup2_cpus(d, "/", "/../sibling"), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t);
    assert_int_equal(system(cmd), 0);
}

/* The sleeping words' cpu (wire.h) and what each side makes of the other's: a CPU
 * outside our mask is elsewhere; an unknown, stale-format (0) or impossible one is not. */
static void the_other_side_s_cpu_is_elsewhere_only_when_said_and_outside(void **state)
{
    (void)state;
    struct wire_ring_idx w = {0};
    assert_int_equal(ring_peer_cpu(&w), -1); /* a peer from before the field */
    ring_say_cpu(&w, -1);                    /* sched_getcpu failed: nothing said */
    assert_int_equal(ring_peer_cpu(&w), -1);
    ring_say_cpu(&w, 0);
    assert_int_equal(ring_peer_cpu(&w), 0);
    ring_say_cpu(&w, 5);
    assert_int_equal(ring_peer_cpu(&w), 5);
    atomic_store(&w.cpu, 0xffffffffu); /* whatever the other side wrote */
    assert_int_equal(ring_peer_cpu(&w), -1);
    atomic_store(&w.cpu, (uint32_t)CPU_SETSIZE + 1);
    cpu_set_t m;
    CPU_ZERO(&m);
    CPU_SET(1, &m);
    CPU_SET(2, &m);
    assert_false(coll_cpu_outside(&m, ring_peer_cpu(&w))); /* beyond any mask */
    assert_false(coll_cpu_outside(&m, -1));
    assert_false(coll_cpu_outside(&m, 1));
    assert_false(coll_cpu_outside(&m, 2));
    assert_true(coll_cpu_outside(&m, 0));
    assert_true(coll_cpu_outside(&m, 3));
    assert_false(coll_cpu_outside(&m, CPU_SETSIZE));
}

/* A real cgroup with a one-CPU quota (v1 cpu controller, or v2 with cpu enabled), a
 * child moved into it: the child counts one CPU. Needs root and such a controller. */
static void a_cgroup_quota_caps_the_count(void **state)
{
    (void)state;
    char dir[256], file[300];
    const char *quota_file = NULL, *quota_text = NULL;
    snprintf(dir, sizeof(dir), "/sys/fs/cgroup/cpu/coll-test-%d", (int)getpid());
    if (geteuid() == 0 && mkdir(dir, 0755) == 0) {
        quota_file = "cpu.cfs_quota_us";
        quota_text = "100000";
        snprintf(file, sizeof(file), "%s/cpu.cfs_period_us", dir);
        FILE *f = fopen(file, "w");
        if (f) {
            fputs("100000", f);
            fclose(f);
        }
    } else {
        snprintf(dir, sizeof(dir), "/sys/fs/cgroup/coll-test-%d", (int)getpid());
        if (geteuid() == 0 && mkdir(dir, 0755) == 0) {
            snprintf(file, sizeof(file), "%s/cpu.max", dir);
            if (access(file, W_OK) == 0) {
                quota_file = "cpu.max";
                quota_text = "100000 100000";
            } else {
                rmdir(dir);
            }
        }
    }
    if (!quota_file) {
        fprintf(stderr, "skipped: needs root and a cgroup cpu controller (v1 at "
                        "/sys/fs/cgroup/cpu or v2 with cpu enabled)\n");
        skip();
    }
    snprintf(file, sizeof(file), "%s/%s", dir, quota_file);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    assert_true(fputs(quota_text, f) >= 0);
    assert_int_equal(fclose(f), 0);
    pid_t p = fork();
    if (p == 0) {
        snprintf(file, sizeof(file), "%s/cgroup.procs", dir);
        FILE *procs = fopen(file, "w");
        if (!procs || fprintf(procs, "%d", (int)getpid()) < 0 || fclose(procs) != 0) _exit(2);
        int n = coll_usable_cpus();
        if (n != 1) {
            char cg[256] = "";
            FILE *c = fopen("/proc/self/cgroup", "r");
            if (c && fgets(cg, sizeof(cg), c)) cg[strcspn(cg, "\n")] = '\0';
            if (c) fclose(c);
            fprintf(stderr, "in %s (%s = %s): %d CPUs, want 1\n", dir, quota_file, quota_text, n);
            fprintf(stderr, "/proc/self/cgroup: %s\n", cg);
        }
        _exit(n == 1 ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(p, &st, 0), p);
    rmdir(dir); /* the child has exited: the group is empty */
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* The waiting policy's learner (spin.h): waits that end while spinning grow the budget to
 * its cap, waits that sleep halve it to zero, and at zero one wait in SPIN_PROBE_EVERY
 * probes, which a success turns back into a budget. */
static void spin_budget_is_learnt(void **state)
{
    (void)state;
    struct spin_adapt s;
    spin_init(&s, 50000);
    assert_int_equal(spin_budget(&s), 50000);
    for (int i = 0; i < 10; i++)
        spin_learn(&s, 1, 200000);
    assert_int_equal(spin_budget(&s), 200000); /* capped */
    spin_learn(&s, 0, 200000);
    assert_int_equal(spin_budget(&s), 100000);
    for (int i = 0; i < 20; i++)
        spin_learn(&s, 0, 200000);
    assert_int_equal(s.ns, 0); /* a producer that needs our CPU: sleep at once */
    int probes = 0;
    for (unsigned i = 0; i < 4 * SPIN_PROBE_EVERY; i++)
        probes += spin_budget(&s) == SPIN_PROBE_NS;
    assert_int_equal(probes, 4);
    spin_learn(&s, 1, 200000); /* a probe that paid */
    assert_int_equal(spin_budget(&s), SPIN_PROBE_NS);
    spin_learn(&s, 1, 0); /* a cap of zero: never spin */
    assert_int_equal(s.ns, 0);
}

/* The gate's rule (spin.h), on given yield times: a long yield alone (a kernel thread's
 * run) leaves it open, a second within SPIN_YIELD_DENSE yields closes it; closing again
 * right after it reopens doubles the period up to its cap, later starts it anew. */
static void long_yields_that_come_back_close_the_gate(void **state)
{
    (void)state;
    struct spin_gate g = {0};
    int64_t t = 1000 * NS_PER_S;
    spin_gate_note(&g, SPIN_YIELD_LONG_NS + 1, t); /* the first long yield */
    for (unsigned i = 0; i < SPIN_YIELD_DENSE; i++)
        spin_gate_note(&g, 1000, t);
    spin_gate_note(&g, 4 * NS_PER_MS, t); /* another, SPIN_YIELD_DENSE + 1 yields later */
    assert_int_equal(atomic_load(&g.closed), 0);
    assert_true(spin_yields(&g, t));
    for (int i = 0; i < 100; i++)
        spin_gate_note(&g, 1000, t);
    spin_gate_note(&g, SPIN_YIELD_LONG_NS, t); /* not longer than the mark: not long */
    assert_int_equal(atomic_load(&g.closed), 0);
    spin_gate_note(&g, 4 * NS_PER_MS, t); /* 102 yields after the last long one */
    assert_int_equal(atomic_load(&g.closed), 1);
    assert_false(spin_yields(&g, t));
    assert_false(spin_yields(&g, t + SPIN_YIELD_OFF_NS - 1));
    assert_true(spin_yields(&g, t + SPIN_YIELD_OFF_NS));
    int64_t off = SPIN_YIELD_OFF_NS;
    for (int k = 0; k < 8; k++) { /* busy still: every reopening closes again at once */
        t = atomic_load(&g.closed_until) + NS_PER_MS;
        spin_gate_note(&g, 4 * NS_PER_MS, t); /* the first long one since it reopened */
        assert_true(spin_yields(&g, t));
        spin_gate_note(&g, 4 * NS_PER_MS, t);
        off = off * 2 > SPIN_YIELD_OFF_MAX_NS ? SPIN_YIELD_OFF_MAX_NS : off * 2;
        assert_int_equal(atomic_load(&g.off_ns), off);
        assert_int_equal(atomic_load(&g.closed_until), t + off);
    }
    assert_int_equal(off, SPIN_YIELD_OFF_MAX_NS);
    /* quiet for long after it reopened: the next closing is short again */
    t = atomic_load(&g.closed_until) + 2 * SPIN_YIELD_OFF_MAX_NS;
    spin_gate_note(&g, 4 * NS_PER_MS, t);
    spin_gate_note(&g, 4 * NS_PER_MS, t);
    assert_int_equal(atomic_load(&g.off_ns), SPIN_YIELD_OFF_NS);
    assert_int_equal(atomic_load(&g.closed), 10);
    assert_false(spin_yields(NULL, t));
}

/* Spins yield while yields come back promptly (spin.h). Next to a real nice-19 busy loop
 * on our CPU, the yields that hand it its slices close the gate for the whole process;
 * when they come back within a closing's length of its end, the next closing is twice as
 * long; a closed gate only pauses. */
static void slow_yields_close_the_gate(void **state)
{
    (void)state;
    assert_true(spin_relax(NULL, 0) > 0); /* no gate: a pause */
    cpu_set_t old, one;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    int cpu = 0;
    while (!CPU_ISSET(cpu, &old))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    pid_t hog = fork();
    assert_true(hog >= 0);
    if (hog == 0) {
        if (setpriority(PRIO_PROCESS, 0, 19) != 0) _exit(1);
        for (;;) {
        }
    }
    /* the hog is killed before anything is asserted */
    struct spin_gate g = {0};
    int64_t t = now_ns(), end = t + 10 * NS_PER_S;
    while (atomic_load(&g.closed) == 0 && t < end)
        t = spin_relax(&g, t);
    uint64_t closed1 = atomic_load(&g.closed);
    int64_t off1 = atomic_load(&g.off_ns), ahead = atomic_load(&g.closed_until) - t;
    for (int i = 0; i < 100000; i++) /* closed: pauses, whatever runs beside us */
        t = spin_relax(&g, t);
    uint64_t closed_paused = atomic_load(&g.closed);
    /* the period ends (as if it had passed); the loop is still there */
    atomic_store(&g.closed_until, now_ns());
    end = now_ns() + 10 * NS_PER_S;
    while (atomic_load(&g.closed) == 1 && t < end)
        t = spin_relax(&g, t);
    kill(hog, SIGKILL);
    waitpid(hog, NULL, 0);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
    assert_int_equal(closed1, 1);
    assert_int_equal(off1, SPIN_YIELD_OFF_NS);
    assert_true(ahead > 0);
    assert_int_equal(closed_paused, 1);
    assert_int_equal(atomic_load(&g.closed), 2);
    assert_int_equal(atomic_load(&g.off_ns), 2 * SPIN_YIELD_OFF_NS);
}

/* Send and receive ranges in one buffer: apart, or an in-place form of coll.h. */
static void ranges_are_apart_or_in_place(void **state)
{
    (void)state;
    assert_true(wire_ranges_ok(WIRE_OP_ALLREDUCE, 0, 64, 64, 64, 0, 64));  /* touching */
    assert_true(wire_ranges_ok(WIRE_OP_ALLREDUCE, 128, 64, 0, 64, 3, 64)); /* apart */
    assert_true(wire_ranges_ok(WIRE_OP_ALLREDUCE, 64, 64, 64, 64, 3, 64)); /* in place */
    assert_false(wire_ranges_ok(WIRE_OP_ALLREDUCE, 0, 64, 32, 64, 0, 64));
    assert_false(wire_ranges_ok(WIRE_OP_BROADCAST, 33, 64, 32, 64, 0, 64));
    /* allgather: send at recv + rank * block; reduce_scatter: recv at send + rank * block */
    assert_true(wire_ranges_ok(WIRE_OP_ALLGATHER, 2 * 16, 16, 0, 4 * 16, 2, 16));
    assert_false(wire_ranges_ok(WIRE_OP_ALLGATHER, 1 * 16, 16, 0, 4 * 16, 2, 16));
    assert_false(wire_ranges_ok(WIRE_OP_ALLGATHER, 2 * 16 + 4, 16, 0, 4 * 16, 2, 16));
    assert_true(wire_ranges_ok(WIRE_OP_REDUCE_SCATTER, 0, 4 * 16, 3 * 16, 16, 3, 16));
    assert_false(wire_ranges_ok(WIRE_OP_REDUCE_SCATTER, 0, 4 * 16, 0, 16, 3, 16));
    assert_false(wire_ranges_ok(WIRE_OP_REDUCE_SCATTER, 8, 4 * 16, 0, 16, 0, 16));
    assert_true(wire_ranges_ok(WIRE_OP_ALLREDUCE, 0, 0, 0, 64, 0, 0)); /* nothing sent */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_are_apart_or_in_place),
        cmocka_unit_test(every_type_round_trips),
        cmocka_unit_test(spin_budget_is_learnt),
        cmocka_unit_test(long_yields_that_come_back_close_the_gate),
        cmocka_unit_test(slow_yields_close_the_gate),
        cmocka_unit_test(short_messages_are_refused),
        cmocka_unit_test(bad_magic_type_and_length_are_refused),
        cmocka_unit_test(other_versions_are_named),
        cmocka_unit_test(unterminated_strings_are_refused),
        cmocka_unit_test(child_sizes_are_checked),
        cmocka_unit_test(lease_shapes_are_checked),
        cmocka_unit_test(sqe_fields_are_range_checked),
        cmocka_unit_test(extents_follow_the_op_and_catch_overflow),
        cmocka_unit_test(fuzzed_bytes_never_crash),
        cmocka_unit_test(cpu_quotas_are_read),
        cmocka_unit_test(nested_cgroup_v2_quotas_are_read),
        cmocka_unit_test(a_cgroup_quota_caps_the_count),
        cmocka_unit_test(the_other_side_s_cpu_is_elsewhere_only_when_said_and_outside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
