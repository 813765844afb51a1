#include "tools/wan/testbed.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/log.h"
#include "tools/command.h"
#include "tools/wan/relay.h"

#define SUBNET_B 211               /* sites are 10.211.I.0/24 */
#define NAME_PREFIX "pipert-"      /* pipert-PID-sI */
#define NETNS_DIR "/run/netns"
#define MIN_QUEUE_BYTES (16 * PT_WAN_MTU)
#define DEFAULT_TCP_BUFFER_MAX 6291456.0 /* net.ipv4.tcp_rmem's third value */

typedef struct site {
    char name[64];       /* the namespace */
    char address[20];    /* 10.211.I.1 */
    int namespace_fd;    /* /run/netns/NAME */
    int tun_fd;
    bool created;
} site;

struct pt_testbed {
    int n;
    site *sites;
    pt_wan_link *links; /* [from·n + to] */
    int home_fd;        /* the namespace the launcher started in */
    bool kernel_delay;  /* netem delays; the relay only forwards */
    pt_relay *relay;
    int *relay_fds;     /* the tun devices, in site order, as the relay reads them */
};

/* ---- namespaces ----------------------------------------------------------- */

static pipert_result ip_netns(const char *verb, const char *name)
{
    const char *argv[] = {"ip", "netns", verb, name, NULL};
    return pt_run_command(argv);
}

static pipert_result create_namespace(pt_testbed *tb, int i)
{
    site *s = &tb->sites[i];
    snprintf(s->name, sizeof s->name, NAME_PREFIX "%d-s%d", (int)getpid(), i);
    snprintf(s->address, sizeof s->address, "10.%d.%d.1", SUBNET_B, i);
    PT_TRY(ip_netns("add", s->name));
    s->created = true;
    char path[128];
    snprintf(path, sizeof path, NETNS_DIR "/%s", s->name);
    s->namespace_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->namespace_fd < 0) return pt_fail(PIPERT_ERR_IO, "%s: %s", path, strerror(errno));
    return PIPERT_OK;
}

pipert_result pt_testbed_enter(const pt_testbed *tb, int i)
{
    if (setns(tb->sites[i].namespace_fd, CLONE_NEWNET) != 0)
        return pt_fail(PIPERT_ERR_IO, "cannot enter network namespace %s: %s", tb->sites[i].name,
                       strerror(errno));
    return PIPERT_OK;
}

pipert_result pt_testbed_leave(const pt_testbed *tb)
{
    if (setns(tb->home_fd, CLONE_NEWNET) != 0)
        return pt_fail(PIPERT_ERR_IO, "cannot return to the launcher's network namespace: %s",
                       strerror(errno));
    return PIPERT_OK;
}

/* wan0 is created where the thread is: inside the site. */
static pipert_result open_tun(pt_testbed *tb, int i)
{
    PT_TRY(pt_testbed_enter(tb, i));
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    struct ifreq request = {.ifr_flags = IFF_TUN | IFF_NO_PI};
    snprintf(request.ifr_name, sizeof request.ifr_name, "%s", PT_WAN_DEVICE);
    int error = fd < 0 ? errno : ioctl(fd, TUNSETIFF, &request) != 0 ? errno : 0;
    PT_TRY(pt_testbed_leave(tb));
    if (error) {
        if (fd >= 0) close(fd);
        return pt_fail(PIPERT_ERR_IO, "%s: cannot create the tun device %s: %s", tb->sites[i].name,
                       PT_WAN_DEVICE, strerror(error));
    }
    tb->sites[i].tun_fd = fd;
    return PIPERT_OK;
}

static pipert_result configure_addresses(const site *s)
{
    char prefix[32], mtu[16];
    snprintf(prefix, sizeof prefix, "%s/16", s->address);
    snprintf(mtu, sizeof mtu, "%d", PT_WAN_MTU);
    const char *lo_up[] = {"ip", "-n", s->name, "link", "set", "lo", "up", NULL};
    const char *address[] = {"ip", "-n", s->name, "addr", "add", prefix, "dev", PT_WAN_DEVICE, NULL};
    const char *up[] = {"ip", "-n", s->name, "link", "set", PT_WAN_DEVICE, "mtu", mtu, "up", NULL};
    PT_TRY(pt_run_command(lo_up));
    PT_TRY(pt_run_command(address));
    return pt_run_command(up);
}

