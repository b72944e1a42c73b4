/*
 * engine.c: the engine loop. Spin-then-sleep: while ops arrive it polls the
 * rings without system calls (looking at the sockets every CTL_POLL_NS); after a spin
 * without work (learnt, spin.h, at most agent.spin_us) it marks every session "agent
 * sleeping", looks at the rings once more, and sleeps in epoll until a doorbell, a
 * socket, a signal or the nearest deadline.
 */
#include "engine.h"

#include "http.h"
#include "metrics.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "cpus.h"
#include "log.h"
#include "net.h"
#include "ring.h"
#include "session.h"
#include "util.h"

#define CTL_POLL_NS 50000LL /* look at sockets this often while spinning */
#define TIMER_CHECK_NS 1000000LL
#define METRICS_CAP (1 << 20)   /* /metrics and /readyz texts, half each */
#define PUBLISH_NS 1000000000LL /* the endpoints' texts are at most this old */

static void publish(struct engine *eng);

/* Open the bound socket to clients (mode, backlog): the last step of start-up, so that
 * a client that can connect finds the net thread and the endpoints up. */
static int listen_socket(struct engine *eng)
{
    const char *path = eng->cfg->agent.socket;
    if (chmod(path, (mode_t)eng->cfg->agent.socket_mode) < 0 || listen(eng->lfd, 128) < 0) {
        log_msg(LOG_ERROR, "agent.socket", "path=%s error=\"%s\"", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* epoll tags: the address tells what fired (see owner_of) */
static struct session_ev ev_listen, ev_signal, ev_net, ev_gpu;

/* Bind the socket; a path that a live agent still answers on is an error. */
static int bind_socket(struct engine *eng)
{
    const char *path = eng->cfg->agent.socket;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) goto close_socket;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (errno != EADDRINUSE) goto close_socket;
        int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (probe >= 0) close(probe);
        if (live) {
            log_msg(LOG_ERROR, "agent.socket", "path=%s error=\"another agent is serving it\"",
                    path);
            close(fd);
            return -1;
        }
        unlink(path); /* stale, from an agent that died */
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) goto close_socket;
    }
    eng->lfd = fd; /* bound; listen_socket opens it to clients once the rest is up */
    return 0;
close_socket:
    log_msg(LOG_ERROR, "agent.socket", "path=%s error=\"%s\"", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
}

/* Launchers for the GPUs of the groups on the NCCL backend. */
static int start_gpu(struct engine *eng)
{
    int devs[CONFIG_MAX_GROUPS * CONFIG_MAX_DEVICES], n = 0;
    for (int i = 0; i < eng->ngroups; i++) {
        struct group *g = &eng->groups[i];
        if (g->be) n += g->be->devices(g, devs + n, (int)(sizeof(devs) / sizeof(devs[0])) - n);
    }
    if (!n) return 0;
    char why[256];
    eng->gpu = gpu_start(devs, n, why, sizeof(why));
    if (!eng->gpu) {
        log_msg(LOG_ERROR, "agent.gpu", "error=\"%s\"", why);
        return -1;
    }
    for (int i = 0; i < eng->ngroups; i++)
        if (eng->groups[i].be == &backend_nccl) group_set_gpu(&eng->groups[i], eng->gpu, i);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = &ev_gpu};
    return epoll_ctl(eng->epfd, EPOLL_CTL_ADD, gpu_notify_fd(eng->gpu), &ev);
}

static int engine_nap(void *ctx, int asleep);

