/* The JSON files the scheduler reads (cluster and plan files): loading one,
 * errors about one of its fields as "FILE:LINE:COLUMN: FIELD: message", and
 * the check that an object has no key outside a list.
 *
 * FIELD is the field's path from the top of the file, as people read it:
 * "links[2].bandwidth", "sites[0].groups[1]"; "" is the whole file (written
 * "top level"). The position is where the field's value starts, or, when
 * the field is absent, where the deepest part of its path that is there
 * starts (a missing key is reported at its object). Keys in a FIELD hold no
 * '.' or '['. */
#ifndef PT_SCHEDULER_JSON_FIELDS_H
#define PT_SCHEDULER_JSON_FIELDS_H

#include <jansson.h>
#include <stddef.h>

#include "pipert/pipert.h"

typedef struct pt_json_file {
    const char *path; /* as given, not owned */
    char *text;       /* the file's contents, for positions */
    json_t *root;
} pt_json_file;

/* Reads and parses `path` (duplicate keys are errors). An unreadable file is
 * PIPERT_ERR_IO naming it; malformed JSON PIPERT_ERR_CONFIG with jansson's
 * FILE:LINE:COLUMN. */
pipert_result pt_json_file_load(const char *path, pt_json_file *file);
/* The same for `length` bytes of text in memory (copied), named `name` in errors. */
pipert_result pt_json_file_parse(const char *name, const char *text, size_t length,
                                 pt_json_file *file);
void pt_json_file_free(pt_json_file *file);

#define PT_JSON_FIELD_MAX 128

/* A field's path from its parts into `out`, e.g.
 * pt_json_field_path(out, "%s.between[%d]", field, 1); returns `out`. A path
 * longer than PT_JSON_FIELD_MAX − 1 is cut (the scheduler's are far shorter). */
const char *pt_json_field_path(char out[PT_JSON_FIELD_MAX], const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "FILE:LINE:COLUMN: FIELD" into `out`, for messages made elsewhere (units.h). */
void pt_json_field_name(const pt_json_file *file, const char *field, char *out, size_t capacity);

/* PIPERT_ERR_CONFIG with "FILE:LINE:COLUMN: FIELD: message". */
pipert_result pt_json_field_error(const pt_json_file *file, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Every key of `object` (the value of `field`) is one of the NULL-terminated
 * `known`; else an error at the first other key, naming it. */
pipert_result pt_json_only_known_keys(const pt_json_file *file, const char *field, json_t *object,
                                      const char *const *known);

#endif
