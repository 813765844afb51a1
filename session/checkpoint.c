/* Checkpoints of a session, and resuming from them (the files are described
 * in train/checkpoint.h).
 *
 * Saving: every stage of replica 0 writes DIR/ckpt-STEP-stage-S.safetensors
 * (its slice, optimizer, coupling and pipeline state). When the coupling lets
 * replicas drift (every dp.method but allreduce: pt_coupling_replicas_identical),
 * every other replica R writes DIR/ckpt-STEP-stage-S-replica-R.safetensors,
 * the same for its own state; with allreduce the replicas are bitwise equal
 * and write nothing. Then the outcomes are gathered in two rounds: the
 * replicas of each stage all-gather theirs over the stage's replica group
 * (drifting methods only), and the stages of replica 0 all-gather what their
 * replicas said over replica 0's stage group; stage 0 of replica 0 writes the
 * index DIR/ckpt-STEP.json only if every file of every stage and replica was
 * written: the index is what makes the checkpoint complete.
 *
 * Flush schedules checkpoint at a step boundary every stage shares; the
 * asynchronous schedule has each stage checkpoint after its own N-th step
 * (pipeline/executor_state.h). Neither round can deadlock. A worker waiting
 * in either at step N has done all of its step N: it has sent everything its
 * neighbouring stages need to reach their own N-th step (no gradient crosses
 * the cut, and sends complete without the waiting worker), it has taken part
 * in every blocking collective of its replicas up to step N (the coupling's,
 * the clipping norm's), and the exchanges it posted run on the transport's
 * progress thread. So every worker reaches its own N-th step and enters the
 * first round, which therefore ends on every stage; the second waits only
 * for replica 0's stages, each of which enters it straight from its first.
 * The first round is a collective of the replica group, where the coupling's
 * exchanges are too: every replica starts it at the same point of its
 * sequence (after its step N's coupling calls), so the group's order holds.
 *
 * Elastic replicas (session/elastic.c). Until the survivors switch to their
 * new groups, a checkpoint uses the old ones, with the replica that left: it
 * fails to complete, and each worker warns and goes on without it. After the
 * switch the replicas still in the job write it, numbered in their order
 * (the first of them writes replica 0's files), and the index says how many
 * there are: a later --resume with that many replicas continues from it.
 *
 * Resuming: every worker of every replica reads the newest complete index. A
 * worker of replica R ≥ 1 reads its own replica's files when the checkpoint
 * has them, its method lets replicas drift, and the run is laid out as the
 * one that wrote it (stages, split and replica count: resume_replica);
 * otherwise replica 0's files, saying so when that is not exact. It loads
 * its slice by global name from whichever of those files hold it, and the
 * optimizer state likewise; the coupling's state when its slice is the same.
 * So a run resumes under another stage split, stage count or replica count.
 * A flush schedule then continues exactly; the asynchronous one exactly when
 * the layout and schedule are the same (the in-flight microbatches are
 * replayed from the replica's own file), else from an empty pipeline. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/executor_state.h"
#include "runtime/log.h"
#include "session/session_internal.h"
#include "train/checkpoint.h"

/* ---- saving ------------------------------------------------------------------- */

/* The replicas whose files a checkpoint holds: those in the job when the
 * coupling's groups were last formed (all of them until a departure). */
static int checkpoint_replicas(const pipert_session *s)
{
    int n = 0;
    for (int r = 0; r < s->job.layout.replicas; r++) n += !s->job.replica_left[r];
    return n;
}

/* This replica's place among them: the number its files carry. */
static int checkpoint_slot(const pipert_session *s)
{
    int slot = 0;
    for (int r = 0; r < s->job.replica; r++) slot += !s->job.replica_left[r];
    return slot;
}

/* Replicas after the first write files of their own. */
static bool writes_replica_files(const pipert_session *s)
{
    return checkpoint_replicas(s) > 1 && !pt_coupling_replicas_identical(s->coupling);
}

