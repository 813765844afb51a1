#include "pipeline/executor.h"
#include "pipeline/executor_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"
#include "runtime/data.h"
#include "runtime/safetensors.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

/* How long one wait for a message lasts before should_stop is asked again. */
#define WAIT_SLICE_S 0.5
/* A message that has not come after this long means a peer is stuck. */
#define MESSAGE_TIMEOUT_S 600.0

/* User tags of the two directions; the microbatch id is the low bits. */
#define TAG_ACTIVATION 0u
#define TAG_GRADIENT 1u
#define TAG_EVAL 2u       /* validation at the end, or of a flush schedule */
#define TAG_EVAL_WAVE 3u  /* validation while the asynchronous schedule runs */



static bool is_last_stage(const pt_stage_executor *ex) { return pt_executor_is_last_stage(ex); }

static bool is_async(const pt_stage_executor *ex) { return pt_executor_is_async(ex); }

/* ---- setup --------------------------------------------------------------- */

static pipert_result optimizer_settings(pt_stage_executor *ex, pt_optimizer_settings *s)
{
    const pt_train_settings *t = &ex->config.train;
    memset(s, 0, sizeof *s);
    s->kind = t->optimizer;
    s->beta1 = t->beta1;
    s->beta2 = t->beta2;
    s->eps = t->eps;
    s->weight_decay = t->weight_decay;
    s->psi = t->momentum_decay;
    const bool nesterov = pt_lookahead_traits_of(ex->lookahead)->nesterov;
    if (is_async(ex) && nesterov) {
        /* The look-ahead is the optimizer: NAdam with a large β1 (AsyncMesh). */
        s->kind = PT_OPTIMIZER_NADAMW;
        s->beta1 = 0.99;
    }
    const bool stale = pt_executor_stashes_weights(ex); /* every stage but the last */
    if (is_async(ex) && ex->lookahead == PT_LOOKAHEAD_NESTEROV_SECANT && stale)
        s->momentum_shift = PT_SECANT_MOMENTUM_SHIFT; /* secant.h */
    return PIPERT_OK;
}

/* Microbatches in flight on this stage (bounded by what the run has). */
static int in_flight(const pt_stage_executor *ex)
{
    const long M = is_async(ex) ? ex->config.train.steps : ex->microbatches;
    return pt_schedule_in_flight(ex->schedule_kind, ex->options.stages, ex->options.stage, M);
}

static bool stashes_weights(const pt_stage_executor *ex) { return pt_executor_stashes_weights(ex); }

static pt_validation_port validation_port(pt_stage_executor *ex);

/* The stage as the look-ahead sees it now (lookahead.h). */
static pt_lookahead_stage lookahead_stage(pt_stage_executor *ex)
{
    return (pt_lookahead_stage){
        .model = ex->model,
        .optimizer = &ex->optimizer,
        .regions = ex->regions,
        .version = ex->version,
        .staleness_estimate = ex->staleness_estimate,
        .backward_weights = stashes_weights(ex) ? ex->slot_weights[ex->backward_slot] : NULL,
    };
}

static pipert_result alloc_slot_tables(pt_stage_executor *ex)
{
    const size_t S = (size_t)ex->slots, N = (size_t)ex->B * ex->T;
    ex->slot_version = calloc(S, sizeof *ex->slot_version);
    ex->slot_weights = calloc(S, sizeof *ex->slot_weights);
    ex->stash_input = calloc(S, sizeof *ex->stash_input);
    ex->send_copies = calloc(S, sizeof *ex->send_copies);
    ex->stash_tokens = calloc(S, sizeof *ex->stash_tokens);
    ex->stash_targets = calloc(S, sizeof *ex->stash_targets);
    ex->activation_sends = calloc(S, sizeof *ex->activation_sends);
    if (!ex->slot_version || !ex->slot_weights || !ex->stash_input || !ex->send_copies ||
        !ex->stash_tokens || !ex->stash_targets || !ex->activation_sends)
        return pt_fail(PIPERT_ERR_NOMEM, "executor tables: out of memory");
    const pt_kernels *k = ex->kernels;
    for (size_t i = 0; i < S; i++) {
        if (stashes_weights(ex))
            PT_TRY(k->alloc((void **)&ex->slot_weights[i], ex->model->n_params * sizeof(float),
                            "stashed weight versions"));
        if (!ex->config.pipeline.recompute) continue;
        if (ex->options.stage > 0)
            PT_TRY(k->alloc((void **)&ex->stash_input[i], N * ex->C * sizeof(float), "stashed inputs"));
        else PT_TRY(k->alloc((void **)&ex->stash_tokens[i], N * sizeof(int32_t), "stashed tokens"));
        if (is_last_stage(ex))
            PT_TRY(k->alloc((void **)&ex->stash_targets[i], N * sizeof(int32_t), "stashed targets"));
        else if (!ex->transfer_bf16) /* bf16: the rounded copy being sent (transfer.c) */
            PT_TRY(k->alloc((void **)&ex->send_copies[i], N * ex->C * sizeof(float),
                            "activations being sent (recompute)"));
    }
    return PIPERT_OK;
}

