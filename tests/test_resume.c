/* Checkpoints of pipelines and --resume, in real processes (`pipert launch`):
 * a run of 2K steps against a run stopped after its checkpoint of step K and
 * resumed to 2K. Same layout: the same losses, for 1F1B with a flush and for
 * the asynchronous schedule (its in-flight microbatches and weight stashes
 * are saved and replayed). Another layout (2 stages into 3, another split,
 * 1 replica into 2): loading by global name, checked against independent
 * runs. An incomplete checkpoint (no index, a stage or replica file missing
 * or truncated) is never used. Replicas that drift apart (dp.method=sparse)
 * checkpoint a file each, which pruning removes with the rest; an index
 * without them (format 1) resumes every replica from replica 0's files, and
 * says so. A resume with other settings than the checkpoint's names them.
 * And, without processes: the cut of the
 * asynchronous schedule after every stage's N-th step is consistent, and the
 * resumed instruction lists (replay, then the rest) run without deadlock. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline/executor_state.h"
#include "pipeline/schedule.h"
#include "runtime/fileio.h"
#include "tests/command.h"

#define MODEL                                                                                      \
    "--model.n_layer=4 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 --train.log_every=1 "       \
    "--train.keep_checkpoints=0"
enum { K = 8, STEPS = 2 * K };

/* ---- helpers ---------------------------------------------------------------- */

/* run_pipert_ok with the workers' info lines in their logs. */
static void run_logged(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    run_pipert_ok_env("PIPERT_LOG=info", fmt, ap);
    va_end(ap);
}

/* losses[step − 1] from DIR/metrics.jsonl; the number of steps found. */
static int read_losses(const char *dir, double *losses, int n)
{
    return read_metric_steps(dir, "metrics.jsonl", "loss", losses, n);
}

/* Steps [from, STEPS] of dir's losses are within `tolerance` (relative) of
 * the reference's. SAME: the same losses — up to the last bits a reduction
 * over threads may change (they agree exactly here, to the 7 digits of
 * metrics.jsonl). */
#define SAME 1e-6
static void expect_losses(const char *reference, const char *dir, int from, double tolerance,
                          const char *what)
{
    double expected[STEPS], got[STEPS];
    cr_assert_eq(read_losses(reference, expected, STEPS), STEPS, "%s: reference steps missing", what);
    cr_assert_eq(read_losses(dir, got, STEPS), STEPS, "%s: steps missing", what);
    for (int step = from; step <= STEPS; step++) {
        const double e = expected[step - 1], g = got[step - 1];
        cr_expect(fabs(g - e) <= tolerance * fabs(e),
                  "%s, step %d: resumed loss %.9g, reference %.9g", what, step, g, e);
    }
}

static char *copy_dir(const char *dir)
{
    char *copy = make_temp_dir(), command[1200];
    snprintf(command, sizeof command, "cp -r '%s'/. '%s'/", dir, copy);
    cr_assert_eq(system(command), 0, "%s", command);
    return copy;
}

static void path_of(char *path, size_t cap, const char *dir, const char *fmt, long step)
{
    char name[128];
    snprintf(name, sizeof name, fmt, step);
    snprintf(path, cap, "%s/%s", dir, name);
}

static bool exists(const char *dir, const char *fmt, long step)
{
    char path[600];
    path_of(path, sizeof path, dir, fmt, step);
    return access(path, F_OK) == 0;
}

/* Removes the checkpoint of `step` the way pruning does: index, then files. */
static void remove_checkpoint(const char *dir, long step)
{
    char command[1200];
    snprintf(command, sizeof command, "rm '%s'/ckpt-%08ld.json && rm '%s'/ckpt-%08ld-stage-*.safetensors",
             dir, step, dir, step);
    cr_assert_eq(system(command), 0, "%s", command);
}

/* A run of STEPS steps with a checkpoint at K; then a copy of its directory
 * as a run that died after that checkpoint (the later one is gone). */
