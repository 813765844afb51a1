/* The optimizers against ALGORITHMS.md §2 computed here in double, written as
 * plainly as the formulas read (bias-corrected moments for AdamW, the μ/Π
 * schedule for NAdamW), not through pt_adam_coeffs; plus hand-computed values,
 * the weight prediction of lookahead = predict, the learning-rate schedule
 * and gradient clipping. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "train/optimizer.h"

#define N_PARAMS 7
#define STEPS 6

/* Two tensors: a matrix of 4 elements (decayed) and a bias of 3 (not). */
static const pt_param_region regions[2] = {{0, 4, 1}, {4, 3, 0}};

static const float initial_params[N_PARAMS] = {0.5f, -0.3f, 1.2f, 0.05f, -0.8f, 0.0f, 0.25f};

/* A gradient that changes sign and size from step to step. */
static float gradient_at(long t, int i)
{
    return (float)(sin(0.7 * t + 1.3 * i) * (0.5 + 0.2 * i));
}

static double lr_of_step(long t) { return 0.01 * (1.0 + 0.1 * t); }

/* ---- the reference, in double ------------------------------------------------ */

typedef struct reference {
    double theta[N_PARAMS], m[N_PARAMS], v[N_PARAMS];
    double mu_product;
} reference;

static int decayed(int i) { return i < 4; }

static void reference_adamw_step(reference *r, const pt_optimizer_settings *s, long t, double lr)
{
    for (int i = 0; i < N_PARAMS; i++) {
        double g = gradient_at(t, i);
        if (decayed(i)) r->theta[i] *= 1.0 - lr * s->weight_decay;
        r->m[i] = s->beta1 * r->m[i] + (1 - s->beta1) * g;
        r->v[i] = s->beta2 * r->v[i] + (1 - s->beta2) * g * g;
        double m_hat = r->m[i] / (1 - pow(s->beta1, t));
        double v_hat = r->v[i] / (1 - pow(s->beta2, t));
        r->theta[i] -= lr * m_hat / (sqrt(v_hat) + s->eps);
    }
}

static void reference_nadamw_step(reference *r, const pt_optimizer_settings *s, long t, double lr)
{
    double mu = s->beta1 * (1 - 0.5 * pow(0.96, t * s->psi));
    double mu_next = s->beta1 * (1 - 0.5 * pow(0.96, (t + 1) * s->psi));
    r->mu_product *= mu; /* Π_t */
    for (int i = 0; i < N_PARAMS; i++) {
        double g = gradient_at(t, i);
        if (decayed(i)) r->theta[i] *= 1.0 - lr * s->weight_decay;
        r->m[i] = s->beta1 * r->m[i] + (1 - s->beta1) * g;
        r->v[i] = s->beta2 * r->v[i] + (1 - s->beta2) * g * g;
        double d = sqrt(r->v[i] / (1 - pow(s->beta2, t))) + s->eps;
        r->theta[i] -= lr * (1 - mu) / (1 - r->mu_product) * g / d;
        r->theta[i] -= lr * mu_next / (1 - r->mu_product * mu_next) * r->m[i] / d;
    }
}