static pipert_result build_model(pt_stage_executor *ex)
{
    const pt_gpt_config model = pt_gpt_config_from_settings(&ex->config);
    PT_TRY(pt_gpt_slice_create(&ex->model, &model, ex->options.first_layer, ex->options.last_layer,
                               ex->B, ex->T, ex->kernels));
    PT_TRY(pt_gpt_init(ex->model, (uint64_t)ex->config.seed));
    /* An activation set per microbatch in flight (one, shared, when they are recomputed), and
     * one of its own for validation while the asynchronous schedule runs (validation.c). */
    int sets = ex->config.pipeline.recompute ? 1 : ex->slots;
    if (ex->waves.enabled) ex->waves.slot = sets++;
    if (!ex->config.pipeline.recompute || sets > 1)
        PT_TRY(pt_gpt_set_activation_slots(ex->model, sets));
    ex->regions = calloc((size_t)ex->model->n_tensors, sizeof *ex->regions);
    if (!ex->regions) return pt_fail(PIPERT_ERR_NOMEM, "executor: out of memory");
    for (int i = 0; i < ex->model->n_tensors; i++)
        ex->regions[i] = (pt_param_region){ex->model->tensors[i].offset,
                                           ex->model->tensors[i].numel, ex->model->tensors[i].decay};
    pt_optimizer_settings settings;
    PT_TRY(optimizer_settings(ex, &settings));
    return pt_optimizer_init(&ex->optimizer, &settings, ex->kernels, ex->model->n_params);
}

/* Stage 0 reads the inputs, the last stage the targets; with a batch
 * callback the host program supplies both. */
static pipert_result load_data(pt_stage_executor *ex)
{
    const pt_data_settings *d = &ex->config.data;
    if (ex->options.stage != 0 && !is_last_stage(ex)) return PIPERT_OK;
    if (ex->options.batch) return PIPERT_OK;
    PT_TRY(pt_dataset_load(&ex->data, d->path, d->format, d->val_fraction));
    ex->has_data = true;
    ex->data.sampling = d->sampling;
    ex->data.sequences_per_step = (long)ex->B * ex->options.replicas;
    return pt_dataset_check(&ex->data, ex->T, ex->config.model.vocab_size);
}


/* Of `count` microbatches from microbatch `first` of the run, those still
 * inside pipeline.sync_steps. */
static int synchronous_from(const pt_stage_executor *ex, long first, int count)
{
    const long left = ex->config.pipeline.sync_steps - first;
    return left <= 0 ? 0 : left < count ? (int)left : count;
}

pipert_result pt_executor_build_schedule(const pt_stage_executor *ex, pt_schedule *out, int stage,
                                         long first, int count)
{
    if (!is_async(ex))
        return pt_schedule_build(out, ex->schedule_kind, ex->options.stages, count, stage);
    return pt_schedule_build_async(out, ex->options.stages, count, stage,
                                   synchronous_from(ex, first, count));
}

static pipert_result executor_setup(pt_stage_executor *ex)
{
    const pipert_config *cfg = ex->options.config;
    ex->config = *cfg;
    ex->kernels = ex->options.kernels;
    if (!ex->kernels) PT_TRY(pt_kernels_for_device(cfg->runtime.device, &ex->kernels));
    if (ex->kernels->set_threads) ex->kernels->set_threads(ex->options.threads);
    ex->schedule_kind = cfg->pipeline.schedule;
    /* One stage has no staleness to hide: it is 1F1B with a flush over
     * train.grad_accum microbatches, i.e. plain gradient accumulation. */
    const bool one_stage = ex->options.stages == 1;
    if (one_stage) ex->schedule_kind = PT_SCHEDULE_1F1B;
    ex->lookahead = cfg->pipeline.lookahead;
    ex->microbatches = is_async(ex) ? 1 : one_stage ? cfg->train.grad_accum : cfg->pipeline.microbatches;
    ex->B = cfg->train.batch_size;
    ex->T = cfg->model.block_size;
    ex->C = cfg->model.n_embd;
    ex->slots = in_flight(ex);
    pt_eval_waves_init(&ex->waves, is_async(ex), ex->options.stages, cfg->train.val_every,
                       cfg->train.steps);
    PT_TRY(build_model(ex));
    PT_TRY(pt_lookahead_setup(&ex->look, ex->lookahead, cfg, ex->kernels, is_async(ex),
                              pt_executor_stashes_weights(ex), ex->model));
    PT_TRY(pt_transfer_setup(ex));
    PT_TRY(alloc_slot_tables(ex));
    PT_TRY(pt_staging_setup(ex));
    PT_TRY(load_data(ex));
    const pt_validation_port port = validation_port(ex);
    PT_TRY(pt_eval_waves_setup(&ex->waves, &port));
    const size_t N = (size_t)ex->B * ex->T;
    PT_TRY(pt_alloc((void **)&ex->inputs, N * sizeof(int32_t), "input tokens"));
    PT_TRY(pt_alloc((void **)&ex->targets, N * sizeof(int32_t), "target tokens"));
    PT_TRY(ex->kernels->alloc((void **)&ex->dout, N * ex->C * sizeof(float), "received gradient"));
    const long total = is_async(ex) ? cfg->train.steps : ex->microbatches;
    if (total > INT32_MAX / 8)
        return pt_fail(PIPERT_ERR_CONFIG, "train.steps=%ld: too many for one schedule", total);
    PT_TRY(pt_executor_build_schedule(ex, &ex->schedule, ex->options.stage, 0, (int)total));
    ex->staleness_estimate = ex->options.stages - 1 - ex->options.stage;
    ex->newest_slot = -1;
    snprintf(ex->description, sizeof ex->description,
             "stage %d/%d (blocks [%d, %d), %.2fM parameters), %s, lookahead %s, %s, %d "
             "microbatch%s in flight%s%s%s",
             ex->options.stage, ex->options.stages, ex->options.first_layer,
             ex->options.last_layer, (double)ex->model->n_params / 1e6,
             pt_schedule_kind_name(ex->schedule_kind),
             is_async(ex) ? pt_lookahead_name(ex->lookahead) : "n/a (flush)",
             pt_optimizer_kind_name(ex->optimizer.settings.kind), ex->slots,
             ex->slots == 1 ? "" : "es", cfg->pipeline.recompute ? ", recompute" : "",
             is_async(ex) && ex->schedule.synchronous ? ", the first steps synchronous" : "",
             ex->transfer_bf16 ? ", bf16 between stages" : "");
    return PIPERT_OK;
}