/* Writes /proc/sys/NAME inside site i (network sysctls are per namespace). */
static pipert_result set_sysctl(const pt_testbed *tb, int i, const char *name, const char *value)
{
    char path[128];
    snprintf(path, sizeof path, "/proc/sys/%s", name);
    PT_TRY(pt_testbed_enter(tb, i));
    FILE *f = fopen(path, "w");
    int error = !f ? errno : fputs(value, f) < 0 ? EIO : 0;
    if (f && fclose(f) != 0 && !error) error = errno;
    PT_TRY(pt_testbed_leave(tb));
    if (error)
        return pt_fail(PIPERT_ERR_IO, "%s: cannot set %s to '%s': %s", tb->sites[i].name, path,
                       value, strerror(error));
    return PIPERT_OK;
}

/* TCP's buffers may grow to four round trips of the fastest link: Linux's
 * default limit (6 MB) caps one connection at about 3 MB in flight, a
 * quarter of what 1 Gbit/s over 100 ms of round trip needs, and the link,
 * not the host, is what the test bed emulates. */
static pipert_result open_tcp_windows(const pt_testbed *tb, int i)
{
    double largest_bdp = 0;
    for (int j = 0; j < tb->n; j++) {
        const pt_wan_link *link = &tb->links[i * tb->n + j];
        double bdp = j == i ? 0 : link->bits_per_s / 8 * 2 * link->latency_s;
        largest_bdp = bdp > largest_bdp ? bdp : largest_bdp;
    }
    if (largest_bdp * 4 <= DEFAULT_TCP_BUFFER_MAX) return PIPERT_OK;
    char receive[64], send[64];
    snprintf(receive, sizeof receive, "4096 131072 %.0f", largest_bdp * 4);
    snprintf(send, sizeof send, "4096 16384 %.0f", largest_bdp * 4);
    PT_TRY(set_sysctl(tb, i, "net/ipv4/tcp_rmem", receive));
    return set_sysctl(tb, i, "net/ipv4/tcp_wmem", send);
}

/* ---- shaping ----------------------------------------------------------------- */

/* Whether the kernel has netem: tried on site 0's loopback, then removed. */
static bool kernel_has_netem(const pt_testbed *tb)
{
    const char *add[] = {"tc", "-n", tb->sites[0].name, "qdisc", "add", "dev", "lo", "root",
                         "netem", "delay", "1ms", NULL};
    const char *del[] = {"tc", "-n", tb->sites[0].name, "qdisc", "del", "dev", "lo", "root", NULL};
    if (!pt_command_succeeds(add)) return false;
    pt_command_succeeds(del);
    return true;
}

/* The queue behind a link's rate: a byte FIFO of one bandwidth-delay product
 * (round trip), as a router buffer is sized; with netem, the packets the
 * delay holds. */
static pipert_result add_link_queue(const pt_testbed *tb, const site *s, const pt_wan_link *link,
                                    const char *parent, const char *handle)
{
    double bdp_bytes = link->bits_per_s / 8 * 2 * link->latency_s;
    char limit[32], delay[32];
    if (tb->kernel_delay) {
        snprintf(limit, sizeof limit, "%.0f", 2 * bdp_bytes / PT_WAN_MTU + 1000);
        snprintf(delay, sizeof delay, "%.0fus", link->latency_s * 1e6);
        const char *netem[] = {"tc", "-n", s->name, "qdisc", "add", "dev", PT_WAN_DEVICE, "parent",
                               parent, "handle", handle, "netem", "delay", delay, "limit", limit,
                               NULL};
        return pt_run_command(netem);
    }
    snprintf(limit, sizeof limit, "%.0f", bdp_bytes > MIN_QUEUE_BYTES ? bdp_bytes : MIN_QUEUE_BYTES);
    const char *fifo[] = {"tc", "-n", s->name, "qdisc", "add", "dev", PT_WAN_DEVICE, "parent",
                          parent, "handle", handle, "bfifo", "limit", limit, NULL};
    return pt_run_command(fifo);
}