int engine_init(struct engine *eng, struct config *cfg)
{
    memset(eng, 0, sizeof(*eng));
    eng->cfg = cfg;
    eng->lfd = eng->epfd = eng->sigfd = -1;
    eng->spin_ns = (int64_t)cfg->agent.spin_us * 1000;
    /* on one CPU, whatever the engine waits for may need that CPU (engine_spin_cap);
     * an unknown mask is one CPU that every client may share */
    eng->one_cpu = coll_affinity(&eng->cpus) != 0 || coll_usable_cpus() < 2;
    int64_t start = eng->one_cpu ? 0 : eng->spin_ns;
    spin_init(&eng->idle, (int32_t)(start < 50000 ? start : 50000));
    eng->groups = calloc((size_t)(cfg->ngroups ? cfg->ngroups : 1), sizeof(struct group));
    if (!eng->groups) return -1;
    for (int i = 0; i < cfg->ngroups; i++) {
        /* a group whose backend cannot run stays listed and refuses opens with why */
        group_init(&eng->groups[i], &cfg->groups[i], cfg->node.index, &session_group_up);
        eng->ngroups++;
    }
    eng->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (eng->epfd < 0) return -1;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    eng->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (eng->sigfd < 0) return -1;
    if (bind_socket(eng) < 0) return -1; /* early: another agent on the path stops us here */
    char why[256];
    uint8_t gpu_group[CONFIG_MAX_GROUPS] = {0};
    for (int i = 0; i < eng->ngroups; i++)
        gpu_group[i] = eng->groups[i].be == &backend_nccl;
    eng->net = net_start(cfg, gpu_group, gpu_new_commid, &eng->gate, why, sizeof(why));
    if (eng->net) net_engine_nap(eng->net, eng->epfd, engine_nap, eng);
    if (!eng->net && why[0]) {
        log_msg(LOG_ERROR, "agent.net", "error=\"%s\"", why);
        return -1;
    }
    if (eng->net) {
        for (int i = 0; i < eng->ngroups; i++)
            if (cfg->groups[i].members > 1) group_set_net(&eng->groups[i], eng->net, i);
        struct epoll_event nev = {.events = EPOLLIN | EPOLLET, .data.ptr = &ev_net};
        if (epoll_ctl(eng->epfd, EPOLL_CTL_ADD, net_notify_fd(eng->net), &nev) < 0) return -1;
    }
    if (start_gpu(eng) < 0) return -1;
    eng->started_ns = now_ns();
    atomic_store(&eng->alive_ns, eng->started_ns);
    if (cfg->http.port) {
        eng->metrics_buf = malloc(METRICS_CAP);
        eng->http = eng->metrics_buf
                        ? http_start(cfg->http.address, cfg->http.port, &eng->alive_ns,
                                     eng->net ? net_alive(eng->net) : NULL, why, sizeof(why))
                        : NULL;
        if (!eng->http) {
            log_msg(LOG_ERROR, "agent.http", "error=\"%s\"",
                    eng->metrics_buf ? why : "out of memory");
            return -1;
        }
        publish(eng);
    }
    if (listen_socket(eng) < 0) return -1;
    eng->senv = (struct session_env){.cfg = cfg,
                                     .epfd = eng->epfd,
                                     .gpu = eng->gpu,
                                     .groups = eng->groups,
                                     .ngroups = eng->ngroups,
                                     .lim_request = &eng->lim_request,
                                     .lim_violation = &eng->lim_violation};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ev_listen};
    if (epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->lfd, &ev) < 0) return -1;
    ev.data.ptr = &ev_signal;
    if (epoll_ctl(eng->epfd, EPOLL_CTL_ADD, eng->sigfd, &ev) < 0) return -1;
    log_msg(LOG_INFO, "agent.listening", "socket=%s mode=0%o groups=%d spin_us=%d node=%d",
            cfg->agent.socket, cfg->agent.socket_mode, cfg->ngroups, cfg->agent.spin_us,
            cfg->node.index);
    return 0;
}

static void drop_session(struct engine *eng, struct session *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        eng->sessions = s->next;
    if (s->next) s->next->prev = s->prev;
    eng->nsessions--;
    if (s->state == SESSION_CLOSING) eng->nclosing--;
    eng->stats.sessions_dropped++;
    session_destroy(&s);
}

