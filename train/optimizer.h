/* The inner optimizers of a stage: AdamW and NAdamW (ALGORITHMS.md §2) around
 * the backend's adam_update kernel, plus the learning-rate schedule and
 * global-norm gradient clipping.
 *
 * The parameters of a stage are one flat buffer; the optimizer keeps its
 * moments m and v in two buffers of the same size, so a tensor has the same
 * offset in all of them. */
#ifndef PT_OPTIMIZER_H
#define PT_OPTIMIZER_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "runtime/settings.h"

/* PyTorch NAdam's momentum_decay; also train.momentum_decay's default (runtime/config_schema.c,
 * which sits below train/ and so repeats the number). */
#define PT_NADAM_PSI 0.004

typedef struct pt_optimizer_settings {
    pt_optimizer_kind kind;
    double beta1, beta2, eps, weight_decay;
    double psi; /* NAdamW momentum decay (train.momentum_decay; PyTorch's PT_NADAM_PSI) */
    /* NAdamW: the fraction of the raw gradient's coefficient moved to the momentum's,
     * in [0, 1); 0 is NAdamW. A stale stage of nesterov-secant uses it (secant.h). */
    double momentum_shift;
} pt_optimizer_settings;

typedef struct pt_optimizer {
    pt_optimizer_settings settings;
    const pt_kernels *kernels;
    size_t n;          /* elements */
    float *m, *v;      /* backend memory, n each, same offsets as the parameters */
    long t;            /* steps taken */
    double mu_product; /* NAdam Π_t, kept in double (Π_0 = 1) */
} pt_optimizer;

/* "adamw" | "nadamw"; anything else is a PIPERT_ERR_CONFIG naming the value. */
pipert_result pt_optimizer_parse_kind(const char *name, pt_optimizer_kind *out);

/* "adamw" | "nadamw" */
const char *pt_optimizer_kind_name(pt_optimizer_kind kind);

/* Checks the settings (β in [0, 1), ε > 0, λ ≥ 0, ψ > 0 for NAdamW) and
 * allocates zeroed moments for n elements with k. On failure *opt is left
 * empty (pt_optimizer_free is then a no-op). */
pipert_result pt_optimizer_init(pt_optimizer *opt, const pt_optimizer_settings *s,
                                const pt_kernels *k, size_t n);

/* Frees the moments; safe on a zeroed or already freed optimizer. */
void pt_optimizer_free(pt_optimizer *opt);

/* t ← t+1, then one update of every region with learning rate lr.
 * params[n], grads[n] in the backend's memory. */
void pt_optimizer_step(pt_optimizer *opt, float *params, const float *grads,
                       const pt_param_region *regions, int n_regions, double lr);
/* The same with the gradient read as grad_scale·grads (pt_clip_scale's factor), the bits a
 * scale of grads before pt_optimizer_step would give, without a pass over them; grads is left
 * as it is. */
void pt_optimizer_step_scaled(pt_optimizer *opt, float *params, const float *grads,
                              const pt_param_region *regions, int n_regions, double lr,
                              float grad_scale);

