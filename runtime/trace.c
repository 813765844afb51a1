#include "runtime/trace.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/fileio.h"
#include "runtime/memory.h"

/* ---- categories and the rows they are drawn on -------------------------- */

static const char *const category_names[PT_TRACE_CATEGORY_COUNT] = {
    "forward", "backward", "optimizer", "eval", "send", "recv", "allreduce", "idle", "other",
};

/* Rows (Chrome "threads") of a rank: the compute stream, then what it waits
 * on. Row numbers are the events' tid; 0 is unused. */
enum { ROW_COMPUTE = 1, ROW_IDLE, ROW_SEND, ROW_RECV, ROW_ALLREDUCE, ROW_OTHER, ROW_COUNT };

static const char *const row_names[ROW_COUNT] = {
    NULL, "compute", "idle", "send", "recv", "allreduce", "other",
};

static const int category_row[PT_TRACE_CATEGORY_COUNT] = {
    [PT_TRACE_FORWARD] = ROW_COMPUTE,  [PT_TRACE_BACKWARD] = ROW_COMPUTE,
    [PT_TRACE_OPTIMIZER] = ROW_COMPUTE, [PT_TRACE_EVAL] = ROW_COMPUTE,
    [PT_TRACE_SEND] = ROW_SEND,        [PT_TRACE_RECV] = ROW_RECV,
    [PT_TRACE_ALLREDUCE] = ROW_ALLREDUCE, [PT_TRACE_IDLE] = ROW_IDLE,
    [PT_TRACE_OTHER] = ROW_OTHER,
};

const char *pt_trace_category_name(pt_trace_category category)
{
    return (unsigned)category < PT_TRACE_CATEGORY_COUNT ? category_names[category] : "other";
}

static pt_trace_category category_of(const char *name)
{
    for (int c = 0; c < PT_TRACE_OTHER; c++)
        if (!strcmp(name, category_names[c])) return (pt_trace_category)c;
    return PT_TRACE_OTHER;
}

static bool counts_as_busy(pt_trace_category category)
{
    return category == PT_TRACE_FORWARD || category == PT_TRACE_BACKWARD ||
           category == PT_TRACE_OPTIMIZER;
}

/* ---- recording ----------------------------------------------------------- */

#define OTHER_NAME_SIZE 16

typedef struct trace_event {
    double start_us, end_us;
    long microbatch, step, version;    /* −1: none */
    int category;                      /* pt_trace_category */
    char other_name[OTHER_NAME_SIZE];  /* the name of a PT_TRACE_OTHER span */
    atomic_int published;              /* set (release) once the fields above are written */
} trace_event;

struct pt_trace {
    int rank, stage, replica;
    size_t capacity;
    trace_event *events;    /* [capacity], allocated and touched by create */
    atomic_size_t reserved; /* slots handed out; those beyond capacity were dropped */
    atomic_llong busy_ns;   /* forward + backward + optimizer, dropped spans included */
    atomic_size_t invalid;  /* spans refused: non-finite or negative duration */
    double (*now_us)(void);
    double start_us;        /* origin of the elapsed time */
};

double pt_trace_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

pipert_result pt_trace_create(pt_trace **out, int rank, int stage, int replica, size_t max_events)
{
    *out = NULL;
    if (rank < 0 || stage < 0 || replica < 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "trace: rank %d, stage %d, replica %d: none may be negative", rank, stage,
                       replica);
    if (max_events == 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "trace of rank %d: max_events must be at least 1",
                       rank);
    size_t bytes;
    if (!pt_mul_size(max_events, sizeof(trace_event), &bytes))
        return pt_fail(PIPERT_ERR_NOMEM, "trace of rank %d: %zu events overflow", rank,
                       max_events);
    pt_trace *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(PIPERT_ERR_NOMEM, "trace of rank %d: out of memory", rank);
    /* pt_alloc zero-fills, which also faults every page in now rather than on
     * the recording path. */
    pipert_result rc = pt_alloc((void **)&t->events, bytes, "trace events");
    if (rc != PIPERT_OK) {
        free(t);
        return rc;
    }
    for (size_t i = 0; i < max_events; i++) atomic_init(&t->events[i].published, 0);
    t->rank = rank;
    t->stage = stage;
    t->replica = replica;
    t->capacity = max_events;
    atomic_init(&t->reserved, 0);
    atomic_init(&t->busy_ns, 0);
    atomic_init(&t->invalid, 0);
    t->now_us = pt_trace_now_us;
    t->start_us = t->now_us();
    *out = t;
    return PIPERT_OK;
}

