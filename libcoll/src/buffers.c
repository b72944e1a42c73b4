/*
 * buffers.c: memory shared with the agent: host memfds and GPU allocations, their
 * registry (sorted by address), release once no op in flight uses them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

#include "lc.h"

void lc_buffer_free(coll_buffer *b)
{
    if (b->kind == WIRE_MEM_MEMFD && b->ptr) munmap(b->ptr, b->size);
    if (b->gmem) lcgpu_free(b->gmem);
    free(b);
}

/* ---- buffers ------------------------------------------------------------------- */

/* Register the session region with CUDA once (caller holds the lock). */
coll_err lc_shm_for_gpu(coll_conn *c)
{
    if (c->shm_gpu) return COLL_OK;
    char why[160];
    if (lcgpu_register(c->shm, c->shm_size, &c->shm_delta, why, sizeof(why)) < 0)
        return lc_fail(COLL_ERR_UNSUPPORTED, "%s", why);
    c->shm_gpu = 1;
    return COLL_OK;
}

/* Share b (ptr, size, device, kind set) with the agent through m (fd: -1 or the
 * descriptor to pass) and add it to the table. Frees b on failure. */
static coll_err register_buffer(coll_buffer **out, coll_conn *c, coll_buffer *b, union wire_msg *m,
                                int fd)
{
    union wire_msg r;
    void *ptr = b->ptr;
    b->conn = c;
    m->mem_reg.kind = b->kind;
    m->mem_reg.device = b->device;
    pthread_mutex_lock(&c->lock);
    coll_err rc = COLL_OK;
    if (b->kind != WIRE_MEM_MEMFD) {
        if (!c->agent_gpu)
            rc = lc_fail(COLL_ERR_UNSUPPORTED, "the agent has no GPU group (GPU buffers need the "
                                               "NCCL backend)");
        else
            rc = lc_shm_for_gpu(c);
    }
    if (c->nbufs == c->capbufs) {
        size_t cap = c->capbufs ? c->capbufs * 2 : 16;
        coll_buffer **nb = realloc(c->bufs, cap * sizeof(*nb));
        if (!nb)
            rc = lc_fail(COLL_ERR_NOMEM, "growing the buffer table");
        else {
            c->bufs = nb;
            c->capbufs = cap;
        }
    }
    if (rc == COLL_OK) rc = lc_rpc(c, m, fd, WIRE_MEM_REG_OK, &r, NULL, NULL);
    if (rc == COLL_OK) {
        b->id = r.mem_reg_ok.buf_id;
        size_t i = c->nbufs;
        while (i > 0 && (uintptr_t)c->bufs[i - 1]->ptr > (uintptr_t)ptr) {
            c->bufs[i] = c->bufs[i - 1];
            i--;
        }
        c->bufs[i] = b;
        c->nbufs++;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc != COLL_OK) {
        lc_buffer_free(b);
        return rc;
    }
    *out = b;
    return COLL_OK;
}

static coll_err register_fd(coll_buffer **out, coll_conn *c, int fd, size_t size)
{
    void *ptr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ptr == MAP_FAILED)
        return lc_fail(errno == ENOMEM ? COLL_ERR_NOMEM : COLL_ERR_INVALID, "mmap of %zu bytes: %s",
                       size, strerror(errno));
    coll_buffer *b = calloc(1, sizeof(*b));
    if (!b) {
        munmap(ptr, size);
        return lc_fail(COLL_ERR_NOMEM, "allocating the buffer");
    }
    b->ptr = ptr;
    b->size = size;
    b->device = COLL_DEVICE_HOST;
    b->kind = WIRE_MEM_MEMFD;
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 0);
    m.mem_reg.size = size;
    return register_buffer(out, c, b, &m, fd);
}

static coll_err gpu_alloc(coll_buffer **out, coll_conn *c, size_t size, int device)
{
    if (device < 0) return lc_fail(COLL_ERR_INVALID, "device %d", device);
    coll_buffer *b = calloc(1, sizeof(*b));
    if (!b) return lc_fail(COLL_ERR_NOMEM, "allocating the buffer");
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 0);
    size_t mapped = 0;
    int fd = -1;
    char why[160];
    if (lcgpu_alloc(device, size, &b->ptr, &mapped, &fd, m.mem_reg.uuid, &b->gmem, why,
                    sizeof(why)) < 0) {
        free(b);
        return lc_fail(COLL_ERR_UNSUPPORTED, "GPU buffer of %zu bytes on device %d: %s", size,
                       device, why);
    }
    b->size = size;
    b->device = device;
    b->kind = WIRE_MEM_CUMEM_FD;
    m.mem_reg.size = mapped;
    coll_err rc = register_buffer(out, c, b, &m, fd);
    close(fd);
    return rc;
}

