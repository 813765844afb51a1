/* `pipert probe`: what this machine is (hwloc topology) and how fast it
 * multiplies fp32 matrices (the peak that `pipert bench` reports against);
 * with --sites N, how fast the links between N sites are (emulated ones
 * with wan.bandwidth and wan.latency), measured by a launched job of one
 * worker per site (tools/link_probe.h) and printed beside what was asked;
 * with --cluster-json FILE, this machine as a cluster file
 * (tools/probe_cluster.h). */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/peak.h"
#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/config.h"
#include "runtime/topology.h"
#include "runtime/units.h"
#include "scheduler/cluster.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/link_probe.h"
#include "tools/probe_cluster.h"

static void print_peak(const pt_gemm_peak *peak, int cores)
{
    int busy_cores = peak->threads < cores ? peak->threads : cores;
    printf("\nfp32 GEMM peak (cblas_sgemm %dx%d, %d thread%s, median of %d):\n", peak->size,
           peak->size, peak->threads, peak->threads == 1 ? "" : "s", peak->repeats);
    printf("  median:   %8.1f GFLOP/s  (%.3f s per multiplication)\n", peak->gflops_median,
           peak->seconds);
    printf("  best:     %8.1f GFLOP/s\n", peak->gflops_best);
    printf("  per core: %8.1f GFLOP/s  (median over %d core%s)\n",
           peak->gflops_median / busy_cores, busy_cores, busy_cores == 1 ? "" : "s");
}

/* The host description plus the measured peak, written atomically. */
static pipert_result write_host_json(const pt_topology *topology, const pt_gemm_peak *peak,
                                     const char *path)
{
    json_t *host = pt_topology_to_json(topology);
    if (!host) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot build the host description", path);
    int failed = json_object_set_new(host, "peak_gflops", json_real(peak->gflops_median));
    failed |= json_object_set_new(host, "peak_gflops_best", json_real(peak->gflops_best));
    failed |= json_object_set_new(host, "peak_threads", json_integer(peak->threads));
    failed |= json_object_set_new(host, "peak_gemm_size", json_integer(peak->size));
    pipert_result rc = failed ? pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path)
                              : pt_write_json_atomic(path, host, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(host);
    return rc;
}

