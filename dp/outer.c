/* The outer loop of diloco, streaming-diloco and co2 (dp/outer.h).
 *
 * State (host memory, laid out like the stage's parameters): θ̃ `outer` and
 * the outer momentum v; one exchange buffer as large as the largest fragment,
 * which holds Δ_r while it is reduced in place and the mean Δ once it has
 * arrived. θ itself stays where the kernels keep it and is copied through
 * host staging, so the engine works on every backend.
 *
 * What is reduced: with dp.compress=none the fp32 ring all-reduce; with int8,
 * e3m0 or e2m1 the compressed exchange of dp/exchange.h (each replica encodes
 * its Δ_r once, with one fp32 scale per dp.block values; the mean is
 * accumulated in fp32). onebit is refused: it needs error feedback per
 * replica, which this engine does not keep yet (each replica's own
 * checkpoint file could now hold it, as dp/sparse.c does).
 *
 * Every exchange carries a descriptor, reduced beside it: each replica writes
 * (method, fragment slot, step posted, values, codec, and its replica number
 * for messages) into its own row of an R-row table that is otherwise zero,
 * and the table is summed, so every replica sees every row. A row that
 * differs from this replica's own names that replica, and nothing is
 * applied.
 *
 * Checkpoints (names "dp.outer.NAME", "dp.momentum.NAME", "dp.pending.NAME",
 * global tensor names, so a checkpoint loads under another stage split;
 * metadata "dp_outer"): an exchange in flight when a checkpoint is written is
 * finished first (waiting for it needs nothing more from the peers: they
 * posted it at the same step) and its mean is saved with the steps it was
 * posted and falls due, so a resumed run applies it at the same step as an
 * uninterrupted one. Saving copies θ̃, v and that mean, so the file may be
 * written while training goes on. The schedule position is the step itself.
 * Nothing is posted that would fall due after train.steps, so a run ends with
 * nothing in flight. */
#include "dp/outer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/exchange.h"
#include "dp/wait.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/checkpoint.h" /* pt_gpt_add_to_writer */

/* ---- the outer step -------------------------------------------------------- */

void pt_outer_pseudo_gradient(float *delta, const float *outer, const float *local, size_t n)
{
    for (size_t i = 0; i < n; i++) delta[i] = outer[i] - local[i];
}

void pt_outer_step(const pt_outer_rule *rule, double penalty, float *outer, float *momentum,
                   const float *delta, size_t n)
{
    const float mu = (float)rule->momentum, lr = (float)rule->lr;
    const float inverse_penalty = (float)(1.0 / penalty), clip = (float)rule->clip;
    for (size_t i = 0; i < n; i++) {
        const float g = penalty == 1.0 ? delta[i] : delta[i] * inverse_penalty;
        float v = mu * momentum[i] + g;
        if (clip > 0) v = fminf(fmaxf(v, -clip), clip);
        momentum[i] = v;
        outer[i] -= lr * (rule->nesterov ? g + mu * v : v);
    }
}

void pt_outer_merge(float *local, const float *outer, double alpha, size_t n)
{
    if (alpha == 1.0) return;
    if (alpha == 0.0) {
        memcpy(local, outer, n * sizeof *local);
        return;
    }
    const float a = (float)alpha, b = (float)(1.0 - alpha);
    for (size_t i = 0; i < n; i++) local[i] = a * local[i] + b * outer[i];
}

double pt_outer_adaptive_penalty(double gap_norm, double fresh_norm)
{
    if (!(fresh_norm > 0) || !isfinite(gap_norm)) return 1.0;
    return 1.0 + gap_norm / fresh_norm;
}

/* ---- fragments and their schedule ------------------------------------------- */

int pt_outer_slots(int block_fragments) { return block_fragments <= 1 ? 1 : block_fragments + 1; }

void pt_outer_traffic(const pt_outer_plan *plan, pt_coupling_traffic *out)
{
    const int slots = pt_outer_slots(plan->block_fragments);
    const long period = plan->period > 0 ? plan->period : 1;
    *out = (pt_coupling_traffic){.every = period / slots > 0 ? (int)(period / slots) : 1,
                                 .lag = (int)plan->delay,
                                 .share = 1.0 / slots};
}

int pt_outer_slot_of(const char *tensor_name, int block_fragments)
{
    if (block_fragments <= 1) return 0;
    int block;
    if (sscanf(tensor_name, "h.%d.", &block) == 1 && block >= 0) return block % block_fragments;
    return block_fragments; /* wte, wpe, ln_f, lm_head */
}

int pt_outer_slot_at(long step, long period, int slots)
{
    const long spacing = period / slots;
    if (step < 1 || spacing < 1) return -1;
    const long phase = step % period;
    return phase % spacing == 0 && phase / spacing < slots ? (int)(phase / spacing) : -1;
}

/* ---- the engine's state ---------------------------------------------------- */

