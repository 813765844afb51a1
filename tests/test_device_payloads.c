/* Device payloads between real processes of this host (comm/transport.h, "Device
 * payloads"): tensors in device memory go device to device, the receiver copying from the
 * sender's memory with its kernel table's peer_copy. The device here is runtime.device=
 * cpu-guarded (kernels/guarded.c): memory the host cannot touch outside the table, which its
 * peer_copy reaches in another process through /proc/PID/mem as CUDA IPC reaches a GPU's. So a
 * payload that went any other way (a checksum, a send from host code, process_vm_readv) would
 * fault or fail here, as on a GPU.
 *
 * Each test forks a 2-rank job (multiprocess.h). */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "runtime/clock.h"
#include "runtime/safetensors.h"
#include "comm/transport.h"

#define JOB_SECRET "device payloads between processes"
#define JOB_ID 4343u
#include "multiprocess.h"

enum { TAG_READY = 900, TAG_TENSOR = 1000 };

/* Sizes a tensor may have: just past the inline limit, a page, 1 MiB and an odd size. */
static const size_t sizes[] = {PT_TRANSPORT_INLINE_BYTES + 4, 65536, 1u << 20, (3u << 20) + 13};
#define N_SIZES (sizeof sizes / sizeof sizes[0])
#define LARGEST ((3u << 20) + 13)

static unsigned char pattern_byte(uint64_t seed, size_t i)
{
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (unsigned char)(x * 0x94D049BB133111EBull >> 56);
}

static pt_message_header bytes_header(size_t nbytes)
{
    return (pt_message_header){.kind = PT_KIND_ACTIVATION,
                               .dtype = PT_DTYPE_U8,
                               .ndim = 1,
                               .shape = {(int64_t)nbytes},
                               .nbytes = nbytes};
}

static const pt_device_memory *guarded_memory(void)
{
    static pt_device_memory d;
    const pt_kernels *k = pt_kernels_cpu_guarded();
    d = (pt_device_memory){k->name, k->peer_export, k->peer_copy};
    return &d;
}

/* A guarded "device" buffer holding the pattern of `seed`. */
static void *device_pattern(size_t bytes, uint64_t seed)
{
    const pt_kernels *k = pt_kernels_cpu_guarded();
    unsigned char *host = malloc(bytes);
    void *device = NULL;
    if (!host || k->alloc(&device, bytes, "a test tensor") != PIPERT_OK) return NULL;
    for (size_t i = 0; i < bytes; i++) host[i] = pattern_byte(seed, i);
    k->copy_to_device(device, host, bytes);
    free(host);
    return device;
}

/* The first byte of a device buffer that differs from the pattern, or -1. */
static long device_mismatch(const void *device, size_t bytes, uint64_t seed)
{
    unsigned char *host = malloc(bytes);
    if (!host) return 0;
    pt_kernels_cpu_guarded()->copy_to_host(host, device, bytes);
    long bad = -1;
    for (size_t i = 0; i < bytes && bad < 0; i++)
        if (host[i] != pattern_byte(seed, i)) bad = (long)i;
    free(host);
    return bad;
}

/* Waits up to 10 s for `rank` to say it copies our device memory. */
static int heard_offer(pt_transport *t, int rank)
{
    for (int i = 0; i < 1000; i++) {
        if (pt_transport_peer_copies_device_memory(t, rank)) return 1;
        usleep(10000);
    }
    return 0;
}

/* A message with no payload of interest: "I am ready" or "done". */
static int signal_peer(pt_transport *t, int to, uint32_t tag)
{
    const pt_message_header h = bytes_header(1);
    const unsigned char byte = 1;
    pt_request *r;
    if (pt_send(t, to, tag, &h, &byte, 0, &r) != PIPERT_OK) return 0;
    const int ok = pt_request_wait(r, 20.0) == PIPERT_OK;
    pt_request_free(r);
    return ok;
}

static int wait_signal(pt_transport *t, int from, uint32_t tag)
{
    const pt_recv_expect e = {.kind = PT_KIND_ACTIVATION, .dtype = -1, .ndim = -1};
    unsigned char byte;
    pt_request *r;
    if (pt_recv(t, from, tag, &e, &byte, 1, &r) != PIPERT_OK) return 0;
    const int ok = pt_request_wait(r, 20.0) == PIPERT_OK;
    pt_request_free(r);
    return ok;
}

