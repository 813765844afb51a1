/* The span recorder and the merge: spans with known times on a fake clock are
 * written by two ranks, merged, and read back with jansson; every field is
 * checked against the values recorded, and the bubble fraction against a hand
 * computation. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/fileio.h"
#include "runtime/trace.h"

/* ---- helpers --------------------------------------------------------------- */

static double fake_now_us;
static double fake_clock(void) { return fake_now_us; }

static char *make_temp_dir(void)
{
    char *dir = strdup("/tmp/pipert-test-trace-XXXXXX");
    cr_assert(dir && mkdtemp(dir), "mkdtemp failed");
    return dir;
}

static char *path_in(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    cr_assert(path);
    snprintf(path, n, "%s/%s", dir, name);
    return path;
}

/* The number of entries of dir other than . and .. */
static int count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert(d, "%s: cannot open", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void remove_dir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *path = path_in(dir, e->d_name);
            unlink(path);
            free(path);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static json_t *load_json(const char *path)
{
    json_error_t error;
    json_t *root = json_load_file(path, 0, &error);
    cr_assert(root, "%s:%d:%d: %s", path, error.line, error.column, error.text);
    return root;
}

static long integer_at(const json_t *object, const char *key)
{
    const json_t *v = json_object_get(object, key);
    cr_assert(json_is_integer(v), "'%s' is missing or not an integer", key);
    return (long)json_integer_value(v);
}

static double number_at(const json_t *object, const char *key)
{
    const json_t *v = json_object_get(object, key);
    cr_assert(json_is_number(v), "'%s' is missing or not a number", key);
    return json_number_value(v);
}

static const char *string_at(const json_t *object, const char *key)
{
    const char *s = json_string_value(json_object_get(object, key));
    cr_assert(s, "'%s' is missing or not a string", key);
    return s;
}

/* The "X" event of pid at ts with category cat, or NULL. */
static json_t *find_span(json_t *events, long pid, const char *cat, double ts)
{
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(string_at(e, "ph"), "X")) continue;
        if (integer_at(e, "pid") == pid && !strcmp(string_at(e, "cat"), cat) &&
            number_at(e, "ts") == ts)
            return e;
    }
    return NULL;
}

/* args.name of the "M" event `name` for (pid, tid), or NULL. */
static const char *metadata_name(json_t *events, const char *name, long pid, long tid)
{
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(string_at(e, "ph"), "M") || strcmp(string_at(e, "name"), name)) continue;
        if (integer_at(e, "pid") == pid && integer_at(e, "tid") == tid)
            return string_at(json_object_get(e, "args"), "name");
    }
    return NULL;
}

static size_t count_phase(json_t *events, const char *phase)
{
    size_t i, n = 0;
    json_t *e;
    json_array_foreach(events, i, e) n += !strcmp(string_at(e, "ph"), phase);
    return n;
}

/* ---- the two-rank run, by hand ---------------------------------------------- */

typedef struct expected_span {
    int rank;
    const char *category;
    double start, end;
    long microbatch, step, version;
    int row; /* tid: 1 compute, 2 idle, 3 send, 4 recv, 5 allreduce, 6 other */
} expected_span;

/* Times in µs. Rank 0 is stage 0, rank 1 stage 1, both of replica 0; the
 * trace starts at 1000 and is written at 1100. Listed out of time order, so
 * the files must sort them. */
static const expected_span run_spans[] = {
    {0, "forward", 1000, 1010, 0, 7, 3, 1},
    {0, "send", 1010, 1012, 0, 7, -1, 3},
    {0, "backward", 1030, 1050, 1, 7, 3, 1},
    {0, "forward", 1012, 1022, 1, 7, 3, 1},
    {0, "idle", 1022, 1030, -1, 7, -1, 2},
    {0, "backward", 1050, 1070, 0, 7, 3, 1},
    {0, "optimizer", 1070, 1075, -1, 7, 4, 1},
    {0, "allreduce", 1075, 1090, -1, 7, -1, 5},
    {1, "recv", 1000, 1012, 0, 7, -1, 4},
    {1, "forward", 1012, 1022, 0, 7, 3, 1},
    {1, "backward", 1022, 1042, 0, 7, 3, 1},
    {1, "eval", 1042, 1050, -1, 7, -1, 1},
    {1, "idle", 1050, 1100, -1, -1, -1, 2},
};
#define N_RUN_SPANS (sizeof run_spans / sizeof run_spans[0])

