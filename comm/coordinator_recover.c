/* A coordinator started again while its job runs (pt_coordinator_options.recover).
 *
 * The coordinator is on the control path only: when it dies the workers train on, and under
 * `pipert launch` the launcher starts a new one on the same listening socket. Every worker
 * whose connection closed registers again (coord_client.h, reconnect_s) with what it knows
 * of the job, its "resume" view (coordinator_protocol.h): the membership as it heard it, and
 * its acknowledgement of the newest change. No table goes out: the workers have theirs.
 *
 * Once every rank is accounted for (registered again; said by the launcher to have finished
 * or failed; or of a replica that left in a worker's view), or recover_timeout_s has passed,
 * the job is rebuilt:
 *  - the membership is the newest view's (the largest epoch, then the newest switch), so a
 *    change that some workers heard of and others did not is kept;
 *  - a worker that missed part of it hears it now: "leave" for each replica it counts in,
 *    the newest switch, and "in" for the replicas that came back;
 *  - the acknowledgements of the newest change the workers report count, as if just sent
 *    (the switch may follow at once);
 *  - a rank that is not back has failed (its replica leaves, or the job aborts), as has a
 *    rank the launcher saw fail; one the launcher saw finish is done.
 * A replica that was coming back (its ranks joining) is not resumed: its new processes give up
 * without their coordinator, and their replica, not back, leaves again; the launcher may start
 * it once more.
 */
#include "comm/coordinator_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"
#include "runtime/log.h"

pipert_result pt_coord_recovery_init(pt_coordinator *c)
{
    coord_recovery *r = &c->recovery;
    const size_t world = (size_t)c->options.world;
    r->views = calloc(world, sizeof *r->views);
    r->finished = calloc(world, sizeof *r->finished);
    r->failed = calloc(world, sizeof *r->failed);
    if (!r->views || !r->finished || !r->failed)
        return pt_fail(PIPERT_ERR_NOMEM, "coordinator: out of memory");
    const double timeout = c->options.recover_timeout_s > 0 ? c->options.recover_timeout_s
                                                             : 2 * c->options.dead_after_s;
    r->started_at = pt_now_s();
    r->deadline = r->started_at + timeout;
    r->on = true;
    pt_info("coordinator: started again to take the running job over; waiting up to %.0f s for "
            "the workers to register again", timeout);
    return PIPERT_OK;
}

void pt_coord_recovery_free(pt_coordinator *c)
{
    coord_recovery *r = &c->recovery;
    for (int i = 0; r->views && i < c->options.world; i++) json_decref(r->views[i]);
    free(r->views);
    free(r->finished);
    free(r->failed);
    *r = (coord_recovery){0};
}

/* ---- a worker's view ------------------------------------------------------- */

static long view_long(json_t *view, const char *key)
{
    long value = 0;
    return pt_coord_get_long(view, key, &value) ? value : 0;
}

/* Whether `list` (an array of replica numbers) holds `replica`. */
static bool lists(json_t *list, int replica)
{
    size_t i;
    json_t *entry;
    json_array_foreach(list, i, entry) if (json_integer_value(entry) == replica) return true;
    return false;
}

/* The epoch of the "in" the view heard for `replica` (0: none). */
static long view_in(json_t *view, int replica)
{
    size_t i;
    json_t *pair;
    json_array_foreach(json_object_get(view, "in"), i, pair) if (json_integer_value(
        json_array_get(pair, 0)) == replica) return json_integer_value(json_array_get(pair, 1));
    return 0;
}

static bool is_replica(json_t *entry, int replicas)
{
    return json_is_integer(entry) && json_integer_value(entry) >= 0 &&
           json_integer_value(entry) < replicas;
}

/* NULL (none) or an array of replica numbers. */
static bool replica_list_ok(json_t *list, int replicas)
{
    size_t i;
    json_t *entry;
    if (list && !json_is_array(list)) return false;
    json_array_foreach(list, i, entry) if (!is_replica(entry, replicas)) return false;
    return true;
}

