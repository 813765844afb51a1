/* The configuration: defaults, JSON files, overrides, error messages with
 * their exact positions, checks, and the JSON round trip.
 *
 * Expected values are written out by hand (the defaults from the design, the
 * line:column of each bad key counted by hand), not taken from the schema
 * table, so a wrong row or a wrong position makes a test fail. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "pipert/pipert.h"
#include "dp/codec.h"
#include "dp/coupling.h"
#include "kernels/kernels.h"
#include "pipeline/lookahead.h"
#include "pipeline/schedule.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "train/optimizer.h"
#include "runtime/units.h"

/* ---- helpers ------------------------------------------------------------- */

/* Each Criterion test runs in its own process: one temporary directory and
 * file per test, removed at the end. */
static char temp_dir[64];
static char temp_path[128];

static void remove_temp(void)
{
    if (temp_path[0]) unlink(temp_path);
    if (temp_dir[0]) rmdir(temp_dir);
}

/* Writes `text` to DIR/run.json and returns the path. */
static const char *write_temp_json(const char *text)
{
    if (!temp_dir[0]) {
        snprintf(temp_dir, sizeof temp_dir, "/tmp/pipert_test_config_XXXXXX");
        cr_assert_not_null(mkdtemp(temp_dir), "mkdtemp failed");
        atexit(remove_temp);
    }
    snprintf(temp_path, sizeof temp_path, "%s/run.json", temp_dir);
    FILE *f = fopen(temp_path, "w");
    cr_assert_not_null(f, "cannot write %s", temp_path);
    fputs(text, f);
    fclose(f);
    return temp_path;
}

static pipert_config *new_config(void)
{
    pipert_config *cfg = NULL;
    cr_assert_eq(pipert_config_create(&cfg), PIPERT_OK, "create: %s", pipert_last_error());
    return cfg;
}

/* Loads `text` from a file into a fresh config and expects the error
 * "PATH:" + where_and_what. */
static void expect_file_error(const char *text, const char *where_and_what)
{
    pipert_config *cfg = new_config();
    const char *path = write_temp_json(text);
    pipert_result rc = pipert_config_load_file(cfg, path);
    char expected[1024];
    snprintf(expected, sizeof expected, "%s:%s", path, where_and_what);
    cr_expect_eq(rc, PIPERT_ERR_CONFIG, "loading %s: result %d, expected a configuration error", text, rc);
    cr_expect_str_eq(pipert_last_error(), expected, "for the file\n%s\nthe message differs", text);
    pipert_config_free(cfg);
}

static void expect_set_error(const char *assignment, const char *expected)
{
    pipert_config *cfg = new_config();
    pipert_result rc = pipert_config_set(cfg, assignment);
    cr_expect_eq(rc, PIPERT_ERR_CONFIG, "%s: result %d, expected a configuration error", assignment, rc);
    cr_expect_str_eq(pipert_last_error(), expected, "%s: the message differs", assignment);
    pipert_config_free(cfg);
}

static void set_ok(pipert_config *cfg, const char *assignment)
{
    cr_assert_eq(pipert_config_set(cfg, assignment), PIPERT_OK, "%s: %s", assignment, pipert_last_error());
}

/* Every key, written out independently of the schema table. */
static const char *const all_keys[] = {
    "model.n_layer", "model.n_embd", "model.n_head", "model.block_size", "model.vocab_size",
    "model.tie_weights", "train.batch_size", "train.grad_accum", "train.steps", "train.lr",
    "train.warmup_steps", "train.min_lr_ratio", "train.optimizer", "train.beta1", "train.beta2",
    "train.eps", "train.weight_decay", "train.momentum_decay", "train.grad_clip",
    "train.val_every", "train.val_batches",
    "train.log_every", "train.checkpoint_every", "train.keep_checkpoints", "data.path", "data.format",
    "data.val_fraction", "data.sampling", "dp.method", "dp.compress", "dp.block", "dp.delay",
    "dp.fraction", "dp.partition_block", "dp.rule", "dp.lambda", "dp.ema_warmup_steps", "dp.period", "dp.outer_lr",
    "dp.outer_momentum", "dp.fragments", "dp.overlap", "dp.alpha", "dp.penalty", "dp.penalty_value",
    "dp.clip", "dp.nccl", "runtime.threads", "runtime.device", "runtime.precision",
    "runtime.authenticate_messages", "runtime.coordinator_check_steps", "pipeline.schedule",
    "pipeline.lookahead", "pipeline.lookahead_warmup", "pipeline.dc_lambda", "pipeline.sync_steps",
    "pipeline.microbatches", "pipeline.recompute", "pipeline.transfer", "pipeline.trace",
    "wan.bandwidth", "wan.latency", "plan.layers", "seed",
};
enum { ALL_KEYS = sizeof all_keys / sizeof all_keys[0] };

static int count_leaves(json_t *object)
{
    const char *name;
    json_t *value;
    int leaves = 0;
    json_object_foreach(object, name, value) leaves += json_is_object(value) ? count_leaves(value) : 1;
    return leaves;
}

/* ---- defaults ------------------------------------------------------------ */

