/*
 * security.h: who may join a group and who may open its data connections.
 *
 * Rendezvous: ZeroMQ CURVE. Every pod of a deployment holds the same four Z85 key
 * files (a Kubernetes Secret): the coordinator serves with the server key pair and
 * admits only clients that present the client public key (a ZAP handler on the net
 * thread); members connect with the client key pair and check the server's key.
 * Data plane: COMMIT hands every member a fresh per-epoch secret (confidential under
 * CURVE); each data connection proves it with an HMAC-SHA256 (libsodium) over a fresh
 * nonce the accepting side sent first, so a recorded hello cannot be replayed.
 */
#ifndef AGENT_SECURITY_H
#define AGENT_SECURITY_H

#include <stddef.h>
#include <stdint.h>

#define SEC_KEY_Z85 41 /* 40 Z85 characters and a NUL */
#define SEC_SECRET_BYTES 32
#define SEC_NONCE_BYTES 32
#define SEC_MAC_BYTES 32

/* The CURVE keys of a deployment, as Z85 text. */
struct sec_keys {
    int loaded; /* 0: none configured (development mode) */
    char server_public[SEC_KEY_Z85], server_secret[SEC_KEY_Z85];
    char client_public[SEC_KEY_Z85], client_secret[SEC_KEY_Z85];
};

/* Make the four key files in dir (created if missing; secrets mode 0600). 0, or -1 with
 * why. Refuses to overwrite existing files. */
int sec_keygen(const char *dir, char *why, size_t whylen);
/* Read dir/{server,client}.{pub,key}. 0, or -1 with why (which file, what is wrong). */
int sec_load_keys(const char *dir, struct sec_keys *k, char *why, size_t whylen);

/* The deployment's keys derived from a seed file (security.seed; in Kubernetes a Secret
 * the chart makes once per release): its bytes, trailing white space dropped, at least
 * SEC_SEED_MIN of them, hashed (BLAKE2b) with a label per role into the seed of a
 * Curve25519 key pair (libsodium's crypto_box_seed_keypair), the server's and the
 * client's, written as Z85 as the key files hold them. Every pod with the same seed
 * derives the same four keys. 0, or -1 with why. */
#define SEC_SEED_MIN 32
int sec_seed_keys(const char *path, struct sec_keys *k, char *why, size_t whylen);

/* Apply the keys to a ROUTER that serves the rendezvous / a DEALER that joins it. */
int sec_curve_server(void *zsock, const struct sec_keys *k, char *why, size_t whylen);
int sec_curve_client(void *zsock, const struct sec_keys *k, char *why, size_t whylen);

/* The ZAP handler (ZeroMQ's authentication hook): a REP socket on the context's
 * inproc endpoint. Bind it before the ROUTER; call sec_zap_serve whenever it is
 * readable: it answers every queued request, admitting CURVE clients with the client
 * public key only. Returns the number refused. */
void *sec_zap_open(void *zctx, char *why, size_t whylen);
int sec_zap_serve(void *zap, const struct sec_keys *k);

/* Fill p with n cryptographically random bytes. */
void sec_random(void *p, size_t n);
/* mac = HMAC-SHA256(secret, nonce || msg). */
void sec_mac(uint8_t mac[SEC_MAC_BYTES], const uint8_t secret[SEC_SECRET_BYTES],
             const uint8_t nonce[SEC_NONCE_BYTES], const void *msg, size_t len);
/* 1 when mac is right (constant time), else 0. */
int sec_mac_ok(const uint8_t mac[SEC_MAC_BYTES], const uint8_t secret[SEC_SECRET_BYTES],
               const uint8_t nonce[SEC_NONCE_BYTES], const void *msg, size_t len);

#endif
