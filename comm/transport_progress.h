/* What transport_progress.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_PROGRESS_H
#define PT_TRANSPORT_PROGRESS_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_progress.c: the UCX lock, the command queue, the progress thread, posting. */
/* Set while this thread holds a transport's ucx_lock: callbacks run then,
 * and a wait there would wait for ourselves. */
extern _Thread_local int pt_transport_holding_ucx_lock;
void pt_transport_ucx_lock_acquire(pt_transport *t);
void pt_transport_ucx_lock_release(pt_transport *t);
void pt_transport_wake_progress_thread(pt_transport *t);
pipert_result pt_transport_enqueue(pt_transport *t, command_op op, pt_request *request,
                                   connection *conn);
pipert_result pt_transport_enqueue_drop(pt_transport *t, int rank, const char *reason);
command *pt_transport_take_commands(pt_transport *t);
void *pt_transport_progress_main(void *arg);
pipert_result pt_transport_submit(pt_transport *t, pt_request *r, pt_request **out);
void pt_transport_poll_while_waiting(pt_request *r, double seconds);

#pragma GCC visibility pop

#endif
