/* The worker's side of the coordinator (coord_client.h): once connected and registered
 * (coordinator_register.c), a thread of its own sends heartbeats, reads the table, "abort"
 * and "finished", and watches for a silent coordinator, registering again after a lost
 * connection. A lost coordinator ends the thread's talking; it then only waits out
 * lost_grace_s. */
#include "comm/coordinator_client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "comm/auth.h"
#include "comm/coordinator_protocol.h"
#include "runtime/log.h"

/* A send or a wake-up this late is logged: it is a good part of the heartbeat timeout. */
#define STALL_WORTH_SAYING_S 1.5

/* ---- sending ------------------------------------------------------------- */

/* Sends a line; while the client reconnects, only the registration's own (handshake) go
 * out, the rest are dropped. */
pipert_result pt_coord_client_send_line(pt_coord_client *c, json_t *message, bool handshake)
{
    size_t length;
    pthread_mutex_lock(&c->send_lock);
    if (!handshake && atomic_load(&c->reconnecting)) {
        pthread_mutex_unlock(&c->send_lock);
        json_decref(message);
        return PIPERT_OK;
    }
    char *line = pt_coord_seal_message(&c->seal, message, &length);
    if (!line) {
        pthread_mutex_unlock(&c->send_lock);
        return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    }
    int saved = 0;
    const double started = pt_now_s();
    for (size_t sent = 0; sent < length;) {
        ssize_t n = send(c->fd, line + sent, length - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            saved = n < 0 ? errno : EPIPE;
            break;
        }
        sent += (size_t)n;
    }
    c->last_sent = pt_now_s();
    const double blocked_s = c->last_sent - started;
    pthread_mutex_unlock(&c->send_lock);
    free(line);
    /* The socket was full: the coordinator did not read, and heartbeats waited meanwhile. */
    if (blocked_s > STALL_WORTH_SAYING_S)
        pt_warn("rank %d: a send to the coordinator at %s blocked for %.1f s", c->rank, c->where,
                blocked_s);
    if (saved)
        return pt_fail(PIPERT_ERR_TRANSPORT, "cannot send to the coordinator at %s: %s", c->where,
                       strerror(saved));
    return PIPERT_OK;
}

static pipert_result client_send(pt_coord_client *c, json_t *message)
{
    return pt_coord_client_send_line(c, message, false);
}

/* ---- receiving ----------------------------------------------------------- */

/* The first abort wins. The callback runs before the flag is raised, so
 * whoever sees pt_coord_client_aborted() also sees what the callback did. */
