/* Same-host direct reads. Endpoints use UCX peer error handling, and UCX 1.13
 * then refuses its shared-memory transports (sysv/posix: "no peer failure
 * handler"; cma as a rendezvous lane needs memory invalidation), so two
 * workers on one host would talk over TCP on loopback: two copies through the
 * kernel and about a fifth of what cma reaches. So large payloads between
 * processes of one host take the path UCX's cma transport would: the receiver
 * copies them straight out of the sender's memory with process_vm_readv (one
 * copy, by the kernel). The handshake proves it can: each hello carries the
 * sender's boot id, pid and the address and value of a random probe word; a
 * side that reads that word back from the peer's memory tells the peer
 * CONTROL_DIRECT_OK on the stream. From then on that peer sends payloads of
 * DIRECT_MIN_BYTES or more as a `direct_descriptor` (address, nbytes, ack id)
 * in place of the payload part, under the same tag; the receiver tells the two
 * apart by length (a real separate payload is longer than 4096 bytes), reads
 * into the caller's buffer, then answers with a `direct_ack` under kind 0
 * (never a user kind) and the ack id, and only that answer completes the send,
 * so the payload stays untouched until it was read. Control words, headers,
 * descriptors and acks all travel over the error-handled UCX endpoint, so
 * failures are detected as before; a read from a peer that has failed or left
 * is refused rather than attempted (its memory may already be reused). Direct
 * reads stand in for UCX's cma, so they are used only where UCX_TLS allows
 * cma (unset, all, sm, shm, cma, or a ^list excluding none of those); with
 * UCX_TLS=tcp everything goes through UCX.
 */
#include "comm/transport_internal.h"
#include "comm/transport_connect.h"
#include "comm/transport_device.h"
#include "comm/transport_direct.h"
#include "comm/transport_mac.h"
#include "comm/transport_request.h"
#include "comm/transport_send_recv.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "runtime/clock.h"
#include "runtime/log.h"

#define DIRECT_MAGIC 0x44525450u     /* "PTRD": a direct_descriptor */
#define DIRECT_ACK_MAGIC 0x41525450u /* "PTRA": a direct_ack */

/* ---- whether UCX_TLS allows them, and what a hello offers ---------------- */

/* /proc/sys/kernel/random/boot_id as 16 bytes (zeros if unreadable): same value, same kernel. */
static void read_boot_id(uint8_t out[16])
{
    memset(out, 0, 16);
    char text[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(text, sizeof text, f)) text[0] = '\0';
        fclose(f);
    }
    int digits = 0;
    for (const char *p = text; *p && digits < 32; p++) {
        int value = *p >= '0' && *p <= '9'   ? *p - '0'
                    : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                    : *p >= 'A' && *p <= 'F' ? *p - 'A' + 10
                                             : -1;
        if (value < 0) continue;
        out[digits / 2] = (uint8_t)(out[digits / 2] << 4 | value);
        digits++;
    }
}

static int tls_item_is(const char *item, const char *name) { return !strcmp(item, name); }

/* Direct reads stand in for UCX's cma transport: allowed where UCX_TLS allows cma. */
static int tls_allows_direct_reads(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !tls[0]) return 1;
    int excluding = tls[0] == '^';
    char list[256];
    snprintf(list, sizeof list, "%s", tls + excluding);
    int named = 0;
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save))
        named |= tls_item_is(item, "cma") || tls_item_is(item, "sm") ||
                 tls_item_is(item, "shm") || (!excluding && tls_item_is(item, "all"));
    return excluding ? !named : named;
}

void pt_transport_init_direct_reads(pt_transport *t)
{
    t->direct_allowed = tls_allows_direct_reads();
    read_boot_id(t->boot_id);
    /* Only has to be unlikely to sit at that address by chance (another host's process). */
    if (getrandom(&t->probe_word, sizeof t->probe_word, GRND_NONBLOCK) !=
        (ssize_t)sizeof t->probe_word)
        t->probe_word = (uint64_t)(pt_now_s() * 1e9) ^ ((uint64_t)getpid() << 32) ^
                        (uint64_t)(uintptr_t)t;
    t->probe_word |= 1;
}

/* ---- the handshake: proving each side can read the other ----------------- */

/* Copies nbytes at `address` in process `pid` into `into`, by the kernel in one copy
 * (process_vm_readv, as UCX's cma transport does). Returns 0 or an errno. */
