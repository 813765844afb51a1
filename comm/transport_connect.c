/* Connections: UCX endpoints to peers' worker addresses, the handshake that authenticates
 * each one, the control words on their stream (goodbyes, the direct-read offer), the peer
 * table, and pt_transport_connect and its kin.
 *
 * The handshake is three hellos {job, rank, stage, nonce, proof, worker address}, tagged
 * messages that reach their receiver in one wildcard receive:
 *   DIAL     dialling rank D, on an endpoint to rank A's worker address: D's nonce.
 *   ANSWER   A checks the dial (magic, job, rank), opens its own endpoint to the address it
 *            carries (UCX pairs it with D's: one connection between the two workers) and
 *            answers with its nonce and its proof over D's nonce (auth.h).
 *   CONFIRM  D checks A's proof, counts A as connected and sends its proof over A's nonce; A
 *            checks it and counts D connected.
 *   REFUSED  in place of CONFIRM when A's proof is wrong: D's connect fails at once
 *            (PIPERT_ERR_AUTH), A logs the refusal; neither side proved anything to the other.
 * The secret never travels, and a recorded hello is worthless later: it answers a nonce that is
 * never drawn again. Each hello also carries its sender's protocol version and job digest
 * (runtime/job_digest.h): the dialler compares the answer's once its proof is checked, and a
 * dialler that differs sends REFUSED, fails its connect (PIPERT_ERR_CONFIG) and logs an error
 * naming the rank and what differs; the answerer, comparing the dial's, logs the same on the
 * REFUSED (or on a CONFIRM that should not have come) and fails its waits for that rank. A
 * hello that fails a check is logged with the rank, pid and host it claims; the handshake of a dialler whose proof is wrong is closed, so it learns of the
 * refusal from its connect timeout. */
#include "comm/transport_internal.h"
#include "comm/transport_address.h"
#include "comm/transport_connect.h"
#include "comm/transport_control.h"
#include "comm/transport_direct.h"
#include "comm/transport_listeners.h"
#include "comm/transport_mac.h"
#include "comm/transport_progress.h"
#include "comm/transport_request.h"
#include "comm/transport_send_recv.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "comm/bootstrap.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define HELLO_MAGIC 0x4c485450u /* "PTHL" */
#define HELLO_VERSION 6u /* 6: the protocol version and job digest; 5: control records and
                          * direct-read answers carry a seal */

/* ---- peers (under pt_transport_state_lock) ------------------------------- */

peer *pt_transport_peer_slot_locked(pt_transport *t, int rank)
{
    if (rank < 0 || rank >= PT_TRANSPORT_MAX_RANKS) return NULL;
    if (rank >= t->peer_capacity) {
        int capacity = t->peer_capacity ? t->peer_capacity : 16;
        while (capacity <= rank) capacity *= 2;
        peer *grown = realloc(t->peers, (size_t)capacity * sizeof *grown);
        if (!grown) return NULL;
        memset(grown + t->peer_capacity, 0, (size_t)(capacity - t->peer_capacity) * sizeof *grown);
        t->peers = grown;
        t->peer_capacity = capacity;
    }
    return &t->peers[rank];
}

peer_state pt_transport_peer_state_locked(const pt_transport *t, int rank)
{
    return rank >= 0 && rank < t->peer_capacity ? t->peers[rank].state : PEER_UNKNOWN;
}

/* Whether a process of `rank` was refused for another build or settings; why into `why`. */
int pt_transport_peer_mismatch_locked(const pt_transport *t, int rank, char *why, size_t capacity)
{
    if (rank < 0 || rank >= t->peer_capacity || !t->peers[rank].mismatch[0]) return 0;
    snprintf(why, capacity, "%s", t->peers[rank].mismatch);
    return 1;
}

/* ---- connections --------------------------------------------------------- */

static void connection_finish(connection *c, pipert_result result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Publishes the handshake's outcome to a pt_transport_connect() caller. */
static void connection_finish(connection *c, pipert_result result, const char *fmt, ...)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    if (!c->finished) {
        c->finished = 1;
        c->result = result;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->message, sizeof c->message, fmt, ap);
        va_end(ap);
        pthread_cond_broadcast(&pt_transport_state_changed);
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
}

/* Marks a rank dead (or gone) and fails what waits on it; only while the process of the
 * rank is the `incarnation`-th (NULL: whichever it is now). */
