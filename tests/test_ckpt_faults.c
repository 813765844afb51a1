/* Checkpoints that survive crashes and bad disks, with faults injected from
 * outside real `pipert train` processes (and `pipert launch` jobs of two
 * stages, one process each):
 *   - SIGKILL to the process writing a checkpoint (the moment a temporary
 *     file appears, seen through inotify; its name carries the writer's pid):
 *     `--resume` continues from a complete checkpoint with the losses of an
 *     uninterrupted run, and no temporary file is left once the resumed run
 *     has checkpointed;
 *   - the newest checkpoint damaged (a stage file truncated or with a bad
 *     header, an index unparsable or listing another size, files missing,
 *     names with another zero padding, a file another write put under the
 *     old index): resume warns naming the file, uses the one before, and the
 *     losses are those of an uninterrupted run; none usable is an error
 *     naming the directory;
 *   - a full disk (a small tmpfs; root only): an error naming the file, a
 *     non-zero exit, no temporary file left, the previous checkpoint intact. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tests/command.h"

/* A small model: checkpoints of ~1 MB, steps of a few milliseconds. */
#define MODEL                                                                                      \
    "--model.n_layer=2 --model.n_embd=48 --model.n_head=2 --model.block_size=32 "                 \
    "--train.batch_size=4 --train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 "     \
    "--train.log_every=1"
enum { STEPS = 12 };

/* How a run starts: `pipert train`, or `pipert launch` with two stages. */
typedef struct runner {
    const char *command;
    int stages;
} runner;
static const runner TRAIN = {"train --quiet --runtime.threads=2 " MODEL, 1};
static const runner LAUNCH = {"launch --quiet --stages 2 --replicas 1 --runtime.threads=1 "
                              "--pipeline.schedule=1f1b --pipeline.microbatches=2 " MODEL,
                              2};

/* ---- helpers ------------------------------------------------------------------ */

static void path_in(char *path, size_t cap, const char *dir, const char *name)
{
    snprintf(path, cap, "%s/%s", dir, name);
}

/* losses[step − 1] for steps 1..STEPS of DIR/metrics.jsonl; all must be there. */
static void read_losses(const char *dir, double *losses)
{
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", losses, STEPS), STEPS,
                 "%s/metrics.jsonl: not every step has a loss", dir);
}

/* The losses of every step of dir equal the reference's (resume is exact:
 * 7 digits of metrics.jsonl). */
static void expect_same_losses(const char *reference, const char *dir, const char *what)
{
    double expected[STEPS], got[STEPS];
    read_losses(reference, expected);
    read_losses(dir, got);
    for (int step = 1; step <= STEPS; step++)
        cr_expect(fabs(got[step - 1] - expected[step - 1]) <= 1e-6 * fabs(expected[step - 1]),
                  "%s, step %d: resumed loss %.9g, uninterrupted %.9g", what, step, got[step - 1],
                  expected[step - 1]);
}

/* The number of temporary (".tmp.") files in dir. */
static int count_temporaries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static char *copy_dir(const char *dir)
{
    char *copy = make_temp_dir(), command[1200];
    snprintf(command, sizeof command, "cp -r '%s'/. '%s'/", dir, copy);
    cr_assert_eq(system(command), 0, "%s", command);
    return copy;
}

/* What a run said: its stderr (`pipert train`), then, under `pipert
 * launch`, what is left of rank 0's log (logs/rank-0.log) in r->err. */
static void add_rank_0_log(run_result *r, const char *dir)
{
    char path[600], *text;
    size_t size, used = strlen(r->err);
    path_in(path, sizeof path, dir, "logs/rank-0.log");
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return;
    snprintf(r->err + used, sizeof r->err - used, "%s", text);
    free(text);
}

/* The step `--resume` says it resumed from (its info line), or −1. */
static long resumed_step(const char *err)
{
    const char *line = strstr(err, "resumed from the checkpoint of step ");
    return line ? strtol(line + strlen("resumed from the checkpoint of step "), NULL, 10) : -1;
}

/* An uninterrupted run of STEPS steps, checkpointing every `every`. */
static char *reference_run(const runner *how, int every)
{
    char *dir = make_temp_dir();
    run_pipert_ok("%s --out %s --train.steps=%d --train.checkpoint_every=%d "
                  "--train.keep_checkpoints=0",
                  how->command, dir, STEPS, every);
    return dir;
}