Test(config, defaults)
{
    pipert_config *cfg = new_config();
    const pt_model_settings *m = &cfg->model;
    const pt_train_settings *t = &cfg->train;
    cr_expect_eq(m->n_layer, 6);
    cr_expect_eq(m->n_embd, 192);
    cr_expect_eq(m->n_head, 6);
    cr_expect_eq(m->block_size, 128);
    cr_expect_eq(m->vocab_size, 256);
    cr_expect_eq(m->tie_weights, false);
    cr_expect_eq(t->batch_size, 8);
    cr_expect_eq(t->grad_accum, 1);
    cr_expect_eq(t->steps, 700);
    cr_expect_eq(t->lr, 1e-3);
    cr_expect_eq(t->warmup_steps, 50);
    cr_expect_eq(t->min_lr_ratio, 0.1);
    cr_expect_eq(t->optimizer, PT_OPTIMIZER_ADAMW);
    cr_expect_eq(t->beta1, 0.9);
    cr_expect_eq(t->beta2, 0.95);
    cr_expect_eq(t->eps, 1e-8);
    cr_expect_eq(t->weight_decay, 0.1);
    cr_expect_eq(t->grad_clip, 1.0);
    cr_expect_eq(t->val_every, 100);
    cr_expect_eq(t->val_batches, 8);
    cr_expect_eq(t->log_every, 10);
    cr_expect_eq(t->checkpoint_every, 200);
    cr_expect_eq(t->keep_checkpoints, 3);
    cr_expect_str_eq(cfg->data.path, "");
    cr_expect_eq(cfg->data.format, PT_DATA_AUTO);
    cr_expect_eq(cfg->data.val_fraction, 0.1);
    cr_expect_eq(cfg->runtime.threads, 0);
    cr_expect_eq(cfg->runtime.device, PT_DEVICE_CPU);
    cr_expect_eq(cfg->runtime.precision, PT_PRECISION_FP32);
    cr_expect_eq(cfg->seed, 1337);
    cr_expect_eq(pt_config_validate(cfg), PIPERT_OK, "defaults do not validate: %s", pipert_last_error());
    pipert_config_free(cfg);
}

/* Every key of the hand-written list is in the JSON dump and in the help, and
 * the dump has no others. */
Test(config, every_key_is_dumped_and_documented)
{
    pipert_config *cfg = new_config();
    char *text = pipert_config_to_json(cfg);
    cr_assert_not_null(text);
    json_t *root = json_loads(text, 0, NULL);
    cr_assert_not_null(root, "to_json is not JSON:\n%s", text);
    cr_expect_eq(count_leaves(root), ALL_KEYS, "to_json has %d keys, expected %d:\n%s",
                 count_leaves(root), ALL_KEYS, text);

    char *help = NULL;
    size_t help_size = 0;
    FILE *out = open_memstream(&help, &help_size);
    pt_config_print_help(out);
    fclose(out);
    for (int i = 0; i < ALL_KEYS; i++) {
        char section[32], key[32];
        const char *dot = strchr(all_keys[i], '.');
        snprintf(section, sizeof section, "%.*s", dot ? (int)(dot - all_keys[i]) : 0, all_keys[i]);
        snprintf(key, sizeof key, "%s", dot ? dot + 1 : all_keys[i]);
        json_t *value = dot ? json_object_get(json_object_get(root, section), key)
                            : json_object_get(root, key);
        cr_expect_not_null(value, "%s missing from to_json", all_keys[i]);
        cr_expect_not_null(strstr(help, all_keys[i]), "%s missing from the help", all_keys[i]);
    }
    cr_expect_not_null(strstr(help, "adamw|nadamw"), "the help does not list the optimizers");
    free(help);
    json_decref(root);
    free(text);
    pipert_config_free(cfg);
}

/* ---- files --------------------------------------------------------------- */

