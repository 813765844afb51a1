#include "train/trainer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/metrics.h"
#include "runtime/topology.h"
#include "train/checkpoint.h"

/* ---- setup --------------------------------------------------------------- */

static pipert_result choose_threads(const pipert_config *cfg, int *threads)
{
    if (cfg->runtime.threads > 0) {
        *threads = cfg->runtime.threads;
        return PIPERT_OK;
    }
    pt_topology *topology;
    PT_TRY(pt_topology_load(&topology));
    *threads = pt_topology_cores(topology);
    pt_topology_free(topology);
    return PIPERT_OK;
}

static pipert_result choose_kernels(const pipert_config *cfg, const pt_kernels **kernels)
{
    if (!strcmp(cfg->runtime.device, "cuda")) return pt_kernels_cuda(kernels);
    *kernels = pt_kernels_cpu();
    return PIPERT_OK;
}

static pipert_result optimizer_settings(const pipert_config *cfg, pt_optimizer_settings *s)
{
    memset(s, 0, sizeof *s);
    PT_TRY(pt_optimizer_parse_kind(cfg->train.optimizer, &s->kind));
    s->beta1 = cfg->train.beta1;
    s->beta2 = cfg->train.beta2;
    s->eps = cfg->train.eps;
    s->weight_decay = cfg->train.weight_decay;
    s->psi = PT_NADAM_PSI;
    return PIPERT_OK;
}

static pipert_result trainer_setup(pt_trainer *t, const pipert_config *cfg)
{
    t->config = *cfg;
    PT_TRY(pt_config_validate(cfg));
    PT_TRY(choose_kernels(cfg, &t->kernels));
    PT_TRY(choose_threads(cfg, &t->threads));
    if (!strcmp(t->kernels->name, "cpu")) pt_kernels_cpu_set_threads(t->threads);

    const int B = cfg->train.batch_size, T = cfg->model.block_size;
    PT_TRY(pt_dataset_load(&t->data, cfg->data.path, cfg->data.format, cfg->data.val_fraction));
    PT_TRY(pt_dataset_check(&t->data, T, cfg->model.vocab_size));

    pt_gpt_config model = pt_gpt_config_from_settings(cfg);
    PT_TRY(pt_gpt_slice_create(&t->model, &model, 0, model.n_layer, B, T, t->kernels));
    PT_TRY(pt_gpt_init(t->model, (uint64_t)cfg->seed));

    pt_optimizer_settings settings;
    PT_TRY(optimizer_settings(cfg, &settings));
    PT_TRY(pt_optimizer_init(&t->optimizer, &settings, t->kernels, t->model->n_params));

    PT_TRY(pt_alloc((void **)&t->inputs, (size_t)B * T * sizeof(int32_t), "input tokens"));
    PT_TRY(pt_alloc((void **)&t->targets, (size_t)B * T * sizeof(int32_t), "target tokens"));
    return PIPERT_OK;
}

pipert_result pt_trainer_create(pt_trainer **out, const pipert_config *cfg)
{
    *out = NULL;
    pt_trainer *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(PIPERT_ERR_NOMEM, "trainer: out of memory");
    pipert_result rc = trainer_setup(t, cfg);
    if (rc != PIPERT_OK) {
        pt_trainer_free(t);
        return rc;
    }
    *out = t;
    return PIPERT_OK;
}

void pt_trainer_free(pt_trainer *t)
{
    if (!t) return;
    pt_free(t->inputs);
    pt_free(t->targets);
    if (t->kernels) pt_optimizer_free(&t->optimizer);
    pt_gpt_slice_free(t->model);
    pt_dataset_free(&t->data);
    free(t);
}

void pt_trainer_use_kernels(pt_trainer *t, const pt_kernels *kernels)
{
    t->kernels = kernels;
    t->model->kernels = kernels;
    t->optimizer.kernels = kernels;
}

/* ---- the step ------------------------------------------------------------ */

/* One tensor region per parameter tensor, with its weight-decay flag. */
static void optimizer_regions(const pt_gpt_slice *model, pt_param_region *regions)
{
    for (int i = 0; i < model->n_tensors; i++)
        regions[i] = (pt_param_region){model->tensors[i].offset, model->tensors[i].numel,
                                       model->tensors[i].decay};
}

