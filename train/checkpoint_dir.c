/* A directory of checkpoints: which are usable, which is the newest usable
 * one, which go away. Checkpoints are found by reading the directory's file
 * names (index files ckpt-STEP.json, any zero padding), newest first; the
 * files of a checkpoint are the ones its index names. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/log.h"
#include "train/checkpoint.h"

/* An index file of the directory. */
typedef struct index_file {
    long step;
    char name[PT_CHECKPOINT_NAME_MAX];
} index_file;

static int newest_first(const void *a, const void *b)
{
    const index_file *x = a, *y = b;
    if (x->step != y->step) return (x->step < y->step) - (x->step > y->step);
    return strcmp(x->name, y->name);
}

static pipert_result append(index_file **files, size_t *count, size_t *capacity, long step,
                            const char *name)
{
    if (*count == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 16;
        index_file *grown = realloc(*files, *capacity * sizeof **files);
        if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "listing checkpoints: out of memory");
        *files = grown;
    }
    (*files)[*count].step = step;
    snprintf((*files)[*count].name, PT_CHECKPOINT_NAME_MAX, "%s", name);
    (*count)++;
    return PIPERT_OK;
}

/* The index files of dir, newest first (none when dir cannot be read). */
static pipert_result list_indexes(const char *dir, index_file **files, size_t *count)
{
    *files = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return PIPERT_OK;
    size_t capacity = 0;
    pipert_result rc = PIPERT_OK;
    for (struct dirent *entry; rc == PIPERT_OK && (entry = readdir(d));) {
        const long step = pt_checkpoint_index_step(entry->d_name);
        if (step >= 0 && strlen(entry->d_name) < PT_CHECKPOINT_NAME_MAX)
            rc = append(files, count, &capacity, step, entry->d_name);
    }
    closedir(d);
    if (rc != PIPERT_OK) {
        free(*files);
        *files = NULL;
        *count = 0;
    }
    if (*count > 1) qsort(*files, *count, sizeof **files, newest_first);
    return rc;
}

/* ---- the newest usable checkpoint --------------------------------------------- */

/* Reads and verifies the checkpoint of one index file. */
static pipert_result read_usable(const char *dir, const char *name, pt_checkpoint_index *out)
{
    PT_TRY(pt_checkpoint_index_read(dir, name, out));
    pipert_result rc = pt_checkpoint_verify(dir, out);
    if (rc != PIPERT_OK) pt_checkpoint_index_free(out);
    return rc;
}

pipert_result pt_checkpoint_find_latest(const char *dir, pt_checkpoint_index *out)
{
    index_file *files;
    size_t count;
    memset(out, 0, sizeof *out);
    PT_TRY(list_indexes(dir, &files, &count));
    char newest_problem[1024] = "";
    for (size_t i = 0; i < count; i++) {
        if (read_usable(dir, files[i].name, out) == PIPERT_OK) {
            free(files);
            return PIPERT_OK;
        }
        pt_warn("%s/%s: the checkpoint of step %ld is incomplete or damaged and is not used: %s",
                dir, files[i].name, files[i].step, pipert_last_error());
        if (!newest_problem[0])
            snprintf(newest_problem, sizeof newest_problem, "%s", pipert_last_error());
    }
    free(files);
    if (newest_problem[0])
        return pt_fail(PIPERT_ERR_NOT_FOUND, "%s: no complete checkpoint to resume from (%zu "
                                             "found, none usable; the newest: %s)",
                       dir, count, newest_problem);
    return pt_fail(PIPERT_ERR_NOT_FOUND, "%s: no checkpoint (ckpt-STEP.json) to resume from", dir);
}

/* ---- pruning -------------------------------------------------------------------- */

static void remove_file(const char *dir, const char *name)
{
    char path[PT_CONFIG_STRING_MAX + 2 * PT_CHECKPOINT_NAME_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) == 0) pt_debug("removed old checkpoint file %s", path);
}

/* The index goes first: from then on the checkpoint is incomplete, and a
 * crash halfway leaves only files that pruning or an overwrite clears. */
static void remove_checkpoint(const char *dir, const char *index_name)
{
    pt_checkpoint_index index;
    pipert_result rc = pt_checkpoint_index_read(dir, index_name, &index);
    remove_file(dir, index_name);
    if (rc != PIPERT_OK) return; /* its files are orphans now, removed as such */
    for (int i = 0; i < pt_checkpoint_index_file_count(&index); i++)
        remove_file(dir, pt_checkpoint_index_file(&index, i)->file);
    pt_checkpoint_index_free(&index);
}

static bool indexed(const index_file *files, size_t count, long step)
{
    for (size_t i = 0; i < count; i++)
        if (files[i].step == step) return true;
    return false;
}

/* Stage and replica files of steps before `newest` that no index lists. */
static void remove_orphans(const char *dir, long newest, const index_file *files, size_t count)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *entry; (entry = readdir(d));) {
        long step = pt_checkpoint_part_step(entry->d_name);
        if (step >= 0 && step < newest && !indexed(files, count, step))
            remove_file(dir, entry->d_name);
    }
    closedir(d);
}

void pt_checkpoint_remove_temporaries(const char *dir, long newest)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *entry; (entry = readdir(d));) {
        long step = pt_checkpoint_temp_step(entry->d_name);
        if (step >= 0 && step <= newest) remove_file(dir, entry->d_name);
    }
    closedir(d);
}

void pt_checkpoint_prune(const char *dir, long newest, int keep)
{
    pt_checkpoint_remove_temporaries(dir, newest);
    index_file *files;
    size_t count;
    if (keep <= 0 || list_indexes(dir, &files, &count) != PIPERT_OK) return;
    /* Only steps before `newest`: stages that are ahead (asynchronous
     * schedules) may be writing a later checkpoint now. */
    size_t kept = 0;
    for (size_t i = 0; i < count; i++) {
        if (files[i].step >= newest) {
            kept += files[i].step == newest;
            continue;
        }
        if (kept < (size_t)keep) kept++;
        else {
            remove_checkpoint(dir, files[i].name);
            files[i].step = -1;
        }
    }
    remove_orphans(dir, newest, files, count);
    free(files);
}
