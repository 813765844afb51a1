/* What transport_request.c offers the transport's other files (transport_internal.h has the types). */
#ifndef PT_TRANSPORT_REQUEST_H
#define PT_TRANSPORT_REQUEST_H

#include "comm/transport_internal.h"

#pragma GCC visibility push(hidden)

/* transport_request.c: a request's completion, and waiting on the state lock. */
void pt_transport_record_failure(pt_request *r, pipert_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pt_transport_in_flight_add(pt_transport *t, pt_request *r);
void pt_transport_complete_request(pt_request *r);
/* A queued command for r has run (it may free r). */
void pt_transport_request_command_done(pt_request *r);
void pt_transport_fail_request(pt_request *r, pipert_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *pt_transport_request_verb(const pt_request *r);
void pt_transport_describe_request(const pt_request *r, char *out, size_t capacity);
int pt_transport_request_done(pt_request *r);
int pt_transport_wait_on_state(const struct timespec *deadline);
void pt_transport_deadline_after(double seconds, struct timespec *out);

#pragma GCC visibility pop

#endif
