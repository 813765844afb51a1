/* What the look-aheads of the asynchronous schedule do beyond choosing the
 * weights to stash (ALGORITHMS.md §3, docs/STALENESS.md): the prediction of
 * predict and predict-damped, PipeMare's per-stage step size, DC-ASGD's delay
 * compensation and nesterov-secant's, and the measured update size
 * predict-damped is bounded by.
 * The rules themselves are train/staleness.h; the element-wise work is the
 * optimizer's (train/optimizer.h). */
#include "pipeline/executor_internal.h"

#include <stdlib.h>

#include "runtime/name_table.h"
#include "train/staleness.h"

/* ---- the table ----------------------------------------------------------- */

/* In the enum's order. kind, name, stashes, nesterov, predicts, compensates (λ), extra
 * versions on every stage and on a stage that stashes (lookahead.h). */
static const pt_lookahead_traits lookaheads[] = {
    {PT_LOOKAHEAD_NONE, "none", false, false, false, false, 0, 0, 0},
    {PT_LOOKAHEAD_STASH, "stash", true, false, false, false, 0, 0, 0},
    {PT_LOOKAHEAD_NESTEROV, "nesterov", true, true, false, false, 0, 0, 0},
    {PT_LOOKAHEAD_PREDICT, "predict", true, false, true, false, 0, 0, 0},
    {PT_LOOKAHEAD_PREDICT_DAMPED, "predict-damped", true, false, true, false, 0, 1, 0},
    {PT_LOOKAHEAD_PIPEMARE, "pipemare", true, false, false, false, 0, 0, 0},
    /* λ: the paper's 2 */
    {PT_LOOKAHEAD_DC_ASGD, "dc-asgd", true, false, false, true, PT_DC_LAMBDA_PAPER, 0, 0},
    /* λ: 100, the staleness study's */
    {PT_LOOKAHEAD_NESTEROV_DC, "nesterov-dc", true, true, false, true, PT_DC_LAMBDA_NESTEROV, 0, 0},
    {PT_LOOKAHEAD_NESTEROV_SECANT, "nesterov-secant", true, true, false, false, 0, 0, 4},
};
#define LOOKAHEAD_COUNT (int)(sizeof lookaheads / sizeof lookaheads[0])

const pt_lookahead_traits *pt_lookahead_named(const char *name)
{
    const int i = pt_name_table_find(lookaheads, LOOKAHEAD_COUNT, name, "pipeline.lookahead");
    return i < 0 ? NULL : &lookaheads[i];
}

const pt_lookahead_traits *pt_lookahead_traits_of(pt_lookahead kind)
{
    return &lookaheads[kind]; /* the table is in the enum's order */
}

/* ---- what the executor does with them ------------------------------------ */

static bool is_async(const pt_stage_executor *ex) { return pt_executor_is_async(ex); }

static bool compensates(const pt_stage_executor *ex)
{
    return pt_lookahead_traits_of(ex->lookahead)->compensates;
}

/* λ of the compensation: pipeline.dc_lambda, or when that is 0 the look-ahead's own. */
static double dc_lambda(const pt_stage_executor *ex)
{
    const double own = ex->config.pipeline.dc_lambda;
    return own > 0 ? own : pt_lookahead_traits_of(ex->lookahead)->dc_lambda;
}

/* K of the warm-ups of predict-damped and pipemare. */
static long lookahead_warmup(const pt_stage_executor *ex)
{
    const long own = ex->config.pipeline.lookahead_warmup;
    return own > 0 ? own : ex->config.train.warmup_steps;
}

pipert_result pt_lookahead_setup(pt_stage_executor *ex)
{
    if (!is_async(ex)) return PIPERT_OK;
    const pt_kernels *k = ex->kernels;
    if (pt_lookahead_traits_of(ex->lookahead)->predicts && !k->adam_extrapolate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "pipeline.lookahead=%s: the %s backend has no adam_extrapolate kernel",
                       ex->config.pipeline.lookahead, k->name);
    if (compensates(ex) && !k->delay_compensate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "pipeline.lookahead=%s: the %s backend has no delay_compensate kernel",
                       ex->config.pipeline.lookahead, k->name);
    if (ex->lookahead == PT_LOOKAHEAD_NESTEROV_SECANT && pt_executor_stashes_weights(ex))
        return pt_secant_init(&ex->secant, k, ex->model->n_params,
                              ex->config.pipeline.lookahead_warmup);
    if (ex->lookahead != PT_LOOKAHEAD_PREDICT_DAMPED) return PIPERT_OK;
    ex->region_scratch = calloc((size_t)ex->model->n_tensors, sizeof *ex->region_scratch);
    if (!ex->region_scratch) return pt_fail(PIPERT_ERR_NOMEM, "predict-damped: out of memory");
    return pt_update_size_init(&ex->update_size, k, ex->model->n_params, ex->model->n_tensors);
}

