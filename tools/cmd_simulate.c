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
#include "runtime/topology.h"
#include "runtime/units.h"
#include "scheduler/cluster.h"
#include "scheduler/cost.h"
#include "scheduler/plan_file.h"
#include "scheduler/simulate.h"
#include "tools/cli.h"
#include "tools/commands.h"

#define MAX_RANKS 1024

typedef struct simulate_args {
    int stages, replicas, steps, cores;
    double flops, efficiency, memory_bytes_per_s;
    pt_sim_link link;
    const char *json_path, *trace_path;
    const pt_plan_file *plan;   /* NULL: every rank on this host */
    const pt_cluster *cluster; /* the plan's, or NULL */
} simulate_args;

/* Everything one simulation needs, owned here. */
typedef struct job_model {
    pt_stage_plan plan;
    pt_stage_cost stage[PT_PLAN_MAX_STAGES];
    pt_sim_costs costs[MAX_RANKS];
    pt_sim_link stage_links[MAX_RANKS];
    int device_of[MAX_RANKS];
    double coupling_bytes[PT_PLAN_MAX_STAGES];
    int link_of[PT_PLAN_MAX_STAGES];
    pt_sim_link coupling_links[PT_PLAN_MAX_STAGES + 1]; /* [0]: this host */
    int coupling_pairs[PT_PLAN_MAX_STAGES + 1][2];     /* the sites of each link */
    int site_of[MAX_RANKS];                             /* −1: this host, no cluster */
    pt_sim_input in;
} job_model;

static pipert_result parse_args(const char *const text[8], simulate_args *a)
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

/* ---- links from the plan's cluster ------------------------------------------ */

static pt_sim_link cluster_link(const pt_cluster *c, int from, int to)
{
    const pt_cluster_link *l = &c->links[from * c->n_sites + to];
    return (pt_sim_link){l->bits_per_s / 8, l->latency_s};
}

/* The slower of a pair's two directions (a pipeline boundary carries
 * activations one way and gradients the other). */
static pt_sim_link pair_link(const simulate_args *a, int site_a, int site_b)
{
    if (site_a < 0 || site_a == site_b) return a->link;
    const pt_sim_link x = cluster_link(a->cluster, site_a, site_b),
                      y = cluster_link(a->cluster, site_b, site_a);
    return (pt_sim_link){x.bytes_per_s < y.bytes_per_s ? x.bytes_per_s : y.bytes_per_s,
                         x.latency_s > y.latency_s ? x.latency_s : y.latency_s};
}

static pipert_result place_ranks(const simulate_args *a, job_model *m, int S, int R)
{
    for (int i = 0; i < R * S; i++) m->site_of[i] = -1;
    if (!a->plan || !a->cluster) return PIPERT_OK;
    for (int r = 0; r < R; r++)
        for (int s = 0; s < S; s++)
            PT_TRY(pt_plan_file_site_index(a->plan, a->cluster, r, s, &m->site_of[r * S + s]));
    return PIPERT_OK;
}

/* Stage s's coupling link: the slowest hop of its replicas' ring; stages
 * whose slowest hop joins the same two sites share it. */
static void coupling_link(const simulate_args *a, job_model *m, int s, int S, int R, int *n_links)
{
    int worst_a = -1, worst_b = -1;
    pt_sim_link worst = a->link;
    for (int r = 0; r < R; r++) {
        const int x = m->site_of[r * S + s], y = m->site_of[((r + 1) % R) * S + s];
        if (x < 0 || x == y) continue;
        const pt_sim_link l = pair_link(a, x, y);
        if (l.bytes_per_s < worst.bytes_per_s) worst = l, worst_a = x, worst_b = y;
    }
    m->link_of[s] = 0;
    if (worst_a < 0) return; /* all in one site: this host's link */
    const int lo = worst_a < worst_b ? worst_a : worst_b, hi = worst_a ^ worst_b ^ lo;
    for (int l = 1; l < *n_links; l++)
        if (m->coupling_pairs[l][0] == lo && m->coupling_pairs[l][1] == hi) {
            m->link_of[s] = l;
            return;
        }
    m->coupling_pairs[*n_links][0] = lo;
    m->coupling_pairs[*n_links][1] = hi;
    m->coupling_links[*n_links] = worst;
    m->link_of[s] = (*n_links)++;
}

