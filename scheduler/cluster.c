#include "scheduler/cluster.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "scheduler/json_fields.h"
#include "runtime/units.h"

#define MAX_SITES 254
#define MAX_GROUPS 4096
#define MAX_DEVICES 1000000 /* in all groups together: pt_cluster_devices fits an int */

static int site_index(const pt_cluster *c, const char *name)
{
    for (int i = 0; i < c->n_sites; i++)
        if (!strcmp(c->site_names[i], name)) return i;
    return -1;
}

static pipert_result read_sites(const char *path, json_t *root, pt_cluster *c)
{
    json_t *sites = json_object_get(root, "sites");
    if (!json_is_array(sites) || json_array_size(sites) < 1 || json_array_size(sites) > MAX_SITES)
        return pt_json_field_error(path, "sites", "expected a list of 1 to %d sites", MAX_SITES);
    c->n_sites = (int)json_array_size(sites);
    c->site_names = calloc((size_t)c->n_sites, sizeof *c->site_names);
    c->links = calloc((size_t)c->n_sites * (size_t)c->n_sites, sizeof *c->links);
    if (!c->site_names || !c->links) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    static const char *const known[] = {"name", "groups", NULL};
    for (int i = 0; i < c->n_sites; i++) {
        char field[32];
        snprintf(field, sizeof field, "sites[%d]", i);
        json_t *site = json_array_get(sites, (size_t)i);
        if (!json_is_object(site)) return pt_json_field_error(path, field, "expected an object");
        PT_TRY(pt_json_only_known_keys(path, field, site, known));
        const char *name = json_string_value(json_object_get(site, "name"));
        if (!name || !name[0] || strlen(name) >= PT_CLUSTER_NAME_MAX)
            return pt_json_field_error(path, field, "needs a \"name\" of 1 to %d characters",
                              PT_CLUSTER_NAME_MAX - 1);
        if (site_index(c, name) >= 0)
            return pt_json_field_error(path, field, "site '%s' is named twice", name);
        snprintf(c->site_names[i], PT_CLUSTER_NAME_MAX, "%s", name);
    }
    return PIPERT_OK;
}

/* bandwidth and latency of a link object; what it lacks, from `fallback`. */
static pipert_result read_link_values(const char *path, const char *field, json_t *object,
                                      const pt_cluster_link *fallback, pt_cluster_link *link)
{
    const char *bandwidth = json_string_value(json_object_get(object, "bandwidth"));
    const char *latency = json_string_value(json_object_get(object, "latency"));
    char what[96];
    if (!bandwidth && !fallback) return pt_json_field_error(path, field, "needs \"bandwidth\", e.g. \"100mbit\"");
    if (!latency && !fallback) return pt_json_field_error(path, field, "needs \"latency\", e.g. \"50ms\"");
    *link = fallback ? *fallback : (pt_cluster_link){0};
    snprintf(what, sizeof what, "%s: %s.bandwidth", path, field);
    if (bandwidth) PT_TRY(pt_parse_bit_rate(bandwidth, what, &link->bits_per_s));
    snprintf(what, sizeof what, "%s: %s.latency", path, field);
    if (latency) PT_TRY(pt_parse_duration(latency, what, &link->latency_s));
    return PIPERT_OK;
}

static pipert_result site_named(const char *path, const char *field, const pt_cluster *c,
                                json_t *name, int *index)
{
    const char *text = json_string_value(name);
    *index = text ? site_index(c, text) : -1;
    if (*index < 0)
        return pt_json_field_error(path, field, "'%s' is not one of the sites", text ? text : "(not a string)");
    return PIPERT_OK;
}

static pipert_result read_link(const char *path, int i, json_t *entry, pt_cluster *c, bool *given)
{
    char field[32];
    snprintf(field, sizeof field, "links[%d]", i);
    static const char *const known[] = {"between", "from", "to", "bandwidth", "latency", NULL};
    if (!json_is_object(entry)) return pt_json_field_error(path, field, "expected an object");
    PT_TRY(pt_json_only_known_keys(path, field, entry, known));
    json_t *between = json_object_get(entry, "between");
    int a, b;
    if (between) {
        if (!json_is_array(between) || json_array_size(between) != 2)
            return pt_json_field_error(path, field, "\"between\" takes two site names");
        PT_TRY(site_named(path, field, c, json_array_get(between, 0), &a));
        PT_TRY(site_named(path, field, c, json_array_get(between, 1), &b));
    } else {
        PT_TRY(site_named(path, field, c, json_object_get(entry, "from"), &a));
        PT_TRY(site_named(path, field, c, json_object_get(entry, "to"), &b));
    }
    if (a == b) return pt_json_field_error(path, field, "a link joins two different sites");
    pt_cluster_link link;
    PT_TRY(read_link_values(path, field, entry, NULL, &link));
    c->links[a * c->n_sites + b] = link;
    given[a * c->n_sites + b] = true;
    if (between) {
        c->links[b * c->n_sites + a] = link;
        given[b * c->n_sites + a] = true;
    }
    return PIPERT_OK;
}