Test(config, load_file_merges_over_defaults)
{
    pipert_config *cfg = new_config();
    const char *path = write_temp_json("{\n"
                                       "  \"model\": {\"n_layer\": 2, \"tie_weights\": true},\n"
                                       "  \"train\": {\"lr\": 3e-4, \"optimizer\": \"nadamw\", \"steps\": 10},\n"
                                       "  \"data\": {\"path\": \"corpus.txt\", \"val_fraction\": 0.25},\n"
                                       "  \"seed\": 7\n"
                                       "}\n");
    cr_assert_eq(pipert_config_load_file(cfg, path), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(cfg->model.n_layer, 2);
    cr_expect_eq(cfg->model.tie_weights, true);
    cr_expect_eq(cfg->train.lr, 3e-4);
    cr_expect_eq(cfg->train.optimizer, PT_OPTIMIZER_NADAMW);
    cr_expect_eq(cfg->train.steps, 10);
    cr_expect_str_eq(cfg->data.path, "corpus.txt");
    cr_expect_eq(cfg->data.val_fraction, 0.25);
    cr_expect_eq(cfg->seed, 7);
    /* untouched keys keep their defaults */
    cr_expect_eq(cfg->model.n_embd, 192);
    cr_expect_eq(cfg->train.beta2, 0.95);
    cr_expect_eq(cfg->data.format, PT_DATA_AUTO);
    pipert_config_free(cfg);
}

Test(config, val_fraction_one_is_out_of_range)
{
    expect_file_error("{\"data\": {\"val_fraction\": 1}}",
                      "1:11: data.val_fraction: must be in (0, 1), got 1");
}

Test(config, escaped_key_names_are_decoded)
{
    pipert_config *cfg = new_config();
    const char *path = write_temp_json("{\"train\": {\"\\u006cr\": 0.5}}"); /* "\u006cr" is "lr" */
    cr_assert_eq(pipert_config_load_file(cfg, path), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(cfg->train.lr, 0.5);
    pipert_config_free(cfg);
    expect_file_error("{\"train\": {\"\\u006crr\": 0.5}}",
                      "1:12: unknown key 'train.lrr' (did you mean 'train.lr'?)");
}

Test(config, missing_file)
{
    pipert_config *cfg = new_config();
    pipert_result rc = pipert_config_load_file(cfg, "/nonexistent/run.json");
    cr_expect_eq(rc, PIPERT_ERR_IO);
    cr_expect_not_null(strstr(pipert_last_error(), "/nonexistent/run.json"), "message: %s",
                       pipert_last_error());
    pipert_config_free(cfg);
}

/* ---- errors and their positions ------------------------------------------ */

Test(config, syntax_error_reports_janssons_position)
{
    const char *text = "{\n"
                       "  \"train\": {\n"
                       "    \"lr\": 1e-3,\n"
                       "  }\n"
                       "}\n";
    /* The reference is jansson itself; the trailing comma is noticed at the
     * '}' on line 4. */
    json_error_t error;
    cr_assert_null(json_loads(text, 0, &error));
    cr_expect_eq(error.line, 4);
    char where[256];
    snprintf(where, sizeof where, "%d:%d: %s", error.line, error.column, error.text);
    expect_file_error(text, where);
}

Test(config, duplicate_keys_are_errors)
{
    pipert_config *cfg = new_config();
    const char *path = write_temp_json("{\"seed\": 1,\n \"seed\": 2}");
    cr_expect_eq(pipert_config_load_file(cfg, path), PIPERT_ERR_CONFIG);
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%s:2:", path);
    cr_expect_eq(strncmp(pipert_last_error(), prefix, strlen(prefix)), 0, "message: %s", pipert_last_error());
    cr_expect_not_null(strstr(pipert_last_error(), "duplicate"), "message: %s", pipert_last_error());
    pipert_config_free(cfg);
}

Test(config, unknown_key_position_and_suggestion)
{
    expect_file_error("{\n"
                      "  \"train\": {\n"
                      "    \"lrr\": 1\n"
                      "  }\n"
                      "}\n",
                      "3:5: unknown key 'train.lrr' (did you mean 'train.lr'?)");
}

Test(config, unknown_section)
{
    expect_file_error("{\"model\": {},\n \"trian\": {\"lr\": 1}}",
                      "2:2: unknown key 'trian' (did you mean 'train'?)");
    expect_file_error("{\"optimizer\": {}}", "1:2: unknown key 'optimizer' (did you mean 'train.optimizer'?)");
    expect_file_error("{\"zzz\": 1}", "1:2: unknown key 'zzz'");
}

Test(config, key_in_the_wrong_section_suggests_the_right_one)
{
    expect_file_error("{\"train\": {\"n_layer\": 2}}",
                      "1:12: unknown key 'train.n_layer' (did you mean 'model.n_layer'?)");
}

/* The position is that of the key at the full path, not of the first text
 * that looks like it: the same name in another section, at another level, or
 * inside a string. */
Test(config, position_follows_the_path)
{
    expect_file_error("{\n"
                      "  \"train\": {\"steps\": 10, \"lr\": 0.001},\n"
                      "  \"data\": {\"path\": \"train \\\"lr\\\": {\", \"lr\": 5}\n"
                      "}\n",
                      "3:39: unknown key 'data.lr' (did you mean 'train.lr'?)");
    expect_file_error("{\n"
                      "  \"model\": {\"n_layer\": 2},\n"
                      "  \"seed\": 5,\n"
                      "  \"n_layer\": 2\n"
                      "}\n",
                      "4:3: unknown key 'n_layer' (did you mean 'model.n_layer'?)");
}

Test(config, position_skips_nested_values)
{
    /* the key after another key of its section; then after a string that
     * holds the key's path with escaped quotes */
    expect_file_error("{\"model\": {\"n_embd\": 64, \"n_layer\": \"four\"}}",
                      "1:26: model.n_layer: expected an integer, got a string");
    expect_file_error("{\n"
                      "  \"data\": {\"path\": \"\\\"model\\\": {\\\"n_layer\\\": \"},\n"
                      "  \"model\": {\"n_embd\": 64,\n"
                      "            \"n_layer\": \"four\"}\n"
                      "}\n",
                      "4:13: model.n_layer: expected an integer, got a string");
}

/* Columns count characters: "é" is two bytes but one column. */
Test(config, columns_count_characters)
{
    expect_file_error("{\"data\": {\"path\": \"h\xc3\xa9llo\"}, \"trian\": 1}",
                      "1:29: unknown key 'trian' (did you mean 'train'?)");
}

Test(config, wrong_types)
{
    expect_file_error("{\"train\": {\"lr\": \"fast\"}}", "1:12: train.lr: expected a number, got a string");
    expect_file_error("{\"model\": {\"n_layer\": 3.5}}", "1:12: model.n_layer: expected an integer, got 3.5");
    expect_file_error("{\"model\": {\"n_layer\": 4.0}}", "1:12: model.n_layer: expected an integer, got 4.0");
    expect_file_error("{\"model\": {\"tie_weights\": 1}}",
                      "1:12: model.tie_weights: expected true or false, got 1");
    expect_file_error("{\"data\": {\"path\": 7}}", "1:11: data.path: expected a string, got 7");
    expect_file_error("{\"data\": {\"path\": null}}", "1:11: data.path: expected a string, got null");
    expect_file_error("{\"seed\": [1]}", "1:2: seed: expected an integer, got an array");
    expect_file_error("{\"train\": 5}", "1:2: train: expected an object of train.* keys, got 5");
    expect_file_error("[1, 2]", "1:1: expected an object of sections, like {\"train\": {\"lr\": 3e-4}}, got an array");
    expect_file_error("{\"train.lr\": 1}",
                      "1:2: unknown key 'train.lr' (write sections as nested objects: {\"train\": {\"lr\": 3e-4}})");
}

Test(config, doubles_accept_integers)
{
    pipert_config *cfg = new_config();
    const char *path = write_temp_json("{\"train\": {\"lr\": 1, \"grad_clip\": 0}}");
    cr_assert_eq(pipert_config_load_file(cfg, path), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(cfg->train.lr, 1.0);
    cr_expect_eq(cfg->train.grad_clip, 0.0);
    pipert_config_free(cfg);
}

Test(config, out_of_range)
{
    expect_file_error("{\"model\": {\"n_layer\": 0}}", "1:12: model.n_layer: must be >= 1, got 0");
    expect_file_error("{\"train\": {\"lr\": 0}}", "1:12: train.lr: must be > 0, got 0");
    expect_file_error("{\"train\": {\"beta1\": 1.0}}", "1:12: train.beta1: must be in [0, 1), got 1.0");
    expect_file_error("{\"train\": {\"momentum_decay\": 0}}",
                      "1:12: train.momentum_decay: must be > 0, got 0");
    expect_file_error("{\"train\": {\"min_lr_ratio\": -0.5}}",
                      "1:12: train.min_lr_ratio: must be in [0, 1], got -0.5");
    expect_file_error("{\"train\": {\"optimizer\": \"sgd\"}}",
                      "1:12: train.optimizer: must be one of adamw|nadamw, got \"sgd\"");
    /* a prefix of a choice is not a choice */
    expect_file_error("{\"runtime\": {\"device\": \"cp\"}}",
                      "1:14: runtime.device: must be one of cpu|cuda|cpu-guarded, got \"cp\"");
    expect_file_error("{\"model\": {\"n_embd\": 3000000000}}",
                      "1:12: model.n_embd: must be in [1, 2147483647], got 3000000000");
}

Test(config, string_length_limit)
{
    /* PT_CONFIG_STRING_MAX - 1 bytes fit (with the NUL); one more does not */
    char text[PT_CONFIG_STRING_MAX + 64];
    char name[PT_CONFIG_STRING_MAX + 1];
    memset(name, 'a', PT_CONFIG_STRING_MAX - 1);
    name[PT_CONFIG_STRING_MAX - 1] = '\0';
    snprintf(text, sizeof text, "{\"data\": {\"path\": \"%s\"}}", name);
    pipert_config *cfg = new_config();
    cr_assert_eq(pipert_config_load_file(cfg, write_temp_json(text)), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(cfg->data.path, name);
    pipert_config_free(cfg);

    strcat(name, "a");
    snprintf(text, sizeof text, "{\"data\": {\"path\": \"%s\"}}", name);
    char expected[128];
    snprintf(expected, sizeof expected, "1:11: data.path: must be shorter than %d bytes, got %d bytes",
             PT_CONFIG_STRING_MAX, PT_CONFIG_STRING_MAX);
    expect_file_error(text, expected);
}

/* A failed merge changes nothing, even the keys before the bad one. */
Test(config, failed_merge_leaves_config_unchanged)
{
    pipert_config *cfg = new_config();
    const char *path = write_temp_json("{\"seed\": 7, \"model\": {\"n_layer\": 9, \"n_head\": \"x\"}}");
    cr_expect_eq(pipert_config_load_file(cfg, path), PIPERT_ERR_CONFIG);
    cr_expect_eq(cfg->seed, 1337, "seed changed to %ld by a failed merge", (long)cfg->seed);
    cr_expect_eq(cfg->model.n_layer, 6, "n_layer changed to %d by a failed merge", cfg->model.n_layer);
    pipert_config_free(cfg);
}

Test(config, merge_names_its_source)
{
    pipert_config cfg;
    pt_config_defaults(&cfg);
    pipert_result rc = pt_config_merge_json(&cfg, "{\"model\": {\"n_head\": 0}}", "ckpt.safetensors metadata");
    cr_expect_eq(rc, PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "ckpt.safetensors metadata:1:12: model.n_head: must be >= 1, got 0");
}

/* ---- overrides ----------------------------------------------------------- */

Test(config, overrides)
{
    pipert_config *cfg = new_config();
    set_ok(cfg, "train.lr=3e-4");
    cr_expect_eq(cfg->train.lr, 3e-4);
    set_ok(cfg, "--train.steps=20");
    cr_expect_eq(cfg->train.steps, 20);
    set_ok(cfg, "--train.optimizer=nadamw"); /* a bare string */
    cr_expect_eq(cfg->train.optimizer, PT_OPTIMIZER_NADAMW);
    set_ok(cfg, "data.format=\"text\""); /* a JSON string */
    cr_expect_eq(cfg->data.format, PT_DATA_TEXT);
    set_ok(cfg, "--data.path=123"); /* a string key keeps what was typed */
    cr_expect_str_eq(cfg->data.path, "123");
    set_ok(cfg, "--data.path=/tmp/a b=c.txt"); /* only the first '=' splits */
    cr_expect_str_eq(cfg->data.path, "/tmp/a b=c.txt");
    set_ok(cfg, "--data.path=");
    cr_expect_str_eq(cfg->data.path, "");
    set_ok(cfg, "model.tie_weights=true");
    cr_expect_eq(cfg->model.tie_weights, true);
    set_ok(cfg, "--model.tie_weights=false");
    cr_expect_eq(cfg->model.tie_weights, false);
    set_ok(cfg, "--seed=9007199254740993"); /* 2^53 + 1: must not pass through a double */
    cr_expect_eq(cfg->seed, 9007199254740993LL, "seed %lld", (long long)cfg->seed);
    set_ok(cfg, "train.grad_clip=0");
    cr_expect_eq(cfg->train.grad_clip, 0.0);
    pipert_config_free(cfg);
}

Test(config, override_errors)
{
    expect_set_error("--train.lr=abc", "--train.lr=abc: expected a number");
    expect_set_error("train.lr=\"3e-4\"", "train.lr=\"3e-4\": expected a number");
    expect_set_error("--model.n_layer=3.5", "--model.n_layer=3.5: expected an integer");
    expect_set_error("--model.n_layer=0", "--model.n_layer=0: must be >= 1");
    expect_set_error("--model.tie_weights=1", "--model.tie_weights=1: expected true or false");
    expect_set_error("--train.optimizer=sgd", "--train.optimizer=sgd: must be one of adamw|nadamw");
    expect_set_error("--train.lrr=1", "--train.lrr=1: unknown key 'train.lrr' (did you mean 'train.lr'?)");
    expect_set_error("--sed=1", "--sed=1: unknown key 'sed' (did you mean 'seed'?)");
    expect_set_error("--train=1", "--train=1: unknown key 'train'");
    expect_set_error("--train.lr", "--train.lr: expected KEY=VALUE, like train.lr=3e-4");
    expect_set_error("=3", "=3: expected KEY=VALUE, like train.lr=3e-4");
}

/* ---- checks -------------------------------------------------------------- */

Test(config, validate_relations)
{
    pipert_config cfg;
    pt_config_defaults(&cfg);
    cfg.model.n_embd = 130;
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "model.n_embd: 130 is not a multiple of model.n_head = 6");

    /* a warm-up longer than the run is allowed: short trial runs keep the default */
    pt_config_defaults(&cfg);
    cfg.train.warmup_steps = 700;
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_OK);
}

/* validate also checks each key's range, for C code that writes the struct. */
Test(config, validate_ranges)
{
    pipert_config cfg;
    pt_config_defaults(&cfg);
    cfg.train.grad_accum = 0;
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "train.grad_accum: must be >= 1, got 0");

    pt_config_defaults(&cfg);
    cfg.model.n_head = 0; /* before the divisibility check divides by it */
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "model.n_head: must be >= 1, got 0");

    pt_config_defaults(&cfg);
    cfg.data.val_fraction = 0.0;
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "data.val_fraction: must be in (0, 1), got 0.0");

    pt_config_defaults(&cfg);
    cfg.runtime.device = PT_DEVICE_KINDS; /* C code wrote a value no device has */
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(),
                     "runtime.device: holds a number that names none of its choices");

    pt_config_defaults(&cfg);
    cfg.train.lr = INFINITY;
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "train.lr: is not a finite number");
}

