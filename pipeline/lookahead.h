/* The look-aheads of the asynchronous schedule (pipeline.lookahead; executor.h says what each
 * does, docs/STALENESS.md why): one row each in lookahead.c's table, with every fact the
 * executor, checkpoints and the cost model (scheduler/cost.c) ask of one, so that they ask
 * the row rather than compare names. */
#ifndef PT_LOOKAHEAD_H
#define PT_LOOKAHEAD_H

#include <stdbool.h>

#include "kernels/kernels.h"
#include "models/gpt.h"
#include "runtime/config.h"
#include "train/optimizer.h"
#include "train/secant.h"
#include "train/update_size.h"

/* A pipeline.lookahead's facts (its name: pt_lookahead_name). */
typedef struct pt_lookahead_traits {
    /* The forward of a microbatch records the weights it used and its backward uses them
     * again: a stage keeps a version per microbatch in flight (every one but none). */
    bool stashes;
    /* The look-ahead is the optimizer: NAdamW with β1 = 0.99 (AsyncMesh). */
    bool nesterov;
    /* Forwards run on weights predicted τ steps ahead (stashed for the backward). */
    bool predicts;
    /* The gradient is compensated for its delay, with λ = pipeline.dc_lambda or, at 0,
     * dc_lambda (train/staleness.h). */
    bool compensates;
    double dc_lambda;
    /* Weight copies beyond the stash: on every stage (predict-damped: the weights before a
     * step, to measure its size), and on a stage that stashes (nesterov-secant: the previous
     * gradient and stash and two running means, train/secant.h). */
    int extra_versions, extra_versions_when_stashing;
} pt_lookahead_traits;

/* The look-ahead called `name` (a checkpoint's); NULL with a PIPERT_ERR_CONFIG naming the
 * known ones. */
const pt_lookahead_traits *pt_lookahead_named(const char *name);

/* The row of `kind` (a valid one). */
const pt_lookahead_traits *pt_lookahead_traits_of(pt_lookahead kind);

/* "nesterov-dc", ...: pipeline.lookahead's name of `kind`. */
const char *pt_lookahead_name(pt_lookahead kind);

/* ---- a look-ahead at work on one stage ------------------------------------ */

/* What a look-ahead does beyond stashing (lookahead.c): the prediction of predict and
 * predict-damped, PipeMare's step size, the delay compensation of dc-asgd, nesterov-dc and
 * nesterov-secant, and the measured update size predict-damped is bounded by. Its settings
 * and what it keeps across steps; the stage owns one and hands it the stage at each call. */
typedef struct pt_lookahead_state {
    pt_lookahead kind;
    const pt_lookahead_traits *row; /* kind's */
    bool async;                 /* the asynchronous schedule (otherwise it does nothing) */
    bool stashes;               /* this stage stashes weights (all but the last, async) */
    const pt_kernels *kernels;
    pt_train_settings train;    /* the learning rate's schedule */
    double dc_lambda;           /* pipeline.dc_lambda: 0 = the row's own */
    long warmup;                /* K of the warm-ups of predict-damped and pipemare */
    long sync_steps;            /* pipeline.sync_steps: the first steps synchronous */
    pt_update_size update_size; /* predict-damped: the measured size of the updates */
    pt_secant secant;           /* nesterov-secant: the running secant and previous pair */
    double *region_scratch;     /* predict-damped: per tensor */
} pt_lookahead_state;

/* The stage a call works on: its model (parameters, gradients), optimizer and tensors'
 * regions, the optimizer steps taken, its staleness estimate, and the weights the newest
 * backward used (its stash). */
typedef struct pt_lookahead_stage {
    pt_gpt_slice *model;
    pt_optimizer *optimizer;
    const pt_param_region *regions;
    long version;
    double staleness_estimate;
    const float *backward_weights;
} pt_lookahead_stage;

/* Checks that `kernels` have what the look-ahead needs and allocates what it keeps
 * (predict-damped's update measurement, nesterov-secant's secant) for `model`. */
pipert_result pt_lookahead_setup(pt_lookahead_state *s, pt_lookahead kind,
                                 const pipert_config *config, const pt_kernels *kernels,
                                 bool async, bool stashes, const pt_gpt_slice *model);
void pt_lookahead_free(pt_lookahead_state *s);
void pt_lookahead_use_kernels(pt_lookahead_state *s, const pt_kernels *kernels);

/* predict, predict-damped: the weights predicted for the next forward, into out. */
pipert_result pt_lookahead_predict(pt_lookahead_state *s, const pt_lookahead_stage *stage,
                                   float *out);
/* The step size factor of step `step` (pipemare; 1 otherwise). */
double pt_lookahead_lr_factor(const pt_lookahead_state *s, double staleness_estimate, long step);
/* The delay compensation of the newest backward's gradient (dc-asgd, nesterov-dc,
 * nesterov-secant), in place. */
pipert_result pt_lookahead_adjust_gradient(pt_lookahead_state *s, const pt_lookahead_stage *stage);
/* Around the optimizer step: the measurement of its size (predict-damped). */
void pt_lookahead_before_step(pt_lookahead_state *s, const float *params);
void pt_lookahead_after_step(pt_lookahead_state *s, const float *params,
                             const pt_param_region *regions);

#endif
