/* The job's coordinator (coordinator.h): one thread, or the caller's loop, polls a
 * listening socket and every worker's connection; it admits ranks (coordinator_admit.c: the
 * hello, the registration, the table once all are in), watches heartbeats and deadlines,
 * aggregates progress and aborts the job. */
#include "comm/coordinator_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "comm/auth.h"
#include "comm/bootstrap.h"
#include "comm/coordinator_protocol.h"
#include "comm/membership.h"
#include "runtime/log.h"

/* A message from a worker longer than this is a protocol error; the table the
 * coordinator sends may be longer (every rank's address: coordinator_client.c). */
#define MAX_WORKER_MESSAGE (PT_ADDRESS_MAX + 4096)
/* Queued output beyond this means the peer stopped reading. */
#define MAX_QUEUED_OUTPUT (256u << 20)
/* A connection must register within this long (or the registration timeout, if shorter). */
#define UNREGISTERED_GRACE_S 10.0
#define SERVE_SLICE_MS 100

/* Copies src into dst[cap], cut short if it must be. */
static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t length = strnlen(src, cap - 1);
    memcpy(dst, src, length);
    dst[length] = '\0';
}

/* "address:port" of a socket's peer, for messages. */
static void describe_peer(int fd, char *text, size_t cap)
{
    struct sockaddr_storage addr;
    socklen_t length = sizeof addr;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getpeername(fd, (struct sockaddr *)&addr, &length) != 0 ||
        getnameinfo((struct sockaddr *)&addr, length, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(text, cap, "an unknown peer");
        return;
    }
    snprintf(text, cap, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
}

/* ---- output -------------------------------------------------------------- */

/* Writes what `conn` has queued, as far as the socket takes it now. */
static void flush_output(connection *conn)
{
    while (conn->out.length > 0 && !conn->broken) {
        ssize_t n = send(conn->fd, conn->out.data, conn->out.length, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) pt_coord_buffer_consume(&conn->out, (size_t)n);
        else if (n < 0 && errno == EINTR) continue;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        else conn->broken = true;
    }
}

static void send_to(connection *conn, const char *line, size_t length)
{
    if (!conn || conn->broken) return;
    if (conn->out.length + length > MAX_QUEUED_OUTPUT ||
        !pt_coord_buffer_append(&conn->out, line, length)) {
        conn->broken = true; /* it stopped reading, or we are out of memory */
        return;
    }
    flush_output(conn);
}

/* Takes `message` over; sealed once the connection's registration was accepted. */
void pt_coord_send(connection *conn, json_t *message)
{
    if (!conn) {
        json_decref(message);
        return;
    }
    size_t length;
    char *line = pt_coord_seal_message(&conn->seal, message, &length);
    if (line) send_to(conn, line, length);
    else conn->broken = true;
    free(line);
}

/* The registration is accepted: "welcome", then sealed lines both ways. */
void pt_coord_welcome(pt_coordinator *c, connection *conn)
{
    pt_coord_send(conn, json_pack("{s:s}", "type", "welcome"));
    pt_coord_seal_start(&conn->seal, &c->key, conn->peer_nonce, conn->nonce);
}

/* Sends to every registered rank still connected (each line sealed for its connection). */
void pt_coord_broadcast(pt_coordinator *c, json_t *message)
{
    for (int r = 0; message && r < c->options.world; r++)
        if (c->ranks[r].conn) pt_coord_send(c->ranks[r].conn, json_deep_copy(message));
    json_decref(message);
}

/* ---- job state ----------------------------------------------------------- */

void pt_coord_abort_locked(pt_coordinator *c, int rank, const char *reason)
{
    if (rank >= 0 && !c->ranks[rank].failed) {
        c->ranks[rank].failed = true;
        copy_text(c->ranks[rank].failure, sizeof c->ranks[rank].failure, reason);
    }
    if (c->phase == PT_JOB_ABORTED || c->phase == PT_JOB_FINISHED) return;
    c->phase = PT_JOB_ABORTED;
    c->abort_rank = rank;
    copy_text(c->abort_reason, sizeof c->abort_reason, reason);
    if (rank >= 0) pt_error("job aborted: rank %d: %s", rank, reason);
    else pt_error("job aborted: %s", reason);
    pt_coord_broadcast(c, json_pack("{s:s, s:i, s:s}", "type", "abort", "rank", rank, "reason", reason));
    pthread_cond_broadcast(&c->changed);
}

bool pt_coord_rank_left(const pt_coordinator *c, int rank)
{
    return !pt_membership_rank_live(&c->membership, rank);
}

/* Every live rank said done. */
void pt_coord_finish_if_done(pt_coordinator *c)
{
    int done = 0;
    for (int r = 0; r < c->options.world; r++)
        if (c->ranks[r].done && !pt_coord_rank_left(c, r)) done++;
    if (done < pt_membership_live_ranks(&c->membership) || c->phase != PT_JOB_RUNNING) return;
    c->phase = PT_JOB_FINISHED;
    pt_coord_broadcast(c, json_pack("{s:s}", "type", "finished"));
    pthread_cond_broadcast(&c->changed);
}

static void rank_failed_locked(pt_coordinator *c, int rank, const char *reason);

/* The switch the membership just set, to every rank. */
void pt_coord_announce_switch(pt_coordinator *c)
{
    pt_membership *ms = &c->membership;
    pt_info("coordinator: every survivor heard of membership change %ld; new coupling groups "
            "after step %ld%s", ms->switch_epoch, ms->switch_step,
            ms->switch_donor >= 0 ? ", where the replicas that came back take their state" : "");
    json_t *joiners = json_array();
    for (int r = 0; r < ms->replicas; r++)
        if (ms->switch_joiners[r]) json_array_append_new(joiners, json_integer(r));
    pt_coord_broadcast(c, json_pack("{s:s, s:I, s:I, s:I, s:i, s:o}", "type", "switch", "epoch",
                           (json_int_t)ms->switch_epoch, "step", (json_int_t)ms->switch_step,
                           "sequence", (json_int_t)ms->switch_sequence, "donor",
                           ms->switch_donor, "joiners", joiners));
}

/* The last acknowledgement of a departure announces the switch. */
void pt_coord_acknowledged(pt_coordinator *c, int rank, long epoch, long step, uint32_t sequence)
{
    if (pt_membership_acknowledge(&c->membership, rank, epoch, step, sequence)) pt_coord_announce_switch(c);
}

/* joined {epoch}: a rank of a replica coming back took the state of switch `epoch`. When that
 * was the last of its replica's for the switch that let it in last, the replica is in: its
 * ranks hear it ("in") and start training; that may complete the newest epoch's
 * acknowledgements (the others acknowledged while it was still joining). */
static void handle_joined(pt_coordinator *c, int rank, json_t *m)
{
    long epoch;
    if (!pt_coord_get_long(m, "epoch", &epoch)) {
        rank_failed_locked(c, rank, "sent a malformed 'joined'");
        return;
    }
    const pt_joined joined = pt_membership_joiner_in(&c->membership, rank, epoch);
    if (joined == PT_JOINED_STALE) {
        pt_debug("coordinator: rank %d took the state of switch %ld, which a newer one "
                 "superseded: it takes the newer one's", rank, epoch);
        return;
    }
    pt_debug("coordinator: rank %d took the state of switch %ld", rank, epoch);
    if (joined == PT_JOINED_WAIT) return;
    const int replica = pt_membership_replica_of(&c->membership, rank);
    pt_info("coordinator: replica %d is in the job again (every rank took the state of switch "
            "%ld)", replica, epoch);
    pt_coord_broadcast(c, json_pack("{s:s, s:i, s:I}", "type", "in", "replica", replica, "epoch",
                                     (json_int_t)epoch));
    if (joined == PT_JOINED_IN_SWITCH) pt_coord_announce_switch(c);
}

/* A rank that is done trains no more: it counts as having acknowledged. */
void pt_coord_done_ranks_acknowledge(pt_coordinator *c)
{
    for (int r = 0; r < c->options.world; r++)
        if (c->ranks[r].done && !pt_coord_rank_left(c, r))
            pt_coord_acknowledged(c, r, c->membership.epoch, c->ranks[r].progress.step, 0);
}

/* A running elastic job loses the failed rank's replica (membership.h);
 * otherwise, or when too few replicas would remain, the job aborts. */
static void rank_failed_locked(pt_coordinator *c, int rank, const char *reason)
{
    /* while the job is rebuilt, the membership is not known yet: acted upon then */
    if (rank >= 0 && c->phase == PT_JOB_RUNNING && pt_coord_recovery_note_exit(c, rank, false, reason))
        return;
    if (rank < 0 || c->phase != PT_JOB_RUNNING) {
        pt_coord_abort_locked(c, rank, reason);
        return;
    }
    pt_membership *m = &c->membership;
    const int replica = pt_membership_replica_of(m, rank);
    switch (pt_membership_rank_failed(m, rank)) {
    case PT_DEPARTURE_IGNORED:
        if (c->ranks[rank].joining) pt_coord_joiner_failed(c, rank, reason);
        else pt_debug("coordinator: rank %d of replica %d, which left, ended: %s", rank, replica,
                      reason);
        return;
    case PT_DEPARTURE_ABORT:
        if (pt_membership_elastic(m)) {
            char why[600];
            snprintf(why, sizeof why, "%s; only %d replica%s would remain (--min-replicas %d)",
                     reason, m->live - 1, m->live - 1 == 1 ? "" : "s", m->min_replicas);
            pt_coord_abort_locked(c, rank, why);
        } else {
            pt_coord_abort_locked(c, rank, reason);
        }
        return;
    case PT_DEPARTURE_LEFT:
        break;
    }
    c->ranks[rank].failed = true;
    copy_text(c->ranks[rank].failure, sizeof c->ranks[rank].failure, reason);
    pt_warn("replica %d leaves the job: rank %d: %s; %d replica%s on (membership epoch %ld)",
            replica, rank, reason, m->live, m->live == 1 ? " goes" : "s go", m->epoch);
    pt_coord_broadcast(c, json_pack("{s:s, s:I, s:i, s:i, s:s}", "type", "leave", "epoch",
                           (json_int_t)m->epoch, "replica", replica, "rank", rank, "reason", reason));
    pthread_cond_broadcast(&c->changed);
    pt_coord_done_ranks_acknowledge(c);
    pt_coord_finish_if_done(c);
}

/* Formats a reason and hands it to act under the lock (the public forms below). */
static void with_reason(pt_coordinator *c, int rank, void (*act)(pt_coordinator *, int, const char *),
                        const char *fmt, va_list ap)
{
    char reason[512];
    vsnprintf(reason, sizeof reason, fmt, ap);
    pthread_mutex_lock(&c->lock);
    act(c, rank >= 0 && rank < c->options.world ? rank : -1, reason);
    pthread_mutex_unlock(&c->lock);
}

void pt_coordinator_abort(pt_coordinator *c, int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    with_reason(c, rank, pt_coord_abort_locked, fmt, ap);
    va_end(ap);
}

static void read_input(pt_coordinator *c, connection *conn);

/* The launcher's word (pt_coordinator_drain first reads what the rank said last, so that its own
 * reason stands; while the job is being rebuilt the word is kept for then). */
void pt_coordinator_rank_failed(pt_coordinator *c, int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    with_reason(c, rank, rank_failed_locked, fmt, ap);
    va_end(ap);
}

void pt_coord_rank_failed(pt_coordinator *c, int rank, const char *reason)
{
    rank_failed_locked(c, rank, reason);
}

static void handle_done(pt_coordinator *c, rank_state *s, int rank);

void pt_coord_rank_done(pt_coordinator *c, int rank) { handle_done(c, &c->ranks[rank], rank); }

void pt_coordinator_rank_done(pt_coordinator *c, int rank)
{
    pthread_mutex_lock(&c->lock);
    if (rank >= 0 && rank < c->options.world && !pt_coord_recovery_note_exit(c, rank, true, "") &&
        c->phase == PT_JOB_RUNNING && !pt_coord_rank_left(c, rank))
        handle_done(c, &c->ranks[rank], rank);
    pthread_mutex_unlock(&c->lock);
}

void pt_coordinator_drain(pt_coordinator *c, int rank)
{
    pthread_mutex_lock(&c->lock);
    if (rank >= 0 && rank < c->options.world && c->ranks[rank].conn)
        read_input(c, c->ranks[rank].conn);
    pthread_mutex_unlock(&c->lock);
}

bool pt_coordinator_recovering(pt_coordinator *c)
{
    pthread_mutex_lock(&c->lock);
    const bool on = c->recovery.on;
    pthread_mutex_unlock(&c->lock);
    return on;
}

bool pt_coordinator_rank_left(pt_coordinator *c, int rank)
{
    pthread_mutex_lock(&c->lock);
    const bool left = rank >= 0 && rank < c->options.world && pt_coord_rank_left(c, rank);
    pthread_mutex_unlock(&c->lock);
    return left;
}

static void handle_progress(pt_coordinator *c, rank_state *s, json_t *m)
{
    long step = 0, total = 0;
    pt_coord_get_long(m, "step", &step);
    pt_coord_get_long(m, "total", &total);
    s->progress = (pt_rank_progress){step, total, pt_coord_get_double(m, "loss", NAN),
                                     pt_coord_get_double(m, "tokens_per_s", 0),
                                     pt_coord_get_double(m, "val_loss", NAN),
                                     pt_coord_get_double(m, "compute", NAN),
                                     pt_coord_get_double(m, "wait_pipeline", NAN),
                                     pt_coord_get_double(m, "wait_coupling", NAN),
                                     pt_coord_get_double(m, "bytes_wan", 0)};
    s->has_progress = true;
    if (!isnan(s->progress.val_loss) && step >= c->val_step) {
        c->val_step = step;
        c->val_loss = s->progress.val_loss;
    }
}

static void handle_done(pt_coordinator *c, rank_state *s, int rank)
{
    if (s->done) return;
    s->done = true;
    c->done++;
    pt_debug("coordinator: rank %d is done", rank);
    if (c->membership.epoch > 0) pt_coord_done_ranks_acknowledge(c);
    pt_coord_finish_if_done(c);
}

/* ack {epoch, step, sequence}: a survivor heard of a departure (membership.h). */
static void handle_ack(pt_coordinator *c, int rank, json_t *m)
{
    long epoch, step, sequence;
    if (!pt_coord_get_long(m, "epoch", &epoch) || !pt_coord_get_long(m, "step", &step) ||
        !pt_coord_get_long(m, "sequence", &sequence) || sequence < 0) {
        rank_failed_locked(c, rank, "sent a malformed acknowledgement");
        return;
    }
    pt_coord_acknowledged(c, rank, epoch, step, (uint32_t)sequence);
}

static void handle_message(pt_coordinator *c, connection *conn, const char *line, size_t length)
{
    const char *why;
    json_t *m = pt_coord_seal_open(&conn->seal, line, length, &why);
    if (!m && conn->seal.on) {
        pt_warn("coordinator: dropped %s on rank %d's connection (from %s)", why, conn->rank,
                conn->peer);
        return;
    }
    const char *type = m ? pt_coord_get_string(m, "type") : NULL;
    if (!type) {
        pt_warn("coordinator: %s sent something that is not a message; closing it", conn->peer);
        if (conn->rank >= 0) rank_failed_locked(c, conn->rank, "sent a malformed message");
        conn->broken = true;
    } else if (conn->rank < 0) {
        if (!strcmp(type, "hello")) pt_coord_hello(c, conn, m);
        else if (!strcmp(type, "register")) pt_coord_register(c, conn, m);
        else {
            pt_warn("coordinator: refused a connection from %s: '%s' before registering",
                    conn->peer, type);
            pt_coord_refuse(conn, "register first", false);
        }
    } else {
        rank_state *s = &c->ranks[conn->rank];
        if (!strcmp(type, "heartbeat")) {
        } else if (!strcmp(type, "progress")) handle_progress(c, s, m);
        else if (!strcmp(type, "done")) handle_done(c, s, conn->rank);
        else if (!strcmp(type, "ack")) handle_ack(c, conn->rank, m);
        else if (!strcmp(type, "ready")) pt_coord_joiner_ready(c, conn->rank);
        else if (!strcmp(type, "joined")) handle_joined(c, conn->rank, m);
        else if (!strcmp(type, "error")) {
            const char *reason = pt_coord_get_string(m, "reason");
            rank_failed_locked(c, conn->rank, reason ? reason : "failed (no reason given)");
        } else pt_warn("coordinator: rank %d sent an unknown message '%s' (ignored)", conn->rank, type);
    }
    json_decref(m);
}

/* Reads what the socket has and handles every complete line. */
static void read_input(pt_coordinator *c, connection *conn)
{
    char chunk[65536];
    for (;;) {
        ssize_t n = recv(conn->fd, chunk, sizeof chunk, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) { /* closed by the peer, or reset */
            conn->broken = true;
            break;
        }
        conn->last_heard = pt_now_s();
        if (!pt_coord_buffer_append(&conn->in, chunk, (size_t)n)) {
            conn->broken = true;
            break;
        }
    }
    /* Lines that arrived before a close still count (a "done" just before it); none after a
     * line that broke the connection (a stranger's random bytes are one warning, not many). */
    const bool closed_by_peer = conn->broken;
    char *newline;
    while (!conn->close_when_sent && conn->broken == closed_by_peer &&
           (newline = pt_coord_find_newline(&conn->in))) {
        size_t length = (size_t)(newline - conn->in.data);
        handle_message(c, conn, conn->in.data, length);
        pt_coord_buffer_consume(&conn->in, length + 1);
    }
    if (conn->in.length > MAX_WORKER_MESSAGE) {
        pt_warn("coordinator: %s sent a message longer than %d bytes; closing it", conn->peer,
                MAX_WORKER_MESSAGE);
        if (conn->rank >= 0) rank_failed_locked(c, conn->rank, "sent an oversized message");
        conn->broken = true;
    }
}

/* ---- connections --------------------------------------------------------- */

/* Takes a connected, non-blocking socket as a new connection; false (and the
 * socket closed) when out of memory. */
static bool add_connection(pt_coordinator *c, int fd)
{
    connection *conn = calloc(1, sizeof *conn);
    if (conn && c->n_conns == c->cap_conns) {
        int capacity = c->cap_conns ? 2 * c->cap_conns : 16;
        connection **grown = realloc(c->conns, (size_t)capacity * sizeof *grown);
        if (grown) {
            c->conns = grown;
            c->cap_conns = capacity;
        }
    }
    if (!conn || c->n_conns == c->cap_conns) {
        free(conn);
        close(fd);
        return false;
    }
    pt_coord_set_no_delay(fd);
    *conn = (connection){.fd = fd, .rank = -1, .opened_at = pt_now_s()};
    conn->last_heard = conn->opened_at;
    describe_peer(fd, conn->peer, sizeof conn->peer);
    c->conns[c->n_conns++] = conn;
    return true;
}

static void accept_connections(pt_coordinator *c)
{
    for (;;) {
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                pt_warn("coordinator: accept: %s", strerror(errno));
            return;
        }
        if (!add_connection(c, fd)) pt_warn("coordinator: out of memory; a connection was dropped");
    }
}

