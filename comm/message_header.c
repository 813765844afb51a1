#include "comm/message_header.h"

#include <stdio.h>

#include "runtime/safetensors.h"

static void format_shape(char *out, size_t capacity, int32_t ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(out, capacity, "[");
    for (int32_t d = 0; d < ndim && d < PT_MESSAGE_MAX_DIMS && used < capacity; d++)
        used += (size_t)snprintf(out + used, capacity - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < capacity) snprintf(out + used, capacity - used, "]");
}

/* The checks in the order a reader would ask them. */
int pt_message_header_acceptable(const pt_message_header *h, const pt_header_check *check,
                                 char *why, size_t capacity)
{
    const pt_recv_expect *e = check->expect;
    char got[96], want[96];
    if (h->magic != PT_MESSAGE_MAGIC)
        return snprintf(why, capacity, "magic: 0x%08x is not a pipert message", h->magic), 0;
    if (h->version != PT_MESSAGE_VERSION)
        return snprintf(why, capacity, "version: %u, this build speaks %u", h->version,
                        PT_MESSAGE_VERSION),
               0;
    if (h->job != check->job)
        return snprintf(why, capacity, "job: %u is not this job (%u)", h->job, check->job), 0;
    if (h->src_rank != check->peer)
        return snprintf(why, capacity, "src_rank: %d in a message from rank %d", h->src_rank,
                        check->peer),
               0;
    if (h->kind != e->kind)
        return snprintf(why, capacity, "kind: %u, expected %u", h->kind, e->kind), 0;
    if (h->dtype >= PT_DTYPE_COUNT)
        return snprintf(why, capacity, "dtype: %u is not a dtype", h->dtype), 0;
    if (e->dtype >= 0 && h->dtype != e->dtype)
        return snprintf(why, capacity, "dtype: %s, expected %s", pt_dtype_name(h->dtype),
                        pt_dtype_name(e->dtype)),
               0;
    if (h->ndim < 0 || h->ndim > PT_MESSAGE_MAX_DIMS)
        return snprintf(why, capacity, "ndim: %d is outside 0..%d", h->ndim, PT_MESSAGE_MAX_DIMS),
               0;
    format_shape(got, sizeof got, h->ndim, h->shape);
    uint64_t numel = 1;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] < 0)
            return snprintf(why, capacity, "shape: %s has a negative size", got), 0;
        if (h->shape[d] && numel > UINT64_MAX / (uint64_t)h->shape[d])
            return snprintf(why, capacity, "shape: %s overflows", got), 0;
        numel *= (uint64_t)h->shape[d];
    }
    if (e->ndim >= 0) {
        int same = h->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = h->shape[d] == e->shape[d];
        format_shape(want, sizeof want, e->ndim, e->shape);
        if (!same) return snprintf(why, capacity, "shape: %s, expected %s", got, want), 0;
    }
    size_t element = pt_dtype_size(h->dtype);
    if (numel > UINT64_MAX / element || h->nbytes != numel * element)
        return snprintf(why, capacity, "nbytes: %llu does not match shape %s of %s",
                        (unsigned long long)h->nbytes, got, pt_dtype_name(h->dtype)),
               0;
    if (h->nbytes > check->capacity)
        return snprintf(why, capacity, "nbytes: %llu exceeds the %zu bytes this receive allows",
                        (unsigned long long)h->nbytes, check->capacity),
               0;
    if (h->flags & ~(uint32_t)PT_MESSAGE_KNOWN_FLAGS)
        return snprintf(why, capacity, "flags: 0x%x has bits this build does not know", h->flags),
               0;
    const int device = (h->flags & PT_MESSAGE_DEVICE_PAYLOAD) != 0;
    if (device && !check->takes_device)
        return snprintf(why, capacity, "flags: a payload in the sender's device memory, and this "
                                       "receive takes bytes"),
               0;
    if (device && h->nbytes <= PT_TRANSPORT_INLINE_BYTES)
        return snprintf(why, capacity, "flags: a device payload of %llu bytes (more than %d go "
                                       "as device payloads)",
                        (unsigned long long)h->nbytes, PT_TRANSPORT_INLINE_BYTES),
               0;
    /* A device payload's bytes never reach a host: nothing can hash them. */
    if (e->require_checksum && h->checksum == 0 && h->nbytes > 0 && !device)
        return snprintf(why, capacity, "checksum: none, and this receive requires one"), 0;
    return 1;
}