enum {
    DESCRIPTOR_METHOD,
    DESCRIPTOR_SLOT,
    DESCRIPTOR_STEP_HIGH,
    DESCRIPTOR_STEP_LOW,
    DESCRIPTOR_COUNT_HIGH,
    DESCRIPTOR_COUNT_LOW,
    DESCRIPTOR_CODEC,
    DESCRIPTOR_SLOTS,
    DESCRIPTOR_REPLICA, /* the sender's replica number: named in messages, never compared */
    DESCRIPTOR_FIELDS
};
#define DESCRIPTOR_LOW_BITS 20 /* fields below 2^20 are exact in fp32, and so are their sums with 0 */

typedef struct range {
    size_t offset, count; /* in floats, into θ */
} range;

/* The parameters of one slot: runs of consecutive tensors, packed in order
 * into the exchange buffer. */
typedef struct fragment {
    range *ranges;
    int n_ranges;
    size_t count;
} fragment;

/* The one exchange in flight (or arrived and waiting for its step). */
typedef struct exchange {
    bool live;    /* posted and not yet applied */
    bool arrived; /* the mean is in the buffer (waited for, or read from a checkpoint) */
    int slot;
    long posted, due;
    double posted_us; /* trace clock when posted */
    pt_allreduce_handle *descriptor_handle;
    pt_allreduce_handle *payload_handle;  /* dp.compress=none */
    pt_exchange *compressed_handle;       /* the other codecs */
} exchange;

/* A tensor read from a checkpoint before the model is known. */
typedef struct loaded_tensor {
    char *name;
    float *data;
    size_t numel;
} loaded_tensor;

typedef struct outer_state {
    pt_coupling_options options;
    pt_outer_plan plan;
    int slots;
    pt_codec codec;      /* dp.compress: none reduces with the fp32 ring all-reduce */
    int replicas, index; /* group size and this replica's index (1 and 0 alone) */
    float *descriptors;  /* [replicas × DESCRIPTOR_FIELDS] */
    /* set up at the first call, when the model is known */
    bool ready;
    const pt_gpt_slice *model;
    const pt_kernels *kernels;
    size_t n_params;
    fragment *fragments;   /* [slots] */
    float *outer;          /* θ̃ [n_params] */
    float *momentum;       /* v [n_params] */
    float *buffer;         /* [largest fragment]: Δ_r in flight, then mean Δ */
    float *scratch;        /* [largest fragment]: θ of a fragment being merged */
    float *eval_copy;      /* θ̃ in the kernels' memory (backends other than the cpu) */
    float *saved;          /* [3 × n_params]: θ̃, v and the pending mean as θ, as a checkpoint
                              took them (it may be written while training goes on) */
    exchange pending;
    /* buffers of exchanges abandoned when replicas left: a late message may
     * still land in them, so they are freed with the method */
    void **retired;
    int n_retired;
    /* from a checkpoint, until the model is known */
    loaded_tensor *loaded;
    int n_loaded;
    bool loaded_pending;
    exchange loaded_exchange;
    bool lost_buffer; /* out of memory retiring an exchange's buffers */
} outer_state;

static bool on_host(const outer_state *s) { return s->kernels->host_accessible; }

/* ---- creation -------------------------------------------------------------- */

static pipert_result check_plan(const pt_coupling_options *o, const pt_outer_plan *plan)
{
    const pt_dp_settings *dp = &o->config->dp;
    const int slots = pt_outer_slots(plan->block_fragments);
    pt_codec codec;
    PT_TRY(pt_codec_init(&codec, dp->compress, (size_t)dp->block));
    if (codec.kind == PT_CODEC_ONEBIT)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.method=%s with dp.compress=onebit: 1-bit needs error feedback kept per "
                       "replica, which the outer methods do not keep yet; use int8, e3m0 or e2m1",
                       plan->method);
    if (plan->period / slots < 1)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.method=%s: dp.period=%ld is shorter than its %d fragments (each needs a "
                       "step of its own); raise dp.period or lower dp.fragments",
                       plan->method, plan->period, slots);
    if (plan->delay > plan->period / slots)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "dp.method=%s: dp.overlap=%ld is longer than the %ld steps between two "
                       "fragments (dp.period=%ld, %d fragments): only one fragment may be in "
                       "flight",
                       plan->method, plan->delay, plan->period / slots, plan->period, slots);
    if (plan->penalty != 0 && plan->penalty < 1)
        return pt_fail(PIPERT_ERR_CONFIG, "dp.method=%s: the penalty must be at least 1, not %g",
                       plan->method, plan->penalty);
    return PIPERT_OK;
}

pipert_result pt_outer_create(const pt_coupling_options *options, const pt_outer_plan *plan,
                              void **out)
{
    *out = NULL;
    PT_TRY(check_plan(options, plan));
    outer_state *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", plan->method);
    s->options = *options;
    s->plan = *plan;
    s->slots = pt_outer_slots(plan->block_fragments);
    PT_TRY(pt_codec_init(&s->codec, options->config->dp.compress, (size_t)options->config->dp.block));
    s->replicas = options->replicas ? pt_group_size(options->replicas) : 1;
    s->index = options->replicas ? pt_group_index(options->replicas) : 0;
    s->descriptors = calloc((size_t)s->replicas * DESCRIPTOR_FIELDS, sizeof *s->descriptors);
    if (!s->descriptors) {
        free(s);
        return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", plan->method);
    }
    *out = s;
    return PIPERT_OK;
}

