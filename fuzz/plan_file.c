/* libFuzzer harness: plan files (scheduler/plan_file.c), read from memory so
 * that no cluster file is opened. A plan that reads has stages × replicas
 * placements, each naming a site, and each is looked up in a small cluster. */
#include <string.h>

#include "fuzz/fuzz.h"
#include "scheduler/plan_file.h"

static const char cluster_text[] =
    "{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}], "
    "\"default_link\": {\"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}}";

static void check_plan(const pt_plan_file *plan, const pt_cluster *cluster)
{
    FUZZ_CHECK(plan->stages >= 1 && plan->replicas >= 1 && plan->placement);
    for (int r = 0; r < plan->replicas; r++)
        for (int s = 0; s < plan->stages; s++) {
            FUZZ_CHECK(plan->placement[r * plan->stages + s].site[0] != '\0');
            int index = -1;
            if (pt_plan_file_site_index(plan, cluster, r, s, &index) == PIPERT_OK)
                FUZZ_CHECK(index >= 0 && index < cluster->n_sites);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    pt_plan_file plan;
    if (pt_plan_file_parse("/nonexistent/fuzz-plan.json", (const char *)data, size, &plan) !=
        PIPERT_OK)
        return 0;
    pt_cluster cluster;
    FUZZ_CHECK(pt_cluster_parse("cluster", cluster_text, strlen(cluster_text), &cluster) ==
               PIPERT_OK);
    check_plan(&plan, &cluster);
    pt_cluster_free(&cluster);
    pt_plan_file_free(&plan);
    return 0;
}
