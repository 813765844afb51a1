/* Messages: the payload checksum; sending (header and payload in one tagged message, or a
 * header message and then a payload message under a sibling tag); receiving, where the header
 * is checked against the receive's expectation before the payload is trusted; and pt_send,
 * pt_send_raw, pt_recv. Between processes of one host the payload part may be a direct-read
 * descriptor instead (transport_direct.c). */
#include "comm/transport_internal.h"
#include "comm/transport_connect.h"
#include "comm/transport_device.h"
#include "comm/transport_direct.h"
#include "comm/transport_mac.h"
#include "comm/transport_progress.h"
#include "comm/transport_request.h"
#include "comm/transport_send_recv.h"
#include "comm/message_header.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include "runtime/safetensors.h"

/* ---- checksum ------------------------------------------------------------ */

static const uint64_t prime1 = 0x9E3779B185EBCA87ull, prime2 = 0xC2B2AE3D27D4EB4Full,
                      prime3 = 0x165667B19E3779F9ull, prime4 = 0x85EBCA77C2B2AE63ull,
                      prime5 = 0x27D4EB2F165667C5ull;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t lane_round(uint64_t acc, uint64_t input)
{
    return rotl64(acc + input * prime2, 31) * prime1;
}

uint64_t pt_checksum64(const void *data, size_t nbytes)
{
    const unsigned char *p = data, *end = p + nbytes;
    uint64_t h;
    if (nbytes >= 32) {
        uint64_t v[4] = {prime1 + prime2, prime2, 0, -prime1};
        for (; end - p >= 32; p += 32)
            for (int lane = 0; lane < 4; lane++)
                v[lane] = lane_round(v[lane], read64(p + 8 * lane));
        h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
        for (int lane = 0; lane < 4; lane++) h = (h ^ lane_round(0, v[lane])) * prime1 + prime4;
    } else {
        h = prime5;
    }
    h += (uint64_t)nbytes;
    for (; end - p >= 8; p += 8) h = rotl64(h ^ lane_round(0, read64(p)), 27) * prime1 + prime4;
    for (; p < end; p++) h = rotl64(h ^ (*p * prime5), 11) * prime1;
    h ^= h >> 33;
    h *= prime2;
    h ^= h >> 29;
    h *= prime3;
    h ^= h >> 32;
    return h ? h : 1; /* 0 means "no checksum" in a header */
}

/* ---- messages: sending --------------------------------------------------- */

static void on_send_part_done(void *request, ucs_status_t status, void *user_data);

void pt_transport_send_part_finished(pt_request *r, ucs_status_t status)
{
    if (status != UCS_OK) {
        char what[96];
        pt_transport_describe_request(r, what, sizeof what);
        pt_transport_record_failure(r, PIPERT_ERR_PEER, "%s failed: %s", what,
                                    ucs_status_string(status));
    }
    if (--r->ops_pending == 0) pt_transport_complete_request(r);
}

static void on_send_part_done(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    pt_transport_send_part_finished(user_data, status);
}

void pt_transport_send_part(pt_request *r, ucp_ep_h ep, const void *buffer, size_t count, int iov,
                            int part)
{
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.send = on_send_part_done,
        .user_data = r,
        .datatype = iov ? UCP_DATATYPE_IOV : ucp_dt_make_contig(1),
    };
    r->ops_pending++;
    ucs_status_ptr_t op = ucp_tag_send_nbx(
        ep, buffer, count, pt_transport_make_tag(r->kind, r->t->rank, part, r->user_tag), &param);
    if (op == NULL || UCS_PTR_IS_ERR(op))
        pt_transport_send_part_finished(r, op ? UCS_PTR_STATUS(op) : UCS_OK);
}

