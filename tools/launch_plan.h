/* `pipert launch --plan FILE`: the plan file (scheduler/plan_file.h) says the
 * stages, replicas, split, configuration and the site of every rank; the
 * launcher runs exactly that, emulating the plan's cluster between sites
 * (root) when it has one. The workers get the plan's configuration as a
 * config file written into the job's folder (DIR/plan-config.json), before
 * the command line's --section.key=value, which still override it. */
#ifndef PT_TOOLS_LAUNCH_PLAN_H
#define PT_TOOLS_LAUNCH_PLAN_H

#include <limits.h>

#include "runtime/config.h"
#include "scheduler/plan_file.h"

typedef struct pt_launch_plan {
    pt_plan_file file;
    char config_path[PATH_MAX]; /* DIR/plan-config.json, once written */
} pt_launch_plan;

/* Reads the plan and applies it to cfg: its configuration over --config,
 * then argv's --section.key=value again, and its split (plan.layers). */
pipert_result pt_launch_plan_read(const char *path, int argc, char **argv, pipert_config *cfg,
                                  pt_launch_plan *plan);

/* Writes cfg's configuration as DIR/plan-config.json (atomically) for the
 * workers. */
pipert_result pt_launch_plan_write_config(pt_launch_plan *plan, const pipert_config *cfg,
                                          const char *out_dir);

/* The site (an index into `cluster`'s sites; 0 without one) of stage s of
 * replica r. */
pipert_result pt_launch_plan_site(const pt_launch_plan *plan, const pt_cluster *cluster, int r,
                                  int s, int *site);

void pt_launch_plan_free(pt_launch_plan *plan);

#endif
