/*
 * engine.h: the agent's engine. One thread owns the listening socket, every
 * session and every group: it accepts and checks clients, answers control
 * messages, drains the submission rings and runs matched ops. It spins while work
 * flows (as long as spinning has paid, spin.h; at most spin_us after the last op) and
 * then sleeps in epoll on the doorbells,
 * sockets and signals, with a timeout set by the nearest op deadline.
 */
#ifndef AGENT_ENGINE_H
#define AGENT_ENGINE_H

#include <sched.h>
#include <stdint.h>

#include "config.h"
#include "group.h"
#include "log.h"
#include "session.h"
#include "spin.h"

#include <stdatomic.h>

struct http_server;

struct session;
struct net;

struct engine_stats {
    uint64_t sleeps; /* times the engine went to sleep in epoll */
    uint64_t spun;   /* waits for work that a spin ended (work came before it slept) */
    uint64_t ops;    /* ops taken from rings */
    uint64_t sessions_opened, sessions_dropped;
};

struct engine {
    struct config *cfg;
    int lfd, epfd, sigfd;
    struct session *sessions;
    int nsessions; /* in the list, refused ones included */
    int nclosing;  /* refused, lingering until the client reads why (SESSION_CLOSING) */
    struct log_limit lim_refuse, lim_violation, lim_request; /* accept, protocol, requests */
    struct group *groups;
    int ngroups;
    volatile int stop;
    int draining; /* the first SIGTERM: finishing what is in flight */
    int64_t drain_deadline;
    /* the operational endpoints: texts published once a second, and when stopping */
    struct http_server *http;
    _Atomic int64_t alive_ns; /* the loop's last turn, for /livez */
    int64_t started_ns, next_publish;
    char *metrics_buf;
    int64_t spin_ns;         /* agent.spin_us: the most it spins for the next work */
    int one_cpu;             /* it may use one CPU only (engine_spin_cap) */
    cpu_set_t cpus;          /* ... where it may run */
    struct spin_adapt idle;  /* how long to spin for the next work (spin.h) */
    struct spin_gate gate;   /* whether this agent's spins may yield (spin.h; net's too) */
    struct session_env senv; /* what sessions see of the engine */
    struct engine_stats stats;
    struct net *net; /* NULL when every group lives in this pod */
    struct gpu *gpu; /* NULL when no group runs on the NCCL backend */
};

/* Bind the socket (refusing one a live agent still answers on), set up groups and
 * epoll. Returns 0, or -1 after logging why. */
int engine_init(struct engine *eng, struct config *cfg);
/* Serve until SIGTERM or SIGINT (blocked by the caller and read through a
 * signalfd). Returns 0 on a clean stop. */
int engine_run(struct engine *eng);
/* Fail what is in flight with COLL_ERR_SHUTDOWN, tell clients, close, unlink. */
void engine_fini(struct engine *eng);

/* Engine thread, engine_accept.c: take every client the listening socket holds. */
void engine_on_accept(struct engine *eng);

#endif
