/* scheduler/cost.h: compute against the model's own FLOP count, memory
 * against the model's own layout and the schedule's weight copies, and the
 * coupling's bytes per step against what real runs of every method sent
 * (dp_bytes in metrics-stage-0.jsonl). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "command.h"
#include "scheduler/cost.h"
#include "scheduler/plan_file.h"

static pipert_config config_with(const char *json)
{
    pipert_config config;
    pt_config_defaults(&config);
    cr_assert_eq(pt_config_merge_json(&config, json, "test"), PIPERT_OK, "%s", pipert_last_error());
    return config;
}

static const pt_cost_device device = {.flops = 1e12, .efficiency = 0.5, .memory_bytes = 1e10,
                                      .memory_bytes_per_s = 1e10};

/* One stage holding the whole model does the model's FLOPs per token
 * (models/gpt.h: 6N + 12·L·C·T): a third of the blocks' forward, and the classifier's product
 * (6·V·C a token) whole in the forward, where its backward runs. */
Test(cost, one_stage_does_the_models_flops)
{
    pipert_config c = config_with("{\"model\": {\"tie_weights\": false}}");
    const pt_gpt_config model = pt_gpt_config_from_settings(&c);
    pt_stage_plan plan;
    cr_assert_eq(pt_plan_balanced(&model, c.model.block_size, 1, &plan), PIPERT_OK);
    pt_stage_cost cost;
    cr_assert_eq(pt_cost_stage(&c, &plan, 0, &device, &cost), PIPERT_OK, "%s", pipert_last_error());
    const double tokens = (double)c.train.batch_size * c.model.block_size;
    const double expected = pt_gpt_flops_per_token(&model, c.model.block_size) * tokens;
    cr_expect_float_eq(cost.flops, expected, 1e-6 * expected, "flops %g, the model's %g", cost.flops,
                       expected);
    const double classifier = 6.0 * c.model.vocab_size * c.model.n_embd * tokens;
    cr_expect_float_eq(cost.time.forward_s, ((expected - classifier) / 3 + classifier) / 5e11,
                       1e-12);
    cr_expect_float_eq(cost.time.backward_s, 2 * (expected - classifier) / 3 / 5e11, 1e-12);
}

/* Stages split the model's FLOPs between them, and a stage's memory is its
 * parameters' 16 bytes plus 4 per extra weight copy: a stash slot per
 * microbatch in flight, S−s but none on the last stage, for the asynchronous
 * default look-ahead (four more where nesterov-secant stashes), none for 1F1B
 * with flush. */
/* On cuda the activations are what the CUDA table keeps: attention saves B·NH·T + B·T·C floats
 * per block (flash-style), not the B·NH·T·T probabilities (kernels/cuda/sizes.c), and the
 * GELU's output [B·T, 4C] is computed again in the backward, not kept (models/gpt.h). */
Test(cost, activations_follow_the_device)
{
    pipert_config cpu = config_with("{\"model\": {\"n_layer\": 4}}");
    pipert_config cuda = config_with("{\"model\": {\"n_layer\": 4}, \"runtime\": {\"device\": \"cuda\"}}");
    pt_stage_plan one;
    const pt_gpt_config model = pt_gpt_config_from_settings(&cpu);
    cr_assert_eq(pt_plan_balanced(&model, cpu.model.block_size, 1, &one), PIPERT_OK);
    pt_stage_cost a, b;
    cr_assert_eq(pt_cost_stage(&cpu, &one, 0, &device, &a), PIPERT_OK);
    cr_assert_eq(pt_cost_stage(&cuda, &one, 0, &device, &b), PIPERT_OK);
    const double B = cpu.train.batch_size, T = cpu.model.block_size, C = cpu.model.n_embd,
                 NH = cpu.model.n_head;
    const double per_block =
        4.0 * (B * NH * T * T - (B * NH * T + B * T * C)) + 4.0 * B * T * 4 * C;
    cr_expect_float_eq(a.bytes_activations - b.bytes_activations, 4 * per_block, 64.0 * 4 * 4,
                       "cpu %g, cuda %g bytes", a.bytes_activations, b.bytes_activations);
    cr_expect_eq(a.bytes_fixed, b.bytes_fixed);
}

