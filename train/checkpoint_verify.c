/* Is a checkpoint usable? Every file its index lists must be there with the
 * size the index lists, be a valid safetensors file (pt_safetensors_open
 * checks the whole header and that every tensor lies inside the file), and
 * be the pipert checkpoint file of the index's step, of its stage and
 * replica, holding its blocks, and of the very write the index lists (a
 * random id each write puts in the file and reports to the index's writer):
 * a file that a later run wrote under the same name — a resumed run
 * rewriting a step whose index is still the old one — does not belong to the
 * old index. What a crash while writing, a full disk or a
 * damaged file leaves behind fails one of these, naming the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/checkpoint.h"

static pipert_result read_number(const pt_safetensors *st, const char *key, long *out)
{
    const char *text = pt_safetensors_metadata(st, key);
    char *end;
    if (!text || !*text || ((*out = strtol(text, &end, 10)), *end) || *out < 0)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: metadata \"%s\" is missing or not a number",
                       pt_safetensors_path(st), key);
    return PIPERT_OK;
}

pipert_result pt_checkpoint_check_part(const pt_safetensors *st, const pt_checkpoint_index *index,
                                       const pt_checkpoint_part *part)
{
    const char *path = pt_safetensors_path(st);
    const char *format = pt_safetensors_metadata(st, "format");
    if (!format || strcmp(format, PT_CHECKPOINT_FORMAT))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: not a pipert checkpoint stage file (format %s)",
                       path, format ? format : "missing");
    long step = 0, stage = 0, replica = 0, first = 0, last = 0;
    PT_TRY(read_number(st, "step", &step));
    PT_TRY(read_number(st, "stage", &stage));
    /* Files written before replica files existed are replica 0's. */
    if (pt_safetensors_metadata(st, "replica")) PT_TRY(read_number(st, "replica", &replica));
    PT_TRY(read_number(st, "first_layer", &first));
    PT_TRY(read_number(st, "last_layer", &last));
    const uint64_t write_id = pt_checkpoint_parse_write_id(pt_safetensors_metadata(st, "write_id"));
    if (part->write_id && write_id != part->write_id) {
        char listed[PT_WRITE_ID_CHARS + 1], found[PT_WRITE_ID_CHARS + 1];
        pt_checkpoint_format_write_id(part->write_id, listed);
        pt_checkpoint_format_write_id(write_id, found);
        return pt_fail(PIPERT_ERR_FORMAT, "%s: is not the file the index of step %ld lists (write "
                                          "id %s, the index lists %s): a later write replaced it",
                       path, index->step, found, listed);
    }
    if (step != index->step || stage != part->stage || replica != part->replica ||
        first != part->first_layer || last != part->last_layer)
        return pt_fail(PIPERT_ERR_FORMAT,
                       "%s: holds step %ld, stage %ld, replica %ld, blocks [%ld, %ld); the index "
                       "of step %ld says stage %d, replica %d, blocks [%d, %d)",
                       path, step, stage, replica, first, last, index->step, part->stage,
                       part->replica, part->first_layer, part->last_layer);
    return PIPERT_OK;
}

static pipert_result check_size(const char *path, uint64_t bytes)
{
    struct stat st;
    if (stat(path, &st) != 0) return pt_fail(PIPERT_ERR_NOT_FOUND, "%s is missing", path);
    if ((uint64_t)st.st_size != bytes)
        return pt_fail(PIPERT_ERR_FORMAT, "%s has %lld bytes, the index lists %llu", path,
                       (long long)st.st_size, (unsigned long long)bytes);
    return PIPERT_OK;
}

static pipert_result verify_file(const char *dir, const pt_checkpoint_index *index,
                                 const pt_checkpoint_part *part)
{
    char path[PT_CONFIG_STRING_MAX + PT_CHECKPOINT_NAME_MAX + 2];
    snprintf(path, sizeof path, "%s/%s", dir, part->file);
    PT_TRY(check_size(path, part->bytes));
    pt_safetensors *st;
    PT_TRY(pt_safetensors_open(&st, path));
    pipert_result rc = pt_checkpoint_check_part(st, index, part);
    pt_safetensors_close(st);
    return rc;
}

pipert_result pt_checkpoint_verify(const char *dir, const pt_checkpoint_index *index)
{
    for (int i = 0; i < pt_checkpoint_index_file_count(index); i++)
        PT_TRY(verify_file(dir, index, pt_checkpoint_index_file(index, i)));
    return PIPERT_OK;
}
