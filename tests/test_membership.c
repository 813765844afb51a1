/* The membership bookkeeping of elastic replicas (comm/membership.h),
 * checked against what the protocol promises: a failure takes its whole
 * replica out once, too few replicas abort, and the switch step and sequence
 * are past every survivor's acknowledgement by the margin and the gap. */
#include <criterion/criterion.h>

#include "comm/membership.h"

/* 2 stages × 3 replicas: ranks 2, 3 are replica 1. */
static pt_membership six_ranks(int min_replicas)
{
    pt_membership m;
    cr_assert_eq(pt_membership_init(&m, 6, 2, min_replicas, pt_membership_margin(2)), PIPERT_OK,
                 "%s", pipert_last_error());
    return m;
}

Test(membership, a_failure_takes_its_whole_replica_once)
{
    pt_membership m = six_ranks(2);
    cr_expect(pt_membership_elastic(&m));
    cr_expect_eq(pt_membership_rank_failed(&m, 3), PT_DEPARTURE_LEFT);
    cr_expect_eq(m.epoch, 1);
    cr_expect_eq(m.last_left, 1);
    cr_expect_eq(m.live, 2);
    cr_expect_eq(pt_membership_live_ranks(&m), 4);
    cr_expect(!pt_membership_rank_live(&m, 2), "stage 0 of replica 1 is out with it");
    cr_expect(!pt_membership_rank_live(&m, 3));
    cr_expect(pt_membership_rank_live(&m, 0) && pt_membership_rank_live(&m, 5));
    /* its other stage failing afterwards changes nothing */
    cr_expect_eq(pt_membership_rank_failed(&m, 2), PT_DEPARTURE_IGNORED);
    cr_expect_eq(m.epoch, 1);
    /* a second replica would leave one, below min_replicas = 2 */
    cr_expect_eq(pt_membership_rank_failed(&m, 4), PT_DEPARTURE_ABORT);
    cr_expect_eq(m.live, 2);
    pt_membership_free(&m);
}

Test(membership, without_elastic_replicas_every_failure_aborts)
{
    pt_membership m = six_ranks(3);
    cr_expect(!pt_membership_elastic(&m));
    cr_expect_eq(pt_membership_rank_failed(&m, 0), PT_DEPARTURE_ABORT);
    pt_membership_free(&m);
}

Test(membership, the_switch_comes_after_every_acknowledgement)
{
    pt_membership m = six_ranks(1);
    const long margin = pt_membership_margin(2);
    cr_expect_eq(margin, 6, "twice the stages plus two");
    cr_assert_eq(pt_membership_rank_failed(&m, 1), PT_DEPARTURE_LEFT); /* replica 0 */
    const long steps[] = {0, 0, 40, 37, 43, 39};
    const uint32_t sequences[] = {0, 0, 900, 950, 901, 949};
    for (int rank = 2; rank < 6; rank++) {
        /* an acknowledgement of no epoch, or from the replica that left, is ignored */
        cr_expect(!pt_membership_acknowledge(&m, rank, 0, 1000, 99999));
        cr_expect(!pt_membership_acknowledge(&m, 0, 1, 1000, 99999));
        const bool complete = pt_membership_acknowledge(&m, rank, 1, steps[rank], sequences[rank]);
        cr_expect_eq(complete, rank == 5, "rank %d", rank);
        cr_expect(!pt_membership_acknowledge(&m, rank, 1, 1000, 99999), "a repeat is ignored");
    }
    cr_expect_eq(m.switch_epoch, 1);
    cr_expect_eq(m.switch_step, 43 + margin);
    cr_expect_eq(m.switch_sequence, 950 + PT_MEMBERSHIP_SEQUENCE_GAP);
    pt_membership_free(&m);
}

