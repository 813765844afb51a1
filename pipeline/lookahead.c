/* What the look-aheads of the asynchronous schedule do beyond choosing the
 * weights to stash (ALGORITHMS.md §3, docs/STALENESS.md): the prediction of
 * predict and predict-damped, PipeMare's per-stage step size, DC-ASGD's delay
 * compensation and nesterov-secant's, and the measured update size
 * predict-damped is bounded by.
 * The rules themselves are train/staleness.h; the element-wise work is the
 * optimizer's (train/optimizer.h). */
#include "pipeline/lookahead.h"

#include <stdlib.h>

#include "runtime/error.h"

#include "train/staleness.h"

/* ---- the table ----------------------------------------------------------- */

/* Indexed by pipeline.lookahead's values (runtime/settings.h; the names are the
 * configuration's): stashes, nesterov, predicts, compensates (λ), extra versions on every
 * stage and on a stage that stashes (lookahead.h). */
static const pt_lookahead_traits lookaheads[PT_LOOKAHEADS] = {
    [PT_LOOKAHEAD_NONE] = {false, false, false, false, 0, 0, 0},
    [PT_LOOKAHEAD_STASH] = {true, false, false, false, 0, 0, 0},
    [PT_LOOKAHEAD_NESTEROV] = {true, true, false, false, 0, 0, 0},
    [PT_LOOKAHEAD_PREDICT] = {true, false, true, false, 0, 0, 0},
    [PT_LOOKAHEAD_PREDICT_DAMPED] = {true, false, true, false, 0, 1, 0},
    [PT_LOOKAHEAD_PIPEMARE] = {true, false, false, false, 0, 0, 0},
    /* λ: the paper's 2 */
    [PT_LOOKAHEAD_DC_ASGD] = {true, false, false, true, PT_DC_LAMBDA_PAPER, 0, 0},
    /* λ: 100, the staleness study's */
    [PT_LOOKAHEAD_NESTEROV_DC] = {true, true, false, true, PT_DC_LAMBDA_NESTEROV, 0, 0},
    [PT_LOOKAHEAD_NESTEROV_SECANT] = {true, true, false, false, 0, 0, 4},
};

const pt_lookahead_traits *pt_lookahead_named(const char *name)
{
    const int kind = pt_config_choice_value("pipeline.lookahead", name);
    return kind < 0 ? NULL : &lookaheads[kind];
}

const pt_lookahead_traits *pt_lookahead_traits_of(pt_lookahead kind)
{
    return &lookaheads[kind];
}

const char *pt_lookahead_name(pt_lookahead kind)
{
    return pt_config_choice_name("pipeline.lookahead", kind);
}

/* ---- a look-ahead at work ------------------------------------------------ */

/* What it does at all: the asynchronous schedule, on a stage that stashes weights. */
static bool at_work(const pt_lookahead_state *s) { return s->async && s->stashes; }

/* λ of the compensation: pipeline.dc_lambda, or when that is 0 the look-ahead's own. */
static double dc_lambda(const pt_lookahead_state *s)
{
    return s->dc_lambda > 0 ? s->dc_lambda : s->row->dc_lambda;
}

pipert_result pt_lookahead_setup(pt_lookahead_state *s, pt_lookahead kind,
                                 const pipert_config *config, const pt_kernels *kernels,
                                 bool async, bool stashes, const pt_gpt_slice *model)
{
    *s = (pt_lookahead_state){.kind = kind,
                              .row = pt_lookahead_traits_of(kind),
                              .async = async,
                              .stashes = stashes,
                              .kernels = kernels,
                              .train = config->train,
                              .dc_lambda = config->pipeline.dc_lambda,
                              .sync_steps = config->pipeline.sync_steps};
    /* K of the warm-ups: pipeline.lookahead_warmup, or the learning rate's */
    s->warmup = config->pipeline.lookahead_warmup > 0 ? config->pipeline.lookahead_warmup
                                                      : config->train.warmup_steps;
    if (!async) return PIPERT_OK;
    if (s->row->predicts && !kernels->adam_extrapolate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "pipeline.lookahead=%s: the %s backend has no adam_extrapolate kernel",
                       pt_lookahead_name(kind), kernels->name);
    if (s->row->compensates && !kernels->delay_compensate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "pipeline.lookahead=%s: the %s backend has no delay_compensate kernel",
                       pt_lookahead_name(kind), kernels->name);
    if (kind == PT_LOOKAHEAD_NESTEROV_SECANT && stashes)
        return pt_secant_init(&s->secant, kernels, model->n_params,
                              config->pipeline.lookahead_warmup);
    if (kind != PT_LOOKAHEAD_PREDICT_DAMPED) return PIPERT_OK;
    s->region_scratch = calloc((size_t)model->n_tensors, sizeof *s->region_scratch);
    if (!s->region_scratch) return pt_fail(PIPERT_ERR_NOMEM, "predict-damped: out of memory");
    return pt_update_size_init(&s->update_size, kernels, model->n_params, model->n_tensors);
}

