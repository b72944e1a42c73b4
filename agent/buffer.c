/*
 * buffer.c: import of host buffers (memfd) into the agent.
 */
#include "buffer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "coll/coll.h"

struct buffer *buffer_import_memfd(int fd, size_t size, char *why, size_t whylen, int *code)
{
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "buffer descriptor is not a memory file");
        *code = COLL_ERR_INVALID;
        return NULL;
    }
    /* A file that can shrink could fault the agent (SIGBUS) in the middle of an op. */
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(why, whylen, "buffer memfd must be sealed with F_SEAL_SHRINK");
        *code = COLL_ERR_INVALID;
        return NULL;
    }
    if (size == 0 || (uint64_t)st.st_size < size) {
        snprintf(why, whylen, "buffer of %zu bytes announced, file holds %lld", size,
                 (long long)st.st_size);
        *code = COLL_ERR_INVALID;
        return NULL;
    }
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        snprintf(why, whylen, "mapping %zu bytes: %s", size, strerror(errno));
        *code = COLL_ERR_NOMEM;
        return NULL;
    }
    struct buffer *b = calloc(1, sizeof(*b));
    if (!b) {
        munmap(map, size);
        snprintf(why, whylen, "out of memory");
        *code = COLL_ERR_NOMEM;
        return NULL;
    }
    b->refs = 1;
    b->device = -1;
    b->map = map;
    b->size = size;
    return b;
}

void buffer_unref(struct buffer **bp)
{
    if (!bp || !*bp) return;
    struct buffer *b = *bp;
    *bp = NULL;
    if (--b->refs > 0) return;
    if (b->release)
        b->release(b);
    else
        munmap(b->map, b->size);
    free(b);
}
