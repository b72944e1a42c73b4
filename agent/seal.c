/*
 * seal.c: sealed records on a data connection (seal.h).
 */
#include "seal.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define TAG 16
#define LEN 4
#define RX_CAP (2 * (SEAL_REC_MAX + SEAL_OVERHEAD))
#define TX_CAP (SEAL_TX_RECS * (SEAL_REC_MAX + SEAL_OVERHEAD))

struct seal {
    int mode, cipher;
    int broken; /* errno of a record that failed its check: the connection is done */
    uint8_t key[32];
    crypto_aead_aes256gcm_state *gcm; /* AES-GCM's expanded key (16-byte aligned) */
    uint64_t ctr;                     /* the next record's number */
    uint8_t *buf;                     /* tx: records to send; rx: bytes received */
    size_t off, len;                  /* the bytes of buf not yet sent / not yet opened */
    /* tx: the records queued, by where each ends in buf and its payload */
    size_t rec_end[SEAL_TX_RECS], rec_plain[SEAL_TX_RECS];
    int nrec, head;
    /* rx: the opened record's payload not yet read: buf[poff, poff + plen) */
    size_t poff, plen;
};

int seal_ciphers(void)
{
    if (sodium_init() < 0) return 0;
    return SEAL_CHACHA | (crypto_aead_aes256gcm_is_available() ? SEAL_AESGCM : 0);
}

int seal_pick(int ours, int theirs)
{
    int both = ours & theirs;
    return both & SEAL_AESGCM ? SEAL_AESGCM : both & SEAL_CHACHA ? SEAL_CHACHA : 0;
}

void seal_derive(uint8_t key[32], const uint8_t secret[32], const uint8_t chal_nonce[32],
                 const uint8_t hello_nonce[32], int channel, int dir, int mode, int cipher)
{
    static const char label[] = "coll data seal 1";
    const uint8_t tail[4] = {(uint8_t)channel, (uint8_t)dir, (uint8_t)mode, (uint8_t)cipher};
    crypto_generichash_state st;
    crypto_generichash_init(&st, secret, 32, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof(label) - 1);
    crypto_generichash_update(&st, chal_nonce, 32);
    crypto_generichash_update(&st, hello_nonce, 32);
    crypto_generichash_update(&st, tail, sizeof(tail));
    crypto_generichash_final(&st, key, 32);
}

struct seal *seal_new(int mode, int cipher, const uint8_t key[32])
{
    if (sodium_init() < 0 || (mode != SEAL_MAC && mode != SEAL_ENCRYPT) ||
        (cipher != SEAL_CHACHA && cipher != SEAL_AESGCM) ||
        (cipher == SEAL_AESGCM && !crypto_aead_aes256gcm_is_available()))
        return NULL;
    struct seal *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->mode = mode;
    s->cipher = cipher;
    memcpy(s->key, key, 32);
    if (cipher == SEAL_AESGCM) {
        s->gcm = aligned_alloc(16, (sizeof(*s->gcm) + 15) & ~(size_t)15);
        if (!s->gcm) {
            free(s);
            return NULL;
        }
        crypto_aead_aes256gcm_beforenm(s->gcm, key);
    }
    return s;
}

void seal_free(struct seal *s)
{
    if (!s) return;
    if (s->gcm) {
        sodium_memzero(s->gcm, sizeof(*s->gcm));
        free(s->gcm);
    }
    free(s->buf);
    sodium_memzero(s, sizeof(*s));
    free(s);
}

uint64_t seal_records(const struct seal *s)
{
    return s->ctr;
}

static void nonce_of(uint8_t n[12], uint64_t ctr)
{
    memset(n, 0, 12);
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)(ctr >> (8 * i));
}

/* Seal the record whose payload (n bytes) is at rec + LEN, in place; its tag follows. */
static void seal_record(struct seal *s, uint8_t *rec, size_t n)
{
    uint8_t npub[12];
    nonce_of(npub, s->ctr++);
    for (int i = 0; i < LEN; i++)
        rec[i] = (uint8_t)(n >> (8 * i));
    uint8_t *p = rec + LEN, *tag = p + n;
    int enc = s->mode == SEAL_ENCRYPT;
    /* encrypt: the payload, with the length as authenticated data; mac: nothing
     * encrypted, length and payload authenticated */
    const uint8_t *ad = rec;
    unsigned long long adlen = enc ? LEN : LEN + n;
    if (s->gcm)
        crypto_aead_aes256gcm_encrypt_detached_afternm(p, tag, NULL, p, enc ? n : 0, ad, adlen,
                                                       NULL, npub, s->gcm);
    else
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(p, tag, NULL, p, enc ? n : 0, ad, adlen,
                                                           NULL, npub, s->key);
}

