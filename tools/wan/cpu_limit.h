/* The emulated sites' speed: a site whose devices are slower than the cluster's fastest gets
 * that share of its workers' CPU time, through the kernel's CPU bandwidth control (cgroup v1,
 * /sys/fs/cgroup/cpu/pipert-PID-sI: cpu.cfs_quota_us over cpu.cfs_period_us). So a cluster
 * file whose site B has devices of half site A's fp32 FLOP/s runs B's workers at half speed
 * on this machine, which is what `pipert plan` and `pipert simulate` predicted for it.
 *
 * The share of a site is its fastest group's fp32 FLOP/s over the fastest group's of the
 * cluster; sites without groups, and sites as fast as the fastest, are not limited. The
 * quota counts the cores the site's workers are pinned to. Groups of a launcher that was
 * killed are removed by the next launch (pt_cpu_limits_remove_stale). Root only. */
#ifndef PT_WAN_CPU_LIMIT_H
#define PT_WAN_CPU_LIMIT_H

#include <stdbool.h>
#include <sys/types.h>

#include "runtime/error.h"
#include "scheduler/cluster.h"

#define PT_CPU_CGROUP_ROOT "/sys/fs/cgroup/cpu"

typedef struct pt_cpu_limits {
    int n_sites;
    double *share; /* [n_sites]: of the CPU time; 1: not limited */
    bool *made;    /* [n_sites]: its cgroup exists */
} pt_cpu_limits;

/* The share of each site of `cluster` (all 1 without groups). */
pipert_result pt_cpu_limits_plan(const pt_cluster *cluster, pt_cpu_limits *out);

/* Whether any site is limited. */
bool pt_cpu_limits_any(const pt_cpu_limits *l);

/* Creates the cgroup of every limited site, its quota for `cores[site]` cores. */
pipert_result pt_cpu_limits_start(pt_cpu_limits *l, const int *cores);

/* Moves process `pid` (every thread) into its site's cgroup (nothing for a site not limited). */
pipert_result pt_cpu_limits_join(const pt_cpu_limits *l, int site, pid_t pid);

/* The cgroup directory of a site of this launcher. */
void pt_cpu_limits_path(int site, char *path, size_t capacity);

/* Removes the cgroups (their processes must have exited) and frees. */
void pt_cpu_limits_free(pt_cpu_limits *l);

/* Removes pipert-PID-sI cgroups whose launcher is dead; returns how many. */
int pt_cpu_limits_remove_stale(void);

#endif