/* Runs STEPS steps of the optimizer and of the reference side by side. */
static void compare_with_reference(const pt_optimizer_settings *s)
{
    const pt_kernels *k = pt_kernels_cpu();
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, s, k, N_PARAMS), PIPERT_OK, "%s", pipert_last_error());
    float params[N_PARAMS], grads[N_PARAMS];
    memcpy(params, initial_params, sizeof params);
    reference r = {.mu_product = 1.0};
    for (int i = 0; i < N_PARAMS; i++) r.theta[i] = initial_params[i];

    const char *name = pt_optimizer_kind_name(s->kind);
    for (long t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N_PARAMS; i++) grads[i] = gradient_at(t, i);
        pt_optimizer_step(&opt, params, grads, regions, 2, lr_of_step(t));
        if (s->kind == PT_OPTIMIZER_ADAMW) reference_adamw_step(&r, s, t, lr_of_step(t));
        else reference_nadamw_step(&r, s, t, lr_of_step(t));

        cr_assert_eq(opt.t, t, "%s: t = %ld after step %ld", name, opt.t, t);
        if (s->kind == PT_OPTIMIZER_NADAMW)
            cr_assert(fabs(opt.mu_product - r.mu_product) < 1e-15,
                      "nadamw step %ld: Π = %.17g, reference %.17g", t, opt.mu_product,
                      r.mu_product);
        for (int i = 0; i < N_PARAMS; i++) {
            /* float state against double: a few float ulps of θ ~ 1 */
            cr_assert(fabs(params[i] - r.theta[i]) < 2e-6,
                      "%s step %ld, θ[%d] (%s): %.8f, reference %.8f", name, t, i,
                      decayed(i) ? "decayed" : "not decayed", params[i], r.theta[i]);
            cr_assert(fabs(opt.m[i] - r.m[i]) < 1e-6 && fabs(opt.v[i] - r.v[i]) < 1e-6,
                      "%s step %ld: moments of θ[%d] m %.8f v %.8f, reference %.8f %.8f", name,
                      t, i, opt.m[i], opt.v[i], r.m[i], r.v[i]);
        }
    }
    pt_optimizer_free(&opt);
}

Test(optimizer, adamw_matches_formulas_with_weight_decay)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    compare_with_reference(&s);
}

Test(optimizer, adamw_matches_formulas_without_weight_decay)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.8, 0.99, 1e-3, 0.0, PT_NADAM_PSI, 0.0};
    compare_with_reference(&s);
}

Test(optimizer, nadamw_matches_formulas)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_NADAMW, 0.99, 0.999, 1e-8, 0.01, PT_NADAM_PSI, 0.0};
    compare_with_reference(&s);
    pt_optimizer_settings no_decay = {PT_OPTIMIZER_NADAMW, 0.9, 0.95, 1e-6, 0.0, PT_NADAM_PSI, 0.0};
    compare_with_reference(&no_decay);
    /* With ψ = 0.004, μ_t and μ_{t+1} differ by 1e-4 relative; a large ψ makes
     * them far apart, so mixing them up cannot hide under the tolerance. */
    pt_optimizer_settings fast_mu = {PT_OPTIMIZER_NADAMW, 0.9, 0.95, 1e-8, 0.1, 0.5, 0.0};
    compare_with_reference(&fast_mu);
}

/* ---- hand-computed values ---------------------------------------------------- */

/* One step from θ = 0.5 with gradient g on a 1-element tensor. */
static float one_step(pt_optimizer_kind kind, double weight_decay, float g, int decay)
{
    pt_optimizer_settings s = {kind, 0.9, 0.95, 1e-12, weight_decay, PT_NADAM_PSI, 0.0};
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 1), PIPERT_OK);
    float theta = 0.5f;
    pt_param_region region = {0, 1, decay};
    pt_optimizer_step(&opt, &theta, &g, &region, 1, 0.01);
    pt_optimizer_free(&opt);
    return theta;
}

Test(optimizer, adamw_first_step_moves_by_lr_times_sign)
{
    /* t = 1: m̂ = g, v̂ = g², so θ moves by −γ·g/|g| = −γ·sign(g) whatever |g|. */
    cr_expect_float_eq(one_step(PT_OPTIMIZER_ADAMW, 0.0, 0.3f, 1), 0.49f, 1e-6);
    cr_expect_float_eq(one_step(PT_OPTIMIZER_ADAMW, 0.0, -20.0f, 1), 0.51f, 1e-6);
    /* with λ = 0.1 on a decayed tensor: 0.5·(1 − 0.01·0.1) − 0.01 = 0.4895 */
    cr_expect_float_eq(one_step(PT_OPTIMIZER_ADAMW, 0.1, 0.3f, 1), 0.4895f, 1e-6);
    /* a bias is never decayed */
    cr_expect_float_eq(one_step(PT_OPTIMIZER_ADAMW, 0.1, 0.3f, 0), 0.49f, 1e-6);
}

