/* The stage executor: the one training engine. It runs a schedule's
 * instructions (pipeline/schedule.h) on this worker's model slice and the UCX
 * transport, one optimizer step per call. One executor per (stage, replica)
 * worker; a single worker is the one-stage case (1F1B with a flush over
 * train.grad_accum microbatches: gradient accumulation). The replicas of a
 * stage are coupled through dp/coupling.h, called after the backward and
 * after the optimizer step of every step.
 *
 * Weight handling (ALGORITHMS.md §3). Flush schedules (gpipe, 1f1b) run every
 * microbatch of a step on the same weights θ and step the optimizer once.
 * The asynchronous schedule steps after every backward, so stage s computes
 * its gradients on weights τ_s = S−1−s updates old; `pipeline.lookahead` says
 * what it does about it:
 *   none      forward and backward on the newest θ (an ablation)
 *   stash     the forward of microbatch m records the weights it used (one of
 *             τ_s+1 versions kept per stage); its backward uses them again
 *   nesterov  stash, with NAdamW and β1 = 0.99
 *   nesterov-dc  nesterov on dc-asgd's compensated gradient, λ = 100 (the default)
 *   nesterov-secant  nesterov-dc with a measured secant as the curvature and
 *             half of a stale stage's raw-gradient step on its momentum
 *             (train/secant.h)
 *   predict   forward and backward at ŵ = θ − τ·γ·u (u: Adam's direction, τ
 *             the measured staleness), stashed for the backward
 *   predict-damped  predict, its extrapolation damped by min(1, t/K) in
 *             warm-up and bounded per tensor by τ × the measured update size
 *   pipemare  stash, with PipeMare's per-stage step size γ·τ^−(1−min(1, t/K))
 *   dc-asgd   stash, with DC-ASGD's delay compensation of the gradient
 *             g + λ·g⊙g⊙(θ − w_used)/√v̂ (train/staleness.h, docs/STALENESS.md)
 *
 * Every message between stages carries a header the receiver checks (kind,
 * replica, stage, microbatch, shape, byte count, checksum): a mismatch is an
 * error naming the peer, never a silent reshape.
 */
#ifndef PT_EXECUTOR_H
#define PT_EXECUTOR_H

#include <stdbool.h>

#include "dp/coupling.h"
#include "pipeline/lookahead.h"
#include "pipeline/utilisation.h"
#include "models/gpt.h"
#include "pipeline/schedule.h"
#include "comm/collectives.h"
#include "runtime/config.h"
#include "runtime/trace.h"
#include "comm/transport.h"
#include "train/optimizer.h"

typedef struct pt_stage_executor pt_stage_executor;

/* What an optimizer step of this stage reports. */
typedef struct pt_pipeline_step {
    long step;          /* optimizer steps of this stage so far */
    long total_steps;
    float loss;         /* last stage: mean loss of the step's microbatches; NaN elsewhere */
    double lr;
    double grad_norm;   /* before clipping (global over stages for flush schedules) */
    double staleness;   /* mean measured staleness of the step's backwards */
    double seconds;     /* wall time since the previous step */
    double tokens;      /* tokens this replica trained on in the step */
    pt_coupling_metrics dp; /* what the coupling did in the step */
    pt_utilisation util;    /* where the step's wall time went; bytes per link class */
} pt_pipeline_step;

typedef struct pt_stage_executor_options {
    const pipert_config *config;
    const pt_kernels *kernels;   /* NULL: the table of config's runtime.device */
    int stage, stages, replica, replicas;
    int first_layer, last_layer; /* blocks [first, last) of this stage */
    int threads;                 /* compute threads (of a table that runs on host threads) */
    pt_transport *transport;     /* connected to the neighbouring stages */
    int prev_rank, next_rank;    /* ranks of stages s−1 and s+1 of this replica (−1: none) */
    pt_group *stage_group;       /* the stages of this replica (NULL when stages == 1) */
    pt_coupling *coupling;       /* the replicas of this stage (NULL: none to couple) */
    pt_trace *trace;             /* NULL: no trace */
    /* The host program's batches (pipert.h); NULL: data.path. */
    pipert_batch_fn batch;
    void *batch_user;
    /* Checked while waiting for a message: true ends the wait (PIPERT_ERR_INTERRUPTED). */
    bool (*should_stop)(void *context);
    void *context;
} pt_stage_executor_options;

pipert_result pt_stage_executor_create(pt_stage_executor **out,
                                       const pt_stage_executor_options *options);
void pt_stage_executor_free(pt_stage_executor *ex);

/* Runs the schedule until this stage's next optimizer step is done (after
 * the last one, until the schedule ends); *report (may be NULL) says what the
 * step did. */
pipert_result pt_stage_executor_step(pt_stage_executor *ex, pt_pipeline_step *report);

/* Every step of train.steps is done. */
bool pt_stage_executor_finished(const pt_stage_executor *ex);

/* Optimizer steps taken: the version of θ. */
long pt_stage_executor_version(const pt_stage_executor *ex);

/* Continues from a checkpoint of step `version` (the parameters and
 * optimizer state were restored by the caller): a flush schedule at its next
 * step; the asynchronous one from an empty pipeline, warming up again (for
 * the exact continuation see pipeline/executor_state.h). */
pipert_result pt_stage_executor_resume_at(pt_stage_executor *ex, long version);

/* Runs every later kernel call through `kernels` (the same memory: a
 * profiling wrapper of the current table). */
void pt_stage_executor_use_kernels(pt_stage_executor *ex, const pt_kernels *kernels);

/* Mean validation loss over train.val_batches batches, computed through the
 * pipeline: every stage of the replica calls it at the same point; the last
 * stage gets the loss (NaN elsewhere). */
pipert_result pt_stage_executor_validate(pt_stage_executor *ex, float *val_loss);

/* Validation while the asynchronous schedule runs (train.val_every; pipeline/validation.c):
 * after its step N, stage 0 passes the validation batches through the running pipeline, each
 * stage on its own current weights when they reach it; nothing is drained. The last stage's
 * result for step N is ready a few steps later: true with *step = N and *val_loss, oldest
 * first (false elsewhere, and while none is ready). */
bool pt_stage_executor_take_validation(pt_stage_executor *ex, long *step, float *val_loss);

/* The model slice and optimizer (for checkpoints) and a one-line description. */
pt_gpt_slice *pt_stage_executor_model(pt_stage_executor *ex);
pt_optimizer *pt_stage_executor_optimizer(pt_stage_executor *ex);
const char *pt_stage_executor_describe(const pt_stage_executor *ex);

#endif
