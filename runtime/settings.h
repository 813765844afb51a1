/* The settings whose value is one of a list: what the configuration holds once it is read
 * (runtime/config.h's fields have these types), so that no code past the reading compares a
 * setting's name. The names users write are runtime/config_schema.c's, one per value; each value's
 * facts are a row of its owner's table, indexed by these numbers (the owner in each comment).
 * The config test `every_choice_is_a_row_of_its_owners_table` holds the names and the rows
 * together. Checkpoints and logs write names (pt_config_choice_name), never these numbers. */
#ifndef PT_SETTINGS_H
#define PT_SETTINGS_H

/* runtime.device: kernels/device.c */
typedef enum pt_device_kind {
    PT_DEVICE_CPU,
    PT_DEVICE_CUDA,
    PT_DEVICE_CPU_GUARDED, /* the CPU's kernels on memory the host cannot read outside them */
    PT_DEVICE_KINDS
} pt_device_kind;

/* runtime.precision: models/gpt.c (the matrix products' operands) */
typedef enum pt_precision {
    PT_PRECISION_FP32, /* every operand fp32 */
    PT_PRECISION_BF16, /* the matrix products' operands rounded to bf16, fp32 accumulation */
    PT_PRECISIONS
} pt_precision;

/* pipeline.transfer: pipeline/transfer.c (what crosses between stages) */
typedef enum pt_transfer {
    PT_TRANSFER_AUTO, /* bf16 under runtime.precision = bf16, fp32 otherwise */
    PT_TRANSFER_FP32, /* activations and their gradients as the model keeps them */
    PT_TRANSFER_BF16, /* rounded to bf16: half the bytes */
    PT_TRANSFERS
} pt_transfer;

/* pipeline.schedule: pipeline/schedule.c */
typedef enum pt_schedule_kind {
    PT_SCHEDULE_GPIPE,      /* all forwards, all backwards, one optimizer step (flush) */
    PT_SCHEDULE_1F1B,       /* PipeDream-Flush: warm-up, one forward one backward, drain, step */
    PT_SCHEDULE_ASYNC_1F1B, /* PipeDream: no flush, an optimizer step after every backward */
    PT_SCHEDULE_KINDS
} pt_schedule_kind;

/* pipeline.lookahead: pipeline/lookahead.c */
typedef enum pt_lookahead {
    PT_LOOKAHEAD_NONE,
    PT_LOOKAHEAD_STASH,
    PT_LOOKAHEAD_NESTEROV,
    PT_LOOKAHEAD_PREDICT,
    PT_LOOKAHEAD_PREDICT_DAMPED,
    PT_LOOKAHEAD_PIPEMARE,
    PT_LOOKAHEAD_DC_ASGD,
    PT_LOOKAHEAD_NESTEROV_DC,     /* nesterov's optimizer with dc-asgd's compensation */
    PT_LOOKAHEAD_NESTEROV_SECANT, /* nesterov's optimizer, compensated by a measured secant */
    PT_LOOKAHEADS
} pt_lookahead;

/* train.optimizer: train/optimizer.c */
typedef enum pt_optimizer_kind {
    PT_OPTIMIZER_ADAMW,
    PT_OPTIMIZER_NADAMW,
    PT_OPTIMIZER_KINDS
} pt_optimizer_kind;

/* dp.method: dp/coupling.c's methods[]. A program may add methods (pt_coupling_add_method):
 * theirs are numbered from PT_DP_BUILT_IN_METHODS on, in the order they were added, so the
 * field that holds a method is an int. */
typedef enum pt_dp_method {
    PT_DP_ALLREDUCE,
    PT_DP_SPARSE,
    PT_DP_DILOCO,
    PT_DP_STREAMING_DILOCO,
    PT_DP_CO2,
    PT_DP_NONE,
    PT_DP_BUILT_IN_METHODS
} pt_dp_method;

/* dp.compress: dp/codec.c */
typedef enum pt_codec_kind {
    PT_CODEC_NONE,
    PT_CODEC_INT8,
    PT_CODEC_E3M0,
    PT_CODEC_E2M1,
    PT_CODEC_ONEBIT,
    PT_CODEC_KINDS
} pt_codec_kind;

/* dp.rule (sparse): dp/sparse.c */
typedef enum pt_sparse_rule {
    PT_RULE_EMA,   /* the average plus λ times the EMA of the drift since sending */
    PT_RULE_AVG,   /* the average */
    PT_RULE_DELTA, /* the average plus the drift */
    PT_SPARSE_RULES
} pt_sparse_rule;

/* dp.penalty (co2): dp/co2.c */
typedef enum pt_co2_penalty {
    PT_PENALTY_CONSTANT, /* dp.penalty_value */
    PT_PENALTY_ADAPTIVE, /* measured each round */
    PT_CO2_PENALTIES
} pt_co2_penalty;

/* data.format: runtime/data.c */
typedef enum pt_data_format {
    PT_DATA_AUTO,   /* decided from the file */
    PT_DATA_TEXT,   /* bytes */
    PT_DATA_TOKENS, /* an llm.c .bin shard */
    PT_DATA_FORMATS
} pt_data_format;

/* data.sampling: runtime/data.c */
typedef enum pt_sampling {
    PT_SAMPLING_RANDOM,     /* uniform offsets from (seed, step, sequence) */
    PT_SAMPLING_SEQUENTIAL, /* the stream in order: sequence q of the run starts at q·T */
    PT_SAMPLINGS
} pt_sampling;

#endif
