/*
 * group_child.c: groups made at run time (coll_group_create, coll_group_split): a child
 * holds some ranks of its parent group and lives inside the parent's epoch. Here the
 * children whose ranks are all on this pod: a local group of those slots, run by the
 * host backend's local plane (a parent on GPUs: by NCCL, on the parent ranks' GPUs),
 * with no rendezvous.
 *
 * Only the listed ranks call create, each with the same list in the same order; the
 * k-th create of a list by each member meets the k-th of the others (a slot is taken
 * once: `taken`). A child ends with its parent's epoch (orphan: its ops fail with
 * EPOCH) and goes once no member holds it.
 *
 * A child of a GPU group whose ranks span pods is made here too (decision 32): on each
 * pod, a group of the slots of its ranks there (slot_rank: their child ranks), on NCCL,
 * with a communicator of all its ranks made from one id. The pod asks the coordinator
 * of the root group for that id (NET_TASK_CHILD), naming the child by its list of root
 * ranks and by nth, its count of that list in the root's epoch (child_nth), which every
 * pod of the child counts alike; ops wait for the id in the backend (nccl_child_formed).
 * Host children across pods are libcoll's (decision 25).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "coll/coll.h"
#include "group.h"
#include "log.h"
#include "net.h"
#include "rdv_wire.h"
#include "util.h"

/* a child's config lives with it (the parent's, narrowed to one pod of n slots) */
struct child {
    struct group g;
    struct group_config cfg;
};

static int same_list(const struct group *c, const uint32_t *ranks, int n)
{
    if (c->size != n) return 0;
    for (int i = 0; i < n; i++)
        if ((uint32_t)c->parent_ranks[i] != ranks[i]) return 0;
    return 1;
}

/* Children's indexes, as the GPU launchers key their communicators: never reused, so
 * a child that went leaves nothing another one could take for its own. */
static int next_index = GROUP_CHILD_INDEX_BASE;

/* A child of a group on GPUs runs on NCCL too, each rank on its parent rank's GPU, with
 * communicators of its own (made from the child's own ids, on first use: decision 21). */
static int child_devices(struct group *parent, const uint32_t *ranks, int n,
                         struct group_config *cfg)
{
    int devs[CONFIG_MAX_DEVICES];
    int nd = parent->be->devices(parent, devs, CONFIG_MAX_DEVICES), k = 0;
    for (int i = 0; i < n; i++) {
        int slot = group_rank_slot(parent, (int)ranks[i]);
        if (slot < 0) continue; /* another pod's (a child across pods) */
        if (slot >= nd || k >= CONFIG_MAX_DEVICES) return -1;
        snprintf(cfg->devices[k], sizeof(cfg->devices[k]), "%d", devs[slot]);
        k++;
    }
    cfg->ndevices = k;
    cfg->backend = CONFIG_BACKEND_NCCL;
    return 0;
}

/* The ranks of the root group (a YAML group) that ranks[n] of parent are. */
static struct group *root_ranks(struct group *parent, const uint32_t *ranks, int n, uint32_t *out)
{
    for (int i = 0; i < n; i++)
        out[i] = ranks[i];
    struct group *g = parent;
    for (; g->parent; g = g->parent)
        for (int i = 0; i < n; i++)
            out[i] = (uint32_t)g->parent_ranks[out[i]];
    return g;
}

/* Which child of the list ranks[n] (root ranks) this is in root's epoch: 1 for the first
 * made here, and so on. Every pod of the child makes its children of one list in the
 * same order (its members create them so), so the pods agree without a word; the counts
 * start again with each epoch, as the coordinator's ids do. 0: too many lists. */
static uint32_t child_nth(struct group *root, int n, uint64_t hash)
{
    if (root->seqs_epoch != root->epoch) {
        root->nseqs = 0;
        root->seqs_epoch = root->epoch;
    }
    for (int i = 0; i < root->nseqs; i++)
        if (root->seqs[i].hash == hash && root->seqs[i].n == (uint32_t)n)
            return ++root->seqs[i].nth;
    if (root->nseqs == GROUP_CHILD_LISTS_MAX) return 0;
    if (!root->seqs && !(root->seqs = calloc(GROUP_CHILD_LISTS_MAX, sizeof(*root->seqs)))) return 0;
    root->seqs[root->nseqs++] = (struct group_child_seq){.hash = hash, .n = (uint32_t)n, .nth = 1};
    return 1;
}