void pt_trace_free(pt_trace *t)
{
    if (!t) return;
    pt_free(t->events);
    free(t);
}

double pt_trace_clock_us(const pt_trace *t) { return t ? t->now_us() : 0.0; }

void pt_trace_set_clock(pt_trace *t, double (*now_us)(void))
{
    if (!t) return;
    t->now_us = now_us ? now_us : pt_trace_now_us;
    t->start_us = t->now_us();
}

/* Printable ASCII only, so the name needs no care in JSON beyond escaping;
 * truncated to fit. */
static void copy_other_name(char dst[OTHER_NAME_SIZE], const char *name)
{
    size_t i = 0;
    for (; i < OTHER_NAME_SIZE - 1 && name[i]; i++)
        dst[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
    dst[i] = '\0';
}

void pt_trace_span(pt_trace *t, const char *category, double start_us, double end_us,
                   long microbatch, long step, long version)
{
    if (!t) return;
    if (!category || !isfinite(start_us) || !isfinite(end_us) || end_us < start_us) {
        atomic_fetch_add_explicit(&t->invalid, 1, memory_order_relaxed);
        return;
    }
    pt_trace_category kind = category_of(category);
    if (counts_as_busy(kind))
        atomic_fetch_add_explicit(&t->busy_ns, (long long)((end_us - start_us) * 1e3 + 0.5),
                                  memory_order_relaxed);
    size_t slot = atomic_fetch_add_explicit(&t->reserved, 1, memory_order_relaxed);
    if (slot >= t->capacity) return; /* dropped: counted by reserved − capacity */
    trace_event *e = &t->events[slot];
    e->start_us = start_us;
    e->end_us = end_us;
    e->microbatch = microbatch;
    e->step = step;
    e->version = version;
    e->category = kind;
    if (kind == PT_TRACE_OTHER) copy_other_name(e->other_name, category);
    atomic_store_explicit(&e->published, 1, memory_order_release);
}

size_t pt_trace_event_count(const pt_trace *t)
{
    if (!t) return 0;
    size_t reserved = atomic_load_explicit(&t->reserved, memory_order_relaxed);
    return reserved < t->capacity ? reserved : t->capacity;
}

size_t pt_trace_dropped_count(const pt_trace *t)
{
    if (!t) return 0;
    size_t reserved = atomic_load_explicit(&t->reserved, memory_order_relaxed);
    return reserved > t->capacity ? reserved - t->capacity : 0;
}

static double busy_us_of(const pt_trace *t)
{
    return 1e-3 * (double)atomic_load_explicit(&t->busy_ns, memory_order_relaxed);
}

static double bubble_of(double busy_us, double elapsed_us)
{
    if (!(elapsed_us > 0)) return 0.0;
    double bubble = 1.0 - busy_us / elapsed_us;
    return bubble < 0 ? 0.0 : bubble > 1 ? 1.0 : bubble;
}

double pt_trace_bubble_fraction(const pt_trace *t)
{
    if (!t) return 0.0;
    return bubble_of(busy_us_of(t), t->now_us() - t->start_us);
}

/* ---- writing JSON -------------------------------------------------------- */

/* Writing goes through fprintf rather than a jansson tree: a tree costs about
 * a kilobyte and a dozen allocations per event, too much for 10^5 events at
 * the end of a run, while every string written here is either fixed or passed
 * through write_json_string. */
static void write_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* The lines that open and close traceEvents; between them, one event per line
 * (merge relies on it). */
#define TRACE_HEAD "{\"traceEvents\":["
#define TRACE_EVENTS_END "],"

/* Separates the elements of traceEvents. */
static void begin_event(FILE *f, bool *first)
{
    fputs(*first ? "\n" : ",\n", f);
    *first = false;
}

/* process_name/sort_index for the rank, thread_name/sort_index for each row
 * in use. */
static void write_metadata(FILE *f, int rank, int stage, int replica,
                           const bool rows_used[ROW_COUNT], bool *first)
{
    begin_event(f, first);
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"rank %d (stage %d, replica %d)\"}}",
            rank, rank, stage, replica);
    begin_event(f, first);
    fprintf(f,
            "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}",
            rank, rank);
    for (int row = 1; row < ROW_COUNT; row++) {
        if (!rows_used[row]) continue;
        begin_event(f, first);
        fprintf(f,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"name\":\"%s\"}}",
                rank, row, row_names[row]);
        begin_event(f, first);
        fprintf(f,
                "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"sort_index\":%d}}",
                rank, row, row);
    }
}