/* Site i's traffic to site j: its own htb class at the link's rate, chosen by
 * the destination address. */
static pipert_result shape_link(const pt_testbed *tb, int i, int j)
{
    const site *s = &tb->sites[i];
    const pt_wan_link *link = &tb->links[i * tb->n + j];
    char classid[16], handle[16], rate[32], quantum[16], destination[32];
    snprintf(classid, sizeof classid, "1:%x", j + 1);
    snprintf(handle, sizeof handle, "%x:", j + 2);
    snprintf(rate, sizeof rate, "%.0fbit", link->bits_per_s);
    snprintf(quantum, sizeof quantum, "%d", PT_WAN_MTU);
    snprintf(destination, sizeof destination, "10.%d.%d.0/24", SUBNET_B, j);
    const char *class[] = {"tc", "-n", s->name, "class", "add", "dev", PT_WAN_DEVICE, "parent",
                           "1:", "classid", classid, "htb", "rate", rate, "ceil", rate,
                           "quantum", quantum, NULL};
    const char *filter[] = {"tc", "-n", s->name, "filter", "add", "dev", PT_WAN_DEVICE,
                            "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
                            "dst", destination, "flowid", classid, NULL};
    PT_TRY(pt_run_command(class));
    PT_TRY(add_link_queue(tb, s, link, classid, handle));
    return pt_run_command(filter);
}

static pipert_result shape_site(const pt_testbed *tb, int i)
{
    const char *root[] = {"tc", "-n", tb->sites[i].name, "qdisc", "add", "dev", PT_WAN_DEVICE,
                          "root", "handle", "1:", "htb", NULL};
    PT_TRY(pt_run_command(root));
    for (int j = 0; j < tb->n; j++)
        if (j != i) PT_TRY(shape_link(tb, i, j));
    return PIPERT_OK;
}

/* ---- the whole bed ------------------------------------------------------------ */

static pipert_result check_links(int n, const pt_wan_link *links)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (i != j && (!(links[i * n + j].bits_per_s > 0) || !(links[i * n + j].latency_s >= 0)))
                return pt_fail(PIPERT_ERR_INVALID_ARG,
                               "the link from site %d to site %d needs a positive bandwidth and a "
                               "latency of at least 0", i, j);
    return PIPERT_OK;
}

static pipert_result start_relay(pt_testbed *tb)
{
    int *fds = tb->relay_fds = malloc((size_t)tb->n * sizeof *fds);
    double *latency = calloc((size_t)tb->n * (size_t)tb->n, sizeof *latency);
    pipert_result rc = fds && latency ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    for (int i = 0; rc == PIPERT_OK && i < tb->n; i++) fds[i] = tb->sites[i].tun_fd;
    for (int k = 0; rc == PIPERT_OK && !tb->kernel_delay && k < tb->n * tb->n; k++)
        latency[k] = tb->links[k].latency_s;
    if (rc == PIPERT_OK) rc = pt_relay_start(tb->n, fds, latency, SUBNET_B, &tb->relay);
    free(latency);
    return rc;
}

static pipert_result build(pt_testbed *tb)
{
    tb->home_fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (tb->home_fd < 0) return pt_fail(PIPERT_ERR_IO, "/proc/self/ns/net: %s", strerror(errno));
    for (int i = 0; i < tb->n; i++) {
        PT_TRY(create_namespace(tb, i));
        PT_TRY(open_tun(tb, i));
        PT_TRY(configure_addresses(&tb->sites[i]));
        PT_TRY(open_tcp_windows(tb, i));
    }
    tb->kernel_delay = kernel_has_netem(tb);
    for (int i = 0; i < tb->n; i++) PT_TRY(shape_site(tb, i));
    return start_relay(tb);
}

