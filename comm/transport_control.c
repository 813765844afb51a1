/* Control words on a connection's UCX stream: goodbyes (BYE, BYE_ACK), the
 * direct-read offer (DIRECT_OK), each sealed with the connection's sequence
 * and, when messages are authenticated, a MAC (transport_mac.c). One receive
 * is always posted on an established connection; a word that fails its check
 * is logged and dropped. */
#include "comm/transport_internal.h"
#include "comm/transport_connect.h"
#include "comm/transport_control.h"
#include "comm/transport_device.h"
#include "comm/transport_direct.h"
#include "comm/transport_mac.h"
#include "comm/transport_progress.h"

#include <stddef.h>
#include <stdlib.h>

#include <ucp/api/ucp.h>

#include "runtime/log.h"

/* Posts a stream operation whose completion calls done(c, status); handles
 * immediate completion and failure to start the same way. A send of an `owned` buffer
 * frees it then. */
typedef void (*stream_done_fn)(connection *c, ucs_status_t status);

typedef struct stream_op_context {
    connection *c;
    stream_done_fn done;
    void *owned;
} stream_op_context;

static void on_stream_send_done(void *request, ucs_status_t status, void *user_data);
static void on_stream_recv_done(void *request, ucs_status_t status, size_t length, void *user_data);

static void stream_post(connection *c, int is_send, void *buffer, size_t bytes, int owned,
                        stream_done_fn done)
{
    stream_op_context *context = malloc(sizeof *context);
    if (!context) {
        if (owned) free(buffer);
        done(c, UCS_ERR_NO_MEMORY);
        return;
    }
    *context = (stream_op_context){c, done, owned ? buffer : NULL};
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .user_data = context,
    };
    ucs_status_ptr_t op;
    size_t received = 0;
    c->ops++; /* before the call: the callback may run inside it */
    if (is_send) {
        param.cb.send = on_stream_send_done;
        op = ucp_stream_send_nbx(c->ep, buffer, bytes, &param);
    } else {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_STREAM_RECV_FLAG_WAITALL;
        param.cb.recv_stream = on_stream_recv_done;
        op = ucp_stream_recv_nbx(c->ep, buffer, bytes, &received, &param);
    }
    if (op == NULL || UCS_PTR_IS_ERR(op)) {
        free(context->owned);
        free(context);
        c->ops--;
        done(c, op ? UCS_PTR_STATUS(op) : UCS_OK);
    }
}

static void stream_op_finished(void *request, ucs_status_t status, void *user_data)
{
    stream_op_context *context = user_data;
    connection *c = context->c;
    stream_done_fn done = context->done;
    free(context->owned);
    free(context);
    ucp_request_free(request);
    c->ops--;
    done(c, status);
}

static void on_stream_send_done(void *request, ucs_status_t status, void *user_data)
{
    stream_op_finished(request, status, user_data);
}

static void on_stream_recv_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    stream_op_finished(request, status, user_data);
}

static void on_control_received(connection *c, ucs_status_t status);

void pt_transport_post_control_receive(connection *c)
{
    if (c->ep) stream_post(c, 0, &c->control_in, sizeof c->control_in, 0, on_control_received);
}

static void on_control_sent(connection *c, ucs_status_t status)
{
    (void)c, (void)status;
}

void pt_transport_send_control(connection *c, uint32_t word)
{
    if (!c->ep) return;
    control_record *record = malloc(sizeof *record);
    if (!record) {
        pt_warn("transport: no memory for a control word to %s", c->who);
        return;
    }
    if (pt_transport_seal_control(c->t, c->rank, word, record) != PIPERT_OK) {
        pt_warn("transport: control word to %s unsent: %s", c->who, pipert_last_error());
        free(record);
        return;
    }
    stream_post(c, 1, record, sizeof *record, 1, on_control_sent);
}

static void on_control_received(connection *c, ucs_status_t status)
{
    if (status != UCS_OK) return; /* the endpoint closed; its error callback reports why */
    const control_record *in = &c->control_in;
    char why[160];
    if (!pt_transport_seal_check(c->t, c->rank, in, offsetof(control_record, sequence),
                                 in->sequence, in->mac, why, sizeof why)) {
        pt_warn("transport: %s sent control word 0x%08x, refused: %s", c->who, in->word, why);
    } else if (in->word == CONTROL_BYE) {
        c->peer_left = 1;
        pt_transport_connection_lost(c, 1, "it shut its transport down");
        pt_transport_send_control(c, CONTROL_BYE_ACK);
    } else if (in->word == CONTROL_BYE_ACK) {
        c->bye_acked = 1;
    } else if (in->word == CONTROL_DIRECT_OK) {
        pt_transport_peer_reads_us(c);
    } else if ((in->word & CONTROL_DEVICE_MASK) == CONTROL_DEVICE_OK) {
        pt_transport_peer_copies_device(c, in->word);
    } else {
        pt_warn("transport: %s sent an unknown control word 0x%08x", c->who, in->word);
    }
    pt_transport_post_control_receive(c);
}

pipert_result pt_transport_seal_control(pt_transport *t, int rank, uint32_t word,
                                        pt_control_record *out)
{
    *out = (pt_control_record){.word = word};
    return pt_transport_seal_record(t, rank, out, offsetof(pt_control_record, sequence),
                                    &out->sequence, out->mac);
}

pipert_result pt_transport_send_control_raw(pt_transport *t, int rank,
                                            const pt_control_record *record)
{
    control_record *copy = malloc(sizeof *copy);
    if (!copy) return pt_fail(PIPERT_ERR_NOMEM, "pt_transport_send_control_raw: no memory");
    *copy = *record;
    pt_transport_ucx_lock_acquire(t);
    pthread_mutex_lock(&pt_transport_state_lock);
    connection *c =
        pt_transport_peer_state_locked(t, rank) == PEER_ALIVE ? t->peers[rank].conn : NULL;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (c && c->ep) stream_post(c, 1, copy, sizeof *copy, 1, on_control_sent);
    else free(copy);
    pt_transport_ucx_lock_release(t);
    pt_transport_wake_progress_thread(t);
    if (!c) return pt_fail(PIPERT_ERR_PEER, "pt_transport_send_control_raw: rank %d is not connected", rank);
    return PIPERT_OK;
}