/* ---- round trip ---------------------------------------------------------- */

Test(config, to_json_round_trip)
{
    pipert_config *cfg = new_config();
    /* every kind of value, away from its default; doubles that need all 17
     * digits, and strings that need escaping */
    cfg->model.n_layer = 12;
    cfg->model.tie_weights = true;
    cfg->train.steps = 123456789012L;
    cfg->train.lr = 0.1 + 0.2;
    cfg->train.beta2 = 1.0 / 3.0;
    cfg->train.eps = 5e-324; /* the smallest subnormal */
    cfg->train.weight_decay = 0.0;
    cfg->train.optimizer = PT_OPTIMIZER_NADAMW;
    snprintf(cfg->data.path, sizeof cfg->data.path, "dir \"q\"\\x/\xc3\xa9\n\t.txt");
    cfg->data.format = PT_DATA_TOKENS;
    cfg->seed = INT64_MAX;

    char *text = pipert_config_to_json(cfg);
    cr_assert_not_null(text);
    pipert_config *back = new_config();
    cr_assert_eq(pt_config_merge_json(back, text, "to_json"), PIPERT_OK, "%s\n%s", pipert_last_error(), text);
    cr_expect_eq(back->train.lr, 0.1 + 0.2, "lr %.17g", back->train.lr);
    cr_expect_eq(back->train.beta2, 1.0 / 3.0, "beta2 %.17g", back->train.beta2);
    cr_expect_eq(back->train.eps, 5e-324, "eps %.17g", back->train.eps);
    cr_expect_eq(back->seed, INT64_MAX);
    cr_expect_eq(back->train.steps, 123456789012L);
    cr_expect_str_eq(back->data.path, cfg->data.path);
    cr_expect_eq(memcmp(back, cfg, sizeof *cfg), 0, "the struct read back differs; the text was\n%s", text);
    char *again = pipert_config_to_json(back);
    cr_expect_str_eq(again, text, "dumping the read-back config gives a different text");
    free(again);
    free(text);
    pipert_config_free(back);
    pipert_config_free(cfg);
}

