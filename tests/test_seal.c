/*
 * test_seal.c: security.data. The records of agent/seal.c over real sockets (every
 * size, both ways, both modes, every cipher this CPU runs; a changed, repeated or
 * oversized record refused), then real agents that run the op matrix with their bytes
 * sealed, and a pod whose security.data differs refused by name.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "opcheck.h"
#include "seal.h"

static void pair_of(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    for (int i = 0; i < 2; i++) {
        int sz = 32 << 10; /* small buffers: sends stop part-way through records */
        setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
        setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
        fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK);
    }
}

static const uint8_t secret[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
static const uint8_t nonce_a[32] = {11, 12, 13};
static const uint8_t nonce_b[32] = {21, 22, 23};

static struct seal *seal_of(int mode, int cipher, int dir)
{
    uint8_t k[32];
    seal_derive(k, secret, nonce_a, nonce_b, 0, dir, mode, cipher);
    struct seal *s = seal_new(mode, cipher, k);
    assert_non_null(s);
    return s;
}

/* Move n bytes of src from tx to rx through fds, offered as three pieces the way a
 * transfer offers a header and its payload, both sides taking turns without waiting;
 * the count a send returns is all the sender ever learns. */
static void carry(struct seal *tx, struct seal *rx, int sv[2], const uint8_t *src, uint8_t *dst,
                  size_t n)
{
    size_t sent = 0, got = 0;
    int idle = 0;
    while (got < n) {
        assert_true(idle < 100000);
        int moved = 0;
        if (sent < n) {
            size_t a = n / 3, b = 2 * n / 3; /* piece boundaries */
            struct iovec v[3];
            int nv = 0;
            size_t cuts[4] = {0, a, b, n};
            for (int k = 0; k < 3; k++)
                if (sent < cuts[k + 1]) {
                    size_t from = sent > cuts[k] ? sent : cuts[k];
                    v[nv++] = (struct iovec){(void *)(src + from), cuts[k + 1] - from};
                }
            ssize_t r = seal_send(tx, sv[0], v, nv);
            if (r < 0) {
                assert_int_equal(errno, EAGAIN);
            } else {
                assert_true(r > 0 && sent + (size_t)r <= n);
                sent += (size_t)r;
                moved = 1;
            }
        }
        /* read into two pieces, as a header and its payload are read */
        size_t want = n - got, h = want > 40 ? 40 : want;
        struct iovec v[2] = {{dst + got, h}, {dst + got + h, want - h}};
        ssize_t r = seal_recv(rx, sv[1], v, want > h ? 2 : 1);
        if (r < 0) {
            assert_int_equal(errno, EAGAIN);
        } else {
            assert_true(r > 0);
            got += (size_t)r;
            moved = 1;
        }
        idle = moved ? 0 : idle + 1;
    }
    assert_int_equal(sent, n);
}

static void records_carry_every_size_both_ways(void **state)
{
    (void)state;
    const size_t sizes[] = {
        1, 8, 40, SEAL_REC_MAX - 1, SEAL_REC_MAX, SEAL_REC_MAX + 1, (size_t)3 << 20 | 7};
    size_t max = sizes[sizeof(sizes) / sizeof(sizes[0]) - 1];
    uint8_t *src = malloc(max), *dst = malloc(max);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < max; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 16));
    int ciphers = seal_ciphers();
    assert_true(ciphers & SEAL_CHACHA);
    int runs = 0;
    for (int mode = SEAL_MAC; mode <= SEAL_ENCRYPT; mode++)
        for (int cipher = SEAL_CHACHA; cipher <= SEAL_AESGCM; cipher <<= 1) {
            if (!(ciphers & cipher)) {
                fprintf(stderr, "cipher %d: not on this CPU (no AES-NI)\n", cipher);
                continue;
            }
            int sv[2];
            pair_of(sv);
            struct seal *tx = seal_of(mode, cipher, 0), *rx = seal_of(mode, cipher, 0);
            /* one stream, every size in turn: records carry on across messages */
            for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
                memset(dst, 0, sizes[k]);
                carry(tx, rx, sv, src, dst, sizes[k]);
                assert_memory_equal(src, dst, sizes[k]);
            }
            assert_int_equal(seal_records(tx), seal_records(rx));
            assert_true(seal_records(tx) >= ((size_t)3 << 20) / SEAL_REC_MAX);
            seal_free(tx);
            seal_free(rx);
            close(sv[0]);
            close(sv[1]);
            runs++;
        }
    assert_true(runs >= 2);
    free(src);
    free(dst);
}