static char *run_and_cut(const char *launch_args, char **reference)
{
    *reference = make_temp_dir();
    run_pipert_ok("launch --quiet %s --out %s " MODEL " --train.steps=%d --train.checkpoint_every=%d",
           launch_args, *reference, STEPS, K);
    cr_assert(exists(*reference, "ckpt-%08ld.json", K), "no index of step %d", K);
    cr_assert(exists(*reference, "ckpt-%08ld-stage-0.safetensors", K));
    char *dir = copy_dir(*reference);
    remove_checkpoint(dir, STEPS);
    return dir;
}

static char *read_text(const char *dir, const char *name)
{
    char path[600], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    return text;
}

/* Whether DIR/NAME (a worker's log) holds `text`. */
static bool log_says(const char *dir, const char *name, const char *text)
{
    char *log = read_text(dir, name);
    const bool found = strstr(log, text) != NULL;
    free(log);
    return found;
}

/* ---- the same layout: the same losses ------------------------------------------- */

Test(resume, one_f_one_b_on_two_stages_resumes_with_the_same_losses)
{
    const char *args = "--stages 2 --replicas 1 --train.batch_size=2 --pipeline.schedule=1f1b "
                       "--pipeline.microbatches=4";
    char *reference, *dir = run_and_cut(args, &reference);
    cr_assert(exists(reference, "ckpt-%08ld-stage-1.safetensors", K));
    run_pipert_ok("launch --quiet --resume %s --out %s " MODEL " --train.steps=%d --train.checkpoint_every=%d",
           args, dir, STEPS, K);
    expect_losses(reference, dir, 1, SAME, "1f1b, 2 stages");
    cr_expect_not(log_says(dir, "logs/rank-0.log", "other than the checkpoint's"),
                  "resumed with the checkpoint's own settings, yet rank-0.log names some");
    remove_dir(reference);
    remove_dir(dir);
}

/* A resume whose settings differ from those the checkpoint was written with
 * (a default changed between versions, a flag left out) goes on, and the first
 * worker's log names each setting that shapes the run, with both values; how
 * often it logs is not one of them. */
Test(resume, other_settings_than_the_checkpoints_are_named)
{
    const char *args = "--stages 2 --replicas 1 --train.batch_size=2 --pipeline.schedule=async-1f1b";
    char *reference, *dir = run_and_cut(args, &reference);
    run_pipert_ok("launch --quiet --resume %s --out %s " MODEL " --train.steps=%d "
                  "--train.checkpoint_every=%d --train.lr=5e-4 --pipeline.lookahead=nesterov "
                  "--train.log_every=2",
                  args, dir, STEPS, K);
    char *log = read_text(dir, "logs/rank-0.log");
    const char *line = strstr(log, "resuming step 8 with 2 settings other than the checkpoint's: ");
    cr_assert_not_null(line, "rank-0.log: %s", log);
    const char *end = strchr(line, '\n');
    const int length = end ? (int)(end - line) : (int)strlen(line);
    char said[1024];
    snprintf(said, sizeof said, "%.*s", length, line);
    cr_expect(strstr(said, "train.lr 0.001 -> 0.0005"), "%s", said);
    cr_expect(strstr(said, "pipeline.lookahead \"nesterov-dc\" -> \"nesterov\""), "%s", said);
    cr_expect_null(strstr(said, "log_every"), "%s", said);
    free(log);
    cr_expect_not(log_says(dir, "logs/rank-1.log", "other than the checkpoint's"),
                  "said by stage 1 too");
    remove_dir(reference);
    remove_dir(dir);
}

static void check_asynchronous(const char *args, const char *what)
{
    char *reference, *dir = run_and_cut(args, &reference);
    run_logged("launch --quiet --resume %s --out %s " MODEL
               " --train.steps=%d --train.checkpoint_every=%d",
               args, dir, STEPS, K);
    expect_losses(reference, dir, 1, SAME, what);
    char *log = read_text(dir, "logs/rank-0.log");
    cr_expect(strstr(log, "continued the asynchronous schedule at step 8"), "%s: rank-0.log: %s",
              what, log);
    free(log);
    remove_dir(reference);
    remove_dir(dir);
}