Test(config, short_numbers_in_json)
{
    /* the defaults print with the fewest digits that read back exactly */
    pipert_config *cfg = new_config();
    char *text = pipert_config_to_json(cfg);
    cr_expect_not_null(strstr(text, "\"min_lr_ratio\": 0.1,"), "%s", text);
    cr_expect_not_null(strstr(text, "\"lr\": 0.001,"), "%s", text);
    cr_expect_not_null(strstr(text, "\"eps\": 1e-8,"), "%s", text);
    free(text);
    pipert_config_free(cfg);
}

Test(config, model_section_alone)
{
    pipert_config *cfg = new_config();
    set_ok(cfg, "model.n_layer=6");
    set_ok(cfg, "model.tie_weights=true");
    set_ok(cfg, "train.lr=0.5");
    char *text = pt_config_model_to_json(cfg);
    cr_assert_not_null(text);
    cr_expect_str_eq(text, "{\"model\":{\"block_size\":128,\"n_embd\":192,\"n_head\":6,\"n_layer\":6,"
                           "\"tie_weights\":true,\"vocab_size\":256}}");
    pipert_config back;
    pt_config_defaults(&back);
    cr_expect_eq(pt_config_merge_json(&back, text, "model"), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(memcmp(&back.model, &cfg->model, sizeof back.model), 0, "model section differs");
    cr_expect_eq(back.train.lr, 1e-3, "a train key came along with the model section");
    free(text);
    pipert_config_free(cfg);
}

/* ---- units of the emulated links (runtime/units.h) ------------------------- */

Test(config, bit_rates_and_durations)
{
    double x;
    const struct { const char *text; double value; } rates[] = {
        {"100mbit", 1e8}, {"1gbit", 1e9}, {"1.5Gbit/s", 1.5e9}, {"10Mbps", 1e7}, {"500kbit", 5e5},
        {"64bit", 64},
    };
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        cr_assert_eq(pt_parse_bit_rate(rates[i].text, "r", &x), PIPERT_OK, "%s", rates[i].text);
        cr_expect_float_eq(x, rates[i].value, 1e-9 * rates[i].value, "%s", rates[i].text);
    }
    const struct { const char *text; double value; } durations[] = {
        {"50ms", 0.05}, {"2s", 2}, {"250us", 250e-6}, {"0", 0}, {"0ms", 0}, {"1.5ms", 1.5e-3},
    };
    for (size_t i = 0; i < sizeof durations / sizeof durations[0]; i++) {
        cr_assert_eq(pt_parse_duration(durations[i].text, "d", &x), PIPERT_OK, "%s", durations[i].text);
        cr_expect_float_eq(x, durations[i].value, 1e-12, "%s", durations[i].text);
    }
    const char *bad_rates[] = {"100", "fast", "-5mbit", "0mbit", "100mbits", "", "nanmbit"};
    for (size_t i = 0; i < sizeof bad_rates / sizeof bad_rates[0]; i++)
        cr_expect_eq(pt_parse_bit_rate(bad_rates[i], "r", &x), PIPERT_ERR_CONFIG, "%s", bad_rates[i]);
    const char *bad_durations[] = {"50", "-1ms", "1h", "ms", ""};
    for (size_t i = 0; i < sizeof bad_durations / sizeof bad_durations[0]; i++)
        cr_expect_eq(pt_parse_duration(bad_durations[i], "d", &x), PIPERT_ERR_CONFIG, "%s",
                     bad_durations[i]);
}