Test(optimizer, nadam_mu_sequence_and_first_step)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_NADAMW, 0.9, 0.95, 1e-12, 0.0, 0.004, 0.0};
    /* μ_1 = 0.9·(1 − ½·0.96^0.004): ln 0.96 = −0.0408220, ·0.004 = −1.63288e-4,
     * exp → 0.99983672, so μ_1 = 0.9·0.50008164 = 0.45007347; μ_2 likewise. */
    cr_expect(fabs(pt_nadam_mu(&s, 1) - 0.45007347359) < 1e-10, "μ_1 = %.11f", pt_nadam_mu(&s, 1));
    cr_expect(fabs(pt_nadam_mu(&s, 2) - 0.45014693519) < 1e-10, "μ_2 = %.11f", pt_nadam_mu(&s, 2));
    /* μ_t rises towards β1 as 0.96^(tψ) decays */
    for (long t = 1; t < 2000; t += 97)
        cr_expect(pt_nadam_mu(&s, t) < pt_nadam_mu(&s, t + 1) && pt_nadam_mu(&s, t) < 0.9,
                  "μ not increasing below β1 at t = %ld", t);

    /* Π_t = Π_{t−1}·μ_t, tracked by the optimizer in double */
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 1), PIPERT_OK);
    cr_expect_eq(opt.mu_product, 1.0, "Π_0 = %g", opt.mu_product);
    float theta = 0, g = 1;
    pt_param_region region = {0, 1, 0};
    double product = 1;
    for (long t = 1; t <= 5; t++) {
        pt_optimizer_step(&opt, &theta, &g, &region, 1, 0.01);
        product *= pt_nadam_mu(&s, t);
        cr_expect(fabs(opt.mu_product - product) < 1e-16, "Π_%ld = %.17g, expected %.17g", t,
                  opt.mu_product, product);
    }
    pt_optimizer_free(&opt);

    /* Step 1, g = 0.3, ε ≈ 0: d = |g|, m = 0.1·g, Π_1 = μ_1:
     * θ = 0.5 − γ·(1−μ_1)/(1−μ_1)·1 − γ·μ_2/(1−μ_1μ_2)·0.1
     *   = 0.5 − 0.01·(1 + 0.1·0.45014694/(1 − 0.45007347·0.45014694)) = 0.48943548 */
    cr_expect_float_eq(one_step(PT_OPTIMIZER_NADAMW, 0.0, 0.3f, 1), 0.48943548f, 1e-6);
}

Test(optimizer, coefficients)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    pt_adam_coeffs c = pt_optimizer_coeffs(&s, 3, 1.0, 0.02, 1);
    cr_expect_float_eq(c.decay, 1 - 0.02 * 0.1, 1e-7);
    cr_expect_float_eq(c.bias2, 1 - 0.95 * 0.95 * 0.95, 1e-7);
    cr_expect_float_eq(c.c_mom, 0.02 / (1 - 0.9 * 0.9 * 0.9), 1e-7);
    cr_expect_eq(c.c_grad, 0.0f);
    cr_expect_eq(pt_optimizer_coeffs(&s, 3, 1.0, 0.02, 0).decay, 1.0f, "no decay means 1");
}

/* NAdamW's momentum shift moves a fraction of the raw gradient's coefficient to the
 * momentum's; the sum is kept. AdamW has no raw term and is unchanged. */
