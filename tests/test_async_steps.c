/* The asynchronous pipeline's steps are delayed-gradient steps, against a serial reference.
 *
 * `pipert launch --pipeline.schedule=async-1f1b` on S real processes is checked step by step
 * against one process that never runs a pipeline: it holds the whole model and the last S
 * weight versions, and for microbatch g computes the gradient at the weights the schedule
 * implies — stage s's blocks at version max(0, g − (S−1−s)) (its warm-up forwards at
 * version 0, then one forward per step, S−1−s steps ahead of its backward), every stage in
 * one forward and backward — clips each stage's part by its own norm and takes one optimizer
 * step (with nesterov-dc, after compensating each element for its drift since its forward).
 * The training losses of all steps must agree to 1e-5 (relative), as the flush schedules'
 * do with one worker. A reference without delays must not: the check sees the delay. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "tests/command.h"
#include "train/optimizer.h"
#include "train/staleness.h"

enum { STEPS = 24, WARMUP = 4, LAYERS = 4, WIDTH = 32, HEADS = 2, T = 32, B = 2 };
/* The enum's sizes, as options */
#define MODEL                                                                                      \
    "--model.n_layer=4 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=2 --train.warmup_steps=4 --train.val_every=0 --train.log_every=1"

/* What the reference needs of a run: its stages' first blocks and the look-ahead. */
typedef struct run_shape {
    int stages;
    int first_layer[LAYERS + 1]; /* stage s holds blocks [first_layer[s], first_layer[s+1]) */
    bool nesterov_dc;            /* else stash with the configured AdamW */
    bool delayed;                /* false: the delay-free reference (must differ) */
} run_shape;

/* Where block `layer`'s tensors start in the whole model's flat buffer. */
static size_t block_offset(const pt_gpt_slice *m, int layer)
{
    char name[PT_TENSOR_NAME_MAX];
    snprintf(name, sizeof name, "h.%d.ln_1.weight", layer);
    const pt_gpt_tensor *t = pt_gpt_find(m, name);
    cr_assert_not_null(t, "the whole model has no tensor %s", name);
    return t->offset;
}

/* [begin, end) of stage s's parameters in the whole model's flat buffer: the tensors are laid
 * out in model order (embeddings, blocks, final norm and head), so each stage's are one range. */
static void stage_range(const pt_gpt_slice *m, const run_shape *r, int s, size_t *begin,
                        size_t *end)
{
    *begin = s == 0 ? 0 : block_offset(m, r->first_layer[s]);
    *end = s == r->stages - 1 ? m->n_params : block_offset(m, r->first_layer[s + 1]);
}

/* Each stage's gradient clipped by its own norm, as the asynchronous schedule does. */
static void clip_each_stage(const pt_gpt_slice *m, const run_shape *r, double max_norm)
{
    const pt_kernels *k = pt_kernels_cpu();
    for (int s = 0; s < r->stages; s++) {
        size_t begin, end;
        stage_range(m, r, s, &begin, &end);
        const double norm = sqrt((double)(float)k->sum_squares(m->grads + begin, end - begin));
        if (max_norm > 0 && norm > max_norm)
            k->scale(m->grads + begin, (float)(max_norm / norm), end - begin);
    }
}

/* The weights microbatch g's forward and backward used: stage s's part of version
 * max(0, g − (S−1−s)), from the ring of the last S versions. */
static void assemble_used_weights(const pt_gpt_slice *m, const run_shape *r, float *const *versions,
                                  long g, float *used)
{
    for (int s = 0; s < r->stages; s++) {
        const long ahead = r->delayed ? r->stages - 1 - s : 0;
        const long version = g - ahead > 0 ? g - ahead : 0;
        size_t begin, end;
        stage_range(m, r, s, &begin, &end);
        memcpy(used + begin, versions[version % r->stages] + begin, (end - begin) * sizeof(float));
    }
}

