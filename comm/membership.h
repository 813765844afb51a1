/* Elastic replicas: which replicas are still in the job, and when their
 * survivors switch to coupling groups without the ones that left.
 *
 * The coordinator owns one pt_membership (coordinator_server.c). When a rank
 * fails (its connection closes, it goes silent, it reports an error), its
 * whole replica leaves: the membership's epoch grows, and every rank is told
 * {epoch, replica}. A replica is a pipeline; one dead stage makes the others
 * of its replica useless, and the other replicas never depended on it except
 * through the coupling of their stages. When fewer than min_replicas would
 * remain, the job aborts instead.
 *
 * The switch. The survivors must start the new groups' collectives in the
 * same order, so they must start at the same step, and no survivor may have
 * passed that step when it learns it. Each survivor acknowledges the epoch at
 * the first step boundary after it heard of it, with that step n_i and the
 * next sequence number of its groups, and from then on trains with its
 * coupling suspended. It may run at most `margin` steps past n_i before it
 * must wait for the coordinator's word. Once every live rank acknowledged the
 * newest epoch, the coordinator announces
 *     switch step T = max_i n_i + margin,   first sequence = max_i seq_i + gap,
 * so no survivor is past T (each waits at n_i + margin ≤ T), and the new
 * groups' tags never meet a message of the old ones still on the wire. After
 * its step T every survivor builds the new groups and the coupling resumes.
 * The margin must exceed how far stages of one pipeline run apart (the
 * pipeline's depth), so that waiting at n_i + margin cannot block a
 * neighbour that has not acknowledged yet. A second departure before the
 * switch starts a new epoch; the acknowledgements begin again.
 *
 * Joining. A replica that left may come back (a restarted process for each
 * of its ranks: pt_membership_replica_joins once all of them registered and,
 * their stages built, said they are ready). That
 * is an epoch like a departure: the replica counts as live again, but as
 * joining — its ranks do not acknowledge (they have not trained); the others
 * do, and the switch is computed the same way. The switch lets the replica in,
 * and the first live replica that is not joining is its donor: after step T
 * each of the donor's stages sends its state (parameters, optimizer,
 * coupling, pipeline: session/join.c) to the joiner's rank of that stage,
 * which starts from there at step T + 1 in the new groups. Replicas that come
 * back before one switch are let in together (switch_joiners); they connect to
 * each other as the survivors connect to them, the lower replica dialling.
 * A replica stays joining until each of its ranks says it took the state of
 * the switch that let it in last (pt_membership_joiner_in); the coordinator
 * then tells them it is in, and only then do they train. A change that comes
 * before the survivors reach T supersedes the switch: the joiners wait for the
 * next one, which lets them in again (the survivors send the state to every
 * replica a switch lists), and a rank that took the superseded switch's state
 * takes the new one's instead. So the joiners are never counted on to
 * acknowledge an epoch while they wait for a state (which deadlocked the churn
 * bed), and no rank of a replica trains from one switch's state while another
 * waits for the next's (which would stall its pipeline).
 *
 * Pure bookkeeping, no I/O: the coordinator calls it under its lock. */
#ifndef PT_MEMBERSHIP_H
#define PT_MEMBERSHIP_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/error.h"

/* The sequences the new groups start from lie this far past every survivor's. */
#define PT_MEMBERSHIP_SEQUENCE_GAP 4096u

typedef struct pt_membership {
    int world, stages, replicas;
    int min_replicas; /* fewer live replicas abort the job */
    long margin;      /* steps a survivor may run past its acknowledgement */
    bool *left;       /* [replicas] */
    bool *joining;    /* [replicas]: back in the job, not yet switched in */
    int live;         /* replicas still in the job */
    long epoch;       /* membership changes so far: departures and joins */
    long departures, joins;
    int last_left;    /* the replica of the newest departure, -1 before any */
    /* this epoch's acknowledgements, per rank */
    long *acked_epoch;
    long max_step;
    uint32_t max_sequence;
    int acks; /* live ranks that acknowledged `epoch` */
    /* the newest switch announced (0: none) */
    long switch_epoch, switch_step;
    uint32_t switch_sequence;
    int switch_donor; /* the replica whose state the joiners of that switch take; -1: none */
    bool *switch_joiners; /* [replicas]: the replicas that switch lets in */
    long *let_in_at;      /* [replicas]: the newest switch that let a joining replica in (0: none) */
    long *took_state;     /* [world]: the switch whose state a rank of a joining replica
                           * said it took (0: none) */
} pt_membership;

/* The margin both sides use: twice the pipeline's depth, plus 2. */
long pt_membership_margin(int stages);

/* min_replicas in 1..replicas; replicas == min_replicas: every failure aborts. */
pipert_result pt_membership_init(pt_membership *m, int world, int stages, int min_replicas,
                                 long margin);
void pt_membership_free(pt_membership *m);

/* Whether the job may lose a replica at all. */
bool pt_membership_elastic(const pt_membership *m);
int pt_membership_replica_of(const pt_membership *m, int rank);
bool pt_membership_rank_live(const pt_membership *m, int rank);
int pt_membership_live_ranks(const pt_membership *m);

typedef enum pt_departure {
    PT_DEPARTURE_IGNORED, /* its replica had left already */
    PT_DEPARTURE_LEFT,    /* its replica left: a new epoch */
    PT_DEPARTURE_ABORT,   /* not elastic, or too few replicas would remain */
} pt_departure;

pt_departure pt_membership_rank_failed(pt_membership *m, int rank);

/* A replica that left comes back: a new epoch (true), or false when it had not
 * left or no replica that is in the job could give it its state. */
bool pt_membership_replica_joins(pt_membership *m, int replica);
bool pt_membership_replica_joining(const pt_membership *m, int replica);

/* A live rank acknowledges `epoch` at `step` with its groups' next sequence.
 * True when this completes the newest epoch's acknowledgements: the switch
 * (switch_epoch, switch_step, switch_sequence, switch_donor) is then set and
 * lets the joining replicas in. An old epoch's acknowledgement, a repeated
 * one or one from a rank that left is ignored; one from a rank of a joining
 * replica is kept for when the replica is in. */
bool pt_membership_acknowledge(pt_membership *m, int rank, long epoch, long step,
                               uint32_t sequence);

typedef enum pt_joined {
    PT_JOINED_STALE,     /* not the state of the switch that let its replica in last: ignored */
    PT_JOINED_WAIT,      /* its replica waits for its other ranks */
    PT_JOINED_IN,        /* that was the last: the replica is in */
    PT_JOINED_IN_SWITCH, /* in, and that completed the newest epoch's acknowledgements: the
                          * switch is set, as by pt_membership_acknowledge */
} pt_joined;

/* A rank of a joining replica took the state of switch `epoch`. Once every rank of it took
 * the state of the switch that let it in last, the replica is in: it acknowledges from then
 * on, and what its ranks acknowledged of the newest epoch meanwhile counts. */
pt_joined pt_membership_joiner_in(pt_membership *m, int rank, long epoch);

#endif