static const char *span_category(const trace_event *e)
{
    return e->category == PT_TRACE_OTHER ? e->other_name : category_names[e->category];
}

/* One "X" (complete) event: name "forward 3" for microbatch 3, else the
 * category; args hold the microbatch, step and version that are not −1. */
static void write_span(FILE *f, int rank, const trace_event *e, bool *first)
{
    const char *category = span_category(e);
    begin_event(f, first);
    fputs("{\"name\":", f);
    if (e->microbatch >= 0) {
        char name[OTHER_NAME_SIZE + 24];
        snprintf(name, sizeof name, "%s %ld", category, e->microbatch);
        write_json_string(f, name);
    } else {
        write_json_string(f, category);
    }
    fputs(",\"cat\":", f);
    write_json_string(f, category);
    fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{",
            e->start_us, e->end_us - e->start_us, rank, category_row[e->category]);
    const char *separator = "";
    if (e->microbatch >= 0) {
        fprintf(f, "\"microbatch\":%ld", e->microbatch);
        separator = ",";
    }
    if (e->step >= 0) {
        fprintf(f, "%s\"step\":%ld", separator, e->step);
        separator = ",";
    }
    if (e->version >= 0) fprintf(f, "%s\"version\":%ld", separator, e->version);
    fputs("}}", f);
}

static int compare_event_start(const void *a, const void *b)
{
    const trace_event *x = *(const trace_event *const *)a, *y = *(const trace_event *const *)b;
    if (x->start_us != y->start_us) return x->start_us < y->start_us ? -1 : 1;
    return (x->end_us > y->end_us) - (x->end_us < y->end_us);
}

/* The published events, sorted by start time (malloc'd array of pointers). */
static pipert_result sorted_events(const pt_trace *t, const char *path,
                                   const trace_event ***out, size_t *count)
{
    size_t n = pt_trace_event_count(t);
    const trace_event **events = malloc((n ? n : 1) * sizeof *events);
    if (!events) return pt_fail(PIPERT_ERR_NOMEM, "%s: cannot sort %zu trace events", path, n);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (atomic_load_explicit(&t->events[i].published, memory_order_acquire))
            events[kept++] = &t->events[i];
    qsort(events, kept, sizeof *events, compare_event_start);
    *out = events;
    *count = kept;
    return PIPERT_OK;
}