void pt_transport_post_send(pt_transport *t, pt_request *r)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer_state state = pt_transport_peer_state_locked(t, r->peer);
    connection *c = state == PEER_ALIVE ? t->peers[r->peer].conn : NULL;
    int reads_us = state == PEER_ALIVE && t->peers[r->peer].reads_us;
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "%s", t->peers[r->peer].reason);
    pthread_mutex_unlock(&pt_transport_state_lock);
    char what[96];
    pt_transport_describe_request(r, what, sizeof what);
    if (!c || !c->ep) {
        if (state == PEER_DEAD || state == PEER_LEFT)
            pt_transport_fail_request(r, PIPERT_ERR_PEER, "%s: rank %d %s: %s", what, r->peer,
                                      state == PEER_LEFT ? "has left" : "failed", reason);
        else
            pt_transport_fail_request(r, PIPERT_ERR_PEER, "%s: rank %d is not connected", what,
                                      r->peer);
        return;
    }
    pt_transport_in_flight_add(t, r);
    /* Hold one count while posting so that a part finishing at once cannot complete the request
     * early. */
    r->ops_pending = 1;
    uint64_t nbytes = r->header.nbytes;
    if (r->device_payload) {
        pt_transport_send_device_descriptor(t, r, c->ep);
    } else if (nbytes > 0 && nbytes <= PT_TRANSPORT_INLINE_BYTES) {
        r->iov[0] = (ucp_dt_iov_t){&r->header, sizeof r->header};
        r->iov[1] = (ucp_dt_iov_t){(void *)r->payload, (size_t)nbytes};
        pt_transport_send_part(r, c->ep, r->iov, 2, 1, PART_HEADER);
    } else if (reads_us && nbytes >= DIRECT_MIN_BYTES) {
        pt_transport_send_direct(t, r, c->ep);
    } else {
        pt_transport_send_part(r, c->ep, &r->header, sizeof r->header, 0, PART_HEADER);
        if (nbytes > 0)
            pt_transport_send_part(r, c->ep, r->payload, (size_t)nbytes, 0, PART_PAYLOAD);
    }
    pt_transport_send_part_finished(r, UCS_OK);
}

/* ---- messages: receiving ------------------------------------------------- */

static void on_recv_part_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                              void *user_data);
static void header_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info);
static void payload_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info);

/* Posts one receive of r's under `tag`; `arrived` runs when it completes, at once or later. */
void pt_transport_post_part_receive(pt_request *r, ucp_tag_t tag, void *buffer, size_t count,
                                    int iov, arrival_fn arrived)
{
    pt_transport *t = r->t;
    /* No immediate completion: UCX 1.13 leaves recv_info unfilled when an
     * IOV receive completes at once, so every completion comes through the
     * callback (which may run inside ucp_tag_recv_nbx: see on_recv_part_done). */
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = on_recv_part_done,
        .user_data = r,
        .datatype = iov ? UCP_DATATYPE_IOV : ucp_dt_make_contig(1),
    };
    r->arrived = arrived;
    r->posting = 1;
    r->completed_in_post = 0;
    ucs_status_ptr_t op = ucp_tag_recv_nbx(t->worker, buffer, count, tag, ~(ucp_tag_t)0, &param);
    r->posting = 0;
    if (r->completed_in_post || op == NULL || UCS_PTR_IS_ERR(op)) {
        ucs_status_t status = r->completed_in_post ? r->completed_status
                              : op                 ? UCS_PTR_STATUS(op)
                                                   : UCS_ERR_NO_PROGRESS;
        arrived(r, status, &r->info);
        return;
    }
    r->op = op;
    /* A message from a peer that is already gone may still be waiting in
     * UCX's unexpected queue: we posted first, so it is delivered; if it
     * was not there, nothing more will come. */
    pthread_mutex_lock(&pt_transport_state_lock);
    peer_state state = pt_transport_peer_state_locked(t, r->peer);
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "rank %d %s: %s", r->peer,
                 state == PEER_LEFT ? "has left" : "failed", t->peers[r->peer].reason);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (reason[0] && r->op) {
        r->cancel_result = PIPERT_ERR_PEER;
        snprintf(r->cancel_reason, sizeof r->cancel_reason, "%s", reason);
        ucp_request_cancel(t->worker, r->op);
    }
}

