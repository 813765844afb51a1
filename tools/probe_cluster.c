#include "tools/probe_cluster.h"

#include <stdio.h>
#include <time.h>

#include "scheduler/cluster.h"

/* The host's name as a site name (at most PT_CLUSTER_NAME_MAX − 1 characters). */
static void site_name(json_t *host, char *out)
{
    const char *name = json_string_value(json_object_get(host, "name"));
    snprintf(out, PT_CLUSTER_NAME_MAX, "%s", name && name[0] ? name : "this-machine");
}

static json_t *link_json(const pt_link_measure links[4])
{
    const double forward = links[1].bits_per_s, backward = links[2].bits_per_s;
    char bandwidth[64], latency[64];
    snprintf(bandwidth, sizeof bandwidth, "%.0fbit", forward < backward ? forward : backward);
    snprintf(latency, sizeof latency, "%.3fus", 1e6 * links[1].rtt_s / 2);
    return json_pack("{s:s, s:s}", "bandwidth", bandwidth, "latency", latency);
}

static json_t *group_json(json_t *host, const pt_gemm_peak *peak, const pt_link_measure links[4])
{
    const json_int_t cores = json_integer_value(json_object_get(host, "cores"));
    const int devices = cores > 0 ? (int)cores : 1;
    const int busy = peak->threads < devices ? peak->threads : devices;
    const double memory = json_number_value(json_object_get(host, "memory_bytes"));
    char memory_text[64];
    snprintf(memory_text, sizeof memory_text, "%.0fb", memory / devices);
    return json_pack("{s:s, s:s, s:i, s:f, s:s, s:o}", "name", "cpu", "kind", "cpu", "count",
                     devices, "fp32_flops", 1e9 * peak->gflops_median / (busy > 0 ? busy : 1),
                     "memory", memory_text, "link", link_json(links));
}

static json_t *source_json(json_t *host, const pt_gemm_peak *peak)
{
    char text[512], date[32];
    time_t now = time(NULL);
    struct tm utc;
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime_r(&now, &utc));
    const char *cpu = json_string_value(json_object_get(host, "cpu_model"));
    snprintf(text, sizeof text,
             "pipert probe --cluster-json, %s: hwloc topology (%s); fp32 FLOP/s: cblas_sgemm "
             "%dx%d, median of %d on %d thread%s, per core; memory: the host's per core; link: two "
             "local workers through pipert's transport (half the median round trip, the slower "
             "direction's bulk rate)",
             date, cpu ? cpu : "CPU model unknown", peak->size, peak->size, peak->repeats,
             peak->threads, peak->threads == 1 ? "" : "s");
    return json_string(text);
}

json_t *pt_probe_cluster_json(const pt_topology *topology, const pt_gemm_peak *peak,
                              const pt_link_measure links[4])
{
    json_t *host = pt_topology_to_json(topology);
    if (!host) return NULL;
    char name[PT_CLUSTER_NAME_MAX], description[PT_CLUSTER_NAME_MAX + 64];
    site_name(host, name);
    snprintf(description, sizeof description, "This machine (%s), as pipert probe measured it",
             name);
    json_t *cluster = json_pack("{s:s, s:o, s:[{s:s, s:[o]}]}", "description", description,
                                "source", source_json(host, peak), "sites", "name", name,
                                "groups", group_json(host, peak, links));
    json_decref(host);
    return cluster;
}