static void free_loaded(outer_state *s)
{
    for (int i = 0; i < s->n_loaded; i++) {
        free(s->loaded[i].name);
        free(s->loaded[i].data);
    }
    free(s->loaded);
    s->loaded = NULL;
    s->n_loaded = 0;
}

void pt_outer_destroy(void *state)
{
    outer_state *s = state;
    if (!s) return;
    /* Only after an error or a stop: the session leaves the job (closing the
     * transport) before it frees the coupling, so nothing writes into the
     * buffer after this. */
    if (s->pending.descriptor_handle) pt_allreduce_abandon(s->pending.descriptor_handle);
    if (s->pending.payload_handle) pt_allreduce_abandon(s->pending.payload_handle);
    if (s->pending.compressed_handle) pt_exchange_abandon(s->pending.compressed_handle);
    if (s->fragments)
        for (int f = 0; f < s->slots; f++) free(s->fragments[f].ranges);
    free(s->fragments);
    pt_free(s->outer);
    pt_free(s->momentum);
    pt_free(s->buffer);
    pt_free(s->scratch);
    pt_free(s->saved);
    if (s->eval_copy) s->kernels->free(s->eval_copy);
    free_loaded(s);
    free(s->descriptors);
    for (int i = 0; i < s->n_retired; i++) pt_free(s->retired[i]);
    free(s->retired);
    free(s);
}

/* ---- setting up at the first call -------------------------------------------- */

static pipert_result build_fragments(outer_state *s)
{
    const pt_gpt_slice *m = s->model;
    s->fragments = calloc((size_t)s->slots, sizeof *s->fragments);
    if (!s->fragments) return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", s->plan.method);
    for (int f = 0; f < s->slots; f++) {
        fragment *fr = &s->fragments[f];
        fr->ranges = calloc((size_t)m->n_tensors, sizeof *fr->ranges);
        if (!fr->ranges) return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", s->plan.method);
        for (int i = 0; i < m->n_tensors; i++) {
            const pt_gpt_tensor *t = &m->tensors[i];
            if (pt_outer_slot_of(t->name, s->plan.block_fragments) != f) continue;
            range *last = fr->n_ranges ? &fr->ranges[fr->n_ranges - 1] : NULL;
            if (last && last->offset + last->count == t->offset) last->count += t->numel;
            else fr->ranges[fr->n_ranges++] = (range){t->offset, t->numel};
            fr->count += t->numel;
        }
    }
    return PIPERT_OK;
}

static size_t largest_fragment(const outer_state *s)
{
    size_t largest = 0;
    for (int f = 0; f < s->slots; f++)
        if (s->fragments[f].count > largest) largest = s->fragments[f].count;
    return largest;
}

static const loaded_tensor *find_loaded(const outer_state *s, const char *prefix, const char *name)
{
    char full[PT_TENSOR_NAME_MAX + 32];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    for (int i = 0; i < s->n_loaded; i++)
        if (!strcmp(s->loaded[i].name, full)) return &s->loaded[i];
    return NULL;
}

/* Copies tensors prefix + NAME of the checkpoint into a buffer laid out like
 * θ (every tensor of the stage, or those of one slot). */
static pipert_result restore_tensors(outer_state *s, const char *prefix, int only_slot, float *dst)
{
    const pt_gpt_slice *m = s->model;
    for (int i = 0; i < m->n_tensors; i++) {
        const pt_gpt_tensor *t = &m->tensors[i];
        if (only_slot >= 0 && pt_outer_slot_of(t->name, s->plan.block_fragments) != only_slot)
            continue;
        const loaded_tensor *e = find_loaded(s, prefix, t->name);
        if (!e)
            return pt_fail(PIPERT_ERR_FORMAT, "dp %s: the checkpoint has no %s%s", s->plan.method,
                           prefix, t->name);
        if (e->numel != t->numel)
            return pt_fail(PIPERT_ERR_FORMAT, "dp %s: %s%s holds %zu values, the model needs %zu",
                           s->plan.method, prefix, t->name, e->numel, t->numel);
        memcpy(dst + t->offset, e->data, t->numel * sizeof *dst);
    }
    return PIPERT_OK;
}

/* buffer[packed] ↔ full[as θ] for one slot. */
static void pack(const fragment *fr, float *packed, const float *full)
{
    size_t at = 0;
    for (int r = 0; r < fr->n_ranges; r++) {
        memcpy(packed + at, full + fr->ranges[r].offset, fr->ranges[r].count * sizeof *packed);
        at += fr->ranges[r].count;
    }
}

static void unpack(const fragment *fr, float *full, const float *packed)
{
    size_t at = 0;
    for (int r = 0; r < fr->n_ranges; r++) {
        memcpy(full + fr->ranges[r].offset, packed + at, fr->ranges[r].count * sizeof *packed);
        at += fr->ranges[r].count;
    }
}