/* Posts the header or payload part of a receive. */
static void recv_part(pt_request *r, void *buffer, size_t count, int iov, int part)
{
    r->part = part;
    pt_transport_post_part_receive(r, pt_transport_make_tag(r->kind, r->peer, part, r->user_tag),
                                   buffer, count, iov,
                                   part == PART_HEADER ? header_arrived : payload_arrived);
}

static void on_recv_part_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                              void *user_data)
{
    pt_request *r = user_data;
    ucp_request_free(request);
    if (status == UCS_OK) r->info = *info;
    if (r->posting) {
        /* Finish in pt_transport_post_part_receive, after ucp_tag_recv_nbx returned. */
        r->completed_in_post = 1;
        r->completed_status = status;
        return;
    }
    r->op = NULL;
    r->arrived(r, status, info);
}

static int receive_failed_status(pt_request *r, ucs_status_t status, const char *part_name)
{
    if (status == UCS_OK) return 0;
    char what[96];
    pt_transport_describe_request(r, what, sizeof what);
    if (status == UCS_ERR_CANCELED && r->cancel_reason[0])
        pt_transport_fail_request(r, r->cancel_result, "%s: %s", what, r->cancel_reason);
    else if (status == UCS_ERR_MESSAGE_TRUNCATED)
        pt_transport_fail_request(
            r, PIPERT_ERR_PEER,
            "%s: nbytes: the %s is longer than the %zu bytes this receive allows", what, part_name,
            r->capacity);
    else
        pt_transport_fail_request(r, PIPERT_ERR_PEER, "%s: %s", what, ucs_status_string(status));
    return 1;
}

/* Drains the payload of a refused header so it neither lingers in UCX nor
 * matches a later receive: a receive with no room for it truncates it away. */
static void discard_payload(pt_request *r)
{
    pt_request *d = calloc(1, sizeof *d);
    if (!d) return;
    d->t = r->t;
    d->type = REQUEST_DISCARD;
    d->peer = r->peer;
    d->kind = r->kind;
    d->user_tag = r->user_tag;
    pt_transport_in_flight_add(r->t, d);
    /* Room for a descriptor only (either kind): it is answered (so its sender's send ends); a
     * real payload is longer and truncated away. */
    recv_part(d, &d->device, sizeof d->device, 0, PART_PAYLOAD);
}

void pt_transport_finish_receive(pt_request *r)
{
    const pt_message_header *h = &r->header;
    char why[TEXT_CAPACITY];
    if (!pt_transport_mac_check(r->t, r->peer, h, r->buffer, why, sizeof why)) {
        char what[96];
        pt_transport_describe_request(r, what, sizeof what);
        pt_transport_fail_request(r, PIPERT_ERR_PEER, "%s: refused: %s", what, why);
        return;
    }
    if (h->checksum && h->nbytes) {
        uint64_t actual = pt_checksum64(r->buffer, (size_t)h->nbytes);
        if (actual != h->checksum) {
            char what[96];
            pt_transport_describe_request(r, what, sizeof what);
            pt_transport_fail_request(
                r, PIPERT_ERR_PEER,
                "%s: checksum: the payload hashes to 0x%016llx, the header says 0x%016llx", what,
                (unsigned long long)actual, (unsigned long long)h->checksum);
            return;
        }
    }
    pt_transport_complete_request(r);
}

