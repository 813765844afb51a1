/* Checkpoints of a session, and resuming from them (the files are described
 * in train/checkpoint.h).
 *
 * Saving: every stage of replica 0 writes DIR/ckpt-STEP-stage-S.safetensors
 * (its slice, optimizer, coupling and pipeline state); then the stages of
 * replica 0 gather each other's outcome (an allgather over the replica's
 * stage group), and stage 0 writes the index DIR/ckpt-STEP.json only if every
 * file was written: the index is what makes the checkpoint complete. Other
 * replicas write nothing. Flush schedules checkpoint at a step boundary every
 * stage shares; the asynchronous schedule has each stage checkpoint after
 * its own N-th step (pipeline/executor_state.h). The allgather cannot
 * deadlock there: a stage waiting in it at step N has sent everything its
 * neighbours need to reach their own N-th step (no gradient crosses the cut,
 * and sends complete without the waiting stage), and its replicas' coupling
 * of step N is done.
 *
 * Resuming: every worker of every replica reads the newest complete index,
 * loads its slice by global name from whichever stage files hold it, and the
 * optimizer state likewise; the coupling's state when its slice is the same.
 * So a run resumes under another stage split, stage count or replica count.
 * A flush schedule then continues exactly; the asynchronous one exactly when
 * the layout and schedule are the same (the in-flight microbatches are
 * replayed), else from an empty pipeline. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/executor_state.h"
#include "runtime/log.h"
#include "session/session_internal.h"
#include "train/checkpoint.h"

/* ---- saving ------------------------------------------------------------------- */

static pipert_result write_stage_file(pipert_session *s, long step, uint64_t *bytes)
{
    pt_checkpoint_writer *w;
    PT_TRY(pt_checkpoint_writer_create(&w, step, s->job.stage, s->job.layout.stages, 0,
                                       pt_stage_executor_model(s->executor),
                                       pt_stage_executor_optimizer(s->executor), &s->config));
    pt_safetensors_writer *tensors = pt_checkpoint_writer_tensors(w);
    pipert_result rc = pt_safetensors_writer_set_metadata(tensors, "dp_method",
                                                          pt_coupling_method_name(s->coupling));
    if (rc == PIPERT_OK) rc = pt_coupling_save(s->coupling, tensors);
    if (rc == PIPERT_OK) rc = pt_stage_executor_save_state(s->executor, w);
    if (rc == PIPERT_OK) rc = pt_checkpoint_writer_write(w, s->out_dir, bytes);
    pt_checkpoint_writer_free(w);
    return rc;
}

/* What each stage of replica 0 tells the others about its file. */
typedef struct stage_outcome {
    int32_t result; /* pipert_result of writing it */
    int32_t first_layer, last_layer;
    int32_t reserved;
    uint64_t bytes;
} stage_outcome;

static pipert_result write_index(pipert_session *s, long step, const stage_outcome *outcomes)
{
    pt_checkpoint_index index;
    PT_TRY(pt_checkpoint_index_init(&index, step, s->job.layout.stages, s->job.layout.replicas,
                                    false));
    index.n_layer = s->config.model.n_layer;
    pt_stage_executor_describe_schedule(s->executor, &index);
    for (int stage = 0; stage < index.stages; stage++) {
        pt_checkpoint_part *part = &index.parts[stage];
        part->first_layer = outcomes[stage].first_layer;
        part->last_layer = outcomes[stage].last_layer;
        part->bytes = outcomes[stage].bytes;
        pt_checkpoint_part_name(step, stage, 0, part->file);
    }
    pipert_result rc = pt_checkpoint_index_write(s->out_dir, &index);
    pt_checkpoint_index_free(&index);
    return rc;
}

