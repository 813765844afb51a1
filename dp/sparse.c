/* dp.method=sparse: asynchronous sparse parameter averaging with an EMA
 * correction (AsyncMesh; ALGORITHMS.md §4.2).
 *
 * Partitions. Every tensor of n elements is cut into P = ⌈1/p⌉ partitions of
 * (nearly) equal size, ⌊(j+1)·n/P⌋ − ⌊j·n/P⌋ elements for partition j: the
 * list of partition ids [0, 0, …, 1, 1, …, P−1] is shuffled (Fisher–Yates,
 * the same as slicing a random permutation of the elements) and element e
 * gets id e. The shuffle draws from Philox with the key (seed, hash of the
 * tensor's global name) and the counter (cycle, block), so every replica
 * holds the same partitions, whatever the stage split, and no index ever
 * crosses the network. Step t averages partition (t−1) mod P of cycle
 * (t−1) div P: new partitions every P steps, each element once per cycle. The
 * step, not a local counter, picks the partition, so replicas agree by
 * construction.
 *
 * After optimizer step t (after_step), with I the step's partition:
 *   post     a = θ[I], w_old = θ[I]; start a non-blocking mean of a over the
 *            replicas of the stage (it runs on the transport's progress
 *            thread while the replica keeps training): the fp32 ring
 *            all-reduce, or with dp.compress ≠ none the compressed exchange
 *            of dp/exchange.h (onebit's error feedback is kept per parameter,
 *            see feedback_load);
 *   apply    when its average ā is there (dp.delay = −1: at the first call
 *            that finds it complete; dp.delay = N: exactly N steps after the
 *            post, waiting if it is late; N = 0 waits in the same call), with
 *            θ_now = θ[I] and d = θ_now − w_old:
 *              ema    e[I] = μ_e·e[I] + (1−μ_e)·d;  θ[I] = ā + λ·e[I]
 *              avg    θ[I] = ā
 *              delta  θ[I] = ā + d
 *            then the newest weight stash, if the schedule keeps one, takes
 *            θ[I] too. μ_e is 0.5 for dp.ema_warmup_steps steps, then rises
 *            along a cosine to 0.99 at train.steps.
 * A call applies what is due first, then posts, so a post always carries the
 * latest state. Exchanges in flight form a FIFO queue (dp.delay + 1 of them;
 * with dp.delay = −1 at most MAX_IN_FLIGHT, after which a replica that runs
 * that far ahead of its slowest peer waits for the oldest). The last step
 * (train.steps) waits for and applies everything still in flight, so a run
 * ends with nothing on the wire.
 *
 * Checks. Beside each partition goes a descriptor all-reduce: every replica
 * writes small integers (method, step, count, P, codec, seed, slice layout) times R
 * into its own slot of R slots, zeros elsewhere, so the mean returns each
 * replica's descriptor exactly (integers below 2^24 add and divide exactly in
 * fp32). A replica whose descriptor differs is named, and nothing of that
 * exchange is applied. A peer that runs another method altogether sends
 * messages of other sizes, which the transport's header check refuses,
 * naming its rank.
 *
 * Checkpoints (save/load): the EMA buffer e, onebit's error feedback, P, and
 * every exchange in flight, first completed (save waits for it) and stored
 * as its step, indices, w_old and ā; a resumed run applies them at the same
 * steps as an uninterrupted one, so with a fixed dp.delay it continues with
 * the same losses.
 *
 * θ is read and written in host memory: runtime.device=cuda is refused.
 * With one replica the method does nothing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/codec.h"
#include "dp/exchange.h"
#include "dp/wait.h"
#include "dp/methods.h"
#include "runtime/log.h"
#include "runtime/rng.h"

/* Exchanges a replica may have in flight with dp.delay = −1. */
#define MAX_IN_FLIGHT 16

/* A wait for the replicas asks should_stop this often. */

/* The last word of the partitions' Philox counters. */
#define PARTITION_STREAM 0x73706172u /* "spar" */

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
    DESCRIPTOR_FIELDS
};
#define METHOD_TAG 0x5350 /* "SP" */
#define MAX_REPLICAS 256  /* so that 65535·R stays below 2^24 */
#define MAX_PARTITIONS (1L << 20) /* p ≥ 1e-6 */

/* The checkpoint's format of "dp.sparse.state". */
#define STATE_VERSION 1
enum { STATE_HEADER = 4 }; /* version, P, pending count, last step; then each pending step */

typedef enum sparse_rule { RULE_EMA, RULE_AVG, RULE_DELTA } sparse_rule;

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
    sparse_rule rule;
    float lambda;
    pt_codec codec; /* dp.compress, dp.block */
    uint32_t seed_tag, layout_tag; /* 16-bit digests for the descriptor */

    /* Set up at the first call, from the model. */
    bool ready;
    size_t n_params, max_count;
    uint32_t *partitions;  /* [n_params]: per tensor, its partitions of this cycle one
                              after another, each in increasing order, as offsets into θ */
    long partitions_cycle; /* the cycle they belong to; −1 = none */
    uint32_t *ids;         /* [largest tensor]: scratch, the shuffled partition ids */
    size_t *cursor;        /* [P]: scratch of the bucketing */
    float *ema;             /* [n_params] e (rule ema) */
    /* Compressed exchanges quantize θ[I] − agreed[I], not θ[I]: parameters
     * themselves do not survive 4 bits, their drift since the last average
     * does. agreed holds, per element, the last average every replica got
     * (bitwise the same everywhere), starting from the initial θ. */
    float *agreed;          /* [n_params], or NULL (dp.compress=none) */
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

/* ---- small helpers -------------------------------------------------------- */

static size_t slice_begin(size_t n, long parts, long k)
{
    return (size_t)((unsigned __int128)n * (uint64_t)k / (uint64_t)parts);
}

static uint32_t digest16(uint64_t h) { return (uint32_t)((h ^ h >> 16 ^ h >> 32 ^ h >> 48) & 0xffffu); }

