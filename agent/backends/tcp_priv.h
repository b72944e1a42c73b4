/*
 * tcp_priv.h: what the tcp backend's files share, and nobody else. Layers, bottom to
 * top, each calling only those below it: tcp.c (transfers, headers, acks, scratch and
 * local reduction), tcp_steps.c (steps both op paths take), tcp_tiny.c (tiny ops as
 * resumable state), tcp_ops.c (the collectives, tcp_run).
 */
#ifndef AGENT_BACKENDS_TCP_PRIV_H
#define AGENT_BACKENDS_TCP_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "../net.h" /* struct net_task only */
#include "../rdv_wire.h"
#include "tcp.h"

struct xfer {
    int peer;
    int is_send;
    struct iovec iov[4]; /* a header, then the payload in up to three pieces */
    int niov;
    size_t hl; /* header bytes */
    size_t total, done;
    /* receive with reduction (tcp_x_fold): payload lands in iov[niov-1] (a scratch area,
     * or red_dst itself when red_src is set) and is folded into red_dst segment by
     * segment */
    void *red_dst;
    size_t red_done;
    /* when red_dst is also being sent (by this transfer), fold only what it has sent */
    const struct xfer *red_after;
    /* our own operand, when it is not red_dst: red_dst = red_src op what arrives */
    const void *red_src;
    /* a send that relays what a receive brings in: its payload runs no further than
     * gate_base plus what of gate's payload has arrived */
    const struct xfer *gate;
    size_t gate_base;
    /* a receive whose header is checked against ours as soon as it is in */
    int check_hdr;
    /* a send whose first payload piece is also copied here as it goes, while it is
     * still in this CPU's caches (our input, to its place in the result) */
    char *copy_to;
};

/* From this size of result (allgather's whole, broadcast's vector), an input apart from
 * the result is sent from where it is and copied into place as it goes (copy_to), not
 * copied first and sent from its copy: the copy then reads what the send has just
 * brought into the caches. 2 pods (2 MiB allgather 0.92 of the time, 1 MiB 0.94; 2 MiB
 * broadcast root 0.89) and 4 pods (256 KiB allgather, 1 MiB in all: 0.94). Below it the
 * copy first was as fast or faster (2 pods, broadcast 256 KiB 1.07, 512 KiB 1.03):
 * bench/RESULTS.md. */
#define TCP_COPY_AS_SENT_BYTES ((size_t)1 << 20)

struct opctx {
    struct tcp_comm *c;
    struct net_task *t;
    size_t es;
    int red_op; /* the reduction between pods (sum for avg) */
    char *why;
    size_t whylen;
    struct data_op_hdr hdr;
    int late_acks; /* a broadcast root going on without its acks: while blocked, look at
                    * what the pods send it (only acks are expected) */
    /* last: tcp_init_ctx sets the fields above only, never these 160 KiB (an entry is
     * written by its receive before anything reads it) */
    struct data_op_hdr peer_hdr[RDV_MAX_NODES];
};

struct tcp_tiny {
    struct tcp_comm c;
    struct opctx o;
    struct xfer x[2 * RDV_MAX_NODES];
    int nx;
    char *tmp;
    int step, nsteps; /* doubling or halving: the step under way, and how many (0: none) */
    size_t bytes;     /* doubling or halving: bytes per block (allreduce: of the vector) */
    char *vec;        /* the pod's vector, one block per pod: reduced (reduce_scatter, reduce),
                       * packed (all-to-all), or the result itself (allgather, and allreduce
                       * by doubling: its running result; NULL for a barrier) */
    /* where our contribution is read by the first step (reduce_scatter: the send buffer
     * or vec; allreduce by doubling: the send buffer, or NULL for vec) and, for
     * reduce_scatter, where our block ends (the result, or in vec); the send buffer means
     * neither is copied. Allgather: its input, which doubling's first step sends (then NULL)
     * and copies into vec as it goes (TCP_COPY_AS_SENT_BYTES), and a direct exchange's
     * every send */
    const char *src;
    char *out;
    char why[160];
};

/* What one pod owes a broadcast root (tcp.h: TCP_ACK_WINDOW). */
struct tcp_owed {
    int n;                                                      /* acks owed, oldest first */
    size_t got;                                                 /* bytes of them read into in */
    struct data_op_hdr exp[TCP_ACK_WINDOW], in[TCP_ACK_WINDOW]; /* what each must say; read */
};

