/* The secant delay compensation of lookahead = nesterov-secant
 * (docs/STALENESS.md): a stale gradient g = ∇f(w_f), computed at the stashed
 * weights w_f, is carried to the weights θ it is applied to by a first-order
 * step whose Hessian is a diagonal κ measured from the run itself, per element,
 * as a running secant of consecutive backwards:
 *
 *   Δw = w_j − w_{j−1},  Δg = g_j − g_{j−1}      (microbatches j−1 and j, raw gradients)
 *   κ  = clamp( mean(Δg·Δw) / mean(Δw²), 0, d/γ(t) ),   d = √v̂ + ε
 *   g̃  = g + s·κ⊙(θ − w_f)
 *
 * For a stage τ ≥ 1 steps stale the optimizer step between w_{j−1} and w_j
 * used an older microbatch's gradient, so the noise of g_j and g_{j−1} is
 * independent of Δw and the ratio is an unbiased regression of the gradient's
 * change on the weights' (the last stage, τ = 0, keeps no stash and is not
 * compensated). The cap keeps one element's correction within the step size
 * that Adam gives it. Memory: four copies of the stage's parameters (the
 * previous gradient and stash, and the two running means). The look-ahead
 * also shifts half of a stale stage's raw-gradient step to its momentum
 * (PT_SECANT_MOMENTUM_SHIFT). */
#ifndef PT_SECANT_H
#define PT_SECANT_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "train/optimizer.h"

#define PT_SECANT_DECAY 0.99 /* weight of the past in the running means: ~100 pairs */
#define PT_SECANT_SCALE 2.0  /* s, the staleness study's (1 and 2 measured, BENCHMARKS.md) */
#define PT_SECANT_WARMUP 20  /* pairs measured before the compensation starts, by default */
/* A stale stage of nesterov-secant also moves this fraction of NAdam's raw-gradient
 * coefficient to its momentum's (pt_optimizer_settings.momentum_shift): the newest gradient
 * is the stalest part of the step, the running mean the least (staleness study, session 12). */
#define PT_SECANT_MOMENTUM_SHIFT 0.5

typedef struct pt_secant {
    const pt_kernels *kernels;
    float *prev_grad, *prev_used; /* the previous backward's raw gradient and stash [n] */
    float *num, *den;             /* running means of Δg·Δw and Δw² [n] */
    long pairs;                   /* backwards seen; the first sets prev_* only */
    long warmup;                  /* pairs measured before the compensation starts */
} pt_secant;

/* Allocates the four buffers for n parameters in backend memory (zeroed); the
 * compensation starts after `warmup` pairs (≤ 0: PT_SECANT_WARMUP). On
 * failure *s is left empty (pt_secant_free is then a no-op). */
pipert_result pt_secant_init(pt_secant *s, const pt_kernels *k, size_t n, long warmup);
void pt_secant_free(pt_secant *s);

/* One backward's gradient `grads`, computed at `used`, learned from and (once
 * s->warmup pairs were seen and the optimizer has a v) compensated
 * towards `now`, region by region. lr is γ of the step the gradient goes
 * into; scale is s. PIPERT_ERR_UNSUPPORTED when the backend has no
 * secant_compensate kernel, PIPERT_ERR_INVALID_ARG for a scale or lr that is
 * not finite and > 0. */
pipert_result pt_secant_compensate(pt_secant *s, const pt_optimizer *opt, float *grads,
                                   const float *now, const float *used,
                                   const pt_param_region *regions, int n_regions, double lr,
                                   double scale);

#endif