pipert_result pt_stage_executor_create(pt_stage_executor **out, const pt_stage_executor_options *o)
{
    *out = NULL;
    pt_stage_executor *ex = calloc(1, sizeof *ex);
    if (!ex) return pt_fail(PIPERT_ERR_NOMEM, "executor: out of memory");
    ex->options = *o;
    pipert_result rc = executor_setup(ex);
    if (rc != PIPERT_OK) {
        pt_stage_executor_free(ex);
        return rc;
    }
    *out = ex;
    return PIPERT_OK;
}

/* Releases a send still in flight when the executor goes away: normally it
 * completed long ago; after a failure, its peer has usually died or left. */
static void finish_request(pt_request **request)
{
    if (!*request) return;
    pt_request_wait(*request, 5.0);
    pt_request_free(*request);
    *request = NULL;
}

void pt_stage_executor_free(pt_stage_executor *ex)
{
    if (!ex) return;
    pt_eval_waves_free(&ex->waves);
    pt_lookahead_free(&ex->look);
    const pt_kernels *k = ex->kernels;
    for (int i = 0; i < ex->slots; i++) {
        if (ex->activation_sends) finish_request(&ex->activation_sends[i]);
        if (!k) continue;
        if (ex->slot_weights) k->free(ex->slot_weights[i]);
        if (ex->stash_input) k->free(ex->stash_input[i]);
        if (ex->send_copies) k->free(ex->send_copies[i]);
        if (ex->stash_tokens) k->free(ex->stash_tokens[i]);
        if (ex->stash_targets) k->free(ex->stash_targets[i]);
    }
    finish_request(&ex->gradient_send);
    if (k) pt_staging_free(ex);
    if (k) pt_transfer_free(ex);
    free(ex->slot_version);
    free(ex->slot_weights);
    free(ex->stash_input);
    free(ex->send_copies);
    free(ex->stash_tokens);
    free(ex->stash_targets);
    free(ex->activation_sends);
    if (k) {
        k->free(ex->dout);
        pt_optimizer_free(&ex->optimizer);
    }
    free(ex->regions);
    pt_free(ex->inputs);
    pt_free(ex->targets);
    if (ex->has_data) pt_dataset_free(&ex->data);
    pt_gpt_slice_free(ex->model);
    pt_schedule_free(&ex->schedule);
    free(ex);
}

pt_gpt_slice *pt_stage_executor_model(pt_stage_executor *ex) { return ex->model; }
pt_optimizer *pt_stage_executor_optimizer(pt_stage_executor *ex) { return &ex->optimizer; }
const char *pt_stage_executor_describe(const pt_stage_executor *ex) { return ex->description; }

/* ---- messages ------------------------------------------------------------ */

static uint32_t message_tag(uint32_t direction, long microbatch)
{
    return direction << 30 | ((uint32_t)microbatch & 0x3fffffffu);
}

static pt_message_header activation_header(const pt_stage_executor *ex, uint16_t kind,
                                           long microbatch, pt_dtype dtype)
{
    const size_t N = (size_t)ex->B * ex->T;
    return (pt_message_header){.kind = kind,
                               .dtype = dtype,
                               .replica = ex->options.replica,
                               .stage = ex->options.stage,
                               .microbatch = (int32_t)microbatch,
                               .step = ex->version,
                               .weight_version = ex->version,
                               .ndim = 3,
                               .shape = {ex->B, ex->T, ex->C},
                               .nbytes = N * ex->C * pt_dtype_size(dtype)};
}

/* Waits for a request in slices, asking should_stop in between. */
static pipert_result wait_request(pt_stage_executor *ex, pt_request *request, const char *what)
{
    const double deadline = pt_now_s() + MESSAGE_TIMEOUT_S;
    const pt_utilisation_mark mark = pt_utilisation_mark_now();
    for (;;) {
        pipert_result rc = pt_request_wait(request, WAIT_SLICE_S);
        if (rc != PIPERT_ERR_TIMEOUT) {
            pt_utilisation_add_pipeline_wait(&ex->util, mark);
            if (rc != PIPERT_OK) pt_error_prefix("%s", what);
            return rc;
        }
        if (ex->options.should_stop && ex->options.should_stop(ex->options.context))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "%s: stopped while waiting", what);
        if (pt_now_s() > deadline)
            return pt_fail(PIPERT_ERR_TIMEOUT, "%s: nothing for %.0f s", what, MESSAGE_TIMEOUT_S);
    }
}

static void trace_span(pt_stage_executor *ex, const char *category, double started_us,
                       long microbatch)
{
    pt_trace_span(ex->options.trace, category, started_us, pt_trace_now_us(), microbatch,
                  ex->version, ex->version);
}

/* A forward's or backward's span. On a table that runs asynchronously (cuda) the host only
 * queues the kernels, and the copy or receive after them would wait for the device and carry
 * its time; when tracing, the span ends once the device finished its work instead, so that
 * the trace shows compute as compute and copies as copies. The copy that follows waits for
 * the same work anyway: only a receive's wait can overlap less. */
static void trace_compute_span(pt_stage_executor *ex, const char *category, double started_us,
                               long microbatch)
{
    if (!ex->options.trace) return;
    ex->kernels->synchronize();
    trace_span(ex, category, started_us, microbatch);
}

/* The transport checked kind, dtype, shape, size and checksum; the pipeline
 * also wants the message to come from the right replica, stage and
 * microbatch. */
