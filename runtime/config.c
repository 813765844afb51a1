/* The configuration: one schema table drives everything.
 *
 * Every key is one row of the schema (runtime/config_schema.c): its dotted name, where it
 * lives in struct pipert_config, its default, its range or choices and a line of
 * documentation. Defaults, JSON merging, "--key=value" overrides, checks, the JSON dump,
 * `--help` and docs/CONFIG.md all read that table.
 *
 * Sections are JSON objects ({"train": {"lr": 3e-4}}); a key's name is its
 * path joined by dots ("train.lr"), and top-level keys ("seed") have no dot.
 * A key's C type is not written in the table: _Generic reads it off the struct
 * field, so the table and the struct cannot disagree. */
#include "runtime/config.h"
#include "runtime/config_schema.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "runtime/error.h"
#include "runtime/fileio.h"
#include "runtime/json_position.h"
#include "runtime/name_hint.h"
#include "runtime/units.h"


#define NAME_MAX_LENGTH 128 /* longest dotted name we handle; schema names are far shorter */

static const config_key *find_key(const char *name)
{
    for (int i = 0; i < pt_config_key_count; i++)
        if (strcmp(pt_config_schema[i].name, name) == 0) return &pt_config_schema[i];
    return NULL;
}

/* A section is a proper prefix of some key name, ending before a dot. */
static bool is_section(const char *name)
{
    size_t length = strlen(name);
    for (int i = 0; i < pt_config_key_count; i++)
        if (strncmp(pt_config_schema[i].name, name, length) == 0 &&
            pt_config_schema[i].name[length] == '.')
            return true;
    return false;
}

static bool is_integer_type(key_type type)
{
    return type == KEY_INT || type == KEY_LONG || type == KEY_LLONG;
}

static const char *type_name(key_type type)
{
    return is_integer_type(type) ? "integer"
           : type == KEY_DOUBLE  ? "number"
           : type == KEY_BOOL    ? "bool"
                                 : "string"; /* a choice is written as its name */
}

static void integer_limits(key_type type, long long *lo, long long *hi)
{
    *lo = type == KEY_INT ? INT_MIN : type == KEY_LONG ? LONG_MIN : LLONG_MIN;
    *hi = type == KEY_INT ? INT_MAX : type == KEY_LONG ? LONG_MAX : LLONG_MAX;
}

/* ---- reading and writing fields ------------------------------------------ */

static void *field_of(pipert_config *cfg, const config_key *key)
{
    return (char *)cfg + key->offset;
}

static const void *const_field_of(const pipert_config *cfg, const config_key *key)
{
    return (const char *)cfg + key->offset;
}

/* Integer and bool fields. The value has been checked to fit. */
static void write_integer(pipert_config *cfg, const config_key *key, long long value)
{
    void *field = field_of(cfg, key);
    switch (key->type) {
    case KEY_INT: *(int *)field = (int)value; break;
    case KEY_LONG: *(long *)field = (long)value; break;
    case KEY_LLONG: *(long long *)field = value; break;
    case KEY_BOOL: *(bool *)field = value != 0; break;
    default: break;
    }
}

/* Fills the whole buffer, so two configs holding the same strings compare
 * equal byte for byte. */
static void write_string(pipert_config *cfg, const config_key *key, const char *value,
                         size_t length)
{
    char *field = field_of(cfg, key);
    memset(field, 0, key->size);
    memcpy(field, value, length < key->size ? length : key->size - 1);
}

/* Stores a value that check_value accepted. */
static int choice_value(const config_key *key, const char *name);

static void write_json(pipert_config *cfg, const config_key *key, const json_t *value)
{
    if (key->type == KEY_CHOICE)
        *(int *)field_of(cfg, key) = choice_value(key, json_string_value(value));
    else if (key->type == KEY_DOUBLE)
        *(double *)field_of(cfg, key) = json_number_value(value);
    else if (key->type == KEY_STRING)
        write_string(cfg, key, json_string_value(value), json_string_length(value));
    else if (key->type == KEY_BOOL)
        write_integer(cfg, key, json_is_true(value));
    else
        write_integer(cfg, key, json_integer_value(value));
}

