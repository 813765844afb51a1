/* The settings a configuration holds: one row per key (runtime/config_schema.h) with its dotted
 * name, where it lives in struct pipert_config, its default, its allowed range or choices (the
 * names of the values of an enumeration, runtime/settings.h) and a line of documentation.
 * runtime/config.c reads, checks, writes and documents configurations from this table alone, so
 * a new key (or a whole new section) is a new row here and a new struct field, nothing else.
 * A key's C type is not written in the table: _Generic reads it off the struct field, so the
 * table and the struct cannot disagree. */
#include "runtime/config_schema.h"

#include <math.h>
#include <stdbool.h>

#include "runtime/config.h"

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

const config_key pt_config_schema[] = {
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
const int pt_config_key_count = (int)(sizeof pt_config_schema / sizeof pt_config_schema[0]);