static pipert_result write_own_file(pipert_session *s, long step, uint64_t *bytes,
                                    uint64_t *write_id)
{
    pt_checkpoint_writer *w;
    PT_TRY(pt_checkpoint_writer_create(&w, step, s->job.stage, s->job.layout.stages,
                                       checkpoint_slot(s), pt_stage_executor_model(s->executor),
                                       pt_stage_executor_optimizer(s->executor), &s->config));
    pt_safetensors_writer *tensors = pt_checkpoint_writer_tensors(w);
    pipert_result rc = pt_safetensors_writer_set_metadata(tensors, "dp_method",
                                                          pt_coupling_method_name(s->coupling));
    if (rc == PIPERT_OK) rc = pt_coupling_save(s->coupling, tensors);
    if (rc == PIPERT_OK) rc = pt_stage_executor_save_state(s->executor, w);
    if (rc == PIPERT_OK) rc = pt_checkpoint_writer_write(w, s->out_dir, bytes, write_id);
    pt_checkpoint_writer_free(w);
    return rc;
}

/* What each worker tells the others about its file. */
typedef struct file_outcome {
    int32_t result; /* pipert_result of writing it */
    int32_t stage, replica;
    int32_t first_layer, last_layer;
    int32_t reserved;
    uint64_t bytes;
    uint64_t write_id; /* pt_checkpoint_part.write_id */
} file_outcome;

/* PIPERT_OK if this worker's file and every one of outcomes[0..n) were
 * written, else an error: this worker's own, or naming the first that was
 * not. */
static pipert_result check_outcomes(long step, const file_outcome *mine, const char *own_message,
                                    const file_outcome *outcomes, int n)
{
    if (mine->result != PIPERT_OK) return pt_fail((pipert_result)mine->result, "%s", own_message);
    for (int i = 0; i < n; i++)
        if (outcomes[i].result != PIPERT_OK)
            return pt_fail(PIPERT_ERR_PEER, "the checkpoint of step %ld is incomplete: stage %d "
                                            "of replica %d could not write its file (its log "
                                            "says why)",
                           step, outcomes[i].stage, outcomes[i].replica);
    return PIPERT_OK;
}

/* An all-gather of the rounds below that a stop, an abort or replicas
 * leaving the job end (pipert_session_stop would otherwise wait for a peer
 * that never comes). Given up on, its buffers may still be written by a late
 * message: they are then kept until the session ends. */
static pipert_result gather(pipert_session *s, pt_group *g, const void *send, size_t nbytes,
                            void *recv)
{
    const int n = pt_group_size(g);
    void *in = malloc(nbytes), *out = malloc((size_t)n * nbytes);
    if (!in || !out) {
        free(in);
        free(out);
        return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    }
    memcpy(in, send, nbytes);
    pt_completion *done;
    pipert_result rc = pt_allgather_start(g, in, nbytes, out, &done);
    while (rc == PIPERT_OK) {
        rc = pt_completion_wait_for(done, 0.1);
        if (rc != PIPERT_ERR_TIMEOUT) break;
        rc = PIPERT_OK;
        const bool departed = s->job.elastic && pt_session_membership_changed(s);
        if (!departed && !atomic_load(&s->stop_requested) && !pt_job_aborted(&s->job)) continue;
        pt_completion_abandon(done);
        if (pt_session_keep_until_end(s, in) != PIPERT_OK || pt_session_keep_until_end(s, out) != PIPERT_OK)
            return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
        return pt_fail(departed ? PIPERT_ERR_PEER : PIPERT_ERR_INTERRUPTED,
                       "checkpoint: %s while gathering the outcomes",
                       departed ? "replicas left the job" : "stopped");
    }
    if (rc == PIPERT_OK) memcpy(recv, out, (size_t)n * nbytes);
    free(in);
    free(out);
    return rc;
}