static void upload_batch(pt_trainer *t)
{
    const size_t bytes = (size_t)t->model->B * t->model->T * sizeof(int32_t);
    t->kernels->copy_to_device(t->model->tokens, t->inputs, bytes);
    t->kernels->copy_to_device(t->model->targets, t->targets, bytes);
}

pipert_result pt_trainer_step(pt_trainer *t, pt_step_stats *stats)
{
    const pt_train_settings *ts = &t->config.train;
    const int B = t->model->B, T = t->model->T, accum = ts->grad_accum;
    const long step = t->step + 1; /* 1-based, the step being taken */
    double started = pt_now_s(), loss_sum = 0;

    pt_gpt_zero_grads(t->model);
    for (int micro = 0; micro < accum; micro++) {
        /* Batches are a pure function of (seed, replica, microbatch index). */
        pt_dataset_train_batch(&t->data, (uint64_t)t->config.seed, (step - 1) * accum + micro,
                               (long)t->replica * B, B, T, t->inputs, t->targets);
        upload_batch(t);
        float loss = 0;
        pt_gpt_forward(t->model, 1.0f / (float)accum, &loss);
        pt_gpt_backward(t->model, NULL);
        loss_sum += loss;
    }
    stats->loss = (float)(loss_sum / accum);
    if (t->gradient_hook) PT_TRY(t->gradient_hook(t, &stats->loss, t->gradient_hook_context));
    if (!isfinite(stats->loss))
        return pt_fail(PIPERT_ERR_INTERNAL,
                       "step %ld: the loss is %f; lower train.lr or check the data", step,
                       (double)stats->loss);

    stats->grad_norm = pt_clip_grad_norm(t->kernels, t->model->grads, t->model->n_params,
                                         ts->grad_clip);
    stats->lr = pt_lr_at(step, ts->steps, ts->lr, ts->warmup_steps, ts->min_lr_ratio);
    pt_param_region regions[t->model->n_tensors];
    optimizer_regions(t->model, regions);
    pt_optimizer_step(&t->optimizer, t->model->params, t->model->grads, regions,
                      t->model->n_tensors, stats->lr);
    t->kernels->synchronize();
    t->step = step;
    stats->seconds = pt_now_s() - started;
    return PIPERT_OK;
}

float pt_trainer_validate(pt_trainer *t)
{
    const int n = t->config.train.val_batches, B = t->model->B, T = t->model->T;
    double sum = 0;
    for (int k = 0; k < n; k++) {
        pt_dataset_val_batch(&t->data, k, n, B, T, t->inputs, t->targets);
        upload_batch(t);
        float loss = 0;
        pt_gpt_forward_eval(t->model, &loss);
        sum += loss;
    }
    return (float)(sum / n);
}

/* ---- the run: pipert_train ----------------------------------------------- */

typedef struct run_state {
    pt_trainer *trainer;
    const pipert_train_options *options;
    pt_metrics metrics;
    pt_progress progress;
    long first_step;        /* steps already done when this run started */
    double tokens_per_s;    /* over the last logging window */
    double window_started;
    long window_steps;
} run_state;

static pipert_result write_metrics_line(run_state *r, const pt_step_stats *s)
{
    json_t *line = json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "step", (json_int_t)r->trainer->step,
                             "loss", (double)s->loss, "lr", s->lr, "grad_norm", s->grad_norm,
                             "tokens_per_s", r->tokens_per_s, "ms_per_step", 1e3 * s->seconds);
    return pt_metrics_write(&r->metrics, line);
}

static void show_progress(run_state *r, const pt_step_stats *s, bool persist)
{
    const pt_trainer *t = r->trainer;
    const long total = t->config.train.steps;
    double elapsed = pt_now_s() - r->progress.started;
    double per_step = elapsed / (double)(t->step - r->first_step);
    char text[256];
    snprintf(text, sizeof text,
             "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | %.0f ms/step | eta %.0fs", t->step,
             total, (double)s->loss, s->lr, r->tokens_per_s, 1e3 * s->seconds,
             per_step * (double)(total - t->step));
    pt_progress_update(&r->progress, text, persist);
}

static pipert_result validate_and_report(run_state *r, float *val_loss)
{
    *val_loss = pt_trainer_validate(r->trainer);
    pt_progress_print(&r->progress, "step %ld | val_loss %.4f", r->trainer->step,
                      (double)*val_loss);
    json_t *line = json_pack("{s:I, s:f}", "step", (json_int_t)r->trainer->step, "val_loss",
                             (double)*val_loss);
    return pt_metrics_write(&r->metrics, line);
}

