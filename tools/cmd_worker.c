/* pipert worker: one process of a multi-worker job, started by `pipert
 * launch`, srun or mpirun (docs/RUNNING.md): a session (include/pipert)
 * whose rank comes from the launcher's environment, run step by step, with
 * the signals and the printing a command owns.
 *
 * Exit status: 0 done; 1 this rank failed (the session told the job why);
 * 2 usage error; 3 stopped because the job aborted (another rank failed);
 * 4 the coordinator (pipert launch) died: every rank stopped after the same
 * step with a complete checkpoint of it ("coordinator lost: checkpoint of step
 * N written; resume with --resume").
 */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipert/pipert.h"
#include "comm/bootstrap.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/units.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/link_probe.h"
#include "tools/progress.h"
#include "tools/worker_exit.h"


static pipert_session *volatile running_session;

static void request_stop(int signal_number)
{
    (void)signal_number;
    pipert_session_stop(running_session);
}

/* TEST HOOK (tests/test_launch.c; not for production): with
 * PIPERT_TEST_DIE_AT_STEP=N in the environment, rank PIPERT_TEST_DIE_RANK
 * (default 1) kills itself with SIGKILL at the start of step N, before that
 * step's computation and its coupling: a crash the job must notice. */
static void test_hook_die_at_step(const pipert_metrics *m)
{
    const char *at = getenv("PIPERT_TEST_DIE_AT_STEP");
    const char *rank = getenv("PIPERT_TEST_DIE_RANK");
    if (!at || atol(at) != m->step + 1 || (rank ? atoi(rank) : 1) != m->rank) return;
    pt_warn("test hook PIPERT_TEST_DIE_AT_STEP: rank %d raises SIGKILL at step %ld", m->rank,
            m->step + 1);
    fflush(NULL);
    raise(SIGKILL);
}

static bool every(long step, long period) { return period > 0 && step % period == 0; }

/* The rank with the loss prints a line every train.log_every steps. */
static void print_step(pt_progress *progress, const pipert_metrics *m, long log_every)
{
    if (m->stage != m->stages - 1 || m->replica != 0) return;
    if (!every(m->step, log_every) && !m->done) return;
    char text[192];
    snprintf(text, sizeof text, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | staleness %.2f",
             m->step, m->total_steps, (double)m->loss, m->lr, m->tokens_per_s, m->staleness);
    pt_progress_update(progress, text, true);
    if (m->done && !isnan(m->val_loss))
        pt_progress_print(progress, "step %ld | val_loss %.4f", m->step, (double)m->val_loss);
}

static pipert_result run_steps(pipert_session *s, pt_progress *progress, long log_every,
                               pipert_metrics *m)
{
    m->size = sizeof *m;
    PT_TRY(pipert_session_metrics(s, m));
    while (!m->done) {
        test_hook_die_at_step(m);
        PT_TRY(pipert_session_step(s, m));
        print_step(progress, m, log_every);
    }
    pt_progress_finish(progress);
    return PIPERT_OK;
}

/* --probe: tools/link_probe.h instead of a session. */
static int probe_links(pipert_config *cfg, const char *out_dir)
{
    double expected = 0;
    if (cfg->wan.bandwidth[0] &&
        pt_parse_bit_rate(cfg->wan.bandwidth, "wan.bandwidth", &expected) != PIPERT_OK)
        expected = 0;
    pipert_config_free(cfg);
    if (pt_link_probe_worker(out_dir, expected) == PIPERT_OK) return 0;
    fprintf(stderr, "pipert worker: error: %s\n", pipert_last_error());
    return EXIT_RANK_FAILED;
}

static char last_error[2048];

/* The exit status of a worker that stopped with `rc`, its error in last_error. A rank the job
 * told to stop (another rank failed, or its replica left an elastic job) exits
 * EXIT_JOB_ABORTED whichever error it met first (a receive its peer's death cut short), and
 * says the job's reason first; so does a joiner whose replica could not get back in (the job
 * ended first, a partner died while joining). */
static int exit_status(pipert_session *s, pipert_result rc, bool join)
{
    char symptom[1024];
    snprintf(symptom, sizeof symptom, "%s", pipert_last_error());
    snprintf(last_error, sizeof last_error, "%s", symptom);
    if (rc == PIPERT_ERR_COORDINATOR_LOST) return EXIT_COORDINATOR_LOST;
    const bool told = rc == PIPERT_ERR_PEER || rc == PIPERT_ERR_INTERRUPTED ||
                      rc == PIPERT_ERR_TRANSPORT || rc == PIPERT_ERR_TIMEOUT;
    if (join && !s && rc == PIPERT_ERR_PEER) return EXIT_JOB_ABORTED;
    if (!told || !s || pipert_session_async_error(s) == PIPERT_OK) return EXIT_RANK_FAILED;
    if (strcmp(pipert_last_error(), symptom) != 0)
        snprintf(last_error, sizeof last_error, "%s (here: %s)", pipert_last_error(), symptom);
    return EXIT_JOB_ABORTED;
}

