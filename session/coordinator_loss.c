/* Outliving the coordinator (docs/RUNNING.md, "The coordinator dies").
 *
 * Under `pipert launch` the coordinator is the launcher: when it dies the
 * workers lose their control path but not their data plane, so they finish
 * cleanly: every rank writes its part of one checkpoint of the same step N
 * and stops with PIPERT_ERR_COORDINATOR_LOST; `pipert launch --resume` then
 * continues from N.
 *
 * The ranks notice the loss at different moments and, with the asynchronous
 * pipeline, at different steps, so they vote. Every K steps (K =
 * runtime.coordinator_check_steps, at least stages + 1) each rank, after its
 * own step n, starts a non-blocking sum over the world group (every rank) of
 * a flag "I have lost the coordinator", and completes it after its own step
 * n + K. The sum is the same on every rank, so every rank decides the same:
 * if it is not zero (elastic replicas: if it is every rank's), all stop after
 * step n + K. The wait at n + K normally
 * finds the vote done: a rank at its step n + K is at most S − 1 steps ahead
 * of the slowest stage of its replica (the stages of an asynchronous
 * pipeline) and a step ahead of its stage's other replicas (their coupling),
 * so every rank has started the vote of step n by then, without needing this
 * rank to go further.
 *
 * A vote is started only when n + K is before the last step: a run that would
 * end sooner simply finishes (its last step checkpoints anyway, and the
 * coordinator's absence is not an error then). Noticing the loss changes
 * nothing else: waits for peers go on (only a stop or an abort ends them). */
#include <math.h>
#include <stdlib.h>

#include "runtime/log.h"
#include "session/session_internal.h"

#define WAIT_SLICE_S 0.5

static long vote_period(const pipert_session *s)
{
    const long k = s->config.runtime.coordinator_check_steps;
    return k > s->job.layout.stages ? k : s->job.layout.stages + 1;
}

/* Says once, in this rank's log, that the coordinator is gone. */
static bool noticed_loss(pipert_session *s, long step)
{
    char why[512];
    if (!pt_job_coordinator_lost(&s->job, why, sizeof why)) {
        if (s->vote.loss_logged)
            pt_warn("the coordinator is heard again after step %ld (a link that came back): "
                    "training goes on as before", step);
        s->vote.loss_logged = false;
        return false;
    }
    if (!s->vote.loss_logged)
        pt_warn("coordinator lost after step %ld: %s; training goes on until the workers agree "
                "on a step to stop at (they vote every %ld steps)",
                step, why, vote_period(s));
    s->vote.loss_logged = true;
    return true;
}

/* Says once each time, in this rank's log, that it registered again with a coordinator
 * started again (under pipert launch: coord_client.h, reconnect_s). */
static void noticed_return(pipert_session *s, long step)
{
    const long n = pt_job_coordinator_reconnections(&s->job);
    if (n == s->vote.reconnections_logged) return;
    s->vote.reconnections_logged = n;
    pt_info("the coordinator was started again; this rank registered with it again (by step %ld; "
            "%ld time%s in all) and trains on", step, n, n == 1 ? "" : "s");
}

/* The vote started K steps ago, in slices so that a stop or an abort ends the wait.
 * Elastic replicas: a vote that replicas leaving cut short decides nothing (the
 * survivors vote again over their new world group). */
static pipert_result finish_vote(pipert_session *s, bool *lost)
{
    pt_allreduce_handle *vote = s->vote.handle;
    s->vote.handle = NULL;
    for (;;) {
        pipert_result rc = pt_allreduce_wait_for(vote, WAIT_SLICE_S);
        if (rc == PIPERT_OK) break;
        if (rc != PIPERT_ERR_TIMEOUT) {
            free(s->vote.value);
            s->vote.value = NULL;
            if (s->job.elastic && pt_session_departures_since(s, s->vote.groups))
                return PIPERT_OK;
            pt_error_prefix("the workers' vote on the coordinator of step %ld", s->vote.step);
            return rc;
        }
        const bool departed = s->job.elastic && pt_session_membership_changed(s);
        if (departed || atomic_load(&s->stop_requested) || pt_job_aborted(&s->job)) {
            pt_allreduce_abandon(vote);
            PT_TRY(pt_session_keep_until_end(s, s->vote.value));
            s->vote.value = NULL;
            if (departed) return PIPERT_OK; /* replicas left: this vote decides nothing */
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped during the workers' vote on the "
                                                   "coordinator");
        }
    }
    /* An elastic job stops only when every rank lost the coordinator: a rank that alone lost
     * it is cut off (a site's link down for about the heartbeat timeout), and the coordinator,
     * alive for the others, takes its replica out instead (the churn bed: a 5 s outage made
     * every replica checkpoint and exit). */
    const float needed = s->job.elastic ? (float)pt_group_size(s->job.world_group) : 1.0f;
    *lost = *s->vote.value >= needed;
    free(s->vote.value);
    s->vote.value = NULL;
    return PIPERT_OK;
}

/* Between a departure and the survivors' new groups there is no world group
 * to vote in. */
static bool regrouping(const pipert_session *s)
{
    return s->elastic.acked_epoch != s->elastic.regrouped_epoch;
}

pipert_result pt_session_coordinator_vote(pipert_session *s, long step, bool *stop)
{
    *stop = false;
    noticed_return(s, step);
    if (!s->job.world_group) return PIPERT_OK;
    const bool lost = noticed_loss(s, step);
    const long k = vote_period(s);
    if (step % k != 0) return PIPERT_OK;
    if (s->vote.handle && s->vote.groups != s->elastic.regrouped_epoch)
        PT_TRY(pt_session_coordinator_vote_abandon(s));
    if (s->vote.handle) {
        PT_TRY(finish_vote(s, stop));
        if (*stop) return PIPERT_OK;
    }
    if (step + k >= s->config.train.steps || regrouping(s) || !s->job.world_group) return PIPERT_OK;
    s->vote.value = malloc(sizeof *s->vote.value);
    if (!s->vote.value) return pt_fail(PIPERT_ERR_NOMEM, "the vote: out of memory");
    *s->vote.value = lost ? 1.0f : 0.0f;
    s->vote.step = step;
    s->vote.groups = s->elastic.regrouped_epoch;
    return pt_allreduce_start(s->job.world_group, s->vote.value, 1, PT_REDUCE_SUM,
                              &s->vote.handle);
}

pipert_result pt_session_coordinator_vote_abandon(pipert_session *s)
{
    if (s->vote.handle) pt_allreduce_abandon(s->vote.handle);
    s->vote.handle = NULL;
    /* an abandoned all-reduce may still write its buffer: kept until the job is left */
    pipert_result rc = s->vote.value ? pt_session_keep_until_end(s, s->vote.value)
                                          : PIPERT_OK;
    s->vote.value = NULL;
    return rc;
}
