/* The measured size of the optimizer's updates (update_size.h). */
#include "train/update_size.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

pipert_result pt_update_size_init(pt_update_size *u, const pt_kernels *k, size_t n, int n_regions)
{
    memset(u, 0, sizeof *u);
    double *mean_square = calloc((size_t)(n_regions > 0 ? n_regions : 1), sizeof *mean_square);
    if (!mean_square) return pt_fail(PIPERT_ERR_NOMEM, "update size: out of memory");
    float *before = NULL;
    pipert_result rc = k->alloc((void **)&before, n * sizeof(float), "parameters before the step");
    if (rc != PIPERT_OK) {
        free(mean_square);
        return rc;
    }
    *u = (pt_update_size){.kernels = k, .n = n, .n_regions = n_regions, .before = before,
                          .mean_square = mean_square};
    return PIPERT_OK;
}

void pt_update_size_free(pt_update_size *u)
{
    if (u->kernels) u->kernels->free(u->before);
    free(u->mean_square);
    memset(u, 0, sizeof *u);
}

void pt_update_size_before_step(pt_update_size *u, const float *params)
{
    u->kernels->copy(u->before, params, u->n * sizeof(float));
}

void pt_region_distances(const pt_kernels *k, float *a, const float *b,
                         const pt_param_region *regions, int n_regions, double *norms)
{
    for (int i = 0; i < n_regions; i++) {
        const pt_param_region *r = &regions[i];
        norms[i] = 0;
        if (r->numel == 0) continue;
        float *x = a + r->offset;
        k->scale(x, -1.0f, r->numel);                      /* −a */
        k->residual_forward(x, b + r->offset, x, r->numel); /* b − a */
        norms[i] = sqrt(k->sum_squares(x, r->numel));
    }
}

void pt_update_size_after_step(pt_update_size *u, const float *params,
                               const pt_param_region *regions)
{
    const double keep = u->measured ? PT_UPDATE_SIZE_DECAY : 0.0; /* the first sets it */
    for (int i = 0; i < u->n_regions; i++) {
        double norm;
        pt_region_distances(u->kernels, u->before, params, &regions[i], 1, &norm);
        u->mean_square[i] = keep * u->mean_square[i] + (1.0 - keep) * norm * norm;
    }
    u->measured++;
}

double pt_update_size_rms(const pt_update_size *u, int region)
{
    return sqrt(u->mean_square[region]);
}