/* Busy = forward + backward + optimizer, by hand:
 *   rank 0: 10 + 10 + 20 + 20 + 5 = 65 of 100 µs → bubble 0.35
 *   rank 1: 10 + 20 = 30 of 100 µs (eval and idle are not busy) → bubble 0.70 */
static const double run_busy_us[2] = {65.0, 30.0};
static const double run_bubble[2] = {0.35, 0.70};

static void record_run(pt_trace *traces[2])
{
    fake_now_us = 1000.0;
    cr_assert_eq(pt_trace_create(&traces[0], 0, 0, 0, 64), PIPERT_OK, "%s", pipert_last_error());
    cr_assert_eq(pt_trace_create(&traces[1], 1, 1, 0, 64), PIPERT_OK, "%s", pipert_last_error());
    for (int r = 0; r < 2; r++) pt_trace_set_clock(traces[r], fake_clock);
    for (size_t i = 0; i < N_RUN_SPANS; i++) {
        const expected_span *s = &run_spans[i];
        pt_trace_span(traces[s->rank], s->category, s->start, s->end, s->microbatch, s->step,
                      s->version);
    }
    fake_now_us = 1100.0;
}

/* One span as read back: its pid, ts, dur, tid, name and args. */
static void check_span(json_t *events, const expected_span *s)
{
    json_t *e = find_span(events, s->rank, s->category, s->start);
    cr_assert(e, "rank %d: no %s span at ts %.0f", s->rank, s->category, s->start);
    cr_expect_float_eq(number_at(e, "dur"), s->end - s->start, 1e-9, "rank %d %s at %.0f: dur",
                       s->rank, s->category, s->start);
    cr_expect_eq(integer_at(e, "tid"), s->row, "rank %d %s at %.0f: tid %ld, expected %d",
                 s->rank, s->category, s->start, integer_at(e, "tid"), s->row);
    char name[64];
    if (s->microbatch >= 0) snprintf(name, sizeof name, "%s %ld", s->category, s->microbatch);
    else snprintf(name, sizeof name, "%s", s->category);
    cr_expect_str_eq(string_at(e, "name"), name);

    json_t *args = json_object_get(e, "args");
    cr_assert(json_is_object(args), "rank %d %s: no args", s->rank, s->category);
    const char *keys[3] = {"microbatch", "step", "version"};
    long values[3] = {s->microbatch, s->step, s->version};
    for (int k = 0; k < 3; k++) {
        json_t *v = json_object_get(args, keys[k]);
        if (values[k] < 0)
            cr_expect(v == NULL, "rank %d %s at %.0f: args.%s present for −1", s->rank,
                      s->category, s->start, keys[k]);
        else
            cr_expect(json_is_integer(v) && json_integer_value(v) == values[k],
                      "rank %d %s at %.0f: args.%s, expected %ld", s->rank, s->category,
                      s->start, keys[k], values[k]);
    }
}

static void check_sorted_per_rank(json_t *events)
{
    double last_ts[2] = {-INFINITY, -INFINITY};
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(string_at(e, "ph"), "X")) continue;
        long pid = integer_at(e, "pid");
        cr_assert(pid == 0 || pid == 1, "traceEvents[%zu]: pid %ld", i, pid);
        double ts = number_at(e, "ts");
        cr_expect(ts >= last_ts[pid], "rank %ld: span at %.0f after one at %.0f", pid, ts,
                  last_ts[pid]);
        last_ts[pid] = ts;
    }
}

Test(trace, bubble_fraction_is_hand_computed)
{
    pt_trace *traces[2];
    record_run(traces);
    for (int r = 0; r < 2; r++) {
        cr_expect_float_eq(pt_trace_bubble_fraction(traces[r]), run_bubble[r], 1e-12,
                           "rank %d: bubble %.15f, expected %.2f", r,
                           pt_trace_bubble_fraction(traces[r]), run_bubble[r]);
        cr_expect_eq(pt_trace_dropped_count(traces[r]), 0);
    }
    cr_expect_eq(pt_trace_event_count(traces[0]) + pt_trace_event_count(traces[1]), N_RUN_SPANS);
    fake_now_us = 1200.0; /* elapsed 200 µs, busy unchanged: 1 − 65/200 */
    cr_expect_float_eq(pt_trace_bubble_fraction(traces[0]), 1.0 - 65.0 / 200.0, 1e-12);
    pt_trace_free(traces[0]);
    pt_trace_free(traces[1]);
}

