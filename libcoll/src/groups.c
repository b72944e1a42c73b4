/*
 * groups.c: group handles: opening a YAML group (by slot or rank), children made at run
 * time (coll_group_create, coll_group_split; those across pods are span.c's, which this
 * file asks first), their info, formation (coll_group_wait) and closing, and
 * coll_disconnect (which frees the connection's groups and buffers). The top of
 * libcoll's layers (lc.h); nothing calls back here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lc.h"
#include "lcgpu.h"

/* Ask the agent whether g stands across its pods; updates info.epoch when it does. */
static coll_err query_state(coll_group *g, int *formed, char *detail, size_t cap)
{
    coll_conn *c = g->conn;
    union wire_msg m, r;
    wire_init(&m, WIRE_GROUP_STATE, 0);
    m.group_state.handle = g->handle;
    pthread_mutex_lock(&c->lock);
    coll_err rc = lc_rpc(c, &m, -1, WIRE_GROUP_STATE_OK, &r, NULL, NULL);
    pthread_mutex_unlock(&c->lock);
    if (rc != COLL_OK) return rc;
    snprintf(detail, cap, "%s", r.group_state_ok.detail);
    *formed = r.group_state_ok.formed != 0;
    if (*formed) g->info.epoch = r.group_state_ok.epoch;
    return COLL_OK;
}

static coll_err open_with(coll_conn *c, union wire_msg *m, const char *name, const int *ranks,
                          int n, coll_group **out);

coll_err coll_group_open(coll_group **out, coll_conn *c, const char *name, int slot)
{
    coll_group_opts o = COLL_GROUP_OPTS_INIT;
    o.slot = slot;
    return coll_group_open_opts(out, c, name, &o);
}

coll_err coll_group_open_opts(coll_group **out, coll_conn *c, const char *name,
                              const coll_group_opts *opts)
{
    if (!out || !c || !name || !opts) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    /* the fields the caller's header had (opts->size), defaults for the rest */
    coll_group_opts op = COLL_GROUP_OPTS_INIT;
    if (opts->size < offsetof(coll_group_opts, slot) + sizeof(int))
        return lc_fail(COLL_ERR_INVALID,
                       "coll_group_opts.size %zu: set it to sizeof "
                       "(COLL_GROUP_OPTS_INIT does)",
                       opts->size);
    memcpy(&op, opts, opts->size < sizeof(op) ? opts->size : sizeof(op));
    op.size = sizeof(op);
    int slot = op.slot;
    if (strlen(name) == 0 || strlen(name) >= WIRE_NAME_MAX)
        return lc_fail(COLL_ERR_INVALID, "group name must be 1 to %d bytes", WIRE_NAME_MAX - 1);
    if (slot < COLL_SLOT_ANY) return lc_fail(COLL_ERR_INVALID, "slot %d is negative", slot);
    if (op.op_timeout_ms < 0 || (unsigned)op.op_timeout_ms > WIRE_OP_MS_MAX)
        return lc_fail(COLL_ERR_INVALID, "op_timeout_ms %d: 0 (the group's) or 1 to %u",
                       op.op_timeout_ms, WIRE_OP_MS_MAX);
    if (op.rank < COLL_RANK_ANY) return lc_fail(COLL_ERR_INVALID, "rank %d is negative", op.rank);
    if (op.rank != COLL_RANK_ANY && slot != COLL_SLOT_ANY)
        return lc_fail(COLL_ERR_INVALID, "slot %d and rank %d: name one of the two", slot, op.rank);
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_OPEN, 0);
    m.group_open.slot = slot;
    m.group_open.op_ms = (uint32_t)op.op_timeout_ms;
    m.group_open.rank = op.rank;
    strcpy(m.group_open.name, name);
    return open_with(c, &m, name, NULL, 0, out);
}

/* Send m (an open or a create) and make the handle of its answer into *out: named
 * name, a child's ranks in its parent (n of them; 0: none). */
