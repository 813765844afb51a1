/* A cluster as the solver and the simulation see it: units of alike devices
 * (scheduler/solver.h's "sites") and the links between units.
 *
 * With device groups, each group is a unit: its devices joined by the
 * group's link; two groups of one site reach each other over the slower of
 * their links; units in different sites over the cluster's link between the
 * sites. Without groups, each site is a unit of `fallback` devices joined by
 * `local`. A device reaches `efficiency` of its group's fp32 FLOP/s, and every device does
 * dp.method=sparse's own work at `fallback`'s rate (a host's, cost.h). */
#ifndef PT_SCHEDULER_CLUSTER_UNITS_H
#define PT_SCHEDULER_CLUSTER_UNITS_H

#include "scheduler/cluster.h"
#include "scheduler/solver.h"

typedef struct pt_cluster_units {
    int n;
    pt_solver_site *units; /* [n] */
    int *site;             /* [n]: the cluster site of each unit */
    pt_sim_link *links;    /* [n·n] */
} pt_cluster_units;

pipert_result pt_cluster_units_make(const pt_cluster *cluster, const pt_solver_site *fallback,
                                    double efficiency, pt_sim_link local, pt_cluster_units *out);
void pt_cluster_units_free(pt_cluster_units *units);

/* The unit a plan's placement names: its site, and its group where the
 * cluster has groups (a placement without a group takes the site's first). */
pipert_result pt_cluster_units_find(const pt_cluster *cluster, const pt_cluster_units *units,
                                    const char *site, const char *group, int *unit);

/* "site" or "site/group". */
void pt_cluster_units_name(const pt_cluster *cluster, const pt_cluster_units *units, int unit,
                           char *out, size_t capacity);

#endif
