#include "runtime/metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/fileio.h"

/* Rewrites `path` keeping the lines whose step is ≤ keep_through_step. */
static pipert_result truncate_after_step(const char *path, long keep_through_step)
{
    char *text;
    size_t size;
    if (access(path, F_OK) != 0) return PIPERT_OK;
    PT_TRY(pt_read_file(path, &text, &size));
    pt_atomic_file out;
    pipert_result rc = pt_atomic_open(&out, path);
    if (rc != PIPERT_OK) {
        free(text);
        return rc;
    }
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        json_t *obj = json_loads(line, 0, NULL);
        json_t *step = obj ? json_object_get(obj, "step") : NULL;
        /* Lines that do not parse (a line cut by a crash) are dropped too. */
        if (step && json_is_integer(step) && json_integer_value(step) <= keep_through_step)
            fprintf(out.stream, "%s\n", line);
        json_decref(obj);
    }
    free(text);
    return pt_atomic_commit(&out);
}

pipert_result pt_metrics_open(pt_metrics *m, const char *path, long keep_through_step)
{
    memset(m, 0, sizeof *m);
    if (keep_through_step >= 0) PT_TRY(truncate_after_step(path, keep_through_step));
    m->file = fopen(path, keep_through_step >= 0 ? "a" : "w");
    if (!m->file) return pt_fail(PIPERT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    m->path = strdup(path);
    return PIPERT_OK;
}

pipert_result pt_metrics_write(pt_metrics *m, json_t *line)
{
    char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(7));
    json_decref(line);
    if (!text) return pt_fail(PIPERT_ERR_NOMEM, "metrics line: out of memory");
    int failed = fprintf(m->file, "%s\n", text) < 0 || fflush(m->file) != 0;
    const int error = errno;
    free(text);
    return failed ? pt_write_error(m->path, "fflush", error) : PIPERT_OK;
}

void pt_metrics_close(pt_metrics *m)
{
    if (m->file) fclose(m->file);
    free(m->path);
    memset(m, 0, sizeof *m);
}