static sparse_exchange *queue_at(sparse_state *s, int k)
{
    return &s->queue[(s->head + k) % s->capacity];
}

/* μ_e at step t: 0.5 for the warm-up, then a cosine from 0.5 to 0.99 at the last step. */
static float ema_decay(const sparse_state *s, long step)
{
    const long warmup = s->config->dp.ema_warmup_steps, total = s->config->train.steps;
    if (step <= warmup || total <= warmup) return 0.5f;
    double q = (double)(step - warmup) / (double)(total - warmup);
    if (q > 1) q = 1;
    return (float)(0.5 + (0.99 - 0.5) * 0.5 * (1.0 - cos(M_PI * q)));
}


/* ---- creation ---------------------------------------------------------------- */

static pipert_result parse_rule(const char *name, sparse_rule *out)
{
    if (!strcmp(name, "ema")) *out = RULE_EMA;
    else if (!strcmp(name, "avg")) *out = RULE_AVG;
    else if (!strcmp(name, "delta")) *out = RULE_DELTA;
    else return pt_fail(PIPERT_ERR_CONFIG, "dp.rule: unknown \"%s\" (expected ema, avg or delta)", name);
    return PIPERT_OK;
}

static pipert_result sparse_create(const pt_coupling_options *options, void **out)
{
    const pt_dp_settings *dp = &options->config->dp;
    pt_codec codec;
    PT_TRY(pt_codec_init(&codec, dp->compress, dp->block > 0 ? (size_t)dp->block : 1));
    if (strcmp(options->config->runtime.device, "cpu"))
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "dp.method=sparse reads and writes θ in host memory: runtime.device=%s is "
                       "not supported yet",
                       options->config->runtime.device);
    if (!(dp->fraction > 0 && dp->fraction <= 1))
        return pt_fail(PIPERT_ERR_CONFIG, "dp.fraction: must be in (0, 1], got %g", dp->fraction);
    /* P = ⌈1/p⌉, the tiny slack keeps p = 0.05 at 20, not 21 */
    const double partitions = ceil(1.0 / dp->fraction - 1e-9);
    if (partitions > (double)MAX_PARTITIONS)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.fraction=%g: %.0f partitions per tensor, at most %ld (p >= 1e-6)",
                       dp->fraction, partitions, MAX_PARTITIONS);
    sparse_rule rule = RULE_EMA;
    PT_TRY(parse_rule(dp->rule, &rule));
    const int R = options->replicas ? pt_group_size(options->replicas) : 1;
    if (R > MAX_REPLICAS)
        return pt_fail(PIPERT_ERR_UNSUPPORTED, "dp.method=sparse: %d replicas (at most %d)", R,
                       MAX_REPLICAS);
    sparse_state *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory");
    s->options = *options;
    s->config = options->config;
    s->R = R;
    s->me = options->replicas ? pt_group_index(options->replicas) : 0;
    s->P = partitions < 1 ? 1 : (long)partitions;
    s->delay = dp->delay;
    s->rule = rule;
    s->lambda = (float)dp->lambda;
    s->codec = codec;
    s->seed_tag = digest16((uint64_t)options->config->seed * 0x9e3779b97f4a7c15ull);
    s->partitions_cycle = -1;
    s->capacity = s->delay >= 0 ? (int)s->delay + 1 : MAX_IN_FLIGHT;
    s->queue = calloc((size_t)s->capacity, sizeof *s->queue);
    if (!s->queue) {
        const int capacity = s->capacity;
        free(s);
        return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for %d exchanges in flight",
                       capacity);
    }
    *out = s;
    return PIPERT_OK;
}

/* ---- partitions ------------------------------------------------------------ */

/* Uniform draws in [0, bound) from the 32-bit words of the Philox blocks
 * (key, counter (block, cycle, PARTITION_STREAM)), four words a block,
 * by Lemire's multiply-and-reject: what every replica draws alike. */
typedef struct word_stream {
    pt_philox_key key;
    uint32_t cycle;
    uint64_t block;
    uint32_t words[4];
    int next; /* 4: the next word needs a new block */
} word_stream;

static uint32_t stream_word(word_stream *w)
{
    if (w->next == 4) {
        const uint32_t counter[4] = {(uint32_t)w->block, (uint32_t)(w->block >> 32), w->cycle,
                                     PARTITION_STREAM};
        pt_philox4x32(w->key, counter, w->words);
        w->block++;
        w->next = 0;
    }
    return w->words[w->next++];
}

static uint32_t stream_below(word_stream *w, uint32_t bound)
{
    uint64_t m = (uint64_t)stream_word(w) * bound;
    if ((uint32_t)m < bound) {
        const uint32_t threshold = (0u - bound) % bound; /* 2^32 mod bound */
        while ((uint32_t)m < threshold) m = (uint64_t)stream_word(w) * bound;
    }
    return (uint32_t)(m >> 32);
}

/* The partitions of `cycle`: per tensor, its partition ids shuffled, then
 * its elements bucketed by id in increasing order (so gathers run forward). */
static void draw_partitions(sparse_state *s, const pt_gpt_slice *model, long cycle)
{
    for (int t = 0; t < model->n_tensors; t++) {
        const pt_gpt_tensor *tensor = &model->tensors[t];
        const size_t n = tensor->numel;
        uint32_t *id = s->ids;
        for (long j = 0; j < s->P; j++) {
            const size_t begin = slice_begin(n, s->P, j), end = slice_begin(n, s->P, j + 1);
            for (size_t k = begin; k < end; k++) id[k] = (uint32_t)j;
            s->cursor[j] = begin;
        }
        word_stream w = {.key = pt_rng_key((uint64_t)s->config->seed, pt_hash_string(tensor->name)),
                         .cycle = (uint32_t)cycle,
                         .next = 4};
        for (size_t i = n; i-- > 1;) {
            const uint32_t j = stream_below(&w, (uint32_t)(i + 1));
            const uint32_t swap = id[i];
            id[i] = id[j];
            id[j] = swap;
        }
        uint32_t *out = s->partitions + tensor->offset;
        for (size_t e = 0; e < n; e++) out[s->cursor[id[e]]++] = (uint32_t)(tensor->offset + e);
    }
    s->partitions_cycle = cycle;
}

