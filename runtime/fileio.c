#include "runtime/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

pipert_result pt_read_file(const char *path, char **data, size_t *size)
{
    *data = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return pt_fail(PIPERT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return pt_fail(PIPERT_ERR_IO, "%s: not a regular file", path);
    }
    size_t length = (size_t)st.st_size;
    char *buffer = malloc(length + 1);
    if (!buffer) {
        fclose(f);
        return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot allocate %zu bytes to read it", path, length);
    }
    size_t got = fread(buffer, 1, length, f);
    int failed = ferror(f);
    fclose(f);
    if (failed || got != length) {
        free(buffer);
        return pt_fail(PIPERT_ERR_IO, "%s: read %zu of %zu bytes", path, got, length);
    }
    buffer[length] = '\0';
    *data = buffer;
    *size = length;
    return PIPERT_OK;
}

pipert_result pt_atomic_open(pt_atomic_file *file, const char *path)
{
    memset(file, 0, sizeof *file);
    size_t n = strlen(path) + 32;
    file->final_path = strdup(path);
    file->temp_path = malloc(n);
    if (!file->final_path || !file->temp_path) {
        pt_atomic_abort(file);
        return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", path);
    }
    /* The temporary lives beside the target (same filesystem: rename is atomic). */
    snprintf(file->temp_path, n, "%s.tmp.%ld", path, (long)getpid());
    file->stream = fopen(file->temp_path, "wbe");
    if (!file->stream) {
        pipert_result rc = pt_fail(PIPERT_ERR_IO, "%s: cannot create %s: %s", path,
                                   file->temp_path, strerror(errno));
        pt_atomic_abort(file);
        return rc;
    }
    return PIPERT_OK;
}

static void release(pt_atomic_file *file)
{
    free(file->final_path);
    free(file->temp_path);
    memset(file, 0, sizeof *file);
}

pipert_result pt_write_error(const char *path, const char *call, int error)
{
    const int full = error == ENOSPC || error == EDQUOT;
    return pt_fail(PIPERT_ERR_IO, "%s: cannot write (%s): %s%s", path, call, strerror(error),
                   full ? " (the disk is full)" : "");
}

/* Flushes, fsyncs and closes the stream: 0, or the errno of the first call
 * that failed, which *call names. */
static int finish_stream(FILE *stream, const char **call)
{
    int error = 0;
    if (fflush(stream) != 0) error = errno, *call = "fflush";
    else if (ferror(stream)) error = EIO, *call = "fwrite";
    else if (fsync(fileno(stream)) != 0) error = errno, *call = "fsync";
    if (fclose(stream) != 0 && !error) error = errno, *call = "close";
    return error;
}

/* fsyncs the directory of path, so that a rename there is durable: 0, or
 * the errno of fsync (a directory that cannot be opened, or whose file
 * system cannot sync directories, counts as synced). */
static int sync_directory(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return ENOMEM;
    int error = 0, dir = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0 && fsync(dir) != 0 && errno != EINVAL) error = errno;
    if (dir >= 0) close(dir);
    free(copy);
    return error;
}

pipert_result pt_atomic_commit(pt_atomic_file *file)
{
    const char *call = "";
    int error = finish_stream(file->stream, &call);
    file->stream = NULL;
    if (!error && rename(file->temp_path, file->final_path) != 0) error = errno, call = "rename";
    if (error) {
        pipert_result rc = pt_write_error(file->final_path, call, error);
        unlink(file->temp_path);
        release(file);
        return rc;
    }
    error = sync_directory(file->final_path);
    pipert_result rc = error ? pt_write_error(file->final_path, "fsync of its directory", error)
                             : PIPERT_OK;
    release(file);
    return rc;
}

void pt_atomic_abort(pt_atomic_file *file)
{
    if (file->stream) fclose(file->stream);
    if (file->temp_path) unlink(file->temp_path);
    release(file);
}

pipert_result pt_write_file_atomic(const char *path, const void *data, size_t size)
{
    pt_atomic_file file;
    PT_TRY(pt_atomic_open(&file, path));
    if (size && fwrite(data, 1, size, file.stream) != size) {
        pipert_result rc = pt_write_error(path, "fwrite", errno);
        pt_atomic_abort(&file);
        return rc;
    }
    return pt_atomic_commit(&file);
}

pipert_result pt_write_json_atomic(const char *path, const json_t *json, size_t flags)
{
    char *text = json ? json_dumps(json, flags) : NULL;
    if (!text) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot format the JSON", path);
    pt_atomic_file file;
    pipert_result rc = pt_atomic_open(&file, path);
    if (rc == PIPERT_OK && fprintf(file.stream, "%s\n", text) < 0) {
        pt_atomic_abort(&file);
        rc = pt_fail(PIPERT_ERR_IO, "%s: short write", path);
    } else if (rc == PIPERT_OK) {
        rc = pt_atomic_commit(&file);
    }
    free(text);
    return rc;
}

pipert_result pt_make_dirs(const char *path)
{
    if (!*path) return PIPERT_OK;
    char *copy = strdup(path);
    if (!copy) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    for (char *p = copy + 1;; p++) {
        int at_end = *p == '\0';
        if (*p == '/' || at_end) {
            *p = '\0';
            if (mkdir(copy, 0755) != 0 && errno != EEXIST) {
                pipert_result rc = pt_fail(PIPERT_ERR_IO, "%s: cannot create directory: %s",
                                           copy, strerror(errno));
                free(copy);
                return rc;
            }
            if (at_end) break;
            *p = '/';
        }
    }
    free(copy);
    return PIPERT_OK;
}
