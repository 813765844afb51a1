#include "runtime/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int current_level = -1;
static int current_rank = -1;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static _Thread_local const pt_log_sink *thread_sink;

const pt_log_sink *pt_log_use_sink(const pt_log_sink *sink)
{
    const pt_log_sink *previous = thread_sink;
    thread_sink = sink;
    return previous;
}

/* A thread started by pt_log_thread_create: its creator's sink, then its main. */
typedef struct inheriting_thread {
    void *(*main)(void *);
    void *arg;
    const pt_log_sink *sink;
} inheriting_thread;

static void *start_inheriting(void *start)
{
    const inheriting_thread thread = *(inheriting_thread *)start;
    free(start);
    pt_log_use_sink(thread.sink);
    return thread.main(thread.arg);
}

int pt_log_thread_create(pthread_t *thread, void *(*main)(void *), void *arg)
{
    inheriting_thread *start = malloc(sizeof *start);
    if (!start) return ENOMEM;
    *start = (inheriting_thread){main, arg, thread_sink};
    const int rc = pthread_create(thread, NULL, start_inheriting, start);
    if (rc != 0) free(start);
    return rc;
}

static void read_level_from_env(void)
{
    const char *env = getenv("PIPERT_LOG");
    int level = PT_LOG_INFO;
    if (env) {
        if (!strcmp(env, "error")) level = PT_LOG_ERROR;
        else if (!strcmp(env, "warn")) level = PT_LOG_WARN;
        else if (!strcmp(env, "info")) level = PT_LOG_INFO;
        else if (!strcmp(env, "debug")) level = PT_LOG_DEBUG;
        else fprintf(stderr, "pipert: warning: PIPERT_LOG=%s is not one of error|warn|info|debug\n", env);
    }
    if (current_level < 0) current_level = level;
}

int pt_log_enabled(pt_log_level level)
{
    if (thread_sink && thread_sink->write) return (int)level <= (int)thread_sink->level;
    if (thread_sink && (int)level > (int)thread_sink->level) return 0;
    pthread_once(&level_once, read_level_from_env);
    return (int)level <= current_level;
}

void pt_log_set_level(pt_log_level level)
{
    pthread_once(&level_once, read_level_from_env);
    current_level = level;
}

void pt_log_set_rank(int rank) { current_rank = rank; }

void pt_log(pt_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    if (!pt_log_enabled(level)) return;
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (thread_sink && thread_sink->write) {
        char line[2100];
        if (thread_sink->rank >= 0) snprintf(line, sizeof line, "[rank %d] %s", thread_sink->rank, message);
        else snprintf(line, sizeof line, "%s", message);
        thread_sink->write(thread_sink->user, level, line);
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    localtime_r(&now.tv_sec, &tm);
    char rank[24] = "";
    const int tag = thread_sink ? thread_sink->rank : current_rank;
    if (tag >= 0) snprintf(rank, sizeof rank, " [rank %d]", tag);
    /* One fprintf per line keeps lines from different threads whole. */
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s%s %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            now.tv_nsec / 1000000, names[level], rank, message);
}
