/* One worker training the whole model: the step loop that `pipert train`
 * runs and `pipert bench` times. (The pipeline executor replaces this loop
 * for multi-stage runs.) */
#ifndef PT_TRAINER_H
#define PT_TRAINER_H

#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "train/optimizer.h"

typedef struct pt_trainer pt_trainer;

/* Runs after the backward of every step and before clipping: where the
 * replicas of a data-parallel job average their gradients (and may average
 * the step's loss for reporting). */
typedef pipert_result (*pt_gradient_hook)(pt_trainer *t, float *loss, void *context);

struct pt_trainer {
    pipert_config config;
    const pt_kernels *kernels;
    pt_gpt_slice *model;
    pt_optimizer optimizer;
    pt_dataset data;
    int32_t *inputs, *targets; /* host staging, [B·T] */
    long step;                 /* optimizer steps completed */
    int replica;               /* data-parallel replica r draws sequences [r·B, (r+1)·B) of each
                                  step's global batch (0 alone) */
    int threads;
    pt_gradient_hook gradient_hook; /* NULL: none */
    void *gradient_hook_context;
};

typedef struct pt_step_stats {
    float loss;       /* mean over the step's microbatches */
    double grad_norm; /* before clipping */
    double lr;
    double seconds;
} pt_step_stats;

/* Validates the configuration, picks the backend and threads, loads the
 * data, builds and initialises the model and optimizer. */
pipert_result pt_trainer_create(pt_trainer **out, const pipert_config *cfg);
void pt_trainer_free(pt_trainer *t);

/* Runs every later kernel call through `kernels` (same memory as before: a
 * profiling wrapper of the current table). */
void pt_trainer_use_kernels(pt_trainer *t, const pt_kernels *kernels);

/* One optimizer step (grad_accum microbatches); t->step advances. */
pipert_result pt_trainer_step(pt_trainer *t, pt_step_stats *stats);

/* Mean loss over train.val_batches validation batches. */
float pt_trainer_validate(pt_trainer *t);

#endif
