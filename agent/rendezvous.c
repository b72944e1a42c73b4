/*
 * rendezvous.c: the rendezvous state machine of one group (rendezvous.h). No sockets
 * and no clock reads: frames go out through io.send, time comes in as arguments, and
 * tests/test_rendezvous.c drives coordinators and members against each other directly.
 */
#include "rendezvous.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

#define NS_PER_MS 1000000LL

/* The coordinator's incarnation: random, not 0, and its commits count from 1 again. */
static void new_incarnation(struct rendezvous *s)
{
    uint64_t old = s->inc;
    do
        s->io.random(s->io.ctx, &s->inc, sizeof(s->inc));
    while (!s->inc || s->inc == old);
    s->epoch = 0;
}

/* A frame of ours about the current (or last) epoch. */
static void frame(const struct rendezvous *s, union rdv_msg *m, enum rdv_type t)
{
    rdv_init(m, t, s->group, s->epoch);
    m->h.inc = s->inc;
}

void rendezvous_init(struct rendezvous *s, const struct rendezvous_settings *st,
                     const struct rendezvous_io *io)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->group, sizeof(s->group), "%s", st->group);
    snprintf(s->pod, sizeof(s->pod), "%s", st->pod);
    snprintf(s->data_addr, sizeof(s->data_addr), "%s", st->data_addr);
    snprintf(s->uid, sizeof(s->uid), "%s", st->uid ? st->uid : "");
    s->nodes = st->nodes;
    s->me = st->me;
    s->nlocal = st->nlocal;
    s->gpu = st->gpu;
    s->config_hash = st->config_hash;
    s->settings = st->settings;
    s->hb_ns = (int64_t)st->heartbeat_ms * NS_PER_MS;
    s->join_ns = (int64_t)st->join_ms * NS_PER_MS;
    s->limit = st->limit;
    s->place = st->place;
    s->io = *io;
    if (s->me == 0) new_incarnation(s);
}

static void send_to(struct rendezvous *s, const struct rdv_peer *p, union rdv_msg *m)
{
    s->io.send(s->io.ctx, p ? p->id : NULL, p ? p->idlen : 0, m);
}

static void send_join(struct rendezvous *s, int64_t now)
{
    union rdv_msg m;
    rdv_init(&m, RDV_JOIN, s->group, 0);
    m.h.inc = s->inc;
    m.join.config_hash = s->config_hash;
    m.join.settings = s->settings;
    m.join.nodes = (uint32_t)s->nodes;
    m.join.node_index = (uint32_t)s->me;
    m.join.local_slots = (uint32_t)s->nlocal;
    m.join.last_epoch = s->epoch;
    snprintf(m.join.pod, sizeof(m.join.pod), "%s", s->pod);
    snprintf(m.join.data_addr, sizeof(m.join.data_addr), "%s", s->data_addr);
    snprintf(m.join.uid, sizeof(m.join.uid), "%s", s->uid);
    m.join.place = s->place;
    send_to(s, NULL, &m);
    s->next_join = now + s->hb_ns;
    s->join_unanswered = 1;
}

/* Tell the other pods that this epoch is over: the coordinator tells every member, a
 * member tells the coordinator (which tells the rest). */
static void send_abort(struct rendezvous *s, int code, const char *why, int silent)
{
    union rdv_msg m;
    frame(s, &m, RDV_ABORT);
    m.abort.code = code;
    m.abort.silent = silent != 0;
    m.abort.node_index = (uint32_t)s->me;
    snprintf(m.abort.why, sizeof(m.abort.why), "%s", why);
    if (s->me == 0) {
        for (int i = 1; i < s->nodes; i++)
            if (s->peers[i].present) send_to(s, &s->peers[i], &m);
    } else {
        send_to(s, NULL, &m);
    }
}

/* Once per epoch, whatever else goes wrong meanwhile. */
void rendezvous_fail(struct rendezvous *s, int code, const char *why, int tell, int drain)
{
    if (!s->committed || s->ending) return;
    if (tell) send_abort(s, code, why, drain == RDV_DRAIN_SILENT);
    s->ending = 1;
    s->io.end(s->io.ctx, code, why, drain);
}

/* Members: wait before the next JOIN, doubling up to RDV_BACKOFF_MAX_NS, with jitter
 * (half the backoff plus a random part of it). */
