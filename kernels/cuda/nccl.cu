/* NCCL collectives for device buffers, shaped like comm/collectives.h
 * (see kernels/cuda/cuda.h for the contract).
 *
 * Streams. Broadcast, send and recv run on the compute stream, in order with
 * the kernels around them. An all-reduce started with pt_nccl_allreduce_start
 * runs on the group's own stream after an event from the compute stream (it
 * sees the gradients computed so far) and records an event that
 * pt_nccl_allreduce_wait makes the compute stream wait on, so backward
 * kernels enqueued in between overlap with the reduction.
 *
 * Built without NCCL (PT_HAVE_NCCL = 0), every call is PIPERT_ERR_UNSUPPORTED.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#if PT_HAVE_NCCL
#include <nccl.h>

struct pt_nccl_group {
    ncclComm_t comm;
    int size, index;
    cudaStream_t stream; /* all-reduces started with _start */
};

struct pt_nccl_allreduce_handle {
    pt_nccl_group *group;
    cudaEvent_t done;
    pipert_result result;
};

static pipert_result nccl_result(ncclResult_t r, const char *what)
{
    if (r == ncclSuccess) return PIPERT_OK;
    pipert_result code = r == ncclRemoteError || r == ncclSystemError ? PIPERT_ERR_PEER
                         : r == ncclInvalidArgument || r == ncclInvalidUsage
                             ? PIPERT_ERR_INVALID_ARG
                             : PIPERT_ERR_TRANSPORT;
    return pt_fail(code, "NCCL %s: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(NULL));
}

/* The backend must run (the device chosen) before NCCL touches it; an error
 * NCCL found asynchronously fails the next call. */
static pipert_result group_ready(pt_nccl_group *g, const char *what)
{
    if (!g) return pt_fail(PIPERT_ERR_INVALID_ARG, "NCCL %s: no group", what);
    PT_TRY(pt_cuda_status());
    ncclResult_t async_error = ncclSuccess;
    PT_TRY(nccl_result(ncclCommGetAsyncError(g->comm, &async_error), what));
    return nccl_result(async_error, what);
}

static pipert_result check_peer(const pt_nccl_group *g, int index, const char *what)
{
    if (index < 0 || index >= g->size)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "NCCL %s: member %d is not in a group of %d", what,
                       index, g->size);
    return PIPERT_OK;
}

extern "C" pipert_result pt_nccl_unique_id(pt_nccl_id *out)
{
    static_assert(sizeof(ncclUniqueId) == PT_NCCL_ID_BYTES, "pt_nccl_id holds an ncclUniqueId");
    const pt_kernels *started;
    PT_TRY(pt_kernels_cuda(&started));
    ncclUniqueId id;
    PT_TRY(nccl_result(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    memcpy(out->bytes, &id, sizeof id);
    return PIPERT_OK;
}

extern "C" pipert_result pt_nccl_group_create(const pt_nccl_id *id, int n_ranks, int index,
                                              pt_nccl_group **out)
{
    *out = NULL;
    if (n_ranks < 1 || index < 0 || index >= n_ranks)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "NCCL group: index %d of %d members", index,
                       n_ranks);
    const pt_kernels *started;
    PT_TRY(pt_kernels_cuda(&started));
    pt_nccl_group *g = (pt_nccl_group *)calloc(1, sizeof *g);
    if (!g) return pt_fail(PIPERT_ERR_NOMEM, "NCCL group: out of memory");
    g->size = n_ranks;
    g->index = index;
    cudaError_t err = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        free(g);
        return pt_fail(PIPERT_ERR_INTERNAL, "NCCL group: cudaStreamCreate: %s", cudaGetErrorString(err));
    }
    ncclUniqueId nccl_id;
    memcpy(&nccl_id, id->bytes, sizeof nccl_id);
    pipert_result rc = nccl_result(ncclCommInitRank(&g->comm, n_ranks, nccl_id, index), "ncclCommInitRank");
    if (rc != PIPERT_OK) {
        cudaStreamDestroy(g->stream);
        free(g);
        return rc;
    }
    *out = g;
    return PIPERT_OK;
}

extern "C" void pt_nccl_group_destroy(pt_nccl_group *g)
{
    if (!g) return;
    ncclCommFinalize(g->comm); /* flushes what was issued */
    ncclCommDestroy(g->comm);
    cudaStreamDestroy(g->stream);
    free(g);
}

extern "C" int pt_nccl_group_size(const pt_nccl_group *g) { return g->size; }
extern "C" int pt_nccl_group_index(const pt_nccl_group *g) { return g->index; }

extern "C" pipert_result pt_nccl_broadcast(pt_nccl_group *g, void *buffer, size_t nbytes,
                                           int root_index)
{
    PT_TRY(group_ready(g, "broadcast"));
    PT_TRY(check_peer(g, root_index, "broadcast root"));
    return nccl_result(ncclBroadcast(buffer, buffer, nbytes, ncclChar, root_index, g->comm,
                                     pt_cuda.compute),
                       "broadcast");
}