/* Drain every ring; returns the number of ops taken. */
static int poll_rings(struct engine *eng)
{
    int total = 0;
    struct session *s = eng->sessions, *next;
    for (; s; s = next) {
        next = s->next;
        int n = session_poll(s);
        if (n < 0)
            drop_session(eng, s);
        else
            total += n;
    }
    eng->stats.ops += (uint64_t)total;
    return total;
}

/* Ops taken from the rings whose completion is not posted yet, all sessions. */
static unsigned inflight(const struct engine *eng)
{
    unsigned n = 0;
    for (const struct session *s = eng->sessions; s; s = s->next)
        n += s->inflight;
    return n;
}

/* Render /metrics and /readyz from what the engine owns and hand them to the HTTP
 * thread (which never touches the engine's state). */
static void publish(struct engine *eng)
{
    if (!eng->http) return;
    for (int i = 0; i < eng->ngroups; i++) /* the direct ops clients ran meanwhile */
        group_direct_fold(&eng->groups[i]);
    int imports = 0;
    for (const struct session *s = eng->sessions; s; s = s->next)
        imports += session_gpu_buffers(s);
    struct metrics_in in = {.groups = eng->groups,
                            .ngroups = eng->ngroups,
                            .sessions = eng->nsessions - eng->nclosing,
                            .sessions_opened = eng->stats.sessions_opened,
                            .yield_closed = atomic_load(&eng->gate.closed),
                            .waits_spun = eng->stats.spun,
                            .waits_slept = eng->stats.sleeps,
                            .draining = eng->draining,
                            .ops_in_flight = inflight(eng),
                            .gpu_imports = imports,
                            .up_s = (double)(now_ns() - eng->started_ns) / 1e9};
    size_t ml = metrics_render(&in, eng->metrics_buf, METRICS_CAP / 2);
    unsigned failing = 0;
    size_t rl = metrics_readyz(&in, eng->metrics_buf + METRICS_CAP / 2, METRICS_CAP / 2, &failing);
    http_publish(eng->http, eng->metrics_buf, ml, eng->metrics_buf + METRICS_CAP / 2, rl, failing);
    eng->next_publish = now_ns() + PUBLISH_NS;
}

/* Groups lent to clients that have direct ops under way (recalled when the drain
 * began: they give the lease back once those are done). */
static unsigned leases_busy(const struct engine *eng)
{
    unsigned n = 0;
    for (int i = 0; i < eng->ngroups; i++) {
        const struct group *g = &eng->groups[i];
        n += g->lent_to && session_lease_busy(g->lent_to, g->lent_handle);
    }
    return n;
}

/* Draining: stop once nothing is in flight (ours, and the direct ops of clients that
 * hold leases), or at the drain deadline. */
static void check_drain(struct engine *eng, int64_t now)
{
    if (!eng->draining || eng->stop) return;
    unsigned left = inflight(eng), direct = leases_busy(eng);
    if ((left || direct) && now < eng->drain_deadline) return;
    log_msg(left || direct ? LOG_WARN : LOG_INFO, "agent.drained",
            "ops_in_flight=%u leases_busy=%u waited_ms=%lld", left, direct,
            (long long)((now - (eng->drain_deadline - eng->cfg->agent.drain_ms * NS_PER_MS)) /
                        NS_PER_MS));
    eng->stop = 1;
}

