/* AdamW and NAdamW (ALGORITHMS.md §2). Each step folds the learning rate, the
 * bias corrections and the NAdam momentum schedule into one pt_adam_coeffs per
 * kind of region (decayed or not), computed in double, and the backend's
 * adam_update kernel applies it element by element. The weight prediction of
 * lookahead = predict (§3) folds its coefficients the same way for the
 * adam_extrapolate kernel. */
#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/memory.h"

pipert_result pt_optimizer_parse_kind(const char *name, pt_optimizer_kind *out)
{
    const int k = pt_config_choice_value("train.optimizer", name);
    if (k < 0) return PIPERT_ERR_CONFIG;
    *out = (pt_optimizer_kind)k;
    return PIPERT_OK;
}

const char *pt_optimizer_kind_name(pt_optimizer_kind kind)
{
    return pt_config_choice_name("train.optimizer", kind);
}

static pipert_result check_settings(const pt_optimizer_settings *s)
{
    if (s->kind != PT_OPTIMIZER_ADAMW && s->kind != PT_OPTIMIZER_NADAMW)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "optimizer: unknown kind %d", (int)s->kind);
    if (!(s->beta1 >= 0 && s->beta1 < 1))
        return pt_fail(PIPERT_ERR_CONFIG, "train.beta1: %g is not in [0, 1)", s->beta1);
    if (!(s->beta2 >= 0 && s->beta2 < 1))
        return pt_fail(PIPERT_ERR_CONFIG, "train.beta2: %g is not in [0, 1)", s->beta2);
    if (!(s->eps > 0))
        return pt_fail(PIPERT_ERR_CONFIG, "train.eps: %g must be > 0", s->eps);
    if (!(s->weight_decay >= 0))
        return pt_fail(PIPERT_ERR_CONFIG, "train.weight_decay: %g must be >= 0", s->weight_decay);
    if (!(s->momentum_shift >= 0 && s->momentum_shift < 1))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "optimizer momentum shift: %g is not in [0, 1)",
                       s->momentum_shift);
    if (s->kind == PT_OPTIMIZER_NADAMW && !(s->psi > 0))
        return pt_fail(PIPERT_ERR_CONFIG,
                       "optimizer psi: %g must be > 0 for nadamw (PyTorch's momentum_decay, %g)",
                       s->psi, PT_NADAM_PSI);
    return PIPERT_OK;
}

pipert_result pt_optimizer_init(pt_optimizer *opt, const pt_optimizer_settings *s,
                                const pt_kernels *k, size_t n)
{
    memset(opt, 0, sizeof *opt);
    PT_TRY(check_settings(s));
    size_t bytes;
    if (!pt_mul_size(n, sizeof(float), &bytes))
        return pt_fail(PIPERT_ERR_NOMEM, "optimizer moments: %zu elements overflow", n);
    float *m = NULL, *v = NULL;
    PT_TRY(k->alloc((void **)&m, bytes, "optimizer first moment m"));
    pipert_result rc = k->alloc((void **)&v, bytes, "optimizer second moment v");
    if (rc != PIPERT_OK) {
        k->free(m);
        return rc;
    }
    *opt = (pt_optimizer){.settings = *s, .kernels = k, .n = n, .m = m, .v = v, .t = 0,
                          .mu_product = 1.0};
    return PIPERT_OK;
}

void pt_optimizer_free(pt_optimizer *opt)
{
    if (opt->kernels) {
        opt->kernels->free(opt->m);
        opt->kernels->free(opt->v);
    }
    memset(opt, 0, sizeof *opt);
}

double pt_nadam_mu(const pt_optimizer_settings *s, long t)
{
    return s->beta1 * (1.0 - 0.5 * pow(0.96, (double)t * s->psi));
}

/* The step-size coefficients of step t (1-based) in double, before anything
 * is rounded to float: θ −= c_grad·g/d + c_mom·m/d. mu_product_prev = Π_{t−1}.
 * NAdamW's momentum_shift moves that fraction of c_grad to c_mom: the step
 * keeps its size (m is a running mean of g) and leans on the mean gradient
 * rather than the newest one. */
