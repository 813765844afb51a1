/* libFuzzer harness: the check a receiver applies to an incoming message
 * header (comm/message_header.c). The input is the header's bytes as
 * they arrive, then the receive's side: what it expects (as pt_recv allows
 * it), the job, the peer, its capacity; then payload bytes to checksum (the
 * last one's low bit: whether the receive takes device payloads). A header
 * that passes promises a payload that fits the buffer and matches its shape,
 * and a device payload only to a receive that takes one. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "comm/message_header.h"
#include "runtime/safetensors.h"

typedef struct receive_side {
    pt_recv_expect expect;
    uint32_t job;
    int32_t peer;
    uint32_t capacity;
} receive_side;

/* What an accepted header promises. */
static void check_accepted(const pt_message_header *h, const pt_header_check *check)
{
    uint64_t numel = 1;
    for (int d = 0; d < h->ndim; d++) numel *= (uint64_t)h->shape[d];
    FUZZ_CHECK(h->ndim >= 0 && h->ndim <= PT_MESSAGE_MAX_DIMS && h->dtype < PT_DTYPE_COUNT);
    FUZZ_CHECK(h->nbytes == numel * pt_dtype_size(h->dtype) && h->nbytes <= check->capacity);
    FUZZ_CHECK(h->kind == check->expect->kind && h->src_rank == check->peer);
    FUZZ_CHECK(!(h->flags & ~(uint32_t)PT_MESSAGE_KNOWN_FLAGS));
    if (h->flags & PT_MESSAGE_DEVICE_PAYLOAD)
        FUZZ_CHECK(check->takes_device && h->nbytes > PT_TRANSPORT_INLINE_BYTES);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pt_message_header header;
    receive_side side;
    if (size < sizeof header + sizeof side) return 0;
    memcpy(&header, data, sizeof header);
    memcpy(&side, data + sizeof header, sizeof side);
    if (side.expect.ndim > PT_MESSAGE_MAX_DIMS) /* pt_recv refuses more */
        side.expect.ndim = PT_MESSAGE_MAX_DIMS;
    const size_t used = sizeof header + sizeof side;
    const pt_header_check check = {side.job, side.peer, side.capacity, &side.expect,
                                   size > used && (data[size - 1] & 1)};
    char why[256];
    memset(why, 'x', sizeof why);
    if (pt_message_header_acceptable(&header, &check, why, sizeof why))
        check_accepted(&header, &check);
    else
        FUZZ_CHECK(memchr(why, '\0', sizeof why) != NULL && why[0] != '\0');
    FUZZ_CHECK(pt_checksum64(data + used, size - used) != 0);
    return 0;
}