static void back_off(struct rendezvous *s, int64_t now)
{
    s->join_backoff = s->join_backoff ? s->join_backoff * 2 : RDV_BACKOFF_MIN_NS;
    if (s->join_backoff > RDV_BACKOFF_MAX_NS) s->join_backoff = RDV_BACKOFF_MAX_NS;
    uint32_t r = 0;
    s->io.random(s->io.ctx, &r, sizeof(r));
    s->next_join = now + s->join_backoff / 2 +
                   (int64_t)(r % (uint32_t)(s->join_backoff / NS_PER_MS + 1)) * NS_PER_MS;
}

void rendezvous_end(struct rendezvous *s, int code, const char *why, int tell, int64_t now)
{
    int had = s->committed, was_formed = s->formed;
    if (tell) send_abort(s, code, why, 0);
    s->committed = s->formed = s->ending = 0;
    s->ends++;
    rendezvous_child_clear(s); /* its children's ids were of the epoch */
    if (s->me == 0) {
        /* every member must join again; we are present at once */
        for (int i = 1; i < s->nodes; i++)
            s->peers[i].present = 0;
    } else if (had && was_formed) {
        s->join_backoff = 0; /* a formed epoch ended: join again at once */
        send_join(s, now);
    } else {
        /* the epoch never formed (or we were refused): back off with jitter, so that a
         * group that cannot form does not commit and abort in a tight loop */
        back_off(s, now);
    }
}

void rendezvous_formed(struct rendezvous *s)
{
    if (!s->committed) return;
    s->formed = 1;
    s->join_backoff = 0;
}

static void apply_commit(struct rendezvous *s, const struct rdv_commit *c, int64_t now)
{
    s->epoch = c->h.epoch;
    s->inc = c->h.inc;
    s->last_reject[0] = '\0'; /* admitted: a refusal before is no longer news */
    s->committed = 1;
    s->formed = s->ending = 0;
    s->commits++;
    s->form_deadline = now + s->join_ns;
    s->coord_heard = now;
    s->io.commit(s->io.ctx, c); /* may end the epoch at once (rendezvous_end) */
}

/* ---- coordinator ------------------------------------------------------------------ */

static void coord_commit(struct rendezvous *s, int64_t now)
{
    uint8_t commid[RDV_COMMID_BYTES];
    int has_commid = 0;
    if (s->gpu && s->io.commid) {
        /* only the coordinator makes the id, once per epoch, off its thread: not made
         * yet, the commit waits for it (rendezvous_tick) */
        char why[160] = "";
        int rc = s->io.commid(s->io.ctx, commid, why, sizeof(why));
        if (rc > 0) {
            s->commit_waiting = 1;
            return;
        }
        has_commid = rc == 0;
        if (rc < 0)
            log_msg(LOG_ERROR, "rendezvous.commid", "group=%s error=\"%s\"", s->group, LOG_Q(why));
    }
    s->commit_waiting = 0;
    /* the count is ours alone (rdv_wire.h); at its end, an incarnation starts anew */
    if (s->epoch == UINT32_MAX) new_incarnation(s);
    s->epoch++;
    union rdv_msg m;
    frame(s, &m, RDV_COMMIT);
    m.commit.nodes = (uint32_t)s->nodes;
    s->io.random(s->io.ctx, m.commit.secret, sizeof(m.commit.secret));
    /* the addresses were checked when each JOIN was decoded */
    rdv_member_set(&m.commit.members[0], s->data_addr);
    for (int i = 1; i < s->nodes; i++)
        rdv_member_set(&m.commit.members[i], s->peers[i].join.data_addr);
    /* which pods may want each other's CPUs (out of memory: all, the safe answer) */
    uint16_t *flags = malloc((size_t)s->nodes * sizeof(*flags));
    struct rdv_place *place = malloc((size_t)s->nodes * sizeof(*place));
    if (flags && place) {
        place[0] = s->place;
        for (int i = 1; i < s->nodes; i++)
            place[i] = s->peers[i].join.place;
        for (int i = 0; i < s->nodes; i++)
            flags[i] = 0;
        rdv_mark_shared(place, s->nodes, flags);
    }
    for (int i = 0; i < s->nodes; i++)
        m.commit.members[i].flags = flags && place ? flags[i] : RDV_MEMBER_CPU_SHARED;
    free(flags);
    free(place);
    if (has_commid) {
        memcpy(m.commit.commid, commid, sizeof(m.commit.commid));
        m.commit.has_commid = 1;
    }
    for (int i = 1; i < s->nodes; i++)
        send_to(s, &s->peers[i], &m);
    apply_commit(s, &m.commit, now);
}

