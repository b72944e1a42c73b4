/*
 * tcp.h: the host backend between agents. Runs one matched op (the buffers of this
 * pod's participants) with the other pods of its group over the epoch's TCP
 * connections: local reduction first, then a size-dependent algorithm between pods
 * (direct exchange for small ops, pipelined ring for large ones), then the copies to
 * the local participants. Called on the net thread only.
 */
#ifndef AGENT_BACKENDS_TCP_H
#define AGENT_BACKENDS_TCP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "spin.h"

struct net_task;

/* Scratch an op grows on demand; its owner (a group) keeps it between ops. */
struct tcp_scratch {
    void *p[2];
    size_t cap[2];
};

/* Called from inside a long transfer, at most every ~20 ms: the caller keeps its other
 * work going (heartbeats, other groups) and says whether the op must stop (a coll_err
 * with why) or go on (0). */
typedef int (*tcp_service_fn)(void *ctx, char *why, size_t whylen);

/*
 * What a connection's reader took beyond what it asked for (read-ahead). A small read
 * (at most TCP_STASH_BYTES) also offers the kernel this buffer, so a run of small ops a
 * peer sent ahead of us (a broadcast root's) is taken in one call instead of one per op;
 * every read of that connection takes from here first. The bytes are the stream's: they
 * go wherever the connection goes (a lease carries them, wire.h) and are dropped with it.
 */
#define TCP_STASH_BYTES 4096
struct tcp_stash {
    uint32_t off, len; /* the bytes held: b[off, off + len) */
    uint8_t b[TCP_STASH_BYTES];
};
/* The bytes s holds, moved to the front of its buffer (for a lease to carry): returns
 * how many. */
size_t tcp_stash_front(struct tcp_stash *s);
/* Empty the n stashes at s (NULL: none), their connections closed. */
void tcp_stash_drop(struct tcp_stash *s, int n);

/* Another way for a connection's bytes than plain sendmsg and recvmsg (the agent's
 * sealed records, seal.h): each as its plain call would, without waiting (send: bytes
 * taken, or -1 with errno EAGAIN when none; recv: bytes, 0 when closed, or -1). */
struct tcp_io {
    ssize_t (*send)(void *ctx, int peer, int fd, const struct iovec *v, int nv);
    ssize_t (*recv)(void *ctx, int peer, int fd, const struct iovec *v, int nv);
    void *ctx;
};

struct tcp_comm {
    const struct tcp_io *io; /* NULL: plain bytes (with the read-ahead stash) */
    tcp_service_fn service;  /* NULL: none (the engine's budgeted runs never wait) */
    void *service_ctx;
    int nodes, me, nlocal;
    int *fds;     /* by node index, our bytes to that node; fds[me] unused */
    int *rfds;    /* by node index, that node's bytes to us */
    uint64_t seq; /* this op's number in the epoch, checked against every peer's */
    int64_t deadline_ns;
    struct tcp_scratch *scratch; /* the caller's, grown on demand */
    int64_t budget_until;        /* nonzero: on the engine thread; stop here (TCP_AGAIN) */
    /* ... where a wait, after its spin, may sleep until the budget ends if nap(nap_ctx, 1)
     * lets it (0: the engine has no other work), waking for the op's sockets or either
     * wake_fd (the engine has other work, the net thread wants coll_lock: TCP_AGAIN);
     * nap(nap_ctx, 0) after. NULL: no sleep on the engine, TCP_AGAIN at once */
    int (*nap)(void *ctx, int asleep);
    void *nap_ctx;
    int wake_fd[2];
    int short_spin;          /* tcp_tune_start's choice: spin at most TCP_SPIN_SHORT_NS per wait */
    struct spin_adapt *spin; /* by node index: spin this long for its bytes (NULL: none) */
    /* no other pod of the group may run on our CPUs (rdv_wire.h, RDV_MEMBER_CPU_SHARED):
     * with spin set, every wait spins TCP_SPIN_HOLD_NS before it sleeps, whatever the
     * learner says. A spin then holds only work outside the group off our CPU, as an
     * MPI rank's busy wait does; a learnt spin that halves on every wait that slept
     * falls to zero next to such work, and each sleep hands it the rest of a slice
     * (bench/RESULTS.md, "Why coll loses more of its lead under the load") */
    int spin_hold;
    struct spin_gate *gate;  /* whether a spin may yield (spin.h; NULL: pause only) */
    struct tcp_acks *acks;   /* the epoch's owed acks (tcp_settle); NULL: never deferred */
    struct tcp_stash *stash; /* by node index: read ahead of that node's bytes (NULL: none) */
};

