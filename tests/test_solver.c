/* scheduler/solver.h: the split against brute force over every split, every
 * block placed once on random speeds, and the solver on small clusters —
 * pipelines kept inside sites over a slow link, memory limits obeyed (and a
 * clear error when nothing fits), refusals of links without bandwidth. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp/coupling.h"
#include "scheduler/solver.h"

static pipert_config config_with(const char *json)
{
    pipert_config config;
    pt_config_defaults(&config);
    cr_assert_eq(pt_config_merge_json(&config, json, "test"), PIPERT_OK, "%s", pipert_last_error());
    return config;
}

/* The slowest stage of a split. */
static double slowest(const pipert_config *c, int S, const int *bounds, const double *speed)
{
    const pt_gpt_config m = pt_gpt_config_from_settings(c);
    double worst = 0;
    for (int s = 0; s < S; s++)
        worst = fmax(worst, pt_plan_stage_flops(&m, m.block_size, bounds[s], bounds[s + 1]) / speed[s]);
    return worst;
}

/* Brute force: every split of L blocks into 3 stages. */
static double best_by_brute_force(const pipert_config *c, const double *speed)
{
    const int L = c->model.n_layer;
    double best = DBL_MAX;
    for (int a = 1; a < L; a++)
        for (int b = a + 1; b < L; b++) {
            const int bounds[] = {0, a, b, L};
            best = fmin(best, slowest(c, 3, bounds, speed));
        }
    return best;
}

Test(solver, the_split_is_the_best_of_all_splits)
{
    pipert_config c = config_with("{\"model\": {\"n_layer\": 9}}");
    const double speeds[][3] = {{1, 1, 1}, {1, 2, 4}, {4, 1, 1}, {1, 10, 1}, {3, 1, 2}};
    for (size_t k = 0; k < sizeof speeds / sizeof speeds[0]; k++) {
        int bounds[4];
        cr_assert_eq(pt_solver_split(&c, 3, speeds[k], bounds), PIPERT_OK, "%s", pipert_last_error());
        const double got = slowest(&c, 3, bounds, speeds[k]), best = best_by_brute_force(&c, speeds[k]);
        cr_expect_float_eq(got, best, 1e-9 * best, "speeds %g %g %g: split %d,%d,%d is %g, best %g",
                           speeds[k][0], speeds[k][1], speeds[k][2], bounds[1] - bounds[0],
                           bounds[2] - bounds[1], bounds[3] - bounds[2], got, best);
    }
}

/* Memory of stage s of S holding blocks [k, l), as the simulator would hold it under 1F1B
 * (S − s microbatches at once), from the cost model directly. */
static double stage_memory(const pipert_config *c, int S, int s, int k, int l)
{
    pt_stage_plan plan = {.stages = S};
    plan.bounds[s] = k;
    plan.bounds[s + 1] = l;
    pt_stage_cost cost;
    cr_assert_eq(pt_cost_stage(c, &plan, s, &(pt_cost_device){1, 1, 0, 1, 0}, &cost), PIPERT_OK);
    return pt_cost_stage_memory(&cost, S - s);
}

/* Under memory limits the split is the best of the splits that fit (brute force over all 3-stage
 * splits, the memory of each stage from the cost model), and none at all is a clear error. */
Test(solver, the_split_within_memory_is_the_best_that_fits)
{
    pipert_config c = config_with("{\"model\": {\"n_layer\": 9}, \"pipeline\": {\"schedule\": \"1f1b\", "
                                  "\"microbatches\": 8}}");
    const int L = 9;
    const double speed[3] = {1, 1, 1};
    int free_bounds[4];
    cr_assert_eq(pt_solver_split(&c, 3, speed, free_bounds), PIPERT_OK);
    /* Stage 0 may hold one block fewer than it would like. */
    const double limit0 = stage_memory(&c, 3, 0, 0, free_bounds[1] - 1);
    const double memory[3] = {limit0, 0, 0};
    int bounds[4];
    cr_assert_eq(pt_solver_split_within(&c, 3, speed, memory, bounds), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_expect_leq(stage_memory(&c, 3, 0, 0, bounds[1]), limit0, "stage 0 does not fit");
    double best = DBL_MAX;
    for (int a = 1; a < L; a++)
        for (int b = a + 1; b < L; b++) {
            const int candidate[] = {0, a, b, L};
            if (stage_memory(&c, 3, 0, 0, a) <= limit0)
                best = fmin(best, slowest(&c, 3, candidate, speed));
        }
    cr_expect_float_eq(slowest(&c, 3, bounds, speed), best, 1e-9 * best,
                       "split %d,%d,%d is not the best that fits", bounds[1], bounds[2] - bounds[1],
                       L - bounds[2]);
    cr_expect_lt(bounds[1], free_bounds[1], "the limit changed nothing");
    const double tiny[3] = {1, 1, 1};
    cr_expect_eq(pt_solver_split_within(&c, 3, speed, tiny, bounds), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "memory"), "%s", pipert_last_error());
}