/* Ask the root's coordinator for the id of span child c (made now, in root's epoch). */
static int child_ask(struct group *c, struct group *root, const uint32_t *rr, int n, char *why,
                     size_t whylen)
{
    uint64_t hash = rdv_child_hash(rr, (uint32_t)n);
    uint32_t nth = child_nth(root, n, hash);
    if (!nth) {
        snprintf(why, whylen, "group '%s' made children of %d lists in this epoch (at most %d)",
                 root->cfg->name, GROUP_CHILD_LISTS_MAX, GROUP_CHILD_LISTS_MAX);
        return -1;
    }
    struct ask {
        struct net_task t;
        struct net_child c;
    } *a = calloc(1, sizeof(*a));
    if (!a) {
        snprintf(why, whylen, "no memory for the child's ask");
        return -1;
    }
    a->t.type = NET_TASK_CHILD;
    a->t.group = root->index;
    a->t.lepoch = root->epoch;
    a->t.deadline_ns = now_ns() + (int64_t)root->cfg->join_timeout_ms * NS_PER_MS;
    a->t.child = &a->c;
    a->c.n = (uint32_t)n;
    a->c.nth = nth;
    a->c.hash = hash;
    a->c.index = c->index;
    memcpy(a->c.ranks, rr, (size_t)n * sizeof(*rr));
    log_msg(LOG_INFO, "group.child_ask", "group=%s root=%s nth=%u hash=%016llx", c->cfg->name,
            root->cfg->name, nth, (unsigned long long)hash);
    net_submit(root->net, &a->t);
    return 0;
}

void group_child_answer(struct group *groups, int ngroups, struct net_task *t)
{
    struct group *c = group_by_index(groups, ngroups, t->child->index);
    if (c) /* else: it went before its id came */
        nccl_child_formed(c, t->status, t->child->commid, t->why);
    free(t); /* child_ask's block begins with its task */
}

/* A child of ranks[n] of parent, nlocal of them on this pod (n: all), in pods pods. */
static struct group *child_new(struct group *parent, const uint32_t *ranks, int n, int nlocal,
                               int pods)
{
    struct child *k = calloc(1, sizeof(*k));
    int *pr = calloc((size_t)n, sizeof(int));
    uint8_t *taken = calloc((size_t)nlocal, 1);
    int *sr = nlocal < n ? calloc((size_t)nlocal, sizeof(int)) : NULL;
    if (!k || !pr || !taken || (nlocal < n && !sr)) {
        free(k);
        free(pr);
        free(taken);
        free(sr);
        return NULL;
    }
    k->cfg = *parent->cfg;
    k->cfg.backend = CONFIG_BACKEND_HOST;
    k->cfg.members = 1;
    k->cfg.local_slots = nlocal;
    k->cfg.ndevices = 0;
    if (parent->be == &backend_nccl && child_devices(parent, ranks, n, &k->cfg) < 0) {
        free(k);
        free(pr);
        free(taken);
        free(sr);
        return NULL;
    }
    /* "<parent>/<first rank>.<n>": what the logs call it */
    char name[CONFIG_NAME_MAX];
    snprintf(name, sizeof(name), "%.40s/%u+%d", parent->cfg->name, ranks[0], n - 1);
    memcpy(k->cfg.name, name, sizeof(name));
    if (group_init(&k->g, &k->cfg, 0, parent->up) < 0) {
        group_fini(&k->g);
        free(k);
        free(pr);
        free(taken);
        free(sr);
        return NULL;
    }
    struct group *c = &k->g;
    c->index = next_index++;
    c->gpu = parent->gpu;
    for (int i = 0, slot = 0; i < n; i++) {
        pr[i] = (int)ranks[i];
        if (sr && group_rank_slot(parent, (int)ranks[i]) >= 0) sr[slot++] = i;
    }
    c->parent_ranks = pr;
    if (sr) { /* across pods: its size is its list's, its slots this pod's part of it */
        c->slot_rank = sr;
        c->size = n;
        c->nodes = pods;
    }
    c->taken = taken;
    c->parent = parent;
    c->parent_epoch = parent->epoch;
    c->next_child = parent->children;
    parent->children = c;
    parent->nchildren++;
    log_msg(LOG_INFO, "group.child", "group=%s parent=%s epoch=%u ranks=%d", c->cfg->name,
            parent->cfg->name, parent->epoch, n);
    return c;
}

