/* libFuzzer harness: cluster files (scheduler/cluster.c: sites, links, device
 * groups, and the units of runtime/units.c). A cluster that reads has a link
 * for every ordered pair of distinct sites, groups in its sites, and becomes
 * the solver's units. */
#include <math.h>

#include "fuzz/fuzz.h"
#include "scheduler/cluster.h"
#include "scheduler/cluster_units.h"

static void check_cluster(const pt_cluster *c)
{
    FUZZ_CHECK(c->n_sites >= 1);
    for (int a = 0; a < c->n_sites; a++)
        for (int b = 0; b < c->n_sites; b++) {
            const pt_cluster_link *l = &c->links[a * c->n_sites + b];
            FUZZ_CHECK(a == b || (l->bits_per_s > 0 && isfinite(l->bits_per_s)));
            FUZZ_CHECK(a == b || (l->latency_s >= 0 && isfinite(l->latency_s)));
        }
    for (int g = 0; g < c->n_groups; g++)
        FUZZ_CHECK(c->groups[g].site >= 0 && c->groups[g].site < c->n_sites &&
                   c->groups[g].count >= 1);
    FUZZ_CHECK(pt_cluster_devices(c) >= c->n_groups);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    pt_cluster cluster;
    if (pt_cluster_parse("fuzz-cluster.json", (const char *)data, size, &cluster) != PIPERT_OK)
        return 0;
    check_cluster(&cluster);
    const pt_solver_site fallback = {1, {1e9, 0.5, 1e9, 1e10, 0}};
    pt_cluster_units units;
    if (pt_cluster_units_make(&cluster, &fallback, 0.5, (pt_sim_link){1e9, 1e-5}, &units) ==
        PIPERT_OK) {
        char name[2 * PT_CLUSTER_NAME_MAX];
        for (int u = 0; u < units.n; u++)
            pt_cluster_units_name(&cluster, &units, u, name, sizeof name);
        pt_cluster_units_free(&units);
    }
    pt_cluster_free(&cluster);
    return 0;
}