static pipert_result check_sender(const pt_stage_executor *ex, const pt_message_header *h, int peer,
                                  long microbatch, const char *what)
{
    const int stage = peer == ex->options.prev_rank ? ex->options.stage - 1 : ex->options.stage + 1;
    if (h->replica != ex->options.replica || h->stage != stage || h->microbatch != (int32_t)microbatch)
        return pt_fail(PIPERT_ERR_PEER,
                       "%s: rank %d sent replica %d, stage %d, microbatch %d (expected %d, %d, %ld)",
                       what, peer, h->replica, h->stage, h->microbatch, ex->options.replica, stage,
                       microbatch);
    return PIPERT_OK;
}

/* Receives an [N, C] tensor of `kind` for `microbatch` from `peer` into dst; `rounded`: it
 * crosses in bf16 (transfer.c), landing in rounded_received and widened into dst. */
static pipert_result receive_tensor(pt_stage_executor *ex, int peer, uint16_t kind,
                                    uint32_t direction, long microbatch, float *dst, bool rounded)
{
    const double started = pt_trace_now_us();
    const pt_dtype dtype = rounded ? PT_DTYPE_BF16 : PT_DTYPE_F32;
    pt_message_header expected = activation_header(ex, kind, microbatch, dtype);
    pt_recv_expect expect = {.kind = kind,
                             .dtype = dtype,
                             .ndim = 3,
                             .shape = {ex->B, ex->T, ex->C},
                             .require_checksum = 1};
    pt_request *request = NULL;
    void *land = rounded ? (void *)ex->rounded_received : dst;
    void *incoming = pt_staging_incoming(ex, land);
    /* A peer of this host may put it on the device itself (staging.c). */
    PT_TRY(pt_recv_device(ex->options.transport, peer, message_tag(direction, microbatch), &expect,
                          incoming, incoming != land ? land : NULL, expected.nbytes, &request));
    char what[96];
    snprintf(what, sizeof what, "stage %d: receiving %s of microbatch %ld from rank %d",
             ex->options.stage, kind == PT_KIND_ACTIVATION_GRAD ? "the gradient" : "activations",
             microbatch, peer);
    pipert_result rc = wait_request(ex, request, what);
    if (rc != PIPERT_OK) {
        /* A receive that failed may never end: UCX cannot cancel a receive matched to a
         * message whose sender died partway through it (freeing it would wait for good, as a
         * 20-minute churn run found). Abandoned, it is freed when it ends, at the latest when
         * the session destroys the transport, which it does before freeing the buffers. */
        pt_request_abandon(request);
        trace_span(ex, "recv", started, microbatch);
        return rc;
    }
    rc = check_sender(ex, pt_request_header(request), peer, microbatch, what);
    const bool on_device = pt_request_on_device(request);
    pt_request_free(request);
    trace_span(ex, "recv", started, microbatch);
    if (rc == PIPERT_OK && incoming != land && !on_device) {
        const double copy_started = pt_trace_now_us();
        pt_staging_arrived(ex, land, expected.nbytes);
        trace_span(ex, "copy", copy_started, microbatch); /* host staging to the device */
    }
    if (rc == PIPERT_OK && rounded) {
        const double widen_started = pt_trace_now_us();
        ex->kernels->cast_from_bf16(dst, ex->rounded_received, (size_t)ex->B * ex->T * ex->C);
        trace_compute_span(ex, "copy", widen_started, microbatch);
    }
    return rc;
}

/* Sends an [N, C] tensor from src, rounded into `rounded` first (transfer.c; NULL: in fp32),
 * through `staging` (staging.c; NULL: what is sent is host memory already), or device to
 * device to a peer of this host that copies it. */
static pipert_result send_tensor(pt_stage_executor *ex, int peer, uint16_t kind,
                                 uint32_t direction, long microbatch, const float *src,
                                 pt_bf16 *rounded, void *staging, pt_request **request)
{
    const void *payload = src;
    if (rounded) {
        const double started = pt_trace_now_us();
        ex->kernels->cast_to_bf16(rounded, src, (size_t)ex->B * ex->T * ex->C);
        trace_compute_span(ex, "copy", started, microbatch);
        payload = rounded;
    }
    pt_message_header header =
        activation_header(ex, kind, microbatch, rounded ? PT_DTYPE_BF16 : PT_DTYPE_F32);
    const uint32_t tag = message_tag(direction, microbatch);
    pipert_result rc;
    if (staging && pt_staging_device_to(ex, peer, header.nbytes)) {
        const double started = pt_trace_now_us();
        rc = pt_staging_send_device(ex, peer, tag, &header, payload, request);
        trace_span(ex, "send", started, microbatch);
    } else {
        const double copy_started = pt_trace_now_us();
        const void *outgoing = pt_staging_outgoing(ex, staging, payload, header.nbytes);
        if (outgoing != payload) /* to host staging */
            trace_span(ex, "copy", copy_started, microbatch);
        const double started = pt_trace_now_us();
        rc = pt_send(ex->options.transport, peer, tag, &header, outgoing, PT_SEND_CHECKSUM, request);
        trace_span(ex, "send", started, microbatch);
    }
    if (rc != PIPERT_OK)
        pt_error_prefix("stage %d: sending microbatch %ld to rank %d", ex->options.stage,
                        microbatch, peer);
    return rc;
}

static pipert_result complete_send(pt_stage_executor *ex, pt_request **request)
{
    if (!*request) return PIPERT_OK;
    pipert_result rc = wait_request(ex, *request, "completing a send");
    pt_request_free(*request);
    *request = NULL;
    return rc;
}

/* ---- the instructions ---------------------------------------------------- */

typedef struct run_position {
    long base;        /* global id of the schedule's microbatch 0 */
    float loss_scale; /* of each microbatch in its step */
} run_position;

static int slot_of(const pt_stage_executor *ex, long microbatch)
{
    return pt_executor_slot_of(ex, microbatch);
}

/* The activation set a microbatch uses: its own slot, or the single set
 * shared by every microbatch when activations are recomputed. */