/* Handshake and op deadlines; returns the nearest one still ahead. */
static int64_t check_deadlines(struct engine *eng, int64_t now)
{
    int64_t next = INT64_MAX;
    check_drain(eng, now);
    if (eng->draining && eng->drain_deadline < next) next = eng->drain_deadline;
    /* a client's busy word rings no bell: look again in a millisecond */
    if (eng->draining && !eng->stop && leases_busy(eng) && now + NS_PER_MS < next)
        next = now + NS_PER_MS;
    for (int i = 0; i < eng->ngroups; i++) {
        if (!eng->groups[i].be) continue;
        int64_t d = group_check_timeouts(&eng->groups[i], now);
        if (d < next) next = d;
    }
    struct session *s = eng->sessions, *nx;
    for (; s; s = nx) {
        nx = s->next;
        if (s->state != SESSION_HANDSHAKE && s->state != SESSION_CLOSING) continue;
        if (s->state == SESSION_CLOSING && s->handshake_deadline_ns <= now) {
            drop_session(eng, s);
        } else if (s->handshake_deadline_ns <= now) {
            log_msg(LOG_WARN, "session.handshake_timeout", "session=%llu pid=%d timeout_ms=%d",
                    (unsigned long long)s->id, (int)s->pid, eng->cfg->agent.handshake_timeout_ms);
            session_send_error(s, 0, COLL_ERR_TIMEOUT, "no HELLO in time");
            drop_session(eng, s);
        } else if (s->handshake_deadline_ns < next) {
            next = s->handshake_deadline_ns;
        }
    }
    return next;
}

/* The live session that owns event tag e, or NULL. Never dereferences e: a session
 * dropped earlier in the same batch may still be named in the events. */
static struct session *owner_of(struct engine *eng, const struct session_ev *e)
{
    for (struct session *t = eng->sessions; t; t = t->next)
        if (e == &t->ev_sock || e == &t->ev_bell) return t;
    return NULL;
}

/* Ops and events back from the net thread. */
static void net_results(struct engine *eng)
{
    struct net_task *done;
    struct net_event *ev;
    net_collect(eng->net, &done, &ev);
    while (done) {
        struct net_task *next = done->next;
        struct group *g = &eng->groups[done->group];
        if (done == &g->mark)
            group_net_mark_done(g);
        else if (done->type == NET_TASK_CHILD)
            group_child_answer(eng->groups, eng->ngroups, done);
        else
            tcp_group_done(g, done);
        done = next;
    }
    while (ev) {
        struct net_event *next = ev->next;
        struct group *g = &eng->groups[ev->group];
        if (ev->broken) {
            g->net_formed = 0;
            group_net_broken(g, ev->code, ev->why);
        } else {
            g->net_formed = 1;
            g->net_epoch = ev->epoch;
            nccl_group_formed(g, ev);
        }
        net_event_release(eng->net, ev);
        ev = next;
    }
}

/* Ops back from the GPU launchers, jobs from its worker. */
static void gpu_results(struct engine *eng)
{
    struct gpu_task *t = gpu_collect(eng->gpu);
    while (t) {
        struct gpu_task *next = t->next;
        struct group *g = group_by_index(eng->groups, eng->ngroups, t->group);
        if (t->type == GPU_TASK_FORGET)
            free(t); /* gpu_forget_group's */
        else if (g)
            nccl_group_done(g, t);
        else /* cannot happen: a child stays while its tasks are out (nccl_busy) */
            log_msg(LOG_ERROR, "gpu.orphan_task", "group=%d type=%d", t->group, t->type);
        t = next;
    }
    struct gpu_job *j = gpu_collect_jobs(eng->gpu);
    while (j) {
        struct gpu_job *next = j->next;
        if (j->type == GPU_JOB_COMMID) {
            struct group *g = group_by_index(eng->groups, eng->ngroups, j->group);
            if (g) nccl_group_commid(g, j); /* else: a child that went before its id came */
        } else {
            struct session *s = eng->sessions;
            while (s && s->id != j->session)
                s = s->next;
            if (session_job_done(&eng->senv, s, j) < 0) drop_session(eng, s);
        }
        free(j);
        j = next;
    }
}

