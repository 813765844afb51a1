/* The UCX data plane: transport.h says what it offers and how its protocol goes;
 * transport_internal.h how these files divide it and how its threads share it. This one
 * creates a transport (UCX context and worker, the fds its progress thread sleeps on, its
 * address, the receive that hellos arrive in, and the thread) and destroys it. */
#include "comm/transport_internal.h"
#include "comm/transport_address.h"
#include "comm/transport_connect.h"
#include "comm/transport_direct.h"
#include "comm/transport_listeners.h"
#include "comm/transport_mac.h"
#include "comm/transport_progress.h"
#include "comm/transport_request.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "runtime/log.h"

/* Process-wide, so that a request outlives its transport (Threads, in transport_internal.h). */
pthread_mutex_t pt_transport_state_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t pt_transport_state_changed = PTHREAD_COND_INITIALIZER;

pipert_result pt_transport_ucx_fail(ucs_status_t status, const char *what)
{
    return pt_fail(PIPERT_ERR_TRANSPORT, "transport: %s: %s", what, ucs_status_string(status));
}

/* Whether UCX_TLS lets UCX use TCP (a setting for a transport it does not open is warned of). */
static bool may_use_tcp(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls) return true;
    if (tls[0] == '^') return !strstr(tls, "tcp"); /* all but those listed */
    return strstr(tls, "tcp") || strstr(tls, "all");
}

static pipert_result open_context(pt_transport *t)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    ucp_config_t *config;
    ucs_status_t status = ucp_config_read(NULL, NULL, &config); /* UCX_* from the environment */
    if (status != UCS_OK) return pt_transport_ucx_fail(status, "ucp_config_read");
    /* Over TCP (between sites, where it matters most) UCX 1.13's rendezvous
     * protocol moves a large message at half the link's rate in each
     * direction of a 2-rank ring (measured: 1.85 s where the link allows
     * 0.9 s); eager sends reach 93% of it. Large same-host payloads take the
     * direct-read path (transport_direct.c) either way. UCX_RNDV_THRESH in the
     * environment still decides when it is set. */
    if (!getenv("UCX_RNDV_THRESH")) status = ucp_config_modify(config, "RNDV_THRESH", "inf");
    /* UCX 1.13 connects a TCP endpoint with a blocking connect() unless told otherwise: a peer
     * across a link that is down then held the progress thread (and every peer's traffic) for
     * the kernel's SYN retries, about a minute (the churn bed: a survivor dialling a joiner when
     * the joiner's site went dark). UCX_TCP_CONN_NB in the environment still decides. */
    if (status == UCS_OK && !getenv("UCX_TCP_CONN_NB") && may_use_tcp())
        status = ucp_config_modify(config, "CONN_NB", "y"); /* the tcp interfaces' key */
    if (status == UCS_OK) status = ucp_init(&params, config, &t->context);
    ucp_config_release(config);
    if (status != UCS_OK) {
        t->context = NULL;
        if (status == UCS_ERR_NO_DEVICE) /* e.g. UCX_TLS=tcp on a host whose links are all down */
            return pt_fail(PIPERT_ERR_TRANSPORT, "transport: ucp_init: UCX found no device it may "
                           "use (UCX_TLS=%s): is this host's network interface down?",
                           getenv("UCX_TLS") ? getenv("UCX_TLS") : "(not set)");
        return pt_transport_ucx_fail(status, "ucp_init");
    }
    return PIPERT_OK;
}

/* ucp_init lists the network devices; ucp_worker_create opens an interface on each. A device
 * that went away in between (a veth of a network namespace another job just removed) fails the
 * worker with "No such device": a fresh context lists the devices again. */
#define WORKER_ATTEMPTS 3

static pipert_result open_ucx(pt_transport *t)
{
    ucp_worker_params_t worker_params = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        /* Created here, driven by the progress thread, destroyed here: one at a time. */
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    ucs_status_t status = UCS_ERR_NO_DEVICE;
    for (int attempt = 1; attempt <= WORKER_ATTEMPTS && status == UCS_ERR_NO_DEVICE; attempt++) {
        if (attempt > 1) {
            pt_warn("transport: ucp_worker_create: %s (a network device went away?); listing "
                    "the devices again", ucs_status_string(status));
            ucp_cleanup(t->context);
            t->context = NULL;
            usleep(100000);
        }
        PT_TRY(open_context(t));
        status = ucp_worker_create(t->context, &worker_params, &t->worker);
    }
    if (status != UCS_OK) {
        t->worker = NULL;
        return pt_transport_ucx_fail(status, "ucp_worker_create");
    }
    status = ucp_worker_get_efd(t->worker, &t->worker_fd);
    if (status != UCS_OK) return pt_transport_ucx_fail(status, "ucp_worker_get_efd");
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (t->wake_fd < 0 || t->epoll_fd < 0)
        return pt_fail(PIPERT_ERR_TRANSPORT, "transport: eventfd/epoll: %s", strerror(errno));
    int fds[2] = {t->worker_fd, t->wake_fd};
    for (int i = 0; i < 2; i++) {
        struct epoll_event event = {.events = EPOLLIN, .data.fd = fds[i]};
        if (epoll_ctl(t->epoll_fd, EPOLL_CTL_ADD, fds[i], &event) != 0)
            return pt_fail(PIPERT_ERR_TRANSPORT, "transport: epoll_ctl: %s", strerror(errno));
    }
    return PIPERT_OK;
}

