#include "tools/plot/runs.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/fileio.h"

/* The field bytes between sites come from; older runs only have dp_bytes. */
#define WAN_BYTES_FIELD "bytes_wan"
#define MAX_STAGES 4096

typedef pipert_result (*line_fn)(json_t *line, const char *path, int number, void *context);

/* Calls fn on every JSON line of path. */
static pipert_result for_each_line(const char *path, line_fn fn, void *context)
{
    char *text;
    size_t size;
    PT_TRY(pt_read_file(path, &text, &size));
    pipert_result rc = PIPERT_OK;
    int number = 0;
    for (char *line = text, *end; rc == PIPERT_OK && line < text + size; line = end + 1) {
        end = memchr(line, '\n', (size_t)(text + size - line));
        if (!end) end = text + size;
        number++;
        if (end == line) continue;
        json_error_t error;
        json_t *value = json_loadb(line, (size_t)(end - line), 0, &error);
        if (!value) rc = pt_fail(PIPERT_ERR_FORMAT, "%s:%d: %s", path, number, error.text);
        else rc = fn(value, path, number, context);
        json_decref(value);
    }
    free(text);
    return rc;
}

static pipert_result append(pt_plot_point **points, size_t *n, pt_plot_point p)
{
    pt_plot_point *grown = realloc(*points, (*n + 1) * sizeof *grown);
    if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    grown[(*n)++] = p;
    *points = grown;
    return PIPERT_OK;
}

static pipert_result read_loss_line(json_t *line, const char *path, int number, void *context)
{
    pt_plot_run *run = context;
    json_t *tokens = json_object_get(line, "tokens"), *elapsed = json_object_get(line, "elapsed_s");
    json_t *loss = json_object_get(line, "loss"), *val = json_object_get(line, "val_loss");
    if (!loss && !val) return PIPERT_OK;
    if (!json_is_number(tokens) || !json_is_number(elapsed))
        return pt_fail(PIPERT_ERR_FORMAT, "%s:%d: no \"tokens\" and \"elapsed_s\" (a run older than "
                                          "pipert plot?)", path, number);
    pt_plot_point p = {json_number_value(tokens), json_number_value(elapsed), 0};
    if (json_is_number(loss)) {
        p.loss = json_number_value(loss);
        PT_TRY(append(&run->train, &run->n_train, p));
    }
    if (json_is_number(val)) {
        p.loss = json_number_value(val);
        PT_TRY(append(&run->val, &run->n_val, p));
    }
    return PIPERT_OK;
}

typedef struct stage_reading {
    char method[64], compress[32];
    double bytes;
    long lines;
    long last_step;
    bool skips_steps; /* lines are not every step (train.log_every > 1) */
} stage_reading;

static pipert_result read_stage_line(json_t *line, const char *path, int number, void *context)
{
    (void)path, (void)number;
    stage_reading *r = context;
    json_t *bytes = json_object_get(line, WAN_BYTES_FIELD);
    if (!bytes) bytes = json_object_get(line, "dp_bytes");
    const char *method = json_string_value(json_object_get(line, "dp_method"));
    const char *compress = json_string_value(json_object_get(line, "dp_compress"));
    if (method && !r->method[0]) snprintf(r->method, sizeof r->method, "%s", method);
    if (compress && !r->compress[0]) snprintf(r->compress, sizeof r->compress, "%s", compress);
    if (json_is_number(bytes)) r->bytes += json_number_value(bytes), r->lines++;
    json_t *step = json_object_get(line, "step");
    if (json_is_integer(step)) {
        if (json_integer_value(step) > r->last_step + 1) r->skips_steps = true;
        r->last_step = (long)json_integer_value(step);
    }
    return PIPERT_OK;
}

/* "sparse, e3m0": the method, and its compression unless none (runs older
 * than dp_compress show the method alone). */
static void describe_method(const stage_reading *r, char *method, size_t cap)
{
    if (!r->method[0]) snprintf(method, cap, "single worker");
    else if (!r->compress[0] || !strcmp(r->compress, "none")) snprintf(method, cap, "%s", r->method);
    else snprintf(method, cap, "%s, %s", r->method, r->compress);
}

/* Bytes between sites per step: each stage's mean, summed; the method. */
static pipert_result read_stages(const char *dir, pt_plot_run *run, char *method, size_t cap)
{
    for (int stage = 0; stage < MAX_STAGES; stage++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/metrics-stage-%d.jsonl", dir, stage);
        if (access(path, R_OK) != 0) break;
        stage_reading r = {.lines = 0};
        PT_TRY(for_each_line(path, read_stage_line, &r));
        if (r.lines) run->wan_bytes_per_step += r.bytes / (double)r.lines;
        if (r.skips_steps) run->bytes_sampled = true;
        if (stage == 0) describe_method(&r, method, cap);
    }
    return PIPERT_OK;
}

/* "NAME (method)", NAME the last component of dir: "runs/a/" and "runs/a"
 * are both "a". */
static void label_run(pt_plot_run *run, const char *dir, const char *method)
{
    size_t end = strlen(dir);
    while (end > 1 && dir[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/') start--;
    if (start == end) start = 0; /* "/" */
    int name_length = (int)(end - start);
    snprintf(run->label, sizeof run->label, "%.*s (%s)", name_length, dir + start, method);
}

pipert_result pt_plot_read_run(const char *dir, pt_plot_run *run)
{
    memset(run, 0, sizeof *run);
    char path[PATH_MAX], method[128] = "single worker";
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (access(path, R_OK) != 0)
        return pt_fail(PIPERT_ERR_IO, "%s: not a run directory (no metrics.jsonl)", dir);
    pipert_result rc = for_each_line(path, read_loss_line, run);
    if (rc == PIPERT_OK) rc = read_stages(dir, run, method, sizeof method);
    if (rc == PIPERT_OK && run->n_train == 0)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: no training loss in it", path);
    if (rc != PIPERT_OK) {
        pt_plot_free_run(run);
        return rc;
    }
    label_run(run, dir, method);
    return PIPERT_OK;
}

void pt_plot_free_run(pt_plot_run *run)
{
    free(run->train);
    free(run->val);
    run->train = run->val = NULL;
    run->n_train = run->n_val = 0;
}
