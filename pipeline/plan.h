/* Which blocks each pipeline stage runs: S contiguous ranges covering the L
 * blocks, each block exactly once (ALGORITHMS.md §5: layers silently dropped on
 * uneven splits is a mistake others made). */
#ifndef PT_PLAN_H
#define PT_PLAN_H

#include "models/gpt.h"

/* Stage s runs blocks [bounds[s], bounds[s+1]); bounds[0] = 0, bounds[S] = L. */
typedef struct pt_stage_plan {
    int stages;
    int bounds[257];
} pt_stage_plan;

#define PT_PLAN_MAX_STAGES 256

/* Model FLOPs per token of a stage: its blocks, plus the head on the last
 * stage (forward and backward: 6 per weight, 12·C·T per block for attention). */
double pt_plan_stage_flops(const pt_gpt_config *c, int T, int first, int last);

/* The split that minimises the most expensive stage; of those, the one with
 * the fewest blocks on the front stages (every boundary as early as it can
 * be: the asynchronous pipeline's first stages are its stalest). Every stage
 * gets at least one block. */
pipert_result pt_plan_balanced(const pt_gpt_config *c, int T, int stages, pt_stage_plan *out);

/* An explicit split, "3,3,3,3": one count per stage, all ≥ 1, summing to L.
 * Anything else is an error naming the problem. */
pipert_result pt_plan_parse(const char *layers, int n_layer, int stages, pt_stage_plan *out);

#endif
