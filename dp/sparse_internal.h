/* dp.method=sparse's state, shared by its files: dp/sparse.c (the method) and
 * dp/sparse_checkpoint.c (its state in checkpoints). */
#ifndef PT_SPARSE_INTERNAL_H
#define PT_SPARSE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dp/codec.h"
#include "dp/coupling.h"
#include "dp/exchange.h"
#include "comm/collectives.h"
#include "runtime/safetensors.h"

/* A descriptor: DESCRIPTOR_FIELDS integers in [0, 2^16), one slot per replica. */
enum {
    FIELD_METHOD,
    FIELD_STEP_LOW,
    FIELD_STEP_HIGH,
    FIELD_COUNT_LOW,
    FIELD_COUNT_MID,
    FIELD_COUNT_HIGH,
    FIELD_PARTITIONS_LOW,
    FIELD_PARTITIONS_HIGH,
    FIELD_CODEC, /* 4096·kind + block mod 4096 */
    FIELD_SEED,
    FIELD_LAYOUT,
    FIELD_UNIT, /* dp.partition_block */
    DESCRIPTOR_FIELDS
};
#define METHOD_TAG 0x5350 /* "SP" */
#define MAX_REPLICAS 256  /* so that 65535·R stays below 2^24 */
#define MAX_PARTITIONS (1L << 20) /* p ≥ 1e-6 */

/* The checkpoint's format of "dp.sparse.state". */
#define STATE_VERSION 1
enum { STATE_HEADER = 4 }; /* version, P, pending count, last step; then each pending step */

/* A mean in flight: the fp32 ring all-reduce, or a compressed exchange
 * (dp/exchange.h); both NULL once it has ended. */
typedef struct in_flight {
    pt_allreduce_handle *allreduce;
    pt_exchange *exchange;
} in_flight;

/* One partition on its way: posted after optimizer step `step`. */
typedef struct sparse_exchange {
    long step;
    size_t count, capacity;
    uint32_t *index; /* [count] offsets into θ: the partition I */
    float *w_old;    /* [count] θ[I] when posted */
    float *values;   /* [count] θ[I] when posted (compressed: θ[I] − ref), then ā */
    float *ref;      /* [count] compressed: agreed[I] when posted */
    float *descriptors; /* [R·DESCRIPTOR_FIELDS] */
    in_flight descriptor_mean, values_mean;
    pt_exchange_state *feedback; /* onebit: its error buffers, laid out as `index` */
    bool arrived; /* both ended, the descriptors checked */
    double posted_us; /* trace clock when posted */
} sparse_exchange;

typedef struct sparse_state {
    pt_coupling_options options;
    const pipert_config *config;
    int R, me;       /* replicas of the stage; this one's index */
    long P;          /* partitions per tensor */
    long delay;      /* dp.delay */
    pt_sparse_rule rule;
    float lambda;
    pt_codec codec; /* dp.compress, dp.block */
    uint32_t seed_tag, layout_tag; /* 16-bit digests for the descriptor */

    /* Set up at the first call, from the model. */
    bool ready;
    size_t n_params, max_count;
    uint32_t *partitions;  /* [n_params]: per tensor, its partitions of this cycle one
                              after another, each in increasing order, as offsets into θ */
    long partitions_cycle; /* the cycle they belong to; −1 = none */
    size_t unit;           /* dp.partition_block: elements that go to a partition together */
    uint32_t *ids;         /* [units of the largest tensor]: scratch, the shuffled partition ids */
    size_t *cursor;        /* [P]: scratch of the bucketing */
    long *short_unit_part; /* [tensors]: the partition of the tensor's last unit this cycle */
    float *ema;             /* [n_params] e (rule ema) */
    /* Compressed exchanges quantize θ[I] − agreed[I], not θ[I]: parameters
     * themselves do not survive 4 bits, their drift since the last average
     * does. agreed holds, per element, the last average every replica got
     * (bitwise the same everywhere), starting from the initial θ. */
    float *agreed;          /* [n_params], or NULL (dp.compress=none) */
    /* θ[I] of an exchange being applied (host, [max_count]); with kernels whose memory the host
     * cannot read, the partition crosses through the table: its indices and values in the
     * kernels' memory ([max_count] each, else NULL), gathered from θ and scattered back. */
    float *theta_now;
    uint32_t *device_index;
    float *device_values;
    size_t loaded_agreed;   /* elements a checkpoint brought (0: none) */
    size_t loaded_ema;      /* elements of e a checkpoint brought (0: none) */
    /* onebit: the error feedback of every parameter, worker and server side */
    float *worker_error, *server_error; /* [n_params] each */
    size_t loaded_feedback;             /* elements a checkpoint brought (0: none) */

    /* The queue: `length` exchanges from `head`, oldest first. */
    sparse_exchange *queue;
    int capacity, head, length;

    bool failed; /* an exchange failed: every later call fails too */
    /* queues whose exchanges were abandoned when replicas left: a late message may still land
     * in their buffers, so they are freed only with the method */
    sparse_exchange **retired;
    int *retired_capacity, n_retired;
    bool suspend_failed; /* out of memory retiring a queue */
    int64_t *saved_state; /* what save handed the writer (valid until the next save) */
} sparse_state;

#pragma GCC visibility push(hidden)

/* The k-th exchange of the queue, oldest first. */
sparse_exchange *pt_sparse_queue_at(sparse_state *s, int k);
/* Makes room for `count` elements in an exchange's buffers. */
pipert_result pt_sparse_reserve(sparse_exchange *x, size_t count, int R);
/* Completes exchange x (or, unless `wait`, PIPERT_ERR_TIMEOUT while it runs). */
pipert_result pt_sparse_arrive(sparse_state *s, sparse_exchange *x, bool wait);
/* Abandons what is in flight and frees a queue's buffers. */
void pt_sparse_free_queue(sparse_exchange *queue, int capacity);

/* The method's save and load (sparse_checkpoint.c). */
pipert_result pt_sparse_save(void *state, pt_safetensors_writer *w);
pipert_result pt_sparse_load(void *state, const pt_safetensors *st, const char *path);

#pragma GCC visibility pop

#endif
