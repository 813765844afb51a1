#include "dp/wait.h"

#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/log.h"

#define WAIT_SLICE_S 0.1
#define LONG_WAIT_S 2.0

/* Waits without the blocked-time count. */
static pipert_result wait_in_slices(const pt_coupling_options *options, pt_pending_op pending,
                                    const char *what)
{
    const double started = pt_now_s();
    bool reported = false;
    for (;;) {
        pipert_result rc = pending.wait_for(pending.op, WAIT_SLICE_S);
        const double waited = pt_now_s() - started;
        if (rc != PIPERT_ERR_TIMEOUT) {
            if (reported) pt_warn("%s: the replicas answered after %.1f s", what, waited);
            if (rc != PIPERT_OK) pt_error_prefix("%s", what);
            return rc;
        }
        if (!reported && waited >= LONG_WAIT_S) {
            pt_warn("%s: waiting for the replicas for %.0f s (a slow, congested or broken link?)",
                    what, waited);
            reported = true;
        }
        if (options->membership_changed && options->membership_changed(options->context)) {
            pending.abandon(pending.op);
            return pt_fail(PIPERT_ERR_PEER, "%s: replicas left the job meanwhile", what);
        }
        if (options->should_stop && options->should_stop(options->context)) {
            pending.abandon(pending.op);
            return pt_fail(PIPERT_ERR_INTERRUPTED, "%s: stopped while waiting for the replicas",
                           what);
        }
    }
}

pipert_result pt_coupling_wait(const pt_coupling_options *options, pt_pending_op pending,
                               const char *what)
{
    const double started = pt_now_s(), cpu_started = pt_process_cpu_s();
    const double started_us = pt_trace_clock_us(options->trace);
    pipert_result rc = wait_in_slices(options, pending, what);
    pt_trace_span(options->trace, "coupling wait", started_us, pt_trace_clock_us(options->trace), -1,
                  -1, -1);
    if (options->blocked) {
        options->blocked->wall_s += pt_now_s() - started;
        options->blocked->cpu_s += pt_process_cpu_s() - cpu_started;
    }
    return rc;
}

static pipert_result allreduce_wait_for(void *op, double timeout_s)
{
    return pt_allreduce_wait_for(op, timeout_s);
}

static void allreduce_abandon(void *op) { pt_allreduce_abandon(op); }

pipert_result pt_coupling_wait_allreduce(const pt_coupling_options *options,
                                         pt_allreduce_handle *handle, const char *what)
{
    return pt_coupling_wait(options, (pt_pending_op){allreduce_wait_for, allreduce_abandon, handle},
                            what);
}

static pipert_result device_collective_wait_for(void *op, double timeout_s)
{
    return pt_device_collective_wait_for(op, timeout_s);
}

static void device_collective_abandon(void *op) { pt_device_collective_abandon(op); }

pipert_result pt_coupling_wait_device_collective(const pt_coupling_options *options,
                                                 pt_device_collective *collective, const char *what)
{
    return pt_coupling_wait(options,
                            (pt_pending_op){device_collective_wait_for, device_collective_abandon,
                                            collective},
                            what);
}

static pipert_result exchange_wait_for(void *op, double timeout_s)
{
    return pt_exchange_wait_for(op, timeout_s);
}

static void exchange_abandon(void *op) { pt_exchange_abandon(op); }

pipert_result pt_coupling_wait_exchange(const pt_coupling_options *options, pt_exchange *handle,
                                        const char *what)
{
    return pt_coupling_wait(options, (pt_pending_op){exchange_wait_for, exchange_abandon, handle},
                            what);
}