/* Whether a "resume" view is well formed for this job. */
static bool view_ok(const pt_coordinator *c, json_t *view)
{
    const int replicas = c->membership.replicas;
    json_t *in = json_object_get(view, "in"), *sw = json_object_get(view, "switch");
    if (!json_is_object(view) || view_long(view, "epoch") < 0 ||
        !replica_list_ok(json_object_get(view, "left"), replicas) || (in && !json_is_array(in)) ||
        (sw && (!json_is_object(sw) || !replica_list_ok(json_object_get(sw, "joiners"), replicas))))
        return false;
    size_t i;
    json_t *pair;
    json_array_foreach(in, i, pair) if (!json_is_array(pair) || json_array_size(pair) != 2 ||
                                        !is_replica(json_array_get(pair, 0), replicas) ||
                                        !json_is_integer(json_array_get(pair, 1))) return false;
    return true;
}

/* ---- registering again --------------------------------------------------- */

/* Tells a rank's process on `conn` that its replica left the job. */
static void tell_it_left(pt_coordinator *c, connection *conn, int rank)
{
    pt_coord_send(conn, json_pack("{s:s, s:I, s:i, s:i, s:s}", "type", "leave", "epoch",
                                  (json_int_t)c->membership.epoch, "replica",
                                  pt_membership_replica_of(&c->membership, rank), "rank", rank,
                                  "reason", "left the job while it was out of reach"));
}

/* A rank of a running job whose connection broke while this coordinator lived (a reset, not
 * a restart), or that comes back after the job was rebuilt without it (cut off for longer):
 * the new connection replaces the old one; if its replica left meanwhile, it hears so (and
 * leaves, as a worker whose coordinator said so while it was cut off). If a new process
 * registered to rejoin in its place meanwhile (its connection is what dropped the old one's:
 * pt_coord_admit_joiner), the old process only hears that its replica left; the rank stays
 * the new one's. */
static void reconnected(pt_coordinator *c, connection *conn, int rank, int pid)
{
    rank_state *s = &c->ranks[rank];
    const bool left = pt_coord_rank_left(c, rank);
    if (left && s->joining) { /* a joiner registers again only once its replica is in */
        pt_info("coordinator: rank %d's old process (pid %d) connected again from %s; its "
                "replica left the job, and pid %d rejoins in its place",
                rank, pid, conn->peer, s->pid);
        pt_coord_welcome(c, conn);
        tell_it_left(c, conn, rank);
        conn->close_when_sent = true; /* it stands for no rank, and hearing this it does
                                         not register again (coordinator_client.c) */
        return;
    }
    if (!left && (!s->registered || s->pid != pid || s->done)) {
        char why[256];
        snprintf(why, sizeof why, "rank %d registered again, but this coordinator does not know "
                 "its process", rank);
        pt_warn("coordinator: refused %s: %s", conn->peer, why);
        pt_coord_refuse(conn, why, false);
        return;
    }
    if (s->conn) { /* dropped at the sweep, without failing the rank or a warning */
        s->conn->rank = -1;
        s->conn->close_when_sent = s->conn->broken = true;
    }
    s->conn = conn;
    conn->rank = rank;
    pt_info("coordinator: rank %d connected again from %s%s", rank, conn->peer,
            left ? "; its replica left the job meanwhile" : "");
    pt_coord_welcome(c, conn);
    if (left) tell_it_left(c, conn, rank);
}