/* On a GPU, dp.method=sparse keeps only a step's partition there (its indices and values: 2p
 * floats an element, dp/sparse.c); its map and EMA are host memory. */
Test(cost, a_gpu_counts_sparses_partition_buffers)
{
    const char *cuda = "{\"model\": {\"n_layer\": 4}, \"runtime\": {\"device\": \"cuda\"}, "
                       "\"dp\": {\"method\": \"%s\", \"fraction\": 0.125}}";
    char text[256];
    pt_stage_cost dense, sparse;
    pt_stage_plan one;
    snprintf(text, sizeof text, cuda, "allreduce");
    pipert_config c = config_with(text);
    const pt_gpt_config model = pt_gpt_config_from_settings(&c);
    cr_assert_eq(pt_plan_balanced(&model, c.model.block_size, 1, &one), PIPERT_OK);
    cr_assert_eq(pt_cost_stage(&c, &one, 0, &device, &dense), PIPERT_OK, "%s", pipert_last_error());
    snprintf(text, sizeof text, cuda, "sparse");
    c = config_with(text);
    cr_assert_eq(pt_cost_stage(&c, &one, 0, &device, &sparse), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_float_eq(sparse.bytes_fixed - dense.bytes_fixed, 4.0 * dense.params * 2 * 0.125, 1.0,
                       "sparse %g, allreduce %g bytes", sparse.bytes_fixed, dense.bytes_fixed);
}

/* pipeline.transfer (pipeline/transfer.c): a message between stages is B·T·C values of 4 bytes,
 * or 2 in bf16 (auto under runtime.precision=bf16), and a stage in bf16 keeps a bf16 copy of
 * each microbatch in flight's activations being sent (not the last stage), one of the gradient
 * it sends (not the first) and one a receive lands in. */
Test(cost, bf16_between_stages_halves_the_messages_and_keeps_bf16_copies)
{
    pipert_config fp32 = config_with("{\"model\": {\"n_layer\": 4}, "
                                     "\"runtime\": {\"precision\": \"bf16\"}, "
                                     "\"pipeline\": {\"transfer\": \"fp32\"}}");
    pipert_config bf16 = config_with("{\"model\": {\"n_layer\": 4}, "
                                     "\"runtime\": {\"precision\": \"bf16\"}}");
    const pt_gpt_config model = pt_gpt_config_from_settings(&fp32);
    pt_stage_plan three;
    cr_assert_eq(pt_plan_balanced(&model, fp32.model.block_size, 3, &three), PIPERT_OK);
    const double values = (double)fp32.train.batch_size * fp32.model.block_size * fp32.model.n_embd;
    for (int s = 0; s < 3; s++) {
        pt_stage_cost a, b;
        cr_assert_eq(pt_cost_stage(&fp32, &three, s, &device, &a), PIPERT_OK);
        cr_assert_eq(pt_cost_stage(&bf16, &three, s, &device, &b), PIPERT_OK);
        cr_expect_eq(a.bytes_message, 4 * values, "stage %d in fp32: %g bytes", s, a.bytes_message);
        cr_expect_eq(b.bytes_message, 2 * values, "stage %d in bf16: %g bytes", s, b.bytes_message);
        const int in_flight = 3 - s;
        const double copies = (s < 2 ? in_flight : 0) + (s > 0 ? 2 : 1);
        cr_expect_float_eq(pt_cost_stage_memory(&b, in_flight) - pt_cost_stage_memory(&a, in_flight),
                           2 * values * copies, 1.0, "stage %d", s);
    }
    /* one stage sends nothing */
    pt_stage_plan one;
    cr_assert_eq(pt_plan_balanced(&model, fp32.model.block_size, 1, &one), PIPERT_OK);
    pt_stage_cost a, b;
    cr_assert_eq(pt_cost_stage(&fp32, &one, 0, &device, &a), PIPERT_OK);
    cr_assert_eq(pt_cost_stage(&bf16, &one, 0, &device, &b), PIPERT_OK);
    cr_expect_eq(pt_cost_stage_memory(&a, 1), pt_cost_stage_memory(&b, 1));
}

Test(cost, stages_share_the_flops_and_keep_their_weight_copies)
{
    const char *schedules[] = {"async-1f1b", "1f1b", "async-1f1b"};
    const char *lookaheads[] = {"nesterov-dc", "nesterov-dc", "nesterov-secant"};
    for (int k = 0; k < 3; k++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"model\": {\"n_layer\": 8, \"tie_weights\": false}, \"pipeline\": "
                 "{\"schedule\": \"%s\", \"lookahead\": \"%s\"}}", schedules[k], lookaheads[k]);
        pipert_config c = config_with(json);
        const pt_gpt_config model = pt_gpt_config_from_settings(&c);
        pt_stage_plan one, four;
        cr_assert_eq(pt_plan_balanced(&model, c.model.block_size, 1, &one), PIPERT_OK);
        cr_assert_eq(pt_plan_parse("2,2,2,2", 8, 4, &four), PIPERT_OK);
        pt_stage_cost whole, part;
        cr_assert_eq(pt_cost_stage(&c, &one, 0, &device, &whole), PIPERT_OK);
        double flops = 0, params = 0;
        for (int s = 0; s < 4; s++) {
            cr_assert_eq(pt_cost_stage(&c, &four, s, &device, &part), PIPERT_OK);
            flops += part.flops;
            params += part.params;
            const int copies = k != 1 && s < 3 ? 4 - s + (k == 2 ? 4 : 0) : 0;
            cr_expect_float_eq(part.bytes_fixed, 4 * part.params * (4 + copies), 1e-6,
                               "%s, %s, stage %d: %g bytes", schedules[k], lookaheads[k], s,
                               part.bytes_fixed);
            size_t p, a, g;
            pt_gpt_slice_sizes(&model, part.first, part.last, c.train.batch_size,
                               c.model.block_size, NULL, &p, &a, &g);
            cr_expect_float_eq(part.bytes_activations, 4.0 * (double)a, 1e-6);
        }
        cr_expect_float_eq(flops, whole.flops, 1e-6 * whole.flops, "4 stages %g, one %g", flops,
                           whole.flops);
        cr_expect_float_eq(params, whole.params, 0.5, "4 stages %g params, one %g", params,
                           whole.params);
    }
}

