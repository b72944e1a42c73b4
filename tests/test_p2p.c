/*
 * test_p2p.c: the engine's turn at sends and receives between pods (p2p_engine.c,
 * decision 28), on the real p2p code over a real socket pair. What an engine's turn meets
 * that would end the epoch (a forged frame, a closed connection) must be noted for the
 * net thread and neither end the epoch nor close the socket there; the net thread's next
 * turn acts on it once. The rendezvous is a recording table here: which end is called,
 * and from which turn, is what is checked, and the real agents cannot be made to read a
 * given frame on the engine's turn rather than the net thread's (test_multi's attacks
 * cover both by outcome).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "coll/coll.h"
#include "net_priv.h"
#include "wire.h"

static int ends, ends_later, last_code;
static char last_why[256];

static void rec_end(struct net *n, struct ngroup *g, int code, const char *why, int from_engine,
                    int tell)
{
    (void)n, (void)from_engine, (void)tell;
    ends++;
    last_code = code;
    snprintf(last_why, sizeof(last_why), "%s", why);
    p2p_reset(n, g, code, why);
    g->ready = 0;
}

static void rec_end_later(struct net *n, struct ngroup *g, int code, const char *why, int tell)
{
    (void)n, (void)g, (void)tell;
    ends_later++;
    last_code = code;
    snprintf(last_why, sizeof(last_why), "%s", why);
}

static void rec_formed(struct net *n, struct ngroup *g)
{
    (void)n, (void)g;
}

static const struct net_epoch_calls recorder = {rec_end, rec_end_later, rec_formed};

struct pair {
    struct net *n;
    struct ngroup *g;
    struct ngroup *groups[1];
    int peer_fd; /* rank 0's end (node 0); the group is node 1's, one rank a node */
    float buf[8];
    struct net_task t;
};

static struct pair *pair_new(void)
{
    struct pair *p = calloc(1, sizeof(*p));
    assert_non_null(p);
    p->n = calloc(1, sizeof(*p->n));
    p->g = calloc(1, sizeof(*p->g));
    assert_true(p->n && p->g);
    pthread_mutex_init(&p->n->in_lock, NULL);
    pthread_mutex_init(&p->n->out_lock, NULL);
    pthread_mutex_init(&p->n->coll_lock, NULL);
    p->n->out_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->n->in_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->n->epoch = &recorder;
    p->groups[0] = p->g;
    p->n->groups = p->groups;
    p->n->ngroups = 1;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    p->g->net = p->n;
    p->g->nodes = 2;
    p->g->me = 1;
    p->g->nlocal = 1;
    p->g->ready = 1;
    p->g->pfds[0] = sv[0];
    p->g->pfds[1] = -1;
    p->peer_fd = sv[1];
    /* a receive of 4 float32 from rank 0, tag 7, posted by the engine's turn */
    p->t.type = NET_TASK_OP;
    p->t.kind = WIRE_OP_RECV;
    p->t.dtype = COLL_FLOAT32;
    p->t.root = 0;
    p->t.seq = 7;
    p->t.count = 4;
    p->t.recv[0] = p->buf;
    p->t.deadline_ns = INT64_MAX;
    assert_int_equal(net_p2p_post(p->n, &p->t), 1);
    assert_ptr_equal(p->g->posted_head, &p->t);
    ends = ends_later = last_code = 0;
    last_why[0] = '\0';
    return p;
}

static void pair_free(struct pair *p)
{
    if (p->g->pfds[0] >= 0) close(p->g->pfds[0]);
    close(p->peer_fd);
    close(p->n->out_efd);
    close(p->n->in_efd);
    p2p_reset(p->n, p->g, COLL_ERR_SHUTDOWN, "the test ends"); /* as the net's stop does */
    p2p_free(p->g);
    free(p->g);
    free(p->n);
    free(p);
}

static struct data_op_hdr frame(uint32_t magic, uint64_t count)
{
    return (struct data_op_hdr){.magic = magic,
                                .kind = WIRE_OP_SEND,
                                .dtype = COLL_FLOAT32,
                                .redop = P2P_EAGER,
                                .src_rank = 0,
                                .dst_rank = 1,
                                .seq = 7 | (uint64_t)1 << 32,
                                .count = count};
}