/* The first round: the outcomes of this stage's replicas, by replica
 * (row[0..R)); only this worker's when replicas write no files. */
static pipert_result gather_replicas(pipert_session *s, const file_outcome *mine, file_outcome *row)
{
    if (!writes_replica_files(s)) {
        row[0] = *mine;
        return PIPERT_OK;
    }
    const int R = checkpoint_replicas(s);
    file_outcome *by_member = calloc((size_t)R, sizeof *by_member);
    if (!by_member) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    /* The group is ordered by site, not by replica: each says which it is. */
    pipert_result rc = gather(s, s->job.replica_group, mine, sizeof *mine, by_member);
    for (int i = 0; rc == PIPERT_OK && i < R; i++) {
        const int r = by_member[i].replica;
        if (r < 0 || r >= R || by_member[i].stage != s->job.stage)
            rc = pt_fail(PIPERT_ERR_PEER, "checkpoint: member %d of stage %d's replicas says it "
                                          "is stage %d, replica %d",
                         i, s->job.stage, by_member[i].stage, r);
        else row[r] = by_member[i];
    }
    free(by_member);
    return rc;
}

static pipert_result write_index(pipert_session *s, long step, const file_outcome *all, int row)
{
    const bool replica_files = row > 1;
    pt_checkpoint_index index;
    PT_TRY(pt_checkpoint_index_init(&index, step, s->job.layout.stages, checkpoint_replicas(s),
                                    replica_files));
    index.n_layer = s->config.model.n_layer;
    pt_stage_executor_describe_schedule(s->executor, &index);
    for (int stage = 0; stage < index.stages; stage++)
        for (int replica = 0; replica < row; replica++) {
            const file_outcome *o = &all[stage * row + replica];
            pt_checkpoint_part *part = pt_checkpoint_index_part(&index, stage, replica);
            part->first_layer = o->first_layer;
            part->last_layer = o->last_layer;
            part->bytes = o->bytes;
            part->write_id = o->write_id;
            pt_checkpoint_part_name(step, stage, replica, part->file);
        }
    pipert_result rc = pt_checkpoint_index_write(s->out_dir, &index);
    pt_checkpoint_index_free(&index);
    return rc;
}

static pipert_result save_checkpoint(pipert_session *s, long step)
{
    const bool replica_files = writes_replica_files(s);
    const int slot = checkpoint_slot(s);
    if (slot != 0 && !replica_files) return PIPERT_OK;
    const int stages = s->job.layout.stages, row = replica_files ? checkpoint_replicas(s) : 1;
    const pt_gpt_slice *slice = pt_stage_executor_model(s->executor);
    file_outcome mine = {.stage = s->job.stage, .replica = slot,
                         .first_layer = slice->first, .last_layer = slice->last};
    mine.result = (int32_t)write_own_file(s, step, &mine.bytes, &mine.write_id);
    char message[1024] = "";
    if (mine.result != PIPERT_OK) snprintf(message, sizeof message, "%s", pipert_last_error());

    /* own_row[replica]: this stage's replicas; all[stage · row + replica]. */
    file_outcome *all = calloc((size_t)stages * (size_t)row, sizeof *all);
    file_outcome *own_row = malloc((size_t)row * sizeof *own_row);
    pipert_result rc = all && own_row ? PIPERT_OK
                                      : pt_fail(PIPERT_ERR_NOMEM, "checkpoint: out of memory");
    for (int r = 0; own_row && r < row; r++) /* until heard from */
        own_row[r] = (file_outcome){.result = PIPERT_ERR_PEER, .stage = s->job.stage, .replica = r};
    if (rc == PIPERT_OK) rc = gather_replicas(s, &mine, own_row);
    if (rc == PIPERT_OK) rc = check_outcomes(step, &mine, message, own_row, row);
    if (slot != 0) { /* done: the first replica of this stage takes the row on */
        free(all);
        free(own_row);
        return rc;
    }
    /* The second round, also after a failure: the other stages wait in it. */
    if (all && own_row) {
        pipert_result gathered = PIPERT_OK;
        if (s->job.stage_group)
            gathered = gather(s, s->job.stage_group, own_row, (size_t)row * sizeof *own_row, all);
        else memcpy(all, own_row, (size_t)row * sizeof *own_row);
        if (rc == PIPERT_OK) rc = gathered;
    }
    if (rc == PIPERT_OK) rc = check_outcomes(step, &mine, message, all, stages * row);
    if (rc == PIPERT_OK && s->job.stage == 0) {
        rc = write_index(s, step, all, row);
        if (rc == PIPERT_OK) {
            pt_checkpoint_prune(s->out_dir, step, s->config.train.keep_checkpoints);
            pt_info("checkpoint of step %ld written to %s (%d stage file%s%s and ckpt-%08ld.json)",
                    step, s->out_dir, stages, stages == 1 ? "" : "s",
                    replica_files ? ", a file per stage of each other replica" : "", step);
        }
    }
    free(all);
    free(own_row);
    return rc;
}

