#include "scheduler/cost.h"

#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "runtime/error.h"

static bool is_async(const pipert_config *config)
{
    return !strcmp(config->pipeline.schedule, "async-1f1b");
}

/* The asynchronous schedule with a look-ahead that stashes the weights each forward used
 * (every one but `none`, docs/STALENESS.md). */
static bool stashes(const pipert_config *config)
{
    return is_async(config) && strcmp(config->pipeline.lookahead, "none") != 0;
}

/* Extra weight copies stage s keeps (cost.h, "versions"): a stash slot per microbatch in
 * flight, S−s of them, where more than one is (the last stage keeps none); predict-damped
 * one more, the weights before a step to measure its size; nesterov-secant four more on a
 * stage that stashes (train/secant.h: the previous gradient and stash, two running means). */
static int weight_versions(const pipert_config *config, int stages, int stage)
{
    if (!stashes(config)) return 0;
    const int slots = stages - stage > 1 ? stages - stage : 0;
    const char *lookahead = config->pipeline.lookahead;
    return slots + !strcmp(lookahead, "predict-damped") +
           (slots && !strcmp(lookahead, "nesterov-secant") ? 4 : 0);
}

/* The method's own copies of the parameters (cost.h, "coupling"). */
static int coupling_copies(const pipert_config *config)
{
    const char *method = config->dp.method;
    if (!strcmp(method, "allreduce") || !strcmp(method, "none")) return 0;
    const bool outer = strcmp(method, "sparse") != 0;
    /* a GPU's: both copies are in host memory, and only the outer methods keep one of θ̃
     * on the device, for validation (dp/outer.c) */
    if (!strcmp(config->runtime.device, "cuda")) return outer ? 1 : 0;
    return 2;
}

static pt_gpt_config model_of(const pipert_config *config)
{
    const pt_model_settings *m = &config->model;
    return (pt_gpt_config){m->n_layer, m->n_embd, m->n_head, m->block_size, m->vocab_size,
                           m->tie_weights};
}

pipert_result pt_cost_stage(const pipert_config *config, const pt_stage_plan *plan, int stage,
                            const pt_cost_device *device, pt_stage_cost *out)
{
    *out = (pt_stage_cost){0};
    if (stage < 0 || stage >= plan->stages)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "cost: stage %d of %d", stage, plan->stages);
    if (!(device->flops > 0) || !(device->efficiency > 0) || device->efficiency > 1 ||
        !(device->memory_bytes_per_s > 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "cost: stage %d's device: FLOP/s %g, efficiency %g, memory bandwidth %g B/s "
                       "(each must be positive, the efficiency at most 1)",
                       stage, device->flops, device->efficiency, device->memory_bytes_per_s);
    const pt_gpt_config model = model_of(config);
    const int B = config->train.batch_size, T = config->model.block_size;
    out->first = plan->bounds[stage];
    out->last = plan->bounds[stage + 1];
    out->flops = pt_plan_stage_flops(&model, T, out->first, out->last) * B * T;
    const double rate = device->flops * device->efficiency;
    out->time.forward_s = out->flops / 3 / rate;
    out->time.backward_s = 2 * out->flops / 3 / rate;
    if (config->pipeline.recompute) out->time.backward_s += out->time.forward_s;

    size_t params, acts, grad_acts;
    pt_gpt_slice_sizes(&model, out->first, out->last, B, T,
                       pt_kernels_attention_sizer(config->runtime.device), &params, &acts,
                       &grad_acts);
    if (!params)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "cost: stage %d (blocks [%d, %d)) is not a valid "
                       "slice of the model: %s", stage, out->first, out->last, pipert_last_error());
    out->params = (double)params;
    out->time.optimizer_s = out->params * OPTIMIZER_BYTES_PER_PARAM / device->memory_bytes_per_s;
    const int copies = weight_versions(config, plan->stages, stage) + coupling_copies(config);
    out->bytes_fixed = 4.0 * out->params * (4 + copies);
    out->bytes_activations = 4.0 * (double)acts;
    out->bytes_activation_grads = 4.0 * (double)grad_acts;
    out->bytes_message = 4.0 * B * T * config->model.n_embd;
    return PIPERT_OK;
}

