/*
 * buffer.h: memory an application shared with the agent, mapped here. Refcounted:
 * the owning session holds one reference and every op in flight that uses the
 * buffer holds one, so a session that ends mid-op never pulls memory from under it.
 */
#ifndef AGENT_BUFFER_H
#define AGENT_BUFFER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct buffer {
    uint32_t refs;
    int device; /* -1: host; else the agent's ordinal of the GPU that holds it */
    void *map;  /* address in the agent (a device address for GPU buffers) */
    size_t size;
    /* how the last reference lets go; NULL: munmap(map, size) */
    void (*release)(struct buffer *b);
    void *priv;
    void *rel_ctx;   /* the releaser's context (GPU buffers: the struct gpu whose worker
                        releases them) */
    atomic_int gone; /* session regions: the client went away (read by launchers) */
};

/*
 * Map size bytes of the memfd fd (the caller keeps fd). The fd must be sealed against
 * shrinking and hold at least size bytes. Returns a buffer with one reference, or
 * NULL with a reason in why (and *code set to a coll_err).
 */
struct buffer *buffer_import_memfd(int fd, size_t size, char *why, size_t whylen, int *code);
static inline struct buffer *buffer_ref(struct buffer *b)
{
    b->refs++;
    return b;
}
/* Drop a reference; the last one unmaps. Sets *b to NULL. NULL is a no-op. */
void buffer_unref(struct buffer **b);

#endif
