/* A cluster description: its sites and the links between them
 * (docs/RUNNING.md, "Cluster files"). `pipert launch --cluster FILE` emulates
 * these links between its sites; the placement scheduler reads the same file.
 *
 *   {
 *     "sites": [{"name": "oregon"}, {"name": "virginia"}, {"name": "seoul"}],
 *     "links": [
 *       {"between": ["oregon", "virginia"], "bandwidth": "790mbit", "latency": "33ms"},
 *       {"from": "seoul", "to": "oregon", "bandwidth": "340mbit", "latency": "62ms"}
 *     ],
 *     "default_link": {"bandwidth": "100mbit", "latency": "50ms"}
 *   }
 *
 * `between` sets both directions, `from`/`to` one; a later entry overrides an
 * earlier one. Every ordered pair of distinct sites needs a link, from the
 * list or from `default_link`. A site may also carry `groups` (its devices),
 * which this reader leaves to the scheduler. Unknown keys are errors. */
#ifndef PT_SCHEDULER_CLUSTER_H
#define PT_SCHEDULER_CLUSTER_H

#include "pipert/pipert.h"

#define PT_CLUSTER_NAME_MAX 64

typedef struct pt_cluster_link {
    double bits_per_s; /* > 0 */
    double latency_s;  /* one way, ≥ 0 */
} pt_cluster_link;

typedef struct pt_cluster {
    int n_sites;
    char (*site_names)[PT_CLUSTER_NAME_MAX]; /* [n_sites] */
    pt_cluster_link *links;                  /* [from·n_sites + to]; the diagonal is zero */
} pt_cluster;

/* Reads and checks `path`. Errors (PIPERT_ERR_CONFIG) name the file and the
 * field: "c.json: links[1].bandwidth: expected a positive bit rate ...",
 * "c.json:3:7: ..." for malformed JSON. */
pipert_result pt_cluster_load(const char *path, pt_cluster *cluster);
void pt_cluster_free(pt_cluster *cluster);

#endif
