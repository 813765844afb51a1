/* `pipert simulate`: predicts a job on this machine — S stages × R replicas
 * of the configured model, every rank with runtime.threads cores — by the
 * cost model (scheduler/cost.h) and the discrete-event simulation
 * (scheduler/simulate.h): step time, tokens/s, bubble, memory and bytes per
 * rank, and optionally the simulated run as a Perfetto trace.
 *
 * The devices are this machine's cores: C cores make ⌊C / threads⌋ devices,
 * rank i computes on device i mod that (ranks on one device take turns, as
 * workers sharing a core do). A device's FLOP/s is the fp32 GEMM peak of
 * `threads` threads (measured here, or --flops) times --efficiency, the share
 * of the peak the kernels reach (`pipert bench` prints it as "% of peak").
 * Links between workers are this host's transport (--link-bandwidth,
 * --link-latency).
 *
 * With --plan, the plan says the stages, replicas, split and configuration,
 * and where each rank runs: ranks in different sites of the plan's cluster
 * talk over the cluster's link between them (both directions of a pipeline
 * boundary take the slower one), and a stage's replicas spread over sites
 * couple over the slowest link of their ring; the stages whose rings have the
 * same slowest pair of sites share that link. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/peak.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/topology.h"
#include "runtime/units.h"
#include "scheduler/cluster.h"
#include "scheduler/cluster_units.h"
#include "scheduler/cost.h"
#include "scheduler/job_model.h"
#include "scheduler/plan_file.h"
#include "scheduler/simulate.h"
#include "tools/cli.h"
#include "tools/commands.h"

#define MAX_RANKS 1024

typedef struct simulate_args {
    int stages, replicas, steps, cores;
    double flops, efficiency, memory_bytes_per_s;
    double sparse_cpu; /* --sparse-cpu: seconds per element of the step's partition */
    pt_sim_link link;
    const char *json_path, *trace_path;
    const pt_plan_file *plan;   /* NULL: every rank on this host */
    const pt_cluster *cluster; /* the plan's, or NULL */
} simulate_args;

/* Everything one simulation needs. */
typedef struct job {
    pt_stage_plan plan;
    pt_cost_device devices[MAX_RANKS];
    int device_of[MAX_RANKS];
    int site_of[MAX_RANKS];
    pt_cluster_units units; /* the plan's cluster's, or empty */
    pt_sim_link *links;     /* units.links, or NULL */
    int n_sites;
    pt_job_model model;
} job;