/* check_asynchronous on 3 stages, batch 2, with one more setting. */
static void check_three_stages(const char *setting)
{
    char args[256], what[256];
    snprintf(args, sizeof args,
             "--stages 3 --replicas 1 --train.batch_size=2 --pipeline.schedule=async-1f1b %s",
             setting);
    snprintf(what, sizeof what, "async-1f1b, 3 stages, %s", setting);
    check_asynchronous(args, what);
}

/* The default look-ahead (nesterov-dc): stage 0 has one microbatch in flight at
 * its cut, whose stash and forward must come back. */
Test(resume, asynchronous_pipeline_resumes_with_the_same_losses)
{
    check_asynchronous("--stages 2 --replicas 1 --train.batch_size=2 "
                       "--pipeline.schedule=async-1f1b",
                       "async-1f1b, 2 stages, nesterov-dc");
}

/* Three stages: two microbatches in flight at stage 0, a middle stage that
 * replays from its predecessor's replay; weight prediction (its stashes are
 * ŵ and its staleness estimate is state), with recomputation, also in bf16 (the
 * replays cross in bf16 too: pipeline/transfer.c); and 2 replicas, which restore
 * replica 0's stashes. */
Test(resume, asynchronous_pipeline_resumes_exactly_with_three_stages_or_two_replicas)
{
    check_asynchronous("--stages 3 --replicas 1 --train.batch_size=2 "
                       "--pipeline.schedule=async-1f1b --pipeline.lookahead=predict "
                       "--pipeline.recompute=true",
                       "async-1f1b, 3 stages, predict, recompute");
    check_asynchronous("--stages 3 --replicas 1 --train.batch_size=2 "
                       "--pipeline.schedule=async-1f1b --pipeline.lookahead=predict "
                       "--pipeline.recompute=true --runtime.precision=bf16",
                       "async-1f1b, 3 stages, predict, recompute, bf16 between the stages");
    check_asynchronous("--stages 2 --replicas 2 --train.batch_size=2 "
                       "--pipeline.schedule=async-1f1b --pipeline.lookahead=stash",
                       "async-1f1b, 2 stages x 2 replicas, stash");
}

/* The damped prediction keeps state of its own (the measured update size per tensor) that
 * the checkpoint must carry for the losses to continue exactly; DC-ASGD compensates with the
 * restored stashes (so does nesterov-dc, on NAdam's moments); PipeMare's step size depends on
 * the step only; nesterov-secant's running secant and previous pair are state (it compensates
 * from its third pair on here, so before and after the cut at step 8). */
Test(resume, staleness_aware_lookaheads_resume_with_the_same_losses)
{
    const char *lookaheads[] = {"predict-damped", "dc-asgd", "pipemare", "nesterov-dc",
                                "nesterov-secant --pipeline.lookahead_warmup=2"};
    for (int k = 0; k < 5; k++) {
        char setting[128];
        snprintf(setting, sizeof setting, "--pipeline.lookahead=%s --train.warmup_steps=4",
                 lookaheads[k]);
        check_three_stages(setting);
    }
}

/* pipeline.sync_steps: a checkpoint inside the synchronous steps (nothing in flight; the
 * rest of them stay synchronous after the resume) and one soon after them (the pipeline
 * filled from microbatch 5 holds its microbatches in flight). */
Test(resume, synchronous_first_steps_resume_with_the_same_losses)
{
    check_three_stages("--pipeline.sync_steps=12");
    check_three_stages("--pipeline.sync_steps=5");
}

/* ---- another layout: loading by global name ------------------------------------------- */

/* A flush pipeline equals single-worker training whatever its stages, so a
 * 2-stage checkpoint resumed on 3 stages (or under another split) continues
 * the 2-stage run's losses (to the 1e-5 of the pipeline tests). */