/* Returns how many ops it took from the rings. */
static int handle_events(struct engine *eng, struct epoll_event *evs, int n)
{
    /* ops already in the rings were submitted before whatever woke us: take them first,
     * so that a session that closed, or a signal, finds them in flight (a sleeping engine
     * sees a doorbell and a hang-up or a signal together) */
    int ops = poll_rings(eng);
    for (int i = 0; i < n; i++) {
        struct session_ev *e = evs[i].data.ptr;
        if (e == &ev_listen) {
            engine_on_accept(eng);
        } else if (e == &ev_net) {
            net_results(eng);
        } else if (e == &ev_gpu) {
            gpu_results(eng);
        } else if (e == &ev_signal) {
            struct signalfd_siginfo si;
            while (read(eng->sigfd, &si, sizeof(si)) == sizeof(si)) {
                const char *sig = si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT";
                if (eng->draining || eng->cfg->agent.drain_ms == 0) {
                    log_msg(LOG_INFO, "agent.signal", "signal=%s action=stop", sig);
                    eng->stop = 1; /* a second one, or no drain: at once */
                    continue;
                }
                /* the first: not ready, no new sessions or ops; what is in flight
                 * finishes until drain_ms; then the goodbye to the peers */
                eng->draining = eng->senv.draining = 1;
                for (int k = 0; k < eng->ngroups; k++) /* direct ops: back when done */
                    if (eng->groups[k].lent_to)
                        session_lease_recall(eng->groups[k].lent_to, eng->groups[k].lent_handle);
                publish(eng); /* not ready, at once */
                eng->drain_deadline = now_ns() + eng->cfg->agent.drain_ms * NS_PER_MS;
                log_msg(LOG_INFO, "agent.signal",
                        "signal=%s action=drain ops_in_flight=%u drain_ms=%d", sig, inflight(eng),
                        eng->cfg->agent.drain_ms);
            }
        } else {
            struct session *s = owner_of(eng, e);
            if (!s) continue;
            if (e == &s->ev_bell) continue; /* edge-triggered; the rings are polled next */
            if (session_on_message(s) < 0) {
                drop_session(eng, s);
            }
        }
    }
    return ops;
}

static void set_sleeping(struct engine *eng, uint32_t v)
{
    if (eng->gpu) gpu_engine_sleeping(eng->gpu, (int)v);
    for (struct session *s = eng->sessions; s; s = s->next)
        if (s->state == SESSION_READY)
            atomic_store_explicit(&s->shm->agent_sleeping.v, v, memory_order_relaxed);
    ring_full_fence();
}

static int pending_submissions(struct engine *eng)
{
    if (eng->gpu && gpu_has_results(eng->gpu)) return 1;
    for (struct session *s = eng->sessions; s; s = s->next)
        if (session_has_work(s)) return 1;
    return 0;
}

/* The engine is about to sleep (asleep 1: clients ring the bells from now on; nonzero if
 * one has work already, and it must not) or woke (0): in its loop, and in a tiny op it
 * runs itself (net_engine_nap) */
static int engine_nap(void *ctx, int asleep)
{
    struct engine *eng = ctx;
    set_sleeping(eng, (uint32_t)asleep);
    return asleep && pending_submissions(eng);
}

/*
 * The most the engine may spin for its next work: agent.spin_us, except on one CPU,
 * where what it waits for (a client's next op, the net thread's or a launcher's result)
 * may need that very CPU and a spin can only delay it. There it spins only while every
 * client has said it runs on a CPU this agent may not use (wire.h: the sleeping word's
 * cpu) and nothing is with the net thread or a GPU: an agent with a CPU of its own (a
 * container with a CPU set, the static CPU manager) then answers the next op from a
 * spin, where sleeping made every op two wake-ups across CPUs (PIN=1 bench/latency.sh:
 * 13.5 µs a round trip against 0.11 for two spinning processes). *known is set where
 * every client runs elsewhere: then the whole cap is spun, not the learnt budget (spin.h),
 * since a spin there takes nothing from anyone and a learner can settle on sleeping:
 * a client woken across CPUs comes back later than the learner's probes look. Says our
 * CPU to the clients on the way, for the same choice on their side.
 */
