#include "scheduler/cluster.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/units.h"

#define MAX_SITES 254

/* "PATH: FIELD: message". */
static pipert_result fail_field(const char *path, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static pipert_result fail_field(const char *path, const char *field, const char *fmt, ...)
{
    char message[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return pt_fail(PIPERT_ERR_CONFIG, "%s: %s: %s", path, field, message);
}

/* Every key of `object` is one of the NULL-terminated `known`. */
static pipert_result only_known_keys(const char *path, const char *field, json_t *object,
                                     const char *const *known)
{
    const char *key;
    json_t *value;
    json_object_foreach(object, key, value) {
        const char *const *k = known;
        while (*k && strcmp(*k, key) != 0) k++;
        if (!*k) return fail_field(path, field, "unknown key '%s'", key);
    }
    return PIPERT_OK;
}

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
        return fail_field(path, "sites", "expected a list of 1 to %d sites", MAX_SITES);
    c->n_sites = (int)json_array_size(sites);
    c->site_names = calloc((size_t)c->n_sites, sizeof *c->site_names);
    c->links = calloc((size_t)c->n_sites * (size_t)c->n_sites, sizeof *c->links);
    if (!c->site_names || !c->links) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    static const char *const known[] = {"name", "groups", NULL};
    for (int i = 0; i < c->n_sites; i++) {
        char field[32];
        snprintf(field, sizeof field, "sites[%d]", i);
        json_t *site = json_array_get(sites, (size_t)i);
        if (!json_is_object(site)) return fail_field(path, field, "expected an object");
        PT_TRY(only_known_keys(path, field, site, known));
        const char *name = json_string_value(json_object_get(site, "name"));
        if (!name || !name[0] || strlen(name) >= PT_CLUSTER_NAME_MAX)
            return fail_field(path, field, "needs a \"name\" of 1 to %d characters",
                              PT_CLUSTER_NAME_MAX - 1);
        if (site_index(c, name) >= 0)
            return fail_field(path, field, "site '%s' is named twice", name);
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
    if (!bandwidth && !fallback) return fail_field(path, field, "needs \"bandwidth\", e.g. \"100mbit\"");
    if (!latency && !fallback) return fail_field(path, field, "needs \"latency\", e.g. \"50ms\"");
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
        return fail_field(path, field, "'%s' is not one of the sites", text ? text : "(not a string)");
    return PIPERT_OK;
}

static pipert_result read_link(const char *path, int i, json_t *entry, pt_cluster *c, bool *given)
{
    char field[32];
    snprintf(field, sizeof field, "links[%d]", i);
    static const char *const known[] = {"between", "from", "to", "bandwidth", "latency", NULL};
    if (!json_is_object(entry)) return fail_field(path, field, "expected an object");
    PT_TRY(only_known_keys(path, field, entry, known));
    json_t *between = json_object_get(entry, "between");
    int a, b;
    if (between) {
        if (!json_is_array(between) || json_array_size(between) != 2)
            return fail_field(path, field, "\"between\" takes two site names");
        PT_TRY(site_named(path, field, c, json_array_get(between, 0), &a));
        PT_TRY(site_named(path, field, c, json_array_get(between, 1), &b));
    } else {
        PT_TRY(site_named(path, field, c, json_object_get(entry, "from"), &a));
        PT_TRY(site_named(path, field, c, json_object_get(entry, "to"), &b));
    }
    if (a == b) return fail_field(path, field, "a link joins two different sites");
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
    if (links && !json_is_array(links)) return fail_field(path, "links", "expected a list");
    for (size_t i = 0; links && i < json_array_size(links); i++)
        PT_TRY(read_link(path, (int)i, json_array_get(links, i), c, given));
    json_t *fallback = json_object_get(root, "default_link");
    pt_cluster_link default_link;
    static const char *const known[] = {"bandwidth", "latency", NULL};
    if (fallback) {
        if (!json_is_object(fallback)) return fail_field(path, "default_link", "expected an object");
        PT_TRY(only_known_keys(path, "default_link", fallback, known));
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

static pipert_result read_cluster(const char *path, json_t *root, pt_cluster *c)
{
    static const char *const known[] = {"sites", "links", "default_link", NULL};
    if (!json_is_object(root)) return pt_fail(PIPERT_ERR_CONFIG, "%s: expected a JSON object", path);
    PT_TRY(only_known_keys(path, "top level", root, known));
    PT_TRY(read_sites(path, root, c));
    bool *given = calloc((size_t)c->n_sites * (size_t)c->n_sites, sizeof *given);
    if (!given) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    pipert_result rc = read_links(path, root, c, given);
    free(given);
    return rc;
}

pipert_result pt_cluster_load(const char *path, pt_cluster *cluster)
{
    memset(cluster, 0, sizeof *cluster);
    json_error_t error;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", path, error.line, error.column, error.text);
    pipert_result rc = read_cluster(path, root, cluster);
    json_decref(root);
    if (rc != PIPERT_OK) pt_cluster_free(cluster);
    return rc;
}

void pt_cluster_free(pt_cluster *cluster)
{
    free(cluster->site_names);
    free(cluster->links);
    memset(cluster, 0, sizeof *cluster);
}
