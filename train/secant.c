/* The secant delay compensation (secant.h). */
#include "train/secant.h"

#include <math.h>
#include <string.h>

#include "runtime/error.h"

pipert_result pt_secant_init(pt_secant *s, const pt_kernels *k, size_t n, long warmup)
{
    memset(s, 0, sizeof *s);
    if (!k->secant_compensate)
        return pt_fail(PIPERT_ERR_UNSUPPORTED, "secant compensation: the %s backend has no "
                                               "secant_compensate kernel", k->name);
    float **buffers[] = {&s->prev_grad, &s->prev_used, &s->num, &s->den};
    const char *what[] = {"previous gradient", "previous stash", "secant numerator",
                          "secant denominator"};
    s->kernels = k;
    s->warmup = warmup > 0 ? warmup : PT_SECANT_WARMUP;
    for (int i = 0; i < 4; i++) {
        pipert_result rc = k->alloc((void **)buffers[i], (n ? n : 1) * sizeof(float), what[i]);
        if (rc != PIPERT_OK) {
            pt_secant_free(s);
            return rc;
        }
    }
    return PIPERT_OK;
}

void pt_secant_free(pt_secant *s)
{
    if (s->kernels) {
        s->kernels->free(s->prev_grad);
        s->kernels->free(s->prev_used);
        s->kernels->free(s->num);
        s->kernels->free(s->den);
    }
    memset(s, 0, sizeof *s);
}

pipert_result pt_secant_compensate(pt_secant *s, const pt_optimizer *opt, float *grads,
                                   const float *now, const float *used,
                                   const pt_param_region *regions, int n_regions, double lr,
                                   double scale)
{
    if (!s->kernels)
        return pt_fail(PIPERT_ERR_UNSUPPORTED, "secant compensation: not initialised");
    if (!(isfinite(scale) && scale > 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "secant compensation: scale %g must be finite and > 0",
                       scale);
    if (!(isfinite(lr) && lr > 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "secant compensation: learning rate %g must be "
                                               "finite and > 0", lr);
    const pt_secant_coeffs c = {
        .beta = (float)PT_SECANT_DECAY,
        .scale = (float)scale,
        .cap = (float)(1.0 / lr),
        .inv_bias2 = opt->t ? (float)(1.0 / (1.0 - pow(opt->settings.beta2, (double)opt->t))) : 0,
        .eps = (float)opt->settings.eps,
        .learn = s->pairs > 0,
        .apply = s->pairs > s->warmup && opt->t > 0,
    };
    for (int i = 0; i < n_regions; i++) {
        const pt_param_region *r = &regions[i];
        if (r->numel == 0) continue;
        const size_t o = r->offset;
        s->kernels->secant_compensate(grads + o, now + o, used + o, s->prev_grad + o,
                                      s->prev_used + o, s->num + o, s->den + o, opt->v + o,
                                      r->numel, &c);
    }
    s->pairs++;
    return PIPERT_OK;
}