pipert_result pt_coordinator_adopt(pt_coordinator *c, int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        close(fd);
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: socket %d: %s", fd, strerror(errno));
    }
    pthread_mutex_lock(&c->lock);
    bool added = add_connection(c, fd);
    pthread_mutex_unlock(&c->lock);
    return added ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "coordinator: out of memory");
}

static void close_connection(connection *conn)
{
    close(conn->fd);
    pt_coord_buffer_free(&conn->in);
    pt_coord_buffer_free(&conn->out);
    free(conn);
}

/* Drops broken connections, and refused ones whose answer is out; a
 * registered rank lost before "done" aborts the job. */
static void sweep_connections(pt_coordinator *c)
{
    int kept = 0;
    for (int i = 0; i < c->n_conns; i++) {
        connection *conn = c->conns[i];
        bool drop = conn->broken || (conn->close_when_sent && conn->out.length == 0);
        if (!drop) {
            c->conns[kept++] = conn;
            continue;
        }
        if (conn->rank >= 0) {
            rank_state *s = &c->ranks[conn->rank];
            s->conn = NULL;
            if (s->joining) {
                pt_warn("coordinator: rank %d went away before its replica was back", conn->rank);
                s->joining = s->registered = false;
            } else if (!s->done)
                rank_failed_locked(c, conn->rank, "its connection closed before it said done "
                                                  "(the process died or was killed)");
        } else if (conn->challenged && !conn->close_when_sent) {
            pt_warn("coordinator: %s closed its connection after our challenge without "
                    "registering (our proof did not convince it: does it have the job's secret?)",
                    conn->peer);
        }
        close_connection(conn);
    }
    c->n_conns = kept;
}

