/* runtime/fileio.h: pt_write_json_atomic writes the whole text or nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/fileio.h"

Test(fileio, json_is_written_whole_with_a_newline)
{
    char dir[] = "/tmp/pipert-fileio-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.json", dir);
    json_t *value = json_pack("{s:i, s:[s]}", "n", 3, "list", "x");
    cr_assert_eq(pt_write_json_atomic(path, value, JSON_COMPACT | JSON_PRESERVE_ORDER), PIPERT_OK,
                 "%s", pipert_last_error());
    char *text;
    size_t size;
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK);
    cr_expect_str_eq(text, "{\"n\":3,\"list\":[\"x\"]}\n");
    free(text);
    json_decref(value);
    unlink(path);
    cr_expect_eq(rmdir(dir), 0, "something besides the file was left in %s", dir);
}

Test(fileio, a_failed_json_write_names_the_file)
{
    json_t *value = json_object();
    cr_expect_eq(pt_write_json_atomic("/nonexistent/dir/a.json", value, 0), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "/nonexistent/dir/a.json"), "%s", pipert_last_error());
    json_decref(value);
    cr_expect_eq(pt_write_json_atomic("/tmp/never.json", NULL, 0), PIPERT_ERR_NOMEM);
}
