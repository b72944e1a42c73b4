/*
 * rdv_wire.h: the formats agents exchange: rendezvous frames on ZeroMQ (control
 * plane) and the headers of the TCP data plane. Fixed layouts, a frozen header with
 * magic and version, and strict decoders (fuzzed in test_rdv_wire) shared by both
 * ends: every frame from the network is checked before use, and a bad one is dropped
 * and logged without affecting anyone else.
 */
#ifndef AGENT_RDV_WIRE_H
#define AGENT_RDV_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define RDV_MAGIC 0x56445243u /* "CRDV" */
#define RDV_VERSION 13        /* 13: CHILD_ASK and CHILD_ID (ids of GPU children across pods) */
#define RDV_NAME_MAX 64
#define RDV_POD_MAX 254 /* a pod's name: a DNS subdomain (253) and its NUL */
#define RDV_ADDR_MAX 64
#define RDV_MAX_NODES 4096 /* pods in a group; members is bounded by config */
#define RDV_MSG_MAX 192
#define RDV_COMMID_BYTES 128 /* an NCCL unique id */
#define RDV_SECRET_BYTES 32  /* the epoch's data-plane secret */
#define RDV_FRAME_MAX 65536  /* ZMQ_MAXMSGSIZE: larger frames are refused by ZeroMQ unread */
#define RDV_CPUS_BYTES 128   /* a pod's CPU set in JOIN: CPUs 0-1023 */

enum rdv_type {
    RDV_JOIN = 1,  /* member -> coordinator */
    RDV_COMMIT,    /* coordinator -> member: epoch and member table */
    RDV_REJECT,    /* coordinator -> member: the JOIN cannot be accepted (why) */
    RDV_HEARTBEAT, /* both ways */
    RDV_ABORT,     /* both ways: this epoch is over (why) */
    RDV_LEAVE,     /* member -> coordinator: this pod is stopping (node_index) */
    RDV_CHILD_ASK, /* member -> coordinator: the id of a child's communicator (GPU groups) */
    RDV_CHILD_ID,  /* coordinator -> member: that id, or why there is none */
    RDV_TYPE_END
};

/*
 * An epoch is named by two numbers: inc, the coordinator's incarnation (random and not 0,
 * drawn when its agent starts), and epoch, the count of its commits (from 1). Only the
 * coordinator moves them: a member takes a COMMIT from an incarnation it has not
 * committed with, or a later epoch of the one it has, and nothing a member sends feeds
 * the count (a JOIN's last epoch once did, and one JOIN could wrap it: issue 40).
 */
struct rdv_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t len; /* whole frame */
    uint32_t epoch;
    uint64_t inc; /* JOIN: the incarnation of the member's last epoch (0: none) */
    char group[RDV_NAME_MAX];
};

/*
 * Where a pod runs, in JOIN, so that the coordinator can tell every pod whether another
 * pod of the group may want the same CPUs (struct rdv_member's flags): its host (a hash
 * of the kernel's boot id, the same in every container of one machine and different on
 * every other; 0: not known) and the CPUs its agent may run on (bit c of cpus[c / 8]:
 * CPU c; none set: not known). A pod that does not say is taken to share.
 */
struct rdv_place {
    uint64_t host;
    uint8_t cpus[RDV_CPUS_BYTES];
};

/* The group settings a JOIN's config_hash covers, sent as they are so that a coordinator
 * that refuses a member can say which ones differ (they are the deployment's ConfigMap,
 * no secret; the hash stays what admits). */
struct rdv_settings {
    uint32_t backend, local_slots, ndevices;
    uint32_t op_ms, join_ms, heartbeat_ms;
    uint32_t data_seal; /* security.data (seal.h: SEAL_*), the deployment's */
};

