/* `pipert plan --cluster FILE --out PLAN`: chooses how the configured model
 * runs on a cluster (scheduler/solver.h) — stages, replicas, the split and
 * every rank's site — prints the best few plans with their predicted
 * throughput, memory and traffic, and writes the best as a plan file that
 * `pipert launch --plan` runs and `pipert simulate --plan` re-predicts.
 *
 * Devices. A cluster file's sites and links say where and how fast the
 * network is, and its device groups what computes: each group is a unit the
 * solver fills with whole pipelines (its devices alike, joined by the
 * group's link; groups of one site reach each other over the slower of
 * their links, other sites over the cluster's). A device reaches
 * --efficiency (0.8) of its group's fp32 FLOP/s. A cluster without groups
 * gets --devices, --flops and --memory at every site (default: this machine
 * — its cores by runtime.threads, the GEMM peak measured here, its memory). */
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
#include "scheduler/cluster_units.h"
#include "scheduler/plan_file.h"
#include "scheduler/solver.h"
#include "tools/cli.h"
#include "tools/commands.h"

typedef struct plan_args {
    const char *cluster_path, *out_path;
    int keep, max_stages, devices;
    bool spanning;
    pt_cost_device device;
    pt_sim_link local;
} plan_args;

static pipert_result parse_args(const char *const text[9], const pipert_config *cfg, plan_args *a)
{
    PT_TRY(pt_cli_parse_int("--keep", text[0], 1, 1000, 5, &a->keep));
    PT_TRY(pt_cli_parse_int("--max-stages", text[1], 0, PT_PLAN_MAX_STAGES, 0, &a->max_stages));
    int threads;
    PT_TRY(pt_topology_compute_threads(cfg->runtime.threads, &threads));
    pt_topology *t;
    PT_TRY(pt_topology_load(&t));
    const int cores = pt_topology_cores(t);
    pt_topology_free(t);
    PT_TRY(pt_cli_parse_int("--devices", text[2], 1, 1 << 20,
                            cores / threads > 0 ? cores / threads : 1, &a->devices));
    a->device.flops = text[3] ? strtod(text[3], NULL) : 0;
    if (!text[3]) {
        pt_gemm_peak peak;
        PT_TRY(pt_cpu_gemm_peak(threads, &peak));
        a->device.flops = 1e9 * peak.gflops_median;
    }
    a->device.efficiency = text[4] ? strtod(text[4], NULL) : 0.8;
    a->device.memory_bytes = text[5] ? strtod(text[5], NULL)
                                     : (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    a->device.memory_bytes_per_s = 10e9;
    if (!(a->device.flops > 0) || !(a->device.efficiency > 0 && a->device.efficiency <= 1) ||
        !(a->device.memory_bytes > 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "--flops, --efficiency (in (0, 1]) and --memory "
                       "take positive numbers");
    a->device.sparse_cpu_s_per_element = text[8] ? strtod(text[8], NULL) : 0;
    if (text[8] && !(a->device.sparse_cpu_s_per_element >= 0))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "--sparse-cpu: expected seconds (≥ 0), got \"%s\"",
                       text[8]);
    a->local = (pt_sim_link){100e9 / 8, 20e-6};
    return PIPERT_OK;
}

/* "3,3" */
static void layers_text(const pt_solver_plan *p, char *out, size_t capacity)
{
    size_t n = 0;
    out[0] = 0;
    for (int s = 0; s < p->stages && n < capacity; s++)
        n += (size_t)snprintf(out + n, capacity - n, "%s%d", s ? "," : "",
                              p->bounds[s + 1] - p->bounds[s]);
}

/* Where replica r's stages run: "a" when all in one unit, else "a>b". */
static void sites_text(const pt_cluster *c, const pt_cluster_units *units, const pt_solver_plan *p,
                       int r, char *out, size_t capacity)
{
    size_t n = 0;
    out[0] = 0;
    for (int s = 0; s < p->stages && n < capacity; s++) {
        const int u = p->site_of[r * p->stages + s];
        if (s > 0 && u == p->site_of[r * p->stages + s - 1]) continue;
        char name[2 * PT_CLUSTER_NAME_MAX + 2];
        pt_cluster_units_name(c, units, u, name, sizeof name);
        n += (size_t)snprintf(out + n, capacity - n, "%s%s", s ? ">" : "", name);
    }
}

static void print_plans(const pt_cluster *c, const pt_cluster_units *units,
                        const pt_solver_result *r)
{
    printf("%d candidates simulated (%d did not fit in memory); the best %d:\n", r->candidates,
           r->refused_memory, r->n_plans);
    printf("  %-3s %-7s %-9s %-14s %10s %12s %12s %14s  %s\n", "#", "stages", "replicas",
           "layers", "step ms", "tokens/s", "memory MB", "coupling B/step", "sites of the replicas");
    for (int i = 0; i < r->n_plans; i++) {
        const pt_solver_plan *p = &r->plans[i];
        char layers[256], where[512] = "", one[128];
        layers_text(p, layers, sizeof layers);
        for (int k = 0; k < p->replicas && k < 8; k++) {
            sites_text(c, units, p, k, one, sizeof one);
            snprintf(where + strlen(where), sizeof where - strlen(where), "%s%s", k ? " " : "", one);
        }
        if (p->replicas > 8) snprintf(where + strlen(where), sizeof where - strlen(where), " ...");
        printf("  %-3d %-7d %-9d %-14s %10.1f %12.0f %12.1f %14.0f  %s\n", i + 1, p->stages,
               p->replicas, layers, 1e3 * p->step_s, p->tokens_per_s, 1e-6 * p->peak_memory_bytes,
               p->coupling_bytes_per_step, where);
    }
}

static pipert_result write_plan(const char *path, const char *cluster_path, const pt_cluster *c,
                                const pt_cluster_units *units, const pipert_config *cfg,
                                const pt_solver_plan *best)
{
    pt_plan_file f = {.stages = best->stages, .replicas = best->replicas,
                      .predicted_step_s = best->step_s,
                      .predicted_tokens_per_s = best->tokens_per_s};
    snprintf(f.cluster_path, sizeof f.cluster_path, "%s", cluster_path);
    layers_text(best, f.layers, sizeof f.layers);
    f.placement = calloc((size_t)best->stages * (size_t)best->replicas, sizeof *f.placement);
    f.config_json = pipert_config_to_json(cfg);
    pipert_result rc = f.placement && f.config_json ? PIPERT_OK
                                                    : pt_fail(PIPERT_ERR_NOMEM, "plan: out of memory");
    for (int i = 0; rc == PIPERT_OK && i < best->stages * best->replicas; i++) {
        const int u = best->site_of[i];
        snprintf(f.placement[i].site, sizeof f.placement[i].site, "%s", c->site_names[units->site[u]]);
        if (c->n_groups) snprintf(f.placement[i].group, sizeof f.placement[i].group, "%s", c->groups[u].name);
    }
    if (rc == PIPERT_OK) rc = pt_plan_file_save(path, &f);
    pt_plan_file_free(&f);
    return rc;
}

static pipert_result run_plan(const pipert_config *cfg, const plan_args *a)
{
    PT_TRY(pt_config_validate(cfg));
    pt_cluster cluster;
    PT_TRY(pt_cluster_load(a->cluster_path, &cluster));
    const pt_solver_site fallback = {a->devices, a->device};
    pt_cluster_units units;
    pt_solver_result result = {0};
    pipert_result rc = pt_cluster_units_make(&cluster, &fallback, a->device.efficiency, a->local,
                                             &units);
    const pt_solver_input in = {.config = cfg, .n_sites = units.n, .sites = units.units,
                                .links = units.links, .max_stages = a->max_stages,
                                .allow_spanning = a->spanning, .keep = a->keep};
    if (rc == PIPERT_OK) rc = pt_solve(&in, &result);
    if (rc == PIPERT_OK) {
        print_plans(&cluster, &units, &result);
        rc = write_plan(a->out_path, a->cluster_path, &cluster, &units, cfg, &result.plans[0]);
    }
    if (rc == PIPERT_OK) printf("wrote the best plan to %s (pipert launch --plan %s)\n", a->out_path,
                                a->out_path);
    pt_solver_result_free(&result);
    pt_cluster_units_free(&units);
    pt_cluster_free(&cluster);
    return rc;
}

int pt_cmd_plan(int argc, char **argv)
{
    const char *text[9] = {NULL};
    plan_args a = {0};
    const pt_cli_flag flags[] = {
        {"--cluster", "FILE", "the cluster: its sites and the links between them", &a.cluster_path,
         NULL},
        {"--out", "PLAN", "where the best plan is written", &a.out_path, NULL},
        {"--keep", "N", "plans to print (5)", &text[0], NULL},
        {"--max-stages", "S", "at most this many stages (default: one per block)", &text[1], NULL},
        {"--devices", "N", "devices per site (default: this machine's cores / runtime.threads)",
         &text[2], NULL},
        {"--flops", "F", "FLOP/s of a device (default: the GEMM peak measured here)", &text[3], NULL},
        {"--efficiency", "E", "share of --flops the kernels reach (0.8)", &text[4], NULL},
        {"--memory", "BYTES", "memory of a device (default: this machine's)", &text[5], NULL},
        {"--sparse-cpu", "S", "dp.method=sparse's own CPU seconds per element of a step's partition "
         "(0; scripts/calibrate.sh measures it)", &text[8], NULL},
        {"--spanning", NULL, "also consider pipelines that span sites", NULL, &a.spanning},
    };
    const pt_cli cli = {"plan", "--cluster FILE --out PLAN [options] [--config FILE] [--key=value ...]",
                        "Chooses stages, replicas, the split of the blocks and the site of every\n"
                        "rank for the most predicted tokens/s of the configured model on a\n"
                        "cluster, under every device's memory; prints the best plans and writes\n"
                        "the best as a plan file (docs/RUNNING.md, \"Plan files\").",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg = NULL;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    if (!a.cluster_path || !a.out_path) {
        fprintf(stderr, "pipert plan: --cluster and --out are required\nusage: pipert plan %s\n",
                cli.synopsis);
        pipert_config_free(cfg);
        return pt_cli_exit_status(PT_CLI_USAGE_ERROR);
    }
    pipert_result rc = parse_args(text, cfg, &a);
    if (rc == PIPERT_OK) rc = run_plan(cfg, &a);
    pipert_config_free(cfg);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("plan");
}
