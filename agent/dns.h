/*
 * dns.h: the headless service's name, watched on a thread of its own (getaddrinfo
 * blocks; nothing else in the agent may). Kubernetes discovery uses it to report which
 * pod addresses DNS shows against which pods have joined: the operator's first question
 * when a group does not form.
 *
 * The thread looks the name up with exponential backoff and jitter while it fails
 * (NXDOMAIN at first is normal: CoreDNS caches negative answers up to 30 s), logging
 * each failure at debug, a warning once when it has failed for longer than
 * discovery.resolve_ms, and an info line whenever the answer changes; once it resolves,
 * it looks again every refresh interval, since pods come and go.
 */
#ifndef AGENT_DNS_H
#define AGENT_DNS_H

#include <stddef.h>
#include <stdint.h>

#define DNS_MAX_ADDRS 4096

struct dns_watch;

/* Start watching name (a host name, no port). NULL on failure (why filled). */
struct dns_watch *dns_watch_start(const char *name, int resolve_ms, int refresh_ms, char *why,
                                  size_t whylen);
void dns_watch_stop(struct dns_watch **w);

/* Any thread: the latest answer (IPv4, network order, sorted, unique) copied into out
 * (up to max), and its generation (bumped on every change; 0: never resolved).
 * *count gets the number of addresses; *failing whether the last lookup failed. */
uint64_t dns_watch_get(struct dns_watch *w, uint32_t *out, int max, int *count, int *failing);

#endif
