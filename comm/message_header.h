/* The check a receiver applies to an incoming message's header
 * (comm/transport.h, "Messages") before it trusts the payload: magic,
 * version, job, source rank, kind, dtype, shape, nbytes against the receive's
 * capacity, flags, checksum. A function of its arguments alone, so that it can be
 * tested and fuzzed (fuzz/message_header.c) without a transport. */
#ifndef PT_COMM_MESSAGE_HEADER_H
#define PT_COMM_MESSAGE_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "comm/transport.h"

/* What a receive holds a header against. */
typedef struct pt_header_check {
    uint32_t job;                 /* this job's id */
    int peer;                     /* the rank the message came from */
    size_t capacity;              /* bytes the receive's buffer takes */
    const pt_recv_expect *expect; /* what the receive was posted for */
    int takes_device;             /* it may take a device payload (transport.h) */
} pt_header_check;

/* 1 if h passes every check; else 0, with the first refused field and why
 * in why[capacity] ("nbytes: 80 does not match shape [4, 4] of F32"). */
int pt_message_header_acceptable(const pt_message_header *h, const pt_header_check *check,
                                 char *why, size_t capacity);

#endif
