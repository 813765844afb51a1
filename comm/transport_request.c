/* A request's life: its first failure recorded, its completion (result, callback, then its
 * waiters woken), and the pt_request_* API: test, wait, callbacks, cancel, free. A request
 * outlives its transport: its completion is under the process-wide state lock. */
#include "comm/transport_internal.h"
#include "comm/transport_progress.h"
#include "comm/transport_request.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/clock.h"

/* A thread blocked in pt_request_wait drives UCX itself (if the progress thread sleeps) for at
 * most this long per call before it sleeps on the condition variable: an answer within that time
 * (a round trip on one host takes ~20 us) wakes neither the progress thread nor the waiter. */
#define WAIT_SPIN_US 100

/* ---- request completion -------------------------------------------------- */

/* Keeps the first failure of a request (a later one is a consequence). */
void pt_transport_record_failure(pt_request *r, pipert_result code, const char *fmt, ...)
{
    if (r->failed) return;
    r->failed = 1;
    r->result = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
}

static void in_flight_remove(pt_transport *t, pt_request *r)
{
    if (!r->in_flight) return;
    if (r->prev)
        r->prev->next = r->next;
    else
        t->in_flight = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->in_flight = 0;
}

void pt_transport_in_flight_add(pt_transport *t, pt_request *r)
{
    r->prev = NULL;
    r->next = t->in_flight;
    if (t->in_flight) t->in_flight->prev = r;
    t->in_flight = r;
    r->in_flight = 1;
}

/* The last touch of a request by the transport: publishes the result, runs
 * the callback, then wakes waiters (so a callback has run before wait returns). */
void pt_transport_complete_request(pt_request *r)
{
    if (r->t) in_flight_remove(r->t, r);
    if (!r->failed) r->result = PIPERT_OK;
    if (r->type == REQUEST_DISCARD) {
        free(r);
        return;
    }
    pthread_mutex_lock(&pt_transport_state_lock);
    r->state = REQUEST_COMPLETING;
    pt_request_callback callback = r->callback;
    void *arg = r->callback_arg;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (callback) callback(r, r->result, arg);
    pthread_mutex_lock(&pt_transport_state_lock);
    int free_now = r->free_requested;
    r->state = REQUEST_DONE;
    if (free_now && r->commands > 0) { /* a cancel command still to run reads it */
        r->free_when_idle = 1;
        free_now = 0;
    }
    pthread_cond_broadcast(&pt_transport_state_changed);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (free_now) free(r);
}

void pt_transport_request_command_done(pt_request *r)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    const int free_now = --r->commands == 0 && r->free_when_idle;
    pthread_cond_broadcast(&pt_transport_state_changed);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (free_now) free(r);
}

void pt_transport_fail_request(pt_request *r, pipert_result code, const char *fmt, ...)
{
    if (!r->failed) {
        r->failed = 1;
        r->result = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->message, sizeof r->message, fmt, ap);
        va_end(ap);
    }
    pt_transport_complete_request(r);
}

const char *pt_transport_request_verb(const pt_request *r)
{
    return r->type == REQUEST_SEND ? "send to" : "receive from";
}

/* "receive from rank 3 (kind 1, tag 7)" */
void pt_transport_describe_request(const pt_request *r, char *out, size_t capacity)
{
    snprintf(out, capacity, "%s rank %d (kind %u, tag %u)", pt_transport_request_verb(r), r->peer,
             r->kind, r->user_tag);
}

/* ---- waiting ------------------------------------------------------------- */

int pt_transport_wait_on_state(const struct timespec *deadline)
{
    return deadline ? pthread_cond_timedwait(&pt_transport_state_changed, &pt_transport_state_lock,
                                             deadline)
                    : pthread_cond_wait(&pt_transport_state_changed, &pt_transport_state_lock);
}

void pt_transport_deadline_after(double seconds, struct timespec *out)
{
    clock_gettime(CLOCK_REALTIME, out);
    double whole = (double)(long)seconds;
    out->tv_sec += (time_t)whole;
    out->tv_nsec += (long)((seconds - whole) * 1e9);
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

static pipert_result report(const pt_request *r)
{
    if (r->result != PIPERT_OK) return pt_fail(r->result, "%s", r->message);
    return PIPERT_OK;
}

int pt_transport_request_done(pt_request *r)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    int done = r->state == REQUEST_DONE;
    pthread_mutex_unlock(&pt_transport_state_lock);
    return done;
}