static void refuse(const struct rendezvous_io *io, const unsigned char *id, size_t idlen,
                   const struct rdv_join *j, union rdv_msg *r, struct log_limit *limit)
{
    unsigned long long dropped = 0;
    if (!limit || log_limit_pass(limit, &dropped))
        log_msg(LOG_WARN, "rendezvous.reject", "node=%u pod=\"%s\" reason=\"%s\" suppressed=%llu",
                j->node_index, LOG_Q(j->pod), LOG_Q(r->reject.why), dropped);
    io->send(io->ctx, id, idlen, r);
}

void rendezvous_reject_unknown(const struct rendezvous_io *io, const unsigned char *id,
                               size_t idlen, const struct rdv_join *j, struct log_limit *limit)
{
    union rdv_msg r;
    rdv_init(&r, RDV_REJECT, j->h.group, 0);
    snprintf(r.reject.why, sizeof(r.reject.why),
             "no group '%s' spans several pods on the coordinator", j->h.group);
    refuse(io, id, idlen, j, &r, limit);
}

/* Why member j's settings are refused: the keys that differ, the member's value first. */
static void settings_differ(const struct rendezvous *s, const struct rdv_join *j, char *out,
                            size_t cap)
{
    static const char *const keys[] = {"backend", "local_slots",  "devices",      "op_ms",
                                       "join_ms", "heartbeat_ms", "security.data"};
    const uint32_t mine[] = {
        s->settings.backend, s->settings.local_slots,  s->settings.ndevices, s->settings.op_ms,
        s->settings.join_ms, s->settings.heartbeat_ms, s->settings.data_seal};
    const uint32_t theirs[] = {
        j->settings.backend, j->settings.local_slots,  j->settings.ndevices, j->settings.op_ms,
        j->settings.join_ms, j->settings.heartbeat_ms, j->settings.data_seal};
    static const char *const seals[] = {"none", "mac", "encrypt"};
    size_t k = (size_t)snprintf(out, cap,
                                "group '%s': pod %.40s's settings differ from the "
                                "coordinator's (pod %.40s):",
                                j->h.group, j->pod, s->pod);
    int n = 0;
    for (int i = 0; i < 7 && k < cap; i++) {
        if (mine[i] == theirs[i]) continue;
        if (i == 6 && mine[i] < 3 && theirs[i] < 3)
            k += (size_t)snprintf(out + k, cap - k, "%s %s %s, not %s", n++ ? ";" : "", keys[i],
                                  seals[theirs[i]], seals[mine[i]]);
        else
            k += (size_t)snprintf(out + k, cap - k, "%s %s %u, not %u", n++ ? ";" : "", keys[i],
                                  theirs[i], mine[i]);
    }
    if (!n && k < cap) /* the name, or a device's UUID: what the values do not show */
        snprintf(out + k, cap - k, " the device list (or another setting) differs");
}

