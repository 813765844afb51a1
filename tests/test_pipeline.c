/* The pipeline engine in real processes (`pipert launch --stages S`):
 * 1F1B with flush and GPipe on S workers equal single-worker training on the
 * same global batch (1e-5 relative per step, 20 steps, S = 2 and 4), also
 * with recomputation and with data-parallel replicas; the asynchronous
 * schedule trains with every look-ahead and measures the staleness S−1−s, its
 * synchronous first steps equal one worker's, nesterov-secant learns from its
 * asynchronous pairs only, and it validates while it runs (against the drained
 * validation and one worker's, on weights that do not move); the run leaves a
 * merged trace. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tests/command.h"

#define MODEL                                                                                      \
    "--model.n_layer=4 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 --train.log_every=1"
enum { STEPS = 20 };

static void expect_same_losses(const char *reference, const char *dir, const char *what)
{
    double expected[STEPS], got[STEPS];
    cr_assert_eq(read_metric_steps(reference, "metrics.jsonl", "loss", expected, STEPS), STEPS);
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", got, STEPS), STEPS, "%s: steps missing", what);
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabs(got[i] - expected[i]) <= 1e-5 * fabs(expected[i]),
                  "%s, step %d: %.9g, single worker %.9g", what, i + 1, got[i], expected[i]);
}

/* One worker, batch B·R, M microbatches accumulated: the reference. */
static char *single_worker(int batch, int microbatches)
{
    char *dir = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " MODEL " --train.steps=%d --train.batch_size=%d "
               "--train.grad_accum=%d --runtime.threads=1",
               dir, STEPS, batch, microbatches);
    return dir;
}

static void check_flush_schedule(const char *schedule, int stages, int replicas, const char *extra)
{
    const int M = 4, B = 2;
    char *reference = single_worker(B * replicas, M), *dir = make_temp_dir();
    run_pipert_ok("launch --quiet --stages %d --replicas %d --out %s " MODEL " --train.steps=%d "
               "--train.batch_size=%d --pipeline.schedule=%s --pipeline.microbatches=%d %s",
               stages, replicas, dir, STEPS, B, schedule, M, extra);
    char what[160];
    snprintf(what, sizeof what, "%s, %d stages × %d replicas %s", schedule, stages, replicas, extra);
    expect_same_losses(reference, dir, what);
    remove_dir(reference);
    remove_dir(dir);
}

Test(pipeline, one_f_one_b_on_two_stages_equals_one_worker) { check_flush_schedule("1f1b", 2, 1, ""); }
Test(pipeline, one_f_one_b_on_four_stages_equals_one_worker) { check_flush_schedule("1f1b", 4, 1, ""); }
Test(pipeline, gpipe_on_two_stages_equals_one_worker) { check_flush_schedule("gpipe", 2, 1, ""); }
Test(pipeline, gpipe_on_four_stages_equals_one_worker) { check_flush_schedule("gpipe", 4, 1, ""); }
Test(pipeline, recomputation_changes_nothing)
{
    check_flush_schedule("1f1b", 4, 1, "--pipeline.recompute=true");
}
Test(pipeline, stages_and_replicas_together_equal_one_worker)
{
    check_flush_schedule("1f1b", 2, 2, "");
}
Test(pipeline, an_explicit_uneven_split_equals_one_worker)
{
    check_flush_schedule("1f1b", 2, 1, "--plan.layers=3,1");
}

/* pipeline.transfer (pipeline/transfer.c): under runtime.precision=bf16 the stages exchange
 * bf16 by default: each stage sends M·B·T·C·2 bytes a step fewer than in fp32 (metrics'
 * bytes_site; stage 0 the activations, stage 1 their gradients), and trains as the fp32
 * exchange does within bf16's rounding, which does act (some loss differs). With
 * pipeline.transfer=fp32 a bf16 pipeline equals one bf16 worker. */
