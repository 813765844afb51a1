/* runtime/json_position: positions of values by a path of keys and indices,
 * checked against positions counted by hand. */
#include <criterion/criterion.h>

#include "runtime/json_position.h"

#define K(name) PT_JSON_KEY(name)
#define I(index) PT_JSON_INDEX(index)

/* Locates path[0..depth) and checks the value's and the key's line:column. */
static void expect_at(const char *text, const pt_json_step *path, int depth, int line, int column,
                      int key_line, int key_column)
{
    pt_json_position at;
    cr_assert(pt_json_locate(text, path, depth, &at), "path of depth %d not found", depth);
    cr_expect(at.line == line && at.column == column, "value at %d:%d, expected %d:%d", at.line,
              at.column, line, column);
    cr_expect(at.key_line == key_line && at.key_column == key_column,
              "key at %d:%d, expected %d:%d", at.key_line, at.key_column, key_line, key_column);
}

/* columns:  1234567890123456789012345678901234 5 */
static const char nested[] = "{\"a\": [[1, 2], [3, [4, 5]]], \"b\": 6}";

Test(json_position, nested_arrays)
{
    expect_at(nested, (pt_json_step[]){K("a")}, 1, 1, 7, 1, 2);
    expect_at(nested, (pt_json_step[]){K("a"), I(0)}, 2, 1, 8, 1, 8);
    expect_at(nested, (pt_json_step[]){K("a"), I(0), I(1)}, 3, 1, 12, 1, 12);
    expect_at(nested, (pt_json_step[]){K("a"), I(1)}, 2, 1, 16, 1, 16);
    expect_at(nested, (pt_json_step[]){K("a"), I(1), I(1)}, 3, 1, 20, 1, 20);
    expect_at(nested, (pt_json_step[]){K("a"), I(1), I(1), I(1)}, 4, 1, 24, 1, 24);
    expect_at(nested, (pt_json_step[]){K("b")}, 1, 1, 35, 1, 30);
}

Test(json_position, missing_path_gives_the_deepest_value_found)
{
    pt_json_position at;
    cr_expect_not(pt_json_locate(nested, (pt_json_step[]){K("a"), I(2)}, 2, &at));
    cr_expect(at.line == 1 && at.column == 7, "at %d:%d", at.line, at.column);
    cr_expect_not(pt_json_locate(nested, (pt_json_step[]){K("a"), K("x")}, 2, &at),
                  "a key into an array");
    cr_expect_not(pt_json_locate(nested, (pt_json_step[]){I(0)}, 1, &at), "an index into an object");
    cr_expect(at.line == 1 && at.column == 1, "at %d:%d", at.line, at.column);
    cr_expect_not(pt_json_locate(nested, (pt_json_step[]){K("b"), K("c")}, 2, &at), "into a number");
    cr_expect(at.column == 35, "at %d:%d", at.line, at.column);
}

/* A string holding an escaped quote and brackets stands before the values
 * looked for, and the key "s" appears at three depths. */
static const char multiline[] = "{\n"
                                "  \"s\": \"x\\\"[{\",\n"
                                "  \"t\": {\"s\": [ {\"s\": 1} ]},\n"
                                "  \"s2\": 2\n"
                                "}";

Test(json_position, strings_with_escapes_and_keys_at_several_depths)
{
    expect_at(multiline, (pt_json_step[]){K("s")}, 1, 2, 8, 2, 3);
    expect_at(multiline, (pt_json_step[]){K("t")}, 1, 3, 8, 3, 3);
    expect_at(multiline, (pt_json_step[]){K("t"), K("s")}, 2, 3, 14, 3, 9);
    expect_at(multiline, (pt_json_step[]){K("t"), K("s"), I(0)}, 3, 3, 16, 3, 16);
    expect_at(multiline, (pt_json_step[]){K("t"), K("s"), I(0), K("s")}, 4, 3, 22, 3, 17);
    expect_at(multiline, (pt_json_step[]){K("s2")}, 1, 4, 9, 4, 3);
}

/* The key `q"}` holds an escaped quote and a brace; "]\\" ends in an escaped
 * backslash, so its quote does close it. The key "x" is at two depths. */
static const char escapes[] = "{\"q\\\"}\": {\"x\": \"]\\\\\"}, \"x\": [true, null]}";

Test(json_position, escaped_quotes_and_backslashes)
{
    expect_at(escapes, (pt_json_step[]){K("q\"}")}, 1, 1, 10, 1, 2);
    expect_at(escapes, (pt_json_step[]){K("q\"}"), K("x")}, 2, 1, 16, 1, 11);
    expect_at(escapes, (pt_json_step[]){K("x")}, 1, 1, 29, 1, 24);
    expect_at(escapes, (pt_json_step[]){K("x"), I(1)}, 2, 1, 36, 1, 36);
}

Test(json_position, keys_are_compared_decoded)
{
    expect_at("{\"\\u0061\": 1}", (pt_json_step[]){K("a")}, 1, 1, 12, 1, 2);
}

Test(json_position, columns_count_characters)
{
    expect_at("{\"\xc3\xa9\": \"\xc3\xbc\", \"n\": 1}", (pt_json_step[]){K("n")}, 1, 1, 17, 1, 12);
}

Test(json_position, the_empty_path_is_the_document)
{
    expect_at("\n  [1, {}]", NULL, 0, 2, 3, 2, 3);
    expect_at("\n  [1, {}]", (pt_json_step[]){I(1)}, 1, 2, 7, 2, 7);
}
