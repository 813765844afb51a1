/* The `pipert` command as a user runs it, in real processes: resume gives the
 * losses an uninterrupted run has, `pipert check` agrees with finite
 * differences of itself and reads Hugging Face names, and bad input gets a
 * one-line error naming the file, a non-zero exit, and no output file. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/data.h"
#include "tests/command.h"
#include "runtime/fileio.h"
#include "runtime/safetensors.h"

/* A small model that trains in well under a second a step. */
#define SMALL_MODEL                                                                                \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --runtime.threads=2 --train.warmup_steps=1 --train.val_every=0 "       \
    "--train.val_batches=2"

static bool file_exists(const char *path) { return access(path, F_OK) == 0; }

/* No temporary (".tmp.") file left anywhere in dir. */
static bool no_temporaries(const char *dir)
{
    DIR *d = opendir(dir);
    bool clean = true;
    for (struct dirent *e; d && (e = readdir(d));) clean &= strstr(e->d_name, ".tmp.") == NULL;
    if (d) closedir(d);
    return clean;
}

/* The "loss" of every metrics line with a loss, indexed by step. */
static int read_losses(const char *path, double *losses, int capacity)
{
    char *text;
    size_t size;
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    int last = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert_not_null(o, "metrics line is not JSON: %s", line);
        json_t *loss = json_object_get(o, "loss");
        int step = (int)json_integer_value(json_object_get(o, "step"));
        if (loss && step < capacity) {
            cr_assert_eq(losses[step], 0.0, "step %d listed twice in %s", step, path);
            losses[step] = json_real_value(loss);
            last = step > last ? step : last;
        }
        json_decref(o);
    }
    free(text);
    return last;
}

Test(cli, resume_continues_with_the_same_losses)
{
    char *dir = make_temp_dir(), path[512], saved[512];
    run_result r = run_pipert("train --quiet --out %s " SMALL_MODEL
                              " --train.steps=8 --train.log_every=1 --train.checkpoint_every=4 "
                              "--train.keep_checkpoints=0",
                              dir);
    cr_assert_eq(r.status, 0, "train failed: %s", r.err);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(saved, sizeof saved, "%s/uninterrupted.jsonl", dir);
    cr_assert_eq(rename(path, saved), 0);
    /* Pretend the run died after the checkpoint of step 4, having logged a
     * few steps beyond it, and while writing the one of step 8: its stage
     * file is there, its index (written last) is not. */
    snprintf(path, sizeof path, "%s/ckpt-00000008-stage-0.safetensors", dir);
    cr_assert(file_exists(path), "no stage file of step 8");
    snprintf(path, sizeof path, "%s/ckpt-00000008.json", dir);
    cr_assert_eq(unlink(path), 0);
    char *text;
    size_t size;
    cr_assert_eq(pt_read_file(saved, &text, &size), PIPERT_OK);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *cut = text;
    for (int lines = 0; lines < 6; lines++) cut = strchr(cut, '\n') + 1;
    cr_assert_eq(pt_write_file_atomic(path, text, (size_t)(cut - text)), PIPERT_OK);
    free(text);

    r = run_pipert("train --quiet --resume --out %s " SMALL_MODEL
                   " --train.steps=8 --train.log_every=1 --train.checkpoint_every=4 "
                   "--train.keep_checkpoints=0",
                   dir);
    cr_assert_eq(r.status, 0, "resume failed: %s", r.err);
    double expected[16] = {0}, resumed[16] = {0};
    cr_assert_eq(read_losses(saved, expected, 16), 8);
    cr_assert_eq(read_losses(path, resumed, 16), 8);
    for (int step = 1; step <= 8; step++)
        cr_expect(fabs(resumed[step] - expected[step]) <= 1e-6 * fabs(expected[step]),
                  "step %d: resumed loss %.9g, uninterrupted %.9g", step, resumed[step],
                  expected[step]);
    cr_expect(expected[8] < expected[1], "the loss did not fall: %g → %g", expected[1], expected[8]);
    remove_dir(dir);
}

/* The losses of a 4-step run with `extra` settings, into losses[1..4]. */
static void losses_with(const char *extra, double *losses)
{
    char *dir = make_temp_dir(), path[512];
    run_result r = run_pipert("train --quiet --out %s " SMALL_MODEL
                              " --train.steps=4 --train.log_every=1 %s", dir, extra);
    cr_assert_eq(r.status, 0, "train %s failed: %s", extra, r.err);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    cr_assert_eq(read_losses(path, losses, 8), 4);
    remove_dir(dir);
}

/* train.momentum_decay is NAdamW's ψ: it changes a NAdamW run from the second step on
 * (μ_1 depends on it too, but the first step's loss is the initial model's) and leaves an
 * AdamW run bit for bit as it was. */
