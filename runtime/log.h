/* Leveled logging to stderr. The level comes from PIPERT_LOG=error|warn|info|debug
 * (default info), read once. */
#ifndef PT_LOG_H
#define PT_LOG_H

#include <pthread.h>

typedef enum pt_log_level { PT_LOG_ERROR, PT_LOG_WARN, PT_LOG_INFO, PT_LOG_DEBUG } pt_log_level;

void pt_log(pt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int pt_log_enabled(pt_log_level level);
/* Overrides PIPERT_LOG (tests, --quiet). */
void pt_log_set_level(pt_log_level level);
/* Tags every line with "[rank N]" (multi-worker jobs); -1 for none. */
void pt_log_set_rank(int rank);

/* Where a library user's log lines go: a callback and its level (write NULL:
 * stderr, at the stricter of `level` and PIPERT_LOG's), and a rank tag. */
typedef struct pt_log_sink {
    void (*write)(void *user, pt_log_level level, const char *line);
    void *user;
    pt_log_level level;
    int rank; /* tag "[rank N]"; −1: none */
} pt_log_sink;

/* Routes this thread's log lines to `sink` (NULL: back to stderr) and returns
 * the sink it replaces. A session sets its sink on the threads that call it. */
const pt_log_sink *pt_log_use_sink(const pt_log_sink *sink);

/* pthread_create (its result, 0 or an errno) for a thread of the library's own (a transport's
 * progress, a coordinator's server or client): its lines go where the creating thread's go,
 * so a session's threads log through the session's sink, which must outlive them. */
int pt_log_thread_create(pthread_t *thread, void *(*main)(void *), void *arg);

#define pt_error(...) pt_log(PT_LOG_ERROR, __VA_ARGS__)
#define pt_warn(...) pt_log(PT_LOG_WARN, __VA_ARGS__)
#define pt_info(...) pt_log(PT_LOG_INFO, __VA_ARGS__)
#define pt_debug(...) pt_log(PT_LOG_DEBUG, __VA_ARGS__)

#endif