static void client_abort(pt_coord_client *c, int rank, const char *reason)
{
    pthread_mutex_lock(&c->lock);
    bool first = !c->abort_claimed;
    if (first) {
        c->abort_claimed = true;
        c->abort_rank = rank;
        snprintf(c->abort_reason, sizeof c->abort_reason, "%s", reason);
    }
    pthread_mutex_unlock(&c->lock);
    if (!first) return;
    if (c->on_abort) c->on_abort(c->on_abort_context, rank, reason);
    pthread_mutex_lock(&c->lock);
    atomic_store(&c->aborted, true);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* The coordinator is gone: the job aborts, or (outlive_coordinator) the loss is
 * remembered (the session logs it, on its own thread's sink) and waiters woken. */
static void client_lost(pt_coord_client *c, const char *why)
{
    if (!c->outlive_coordinator) {
        client_abort(c, -1, why);
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (atomic_load(&c->lost)) { /* the first word stands, and the grace runs from it */
        pthread_mutex_unlock(&c->lock);
        return;
    }
    snprintf(c->lost_reason, sizeof c->lost_reason, "%s", why);
    c->lost_at = pt_now_s();
    atomic_store(&c->lost, true);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* The coordinator, silent past the heartbeat timeout, speaks again: it was a link down (a site
 * cut off for about the timeout), not its death. The loss is taken back: progress and "done"
 * go out again, the grace stops running, and this rank votes that the coordinator lives (the
 * session logs it: session/coordinator_loss.c). */
static void client_heard_again(pt_coord_client *c)
{
    if (!atomic_load(&c->lost)) return;
    pthread_mutex_lock(&c->lock);
    atomic_store(&c->lost, false);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

static void free_table(pt_peer_table *t)
{
    for (int r = 0; t->peers && r < t->world; r++) free(t->peers[r].address);
    free(t->peers);
    *t = (pt_peer_table){0};
}

/* Fills the table from a "table" message; false if it is malformed. */
static bool parse_table(json_t *m, pt_peer_table *t)
{
    long world;
    json_t *peers = json_object_get(m, "peers");
    if (!pt_coord_get_long(m, "world", &world) || world < 1 || world > PT_MAX_WORLD ||
        !json_is_array(peers) || json_array_size(peers) != (size_t)world)
        return false;
    t->peers = calloc((size_t)world, sizeof *t->peers);
    if (!t->peers) return false;
    t->world = (int)world;
    for (long i = 0; i < world; i++) {
        json_t *p = json_array_get(peers, (size_t)i);
        long rank, pid;
        const char *host = pt_coord_get_string(p, "host"),
                   *address = pt_coord_get_string(p, "address");
        if (!pt_coord_get_long(p, "rank", &rank) || rank != i ||
            !pt_coord_get_long(p, "pid", &pid) || !host || !address || strlen(host) >= PT_HOST_MAX)
            return false;
        pt_peer *peer = &t->peers[i];
        peer->rank = (int)rank;
        peer->pid = (int)pid;
        snprintf(peer->host, sizeof peer->host, "%s", host);
        if (!(peer->address = strdup(address))) return false;
    }
    return true;
}

/* leave {epoch, replica, rank, reason}: a replica is out of the job. */
static void client_heard_leave(pt_coord_client *c, json_t *m)
{
    long epoch, replica, rank = -1;
    const char *reason = pt_coord_get_string(m, "reason");
    pt_coord_get_long(m, "rank", &rank);
    if (!pt_coord_get_long(m, "epoch", &epoch) || !pt_coord_get_long(m, "replica", &replica) ||
        replica < 0 || replica >= c->world) {
        client_abort(c, -1, "the coordinator sent a malformed departure");
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->left[replica]) c->membership.departures++;
    c->left[replica] = true;
    snprintf(c->left_reason[replica], sizeof c->left_reason[replica], "rank %ld %s", rank,
             reason ? reason : "failed");
    if (epoch > c->membership.epoch) c->membership.epoch = epoch;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* Whether a join's peers include this worker (its own replica coming back). */
static bool replica_is_mine(const pt_coord_client *c, json_t *peers)
{
    for (size_t i = 0; i < json_array_size(peers); i++) {
        long rank;
        if (pt_coord_get_long(json_array_get(peers, i), "rank", &rank) && rank == c->rank) return true;
    }
    return false;
}

/* join {epoch, replica, peers: [{rank, address}, ...]}: a replica that left is back, its
 * ranks at new data-plane addresses. */
static void client_heard_join(pt_coord_client *c, json_t *m)
{
    long epoch, replica;
    json_t *peers = json_object_get(m, "peers");
    if (!pt_coord_get_long(m, "epoch", &epoch) || !pt_coord_get_long(m, "replica", &replica) ||
        replica < 0 || replica >= c->world || !json_is_array(peers)) {
        client_abort(c, -1, "the coordinator sent a malformed join");
        return;
    }
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; c->has_table && i < json_array_size(peers); i++) {
        json_t *p = json_array_get(peers, i);
        long rank;
        const char *address = pt_coord_get_string(p, "address");
        char *copy = address ? strdup(address) : NULL;
        if (!pt_coord_get_long(p, "rank", &rank) || rank < 0 || rank >= c->table.world || !copy) {
            free(copy);
            continue;
        }
        free(c->table.peers[rank].address);
        c->table.peers[rank].address = copy;
    }
    if (c->left[replica] || replica_is_mine(c, peers)) c->membership.joins++;
    c->left[replica] = false;
    c->left_reason[replica][0] = '\0';
    c->join_epoch[replica] = epoch;
    if (epoch > c->membership.epoch) c->membership.epoch = epoch;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&c->callback_lock);
    if (c->on_join) c->on_join(c->on_join_context, (int)replica, epoch);
    pthread_mutex_unlock(&c->callback_lock);
}

void pt_coord_client_stop_join_callback(pt_coord_client *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->callback_lock);
    c->on_join = NULL;
    pthread_mutex_unlock(&c->callback_lock);
}

/* Whether `joiners` (NULL: none) is an array of distinct replicas below `world`; if so they
 * are marked in `out`. */
static bool read_joiners(const json_t *joiners, int world, bool *out)
{
    memset(out, 0, (size_t)world * sizeof *out);
    if (!joiners) return true;
    if (!json_is_array(joiners)) return false;
    size_t i;
    const json_t *entry;
    json_array_foreach(joiners, i, entry) {
        const json_int_t r = json_is_integer(entry) ? json_integer_value(entry) : -1;
        if (r < 0 || r >= world || out[r]) return false;
        out[r] = true;
    }
    return true;
}

/* switch {epoch, step, sequence, donor, joiners}: when the survivors change groups. */
static void client_heard_switch(pt_coord_client *c, json_t *m)
{
    long epoch, step, sequence, donor = -1;
    bool *joiners = calloc((size_t)c->world, sizeof *joiners);
    if (!joiners) {
        client_abort(c, -1, "out of memory for a switch");
        return;
    }
    pt_coord_get_long(m, "donor", &donor);
    if (!pt_coord_get_long(m, "epoch", &epoch) || !pt_coord_get_long(m, "step", &step) ||
        !pt_coord_get_long(m, "sequence", &sequence) || sequence < 0 || sequence > UINT32_MAX ||
        donor < -1 || donor >= c->world ||
        !read_joiners(json_object_get(m, "joiners"), c->world, joiners)) {
        free(joiners);
        client_abort(c, -1, "the coordinator sent a malformed switch");
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (epoch > c->membership.switch_epoch) {
        c->membership.switch_epoch = epoch;
        c->membership.switch_step = step;
        c->membership.switch_sequence = (uint32_t)sequence;
        c->membership.switch_donor = (int)donor;
        memcpy(c->switch_joiners, joiners, (size_t)c->world * sizeof *joiners);
    }
    free(joiners);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

/* in {replica, epoch}: every rank of a replica that came back took the state of switch `epoch`. */
static void client_heard_in(pt_coord_client *c, json_t *m)
{
    long replica, epoch;
    if (!pt_coord_get_long(m, "replica", &replica) || !pt_coord_get_long(m, "epoch", &epoch) ||
        replica < 0 || replica >= c->world) {
        client_abort(c, -1, "the coordinator sent a malformed 'in'");
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (epoch > c->in_epoch[replica]) c->in_epoch[replica] = epoch;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
}

static void client_handle_message(pt_coord_client *c, json_t *m)
{
    const char *type = pt_coord_get_string(m, "type");
    if (!type) return;
    if (!strcmp(type, "table")) {
        pt_peer_table table = {0};
        if (!parse_table(m, &table)) {
            free_table(&table);
            client_abort(c, -1, "the coordinator sent a malformed table");
            return;
        }
        pthread_mutex_lock(&c->lock);
        c->table = table;
        c->has_table = true;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
    } else if (!strcmp(type, "abort")) {
        long rank = -1;
        pt_coord_get_long(m, "rank", &rank);
        const char *reason = pt_coord_get_string(m, "reason");
        client_abort(c, (int)rank, reason ? reason : "no reason given");
    } else if (!strcmp(type, "leave")) {
        client_heard_leave(c, m);
    } else if (!strcmp(type, "switch")) {
        client_heard_switch(c, m);
    } else if (!strcmp(type, "join")) {
        client_heard_join(c, m);
    } else if (!strcmp(type, "in")) {
        client_heard_in(c, m);
    } else if (!strcmp(type, "finished")) {
        pthread_mutex_lock(&c->lock);
        c->finished = true;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
    }
    /* heartbeat, welcome: being heard is all they say */
}

/* Handles every complete line received. */
void pt_coord_client_handle_buffered(pt_coord_client *c)
{
    char *newline;
    while ((newline = pt_coord_find_newline(&c->in))) {
        size_t length = (size_t)(newline - c->in.data);
        const char *why;
        json_t *m = pt_coord_seal_open(&c->seal, c->in.data, length, &why);
        pt_coord_buffer_consume(&c->in, length + 1);
        if (!m && c->seal.on) { /* counted here, logged by the session's thread */
            pthread_mutex_lock(&c->lock);
            c->dropped++;
            snprintf(c->dropped_why, sizeof c->dropped_why, "%s", why);
            pthread_mutex_unlock(&c->lock);
        }
        if (m) client_handle_message(c, m);
        json_decref(m);
    }
}

/* Reads what there is and handles complete lines; false when the connection
 * closed or failed (*why says how). */
static bool client_read(pt_coord_client *c, char *why, size_t cap)
{
    char chunk[65536];
    ssize_t n = recv(c->fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
        snprintf(why, cap, n == 0 ? "the coordinator at %s closed the connection (it stopped or "
                                    "died)"
                                  : "lost the connection to the coordinator at %s",
                 c->where);
        return false;
    }
    c->last_heard = pt_now_s();
    if (!pt_coord_buffer_append(&c->in, chunk, (size_t)n)) {
        snprintf(why, cap, "out of memory reading from the coordinator");
        return false;
    }
    pt_coord_client_handle_buffered(c);
    if (c->in.length > MAX_COORDINATOR_MESSAGE) {
        snprintf(why, cap, "the coordinator at %s sent an oversized message", c->where);
        return false;
    }
    return true;
}

/* Heartbeats out, messages in, and watch for a dead coordinator. */
static double last_sent_at(pt_coord_client *c)
{
    pthread_mutex_lock(&c->send_lock);
    double at = c->last_sent;
    pthread_mutex_unlock(&c->send_lock);
    return at;
}

static void give_up_after_the_grace(pt_coord_client *c)
{
    char why[512];
    snprintf(why, sizeof why, "the coordinator has been gone for %.0f s (%.300s) and the workers did "
                              "not stop",
             c->lost_grace_s, c->lost_reason);
    client_abort(c, -1, why);
}

/* After the loss: waits (for close) at most lost_grace_s, then aborts the job, so that
 * a worker whose job cannot agree on a stop (a peer hangs) still ends. */
static void wait_out_the_grace(pt_coord_client *c)
{
    struct pollfd stop = {.fd = c->stop_pipe[0], .events = POLLIN};
    const double deadline = pt_now_s() + c->lost_grace_s;
    for (double left; (left = deadline - pt_now_s()) > 0;) {
        int ready = poll(&stop, 1, (int)fmin(left * 1e3 + 1, 60e3));
        if (ready > 0 || (ready < 0 && errno != EINTR)) return; /* closing */
    }
    give_up_after_the_grace(c);
}

/* ---- registering again ------------------------------------------------------ */

/* (connecting, below) */

/* What this worker knows of the job, for a coordinator started again (coordinator_protocol.h,
 * "resume"). */
static json_t *view_of_the_job(pt_coord_client *c)
{
    pthread_mutex_lock(&c->lock);
    const pt_membership_news *n = &c->membership;
    json_t *left = json_array(), *in = json_array(), *joiners = json_array();
    for (int q = 0; q < c->world; q++) {
        if (c->left[q]) json_array_append_new(left, json_integer(q));
        if (c->switch_joiners[q]) json_array_append_new(joiners, json_integer(q));
        if (c->in_epoch[q]) json_array_append_new(in, json_pack("[i, I]", q, (json_int_t)c->in_epoch[q]));
    }
    json_t *view = json_pack("{s:I, s:I, s:I, s:o, s:o, s:{s:I, s:I, s:I, s:i, s:o}}", "epoch",
                             (json_int_t)n->epoch, "departures", (json_int_t)n->departures, "joins",
                             (json_int_t)n->joins, "left", left, "in", in, "switch", "epoch",
                             (json_int_t)n->switch_epoch, "step", (json_int_t)n->switch_step,
                             "sequence", (json_int_t)n->switch_sequence, "donor", n->switch_donor,
                             "joiners", joiners);
    if (view && c->acked)
        json_object_set_new(view, "ack", json_pack("{s:I, s:I, s:I}", "epoch",
                                                   (json_int_t)c->ack_epoch, "step",
                                                   (json_int_t)c->ack_step, "sequence",
                                                   (json_int_t)c->ack_sequence));
    if (view && c->progress_step >= 0)
        json_object_set_new(view, "progress", json_pack("{s:I, s:I}", "step",
                                                        (json_int_t)c->progress_step, "total",
                                                        (json_int_t)c->progress_total));
    pthread_mutex_unlock(&c->lock);
    return view;
}

/* A joiner whose replica is not in yet (it has no place a coordinator started again could
 * give back). */
static bool still_joining(pt_coord_client *c)
{
    if (!c->join) return false;
    pthread_mutex_lock(&c->lock);
    const bool in = c->replica >= 0 && c->in_epoch[c->replica] > 0;
    pthread_mutex_unlock(&c->lock);
    return !in;
}

/* This rank's replica left the job (it heard so): the rank is no longer its to hold. */
static bool own_replica_left(pt_coord_client *c)
{
    pthread_mutex_lock(&c->lock);
    const bool left = c->replica >= 0 && c->left[c->replica];
    pthread_mutex_unlock(&c->lock);
    return left;
}

/* Whether this client may register again: a joiner only once its replica is in, and never a
 * rank whose replica left (a new process may hold the rank by now: coordinator_recover.c). */
static bool may_register_again(pt_coord_client *c)
{
    return c->reconnect_s > 0 && !atomic_load(&c->aborted) && !still_joining(c) &&
           !own_replica_left(c);
}

/* The connection broke and no coordinator took this worker again: it has lost its
 * coordinator (false: the thread stops talking), or, a joiner under a launcher that starts
 * coordinators again, it gives up (the job aborts for it; its replica, not back, leaves
 * again, and the launcher may start it once more). */
static bool coordinator_gone(pt_coord_client *c, const char *why)
{
    if (c->reconnect_s > 0 && still_joining(c)) {
        char reason[500];
        snprintf(reason, sizeof reason, "the coordinator went away while this rank was rejoining "
                 "(%.400s)", why);
        client_abort(c, -1, reason);
        return true;
    }
    client_lost(c, why);
    return false;
}

/* One try: connect, register again with the view. False when it did not work (yet); *refused
 * when the coordinator answered no (then trying again is pointless). */
static bool try_register_again(pt_coord_client *c, bool *refused)
{
    int error = 0;
    bool resolved = true;
    int fd = pt_coord_client_try_connect(c->host, c->port, 1.0, &error, &resolved);
    /* The launcher keeps the coordinator's socket listening while it starts a new one, so a
     * connection is always taken then; one refused means the launcher is gone too. Anything
     * else (a link down between sites) may pass: try again. */
    *refused = fd < 0 && error == ECONNREFUSED;
    if (fd < 0) return false;
    pthread_mutex_lock(&c->send_lock);
    c->fd = fd;
    c->seal = (pt_coord_seal){0};
    pthread_mutex_unlock(&c->send_lock);
    c->in.length = 0;
    pt_coord_client_prepare_socket(c);
    /* a coordinator started again answers within a second; one that does not is tried again
     * (while it rebuilds the job, which waits twice the heartbeat timeout for this worker) */
    pipert_result rc = pt_coord_client_register(c, view_of_the_job(c), fmin(c->dead_after_s, 5.0));
    if (rc == PIPERT_OK) return true;
    *refused = rc == PIPERT_ERR_AUTH || rc == PIPERT_ERR_CONFIG ||
               strstr(pipert_last_error(), "refused") != NULL;
    pthread_mutex_lock(&c->send_lock);
    close(c->fd);
    c->fd = -1;
    pthread_mutex_unlock(&c->send_lock);
    return false;
}

/* The coordinator's connection broke: with reconnect_s, registers again with a coordinator
 * started again (coordinator_recover.c) at the same address, trying for reconnect_s; false
 * when it may not, the client is closing, or no coordinator took it. */
static bool register_again(pt_coord_client *c)
{
    if (!may_register_again(c)) return false;
    pthread_mutex_lock(&c->send_lock);
    atomic_store(&c->reconnecting, true);
    close(c->fd);
    c->fd = -1;
    pthread_mutex_unlock(&c->send_lock);
    const double deadline = pt_now_s() + c->reconnect_s;
    bool registered = false, refused = false;
    struct pollfd stop = {.fd = c->stop_pipe[0], .events = POLLIN};
    while (!registered && !refused && pt_now_s() < deadline) {
        registered = try_register_again(c, &refused);
        if (!registered && poll(&stop, 1, 200) != 0) break; /* closing */
    }
    if (!registered) return false;
    c->last_heard = pt_now_s();
    pthread_mutex_lock(&c->lock);
    c->reconnections++;
    pthread_mutex_unlock(&c->lock);
    atomic_store(&c->reconnecting, false);
    pt_coord_client_handle_buffered(c);
    return true;
}

/* A heartbeat thread that wakes long after it asked to was not run meanwhile (the process
 * stopped, or the machine too loaded to schedule it): the coordinator may have counted this
 * rank silent, and the log should say why. */
static void say_if_late(pt_coord_client *c, double due)
{
    const double late_s = pt_now_s() - due;
    if (late_s > STALL_WORTH_SAYING_S)
        pt_warn("rank %d: this process did not run for %.1f s (stopped, or not scheduled: the "
                "machine is overloaded); heartbeats to the coordinator were late by as much",
                c->rank, late_s);
}

/* Heartbeats and messages until the client closes, the job aborts, or the coordinator
 * is lost (false). */
static bool client_talk(pt_coord_client *c)
{
    char why[512];
    while (!atomic_load(&c->aborted)) {
        double now = pt_now_s();
        double wait_s = last_sent_at(c) + c->heartbeat_interval_s - now;
        struct pollfd fds[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->stop_pipe[0], .events = POLLIN}};
        int ready = poll(fds, 2, wait_s > 0 ? (int)(wait_s * 1e3) + 1 : 0);
        say_if_late(c, now + fmax(wait_s, 0));
        if (ready < 0 && errno != EINTR) {
            snprintf(why, sizeof why, "poll: %s", strerror(errno));
            client_abort(c, -1, why);
            return true;
        }
        if (ready > 0 && fds[1].revents) return true; /* closing */
        if (ready > 0 && fds[0].revents && !client_read(c, why, sizeof why)) {
            pthread_mutex_lock(&c->lock);
            bool expected = c->done_sent || c->finished;
            pthread_mutex_unlock(&c->lock);
            if (expected) return true;
            if (register_again(c)) continue;
            return coordinator_gone(c, why);
        }
        if (ready > 0 && fds[0].revents) client_heard_again(c);
        now = pt_now_s();
        if (now - last_sent_at(c) >= c->heartbeat_interval_s &&
            client_send(c, json_pack("{s:s}", "type", "heartbeat")) != PIPERT_OK) {
            snprintf(why, sizeof why, "%s", pipert_last_error());
            if (register_again(c)) continue;
            return coordinator_gone(c, why);
        }
        if (now - c->last_heard > c->dead_after_s && !atomic_load(&c->lost)) {
            snprintf(why, sizeof why, "no word from the coordinator at %s for %.1f s", c->where,
                     now - c->last_heard);
            client_lost(c, why);
            if (!c->outlive_coordinator) return false;
        }
        /* Silent is not closed: a link that comes back brings the coordinator's word (a
         * worker cut off from an elastic job hears that its replica left), so the client
         * listens on, for the grace at most. */
        if (atomic_load(&c->lost) && now - c->lost_at > c->lost_grace_s) {
            give_up_after_the_grace(c);
            return true;
        }
    }
    return true;
}

static void *client_thread(void *arg)
{
    pt_coord_client *c = arg;
    if (!client_talk(c) && c->outlive_coordinator) wait_out_the_grace(c);
    return NULL;
}

static pipert_result client_setup(pt_coord_client *c, const pt_coord_client_options *o)
{
    PT_TRY(pt_coord_client_connect_and_register(c, o));
    c->last_heard = pt_now_s();
    /* What came with the welcome: the table, when this rank registered last. */
    pt_coord_client_handle_buffered(c);
    if (pipe2(c->stop_pipe, O_CLOEXEC) != 0)
        return pt_fail(PIPERT_ERR_INTERNAL, "pipe: %s", strerror(errno));
    int rc = pt_log_thread_create(&c->thread, client_thread, c);
    if (rc != 0) return pt_fail(PIPERT_ERR_INTERNAL, "heartbeat thread: %s", strerror(rc));
    c->thread_started = true;
    return PIPERT_OK;
}

pipert_result pt_coord_client_connect(pt_coord_client **out, const pt_coord_client_options *o)
{
    *out = NULL;
    if (!o->host || !o->secret || o->rank < 0 || o->world < 1 || o->rank >= o->world ||
        !(o->heartbeat_interval_s > 0) || !(o->dead_after_s > o->heartbeat_interval_s))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "coordinator client: host, secret, rank in [0, "
                                               "world) and dead_after_s > heartbeat_interval_s "
                                               "are required");
    pt_coord_client *c = calloc(1, sizeof *c);
    if (c) {
        c->left = calloc((size_t)o->world, sizeof *c->left);
        c->left_reason = calloc((size_t)o->world, sizeof *c->left_reason);
        c->join_epoch = calloc((size_t)o->world, sizeof *c->join_epoch);
        c->switch_joiners = calloc((size_t)o->world, sizeof *c->switch_joiners);
        c->in_epoch = calloc((size_t)o->world, sizeof *c->in_epoch);
    }
    if (!c || !c->left || !c->left_reason || !c->join_epoch || !c->switch_joiners ||
        !c->in_epoch) {
        if (c)
            free(c->left), free(c->left_reason), free(c->join_epoch), free(c->switch_joiners),
                free(c->in_epoch);
        free(c);
        return pt_fail(PIPERT_ERR_NOMEM, "coordinator client: out of memory");
    }
    c->world = o->world;
    c->fd = -1;
    c->stop_pipe[0] = c->stop_pipe[1] = -1;
    c->rank = o->rank;
    c->abort_rank = -1;
    c->membership.switch_donor = -1;
    c->heartbeat_interval_s = o->heartbeat_interval_s;
    c->dead_after_s = o->dead_after_s;
    c->outlive_coordinator = o->outlive_coordinator;
    c->lost_grace_s = o->lost_grace_s > 0 ? o->lost_grace_s : PT_COORD_LOST_GRACE_S;
    c->on_abort = o->on_abort;
    c->on_abort_context = o->on_abort_context;
    c->on_join = o->on_join;
    c->on_join_context = o->on_join_context;
    c->replica = o->stages > 0 ? o->rank / o->stages : -1;
    c->progress_step = -1;
    c->port = o->port;
    c->identity = o->identity;
    c->join = o->join;
    c->connect_timeout_s = o->connect_timeout_s;
    c->reconnect_s = o->reconnect_s;
    c->host = strdup(o->host);
    c->address = strdup(o->address ? o->address : "");
    snprintf(c->where, sizeof c->where, strchr(o->host, ':') ? "[%s]:%d" : "%s:%d", o->host,
             o->port);
    pthread_mutex_init(&c->send_lock, NULL);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->callback_lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->changed, &attr);
    pthread_condattr_destroy(&attr);
    pipert_result rc = c->host && c->address ? PIPERT_OK
                                             : pt_fail(PIPERT_ERR_NOMEM, "coordinator client: "
                                                                         "out of memory");
    if (rc == PIPERT_OK) rc = pt_auth_derive_key(o->secret, PT_AUTH_USE_COORDINATOR, &c->key);
    if (rc == PIPERT_OK) rc = client_setup(c, o);
    if (rc != PIPERT_OK) {
        pt_coord_client_close(c);
        return rc;
    }
    *out = c;
    return PIPERT_OK;
}

pipert_result pt_coord_client_check(pt_coord_client *c)
{
    if (!atomic_load(&c->aborted)) return PIPERT_OK;
    pthread_mutex_lock(&c->lock);
    pipert_result rc =
        c->abort_rank >= 0
            ? pt_fail(PIPERT_ERR_PEER, "job aborted: rank %d: %s", c->abort_rank, c->abort_reason)
            : pt_fail(PIPERT_ERR_PEER, "job aborted: %s", c->abort_reason);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

bool pt_coord_client_aborted(pt_coord_client *c) { return atomic_load(&c->aborted); }

long pt_coord_client_reconnections(pt_coord_client *c)
{
    pthread_mutex_lock(&c->lock);
    const long n = c->reconnections;
    pthread_mutex_unlock(&c->lock);
    return n;
}

bool pt_coord_client_coordinator_lost(pt_coord_client *c, char *why, size_t cap)
{
    if (!atomic_load(&c->lost)) return false;
    if (why && cap > 0) {
        pthread_mutex_lock(&c->lock);
        snprintf(why, cap, "%s", c->lost_reason);
        pthread_mutex_unlock(&c->lock);
    }
    return true;
}

pipert_result pt_coord_client_wait_table(pt_coord_client *c, double timeout_s,
                                         const pt_peer_table **table)
{
    struct timespec deadline = pt_coord_deadline_after(timeout_s);
    bool timed_out = false;
    pthread_mutex_lock(&c->lock);
    while (!c->has_table && !atomic_load(&c->aborted) && !atomic_load(&c->lost) && !timed_out)
        timed_out = pthread_cond_timedwait(&c->changed, &c->lock, &deadline) == ETIMEDOUT;
    bool has_table = c->has_table;
    pthread_mutex_unlock(&c->lock);
    if (!has_table) PT_TRY(pt_coord_client_check(c)); /* an abort after the table: the next check */
    char why[512];
    if (!has_table && pt_coord_client_coordinator_lost(c, why, sizeof why))
        return pt_fail(PIPERT_ERR_PEER, "the coordinator was lost before every rank registered: "
                                        "%s",
                       why);
    if (!has_table)
        return pt_fail(PIPERT_ERR_TIMEOUT, "no peer table from the coordinator at %s within %.0f s "
                                           "(are all ranks started?)",
                       c->where, timeout_s);
    *table = &c->table;
    return PIPERT_OK;
}

/* A send that finds the coordinator gone before the client's thread noticed: with
 * outlive_coordinator that is the loss (the worker goes on), not this call's failure. */
static pipert_result send_unless_lost(pt_coord_client *c, json_t *message)
{
    pipert_result rc = client_send(c, message);
    if (rc == PIPERT_OK || rc == PIPERT_ERR_NOMEM) return rc;
    if (c->reconnect_s > 0) { /* the thread notices, and registers again */
        pt_error_clear();
        return PIPERT_OK;
    }
    if (!c->outlive_coordinator) return rc;
    client_lost(c, pipert_last_error());
    return PIPERT_OK;
}

pipert_result pt_coord_client_send_progress(pt_coord_client *c, const pt_rank_progress *p)
{
    PT_TRY(pt_coord_client_check(c));
    if (atomic_load(&c->lost)) return PIPERT_OK;
    pthread_mutex_lock(&c->lock);
    c->progress_step = p->step;
    c->progress_total = p->total_steps;
    pthread_mutex_unlock(&c->lock);
    json_t *m = json_pack("{s:s, s:I, s:I, s:f}", "type", "progress", "step",
                          (json_int_t)p->step, "total", (json_int_t)p->total_steps,
                          "tokens_per_s", p->tokens_per_s);
    /* A rank without a loss (a pipeline stage before the last) sends none. */
    if (m && isfinite(p->loss)) json_object_set_new(m, "loss", json_real(p->loss));
    if (m && isfinite(p->val_loss)) json_object_set_new(m, "val_loss", json_real(p->val_loss));
    if (m && isfinite(p->compute)) {
        json_object_set_new(m, "compute", json_real(p->compute));
        json_object_set_new(m, "wait_pipeline", json_real(p->wait_pipeline));
        json_object_set_new(m, "wait_coupling", json_real(p->wait_coupling));
        json_object_set_new(m, "bytes_wan", json_real(p->bytes_wan));
    }
    return send_unless_lost(c, m);
}

pipert_result pt_coord_client_send_done(pt_coord_client *c)
{
    PT_TRY(pt_coord_client_check(c));
    if (atomic_load(&c->lost)) return PIPERT_OK;
    pthread_mutex_lock(&c->lock);
    c->done_sent = true;
    pthread_mutex_unlock(&c->lock);
    return send_unless_lost(c, json_pack("{s:s}", "type", "done"));
}

pipert_result pt_coord_client_send_ready(pt_coord_client *c)
{
    PT_TRY(pt_coord_client_check(c));
    return send_unless_lost(c, json_pack("{s:s}", "type", "ready"));
}

pipert_result pt_coord_client_send_joined(pt_coord_client *c, long epoch)
{
    PT_TRY(pt_coord_client_check(c));
    return send_unless_lost(c, json_pack("{s:s, s:I}", "type", "joined", "epoch",
                                         (json_int_t)epoch));
}

void pt_coord_client_membership(pt_coord_client *c, pt_membership_news *news)
{
    pthread_mutex_lock(&c->lock);
    *news = c->membership;
    pthread_mutex_unlock(&c->lock);
}

long pt_coord_client_dropped_lines(pt_coord_client *c, char *why, size_t cap)
{
    pthread_mutex_lock(&c->lock);
    const long dropped = c->dropped;
    if (why) snprintf(why, cap, "%s", c->dropped_why);
    pthread_mutex_unlock(&c->lock);
    return dropped;
}

long pt_coord_client_join_epoch(pt_coord_client *c, int replica)
{
    if (replica < 0 || replica >= c->world) return 0;
    pthread_mutex_lock(&c->lock);
    const long epoch = c->join_epoch[replica];
    pthread_mutex_unlock(&c->lock);
    return epoch;
}

long pt_coord_client_switch_joiners(pt_coord_client *c, bool *joiners)
{
    pthread_mutex_lock(&c->lock);
    memcpy(joiners, c->switch_joiners, (size_t)c->world * sizeof *joiners);
    const long epoch = c->membership.switch_epoch;
    pthread_mutex_unlock(&c->lock);
    return epoch;
}

long pt_coord_client_in_epoch(pt_coord_client *c, int replica)
{
    if (replica < 0 || replica >= c->world) return 0;
    pthread_mutex_lock(&c->lock);
    const long epoch = c->in_epoch[replica];
    pthread_mutex_unlock(&c->lock);
    return epoch;
}

char *pt_coord_client_peer_address(pt_coord_client *c, int rank)
{
    pthread_mutex_lock(&c->lock);
    char *copy = c->has_table && rank >= 0 && rank < c->table.world
                     ? strdup(c->table.peers[rank].address)
                     : NULL;
    pthread_mutex_unlock(&c->lock);
    return copy;
}

bool pt_coord_client_replica_left(pt_coord_client *c, int replica, char *reason, size_t cap)
{
    if (replica < 0 || replica >= c->world) return false;
    pthread_mutex_lock(&c->lock);
    const bool left = c->left[replica];
    if (left && reason) snprintf(reason, cap, "%s", c->left_reason[replica]);
    pthread_mutex_unlock(&c->lock);
    return left;
}

pipert_result pt_coord_client_send_ack(pt_coord_client *c, long epoch, long step, uint32_t sequence)
{
    PT_TRY(pt_coord_client_check(c));
    pthread_mutex_lock(&c->lock);
    c->acked = true;
    c->ack_epoch = epoch;
    c->ack_step = step;
    c->ack_sequence = sequence;
    pthread_mutex_unlock(&c->lock);
    if (c->reconnect_s > 0) /* lost with the connection, it goes with the registration again */
        return send_unless_lost(c, json_pack("{s:s, s:I, s:I, s:I}", "type", "ack", "epoch",
                                             (json_int_t)epoch, "step", (json_int_t)step,
                                             "sequence", (json_int_t)sequence));
    return client_send(c, json_pack("{s:s, s:I, s:I, s:I}", "type", "ack", "epoch",
                                    (json_int_t)epoch, "step", (json_int_t)step, "sequence",
                                    (json_int_t)sequence));
}

pipert_result pt_coord_client_send_error(pt_coord_client *c, const char *reason)
{
    if (atomic_load(&c->lost)) return PIPERT_OK;
    return send_unless_lost(c, json_pack("{s:s, s:s}", "type", "error", "reason", reason));
}

void pt_coord_client_close(pt_coord_client *c)
{
    if (!c) return;
    if (c->thread_started) {
        ssize_t ignored = write(c->stop_pipe[1], "x", 1);
        (void)ignored;
        pthread_join(c->thread, NULL);
    }
    if (c->stop_pipe[0] >= 0) close(c->stop_pipe[0]);
    if (c->stop_pipe[1] >= 0) close(c->stop_pipe[1]);
    if (c->fd >= 0) close(c->fd);
    free_table(&c->table);
    free(c->left);
    free(c->left_reason);
    free(c->join_epoch);
    free(c->switch_joiners);
    free(c->in_epoch);
    free(c->host);
    free(c->address);
    pt_coord_buffer_free(&c->in);
    pthread_mutex_destroy(&c->send_lock);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->callback_lock);
    pthread_cond_destroy(&c->changed);
    free(c);
}
