/* `pipert plot` (tools/plot/): the runs are read exactly as written, the
 * pictures are real PNGs of the promised size drawn by gnuplot from real
 * runs, bad run directories are refused by file and line, and a missing or
 * failing gnuplot is named and leaves nothing behind. gnuplot is a
 * dependency (scripts/deps.sh): without it the picture tests fail. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/command.h"
#include "tools/plot/gnuplot.h"
#include "tools/plot/runs.h"

#define SMALL_MODEL "--model.n_layer=1 --model.n_embd=64 --model.n_head=1 --runtime.threads=1"

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(pt_write_file_atomic(path, text, strlen(text)), PIPERT_OK);
}

Test(plot, a_run_is_read_as_written)
{
    char *dir = make_temp_dir();
    write_text(dir, "metrics.jsonl",
               "{\"step\":1,\"loss\":5.5,\"tokens\":2048,\"elapsed_s\":0.25}\n"
               "{\"step\":2,\"loss\":5.0,\"tokens\":4096,\"elapsed_s\":0.5}\n"
               "{\"step\":2,\"val_loss\":4.75,\"tokens\":4096,\"elapsed_s\":0.75}\n");
    write_text(dir, "metrics-stage-0.jsonl",
               "{\"step\":1,\"dp_method\":\"sparse\",\"dp_bytes\":9,\"bytes_wan\":1000}\n"
               "{\"step\":2,\"dp_method\":\"sparse\",\"dp_bytes\":9,\"bytes_wan\":3000}\n");
    write_text(dir, "metrics-stage-1.jsonl", "{\"step\":1,\"dp_bytes\":500}\n"); /* older: dp_bytes */
    pt_plot_run run;
    cr_assert_eq(pt_plot_read_run(dir, &run), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(run.n_train, 2);
    cr_assert_eq(run.n_val, 1);
    cr_expect(run.train[0].tokens == 2048 && run.train[0].seconds == 0.25 && run.train[0].loss == 5.5);
    cr_expect(run.train[1].tokens == 4096 && run.train[1].seconds == 0.5 && run.train[1].loss == 5.0);
    cr_expect(run.val[0].tokens == 4096 && run.val[0].seconds == 0.75 && run.val[0].loss == 4.75);
    cr_expect_eq(run.wan_bytes_per_step, 2000 + 500, "stage means summed: %g", run.wan_bytes_per_step);
    cr_expect(strstr(run.label, "(sparse)"), "label %s", run.label);
    cr_expect(!run.bytes_sampled, "a line every step");
    pt_plot_free_run(&run);
    remove_dir(dir);
}

Test(plot, bytes_of_runs_logged_every_few_steps_are_marked_sampled)
{
    char *dir = make_temp_dir();
    write_text(dir, "metrics.jsonl", "{\"step\":10,\"loss\":5.5,\"tokens\":1,\"elapsed_s\":1}\n");
    write_text(dir, "metrics-stage-0.jsonl",
               "{\"step\":10,\"dp_method\":\"diloco\",\"bytes_wan\":0}\n"
               "{\"step\":20,\"dp_method\":\"diloco\",\"bytes_wan\":3000}\n");
    pt_plot_run run;
    cr_assert_eq(pt_plot_read_run(dir, &run), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(run.bytes_sampled);
    cr_expect_eq(run.wan_bytes_per_step, 1500, "the mean of the lines: %g", run.wan_bytes_per_step);
    pt_plot_free_run(&run);
    remove_dir(dir);
}

Test(plot, a_resumed_run_counts_its_wall_time_on, .timeout = 120)
{
    char *dir = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " SMALL_MODEL " --train.steps=10 --train.log_every=5", dir);
    run_pipert_ok("train --quiet --out %s --resume " SMALL_MODEL " --train.steps=20 --train.log_every=5",
                  dir);
    pt_plot_run run;
    cr_assert_eq(pt_plot_read_run(dir, &run), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(run.n_train, 4, "steps 5, 10 and, resumed, 15, 20");
    for (size_t i = 1; i < run.n_train; i++)
        cr_expect_gt(run.train[i].seconds, run.train[i - 1].seconds,
                     "line %zu at %g s, the one before at %g s", i, run.train[i].seconds,
                     run.train[i - 1].seconds);
    pt_plot_free_run(&run);
    remove_dir(dir);
}

/* The label of dir read as "dir/" (a shell's completion adds the slash). */
static void expect_label(const char *dir, const char *method)
{
    char with_slash[600], expected[700];
    snprintf(with_slash, sizeof with_slash, "%s/", dir);
    snprintf(expected, sizeof expected, "%s (%s)", strrchr(dir, '/') + 1, method);
    pt_plot_run run;
    cr_assert_eq(pt_plot_read_run(with_slash, &run), PIPERT_OK, "%s", pipert_last_error());
    cr_expect_str_eq(run.label, expected);
    pt_plot_free_run(&run);
}

Test(plot, the_legend_names_the_run_its_method_and_compression)
{
    char *dir = make_temp_dir();
    write_text(dir, "metrics.jsonl", "{\"step\":1,\"loss\":5.5,\"tokens\":1,\"elapsed_s\":1}\n");
    expect_label(dir, "single worker");
    write_text(dir, "metrics-stage-0.jsonl", "{\"step\":1,\"dp_method\":\"diloco\",\"dp_bytes\":0}\n");
    expect_label(dir, "diloco"); /* a run from before dp_compress */
    write_text(dir, "metrics-stage-0.jsonl",
               "{\"step\":1,\"dp_method\":\"allreduce\",\"dp_compress\":\"none\",\"dp_bytes\":0}\n");
    expect_label(dir, "allreduce");
    write_text(dir, "metrics-stage-0.jsonl",
               "{\"step\":1,\"dp_method\":\"sparse\",\"dp_compress\":\"e3m0\",\"dp_bytes\":0}\n");
    expect_label(dir, "sparse, e3m0");
    remove_dir(dir);
}

Test(plot, bad_runs_are_refused_by_file_and_line)
{
    char *dir = make_temp_dir(), expected[700];
    pt_plot_run run;
    cr_expect_eq(pt_plot_read_run(dir, &run), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), "not a run directory"), "%s", pipert_last_error());
    write_text(dir, "metrics.jsonl", "{\"step\":1,\"loss\":5.5,\"tokens\":1,\"elapsed_s\":1}\n{\"step\":2,\n");
    cr_expect_eq(pt_plot_read_run(dir, &run), PIPERT_ERR_FORMAT);
    snprintf(expected, sizeof expected, "%s/metrics.jsonl:2:", dir);
    cr_expect(strstr(pipert_last_error(), expected), "%s", pipert_last_error());
    run_result r = run_pipert("plot --out %s/pictures %s", dir, dir);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, expected), "%s", r.err);
    char pictures[600];
    snprintf(pictures, sizeof pictures, "%s/pictures", dir);
    cr_expect_neq(access(pictures, F_OK), 0, "--out is not made for runs that are refused");
    r = run_pipert("plot %s", dir);
    cr_expect_eq(r.status, 2, "no --out");
    remove_dir(dir);
}

