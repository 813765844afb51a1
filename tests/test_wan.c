/* The wide-area test bed (tools/wan/): `pipert launch --sites N` with
 * emulated links, and `pipert probe --sites N`. Real namespaces, real tc, real
 * TCP through the relay, real processes; faults from outside (ip link down,
 * SIGKILL). Needs root and /dev/net/tun: skipped, saying why, without them. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/clock.h"
#include "runtime/fileio.h"
#include "tests/command.h"

extern char **environ;

#define SMALL_MODEL "--model.n_layer=1 --model.n_embd=64 --model.n_head=1 --runtime.threads=1"
#define MAX_NAMESPACES 256

static void require_test_bed(void)
{
    if (geteuid() != 0) cr_skip_test("the emulated sites need root (network namespaces)");
    if (access("/dev/net/tun", R_OK | W_OK) != 0) cr_skip_test("no /dev/net/tun");
}

/* ---- the namespaces pipert made ----------------------------------------- */

typedef struct namespace_set {
    int n;
    char names[MAX_NAMESPACES][256];
} namespace_set;

static void list_namespaces(namespace_set *set)
{
    set->n = 0;
    DIR *dir = opendir("/run/netns");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir)) && set->n < MAX_NAMESPACES)
        if (!strncmp(e->d_name, "pipert-", 7))
            snprintf(set->names[set->n++], sizeof set->names[0], "%s", e->d_name);
    closedir(dir);
}

static bool contains(const namespace_set *set, const char *name)
{
    for (int i = 0; i < set->n; i++)
        if (!strcmp(set->names[i], name)) return true;
    return false;
}

/* The namespaces that exist now and were not in `before`. */
static int new_namespaces(const namespace_set *before, namespace_set *added)
{
    namespace_set now;
    list_namespaces(&now);
    added->n = 0;
    for (int i = 0; i < now.n; i++)
        if (!contains(before, now.names[i])) memcpy(added->names[added->n++], now.names[i], sizeof now.names[i]);
    return added->n;
}

static void expect_nothing_left(const namespace_set *before, const char *after_what)
{
    namespace_set added;
    cr_expect_eq(new_namespaces(before, &added), 0, "%s left %d namespace(s), e.g. %s", after_what,
                 added.n, added.n ? added.names[0] : "");
}

/* ---- a launch in the background ------------------------------------------------ */

typedef struct background {
    pid_t pid;
    char out[600];
} background;

static void start_background(background *b, const char *dir, const char *args)
{
    char command[4096];
    snprintf(b->out, sizeof b->out, "%s/launch.out", dir);
    /* info: the workers' logs carry what tests read (their parameters' checksum at the end) */
    snprintf(command, sizeof command, "PIPERT_LOG=info exec %s launch --out %s %s >%s 2>&1",
             pipert_bin(), dir, args, b->out);
    const char *argv[] = {"sh", "-c", command, NULL};
    cr_assert_eq(posix_spawn(&b->pid, "/bin/sh", NULL, NULL, (char *const *)argv, environ), 0);
}