static void peer_fail(pt_transport *t, int rank, const unsigned *incarnation, int departed,
                      const char *reason)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(t, rank);
    int changed = p && (p->state == PEER_ALIVE || p->state == PEER_UNKNOWN) &&
                  (!incarnation || *incarnation == p->incarnation);
    if (changed) {
        p->state = departed ? PEER_LEFT : PEER_DEAD;
        p->conn = NULL;
        snprintf(p->reason, sizeof p->reason, "%s", reason);
        pthread_cond_broadcast(&pt_transport_state_changed);
    }
    char who[WHO_CAPACITY] = "";
    if (p) snprintf(who, sizeof who, "%s", p->who);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!changed) return;
    if (departed)
        pt_debug("transport: %s left", who);
    else
        pt_warn("transport: %s failed: %s", who, reason);
    char text[TEXT_CAPACITY];
    snprintf(text, sizeof text, "rank %d %s: %s", rank, departed ? "has left" : "failed", reason);
    pt_transport_cancel_receives_from(t, rank, PIPERT_ERR_PEER, text);
}

void pt_transport_peer_fail(pt_transport *t, int rank, int departed, const char *reason)
{
    peer_fail(t, rank, NULL, departed, reason);
}

/* A rank whose process left (its goodbye) and was replaced keeps its old connection until
 * the upkeep closes it; an error of that endpoint can come much later (a site's link down
 * through the goodbye: UCX's "Endpoint timeout" once the link is back) and is not the new
 * process's (the churn bed: a survivor's collective with the rank failed "has left"). */
void pt_transport_connection_lost(connection *c, int departed, const char *reason)
{
    peer_fail(c->t, c->rank, &c->incarnation, departed, reason);
}

/* Whether c reached a process of its rank that was replaced since (pt_transport_forget_peer). */
static int connection_outlived(pt_transport *t, const connection *c)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    const peer *p = c->rank >= 0 && c->rank < t->peer_capacity ? &t->peers[c->rank] : NULL;
    const int outlived = p && p->incarnation != c->incarnation;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return outlived;
}

static void connection_mark_failed(connection *c)
{
    if (c->state == CONN_HANDSHAKE || c->state == CONN_READY) c->state = CONN_FAILED;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    connection *c = arg;
    conn_state before = c->state;
    connection_mark_failed(c);
    if (before == CONN_HANDSHAKE) {
        connection_finish(c, PIPERT_ERR_TRANSPORT, "connection to %s failed: %s", c->who,
                          ucs_status_string(status));
    } else if (before == CONN_READY) {
        /* Once either side said goodbye on this endpoint, its end is no failure. */
        int leaving = c->bye_sent || c->peer_left;
        char reason[TEXT_CAPACITY];
        snprintf(reason, sizeof reason,
                 leaving ? "its endpoint closed during shutdown (%s)" : "endpoint error: %s",
                 ucs_status_string(status));
        pt_transport_connection_lost(c, leaving, reason);
    }
}

static void on_close_done(void *request, ucs_status_t status, void *user_data)
{
    connection *c = user_data;
    c->ops--;
    c->state = CONN_CLOSED;
    ucp_request_free(request);
}

/* Always forced: see shut_down() in transport_progress.c for why a graceful close is
 * not used. */
void pt_transport_connection_close(connection *c)
{
    if (c->state == CONN_CLOSING || c->state == CONN_CLOSED) return;
    if (!c->ep) { /* never had one (ucp_ep_create failed) */
        c->state = CONN_CLOSED;
        return;
    }
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = on_close_done,
        .user_data = c,
    };
    /* Counted before the call: the callback may run inside it. */
    c->ops++;
    c->state = CONN_CLOSING;
    ucs_status_ptr_t op = ucp_ep_close_nbx(c->ep, &param);
    c->ep = NULL;
    if (op == NULL || UCS_PTR_IS_ERR(op)) {
        if (UCS_PTR_IS_ERR(op))
            pt_debug("transport: closing the endpoint to %s: %s", c->who,
                     ucs_status_string(UCS_PTR_STATUS(op)));
        c->ops--;
        c->state = CONN_CLOSED;
    }
}