/* ---- deadlines ----------------------------------------------------------- */

static void check_deadlines(pt_coordinator *c, double now)
{
    const pt_coordinator_options *o = &c->options;
    const bool live = c->phase == PT_JOB_REGISTERING || c->phase == PT_JOB_RUNNING;
    if (live && now - c->heartbeat_sent_at >= o->heartbeat_interval_s) {
        c->heartbeat_sent_at = now;
        for (int r = 0; r < o->world; r++)
            if (!c->ranks[r].done && (!pt_coord_rank_left(c, r) || c->ranks[r].joining))
                pt_coord_send(c->ranks[r].conn, json_pack("{s:s}", "type", "heartbeat"));
    }
    for (int i = 0; i < c->n_conns; i++) {
        connection *conn = c->conns[i];
        double silent = now - conn->last_heard, age = now - conn->opened_at;
        if (conn->rank < 0 && !conn->close_when_sent &&
            age > fmin(UNREGISTERED_GRACE_S, o->register_timeout_s)) {
            pt_warn("coordinator: closed a connection from %s: it did not register within %.0f s",
                    conn->peer, age);
            conn->broken = true;
        } else if (live && conn->rank >= 0 && !c->ranks[conn->rank].done &&
                   !pt_coord_rank_left(c, conn->rank) && silent > o->dead_after_s) {
            char reason[128];
            snprintf(reason, sizeof reason, "sent nothing for %.1f s (no heartbeat: hung, stopped "
                                            "or unreachable)",
                     silent);
            rank_failed_locked(c, conn->rank, reason);
        }
    }
    pt_coord_recovery_check(c, now);
    if (c->phase == PT_JOB_REGISTERING && now - c->created_at > o->register_timeout_s) {
        char missing[256] = "";
        size_t used = 0;
        int listed = 0;
        for (int r = 0; r < o->world && used < sizeof missing - 16; r++)
            if (!c->ranks[r].registered && listed++ < 16)
                used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                         listed > 1 ? ", " : "", r);
        char reason[512];
        snprintf(reason, sizeof reason, "%d of %d ranks did not register within %g s (rank%s %s%s)",
                 o->world - c->registered, o->world, o->register_timeout_s,
                 o->world - c->registered > 1 ? "s" : "", missing,
                 listed > 16 ? ", ..." : "");
        pt_coord_abort_locked(c, -1, reason);
    }
}