static pipert_result build_model(const pipert_config *cfg, const simulate_args *a, int devices,
                                 job_model *m)
{
    const int S = a->stages, R = a->replicas;
    if (R * S > MAX_RANKS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "simulate: %d ranks (at most %d)", R * S, MAX_RANKS);
    const pt_gpt_config model = {cfg->model.n_layer, cfg->model.n_embd, cfg->model.n_head,
                                 cfg->model.block_size, cfg->model.vocab_size,
                                 cfg->model.tie_weights};
    if (cfg->plan.layers[0])
        PT_TRY(pt_plan_parse(cfg->plan.layers, model.n_layer, S, &m->plan));
    else
        PT_TRY(pt_plan_balanced(&model, model.block_size, S, &m->plan));
    const pt_cost_device device = {a->flops, a->efficiency, 0, a->memory_bytes_per_s};
    double params[PT_PLAN_MAX_STAGES];
    for (int s = 0; s < S; s++) {
        PT_TRY(pt_cost_stage(cfg, &m->plan, s, &device, &m->stage[s]));
        params[s] = m->stage[s].params;
    }
    PT_TRY(place_ranks(a, m, S, R));
    for (int i = 0; i < R * S; i++) {
        m->costs[i] = m->stage[i % S].time;
        m->device_of[i] = i % devices;
    }
    for (int r = 0; r < R; r++)
        for (int s = 0; s + 1 < S; s++)
            m->stage_links[r * (S - 1) + s] =
                pair_link(a, m->site_of[r * S + s], m->site_of[r * S + s + 1]);
    PT_TRY(pt_schedule_parse_kind(cfg->pipeline.schedule, &m->in.kind));
    const bool async = m->in.kind == PT_SCHEDULE_ASYNC_1F1B;
    m->in.stages = S;
    m->in.replicas = R;
    /* as the executor runs it: async one microbatch a step, one stage its
     * gradient accumulation, a pipeline its microbatches */
    m->in.microbatches = async ? 1 : S == 1 ? cfg->train.grad_accum : cfg->pipeline.microbatches;
    m->in.steps = a->steps ? a->steps : async ? 12 * S + 20 : 10;
    m->in.costs = m->costs;
    m->in.device_of = m->device_of;
    m->in.n_devices = devices;
    m->in.stage_links = m->stage_links;
    m->in.activation_bytes = m->stage[0].bytes_message;
    PT_TRY(pt_cost_coupling(cfg, R, S, params, m->coupling_bytes, &m->in.coupling));
    int n_links = 1;
    m->coupling_links[0] = a->link;
    for (int s = 0; s < S; s++) coupling_link(a, m, s, S, R, &n_links);
    m->in.coupling.link_of = m->link_of;
    m->in.coupling.links = m->coupling_links;
    m->in.coupling.n_links = n_links;
    return PIPERT_OK;
}

/* ---- the outputs ----------------------------------------------------------- */

static double tokens_per_step(const pipert_config *cfg, const job_model *m)
{
    return (double)m->in.replicas * m->in.microbatches * cfg->train.batch_size *
           cfg->model.block_size;
}

static double coupling_bytes_per_step(const job_model *m, const pt_sim_result *r)
{
    double total = 0;
    for (int l = 0; l < m->in.coupling.n_links; l++) total += r->coupling_link_bytes[l];
    return total / m->in.replicas / m->in.steps;
}

static void print_result(const pipert_config *cfg, const simulate_args *a, const job_model *m,
                         int threads, int devices, const pt_sim_result *r)
{
    printf("simulated %d stage%s x %d replica%s, %s, dp.method=%s, %d step%s\n", m->in.stages,
           m->in.stages == 1 ? "" : "s", m->in.replicas, m->in.replicas == 1 ? "" : "s",
           cfg->pipeline.schedule, cfg->dp.method, m->in.steps, m->in.steps == 1 ? "" : "s");
    printf("devices: %d (of %d cores, %d thread%s a rank), %.1f GFLOP/s each x efficiency %.2f\n",
           devices, a->cores, threads, threads == 1 ? "" : "s", 1e-9 * a->flops, a->efficiency);
    printf("step %.2f ms, %.0f tokens/s, coupling %.0f bytes a replica a step\n", 1e3 * r->step_s,
           tokens_per_step(cfg, m) / r->step_s, coupling_bytes_per_step(m, r));
    for (int i = 0; i < m->in.replicas * m->in.stages; i++) {
        const pt_stage_cost *c = &m->stage[i % m->in.stages];
        const pt_sim_rank_result *k = &r->ranks[i];
        printf("  rank %d (stage %d, replica %d, %s%s, blocks [%d, %d)): forward %.2f ms, backward %.2f "
               "ms, bubble %.1f%%, coupling wait %.2f ms/step, %d microbatch%s in flight, "
               "memory %.1f MB\n",
               i, i % m->in.stages, i / m->in.stages, m->site_of[i] < 0 ? "this host" : "site ",
               m->site_of[i] < 0 ? "" : a->cluster->site_names[m->site_of[i]], c->first, c->last,
               1e3 * c->time.forward_s,
               1e3 * c->time.backward_s, 100 * k->bubble, 1e3 * k->wait_coupling_s / m->in.steps,
               k->peak_activations, k->peak_activations == 1 ? "" : "es",
               1e-6 * pt_cost_stage_memory(c, k->peak_activations));
    }
}

