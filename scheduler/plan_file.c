#include "scheduler/plan_file.h"

#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/error.h"
#include "scheduler/json_fields.h"

#define MAX_RANKS 65536

static pipert_result read_count(const pt_json_file *f, const char *key, int *out)
{
    json_t *v = json_object_get(f->root, key);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > MAX_RANKS)
        return pt_json_field_error(f, key, "expected an integer from 1 to %d", MAX_RANKS);
    *out = (int)json_integer_value(v);
    return PIPERT_OK;
}

/* A name of 1 to PT_CLUSTER_NAME_MAX−1 characters (optional: absent is ""). */
static pipert_result read_name(const pt_json_file *f, const char *field, json_t *place,
                               const char *key, bool optional, char *out)
{
    json_t *v = json_object_get(place, key);
    if (!v && optional) return PIPERT_OK;
    const char *text = json_string_value(v);
    char key_field[PT_JSON_FIELD_MAX];
    pt_json_field_path(key_field, "%s.%s", field, key);
    if (!text || !text[0] || strlen(text) >= PT_CLUSTER_NAME_MAX)
        return pt_json_field_error(f, key_field, "expected a name of 1 to %d characters",
                                   PT_CLUSTER_NAME_MAX - 1);
    snprintf(out, PT_CLUSTER_NAME_MAX, "%s", text);
    return PIPERT_OK;
}

static pipert_result read_place(const pt_json_file *f, const char *field, json_t *place,
                                pt_plan_place *at)
{
    static const char *const known[] = {"site", "group", NULL};
    if (!json_is_object(place)) return pt_json_field_error(f, field, "expected an object");
    PT_TRY(pt_json_only_known_keys(f, field, place, known));
    PT_TRY(read_name(f, field, place, "site", false, at->site));
    return read_name(f, field, place, "group", true, at->group);
}

static pipert_result read_placement(const pt_json_file *f, pt_plan_file *p)
{
    json_t *rows = json_object_get(f->root, "placement");
    if (!json_is_array(rows) || (int)json_array_size(rows) != p->replicas)
        return pt_json_field_error(f, "placement", "expected a list of %d replicas (one list of "
                                   "%d stages each)", p->replicas, p->stages);
    p->placement = calloc((size_t)p->replicas * (size_t)p->stages, sizeof *p->placement);
    if (!p->placement) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", f->path);
    for (int r = 0; r < p->replicas; r++) {
        char field[PT_JSON_FIELD_MAX];
        pt_json_field_path(field, "placement[%d]", r);
        json_t *row = json_array_get(rows, (size_t)r);
        if (!json_is_array(row) || (int)json_array_size(row) != p->stages)
            return pt_json_field_error(f, field, "expected a list of %d stages", p->stages);
        for (int s = 0; s < p->stages; s++) {
            pt_json_field_path(field, "placement[%d][%d]", r, s);
            PT_TRY(read_place(f, field, json_array_get(row, (size_t)s),
                              &p->placement[r * p->stages + s]));
        }
    }
    return PIPERT_OK;
}

/* The cluster path as written, resolved against the plan file's folder. */
static pipert_result read_cluster_path(const pt_json_file *f, pt_plan_file *p)
{
    json_t *v = json_object_get(f->root, "cluster");
    if (!v) return PIPERT_OK;
    const char *text = json_string_value(v);
    if (!text || !text[0]) return pt_json_field_error(f, "cluster", "expected a file name");
    char folder[PT_PLAN_PATH_MAX];
    snprintf(folder, sizeof folder, "%s", f->path);
    const int n = text[0] == '/' ? snprintf(p->cluster_path, sizeof p->cluster_path, "%s", text)
                                 : snprintf(p->cluster_path, sizeof p->cluster_path, "%s/%s",
                                            dirname(folder), text);
    if (n < 0 || (size_t)n >= sizeof p->cluster_path)
        return pt_json_field_error(f, "cluster", "the path is too long");
    return PIPERT_OK;
}

static pipert_result read_rest(const pt_json_file *f, pt_plan_file *p)
{
    json_t *layers = json_object_get(f->root, "layers");
    if (layers && (!json_is_string(layers) || json_string_length(layers) >= sizeof p->layers))
        return pt_json_field_error(f, "layers", "expected blocks per stage as a string, e.g. \"3,3\"");
    if (layers) snprintf(p->layers, sizeof p->layers, "%s", json_string_value(layers));
    json_t *config = json_object_get(f->root, "config");
    if (config && !json_is_object(config)) return pt_json_field_error(f, "config", "expected an object");
    if (config && !(p->config_json = json_dumps(config, JSON_COMPACT)))
        return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", f->path);
    json_t *predicted = json_object_get(f->root, "predicted");
    if (predicted && !json_is_object(predicted))
        return pt_json_field_error(f, "predicted", "expected an object");
    p->predicted_step_s = json_number_value(json_object_get(predicted, "step_s"));
    p->predicted_tokens_per_s = json_number_value(json_object_get(predicted, "tokens_per_s"));
    return PIPERT_OK;
}

/* Every placement's site is one of the plan's cluster. */
static pipert_result check_sites(const pt_json_file *f, const pt_plan_file *p)
{
    if (!p->cluster_path[0]) return PIPERT_OK;
    pt_cluster cluster;
    pipert_result rc = pt_cluster_load(p->cluster_path, &cluster);
    if (rc != PIPERT_OK) {
        char name[PT_PLAN_PATH_MAX + 64];
        pt_json_field_name(f, "cluster", name, sizeof name);
        pt_error_prefix("%s", name);
        return rc;
    }
    for (int r = 0; r < p->replicas && rc == PIPERT_OK; r++)
        for (int s = 0; s < p->stages && rc == PIPERT_OK; s++) {
            int index;
            if (pt_plan_file_site_index(p, &cluster, r, s, &index) == PIPERT_OK) continue;
            char field[PT_JSON_FIELD_MAX];
            pt_json_field_path(field, "placement[%d][%d].site", r, s);
            rc = pt_json_field_error(f, field, "'%s' is not a site of %s",
                                     p->placement[r * p->stages + s].site, p->cluster_path);
        }
    pt_cluster_free(&cluster);
    return rc;
}

