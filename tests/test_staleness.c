/* The update rules of the staleness-aware look-aheads (train/staleness.h,
 * docs/STALENESS.md) against values computed by hand: PipeMare's per-stage
 * step size, the damped prediction's number of steps, the measured update
 * size, the per-tensor prediction, DC-ASGD's delay compensation and the
 * secant compensation of nesterov-secant. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "train/optimizer.h"
#include "train/secant.h"
#include "train/staleness.h"
#include "train/update_size.h"

/* ---- PipeMare: γ_s(t) = γ(t)·τ^−(1 − min(1, t/K)) ---------------------------- */

Test(pipemare, starts_at_one_over_tau_and_rises_to_one_at_K)
{
    /* τ = 4, K = 100: t = 0 → 4^−1 = 0.25; t = 50 → 4^−0.5 = 0.5; t = 75 → 4^−0.25 =
     * 1/√2; t ≥ 100 → 1 */
    cr_expect_float_eq(pt_pipemare_lr_factor(4, 0, 100), 0.25, 1e-12);
    cr_expect_float_eq(pt_pipemare_lr_factor(4, 50, 100), 0.5, 1e-12);
    cr_expect_float_eq(pt_pipemare_lr_factor(4, 75, 100), 0.7071067811865476, 1e-12);
    cr_expect_float_eq(pt_pipemare_lr_factor(4, 100, 100), 1.0, 1e-12);
    cr_expect_float_eq(pt_pipemare_lr_factor(4, 5000, 100), 1.0, 1e-12);
    /* τ = 3, t = 10 of K = 40: 3^−0.75 = 0.43869... */
    cr_expect_float_eq(pt_pipemare_lr_factor(3, 10, 40), 0.4386913376508308, 1e-12);
}

Test(pipemare, leaves_fresh_stages_and_no_warmup_alone)
{
    cr_expect_eq(pt_pipemare_lr_factor(0, 0, 100), 1.0, "the last stage is not stale");
    cr_expect_eq(pt_pipemare_lr_factor(1, 0, 100), 1.0, "1^x = 1");
    cr_expect_eq(pt_pipemare_lr_factor(0.5, 3, 100), 1.0, "below one step: no rescaling");
    cr_expect_eq(pt_pipemare_lr_factor(3, 1, 0), 1.0, "K = 0: no warm-up");
}

/* ---- predict-damped: steps = τ·min(min(1, t/K), rms/‖γu‖) --------------------- */

Test(damped_prediction, damps_in_warmup)
{
    /* τ = 3, t = 16 of K = 64: α = 0.25; the bound (1.0/0.5 = 2) does not bite: 0.75 */
    cr_expect_float_eq(pt_damped_prediction_steps(3, 16, 64, 1.0, 0.5), 0.75, 1e-12);
    /* after the warm-up α = 1: the whole τ */
    cr_expect_float_eq(pt_damped_prediction_steps(3, 64, 64, 1.0, 0.5), 3.0, 1e-12);
    cr_expect_float_eq(pt_damped_prediction_steps(3, 0, 64, 1.0, 0.5), 0.0, 1e-12);
}

Test(damped_prediction, bounds_by_the_measured_update)
{
    /* predicted step 0.4, measured RMS 0.1: at most τ·0.1 of displacement, i.e.
     * τ·0.25 steps: 2 × 0.25 = 0.5 */
    cr_expect_float_eq(pt_damped_prediction_steps(2, 500, 64, 0.1, 0.4), 0.5, 1e-12);
    /* both: α = 0.5 against the bound 0.25: the bound */
    cr_expect_float_eq(pt_damped_prediction_steps(2, 32, 64, 0.1, 0.4), 0.5, 1e-12);
    /* α = 0.125 against the bound 0.25: α */
    cr_expect_float_eq(pt_damped_prediction_steps(2, 8, 64, 0.1, 0.4), 0.25, 1e-12);
    /* nothing measured yet: no prediction */
    cr_expect_eq(pt_damped_prediction_steps(3, 500, 64, 0.0, 0.4), 0.0);
    /* no predicted motion: τ·α, harmless */
    cr_expect_float_eq(pt_damped_prediction_steps(3, 32, 64, 0.1, 0.0), 1.5, 1e-12);
}

/* ---- the measured update size -------------------------------------------------- */

static const pt_param_region two_regions[] = {{0, 2, 1}, {2, 2, 0}};