struct tcp_acks {
    int owed, nodes;         /* owed in all; pods */
    int has_prev;            /* ... and the last op this pod started in the epoch */
    struct data_op_hdr prev; /* (its seq is not compared) */
    uint32_t run;            /* ... which repeated the one before it run times */
    struct tcp_owed peer[];  /* by node index */
};

/* How op h (ours, before tcp_note_op) treats the bare headers of a broadcast: 0 (every
 * pod but the root sends one, the root waits for it in the op), or for a broadcast that
 * repeats the previous op: TCP_ACK_LATE for the root (it owes them to tcp_settle, or
 * with TCP_ACK_NONE as well there is none to take) and TCP_ACK_NONE where this op is not
 * one of every TCP_ACK_EVERY (none is sent). Pods that agree on the ops so far agree on
 * the plan. tcp_note_op records h as the previous op once it runs. */
#define TCP_ACK_LATE 1
#define TCP_ACK_NONE 2
int tcp_ack_plan(const struct tcp_comm *c, const struct data_op_hdr *h);
void tcp_note_op(struct tcp_comm *c, const struct data_op_hdr *h);
/* Pod p owes us its bare header for op h (within the window tcp_settle left). */
void tcp_owe(struct tcp_comm *c, int p, const struct data_op_hdr *h);
/* A broadcast's chain from the root, for o's op with tcp_ack_plan's plan: sets up x (two
 * transfers at most: from the pod before, to the pod after, relaying as bytes arrive)
 * and returns how many; the root's input is in its result or on its way (copy_to). */
int tcp_bcast_chain(struct opctx *o, int plan, struct xfer *x);

void tcp_x_send(struct xfer *x, int peer, const void *hdr, size_t hl, const void *p, size_t n);
void tcp_x_recv(struct xfer *x, int peer, void *hdr, size_t hl, void *p, size_t n);
/* Receive x with reduction: fold what arrives into dst, with our operand mine (NULL: dst
 * holds it); with a separate operand the payload lands in dst itself. */
void tcp_x_fold(struct xfer *x, void *dst, const void *mine);
/* Run transfers x[0..nx) at once to completion (or the budget, TCP_AGAIN). */
int tcp_exchange(struct opctx *o, struct xfer *x, int nx);
int tcp_failf(struct opctx *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *tcp_scratch(struct tcp_comm *c, int k, size_t bytes);
/* Whether [a, a + an) and [b, b + bn) do not overlap: an input that can be read where it
 * is while the result is written elsewhere. */
static inline int tcp_apart(const void *a, size_t an, const void *b, size_t bn)
{
    const char *x = a, *y = b;
    return x + an <= y || y + bn <= x;
}
/* Whether a lone participant's input may be sent or folded from where it is, instead of
 * being reduced into a buffer first: not a premultiplied sum's, which tcp_local_reduce
 * scales on the way. */
static inline int tcp_input_as_is(const struct net_task *t)
{
    return t->redop != WIRE_REDOP_PREMUL;
}

void tcp_reduce_in_pod_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count);
/* The same, combined pairwise as recursive doubling does ((0+1)+(2+3), ...; pods a power
 * of two), so that a direct exchange gives the bits doubling would. */
void tcp_reduce_in_tree_order(struct opctx *o, void *mine, char *in, size_t bytes, size_t count);
void tcp_local_reduce(struct opctx *o, void *dst, size_t off, size_t count);
void tcp_finish_avg(struct opctx *o, void *buf, size_t count);
int tcp_copy_to_locals(struct opctx *o, const void *src, size_t bytes);
/* A long local step gives the net thread's service a turn every TCP_TURN_BYTES
 * (tcp_ops.c says why); since counts the bytes since the last. COLL_OK or the service's
 * error (o->why says it). */
#define TCP_TURN_BYTES ((size_t)4 << 20)
int tcp_local_turn(struct opctx *o, size_t *since, size_t bytes);
size_t tcp_alltoall_pair_bytes(const struct opctx *o);
int tcp_alltoall_setup(struct opctx *o, char *out, char *in, struct xfer *x, int *nx);
int tcp_alltoall_unpack(struct opctx *o, const char *out, char *in);
void tcp_init_ctx(struct opctx *o, struct tcp_comm *c, struct net_task *t, char *why,
                  size_t whylen);

/* The header of t's first message to each peer (tcp.c; tcp_ops.c's tcp_run too). */
struct data_op_hdr tcp_op_hdr(const struct tcp_comm *c, const struct net_task *t);

#endif