static void use_activations_of(pt_stage_executor *ex, long microbatch)
{
    pt_gpt_use_activation_slot(ex->model, ex->config.pipeline.recompute ? 0 : slot_of(ex, microbatch));
}

/* Batch `index` of `split` from the host program's callback. */
static pipert_result host_batch(pt_stage_executor *ex, pipert_split split, long index, long first)
{
    int rc = ex->options.batch(ex->options.batch_user, split, index, first, ex->B, ex->T,
                               ex->inputs, ex->targets);
    if (rc != 0)
        return pt_fail(PIPERT_ERR_IO, "stage %d: the batch callback returned %d for %s batch %ld",
                       ex->options.stage, rc, split == PIPERT_SPLIT_TRAIN ? "training" : "validation",
                       index);
    for (size_t i = 0; i < (size_t)ex->B * ex->T; i++)
        if (ex->inputs[i] < 0 || ex->inputs[i] >= ex->config.model.vocab_size ||
            ex->targets[i] < 0 || ex->targets[i] >= ex->config.model.vocab_size)
            return pt_fail(PIPERT_ERR_INVALID_ARG,
                           "stage %d: the batch callback gave token %d at position %zu of %s batch "
                           "%ld (model.vocab_size is %d)",
                           ex->options.stage, ex->inputs[i] < 0 || ex->inputs[i] >= ex->config.model.vocab_size ? ex->inputs[i] : ex->targets[i],
                           i, split == PIPERT_SPLIT_TRAIN ? "training" : "validation", index,
                           ex->config.model.vocab_size);
    return PIPERT_OK;
}

/* The global batch of microbatch g is the data of one optimizer step of a
 * single worker with grad_accum = M, so a flush schedule equals it; replica r
 * draws sequences [r·B, (r+1)·B) of it. */
static pipert_result sample_batch(pt_stage_executor *ex, long microbatch)
{
    const long first = (long)ex->options.replica * ex->B;
    if (ex->options.batch) return host_batch(ex, PIPERT_SPLIT_TRAIN, microbatch, first);
    pt_dataset_train_batch(&ex->data, (uint64_t)ex->config.seed, microbatch, first, ex->B, ex->T,
                           ex->inputs, ex->targets);
    return PIPERT_OK;
}

static pipert_result load_batch(pt_stage_executor *ex, long g)
{
    const size_t bytes = (size_t)ex->B * ex->T * sizeof(int32_t);
    PT_TRY(sample_batch(ex, g));
    use_activations_of(ex, g);
    int32_t *dst = ex->config.pipeline.recompute ? ex->stash_tokens[slot_of(ex, g)] : ex->model->tokens;
    ex->kernels->copy_to_device(dst, ex->inputs, bytes);
    return PIPERT_OK;
}

static pipert_result recv_activation(pt_stage_executor *ex, long g)
{
    use_activations_of(ex, g);
    float *dst = ex->config.pipeline.recompute ? ex->stash_input[slot_of(ex, g)] : ex->model->input;
    return receive_tensor(ex, ex->options.prev_rank, PT_KIND_ACTIVATION, TAG_ACTIVATION, g, dst,
                          ex->transfer_bf16);
}

/* The last stage draws its own targets: batches are a pure function of
 * (seed, step, sequence), so no stage needs to send them. */
static pipert_result load_targets(pt_stage_executor *ex, long g)
{
    PT_TRY(sample_batch(ex, g));
    int32_t *dst = ex->config.pipeline.recompute ? ex->stash_targets[slot_of(ex, g)] : ex->model->targets;
    ex->kernels->copy_to_device(dst, ex->targets, (size_t)ex->B * ex->T * sizeof(int32_t));
    return PIPERT_OK;
}

/* Restores a recomputed microbatch's inputs into the shared activation set. */
static void restore_stashed_inputs(pt_stage_executor *ex, long g)
{
    const int slot = slot_of(ex, g);
    const size_t N = (size_t)ex->B * ex->T;
    pt_gpt_slice *m = ex->model;
    if (ex->options.stage > 0) ex->kernels->copy(m->input, ex->stash_input[slot], N * ex->C * sizeof(float));
    else ex->kernels->copy(m->tokens, ex->stash_tokens[slot], N * sizeof(int32_t));
    if (is_last_stage(ex)) ex->kernels->copy(m->targets, ex->stash_targets[slot], N * sizeof(int32_t));
}

/* Before microbatch g writes its activation set (or, with recompute, its slot's send copy),
 * the send that still reads from it must be done: its slot's previous send. Only that one: a
 * send to a peer that reads it from here (direct reads, device payloads) ends when the peer
 * took it, and waiting for later microbatches' sends would make this stage wait for the next
 * one, which may itself wait for this one in a collective (a checkpoint's gather). */
static pipert_result release_activations(pt_stage_executor *ex, long g)
{
    return complete_send(ex, &ex->activation_sends[slot_of(ex, g)]);
}

/* The weights microbatch g's forward uses, recorded for its backward. */
static pipert_result choose_forward_weights(pt_stage_executor *ex, long g)
{
    const int slot = slot_of(ex, g);
    ex->slot_version[slot] = ex->version;
    ex->newest_slot = slot;
    float *stash = ex->slot_weights[slot];
    if (!stashes_weights(ex)) {
        pt_gpt_use_params(ex->model, NULL);
        return PIPERT_OK;
    }
    const bool predicts = pt_lookahead_traits_of(ex->lookahead)->predicts;
    const bool synchronous = g < ex->config.pipeline.sync_steps; /* nothing to predict */
    if (predicts && !synchronous) {
        const pt_lookahead_stage stage = lookahead_stage(ex);
        PT_TRY(pt_lookahead_predict(&ex->look, &stage, stash));
    } else {
        ex->kernels->copy(stash, ex->model->params, ex->model->n_params * sizeof(float));
    }
    pt_gpt_use_params(ex->model, stash);
    return PIPERT_OK;
}

