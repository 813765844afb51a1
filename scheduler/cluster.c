#include "scheduler/cluster.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/units.h"
#include "scheduler/json_fields.h"

#define MAX_SITES 254
#define MAX_GROUPS 4096
#define MAX_DEVICES 1000000 /* in all groups together: pt_cluster_devices fits an int */

static int site_index(const pt_cluster *c, const char *name)
{
    for (int i = 0; i < c->n_sites; i++)
        if (!strcmp(c->site_names[i], name)) return i;
    return -1;
}

/* `object`'s "name": 1 to PT_CLUSTER_NAME_MAX−1 characters. */
static pipert_result read_name(const pt_json_file *f, const char *field, json_t *object,
                               const char **name)
{
    char name_field[PT_JSON_FIELD_MAX];
    pt_json_field_path(name_field, "%s.name", field);
    *name = json_string_value(json_object_get(object, "name"));
    if (!*name || !(*name)[0] || strlen(*name) >= PT_CLUSTER_NAME_MAX)
        return pt_json_field_error(f, name_field, "expected a name of 1 to %d characters",
                                   PT_CLUSTER_NAME_MAX - 1);
    return PIPERT_OK;
}

static pipert_result read_sites(const pt_json_file *f, pt_cluster *c)
{
    json_t *sites = json_object_get(f->root, "sites");
    if (!json_is_array(sites) || json_array_size(sites) < 1 || json_array_size(sites) > MAX_SITES)
        return pt_json_field_error(f, "sites", "expected a list of 1 to %d sites", MAX_SITES);
    c->n_sites = (int)json_array_size(sites);
    c->site_names = calloc((size_t)c->n_sites, sizeof *c->site_names);
    c->links = calloc((size_t)c->n_sites * (size_t)c->n_sites, sizeof *c->links);
    if (!c->site_names || !c->links) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", f->path);
    static const char *const known[] = {"name", "groups", NULL};
    for (int i = 0; i < c->n_sites; i++) {
        char field[PT_JSON_FIELD_MAX];
        pt_json_field_path(field, "sites[%d]", i);
        json_t *site = json_array_get(sites, (size_t)i);
        if (!json_is_object(site)) return pt_json_field_error(f, field, "expected an object");
        PT_TRY(pt_json_only_known_keys(f, field, site, known));
        const char *name;
        PT_TRY(read_name(f, field, site, &name));
        if (site_index(c, name) >= 0)
            return pt_json_field_error(f, pt_json_field_path(field, "sites[%d].name", i),
                                       "site '%s' is named twice", name);
        snprintf(c->site_names[i], PT_CLUSTER_NAME_MAX, "%s", name);
    }
    return PIPERT_OK;
}

/* `object`'s "bandwidth" or "latency" with `parse`; absent: left as it is, or
 * an error when `required`. */
static pipert_result read_link_value(const pt_json_file *f, const char *field, json_t *object,
                                     const char *key, bool required, const char *example,
                                     pipert_result (*parse)(const char *, const char *, double *),
                                     double *out)
{
    char key_field[PT_JSON_FIELD_MAX], what[PT_JSON_FIELD_MAX + 512];
    json_t *value = json_object_get(object, key);
    if (!value && !required) return PIPERT_OK;
    pt_json_field_path(key_field, "%s.%s", field, key);
    if (!value) return pt_json_field_error(f, key_field, "missing, e.g. \"%s\"", example);
    pt_json_field_name(f, key_field, what, sizeof what);
    return parse(json_string_value(value), what, out);
}