Test(config, byte_sizes)
{
    double x;
    const struct { const char *text; double value; } sizes[] = {
        {"80gib", 80.0 * 1073741824.0}, {"512MB", 512e6}, {"1.5kib", 1536}, {"64b", 64},
        {"2TiB", 2.0 * 1099511627776.0}, {"3gb", 3e9},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        cr_assert_eq(pt_parse_byte_size(sizes[i].text, "m", &x), PIPERT_OK, "%s", sizes[i].text);
        cr_expect_float_eq(x, sizes[i].value, 1e-9 * sizes[i].value, "%s", sizes[i].text);
    }
    const char *bad[] = {"80", "80 apples", "-1gb", "0gb", "gib", "", "1gbit"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(pt_parse_byte_size(bad[i], "m", &x), PIPERT_ERR_CONFIG, "%s", bad[i]);
    cr_expect_eq(pt_parse_byte_size(NULL, "m", &x), PIPERT_ERR_CONFIG);
}

Test(config, wan_keys_are_checked)
{
    pipert_config cfg;
    pt_config_defaults(&cfg);
    snprintf(cfg.wan.bandwidth, sizeof cfg.wan.bandwidth, "100");
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "wan.bandwidth: expected a positive bit rate such as "
                                          "100mbit or 1gbit, got '100'");
    pt_config_defaults(&cfg);
    snprintf(cfg.wan.latency, sizeof cfg.wan.latency, "50");
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_ERR_CONFIG);
    cr_expect_str_eq(pipert_last_error(), "wan.latency: expected a duration such as 50ms, 2s or "
                                          "250us, got '50'");
    pt_config_defaults(&cfg);
    snprintf(cfg.wan.bandwidth, sizeof cfg.wan.bandwidth, "1gbit");
    snprintf(cfg.wan.latency, sizeof cfg.wan.latency, "10ms");
    cr_expect_eq(pt_config_validate(&cfg), PIPERT_OK, "%s", pipert_last_error());
}

/* pt_config_describe_changes: the keys compared (a section by its dotted
 * prefix, a top-level key by its whole name) less those ignored, each with
 * both values as JSON, in schema order; cut to fit, still counting. */
Test(config, changes_between_two_configurations_are_described)
{
    pipert_config was, now;
    pt_config_defaults(&was);
    pt_config_defaults(&now);
    const char *const compared[] = {"train.", "pipeline.", "seed", NULL};
    const char *const ignored[] = {"train.log_every", NULL};
    char out[256];
    cr_expect_eq(pt_config_describe_changes(&was, &now, compared, ignored, out, sizeof out), 0);
    cr_expect_str_eq(out, "");

    cr_assert_eq(pipert_config_set(&now, "train.lr=5e-4"), PIPERT_OK);
    cr_assert_eq(pipert_config_set(&now, "pipeline.lookahead=nesterov"), PIPERT_OK);
    cr_assert_eq(pipert_config_set(&now, "train.log_every=3"), PIPERT_OK); /* ignored */
    cr_assert_eq(pipert_config_set(&now, "dp.method=sparse"), PIPERT_OK); /* not compared */
    cr_assert_eq(pipert_config_set(&now, "seed=7"), PIPERT_OK);
    cr_expect_eq(pt_config_describe_changes(&was, &now, compared, ignored, out, sizeof out), 3);
    cr_expect_str_eq(out, "train.lr 0.001 -> 0.0005, pipeline.lookahead \"nesterov-dc\" -> "
                          "\"nesterov\", seed 1337 -> 7");

    const char *const prefix_only[] = {"pipe", NULL}; /* no dot: a whole name, matches nothing */
    cr_expect_eq(pt_config_describe_changes(&was, &now, prefix_only, NULL, out, sizeof out), 0);

    char small[20];
    cr_expect_eq(pt_config_describe_changes(&was, &now, compared, ignored, small, sizeof small), 3);
    cr_expect_str_eq(small, "train.lr 0.001 -> 0");
}

/* ---- the job digest (pt_config_job_digest) -------------------------------- */

static pt_job_identity digest_of(const pipert_config *cfg, int stages, const int *bounds)
{
    pt_job_identity identity;
    pt_config_job_digest(cfg, stages, bounds, &identity);
    return identity;
}

