/* Memory other processes of this host copy from: CUDA IPC (kernels/kernels.h,
 * peer_export and peer_copy; runtime/peer_memory.h).
 *
 * Export: the arena is one cudaMalloc, so one IPC handle (taken once) and an
 * offset name any tensor in it. Copy: a peer's handle is opened once
 * (cudaIpcOpenMemHandle, with peer access enabled lazily should its arena be
 * on another GPU of the host) and kept among the last few opened; the copy
 * runs on a stream of its own after the work already enqueued on the compute
 * stream (a kernel may still read dst) and is waited for, so the peer may
 * reuse its memory once peer_copy returns. It runs on whatever thread calls
 * it (the transport's progress thread): the device is made current there
 * first. A failure here is the peer's business, not the backend's: it is
 * returned, not recorded as the backend's sticky error. */
#include <mutex>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

#define PEER_MAGIC 0x41445543u /* "CUDA" */
#define OPENED_MAX 8

struct cuda_peer_memory {
    uint32_t magic;
    int32_t device; /* the exporter's, for messages */
    uint64_t offset;
    cudaIpcMemHandle_t handle;
};
static_assert(sizeof(cuda_peer_memory) <= PT_PEER_MEMORY_BYTES, "fits a pt_peer_memory");

struct opened_arena {
    cudaIpcMemHandle_t handle;
    char *base;
};

static struct {
    std::mutex lock;
    bool exported;
    cudaIpcMemHandle_t own;
    cudaStream_t stream;
    cudaEvent_t compute_mark;
    opened_arena opened[OPENED_MAX];
    int n_opened, next_evicted;
} peers;

static pipert_result cuda_failure(cudaError_t err, const char *what)
{
    cudaGetLastError(); /* not sticky: clear it */
    return pt_fail(PIPERT_ERR_PEER, "CUDA IPC: %s: %s", what, cudaGetErrorString(err));
}

extern "C" pipert_result pt_cuda_peer_export(const void *ptr, pt_peer_memory *out)
{
    const pt_cuda_arena *a = &pt_cuda.arena;
    const char *p = (const char *)ptr;
    if (!a->base || p < a->base || p >= a->base + a->capacity)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "CUDA IPC: %p is not in the arena: nothing to export", ptr);
    std::lock_guard<std::mutex> guard(peers.lock);
    if (!peers.exported) {
        cudaError_t err = cudaIpcGetMemHandle(&peers.own, a->base);
        if (err != cudaSuccess) return cuda_failure(err, "cudaIpcGetMemHandle of the arena");
        peers.exported = true;
    }
    cuda_peer_memory m = {PEER_MAGIC, pt_cuda.device, (uint64_t)(p - a->base), peers.own};
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &m, sizeof m);
    return PIPERT_OK;
}

/* The base of a peer's arena in this process: opened before, or now (under peers.lock). */
static pipert_result opened_base(const cudaIpcMemHandle_t &handle, char **out)
{
    for (int i = 0; i < peers.n_opened; i++)
        if (!memcmp(&peers.opened[i].handle, &handle, sizeof handle)) {
            *out = peers.opened[i].base;
            return PIPERT_OK;
        }
    void *base = NULL;
    cudaError_t err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) return cuda_failure(err, "cudaIpcOpenMemHandle of a peer's arena");
    int slot = peers.n_opened < OPENED_MAX ? peers.n_opened++ : peers.next_evicted++ % OPENED_MAX;
    if (peers.opened[slot].base) cudaIpcCloseMemHandle(peers.opened[slot].base); /* the oldest */
    peers.opened[slot] = opened_arena{handle, (char *)base};
    *out = (char *)base;
    return PIPERT_OK;
}

static pipert_result ensure_stream(void)
{
    if (peers.stream) return PIPERT_OK;
    cudaError_t err = cudaStreamCreateWithFlags(&peers.stream, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&peers.compute_mark, cudaEventDisableTiming);
    return err == cudaSuccess ? PIPERT_OK : cuda_failure(err, "a stream for copies from peers");
}

extern "C" pipert_result pt_cuda_peer_copy(void *dst, const pt_peer_memory *src, size_t bytes)
{
    cuda_peer_memory m;
    memcpy(&m, src->bytes, sizeof m);
    if (m.magic != PEER_MAGIC)
        return pt_fail(PIPERT_ERR_PEER, "CUDA IPC: the peer memory to copy from is not a CUDA table's");
    if (!pt_cuda.ready) return pt_fail(PIPERT_ERR_NO_DEVICE, "CUDA IPC: the backend is not started");
    std::lock_guard<std::mutex> guard(peers.lock);
    cudaError_t err = cudaSetDevice(pt_cuda.device); /* this thread may not have made it current */
    if (err != cudaSuccess) return cuda_failure(err, "cudaSetDevice");
    PT_TRY(ensure_stream());
    char *base = NULL;
    PT_TRY(opened_base(m.handle, &base));
    if ((err = cudaEventRecord(peers.compute_mark, pt_cuda.compute)) != cudaSuccess ||
        (err = cudaStreamWaitEvent(peers.stream, peers.compute_mark, 0)) != cudaSuccess ||
        (err = cudaMemcpyAsync(dst, base + m.offset, bytes, cudaMemcpyDefault, peers.stream)) !=
            cudaSuccess ||
        (err = cudaStreamSynchronize(peers.stream)) != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "copying %zu bytes from the arena of device %d of a peer", bytes,
                 m.device);
        return cuda_failure(err, what);
    }
    return PIPERT_OK;
}

extern "C" void pt_cuda_peer_close(void)
{
    std::lock_guard<std::mutex> guard(peers.lock);
    for (int i = 0; i < peers.n_opened; i++) cudaIpcCloseMemHandle(peers.opened[i].base);
    if (peers.compute_mark) cudaEventDestroy(peers.compute_mark);
    if (peers.stream) cudaStreamDestroy(peers.stream);
    memset(peers.opened, 0, sizeof peers.opened);
    peers.n_opened = peers.next_evicted = 0;
    peers.stream = NULL;
    peers.compute_mark = NULL;
    peers.exported = false;
}
