/* The measured size of a stage's optimizer updates, per tensor: a running mean
 * of ‖θ_t − θ_{t−1}‖² over recent steps (weight PT_UPDATE_SIZE_DECAY on the past),
 * which bounds the extrapolation of lookahead = predict-damped (staleness.h).
 * It keeps one scratch copy of the parameters, in backend memory. */
#ifndef PT_UPDATE_SIZE_H
#define PT_UPDATE_SIZE_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "train/optimizer.h"

/* mean_square ← decay·mean_square + (1 − decay)·‖Δθ‖²: about the last ten steps. */
#define PT_UPDATE_SIZE_DECAY 0.9

typedef struct pt_update_size {
    const pt_kernels *kernels;
    size_t n;
    int n_regions;
    float *before;       /* θ before the step being measured [n], backend memory */
    double *mean_square; /* per region, host */
    long measured;       /* steps measured so far */
} pt_update_size;

/* Allocates the scratch copy for n parameters in n_regions tensors; on
 * failure *u is left empty (pt_update_size_free is then a no-op). */
pipert_result pt_update_size_init(pt_update_size *u, const pt_kernels *k, size_t n, int n_regions);
void pt_update_size_free(pt_update_size *u);

/* Around one optimizer step: remember θ, then measure each region's ‖Δθ‖². */
void pt_update_size_before_step(pt_update_size *u, const float *params);
void pt_update_size_after_step(pt_update_size *u, const float *params,
                               const pt_param_region *regions);

/* The running root mean square of region i's update norm (0 before the first step). */
double pt_update_size_rms(const pt_update_size *u, int region);

/* norms[i] = ‖a − b‖ over region i; a's elements in the regions are
 * overwritten (with b − a). */
void pt_region_distances(const pt_kernels *k, float *a, const float *b,
                         const pt_param_region *regions, int n_regions, double *norms);

#endif
