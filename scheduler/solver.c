#include "scheduler/solver.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "scheduler/job_model.h"

/* ---- the split: a dynamic programme over (stage, blocks) ----------------------- */

/* Whether stage s of S holding blocks [k, l) fits in `memory` bytes (≤ 0: no limit). */
static bool stage_fits(const pipert_config *config, int S, int s, int k, int l, double memory)
{
    if (!(memory > 0)) return true;
    pt_stage_plan plan = {.stages = S};
    plan.bounds[s] = k;
    plan.bounds[s + 1] = l;
    const pt_cost_device any = {1, 1, 0, 1, 0}; /* memory does not depend on the device's speed */
    pt_stage_cost cost;
    if (pt_cost_stage(config, &plan, s, &any, &cost) != PIPERT_OK) return false;
    return pt_cost_stage_memory(&cost, pt_cost_in_flight(config, S, s)) <= memory;
}

pipert_result pt_solver_split_within(const pipert_config *config, int S, const double *speed,
                                     const double *memory, int *bounds)
{
    const pt_gpt_config model = pt_gpt_config_from_settings(config);
    const int L = model.n_layer, T = model.block_size;
    if (S < 1 || S > L || S > PT_PLAN_MAX_STAGES)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "split: %d stages for %d blocks", S, L);
    /* best[s][l]: the slowest of stages 0..s−1 holding blocks [0, l), at its least */
    double *best = malloc((size_t)(S + 1) * (size_t)(L + 1) * sizeof *best);
    int *from = malloc((size_t)(S + 1) * (size_t)(L + 1) * sizeof *from);
    if (!best || !from) {
        free(best);
        free(from);
        return pt_fail(PIPERT_ERR_NOMEM, "split: out of memory");
    }
#define AT(s, l) ((s) * (L + 1) + (l))
    for (int i = 0; i < (S + 1) * (L + 1); i++) best[i] = DBL_MAX;
    best[AT(0, 0)] = 0;
    for (int s = 1; s <= S; s++)
        for (int l = s; l <= L - (S - s); l++)
            for (int k = s - 1; k < l; k++) {
                if (best[AT(s - 1, k)] == DBL_MAX) continue;
                if (memory && !stage_fits(config, S, s - 1, k, l, memory[s - 1])) continue;
                /* the last stage also carries the head (plan.h) */
                const double t = pt_plan_stage_flops(&model, T, k, l) / speed[s - 1];
                const double slowest = fmax(best[AT(s - 1, k)], t);
                if (slowest < best[AT(s, l)]) best[AT(s, l)] = slowest, from[AT(s, l)] = k;
            }
    const bool found = best[AT(S, L)] < DBL_MAX;
    bounds[S] = L;
    for (int s = S; found && s > 0; s--) bounds[s - 1] = from[AT(s, bounds[s])];
#undef AT
    free(best);
    free(from);
    if (!found)
        return pt_fail(PIPERT_ERR_CONFIG, "split: no split of %d blocks over %d stages fits the "
                                          "devices' memory", L, S);
    return PIPERT_OK;
}

pipert_result pt_solver_split(const pipert_config *config, int S, const double *speed, int *bounds)
{
    return pt_solver_split_within(config, S, speed, NULL, bounds);
}

/* ---- candidates ----------------------------------------------------------------- */

typedef enum placement_mode { PLACE_PACK, PLACE_SPREAD, PLACE_SPAN, PLACE_STAGES } placement_mode;

typedef struct search {
    const pt_solver_input *in;
    int total_devices;
    pt_solver_result *out;
    int capacity;
} search;