/* Everything that depends on the model: its size, the partitions, e. */
static pipert_result set_up(sparse_state *s, const pt_gpt_slice *model)
{
    if (model->n_params > UINT32_MAX)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "dp sparse: the stage holds %zu parameters; partitions index at most 2^32",
                       model->n_params);
    uint64_t layout = 0xcbf29ce484222325ull;
    size_t max_count = 0, largest = 1;
    for (int t = 0; t < model->n_tensors; t++) {
        const pt_gpt_tensor *tensor = &model->tensors[t];
        layout = (layout ^ pt_hash_string(tensor->name)) * 0x100000001b3ull;
        layout = (layout ^ tensor->numel) * 0x100000001b3ull;
        max_count += (tensor->numel + (size_t)s->P - 1) / (size_t)s->P;
        if (tensor->numel > largest) largest = tensor->numel;
    }
    s->layout_tag = digest16(layout);
    s->n_params = model->n_params;
    s->max_count = max_count;
    s->partitions = malloc((model->n_params ? model->n_params : 1) * sizeof *s->partitions);
    s->ids = malloc(largest * sizeof *s->ids);
    s->cursor = malloc((size_t)s->P * sizeof *s->cursor);
    if (!s->partitions || !s->ids || !s->cursor)
        return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for the partitions of %zu parameters",
                       model->n_params);
    if (s->loaded_ema && s->loaded_ema != model->n_params)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "dp sparse: the checkpoint's EMA holds %zu values, the stage %zu parameters",
                       s->loaded_ema, model->n_params);
    if (s->loaded_agreed && s->loaded_agreed != model->n_params)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "dp sparse: the checkpoint's agreed values hold %zu, the stage %zu parameters",
                       s->loaded_agreed, model->n_params);
    if (s->rule == RULE_EMA && !s->ema) {
        s->ema = calloc(model->n_params ? model->n_params : 1, sizeof *s->ema);
        if (!s->ema)
            return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for the EMA of %zu parameters",
                           model->n_params);
    }
    if (s->codec.kind == PT_CODEC_ONEBIT) {
        if (s->loaded_feedback && s->loaded_feedback != model->n_params)
            return pt_fail(PIPERT_ERR_FORMAT,
                           "dp sparse: the checkpoint's error feedback holds %zu values, the "
                           "stage %zu parameters",
                           s->loaded_feedback, model->n_params);
        if (!s->worker_error) s->worker_error = calloc(model->n_params ? model->n_params : 1, sizeof(float));
        if (!s->server_error) s->server_error = calloc(model->n_params ? model->n_params : 1, sizeof(float));
        if (!s->worker_error || !s->server_error)
            return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for the error feedback of %zu "
                                             "parameters", model->n_params);
    }
    /* What a checkpoint brought must fit this model. */
    for (int k = 0; k < s->length; k++) {
        const sparse_exchange *x = queue_at(s, k);
        for (size_t i = 0; i < x->count; i++)
            if (x->index[i] >= model->n_params)
                return pt_fail(PIPERT_ERR_FORMAT,
                               "dp sparse: the checkpoint's exchange of step %ld indexes element "
                               "%u of a stage of %zu parameters",
                               x->step, x->index[i], model->n_params);
    }
    s->ready = true;
    return PIPERT_OK;
}

/* Makes room for `count` elements in an exchange's buffers. */
static pipert_result reserve(sparse_exchange *x, size_t count, int R)
{
    if (!x->descriptors) {
        x->descriptors = malloc((size_t)R * DESCRIPTOR_FIELDS * sizeof *x->descriptors);
        if (!x->descriptors) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory");
    }
    if (count <= x->capacity) return PIPERT_OK;
    uint32_t *index = realloc(x->index, count * sizeof *index);
    if (index) x->index = index;
    float *w_old = realloc(x->w_old, count * sizeof *w_old);
    if (w_old) x->w_old = w_old;
    float *values = realloc(x->values, count * sizeof *values);
    if (values) x->values = values;
    float *ref = realloc(x->ref, count * sizeof *ref);
    if (ref) x->ref = ref;
    if (!index || !w_old || !values || !ref)
        return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for a partition of %zu elements",
                       count);
    x->capacity = count;
    return PIPERT_OK;
}

/* x->index ← the partition of `step`; x->values = x->w_old ← θ there. */
static void gather_partition(sparse_state *s, const pt_coupling_point *at, sparse_exchange *x)
{
    const long call = at->step - 1, part = call % s->P;
    if (s->partitions_cycle != call / s->P) draw_partitions(s, at->model, call / s->P);
    size_t count = 0;
    for (int t = 0; t < at->model->n_tensors; t++) {
        const pt_gpt_tensor *tensor = &at->model->tensors[t];
        const uint32_t *members = s->partitions + tensor->offset;
        size_t begin = slice_begin(tensor->numel, s->P, part),
               end = slice_begin(tensor->numel, s->P, part + 1);
        for (size_t k = begin; k < end; k++, count++) {
            const uint32_t j = members[k];
            x->index[count] = j;
            x->w_old[count] = x->values[count] = at->params[j];
            if (s->agreed) {
                x->ref[count] = s->agreed[j];
                x->values[count] -= s->agreed[j];
            }
        }
    }
    x->count = count;
}

/* ---- descriptors ----------------------------------------------------------- */

