/*
 * dataconn_seal.c: security.data on the data connections (seal.h): the seals a
 * connection gets as it comes up, the ways the collectives (tcp_io) and send/recv reach
 * its bytes through them, and their end. dataconn.c calls it; it calls only seal.c.
 */
#include <errno.h>
#include <sodium.h>
#include <sys/uio.h>
#include <unistd.h>

#include "net_priv.h"
#include "seal.h"

ssize_t dataconn_seal_send(void *ctx, int peer, int fd, const struct iovec *v, int nv)
{
    struct ngroup *g = ctx;
    if (!g->seal_tx[peer]) {
        errno = EPROTO; /* never: the seal comes up with its connection */
        return -1;
    }
    return seal_send(g->seal_tx[peer], fd, v, nv);
}

ssize_t dataconn_seal_recv(void *ctx, int peer, int fd, const struct iovec *v, int nv)
{
    struct ngroup *g = ctx;
    if (!g->seal_rx[peer]) {
        errno = EPROTO;
        return -1;
    }
    return seal_recv(g->seal_rx[peer], fd, v, nv);
}

ssize_t dataconn_p2p_send(struct ngroup *g, int peer, const struct iovec *v, int nv)
{
    if (!g->seal_mode) return writev(g->pfds[peer], v, nv);
    if (!g->pseal_tx[peer]) {
        errno = EPROTO;
        return -1;
    }
    return seal_send(g->pseal_tx[peer], g->pfds[peer], v, nv);
}

ssize_t dataconn_p2p_recv(struct ngroup *g, int peer, void *buf, size_t len)
{
    if (!g->seal_mode) return read(g->pfds[peer], buf, len);
    if (!g->pseal_rx[peer]) {
        errno = EPROTO;
        return -1;
    }
    struct iovec v = {buf, len};
    return seal_recv(g->pseal_rx[peer], g->pfds[peer], &v, 1);
}

/* The seals of the connections with node i, with them. */
void dataconn_seals_free(struct ngroup *g, int i)
{
    struct seal **s[4] = {&g->seal_tx[i], &g->seal_rx[i], &g->pseal_tx[i], &g->pseal_rx[i]};
    for (int k = 0; k < 4; k++) {
        seal_free(*s[k]);
        *s[k] = NULL;
    }
}

/* With security.data, the seals of a connection that has just come up: ours as the
 * opener or not, with the cipher its welcome named and both nonces of its handshake.
 * COLL carries the opener's bytes only, COLL_BACK the acceptor's, P2P both ways. 0, or
 * -1 when out of memory. */
int dataconn_seal_up(struct ngroup *g, int ch, int peer, int opener, int cipher,
                     const uint8_t chal[SEC_NONCE_BYTES], const uint8_t hello[SEC_NONCE_BYTES])
{
    if (!g->seal_mode) return 0;
    int tx = ch == DATA_CH_P2P || (ch == DATA_CH_COLL) == opener;
    int rx = ch == DATA_CH_P2P || !tx;
    struct seal **ts = ch == DATA_CH_P2P ? &g->pseal_tx[peer] : &g->seal_tx[peer];
    struct seal **rs = ch == DATA_CH_P2P ? &g->pseal_rx[peer] : &g->seal_rx[peer];
    uint8_t k[32];
    if (tx) { /* our bytes: dir 0 for the opener's, 1 for the acceptor's */
        seal_derive(k, g->secret, chal, hello, ch, !opener, g->seal_mode, cipher);
        seal_free(*ts);
        *ts = seal_new(g->seal_mode, cipher, k);
    }
    if (rx) {
        seal_derive(k, g->secret, chal, hello, ch, opener, g->seal_mode, cipher);
        seal_free(*rs);
        *rs = seal_new(g->seal_mode, cipher, k);
    }
    sodium_memzero(k, sizeof(k));
    return (tx && !*ts) || (rx && !*rs) ? -1 : 0;
}
