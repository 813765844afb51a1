/* The embedding example (examples/embed_mpi.c) as a user runs it: under a
 * real `mpirun -np 4`, 2 stages × 2 replicas bootstrapped through
 * MPI_Allgather and fed by its batch callback. It also writes its token
 * stream as a shard; `pipert launch` of the same job on that shard, with
 * sequential sampling, must print the same loss at every step (1e-5
 * relative) and the same final validation loss, and the loss must fall.
 *
 * EMBED_MPI_BIN (the example) and MPIRUN come from tests/meson.build when
 * MPI was found at configure time; without them the test is skipped. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "tests/command.h"

enum { STEPS = 8 };

/* The job examples/embed_mpi.c configures, as `pipert launch` keys. */
#define EXAMPLE_JOB                                                                                \
    "--model.n_layer=2 --model.n_embd=32 --model.n_head=2 --model.block_size=16 "                 \
    "--train.batch_size=2 --pipeline.microbatches=4 --train.val_batches=2 --train.lr=1e-2 "       \
    "--train.warmup_steps=2 --train.val_every=0 --train.log_every=1 --runtime.threads=1 "         \
    "--pipeline.schedule=1f1b"

/* Open MPI refuses root and more ranks than cores unless told; other MPIs do
 * not know these flags. */
static const char *mpirun_flags(const char *mpirun)
{
    char command[600], version[256] = "";
    snprintf(command, sizeof command, "'%s' --version 2>&1", mpirun);
    FILE *p = popen(command, "r");
    cr_assert_not_null(p, "cannot run %s --version", mpirun);
    size_t n = fread(version, 1, sizeof version - 1, p);
    version[n] = '\0';
    pclose(p);
    if (!strstr(version, "Open MPI")) return "";
    return geteuid() == 0 ? "--oversubscribe --allow-run-as-root" : "--oversubscribe";
}

/* Skips the test unless the example was built and mpirun found. */
static void require_mpi(void)
{
    const char *example = getenv("EMBED_MPI_BIN"), *mpirun = getenv("MPIRUN");
    if (!example || !mpirun || access(mpirun, X_OK) != 0 || access(example, X_OK) != 0)
        cr_skip_test("MPI or mpirun was not found when the build was configured: no example");
}

/* Open MPI does not free everything it allocates in MPI_Init (and some of it
 * from components it unloads): under LeakSanitizer (the sanitizer build) the
 * example's leak report is limited to allocations that are not MPI's. Full
 * stacks (fast_unwind_on_malloc=0) let the suppressions see the MPI frames. */
static const char mpi_leaks[] = "leak:libmpi.so\n"
                                "leak:libopen-pal.so\n"
                                "leak:libopen-rte.so\n"
                                "leak:mca_\n"
                                "leak:libpmix.so\n"
                                "leak:libhwloc.so\n"
                                "leak:libevent\n";

/* Runs the example for STEPS steps under mpirun in DIR (DIR/mpi.out holds its
 * stdout); it writes its stream to DIR/stream.bin. */
static void run_example(const char *dir)
{
    const char *example = getenv("EMBED_MPI_BIN"), *mpirun = getenv("MPIRUN");
    char command[2048], supp_path[512], err_path[512], err[8192] = "";
    snprintf(supp_path, sizeof supp_path, "%s/mpi-leaks.supp", dir);
    cr_assert_eq(pt_write_file_atomic(supp_path, mpi_leaks, strlen(mpi_leaks)), PIPERT_OK, "%s",
                 pipert_last_error());
    snprintf(err_path, sizeof err_path, "%s/mpi.err", dir);
    snprintf(command, sizeof command,
             "ASAN_OPTIONS=\"$ASAN_OPTIONS:fast_unwind_on_malloc=0\" "
             "LSAN_OPTIONS=\"$LSAN_OPTIONS:suppressions=%s:print_suppressions=0\" "
             "'%s' %s -np 4 '%s' --steps %d --out '%s/mpi' --write-shard '%s/stream.bin' "
             ">'%s/mpi.out' 2>'%s'",
             supp_path, mpirun, mpirun_flags(mpirun), example, STEPS, dir, dir, dir, err_path);
    int status = system(command);
    FILE *f = status != 0 ? fopen(err_path, "r") : NULL;
    if (f) {
        err[fread(err, 1, sizeof err - 1, f)] = '\0';
        fclose(f);
    }
    cr_assert_eq(status, 0, "%s\nfailed (%d):\n%s", command, status, err);
}

