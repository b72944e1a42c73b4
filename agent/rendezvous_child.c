/*
 * rendezvous_child.c: ids for the communicators of children across pods of a GPU group
 * (rdv_wire.h: CHILD_ASK, CHILD_ID; decision 32). The coordinator makes one id per
 * (list, nth) of its epoch, on the id thread that makes its commits' (io.commid), and
 * gives it to every pod that asks; members only frame their asks and hand the answers
 * to their owner. Like rendezvous.c: no sockets and no clock.
 */
#include "rendezvous.h"

#include <stdio.h>
#include <string.h>

#include "coll/coll.h"

#define BIT(a, i) ((a)[(i) / 8] & (1u << ((i) % 8)))
#define SET(a, i) ((a)[(i) / 8] |= (uint8_t)(1u << ((i) % 8)))

/* The coordinator's answer to pod to (itself: through io.child_id). */
static void answer(struct rendezvous *s, int to, uint64_t hash, uint32_t nth, int code,
                   const uint8_t *id, const char *why)
{
    if (to == 0) {
        if (s->io.child_id) s->io.child_id(s->io.ctx, hash, nth, code, id, why);
        return;
    }
    if (!s->peers[to].present) return;
    union rdv_msg m;
    rdv_init(&m, RDV_CHILD_ID, s->group, s->epoch);
    m.h.inc = s->inc;
    m.child_id.hash = hash;
    m.child_id.nth = nth;
    m.child_id.code = code;
    if (id) memcpy(m.child_id.commid, id, RDV_COMMID_BYTES);
    snprintf(m.child_id.why, sizeof(m.child_id.why), "%s", why ? why : "");
    s->io.send(s->io.ctx, s->peers[to].id, s->peers[to].idlen, &m);
}

/* Every pod owed e's id gets it (or, with code, why there is none); e goes once every pod
 * of its ranks has had its answer, or with a failure. */
static void serve(struct rendezvous *s, struct rdv_child_entry *e, int code, const char *why)
{
    for (int i = 0; i < s->nodes; i++) {
        if (!BIT(e->asked, i) || BIT(e->told, i)) continue;
        SET(e->told, i);
        e->answered++;
        answer(s, i, e->hash, e->nth, code, code == COLL_OK ? e->id : NULL, why);
    }
    if (code != COLL_OK) {
        e->used = 0;
        s->nchildren--;
    } else if (e->answered >= e->pods) {
        /* made: kept while the table has room, so that a pod whose answer was lost (a
         * reconnect) and asks again gets the same id, not a new one */
        e->done = ++s->children_done;
        s->nchildren--;
    }
}

/* Make e's id if the id thread has one ready, then serve whoever asked. */
static void try_serve(struct rendezvous *s, struct rdv_child_entry *e)
{
    if (!e->has_id) {
        char why[160] = "";
        int rc = s->io.commid ? s->io.commid(s->io.ctx, e->id, why, sizeof(why)) : -1;
        if (rc > 0) return; /* rendezvous_child_tick tries again */
        if (rc < 0) {
            char msg[RDV_MSG_MAX];
            snprintf(msg, sizeof(msg), "the coordinator could not make the child's id: %.120s",
                     s->io.commid ? why : "it has no GPU group");
            log_msg(LOG_ERROR, "rendezvous.child_id", "group=%s error=\"%s\"", s->group,
                    LOG_Q(msg));
            serve(s, e, COLL_ERR_INTERNAL, msg);
            return;
        }
        e->has_id = 1;
    }
    serve(s, e, COLL_OK, NULL);
}