/* Sites in order of their devices' speed, fastest first. */
static void sites_by_speed(const pt_solver_input *in, int *order)
{
    for (int i = 0; i < in->n_sites; i++) order[i] = i;
    for (int i = 1; i < in->n_sites; i++)
        for (int k = i; k > 0; k--) {
            const double a = in->sites[order[k]].device.flops * in->sites[order[k]].device.efficiency,
                         b = in->sites[order[k - 1]].device.flops *
                             in->sites[order[k - 1]].device.efficiency;
            if (a <= b) break;
            const int t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
}

/* Places R pipelines of S stages (false if they do not fit):
 *   PACK    each inside one site, filling the fastest site before the next
 *           (replicas that fit in one site couple over its fast link);
 *   SPREAD  each inside one site, round-robin over the sites that fit one
 *           (fewer replicas per site when sites are slow or small);
 *   SPAN    the ranks in site order, a pipeline crossing where a site ends
 *           (the baseline that puts activations on the slow links);
 *   STAGES  the ranks in site order stage by stage: every replica of a stage
 *           together (its coupling inside a site), each pipeline crossing
 *           between the sites in order (its activations on the slow links). */
static bool place(const pt_solver_input *in, int S, int R, placement_mode mode, int *site_of)
{
    int order[256], free_devices[256];
    sites_by_speed(in, order);
    for (int i = 0; i < in->n_sites; i++) free_devices[i] = in->sites[i].devices;
    int k = 0;
    if (mode == PLACE_STAGES) {
        for (int s = 0; s < S; s++)
            for (int r = 0; r < R; r++) {
                while (k < in->n_sites && free_devices[order[k]] == 0) k++;
                if (k == in->n_sites) return false;
                site_of[r * S + s] = order[k];
                free_devices[order[k]]--;
            }
        return true;
    }
    for (int r = 0; r < R; r++) {
        if (mode == PLACE_SPAN) {
            for (int s = 0; s < S; s++) {
                while (k < in->n_sites && free_devices[order[k]] == 0) k++;
                if (k == in->n_sites) return false;
                site_of[r * S + s] = order[k];
                free_devices[order[k]]--;
            }
            continue;
        }
        int chosen = -1;
        for (int i = 0; i < in->n_sites && chosen < 0; i++) {
            const int site = order[mode == PLACE_SPREAD ? (r + i) % in->n_sites : i];
            if (free_devices[site] >= S) chosen = site;
        }
        if (chosen < 0) return false;
        for (int s = 0; s < S; s++) site_of[r * S + s] = chosen;
        free_devices[chosen] -= S;
    }
    return true;
}

static double speed_of(const pt_cost_device *d) { return d->flops * d->efficiency; }

/* The split for a placement: stage s takes the slowest device and the least memory any
 * replica gives it (every replica runs the same split); PIPERT_ERR_CONFIG when none fits. */
static pipert_result split_for(const pt_solver_input *in, int S, int R, const int *site_of,
                               pt_stage_plan *plan)
{
    double speed[PT_PLAN_MAX_STAGES], memory[PT_PLAN_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        speed[s] = DBL_MAX;
        memory[s] = 0;
        for (int r = 0; r < R; r++) {
            const pt_cost_device *d = &in->sites[site_of[r * S + s]].device;
            speed[s] = fmin(speed[s], speed_of(d));
            if (d->memory_bytes > 0 && (!(memory[s] > 0) || d->memory_bytes < memory[s]))
                memory[s] = d->memory_bytes;
        }
    }
    plan->stages = S;
    return pt_solver_split_within(in->config, S, speed, memory, plan->bounds);
}

/* Keeps the `keep` fastest plans, fastest first. */
static pipert_result keep_plan(search *x, const pt_solver_plan *plan)
{
    pt_solver_result *out = x->out;
    int at = out->n_plans;
    while (at > 0 && out->plans[at - 1].tokens_per_s < plan->tokens_per_s) at--;
    if (at >= x->in->keep) {
        free(plan->site_of);
        return PIPERT_OK;
    }
    if (out->n_plans == x->in->keep) free(out->plans[--out->n_plans].site_of);
    memmove(&out->plans[at + 1], &out->plans[at], (size_t)(out->n_plans - at) * sizeof *out->plans);
    out->plans[at] = *plan;
    out->n_plans++;
    return PIPERT_OK;
}

/* Simulates the placement in `plan` (site_of set) and fills its prediction;
 * *fits: whether the fullest device has the memory. */
static pipert_result predict(const pt_solver_input *in, pt_solver_plan *plan,
                             const pt_cost_device *devices, bool *fits)
{
    const int S = plan->stages, R = plan->replicas;
    pt_stage_plan split;
    const pipert_result split_rc = split_for(in, S, R, plan->site_of, &split);
    if (split_rc == PIPERT_ERR_CONFIG) { /* no split fits the devices' memory */
        *fits = false;
        return PIPERT_OK;
    }
    PT_TRY(split_rc);
    memcpy(plan->bounds, split.bounds, (size_t)(S + 1) * sizeof *plan->bounds);
    pt_job_model model = {0};
    const pt_job_model_input job = {.config = in->config, .plan = &split, .replicas = R,
                                    .devices = devices, .site_of = plan->site_of,
                                    .n_sites = in->n_sites, .links = in->links,
                                    .local = in->links[0]};
    PT_TRY(pt_job_model_build(&job, &model));
    pt_sim_result result = {0};
    pipert_result rc = pt_simulate(&model.in, &result);
    if (rc == PIPERT_OK) {
        int rank;
        plan->peak_memory_bytes = pt_job_model_peak_memory(&model, &result, &rank);
        plan->step_s = result.step_s;
        plan->tokens_per_s = model.tokens_per_step / result.step_s;
        plan->coupling_bytes_per_step = pt_job_model_coupling_bytes_per_step(&model, &result);
        *fits = !(devices[rank].memory_bytes > 0) || plan->peak_memory_bytes <= devices[rank].memory_bytes;
    }
    pt_sim_result_free(&result);
    pt_job_model_free(&model);
    return rc;
}

static pipert_result evaluate(search *x, int S, int R, placement_mode mode)
{
    const pt_solver_input *in = x->in;
    pt_solver_plan plan = {.stages = S, .replicas = R,
                           .spans_sites = mode == PLACE_SPAN || mode == PLACE_STAGES};
    plan.site_of = malloc((size_t)R * (size_t)S * sizeof *plan.site_of);
    pt_cost_device *devices = malloc((size_t)R * (size_t)S * sizeof *devices);
    pipert_result rc = plan.site_of && devices ? PIPERT_OK
                                               : pt_fail(PIPERT_ERR_NOMEM, "solver: out of memory");
    bool fits = false, placed = rc == PIPERT_OK && place(in, S, R, mode, plan.site_of);
    for (int i = 0; placed && i < R * S; i++) devices[i] = in->sites[plan.site_of[i]].device;
    if (placed) rc = predict(in, &plan, devices, &fits);
    free(devices);
    if (rc == PIPERT_OK && placed) {
        x->out->candidates++;
        if (!fits) x->out->refused_memory++;
    }
    if (rc != PIPERT_OK || !placed || !fits) {
        free(plan.site_of);
        return rc;
    }
    return keep_plan(x, &plan); /* keeps or frees plan.site_of */
}

/* The replica counts tried for S stages, largest first: the most whole
 * pipelines, halving down to 16, every count from 16 to 1, and the
 * pipelines the fastest k sites hold together (packing them exactly).
 * Returns how many (at most capacity). */
static int replica_counts(const pt_solver_input *in, int S, int *counts, int capacity)
{
    int n = 0, order[256];
    bool seen[4096] = {false};
#define ADD(r)                                                                                     \
    do {                                                                                           \
        const int r_ = (r);                                                                        \
        if (r_ >= 1 && n < capacity && (r_ >= 4096 || !seen[r_])) {                                \
            if (r_ < 4096) seen[r_] = true;                                                        \
            counts[n++] = r_;                                                                      \
        }                                                                                          \
    } while (0)
    int most = 0;
    for (int i = 0; i < in->n_sites; i++) most += in->sites[i].devices / S;
    for (int r = most; r > 16; r /= 2) ADD(r);
    for (int r = 16; r >= 1; r--) ADD(r);
    sites_by_speed(in, order);
    int together = 0;
    for (int i = 0; i < in->n_sites; i++) {
        together += in->sites[order[i]].devices / S;
        ADD(together);
    }
#undef ADD
    return n;
}

static pipert_result check_input(const pt_solver_input *in, int *total)
{
    if (in->n_sites < 1 || in->n_sites > 256 || in->keep < 1)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "solver: %d sites, keep %d", in->n_sites, in->keep);
    *total = 0;
    for (int i = 0; i < in->n_sites; i++) {
        if (in->sites[i].devices < 0)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "solver: site %d has %d devices", i,
                           in->sites[i].devices);
        *total += in->sites[i].devices;
        for (int k = 0; k < in->n_sites; k++)
            if (!(in->links[i * in->n_sites + k].bytes_per_s > 0))
                return pt_fail(PIPERT_ERR_INVALID_ARG,
                               "solver: the link from site %d to site %d has no bandwidth", i, k);
    }
    if (*total < 1) return pt_fail(PIPERT_ERR_INVALID_ARG, "solver: the sites have no devices");
    return PIPERT_OK;
}