static void coord_on_join(struct rendezvous *s, const unsigned char *id, size_t idlen,
                          const struct rdv_join *j, int64_t now)
{
    union rdv_msg r;
    rdv_init(&r, RDV_REJECT, j->h.group, 0);
    if (j->nodes != (uint32_t)s->nodes) {
        snprintf(r.reject.why, sizeof(r.reject.why),
                 "group '%s': member has world size (members) %u, coordinator has %d", j->h.group,
                 j->nodes, s->nodes);
    } else if (j->config_hash != s->config_hash) {
        /* which settings differ, with both values (no hash in the text: it is all a
         * spoofed JOIN would need); an upgrade that changes them shows here */
        settings_differ(s, j, r.reject.why, sizeof(r.reject.why));
    } else if (j->node_index == 0) {
        snprintf(r.reject.why, sizeof(r.reject.why),
                 "group '%s': node index 0 is the coordinator itself", j->h.group);
    }
    if (r.reject.why[0]) {
        refuse(&s->io, id, idlen, j, &r, s->limit);
        return;
    }
    if (idlen > RDV_ID_MAX) idlen = RDV_ID_MAX;
    struct rdv_peer *p = &s->peers[j->node_index];
    int same_pod = p->present && strcmp(p->join.uid, j->uid) == 0;
    if (p->present && !same_pod && strcmp(p->displaced, j->uid) == 0) {
        /* the pod this index's holder replaced: it stays out while the new one holds */
        int n = snprintf(r.reject.why, sizeof(r.reject.why),
                         "two pods claim node index %u: pod %.40s (uid %.36s) replaced this one "
                         "(uid %.36s)",
                         j->node_index, p->join.pod, p->join.uid, j->uid);
        (void)n;
        refuse(&s->io, id, idlen, j, &r, s->limit);
        return;
    }
    int same = same_pod && p->idlen == idlen && memcmp(p->id, id, idlen) == 0;
    if (s->committed && same && (j->h.inc != s->inc || j->last_epoch < s->epoch)) {
        /* sent before our COMMIT reached it: nothing new */
        p->last_heard = now;
        return;
    }
    if (p->present && !same_pod) {
        log_msg(LOG_WARN, "rendezvous.replaced",
                "group=%s node=%u old_pod=\"%s\" old_uid=\"%s\" new_pod=\"%s\" new_uid=\"%s\"",
                s->group, j->node_index, LOG_Q(p->join.pod), LOG_Q(p->join.uid), LOG_Q(j->pod),
                LOG_Q(j->uid));
        memcpy(p->displaced, p->join.uid, sizeof(p->displaced));
    } else if (!p->present && strcmp(p->displaced, j->uid) == 0) {
        p->displaced[0] = '\0'; /* the index is free again: whoever comes takes it */
    }
    if (s->committed) {
        char why[160];
        snprintf(why, sizeof(why), "node %u (%.80s) joined again%s", j->node_index, j->pod,
                 p->present && !same_pod ? " as a new pod" : "");
        rendezvous_fail(s, COLL_ERR_PEER_LOST, why, 1, 1);
    }
    int again = p->present && same_pod && !s->committed; /* a JOIN repeated while waiting */
    p->present = 1;
    memcpy(p->id, id, idlen);
    p->idlen = idlen;
    p->join = *j;
    p->last_heard = now;
    if (again) return; /* nothing changed: no log line, no scan (O(members) per JOIN) */
    log_msg(LOG_INFO, "rendezvous.join", "group=%s node=%u pod=\"%s\" data=%s last_epoch=%u",
            s->group, j->node_index, LOG_Q(j->pod), j->data_addr, j->last_epoch);
    if (s->committed) return; /* the old epoch is still draining: commit after it ends */
    for (int i = 1; i < s->nodes; i++)
        if (!s->peers[i].present) return;
    coord_commit(s, now);
}

/* ---- frames ----------------------------------------------------------------------- */

void rendezvous_frame(struct rendezvous *s, const unsigned char *id, size_t idlen,
                      const union rdv_msg *m, int64_t now)
{
    if (id) { /* coordinator side: from a member */
        if (s->me != 0) return;
        if (m->h.type == RDV_JOIN) {
            coord_on_join(s, id, idlen, &m->join, now);
            return;
        }
        int from = -1;
        for (int i = 1; i < s->nodes; i++)
            if (s->peers[i].present && s->peers[i].idlen == idlen &&
                memcmp(s->peers[i].id, id, idlen) == 0)
                from = i;
        if (from < 0) return; /* not a member of this group (any more) */
        s->peers[from].last_heard = now;
        if (m->h.type == RDV_CHILD_ASK) rendezvous_child_frame(s, from, m);
        if (m->h.type == RDV_ABORT && s->committed && m->h.inc == s->inc && m->h.epoch == s->epoch)
            rendezvous_fail(s, m->abort.code, m->abort.why, 1,
                            m->abort.silent ? RDV_DRAIN_SILENT : RDV_DRAIN);
        if (m->h.type == RDV_LEAVE) {
            char why[160];
            snprintf(why, sizeof(why), "node %d (%.80s) left", from, s->peers[from].join.pod);
            log_msg(LOG_INFO, "rendezvous.leave", "group=%s node=%d pod=\"%s\"", s->group, from,
                    LOG_Q(s->peers[from].join.pod));
            s->peers[from].present = 0;
            rendezvous_fail(s, COLL_ERR_PEER_LOST, why, 1, 1);
        }
        return;
    }
    /* member side: from the coordinator */
    if (s->me == 0) return;
    s->coord_heard = now;
    switch (m->h.type) {
    case RDV_COMMIT:
        if (m->commit.nodes != (uint32_t)s->nodes) return;
        /* the current epoch's, or an old one, of the coordinator we know (another
         * incarnation: it restarted, and counts from 1 again) */
        if (m->h.inc == s->inc && m->h.epoch <= s->epoch) return;
        if (s->committed) {
            /* a commit we have not seen ends ours: the coordinator moved on (it
             * restarted, or our ABORT crossed its COMMIT) */
            rendezvous_fail(s, COLL_ERR_PEER_LOST, "the coordinator committed a newer epoch", 0, 0);
            if (s->committed) return; /* still draining: it will send the commit again */
        }
        apply_commit(s, &m->commit, now);
        break;
    case RDV_REJECT:
        if (s->committed) break; /* a refusal of a JOIN that crossed our COMMIT */
        if (strcmp(s->last_reject, m->reject.why) != 0) {
            log_msg(LOG_ERROR, "rendezvous.rejected", "group=%s reason=\"%s\"", s->group,
                    LOG_Q(m->reject.why));
            snprintf(s->last_reject, sizeof(s->last_reject), "%s", m->reject.why);
        }
        if (s->join_unanswered) back_off(s, now); /* once per JOIN, not per refusal */
        s->join_unanswered = 0;
        break;
    case RDV_CHILD_ID:
        rendezvous_child_frame(s, 0, m);
        break;
    case RDV_ABORT:
        /* a pod went silent (the coordinator says): no op of ours waits for its bytes,
         * which will not come, and every member knows within the coordinator's 3
         * heartbeats, not its own sockets' keepalive */
        if (s->committed && m->h.inc == s->inc && m->h.epoch == s->epoch)
            rendezvous_fail(s, m->abort.code, m->abort.why, 0,
                            m->abort.silent ? RDV_DRAIN_SILENT : RDV_DRAIN);
        break;
    default:
        break;
    }
}