static void describe(const sparse_state *s, long step, size_t count, uint32_t field[DESCRIPTOR_FIELDS])
{
    field[FIELD_METHOD] = METHOD_TAG;
    field[FIELD_STEP_LOW] = (uint32_t)step & 0xffffu;
    field[FIELD_STEP_HIGH] = (uint32_t)((uint64_t)step >> 16) & 0xffffu;
    field[FIELD_COUNT_LOW] = (uint32_t)count & 0xffffu;
    field[FIELD_COUNT_MID] = (uint32_t)((uint64_t)count >> 16) & 0xffffu;
    field[FIELD_COUNT_HIGH] = (uint32_t)((uint64_t)count >> 32) & 0xffffu;
    field[FIELD_PARTITIONS_LOW] = (uint32_t)s->P & 0xffffu;
    field[FIELD_PARTITIONS_HIGH] = (uint32_t)((uint64_t)s->P >> 16) & 0xffffu;
    field[FIELD_CODEC] = (uint32_t)s->codec.kind * 4096u + (uint32_t)(s->codec.block % 4096u);
    field[FIELD_SEED] = s->seed_tag;
    field[FIELD_LAYOUT] = s->layout_tag;
}

/* Each replica's slot holds its fields times R; the mean leaves them as they are. */
static void write_descriptors(const sparse_state *s, sparse_exchange *x)
{
    uint32_t field[DESCRIPTOR_FIELDS];
    describe(s, x->step, x->count, field);
    memset(x->descriptors, 0, (size_t)s->R * DESCRIPTOR_FIELDS * sizeof *x->descriptors);
    for (int f = 0; f < DESCRIPTOR_FIELDS; f++)
        x->descriptors[s->me * DESCRIPTOR_FIELDS + f] = (float)field[f] * (float)s->R;
}

/* "step 12, 3301 values, P = 20, dp.compress=none (…), seed #a1b2, stage slice #c3d4". */
static void format_descriptor(const float *slot, char *out, size_t capacity)
{
    uint64_t f[DESCRIPTOR_FIELDS];
    for (int i = 0; i < DESCRIPTOR_FIELDS; i++) {
        if (!(slot[i] >= 0 && slot[i] < 65536 && slot[i] == floorf(slot[i]))) {
            snprintf(out, capacity, "not a dp.method=sparse descriptor (field %d reads %g)", i,
                     (double)slot[i]);
            return;
        }
        f[i] = (uint64_t)slot[i];
    }
    if (f[FIELD_METHOD] != METHOD_TAG) {
        snprintf(out, capacity, "not a dp.method=sparse descriptor (method tag %llu)",
                 (unsigned long long)f[FIELD_METHOD]);
        return;
    }
    const pt_codec codec = {(pt_codec_kind)(f[FIELD_CODEC] / 4096), 1};
    snprintf(out, capacity,
             "step %llu, %llu values, P = %llu, dp.compress=%s (block %llu mod 4096), seed "
             "#%04llx, stage slice #%04llx",
             (unsigned long long)(f[FIELD_STEP_LOW] | f[FIELD_STEP_HIGH] << 16),
             (unsigned long long)(f[FIELD_COUNT_LOW] | f[FIELD_COUNT_MID] << 16 |
                                  f[FIELD_COUNT_HIGH] << 32),
             (unsigned long long)(f[FIELD_PARTITIONS_LOW] | f[FIELD_PARTITIONS_HIGH] << 16),
             f[FIELD_CODEC] / 4096 <= PT_CODEC_ONEBIT ? pt_codec_name(&codec) : "?",
             (unsigned long long)(f[FIELD_CODEC] % 4096), (unsigned long long)f[FIELD_SEED],
             (unsigned long long)f[FIELD_LAYOUT]);
}

/* Every replica's slot must read as ours. */
static pipert_result check_descriptors(const sparse_state *s, const sparse_exchange *x)
{
    uint32_t field[DESCRIPTOR_FIELDS];
    describe(s, x->step, x->count, field);
    for (int r = 0; r < s->R; r++) {
        const float *slot = x->descriptors + (size_t)r * DESCRIPTOR_FIELDS;
        bool same = true;
        for (int f = 0; f < DESCRIPTOR_FIELDS; f++) same = same && slot[f] == (float)field[f];
        if (same) continue;
        char theirs[256], ours[256];
        float mine[DESCRIPTOR_FIELDS];
        for (int f = 0; f < DESCRIPTOR_FIELDS; f++) mine[f] = (float)field[f];
        format_descriptor(slot, theirs, sizeof theirs);
        format_descriptor(mine, ours, sizeof ours);
        /* With sites the group is the sites' leaders, in site order. */
        const char *who = s->options.sites > 1 ? "the leader of site" : "replica";
        return pt_fail(PIPERT_ERR_PEER,
                       "dp sparse, stage %d: %s %d sent %s, where this replica (%s %d) sent %s; "
                       "nothing of it was applied. Every replica of a stage must run the same "
                       "dp.method, dp.fraction, dp.compress, dp.block, seed and model at the "
                       "same step",
                       s->options.stage, who, r, theirs, who, s->me, ours);
    }
    return PIPERT_OK;
}

/* ---- means in flight ------------------------------------------------------- */

/* Waits at most timeout_s: PIPERT_ERR_TIMEOUT (no message) while it runs,
 * else its result, the handle released. */
static pipert_result in_flight_wait_for(in_flight *op, double timeout_s)
{
    pipert_result rc = PIPERT_OK;
    if (op->exchange) rc = pt_exchange_wait_for(op->exchange, timeout_s);
    else if (op->allreduce) rc = pt_allreduce_wait_for(op->allreduce, timeout_s);
    if (rc != PIPERT_ERR_TIMEOUT) *op = (in_flight){0};
    return rc;
}

/* Gives up on it: it frees itself when the peers answer or the transport
 * closes. An all-reduce's buffer must outlive that (destroy runs after the
 * transport is gone); an exchange writes nothing after this returns. */
static void in_flight_abandon(in_flight *op)
{
    if (op->exchange) pt_exchange_abandon(op->exchange);
    else if (op->allreduce) pt_allreduce_abandon(op->allreduce);
    *op = (in_flight){0};
}