Test(trace, rank_file_holds_every_span_and_accounting)
{
    char *dir = make_temp_dir();
    pt_trace *traces[2];
    record_run(traces);
    cr_assert_eq(pt_trace_write_rank_file(traces[0], dir), PIPERT_OK, "%s", pipert_last_error());
    char *path = path_in(dir, "trace-rank-0.json");
    json_t *root = load_json(path);
    json_t *events = json_object_get(root, "traceEvents");
    cr_assert(json_is_array(events));
    cr_expect_str_eq(string_at(root, "displayTimeUnit"), "ms");
    for (size_t i = 0; i < N_RUN_SPANS; i++)
        if (run_spans[i].rank == 0) check_span(events, &run_spans[i]);
    cr_expect_eq(count_phase(events, "X"), 8, "rank 0 recorded 8 spans");
    check_sorted_per_rank(events);
    cr_expect_str_eq(metadata_name(events, "process_name", 0, 0), "rank 0 (stage 0, replica 0)");

    json_t *other = json_object_get(root, "otherData");
    cr_expect_eq(integer_at(other, "rank"), 0);
    cr_expect_eq(integer_at(other, "stage"), 0);
    cr_expect_eq(integer_at(other, "replica"), 0);
    cr_expect_eq(integer_at(other, "events"), 8);
    cr_expect_eq(integer_at(other, "dropped_events"), 0);
    cr_expect_float_eq(number_at(other, "busy_us"), 65.0, 1e-9);
    cr_expect_float_eq(number_at(other, "elapsed_us"), 100.0, 1e-9);
    cr_expect_float_eq(number_at(other, "bubble_fraction"), 0.35, 1e-6);
    json_decref(root);
    free(path);
    pt_trace_free(traces[0]);
    pt_trace_free(traces[1]);
    remove_dir(dir);
}

