/* The stage executor in checkpoints: what a stage saves beside its
 * parameters and optimizer state, and how it continues from a checkpoint.
 *
 * Flush schedules (gpipe, 1f1b, one stage) are drained at every step
 * boundary: a checkpoint is θ, the optimizer and the version, and resuming is
 * pt_stage_executor_resume_at.
 *
 * The asynchronous schedule never drains. Stage s checkpoints after its own
 * N-th optimizer step, a cut that no gradient crosses and exactly one
 * activation per stage boundary does (sent by s−1 before its cut, received
 * by s after its own): pt_schedule_replay checks this from the schedules. At
 * the cut, stage s has S−1−s microbatches in flight (forward done, backward
 * not), whose weight stashes the checkpoint keeps. Resuming restores them and
 * runs those forwards again on the stashed weights — stage 0 from its data,
 * each later stage from the activations its predecessor's replay sends, the
 * newest of which is the one that crossed the cut — then continues at the
 * instruction after the N-th step: the same losses as an uninterrupted run.
 * That needs the same stages, split, look-ahead (stash, nesterov or predict:
 * with `none` the forward's weights are gone) and schedule; otherwise the
 * schedule starts again from an empty pipeline at step N (warm-up again; not
 * the uninterrupted run's losses).
 */
#ifndef PT_EXECUTOR_STATE_H
#define PT_EXECUTOR_STATE_H

#include <stddef.h>

#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "train/checkpoint.h"

/* ---- cuts of a schedule (pure functions) ---------------------------------- */

/* Where a stage's instruction list stands after its `steps`-th optimizer step. */
typedef struct pt_schedule_cut {
    int cursor;         /* index of the instruction after that step */
    int *in_flight;     /* microbatches forwarded and not yet backwarded, oldest first */
    int n_in_flight;
    int newest_forward; /* the newest microbatch forwarded, −1 if none */
} pt_schedule_cut;

/* PIPERT_ERR_INVALID_ARG if the list has fewer than `steps` optimizer steps. */
pipert_result pt_schedule_cut_at(const pt_schedule *schedule, long steps, pt_schedule_cut *out);
void pt_schedule_cut_free(pt_schedule_cut *cut);

/* The instructions that resume stage `mine->stage` of an asynchronous
 * schedule (its S stages, M microbatches in the run and synchronous
 * prefix, the neighbours' lists built alike) after its `steps`-th optimizer step,
 * before the rest of its list (from *cursor): for each microbatch in flight,
 * oldest first, LOAD_BATCH (stage 0) or RECV_ACTIVATION, FORWARD, and
 * SEND_ACTIVATION when stage+1 expects it again (it is in flight there, or
 * stage+1 receives it after its own cut). Checks, from the neighbours'
 * lists, that the cut is consistent: no gradient crosses it, every activation
 * sent before a cut and received after the other is in flight at the sender,
 * and every microbatch in flight here is in flight at stage−1.
 * *replay is malloc'd (NULL when empty). */
pipert_result pt_schedule_replay(const pt_schedule *mine, long steps, pt_instruction **replay,
                                 int *count, int *cursor);

/* ---- the executor ------------------------------------------------------------ */

/* The index's schedule fields: schedule, microbatches, first_microbatch,
 * lookahead. */
void pt_stage_executor_describe_schedule(const pt_stage_executor *ex, pt_checkpoint_index *index);

/* Adds the schedule's state to the stage's checkpoint file, between steps:
 * metadata "pipeline" ({"schedule", "microbatches", "version", "cursor",
 * "in_flight": [[microbatch, weight version], ...], "staleness_estimate"})
 * and each in-flight microbatch's stashed weights as "pipeline.stash.M.NAME". */
pipert_result pt_stage_executor_save_state(pt_stage_executor *ex, pt_checkpoint_writer *w);

/* How a run continues from a checkpoint. */
typedef enum pt_resume_kind {
    PT_RESUME_FLUSH,   /* a flush schedule: θ, optimizer and version (exact) */
    PT_RESUME_RESTORE, /* the asynchronous schedule exactly where it was: pt_stage_executor_restore */
    PT_RESUME_REFILL,  /* the asynchronous schedule from an empty pipeline (warm-up again) */
} pt_resume_kind;

/* How this run continues from the checkpoint `index`, its stages having the
 * blocks [bounds[s], bounds[s+1]); for PT_RESUME_REFILL, *why says what
 * differs. The answer is the same on every stage and replica. */
pt_resume_kind pt_stage_executor_plan_resume(const pt_stage_executor *ex,
                                             const pt_checkpoint_index *index, const int *bounds,
                                             char *why, size_t cap);

/* Continues the asynchronous schedule exactly where this stage's file `st`
 * of the checkpoint of step `version` left it (θ and the optimizer are
 * restored already): the in-flight microbatches' stashes and versions, the
 * cursor, the staleness estimate, then the replay of their forwards, which
 * exchanges activations with the neighbouring stages — every stage of the
 * replica calls it. */
pipert_result pt_stage_executor_restore(pt_stage_executor *ex, const pt_safetensors *st,
                                        long version);

#endif