/* The bytes one record of payload p (n bytes) takes on the wire. */
static size_t wire_of(int mode, int cipher, const void *p, size_t n, uint8_t *out, size_t cap)
{
    int sv[2];
    pair_of(sv);
    struct seal *tx = seal_of(mode, cipher, 0);
    struct iovec v = {(void *)p, n};
    assert_int_equal(seal_send(tx, sv[0], &v, 1), (ssize_t)n);
    ssize_t r = read(sv[1], out, cap);
    assert_int_equal(r, (ssize_t)(n + SEAL_OVERHEAD));
    seal_free(tx);
    close(sv[0]);
    close(sv[1]);
    return (size_t)r;
}

/* Feed raw bytes to a fresh receiver; what seal_recv says about them. */
static ssize_t open_wire(int mode, int cipher, int dir, const uint8_t *w, size_t n, uint8_t *out,
                         size_t cap)
{
    int sv[2];
    pair_of(sv);
    assert_int_equal(write(sv[0], w, n), (ssize_t)n);
    struct seal *rx = seal_of(mode, cipher, dir);
    struct iovec v = {out, cap};
    ssize_t r = seal_recv(rx, sv[1], &v, 1);
    int e = errno;
    if (r < 0) { /* refused for good: the next call says so again */
        assert_int_equal(seal_recv(rx, sv[1], &v, 1), -1);
        assert_int_equal(errno, e);
    }
    seal_free(rx);
    close(sv[0]);
    close(sv[1]);
    errno = e;
    return r;
}

static void a_changed_repeated_or_foreign_record_is_refused(void **state)
{
    (void)state;
    const char msg[] = "the gradients of step 41, bucket 3";
    const size_t n = sizeof(msg);
    uint8_t w[2 * (sizeof(msg) + SEAL_OVERHEAD)], out[256];
    for (int mode = SEAL_MAC; mode <= SEAL_ENCRYPT; mode++) {
        size_t len = wire_of(mode, SEAL_CHACHA, msg, n, w, sizeof(w));
        /* untouched: it opens */
        assert_int_equal(open_wire(mode, SEAL_CHACHA, 0, w, len, out, sizeof(out)), (ssize_t)n);
        assert_memory_equal(out, msg, n);
        /* every changed byte of payload or tag is caught; nothing is delivered */
        for (size_t i = 4; i < len; i++) {
            w[i] ^= 0x20;
            memset(out, 0, sizeof(out));
            assert_int_equal(open_wire(mode, SEAL_CHACHA, 0, w, len, out, sizeof(out)), -1);
            assert_int_equal(errno, EBADMSG);
            assert_int_equal(out[0], 0);
            w[i] ^= 0x20;
        }
        /* a length out of range */
        w[2] = 0x10;
        assert_int_equal(open_wire(mode, SEAL_CHACHA, 0, w, len, out, sizeof(out)), -1);
        assert_int_equal(errno, EPROTO);
        w[2] = 0;
        /* the same record twice: the second has the next number, and fails */
        memcpy(w + len, w, len);
        int sv[2];
        pair_of(sv);
        assert_int_equal(write(sv[0], w, 2 * len), (ssize_t)(2 * len));
        struct seal *rx = seal_of(mode, SEAL_CHACHA, 0);
        struct iovec v = {out, n};
        assert_int_equal(seal_recv(rx, sv[1], &v, 1), (ssize_t)n);
        assert_int_equal(seal_recv(rx, sv[1], &v, 1), -1);
        assert_int_equal(errno, EBADMSG);
        seal_free(rx);
        close(sv[0]);
        close(sv[1]);
        /* the other direction's key (and so another connection's) opens nothing */
        assert_int_equal(open_wire(mode, SEAL_CHACHA, 1, w, len, out, sizeof(out)), -1);
        assert_int_equal(errno, EBADMSG);
    }
}

static void encrypt_hides_the_bytes_and_mac_does_not(void **state)
{
    (void)state;
    const char msg[] = "a plainly visible payload";
    uint8_t w[256];
    size_t len = wire_of(SEAL_MAC, SEAL_CHACHA, msg, sizeof(msg), w, sizeof(w));
    assert_non_null(memmem(w, len, msg, sizeof(msg)));
    for (int cipher = SEAL_CHACHA; cipher <= SEAL_AESGCM; cipher <<= 1) {
        if (!(seal_ciphers() & cipher)) continue;
        len = wire_of(SEAL_ENCRYPT, cipher, msg, sizeof(msg), w, sizeof(w));
        assert_null(memmem(w, len, "plainly", 7));
    }
}