static void header_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info)
{
    if (receive_failed_status(r, status, "message")) return;
    char what[96], why[TEXT_CAPACITY];
    pt_transport_describe_request(r, what, sizeof what);
    if (info->length < sizeof r->header) {
        pt_transport_fail_request(r, PIPERT_ERR_PEER,
                                  "%s: a %zu-byte message is shorter than a header", what,
                                  info->length);
        return;
    }
    const pt_header_check check = {r->t->job, r->peer, r->capacity, &r->expect,
                                   r->device_buffer != NULL && r->t->device != NULL};
    if (!pt_message_header_acceptable(&r->header, &check, why, sizeof why)) {
        if (r->header.nbytes > PT_TRANSPORT_INLINE_BYTES) discard_payload(r);
        pt_transport_fail_request(r, PIPERT_ERR_PEER, "%s: refused: %s", what, why);
        return;
    }
    uint64_t nbytes = r->header.nbytes;
    if (nbytes <= PT_TRANSPORT_INLINE_BYTES) {
        if (info->length != sizeof r->header + nbytes) {
            pt_transport_fail_request(
                r, PIPERT_ERR_PEER, "%s: nbytes: the header says %llu but %zu payload bytes came",
                what, (unsigned long long)nbytes, info->length - sizeof r->header);
            return;
        }
        pt_transport_finish_receive(r);
        return;
    }
    if (info->length != sizeof r->header) {
        pt_transport_fail_request(
            r, PIPERT_ERR_PEER, "%s: nbytes: %llu should travel apart from the header, not inline",
            what, (unsigned long long)nbytes);
        return;
    }
    recv_part(r, r->buffer, (size_t)nbytes, 0, PART_PAYLOAD);
}

static void payload_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info)
{
    if (r->type == REQUEST_DISCARD) {
        if (status == UCS_OK && info->length == sizeof r->descriptor)
            memcpy(&r->descriptor, &r->device, sizeof r->descriptor);
        if (status == UCS_OK && pt_transport_is_descriptor(&r->descriptor, info->length))
            pt_transport_acknowledge(r->t, r->peer, r->descriptor.ack_id, ACK_REFUSED);
        if (status == UCS_OK && pt_transport_is_device_descriptor(&r->device, info->length))
            pt_transport_acknowledge(r->t, r->peer, r->device.ack_id, ACK_REFUSED);
        pt_transport_complete_request(r);
        return;
    }
    if (receive_failed_status(r, status, "payload")) return;
    /* A separate payload is longer than PT_TRANSPORT_INLINE_BYTES: a descriptor-sized one is a
     * descriptor (or a lie, refused below as before). */
    if (info->length == sizeof r->descriptor) {
        memcpy(&r->descriptor, r->buffer, sizeof r->descriptor);
        if (pt_transport_is_descriptor(&r->descriptor, info->length)) {
            pt_transport_read_directly(r);
            return;
        }
    }
    if (info->length == sizeof r->device) {
        memcpy(&r->device, r->buffer, sizeof r->device);
        if (pt_transport_is_device_descriptor(&r->device, info->length)) {
            pt_transport_copy_from_peer(r);
            return;
        }
    }
    if (r->header.flags & PT_MESSAGE_DEVICE_PAYLOAD) {
        char what[96];
        pt_transport_describe_request(r, what, sizeof what);
        pt_transport_fail_request(r, PIPERT_ERR_PEER,
                                  "%s: flags: a device payload, but %zu bytes came in place of "
                                  "its descriptor", what, info->length);
        return;
    }
    if (info->length != r->header.nbytes) {
        char what[96];
        pt_transport_describe_request(r, what, sizeof what);
        pt_transport_fail_request(r, PIPERT_ERR_PEER,
                                  "%s: nbytes: the header says %llu but the payload has %zu", what,
                                  (unsigned long long)r->header.nbytes, info->length);
        return;
    }
    pt_transport_finish_receive(r);
}

void pt_transport_post_receive(pt_transport *t, pt_request *r)
{
    pt_transport_in_flight_add(t, r);
    size_t inline_room =
        r->capacity < PT_TRANSPORT_INLINE_BYTES ? r->capacity : PT_TRANSPORT_INLINE_BYTES;
    r->iov[0] = (ucp_dt_iov_t){&r->header, sizeof r->header};
    r->iov[1] = (ucp_dt_iov_t){r->buffer, inline_room};
    recv_part(r, r->iov, inline_room ? 2 : 1, 1, PART_HEADER);
}

