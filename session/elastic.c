/* Elastic replicas, the worker's side (the protocol: comm/membership.h).
 *
 * At every step boundary a survivor looks at what the coordinator said. A
 * new departure: it acknowledges with the steps it has taken, and its
 * coupling pauses (pt_coupling_suspend: nothing in flight is waited for, no
 * new averaging starts). It trains on alone for at most the margin, then waits
 * for the switch if it has not come. At the boundary after the switch step
 * it builds the survivors' groups (session/job.c) and the coupling resumes
 * over them; a method that keeps replicas bitwise equal (allreduce) first
 * takes replica 0's parameters and optimizer moments, since the survivors
 * trained apart meanwhile. Each pause is a "coupling paused" span in the
 * trace and counted in the metrics (departures). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/clock.h"
#include "comm/membership.h"
#include "session/session_internal.h"

#define SWITCH_POLL_S 0.01

/* Replicas out of the job as the coordinator says now. */
static int replicas_out(pipert_session *s)
{
    int out = 0;
    for (int r = 0; r < s->job.layout.replicas; r++)
        out += pt_coord_client_replica_left(s->job.client, r, NULL, 0);
    return out;
}

static pipert_result acknowledge(pipert_session *s, long epoch, long version)
{
    PT_TRY(pt_job_acknowledge(&s->job, epoch, version));
    if (s->elastic.acked_epoch == s->elastic.regrouped_epoch)
        s->elastic.paused_us = pt_trace_clock_us(s->trace);
    s->elastic.acked_epoch = epoch;
    s->elastic.ack_step = version;
    const int out = replicas_out(s);
    s->elastic.absent = out;
    pt_coupling_suspend(s->coupling);
    PT_TRY(pt_session_coordinator_vote_abandon(s)); /* its world group changes */
    pt_warn("the job's replicas changed (membership epoch %ld, %d out): the coupling pauses "
            "after step %ld until they regroup", epoch, out, version);
    return PIPERT_OK;
}

/* The margin ran out before the switch was announced: wait for it. */
static pipert_result wait_for_switch(pipert_session *s, pt_membership_news *news)
{
    const double started = pt_now_s();
    while (news->switch_epoch < s->elastic.acked_epoch) {
        PT_TRY(pt_job_check(&s->job));
        if (atomic_load(&s->stop_requested))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while waiting for the survivors to "
                                                   "regroup");
        struct timespec pause = {0, (long)(SWITCH_POLL_S * 1e9)};
        nanosleep(&pause, NULL);
        pt_job_membership(&s->job, news);
        if (news->epoch > s->elastic.acked_epoch) return PIPERT_OK; /* another departure */
    }
    pt_info("waited %.2f s for the survivors to regroup", pt_now_s() - started);
    return PIPERT_OK;
}

/* pt_broadcast of a tensor in the kernels' memory: through a host copy when
 * the host cannot read it (host: NULL or a buffer of `bytes`). */
static pipert_result broadcast_tensor(pipert_session *s, pt_group *g, float *tensor, size_t bytes,
                                      float *host)
{
    if (!host) return pt_broadcast(g, tensor, bytes, 0);
    s->kernels->copy_to_host(host, tensor, bytes);
    PT_TRY(pt_broadcast(g, host, bytes, 0));
    s->kernels->copy_to_device(tensor, host, bytes);
    return PIPERT_OK;
}

/* A method that keeps replicas equal: replica 0 of the survivors gives its
 * parameters and optimizer moments to the others. */
static pipert_result make_replicas_equal(pipert_session *s)
{
    pt_group *g = s->job.replica_group;
    if (!g || !pt_coupling_replicas_identical(s->coupling)) return PIPERT_OK;
    pt_gpt_slice *model = pt_stage_executor_model(s->executor);
    pt_optimizer *opt = pt_stage_executor_optimizer(s->executor);
    const size_t bytes = model->n_params * sizeof(float);
    float *host = NULL;
    if (!s->kernels->host_accessible)
        PT_TRY(s->kernels->alloc_host((void **)&host, bytes, "a host copy for the broadcast"));
    pipert_result rc = broadcast_tensor(s, g, model->params, bytes, host);
    if (rc == PIPERT_OK) rc = broadcast_tensor(s, g, opt->m, bytes, host);
    if (rc == PIPERT_OK) rc = broadcast_tensor(s, g, opt->v, bytes, host);
    if (host) s->kernels->free_host(host);
    return rc;
}

/* Replicas coming back: this stage's ranks of them connected, and given the donor's state.
 * A joiner lost meanwhile is a departure the next switch settles. */