pipert_result pt_session_save_checkpoint(pipert_session *s, long step)
{
    if (s->elastic.acked_epoch != s->elastic.regrouped_epoch) {
        pt_warn("the checkpoint of step %ld is skipped: the replicas are regrouping after a "
                "departure", step);
        return PIPERT_OK;
    }
    const long departures = s->elastic.regrouped_epoch;
    pipert_result rc = save_checkpoint(s, step);
    if (rc == PIPERT_OK || !s->job.elastic || !pt_session_departures_since(s, departures))
        return rc;
    pt_warn("the checkpoint of step %ld is skipped: replicas left the job while it was written "
            "(%s)", step, pipert_last_error());
    return PIPERT_OK;
}

/* ---- resuming --------------------------------------------------------------------- */

/* Every stage's blocks in this run: bounds[s], bounds[s+1] (the stages of
 * a replica tell each other theirs). */
pipert_result pt_session_stage_bounds(pipert_session *s, int *bounds)
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

/* The replica whose files this worker resumes from: its own when the
 * checkpoint has them, its method lets replicas drift and this run has the
 * checkpoint's replicas, stages and split (`bounds`); else replica 0's, and
 * the log says why. The answer is the same on every stage of a replica. */
static int resume_replica(const pipert_session *s, const pt_checkpoint_index *index,
                          const int *bounds)
{
    const int replica = s->job.replica, stages = s->job.layout.stages;
    const int replicas = s->job.layout.replicas;
    if (replica == 0) return 0;
    if (pt_coupling_replicas_identical(s->coupling)) {
        if (index->replica_parts)
            pt_info("dp.method=%s keeps the replicas equal: replica %d resumes from replica 0's "
                    "files of step %ld, not its own",
                    pt_coupling_method_name(s->coupling), replica, index->step);
        return 0;
    }
    char why[160] = "";
    if (!index->replica_parts)
        snprintf(why, sizeof why, "the checkpoint holds replica 0's files only");
    else if (index->replicas != replicas)
        snprintf(why, sizeof why, "the checkpoint has %d replicas, this run %d", index->replicas,
                 replicas);
    else if (index->stages != stages)
        snprintf(why, sizeof why, "the checkpoint has %d stages, this run %d", index->stages, stages);
    for (int stage = 0; !why[0] && stage < stages; stage++)
        if (index->parts[stage].first_layer != bounds[stage] ||
            index->parts[stage].last_layer != bounds[stage + 1])
            snprintf(why, sizeof why, "stage %d had blocks [%d, %d), now [%d, %d)", stage,
                     index->parts[stage].first_layer, index->parts[stage].last_layer,
                     bounds[stage], bounds[stage + 1]);
    if (!why[0]) return replica;
    pt_info("replica %d resumes from replica 0's files of step %ld (%s): its parameters, optimizer "
            "and dp.method=%s state start as replica 0's, not as they were",
            replica, index->step, why, pt_coupling_method_name(s->coupling));
    return 0;
}