Test(optimizer, momentum_shift_moves_the_raw_coefficient_to_the_momentum)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_NADAMW, 0.99, 0.999, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    const pt_adam_coeffs plain = pt_optimizer_coeffs(&s, 7, 0.25, 0.02, 1);
    s.momentum_shift = 0.5;
    const pt_adam_coeffs shifted = pt_optimizer_coeffs(&s, 7, 0.25, 0.02, 1);
    cr_expect_float_eq(shifted.c_grad, 0.5 * plain.c_grad, 1e-8);
    cr_expect_float_eq(shifted.c_mom, plain.c_mom + 0.5 * plain.c_grad, 1e-8);
    cr_expect_eq(shifted.decay, plain.decay);
    cr_expect(plain.c_grad > 0.005f, "NAdam's raw coefficient: %g", plain.c_grad);
    pt_optimizer_settings adamw = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.5};
    cr_expect_eq(pt_optimizer_coeffs(&adamw, 3, 1.0, 0.02, 1).c_grad, 0.0f);
    pt_optimizer opt;
    s.momentum_shift = 1.0;
    cr_expect_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 1), PIPERT_ERR_INVALID_ARG);
}

/* ---- weight prediction (lookahead = predict) ------------------------------- */

/* The prediction against ALGORITHMS.md §3 written out here in double from
 * the optimizer's own m, v and t: ŵ = θ − τ·γ·u with, for AdamW, the current
 * bias-corrected moments, u = m̂_t/(√v̂_t + ε) + λθ; for NAdamW, the update of
 * step t+1 with g replaced by m̂_t (see optimizer.h). Float against double:
 * 1e-6 on θ ~ 1. */

#define PREDICT_LR 0.02

static const double staleness[] = {0.0, 1.0, 2.5, 3.0};

static double predicted_reference(const pt_optimizer *opt, const pt_optimizer_settings *s,
                                  const float *params, int i, double tau)
{
    const double lr = PREDICT_LR, theta = params[i];
    const long t = opt->t;
    const double decay_term = decayed(i) ? lr * s->weight_decay * theta : 0.0;
    if (t == 0) return theta - tau * decay_term;
    double m_hat = opt->m[i] / (1 - pow(s->beta1, t));
    double v_hat = opt->v[i] / (1 - pow(s->beta2, t));
    double d = sqrt(v_hat) + s->eps;
    if (s->kind == PT_OPTIMIZER_ADAMW) return theta - tau * (lr * m_hat / d + decay_term);
    /* NAdamW: step t+1 with μ_{t+1}, μ_{t+2} and Π_{t+1}, recomputed here */
    double product = 1;
    for (long k = 1; k <= t + 1; k++) product *= s->beta1 * (1 - 0.5 * pow(0.96, k * s->psi));
    double mu_next = s->beta1 * (1 - 0.5 * pow(0.96, (t + 1) * s->psi));
    double mu_after = s->beta1 * (1 - 0.5 * pow(0.96, (t + 2) * s->psi));
    double expected_m_next = s->beta1 * opt->m[i] + (1 - s->beta1) * m_hat;
    double step = lr * (1 - mu_next) / (1 - product) * m_hat / d +
                  lr * mu_after / (1 - product * mu_after) * expected_m_next / d;
    return theta - tau * (step + decay_term);
}

/* `steps` optimizer steps on the test gradients, then every τ of staleness[]
 * against the reference; returns the largest |ŵ − θ| seen. */
