/* Collectives in device memory (dp/device_collective.h) between 2..4 real processes of this
 * host, on runtime.device=cpu-guarded's table: memory the host cannot touch outside the
 * table, which its peer_copy reaches in another process as CUDA IPC reaches a GPU's. Every
 * result is compared bit for bit with a serial reference, the members' tensors summed in
 * member order and scaled by 1/R, which every member must equal (inputs of mixed magnitudes,
 * so another order of the sum gives other bits); a broadcast, with the root's tensor. Where the
 * chunks went is counted: device to device (the transport's peer copies) or as bytes (the
 * table's copy_to_device of what came). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/collectives.h"
#include "dp/device_collective.h"
#include "kernels/kernels.h"

#define JOB_SECRET "device mean test"
#define JOB_ID 4545u
#define JOB_DEADLINE_S 90.0
#include "multiprocess.h"

/* ---- counting where the chunks went ----------------------------------------- */

static int peer_copies, host_arrivals;

static pipert_result counted_peer_copy(void *dst, const pt_peer_memory *src, size_t bytes)
{
    __atomic_add_fetch(&peer_copies, 1, __ATOMIC_SEQ_CST); /* on the progress thread */
    return pt_kernels_cpu_guarded()->peer_copy(dst, src, bytes);
}

static void counted_copy_to_device(void *dst, const void *src, size_t bytes)
{
    host_arrivals++;
    pt_kernels_cpu_guarded()->copy_to_device(dst, src, bytes);
}

static pt_kernels table;
static pt_device_memory memory;

/* The guarded table with its copies counted; the transport copies device payloads with it
 * unless `device_payloads` is 0 (this member takes bytes only). */
static void use_counted_table(rank_context *ctx, int device_payloads)
{
    table = *pt_kernels_cpu_guarded();
    table.copy_to_device = counted_copy_to_device;
    memory = (pt_device_memory){table.name, table.peer_export, counted_peer_copy};
    if (device_payloads) pt_transport_use_device_memory(ctx->t, &memory);
}

/* ---- inputs and the reference ------------------------------------------------ */

/* Member r's element i in round `round`: magnitudes from 2^-10 to 2^10, both signs. */
static float input(int r, size_t i, int round)
{
    const double x = sin(0.37 * r + 0.0113 * (double)i + 1.7 * round);
    return (float)(x * ldexp(1.0, (int)((i * 7 + (size_t)r * 3 + (size_t)round) % 21) - 10));
}

/* What every member must hold: (((g_0 + g_1) + g_2) + …) · (1/R), in float. */
static float reference(int R, size_t i, int round)
{
    float sum = input(0, i, round);
    for (int r = 1; r < R; r++) sum = sum + input(r, i, round);
    return sum * (1.0f / (float)R);
}

/* Every other member but `except` said it copies this one's device memory (within 10 s). */
static int offers_heard(rank_context *ctx, pt_group *g, int except)
{
    for (int i = 0; i < 1000; i++) {
        int all = 1;
        for (int r = 0; r < ctx->n; r++)
            if (r != ctx->rank && r != except && !pt_group_takes_device_payload(g, r, 1 << 20))
                all = 0;
        if (all) return 1;
        usleep(10000);
    }
    return 0;
}

/* Drives m until it ends or `seconds` pass (PIPERT_ERR_TIMEOUT). */
static pipert_result drive(pt_device_collective *m, double seconds)
{
    pipert_result rc = PIPERT_ERR_TIMEOUT;
    for (double waited = 0; waited < seconds && rc == PIPERT_ERR_TIMEOUT; waited += 0.1)
        rc = pt_device_collective_wait_for(m, 0.1);
    return rc;
}

/* One mean of n floats, checked against the reference. */
static int mean_matches(rank_context *ctx, pt_group *g, pt_device_collective *m, size_t n,
                        int round)
{
    float *host = malloc(n * sizeof *host), *data = NULL;
    CHILD_CHECK(ctx, host && table.alloc((void **)&data, n * sizeof *data, "data") == PIPERT_OK,
                "memory");
    for (size_t i = 0; i < n; i++) host[i] = input(ctx->rank, i, round);
    pt_kernels_cpu_guarded()->copy_to_device(data, host, n * sizeof *host);
    CHILD_CHECK(ctx, pt_device_collective_mean_start(m, g, data, n) == PIPERT_OK, "start");
    const pipert_result rc = drive(m, 60);
    CHILD_CHECK(ctx, rc == PIPERT_OK, "the mean ended %s: %s", pipert_result_str(rc),
                pipert_last_error());
    table.copy_to_host(host, data, n * sizeof *host);
    for (size_t i = 0; i < n; i++) {
        const float want = reference(ctx->n, i, round);
        CHILD_CHECK(ctx, memcmp(&host[i], &want, sizeof want) == 0,
                    "round %d, element %zu of %zu: %.9g, the members' ordered sum gives %.9g",
                    round, i, n, host[i], want);
    }
    table.free(data);
    free(host);
    return 0;
}

