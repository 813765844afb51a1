/* Errors about a field of a JSON file the scheduler reads (cluster and plan
 * files): "PATH: FIELD: message", and the check that an object has no key
 * outside a list. */
#ifndef PT_SCHEDULER_JSON_FIELDS_H
#define PT_SCHEDULER_JSON_FIELDS_H

#include <jansson.h>

#include "pipert/pipert.h"

/* PIPERT_ERR_CONFIG with "PATH: FIELD: message". */
pipert_result pt_json_field_error(const char *path, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Every key of `object` is one of the NULL-terminated `known`; else an error
 * naming the first other key. */
pipert_result pt_json_only_known_keys(const char *path, const char *field, json_t *object,
                                      const char *const *known);

#endif