static pipert_result parse_args(const char *const text[9], simulate_args *a)
{
    PT_TRY(pt_cli_parse_int("--stages", text[0], 1, PT_PLAN_MAX_STAGES, 1, &a->stages));
    PT_TRY(pt_cli_parse_int("--replicas", text[1], 1, 256, 1, &a->replicas));
    PT_TRY(pt_cli_parse_int("--steps", text[2], 2, 100000, 0, &a->steps));
    a->flops = text[3] ? strtod(text[3], NULL) : 0;
    if (text[3] && !(a->flops > 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "--flops: expected a positive FLOP/s, got \"%s\"",
                       text[3]);
    a->efficiency = text[4] ? strtod(text[4], NULL) : 0.8;
    if (!(a->efficiency > 0 && a->efficiency <= 1))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "--efficiency: expected a share in (0, 1], got \"%s\"",
                       text[4]);
    double bits;
    PT_TRY(pt_parse_bit_rate(text[5] ? text[5] : "100gbit", "--link-bandwidth", &bits));
    a->link.bytes_per_s = bits / 8;
    PT_TRY(pt_parse_duration(text[6] ? text[6] : "20us", "--link-latency", &a->link.latency_s));
    PT_TRY(pt_cli_parse_int("--cores", text[7], 1, 1 << 20, 0, &a->cores));
    a->memory_bytes_per_s = 10e9;
    a->sparse_cpu = text[8] ? strtod(text[8], NULL) : 0;
    if (text[8] && !(a->sparse_cpu >= 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "--sparse-cpu: expected seconds (≥ 0), got \"%s\"",
                       text[8]);
    return PIPERT_OK;
}

/* The machine's devices: cores (found, or --cores) by threads per rank. */
static pipert_result machine_devices(const pipert_config *cfg, simulate_args *a, int *threads,
                                     int *devices)
{
    PT_TRY(pt_topology_compute_threads(cfg->runtime.threads, threads));
    if (!a->cores) {
        pt_topology *t;
        PT_TRY(pt_topology_load(&t));
        a->cores = pt_topology_cores(t);
        pt_topology_free(t);
    }
    *devices = a->cores / *threads > 0 ? a->cores / *threads : 1;
    if (!a->flops) {
        pt_gemm_peak peak;
        PT_TRY(pt_cpu_gemm_peak(*threads, &peak));
        a->flops = 1e9 * peak.gflops_median;
    }
    return PIPERT_OK;
}

/* ---- the job ----------------------------------------------------------------- */

/* With a plan's cluster: each rank's unit (a device group, or a site of
 * this machine's devices) and the links between units. */
static pipert_result place_ranks(const simulate_args *a, job *m, int S, int R)
{
    for (int i = 0; i < R * S; i++) m->site_of[i] = 0;
    if (!a->plan || !a->cluster) return PIPERT_OK;
    const pt_solver_site fallback = {1, {a->flops, a->efficiency, 0, a->memory_bytes_per_s, a->sparse_cpu}};
    PT_TRY(pt_cluster_units_make(a->cluster, &fallback, a->efficiency, a->link, &m->units));
    for (int i = 0; i < R * S; i++) {
        const pt_plan_place *at = &a->plan->placement[i];
        pipert_result rc = pt_cluster_units_find(a->cluster, &m->units, at->site, at->group,
                                                 &m->site_of[i]);
        if (rc != PIPERT_OK) {
            pt_error_prefix("placement[%d][%d]", i / S, i % S);
            return rc;
        }
    }
    m->n_sites = m->units.n;
    m->links = m->units.links;
    return PIPERT_OK;
}

static pipert_result build_job(const pipert_config *cfg, const simulate_args *a, int devices,
                               job *m)
{
    const int S = a->stages, R = a->replicas;
    if (R * S > MAX_RANKS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "simulate: %d ranks (at most %d)", R * S, MAX_RANKS);
    const pt_gpt_config model = pt_gpt_config_from_settings(cfg);
    if (cfg->plan.layers[0])
        PT_TRY(pt_plan_parse(cfg->plan.layers, model.n_layer, S, &m->plan));
    else
        PT_TRY(pt_plan_balanced(&model, model.block_size, S, &m->plan));
    PT_TRY(place_ranks(a, m, S, R));
    /* a cluster's groups are devices of their own; else this machine's cores, shared */
    const bool groups = a->cluster && a->cluster->n_groups;
    for (int i = 0; i < R * S; i++) {
        m->devices[i] = groups ? m->units.units[m->site_of[i]].device
                               : (pt_cost_device){a->flops, a->efficiency, 0, a->memory_bytes_per_s,
                                                  a->sparse_cpu};
        m->device_of[i] = i % devices;
    }
    const pt_job_model_input in = {
        .config = cfg, .plan = &m->plan, .replicas = R, .devices = m->devices,
        .site_of = m->site_of, .n_sites = m->n_sites ? m->n_sites : 1, .links = m->links,
        .local = a->link, .device_of = groups ? NULL : m->device_of, .n_devices = devices,
        .steps = a->steps,
    };
    return pt_job_model_build(&in, &m->model);
}

/* ---- the outputs ----------------------------------------------------------- */

static void print_result(const pipert_config *cfg, const simulate_args *a, const job *j,
                         int threads, int devices, const pt_sim_result *r)
{
    const pt_sim_input *in = &j->model.in;
    printf("simulated %d stage%s x %d replica%s, %s, dp.method=%s, %d step%s\n", in->stages,
           in->stages == 1 ? "" : "s", in->replicas, in->replicas == 1 ? "" : "s",
           pt_config_choice_name("pipeline.schedule", cfg->pipeline.schedule),
           pt_config_choice_name("dp.method", cfg->dp.method), in->steps, in->steps == 1 ? "" : "s");
    if (a->cluster && a->cluster->n_groups)
        printf("devices: the cluster's groups, each rank a device of its own, x efficiency %.2f\n",
               a->efficiency);
    else
        printf("devices: %d (of %d cores, %d thread%s a rank), %.1f GFLOP/s each x efficiency %.2f\n",
               devices, a->cores, threads, threads == 1 ? "" : "s", 1e-9 * a->flops, a->efficiency);
    printf("step %.2f ms, %.0f tokens/s, coupling %.0f bytes a replica a step\n", 1e3 * r->step_s,
           j->model.tokens_per_step / r->step_s, pt_job_model_coupling_bytes_per_step(&j->model, r));
    for (int i = 0; i < in->replicas * in->stages; i++) {
        const pt_stage_cost *c = &j->model.cost[i];
        const pt_sim_rank_result *k = &r->ranks[i];
        char unit[2 * PT_CLUSTER_NAME_MAX + 2] = "";
        if (a->cluster) pt_cluster_units_name(a->cluster, &j->units, j->site_of[i], unit, sizeof unit);
        printf("  rank %d (stage %d, replica %d, %s%s, blocks [%d, %d)): forward %.2f ms, backward %.2f "
               "ms, bubble %.1f%%, coupling wait %.2f ms/step, %d microbatch%s in flight, "
               "memory %.1f MB\n",
               i, i % in->stages, i / in->stages, a->cluster ? "" : "this host",
               unit, c->first, c->last,
               1e3 * c->time.forward_s,
               1e3 * c->time.backward_s, 100 * k->bubble, 1e3 * k->wait_coupling_s / in->steps,
               k->peak_activations, k->peak_activations == 1 ? "" : "es",
               1e-6 * pt_cost_stage_memory(c, k->peak_activations));
    }
}

static json_t *result_json(const pipert_config *cfg, const job *j, const pt_sim_result *r)
{
    const pt_sim_input *in = &j->model.in;
    json_t *ranks = json_array();
    for (int i = 0; i < in->replicas * in->stages; i++) {
        const pt_stage_cost *c = &j->model.cost[i];
        const pt_sim_rank_result *k = &r->ranks[i];
        json_array_append_new(
            ranks, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f}", "rank", i, "stage",
                             i % in->stages, "replica", i / in->stages, "bubble", k->bubble,
                             "wait_coupling_s_per_step", k->wait_coupling_s / in->steps,
                             "bytes_sent_per_step", k->bytes_sent / in->steps,
                             "peak_activations", k->peak_activations, "memory_bytes",
                             pt_cost_stage_memory(c, k->peak_activations), "flops_per_microbatch",
                             c->flops));
    }
    return json_pack("{s:i, s:i, s:s, s:s, s:f, s:f, s:f, s:o}", "stages", in->stages,
                     "replicas", in->replicas, "schedule",
                     pt_config_choice_name("pipeline.schedule", cfg->pipeline.schedule),
                     "dp_method", pt_config_choice_name("dp.method", cfg->dp.method), "step_s",
                     r->step_s, "tokens_per_s",
                     j->model.tokens_per_step / r->step_s, "coupling_bytes_per_step",
                     pt_job_model_coupling_bytes_per_step(&j->model, r), "ranks", ranks);
}

