/* dp.method=sparse: asynchronous sparse parameter averaging with an EMA
 * correction (AsyncMesh; ALGORITHMS.md §4.2).
 *
 * Partitions. Every tensor of n elements is cut into units of U =
 * dp.partition_block consecutive elements (n_U = ⌈n/U⌉ of them, the last one
 * short when U does not divide n), and its units into P = ⌈1/p⌉ partitions of
 * (nearly) equal size, ⌊(j+1)·n_U/P⌋ − ⌊j·n_U/P⌋ units for partition j: the
 * list of partition ids [0, 0, …, 1, 1, …, P−1] is shuffled (Fisher–Yates,
 * the same as slicing a random permutation of the units) and unit u gets id
 * u. With U = 1 this is ALGORITHMS.md's permutation of the elements; the
 * default U = 16 (a 64-byte cache line of fp32) makes every loop over a
 * partition (gather, apply, the agreed values, e) read whole cache lines
 * instead of one element in each, and the shuffle U times shorter. Which
 * elements travel together does not enter the update, which is per element:
 * each is still averaged once per cycle, at a step drawn at random. The
 * shuffle draws from Philox with the key (seed, hash of the tensor's global
 * name) and the counter (cycle, block), so every replica holds the same
 * partitions, whatever the stage split, and no index ever crosses the
 * network. Step t averages partition (t−1) mod P of cycle
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
 * writes small integers (method, step, count, P, U, codec, seed, slice layout) times R
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
 * θ and the newest stash are read and written at the partition's elements
 * only (read_partition, write_partition): in place on the CPU; with kernels
 * whose memory the host cannot read (cuda, cpu-guarded) through the table,
 * which gathers θ[I] into a buffer of its own that is copied to the host, and
 * scatters the new values back, so p·P floats cross each way instead of θ.
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
#include "dp/sparse_internal.h"
#include "runtime/log.h"
#include "runtime/rng.h"

/* Exchanges a replica may have in flight with dp.delay = −1. */
#define MAX_IN_FLIGHT 16

/* The last word of the partitions' Philox counters. */
#define PARTITION_STREAM 0x73706172u /* "spar" */

/* ---- small helpers -------------------------------------------------------- */

static size_t slice_begin(size_t n, long parts, long k)
{
    return (size_t)((unsigned __int128)n * (uint64_t)k / (uint64_t)parts);
}

static uint32_t digest16(uint64_t h) { return (uint32_t)((h ^ h >> 16 ^ h >> 32 ^ h >> 48) & 0xffffu); }

/* θ is host memory (cpu), else it is reached through the kernel table only. */
static bool host_reads_theta(const sparse_state *s) { return s->options.kernels->host_accessible; }

sparse_exchange *pt_sparse_queue_at(sparse_state *s, int k)
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

static pipert_result sparse_create(const pt_coupling_options *options, void **out)
{
    const pt_dp_settings *dp = &options->config->dp;
    pt_codec codec;
    PT_TRY(pt_codec_init(&codec, dp->compress, dp->block > 0 ? (size_t)dp->block : 1));
    if (!(dp->fraction > 0 && dp->fraction <= 1))
        return pt_fail(PIPERT_ERR_CONFIG, "dp.fraction: must be in (0, 1], got %g", dp->fraction);
    /* P = ⌈1/p⌉, the tiny slack keeps p = 0.05 at 20, not 21 */
    const double partitions = ceil(1.0 / dp->fraction - 1e-9);
    if (partitions > (double)MAX_PARTITIONS)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.fraction=%g: %.0f partitions per tensor, at most %ld (p >= 1e-6)",
                       dp->fraction, partitions, MAX_PARTITIONS);
    const pt_sparse_rule rule = dp->rule;
    if ((unsigned)rule >= PT_SPARSE_RULES)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.rule: no rule has the value %d", (int)rule);
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
    s->unit = (size_t)dp->partition_block;
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

/* A tensor of n elements in units of `unit` consecutive elements: ⌈n/unit⌉ of them, the
 * last one short when unit does not divide n. */
