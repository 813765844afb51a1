#include "tools/command.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/error.h"

extern char **environ;

#define STDERR_KEPT 512

static void join_argv(const char *const argv[], char *text, size_t cap)
{
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; argv[i] && used < cap; i++)
        used += (size_t)snprintf(text + used, cap - used, "%s%s", i ? " " : "", argv[i]);
}

/* Starts argv with stdout on /dev/null and stderr into *stderr_pipe. */
static int spawn(const char *const argv[], pid_t *pid, int *stderr_pipe)
{
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return errno;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
    int rc = posix_spawnp(pid, argv[0], &actions, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    if (rc != 0) close(pipe_fds[0]);
    else *stderr_pipe = pipe_fds[0];
    return rc;
}

/* Reads what the child writes on stderr (the first STDERR_KEPT bytes), waits
 * for it; its wait status, or -1. */
static int finish(pid_t pid, int stderr_pipe, char *said, size_t cap)
{
    size_t used = 0;
    char chunk[256];
    ssize_t n;
    while ((n = read(stderr_pipe, chunk, sizeof chunk)) > 0 || (n < 0 && errno == EINTR)) {
        size_t take = n > 0 && used + 1 < cap ? (size_t)n : 0;
        if (take > cap - 1 - used) take = cap - 1 - used;
        memcpy(said + used, chunk, take);
        used += take;
    }
    said[used] = '\0';
    while (used > 0 && (said[used - 1] == '\n' || said[used - 1] == ' ')) said[--used] = '\0';
    close(stderr_pipe);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return status;
}

static int run(const char *const argv[], char *said, size_t cap, int *spawn_error)
{
    pid_t pid = -1;
    int stderr_pipe = -1;
    said[0] = '\0';
    *spawn_error = spawn(argv, &pid, &stderr_pipe);
    return *spawn_error ? -1 : finish(pid, stderr_pipe, said, cap);
}

pipert_result pt_run_command(const char *const argv[])
{
    char said[STDERR_KEPT], command[512];
    int spawn_error;
    int status = run(argv, said, sizeof said, &spawn_error);
    if (status == 0) return PIPERT_OK;
    join_argv(argv, command, sizeof command);
    if (spawn_error)
        return pt_fail(PIPERT_ERR_IO, "cannot run '%s': %s%s", command, strerror(spawn_error),
                       spawn_error == ENOENT ? " (not installed? scripts/deps.sh installs it)" : "");
    if (status < 0 || !WIFEXITED(status))
        return pt_fail(PIPERT_ERR_IO, "'%s' did not finish normally", command);
    return pt_fail(PIPERT_ERR_IO, "'%s' failed (exit %d)%s%s", command, WEXITSTATUS(status),
                   said[0] ? ": " : "", said);
}

bool pt_command_succeeds(const char *const argv[])
{
    char said[STDERR_KEPT];
    int spawn_error;
    return run(argv, said, sizeof said, &spawn_error) == 0;
}
