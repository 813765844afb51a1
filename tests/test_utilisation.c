/* pipeline/utilisation.h: the meter of a step's wall time, around a real
 * sleep, a real busy loop and a busy loop sharing its core with another
 * process (what the CPU-time definition is for), with bounds loose enough for
 * a loaded machine. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/utilisation.h"
#include "runtime/clock.h"

static void sleep_s(double seconds)
{
    struct timespec ts = {0, (long)(seconds * 1e9)};
    nanosleep(&ts, NULL);
}

static void spin_s(double seconds)
{
    const double end = pt_now_s() + seconds;
    volatile double x = 1;
    while (pt_now_s() < end) x = x * 1.0000001 + 1e-9;
}

static void expect_at_most_one(pt_utilisation u)
{
    const double sum = u.compute + u.wait_pipeline + u.wait_coupling;
    cr_expect_leq(sum, 1.0 + 1e-12, "the shares sum to %.12g", sum);
}

/* A sleep inside a pipeline wait is waiting, not computing. */
Test(utilisation, a_wait_is_not_compute)
{
    pt_utilisation_meter m;
    pt_utilisation_start(&m, NULL);
    const pt_utilisation_mark mark = pt_utilisation_mark_now();
    sleep_s(0.05);
    pt_utilisation_add_pipeline_wait(&m, mark);
    pt_utilisation u = pt_utilisation_finish(&m, NULL, 1);
    cr_expect_gt(u.wait_pipeline, 0.8, "pipeline wait %g", u.wait_pipeline);
    cr_expect_eq(u.wait_coupling, 0.0);
    cr_expect_lt(u.compute, 0.2, "compute %g while waiting", u.compute);
    expect_at_most_one(u);
}

/* A sleep outside any wait is neither waiting nor computing. */
Test(utilisation, a_sleep_outside_waits_is_neither)
{
    pt_utilisation_meter m;
    pt_utilisation_start(&m, NULL);
    sleep_s(0.05);
    pt_utilisation u = pt_utilisation_finish(&m, NULL, 1);
    cr_expect_lt(u.compute, 0.2, "compute %g while sleeping", u.compute);
    cr_expect_eq(u.wait_pipeline + u.wait_coupling, 0.0);
}

/* The coupling's blocked time arrives as numbers (dp/wait.c measured it);
 * the CPU time spent meanwhile is taken out of compute. */
Test(utilisation, coupling_waits_take_their_cpu_time_out_of_compute)
{
    pt_utilisation_meter m;
    pt_utilisation_start(&m, NULL);
    const double cpu = pt_process_cpu_s(), wall = pt_now_s();
    spin_s(0.1);
    pt_utilisation_add_coupling_wait(&m, pt_now_s() - wall, pt_process_cpu_s() - cpu);
    pt_utilisation u = pt_utilisation_finish(&m, NULL, 1);
    cr_expect_gt(u.wait_coupling, 0.9, "coupling wait %g", u.wait_coupling);
    cr_expect_lt(u.compute, 0.1, "compute %g: the spin was inside the wait", u.compute);
    expect_at_most_one(u);
}

/* A busy loop on one thread computes; unless the machine is very loaded it
 * gets most of its wall time. */
Test(utilisation, a_busy_loop_computes)
{
    pt_utilisation_meter m;
    pt_utilisation_start(&m, NULL);
    spin_s(0.1);
    pt_utilisation u = pt_utilisation_finish(&m, NULL, 1);
    cr_expect_gt(u.compute, 0.2, "compute %g in a busy loop", u.compute);
    expect_at_most_one(u);
}

/* Real descheduling: this process and a rival spinning process pinned to one
 * core. The busy loop is "busy" for all of its wall time (the trace's bubble
 * fraction counts it all), but the core is shared: the meter sees the CPU time
 * it got, about half. */
Test(utilisation, a_worker_sharing_its_core_computes_only_when_it_has_it)
{
    const int cpu = sched_getcpu();
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu < 0 ? 0 : cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
        cr_skip_test("cannot pin this process to one core: %s", strerror(errno));
    const pid_t rival = fork();
    cr_assert_geq(rival, 0, "fork: %s", strerror(errno));
    if (rival == 0) { /* inherits the pinning */
        spin_s(60);
        _exit(0);
    }
    sleep_s(0.02);
    pt_utilisation_meter m;
    pt_utilisation_start(&m, NULL);
    spin_s(0.4);
    pt_utilisation u = pt_utilisation_finish(&m, NULL, 1);
    kill(rival, SIGKILL);
    waitpid(rival, NULL, 0);
    cr_expect_lt(u.compute, 0.75, "compute %g on a core shared with a spinning process", u.compute);
    cr_expect_gt(u.compute, 0.0);
}