static pipert_result in_flight_wait_cb(void *op, double timeout_s)
{
    return in_flight_wait_for(op, timeout_s);
}

static void in_flight_abandon_cb(void *op) { in_flight_abandon(op); }

/* Ends `op`: unless `wait`, PIPERT_ERR_TIMEOUT while it runs; with `wait`,
 * as dp/wait.h waits (a stop abandons it). */
static pipert_result in_flight_finish(const sparse_state *s, in_flight *op, bool wait,
                                      const char *what)
{
    if (wait)
        return pt_coupling_wait(&s->options,
                                (pt_pending_op){in_flight_wait_cb, in_flight_abandon_cb, op}, what);
    pipert_result rc = in_flight_wait_for(op, 0.0);
    if (rc != PIPERT_OK && rc != PIPERT_ERR_TIMEOUT) pt_error_prefix("%s", what);
    return rc;
}

/* ---- onebit's error feedback, kept per parameter ------------------------------
 *
 * The exchange keeps its error buffers by position in the vector; a sparse
 * vector holds other parameters at every step. So each exchange gets a state
 * of its own, loaded from the per-parameter buffers when it starts and stored
 * back when it ends: worker error at every position k (parameter index[k]),
 * server error over this member's chunk, positions [me·C, me·C + its length)
 * with C = N/R and N the count padded to a multiple of 8R (dp/exchange.h).
 * An element in two exchanges in flight at once (across a cycle) keeps the
 * error of the later one. */
static size_t server_chunk_begin(const sparse_state *s, size_t count)
{
    const size_t unit = 8 * (size_t)s->R, padded = (count + unit - 1) / unit * unit;
    return (size_t)s->me * (padded / (size_t)s->R);
}

static pipert_result feedback_load(sparse_state *s, sparse_exchange *x)
{
    PT_TRY(pt_exchange_state_create(s->options.replicas, x->count, &x->feedback));
    size_t nw, ns;
    float *worker = pt_exchange_state_worker_error(x->feedback, &nw);
    float *server = pt_exchange_state_server_error(x->feedback, &ns);
    const size_t first = server_chunk_begin(s, x->count);
    if (nw != x->count || (ns && first + ns > x->count))
        return pt_fail(PIPERT_ERR_INTERNAL, "dp sparse: onebit error buffers of %zu and %zu "
                                            "elements for a vector of %zu", nw, ns, x->count);
    for (size_t k = 0; k < nw; k++) worker[k] = s->worker_error[x->index[k]];
    for (size_t k = 0; k < ns; k++) server[k] = s->server_error[x->index[first + k]];
    return PIPERT_OK;
}

static void feedback_store(sparse_state *s, sparse_exchange *x)
{
    if (!x->feedback) return;
    size_t nw, ns;
    const float *worker = pt_exchange_state_worker_error(x->feedback, &nw);
    const float *server = pt_exchange_state_server_error(x->feedback, &ns);
    const size_t first = server_chunk_begin(s, x->count);
    for (size_t k = 0; k < nw; k++) s->worker_error[x->index[k]] = worker[k];
    for (size_t k = 0; k < ns; k++) s->server_error[x->index[first + k]] = server[k];
    pt_exchange_state_free(x->feedback);
    x->feedback = NULL;
}

/* ---- the exchange queue --------------------------------------------------- */

/* Starts the mean of the values: the fp32 ring all-reduce, or the exchange
 * with the codec; adds what this replica sends to *bytes. */
static pipert_result start_values_mean(sparse_state *s, sparse_exchange *x, double *bytes)
{
    pt_group *g = s->options.replicas;
    if (s->codec.kind == PT_CODEC_NONE) {
        PT_TRY(pt_allreduce_start(g, x->values, x->count, PT_REDUCE_MEAN, &x->values_mean.allreduce));
        *bytes += (double)pt_allreduce_bytes_sent(g, x->count);
        return PIPERT_OK;
    }
    if (s->codec.kind == PT_CODEC_ONEBIT) PT_TRY(feedback_load(s, x));
    PT_TRY(pt_exchange_start(g, &s->codec, x->feedback, x->values, x->count, x->values,
                             &x->values_mean.exchange));
    *bytes += (double)pt_exchange_bytes_sent(x->values_mean.exchange);
    return PIPERT_OK;
}

static pipert_result post(sparse_state *s, const pt_coupling_point *at, pt_coupling_metrics *m)
{
    sparse_exchange *x = queue_at(s, s->length);
    PT_TRY(reserve(x, s->max_count, s->R));
    x->step = at->step;
    x->arrived = false;
    x->posted_us = pt_trace_clock_us(s->options.trace);
    gather_partition(s, at, x);
    write_descriptors(s, x);
    const size_t n_descriptors = (size_t)s->R * DESCRIPTOR_FIELDS;
    double bytes = (double)pt_allreduce_bytes_sent(s->options.replicas, n_descriptors);
    pipert_result rc = pt_allreduce_start(s->options.replicas, x->descriptors, n_descriptors,
                                          PT_REDUCE_MEAN, &x->descriptor_mean.allreduce);
    if (rc == PIPERT_OK) rc = start_values_mean(s, x, &bytes);
    s->length++; /* queued even on failure: destroy abandons whatever was started */
    if (rc != PIPERT_OK) {
        pt_error_prefix("dp sparse: posting the partition of step %ld", at->step);
        return rc;
    }
    m->bytes_sent += bytes;
    return PIPERT_OK;
}

/* Completes exchange x (or, unless `wait`, returns PIPERT_ERR_TIMEOUT while
 * it runs). The descriptors are checked as soon as they are there, so a
 * replica that posted something else is named before its values are read. */