/*
 * A broadcast root hears a bare header back from the pods it sends to (their word that
 * they run the same op). The first broadcast of a run waits for it, so that pods that
 * disagree all fail at once. In a run of the same broadcast (same root, dtype and
 * count as the op before it) the root completes when its bytes are sent, the others
 * send their header for every TCP_ACK_EVERY-th op only, and the root takes those later,
 * with up to TCP_ACK_WINDOW per pod outstanding: before anything else is read from that
 * pod, when the window is full, and whenever its sends block. A pod that disagrees
 * mid-run fails at once if it reads from the root, and the root fails on its next op
 * other than the run's, or within the window: late, never lost. A root that leaves right
 * after a run may leave the others' last ops of it undelivered (they fail with EPOCH):
 * docs/decisions/0009-broadcast-runs.md.
 */
#define TCP_ACK_EVERY 256
#define TCP_ACK_WINDOW 8
struct tcp_acks;
/* Acks for a group of nodes pods, none owed; NULL if out of memory. */
struct tcp_acks *tcp_acks_new(int nodes);
/* A new epoch: nothing owed, no previous op. */
void tcp_acks_reset(struct tcp_acks *a);
/* Before op t: take the owed acks that t must not run ahead of (all of them, or for a
 * repeated broadcast root down to TCP_ACK_WINDOW - 1 per pod), checking each; waits as
 * an op does (c's deadline and service, or on the engine its budget: TCP_AGAIN, and
 * what was read is kept for the next call). COLL_OK, TCP_AGAIN or an error. */
int tcp_settle(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen);

/* The ack state between ops, as it travels with a lease of the connections (direct ops,
 * docs/decisions/0011-direct-ops.md): export fails (-1) while acks are owed or partly read; import
 * starts from nothing owed with that state (any bytes are safe: a false state makes the
 * pods disagree on a later broadcast, which ends the epoch). */
#define TCP_ACKS_STATE 48
int tcp_acks_export(const struct tcp_acks *a, uint32_t *has_prev, uint32_t *run, void *prev,
                    size_t cap);
void tcp_acks_import(struct tcp_acks *a, uint32_t has_prev, uint32_t run, const void *prev);
int tcp_acks_owed(const struct tcp_acks *a);

/* A tiny op (allreduce, broadcast or reduce of at most TCP_TINY_BYTES; allgather whose
 * result, reduce_scatter whose input, or all-to-all whose input is at most that; barrier;
 * larger allreduces, allgathers and reduce_scatters below) as a resumable state. */
struct tcp_tiny;
#define TCP_TINY_BYTES (64 * 1024)
/* ... and between two pods, an allreduce, a broadcast or a reduce_scatter's input of up
 * to this, or an allgather whose blocks are (the direct way is then a ring's bytes in one
 * step, and a broadcast is one send either way); measured in bench/RESULTS.md */
#define TCP_PAIR_INLINE_BYTES ((size_t)2 << 20)
#define TCP_PAIR_ALLREDUCE_BYTES ((size_t)1 << 20) /* above: the ring (half the folding) */
/* ... and among more pods, a broadcast of up to this, as the chain (at every size: a
 * root that sent to every pod itself was slower, bench/RESULTS.md) */
#define TCP_CHAIN_INLINE_BYTES ((size_t)1 << 20)
/* ... and among 4, 8, ... pods, by doubling or halving: allgather results and
 * reduce_scatter inputs up to TCP_DOUBLING_BYTES, allreduces up to
 * TCP_DOUBLING_ALLREDUCE_BYTES per pod (doubling sends the whole vector log2(pods)
 * times, so a ring wins sooner); above them the relayed ring is faster (measured) */
#define TCP_DOUBLING_BYTES ((size_t)1 << 20)
#define TCP_DOUBLING_ALLREDUCE_BYTES ((size_t)256 << 10)
#define TCP_DIRECT_BYTES ((size_t)4 << 10) /* ... but up to this per pod, direct */
#define TCP_AGAIN 1000                     /* tcp_tiny_progress: the budget ran out; call again */
/* spin.h's budgets for a pod's bytes: where each starts, and its cap */
#define TCP_SPIN_START_NS 50000
#define TCP_SPIN_MAX_NS 200000
/* a held spin (tcp_comm.spin_hold): about a scheduler slice. A peer that is late because
 * a neighbour took its CPU is back within one; a wait that sleeps sooner hands our own
 * CPU to a neighbour, which then keeps it for the rest of its slice (two pods under
 * load, 2 MiB reduce_scatter: 0.85 of the quiet ratio holding 200 us, 0.96 holding
 * 3 ms; bench/RESULTS.md). An MPI rank spins without end. */