struct rdv_join {
    struct rdv_hdr h;
    uint64_t config_hash;
    struct rdv_settings settings;
    uint32_t nodes; /* world size in pods, as this member's config says */
    uint32_t node_index;
    uint32_t local_slots;
    uint32_t last_epoch; /* the last epoch this member committed (of h.inc), 0 if none */
    char pod[RDV_POD_MAX];
    char data_addr[RDV_ADDR_MAX]; /* "ip:port" of its data-plane listener */
    char uid[RDV_NAME_MAX];       /* the pod's UID, else a random id per agent process */
    struct rdv_place place;
};

/* A member's data-plane address in COMMIT: 8 bytes, so that a table of 4096 members is
 * 32 KiB (names stay with the coordinator, which logs them). */
struct rdv_member {
    uint32_t ip;    /* IPv4, network order */
    uint16_t port;  /* host order */
    uint16_t flags; /* RDV_MEMBER_* */
};
/* Another pod of the group may run on this one's CPUs (same host, CPU sets that meet),
 * or one of the two did not say where it runs: a wait for a peer's bytes that spins
 * may keep a pod it waits for off the CPU, and the waiter must learn when to stop
 * (libcoll/src/spin.h). Without it, its spin only takes CPU time from work outside the
 * group, as an MPI rank's busy wait does. */
#define RDV_MEMBER_CPU_SHARED 1u
#define RDV_MEMBER_FLAGS_KNOWN RDV_MEMBER_CPU_SHARED

struct rdv_commit {
    struct rdv_hdr h;
    uint32_t nodes;
    uint32_t has_commid;              /* groups on NCCL: commid is the epoch's communicator id */
    uint8_t commid[RDV_COMMID_BYTES]; /* made by the coordinator only */
    uint8_t secret[RDV_SECRET_BYTES]; /* fresh per epoch: every data connection proves it */
    struct rdv_member members[RDV_MAX_NODES]; /* only nodes entries travel */
};

struct rdv_reject {
    struct rdv_hdr h;
    char why[RDV_MSG_MAX];
};

struct rdv_heartbeat {
    struct rdv_hdr h;
    uint32_t node_index;
    uint32_t pad;
};

struct rdv_abort {
    struct rdv_hdr h;
    int32_t code;        /* coll_err the epoch's ops fail with */
    uint32_t node_index; /* who reports it */
    uint32_t silent;     /* a pod went silent: what it owes will not come, so no op waits */
    uint32_t pad;
    char why[RDV_MSG_MAX];
};

struct rdv_leave {
    struct rdv_hdr h;
    uint32_t node_index;
    uint32_t pad;
};

/*
 * A child across pods of a GPU group (group_child.c) runs on a communicator of its own
 * members, made from one id that every member pod must get. A pod that makes such a
 * child asks the coordinator for it, naming the child by its list of parent ranks (in
 * the order given to coll_group_create) and by nth: it is the nth child of that list the
 * pod made in the epoch (from 1). The coordinator gives every pod that asks for the same
 * (list, nth) in its current epoch the same id, made for it, and forgets it once every
 * pod that holds one of the ranks has asked (rendezvous_child.c).
 */
#define RDV_CHILD_MAX 96 /* ranks in a child: WIRE_CHILD_MAX */
struct rdv_child_ask {
    struct rdv_hdr h; /* the member's committed epoch */
    uint32_t node_index;
    uint32_t nth;
    uint32_t n;
    uint32_t pad;
    uint32_t ranks[RDV_CHILD_MAX]; /* parent ranks, distinct; those past n are 0 */
};

struct rdv_child_id {
    struct rdv_hdr h;
    uint64_t hash; /* rdv_child_hash of the ask's list */
    uint32_t nth;
    int32_t code; /* COLL_OK: commid is the child's; else a coll_err, and why */
    uint8_t commid[RDV_COMMID_BYTES];
    char why[RDV_MSG_MAX];
};

/* The hash that names a child's list (FNV-1a of the ranks, in order). */
uint64_t rdv_child_hash(const uint32_t *ranks, uint32_t n);