/* The training losses of STEPS delayed-gradient steps, computed serially. */
static void serial_reference(const run_shape *r, double *losses)
{
    pipert_config cfg;
    pt_config_defaults(&cfg);
    const pt_train_settings *t = &cfg.train;
    const pt_gpt_config model = {LAYERS, WIDTH, HEADS, T, cfg.model.vocab_size, false,
                                 PT_PRECISION_FP32, false};
    pt_kernels_cpu_set_threads(1);
    pt_gpt_slice *m;
    cr_assert_eq(pt_gpt_slice_create(&m, &model, 0, LAYERS, B, T, pt_kernels_cpu()), PIPERT_OK);
    cr_assert_eq(pt_gpt_init(m, (uint64_t)cfg.seed), PIPERT_OK);
    pt_dataset data;
    cr_assert_eq(pt_dataset_load(&data, cfg.data.path, cfg.data.format, cfg.data.val_fraction),
                 PIPERT_OK);
    data.sequences_per_step = B;
    pt_optimizer_settings settings = {
        .kind = PT_OPTIMIZER_ADAMW, .beta1 = t->beta1, .beta2 = t->beta2, .eps = t->eps,
        .weight_decay = t->weight_decay, .psi = t->momentum_decay};
    settings.kind = t->optimizer;
    if (r->nesterov_dc) settings.kind = PT_OPTIMIZER_NADAMW, settings.beta1 = 0.99;
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, &settings, pt_kernels_cpu(), m->n_params), PIPERT_OK);
    pt_param_region *regions = calloc((size_t)m->n_tensors, sizeof *regions);
    for (int i = 0; i < m->n_tensors; i++)
        regions[i] = (pt_param_region){m->tensors[i].offset, m->tensors[i].numel,
                                       m->tensors[i].decay};
    /* the ring of the last S versions (S ≤ LAYERS: a stage holds a block at least) */
    float *versions[LAYERS], *used = malloc(m->n_params * sizeof(float));
    for (int s = 0; s < r->stages; s++) versions[s] = malloc(m->n_params * sizeof(float));
    memcpy(versions[0], m->params, m->n_params * sizeof(float));

    for (long g = 0; g < STEPS; g++) {
        pt_dataset_train_batch(&data, (uint64_t)cfg.seed, g, 0, B, T, m->tokens, m->targets);
        assemble_used_weights(m, r, versions, g, used);
        pt_gpt_use_params(m, used);
        float loss;
        pt_gpt_forward(m, 1.0f, &loss);
        pt_gpt_backward(m, NULL);
        pt_gpt_use_params(m, NULL);
        losses[g] = loss;
        if (r->nesterov_dc)
            cr_assert_eq(pt_optimizer_delay_compensate(&opt, m->grads, m->params, used, regions,
                                                       m->n_tensors, PT_DC_LAMBDA_NESTEROV),
                         PIPERT_OK);
        clip_each_stage(m, r, t->grad_clip);
        const double lr = pt_lr_at(g + 1, STEPS, t->lr, WARMUP, t->min_lr_ratio);
        pt_optimizer_step(&opt, m->params, m->grads, regions, m->n_tensors, lr);
        pt_gpt_zero_grads(m);
        memcpy(versions[(g + 1) % r->stages], m->params, m->n_params * sizeof(float));
    }
    for (int s = 0; s < r->stages; s++) free(versions[s]);
    free(used);
    free(regions);
    pt_optimizer_free(&opt);
    pt_dataset_free(&data);
    pt_gpt_slice_free(m);
}

/* The pipeline's training losses of the same steps. */
static void pipeline_losses(const run_shape *r, const char *lookahead, const char *layers,
                            double *losses)
{
    char *dir = make_temp_dir();
    run_pipert_ok("launch --quiet --stages %d --replicas 1 --out %s " MODEL " --train.steps=%d "
                  "--pipeline.schedule=async-1f1b --pipeline.lookahead=%s --plan.layers=%s",
                  r->stages, dir, STEPS, lookahead, layers);
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", losses, STEPS), STEPS);
    remove_dir(dir);
}

static int steps_that_differ(const double *got, const double *expected)
{
    int differ = 0;
    for (int i = 0; i < STEPS; i++) differ += fabs(got[i] - expected[i]) > 1e-5 * fabs(expected[i]);
    return differ;
}

static void check_against_reference(run_shape r, const char *lookahead, const char *layers)
{
    double got[STEPS], expected[STEPS], delay_free[STEPS];
    pipeline_losses(&r, lookahead, layers, got);
    serial_reference(&r, expected);
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabs(got[i] - expected[i]) <= 1e-5 * fabs(expected[i]),
                  "%s on %d stages (%s), step %d: %.9g, serial delayed reference %.9g", lookahead,
                  r.stages, layers, i + 1, got[i], expected[i]);
    r.delayed = false;
    serial_reference(&r, delay_free);
    cr_expect_gt(steps_that_differ(got, delay_free), STEPS / 2,
                 "%s: the pipeline's steps are those of a run without delays", lookahead);
}

Test(async_steps, stash_on_four_stages_takes_delayed_gradient_steps)
{
    check_against_reference((run_shape){4, {0, 1, 2, 3, 4}, false, true}, "stash", "1,1,1,1");
}

Test(async_steps, nesterov_dc_on_three_uneven_stages_takes_compensated_delayed_steps)
{
    check_against_reference((run_shape){3, {0, 2, 3, 4}, true, true}, "nesterov-dc", "2,1,1");
}
