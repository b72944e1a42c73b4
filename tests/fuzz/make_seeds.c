/*
 * make_seeds.c: writes the checked-in seed corpora of the fuzzers (tests/fuzz/corpus):
 * one valid instance of every message, frame and header, so that fuzzing starts from
 * inputs that pass the first checks. Run again when a format changes:
 *   build-fuzz/make_seeds tests/fuzz/corpus
 */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "rdv_wire.h"
#include "wire.h"

static const char *root;

static void put(const char *dir, const char *name, const void *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s/%s", root, dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return;
    }
    fwrite(p, 1, n, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    root = argv[1];
    for (unsigned t = WIRE_HELLO; t < WIRE_TYPE_END; t++) {
        union wire_msg m;
        wire_init(&m, (enum wire_type)t, 7);
        if (t == WIRE_GROUP_OPEN) snprintf(m.group_open.name, sizeof(m.group_open.name), "g");
        char name[32];
        snprintf(name, sizeof(name), "msg-%u", t);
        put("wire", name, &m, m.h.len);
    }
    struct wire_sqe q = {.tag = 1,
                         .count = 16,
                         .kind = WIRE_OP_ALLREDUCE,
                         .dtype = COLL_FLOAT32,
                         .send_buf = 1,
                         .recv_buf = 1};
    put("wire", "sqe-allreduce", &q, sizeof(q));
    q.kind = WIRE_OP_BROADCAST;
    q.flags = WIRE_SQE_F_GPU;
    put("wire", "sqe-broadcast-gpu", &q, sizeof(q));

    union rdv_msg r;
    rdv_init(&r, RDV_JOIN, "g", 0);
    r.join.nodes = 4;
    r.join.node_index = 2;
    snprintf(r.join.pod, sizeof(r.join.pod), "pod-2");
    snprintf(r.join.data_addr, sizeof(r.join.data_addr), "10.0.0.2:7000");
    put("rdv", "join", &r, rdv_size(&r));
    rdv_init(&r, RDV_COMMIT, "g", 3);
    r.h.inc = 1;
    r.commit.nodes = 2;
    r.h.len = (uint32_t)rdv_size(&r);
    put("rdv", "commit", &r, rdv_size(&r));
    rdv_init(&r, RDV_ABORT, "g", 3);
    put("rdv", "abort", &r, rdv_size(&r));
    rdv_init(&r, RDV_HEARTBEAT, "g", 3);
    put("rdv", "heartbeat", &r, rdv_size(&r));
    rdv_init(&r, RDV_CHILD_ASK, "g", 3);
    r.h.inc = 1;
    r.child_ask.node_index = 1;
    r.child_ask.nth = 1;
    r.child_ask.n = 2;
    r.child_ask.ranks[0] = 3;
    r.child_ask.ranks[1] = 1;
    put("rdv", "child-ask", &r, rdv_size(&r));
    rdv_init(&r, RDV_CHILD_ID, "g", 3);
    r.h.inc = 1;
    r.child_id.nth = 1;
    put("rdv", "child-id", &r, rdv_size(&r));
    struct data_hello h = {.magic = DATA_MAGIC,
                           .version = RDV_VERSION,
                           .channel = 1,
                           .inc = 1,
                           .epoch = 3,
                           .from_index = 1};
    put("rdv", "hello", &h, sizeof(h));
    struct data_welcome w = {.magic = DATA_MAGIC,
                             .version = RDV_VERSION,
                             .status = DATA_WELCOME_OK,
                             .channel = 1,
                             .inc = 1,
                             .epoch = 3};
    put("rdv", "welcome", &w, sizeof(w));
    struct data_challenge c = {.magic = DATA_MAGIC, .version = RDV_VERSION};
    put("rdv", "challenge", &c, sizeof(c));
    uint8_t sh[1 + 2 + sizeof(struct data_op_hdr)];
    struct data_op_hdr o = {.magic = DATA_MAGIC,
                            .kind = WIRE_OP_SEND,
                            .dtype = COLL_INT32,
                            .src_rank = 2,
                            .dst_rank = 0,
                            .count = 100};
    memcpy(sh, &o, sizeof(o));
    put("rdv", "send-hdr", sh, sizeof(o));
    return 0;
}