Test(trace, merge_of_two_ranks)
{
    char *dir = make_temp_dir();
    pt_trace *traces[2];
    record_run(traces);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(pt_trace_write_rank_file(traces[r], dir), PIPERT_OK, "%s",
                     pipert_last_error());
    char *merged = path_in(dir, "trace.json");
    pt_trace_rank_summary *summaries;
    int ranks = 0;
    cr_assert_eq(pt_trace_merge_summarize(dir, merged, &summaries, &ranks), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_assert_eq(ranks, 2);

    json_t *root = load_json(merged);
    json_t *events = json_object_get(root, "traceEvents");
    cr_assert(json_is_array(events), "merged: no traceEvents array");
    for (size_t i = 0; i < N_RUN_SPANS; i++) check_span(events, &run_spans[i]);
    cr_expect_eq(count_phase(events, "X"), N_RUN_SPANS, "merged: %zu spans, expected %zu",
                 count_phase(events, "X"), N_RUN_SPANS);
    check_sorted_per_rank(events);

    /* one process row per rank, one thread row per category group in use */
    cr_expect_str_eq(metadata_name(events, "process_name", 0, 0), "rank 0 (stage 0, replica 0)");
    cr_expect_str_eq(metadata_name(events, "process_name", 1, 0), "rank 1 (stage 1, replica 0)");
    const char *row_names[] = {NULL, "compute", "idle", "send", "recv", "allreduce"};
    const bool rank0_rows[] = {false, true, true, true, false, true};
    const bool rank1_rows[] = {false, true, true, false, true, false};
    for (int row = 1; row <= 5; row++) {
        const char *name0 = metadata_name(events, "thread_name", 0, row);
        const char *name1 = metadata_name(events, "thread_name", 1, row);
        if (rank0_rows[row])
            cr_expect(name0 && !strcmp(name0, row_names[row]), "rank 0 row %d", row);
        else
            cr_expect(name0 == NULL, "rank 0 names unused row %d", row);
        if (rank1_rows[row])
            cr_expect(name1 && !strcmp(name1, row_names[row]), "rank 1 row %d", row);
        else
            cr_expect(name1 == NULL, "rank 1 names unused row %d", row);
    }
    cr_expect_eq(count_phase(events, "M"), 2 * 2 + 2 * (4 + 3), "metadata events");

    json_t *other = json_object_get(root, "otherData");
    cr_expect_eq(integer_at(other, "ranks_merged"), 2);
    cr_expect_eq(integer_at(other, "dropped_events"), 0);
    json_t *per_rank = json_object_get(other, "ranks");
    cr_assert_eq(json_array_size(per_rank), 2);
    for (int r = 0; r < 2; r++) {
        json_t *data = json_array_get(per_rank, (size_t)r);
        cr_expect_eq(integer_at(data, "rank"), r);
        cr_expect_float_eq(number_at(data, "bubble_fraction"), run_bubble[r], 1e-6);
    }

    /* the summaries: span counts and durations by category, from the table */
    for (int r = 0; r < 2; r++) {
        long spans[PT_TRACE_CATEGORY_COUNT] = {0};
        double span_us[PT_TRACE_CATEGORY_COUNT] = {0};
        for (size_t i = 0; i < N_RUN_SPANS; i++) {
            if (run_spans[i].rank != r) continue;
            for (int c = 0; c < PT_TRACE_CATEGORY_COUNT; c++)
                if (!strcmp(run_spans[i].category, pt_trace_category_name((pt_trace_category)c))) {
                    spans[c]++;
                    span_us[c] += run_spans[i].end - run_spans[i].start;
                }
        }
        const pt_trace_rank_summary *s = &summaries[r];
        cr_expect_eq(s->rank, r);
        cr_expect_eq(s->stage, r);
        cr_expect_eq(s->replica, 0);
        for (int c = 0; c < PT_TRACE_CATEGORY_COUNT; c++) {
            cr_expect_eq(s->spans[c], spans[c], "rank %d: %ld %s spans, expected %ld", r,
                         s->spans[c], pt_trace_category_name((pt_trace_category)c), spans[c]);
            cr_expect_float_eq(s->span_us[c], span_us[c], 1e-9, "rank %d: %s time", r,
                               pt_trace_category_name((pt_trace_category)c));
        }
        cr_expect_float_eq(s->busy_us, run_busy_us[r], 1e-9, "rank %d busy", r);
        cr_expect_float_eq(s->elapsed_us, 100.0, 1e-9, "rank %d elapsed", r);
        cr_expect_float_eq(s->bubble_fraction, run_bubble[r], 1e-6, "rank %d bubble", r);
    }
    free(summaries);
    json_decref(root);
    free(merged);
    pt_trace_free(traces[0]);
    pt_trace_free(traces[1]);
    remove_dir(dir);
}

/* ---- limits and failures ------------------------------------------------------ */

Test(trace, full_buffer_counts_drops)
{
    char *dir = make_temp_dir();
    pt_trace *t;
    fake_now_us = 0.0;
    cr_assert_eq(pt_trace_create(&t, 0, 0, 0, 3), PIPERT_OK);
    pt_trace_set_clock(t, fake_clock);
    for (int i = 0; i < 5; i++) pt_trace_span(t, "forward", 10.0 * i, 10.0 * i + 10.0, i, 0, -1);
    fake_now_us = 100.0;
    cr_expect_eq(pt_trace_event_count(t), 3);
    cr_expect_eq(pt_trace_dropped_count(t), 2);
    /* dropped spans still count as busy: 50 of 100 µs */
    cr_expect_float_eq(pt_trace_bubble_fraction(t), 0.5, 1e-12);

    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK, "%s", pipert_last_error());
    char *path = path_in(dir, "trace-rank-0.json");
    json_t *root = load_json(path);
    json_t *events = json_object_get(root, "traceEvents");
    cr_expect_eq(count_phase(events, "X"), 3);
    for (int i = 0; i < 5; i++) /* the first three are kept, the rest dropped */
        cr_expect((find_span(events, 0, "forward", 10.0 * i) != NULL) == (i < 3),
                  "span %d (ts %d) %s", i, 10 * i, i < 3 ? "missing" : "kept though dropped");
    cr_expect_eq(integer_at(json_object_get(root, "otherData"), "dropped_events"), 2);
    cr_expect_eq(integer_at(json_object_get(root, "otherData"), "events"), 3);
    json_decref(root);

    char *merged = path_in(dir, "trace.json");
    cr_assert_eq(pt_trace_merge(dir, merged, NULL), PIPERT_OK, "%s", pipert_last_error());
    root = load_json(merged);
    cr_expect_eq(integer_at(json_object_get(root, "otherData"), "dropped_events"), 2);
    json_decref(root);
    free(merged);
    free(path);
    pt_trace_free(t);
    remove_dir(dir);
}

