/* The configuration: one schema table drives everything.
 *
 * Every key is one row of `schema` below: its dotted name, where it lives in
 * struct pipert_config, its default, its allowed range or choices (the names
 * of the values of an enumeration, runtime/settings.h) and a line of
 * documentation. Defaults, JSON merging, "--key=value" overrides, checks,
 * the JSON dump, `--help` and docs/CONFIG.md all read that table, so a new key
 * (or a whole new section) is a new row and a new struct field, nothing else.
 *
 * Sections are JSON objects ({"train": {"lr": 3e-4}}); a key's name is its
 * path joined by dots ("train.lr"), and top-level keys ("seed") have no dot.
 * A key's C type is not written in the table: _Generic reads it off the struct
 * field, so the table and the struct cannot disagree. */
#include "runtime/config.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/json_position.h"
#include "runtime/name_hint.h"
#include "runtime/units.h"

/* ---- the schema ---------------------------------------------------------- */

/* KEY_CHOICE: one of a list of names (runtime/settings.h), held as its number. */
typedef enum key_type {
    KEY_INT,
    KEY_LONG,
    KEY_LLONG,
    KEY_DOUBLE,
    KEY_BOOL,
    KEY_STRING,
    KEY_CHOICE
} key_type;

/* Allowed values of a number: min..max, each end open or closed. */
enum { CLOSED = 0, OPEN_MIN = 1, OPEN_MAX = 2 };
typedef struct key_range {
    double min, max; /* ±HUGE_VAL where unbounded */
    int open;        /* OPEN_MIN | OPEN_MAX */
} key_range;

typedef struct config_key {
    const char *name;      /* "train.lr" */
    key_type type;         /* the C type of the field */
    size_t offset, size;   /* of the field in struct pipert_config */
    double default_number; /* integers, bools (0/1) and doubles */
    const char *default_string;
    key_range range;       /* numbers */
    const char *const *names; /* KEY_CHOICE: the name of each value, indexed by it */
    int n_names;
    const char *doc;
} config_key;

#define FIELD(member) (((pipert_config *)0)->member)
/* char arrays decay to char * in a _Generic selection (C17, DR 481). */
#define TYPE_OF(member)                                                                            \
    _Generic(FIELD(member),                                                                        \
        int: KEY_INT,                                                                              \
        long: KEY_LONG,                                                                            \
        long long: KEY_LLONG,                                                                      \
        double: KEY_DOUBLE,                                                                        \
        bool: KEY_BOOL,                                                                            \
        char *: KEY_STRING)
#define PLACE(member)                                                                              \
    .name = #member, .type = TYPE_OF(member), .offset = offsetof(pipert_config, member),           \
    .size = sizeof FIELD(member)

#define NUMBER_KEY(member, default_, range_, doc_)                                                 \
    {PLACE(member), .default_number = (default_), .range = range_, .doc = (doc_)}
#define BOOL_KEY(member, default_, doc_)                                                           \
    {PLACE(member), .default_number = (default_), .range = ANY_NUMBER, .doc = (doc_)}
#define STRING_KEY(member, default_, doc_)                                                         \
    {PLACE(member), .default_string = (default_), .range = ANY_NUMBER, .doc = (doc_)}
/* A setting that is one of names_[] (indexed by its enumeration, runtime/settings.h); the
 * field must be an enumeration or an int. */
#define CHOICE_KEY(member, names_, default_, doc_)                                                 \
    {.name = #member, .type = KEY_CHOICE, .offset = offsetof(pipert_config, member),                \
     .size = sizeof FIELD(member), .default_string = (default_), .range = ANY_NUMBER,              \
     .names = (names_), .n_names = (int)(sizeof(names_) / sizeof(names_)[0]), .doc = (doc_)}

#define ANY_NUMBER {-HUGE_VAL, HUGE_VAL, CLOSED}
#define AT_LEAST(x) {(x), HUGE_VAL, CLOSED}              /* [x, ∞) */
#define ABOVE(x) {(x), HUGE_VAL, OPEN_MIN}               /* (x, ∞) */
#define CLOSED_RANGE(a, b) {(a), (b), CLOSED}            /* [a, b] */
#define HALF_OPEN_RANGE(a, b) {(a), (b), OPEN_MAX}       /* [a, b) */
#define OPEN_RANGE(a, b) {(a), (b), OPEN_MIN | OPEN_MAX} /* (a, b) */

/* The names of the settings that are one of a list, indexed by their values. */
static const char *const device_names[] = {
    [PT_DEVICE_CPU] = "cpu", [PT_DEVICE_CUDA] = "cuda", [PT_DEVICE_CPU_GUARDED] = "cpu-guarded"};
static const char *const precision_names[] = {[PT_PRECISION_FP32] = "fp32",
                                              [PT_PRECISION_BF16] = "bf16"};
static const char *const transfer_names[] = {
    [PT_TRANSFER_AUTO] = "auto", [PT_TRANSFER_FP32] = "fp32", [PT_TRANSFER_BF16] = "bf16"};
static const char *const schedule_names[] = {[PT_SCHEDULE_GPIPE] = "gpipe",
                                             [PT_SCHEDULE_1F1B] = "1f1b",
                                             [PT_SCHEDULE_ASYNC_1F1B] = "async-1f1b"};
static const char *const lookahead_names[] = {
    [PT_LOOKAHEAD_NONE] = "none",
    [PT_LOOKAHEAD_STASH] = "stash",
    [PT_LOOKAHEAD_NESTEROV] = "nesterov",
    [PT_LOOKAHEAD_PREDICT] = "predict",
    [PT_LOOKAHEAD_PREDICT_DAMPED] = "predict-damped",
    [PT_LOOKAHEAD_PIPEMARE] = "pipemare",
    [PT_LOOKAHEAD_DC_ASGD] = "dc-asgd",
    [PT_LOOKAHEAD_NESTEROV_DC] = "nesterov-dc",
    [PT_LOOKAHEAD_NESTEROV_SECANT] = "nesterov-secant",
};
static const char *const optimizer_names[] = {[PT_OPTIMIZER_ADAMW] = "adamw",
                                              [PT_OPTIMIZER_NADAMW] = "nadamw"};