static void run_forward(pt_stage_executor *ex, float loss_scale, bool count_loss)
{
    float loss = NAN;
    pt_gpt_forward(ex->model, loss_scale, &loss);
    if (is_last_stage(ex) && count_loss) {
        ex->loss_sum += loss;
        ex->loss_count++;
    }
}

static pipert_result forward(pt_stage_executor *ex, long g, float loss_scale)
{
    const double started = pt_trace_now_us();
    use_activations_of(ex, g);
    if (is_last_stage(ex)) PT_TRY(load_targets(ex, g));
    PT_TRY(release_activations(ex, g));
    if (ex->config.pipeline.recompute) restore_stashed_inputs(ex, g);
    if (!ex->replaying) PT_TRY(choose_forward_weights(ex, g));
    else pt_gpt_use_params(ex->model, stashes_weights(ex) ? ex->slot_weights[slot_of(ex, g)]
                                                          : NULL); /* restored, stashed */
    run_forward(ex, loss_scale, !ex->replaying);
    pt_gpt_use_params(ex->model, NULL);
    trace_compute_span(ex, "forward", started, g);
    return PIPERT_OK;
}

static pipert_result send_activation(pt_stage_executor *ex, long g)
{
    const int slot = slot_of(ex, g);
    const float *output = pt_gpt_output(ex->model);
    pt_bf16 *rounded = pt_transfer_rounded(ex, slot); /* a copy of the slot's own */
    if (ex->config.pipeline.recompute && !rounded) { /* the activation set is every microbatch's */
        ex->kernels->copy(ex->send_copies[slot], output,
                          (size_t)ex->B * ex->T * ex->C * sizeof(float));
        output = ex->send_copies[slot];
    }
    return send_tensor(ex, ex->options.next_rank, PT_KIND_ACTIVATION, TAG_ACTIVATION, g, output,
                       rounded, ex->activation_staging ? ex->activation_staging[slot] : NULL,
                       &ex->activation_sends[slot]);
}

static pipert_result recv_gradient(pt_stage_executor *ex, long g)
{
    return receive_tensor(ex, ex->options.next_rank, PT_KIND_ACTIVATION_GRAD, TAG_GRADIENT, g,
                          ex->dout, ex->transfer_bf16);
}

static pipert_result backward(pt_stage_executor *ex, long g, float loss_scale)
{
    const double started = pt_trace_now_us();
    const int slot = slot_of(ex, g);
    PT_TRY(complete_send(ex, &ex->gradient_send)); /* dresidual is about to be overwritten */
    use_activations_of(ex, g);
    pt_gpt_use_params(ex->model, stashes_weights(ex) ? ex->slot_weights[slot] : NULL);
    if (ex->config.pipeline.recompute) {
        /* The activations of the forward, again, on the same weights (its loss was counted,
         * its classifier weight gradient taken). */
        restore_stashed_inputs(ex, g);
        pt_gpt_recompute(ex->model, loss_scale);
    }
    pt_gpt_backward(ex->model, ex->dout);
    pt_gpt_use_params(ex->model, NULL);
    ex->backward_slot = slot;
    const double staleness = (double)(ex->version - ex->slot_version[slot]);
    ex->staleness_sum += staleness;
    ex->staleness_count++;
    /* The look-aheads' τ is that of the asynchronous steps: a synchronous one (0) says nothing of it. */
    if (g >= ex->config.pipeline.sync_steps)
        ex->staleness_estimate += 0.05 * (staleness - ex->staleness_estimate);
    trace_compute_span(ex, "backward", started, g);
    return PIPERT_OK;
}

static pipert_result send_gradient(pt_stage_executor *ex, long g)
{
    return send_tensor(ex, ex->options.prev_rank, PT_KIND_ACTIVATION_GRAD, TAG_GRADIENT, g,
                       ex->model->dresidual, pt_transfer_rounded(ex, -1), ex->gradient_staging,
                       &ex->gradient_send);
}

/* ---- the optimizer step -------------------------------------------------- */

/* Gradient norm: global over the stages of the replica for flush schedules
 * (a pipelined step then equals a single-worker step), this stage's own for
 * the asynchronous one (ALGORITHMS.md §2). */
static pipert_result gradient_norm(pt_stage_executor *ex, double *norm)
{
    float squares = (float)ex->kernels->sum_squares(ex->model->grads, ex->model->n_params);
    if (!is_async(ex) && ex->options.stage_group)
        PT_TRY(pt_allreduce(ex->options.stage_group, &squares, 1, PT_REDUCE_SUM));
    *norm = sqrt((double)squares);
    return PIPERT_OK;
}

/* The part of a coupling call since `before` that was blocked on the
 * replicas; the rest of the call was computing. */
static void add_coupling_wait(pt_stage_executor *ex, pt_coupling_blocked before)
{
    const pt_coupling_blocked now = pt_coupling_blocked_time(ex->options.coupling);
    pt_utilisation_add_coupling_wait(&ex->util, now.wall_s - before.wall_s, now.cpu_s - before.cpu_s);
}

