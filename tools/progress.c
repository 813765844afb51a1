#include "tools/progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "runtime/clock.h"

void pt_progress_init(pt_progress *p, bool quiet)
{
    p->interactive = isatty(STDOUT_FILENO);
    p->quiet = quiet;
    p->line_open = false;
    p->started = pt_now_s();
}

void pt_progress_update(pt_progress *p, const char *text, bool persist)
{
    if (p->quiet) return;
    if (p->interactive) {
        printf("\r\033[K%s", text);
        p->line_open = true;
    } else if (persist) {
        printf("%s\n", text);
    }
    fflush(stdout);
}

void pt_progress_print(pt_progress *p, const char *fmt, ...)
{
    if (p->quiet) return;
    if (p->line_open) printf("\r\033[K");
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    p->line_open = false;
    fflush(stdout);
}

void pt_progress_finish(pt_progress *p)
{
    if (p->line_open && !p->quiet) printf("\n");
    p->line_open = false;
    fflush(stdout);
}