static void step_coefficients(const pt_optimizer_settings *s, long t, double mu_product_prev,
                              double lr, double *c_grad, double *c_mom)
{
    if (s->kind == PT_OPTIMIZER_ADAMW) {
        /* θ −= γ·m̂/d with m̂ = m/(1−β1ᵗ): all of it on the momentum term */
        *c_grad = 0.0;
        *c_mom = lr / (1.0 - pow(s->beta1, (double)t));
    } else {
        double mu = pt_nadam_mu(s, t), mu_next = pt_nadam_mu(s, t + 1);
        double mu_product = mu_product_prev * mu; /* Π_t */
        *c_grad = lr * (1.0 - mu) / (1.0 - mu_product);
        *c_mom = lr * mu_next / (1.0 - mu_product * mu_next);
        const double moved = s->momentum_shift * *c_grad;
        *c_grad -= moved;
        *c_mom += moved;
    }
}

static float decay_factor(const pt_optimizer_settings *s, double lr, int decay)
{
    return (float)(decay ? 1.0 - lr * s->weight_decay : 1.0);
}

pt_adam_coeffs pt_optimizer_coeffs(const pt_optimizer_settings *s, long t, double mu_product_prev,
                                   double lr, int decay)
{
    double c_grad, c_mom;
    step_coefficients(s, t, mu_product_prev, lr, &c_grad, &c_mom);
    return (pt_adam_coeffs){
        .decay = decay_factor(s, lr, decay),
        .beta1 = (float)s->beta1,
        .beta2 = (float)s->beta2,
        .bias2 = (float)(1.0 - pow(s->beta2, (double)t)),
        .eps = (float)s->eps,
        .c_grad = (float)c_grad,
        .c_mom = (float)c_mom,
    };
}

void pt_optimizer_step_scaled(pt_optimizer *opt, float *params, const float *grads,
                              const pt_param_region *regions, int n_regions, double lr,
                              float grad_scale)
{
    const pt_optimizer_settings *s = &opt->settings;
    opt->t++;
    const pt_adam_coeffs decayed = pt_optimizer_coeffs(s, opt->t, opt->mu_product, lr, 1);
    const pt_adam_coeffs plain = pt_optimizer_coeffs(s, opt->t, opt->mu_product, lr, 0);
    opt->kernels->adam_update(params, grads, opt->m, opt->v, regions, n_regions, &decayed,
                              &plain, grad_scale);
    if (s->kind == PT_OPTIMIZER_NADAMW) opt->mu_product *= pt_nadam_mu(s, opt->t);
}

void pt_optimizer_step(pt_optimizer *opt, float *params, const float *grads,
                       const pt_param_region *regions, int n_regions, double lr)
{
    pt_optimizer_step_scaled(opt, params, grads, regions, n_regions, lr, 1.0f);
}

/* The coefficients of the prediction for one kind of region, as the
 * adam_extrapolate kernel reads them: decay and c_mom per step, bias2 and ε
 * for d. The reasoning is in optimizer.h; in short, the expected update of
 * step t+1 with the unknown g_{t+1} replaced by m̂_t = m_t/(1−β1ᵗ) (and g² by
 * v̂_t) is k·m_t/d̂_t with
 *   m_{t+1} → β1·m_t + (1−β1)·m̂_t = m_t·(1 − β1^{t+1})/(1 − β1ᵗ)
 *   k = (c_grad + c_mom·(1 − β1^{t+1})) / (1 − β1ᵗ)    (step t+1's c_grad, c_mom)
 *   v_{t+1}/(1−β2^{t+1}) → v̂_t, so d̂_t = √(v_t/(1−β2ᵗ)) + ε.
 * AdamW: c_grad = 0, c_mom = γ/(1−β1^{t+1}), so k = γ/(1−β1ᵗ) and u = m̂_t/d̂_t.
 * NAdamW: k → γ(1−μ) + γμ = γ once Π is small. */
static pt_adam_coeffs prediction_coeffs(const pt_optimizer *opt, double lr, int decay)
{
    const pt_optimizer_settings *s = &opt->settings;
    pt_adam_coeffs c = {.decay = decay_factor(s, lr, decay), .eps = (float)s->eps};
    if (opt->t == 0) {
        /* m = v = 0 and no estimate of the gradient yet: the decay alone */
        c.bias2 = 1.0f;
        c.c_mom = 0.0f;
        return c;
    }
    const long t = opt->t;
    double c_grad, c_mom; /* of step t+1, after Π_t = opt->mu_product */
    step_coefficients(s, t + 1, opt->mu_product, lr, &c_grad, &c_mom);
    const double bias1 = 1.0 - pow(s->beta1, (double)t);
    const double bias1_next = 1.0 - pow(s->beta1, (double)(t + 1));
    c.bias2 = (float)(1.0 - pow(s->beta2, (double)t));
    c.c_mom = (float)((c_grad + c_mom * bias1_next) / bias1);
    return c;
}