static pipert_result optimizer_step(pt_stage_executor *ex)
{
    const double started = pt_trace_now_us();
    const pt_train_settings *t = &ex->config.train;
    pt_gpt_slice *m = ex->model;
    float loss = ex->loss_count ? (float)(ex->loss_sum / ex->loss_count) : NAN;
    const long step = ex->version + 1;
    pt_coupling_point at = {.model = m, .params = m->params, .grads = m->grads,
                            .n_params = m->n_params, .step = step,
                            .loss = is_last_stage(ex) ? &loss : NULL};
    /* Each replica compensates its own gradient with its own stash before the replicas
     * average: an all-reduce then leaves them equal even where their stashes are not
     * (after a replica left or joined, only the newest stash is shared again). */
    const pt_lookahead_stage stage = lookahead_stage(ex);
    PT_TRY(pt_lookahead_adjust_gradient(&ex->look, &stage));
    if (ex->options.coupling) {
        const pt_coupling_blocked before = pt_coupling_blocked_time(ex->options.coupling);
        PT_TRY(pt_coupling_after_backward(ex->options.coupling, &at));
        add_coupling_wait(ex, before);
        trace_span(ex, "couple", started, -1);
    }
    if (is_last_stage(ex) && !isfinite(loss))
        return pt_fail(PIPERT_ERR_INTERNAL, "step %ld: the loss is %f; lower train.lr or check the data",
                       step, (double)loss);
    double norm;
    PT_TRY(gradient_norm(ex, &norm));
    const double lr = pt_lr_at(step, t->steps, t->lr, t->warmup_steps, t->min_lr_ratio) *
                      pt_lookahead_lr_factor(&ex->look, ex->staleness_estimate, step);
    pt_lookahead_before_step(&ex->look, m->params);
    /* the clipping inside the optimizer's pass (no pass of its own over the gradient) */
    pt_optimizer_step_scaled(&ex->optimizer, m->params, m->grads, ex->regions, m->n_tensors, lr,
                             pt_clip_scale(norm, t->grad_clip));
    pt_lookahead_after_step(&ex->look, m->params, ex->regions);
    pt_gpt_zero_grads(m);
    ex->version = step;
    if (ex->options.coupling) {
        at.grads = NULL;
        at.loss = NULL;
        at.newest_stash = stashes_weights(ex) && ex->newest_slot >= 0 ? ex->slot_weights[ex->newest_slot] : NULL;
        const double couple_started = pt_trace_now_us();
        const pt_coupling_blocked before = pt_coupling_blocked_time(ex->options.coupling);
        PT_TRY(pt_coupling_after_step(ex->options.coupling, &at));
        add_coupling_wait(ex, before);
        trace_span(ex, "couple", couple_started, -1);
    }
    ex->kernels->synchronize();
    trace_span(ex, "optimizer", started, -1);

    const double now = pt_now_s();
    const pt_coupling_metrics dp = ex->options.coupling ? pt_coupling_take_metrics(ex->options.coupling)
                                                        : (pt_coupling_metrics){0};
    ex->last_report = (pt_pipeline_step){
        .step = step,
        .total_steps = t->steps,
        .loss = loss,
        .lr = lr,
        .grad_norm = norm,
        .staleness = ex->staleness_count ? ex->staleness_sum / ex->staleness_count : 0,
        .seconds = now - ex->step_started,
        .tokens = (double)ex->B * ex->T * ex->microbatches,
        .dp = dp,
        .util = pt_utilisation_finish(&ex->util, ex->options.transport, ex->options.threads),
    };
    ex->loss_sum = 0, ex->loss_count = 0;
    ex->staleness_sum = 0, ex->staleness_count = 0;
    ex->step_started = now;
    if (!isfinite(norm))
        return pt_fail(PIPERT_ERR_INTERNAL, "stage %d, step %ld: the gradient norm is %g",
                       ex->options.stage, step, norm);
    return PIPERT_OK;
}

/* ---- dispatch ------------------------------------------------------------ */

static pipert_result execute(pt_stage_executor *ex, const pt_instruction *in, const run_position *at)
{
    const long g = at->base + in->microbatch;
    switch (in->kind) {
    case PT_LOAD_BATCH: return load_batch(ex, g);
    case PT_RECV_ACTIVATION: return recv_activation(ex, g);
    case PT_FORWARD: return forward(ex, g, at->loss_scale);
    case PT_SEND_ACTIVATION: return send_activation(ex, g);
    case PT_RECV_GRADIENT: return recv_gradient(ex, g);
    case PT_BACKWARD: return backward(ex, g, at->loss_scale);
    case PT_SEND_GRADIENT: return send_gradient(ex, g);
    case PT_OPTIMIZER_STEP: return optimizer_step(ex);
    case PT_INSTRUCTION_KINDS: break;
    }
    return pt_fail(PIPERT_ERR_INTERNAL, "schedule: unknown instruction %d", (int)in->kind);
}

/* The position of the schedule's microbatch 0, and each microbatch's share
 * of its step's loss. */
static run_position position(const pt_stage_executor *ex)
{
    return (run_position){.base = ex->base, .loss_scale = 1.0f / (float)ex->microbatches};
}

pipert_result pt_executor_execute(pt_stage_executor *ex, const pt_instruction *in)
{
    const run_position at = position(ex);
    return execute(ex, in, &at);
}

bool pt_stage_executor_finished(const pt_stage_executor *ex)
{
    return ex->version >= ex->config.train.steps && (!is_async(ex) || ex->cursor == ex->schedule.count);
}

/* Runs instructions until the next optimizer step is done. A flush schedule
 * is one step long and starts again; the asynchronous one is the whole run,
 * and after its last step the rest (the last sends) runs too. */