pipert_result pt_session_save_checkpoint(pipert_session *s, long step)
{
    if (s->job.replica != 0) return PIPERT_OK;
    const int stages = s->job.layout.stages;
    const pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    stage_outcome mine = {.first_layer = slice->first, .last_layer = slice->last};
    mine.result = (int32_t)write_stage_file(s, step, &mine.bytes);
    char message[1024] = "";
    if (mine.result != PIPERT_OK) snprintf(message, sizeof message, "%s", pipert_last_error());

    stage_outcome *all = calloc((size_t)stages, sizeof *all);
    if (!all) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    pipert_result rc = PIPERT_OK;
    if (s->job.stage_group) rc = pt_allgather(s->job.stage_group, &mine, sizeof mine, all);
    else all[0] = mine;
    if (rc == PIPERT_OK && mine.result != PIPERT_OK)
        rc = pt_fail((pipert_result)mine.result, "%s", message);
    for (int stage = 0; rc == PIPERT_OK && stage < stages; stage++)
        if (all[stage].result != PIPERT_OK)
            rc = pt_fail(PIPERT_ERR_PEER, "the checkpoint of step %ld is incomplete: stage %d could "
                                          "not write its file (its log says why)",
                         step, stage);
    if (rc == PIPERT_OK && s->job.stage == 0) {
        rc = write_index(s, step, all);
        if (rc == PIPERT_OK) {
            pt_checkpoint_prune(s->out_dir, step, s->config.train.keep_checkpoints);
            pt_info("checkpoint of step %ld written to %s (%d stage file%s and ckpt-%08ld.json)",
                    step, s->out_dir, stages, stages == 1 ? "" : "s", step);
        }
    }
    free(all);
    return rc;
}

/* ---- resuming --------------------------------------------------------------------- */

/* Every stage's blocks in this run: bounds[s], bounds[s+1] (the stages of
 * a replica tell each other theirs). */
static pipert_result current_bounds(pipert_session *s, int *bounds)
{
    const pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    int32_t mine[2] = {slice->first, slice->last};
    const int stages = s->job.layout.stages;
    int32_t *all = calloc((size_t)stages * 2, sizeof *all);
    if (!all) return pt_fail(PIPERT_ERR_NOMEM, "resume: out of memory");
    pipert_result rc = PIPERT_OK;
    if (s->job.stage_group) rc = pt_allgather(s->job.stage_group, mine, sizeof mine, all);
    else memcpy(all, mine, sizeof mine);
    for (int stage = 0; rc == PIPERT_OK && stage < stages; stage++) {
        bounds[stage] = all[2 * stage];
        bounds[stage + 1] = all[2 * stage + 1];
    }
    free(all);
    return rc;
}

static pipert_result restore(pipert_session *s, const pt_checkpoint *c)
{
    const long step = c->index.step;
    const int stage = s->job.stage, stages = s->job.layout.stages;
    pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    PT_TRY(pt_checkpoint_load_slice(c, slice, pt_stage_executor_optimizer(s->executor)));
    const pt_safetensors *same = pt_checkpoint_same_slice(c, slice, stage, stages);
    if (same) PT_TRY(pt_coupling_load(s->coupling, same, pt_safetensors_path(same)));
    else if (s->job.layout.replicas > 1)
        pt_info("the checkpoint's stages hold other blocks: dp.method=%s starts without saved state",
                pt_coupling_method_name(s->coupling));

    int *bounds = calloc((size_t)stages + 1, sizeof *bounds);
    if (!bounds) return pt_fail(PIPERT_ERR_NOMEM, "resume: out of memory");
    char why[256];
    pipert_result rc = current_bounds(s, bounds);
    pt_resume_kind kind = PT_RESUME_FLUSH;
    if (rc == PIPERT_OK)
        kind = pt_stage_executor_plan_resume(s->executor, &c->index, bounds, why, sizeof why);
    free(bounds);
    PT_TRY(rc);
    if (kind == PT_RESUME_RESTORE) return pt_stage_executor_restore(s->executor, same, step);
    if (kind == PT_RESUME_REFILL && stage == 0)
        pt_warn("the asynchronous pipeline starts again empty at step %ld (%s): the losses will "
                "differ from an uninterrupted run's",
                step, why);
    return pt_stage_executor_resume_at(s->executor, step);
}

pipert_result pt_session_resume(pipert_session *s, long *step)
{
    pt_checkpoint_index index;
    PT_TRY(pt_checkpoint_find_latest(s->out_dir, &index));
    *step = index.step;
    const int stages = index.stages;
    pt_checkpoint c = {0};
    pipert_result rc = pt_checkpoint_open(&c, s->out_dir, &index, 0);
    if (rc == PIPERT_OK) rc = restore(s, &c);
    if (rc == PIPERT_OK)
        pt_info("resumed from the checkpoint of step %ld in %s (%d stage file%s)", *step,
                s->out_dir, stages, stages == 1 ? "" : "s");
    pt_checkpoint_close(&c);
    if (rc != PIPERT_OK) pt_checkpoint_index_free(&index);
    return rc;
}
