#include "tools/wan/sites.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/units.h"

/* wan.bandwidth (and wan.latency, 0 when unset): every link alike. */
static pipert_result read_wan(pt_wan_sites *s, const pipert_config *cfg)
{
    const pt_wan_settings *wan = &cfg->wan;
    s->emulated = wan->bandwidth[0] || wan->latency[0];
    if (!s->emulated) return PIPERT_OK;
    if (!wan->bandwidth[0])
        return pt_fail(PIPERT_ERR_CONFIG, "wan.latency=%s needs wan.bandwidth (e.g. 100mbit)",
                       wan->latency);
    PT_TRY(pt_parse_bit_rate(wan->bandwidth, "wan.bandwidth", &s->link.bits_per_s));
    if (wan->latency[0]) PT_TRY(pt_parse_duration(wan->latency, "wan.latency", &s->link.latency_s));
    return PIPERT_OK;
}

/* --cluster FILE: the sites and a link per ordered pair; not beside wan.*. */
static pipert_result read_cluster(pt_wan_sites *s, const char *path, int sites_flag, bool sites_given)
{
    if (s->emulated)
        return pt_fail(PIPERT_ERR_CONFIG, "--cluster %s gives the links: leave out wan.bandwidth "
                                          "and wan.latency", path);
    PT_TRY(pt_cluster_load(path, &s->cluster));
    if (sites_given && sites_flag != s->cluster.n_sites)
        return pt_fail(PIPERT_ERR_CONFIG, "--sites %d, but %s describes %d sites", sites_flag, path,
                       s->cluster.n_sites);
    s->emulated = s->cluster.n_sites > 1;
    return s->emulated ? pt_cpu_limits_plan(&s->cluster, &s->cpu) : PIPERT_OK;
}

pipert_result pt_wan_sites_read(pt_wan_sites *s, const pipert_config *cfg, const char *cluster_path,
                                int sites_flag, bool sites_given)
{
    *s = (pt_wan_sites){.count = sites_flag};
    PT_TRY(read_wan(s, cfg));
    if (cluster_path) {
        PT_TRY(read_cluster(s, cluster_path, sites_flag, sites_given));
        s->count = s->cluster.n_sites;
    }
    if (s->emulated && s->count < 2)
        return pt_fail(PIPERT_ERR_CONFIG, "wan.bandwidth and wan.latency emulate the links between "
                                          "sites: give --sites N with N >= 2");
    return PIPERT_OK;
}

/* One link per ordered pair: from the cluster file, else all alike. */
pipert_result pt_wan_sites_start(pt_wan_sites *s)
{
    if (!s->emulated) return PIPERT_OK;
    const int n = s->count;
    pt_wan_link *links = malloc((size_t)n * (size_t)n * sizeof *links);
    if (!links) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n * n; k++)
        links[k] = s->cluster.n_sites ? (pt_wan_link){s->cluster.links[k].bits_per_s,
                                                      s->cluster.links[k].latency_s}
                                      : s->link;
    pipert_result rc = pt_testbed_create(n, links, &s->testbed);
    free(links);
    return rc;
}

pipert_result pt_wan_sites_limit_cpu(pt_wan_sites *s, const int *cores)
{
    if (!s->cpu.n_sites || !pt_cpu_limits_any(&s->cpu)) return PIPERT_OK;
    const int stale = pt_cpu_limits_remove_stale();
    if (stale) pt_info("removed %d cgroup%s left by a launcher that was killed", stale,
                       stale == 1 ? "" : "s");
    return pt_cpu_limits_start(&s->cpu, cores);
}

pipert_result pt_wan_sites_join_cpu_limit(const pt_wan_sites *s, int site, pid_t pid)
{
    return s->cpu.n_sites ? pt_cpu_limits_join(&s->cpu, site, pid) : PIPERT_OK;
}

const char *pt_wan_sites_coordinator_host(const pt_wan_sites *s)
{
    return s->testbed ? pt_testbed_address(s->testbed, 0) : "127.0.0.1";
}

pipert_result pt_wan_sites_coordinator_listen(const pt_wan_sites *s, int *fd, int *port)
{
    const char *host = pt_wan_sites_coordinator_host(s);
    if (!s->testbed) return pt_coordinator_listen(host, 0, fd, port);
    /* Its socket is made inside site 0's namespace, and stays there. */
    PT_TRY(pt_testbed_enter(s->testbed, 0));
    pipert_result rc = pt_coordinator_listen(host, 0, fd, port);
    pipert_result back = pt_testbed_leave(s->testbed);
    return rc != PIPERT_OK ? rc : back;
}

const char *pt_wan_sites_host(const pt_wan_sites *s, int site, const char *host)
{
    return s->testbed ? pt_testbed_address(s->testbed, site) : host;
}

int pt_wan_sites_namespace_fd(const pt_wan_sites *s, int site)
{
    return s->testbed ? pt_testbed_namespace_fd(s->testbed, site) : -1;
}

int pt_wan_sites_enter(int namespace_fd)
{
    if (setns(namespace_fd, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0)
        return -1;
    umount2("/sys", MNT_DETACH);
    return mount("sysfs", "/sys", "sysfs", 0, NULL);
}

static const char *delay_method(const pt_wan_sites *s)
{
    return pt_testbed_kernel_delay(s->testbed) ? "netem" : "user-space delay: this kernel has no netem";
}

/* The cluster file's links, one line per ordered pair. */
static void print_cluster_links(const pt_wan_sites *s)
{
    const int n = s->count;
    printf("  %d sites from the cluster file, each a network namespace (pipert-%d-sI); links shaped "
           "by tc htb, delayed by %s; TCP only (UCX_TLS=tcp over %s):\n",
           n, (int)getpid(), delay_method(s), PT_WAN_DEVICE);
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            if (a == b) continue;
            const pt_cluster_link *link = &s->cluster.links[a * n + b];
            char rate[32], latency[32];
            pt_format_bit_rate(link->bits_per_s, rate, sizeof rate);
            pt_format_duration(link->latency_s, latency, sizeof latency);
            printf("    site %d (%s) -> site %d (%s): %s, %s one way\n", a,
                   s->cluster.site_names[a], b, s->cluster.site_names[b], rate, latency);
        }
    for (int a = 0; a < s->cpu.n_sites; a++)
        if (s->cpu.made[a]) {
            char dir[256];
            pt_cpu_limits_path(a, dir, sizeof dir);
            printf("    site %d (%s): slower devices, %.0f%% of its cores' time (%s)\n", a,
                   s->cluster.site_names[a], 100.0 * s->cpu.share[a], dir);
        }
}

void pt_wan_sites_print(const pt_wan_sites *s)
{
    if (!s->testbed) return;
    if (s->cluster.n_sites) {
        print_cluster_links(s);
        return;
    }
    char rate[32], latency[32];
    pt_format_bit_rate(s->link.bits_per_s, rate, sizeof rate);
    pt_format_duration(s->link.latency_s, latency, sizeof latency);
    printf("  %d sites, each a network namespace (pipert-%d-sI); between sites %s each way "
           "(tc htb), %s one way (%s), TCP only (UCX_TLS=tcp over %s)\n",
           s->count, (int)getpid(), rate, latency, delay_method(s), PT_WAN_DEVICE);
}

void pt_wan_sites_free(pt_wan_sites *s)
{
    pt_cpu_limits_free(&s->cpu);
    pt_testbed_destroy(s->testbed);
    s->testbed = NULL;
    pt_cluster_free(&s->cluster);
}
