/* The machine this process runs on, as hwloc sees it: packages, NUMA nodes,
 * cores, hardware threads (PUs), caches; and pinning threads to cores.
 *
 * "Cores" everywhere here means the physical cores this process may run on:
 * those with at least one PU in the process's CPU affinity mask (taskset,
 * cgroup cpuset) at the time pt_topology_load() ran. Core indices 0..cores-1
 * number those cores in hwloc's logical order, so index 0 is the first core
 * this process owns, not necessarily the machine's core 0.
 */
#ifndef PT_TOPOLOGY_H
#define PT_TOPOLOGY_H

#include <jansson.h>
#include <stdio.h>

#include "runtime/error.h"

typedef struct pt_topology pt_topology; /* opaque, wraps hwloc_topology_t */

/* Discovers the machine and this process's affinity mask. */
pipert_result pt_topology_load(pt_topology **out);
void pt_topology_free(pt_topology *t);

/* Physical cores available to this process. */
int pt_topology_cores(const pt_topology *t);
/* Compute threads of a worker: `configured` (runtime.threads) when > 0,
 * else one per physical core this process may run on (after any binding). */
pipert_result pt_topology_compute_threads(int configured, int *threads);

/* Hardware threads (PUs) available to this process; >= cores with SMT. */
int pt_topology_pus(const pt_topology *t);

/* A human-readable description, several lines: machine model and CPU name
 * where hwloc knows them, packages, NUMA nodes with their memory, cores, PUs,
 * L1d/L2/L3 sizes, total memory. */
void pt_topology_describe(const pt_topology *t, FILE *out);

/* Binds the calling thread to cores [first, first+count) (indices among this
 * process's cores, all of their allowed PUs). */
pipert_result pt_topology_bind_thread_to_cores(const pt_topology *t, int first, int count);
/* Binds every thread of the process; threads created later inherit it. */
pipert_result pt_topology_bind_process_to_cores(const pt_topology *t, int first, int count);

/* The host as JSON (for cluster files); the caller json_decref()s it, NULL if
 * out of memory:
 *   {"name": hostname, "machine": DMI product or null, "cpu_model": or null,
 *    "packages": n, "cores": n, "pus": n, "machine_cores": n, "machine_pus": n,
 *    "memory_bytes": n,
 *    "numa_nodes": [{"os_index": i, "memory_bytes": n, "cores": n}, ...],
 *    "caches": {"l1d_bytes": n, "l2_bytes": n, "l3_bytes": n}}   (0 if unknown) */
json_t *pt_topology_to_json(const pt_topology *t);

#endif