/* The field as a new JSON value; NULL if it has none (a non-finite double or a
 * string that is not UTF-8, which only C code writing the struct can cause). */
static const char *choice_name(const config_key *key, int value);

static json_t *read_json(const pipert_config *cfg, const config_key *key)
{
    const void *field = const_field_of(cfg, key);
    switch (key->type) {
    case KEY_INT: return json_integer(*(const int *)field);
    case KEY_LONG: return json_integer(*(const long *)field);
    case KEY_LLONG: return json_integer(*(const long long *)field);
    case KEY_DOUBLE: return json_real(*(const double *)field);
    case KEY_BOOL: return json_boolean(*(const bool *)field);
    case KEY_STRING: return json_stringn(field, strnlen(field, key->size));
    case KEY_CHOICE: {
        const char *name = choice_name(key, *(const int *)field);
        return name ? json_string(name) : NULL;
    }
    }
    return NULL;
}

void pt_config_defaults(pipert_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < pt_config_key_count; i++) {
        const config_key *key = &pt_config_schema[i];
        if (key->type == KEY_DOUBLE)
            *(double *)field_of(cfg, key) = key->default_number;
        else if (key->type == KEY_STRING)
            write_string(cfg, key, key->default_string, strlen(key->default_string));
        else if (key->type == KEY_CHOICE)
            *(int *)field_of(cfg, key) = choice_value(key, key->default_string);
        else
            write_integer(cfg, key, (long long)key->default_number);
    }
}

/* ---- checking values ----------------------------------------------------- */

/* Why a value does not fit a key, in two parts so that each caller can word
 * its message: problem = "expected a number", found = "a string". */
typedef struct value_error {
    char problem[160];
    char found[160];
} value_error;

/* The fewest significant digits (1..17) that print x so that it reads back
 * exactly: 0.1 prints as 0.1, not as 0.10000000000000001. */
static int exact_precision(double x)
{
    char text[40];
    for (int digits = 1; digits < 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, x);
        if (strtod(text, NULL) == x) return digits;
    }
    return 17;
}

/* A scalar as JSON text ("3.5", "true", "\"adamw\""), truncated to fit. */
static void format_json(const json_t *value, char *out, size_t capacity)
{
    int digits = json_is_real(value) ? exact_precision(json_real_value(value)) : 17;
    char *text = json_dumps(value, JSON_ENCODE_ANY | JSON_REAL_PRECISION(digits));
    snprintf(out, capacity, "%s", text ? text : "?");
    free(text);
}

void pt_config_format_value(const pipert_config *cfg, const char *name, char *out,
                            size_t capacity)
{
    const config_key *key = find_key(name);
    json_t *value = key ? read_json(cfg, key) : NULL;
    format_json(value, out, capacity);
    json_decref(value);
}

/* What a value is, for "expected X, got Y": scalars show themselves, strings
 * and containers their kind (a string may be long). */
static void describe_json(const json_t *value, char *out, size_t capacity)
{
    if (json_is_string(value))
        snprintf(out, capacity, "a string");
    else if (json_is_object(value))
        snprintf(out, capacity, "an object");
    else if (json_is_array(value))
        snprintf(out, capacity, "an array");
    else
        format_json(value, out, capacity);
}

static bool type_mismatch(value_error *why, const char *expected, const json_t *value)
{
    snprintf(why->problem, sizeof why->problem, "expected %s", expected);
    describe_json(value, why->found, sizeof why->found);
    return false;
}

/* The range as text: "[0, 1)", ">= 1", "> 0"; "" if unbounded. */
static void format_range(const key_range *range, char *out, size_t capacity)
{
    bool has_min = range->min > -HUGE_VAL, has_max = range->max < HUGE_VAL;
    bool open_min = range->open & OPEN_MIN, open_max = range->open & OPEN_MAX;
    if (has_min && has_max)
        snprintf(out, capacity, "%c%g, %g%c", open_min ? '(' : '[', range->min, range->max,
                 open_max ? ')' : ']');
    else if (has_min)
        snprintf(out, capacity, "%s %g", open_min ? ">" : ">=", range->min);
    else if (has_max)
        snprintf(out, capacity, "%s %g", open_max ? "<" : "<=", range->max);
    else
        snprintf(out, capacity, "%s", "");
}