/* The simulated ranks' spans, merged into one Perfetto trace at `path`. */
static pipert_result simulate_traced(job *j, const char *path, pt_sim_result *r)
{
    pt_sim_input *in = &j->model.in;
    const int n = in->replicas * in->stages;
    pt_trace **traces = calloc((size_t)n, sizeof *traces);
    char dir[] = "/tmp/pipert-simulate-XXXXXX";
    if (!traces || !mkdtemp(dir)) {
        free(traces);
        return pt_fail(PIPERT_ERR_IO, "simulate: no temporary directory for the trace");
    }
    pipert_result rc = PIPERT_OK;
    for (int i = 0; i < n && rc == PIPERT_OK; i++)
        rc = pt_trace_create(&traces[i], i, i % in->stages, i / in->stages, 1 << 16);
    in->traces = traces;
    in->trace_origin_us = pt_trace_now_us();
    if (rc == PIPERT_OK) rc = pt_simulate(in, r);
    for (int i = 0; i < n && rc == PIPERT_OK; i++) rc = pt_trace_write_rank_file(traces[i], dir);
    int merged = 0;
    if (rc == PIPERT_OK) rc = pt_trace_merge(dir, path, &merged);
    for (int i = 0; i < n; i++) {
        char file[4200];
        snprintf(file, sizeof file, "%s/trace-rank-%d.json", dir, i);
        unlink(file);
        pt_trace_free(traces[i]);
    }
    rmdir(dir);
    free(traces);
    in->traces = NULL;
    return rc;
}

/* The plan's job: its stages, replicas, split and configuration (over
 * --config, under the command line's --key=value), and its cluster. */
