#include "tools/launch_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/error.h"
#include "tools/cli.h"

pipert_result pt_launch_plan_read(const char *path, int argc, char **argv, pipert_config *cfg,
                                  pt_launch_plan *plan)
{
    *plan = (pt_launch_plan){0};
    PT_TRY(pt_plan_file_load(path, &plan->file));
    if (plan->file.config_json) PT_TRY(pt_config_merge_json(cfg, plan->file.config_json, path));
    if (plan->file.layers[0])
        snprintf(cfg->plan.layers, sizeof cfg->plan.layers, "%s", plan->file.layers);
    return pt_cli_apply_overrides(argc, argv, cfg);
}

pipert_result pt_launch_plan_write_config(pt_launch_plan *plan, const pipert_config *cfg,
                                          const char *out_dir)
{
    char tmp[PATH_MAX + 8];
    snprintf(plan->config_path, sizeof plan->config_path, "%s/plan-config.json", out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", plan->config_path);
    char *text = pipert_config_to_json(cfg);
    FILE *f = text ? fopen(tmp, "w") : NULL;
    const bool written = f && fputs(text, f) >= 0;
    const bool closed = f && fclose(f) == 0;
    free(text);
    if (!written || !closed || rename(tmp, plan->config_path) != 0) {
        unlink(tmp);
        return pt_fail(PIPERT_ERR_IO, "%s: cannot write the plan's configuration",
                       plan->config_path);
    }
    return PIPERT_OK;
}

pipert_result pt_launch_plan_site(const pt_launch_plan *plan, const pt_cluster *cluster, int r,
                                  int s, int *site)
{
    *site = 0;
    if (!cluster || !cluster->n_sites) return PIPERT_OK;
    return pt_plan_file_site_index(&plan->file, cluster, r, s, site);
}

void pt_launch_plan_free(pt_launch_plan *plan) { pt_plan_file_free(&plan->file); }