/* Room for what a checkpoint takes (allocated when first needed). */
static pipert_result checkpoint_room(outer_state *s)
{
    if (s->saved) return PIPERT_OK;
    return pt_alloc((void **)&s->saved, 3 * s->n_params * sizeof(float), "outer state (checkpoints)");
}

/* θ̃ and v from the checkpoint loaded before the model was known, or θ̃ = θ
 * and v = 0 when it had none of this method's state. */
static pipert_result restore_or_start(outer_state *s, const float *params)
{
    bool has_state = false;
    for (int i = 0; i < s->n_loaded && !has_state; i++)
        has_state = !strncmp(s->loaded[i].name, "dp.outer.", 9);
    if (!has_state) {
        s->kernels->copy_to_host(s->outer, params, s->n_params * sizeof(float));
        free_loaded(s);
        return PIPERT_OK;
    }
    PT_TRY(restore_tensors(s, "dp.outer.", -1, s->outer));
    PT_TRY(restore_tensors(s, "dp.momentum.", -1, s->momentum));
    if (s->loaded_pending) {
        exchange e = s->loaded_exchange;
        if (e.slot < 0 || e.slot >= s->slots)
            return pt_fail(PIPERT_ERR_FORMAT, "dp %s: the checkpoint's pending fragment %d is not "
                                              "one of the %d fragments of this configuration",
                           s->plan.method, e.slot, s->slots);
        PT_TRY(checkpoint_room(s));
        float *pending = s->saved + 2 * s->n_params;
        PT_TRY(restore_tensors(s, "dp.pending.", e.slot, pending));
        pack(&s->fragments[e.slot], s->buffer, pending);
        s->pending = e;
        s->pending.live = s->pending.arrived = true;
    }
    free_loaded(s);
    pt_info("dp %s: outer state restored from the checkpoint%s", s->plan.method,
            s->pending.live ? " with the exchange it had in flight" : "");
    return PIPERT_OK;
}

static pipert_result get_ready(outer_state *s, const pt_coupling_point *at)
{
    if (s->ready) {
        if (at->model != s->model || at->n_params != s->n_params)
            return pt_fail(PIPERT_ERR_INTERNAL, "dp %s: called with another model", s->plan.method);
        return PIPERT_OK;
    }
    s->model = at->model;
    s->kernels = at->model->kernels;
    s->n_params = at->n_params;
    const size_t bytes = s->n_params * sizeof(float);
    PT_TRY(build_fragments(s));
    const size_t largest = largest_fragment(s) * sizeof(float);
    PT_TRY(pt_alloc((void **)&s->outer, bytes, "outer parameters"));
    PT_TRY(pt_alloc((void **)&s->momentum, bytes, "outer momentum"));
    PT_TRY(pt_alloc((void **)&s->buffer, largest ? largest : 1, "outer exchange buffer"));
    PT_TRY(pt_alloc((void **)&s->scratch, largest ? largest : 1, "outer merge buffer"));
    PT_TRY(restore_or_start(s, at->params));
    if (!on_host(s)) {
        PT_TRY(s->kernels->alloc((void **)&s->eval_copy, bytes, "outer parameters (validation)"));
        s->kernels->copy_to_device(s->eval_copy, s->outer, bytes);
    }
    s->ready = true;
    return PIPERT_OK;
}

/* ---- exchanging -------------------------------------------------------------- */

static double ring_bytes(const outer_state *s, size_t count)
{
    return (double)pt_allreduce_bytes_sent(s->options.replicas, count);
}

static void describe(const outer_state *s, float *row, int slot, long step, size_t count)
{
    unsigned method = 2166136261u; /* FNV-1a of the name, cut to 20 bits */
    for (const char *c = s->plan.method; *c; c++) method = (method ^ (unsigned char)*c) * 16777619u;
    const unsigned long low = (1ul << DESCRIPTOR_LOW_BITS) - 1;
    row[DESCRIPTOR_METHOD] = (float)(method & low);
    row[DESCRIPTOR_SLOT] = (float)slot;
    row[DESCRIPTOR_STEP_HIGH] = (float)((unsigned long)step >> DESCRIPTOR_LOW_BITS);
    row[DESCRIPTOR_STEP_LOW] = (float)((unsigned long)step & low);
    row[DESCRIPTOR_COUNT_HIGH] = (float)(count >> DESCRIPTOR_LOW_BITS);
    row[DESCRIPTOR_COUNT_LOW] = (float)(count & low);
    row[DESCRIPTOR_CODEC] = (float)s->codec.kind;
    row[DESCRIPTOR_SLOTS] = (float)s->slots;
    row[DESCRIPTOR_REPLICA] = (float)s->options.replica;
}