/* bandwidth and latency of a link object; what it lacks, from `fallback`. */
static pipert_result read_link_values(const pt_json_file *f, const char *field, json_t *object,
                                      const pt_cluster_link *fallback, pt_cluster_link *link)
{
    static const char *const known[] = {"bandwidth", "latency", NULL};
    if (!json_is_object(object)) return pt_json_field_error(f, field, "expected an object");
    if (fallback) PT_TRY(pt_json_only_known_keys(f, field, object, known));
    *link = fallback ? *fallback : (pt_cluster_link){0};
    PT_TRY(read_link_value(f, field, object, "bandwidth", !fallback, "100mbit", pt_parse_bit_rate,
                           &link->bits_per_s));
    return read_link_value(f, field, object, "latency", !fallback, "50ms", pt_parse_duration,
                           &link->latency_s);
}

/* The site named by the string at `field`. */
static pipert_result site_named(const pt_json_file *f, const char *field, const pt_cluster *c,
                                json_t *name, int *index)
{
    const char *text = json_string_value(name);
    *index = text ? site_index(c, text) : -1;
    if (!text) return pt_json_field_error(f, field, "expected a site's name");
    if (*index < 0) return pt_json_field_error(f, field, "'%s' is not one of the sites", text);
    return PIPERT_OK;
}

/* The two ends of a link: "between" [a, b], or "from" a "to" b. */
static pipert_result read_ends(const pt_json_file *f, const char *field, json_t *entry,
                               const pt_cluster *c, int *a, int *b)
{
    char end_field[PT_JSON_FIELD_MAX];
    json_t *between = json_object_get(entry, "between");
    if (between) {
        pt_json_field_path(end_field, "%s.between", field);
        if (!json_is_array(between) || json_array_size(between) != 2)
            return pt_json_field_error(f, end_field, "expected two site names");
        for (size_t k = 0; k < 2; k++) {
            pt_json_field_path(end_field, "%s.between[%zu]", field, k);
            PT_TRY(site_named(f, end_field, c, json_array_get(between, k), k == 0 ? a : b));
        }
    } else {
        pt_json_field_path(end_field, "%s.from", field);
        PT_TRY(site_named(f, end_field, c, json_object_get(entry, "from"), a));
        pt_json_field_path(end_field, "%s.to", field);
        PT_TRY(site_named(f, end_field, c, json_object_get(entry, "to"), b));
    }
    if (*a == *b) return pt_json_field_error(f, field, "a link joins two different sites");
    return PIPERT_OK;
}

static pipert_result read_link(const pt_json_file *f, int i, json_t *entry, pt_cluster *c,
                               bool *given)
{
    char field[PT_JSON_FIELD_MAX];
    pt_json_field_path(field, "links[%d]", i);
    static const char *const known[] = {"between", "from", "to", "bandwidth", "latency", NULL};
    if (!json_is_object(entry)) return pt_json_field_error(f, field, "expected an object");
    PT_TRY(pt_json_only_known_keys(f, field, entry, known));
    int a, b;
    PT_TRY(read_ends(f, field, entry, c, &a, &b));
    pt_cluster_link link;
    PT_TRY(read_link_values(f, field, entry, NULL, &link));
    c->links[a * c->n_sites + b] = link;
    given[a * c->n_sites + b] = true;
    if (json_object_get(entry, "between")) {
        c->links[b * c->n_sites + a] = link;
        given[b * c->n_sites + a] = true;
    }
    return PIPERT_OK;
}

static pipert_result read_links(const pt_json_file *f, pt_cluster *c, bool *given)
{
    json_t *links = json_object_get(f->root, "links");
    if (links && !json_is_array(links)) return pt_json_field_error(f, "links", "expected a list");
    for (size_t i = 0; links && i < json_array_size(links); i++)
        PT_TRY(read_link(f, (int)i, json_array_get(links, i), c, given));
    json_t *fallback = json_object_get(f->root, "default_link");
    pt_cluster_link default_link;
    static const char *const known[] = {"bandwidth", "latency", NULL};
    if (fallback) {
        if (!json_is_object(fallback))
            return pt_json_field_error(f, "default_link", "expected an object");
        PT_TRY(pt_json_only_known_keys(f, "default_link", fallback, known));
        PT_TRY(read_link_values(f, "default_link", fallback, NULL, &default_link));
    }
    for (int a = 0; a < c->n_sites; a++)
        for (int b = 0; b < c->n_sites; b++) {
            if (a == b || given[a * c->n_sites + b]) continue;
            if (!fallback)
                return pt_json_field_error(f, "links", "no link from '%s' to '%s' (list it, or "
                                           "give a default_link)",
                                           c->site_names[a], c->site_names[b]);
            c->links[a * c->n_sites + b] = default_link;
        }
    return PIPERT_OK;
}