pipert_result pt_testbed_create(int sites, const pt_wan_link *links, pt_testbed **out)
{
    *out = NULL;
    if (geteuid() != 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "emulated links between sites (wan.bandwidth, wan.latency) need root: the "
                       "sites are network namespaces with shaped devices (CAP_NET_ADMIN, "
                       "CAP_SYS_ADMIN); run as root, or without wan.* for sites on one fast link");
    PT_TRY(check_links(sites, links));
    int stale = pt_testbed_remove_stale();
    if (stale) pt_info("removed %d network namespace%s left by a launcher that was killed", stale,
                       stale == 1 ? "" : "s");
    pt_testbed *tb = calloc(1, sizeof *tb);
    if (tb) tb->sites = calloc((size_t)sites, sizeof *tb->sites);
    if (tb) tb->links = malloc((size_t)sites * (size_t)sites * sizeof *tb->links);
    if (!tb || !tb->sites || !tb->links) {
        pt_testbed_destroy(tb);
        return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    }
    tb->n = sites;
    tb->home_fd = -1;
    memcpy(tb->links, links, (size_t)sites * (size_t)sites * sizeof *links);
    for (int i = 0; i < sites; i++) tb->sites[i].namespace_fd = tb->sites[i].tun_fd = -1;
    pipert_result rc = build(tb);
    if (rc != PIPERT_OK) {
        pt_error_prefix("emulated sites");
        char message[1024];
        snprintf(message, sizeof message, "%s", pipert_last_error());
        pt_testbed_destroy(tb);
        return pt_fail(rc, "%s", message);
    }
    *out = tb;
    return PIPERT_OK;
}

void pt_testbed_destroy(pt_testbed *tb)
{
    if (!tb) return;
    pt_relay_stats stats = {0};
    if (tb->relay) {
        pt_relay_stop(tb->relay, &stats);
        pt_debug("relay: %llu packets (%llu bytes) forwarded, %llu dropped",
                 (unsigned long long)stats.packets, (unsigned long long)stats.bytes,
                 (unsigned long long)stats.dropped);
    }
    for (int i = 0; tb->sites && i < tb->n; i++) {
        site *s = &tb->sites[i];
        if (s->tun_fd >= 0) close(s->tun_fd);
        if (s->namespace_fd >= 0) close(s->namespace_fd);
        if (s->created && ip_netns("del", s->name) != PIPERT_OK)
            pt_warn("%s", pipert_last_error());
    }
    if (tb->home_fd >= 0) close(tb->home_fd);
    free(tb->relay_fds);
    free(tb->sites);
    free(tb->links);
    free(tb);
}

const char *pt_testbed_address(const pt_testbed *tb, int i) { return tb->sites[i].address; }

int pt_testbed_namespace_fd(const pt_testbed *tb, int i) { return tb->sites[i].namespace_fd; }

bool pt_testbed_kernel_delay(const pt_testbed *tb) { return tb->kernel_delay; }

/* ---- what killed launchers left ------------------------------------------------- */

/* The launcher's pid in "pipert-PID-sI", or 0. */
static pid_t owner_of(const char *name)
{
    if (strncmp(name, NAME_PREFIX, strlen(NAME_PREFIX)) != 0) return 0;
    char *end;
    long pid = strtol(name + strlen(NAME_PREFIX), &end, 10);
    return pid > 0 && end[0] == '-' && end[1] == 's' ? (pid_t)pid : 0;
}

int pt_testbed_remove_stale(void)
{
    DIR *dir = opendir(NETNS_DIR);
    if (!dir) return 0;
    int removed = 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        pid_t pid = owner_of(entry->d_name);
        if (pid <= 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
        if (ip_netns("del", entry->d_name) == PIPERT_OK) removed++;
        else pt_warn("%s", pipert_last_error());
    }
    closedir(dir);
    return removed;
}
