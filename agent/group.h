/*
 * group.h: a group as this agent sees it: its local slots and who holds them, the
 * epoch, and the matching of the n-th op of every slot into one collective (and of
 * sends with receives). A matched op runs on the group's backend; disagreement,
 * a participant that leaves, and ops that outlive the group's op timeout end in an
 * error for every participant, never a hang.
 */
#ifndef AGENT_GROUP_H
#define AGENT_GROUP_H

#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "gpu.h"
#include "net.h"
#include "wire.h"

struct session;
struct buffer;
struct net;
struct net_task;

/* A submitted op, as the agent holds it until completion. */
struct op {
    struct session *s;
    struct wire_sqe sqe;    /* snapshot taken from the ring */
    struct buffer *sb, *rb; /* references held while in flight */
    struct buffer *sync;    /* GPU ops: the session region (stream-order words) */
    void *send, *recv;      /* resolved addresses (NULL if unused) */
    int rank;
    int timeout_ms; /* its handle's op timeout */
    int64_t deadline_ns;
    uint64_t premul; /* sqe.redop WIRE_REDOP_PREMUL: this rank's scalar (the dtype's bits) */
    struct op *next; /* p2p queue */
    /* sends and receives: the order they came in (which receive a send meets first); a
     * receive: the rank whose send it took (the session says it to a receive from any rank) */
    uint64_t p2p_no;
    int source;
    /* a receive from any rank in a group across pods: its twin, lent to the net thread
     * at once, which other pods' sends may take; whichever side claims it first
     * (net_any_claim) completes it */
    struct net_task *any_task;
};

/* Completion sink: called once for every op the group finishes or fails; it must
 * drop the op's buffer references. why: what failed and where (NULL or "": nothing
 * to add to the status). */
typedef void (*group_complete_fn)(struct op *op, int status, const char *why);

/* What a group calls above it (the sessions), given at group_init: the group never
 * calls session code by name. complete: the sink above. lease_void: the lease
 * lease_id that s holds on the group's connections ends with err (the group's epoch
 * ended, or s left). */
struct group_up {
    group_complete_fn complete;
    void (*lease_void)(struct session *s, uint64_t lease_id, int err, const char *why);
};

struct group_slot {
    struct session *s; /* NULL: free */
    uint32_t epoch;    /* epoch the holder opened */
    uint64_t next_seq; /* collectives submitted in this epoch */
};

struct round {
    uint64_t seq;
    int arrived;
    int status;
    char why[WIRE_WHY_MAX]; /* with status: the disagreement */
    int64_t deadline_ns;    /* the first arrival's, and its op timeout */
    int timeout_ms;
    struct op *ops;   /* [nslots] */
    uint8_t *present; /* [nslots] */
};

/* What /metrics says of a group (engine thread; metrics.c renders it). Status index:
 * 0 ok, else the coll_err. Durations from the op's submission to its completion. */
#define GROUP_STATUS_MAX WIRE_STATUS_COUNT
#define GROUP_HIST_BUCKETS WIRE_HIST_BUCKETS
extern const double group_hist_bounds[GROUP_HIST_BUCKETS]; /* seconds */
struct group_metrics {
    uint64_t ops[WIRE_OP_KIND_COUNT][GROUP_STATUS_MAX];
    uint64_t bytes[WIRE_OP_KIND_COUNT];
    uint64_t hist[GROUP_HIST_BUCKETS + 1]; /* the last: above every bound */
    uint64_t count;
    double sum_s;
};

