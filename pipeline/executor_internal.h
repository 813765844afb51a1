/* The stage executor's state, shared by its files (executor.c runs it,
 * executor_state.c saves and restores it). Not part of the interface. */
#ifndef PT_EXECUTOR_INTERNAL_H
#define PT_EXECUTOR_INTERNAL_H

#include "pipeline/executor.h"
#include "pipeline/utilisation.h"
#include "pipeline/validation.h"
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
    float **send_copies;  /* recompute: the slot's output [N, C] being sent (not the last stage):
                           * the one activation set is overwritten while a peer may still read
                           * the send (direct reads, device payloads) */
    int32_t **stash_tokens, **stash_targets; /* recompute: stage 0 / last stage */
    pt_request **activation_sends; /* per slot */
    pt_request *gradient_send;
    /* Host copies of what crosses to the neighbours when the host cannot read
     * the table's memory (staging.c); NULL when it can. */
    float **activation_staging; /* per slot: the activations being sent */
    float *gradient_staging;    /* the gradient being sent */
    bool device_sends_told[2];  /* logged that tensors to the previous [0] / next [1] stage go
                                 * device to device */
    float *sync_staging;        /* transfers that end before the call returns: every
                                   receive lands here first; validation's sends */
    /* pipeline.transfer = bf16 (transfer.c): what training sends is rounded into these, and
     * what it receives lands in rounded_received and is widened; in the table's memory. */
    bool transfer_bf16;
    pt_bf16 **rounded_sends;    /* per slot: the activations being sent (not the last stage);
                                 * with recompute, the one copy of the output being sent */
    pt_bf16 *rounded_gradient;  /* the gradient being sent (not stage 0) */
    pt_bf16 *rounded_received;  /* a receive of activations or a gradient, before widening */

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
    int backward_slot;   /* the slot of the newest backward (dc-asgd: its stashed weights) */
    pt_lookahead_state look;    /* the look-ahead's own settings and state (lookahead.h) */
    double loss_sum;
    int loss_count;
    double step_started;
    pt_utilisation_meter util; /* of the current step */
    pt_pipeline_step last_report;

    pt_eval_waves waves; /* validation while the asynchronous schedule runs (validation.c) */
};

/* Runs one instruction of the schedule (executor.c). */
pipert_result pt_executor_execute(pt_stage_executor *ex, const pt_instruction *in);

/* The schedule of `stage` for `count` microbatches from microbatch `first` of
 * the run (asynchronous: the whole rest of the run, whose first ones run
 * synchronously while pipeline.sync_steps lasts; flush: one step). */
pipert_result pt_executor_build_schedule(const pt_stage_executor *ex, pt_schedule *out, int stage,
                                         long first, int count);

/* staging.c: host buffers for what the transport reads and writes when the
 * host cannot read the kernel table's memory. setup/free: the executor's own
 * (activations per slot, the gradient, receives). outgoing: what to send for
 * `src` (src itself, or `staging` filled from it; staging NULL: src). incoming:
 * where a receive for dst lands; arrived: moves it to dst. alloc/release: a
 * buffer the transport may send from (host memory, or the table's when the
 * host can read it); copy_out fills one from the table's memory. */
pipert_result pt_staging_setup(pt_stage_executor *ex);
void pt_staging_free(pt_stage_executor *ex);
const void *pt_staging_outgoing(pt_stage_executor *ex, void *staging, const void *src,
                                size_t bytes);
void *pt_staging_incoming(pt_stage_executor *ex, void *dst);
void pt_staging_arrived(pt_stage_executor *ex, void *dst, size_t bytes);
/* Whether a tensor of `bytes` to `peer` goes device to device, and sending it so. */
bool pt_staging_device_to(pt_stage_executor *ex, int peer, size_t bytes);
pipert_result pt_staging_send_device(pt_stage_executor *ex, int peer, uint32_t tag,
                                     const pt_message_header *header, const void *src,
                                     pt_request **request);
float *pt_staging_sync(pt_stage_executor *ex); /* sync_staging: NULL when nothing is staged */
pipert_result pt_staging_alloc(pt_stage_executor *ex, void **out, size_t bytes, const char *what);
void pt_staging_release(pt_stage_executor *ex, void *buffer);
void pt_staging_copy_out(pt_stage_executor *ex, void *dst, const void *src, size_t bytes);

/* transfer.c: the bf16 copies of what crosses to the neighbours (pipeline.transfer; nothing
 * under fp32). setup/free: the executor's own. rounded: the bf16 buffer a send of training's
 * rounds `src` into, for slot `slot` (-1: the gradient's), or NULL when it crosses in fp32. */
pipert_result pt_transfer_setup(pt_stage_executor *ex);
void pt_transfer_free(pt_stage_executor *ex);
pt_bf16 *pt_transfer_rounded(pt_stage_executor *ex, int slot);

/* Slot of microbatch g: in-flight microbatches rotate through `slots` sets. */
static inline int pt_executor_slot_of(const pt_stage_executor *ex, long microbatch)
{
    return (int)(microbatch % ex->slots);
}

static inline bool pt_executor_is_last_stage(const pt_stage_executor *ex)
{
    return ex->options.stage == ex->options.stages - 1;
}

/* Stage 0 reads the inputs, the last stage the targets. */
static inline bool pt_executor_reads_data(const pt_stage_executor *ex)
{
    return ex->options.stage == 0 || pt_executor_is_last_stage(ex);
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
