/* pipert worker: one process of a multi-worker job, started by `pipert
 * launch`, srun or mpirun (docs/RUNNING.md).
 *
 * It learns its rank from the environment (runtime/comm/bootstrap.h), registers
 * with the job's coordinator (runtime/comm/coordinator.h; under SLURM and MPI rank
 * 0 runs it, on a thread of its own), waits for every rank, then trains with
 * train/trainer.h, reporting progress to the coordinator and checking for a
 * job-wide abort before every step. The coordinator client heartbeats from its
 * own thread. Rank 0 writes DIR/metrics.jsonl and the checkpoints.
 *
 * Exit status: 0 done; 1 this rank failed (it told the coordinator why);
 * 2 usage error; 3 stopped because the job aborted (another rank failed, or
 * the coordinator is gone).
 */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm/bootstrap.h"
#include "runtime/clock.h"
#include "runtime/comm/collectives.h"
#include "runtime/config.h"
#include "runtime/comm/coordinator.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/metrics.h"
#include "pipeline/executor.h"
#include "pipeline/plan.h"
#include "runtime/topology.h"
#include "runtime/trace.h"
#include "runtime/comm/transport.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

#define EXIT_RANK_FAILED 1
#define EXIT_JOB_ABORTED 3
/* How long a worker waits for every rank to register. */
#define TABLE_TIMEOUT_S (PT_REGISTER_TIMEOUT_S + 30.0)
/* Progress goes to the coordinator at every logged step, and at least this often. */
#define PROGRESS_PERIOD_S 0.5
/* How long connecting the data plane to every peer may take. */
#define CONNECT_TIMEOUT_S 60.0

extern char **environ;

static volatile sig_atomic_t stop_signal;

static void request_stop(int signal_number) { stop_signal = signal_number; }

/* Set while the main thread waits in a collective (see leave_on_abort). */
static volatile sig_atomic_t in_collective;

typedef struct worker {
    pt_bootstrap boot;
    int stages, replicas, stage, replica;
    const char *out_dir;
    bool quiet;
    bool writes_outputs;          /* rank 0: metrics.jsonl, validation, checkpoints */
    pt_coordinator *coordinator;  /* rank 0 under SLURM/MPI, else NULL */
    pt_coord_client *client;
    const pt_peer_table *peers;
    pt_transport *transport;      /* UCX data plane */
    pt_group *replica_group;      /* the replicas of this stage (R > 1) */
    pt_group *stage_group;        /* the stages of this replica (S > 1) */
    pt_stage_executor *executor;  /* S > 1: the pipeline stage */
    pt_trace *trace;
    const pipert_config *config;
    pt_metrics stage_metrics;     /* S > 1, replica 0: this stage's staleness and bubble */
    double window_started;        /* tokens/s over the logging window */
    long window_steps;
    pt_trainer *trainer;
    pt_metrics metrics;
    pt_progress progress;
    float last_loss;
} worker;

/* ---- data parallelism: dense synchronous averaging (ALGORITHMS.md §4.1) ---
 *
 * After each step's backward, every replica of a stage holds the mean of the
 * replicas' gradients, grads ← (1/R) Σ_r grads_r, by a ring all-reduce over
 * UCX among the ranks stage + r·stages (r ∈ [0, R)). It runs before clipping,
 * so every replica clips the same global norm and takes the same update: R
 * replicas with batch B each train like one worker with batch R·B. The step's
 * loss is averaged too, for reporting. */
static pipert_result average_gradients(pt_trainer *t, float *loss, void *context)
{
    worker *w = context;
    in_collective = 1;
    pipert_result rc = pt_allreduce(w->replica_group, t->model->grads, t->model->n_params,
                                    PT_REDUCE_MEAN);
    if (rc == PIPERT_OK) rc = pt_allreduce(w->replica_group, loss, 1, PT_REDUCE_MEAN);
    in_collective = 0;
    if (rc != PIPERT_OK) pt_error_prefix("averaging the gradients of step %ld", t->step + 1);
    return rc;
}