#define TCP_SPIN_HOLD_NS 3000000
/*
 * spin.h learns per pod how long a wait for its bytes may spin, from whether waits end
 * while spinning; it cannot see whom a spin keeps off the CPU. Where pods share CPUs (4
 * pods on 2), a pod spinning for a pod on the other CPU keeps the pod beside it from
 * sending, so waits end while spinning and still take long, and a short spin is faster;
 * one pod per CPU, the learnt spin is (bench/RESULTS.md). So each op class (kind and
 * size to a power of two, the TCP_TUNE_CLASSES used last) tries both, from its
 * TCP_TUNE_WARM-th op in an epoch on: TCP_TUNE_TURNS turns of TCP_TUNE_RUN ops each way,
 * aligned by the op's number in its class (every pod tries the same way at once), then
 * changes its way (the learnt at first) where the other's median turn is
 * TCP_TUNE_MARGIN_PCT lower, and tries again later: after TCP_TUNE_KEEP / 16 ops,
 * doubling up to TCP_TUNE_KEEP.
 */
#define TCP_SPIN_SHORT_NS 10000
#define TCP_TUNE_CLASSES 16
#define TCP_TUNE_RUN 4
#define TCP_TUNE_TURNS 6
#define TCP_TUNE_KEEP 4096
#define TCP_TUNE_WARM 16
#define TCP_TUNE_MARGIN_PCT 5
enum { TCP_TUNE_LEARNT = 0, TCP_TUNE_SHORT = 1 };
struct tcp_tune;
struct tcp_tune *tcp_tune_new(void);      /* NULL if out of memory */
void tcp_tune_reset(struct tcp_tune *tu); /* a new epoch: every class from its first op */
/* Op t starts at now (one op at a time): the way it waits (c->short_spin). tu may be
 * NULL (the learnt spin). */
int tcp_tune_start(struct tcp_tune *tu, const struct net_task *t, int64_t now);
/* The way of the op under way, or of the last one (a handed-over op keeps its way). */
int tcp_tune_way(const struct tcp_tune *tu);
/* ... and ended at now, ok or not (a failed op is not sampled). */
void tcp_tune_end(struct tcp_tune *tu, int ok, int64_t now);
/* Ops started each way since tcp_tune_new. */
void tcp_tune_counts(const struct tcp_tune *tu, uint64_t *learnt, uint64_t *shrt);

size_t tcp_tiny_size(void);
/* Whether t is a tiny op for c's pods (only c->nodes and c->nlocal are read). */
int tcp_tiny_fits(const struct tcp_comm *c, const struct net_task *t);
/* Set up t in s (s must stay at its address until the op ends); -1 if t is not tiny,
 * -2 if there was no memory for it. */
int tcp_tiny_start(struct tcp_tiny *s, struct tcp_comm *c, struct net_task *t);
/* Move the op on with c's budget and service; COLL_OK when finished, TCP_AGAIN, or an
 * error (why). */
int tcp_tiny_progress(struct tcp_tiny *s, struct tcp_comm *c, char *why, size_t whylen);

/* Run t to completion; returns a coll_err (why says more on failure). Blocks the net
 * thread until done, a peer fails, the deadline passes or the epoch is aborted. */
int tcp_run(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen);

/* The pods op t exchanges bytes with, from pod me of nodes (need[p] set to 1; the
 * rest untouched): what its connections must be up for before it runs. Ring
 * neighbours for large ops; for small ones the doubling partners (me XOR 2^k) where the
 * number of pods is a power of two, else every pod; the root and every pod for the
 * root of broadcast and reduce; every pod for all-to-all; the peer for send and recv.
 * Returns how many pods were marked. */
int tcp_op_peers(int nodes, int me, int nlocal, const struct net_task *t, uint8_t *need);
/* The pods a pod keeps connected from formation on (the rest connect on first use):
 * every pod in groups of up to TCP_EAGER_ALL pods; above, ring neighbours and, for a
 * power of two, the doubling partners: O(log pods), and the same relation both ways. */
#define TCP_EAGER_ALL 16
int tcp_eager_peer(int nodes, int me, int p);

/* Ops of at most this many bytes per pod use the direct exchange. */
#define TCP_SMALL_BYTES (64 * 1024)

#endif