pipert_result pt_stage_executor_step(pt_stage_executor *ex, pt_pipeline_step *report)
{
    if (pt_stage_executor_finished(ex))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "stage %d: all %ld steps are done",
                       ex->options.stage, ex->config.train.steps);
    if (ex->step_started == 0) {
        ex->step_started = pt_now_s();
        pt_utilisation_start(&ex->util, ex->options.transport);
    }
    const long target = ex->version + 1;
    while (ex->version < target) {
        if (ex->cursor == ex->schedule.count) {
            if (is_async(ex)) return pt_fail(PIPERT_ERR_INTERNAL, "stage %d: the schedule ended "
                                                                  "before step %ld",
                                             ex->options.stage, target);
            ex->cursor = 0;
        }
        if (ex->cursor == 0 && !is_async(ex)) ex->base = ex->version * ex->microbatches;
        const run_position at = position(ex);
        PT_TRY(execute(ex, &ex->schedule.instructions[ex->cursor], &at));
        ex->cursor++;
    }
    if (is_async(ex) && ex->version == ex->config.train.steps) {
        const run_position at = position(ex);
        for (; ex->cursor < ex->schedule.count; ex->cursor++)
            PT_TRY(execute(ex, &ex->schedule.instructions[ex->cursor], &at));
    }
    PT_TRY(pt_eval_waves_after_step(&ex->waves, ex->version));
    if (report) *report = ex->last_report;
    return PIPERT_OK;
}

long pt_stage_executor_version(const pt_stage_executor *ex) { return ex->version; }

pipert_result pt_stage_executor_resume_at(pt_stage_executor *ex, long version)
{
    ex->version = version;
    ex->cursor = 0;
    if (!is_async(ex)) {
        ex->base = version * ex->microbatches;
        return PIPERT_OK;
    }
    if (version == ex->base) return PIPERT_OK; /* the schedule from its start */
    /* The asynchronous schedule starts again from an empty pipeline at
     * microbatch `version`: warm-up, steady state and drain over the rest. */
    const long left = ex->config.train.steps - version;
    ex->base = version;
    if (left < 1) {
        ex->cursor = ex->schedule.count;
        return PIPERT_OK;
    }
    pt_schedule_free(&ex->schedule);
    return pt_executor_build_schedule(ex, &ex->schedule, ex->options.stage, version, (int)left);
}

void pt_stage_executor_use_kernels(pt_stage_executor *ex, const pt_kernels *kernels)
{
    ex->kernels = kernels;
    ex->model->kernels = kernels;
    ex->optimizer.kernels = kernels;
    pt_lookahead_use_kernels(&ex->look, kernels);
}

/* ---- validation (validation.h): the port the executor offers it ------------ */

/* Validation batch k of n's tokens (stage 0) and targets (last stage) into the model. */
static pipert_result port_load_batch(void *stage, int k, int n)
{
    pt_stage_executor *ex = stage;
    if (!pt_executor_reads_data(ex)) return PIPERT_OK;
    pt_gpt_slice *m = ex->model;
    const size_t bytes = (size_t)ex->B * ex->T * sizeof(int32_t);
    if (ex->options.batch) PT_TRY(host_batch(ex, PIPERT_SPLIT_VAL, k, 0));
    else pt_dataset_val_batch(&ex->data, k, n, ex->B, ex->T, ex->inputs, ex->targets);
    if (ex->options.stage == 0) ex->kernels->copy_to_device(m->tokens, ex->inputs, bytes);
    if (is_last_stage(ex)) ex->kernels->copy_to_device(m->targets, ex->targets, bytes);
    return PIPERT_OK;
}

static const float *port_eval_params(void *stage)
{
    const pt_stage_executor *ex = stage;
    return pt_coupling_eval_params(ex->options.coupling);
}

static pipert_result port_receive(void *stage, bool wave, long id, float *dst)
{
    pt_stage_executor *ex = stage;
    return receive_tensor(ex, ex->options.prev_rank, PT_KIND_ACTIVATION,
                          wave ? TAG_EVAL_WAVE : TAG_EVAL, id, dst, false);
}

static pipert_result port_send(void *stage, long id, const float *src)
{
    pt_stage_executor *ex = stage;
    pt_request *request = NULL;
    PT_TRY(send_tensor(ex, ex->options.next_rank, PT_KIND_ACTIVATION, TAG_EVAL, id, src, NULL,
                       pt_staging_sync(ex), &request));
    return complete_send(ex, &request);
}

static pipert_result port_copy_output(void *stage, void **copy, const float *src, size_t bytes)
{
    pt_stage_executor *ex = stage;
    PT_TRY(pt_staging_alloc(ex, copy, bytes, "a validation batch on its way"));
    pt_staging_copy_out(ex, *copy, src, bytes);
    return PIPERT_OK;
}

static void port_release_copy(void *stage, void *copy) { pt_staging_release(stage, copy); }

static pipert_result port_post(void *stage, long id, const float *copy, pt_request **request)
{
    pt_stage_executor *ex = stage;
    return send_tensor(ex, ex->options.next_rank, PT_KIND_ACTIVATION, TAG_EVAL_WAVE, id, copy,
                       NULL, NULL, request);
}

static pipert_result port_complete(void *stage, pt_request **request)
{
    return complete_send(stage, request);
}

static void port_trace_span(void *stage, const char *category, double started_us, long id)
{
    trace_span(stage, category, started_us, id);
}

static pt_validation_port validation_port(pt_stage_executor *ex)
{
    return (pt_validation_port){.stage = ex,
                                .stage_index = ex->options.stage,
                                .stages = ex->options.stages,
                                .model = ex->model,
                                .val_batches = ex->config.train.val_batches,
                                .load_batch = port_load_batch,
                                .eval_params = port_eval_params,
                                .receive = port_receive,
                                .send = port_send,
                                .copy_output = port_copy_output,
                                .release_copy = port_release_copy,
                                .post = port_post,
                                .complete = port_complete,
                                .trace_span = port_trace_span};
}

pipert_result pt_stage_executor_validate(pt_stage_executor *ex, float *val_loss)
{
    const pt_validation_port port = validation_port(ex);
    return pt_validate_drained(&port, val_loss);
}

bool pt_stage_executor_take_validation(pt_stage_executor *ex, long *step, float *val_loss)
{
    return pt_eval_waves_take(&ex->waves, step, val_loss);
}
