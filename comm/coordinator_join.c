/* Replicas coming back (membership.h, "Joining"): a restarted process registers with
 * `join: true` for a rank of a replica that left. Once every rank of the replica did, they
 * get the replicas that are out and the table (to connect their pipeline and build their
 * stages); once every one of them said "ready", the replica is back (a new membership epoch)
 * and everyone hears it. So the survivors, who switch a few steps after they hear it, do not
 * wait at the switch while a joiner is still starting up (a large model takes seconds). */
#include "comm/coordinator_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"

/* Why a rank may not rejoin now, or NULL; *for_now: it may a moment later (a replacement
 * started as soon as the old process was killed may come before the coordinator noticed
 * that its replica left; one started again takes the job over in seconds). */
static const char *join_refusal(const pt_coordinator *c, int rank, bool *for_now)
{
    const pt_membership *m = &c->membership;
    *for_now = false;
    if (c->phase != PT_JOB_RUNNING) return "the job is not running";
    if (!pt_membership_elastic(m)) return "the job's replicas are not elastic (--min-replicas)";
    *for_now = true;
    if (c->recovery.on) return "the coordinator was started again and is taking the job over";
    if (!pt_coord_rank_left(c, rank)) return "its replica is in the job";
    *for_now = false;
    if (c->ranks[rank].joining) return "it is rejoining already";
    for (int r = 0; r < c->options.world; r++)
        if (c->ranks[r].done && !pt_coord_rank_left(c, r)) return "the job is finishing";
    return NULL;
}

/* What a joiner hears before its replica is back: the replicas that are out. */
static void tell_departures(pt_coordinator *c, connection *conn, int replica)
{
    const pt_membership *m = &c->membership;
    for (int r = 0; r < m->replicas; r++)
        if (m->left[r] && r != replica)
            pt_coord_send(conn, json_pack("{s:s, s:I, s:i, s:i, s:s}", "type", "leave", "epoch",
                                         (json_int_t)m->epoch, "replica", r, "rank", -1, "reason",
                                         "left the job before this rank rejoined"));
}

/* Whether every rank of `replica` is joining (and, if `ready`, said ready). */
static bool all_joining(const pt_coordinator *c, int replica, bool ready)
{
    const int S = c->membership.stages;
    for (int r = replica * S; r < (replica + 1) * S; r++)
        if (!c->ranks[r].joining || (ready && !c->ranks[r].ready)) return false;
    return true;
}

/* Every rank of `replica` said ready: it is back (a new epoch), and everyone hears it with
 * the joiners' addresses. */
static void replica_back(pt_coordinator *c, int replica)
{
    pt_membership *m = &c->membership;
    const int S = m->stages, first = replica * S;
    if (!pt_membership_replica_joins(m, replica)) {
        pt_warn("coordinator: replica %d cannot rejoin: no replica that stayed in the job can give "
                "it its state", replica);
        for (int r = first; r < first + S; r++) {
            c->ranks[r].joining = c->ranks[r].ready = false;
            if (c->ranks[r].conn)
                pt_coord_refuse(c->ranks[r].conn, "no replica in the job can give this one its state", false);
        }
        return;
    }
    json_t *peers = json_array();
    for (int r = first; r < first + S; r++) {
        rank_state *s = &c->ranks[r];
        s->joining = s->ready = false;
        json_array_append_new(peers, json_pack("{s:i, s:s}", "rank", r, "address", s->address));
    }
    pt_warn("replica %d rejoins the job: %d replica%s (membership epoch %ld)", replica, m->live,
            m->live == 1 ? "" : "s", m->epoch);
    pt_coord_broadcast(c, json_pack("{s:s, s:I, s:i, s:o}", "type", "join", "epoch", (json_int_t)m->epoch,
                           "replica", replica, "peers", peers));
    pthread_cond_broadcast(&c->changed);
    pt_coord_done_ranks_acknowledge(c);
}

/* register {..., join: true}: a restarted process takes a rank of a replica that left. The
 * old process's connection, if the coordinator still has it, no longer stands for the rank. */
void pt_coord_admit_joiner(pt_coordinator *c, connection *conn, int rank, int pid, const char *host,
                         const char *address)
{
    bool for_now;
    const char *refusal = join_refusal(c, rank, &for_now);
    char *copy = refusal ? NULL : strdup(address);
    if (refusal || !copy) {
        char why[256];
        snprintf(why, sizeof why, "rank %d cannot rejoin: %s", rank,
                 refusal ? refusal : "coordinator out of memory");
        if (refusal && for_now) {
            pt_info("coordinator: %s (for now; from %s)", why, conn->peer);
            pt_coord_refuse_for_now(conn, why);
        } else {
            pt_warn("coordinator: %s (from %s)", why, conn->peer);
            pt_coord_refuse(conn, why, false);
        }
        return;
    }
    rank_state *s = &c->ranks[rank];
    if (s->conn) { /* the old process's: dropped quietly */
        s->conn->rank = -1;
        s->conn->close_when_sent = s->conn->broken = true;
    }
    free(s->address);
    *s = (rank_state){.registered = true, .joining = true, .pid = pid, .address = copy, .conn = conn};
    snprintf(s->host, sizeof s->host, "%s", host);
    conn->rank = rank;
    pt_info("coordinator: rank %d registered to rejoin from %s (host %s, pid %d)", rank,
            conn->peer, host, pid);
    pt_coord_welcome(c, conn);
    const int replica = pt_membership_replica_of(&c->membership, rank), S = c->membership.stages;
    if (!all_joining(c, replica, false)) return;
    for (int r = replica * S; r < (replica + 1) * S; r++) { /* all in: what they need to start */
        tell_departures(c, c->ranks[r].conn, replica);
        pt_coord_send(c->ranks[r].conn, pt_coord_table_message(c));
    }
}

void pt_coord_joiner_ready(pt_coordinator *c, int rank)
{
    rank_state *s = &c->ranks[rank];
    if (!s->joining) {
        pt_warn("coordinator: rank %d said it is ready to rejoin, but it is not rejoining (ignored)",
                rank);
        return;
    }
    s->ready = true;
    const int replica = pt_membership_replica_of(&c->membership, rank);
    if (all_joining(c, replica, true)) replica_back(c, replica);
}

void pt_coord_joiner_failed(pt_coordinator *c, int rank, const char *reason)
{
    rank_state *s = &c->ranks[rank];
    s->joining = s->ready = false;
    pt_warn("coordinator: rank %d ended while rejoining, before its replica was back: %s; the "
            "replica stays out (a restart may bring it back)",
            rank, reason);
}
