/* A session: one worker's whole life in a job, behind the public API
 * (include/pipert/pipert.h): join (session/job.c) → build its stage (the
 * coupling of its replicas, then the executor) → step, with the validation,
 * metrics and checkpoints that fall due → finish. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"
#include "runtime/memory.h"
#include "runtime/topology.h"
#include "pipeline/plan.h"
#include "pipeline/schedule.h"
#include "session/session_internal.h"

/* Progress goes to the coordinator at every logged step, and at least this often. */
#define PROGRESS_PERIOD_S 0.5

extern char **environ;

/* ---- the calling thread: log sink and compute threads --------------------- */

/* Every API call runs with the session's log sink and thread count on the
 * calling thread, and puts the caller's sink back when it returns. */
typedef struct session_call {
    const pt_log_sink *previous_sink;
} session_call;

static session_call enter(pipert_session *s)
{
    session_call call = {pt_log_use_sink(&s->log_sink)};
    if (s->threads > 0 && s->kernels && s->kernels->set_threads) s->kernels->set_threads(s->threads);
    return call;
}

static void leave(const session_call *call) { pt_log_use_sink(call->previous_sink); }

static void forward_log_line(void *user, pt_log_level level, const char *line)
{
    const pipert_session *s = user;
    s->options.log(s->options.log_user, (pipert_log_level)level, line);
}

/* A joiner taking a switch's state (its pipeline replays its in-flight forwards with its
 * replica's other stages) stops when a newer change supersedes the switch: another stage of
 * its replica may wait for the newer one's state instead (session/join.c). */
static bool join_superseded(pipert_session *s)
{
    if (!s->elastic.taking_switch) return false;
    pt_membership_news news;
    pt_job_membership(&s->job, &news);
    return news.epoch > s->elastic.taking_switch;
}

static bool should_stop(void *context)
{
    pipert_session *s = context;
    return atomic_load(&s->stop_requested) || pt_job_aborted(&s->job) || join_superseded(s);
}

/* ---- building -------------------------------------------------------------- */

/* The trace (pipeline.trace) comes first: the coupling and the executor both draw into it. */
static pipert_result build_trace(pipert_session *s)
{
    if (!s->config.pipeline.trace) return PIPERT_OK;
    return pt_trace_create(&s->trace, s->job.rank, s->job.stage, s->job.replica, 1 << 17);
}

static pipert_result build_coupling(pipert_session *s)
{
    pt_coupling_options o = {.config = &s->config,
                             .kernels = s->kernels,
                             .replicas = s->job.replica_group,
                             .site_replicas = s->job.site_group,
                             .leaders = s->job.leaders_group,
                             .sites = s->job.sites,
                             .stage = s->job.stage,
                             .replica = s->job.replica,
                             .trace = s->trace,
                             .should_stop = should_stop,
                             .membership_changed = pt_session_membership_changed,
                             .context = s};
    if (s->job.elastic && s->config.dp.nccl)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.nccl=true with elastic replicas (--min-replicas): an "
                                          "NCCL group does not survive a lost member; leave "
                                          "dp.nccl off (the UCX all-reduce) for elastic jobs");
    PT_TRY(pt_coupling_create(&o, &s->coupling));
    pt_coupling_set_elastic(s->coupling, s->job.elastic);
    return PIPERT_OK;
}

static pipert_result build_executor(pipert_session *s)
{
    const pt_job *job = &s->job;
    const int S = job->layout.stages;
    pt_stage_executor_options o = {.config = &s->config,
                                   .kernels = s->kernels,
                                   .stage = job->stage,
                                   .stages = S,
                                   .replica = job->replica,
                                   .replicas = job->layout.replicas,
                                   .threads = s->threads,
                                   .transport = job->transport,
                                   .stage_group = job->stage_group,
                                   .coupling = s->coupling,
                                   .batch = s->options.batch,
                                   .batch_user = s->options.batch_user,
                                   .should_stop = should_stop,
                                   .context = s};
    o.prev_rank = job->stage > 0 ? pt_layout_rank(&job->layout, job->stage - 1, job->replica) : -1;
    o.next_rank = job->stage < S - 1 ? pt_layout_rank(&job->layout, job->stage + 1, job->replica) : -1;
    PT_TRY(pt_session_stage_blocks(s, &o.first_layer, &o.last_layer));
    o.trace = s->trace;
    PT_TRY(pt_stage_executor_create(&s->executor, &o));
    pt_info("%s; replicas coupled by dp.method=%s", pt_stage_executor_describe(s->executor),
            pt_coupling_method_name(s->coupling));
    return PIPERT_OK;
}