static void format_row(const outer_state *s, const float *row, const float *own, char *out,
                       size_t size)
{
    const long step = (long)row[DESCRIPTOR_STEP_HIGH] << DESCRIPTOR_LOW_BITS |
                      (long)row[DESCRIPTOR_STEP_LOW];
    const size_t count = (size_t)row[DESCRIPTOR_COUNT_HIGH] << DESCRIPTOR_LOW_BITS |
                         (size_t)row[DESCRIPTOR_COUNT_LOW];
    const int kind = (int)row[DESCRIPTOR_CODEC];
    const pt_codec codec = {.kind = (pt_codec_kind)kind, .block = 1};
    const bool known = kind >= PT_CODEC_NONE && kind <= PT_CODEC_ONEBIT;
    snprintf(out, size, "fragment %d of %d posted at step %ld, %zu values in %s, method %s",
             (int)row[DESCRIPTOR_SLOT], (int)row[DESCRIPTOR_SLOTS], step, count,
             known ? pt_codec_name(&codec) : "an unknown codec",
             row[DESCRIPTOR_METHOD] == own[DESCRIPTOR_METHOD] ? s->plan.method
                                                               : "another dp.method");
}

/* Every replica's row against this replica's own. */
static pipert_result check_descriptors(const outer_state *s, const exchange *e)
{
    float own[DESCRIPTOR_FIELDS];
    describe(s, own, e->slot, e->posted, s->fragments[e->slot].count);
    for (int r = 0; r < s->replicas; r++) {
        const float *row = s->descriptors + (size_t)r * DESCRIPTOR_FIELDS;
        if (!memcmp(row, own, DESCRIPTOR_REPLICA * sizeof *own)) continue;
        char theirs[160], mine[160];
        format_row(s, row, own, theirs, sizeof theirs);
        format_row(s, own, own, mine, sizeof mine);
        return pt_fail(PIPERT_ERR_PEER,
                       "dp %s, stage %d: replica %d sent %s; replica %d (this one) sent %s: the "
                       "replicas disagree (is their dp configuration the same?); nothing applied",
                       s->plan.method, s->options.stage, (int)row[DESCRIPTOR_REPLICA], theirs,
                       s->options.replica, mine);
    }
    return PIPERT_OK;
}

static bool retire(outer_state *s, void *buffer)
{
    void **grown = realloc(s->retired, (size_t)(s->n_retired + 1) * sizeof *grown);
    if (!grown) return false;
    s->retired = grown;
    s->retired[s->n_retired++] = buffer;
    return true;
}

/* The exchange's collectives were abandoned while its buffers were theirs: a late message may
 * still land in them (a replica frozen mid-exchange sends once it runs again), so they are
 * retired, freed with the method, and fresh ones take their place. */
static void retire_exchange_buffers(outer_state *s)
{
    const size_t largest = largest_fragment(s) * sizeof(float);
    float *buffer = NULL, *descriptors = calloc((size_t)s->replicas * DESCRIPTOR_FIELDS,
                                                sizeof *descriptors);
    if (pt_alloc((void **)&buffer, largest ? largest : 1, "outer exchange buffer") == PIPERT_OK &&
        retire(s, s->buffer))
        s->buffer = buffer;
    else pt_free(buffer), s->lost_buffer = true;
    if (descriptors && retire(s, s->descriptors)) s->descriptors = descriptors;
    else free(descriptors), s->lost_buffer = true;
}

/* Abandons what the exchange has in flight, retiring its buffers. */
static void abandon_exchange(outer_state *s)
{
    exchange *e = &s->pending;
    if (e->descriptor_handle) pt_allreduce_abandon(e->descriptor_handle);
    if (e->payload_handle) pt_allreduce_abandon(e->payload_handle);
    if (e->compressed_handle) pt_exchange_abandon(e->compressed_handle);
    e->descriptor_handle = NULL;
    e->payload_handle = NULL;
    e->compressed_handle = NULL;
    e->live = false;
    retire_exchange_buffers(s);
}

/* Δ_r = θ̃ − θ for the slot's parameters, into the buffer, and its reduce
 * (with its descriptor) started. */
static pipert_result post(outer_state *s, const pt_coupling_point *at, int slot,
                          pt_coupling_metrics *m)
{
    const fragment *fr = &s->fragments[slot];
    size_t packed = 0;
    for (int r = 0; r < fr->n_ranges; r++) {
        const range *g = &fr->ranges[r];
        s->kernels->copy_to_host(s->buffer + packed, at->params + g->offset, g->count * sizeof(float));
        pt_outer_pseudo_gradient(s->buffer + packed, s->outer + g->offset, s->buffer + packed,
                                 g->count);
        packed += g->count;
    }
    s->pending = (exchange){.live = true, .slot = slot, .posted = at->step,
                            .due = at->step + s->plan.delay,
                            .posted_us = pt_trace_clock_us(s->options.trace)};
    pt_debug("dp %s, stage %d, replica %d: step %ld posts fragment %d (due at step %ld)",
             s->plan.method, s->options.stage, s->index, at->step, slot, s->pending.due);
    if (!s->options.replicas) {
        s->pending.arrived = true; /* the mean of one */
        return PIPERT_OK;
    }
    memset(s->descriptors, 0, (size_t)s->replicas * DESCRIPTOR_FIELDS * sizeof(float));
    describe(s, s->descriptors + (size_t)s->index * DESCRIPTOR_FIELDS, slot, at->step, fr->count);
    pipert_result rc = pt_allreduce_start(s->options.replicas, s->descriptors,
                                          (size_t)s->replicas * DESCRIPTOR_FIELDS, PT_REDUCE_SUM,
                                          &s->pending.descriptor_handle);
    if (rc != PIPERT_OK) {
        s->pending.live = false;
        return rc;
    }
    double payload_bytes = ring_bytes(s, fr->count);
    if (s->codec.kind == PT_CODEC_NONE) {
        rc = pt_allreduce_start(s->options.replicas, s->buffer, fr->count, PT_REDUCE_MEAN,
                                &s->pending.payload_handle);
    } else {
        rc = pt_exchange_start(s->options.replicas, &s->codec, NULL, s->buffer, fr->count,
                               s->buffer, &s->pending.compressed_handle);
        if (rc == PIPERT_OK) payload_bytes = (double)pt_exchange_bytes_sent(s->pending.compressed_handle);
    }
    if (rc != PIPERT_OK) {
        abandon_exchange(s);
        return rc;
    }
    m->bytes_sent += ring_bytes(s, (size_t)s->replicas * DESCRIPTOR_FIELDS) + payload_bytes;
    return PIPERT_OK;
}