Test(update_size, running_mean_square_of_the_update_norm_per_tensor)
{
    pt_update_size u;
    cr_assert_eq(pt_update_size_init(&u, pt_kernels_cpu(), 4, 2), PIPERT_OK);
    float theta[4] = {1, 1, 1, 1};
    cr_expect_eq(pt_update_size_rms(&u, 0), 0.0);
    /* step 1: Δ = (3, 4 | 0, 1): norms 5 and 1; the first measurement sets the mean */
    pt_update_size_before_step(&u, theta);
    theta[0] += 3, theta[1] += 4, theta[3] -= 1;
    pt_update_size_after_step(&u, theta, two_regions);
    cr_expect_float_eq(pt_update_size_rms(&u, 0), 5.0, 1e-6);
    cr_expect_float_eq(pt_update_size_rms(&u, 1), 1.0, 1e-6);
    /* step 2: Δ = (0, 0 | 2, 0): 0.9·25 + 0.1·0 = 22.5; 0.9·1 + 0.1·4 = 1.3 */
    pt_update_size_before_step(&u, theta);
    theta[2] += 2;
    pt_update_size_after_step(&u, theta, two_regions);
    cr_expect_float_eq(pt_update_size_rms(&u, 0), sqrt(22.5), 1e-6);
    cr_expect_float_eq(pt_update_size_rms(&u, 1), sqrt(1.3), 1e-6);
    cr_expect_eq(u.measured, 2);
    pt_update_size_free(&u);
}

/* ---- the per-tensor prediction ------------------------------------------------- */

/* One AdamW step by hand: β = (0.5, 0.5), ε = 0 (on the test's scale), λ = 0.1,
 * γ = 0.1, θ = 1, g = (1, −2 | 4, 0.5). After it m = g/2, v = g²/2, so m̂ = g,
 * v̂ = g² and u = m̂/√v̂ = sign(g), plus λθ on the decayed region. The
 * prediction of τ steps is ŵ = θ' − τ·γ·(sign(g) + λθ') with θ' the weights
 * after the step. */
Test(predict_each, each_tensor_its_own_steps)
{
    const pt_optimizer_settings s = {.kind = PT_OPTIMIZER_ADAMW, .beta1 = 0.5, .beta2 = 0.5,
                                     .eps = 1e-12, .weight_decay = 0.1, .psi = PT_NADAM_PSI};
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 4), PIPERT_OK);
    float theta[4] = {1, 1, 1, 1}, grads[4] = {1, -2, 4, 0.5f}, out[4];
    pt_optimizer_step(&opt, theta, grads, two_regions, 2, 0.1);
    /* the step: decayed θ' = 1·(1 − 0.01) − 0.1·sign(g); plain θ' = 1 − 0.1·sign(g) */
    const float after[4] = {0.89f, 1.09f, 0.9f, 0.9f};
    for (int i = 0; i < 4; i++) cr_expect_float_eq(theta[i], after[i], 1e-6, "θ'[%d]", i);
    const double steps[2] = {2.0, 0.5};
    cr_assert_eq(pt_optimizer_predict_each(&opt, out, theta, two_regions, 2, 0.1, steps), PIPERT_OK);
    /* region 0, τ = 2: θ' − 2·0.1·(sign g + 0.1·θ') */
    cr_expect_float_eq(out[0], 0.89 - 0.2 * (1 + 0.089), 1e-6);
    cr_expect_float_eq(out[1], 1.09 - 0.2 * (-1 + 0.109), 1e-6);
    /* region 1, τ = 0.5, no decay: θ' − 0.05·sign g */
    cr_expect_float_eq(out[2], 0.9 - 0.05, 1e-6);
    cr_expect_float_eq(out[3], 0.9 - 0.05, 1e-6);
    const double negative[2] = {1.0, -1.0};
    cr_expect_eq(pt_optimizer_predict_each(&opt, out, theta, two_regions, 2, 0.1, negative),
                 PIPERT_ERR_INVALID_ARG);
    pt_optimizer_free(&opt);
}

/* ---- DC-ASGD: g + λ·g⊙g⊙(now − used)/(√v̂ + ε) ---------------------------------- */

/* An AdamW optimizer of 4 parameters with β2 = 0.5, before its first step: one step with
 * g = FIRST_GRADIENT leaves v = g²/2, v̂ = g², √v̂ = |g| = (2, 1, 4, 0.5). */
#define FIRST_GRADIENT {2, -1, 4, 0.5f}
static void v_hat_optimizer(pt_optimizer *opt)
{
    const pt_optimizer_settings s = {.kind = PT_OPTIMIZER_ADAMW, .beta1 = 0.9, .beta2 = 0.5,
                                     .eps = 1e-12, .weight_decay = 0.0, .psi = PT_NADAM_PSI};
    cr_assert_eq(pt_optimizer_init(opt, &s, pt_kernels_cpu(), 4), PIPERT_OK);
}

