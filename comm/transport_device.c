/* Same-host device payloads (transport.h, "Device payloads"): a tensor in a
 * worker's device memory goes to a worker of the same host as a descriptor
 * naming that memory (runtime/peer_memory.h), and the receiver copies it
 * device to device with its kernel table's peer_copy. No byte passes through
 * a host, so nothing is checksummed.
 *
 * The offer. Once the session hands over its table's peer functions
 * (pt_transport_use_device_memory), this side tells every peer whose memory it
 * can read (the direct-read probe of the hello passed: same kernel, and ptrace
 * rules let us) CONTROL_DEVICE_OK | hash(kind), and so every peer that
 * connects later. A sender whose own kind hashes the same may then send it
 * device descriptors. The sender learns the offer asynchronously, so a
 * receive posted for a device payload (pt_recv_device) also takes the
 * message as bytes, into its host buffer.
 *
 * The exchange is that of direct reads (transport_direct.c): the header (flag
 * PT_MESSAGE_DEVICE_PAYLOAD), then a device_descriptor under the payload's
 * tag; the receiver copies and answers under kind 0 with the ack id, and only
 * the answer completes the send. A peer that failed or left before the copy
 * is not copied from (its memory may be reused by now). */
#include "comm/transport_internal.h"
#include "comm/transport_connect.h"
#include "comm/transport_device.h"
#include "comm/transport_direct.h"
#include "comm/transport_progress.h"
#include "comm/transport_request.h"
#include "comm/transport_send_recv.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime/log.h"

#define DEVICE_MAGIC 0x56445450u /* "PTDV": a device_descriptor */

/* The control word that offers copies of device memory of `kind`. */
static uint32_t offer_word(const char *kind)
{
    uint32_t h = 2166136261u; /* FNV-1a, folded to 16 bits */
    for (const char *p = kind; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    return CONTROL_DEVICE_OK | ((h ^ h >> 16) & 0xffffu);
}

/* ---- the offer ----------------------------------------------------------- */

/* Under ucx_lock: tells c's peer we copy its device memory, if we use device memory and can
 * read its memory. */
void pt_transport_offer_device_copies(connection *c)
{
    pt_transport *t = c->t;
    if (!t->device) return;
    pthread_mutex_lock(&pt_transport_state_lock);
    const int readable = pt_transport_peer_state_locked(t, c->rank) == PEER_ALIVE &&
                         t->peers[c->rank].read_pid > 0;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (readable) pt_transport_send_control(c, t->device_word);
}

void pt_transport_use_device_memory(pt_transport *t, const pt_device_memory *d)
{
    if (!d || !d->kind || !d->export_memory || !d->copy_from_peer) return;
    if (t->authenticate_messages || !t->direct_allowed) {
        pt_debug("transport: device payloads stay off (%s)",
                 t->authenticate_messages ? "every message's bytes are authenticated"
                                          : "UCX_TLS keeps same-host copies off");
        return;
    }
    pt_transport_ucx_lock_acquire(t);
    pthread_mutex_lock(&pt_transport_state_lock);
    t->device = d;
    t->device_word = offer_word(d->kind);
    pthread_mutex_unlock(&pt_transport_state_lock);
    /* Peers connected so far: those that connect later hear it in their handshake. */
    for (connection *c = t->connections; c; c = c->next)
        if (c->state == CONN_READY && c->ep && !c->peer_left) pt_transport_offer_device_copies(c);
    pt_transport_ucx_lock_release(t);
    pt_transport_wake_progress_thread(t);
}

/* The peer on c offers to copy our device memory of the kind `word` names. */
void pt_transport_peer_copies_device(connection *c, uint32_t word)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(c->t, c->rank);
    if (p) p->copies_our_device = word;
    const int same_kind = word == c->t->device_word;
    pthread_mutex_unlock(&pt_transport_state_lock);
    pt_debug("transport: %s copies device memory from this process%s", c->who,
             same_kind ? "" : " (of another kind than ours: not used)");
}

int pt_transport_peer_copies_device_memory(pt_transport *t, int rank)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    const int yes = t->device_word && pt_transport_peer_state_locked(t, rank) == PEER_ALIVE &&
                    t->peers[rank].copies_our_device == t->device_word;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return yes;
}

int pt_transport_copies_device_memory_from(pt_transport *t, int rank)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    const int yes = t->device && pt_transport_peer_state_locked(t, rank) == PEER_ALIVE &&
                    t->peers[rank].read_pid > 0;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return yes;
}

/* ---- sending ------------------------------------------------------------- */