union rdv_msg {
    struct rdv_hdr h;
    struct rdv_child_ask child_ask;
    struct rdv_child_id child_id;
    struct rdv_leave leave;
    struct rdv_join join;
    struct rdv_commit commit;
    struct rdv_reject reject;
    struct rdv_heartbeat heartbeat;
    struct rdv_abort abort;
};

/* The coordinator's RDV_MEMBER_CPU_SHARED for n pods that are where place[i] says:
 * flags[i] gets the bit where pod i's place is not known or it meets another pod's on
 * the same host, and loses it otherwise. O(n log n + n * RDV_CPUS_BYTES * 8); 0, or -1
 * out of memory (then every pod is marked shared). */
int rdv_mark_shared(const struct rdv_place *place, int n, uint16_t *flags);

/* "ip:port" of m into out. */
void rdv_member_addr(const struct rdv_member *m, char *out, size_t cap);
/* m from "ip:port"; 0, or -1 if addr is not one. */
int rdv_member_set(struct rdv_member *m, const char *addr);

/* Fill the header (the length follows the type; COMMIT's from nodes). Only the fixed
 * part is cleared: COMMIT's member table is the caller's to fill. */
void rdv_init(union rdv_msg *m, enum rdv_type t, const char *group, uint32_t epoch);
/* Size on the wire of m as filled in. */
size_t rdv_size(const union rdv_msg *m);
/* Check n bytes from the network and copy them into *out; 0, or -1 with why. */
int rdv_decode(const void *buf, size_t n, union rdv_msg *out, char *why, size_t whylen);

/* ---- data plane ---------------------------------------------------------------- */

#define DATA_MAGIC 0x41544443u /* "CDTA" */

/*
 * Every data connection opens with a proof both ways of the epoch's secret (COMMIT's),
 * each side over a nonce the other drew for this connection:
 *   acceptor -> opener: data_challenge (its nonce)
 *   opener -> acceptor: data_hello (who it is, its own nonce, a mac over the challenge's)
 *   acceptor -> opener: data_welcome (OK with a mac over the hello's nonce; or NOT_YET:
 *                       the acceptor has not been told of that epoch, and the opener
 *                       connects again shortly)
 * Neither side reads a byte of an op from a connection before the other side's proof.
 */

/* First bytes on every data connection, from the accepting side: a fresh nonce. */
struct data_challenge {
    uint32_t magic;
    uint16_t version;
    uint16_t pad;
    uint8_t nonce[32];
};

/* The connecting side's answer: who it is, a fresh nonce of its own, and mac =
 * HMAC-SHA256(epoch secret, challenge nonce || the bytes of this struct before mac).
 * Accepted only with the right mac, for a member's index, from the address the member
 * table lists. */
struct data_hello {
    uint32_t magic;
    uint16_t version;
    uint16_t channel;    /* DATA_CH_* */
    uint64_t group_hash; /* FNV of the group name */
    uint64_t inc;        /* the epoch (rdv_hdr) */
    uint32_t epoch;
    uint32_t from_index;
    uint16_t seal;    /* security.data (SEAL_*): both sides must agree */
    uint16_t ciphers; /* with a seal, the ciphers the opener runs (SEAL_CHACHA, ...) */
    uint32_t pad;
    uint8_t nonce[32];
    uint8_t mac[32];
};
#define DATA_HELLO_SIGNED offsetof(struct data_hello, mac)

enum { DATA_WELCOME_OK = 1, DATA_WELCOME_NOT_YET = 2 };

/* The accepting side's answer to a hello: OK, with mac = HMAC-SHA256(epoch secret, the
 * hello's nonce || the bytes of this struct before mac), and the connection carries the
 * epoch's ops from the next byte; or NOT_YET (mac zero), and it is closed. */