Test(resume, two_stages_resume_on_three_stages_and_under_another_split)
{
    const char *flush = "--train.batch_size=2 --pipeline.schedule=1f1b --pipeline.microbatches=4";
    char args[256];
    snprintf(args, sizeof args, "--stages 2 --replicas 1 %s", flush);
    char *reference, *dir = run_and_cut(args, &reference);
    char *split = copy_dir(dir);
    run_pipert_ok("launch --quiet --resume --stages 3 --replicas 1 %s --out %s " MODEL
           " --train.steps=%d --train.checkpoint_every=%d",
           flush, dir, STEPS, K);
    expect_losses(reference, dir, K + 1, 1e-5, "2 stages resumed on 3");
    cr_expect(exists(dir, "ckpt-%08ld-stage-2.safetensors", STEPS), "3 stages wrote no third file");
    char *index = read_text(dir, "ckpt-00000016.json");
    cr_expect(strstr(index, "\"stages\": 3"), "index of step 16: %s", index);
    free(index);

    run_pipert_ok("launch --quiet --resume --stages 2 --replicas 1 --plan.layers=3,1 %s --out %s " MODEL
           " --train.steps=%d --train.checkpoint_every=%d",
           flush, split, STEPS, K);
    expect_losses(reference, split, K + 1, 1e-5, "split [0,2),[2,4) resumed as [0,3),[3,4)");
    remove_dir(reference);
    remove_dir(dir);
    remove_dir(split);
}

/* R replicas of batch B draw exactly the data of one worker of batch R·B, so
 * a 1-replica checkpoint resumed by 2 replicas must continue like a single
 * worker of batch 2B resumed from the same checkpoint — two independent
 * loaders and engines (a 2×2 pipeline with its coupling, one worker) reading
 * a 2-stage checkpoint. The single worker at the original batch must also
 * continue the original run: loading into one stage loses nothing. */
Test(resume, one_replica_resumes_as_two)
{
    const char *flush = "--pipeline.schedule=1f1b --pipeline.microbatches=2";
    char args[256];
    snprintf(args, sizeof args, "--stages 2 --replicas 1 --train.batch_size=2 %s", flush);
    char *reference, *dir = run_and_cut(args, &reference);
    char *single = copy_dir(dir), *single_same_batch = copy_dir(dir);
    run_pipert_ok("launch --quiet --resume --stages 2 --replicas 2 --train.batch_size=2 %s --out %s " MODEL
           " --train.steps=%d --train.checkpoint_every=%d",
           flush, dir, STEPS, K);
    run_pipert_ok("train --quiet --resume --out %s " MODEL " --train.batch_size=4 --train.grad_accum=2 "
           "--runtime.threads=1 --train.steps=%d --train.checkpoint_every=%d",
           single, STEPS, K);
    expect_losses(single, dir, K + 1, 1e-5, "2 replicas of batch 2 against one worker of batch 4");
    /* Only replica 0 writes: one file per stage. */
    cr_expect(exists(dir, "ckpt-%08ld-stage-1.safetensors", STEPS));
    cr_expect_not(exists(dir, "ckpt-%08ld-stage-2.safetensors", STEPS));

    run_pipert_ok("train --quiet --resume --out %s " MODEL " --train.batch_size=2 --train.grad_accum=2 "
           "--runtime.threads=1 --train.steps=%d --train.checkpoint_every=%d",
           single_same_batch, STEPS, K);
    expect_losses(reference, single_same_batch, K + 1, 1e-5, "2 stages resumed by one worker");
    remove_dir(reference);
    remove_dir(dir);
    remove_dir(single);
    remove_dir(single_same_batch);
}

/* The asynchronous schedule under another stage count starts again from an
 * empty pipeline: it warns, and continues from the checkpoint's parameters
 * (its losses stay within 1 % of the uninterrupted run's; a fresh model's
 * are 10 % higher). */