static const char *const method_names[] = {
    [PT_DP_ALLREDUCE] = "allreduce", [PT_DP_SPARSE] = "sparse",
    [PT_DP_DILOCO] = "diloco",       [PT_DP_STREAMING_DILOCO] = "streaming-diloco",
    [PT_DP_CO2] = "co2",             [PT_DP_NONE] = "none",
};
static const char *const codec_names[] = {[PT_CODEC_NONE] = "none", [PT_CODEC_INT8] = "int8",
                                          [PT_CODEC_E3M0] = "e3m0", [PT_CODEC_E2M1] = "e2m1",
                                          [PT_CODEC_ONEBIT] = "onebit"};
static const char *const rule_names[] = {
    [PT_RULE_EMA] = "ema", [PT_RULE_AVG] = "avg", [PT_RULE_DELTA] = "delta"};
static const char *const penalty_names[] = {[PT_PENALTY_CONSTANT] = "constant",
                                            [PT_PENALTY_ADAPTIVE] = "adaptive"};
static const char *const format_names[] = {
    [PT_DATA_AUTO] = "auto", [PT_DATA_TEXT] = "text", [PT_DATA_TOKENS] = "tokens"};
static const char *const sampling_names[] = {[PT_SAMPLING_RANDOM] = "random",
                                             [PT_SAMPLING_SEQUENTIAL] = "sequential"};
_Static_assert(sizeof device_names / sizeof *device_names == PT_DEVICE_KINDS, "runtime.device");
_Static_assert(sizeof precision_names / sizeof *precision_names == PT_PRECISIONS, "precision");
_Static_assert(sizeof transfer_names / sizeof *transfer_names == PT_TRANSFERS, "transfer");
_Static_assert(sizeof schedule_names / sizeof *schedule_names == PT_SCHEDULE_KINDS, "schedule");
_Static_assert(sizeof lookahead_names / sizeof *lookahead_names == PT_LOOKAHEADS, "lookahead");
_Static_assert(sizeof optimizer_names / sizeof *optimizer_names == PT_OPTIMIZER_KINDS, "optimizer");
_Static_assert(sizeof method_names / sizeof *method_names == PT_DP_BUILT_IN_METHODS, "dp.method");
_Static_assert(sizeof codec_names / sizeof *codec_names == PT_CODEC_KINDS, "dp.compress");
_Static_assert(sizeof rule_names / sizeof *rule_names == PT_SPARSE_RULES, "dp.rule");
_Static_assert(sizeof penalty_names / sizeof *penalty_names == PT_CO2_PENALTIES, "dp.penalty");
_Static_assert(sizeof format_names / sizeof *format_names == PT_DATA_FORMATS, "data.format");
_Static_assert(sizeof sampling_names / sizeof *sampling_names == PT_SAMPLINGS, "data.sampling");
/* a choice's field is written and read as an int */
_Static_assert(sizeof(pt_device_kind) == sizeof(int) && sizeof(pt_precision) == sizeof(int) &&
                   sizeof(pt_schedule_kind) == sizeof(int) && sizeof(pt_transfer) == sizeof(int) &&
                   sizeof(pt_lookahead) == sizeof(int) && sizeof(pt_optimizer_kind) == sizeof(int) &&
                   sizeof(pt_codec_kind) == sizeof(int) && sizeof(pt_sparse_rule) == sizeof(int) &&
                   sizeof(pt_co2_penalty) == sizeof(int) && sizeof(pt_data_format) == sizeof(int) &&
                   sizeof(pt_sampling) == sizeof(int),
               "enumerations the size of an int");