/* "step N loss X" and "val_loss X" from the example's stdout: the steps found. */
static int read_example_losses(const char *dir, double loss[STEPS], double *val_loss)
{
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/mpi.out", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s: cannot open", path);
    int found = 0;
    *val_loss = NAN;
    while (fgets(line, sizeof line, f)) {
        long step;
        double value;
        if (sscanf(line, "step %ld loss %lf", &step, &value) == 2 && step >= 1 && step <= STEPS) {
            loss[step - 1] = value;
            found++;
        }
        if (sscanf(line, "val_loss %lf", &value) == 1) *val_loss = value;
    }
    fclose(f);
    return found;
}

/* Each step's "loss" and the last "val_loss" from DIR/launch/metrics.jsonl: the steps found. */
static int read_launch_losses(const char *dir, double loss[STEPS], double *val_loss)
{
    char path[512], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/launch/metrics.jsonl", dir);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    int found = 0;
    *val_loss = NAN;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert_not_null(o, "%s: not JSON: %s", path, line);
        const long step = (long)json_integer_value(json_object_get(o, "step"));
        json_t *value = json_object_get(o, "loss"), *val = json_object_get(o, "val_loss");
        if (value && step >= 1 && step <= STEPS) {
            loss[step - 1] = json_number_value(value);
            found++;
        }
        if (val) *val_loss = json_number_value(val);
        json_decref(o);
    }
    free(text);
    return found;
}

static bool close_to(double got, double expected)
{
    return fabs(got - expected) <= 1e-5 * fabs(expected);
}

Test(embed, mpi_example_trains_like_pipert_launch_on_its_stream)
{
    require_mpi();
    char *dir = make_temp_dir();
    run_example(dir);
    double example[STEPS], launched[STEPS], example_val, launched_val;
    cr_assert_eq(read_example_losses(dir, example, &example_val), STEPS,
                 "%s/mpi.out: not one \"step N loss X\" line per step", dir);

    run_result r = run_pipert("launch --quiet --stages 2 --replicas 2 --out %s/launch "
                              "--data.path=%s/stream.bin --data.sampling=sequential "
                              "--data.val_fraction=0.1 --train.steps=%d " EXAMPLE_JOB,
                              dir, dir, STEPS);
    cr_assert_eq(r.status, 0, "pipert launch failed (%d):\n%s", r.status, r.err);
    cr_assert_eq(read_launch_losses(dir, launched, &launched_val), STEPS,
                 "%s/launch/metrics.jsonl: not one loss per step", dir);

    for (int i = 0; i < STEPS; i++)
        cr_expect(close_to(example[i], launched[i]), "step %d: the MPI example's loss %.6f, "
                  "pipert launch's %.6f", i + 1, example[i], launched[i]);
    cr_expect(close_to(example_val, launched_val),
              "validation loss: the MPI example's %.6f, pipert launch's %.6f", example_val,
              launched_val);

    /* Equal because both trained, not because nothing happened: the steps
     * saw different data, and the model learned the stream. */
    bool all_equal = true;
    for (int i = 1; i < STEPS; i++) all_equal &= example[i] == example[0];
    cr_expect(!all_equal, "every step printed the same loss %.6f", example[0]);
    cr_expect_lt(example[STEPS - 1], example[0] - 0.3, "the loss did not fall: %.6f -> %.6f",
                 example[0], example[STEPS - 1]);
    remove_dir(dir);
}