Test(trace, invalid_spans_are_refused_and_counted)
{
    char *dir = make_temp_dir();
    pt_trace *t;
    fake_now_us = 0.0;
    cr_assert_eq(pt_trace_create(&t, 2, 0, 2, 8), PIPERT_OK);
    pt_trace_set_clock(t, fake_clock);
    pt_trace_span(t, "forward", 20.0, 10.0, 0, 0, 0);     /* ends before it starts */
    pt_trace_span(t, "backward", NAN, 10.0, 0, 0, 0);
    pt_trace_span(t, "backward", 0.0, INFINITY, 0, 0, 0);
    pt_trace_span(t, NULL, 0.0, 1.0, 0, 0, 0);
    pt_trace_span(t, "forward", 0.0, 0.0, 0, 0, 0);       /* empty but valid */
    fake_now_us = 10.0;
    cr_expect_eq(pt_trace_event_count(t), 1);
    cr_expect_float_eq(pt_trace_bubble_fraction(t), 1.0, 1e-12);
    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK, "%s", pipert_last_error());
    char *path = path_in(dir, "trace-rank-2.json");
    json_t *root = load_json(path);
    cr_expect_eq(integer_at(json_object_get(root, "otherData"), "invalid_spans"), 4);
    json_decref(root);
    free(path);
    pt_trace_free(t);
    remove_dir(dir);
}

/* A name outside the list is kept (truncated to 15 characters) on the "other"
 * row, and quotes and backslashes in it are escaped. */
Test(trace, other_category_is_escaped)
{
    char *dir = make_temp_dir();
    pt_trace *t;
    cr_assert_eq(pt_trace_create(&t, 0, 0, 0, 8), PIPERT_OK);
    pt_trace_span(t, "ck\"pt\\save-and-more", 5.0, 6.0, -1, 3, -1);
    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK, "%s", pipert_last_error());
    char *merged = path_in(dir, "trace.json");
    pt_trace_rank_summary *summaries;
    cr_assert_eq(pt_trace_merge_summarize(dir, merged, &summaries, NULL), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_expect_eq(summaries[0].spans[PT_TRACE_OTHER], 1);
    json_t *root = load_json(merged);
    json_t *events = json_object_get(root, "traceEvents");
    json_t *e = find_span(events, 0, "ck\"pt\\save-and-", 5.0);
    cr_assert(e, "the span named ck\"pt\\save-and- is missing");
    cr_expect_eq(integer_at(e, "tid"), 6);
    cr_expect_str_eq(metadata_name(events, "thread_name", 0, 6), "other");
    json_decref(root);
    free(summaries);
    free(merged);
    pt_trace_free(t);
    remove_dir(dir);
}

Test(trace, null_trace_is_a_no_op)
{
    char *dir = make_temp_dir();
    pt_trace_span(NULL, "forward", 0.0, 1.0, 0, 0, 0);
    cr_expect_eq(pt_trace_bubble_fraction(NULL), 0.0);
    cr_expect_eq(pt_trace_event_count(NULL), 0);
    cr_expect_eq(pt_trace_write_rank_file(NULL, dir), PIPERT_OK);
    char *path = path_in(dir, "x.json");
    cr_expect_eq(pt_trace_write(NULL, path), PIPERT_OK);
    cr_expect_eq(count_dir_entries(dir), 0, "a NULL trace wrote a file");
    pt_trace_free(NULL);
    free(path);
    remove_dir(dir);
}