static void init_latest(pipert_session *s)
{
    const pt_job *job = &s->job;
    s->latest = (pipert_metrics){.size = sizeof(pipert_metrics),
                                 .rank = job->rank,
                                 .world = job->world,
                                 .stage = job->stage,
                                 .stages = job->layout.stages,
                                 .replica = job->replica,
                                 .replicas = job->layout.replicas,
                                 .step = pt_stage_executor_version(s->executor),
                                 .total_steps = s->config.train.steps,
                                 .loss = NAN,
                                 .val_loss = NAN,
                                 .dp_method = pt_coupling_method_name(s->coupling)};
}

/* What every worker of the job must match (runtime/job_digest.h), before joining it: the
 * coordinator and the peers refuse a worker whose build or settings differ. A split that
 * cannot be made leaves the digest out: building the stage reports it, once in the job (so
 * the job hears why). */
static void job_identity(const pipert_session *s, pt_job_identity *identity)
{
    pt_stage_plan plan;
    *identity = (pt_job_identity){.protocol = PT_PROTOCOL_VERSION};
    if (pt_session_stage_plan(s, s->options.stages, &plan) != PIPERT_OK) return;
    pt_config_job_digest(&s->config, s->options.stages, plan.bounds, identity);
    pt_debug("job digest %016llx (protocol version %u)", (unsigned long long)pt_job_digest(identity),
             identity->protocol);
}

static pipert_result session_setup(pipert_session *s)
{
    PT_TRY(pt_config_validate(&s->config));
    s->job.should_stop = should_stop;
    s->job.context = s;
    s->job.authenticate_messages = s->config.runtime.authenticate_messages;
    s->job.joining = s->options.join;
    if (s->options.join && s->options.join_world > 0) {
        s->job.replacement_rank = s->options.join_rank;
        s->job.replacement_world = s->options.join_world;
    }
    job_identity(s, &s->job.identity);
    PT_TRY(pt_job_join(&s->job, s->options.stages, s->options.site, s->options.oob,
                       (const char *const *)environ, s->options.alone));
    s->log_sink.rank = s->job.world > 1 ? s->job.rank : -1;
    /* metrics.jsonl, validation and checkpoints: the rank that has the loss */
    s->writes_outputs = s->job.replica == 0 && s->job.stage == s->job.layout.stages - 1;
    PT_TRY(pt_topology_compute_threads(s->config.runtime.threads, &s->threads));
    int first, last;
    PT_TRY(pt_session_stage_blocks(s, &first, &last));
    PT_TRY(pt_session_choose_kernels(s, first, last));
    if (s->kernels->set_threads) s->kernels->set_threads(s->threads);
    pt_session_share_device_memory(s);
    PT_TRY(build_trace(s));
    PT_TRY(build_coupling(s));
    PT_TRY(build_executor(s));
    long resumed = -1;
    if (s->job.joining) PT_TRY(pt_session_rejoin(s, &resumed));
    else if (s->options.resume) PT_TRY(pt_session_resume(s, &resumed));
    PT_TRY(pt_session_open_outputs(s, resumed));
    init_latest(s);
    s->window_started = s->run_started = pt_now_s();
    return PIPERT_OK;
}

static pipert_result copy_options(pipert_session *s, const pipert_session_options *options)
{
    if (options->size < offsetof(pipert_session_options, log_level) + sizeof options->log_level)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_options.size is %zu: initialise "
                                               "the options with PIPERT_SESSION_OPTIONS_INIT",
                       options->size);
    /* A caller built against an older header passes a shorter struct: the
     * fields it does not know keep their defaults. */
    const pipert_session_options defaults = PIPERT_SESSION_OPTIONS_INIT;
    s->options = defaults;
    memcpy(&s->options, options, options->size < sizeof s->options ? options->size : sizeof s->options);
    s->options.size = sizeof s->options;
    if (!options->out_dir || !options->out_dir[0])
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_options.out_dir is required");
    if (strlen(options->out_dir) >= sizeof s->out_dir)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "out_dir is longer than %zu characters",
                       sizeof s->out_dir - 1);
    if (options->stages < 1)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_options.stages is %d (at least 1)",
                       options->stages);
    strcpy(s->out_dir, options->out_dir);
    s->options.out_dir = s->out_dir;
    s->log_sink = (pt_log_sink){.write = options->log ? forward_log_line : NULL,
                                .user = s,
                                .level = (pt_log_level)options->log_level,
                                .rank = -1};
    return PIPERT_OK;
}