/* ---- serving ------------------------------------------------------------- */

pipert_result pt_coordinator_poll(pt_coordinator *c, int timeout_ms)
{
    pthread_mutex_lock(&c->lock);
    const int n = c->n_conns;
    struct pollfd *fds = calloc((size_t)n + 1, sizeof *fds);
    connection **polled = calloc((size_t)n + 1, sizeof *polled);
    if (!fds || !polled) {
        pthread_mutex_unlock(&c->lock);
        free(fds);
        free(polled);
        return pt_fail(PIPERT_ERR_NOMEM, "coordinator: out of memory");
    }
    fds[0] = (struct pollfd){.fd = c->listen_fd, .events = POLLIN};
    for (int i = 0; i < n; i++) {
        polled[i + 1] = c->conns[i];
        fds[i + 1] = (struct pollfd){.fd = c->conns[i]->fd,
                                     .events = (short)(POLLIN | (c->conns[i]->out.length ? POLLOUT : 0))};
    }
    pthread_mutex_unlock(&c->lock);

    /* Only this function closes connections, so the polled ones stay valid. */
    int ready = poll(fds, (nfds_t)n + 1, timeout_ms);
    if (ready < 0 && errno != EINTR) {
        int saved = errno;
        free(fds);
        free(polled);
        return pt_fail(PIPERT_ERR_TRANSPORT, "coordinator: poll: %s", strerror(saved));
    }

    pthread_mutex_lock(&c->lock);
    for (int i = 1; ready > 0 && i <= n; i++) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_input(c, polled[i]);
        if (fds[i].revents & POLLOUT) flush_output(polled[i]);
    }
    if (ready > 0 && (fds[0].revents & POLLIN)) accept_connections(c);
    check_deadlines(c, pt_now_s());
    sweep_connections(c);
    pthread_mutex_unlock(&c->lock);
    free(fds);
    free(polled);
    return PIPERT_OK;
}

