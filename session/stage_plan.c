/* Which blocks of the model each stage runs: plan.layers, or the split balanced by compute
 * (pipeline/plan.h). Every worker computes the same from the job's settings (the job digest
 * makes them the same), so none has to ask the others. */
#include <string.h>

#include "pipeline/plan.h"
#include "session/session_internal.h"

pipert_result pt_session_stage_plan(const pipert_session *s, int stages, pt_stage_plan *plan)
{
    const pt_model_settings *m = &s->config.model;
    const pt_gpt_config model = pt_gpt_config_from_settings(&s->config);
    if (s->config.plan.layers[0]) return pt_plan_parse(s->config.plan.layers, m->n_layer, stages, plan);
    return pt_plan_balanced(&model, m->block_size, stages, plan);
}

pipert_result pt_session_planned_bounds(const pipert_session *s, int *bounds)
{
    pt_stage_plan plan;
    PT_TRY(pt_session_stage_plan(s, s->job.layout.stages, &plan));
    memcpy(bounds, plan.bounds, (size_t)(s->job.layout.stages + 1) * sizeof *bounds);
    return PIPERT_OK;
}

pipert_result pt_session_stage_blocks(const pipert_session *s, int *first, int *last)
{
    pt_stage_plan plan;
    PT_TRY(pt_session_stage_plan(s, s->job.layout.stages, &plan));
    *first = plan.bounds[s->job.stage];
    *last = plan.bounds[s->job.stage + 1];
    return PIPERT_OK;
}