/* `--resume` in dir to STEPS, with its info lines. */
static run_result resume(const runner *how, const char *dir, int every)
{
    run_result r = run_pipert_with("PIPERT_LOG=info",
                                   "%s --resume --out %s --train.steps=%d "
                                   "--train.checkpoint_every=%d --train.keep_checkpoints=2",
                                   how->command, dir, STEPS, every);
    add_rank_0_log(&r, dir);
    return r;
}

/* ---- killed while writing ------------------------------------------------------- */

/* Starts a run in dir (checkpoints every step) as a child; its pid. */
static pid_t start_training(const runner *how, const char *dir)
{
    char command[4096];
    snprintf(command, sizeof command,
             "exec %s %s --out %s --train.steps=%d --train.checkpoint_every=1 "
             "--train.keep_checkpoints=2 >/dev/null 2>&1",
             pipert_bin(), how->command, dir, STEPS);
    return start_shell(command);
}

/* Waits, through inotify on dir, for the `nth` temporary file whose name
 * contains `kind` to be created; its name goes to `name`. False if the
 * child exited first. */
static bool wait_for_temporary(int watch, pid_t child, const char *kind, int nth, char *name,
                               size_t cap)
{
    char buffer[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int seen = 0;
    for (;;) {
        struct pollfd ready = {watch, POLLIN, 0};
        if (poll(&ready, 1, 100) <= 0) {
            if (waitpid(child, NULL, WNOHANG) == child) return false;
            continue;
        }
        ssize_t n = read(watch, buffer, sizeof buffer);
        cr_assert_gt(n, 0, "inotify: %s", strerror(errno));
        for (char *p = buffer; p < buffer + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;
            const bool temporary = e->len && !strncmp(e->name, "ckpt-", 5) &&
                                   strstr(e->name, ".tmp.") && strstr(e->name, kind);
            if (temporary && ++seen == nth) {
                snprintf(name, cap, "%s", e->name);
                return true;
            }
            p += sizeof *e + e->len;
        }
    }
}

/* The pid of a temporary file's writer: NAME.tmp.PID. */
static pid_t writer_of(const char *temporary)
{
    return (pid_t)strtol(strstr(temporary, ".tmp.") + strlen(".tmp."), NULL, 10);
}

/* A kill while a checkpoint was being written. */
typedef struct kill_outcome {
    long step;           /* of the checkpoint being written */
    bool caught_writing; /* the temporary file was still there after the kill */
} kill_outcome;

/* Kills the writer of a run's `nth` temporary checkpoint file of `kind`
 * (".safetensors" or ".json") with SIGKILL when the file appears. */
static kill_outcome kill_while_writing(const runner *how, const char *dir, const char *kind,
                                       int nth)
{
    int watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    cr_assert_geq(watch, 0, "inotify_init1: %s", strerror(errno));
    cr_assert_geq(inotify_add_watch(watch, dir, IN_CREATE), 0);
    pid_t child = start_training(how, dir);
    char name[256], path[600];
    const bool appeared = wait_for_temporary(watch, child, kind, nth, name, sizeof name);
    if (appeared) kill(writer_of(name), SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    close(watch);
    cr_assert(appeared, "the run ended before its temporary file %d of %s", nth, kind);
    cr_assert(!WIFEXITED(status) || WEXITSTATUS(status) != 0, "the run survived the kill");
    path_in(path, sizeof path, dir, name);
    return (kill_outcome){strtol(name + strlen("ckpt-"), NULL, 10), access(path, F_OK) == 0};
}

/* Six kills, at a random stage file's or index's temporary file: each time
 * --resume succeeds from the checkpoint before (or, when the index was in
 * place before the kill, of) the step being written, with the uninterrupted
 * run's losses, and leaves no temporary file. */
static void check_kills(const runner *how)
{
    char *reference = reference_run(how, 1);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int caught_writing = 0;
    for (int round = 0; round < 6; round++) {
        const char *kind = round % 3 == 2 ? ".json" : ".safetensors";
        /* Not a file of the first checkpoint: there would be nothing to resume. */
        const int files = kind[1] == 's' ? how->stages : 1, nth = files + 1 + rand() % (7 * files);
        char *dir = make_temp_dir(), what[200];
        const kill_outcome killed = kill_while_writing(how, dir, kind, nth);
        caught_writing += killed.caught_writing;
        snprintf(what, sizeof what, "%s: killed writing the %s of step %ld", how->command, kind,
                 killed.step);
        run_result r = resume(how, dir, 1);
        cr_assert_eq(r.status, 0, "%s: --resume failed:\n%s", what, r.err);
        const long from = resumed_step(r.err);
        cr_expect(from == killed.step - 1 || from == killed.step, "%s: resumed from step %ld",
                  what, from);
        expect_same_losses(reference, dir, what);
        cr_expect_eq(count_temporaries(dir), 0, "%s: temporary files left in %s", what, dir);
        remove_dir(dir);
    }
    /* The stage files take milliseconds to write: most kills land inside. */
    cr_log_info("%d of 6 kills landed while the file was being written (%.6s)", caught_writing,
                how->command);
    cr_expect_gt(caught_writing, 0, "no kill landed while a file was being written");
    remove_dir(reference);
}

Test(ckpt_faults, killed_while_writing_a_checkpoint_resumes_from_a_complete_one, .timeout = 600)
{
    check_kills(&TRAIN);
}

Test(ckpt_faults, a_worker_killed_while_writing_a_checkpoint_resumes_from_a_complete_one,
     .timeout = 600)
{
    check_kills(&LAUNCH);
}

/* ---- damaged checkpoints ------------------------------------------------------------- */

static void truncate_by(const char *dir, const char *name, size_t cut)
{
    char path[600], *bytes;
    size_t size;
    path_in(path, sizeof path, dir, name);
    cr_assert_eq(pt_read_file(path, &bytes, &size), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_write_file_atomic(path, bytes, size - cut), PIPERT_OK);
    free(bytes);
}

/* Overwrites the first n bytes of a file, keeping its size. */
static void overwrite_bytes(const char *dir, const char *name, const char *bytes, size_t n)
{
    char path[600];
    path_in(path, sizeof path, dir, name);
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0, "%s", path);
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

static void overwrite_start(const char *dir, const char *name, const char *text)
{
    overwrite_bytes(dir, name, text, strlen(text));
}

static void remove_file(const char *dir, const char *name)
{
    char path[600];
    path_in(path, sizeof path, dir, name);
    cr_assert_eq(unlink(path), 0, "%s", path);
}

/* Renames the index of step 8 and its stage file to names with other zero
 * paddings (the index's "file" entry follows). */
static void rename_with_other_padding(const char *dir)
{
    char from[600], to[600];
    path_in(from, sizeof from, dir, "ckpt-00000008-stage-0.safetensors");
    path_in(to, sizeof to, dir, "ckpt-0008-stage-0.safetensors");
    cr_assert_eq(rename(from, to), 0);
    path_in(from, sizeof from, dir, "ckpt-00000008.json");
    json_t *index = json_load_file(from, 0, NULL);
    cr_assert_not_null(index, "%s", from);
    json_object_set_new(json_array_get(json_object_get(index, "files"), 0), "file",
                        json_string("ckpt-0008-stage-0.safetensors"));
    path_in(to, sizeof to, dir, "ckpt-000008.json");
    cr_assert_eq(json_dump_file(index, to, 0), 0);
    json_decref(index);
    cr_assert_eq(unlink(from), 0);
}

/* One damage to a copy of the reference's checkpoints (4, 8 and 12): resume
 * names `named` in a warning (unless NULL), resumes from `from`, and then
 * has the uninterrupted losses. */
static void check_damage(const char *reference, void (*damage)(const char *dir), const char *named,
                         long from, const char *what)
{
    char *dir = copy_dir(reference);
    damage(dir);
    run_result r = resume(&TRAIN, dir, 4);
    cr_assert_eq(r.status, 0, "%s: --resume failed:\n%s", what, r.err);
    if (named)
        cr_expect(strstr(r.err, "warn") && strstr(r.err, named),
                  "%s: no warning naming %s:\n%s", what, named, r.err);
    cr_expect_eq(resumed_step(r.err), from, "%s: resumed from step %ld, not %ld:\n%s", what,
                 resumed_step(r.err), from, r.err);
    expect_same_losses(reference, dir, what);
    remove_dir(dir);
}

static void truncated_stage_file(const char *dir)
{
    truncate_by(dir, "ckpt-00000012-stage-0.safetensors", 100);
}

static void bad_header(const char *dir)
{
    overwrite_start(dir, "ckpt-00000012-stage-0.safetensors", "\xff\xff\xff\xff");
}

static void garbled_header_text(const char *dir)
{
    static const char header[] = "\x10\x00\x00\x00\x00\x00\x00\x00{\"x\":";
    overwrite_bytes(dir, "ckpt-00000012-stage-0.safetensors", header, sizeof header - 1);
}

static void unparsable_index(const char *dir) { truncate_by(dir, "ckpt-00000012.json", 40); }

static void wrong_size_in_index(const char *dir)
{
    char path[600];
    path_in(path, sizeof path, dir, "ckpt-00000012.json");
    json_t *index = json_load_file(path, 0, NULL);
    cr_assert_not_null(index);
    json_t *file = json_array_get(json_object_get(index, "files"), 0);
    json_object_set_new(file, "bytes",
                        json_integer(json_integer_value(json_object_get(file, "bytes")) + 8));
    cr_assert_eq(json_dump_file(index, path, 0), 0);
    json_decref(index);
}

static void two_damaged(const char *dir)
{
    remove_file(dir, "ckpt-00000012-stage-0.safetensors");
    overwrite_start(dir, "ckpt-00000008.json", "[");
}

static void other_padding(const char *dir)
{
    remove_file(dir, "ckpt-00000012.json");
    rename_with_other_padding(dir);
}

Test(ckpt_faults, a_damaged_newest_checkpoint_is_passed_by_naming_the_file, .timeout = 600)
{
    char *reference = reference_run(&TRAIN, 4);
    check_damage(reference, truncated_stage_file, "ckpt-00000012-stage-0.safetensors has", 8,
                 "stage file truncated");
    check_damage(reference, bad_header, "ckpt-00000012-stage-0.safetensors: header length", 8,
                 "a bad header length");
    check_damage(reference, garbled_header_text, "ckpt-00000012-stage-0.safetensors", 8,
                 "a garbled header");
    check_damage(reference, unparsable_index, "ckpt-00000012.json", 8, "index unparsable");
    check_damage(reference, wrong_size_in_index, "ckpt-00000012-stage-0.safetensors has", 8,
                 "index lists another size");
    check_damage(reference, two_damaged, "ckpt-00000008.json", 4, "the two newest damaged");
    check_damage(reference, other_padding, NULL, 8, "names with other zero paddings");
    remove_dir(reference);
}

/* A resumed run rewrote the stage file of step 12 and died before the index:
 * the same step, size, stage and blocks, but another write than the old
 * index lists. */
static const char *rewriting_run;
static void rewritten_under_the_old_index(const char *dir)
{
    char command[1400];
    snprintf(command, sizeof command, "cp '%s'/ckpt-00000012-stage-0.safetensors '%s'/",
             rewriting_run, dir);
    cr_assert_eq(system(command), 0, "%s", command);
}

Test(ckpt_faults, a_file_rewritten_under_an_old_index_is_not_used, .timeout = 300)
{
    char *reference = reference_run(&TRAIN, 4), *other = reference_run(&TRAIN, 4);
    rewriting_run = other;
    check_damage(reference, rewritten_under_the_old_index,
                 "ckpt-00000012-stage-0.safetensors: is not the file the index of step 12 lists", 8,
                 "a stage file of another write");
    remove_dir(other);
    remove_dir(reference);
}

static void break_every_index(const char *dir)
{
    const char *names[] = {"ckpt-00000004.json", "ckpt-00000008.json", "ckpt-00000012.json"};
    for (int i = 0; i < 3; i++) overwrite_start(dir, names[i], "]");
}

Test(ckpt_faults, no_usable_checkpoint_is_an_error_naming_the_directory, .timeout = 300)
{
    char *reference = reference_run(&TRAIN, 4), *dir = copy_dir(reference);
    break_every_index(dir);
    run_result r = resume(&TRAIN, dir, 4);
    cr_expect_neq(r.status, 0, "resumed from nothing");
    char expected[600];
    snprintf(expected, sizeof expected, "%s: no complete checkpoint to resume from", dir);
    cr_expect(strstr(r.err, expected) && strstr(r.err, "ckpt-00000012.json"), "stderr: %s", r.err);
    remove_dir(dir);
    remove_dir(reference);
}

/* ---- a full disk ------------------------------------------------------------------------ */

enum { PT_NAME_CAP = 64 };
static char mount_point[64];

static void unmount(void)
{
    if (!mount_point[0]) return;
    char command[200];
    snprintf(command, sizeof command, "umount '%s' 2>/dev/null; rmdir '%s'", mount_point,
             mount_point);
    if (system(command) != 0) fprintf(stderr, "cannot unmount %s\n", mount_point);
    mount_point[0] = '\0';
}

/* A tmpfs of `kib` KiB at mount_point. */
static void mount_small_disk(long kib)
{
    snprintf(mount_point, sizeof mount_point, "/tmp/pipert-full-XXXXXX");
    cr_assert_not_null(mkdtemp(mount_point));
    char command[200];
    snprintf(command, sizeof command, "mount -t tmpfs -o size=%ldk tmpfs '%s'", kib, mount_point);
    cr_assert_eq(system(command), 0, "%s", command);
}

static long file_size(const char *dir, const char *name)
{
    char path[600];
    struct stat st;
    path_in(path, sizeof path, dir, name);
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    return (long)st.st_size;
}

/* Room for one checkpoint and half of the next: the checkpoint of step 4
 * fills the disk. The error names a file of it, the run fails, nothing
 * temporary is left, and the checkpoint of step 2 is the uninterrupted
 * run's and resumes. */
static void check_full_disk(const runner *how)
{
    char *reference = reference_run(how, 2), name[PT_NAME_CAP];
    long checkpoint_bytes = 0;
    for (int stage = 0; stage < how->stages; stage++) {
        snprintf(name, sizeof name, "ckpt-00000002-stage-%d.safetensors", stage);
        checkpoint_bytes += file_size(reference, name);
    }
    mount_small_disk((checkpoint_bytes * 3 / 2) / 1024 + 16);
    run_result r = run_pipert("%s --out %s --train.steps=%d --train.checkpoint_every=2 "
                              "--train.keep_checkpoints=1",
                              how->command, mount_point, STEPS);
    cr_expect_neq(r.status, 0, "%s: the run succeeded on a full disk", how->command);
    char expected[600];
    snprintf(expected, sizeof expected, "%s/ckpt-00000004-stage-", mount_point);
    cr_expect(strstr(r.err, expected) && strstr(r.err, ".safetensors: cannot write") &&
                  strstr(r.err, "No space left on device"),
              "%s: stderr: %s", how->command, r.err);
    cr_expect_eq(count_temporaries(mount_point), 0, "temporary files left on the full disk");
    char index[600];
    path_in(index, sizeof index, mount_point, "ckpt-00000004.json");
    cr_expect_neq(access(index, F_OK), 0, "the failed checkpoint has an index");

    for (int stage = 0; stage < how->stages; stage++) {
        snprintf(name, sizeof name, "ckpt-00000002-stage-%d.safetensors", stage);
        expect_same_tensors(reference, mount_point, name, "the checkpoint before the full disk");
    }
    char *copy = copy_dir(mount_point);
    unmount();
    run_result resumed = resume(how, copy, 2);
    cr_expect_eq(resumed.status, 0, "--resume after the full disk failed:\n%s", resumed.err);
    cr_expect_eq(resumed_step(resumed.err), 2, "%s", resumed.err);
    expect_same_losses(reference, copy, "resumed after the full disk");
    remove_dir(copy);
    remove_dir(reference);
}

Test(ckpt_faults, a_full_disk_is_an_error_naming_the_file_and_keeps_the_last_checkpoint,
     .timeout = 300, .fini = unmount)
{
    if (geteuid() != 0) cr_skip_test("mounting a small tmpfs needs root");
    check_full_disk(&TRAIN);
}

Test(ckpt_faults, a_full_disk_stops_a_launched_job_and_keeps_the_last_checkpoint, .timeout = 300,
     .fini = unmount)
{
    if (geteuid() != 0) cr_skip_test("mounting a small tmpfs needs root");
    check_full_disk(&LAUNCH);
}