void rendezvous_leave(struct rendezvous *s)
{
    if (s->me == 0) {
        send_abort(s, COLL_ERR_PEER_LOST, "the coordinator is stopping", 0);
    } else {
        union rdv_msg m;
        frame(s, &m, RDV_LEAVE);
        m.leave.node_index = (uint32_t)s->me;
        send_to(s, NULL, &m);
    }
}

/* ---- timers ----------------------------------------------------------------------- */

void rendezvous_heartbeat(struct rendezvous *s, int64_t now)
{
    if (now < s->next_hb) return;
    union rdv_msg m;
    frame(s, &m, RDV_HEARTBEAT);
    if (s->me == 0) {
        for (int i = 1; i < s->nodes; i++)
            if (s->peers[i].present) send_to(s, &s->peers[i], &m);
    } else if (s->committed) {
        m.heartbeat.node_index = (uint32_t)s->me;
        send_to(s, NULL, &m);
    } else {
        return;
    }
    s->next_hb = now + s->hb_ns;
}

int rendezvous_silent(const struct rendezvous *s, int64_t now, char *why, size_t whylen)
{
    if (!s->committed) return 0;
    if (s->me != 0) {
        if (now - s->coord_heard <= 3 * s->hb_ns) return 0;
        snprintf(why, whylen, "the coordinator is silent");
        return 1;
    }
    for (int i = 1; i < s->nodes; i++)
        if (s->peers[i].present && now - s->peers[i].last_heard >= 3 * s->hb_ns) {
            snprintf(why, whylen, "node %d (%.80s) silent for %lld ms", i, s->peers[i].join.pod,
                     (long long)((now - s->peers[i].last_heard) / NS_PER_MS));
            return 1;
        }
    return 0;
}

static int all_present(const struct rendezvous *s)
{
    for (int i = 1; i < s->nodes; i++)
        if (!s->peers[i].present) return 0;
    return 1;
}

void rendezvous_tick(struct rendezvous *s, int64_t now)
{
    rendezvous_heartbeat(s, now);
    if (s->me == 0 && s->commit_waiting && !s->committed && all_present(s))
        coord_commit(s, now); /* its id may be there now */
    rendezvous_child_tick(s);
    if (s->me == 0) {
        for (int i = 1; i < s->nodes; i++) {
            if (!s->peers[i].present || now - s->peers[i].last_heard < 3 * s->hb_ns) continue;
            char why[160];
            snprintf(why, sizeof(why), "node %d (%.80s) silent for %lld ms", i,
                     s->peers[i].join.pod, (long long)((now - s->peers[i].last_heard) / NS_PER_MS));
            s->peers[i].present = 0;
            rendezvous_fail(s, COLL_ERR_PEER_LOST, why, 1, RDV_DRAIN_SILENT);
        }
    } else {
        if (!s->committed && now >= s->next_join) send_join(s, now);
        if (s->committed && now - s->coord_heard > 3 * s->hb_ns)
            rendezvous_fail(s, COLL_ERR_PEER_LOST, "the coordinator is silent", 0,
                            RDV_DRAIN_SILENT);
    }
    if (s->committed && !s->formed && now > s->form_deadline)
        rendezvous_fail(s, COLL_ERR_PEER_LOST, "data connections not up within join_ms", 1, 0);
}
