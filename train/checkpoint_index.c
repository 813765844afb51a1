/* A checkpoint's index, DIR/ckpt-STEP.json (the directory's bookkeeping —
 * which checkpoints are usable, which is the newest, which go away — is in
 * checkpoint_dir.c). The index is written last (after every stage's and replica's file),
 * atomically, so it is what makes a checkpoint complete:
 *
 *   {"format": "pipert-checkpoint-index-1", "step": 40, "stages": 2,
 *    "replicas": 1, "n_layer": 4, "schedule": "async-1f1b",
 *    "microbatches": 100, "first_microbatch": 0, "lookahead": "nesterov",
 *    "files": [{"stage": 0, "file": "ckpt-00000040-stage-0.safetensors",
 *               "first_layer": 0, "last_layer": 2, "bytes": 123456,
 *               "write_id": "3f9c0a7d5e21b468"}, ...]}
 *
 * A checkpoint with replica files (replicas ≥ 2 whose method lets them
 * drift) has format pipert-checkpoint-index-2: the same, plus
 *
 *    "replica_files": [{"stage": 0, "replica": 1,
 *                       "file": "ckpt-00000040-stage-0-replica-1.safetensors",
 *                       "first_layer": 0, "last_layer": 2, "bytes": 123456}, ...]
 *
 * one per stage of each replica 1..replicas−1, by replica then stage, with
 * the blocks of that stage's file. "write_id" (16 hex digits, optional:
 * indexes written before it existed have none) is the random id of the
 * write that made the file, also in its metadata; a file with another id
 * is not this checkpoint's (checkpoint_verify.c). Format 1 is still written when there are
 * none, so such a checkpoint reads as before everywhere; a build that only
 * knows format 1 refuses a format-2 index by name rather than resuming every
 * replica from replica 0's files. Both formats are read. */
#include "train/checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/fileio.h"

#define INDEX_FORMAT "pipert-checkpoint-index-1"
#define INDEX_FORMAT_REPLICAS "pipert-checkpoint-index-2" /* with "replica_files" */

pipert_result pt_checkpoint_index_init(pt_checkpoint_index *index, long step, int stages,
                                       int replicas, bool replica_files)
{
    memset(index, 0, sizeof *index);
    if (stages < 1 || replicas < 1)
        return pt_fail(PIPERT_ERR_FORMAT, "checkpoint index: %d stages, %d replicas", stages,
                       replicas);
    index->parts = calloc((size_t)stages, sizeof *index->parts);
    if (replica_files && replicas > 1)
        index->replica_parts = calloc((size_t)(replicas - 1) * (size_t)stages,
                                      sizeof *index->replica_parts);
    if (!index->parts || (replica_files && replicas > 1 && !index->replica_parts)) {
        pt_checkpoint_index_free(index);
        return pt_fail(PIPERT_ERR_NOMEM, "checkpoint index: out of memory");
    }
    index->step = step;
    index->stages = stages;
    index->replicas = replicas;
    for (int s = 0; s < stages; s++) index->parts[s].stage = s;
    for (int r = 1; index->replica_parts && r < replicas; r++)
        for (int s = 0; s < stages; s++) {
            pt_checkpoint_part *part = &index->replica_parts[(r - 1) * stages + s];
            part->stage = s;
            part->replica = r;
        }
    return PIPERT_OK;
}

void pt_checkpoint_index_free(pt_checkpoint_index *index)
{
    free(index->parts);
    free(index->replica_parts);
    memset(index, 0, sizeof *index);
}

pt_checkpoint_part *pt_checkpoint_index_part(const pt_checkpoint_index *index, int stage,
                                             int replica)
{
    if (stage < 0 || stage >= index->stages || replica < 0 || replica >= index->replicas)
        return NULL;
    if (replica == 0) return &index->parts[stage];
    return index->replica_parts ? &index->replica_parts[(replica - 1) * index->stages + stage]
                                : NULL;
}

int pt_checkpoint_index_file_count(const pt_checkpoint_index *index)
{
    return index->replica_parts ? index->replicas * index->stages : index->stages;
}

const pt_checkpoint_part *pt_checkpoint_index_file(const pt_checkpoint_index *index, int i)
{
    return i < index->stages ? &index->parts[i] : &index->replica_parts[i - index->stages];
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (path) snprintf(path, n, "%s/%s", dir, name);
    return path;
}

/* ---- writing and reading ---------------------------------------------------- */