/* A broadcast of n floats from member `root`: everyone ends with the root's input. */
static int broadcast_matches(rank_context *ctx, pt_group *g, pt_device_collective *m, size_t n,
                             int root)
{
    float *host = malloc(n * sizeof *host), *data = NULL;
    CHILD_CHECK(ctx, host && table.alloc((void **)&data, n * sizeof *data, "data") == PIPERT_OK,
                "memory");
    for (size_t i = 0; i < n; i++) host[i] = input(ctx->rank, i, 7);
    pt_kernels_cpu_guarded()->copy_to_device(data, host, n * sizeof *host);
    CHILD_CHECK(ctx, pt_device_collective_broadcast_start(m, g, data, n, root) == PIPERT_OK,
                "start");
    const pipert_result rc = drive(m, 60);
    CHILD_CHECK(ctx, rc == PIPERT_OK, "the broadcast ended %s: %s", pipert_result_str(rc),
                pipert_last_error());
    table.copy_to_host(host, data, n * sizeof *host);
    for (size_t i = 0; i < n; i++) {
        const float want = input(root, i, 7);
        CHILD_CHECK(ctx, memcmp(&host[i], &want, sizeof want) == 0,
                    "broadcast from %d, element %zu: %.9g, the root's %.9g", root, i, host[i],
                    want);
    }
    const size_t sent = pt_device_collective_broadcast_bytes(g, n, root);
    CHILD_CHECK(ctx, sent == (ctx->rank == root ? (size_t)(ctx->n - 1) * n * sizeof(float) : 0),
                "a broadcast's bytes: %zu", sent);
    table.free(data);
    free(host);
    return 0;
}

/* ---- the tests --------------------------------------------------------------- */

enum { CHUNK = 20000, N = 4 * CHUNK + 517 }; /* 5 chunks of 16,103 or 16,104 floats */

/* Device to device: every chunk of every other member is a peer copy; nothing comes as bytes.
 * Two rounds on one mean (its buffers reused). */
static int device_to_device_body(rank_context *ctx)
{
    use_counted_table(ctx, 1);
    pt_group *g = whole_group(ctx, 5);
    CHILD_CHECK(ctx, g && pt_group_copies_device_memory(g), "this member copies every other's");
    CHILD_CHECK(ctx, offers_heard(ctx, g, -1), "offers");
    pt_device_collective *m;
    CHILD_CHECK(ctx, pt_device_collective_create(&table, CHUNK, &m) == PIPERT_OK, "create");
    for (int round = 0; round < 2; round++)
        if (mean_matches(ctx, g, m, N, round)) return 1;
    const int chunks = (N + CHUNK - 1) / CHUNK;
    CHILD_CHECK(ctx, peer_copies == 2 * chunks * (ctx->n - 1) && host_arrivals == 0,
                "%d peer copies and %d chunks as bytes; 2 rounds of %d chunks from %d members "
                "should all be peer copies",
                peer_copies, host_arrivals, chunks, ctx->n - 1);
    CHILD_CHECK(ctx,
                pt_device_collective_mean_bytes(g, N) == (size_t)(ctx->n - 1) * N * sizeof(float),
                "bytes sent");
    if (broadcast_matches(ctx, g, m, N, ctx->n - 1)) return 1;
    pt_device_collective_free(m);
    pt_group_destroy(g);
    return 0;
}

Test(device_collective, device_to_device_2_members)
{
    RUN_JOB(((job_spec){.n = 2, .body = device_to_device_body, .mesh = 1}));
}
Test(device_collective, device_to_device_3_members)
{
    RUN_JOB(((job_spec){.n = 3, .body = device_to_device_body, .mesh = 1}));
}
Test(device_collective, device_to_device_4_members)
{
    RUN_JOB(((job_spec){.n = 4, .body = device_to_device_body, .mesh = 1}));
}

/* Member 2 copies nobody's device memory: what goes to it goes as bytes, and its own chunks go
 * as bytes to everyone (nobody heard an offer from it); the result is the same bits. Chunks
 * of at most the inline size go as bytes too. */
static int bytes_body(rank_context *ctx)
{
    use_counted_table(ctx, ctx->rank != 2);
    pt_group *g = whole_group(ctx, 5);
    CHILD_CHECK(ctx, g, "group");
    CHILD_CHECK(ctx, pt_group_copies_device_memory(g) == (ctx->rank != 2), "copies");
    if (ctx->rank != 2) CHILD_CHECK(ctx, offers_heard(ctx, g, 2), "offers");
    pt_device_collective *m;
    CHILD_CHECK(ctx, pt_device_collective_create(&table, CHUNK, &m) == PIPERT_OK, "create");
    if (mean_matches(ctx, g, m, N, 0)) return 1;
    const int chunks = (N + CHUNK - 1) / CHUNK;
    if (ctx->rank == 2)
        CHILD_CHECK(ctx, peer_copies == 0 && host_arrivals == 2 * chunks,
                    "member 2: %d peer copies, %d chunks as bytes", peer_copies, host_arrivals);
    else
        CHILD_CHECK(ctx, host_arrivals == chunks, "member %d: %d chunks as bytes, %d from member 2",
                    ctx->rank, host_arrivals, chunks);
    pt_device_collective_free(m);
    pt_device_collective *small;
    const size_t inline_floats = PT_TRANSPORT_INLINE_BYTES / sizeof(float);
    CHILD_CHECK(ctx, pt_device_collective_create(&table, inline_floats, &small) == PIPERT_OK,
                "create");
    if (mean_matches(ctx, g, small, 5000, 1)) return 1;
    pt_device_collective_free(small);
    pt_group_destroy(g);
    return 0;
}