static bool check_range(const config_key *key, double x, const json_t *value, value_error *why)
{
    const key_range *r = &key->range;
    bool above_min = (r->open & OPEN_MIN) ? x > r->min : x >= r->min;
    bool below_max = (r->open & OPEN_MAX) ? x < r->max : x <= r->max;
    if (above_min && below_max) return true;
    char range[64];
    format_range(r, range, sizeof range);
    bool interval = range[0] == '[' || range[0] == '(';
    snprintf(why->problem, sizeof why->problem, "must be %s%s", interval ? "in " : "", range);
    format_json(value, why->found, sizeof why->found);
    return false;
}

/* ---- settings that are one of a list ----------------------------------------- */

/* Names a program adds to a key's list (pt_config_allow_choice): value n_names + k is the k-th
 * added to that key. */
#define ADDED_CHOICES_MAX 16

static struct added_choice {
    const config_key *key;
    char name[64];
} added_choices[ADDED_CHOICES_MAX];
static int added_choice_count;

static const char *choice_name(const config_key *key, int value)
{
    if (value >= 0 && value < key->n_names) return key->names[value];
    for (int i = 0, k = key->n_names; i < added_choice_count; i++)
        if (added_choices[i].key == key && k++ == value) return added_choices[i].name;
    return NULL;
}

/* -1: not a name of the key's */
static int choice_value(const config_key *key, const char *name)
{
    for (int v = 0; v < key->n_names; v++)
        if (!strcmp(key->names[v], name)) return v;
    for (int i = 0, k = key->n_names; i < added_choice_count; i++)
        if (added_choices[i].key == key) {
            if (!strcmp(added_choices[i].name, name)) return k;
            k++;
        }
    return -1;
}

/* The key's names, the schema's and those added: "a|b|c". */
static const char *choices_of(const config_key *key, char *text, size_t cap)
{
    text[0] = '\0';
    for (int v = 0; choice_name(key, v); v++)
        snprintf(text + strlen(text), cap - strlen(text), "%s%s", v ? "|" : "", choice_name(key, v));
    return text;
}

pipert_result pt_config_allow_choice(const char *key_name, const char *name, int *number)
{
    const config_key *key = find_key(key_name);
    if (!key || key->type != KEY_CHOICE)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s is not a key with a list of choices",
                       key_name);
    if (!name[0] || strchr(name, '|') || strlen(name) >= sizeof added_choices[0].name)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: \"%s\" cannot be a choice", key_name, name);
    int value = choice_value(key, name);
    if (value < 0) {
        if (added_choice_count == ADDED_CHOICES_MAX)
            return pt_fail(PIPERT_ERR_UNSUPPORTED, "at most %d choices can be added to the keys",
                           ADDED_CHOICES_MAX);
        added_choices[added_choice_count].key = key;
        snprintf(added_choices[added_choice_count].name, sizeof added_choices[0].name, "%s", name);
        added_choice_count++;
        value = choice_value(key, name);
    }
    if (number) *number = value;
    return PIPERT_OK;
}

const char *pt_config_choices(const char *key_name, char *text, size_t cap)
{
    const config_key *key = find_key(key_name);
    return key && key->type == KEY_CHOICE ? choices_of(key, text, cap) : NULL;
}

const char *pt_config_choice_name(const char *key_name, int value)
{
    const config_key *key = find_key(key_name);
    const char *name = key && key->type == KEY_CHOICE ? choice_name(key, value) : NULL;
    return name ? name : "?";
}