Test(config, job_digest_covers_what_workers_exchange_and_nothing_else)
{
    pipert_config base;
    pt_config_defaults(&base);
    const int bounds[] = {0, 6, 12}, other_bounds[] = {0, 5, 12};
    const pt_job_identity reference = digest_of(&base, 2, bounds);
    cr_expect_eq(reference.protocol, PT_PROTOCOL_VERSION);
    cr_expect(pt_job_identity_has_digest(&reference));
    pt_job_identity again = digest_of(&base, 2, bounds);
    char why[256];
    cr_expect(!pt_job_identity_mismatch(&again, &reference, why, sizeof why), "equal configs: %s", why);

    /* each setting in it changes its own part, and only that one */
    static const struct {
        const char *assignment;
        pt_job_digest_part part;
    } included[] = {
        {"model.n_layer=13", PT_DIGEST_MODEL},        {"model.n_embd=384", PT_DIGEST_MODEL},
        {"model.n_head=4", PT_DIGEST_MODEL},          {"model.block_size=512", PT_DIGEST_MODEL},
        {"model.vocab_size=512", PT_DIGEST_MODEL},    {"model.tie_weights=true", PT_DIGEST_MODEL},
        {"train.batch_size=3", PT_DIGEST_BATCH},      {"train.grad_accum=2", PT_DIGEST_BATCH},
        {"train.steps=7", PT_DIGEST_BATCH},           {"pipeline.schedule=1f1b", PT_DIGEST_SCHEDULE},
        {"pipeline.microbatches=3", PT_DIGEST_SCHEDULE}, {"pipeline.sync_steps=5", PT_DIGEST_SCHEDULE},
        {"dp.method=sparse", PT_DIGEST_DP},           {"dp.compress=int8", PT_DIGEST_DP},
        {"dp.block=64", PT_DIGEST_DP},                {"dp.delay=2", PT_DIGEST_DP},
        {"dp.fraction=0.25", PT_DIGEST_DP},           {"dp.partition_block=32", PT_DIGEST_DP},
        {"dp.period=7", PT_DIGEST_DP},                {"dp.fragments=2", PT_DIGEST_DP},
        {"dp.overlap=2", PT_DIGEST_DP},               {"runtime.authenticate_messages=true", PT_DIGEST_AUTH},
        {"dp.nccl=true", PT_DIGEST_DP},
        {"pipeline.transfer=bf16", PT_DIGEST_SCHEDULE}, {"runtime.precision=bf16", PT_DIGEST_SCHEDULE},
    };
    for (size_t i = 0; i < sizeof included / sizeof included[0]; i++) {
        pipert_config cfg = base;
        cr_assert_eq(pipert_config_set(&cfg, included[i].assignment), PIPERT_OK, "%s: %s",
                     included[i].assignment, pipert_last_error());
        const pt_job_identity changed = digest_of(&cfg, 2, bounds);
        why[0] = '\0';
        for (int part = 0; part < PT_DIGEST_PARTS; part++) {
            const bool differs = changed.part[part] != reference.part[part];
            cr_expect_eq(differs, part == (int)included[i].part, "%s: part %s",
                         included[i].assignment, pt_job_digest_part_name(part));
        }
        cr_expect(pt_job_identity_mismatch(&changed, &reference, why, sizeof why) &&
                      strstr(why, pt_job_digest_part_name(included[i].part)),
                  "%s: %s", included[i].assignment, why);
    }
    const pt_job_identity split = digest_of(&base, 2, other_bounds);
    cr_expect(pt_job_identity_mismatch(&split, &reference, why, sizeof why));
    cr_expect(strstr(why, "(settings differ in: stage split)"), "%s", why);
    const int three[] = {0, 4, 8, 12};
    cr_expect_neq(digest_of(&base, 3, three).part[PT_DIGEST_SPLIT], reference.part[PT_DIGEST_SPLIT]);

    /* what replicas may set apart, and how a run logs, validates, checkpoints, traces and where
     * it writes, do not change it */
    static const char *const excluded[] = {
        "train.lr=0.01",          "train.warmup_steps=3",      "train.optimizer=nadamw",
        "train.weight_decay=0.5", "train.val_every=5",         "train.val_batches=3",
        "train.log_every=3",      "train.checkpoint_every=9",  "train.keep_checkpoints=2",
        "data.path=elsewhere",    "runtime.threads=3",         "pipeline.lookahead=none",
        "pipeline.trace=true",    "pipeline.recompute=true",   "dp.lambda=5",
        "dp.outer_lr=0.5",        "seed=7",
    };
    for (size_t i = 0; i < sizeof excluded / sizeof excluded[0]; i++) {
        pipert_config cfg = base;
        cr_assert_eq(pipert_config_set(&cfg, excluded[i]), PIPERT_OK, "%s: %s", excluded[i],
                     pipert_last_error());
        const pt_job_identity same = digest_of(&cfg, 2, bounds);
        cr_expect(!pt_job_identity_mismatch(&same, &reference, why, sizeof why), "%s: %s",
                  excluded[i], why);
    }
}