static int read_remote(pid_t pid, void *into, uint64_t address, uint64_t nbytes)
{
    uint64_t done = 0;
    while (done < nbytes) {
        struct iovec local = {(char *)into + done, (size_t)(nbytes - done)},
                     remote = {(void *)(uintptr_t)(address + done), (size_t)(nbytes - done)};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EFAULT;
        done += (uint64_t)got;
    }
    return 0;
}

/* Whether we can read the memory of the peer that sent hello `h`: same kernel (boot id), and
 * its probe word reads back (same pid namespace, and ptrace rules let us). */
static int can_read_peer(const pt_transport *t, const hello *h)
{
    if (!t->direct_allowed || h->pid <= 0 || memcmp(h->boot_id, t->boot_id, sizeof h->boot_id))
        return 0;
    uint64_t seen = 0;
    return read_remote((pid_t)h->pid, &seen, h->probe_address, sizeof seen) == 0 &&
           seen == h->probe_word;
}

/* After the handshake: if we can read the peer's memory, it may send us descriptors. */
void pt_transport_offer_direct_reads(connection *c, const hello *h)
{
    if (!can_read_peer(c->t, h)) return;
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(c->t, c->rank);
    if (p) p->read_pid = (pid_t)h->pid;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!p) return;
    pt_transport_send_control(c, CONTROL_DIRECT_OK);
    pt_transport_offer_device_copies(c);
}

/* The peer can read our memory: large payloads to it go as descriptors from now on. */
void pt_transport_peer_reads_us(connection *c)
{
    if (!c->t->direct_allowed) return; /* UCX_TLS keeps us off cma: we send through UCX */
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(c->t, c->rank);
    if (p) p->reads_us = 1;
    pthread_mutex_unlock(&pt_transport_state_lock);
    pt_debug("transport: rank %d reads payloads of %u bytes or more from our memory", c->rank,
             DIRECT_MIN_BYTES);
}

/* ---- sending: a descriptor, then the answer ------------------------------ */

static void ack_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info)
{
    (void)info;
    char what[96], why[160];
    pt_transport_describe_request(r, what, sizeof what);
    if (status == UCS_ERR_CANCELED && r->cancel_reason[0])
        pt_transport_record_failure(r, r->cancel_result, "%s: %s", what, r->cancel_reason);
    else if (status != UCS_OK)
        pt_transport_record_failure(r, PIPERT_ERR_PEER, "%s: no answer to the direct read: %s",
                                    what, ucs_status_string(status));
    else if (r->ack.magic != DIRECT_ACK_MAGIC || r->ack.ack_id != r->descriptor.ack_id)
        pt_transport_record_failure(r, PIPERT_ERR_PEER, "%s: a malformed answer to the direct read",
                                    what);
    else if (!pt_transport_seal_check(r->t, r->peer, &r->ack, offsetof(direct_ack, sequence),
                                      r->ack.sequence, r->ack.mac, why, sizeof why))
        pt_transport_record_failure(r, PIPERT_ERR_PEER, "%s: the answer to the direct read: %s",
                                    what, why);
    else if (r->ack.status == ACK_FAILED)
        pt_transport_record_failure(
            r, PIPERT_ERR_PEER, "%s: rank %d could not read the payload from this process's memory",
            what, r->peer);
    /* ACK_REFUSED: the receiver refused the header; the message was taken all the same. */
    pt_transport_send_part_finished(r, UCS_OK);
}

/* A direct send waits for the receiver's answer under (KIND_INTERNAL, peer, ack id); posted
 * before the descriptor leaves, so it is never unexpected. */
void pt_transport_post_ack_receive(pt_request *r)
{
    r->ops_pending++;
    pt_transport_post_part_receive(
        r, pt_transport_make_tag(KIND_INTERNAL, r->peer, PART_PAYLOAD, r->descriptor.ack_id),
        &r->ack, sizeof r->ack, 0, ack_arrived);
}

/* Sends r's header, then in place of its payload a descriptor (address, nbytes, ack id) from
 * which the peer reads the payload out of our memory; the peer's answer completes the send. */