static double check_prediction(const pt_optimizer_settings *s, long steps)
{
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, s, pt_kernels_cpu(), N_PARAMS), PIPERT_OK);
    float params[N_PARAMS], grads[N_PARAMS], out[N_PARAMS];
    memcpy(params, initial_params, sizeof params);
    for (long t = 1; t <= steps; t++) {
        for (int i = 0; i < N_PARAMS; i++) grads[i] = gradient_at(t, i);
        pt_optimizer_step(&opt, params, grads, regions, 2, lr_of_step(t));
    }
    float params_before[N_PARAMS], m_before[N_PARAMS];
    memcpy(params_before, params, sizeof params);
    memcpy(m_before, opt.m, sizeof m_before);

    const char *name = pt_optimizer_kind_name(s->kind);
    double largest_move = 0;
    for (size_t k = 0; k < sizeof staleness / sizeof staleness[0]; k++) {
        const double tau = staleness[k];
        memset(out, 0xff, sizeof out); /* NaN: every element must be written */
        cr_assert_eq(pt_optimizer_predict(&opt, out, params, regions, 2, PREDICT_LR, tau),
                     PIPERT_OK, "%s", pipert_last_error());
        for (int i = 0; i < N_PARAMS; i++) {
            double expected = predicted_reference(&opt, s, params, i, tau);
            if (tau == 0)
                cr_assert_eq(out[i], params[i],
                             "%s after %ld steps, τ = 0: ŵ[%d] = %.9g, θ %.9g", name, steps, i,
                             out[i], params[i]);
            cr_assert(fabs(out[i] - expected) < 1e-6,
                      "%s after %ld steps, τ = %g, ŵ[%d] (%s): %.9f, reference %.9f", name, steps,
                      tau, i, decayed(i) ? "decayed" : "not decayed", out[i], expected);
            largest_move = fmax(largest_move, fabs(expected - params[i]));
        }
    }
    cr_assert(!memcmp(params, params_before, sizeof params) &&
                  !memcmp(opt.m, m_before, sizeof m_before) && opt.t == steps,
              "%s: predict changed the parameters or the optimizer", name);
    pt_optimizer_free(&opt);
    return largest_move;
}

Test(optimizer, predict_adamw_is_theta_minus_tau_lr_current_direction)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    /* after one step the bias corrections of t and t+1 differ by a quarter of
     * the step, so using the wrong t cannot hide under 1e-6 */
    for (long steps = 1; steps <= 4; steps += 3)
        cr_expect(check_prediction(&s, steps) > 0.02, "the prediction moved too little to test");
    pt_optimizer_settings no_decay = {PT_OPTIMIZER_ADAMW, 0.8, 0.99, 1e-3, 0.0, PT_NADAM_PSI, 0.0};
    check_prediction(&no_decay, 3);
}

Test(optimizer, predict_nadamw_is_the_expected_next_update)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_NADAMW, 0.99, 0.999, 1e-8, 0.01, PT_NADAM_PSI, 0.0};
    cr_expect(check_prediction(&s, 5) > 0.02, "the prediction moved too little to test");
    /* a large ψ keeps μ_{t+1} and μ_{t+2} far apart */
    pt_optimizer_settings fast_mu = {PT_OPTIMIZER_NADAMW, 0.9, 0.95, 1e-8, 0.1, 0.5, 0.0};
    check_prediction(&fast_mu, 1);
    check_prediction(&fast_mu, 4);
}

Test(optimizer, predict_before_the_first_step_is_the_decay_alone)
{
    /* t = 0: ŵ = θ·(1 − τγλ) on decayed regions, θ on the others */
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    check_prediction(&s, 0);
    pt_optimizer_settings n = {PT_OPTIMIZER_NADAMW, 0.99, 0.999, 1e-8, 0.01, PT_NADAM_PSI, 0.0};
    check_prediction(&n, 0);
    /* by hand: θ = 0.5, τ = 2, γ = 0.01, λ = 0.1 → 0.5·(1 − 0.002) = 0.499 */
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 2), PIPERT_OK);
    float theta[2] = {0.5f, 0.5f}, out[2];
    pt_param_region two[2] = {{0, 1, 1}, {1, 1, 0}};
    cr_assert_eq(pt_optimizer_predict(&opt, out, theta, two, 2, 0.01, 2.0), PIPERT_OK);
    cr_expect_float_eq(out[0], 0.499f, 1e-7, "decayed: %.9g", out[0]);
    cr_expect_eq(out[1], 0.5f, "not decayed: %.9g", out[1]);
    pt_optimizer_free(&opt);
}