Test(resume, asynchronous_two_stages_resume_on_three_from_an_empty_pipeline)
{
    char *reference, *dir = run_and_cut("--stages 2 --replicas 1 --train.batch_size=2 "
                                        "--pipeline.schedule=async-1f1b",
                                        &reference);
    run_pipert_ok("launch --quiet --resume --stages 3 --replicas 1 --train.batch_size=2 "
           "--pipeline.schedule=async-1f1b --out %s " MODEL
           " --train.steps=%d --train.checkpoint_every=%d",
           dir, STEPS, K);
    expect_losses(reference, dir, K + 1, 1e-2, "async, 2 stages resumed on 3");
    cr_expect(log_says(dir, "logs/rank-0.log",
                       "starts again empty at step 8 (the checkpoint has 2 stages, this run 3)"),
              "rank-0.log does not say the pipeline starts again empty");
    remove_dir(reference);
    remove_dir(dir);
}

/* ---- incomplete checkpoints ------------------------------------------------------------ */

static void truncate_file(const char *path, size_t cut)
{
    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(path, &bytes, &size), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_write_file_atomic(path, bytes, size - cut), PIPERT_OK);
    free(bytes);
}

/* Checkpoints at 4, 8, 12 and 16. The index of 16 is missing (the job died
 * before stage 0 wrote it), and a stage file of 12 is truncated (the disk
 * filled): resume passes both by, naming what is wrong, and continues from 8
 * with the same losses. With every checkpoint broken it fails, naming the
 * file. */
Test(resume, incomplete_checkpoints_are_not_used)
{
    const char *args = "--stages 2 --replicas 1 --train.batch_size=2 --pipeline.schedule=1f1b "
                       "--pipeline.microbatches=2";
    char *reference = make_temp_dir(), path[600];
    run_pipert_ok("launch --quiet %s --out %s " MODEL " --train.steps=%d --train.checkpoint_every=4", args,
           reference, STEPS);
    char *dir = copy_dir(reference);
    path_of(path, sizeof path, dir, "ckpt-%08ld.json", 16);
    cr_assert_eq(unlink(path), 0);
    path_of(path, sizeof path, dir, "ckpt-%08ld-stage-1.safetensors", 12);
    truncate_file(path, 100);
    run_logged("launch --quiet --resume %s --out %s " MODEL
               " --train.steps=%d --train.checkpoint_every=4",
               args, dir, STEPS);
    expect_losses(reference, dir, 1, SAME, "resumed past two incomplete checkpoints");
    char *log = read_text(dir, "logs/rank-0.log");
    cr_expect(strstr(log, "ckpt-00000012-stage-1.safetensors has"), "rank-0.log: %s", log);
    cr_expect(strstr(log, "resumed from the checkpoint of step 8"), "rank-0.log: %s", log);
    free(log);

    /* Nothing complete left: 16 has no index, each other one lacks a file. */
    path_of(path, sizeof path, dir, "ckpt-%08ld.json", 16);
    cr_assert_eq(unlink(path), 0);
    for (long step = 4; step <= 12; step += 4) {
        path_of(path, sizeof path, dir, "ckpt-%08ld-stage-0.safetensors", step);
        cr_assert_eq(unlink(path), 0, "%s", path);
    }
    run_result r = run_pipert("launch --quiet --resume %s --out %s " MODEL
                              " --train.steps=%d --train.checkpoint_every=4",
                              args, dir, STEPS);
    cr_expect_neq(r.status, 0, "resumed from nothing");
    log = read_text(dir, "logs/rank-0.log");
    cr_expect(strstr(log, "no complete checkpoint") && strstr(log, "ckpt-00000012-stage-0.safetensors"),
              "rank-0.log: %s", log);
    free(log);
    remove_dir(reference);
    remove_dir(dir);
}

/* keep_checkpoints counts whole checkpoints: index, stage and replica files
 * go together (2 stages of 2 replicas that drift apart, each writing its
 * own), a replica file of an earlier step that no index lists goes too, and
 * nothing temporary is left. */