pipert_result pt_trace_write(const pt_trace *t, const char *path)
{
    if (!t) return PIPERT_OK;
    double now = t->now_us(), elapsed = now - t->start_us, busy = busy_us_of(t);
    size_t dropped = pt_trace_dropped_count(t);
    const trace_event **events = NULL;
    size_t count = 0;
    PT_TRY(sorted_events(t, path, &events, &count));

    bool rows_used[ROW_COUNT] = {false};
    for (size_t i = 0; i < count; i++) rows_used[category_row[events[i]->category]] = true;

    pt_atomic_file file;
    pipert_result rc = pt_atomic_open(&file, path);
    if (rc != PIPERT_OK) {
        free(events);
        return rc;
    }
    FILE *f = file.stream;
    bool first = true;
    fputs(TRACE_HEAD, f);
    write_metadata(f, t->rank, t->stage, t->replica, rows_used, &first);
    for (size_t i = 0; i < count; i++) write_span(f, t->rank, events[i], &first);
    free(events);
    fprintf(f,
            "\n" TRACE_EVENTS_END "\n\"displayTimeUnit\":\"ms\",\n"
            "\"otherData\":{\"pipert_trace\":1,"
            "\"rank\":%d,\"stage\":%d,\"replica\":%d,\"events\":%zu,\"dropped_events\":%zu,"
            "\"invalid_spans\":%zu,\"start_us\":%.3f,\"end_us\":%.3f,\"elapsed_us\":%.3f,"
            "\"busy_us\":%.3f,\"bubble_fraction\":%.6f,"
            "\"clock\":\"CLOCK_REALTIME, microseconds since the Unix epoch\"}}\n",
            t->rank, t->stage, t->replica, count, dropped,
            atomic_load_explicit(&t->invalid, memory_order_relaxed), t->start_us, now, elapsed,
            busy, bubble_of(busy, elapsed));
    if (ferror(f)) {
        pt_atomic_abort(&file);
        return pt_fail(PIPERT_ERR_IO, "%s: write failed", path);
    }
    return pt_atomic_commit(&file);
}

pipert_result pt_trace_write_rank_file(const pt_trace *t, const char *dir)
{
    if (!t) return PIPERT_OK;
    size_t n = strlen(dir) + 40;
    char *path = malloc(n);
    if (!path) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(path, n, "%s/trace-rank-%d.json", dir, t->rank);
    pipert_result rc = pt_trace_write(t, path);
    free(path);
    return rc;
}

/* ---- merging ------------------------------------------------------------- */

typedef struct rank_file {
    long rank;
    char *path;
} rank_file;

/* The rank of "trace-rank-N.json", or −1 for any other name. */
static long rank_of_file_name(const char *name)
{
    static const char prefix[] = "trace-rank-", suffix[] = ".json";
    if (strncmp(name, prefix, sizeof prefix - 1)) return -1;
    const char *digits = name + sizeof prefix - 1, *p = digits;
    while (isdigit((unsigned char)*p)) p++;
    if (p == digits || p - digits > 9 || strcmp(p, suffix)) return -1;
    return strtol(digits, NULL, 10);
}