int pt_config_choice_value(const char *key_name, const char *name)
{
    const config_key *key = find_key(key_name);
    const int value = key && key->type == KEY_CHOICE ? choice_value(key, name) : -1;
    if (value < 0) {
        char choices[1024];
        pt_fail(PIPERT_ERR_CONFIG, "%s: unknown \"%s\" (known: %s)", key_name, name,
                key && key->type == KEY_CHOICE ? choices_of(key, choices, sizeof choices) : "none");
    }
    return value;
}

/* Does the JSON value fit the key: type, C type limits, range, length, choices? */
static bool check_value(const config_key *key, const json_t *value, value_error *why)
{
    if (is_integer_type(key->type)) {
        if (!json_is_integer(value)) return type_mismatch(why, "an integer", value);
        long long lo, hi, x = json_integer_value(value);
        integer_limits(key->type, &lo, &hi);
        if (x < lo || x > hi) { /* does not fit the C type: name the range that does */
            if (key->range.min > (double)lo) lo = (long long)ceil(key->range.min);
            if (key->range.max < (double)hi) hi = (long long)floor(key->range.max);
            snprintf(why->problem, sizeof why->problem, "must be in [%lld, %lld]", lo, hi);
            format_json(value, why->found, sizeof why->found);
            return false;
        }
        return check_range(key, (double)x, value, why);
    }
    if (key->type == KEY_DOUBLE) {
        if (!json_is_number(value)) return type_mismatch(why, "a number", value);
        return check_range(key, json_number_value(value), value, why);
    }
    if (key->type == KEY_BOOL)
        return json_is_boolean(value) ? true : type_mismatch(why, "true or false", value);

    if (!json_is_string(value)) return type_mismatch(why, "a string", value);
    if (key->type == KEY_CHOICE) {
        if (choice_value(key, json_string_value(value)) >= 0) return true;
        char choices[1024];
        snprintf(why->problem, sizeof why->problem, "must be one of %s",
                 choices_of(key, choices, sizeof choices));
        format_json(value, why->found, sizeof why->found);
        return false;
    }
    size_t length = json_string_length(value);
    if (length >= key->size) {
        snprintf(why->problem, sizeof why->problem, "must be shorter than %zu bytes", key->size);
        snprintf(why->found, sizeof why->found, "%zu bytes", length);
        return false;
    }
    return true;
}

/* " (did you mean 'train.lr'?)" for a name no key has (runtime/name_hint.h), or "". */
static void suggest_name(const char *unknown, char *out, size_t capacity)
{
    out[0] = '\0';
    const char **names = malloc((size_t)pt_config_key_count * sizeof *names);
    if (!names) return; /* no hint */
    for (int i = 0; i < pt_config_key_count; i++) names[i] = pt_config_schema[i].name;
    pt_name_hint(unknown, names, pt_config_key_count, out, capacity);
    free(names);
}

/* ---- merging JSON -------------------------------------------------------- */

#define MAX_DEPTH 8

/* A merge in progress: the raw text for positions and the path being walked. */
typedef struct merge_walk {
    const char *text, *source;
    const char *path[MAX_DEPTH];
    int depth;
} merge_walk;

/* "SOURCE:LINE:COLUMN: message" at the key path[0..depth). */
static pipert_result fail_at(const merge_walk *walk, int depth, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static pipert_result fail_at(const merge_walk *walk, int depth, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    pt_json_step steps[MAX_DEPTH];
    for (int i = 0; i < depth; i++) steps[i] = PT_JSON_KEY(walk->path[i]);
    pt_json_position at;
    pt_json_locate(walk->text, steps, depth, &at);
    return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", walk->source, at.key_line, at.key_column,
                   message);
}