/* A job-wide abort while this rank waits inside a collective for a peer that
 * is alive but will never answer (it stopped on its own error): nothing will
 * complete the transfer, so the worker leaves at once. Called from the
 * coordinator client's thread. */
static void leave_on_abort(void *context, int rank, const char *reason)
{
    (void)context;
    if (!in_collective) return; /* the step loop sees the abort itself */
    fprintf(stderr, "pipert worker: job aborted (rank %d: %s) during gradient averaging\n", rank,
            reason);
    _exit(EXIT_JOB_ABORTED);
}

/* TEST HOOK (tests/test_launch.c; not for production): with
 * PIPERT_TEST_DIE_AT_STEP=N in the environment, rank PIPERT_TEST_DIE_RANK
 * (default 1) kills itself with SIGKILL at the start of step N, before that
 * step's computation and its gradient averaging: a crash the job must notice. */
static void test_hook_die_at_step(const worker *w, long step)
{
    const char *at = getenv("PIPERT_TEST_DIE_AT_STEP");
    const char *rank = getenv("PIPERT_TEST_DIE_RANK");
    if (!at || atol(at) != step || (rank ? atoi(rank) : 1) != w->boot.rank) return;
    pt_warn("test hook PIPERT_TEST_DIE_AT_STEP: rank %d raises SIGKILL at step %ld", w->boot.rank,
            step);
    fflush(NULL);
    raise(SIGKILL);
}

/* ---- setup ------------------------------------------------------------------ */

static pipert_result bind_cores(const worker *w)
{
    if (w->boot.cores_count == 0) return PIPERT_OK;
    pt_topology *topology;
    PT_TRY(pt_topology_load(&topology));
    pipert_result rc = pt_topology_bind_process_to_cores(topology, w->boot.cores_first,
                                                         w->boot.cores_count);
    pt_topology_free(topology);
    if (rc != PIPERT_OK) pt_error_prefix("PIPERT_CORES=%d,%d", w->boot.cores_first, w->boot.cores_count);
    return rc;
}

static pipert_result start_coordinator(worker *w, const char *secret)
{
    pt_coordinator_options options = PT_COORDINATOR_OPTIONS_INIT;
    options.port = w->boot.coord_port;
    options.world = w->boot.world_size;
    options.secret = secret;
    PT_TRY(pt_coordinator_create(&w->coordinator, &options));
    pt_info("coordinator listening on port %d (workers reach it at %s:%d)", w->boot.coord_port,
            w->boot.coord_host, w->boot.coord_port);
    return pt_coordinator_start(w->coordinator);
}

/* Waits for every rank's registration in short slices, so a stop signal is
 * not ignored for minutes. */
static pipert_result wait_for_peers(worker *w)
{
    const double deadline = pt_now_s() + TABLE_TIMEOUT_S;
    for (;;) {
        pipert_result rc = pt_coord_client_wait_table(w->client, 0.5, &w->peers);
        if (rc != PIPERT_ERR_TIMEOUT) return rc;
        if (stop_signal)
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped by signal %d while waiting for the "
                                                   "other ranks",
                           (int)stop_signal);
        if (pt_now_s() > deadline) return pt_coord_client_wait_table(w->client, 0, &w->peers);
    }
}

/* rank of (stage, replica): rank = replica·S + stage (runtime/comm/bootstrap.h) */
static int rank_of(const worker *w, int stage, int replica) { return replica * w->stages + stage; }

/* Connects the data plane to every rank this one exchanges tensors with: the
 * other stages of its replica (pipeline) and the other replicas of its stage
 * (data parallelism). Each pair connects once: the higher rank dials. */
static pipert_result connect_peers(worker *w)
{
    const int me = w->boot.rank;
    pipert_result rc = PIPERT_OK;
    for (int pass = 0; pass < 2 && rc == PIPERT_OK; pass++) /* dial lower ranks, then wait for higher */
        for (int i = 0; i < w->stages + w->replicas && rc == PIPERT_OK; i++) {
            int peer = i < w->stages ? rank_of(w, i, w->replica) : rank_of(w, w->stage, i - w->stages);
            if (peer == me || (i >= w->stages && i - w->stages == w->replica)) continue;
            if (pass == 0 && peer < me)
                rc = pt_transport_connect(w->transport, peer, w->peers->peers[peer].address);
            else if (pass == 1 && peer > me)
                rc = pt_transport_wait_peer(w->transport, peer, CONNECT_TIMEOUT_S);
        }
    return rc;
}