static pipert_result arrive(sparse_state *s, sparse_exchange *x, bool wait)
{
    if (x->arrived) return PIPERT_OK;
    char what[96];
    snprintf(what, sizeof what, "dp sparse: the average of the partition of step %ld", x->step);
    if (x->descriptor_mean.allreduce) {
        PT_TRY(in_flight_finish(s, &x->descriptor_mean, wait, what));
        PT_TRY(check_descriptors(s, x));
    }
    PT_TRY(in_flight_finish(s, &x->values_mean, wait, what));
    feedback_store(s, x);
    if (s->agreed) /* the mean drift back into values: ā, the new agreement */
        for (size_t i = 0; i < x->count; i++) {
            x->values[i] += x->ref[i];
            s->agreed[x->index[i]] = x->values[i];
        }
    x->arrived = true;
    pt_trace_span(s->options.trace, "exchange", x->posted_us, pt_trace_clock_us(s->options.trace),
                  -1, x->step, x->step);
    return PIPERT_OK;
}

/* θ[I] from ā, by the rule; the newest stash follows. */
static void apply(sparse_state *s, const sparse_exchange *x, pt_coupling_point *at)
{
    float *theta = at->params;
    const float mu = ema_decay(s, at->step), lambda = s->lambda;
    for (size_t i = 0; i < x->count; i++) {
        const uint32_t j = x->index[i];
        const float average = x->values[i], drift = theta[j] - x->w_old[i];
        switch (s->rule) {
        case RULE_EMA:
            s->ema[j] = mu * s->ema[j] + (1.0f - mu) * drift;
            theta[j] = average + lambda * s->ema[j];
            break;
        case RULE_AVG: theta[j] = average; break;
        case RULE_DELTA: theta[j] = average + drift; break;
        }
        if (at->newest_stash) at->newest_stash[j] = theta[j];
    }
}

/* Applies the oldest exchange (waiting for it if `wait`); PIPERT_ERR_TIMEOUT
 * if it has not arrived and may not be waited for. */
static pipert_result apply_oldest(sparse_state *s, pt_coupling_point *at, bool wait,
                                  double *delay_sum, int *applied)
{
    sparse_exchange *x = queue_at(s, 0);
    pipert_result rc = arrive(s, x, wait);
    if (rc != PIPERT_OK) {
        if (rc != PIPERT_ERR_TIMEOUT) s->failed = true;
        return rc;
    }
    apply(s, x, at);
    *delay_sum += (double)(at->step - x->step);
    (*applied)++;
    s->head = (s->head + 1) % s->capacity;
    s->length--;
    return PIPERT_OK;
}

/* Before the first optimizer step every replica holds the same θ: with
 * compression it is where the agreement starts (a resumed run brings its own). */
static pipert_result sparse_after_backward(void *state, pt_coupling_point *at,
                                           pt_coupling_metrics *m)
{
    sparse_state *s = state;
    (void)m;
    if (!s->options.replicas || s->codec.kind == PT_CODEC_NONE || s->agreed) return PIPERT_OK;
    s->agreed = malloc((at->n_params ? at->n_params : 1) * sizeof *s->agreed);
    if (!s->agreed)
        return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for the agreed values of %zu "
                                         "parameters", at->n_params);
    memcpy(s->agreed, at->params, at->n_params * sizeof *s->agreed);
    return PIPERT_OK;
}

static pipert_result sparse_after_step(void *state, pt_coupling_point *at, pt_coupling_metrics *m)
{
    sparse_state *s = state;
    if (!s->options.replicas) return PIPERT_OK;
    if (s->failed)
        return pt_fail(PIPERT_ERR_INTERNAL, "dp sparse: an earlier exchange failed (step %ld)",
                       at->step);
    if (!s->ready) {
        pipert_result rc = set_up(s, at->model);
        if (rc != PIPERT_OK) {
            s->failed = true;
            return rc;
        }
    }
    if (at->n_params != s->n_params)
        return pt_fail(PIPERT_ERR_INTERNAL, "dp sparse: the stage has %zu parameters, not %zu",
                       at->n_params, s->n_params);
    double delay_sum = 0;
    int applied = 0;
    pipert_result rc = PIPERT_OK;
    /* What is due: dp.delay = N, posted N steps ago (or earlier: from a
     * checkpoint); dp.delay = −1, whatever has arrived, and the oldest if the
     * queue is full. */
    if (s->delay >= 0) {
        while (rc == PIPERT_OK && s->length > 0 && queue_at(s, 0)->step + s->delay <= at->step)
            rc = apply_oldest(s, at, true, &delay_sum, &applied);
    } else {
        while (rc == PIPERT_OK && s->length > 0)
            rc = apply_oldest(s, at, false, &delay_sum, &applied);
        if (rc == PIPERT_ERR_TIMEOUT) rc = PIPERT_OK;
        if (rc == PIPERT_OK && s->length == s->capacity)
            rc = apply_oldest(s, at, true, &delay_sum, &applied);
    }
    if (rc == PIPERT_OK) {
        rc = post(s, at, m);
        if (rc != PIPERT_OK) s->failed = true;
    }
    /* dp.delay = 0 applies in the same call; the last step leaves nothing in flight. */
    const bool last = at->step >= s->config->train.steps;
    while (rc == PIPERT_OK && s->length > 0 && (s->delay == 0 || last))
        rc = apply_oldest(s, at, true, &delay_sum, &applied);
    if (applied) m->delay = delay_sum / applied;
    return rc;
}

/* ---- checkpoints ------------------------------------------------------------ */

