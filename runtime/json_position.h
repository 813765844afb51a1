/* Where a value stands in a JSON text. jansson keeps no positions of values,
 * so to say on which line a bad field of a file stands the text is scanned
 * again along the field's path: object keys and array indices from the root.
 *
 *   const pt_json_step path[] = {PT_JSON_KEY("links"), PT_JSON_INDEX(2),
 *                                PT_JSON_KEY("bandwidth")};
 *   pt_json_position at;
 *   pt_json_locate(text, path, 3, &at);   // at.line, at.column of the value
 *
 * Lines and columns are 1-based; like jansson, columns count characters (not
 * the continuation bytes of UTF-8 sequences). The text should be JSON that
 * jansson has parsed: the scanner checks nothing. */
#ifndef PT_JSON_POSITION_H
#define PT_JSON_POSITION_H

#include <stdbool.h>
#include <stddef.h>

/* One component of a path: an object's key, or (key NULL) an array's index. */
typedef struct pt_json_step {
    const char *key;
    size_t index;
} pt_json_step;

#define PT_JSON_KEY(name) ((pt_json_step){.key = (name)})
#define PT_JSON_INDEX(i) ((pt_json_step){.key = NULL, .index = (size_t)(i)})

typedef struct pt_json_position {
    int line, column;         /* where the value starts */
    int key_line, key_column; /* where its key starts; the value's position when the
                                 last step is an index or the path is empty */
} pt_json_position;

/* The position of the value at path[0..depth) (depth 0: the whole document).
 * Returns false when the path is not in the text; *at then holds the position
 * of the deepest value along the path that is. */
bool pt_json_locate(const char *text, const pt_json_step *path, int depth, pt_json_position *at);

#endif