static void release(pt_transport *t)
{
    pt_transport_ucx_lock_acquire(t); /* no other thread is left, but callbacks may run here */
    if (t->worker) pt_transport_stop_hellos(t);
    /* Destroying the worker may still call our callbacks for operations it
     * purges: connections and requests must outlive it. */
    if (t->worker) ucp_worker_destroy(t->worker);
    if (t->context) ucp_cleanup(t->context);
    while (t->in_flight) {
        pt_request *r = t->in_flight;
        r->op = NULL;
        r->ops_pending = 0;
        pt_transport_fail_request(r, PIPERT_ERR_INTERRUPTED,
                                  "%s rank %d: the transport was destroyed",
                                  pt_transport_request_verb(r), r->peer);
    }
    for (command *c = pt_transport_take_commands(t); c;) {
        command *next = c->next;
        if (c->op == COMMAND_POST)
            pt_transport_fail_request(c->request, PIPERT_ERR_INTERRUPTED,
                                      "the transport was destroyed");
        if (c->op == COMMAND_CONNECT) pt_transport_connection_orphan(c->conn);
        free(c);
        c = next;
    }
    while (t->connections) {
        connection *c = t->connections;
        t->connections = c->next;
        pt_transport_connection_orphan(c);
    }
    if (t->epoll_fd >= 0) close(t->epoll_fd);
    if (t->wake_fd >= 0) close(t->wake_fd);
    pt_transport_ucx_lock_release(t);
    pthread_mutex_lock(&pt_transport_state_lock);
    while (t->pollers > 0) pthread_cond_wait(&pt_transport_state_changed, &pt_transport_state_lock);
    pthread_mutex_unlock(&pt_transport_state_lock);
    pthread_mutex_destroy(&t->queue_lock);
    pthread_mutex_destroy(&t->ucx_lock);
    for (int r = 0; r < t->peer_capacity; r++) pt_transport_mac_forget(&t->peers[r]);
    free(t->peers);
    free(t->remote_peers);
    free(t->listeners);
    free(t->listening_before);
    free(t);
}

pipert_result pt_transport_create(const pt_transport_options *options, pt_transport **out)
{
    *out = NULL;
    if (!options || options->rank < 0 || options->rank >= PT_TRANSPORT_MAX_RANKS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: rank %d is outside 0..%d",
                       options ? options->rank : -1, PT_TRANSPORT_MAX_RANKS - 1);
    size_t secret_length = options->secret ? strlen(options->secret) : 0;
    if (secret_length == 0 || secret_length > PT_TRANSPORT_SECRET_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "transport: the job secret must have 1..%d bytes (it has %zu)",
                       PT_TRANSPORT_SECRET_MAX, secret_length);
    pt_transport *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory");
    t->rank = options->rank;
    t->job = options->job;
    t->identity = options->identity;
    if (!t->identity.protocol) t->identity.protocol = PT_PROTOCOL_VERSION;
    pipert_result keyed = pt_auth_derive_key(options->secret, PT_AUTH_USE_TRANSPORT, &t->key);
    if (keyed != PIPERT_OK) {
        free(t);
        return keyed;
    }
    t->connect_timeout_s = options->connect_timeout_s > 0 ? options->connect_timeout_s : 30.0;
    t->authenticate_messages = options->authenticate_messages;
    t->wake_fd = t->epoll_fd = -1;
    if (gethostname(t->host, sizeof t->host) != 0) snprintf(t->host, sizeof t->host, "?");
    t->host[sizeof t->host - 1] = '\0';
    pthread_mutex_init(&t->queue_lock, NULL);
    pthread_mutex_init(&t->ucx_lock, NULL);
    pt_transport_init_direct_reads(t);
    pt_transport_note_listening_sockets(t);
    pipert_result rc = open_ucx(t);
    if (rc == PIPERT_OK) rc = pt_transport_publish_address(t);
    if (rc == PIPERT_OK) pt_transport_find_ucx_listeners(t);
    if (rc == PIPERT_OK) pt_transport_await_hellos(t); /* before the thread: no lock needed */
    if (rc == PIPERT_OK && pt_log_thread_create(&t->thread, pt_transport_progress_main, t) != 0)
        rc = pt_fail(PIPERT_ERR_TRANSPORT, "transport: cannot start the progress thread");
    if (rc != PIPERT_OK) {
        release(t);
        return rc;
    }
    pt_debug("transport: rank %d ready (a worker address of %zu bytes)", t->rank,
             t->worker_address_length);
    *out = t;
    return PIPERT_OK;
}

void pt_transport_destroy(pt_transport *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->queue_lock);
    t->stopping = 1;
    pthread_mutex_unlock(&t->queue_lock);
    pt_transport_wake_progress_thread(t);
    pthread_join(t->thread, NULL);
    release(t);
}

int pt_transport_rank(const pt_transport *t) { return t->rank; }

const char *pt_transport_address(const pt_transport *t) { return t->address_text; }