/* The plan in `f`, without checking its sites against the cluster. */
static pipert_result read_plan(const pt_json_file *f, pt_plan_file *plan)
{
    static const char *const known[] = {"format", "cluster", "stages", "replicas", "layers",
                                        "placement", "config", "predicted", NULL};
    if (!json_is_object(f->root)) return pt_json_field_error(f, "", "expected an object");
    PT_TRY(pt_json_only_known_keys(f, "", f->root, known));
    const char *format = json_string_value(json_object_get(f->root, "format"));
    if (!format || strcmp(format, PT_PLAN_FILE_FORMAT) != 0)
        return pt_json_field_error(f, "format", "expected \"%s\"", PT_PLAN_FILE_FORMAT);
    PT_TRY(read_count(f, "stages", &plan->stages));
    PT_TRY(read_count(f, "replicas", &plan->replicas));
    if ((long long)plan->stages * plan->replicas > MAX_RANKS)
        return pt_json_field_error(f, "replicas", "%d stages × %d replicas is more than %d ranks",
                                   plan->stages, plan->replicas, MAX_RANKS);
    PT_TRY(read_cluster_path(f, plan));
    PT_TRY(read_placement(f, plan));
    return read_rest(f, plan);
}

/* Reads `file` (freed here) into plan; `check`: its sites against the cluster too. */
static pipert_result read_file(pt_json_file *file, bool check, pt_plan_file *plan)
{
    pipert_result rc = read_plan(file, plan);
    if (rc == PIPERT_OK && check) rc = check_sites(file, plan);
    pt_json_file_free(file);
    if (rc != PIPERT_OK) pt_plan_file_free(plan);
    return rc;
}

pipert_result pt_plan_file_load(const char *path, pt_plan_file *plan)
{
    *plan = (pt_plan_file){0};
    pt_json_file file;
    PT_TRY(pt_json_file_load(path, &file));
    return read_file(&file, true, plan);
}

pipert_result pt_plan_file_parse(const char *name, const char *text, size_t length,
                                 pt_plan_file *plan)
{
    *plan = (pt_plan_file){0};
    pt_json_file file;
    PT_TRY(pt_json_file_parse(name, text, length, &file));
    return read_file(&file, false, plan);
}

/* ---- writing ----------------------------------------------------------------- */

static json_t *placement_json(const pt_plan_file *p)
{
    json_t *rows = json_array();
    for (int r = 0; r < p->replicas; r++) {
        json_t *row = json_array();
        for (int s = 0; s < p->stages; s++) {
            const pt_plan_place *at = &p->placement[r * p->stages + s];
            json_t *place = json_pack("{s:s}", "site", at->site);
            if (at->group[0]) json_object_set_new(place, "group", json_string(at->group));
            json_array_append_new(row, place);
        }
        json_array_append_new(rows, row);
    }
    return rows;
}

static json_t *plan_json(const pt_plan_file *p)
{
    json_t *root = json_pack("{s:s}", "format", PT_PLAN_FILE_FORMAT);
    if (p->cluster_path[0]) {
        /* absolute, so that the plan reads the same cluster wherever it is */
        char absolute[PATH_MAX];
        const char *cluster = realpath(p->cluster_path, absolute) ? absolute : p->cluster_path;
        json_object_set_new(root, "cluster", json_string(cluster));
    }
    json_object_set_new(root, "stages", json_integer(p->stages));
    json_object_set_new(root, "replicas", json_integer(p->replicas));
    if (p->layers[0]) json_object_set_new(root, "layers", json_string(p->layers));
    json_object_set_new(root, "placement", placement_json(p));
    if (p->config_json) json_object_set_new(root, "config", json_loads(p->config_json, 0, NULL));
    if (p->predicted_step_s > 0)
        json_object_set_new(root, "predicted",
                            json_pack("{s:f, s:f}", "step_s", p->predicted_step_s, "tokens_per_s",
                                      p->predicted_tokens_per_s));
    return root;
}

pipert_result pt_plan_file_save(const char *path, const pt_plan_file *plan)
{
    char tmp[PT_PLAN_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *root = plan_json(plan);
    const int written = root ? json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(10))
                             : -1;
    json_decref(root);
    if (written != 0) {
        unlink(tmp);
        return pt_fail(PIPERT_ERR_IO, "%s: cannot write the plan", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return pt_fail(PIPERT_ERR_IO, "%s: cannot rename the plan into place", path);
    }
    return PIPERT_OK;
}

void pt_plan_file_free(pt_plan_file *plan)
{
    free(plan->placement);
    free(plan->config_json);
    *plan = (pt_plan_file){0};
}

pipert_result pt_plan_file_site_index(const pt_plan_file *plan, const pt_cluster *cluster, int r,
                                      int s, int *index)
{
    const char *site = plan->placement[r * plan->stages + s].site;
    for (int i = 0; i < cluster->n_sites; i++)
        if (!strcmp(cluster->site_names[i], site)) {
            *index = i;
            return PIPERT_OK;
        }
    return pt_fail(PIPERT_ERR_CONFIG, "placement[%d][%d]: site '%s' is not in the cluster", r, s,
                   site);
}
