/* Running the `pipert` command from a test, as a user would: through the
 * shell, with its exit status, its stderr and its wall time. The binary comes
 * from PIPERT_BIN, which tests/meson.build sets for the command tests. */
#ifndef PT_TEST_COMMAND_H
#define PT_TEST_COMMAND_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/fileio.h"
#include "runtime/safetensors.h"

typedef struct run_result {
    int status;     /* exit status; 128 when killed by a signal */
    double seconds;
    char err[8192]; /* the start of stderr */
} run_result;

static inline const char *pipert_bin(void)
{
    const char *bin = getenv("PIPERT_BIN");
    cr_assert_not_null(bin, "PIPERT_BIN is not set (run through meson test)");
    return bin;
}

/* A fresh directory /tmp/pipert-TEST-XXXXXX (free() the name, or remove_dir). */
static inline char *make_temp_dir(void)
{
    char *dir = strdup("/tmp/pipert-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    return dir;
}

/* Removes a test's directory, and the files named after it beside it (DIR.out, DIR.join-2),
 * and frees its name (PIPERT_KEEP_TEST_DIRS=1 keeps them, to look into a failure). */
static inline void remove_dir(char *dir)
{
    const char *keep = getenv("PIPERT_KEEP_TEST_DIRS");
    if (keep && *keep && strcmp(keep, "0")) {
        fprintf(stderr, "kept %s\n", dir);
        free(dir);
        return;
    }
    char command[600];
    snprintf(command, sizeof command, "rm -rf '%s' '%s'.*", dir, dir);
    cr_expect_eq(system(command), 0, "cannot remove %s", dir);
    free(dir);
}

/* Starts `sh -c command` as a child and returns its pid (the test waits for it). */
static inline pid_t start_shell(const char *command)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Prints to stderr what process `pid` is doing: its threads' innermost frames, from gdb when
 * this machine has it (scripts/deps.sh installs it), else its state from /proc. */
static inline void show_stacks(pid_t pid, const char *who)
{
    char command[512];
    fprintf(stderr, "---- %s (pid %d) ----\n", who, (int)pid);
    snprintf(command, sizeof command,
             "if command -v gdb >/dev/null; then gdb -p %d -batch -nx -ex 'thread apply all bt 10' "
             "2>/dev/null | grep -E '^(Thread|#)' >&2; else grep -E '^(State|Threads)' "
             "/proc/%d/status >&2; fi",
             (int)pid, (int)pid);
    if (system(command) != 0) fprintf(stderr, "(no stacks for pid %d)\n", (int)pid);
}

/* Waits up to `seconds` for a job started with start_shell. A job still running then is
 * shown (the launcher's and each worker's stacks, the workers from `pids_file`'s
 * "RANK PID" lines, the last lines of the files `logs` (a shell pattern) and `log_file`),
 * killed, and fails the test: a hang says where it hangs, long before Criterion's timeout
 * would say only that it did. The exit status otherwise (128 + the signal when one ended it). */
static inline int wait_job_within(pid_t job, double seconds, const char *pids_file,
                                  const char *logs, const char *log_file)
{
    int status;
    for (const double until = pt_now_s() + seconds; pt_now_s() < until; usleep(50000)) {
        const pid_t done = waitpid(job, &status, WNOHANG);
        cr_assert_neq(done, -1, "waiting for the job (pid %d)", (int)job);
        if (done == job) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    fprintf(stderr, "==== the job did not end within %.0f s: where it is ====\n", seconds);
    show_stacks(job, "the launcher");
    char *pids = NULL, *log = NULL;
    size_t size;
    pid_t workers[256];
    int n = 0;
    if (pt_read_file(pids_file, &pids, &size) == PIPERT_OK)
        for (char *line = strtok(pids, "\n"); line && n < 256; line = strtok(NULL, "\n")) {
            int rank, pid;
            if (sscanf(line, "%d %d", &rank, &pid) != 2 || kill(pid, 0) != 0) continue;
            char who[32];
            snprintf(who, sizeof who, "rank %d", rank);
            show_stacks(pid, who);
            workers[n++] = pid;
        }
    kill(job, SIGKILL);
    for (int i = 0; i < n; i++) kill(workers[i], SIGKILL);
    waitpid(job, &status, 0);
    char command[700];
    snprintf(command, sizeof command, "tail -n 12 %s >&2", logs);
    if (system(command) != 0) fprintf(stderr, "(no logs %s)\n", logs);
    if (pt_read_file(log_file, &log, &size) != PIPERT_OK) log = NULL;
    cr_assert_fail("the job did not end within %.0f s (stacks above); %s:\n%s", seconds, log_file,
                   log ? log : "(unreadable)");
    free(pids);
    free(log);
    return -1;
}

/* The newest step in DIR/metrics.jsonl (0: none yet, or no file). */
static inline long logged_step(const char *dir);

/* Ends a `pipert launch` job in DIR the test has seen enough of (a job sized for the slowest
 * machine would run on for minutes in the sanitizer build): once DIR/metrics.jsonl logs step
 * `step`, SIGTERM to its launcher, which stops every worker in order and exits 128 + 15 (1 had a
 * rank failed). A job that ends first is not signalled. Its exit status as wait_job_within gives
 * it (a hang is shown after `seconds`, with `log_file`, the launcher's output); *stopped_at: the
 * last step it logged. */
static inline int stop_job_at_step(pid_t job, const char *dir, long step, double seconds,
                                   const char *log_file, long *stopped_at)
{
    char pids_file[600], logs[600];
    snprintf(pids_file, sizeof pids_file, "%s/workers.pid", dir);
    snprintf(logs, sizeof logs, "%s/logs/rank-*.log", dir);
    const double until = pt_now_s() + seconds;
    int status = 0;
    pid_t done = 0;
    while (done == 0 && logged_step(dir) < step && pt_now_s() < until) {
        usleep(20000);
        done = waitpid(job, &status, WNOHANG);
        cr_assert_neq(done, -1, "waiting for the job (pid %d)", (int)job);
    }
    int result;
    if (done == job) {
        result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else {
        kill(job, SIGTERM);
        result = wait_job_within(job, seconds, pids_file, logs, log_file);
    }
    *stopped_at = logged_step(dir);
    return result;
}

/* Runs `ENV pipert ARGS` (env: "" or "NAME=value ..."). */
static inline run_result run_pipert_env(const char *env, const char *fmt, va_list ap)
{
    const char *bin = pipert_bin();
    char args[4096], command[8192], err_path[] = "/tmp/pipert-test-err-XXXXXX";
    vsnprintf(args, sizeof args, fmt, ap);
    int fd = mkstemp(err_path);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(command, sizeof command, "%s %s %s >/dev/null 2>%s", env, bin, args, err_path);
    run_result r = {0};
    double start = pt_now_s();
    int raw = system(command);
    r.seconds = pt_now_s() - start;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128;
    FILE *f = fopen(err_path, "r");
    size_t n = f ? fread(r.err, 1, sizeof r.err - 1, f) : 0;
    r.err[n] = '\0';
    if (f) fclose(f);
    unlink(err_path);
    return r;
}

static inline run_result run_pipert_with(const char *env, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    run_result r = run_pipert_env(env, fmt, ap);
    va_end(ap);
    return r;
}

static inline run_result run_pipert(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    run_result r = run_pipert_env("", fmt, ap);
    va_end(ap);
    return r;
}

/* Runs `ENV pipert ARGS` and fails the test, with its stderr, unless it succeeds. */
static inline void run_pipert_ok_env(const char *env, const char *fmt, va_list ap)
{
    run_result r = run_pipert_env(env, fmt, ap);
    cr_assert_eq(r.status, 0, "pipert failed (%d):\n%s", r.status, r.err);
}

static inline void run_pipert_ok(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    run_pipert_ok_env("", fmt, ap);
    va_end(ap);
}

/* run_pipert_ok with `env` ("NAME=value ...") before the command. */
static inline void run_pipert_ok_with(const char *env, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    run_pipert_ok_env(env, fmt, ap);
    va_end(ap);
}

/* run_pipert_ok with info-level logs (the tests run with PIPERT_LOG=warn). */
static inline void run_pipert_ok_info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    run_pipert_ok_env("PIPERT_LOG=info", fmt, ap);
    va_end(ap);
}

/* The text of the file `dir` + `suffix` ("DIR.out", "DIR/metrics.jsonl"); malloc'd. (Not
 * inlined: gcc 12 then takes the result for a pointer to the local that received it.) */
__attribute__((noinline, unused)) static char *read_named(const char *dir, const char *suffix)
{
    char path[600], *text = NULL;
    size_t size;
    snprintf(path, sizeof path, "%s%s", dir, suffix);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    return text;
}

/* The lines of a job's log that tell its membership story (departures, joins, errors), at
 * most `size` − 1 characters of them, for a failed assertion's message: a failure on a machine
 * that cannot be reached later (CI) then says what happened. */
static inline const char *membership_story(const char *log, char *story, size_t size)
{
    static const char *const telling[] = {"leaves the job", "rejoins", "is back in the job",
                                          "error", "lost", "failed", "went away", "aborted"};
    size_t used = 0;
    story[0] = '\0';
    for (const char *line = log; line && *line && used + 1 < size;) {
        const char *end = strchr(line, '\n');
        const size_t length = end ? (size_t)(end - line) : strlen(line);
        bool tells = false;
        for (size_t k = 0; k < sizeof telling / sizeof telling[0] && !tells; k++)
            tells = memmem(line, length, telling[k], strlen(telling[k])) != NULL;
        if (tells && !memmem(line, length, "UCX  WARN", 9)) {
            const int n = snprintf(story + used, size - used, "%.*s\n", (int)length, line);
            used += n > 0 ? (size_t)n : 0;
        }
        line = end ? end + 1 : NULL;
    }
    return story;
}

/* The newest step in DIR/metrics.jsonl (0: none yet, or no file). */
static inline long logged_step(const char *dir)
{
    char path[600], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return 0;
    long step = 0;
    for (const char *at = text; (at = strstr(at, "\"step\":")); at += 7) step = strtol(at + 7, NULL, 10);
    free(text);
    return step;
}

/* values[step − 1] = the number `field` of each line of DIR/FILE (metrics
 * JSON lines) that has it, for steps 1..n; returns how many lines had it. */
static inline int read_metric_steps(const char *dir, const char *file, const char *field,
                                    double *values, int n)
{
    char path[512], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    cr_assert_eq(pt_read_file(path, &text, &size), PIPERT_OK, "%s", pipert_last_error());
    int found = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *v = o ? json_object_get(o, field) : NULL;
        const long step = o ? (long)json_integer_value(json_object_get(o, "step")) : 0;
        if (json_is_number(v) && step >= 1 && step <= n) {
            values[step - 1] = json_number_value(v);
            found++;
        }
        json_decref(o);
    }
    free(text);
    return found;
}

/* DIR_B/NAME holds the tensors of DIR_A/NAME (checkpoint files: parameters,
 * optimizer moments, coupling and pipeline state), each bitwise the same;
 * the first difference is named. */
static inline void expect_same_tensors(const char *dir_a, const char *dir_b, const char *name,
                                       const char *what)
{
    char path_a[600], path_b[600];
    snprintf(path_a, sizeof path_a, "%s/%s", dir_a, name);
    snprintf(path_b, sizeof path_b, "%s/%s", dir_b, name);
    pt_safetensors *a, *b;
    cr_assert_eq(pt_safetensors_open(&a, path_a), PIPERT_OK, "%s: %s", what, pipert_last_error());
    cr_assert_eq(pt_safetensors_open(&b, path_b), PIPERT_OK, "%s: %s", what, pipert_last_error());
    const size_t n = pt_safetensors_count(a);
    cr_expect_eq(n, pt_safetensors_count(b), "%s: %s has %zu tensors, %s %zu", what, path_a, n,
                 path_b, pt_safetensors_count(b));
    for (size_t i = 0; i < n; i++) {
        const pt_tensor_entry *x = pt_safetensors_at(a, i), *y = pt_safetensors_find(b, x->name);
        if (!y || y->nbytes != x->nbytes) {
            cr_expect_fail("%s: %s: tensor %s is missing or of another size", what, path_b, x->name);
            break;
        }
        const unsigned char *p = pt_safetensors_data(a, x), *q = pt_safetensors_data(b, y);
        size_t k = 0;
        while (k < x->nbytes && p[k] == q[k]) k++;
        if (k < x->nbytes) {
            cr_expect_fail("%s: %s: tensor %s first differs at byte %zu of %zu", what, name,
                           x->name, k, (size_t)x->nbytes);
            break;
        }
    }
    pt_safetensors_close(a);
    pt_safetensors_close(b);
}

#endif