extern "C" pipert_result pt_nccl_allreduce_start(pt_nccl_group *g, float *data, size_t count,
                                                 pt_reduce_op op, pt_nccl_allreduce_handle **out)
{
    *out = NULL;
    PT_TRY(group_ready(g, "all-reduce"));
    pt_nccl_allreduce_handle *h = (pt_nccl_allreduce_handle *)calloc(1, sizeof *h);
    if (!h) return pt_fail(PIPERT_ERR_NOMEM, "NCCL all-reduce: out of memory");
    h->group = g;
    cudaError_t err = cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        free(h);
        return pt_fail(PIPERT_ERR_INTERNAL, "NCCL all-reduce: cudaEventCreate: %s", cudaGetErrorString(err));
    }
    /* after the compute work so far (compute_mark is free to reuse once waited on) */
    PT_CUDA_CHECK(cudaEventRecord(pt_cuda.compute_mark, pt_cuda.compute));
    PT_CUDA_CHECK(cudaStreamWaitEvent(g->stream, pt_cuda.compute_mark, 0));
    ncclRedOp_t nccl_op = op == PT_REDUCE_MEAN ? ncclAvg : ncclSum;
    h->result = nccl_result(ncclAllReduce(data, data, count, ncclFloat32, nccl_op, g->comm, g->stream),
                            "all-reduce");
    PT_CUDA_CHECK(cudaEventRecord(h->done, g->stream));
    *out = h;
    return PIPERT_OK;
}

extern "C" pipert_result pt_nccl_allreduce_wait(pt_nccl_allreduce_handle *h)
{
    if (!h) return pt_fail(PIPERT_ERR_INVALID_ARG, "NCCL all-reduce wait: no handle");
    PT_CUDA_CHECK(cudaStreamWaitEvent(pt_cuda.compute, h->done, 0));
    pipert_result rc = h->result;
    if (rc == PIPERT_OK) rc = group_ready(h->group, "all-reduce");
    cudaEventDestroy(h->done); /* destroying a recorded event is fine: the wait is enqueued */
    free(h);
    return rc;
}

extern "C" pipert_result pt_nccl_allreduce(pt_nccl_group *g, float *data, size_t count,
                                           pt_reduce_op op)
{
    pt_nccl_allreduce_handle *h;
    PT_TRY(pt_nccl_allreduce_start(g, data, count, op, &h));
    return pt_nccl_allreduce_wait(h);
}

extern "C" pipert_result pt_nccl_send(pt_nccl_group *g, const void *buffer, size_t nbytes,
                                      int peer_index)
{
    PT_TRY(group_ready(g, "send"));
    PT_TRY(check_peer(g, peer_index, "send"));
    return nccl_result(ncclSend(buffer, nbytes, ncclChar, peer_index, g->comm, pt_cuda.compute),
                       "send");
}

extern "C" pipert_result pt_nccl_recv(pt_nccl_group *g, void *buffer, size_t nbytes,
                                      int peer_index)
{
    PT_TRY(group_ready(g, "recv"));
    PT_TRY(check_peer(g, peer_index, "recv"));
    return nccl_result(ncclRecv(buffer, nbytes, ncclChar, peer_index, g->comm, pt_cuda.compute),
                       "recv");
}

/* ncclGroupStart/End around the pair: both are posted before either waits,
 * so an exchange (even with oneself) cannot deadlock. */
extern "C" pipert_result pt_nccl_sendrecv(pt_nccl_group *g, const void *send_buffer,
                                          void *recv_buffer, size_t nbytes, int peer_index)
{
    PT_TRY(group_ready(g, "send/recv"));
    PT_TRY(check_peer(g, peer_index, "send/recv"));
    PT_TRY(nccl_result(ncclGroupStart(), "send/recv: ncclGroupStart"));
    ncclResult_t sent = ncclSend(send_buffer, nbytes, ncclChar, peer_index, g->comm, pt_cuda.compute);
    ncclResult_t received =
        ncclRecv(recv_buffer, nbytes, ncclChar, peer_index, g->comm, pt_cuda.compute);
    ncclResult_t ended = ncclGroupEnd();
    PT_TRY(nccl_result(sent, "send/recv: send"));
    PT_TRY(nccl_result(received, "send/recv: recv"));
    return nccl_result(ended, "send/recv: ncclGroupEnd");
}

#else /* built without NCCL */

static pipert_result no_nccl(void)
{
    return pt_fail(PIPERT_ERR_UNSUPPORTED,
                   "this build's CUDA backend has no NCCL (nccl.h and libnccl were not found at "
                   "configure time)");
}

extern "C" pipert_result pt_nccl_unique_id(pt_nccl_id *out) { return no_nccl(); }
extern "C" pipert_result pt_nccl_group_create(const pt_nccl_id *id, int n_ranks, int index,
                                              pt_nccl_group **out)
{
    *out = NULL;
    return no_nccl();
}
extern "C" void pt_nccl_group_destroy(pt_nccl_group *g) {}
extern "C" int pt_nccl_group_size(const pt_nccl_group *g) { return 0; }
extern "C" int pt_nccl_group_index(const pt_nccl_group *g) { return -1; }
extern "C" pipert_result pt_nccl_broadcast(pt_nccl_group *g, void *buffer, size_t nbytes,
                                           int root_index)
{
    return no_nccl();
}
extern "C" pipert_result pt_nccl_allreduce_start(pt_nccl_group *g, float *data, size_t count,
                                                 pt_reduce_op op, pt_nccl_allreduce_handle **out)
{
    *out = NULL;
    return no_nccl();
}
extern "C" pipert_result pt_nccl_allreduce_wait(pt_nccl_allreduce_handle *handle) { return no_nccl(); }
extern "C" pipert_result pt_nccl_allreduce(pt_nccl_group *g, float *data, size_t count,
                                           pt_reduce_op op)
{
    return no_nccl();
}
extern "C" pipert_result pt_nccl_send(pt_nccl_group *g, const void *buffer, size_t nbytes,
                                      int peer_index)
{
    return no_nccl();
}
extern "C" pipert_result pt_nccl_recv(pt_nccl_group *g, void *buffer, size_t nbytes,
                                      int peer_index)
{
    return no_nccl();
}
extern "C" pipert_result pt_nccl_sendrecv(pt_nccl_group *g, const void *send_buffer,
                                          void *recv_buffer, size_t nbytes, int peer_index)
{
    return no_nccl();
}

#endif