/* Every block exactly once, every stage at least one, on random speeds. */
Test(solver, every_block_is_placed_exactly_once)
{
    pipert_config c = config_with("{\"model\": {\"n_layer\": 12}}");
    srand(7);
    for (int trial = 0; trial < 200; trial++) {
        const int S = 1 + rand() % 12;
        double speed[12];
        for (int s = 0; s < S; s++) speed[s] = 0.1 + (double)(rand() % 100);
        int bounds[13];
        cr_assert_eq(pt_solver_split(&c, S, speed, bounds), PIPERT_OK);
        cr_expect_eq(bounds[0], 0);
        cr_expect_eq(bounds[S], 12);
        for (int s = 0; s < S; s++)
            cr_expect_lt(bounds[s], bounds[s + 1], "trial %d: stage %d is empty", trial, s);
    }
}

/* Two sites of 4 devices joined by a slow link: the best plan keeps every
 * pipeline inside a site, and beats the same stages spanning the sites. */
typedef struct cluster2 {
    pt_solver_site sites[2];
    pt_sim_link links[4];
} cluster2;

static cluster2 two_sites(double slow_factor, double memory)
{
    cluster2 c;
    const pt_cost_device fast = {1e11, 0.8, memory, 1e10, 0};
    pt_cost_device slow = fast;
    slow.flops /= slow_factor;
    c.sites[0] = (pt_solver_site){4, fast};
    c.sites[1] = (pt_solver_site){4, slow};
    c.links[0] = c.links[3] = (pt_sim_link){1e10, 2e-5};     /* inside a site */
    c.links[1] = c.links[2] = (pt_sim_link){100e6 / 8, 0.05}; /* 100 Mbit/s, 50 ms */
    return c;
}

Test(solver, pipelines_stay_inside_sites_over_a_slow_link)
{
    pipert_config c = config_with("{\"dp\": {\"method\": \"sparse\"}}");
    cluster2 k = two_sites(4, 0);
    const pt_solver_input in = {.config = &c, .n_sites = 2, .sites = k.sites, .links = k.links,
                                .allow_spanning = true, .keep = 64};
    pt_solver_result r;
    cr_assert_eq(pt_solve(&in, &r), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_gt(r.n_plans, 1);
    const pt_solver_plan *best = &r.plans[0];
    cr_expect(!best->spans_sites, "the best plan spans sites");
    for (int i = 1; i < r.n_plans; i++)
        cr_expect_geq(r.plans[i - 1].tokens_per_s, r.plans[i].tokens_per_s, "not sorted at %d", i);
    bool saw_spanning = false;
    for (int i = 0; i < r.n_plans; i++)
        if (r.plans[i].spans_sites && r.plans[i].stages > 1) {
            saw_spanning = true;
            cr_expect_lt(r.plans[i].tokens_per_s, best->tokens_per_s);
        }
    cr_expect(saw_spanning, "no spanning candidate was kept among %d", r.n_plans);
    pt_solver_result_free(&r);
}

/* Devices too small for the whole model force a pipeline; every kept plan
 * fits; devices too small for anything are a clear error. */
Test(solver, memory_limits_are_obeyed)
{
    /* parameters dominate (a pipeline's stage 0 holds S microbatches of L/S
     * blocks: as many activations as the whole model) */
    pipert_config c = config_with("{\"model\": {\"n_embd\": 384, \"block_size\": 32}, "
                                  "\"train\": {\"batch_size\": 1}}");
    cluster2 big = two_sites(1, 1e12);
    const pt_solver_input roomy = {.config = &c, .n_sites = 2, .sites = big.sites,
                                   .links = big.links, .keep = 64};
    pt_solver_result r;
    cr_assert_eq(pt_solve(&roomy, &r), PIPERT_OK);
    double whole = 0;
    for (int i = 0; i < r.n_plans; i++)
        if (r.plans[i].stages == 1) whole = fmax(whole, r.plans[i].peak_memory_bytes);
    cr_assert_gt(whole, 0);
    pt_solver_result_free(&r);

    cluster2 tight = two_sites(1, 0.8 * whole);
    const pt_solver_input limited = {.config = &c, .n_sites = 2, .sites = tight.sites,
                                     .links = tight.links, .keep = 64};
    cr_assert_eq(pt_solve(&limited, &r), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_gt(r.refused_memory, 0);
    for (int i = 0; i < r.n_plans; i++) {
        cr_expect_gt(r.plans[i].stages, 1, "a whole model on a device of %g bytes", 0.8 * whole);
        cr_expect_leq(r.plans[i].peak_memory_bytes, 0.8 * whole);
    }
    pt_solver_result_free(&r);

    cluster2 tiny = two_sites(1, 1e5);
    const pt_solver_input nothing = {.config = &c, .n_sites = 2, .sites = tiny.sites,
                                     .links = tiny.links, .keep = 4};
    cr_expect_eq(pt_solve(&nothing, &r), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "memory"), "%s", pipert_last_error());
}

Test(solver, refusals)
{
    pipert_config c = config_with("{}");
    cluster2 k = two_sites(1, 0);
    k.links[1].bytes_per_s = 0;
    const pt_solver_input in = {.config = &c, .n_sites = 2, .sites = k.sites, .links = k.links,
                                .keep = 4};
    pt_solver_result r;
    cr_expect_eq(pt_solve(&in, &r), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "from site 0 to site 1"), "%s", pipert_last_error());
    cluster2 empty = two_sites(1, 0);
    empty.sites[0].devices = empty.sites[1].devices = 0;
    const pt_solver_input none = {.config = &c, .n_sites = 2, .sites = empty.sites,
                                  .links = empty.links, .keep = 4};
    cr_expect_eq(pt_solve(&none, &r), PIPERT_ERR_INVALID_ARG);
}