Test(membership, a_second_departure_restarts_the_acknowledgements)
{
    pt_membership m = six_ranks(1);
    cr_assert_eq(pt_membership_rank_failed(&m, 0), PT_DEPARTURE_LEFT);
    cr_expect(!pt_membership_acknowledge(&m, 2, 1, 10, 5));
    cr_assert_eq(pt_membership_rank_failed(&m, 5), PT_DEPARTURE_LEFT);
    cr_expect_eq(m.epoch, 2);
    cr_expect(!pt_membership_acknowledge(&m, 3, 1, 10, 5), "the old epoch no longer counts");
    cr_expect(!pt_membership_acknowledge(&m, 2, 2, 12, 7));
    cr_expect(pt_membership_acknowledge(&m, 3, 2, 11, 6));
    cr_expect_eq(m.switch_epoch, 2);
    cr_expect_eq(m.switch_step, 12 + pt_membership_margin(2));
    pt_membership_free(&m);
}

Test(membership, impossible_settings_are_refused)
{
    pt_membership m;
    cr_expect_eq(pt_membership_init(&m, 6, 4, 1, 3), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_membership_init(&m, 6, 2, 4, 3), PIPERT_ERR_CONFIG);
    cr_expect_eq(pt_membership_init(&m, 6, 2, 0, 3), PIPERT_ERR_CONFIG);
    cr_expect_eq(pt_membership_init(&m, 6, 2, 1, 0), PIPERT_ERR_INVALID_ARG);
}

Test(membership, a_replica_that_left_joins_again_through_a_switch)
{
    pt_membership m = six_ranks(2);
    cr_expect(!pt_membership_replica_joins(&m, 1), "replica 1 never left");
    cr_assert_eq(pt_membership_rank_failed(&m, 3), PT_DEPARTURE_LEFT); /* replica 1 */
    cr_expect(pt_membership_acknowledge(&m, 0, 1, 5, 10) == false);
    cr_expect(pt_membership_acknowledge(&m, 1, 1, 5, 10) == false);
    cr_expect(pt_membership_acknowledge(&m, 4, 1, 5, 10) == false);
    cr_expect(pt_membership_acknowledge(&m, 5, 1, 5, 10));
    cr_expect_eq(m.switch_donor, -1, "a departure has no donor");
    for (int r = 0; r < 3; r++) cr_expect(!m.switch_joiners[r], "replica %d joins at none", r);

    cr_assert(pt_membership_replica_joins(&m, 1));
    cr_expect_eq(m.epoch, 2);
    cr_expect_eq(m.live, 3);
    cr_expect(pt_membership_rank_live(&m, 2) && pt_membership_rank_live(&m, 3));
    cr_expect(pt_membership_replica_joining(&m, 1));
    cr_expect(!pt_membership_replica_joins(&m, 1), "it is in already");
    /* the joiner's own ranks have nothing to acknowledge (they wait for their state): the
     * other four complete it */
    cr_expect(!pt_membership_acknowledge(&m, 2, 2, 0, 0));
    const long steps[] = {30, 31, 0, 0, 29, 33};
    for (int rank = 0; rank < 6; rank++) {
        if (rank == 2 || rank == 3) continue;
        const bool complete = pt_membership_acknowledge(&m, rank, 2, steps[rank], 100 + rank);
        cr_expect_eq(complete, rank == 5, "rank %d", rank);
    }
    cr_expect_eq(m.switch_epoch, 2);
    cr_expect_eq(m.switch_step, 33 + pt_membership_margin(2));
    cr_expect_eq(m.switch_sequence, 105 + PT_MEMBERSHIP_SEQUENCE_GAP);
    cr_expect_eq(m.switch_donor, 0, "the first replica that stayed gives the state");
    cr_expect(m.switch_joiners[1] && !m.switch_joiners[0] && !m.switch_joiners[2],
              "the switch lets replica 1 in, and only it");
    cr_expect(pt_membership_replica_joining(&m, 1), "let in, but joining until it took its state");
    cr_expect_eq(pt_membership_joiner_in(&m, 0, 2), PT_JOINED_STALE, "rank 0 never joined");
    cr_expect_eq(pt_membership_joiner_in(&m, 2, 2), PT_JOINED_WAIT);
    cr_expect_eq(pt_membership_joiner_in(&m, 2, 2), PT_JOINED_WAIT, "a repeat counts once");
    cr_expect(pt_membership_replica_joining(&m, 1), "one of its two ranks took its state");
    cr_expect_eq(pt_membership_joiner_in(&m, 3, 1), PT_JOINED_STALE, "no switch 1 let it in");
    cr_expect(pt_membership_replica_joining(&m, 1));
    cr_expect_eq(pt_membership_joiner_in(&m, 3, 2), PT_JOINED_IN,
                 "in; the switch of epoch 2 was announced already");
    cr_expect(!pt_membership_replica_joining(&m, 1), "in");
    pt_membership_free(&m);
}