Test(cli, momentum_decay_reaches_nadamw_only)
{
    double slow[8] = {0}, fast[8] = {0}, adam[8] = {0}, adam_fast[8] = {0};
    losses_with("--train.optimizer=nadamw --train.beta1=0.99", slow);
    losses_with("--train.optimizer=nadamw --train.beta1=0.99 --train.momentum_decay=100", fast);
    losses_with("--train.optimizer=adamw", adam);
    losses_with("--train.optimizer=adamw --train.momentum_decay=100", adam_fast);
    cr_expect_eq(slow[1], fast[1], "the first step's loss is the initial model's");
    cr_expect_neq(slow[4], fast[4], "ψ did not change NAdamW's steps (%.9g both)", slow[4]);
    for (int step = 1; step <= 4; step++)
        cr_expect_eq(adam[step], adam_fast[step], "AdamW changed with ψ at step %d", step);
}

/* ---- pipert check -------------------------------------------------------- */

/* A trained-for-one-step model in dir/model.safetensors and tokens in
 * dir/tokens.bin. */
static void make_model_and_tokens(const char *dir, const char *extra)
{
    run_result r = run_pipert("train --quiet --out %s " SMALL_MODEL " --train.steps=1 %s", dir, extra);
    cr_assert_eq(r.status, 0, "train failed: %s", r.err);
    char from[512], to[512];
    snprintf(from, sizeof from, "%s/ckpt-00000001-stage-0.safetensors", dir);
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    cr_assert_eq(rename(from, to), 0);
    uint16_t tokens[200];
    for (int i = 0; i < 200; i++) tokens[i] = (uint16_t)((i * 37 + i / 7) % 256);
    snprintf(to, sizeof to, "%s/tokens.bin", dir);
    cr_assert_eq(pt_shard_write(to, tokens, 200), PIPERT_OK);
}

/* Copies src to dst, renaming tensors through `rename_tensor` (NULL drops
 * one), adding `perturb` to element `index` of tensor `target`, and keeping
 * the metadata only if keep_metadata. */
static void rewrite_model(const char *src, const char *dst, const char *target, size_t index,
                          float perturb, const char *(*rename_tensor)(const char *, char *),
                          bool keep_metadata)
{
    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, src), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    size_t n = pt_safetensors_count(st);
    float **copies = calloc(n + 1, sizeof *copies);
    char name_buffer[256];
    for (size_t i = 0; i < n; i++) {
        const pt_tensor_entry *e = pt_safetensors_at(st, i);
        const char *name = rename_tensor ? rename_tensor(e->name, name_buffer) : e->name;
        if (!name) continue;
        copies[i] = malloc(e->numel * sizeof(float) + 1);
        cr_assert_eq(pt_safetensors_read_f32(st, e, copies[i], e->numel), PIPERT_OK);
        if (target && !strcmp(e->name, target)) copies[i][index] += perturb;
        cr_assert_eq(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, copies[i], e->ndim, e->shape),
                     PIPERT_OK, "%s", pipert_last_error());
    }
    if (keep_metadata) {
        const char *config = pt_safetensors_metadata(st, "config");
        cr_assert_eq(pt_safetensors_writer_set_metadata(w, "config", config), PIPERT_OK);
    }
    cr_assert_eq(pt_safetensors_writer_write(w, dst), PIPERT_OK, "%s", pipert_last_error());
    pt_safetensors_writer_free(w);
    for (size_t i = 0; i < n; i++) free(copies[i]);
    free(copies);
    pt_safetensors_close(st);
}

static const char *drop_optimizer_state(const char *name, char *buffer)
{
    (void)buffer;
    return strncmp(name, "optimizer.", 10) ? name : NULL;
}

static double check_loss(const char *dir, const char *model, const char *grads, const char *flags)
{
    run_result r = run_pipert("check --model %s/%s --tokens %s/tokens.bin --batch 2 --seq 16 "
                              "--out %s/%s %s",
                              dir, model, dir, dir, grads, flags);
    cr_assert_eq(r.status, 0, "check failed: %s", r.err);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, grads);
    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    double loss = strtod(pt_safetensors_metadata(st, "loss"), NULL);
    pt_safetensors_close(st);
    return loss;
}

static float gradient_at(const char *path, const char *name, size_t index)
{
    pt_safetensors *st;
    cr_assert_eq(pt_safetensors_open(&st, path), PIPERT_OK, "%s", pipert_last_error());
    const pt_tensor_entry *e = pt_safetensors_find(st, name);
    cr_assert_not_null(e, "%s: no gradient for %s", path, name);
    float *values = malloc(e->numel * sizeof(float));
    cr_assert_eq(pt_safetensors_read_f32(st, e, values, e->numel), PIPERT_OK);
    float g = values[index];
    free(values);
    pt_safetensors_close(st);
    return g;
}

