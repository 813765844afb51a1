#include "tools/wan/cpu_limit.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PERIOD_US 100000 /* cpu.cfs_period_us: 100 ms */

void pt_cpu_limits_path(int site, char *path, size_t capacity)
{
    snprintf(path, capacity, PT_CPU_CGROUP_ROOT "/pipert-%d-s%d", (int)getpid(), site);
}

pipert_result pt_cpu_limits_plan(const pt_cluster *cluster, pt_cpu_limits *out)
{
    *out = (pt_cpu_limits){.n_sites = cluster->n_sites};
    out->share = calloc((size_t)cluster->n_sites, sizeof *out->share);
    out->made = calloc((size_t)cluster->n_sites, sizeof *out->made);
    if (!out->share || !out->made) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    double fastest = 0;
    for (int g = 0; g < cluster->n_groups; g++)
        if (cluster->groups[g].fp32_flops > fastest) fastest = cluster->groups[g].fp32_flops;
    for (int s = 0; s < cluster->n_sites; s++) {
        double site_fastest = 0;
        for (int g = 0; g < cluster->n_groups; g++)
            if (cluster->groups[g].site == s && cluster->groups[g].fp32_flops > site_fastest)
                site_fastest = cluster->groups[g].fp32_flops;
        out->share[s] = site_fastest > 0 && fastest > 0 ? site_fastest / fastest : 1.0;
    }
    return PIPERT_OK;
}

bool pt_cpu_limits_any(const pt_cpu_limits *l)
{
    for (int s = 0; s < l->n_sites; s++)
        if (l->share[s] < 1.0) return true;
    return false;
}

/* Writes `text` into FILE of the cgroup at `dir`. */
static pipert_result write_control(const char *dir, const char *file, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) return pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(errno));
    const bool ok = fputs(text, f) >= 0;
    const bool closed = fclose(f) == 0;
    if (!ok || !closed) return pt_fail(PIPERT_ERR_IO, "%s: cannot write '%s': %s", path, text,
                                       strerror(errno));
    return PIPERT_OK;
}

static pipert_result make_site_group(pt_cpu_limits *l, int site, int cores)
{
    char dir[256], text[64];
    pt_cpu_limits_path(site, dir, sizeof dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pt_fail(PIPERT_ERR_IO, "%s: %s (a slower site needs the cgroup v1 cpu controller "
                                      "at " PT_CPU_CGROUP_ROOT ", and root)",
                       dir, strerror(errno));
    l->made[site] = true;
    const long quota = (long)(l->share[site] * PERIOD_US * (cores > 0 ? cores : 1));
    snprintf(text, sizeof text, "%d", PERIOD_US);
    PT_TRY(write_control(dir, "cpu.cfs_period_us", text));
    snprintf(text, sizeof text, "%ld", quota > 1000 ? quota : 1000);
    return write_control(dir, "cpu.cfs_quota_us", text);
}

pipert_result pt_cpu_limits_start(pt_cpu_limits *l, const int *cores)
{
    for (int s = 0; s < l->n_sites; s++)
        if (l->share[s] < 1.0) PT_TRY(make_site_group(l, s, cores[s]));
    return PIPERT_OK;
}

pipert_result pt_cpu_limits_join(const pt_cpu_limits *l, int site, pid_t pid)
{
    if (site < 0 || site >= l->n_sites || !l->made[site]) return PIPERT_OK;
    char dir[256], text[32];
    pt_cpu_limits_path(site, dir, sizeof dir);
    snprintf(text, sizeof text, "%d", (int)pid);
    return write_control(dir, "cgroup.procs", text);
}

void pt_cpu_limits_free(pt_cpu_limits *l)
{
    for (int s = 0; l->made && s < l->n_sites; s++) {
        if (!l->made[s]) continue;
        char dir[256];
        pt_cpu_limits_path(s, dir, sizeof dir);
        rmdir(dir); /* empty once its processes have exited */
    }
    free(l->share);
    free(l->made);
    *l = (pt_cpu_limits){0};
}

int pt_cpu_limits_remove_stale(void)
{
    DIR *d = opendir(PT_CPU_CGROUP_ROOT);
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int pid, site;
        char tail;
        if (sscanf(e->d_name, "pipert-%d-s%d%c", &pid, &site, &tail) != 2) continue;
        if (pid <= 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
        char dir[512];
        snprintf(dir, sizeof dir, PT_CPU_CGROUP_ROOT "/%s", e->d_name);
        if (rmdir(dir) == 0) removed++;
    }
    closedir(d);
    return removed;
}