static pipert_result read_links(const char *path, json_t *root, pt_cluster *c, bool *given)
{
    json_t *links = json_object_get(root, "links");
    if (links && !json_is_array(links)) return pt_json_field_error(path, "links", "expected a list");
    for (size_t i = 0; links && i < json_array_size(links); i++)
        PT_TRY(read_link(path, (int)i, json_array_get(links, i), c, given));
    json_t *fallback = json_object_get(root, "default_link");
    pt_cluster_link default_link;
    static const char *const known[] = {"bandwidth", "latency", NULL};
    if (fallback) {
        if (!json_is_object(fallback)) return pt_json_field_error(path, "default_link", "expected an object");
        PT_TRY(pt_json_only_known_keys(path, "default_link", fallback, known));
        PT_TRY(read_link_values(path, "default_link", fallback, NULL, &default_link));
    }
    for (int a = 0; a < c->n_sites; a++)
        for (int b = 0; b < c->n_sites; b++) {
            if (a == b || given[a * c->n_sites + b]) continue;
            if (!fallback)
                return pt_fail(PIPERT_ERR_CONFIG, "%s: links: no link from '%s' to '%s' (list it, "
                                                  "or give a default_link)",
                               path, c->site_names[a], c->site_names[b]);
            c->links[a * c->n_sites + b] = default_link;
        }
    return PIPERT_OK;
}

/* ---- device groups ------------------------------------------------------------ */

static pipert_result read_positive(const char *path, const char *field, json_t *group,
                                   const char *key, bool optional, double *out)
{
    json_t *v = json_object_get(group, key);
    *out = 0;
    if (!v && optional) return PIPERT_OK;
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return pt_json_field_error(path, field, "\"%s\": expected a positive number, e.g. 6.7e13", key);
    *out = json_number_value(v);
    return PIPERT_OK;
}

static pipert_result read_group(const char *path, const char *field, json_t *entry, int site,
                                const pt_cluster *c, pt_cluster_group *g)
{
    static const char *const known[] = {"name", "kind", "count", "fp32_flops", "bf16_flops",
                                        "memory", "memory_bytes_per_s", "link", NULL};
    if (!json_is_object(entry)) return pt_json_field_error(path, field, "expected an object");
    PT_TRY(pt_json_only_known_keys(path, field, entry, known));
    const char *name = json_string_value(json_object_get(entry, "name"));
    if (!name || !name[0] || strlen(name) >= PT_CLUSTER_NAME_MAX)
        return pt_json_field_error(path, field, "needs a \"name\" of 1 to %d characters",
                          PT_CLUSTER_NAME_MAX - 1);
    for (int k = 0; k < c->n_groups; k++)
        if (c->groups[k].site == site && !strcmp(c->groups[k].name, name))
            return pt_json_field_error(path, field, "group '%s' is named twice in site '%s'", name,
                              c->site_names[site]);
    *g = (pt_cluster_group){.site = site};
    snprintf(g->name, sizeof g->name, "%s", name);
    const char *kind = json_string_value(json_object_get(entry, "kind"));
    if (!kind || (strcmp(kind, "cuda") != 0 && strcmp(kind, "cpu") != 0))
        return pt_json_field_error(path, field, "\"kind\": expected \"cuda\" or \"cpu\"");
    snprintf(g->kind, sizeof g->kind, "%s", kind);
    json_t *count = json_object_get(entry, "count");
    if (!json_is_integer(count) || json_integer_value(count) < 1 ||
        json_integer_value(count) > 1000000)
        return pt_json_field_error(path, field, "\"count\": expected a number of devices from 1 to 1000000");
    g->count = (int)json_integer_value(count);
    PT_TRY(read_positive(path, field, entry, "fp32_flops", false, &g->fp32_flops));
    PT_TRY(read_positive(path, field, entry, "bf16_flops", true, &g->bf16_flops));
    PT_TRY(read_positive(path, field, entry, "memory_bytes_per_s", true, &g->memory_bytes_per_s));
    if (!g->memory_bytes_per_s) g->memory_bytes_per_s = !strcmp(kind, "cuda") ? 1.5e12 : 2e10;
    char what[160];
    snprintf(what, sizeof what, "%s: %s.memory", path, field);
    PT_TRY(pt_parse_byte_size(json_string_value(json_object_get(entry, "memory")), what,
                              &g->memory_bytes));
    static const pt_cluster_link inside = {100e9, 20e-6};
    json_t *link = json_object_get(entry, "link");
    char link_field[96];
    snprintf(link_field, sizeof link_field, "%s.link", field);
    if (link && !json_is_object(link)) return pt_json_field_error(path, link_field, "expected an object");
    static const char *const link_keys[] = {"bandwidth", "latency", NULL};
    if (link) PT_TRY(pt_json_only_known_keys(path, link_field, link, link_keys));
    g->link = inside;
    if (link) PT_TRY(read_link_values(path, link_field, link, &inside, &g->link));
    return PIPERT_OK;
}