int pt_cost_in_flight(const pipert_config *config, int S, int s)
{
    const int M = config->pipeline.microbatches;
    if (S == 1) return 1;
    if (!strcmp(config->pipeline.schedule, "gpipe")) return M;
    if (!strcmp(config->pipeline.schedule, "1f1b")) return S - s < M ? S - s : M;
    return S - s;
}

double pt_cost_stage_memory(const pt_stage_cost *cost, int in_flight)
{
    return cost->bytes_fixed + cost->bytes_activations * (in_flight > 1 ? in_flight : 1) +
           cost->bytes_activation_grads;
}

double pt_cost_codec_bits(const pipert_config *config)
{
    const char *codec = config->dp.compress;
    const double scale = config->dp.block > 0 ? 32.0 / config->dp.block : 0;
    if (!strcmp(codec, "int8")) return 8 + scale;
    if (!strcmp(codec, "e3m0") || !strcmp(codec, "e2m1")) return 4 + scale;
    if (!strcmp(codec, "onebit")) return 1 + scale;
    return 32;
}

/* dp.fragments as streaming-diloco reads it (dp/streaming_diloco.c), and
 * its slots: the block fragments plus one for the embeddings and head. */
static int streaming_slots(const pipert_config *config)
{
    int fragments = config->dp.fragments;
    if (fragments <= 0) fragments = (config->model.n_layer + 1) / 3;
    return fragments > 1 ? fragments + 1 : 1;
}

/* Every, lag and the share of the stage each collective carries. */
static pipert_result method_traffic(const pipert_config *config, pt_sim_coupling *out,
                                    double *share)
{
    const pt_dp_settings *dp = &config->dp;
    const char *method = dp->method;
    const int period = dp->period > 0 ? (int)dp->period : 1;
    *share = 1;
    if (!strcmp(method, "allreduce")) {
        out->every = 1, out->lag = 0;
    } else if (!strcmp(method, "sparse")) {
        out->every = 1, out->lag = dp->delay >= 0 ? (int)dp->delay : 16;
        *share = dp->fraction;
    } else if (!strcmp(method, "diloco")) {
        out->every = period, out->lag = 0;
    } else if (!strcmp(method, "streaming-diloco")) {
        const int slots = streaming_slots(config);
        out->every = period / slots > 0 ? period / slots : 1;
        out->lag = dp->overlap;
        *share = 1.0 / slots;
    } else if (!strcmp(method, "co2")) {
        out->every = period, out->lag = period;
    } else if (!strcmp(method, "none")) {
        out->every = 0, out->lag = 0;
    } else {
        return pt_fail(PIPERT_ERR_CONFIG, "cost: dp.method \"%s\" has no cost model", method);
    }
    return PIPERT_OK;
}

pipert_result pt_cost_coupling(const pipert_config *config, const int *members, int stages,
                               const double *params, double *bytes, pt_sim_coupling *out)
{
    double share;
    PT_TRY(method_traffic(config, out, &share));
    out->members = members;
    int most = 1;
    for (int s = 0; s < stages; s++) most = members[s] > most ? members[s] : most;
    out->hops = 2 * (most - 1);
    out->bytes = bytes;
    const double bytes_per_element = pt_cost_codec_bits(config) / 8;
    for (int s = 0; s < stages; s++) {
        const int n = members[s];
        const double ring = n > 1 ? 2.0 * (n - 1) / n : 0;
        bytes[s] = ring * share * params[s] * bytes_per_element;
    }
    return PIPERT_OK;
}

bool pt_cost_coupling_by_sites(const pipert_config *config)
{
    return strcmp(config->dp.method, "allreduce") && strcmp(config->dp.method, "none");
}

double pt_cost_site_coupling_s(const pipert_config *config, int k, double params, pt_sim_link link)
{
    if (k < 2 || !pt_cost_coupling_by_sites(config)) return 0;
    const double bytes = 4 * params;
    const double mean = 2.0 * (k - 1) / k * bytes / link.bytes_per_s + 2 * (k - 1) * link.latency_s;
    const int rounds = (int)ceil(log2(k));
    const bool stash = stashes(config);
    const double broadcast = (stash ? 2 : 1) * rounds * (bytes / link.bytes_per_s + link.latency_s);
    return mean + broadcast;
}

double pt_cost_method_cpu_s(const pipert_config *config, const pt_cost_device *device,
                            double params)
{
    if (strcmp(config->dp.method, "sparse")) return 0;
    return device->sparse_cpu_s_per_element * config->dp.fraction * params;
}