static int wait_background(background *b)
{
    int status;
    cr_assert_eq(waitpid(b->pid, &status, 0), b->pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Lines in DIR/metrics-stage-0.jsonl: the steps stage 0 of replica 0 logged. */
static int logged_steps(const char *dir)
{
    char path[600], *text;
    size_t size;
    snprintf(path, sizeof path, "%s/metrics-stage-0.jsonl", dir);
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return 0;
    int lines = 0;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    free(text);
    return lines;
}

static void wait_for_steps(const char *dir, int steps, double timeout_s)
{
    const double deadline = pt_now_s() + timeout_s;
    while (logged_steps(dir) < steps) {
        cr_assert_lt(pt_now_s(), deadline, "%s: fewer than %d steps after %.0f s", dir, steps,
                     timeout_s);
        usleep(50000);
    }
}

static bool file_contains(const char *path, const char *needle)
{
    char *text;
    size_t size;
    if (pt_read_file(path, &text, &size) != PIPERT_OK) return false;
    bool found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

/* The parameters' checksum a worker's log gives when it finished ("… checksum HEX"); 0: none. */
static unsigned long long final_checksum(const char *log)
{
    char *text;
    size_t size;
    if (pt_read_file(log, &text, &size) != PIPERT_OK) return 0;
    const char *line = strstr(text, "finished step ");
    const char *sum = line ? strstr(line, "checksum ") : NULL;
    const unsigned long long value = sum ? strtoull(sum + strlen("checksum "), NULL, 16) : 0;
    free(text);
    return value;
}

static void set_link(const char *namespace_name, const char *state)
{
    char command[256];
    snprintf(command, sizeof command, "ip -n %s link set wan0 %s", namespace_name, state);
    cr_assert_eq(system(command), 0, "%s", command);
}

/* ---- the links are what was asked ---------------------------------------------- */

/* How far below the asked rate a probe may measure. The kernel's shaping caps the rate
 * (the upper bound, 110%, holds everywhere); how close the launcher's user-space relay
 * comes to it is CPU speed, a benchmark (BENCHMARKS.md). In a sanitizer build the relay
 * itself is instrumented: CI's sanitized run measured 66% of 200 Mbit/s once (132.8),
 * so there the floor only proves the shaping is the one asked, not the relay's speed. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PIPERT_TEST_SANITIZED 1 /* clang's spelling */
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(PIPERT_TEST_SANITIZED)
static const double RELAY_FLOOR_SCALE = 0.6;
#else
static const double RELAY_FLOOR_SCALE = 1.0;
#endif

/* The probe's rows against what was asked: round trips within 10%, rates within
 * [low, 1.1] of the asked rate (the shaping caps it; how close it comes is a benchmark,
 * BENCHMARKS.md, since the relay is a user-space thread on the workers' cores). */
static void expect_probe_agrees(const char *bandwidth, double bits_per_s, const char *latency,
                                double latency_s, double low)
{
    char *dir = make_temp_dir(), json[600];
    snprintf(json, sizeof json, "%s/links.json", dir);
    run_pipert_ok("probe --sites 2 --wan.bandwidth=%s --wan.latency=%s --json %s", bandwidth,
                  latency, json);
    json_error_t error;
    json_t *rows = json_load_file(json, 0, &error);
    cr_assert_not_null(rows, "%s: %s", json, error.text);
    cr_assert_eq(json_array_size(rows), 2, "one row per direction");
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        double rtt = json_number_value(json_object_get(row, "rtt_s"));
        double rate = json_number_value(json_object_get(row, "bits_per_s"));
        cr_expect(fabs(rtt - 2 * latency_s) <= 0.1 * 2 * latency_s,
                  "%s, %s: round trip %.2f ms, asked %.2f ms", bandwidth, latency, rtt * 1e3,
                  2 * latency_s * 1e3);
        low *= RELAY_FLOOR_SCALE;
        cr_expect(rate >= low * bits_per_s && rate <= 1.1 * bits_per_s,
                  "%s, %s: bandwidth %.1f Mbit/s, asked %.1f Mbit/s (accepted %.0f%%..110%%)",
                  bandwidth, latency, rate / 1e6, bits_per_s / 1e6, 100 * low);
    }
    json_decref(rows);
    remove_dir(dir);
}

Test(wan, probe_measures_what_was_asked, .timeout = 240)
{
    require_test_bed();
    namespace_set before;
    list_namespaces(&before);
    /* Under load (a sanitizer build, other jobs) the relay fell to 86% at 100 Mbit/s once:
     * the test asks for the shaping, BENCHMARKS.md records how close it comes. */
    expect_probe_agrees("100mbit", 1e8, "10ms", 0.010, 0.75);
    /* At 1 Gbit/s this 2-core VM's relay gave 70-98% (session 3: 97%; this one: 70-95%). Each
     * rate and each latency once (the four pairs took 29 s; BENCHMARKS.md has the others). */
    expect_probe_agrees("1gbit", 1e9, "50ms", 0.050, 0.5);
    expect_nothing_left(&before, "pipert probe");
}

/* Links per ordered pair from a cluster file, each its own. */
Test(wan, probe_measures_a_cluster_files_links, .timeout = 120)
{
    require_test_bed();
    char *dir = make_temp_dir(), cluster[600], json[600];
    snprintf(cluster, sizeof cluster, "%s/cluster.json", dir);
    snprintf(json, sizeof json, "%s/links.json", dir);
    const char *text =
        "{\"sites\": [{\"name\": \"near\"}, {\"name\": \"far\"}],\n"
        " \"links\": [{\"from\": \"near\", \"to\": \"far\", \"bandwidth\": \"200mbit\", "
        "\"latency\": \"5ms\"},\n"
        "           {\"from\": \"far\", \"to\": \"near\", \"bandwidth\": \"50mbit\", "
        "\"latency\": \"25ms\"}]}\n";
    cr_assert_eq(pt_write_file_atomic(cluster, text, strlen(text)), PIPERT_OK);
    run_pipert_ok("probe --cluster %s --json %s", cluster, json);
    json_t *rows = json_load_file(json, 0, NULL);
    cr_assert_eq(json_array_size(rows), 2);
    const double asked_rate[2] = {200e6, 50e6}; /* near -> far, far -> near */
    for (size_t i = 0; i < 2; i++) {
        json_t *row = json_array_get(rows, i);
        int from = (int)json_integer_value(json_object_get(row, "from"));
        double rtt = json_number_value(json_object_get(row, "rtt_s"));
        double rate = json_number_value(json_object_get(row, "bits_per_s"));
        cr_expect(fabs(rtt - 0.030) <= 0.003, "round trip %.2f ms, asked 30 ms", rtt * 1e3);
        /* each direction its own link (4x apart); within 75%..110% of it (the relay's
         * accuracy under load is a benchmark; sanitized: 45%, still 1.8x the other link) */
        const double low = 0.75 * RELAY_FLOOR_SCALE;
        cr_expect(rate >= low * asked_rate[from] && rate <= 1.1 * asked_rate[from],
                  "from site %d: %.1f Mbit/s, asked %.1f (accepted %.0f%%..110%%)", from,
                  rate / 1e6, asked_rate[from] / 1e6, 100 * low);
    }
    json_decref(rows);
    remove_dir(dir);
}

/* ---- plans ------------------------------------------------------------------------ */

/* launch --plan with a pipeline spanning two emulated sites: every rank in
 * the site the plan says, the plan's split, and all of the activations and
 * gradients between the stages counted as traffic between sites. */
Test(wan, a_plan_puts_a_pipeline_across_two_sites, .timeout = 120)
{
    require_test_bed();
    char *dir = make_temp_dir(), cluster[300], plan[300], run[300];
    snprintf(cluster, sizeof cluster, "%s/cluster.json", dir);
    snprintf(plan, sizeof plan, "%s/plan.json", dir);
    snprintf(run, sizeof run, "%s/run", dir);
    const char *cluster_text = "{\"sites\": [{\"name\": \"a\"}, {\"name\": \"b\"}],"
                               " \"default_link\": {\"bandwidth\": \"100mbit\", \"latency\": \"5ms\"}}";
    const char *plan_text =
        "{\"format\": \"pipert-plan-1\", \"cluster\": \"cluster.json\", \"stages\": 2,"
        " \"replicas\": 1, \"layers\": \"1,2\", \"placement\": [[{\"site\": \"b\"}, {\"site\": \"a\"}]],"
        " \"config\": {\"model\": {\"n_layer\": 3, \"n_embd\": 32, \"n_head\": 2, \"block_size\": 32},"
        " \"train\": {\"batch_size\": 4, \"steps\": 4, \"log_every\": 1, \"val_batches\": 2}}}";
    cr_assert_eq(pt_write_file_atomic(cluster, cluster_text, strlen(cluster_text)), PIPERT_OK);
    cr_assert_eq(pt_write_file_atomic(plan, plan_text, strlen(plan_text)), PIPERT_OK);
    run_pipert_ok_info("launch --plan %s --out %s", plan, run);
    char log[700];
    snprintf(log, sizeof log, "%s/logs/rank-0.log", run);
    cr_expect(file_contains(log, "blocks [0, 1)"), "stage 0 does not run the plan's block 0");
    double site[4], wan[4];
    cr_assert_eq(read_metric_steps(run, "metrics-stage-0.jsonl", "bytes_site", site, 4), 4);
    cr_assert_eq(read_metric_steps(run, "metrics-stage-0.jsonl", "bytes_wan", wan, 4), 4);
    for (int i = 0; i < 4; i++) /* the last step only waits for a gradient: it sends nothing */
        cr_expect(site[i] == 0 && (wan[i] > 0 || i == 3), "step %d: %g bytes inside the site, %g "
                  "between the sites", i + 1, site[i], wan[i]);
    remove_dir(dir);
}

/* ---- every method trains over a shaped link -------------------------------------- */

Test(wan, every_method_trains_between_two_sites, .timeout = 600)
{
    require_test_bed();
    namespace_set before;
    list_namespaces(&before);
    const char *methods[] = {"allreduce", "sparse --dp.compress=e3m0", "diloco --dp.period=3",
                             "streaming-diloco --dp.period=4 --dp.compress=e3m0", "co2 --dp.period=3"};
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
        char *dir = make_temp_dir();
        run_pipert_ok("launch --quiet --stages 1 --replicas 2 --sites 2 --out %s "
                      "--wan.bandwidth=100mbit --wan.latency=10ms --dp.method=%s " SMALL_MODEL
                      " --train.steps=8 --train.log_every=1 --train.val_every=0",
                      dir, methods[m]);
        double bytes[8] = {0}, loss[8] = {0};
        cr_expect_eq(read_metric_steps(dir, "metrics-stage-0.jsonl", "dp_bytes", bytes, 8), 8, "%s",
                     methods[m]);
        cr_expect_eq(read_metric_steps(dir, "metrics.jsonl", "loss", loss, 8), 8, "%s", methods[m]);
        double sent = 0;
        for (int s = 0; s < 8; s++) sent += bytes[s];
        cr_expect_gt(sent, 0, "%s: nothing crossed between the sites", methods[m]);
        cr_expect(isfinite(loss[7]) && loss[7] < loss[0], "%s: loss %.4f -> %.4f", methods[m],
                  loss[0], loss[7]);
        remove_dir(dir);
    }
    expect_nothing_left(&before, "a finished job");
}

/* ---- a link down for 5 s ---------------------------------------------------------- */

typedef struct outage {
    int steps_at_down, steps_at_up, status;
    bool logged_wait, logged_resume;
} outage;

/* Runs `method` between two sites and takes site 1's link down for 5 s once
 * stage 0 has logged 10 steps. The link is fast (1 Gbit/s, 1 ms): what is tested is the
 * outage, and at 100 Mbit/s and 10 ms the steps around it took 30 s of the test's 35-40. The
 * model's steps (~0.1 s) stay long enough that allreduce's steps between reading the count
 * and the link going down are few. */
static outage run_with_outage(const char *method, int steps)
{
    require_test_bed();
    namespace_set before, added;
    list_namespaces(&before);
    char *dir = make_temp_dir(), args[1024];
    snprintf(args, sizeof args,
             "--stages 1 --replicas 2 --sites 2 --wan.bandwidth=1gbit --wan.latency=1ms "
             "--dp.method=%s --model.n_layer=2 --runtime.threads=1 --train.steps=%d "
             "--train.log_every=1 --train.val_every=0",
             method, steps);
    background b;
    start_background(&b, dir, args);
    wait_for_steps(dir, 10, 120);
    cr_assert_eq(new_namespaces(&before, &added), 2, "two sites, two namespaces");
    const char *site1 = strstr(added.names[0], "-s1") ? added.names[0] : added.names[1];
    outage o = {.steps_at_down = logged_steps(dir)};
    set_link(site1, "down");
    sleep(5);
    o.steps_at_up = logged_steps(dir);
    set_link(site1, "up");
    o.status = wait_background(&b);
    char log[700];
    snprintf(log, sizeof log, "%s/logs/rank-0.log", dir);
    o.logged_wait = file_contains(log, "waiting for the replicas");
    o.logged_resume = file_contains(log, "the replicas answered after");
    cr_expect_eq(logged_steps(dir), steps, "%s: every step ran", method);
    remove_dir(dir);
    expect_nothing_left(&before, "a job whose link went down");
    return o;
}

Test(wan, async_method_keeps_computing_while_the_link_is_down, .timeout = 300)
{
    outage o = run_with_outage("sparse", 150);
    cr_expect_eq(o.status, 0, "the job recovers");
    /* It runs until its queue of exchanges in flight is full (dp/sparse.c: 16 with dp.delay =
     * −1): 14 steps on a quiet machine; 6 in a loaded suite, whose replicas had drifted apart,
     * so that more were in flight when the link went down. allreduce takes at most 2. */
    cr_expect_geq(o.steps_at_up - o.steps_at_down, 3,
                  "sparse ran %d steps during the 5 s outage: it should keep computing",
                  o.steps_at_up - o.steps_at_down);
    /* It logs a wait only if the outage outlasted its exchanges in flight (a
     * slower build may not get that far); a logged wait is logged to its end. */
    cr_expect(!o.logged_wait || o.logged_resume, "a logged wait is logged to its end");
}

/* ---- a site cut off for 20 s, elastic replicas ----------------------------------------- */

/* Steps of SMALL_MODEL that one worker takes in about `seconds` on this machine and build
 * (the rate of steps 21..200 of a timed run), at least `floor`. */
static int steps_lasting(double seconds, int floor)
{
    enum { TIMED = 200, SKIPPED = 20 };
    char *dir = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " SMALL_MODEL " --train.steps=%d --train.log_every=1 "
                  "--train.val_every=0", dir, TIMED);
    double elapsed[TIMED];
    cr_assert_geq(read_metric_steps(dir, "metrics.jsonl", "elapsed_s", elapsed, TIMED), TIMED);
    remove_dir(dir);
    const double rate = (TIMED - SKIPPED) / (elapsed[TIMED - 1] - elapsed[SKIPPED - 1]);
    const double steps = rate * seconds; /* NaN or infinite from a clock that did not move */
    if (!isfinite(steps) || steps <= floor) return floor;
    return steps < 30000 ? (int)steps : 30000;
}

