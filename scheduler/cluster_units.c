#include "scheduler/cluster_units.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

static pt_sim_link sim_link(pt_cluster_link l) { return (pt_sim_link){l.bits_per_s / 8, l.latency_s}; }

static pt_sim_link slower(pt_sim_link a, pt_sim_link b)
{
    return (pt_sim_link){a.bytes_per_s < b.bytes_per_s ? a.bytes_per_s : b.bytes_per_s,
                         a.latency_s > b.latency_s ? a.latency_s : b.latency_s};
}

static pt_sim_link unit_link(const pt_cluster *c, const pt_cluster_units *u, pt_sim_link local,
                             int a, int b)
{
    const int x = u->site[a], y = u->site[b];
    if (x != y) return sim_link(c->links[x * c->n_sites + y]);
    if (!c->n_groups) return local;
    const pt_sim_link own = sim_link(c->groups[a].link);
    return a == b ? own : slower(own, sim_link(c->groups[b].link));
}

pipert_result pt_cluster_units_make(const pt_cluster *c, const pt_solver_site *fallback,
                                    double efficiency, pt_sim_link local, pt_cluster_units *out)
{
    const int n = c->n_groups ? c->n_groups : c->n_sites;
    *out = (pt_cluster_units){.n = n};
    out->units = calloc((size_t)n, sizeof *out->units);
    out->site = calloc((size_t)n, sizeof *out->site);
    out->links = calloc((size_t)n * (size_t)n, sizeof *out->links);
    if (!out->units || !out->site || !out->links) {
        pt_cluster_units_free(out);
        return pt_fail(PIPERT_ERR_NOMEM, "cluster: out of memory for %d units", n);
    }
    for (int u = 0; u < n; u++) {
        if (!c->n_groups) {
            out->units[u] = *fallback;
            out->site[u] = u;
            continue;
        }
        const pt_cluster_group *g = &c->groups[u];
        out->units[u] = (pt_solver_site){
            g->count, {g->fp32_flops, efficiency, g->memory_bytes, g->memory_bytes_per_s,
                       fallback->device.sparse_cpu_s_per_element}};
        out->site[u] = g->site;
    }
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) out->links[a * n + b] = unit_link(c, out, local, a, b);
    return PIPERT_OK;
}

void pt_cluster_units_free(pt_cluster_units *u)
{
    free(u->units);
    free(u->site);
    free(u->links);
    *u = (pt_cluster_units){0};
}

pipert_result pt_cluster_units_find(const pt_cluster *c, const pt_cluster_units *units,
                                    const char *site, const char *group, int *unit)
{
    for (int u = 0; u < units->n; u++) {
        if (strcmp(c->site_names[units->site[u]], site) != 0) continue;
        if (c->n_groups && group && group[0] && strcmp(c->groups[u].name, group) != 0) continue;
        *unit = u;
        return PIPERT_OK;
    }
    return pt_fail(PIPERT_ERR_CONFIG, "the cluster has no %s%s%s%s", group && group[0] ? "group '" : "",
                   group && group[0] ? group : "", group && group[0] ? "' in " : "site ", site);
}

void pt_cluster_units_name(const pt_cluster *c, const pt_cluster_units *units, int u, char *out,
                           size_t capacity)
{
    if (c->n_groups)
        snprintf(out, capacity, "%s/%s", c->site_names[units->site[u]], c->groups[u].name);
    else
        snprintf(out, capacity, "%s", c->site_names[units->site[u]]);
}
