/*
 * http.h: the operational endpoints (http.address:http.port; off when the port is 0),
 * served by libmicrohttpd on a thread of its own. The agent's threads never wait for
 * it and it never takes their locks: the engine publishes rendered texts
 * (http_publish), the engine and the net thread stamp atomics as their loops turn.
 * What clients may hold is bounded (http.c: per address, in all, and in time), so that
 * probes are answered while others hold connections.
 *
 *   /livez    200 while the engine and the net thread have turned within 5 s
 *   /readyz   200 when every check passes, else 503: the agent is not stopping, every
 *             group can run here (READYZ_POD) and every group is formed (READYZ_FORMED);
 *             ?verbose lists each check and why it fails; ?exclude=formed leaves out the
 *             one check that depends on peers (the chart's readiness probe: a rollout
 *             must not wait for a group that re-forms only once the rollout is over)
 *   /metrics  Prometheus text format
 */
#ifndef AGENT_HTTP_H
#define AGENT_HTTP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct http_server;

/* Start on address:port; NULL with why. engine_alive, net_alive (NULL: no net thread):
 * CLOCK_MONOTONIC ns of each loop's last turn, read by /livez. */
struct http_server *http_start(const char *address, int port, const _Atomic int64_t *engine_alive,
                               const _Atomic int64_t *net_alive, char *why, size_t whylen);
void http_stop(struct http_server **h);
/* /readyz's checks, as bits of what fails */
enum { READYZ_POD = 1, READYZ_FORMED = 2 };

/* Engine thread: the texts to serve from now on (copied); failing: READYZ_ bits. */
void http_publish(struct http_server *h, const char *metrics, size_t mlen, const char *readyz,
                  size_t rlen, unsigned failing);
/* The port it listens on (the one asked for, or the one the kernel picked for 0... never
 * 0 here: port 0 means off). */
int http_port(const struct http_server *h);

#endif
