/* `pipert probe --cluster-json FILE`: the file it writes describes this
 * machine and loads with the cluster loader, with plausible numbers. */
#include <dirent.h>

#include "command.h"
#include "runtime/topology.h"
#include "scheduler/cluster.h"

/* Files in `dir` other than `keep` (a temporary left behind). */
static int other_files(const char *dir, const char *keep)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int others = 0;
    for (struct dirent *e; (e = readdir(d));)
        others += e->d_name[0] != '.' && strcmp(e->d_name, keep) != 0;
    closedir(d);
    return others;
}

Test(probe, cluster_json_describes_this_machine, .timeout = 240)
{
    char *dir = make_temp_dir(), path[512];
    snprintf(path, sizeof path, "%s/this.json", dir);
    run_result r = run_pipert_with("", "probe --cluster-json %s", path);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    cr_expect_eq(other_files(dir, "this.json"), 0, "a temporary file was left in %s", dir);

    pt_cluster c;
    cr_assert_eq(pt_cluster_load(path, &c), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(c.n_sites, 1);
    cr_assert_eq(c.n_groups, 1);
    const pt_cluster_group *g = &c.groups[0];
    pt_topology *t;
    cr_assert_eq(pt_topology_load(&t), PIPERT_OK);
    cr_expect_eq(g->count, pt_topology_cores(t), "a device per core");
    pt_topology_free(t);
    cr_expect_str_eq(g->kind, "cpu");
    /* a core from 0.1 to 1000 GFLOP/s; 16 MiB to 16 TiB of memory per core */
    cr_expect(g->fp32_flops > 1e8 && g->fp32_flops < 1e12, "fp32_flops %g", g->fp32_flops);
    cr_expect(g->memory_bytes > 16.0 * (1 << 20) && g->memory_bytes < 16.0 * (1ull << 40),
              "memory %g bytes", g->memory_bytes);
    /* two workers of one host: 10 Mbit/s to 10 Tbit/s, 0 to 10 ms one way */
    cr_expect(g->link.bits_per_s > 1e7 && g->link.bits_per_s < 1e13, "link %g bit/s",
              g->link.bits_per_s);
    cr_expect(g->link.latency_s > 0 && g->link.latency_s < 0.01, "latency %g s",
              g->link.latency_s);
    pt_cluster_free(&c);
    remove_dir(dir);
}

Test(probe, cluster_json_is_refused_with_sites)
{
    run_result r = run_pipert_with("", "probe --cluster-json /tmp/never.json --sites 2");
    cr_expect_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_expect(strstr(r.err, "--cluster-json"), "%s", r.err);
    cr_expect_neq(access("/tmp/never.json", F_OK), 0, "the file was written");
}