void pt_coord_register_again(pt_coordinator *c, connection *conn, int rank, int pid,
                             const char *host, const char *address, json_t *view)
{
    coord_recovery *r = &c->recovery;
    char *copy = strdup(address);
    rank_state *s = &c->ranks[rank];
    if (!view_ok(c, view) || !copy) {
        pt_warn("coordinator: refused %s: rank %d registered again with %s", conn->peer, rank,
                copy ? "a malformed view of the job" : "no memory left here");
        pt_coord_refuse(conn, copy ? "malformed resume view" : "coordinator out of memory", false);
    } else if (!r->on) {
        reconnected(c, conn, rank, pid);
    } else if (s->registered && s->pid != pid) {
        pt_coord_refuse(conn, "another process registered again for this rank", false);
    } else {
        if (s->registered) { /* its first try timed out before our answer: this one counts */
            free(s->address);
            c->registered--;
            if (s->conn) {
                s->conn->rank = -1; /* dropped at the sweep, without failing the rank */
                s->conn->broken = true;
            }
        }
        *s = (rank_state){.registered = true, .pid = pid, .address = copy, .conn = conn};
        json_t *progress = json_object_get(view, "progress");
        if (progress) { /* its step until it reports the next */
            s->progress = (pt_rank_progress){view_long(progress, "step"),
                                             view_long(progress, "total"), NAN, 0, NAN, NAN,
                                             NAN, NAN, 0};
            s->has_progress = true;
        }
        snprintf(s->host, sizeof s->host, "%s", host);
        copy = NULL;
        conn->rank = rank;
        c->registered++;
        json_decref(r->views[rank]);
        r->views[rank] = json_incref(view);
        pt_debug("coordinator: rank %d registered again from %s (membership epoch %ld)", rank,
                 conn->peer, view_long(view, "epoch"));
        pt_coord_welcome(c, conn);
    }
    free(copy);
    json_decref(view);
}

bool pt_coord_recovery_note_exit(pt_coordinator *c, int rank, bool done, const char *reason)
{
    coord_recovery *r = &c->recovery;
    if (!r->on) return false;
    if (done) r->finished[rank] = true;
    else if (!r->failed[rank][0]) /* the first word stands */
        snprintf(r->failed[rank], sizeof r->failed[rank], "%s", *reason ? reason : "failed");
    return true;
}

/* ---- rebuilding ------------------------------------------------------------ */

/* The rank whose view is newest: the largest epoch, then the newest switch; -1: none. */
static int newest_view(const pt_coordinator *c)
{
    int best = -1;
    for (int r = 0; r < c->options.world; r++) {
        json_t *v = c->recovery.views[r];
        if (!v) continue;
        json_t *b = best >= 0 ? c->recovery.views[best] : NULL;
        const long epoch = view_long(v, "epoch"),
                   sw = view_long(json_object_get(v, "switch"), "epoch");
        if (!b || epoch > view_long(b, "epoch") ||
            (epoch == view_long(b, "epoch") && sw > view_long(json_object_get(b, "switch"), "epoch")))
            best = r;
    }
    return best;
}

/* The membership as `view` says it (membership.h's fields; nothing is joining). */
static void restore_membership(pt_membership *m, json_t *view)
{
    json_t *sw = json_object_get(view, "switch");
    m->epoch = view_long(view, "epoch");
    m->departures = view_long(view, "departures");
    m->joins = view_long(view, "joins");
    m->live = m->replicas;
    for (int q = 0; q < m->replicas; q++) {
        m->left[q] = lists(json_object_get(view, "left"), q);
        m->live -= m->left[q];
        m->switch_joiners[q] = lists(json_object_get(sw, "joiners"), q);
    }
    m->switch_epoch = view_long(sw, "epoch");
    m->switch_step = view_long(sw, "step");
    m->switch_sequence = (uint32_t)view_long(sw, "sequence");
    m->switch_donor = sw && json_object_get(sw, "donor") ? (int)view_long(sw, "donor") : -1;
    /* no acknowledgement counted yet (the workers' come next), nothing joining */
    m->acks = 0;
    m->max_step = 0;
    m->max_sequence = 0;
    for (int r = 0; r < m->world; r++) m->acked_epoch[r] = m->took_state[r] = 0;
    for (int q = 0; q < m->replicas; q++) {
        m->joining[q] = false;
        m->let_in_at[q] = 0;
    }
}