/* Header h from rank 0 (payload bytes after it), then the engine's watch. */
static void send_and_watch(struct pair *p, const struct data_op_hdr *h, const void *payload,
                           size_t bytes)
{
    assert_int_equal(write(p->peer_fd, h, sizeof(*h)), (ssize_t)sizeof(*h));
    if (bytes) assert_int_equal(write(p->peer_fd, payload, bytes), (ssize_t)bytes);
    net_p2p_watch(p->n);
}

/* A header of the wrong magic from rank 0, then the engine's watch. */
static void forge_and_watch(struct pair *p)
{
    struct data_op_hdr h = frame(0xdeadbeef, 4);
    send_and_watch(p, &h, NULL, 0);
}

/* Whether eventfd fd was written since the last look (drained): the engine's, which must
 * not be on the engine's own turn, or the net thread's, when it was knocked. */
static int rung(int fd)
{
    uint64_t v = 0;
    return read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v) && v > 0;
}

/* A message the engine's watch reads completes its receive on the engine: the bytes in
 * the buffer, the task handed back, the ack written, and no eventfd rung. */
static void a_message_completes_its_receive_on_the_engine(void **state)
{
    (void)state;
    struct pair *p = pair_new();
    struct data_op_hdr h = frame(DATA_MAGIC, 4);
    float data[4] = {1, 2, 3, 4};
    send_and_watch(p, &h, data, sizeof(data));
    assert_ptr_equal(p->n->done_head, &p->t);
    assert_int_equal(p->t.status, COLL_OK);
    assert_memory_equal(p->buf, data, sizeof(data));
    assert_null(p->g->posted_head);
    assert_int_equal(atomic_load(&p->n->p2p_live), 0);
    assert_false(rung(p->n->out_efd));
    struct data_op_hdr ack;
    assert_int_equal(read(p->peer_fd, &ack, sizeof(ack)), (ssize_t)sizeof(ack));
    assert_int_equal(ack.kind, WIRE_OP_RECV);
    assert_int_equal(ack.root, COLL_OK);
    assert_int_equal(ends + ends_later, 0);
    pair_free(p);
}

/* A forged header read on the engine's turn: noted (PROTOCOL, why), the epoch not ended
 * nor the socket closed there, and the engine's watch leaves the group alone after; the
 * net thread's next turn ends the epoch, once. */
static void a_forged_frame_on_the_engine_is_ended_by_the_net_thread(void **state)
{
    (void)state;
    struct pair *p = pair_new();
    int fd = p->g->pfds[0];
    forge_and_watch(p);
    assert_int_equal(ends + ends_later, 0);
    assert_int_equal(p->g->p2p_def.set, 1);
    assert_int_equal(p->g->p2p_def.code, COLL_ERR_PROTOCOL);
    assert_non_null(strstr(p->g->p2p_def.why, "bad send header from node 0"));
    assert_int_equal(p->g->pfds[0], fd);
    assert_true(fcntl(fd, F_GETFD) >= 0); /* still open */
    uint64_t knocks = 0;
    assert_int_equal(read(p->n->in_efd, &knocks, sizeof(knocks)), (ssize_t)sizeof(knocks));
    assert_true(knocks >= 1); /* the net thread was told */
    /* the engine's later turns leave it alone: a second forgery is not read there */
    forge_and_watch(p);
    assert_int_equal(p->g->p2p_def.set, 1);
    struct net_task send = {.type = NET_TASK_OP, .kind = WIRE_OP_SEND, .root = 0, .count = 1};
    assert_int_equal(net_p2p_post(p->n, &send), 0);
    /* the net thread's turn */
    p2p_progress(p->n, p->g);
    assert_int_equal(ends, 1);
    assert_int_equal(ends_later, 0);
    assert_int_equal(last_code, COLL_ERR_PROTOCOL);
    assert_non_null(strstr(last_why, "not a send header"));
    assert_int_equal(p->g->p2p_def.set, 0);
    assert_ptr_equal(p->n->done_head, &p->t); /* the receive failed with the epoch */
    p2p_progress(p->n, p->g);
    assert_int_equal(ends, 1);
    pair_free(p);
}

