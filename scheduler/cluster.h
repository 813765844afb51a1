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
 * list or from `default_link`. A site may list its devices in groups of
 * alike ones:
 *
 *   "groups": [{"name": "h100", "kind": "cuda", "count": 8, "fp32_flops": 6.7e13,
 *               "bf16_flops": 9.89e14, "memory": "80gib",
 *               "link": {"bandwidth": "3600gbit", "latency": "2us"}}]
 *
 * kind "cuda" or "cpu"; count ≥ 1 devices (at most 10⁶ in all groups);
 * FLOP/s per device (fp32 required, bf16 optional); memory per device with a
 * unit (b, kb…tb, kib…tib);
 * "memory_bytes_per_s" its bandwidth (optional: 1.5e12 for cuda, 2e10 for
 * cpu; the optimizer step streams at it); `link` joins the devices of the
 * group (optional: 100gbit, 20us). Group names are
 * unique within a site. A site without groups is valid (emulating links needs
 * only sites). Top-level "description" and "source" strings are for people.
 * Unknown keys are errors. */
#ifndef PT_SCHEDULER_CLUSTER_H
#define PT_SCHEDULER_CLUSTER_H

#include "pipert/pipert.h"

#define PT_CLUSTER_NAME_MAX 64

typedef struct pt_cluster_link {
    double bits_per_s; /* > 0 */
    double latency_s;  /* one way, ≥ 0 */
} pt_cluster_link;

/* A group of alike devices in one site. */
typedef struct pt_cluster_group {
    char name[PT_CLUSTER_NAME_MAX];
    int site; /* index into site_names */
    char kind[16]; /* "cuda" | "cpu" */
    int count;
    double fp32_flops, bf16_flops; /* per device; bf16 0 = unknown */
    double memory_bytes;           /* per device */
    double memory_bytes_per_s;     /* per device */
    pt_cluster_link link;          /* between the group's devices */
} pt_cluster_group;

typedef struct pt_cluster {
    int n_sites;
    char (*site_names)[PT_CLUSTER_NAME_MAX]; /* [n_sites] */
    pt_cluster_link *links;                  /* [from·n_sites + to]; the diagonal is zero */
    int n_groups;
    pt_cluster_group *groups; /* [n_groups]: every site's, in file order */
} pt_cluster;

/* Devices in every group together. */
int pt_cluster_devices(const pt_cluster *cluster);

/* Reads and checks `path`. Errors (PIPERT_ERR_CONFIG) name the file, the
 * position and the field: "c.json:14:17: links[1].bandwidth: expected a
 * positive bit rate ..." (scheduler/json_fields.h); "c.json:3:7: ..." for
 * malformed JSON. An unreadable file is PIPERT_ERR_IO naming it. */
pipert_result pt_cluster_load(const char *path, pt_cluster *cluster);
/* The same from a text in memory (length bytes); `name` stands for the path. */
pipert_result pt_cluster_parse(const char *name, const char *text, size_t length,
                               pt_cluster *cluster);
void pt_cluster_free(pt_cluster *cluster);

#endif