static const config_key schema[] = {
    NUMBER_KEY(model.n_layer, 6, AT_LEAST(1), "transformer blocks"),
    NUMBER_KEY(model.n_embd, 192, AT_LEAST(1),
               "channels C of the residual stream; a multiple of model.n_head"),
    NUMBER_KEY(model.n_head, 6, AT_LEAST(1), "attention heads"),
    NUMBER_KEY(model.block_size, 128, CLOSED_RANGE(1, 32768),
               "sequence length T (also the number of learned positions); at most 32768"),
    NUMBER_KEY(model.vocab_size, 256, AT_LEAST(1),
               "vocabulary size V; at least 256 for the byte-level tokenizer"),
    BOOL_KEY(model.tie_weights, false,
             "lm_head shares the token embedding (single-stage runs only)"),

    NUMBER_KEY(train.batch_size, 8, AT_LEAST(1), "sequences per worker per microbatch"),
    NUMBER_KEY(train.grad_accum, 1, AT_LEAST(1),
               "microbatches per optimizer step of a single stage (pipelines use "
               "pipeline.microbatches)"),
    NUMBER_KEY(train.steps, 700, AT_LEAST(1), "optimizer steps of the whole run"),
    NUMBER_KEY(train.lr, 1e-3, ABOVE(0), "peak learning rate, reached at the end of warm-up"),
    NUMBER_KEY(train.warmup_steps, 50, AT_LEAST(0), "steps of linear warm-up from 0 to train.lr"),
    NUMBER_KEY(train.min_lr_ratio, 0.1, CLOSED_RANGE(0, 1),
               "cosine decay ends at min_lr_ratio * train.lr"),
    CHOICE_KEY(train.optimizer, optimizer_names, "adamw",
               "update rule: AdamW, or NAdamW (Nesterov momentum)"),
    NUMBER_KEY(train.beta1, 0.9, HALF_OPEN_RANGE(0, 1), "decay of the first moment (momentum)"),
    NUMBER_KEY(train.beta2, 0.95, HALF_OPEN_RANGE(0, 1), "decay of the second moment"),
    NUMBER_KEY(train.eps, 1e-8, ABOVE(0), "added to the root of the second moment"),
    NUMBER_KEY(train.weight_decay, 0.1, AT_LEAST(0),
               "decoupled weight decay λ (2-D tensors only: matrices and embeddings)"),
    NUMBER_KEY(train.momentum_decay, 0.004, ABOVE(0),
               "NAdamW's ψ (PyTorch's momentum_decay): μ_t = β1·(1 − ½·0.96^(t·ψ)), ½·β1 "
               "at the start, ¾·β1 after 17/ψ steps"),
    NUMBER_KEY(train.grad_clip, 1.0, AT_LEAST(0),
               "clip the global gradient norm to this; 0 disables"),
    NUMBER_KEY(train.val_every, 100, AT_LEAST(0),
               "validate every N steps and at the end; 0 = only at the end (async-1f1b: "
               "through the running pipeline, not drained)"),
    NUMBER_KEY(train.val_batches, 8, AT_LEAST(1), "batches per validation"),
    NUMBER_KEY(train.log_every, 10, AT_LEAST(1), "a metrics line every N steps"),
    NUMBER_KEY(train.checkpoint_every, 200, AT_LEAST(0),
               "checkpoint every N steps and at the end; 0 = only at the end"),
    NUMBER_KEY(train.keep_checkpoints, 3, AT_LEAST(0), "newest checkpoints kept; 0 = keep all"),

    STRING_KEY(data.path, "",
               "text file, directory of text files, or llm.c .bin token shard; \"\" = fortunes"),
    CHOICE_KEY(data.format, format_names, "auto",
               "how to read data.path; auto decides from the file"),
    NUMBER_KEY(data.val_fraction, 0.1, OPEN_RANGE(0, 1),
               "tail of the token stream held out for validation"),
    CHOICE_KEY(data.sampling, sampling_names, "random",
               "training sequences: random offsets from (seed, step, sequence), or the stream "
               "read in order (sequence q of the run starts at token q*block_size)"),

    NUMBER_KEY(runtime.threads, 0, AT_LEAST(0), "compute threads; 0 = every core of this machine"),
    CHOICE_KEY(runtime.device, device_names, "cpu",
               "where the kernels run; cpu-guarded: the CPU kernels on memory the host cannot "
               "read outside them, as on a GPU (tests: any direct host access crashes)"),
    CHOICE_KEY(runtime.precision, precision_names, "fp32",
               "the matrix products' operands (weights, their inputs, the gradients they take): "
               "fp32, or rounded to bf16 with fp32 accumulation (tensor cores on a GPU); the "
               "master weights, gradients, optimizer, norms, attention and softmax stay fp32"),
    BOOL_KEY(runtime.authenticate_messages, false,
             "a MAC and a sequence number on every message between workers: forged, altered "
             "and replayed messages are refused (every worker of the job must agree)"),
    NUMBER_KEY(runtime.coordinator_check_steps, 8, AT_LEAST(1),
               "under pipert launch, every N steps the workers agree whether one of them lost "
               "the coordinator; if so all stop N steps later with a checkpoint (at least "
               "stages + 1 is used)"),

    CHOICE_KEY(pipeline.schedule, schedule_names, "async-1f1b",
               "pipeline schedule: asynchronous 1F1B (no flush), 1F1B with flush, or GPipe"),
    CHOICE_KEY(pipeline.lookahead, lookahead_names, "nesterov-dc",
               "weight handling of async-1f1b: stash + NAdamW(β1=0.99) on the gradient with "
               "DC-ASGD's delay compensation (λ=100), the same with a measured secant as the "
               "compensation's curvature and half the raw-gradient step on the momentum, the same "
               "without compensation, stash, weight "
               "prediction, weight prediction damped in warm-up "
               "and bounded by the measured update size, stash + PipeMare's per-stage step sizes, "
               "stash + DC-ASGD delay compensation, or none"),
    NUMBER_KEY(pipeline.lookahead_warmup, 0, AT_LEAST(0),
               "predict-damped and pipemare: steps K over which the damping (t/K) or the "
               "per-stage step size (tau^-(1-t/K)) rises to 1; 0 = train.warmup_steps. "
               "nesterov-secant: secant pairs measured before it compensates; 0 = 20"),
    NUMBER_KEY(pipeline.dc_lambda, 0.0, AT_LEAST(0),
               "dc-asgd, nesterov-dc: lambda of the delay compensation g + "
               "lambda*g*g*(w_now - w_used)/sqrt(v); nesterov-secant: the scale s of "
               "g + s*kappa*(w_now - w_used); 0 = the look-ahead's own (2, 100, 2)"),
    NUMBER_KEY(pipeline.sync_steps, 0, AT_LEAST(0),
               "async-1f1b: the first N steps pass one microbatch at a time through every stage "
               "(no staleness, a stage busy 1/S of the time), then the pipeline fills; "
               "refused with a flush schedule"),
    NUMBER_KEY(pipeline.microbatches, 4, AT_LEAST(1),
               "microbatches per optimizer step (gpipe, 1f1b); async-1f1b steps after each"),
    BOOL_KEY(pipeline.recompute, false,
             "keep only each stage's input and recompute activations at backward time"),
    CHOICE_KEY(pipeline.transfer, transfer_names, "auto",
               "what activations and their gradients cross between stages as: bf16 (rounded, "
               "half the bytes), fp32 (as the model keeps them: a pipeline then equals one "
               "worker bit for bit), or auto = bf16 under runtime.precision=bf16, else fp32; "
               "validation's activations cross in fp32"),
    BOOL_KEY(pipeline.trace, true, "write a Chrome/Perfetto trace (trace-rank-N.json) per rank"),

    CHOICE_KEY(dp.method, method_names, "allreduce",
               "how the replicas of a stage are coupled (docs/CONFIG.md, ALGORITHMS.md section 4): "
               "allreduce = mean of the gradients every step (dense, synchronous)"),
    CHOICE_KEY(dp.compress, codec_names, "none",
               "what crosses the link between replicas: fp32, or quantized with per-block fp32 "
               "scales (8-bit, 4-bit E3M0 or E2M1), or 1-bit signs with error feedback"),
    NUMBER_KEY(dp.block, 128, AT_LEAST(8), "elements per quantization block (one fp32 scale each)"),
    NUMBER_KEY(dp.delay, -1, AT_LEAST(-1),
               "steps between posting an asynchronous exchange and applying it: -1 = when it "
               "arrives; N >= 0 = exactly N steps later (the step waits if it is late)"),
    NUMBER_KEY(dp.fraction, 0.05, HALF_OPEN_RANGE(0, 1.0000001),
               "sparse: fraction p of each tensor averaged per step (partitions of a shared "
               "random permutation; P = ceil(1/p))"),
    NUMBER_KEY(dp.partition_block, 16, CLOSED_RANGE(1, 4096),
               "sparse: the permutation's unit, consecutive elements of a tensor that go to a "
               "partition together (16 fp32 = a 64-byte cache line; 1 = single elements)"),
    CHOICE_KEY(dp.rule, rule_names, "ema",
               "sparse: what replaces the averaged elements: ema = average + lambda * EMA of the "
               "drift since sending; avg = the average; delta = average + drift"),
    NUMBER_KEY(dp.lambda, 3.0, AT_LEAST(0),
               "sparse: weight of the EMA correction (ALGORITHMS.md's reference value is 1; 3 "
               "measured best)"),
    NUMBER_KEY(dp.ema_warmup_steps, 1000, AT_LEAST(0),
               "sparse: steps with mu_e = 0.5 before its cosine rise to 0.99"),
    NUMBER_KEY(dp.period, 30, AT_LEAST(1),
               "diloco, streaming-diloco, co2: inner steps H per outer step"),
    NUMBER_KEY(dp.outer_lr, 0, AT_LEAST(0),
               "outer learning rate (diloco, streaming-diloco, co2); 0 = the method's own: "
               "diloco 1.0, streaming-diloco and co2 0.7"),
    NUMBER_KEY(dp.outer_momentum, -1, HALF_OPEN_RANGE(-1, 1),
               "outer momentum (Nesterov; co2: heavy ball); -1 = the method's own: diloco 0.5, "
               "streaming-diloco and co2 0.9"),
    NUMBER_KEY(dp.fragments, 0, AT_LEAST(0),
               "streaming-diloco: fragments (layer l -> fragment l mod P, plus one for embeddings, "
               "final norm and head); 0 = about 3 layers each"),
    NUMBER_KEY(dp.overlap, 1, AT_LEAST(0),
               "streaming-diloco: inner steps tau a fragment's reduce overlaps before it is merged"),
    NUMBER_KEY(dp.alpha, 0.5, CLOSED_RANGE(0, 1),
               "streaming-diloco: merge theta = alpha * local + (1 - alpha) * outer"),
    CHOICE_KEY(dp.penalty, penalty_names, "constant",
               "co2: staleness gap penalty Lambda: dp.penalty_value, or computed each round"),
    NUMBER_KEY(dp.penalty_value, 1.0, AT_LEAST(1), "co2: the constant Lambda"),
    NUMBER_KEY(dp.clip, 0.1, ABOVE(0), "co2: outer momentum clip phi (element-wise)"),
    BOOL_KEY(dp.nccl, false,
             "allreduce on runtime.device=cuda: average the gradients with NCCL on the GPUs, "
             "every replica on a GPU of its own, one site (not yet run on two GPUs)"),

    STRING_KEY(wan.bandwidth, "",
               "pipert launch --sites N: emulate the links between sites at this rate in each "
               "direction, e.g. 100mbit or 1gbit (root; docs/RUNNING.md); \"\" = not emulated"),
    STRING_KEY(wan.latency, "",
               "pipert launch --sites N: one-way delay of the emulated links, e.g. 50ms; \"\" = 0"),

    STRING_KEY(plan.layers, "",
               "blocks per stage, e.g. \"3,3,3,3\"; \"\" = balanced by compute (of equally "
               "balanced splits, the one with the fewest blocks on the front stages)"),

    NUMBER_KEY(seed, 1337, AT_LEAST(0),
               "seed of every random stream (initial weights, data sampling)"),
};
enum { KEY_COUNT = sizeof schema / sizeof schema[0] };

