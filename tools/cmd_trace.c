/* `pipert trace`: merges a run's DIR/trace-rank-*.json into one Chrome/Perfetto
 * timeline and prints, per rank, its spans per category, busy and idle time
 * and bubble fraction. */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/trace.h"
#include "tools/cli.h"
#include "tools/commands.h"

/* "forward 8, backward 8, idle 9 (4.1 ms)": the categories that occur. */
static void print_span_counts(const pt_trace_rank_summary *s)
{
    const char *separator = "";
    printf("  spans:");
    for (int c = 0; c < PT_TRACE_CATEGORY_COUNT; c++) {
        if (!s->spans[c]) continue;
        printf("%s %s %ld (%.3f ms)", separator, pt_trace_category_name((pt_trace_category)c),
               s->spans[c], 1e-3 * s->span_us[c]);
        separator = ",";
    }
    printf("%s\n", *separator ? "" : " none");
}

static void print_summary(const pt_trace_rank_summary *s)
{
    double idle_us = s->elapsed_us > s->busy_us ? s->elapsed_us - s->busy_us : 0.0;
    printf("rank %d (stage %d, replica %d): busy %.3f ms, idle %.3f ms of %.3f ms, "
           "bubble %.1f%%",
           s->rank, s->stage, s->replica, 1e-3 * s->busy_us, 1e-3 * idle_us,
           1e-3 * s->elapsed_us, 100.0 * s->bubble_fraction);
    if (s->dropped_events) printf(", %ld spans dropped (trace buffer full)", s->dropped_events);
    printf("\n");
    print_span_counts(s);
}

int pt_cmd_trace(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    const pt_cli_flag flags[] = {
        {"--dir", "DIR", "the run directory holding trace-rank-*.json", &dir, NULL},
        {"--out", "FILE", "the merged trace (default: DIR/trace.json)", &out, NULL},
    };
    const pt_cli cli = {"trace", "--dir DIR [--out FILE] [--help]",
                        "Merges the per-rank traces DIR/trace-rank-*.json of a run into one\n"
                        "Chrome trace (open it in ui.perfetto.dev or chrome://tracing), written\n"
                        "atomically, and prints each rank's spans per category, busy and idle\n"
                        "time and bubble fraction (1 - busy/elapsed; busy = forward, backward\n"
                        "and optimizer). See docs/TRACE.md.",
                        flags, (int)(sizeof flags / sizeof flags[0]), false, NULL};
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, NULL);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    if (!dir) {
        fprintf(stderr,
                "pipert trace: --dir is required\nusage: pipert trace %s   (--help for more)\n",
                cli.synopsis);
        return pt_cli_exit_status(PT_CLI_USAGE_ERROR);
    }

    char *default_out = NULL;
    if (!out) {
        size_t n = (size_t)snprintf(NULL, 0, "%s/trace.json", dir) + 1;
        default_out = malloc(n);
        if (!default_out) {
            fprintf(stderr, "pipert trace: out of memory\n");
            return 1;
        }
        snprintf(default_out, n, "%s/trace.json", dir);
        out = default_out;
    }
    pt_trace_rank_summary *summaries;
    int ranks;
    pipert_result rc = pt_trace_merge_summarize(dir, out, &summaries, &ranks);
    if (rc == PIPERT_OK) {
        for (int i = 0; i < ranks; i++) print_summary(&summaries[i]);
        printf("wrote %s (%d rank%s); open it in ui.perfetto.dev or chrome://tracing\n", out,
               ranks, ranks == 1 ? "" : "s");
        free(summaries);
    }
    free(default_out);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("trace");
}