/* The peer's connection closing under the engine's turn: noted as lost (the queued
 * collectives may finish first), the socket left open for the net thread, which
 * closes it and ends the epoch later, once. */
static void a_closed_connection_on_the_engine_is_closed_by_the_net_thread(void **state)
{
    (void)state;
    struct pair *p = pair_new();
    close(p->peer_fd);
    p->peer_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* for pair_free */
    int fd = p->g->pfds[0];
    net_p2p_watch(p->n);
    assert_int_equal(ends + ends_later, 0);
    assert_int_equal(p->g->p2p_def.set, 1);
    assert_int_equal(p->g->p2p_def.code, COLL_ERR_PEER_LOST);
    assert_int_equal(p->g->p2p_def.lost, 0);
    assert_int_equal(p->g->pfds[0], fd);
    assert_true(fcntl(fd, F_GETFD) >= 0);
    p2p_progress(p->n, p->g);
    assert_int_equal(ends_later, 1);
    assert_int_equal(last_code, COLL_ERR_PEER_LOST);
    assert_non_null(strstr(last_why, "node 0 closed its send/recv connection"));
    assert_int_equal(p->g->pfds[0], -1);
    assert_true(fcntl(fd, F_GETFD) < 0); /* closed by the net thread */
    pair_free(p);
}

/* Forged and out-of-order frames read on the engine's turn: a send claiming 2^41
 * elements, an ack for a send never made, a payload nobody cleared, each noted with
 * its reason and acted on once by the net thread; the posted receive untouched. */
static void oversized_and_out_of_order_frames_on_the_engine_are_noted(void **state)
{
    (void)state;
    struct data_op_hdr cases[3] = {frame(DATA_MAGIC, 1ull << 41), frame(DATA_MAGIC, 0),
                                   frame(DATA_MAGIC, 4)};
    cases[1].kind = WIRE_OP_RECV; /* an ack ... */
    cases[1].redop = P2P_ACK;
    cases[1].src_rank = 0; /* ... from the receiver, rank 0, to us */
    cases[1].dst_rank = 1;
    cases[2].redop = P2P_DATA; /* a payload no CTS of ours asked for */
    const char *why[3] = {"send of 2199023255552 elements", "acknowledged a send it was never",
                          "sent a payload nobody cleared"};
    for (int c = 0; c < 3; c++) {
        struct pair *p = pair_new();
        float junk[4] = {9, 9, 9, 9};
        send_and_watch(p, &cases[c], junk, c == 2 ? sizeof(junk) : 0);
        assert_int_equal(ends + ends_later, 0);
        assert_int_equal(p->g->p2p_def.set, 1);
        assert_int_equal(p->g->p2p_def.code, COLL_ERR_PROTOCOL);
        assert_non_null(strstr(p->g->p2p_def.why, why[c]));
        assert_ptr_equal(p->g->posted_head, &p->t); /* the receive still waits */
        assert_true(p->buf[0] == 0.0f);
        p2p_progress(p->n, p->g);
        assert_int_equal(ends, 1);
        assert_int_equal(last_code, COLL_ERR_PROTOCOL);
        pair_free(p);
    }
}

/* A message replayed after its receive took the first: the engine's watch, with nothing
 * to hear from that pod, leaves it in the socket; the net thread keeps it as an early
 * message for a receive to come (within the bounds); the done receive is not completed
 * again. */
static void a_replayed_message_completes_nothing_twice(void **state)
{
    (void)state;
    struct pair *p = pair_new();
    struct data_op_hdr h = frame(DATA_MAGIC, 4);
    float data[4] = {1, 2, 3, 4}, again[4] = {5, 6, 7, 8};
    send_and_watch(p, &h, data, sizeof(data));
    assert_ptr_equal(p->n->done_head, &p->t);
    send_and_watch(p, &h, again, sizeof(again));
    assert_int_equal(p->g->unx_n, 0); /* nothing waits to hear from rank 0: not read here */
    p2p_progress(p->n, p->g);         /* the net thread's turn reads it */
    assert_ptr_equal(p->n->done_head, &p->t);
    assert_null(p->t.next); /* handed back once */
    assert_memory_equal(p->buf, data, sizeof(data));
    assert_int_equal(p->g->unx_n, 1);
    assert_int_equal(p->g->p2p_def.set, 0);
    assert_int_equal(ends + ends_later, 0);
    pair_free(p);
}