/* Site 1's link goes down for 20 s under --min-replicas 1 and a heartbeat
 * timeout of 6 s: the coordinator (in site 0) takes replica 1 out, site 0
 * trains on alone meanwhile (allreduce, which would otherwise wait for the
 * link); when the link is back the cut-off worker hears that its replica left
 * and stops, the launcher starts it again (--restarts 1), it rejoins with site
 * 0's state, and the job finishes with exit 0, both sites bitwise equal. */
Test(wan, a_cut_off_site_leaves_an_elastic_job_and_rejoins, .timeout = 600)
{
    require_test_bed();
    namespace_set before, added;
    list_namespaces(&before);
    /* enough steps that the job is still running when site 1, back after 20 s, has restarted
     * and rejoined (seconds): ~35 s of one worker alone, timed on this machine and build (a fixed
     * 3000, ~46 s at 65 steps/s, ended before the rejoin on a faster machine). The link is fast
     * (1 Gbit/s, 1 ms): the steps both sites take together, before the cut and after the rejoin,
     * then cost little more than one worker's (at 100 Mbit/s and 10 ms each all-reduce took
     * ~40 ms, and the test four minutes); the cut and the rejoin do not depend on the link. */
    const int steps = steps_lasting(35.0, 3000);
    char *dir = make_temp_dir();
    char args[1024];
    snprintf(args, sizeof args,
             "--stages 1 --replicas 2 --sites 2 --min-replicas 1 --restarts 1 --heartbeat-timeout 6 "
             "--wan.bandwidth=1gbit --wan.latency=1ms --dp.method=allreduce " SMALL_MODEL
             " --train.steps=%d --train.log_every=1 --train.val_every=0",
             steps);
    background b;
    start_background(&b, dir, args);
    wait_for_steps(dir, 10, 120);
    cr_assert_eq(new_namespaces(&before, &added), 2, "two sites, two namespaces");
    const char *site1 = strstr(added.names[0], "-s1") ? added.names[0] : added.names[1];
    const int at_down = logged_steps(dir);
    set_link(site1, "down");
    sleep(20);
    const int at_up = logged_steps(dir);
    set_link(site1, "up");
    const int status = wait_background(&b);
    char out[700], log0[700], log1[700];
    snprintf(out, sizeof out, "%s/launch.out", dir);
    snprintf(log0, sizeof log0, "%s/logs/rank-0.log", dir);
    snprintf(log1, sizeof log1, "%s/logs/rank-1.log", dir);
    cr_expect_eq(status, 0, "the job finishes with the site that stayed");
    cr_expect(at_up - at_down >= 10 || at_up == steps,
              "site 0 ran %d steps while site 1 was cut off: it should train on alone",
              at_up - at_down);
    cr_expect_eq(logged_steps(dir), steps, "every step ran");
    cr_expect(file_contains(out, "replica 1 leaves the job: rank 1"), "the coordinator names it");
    cr_expect(file_contains(log0, "the coupling resumes over 1 replica"),
              "site 0 regrouped without site 1");
    cr_expect(file_contains(log1, "replica 1 left the job"),
              "the cut-off worker heard, once the link was back, that its replica left");
    cr_expect(file_contains(out, "replica 1 rejoins the job"), "the coordinator let it back in");
    cr_expect(file_contains(log1, "replica 1 is back in the job"), "site 1 took site 0's state");
    cr_expect(file_contains(log0, "the coupling resumes over 2 replicas"), "and both train on");
    const unsigned long long sum0 = final_checksum(log0), sum1 = final_checksum(log1);
    cr_expect(sum0 != 0 && sum0 == sum1, "allreduce: both sites end bitwise equal (%016llx, %016llx)",
              sum0, sum1);
    remove_dir(dir);
    expect_nothing_left(&before, "an elastic job whose site was cut off");
}