#define NAME_MAX_LENGTH 128 /* longest dotted name we handle; schema names are far shorter */

static const config_key *find_key(const char *name)
{
    for (int i = 0; i < KEY_COUNT; i++)
        if (strcmp(schema[i].name, name) == 0) return &schema[i];
    return NULL;
}

/* A section is a proper prefix of some key name, ending before a dot. */
static bool is_section(const char *name)
{
    size_t length = strlen(name);
    for (int i = 0; i < KEY_COUNT; i++)
        if (strncmp(schema[i].name, name, length) == 0 && schema[i].name[length] == '.')
            return true;
    return false;
}

static bool is_integer_type(key_type type)
{
    return type == KEY_INT || type == KEY_LONG || type == KEY_LLONG;
}

static const char *type_name(key_type type)
{
    return is_integer_type(type) ? "integer"
           : type == KEY_DOUBLE  ? "number"
           : type == KEY_BOOL    ? "bool"
                                 : "string"; /* a choice is written as its name */
}

static void integer_limits(key_type type, long long *lo, long long *hi)
{
    *lo = type == KEY_INT ? INT_MIN : type == KEY_LONG ? LONG_MIN : LLONG_MIN;
    *hi = type == KEY_INT ? INT_MAX : type == KEY_LONG ? LONG_MAX : LLONG_MAX;
}

/* ---- reading and writing fields ------------------------------------------ */

static void *field_of(pipert_config *cfg, const config_key *key)
{
    return (char *)cfg + key->offset;
}

static const void *const_field_of(const pipert_config *cfg, const config_key *key)
{
    return (const char *)cfg + key->offset;
}

/* Integer and bool fields. The value has been checked to fit. */
static void write_integer(pipert_config *cfg, const config_key *key, long long value)
{
    void *field = field_of(cfg, key);
    switch (key->type) {
    case KEY_INT: *(int *)field = (int)value; break;
    case KEY_LONG: *(long *)field = (long)value; break;
    case KEY_LLONG: *(long long *)field = value; break;
    case KEY_BOOL: *(bool *)field = value != 0; break;
    default: break;
    }
}

/* Fills the whole buffer, so two configs holding the same strings compare
 * equal byte for byte. */
