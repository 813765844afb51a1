/* One Adam-family step over a flat buffer; the coefficients (AdamW or NAdamW,
 * bias corrections, learning rate) are folded by the caller into
 * pt_adam_coeffs (see kernels.h and train/optimizer.c).
 *
 * Naive reading, per element, g = grad_scale·grad:
 *   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  d = √(v/bias2) + ε
 *   θ ← θ·decay − c_grad·g/d − c_mom·m/d
 *
 * And the weight prediction of lookahead = predict, with the same
 * coefficients, the moments only read and no gradient:
 *   out = θ·(1 − steps·(1 − decay)) − steps·c_mom·m/d
 *
 * And the delay compensation of lookahead = dc-asgd, v only read:
 *   g ← g + λ·g·g·(now − used)/d
 *
 * And nesterov-secant's, whose curvature is a running secant per element:
 *   κ = clamp(mean(Δg·Δw)/mean(Δw²), 0, cap·d);  g ← g + s·κ·(now − used)
 */
#include <math.h>

#include "kernels/cpu/cpu.h"

static void adam_update_span(float *param, const float *grad, float *m, float *v, size_t n,
                             const pt_adam_coeffs *coeffs, float grad_scale)
{
    /* param[n], grad[n], m[n], v[n] */
    const pt_adam_coeffs c = *coeffs;
    const float inv_bias2 = 1.0f / c.bias2;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
        float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
        float d = sqrtf(vi * inv_bias2) + c.eps;
        param[i] = param[i] * c.decay - (c.c_grad * g + c.c_mom * mi) / d;
        m[i] = mi;
        v[i] = vi;
    }
}

void pt_cpu_adam_update(float *param, const float *grad, float *m, float *v,
                        const pt_param_region *regions, int n_regions,
                        const pt_adam_coeffs *decayed, const pt_adam_coeffs *plain,
                        float grad_scale)
{
    for (int i = 0; i < n_regions; i++) {
        const pt_param_region *r = &regions[i];
        adam_update_span(param + r->offset, grad + r->offset, m + r->offset, v + r->offset,
                         r->numel, r->decay ? decayed : plain, grad_scale);
    }
}

void pt_cpu_adam_extrapolate(float *out, const float *param, const float *m, const float *v,
                             size_t n, const pt_adam_coeffs *coeffs, float steps)
{
    /* out[n], param[n], m[n], v[n] */
    const pt_adam_coeffs c = *coeffs;
    const float inv_bias2 = 1.0f / c.bias2;
    /* 1 − decay is exact in float (Sterbenz, decay ∈ [½, 1]), so the decay
     * per step is the one adam_update applies. The correction is summed
     * before it is subtracted from θ, so steps = 0 returns θ unchanged and a
     * small step is rounded relative to itself rather than to θ. */
    const float shrink = steps * (1.0f - c.decay);
    const float push = steps * c.c_mom;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = sqrtf(v[i] * inv_bias2) + c.eps;
        out[i] = param[i] - (shrink * param[i] + push * m[i] / d);
    }
}

void pt_cpu_delay_compensate(float *grad, const float *now, const float *used, const float *v,
                             size_t n, const pt_adam_coeffs *coeffs, float lambda)
{
    /* grad[n], now[n], used[n], v[n] */
    const float inv_bias2 = 1.0f / coeffs->bias2, eps = coeffs->eps;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float d = sqrtf(v[i] * inv_bias2) + eps;
        grad[i] = g + lambda * g * g * (now[i] - used[i]) / d;
    }
}

void pt_cpu_secant_compensate(float *grad, const float *now, const float *used, float *prev_grad,
                              float *prev_used, float *num, float *den, const float *v, size_t n,
                              const pt_secant_coeffs *coeffs)
{
    /* grad[n], now[n], used[n], prev_grad[n], prev_used[n], num[n], den[n], v[n] */
    const pt_secant_coeffs c = *coeffs;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i], w = used[i];
        if (c.learn) {
            float dw = w - prev_used[i], dg = g - prev_grad[i];
            num[i] = c.beta * num[i] + (1.0f - c.beta) * dg * dw;
            den[i] = c.beta * den[i] + (1.0f - c.beta) * dw * dw;
        }
        prev_grad[i] = g;
        prev_used[i] = w;
        if (c.apply && den[i] > 0.0f) {
            float cap = c.cap * (sqrtf(v[i] * c.inv_bias2) + c.eps);
            float kappa = fminf(fmaxf(num[i] / den[i], 0.0f), cap);
            grad[i] = g + c.scale * kappa * (now[i] - w);
        }
    }
}