static void connection_refuse(connection *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Refuses an authenticated peer all the same (it cannot be one now): logs, fails the
 * handshake and closes the endpoint. */
static void connection_refuse(connection *c, const char *fmt, ...)
{
    char reason[TEXT_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    pt_warn("transport: refused the connection %s %s: %s", c->accepted ? "from" : "to", c->who,
            reason);
    connection_finish(c, PIPERT_ERR_AUTH, "refused the connection %s %s: %s",
                      c->accepted ? "from" : "to", c->who, reason);
    c->state = CONN_FAILED;
    pt_transport_connection_close(c);
}

/* ---- the handshake ------------------------------------------------------- */

/* The peer is authenticated: it becomes ALIVE and this connection its sending endpoint. */
static int connection_register(connection *c)
{
    pt_transport *t = c->t;
    pt_transport_mac_keys(c);
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(t, c->rank);
    peer_state before = p ? p->state : PEER_DEAD;
    if (p && (before == PEER_UNKNOWN || before == PEER_ALIVE)) {
        p->state = PEER_ALIVE;
        p->mismatch[0] = '\0';
        c->incarnation = p->incarnation;
        if (!p->conn) p->conn = c;
        snprintf(p->who, sizeof p->who, "%s", c->who);
        pthread_cond_broadcast(&pt_transport_state_changed);
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!p) {
        connection_refuse(c, "no memory for rank %d", c->rank);
        return 0;
    }
    if (before == PEER_DEAD || before == PEER_LEFT) {
        connection_refuse(c, "rank %d already failed or left; it cannot come back", c->rank);
        return 0;
    }
    c->state = CONN_READY;
    pt_transport_post_control_receive(c);
    return 1;
}

static connection *connection_new(pt_transport *t, int accepted, int rank, const char *who)
{
    connection *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->t = t;
    c->accepted = accepted;
    c->rank = rank;
    snprintf(c->who, sizeof c->who, "%s", who);
    c->state = CONN_HANDSHAKE;
    return c;
}

static void connection_link(pt_transport *t, connection *c)
{
    c->next = t->connections;
    t->connections = c;
    c->deadline = pt_now_s() + t->connect_timeout_s;
}

/* An endpoint to c->target with peer error handling; on failure the connection is closed
 * and its caller told. */
static int connection_open_endpoint(connection *c)
{
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)c->target,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = c},
    };
    ucs_status_t status = ucp_ep_create(c->t->worker, &params, &c->ep);
    if (status == UCS_OK) return 1;
    c->ep = NULL;
    c->state = CONN_CLOSED;
    connection_finish(c, PIPERT_ERR_TRANSPORT, "cannot connect to %s: %s", c->who,
                      ucs_status_string(status));
    return 0;
}

/* ---- hellos -------------------------------------------------------------- */

/* Hellos travel as KIND_INTERNAL headers with user tag 0; the receive takes any rank's. */
static ucp_tag_t hello_tag(int rank)
{
    return pt_transport_make_tag(KIND_INTERNAL, rank, PART_HEADER, 0);
}
static const ucp_tag_t HELLO_ANY_RANK_MASK = ~((ucp_tag_t)0x7fffff << 33);

static int hello_sender(ucp_tag_t tag) { return (int)((tag >> 33) & 0x7fffff); }

static void fill_hello(const pt_transport *t, hello *h, hello_stage stage)
{
    memset(h, 0, sizeof *h);
    h->magic = HELLO_MAGIC;
    h->version = HELLO_VERSION;
    h->job = t->job;
    h->rank = t->rank;
    h->stage = stage;
    h->protocol = t->identity.protocol;
    memcpy(h->digest, t->identity.part, sizeof h->digest);
    h->pid = (int32_t)getpid();
    h->probe_address = (uint64_t)(uintptr_t)&t->probe_word;
    h->probe_word = t->probe_word;
    memcpy(h->boot_id, t->boot_id, sizeof h->boot_id);
    snprintf(h->host, sizeof h->host, "%s", t->host);
    h->address_length = (uint32_t)t->worker_address_length;
    memcpy(h->address, t->worker_address, t->worker_address_length);
}

static void on_hello_sent(void *request, ucs_status_t status, void *user_data)
{
    (void)status; /* a failed endpoint reports through on_ep_error */
    connection *c = user_data;
    c->ops--;
    ucp_request_free(request);
}

/* Sends *h (which stays ours until sent) on c's endpoint. */
static void send_hello(connection *c, hello *h)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = on_hello_sent,
        .user_data = c,
    };
    c->ops++; /* before the call: the callback may run inside it */
    ucs_status_ptr_t op = ucp_tag_send_nbx(c->ep, h, sizeof *h, hello_tag(c->t->rank), &param);
    if (op == NULL || UCS_PTR_IS_ERR(op)) c->ops--;
}

/* Who proves what: the answerer over the dialler's nonce, the dialler over the answerer's. */
static pt_auth_party answerer(int answerer_rank, int dialler_rank)
{
    return (pt_auth_party){"transport answerer", answerer_rank, dialler_rank};
}
static pt_auth_party dialler(int dialler_rank, int answerer_rank)
{
    return (pt_auth_party){"transport dialler", dialler_rank, answerer_rank};
}

/* DIAL: our nonce, to the rank we dial. */
static void send_dial(connection *c)
{
    fill_hello(c->t, &c->hello_out, HELLO_DIAL);
    if (pt_auth_new_nonce(c->nonce) != PIPERT_OK) {
        connection_finish(c, PIPERT_ERR_INTERNAL, "connecting to %s: no random nonce", c->who);
        c->state = CONN_FAILED;
        return;
    }
    memcpy(c->hello_out.nonce, c->nonce, sizeof c->nonce);
    send_hello(c, &c->hello_out);
}

