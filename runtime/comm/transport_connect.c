/* Connections: UCX endpoints, the hello {job, rank, secret} that authenticates each one,
 * the control words on their stream (goodbyes, the direct-read offer), the peer table, the
 * listener that accepts them, and pt_transport_connect and its kin. */
#include "runtime/comm/transport_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "runtime/comm/bootstrap.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define HELLO_MAGIC 0x4c485450u /* "PTHL" */
#define HELLO_VERSION 2u

/* ---- addresses ----------------------------------------------------------- */

static void format_sockaddr(const struct sockaddr_storage *sa, char *out, size_t capacity)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(out, capacity, "%s:%d", host, port);
    } else if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        snprintf(out, capacity, "[%s]:%d", host, port);
    } else {
        snprintf(out, capacity, "(unknown address family %d)", sa->ss_family);
    }
}

/* Splits "host:port" or "[v6host]:port" and resolves it. */
static pipert_result resolve_address(const char *address, int passive, struct sockaddr_storage *out,
                                     socklen_t *out_length)
{
    char host[256];
    const char *colon = strrchr(address, ':');
    if (!colon || colon == address || !colon[1])
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport address \"%s\": expected host:port",
                       address);
    size_t host_length = (size_t)(colon - address);
    const char *host_start = address;
    if (address[0] == '[' && colon[-1] == ']') {
        host_start++;
        host_length -= 2;
    }
    if (host_length >= sizeof host)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport address \"%s\": host too long", address);
    memcpy(host, host_start, host_length);
    host[host_length] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *found = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &found);
    if (rc != 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport address \"%s\": %s", address,
                       gai_strerror(rc));
    memcpy(out, found->ai_addr, found->ai_addrlen);
    *out_length = found->ai_addrlen;
    freeaddrinfo(found);
    return PIPERT_OK;
}

/* This host's first non-loopback IPv4 address (what peers elsewhere can reach
 * when we listen on every interface), or 127.0.0.1. */
static void first_external_ipv4(char *out, size_t capacity)
{
    snprintf(out, capacity, "127.0.0.1");
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return;
    for (struct ifaddrs *it = list; it; it = it->ifa_next) {
        if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
        if (!(it->ifa_flags & IFF_UP) || (it->ifa_flags & IFF_LOOPBACK)) continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, out,
                  (socklen_t)capacity);
        break;
    }
    freeifaddrs(list);
}

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

/* Marks a rank dead (or gone) and fails what waits on it. */
static void peer_fail(pt_transport *t, int rank, int departed, const char *reason)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(t, rank);
    int changed = p && (p->state == PEER_ALIVE || p->state == PEER_UNKNOWN);
    if (changed) {
        p->state = departed ? PEER_LEFT : PEER_DEAD;
        p->conn = NULL;
        snprintf(p->reason, sizeof p->reason, "%s", reason);
        pthread_cond_broadcast(&pt_transport_state_changed);
    }
    char address[ADDRESS_CAPACITY] = "";
    if (p) snprintf(address, sizeof address, "%s", p->address);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!changed) return;
    if (departed)
        pt_debug("transport: rank %d (%s) left", rank, address);
    else
        pt_warn("transport: rank %d (%s) failed: %s", rank, address, reason);
    char text[TEXT_CAPACITY];
    snprintf(text, sizeof text, "rank %d %s: %s", rank, departed ? "has left" : "failed", reason);
    pt_transport_cancel_receives_from(t, rank, PIPERT_ERR_PEER, text);
}

static void connection_mark_failed(connection *c)
{
    if (c->state == CONN_HANDSHAKE || c->state == CONN_READY) c->state = CONN_FAILED;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    connection *c = arg;
    pt_transport *t = c->t;
    conn_state before = c->state;
    connection_mark_failed(c);
    if (before == CONN_HANDSHAKE) {
        if (c->hello_sent && !c->accepted)
            connection_finish(c, PIPERT_ERR_AUTH,
                              "rank %d at %s closed the connection during the hello (%s): "
                              "does it have the same job secret and id?",
                              c->rank, c->address, ucs_status_string(status));
        else
            connection_finish(c, PIPERT_ERR_TRANSPORT, "connection to %s failed: %s", c->address,
                              ucs_status_string(status));
    } else if (before == CONN_READY) {
        /* Once either side said goodbye on this endpoint, its end is no failure. */
        int leaving = c->bye_sent || c->peer_left;
        char reason[TEXT_CAPACITY];
        snprintf(reason, sizeof reason,
                 leaving ? "its endpoint closed during shutdown (%s)" : "endpoint error: %s",
                 ucs_status_string(status));
        peer_fail(t, c->rank, leaving, reason);
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
            pt_debug("transport: closing the endpoint to %s: %s", c->address,
                     ucs_status_string(UCS_PTR_STATUS(op)));
        c->ops--;
        c->state = CONN_CLOSED;
    }
}