/* A group of `n` ranks: stage·… along one axis of the (stage, replica) grid. */
static pipert_result make_group(worker *w, bool along_stages, uint32_t id, pt_group **out)
{
    const int n = along_stages ? w->stages : w->replicas;
    if (n == 1) return PIPERT_OK;
    int *ranks = calloc((size_t)n, sizeof *ranks);
    if (!ranks) return pt_fail(PIPERT_ERR_NOMEM, "group: out of memory");
    for (int i = 0; i < n; i++)
        ranks[i] = along_stages ? rank_of(w, i, w->replica) : rank_of(w, w->stage, i);
    pt_group_options options = PT_GROUP_OPTIONS_INIT;
    options.id = id;
    pipert_result rc = pt_group_create(w->transport, ranks, n, &options, out);
    free(ranks);
    return rc;
}

static pipert_result connect_groups(worker *w)
{
    PT_TRY(connect_peers(w));
    /* group ids: replica groups 0..S−1 (one per stage), stage groups S.. */
    PT_TRY(make_group(w, false, (uint32_t)w->stage, &w->replica_group));
    return make_group(w, true, (uint32_t)(w->stages + w->replica), &w->stage_group);
}

static pipert_result join_job(worker *w)
{
    char secret[PT_SECRET_MAX + 1];
    PT_TRY(pt_bootstrap_read_secret(&w->boot, secret));
    if (w->boot.hosts_coordinator) PT_TRY(start_coordinator(w, secret));
    pt_transport_options transport = PT_TRANSPORT_OPTIONS_INIT;
    transport.rank = w->boot.rank;
    transport.secret = secret;
    transport.job = (uint32_t)w->boot.coord_port;
    PT_TRY(pt_transport_create(&transport, &w->transport));
    pt_coord_client_options options = PT_COORD_CLIENT_OPTIONS_INIT;
    options.host = w->boot.coord_host;
    options.port = w->boot.coord_port;
    options.secret = secret;
    options.rank = w->boot.rank;
    options.world = w->boot.world_size;
    options.address = pt_transport_listen_address(w->transport);
    options.on_abort = leave_on_abort;
    PT_TRY(pt_coord_client_connect(&w->client, &options));
    PT_TRY(wait_for_peers(w));
    for (int r = 0; r < w->peers->world; r++)
        pt_debug("peer rank %d: host %s, pid %d, data plane %s", r, w->peers->peers[r].host,
                 w->peers->peers[r].pid, w->peers->peers[r].address);
    return connect_groups(w);
}

static pipert_result build_trainer(worker *w, const pipert_config *cfg)
{
    PT_TRY(pt_trainer_create(&w->trainer, cfg));
    w->trainer->replica = w->replica; /* this replica's own batches */
    if (w->replicas > 1) {
        w->trainer->gradient_hook = average_gradients;
        w->trainer->gradient_hook_context = w;
    }
    if (!w->writes_outputs) return PIPERT_OK;
    PT_TRY(pt_make_dirs(w->out_dir));
    char path[PT_CONFIG_STRING_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", w->out_dir);
    return pt_metrics_open(&w->metrics, path, -1);
}

/* ---- the step loop ----------------------------------------------------------- */

static bool every(long step, long period) { return period > 0 && step % period == 0; }

static pipert_result write_metrics(worker *w, const pt_step_stats *s, double tokens_per_s)
{
    json_t *line = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "step", (json_int_t)w->trainer->step,
                             "loss", (double)s->loss, "lr", s->lr, "grad_norm", s->grad_norm,
                             "tokens_per_s", tokens_per_s, "ms_per_step", 1e3 * s->seconds);
    return pt_metrics_write(&w->metrics, line);
}

