/* The configuration: one typed struct, filled from defaults, a JSON file and
 * "--section.key=value" overrides, through one schema table (config.c) that
 * gives every key its type, default, allowed range and documentation.
 *
 * Keys follow the names users know from nanoGPT and Hugging Face. */
#ifndef PT_CONFIG_H
#define PT_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "pipert/pipert.h"
#include "runtime/job_digest.h"
#include "runtime/settings.h"

#define PT_CONFIG_STRING_MAX 1024

typedef struct pt_model_settings {
    int n_layer;       /* transformer blocks */
    int n_embd;        /* channels C */
    int n_head;        /* attention heads; n_embd % n_head == 0 */
    int block_size;    /* sequence length T (also the size of wpe) */
    int vocab_size;    /* V; ≥ 256 for the byte-level tokenizer */
    bool tie_weights;  /* lm_head shares wte (single-stage runs only) */
} pt_model_settings;

typedef struct pt_train_settings {
    int batch_size;        /* sequences per worker per microbatch */
    int grad_accum;        /* microbatches per optimizer step */
    long steps;            /* optimizer steps */
    double lr;             /* peak learning rate γ */
    long warmup_steps;     /* linear warm-up from 0 */
    double min_lr_ratio;   /* cosine decay ends at min_lr_ratio·lr */
    pt_optimizer_kind optimizer;
    double beta1, beta2, eps, weight_decay;
    double momentum_decay; /* NAdamW's ψ: how fast μ_t rises to β1 */
    double grad_clip;      /* global-norm clip; 0 disables */
    long val_every;        /* validation every N steps (and at the end); 0 = only at the end */
    int val_batches;       /* batches per validation */
    long log_every;        /* a metrics line every N steps */
    long checkpoint_every; /* a checkpoint every N steps (and at the end); 0 = only at the end */
    int keep_checkpoints;  /* newest checkpoints kept; 0 = all */
} pt_train_settings;

typedef struct pt_data_settings {
    char path[PT_CONFIG_STRING_MAX];   /* text file, directory of text files, or llm.c .bin shard; "" = fortunes */
    pt_data_format format;             /* how to read path */
    double val_fraction;               /* tail of the token stream held out for validation */
    pt_sampling sampling;
} pt_data_settings;

typedef struct pt_runtime_settings {
    int threads;                       /* compute threads; 0 = every core of this machine */
    pt_device_kind device;             /* where the kernels run */
    pt_precision precision;            /* the matrix products' operands */
    bool authenticate_messages;        /* a MAC on every message between workers */
    int coordinator_check_steps;       /* how often the ranks agree whether the coordinator is gone */
} pt_runtime_settings;

typedef struct pt_pipeline_settings {
    pt_schedule_kind schedule;
    pt_lookahead lookahead;               /* weight handling of async-1f1b */
    long lookahead_warmup;                /* predict-damped, pipemare: K (0: train.warmup_steps) */
    double dc_lambda;                     /* dc-asgd, nesterov-dc: λ (0: the look-ahead's own) */
    long sync_steps;                      /* async-1f1b: steps run without staleness first */
    int microbatches;                     /* per optimizer step (gpipe, 1f1b) */
    bool recompute;                       /* recompute activations at backward time */
    pt_transfer transfer;                 /* what activations and their gradients cross as */
    bool trace;                           /* write a Chrome trace per rank */
} pt_pipeline_settings;

/* The coupling of a stage's replicas (dp/, ALGORITHMS.md §4). */
typedef struct pt_dp_settings {
    int method;                          /* pt_dp_method, or one a program added */
    pt_codec_kind compress;              /* what crosses the link */
    int block;                           /* elements per quantization block */
    long delay;                          /* −1: apply when it arrives; N ≥ 0: exactly N steps later */
    double fraction;                     /* sparse: p */
    int partition_block;                 /* sparse: elements that go to a partition together */
    pt_sparse_rule rule;                 /* sparse */
    double lambda;                       /* sparse: weight of the EMA correction */
    long ema_warmup_steps;               /* sparse: steps at μ_e = 0.5 */
    long period;                         /* H */
    double outer_lr, outer_momentum;
    int fragments;                       /* streaming: 0 = about 3 layers each */
    int overlap;                         /* streaming: τ */
    double alpha;                        /* streaming: merge weight of the local parameters */
    pt_co2_penalty penalty;              /* co2: how Λ is had */
    double penalty_value;                /* co2: constant Λ */
    double clip;                         /* co2: φ */
    bool nccl;                           /* allreduce on cuda: NCCL between the replicas' GPUs */
} pt_dp_settings;

