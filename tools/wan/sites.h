/* The emulated sites of one `pipert launch` (docs/RUNNING.md, "Emulated
 * sites"): what wan.* or --cluster ask for, the test bed built from it, and
 * what the launcher needs of it — the coordinator's place, each worker's
 * namespace, the lines it prints. Without emulation every call is a no-op
 * that answers for one machine (127.0.0.1). */
#ifndef PT_WAN_SITES_H
#define PT_WAN_SITES_H

#include <stdbool.h>

#include "comm/coordinator.h"
#include "runtime/config.h"
#include "scheduler/cluster.h"
#include "tools/wan/cpu_limit.h"
#include "tools/wan/testbed.h"

#define PT_WAN_HEARTBEAT_TIMEOUT_S 30.0 /* a link may drop for a while */

typedef struct pt_wan_sites {
    bool emulated;       /* wan.* or --cluster */
    pt_wan_link link;    /* wan.*: every link */
    pt_cluster cluster;  /* --cluster: named sites, a link per ordered pair */
    int count;           /* sites */
    pt_testbed *testbed; /* once started */
    pt_cpu_limits cpu;   /* --cluster with device groups: slower sites get less CPU time */
} pt_wan_sites;

/* wan.bandwidth/wan.latency of cfg, or the cluster file (NULL: none), and
 * the number of sites: the cluster's, which `sites_flag` (--sites) may
 * repeat, else sites_flag's value. */
pipert_result pt_wan_sites_read(pt_wan_sites *s, const pipert_config *cfg, const char *cluster_path,
                                int sites_flag, bool sites_given);

/* Builds the test bed (emulated only). */
pipert_result pt_wan_sites_start(pt_wan_sites *s);

/* Limits the CPU time of the sites whose devices are slower (cpu_limit.h), their workers on
 * cores[site] cores; and puts a started worker of `site` under its site's limit. */
pipert_result pt_wan_sites_limit_cpu(pt_wan_sites *s, const int *cores);
pipert_result pt_wan_sites_join_cpu_limit(const pt_wan_sites *s, int site, pid_t pid);

/* The coordinator, listening where the workers reach it: 127.0.0.1, or
 * inside site 0 (the other sites reach it over their links). */
const char *pt_wan_sites_coordinator_host(const pt_wan_sites *s);
/* The coordinator's listening socket (close-on-exec), where the workers reach it. */
pipert_result pt_wan_sites_coordinator_listen(const pt_wan_sites *s, int *fd, int *port);

/* Site i's address, or `host` without emulation. */
const char *pt_wan_sites_host(const pt_wan_sites *s, int site, const char *host);

/* The namespace a worker of site i enters, or −1; and entering it in the
 * child between fork and exec (async-signal-safe), with a /sys that shows
 * the site's devices as `ip netns exec` does. 0 or −1. */
int pt_wan_sites_namespace_fd(const pt_wan_sites *s, int site);
int pt_wan_sites_enter(int namespace_fd);

/* What the launch prints about the links. */
void pt_wan_sites_print(const pt_wan_sites *s);

void pt_wan_sites_free(pt_wan_sites *s);

#endif