static void *serve_thread(void *arg)
{
    pt_coordinator *c = arg;
    while (!atomic_load(&c->stopping))
        if (pt_coordinator_poll(c, SERVE_SLICE_MS) != PIPERT_OK) {
            pt_error("%s", pipert_last_error());
            pt_coordinator_abort(c, -1, "the coordinator failed: %s", pipert_last_error());
            struct timespec pause = {0, SERVE_SLICE_MS * 1000000L};
            nanosleep(&pause, NULL);
        }
    return NULL;
}

pipert_result pt_coordinator_start(pt_coordinator *c)
{
    if (c->thread_started) return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: already serving");
    int rc = pt_log_thread_create(&c->thread, serve_thread, c);
    if (rc != 0) return pt_fail(PIPERT_ERR_INTERNAL, "coordinator: thread: %s", strerror(rc));
    c->thread_started = true;
    return PIPERT_OK;
}

/* ---- setup --------------------------------------------------------------- */

pipert_result pt_coordinator_listen(const char *host, int port, int *listen_fd, int *bound_port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *list;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host && *host ? host : NULL, service, &hints, &list);
    if (rc != 0)
        return pt_fail(PIPERT_ERR_TRANSPORT, "coordinator: cannot resolve %s: %s",
                       host ? host : "(any)", gai_strerror(rc));
    int saved = 0;
    for (struct addrinfo *ai = list; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
            struct sockaddr_storage bound;
            socklen_t length = sizeof bound;
            getsockname(fd, (struct sockaddr *)&bound, &length);
            *bound_port = ntohs(bound.ss_family == AF_INET6
                                    ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                    : ((struct sockaddr_in *)&bound)->sin_port);
            *listen_fd = fd;
            freeaddrinfo(list);
            return PIPERT_OK;
        }
        saved = errno;
        close(fd);
    }
    freeaddrinfo(list);
    return pt_fail(PIPERT_ERR_TRANSPORT, "coordinator: cannot listen on %s:%d: %s%s",
                   host && *host ? host : "*", port, strerror(saved),
                   saved == EADDRINUSE ? " (another job? choose another port: PIPERT_COORD_PORT or "
                                         "PIPERT_COORD)"
                                       : "");
}