static size_t units_of(size_t n, size_t unit) { return (n + unit - 1) / unit; }

/* Where partition j of a tensor starts among its members (offsets from the tensor's first):
 * the whole units of the partitions before it, less what the short last unit lacks when
 * one of them holds it (s->short_unit_part[t]: the partition that does). */
static size_t partition_begin(const sparse_state *s, const pt_gpt_tensor *tensor, int t, long j)
{
    const size_t unit = s->unit, n_units = units_of(tensor->numel, unit);
    const size_t lacks = n_units * unit - tensor->numel;
    return slice_begin(n_units, s->P, j) * unit - (s->short_unit_part[t] < j ? lacks : 0);
}

/* The partitions of `cycle`: per tensor, its units' partition ids shuffled, then
 * its elements bucketed by id in increasing order (so gathers run forward). */
static void draw_partitions(sparse_state *s, const pt_gpt_slice *model, long cycle)
{
    const size_t unit = s->unit;
    for (int t = 0; t < model->n_tensors; t++) {
        const pt_gpt_tensor *tensor = &model->tensors[t];
        const size_t n = tensor->numel, n_units = units_of(n, unit);
        uint32_t *id = s->ids;
        for (long j = 0; j < s->P; j++) {
            const size_t end = slice_begin(n_units, s->P, j + 1);
            for (size_t k = slice_begin(n_units, s->P, j); k < end; k++) id[k] = (uint32_t)j;
        }
        word_stream w = {.key = pt_rng_key((uint64_t)s->config->seed, pt_hash_string(tensor->name)),
                         .cycle = (uint32_t)cycle,
                         .next = 4};
        for (size_t i = n_units; i-- > 1;) {
            const uint32_t j = stream_below(&w, (uint32_t)(i + 1));
            const uint32_t swap = id[i];
            id[i] = id[j];
            id[j] = swap;
        }
        s->short_unit_part[t] = n_units ? (long)id[n_units - 1] : s->P;
        for (long j = 0; j < s->P; j++) s->cursor[j] = partition_begin(s, tensor, t, j);
        uint32_t *out = s->partitions + tensor->offset;
        for (size_t u = 0; u < n_units; u++) {
            size_t *at = &s->cursor[id[u]];
            const size_t first = u * unit, last = first + unit < n ? first + unit : n;
            for (size_t e = first; e < last; e++) out[(*at)++] = (uint32_t)(tensor->offset + e);
        }
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
        max_count += units_of(units_of(tensor->numel, s->unit), (size_t)s->P) * s->unit;
        if (tensor->numel > largest) largest = tensor->numel;
    }
    s->layout_tag = digest16(layout);
    s->n_params = model->n_params;
    s->max_count = max_count;
    s->partitions = malloc((model->n_params ? model->n_params : 1) * sizeof *s->partitions);
    s->ids = malloc(largest * sizeof *s->ids);
    s->cursor = malloc((size_t)s->P * sizeof *s->cursor);
    s->short_unit_part = malloc((size_t)(model->n_tensors ? model->n_tensors : 1) *
                                sizeof *s->short_unit_part);
    s->theta_now = malloc((max_count ? max_count : 1) * sizeof *s->theta_now);
    if (!s->partitions || !s->ids || !s->cursor || !s->short_unit_part || !s->theta_now)
        return pt_fail(PIPERT_ERR_NOMEM, "dp sparse: no memory for the partitions of %zu parameters",
                       model->n_params);
    if (!host_reads_theta(s)) {
        const pt_kernels *k = s->options.kernels;
        const size_t n = max_count ? max_count : 1;
        PT_TRY(k->alloc((void **)&s->device_index, n * sizeof *s->device_index,
                        "dp sparse: the partition's indices"));
        PT_TRY(k->alloc((void **)&s->device_values, n * sizeof *s->device_values,
                        "dp sparse: the partition's values"));
    }
    if (s->loaded_ema && s->loaded_ema != model->n_params)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "dp sparse: the checkpoint's EMA holds %zu values, the stage %zu parameters",
                       s->loaded_ema, model->n_params);
    if (s->loaded_agreed && s->loaded_agreed != model->n_params)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "dp sparse: the checkpoint's agreed values hold %zu, the stage %zu parameters",
                       s->loaded_agreed, model->n_params);
    if (s->rule == PT_RULE_EMA && !s->ema) {
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
    /* What a checkpoint brought must fit this model: indices inside θ, and no more of them
     * than a partition of this stage holds (the buffers apply uses are that large). */
    for (int k = 0; k < s->length; k++) {
        const sparse_exchange *x = pt_sparse_queue_at(s, k);
        if (x->count > max_count)
            return pt_fail(PIPERT_ERR_FORMAT,
                           "dp sparse: the checkpoint's exchange of step %ld holds %zu elements, "
                           "more than a partition of this stage (%zu): it was written for "
                           "another model or stage split",
                           x->step, x->count, max_count);
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
pipert_result pt_sparse_reserve(sparse_exchange *x, size_t count, int R)
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

/* ---- θ at a partition's elements --------------------------------------------- */

/* out[i] = θ[index[i]], i < count: out is host memory. */
static void read_partition(sparse_state *s, const float *theta, const uint32_t *index, size_t count,
                           float *out)
{
    const pt_kernels *k = s->options.kernels;
    if (host_reads_theta(s)) {
        for (size_t i = 0; i < count; i++) out[i] = theta[index[i]];
        return;
    }
    k->copy_to_device(s->device_index, index, count * sizeof *index);
    k->gather(s->device_values, theta, s->device_index, count);
    k->copy_to_host(out, s->device_values, count * sizeof *out);
}

/* θ[index[i]] = values[i], and the newest stash's too; on the table, the index is the one the
 * last read_partition took. */
static void write_partition(sparse_state *s, pt_coupling_point *at, const uint32_t *index,
                            size_t count, const float *values)
{
    const pt_kernels *k = s->options.kernels;
    if (host_reads_theta(s)) {
        for (size_t i = 0; i < count; i++) at->params[index[i]] = values[i];
        if (at->newest_stash)
            for (size_t i = 0; i < count; i++) at->newest_stash[index[i]] = values[i];
        return;
    }
    k->copy_to_device(s->device_values, values, count * sizeof *values);
    k->scatter(at->params, s->device_index, s->device_values, count);
    if (at->newest_stash) k->scatter(at->newest_stash, s->device_index, s->device_values, count);
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
        const size_t begin = partition_begin(s, tensor, t, part),
                     end = partition_begin(s, tensor, t, part + 1);
        for (size_t k = begin; k < end; k++) x->index[count++] = members[k];
    }
    x->count = count;
    read_partition(s, at->params, x->index, count, x->w_old);
    for (size_t i = 0; i < count; i++) {
        x->values[i] = x->w_old[i];
        if (s->agreed) {
            x->ref[i] = s->agreed[x->index[i]];
            x->values[i] -= x->ref[i];
        }
    }
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
    field[FIELD_UNIT] = (uint32_t)s->unit;
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
             "step %llu, %llu values, P = %llu in units of %llu, dp.compress=%s (block %llu mod "
             "4096), seed #%04llx, stage slice #%04llx",
             (unsigned long long)(f[FIELD_STEP_LOW] | f[FIELD_STEP_HIGH] << 16),
             (unsigned long long)(f[FIELD_COUNT_LOW] | f[FIELD_COUNT_MID] << 16 |
                                  f[FIELD_COUNT_HIGH] << 32),
             (unsigned long long)(f[FIELD_PARTITIONS_LOW] | f[FIELD_PARTITIONS_HIGH] << 16),
             (unsigned long long)f[FIELD_UNIT],
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
                       "dp.method, dp.fraction, dp.partition_block, dp.compress, dp.block, seed "
                       "and model at the same step",
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
    sparse_exchange *x = pt_sparse_queue_at(s, s->length);
    PT_TRY(pt_sparse_reserve(x, s->max_count, s->R));
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
pipert_result pt_sparse_arrive(sparse_state *s, sparse_exchange *x, bool wait)
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
    float *theta = s->theta_now; /* θ[I] now, then its new values */
    read_partition(s, at->params, x->index, x->count, theta);
    const float mu = ema_decay(s, at->step), lambda = s->lambda;
    for (size_t i = 0; i < x->count; i++) {
        const uint32_t j = x->index[i];
        const float average = x->values[i], drift = theta[i] - x->w_old[i];
        switch (s->rule) {
        case PT_RULE_EMA:
            s->ema[j] = mu * s->ema[j] + (1.0f - mu) * drift;
            theta[i] = average + lambda * s->ema[j];
            break;
        case PT_RULE_AVG: theta[i] = average; break;
        case PT_RULE_DELTA: theta[i] = average + drift; break;
        case PT_SPARSE_RULES: break; /* refused by sparse_create */
        }
    }
    write_partition(s, at, x->index, x->count, theta);
}

/* Applies the oldest exchange (waiting for it if `wait`); PIPERT_ERR_TIMEOUT
 * if it has not arrived and may not be waited for. */
static pipert_result apply_oldest(sparse_state *s, pt_coupling_point *at, bool wait,
                                  double *delay_sum, int *applied)
{
    sparse_exchange *x = pt_sparse_queue_at(s, 0);
    pipert_result rc = pt_sparse_arrive(s, x, wait);
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
    s->options.kernels->copy_to_host(s->agreed, at->params, at->n_params * sizeof *s->agreed);
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
        while (rc == PIPERT_OK && s->length > 0 && pt_sparse_queue_at(s, 0)->step + s->delay <= at->step)
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

/* Abandons what is in flight and frees the queue's buffers (the transport
 * must be gone, or the exchanges abandoned long before). */
void pt_sparse_free_queue(sparse_exchange *queue, int capacity)
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
    pt_sparse_free_queue(s->queue, s->capacity);
    for (int i = 0; i < s->n_retired; i++) pt_sparse_free_queue(s->retired[i], s->retired_capacity[i]);
    free(s->retired);
    free(s->retired_capacity);
    free(s->partitions);
    free(s->ids);
    free(s->cursor);
    free(s->short_unit_part);
    free(s->theta_now);
    if (s->device_index) s->options.kernels->free(s->device_index);
    if (s->device_values) s->options.kernels->free(s->device_values);
    free(s->ema);
    free(s->agreed);
    free(s->worker_error);
    free(s->server_error);
    free(s->saved_state);
    free(s);
}

/* A fraction of every tensor each step, applied dp.delay steps later (−1: when it is
 * complete, which the cost model takes as the most it lets be in flight). */
static void sparse_traffic(const pipert_config *config, pt_coupling_traffic *out)
{
    const pt_dp_settings *dp = &config->dp;
    *out = (pt_coupling_traffic){
        .every = 1, .lag = dp->delay >= 0 ? (int)dp->delay : MAX_IN_FLIGHT, .share = dp->fraction};
}

/* The host gathers, averages and scatters its fraction of the stage every step. */
static double sparse_host_share(const pipert_config *config) { return config->dp.fraction; }

/* On a GPU a step's partition crosses between θ and the host through device buffers of its
 * indices and its values (read_partition): 2p floats' worth per element. */
static double sparse_device_share(const pipert_config *config) { return 2 * config->dp.fraction; }

const pt_coupling_method pt_dp_sparse = {
    .name = "sparse",
    .create = sparse_create,
    .host_parameters = false, /* it moves its partition between θ and the host itself */
    .traffic = sparse_traffic,
    .param_copies = 2, /* the partition map and the EMA, in host memory (a codec adds one) */
    .device_param_copies = 0,
    .device_share = sparse_device_share,
    .host_share = sparse_host_share,
    .after_backward = sparse_after_backward,
    .after_step = sparse_after_step,
    .save = pt_sparse_save,
    .load = pt_sparse_load,
    .destroy = sparse_destroy,
    .suspend = sparse_suspend,
    .regroup = sparse_regroup,
};