/* ANSWER to a dial: our nonce, and our proof over the dialler's. */
static int send_answer(connection *c)
{
    pt_transport *t = c->t;
    fill_hello(t, &c->hello_out, HELLO_ANSWER);
    if (pt_auth_new_nonce(c->nonce) != PIPERT_OK) return 0;
    memcpy(c->hello_out.nonce, c->nonce, sizeof c->nonce);
    pt_auth_party me = answerer(t->rank, c->rank);
    pt_auth_prove(&t->key, &me, c->peer_nonce, c->nonce, c->hello_out.proof);
    send_hello(c, &c->hello_out);
    return 1;
}

/* CONFIRM: our proof over the answerer's nonce. */
static void send_confirm(connection *c)
{
    pt_transport *t = c->t;
    fill_hello(t, &c->confirm_out, HELLO_CONFIRM);
    pt_auth_party me = dialler(t->rank, c->rank);
    pt_auth_prove(&t->key, &me, c->peer_nonce, c->nonce, c->confirm_out.proof);
    send_hello(c, &c->confirm_out);
}

/* "rank R (pid P on HOST)", as a hello claims: printable characters only, since the
 * claim may come from anyone. */
static void describe_sender(const hello *h, int rank, char *out, size_t capacity)
{
    char host[sizeof h->host];
    size_t i = 0;
    for (; i + 1 < sizeof host && h->host[i]; i++)
        host[i] = isprint((unsigned char)h->host[i]) ? h->host[i] : '?';
    host[i] = '\0';
    snprintf(out, capacity, "rank %d (pid %d on %s)", rank, (int)h->pid, host[0] ? host : "?");
}

/* Whether a hello that arrived under `tag_rank`'s tag may open a connection; if not, why. */
static int hello_acceptable(const pt_transport *t, const hello *h, int tag_rank, char *why,
                            size_t capacity)
{
    if (h->magic != HELLO_MAGIC)
        snprintf(why, capacity, "not a pipert hello (magic 0x%08x)", h->magic);
    else if (h->version != HELLO_VERSION)
        snprintf(why, capacity, "hello version %u, this build's is %u (another build of pipert)",
                 h->version, HELLO_VERSION);
    else if (h->stage < HELLO_DIAL || h->stage > HELLO_REFUSED)
        snprintf(why, capacity, "a hello of unknown stage %u", h->stage);
    else if (h->job != t->job)
        snprintf(why, capacity, "job %u is not this job (%u)", h->job, t->job);
    else if (h->rank < 0 || h->rank >= PT_TRANSPORT_MAX_RANKS || h->rank == t->rank ||
             h->rank != tag_rank)
        snprintf(why, capacity, "impossible rank %d (tagged %d)", h->rank, tag_rank);
    else if (h->address_length == 0 || h->address_length > WORKER_ADDRESS_MAX)
        snprintf(why, capacity, "a worker address of %u bytes", h->address_length);
    else
        return 1;
    return 0;
}

/* Whether the sender of `h` is of another build or job settings (runtime/job_digest.h); if
 * so, why. */
static int hello_mismatch(const pt_transport *t, const hello *h, char *why, size_t capacity)
{
    pt_job_identity theirs = {.protocol = h->protocol};
    memcpy(theirs.part, h->digest, sizeof theirs.part);
    return pt_job_identity_mismatch(&theirs, &t->identity, why, capacity);
}

/* `rank` was refused for another build or settings: logged as an error, and noted so that a
 * wait for it fails at once (pt_transport_wait_peer), until a process of it connects. */
static void note_mismatch(pt_transport *t, int rank, const char *who, const char *why)
{
    pt_error("transport: refused %s: %s", who, why);
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(t, rank);
    if (p && p->state == PEER_UNKNOWN) {
        snprintf(p->mismatch, sizeof p->mismatch, "%s", why);
        pthread_cond_broadcast(&pt_transport_state_changed);
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
}

/* The answerer's side of a mismatch: its handshake fails and the endpoint closes. */
static void refuse_mismatch(connection *c, const char *why)
{
    note_mismatch(c->t, c->rank, c->who, why);
    connection_finish(c, PIPERT_ERR_CONFIG, "refused %s: %s", c->who, why);
    c->state = CONN_FAILED;
    pt_transport_connection_close(c);
}

/* Our live connection with `rank` (being made or made), if any. */
static connection *connection_with(pt_transport *t, int rank)
{
    for (connection *c = t->connections; c; c = c->next)
        if (c->rank == rank && (c->state == CONN_HANDSHAKE || c->state == CONN_READY)) return c;
    return NULL;
}

static void on_flushed(void *request, ucs_status_t status, void *user_data);

/* The authenticated peer is connected once our endpoint is flushed: then every UCX lane of it
 * has its socket connected (a lane over TCP dials the peer's listening socket on its device,
 * perhaps another than the first lane's), so that once every peer counts as connected no
 * one of them dials us any more (pt_transport_stop_listening relies on it). */
static void connection_established(connection *c)
{
    c->authenticated = 1;
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = on_flushed,
        .user_data = c,
    };
    c->ops++; /* before the call: the callback may run inside it */
    ucs_status_ptr_t op = ucp_ep_flush_nbx(c->ep, &param);
    if (op == NULL || UCS_PTR_IS_ERR(op)) on_flushed(NULL, op ? UCS_PTR_STATUS(op) : UCS_OK, c);
}