pipert_result pipert_session_create(const pipert_config *cfg, const pipert_session_options *options,
                                    pipert_session **out)
{
    if (out) *out = NULL;
    if (!cfg || !options || !out)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_create: config, options and out "
                                               "are required");
    pipert_session *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "session: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    s->config = *cfg;
    pipert_result rc = copy_options(s, options);
    if (rc == PIPERT_OK) {
        session_call call = enter(s);
        rc = session_setup(s);
        if (rc != PIPERT_OK) pt_job_report_failure(&s->job, pipert_last_error());
        leave(&call);
    }
    if (rc != PIPERT_OK) {
        char message[1024];
        snprintf(message, sizeof message, "%s", pipert_last_error());
        pipert_session_destroy(s);
        return pt_fail(rc, "%s", message);
    }
    *out = s;
    return PIPERT_OK;
}

void pipert_session_destroy(pipert_session *s)
{
    if (!s) return;
    session_call call = enter(s);
    pt_session_close_outputs(s);
    (void)pt_session_coordinator_vote_abandon(s); /* its buffer is freed with the kept ones */
    pt_job_leave(&s->job); /* first: nothing in flight writes into the executor's buffers after */
    pt_session_free_kept(s);
    pt_stage_executor_free(s->executor);
    pt_coupling_free(s->coupling);
    pt_trace_free(s->trace);
    leave(&call);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- stepping -------------------------------------------------------------- */

static bool every(long step, long period) { return period > 0 && step % period == 0; }

static bool flushes(const pipert_session *s)
{
    return s->job.layout.stages == 1 || s->config.pipeline.schedule != PT_SCHEDULE_ASYNC_1F1B;
}

static void publish(pipert_session *s, const pipert_metrics *m)
{
    pthread_mutex_lock(&s->lock);
    s->latest = *m;
    pthread_mutex_unlock(&s->lock);
}

/* A validation loss of the weights of `step`: logged, told to the job, written. */
static pipert_result record_validation(pipert_session *s, long step, float val_loss,
                                       pipert_metrics *m)
{
    if (!s->writes_outputs) return PIPERT_OK;
    m->val_loss = val_loss;
    pt_info("step %ld | val_loss %.4f", step, (double)val_loss);
    pt_rank_progress p = {step, s->config.train.steps, m->loss, 0, val_loss, NAN, NAN, NAN, 0};
    PT_TRY(pt_job_report_progress(&s->job, &p));
    return pt_session_write_validation(s, step, val_loss);
}

/* Validation through the drained pipeline. */
static pipert_result validate(pipert_session *s, long step, pipert_metrics *m)
{
    float val_loss;
    PT_TRY(pt_stage_executor_validate(s->executor, &val_loss));
    return record_validation(s, step, val_loss, m);
}

/* The asynchronous schedule's validations that finished in this step (they ran through the
 * running pipeline: pipeline/validation.c). */
static pipert_result record_finished_validations(pipert_session *s, pipert_metrics *m)
{
    long step;
    float val_loss;
    while (pt_stage_executor_take_validation(s->executor, &step, &val_loss))
        PT_TRY(record_validation(s, step, val_loss, m));
    return PIPERT_OK;
}

static bool is_last_stage(const pipert_session *s)
{
    return s->job.stage == s->job.layout.stages - 1;
}

static void fill_metrics(pipert_session *s, const pt_pipeline_step *p, double tokens_per_s,
                         pipert_metrics *m)
{
    m->step = p->step;
    m->loss = is_last_stage(s) ? p->loss : NAN;
    m->lr = p->lr;
    m->grad_norm = p->grad_norm;
    m->staleness = p->staleness;
    m->tokens_per_s = tokens_per_s;
    m->ms_per_step = 1e3 * p->seconds;
    m->dp_bytes = p->dp.bytes_sent;
    m->dp_wait_ms = p->dp.wait_ms;
    m->dp_delay = p->dp.delay;
}

/* Metrics files and the coordinator's progress, after a step. */
static pipert_result report_step(pipert_session *s, const pt_pipeline_step *p, pipert_metrics *m)
{
    const pt_train_settings *ts = &s->config.train;
    const bool log_now = every(p->step, ts->log_every) || p->step == p->total_steps;
    s->window_steps++;
    const double now = pt_now_s();
    const double tokens_per_s = p->tokens * (double)s->window_steps / (now - s->window_started);
    s->tokens_per_step = p->tokens * s->job.layout.replicas;
    s->elastic.tokens_lost += p->tokens * (double)s->elastic.absent;
    fill_metrics(s, p, tokens_per_s, m);
    if (log_now || now - s->reported_at >= PROGRESS_PERIOD_S) {
        /* loss and tokens/s come from the last stage; the others report progress only */
        pt_rank_progress progress = {p->step, p->total_steps, m->loss,
                                     is_last_stage(s) ? tokens_per_s : 0, NAN,
                                     p->util.compute, p->util.wait_pipeline, p->util.wait_coupling,
                                     p->util.bytes_wan};
        PT_TRY(pt_job_report_progress(&s->job, &progress));
        s->reported_at = now;
    }
    if (!log_now) return PIPERT_OK;
    PT_TRY(pt_session_write_step(s, p, tokens_per_s));
    pt_job_log_progress(&s->job);
    s->window_started = pt_now_s();
    s->window_steps = 0;
    return PIPERT_OK;
}

/* Replicas that must agree can be compared from their logs, and a GPU run
 * with a CPU run of the same job. */
static pipert_result log_parameter_checksum(pipert_session *s, long step)
{
    unsigned long long checksum;
    PT_TRY(pt_session_params_checksum(s, &checksum));
    pt_info("finished step %ld: parameters of stage %d, replica %d: checksum %016llx", step,
            s->job.stage, s->job.replica, checksum);
    return PIPERT_OK;
}

/* After the last step: validation through the pipeline, the last checkpoint,
 * the trace, and the job told. */
static pipert_result finish_run(pipert_session *s, pipert_metrics *m)
{
    const long step = pt_stage_executor_version(s->executor);
    /* replicas that must agree can be compared from their logs */
    PT_TRY(log_parameter_checksum(s, step));
    pt_session_report_device_memory(s);
    PT_TRY(validate(s, step, m));
    PT_TRY(pt_session_save_checkpoint(s, step));
    if (s->trace) PT_TRY(pt_trace_write_rank_file(s->trace, s->out_dir));
    PT_TRY(pt_job_finish(&s->job));
    s->finished = true;
    m->done = 1;
    return PIPERT_OK;
}

/* Every rank agreed to stop after `step`, the coordinator lost: a checkpoint of
 * it (unless one was just written), then the error that says so. */
static pipert_result stop_without_coordinator(pipert_session *s, long step)
{
    if (!every(step, s->config.train.checkpoint_every)) PT_TRY(pt_session_save_checkpoint(s, step));
    if (s->trace) PT_TRY(pt_trace_write_rank_file(s->trace, s->out_dir));
    /* No coordinator says when all are done: a stage whose last gradient its neighbour still
     * copies from its memory must not leave first (a sanitized CI run: "rank 3 left before its
     * 16384-byte device payload was copied"). Its checkpoint is written: a failure here is
     * only told. */
    if (pt_job_leave_together(&s->job) != PIPERT_OK)
        pt_warn("stopping after step %ld: the others did not all reach the end with this rank (%s)",
                step, pipert_last_error());
    s->stopped_at = step;
    return pt_fail(PIPERT_ERR_COORDINATOR_LOST,
                   "coordinator lost: checkpoint of step %ld written; resume with --resume", step);
}

static pipert_result step_once(pipert_session *s, pipert_metrics *m)
{
    if (s->finished)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "the session has finished all %ld steps",
                       s->config.train.steps);
    if (s->stopped_at > 0)
        return pt_fail(PIPERT_ERR_COORDINATOR_LOST, "coordinator lost: the session stopped after "
                                                    "step %ld; resume with --resume",
                       s->stopped_at);
    if (atomic_load(&s->stop_requested))
        return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped before step %ld",
                       pt_stage_executor_version(s->executor) + 1);
    PT_TRY(pt_job_check(&s->job));
    PT_TRY(pt_session_follow_membership(s));
    pt_pipeline_step p;
    PT_TRY(pt_stage_executor_step(s->executor, &p));
    PT_TRY(report_step(s, &p, m));
    PT_TRY(record_finished_validations(s, m));
    const pt_train_settings *ts = &s->config.train;
    if (pt_stage_executor_finished(s->executor)) return finish_run(s, m);
    /* Flush schedules end every step drained, every stage at the same step:
     * validation and checkpoints can run through the pipeline there. */
    if (flushes(s) && every(p.step, ts->val_every)) PT_TRY(validate(s, p.step, m));
    if (flushes(s) && every(p.step, ts->checkpoint_every)) PT_TRY(pt_session_save_checkpoint(s, p.step));
    /* The asynchronous schedule: each stage after its own N-th step (checkpoint.c). */
    if (!flushes(s) && every(p.step, ts->checkpoint_every)) PT_TRY(pt_session_save_checkpoint(s, p.step));
    bool stop;
    PT_TRY(pt_session_coordinator_vote(s, p.step, &stop));
    return stop ? stop_without_coordinator(s, p.step) : PIPERT_OK;
}