static pipert_result read_groups(const char *path, json_t *root, pt_cluster *c)
{
    json_t *sites = json_object_get(root, "sites");
    int devices = 0;
    for (int i = 0; i < c->n_sites; i++) {
        json_t *groups = json_object_get(json_array_get(sites, (size_t)i), "groups");
        char field[64];
        snprintf(field, sizeof field, "sites[%d].groups", i);
        if (groups && !json_is_array(groups)) return pt_json_field_error(path, field, "expected a list");
        for (size_t k = 0; groups && k < json_array_size(groups); k++) {
            if (c->n_groups == MAX_GROUPS)
                return pt_json_field_error(path, field, "more than %d groups", MAX_GROUPS);
            pt_cluster_group *more = realloc(c->groups, (size_t)(c->n_groups + 1) * sizeof *more);
            if (!more) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
            c->groups = more;
            snprintf(field, sizeof field, "sites[%d].groups[%zu]", i, k);
            PT_TRY(read_group(path, field, json_array_get(groups, k), i, c, &c->groups[c->n_groups]));
            devices += c->groups[c->n_groups++].count; /* each at most MAX_DEVICES */
            if (devices > MAX_DEVICES)
                return pt_json_field_error(path, field, "more than %d devices in all groups",
                                           MAX_DEVICES);
        }
    }
    return PIPERT_OK;
}

int pt_cluster_devices(const pt_cluster *cluster)
{
    int n = 0;
    for (int i = 0; i < cluster->n_groups; i++) n += cluster->groups[i].count;
    return n;
}

static pipert_result read_cluster(const char *path, json_t *root, pt_cluster *c)
{
    static const char *const known[] = {"sites", "links", "default_link", "description", "source",
                                        NULL};
    if (!json_is_object(root)) return pt_fail(PIPERT_ERR_CONFIG, "%s: expected a JSON object", path);
    PT_TRY(pt_json_only_known_keys(path, "top level", root, known));
    PT_TRY(read_sites(path, root, c));
    PT_TRY(read_groups(path, root, c));
    bool *given = calloc((size_t)c->n_sites * (size_t)c->n_sites, sizeof *given);
    if (!given) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    pipert_result rc = read_links(path, root, c, given);
    free(given);
    return rc;
}

/* Reads the parsed document (or jansson's error) into cluster; frees it on failure. */
static pipert_result read_document(const char *path, json_t *root, const json_error_t *error,
                                   pt_cluster *cluster)
{
    memset(cluster, 0, sizeof *cluster);
    if (!root)
        return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", path, error->line, error->column,
                       error->text);
    pipert_result rc = read_cluster(path, root, cluster);
    json_decref(root);
    if (rc != PIPERT_OK) pt_cluster_free(cluster);
    return rc;
}

pipert_result pt_cluster_load(const char *path, pt_cluster *cluster)
{
    json_error_t error;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    return read_document(path, root, &error, cluster);
}

pipert_result pt_cluster_parse(const char *name, const char *text, size_t length,
                               pt_cluster *cluster)
{
    json_error_t error;
    json_t *root = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
    return read_document(name, root, &error, cluster);
}

void pt_cluster_free(pt_cluster *cluster)
{
    free(cluster->site_names);
    free(cluster->links);
    free(cluster->groups);
    memset(cluster, 0, sizeof *cluster);
}