static void connection_refuse(connection *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Refuses a peer's hello: logs, fails the handshake and closes the endpoint. */
static void connection_refuse(connection *c, const char *fmt, ...)
{
    char reason[TEXT_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    pt_warn("transport: refused the connection %s %s: %s", c->accepted ? "from" : "to", c->address,
            reason);
    connection_finish(c, PIPERT_ERR_AUTH, "refused the connection %s %s: %s",
                      c->accepted ? "from" : "to", c->address, reason);
    c->state = CONN_FAILED;
    pt_transport_connection_close(c);
}

/* ---- the stream: hellos and control words -------------------------------- */

/* Posts a stream operation whose completion calls done(c, status); handles
 * immediate completion and failure to start the same way. */
typedef void (*stream_done_fn)(connection *c, ucs_status_t status);

typedef struct stream_op_context {
    connection *c;
    stream_done_fn done;
} stream_op_context;

static void on_stream_send_done(void *request, ucs_status_t status, void *user_data);
static void on_stream_recv_done(void *request, ucs_status_t status, size_t length, void *user_data);

static void stream_post(connection *c, int is_send, void *buffer, size_t bytes, stream_done_fn done)
{
    stream_op_context *context = malloc(sizeof *context);
    if (!context) {
        done(c, UCS_ERR_NO_MEMORY);
        return;
    }
    *context = (stream_op_context){c, done};
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

static void post_control_receive(connection *c)
{
    if (c->ep) stream_post(c, 0, &c->control_in, sizeof c->control_in, on_control_received);
}

static void on_control_sent(connection *c, ucs_status_t status) { (void)c, (void)status; }

void pt_transport_send_control(connection *c, uint32_t word)
{
    static const uint32_t bye = CONTROL_BYE, bye_ack = CONTROL_BYE_ACK,
                          direct_ok = CONTROL_DIRECT_OK;
    const uint32_t *stored = word == CONTROL_BYE       ? &bye
                             : word == CONTROL_BYE_ACK ? &bye_ack
                                                       : &direct_ok;
    if (c->ep) stream_post(c, 1, (void *)stored, sizeof word, on_control_sent);
}

static void on_control_received(connection *c, ucs_status_t status)
{
    if (status != UCS_OK) return; /* the endpoint closed; its error callback reports why */
    if (c->control_in == CONTROL_BYE) {
        c->peer_left = 1;
        peer_fail(c->t, c->rank, 1, "it shut its transport down");
        pt_transport_send_control(c, CONTROL_BYE_ACK);
    } else if (c->control_in == CONTROL_BYE_ACK) {
        c->bye_acked = 1;
    } else if (c->control_in == CONTROL_DIRECT_OK) {
        pt_transport_peer_reads_us(c);
    } else {
        pt_warn("transport: rank %d (%s) sent an unknown control word 0x%08x", c->rank, c->address,
                c->control_in);
    }
    post_control_receive(c);
}

/* ---- the handshake ------------------------------------------------------- */

/* The secret in a hello against ours (in constant time: pt_secret_equal). */
static int hello_secret_matches(const pt_transport *t, const hello *h)
{
    if (h->secret_length > PT_TRANSPORT_SECRET_MAX) return 0;
    char theirs[PT_TRANSPORT_SECRET_MAX + 1], ours[PT_TRANSPORT_SECRET_MAX + 1];
    memcpy(theirs, h->secret, h->secret_length);
    theirs[h->secret_length] = '\0';
    memcpy(ours, t->secret, t->secret_length);
    ours[t->secret_length] = '\0';
    /* A NUL inside their secret shortens it: it then differs in length. */
    return pt_secret_equal(theirs, ours) && strlen(theirs) == h->secret_length;
}

/* The peer is authenticated: it becomes ALIVE and this connection its sending endpoint. */
static int connection_register(connection *c)
{
    pt_transport *t = c->t;
    pthread_mutex_lock(&pt_transport_state_lock);
    peer *p = pt_transport_peer_slot_locked(t, c->rank);
    peer_state before = p ? p->state : PEER_DEAD;
    if (p && (before == PEER_UNKNOWN || before == PEER_ALIVE)) {
        p->state = PEER_ALIVE;
        if (!p->conn) p->conn = c;
        snprintf(p->address, sizeof p->address, "%s", c->address);
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
    post_control_receive(c);
    return 1;
}

static void fill_hello(const pt_transport *t, hello *h)
{
    memset(h, 0, sizeof *h);
    h->magic = HELLO_MAGIC;
    h->version = HELLO_VERSION;
    h->job = t->job;
    h->rank = t->rank;
    h->secret_length = (uint32_t)t->secret_length;
    memcpy(h->secret, t->secret, t->secret_length);
    h->pid = (int32_t)getpid();
    h->probe_address = (uint64_t)(uintptr_t)&t->probe_word;
    h->probe_word = t->probe_word;
    memcpy(h->boot_id, t->boot_id, sizeof h->boot_id);
}

static void on_hello_sent(connection *c, ucs_status_t status)
{
    if (status == UCS_OK) c->hello_sent = 1;
}

static void on_hello_received(connection *c, ucs_status_t status)
{
    pt_transport *t = c->t;
    if (c->state != CONN_HANDSHAKE) return;
    if (status != UCS_OK) return; /* the endpoint failed or closed: on_ep_error tells why */
    const hello *h = &c->hello_in;
    if (h->magic != HELLO_MAGIC || h->version != HELLO_VERSION) {
        connection_refuse(c, "not a pipert hello (magic 0x%08x, version %u)", h->magic, h->version);
        return;
    }
    if (!hello_secret_matches(t, h)) {
        connection_refuse(c, "wrong job secret (claimed rank %d)", h->rank);
        return;
    }
    if (h->job != t->job) {
        connection_refuse(c, "job %u is not this job (%u)", h->job, t->job);
        return;
    }
    if (h->rank < 0 || h->rank >= PT_TRANSPORT_MAX_RANKS || h->rank == t->rank) {
        connection_refuse(c, "impossible rank %d", h->rank);
        return;
    }
    if (!c->accepted && h->rank != c->rank) {
        connection_refuse(c, "expected rank %d there, found rank %d", c->rank, h->rank);
        return;
    }
    c->rank = h->rank;
    if (c->accepted) {
        /* Our secret goes only to a peer that proved it knows it. */
        fill_hello(t, &c->hello_out);
        stream_post(c, 1, &c->hello_out, sizeof c->hello_out, on_hello_sent);
    }
    if (!connection_register(c)) return;
    pt_transport_offer_direct_reads(c, h);
    pt_debug("transport: rank %d connected %s %s", c->rank, c->accepted ? "from" : "to",
             c->address);
    connection_finish(c, PIPERT_OK, "connected");
}

static connection *connection_new(pt_transport *t, int accepted, int rank, const char *address)
{
    connection *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->t = t;
    c->accepted = accepted;
    c->rank = rank;
    snprintf(c->address, sizeof c->address, "%s", address);
    c->state = CONN_HANDSHAKE;
    return c;
}

static void connection_link(pt_transport *t, connection *c)
{
    c->next = t->connections;
    t->connections = c;
    c->deadline = pt_now_s() + t->connect_timeout_s;
}

static void on_connection_request(ucp_conn_request_h request, void *arg)
{
    pt_transport *t = arg;
    char address[ADDRESS_CAPACITY] = "(unknown address)";
    ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    if (ucp_conn_request_query(request, &attr) == UCS_OK)
        format_sockaddr(&attr.client_address, address, sizeof address);
    pthread_mutex_lock(&t->queue_lock);
    int stopping = t->stopping;
    pthread_mutex_unlock(&t->queue_lock);
    connection *c = stopping ? NULL : connection_new(t, 1, -1, address);
    if (!c) {
        ucp_listener_reject(t->listener, request);
        return;
    }
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .conn_request = request,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = c},
    };
    ucs_status_t status = ucp_ep_create(t->worker, &params, &c->ep);
    if (status != UCS_OK) {
        pt_warn("transport: could not accept the connection from %s: %s", address,
                ucs_status_string(status));
        free(c);
        return;
    }
    connection_link(t, c);
    stream_post(c, 0, &c->hello_in, sizeof c->hello_in, on_hello_received);
}

void pt_transport_start_connect(pt_transport *t, connection *c)
{
    connection_link(t, c);
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .sockaddr = {.addr = (const struct sockaddr *)&c->target, .addrlen = c->target_length},
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = c},
    };
    ucs_status_t status = ucp_ep_create(t->worker, &params, &c->ep);
    if (status != UCS_OK) {
        c->ep = NULL;
        c->state = CONN_CLOSED;
        connection_finish(c, PIPERT_ERR_TRANSPORT, "cannot connect to rank %d at %s: %s", c->rank,
                          c->address, ucs_status_string(status));
        return;
    }
    fill_hello(t, &c->hello_out);
    stream_post(c, 1, &c->hello_out, sizeof c->hello_out, on_hello_sent);
    stream_post(c, 0, &c->hello_in, sizeof c->hello_in, on_hello_received);
}