struct data_welcome {
    uint32_t magic;
    uint16_t version;
    uint16_t status;   /* DATA_WELCOME_* */
    uint16_t channel;  /* the hello's */
    uint16_t cipher;   /* with a seal, the cipher the connection's records use (seal_pick) */
    uint32_t to_index; /* the acceptor's node index */
    uint64_t group_hash;
    uint64_t inc;
    uint32_t epoch;
    uint32_t pad2;
    uint8_t mac[32];
};
#define DATA_WELCOME_SIGNED offsetof(struct data_welcome, mac)

/* Sent ahead of each op's first bytes to a peer, so that peers that disagree on the
 * op fail with MISMATCH instead of misreading each other's bytes. */
struct data_op_hdr {
    uint32_t magic;
    uint8_t kind, dtype, redop, flags; /* flags: P2P_F_* (a send's frames), else 0 */
    int32_t root;
    uint32_t src_rank, dst_rank; /* send/recv */
    uint64_t seq;
    uint64_t count;
};

/* A send/recv frame's phase, in data_op_hdr.redop (p2p.c). A send's payload follows its
 * header (EAGER), or, when large, the header alone asks to send (RTS) and the payload
 * follows the receiver's clear to send (CTS) in a frame of its own (DATA), so that a
 * payload never waits in the stream for a receive not yet posted. A RECV frame is the
 * receiver's last word (ACK: root is the receive's status) or its CTS. A send's frames
 * carry in root the signature of the collective it is part of (wire_sqe_sig: 0, or
 * WIRE_SIG_ON | a WIRE_SIG), which the receive's must equal. */
enum { P2P_EAGER = 0, P2P_RTS = 1, P2P_DATA = 2 };
enum { P2P_ACK = 0, P2P_CTS = 1 };
/* A send's frames (EAGER, RTS, DATA) may say: no ACK for me (its payload taken, the
 * receiver says nothing back; an RTS it disagrees with is still answered, since that
 * sender waits for a CTS). */
#define P2P_F_NOACK 1u

/* Three connections per pair of pods and epoch, all opened by the pod of the higher
 * index. Collectives run in lockstep on two, one per direction (COLL: the opener's bytes
 * to the other pod; COLL_BACK: the other pod's bytes to the opener), so that a pod's
 * sends never share a socket, and its lock, with the bytes it receives (as NCCL's
 * socket transport keeps a connection per direction). Sends and receives, which pods
 * do not run in the same order, are framed messages both ways on P2P. */
enum { DATA_CH_COLL = 0, DATA_CH_P2P = 1, DATA_CH_COLL_BACK = 2, DATA_CH_COUNT = 3 };

int data_hello_check(const struct data_hello *h, char *why, size_t whylen);
int data_challenge_check(const struct data_challenge *c, char *why, size_t whylen);
/* Whether w answers hello h, sent to node to_index: magic, version, a known status, the
 * hello's group, epoch and channel (the mac is the caller's to check). 0, or -1 with why. */
int data_welcome_check(const struct data_welcome *w, const struct data_hello *h, uint32_t to_index,
                       char *why, size_t whylen);
/* The header of a send/recv message that node peer sent to node me (nlocal ranks per
 * node), or of an ack or CTS of one of our sends (kind RECV: root = the receive's status,
 * count its count, no payload): magic, kind, phase, dtype, both ranks on those nodes, a
 * size below 1 TiB. Sets *bytes to the payload's size (0 for an RTS). 0, or -1 with why. */
int data_send_hdr_check(const struct data_op_hdr *h, uint32_t nlocal, uint32_t peer, uint32_t me,
                        uint64_t *bytes, char *why, size_t whylen);

struct sockaddr_in;
/* A data-plane address: a numeric IPv4 address and a port, "10.1.2.3:7000" (names are
 * resolved once, at start, never on the net thread). 0, or -1 if s is not one. */
int rdv_addr_parse(const char *s, struct sockaddr_in *out);

uint64_t rdv_fnv1a(const void *p, size_t n, uint64_t h);
#define RDV_FNV_INIT 0xcbf29ce484222325ull

#endif