/* The churn bed's deadlock: a change before the survivors reach a join's switch supersedes it,
 * so the joiners, waiting for their state, never acknowledge; the next switch must not wait
 * for them, and must let them in again (with a donor). Acknowledgements its ranks sent while
 * their replica was still joining count once it is in. */
Test(membership, a_switch_superseded_before_its_joiners_took_their_state_lets_them_in_again)
{
    pt_membership m = six_ranks(1);
    cr_assert_eq(pt_membership_rank_failed(&m, 1), PT_DEPARTURE_LEFT); /* replica 0: epoch 1 */
    for (int rank = 2; rank < 6; rank++) pt_membership_acknowledge(&m, rank, 1, 10, 1);
    cr_assert(pt_membership_replica_joins(&m, 0)); /* epoch 2 */
    for (int rank = 2; rank < 6; rank++) pt_membership_acknowledge(&m, rank, 2, 20, 2);
    cr_assert_eq(m.switch_epoch, 2);
    cr_expect(m.switch_joiners[0] && m.switch_donor == 1);
    /* replica 1 dies before step T: epoch 3, which replica 2 alone acknowledges */
    cr_assert_eq(pt_membership_rank_failed(&m, 3), PT_DEPARTURE_LEFT);
    cr_expect(!pt_membership_acknowledge(&m, 0, 3, 21, 3), "the joiners do not count");
    cr_expect(!pt_membership_acknowledge(&m, 4, 3, 22, 3));
    cr_expect(pt_membership_acknowledge(&m, 5, 3, 22, 3), "replica 2's two ranks complete it");
    cr_expect_eq(m.switch_epoch, 3);
    cr_expect(m.switch_joiners[0], "replica 0 is let in again");
    cr_expect_eq(m.switch_donor, 2, "by the replica that stayed");
    /* rank 0 takes that switch's state; replica 1 comes back (epoch 4) before rank 1 took it,
     * and the next switch, which replica 2's ranks complete, lets replica 0 in again: the
     * state rank 0 took is stale, and both ranks take the new switch's */
    cr_expect_eq(pt_membership_joiner_in(&m, 0, 3), PT_JOINED_WAIT);
    cr_assert(pt_membership_replica_joins(&m, 1)); /* epoch 4 */
    cr_expect(!pt_membership_acknowledge(&m, 4, 4, 29, 4));
    cr_expect(pt_membership_acknowledge(&m, 5, 4, 29, 4), "the joiners do not count");
    cr_expect(m.switch_joiners[0] && m.switch_joiners[1] && m.switch_donor == 2);
    cr_expect_eq(m.switch_step, 29 + pt_membership_margin(2));
    cr_expect_eq(pt_membership_joiner_in(&m, 1, 3), PT_JOINED_STALE, "switch 3 was superseded");
    cr_expect_eq(pt_membership_joiner_in(&m, 0, 3), PT_JOINED_STALE);
    cr_expect(pt_membership_replica_joining(&m, 0), "not in on a superseded switch's state");
    cr_expect_eq(pt_membership_joiner_in(&m, 0, 4), PT_JOINED_WAIT, "rank 0 takes it again");
    cr_expect_eq(pt_membership_joiner_in(&m, 1, 4), PT_JOINED_IN);
    cr_expect(!pt_membership_replica_joining(&m, 0), "replica 0 is in");
    cr_expect_eq(pt_membership_joiner_in(&m, 2, 4), PT_JOINED_WAIT, "replica 1 waits for rank 3");
    /* replica 2 dies: replica 0 alone acknowledges (replica 1 is joining), and the switch
     * lets replica 1 in again with replica 0 as its donor */
    cr_assert_eq(pt_membership_rank_failed(&m, 5), PT_DEPARTURE_LEFT); /* epoch 5 */
    cr_expect(!pt_membership_acknowledge(&m, 0, 5, 40, 5));
    cr_expect(pt_membership_acknowledge(&m, 1, 5, 41, 5), "replica 1 is joining: replica 0 alone");
    cr_expect_eq(m.switch_donor, 0, "replica 0 gives replica 1 its state");
    cr_expect(m.switch_joiners[1] && !m.switch_joiners[0]);
    cr_expect_eq(pt_membership_joiner_in(&m, 3, 4), PT_JOINED_STALE);
    cr_expect_eq(pt_membership_joiner_in(&m, 3, 5), PT_JOINED_WAIT,
                 "rank 2's state of switch 4 does not count");
    cr_expect_eq(pt_membership_joiner_in(&m, 2, 5), PT_JOINED_IN);
    pt_membership_free(&m);
}