/* Fails every receive from `rank` (every rank if < 0) that is still waiting in UCX. */
void pt_transport_cancel_receives_from(pt_transport *t, int rank, pipert_result code,
                                       const char *reason)
{
    /* Cancelling may complete (and unlink) a request at once: step before it. */
    pt_request *next;
    for (pt_request *r = t->in_flight; r; r = next) {
        next = r->next;
        /* Receives, and direct sends waiting for their answer. */
        if ((rank >= 0 && r->peer != rank) || !r->op) continue;
        r->cancel_result = code;
        snprintf(r->cancel_reason, sizeof r->cancel_reason, "%s", reason);
        ucp_request_cancel(t->worker, r->op);
    }
}

/* ---- the API ------------------------------------------------------------- */

static pipert_result check_peer_argument(const pt_transport *t, int rank, const char *what)
{
    if (rank < 0 || rank >= PT_TRANSPORT_MAX_RANKS || rank == t->rank)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: rank %d is not a peer of rank %d", what, rank,
                       t->rank);
    return PIPERT_OK;
}

static pipert_result check_kind(unsigned kind, const char *what)
{
    if (kind < 1 || kind > PT_KIND_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: kind %u is outside 1..%d", what, kind,
                       PT_KIND_MAX);
    return PIPERT_OK;
}

static pipert_result new_request(pt_transport *t, request_type type, int peer_rank,
                                 uint32_t user_tag, unsigned kind, pt_request **out)
{
    pt_request *r = calloc(1, sizeof *r);
    if (!r) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a request");
    r->t = t;
    r->type = type;
    r->peer = peer_rank;
    r->user_tag = user_tag;
    r->kind = (uint16_t)kind;
    r->state = REQUEST_PENDING;
    *out = r;
    return PIPERT_OK;
}

static bool is_remote(const pt_transport *t, int rank)
{
    return t->remote_peers && (t->remote_peers[rank / 8] >> (rank % 8) & 1);
}

static void count_sent(pt_transport *t, int rank, uint64_t bytes)
{
    atomic_fetch_add(is_remote(t, rank) ? &t->bytes_remote : &t->bytes_local, bytes);
}

pipert_result pt_transport_mark_remote(pt_transport *t, int rank)
{
    PT_TRY(check_peer_argument(t, rank, "pt_transport_mark_remote"));
    if (!t->remote_peers) t->remote_peers = calloc(PT_TRANSPORT_MAX_RANKS / 8, 1);
    if (!t->remote_peers) return pt_fail(PIPERT_ERR_NOMEM, "transport: out of memory");
    t->remote_peers[rank / 8] |= (uint8_t)(1u << (rank % 8));
    return PIPERT_OK;
}

void pt_transport_bytes_sent(pt_transport *t, uint64_t *local, uint64_t *remote)
{
    *local = atomic_load(&t->bytes_local);
    *remote = atomic_load(&t->bytes_remote);
}

/* Submits a send of `header` exactly as given, its payload in host memory or (device) in
 * device memory. */
pipert_result pt_transport_submit_send(pt_transport *t, int dst_rank, uint32_t user_tag,
                                       const pt_message_header *header, const void *payload,
                                       const pt_peer_memory *device, pt_request **out)
{
    *out = NULL;
    PT_TRY(check_peer_argument(t, dst_rank, "pt_send"));
    PT_TRY(check_kind(header->kind, "pt_send"));
    if (header->nbytes > 0 && !payload)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: %llu bytes to send but no payload",
                       (unsigned long long)header->nbytes);
    pt_request *r = NULL;
    PT_TRY(new_request(t, REQUEST_SEND, dst_rank, user_tag, header->kind, &r));
    r->header = *header;
    r->payload = payload;
    if (device) {
        r->device_payload = 1;
        r->device.memory = *device;
    }
    count_sent(t, dst_rank, header->nbytes);
    return pt_transport_submit(t, r, out);
}

