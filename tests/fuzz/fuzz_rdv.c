/*
 * fuzz_rdv.c: what peers send (agent/rdv_wire.c): rendezvous frames, data-plane
 * challenges, hellos and welcomes, and send headers, on arbitrary bytes.
 */
#include <stdint.h>
#include <string.h>

#include "rdv_wire.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static union rdv_msg m;
    char why[200];
    if (rdv_decode(data, size, &m, why, sizeof(why)) == 0 && rdv_size(&m) != size)
        __builtin_trap(); /* accepted a frame whose size disagrees with its contents */
    struct data_hello h;
    struct data_challenge c;
    struct data_welcome w;
    struct data_op_hdr o;
    memset(&h, 0, sizeof(h));
    memset(&c, 0, sizeof(c));
    memset(&w, 0, sizeof(w));
    memset(&o, 0, sizeof(o));
    memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
    memcpy(&c, data, size < sizeof(c) ? size : sizeof(c));
    memcpy(&w, data, size < sizeof(w) ? size : sizeof(w));
    memcpy(&o, data, size < sizeof(o) ? size : sizeof(o));
    data_hello_check(&h, why, sizeof(why));
    data_challenge_check(&c, why, sizeof(why));
    if (data_welcome_check(&w, &h, size > 3 ? data[3] : 0, why, sizeof(why)) == 0 &&
        (w.channel != h.channel || w.epoch != h.epoch || w.inc != h.inc))
        __builtin_trap(); /* took a welcome that answers another hello */
    uint64_t bytes;
    uint32_t nlocal = size ? data[0] : 1;
    if (data_send_hdr_check(&o, nlocal, size > 1 ? data[1] : 0, size > 2 ? data[2] : 0, &bytes, why,
                            sizeof(why)) == 0 &&
        (bytes > (1ull << 40) || (bytes && (o.kind != WIRE_OP_SEND || o.redop == P2P_RTS))))
        __builtin_trap(); /* a payload past 1 TiB, or on a frame that carries none */
    return 0;
}
