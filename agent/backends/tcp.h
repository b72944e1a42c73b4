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

struct net;
struct ngroup;
struct net_task;

struct tcp_comm {
    struct net *net;
    struct ngroup *g;
    int nodes, me, nlocal;
    int *fds;     /* by node index, our bytes to that node; fds[me] unused */
    int *rfds;    /* by node index, that node's bytes to us */
    uint64_t seq; /* this op's number in the epoch, checked against every peer's */
    int64_t deadline_ns;
    void *scratch[2]; /* grown on demand, kept by the caller between ops */
    size_t scratch_cap[2];
    int64_t budget_until; /* nonzero: on the engine thread; never sleep, stop here */
};

/* A tiny op (allreduce, broadcast or reduce of at most TCP_TINY_BYTES; allgather whose
 * result, reduce_scatter whose input, or all-to-all whose input is at most that; barrier;
 * larger allreduces, allgathers and reduce_scatters below) as a resumable state. */
struct tcp_tiny;
#define TCP_TINY_BYTES (64 * 1024)
/* ... and between two pods, an allreduce or a reduce_scatter's input of up to this, or
 * an allgather whose blocks are (the direct way is then a ring's bytes in one step);
 * measured in bench/RESULTS.md */
#define TCP_PAIR_INLINE_BYTES ((size_t)2 << 20)
/* ... and among 4, 8, ... pods, by doubling or halving: allgather results and
 * reduce_scatter inputs up to TCP_DOUBLING_BYTES, allreduces up to
 * TCP_DOUBLING_ALLREDUCE_BYTES per pod (doubling sends the whole vector log2(pods)
 * times, so a ring wins sooner); above them the relayed ring is faster (measured) */
#define TCP_DOUBLING_BYTES ((size_t)1 << 20)
#define TCP_DOUBLING_ALLREDUCE_BYTES ((size_t)256 << 10)
#define TCP_AGAIN 1000 /* tcp_tiny_progress: the budget ran out; call again */
size_t tcp_tiny_size(void);
/* Set up t in s (s must stay at its address until the op ends); -1 if t is not tiny,
 * -2 if there was no memory for it. Scratch it grows is c's from then on. */
int tcp_tiny_start(struct tcp_tiny *s, struct tcp_comm *c, struct net_task *t);
/* Move the op on with c's budget and scratch; COLL_OK when finished, TCP_AGAIN, or an
 * error (why). */
int tcp_tiny_progress(struct tcp_tiny *s, struct tcp_comm *c, char *why, size_t whylen);

/* Run t to completion; returns a coll_err (why says more on failure). Blocks the net
 * thread until done, a peer fails, the deadline passes or the epoch is aborted. */
int tcp_run(struct tcp_comm *c, struct net_task *t, char *why, size_t whylen);

/* Provided by net.c: keeps the rendezvous serviced during long transfers; returns
 * nonzero (a coll_err, with why) when the op must stop. */
int net_service(struct net *n, struct ngroup *g, char *why, size_t whylen);

/* Ops of at most this many bytes per pod use the direct exchange. */
#define TCP_SMALL_BYTES (64 * 1024)

#endif
