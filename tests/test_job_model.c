/* scheduler/job_model.h: which queues a placed job's messages wait in, who takes part in a
 * coupling by sites and what its dense part inside a site and the sparse method's own work
 * cost, checked against the placement and the formulas worked out by hand. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "scheduler/job_model.h"

static pipert_config config_with(const char *json)
{
    pipert_config config;
    pt_config_defaults(&config);
    cr_assert_eq(pt_config_merge_json(&config, json, "test"), PIPERT_OK, "%s", pipert_last_error());
    return config;
}

static const pt_cost_device device = {.flops = 1e12, .efficiency = 0.5, .memory_bytes = 1e10,
                                      .memory_bytes_per_s = 1e10, .sparse_cpu_s_per_element = 0};

/* R replicas of an S-stage even split, rank i in site site_of[i] of n_sites (a link of
 * 1 Gbit/s, 10 ms between any two, 10 Gbit/s inside). */
static pt_job_model build_on(const pipert_config *config, int S, int R, const int *site_of,
                             int n_sites, double sparse_cpu_s_per_element)
{
    static pt_cost_device devices[64];
    static pt_sim_link links[16];
    static pt_stage_plan plan;
    for (int i = 0; i < R * S; i++) {
        devices[i] = device;
        devices[i].sparse_cpu_s_per_element = sparse_cpu_s_per_element;
    }
    for (int a = 0; a < n_sites; a++)
        for (int b = 0; b < n_sites; b++)
            links[a * n_sites + b] = a == b ? (pt_sim_link){1.25e9, 1e-5} : (pt_sim_link){1.25e8, 0.01};
    const pt_gpt_config model = pt_gpt_config_from_settings(config);
    cr_assert_eq(pt_plan_balanced(&model, config->model.block_size, S, &plan), PIPERT_OK);
    const pt_job_model_input in = {.config = config, .plan = &plan, .replicas = R,
                                   .devices = devices, .site_of = site_of, .n_sites = n_sites,
                                   .links = links, .local = links[0]};
    pt_job_model m;
    cr_assert_eq(pt_job_model_build(&in, &m), PIPERT_OK, "%s", pipert_last_error());
    return m;
}

static pt_job_model build(const pipert_config *config, int S, int R, const int *site_of,
                          int n_sites)
{
    return build_on(config, S, R, site_of, n_sites, 0);
}

/* Three 2-stage pipelines across sites 0 and 1, the middle one the other way round, and a
 * fourth inside site 0: the crossings' activations from site 0 to 1 wait in one queue, those
 * from 1 to 0 in the other direction's, which also carries the first pipelines' gradients;
 * the pipeline inside a site keeps queues of its own. */
Test(job_model, crossings_share_a_queue_per_direction)
{
    const pipert_config config = config_with("{}");
    const int site_of[] = {0, 1, 1, 0, 0, 1, 0, 0};
    pt_job_model m = build(&config, 2, 4, site_of, 2);
    /* [2·boundary + d]: d = 0 activations, 1 gradients; boundary r for replica r */
    const int expected[] = {0, 1, 1, 0, 0, 1, 6, 7};
    for (int i = 0; i < 8; i++)
        cr_expect_eq(m.in.stage_queue[i], expected[i],
                     "replica %d's %s wait in queue %d, expected %d", i / 2,
                     i % 2 ? "gradients" : "activations", m.in.stage_queue[i], expected[i]);
    pt_job_model_free(&m);
}

/* Four replicas of one stage, two in each of two sites. dp.method=sparse runs by sites
 * (dp/coupling.c): its ring has the two sites' leaders, and every step each replica also
 * waits for its site's dense mean of the gradients (a ring of two: 4P bytes sent at 10 Gbit/s,
 * two latencies of 10 µs) and the leader's broadcast (one round of 4P bytes and a latency).
 * allreduce runs one ring over all four replicas and nothing inside the sites. */
