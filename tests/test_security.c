/*
 * test_security.c: the key files and the data plane's proofs (agent/security.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keys_round_trip),
        cmocka_unit_test(hello_proofs_do_not_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
