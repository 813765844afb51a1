/* The command's progress output for a person: a line redrawn in place when
 * stdout is a terminal, plain lines otherwise. The library never prints to
 * stdout; this is the tools' own. */
#ifndef PT_TOOLS_PROGRESS_H
#define PT_TOOLS_PROGRESS_H

#include <stdbool.h>

typedef struct pt_progress {
    bool interactive; /* stdout is a terminal: redraw one line */
    bool quiet;
    bool line_open;   /* a redrawable line is on screen */
    double started;
} pt_progress;

void pt_progress_init(pt_progress *p, bool quiet);
/* Shows `text` (one line, no newline) as the current state. Interactive: the
 * line is redrawn; otherwise it is printed when `persist` is set. */
void pt_progress_update(pt_progress *p, const char *text, bool persist);
/* Prints a line that stays (validation results, checkpoints). */
void pt_progress_print(pt_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pt_progress_finish(pt_progress *p);

#endif