static coll_err open_with(coll_conn *c, union wire_msg *m, const char *name, const int *ranks,
                          int n, coll_group **out)
{
    coll_group *g = calloc(1, sizeof(*g));
    int *pr = n ? malloc((size_t)n * sizeof(int)) : NULL;
    if (!g || (n && !pr)) {
        free(g);
        free(pr);
        return lc_fail(COLL_ERR_NOMEM, "allocating the group");
    }
    if (n) memcpy(pr, ranks, (size_t)n * sizeof(int));
    g->parent_ranks = pr;
    g->nparent_ranks = n;
    union wire_msg r;
    pthread_mutex_lock(&c->lock);
    coll_err rc = lc_rpc(c, m, -1, WIRE_GROUP_OPEN_OK, &r, NULL, NULL);
    if (rc == COLL_OK) {
        g->next = c->groups;
        c->groups = g;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc != COLL_OK) {
        free(g->parent_ranks);
        free(g);
        return rc;
    }
    const struct wire_group_open_ok *o = &r.group_open_ok;
    if (o->size == 0 || o->rank >= o->size || o->local_slot >= o->local_slots || o->nodes == 0 ||
        o->node_index >= o->nodes) {
        /* keep the slot accounting honest: the agent holds the slot until close */
        g->conn = c;
        g->handle = o->handle;
        coll_group_close(&g);
        return lc_fail(COLL_ERR_PROTOCOL, "agent described an impossible group");
    }
    g->conn = c;
    g->handle = o->handle;
    g->info.rank = (int)o->rank;
    g->info.size = (int)o->size;
    g->info.local_slot = (int)o->local_slot;
    g->info.local_slots = (int)o->local_slots;
    g->info.node_index = (int)o->node_index;
    g->info.nodes = (int)o->nodes;
    g->epoch = o->epoch;
    snprintf(g->info.backend, sizeof(g->info.backend), "%s", o->backend);
    g->gpu = strcmp(g->info.backend, "nccl") == 0;
    snprintf(g->info.name, sizeof(g->info.name), "%s", name);
    coll_err de = lc_direct_init(g);
    if (de != COLL_OK) {
        coll_group_close(&g);
        return de;
    }
    int formed = 0;
    char detail[WIRE_ERRMSG_MAX];
    coll_err qe = query_state(g, &formed, detail, sizeof(detail)); /* the group's epoch */
    if (qe != COLL_OK) {
        coll_group_close(&g);
        return qe;
    }
    *out = g;
    return COLL_OK;
}

coll_err coll_group_create(coll_group *parent, const int *ranks, int n, coll_group **child)
{
    if (!parent || !ranks || !child) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *child = NULL;
    if (n < 1 || n > WIRE_CHILD_MAX || n > parent->info.size)
        return lc_fail(COLL_ERR_INVALID, "a child of %d ranks: 1 to %d (and the parent's size, %d)",
                       n, WIRE_CHILD_MAX, parent->info.size);
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->info.size)
            return lc_fail(COLL_ERR_INVALID, "ranks[%d] = %d: the parent has ranks 0..%d", i,
                           ranks[i], parent->info.size - 1);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return lc_fail(COLL_ERR_INVALID, "rank %d listed twice", ranks[i]);
        if (ranks[i] == parent->info.rank) me = i;
    }
    if (me < 0)
        return lc_fail(COLL_ERR_INVALID,
                       "this rank (%d) is not in the list: only the members call create",
                       parent->info.rank);
    /* across pods: span.c makes it; one pod's: the agent, from the group that has an
     * agent handle (a span child's root, its ranks mapped to the root's) */
    coll_err sr;
    coll_group *on = parent;
    int *mapped = NULL;
    if (lc_span_create(parent, ranks, n, child, &sr, &on, &mapped)) return sr;
    union wire_msg m;
    wire_init(&m, WIRE_GROUP_CREATE, 0);
    m.group_create.parent = on->handle;
    m.group_create.n = (uint32_t)n;
    for (int i = 0; i < n; i++)
        m.group_create.ranks[i] = (uint32_t)(mapped ? mapped[i] : ranks[i]);
    free(mapped);
    char name[WIRE_NAME_MAX];
    snprintf(name, sizeof(name), "%.40s/%d+%d", parent->info.name, ranks[0], n - 1);
    return open_with(on->conn, &m, name, ranks, n, child);
}