static void write_string(pipert_config *cfg, const config_key *key, const char *value,
                         size_t length)
{
    char *field = field_of(cfg, key);
    memset(field, 0, key->size);
    memcpy(field, value, length < key->size ? length : key->size - 1);
}

/* Stores a value that check_value accepted. */
static int choice_value(const config_key *key, const char *name);

static void write_json(pipert_config *cfg, const config_key *key, const json_t *value)
{
    if (key->type == KEY_CHOICE)
        *(int *)field_of(cfg, key) = choice_value(key, json_string_value(value));
    else if (key->type == KEY_DOUBLE)
        *(double *)field_of(cfg, key) = json_number_value(value);
    else if (key->type == KEY_STRING)
        write_string(cfg, key, json_string_value(value), json_string_length(value));
    else if (key->type == KEY_BOOL)
        write_integer(cfg, key, json_is_true(value));
    else
        write_integer(cfg, key, json_integer_value(value));
}

/* The field as a new JSON value; NULL if it has none (a non-finite double or a
 * string that is not UTF-8, which only C code writing the struct can cause). */
static const char *choice_name(const config_key *key, int value);

static json_t *read_json(const pipert_config *cfg, const config_key *key)
{
    const void *field = const_field_of(cfg, key);
    switch (key->type) {
    case KEY_INT: return json_integer(*(const int *)field);
    case KEY_LONG: return json_integer(*(const long *)field);
    case KEY_LLONG: return json_integer(*(const long long *)field);
    case KEY_DOUBLE: return json_real(*(const double *)field);
    case KEY_BOOL: return json_boolean(*(const bool *)field);
    case KEY_STRING: return json_stringn(field, strnlen(field, key->size));
    case KEY_CHOICE: {
        const char *name = choice_name(key, *(const int *)field);
        return name ? json_string(name) : NULL;
    }
    }
    return NULL;
}

void pt_config_defaults(pipert_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < KEY_COUNT; i++) {
        const config_key *key = &schema[i];
        if (key->type == KEY_DOUBLE)
            *(double *)field_of(cfg, key) = key->default_number;
        else if (key->type == KEY_STRING)
            write_string(cfg, key, key->default_string, strlen(key->default_string));
        else if (key->type == KEY_CHOICE)
            *(int *)field_of(cfg, key) = choice_value(key, key->default_string);
        else
            write_integer(cfg, key, (long long)key->default_number);
    }
}

/* ---- checking values ----------------------------------------------------- */

/* Why a value does not fit a key, in two parts so that each caller can word
 * its message: problem = "expected a number", found = "a string". */
typedef struct value_error {
    char problem[160];
    char found[160];
} value_error;

/* The fewest significant digits (1..17) that print x so that it reads back
 * exactly: 0.1 prints as 0.1, not as 0.10000000000000001. */
static int exact_precision(double x)
{
    char text[40];
    for (int digits = 1; digits < 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, x);
        if (strtod(text, NULL) == x) return digits;
    }
    return 17;
}

/* A scalar as JSON text ("3.5", "true", "\"adamw\""), truncated to fit. */
static void format_json(const json_t *value, char *out, size_t capacity)
{
    int digits = json_is_real(value) ? exact_precision(json_real_value(value)) : 17;
    char *text = json_dumps(value, JSON_ENCODE_ANY | JSON_REAL_PRECISION(digits));
    snprintf(out, capacity, "%s", text ? text : "?");
    free(text);
}

void pt_config_format_value(const pipert_config *cfg, const char *name, char *out,
                            size_t capacity)
{
    const config_key *key = find_key(name);
    json_t *value = key ? read_json(cfg, key) : NULL;
    format_json(value, out, capacity);
    json_decref(value);
}

/* What a value is, for "expected X, got Y": scalars show themselves, strings
 * and containers their kind (a string may be long). */
static void describe_json(const json_t *value, char *out, size_t capacity)
{
    if (json_is_string(value))
        snprintf(out, capacity, "a string");
    else if (json_is_object(value))
        snprintf(out, capacity, "an object");
    else if (json_is_array(value))
        snprintf(out, capacity, "an array");
    else
        format_json(value, out, capacity);
}

static bool type_mismatch(value_error *why, const char *expected, const json_t *value)
{
    snprintf(why->problem, sizeof why->problem, "expected %s", expected);
    describe_json(value, why->found, sizeof why->found);
    return false;
}

/* The range as text: "[0, 1)", ">= 1", "> 0"; "" if unbounded. */
static void format_range(const key_range *range, char *out, size_t capacity)
{
    bool has_min = range->min > -HUGE_VAL, has_max = range->max < HUGE_VAL;
    bool open_min = range->open & OPEN_MIN, open_max = range->open & OPEN_MAX;
    if (has_min && has_max)
        snprintf(out, capacity, "%c%g, %g%c", open_min ? '(' : '[', range->min, range->max,
                 open_max ? ')' : ']');
    else if (has_min)
        snprintf(out, capacity, "%s %g", open_min ? ">" : ">=", range->min);
    else if (has_max)
        snprintf(out, capacity, "%s %g", open_max ? "<" : "<=", range->max);
    else
        snprintf(out, capacity, "%s", "");
}

static bool check_range(const config_key *key, double x, const json_t *value, value_error *why)
{
    const key_range *r = &key->range;
    bool above_min = (r->open & OPEN_MIN) ? x > r->min : x >= r->min;
    bool below_max = (r->open & OPEN_MAX) ? x < r->max : x <= r->max;
    if (above_min && below_max) return true;
    char range[64];
    format_range(r, range, sizeof range);
    bool interval = range[0] == '[' || range[0] == '(';
    snprintf(why->problem, sizeof why->problem, "must be %s%s", interval ? "in " : "", range);
    format_json(value, why->found, sizeof why->found);
    return false;
}

/* ---- settings that are one of a list ----------------------------------------- */

/* Names a program adds to a key's list (pt_config_allow_choice): value n_names + k is the k-th
 * added to that key. */
#define ADDED_CHOICES_MAX 16