/* Weight prediction (ALGORITHMS.md §3, lookahead = predict): fills out[n]
 * (same layout as params[n], backend memory; out may be params) with
 *   ŵ = θ − τ·γ·u,   τ = steps (the measured staleness, may be fractional),
 * on every region; elements outside the regions are not written. The
 * optimizer is not changed.
 *
 * u is the update the next step (t+1) is expected to make: step t+1's own
 * coefficients applied to the moments it would hold, with the gradient it has
 * not seen yet replaced by the current estimates of its moments,
 * g ≈ m̂_t = m_t/(1−β1ᵗ) and g² ≈ v̂_t = v_t/(1−β2ᵗ). Then the bias-corrected
 * moments of step t+1 are m̂_t and v̂_t again, so
 *   AdamW:  u = m̂_t/(√v̂_t + ε) + λθ   (λθ on decayed regions only)
 * exactly the "current update direction" of ALGORITHMS.md. (Step t+1's
 * coefficients applied to m_t, v_t as they are would shrink the first
 * predictions, by 0.74 at t = 1 with β = (0.9, 0.95), since m_t/(1−β1^{t+1})
 * is not a bias-corrected moment.)
 *   NAdamW: step t+1 moves by c_grad·g/d + c_mom·m_{t+1}/d (kernels.h, with
 *   μ_{t+1}, μ_{t+2}, Π_{t+1}); the same substitution gives
 *   γu = [c_grad·m̂_t + c_mom·(β1·m_t + (1−β1)·m̂_t)]/(√v̂_t + ε) + γλθ.
 * Both the gradient term and the momentum term are kept, so u has the scale of
 * the step NAdamW actually takes, ≈ m̂/d once Π_t is small (c_grad + c_mom → γ).
 * The momentum term alone would predict only the fraction μ of it, and at
 * ψ = 0.004 μ/β1 rises slowly: ½ at t = 1, 0.58 at 1000, 0.78 at 5000.
 *
 * Before the first step (t = 0, m = v = 0) there is no estimate of the
 * gradient: ŵ = θ·(1 − τγλ) on decayed regions (the decay step 1 will apply
 * in any case), θ elsewhere.
 *
 * lr: the γ of the steps being predicted (normally that of step t+1).
 * Returns PIPERT_ERR_UNSUPPORTED when the backend has no adam_extrapolate
 * kernel (it is optional), PIPERT_ERR_INVALID_ARG when steps is negative or
 * not finite; out is then untouched. */
pipert_result pt_optimizer_predict(const pt_optimizer *opt, float *out, const float *params,
                                   const pt_param_region *regions, int n_regions, double lr,
                                   double steps);

/* The same prediction with a staleness of its own per tensor: steps[i] for
 * regions[i] (lookahead = predict-damped, train/staleness.h). The prediction
 * is linear in the steps, so steps[i] = f·τ moves region i by f times the
 * displacement of τ. Errors as pt_optimizer_predict. */
pipert_result pt_optimizer_predict_each(const pt_optimizer *opt, float *out, const float *params,
                                        const pt_param_region *regions, int n_regions, double lr,
                                        const double *steps);

/* Delay compensation (ALGORITHMS.md §3, lookahead = dc-asgd; Zheng et al.,
 * ICML 2017, DC-ASGD-a): grads[n], computed at the weights `used`, become an
 * estimate of the gradient at the weights `now`,
 *   g ← g + λ·g⊙g⊙(now − used) / (√v̂_t + ε)
 * with v̂_t = v_t/(1−β2ᵗ) the optimizer's bias-corrected mean square of the
 * gradient before this step (the paper's adaptive λ_t = λ/√MeanSquare). Before
 * the first step (t = 0, no mean square yet) nothing is changed. Returns
 * PIPERT_ERR_UNSUPPORTED when the backend has no delay_compensate kernel,
 * PIPERT_ERR_INVALID_ARG for a negative or non-finite λ. */
pipert_result pt_optimizer_delay_compensate(const pt_optimizer *opt, float *grads,
                                            const float *now, const float *used,
                                            const pt_param_region *regions, int n_regions,
                                            double lambda);

/* The coefficients of step t (1-based) for a decayed / non-decayed region,
 * given Π_{t−1} (1 at t = 1; ignored by AdamW); updates nothing. */
pt_adam_coeffs pt_optimizer_coeffs(const pt_optimizer_settings *s, long t, double mu_product_prev,
                                   double lr, int decay);

/* NAdam's momentum coefficient μ_t = β1·(1 − ½·0.96^(t·ψ)). */
double pt_nadam_mu(const pt_optimizer_settings *s, long t);

/* The learning rate of step `step` (1-based): linear warm-up from lr/warmup at
 * step 1 to lr at step `warmup`, then cosine decay to min_ratio·lr at step
 * `total`, and min_ratio·lr after it. warmup = 0: no warm-up. */
double pt_lr_at(long step, long total, double lr, long warmup, double min_ratio);

/* The factor global-norm clipping multiplies a gradient of L2 norm `norm` by: max_norm/norm
 * (rounded to fp32) when norm > max_norm, 1 otherwise. max_norm ≤ 0 disables clipping; a
 * non-finite norm gets 1 (the caller decides what a NaN step means). */
float pt_clip_scale(double norm, double max_norm);

#endif