Test(trace, create_rejects_bad_arguments)
{
    pt_trace *t;
    cr_expect_eq(pt_trace_create(&t, 0, 0, 0, 0), PIPERT_ERR_INVALID_ARG);
    cr_expect(strstr(pipert_last_error(), "max_events"), "message: %s", pipert_last_error());
    cr_expect_eq(pt_trace_create(&t, -1, 0, 0, 4), PIPERT_ERR_INVALID_ARG);
    cr_expect_null(t);
}

Test(trace, merge_of_an_empty_dir_names_it)
{
    char *dir = make_temp_dir();
    char *merged = path_in(dir, "trace.json");
    int ranks = -1;
    cr_expect_eq(pt_trace_merge(dir, merged, &ranks), PIPERT_ERR_NOT_FOUND);
    cr_expect(strstr(pipert_last_error(), dir), "message does not name %s: %s", dir,
              pipert_last_error());
    cr_expect_eq(ranks, 0);
    cr_expect_eq(count_dir_entries(dir), 0, "a failed merge left a file");

    char *missing = path_in(dir, "no-such-dir");
    cr_expect_eq(pt_trace_merge(missing, merged, NULL), PIPERT_ERR_IO);
    cr_expect(strstr(pipert_last_error(), missing), "message: %s", pipert_last_error());
    free(missing);
    free(merged);
    remove_dir(dir);
}

/* A corrupt rank file: the error names it, and the previous merged file is
 * left exactly as it was, with no temporary beside it. */
static void expect_merge_refuses(const char *dir, const char *bad_file, const char *contents,
                                 const char *message_part)
{
    char *bad = path_in(dir, bad_file);
    cr_assert_eq(pt_write_file_atomic(bad, contents, strlen(contents)), PIPERT_OK);
    char *merged = path_in(dir, "trace.json");
    static const char old[] = "old merged trace\n";
    cr_assert_eq(pt_write_file_atomic(merged, old, sizeof old - 1), PIPERT_OK);
    int entries = count_dir_entries(dir);

    cr_expect_eq(pt_trace_merge(dir, merged, NULL), PIPERT_ERR_FORMAT, "%s: merged", bad_file);
    cr_expect(strstr(pipert_last_error(), bad), "message does not name %s: %s", bad,
              pipert_last_error());
    cr_expect(strstr(pipert_last_error(), message_part), "message lacks '%s': %s", message_part,
              pipert_last_error());
    char *data;
    size_t size;
    cr_assert_eq(pt_read_file(merged, &data, &size), PIPERT_OK);
    cr_expect_str_eq(data, old, "the old merged trace was overwritten");
    cr_expect_eq(count_dir_entries(dir), entries, "a temporary file was left behind");
    free(data);
    unlink(bad);
    free(merged);
    free(bad);
}

Test(trace, corrupt_rank_file_names_it)
{
    char *dir = make_temp_dir();
    pt_trace *t;
    cr_assert_eq(pt_trace_create(&t, 0, 0, 0, 8), PIPERT_OK);
    pt_trace_span(t, "forward", 1.0, 2.0, 0, 0, 0);
    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK);
    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK); /* rewriting is fine */
    pt_trace_free(t);

    /* a truncated file: rank 0's, cut in half and renamed rank 1 */
    char *good = path_in(dir, "trace-rank-0.json");
    char *data;
    size_t size;
    cr_assert_eq(pt_read_file(good, &data, &size), PIPERT_OK);
    data[size / 2] = '\0';
    expect_merge_refuses(dir, "trace-rank-1.json", data, "trace-rank-1.json:");
    free(data);
    free(good);

    /* pipert's layout, but: otherData missing; a rank that contradicts the
     * file name; a span whose ts is not a number; a file that is JSON but not
     * one event per line */