/* Emulated wide-area links between the sites of a `pipert launch --sites N`
 * (tools/wan/): empty bandwidth and latency = no emulation. */
typedef struct pt_wan_settings {
    char bandwidth[PT_CONFIG_STRING_MAX]; /* "100mbit": each direction of each link between sites */
    char latency[PT_CONFIG_STRING_MAX];   /* "50ms": one way */
} pt_wan_settings;

typedef struct pt_plan_settings {
    char layers[PT_CONFIG_STRING_MAX]; /* "3,3,3,3": blocks per stage; "" = balanced by compute */
} pt_plan_settings;

struct pipert_config {
    pt_model_settings model;
    pt_train_settings train;
    pt_data_settings data;
    pt_runtime_settings runtime;
    pt_pipeline_settings pipeline;
    pt_dp_settings dp;
    pt_plan_settings plan;
    pt_wan_settings wan;
    int64_t seed;
};

/* Fills cfg with every key's default. */
void pt_config_defaults(pipert_config *cfg);

/* Merges a JSON text; `source` names it in errors ("run.json", or
 * "checkpoint.safetensors metadata"). Errors read "SOURCE:LINE:COLUMN: ...". */
pipert_result pt_config_merge_json(pipert_config *cfg, const char *text, const char *source);

/* The keys whose values differ between `was` and `now`, among those named in
 * `compared` and not in `ignored` (NULL-terminated lists; an entry ending in a
 * dot names a section: "train."), written to out as "train.lr 0.001 -> 0.0005,
 * pipeline.lookahead \"nesterov\" -> \"nesterov-dc\"" (cut to fit).
 * Returns how many differ. */
int pt_config_describe_changes(const pipert_config *was, const pipert_config *now,
                               const char *const *compared, const char *const *ignored, char *out,
                               size_t capacity);

/* The identity every worker of one job must share (runtime/job_digest.h): this build's protocol
 * version and a digest, in parts, of the settings that fix what the workers send each other,
 * for a job of `stages` stages split at bounds[0..stages] (the first block of each stage, and
 * n_layer; pt_stage_plan.bounds). What is in it, and why, is beside its lists in config_digest.c. */
void pt_config_job_digest(const pipert_config *cfg, int stages, const int *bounds,
                          pt_job_identity *out);

/* A key's value as JSON text ("2", "\"sparse\"", "true"; "?" for a name no key has), cut to
 * fit `capacity`. */
void pt_config_format_value(const pipert_config *cfg, const char *name, char *out,
                            size_t capacity);

/* Checks relations between keys (n_embd divisible by n_head, ...). */
pipert_result pt_config_validate(const pipert_config *cfg);

/* Documentation of every key: name, type, default, description. */
void pt_config_print_help(FILE *out);

/* Lets `value` be chosen for the key `key_name` (one with a list of choices), beside the
 * schema's own: what a program that adds a row to an owner's table (a dp method,
 * pt_coupling_add_method) calls, so that the configuration accepts its name; *number (may
 * be NULL): the value the key holds when it is chosen. Process-wide, like the tables: call it
 * before configurations are read. */
pipert_result pt_config_allow_choice(const char *key_name, const char *value, int *number);

/* The choices of `key_name`, the schema's and those added, as "a|b|c" in `text`; NULL for a
 * key without a list. */
const char *pt_config_choices(const char *key_name, char *text, size_t cap);

/* The name of value `value` of the key `key_name` ("pipeline.lookahead", PT_LOOKAHEAD_STASH:
 * "stash"): what logs, metrics and checkpoints write. "?" for a value the key does not have. */
const char *pt_config_choice_name(const char *key_name, int value);

/* The value of the key `key_name` called `name` (a checkpoint's, a peer's); -1 with a
 * PIPERT_ERR_CONFIG naming the key and its choices if it has none so called. */
int pt_config_choice_value(const char *key_name, const char *name);

/* The keys of cfg.model alone as a JSON object text (checkpoint metadata);
 * caller frees. */
char *pt_config_model_to_json(const pipert_config *cfg);

#endif