Test(config, job_identities_compare_by_protocol_then_digest)
{
    const pt_job_identity ours = {.protocol = 1, .part = {1, 2, 3, 4, 5, 6}};
    pt_job_identity theirs = ours;
    char why[256], hex[PT_JOB_DIGEST_HEX];
    pt_job_digest_to_hex(&ours, hex);
    cr_expect_eq(strlen(hex), 16 * PT_DIGEST_PARTS);
    cr_expect(pt_job_digest_from_hex(hex, &theirs));
    cr_expect(!memcmp(theirs.part, ours.part, sizeof ours.part));
    cr_expect(!pt_job_digest_from_hex("0123", &theirs));
    theirs.protocol = 2;
    cr_expect(pt_job_identity_mismatch(&theirs, &ours, why, sizeof why));
    cr_expect_str_eq(why, "protocol version 2 vs 1 (another build of pipert)");
    const pt_job_identity undigested = {.protocol = 1};
    cr_expect(!pt_job_identity_mismatch(&undigested, &ours, why, sizeof why),
              "without a digest the settings are not compared");
    theirs = ours;
    theirs.part[PT_DIGEST_MODEL] = 7, theirs.part[PT_DIGEST_DP] = 8;
    cr_expect(pt_job_identity_mismatch(&theirs, &ours, why, sizeof why));
    cr_expect(strstr(why, "job digest ") && strstr(why, "(settings differ in: model shape, dp "
                                                         "method/codec)"), "%s", why);
    cr_expect_neq(pt_job_digest(&theirs), pt_job_digest(&ours));
}

/* ---- the schema's lists of choices and their owners' tables ----------------------------- */

/* The names live in the schema (what a configuration may say), the facts in the tables of the
 * code that acts on them, both indexed by the values of runtime/settings.h: the tables that
 * name their rows too must name each value as the schema does. */
Test(config, every_choice_is_a_row_of_its_owners_table)
{
    char text[1024];
    for (int v = 0; v < PT_DP_BUILT_IN_METHODS; v++) {
        const pt_coupling_method *method = pt_coupling_method_of(v);
        cr_assert_not_null(method, "dp.method %d: %s", v, pipert_last_error());
        cr_expect_str_eq(method->name, pt_config_choice_name("dp.method", v));
    }
    cr_expect_null(pt_coupling_method_of(PT_DP_BUILT_IN_METHODS), "none added");
    const pt_kernels *kernels;
    cr_assert_eq(pt_kernels_for_device(PT_DEVICE_CPU, &kernels), PIPERT_OK);
    cr_expect_str_eq(kernels->name, pt_config_choice_name("runtime.device", PT_DEVICE_CPU));
    cr_assert_eq(pt_kernels_for_device(PT_DEVICE_CPU_GUARDED, &kernels), PIPERT_OK);
    cr_expect_str_eq(kernels->name, pt_config_choice_name("runtime.device", PT_DEVICE_CPU_GUARDED));
    for (int v = 0; v < PT_DEVICE_KINDS; v++) cr_expect_not_null(pt_device_traits_of(v));
    /* each key's list is its enumeration's, in its order */
    cr_expect_str_eq(pt_config_choices("pipeline.schedule", text, sizeof text), "gpipe|1f1b|async-1f1b");
    cr_expect_str_eq(pt_config_choices("dp.compress", text, sizeof text),
                     "none|int8|e3m0|e2m1|onebit");
    for (int v = 0; v < PT_LOOKAHEADS; v++)
        cr_expect_eq(pt_lookahead_named(pt_lookahead_name(v)), pt_lookahead_traits_of(v), "%d", v);
    cr_expect_str_eq(pt_lookahead_name(PT_LOOKAHEAD_NESTEROV_DC), "nesterov-dc");
    cr_expect_str_eq(pt_schedule_kind_name(PT_SCHEDULE_ASYNC_1F1B), "async-1f1b");
    cr_expect_str_eq(pt_optimizer_kind_name(PT_OPTIMIZER_NADAMW), "nadamw");
    cr_expect_eq(pt_config_choice_value("dp.rule", "delta"), PT_RULE_DELTA);
    cr_expect_eq(pt_config_choice_value("dp.penalty", "adaptive"), PT_PENALTY_ADAPTIVE);
    cr_expect_eq(pt_config_choice_value("data.sampling", "sequential"), PT_SAMPLING_SEQUENTIAL);
    cr_expect_eq(pt_config_choice_value("data.format", "tokens"), PT_DATA_TOKENS);
    cr_expect_eq(pt_config_choice_value("runtime.precision", "bf16"), PT_PRECISION_BF16);
    cr_expect_str_eq(pt_config_choices("pipeline.transfer", text, sizeof text), "auto|fp32|bf16");
    cr_expect_eq(pt_config_choice_value("pipeline.lookahead", "sgd"), -1);
    cr_expect(strstr(pipert_last_error(), "pipeline.lookahead: unknown \"sgd\" (known: none|stash"),
              "%s", pipert_last_error());
    cr_expect_str_eq(pt_config_choice_name("dp.method", 99), "?");
}

Test(config, a_choice_added_by_a_program_is_accepted_and_listed)
{
    pipert_config c;
    pt_config_defaults(&c);
    cr_expect_eq(pipert_config_set(&c, "dp.compress=nibble"), PIPERT_ERR_CONFIG);
    int value = -1, again = -1;
    cr_assert_eq(pt_config_allow_choice("dp.compress", "nibble", &value), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_expect_eq(value, PT_CODEC_KINDS, "numbered after the schema's");
    cr_expect_eq(pt_config_allow_choice("dp.compress", "nibble", &again), PIPERT_OK);
    cr_expect_eq(again, value, "twice is once");
    cr_expect_eq(pipert_config_set(&c, "dp.compress=nibble"), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq((int)c.dp.compress, value);
    char text[1024];
    cr_expect_str_eq(pt_config_choices("dp.compress", text, sizeof text),
                     "none|int8|e3m0|e2m1|onebit|nibble");
    char *json = pipert_config_to_json(&c);
    cr_expect(strstr(json, "\"compress\": \"nibble\""), "written by name: %s", json);
    free(json);
    cr_expect_eq(pt_config_allow_choice("dp.lambda", "x", NULL), PIPERT_ERR_INVALID_ARG,
                 "a number has no choices");
    cr_expect_eq(pt_config_allow_choice("dp.compress", "a|b", NULL), PIPERT_ERR_INVALID_ARG);
    cr_expect_null(pt_config_choices("data.path", text, sizeof text));
}
