/* The stage executor's state, shared by its files (executor.c runs it,
 * executor_state.c saves and restores it). Not part of the interface. */
#ifndef PT_EXECUTOR_INTERNAL_H
#define PT_EXECUTOR_INTERNAL_H

#include "pipeline/executor.h"
#include "pipeline/utilisation.h"
#include "runtime/data.h"
#include "train/optimizer.h"

struct pt_stage_executor {
    pt_stage_executor_options options;
    pipert_config config;
    const pt_kernels *kernels;
    pt_schedule_kind schedule_kind;
    pt_lookahead lookahead;
    pt_schedule schedule;
    int microbatches; /* per optimizer step: M (flush) or 1 (async) */
    int B, T, C;
    char description[256];

    pt_gpt_slice *model;
    pt_optimizer optimizer;
    pt_param_region *regions;
    pt_dataset data; /* stage 0 and the last stage */
    bool has_data;
    int32_t *inputs, *targets; /* host staging [N] */
    float *dout;               /* gradient received from stage s+1 [N, C] */

    /* in-flight microbatches: slot = microbatch mod slots */
    int slots;
    long *slot_version; /* weight version each slot's forward used */
    float **slot_weights; /* stashed/predicted weights per slot, or NULL (use θ) */
    float **stash_input;  /* recompute: the slot's input [N, C] (stage > 0) */
    int32_t **stash_tokens, **stash_targets; /* recompute: stage 0 / last stage */
    pt_request **activation_sends; /* per slot */
    pt_request *gradient_send;

    /* where the run is: the next instruction of the schedule */
    int cursor;
    long base;           /* global id of the schedule's microbatch 0 (async: 0, or the step
                            a resume refilled the pipeline at) */
    int newest_slot;     /* the slot of the newest forward (−1: none yet) */

    bool replaying;      /* re-running in-flight forwards after a restore (executor_state.c):
                            on their stashed weights, no loss counted */
    long version;        /* optimizer steps taken = the version of θ */
    double staleness_sum; /* measured over the current step's backwards */
    int staleness_count;
    double staleness_estimate; /* running mean, for predict */
    double loss_sum;
    int loss_count;
    double step_started;
    pt_utilisation_meter util; /* of the current step */
    pt_pipeline_step last_report;
};

/* Runs one instruction of the schedule (executor.c). */
pipert_result pt_executor_execute(pt_stage_executor *ex, const pt_instruction *in);

/* Slot of microbatch g: in-flight microbatches rotate through `slots` sets. */
static inline int pt_executor_slot_of(const pt_stage_executor *ex, long microbatch)
{
    return (int)(microbatch % ex->slots);
}

static inline bool pt_executor_is_async(const pt_stage_executor *ex)
{
    return ex->schedule_kind == PT_SCHEDULE_ASYNC_1F1B;
}

static inline bool pt_executor_stashes_weights(const pt_stage_executor *ex)
{
    return pt_executor_is_async(ex) && ex->lookahead != PT_LOOKAHEAD_NONE && ex->slots > 1;
}

#endif