pipert_result pt_send_device(pt_transport *t, int dst_rank, uint32_t user_tag,
                             const pt_message_header *header, const void *device_payload,
                             pt_request **out)
{
    *out = NULL;
    pthread_mutex_lock(&pt_transport_state_lock);
    const int alive = pt_transport_peer_state_locked(t, dst_rank) == PEER_ALIVE;
    pthread_mutex_unlock(&pt_transport_state_lock);
    /* A peer that failed or left meanwhile fails the send as any send to it does (PIPERT_ERR_PEER,
     * naming why), so that its departure is handled as one. */
    if (alive && !pt_transport_peer_copies_device_memory(t, dst_rank))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "pt_send_device: rank %d does not copy device memory from this process",
                       dst_rank);
    if (!t->device)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send_device: this transport uses no device memory");
    if (header->nbytes <= PT_TRANSPORT_INLINE_BYTES)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "pt_send_device: %llu bytes: payloads of at most %d go through the host",
                       (unsigned long long)header->nbytes, PT_TRANSPORT_INLINE_BYTES);
    pt_message_header wire;
    PT_TRY(pt_transport_wire_header(t, header, &wire));
    wire.flags = PT_MESSAGE_DEVICE_PAYLOAD;
    pt_peer_memory memory;
    PT_TRY(t->device->export_memory(device_payload, &memory));
    return pt_transport_submit_send(t, dst_rank, user_tag, &wire, device_payload, &memory, out);
}

/* Under ucx_lock: r's header, then in place of its payload the descriptor of its device
 * memory; the peer's answer completes the send. */
void pt_transport_send_device_descriptor(pt_transport *t, pt_request *r, ucp_ep_h ep)
{
    r->device.magic = DEVICE_MAGIC;
    r->device.ack_id = t->next_ack_id++;
    r->device.nbytes = r->header.nbytes;
    r->descriptor = (direct_descriptor){.ack_id = r->device.ack_id}; /* what the answer names */
    pt_transport_post_ack_receive(r);
    if (!r->failed) { /* no descriptor goes out unless its answer can be received */
        pt_transport_send_part(r, ep, &r->header, sizeof r->header, 0, PART_HEADER);
        pt_transport_send_part(r, ep, &r->device, sizeof r->device, 0, PART_PAYLOAD);
    }
}

/* ---- receiving ----------------------------------------------------------- */

pipert_result pt_recv_device(pt_transport *t, int src_rank, uint32_t user_tag,
                             const pt_recv_expect *expect, void *host_buffer, void *device_buffer,
                             size_t capacity, pt_request **out)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    const int in_use = t->device != NULL;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return pt_transport_submit_receive(t, src_rank, user_tag, expect, host_buffer,
                                       in_use ? device_buffer : NULL, capacity, out);
}

int pt_request_on_device(const pt_request *request) { return request->on_device; }

int pt_transport_is_device_descriptor(const device_descriptor *d, size_t length)
{
    return length == sizeof *d && d->magic == DEVICE_MAGIC;
}

/* Why the device payload r's descriptor names cannot be copied, or NULL. */
static const char *refusal(const pt_request *r, char *why, size_t capacity)
{
    if (!(r->header.flags & PT_MESSAGE_DEVICE_PAYLOAD))
        return "flags: a device descriptor came for a message whose header says bytes";
    if (!r->device_buffer || !r->t->device)
        return "flags: a device payload, and this receive takes bytes";
    if (r->device.nbytes != r->header.nbytes) {
        snprintf(why, capacity, "nbytes: the header says %llu but the device descriptor %llu",
                 (unsigned long long)r->header.nbytes, (unsigned long long)r->device.nbytes);
        return why;
    }
    return NULL;
}

/* The payload part was a device descriptor: copy the payload from the sender's device memory
 * into r's device buffer, then answer. */
void pt_transport_copy_from_peer(pt_request *r)
{
    pt_transport *t = r->t;
    char what[96], why[160];
    pt_transport_describe_request(r, what, sizeof what);
    pthread_mutex_lock(&pt_transport_state_lock);
    const peer_state state = pt_transport_peer_state_locked(t, r->peer);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (state != PEER_ALIVE) {
        pt_transport_fail_request(
            r, PIPERT_ERR_PEER, "%s: rank %d %s before its %llu-byte device payload was copied",
            what, r->peer, state == PEER_LEFT ? "left" : "failed",
            (unsigned long long)r->header.nbytes);
        return;
    }
    const char *refused = refusal(r, why, sizeof why);
    if (refused) {
        pt_transport_acknowledge(t, r->peer, r->device.ack_id, ACK_FAILED);
        pt_transport_fail_request(r, PIPERT_ERR_PEER, "%s: refused: %s", what, refused);
        return;
    }
    const pipert_result rc =
        t->device->copy_from_peer(r->device_buffer, &r->device.memory, (size_t)r->header.nbytes);
    pt_transport_acknowledge(t, r->peer, r->device.ack_id, rc == PIPERT_OK ? ACK_READ : ACK_FAILED);
    if (rc != PIPERT_OK) {
        pt_transport_fail_request(r, PIPERT_ERR_PEER,
                                  "%s: copying the %llu-byte device payload from rank %d: %s",
                                  what, (unsigned long long)r->header.nbytes, r->peer,
                                  pipert_last_error());
        return;
    }
    r->on_device = 1;
    pt_transport_finish_receive(r);
}