static pipert_result merge_object(pipert_config *cfg, json_t *object, merge_walk *walk,
                                  const char *prefix)
{
    const char *name;
    json_t *value;
    int depth = walk->depth + 1; /* of the keys of this object */
    json_object_foreach(object, name, value) {
        walk->path[walk->depth] = name;
        char full[NAME_MAX_LENGTH + 1], hint[NAME_MAX_LENGTH + 32];
        snprintf(full, sizeof full, "%s%s", prefix, name);
        if (strchr(name, '.'))
            return fail_at(walk, depth, "unknown key '%s' (write sections as nested objects: "
                           "{\"train\": {\"lr\": 3e-4}})", full);

        const config_key *key = find_key(full);
        if (key) {
            value_error why;
            if (!check_value(key, value, &why))
                return fail_at(walk, depth, "%s: %s, got %s", key->name, why.problem, why.found);
            write_json(cfg, key, value);
        } else if (is_section(full) && depth < MAX_DEPTH) {
            char describe[64];
            if (!json_is_object(value)) {
                describe_json(value, describe, sizeof describe);
                return fail_at(walk, depth, "%s: expected an object of %s.* keys, got %s", full,
                               full, describe);
            }
            char section_prefix[NAME_MAX_LENGTH + 2];
            snprintf(section_prefix, sizeof section_prefix, "%s.", full);
            walk->depth++;
            pipert_result rc = merge_object(cfg, value, walk, section_prefix);
            walk->depth--;
            PT_TRY(rc);
        } else {
            suggest_name(full, hint, sizeof hint);
            return fail_at(walk, depth, "unknown key '%s'%s", full, hint);
        }
    }
    return PIPERT_OK;
}

pipert_result pt_config_merge_json(pipert_config *cfg, const char *text, const char *source)
{
    if (!cfg || !text || !source)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_config_merge_json: NULL argument");
    json_error_t error;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &error);
    if (!root)
        return pt_fail(PIPERT_ERR_CONFIG, "%s:%d:%d: %s", source, error.line, error.column,
                       error.text);

    merge_walk walk = {.text = text, .source = source, .depth = 0};
    pipert_result rc;
    if (!json_is_object(root)) {
        char describe[64];
        describe_json(root, describe, sizeof describe);
        rc = fail_at(&walk, 0, "expected an object of sections, like {\"train\": {\"lr\": 3e-4}}, "
                     "got %s", describe);
    } else {
        /* Merge into a copy, so that a failure leaves cfg as it was. */
        pipert_config staged;
        memcpy(&staged, cfg, sizeof staged);
        rc = merge_object(&staged, root, &walk, "");
        if (rc == PIPERT_OK) memcpy(cfg, &staged, sizeof staged);
    }
    json_decref(root);
    return rc;
}

/* ---- overrides ----------------------------------------------------------- */

/* The value of an override: JSON if it parses ("3e-4", "true", "\"x\""),
 * else the bare text. A string key takes any unquoted text as it is, so
 * --data.path=123 is the file "123". */
static json_t *parse_override_value(const config_key *key, const char *text)
{
    json_t *value = json_loads(text, JSON_DECODE_ANY, NULL);
    if (value && ((key->type != KEY_STRING && key->type != KEY_CHOICE) || json_is_string(value)))
        return value;
    json_decref(value);
    return json_string(text); /* NULL if text is not UTF-8 */
}

pipert_result pipert_config_set(pipert_config *cfg, const char *assignment)
{
    if (!cfg || !assignment)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_config_set: NULL argument");
    const char *name = strncmp(assignment, "--", 2) == 0 ? assignment + 2 : assignment;
    const char *equals = strchr(name, '=');
    size_t name_length = equals ? (size_t)(equals - name) : 0;
    if (name_length == 0 || name_length > NAME_MAX_LENGTH)
        return pt_fail(PIPERT_ERR_CONFIG, "%s: expected KEY=VALUE, like train.lr=3e-4", assignment);

    char key_name[NAME_MAX_LENGTH + 1], hint[NAME_MAX_LENGTH + 32];
    memcpy(key_name, name, name_length);
    key_name[name_length] = '\0';
    const config_key *key = find_key(key_name);
    if (!key) {
        suggest_name(key_name, hint, sizeof hint);
        return pt_fail(PIPERT_ERR_CONFIG, "%s: unknown key '%s'%s", assignment, key_name, hint);
    }
    json_t *value = parse_override_value(key, equals + 1);
    if (!value) return pt_fail(PIPERT_ERR_CONFIG, "%s: the value is not valid UTF-8", assignment);
    value_error why;
    bool fits = check_value(key, value, &why);
    if (fits) write_json(cfg, key, value);
    json_decref(value);
    return fits ? PIPERT_OK : pt_fail(PIPERT_ERR_CONFIG, "%s: %s", assignment, why.problem);
}