static pipert_result admit_joiners(pipert_session *s, const pt_membership_news *news)
{
    const int W = s->job.world;
    bool *joiners = calloc((size_t)W, sizeof *joiners), *fresh = calloc((size_t)W, sizeof *fresh);
    pipert_result rc = joiners && fresh ? PIPERT_OK
                                        : pt_fail(PIPERT_ERR_NOMEM, "session: out of memory");
    if (rc == PIPERT_OK) rc = pt_job_switch_joiners(&s->job, news->switch_epoch, joiners, fresh);
    if (rc == PIPERT_OK) rc = pt_job_admit_joiners(&s->job, fresh);
    for (int r = 0; rc == PIPERT_OK && r < s->job.layout.replicas; r++)
        if (joiners[r] && s->job.replica == news->switch_donor)
            rc = pt_session_send_state(s, pt_layout_rank(&s->job.layout, s->job.stage, r),
                                       news->switch_epoch);
    free(joiners);
    free(fresh);
    if (rc != PIPERT_OK && pt_session_departures_since(s, news->switch_epoch)) {
        pt_warn("a replica coming back was lost while joining, or a newer change came (%s); the "
                "next switch goes on without it", pipert_last_error());
        return PIPERT_OK;
    }
    return rc;
}

pipert_result pt_session_switch_groups(pipert_session *s, const pt_membership_news *news)
{
    PT_TRY(admit_joiners(s, news));
    PT_TRY(pt_job_check(&s->job)); /* this replica may have left meanwhile */
    PT_TRY(pt_job_regroup(&s->job, news->switch_epoch, news->switch_sequence));
    const pt_coupling_options groups = {.replicas = s->job.replica_group,
                                        .site_replicas = s->job.site_group,
                                        .leaders = s->job.leaders_group,
                                        .sites = s->job.sites};
    pt_gpt_slice *model = pt_stage_executor_model(s->executor);
    const pt_coupling_point at = {.model = model, .params = model->params,
                                  .n_params = model->n_params,
                                  .step = pt_stage_executor_version(s->executor)};
    pipert_result rc = pt_coupling_regroup(s->coupling, &groups, &at);
    if (rc == PIPERT_OK) rc = make_replicas_equal(s);
    if (rc == PIPERT_OK) rc = pt_job_settle_joiners(&s->job);
    /* A member lost during the switch's collectives: its departure comes next, and its
     * switch regroups again (the coupling stays suspended until then). */
    if (rc != PIPERT_OK && !pt_session_departures_since(s, news->switch_epoch)) return rc;
    if (rc != PIPERT_OK)
        pt_warn("a replica was lost while the others regrouped (%s); they regroup again",
                pipert_last_error());
    PT_TRY(pt_session_hand_over_outputs(s, news->switch_step));
    s->elastic.regrouped_epoch = news->switch_epoch;
    s->elastic.absent = replicas_out(s);
    if (!s->job.joining && s->elastic.paused_us > 0)
        pt_trace_span(s->trace, "coupling paused (replicas changed)", s->elastic.paused_us,
                      pt_trace_clock_us(s->trace), -1, -1, -1);
    pt_warn("the coupling resumes over %d replica%s after step %ld",
            s->job.layout.replicas - s->elastic.absent,
            s->job.layout.replicas - s->elastic.absent == 1 ? "" : "s", news->switch_step);
    return PIPERT_OK;
}

pipert_result pt_session_follow_membership(pipert_session *s)
{
    if (!s->job.elastic) return PIPERT_OK;
    const long version = pt_stage_executor_version(s->executor);
    pt_membership_news news;
    pt_job_membership(&s->job, &news);
    if (news.epoch > s->elastic.acked_epoch) PT_TRY(acknowledge(s, news.epoch, version));
    if (s->elastic.acked_epoch == s->elastic.regrouped_epoch) return PIPERT_OK;
    const long margin = pt_membership_margin(s->job.layout.stages);
    if (news.switch_epoch < s->elastic.acked_epoch && version >= s->elastic.ack_step + margin) {
        PT_TRY(wait_for_switch(s, &news));
        if (news.epoch > s->elastic.acked_epoch) return pt_session_follow_membership(s);
    }
    if (news.switch_epoch != s->elastic.acked_epoch) return PIPERT_OK;
    if (version > news.switch_step)
        return pt_fail(PIPERT_ERR_INTERNAL, "the survivors' switch at step %ld came after this "
                                            "worker's step %ld", news.switch_step, version);
    return version == news.switch_step ? pt_session_switch_groups(s, &news) : PIPERT_OK;
}

pipert_result pt_session_rejoin(pipert_session *s, long *step)
{
    const double started = pt_now_s(), started_us = pt_trace_clock_us(s->trace);
    pt_membership_news news;
    PT_TRY(pt_session_take_running_state(s, &news));
    *step = news.switch_step;
    s->elastic.acked_epoch = news.switch_epoch;
    PT_TRY(pt_session_switch_groups(s, &news));
    s->elastic.joined_at = news.switch_step;
    pt_trace_span(s->trace, "rejoining (waiting to be let in, taking the state)", started_us,
                  pt_trace_clock_us(s->trace), -1, -1, -1);
    unsigned long long checksum = 0;
    (void)pt_session_params_checksum(s, &checksum);
    pt_warn("replica %d is back in the job: stage %d took rank %d's state after step %ld in "
            "%.2f s, parameters' checksum %016llx",
            s->job.replica, s->job.stage,
            pt_layout_rank(&s->job.layout, s->job.stage, news.switch_donor), news.switch_step,
            pt_now_s() - started, checksum);
    return PIPERT_OK;
}
