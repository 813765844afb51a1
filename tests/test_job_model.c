/* scheduler/job_model.h: which queues a placed job's messages wait in, checked against the
 * placement worked out by hand. */
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
                                      .memory_bytes_per_s = 1e10};

/* R replicas of an S-stage even split, rank i in site site_of[i] of n_sites (a link of
 * 1 Gbit/s, 10 ms between any two, 10 Gbit/s inside). */
static pt_job_model build(const pipert_config *config, int S, int R, const int *site_of,
                          int n_sites)
{
    static pt_cost_device devices[64];
    static pt_sim_link links[16];
    static pt_stage_plan plan;
    for (int i = 0; i < R * S; i++) devices[i] = device;
    for (int a = 0; a < n_sites; a++)
        for (int b = 0; b < n_sites; b++)
            links[a * n_sites + b] = a == b ? (pt_sim_link){1.25e9, 1e-5} : (pt_sim_link){1.25e8, 0.01};
    const pt_gpt_config model = {config->model.n_layer, config->model.n_embd,
                                 config->model.n_head, config->model.block_size,
                                 config->model.vocab_size, config->model.tie_weights};
    cr_assert_eq(pt_plan_balanced(&model, config->model.block_size, S, &plan), PIPERT_OK);
    const pt_job_model_input in = {.config = config, .plan = &plan, .replicas = R,
                                   .devices = devices, .site_of = site_of, .n_sites = n_sites,
                                   .links = links, .local = links[0]};
    pt_job_model m;
    cr_assert_eq(pt_job_model_build(&in, &m), PIPERT_OK, "%s", pipert_last_error());
    return m;
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