Test(job_model, methods_run_between_the_sites_leaders)
{
    const int site_of[] = {0, 0, 1, 1};
    const pipert_config sparse =
        config_with("{\"pipeline\": {\"schedule\": \"1f1b\"}, \"dp\": {\"method\": \"sparse\"}}");
    pt_job_model m = build(&sparse, 1, 4, site_of, 2);
    const double P = m.cost[0].params;
    cr_expect_eq(m.members[0], 2, "sparse: %d members, expected the 2 sites' leaders", m.members[0]);
    cr_expect_float_eq(m.coupling_bytes[0], 2.0 * 1 / 2 * 0.05 * P * 4, 1e-6,
                       "sparse: %g bytes a step, expected a 2-member ring's share of p·P floats",
                       m.coupling_bytes[0]);
    cr_expect_eq(m.in.coupling.links[m.link_of[0]].bytes_per_s, 1.25e8,
                 "the leaders' ring crosses the 1 Gbit/s link");
    const double site_s = (4 * P / 1.25e9 + 2 * 1e-5) + (4 * P / 1.25e9 + 1e-5);
    for (int r = 0; r < 4; r++)
        cr_expect_float_eq(m.times[r].optimizer_s - m.cost[r].time.optimizer_s, site_s, 1e-12,
                           "replica %d: %g s a step in its site, expected %g", r,
                           m.times[r].optimizer_s - m.cost[r].time.optimizer_s, site_s);
    pt_job_model_free(&m);

    const pipert_config allreduce = config_with("{\"pipeline\": {\"schedule\": \"1f1b\"}}");
    m = build(&allreduce, 1, 4, site_of, 2);
    cr_expect_eq(m.members[0], 4, "allreduce: %d members, expected every replica", m.members[0]);
    cr_expect_float_eq(m.coupling_bytes[0], 2.0 * 3 / 4 * P * 4, 1e-6,
                       "allreduce: %g bytes a step", m.coupling_bytes[0]);
    for (int r = 0; r < 4; r++)
        cr_expect_float_eq(m.times[r].optimizer_s, m.cost[r].time.optimizer_s, 1e-15,
                           "allreduce: replica %d has site work", r);
    pt_job_model_free(&m);
}

/* The simulated step of a sparse job by sites, compute free and the exchange beside training:
 * a step is the optimizer step plus the site's dense part, as worked out above. */
Test(job_model, the_simulated_step_pays_the_sites_dense_part)
{
    const int site_of[] = {0, 0, 1, 1};
    const pipert_config sparse =
        config_with("{\"pipeline\": {\"schedule\": \"1f1b\"}, \"dp\": {\"method\": \"sparse\"}}");
    pt_job_model m = build(&sparse, 1, 4, site_of, 2);
    for (int r = 0; r < 4; r++) m.times[r].forward_s = m.times[r].backward_s = 0;
    pt_sim_result result;
    cr_assert_eq(pt_simulate(&m.in, &result), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_float_eq(result.step_s, m.times[0].optimizer_s, 1e-9, "step %g, expected %g",
                       result.step_s, m.times[0].optimizer_s);
    pt_sim_result_free(&result);
    pt_job_model_free(&m);
}

/* dp.method=sparse's own work: the measured seconds per element times the step's p·P
 * elements, on every replica; nothing for a method without it. */
Test(job_model, the_sparse_methods_own_work)
{
    const int site_of[] = {0, 1};
    const pipert_config sparse = config_with(
        "{\"dp\": {\"method\": \"sparse\", \"fraction\": 0.1}}");
    pt_job_model m = build_on(&sparse, 1, 2, site_of, 2, 2e-8);
    for (int r = 0; r < 2; r++)
        cr_expect_float_eq(m.times[r].optimizer_s - m.cost[r].time.optimizer_s,
                           2e-8 * 0.1 * m.cost[r].params, 1e-15, "replica %d: %g s", r,
                           m.times[r].optimizer_s - m.cost[r].time.optimizer_s);
    pt_job_model_free(&m);
    const pipert_config diloco = config_with("{\"dp\": {\"method\": \"diloco\"}}");
    m = build_on(&diloco, 1, 2, site_of, 2, 2e-8);
    cr_expect_float_eq(m.times[0].optimizer_s, m.cost[0].time.optimizer_s, 1e-15,
                       "diloco got sparse's work");
    pt_job_model_free(&m);
}
