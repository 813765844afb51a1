/* Staleness-aware rules (staleness.h). */
#include "train/staleness.h"

#include <math.h>

double pt_staleness_warmup_fraction(long step, long warmup)
{
    if (warmup <= 0 || step >= warmup) return 1.0;
    return step <= 0 ? 0.0 : (double)step / (double)warmup;
}

double pt_pipemare_lr_factor(double tau, long step, long warmup)
{
    if (!(tau > 1.0)) return 1.0;
    const double exponent = 1.0 - pt_staleness_warmup_fraction(step, warmup);
    return pow(tau, -exponent);
}

double pt_damped_prediction_steps(double tau, long step, long warmup, double update_rms,
                                  double predicted_step_norm)
{
    const double alpha = pt_staleness_warmup_fraction(step, warmup);
    if (!(predicted_step_norm > 0)) return tau * alpha;
    const double bound = update_rms / predicted_step_norm;
    return tau * (alpha < bound ? alpha : bound);
}
