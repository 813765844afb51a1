/* The outer loop that diloco, streaming-diloco and co2 share (ALGORITHMS.md
 * §4.3–4.5): replicas train alone for a while, then exchange how far they
 * moved from the outer parameters θ̃ and take one outer optimizer step.
 *
 * The three methods are one engine with different plans:
 *
 *   method            fragments          delay τ   merge α   outer rule
 *   diloco            1 (everything)     0         0         Nesterov SGD
 *   streaming-diloco  dp.fragments       dp.overlap dp.alpha  Nesterov SGD
 *   co2               1 (everything)     H         0         heavy ball, Λ, clip φ
 *
 * At optimizer step t (the step every replica agrees on, never a local
 * counter), in this order:
 *   1. the fragment posted τ steps ago is applied: the mean over replicas of
 *      Δ_r = θ̃ − θ_r (the pseudo-gradient) moves θ̃ by one outer step;
 *   2. the fragment whose turn it is posts Δ_r = θ̃ − θ_r for its parameters
 *      (a non-blocking mean all-reduce); with τ = 0 it is applied at once;
 *   3. every fragment applied in this step merges θ ← α·θ + (1−α)·θ̃, in θ
 *      and in the newest weight stash.
 * CO2 posts between its outer step and its restart, so what it posts is
 * measured from the θ̃ it will be applied to: the mean of Δ_r is then exactly
 * θ̃ − θ̄_stale of §4.5. Exactly one fragment is in flight at a time. */
#ifndef PT_DP_OUTER_H
#define PT_DP_OUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "dp/coupling.h"

/* ---- the outer step -------------------------------------------------------- */

typedef struct pt_outer_rule {
    double lr;       /* η */
    double momentum; /* μ (DiLoCo) or β (CO2) */
    bool nesterov;   /* true: PyTorch SGD(nesterov=True), step along Δ + μ·v; false: along v */
    double clip;     /* φ > 0: v is clamped to [−φ, φ] element-wise before the step; 0: no clip */
} pt_outer_rule;

/* The outer step's η and μ as a method takes them: dp.outer_lr and dp.outer_momentum where they
 * are set, the method's own where they are left at theirs (η 0, μ negative: runtime/config_schema.c).
 * The method's own are the values measured best for it (BENCHMARKS.md "Defaults"). */
static inline pt_outer_rule pt_outer_rule_of(const pt_dp_settings *dp, double own_lr,
                                             double own_momentum, bool nesterov)
{
    return (pt_outer_rule){.lr = dp->outer_lr > 0 ? dp->outer_lr : own_lr,
                           .momentum = dp->outer_momentum >= 0 ? dp->outer_momentum : own_momentum,
                           .nesterov = nesterov};
}

/* delta[n] = outer − local: the pseudo-gradient of one replica (delta may be
 * local). Its mean over replicas is Δ = θ̃ − mean_r θ_r, a descent direction:
 * where the replicas went below θ̃, Δ > 0 and the outer step moves θ̃ down. */
void pt_outer_pseudo_gradient(float *delta, const float *outer, const float *local, size_t n);

/* One outer step on n elements, the pseudo-gradient divided by penalty Λ ≥ 1:
 *   v ← μ·v + Δ/Λ;  if φ > 0: v ← clamp(v, −φ, φ);
 *   θ̃ ← θ̃ − η·(Δ/Λ + μ·v)   (nesterov)   or   θ̃ ← θ̃ − η·v   (heavy ball). */
void pt_outer_step(const pt_outer_rule *rule, double penalty, float *outer, float *momentum,
                   const float *delta, size_t n);

/* local[n] ← α·local + (1−α)·outer, in place: α = 1 keeps the local
 * parameters, α = 0 takes the outer ones exactly. */
void pt_outer_merge(float *local, const float *outer, double alpha, size_t n);

/* CO2's adaptive staleness gap penalty, Λ = 1 + ‖gap‖/‖fresh‖ (1 when fresh
 * is 0): the stale pseudo-gradient θ̃ − θ̄_stale is the round's own progress
 * (fresh, measured from where the round started) plus the distance θ̃ moved
 * while that round's average was in flight (gap = −η·v, the last outer
 * step); Λ scales the stale update down by how large the gap is against the
 * progress it carries. gap_norm and fresh_norm are Euclidean norms. */
double pt_outer_adaptive_penalty(double gap_norm, double fresh_norm);

/* ---- fragments and their schedule ------------------------------------------- */

/* Fragment slots for P block fragments: 1 when P = 1 (everything syncs
 * together), else P + 1 (block l → slot l mod P, and slot P for the
 * embeddings, final norm and head). */
int pt_outer_slots(int block_fragments);

/* The slot of a tensor by its global name ("h.7.attn.c_proj.weight" → 7 mod P). */
int pt_outer_slot_of(const char *tensor_name, int block_fragments);

/* The slot that posts at optimizer step `step` (1-based), or −1: slot p posts
 * at the steps t with t ≡ p·⌊H/slots⌋ (mod H). A pure function of the step,
 * so every replica posts the same slot at the same step. */
int pt_outer_slot_at(long step, long period, int slots);

/* ---- the engine -------------------------------------------------------------- */

typedef struct pt_outer_plan {
    const char *method;  /* the method's name, in messages and descriptors */
    pt_outer_rule rule;
    long period;         /* H */
    int block_fragments; /* P ≥ 1 */
    long delay;          /* τ: steps between posting a fragment and applying it */
    double alpha;        /* the merge after applying; 0 = restart from θ̃ */
    double penalty;      /* Λ ≥ 1, or 0 for CO2's adaptive Λ */
    bool evaluate_outer; /* validation evaluates θ̃ (else the local θ) */
} pt_outer_plan;

/* Checks the plan against the configuration (PIPERT_ERR_CONFIG naming the
 * keys) and makes the method's state. */
pipert_result pt_outer_create(const pt_coupling_options *options, const pt_outer_plan *plan,
                              void **state);
pipert_result pt_outer_after_backward(void *state, pt_coupling_point *at, pt_coupling_metrics *m);
pipert_result pt_outer_after_step(void *state, pt_coupling_point *at, pt_coupling_metrics *m);
const float *pt_outer_eval_params(void *state);
pipert_result pt_outer_save(void *state, pt_safetensors_writer *w);
pipert_result pt_outer_load(void *state, const pt_safetensors *st, const char *path);
void pt_outer_destroy(void *state);
void pt_outer_suspend(void *state);
pipert_result pt_outer_regroup(void *state, const pt_coupling_options *options,
                               const pt_coupling_point *at);

/* The calls of a method built on the engine, for its pt_coupling_method. */
/* What a plan sends (pt_coupling_method.traffic): a fragment every period/slots steps,
 * applied `delay` steps later. */
void pt_outer_traffic(const pt_outer_plan *plan, pt_coupling_traffic *out);

/* The calls and the costs the three methods share: θ̃ and its momentum, in host memory, and
 * on a GPU a device copy of θ̃ for validation. */
#define PT_OUTER_CALLS                                                                             \
    .param_copies = 2, .device_param_copies = 1,                                                   \
    .after_backward = pt_outer_after_backward, .after_step = pt_outer_after_step,                  \
    .eval_params = pt_outer_eval_params, .save = pt_outer_save, .load = pt_outer_load,             \
    .destroy = pt_outer_destroy, .suspend = pt_outer_suspend, .regroup = pt_outer_regroup

#endif
