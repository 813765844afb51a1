/* How fast the links between a job's sites really are, measured through
 * pipert's own transport: what `pipert probe --sites N` runs.
 *
 * The job has one worker per site (rank i in site i). For every pair of sites
 * (a, b), in order, with a barrier between pairs: PING_ROUNDS round trips of
 * an 8-byte message (median, after warm-up), then a bulk transfer each way
 * of 1 MiB messages all posted at once; the receiver stamps each arrival and
 * takes the rate between the arrival of the first quarter's end and of the
 * last message, so TCP's slow start and the latency do not count: the
 * bandwidth of a long transfer. Each rank writes what it measured to
 * DIR/probe-rank-R.json; the command merges them. */
#ifndef PT_LINK_PROBE_H
#define PT_LINK_PROBE_H

#include "pipert/pipert.h"

/* One measured direction between two sites. */
typedef struct pt_link_measure {
    int from, to;
    double rtt_s;      /* round trip (the same both ways) */
    double bits_per_s; /* bulk, from → to */
} pt_link_measure;

/* In a worker of a launched job: measures every link this rank is an end of
 * and writes DIR/probe-rank-R.json. The bulk transfers last about two seconds at
 * `expected_bits_per_s`; 0 (unknown: a cluster file's links) sizes each direction by the rate
 * of a few messages first. */
pipert_result pt_link_probe_worker(const char *out_dir, double expected_bits_per_s);

/* Reads every DIR/probe-rank-R.json of a job of `sites` ranks into
 * links[from·sites + to] (the diagonal untouched). */
pipert_result pt_link_probe_read(const char *out_dir, int sites, pt_link_measure *links);

#endif