Test(cost, refusals)
{
    pipert_config c = config_with("{}");
    pt_stage_plan plan;
    const pt_gpt_config model = pt_gpt_config_from_settings(&c);
    cr_assert_eq(pt_plan_balanced(&model, c.model.block_size, 2, &plan), PIPERT_OK);
    pt_stage_cost cost;
    pt_cost_device slow = device;
    slow.efficiency = 0;
    cr_expect_eq(pt_cost_stage(&c, &plan, 0, &slow, &cost), PIPERT_ERR_INVALID_ARG);
    cr_expect_eq(pt_cost_stage(&c, &plan, 2, &device, &cost), PIPERT_ERR_INVALID_ARG);
}

/* ---- the coupling's bytes against real runs ------------------------------- */

#define SMALL_MODEL                                                                                \
    "--model.n_layer=3 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2"

/* Runs 2 replicas of one stage under `method` for `steps` steps and returns
 * the mean dp_bytes per step of replica 0 over its first `window` steps
 * (whole periods: the last exchanges of a run, which would fall due after its
 * end, are not sent), and what the cost model predicts for the same config. */
static void bytes_per_step(const char *method_args, const char *method_json, int steps,
                           int window, double *measured, double *predicted)
{
    char *dir = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s " SMALL_MODEL
                  " --train.steps=%d --train.log_every=1 %s", dir, steps, method_args);
    double values[256] = {0};
    const int n = read_metric_steps(dir, "metrics-stage-0.jsonl", "dp_bytes", values, steps);
    cr_assert_eq(n, steps, "%s: %d metric lines", method_args, n);
    double sum = 0;
    for (int i = 0; i < window; i++) sum += values[i];
    *measured = sum / window;
    remove_dir(dir);

    char json[512];
    snprintf(json, sizeof json,
             "{\"model\": {\"n_layer\": 3, \"n_embd\": 32, \"n_head\": 2, \"block_size\": 32}, "
             "\"train\": {\"batch_size\": 4}, \"dp\": %s}", method_json);
    pipert_config c = config_with(json);
    const pt_gpt_config model = pt_gpt_config_from_settings(&c);
    pt_stage_plan plan;
    cr_assert_eq(pt_plan_balanced(&model, 32, 1, &plan), PIPERT_OK);
    pt_stage_cost cost;
    cr_assert_eq(pt_cost_stage(&c, &plan, 0, &device, &cost), PIPERT_OK);
    double bytes;
    pt_sim_coupling coupling;
    const int two = 2;
    cr_assert_eq(pt_cost_coupling(&c, &two, 1, &cost.params, &bytes, &coupling), PIPERT_OK);
    *predicted = coupling.every ? bytes / coupling.every : 0;
}