Test(delay_compensation, first_order_correction_by_hand)
{
    pt_optimizer opt;
    v_hat_optimizer(&opt);
    float theta[4] = {0, 0, 0, 0}, first[4] = FIRST_GRADIENT;
    float grads[4] = {1, 3, -2, 0.5f};
    const float now[4] = {1.0f, 1.0f, 1.0f, 1.0f}, used[4] = {0.9f, 1.2f, 1.0f, 0.5f};
    /* before any step: no mean square, nothing changes */
    cr_assert_eq(pt_optimizer_delay_compensate(&opt, grads, now, used, two_regions, 2, 2.0), PIPERT_OK);
    cr_expect_eq(grads[0], 1.0f);
    pt_optimizer_step(&opt, theta, first, two_regions, 2, 0.1);
    cr_assert_eq(pt_optimizer_delay_compensate(&opt, grads, now, used, two_regions, 2, 2.0), PIPERT_OK);
    /* g = 1, Δ = 0.1, √v̂ = 2:   1 + 2·1·0.1/2    = 1.1
     * g = 3, Δ = −0.2, √v̂ = 1:  3 + 2·9·(−0.2)/1 = −0.6
     * g = −2, Δ = 0:            −2
     * g = 0.5, Δ = 0.5, √v̂ = 0.5: 0.5 + 2·0.25·0.5/0.5 = 1.0 */
    cr_expect_float_eq(grads[0], 1.1, 1e-5);
    cr_expect_float_eq(grads[1], -0.6, 1e-5);
    cr_expect_float_eq(grads[2], -2.0, 1e-6);
    cr_expect_float_eq(grads[3], 1.0, 1e-5);
    cr_expect_eq(pt_optimizer_delay_compensate(&opt, grads, now, used, two_regions, 2, -1.0),
                 PIPERT_ERR_INVALID_ARG);
    pt_optimizer_free(&opt);
}

/* ---- nesterov-secant: g + s·clamp(mean(Δg·Δw)/mean(Δw²), 0, d/γ)·(now − used) ------ */

/* Backward j of a quadratic per element: stash w_j = j·δ, gradient g_j = h·w_j + c, so every
 * secant Δg/Δw is h and so is the ratio of their running means, whatever their weights. */
static void quadratic_pair(int j, float *grads, float *used)
{
    const float delta[4] = {0.5f, 0.25f, 0.125f, 0.0f}, h[4] = {3, -2, 100, 7}, c[4] = {1, 2, -1, 4};
    for (int i = 0; i < 4; i++) {
        used[i] = (float)j * delta[i];
        grads[i] = h[i] * used[i] + c[i];
    }
}

Test(secant_compensation, measured_curvature_clamped_by_hand)
{
    pt_optimizer opt;
    v_hat_optimizer(&opt);
    float theta[4] = {0, 0, 0, 0}, first[4] = FIRST_GRADIENT;
    pt_optimizer_step(&opt, theta, first, two_regions, 2, 0.1); /* √v̂ = (2, 1, 4, 0.5) */
    pt_secant sec;
    cr_assert_eq(pt_secant_init(&sec, pt_kernels_cpu(), 4, 0), PIPERT_OK);
    const float drift[4] = {0.1f, 0.1f, 0.01f, 0.5f};
    float grads[4], used[4], now[4], plain[4];
    for (int j = 1; j <= PT_SECANT_WARMUP + 2; j++) {
        quadratic_pair(j, grads, used);
        memcpy(plain, grads, sizeof plain);
        for (int i = 0; i < 4; i++) now[i] = used[i] + drift[i];
        cr_assert_eq(pt_secant_compensate(&sec, &opt, grads, now, used, two_regions, 2, 0.1, 2.0),
                     PIPERT_OK);
        if (j <= PT_SECANT_WARMUP + 1) /* measured, not yet compensated */
            for (int i = 0; i < 4; i++) cr_expect_eq(grads[i], plain[i], "pair %d, [%d]", j, i);
    }
    /* cap = d/γ = (20, 10, 40, 5), s = 2:
     *   h = 3:    κ = 3,            g + 2·3·0.1    = g + 0.6
     *   h = −2:   κ = 0 (a negative curvature is not used)
     *   h = 100:  κ = 40 (capped),  g + 2·40·0.01  = g + 0.8
     *   Δw = 0:   no secant,        g */
    cr_expect_float_eq(grads[0], plain[0] + 0.6f, 1e-4);
    cr_expect_eq(grads[1], plain[1]);
    cr_expect_float_eq(grads[2], plain[2] + 0.8f, 1e-4);
    cr_expect_eq(grads[3], plain[3]);
    cr_expect_eq(pt_secant_compensate(&sec, &opt, grads, now, used, two_regions, 2, 0.1, 0.0),
                 PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_secant_compensate(&sec, &opt, grads, now, used, two_regions, 2, 0.0, 2.0),
                 PIPERT_ERR_INVALID_ARG);
    pt_secant_free(&sec);
    pt_optimizer_free(&opt);
}