/* Registered, offered direct reads, its caller told. */
static void on_flushed(void *request, ucs_status_t status, void *user_data)
{
    connection *c = user_data;
    c->ops--;
    if (request) ucp_request_free(request);
    if (c->state != CONN_HANDSHAKE) return; /* it failed or timed out meanwhile, and was told */
    if (status != UCS_OK) {
        connection_finish(c, PIPERT_ERR_TRANSPORT, "connecting to %s: %s", c->who,
                          ucs_status_string(status));
        c->state = CONN_FAILED;
        return;
    }
    if (!connection_register(c)) return;
    pt_transport_offer_direct_reads(c, &c->hello_in);
    pt_debug("transport: %s connected (%s dialled)", c->who, c->accepted ? "it" : "we");
    connection_finish(c, PIPERT_OK, "connected");
}

/* A peer dialled us: our endpoint goes to the address in its hello, our answer proves us to
 * it; it counts as connected once its confirmation proves it to us. */
static void accept_peer(pt_transport *t, const hello *h, const char *who)
{
    connection *c = connection_new(t, 1, h->rank, who);
    if (!c) {
        pt_warn("transport: no memory to accept %s", who);
        return;
    }
    c->hello_in = *h;
    memcpy(c->peer_nonce, h->nonce, sizeof c->peer_nonce);
    memcpy(c->target, h->address, h->address_length);
    c->target_length = h->address_length;
    connection_link(t, c);
    if (!connection_open_endpoint(c)) return;
    if (!send_answer(c)) connection_refuse(c, "no random nonce to answer with");
}

/* The answerer's proof was wrong: it hears so (no proof of ours), our caller fails now, and
 * the endpoint closes a moment later, once the refusal is out. */
static void refuse_answer(connection *c)
{
    fill_hello(c->t, &c->confirm_out, HELLO_REFUSED);
    send_hello(c, &c->confirm_out);
    pt_warn("transport: refused the connection to %s: its proof of the job's secret is wrong",
            c->who);
    connection_finish(c, PIPERT_ERR_AUTH, "refused the connection to %s: its proof of the job's "
                                          "secret is wrong (is it of this job?)",
                      c->who);
    c->deadline = pt_now_s() + 1.0;
}

/* The dialler's side of a mismatch: the answerer hears REFUSED (it compares our dial itself
 * and logs why), our caller fails now, and the endpoint closes once the refusal is out. */
static void refuse_answer_mismatch(connection *c, const char *why)
{
    fill_hello(c->t, &c->confirm_out, HELLO_REFUSED);
    c->confirm_out.refused_settings = 1;
    send_hello(c, &c->confirm_out);
    note_mismatch(c->t, c->rank, c->who, why);
    connection_finish(c, PIPERT_ERR_CONFIG, "refused %s: %s", c->who, why);
    c->deadline = pt_now_s() + 1.0;
}

/* The answer to our dial: its proof checked, then its build and settings, ours sent, the
 * connection made. */
static void answer_arrived(pt_transport *t, connection *c, const hello *h, const char *who)
{
    snprintf(c->who, sizeof c->who, "%s", who);
    pt_auth_party them = answerer(c->rank, t->rank);
    if (!pt_auth_verify(&t->key, &them, c->nonce, h->nonce, h->proof)) {
        refuse_answer(c);
        return;
    }
    char why[TEXT_CAPACITY];
    if (hello_mismatch(t, h, why, sizeof why)) {
        refuse_answer_mismatch(c, why);
        return;
    }
    c->hello_in = *h;
    memcpy(c->peer_nonce, h->nonce, sizeof c->peer_nonce);
    send_confirm(c);
    connection_established(c);
}

/* The dialler's confirmation of our answer: its proof checked, the connection made. */
static void confirm_arrived(pt_transport *t, connection *c, const hello *h)
{
    pt_auth_party them = dialler(c->rank, t->rank);
    if (!pt_auth_verify(&t->key, &them, c->nonce, c->peer_nonce, h->proof)) {
        connection_refuse(c, "its proof of the job's secret is wrong");
        return;
    }
    char why[TEXT_CAPACITY];
    if (hello_mismatch(t, &c->hello_in, why, sizeof why)) { /* it should have refused us */
        refuse_mismatch(c, why);
        return;
    }
    connection_established(c);
}

/* A dialler refused our answer, and its hello shows another build or settings (`why`): the
 * dial (`known`, NULL once its endpoint closed) fails, and so do waits for the rank. */