#define OTHER_DATA(rank)                                                                          \
    "\"otherData\":{\"rank\":" #rank ",\"stage\":0,\"replica\":0,\"dropped_events\":0,"           \
    "\"busy_us\":0,\"elapsed_us\":1,\"bubble_fraction\":1}}\n"
    expect_merge_refuses(dir, "trace-rank-3.json",
                         "{\"traceEvents\":[\n],\n\"displayTimeUnit\":\"ms\"}\n", "otherData");
    expect_merge_refuses(dir, "trace-rank-4.json",
                         "{\"traceEvents\":[\n],\n\"displayTimeUnit\":\"ms\",\n" OTHER_DATA(5),
                         "file name says 4");
    expect_merge_refuses(dir, "trace-rank-5.json",
                         "{\"traceEvents\":[\n{\"ph\":\"X\",\"pid\":5,\"tid\":1,\"ts\":\"soon\","
                         "\"dur\":1,\"cat\":\"forward\"}\n],\n\"displayTimeUnit\":\"ms\",\n"
                         OTHER_DATA(5),
                         "trace-rank-5.json:2: 'ts'");
    expect_merge_refuses(dir, "trace-rank-6.json",
                         "{\"traceEvents\":[\n{\"ph\":\"X\",\"pid\":6,\"tid\":1,\"ts\":1,"
                         "\"dur\":1,\"cat\":\"forward\"},\n{\"ph\":\"X\",\"pid\":6,\"tid\":1\n"
                         "],\n\"displayTimeUnit\":\"ms\",\n" OTHER_DATA(6),
                         "trace-rank-6.json:3:");
    expect_merge_refuses(dir, "trace-rank-7.json",
                         "{\"traceEvents\":[],\"displayTimeUnit\":\"ms\"," OTHER_DATA(7),
                         "trace-rank-7.json:1: not a pipert rank trace");
#undef OTHER_DATA
    remove_dir(dir);
}

/* A rank file in pipert's line layout but written by hand, with keys in
 * another order and spaces (merge's slow path, through jansson), merges like
 * one pipert wrote; its own metadata is replaced by merge's. */
Test(trace, hand_written_rank_file_merges)
{
    char *dir = make_temp_dir();
    char *path = path_in(dir, "trace-rank-3.json"), *merged = path_in(dir, "trace.json");
    static const char text[] =
        "{\"traceEvents\":[\n"
        "{\"ph\": \"X\", \"cat\": \"forward\", \"name\": \"f\", \"pid\": 3, \"tid\": 1, "
        "\"ts\": 10, \"dur\": 5.5, \"args\": {}},\n"
        "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":3,\"tid\":0,\"args\":{\"name\":\"x\"}},\n"
        "{\"name\":\"backward 0\",\"cat\":\"backward\",\"ph\":\"X\",\"ts\":20.000,\"dur\":4.000,"
        "\"pid\":3,\"tid\":1,\"args\":{\"microbatch\":0}}\n"
        "],\n\"displayTimeUnit\":\"ms\",\n"
        "\"otherData\":{\"rank\":3,\"stage\":1,\"replica\":1,\"dropped_events\":0,"
        "\"busy_us\":9.5,\"elapsed_us\":19,\"bubble_fraction\":0.5}}\n";
    cr_assert_eq(pt_write_file_atomic(path, text, sizeof text - 1), PIPERT_OK);
    pt_trace_rank_summary *summaries;
    cr_assert_eq(pt_trace_merge_summarize(dir, merged, &summaries, NULL), PIPERT_OK, "%s",
                 pipert_last_error());
    cr_expect_eq(summaries[0].rank, 3);
    cr_expect_eq(summaries[0].stage, 1);
    cr_expect_eq(summaries[0].replica, 1);
    cr_expect_eq(summaries[0].spans[PT_TRACE_FORWARD], 1);
    cr_expect_eq(summaries[0].spans[PT_TRACE_BACKWARD], 1);
    cr_expect_float_eq(summaries[0].span_us[PT_TRACE_FORWARD], 5.5, 1e-12);
    cr_expect_float_eq(summaries[0].span_us[PT_TRACE_BACKWARD], 4.0, 1e-12);
    cr_expect_float_eq(summaries[0].bubble_fraction, 0.5, 1e-12);
    json_t *root = load_json(merged);
    json_t *events = json_object_get(root, "traceEvents");
    cr_expect(find_span(events, 3, "forward", 10.0), "the forward span is missing");
    cr_expect(find_span(events, 3, "backward", 20.0), "the backward span is missing");
    cr_expect_str_eq(metadata_name(events, "process_name", 3, 0), "rank 3 (stage 1, replica 1)");
    json_decref(root);
    free(summaries);
    free(merged);
    free(path);
    remove_dir(dir);
}