Test(wan, allreduce_waits_for_the_link_and_resumes, .timeout = 300)
{
    outage o = run_with_outage("allreduce", 60);
    cr_expect_eq(o.status, 0, "the job recovers");
    cr_expect_leq(o.steps_at_up - o.steps_at_down, 2,
                  "allreduce ran %d steps during the outage: it should wait",
                  o.steps_at_up - o.steps_at_down);
    cr_expect(o.logged_wait && o.logged_resume, "the wait and its end are logged");
}

/* ---- nothing left behind --------------------------------------------------------- */

static pid_t read_worker_pid(const char *dir, int rank)
{
    char path[600];
    snprintf(path, sizeof path, "%s/workers.pid", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    int r, pid = -1;
    while (fscanf(f, "%d %d", &r, &pid) == 2 && r != rank) pid = -1;
    fclose(f);
    return pid;
}

Test(wan, namespaces_go_when_a_worker_is_killed, .timeout = 120)
{
    require_test_bed();
    namespace_set before;
    list_namespaces(&before);
    char *dir = make_temp_dir();
    background b;
    start_background(&b, dir, "--stages 1 --replicas 2 --sites 2 --wan.bandwidth=1gbit "
                              "--model.n_layer=2 --runtime.threads=1 --train.steps=100000 "
                              "--train.log_every=1");
    wait_for_steps(dir, 3, 120);
    pid_t victim = read_worker_pid(dir, 1);
    cr_assert_gt(victim, 0);
    kill(victim, SIGKILL);
    cr_expect_eq(wait_background(&b), 1, "a killed worker fails the job");
    cr_expect(file_contains(b.out, "rank 1 (stage 0, replica 1) failed: killed by signal 9"),
              "the launcher names the killed rank");
    remove_dir(dir);
    expect_nothing_left(&before, "a job whose worker was killed");
}

Test(wan, a_killed_launchers_namespaces_are_removed_by_the_next, .timeout = 120)
{
    require_test_bed();
    namespace_set before, added;
    list_namespaces(&before);
    char *dir = make_temp_dir();
    background b;
    start_background(&b, dir, "--stages 1 --replicas 2 --sites 2 --wan.bandwidth=1gbit "
                              "--model.n_layer=2 --runtime.threads=1 --train.steps=100000 "
                              "--train.log_every=1");
    wait_for_steps(dir, 3, 120);
    kill(b.pid, SIGKILL);
    wait_background(&b);
    cr_assert_eq(new_namespaces(&before, &added), 2, "SIGKILL leaves the two namespaces behind");
    /* The workers die with their launcher (PR_SET_PDEATHSIG); the next test
     * bed removes what the dead launcher left. */
    run_pipert_ok("probe --sites 2 --wan.bandwidth=1gbit --wan.latency=1ms");
    expect_nothing_left(&before, "a launch after a killed one");
    remove_dir(dir);
}

/* A control file of the kernel (its size says 0: read it to the end), into text[capacity]. */
static bool read_control(const char *path, char *text, size_t capacity)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(text, 1, capacity - 1, f);
    text[n] = '\0';
    fclose(f);
    return true;
}

