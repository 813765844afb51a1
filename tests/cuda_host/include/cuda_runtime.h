/* The emulated device's CUDA runtime (tests/cuda_host): the types and calls
 * kernels/cuda's kernel files use, on host memory. include/cuda_host.hpp says
 * what runs and what is checked. */
#ifndef PT_TESTS_CUDA_HOST_RUNTIME_H
#define PT_TESTS_CUDA_HOST_RUNTIME_H

#include <cstddef>
#include <cstdio> /* printf in kernels, as CUDA's runtime header gives it */
#include <cstdlib>
#include <cstring>

#include "cuda_host.hpp"

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchFailure = 719,
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

/* The fields kernels/cuda reads, with an H100's values (backend.cpp fills them). */
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    int multiProcessorCount;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin;
};

inline cudaError_t cudaGetLastError() { return (cudaError_t)cuda_host::take_error(); }
inline cudaError_t cudaPeekAtLastError() { return (cudaError_t)cuda_host::peek_error(); }

inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "unspecified launch failure";
    }
}

/* Device memory on the host, 256-byte aligned as cudaMalloc's, starting as NaNs (a kernel that
 * reads what nobody wrote gets them). */
inline cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    const size_t size = (bytes + 255) / 256 * 256;
    *ptr = std::aligned_alloc(256, size > 0 ? size : 256);
    if (!*ptr) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i + 4 <= size; i += 4) std::memcpy((char *)*ptr + i, "\xc0\x7f\xc0\x7f", 4);
    return cudaSuccess;
}

inline cudaError_t cudaFree(void *ptr)
{
    std::free(ptr);
    return cudaSuccess;
}

/* One stream, work done when launched: a copy after a kernel sees its results. */
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t = nullptr)
{
    std::memmove(dst, src, bytes);
    return (cudaError_t)cuda_host::sticky_error();
}

inline cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t = nullptr)
{
    std::memset(dst, value, bytes);
    return (cudaError_t)cuda_host::sticky_error();
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    return (cudaError_t)cuda_host::sticky_error();
}

template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel *kernel, cudaFuncAttribute attribute, int value)
{
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return cuda_host::set_max_dynamic_shared((const void *)kernel, value) ? cudaSuccess
                                                                         : cudaErrorInvalidValue;
}

#endif