/* ---- upkeep (the progress thread) ---------------------------------------- */

/* Closes failed endpoints, times handshakes out and frees what is finished. */
void pt_transport_maintain_connections(pt_transport *t)
{
    double now = pt_now_s();
    connection **link = &t->connections;
    while (*link) {
        connection *c = *link;
        if (c->state == CONN_HANDSHAKE && now > c->deadline) {
            if (c->accepted)
                pt_warn("transport: no valid hello from %s within %.0f s; closing", c->address,
                        t->connect_timeout_s);
            connection_finish(c, PIPERT_ERR_TIMEOUT, "no hello from rank %d at %s within %.0f s",
                              c->rank, c->address, t->connect_timeout_s);
            c->state = CONN_FAILED;
        }
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

/* ---- listening ----------------------------------------------------------- */

pipert_result pt_transport_open_listener(pt_transport *t, const pt_transport_options *options)
{
    const char *host =
        options->listen_host && options->listen_host[0] ? options->listen_host : "0.0.0.0";
    char bind_address[ADDRESS_CAPACITY + 16];
    snprintf(bind_address, sizeof bind_address, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             options->listen_port);
    struct sockaddr_storage address;
    socklen_t length;
    PT_TRY(resolve_address(bind_address, 1, &address, &length));
    ucp_listener_params_t params = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (const struct sockaddr *)&address, .addrlen = length},
        .conn_handler = {.cb = on_connection_request, .arg = t},
    };
    ucs_status_t status = ucp_listener_create(t->worker, &params, &t->listener);
    if (status != UCS_OK) {
        t->listener = NULL;
        return pt_fail(PIPERT_ERR_TRANSPORT, "transport: cannot listen on %s: %s", bind_address,
                       ucs_status_string(status));
    }
    ucp_listener_attr_t attr = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    status = ucp_listener_query(t->listener, &attr);
    if (status != UCS_OK) return pt_transport_ucx_fail(status, "ucp_listener_query");
    char bound[ADDRESS_CAPACITY];
    format_sockaddr(&attr.sockaddr, bound, sizeof bound);
    const char *port = strrchr(bound, ':') + 1;
    char advertised[INET6_ADDRSTRLEN + 2];
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::"))
        first_external_ipv4(advertised, sizeof advertised);
    else
        snprintf(advertised, sizeof advertised, strchr(host, ':') ? "[%s]" : "%s", host);
    snprintf(t->listen_address, sizeof t->listen_address, "%s:%s", advertised, port);
    return PIPERT_OK;
}

/* ---- connecting ---------------------------------------------------------- */

pipert_result pt_transport_connect(pt_transport *t, int peer_rank, const char *address)
{
    if (peer_rank < 0 || peer_rank >= PT_TRANSPORT_MAX_RANKS || peer_rank == t->rank)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: cannot connect rank %d to rank %d",
                       t->rank, peer_rank);
    connection *c = connection_new(t, 0, peer_rank, address);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a connection");
    pipert_result resolved = resolve_address(address, 0, &c->target, &c->target_length);
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
    snprintf(message, sizeof message, "%s",
             c->finished ? c->message : "connect: no answer from the progress thread");
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
    while ((state = pt_transport_peer_state_locked(t, peer_rank)) == PEER_UNKNOWN)
        if (pt_transport_wait_on_state(&deadline) == ETIMEDOUT) break;
    state = pt_transport_peer_state_locked(t, peer_rank);
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "%s", t->peers[peer_rank].reason);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (state == PEER_ALIVE) return PIPERT_OK;
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

int pt_transport_peer_alive(pt_transport *t, int peer_rank)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    int alive = pt_transport_peer_state_locked(t, peer_rank) == PEER_ALIVE;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return alive;
}
