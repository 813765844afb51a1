/* The user-space half of the emulated wide area: a thread that forwards IP
 * packets between the sites' tun devices, each held back by the one-way
 * latency of its link (per ordered pair of sites). The kernel shapes the
 * bandwidth before a packet reaches the relay (tc on each tun device), so a
 * packet arrives after its serialization at the link's rate plus the
 * latency, as on a real link; TCP's acknowledgements are delayed on the way
 * back the same way, so round trips, windows and slow start behave as over a
 * long link. Used where the kernel has no netem (with netem the latencies
 * are zero and the relay only forwards). */
#ifndef PT_WAN_RELAY_H
#define PT_WAN_RELAY_H

#include <stdint.h>

#include "pipert/pipert.h"

typedef struct pt_relay pt_relay;

typedef struct pt_relay_stats {
    uint64_t packets, bytes; /* forwarded */
    uint64_t dropped;        /* to no site, not IPv4, or refused by a down device */
} pt_relay_stats;

/* Starts forwarding between `sites` tun devices (IFF_TUN | IFF_NO_PI,
 * non-blocking; the relay does not own them). Site i's address is
 * 10.<subnet_b>.i.* (`subnet_b` the second byte); latency_s[i·sites + j] is the
 * delay from i to j. */
pipert_result pt_relay_start(int sites, const int *tun_fds, const double *latency_s, int subnet_b,
                             pt_relay **out);

/* Stops the thread and frees what it held; packets still held are dropped. */
void pt_relay_stop(pt_relay *relay, pt_relay_stats *stats);

#endif