/* ---- a method the library does not have ------------------------------------ */

/* A dp method of this test's own: allreduce's exchange every other step, with one buffer of
 * its own. It is never run, only planned with: what a new method needs for `pipert plan` is
 * its row (dp/coupling.h), nothing in the scheduler. */
static void every_other_traffic(const pipert_config *config, pt_coupling_traffic *out)
{
    (void)config;
    *out = (pt_coupling_traffic){.every = 2, .lag = 0, .share = 1};
}

static pipert_result every_other_create(const pt_coupling_options *options, void **state)
{
    (void)options, (void)state;
    return pt_fail(PIPERT_ERR_UNSUPPORTED, "every-other is for planning only");
}

static const pt_coupling_method every_other = {
    .name = "every-other",
    .over_all_replicas = true,
    .traffic = every_other_traffic,
    .param_copies = 1,
    .create = every_other_create,
};

/* The plans of `method` for two sites. */
static pt_solver_result plans_with(const char *method)
{
    char json[128];
    snprintf(json, sizeof json, "{\"dp\": {\"method\": \"%s\"}}", method);
    pipert_config c = config_with(json); /* an added method's name is a choice of dp.method */
    cluster2 k = two_sites(2, 0);
    const pt_solver_input in = {.config = &c, .n_sites = 2, .sites = k.sites, .links = k.links,
                                .allow_spanning = true, .keep = 1000};
    pt_solver_result r;
    cr_assert_eq(pt_solve(&in, &r), PIPERT_OK, "%s: %s", method, pipert_last_error());
    return r;
}

static const pt_solver_plan *same_plan(const pt_solver_result *r, const pt_solver_plan *like)
{
    for (int i = 0; i < r->n_plans; i++) {
        const pt_solver_plan *p = &r->plans[i];
        if (p->stages != like->stages || p->replicas != like->replicas) continue;
        bool same = !memcmp(p->bounds, like->bounds, sizeof p->bounds);
        for (int k = 0; same && k < p->stages * p->replicas; k++)
            same = p->site_of[k] == like->site_of[k];
        if (same) return p;
    }
    return NULL;
}

Test(solver, a_method_added_by_a_program_is_planned_from_its_row)
{
    pt_error_clear();
    pipert_config before;
    pt_config_defaults(&before);
    cr_expect_eq(pipert_config_set(&before, "dp.method=every-other"), PIPERT_ERR_CONFIG,
                 "a method nobody added is not a choice");
    cr_assert_eq(pt_coupling_add_method(&every_other), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(pt_coupling_add_method(&every_other), PIPERT_ERR_CONFIG, "added twice");
    cr_expect(strstr(pipert_last_error(), "every-other"), "%s", pipert_last_error());

    pt_solver_result mine = plans_with("every-other"), dense = plans_with("allreduce");
    int compared = 0;
    for (int i = 0; i < mine.n_plans; i++) {
        const pt_solver_plan *p = &mine.plans[i], *q = same_plan(&dense, p);
        if (!q || p->replicas < 2) continue;
        /* the same exchange as allreduce's, every other step */
        cr_expect_float_eq(p->coupling_bytes_per_step, q->coupling_bytes_per_step / 2,
                           1e-9 * q->coupling_bytes_per_step, "%d×%d: %g bytes a step, allreduce %g",
                           p->stages, p->replicas, p->coupling_bytes_per_step,
                           q->coupling_bytes_per_step);
        /* and its buffer: one more copy of the fullest stage's parameters */
        cr_expect_gt(p->peak_memory_bytes, q->peak_memory_bytes);
        compared++;
    }
    cr_expect_gt(compared, 0, "no plan with replicas in both results");
    pt_solver_result_free(&mine);
    pt_solver_result_free(&dense);

    /* a value no table has (C code wrote the struct) is an error naming the known ones */
    pipert_config c = config_with("{}");
    c.dp.method = PT_DP_BUILT_IN_METHODS + 5;
    cluster2 k = two_sites(2, 0);
    const pt_solver_input in = {.config = &c, .n_sites = 2, .sites = k.sites, .links = k.links,
                                .keep = 4};
    pt_solver_result r;
    cr_expect_eq(pt_solve(&in, &r), PIPERT_ERR_CONFIG);
    cr_expect(strstr(pipert_last_error(), "dp.method") &&
                  strstr(pipert_last_error(), "every-other"),
              "%s", pipert_last_error());
}
