/*
 * net_commid.h: NCCL communicator ids for the coordinator's commits, made off the net
 * thread (net_commid.c). The net thread takes one without waiting; the thread that made
 * it makes the next, and wakes the net thread (wake_fd, an eventfd) when it is there.
 */
#ifndef AGENT_NET_COMMID_H
#define AGENT_NET_COMMID_H

#include <stddef.h>
#include <stdint.h>

#include "net.h"
#include "rdv_wire.h"

struct net_commid;

/* Start the thread, which makes the first id at once with fn. NULL with why. */
struct net_commid *net_commid_start(net_commid_fn fn, int wake_fd, char *why, size_t whylen);
/* Take the ready id into id (RDV_COMMID_BYTES): 0; 1: not made yet (ask again after the
 * wake); -1 with why: making it failed (the next take asks again). Never blocks for
 * longer than a mutex is held. */
int net_commid_take(struct net_commid *c, uint8_t *id, char *why, size_t whylen);
/* Stop the thread (waits for an id being made) and free; *c becomes NULL. */
void net_commid_stop(struct net_commid **c);

#endif