Test(resume, old_checkpoints_go_whole)
{
    const char *layouts[] = {"--stages 2 --replicas 1", "--stages 2 --replicas 2 --dp.method=sparse"};
    for (int k = 0; k < 2; k++) {
        const bool replica_files = k == 1;
        char *dir = make_temp_dir(), orphan[600];
        path_of(orphan, sizeof orphan, dir, "ckpt-%08ld-stage-1-replica-1.safetensors", 1);
        cr_assert_eq(pt_write_file_atomic(orphan, "x", 1), PIPERT_OK);
        run_pipert_ok("launch --quiet %s --train.batch_size=2 --pipeline.schedule=1f1b --out %s " MODEL
                      " --train.steps=8 --train.checkpoint_every=2 --train.keep_checkpoints=2",
                      layouts[k], dir);
        for (long step = 2; step <= 8; step += 2) {
            const bool kept = step >= 6;
            cr_expect_eq(exists(dir, "ckpt-%08ld.json", step), kept, "index of step %ld", step);
            for (int stage = 0; stage < 2; stage++) {
                char format[64];
                snprintf(format, sizeof format, "ckpt-%%08ld-stage-%d.safetensors", stage);
                cr_expect_eq(exists(dir, format, step), kept, "%s: step %ld", layouts[k], step);
                snprintf(format, sizeof format, "ckpt-%%08ld-stage-%d-replica-1.safetensors", stage);
                cr_expect_eq(exists(dir, format, step), kept && replica_files,
                             "%s: replica 1 of stage %d, step %ld", layouts[k], stage, step);
            }
        }
        cr_expect_eq(access(orphan, F_OK), -1, "%s: left behind: %s", layouts[k], orphan);
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d));)
            cr_expect(strstr(e->d_name, ".tmp.") == NULL, "left behind: %s", e->d_name);
        if (d) closedir(d);
        remove_dir(dir);
    }
}

/* ---- replica files ------------------------------------------------------------------------ */

#define SPARSE "--stages 1 --replicas 2 --train.batch_size=2 --dp.method=sparse --dp.delay=2"

/* Checkpoints at 4, 8, 12 and 16 of two sparse replicas, each index listing
 * replica 1's file. The run died after 12 (16 is gone) and replica 1's file
 * of 12 is truncated (the disk filled): the checkpoint of 12 is incomplete
 * like one with a stage file short, so resume passes it by, naming the file,
 * and continues from 8 — exactly, every replica from its own file. With
 * every checkpoint lacking its replica file it fails, naming the file. A
 * missing replica file is never made up for with replica 0's: that would
 * continue silently unlike the run that wrote it. */
