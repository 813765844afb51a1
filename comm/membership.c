#include "comm/membership.h"

#include <stdlib.h>
#include <string.h>

long pt_membership_margin(int stages) { return 2L * stages + 2; }

pipert_result pt_membership_init(pt_membership *m, int world, int stages, int min_replicas,
                                 long margin)
{
    memset(m, 0, sizeof *m);
    if (stages < 1 || world < stages || world % stages != 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "membership: %d ranks do not make pipelines of %d "
                                               "stages", world, stages);
    const int replicas = world / stages;
    if (min_replicas < 1 || min_replicas > replicas)
        return pt_fail(PIPERT_ERR_CONFIG, "min_replicas is %d: it must be between 1 and the %d "
                                          "replicas", min_replicas, replicas);
    if (margin < 1) return pt_fail(PIPERT_ERR_INVALID_ARG, "membership: margin %ld < 1", margin);
    m->left = calloc((size_t)replicas, sizeof *m->left);
    m->joining = calloc((size_t)replicas, sizeof *m->joining);
    m->switch_joiners = calloc((size_t)replicas, sizeof *m->switch_joiners);
    m->acked_epoch = calloc((size_t)world, sizeof *m->acked_epoch);
    m->let_in_at = calloc((size_t)replicas, sizeof *m->let_in_at);
    m->took_state = calloc((size_t)world, sizeof *m->took_state);
    if (!m->left || !m->joining || !m->switch_joiners || !m->acked_epoch || !m->let_in_at ||
        !m->took_state) {
        pt_membership_free(m);
        return pt_fail(PIPERT_ERR_NOMEM, "membership: out of memory");
    }
    m->world = world;
    m->stages = stages;
    m->replicas = m->live = replicas;
    m->min_replicas = min_replicas;
    m->margin = margin;
    m->last_left = -1;
    m->switch_donor = -1;
    return PIPERT_OK;
}

void pt_membership_free(pt_membership *m)
{
    free(m->left);
    free(m->joining);
    free(m->switch_joiners);
    free(m->acked_epoch);
    free(m->let_in_at);
    free(m->took_state);
    m->let_in_at = NULL;
    m->took_state = NULL;
    m->left = NULL;
    m->joining = NULL;
    m->switch_joiners = NULL;
    m->acked_epoch = NULL;
}

bool pt_membership_elastic(const pt_membership *m) { return m->min_replicas < m->replicas; }

int pt_membership_replica_of(const pt_membership *m, int rank) { return rank / m->stages; }

bool pt_membership_rank_live(const pt_membership *m, int rank)
{
    return rank >= 0 && rank < m->world && !m->left[pt_membership_replica_of(m, rank)];
}

int pt_membership_live_ranks(const pt_membership *m) { return m->live * m->stages; }

/* A new epoch: nobody has acknowledged it yet. */
static void start_epoch(pt_membership *m)
{
    m->epoch++;
    m->acks = 0;
    m->max_step = 0;
    m->max_sequence = 0;
}

/* A replica's processes are new (it left, or it comes back): nothing of a join holds. */
static void forget_join(pt_membership *m, int replica)
{
    m->joining[replica] = false;
    m->let_in_at[replica] = 0;
    for (int r = replica * m->stages; r < (replica + 1) * m->stages; r++) m->took_state[r] = 0;
}

pt_departure pt_membership_rank_failed(pt_membership *m, int rank)
{
    const int replica = pt_membership_replica_of(m, rank);
    if (m->left[replica]) return PT_DEPARTURE_IGNORED;
    if (m->live - 1 < m->min_replicas) return PT_DEPARTURE_ABORT;
    m->left[replica] = true;
    forget_join(m, replica);
    m->live--;
    m->last_left = replica;
    m->departures++;
    start_epoch(m);
    return PT_DEPARTURE_LEFT;
}

bool pt_membership_replica_joining(const pt_membership *m, int replica)
{
    return replica >= 0 && replica < m->replicas && m->joining[replica];
}

/* The first replica in the job that is not joining: it gives joiners their state. */
static int donor(const pt_membership *m)
{
    for (int r = 0; r < m->replicas; r++)
        if (!m->left[r] && !m->joining[r]) return r;
    return -1;
}

bool pt_membership_replica_joins(pt_membership *m, int replica)
{
    if (replica < 0 || replica >= m->replicas || !m->left[replica] || donor(m) < 0) return false;
    m->left[replica] = false;
    forget_join(m, replica);
    m->joining[replica] = true;
    m->live++;
    m->joins++;
    start_epoch(m);
    return true;
}

/* The live ranks that acknowledge: those of replicas that are in and not joining. */
static int acknowledging_ranks(const pt_membership *m)
{
    int n = 0;
    for (int r = 0; r < m->replicas; r++) n += !m->left[r] && !m->joining[r];
    return n * m->stages;
}

/* Every acknowledging rank acknowledged the newest epoch: the switch. */
static bool name_switch(pt_membership *m)
{
    m->switch_epoch = m->epoch;
    m->switch_step = m->max_step + m->margin;
    m->switch_sequence = m->max_sequence + PT_MEMBERSHIP_SEQUENCE_GAP;
    const int giver = donor(m);
    m->switch_donor = -1;
    for (int r = 0; r < m->replicas; r++) {
        m->switch_joiners[r] = m->joining[r];
        if (!m->joining[r]) continue;
        m->switch_donor = giver;
        m->let_in_at[r] = m->epoch;
    }
    return true;
}

bool pt_membership_acknowledge(pt_membership *m, int rank, long epoch, long step,
                               uint32_t sequence)
{
    if (!pt_membership_rank_live(m, rank) || epoch != m->epoch || m->acked_epoch[rank] == epoch ||
        m->switch_epoch == epoch)
        return false; /* (a joiner that is done acknowledges an epoch switched already) */
    m->acked_epoch[rank] = epoch;
    if (step > m->max_step) m->max_step = step;
    if (sequence > m->max_sequence) m->max_sequence = sequence;
    /* a rank of a joining replica that trains already (it took its state, and says so next)
     * is counted once its replica is in */
    if (m->joining[pt_membership_replica_of(m, rank)]) return false;
    if (++m->acks < acknowledging_ranks(m)) return false;
    return name_switch(m);
}

pt_joined pt_membership_joiner_in(pt_membership *m, int rank, long epoch)
{
    if (rank < 0 || rank >= m->world) return PT_JOINED_STALE;
    const int replica = pt_membership_replica_of(m, rank);
    if (!m->joining[replica] || m->let_in_at[replica] == 0 || epoch != m->let_in_at[replica])
        return PT_JOINED_STALE;
    m->took_state[rank] = epoch;
    const int first = replica * m->stages;
    for (int r = first; r < first + m->stages; r++)
        if (m->took_state[r] != epoch) return PT_JOINED_WAIT;
    forget_join(m, replica);
    if (m->switch_epoch == m->epoch) return PT_JOINED_IN; /* the newest epoch switched already */
    for (int r = first; r < first + m->stages; r++) m->acks += m->acked_epoch[r] == m->epoch;
    if (m->acks < acknowledging_ranks(m)) return PT_JOINED_IN;
    name_switch(m);
    return PT_JOINED_IN_SWITCH;
}
