/*
 * nccl_post.c: what a launcher hands the engine (finished tasks, failures without the
 * GPU, the engine's doorbell) and the events it fences ops with. Below every other
 * file of the backend but nccl.c (nccl_priv.h); it calls none of them.
 */
#include "nccl_priv.h"

/* Something was published for the engine (under out_lock, has_out set): ring its
 * doorbell if it may be asleep. A spinning engine sees has_out; ring only one that may
 * sleep (ring.h's order: publish, full fence, then look at the sleeping word). */
void nccl_ring_engine(struct gpu *g)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&g->engine_sleeping, memory_order_relaxed)) {
        uint64_t one = 1;
        ssize_t w = write(g->out_efd, &one, sizeof(one));
        (void)w;
    }
}

void nccl_post(struct gpu *g, struct gpu_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&g->out_lock);
    if (g->out_tail)
        g->out_tail->next = t;
    else
        g->out_head = t;
    g->out_tail = t;
    atomic_store_explicit(&g->has_out, 1, memory_order_release);
    pthread_mutex_unlock(&g->out_lock);
    nccl_ring_engine(g);
}

void gpu_engine_sleeping(struct gpu *g, int v)
{
    atomic_store_explicit(&g->engine_sleeping, v, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
}

/* Fail t without the GPU: release both streams (ours may wait for ready, the client's
 * for done) and hand it back. */
void nccl_fail_task(struct gpu *g, struct gpu_task *t, int code, int comm_failed, const char *why)
{
    if (t->type == GPU_TASK_OP) {
        ring_store_max64(t->ready, t->tag);
        ring_store_max64(t->done, t->tag);
    }
    t->status = code;
    t->comm_failed = comm_failed;
    snprintf(t->why, sizeof(t->why), "%s", why);
    nccl_post(g, t);
}

/* An event to record after an op (from c's free list, else new); NULL on failure. */
cudaEvent_t nccl_fence_get(struct comm *c)
{
    if (c->nevfree) return c->evfree[--c->nevfree];
    cudaEvent_t e = NULL;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return e;
}

/* t is done with its fence: keep it for the next op (finished), or destroy it (its
 * stream may never reach it; destroying a pending event is allowed). */
void nccl_fence_put(struct comm *c, struct gpu_task *t, int finished)
{
    cudaEvent_t e = t->fence;
    t->fence = NULL;
    if (!e) return;
    if (finished && c && c->nevfree < c->capevfree) {
        c->evfree[c->nevfree++] = e;
        return;
    }
    if (finished && c) {
        int cap = c->capevfree ? 2 * c->capevfree : 16;
        cudaEvent_t *p = realloc(c->evfree, (size_t)cap * sizeof(*p));
        if (p) {
            c->evfree = p;
            c->capevfree = cap;
            c->evfree[c->nevfree++] = e;
            return;
        }
    }
    cudaEventDestroy(e);
}

void nccl_fences_free(struct comm *c)
{
    for (int i = 0; i < c->nevfree; i++)
        cudaEventDestroy(c->evfree[i]);
    free(c->evfree);
    c->evfree = NULL;
    c->nevfree = c->capevfree = 0;
}