Test(optimizer, predict_refuses_a_missing_kernel_and_bad_staleness)
{
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    pt_optimizer opt;
    cr_assert_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), N_PARAMS), PIPERT_OK);
    float out[N_PARAMS] = {0};
    cr_expect_eq(pt_optimizer_predict(&opt, out, initial_params, regions, 2, 0.01, -1.0),
                 PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "staleness") != NULL, "message: %s",
              pipert_last_error());
    cr_expect_eq(pt_optimizer_predict(&opt, out, initial_params, regions, 2, 0.01, NAN),
                 PIPERT_ERR_INVALID_ARG);

    /* adam_extrapolate is optional in a backend (cuda has none yet) */
    pt_kernels without = *pt_kernels_cpu();
    without.adam_extrapolate = NULL;
    opt.kernels = &without;
    cr_expect_eq(pt_optimizer_predict(&opt, out, initial_params, regions, 2, 0.01, 1.0),
                 PIPERT_ERR_UNSUPPORTED);
    cr_expect(strstr(pipert_last_error(), "adam_extrapolate") != NULL, "message: %s",
              pipert_last_error());
    for (int i = 0; i < N_PARAMS; i++) cr_expect_eq(out[i], 0.0f, "out[%d] was written", i);
    opt.kernels = pt_kernels_cpu();
    pt_optimizer_free(&opt);
}

/* ---- settings --------------------------------------------------------------- */

Test(optimizer, parse_kind)
{
    pt_optimizer_kind kind;
    cr_expect_eq(pt_optimizer_parse_kind("adamw", &kind), PIPERT_OK);
    cr_expect_eq(kind, PT_OPTIMIZER_ADAMW);
    cr_expect_eq(pt_optimizer_parse_kind("nadamw", &kind), PIPERT_OK);
    cr_expect_eq(kind, PT_OPTIMIZER_NADAMW);
    cr_expect_eq(pt_optimizer_parse_kind("sgd", &kind), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "\"sgd\"") != NULL, "message: %s", pipert_last_error());
    cr_expect_str_eq(pt_optimizer_kind_name(PT_OPTIMIZER_NADAMW), "nadamw");
}

Test(optimizer, init_rejects_bad_settings_and_zeroes_moments)
{
    pt_optimizer opt;
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 1.0, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    cr_expect_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 10), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "beta1") != NULL, "message: %s", pipert_last_error());
    cr_expect_null(opt.m);
    pt_optimizer_free(&opt); /* a failed init leaves nothing to free */

    s.beta1 = 0.9;
    s.kind = PT_OPTIMIZER_NADAMW;
    s.psi = 0;
    cr_expect_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 10), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "psi") != NULL, "message: %s", pipert_last_error());

    s.psi = PT_NADAM_PSI;
    s.eps = -1;
    cr_expect_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 10), PIPERT_ERR_CONFIG);

    s.eps = 1e-8;
    cr_assert_eq(pt_optimizer_init(&opt, &s, pt_kernels_cpu(), 1000), PIPERT_OK);
    for (int i = 0; i < 1000; i++) cr_assert(opt.m[i] == 0 && opt.v[i] == 0, "moment %d", i);
    cr_expect(opt.t == 0 && opt.mu_product == 1.0 && opt.n == 1000);
    pt_optimizer_free(&opt);
    pt_optimizer_free(&opt); /* twice is harmless */
}

/* ---- learning-rate schedule --------------------------------------------------- */

