/*
 * fuzz_wire.c: the local plane's decoders (libcoll/src/wire.c) on arbitrary bytes: a
 * control message, then the same bytes as a ring entry (range check and extents).
 * Whatever a client writes, they return a verdict without reading out of bounds.
 */
#include <stdint.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    union wire_msg m;
    char err[160];
    unsigned version;
    if (wire_decode(data, size, &m, &version, err, sizeof(err)) == 0 &&
        m.h.len != wire_size(m.h.type))
        __builtin_trap(); /* accepted with a length that disagrees with its type */
    struct wire_sqe q;
    memset(&q, 0, sizeof(q));
    memcpy(&q, data, size < sizeof(q) ? size : sizeof(q));
    if (wire_sqe_check(&q, err, sizeof(err)) == 0) {
        uint64_t e;
        for (uint32_t world = 1; world <= 4096; world *= 8) {
            wire_sqe_extent(&q, 0, world, &e);
            wire_sqe_extent(&q, 1, world, &e);
        }
    }
    return 0;
}
