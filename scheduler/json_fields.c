#include "scheduler/json_fields.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/json_position.h"

#define MAX_STEPS 16

/* Parses file->text (size bytes) into file->root; frees the file on failure. */
static pipert_result parse_text(pt_json_file *file, size_t size)
{
    json_error_t error;
    file->root = json_loadb(file->text, size, JSON_REJECT_DUPLICATES, &error);
    if (file->root) return PIPERT_OK;
    const char *path = file->path;
    pt_json_file_free(file);
    return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", path, error.line, error.column, error.text);
}

pipert_result pt_json_file_load(const char *path, pt_json_file *file)
{
    *file = (pt_json_file){.path = path};
    size_t size;
    PT_TRY(pt_read_file(path, &file->text, &size));
    return parse_text(file, size);
}

pipert_result pt_json_file_parse(const char *name, const char *text, size_t length,
                                 pt_json_file *file)
{
    *file = (pt_json_file){.path = name};
    file->text = malloc(length + 1);
    if (!file->text) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", name);
    memcpy(file->text, text, length);
    file->text[length] = '\0';
    return parse_text(file, length);
}

void pt_json_file_free(pt_json_file *file)
{
    json_decref(file->root);
    free(file->text);
    *file = (pt_json_file){0};
}

const char *pt_json_field_path(char out[PT_JSON_FIELD_MAX], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, PT_JSON_FIELD_MAX, fmt, ap);
    va_end(ap);
    return out;
}

/* "a[2].b" → steps a, 2, b. The keys point into `names`, a copy of the field
 * cut at every '.' and '['. Parsing stops at what it cannot read. */
static int parse_field(const char *field, char names[PT_JSON_FIELD_MAX], pt_json_step steps[MAX_STEPS])
{
    snprintf(names, PT_JSON_FIELD_MAX, "%s", field);
    int depth = 0;
    char *at = names;
    while (*at && depth < MAX_STEPS) {
        if (*at == '[') {
            char *end;
            unsigned long index = strtoul(at + 1, &end, 10);
            if (end == at + 1 || *end != ']') break;
            *at = '\0';
            steps[depth++] = PT_JSON_INDEX(index);
            at = end + 1;
            if (*at == '.') at++;
            continue;
        }
        size_t length = strcspn(at, ".[");
        steps[depth++] = PT_JSON_KEY(at);
        at += length;
        if (*at == '.') *at++ = '\0'; /* a '[' is cut once its index is read */
    }
    return depth;
}

static pt_json_position field_position(const pt_json_file *file, const char *field)
{
    char names[PT_JSON_FIELD_MAX + 1];
    pt_json_step steps[MAX_STEPS];
    int depth = parse_field(field, names, steps);
    pt_json_position at;
    pt_json_locate(file->text, steps, depth, &at);
    return at;
}

void pt_json_field_name(const pt_json_file *file, const char *field, char *out, size_t capacity)
{
    pt_json_position at = field_position(file, field);
    snprintf(out, capacity, "%s:%d:%d: %s", file->path, at.line, at.column,
             field[0] ? field : "top level");
}

pipert_result pt_json_field_error(const pt_json_file *file, const char *field, const char *fmt, ...)
{
    char message[768], name[PT_JSON_FIELD_MAX + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    pt_json_field_name(file, field, name, sizeof name);
    return pt_fail(PIPERT_ERR_CONFIG, "%s: %s", name, message);
}

/* The error at the key `key` itself (it may hold any character). */
static pipert_result unknown_key(const pt_json_file *file, const char *field, const char *key)
{
    char names[PT_JSON_FIELD_MAX + 1];
    pt_json_step steps[MAX_STEPS + 1];
    int depth = parse_field(field, names, steps);
    steps[depth++] = PT_JSON_KEY(key);
    pt_json_position at;
    pt_json_locate(file->text, steps, depth, &at);
    return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s: unknown key '%s'", file->path, at.key_line,
                   at.key_column, field[0] ? field : "top level", key);
}

pipert_result pt_json_only_known_keys(const pt_json_file *file, const char *field, json_t *object,
                                      const char *const *known)
{
    const char *key;
    json_t *value;
    json_object_foreach(object, key, value) {
        const char *const *k = known;
        while (*k && strcmp(*k, key) != 0) k++;
        if (!*k) return unknown_key(file, field, key);
    }
    return PIPERT_OK;
}
