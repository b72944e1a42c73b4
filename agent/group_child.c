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
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "group.h"
#include "log.h"

/* a child's config lives with it (the parent's, narrowed to one pod of n slots) */
struct child {
    struct group g;
    struct group_config cfg;
};

static int same_list(const struct group *c, const uint32_t *ranks, int n)
{
    if (c->nslots != n) return 0;
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
    int nd = parent->be->devices(parent, devs, CONFIG_MAX_DEVICES);
    int lo = parent->node_index * parent->nslots;
    if (n > CONFIG_MAX_DEVICES) return -1;
    for (int i = 0; i < n; i++) {
        int slot = (int)ranks[i] - lo;
        if (slot < 0 || slot >= nd) return -1;
        snprintf(cfg->devices[i], sizeof(cfg->devices[i]), "%d", devs[slot]);
    }
    cfg->ndevices = n;
    cfg->backend = CONFIG_BACKEND_NCCL;
    return 0;
}

static struct group *child_new(struct group *parent, const uint32_t *ranks, int n)
{
    struct child *k = calloc(1, sizeof(*k));
    int *pr = calloc((size_t)n, sizeof(int));
    uint8_t *taken = calloc((size_t)n, 1);
    if (!k || !pr || !taken) {
        free(k);
        free(pr);
        free(taken);
        return NULL;
    }
    k->cfg = *parent->cfg;
    k->cfg.backend = CONFIG_BACKEND_HOST;
    k->cfg.members = 1;
    k->cfg.local_slots = n;
    k->cfg.ndevices = 0;
    if (parent->be == &backend_nccl && child_devices(parent, ranks, n, &k->cfg) < 0) {
        free(k);
        free(pr);
        free(taken);
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
        return NULL;
    }
    struct group *c = &k->g;
    c->index = next_index++;
    c->gpu = parent->gpu;
    for (int i = 0; i < n; i++)
        pr[i] = (int)ranks[i];
    c->parent_ranks = pr;
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
    int me = -1, lo = parent->node_index * parent->nslots, hi = lo + parent->nslots;
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
    }
    if (me < 0) {
        snprintf(why, whylen, "rank %d (the caller) is not in the list: only members create",
                 my_rank);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if ((int)ranks[i] < lo || (int)ranks[i] >= hi) {
            *err = COLL_ERR_UNSUPPORTED;
            snprintf(why, whylen,
                     "rank %u is on another pod (this one holds ranks %d..%d): children across "
                     "pods are not supported yet",
                     ranks[i], lo, hi - 1);
            return NULL;
        }
    struct group *c = parent->children;
    for (; c; c = c->next_child)
        if (!c->orphan && c->parent_epoch == parent->epoch && same_list(c, ranks, n) &&
            !c->taken[me])
            break;
    if (!c) {
        if (parent->nchildren >= GROUP_CHILDREN_MAX) {
            *err = COLL_ERR_LIMIT;
            snprintf(why, whylen, "group '%s' has %d children already (at most %d): close some",
                     parent->cfg->name, parent->nchildren, GROUP_CHILDREN_MAX);
            return NULL;
        }
        c = child_new(parent, ranks, n);
        if (!c) {
            *err = COLL_ERR_NOMEM;
            snprintf(why, whylen, "no memory for a child of group '%s'", parent->cfg->name);
            return NULL;
        }
    }
    int got = group_attach(c, s, me);
    if (got < 0) { /* cannot happen: taken says the slot was never held */
        *err = -got;
        snprintf(why, whylen, "slot %d of the child is taken", me);
        group_child_release(c);
        return NULL;
    }
    c->taken[me] = 1;
    *slot = me;
    return c;
}
