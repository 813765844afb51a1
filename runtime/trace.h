/* A per-process timeline of a run: spans of time spent in forward, backward,
 * send, recv, optimizer, idle, allreduce and eval, written as a Chrome trace
 * (chrome://tracing, ui.perfetto.dev) and merged across ranks. See
 * docs/TRACE.md.
 *
 * Recording is cheap and never allocates: spans go into an array allocated
 * (and touched) by pt_trace_create. When it is full, further spans are counted
 * as dropped and the count is written into the file's otherData.
 *
 * Threads: pt_trace_span may be called from several threads at once without a
 * lock (one atomic add reserves a slot; the slot is published with a release
 * store). pt_trace_write and pt_trace_bubble_fraction may run while spans are
 * being recorded and see the spans published so far. pt_trace_create,
 * pt_trace_set_clock and pt_trace_free must not race with anything.
 *
 * A NULL pt_trace means tracing is off: every call on it is a no-op
 * (pt_trace_write returns PIPERT_OK and writes nothing). */
#ifndef PT_TRACE_H
#define PT_TRACE_H

#include <stddef.h>

#include "runtime/error.h"

typedef struct pt_trace pt_trace;

/* The categories a span may have. Busy time (for the bubble fraction) is the
 * time inside forward, backward and optimizer spans. */
typedef enum pt_trace_category {
    PT_TRACE_FORWARD,
    PT_TRACE_BACKWARD,
    PT_TRACE_OPTIMIZER,
    PT_TRACE_EVAL,
    PT_TRACE_SEND,
    PT_TRACE_RECV,
    PT_TRACE_ALLREDUCE,
    PT_TRACE_IDLE,
    PT_TRACE_OTHER, /* any other name: kept (15 characters at most), drawn on its own row */
    PT_TRACE_CATEGORY_COUNT
} pt_trace_category;

/* "forward", ..., "idle", "other". */
const char *pt_trace_category_name(pt_trace_category category);

/* A trace for one worker. max_events ≥ 1 spans are preallocated (about 64
 * bytes each). The elapsed-time origin of the bubble fraction is now. */
pipert_result pt_trace_create(pt_trace **out, int rank, int stage, int replica, size_t max_events);
void pt_trace_free(pt_trace *t);

/* CLOCK_REALTIME in µs since the Unix epoch, so the processes on one host (and
 * hosts synchronised by NTP/PTP, to that precision) share a time axis. */
double pt_trace_now_us(void);

/* The trace's clock: pt_trace_now_us unless replaced by pt_trace_set_clock;
 * 0 for a NULL trace. */
double pt_trace_clock_us(const pt_trace *t);

/* Replaces the clock (tests use a fake one) and restarts the elapsed-time
 * origin at the new clock's now. */
void pt_trace_set_clock(pt_trace *t, double (*now_us)(void));

/* Records a finished span [start_us, end_us) of `category` (one of the names
 * above; another name is recorded as PT_TRACE_OTHER under its own name).
 * microbatch, step and version are written as args; −1 means none. A span with
 * a non-finite time or end_us < start_us is not recorded and is counted as
 * invalid in the file's otherData. */
void pt_trace_span(pt_trace *t, const char *category, double start_us, double end_us,
                   long microbatch, long step, long version);

/* 1 − busy / elapsed, where elapsed is the time since create (or
 * pt_trace_set_clock) and busy the total duration of forward, backward and
 * optimizer spans, dropped ones included. Explicit idle spans do not enter
 * it. Clamped to [0, 1]; 0 before any time has passed or for a NULL trace.
 * Busy spans are assumed not to overlap (one compute stream per worker). */
double pt_trace_bubble_fraction(const pt_trace *t);

/* Spans recorded so far, and spans dropped because the array was full. */
size_t pt_trace_event_count(const pt_trace *t);
size_t pt_trace_dropped_count(const pt_trace *t);

/* Writes this rank's Chrome trace JSON to `path`, atomically: spans sorted by
 * start time, process and thread names, and otherData with rank, stage,
 * replica, busy_us, elapsed_us, bubble_fraction and dropped_events. */
pipert_result pt_trace_write(const pt_trace *t, const char *path);

/* pt_trace_write to DIR/trace-rank-RANK.json, the name pt_trace_merge reads. */
pipert_result pt_trace_write_rank_file(const pt_trace *t, const char *dir);

/* What one rank's file says, for summaries. */
typedef struct pt_trace_rank_summary {
    int rank, stage, replica;
    long spans[PT_TRACE_CATEGORY_COUNT];      /* spans in the file, by category */
    double span_us[PT_TRACE_CATEGORY_COUNT];  /* their total duration */
    double busy_us;     /* the recorder's busy time (dropped spans included) */
    double elapsed_us;  /* create → write */
    double bubble_fraction;
    long dropped_events;
} pt_trace_rank_summary;

/* Merges DIR/trace-rank-*.json into one Chrome/Perfetto trace at out_path,
 * atomically: one process row per rank named "rank R (stage S, replica P)",
 * one thread row per category group (compute = forward, backward, optimizer,
 * eval; idle; send; recv; allreduce; other), each rank's spans sorted by start
 * time, and otherData holding every rank's summary. A directory without rank
 * files, or a rank file that is not a valid pipert trace, is an error naming
 * it; out_path is then left as it was. ranks_merged may be NULL. */
pipert_result pt_trace_merge(const char *dir, const char *out_path, int *ranks_merged);

/* pt_trace_merge that also returns each rank's summary, by rank (*summaries is
 * malloc'd; the caller frees it). */
pipert_result pt_trace_merge_summarize(const char *dir, const char *out_path,
                                       pt_trace_rank_summary **summaries, int *ranks_merged);

#endif
