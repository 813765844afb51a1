#include "scheduler/cost.h"

#include <math.h>

#include "dp/codec.h"
#include "dp/coupling.h"
#include "kernels/kernels.h"
#include "pipeline/lookahead.h"
#include "pipeline/schedule.h"
#include "pipeline/transfer.h"
#include "pipeline/validation.h"
#include "runtime/error.h"

/* Every fact the model uses about a schedule, a look-ahead or a dp method is theirs (their
 * tables: pipeline/schedule.c, pipeline/lookahead.c, dp/coupling.c); nothing here knows a
 * name: the configuration holds each as the number of its row (runtime/settings.h), a method a
 * program added (pt_coupling_add_method) included. */

static bool is_async(const pipert_config *config)
{
    return config->pipeline.schedule == PT_SCHEDULE_ASYNC_1F1B;
}

/* The asynchronous schedule's look-ahead, or NULL under a flush schedule (which keeps one
 * version of the weights whatever pipeline.lookahead says). */
static const pt_lookahead_traits *async_lookahead(const pipert_config *config)
{
    return is_async(config) ? pt_lookahead_traits_of(config->pipeline.lookahead) : NULL;
}

/* The asynchronous schedule with a look-ahead that stashes the weights each forward used. */
static bool stashes(const pipert_config *config)
{
    const pt_lookahead_traits *lookahead = async_lookahead(config);
    return lookahead && lookahead->stashes;
}

/* Extra weight copies stage s keeps (cost.h, "versions"): a stash slot per microbatch in
 * flight, S−s of them, where more than one is (the last stage keeps none), and what the
 * look-ahead keeps beyond its stash. */
static int weight_versions(const pipert_config *config, int stages, int stage)
{
    if (!stashes(config)) return 0;
    const pt_lookahead_traits *lookahead = async_lookahead(config);
    const int slots = stages - stage > 1 ? stages - stage : 0;
    return slots + lookahead->extra_versions + (slots ? lookahead->extra_versions_when_stashing : 0);
}

/* What a stage's exchanges with its neighbours take (pipeline/executor.c, transfer.c): a
 * microbatch's activations on the link, in fp32 or bf16; with recompute, each microbatch in
 * flight keeps its input and its output being sent (fp32, or the bf16 copy sent); in bf16
 * without recompute, that copy; in bf16, one buffer for the gradient sent, one a receive
 * lands in. */
static void stage_transfers(const pipert_config *config, int stages, int stage, double rows,
                            pt_stage_cost *out)
{
    const double C = config->model.n_embd, value = (double)pt_transfer_value_bytes(config);
    const bool first = stage == 0, last = stage == stages - 1;
    const bool rounded = stages > 1 && pt_transfer_in_bf16(config);
    out->bytes_message = value * rows * C;
    const double sent_copy = last ? 0 : rounded ? 2.0 * rows * C : 4.0 * rows * C;
    if (config->pipeline.recompute) /* the input (tokens first), the output (targets last) */
        out->bytes_recompute_stash =
            4.0 * (first ? rows : rows * C) + (last ? 4.0 * rows : sent_copy);
    else if (rounded)
        out->bytes_rounded_send = sent_copy;
    if (rounded) out->bytes_transfer = 2.0 * rows * C * (first ? 1 : 2);
}

/* The method's own copies of the parameters, in floats per element (cost.h, "coupling"): on a
 * GPU only what it keeps in the device's memory counts. */