Test(membership, a_joiner_that_fails_before_its_switch_leaves_again)
{
    pt_membership m = six_ranks(1);
    cr_assert_eq(pt_membership_rank_failed(&m, 0), PT_DEPARTURE_LEFT); /* replica 0 */
    cr_assert(pt_membership_replica_joins(&m, 0));
    cr_expect_eq(pt_membership_rank_failed(&m, 1), PT_DEPARTURE_LEFT, "replica 0 again");
    cr_expect_eq(m.epoch, 3);
    cr_expect_eq(m.live, 2);
    cr_expect(!pt_membership_replica_joining(&m, 0));
    for (int rank = 2; rank < 5; rank++) cr_expect(!pt_membership_acknowledge(&m, rank, 3, 7, 1));
    cr_expect(pt_membership_acknowledge(&m, 5, 3, 7, 1));
    cr_expect_eq(m.switch_donor, -1);
    /* with no replica left that stayed, nobody could give a joiner its state */
    pt_membership lone;
    cr_assert_eq(pt_membership_init(&lone, 2, 2, 1, 6), PIPERT_OK);
    cr_expect(!pt_membership_replica_joins(&lone, 0));
    pt_membership_free(&lone);
    pt_membership_free(&m);
}

Test(membership, acknowledgements_after_the_switch_announce_nothing)
{
    pt_membership m = six_ranks(2);
    cr_assert_eq(pt_membership_rank_failed(&m, 3), PT_DEPARTURE_LEFT);
    for (int rank = 0; rank < 6; rank++)
        if (rank != 2 && rank != 3) pt_membership_acknowledge(&m, rank, 1, 5, 10);
    cr_assert(pt_membership_replica_joins(&m, 1));
    for (int rank = 0; rank < 6; rank++)
        if (rank != 2 && rank != 3) pt_membership_acknowledge(&m, rank, 2, 9, 20);
    cr_assert_eq(m.switch_epoch, 2);
    /* the joiners, done at the end of the run, count as acknowledging: no second switch */
    cr_expect(!pt_membership_acknowledge(&m, 2, 2, 3000, 99));
    cr_expect(!pt_membership_acknowledge(&m, 3, 2, 3000, 99));
    cr_expect_eq(m.switch_step, 9 + pt_membership_margin(2));
    pt_membership_free(&m);
}
