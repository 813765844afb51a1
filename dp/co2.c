/* dp.method=co2: CO2, local updating with a one-round-stale outer step
 * (ALGORITHMS.md §4.5).
 *
 * Rounds of H = dp.period inner steps. At the end of round t each replica
 * posts θ̃ − θ_r; the mean all-reduce runs during the inner steps of round
 * t+1, and at the end of round t+1 it gives θ̃ − θ̄_stale:
 *   m ← β·m + (θ̃ − θ̄_stale)/Λ
 *   m ← clamp(m, −φ, φ)          element-wise, applied for real (the
 *                                authors' code discards torch.clamp's result)
 *   θ̃ ← θ̃ − η_out·m;  every replica continues from θ̃ (θ and the newest stash)
 * β = dp.outer_momentum, φ = dp.clip, η_out = dp.outer_lr. Then the round
 * that just ended posts (from the new θ̃, so at the next round's end θ̃ is
 * still the θ̃ it was measured from). The first round has nothing to apply:
 * the replicas go on from their own parameters until the second round ends.
 *
 * Λ (the staleness gap penalty): dp.penalty=constant uses dp.penalty_value.
 * dp.penalty=adaptive measures it each round, per stage: the stale
 * pseudo-gradient is the round's own progress (fresh, from where that round
 * started) plus the gap θ̃ moved meanwhile, which is the last outer step,
 * gap = −η_out·m; Λ = 1 + ‖gap‖/‖fresh‖. It is 1 when θ̃ did not move and 2
 * when θ̃ moved as far as the round itself did. This is our formula, not the
 * paper's Eq. 3 (Sun et al., arXiv 2401.16265), which predicts the gap from
 * the inner learning-rate schedule; this one measures it.
 *
 * Validation evaluates the replica's own θ, as the authors do; it equals θ̃
 * at the end of every round after the first. */
#include <string.h>

#include "dp/methods.h"
#include "dp/outer.h"

/* Its own η and β unless set: DiLoCo's 0.7 and 0.9 (not measured here against the authors'
 * 1.0 and 0.5), heavy ball, clipped at φ = dp.clip. */
#define CO2_OUTER_LR 0.7
#define CO2_OUTER_MOMENTUM 0.9

static pt_outer_rule co2_rule(const pt_dp_settings *dp)
{
    pt_outer_rule rule = pt_outer_rule_of(dp, CO2_OUTER_LR, CO2_OUTER_MOMENTUM, false);
    rule.clip = dp->clip;
    return rule;
}

/* CO2's plan; `adaptive`: dp.penalty=adaptive (Λ measured each round). */
static pt_outer_plan co2_plan(const pipert_config *config, bool adaptive)
{
    const pt_dp_settings *dp = &config->dp;
    return (pt_outer_plan){
        .method = "co2",
        .rule = co2_rule(dp),
        .period = dp->period,
        .block_fragments = 1,
        .delay = dp->period,
        .alpha = 0,
        .penalty = adaptive ? 0 : dp->penalty_value,
        .evaluate_outer = false,
    };
}

static pipert_result co2_create(const pt_coupling_options *options, void **state)
{
    const bool adaptive = options->config->dp.penalty == PT_PENALTY_ADAPTIVE;
    const pt_outer_plan plan = co2_plan(options->config, adaptive);
    return pt_outer_create(options, &plan, state);
}

static void co2_traffic(const pipert_config *config, pt_coupling_traffic *out)
{
    const pt_outer_plan plan = co2_plan(config, false); /* Λ does not change what is sent */
    pt_outer_traffic(&plan, out);
}

const pt_coupling_method pt_dp_co2 = {
    .name = "co2",
    .create = co2_create,
    .traffic = co2_traffic,
    PT_OUTER_CALLS,
};