Test(cli, check_gradients_agree_with_finite_differences_of_check_itself)
{
    char *dir = make_temp_dir(), path[512];
    make_model_and_tokens(dir, "");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rewrite_model(path, path, NULL, 0, 0, drop_optimizer_state, true);
    check_loss(dir, "model.safetensors", "grads.safetensors", "");
    snprintf(path, sizeof path, "%s/grads.safetensors", dir);

    const struct { const char *name; size_t index; } probes[] = {
        {"h.1.mlp.c_fc.weight", 17}, {"wte.weight", 32 * 't' + 3}, {"lm_head.weight", 32 * 'e' + 1},
        {"h.0.ln_1.weight", 5},
    };
    const float h = 1e-2f;
    char src[512];
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        char plus[512], minus[512];
        snprintf(plus, sizeof plus, "%s/plus.safetensors", dir);
        snprintf(minus, sizeof minus, "%s/minus.safetensors", dir);
        rewrite_model(src, plus, probes[i].name, probes[i].index, h, NULL, true);
        rewrite_model(src, minus, probes[i].name, probes[i].index, -h, NULL, true);
        double up = check_loss(dir, "plus.safetensors", "g1.safetensors", "");
        double down = check_loss(dir, "minus.safetensors", "g2.safetensors", "");
        double numeric = (up - down) / (2.0 * h);
        double analytic = gradient_at(path, probes[i].name, probes[i].index);
        cr_expect(fabs(analytic - numeric) <= 1e-4 + 2e-2 * fabs(numeric),
                  "%s[%zu]: check wrote %.6g, finite difference %.6g", probes[i].name,
                  probes[i].index, analytic, numeric);
    }
    remove_dir(dir);
}

/* GPT-2 from Hugging Face: "transformer." names, a tied head (no lm_head),
 * attention mask buffers, no pipert metadata. */
static const char *hugging_face_name(const char *name, char *buffer)
{
    if (!strncmp(name, "optimizer.", 10)) return NULL;
    snprintf(buffer, 256, "transformer.%s", name);
    return buffer;
}

Test(cli, check_reads_hugging_face_gpt2_files)
{
    char *dir = make_temp_dir(), pipert_file[512], hf_file[512];
    make_model_and_tokens(dir, "--model.tie_weights=true");
    snprintf(pipert_file, sizeof pipert_file, "%s/model.safetensors", dir);
    snprintf(hf_file, sizeof hf_file, "%s/hf.safetensors", dir);
    rewrite_model(pipert_file, hf_file, NULL, 0, 0, hugging_face_name, false);

    double expected = check_loss(dir, "model.safetensors", "g_pipert.safetensors", "");
    /* n_embd 32 is not a multiple of 64: the heads must be given */
    run_result r = run_pipert("check --model %s --tokens %s/tokens.bin --batch 2 --seq 16 --out %s/x.st",
                              hf_file, dir, dir);
    cr_expect_neq(r.status, 0);
    cr_expect(strstr(r.err, "n_head") != NULL, "stderr: %s", r.err);
    double got = check_loss(dir, "hf.safetensors", "g_hf.safetensors", "--model.n_head=2");
    cr_expect(fabs(got - expected) <= 1e-6 * expected, "HF-named file: loss %.9g, pipert file %.9g",
              got, expected);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/g_pipert.safetensors", dir);
    snprintf(b, sizeof b, "%s/g_hf.safetensors", dir);
    cr_expect_float_eq(gradient_at(a, "wte.weight", 100), gradient_at(b, "wte.weight", 100), 1e-9);
    remove_dir(dir);
}

/* ---- bad input ----------------------------------------------------------- */

static void expect_clean_failure(const run_result *r, const char *needle, const char *what)
{
    cr_expect_neq(r->status, 0, "%s: exit status 0", what);
    cr_expect(strstr(r->err, needle) != NULL, "%s: stderr lacks '%s': %s", what, needle, r->err);
    const char *newline = strchr(r->err, '\n');
    cr_expect(newline && newline[1] == '\0', "%s: not one line: %s", what, r->err);
    cr_expect(strstr(r->err, "Sanitizer") == NULL && strstr(r->err, "core dumped") == NULL,
              "%s: crashed: %s", what, r->err);
}