struct group *group_child_join(struct group *parent, const uint32_t *ranks, int n, int my_rank,
                               struct session *s, int *slot, int *err, char *why, size_t whylen)
{
    *err = COLL_ERR_INVALID;
    if (n < 1 || n > parent->size) {
        snprintf(why, whylen, "a child of %d ranks of a group of %d", n, parent->size);
        return NULL;
    }
    int me = -1, nlocal = 0;
    for (int i = 0; i < n; i++) {
        if (ranks[i] >= (uint32_t)parent->size) {
            snprintf(why, whylen, "ranks[%d] = %u: group '%s' has ranks 0..%d", i, ranks[i],
                     parent->cfg->name, parent->size - 1);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                snprintf(why, whylen, "rank %u listed twice (ranks[%d] and ranks[%d])", ranks[i], j,
                         i);
                return NULL;
            }
        if ((int)ranks[i] == my_rank) me = i;
        nlocal += group_rank_slot(parent, (int)ranks[i]) >= 0;
    }
    if (me < 0) {
        snprintf(why, whylen, "rank %d (the caller) is not in the list: only members create",
                 my_rank);
        return NULL;
    }
    uint32_t rr[WIRE_CHILD_MAX];
    struct group *root = NULL;
    int pods = 1;
    if (nlocal < n) {
        /* across pods: GPU groups' (host groups' are libcoll's) */
        root = n <= WIRE_CHILD_MAX ? root_ranks(parent, ranks, n, rr) : NULL;
        if (!root || parent->be != &backend_nccl || !root->net || root->nodes < 2) {
            *err = COLL_ERR_UNSUPPORTED;
            snprintf(why, whylen,
                     "%d of its %d ranks are on other pods: the agent makes children across pods "
                     "of GPU groups only (libcoll makes host groups')",
                     n - nlocal, n);
            return NULL;
        }
        uint8_t seen[RDV_MAX_NODES / 8] = {0};
        pods = 0;
        for (int i = 0; i < n; i++) {
            uint32_t pod = rr[i] / (uint32_t)root->nslots;
            pods += !(seen[pod / 8] & (1u << (pod % 8)));
            seen[pod / 8] |= (uint8_t)(1u << (pod % 8));
        }
    }
    struct group *c = parent->children;
    for (; c; c = c->next_child)
        if (!c->orphan && c->parent_epoch == parent->epoch && same_list(c, ranks, n) &&
            !c->taken[group_rank_slot(c, me)])
            break;
    int slot_me = c ? group_rank_slot(c, me) : 0;
    if (!c) {
        if (parent->nchildren >= GROUP_CHILDREN_MAX) {
            *err = COLL_ERR_LIMIT;
            snprintf(why, whylen, "group '%s' has %d children already (at most %d): close some",
                     parent->cfg->name, parent->nchildren, GROUP_CHILDREN_MAX);
            return NULL;
        }
        c = child_new(parent, ranks, n, nlocal, pods);
        if (!c) {
            *err = COLL_ERR_NOMEM;
            snprintf(why, whylen, "no memory for a child of group '%s'", parent->cfg->name);
            return NULL;
        }
        if (root && child_ask(c, root, rr, n, why, whylen) < 0) {
            *err = COLL_ERR_LIMIT;
            group_child_release(c);
            return NULL;
        }
        slot_me = group_rank_slot(c, me);
    }
    int got = group_attach(c, s, slot_me);
    if (got < 0) { /* cannot happen: taken says the slot was never held */
        *err = -got;
        snprintf(why, whylen, "slot %d of the child is taken", slot_me);
        group_child_release(c);
        return NULL;
    }
    c->taken[slot_me] = 1;
    *slot = slot_me;
    return c;
}