void pt_lookahead_free(pt_lookahead_state *s)
{
    pt_update_size_free(&s->update_size);
    pt_secant_free(&s->secant);
    free(s->region_scratch);
    s->region_scratch = NULL;
}

void pt_lookahead_use_kernels(pt_lookahead_state *s, const pt_kernels *kernels)
{
    s->kernels = kernels;
    if (s->update_size.kernels) s->update_size.kernels = kernels;
}

/* predict-damped: ŵ = θ + Σ_i steps_i·(one step's predicted displacement of
 * tensor i), steps_i from staleness.h. The one-step displacement's norm per
 * tensor is measured by predicting one step into out first (the prediction is
 * linear in the steps, so the second call scales it exactly). */
static pipert_result predict_damped(pt_lookahead_state *s, const pt_lookahead_stage *stage,
                                    float *out, double lr)
{
    pt_gpt_slice *m = stage->model;
    double *steps = s->region_scratch;
    PT_TRY(pt_optimizer_predict(stage->optimizer, out, m->params, stage->regions, m->n_tensors,
                                lr, 1.0));
    pt_region_distances(s->kernels, out, m->params, stage->regions, m->n_tensors, steps);
    for (int i = 0; i < m->n_tensors; i++)
        steps[i] = pt_damped_prediction_steps(stage->staleness_estimate, stage->version,
                                              s->warmup, pt_update_size_rms(&s->update_size, i),
                                              steps[i]);
    return pt_optimizer_predict_each(stage->optimizer, out, m->params, stage->regions,
                                     m->n_tensors, lr, steps);
}

pipert_result pt_lookahead_predict(pt_lookahead_state *s, const pt_lookahead_stage *stage,
                                   float *out)
{
    const pt_train_settings *t = &s->train;
    const long step = stage->version + 1;
    const double lr = pt_lr_at(step, t->steps, t->lr, t->warmup_steps, t->min_lr_ratio) *
                      pt_lookahead_lr_factor(s, stage->staleness_estimate, step);
    if (s->kind == PT_LOOKAHEAD_PREDICT_DAMPED) return predict_damped(s, stage, out, lr);
    const pt_gpt_slice *m = stage->model;
    return pt_optimizer_predict(stage->optimizer, out, m->params, stage->regions, m->n_tensors,
                                lr, stage->staleness_estimate);
}

double pt_lookahead_lr_factor(const pt_lookahead_state *s, double staleness_estimate, long step)
{
    if (!s->async || s->kind != PT_LOOKAHEAD_PIPEMARE) return 1.0;
    if (step <= s->sync_steps) return 1.0; /* a synchronous step: no staleness */
    return pt_pipemare_lr_factor(staleness_estimate, step, s->warmup);
}

/* nesterov-secant: s = pipeline.dc_lambda, or the look-ahead's own. The step
 * size is the schedule's for the step the gradient goes into. A pair with a
 * synchronous backward (pipeline.sync_steps) is not learned from: there the
 * step between two stashes used the previous microbatch's gradient, whose
 * noise would bias the secant (secant.h). That holds for the pair of the last
 * synchronous and the first asynchronous microbatch too (the step between
 * their forwards used the former's gradient), so the first asynchronous
 * backward only starts the secant: it learns from the pair after it. */
static pipert_result secant_compensate(pt_lookahead_state *s, const pt_lookahead_stage *stage)
{
    const pt_train_settings *t = &s->train;
    const long step = stage->version + 1;
    if (step <= s->sync_steps + 1) s->secant.pairs = 0;
    const double lr = pt_lr_at(step, t->steps, t->lr, t->warmup_steps, t->min_lr_ratio);
    pt_gpt_slice *m = stage->model;
    return pt_secant_compensate(&s->secant, stage->optimizer, m->grads, m->params,
                                stage->backward_weights, stage->regions, m->n_tensors, lr,
                                s->dc_lambda > 0 ? s->dc_lambda : PT_SECANT_SCALE);
}

pipert_result pt_lookahead_adjust_gradient(pt_lookahead_state *s, const pt_lookahead_stage *stage)
{
    if (!at_work(s)) return PIPERT_OK;
    if (s->secant.kernels) return secant_compensate(s, stage);
    if (!s->row->compensates) return PIPERT_OK;
    pt_gpt_slice *m = stage->model;
    return pt_optimizer_delay_compensate(stage->optimizer, m->grads, m->params,
                                         stage->backward_weights, stage->regions, m->n_tensors,
                                         dc_lambda(s));
}

void pt_lookahead_before_step(pt_lookahead_state *s, const float *params)
{
    if (s->update_size.before) pt_update_size_before_step(&s->update_size, params);
}

void pt_lookahead_after_step(pt_lookahead_state *s, const float *params,
                             const pt_param_region *regions)
{
    if (s->update_size.before) pt_update_size_after_step(&s->update_size, params, regions);
}