static void refused_for_mismatch(pt_transport *t, connection *known, const hello *h,
                                 const char *who, const char *why)
{
    if (known) refuse_mismatch(known, why);
    else note_mismatch(t, h->rank, who, why);
}

static void hello_arrived(pt_transport *t, const hello *h, int tag_rank)
{
    char who[WHO_CAPACITY], why[TEXT_CAPACITY];
    describe_sender(h, tag_rank, who, sizeof who);
    if (!hello_acceptable(t, h, tag_rank, why, sizeof why)) {
        pt_warn("transport: refused a hello from a process claiming to be %s: %s", who, why);
        return;
    }
    connection *known = connection_with(t, h->rank);
    int unproven_dial = known && known->accepted && !known->authenticated;
    if (h->stage == HELLO_DIAL && unproven_dial) {
        /* Whoever dialled before never proved itself: the new dial may be the real peer. */
        connection_refuse(known, "dialled again before it proved itself; the new dial replaces it");
        known = NULL;
    }
    if (h->stage == HELLO_DIAL && !known)
        accept_peer(t, h, who);
    else if (h->stage == HELLO_ANSWER && known && !known->accepted && !known->authenticated)
        answer_arrived(t, known, h, who);
    else if (h->stage == HELLO_CONFIRM && unproven_dial)
        confirm_arrived(t, known, h);
    else if (h->stage == HELLO_REFUSED && h->refused_settings &&
             hello_mismatch(t, h, why, sizeof why))
        refused_for_mismatch(t, unproven_dial ? known : NULL, h, who, why);
    else if (h->stage == HELLO_REFUSED && unproven_dial)
        connection_refuse(known, "it refused our proof: it does not share this job's secret");
    else if (h->stage == HELLO_REFUSED) /* its endpoint closed first: the handshake is gone */
        pt_warn("transport: refused the connection from %s: it refused our proof: it does not "
                "share this job's secret", who);
    else
        pt_warn("transport: %s sent a hello (stage %u) that fits no handshake; ignored", who,
                h->stage);
}

/* The hello the receive's completion left in t->hello_in (under ucx_lock); 0 once hellos
 * are no longer taken. */
static int take_hello(pt_transport *t)
{
    ucs_status_t status = t->hello_status;
    if (status == UCS_ERR_CANCELED || t->hello_closed) return 0;
    if (status != UCS_OK || t->hello_info.length != sizeof(hello))
        pt_warn("transport: refused a hello of the wrong size (%s, %zu bytes)",
                ucs_status_string(status), status == UCS_OK ? t->hello_info.length : (size_t)0);
    else
        hello_arrived(t, &t->hello_in, hello_sender(t->hello_info.sender_tag));
    return 1;
}

/* Only notes the arrival: answering opens an endpoint, which UCX's TCP transport does not
 * survive from inside its own progress (where this runs). pt_transport_await_hellos answers,
 * on the progress thread, woken for it. */
static void on_hello_received(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                              void *user_data)
{
    pt_transport *t = user_data;
    t->hello_status = status;
    if (status == UCS_OK) t->hello_info = *info; /* before the request (which may hold it) goes */
    ucp_request_free(request);
    t->hello_op = NULL;
    t->hello_ready = 1;
    if (!t->hello_posting) pt_transport_wake_progress_thread(t);
}

/* Answers the hello that arrived, if one did, and keeps the wildcard receive that every
 * rank's hello arrives in posted (until pt_transport_stop_hellos). Outside ucp_worker_progress. */
void pt_transport_await_hellos(pt_transport *t)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = on_hello_received,
        .user_data = t,
    };
    for (;;) {
        if (t->hello_ready) {
            t->hello_ready = 0;
            if (!take_hello(t)) return;
        }
        if (t->hello_op || t->hello_closed) return;
        t->hello_posting = 1; /* the callback may run inside the call */
        ucs_status_ptr_t op = ucp_tag_recv_nbx(t->worker, &t->hello_in, sizeof t->hello_in,
                                               hello_tag(0), HELLO_ANY_RANK_MASK, &param);
        t->hello_posting = 0;
        if (UCS_PTR_IS_ERR(op)) {
            pt_warn("transport: cannot receive hellos: %s", ucs_status_string(UCS_PTR_STATUS(op)));
            return;
        }
        if (!t->hello_ready) {
            t->hello_op = op;
            return;
        }
    }
}

void pt_transport_stop_hellos(pt_transport *t)
{
    t->hello_closed = 1;
    if (t->hello_op) ucp_request_cancel(t->worker, t->hello_op);
}

/* Dials c->rank: an endpoint to its address, our hello; its hello completes the connection. */
void pt_transport_start_connect(pt_transport *t, connection *c)
{
    connection_link(t, c);
    if (connection_open_endpoint(c)) send_dial(c);
}