void pt_transport_send_direct(pt_transport *t, pt_request *r, ucp_ep_h ep)
{
    r->descriptor = (direct_descriptor){.magic = DIRECT_MAGIC,
                                        .ack_id = t->next_ack_id++,
                                        .address = (uint64_t)(uintptr_t)r->payload,
                                        .nbytes = r->header.nbytes};
    pt_transport_post_ack_receive(r);
    if (!r->failed) { /* no descriptor goes out unless its answer can be received */
        pt_transport_send_part(r, ep, &r->header, sizeof r->header, 0, PART_HEADER);
        pt_transport_send_part(r, ep, &r->descriptor, sizeof r->descriptor, 0, PART_PAYLOAD);
    }
}

/* ---- receiving: reading, then answering ---------------------------------- */

static void on_ack_sent(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    free(user_data);
}

/* Answers the descriptor `ack_id` from `rank`: its send completes with this. */
void pt_transport_acknowledge(pt_transport *t, int rank, uint32_t ack_id, int32_t status)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    connection *c =
        pt_transport_peer_state_locked(t, rank) == PEER_ALIVE ? t->peers[rank].conn : NULL;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!c || !c->ep) return; /* it failed or left: nobody waits for the answer */
    direct_ack *a = malloc(sizeof *a);
    if (!a) {
        pt_warn("transport: no memory to answer rank %d's direct read; its send stays pending",
                rank);
        return;
    }
    *a = (direct_ack){.magic = DIRECT_ACK_MAGIC, .ack_id = ack_id, .status = status};
    if (pt_transport_seal_record(t, rank, a, offsetof(direct_ack, sequence), &a->sequence,
                                 a->mac) != PIPERT_OK) {
        pt_warn("transport: rank %d's direct read unanswered: %s", rank, pipert_last_error());
        free(a);
        return;
    }
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.send = on_ack_sent,
        .user_data = a,
        .datatype = ucp_dt_make_contig(1),
    };
    ucs_status_ptr_t op = ucp_tag_send_nbx(
        c->ep, a, sizeof *a, pt_transport_make_tag(KIND_INTERNAL, t->rank, PART_PAYLOAD, ack_id),
        &param);
    if (op == NULL || UCS_PTR_IS_ERR(op)) free(a);
}

int pt_transport_is_descriptor(const direct_descriptor *d, size_t length)
{
    return length == sizeof *d && d->magic == DIRECT_MAGIC;
}

/* The payload part was a descriptor: copy the payload out of the sender's memory. */
void pt_transport_read_directly(pt_request *r)
{
    pt_transport *t = r->t;
    const direct_descriptor *d = &r->descriptor;
    char what[96];
    pt_transport_describe_request(r, what, sizeof what);
    pthread_mutex_lock(&pt_transport_state_lock);
    peer_state state = pt_transport_peer_state_locked(t, r->peer);
    pid_t pid = state == PEER_ALIVE ? t->peers[r->peer].read_pid : 0;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (state != PEER_ALIVE) {
        /* Its memory may be reused by now: nothing is read. */
        pt_transport_fail_request(
            r, PIPERT_ERR_PEER,
            "%s: rank %d %s before its %llu-byte payload was read from its memory", what, r->peer,
            state == PEER_LEFT ? "left" : "failed", (unsigned long long)r->header.nbytes);
        return;
    }
    if (pid <= 0 || d->nbytes != r->header.nbytes) {
        pt_transport_acknowledge(t, r->peer, d->ack_id, ACK_FAILED);
        if (pid <= 0)
            pt_transport_fail_request(
                r, PIPERT_ERR_PEER,
                "%s: the payload came as a direct-read descriptor, but rank %d's memory "
                "is not readable from here",
                what, r->peer);
        else
            pt_transport_fail_request(
                r, PIPERT_ERR_PEER,
                "%s: nbytes: the header says %llu but the payload descriptor %llu", what,
                (unsigned long long)r->header.nbytes, (unsigned long long)d->nbytes);
        return;
    }
    int error = read_remote(pid, r->buffer, d->address, d->nbytes);
    pt_transport_acknowledge(t, r->peer, d->ack_id, error ? ACK_FAILED : ACK_READ);
    if (error) {
        pt_transport_fail_request(
            r, PIPERT_ERR_PEER,
            "%s: reading the %llu-byte payload from the memory of rank %d (pid %d): %s", what,
            (unsigned long long)d->nbytes, r->peer, (int)pid, strerror(error));
        return;
    }
    pt_transport_finish_receive(r);
}