Test(resume, a_checkpoint_without_its_replica_file_is_not_used)
{
    char *reference = make_temp_dir(), path[600];
    run_pipert_ok("launch --quiet " SPARSE " --out %s " MODEL
                  " --train.steps=%d --train.checkpoint_every=4",
                  reference, STEPS);
    char *index = read_text(reference, "ckpt-00000008.json");
    cr_expect(strstr(index, "\"pipert-checkpoint-index-2\"") &&
                  strstr(index, "\"replica_files\"") &&
                  strstr(index, "\"ckpt-00000008-stage-0-replica-1.safetensors\""),
              "ckpt-00000008.json lists no replica file: %s", index);
    free(index);
    char *dir = copy_dir(reference);
    remove_checkpoint(dir, STEPS);
    path_of(path, sizeof path, dir, "ckpt-%08ld-stage-0-replica-1.safetensors", 12);
    truncate_file(path, 100);
    run_logged("launch --quiet --resume " SPARSE " --out %s " MODEL
               " --train.steps=%d --train.checkpoint_every=4",
               dir, STEPS);
    expect_losses(reference, dir, 1, SAME, "resumed past a truncated replica file");
    expect_same_tensors(reference, dir, "ckpt-00000016-stage-0-replica-1.safetensors",
                        "replica 1 at the end, resumed past a truncated replica file");
    for (int rank = 0; rank < 2; rank++) {
        char name[32];
        snprintf(name, sizeof name, "logs/rank-%d.log", rank);
        char *log = read_text(dir, name);
        cr_expect(strstr(log, "ckpt-00000012-stage-0-replica-1.safetensors has"), "%s: %s", name, log);
        cr_expect(strstr(log, rank == 0 ? "resumed from the checkpoint of step 8 in"
                                        : "(1 stage file of this replica)"),
                  "%s: %s", name, log);
        free(log);
    }

    /* Nothing complete left: 16 has no index, each other one lacks replica 1's file. */
    path_of(path, sizeof path, dir, "ckpt-%08ld.json", 16);
    cr_assert_eq(unlink(path), 0);
    for (long step = 4; step <= 12; step += 4) {
        path_of(path, sizeof path, dir, "ckpt-%08ld-stage-0-replica-1.safetensors", step);
        cr_assert_eq(unlink(path), 0, "%s", path);
    }
    run_result r = run_pipert("launch --quiet --resume " SPARSE " --out %s " MODEL
                              " --train.steps=%d --train.checkpoint_every=4",
                              dir, STEPS);
    cr_expect_neq(r.status, 0, "resumed without replica 1's files");
    char *log = read_text(dir, "logs/rank-1.log");
    cr_expect(strstr(log, "no complete checkpoint") &&
                  strstr(log, "ckpt-00000012-stage-0-replica-1.safetensors is missing"),
              "rank-1.log: %s", log);
    free(log);
    remove_dir(reference);
    remove_dir(dir);
}

/* An index of format 1 — written before replicas had files of their own —
 * of sparse replicas still loads: every replica resumes from replica 0's
 * files, replica 1's log says so and why, and the run goes on (not as the
 * uninterrupted one: replica 1's own state is lost); its new checkpoints
 * list replica files again. */
Test(resume, an_index_without_replica_files_resumes_every_replica_from_replica_0)
{
    char *reference = make_temp_dir();
    run_pipert_ok("launch --quiet " SPARSE " --out %s " MODEL
                  " --train.steps=%d --train.checkpoint_every=%d",
                  reference, STEPS, K);
    char *dir = copy_dir(reference), path[600];
    remove_checkpoint(dir, STEPS);
    path_of(path, sizeof path, dir, "ckpt-%08ld.json", K);
    json_t *index = json_load_file(path, 0, NULL);
    cr_assert_not_null(index, "%s", path);
    json_object_set_new(index, "format", json_string("pipert-checkpoint-index-1"));
    cr_assert_eq(json_object_del(index, "replica_files"), 0, "%s lists no replica files", path);
    cr_assert_eq(json_dump_file(index, path, JSON_INDENT(1)), 0);
    json_decref(index);
    path_of(path, sizeof path, dir, "ckpt-%08ld-stage-0-replica-1.safetensors", K);
    cr_assert_eq(unlink(path), 0, "%s", path);

    run_logged("launch --quiet --resume " SPARSE " --out %s " MODEL
               " --train.steps=%d --train.checkpoint_every=%d",
               dir, STEPS, K);
    char *log = read_text(dir, "logs/rank-1.log");
    cr_expect(strstr(log, "replica 1 resumes from replica 0's files of step 8 (the checkpoint holds "
                          "replica 0's files only)"),
              "rank-1.log: %s", log);
    free(log);
    double losses[STEPS];
    cr_expect_eq(read_losses(dir, losses, STEPS), STEPS, "the resumed run did not finish");
    cr_expect(exists(dir, "ckpt-%08ld-stage-0-replica-1.safetensors", STEPS),
              "no replica file of step %d", STEPS);
    remove_dir(reference);
    remove_dir(dir);
}

/* ---- the cut of the asynchronous schedule, without processes ------------------------- */