static pipert_result wait_payload(outer_state *s, const char *what)
{
    exchange *e = &s->pending;
    pipert_result rc = PIPERT_OK;
    if (e->payload_handle) rc = pt_coupling_wait_allreduce(&s->options, e->payload_handle, what);
    if (e->compressed_handle) rc = pt_coupling_wait_exchange(&s->options, e->compressed_handle, what);
    e->payload_handle = NULL;
    e->compressed_handle = NULL;
    return rc;
}

/* Whether every replica runs the same kind of payload collective (the same
 * codec): then waiting for it ends, in its result or in a shape error. */
static bool same_codec_everywhere(const outer_state *s)
{
    for (int r = 0; r < s->replicas; r++)
        if (s->descriptors[(size_t)r * DESCRIPTOR_FIELDS + DESCRIPTOR_CODEC] != (float)s->codec.kind)
            return false;
    return true;
}

/* Waits for the pending exchange: its descriptors, then its mean. On a
 * failure or a stop nothing is applied and nothing stays pending. After a
 * disagreement the payload is still waited for when every replica runs the
 * same collective, so the buffer is ours again; otherwise (another codec, or
 * no descriptors: replicas left meanwhile) it is abandoned and its buffers
 * retired, since a late message may still land in them. The descriptors'
 * message wins. */
static pipert_result finish(outer_state *s)
{
    exchange *e = &s->pending;
    if (e->arrived) return PIPERT_OK;
    char what[128];
    snprintf(what, sizeof what, "dp %s, stage %d: fragment %d posted at step %ld", s->plan.method,
             s->options.stage, e->slot, e->posted);
    pipert_result rc = pt_coupling_wait_allreduce(&s->options, e->descriptor_handle, what);
    e->descriptor_handle = NULL;
    const bool described = rc == PIPERT_OK;
    if (described) rc = check_descriptors(s, e);
    char mismatch[512] = "";
    if (rc != PIPERT_OK) snprintf(mismatch, sizeof mismatch, "%s", pipert_last_error());
    if (rc != PIPERT_OK && !(described && same_codec_everywhere(s))) {
        abandon_exchange(s);
        return pt_fail(rc, "%s", mismatch);
    }
    const pipert_result payload = wait_payload(s, what);
    if (payload != PIPERT_OK) retire_exchange_buffers(s); /* its wait abandoned it */
    if (rc != PIPERT_OK) pt_fail(rc, "%s", mismatch);
    else rc = payload;
    if (rc != PIPERT_OK) {
        e->live = false;
        return rc;
    }
    e->arrived = true;
    pt_trace_span(s->options.trace, "exchange", e->posted_us, pt_trace_clock_us(s->options.trace),
                  -1, e->posted, e->posted);
    return PIPERT_OK;
}

static double squared_norm_of_sum(const float *a, double scale_b, const float *b, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = (a ? a[i] : 0.0) + scale_b * b[i];
        sum += x * x;
    }
    return sum;
}

/* Λ for the pending slot: constant, or CO2's adaptive penalty with
 * gap = −η·v and fresh = Δ − gap = Δ + η·v over the slot's parameters. */
static double penalty_of(const outer_state *s, const fragment *fr)
{
    if (s->plan.penalty > 0) return s->plan.penalty;
    const double lr = s->plan.rule.lr;
    double gap = 0, fresh = 0;
    size_t packed = 0;
    for (int r = 0; r < fr->n_ranges; r++) {
        const float *v = s->momentum + fr->ranges[r].offset;
        gap += squared_norm_of_sum(NULL, lr, v, fr->ranges[r].count);
        fresh += squared_norm_of_sum(s->buffer + packed, lr, v, fr->ranges[r].count);
        packed += fr->ranges[r].count;
    }
    return pt_outer_adaptive_penalty(sqrt(gap), sqrt(fresh));
}