static pipert_result sparse_save(void *state, pt_safetensors_writer *w)
{
    sparse_state *s = state;
    if (!s->options.replicas) return PIPERT_OK;
    /* Exchanges in flight are completed (not applied): their ā goes into the file. */
    for (int k = 0; k < s->length; k++) {
        pipert_result rc = arrive(s, queue_at(s, k), true);
        if (rc != PIPERT_OK) {
            s->failed = true;
            pt_error_prefix("dp sparse: saving a checkpoint");
            return rc;
        }
    }
    free(s->saved_state);
    s->saved_state = calloc((size_t)(STATE_HEADER + s->length), sizeof *s->saved_state);
    if (!s->saved_state) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory");
    int64_t *v = s->saved_state;
    v[0] = STATE_VERSION;
    v[1] = s->P;
    v[2] = s->length;
    v[3] = s->length ? queue_at(s, s->length - 1)->step : 0;
    for (int k = 0; k < s->length; k++) v[STATE_HEADER + k] = queue_at(s, k)->step;
    int64_t shape[1] = {STATE_HEADER + s->length};
    PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.state", PT_DTYPE_I64, v, 1, shape));
    shape[0] = (int64_t)s->n_params;
    if (s->ema) PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.ema", PT_DTYPE_F32, s->ema, 1, shape));
    if (s->agreed)
        PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.agreed", PT_DTYPE_F32, s->agreed, 1, shape));
    if (s->worker_error) {
        PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.worker_error", PT_DTYPE_F32,
                                         s->worker_error, 1, shape));
        PT_TRY(pt_safetensors_writer_add(w, "dp.sparse.server_error", PT_DTYPE_F32,
                                         s->server_error, 1, shape));
    }
    for (int k = 0; k < s->length; k++) {
        const sparse_exchange *x = queue_at(s, k);
        char name[64];
        shape[0] = (int64_t)x->count;
        snprintf(name, sizeof name, "dp.sparse.pending.%d.index", k);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_U32, x->index, 1, shape));
        snprintf(name, sizeof name, "dp.sparse.pending.%d.w_old", k);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, x->w_old, 1, shape));
        snprintf(name, sizeof name, "dp.sparse.pending.%d.average", k);
        PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, x->values, 1, shape));
    }
    return PIPERT_OK;
}

/* A tensor of the checkpoint: present, of `dtype`, one dimension. */
static pipert_result find_vector(const pt_safetensors *st, const char *path, const char *name,
                                 pt_dtype dtype, const pt_tensor_entry **out)
{
    const pt_tensor_entry *t = pt_safetensors_find(st, name);
    if (!t) return pt_fail(PIPERT_ERR_FORMAT, "%s: no tensor %s (dp.method=sparse state)", path, name);
    if (t->dtype != dtype || t->ndim != 1)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %s is %s with %d dimensions, not a %s vector", path,
                       name, pt_dtype_name(t->dtype), t->ndim, pt_dtype_name(dtype));
    *out = t;
    return PIPERT_OK;
}

static pipert_result load_exchange(sparse_state *s, const pt_safetensors *st, const char *path,
                                   int k, long step)
{
    char name[64];
    const pt_tensor_entry *index = NULL, *w_old = NULL, *average = NULL;
    snprintf(name, sizeof name, "dp.sparse.pending.%d.index", k);
    PT_TRY(find_vector(st, path, name, PT_DTYPE_U32, &index));
    snprintf(name, sizeof name, "dp.sparse.pending.%d.w_old", k);
    PT_TRY(find_vector(st, path, name, PT_DTYPE_F32, &w_old));
    snprintf(name, sizeof name, "dp.sparse.pending.%d.average", k);
    PT_TRY(find_vector(st, path, name, PT_DTYPE_F32, &average));
    if (w_old->numel != index->numel || average->numel != index->numel)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: the exchange %d of dp.sparse.pending has parts of "
                                          "%zu, %zu and %zu elements",
                       path, k, index->numel, w_old->numel, average->numel);
    sparse_exchange *x = queue_at(s, s->length);
    PT_TRY(reserve(x, index->numel, s->R));
    x->step = step;
    x->count = index->numel;
    memcpy(x->index, pt_safetensors_data(st, index), index->nbytes);
    memcpy(x->w_old, pt_safetensors_data(st, w_old), w_old->nbytes);
    memcpy(x->values, pt_safetensors_data(st, average), average->nbytes);
    for (size_t i = 0; s->ready && i < x->count; i++)
        if (x->index[i] >= s->n_params)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: the exchange of step %ld indexes element %u "
                                              "of a stage of %zu parameters",
                           path, step, x->index[i], s->n_params);
    x->descriptor_mean = x->values_mean = (in_flight){0};
    x->arrived = true; /* checked before it was saved */
    s->length++;
    return PIPERT_OK;
}

/* *buffer ← the F32 vector `name` (replacing what it held); *n its length,
 * checked against the stage now if it is known, else at the first call. */
static pipert_result load_floats(const sparse_state *s, const pt_safetensors *st, const char *path,
                                 const char *name, float **buffer, size_t *n)
{
    const pt_tensor_entry *t = NULL;
    PT_TRY(find_vector(st, path, name, PT_DTYPE_F32, &t));
    if (s->ready && t->numel != s->n_params)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %s holds %zu values, the stage %zu parameters",
                       path, name, t->numel, s->n_params);
    float *copy = malloc(t->nbytes ? t->nbytes : 1);
    if (!copy) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for %s", name);
    memcpy(copy, pt_safetensors_data(st, t), t->nbytes);
    free(*buffer);
    *buffer = copy;
    *n = t->numel;
    return PIPERT_OK;
}