Test(pipeline, bf16_between_stages_halves_the_bytes_of_fp32)
{
    enum { M = 4, B = 2, T = 32, C = 32 };
    const char *bf16 = "--runtime.precision=bf16 --runtime.threads=1";
    char *reference = make_temp_dir(), *in_fp32 = make_temp_dir(), *in_bf16 = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " MODEL " --train.steps=%d --train.batch_size=%d "
                  "--train.grad_accum=%d %s", reference, STEPS, B, M, bf16);
    const char *launch = "launch --quiet --stages 2 --out %s " MODEL " --train.steps=%d "
                         "--train.batch_size=%d --pipeline.schedule=1f1b "
                         "--pipeline.microbatches=%d %s %s";
    run_pipert_ok(launch, in_fp32, STEPS, B, M, bf16, "--pipeline.transfer=fp32");
    run_pipert_ok(launch, in_bf16, STEPS, B, M, bf16, "");
    expect_same_losses(reference, in_fp32, "bf16, 2 stages, pipeline.transfer=fp32");
    for (int stage = 0; stage < 2; stage++) {
        char file[64];
        snprintf(file, sizeof file, "metrics-stage-%d.jsonl", stage);
        double wide[STEPS], narrow[STEPS];
        cr_assert_eq(read_metric_steps(in_fp32, file, "bytes_site", wide, STEPS), STEPS);
        cr_assert_eq(read_metric_steps(in_bf16, file, "bytes_site", narrow, STEPS), STEPS);
        for (int i = 0; i < STEPS; i++)
            cr_expect_eq(wide[i] - narrow[i], (double)M * B * T * C * 2,
                         "stage %d, step %d: %.0f bytes sent in fp32, %.0f in bf16", stage, i + 1,
                         wide[i], narrow[i]);
    }
    double exact[STEPS], rounded[STEPS];
    cr_assert_eq(read_metric_steps(in_fp32, "metrics.jsonl", "loss", exact, STEPS), STEPS);
    cr_assert_eq(read_metric_steps(in_bf16, "metrics.jsonl", "loss", rounded, STEPS), STEPS);
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        differ += rounded[i] != exact[i];
        cr_expect(fabs(rounded[i] - exact[i]) <= 1e-2 * exact[i],
                  "step %d: %.6f exchanging bf16, %.6f fp32", i + 1, rounded[i], exact[i]);
    }
    cr_expect_gt(differ, 0, "bf16 between stages changed no loss: was anything rounded?");
    remove_dir(reference);
    remove_dir(in_fp32);
    remove_dir(in_bf16);
}

/* The asynchronous pipeline trains (the loss falls) with every look-ahead,
 * and stage s measures the staleness S−1−s the schedule implies. */
Test(pipeline, asynchronous_schedule_measures_its_staleness)
{
    const char *lookaheads[] = {"none",           "stash",    "nesterov", "nesterov-dc",
                                "predict",        "predict-damped", "pipemare", "dc-asgd",
                                "nesterov-secant --pipeline.lookahead_warmup=2"};
    for (int k = 0; k < (int)(sizeof lookaheads / sizeof lookaheads[0]); k++) {
        char *dir = make_temp_dir();
        run_pipert_ok("launch --quiet --stages 4 --replicas 1 --out %s " MODEL " --train.steps=%d "
                   "--train.batch_size=4 --pipeline.schedule=async-1f1b --pipeline.lookahead=%s",
                   dir, 3 * STEPS, lookaheads[k]);
        double loss[3 * STEPS];
        cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", loss, 3 * STEPS), 3 * STEPS);
        cr_expect_lt(loss[3 * STEPS - 1], loss[0] - 0.3, "%s: the loss did not fall (%g → %g)",
                     lookaheads[k], loss[0], loss[3 * STEPS - 1]);
        for (int s = 0; s < 4; s++) {
            char file[64];
            double staleness[3 * STEPS];
            snprintf(file, sizeof file, "metrics-stage-%d.jsonl", s);
            cr_assert_eq(read_metric_steps(dir, file, "staleness", staleness, 3 * STEPS), 3 * STEPS);
            cr_expect_float_eq(staleness[3 * STEPS - 1], 3.0 - s, 1e-9, "%s: stage %d staleness %g",
                               lookaheads[k], s, staleness[3 * STEPS - 1]);
        }
        remove_dir(dir);
    }
}

/* The pairs stage `stage`'s secant learned from, as its checkpoint of the last step says
 * (the stage file's "pipeline" metadata, a JSON text inside the header). */