static pipert_result use_plan(const char *path, int argc, char **argv, pipert_config *cfg,
                              pt_plan_file *plan, pt_cluster *cluster, simulate_args *a)
{
    PT_TRY(pt_plan_file_load(path, plan));
    a->plan = plan;
    a->stages = plan->stages;
    a->replicas = plan->replicas;
    if (plan->config_json) PT_TRY(pt_config_merge_json(cfg, plan->config_json, path));
    if (plan->layers[0]) snprintf(cfg->plan.layers, sizeof cfg->plan.layers, "%s", plan->layers);
    PT_TRY(pt_cli_apply_overrides(argc, argv, cfg));
    if (!plan->cluster_path[0]) return PIPERT_OK;
    PT_TRY(pt_cluster_load(plan->cluster_path, cluster));
    a->cluster = cluster;
    return PIPERT_OK;
}

static pipert_result run_simulation(pipert_config *cfg, simulate_args *a)
{
    int threads, devices;
    PT_TRY(pt_config_validate(cfg));
    PT_TRY(machine_devices(cfg, a, &threads, &devices));
    job *j = calloc(1, sizeof *j);
    if (!j) return pt_fail(PIPERT_ERR_NOMEM, "simulate: out of memory");
    pt_sim_result r = {0};
    pipert_result rc = build_job(cfg, a, devices, j);
    if (rc == PIPERT_OK)
        rc = a->trace_path ? simulate_traced(j, a->trace_path, &r) : pt_simulate(&j->model.in, &r);
    if (rc == PIPERT_OK) print_result(cfg, a, j, threads, devices, &r);
    if (rc == PIPERT_OK && a->json_path) {
        json_t *out = result_json(cfg, j, &r);
        rc = pt_write_json_atomic(a->json_path, out, JSON_INDENT(2)); /* NULL: out of memory */
        json_decref(out);
    }
    if (rc == PIPERT_OK && a->trace_path) printf("wrote %s\n", a->trace_path);
    pt_sim_result_free(&r);
    pt_job_model_free(&j->model);
    pt_cluster_units_free(&j->units);
    free(j);
    return rc;
}

int pt_cmd_simulate(int argc, char **argv)
{
    const char *text[9] = {NULL}, *plan_path = NULL;
    simulate_args a = {0};
    const pt_cli_flag flags[] = {
        {"--stages", "S", "pipeline stages (1)", &text[0], NULL},
        {"--replicas", "R", "replicas of the pipeline (1)", &text[1], NULL},
        {"--steps", "K", "optimizer steps to simulate (flush: 10; async: 12S+20)", &text[2], NULL},
        {"--flops", "F", "FLOP/s of one device (default: the GEMM peak measured here)", &text[3], NULL},
        {"--efficiency", "E", "share of --flops the kernels reach (0.8; `pipert bench`'s % of peak)",
         &text[4], NULL},
        {"--link-bandwidth", "RATE", "between workers of this host (100gbit)", &text[5], NULL},
        {"--link-latency", "TIME", "one way, between workers of this host (20us)", &text[6], NULL},
        {"--cores", "N", "cores of the machine (default: this one's)", &text[7], NULL},
        {"--sparse-cpu", "S", "dp.method=sparse's own CPU seconds per element of a step's partition "
         "(0; scripts/calibrate.sh measures it)", &text[8], NULL},
        {"--json", "FILE", "also write the prediction as JSON", &a.json_path, NULL},
        {"--trace", "FILE", "write the simulated run as a Perfetto trace", &a.trace_path, NULL},
        {"--plan", "FILE", "stages, replicas, split, configuration and sites from a plan file",
         &plan_path, NULL},
    };
    const pt_cli cli = {"simulate", "[--stages S] [--replicas R] [options] [--config FILE] [--key=value ...]",
                        "Predicts a job of S stages x R replicas of the configured model on this\n"
                        "machine: a discrete-event simulation of the executor's own schedules\n"
                        "with the cost model's compute, memory and traffic (docs/RUNNING.md,\n"
                        "\"Predicting a job\").",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg = NULL;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    pt_plan_file plan = {0};
    pt_cluster cluster = {0};
    pipert_result rc = parse_args(text, &a);
    if (rc == PIPERT_OK && plan_path) {
        if (text[0] || text[1])
            rc = pt_fail(PIPERT_ERR_INVALID_ARG, "--plan says the stages and replicas: give "
                         "neither --stages nor --replicas");
        if (rc == PIPERT_OK) rc = use_plan(plan_path, argc, argv, cfg, &plan, &cluster, &a);
    }
    if (rc == PIPERT_OK) rc = run_simulation(cfg, &a);
    pt_plan_file_free(&plan);
    if (a.cluster) pt_cluster_free(&cluster);
    pipert_config_free(cfg);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("simulate");
}