/* Open the record at rec (payload n bytes) in place: 0, or -1 if its tag is wrong. */
static int open_record(struct seal *s, uint8_t *rec, size_t n)
{
    uint8_t npub[12];
    nonce_of(npub, s->ctr++);
    uint8_t *p = rec + LEN, *tag = p + n;
    int enc = s->mode == SEAL_ENCRYPT;
    unsigned long long adlen = enc ? LEN : LEN + n;
    if (s->gcm)
        return crypto_aead_aes256gcm_decrypt_detached_afternm(p, NULL, p, enc ? n : 0, tag, rec,
                                                              adlen, npub, s->gcm);
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(p, NULL, p, enc ? n : 0, tag, rec,
                                                              adlen, npub, s->key);
}

/* Put what is queued on the wire, as far as the socket takes it: the payload bytes of
 * the records now wholly sent, or -1 with errno on a failure other than EAGAIN. */
static ssize_t flush(struct seal *s, int fd)
{
    while (s->off < s->len) {
        ssize_t r = send(fd, s->buf + s->off, s->len - s->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR) break;
            return -1;
        }
        s->off += (size_t)r;
    }
    size_t done = 0;
    while (s->nrec && s->rec_end[s->head] <= s->off) {
        done += s->rec_plain[s->head];
        s->head = (s->head + 1) % SEAL_TX_RECS;
        s->nrec--;
    }
    if (s->off == s->len) s->off = s->len = 0;
    return (ssize_t)done;
}

ssize_t seal_send(struct seal *s, int fd, const struct iovec *v, int nv)
{
    if (!s->buf && !(s->buf = malloc(TX_CAP))) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t done = flush(s, fd);
    if (done < 0) return -1;
    if (!s->nrec) {
        /* all of it is out: seal the next records from the bytes offered, past those
         * the count now includes (the caller offered them before it knew) */
        int i = 0;
        size_t at = 0, skip = (size_t)done; /* within v[i] */
        while (i < nv && skip >= v[i].iov_len - at) {
            skip -= v[i].iov_len - at;
            i++;
            at = 0;
        }
        at += skip;
        while (s->nrec < SEAL_TX_RECS && i < nv) {
            uint8_t *rec = s->buf + s->len;
            size_t n = 0;
            while (n < SEAL_REC_MAX && i < nv) {
                size_t take = v[i].iov_len - at;
                if (take > SEAL_REC_MAX - n) take = SEAL_REC_MAX - n;
                memcpy(rec + LEN + n, (const char *)v[i].iov_base + at, take);
                n += take;
                at += take;
                if (at == v[i].iov_len) {
                    i++;
                    at = 0;
                }
            }
            if (!n) break;
            seal_record(s, rec, n);
            s->len += LEN + n + TAG;
            int k = (s->head + s->nrec) % SEAL_TX_RECS;
            s->rec_end[k] = s->len;
            s->rec_plain[k] = n;
            s->nrec++;
        }
        ssize_t more = flush(s, fd);
        if (more < 0) return -1;
        done += more;
    }
    if (done) return done;
    errno = EAGAIN;
    return -1;
}

ssize_t seal_recv(struct seal *s, int fd, const struct iovec *v, int nv)
{
    if (s->broken) {
        errno = s->broken;
        return -1;
    }
    if (!s->buf && !(s->buf = malloc(RX_CAP))) {
        errno = ENOMEM;
        return -1;
    }
    for (;;) {
        if (s->plen) {
            size_t got = 0;
            for (int i = 0; i < nv && s->plen; i++) {
                size_t take = v[i].iov_len < s->plen ? v[i].iov_len : s->plen;
                memcpy(v[i].iov_base, s->buf + s->poff, take);
                s->poff += take;
                s->plen -= take;
                got += take;
            }
            return (ssize_t)got;
        }
        size_t have = s->len - s->off;
        if (have >= LEN) {
            const uint8_t *h = s->buf + s->off;
            size_t n = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
            if (n == 0 || n > SEAL_REC_MAX) {
                errno = s->broken = EPROTO;
                return -1;
            }
            if (have >= LEN + n + TAG) {
                if (open_record(s, s->buf + s->off, n) != 0) {
                    errno = s->broken = EBADMSG;
                    return -1;
                }
                s->poff = s->off + LEN;
                s->plen = n;
                s->off += LEN + n + TAG;
                continue;
            }
        }
        /* a record is not wholly in: read on, the part held moved to the front first
         * when the rest would not fit behind it */
        if (s->off == s->len) {
            s->off = s->len = 0;
        } else if (s->len + SEAL_REC_MAX + SEAL_OVERHEAD > RX_CAP) {
            memmove(s->buf, s->buf + s->off, have);
            s->off = 0;
            s->len = have;
        }
        ssize_t r = recv(fd, s->buf + s->len, RX_CAP - s->len, MSG_DONTWAIT);
        if (r <= 0) return r; /* closed (a record cut short is lost with it), or errno */
        s->len += (size_t)r;
    }
}
