/*
 * seal.h: the bytes of a data connection in sealed records (security.data: mac or
 * encrypt), one direction of one connection per struct seal.
 *
 * A record is a 4-byte length (little-endian, 1..SEAL_REC_MAX), the payload, and a
 * 16-byte AEAD tag (libsodium: AES-256-GCM where both pods' CPUs have AES-NI, else
 * ChaCha20-Poly1305). The nonce is the record's number on its connection, so a record
 * dropped, repeated or moved fails the next tag. `encrypt` encrypts the payload (the
 * length is authenticated data); `mac` sends it in the clear and authenticates length
 * and payload (the AEAD over an empty message). Each direction of each connection has
 * its own key, derived from the epoch's secret and both nonces of the connection's
 * handshake (seal_derive), so record numbers start at 0 on every connection and no key
 * is ever used twice with one nonce.
 *
 * Senders and readers see the plain stream: seal_send takes what a sendmsg would and
 * says how many of those bytes are on the wire (a record is counted when its last byte
 * is); until then the caller offers the same bytes again, from where it was. seal_recv
 * returns only bytes whose record has been checked.
 */
#ifndef AGENT_SEAL_H
#define AGENT_SEAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

enum { SEAL_NONE = 0, SEAL_MAC = 1, SEAL_ENCRYPT = 2 };
/* ciphers, as bits (a hello offers its set, the welcome names one) */
enum { SEAL_CHACHA = 1, SEAL_AESGCM = 2 };

#define SEAL_REC_MAX ((size_t)64 << 10) /* payload bytes of one record */
#define SEAL_OVERHEAD 20                /* length and tag */
#define SEAL_TX_RECS 4                  /* records sealed ahead of the socket */

struct seal;

/* The ciphers this CPU runs (SEAL_CHACHA always; SEAL_AESGCM with AES-NI). */
int seal_ciphers(void);
/* The cipher two pods use: AES-GCM where both offer it, else ChaCha20-Poly1305; 0 when
 * they share none. */
int seal_pick(int ours, int theirs);
/* The key of one direction of one connection: BLAKE2b keyed with the epoch's secret
 * over the challenge's and the hello's nonces, the channel, the direction (0: the
 * opener's bytes, 1: the acceptor's), the mode and the cipher. */
void seal_derive(uint8_t key[32], const uint8_t secret[32], const uint8_t chal_nonce[32],
                 const uint8_t hello_nonce[32], int channel, int dir, int mode, int cipher);
/* A direction in mode (SEAL_MAC or SEAL_ENCRYPT) with cipher and key; NULL if out of
 * memory. Its buffers are taken at first use. */
struct seal *seal_new(int mode, int cipher, const uint8_t key[32]);
void seal_free(struct seal *s);
/* Send what v[0..nv) holds, without waiting: the bytes of it now on the wire (> 0), or
 * -1 with errno (EAGAIN: none yet; wait for POLLOUT). Records still queued keep their
 * bytes; call again with v starting where the count says. */
ssize_t seal_send(struct seal *s, int fd, const struct iovec *v, int nv);
/* Read into v[0..nv) as recvmsg would, without waiting: bytes (> 0), 0 when the peer
 * closed, or -1 with errno (EAGAIN; EBADMSG: a record failed its check, and every later
 * call fails so; EPROTO: a length out of range). */
ssize_t seal_recv(struct seal *s, int fd, const struct iovec *v, int nv);
/* Records sealed and opened so far (a test's view). */
uint64_t seal_records(const struct seal *s);

#endif