static pipert_result validate(worker *w, float *val_loss)
{
    *val_loss = pt_trainer_validate(w->trainer);
    pt_progress_print(&w->progress, "step %ld | val_loss %.4f", w->trainer->step, (double)*val_loss);
    return pt_metrics_write(&w->metrics, json_pack("{s:I, s:f}", "step",
                                                   (json_int_t)w->trainer->step, "val_loss",
                                                   (double)*val_loss));
}

/* Rank 0 hosting the coordinator shows the job-wide line in its log. */
static void log_job_progress(worker *w)
{
    if (!w->coordinator) return;
    pt_job_status status;
    pt_coordinator_status(w->coordinator, &status);
    char line[256];
    pt_job_progress_line(&status, line, sizeof line);
    pt_info("job: %s", line);
}

static pipert_result before_step(worker *w, long step)
{
    test_hook_die_at_step(w, step);
    PT_TRY(pt_coord_client_check(w->client));
    if (stop_signal)
        return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped by signal %d before step %ld",
                       (int)stop_signal, step);
    return PIPERT_OK;
}

static pipert_result train(worker *w)
{
    pt_trainer *t = w->trainer;
    const pt_train_settings *ts = &t->config.train;
    const double tokens_per_step = (double)t->model->B * t->model->T * ts->grad_accum;
    pt_step_stats stats = {0};
    double window_started = pt_now_s(), reported_at = 0;
    long window_steps = 0;
    while (t->step < ts->steps) {
        PT_TRY(before_step(w, t->step + 1));
        PT_TRY(pt_trainer_step(t, &stats));
        const bool last = t->step == ts->steps, log_now = every(t->step, ts->log_every) || last;
        const double now = pt_now_s();
        const double tokens_per_s = tokens_per_step * (double)++window_steps / (now - window_started);
        float val_loss = NAN;
        if (w->writes_outputs && (every(t->step, ts->val_every) || last))
            PT_TRY(validate(w, &val_loss));
        if (log_now || !isnan(val_loss) || now - reported_at >= PROGRESS_PERIOD_S) {
            pt_rank_progress p = {t->step, ts->steps, stats.loss, tokens_per_s, val_loss};
            PT_TRY(pt_coord_client_send_progress(w->client, &p));
            reported_at = now;
        }
        if (log_now) {
            char text[192];
            snprintf(text, sizeof text, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | %.0f ms/step",
                     t->step, ts->steps, (double)stats.loss, stats.lr, tokens_per_s,
                     1e3 * stats.seconds);
            pt_progress_update(&w->progress, text, true);
            if (w->writes_outputs) PT_TRY(write_metrics(w, &stats, tokens_per_s));
            log_job_progress(w);
            window_started = pt_now_s();
            window_steps = 0;
        }
        if (w->writes_outputs && (every(t->step, ts->checkpoint_every) || last))
            PT_TRY(pt_checkpoint_save(w->out_dir, t->step, t->model, &t->optimizer, &t->config,
                                      ts->keep_checkpoints));
    }
    pt_progress_finish(&w->progress);
    w->last_loss = stats.loss;
    return PIPERT_OK;
}

/* ---- the pipeline (S > 1) ----------------------------------------------------- */

static bool pipeline_should_stop(void *context)
{
    const worker *w = context;
    return stop_signal || pt_coord_client_aborted(w->client);
}

static pipert_result stage_plan(const worker *w, const pipert_config *cfg, int *first, int *last)
{
    const pt_model_settings *m = &cfg->model;
    pt_gpt_config model = {m->n_layer, m->n_embd, m->n_head, m->block_size, m->vocab_size,
                           m->tie_weights};
    pt_stage_plan plan;
    if (cfg->plan.layers[0]) PT_TRY(pt_plan_parse(cfg->plan.layers, m->n_layer, w->stages, &plan));
    else PT_TRY(pt_plan_balanced(&model, m->block_size, w->stages, &plan));
    *first = plan.bounds[w->stage];
    *last = plan.bounds[w->stage + 1];
    return PIPERT_OK;
}