static long secant_pairs_in_checkpoint(const char *dir, int stage)
{
    char path[512], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/ckpt-%08d-stage-%d.safetensors", dir, STEPS, stage);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", path);
    const char *at = memmem(text, size, "secant_pairs", strlen("secant_pairs"));
    cr_assert_not_null(at, "%s holds no secant_pairs", path);
    at += strcspn(at, "0123456789");
    long pairs = strtol(at, NULL, 10);
    free(text);
    return pairs;
}

/* nesterov-secant learns from asynchronous pairs only: with pipeline.sync_steps = K its
 * secant starts at the first asynchronous backward (K + 1), which only records its pair,
 * because the step between the forwards of microbatches K − 1 and K used the gradient of
 * K − 1 (train/secant.h). So after STEPS steps each stashing stage counts STEPS − K pairs
 * (the pairs counter includes the first backward, which learns nothing); all STEPS if the
 * synchronous steps were learned from, STEPS − K + 1 if the junction pair were. */
Test(pipeline, secant_learns_from_asynchronous_pairs_only)
{
    enum { SYNC = 7 };
    char *dir = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 3 --replicas 1 --out %s " MODEL " --train.steps=%d "
                  "--train.batch_size=2 --pipeline.schedule=async-1f1b "
                  "--pipeline.lookahead=nesterov-secant --pipeline.sync_steps=%d "
                  "--train.checkpoint_every=%d",
                  dir, STEPS, SYNC, STEPS);
    for (int s = 0; s < 2; s++) {
        const long pairs = secant_pairs_in_checkpoint(dir, s);
        cr_expect_eq(pairs, STEPS - SYNC, "stage %d: %ld pairs", s, pairs);
    }
    remove_dir(dir);
}

/* pipeline.sync_steps: the asynchronous schedule's first steps pass one microbatch at a
 * time, so they are a single worker's steps (clipping off: a pipeline clips each stage's
 * own norm); afterwards the pipeline fills and stage s measures S−1−s again. */
Test(pipeline, synchronous_steps_of_the_asynchronous_schedule_equal_one_worker)
{
    enum { SYNC = 8 };
    char *reference = make_temp_dir(), *dir = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " MODEL " --train.steps=%d --train.batch_size=2 "
                  "--train.grad_clip=0 --runtime.threads=1",
                  reference, STEPS);
    run_pipert_ok("launch --quiet --stages 4 --replicas 1 --out %s " MODEL " --train.steps=%d "
                  "--train.batch_size=2 --train.grad_clip=0 --pipeline.schedule=async-1f1b "
                  "--pipeline.lookahead=stash --pipeline.sync_steps=%d",
                  dir, STEPS, SYNC);
    double expected[STEPS], got[STEPS];
    cr_assert_eq(read_metric_steps(reference, "metrics.jsonl", "loss", expected, STEPS), STEPS);
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", got, STEPS), STEPS);
    for (int i = 0; i < SYNC; i++)
        cr_expect(fabs(got[i] - expected[i]) <= 1e-5 * fabs(expected[i]),
                  "synchronous step %d: %.9g, single worker %.9g", i + 1, got[i], expected[i]);
    int differ = 0;
    for (int i = SYNC; i < STEPS; i++) differ += fabs(got[i] - expected[i]) > 1e-5 * fabs(expected[i]);
    cr_expect_gt(differ, 0, "the steps after the synchronous ones are a single worker's too");
    for (int s = 0; s < 4; s++) {
        char file[64];
        double staleness[STEPS];
        snprintf(file, sizeof file, "metrics-stage-%d.jsonl", s);
        cr_assert_eq(read_metric_steps(dir, file, "staleness", staleness, STEPS), STEPS);
        for (int i = 0; i < SYNC; i++)
            cr_expect_float_eq(staleness[i], 0.0, 1e-12, "stage %d, synchronous step %d: %g", s,
                               i + 1, staleness[i]);
        cr_expect_float_eq(staleness[STEPS - 1], 3.0 - s, 1e-9, "stage %d: staleness %g", s,
                           staleness[STEPS - 1]);
    }
    remove_dir(reference);
    remove_dir(dir);
}

/* Validation while the asynchronous schedule runs (pipeline/validation.c). With a step too
 * small to move any weight (lr 1e-30 against weights of ~0.02: below half an ulp), every
 * validation must give the loss of the initial model: each wave's equals the final drained
 * validation's and a single worker's, bitwise. With a real learning rate the waves still
 * come, one per train.val_every steps, finite and falling, and they do not depend on timing:
 * a second run gives the same values, bitwise. */