/* ---- checks -------------------------------------------------------------- */

static pipert_result validate_wan(const pt_wan_settings *wan)
{
    double value;
    if (wan->bandwidth[0]) PT_TRY(pt_parse_bit_rate(wan->bandwidth, "wan.bandwidth", &value));
    if (wan->latency[0]) PT_TRY(pt_parse_duration(wan->latency, "wan.latency", &value));
    return PIPERT_OK;
}

pipert_result pt_config_validate(const pipert_config *cfg)
{
    if (!cfg) return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_config_validate: NULL config");
    /* Each key on its own, in case C code wrote the struct directly. */
    for (int i = 0; i < pt_config_key_count; i++) {
        const config_key *key = &pt_config_schema[i];
        json_t *value = read_json(cfg, key);
        if (!value)
            return pt_fail(PIPERT_ERR_CONFIG, "%s: %s", key->name,
                           key->type == KEY_DOUBLE   ? "is not a finite number"
                           : key->type == KEY_CHOICE ? "holds a number that names none of its "
                                                       "choices"
                                                     : "is not valid UTF-8");
        value_error why;
        bool fits = check_value(key, value, &why);
        json_decref(value);
        if (!fits)
            return pt_fail(PIPERT_ERR_CONFIG, "%s: %s, got %s", key->name, why.problem, why.found);
    }
    PT_TRY(validate_wan(&cfg->wan));
    const pt_model_settings *m = &cfg->model;
    if (m->n_embd % m->n_head != 0)
        return pt_fail(PIPERT_ERR_CONFIG, "model.n_embd: %d is not a multiple of model.n_head = %d",
                       m->n_embd, m->n_head);
    const pt_pipeline_settings *p = &cfg->pipeline;
    if (p->sync_steps > 0 && p->schedule != PT_SCHEDULE_ASYNC_1F1B)
        return pt_fail(PIPERT_ERR_CONFIG,
                       "pipeline.sync_steps: %ld, but only pipeline.schedule=async-1f1b has "
                       "steps to make synchronous (every step of %s is); leave it at 0",
                       p->sync_steps, pt_config_choice_name("pipeline.schedule", p->schedule));
    return PIPERT_OK;
}

/* ---- writing JSON -------------------------------------------------------- */

/* Sets root[a][b]... = value for the dotted name "a.b...", creating sections;
 * steals value. */
static bool set_dotted(json_t *root, const char *name, json_t *value)
{
    json_t *object = root;
    const char *dot;
    while (object && value && (dot = strchr(name, '.'))) {
        char section[NAME_MAX_LENGTH + 1];
        snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
        json_t *inner = json_object_get(object, section);
        if (!inner && json_object_set_new(object, section, inner = json_object()) != 0)
            inner = NULL;
        object = inner;
        name = dot + 1;
    }
    if (!object || !value) {
        json_decref(value);
        return false;
    }
    return json_object_set_new(object, name, value) == 0;
}

/* The keys whose names start with `prefix` as JSON text; NULL on failure.
 * Numbers are printed with the fewest digits that read back exactly. */
static char *dump_keys(const pipert_config *cfg, const char *prefix, size_t flags)
{
    json_t *root = json_object();
    int digits = 1;
    bool ok = root != NULL;
    for (int i = 0; i < pt_config_key_count && ok; i++) {
        const config_key *key = &pt_config_schema[i];
        if (strncmp(key->name, prefix, strlen(prefix)) != 0) continue;
        if (key->type == KEY_DOUBLE) {
            int needed = exact_precision(*(const double *)const_field_of(cfg, key));
            digits = needed > digits ? needed : digits;
        }
        ok = set_dotted(root, key->name, read_json(cfg, key));
    }
    char *text = ok ? json_dumps(root, flags | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits)) : NULL;
    json_decref(root);
    return text;
}

