/* dp.method=diloco: DiLoCo's outer step (ALGORITHMS.md §4.3).
 *
 * Every H = dp.period inner steps each replica posts its pseudo-gradient
 * Δ_r = θ̃ − θ_r; their mean Δ = θ̃ − mean_r θ_r (outer minus the local
 * average: a descent direction) takes one step of outer Nesterov SGD, as
 * PyTorch's SGD(nesterov=True):
 *   v ← μ·v + Δ;   θ̃ ← θ̃ − η·(Δ + μ·v)        η = dp.outer_lr, μ = dp.outer_momentum
 * (its own, unless set: η = 1.0, μ = 0.5, measured best over two corpora and two seeds, where
 * the paper's 0.7 and 0.9 were 1.6–2.9% behind allreduce: BENCHMARKS.md "Defaults")
 * and every replica restarts from θ̃ (θ and the newest weight stash). The
 * exchange is waited for at once: the replicas meet every H steps. Inner
 * optimizer states stay local; validation evaluates θ̃. The engine is
 * dp/outer.c, shared with streaming-diloco and co2. */
#include "dp/methods.h"
#include "dp/outer.h"

#define DILOCO_OUTER_LR 1.0
#define DILOCO_OUTER_MOMENTUM 0.5

static pt_outer_plan diloco_plan(const pipert_config *config)
{
    const pt_dp_settings *dp = &config->dp;
    return (pt_outer_plan){
        .method = "diloco",
        .rule = pt_outer_rule_of(dp, DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM, true),
        .period = dp->period,
        .block_fragments = 1,
        .delay = 0,
        .alpha = 0,
        .penalty = 1,
        .evaluate_outer = true,
    };
}

static pipert_result diloco_create(const pt_coupling_options *options, void **state)
{
    const pt_outer_plan plan = diloco_plan(options->config);
    return pt_outer_create(options, &plan, state);
}

static void diloco_traffic(const pipert_config *config, pt_coupling_traffic *out)
{
    const pt_outer_plan plan = diloco_plan(config);
    pt_outer_traffic(&plan, out);
}

const pt_coupling_method pt_dp_diloco = {
    .name = "diloco",
    .create = diloco_create,
    .traffic = diloco_traffic,
    PT_OUTER_CALLS,
};