/* This machine as a cluster file (tools/probe_cluster.h), written atomically. */
static pipert_result write_cluster_json(const pt_topology *topology, const pt_gemm_peak *peak,
                                        const pt_link_measure links[4], const char *path)
{
    json_t *cluster = pt_probe_cluster_json(topology, peak, links);
    if (!cluster) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot build the cluster description", path);
    pipert_result rc = pt_write_json_atomic(path, cluster, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(cluster);
    return rc;
}

/* ---- links between sites ---------------------------------------------------- */

typedef struct requested_link {
    double bits_per_s, latency_s; /* 0 when not emulated */
} requested_link;

/* What was asked of each ordered pair: the cluster file's links, else wan.*
 * for every pair. */
static requested_link *requested_links(const pipert_config *cfg, const pt_cluster *cluster, int sites)
{
    requested_link *asked = calloc((size_t)sites * (size_t)sites, sizeof *asked);
    if (!asked) return NULL;
    requested_link uniform = {0};
    if (cfg->wan.bandwidth[0])
        pt_parse_bit_rate(cfg->wan.bandwidth, "wan.bandwidth", &uniform.bits_per_s);
    if (cfg->wan.latency[0]) pt_parse_duration(cfg->wan.latency, "wan.latency", &uniform.latency_s);
    for (int k = 0; k < sites * sites; k++)
        asked[k] = cluster->n_sites ? (requested_link){cluster->links[k].bits_per_s,
                                                       cluster->links[k].latency_s}
                                    : uniform;
    return asked;
}

static void print_links(const pt_link_measure *links, int sites, const requested_link *asked_links)
{
    printf("%-8s %12s %12s %16s %16s\n", "link", "rtt", "asked rtt", "bandwidth", "asked");
    for (int i = 0; i < sites; i++)
        for (int j = 0; j < sites; j++) {
            if (i == j) continue;
            const pt_link_measure *m = &links[i * sites + j];
            const requested_link asked = asked_links[i * sites + j];
            const double asked_rtt_s = asked.latency_s + asked_links[j * sites + i].latency_s;
            char name[32], rtt[32], asked_rtt[32] = "-", rate[32], asked_rate[32] = "-";
            snprintf(name, sizeof name, "%d -> %d", i, j);
            pt_format_duration(m->rtt_s, rtt, sizeof rtt);
            pt_format_bit_rate(m->bits_per_s, rate, sizeof rate);
            if (asked.bits_per_s > 0) {
                pt_format_duration(asked_rtt_s, asked_rtt, sizeof asked_rtt);
                pt_format_bit_rate(asked.bits_per_s, asked_rate, sizeof asked_rate);
            }
            printf("%-8s %12s %12s %16s %16s\n", name, rtt, asked_rtt, rate, asked_rate);
        }
}

static pipert_result write_links_json(const pt_link_measure *links, int sites,
                                      const requested_link *asked, const char *path)
{
    json_t *rows = json_array();
    for (int i = 0; rows && i < sites; i++)
        for (int j = 0; j < sites; j++)
            if (i != j)
                json_array_append_new(
                    rows, json_pack("{s:i, s:i, s:f, s:f, s:f, s:f}", "from", i, "to", j, "rtt_s",
                                    links[i * sites + j].rtt_s, "bits_per_s",
                                    links[i * sites + j].bits_per_s, "asked_rtt_s",
                                    asked[i * sites + j].latency_s + asked[j * sites + i].latency_s,
                                    "asked_bits_per_s",
                                    asked[i * sites + j].bits_per_s));
    pipert_result rc = pt_write_json_atomic(path, rows, JSON_INDENT(2));
    json_decref(rows);
    return rc;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

/* `pipert launch --probe --sites N --replicas N` with the configuration
 * arguments given to probe, into dir. */
static int launch_probe_job(int sites, const char *cluster_path, const char *dir, int argc,
                            char **argv)
{
    char sites_text[16];
    snprintf(sites_text, sizeof sites_text, "%d", sites);
    char **args = calloc((size_t)argc + 16, sizeof *args);
    if (!args) return 1;
    int k = 0;
    const char *fixed[] = {"--probe", "--quiet", "--stages", "1", "--replicas",
                           sites_text, "--sites", sites_text, "--out", dir};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) args[k++] = (char *)fixed[i];
    if (cluster_path) {
        args[k++] = "--cluster";
        args[k++] = (char *)cluster_path;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            args[k++] = argv[i++];
            args[k++] = argv[i];
        } else if (!strncmp(argv[i], "--", 2) && strchr(argv[i], '=')) {
            args[k++] = argv[i];
        }
    }
    int status = pt_cmd_launch(k, args);
    free(args);
    return status;
}

/* Runs the probe job of one worker per site and reads what it measured
 * into links[from·sites + to]. Returns an exit status. */
static int measure_links(int sites, const char *cluster_path, const char *out_dir, int argc,
                         char **argv, pt_link_measure *links)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", out_dir ? out_dir : "/tmp/pipert-probe-XXXXXX");
    if (!out_dir && !mkdtemp(dir)) {
        fprintf(stderr, "pipert probe: cannot make a directory in /tmp\n");
        return 1;
    }
    int status = launch_probe_job(sites, cluster_path, dir, argc, argv);
    pipert_result rc = status != 0 ? PIPERT_ERR_PEER : pt_link_probe_read(dir, sites, links);
    if (rc != PIPERT_OK && status == 0) fprintf(stderr, "pipert probe: %s\n", pipert_last_error());
    if (!out_dir) nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc == PIPERT_OK ? 0 : status ? status : 1;
}

static int probe_sites(int sites, const pt_cluster *cluster, const char *cluster_path,
                       const pipert_config *cfg, const char *out_dir, const char *json_path,
                       int argc, char **argv)
{
    requested_link *asked = requested_links(cfg, cluster, sites);
    pt_link_measure *links = calloc((size_t)sites * (size_t)sites, sizeof *links);
    int status = asked && links ? measure_links(sites, cluster_path, out_dir, argc, argv, links) : 1;
    if (status == 0) print_links(links, sites, asked);
    if (status == 0 && json_path && write_links_json(links, sites, asked, json_path) != PIPERT_OK) {
        fprintf(stderr, "pipert probe: %s\n", pipert_last_error());
        status = 1;
    }
    free(links);
    free(asked);
    return status;
}

/* The topology and the GEMM peak, printed; with json_path the host
 * description, with cluster_path this machine as a cluster file (`links`:
 * between two local workers). */