static struct added_choice {
    const config_key *key;
    char name[64];
} added_choices[ADDED_CHOICES_MAX];
static int added_choice_count;

static const char *choice_name(const config_key *key, int value)
{
    if (value >= 0 && value < key->n_names) return key->names[value];
    for (int i = 0, k = key->n_names; i < added_choice_count; i++)
        if (added_choices[i].key == key && k++ == value) return added_choices[i].name;
    return NULL;
}

/* -1: not a name of the key's */
static int choice_value(const config_key *key, const char *name)
{
    for (int v = 0; v < key->n_names; v++)
        if (!strcmp(key->names[v], name)) return v;
    for (int i = 0, k = key->n_names; i < added_choice_count; i++)
        if (added_choices[i].key == key) {
            if (!strcmp(added_choices[i].name, name)) return k;
            k++;
        }
    return -1;
}

/* The key's names, the schema's and those added: "a|b|c". */
static const char *choices_of(const config_key *key, char *text, size_t cap)
{
    text[0] = '\0';
    for (int v = 0; choice_name(key, v); v++)
        snprintf(text + strlen(text), cap - strlen(text), "%s%s", v ? "|" : "", choice_name(key, v));
    return text;
}

pipert_result pt_config_allow_choice(const char *key_name, const char *name, int *number)
{
    const config_key *key = find_key(key_name);
    if (!key || key->type != KEY_CHOICE)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s is not a key with a list of choices",
                       key_name);
    if (!name[0] || strchr(name, '|') || strlen(name) >= sizeof added_choices[0].name)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: \"%s\" cannot be a choice", key_name, name);
    int value = choice_value(key, name);
    if (value < 0) {
        if (added_choice_count == ADDED_CHOICES_MAX)
            return pt_fail(PIPERT_ERR_UNSUPPORTED, "at most %d choices can be added to the keys",
                           ADDED_CHOICES_MAX);
        added_choices[added_choice_count].key = key;
        snprintf(added_choices[added_choice_count].name, sizeof added_choices[0].name, "%s", name);
        added_choice_count++;
        value = choice_value(key, name);
    }
    if (number) *number = value;
    return PIPERT_OK;
}

const char *pt_config_choices(const char *key_name, char *text, size_t cap)
{
    const config_key *key = find_key(key_name);
    return key && key->type == KEY_CHOICE ? choices_of(key, text, cap) : NULL;
}

const char *pt_config_choice_name(const char *key_name, int value)
{
    const config_key *key = find_key(key_name);
    const char *name = key && key->type == KEY_CHOICE ? choice_name(key, value) : NULL;
    return name ? name : "?";
}

int pt_config_choice_value(const char *key_name, const char *name)
{
    const config_key *key = find_key(key_name);
    const int value = key && key->type == KEY_CHOICE ? choice_value(key, name) : -1;
    if (value < 0) {
        char choices[1024];
        pt_fail(PIPERT_ERR_CONFIG, "%s: unknown \"%s\" (known: %s)", key_name, name,
                key && key->type == KEY_CHOICE ? choices_of(key, choices, sizeof choices) : "none");
    }
    return value;
}

/* Does the JSON value fit the key: type, C type limits, range, length, choices? */
static bool check_value(const config_key *key, const json_t *value, value_error *why)
{
    if (is_integer_type(key->type)) {
        if (!json_is_integer(value)) return type_mismatch(why, "an integer", value);
        long long lo, hi, x = json_integer_value(value);
        integer_limits(key->type, &lo, &hi);
        if (x < lo || x > hi) { /* does not fit the C type: name the range that does */
            if (key->range.min > (double)lo) lo = (long long)ceil(key->range.min);
            if (key->range.max < (double)hi) hi = (long long)floor(key->range.max);
            snprintf(why->problem, sizeof why->problem, "must be in [%lld, %lld]", lo, hi);
            format_json(value, why->found, sizeof why->found);
            return false;
        }
        return check_range(key, (double)x, value, why);
    }
    if (key->type == KEY_DOUBLE) {
        if (!json_is_number(value)) return type_mismatch(why, "a number", value);
        return check_range(key, json_number_value(value), value, why);
    }
    if (key->type == KEY_BOOL)
        return json_is_boolean(value) ? true : type_mismatch(why, "true or false", value);

    if (!json_is_string(value)) return type_mismatch(why, "a string", value);
    if (key->type == KEY_CHOICE) {
        if (choice_value(key, json_string_value(value)) >= 0) return true;
        char choices[1024];
        snprintf(why->problem, sizeof why->problem, "must be one of %s",
                 choices_of(key, choices, sizeof choices));
        format_json(value, why->found, sizeof why->found);
        return false;
    }
    size_t length = json_string_length(value);
    if (length >= key->size) {
        snprintf(why->problem, sizeof why->problem, "must be shorter than %zu bytes", key->size);
        snprintf(why->found, sizeof why->found, "%zu bytes", length);
        return false;
    }
    return true;
}

/* " (did you mean 'train.lr'?)" for a name no key has (runtime/name_hint.h), or "". */
static void suggest_name(const char *unknown, char *out, size_t capacity)
{
    const char *names[KEY_COUNT];
    for (int i = 0; i < KEY_COUNT; i++) names[i] = schema[i].name;
    pt_name_hint(unknown, names, KEY_COUNT, out, capacity);
}

/* ---- merging JSON -------------------------------------------------------- */

#define MAX_DEPTH 8

/* A merge in progress: the raw text for positions and the path being walked. */
typedef struct merge_walk {
    const char *text, *source;
    const char *path[MAX_DEPTH];
    int depth;
} merge_walk;

/* "SOURCE:LINE:COLUMN: message" at the key path[0..depth). */
static pipert_result fail_at(const merge_walk *walk, int depth, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static pipert_result fail_at(const merge_walk *walk, int depth, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    pt_json_step steps[MAX_DEPTH];
    for (int i = 0; i < depth; i++) steps[i] = PT_JSON_KEY(walk->path[i]);
    pt_json_position at;
    pt_json_locate(walk->text, steps, depth, &at);
    return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", walk->source, at.key_line, at.key_column,
                   message);
}