static int64_t engine_spin_cap(struct engine *eng, int *known)
{
    int cpu = sched_getcpu(), n = 0, elsewhere = 1;
    for (struct session *s = eng->sessions; s; s = s->next) {
        if (s->state != SESSION_READY) continue;
        ring_say_cpu(&s->shm->agent_sleeping, cpu);
        n++;
        if (!coll_cpu_outside(&eng->cpus, ring_peer_cpu(&s->shm->client_sleeping))) elsewhere = 0;
    }
    *known = n && elsewhere;
    if (!eng->one_cpu) return eng->spin_ns;
    if (!*known || eng->gpu) return *known = 0;
    for (int i = 0; eng->net && i < eng->ngroups; i++) {
        const struct group *g = &eng->groups[i];
        if (g->be && g->be->outstanding && g->be->outstanding(g) > 0) return *known = 0;
    }
    return eng->spin_ns;
}

int engine_run(struct engine *eng)
{
    struct epoll_event evs[64];
    int64_t now = now_ns();
    int64_t last_work = now, next_ctl = now, next_timer = now;
    int64_t next_deadline = INT64_MAX;
    /* the wait for the next piece of work, from last_work: how long it may spin
     * (spin.h: learnt, capped by agent.spin_us) and whether it has slept */
    int64_t budget = 0;
    int slept = 0, work = 0, spun = 0;
    while (!eng->stop) {
        atomic_store_explicit(&eng->alive_ns, now, memory_order_relaxed);
        if (eng->http && now >= eng->next_publish) publish(eng);
        if (work) { /* a wait ended with work: learn from it, start the next */
            if (spun && !slept) eng->stats.spun++;
            int known;
            int64_t cap = engine_spin_cap(eng, &known);
            spin_learn(&eng->idle, !slept, (int32_t)cap);
            budget = spin_budget(&eng->idle);
            if (known || budget > cap) budget = cap;
            slept = work = spun = 0;
        }
        if (poll_rings(eng) > 0) {
            last_work = now_ns();
            work = 1;
        }
        if (eng->draining) check_drain(eng, now_ns());
        /* a long op on the net thread: sleep (its completion rings the eventfd) and
         * leave the CPU to the net thread and the peers */
        int net_long = 0;
        for (int i = 0; eng->net && i < eng->ngroups; i++) {
            const struct group *g = &eng->groups[i];
            net_long |= g->be && g->be->outstanding && g->be->outstanding(g) > 1;
        }
        if (eng->net && net_has_results(eng->net)) {
            net_results(eng);
            last_work = now_ns();
            work = 1;
        }
        if (eng->gpu && gpu_has_results(eng->gpu)) {
            gpu_results(eng);
            last_work = now_ns();
            work = 1;
        }
        for (int i = 0; i < eng->ngroups; i++) { /* a slice of each large local op */
            if (group_turn(&eng->groups[i], now_ns() + BACKEND_TURN_NS)) {
                last_work = now_ns();
                work = 1;
            }
        }
        now = now_ns();
        if (now >= next_timer || now >= next_deadline) {
            next_deadline = check_deadlines(eng, now);
            next_timer = now + TIMER_CHECK_NS;
        }
        if (work) continue; /* look again at once */
        if (now - last_work < budget && !net_long) {
            if (now >= next_ctl) {
                int n = epoll_wait(eng->epfd, evs, 64, 0);
                /* a doorbell rung while we spun: its op is work like any other (else the
                 * spin ran out on ops served here and the engine announced sleep on
                 * every one, which made the client ring on every one) */
                if (n > 0 && handle_events(eng, evs, n) > 0) {
                    last_work = now_ns();
                    work = 1;
                }
                next_ctl = now + CTL_POLL_NS;
            }
            /* the sockets of sends and receives between pods, read here while it spins:
             * their messages and acks need no net thread to wake (p2p_engine.c) */
            if (eng->net) net_p2p_watch(eng->net);
            spin_relax(&eng->gate, now); /* a yield while safe (spin.h) */
            spun = 1;
            continue;
        }
        /* go to sleep: announce it, then look once more (see ring.h) */
        if (engine_nap(eng, 1)) {
            engine_nap(eng, 0);
            continue;
        }
        next_deadline = check_deadlines(eng, now);
        if (eng->stop) { /* drained just now */
            set_sleeping(eng, 0);
            break;
        }
        /* wake for the nearest deadline, and for the next publication (the texts are at
         * most PUBLISH_NS old, and /livez sees the loop turn) */
        int64_t wake = next_deadline;
        if (eng->http && eng->next_publish < wake) wake = eng->next_publish;
        int timeout = -1;
        if (wake != INT64_MAX) {
            int64_t left = wake - now;
            timeout = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
        }
        eng->stats.sleeps++;
        slept = 1;
        int n = epoll_wait(eng->epfd, evs, 64, timeout);
        set_sleeping(eng, 0);
        now = now_ns();
        if (n < 0 && errno != EINTR) {
            log_msg(LOG_ERROR, "agent.epoll", "error=\"%s\"", strerror(errno));
            return -1;
        }
        /* ops the doorbell brought are work that ended a wait that slept: the learner
         * hears of it (and a lone op after a long sleep is served and followed by sleep
         * again, its budget being zero, as in issue 2), and its probes get their turn.
         * Served here without it, every op of a client whose ops all came through the
         * doorbell left the budget where it was, zero after an idle spell, and the engine
         * slept on every op for good: back-to-back 8-byte ops through an agent on a CPU
         * of its own took 13.5-16 µs instead of 1.2 */
        if (n > 0 && handle_events(eng, evs, n) > 0) {
            last_work = now_ns();
            work = 1;
        }
        next_timer = 0;
    }
    return 0;
}