/* (color, key, parent rank) of one rank, ordered as a split orders a child */
struct split_entry {
    int32_t color, key, rank;
};

static int split_order(const void *a, const void *b)
{
    const struct split_entry *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

coll_err coll_group_split(coll_group *parent, int color, int key, coll_group **child)
{
    if (!parent || !child) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *child = NULL;
    if (color < 0 && color != COLL_SPLIT_NOCOLOR)
        return lc_fail(COLL_ERR_INVALID, "color %d: 0 or more, or COLL_SPLIT_NOCOLOR", color);
    /* every rank's (color, key), gathered through the parent: the n-th op of every rank,
     * so a rank that does something else instead gets MISMATCH on every rank. A group on
     * GPUs gathers them on the calling thread's device. */
    int size = parent->info.size, dev = COLL_DEVICE_HOST;
    char why[160];
    if (parent->gpu && lcgpu_device(&dev, why, sizeof(why)) < 0)
        return lc_fail(COLL_ERR_UNSUPPORTED, "splitting GPU group '%s': %s", parent->info.name,
                       why);
    size_t bytes = (size_t)size * 2 * sizeof(int32_t);
    int32_t *all = malloc(bytes);
    if (!all) return lc_fail(COLL_ERR_NOMEM, "splitting");
    coll_buffer *b;
    coll_err rc = coll_mem_alloc(&b, parent->conn, bytes, dev);
    if (rc != COLL_OK) {
        free(all);
        return rc;
    }
    int32_t *on = coll_mem_ptr(b), mine[2] = {color, key};
    if (parent->gpu)
        rc = lcgpu_copy(on + 2 * parent->info.rank, mine, sizeof(mine), why, sizeof(why)) < 0
                 ? lc_fail(COLL_ERR_INTERNAL, "splitting: %s", why)
                 : COLL_OK;
    else
        memcpy(on + 2 * parent->info.rank, mine, sizeof(mine));
    coll_request r;
    if (rc == COLL_OK)
        rc = coll_allgather(parent, on + 2 * parent->info.rank, on, 2, COLL_INT32, NULL, &r);
    if (rc == COLL_OK) rc = coll_wait(parent->conn, r, -1);
    if (rc == COLL_OK && parent->gpu && lcgpu_copy(all, on, bytes, why, sizeof(why)) < 0)
        rc = lc_fail(COLL_ERR_INTERNAL, "splitting: %s", why);
    else if (rc == COLL_OK && !parent->gpu)
        memcpy(all, on, bytes);
    coll_mem_release(&b);
    struct split_entry *e = NULL;
    int n = 0;
    if (rc == COLL_OK && color != COLL_SPLIT_NOCOLOR) {
        e = malloc((size_t)size * sizeof(*e));
        if (!e) rc = lc_fail(COLL_ERR_NOMEM, "splitting");
        for (int i = 0; e && i < size; i++)
            if (all[2 * i] == color) e[n++] = (struct split_entry){color, all[2 * i + 1], i};
    }
    free(all);
    if (rc != COLL_OK || color == COLL_SPLIT_NOCOLOR) {
        free(e);
        return rc;
    }
    qsort(e, (size_t)n, sizeof(*e), split_order);
    int *ranks = malloc((size_t)n * sizeof(int));
    if (!ranks) {
        free(e);
        return lc_fail(COLL_ERR_NOMEM, "splitting");
    }
    for (int i = 0; i < n; i++)
        ranks[i] = e[i].rank;
    free(e);
    rc = coll_group_create(parent, ranks, n, child);
    free(ranks);
    return rc;
}

int coll_group_parent_ranks(const coll_group *g, int *out, int cap)
{
    if (!g || (cap > 0 && !out)) {
        lc_fail(COLL_ERR_INVALID, "NULL argument");
        return -1;
    }
    for (int i = 0; i < g->nparent_ranks && i < cap; i++)
        out[i] = g->parent_ranks[i];
    return g->nparent_ranks;
}

coll_err coll_group_info_get(const coll_group *g, coll_group_info *out)
{
    if (!g || !out) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *out = g->info;
    return COLL_OK;
}

coll_err coll_group_wait(coll_group *g, int timeout_ms)
{
    if (!g) return lc_fail(COLL_ERR_INVALID, "NULL group");
    if (g->span) { /* a child across pods stands where its root does */
        coll_group *root = lc_span_root(g);
        if (!root)
            return lc_fail(COLL_ERR_INVALID, "group '%s': the group it was made from is closed",
                           g->info.name);
        coll_err rc = coll_group_wait(root, timeout_ms);
        if (rc == COLL_OK) g->info.epoch = root->info.epoch;
        return rc;
    }
    if (timeout_ms < -1) return lc_fail(COLL_ERR_INVALID, "timeout %d ms", timeout_ms);
    int64_t end = timeout_ms < 0 ? INT64_MAX : now_ns() + timeout_ms * NS_PER_MS;
    int64_t nap_us = 500;
    char detail[WIRE_ERRMSG_MAX] = "";
    for (;;) {
        int formed = 0;
        coll_err rc = query_state(g, &formed, detail, sizeof(detail));
        if (rc != COLL_OK) return rc;
        if (formed) return COLL_OK;
        int64_t now = now_ns();
        if (now >= end)
            return lc_fail(COLL_ERR_TIMEOUT, "group '%s' not formed after %d ms: %s", g->info.name,
                           timeout_ms, detail[0] ? detail : "no detail");
        int64_t left_us = (end - now) / 1000;
        struct timespec ts = {0, (long)((nap_us < left_us ? nap_us : left_us) * 1000)};
        nanosleep(&ts, NULL);
        if (nap_us < 50000) nap_us *= 2;
    }
}

/* ---- premultiplied sums ------------------------------------------------------------- */

coll_err coll_redop_create_premul_sum(coll_group *g, const void *scalar, coll_dtype dt,
                                      coll_redop *op)
{
    if (!g || !scalar || !op) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    size_t es = coll_dtype_size(dt);
    if (!es) return lc_fail(COLL_ERR_INVALID, "dtype %d out of range", (int)dt);
    if (dt == COLL_BOOL || dt == COLL_COMPLEX64 || dt == COLL_COMPLEX128)
        return lc_fail(COLL_ERR_INVALID, "a premultiplied sum takes no %s", coll_dtype_name(dt));
    uint64_t bits = 0; /* the low bytes (little-endian, as every target of libcoll) */
    memcpy(&bits, scalar, es);
    coll_conn *c = g->conn;
    pthread_mutex_lock(&c->lock);
    int free_slot = -1;
    for (unsigned k = 0; k < WIRE_PREMUL_SLOTS; k++) {
        struct lc_premul *p = &g->premul[k];
        if (p->set && p->dtype == (uint8_t)dt && p->bits == bits) {
            p->refs++;
            pthread_mutex_unlock(&c->lock);
            *op = (coll_redop)(WIRE_REDOP_PREMUL + k);
            return COLL_OK;
        }
        if (!p->set && free_slot < 0) free_slot = (int)k;
    }
    coll_err rc;
    if (free_slot < 0) {
        rc = lc_fail(COLL_ERR_LIMIT,
                     "group '%s': this handle holds %u premultiplied sums (dtype and scalar "
                     "pairs), all taken",
                     g->info.name, WIRE_PREMUL_SLOTS);
    } else if (g->span) { /* a child across pods multiplies in this process (span.c) */
        struct lc_premul *p = &g->premul[free_slot];
        p->dtype = (uint8_t)dt;
        p->bits = bits;
        p->refs = 1;
        atomic_store_explicit(&p->set, 1, memory_order_release);
        *op = (coll_redop)(WIRE_REDOP_PREMUL + (unsigned)free_slot);
        rc = COLL_OK;
    } else {
        union wire_msg m, r;
        wire_init(&m, WIRE_REDOP_SET, 0);
        m.redop_set.handle = g->handle;
        m.redop_set.slot = (uint32_t)free_slot;
        m.redop_set.dtype = (uint32_t)dt;
        m.redop_set.scalar = bits;
        rc = lc_rpc(c, &m, -1, WIRE_REDOP_SET_OK, &r, NULL, NULL);
        if (rc == COLL_OK) {
            struct lc_premul *p = &g->premul[free_slot];
            p->dtype = (uint8_t)dt;
            p->bits = bits;
            p->refs = 1;
            atomic_store_explicit(&p->set, 1, memory_order_release);
            *op = (coll_redop)(WIRE_REDOP_PREMUL + (unsigned)free_slot);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

coll_err coll_redop_destroy(coll_group *g, coll_redop op)
{
    if (!g) return lc_fail(COLL_ERR_INVALID, "NULL group");
    unsigned k = (unsigned)op - WIRE_REDOP_PREMUL;
    coll_conn *c = g->conn;
    pthread_mutex_lock(&c->lock);
    int ok = (unsigned)op >= WIRE_REDOP_PREMUL && k < WIRE_PREMUL_SLOTS && g->premul[k].set &&
             g->premul[k].refs > 0;
    if (ok) g->premul[k].refs--;
    pthread_mutex_unlock(&c->lock);
    return ok ? COLL_OK
              : lc_fail(COLL_ERR_INVALID, "reduction %d is no premultiplied sum of this handle",
                        (int)op);
}

void coll_group_close(coll_group **group)
{
    if (!group || !*group) return;
    coll_group *g = *group;
    *group = NULL;
    coll_conn *c = g->conn;
    int span = g->span != NULL;
    if (span)
        lc_span_close(g); /* its ops finish first; no handle of the agent's */
    else
        lc_cop_drain(g); /* its gathers, scatters and alltoallvs (compose.c) */
    lc_span_root_closed(g);
    lc_direct_fini(g, 1); /* its ops finish and its connections go back first */
    union wire_msg m, r;
    wire_init(&m, WIRE_GROUP_CLOSE, 0);
    m.group_close.handle = g->handle;
    pthread_mutex_lock(&c->lock);
    if (!c->lost && !span) lc_rpc(c, &m, -1, WIRE_GROUP_CLOSE_OK, &r, NULL, NULL);
    if (!c->lost) lc_reap(c);
    if (c->stream_err && c->stream_err_group == g->handle) c->stream_err = COLL_OK;
    for (coll_group **p = &c->groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    pthread_mutex_unlock(&c->lock);
    free(g->parent_ranks);
    free(g);
}

/* ---- the connection's end ----------------------------------------------------------- */

void coll_disconnect(coll_conn **conn)
{
    if (!conn || !*conn) return;
    coll_conn *c = *conn;
    *conn = NULL;
    lc_hooks_forget(c);
    lc_conn_hang_up(c);
    for (size_t i = 0; i < c->nbufs; i++)
        lc_buffer_free(c->bufs[i]);
    free(c->bufs);
    while (c->groups) {
        coll_group *g = c->groups;
        c->groups = g->next;
        lc_direct_fini(g, 0); /* the session's end ends the epoch of a lent group */
        lc_span_free(g);
        free(g->parent_ranks);
        free(g);
    }
    lc_conn_free(c);
}