Test(pipeline, asynchronous_schedule_validates_while_it_runs)
{
    char *pipeline = make_temp_dir(), *alone = make_temp_dir(), *learning = make_temp_dir(),
         *again = make_temp_dir();
    const char *frozen = " --train.steps=30 --train.val_every=10 --train.val_batches=3 "
                         "--train.batch_size=4 --train.lr=1e-30";
    run_pipert_ok("launch --quiet --stages 4 --replicas 1 --out %s " MODEL
                  " --pipeline.schedule=async-1f1b %s", pipeline, frozen);
    run_pipert_ok("launch --quiet --stages 1 --replicas 1 --out %s " MODEL " %s", alone, frozen);
    double waves[30], reference[30];
    cr_assert_eq(read_metric_steps(pipeline, "metrics.jsonl", "val_loss", waves, 30), 3,
                 "validations at steps 10, 20 (while running) and 30 (the end)");
    cr_assert_eq(read_metric_steps(alone, "metrics.jsonl", "val_loss", reference, 30), 3);
    for (int step = 10; step <= 30; step += 10)
        cr_expect_eq(waves[step - 1], reference[step - 1],
                     "step %d: the pipeline's validation %.9g, one worker's %.9g", step,
                     waves[step - 1], reference[step - 1]);

    const char *learns = " --pipeline.schedule=async-1f1b --train.steps=60 --train.val_every=15 "
                         "--train.batch_size=4";
    run_pipert_ok("launch --quiet --stages 4 --replicas 1 --out %s " MODEL " %s", learning, learns);
    run_pipert_ok("launch --quiet --stages 4 --replicas 1 --out %s " MODEL " %s", again, learns);
    double val[60], val_again[60];
    cr_assert_eq(read_metric_steps(learning, "metrics.jsonl", "val_loss", val, 60), 4,
                 "validations at steps 15, 30, 45 and 60");
    cr_assert_eq(read_metric_steps(again, "metrics.jsonl", "val_loss", val_again, 60), 4);
    for (int step = 15; step <= 60; step += 15) {
        cr_expect(isfinite(val[step - 1]), "step %d: val_loss %g", step, val[step - 1]);
        cr_expect_eq(val[step - 1], val_again[step - 1], "step %d: %.9g, then %.9g", step,
                     val[step - 1], val_again[step - 1]);
    }
    cr_expect_lt(val[59], val[14], "validation did not fall: %g at step 15, %g at 60", val[14],
                 val[59]);
    remove_dir(pipeline);
    remove_dir(alone);
    remove_dir(learning);
    remove_dir(again);
}

/* The same with activations of 128 KiB (batch 8 × 64 positions × 64 channels): sends of
 * 64 KiB or more end only when the receiver read them (comm/transport_direct.c), and
 * the next stage reads a wave's batches steps later, after training microbatches it needs
 * from this stage first. Stage 0 waiting for its wave's sends stalled the job for good. */
Test(pipeline, asynchronous_validation_of_large_activations_does_not_wait_for_the_next_stage,
     .timeout = 240)
{
    char *pipeline = make_temp_dir(), *alone = make_temp_dir();
    const char *frozen = " --model.n_layer=2 --model.n_embd=64 --model.n_head=2 "
                         "--model.block_size=64 --train.batch_size=8 --train.warmup_steps=1 "
                         "--train.log_every=1 --train.steps=12 --train.val_every=5 "
                         "--train.val_batches=3 --train.lr=1e-30";
    run_pipert_ok("launch --quiet --stages 2 --replicas 1 --out %s --pipeline.schedule=async-1f1b %s",
                  pipeline, frozen);
    run_pipert_ok("launch --quiet --stages 1 --replicas 1 --out %s %s", alone, frozen);
    double waves[12], reference[12];
    cr_assert_eq(read_metric_steps(pipeline, "metrics.jsonl", "val_loss", waves, 12), 3,
                 "validations at steps 5, 10 (while running) and 12 (the end)");
    cr_assert_eq(read_metric_steps(alone, "metrics.jsonl", "val_loss", reference, 12), 3);
    for (int step = 5; step <= 12; step += step == 10 ? 2 : 5)
        cr_expect_eq(waves[step - 1], reference[step - 1],
                     "step %d: the pipeline's validation %.9g, one worker's %.9g", step,
                     waves[step - 1], reference[step - 1]);
    remove_dir(pipeline);
    remove_dir(alone);
}

