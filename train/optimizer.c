/* AdamW and NAdamW (ALGORITHMS.md §2). Each step folds the learning rate, the
 * bias corrections and the NAdam momentum schedule into one pt_adam_coeffs per
 * kind of region (decayed or not), computed in double, and the backend's
 * adam_update kernel applies it element by element. */
#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/memory.h"

static const char *const kind_names[] = {
    [PT_OPTIMIZER_ADAMW] = "adamw",
    [PT_OPTIMIZER_NADAMW] = "nadamw",
};

pipert_result pt_optimizer_parse_kind(const char *name, pt_optimizer_kind *out)
{
    for (int kind = 0; kind < (int)(sizeof kind_names / sizeof kind_names[0]); kind++) {
        if (!strcmp(name, kind_names[kind])) {
            *out = (pt_optimizer_kind)kind;
            return PIPERT_OK;
        }
    }
    return pt_fail(PIPERT_ERR_CONFIG,
                   "train.optimizer: unknown optimizer \"%s\" (expected \"adamw\" or \"nadamw\")",
                   name);
}

const char *pt_optimizer_kind_name(pt_optimizer_kind kind)
{
    return (unsigned)kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind] : "unknown";
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

pt_adam_coeffs pt_optimizer_coeffs(const pt_optimizer_settings *s, long t, double mu_product_prev,
                                   double lr, int decay)
{
    pt_adam_coeffs c = {
        .decay = (float)(decay ? 1.0 - lr * s->weight_decay : 1.0),
        .beta1 = (float)s->beta1,
        .beta2 = (float)s->beta2,
        .bias2 = (float)(1.0 - pow(s->beta2, (double)t)),
        .eps = (float)s->eps,
    };
    if (s->kind == PT_OPTIMIZER_ADAMW) {
        /* θ −= γ·m̂/d with m̂ = m/(1−β1ᵗ): all of it on the momentum term */
        c.c_grad = 0.0f;
        c.c_mom = (float)(lr / (1.0 - pow(s->beta1, (double)t)));
    } else {
        double mu = pt_nadam_mu(s, t), mu_next = pt_nadam_mu(s, t + 1);
        double mu_product = mu_product_prev * mu; /* Π_t */
        c.c_grad = (float)(lr * (1.0 - mu) / (1.0 - mu_product));
        c.c_mom = (float)(lr * mu_next / (1.0 - mu_product * mu_next));
    }
    return c;
}

void pt_optimizer_step(pt_optimizer *opt, float *params, const float *grads,
                       const pt_param_region *regions, int n_regions, double lr)
{
    const pt_optimizer_settings *s = &opt->settings;
    opt->t++;
    const pt_adam_coeffs decayed = pt_optimizer_coeffs(s, opt->t, opt->mu_product, lr, 1);
    const pt_adam_coeffs plain = pt_optimizer_coeffs(s, opt->t, opt->mu_product, lr, 0);
    for (int i = 0; i < n_regions; i++) {
        const pt_param_region *r = &regions[i];
        if (r->numel == 0) continue;
        opt->kernels->adam_update(params + r->offset, grads + r->offset, opt->m + r->offset,
                                  opt->v + r->offset, r->numel, r->decay ? &decayed : &plain);
    }
    if (s->kind == PT_OPTIMIZER_NADAMW) opt->mu_product *= pt_nadam_mu(s, opt->t);
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

double pt_clip_grad_norm(const pt_kernels *k, float *grads, size_t n, double max_norm)
{
    double norm = sqrt(k->sum_squares(grads, n));
    if (max_norm > 0 && isfinite(norm) && norm > max_norm)
        k->scale(grads, (float)(max_norm / norm), n);
    return norm;
}