/* An epoch that ends by other means first forgets the noted end (the connections go
 * with it): the net thread does not end the next epoch for it. */
static void an_epoch_that_ends_first_forgets_the_noted_end(void **state)
{
    (void)state;
    struct pair *p = pair_new();
    forge_and_watch(p);
    assert_int_equal(p->g->p2p_def.set, 1);
    p2p_reset(p->n, p->g, COLL_ERR_PEER_LOST, "a heartbeat missed");
    assert_int_equal(p->g->p2p_def.set, 0);
    p2p_progress(p->n, p->g);
    assert_int_equal(ends + ends_later, 0);
    pair_free(p);
}

/* Found by the two-step allreduce of a child across pods on 712b7eb: a message left in
 * its sender's socket for want of room (parked: the net thread stops polling that socket
 * for reading) whose receive the engine posted was read only as far as the socket held
 * it; the net thread, its poll set made while the stream was parked, slept on until its
 * next timer (20 ms a 4 MiB op). Now the engine knocks, and its watch reads on. Rank 0
 * fills the agent's early messages from it (UNX_PEER_MSGS empty ones, tag 9), then sends
 * 4 floats on tag 11, half of them: parked. */
static void a_parked_message_the_engine_lets_go_is_polled_again(void **state)
{
    (void)state;
    struct pair *p = pair_new();
    for (uint32_t i = 1; i <= UNX_PEER_MSGS + 1; i++) {
        struct data_op_hdr h = frame(DATA_MAGIC, i <= UNX_PEER_MSGS ? 0 : 4);
        h.seq = (i <= UNX_PEER_MSGS ? 9u : 11u) | (uint64_t)i << 32;
        ssize_t w;
        for (int k = 0; (w = write(p->peer_fd, &h, sizeof(h))) < 0 && k < 1000; k++)
            net_p2p_watch(p->n); /* the socket is full: the engine's watch reads */
        assert_int_equal(w, (ssize_t)sizeof(h));
    }
    float data[4] = {5, 6, 7, 8};
    assert_int_equal(write(p->peer_fd, data, 8), 8);
    for (int k = 0; k < 64 && !p->g->in[0].parked; k++)
        net_p2p_watch(p->n);
    assert_true(p->g->in[0].parked);
    assert_int_equal(p->g->unx_n, UNX_PEER_MSGS);
    assert_int_equal(atomic_load(&p->g->unx_pub), UNX_PEER_MSGS * UNX_MSG_COST);
    (void)rung(p->n->in_efd);
    float got[4] = {0};
    struct net_task t = p->t;
    t.seq = 11;
    t.recv[0] = got;
    t.next = NULL;
    assert_int_equal(net_p2p_post(p->n, &t), 1); /* on the engine's turn */
    assert_false(p->g->in[0].parked);
    assert_true(rung(p->n->in_efd)); /* the net thread polls the socket again */
    assert_int_equal(write(p->peer_fd, data + 2, 8), 8);
    net_p2p_watch(p->n); /* and the engine's spin reads on */
    assert_memory_equal(got, data, sizeof(data));
    int done = 0;
    for (struct net_task *d = p->n->done_head; d; d = d->next)
        done |= d == &t && d->status == COLL_OK;
    assert_true(done);
    assert_int_equal(ends + ends_later, 0);
    pair_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_message_completes_its_receive_on_the_engine),
        cmocka_unit_test(a_forged_frame_on_the_engine_is_ended_by_the_net_thread),
        cmocka_unit_test(a_closed_connection_on_the_engine_is_closed_by_the_net_thread),
        cmocka_unit_test(oversized_and_out_of_order_frames_on_the_engine_are_noted),
        cmocka_unit_test(a_replayed_message_completes_nothing_twice),
        cmocka_unit_test(an_epoch_that_ends_first_forgets_the_noted_end),
        cmocka_unit_test(a_parked_message_the_engine_lets_go_is_polled_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