/* A failure of the job (not of this call's arguments) is remembered for
 * pipert_session_async_error and told to the other ranks. */
static pipert_result note_failure(pipert_session *s, pipert_result rc)
{
    /* not a failure: every rank stopped at the same step, with a checkpoint */
    if (rc == PIPERT_OK || rc == PIPERT_ERR_INVALID_ARG || rc == PIPERT_ERR_COORDINATOR_LOST)
        return rc;
    if (rc == PIPERT_ERR_INTERRUPTED && atomic_exchange(&s->abort_requested, 0)) {
        rc = pt_fail(PIPERT_ERR_INTERRUPTED, "aborted by the host program: %s", s->abort_reason);
        pt_job_report_failure(&s->job, pipert_last_error());
        return rc;
    }
    if (rc == PIPERT_ERR_PEER || rc == PIPERT_ERR_TRANSPORT || pt_job_aborted(&s->job))
        atomic_store(&s->failed, 1);
    if (rc != PIPERT_ERR_INTERRUPTED || !atomic_load(&s->stop_requested))
        pt_job_report_failure(&s->job, pipert_last_error());
    return rc;
}

pipert_result pipert_session_step(pipert_session *s, pipert_metrics *metrics)
{
    if (!s) return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_step: no session");
    session_call call = enter(s);
    pipert_metrics m;
    pthread_mutex_lock(&s->lock);
    m = s->latest;
    pthread_mutex_unlock(&s->lock);
    m.val_loss = NAN;
    pipert_result rc = note_failure(s, step_once(s, &m));
    if (rc == PIPERT_OK) {
        if (isnan(m.val_loss)) m.val_loss = s->latest.val_loss; /* the newest one stays */
        publish(s, &m);
        if (metrics) rc = pipert_session_metrics(s, metrics);
    }
    leave(&call);
    return rc;
}