static bool is_last_stage(const worker *w) { return w->stage == w->stages - 1; }

/* Replica 0's stages write DIR/metrics-stage-N.jsonl: staleness, bubble. */
static pipert_result write_stage_metrics(worker *w, const pt_pipeline_step *p)
{
    json_t *line = json_pack("{s:I, s:i, s:f, s:f, s:f, s:f}", "step", (json_int_t)p->step, "stage",
                             w->stage, "staleness", p->staleness, "bubble",
                             pt_trace_bubble_fraction(w->trace), "grad_norm", p->grad_norm,
                             "ms_per_step", 1e3 * p->seconds);
    return pt_metrics_write(&w->stage_metrics, line);
}

static pipert_result write_step_metrics(worker *w, const pt_pipeline_step *p, double tokens_per_s)
{
    json_t *line = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "step", (json_int_t)p->step,
                             "loss", (double)p->loss, "lr", p->lr, "grad_norm", p->grad_norm,
                             "tokens_per_s", tokens_per_s, "ms_per_step", 1e3 * p->seconds,
                             "staleness", p->staleness);
    return pt_metrics_write(&w->metrics, line);
}

static pipert_result validate_pipeline(worker *w, long step)
{
    float val_loss;
    PT_TRY(pt_stage_executor_validate(w->executor, &val_loss));
    if (!w->writes_outputs) return PIPERT_OK;
    pt_progress_print(&w->progress, "step %ld | val_loss %.4f", step, (double)val_loss);
    pt_rank_progress p = {step, w->config->train.steps, w->last_loss, 0, val_loss};
    PT_TRY(pt_coord_client_send_progress(w->client, &p));
    PT_TRY(pt_metrics_write(&w->metrics, json_pack("{s:I, s:f}", "step", (json_int_t)step,
                                                   "val_loss", (double)val_loss)));
    return PIPERT_OK;
}

/* After every optimizer step of this stage. */
static pipert_result on_pipeline_step(pt_stage_executor *ex, const pt_pipeline_step *p, void *context)
{
    worker *w = context;
    (void)ex;
    test_hook_die_at_step(w, p->step);
    PT_TRY(pt_coord_client_check(w->client));
    const pt_train_settings *ts = &w->config->train;
    const bool last = p->step == p->total_steps, log_now = every(p->step, ts->log_every) || last;
    w->window_steps++;
    const double tokens_per_s = p->tokens * w->window_steps / (pt_now_s() - w->window_started);
    if (is_last_stage(w)) w->last_loss = p->loss;
    /* loss and tokens/s come from the last stage; the others report progress only */
    pt_rank_progress progress = {p->step, p->total_steps, is_last_stage(w) ? p->loss : NAN,
                                 is_last_stage(w) ? tokens_per_s : 0, NAN};
    if (log_now) {
        PT_TRY(pt_coord_client_send_progress(w->client, &progress));
        if (w->replica == 0) PT_TRY(write_stage_metrics(w, p));
        if (w->writes_outputs) {
            PT_TRY(write_step_metrics(w, p, tokens_per_s));
            char text[192];
            snprintf(text, sizeof text, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | staleness %.2f",
                     p->step, p->total_steps, (double)p->loss, p->lr, tokens_per_s, p->staleness);
            pt_progress_update(&w->progress, text, true);
        }
        log_job_progress(w);
        w->window_started = pt_now_s();
        w->window_steps = 0;
    }
    /* Flush schedules end every step drained, every stage at the same step:
     * validation can run through the pipeline there. */
    if (strcmp(w->config->pipeline.schedule, "async-1f1b") && every(p->step, ts->val_every) && !last)
        PT_TRY(validate_pipeline(w, p->step));
    return PIPERT_OK;
}

static pipert_result open_pipeline_outputs(worker *w)
{
    char path[PT_CONFIG_STRING_MAX + 48];
    PT_TRY(pt_make_dirs(w->out_dir));
    if (w->replica == 0) {
        snprintf(path, sizeof path, "%s/metrics-stage-%d.jsonl", w->out_dir, w->stage);
        PT_TRY(pt_metrics_open(&w->stage_metrics, path, -1));
    }
    if (!w->writes_outputs) return PIPERT_OK;
    snprintf(path, sizeof path, "%s/metrics.jsonl", w->out_dir);
    return pt_metrics_open(&w->metrics, path, -1);
}