static pipert_result merge_object(pipert_config *cfg, json_t *object, merge_walk *walk,
                                  const char *prefix)
{
    const char *name;
    json_t *value;
    int depth = walk->depth + 1; /* of the keys of this object */
    json_object_foreach(object, name, value) {
        walk->path[walk->depth] = name;
        char full[NAME_MAX_LENGTH + 1], hint[NAME_MAX_LENGTH + 32];
        snprintf(full, sizeof full, "%s%s", prefix, name);
        if (strchr(name, '.'))
            return fail_at(walk, depth, "unknown key '%s' (write sections as nested objects: "
                           "{\"train\": {\"lr\": 3e-4}})", full);

        const config_key *key = find_key(full);
        if (key) {
            value_error why;
            if (!check_value(key, value, &why))
                return fail_at(walk, depth, "%s: %s, got %s", key->name, why.problem, why.found);
            write_json(cfg, key, value);
        } else if (is_section(full) && depth < MAX_DEPTH) {
            char describe[64];
            if (!json_is_object(value)) {
                describe_json(value, describe, sizeof describe);
                return fail_at(walk, depth, "%s: expected an object of %s.* keys, got %s", full,
                               full, describe);
            }
            char section_prefix[NAME_MAX_LENGTH + 2];
            snprintf(section_prefix, sizeof section_prefix, "%s.", full);
            walk->depth++;
            pipert_result rc = merge_object(cfg, value, walk, section_prefix);
            walk->depth--;
            PT_TRY(rc);
        } else {
            suggest_name(full, hint, sizeof hint);
            return fail_at(walk, depth, "unknown key '%s'%s", full, hint);
        }
    }
    return PIPERT_OK;
}

pipert_result pt_config_merge_json(pipert_config *cfg, const char *text, const char *source)
{
    if (!cfg || !text || !source)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_config_merge_json: NULL argument");
    json_error_t error;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", source, error.line, error.column,
                       error.text);

    merge_walk walk = {.text = text, .source = source, .depth = 0};
    pipert_result rc;
    if (!json_is_object(root)) {
        char describe[64];
        describe_json(root, describe, sizeof describe);
        rc = fail_at(&walk, 0, "expected an object of sections, like {\"train\": {\"lr\": 3e-4}}, "
                     "got %s", describe);
    } else {
        /* Merge into a copy, so that a failure leaves cfg as it was. */
        pipert_config staged;
        memcpy(&staged, cfg, sizeof staged);
        rc = merge_object(&staged, root, &walk, "");
        if (rc == PIPERT_OK) memcpy(cfg, &staged, sizeof staged);
    }
    json_decref(root);
    return rc;
}

/* ---- overrides ----------------------------------------------------------- */

/* The value of an override: JSON if it parses ("3e-4", "true", "\"x\""),
 * else the bare text. A string key takes any unquoted text as it is, so
 * --data.path=123 is the file "123". */
static json_t *parse_override_value(const config_key *key, const char *text)
{
    json_t *value = json_loads(text, JSON_DECODE_ANY, NULL);
    if (value && ((key->type != KEY_STRING && key->type != KEY_CHOICE) || json_is_string(value)))
        return value;
    json_decref(value);
    return json_string(text); /* NULL if text is not UTF-8 */
}

pipert_result pipert_config_set(pipert_config *cfg, const char *assignment)
{
    if (!cfg || !assignment)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_config_set: NULL argument");
    const char *name = strncmp(assignment, "--", 2) == 0 ? assignment + 2 : assignment;
    const char *equals = strchr(name, '=');
    size_t name_length = equals ? (size_t)(equals - name) : 0;
    if (name_length == 0 || name_length > NAME_MAX_LENGTH)
        return pt_fail(PIPERT_ERR_CONFIG, "%s: expected KEY=VALUE, like train.lr=3e-4", assignment);

    char key_name[NAME_MAX_LENGTH + 1], hint[NAME_MAX_LENGTH + 32];
    memcpy(key_name, name, name_length);
    key_name[name_length] = '\0';
    const config_key *key = find_key(key_name);
    if (!key) {
        suggest_name(key_name, hint, sizeof hint);
        return pt_fail(PIPERT_ERR_CONFIG, "%s: unknown key '%s'%s", assignment, key_name, hint);
    }
    json_t *value = parse_override_value(key, equals + 1);
    if (!value) return pt_fail(PIPERT_ERR_CONFIG, "%s: the value is not valid UTF-8", assignment);
    value_error why;
    bool fits = check_value(key, value, &why);
    if (fits) write_json(cfg, key, value);
    json_decref(value);
    return fits ? PIPERT_OK : pt_fail(PIPERT_ERR_CONFIG, "%s: %s", assignment, why.problem);
}

/* ---- checks -------------------------------------------------------------- */

static pipert_result validate_wan(const pt_wan_settings *wan)
{
    double value;
    if (wan->bandwidth[0]) PT_TRY(pt_parse_bit_rate(wan->bandwidth, "wan.bandwidth", &value));
    if (wan->latency[0]) PT_TRY(pt_parse_duration(wan->latency, "wan.latency", &value));
    return PIPERT_OK;
}

pipert_result pt_config_validate(const pipert_config *cfg)
{
    if (!cfg) return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_config_validate: NULL config");
    /* Each key on its own, in case C code wrote the struct directly. */
    for (int i = 0; i < KEY_COUNT; i++) {
        const config_key *key = &schema[i];
        json_t *value = read_json(cfg, key);
        if (!value)
            return pt_fail(PIPERT_ERR_CONFIG, "%s: %s", key->name,
                           key->type == KEY_DOUBLE   ? "is not a finite number"
                           : key->type == KEY_CHOICE ? "holds a number that names none of its "
                                                       "choices"
                                                     : "is not valid UTF-8");
        value_error why;
        bool fits = check_value(key, value, &why);
        json_decref(value);
        if (!fits)
            return pt_fail(PIPERT_ERR_CONFIG, "%s: %s, got %s", key->name, why.problem, why.found);
    }
    PT_TRY(validate_wan(&cfg->wan));
    const pt_model_settings *m = &cfg->model;
    if (m->n_embd % m->n_head != 0)
        return pt_fail(PIPERT_ERR_CONFIG, "model.n_embd: %d is not a multiple of model.n_head = %d",
                       m->n_embd, m->n_head);
    const pt_pipeline_settings *p = &cfg->pipeline;
    if (p->sync_steps > 0 && p->schedule != PT_SCHEDULE_ASYNC_1F1B)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "pipeline.sync_steps: %ld, but only pipeline.schedule=async-1f1b has "
                       "steps to make synchronous (every step of %s is); leave it at 0",
                       p->sync_steps, pt_config_choice_name("pipeline.schedule", p->schedule));
    return PIPERT_OK;
}