static pipert_result sparse_load(void *state, const pt_safetensors *st, const char *path)
{
    sparse_state *s = state;
    if (!s->options.replicas) return PIPERT_OK;
    const char *method = pt_safetensors_metadata(st, "dp_method");
    const pt_tensor_entry *state_entry = pt_safetensors_find(st, "dp.sparse.state");
    if (!state_entry) {
        if (method && !strcmp(method, "sparse"))
            return pt_fail(PIPERT_ERR_FORMAT, "%s: written by dp.method=sparse but holds no "
                                              "dp.sparse.state", path);
        pt_info("%s was written by dp.method=%s: dp.method=sparse starts with an empty EMA and "
                "nothing in flight", path, method ? method : "(none)");
        return PIPERT_OK;
    }
    PT_TRY(find_vector(st, path, "dp.sparse.state", PT_DTYPE_I64, &state_entry));
    if (state_entry->numel < STATE_HEADER)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: dp.sparse.state has %zu values", path,
                       state_entry->numel);
    int64_t *v = malloc(state_entry->nbytes);
    if (!v) return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory");
    memcpy(v, pt_safetensors_data(st, state_entry), state_entry->nbytes);
    pipert_result rc = PIPERT_OK;
    if (v[0] != STATE_VERSION)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: dp.sparse.state version %lld (this build reads %d)",
                     path, (long long)v[0], STATE_VERSION);
    else if (v[1] != s->P)
        rc = pt_fail(PIPERT_ERR_CONFIG,
                     "%s: written with %lld partitions per tensor, but dp.fraction=%g gives %ld: "
                     "resume with the dp.fraction of that run",
                     path, (long long)v[1], s->config->dp.fraction, s->P);
    else if (v[2] < 0 || v[2] > s->capacity || state_entry->numel != (size_t)(STATE_HEADER + v[2]))
        rc = pt_fail(PIPERT_ERR_CONFIG,
                     "%s: %lld exchanges in flight, more than dp.delay=%ld keeps (at most %d)",
                     path, (long long)v[2], s->delay, s->capacity);
    for (int k = 0; rc == PIPERT_OK && k < (int)v[2]; k++)
        rc = load_exchange(s, st, path, k, (long)v[STATE_HEADER + k]);
    free(v);
    PT_TRY(rc);
    size_t n;
    if (s->rule == RULE_EMA && pt_safetensors_find(st, "dp.sparse.ema")) {
        PT_TRY(load_floats(s, st, path, "dp.sparse.ema", &s->ema, &n));
        s->loaded_ema = n;
    }
    if (s->codec.kind != PT_CODEC_NONE && pt_safetensors_find(st, "dp.sparse.agreed")) {
        PT_TRY(load_floats(s, st, path, "dp.sparse.agreed", &s->agreed, &n));
        s->loaded_agreed = n;
    }
    if (s->codec.kind == PT_CODEC_ONEBIT && pt_safetensors_find(st, "dp.sparse.worker_error")) {
        PT_TRY(load_floats(s, st, path, "dp.sparse.worker_error", &s->worker_error, &n));
        PT_TRY(load_floats(s, st, path, "dp.sparse.server_error", &s->server_error,
                           &s->loaded_feedback));
        if (n != s->loaded_feedback)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: dp.sparse.worker_error holds %zu values, "
                                              "dp.sparse.server_error %zu", path, n,
                           s->loaded_feedback);
    }
    return PIPERT_OK;
}

/* Abandons what is in flight and frees the queue's buffers (the transport
 * must be gone, or the exchanges abandoned long before). */
static void free_queue(sparse_exchange *queue, int capacity)
{
    for (int k = 0; k < capacity; k++) {
        sparse_exchange *x = &queue[k];
        in_flight_abandon(&x->descriptor_mean);
        in_flight_abandon(&x->values_mean);
        pt_exchange_state_free(x->feedback);
        free(x->index);
        free(x->w_old);
        free(x->values);
        free(x->ref);
        free(x->descriptors);
    }
    free(queue);
}

/* Replicas left: whatever is in flight will not complete; its queue is
 * retired whole (the exchanges abandoned), and a fresh one starts empty. */
static void sparse_suspend(void *state)
{
    sparse_state *s = state;
    for (int k = 0; k < s->capacity; k++) {
        in_flight_abandon(&s->queue[k].descriptor_mean);
        in_flight_abandon(&s->queue[k].values_mean);
    }
    s->failed = false; /* what failed was in the retired queue */
    sparse_exchange *fresh = calloc((size_t)s->capacity, sizeof *fresh);
    sparse_exchange **retired = realloc(s->retired, (size_t)(s->n_retired + 1) * sizeof *retired);
    int *capacities = realloc(s->retired_capacity, (size_t)(s->n_retired + 1) * sizeof *capacities);
    if (retired) s->retired = retired;
    if (capacities) s->retired_capacity = capacities;
    if (!fresh || !retired || !capacities) {
        free(fresh);
        s->suspend_failed = true; /* the regroup says so */
        return;
    }
    s->retired[s->n_retired] = s->queue;
    s->retired_capacity[s->n_retired++] = s->capacity;
    s->queue = fresh;
    s->head = s->length = 0;
}

static pipert_result sparse_regroup(void *state, const pt_coupling_options *options,
                                    const pt_coupling_point *at)
{
    (void)at;
    sparse_state *s = state;
    if (s->suspend_failed)
        return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: out of memory retiring the exchanges in flight");
    s->options = *options;
    s->R = options->replicas ? pt_group_size(options->replicas) : 1;
    s->me = options->replicas ? pt_group_index(options->replicas) : 0;
    return PIPERT_OK;
}

static void sparse_destroy(void *state)
{
    sparse_state *s = state;
    if (!s) return;
    /* Still in flight only after a failure or a stop: the transport is gone by
     * now (the session frees its coupling after leaving the job), or the
     * abandoned handles free themselves when it goes. */
    free_queue(s->queue, s->capacity);
    for (int i = 0; i < s->n_retired; i++) free_queue(s->retired[i], s->retired_capacity[i]);
    free(s->retired);
    free(s->retired_capacity);
    free(s->partitions);
    free(s->ids);
    free(s->cursor);
    free(s->ema);
    free(s->agreed);
    free(s->worker_error);
    free(s->server_error);
    free(s->saved_state);
    free(s);
}

const pt_coupling_method pt_dp_sparse = {
    .name = "sparse",
    .create = sparse_create,
    .after_backward = sparse_after_backward,
    .after_step = sparse_after_step,
    .save = sparse_save,
    .load = sparse_load,
    .destroy = sparse_destroy,
    .suspend = sparse_suspend,
    .regroup = sparse_regroup,
};