static pipert_result compute_threads(const pipert_config *cfg, int *threads)
{
    if (cfg->runtime.threads > 0) {
        *threads = cfg->runtime.threads;
        return PIPERT_OK;
    }
    pt_topology *topology;
    PT_TRY(pt_topology_load(&topology)); /* after binding: this worker's cores */
    *threads = pt_topology_cores(topology);
    pt_topology_free(topology);
    return PIPERT_OK;
}

static pipert_result run_pipeline(worker *w, const pipert_config *cfg)
{
    pt_stage_executor_options o = {.config = cfg, .stage = w->stage, .stages = w->stages,
                                   .replica = w->replica, .replicas = w->replicas,
                                   .transport = w->transport, .stage_group = w->stage_group,
                                   .replica_group = w->replica_group,
                                   .should_stop = pipeline_should_stop,
                                   .on_step = on_pipeline_step, .context = w};
    o.prev_rank = w->stage > 0 ? rank_of(w, w->stage - 1, w->replica) : -1;
    o.next_rank = is_last_stage(w) ? -1 : rank_of(w, w->stage + 1, w->replica);
    PT_TRY(stage_plan(w, cfg, &o.first_layer, &o.last_layer));
    PT_TRY(compute_threads(cfg, &o.threads));
    if (cfg->pipeline.trace)
        PT_TRY(pt_trace_create(&w->trace, w->boot.rank, w->stage, w->replica, 1 << 17));
    o.trace = w->trace;
    PT_TRY(open_pipeline_outputs(w));
    PT_TRY(pt_stage_executor_create(&w->executor, &o));
    pt_info("%s", pt_stage_executor_describe(w->executor));
    w->window_started = pt_now_s();
    PT_TRY(pt_stage_executor_run(w->executor));
    PT_TRY(validate_pipeline(w, cfg->train.steps));
    pt_progress_finish(&w->progress);
    if (w->trace) PT_TRY(pt_trace_write_rank_file(w->trace, w->out_dir));
    return PIPERT_OK;
}

/* After this rank's last step: say done; the rank hosting the coordinator
 * keeps it serving until every rank is done or the job aborted. */
static pipert_result finish(worker *w)
{
    PT_TRY(pt_coord_client_send_done(w->client));
    if (!w->coordinator) return PIPERT_OK;
    pt_job_status status;
    do {
        pt_coordinator_wait(w->coordinator, 0.5);
        pt_coordinator_status(w->coordinator, &status);
    } while (status.phase != PT_JOB_FINISHED && status.phase != PT_JOB_ABORTED && !stop_signal);
    log_job_progress(w);
    if (status.phase == PT_JOB_FINISHED) return PIPERT_OK;
    if (status.phase != PT_JOB_ABORTED)
        return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped by signal %d while the other ranks ran "
                                               "(this process hosts the coordinator)",
                       (int)stop_signal);
    return status.abort_rank >= 0 ? pt_fail(PIPERT_ERR_PEER, "job aborted: rank %d: %s",
                                            status.abort_rank, status.abort_reason)
                                  : pt_fail(PIPERT_ERR_PEER, "job aborted: %s", status.abort_reason);
}

static pipert_result run_worker(worker *w, const pipert_config *cfg)
{
    PT_TRY(pt_bootstrap_from_env(&w->boot, (const char *const *)environ));
    pt_log_set_rank(w->boot.rank);
    PT_TRY(pt_rank_layout(w->boot.rank, w->boot.world_size, w->stages, &w->stage, &w->replica));
    w->replicas = w->boot.world_size / w->stages;
    w->config = cfg;
    /* metrics.jsonl, validation and checkpoints: the rank that has the loss
     * (the last stage of replica 0) */
    w->writes_outputs = w->replica == 0 && w->stage == w->stages - 1;
    PT_TRY(bind_cores(w));
    pt_info("rank %d of %d (stage %d, replica %d) under %s; coordinator %s:%d%s", w->boot.rank,
            w->boot.world_size, w->stage, w->replica, pt_launcher_name(w->boot.launcher),
            w->boot.coord_host, w->boot.coord_port, w->boot.hosts_coordinator ? " (here)" : "");
    PT_TRY(join_job(w));
    if (w->stages > 1) {
        PT_TRY(run_pipeline(w, cfg));
    } else {
        PT_TRY(build_trainer(w, cfg));
        PT_TRY(train(w));
    }
    return finish(w);
}