static pipert_result save_checkpoint(run_state *r)
{
    const pt_trainer *t = r->trainer;
    PT_TRY(pt_checkpoint_save(r->options->out_dir, t->step, t->model, &t->optimizer, &t->config,
                              t->config.train.keep_checkpoints));
    pt_info("checkpoint of step %ld written to %s", t->step, r->options->out_dir);
    return PIPERT_OK;
}

static bool every(long step, long period) { return period > 0 && step % period == 0; }

static pipert_result resume_if_asked(run_state *r)
{
    if (!r->options->resume) return PIPERT_OK;
    char *path;
    long step;
    PT_TRY(pt_checkpoint_find_latest(r->options->out_dir, &path, &step));
    pipert_result rc = pt_checkpoint_load(path, r->trainer->model, &r->trainer->optimizer, &step);
    if (rc == PIPERT_OK) {
        r->trainer->step = step;
        pt_info("resumed from %s (step %ld)", path, step);
    }
    free(path);
    return rc;
}

static pipert_result train_loop(run_state *r, pipert_train_summary *summary)
{
    pt_trainer *t = r->trainer;
    const pt_train_settings *ts = &t->config.train;
    const double tokens_per_step = (double)t->model->B * t->model->T * ts->grad_accum;
    pt_step_stats stats = {0};
    float val_loss = NAN;
    r->window_started = pt_now_s();
    while (t->step < ts->steps) {
        if (r->options->stop_flag && *r->options->stop_flag) {
            PT_TRY(save_checkpoint(r));
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped at step %ld (checkpoint written)",
                           t->step);
        }
        PT_TRY(pt_trainer_step(t, &stats));
        r->window_steps++;
        bool log_now = every(t->step, ts->log_every) || t->step == ts->steps;
        if (log_now || r->progress.interactive) {
            double now = pt_now_s();
            r->tokens_per_s = tokens_per_step * (double)r->window_steps / (now - r->window_started);
        }
        if (log_now) {
            PT_TRY(write_metrics_line(r, &stats));
            r->window_started = pt_now_s();
            r->window_steps = 0;
        }
        show_progress(r, &stats, log_now);
        if (every(t->step, ts->val_every) || t->step == ts->steps)
            PT_TRY(validate_and_report(r, &val_loss));
        if (every(t->step, ts->checkpoint_every) || t->step == ts->steps) PT_TRY(save_checkpoint(r));
    }
    pt_progress_finish(&r->progress);
    summary->steps_done = t->step;
    summary->last_loss = stats.loss;
    summary->last_val_loss = val_loss;
    summary->tokens_per_s = r->tokens_per_s;
    return PIPERT_OK;
}

static void describe_run(const pt_trainer *t)
{
    const pt_model_settings *m = &t->config.model;
    pt_info("model: n_layer=%d n_embd=%d n_head=%d block_size=%d vocab_size=%d, %.2fM parameters; "
            "data: %s (%zu train / %zu val tokens); %s backend, %d threads",
            m->n_layer, m->n_embd, m->n_head, m->block_size, m->vocab_size,
            (double)t->model->n_params / 1e6, t->data.source, t->data.n_train,
            t->data.n_tokens - t->data.n_train, t->kernels->name, t->threads);
}

pipert_result pipert_train(const pipert_config *cfg, const pipert_train_options *options,
                           pipert_train_summary *summary)
{
    if (!cfg || !options || !options->out_dir || !summary)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_train: config, options.out_dir and summary "
                                               "are required");
    memset(summary, 0, sizeof *summary);
    summary->last_val_loss = NAN;
    run_state r = {.options = options};
    PT_TRY(pt_make_dirs(options->out_dir));
    PT_TRY(pt_trainer_create(&r.trainer, cfg));
    describe_run(r.trainer);
    pipert_result rc = resume_if_asked(&r);
    r.first_step = r.trainer->step;
    char metrics_path[PT_CONFIG_STRING_MAX + 32];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", options->out_dir);
    if (rc == PIPERT_OK)
        rc = pt_metrics_open(&r.metrics, metrics_path, options->resume ? r.first_step : -1);
    pt_progress_init(&r.progress, options->quiet);
    if (rc == PIPERT_OK) rc = train_loop(&r, summary);
    pt_progress_finish(&r.progress);
    pt_metrics_close(&r.metrics);
    pt_trainer_free(r.trainer);
    return rc;
}