Test(optimizer, lr_schedule_warmup_peak_cosine_end)
{
    const double lr = 1e-3, min_ratio = 0.1;
    const long warmup = 10, total = 100;
    cr_expect_float_eq(pt_lr_at(1, total, lr, warmup, min_ratio), 1e-4, 1e-12, "step 1: lr/warmup");
    cr_expect_float_eq(pt_lr_at(5, total, lr, warmup, min_ratio), 5e-4, 1e-12, "step 5");
    cr_expect_float_eq(pt_lr_at(10, total, lr, warmup, min_ratio), 1e-3, 1e-12, "peak");
    /* half-way through the decay: cos(π/2) = 0, so min + (1 − min)/2 = 0.55 of lr */
    cr_expect_float_eq(pt_lr_at(55, total, lr, warmup, min_ratio), 0.55e-3, 1e-12, "middle");
    cr_expect_float_eq(pt_lr_at(100, total, lr, warmup, min_ratio), 1e-4, 1e-12, "end");
    cr_expect_float_eq(pt_lr_at(150, total, lr, warmup, min_ratio), 1e-4, 1e-12, "after the end");
    for (long t = 1; t < warmup; t++)
        cr_expect(pt_lr_at(t, total, lr, warmup, min_ratio) <
                      pt_lr_at(t + 1, total, lr, warmup, min_ratio),
                  "warm-up not increasing at %ld", t);
    for (long t = warmup; t < total; t++)
        cr_expect(pt_lr_at(t, total, lr, warmup, min_ratio) >
                      pt_lr_at(t + 1, total, lr, warmup, min_ratio),
                  "decay not decreasing at %ld", t);
    /* a warm-up longer than the run: the run ends still warming up */
    cr_expect_float_eq(pt_lr_at(8, 8, lr, 16, min_ratio), 0.5 * lr, 1e-12, "step 8 of 16 warm-up");
    /* no warm-up: the decay starts from the peak at step 0, so step 1 is
     * lr·(0.1 + 0.9·½(1 + cos(π/100))) = 0.99978·lr */
    cr_expect_float_eq(pt_lr_at(1, total, lr, 0, min_ratio), 0.999778 * lr, 1e-6 * lr, "%.9g",
                       pt_lr_at(1, total, lr, 0, min_ratio));
}

/* ---- clipping ----------------------------------------------------------------- */

static double norm_of(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return sqrt(s);
}

Test(optimizer, clip_scale)
{
    cr_expect_eq(pt_clip_scale(5.0, 10.0), 1.0f, "a norm under max_norm: no clipping");
    cr_expect_eq(pt_clip_scale(5.0, 0.0), 1.0f, "max_norm 0 disables clipping");
    cr_expect_eq(pt_clip_scale(5.0, 1.0), 0.2f, "max_norm / norm");
    cr_expect_eq(pt_clip_scale(NAN, 1.0), 1.0f, "a NaN norm: the caller decides, nothing scaled");
    cr_expect_eq(pt_clip_scale(INFINITY, 1.0), 1.0f, "an infinite norm: nothing scaled");
}

/* The clipping as the executor applies it, inside the optimizer's step: the factor takes the
 * gradient to max_norm, and the step with it is the step on the scaled gradient, bit for bit,
 * the gradient itself left as it was. */
Test(optimizer, a_scaled_step_is_the_step_on_the_clipped_gradient)
{
    enum { n = 100000 };
    static float grad[n], clipped[n], theta_a[n], theta_b[n];
    for (int i = 0; i < n; i++) {
        grad[i] = (float)sin(i);
        theta_a[i] = theta_b[i] = (float)cos(i);
    }
    const float factor = pt_clip_scale(norm_of(grad, n), 2.5);
    for (int i = 0; i < n; i++) clipped[i] = grad[i] * factor;
    cr_expect(fabs(norm_of(clipped, n) - 2.5) < 1e-5, "clipped norm %g", norm_of(clipped, n));
    pt_optimizer_settings s = {PT_OPTIMIZER_ADAMW, 0.9, 0.95, 1e-8, 0.1, PT_NADAM_PSI, 0.0};
    pt_optimizer a, b;
    cr_assert_eq(pt_optimizer_init(&a, &s, pt_kernels_cpu(), n), PIPERT_OK);
    cr_assert_eq(pt_optimizer_init(&b, &s, pt_kernels_cpu(), n), PIPERT_OK);
    const pt_param_region region = {0, n, 1};
    for (int t = 0; t < 3; t++) {
        pt_optimizer_step_scaled(&a, theta_a, grad, &region, 1, 0.01, factor);
        pt_optimizer_step(&b, theta_b, clipped, &region, 1, 0.01);
    }
    cr_expect_arr_eq(theta_a, theta_b, sizeof theta_a, "the scaled step's θ");
    cr_expect_eq(grad[1], (float)sin(1), "the gradient left as it was");
    pt_optimizer_free(&a);
    pt_optimizer_free(&b);
}
