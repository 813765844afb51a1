/* The staleness-aware rules of the asynchronous pipeline's look-aheads
 * (ALGORITHMS.md §3, docs/STALENESS.md): pure functions of a stage's
 * staleness τ, the step and a warm-up length, so they can be checked against
 * hand-computed values. The executor applies them; the optimizer's kernels do
 * the element-wise work. */
#ifndef PT_STALENESS_H
#define PT_STALENESS_H

/* The warm-up fraction α(t) = min(1, t/K) of step t (K ≤ 0: 1). */
double pt_staleness_warmup_fraction(long step, long warmup);

/* PipeMare's learning-rate rescheduling (Yang et al., MLSys 2021, "T1"): the
 * step size of a stage whose gradients are τ steps stale is
 *   γ_s(t) = γ(t) · τ^−(1 − min(1, t/K))
 * i.e. γ/τ at the start, rising geometrically to γ at step K. τ ≤ 1 (the
 * last stage, or a measured staleness below one step) is left at γ. Returns
 * the factor that multiplies γ(t). */
double pt_pipemare_lr_factor(double tau, long step, long warmup);

/* The damped weight prediction (lookahead = predict-damped): how many steps
 * of the predicted update u to extrapolate for one tensor. Plain `predict`
 * extrapolates τ; this one
 *   - damps it in warm-up by α(t) = min(1, t/K), and
 *   - bounds the predicted displacement per step, ‖γu‖ = predicted_step_norm,
 *     by the root mean square of the tensor's recent measured updates,
 *     ‖θ_t − θ_{t−1}‖ ≈ update_rms:
 *   steps = τ · min(α(t), update_rms / predicted_step_norm)
 * so ‖ŵ − θ‖ ≤ τ·update_rms. A zero predicted step gives τ·α(t) (nothing moves
 * anyway); no measured update yet (update_rms = 0) gives 0: ŵ = θ. */
double pt_damped_prediction_steps(double tau, long step, long warmup, double update_rms,
                                  double predicted_step_norm);

/* λ of the delay compensation g + λ·g⊙g⊙(θ_now − θ_used)/(√v̂ + ε) when
 * pipeline.dc_lambda leaves it to the look-ahead: DC-ASGD's paper uses 2 with
 * the adaptive form (dc-asgd); with NAdam β1 = 0.99 (nesterov-dc) the staleness
 * study measured 2, 50, 100, 200 and 1000: 100 is the best or within noise of it on
 * 4 and 8 stages of both corpora, where 200 lost 1.3% on one and 50 spiked
 * (BENCHMARKS.md, sessions 10 and 11). */
#define PT_DC_LAMBDA_PAPER 2.0
#define PT_DC_LAMBDA_NESTEROV 100.0

#endif