static int probe_host(int threads, const char *json_path, const char *cluster_path,
                      const pt_link_measure links[4])
{
    pt_topology *topology;
    if (pt_topology_load(&topology) != PIPERT_OK) return pt_cmd_report_failure("probe");
    pt_topology_describe(topology, stdout);
    fflush(stdout);

    int cores = pt_topology_cores(topology);
    pt_gemm_peak peak;
    pipert_result rc = pt_cpu_gemm_peak(threads ? threads : cores, &peak);
    if (rc == PIPERT_OK) print_peak(&peak, cores);
    if (rc == PIPERT_OK && json_path) {
        rc = write_host_json(topology, &peak, json_path);
        if (rc == PIPERT_OK) printf("\nwrote %s\n", json_path);
    }
    if (rc == PIPERT_OK && cluster_path) {
        rc = write_cluster_json(topology, &peak, links, cluster_path);
        if (rc == PIPERT_OK) printf("\nwrote %s (this machine as a cluster file)\n", cluster_path);
    }
    pt_topology_free(topology);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("probe");
}

int pt_cmd_probe(int argc, char **argv)
{
    const char *threads_text = NULL, *json_path = NULL, *sites_text = NULL, *out_dir = NULL,
               *cluster_path = NULL;
    const char *cluster_json = NULL;
    const pt_cli_flag flags[] = {
        {"--threads", "N", "threads for the GEMM (default: one per core of this process)",
         &threads_text, NULL},
        {"--json", "FILE", "also write the host description with peak_gflops (with --sites: the "
                           "measured links) (atomically)", &json_path, NULL},
        {"--sites", "N", "measure the links between N sites instead (one worker per site, "
                         "through pipert's transport); emulated with --wan.bandwidth=R "
                         "--wan.latency=D (root)", &sites_text, NULL},
        {"--cluster", "FILE", "measure the links of this cluster description (its sites, each "
                              "link emulated as it says; root)", &cluster_path, NULL},
        {"--cluster-json", "FILE", "write this machine as a cluster file (one site, one group "
                                   "of its cores; measures the link between two local workers "
                                   "too) (atomically)", &cluster_json, NULL},
        {"--out", "DIR", "with --sites or --cluster-json: keep the probe job's directory (logs) "
                         "here", &out_dir, NULL},
    };
    const pt_cli cli = {"probe", "[--threads N] [--json FILE] [--sites N [--wan.bandwidth=R] "
                                 "[--wan.latency=D]] [--cluster-json FILE] [--help]",
                        "Prints this machine's topology (hwloc) and its measured fp32 GEMM peak\n"
                        "(cblas_sgemm, median and best of several runs), the figure that\n"
                        "`pipert bench` reports its share of. With --sites N: the round-trip\n"
                        "time and bulk bandwidth of each link between N sites, beside the\n"
                        "requested ones. With --cluster-json FILE: this machine as a cluster\n"
                        "file for `pipert plan` (docs/RUNNING.md, \"Cluster files\").",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    int threads, sites;
    if (pt_cli_parse_int("--sites", sites_text, 2, 254, 0, &sites) != PIPERT_OK) {
        fprintf(stderr, "pipert probe: %s\n", pipert_last_error());
        pipert_config_free(cfg);
        return 2;
    }
    if (cluster_json && (sites || cluster_path)) {
        fprintf(stderr, "pipert probe: --cluster-json describes this machine; it does not go "
                        "with --sites or --cluster\n");
        pipert_config_free(cfg);
        return pt_cli_exit_status(PT_CLI_USAGE_ERROR);
    }
    pt_cluster cluster = {0};
    if (cluster_path && pt_cluster_load(cluster_path, &cluster) != PIPERT_OK) {
        fprintf(stderr, "pipert probe: %s\n", pipert_last_error());
        pipert_config_free(cfg);
        return 1;
    }
    if (cluster.n_sites) sites = cluster.n_sites;
    if (sites) {
        int status = probe_sites(sites, &cluster, cluster_path, cfg, out_dir, json_path, argc, argv);
        pt_cluster_free(&cluster);
        pipert_config_free(cfg);
        return status;
    }
    if (pt_cli_parse_int("--threads", threads_text, 1, INT_MAX, 0, &threads) != PIPERT_OK) {
        fprintf(stderr, "pipert probe: %s\nusage: pipert probe %s   (--help for more)\n",
                pipert_last_error(), cli.synopsis);
        pipert_config_free(cfg);
        return pt_cli_exit_status(PT_CLI_USAGE_ERROR);
    }
    pipert_config_free(cfg);
    pt_link_measure links[4] = {0};
    if (cluster_json) {
        int status = measure_links(2, NULL, out_dir, argc, argv, links);
        if (status != 0) return status;
    }
    return probe_host(threads, json_path, cluster_json, links);
}