coll_err coll_mem_register_cuda(coll_buffer **out, coll_conn *c, void *ptr, size_t size)
{
    if (!out || !c || !ptr) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (size == 0) return lc_fail(COLL_ERR_INVALID, "size is 0");
    coll_buffer *b = calloc(1, sizeof(*b));
    if (!b) return lc_fail(COLL_ERR_NOMEM, "allocating the buffer");
    union wire_msg m;
    wire_init(&m, WIRE_MEM_REG, 0);
    char why[160];
    int device = -1;
    if (lcgpu_ipc(ptr, size, &device, m.mem_reg.uuid, m.mem_reg.ipc, &m.mem_reg.offset, why,
                  sizeof(why)) < 0) {
        free(b);
        return lc_fail(COLL_ERR_INVALID, "%s", why);
    }
    b->ptr = ptr;
    b->size = size;
    b->device = device;
    b->kind = WIRE_MEM_CUDA_IPC;
    m.mem_reg.size = size;
    return register_buffer(out, c, b, &m, -1);
}

coll_err coll_mem_alloc(coll_buffer **out, coll_conn *c, size_t size, int device)
{
    if (!out || !c) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (size == 0) return lc_fail(COLL_ERR_INVALID, "size is 0");
    if ((uint64_t)size > WIRE_MAX_BUFFER)
        return lc_fail(COLL_ERR_INVALID, "size %zu exceeds the %llu bytes a buffer may hold", size,
                       (unsigned long long)WIRE_MAX_BUFFER);
    if (device != COLL_DEVICE_HOST) return gpu_alloc(out, c, size, device);
    int fd = memfd_create("coll-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return lc_fail(COLL_ERR_SYSTEM, "memfd_create: %s", strerror(errno));
    coll_err rc;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = lc_fail(COLL_ERR_NOMEM, "sizing a %zu-byte buffer: %s", size, strerror(errno));
        goto out;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        rc = lc_fail(COLL_ERR_SYSTEM, "sealing the buffer: %s", strerror(errno));
        goto out;
    }
    rc = register_fd(out, c, fd, size);
out:
    close(fd);
    return rc;
}

coll_err coll_mem_register_fd(coll_buffer **out, coll_conn *c, int fd, size_t size)
{
    if (!out || !c) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    *out = NULL;
    if (size == 0 || fd < 0) return lc_fail(COLL_ERR_INVALID, "fd %d, size %zu", fd, size);
    return register_fd(out, c, fd, size);
}

void *coll_mem_ptr(const coll_buffer *b)
{
    return b ? b->ptr : NULL;
}

size_t coll_mem_size(const coll_buffer *b)
{
    return b ? b->size : 0;
}

/* Whether every pending op that uses b is a GPU op whose done word the agent's stream
 * has written (so its completion is on its way). Caller holds the lock. */
static int gpu_work_done(coll_conn *c, const coll_buffer *b)
{
    for (uint32_t i = 0; i < WIRE_RING_ENTRIES; i++) {
        const struct req *r = &c->reqs[i];
        if (r->state != REQ_PENDING || (r->sb != b && r->rb != b)) continue;
        uint64_t tag = ((uint64_t)r->gen << 32) | (i + 1);
        if (!r->gpu || (int64_t)(atomic_load(&c->shm->done[i]) - tag) < 0) return 0;
    }
    return 1;
}

coll_err coll_mem_release(coll_buffer **buf)
{
    if (!buf || !*buf) return lc_fail(COLL_ERR_INVALID, "NULL buffer");
    coll_buffer *b = *buf;
    coll_conn *c = b->conn;
    pthread_mutex_lock(&c->lock);
    if (b->inflight && !c->lost) lc_reap(c); /* ops handed to streams finish unseen */
    /* GPU ops whose stream work is done may not be reported yet: wait for that */
    int64_t until = now_ns() + (int64_t)c->timeout_ms * 1000000;
    while (b->inflight && !c->lost && gpu_work_done(c, b) && now_ns() < until) {
        pthread_mutex_unlock(&c->lock);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->lock);
        lc_reap(c);
    }
    if (b->inflight) {
        uint32_t n = b->inflight;
        pthread_mutex_unlock(&c->lock);
        return lc_fail(COLL_ERR_BUSY, "%u ops in flight use this buffer", n);
    }
    union wire_msg m, r;
    wire_init(&m, WIRE_MEM_RELEASE, 0);
    m.mem_release.buf_id = b->id;
    coll_err rc = c->lost ? COLL_OK : lc_rpc(c, &m, -1, WIRE_MEM_RELEASE_OK, &r, NULL, NULL);
    if (rc == COLL_OK || c->lost) {
        for (size_t i = 0; i < c->nbufs; i++) {
            if (c->bufs[i] == b) {
                memmove(&c->bufs[i], &c->bufs[i + 1], (c->nbufs - i - 1) * sizeof(*c->bufs));
                c->nbufs--;
                break;
            }
        }
        rc = COLL_OK;
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == COLL_OK) {
        lc_buffer_free(b);
        *buf = NULL;
    }
    return rc;
}

