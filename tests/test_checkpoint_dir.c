/* A directory of checkpoints, without processes: names are read with any
 * zero padding, the newest usable checkpoint is found by the names in the
 * directory and damaged newer ones are passed by, and pruning removes the
 * temporary files that killed writers left. (tests/test_ckpt_faults.c does
 * the same to real runs.) */
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "train/checkpoint.h"

static char test_dir[64];

static void make_test_dir(void)
{
    strcpy(test_dir, "/tmp/pt_checkpoint_dir_XXXXXX");
    cr_assert(mkdtemp(test_dir), "mkdtemp failed");
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_test_dir(void) { nftw(test_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

TestSuite(checkpoint_dir, .init = make_test_dir, .fini = remove_test_dir);

static bool exists(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    return access(path, F_OK) == 0;
}

static void write_text(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    cr_assert_eq(pt_write_file_atomic(path, text, strlen(text)), PIPERT_OK);
}

/* A stage file of a 2-block model at `step` named `name`, with the metadata
 * a stage file has and write id `id`; its size. */
static uint64_t write_stage_file(long step, const char *name, uint64_t id)
{
    char path[256], number[32], id_text[PT_WRITE_ID_CHARS + 1];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    pt_safetensors_writer *w;
    cr_assert_eq(pt_safetensors_writer_create(&w), PIPERT_OK);
    const float data[4] = {1, 2, 3, 4};
    const int64_t shape[1] = {4};
    cr_assert_eq(pt_safetensors_writer_add(w, "wte.weight", PT_DTYPE_F32, data, 1, shape), PIPERT_OK);
    snprintf(number, sizeof number, "%ld", step);
    pt_checkpoint_format_write_id(id, id_text);
    pt_safetensors_writer_set_metadata(w, "format", PT_CHECKPOINT_FORMAT);
    pt_safetensors_writer_set_metadata(w, "step", number);
    pt_safetensors_writer_set_metadata(w, "stage", "0");
    pt_safetensors_writer_set_metadata(w, "first_layer", "0");
    pt_safetensors_writer_set_metadata(w, "last_layer", "2");
    pt_safetensors_writer_set_metadata(w, "write_id", id_text);
    cr_assert_eq(pt_safetensors_writer_write(w, path), PIPERT_OK);
    pt_safetensors_writer_free(w);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

/* A one-stage checkpoint at `step`: its stage file named `file` (NULL: the
 * usual name) of write id 1000 + step, and an index named `index_name`
 * (NULL: the usual name) listing it. */
static void write_checkpoint(long step, const char *file, const char *index_name)
{
    char name[PT_CHECKPOINT_NAME_MAX];
    if (file) snprintf(name, sizeof name, "%s", file);
    else pt_checkpoint_part_name(step, 0, 0, name);
    pt_checkpoint_index index;
    cr_assert_eq(pt_checkpoint_index_init(&index, step, 1, 1, false), PIPERT_OK);
    index.n_layer = 2;
    strcpy(index.schedule, "1f1b");
    strcpy(index.lookahead, "n/a");
    index.parts[0].last_layer = 2;
    index.parts[0].write_id = 1000 + (uint64_t)step;
    index.parts[0].bytes = write_stage_file(step, name, index.parts[0].write_id);
    snprintf(index.parts[0].file, sizeof index.parts[0].file, "%s", name);
    cr_assert_eq(pt_checkpoint_index_write(test_dir, &index), PIPERT_OK);
    pt_checkpoint_index_free(&index);
    if (index_name) {
        char from[256], to[256], usual[PT_CHECKPOINT_NAME_MAX];
        pt_checkpoint_index_name(step, usual);
        snprintf(from, sizeof from, "%s/%s", test_dir, usual);
        snprintf(to, sizeof to, "%s/%s", test_dir, index_name);
        cr_assert_eq(rename(from, to), 0);
    }
}

static long latest(void)
{
    pt_checkpoint_index index;
    if (pt_checkpoint_find_latest(test_dir, &index) != PIPERT_OK) return -1;
    const long step = index.step;
    pt_checkpoint_index_free(&index);
    return step;
}

Test(checkpoint_dir, names_are_read_with_any_zero_padding)
{
    cr_expect_eq(pt_checkpoint_index_step("ckpt-00000060.json"), 60);
    cr_expect_eq(pt_checkpoint_index_step("ckpt-60.json"), 60);
    cr_expect_eq(pt_checkpoint_index_step("ckpt-000060.json"), 60);
    cr_expect_eq(pt_checkpoint_index_step("ckpt-.json"), -1);
    cr_expect_eq(pt_checkpoint_index_step("ckpt--6.json"), -1);
    cr_expect_eq(pt_checkpoint_index_step("ckpt- 6.json"), -1);
    cr_expect_eq(pt_checkpoint_index_step("ckpt-60.json.tmp.12"), -1);
    cr_expect_eq(pt_checkpoint_index_step("ckpt-99999999999999999999999.json"), -1, "overflow");
    cr_expect_eq(pt_checkpoint_part_step("ckpt-0060-stage-1.safetensors"), 60);
    cr_expect_eq(pt_checkpoint_part_step("ckpt-60-stage-1-replica-2.safetensors"), 60);
    cr_expect_eq(pt_checkpoint_part_step("ckpt-60-stage-.safetensors"), -1);
    cr_expect_eq(pt_checkpoint_temp_step("ckpt-00000060-stage-0.safetensors.tmp.123"), 60);
    cr_expect_eq(pt_checkpoint_temp_step("ckpt-00000060.json.tmp.9"), 60);
    cr_expect_eq(pt_checkpoint_temp_step("ckpt-00000060.json.tmp."), -1);
    cr_expect_eq(pt_checkpoint_temp_step("ckpt-00000060.json.tmp.9x"), -1);
    cr_expect_eq(pt_checkpoint_temp_step("metrics.jsonl.tmp.5"), -1);
    char name[PT_CHECKPOINT_NAME_MAX];
    pt_checkpoint_index_name(60, name);
    cr_expect_str_eq(name, "ckpt-00000060.json");
}

Test(checkpoint_dir, the_newest_usable_checkpoint_is_found_by_its_name)
{
    cr_expect_eq(latest(), -1, "an empty directory");
    write_checkpoint(2, NULL, NULL);
    write_checkpoint(4, "ckpt-0004-stage-0.safetensors", "ckpt-4.json");
    cr_expect_eq(latest(), 4, "an index and a stage file with other paddings");
    write_checkpoint(6, NULL, NULL);
    cr_expect_eq(latest(), 6);
}

Test(checkpoint_dir, damaged_newer_checkpoints_are_passed_by)
{
    write_checkpoint(2, NULL, NULL);
    write_checkpoint(4, NULL, NULL);
    write_checkpoint(6, NULL, NULL);
    write_checkpoint(8, NULL, NULL);
    /* 8: a header that is not JSON, the size unchanged. */
    char path[256];
    snprintf(path, sizeof path, "%s/ckpt-00000008-stage-0.safetensors", test_dir);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, 8, SEEK_SET);
    fputs("[[[[", f);
    fclose(f);
    /* 6: the index of another step; 4: an index that does not parse. */
    write_text("ckpt-00000006.json", "{\"format\": \"pipert-checkpoint-index-1\"}");
    write_text("ckpt-00000004.json", "{\"format\": ");
    pt_checkpoint_index index;
    cr_assert_eq(pt_checkpoint_find_latest(test_dir, &index), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_eq(index.step, 2);
    pt_checkpoint_index_free(&index);

    /* Nothing usable: an error naming the directory and the newest problem. */
    snprintf(path, sizeof path, "%s/ckpt-00000002-stage-0.safetensors", test_dir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(pt_checkpoint_find_latest(test_dir, &index), PIPERT_ERR_NOT_FOUND);
    const char *error = pipert_last_error();
    cr_expect(strstr(error, test_dir) && strstr(error, "no complete checkpoint") &&
                  strstr(error, "ckpt-00000008-stage-0.safetensors"),
              "%s", error);
}

Test(checkpoint_dir, a_stage_file_of_another_step_is_not_used)
{
    write_checkpoint(2, NULL, NULL);
    write_checkpoint(4, NULL, NULL);
    /* The index of 4 names the stage file of 2 (same size). */
    char from[256], to[256];
    snprintf(from, sizeof from, "%s/ckpt-00000002-stage-0.safetensors", test_dir);
    snprintf(to, sizeof to, "%s/ckpt-00000004-stage-0.safetensors", test_dir);
    char *bytes;
    size_t size;
    cr_assert_eq(pt_read_file(from, &bytes, &size), PIPERT_OK);
    cr_assert_eq(pt_write_file_atomic(to, bytes, size), PIPERT_OK);
    free(bytes);
    cr_expect_eq(latest(), 2);
}

/* A run resumed from 2 rewrote the stage file of 4 and died before its
 * index: the old index of 4 lists another write. */
Test(checkpoint_dir, a_file_of_another_write_is_not_used)
{
    write_checkpoint(2, NULL, NULL);
    write_checkpoint(4, NULL, NULL);
    cr_expect_eq(latest(), 4);
    write_stage_file(4, "ckpt-00000004-stage-0.safetensors", 77);
    cr_expect_eq(latest(), 2);
    char id[PT_WRITE_ID_CHARS + 1];
    pt_checkpoint_format_write_id(77, id);
    cr_expect_str_eq(id, "000000000000004d");
    cr_expect_eq(pt_checkpoint_parse_write_id(id), 77);
    cr_expect_eq(pt_checkpoint_parse_write_id("000000000000004D"), 0, "upper case");
    cr_expect_eq(pt_checkpoint_parse_write_id("4d"), 0, "short");
}

Test(checkpoint_dir, pruning_removes_what_killed_writers_left)
{
    write_checkpoint(2, NULL, NULL);
    write_checkpoint(4, NULL, NULL);
    write_text("ckpt-00000004-stage-0.safetensors.tmp.4242", "half");
    write_text("ckpt-00000003.json.tmp.4242", "{");
    write_text("ckpt-00000006-stage-0.safetensors.tmp.4243", "a later one, being written");
    write_text("notes.txt.tmp.1", "not ours");
    pt_checkpoint_prune(test_dir, 4, 0);
    cr_expect_not(exists("ckpt-00000004-stage-0.safetensors.tmp.4242"));
    cr_expect_not(exists("ckpt-00000003.json.tmp.4242"));
    cr_expect(exists("ckpt-00000006-stage-0.safetensors.tmp.4243"), "a later step's temporary");
    cr_expect(exists("notes.txt.tmp.1"));
    cr_expect(exists("ckpt-00000002.json") && exists("ckpt-00000004.json"), "keep = 0 keeps all");
    pt_checkpoint_prune(test_dir, 4, 1);
    cr_expect_not(exists("ckpt-00000002.json"));
    cr_expect_not(exists("ckpt-00000002-stage-0.safetensors"));
    cr_expect(exists("ckpt-00000004.json"));
}
