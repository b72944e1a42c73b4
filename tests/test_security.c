/*
 * test_security.c: the key files and the data plane's proofs (agent/security.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "harness.h"
#include "rdv_wire.h"
#include "security.h"

static void keys_round_trip(void **state)
{
    (void)state;
    char dir[128], why[600];
    tmp_path(dir, sizeof(dir), "keys", 0);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(sec_keygen(dir, why, sizeof(why)), 0);
    struct sec_keys k;
    assert_int_equal(sec_load_keys(dir, &k, why, sizeof(why)), 0);
    assert_true(k.loaded);
    assert_int_equal(strlen(k.server_public), 40);
    assert_string_not_equal(k.server_public, k.client_public);
    /* never overwrites a deployment's keys */
    assert_int_equal(sec_keygen(dir, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "exists"));
    /* a damaged file is named */
    char path[256];
    snprintf(path, sizeof(path), "%s/client.key", dir);
    FILE *f = fopen(path, "w");
    fputs("not a key\n", f);
    fclose(f);
    assert_int_equal(sec_load_keys(dir, &k, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "client.key"));
    assert_false(k.loaded);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(sec_load_keys(dir, &k, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "server.pub"));
}

/* A hello proves the epoch's secret over the nonce of its own connection: the same
 * bytes replayed on another connection (another nonce), a changed field, or another
 * epoch's secret all fail. */
static void hello_proofs_do_not_replay(void **state)
{
    (void)state;
    uint8_t secret[SEC_SECRET_BYTES], other[SEC_SECRET_BYTES], n1[SEC_NONCE_BYTES],
        n2[SEC_NONCE_BYTES];
    sec_random(secret, sizeof(secret));
    sec_random(other, sizeof(other));
    sec_random(n1, sizeof(n1));
    sec_random(n2, sizeof(n2));
    assert_memory_not_equal(n1, n2, sizeof(n1));
    struct data_hello h = {.magic = DATA_MAGIC,
                           .version = RDV_VERSION,
                           .channel = 1,
                           .group_hash = 42,
                           .inc = 9,
                           .epoch = 7,
                           .from_index = 3};
    sec_mac(h.mac, secret, n1, &h, DATA_HELLO_SIGNED);
    assert_true(sec_mac_ok(h.mac, secret, n1, &h, DATA_HELLO_SIGNED));
    assert_false(sec_mac_ok(h.mac, secret, n2, &h, DATA_HELLO_SIGNED)); /* replayed */
    assert_false(sec_mac_ok(h.mac, other, n1, &h, DATA_HELLO_SIGNED));  /* old epoch */
    h.from_index = 2;
    assert_false(sec_mac_ok(h.mac, secret, n1, &h, DATA_HELLO_SIGNED)); /* changed */
    h.from_index = 3;
    h.inc = 10;
    assert_false(sec_mac_ok(h.mac, secret, n1, &h, DATA_HELLO_SIGNED)); /* another incarnation */
    /* the welcome: over the hello's own nonce, and it answers that hello only */
    memcpy(h.nonce, n2, sizeof(h.nonce));
    h.inc = 9;
    struct data_welcome w = {.magic = DATA_MAGIC,
                             .version = RDV_VERSION,
                             .status = DATA_WELCOME_OK,
                             .channel = 1,
                             .to_index = 0,
                             .group_hash = 42,
                             .inc = 9,
                             .epoch = 7};
    char why[128];
    assert_int_equal(data_welcome_check(&w, &h, 0, why, sizeof(why)), 0);
    sec_mac(w.mac, secret, h.nonce, &w, DATA_WELCOME_SIGNED);
    assert_true(sec_mac_ok(w.mac, secret, n2, &w, DATA_WELCOME_SIGNED));
    assert_false(sec_mac_ok(w.mac, secret, n1, &w, DATA_WELCOME_SIGNED));  /* another hello's */
    assert_false(sec_mac_ok(w.mac, other, n2, &w, DATA_WELCOME_SIGNED));   /* no secret */
    assert_int_equal(data_welcome_check(&w, &h, 1, why, sizeof(why)), -1); /* not from node 1 */
    w.epoch = 8;
    assert_int_equal(data_welcome_check(&w, &h, 0, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "another hello"));
    w.epoch = 7;
    w.status = 3;
    assert_int_equal(data_welcome_check(&w, &h, 0, why, sizeof(why)), -1);
}

static void write_seed(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The chart's default: a seed per release, from which every agent derives the same four
 * keys; another seed, other keys; a short seed refused, saying how to make one. */
static void seed_keys_are_the_deployments_own(void **state)
{
    (void)state;
    char path[256], why[256];
    tmp_path(path, sizeof(path), "seed", 0);
    struct sec_keys a, b, c;
    write_seed(path, "Zq8x0kV3m1T9wYb7Lr2Nc5Hd4Gf6Js8Ap0Ee1Ii2Oo3Uu4Yy5\n");
    assert_int_equal(sec_seed_keys(path, &a, why, sizeof(why)), 0);
    write_seed(path, "Zq8x0kV3m1T9wYb7Lr2Nc5Hd4Gf6Js8Ap0Ee1Ii2Oo3Uu4Yy5"); /* no newline */
    assert_int_equal(sec_seed_keys(path, &b, why, sizeof(why)), 0);
    assert_true(a.loaded && b.loaded);
    assert_memory_equal(&a, &b, sizeof(a));
    /* each pair is a CURVE pair: the public key is the secret key's */
    char pub[41];
    assert_int_equal(zmq_curve_public(pub, a.server_secret), 0);
    assert_string_equal(pub, a.server_public);
    assert_int_equal(zmq_curve_public(pub, a.client_secret), 0);
    assert_string_equal(pub, a.client_public);
    assert_string_not_equal(a.server_public, a.client_public);
    write_seed(path, "Zq8x0kV3m1T9wYb7Lr2Nc5Hd4Gf6Js8Ap0Ee1Ii2Oo3Uu4Yy6\n");
    assert_int_equal(sec_seed_keys(path, &c, why, sizeof(why)), 0);
    assert_string_not_equal(a.server_secret, c.server_secret);
    assert_string_not_equal(a.client_public, c.client_public);
    /* too short to be a seed; empty (the example manifests' placeholder); missing */
    write_seed(path, "changeme\n");
    assert_int_equal(sec_seed_keys(path, &c, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "8 bytes"));
    assert_non_null(strstr(why, "/dev/urandom"));
    assert_false(c.loaded);
    write_seed(path, "");
    assert_int_equal(sec_seed_keys(path, &c, why, sizeof(why)), -1);
    unlink(path);
    assert_int_equal(sec_seed_keys(path, &c, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "No such file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keys_round_trip),
        cmocka_unit_test(hello_proofs_do_not_replay),
        cmocka_unit_test(seed_keys_are_the_deployments_own),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
