/* Sites on one machine: the wide-area test bed of `pipert launch --sites N`
 * with emulated links (docs/RUNNING.md, "Emulated sites").
 *
 * Each site is a network namespace of its own, `pipert-PID-sI` (PID the
 * launcher's), holding a loopback and one tun device `wan0` with the address
 * 10.211.I.1/16. Workers of a site talk over its loopback; traffic for
 * another site leaves through wan0, where the kernel shapes it (tc htb, one
 * class per destination site at that link's rate, a byte FIFO of one
 * bandwidth-delay product behind it), and reaches the launcher's relay
 * (relay.h), which writes it into the destination site's wan0 after the
 * link's one-way latency, or at once when the kernel's netem delays it
 * instead. Nothing outside the namespaces is touched: no address, route or
 * device of the host.
 *
 * Teardown removes the namespaces (their devices go with the relay's file
 * descriptors). A launcher killed outright leaves its namespaces behind; the
 * next test bed removes those of launchers that no longer exist. Needs root
 * (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2. */
#ifndef PT_WAN_TESTBED_H
#define PT_WAN_TESTBED_H

#include <stdbool.h>

#include "pipert/pipert.h"

#define PT_WAN_DEVICE "wan0"
#define PT_WAN_MTU 9000

/* One direction of the link between two sites. */
typedef struct pt_wan_link {
    double bits_per_s; /* > 0 */
    double latency_s;  /* one way, ≥ 0 */
} pt_wan_link;

typedef struct pt_testbed pt_testbed;

/* Builds `sites` namespaces joined by links[i·sites + j] (from i to j; the
 * diagonal is unused). On failure everything built so far is removed. */
pipert_result pt_testbed_create(int sites, const pt_wan_link *links, pt_testbed **out);

/* Removes every namespace and stops the relay. NULL is fine. */
void pt_testbed_destroy(pt_testbed *tb);

/* "10.211.I.1": the address of site i, reachable from every site. */
const char *pt_testbed_address(const pt_testbed *tb, int site);

/* A descriptor of site i's namespace, for setns(2) in a child between fork
 * and exec. */
int pt_testbed_namespace_fd(const pt_testbed *tb, int site);

/* Moves this thread into site i's namespace / back to where it was; sockets
 * created in between belong to the site. */
pipert_result pt_testbed_enter(const pt_testbed *tb, int site);
pipert_result pt_testbed_leave(const pt_testbed *tb);

/* How latency is added: "netem" (the kernel) or "user space" (the relay). */
bool pt_testbed_kernel_delay(const pt_testbed *tb);

/* Removes the namespaces of test beds whose launcher is gone; how many. */
int pt_testbed_remove_stale(void);

#endif