/* The number in a control file (after `key`, when given), or -1. */
static long read_number(const char *path, const char *key)
{
    char text[4096];
    if (!read_control(path, text, sizeof text)) return -1;
    const char *at = key ? strstr(text, key) : text;
    return at ? strtol(at + (key ? strlen(key) : 0), NULL, 10) : -1;
}

static bool control_contains(const char *path, const char *needle)
{
    char text[65536];
    return read_control(path, text, sizeof text) && strstr(text, needle);
}

/* A cluster file whose site b has devices of a quarter of site a's FLOP/s: b's worker runs in a
 * cgroup of its own limited to 25% of its core by the kernel's CPU bandwidth control (and the
 * kernel throttles it), a's in none; the cgroup goes with the job. */
Test(wan, a_slower_site_gets_less_cpu_time, .timeout = 180)
{
    require_test_bed();
    if (access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", R_OK) != 0)
        cr_skip_test("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu");
    char *dir = make_temp_dir(), cluster[600], a_group[700], b_group[700], args[1000];
    snprintf(cluster, sizeof cluster, "%s/cluster.json", dir);
    const char *text =
        "{\"sites\": [{\"name\": \"a\", \"groups\": [{\"name\": \"cpu\", \"kind\": \"cpu\", "
        "\"count\": 1, \"fp32_flops\": 4e10, \"memory\": \"1gib\"}]},"
        " {\"name\": \"b\", \"groups\": [{\"name\": \"cpu\", \"kind\": \"cpu\", \"count\": 1, "
        "\"fp32_flops\": 1e10, \"memory\": \"1gib\"}]}],"
        " \"links\": [{\"between\": [\"a\", \"b\"], \"bandwidth\": \"1gbit\", \"latency\": \"1ms\"}]}";
    cr_assert_eq(pt_write_file_atomic(cluster, text, strlen(text)), PIPERT_OK);
    snprintf(args, sizeof args, "--cluster %s --stages 1 --replicas 2 --dp.method=none "
             SMALL_MODEL " --train.steps=100000 --train.log_every=1", cluster);
    background b;
    start_background(&b, dir, args);
    wait_for_steps(dir, 3, 120);
    snprintf(a_group, sizeof a_group, "/sys/fs/cgroup/cpu/pipert-%d-s0", (int)b.pid);
    snprintf(b_group, sizeof b_group, "/sys/fs/cgroup/cpu/pipert-%d-s1", (int)b.pid);
    char quota[800], period[800], procs[800], stat[800];
    snprintf(quota, sizeof quota, "%s/cpu.cfs_quota_us", b_group);
    snprintf(period, sizeof period, "%s/cpu.cfs_period_us", b_group);
    snprintf(procs, sizeof procs, "%s/cgroup.procs", b_group);
    snprintf(stat, sizeof stat, "%s/cpu.stat", b_group);
    const long q = read_number(quota, NULL), p = read_number(period, NULL);
    cr_expect(p > 0 && q * 4 == p, "site b's quota %ld us per %ld us, expected a quarter", q, p);
    char pid_text[32];
    snprintf(pid_text, sizeof pid_text, "%d\n", (int)read_worker_pid(dir, 1));
    cr_expect(control_contains(procs, pid_text), "site b's worker (rank 1) is not in %s", procs);
    snprintf(pid_text, sizeof pid_text, "%d\n", (int)read_worker_pid(dir, 0));
    cr_expect_not(control_contains(procs, pid_text), "site a's worker is limited too");
    cr_expect_neq(access(a_group, F_OK), 0, "site a, the fastest, got a cgroup");
    usleep(500 * 1000);
    cr_expect_gt(read_number(stat, "nr_throttled "), 0, "the kernel never throttled site b");
    kill(b.pid, SIGTERM);
    wait_background(&b);
    cr_expect_neq(access(b_group, F_OK), 0, "%s outlived its job", b_group);
    remove_dir(dir);
}

Test(wan, refused_without_root_or_without_sites)
{
    require_test_bed();
    run_result r = run_pipert("launch --stages 1 --replicas 2 --wan.bandwidth=100mbit");
    cr_expect_eq(r.status, 2);
    cr_expect(strstr(r.err, "--sites N with N >= 2"), "%s", r.err);
    r = run_pipert("launch --stages 1 --replicas 2 --sites 2 --wan.latency=10ms");
    cr_expect_eq(r.status, 2);
    cr_expect(strstr(r.err, "needs wan.bandwidth"), "%s", r.err);
    r = run_pipert("launch --stages 1 --replicas 2 --sites 2 --wan.bandwidth=fast");
    cr_expect_neq(r.status, 0);
    cr_expect(strstr(r.err, "wan.bandwidth: expected a positive bit rate"), "%s", r.err);
    /* as an unprivileged user (setpriv from util-linux drops root) */
    char *dir = make_temp_dir();
    chmod(dir, 0777);
    r = run_pipert_with("setpriv --reuid=65534 --regid=65534 --clear-groups",
                        "launch --quiet --stages 1 --replicas 2 --sites 2 --out %s/job "
                        "--wan.bandwidth=100mbit",
                        dir);
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "need root"), "%s", r.err);
    remove_dir(dir);
}