/* The outer step of the pending slot with the mean Δ that arrived. */
static pipert_result apply(outer_state *s, const pt_coupling_point *at, pt_coupling_metrics *m)
{
    PT_TRY(finish(s));
    exchange *e = &s->pending;
    const fragment *fr = &s->fragments[e->slot];
    const double penalty = penalty_of(s, fr);
    size_t packed = 0;
    for (int r = 0; r < fr->n_ranges; r++) {
        const range *g = &fr->ranges[r];
        pt_outer_step(&s->plan.rule, penalty, s->outer + g->offset, s->momentum + g->offset,
                      s->buffer + packed, g->count);
        if (s->eval_copy)
            s->kernels->copy_to_device(s->eval_copy + g->offset, s->outer + g->offset,
                                       g->count * sizeof(float));
        packed += g->count;
    }
    m->delay = (double)(at->step - e->posted);
    pt_debug("dp %s, stage %d, replica %d: step %ld applies fragment %d posted at step %ld "
             "(penalty %.4g)",
             s->plan.method, s->options.stage, s->index, at->step, e->slot, e->posted, penalty);
    e->live = e->arrived = false;
    return PIPERT_OK;
}

/* θ ← α·θ + (1−α)·θ̃ on the slot's parameters, and the newest stash with it. */
static void merge(outer_state *s, const pt_coupling_point *at, int slot)
{
    const double alpha = s->plan.alpha;
    if (alpha == 1.0) return;
    const fragment *fr = &s->fragments[slot];
    size_t packed = 0;
    for (int r = 0; r < fr->n_ranges; r++) {
        const range *g = &fr->ranges[r];
        const size_t bytes = g->count * sizeof(float);
        const float *merged = s->outer + g->offset;
        if (alpha != 0.0) {
            float *local = s->scratch + packed;
            s->kernels->copy_to_host(local, at->params + g->offset, bytes);
            pt_outer_merge(local, s->outer + g->offset, alpha, g->count);
            merged = local;
        }
        s->kernels->copy_to_device(at->params + g->offset, merged, bytes);
        if (at->newest_stash) s->kernels->copy_to_device(at->newest_stash + g->offset, merged, bytes);
        packed += g->count;
    }
}

pipert_result pt_outer_after_backward(void *state, pt_coupling_point *at, pt_coupling_metrics *m)
{
    /* θ before the first optimizer step is θ̃'s starting point. */
    return get_ready(state, at);
}

pipert_result pt_outer_after_step(void *state, pt_coupling_point *at, pt_coupling_metrics *m)
{
    outer_state *s = state;
    PT_TRY(get_ready(s, at));
    int applied[2], n_applied = 0;
    if (s->pending.live) {
        if (s->pending.due < at->step)
            return pt_fail(PIPERT_ERR_INTERNAL, "dp %s: fragment %d fell due at step %ld, now %ld",
                           s->plan.method, s->pending.slot, s->pending.due, at->step);
        if (s->pending.due == at->step) {
            applied[n_applied++] = s->pending.slot;
            PT_TRY(apply(s, at, m));
        }
    }
    const int slot = pt_outer_slot_at(at->step, s->plan.period, s->slots);
    const bool falls_due_in_run = at->step + s->plan.delay <= s->options.config->train.steps;
    if (slot >= 0 && s->fragments[slot].count > 0 && falls_due_in_run) {
        if (s->pending.live)
            return pt_fail(PIPERT_ERR_INTERNAL, "dp %s: fragment %d posts while %d is in flight",
                           s->plan.method, slot, s->pending.slot);
        PT_TRY(post(s, at, slot, m));
        if (s->plan.delay == 0) {
            applied[n_applied++] = slot;
            PT_TRY(apply(s, at, m));
        }
    }
    for (int i = 0; i < n_applied; i++) merge(s, at, applied[i]);
    return PIPERT_OK;
}

const float *pt_outer_eval_params(void *state)
{
    outer_state *s = state;
    if (!s->plan.evaluate_outer || !s->ready) return NULL;
    return s->eval_copy ? s->eval_copy : s->outer;
}

/* ---- checkpoints ------------------------------------------------------------ */

pipert_result pt_outer_save(void *state, pt_safetensors_writer *w)
{
    outer_state *s = state;
    if (!s->ready) return PIPERT_OK; /* before the first step θ̃ is θ */
    if (s->pending.live) PT_TRY(finish(s));
    PT_TRY(checkpoint_room(s));
    const size_t n = s->n_params;
    float *outer = s->saved, *momentum = s->saved + n, *pending = s->saved + 2 * n;
    memcpy(outer, s->outer, n * sizeof(float));
    memcpy(momentum, s->momentum, n * sizeof(float));
    PT_TRY(pt_gpt_add_to_writer(w, s->model, outer, "dp.outer."));
    PT_TRY(pt_gpt_add_to_writer(w, s->model, momentum, "dp.momentum."));
    const exchange *e = &s->pending;
    char text[160] = "{}";
    if (e->live) {
        unpack(&s->fragments[e->slot], pending, s->buffer);
        char name[PT_TENSOR_NAME_MAX + 32];
        for (int i = 0; i < s->model->n_tensors; i++) {
            const pt_gpt_tensor *t = &s->model->tensors[i];
            if (pt_outer_slot_of(t->name, s->plan.block_fragments) != e->slot) continue;
            snprintf(name, sizeof name, "dp.pending.%s", t->name);
            PT_TRY(pt_safetensors_writer_add(w, name, PT_DTYPE_F32, pending + t->offset,
                                             t->ndim, t->shape));
        }
        snprintf(text, sizeof text,
                 "{\"pending_fragment\":%d,\"pending_posted\":%ld,\"pending_due\":%ld}", e->slot,
                 e->posted, e->due);
    }
    return pt_safetensors_writer_set_metadata(w, "dp_outer", text);
}

