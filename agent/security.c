/*
 * security.c: CURVE keys, the ZAP handler and the data plane's proofs (see
 * security.h). Cryptography is libsodium's and ZeroMQ's; nothing here is hand-rolled.
 */
#include "security.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "log.h"

static const char *const key_files[4] = {"server.pub", "server.key", "client.pub", "client.key"};

static int write_key(const char *dir, const char *file, const char *z85, mode_t mode, char *why,
                     size_t whylen)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char line[SEC_KEY_Z85 + 1];
    int n = snprintf(line, sizeof(line), "%s\n", z85);
    int ok = write(fd, line, (size_t)n) == n;
    close(fd);
    if (!ok) snprintf(why, whylen, "%s: short write", path);
    return ok ? 0 : -1;
}

int sec_keygen(const char *dir, char *why, size_t whylen)
{
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        snprintf(why, whylen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    char pub[2][SEC_KEY_Z85], sec[2][SEC_KEY_Z85];
    for (int i = 0; i < 2; i++)
        if (zmq_curve_keypair(pub[i], sec[i]) != 0) {
            snprintf(why, whylen, "zmq_curve_keypair: %s (is libzmq built with CURVE?)",
                     zmq_strerror(zmq_errno()));
            return -1;
        }
    for (int i = 0; i < 2; i++)
        if (write_key(dir, key_files[2 * i], pub[i], 0644, why, whylen) < 0 ||
            write_key(dir, key_files[2 * i + 1], sec[i], 0600, why, whylen) < 0)
            return -1;
    sodium_memzero(sec, sizeof(sec));
    return 0;
}

static int read_key(const char *dir, const char *file, char out[SEC_KEY_Z85], char *why,
                    size_t whylen)
{
    char path[512], buf[128];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0) n = 0;
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    uint8_t raw[32];
    if (n != 40 || !zmq_z85_decode(raw, buf)) {
        snprintf(why, whylen,
                 "%s: not a Z85 CURVE key (40 characters; coll-agent keygen makes them)", path);
        return -1;
    }
    memcpy(out, buf, SEC_KEY_Z85);
    sodium_memzero(raw, sizeof(raw));
    return 0;
}

int sec_load_keys(const char *dir, struct sec_keys *k, char *why, size_t whylen)
{
    memset(k, 0, sizeof(*k));
    char *dst[4] = {k->server_public, k->server_secret, k->client_public, k->client_secret};
    for (int i = 0; i < 4; i++)
        if (read_key(dir, key_files[i], dst[i], why, whylen) < 0) return -1;
    k->loaded = 1;
    return 0;
}

int sec_seed_keys(const char *path, struct sec_keys *k, char *why, size_t whylen)
{
    memset(k, 0, sizeof(*k));
    uint8_t seed[4096];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "security.seed %s: %s", path, strerror(errno));
        return -1;
    }
    ssize_t n = read(fd, seed, sizeof(seed));
    int err = errno;
    close(fd);
    if (n < 0) {
        snprintf(why, whylen, "security.seed %s: %s", path, strerror(err));
        return -1;
    }
    while (n > 0 && (seed[n - 1] == '\n' || seed[n - 1] == '\r' || seed[n - 1] == ' ' ||
                     seed[n - 1] == '\t'))
        n--;
    if (n < SEC_SEED_MIN || n == (ssize_t)sizeof(seed)) {
        snprintf(why, whylen,
                 "security.seed %s: %zd bytes; a seed is %d to %zu bytes of randomness "
                 "(head -c 48 /dev/urandom | base64)",
                 path, n, SEC_SEED_MIN, sizeof(seed) - 1);
        sodium_memzero(seed, sizeof(seed));
        return -1;
    }
    static const char *const labels[2] = {"coll curve server 1", "coll curve client 1"};
    char *out[2][2] = {{k->server_public, k->server_secret}, {k->client_public, k->client_secret}};
    for (int r = 0; r < 2; r++) {
        uint8_t h[crypto_box_SEEDBYTES], pk[crypto_box_PUBLICKEYBYTES],
            sk[crypto_box_SECRETKEYBYTES];
        crypto_generichash_state st;
        crypto_generichash_init(&st, NULL, 0, sizeof(h));
        crypto_generichash_update(&st, (const uint8_t *)labels[r], strlen(labels[r]) + 1);
        crypto_generichash_update(&st, seed, (size_t)n);
        crypto_generichash_final(&st, h, sizeof(h));
        crypto_box_seed_keypair(pk, sk, h);
        int ok =
            zmq_z85_encode(out[r][0], pk, sizeof(pk)) && zmq_z85_encode(out[r][1], sk, sizeof(sk));
        sodium_memzero(h, sizeof(h));
        sodium_memzero(sk, sizeof(sk));
        if (!ok) {
            sodium_memzero(seed, sizeof(seed));
            snprintf(why, whylen, "security.seed: Z85 encoding failed");
            return -1;
        }
    }
    sodium_memzero(seed, sizeof(seed));
    k->loaded = 1;
    return 0;
}