static json_t *part_to_json(const pt_checkpoint_part *p)
{
    json_t *o = p->replica > 0
                    ? json_pack("{s:i, s:i, s:s, s:i, s:i, s:I}", "stage", p->stage, "replica",
                                p->replica, "file", p->file, "first_layer", p->first_layer,
                                "last_layer", p->last_layer, "bytes", (json_int_t)p->bytes)
                    : json_pack("{s:i, s:s, s:i, s:i, s:I}", "stage", p->stage, "file", p->file,
                                "first_layer", p->first_layer, "last_layer", p->last_layer,
                                "bytes", (json_int_t)p->bytes);
    if (o && p->write_id) {
        char id[PT_WRITE_ID_CHARS + 1];
        pt_checkpoint_format_write_id(p->write_id, id);
        json_object_set_new(o, "write_id", json_string(id));
    }
    return o;
}

static json_t *index_to_json(const pt_checkpoint_index *index)
{
    json_t *files = json_array(), *replica_files = index->replica_parts ? json_array() : NULL;
    for (int i = 0; files && i < pt_checkpoint_index_file_count(index); i++)
        json_array_append_new(i < index->stages ? files : replica_files,
                              part_to_json(pt_checkpoint_index_file(index, i)));
    json_t *o = json_pack("{s:s, s:I, s:i, s:i, s:i, s:s, s:I, s:I, s:s, s:o}", "format",
                          replica_files ? INDEX_FORMAT_REPLICAS : INDEX_FORMAT, "step",
                          (json_int_t)index->step, "stages", index->stages, "replicas",
                          index->replicas, "n_layer", index->n_layer, "schedule", index->schedule,
                          "microbatches", (json_int_t)index->microbatches, "first_microbatch",
                          (json_int_t)index->first_microbatch, "lookahead", index->lookahead,
                          "files", files);
    if (o && replica_files) json_object_set_new(o, "replica_files", replica_files);
    else json_decref(replica_files);
    return o;
}

pipert_result pt_checkpoint_index_write(const char *dir, const pt_checkpoint_index *index)
{
    char name[PT_CHECKPOINT_NAME_MAX];
    pt_checkpoint_index_name(index->step, name);
    char *path = join(dir, name);
    json_t *o = index_to_json(index);
    char *text = o ? json_dumps(o, JSON_INDENT(1)) : NULL;
    json_decref(o);
    pipert_result rc = path && text ? pt_write_file_atomic(path, text, strlen(text))
                                    : pt_fail(PIPERT_ERR_NOMEM, "checkpoint index: out of memory");
    free(text);
    free(path);
    return rc;
}

static pipert_result copy_text(const char *path, const char *key, const char *value, char *dst,
                               size_t cap)
{
    if (strlen(value) >= cap)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: \"%s\" is too long", path, key);
    strcpy(dst, value);
    return PIPERT_OK;
}

/* Entry i of the index's list `list` ("files" or "replica_files"), which
 * must be the file of part->stage and part->replica (set by index_init). */
static pipert_result parse_part(const char *path, const char *list, int i, json_t *entry,
                                pt_checkpoint_part *part)
{
    const char *file = NULL, *write_id = NULL;
    json_int_t bytes = 0;
    int stage = -1, replica = 0;
    if (json_unpack(entry, "{s:i, s?i, s:s, s:i, s:i, s:I, s?s}", "stage", &stage, "replica",
                    &replica, "file", &file, "first_layer", &part->first_layer, "last_layer",
                    &part->last_layer, "bytes", &bytes, "write_id", &write_id) != 0 ||
        bytes < 0 || (write_id && !pt_checkpoint_parse_write_id(write_id)))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %s[%d] is malformed", path, list, i);
    part->write_id = pt_checkpoint_parse_write_id(write_id);
    if (stage != part->stage || replica != part->replica || strchr(file, '/') ||
        pt_checkpoint_part_step(file) < 0 || part->first_layer < 0 || part->last_layer < part->first_layer)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %s[%d] (stage %d, replica %d, \"%s\", blocks "
                                          "[%d, %d)) is not the file of stage %d, replica %d of "
                                          "this checkpoint",
                       path, list, i, stage, replica, file, part->first_layer, part->last_layer,
                       part->stage, part->replica);
    part->bytes = (uint64_t)bytes;
    return copy_text(path, "file", file, part->file, sizeof part->file);
}

/* Format 2's "replica_files": each stage of each replica ≥ 1, with the
 * blocks of the stage's own file. */
