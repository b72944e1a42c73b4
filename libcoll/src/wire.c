/*
 * wire.c: encoders and strict decoders of the local plane (see wire.h).
 */
#include "wire.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll/coll.h"

_Static_assert(sizeof(struct wire_hdr) == 16, "header is frozen across versions");
_Static_assert(sizeof(struct wire_sqe) == 64, "sqe is one cache line");
_Static_assert(sizeof(struct wire_cqe) == 16, "cqe size");
_Static_assert(sizeof(union wire_msg) <= WIRE_MAX_MSG, "messages fit WIRE_MAX_MSG");
_Static_assert((WIRE_RING_ENTRIES & (WIRE_RING_ENTRIES - 1)) == 0, "ring size is a power of 2");
_Static_assert(WIRE_STATUS_COUNT == COLL_ERR_INTERNAL + 1, "a direct op's status is counted");
_Static_assert(WIRE_REDOP_PREMUL == COLL_PREMUL_SUM_FIRST, "premultiplied sums: one numbering");
_Static_assert(WIRE_REDOP_PREMUL + WIRE_PREMUL_SLOTS <= 256, "a slot's redop fits a byte");

static const size_t type_size[WIRE_TYPE_END] = {
    [WIRE_HELLO] = sizeof(struct wire_hello),
    [WIRE_HELLO_OK] = sizeof(struct wire_hello_ok),
    [WIRE_ERROR] = sizeof(struct wire_error),
    [WIRE_GROUP_OPEN] = sizeof(struct wire_group_open),
    [WIRE_GROUP_OPEN_OK] = sizeof(struct wire_group_open_ok),
    [WIRE_GROUP_CLOSE] = sizeof(struct wire_group_close),
    [WIRE_GROUP_CLOSE_OK] = sizeof(struct wire_hdr),
    [WIRE_MEM_REG] = sizeof(struct wire_mem_reg),
    [WIRE_MEM_REG_OK] = sizeof(struct wire_mem_reg_ok),
    [WIRE_MEM_RELEASE] = sizeof(struct wire_mem_release),
    [WIRE_MEM_RELEASE_OK] = sizeof(struct wire_hdr),
    [WIRE_GROUP_STATE] = sizeof(struct wire_group_state),
    [WIRE_GROUP_STATE_OK] = sizeof(struct wire_group_state_ok),
    [WIRE_LEASE] = sizeof(struct wire_lease),
    [WIRE_LEASE_OK] = sizeof(struct wire_lease_ok),
    [WIRE_LEASE_BACK] = sizeof(struct wire_lease_back),
    [WIRE_LEASE_BACK_OK] = sizeof(struct wire_lease_back_ok),
    [WIRE_GROUP_CREATE] = sizeof(struct wire_group_create),
    [WIRE_REDOP_SET] = sizeof(struct wire_redop_set),
    [WIRE_REDOP_SET_OK] = sizeof(struct wire_hdr),
};

size_t wire_size(unsigned t)
{
    return t < WIRE_TYPE_END ? type_size[t] : 0;
}

void wire_init(union wire_msg *m, enum wire_type type, uint32_t req_id)
{
    memset(m, 0, sizeof(*m));
    m->h.magic = WIRE_MAGIC;
    m->h.version = WIRE_VERSION;
    m->h.type = (uint16_t)type;
    m->h.len = (uint32_t)wire_size(type);
    m->h.req_id = req_id;
}