Test(cli, corrupt_model_files_are_refused_without_output)
{
    char *dir = make_temp_dir(), model[512], bad[512], out[512];
    make_model_and_tokens(dir, "");
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    snprintf(out, sizeof out, "%s/grads.safetensors", dir);
    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(model, &bytes, &size), PIPERT_OK);

    /* missing */
    run_result r = run_pipert("check --model %s/absent.safetensors --tokens %s/tokens.bin --batch 2 "
                              "--seq 16 --out %s", dir, dir, out);
    expect_clean_failure(&r, "absent.safetensors", "missing model");
    /* truncated in the data section */
    cr_assert_eq(pt_write_file_atomic(bad, bytes, size / 2), PIPERT_OK);
    r = run_pipert("check --model %s --tokens %s/tokens.bin --batch 2 --seq 16 --out %s",
                              bad, dir, out);
    expect_clean_failure(&r, "bad.safetensors", "truncated model");
    /* header length beyond the file */
    bytes[5] = 0x7f;
    cr_assert_eq(pt_write_file_atomic(bad, bytes, size), PIPERT_OK);
    r = run_pipert("check --model %s --tokens %s/tokens.bin --batch 2 --seq 16 --out %s", bad, dir, out);
    expect_clean_failure(&r, "bad.safetensors", "header length");
    bytes[5] = 0;
    /* unknown dtype */
    char *dtype = strstr(bytes + 8, "\"F32\"");
    cr_assert_not_null(dtype);
    memcpy(dtype, "\"Q32\"", 5);
    cr_assert_eq(pt_write_file_atomic(bad, bytes, size), PIPERT_OK);
    r = run_pipert("check --model %s --tokens %s/tokens.bin --batch 2 --seq 16 --out %s", bad, dir, out);
    expect_clean_failure(&r, "Q32", "unknown dtype");
    free(bytes);

    cr_expect(!file_exists(out), "an output file was written despite the errors");
    cr_expect(no_temporaries(dir), "a temporary file was left behind");
    remove_dir(dir);
}

Test(cli, bad_token_shards_are_refused)
{
    char *dir = make_temp_dir(), shard[512];
    make_model_and_tokens(dir, "");
    snprintf(shard, sizeof shard, "%s/tokens.bin", dir);
    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(shard, &bytes, &size), PIPERT_OK);
    bytes[0] ^= 0x55; /* wrong magic */
    cr_assert_eq(pt_write_file_atomic(shard, bytes, size), PIPERT_OK);
    run_result r = run_pipert("check --model %s/model.safetensors --tokens %s --batch 2 --seq 16 "
                              "--out %s/g.safetensors", dir, shard, dir);
    expect_clean_failure(&r, "tokens.bin", "wrong magic");
    bytes[0] ^= 0x55;
    cr_assert_eq(pt_write_file_atomic(shard, bytes, size - 3), PIPERT_OK); /* wrong size */
    r = run_pipert("check --model %s/model.safetensors --tokens %s --batch 2 --seq 16 "
                   "--out %s/g.safetensors", dir, shard, dir);
    expect_clean_failure(&r, "tokens.bin", "truncated shard");
    /* a valid shard with too few tokens for the batch */
    cr_assert_eq(pt_write_file_atomic(shard, bytes, size), PIPERT_OK);
    r = run_pipert("check --model %s/model.safetensors --tokens %s --batch 20 --seq 16 "
                   "--out %s/g.safetensors", dir, shard, dir);
    expect_clean_failure(&r, "tokens.bin", "short shard");
    free(bytes);
    remove_dir(dir);
}

Test(cli, bad_configuration_is_reported_with_its_place)
{
    char *dir = make_temp_dir(), config[512];
    snprintf(config, sizeof config, "%s/run.json", dir);
    const char *text = "{\n  \"model\": {\"n_layer\": 2},\n  \"train\": {\n    \"lrr\": 0.001\n  }\n}\n";
    cr_assert_eq(pt_write_file_atomic(config, text, strlen(text)), PIPERT_OK);
    run_result r = run_pipert("train --out %s/out --config %s", dir, config);
    expect_clean_failure(&r, "run.json:4:5", "unknown key");
    cr_expect(strstr(r.err, "lrr") != NULL, "%s", r.err);

    r = run_pipert("train --out %s/out --train.steps=many", dir);
    expect_clean_failure(&r, "train.steps", "wrong type");
    r = run_pipert("train --out %s/out --model.n_embd=30 --model.n_head=4", dir);
    expect_clean_failure(&r, "n_head", "indivisible heads");
    r = run_pipert("train --out %s/out --model.n_layer=4000 --model.n_embd=8192 --model.n_head=64", dir);
    expect_clean_failure(&r, "GiB", "model too large");
    r = run_pipert("train --out %s/out --pipeline.schedule=1f1b --pipeline.sync_steps=5", dir);
    expect_clean_failure(&r, "pipeline.sync_steps", "synchronous steps of a flush schedule");
    r = run_pipert("train --out %s/empty --resume " SMALL_MODEL, dir);
    expect_clean_failure(&r, "no checkpoint", "resume without checkpoint");
    r = run_pipert("train --out %s/out --data.path=%s/missing.txt", dir, dir);
    expect_clean_failure(&r, "missing.txt", "missing data");
    cr_expect(!file_exists(strcat(config, ".out")));
    remove_dir(dir);
}