int pt_cmd_worker(int argc, char **argv)
{
    const char *out_dir = NULL, *stages_text = "1", *rank_text = NULL, *world_text = NULL;
    bool quiet = false, resume = false, probe = false, join = false;
    const pt_cli_flag flags[] = {
        {"--out", "DIR", "the job's directory: the last stage of replica 0 writes metrics.jsonl "
                         "here; replica 0's stages write metrics-stage-N.jsonl and checkpoints "
                         "(required)", &out_dir, NULL},
        {"--stages", "S", "pipeline stages (the replicas are the world size / S)", &stages_text, NULL},
        {"--resume", NULL, "continue from the newest complete checkpoint in --out", NULL, &resume},
        {"--join", NULL, "take this rank's place in a running elastic job whose replica left: "
                         "its state comes from a live replica (pipert launch --restarts does this)",
         NULL, &join},
        {"--rank", "R", "with --join, under SLURM, Open MPI or PMI: the rank this replacement "
                        "takes when something else than the job's launcher starts it (by hand, "
                        "another srun or mpirun); PIPERT_COORD names the coordinator",
         &rank_text, NULL},
        {"--world", "W", "with --rank: the job's world size", &world_text, NULL},
        {"--quiet", NULL, "no progress lines", NULL, &quiet},
        {"--probe", NULL, "measure the links between the job's sites instead of training "
                          "(one worker per site; writes DIR/probe-rank-R.json)", NULL, &probe},
    };
    const pt_cli cli = {"worker", "[--config FILE] [--section.key=value ...] --out DIR [--resume]",
                        "One worker of a multi-worker job, started by pipert launch, srun or\n"
                        "mpirun: rank, world size and the coordinator come from the environment\n"
                        "(docs/RUNNING.md). Exits 0 when done, 1 when this rank failed, 3 when\n"
                        "the job was aborted because of another rank, 4 when the coordinator\n"
                        "died and every rank stopped with a checkpoint (continue with --resume).",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, NULL};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    pipert_session_options options = PIPERT_SESSION_OPTIONS_INIT;
    options.out_dir = out_dir;
    options.resume = resume;
    options.join = join;
    options.log_level = PIPERT_LOG_DEBUG; /* stderr, at PIPERT_LOG's level */
    const char *misuse = !out_dir ? "--out DIR is required"
                         : (rank_text || world_text) && !(rank_text && world_text && join)
                             ? "--rank and --world go together, with --join"
                             : NULL;
    if (misuse ||
        pt_cli_parse_int("--stages", stages_text, 1, PT_MAX_WORLD, 1, &options.stages) != PIPERT_OK ||
        (rank_text && (pt_cli_parse_int("--rank", rank_text, 0, PT_MAX_WORLD, 0,
                                        &options.join_rank) != PIPERT_OK ||
                       pt_cli_parse_int("--world", world_text, 2, PT_MAX_WORLD, 2,
                                        &options.join_world) != PIPERT_OK))) {
        pipert_config_free(cfg);
        fprintf(stderr, "pipert worker: %s\n", misuse ? misuse : pipert_last_error());
        return 2;
    }
    if (probe) return probe_links(cfg, out_dir);
    pt_progress progress;
    pt_progress_init(&progress, quiet);
    pipert_session *s = NULL;
    pipert_metrics m = {.size = sizeof m, .rank = -1};
    /* A worker belongs to a launched job: without a launcher it would train
     * alone, which is pipert train's business. */
    pt_bootstrap boot;
    extern char **environ;
    pipert_result rc = options.join_world > 0
                           ? pt_bootstrap_replacement(&boot, (const char *const *)environ,
                                                      options.join_rank, options.join_world)
                           : pt_bootstrap_from_env(&boot, (const char *const *)environ);
    if (rc == PIPERT_OK) rc = pipert_session_create(cfg, &options, &s);
    if (rc == PIPERT_OK) {
        running_session = s;
        struct sigaction action = {.sa_handler = request_stop};
        sigaction(SIGINT, &action, NULL);
        sigaction(SIGTERM, &action, NULL);
        rc = run_steps(s, &progress, cfg->train.log_every, &m);
    }
    int status = 0;
    if (rc != PIPERT_OK) {
        status = exit_status(s, rc, join);
        if (m.rank >= 0) fprintf(stderr, "pipert worker [rank %d]: error: %s\n", m.rank, last_error);
        else fprintf(stderr, "pipert worker: error: %s\n", last_error);
    } else if (!quiet) {
        if (m.stage == m.stages - 1) printf("rank %d done: %ld steps, final loss %.4f\n", m.rank, m.step, (double)m.loss);
        else printf("rank %d done: %ld steps\n", m.rank, m.step);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    running_session = NULL;
    pipert_session_destroy(s);
    pipert_config_free(cfg);
    return status;
}