/* ---- writing JSON -------------------------------------------------------- */

/* Sets root[a][b]... = value for the dotted name "a.b...", creating sections;
 * steals value. */
static bool set_dotted(json_t *root, const char *name, json_t *value)
{
    json_t *object = root;
    const char *dot;
    while (object && value && (dot = strchr(name, '.'))) {
        char section[NAME_MAX_LENGTH + 1];
        snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
        json_t *inner = json_object_get(object, section);
        if (!inner && json_object_set_new(object, section, inner = json_object()) != 0)
            inner = NULL;
        object = inner;
        name = dot + 1;
    }
    if (!object || !value) {
        json_decref(value);
        return false;
    }
    return json_object_set_new(object, name, value) == 0;
}

/* The keys whose names start with `prefix` as JSON text; NULL on failure.
 * Numbers are printed with the fewest digits that read back exactly. */
static char *dump_keys(const pipert_config *cfg, const char *prefix, size_t flags)
{
    json_t *root = json_object();
    int digits = 1;
    bool ok = root != NULL;
    for (int i = 0; i < KEY_COUNT && ok; i++) {
        const config_key *key = &schema[i];
        if (strncmp(key->name, prefix, strlen(prefix)) != 0) continue;
        if (key->type == KEY_DOUBLE) {
            int needed = exact_precision(*(const double *)const_field_of(cfg, key));
            digits = needed > digits ? needed : digits;
        }
        ok = set_dotted(root, key->name, read_json(cfg, key));
    }
    char *text = ok ? json_dumps(root, flags | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits)) : NULL;
    json_decref(root);
    return text;
}

/* Whether a key's name is one of `names` or starts with one of them that ends in a dot. */
static bool key_in(const char *name, const char *const *names)
{
    for (; names && *names; names++) {
        const size_t n = strlen(*names);
        const bool section = n > 0 && (*names)[n - 1] == '.';
        if (section ? strncmp(name, *names, n) == 0 : strcmp(name, *names) == 0) return true;
    }
    return false;
}

int pt_config_describe_changes(const pipert_config *was, const pipert_config *now,
                               const char *const *compared, const char *const *ignored, char *out,
                               size_t capacity)
{
    int changes = 0;
    size_t used = 0;
    if (capacity) out[0] = '\0';
    for (int i = 0; i < KEY_COUNT; i++) {
        const config_key *key = &schema[i];
        if (!key_in(key->name, compared) || key_in(key->name, ignored)) continue;
        json_t *before = read_json(was, key), *after = read_json(now, key);
        if (!json_equal(before, after)) {
            char a[80], b[80];
            format_json(before, a, sizeof a);
            format_json(after, b, sizeof b);
            if (used < capacity)
                used += (size_t)snprintf(out + used, capacity - used, "%s%s %s -> %s",
                                         changes ? ", " : "", key->name, a, b);
            changes++;
        }
        json_decref(before);
        json_decref(after);
    }
    return changes;
}

char *pipert_config_to_json(const pipert_config *cfg)
{
    return cfg ? dump_keys(cfg, "", JSON_INDENT(2)) : NULL;
}

char *pt_config_model_to_json(const pipert_config *cfg)
{
    return cfg ? dump_keys(cfg, "model.", JSON_COMPACT) : NULL;
}

/* ---- documentation ------------------------------------------------------- */

void pt_config_print_help(FILE *out)
{
    pipert_config defaults;
    pt_config_defaults(&defaults);
    fprintf(out, "  %-24s %-8s %-9s %s\n", "KEY", "TYPE", "DEFAULT", "DESCRIPTION");
    for (int i = 0; i < KEY_COUNT; i++) {
        const config_key *key = &schema[i];
        char shown[64] = "?", allowed[80];
        json_t *value = read_json(&defaults, key);
        if (value) format_json(value, shown, sizeof shown);
        json_decref(value);
        char choices[1024];
        if (key->type == KEY_CHOICE)
            snprintf(allowed, sizeof allowed, " (%s)", choices_of(key, choices, sizeof choices));
        else if (key->type != KEY_BOOL && key->type != KEY_STRING) {
            char range[64];
            format_range(&key->range, range, sizeof range);
            snprintf(allowed, sizeof allowed, range[0] ? " (%s)" : "%s", range);
        } else
            allowed[0] = '\0';
        fprintf(out, "  %-24s %-8s %-9s %s%s\n", key->name, type_name(key->type), shown, key->doc,
                allowed);
    }
}

/* ---- the public API ------------------------------------------------------ */

pipert_result pipert_config_create(pipert_config **out)
{
    if (!out) return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_config_create: NULL argument");
    *out = malloc(sizeof **out);
    if (!*out) return pt_fail(PIPERT_ERR_NOMEM, "configuration: out of memory");
    pt_config_defaults(*out);
    return PIPERT_OK;
}

pipert_result pipert_config_load_file(pipert_config *cfg, const char *path)
{
    if (!cfg || !path)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_config_load_file: NULL argument");
    char *text;
    size_t size;
    PT_TRY(pt_read_file(path, &text, &size));
    pipert_result rc = strlen(text) == size ? pt_config_merge_json(cfg, text, path)
                                            : pt_fail(PIPERT_ERR_CONFIG,
                                                      "%s: holds a NUL byte; not a JSON text", path);
    free(text);
    return rc;
}

void pipert_config_free(pipert_config *cfg) { free(cfg); }
