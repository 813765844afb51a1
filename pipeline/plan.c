#include "pipeline/plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

double pt_plan_stage_flops(const pt_gpt_config *c, int T, int first, int last)
{
    const double C = c->n_embd;
    double per_block = 6.0 * (12.0 * C * C + 13.0 * C) + 12.0 * C * T;
    double flops = per_block * (last - first);
    if (last == c->n_layer) flops += 6.0 * ((double)c->vocab_size * C + 2.0 * C);
    return flops;
}

static pipert_result check_stages(int stages, int n_layer)
{
    if (stages < 1 || stages > PT_PLAN_MAX_STAGES)
        return pt_fail(PIPERT_ERR_CONFIG, "--stages %d: must be in [1, %d]", stages,
                       PT_PLAN_MAX_STAGES);
    if (stages > n_layer)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "%d stages for model.n_layer=%d blocks: every stage needs at least one block",
                       stages, n_layer);
    return PIPERT_OK;
}

/* Can the blocks be cut into `stages` ranges, each costing at most `limit`?
 * Greedy from the back: each stage, the last first, takes as many blocks as
 * fit, leaving at least one per stage before it (costs only grow with more
 * blocks, so greedy finds a split whenever one exists). The cut points go to
 * bounds; each is the smallest of any split under the limit, so the front
 * stages hold as few blocks as the limit allows: they are the ones the
 * asynchronous pipeline runs most steps stale, where staleness costs the most
 * quality (docs/STALENESS.md). */
static bool fits_under(const pt_gpt_config *c, int T, int stages, double limit, int *bounds)
{
    const int L = c->n_layer;
    bounds[stages] = L;
    for (int s = stages - 1, last = L; s >= 0; s--) {
        int first = 0;
        if (s > 0) {
            first = last - 1;
            while (first > s && pt_plan_stage_flops(c, T, first - 1, last) <= limit) first--;
        }
        if (pt_plan_stage_flops(c, T, first, last) > limit) return false;
        bounds[s] = first;
        last = first;
    }
    return true;
}

pipert_result pt_plan_balanced(const pt_gpt_config *c, int T, int stages, pt_stage_plan *out)
{
    PT_TRY(check_stages(stages, c->n_layer));
    out->stages = stages;
    /* The answer is one of the O(L²) range costs; binary search on the limit
     * over those candidates would do, but bisection on doubles is simpler and
     * ends exactly once the interval is below the cheapest block. */
    double low = 0, high = pt_plan_stage_flops(c, T, 0, c->n_layer);
    for (int i = 0; i < 200 && high - low > 1e-9 * high; i++) {
        double mid = 0.5 * (low + high);
        if (fits_under(c, T, stages, mid, out->bounds)) high = mid;
        else low = mid;
    }
    if (!fits_under(c, T, stages, high, out->bounds))
        return pt_fail(PIPERT_ERR_INTERNAL, "plan: no split of %d blocks into %d stages", c->n_layer,
                       stages);
    return PIPERT_OK;
}

pipert_result pt_plan_parse(const char *layers, int n_layer, int stages, pt_stage_plan *out)
{
    PT_TRY(check_stages(stages, n_layer));
    out->stages = stages;
    out->bounds[0] = 0;
    const char *p = layers;
    int s = 0;
    for (; *p; s++) {
        char *end;
        errno = 0;
        long count = strtol(p, &end, 10);
        if (end == p || errno || (*end && (*end != ',' || end[1] == '\0')))
            return pt_fail(PIPERT_ERR_CONFIG, "plan.layers=%s: '%s' is not a list of block counts",
                           layers, p);
        if (s == stages)
            return pt_fail(PIPERT_ERR_CONFIG, "plan.layers=%s: more entries than the %d stages",
                           layers, stages);
        if (count < 1)
            return pt_fail(PIPERT_ERR_CONFIG, "plan.layers=%s: stage %d gets %ld blocks (at least 1)",
                           layers, s, count);
        if (out->bounds[s] + count > n_layer)
            return pt_fail(PIPERT_ERR_CONFIG,
                           "plan.layers=%s: assigns more than model.n_layer=%d blocks", layers,
                           n_layer);
        out->bounds[s + 1] = out->bounds[s] + (int)count;
        p = *end ? end + 1 : end;
    }
    if (s != stages)
        return pt_fail(PIPERT_ERR_CONFIG, "plan.layers=%s: %d entries for %d stages", layers, s,
                       stages);
    if (out->bounds[stages] != n_layer)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "plan.layers=%s: assigns %d of model.n_layer=%d blocks (blocks %d..%d left out)",
                       layers, out->bounds[stages], n_layer, out->bounds[stages], n_layer - 1);
    return PIPERT_OK;
}