int sec_curve_server(void *zsock, const struct sec_keys *k, char *why, size_t whylen)
{
    int one = 1;
    if (zmq_setsockopt(zsock, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
        zmq_setsockopt(zsock, ZMQ_CURVE_SECRETKEY, k->server_secret, 40) < 0 ||
        zmq_setsockopt(zsock, ZMQ_ZAP_DOMAIN, "coll", 4) < 0) {
        snprintf(why, whylen, "CURVE server: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

int sec_curve_client(void *zsock, const struct sec_keys *k, char *why, size_t whylen)
{
    if (zmq_setsockopt(zsock, ZMQ_CURVE_SERVERKEY, k->server_public, 40) < 0 ||
        zmq_setsockopt(zsock, ZMQ_CURVE_PUBLICKEY, k->client_public, 40) < 0 ||
        zmq_setsockopt(zsock, ZMQ_CURVE_SECRETKEY, k->client_secret, 40) < 0) {
        snprintf(why, whylen, "CURVE client: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

void *sec_zap_open(void *zctx, char *why, size_t whylen)
{
    void *zap = zmq_socket(zctx, ZMQ_REP);
    int linger = 0;
    if (!zap || zmq_setsockopt(zap, ZMQ_LINGER, &linger, sizeof(linger)) < 0 ||
        zmq_bind(zap, "inproc://zeromq.zap.01") < 0) {
        snprintf(why, whylen, "ZAP handler: %s", zmq_strerror(zmq_errno()));
        if (zap) zmq_close(zap);
        return NULL;
    }
    return zap;
}

/* Frames of a ZAP request (RFC 27): version, request id, domain, address, routing id,
 * mechanism, credentials... */
#define ZAP_FRAMES 7

int sec_zap_serve(void *zap, const struct sec_keys *k)
{
    int refused = 0;
    uint8_t client_key[32];
    zmq_z85_decode(client_key, k->client_public);
    for (;;) {
        zmq_msg_t f[ZAP_FRAMES];
        int nf = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, zap, nf ? 0 : ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                for (int i = 0; i < nf; i++)
                    zmq_msg_close(&f[i]);
                return refused;
            }
            more = zmq_msg_more(&m);
            if (nf < ZAP_FRAMES)
                f[nf++] = m;
            else
                zmq_msg_close(&m);
        }
        int ok = nf == ZAP_FRAMES && zmq_msg_size(&f[5]) == 5 &&
                 memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 && zmq_msg_size(&f[6]) == 32 &&
                 sodium_memcmp(zmq_msg_data(&f[6]), client_key, 32) == 0;
        char addr[64] = "?";
        if (nf > 3)
            snprintf(addr, sizeof(addr), "%.*s", (int)zmq_msg_size(&f[3]),
                     (char *)zmq_msg_data(&f[3]));
        if (!ok) {
            refused++;
            log_msg(LOG_WARN, "rendezvous.unauthenticated",
                    "from=%s reason=\"the client does not hold the deployment's client key\"",
                    addr);
        }
        /* reply: version, request id, status code, status text, user id, metadata */
        const char *code = ok ? "200" : "400";
        zmq_send(zap, "1.0", 3, ZMQ_SNDMORE);
        if (nf > 1)
            zmq_send(zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        else
            zmq_send(zap, "", 0, ZMQ_SNDMORE);
        zmq_send(zap, code, 3, ZMQ_SNDMORE);
        zmq_send(zap, ok ? "OK" : "unknown client key", ok ? 2 : 18, ZMQ_SNDMORE);
        zmq_send(zap, ok ? "member" : "", ok ? 6 : 0, ZMQ_SNDMORE);
        zmq_send(zap, "", 0, 0);
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
    }
}

void sec_random(void *p, size_t n)
{
    if (sodium_init() < 0) abort(); /* idempotent; fails only without a random source */
    randombytes_buf(p, n);
}

void sec_mac(uint8_t mac[SEC_MAC_BYTES], const uint8_t secret[SEC_SECRET_BYTES],
             const uint8_t nonce[SEC_NONCE_BYTES], const void *msg, size_t len)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, secret, SEC_SECRET_BYTES);
    crypto_auth_hmacsha256_update(&st, nonce, SEC_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, msg, len);
    crypto_auth_hmacsha256_final(&st, mac);
}

int sec_mac_ok(const uint8_t mac[SEC_MAC_BYTES], const uint8_t secret[SEC_SECRET_BYTES],
               const uint8_t nonce[SEC_NONCE_BYTES], const void *msg, size_t len)
{
    uint8_t want[SEC_MAC_BYTES];
    sec_mac(want, secret, nonce, msg, len);
    int ok = sodium_memcmp(want, mac, SEC_MAC_BYTES) == 0;
    sodium_memzero(want, sizeof(want));
    return ok;
}