/* Recomputation in the asynchronous schedule with activations of 128 KiB, across a checkpoint:
 * every microbatch shares one activation set, and a stage once waited, before each backward,
 * for every activation send still in flight; such a send ends only when the next stage read it,
 * which the last stage does only after the checkpoint's gather, which waits for this stage:
 * stalled for good (3 stages; found on cpu-guarded). The run ends, with the losses of the same
 * run without recomputation. */
Test(pipeline, asynchronous_recomputation_of_large_activations_passes_a_checkpoint,
     .timeout = 240)
{
    char *recomputed = make_temp_dir(), *kept = make_temp_dir();
    const char *job = " --model.n_layer=3 --model.n_embd=64 --model.n_head=2 "
                      "--model.block_size=64 --train.batch_size=8 --train.warmup_steps=1 "
                      "--train.log_every=1 --train.steps=12 --train.val_every=0 "
                      "--train.checkpoint_every=4 --pipeline.schedule=async-1f1b";
    run_pipert_ok("launch --quiet --stages 3 --out %s --pipeline.recompute=true %s", recomputed, job);
    run_pipert_ok("launch --quiet --stages 3 --out %s %s", kept, job);
    double a[12], b[12];
    cr_assert_eq(read_metric_steps(recomputed, "metrics.jsonl", "loss", a, 12), 12);
    cr_assert_eq(read_metric_steps(kept, "metrics.jsonl", "loss", b, 12), 12);
    for (int i = 0; i < 12; i++)
        cr_expect_eq(a[i], b[i], "step %d: recomputed %.9g, kept %.9g", i + 1, a[i], b[i]);
    remove_dir(recomputed);
    remove_dir(kept);
}

/* The launcher merges every rank's trace into DIR/trace.json: forward and
 * backward spans on every rank, in the Chrome trace format. */
Test(pipeline, a_run_leaves_one_merged_trace)
{
    char *dir = make_temp_dir(), path[512], *text;
    size_t size;
    run_pipert_ok("launch --quiet --stages 2 --replicas 1 --out %s " MODEL " --train.steps=5 "
               "--train.batch_size=2 --pipeline.schedule=1f1b",
               dir);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    json_t *root = json_loads(text, 0, NULL);
    cr_assert_not_null(root, "trace.json is not JSON");
    json_t *events = json_object_get(root, "traceEvents");
    int forward[2] = {0}, backward[2] = {0};
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *e = json_array_get(events, i);
        const char *name = json_string_value(json_object_get(e, "cat"));
        int pid = (int)json_integer_value(json_object_get(e, "pid"));
        if (!name || pid < 0 || pid > 1) continue;
        forward[pid] += !strcmp(name, "forward");
        backward[pid] += !strcmp(name, "backward");
    }
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(forward[r], 5 * 4, "rank %d: %d forward spans", r, forward[r]);
        cr_expect_eq(backward[r], 5 * 4, "rank %d: %d backward spans", r, backward[r]);
    }
    json_decref(root);
    free(text);
    remove_dir(dir);
}

/* A stage that dies mid-run (the worker's test hook SIGKILLs rank 0 at step
 * 5) ends the job within seconds, naming it, while its neighbour waits on a
 * message from it. */
Test(pipeline, a_dead_stage_is_named)
{
    char *dir = make_temp_dir();
    run_result r = run_pipert_with("PIPERT_TEST_DIE_AT_STEP=5 PIPERT_TEST_DIE_RANK=0",
                                   "launch --stages 2 --replicas 1 --out %s " MODEL
                                   " --train.batch_size=2 --train.steps=100000",
                                   dir);
    cr_expect_eq(r.status, 1, "exit status %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "rank 0 (stage 0, replica 0) failed: killed by signal 9"), "stderr: %s",
              r.err);
    cr_expect_lt(r.seconds, 10.0, "the launcher took %.1f s", r.seconds);
    remove_dir(dir);
}