Test(cost, coupling_bytes_are_what_real_runs_send, .timeout = 240)
{
    /* Tolerances: the partition of sparse leaves a tensor's share one
     * element either way; a codec adds a scale per started block, and this
     * model's small tensors start many (the cost model counts whole blocks). */
    const struct {
        const char *args, *json;
        int steps, window;
        double tolerance; /* relative */
    } cases[] = {
        {"--dp.method=allreduce", "{\"method\": \"allreduce\"}", 4, 4, 0.001},
        {"--dp.method=sparse --dp.delay=2", "{\"method\": \"sparse\", \"delay\": 2}", 40, 20,
         0.02},
        {"--dp.method=sparse --dp.delay=2 --dp.compress=e3m0",
         "{\"method\": \"sparse\", \"delay\": 2, \"compress\": \"e3m0\"}", 40, 20, 0.08},
        {"--dp.method=diloco --dp.period=5", "{\"method\": \"diloco\", \"period\": 5}", 20, 15,
         0.01},
        {"--dp.method=streaming-diloco --dp.period=6 --dp.fragments=2 --dp.overlap=1",
         "{\"method\": \"streaming-diloco\", \"period\": 6, \"fragments\": 2, \"overlap\": 1}", 18,
         12, 0.01},
        {"--dp.method=co2 --dp.period=5", "{\"method\": \"co2\", \"period\": 5}", 20, 15, 0.01},
        {"--dp.method=none", "{\"method\": \"none\"}", 4, 4, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double measured, predicted;
        bytes_per_step(cases[k].args, cases[k].json, cases[k].steps, cases[k].window, &measured,
                       &predicted);
        cr_expect(fabs(measured - predicted) <= cases[k].tolerance * measured + 8,
                  "%s: the cost model says %.0f bytes a step, the run sent %.0f", cases[k].args,
                  predicted, measured);
    }
}

/* ---- pipert simulate -------------------------------------------------------- */

static json_t *simulate_json(const char *args)
{
    char *dir = make_temp_dir(), path[600];
    snprintf(path, sizeof path, "%s/prediction.json", dir);
    run_pipert_ok("simulate --flops 1e10 --efficiency 0.5 --cores 8 --runtime.threads=1 "
                  "--json %s %s", path, args);
    json_error_t error;
    json_t *j = json_load_file(path, 0, &error);
    cr_assert(j, "%s: %s", path, error.text);
    remove_dir(dir);
    return j;
}

/* One worker alone: a step is its forward, backward and optimizer step as the
 * cost model prices them on the device asked for. */
Test(cost, simulate_one_worker_is_the_cost_models_step, .timeout = 60)
{
    json_t *j = simulate_json("--model.n_layer=3 --model.n_embd=32 --model.n_head=2 "
                              "--model.block_size=32 --train.batch_size=4");
    pipert_config c = config_with("{\"model\": {\"n_layer\": 3, \"n_embd\": 32, \"n_head\": 2, "
                                  "\"block_size\": 32}, \"train\": {\"batch_size\": 4}}");
    const pt_gpt_config model = pt_gpt_config_from_settings(&c);
    pt_stage_plan plan;
    cr_assert_eq(pt_plan_balanced(&model, 32, 1, &plan), PIPERT_OK);
    const pt_cost_device dev = {1e10, 0.5, 0, 10e9, 0};
    pt_stage_cost cost;
    cr_assert_eq(pt_cost_stage(&c, &plan, 0, &dev, &cost), PIPERT_OK);
    const double expected = c.train.grad_accum * (cost.time.forward_s + cost.time.backward_s) +
                            cost.time.optimizer_s;
    const double step = json_real_value(json_object_get(j, "step_s"));
    cr_expect_float_eq(step, expected, 1e-9 * expected, "simulated %g s, the cost model's %g", step,
                       expected);
    json_decref(j);
}

/* Four ranks on one machine: a rank each in the output, every rank computing
 * part of the time, and the 2-stage pipeline slower per token than a whole
 * model per rank would be on as many cores (its bubble). */
Test(cost, simulate_a_pipeline_of_replicas, .timeout = 60)
{
    json_t *j = simulate_json("--stages 2 --replicas 2 --dp.method=allreduce");
    const json_t *ranks = json_object_get(j, "ranks");
    cr_assert_eq(json_array_size(ranks), 4);
    for (size_t i = 0; i < 4; i++) {
        const double bubble = json_real_value(json_object_get(json_array_get(ranks, i), "bubble"));
        cr_expect(bubble > 0 && bubble < 1, "rank %zu: bubble %g", i, bubble);
    }
    cr_expect_gt(json_real_value(json_object_get(j, "coupling_bytes_per_step")), 0);
    json_decref(j);
}

/* ---- pipert plan ------------------------------------------------------------- */

/* The plan written for two sites loads, and simulating it again with the same
 * devices (a core per rank) predicts what plan printed. */
Test(cost, plan_writes_the_plan_that_simulate_predicts, .timeout = 120)
{
    char *dir = make_temp_dir(), cluster[300], plan[300], json[300];
    snprintf(cluster, sizeof cluster, "%s/cluster.json", dir);
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    snprintf(json, sizeof json, "%s/predicted.json", dir);
    FILE *f = fopen(cluster, "w");
    cr_assert(f);
    fputs("{\"sites\": [{\"name\": \"oregon\"}, {\"name\": \"virginia\"}],"
          " \"default_link\": {\"bandwidth\": \"790mbit\", \"latency\": \"33ms\"}}", f);
    fclose(f);
    run_pipert_ok("plan --cluster %s --out %s --devices 2 --flops 1e10 --efficiency 0.5 "
                  "--memory 1e10 --runtime.threads=1 --dp.method=sparse --model.n_layer=4", cluster,
                  plan);
    pt_plan_file p;
    cr_assert_eq(pt_plan_file_load(plan, &p), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_leq(p.stages * p.replicas, 4, "%d x %d ranks on 4 devices", p.stages, p.replicas);
    cr_expect_gt(p.predicted_step_s, 0);
    run_pipert_ok("simulate --plan %s --cores 64 --runtime.threads=1 --flops 1e10 --efficiency 0.5 "
                  "--json %s", plan, json);
    json_t *j = json_load_file(json, 0, NULL);
    cr_assert(j);
    const double step = json_real_value(json_object_get(j, "step_s"));
    cr_expect_float_eq(step, p.predicted_step_s, 1e-6 * step, "simulate says %g s, plan said %g s",
                       step, p.predicted_step_s);
    json_decref(j);
    pt_plan_file_free(&p);
    remove_dir(dir);
}
