/* Leveled logging to stderr. The level comes from PIPERT_LOG=error|warn|info|debug
 * (default info), read once. */
#ifndef PT_LOG_H
#define PT_LOG_H

typedef enum pt_log_level { PT_LOG_ERROR, PT_LOG_WARN, PT_LOG_INFO, PT_LOG_DEBUG } pt_log_level;

void pt_log(pt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int pt_log_enabled(pt_log_level level);
/* Overrides PIPERT_LOG (tests, --quiet). */
void pt_log_set_level(pt_log_level level);
/* Tags every line with "[rank N]" (multi-worker jobs); -1 for none. */
void pt_log_set_rank(int rank);

#define pt_error(...) pt_log(PT_LOG_ERROR, __VA_ARGS__)
#define pt_warn(...) pt_log(PT_LOG_WARN, __VA_ARGS__)
#define pt_info(...) pt_log(PT_LOG_INFO, __VA_ARGS__)
#define pt_debug(...) pt_log(PT_LOG_DEBUG, __VA_ARGS__)

#endif