/* ---- upkeep (the progress thread) ---------------------------------------- */

/* Closes failed endpoints, times handshakes out and frees what is finished. */
void pt_transport_maintain_connections(pt_transport *t)
{
    pt_transport_await_hellos(t);
    double now = pt_now_s();
    connection **link = &t->connections;
    while (*link) {
        connection *c = *link;
        if (c->state == CONN_HANDSHAKE && now > c->deadline) {
            if (c->accepted && !c->finished)
                pt_warn("transport: %s dialled us but did not prove itself within %.0f s; closed",
                        c->who, t->connect_timeout_s);
            connection_finish(c, PIPERT_ERR_TIMEOUT,
                              "no valid hello from %s within %.0f s (is it of this job, with the "
                              "same secret? A refused hello is only logged, by the peer)",
                              c->who, t->connect_timeout_s);
            c->state = CONN_FAILED;
        }
        if (c->state == CONN_READY && c->peer_left && connection_outlived(t, c))
            c->state = CONN_FAILED; /* the goodbye of a process since replaced */
        if (c->state == CONN_FAILED) pt_transport_connection_close(c);
        pthread_mutex_lock(&pt_transport_state_lock);
        int reapable = c->state == CONN_CLOSED && c->ops == 0 && !c->waiter &&
                       !(c->rank >= 0 && c->rank < t->peer_capacity && t->peers[c->rank].conn == c);
        if (reapable) *link = c->next;
        pthread_mutex_unlock(&pt_transport_state_lock);
        if (reapable)
            free(c);
        else
            link = &c->next;
    }
}

int pt_transport_next_deadline_ms(const pt_transport *t)
{
    double now = pt_now_s(), wait_s = IDLE_WAKE_MS / 1000.0;
    for (const connection *c = t->connections; c; c = c->next)
        if (c->state == CONN_HANDSHAKE && c->deadline - now < wait_s) wait_s = c->deadline - now;
    return wait_s <= 0 ? 0 : (int)(wait_s * 1000.0) + 1;
}

/* Ends a connection's life with its transport: freed now, or by the
 * pt_transport_connect() call still waiting on it. */
void pt_transport_connection_orphan(connection *c)
{
    connection_finish(c, PIPERT_ERR_INTERRUPTED, "the transport was destroyed");
    pthread_mutex_lock(&pt_transport_state_lock);
    int waited_on = c->waiter;
    c->t = NULL;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!waited_on) free(c);
}

/* ---- connecting ---------------------------------------------------------- */

pipert_result pt_transport_connect(pt_transport *t, int peer_rank, const char *address)
{
    if (peer_rank < 0 || peer_rank >= PT_TRANSPORT_MAX_RANKS || peer_rank == t->rank)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: cannot connect rank %d to rank %d",
                       t->rank, peer_rank);
    char who[WHO_CAPACITY];
    snprintf(who, sizeof who, "rank %d", peer_rank);
    connection *c = connection_new(t, 0, peer_rank, who);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a connection");
    pipert_result resolved = pt_transport_decode_address(address, c->target, &c->target_length);
    if (resolved != PIPERT_OK) {
        free(c);
        return resolved;
    }
    c->waiter = 1;
    pipert_result rc = pt_transport_enqueue(t, COMMAND_CONNECT, NULL, c);
    if (rc != PIPERT_OK) {
        free(c);
        return rc;
    }
    /* The progress thread enforces the handshake deadline; the margin here only guards against a
     * stuck thread. */
    struct timespec deadline;
    pt_transport_deadline_after(t->connect_timeout_s + 5.0, &deadline);
    pthread_mutex_lock(&pt_transport_state_lock);
    while (!c->finished)
        if (pt_transport_wait_on_state(&deadline) == ETIMEDOUT) break;
    pipert_result result = c->finished ? c->result : PIPERT_ERR_TIMEOUT;
    char message[TEXT_CAPACITY];
    if (c->finished)
        snprintf(message, sizeof message, "%s", c->message);
    else /* its upkeep would have timed the handshake out: say whether it was stuck */
        snprintf(message, sizeof message,
                 "connecting to %s: no answer from the progress thread within %.0f s (its last "
                 "upkeep was %.1f s ago)",
                 who, t->connect_timeout_s + 5.0,
                 pt_now_s() - (double)atomic_load(&t->upkeep_ms) / 1000.0);
    c->waiter = 0;
    int orphan = c->t == NULL;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (orphan) free(c);
    if (result != PIPERT_OK) return pt_fail(result, "%s", message);
    return PIPERT_OK;
}