void engine_fini(struct engine *eng)
{
    http_stop(&eng->http);
    free(eng->metrics_buf);
    eng->metrics_buf = NULL;
    /* ops in flight fail with SHUTDOWN (completions reach the clients), then the
     * sessions are told and closed */
    if (eng->net) {
        net_stop(eng->net);
        net_results(eng);
        for (int i = 0; i < eng->ngroups; i++)
            eng->groups[i].net = NULL;
    }
    if (eng->gpu) {
        gpu_stop(eng->gpu);
        gpu_results(eng);
    }
    for (int i = 0; i < eng->ngroups; i++)
        if (eng->groups[i].be) group_break(&eng->groups[i], COLL_ERR_SHUTDOWN, "agent stopping");
    while (eng->sessions) {
        struct session *s = eng->sessions;
        if (s->state == SESSION_READY)
            session_send_error(s, 0, COLL_ERR_SHUTDOWN, "the agent is shutting down");
        drop_session(eng, s);
    }
    for (int i = 0; i < eng->ngroups; i++)
        group_fini(&eng->groups[i]);
    free(eng->groups);
    eng->groups = NULL;
    net_free(&eng->net);
    gpu_free(&eng->gpu);
    if (eng->lfd >= 0) {
        close(eng->lfd);
        unlink(eng->cfg->agent.socket);
    }
    if (eng->sigfd >= 0) close(eng->sigfd);
    if (eng->epfd >= 0) close(eng->epfd);
    log_msg(LOG_INFO, "agent.stopped",
            "sessions_opened=%llu ops=%llu sleeps=%llu spun=%llu yields=%llu yield_closed=%llu",
            (unsigned long long)eng->stats.sessions_opened, (unsigned long long)eng->stats.ops,
            (unsigned long long)eng->stats.sleeps, (unsigned long long)eng->stats.spun,
            (unsigned long long)atomic_load(&eng->gate.yields),
            (unsigned long long)atomic_load(&eng->gate.closed));
}