struct group {
    const struct group_config *cfg;
    struct group_metrics m;
    int nslots, size, node_index, nodes;
    uint32_t epoch;
    int attached;
    struct group_slot *slots;
    uint64_t lo_seq; /* lowest round not yet finished */
    struct round rounds[WIRE_RING_ENTRIES];
    struct op *p2p_head, *p2p_tail, *p2p_free; /* sends and receives paired here */
    struct op *any_head, *any_tail; /* receives from any rank waiting here (and in the net) */
    uint64_t p2p_count;             /* sends and receives submitted (op.p2p_no) */
    struct op *p2p_pool;
    const struct group_up *up;
    uint64_t ops_done, ops_failed;
    /* the backend (backend.h) and its state; what it calls back */
    const struct backend_ops *be;
    void *be_ctx;
    char backend_why[192];
    void (*op_done)(struct group *g, struct op *op, int status, const char *why);
    void (*fail)(struct group *g, int err, const char *why); /* end the epoch */
    /* the backend is no longer busy (backend_ops.busy): a child that waited may go, and
     * g with it (group_child_release): touch it no more */
    void (*idle)(struct group *g);
    /* groups that span several pods: the net thread holds the cluster-wide epoch */
    struct net *net;
    int index;            /* in the config, as the net thread and the launchers know it; a child's
                             is GROUP_CHILD_INDEX_BASE or more, never reused */
    struct net_task mark; /* the epoch mark; at most one in flight */
    int mark_busy, mark_pending_abort, mark_pending, mark_code;
    struct gpu *gpu; /* groups on the NCCL backend: the launchers */
    /* the group as its pods see it (engine thread; from the net thread's events): the
     * rendezvous epoch last formed, and whether it still stands. One pod: always formed,
     * the local epoch. */
    uint32_t net_epoch;
    int net_formed;
    /* direct ops: the session whose client holds the group's connections (net_lend),
     * and the lease's id; NULL when nobody does */
    struct session *lent_to;
    uint64_t lease_id;               /* ... and the lease's id */
    uint32_t lent_handle;            /* ... and its handle there (the region's lease_q) */
    uint64_t leases, direct_ops;     /* lent, and the ops its clients ran on them */
    uint64_t stash_lent, stash_back; /* bytes read ahead that went with leases, each way */
    /* the client whose direct ops' counts (its region's direct[handle]) go into m, and
     * what of them m has already (group_direct_fold) */
    struct session *dc_s;
    uint32_t dc_handle;
    const struct wire_direct_counts *dc_counts; /* in dc_s's region, mapped while dc_s is set */
    /* children made at run time (group_child.c): this group's, and, for a child, its
     * parent, its ranks there (by child rank = slot), which slots were ever taken (the
     * k-th coll_group_create of a list by each member meets the others' k-th) and
     * whether its parent's epoch it lived in has ended */
    struct group *parent, *children, *next_child;
    int nchildren;
    int *parent_ranks;
    uint8_t *taken;
    /* a child across pods (group_child.c): the child rank of each of its slots here (NULL:
     * every group else, whose slot k is rank node_index * nslots + k); a root group: how
     * many children of each list it made in its epoch (seqs_epoch) */
    int *slot_rank;
    struct group_child_seq *seqs;
    int nseqs;
    uint32_t seqs_epoch;
    uint32_t parent_epoch;
    int orphan;
    struct {
        uint64_t ops[WIRE_OP_KIND_COUNT][GROUP_STATUS_MAX];
        uint64_t bytes[WIRE_OP_KIND_COUNT];
        uint64_t hist[GROUP_HIST_BUCKETS + 1];
        uint64_t sum_ns;
    } dc_seen;
};

struct group_child_seq {
    uint64_t hash; /* rdv_child_hash of the list */
    uint32_t n, nth;
};
#define GROUP_CHILD_LISTS_MAX 1024 /* lists of children across pods per root and epoch */

/* The group rank of slot k, and the slot of a group rank (-1: another pod's). */
static inline int group_slot_rank(const struct group *g, int k)
{
    return g->slot_rank ? g->slot_rank[k] : g->node_index * g->nslots + k;
}
static inline int group_rank_slot(const struct group *g, int rank)
{
    if (g->slot_rank) {
        for (int k = 0; k < g->nslots; k++)
            if (g->slot_rank[k] == rank) return k;
        return -1;
    }
    int k = rank - g->node_index * g->nslots;
    return k >= 0 && k < g->nslots ? k : -1;
}

/* Set up g for cfg; probes and picks the backend. Returns 0, or -1 (why in
 * g->backend_why) when the configured backend cannot run here; the group then
 * exists but refuses to be opened. */
int group_init(struct group *g, const struct group_config *cfg, int node_index,
               const struct group_up *up);
void group_fini(struct group *g);

/* Whether the group stands across its pods, its epoch (the rendezvous epoch; one pod:
 * the local one) and what formation waits for. */
void group_state(const struct group *g, int *formed, uint32_t *epoch, char *detail, size_t cap);

/* The group of that name among n, or NULL. */
struct group *group_find(struct group *groups, int n, const char *name);
/* The group whose index (as the launchers know it) is index: one of groups[n] or a
 * child of theirs at any depth; NULL when it went. */
struct group *group_by_index(struct group *groups, int n, int index);

/* Give slot (or the lowest free one for -1) to s. Returns the slot or a negative
 * coll_err. */