/* A rank file cut anywhere (a worker killed while writing without the atomic
 * rename, a full disk) is refused, naming the file. */
Test(trace, rank_file_cut_anywhere_is_refused)
{
    char *dir = make_temp_dir();
    pt_trace *t;
    cr_assert_eq(pt_trace_create(&t, 0, 0, 0, 8), PIPERT_OK);
    pt_trace_span(t, "forward", 1.0, 2.0, 0, 0, 0);
    pt_trace_span(t, "send", 2.0, 3.0, 0, 0, -1);
    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK);
    pt_trace_free(t);
    char *good = path_in(dir, "trace-rank-0.json"), *merged = path_in(dir, "trace.json");
    char *data;
    size_t size;
    cr_assert_eq(pt_read_file(good, &data, &size), PIPERT_OK);
    cr_assert_eq(pt_trace_merge(dir, merged, NULL), PIPERT_OK, "%s", pipert_last_error());
    for (size_t cut = 0; cut < size - 1; cut += 7) {
        cr_assert_eq(pt_write_file_atomic(good, data, cut), PIPERT_OK);
        cr_expect_neq(pt_trace_merge(dir, merged, NULL), PIPERT_OK, "cut at byte %zu of %zu merged",
                      cut, size);
        cr_expect(strstr(pipert_last_error(), good), "cut at %zu: message: %s", cut,
                  pipert_last_error());
    }
    free(data);
    free(good);
    free(merged);
    remove_dir(dir);
}

/* ---- threads and volume -------------------------------------------------------- */

#define THREADS 4
#define SPANS_PER_THREAD 20000

typedef struct recorder_args {
    pt_trace *trace;
    int thread;
} recorder_args;

static void *record_from_thread(void *arg)
{
    const recorder_args *a = arg;
    for (long i = 0; i < SPANS_PER_THREAD; i++)
        pt_trace_span(a->trace, "forward", (double)i, (double)i + 1.0,
                      a->thread * SPANS_PER_THREAD + i, a->thread, -1);
    return NULL;
}

/* Several threads record into one trace at once: every span lands exactly
 * once, and busy time adds up. */
Test(trace, threads_record_concurrently)
{
    pt_trace *t;
    fake_now_us = 0.0;
    cr_assert_eq(pt_trace_create(&t, 0, 0, 0, THREADS * SPANS_PER_THREAD), PIPERT_OK);
    pt_trace_set_clock(t, fake_clock);
    pthread_t threads[THREADS];
    recorder_args args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (recorder_args){t, i};
        cr_assert_eq(pthread_create(&threads[i], NULL, record_from_thread, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    cr_expect_eq(pt_trace_event_count(t), THREADS * SPANS_PER_THREAD);
    cr_expect_eq(pt_trace_dropped_count(t), 0);
    /* busy: every span lasts 1 µs; with elapsed 2× that, the bubble is 0.5 */
    fake_now_us = 2.0 * THREADS * SPANS_PER_THREAD;
    cr_expect_float_eq(pt_trace_bubble_fraction(t), 0.5, 1e-12);

    char *dir = make_temp_dir();
    cr_assert_eq(pt_trace_write_rank_file(t, dir), PIPERT_OK, "%s", pipert_last_error());
    char *path = path_in(dir, "trace-rank-0.json");
    json_t *root = load_json(path);
    json_t *events = json_object_get(root, "traceEvents");
    char *seen = calloc(THREADS * SPANS_PER_THREAD, 1);
    size_t i, spans = 0;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(string_at(e, "ph"), "X")) continue;
        long microbatch = integer_at(json_object_get(e, "args"), "microbatch");
        cr_assert(microbatch >= 0 && microbatch < THREADS * SPANS_PER_THREAD && !seen[microbatch],
                  "microbatch %ld twice or out of range", microbatch);
        seen[microbatch] = 1;
        spans++;
    }
    cr_expect_eq(spans, THREADS * SPANS_PER_THREAD);
    free(seen);
    json_decref(root);
    free(path);
    pt_trace_free(t);
    remove_dir(dir);
}
