/* Who drives UCX. One thread at a time calls ucp_*: the holder of ucx_lock. That is the
 * progress thread, which runs the command queue that other threads fill, progresses the worker
 * and sleeps in epoll when there is nothing to do; or, while it sleeps, a user thread posting
 * its own request (post_directly) or polling while it waits (pt_transport_poll_while_waiting).
 * At the end the progress thread says goodbye to every peer and closes the endpoints. */
#include "comm/transport_internal.h"
#include "comm/transport_connect.h"
#include "comm/transport_progress.h"
#include "comm/transport_request.h"
#include "comm/transport_send_recv.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "runtime/clock.h"
#include "runtime/log.h"

/* Shutdown waits at most this long for goodbyes, and again for endpoints to close. */
#define SHUTDOWN_STEP_S 2.0
/* Bounded polling, so that a protocol step or an answer that comes soon costs no wake-up.
 * The progress thread, while requests are in flight, polls UCX this long after the last thing
 * that happened before it arms the worker and sleeps; with nothing in flight it sleeps at once.
 * So a transport with nothing happening polls at most SPIN_US per IDLE_WAKE_MS (a receive that
 * waits long: 0.005% of a core), never continuously. */
#define SPIN_US 50

/* ---- the UCX lock -------------------------------------------------------- */

_Thread_local int pt_transport_holding_ucx_lock;

void pt_transport_ucx_lock_acquire(pt_transport *t)
{
    pthread_mutex_lock(&t->ucx_lock);
    pt_transport_holding_ucx_lock = 1;
}

static int ucx_lock_try(pt_transport *t)
{
    if (pt_transport_holding_ucx_lock || pthread_mutex_trylock(&t->ucx_lock) != 0) return 0;
    pt_transport_holding_ucx_lock = 1;
    return 1;
}

void pt_transport_ucx_lock_release(pt_transport *t)
{
    pt_transport_holding_ucx_lock = 0;
    pthread_mutex_unlock(&t->ucx_lock);
}

void pt_transport_wake_progress_thread(pt_transport *t)
{
    uint64_t one = 1;
    ssize_t written = write(t->wake_fd, &one, sizeof one);
    (void)written; /* EAGAIN means the counter is already non-zero: the thread will wake */
}

/* After queueing a command: a progress thread that is awake finds it before it sleeps (it sets
 * in_epoll, then looks at the queue). */
static void wake_progress_thread_if_asleep(pt_transport *t)
{
    if (atomic_load(&t->in_epoll)) pt_transport_wake_progress_thread(t);
}

/* ---- command queue ------------------------------------------------------- */

static pipert_result enqueue(pt_transport *t, command *c)
{
    pthread_mutex_lock(&t->queue_lock);
    if (t->stopping) {
        pthread_mutex_unlock(&t->queue_lock);
        free(c);
        return pt_fail(PIPERT_ERR_INTERRUPTED, "transport of rank %d is shutting down", t->rank);
    }
    if (t->queue_tail)
        t->queue_tail->next = c;
    else
        t->queue_head = c;
    t->queue_tail = c;
    pthread_mutex_unlock(&t->queue_lock);
    wake_progress_thread_if_asleep(t);
    return PIPERT_OK;
}

pipert_result pt_transport_enqueue(pt_transport *t, command_op op, pt_request *request,
                                   connection *conn)
{
    command *c = malloc(sizeof *c);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a command");
    *c = (command){.op = op, .request = request, .conn = conn};
    return enqueue(t, c);
}

pipert_result pt_transport_enqueue_drop(pt_transport *t, int rank, const char *reason)
{
    command *c = malloc(sizeof *c);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a command");
    *c = (command){.op = COMMAND_DROP, .rank = rank};
    snprintf(c->reason, sizeof c->reason, "%s", reason);
    return enqueue(t, c);
}

static int commands_queued(pt_transport *t)
{
    pthread_mutex_lock(&t->queue_lock);
    int queued = t->queue_head != NULL;
    pthread_mutex_unlock(&t->queue_lock);
    return queued;
}

command *pt_transport_take_commands(pt_transport *t)
{
    pthread_mutex_lock(&t->queue_lock);
    command *list = t->queue_head;
    t->queue_head = t->queue_tail = NULL;
    pthread_mutex_unlock(&t->queue_lock);
    return list;
}

/* ---- the progress thread ------------------------------------------------- */