static pipert_result check_prediction(const pt_optimizer *opt, double steps)
{
    if (!opt->kernels->adam_extrapolate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "lookahead predict: the %s kernels have no adam_extrapolate",
                       opt->kernels->name);
    if (!(steps >= 0 && isfinite(steps)))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "lookahead predict: staleness %g must be finite and >= 0", steps);
    return PIPERT_OK;
}

/* Region i extrapolated by steps_of[i] (or `steps` for every region when steps_of is NULL). */
static void predict_regions(const pt_optimizer *opt, float *out, const float *params,
                            const pt_param_region *regions, int n_regions, double lr,
                            double steps, const double *steps_of)
{
    const pt_kernels *k = opt->kernels;
    const pt_adam_coeffs decayed = prediction_coeffs(opt, lr, 1);
    const pt_adam_coeffs plain = prediction_coeffs(opt, lr, 0);
    for (int i = 0; i < n_regions; i++) {
        const pt_param_region *r = &regions[i];
        if (r->numel == 0) continue;
        k->adam_extrapolate(out + r->offset, params + r->offset, opt->m + r->offset,
                            opt->v + r->offset, r->numel, r->decay ? &decayed : &plain,
                            (float)(steps_of ? steps_of[i] : steps));
    }
}

pipert_result pt_optimizer_predict(const pt_optimizer *opt, float *out, const float *params,
                                   const pt_param_region *regions, int n_regions, double lr,
                                   double steps)
{
    PT_TRY(check_prediction(opt, steps));
    predict_regions(opt, out, params, regions, n_regions, lr, steps, NULL);
    return PIPERT_OK;
}

pipert_result pt_optimizer_predict_each(const pt_optimizer *opt, float *out, const float *params,
                                        const pt_param_region *regions, int n_regions, double lr,
                                        const double *steps)
{
    for (int i = 0; i < n_regions; i++) PT_TRY(check_prediction(opt, steps[i]));
    if (n_regions == 0) PT_TRY(check_prediction(opt, 0));
    predict_regions(opt, out, params, regions, n_regions, lr, 0, steps);
    return PIPERT_OK;
}

pipert_result pt_optimizer_delay_compensate(const pt_optimizer *opt, float *grads,
                                            const float *now, const float *used,
                                            const pt_param_region *regions, int n_regions,
                                            double lambda)
{
    const pt_kernels *k = opt->kernels;
    if (!k->delay_compensate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "lookahead dc-asgd: the %s kernels have no delay_compensate", k->name);
    if (!(lambda >= 0 && isfinite(lambda)))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "lookahead dc-asgd: lambda %g must be finite and >= 0",
                       lambda);
    if (opt->t == 0) return PIPERT_OK; /* no mean square of the gradient yet */
    const pt_adam_coeffs c = {.bias2 = (float)(1.0 - pow(opt->settings.beta2, (double)opt->t)),
                              .eps = (float)opt->settings.eps};
    for (int i = 0; i < n_regions; i++) {
        const pt_param_region *r = &regions[i];
        if (r->numel == 0) continue;
        k->delay_compensate(grads + r->offset, now + r->offset, used + r->offset,
                            opt->v + r->offset, r->numel, &c, (float)lambda);
    }
    return PIPERT_OK;
}

double pt_lr_at(long step, long total, double lr, long warmup, double min_ratio)
{
    if (step < 1) step = 1;
    if (warmup > 0 && step <= warmup) return lr * (double)step / (double)warmup;
    if (step >= total) return total > warmup ? min_ratio * lr : lr;
    double progress = (double)(step - warmup) / (double)(total - warmup); /* (0, 1) */
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));                    /* 1 → 0 */
    return lr * (min_ratio + (1.0 - min_ratio) * cosine);
}

float pt_clip_scale(double norm, double max_norm)
{
    return max_norm > 0 && isfinite(norm) && norm > max_norm ? (float)(max_norm / norm) : 1.0f;
}