/* Receives sizes[k] from `from` into a guarded buffer; *on_device says where it landed. */
static int receive_size(rank_context *ctx, int from, size_t k, int *on_device)
{
    const pt_kernels *g = pt_kernels_cpu_guarded();
    const size_t bytes = sizes[k];
    void *device = NULL;
    unsigned char *host = malloc(bytes);
    CHILD_CHECK(ctx, host && g->alloc(&device, bytes, "a received tensor") == PIPERT_OK, "memory");
    const pt_recv_expect e = {.kind = PT_KIND_ACTIVATION,
                              .dtype = PT_DTYPE_U8,
                              .ndim = 1,
                              .shape = {(int64_t)bytes},
                              .require_checksum = 1};
    pt_request *r;
    CHILD_CHECK(ctx,
                pt_recv_device(ctx->t, from, TAG_TENSOR + (uint32_t)k, &e, host, device, bytes,
                               &r) == PIPERT_OK,
                "posting the receive of %zu bytes", bytes);
    const pipert_result rc = pt_request_wait(r, 20.0);
    CHILD_CHECK(ctx, rc == PIPERT_OK, "receiving %zu bytes: %s", bytes, pipert_last_error());
    *on_device = pt_request_on_device(r);
    pt_request_free(r);
    long bad = -1;
    if (*on_device) bad = device_mismatch(device, bytes, 10 * (uint64_t)from + k);
    else
        for (size_t i = 0; i < bytes && bad < 0; i++)
            if (host[i] != pattern_byte(10 * (uint64_t)from + k, i)) bad = (long)i;
    CHILD_CHECK(ctx, bad < 0, "the %zu-byte tensor from rank %d differs at byte %ld (%s)", bytes,
                from, bad, *on_device ? "on the device" : "in host memory");
    g->free(device);
    free(host);
    return 0;
}

/* Both ranks use device memory: every size goes device to device, both ways at once. */
static int both_ways_body(rank_context *ctx)
{
    const int other = 1 - ctx->rank;
    pt_transport_use_device_memory(ctx->t, guarded_memory());
    CHILD_CHECK(ctx, heard_offer(ctx->t, other), "rank %d never offered to copy device memory",
                other);
    void *out[N_SIZES];
    pt_request *sends[N_SIZES];
    for (size_t k = 0; k < N_SIZES; k++) {
        out[k] = device_pattern(sizes[k], 10 * (uint64_t)ctx->rank + k);
        CHILD_CHECK(ctx, out[k], "memory");
        const pt_message_header h = bytes_header(sizes[k]);
        CHILD_CHECK(ctx,
                    pt_send_device(ctx->t, other, TAG_TENSOR + (uint32_t)k, &h, out[k],
                                   &sends[k]) == PIPERT_OK,
                    "pt_send_device of %zu bytes: %s", sizes[k], pipert_last_error());
    }
    for (size_t k = N_SIZES; k-- > 0;) { /* the other order: tags keep them apart */
        int on_device = 0;
        if (receive_size(ctx, other, k, &on_device)) return 1;
        CHILD_CHECK(ctx, on_device, "the %zu-byte tensor came as bytes, not device to device",
                    sizes[k]);
    }
    for (size_t k = 0; k < N_SIZES; k++) {
        CHILD_CHECK(ctx, pt_request_wait(sends[k], 20.0) == PIPERT_OK, "send %zu: %s", k,
                    pipert_last_error());
        pt_request_free(sends[k]);
        pt_kernels_cpu_guarded()->free(out[k]);
    }
    return 0;
}

Test(device_payloads, go_device_to_device_between_processes_of_a_host)
{
    job_spec spec = {.n = 2, .body = both_ways_body, .mesh = 1};
    RUN_JOB(spec);
}

/* Rank 1 does not use device memory: it never offers, rank 0 may not send it device payloads
 * and stages through the host instead; rank 1's pt_recv_device takes the bytes. */
static int one_side_body(rank_context *ctx)
{
    if (ctx->rank == 1) {
        CHILD_CHECK(ctx, signal_peer(ctx->t, 0, TAG_READY), "ready");
        int on_device = 1;
        if (receive_size(ctx, 0, 2, &on_device)) return 1;
        CHILD_CHECK(ctx, !on_device, "a receive without device memory landed on the device");
        return 0;
    }
    pt_transport_use_device_memory(ctx->t, guarded_memory());
    CHILD_CHECK(ctx, wait_signal(ctx->t, 1, TAG_READY), "ready");
    usleep(200000); /* an offer, had one been sent, would be here by now */
    CHILD_CHECK(ctx, !pt_transport_peer_copies_device_memory(ctx->t, 1),
                "rank 1 copies device memory without using any");
    const pt_kernels *g = pt_kernels_cpu_guarded();
    void *device = device_pattern(sizes[2], 2);
    CHILD_CHECK(ctx, device, "memory");
    const pt_message_header h = bytes_header(sizes[2]);
    pt_request *r = NULL;
    CHILD_CHECK(ctx,
                pt_send_device(ctx->t, 1, TAG_TENSOR + 2, &h, device, &r) ==
                        PIPERT_ERR_INVALID_ARG &&
                    strstr(pipert_last_error(), "rank 1 does not copy device memory"),
                "pt_send_device to a peer that does not copy: %s", pipert_last_error());
    unsigned char *host = malloc(sizes[2]);
    CHILD_CHECK(ctx, host, "memory");
    g->copy_to_host(host, device, sizes[2]); /* staged, as pipeline/staging.c does */
    CHILD_CHECK(ctx, pt_send(ctx->t, 1, TAG_TENSOR + 2, &h, host, PT_SEND_CHECKSUM, &r) == PIPERT_OK,
                "send");
    CHILD_CHECK(ctx, pt_request_wait(r, 20.0) == PIPERT_OK, "send: %s", pipert_last_error());
    pt_request_free(r);
    free(host);
    g->free(device);
    return 0;
}

