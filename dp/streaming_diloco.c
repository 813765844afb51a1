/* dp.method=streaming-diloco: Streaming DiLoCo (ALGORITHMS.md §4.4).
 *
 * The parameters are cut into fragments by stride: block l belongs to
 * fragment l mod P (P = dp.fragments; 0 = about 3 blocks each, P = round(L/3)),
 * and the embeddings (wte, wpe), the final norm and the head form one more —
 * those of them this stage holds. With P = 1 there is a single fragment of
 * everything. Fragment p posts its pseudo-gradient θ̃_p − θ_p every H =
 * dp.period steps, at the steps t ≡ p·⌊H/(P+1)⌋ (mod H): the schedule is a
 * function of the optimizer step every replica agrees on. Its reduce starts
 * at once and runs while training continues; τ = dp.overlap steps later the
 * mean takes an outer Nesterov step on θ̃_p (as diloco) and the replica
 * merges θ_p ← α·θ_p + (1−α)·θ̃_p (α = dp.alpha: 1 keeps the local
 * parameters, 0 takes the outer ones and discards the τ overlapped steps).
 * Exactly one fragment is in flight: τ may not exceed the ⌊H/(P+1)⌋ steps
 * between two fragments. Validation evaluates θ̃. */
#include "dp/methods.h"
#include "dp/outer.h"

/* dp.fragments = 0: about three blocks per fragment. */
static int block_fragments(const pipert_config *config)
{
    if (config->dp.fragments > 0) return config->dp.fragments;
    const int P = (config->model.n_layer + 1) / 3;
    return P > 1 ? P : 1;
}

/* Its own η and μ unless set: DiLoCo's published values (one seed favoured η = 1.0 by less
 * than the seeds' spread: BENCHMARKS.md "Defaults"). */
#define STREAMING_OUTER_LR 0.7
#define STREAMING_OUTER_MOMENTUM 0.9

static pt_outer_plan streaming_diloco_plan(const pipert_config *config)
{
    const pt_dp_settings *dp = &config->dp;
    return (pt_outer_plan){
        .method = "streaming-diloco",
        .rule = pt_outer_rule_of(dp, STREAMING_OUTER_LR, STREAMING_OUTER_MOMENTUM, true),
        .period = dp->period,
        .block_fragments = block_fragments(config),
        .delay = dp->overlap,
        .alpha = dp->alpha,
        .penalty = 1,
        .evaluate_outer = true,
    };
}

static pipert_result streaming_diloco_create(const pt_coupling_options *options, void **state)
{
    const pt_outer_plan plan = streaming_diloco_plan(options->config);
    return pt_outer_create(options, &plan, state);
}

static void streaming_diloco_traffic(const pipert_config *config, pt_coupling_traffic *out)
{
    const pt_outer_plan plan = streaming_diloco_plan(config);
    pt_outer_traffic(&plan, out);
}

const pt_coupling_method pt_dp_streaming_diloco = {
    .name = "streaming-diloco",
    .create = streaming_diloco_create,
    .traffic = streaming_diloco_traffic,
    PT_OUTER_CALLS,
};