static double coupling_copies(const pipert_config *config, const pt_coupling_method *method)
{
    const pt_device_traits *device = pt_device_traits_of(config->runtime.device);
    if (!device || !device->memory_apart) return method->param_copies;
    return method->device_param_copies + (method->device_share ? method->device_share(config) : 0);
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
    const pt_coupling_method *method = pt_coupling_method_of(config->dp.method);
    if (!method) return PIPERT_ERR_CONFIG;
    const pt_gpt_config model = pt_gpt_config_from_settings(config);
    const int B = config->train.batch_size, T = config->model.block_size;
    out->first = plan->bounds[stage];
    out->last = plan->bounds[stage + 1];
    const double tokens = (double)B * T;
    out->flops = pt_plan_stage_flops(&model, T, out->first, out->last) * tokens;
    /* the classifier's product, forward and backward, all in the forward (models/gpt.h) */
    const double classifier =
        out->last == model.n_layer ? 6.0 * model.vocab_size * model.n_embd * tokens : 0;
    const double trunk = out->flops - classifier;
    const double rate = device->flops * device->efficiency;
    out->time.forward_s = (trunk / 3 + classifier) / rate;
    out->time.backward_s = 2 * trunk / 3 / rate;
    /* recomputed: the forward again, but for the classifier weight's gradient */
    if (config->pipeline.recompute) out->time.backward_s += (trunk / 3 + 2 * classifier / 3) / rate;

    size_t params, acts, grad_acts;
    pt_gpt_slice_sizes(&model, out->first, out->last, B, T,
                       pt_kernels_attention_sizer(config->runtime.device), &params, &acts,
                       &grad_acts);
    if (!params)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "cost: stage %d (blocks [%d, %d)) is not a valid "
                       "slice of the model: %s", stage, out->first, out->last, pipert_last_error());
    out->params = (double)params;
    out->time.optimizer_s = out->params * OPTIMIZER_BYTES_PER_PARAM / device->memory_bytes_per_s;
    const double copies =
        weight_versions(config, plan->stages, stage) + coupling_copies(config, method);
    out->bytes_fixed = 4.0 * out->params * (4 + copies);
    out->bytes_activations = 4.0 * (double)acts;
    out->bytes_activation_grads = 4.0 * (double)grad_acts;
    stage_transfers(config, plan->stages, stage, B * T, out);
    out->validation_sets = pt_eval_waves_wanted(is_async(config), plan->stages,
                                                config->train.val_every, config->train.steps);
    return PIPERT_OK;
}

int pt_cost_in_flight(const pipert_config *config, int S, int s)
{
    const pt_schedule_kind kind = config->pipeline.schedule;
    const long M = kind == PT_SCHEDULE_ASYNC_1F1B ? config->train.steps
                                                  : config->pipeline.microbatches;
    return pt_schedule_in_flight(kind, S, s, M);
}

double pt_cost_stage_memory(const pt_stage_cost *cost, int in_flight)
{
    const int microbatches = in_flight > 1 ? in_flight : 1;
    const bool recomputed = cost->bytes_recompute_stash > 0;
    const int sets = (recomputed ? 1 : microbatches) + cost->validation_sets;
    return cost->bytes_fixed + cost->bytes_activations * sets +
           (cost->bytes_recompute_stash + cost->bytes_rounded_send) * microbatches +
           cost->bytes_activation_grads + cost->bytes_transfer;
}

double pt_cost_codec_bits(const pipert_config *config)
{
    pt_codec codec;
    const size_t block = config->dp.block > 0 ? (size_t)config->dp.block : 1;
    if (pt_codec_init(&codec, config->dp.compress, block) != PIPERT_OK) {
        pt_error_clear(); /* validated; an estimate of what fp32 sends */
        return 32;
    }
    return pt_codec_bits_per_element(&codec);
}

pipert_result pt_cost_coupling(const pipert_config *config, const int *members, int stages,
                               const double *params, double *bytes, pt_sim_coupling *out)
{
    const pt_coupling_method *method = pt_coupling_method_of(config->dp.method);
    if (!method) return PIPERT_ERR_CONFIG;
    pt_coupling_traffic traffic = {.every = 0, .lag = 0, .share = 1};
    if (method->traffic) method->traffic(config, &traffic);
    out->every = traffic.every;
    out->lag = traffic.lag;
    const double share = traffic.share;
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
    const pt_coupling_method *method = pt_coupling_method_of(config->dp.method);
    if (!method) pt_error_clear(); /* pt_cost_coupling names it */
    return method && !method->over_all_replicas;
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
    const pt_coupling_method *method = pt_coupling_method_of(config->dp.method);
    if (!method) pt_error_clear(); /* pt_cost_coupling names it */
    if (!method || !method->host_share) return 0;
    return device->sparse_cpu_s_per_element * method->host_share(config) * params;
}