Test(device_collective, as_bytes_where_a_member_copies_no_device_memory)
{
    RUN_JOB(((job_spec){.n = 3, .body = bytes_body, .mesh = 1}));
}

/* A member that averages another count (a peer that sends the wrong thing): the chunks' shapes
 * differ, and both means end with PIPERT_ERR_PEER naming the field, the peer's rank and the
 * chunk, without hanging. */
static int other_count_body(rank_context *ctx)
{
    use_counted_table(ctx, 1);
    pt_group *g = whole_group(ctx, 5);
    CHILD_CHECK(ctx, g && offers_heard(ctx, g, -1), "group and offers");
    pt_device_collective *m;
    CHILD_CHECK(ctx, pt_device_collective_create(&table, CHUNK, &m) == PIPERT_OK, "create");
    float *data = NULL;
    CHILD_CHECK(ctx, table.alloc((void **)&data, N * sizeof *data, "data") == PIPERT_OK, "memory");
    const size_t count = ctx->rank == 0 ? N : N / 2;
    CHILD_CHECK(ctx, pt_device_collective_mean_start(m, g, data, count) == PIPERT_OK, "start");
    const pipert_result rc = drive(m, 30);
    char peer[24];
    snprintf(peer, sizeof peer, "rank %d", 1 - ctx->rank);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER && strstr(pipert_last_error(), "shape") &&
                         strstr(pipert_last_error(), peer) &&
                         strstr(pipert_last_error(), "chunk 1 of"),
                "the mean ended %s: %s", pipert_result_str(rc), pipert_last_error());
    pt_transport_destroy(ctx->t); /* nothing writes the retired buffers any more */
    ctx->t = NULL;
    pt_device_collective_free(m);
    table.free(data);
    pt_group_destroy(g);
    return 0;
}

Test(device_collective, a_member_with_another_count_is_named)
{
    RUN_JOB(((job_spec){.n = 2, .body = other_count_body, .mesh = 1}));
}

/* Member 2 starts the mean and is killed before it receives anything: the others' sends to
 * it fail, and their means end with PIPERT_ERR_PEER naming it, without hanging. */
static int killed_member_body(rank_context *ctx)
{
    use_counted_table(ctx, 1);
    pt_group *g = whole_group(ctx, 5);
    CHILD_CHECK(ctx, g && offers_heard(ctx, g, -1), "group and offers");
    pt_device_collective *m;
    CHILD_CHECK(ctx, pt_device_collective_create(&table, CHUNK, &m) == PIPERT_OK, "create");
    float *data = NULL;
    CHILD_CHECK(ctx, table.alloc((void **)&data, N * sizeof *data, "data") == PIPERT_OK, "memory");
    CHILD_CHECK(ctx, pt_device_collective_mean_start(m, g, data, N) == PIPERT_OK, "start");
    if (ctx->rank == 2) {
        sleep(30); /* never drives its mean: killed meanwhile */
        return 1;
    }
    pipert_result rc;
    if (ctx->rank == 0) { /* (member 1 may see the kill during its first half second already) */
        rc = pt_device_collective_wait_for(m, 0.5);
        CHILD_CHECK(ctx, rc == PIPERT_ERR_TIMEOUT,
                    "the mean ended (%s) while member 2 took nothing", pipert_result_str(rc));
        CHILD_CHECK(ctx, request_kill(ctx, 2), "kill request");
    }
    rc = drive(m, 30);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER && strstr(pipert_last_error(), "rank 2") &&
                         strstr(pipert_last_error(), "device mean over 3 members"),
                "the mean ended %s: %s", pipert_result_str(rc), pipert_last_error());
    /* a new mean over the survivors needs a new group: the dead member's is done with */
    pt_device_collective_abandon(m);
    pt_transport_destroy(ctx->t); /* nothing writes the retired buffers any more */
    ctx->t = NULL;
    pt_device_collective_free(m);
    table.free(data);
    pt_group_destroy(g);
    return 0;
}

Test(device_collective, a_killed_member_fails_the_mean_naming_it)
{
    RUN_JOB(((job_spec){
        .n = 3, .body = killed_member_body, .mesh = 1, .expect_killed = {0, 0, 1}}));
}