static void free_worker(worker *w)
{
    pt_metrics_close(&w->metrics);
    pt_metrics_close(&w->stage_metrics);
    pt_trainer_free(w->trainer);
    pt_stage_executor_free(w->executor);
    pt_trace_free(w->trace);
    pt_group_destroy(w->replica_group);
    pt_group_destroy(w->stage_group);
    pt_transport_destroy(w->transport);
    pt_coord_client_close(w->client);
    pt_coordinator_free(w->coordinator);
}

/* The exit status for a failure, after telling the coordinator (unless the
 * failure is the job's abort itself). */
static int report_failure(worker *w, pipert_result rc)
{
    char message[1024];
    snprintf(message, sizeof message, "%s", pipert_last_error());
    const bool aborted = w->client && pt_coord_client_aborted(w->client);
    if (w->client && !aborted) pt_coord_client_send_error(w->client, message);
    /* Rank 0 hosting the coordinator gives the others a moment to hear it. */
    if (w->coordinator && !aborted) pt_coordinator_wait(w->coordinator, 1.0);
    if (w->boot.world_size > 0)
        fprintf(stderr, "pipert worker [rank %d]: error: %s\n", w->boot.rank, message);
    else fprintf(stderr, "pipert worker: error: %s\n", message);
    return rc == PIPERT_ERR_PEER && aborted ? EXIT_JOB_ABORTED : EXIT_RANK_FAILED;
}

int pt_cmd_worker(int argc, char **argv)
{
    const char *out_dir = NULL, *stages = "1";
    bool quiet = false;
    const pt_cli_flag flags[] = {
        {"--out", "DIR", "the job's directory: the last stage of replica 0 writes metrics.jsonl "
                         "(and, with one stage, checkpoints) here (required)", &out_dir, NULL},
        {"--stages", "S", "pipeline stages (the replicas are the world size / S)", &stages, NULL},
        {"--quiet", NULL, "no progress lines", NULL, &quiet},
    };
    const pt_cli cli = {"worker", "[--config FILE] [--section.key=value ...] --out DIR",
                        "One worker of a multi-worker job, started by pipert launch, srun or\n"
                        "mpirun: rank, world size and the coordinator come from the environment\n"
                        "(docs/RUNNING.md). Exits 0 when done, 1 when this rank failed, 3 when\n"
                        "the job was aborted because of another rank.",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    worker w = {.out_dir = out_dir, .quiet = quiet};
    if (!out_dir || pt_cli_parse_int("--stages", stages, 1, PT_MAX_WORLD, 1, &w.stages) != PIPERT_OK) {
        pipert_config_free(cfg);
        fprintf(stderr, "pipert worker: %s\n", !out_dir ? "--out DIR is required" : pipert_last_error());
        return 2;
    }
    struct sigaction action = {.sa_handler = request_stop};
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    pt_progress_init(&w.progress, quiet);

    pipert_result rc = run_worker(&w, cfg);
    int status = rc == PIPERT_OK ? 0 : report_failure(&w, rc);
    if (rc == PIPERT_OK && !quiet && w.trainer)
        printf("rank %d done: %ld steps, final loss %.4f\n", w.boot.rank, w.trainer->step,
               (double)w.last_loss);
    else if (rc == PIPERT_OK && !quiet)
        printf("rank %d done: %ld steps\n", w.boot.rank, cfg->train.steps);
    free_worker(&w);
    pipert_config_free(cfg);
    return status;
}