void pt_lookahead_free(pt_stage_executor *ex)
{
    pt_update_size_free(&ex->update_size);
    pt_secant_free(&ex->secant);
    free(ex->region_scratch);
    ex->region_scratch = NULL;
}

/* predict-damped: ŵ = θ + Σ_i steps_i·(one step's predicted displacement of
 * tensor i), steps_i from staleness.h. The one-step displacement's norm per
 * tensor is measured by predicting one step into out first (the prediction is
 * linear in the steps, so the second call scales it exactly). */
static pipert_result predict_damped(pt_stage_executor *ex, float *out, double lr)
{
    pt_gpt_slice *m = ex->model;
    double *steps = ex->region_scratch;
    PT_TRY(pt_optimizer_predict(&ex->optimizer, out, m->params, ex->regions, m->n_tensors, lr, 1.0));
    pt_region_distances(ex->kernels, out, m->params, ex->regions, m->n_tensors, steps);
    for (int i = 0; i < m->n_tensors; i++)
        steps[i] = pt_damped_prediction_steps(ex->staleness_estimate, ex->version,
                                              lookahead_warmup(ex),
                                              pt_update_size_rms(&ex->update_size, i), steps[i]);
    return pt_optimizer_predict_each(&ex->optimizer, out, m->params, ex->regions, m->n_tensors, lr,
                                     steps);
}

pipert_result pt_lookahead_predict(pt_stage_executor *ex, float *out)
{
    const pt_train_settings *t = &ex->config.train;
    const double lr = pt_lr_at(ex->version + 1, t->steps, t->lr, t->warmup_steps, t->min_lr_ratio) *
                      pt_lookahead_lr_factor(ex, ex->version + 1);
    if (ex->lookahead == PT_LOOKAHEAD_PREDICT_DAMPED) return predict_damped(ex, out, lr);
    return pt_optimizer_predict(&ex->optimizer, out, ex->model->params, ex->regions,
                                ex->model->n_tensors, lr, ex->staleness_estimate);
}

double pt_lookahead_lr_factor(const pt_stage_executor *ex, long step)
{
    if (!is_async(ex) || ex->lookahead != PT_LOOKAHEAD_PIPEMARE) return 1.0;
    if (step <= ex->config.pipeline.sync_steps) return 1.0; /* a synchronous step: no staleness */
    return pt_pipemare_lr_factor(ex->staleness_estimate, step, lookahead_warmup(ex));
}

/* nesterov-secant: s = pipeline.dc_lambda, or the look-ahead's own. The step
 * size is the schedule's for the step the gradient goes into. A pair with a
 * synchronous backward (pipeline.sync_steps) is not learned from: there the
 * step between two stashes used the previous microbatch's gradient, whose
 * noise would bias the secant (secant.h). That holds for the pair of the last
 * synchronous and the first asynchronous microbatch too (the step between
 * their forwards used the former's gradient), so the first asynchronous
 * backward only starts the secant: it learns from the pair after it. */
static pipert_result secant_compensate(pt_stage_executor *ex)
{
    const pt_train_settings *t = &ex->config.train;
    const long step = ex->version + 1;
    if (step <= ex->config.pipeline.sync_steps + 1) ex->secant.pairs = 0;
    const double own = ex->config.pipeline.dc_lambda;
    const double lr = pt_lr_at(step, t->steps, t->lr, t->warmup_steps, t->min_lr_ratio);
    pt_gpt_slice *m = ex->model;
    return pt_secant_compensate(&ex->secant, &ex->optimizer, m->grads, m->params,
                                ex->slot_weights[ex->backward_slot], ex->regions, m->n_tensors,
                                lr, own > 0 ? own : PT_SECANT_SCALE);
}

pipert_result pt_lookahead_adjust_gradient(pt_stage_executor *ex)
{
    if (!is_async(ex) || !pt_executor_stashes_weights(ex)) return PIPERT_OK;
    if (ex->secant.kernels) return secant_compensate(ex);
    if (!compensates(ex)) return PIPERT_OK;
    pt_gpt_slice *m = ex->model;
    return pt_optimizer_delay_compensate(&ex->optimizer, m->grads, m->params,
                                         ex->slot_weights[ex->backward_slot], ex->regions,
                                         m->n_tensors, dc_lambda(ex));
}

void pt_lookahead_before_step(pt_stage_executor *ex)
{
    if (ex->update_size.before) pt_update_size_before_step(&ex->update_size, ex->model->params);
}

void pt_lookahead_after_step(pt_stage_executor *ex)
{
    if (ex->update_size.before)
        pt_update_size_after_step(&ex->update_size, ex->model->params, ex->regions);
}