/* ---- device groups ------------------------------------------------------------ */

static pipert_result read_positive(const pt_json_file *f, const char *field, json_t *group,
                                   const char *key, bool optional, double *out)
{
    json_t *v = json_object_get(group, key);
    *out = 0;
    if (!v && optional) return PIPERT_OK;
    char key_field[PT_JSON_FIELD_MAX];
    pt_json_field_path(key_field, "%s.%s", field, key);
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return pt_json_field_error(f, key_field, "expected a positive number, e.g. 6.7e13");
    *out = json_number_value(v);
    return PIPERT_OK;
}

static pipert_result read_group_name(const pt_json_file *f, const char *field, json_t *entry,
                                     int site, const pt_cluster *c, pt_cluster_group *g)
{
    const char *name;
    PT_TRY(read_name(f, field, entry, &name));
    char name_field[PT_JSON_FIELD_MAX];
    pt_json_field_path(name_field, "%s.name", field);
    for (int k = 0; k < c->n_groups; k++)
        if (c->groups[k].site == site && !strcmp(c->groups[k].name, name))
            return pt_json_field_error(f, name_field, "group '%s' is named twice in site '%s'",
                                       name, c->site_names[site]);
    snprintf(g->name, sizeof g->name, "%s", name);
    return PIPERT_OK;
}

static pipert_result read_kind_and_count(const pt_json_file *f, const char *field, json_t *entry,
                                         pt_cluster_group *g)
{
    char key_field[PT_JSON_FIELD_MAX];
    const char *kind = json_string_value(json_object_get(entry, "kind"));
    pt_json_field_path(key_field, "%s.kind", field);
    if (!kind || (strcmp(kind, "cuda") != 0 && strcmp(kind, "cpu") != 0))
        return pt_json_field_error(f, key_field, "expected \"cuda\" or \"cpu\"");
    snprintf(g->kind, sizeof g->kind, "%s", kind);
    json_t *count = json_object_get(entry, "count");
    pt_json_field_path(key_field, "%s.count", field);
    if (!json_is_integer(count) || json_integer_value(count) < 1 ||
        json_integer_value(count) > 1000000)
        return pt_json_field_error(f, key_field, "expected a number of devices from 1 to 1000000");
    g->count = (int)json_integer_value(count);
    return PIPERT_OK;
}

static pipert_result read_group(const pt_json_file *f, const char *field, json_t *entry, int site,
                                const pt_cluster *c, pt_cluster_group *g)
{
    static const char *const known[] = {"name", "kind", "count", "fp32_flops", "bf16_flops",
                                        "memory", "memory_bytes_per_s", "link", NULL};
    if (!json_is_object(entry)) return pt_json_field_error(f, field, "expected an object");
    PT_TRY(pt_json_only_known_keys(f, field, entry, known));
    *g = (pt_cluster_group){.site = site};
    PT_TRY(read_group_name(f, field, entry, site, c, g));
    PT_TRY(read_kind_and_count(f, field, entry, g));
    PT_TRY(read_positive(f, field, entry, "fp32_flops", false, &g->fp32_flops));
    PT_TRY(read_positive(f, field, entry, "bf16_flops", true, &g->bf16_flops));
    PT_TRY(read_positive(f, field, entry, "memory_bytes_per_s", true, &g->memory_bytes_per_s));
    if (!g->memory_bytes_per_s) g->memory_bytes_per_s = !strcmp(g->kind, "cuda") ? 1.5e12 : 2e10;
    char sub[PT_JSON_FIELD_MAX], what[PT_JSON_FIELD_MAX + 512];
    pt_json_field_path(sub, "%s.memory", field);
    pt_json_field_name(f, sub, what, sizeof what);
    PT_TRY(pt_parse_byte_size(json_string_value(json_object_get(entry, "memory")), what,
                              &g->memory_bytes));
    static const pt_cluster_link inside = {100e9, 20e-6};
    json_t *link = json_object_get(entry, "link");
    pt_json_field_path(sub, "%s.link", field);
    g->link = inside;
    return link ? read_link_values(f, sub, link, &inside, &g->link) : PIPERT_OK;
}