/* The registered buffer that holds [p, p + bytes), or NULL. Caller holds the lock. */
coll_buffer *lc_find_buffer(coll_conn *c, const void *p, uint64_t bytes)
{
    size_t lo = 0, hi = c->nbufs;
    uintptr_t a = (uintptr_t)p;
    while (lo < hi) { /* last buffer whose start is <= a */
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)c->bufs[mid]->ptr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return NULL;
    coll_buffer *b = c->bufs[lo - 1];
    uintptr_t off = a - (uintptr_t)b->ptr;
    if (off > b->size || bytes > b->size - off) return NULL;
    return b;
}

coll_err coll_mem_find(coll_conn *c, const void *ptr, coll_buffer **buf, size_t *offset)
{
    if (!c || !buf || !offset) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    pthread_mutex_lock(&c->lock);
    coll_buffer *b = lc_find_buffer(c, ptr, 1); /* one byte: its end is not in it */
    pthread_mutex_unlock(&c->lock);
    if (!b) return lc_fail(COLL_ERR_NOT_FOUND, "no buffer of this connection holds %p", ptr);
    *buf = b;
    *offset = (size_t)((uintptr_t)ptr - (uintptr_t)b->ptr);
    return COLL_OK;
}

/* ---- allocation hooks for frameworks' memory pools --------------------------------- */

/* The bound connection; a hook holds hooks_lock while it uses it, so coll_disconnect
 * (lc_hooks_forget) never frees it under a hook. */
static pthread_mutex_t hooks_lock = PTHREAD_MUTEX_INITIALIZER;
static coll_conn *hooks_conn;

coll_err coll_hooks_bind(coll_conn *c)
{
    pthread_mutex_lock(&hooks_lock);
    hooks_conn = c;
    pthread_mutex_unlock(&hooks_lock);
    return COLL_OK;
}

void lc_hooks_forget(coll_conn *c)
{
    pthread_mutex_lock(&hooks_lock);
    if (hooks_conn == c) hooks_conn = NULL;
    pthread_mutex_unlock(&hooks_lock);
}

void *coll_alloc_hook(size_t size, int device, void *stream)
{
    (void)stream;
    coll_buffer *b = NULL;
    pthread_mutex_lock(&hooks_lock);
    if (!hooks_conn)
        lc_fail(COLL_ERR_INVALID, "coll_alloc_hook: no connection is bound (coll_hooks_bind)");
    else if ((ssize_t)size <= 0)
        lc_fail(COLL_ERR_INVALID, "coll_alloc_hook: size %zd", (ssize_t)size);
    else if (coll_mem_alloc(&b, hooks_conn, size, device) == COLL_OK)
        b->hooked = 1; /* b is the connection's: no other thread sees it before we return */
    pthread_mutex_unlock(&hooks_lock);
    return b ? b->ptr : NULL;
}

void coll_free_hook(void *ptr, size_t size, int device, void *stream)
{
    (void)size, (void)device, (void)stream;
    pthread_mutex_lock(&hooks_lock);
    coll_conn *c = hooks_conn;
    coll_buffer *b = NULL;
    if (c) {
        pthread_mutex_lock(&c->lock);
        b = lc_find_buffer(c, ptr, 1);
        if (b && (b->ptr != ptr || !b->hooked)) b = NULL;
        pthread_mutex_unlock(&c->lock);
    }
    if (b) {
        /* the pool frees a block once its work is done; an op still in flight on it is
         * waited for (release waits for GPU work that has run, BUSY is the rest) */
        int64_t until = now_ns() + (int64_t)c->timeout_ms * 1000000;
        while (coll_mem_release(&b) == COLL_ERR_BUSY && now_ns() < until) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    pthread_mutex_unlock(&hooks_lock);
}