static void keys_differ_by_connection_direction_mode_and_cipher(void **state)
{
    (void)state;
    uint8_t k[6][32];
    seal_derive(k[0], secret, nonce_a, nonce_b, 0, 0, SEAL_MAC, SEAL_CHACHA);
    seal_derive(k[1], secret, nonce_a, nonce_b, 0, 1, SEAL_MAC, SEAL_CHACHA);
    seal_derive(k[2], secret, nonce_a, nonce_b, 2, 0, SEAL_MAC, SEAL_CHACHA);
    seal_derive(k[3], secret, nonce_b, nonce_a, 0, 0, SEAL_MAC, SEAL_CHACHA);
    seal_derive(k[4], secret, nonce_a, nonce_b, 0, 0, SEAL_ENCRYPT, SEAL_CHACHA);
    seal_derive(k[5], secret, nonce_a, nonce_b, 0, 0, SEAL_MAC, SEAL_AESGCM);
    for (int i = 0; i < 6; i++)
        for (int j = i + 1; j < 6; j++)
            assert_memory_not_equal(k[i], k[j], 32);
    /* the pick: AES-GCM only where both run it */
    assert_int_equal(seal_pick(SEAL_CHACHA | SEAL_AESGCM, SEAL_CHACHA | SEAL_AESGCM), SEAL_AESGCM);
    assert_int_equal(seal_pick(SEAL_CHACHA | SEAL_AESGCM, SEAL_CHACHA), SEAL_CHACHA);
    assert_int_equal(seal_pick(SEAL_AESGCM, SEAL_CHACHA), 0);
}

/* ---- real agents ------------------------------------------------------------------- */

static int start_pod(struct agent *a, int port, int index, int members, int slots, const char *data)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "node:\n  index: %d\n  name: pod-%d\n"
             "discovery:\n  peers: [\"127.0.0.1:%d\"]\n"
             "security:\n  data: %s\n"
             "groups:\n  - name: g\n    backend: host\n    members: %d\n    local_slots: %d\n"
             "    timeouts: {op_ms: 20000, heartbeat_ms: %d, join_ms: 5000}\n",
             index, index, port, data, members, slots, TEST_HB_MS);
    /* direct ops asked for: a sealed group must refuse the lease and run them itself */
    return agent_start(a, "  direct_ops: true\n", body);
}

static void sealed_matrix(int n, int slots, const char *data)
{
    struct agent a[4];
    int port = free_port();
    for (int i = 0; i < n; i++)
        assert_int_equal(start_pod(&a[i], port, i, n, slots, data), 0);
    setenv("COLL_DIRECT", "all", 1);
    pid_t pids[8];
    struct opcheck_job jobs[8];
    int np = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < slots; s++) {
            jobs[np] = (struct opcheck_job){.sock = a[i].sock, .explicit_slot = 1, .slot = s};
            pids[np] = child_run(opcheck_rank_main, &jobs[np]);
            np++;
        }
    for (int i = 0; i < np; i++)
        assert_int_equal(child_wait(pids[i], 1500000), 0);
    unsetenv("COLL_DIRECT");
    char want[64];
    snprintf(want, sizeof(want), "data=%s", data);
    for (int i = 0; i < n; i++) {
        assert_int_equal(agent_log_count(&a[i], "protocol_error"), 0);
        assert_int_equal(agent_log_count(&a[i], "failed their check"), 0);
        assert_true(agent_log_count(&a[i], want) >= 1);
        assert_int_equal(agent_stop(&a[i]), 0);
    }
}

static void ops_encrypted_between_2_pods(void **state)
{
    (void)state;
    sealed_matrix(2, 1, "encrypt");
}

static void ops_with_mac_among_3_pods_of_2_slots(void **state)
{
    (void)state;
    sealed_matrix(3, 2, "mac");
}

/* A pod whose security.data differs from the coordinator's is refused, and told which
 * setting and both values. */
static void a_pod_with_other_data_protection_is_refused(void **state)
{
    (void)state;
    struct agent a[2];
    int port = free_port();
    assert_int_equal(start_pod(&a[0], port, 0, 2, 1, "encrypt"), 0);
    assert_int_equal(start_pod(&a[1], port, 1, 2, 1, "none"), 0);
    assert_true(agent_log_wait(&a[1], "security.data none, not encrypt", 1, 5000));
    assert_true(agent_log_wait(&a[0], "rendezvous.reject", 1, 5000));
    assert_int_equal(agent_log_count(&a[0], "group.formed"), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(agent_stop(&a[i]), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(records_carry_every_size_both_ways),
        cmocka_unit_test(a_changed_repeated_or_foreign_record_is_refused),
        cmocka_unit_test(encrypt_hides_the_bytes_and_mac_does_not),
        cmocka_unit_test(keys_differ_by_connection_direction_mode_and_cipher),
        cmocka_unit_test(ops_encrypted_between_2_pods),
        cmocka_unit_test(ops_with_mac_among_3_pods_of_2_slots),
        cmocka_unit_test(a_pod_with_other_data_protection_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