static void run_command(pt_transport *t, command *c)
{
    pt_request *r = c->request;
    switch (c->op) {
    case COMMAND_POST:
        r->t = t;
        if (r->type == REQUEST_SEND)
            pt_transport_post_send(t, r);
        else
            pt_transport_post_receive(t, r);
        break;
    case COMMAND_CANCEL:
        /* Only while its header has not matched: cancelling the payload part would leave the
         * payload (or a descriptor whose sender waits for an answer) to match a later receive. */
        if (r->in_flight && r->op && r->type == REQUEST_RECV && r->part == PART_HEADER &&
            !r->cancel_reason[0]) {
            r->cancel_result = PIPERT_ERR_INTERRUPTED;
            snprintf(r->cancel_reason, sizeof r->cancel_reason, "cancelled");
            ucp_request_cancel(t->worker, r->op);
        }
        pt_transport_request_command_done(r); /* may free it */
        break;
    case COMMAND_CONNECT:
        pt_transport_start_connect(t, c->conn);
        break;
    case COMMAND_DROP:
        pt_transport_drop_connections(t, c->rank, c->reason);
        break;
    }
}

static void run_commands(pt_transport *t)
{
    command *c = pt_transport_take_commands(t);
    while (c) {
        command *next = c->next;
        run_command(t, c);
        free(c);
        c = next;
    }
}

/* Polls UCX for at most SPIN_US; 1 as soon as something happened (progress or a command). */
static int poll_briefly(pt_transport *t)
{
    double until = pt_now_s() + SPIN_US * 1e-6;
    do {
        if (ucp_worker_progress(t->worker) || commands_queued(t)) return 1;
    } while (pt_now_s() < until);
    return 0;
}

/* One round: commands, UCX progress until it has nothing left, upkeep; then,
 * with requests in flight, polls briefly (SPIN_US); then sleeps on the
 * worker's event fd and the wake fd for at most max_wait_ms. */
static void progress_round(pt_transport *t, int max_wait_ms)
{
    run_commands(t);
    while (ucp_worker_progress(t->worker)) {
    }
    pt_transport_maintain_connections(t);
    atomic_store(&t->upkeep_ms, (long long)(pt_now_s() * 1000.0));
    if (t->in_flight && poll_briefly(t)) return;
    atomic_store(&t->in_epoll, 1);
    ucs_status_t status = commands_queued(t) ? UCS_ERR_BUSY : ucp_worker_arm(t->worker);
    if (status == UCS_ERR_BUSY) {
        atomic_store(&t->in_epoll, 0);
        return;
    }
    if (status != UCS_OK) pt_warn("transport: ucp_worker_arm: %s", ucs_status_string(status));
    int wait_ms = pt_transport_next_deadline_ms(t);
    if (wait_ms > max_wait_ms) wait_ms = max_wait_ms;
    struct epoll_event events[2];
    pt_transport_ucx_lock_release(t);
    int n = epoll_wait(t->epoll_fd, events, 2, status == UCS_OK ? wait_ms : 1);
    atomic_store(&t->in_epoll, 0);
    pt_transport_ucx_lock_acquire(t);
    for (int i = 0; i < n; i++) {
        if (events[i].data.fd == t->wake_fd) {
            uint64_t count;
            ssize_t got = read(t->wake_fd, &count, sizeof count);
            (void)got;
        }
    }
}

static int all_byes_acknowledged(const pt_transport *t)
{
    for (const connection *c = t->connections; c; c = c->next)
        if (c->state == CONN_READY && c->bye_sent && !c->bye_acked) return 0;
    return 1;
}

static int all_connections_closed(const pt_transport *t)
{
    for (const connection *c = t->connections; c; c = c->next)
        if (c->state != CONN_CLOSED || c->ops > 0) return 0;
    return 1;
}

static void progress_until(pt_transport *t, int (*done)(const pt_transport *), double seconds)
{
    double deadline = pt_now_s() + seconds;
    while (!done(t) && pt_now_s() < deadline) progress_round(t, 50);
}

/* Goodbyes first, so that peers see us leave rather than fail; then closes.
 *
 * Endpoints are closed with UCP_EP_CLOSE_FLAG_FORCE: a peer that acknowledged
 * our goodbye has received everything we sent before it (one ordered lane),
 * and what is still in flight (a rendezvous send the peer never matched) is
 * to be cancelled anyway. A graceful close would also trip an assertion in
 * UCX 1.13 when such a rendezvous request is still attached to the endpoint. */
static void shut_down(pt_transport *t)
{
    pt_transport_stop_hellos(t);
    for (connection *c = t->connections; c; c = c->next) {
        if (c->state != CONN_READY || c->peer_left) continue;
        c->bye_sent = 1;
        pt_transport_send_control(c, CONTROL_BYE);
    }
    progress_until(t, all_byes_acknowledged, SHUTDOWN_STEP_S);
    pt_transport_cancel_receives_from(t, -1, PIPERT_ERR_INTERRUPTED, "the transport was shut down");
    for (connection *c = t->connections; c; c = c->next) pt_transport_connection_close(c);
    progress_until(t, all_connections_closed, SHUTDOWN_STEP_S);
}

