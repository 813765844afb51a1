/* Plan files: where a job's ranks run, written by `pipert plan` (or by hand)
 * and read by `pipert launch --plan` and `pipert simulate --plan`
 * (docs/RUNNING.md, "Plan files"):
 *
 *   {
 *     "format": "pipert-plan-1",
 *     "cluster": "two-sites.json",
 *     "stages": 2, "replicas": 2, "layers": "3,3",
 *     "placement": [[{"site": "a", "group": "cpu"}, {"site": "a", "group": "cpu"}],
 *                   [{"site": "b", "group": "cpu"}, {"site": "b", "group": "cpu"}]],
 *     "config": {"pipeline": {"microbatches": 8}, "dp": {"method": "sparse"}},
 *     "predicted": {"step_s": 0.51, "tokens_per_s": 4016}
 *   }
 *
 * `cluster` (optional) is a cluster file, relative to the plan's folder;
 * `placement[r][s]` is where stage s of replica r runs: a site of that
 * cluster and a device group there ("group" optional). `layers` is
 * plan.layers ("" or absent: balanced by compute). `config` is merged into
 * the job's configuration like a config file (the command line still
 * overrides it). `predicted` is what `pipert plan` expected, for the record:
 * it is read back but never used. Unknown keys are errors. */
#ifndef PT_SCHEDULER_PLAN_FILE_H
#define PT_SCHEDULER_PLAN_FILE_H

#include <stdbool.h>

#include "pipert/pipert.h"
#include "scheduler/cluster.h"

#define PT_PLAN_FILE_FORMAT "pipert-plan-1"
#define PT_PLAN_PATH_MAX 4096

typedef struct pt_plan_place {
    char site[PT_CLUSTER_NAME_MAX];
    char group[PT_CLUSTER_NAME_MAX]; /* "" when not given */
} pt_plan_place;

typedef struct pt_plan_file {
    char cluster_path[PT_PLAN_PATH_MAX]; /* resolved against the plan's folder; "" when absent */
    int stages, replicas;
    char layers[1024];
    pt_plan_place *placement; /* [replica·stages + stage] */
    char *config_json;        /* the "config" object as JSON text, or NULL */
    double predicted_step_s, predicted_tokens_per_s; /* 0 when absent */
} pt_plan_file;

/* Reads and checks `path`; with a cluster, every placement's site must be
 * one of it. Errors (PIPERT_ERR_CONFIG) name the file, the position and the
 * field ("plan.json:4:18: placement[1][0].site: ..."); an unreadable file is
 * PIPERT_ERR_IO naming it. */
pipert_result pt_plan_file_load(const char *path, pt_plan_file *plan);
/* A plan from a text in memory (length bytes), `name` standing for its path
 * (a relative cluster path is resolved against its folder); its sites are
 * not checked against the cluster, which is not read. */
pipert_result pt_plan_file_parse(const char *name, const char *text, size_t length,
                                 pt_plan_file *plan);

/* Writes `plan` to `path` atomically (a temporary name, then rename); the
 * cluster's path is written absolute. */
pipert_result pt_plan_file_save(const char *path, const pt_plan_file *plan);

void pt_plan_file_free(pt_plan_file *plan);

/* The index, among `cluster`'s sites, of the site of stage s of replica r. */
pipert_result pt_plan_file_site_index(const pt_plan_file *plan, const pt_cluster *cluster, int r,
                                      int s, int *index);

#endif