static pipert_result parse_replica_files(const char *path, json_t *list, pt_checkpoint_index *out)
{
    const int count = (out->replicas - 1) * out->stages;
    if (!json_is_array(list) || (int)json_array_size(list) != count)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %d stages of %d replicas, but replica_files lists "
                                          "%zu files (expected %d)",
                       path, out->stages, out->replicas, json_array_size(list), count);
    for (int i = 0; i < count; i++) {
        pt_checkpoint_part *part = &out->replica_parts[i];
        PT_TRY(parse_part(path, "replica_files", i, json_array_get(list, (size_t)i), part));
        const pt_checkpoint_part *own = &out->parts[part->stage];
        if (part->first_layer != own->first_layer || part->last_layer != own->last_layer)
            return pt_fail(PIPERT_ERR_FORMAT, "%s: replica %d's file of stage %d has blocks "
                                              "[%d, %d), the stage's [%d, %d)",
                           path, part->replica, part->stage, part->first_layer, part->last_layer,
                           own->first_layer, own->last_layer);
    }
    return PIPERT_OK;
}

static pipert_result parse_index(const char *path, json_t *o, pt_checkpoint_index *out)
{
    const char *format = NULL, *schedule = NULL, *lookahead = NULL;
    json_int_t step = 0, microbatches = 0, first_microbatch = 0;
    int stages = 0, replicas = 0, n_layer = 0;
    json_t *files = NULL, *replica_files = NULL;
    if (json_unpack(o, "{s:s, s:I, s:i, s:i, s:i, s:s, s:I, s:I, s:s, s:o, s?o}", "format",
                    &format, "step", &step, "stages", &stages, "replicas", &replicas, "n_layer",
                    &n_layer, "schedule", &schedule, "microbatches", &microbatches,
                    "first_microbatch", &first_microbatch, "lookahead", &lookahead, "files",
                    &files, "replica_files", &replica_files) != 0)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: not a pipert checkpoint index (fields missing)", path);
    const bool with_replicas = !strcmp(format, INDEX_FORMAT_REPLICAS);
    if (strcmp(format, INDEX_FORMAT) && !with_replicas)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: format \"%s\" (this build reads " INDEX_FORMAT
                                          " and " INDEX_FORMAT_REPLICAS ")",
                       path, format);
    if (with_replicas != (replica_files != NULL) || (with_replicas && replicas < 2))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: format \"%s\" with %d replicas %s replica_files",
                       path, format, replicas, replica_files ? "has" : "lacks");
    if (!json_is_array(files) || (int)json_array_size(files) != stages)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: %d stages, but files lists %zu", path, stages,
                       json_array_size(files));
    /* Indexes of format 1 written by single workers may say 0 replicas. */
    PT_TRY(pt_checkpoint_index_init(out, (long)step, stages, replicas > 0 ? replicas : 1,
                                    with_replicas));
    out->n_layer = n_layer;
    out->microbatches = (long)microbatches;
    out->first_microbatch = (long)first_microbatch;
    PT_TRY(copy_text(path, "schedule", schedule, out->schedule, sizeof out->schedule));
    PT_TRY(copy_text(path, "lookahead", lookahead, out->lookahead, sizeof out->lookahead));
    for (int s = 0; s < stages; s++)
        PT_TRY(parse_part(path, "files", s, json_array_get(files, (size_t)s), &out->parts[s]));
    for (int s = 0; s < stages; s++) {
        const int expected_first = s == 0 ? 0 : out->parts[s - 1].last_layer;
        if (out->parts[s].first_layer != expected_first ||
            (s == stages - 1 && out->parts[s].last_layer != n_layer))
            return pt_fail(PIPERT_ERR_FORMAT, "%s: the stages' blocks do not cover [0, %d) in "
                                              "order (stage %d has [%d, %d))",
                           path, n_layer, s, out->parts[s].first_layer, out->parts[s].last_layer);
    }
    return with_replicas ? parse_replica_files(path, replica_files, out) : PIPERT_OK;
}

pipert_result pt_checkpoint_index_read(const char *dir, const char *name, pt_checkpoint_index *out)
{
    memset(out, 0, sizeof *out);
    const long step = pt_checkpoint_index_step(name);
    char *path = join(dir, name), *text = NULL;
    size_t size;
    if (!path) return pt_fail(PIPERT_ERR_NOMEM, "checkpoint index: out of memory");
    pipert_result rc = step >= 0 ? pt_read_file(path, &text, &size)
                                 : pt_fail(PIPERT_ERR_INVALID_ARG, "%s: not a checkpoint index "
                                                                   "name (ckpt-STEP.json)", path);
    json_error_t error;
    json_t *o = rc == PIPERT_OK ? json_loads(text, 0, &error) : NULL;
    if (rc == PIPERT_OK && !o)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s:%d:%d: %s", path, error.line, error.column, error.text);
    if (rc == PIPERT_OK) rc = parse_index(path, o, out);
    if (rc == PIPERT_OK && out->step != step)
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s: holds the index of step %ld", path, out->step);
    if (rc != PIPERT_OK) pt_checkpoint_index_free(out);
    json_decref(o);
    free(text);
    free(path);
    return rc;
}
