/* Finding a row of a table by its name: the one loop behind every "which X is called this"
 * (devices, look-aheads, dp methods, codecs), with one error for an unknown name that says
 * which key it was and lists the known names. */
#ifndef PT_NAME_TABLE_H
#define PT_NAME_TABLE_H

#include <stddef.h>

/* The index of the row of `rows` (`count` rows of `stride` bytes, each with a `const char *`
 * name at `name_offset`) called `name`; -1 with a PIPERT_ERR_CONFIG naming `key` and the
 * known names if none is. pt_name_table_find(rows, count, name, key) for arrays of structs
 * whose member is `name`. */
int pt_name_table_index(const void *rows, size_t count, size_t stride, size_t name_offset,
                        const char *name, const char *key);

#define pt_name_table_find(rows, count, wanted, key)                                              \
    pt_name_table_index((rows), (count), sizeof *(rows), offsetof(__typeof__(*(rows)), name),    \
                        (wanted), (key))

#endif
