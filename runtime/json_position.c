#include "runtime/json_position.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

/* The scanner steps over whitespace, strings (which may hold escaped quotes
 * and brackets) and whole values (nested objects and arrays). Offsets are
 * bytes into the text. */

static size_t skip_whitespace(const char *text, size_t at)
{
    while (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r') at++;
    return at;
}

/* From an opening quote to just past the closing one. */
static size_t skip_string(const char *text, size_t at)
{
    for (at++; text[at] && text[at] != '"'; at++)
        if (text[at] == '\\' && text[at + 1]) at++; /* the escaped character cannot close */
    return text[at] ? at + 1 : at;
}

/* From the first character of any value to just past it. */
static size_t skip_value(const char *text, size_t at)
{
    if (text[at] == '"') return skip_string(text, at);
    if (text[at] != '{' && text[at] != '[') { /* number, true, false, null */
        while (text[at] && !strchr(",}] \t\r\n", text[at])) at++;
        return at;
    }
    int depth = 0;
    do {
        if (text[at] == '"') {
            at = skip_string(text, at);
            continue;
        }
        if (text[at] == '{' || text[at] == '[') depth++;
        if (text[at] == '}' || text[at] == ']') depth--;
        at++;
    } while (depth > 0 && text[at]);
    return at;
}

/* Past a value and the comma after it, if any: at the next member or the end. */
static size_t next_member(const char *text, size_t value_at)
{
    size_t at = skip_whitespace(text, skip_value(text, value_at));
    return text[at] == ',' ? skip_whitespace(text, at + 1) : at;
}

/* Does the string token text[at, end) decode to `name`? jansson decodes it, so
 * escapes ("\u006cr" is "lr") compare as they should. */
static bool token_equals(const char *text, size_t at, size_t end, const char *name)
{
    json_t *decoded = json_loadb(text + at, end - at, JSON_DECODE_ANY, NULL);
    bool equal = json_is_string(decoded) && strcmp(json_string_value(decoded), name) == 0;
    json_decref(decoded);
    return equal;
}

/* In the object at `at`, the offset of the value of `key` (and of the key in
 * *key_at); SIZE_MAX when absent. The last member of that name counts, as in
 * jansson without JSON_REJECT_DUPLICATES. */
static size_t member_value(const char *text, size_t at, const char *key, size_t *key_at)
{
    size_t found = SIZE_MAX;
    at = skip_whitespace(text, at + 1);
    while (text[at] == '"') {
        size_t key_end = skip_string(text, at);
        size_t value_at = skip_whitespace(text, skip_whitespace(text, key_end) + 1); /* past ':' */
        if (token_equals(text, at, key_end, key)) {
            *key_at = at;
            found = value_at;
        }
        at = next_member(text, value_at);
    }
    return found;
}

/* In the array at `at`, the offset of element `index`; SIZE_MAX when absent. */
static size_t element_value(const char *text, size_t at, size_t index)
{
    at = skip_whitespace(text, at + 1);
    for (size_t i = 0; text[at] && text[at] != ']'; i++) {
        if (i == index) return at;
        at = next_member(text, at);
    }
    return SIZE_MAX;
}

/* One step down from the value at `at`; SIZE_MAX when the step is not there.
 * *key_at becomes the key's offset, or the value's for an index. */
static size_t step_into(const char *text, size_t at, pt_json_step step, size_t *key_at)
{
    size_t value_at = SIZE_MAX;
    if (step.key && text[at] == '{') value_at = member_value(text, at, step.key, key_at);
    if (!step.key && text[at] == '[') {
        value_at = element_value(text, at, step.index);
        *key_at = value_at;
    }
    return value_at;
}

static void line_and_column(const char *text, size_t offset, int *line, int *column)
{
    *line = 1;
    *column = 1;
    for (size_t i = 0; i < offset && text[i]; i++) {
        if (text[i] == '\n') {
            ++*line;
            *column = 1;
        } else if (((unsigned char)text[i] & 0xC0) != 0x80) {
            ++*column;
        }
    }
}

bool pt_json_locate(const char *text, const pt_json_step *path, int depth, pt_json_position *at)
{
    size_t value_at = skip_whitespace(text, 0), key_at = value_at;
    int reached = 0;
    for (; reached < depth; reached++) {
        size_t next_key = key_at, next = step_into(text, value_at, path[reached], &next_key);
        if (next == SIZE_MAX) break;
        value_at = next;
        key_at = next_key;
    }
    line_and_column(text, value_at, &at->line, &at->column);
    line_and_column(text, key_at, &at->key_line, &at->key_column);
    return reached == depth;
}