/* For every S, M, `sync` synchronous microbatches first and N: each stage's cut
 * after its N-th step is consistent (pt_schedule_replay checks it against the
 * neighbours), one activation per boundary crosses it in the steady state
 * (none while the synchronous steps last), and the resumed lists — replay,
 * then the rest of the schedule — match every send with one receive and do
 * not deadlock. */
Test(resume, the_asynchronous_cut_is_consistent_and_the_resumed_lists_run)
{
    const int sizes[] = {1, 2, 3, 5, 8, 13};
    for (int S = 1; S <= 6; S++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (int sync = 0; sync <= sizes[k]; sync += sync < 3 ? 1 : 5) {
            const int M = sizes[k];
            for (int N = 0; N <= M; N++) {
                pt_schedule resumed[6];
                for (int s = 0; s < S; s++) {
                    pt_schedule full;
                    cr_assert_eq(pt_schedule_build_async(&full, S, M, s, sync), PIPERT_OK);
                    pt_instruction *replay;
                    int count, cursor;
                    cr_assert_eq(pt_schedule_replay(&full, N, &replay, &count, &cursor),
                                 PIPERT_OK, "S=%d M=%d sync=%d N=%d stage %d: %s", S, M, sync, N, s,
                                 pipert_last_error());
                    resumed[s] = full;
                    resumed[s].instructions = calloc((size_t)(count + full.count - cursor) + 1,
                                                     sizeof *resumed[s].instructions);
                    if (count) memcpy(resumed[s].instructions, replay, (size_t)count * sizeof *replay);
                    memcpy(resumed[s].instructions + count, full.instructions + cursor,
                           (size_t)(full.count - cursor) * sizeof *replay);
                    resumed[s].count = count + full.count - cursor;
                    int sends = 0;
                    for (int i = 0; i < count; i++) sends += replay[i].kind == PT_SEND_ACTIVATION;
                    const bool steady = N >= sync + 1 && N + S - 1 <= M;
                    if (steady && s < S - 1)
                        cr_expect_eq(sends, S - 1 - s, "S=%d M=%d sync=%d N=%d stage %d: %d "
                                                       "activations sent again", S, M, sync, N, s, sends);
                    if (N <= sync)
                        cr_expect_eq(count, 0, "S=%d M=%d sync=%d N=%d stage %d: %d instructions "
                                               "replayed in the synchronous steps", S, M, sync, N, s, count);
                    free(replay);
                    pt_schedule_free(&full);
                }
                pt_simulation sim = pt_schedule_simulate(resumed, S, 1.0, 2.0);
                cr_expect(!sim.deadlocked && !sim.problem[0], "S=%d M=%d sync=%d N=%d: %s", S, M, sync,
                          N, sim.problem);
                for (int s = 0; s < S; s++) free(resumed[s].instructions);
            }
            }
}

/* The cut itself: after N steps stage s of S has S−1−s microbatches in
 * flight (the steady state), the oldest first. */
Test(resume, stage_s_holds_S_minus_1_minus_s_microbatches_at_its_cut)
{
    pt_schedule schedule;
    for (int s = 0; s < 4; s++) {
        cr_assert_eq(pt_schedule_build(&schedule, PT_SCHEDULE_ASYNC_1F1B, 4, 20, s), PIPERT_OK);
        pt_schedule_cut cut;
        cr_assert_eq(pt_schedule_cut_at(&schedule, 7, &cut), PIPERT_OK);
        cr_expect_eq(cut.n_in_flight, 3 - s, "stage %d: %d in flight", s, cut.n_in_flight);
        for (int i = 0; i < cut.n_in_flight; i++) cr_expect_eq(cut.in_flight[i], 7 + i);
        cr_expect_eq(schedule.instructions[cut.cursor - 1].kind, PT_OPTIMIZER_STEP);
        pt_schedule_cut_free(&cut);
        pt_schedule_free(&schedule);
    }
}
