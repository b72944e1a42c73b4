/*
 * requests.c: coll_wait, coll_test, coll_wait_all, coll_wait_any and coll_wait_stream
 * (and _keep) over both kinds of request: one op (wait.c) or a composite one (compose.c), told
 * apart by the id. Above both; nothing below calls here.
 */
#include "lc.h"

coll_err coll_wait(coll_conn *c, coll_request req, int timeout_ms)
{
    if (!c) return lc_fail(COLL_ERR_INVALID, "NULL connection");
    if (lc_cop_is(req)) return lc_cop_wait(c, req, timeout_ms);
    return lc_wait_one(c, req, timeout_ms);
}

coll_err coll_wait_stream(coll_conn *c, coll_request req, void *stream)
{
    if (!c) return lc_fail(COLL_ERR_INVALID, "NULL connection");
    if (lc_cop_is(req)) return lc_cop_wait_stream(c, req, stream, 0);
    return lc_wait_stream(c, req, stream, 0);
}

coll_err coll_wait_stream_keep(coll_conn *c, coll_request req, void *stream)
{
    if (!c) return lc_fail(COLL_ERR_INVALID, "NULL connection");
    if (lc_cop_is(req)) return lc_cop_wait_stream(c, req, stream, 1);
    return lc_wait_stream(c, req, stream, 1);
}

coll_err coll_test(coll_conn *c, coll_request req, int *done)
{
    if (!c || !done) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    if (lc_cop_is(req)) return lc_cop_test(c, req, done);
    coll_err st = COLL_OK;
    int r = lc_try_one(c, req, &st, NULL);
    if (r < 0) return lc_fail(COLL_ERR_INVALID, "unknown or already completed request");
    *done = r;
    return r ? st : COLL_OK;
}

coll_err coll_wait_all(coll_conn *c, coll_request *reqs, size_t n, int timeout_ms)
{
    if (!c || (n && !reqs)) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    coll_err first = COLL_OK;
    int64_t deadline = timeout_ms >= 0 ? now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    for (size_t i = 0; i < n; i++) {
        int left = -1;
        if (deadline) {
            int64_t l = deadline - now_ns();
            left = l <= 0 ? 0 : (int)(l / 1000000);
        }
        coll_err st = coll_wait(c, reqs[i], left);
        if (st == COLL_ERR_TIMEOUT && deadline && now_ns() >= deadline) return st;
        if (st != COLL_OK && first == COLL_OK) first = st;
    }
    if (first != COLL_OK) lc_fail(first, "at least one op failed: %s", coll_strerror(first));
    return first;
}

coll_err coll_wait_any(coll_conn *c, const coll_request *reqs, size_t n, size_t *index,
                       int timeout_ms)
{
    if (!c || !reqs || !index) return lc_fail(COLL_ERR_INVALID, "NULL argument");
    if (n == 0) return lc_fail(COLL_ERR_INVALID, "no requests to wait for");
    int64_t deadline = timeout_ms > 0 ? now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    for (;;) {
        int direct = 0, spans = 0;
        for (size_t i = 0; i < n; i++) {
            coll_err st = COLL_OK;
            if (lc_cop_is(reqs[i])) { /* a child across pods' op: its parts looked at */
                int d = 0;
                st = lc_cop_test(c, reqs[i], &d);
                if (!d && st != COLL_OK)
                    return lc_fail(COLL_ERR_INVALID, "request %zu: unknown or already completed",
                                   i);
                if (d) {
                    *index = i;
                    return st;
                }
                spans = 1;
                continue;
            }
            int pending_direct = 0;
            int r = lc_try_one(c, reqs[i], &st, &pending_direct);
            direct |= pending_direct;
            if (r < 0)
                return lc_fail(COLL_ERR_INVALID, "request %zu: unknown or already completed", i);
            if (r > 0) {
                *index = i;
                return st;
            }
        }
        int64_t now = now_ns();
        if (timeout_ms == 0 || (deadline && now >= deadline))
            return lc_fail(COLL_ERR_TIMEOUT, "none of %zu requests completed within %d ms", n,
                           timeout_ms);
        /* direct ops move only when this thread moves them: a millisecond at most */
        int64_t until = deadline;
        if (direct && (!until || until > now + 1000000)) until = now + 1000000;
        if (!spans) {
            lc_sleep_for_completion(c, until, reqs, n);
            continue;
        }
        /* sleep on the parts of the composite requests, and the others */
        coll_request parts[WIRE_RING_ENTRIES];
        size_t k = 0;
        for (size_t i = 0; i < n && k < WIRE_RING_ENTRIES; i++)
            if (lc_cop_is(reqs[i]))
                k += lc_cop_subs(c, reqs[i], parts + k, WIRE_RING_ENTRIES - k);
            else
                parts[k++] = reqs[i];
        lc_sleep_for_completion(c, until, parts, k);
    }
}