/* A run directory with a few hand-written losses. */
static char *make_small_run(void)
{
    char *dir = make_temp_dir();
    write_text(dir, "metrics.jsonl",
               "{\"step\":1,\"loss\":5.5,\"tokens\":10,\"elapsed_s\":1}\n"
               "{\"step\":2,\"loss\":5.0,\"tokens\":20,\"elapsed_s\":2}\n");
    return dir;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s was not made", dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return entries;
}

Test(plot, without_gnuplot_it_says_what_to_install)
{
    char *run = make_small_run(), *out = make_temp_dir();
    run_result r = run_pipert_with("PATH=/nonexistent", "plot --out %s %s", out, run);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "gnuplot") && strstr(r.err, "scripts/deps.sh"), "%s", r.err);
    cr_expect_eq(count_entries(out), 0, "nothing written");
    remove_dir(run);
    remove_dir(out);
}

Test(plot, a_failing_gnuplot_leaves_no_pictures)
{
    char *run = make_small_run(), *out = make_temp_dir(), *bin = make_temp_dir();
    /* the real gnuplot draws everything, then the wrapper fails */
    write_text(bin, "gnuplot", "#!/bin/sh\nPATH=/usr/local/bin:/usr/bin:/bin gnuplot \"$@\"\n"
                               "echo 'drawn, then broken' >&2\nexit 3\n");
    char path[600], env[700];
    snprintf(path, sizeof path, "%s/gnuplot", bin);
    cr_assert_eq(chmod(path, 0755), 0);
    snprintf(env, sizeof env, "PATH=%s:/usr/bin:/bin", bin);
    run_result r = run_pipert_with(env, "plot --out %s %s", out, run);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "exit 3") && strstr(r.err, "drawn, then broken"), "%s", r.err);
    cr_expect_eq(count_entries(out), 0, "no picture and no temporary file is left");
    remove_dir(run);
    remove_dir(out);
    remove_dir(bin);
}

/* The PNG signature, then the IHDR chunk: width and height, big-endian. */
static void expect_png(const char *dir, const char *name)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s was not written", path);
    unsigned char head[24];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    cr_assert_eq(n, sizeof head, "%s: too short", path);
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    cr_expect_eq(memcmp(head, signature, 8), 0, "%s: not a PNG", path);
    cr_expect_eq(memcmp(head + 12, "IHDR", 4), 0, "%s: no IHDR first", path);
    uint32_t width = (uint32_t)head[16] << 24 | head[17] << 16 | head[18] << 8 | head[19];
    uint32_t height = (uint32_t)head[20] << 24 | head[21] << 16 | head[22] << 8 | head[23];
    cr_expect(width == PT_PLOT_WIDTH && height == PT_PLOT_HEIGHT, "%s: %ux%u", path, width, height);
}

Test(plot, two_real_runs_become_three_pictures, .timeout = 120)
{
    char *a = make_temp_dir(), *b = make_temp_dir(), *out = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --sites 2 --out %s --dp.method=sparse "
                  "--dp.compress=e3m0 " SMALL_MODEL " --train.steps=6 --train.val_every=3 "
                  "--train.log_every=2", a);
    run_pipert_ok("train --quiet --out %s " SMALL_MODEL " --train.steps=6 --train.val_every=3", b);
    pt_plot_run run;
    cr_assert_eq(pt_plot_read_run(a, &run), PIPERT_OK, "%s", pipert_last_error());
    cr_expect(strstr(run.label, "(sparse, e3m0)"), "the run records its compression: %s", run.label);
    cr_expect(run.n_train == 3 && run.n_val == 2, "%zu losses, %zu validations", run.n_train, run.n_val);
    pt_plot_free_run(&run);
    run_result r = run_pipert("plot --out %s %s %s", out, a, b);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, a) && strstr(r.err, "--train.log_every=1"),
              "the launch logged every 2 steps: its bytes are noted as sampled: %s", r.err);
    expect_png(out, "loss-tokens.png");
    expect_png(out, "loss-time.png");
    expect_png(out, "bytes-between-sites.png");
    remove_dir(a);
    remove_dir(b);
    remove_dir(out);
}