static void coord_on_ask(struct rendezvous *s, int from, const struct rdv_child_ask *a)
{
    uint64_t hash = rdv_child_hash(a->ranks, a->n);
    uint32_t size = (uint32_t)s->nodes * (uint32_t)s->nlocal;
    int holds = 0;
    if (!s->gpu) {
        answer(s, from, hash, a->nth, COLL_ERR_UNSUPPORTED, NULL,
               "the group is not on GPUs: its children across pods are libcoll's");
        return;
    }
    for (uint32_t i = 0; i < a->n; i++) {
        if (a->ranks[i] >= size) {
            char why[RDV_MSG_MAX];
            snprintf(why, sizeof(why), "rank %u of the child: group '%s' has ranks 0..%u",
                     a->ranks[i], s->group, size - 1);
            answer(s, from, hash, a->nth, COLL_ERR_INVALID, NULL, why);
            return;
        }
        holds |= a->ranks[i] / (uint32_t)s->nlocal == (uint32_t)from;
    }
    if (!holds) { /* forged, or a bug: it would count towards nobody's pods */
        unsigned long long dropped = 0;
        if (!s->limit || log_limit_pass(s->limit, &dropped))
            log_msg(LOG_WARN, "rendezvous.child_refused",
                    "group=%s node=%d reason=\"asks for a child none of whose ranks it holds\" "
                    "suppressed=%llu",
                    s->group, from, dropped);
        return;
    }
    /* its entry; else a free one, else the one made longest ago */
    struct rdv_child_entry *e = NULL, *free_e = NULL;
    for (int i = 0; i < RDV_CHILD_TABLE; i++) {
        struct rdv_child_entry *x = &s->children[i];
        if (x->used && x->hash == hash && x->nth == a->nth && x->n == a->n &&
            memcmp(x->ranks, a->ranks, a->n * sizeof(uint32_t)) == 0) {
            e = x;
            break;
        }
        if (!x->used) {
            if (!free_e || free_e->used) free_e = x;
        } else if (x->done && (!free_e || (free_e->used && x->done < free_e->done))) {
            free_e = x;
        }
    }
    if (!e) {
        if (!free_e) {
            char why[RDV_MSG_MAX];
            snprintf(why, sizeof(why),
                     "the coordinator holds %d children of group '%s' being made (at most %d): "
                     "some pods never made theirs",
                     s->nchildren, s->group, RDV_CHILD_TABLE);
            answer(s, from, hash, a->nth, COLL_ERR_LIMIT, NULL, why);
            return;
        }
        e = free_e;
        memset(e, 0, sizeof(*e));
        e->used = 1;
        e->hash = hash;
        e->nth = a->nth;
        e->n = a->n;
        memcpy(e->ranks, a->ranks, a->n * sizeof(uint32_t));
        for (uint32_t i = 0; i < a->n; i++) {
            uint32_t pod = a->ranks[i] / (uint32_t)s->nlocal;
            if (!BIT(e->asked, pod)) e->pods++;
            SET(e->asked, pod); /* (counted only: cleared below) */
        }
        memset(e->asked, 0, sizeof(e->asked));
        s->nchildren++;
    }
    if (BIT(e->told, from)) { /* it asked again: our answer was lost */
        answer(s, from, hash, a->nth, COLL_OK, e->id, NULL);
        return;
    }
    SET(e->asked, from);
    try_serve(s, e);
}

void rendezvous_child_ask(struct rendezvous *s, const uint32_t *ranks, uint32_t n, uint32_t nth)
{
    if (!s->committed || n == 0 || n > RDV_CHILD_MAX) return;
    union rdv_msg m;
    rdv_init(&m, RDV_CHILD_ASK, s->group, s->epoch);
    m.h.inc = s->inc;
    m.child_ask.node_index = (uint32_t)s->me;
    m.child_ask.nth = nth;
    m.child_ask.n = n;
    memcpy(m.child_ask.ranks, ranks, n * sizeof(uint32_t));
    if (s->me == 0)
        coord_on_ask(s, 0, &m.child_ask);
    else
        s->io.send(s->io.ctx, NULL, 0, &m);
}

void rendezvous_child_frame(struct rendezvous *s, int from, const union rdv_msg *m)
{
    /* only the epoch both sides are in: an ask or an answer of another one is stale */
    if (!s->committed || m->h.inc != s->inc || m->h.epoch != s->epoch) return;
    if (m->h.type == RDV_CHILD_ASK && s->me == 0 && from > 0) {
        if (m->child_ask.node_index != (uint32_t)from) return; /* not its own */
        coord_on_ask(s, from, &m->child_ask);
    } else if (m->h.type == RDV_CHILD_ID && s->me != 0 && s->io.child_id) {
        const struct rdv_child_id *r = &m->child_id;
        s->io.child_id(s->io.ctx, r->hash, r->nth, r->code, r->code == COLL_OK ? r->commid : NULL,
                       r->why);
    }
}

void rendezvous_child_tick(struct rendezvous *s)
{
    if (s->me != 0 || !s->nchildren) return;
    for (int i = 0; i < RDV_CHILD_TABLE; i++)
        if (s->children[i].used && !s->children[i].has_id) try_serve(s, &s->children[i]);
}

void rendezvous_child_clear(struct rendezvous *s)
{
    if (s->me != 0) return;
    for (int i = 0; i < RDV_CHILD_TABLE; i++)
        s->children[i].used = 0;
    s->nchildren = 0;
}
