/* The stage executor: runs a schedule's instructions (pipeline/schedule.h) on
 * this worker's model slice and the UCX transport. One executor per
 * (stage, replica) worker.
 *
 * Weight handling (ALGORITHMS.md §3). Flush schedules (gpipe, 1f1b) run every
 * microbatch of a step on the same weights θ and step the optimizer once.
 * The asynchronous schedule steps after every backward, so stage s computes
 * its gradients on weights τ_s = S−1−s updates old; `pipeline.lookahead` says
 * what it does about it:
 *   none      forward and backward on the newest θ (an ablation)
 *   stash     the forward of microbatch m records the weights it used (one of
 *             τ_s+1 versions kept per stage); its backward uses them again
 *   nesterov  stash, with NAdamW and β1 = 0.99 (the default)
 *   predict   forward and backward at ŵ = θ − τ·γ·u (u: Adam's direction, τ
 *             the measured staleness), stashed for the backward
 *
 * Every message between stages carries a header the receiver checks (kind,
 * replica, stage, microbatch, shape, byte count, checksum): a mismatch is an
 * error naming the peer, never a silent reshape.
 */
#ifndef PT_EXECUTOR_H
#define PT_EXECUTOR_H

#include <stdbool.h>

#include "models/gpt.h"
#include "pipeline/schedule.h"
#include "runtime/comm/collectives.h"
#include "runtime/config.h"
#include "runtime/trace.h"
#include "runtime/comm/transport.h"

typedef enum pt_lookahead {
    PT_LOOKAHEAD_NONE,
    PT_LOOKAHEAD_STASH,
    PT_LOOKAHEAD_NESTEROV,
    PT_LOOKAHEAD_PREDICT,
} pt_lookahead;

pipert_result pt_lookahead_parse(const char *name, pt_lookahead *out);

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
} pt_pipeline_step;

typedef struct pt_stage_executor_options {
    const pipert_config *config;
    int stage, stages, replica, replicas;
    int first_layer, last_layer; /* blocks [first, last) of this stage */
    int threads;                 /* compute threads */
    pt_transport *transport;     /* connected to the neighbouring stages */
    int prev_rank, next_rank;    /* ranks of stages s−1 and s+1 of this replica (−1: none) */
    pt_group *stage_group;       /* the stages of this replica (NULL when stages == 1) */
    pt_group *replica_group;     /* the replicas of this stage (NULL when replicas == 1) */
    pt_trace *trace;             /* NULL: no trace */
    /* Checked while waiting for a message: true ends the run (PIPERT_ERR_INTERRUPTED). */
    bool (*should_stop)(void *context);
    /* Called after every optimizer step of this stage. */
    pipert_result (*on_step)(pt_stage_executor *ex, const pt_pipeline_step *step, void *context);
    void *context;
} pt_stage_executor_options;

pipert_result pt_stage_executor_create(pt_stage_executor **out,
                                       const pt_stage_executor_options *options);
void pt_stage_executor_free(pt_stage_executor *ex);

/* Trains for train.steps optimizer steps. */
pipert_result pt_stage_executor_run(pt_stage_executor *ex);

/* Mean validation loss over train.val_batches batches, computed through the
 * pipeline: every stage of the replica calls it at the same point; the last
 * stage gets the loss (NaN elsewhere). */
pipert_result pt_stage_executor_validate(pt_stage_executor *ex, float *val_loss);

/* The model slice (for checkpoints) and a one-line description. */
const pt_gpt_slice *pt_stage_executor_model(const pt_stage_executor *ex);
const char *pt_stage_executor_describe(const pt_stage_executor *ex);

#endif