/* The socket the caller gave (c->listen_fd), or a new one on bind_host:port. */
static pipert_result serve_socket(pt_coordinator *c, const pt_coordinator_options *o)
{
    if (c->listen_fd < 0) return pt_coordinator_listen(o->bind_host, o->port, &c->listen_fd, &c->port);
    struct sockaddr_storage bound;
    socklen_t length = sizeof bound;
    int flags = fcntl(c->listen_fd, F_GETFL);
    if (getsockname(c->listen_fd, (struct sockaddr *)&bound, &length) != 0 || flags < 0 ||
        fcntl(c->listen_fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: socket %d: %s", c->listen_fd,
                       strerror(errno));
    c->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    return PIPERT_OK;
}

static pipert_result check_options(const pt_coordinator_options *o)
{
    if (o->stages < 1 || o->world % o->stages != 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: %d ranks do not make pipelines of %d "
                                               "stages", o->world, o->stages);
    if (o->world < 1 || o->world > PT_MAX_WORLD)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: world %d outside [1, %d]", o->world,
                       PT_MAX_WORLD);
    if (!o->secret || strlen(o->secret) < PT_SECRET_MIN || strlen(o->secret) > PT_SECRET_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: a secret of %d to %d characters is "
                                               "required",
                       PT_SECRET_MIN, PT_SECRET_MAX);
    if (o->port < 0 || o->port > 65535)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: port %d outside [0, 65535]", o->port);
    if (!(o->heartbeat_interval_s > 0) || !(o->dead_after_s > o->heartbeat_interval_s) ||
        !(o->register_timeout_s > 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator: timeouts must be positive, with "
                                               "dead_after_s > heartbeat_interval_s");
    return PIPERT_OK;
}

pipert_result pt_coordinator_create(pt_coordinator **out, const pt_coordinator_options *options)
{
    *out = NULL;
    pipert_result checked = check_options(options);
    pt_coordinator *c = checked == PIPERT_OK ? calloc(1, sizeof *c) : NULL;
    if (c) c->ranks = calloc((size_t)options->world, sizeof *c->ranks);
    if (!c || !c->ranks) {
        if (options->listen_fd >= 0) close(options->listen_fd);
        if (checked != PIPERT_OK) return checked;
        free(c);
        return pt_fail(PIPERT_ERR_NOMEM, "coordinator: out of memory");
    }
    c->options = *options;
    pipert_result keyed = pt_auth_derive_key(options->secret, PT_AUTH_USE_COORDINATOR, &c->key);
    c->options.secret = NULL; /* the caller's; not kept */
    c->options.bind_host = NULL; /* only needed here */
    c->listen_fd = options->listen_fd; /* ours from here on */
    c->options.listen_fd = -1;
    c->abort_rank = -1;
    c->val_step = -1;
    c->val_loss = NAN;
    c->created_at = c->heartbeat_sent_at = pt_now_s();
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->changed, &attr);
    pthread_condattr_destroy(&attr);
    const int replicas = options->world / options->stages;
    pipert_result rc = keyed;
    if (rc == PIPERT_OK)
        rc = pt_membership_init(&c->membership, options->world, options->stages,
                                options->min_replicas > 0 ? options->min_replicas : replicas,
                                options->switch_margin > 0
                                    ? options->switch_margin
                                    : pt_membership_margin(options->stages));
    if (rc == PIPERT_OK) rc = serve_socket(c, options);
    if (rc == PIPERT_OK && options->recover) {
        c->phase = PT_JOB_RUNNING; /* the workers have their table */
        rc = pt_coord_recovery_init(c);
    }
    if (rc != PIPERT_OK) {
        pt_coordinator_free(c);
        return rc;
    }
    *out = c;
    return PIPERT_OK;
}

void pt_coordinator_free(pt_coordinator *c)
{
    if (!c) return;
    if (c->thread_started) {
        atomic_store(&c->stopping, true);
        pthread_join(c->thread, NULL);
    }
    for (int i = 0; i < c->n_conns; i++) {
        flush_output(c->conns[i]); /* a last "finished" or "abort" */
        close_connection(c->conns[i]);
    }
    free(c->conns);
    for (int r = 0; r < c->options.world; r++) free(c->ranks[r].address);
    free(c->ranks);
    pt_membership_free(&c->membership);
    pt_coord_recovery_free(c);
    if (c->listen_fd >= 0) close(c->listen_fd);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->changed);
    free(c);
}

int pt_coordinator_port(const pt_coordinator *c) { return c->port; }