pipert_result pt_transport_wait_peer(pt_transport *t, int peer_rank, double timeout_s)
{
    struct timespec deadline;
    pt_transport_deadline_after(timeout_s < 0 ? 0 : timeout_s, &deadline);
    pthread_mutex_lock(&pt_transport_state_lock);
    peer_state state;
    char mismatch[TEXT_CAPACITY] = "";
    while ((state = pt_transport_peer_state_locked(t, peer_rank)) == PEER_UNKNOWN &&
           !pt_transport_peer_mismatch_locked(t, peer_rank, mismatch, sizeof mismatch))
        if (pt_transport_wait_on_state(&deadline) == ETIMEDOUT) break;
    state = pt_transport_peer_state_locked(t, peer_rank);
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "%s", t->peers[peer_rank].reason);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (state == PEER_ALIVE) return PIPERT_OK;
    if (state == PEER_UNKNOWN && mismatch[0])
        return pt_fail(PIPERT_ERR_CONFIG, "transport: rank %d was refused: %s", peer_rank, mismatch);
    if (state == PEER_UNKNOWN)
        return pt_fail(PIPERT_ERR_TIMEOUT,
                       "transport: rank %d did not connect to rank %d within %.1f s", peer_rank,
                       t->rank, timeout_s);
    return pt_fail(PIPERT_ERR_PEER, "transport: rank %d %s: %s", peer_rank,
                   state == PEER_LEFT ? "has left" : "failed", reason);
}

pipert_result pt_transport_connect_all(pt_transport *t, int n_ranks, const char *const *addresses,
                                       double timeout_s)
{
    if (t->rank >= n_ranks)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: rank %d is not below n_ranks %d",
                       t->rank, n_ranks);
    double deadline = pt_now_s() + timeout_s;
    for (int rank = 0; rank < t->rank; rank++) {
        pipert_result rc = pt_transport_connect(t, rank, addresses[rank]);
        if (rc != PIPERT_OK) {
            pt_error_prefix("rank %d connecting to rank %d", t->rank, rank);
            return rc;
        }
    }
    for (int rank = t->rank + 1; rank < n_ranks; rank++) {
        double left = deadline - pt_now_s();
        PT_TRY(pt_transport_wait_peer(t, rank, left > 0 ? left : 0));
    }
    return PIPERT_OK;
}

/* On the progress thread: every connection with `rank` fails as an endpoint error would fail
 * it (closed by the next upkeep; a late error of its endpoint then finds it failed and changes
 * nothing), and the rank is marked failed. */
void pt_transport_drop_connections(pt_transport *t, int rank, const char *reason)
{
    for (connection *c = t->connections; c; c = c->next) {
        if (c->rank != rank) continue;
        if (c->state == CONN_HANDSHAKE)
            connection_finish(c, PIPERT_ERR_PEER, "connection to %s dropped: %s", c->who, reason);
        connection_mark_failed(c);
    }
    pt_transport_peer_fail(t, rank, 0, reason);
}

pipert_result pt_transport_drop_peer(pt_transport *t, int peer_rank, const char *reason)
{
    if (peer_rank < 0 || peer_rank >= PT_TRANSPORT_MAX_RANKS || peer_rank == t->rank)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: rank %d cannot drop rank %d", t->rank,
                       peer_rank);
    if (!pt_transport_peer_alive(t, peer_rank)) return PIPERT_OK;
    PT_TRY(pt_transport_enqueue_drop(t, peer_rank, reason));
    struct timespec deadline;
    pt_transport_deadline_after(5.0, &deadline);
    pthread_mutex_lock(&pt_transport_state_lock);
    while (pt_transport_peer_state_locked(t, peer_rank) == PEER_ALIVE)
        if (pt_transport_wait_on_state(&deadline) == ETIMEDOUT) break;
    const int alive = pt_transport_peer_state_locked(t, peer_rank) == PEER_ALIVE;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (alive)
        return pt_fail(PIPERT_ERR_TIMEOUT, "transport: dropping rank %d: no answer from the "
                                           "progress thread within 5 s", peer_rank);
    return PIPERT_OK;
}

pipert_result pt_transport_forget_peer(pt_transport *t, int peer_rank)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = peer_rank >= 0 && peer_rank < t->peer_capacity ? &t->peers[peer_rank] : NULL;
    const peer_state state = p ? p->state : PEER_UNKNOWN;
    if (p && (state == PEER_DEAD || state == PEER_LEFT)) {
        /* Its old connections are closed or closing; they stay in the list until reaped and
         * no longer stand for the rank (connection_with looks at live ones only). */
        pt_transport_mac_forget(p);
        const unsigned next = p->incarnation + 1;
        *p = (peer){.state = PEER_UNKNOWN, .incarnation = next};
    }
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (state == PEER_ALIVE)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: rank %d is alive; only a rank that "
                                               "failed or left can be replaced", peer_rank);
    return PIPERT_OK;
}

int pt_transport_peer_alive(pt_transport *t, int peer_rank)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    int alive = pt_transport_peer_state_locked(t, peer_rank) == PEER_ALIVE;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return alive;
}