/* Whether a key's name is one of `names` or starts with one of them that ends in a dot. */
static bool key_in(const char *name, const char *const *names)
{
    for (; names && *names; names++) {
        const size_t n = strlen(*names);
        const bool section = n > 0 && (*names)[n - 1] == '.';
        if (section ? strncmp(name, *names, n) == 0 : strcmp(name, *names) == 0) return true;
    }
    return false;
}

int pt_config_describe_changes(const pipert_config *was, const pipert_config *now,
                               const char *const *compared, const char *const *ignored, char *out,
                               size_t capacity)
{
    int changes = 0;
    size_t used = 0;
    if (capacity) out[0] = '\0';
    for (int i = 0; i < pt_config_key_count; i++) {
        const config_key *key = &pt_config_schema[i];
        if (!key_in(key->name, compared) || key_in(key->name, ignored)) continue;
        json_t *before = read_json(was, key), *after = read_json(now, key);
        if (!json_equal(before, after)) {
            char a[80], b[80];
            format_json(before, a, sizeof a);
            format_json(after, b, sizeof b);
            if (used < capacity)
                used += (size_t)snprintf(out + used, capacity - used, "%s%s %s -> %s",
                                         changes ? ", " : "", key->name, a, b);
            changes++;
        }
        json_decref(before);
        json_decref(after);
    }
    return changes;
}

char *pipert_config_to_json(const pipert_config *cfg)
{
    return cfg ? dump_keys(cfg, "", JSON_INDENT(2)) : NULL;
}

char *pt_config_model_to_json(const pipert_config *cfg)
{
    return cfg ? dump_keys(cfg, "model.", JSON_COMPACT) : NULL;
}

/* ---- documentation ------------------------------------------------------- */

void pt_config_print_help(FILE *out)
{
    pipert_config defaults;
    pt_config_defaults(&defaults);
    fprintf(out, "  %-24s %-8s %-9s %s\n", "KEY", "TYPE", "DEFAULT", "DESCRIPTION");
    for (int i = 0; i < pt_config_key_count; i++) {
        const config_key *key = &pt_config_schema[i];
        char shown[64] = "?", allowed[80];
        json_t *value = read_json(&defaults, key);
        if (value) format_json(value, shown, sizeof shown);
        json_decref(value);
        char choices[1024];
        if (key->type == KEY_CHOICE)
            snprintf(allowed, sizeof allowed, " (%s)", choices_of(key, choices, sizeof choices));
        else if (key->type != KEY_BOOL && key->type != KEY_STRING) {
            char range[64];
            format_range(&key->range, range, sizeof range);
            snprintf(allowed, sizeof allowed, range[0] ? " (%s)" : "%s", range);
        } else
            allowed[0] = '\0';
        fprintf(out, "  %-24s %-8s %-9s %s%s\n", key->name, type_name(key->type), shown, key->doc,
                allowed);
    }
}

/* ---- the public API ------------------------------------------------------ */

pipert_result pipert_config_create(pipert_config **out)
{
    if (!out) return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_config_create: NULL argument");
    *out = malloc(sizeof **out);
    if (!*out) return pt_fail(PIPERT_ERR_NOMEM, "configuration: out of memory");
    pt_config_defaults(*out);
    return PIPERT_OK;
}

pipert_result pipert_config_load_file(pipert_config *cfg, const char *path)
{
    if (!cfg || !path)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pipert_config_load_file: NULL argument");
    char *text;
    size_t size;
    PT_TRY(pt_read_file(path, &text, &size));
    pipert_result rc = strlen(text) == size ? pt_config_merge_json(cfg, text, path)
                                            : pt_fail(PIPERT_ERR_CONFIG,
                                                      "%s: holds a NUL byte; not a JSON text", path);
    free(text);
    return rc;
}

void pipert_config_free(pipert_config *cfg) { free(cfg); }