pipert_result pt_solve(const pt_solver_input *in, pt_solver_result *out)
{
    *out = (pt_solver_result){0};
    search x = {.in = in, .out = out};
    PT_TRY(check_input(in, &x.total_devices));
    out->plans = calloc((size_t)in->keep, sizeof *out->plans);
    if (!out->plans) return pt_fail(PIPERT_ERR_NOMEM, "solver: out of memory");
    const int L = in->config->model.n_layer;
    int max_stages = in->max_stages > 0 && in->max_stages < L ? in->max_stages : L;
    if (max_stages > PT_PLAN_MAX_STAGES) max_stages = PT_PLAN_MAX_STAGES;
    pipert_result rc = PIPERT_OK;
    for (int S = 1; S <= max_stages && rc == PIPERT_OK; S++) {
        int counts[512];
        const int n_counts = replica_counts(in, S, counts, 512);
        for (int k = 0; k < n_counts && rc == PIPERT_OK; k++) {
            const int R = counts[k];
            rc = evaluate(&x, S, R, PLACE_PACK);
            if (rc == PIPERT_OK && in->n_sites > 1 && R > 1) rc = evaluate(&x, S, R, PLACE_SPREAD);
        }
        if (in->allow_spanning && in->n_sites > 1 && S > 1 && S <= x.total_devices && rc == PIPERT_OK)
            rc = evaluate(&x, S, x.total_devices / S, PLACE_SPAN);
        /* (with one replica it is SPAN's placement) */
        if (in->allow_spanning && in->n_sites > 1 && S > 1 && 2 * S <= x.total_devices &&
            rc == PIPERT_OK)
            rc = evaluate(&x, S, x.total_devices / S, PLACE_STAGES);
    }
    if (rc == PIPERT_OK && out->n_plans == 0)
        rc = pt_fail(PIPERT_ERR_CONFIG, "plan: no placement fits: %d of %d candidates need more "
                     "memory than their devices have", out->refused_memory, out->candidates);
    if (rc != PIPERT_OK) pt_solver_result_free(out);
    return rc;
}

void pt_solver_result_free(pt_solver_result *result)
{
    for (int i = 0; i < result->n_plans; i++) free(result->plans[i].site_of);
    free(result->plans);
    *result = (pt_solver_result){0};
}