static pipert_result restore(pipert_session *s, const pt_checkpoint *c, const int *bounds)
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

    char why[256];
    const pt_resume_kind kind =
        pt_stage_executor_plan_resume(s->executor, &c->index, bounds, why, sizeof why);
    if (kind == PT_RESUME_RESTORE) return pt_stage_executor_restore(s->executor, same, step);
    if (kind == PT_RESUME_REFILL && stage == 0)
        pt_warn("the asynchronous pipeline starts again empty at step %ld (%s): the losses will "
                "differ from an uninterrupted run's",
                step, why);
    return pt_stage_executor_resume_at(s->executor, step);
}

/* What a resumed run's trajectory depends on: every section but the model
 * (checked to match when the tensors load), the runtime and the network,
 * less the keys that only say how often to log, validate, checkpoint or trace. */
static const char *const trajectory_keys[] = {"train.", "data.", "pipeline.", "dp.", "plan.",
                                              "seed", NULL};
static const char *const cadence_keys[] = {"train.val_every",        "train.val_batches",
                                           "train.log_every",        "train.checkpoint_every",
                                           "train.keep_checkpoints", "pipeline.trace",
                                           NULL};

/* Warns, on the job's first worker, when this run's settings differ from
 * those the checkpoint was written with (a default that changed between
 * versions, a flag left out): the run goes on, but its continuation is not
 * the one the checkpoint's run would have taken. */
static void warn_of_changed_settings(const pipert_session *s, const pt_checkpoint *c)
{
    if (s->job.stage != 0 || s->job.replica != 0) return;
    const pt_safetensors *file = c->parts[0];
    const char *text = pt_safetensors_metadata(file, "config");
    if (!text) return;
    char source[PT_CONFIG_STRING_MAX + 64], changes[1024];
    snprintf(source, sizeof source, "%s metadata \"config\"", pt_safetensors_path(file));
    pipert_config saved;
    pt_config_defaults(&saved);
    if (pt_config_merge_json(&saved, text, source) != PIPERT_OK) {
        pt_warn("%s; this run's settings are not compared with the checkpoint's",
                pipert_last_error());
        pt_error_clear();
        return;
    }
    const int n = pt_config_describe_changes(&saved, &s->config, trajectory_keys, cadence_keys,
                                             changes, sizeof changes);
    if (n > 0)
        pt_warn("resuming step %ld with %d setting%s other than the checkpoint's: %s", c->index.step,
                n, n == 1 ? "" : "s", changes);
}

pipert_result pt_session_resume(pipert_session *s, long *step)
{
    pt_checkpoint_index index;
    PT_TRY(pt_checkpoint_find_latest(s->out_dir, &index));
    *step = index.step;
    const int stages = index.stages;
    pt_checkpoint c = {0};
    int from = 0;
    int *bounds = calloc((size_t)s->job.layout.stages + 1, sizeof *bounds);
    pipert_result rc = bounds ? pt_session_stage_bounds(s, bounds)
                              : pt_fail(PIPERT_ERR_NOMEM, "resume: out of memory");
    if (rc == PIPERT_OK) {
        from = resume_replica(s, &index, bounds);
        rc = pt_checkpoint_open(&c, s->out_dir, &index, from); /* takes the index over */
    }
    if (rc == PIPERT_OK) rc = restore(s, &c, bounds);
    if (rc == PIPERT_OK) warn_of_changed_settings(s, &c);
    if (rc == PIPERT_OK)
        pt_info("resumed from the checkpoint of step %ld in %s (%d stage file%s%s)", *step,
                s->out_dir, stages, stages == 1 ? "" : "s", from > 0 ? " of this replica" : "");
    free(bounds);
    pt_checkpoint_close(&c);
    pt_checkpoint_index_free(&index);
    return rc;
}