static int terminated(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

/* A lease's counts of bytes read ahead: at most WIRE_STASH_BYTES each, none beyond nodes
 * pods or at node me (no connection to itself). */
static int stash_ok(const uint16_t *len, unsigned nodes, unsigned me, char *err, size_t errlen)
{
    for (unsigned p = 0; p < WIRE_STASH_NODES; p++)
        if (len[p] > WIRE_STASH_BYTES || (len[p] && (p >= nodes || p == me))) {
            snprintf(err, errlen,
                     "lease with %u bytes read ahead of node %u (at most %u, of %u pods)", len[p],
                     p, WIRE_STASH_BYTES, nodes);
            return 0;
        }
    return 1;
}

int wire_decode(const void *buf, size_t n, union wire_msg *out, unsigned *version_out, char *err,
                size_t errlen)
{
    struct wire_hdr h;
    if (version_out) *version_out = 0;
    if (n < sizeof(h)) {
        snprintf(err, errlen, "message of %zu bytes is shorter than the %zu-byte header", n,
                 sizeof(h));
        return -1;
    }
    memcpy(&h, buf, sizeof(h));
    if (h.magic != WIRE_MAGIC) {
        snprintf(err, errlen, "bad magic 0x%08x (expected 0x%08x)", h.magic, WIRE_MAGIC);
        return -1;
    }
    if (version_out) *version_out = h.version;
    if (h.version != WIRE_VERSION) {
        snprintf(err, errlen, "protocol version %u is not supported (this side speaks %u)",
                 h.version, WIRE_VERSION);
        return -1;
    }
    size_t want = wire_size(h.type);
    if (want == 0) {
        snprintf(err, errlen, "unknown message type %u", h.type);
        return -1;
    }
    if (h.len != n || n != want) {
        snprintf(err, errlen, "message type %u: length field %u, received %zu, expected %zu",
                 h.type, h.len, n, want);
        return -1;
    }
    memset(out, 0, sizeof(*out));
    memcpy(out, buf, n);
    switch (h.type) {
    case WIRE_HELLO:
        if (!terminated(out->hello.client, sizeof(out->hello.client))) goto unterminated;
        break;
    case WIRE_HELLO_OK:
        if (!terminated(out->hello_ok.agent_version, sizeof(out->hello_ok.agent_version)))
            goto unterminated;
        break;
    case WIRE_ERROR:
        if (!terminated(out->error.msg, sizeof(out->error.msg))) goto unterminated;
        break;
    case WIRE_MEM_REG:
        if (out->mem_reg.kind >= WIRE_MEM_KIND_COUNT) {
            snprintf(err, errlen, "buffer kind %u out of range", out->mem_reg.kind);
            return -1;
        }
        break;
    case WIRE_GROUP_OPEN:
        if (!terminated(out->group_open.name, sizeof(out->group_open.name))) goto unterminated;
        break;
    case WIRE_GROUP_CREATE:
        if (out->group_create.n == 0 || out->group_create.n > WIRE_CHILD_MAX) {
            snprintf(err, errlen, "a child of %u ranks (1..%d)", out->group_create.n,
                     WIRE_CHILD_MAX);
            return -1;
        }
        break;
    case WIRE_GROUP_OPEN_OK:
        if (!terminated(out->group_open_ok.backend, sizeof(out->group_open_ok.backend)))
            goto unterminated;
        break;
    case WIRE_GROUP_STATE_OK:
        if (!terminated(out->group_state_ok.detail, sizeof(out->group_state_ok.detail)))
            goto unterminated;
        break;
    case WIRE_LEASE_BACK:
        if (!terminated(out->lease_back.why, sizeof(out->lease_back.why))) goto unterminated;
        if (!stash_ok(out->lease_back.stash_len, WIRE_STASH_NODES, WIRE_STASH_NODES, err, errlen))
            return -1;
        break;
    case WIRE_LEASE_BACK_OK:
        if (!terminated(out->lease_back_ok.why, sizeof(out->lease_back_ok.why))) goto unterminated;
        if (out->lease_back_ok.code < 0 || out->lease_back_ok.code > COLL_ERR_INTERNAL) {
            snprintf(err, errlen, "lease given back with the epoch's end code %d",
                     out->lease_back_ok.code);
            return -1;
        }
        break;
    case WIRE_LEASE_OK:
        if (out->lease_ok.nodes < 2 || out->lease_ok.nodes > WIRE_LEASE_MAX_FDS / 2 + 1 ||
            out->lease_ok.nfds != 2 * (out->lease_ok.nodes - 1) ||
            out->lease_ok.me >= out->lease_ok.nodes) {
            snprintf(err, errlen, "lease of %u pods (this one %u) with %u connections",
                     out->lease_ok.nodes, out->lease_ok.me, out->lease_ok.nfds);
            return -1;
        }
        if (out->lease_ok.flags & ~WIRE_LEASE_F_OWN_CPUS) {
            snprintf(err, errlen, "lease with unknown flags 0x%x", out->lease_ok.flags);
            return -1;
        }
        if (!stash_ok(out->lease_ok.stash_len, out->lease_ok.nodes, out->lease_ok.me, err, errlen))
            return -1;
        break;
    default:
        break;
    }
    return 0;
unterminated:
    snprintf(err, errlen, "message type %u: string field is not NUL-terminated", h.type);
    return -1;
}

static const char *const kind_names[WIRE_OP_KIND_COUNT] = {
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
    "alltoall",  "send",      "recv",   "barrier",
};

const char *wire_kind_name(unsigned kind)
{
    return kind < WIRE_OP_KIND_COUNT ? kind_names[kind] : "?";
}

int wire_redop_fits(unsigned kind, unsigned dtype, unsigned redop)
{
    if (!wire_kind_reduces(kind)) return 1;
    int bitwise = redop == COLL_BAND || redop == COLL_BOR || redop == COLL_BXOR;
    int complex = dtype == COLL_COMPLEX64 || dtype == COLL_COMPLEX128;
    int floating = complex || dtype == COLL_FLOAT16 || dtype == COLL_BFLOAT16 ||
                   dtype == COLL_FLOAT32 || dtype == COLL_FLOAT64 || dtype == COLL_FLOAT8_E4M3 ||
                   dtype == COLL_FLOAT8_E5M2;
    if (bitwise && floating) return 0;
    if (complex && (redop == COLL_MIN || redop == COLL_MAX)) return 0;
    if (dtype == COLL_BOOL && redop == COLL_AVG) return 0;
    if (redop >= WIRE_REDOP_PREMUL && (complex || dtype == COLL_BOOL)) return 0;
    return 1;
}

const char *wire_redop_rule(void)
{
    return "bitwise ones take integers or bool, complex numbers no min or max, bool has "
           "no average, and a premultiplied sum takes neither bool nor complex numbers";
}

const char *wire_nccl_refuses(unsigned kind, unsigned dtype, unsigned redop, uint32_t p2p_tag)
{
    if (dtype == COLL_INT16 || dtype == COLL_UINT16) return "NCCL has no 16-bit integers";
    if (wire_kind_reduces(kind) && redop >= COLL_BAND && redop <= COLL_BXOR)
        return "NCCL has no bitwise reductions";
    if (wire_kind_reduces(kind) && redop == COLL_PROD &&
        (dtype == COLL_COMPLEX64 || dtype == COLL_COMPLEX128))
        return "NCCL has no complex product";
    if (p2p_tag != 0) return "NCCL pairs sends and receives in order, with no tags";
    return NULL;
}

int wire_sqe_check(const struct wire_sqe *s, char *err, size_t errlen)
{
    if (s->kind >= WIRE_OP_KIND_COUNT) {
        snprintf(err, errlen, "op kind %u out of range", s->kind);
        return -1;
    }
    if (s->dtype >= COLL_DTYPE_COUNT) {
        snprintf(err, errlen, "dtype %u out of range", s->dtype);
        return -1;
    }
    int p2p = s->kind == WIRE_OP_SEND || s->kind == WIRE_OP_RECV;
    if ((s->flags & WIRE_SQE_F_SIG) && (!p2p || (s->flags & WIRE_SQE_F_GPU))) {
        snprintf(err, errlen, "flag SIG on a %s%s", s->flags & WIRE_SQE_F_GPU ? "GPU " : "",
                 wire_kind_name(s->kind));
        return -1;
    }
    if ((s->flags & WIRE_SQE_F_SIG) && !wire_sig_ok(s->redop)) {
        snprintf(err, errlen, "signature 0x%02x names no op", s->redop);
        return -1;
    }
    if (!(s->flags & WIRE_SQE_F_SIG) && s->redop >= COLL_REDOP_COUNT &&
        !(s->redop >= WIRE_REDOP_PREMUL && wire_kind_reduces(s->kind))) {
        snprintf(err, errlen, "reduction %u out of range", s->redop);
        return -1;
    }
    if (!(s->flags & WIRE_SQE_F_SIG) && !wire_redop_fits(s->kind, s->dtype, s->redop)) {
        snprintf(err, errlen, "reduction %s of %s", coll_redop_name((coll_redop)s->redop),
                 coll_dtype_name((coll_dtype)s->dtype));
        return -1;
    }
    if ((s->flags & ~WIRE_SQE_F_ALL) != 0) {
        snprintf(err, errlen, "unknown flags 0x%x", s->flags);
        return -1;
    }
    if ((s->flags & WIRE_SQE_F_MORE) && (!p2p || !(s->flags & WIRE_SQE_F_GPU))) {
        snprintf(err, errlen, "flag MORE on a %s%s", s->flags & WIRE_SQE_F_GPU ? "" : "host ",
                 wire_kind_name(s->kind));
        return -1;
    }
    if ((s->flags & WIRE_SQE_F_NOACK) && (s->kind != WIRE_OP_SEND || (s->flags & WIRE_SQE_F_GPU))) {
        snprintf(err, errlen, "flag NOACK on a %s%s", s->flags & WIRE_SQE_F_GPU ? "GPU " : "",
                 wire_kind_name(s->kind));
        return -1;
    }
    if ((!p2p && s->p2p_tag != 0) || s->p2p_tag > WIRE_TAG_MAX) {
        snprintf(err, errlen, "tag %u on a %s", s->p2p_tag, wire_kind_name(s->kind));
        return -1;
    }
    if (s->kind == WIRE_OP_BARRIER && s->count != 0) {
        snprintf(err, errlen, "barrier with count %llu", (unsigned long long)s->count);
        return -1;
    }
    return 0;
}

int wire_sig_ok(unsigned sig)
{
    unsigned kind = sig >> 4, redop = sig & 15u;
    return sig <= 0xffu && kind < WIRE_OP_KIND_COUNT && kind != WIRE_OP_SEND &&
           kind != WIRE_OP_RECV && (wire_kind_reduces(kind) ? redop < COLL_REDOP_COUNT : !redop);
}

const char *wire_sig_name(unsigned sig, char *buf, size_t cap)
{
    unsigned kind = sig >> 4;
    if (!wire_sig_ok(sig))
        snprintf(buf, cap, "signature 0x%02x", sig);
    else if (wire_kind_reduces(kind))
        snprintf(buf, cap, "%s (%s)", wire_kind_name(kind),
                 coll_redop_name((coll_redop)(sig & 15u)));
    else
        snprintf(buf, cap, "%s", wire_kind_name(kind));
    return buf;
}

void wire_sig_why(char *buf, size_t cap, int src, unsigned ss, int dst, unsigned rs)
{
    char a[48] = "no collective (a plain send)", b[48] = "no collective (a plain receive)";
    if (ss) wire_sig_name(ss & 0xffu, a, sizeof(a));
    if (rs) wire_sig_name(rs & 0xffu, b, sizeof(b));
    snprintf(buf, cap, "rank %d's send is part of %s, the receive on rank %d of %s", src, a, dst,
             b);
}

int wire_ranges_ok(unsigned kind, uint64_t send_off, uint64_t send_bytes, uint64_t recv_off,
                   uint64_t recv_bytes, uint64_t rank, uint64_t block_bytes)
{
    if (!send_bytes || !recv_bytes || send_off >= recv_off + recv_bytes ||
        recv_off >= send_off + send_bytes)
        return 1; /* apart (the offsets were checked against the buffer: no overflow) */
    if (kind == WIRE_OP_ALLGATHER) return send_off - recv_off == rank * block_bytes;
    if (kind == WIRE_OP_REDUCE_SCATTER) return recv_off - send_off == rank * block_bytes;
    return send_off == recv_off && send_bytes == recv_bytes;
}

int wire_sqe_extent(const struct wire_sqe *s, int recv_side, uint32_t size, uint64_t *elems)
{
    uint64_t mult = 1;
    switch (s->kind) {
    case WIRE_OP_ALLGATHER:
        mult = recv_side ? size : 1;
        break;
    case WIRE_OP_REDUCE_SCATTER:
        mult = recv_side ? 1 : size;
        break;
    case WIRE_OP_ALLTOALL:
        mult = size;
        break;
    case WIRE_OP_SEND:
        mult = recv_side ? 0 : 1;
        break;
    case WIRE_OP_RECV:
        mult = recv_side ? 1 : 0;
        break;
    case WIRE_OP_BARRIER:
        mult = 0;
        break;
    default:
        break;
    }
    if (mult && s->count > UINT64_MAX / mult) return -1;
    *elems = s->count * mult;
    return 0;
}

int wire_take_fds(struct msghdr *mh, int *fds, int max)
{
    int n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < cnt; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + (size_t)i * sizeof(int), sizeof(int));
            if (n < max)
                fds[n++] = f;
            else
                close(f);
        }
    }
    return n;
}
