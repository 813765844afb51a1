/* This machine as a cluster file (scheduler/cluster.h), from what `pipert
 * probe` measures: what `pipert probe --cluster-json FILE` writes.
 *
 * One site, named after the host, with one group "cpu": a device per
 * physical core this process may run on (pipert runs a rank per core or per
 * runtime.threads cores); each device's fp32 FLOP/s is the measured GEMM
 * peak shared by the cores it ran on, its memory the host's memory shared by
 * the cores. The group's link is the one measured between two local workers
 * through pipert's transport (latency: half the round trip; bandwidth: the
 * slower direction). Memory bandwidth is not measured, so the loader's
 * default for cpu applies. */
#ifndef PT_TOOLS_PROBE_CLUSTER_H
#define PT_TOOLS_PROBE_CLUSTER_H

#include <jansson.h>

#include "kernels/cpu/peak.h"
#include "runtime/topology.h"
#include "tools/link_probe.h"

/* The cluster file's JSON; `links` are the two directions between ranks 0
 * and 1 (links[1] is 0 → 1, links[2] is 1 → 0, as pt_link_probe_read fills
 * a 2-site table). NULL when out of memory. */
json_t *pt_probe_cluster_json(const pt_topology *topology, const pt_gemm_peak *peak,
                              const pt_link_measure links[4]);

#endif
