/* A step waiting for coupling traffic in flight (an all-reduce, a compressed
 * exchange, a sparse average): in slices of a tenth of a second, asking the
 * session's should_stop in between (a stop abandons what is in flight: it
 * frees itself once the transport is done with it), and saying so in the log
 * when the replicas keep it waiting: a wait of more than LONG_WAIT_S is
 * reported when it starts to be long and again when it ends, so a link that
 * dropped shows in every rank's log with how long it stalled the step. */
#ifndef PT_DP_WAIT_H
#define PT_DP_WAIT_H

#include "dp/coupling.h"
#include "dp/device_collective.h"
#include "dp/exchange.h"

/* Something in flight: wait_for(op, timeout_s) returns PIPERT_ERR_TIMEOUT
 * while it runs, else its result; abandon(op) gives up on it. */
typedef struct pt_pending_op {
    pipert_result (*wait_for)(void *op, double timeout_s);
    void (*abandon)(void *op);
    void *op;
} pt_pending_op;

/* Waits until `pending` ends; `what` names it in errors and log lines. */
pipert_result pt_coupling_wait(const pt_coupling_options *options, pt_pending_op pending,
                               const char *what);

pipert_result pt_coupling_wait_allreduce(const pt_coupling_options *options,
                                         pt_allreduce_handle *handle, const char *what);
pipert_result pt_coupling_wait_device_collective(const pt_coupling_options *options,
                                                 pt_device_collective *collective, const char *what);
pipert_result pt_coupling_wait_exchange(const pt_coupling_options *options, pt_exchange *handle,
                                        const char *what);

#endif