static json_t *result_json(const pipert_config *cfg, const job_model *m, const pt_sim_result *r)
{
    json_t *ranks = json_array();
    for (int i = 0; i < m->in.replicas * m->in.stages; i++) {
        const pt_stage_cost *c = &m->stage[i % m->in.stages];
        const pt_sim_rank_result *k = &r->ranks[i];
        json_array_append_new(
            ranks, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f}", "rank", i, "stage",
                             i % m->in.stages, "replica", i / m->in.stages, "bubble", k->bubble,
                             "wait_coupling_s_per_step", k->wait_coupling_s / m->in.steps,
                             "bytes_sent_per_step", k->bytes_sent / m->in.steps,
                             "peak_activations", k->peak_activations, "memory_bytes",
                             pt_cost_stage_memory(c, k->peak_activations), "flops_per_microbatch",
                             c->flops));
    }
    return json_pack("{s:i, s:i, s:s, s:s, s:f, s:f, s:f, s:o}", "stages", m->in.stages,
                     "replicas", m->in.replicas, "schedule", cfg->pipeline.schedule, "dp_method",
                     cfg->dp.method, "step_s", r->step_s, "tokens_per_s",
                     tokens_per_step(cfg, m) / r->step_s, "coupling_bytes_per_step",
                     coupling_bytes_per_step(m, r), "ranks", ranks);
}

static pipert_result write_json(const char *path, json_t *value)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(value, tmp, JSON_INDENT(2)) != 0)
        return pt_fail(PIPERT_ERR_IO, "%s: cannot write", tmp);
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return pt_fail(PIPERT_ERR_IO, "%s: cannot rename into place", path);
    }
    return PIPERT_OK;
}

/* The simulated ranks' spans, merged into one Perfetto trace at `path`. */
static pipert_result simulate_traced(job_model *m, const char *path, pt_sim_result *r)
{
    const int n = m->in.replicas * m->in.stages;
    pt_trace **traces = calloc((size_t)n, sizeof *traces);
    char dir[] = "/tmp/pipert-simulate-XXXXXX";
    if (!traces || !mkdtemp(dir)) {
        free(traces);
        return pt_fail(PIPERT_ERR_IO, "simulate: no temporary directory for the trace");
    }
    pipert_result rc = PIPERT_OK;
    for (int i = 0; i < n && rc == PIPERT_OK; i++)
        rc = pt_trace_create(&traces[i], i, i % m->in.stages, i / m->in.stages, 1 << 16);
    m->in.traces = traces;
    m->in.trace_origin_us = pt_trace_now_us();
    if (rc == PIPERT_OK) rc = pt_simulate(&m->in, r);
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
    m->in.traces = NULL;
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
    job_model *m = calloc(1, sizeof *m);
    if (!m) return pt_fail(PIPERT_ERR_NOMEM, "simulate: out of memory");
    pt_sim_result r = {0};
    pipert_result rc = build_model(cfg, a, devices, m);
    if (rc == PIPERT_OK)
        rc = a->trace_path ? simulate_traced(m, a->trace_path, &r) : pt_simulate(&m->in, &r);
    if (rc == PIPERT_OK) print_result(cfg, a, m, threads, devices, &r);
    if (rc == PIPERT_OK && a->json_path) {
        json_t *j = result_json(cfg, m, &r);
        rc = j ? write_json(a->json_path, j) : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
        json_decref(j);
    }
    if (rc == PIPERT_OK && a->trace_path) printf("wrote %s\n", a->trace_path);
    pt_sim_result_free(&r);
    free(m);
    return rc;
}

int pt_cmd_simulate(int argc, char **argv)
{
    const char *text[8] = {NULL}, *plan_path = NULL;
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
    free(cfg);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("simulate");
}