static pipert_result read_groups(const pt_json_file *f, pt_cluster *c)
{
    json_t *sites = json_object_get(f->root, "sites");
    int devices = 0;
    for (int i = 0; i < c->n_sites; i++) {
        json_t *groups = json_object_get(json_array_get(sites, (size_t)i), "groups");
        char field[PT_JSON_FIELD_MAX];
        pt_json_field_path(field, "sites[%d].groups", i);
        if (groups && !json_is_array(groups)) return pt_json_field_error(f, field, "expected a list");
        for (size_t k = 0; groups && k < json_array_size(groups); k++) {
            if (c->n_groups == MAX_GROUPS)
                return pt_json_field_error(f, field, "more than %d groups", MAX_GROUPS);
            pt_cluster_group *more = realloc(c->groups, (size_t)(c->n_groups + 1) * sizeof *more);
            if (!more) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", f->path);
            c->groups = more;
            pt_json_field_path(field, "sites[%d].groups[%zu]", i, k);
            PT_TRY(read_group(f, field, json_array_get(groups, k), i, c, &c->groups[c->n_groups]));
            devices += c->groups[c->n_groups++].count; /* each at most MAX_DEVICES */
            if (devices > MAX_DEVICES)
                return pt_json_field_error(f, field, "more than %d devices in all groups",
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

static pipert_result read_cluster(const pt_json_file *f, pt_cluster *c)
{
    static const char *const known[] = {"sites", "links", "default_link", "description", "source",
                                        NULL};
    if (!json_is_object(f->root)) return pt_json_field_error(f, "", "expected a JSON object");
    PT_TRY(pt_json_only_known_keys(f, "", f->root, known));
    PT_TRY(read_sites(f, c));
    PT_TRY(read_groups(f, c));
    bool *given = calloc((size_t)c->n_sites * (size_t)c->n_sites, sizeof *given);
    if (!given) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", f->path);
    pipert_result rc = read_links(f, c, given);
    free(given);
    return rc;
}

/* Reads the parsed file into cluster; frees both on failure. */
static pipert_result read_file(pt_json_file *file, pt_cluster *cluster)
{
    pipert_result rc = read_cluster(file, cluster);
    pt_json_file_free(file);
    if (rc != PIPERT_OK) pt_cluster_free(cluster);
    return rc;
}

pipert_result pt_cluster_load(const char *path, pt_cluster *cluster)
{
    memset(cluster, 0, sizeof *cluster);
    pt_json_file file;
    PT_TRY(pt_json_file_load(path, &file));
    return read_file(&file, cluster);
}

pipert_result pt_cluster_parse(const char *name, const char *text, size_t length,
                               pt_cluster *cluster)
{
    memset(cluster, 0, sizeof *cluster);
    pt_json_file file;
    PT_TRY(pt_json_file_parse(name, text, length, &file));
    return read_file(&file, cluster);
}

void pt_cluster_free(pt_cluster *cluster)
{
    free(cluster->site_names);
    free(cluster->links);
    free(cluster->groups);
    memset(cluster, 0, sizeof *cluster);
}
