/* What the coordinator knows of its job, read by the launcher (progress line, status.json)
 * and by whoever waits for the job to end: snapshots taken under the coordinator's lock. */
#include "comm/coordinator_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

void pt_coordinator_wait(pt_coordinator *c, double timeout_s)
{
    struct timespec deadline = pt_coord_deadline_after(timeout_s);
    pthread_mutex_lock(&c->lock);
    while (c->phase != PT_JOB_FINISHED && c->phase != PT_JOB_ABORTED)
        if (pthread_cond_timedwait(&c->changed, &c->lock, &deadline) == ETIMEDOUT) break;
    pthread_mutex_unlock(&c->lock);
}

void pt_coordinator_status(pt_coordinator *c, pt_job_status *s)
{
    pthread_mutex_lock(&c->lock);
    *s = (pt_job_status){.phase = c->phase, .world = c->options.world,
                         .registered = c->registered, .done = c->done, .min_step = 0,
                         .mean_loss = NAN, .val_step = c->val_step, .val_loss = c->val_loss,
                         .abort_rank = c->abort_rank,
                         .replicas = c->membership.replicas,
                         .replicas_live = c->membership.live,
                         .departures = c->membership.departures,
                         .joins = c->membership.joins};
    snprintf(s->abort_reason, sizeof s->abort_reason, "%s", c->abort_reason);
    double loss_sum = 0;
    int losses = 0, measured = 0;
    for (int r = 0; r < c->options.world; r++) {
        const rank_state *rs = &c->ranks[r];
        if (!rs->has_progress || pt_coord_rank_left(c, r)) continue;
        const pt_rank_progress *p = &rs->progress;
        s->min_step = s->reporting == 0 || p->step < s->min_step ? p->step : s->min_step;
        s->total_steps = p->total_steps > s->total_steps ? p->total_steps : s->total_steps;
        if (isfinite(p->loss)) loss_sum += p->loss, losses++;
        s->tokens_per_s += p->tokens_per_s;
        s->reporting++;
        if (isfinite(p->compute)) {
            s->compute += p->compute, s->wait_pipeline += p->wait_pipeline;
            s->wait_coupling += p->wait_coupling, s->bytes_wan += p->bytes_wan;
            measured++;
        }
    }
    if (losses) s->mean_loss = loss_sum / losses;
    if (measured) s->compute /= measured, s->wait_pipeline /= measured, s->wait_coupling /= measured;
    else s->compute = NAN;
    pthread_mutex_unlock(&c->lock);
}

void pt_coordinator_rank_statuses(pt_coordinator *c, pt_rank_status *ranks)
{
    pthread_mutex_lock(&c->lock);
    for (int r = 0; r < c->options.world; r++) {
        const rank_state *rs = &c->ranks[r];
        /* (a coordinator started again knows a rank of a replica that left only as left) */
        pt_rank_state state = rs->joining                ? PT_RANK_JOINING
                              : pt_coord_rank_left(c, r) ? PT_RANK_LEFT
                              : !rs->registered          ? PT_RANK_REGISTERING
                              : rs->done                 ? PT_RANK_DONE
                                                         : PT_RANK_TRAINING;
        ranks[r] = (pt_rank_status){state, rs->has_progress ? rs->progress.step : -1};
    }
    pthread_mutex_unlock(&c->lock);
}

const char *pt_rank_state_name(pt_rank_state state)
{
    static const char *const names[] = {"registering", "training", "left", "joining", "done"};
    return state >= 0 && state <= PT_RANK_DONE ? names[state] : "unknown";
}

bool pt_coordinator_rank_failure(pt_coordinator *c, int rank, char *reason, size_t cap)
{
    if (rank < 0 || rank >= c->options.world) return false;
    pthread_mutex_lock(&c->lock);
    bool failed = c->ranks[rank].failed;
    if (failed) snprintf(reason, cap, "%s", c->ranks[rank].failure);
    pthread_mutex_unlock(&c->lock);
    return failed;
}

void pt_job_progress_line(const pt_job_status *s, char *line, size_t cap)
{
    if (s->phase == PT_JOB_REGISTERING) {
        snprintf(line, cap, "waiting for workers: %d/%d registered", s->registered, s->world);
        return;
    }
    if (s->reporting == 0) {
        snprintf(line, cap, "%d workers registered; waiting for the first step", s->world);
        return;
    }
    int used = snprintf(line, cap, "step %ld/%ld | loss %.4f | %.0f tok/s | %d/%d ranks reporting",
                        s->min_step, s->total_steps, s->mean_loss, s->tokens_per_s, s->reporting,
                        s->world);
    if (s->done > 0 && used > 0 && (size_t)used < cap)
        used += snprintf(line + used, cap - (size_t)used, ", %d done", s->done);
    if (s->replicas_live < s->replicas && used > 0 && (size_t)used < cap)
        used += snprintf(line + used, cap - (size_t)used, " | %d/%d replicas", s->replicas_live,
                         s->replicas);
    if (isfinite(s->compute) && used > 0 && (size_t)used < cap)
        used += snprintf(line + used, cap - (size_t)used,
                         " | compute %.0f%%, waiting %.0f%% pipeline %.0f%% coupling", 100 * s->compute,
                         100 * s->wait_pipeline, 100 * s->wait_coupling);
    if (s->bytes_wan > 0 && used > 0 && (size_t)used < cap)
        used += snprintf(line + used, cap - (size_t)used, " | %.2f MB/step between sites",
                         s->bytes_wan / 1e6);
    if (s->val_step >= 0 && used > 0 && (size_t)used < cap)
        snprintf(line + used, cap - (size_t)used, " | val_loss %.4f (step %ld)", s->val_loss,
                 s->val_step);
}