static int compare_rank_files(const void *a, const void *b)
{
    const rank_file *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static void free_rank_files(rank_file *files, int count)
{
    for (int i = 0; i < count; i++) free(files[i].path);
    free(files);
}

/* DIR/trace-rank-*.json, by rank. */
static pipert_result list_rank_files(const char *dir, rank_file **out, int *count)
{
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return pt_fail(PIPERT_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    rank_file *files = NULL;
    int n = 0, capacity = 0;
    pipert_result rc = PIPERT_OK;
    for (struct dirent *entry; rc == PIPERT_OK && (entry = readdir(d));) {
        long rank = rank_of_file_name(entry->d_name);
        if (rank < 0) continue;
        if (n == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            rank_file *grown = realloc(files, (size_t)capacity * sizeof *files);
            if (!grown) {
                rc = pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory listing trace files", dir);
                break;
            }
            files = grown;
        }
        size_t length = strlen(dir) + strlen(entry->d_name) + 2;
        files[n].rank = rank;
        files[n].path = malloc(length);
        if (!files[n].path) {
            rc = pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory listing trace files", dir);
            break;
        }
        snprintf(files[n].path, length, "%s/%s", dir, entry->d_name);
        n++;
    }
    closedir(d);
    if (rc == PIPERT_OK && n == 0)
        rc = pt_fail(PIPERT_ERR_NOT_FOUND, "%s: no trace-rank-*.json files to merge", dir);
    if (rc == PIPERT_OK) {
        qsort(files, (size_t)n, sizeof *files, compare_rank_files);
        for (int i = 1; i < n && rc == PIPERT_OK; i++)
            if (files[i].rank == files[i - 1].rank)
                rc = pt_fail(PIPERT_ERR_FORMAT, "%s and %s: two files for rank %ld",
                             files[i - 1].path, files[i].path, files[i].rank);
    }
    if (rc != PIPERT_OK) {
        free_rank_files(files, n);
        return rc;
    }
    *out = files;
    *count = n;
    return PIPERT_OK;
}

static pipert_result get_integer(const json_t *object, const char *key, const char *where,
                                 long *value)
{
    const json_t *item = json_object_get(object, key);
    if (!json_is_integer(item))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: '%s' is missing or not an integer", where, key);
    *value = (long)json_integer_value(item);
    return PIPERT_OK;
}

static pipert_result get_number(const json_t *object, const char *key, const char *where,
                                double *value)
{
    const json_t *item = json_object_get(object, key);
    if (!json_is_number(item))
        return pt_fail(PIPERT_ERR_FORMAT, "%s: '%s' is missing or not a number", where, key);
    *value = json_number_value(item);
    return PIPERT_OK;
}

/* otherData of a rank file → the summary's identity and accounting. */
static pipert_result read_rank_data(const json_t *other, const char *path, long file_rank,
                                    pt_trace_rank_summary *summary)
{
    char where[4096];
    snprintf(where, sizeof where, "%s: otherData", path);
    if (!json_is_object(other)) return pt_fail(PIPERT_ERR_FORMAT, "%s is missing", where);
    long rank = 0, stage = 0, replica = 0, dropped = 0;
    PT_TRY(get_integer(other, "rank", where, &rank));
    PT_TRY(get_integer(other, "stage", where, &stage));
    PT_TRY(get_integer(other, "replica", where, &replica));
    PT_TRY(get_integer(other, "dropped_events", where, &dropped));
    PT_TRY(get_number(other, "busy_us", where, &summary->busy_us));
    PT_TRY(get_number(other, "elapsed_us", where, &summary->elapsed_us));
    PT_TRY(get_number(other, "bubble_fraction", where, &summary->bubble_fraction));
    if (rank != file_rank)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: rank is %ld but the file name says %ld", where,
                       rank, file_rank);
    if (stage < 0 || replica < 0 || stage > 1000000 || replica > 1000000)
        return pt_fail(PIPERT_ERR_FORMAT, "%s: stage %ld, replica %ld out of range", where, stage,
                       replica);
    summary->rank = (int)rank;
    summary->stage = (int)stage;
    summary->replica = (int)replica;
    summary->dropped_events = dropped;
    return PIPERT_OK;
}

/* Rank files are read a line at a time, so merging needs memory for one
 * event, not for a parsed tree of the whole file (jansson holds about 4 KB
 * per event). pt_trace_write's layout is relied on: the line TRACE_HEAD, one
 * event per line (a comma after all but the last), the line TRACE_EVENTS_END,
 * then the rest of the object. */
typedef struct line_reader {
    FILE *stream;
    const char *path;
    char *line; /* without its newline */
    size_t capacity, length;
    long number;
} line_reader;

static bool read_line(line_reader *r)
{
    ssize_t got = getline(&r->line, &r->capacity, r->stream);
    if (got < 0) return false;
    r->length = (size_t)got;
    if (r->length && r->line[r->length - 1] == '\n') r->line[--r->length] = '\0';
    r->number++;
    return true;
}

/* What merge needs of a span. */
typedef struct span_fields {
    long pid, tid;
    double ts, dur;
    pt_trace_category category;
} span_fields;

/* Checks a span of the file of `rank` and counts it. */
static pipert_result count_span(const line_reader *r, int rank, const span_fields *span,
                                pt_trace_rank_summary *summary, bool rows_used[ROW_COUNT])
{
    if (span->pid != rank)
        return pt_fail(PIPERT_ERR_FORMAT, "%s:%ld: pid %ld in the file of rank %d", r->path,
                       r->number, span->pid, rank);
    if (span->tid < 1 || span->tid >= ROW_COUNT)
        return pt_fail(PIPERT_ERR_FORMAT, "%s:%ld: tid %ld is not a trace row", r->path,
                       r->number, span->tid);
    if (!isfinite(span->ts) || !isfinite(span->dur) || span->dur < 0)
        return pt_fail(PIPERT_ERR_FORMAT, "%s:%ld: ts %g, dur %g: not a span", r->path,
                       r->number, span->ts, span->dur);
    summary->spans[span->category]++;
    summary->span_us[span->category] += span->dur;
    rows_used[span->tid] = true;
    return PIPERT_OK;
}

/* The fast path of merging: a recogniser of exactly the lines write_span
 * produces, about 20 times faster than building a jansson tree per line. It
 * accepts only valid JSON (plain strings, JSON numbers); any other line goes
 * to jansson. */
static bool skip_literal(const char **p, const char *literal)
{
    size_t n = strlen(literal);
    if (strncmp(*p, literal, n)) return false;
    *p += n;
    return true;
}

/* A string of printable ASCII without escapes: [*begin, *begin + *length). */
static bool scan_plain_string(const char **p, const char **begin, size_t *length)
{
    if (**p != '"') return false;
    const char *q = *p + 1;
    while (*q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\') q++;
    if (*q != '"') return false;
    *begin = *p + 1;
    *length = (size_t)(q - *begin);
    *p = q + 1;
    return true;
}

static const char *skip_digits(const char *q)
{
    while (isdigit((unsigned char)*q)) q++;
    return q;
}

/* A number in JSON's grammar; *is_integer when it has no fraction or exponent
 * and few enough digits for a long. */
static bool scan_number(const char **p, double *value, bool *is_integer)
{
    const char *q = *p;
    if (*q == '-') q++;
    if (!isdigit((unsigned char)*q)) return false;
    q = *q == '0' ? q + 1 : skip_digits(q);
    *is_integer = q - *p <= 18;
    if (*q == '.') {
        if (!isdigit((unsigned char)q[1])) return false;
        q = skip_digits(q + 1);
        *is_integer = false;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!isdigit((unsigned char)*q)) return false;
        q = skip_digits(q);
        *is_integer = false;
    }
    *value = strtod(*p, NULL);
    *p = q;
    return true;
}

static bool scan_integer(const char **p, long *value)
{
    const char *start = *p;
    double ignored;
    bool is_integer;
    if (!scan_number(p, &ignored, &is_integer) || !is_integer) return false;
    *value = strtol(start, NULL, 10);
    return true;
}

static bool scan_span_line(const char *line, size_t length, span_fields *span)
{
    const char *p = line, *name, *category;
    size_t name_length, category_length;
    bool ignored;
    if (!skip_literal(&p, "{\"name\":") || !scan_plain_string(&p, &name, &name_length) ||
        !skip_literal(&p, ",\"cat\":") || !scan_plain_string(&p, &category, &category_length) ||
        !skip_literal(&p, ",\"ph\":\"X\",\"ts\":") || !scan_number(&p, &span->ts, &ignored) ||
        !skip_literal(&p, ",\"dur\":") || !scan_number(&p, &span->dur, &ignored) ||
        !skip_literal(&p, ",\"pid\":") || !scan_integer(&p, &span->pid) ||
        !skip_literal(&p, ",\"tid\":") || !scan_integer(&p, &span->tid) ||
        !skip_literal(&p, ",\"args\":{"))
        return false;
    for (bool first = true; *p != '}'; first = false) {
        const char *key;
        size_t key_length;
        long value;
        if ((!first && !skip_literal(&p, ",")) || !scan_plain_string(&p, &key, &key_length) ||
            !skip_literal(&p, ":") || !scan_integer(&p, &value))
            return false;
    }
    if (!skip_literal(&p, "}}") || p != line + length) return false;
    char name_copy[OTHER_NAME_SIZE] = "";
    if (category_length < sizeof name_copy) memcpy(name_copy, category, category_length);
    span->category = category_of(name_copy);
    return true;
}

/* The slow path: a span line that jansson parsed. */
static pipert_result span_from_json(const json_t *event, const line_reader *r, span_fields *span)
{
    char where[4200];
    snprintf(where, sizeof where, "%s:%ld", r->path, r->number);
    PT_TRY(get_integer(event, "pid", where, &span->pid));
    PT_TRY(get_integer(event, "tid", where, &span->tid));
    PT_TRY(get_number(event, "ts", where, &span->ts));
    PT_TRY(get_number(event, "dur", where, &span->dur));
    const char *category = json_string_value(json_object_get(event, "cat"));
    if (!category) return pt_fail(PIPERT_ERR_FORMAT, "%s: 'cat' is missing or not a string", where);
    span->category = category_of(category);
    return PIPERT_OK;
}

/* One line of traceEvents: a span is checked, counted and copied to `out`
 * as it is; metadata is dropped (merge writes its own). */
static pipert_result merge_event_line(FILE *out, line_reader *r, int rank, bool *first,
                                      pt_trace_rank_summary *summary, bool rows_used[ROW_COUNT])
{
    if (r->length && r->line[r->length - 1] == ',') r->line[--r->length] = '\0';
    span_fields span = {0};
    pipert_result rc = PIPERT_OK;
    bool is_span = scan_span_line(r->line, r->length, &span);
    if (!is_span) {
        json_error_t error;
        json_t *event = json_loadb(r->line, r->length, 0, &error);
        if (!event)
            return pt_fail(PIPERT_ERR_FORMAT, "%s:%ld:%d: %s", r->path, r->number, error.column,
                           error.text);
        const char *phase = json_string_value(json_object_get(event, "ph"));
        if (!phase)
            rc = pt_fail(PIPERT_ERR_FORMAT, "%s:%ld: not a trace event (no \"ph\")", r->path,
                         r->number);
        else if (!strcmp(phase, "X"))
            is_span = (rc = span_from_json(event, r, &span)) == PIPERT_OK;
        else if (strcmp(phase, "M"))
            rc = pt_fail(PIPERT_ERR_FORMAT,
                         "%s:%ld: phase \"%s\": expected a span (X) or metadata (M)", r->path,
                         r->number, phase);
        json_decref(event);
    }
    if (rc == PIPERT_OK && is_span) rc = count_span(r, rank, &span, summary, rows_used);
    if (rc == PIPERT_OK && is_span) {
        begin_event(out, first);
        fwrite(r->line, 1, r->length, out);
    }
    return rc;
}

/* What follows traceEvents ("displayTimeUnit", "otherData"), as an object. */
static pipert_result read_trailer(line_reader *r, json_t **trailer)
{
    *trailer = NULL;
    long first_line = r->number + 1;
    char *text = NULL;
    size_t size = 0;
    FILE *buffer = open_memstream(&text, &size);
    if (!buffer) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", r->path);
    fputc('{', buffer);
    while (read_line(r)) fprintf(buffer, "%s\n", r->line);
    int failed = ferror(r->stream) || fclose(buffer) != 0;
    if (failed) {
        free(text);
        return pt_fail(PIPERT_ERR_IO, "%s: read failed", r->path);
    }
    json_error_t error;
    *trailer = json_loadb(text, size, 0, &error);
    free(text);
    if (!*trailer)
        return pt_fail(PIPERT_ERR_FORMAT, "%s:%ld:%d: %s", r->path,
                       first_line + error.line - 1, error.column, error.text);
    return PIPERT_OK;
}

/* Reads, checks and appends one rank file: its spans (in the file's order,
 * which pt_trace_write made the order of start times), then the rank's
 * metadata, rebuilt from otherData. */
static pipert_result merge_rank_file(FILE *out, const rank_file *file, bool *first,
                                     pt_trace_rank_summary *summary, json_t *rank_data)
{
    line_reader r = {.stream = fopen(file->path, "rb"), .path = file->path};
    if (!r.stream)
        return pt_fail(PIPERT_ERR_IO, "%s: cannot open: %s", file->path, strerror(errno));
    pipert_result rc = PIPERT_OK;
    bool rows_used[ROW_COUNT] = {false};
    json_t *trailer = NULL;
    if (!read_line(&r) || strcmp(r.line, TRACE_HEAD)) {
        rc = pt_fail(PIPERT_ERR_FORMAT, "%s:1: not a pipert rank trace (its first line is not %s)",
                     file->path, TRACE_HEAD);
        goto done;
    }
    for (;;) {
        if (!read_line(&r)) {
            rc = pt_fail(PIPERT_ERR_FORMAT, "%s:%ld: the file ends inside traceEvents (truncated?)",
                         file->path, r.number);
            goto done;
        }
        if (!strcmp(r.line, TRACE_EVENTS_END)) break;
        rc = merge_event_line(out, &r, (int)file->rank, first, summary, rows_used);
        if (rc != PIPERT_OK) goto done;
    }
    rc = read_trailer(&r, &trailer);
    if (rc != PIPERT_OK) goto done;
    json_t *other = json_object_get(trailer, "otherData");
    rc = read_rank_data(other, file->path, file->rank, summary);
    if (rc != PIPERT_OK) goto done;
    write_metadata(out, summary->rank, summary->stage, summary->replica, rows_used, first);
    if (json_array_append(rank_data, other) != 0)
        rc = pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", file->path);
done:
    json_decref(trailer);
    free(r.line);
    fclose(r.stream);
    return rc;
}

static pipert_result write_merged_tail(FILE *out, json_t *rank_data, const char *out_path)
{
    long dropped = 0;
    for (size_t i = 0; i < json_array_size(rank_data); i++)
        dropped += (long)json_integer_value(
            json_object_get(json_array_get(rank_data, i), "dropped_events"));
    json_t *other = json_pack("{s:i, s:I, s:O}", "ranks_merged", (int)json_array_size(rank_data),
                              "dropped_events", (json_int_t)dropped, "ranks", rank_data);
    if (!other) return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", out_path);
    fputs("\n" TRACE_EVENTS_END "\n\"displayTimeUnit\":\"ms\",\n\"otherData\":", out);
    int failed = json_dumpf(other, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(other);
    fputs("}\n", out);
    if (failed || ferror(out)) return pt_fail(PIPERT_ERR_IO, "%s: write failed", out_path);
    return PIPERT_OK;
}

pipert_result pt_trace_merge_summarize(const char *dir, const char *out_path,
                                       pt_trace_rank_summary **summaries, int *ranks_merged)
{
    if (summaries) *summaries = NULL;
    if (ranks_merged) *ranks_merged = 0;
    rank_file *files = NULL;
    int count = 0;
    PT_TRY(list_rank_files(dir, &files, &count));
    pt_trace_rank_summary *all = calloc((size_t)count, sizeof *all);
    json_t *rank_data = json_array();
    if (!all || !rank_data) {
        free(all);
        json_decref(rank_data);
        free_rank_files(files, count);
        return pt_fail(PIPERT_ERR_NOMEM, "%s: out of memory", out_path);
    }
    pt_atomic_file file;
    pipert_result rc = pt_atomic_open(&file, out_path);
    if (rc == PIPERT_OK) {
        bool first = true;
        fputs(TRACE_HEAD, file.stream);
        for (int i = 0; i < count && rc == PIPERT_OK; i++)
            rc = merge_rank_file(file.stream, &files[i], &first, &all[i], rank_data);
        if (rc == PIPERT_OK) rc = write_merged_tail(file.stream, rank_data, out_path);
        /* a failed merge leaves out_path as it was */
        if (rc == PIPERT_OK) rc = pt_atomic_commit(&file);
        else pt_atomic_abort(&file);
    }
    json_decref(rank_data);
    free_rank_files(files, count);
    if (rc != PIPERT_OK) {
        free(all);
        return rc;
    }
    if (ranks_merged) *ranks_merged = count;
    if (summaries) *summaries = all;
    else free(all);
    return PIPERT_OK;
}

pipert_result pt_trace_merge(const char *dir, const char *out_path, int *ranks_merged)
{
    return pt_trace_merge_summarize(dir, out_path, NULL, ranks_merged);
}