pipert_result pt_send_raw(pt_transport *t, int dst_rank, uint32_t user_tag,
                          const pt_message_header *header, const void *payload, pt_request **out)
{
    return pt_transport_submit_send(t, dst_rank, user_tag, header, payload, NULL, out);
}

pipert_result pt_transport_wire_header(pt_transport *t, const pt_message_header *header,
                                       pt_message_header *wire)
{
    if (header->dtype >= PT_DTYPE_COUNT)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: dtype %u is not a dtype", header->dtype);
    if (header->ndim < 0 || header->ndim > PT_MESSAGE_MAX_DIMS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: ndim %d is outside 0..%d", header->ndim,
                       PT_MESSAGE_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < header->ndim; d++) {
        if (header->shape[d] < 0)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: shape[%d] is negative", d);
        if (__builtin_mul_overflow(numel, (uint64_t)header->shape[d], &numel))
            return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: the shape overflows");
    }
    if (header->nbytes != numel * pt_dtype_size(header->dtype))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "pt_send: nbytes %llu is not the %llu bytes of its shape",
                       (unsigned long long)header->nbytes,
                       (unsigned long long)(numel * pt_dtype_size(header->dtype)));
    /* A fresh header (padding zeroed), with the fields the transport owns. */
    memset(wire, 0, sizeof *wire);
    wire->magic = PT_MESSAGE_MAGIC;
    wire->version = PT_MESSAGE_VERSION;
    wire->kind = header->kind;
    wire->dtype = header->dtype;
    wire->job = t->job;
    wire->replica = header->replica;
    wire->stage = header->stage;
    wire->microbatch = header->microbatch;
    wire->src_rank = t->rank;
    wire->step = header->step;
    wire->weight_version = header->weight_version;
    wire->ndim = header->ndim;
    for (int d = 0; d < header->ndim; d++) wire->shape[d] = header->shape[d];
    wire->nbytes = header->nbytes;
    return PIPERT_OK;
}

pipert_result pt_send(pt_transport *t, int dst_rank, uint32_t user_tag,
                      const pt_message_header *header, const void *payload, unsigned flags,
                      pt_request **out)
{
    *out = NULL;
    pt_message_header wire;
    PT_TRY(pt_transport_wire_header(t, header, &wire));
    wire.checksum =
        (flags & PT_SEND_CHECKSUM) && header->nbytes ? pt_checksum64(payload, header->nbytes) : 0;
    PT_TRY(check_peer_argument(t, dst_rank, "pt_send"));
    PT_TRY(pt_transport_mac_sign(t, dst_rank, &wire, payload));
    return pt_send_raw(t, dst_rank, user_tag, &wire, payload, out);
}

pipert_result pt_recv(pt_transport *t, int src_rank, uint32_t user_tag,
                      const pt_recv_expect *expect, void *buffer, size_t capacity, pt_request **out)
{
    return pt_transport_submit_receive(t, src_rank, user_tag, expect, buffer, NULL, capacity, out);
}

pipert_result pt_transport_submit_receive(pt_transport *t, int src_rank, uint32_t user_tag,
                                          const pt_recv_expect *expect, void *buffer,
                                          void *device_buffer, size_t capacity, pt_request **out)
{
    *out = NULL;
    PT_TRY(check_peer_argument(t, src_rank, "pt_recv"));
    PT_TRY(check_kind(expect->kind, "pt_recv"));
    if (expect->ndim > PT_MESSAGE_MAX_DIMS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_recv: expected ndim %d is above %d",
                       expect->ndim, PT_MESSAGE_MAX_DIMS);
    if (capacity > 0 && !buffer)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_recv: capacity %zu but no buffer", capacity);
    pt_request *r = NULL;
    PT_TRY(new_request(t, REQUEST_RECV, src_rank, user_tag, expect->kind, &r));
    r->expect = *expect;
    r->buffer = buffer;
    r->device_buffer = device_buffer;
    r->capacity = capacity;
    return pt_transport_submit(t, r, out);
}