/* What rank r's view misses of the membership, sent to it now. */
static void tell_what_it_missed(pt_coordinator *c, int r, json_t *newest)
{
    const pt_membership *m = &c->membership;
    json_t *view = c->recovery.views[r];
    for (int q = 0; q < m->replicas; q++) {
        if (m->left[q] && !lists(json_object_get(view, "left"), q))
            pt_coord_send(c->ranks[r].conn,
                          json_pack("{s:s, s:I, s:i, s:i, s:s}", "type", "leave", "epoch",
                                    (json_int_t)m->epoch, "replica", q, "rank", -1, "reason",
                                    "left the job while its coordinator was away"));
        const long in = view_in(newest, q);
        if (in > view_in(view, q))
            pt_coord_send(c->ranks[r].conn, json_pack("{s:s, s:i, s:I}", "type", "in", "replica",
                                                      q, "epoch", (json_int_t)in));
    }
    if (m->switch_epoch > view_long(json_object_get(view, "switch"), "epoch")) {
        json_t *sw = json_deep_copy(json_object_get(newest, "switch"));
        json_object_set_new(sw, "type", json_string("switch"));
        pt_coord_send(c->ranks[r].conn, sw);
    }
}

/* Whether every rank is back, finished, failed, or of a replica that left. */
static bool all_accounted_for(const pt_coordinator *c, json_t *newest)
{
    const coord_recovery *r = &c->recovery;
    for (int rank = 0; rank < c->options.world; rank++)
        if (!r->views[rank] && !r->finished[rank] && !r->failed[rank][0] &&
            !(newest && lists(json_object_get(newest, "left"),
                              pt_membership_replica_of(&c->membership, rank))))
            return false;
    return true;
}

/* The workers' acknowledgements of the newest change, as if just sent. */
static void count_acknowledgements(pt_coordinator *c)
{
    for (int r = 0; r < c->options.world; r++) {
        json_t *ack = json_object_get(c->recovery.views[r], "ack");
        if (ack && view_long(ack, "epoch") == c->membership.epoch)
            pt_coord_acknowledged(c, r, view_long(ack, "epoch"), view_long(ack, "step"),
                                  (uint32_t)view_long(ack, "sequence"));
    }
}

/* The ranks not back, and those the launcher saw end. */
static void settle_the_missing(pt_coordinator *c, double waited)
{
    coord_recovery *r = &c->recovery;
    for (int rank = 0; rank < c->options.world && c->phase == PT_JOB_RUNNING; rank++) {
        if (pt_coord_rank_left(c, rank) || (r->views[rank] && !r->failed[rank][0] &&
                                            !r->finished[rank]))
            continue;
        if (r->finished[rank]) {
            pt_coord_rank_done(c, rank);
        } else {
            char why[600];
            if (r->failed[rank][0]) snprintf(why, sizeof why, "%s", r->failed[rank]);
            else snprintf(why, sizeof why, "did not register again with the coordinator started "
                                           "again (%.0f s)", waited);
            pt_coord_rank_failed(c, rank, why);
        }
    }
}

static void rebuild(pt_coordinator *c, int newest_rank, double waited)
{
    json_t *newest = newest_rank >= 0 ? c->recovery.views[newest_rank] : NULL;
    if (newest) restore_membership(&c->membership, newest);
    for (int r = 0; newest && r < c->options.world; r++)
        if (c->recovery.views[r]) tell_what_it_missed(c, r, newest);
    c->recovery.on = false;
    pt_info("coordinator: took the running job over: %d of %d ranks registered again after "
            "%.1f s (membership epoch %ld, %d replica%s in)", c->registered, c->options.world,
            waited, c->membership.epoch, c->membership.live, c->membership.live == 1 ? "" : "s");
    if (c->membership.switch_epoch < c->membership.epoch) count_acknowledgements(c);
    settle_the_missing(c, waited);
    pt_coord_done_ranks_acknowledge(c);
    pt_coord_finish_if_done(c);
}

void pt_coord_recovery_check(pt_coordinator *c, double now)
{
    coord_recovery *r = &c->recovery;
    if (!r->on) return;
    const int newest = newest_view(c);
    if (!all_accounted_for(c, newest >= 0 ? r->views[newest] : NULL) && now < r->deadline) return;
    rebuild(c, newest, now - r->started_at);
    /* the views are not needed any more */
    for (int i = 0; i < c->options.world; i++) {
        json_decref(r->views[i]);
        r->views[i] = NULL;
    }
}