static pipert_result read_pending(outer_state *s, const pt_safetensors *st, const char *path)
{
    const char *text = pt_safetensors_metadata(st, "dp_outer");
    if (!text) return PIPERT_OK;
    json_error_t error;
    json_t *meta = json_loads(text, 0, &error);
    if (!meta) return pt_fail(PIPERT_ERR_FORMAT, "%s: metadata dp_outer: %s", path, error.text);
    json_t *slot = json_object_get(meta, "pending_fragment");
    if (slot) {
        s->loaded_pending = true;
        s->loaded_exchange = (exchange){
            .slot = (int)json_integer_value(slot),
            .posted = (long)json_integer_value(json_object_get(meta, "pending_posted")),
            .due = (long)json_integer_value(json_object_get(meta, "pending_due"))};
    }
    json_decref(meta);
    return PIPERT_OK;
}

pipert_result pt_outer_load(void *state, const pt_safetensors *st, const char *path)
{
    outer_state *s = state;
    if (s->ready)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "dp %s: the outer state loads before the first "
                                               "step only", s->plan.method);
    const char *method = pt_safetensors_metadata(st, "dp_method");
    if (method && strcmp(method, s->plan.method)) {
        pt_info("%s was written with dp.method=%s: %s starts its outer state from the loaded "
                "parameters", path, method, s->plan.method);
        return PIPERT_OK;
    }
    free_loaded(s);
    const size_t count = pt_safetensors_count(st);
    s->loaded = calloc(count ? count : 1, sizeof *s->loaded);
    if (!s->loaded) return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", s->plan.method);
    for (size_t i = 0; i < count; i++) {
        const pt_tensor_entry *e = pt_safetensors_at(st, i);
        if (strncmp(e->name, "dp.outer.", 9) && strncmp(e->name, "dp.momentum.", 12) &&
            strncmp(e->name, "dp.pending.", 11))
            continue;
        loaded_tensor *t = &s->loaded[s->n_loaded];
        t->name = strdup(e->name);
        t->data = malloc((e->numel ? e->numel : 1) * sizeof *t->data);
        t->numel = e->numel;
        s->n_loaded++;
        if (!t->name || !t->data) return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", s->plan.method);
        PT_TRY(pt_safetensors_read_f32(st, e, t->data, e->numel));
    }
    return read_pending(s, st, path);
}

/* ---- elastic replicas ---------------------------------------------------------- */

/* Replicas left: the exchange in flight is dropped on every survivor (some
 * may have had its mean, others not: the regroup makes θ̃ equal again). Its
 * buffers are retired, not reused. */
void pt_outer_suspend(void *state)
{
    outer_state *s = state;
    const bool in_flight = s->pending.live && !s->pending.arrived && s->options.replicas;
    if (in_flight) abandon_exchange(s);
    s->pending = (exchange){0};
}

/* The survivors' group; θ̃ and v from its first member, so that all agree. */
pipert_result pt_outer_regroup(void *state, const pt_coupling_options *options,
                               const pt_coupling_point *at)
{
    outer_state *s = state;
    if (s->lost_buffer)
        return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory retiring an exchange",
                       s->plan.method);
    s->options = *options;
    s->replicas = options->replicas ? pt_group_size(options->replicas) : 1;
    s->index = options->replicas ? pt_group_index(options->replicas) : 0;
    float *descriptors = calloc((size_t)s->replicas * DESCRIPTOR_FIELDS, sizeof *descriptors);
    if (!descriptors) return pt_fail(PIPERT_ERR_NOMEM, "dp %s: out of memory", s->plan.method);
    free(s->descriptors);
    s->descriptors = descriptors;
    if (!options->replicas) return PIPERT_OK;
    /* Every member broadcasts, so every member must have θ̃: one that has not stepped yet
     * (a replica coming back, with the state it loaded) starts it now. */
    PT_TRY(get_ready(s, at));
    const size_t bytes = s->n_params * sizeof(float);
    PT_TRY(pt_broadcast(options->replicas, s->outer, bytes, 0));
    PT_TRY(pt_broadcast(options->replicas, s->momentum, bytes, 0));
    /* θ̃ lives on the host; validation reads the kernels' copy of it */
    if (s->eval_copy) s->kernels->copy_to_device(s->eval_copy, s->outer, bytes);
    return PIPERT_OK;
}