void *pt_transport_progress_main(void *arg)
{
    pt_transport *t = arg;
    pt_transport_ucx_lock_acquire(t);
    for (;;) {
        pthread_mutex_lock(&t->queue_lock);
        int stopping = t->stopping;
        pthread_mutex_unlock(&t->queue_lock);
        if (stopping) break;
        progress_round(t, IDLE_WAKE_MS);
    }
    run_commands(t); /* commands queued before `stopping` was set */
    shut_down(t);
    pt_transport_ucx_lock_release(t);
    return NULL;
}

/* ---- user threads driving UCX while the progress thread sleeps ----------- */

/* The UCX lock for a user thread: only if it is free (the progress thread sleeps in epoll) and
 * the transport is not shutting down (its worker may be gone). */
static int ucx_lock_try_while_running(pt_transport *t)
{
    if (!ucx_lock_try(t)) return 0;
    pthread_mutex_lock(&t->queue_lock);
    int stopping = t->stopping;
    pthread_mutex_unlock(&t->queue_lock);
    if (stopping) pt_transport_ucx_lock_release(t);
    return !stopping;
}

/* Before a user thread gives the lock back: leaves the worker as the sleeping progress thread
 * left it, progressed and armed, so that what comes next wakes it. Returns 1 if it cannot be
 * armed (events wait): then the progress thread must be woken to look. */
static int progress_and_arm(pt_transport *t)
{
    while (ucp_worker_progress(t->worker)) {
    }
    return ucp_worker_arm(t->worker) != UCS_OK;
}

/* Posts on this thread when UCX is free (the progress thread sleeps), which
 * saves a thread hand-off: an eager send then completes before we return,
 * and a receive waits without waking anyone. Commands already queued run
 * first, so requests keep the order in which they were made. Returns 0 if
 * the caller must queue the request instead. */
static int post_directly(pt_transport *t, pt_request *r)
{
    if (!ucx_lock_try_while_running(t)) return 0;
    run_commands(t);
    if (r->type == REQUEST_SEND)
        pt_transport_post_send(t, r);
    else
        pt_transport_post_receive(t, r);
    int busy = progress_and_arm(t);
    pt_transport_ucx_lock_release(t);
    if (busy) pt_transport_wake_progress_thread(t);
    return 1;
}

/* Posts r on this thread if UCX is free, else queues it for the progress thread (r is freed
 * if it cannot be queued). */
pipert_result pt_transport_submit(pt_transport *t, pt_request *r, pt_request **out)
{
    if (post_directly(t, r)) {
        *out = r;
        return PIPERT_OK;
    }
    pipert_result rc = pt_transport_enqueue(t, COMMAND_POST, r, NULL);
    if (rc != PIPERT_OK) {
        free(r);
        return rc;
    }
    *out = r;
    return PIPERT_OK;
}

/* What the progress thread's epoll reports for the worker's event fd: EPOLLIN, or 0 while a
 * waiter polls (the waiter handles those events; waking the progress thread for them would only
 * take a core from it). */
static void set_worker_events(pt_transport *t, uint32_t events)
{
    struct epoll_event event = {.events = events, .data.fd = t->worker_fd};
    if (epoll_ctl(t->epoll_fd, EPOLL_CTL_MOD, t->worker_fd, &event) != 0)
        pt_warn("transport: epoll_ctl on the worker's event fd: %s", strerror(errno));
}

/* Before sleeping, a waiter drives UCX itself for at most `seconds` if the
 * progress thread sleeps: it holds the UCX lock meanwhile, mutes the worker's
 * fd in the progress thread's epoll, and leaves the worker progressed and
 * armed (as post_directly does). */
void pt_transport_poll_while_waiting(pt_request *r, double seconds)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    pt_transport *t = r->state == REQUEST_PENDING ? r->t : NULL;
    if (t) t->pollers++; /* keeps t alive: release() waits for pollers to leave */
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!t) return;
    if (ucx_lock_try_while_running(t)) {
        set_worker_events(t, 0);
        double until = pt_now_s() + seconds;
        do {
            run_commands(t);
            while (ucp_worker_progress(t->worker)) {
            }
        } while (!pt_transport_request_done(r) && pt_now_s() < until);
        int busy = progress_and_arm(t);
        /* Unmuted once armed: an event from here on makes the fd readable, and epoll sees it. */
        set_worker_events(t, EPOLLIN);
        pt_transport_ucx_lock_release(t);
        if (busy) pt_transport_wake_progress_thread(t);
    }
    pthread_mutex_lock(&pt_transport_state_lock);
    if (--t->pollers == 0) pthread_cond_broadcast(&pt_transport_state_changed);
    pthread_mutex_unlock(&pt_transport_state_lock);
}
