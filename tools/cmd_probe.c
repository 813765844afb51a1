/* `pipert probe`: what this machine is (hwloc topology) and how fast it
 * multiplies fp32 matrices (the peak that `pipert bench` reports against). */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/peak.h"
#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/topology.h"
#include "tools/cli.h"
#include "tools/commands.h"

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
    char *text = failed ? NULL : json_dumps(host, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(host);
    if (!text) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot format the host description", path);

    size_t length = strlen(text);
    char *with_newline = realloc(text, length + 2);
    if (!with_newline) {
        free(text);
        return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    }
    with_newline[length] = '\n';
    pipert_result rc = pt_write_file_atomic(path, with_newline, length + 1);
    free(with_newline);
    return rc;
}

int pt_cmd_probe(int argc, char **argv)
{
    const char *threads_text = NULL, *json_path = NULL;
    const pt_cli_flag flags[] = {
        {"--threads", "N", "threads for the GEMM (default: one per core of this process)",
         &threads_text, NULL},
        {"--json", "FILE", "also write the host description with peak_gflops (atomically)",
         &json_path, NULL},
    };
    const pt_cli cli = {"probe", "[--threads N] [--json FILE] [--help]",
                        "Prints this machine's topology (hwloc) and its measured fp32 GEMM peak\n"
                        "(cblas_sgemm, median and best of several runs), the figure that\n"
                        "`pipert bench` reports its share of.",
                        flags, (int)(sizeof flags / sizeof flags[0]), false, NULL};
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, NULL);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    int threads;
    if (pt_cli_parse_int("--threads", threads_text, 1, INT_MAX, 0, &threads) != PIPERT_OK) {
        fprintf(stderr, "pipert probe: %s\nusage: pipert probe %s   (--help for more)\n",
                pipert_last_error(), cli.synopsis);
        return pt_cli_exit_status(PT_CLI_USAGE_ERROR);
    }

    pt_topology *topology;
    if (pt_topology_load(&topology) != PIPERT_OK) return pt_cmd_report_failure("probe");
    pt_topology_describe(topology, stdout);
    fflush(stdout);

    int cores = pt_topology_cores(topology);
    pt_gemm_peak peak;
    pipert_result rc = pt_cpu_gemm_peak(threads ? threads : cores, &peak);
    if (rc == PIPERT_OK) {
        print_peak(&peak, cores);
        if (json_path) {
            rc = write_host_json(topology, &peak, json_path);
            if (rc == PIPERT_OK) printf("\nwrote %s\n", json_path);
        }
    }
    pt_topology_free(topology);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("probe");
}
