/* Whole-file reads and crash-safe writes: a file is written under a temporary
 * name in its directory (PATH.tmp.PID), flushed, fsynced, closed and renamed
 * over the final name, and the directory is fsynced, so a reader — also
 * after a crash of the writer or of the machine — sees the old file or the
 * new one, never half of one. A failed write (a full disk: ENOSPC from
 * fwrite, fflush, fsync or close) is an error naming the final path, and
 * removes the temporary file. */
#ifndef PT_FILEIO_H
#define PT_FILEIO_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#include "runtime/error.h"

/* Reads a whole file into a malloc'd buffer (NUL-terminated for convenience;
 * *size excludes the NUL). */
pipert_result pt_read_file(const char *path, char **data, size_t *size);

typedef struct pt_atomic_file {
    FILE *stream;  /* write here */
    char *final_path;
    char *temp_path;
} pt_atomic_file;

pipert_result pt_atomic_open(pt_atomic_file *file, const char *path);
/* Flushes, fsyncs, closes and renames into place, then fsyncs the
 * directory; on a failure before the rename removes the temporary file and
 * leaves the old file untouched (a failure of the directory's fsync is
 * reported after the rename). */
pipert_result pt_atomic_commit(pt_atomic_file *file);
/* Abandons the write: removes the temporary file. */
void pt_atomic_abort(pt_atomic_file *file);

pipert_result pt_write_file_atomic(const char *path, const void *data, size_t size);

/* PIPERT_ERR_IO: "PATH: cannot write (CALL): strerror(error)", with "(the
 * disk is full)" for ENOSPC and EDQUOT. */
pipert_result pt_write_error(const char *path, const char *call, int error);

/* `json` as text (json_dumps with `flags`, e.g. JSON_INDENT(2); a value that
 * is not an object or array needs JSON_ENCODE_ANY) and a final newline,
 * written atomically. */
pipert_result pt_write_json_atomic(const char *path, const json_t *json, size_t flags);

/* mkdir -p */
pipert_result pt_make_dirs(const char *path);

#endif