Test(device_payloads, a_peer_without_device_memory_takes_bytes)
{
    job_spec spec = {.n = 2, .body = one_side_body, .mesh = 1};
    RUN_JOB(spec);
}

/* Both would use device memory, but the transport keeps device payloads off: nobody offers. */
static int no_offer_body(rank_context *ctx)
{
    const int other = 1 - ctx->rank;
    pt_transport_use_device_memory(ctx->t, guarded_memory());
    CHILD_CHECK(ctx, signal_peer(ctx->t, other, TAG_READY) && wait_signal(ctx->t, other, TAG_READY),
                "ready");
    usleep(200000);
    CHILD_CHECK(ctx, !pt_transport_peer_copies_device_memory(ctx->t, other),
                "rank %d offered device copies where it cannot read this process", other);
    return 0;
}

/* Between emulated sites UCX_TLS=tcp keeps same-host copies off: device payloads too. */
Test(device_payloads, are_off_where_ucx_tls_keeps_same_host_copies_off)
{
    setenv("UCX_TLS", "tcp", 1); /* this test's process only: the children inherit it */
    job_spec spec = {.n = 2, .body = no_offer_body, .mesh = 1};
    RUN_JOB(spec);
}

/* Under authenticate_messages every message's bytes carry a MAC, which a device payload's
 * cannot: nobody offers. */
Test(device_payloads, are_off_when_every_message_is_authenticated)
{
    job_spec spec = {.n = 2, .body = no_offer_body, .mesh = 1, .authenticate_messages = 1};
    RUN_JOB(spec);
}

/* A sender killed after it sent a device payload and before the receiver copied it: the
 * receive fails naming it (nothing is copied from a process that is gone) and does not hang. */
static int dying_sender_body(rank_context *ctx)
{
    pt_transport_use_device_memory(ctx->t, guarded_memory());
    if (ctx->rank == 1) {
        CHILD_CHECK(ctx, heard_offer(ctx->t, 0), "no offer");
        void *device = device_pattern(sizes[2], 12);
        const pt_message_header h = bytes_header(sizes[2]);
        pt_request *r;
        CHILD_CHECK(ctx, device && pt_send_device(ctx->t, 0, TAG_TENSOR, &h, device, &r) == PIPERT_OK,
                    "pt_send_device: %s", pipert_last_error());
        CHILD_CHECK(ctx, signal_peer(ctx->t, 0, TAG_READY), "ready");
        sleep(30); /* killed meanwhile, its send pending */
        return 1;
    }
    CHILD_CHECK(ctx, wait_signal(ctx->t, 1, TAG_READY), "ready");
    CHILD_CHECK(ctx, request_kill(ctx, 1) == 1, "kill request");
    for (int i = 0; i < 2000 && pt_transport_peer_alive(ctx->t, 1); i++) usleep(10000);
    CHILD_CHECK(ctx, !pt_transport_peer_alive(ctx->t, 1), "rank 1 still looks alive");
    const pt_kernels *g = pt_kernels_cpu_guarded();
    void *device = NULL;
    unsigned char *host = malloc(sizes[2]);
    CHILD_CHECK(ctx, host && g->alloc(&device, sizes[2], "a tensor") == PIPERT_OK, "memory");
    const pt_recv_expect e = {.kind = PT_KIND_ACTIVATION, .dtype = -1, .ndim = -1};
    pt_request *r;
    CHILD_CHECK(ctx,
                pt_recv_device(ctx->t, 1, TAG_TENSOR, &e, host, device, sizes[2], &r) == PIPERT_OK,
                "recv");
    const pipert_result rc = pt_request_wait(r, 30.0);
    CHILD_CHECK(ctx,
                rc == PIPERT_ERR_PEER &&
                    strstr(pipert_last_error(), "rank 1 failed before its 1048576-byte device payload"),
                "a receive from a killed sender ended %s: %s", pipert_result_str(rc),
                pipert_last_error());
    pt_request_abandon(r);
    g->free(device);
    free(host);
    return 0;
}

Test(device_payloads, a_killed_sender_fails_the_receive_naming_it)
{
    job_spec spec = {.n = 2, .body = dying_sender_body, .mesh = 1, .expect_killed = {0, 1}};
    RUN_JOB(spec);
}