pipert_result pipert_session_run(pipert_session *s)
{
    if (!s) return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_run: no session");
    while (!s->finished) PT_TRY(pipert_session_step(s, NULL));
    return PIPERT_OK;
}

pipert_result pipert_session_metrics(const pipert_session *s, pipert_metrics *metrics)
{
    if (!s || !metrics || metrics->size < sizeof(size_t))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_metrics: a session and a metrics "
                                               "struct with its size set are required");
    const size_t size = metrics->size < sizeof *metrics ? metrics->size : sizeof *metrics;
    pthread_mutex_lock((pthread_mutex_t *)&s->lock);
    memcpy(metrics, &s->latest, size);
    pthread_mutex_unlock((pthread_mutex_t *)&s->lock);
    metrics->size = size;
    return PIPERT_OK;
}

pipert_result pipert_session_checkpoint(pipert_session *s)
{
    if (!s) return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_checkpoint: no session");
    session_call call = enter(s);
    pipert_result rc = pt_session_save_checkpoint(s, pt_stage_executor_version(s->executor));
    leave(&call);
    return rc;
}

void pipert_session_stop(pipert_session *s)
{
    if (s) atomic_store(&s->stop_requested, 1);
}

void pipert_session_abort(pipert_session *s, const char *reason)
{
    if (!s) return;
    if (!atomic_load(&s->abort_requested)) {
        snprintf(s->abort_reason, sizeof s->abort_reason, "%s", reason ? reason : "no reason given");
        atomic_store(&s->abort_requested, 1);
    }
    atomic_store(&s->stop_requested, 1);
}

pipert_result pipert_session_async_error(pipert_session *s)
{
    if (!s) return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_session_async_error: no session");
    if (pt_job_aborted(&s->job)) return pt_job_check(&s->job);
    if (atomic_load(&s->failed)) return pt_fail(PIPERT_ERR_PEER, "the job failed (see the log)");
    return PIPERT_OK;
}