int pt_request_test(pt_request *request, pipert_result *result)
{
    int done = pt_transport_request_done(request);
    if (done) *result = report(request);
    return done;
}

pipert_result pt_request_wait(pt_request *request, double timeout_s)
{
    if (pt_transport_holding_ucx_lock)
        return pt_fail(PIPERT_ERR_INTERNAL, "pt_request_wait called from a transport callback");
    double spin_s = WAIT_SPIN_US * 1e-6;
    pt_transport_poll_while_waiting(request,
                                    timeout_s >= 0 && timeout_s < spin_s ? timeout_s : spin_s);
    struct timespec deadline;
    if (timeout_s >= 0) pt_transport_deadline_after(timeout_s, &deadline);
    pthread_mutex_lock(&pt_transport_state_lock);
    while (request->state != REQUEST_DONE)
        if (pt_transport_wait_on_state(timeout_s >= 0 ? &deadline : NULL) == ETIMEDOUT) break;
    int done = request->state == REQUEST_DONE;
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!done) {
        char what[96];
        pt_transport_describe_request(request, what, sizeof what);
        return pt_fail(PIPERT_ERR_TIMEOUT, "%s: not complete after %.3g s", what, timeout_s);
    }
    return report(request);
}

/* ---- the rest of the API ------------------------------------------------- */

void pt_request_on_complete(pt_request *request, pt_request_callback fn, void *arg)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    if (request->state == REQUEST_PENDING) {
        request->callback = fn;
        request->callback_arg = arg;
        pthread_mutex_unlock(&pt_transport_state_lock);
        return;
    }
    /* Completing on this very thread (we are inside a callback): it cannot become DONE while we
     * wait. */
    while (request->state != REQUEST_DONE && !pt_transport_holding_ucx_lock)
        pthread_cond_wait(&pt_transport_state_changed, &pt_transport_state_lock);
    pthread_mutex_unlock(&pt_transport_state_lock);
    fn(request, request->result, arg);
}

const pt_message_header *pt_request_header(const pt_request *request) { return &request->header; }

const char *pt_request_error(const pt_request *request)
{
    return request->result == PIPERT_OK ? "" : request->message;
}

void pt_request_cancel(pt_request *request)
{
    pthread_mutex_lock(&pt_transport_state_lock);
    pt_transport *t = request->t;
    const int queue = request->state == REQUEST_PENDING && t && request->type == REQUEST_RECV;
    if (queue) request->commands++; /* kept alive until the command ran */
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (queue && pt_transport_enqueue(t, COMMAND_CANCEL, request, NULL) != PIPERT_OK)
        pt_transport_request_command_done(request);
}

/* Under the state lock: a request that has not ended, or has commands still queued, is freed
 * when it ends (pt_transport_complete_request) or its last command has run; true then. */
static bool free_when_idle_locked(pt_request *request)
{
    if (request->state == REQUEST_DONE && request->commands == 0) return false;
    if (request->state != REQUEST_DONE)
        request->free_requested = 1;
    else
        request->free_when_idle = 1;
    return true;
}

void pt_request_abandon(pt_request *request)
{
    if (!request) return;
    pt_request_cancel(request);
    pthread_mutex_lock(&pt_transport_state_lock);
    const bool later = free_when_idle_locked(request);
    pthread_mutex_unlock(&pt_transport_state_lock);
    if (!later) free(request);
}

void pt_request_free(pt_request *request)
{
    if (!request) return;
    pt_request_cancel(request);
    pthread_mutex_lock(&pt_transport_state_lock);
    /* From a callback, where waiting would wait for ourselves: freed later instead. */
    if (pt_transport_holding_ucx_lock && free_when_idle_locked(request)) {
        pthread_mutex_unlock(&pt_transport_state_lock);
        return;
    }
    while (request->state != REQUEST_DONE || request->commands > 0)
        pthread_cond_wait(&pt_transport_state_changed, &pt_transport_state_lock);
    pthread_mutex_unlock(&pt_transport_state_lock);
    free(request);
}