int group_attach(struct group *g, struct session *s, int slot);
/* s gives its slot back. If it was a member of the current epoch the group breaks:
 * every pending op fails with COLL_ERR_PEER_LOST and the epoch moves on. */
void group_detach(struct group *g, int slot);

/* Queue op (rank and buffers resolved) from slot; it completes through the
 * complete callback, possibly before this returns. */
void group_submit(struct group *g, int slot, struct op *op);

/* Fail every pending op with err and move to the next epoch; a group that spans
 * several pods also ends the epoch cluster-wide. */
void group_break(struct group *g, int err, const char *why);
/* The net thread ended the epoch (a pod left, a mismatch elsewhere, ...). */
void group_net_broken(struct group *g, int err, const char *why);
/* The epoch mark came back from the net thread. */
void group_net_mark_done(struct group *g);
/* Hand the net thread to the group (set before the first op). */
void group_set_net(struct group *g, struct net *n, int index);
/* s is going away: ops it has lent to the net thread must not complete to it. */
void group_forget_session(struct group *g, const struct session *s);
/* Hand the GPU launchers to a group on the NCCL backend (before the first op). */
void group_set_gpu(struct group *g, struct gpu *gpu, int index);
/* Whether no collective of the group is under way here (direct ops: before a lease). */
int group_idle(const struct group *g);
/* The lease ends on this side (the epoch ends with err, why): its client drops it
 * before its next direct op, and reports err for the op the end cut short. */
void group_void_lease(struct group *g, int err, const char *why);
/* Direct ops: count handle's ops (counts: its words in s's region) as the group's own
 * from now on (a lease went out to it); and add to the group's metrics what they grew by since the
 * last look (each /metrics publish, and before that client goes). Engine thread. */
void group_direct_follow(struct group *g, struct session *s, uint32_t handle,
                         const struct wire_direct_counts *counts);
void group_direct_fold(struct group *g);

/* Fail what is past its deadline, children included; returns the next deadline
 * (INT64_MAX: none). */
int64_t group_check_timeouts(struct group *g, int64_t now_ns);
/* A slice of each large local op of g and of its children (backend turn); whether any
 * moved. */
int group_turn(struct group *g, int64_t until_ns);

/* Children (coll_group_create), group_child.c. A child holds n ranks of its parent,
 * all on this pod (for now), its rank i being ranks[i]; it lives in the parent's epoch.
 * At most GROUP_CHILDREN_MAX live under one group. */
#define GROUP_CHILDREN_MAX 64
#define GROUP_CHILD_INDEX_BASE CONFIG_MAX_GROUPS
/* s, holding rank my_rank of parent (in its current epoch), joins the child of ranks[n]:
 * the one it has not joined yet among those made in this epoch with the same list, or
 * a new one. Returns the child (and *slot), or NULL with a coll_err in *err and why. */
struct group *group_child_join(struct group *parent, const uint32_t *ranks, int n, int my_rank,
                               struct session *s, int *slot, int *err, char *why, size_t whylen);
/* A child's lifetime is group.c's: it ends with its parent's epoch (orphaned: its ops
 * fail with EPOCH), goes once no member and no child of its own holds it, and goes
 * with its parent; group_child.c only makes children and joins sessions to them. */
void group_child_release(struct group *child);
/* The root's coordinator answered a child's ask (NET_TASK_CHILD, t): its backend gets the
 * id (or the failure); t is freed. Engine thread. */
struct net_task;
void group_child_answer(struct group *groups, int ngroups, struct net_task *t);

/* Sends and receives paired in the pod, and receives from any rank (group_p2p.c, below
 * group.c). submit: op (a send or receive) paired or kept, or handed to the backend.
 * fail: everything kept fails with err (the epoch ends); returns how many. twin_done:
 * op, a receive from any rank that the net thread completed (its twin's copy), takes its
 * entry here along. deadline: the earliest deadline of what is kept (INT64_MAX: none);
 * late: what missed it, in words. describe: an op in words, for the logs. */
void group_p2p_submit(struct group *g, struct op *op);
int group_p2p_fail(struct group *g, int err, const char *why);
void group_p2p_twin_done(struct group *g, const struct op *op);
int64_t group_p2p_deadline(const struct group *g);
void group_p2p_late(const struct group *g, char *why, size_t n);
void group_describe(const struct wire_sqe *s, char *buf, size_t n);

#endif
