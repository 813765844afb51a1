/* cuDNN's backend graph API, loaded at run time: pipert links no cuDNN, so it starts where
 * libcudnn is absent and uses it where it is found (libcudnn.so.9: the CUDA toolkit's, or
 * PyTorch's wheel, site-packages/nvidia/cudnn/lib, on LD_LIBRARY_PATH).
 *
 * A pt_cudnn is the loaded library and what its plans are built for: a handle on the current
 * device and a stream (to run them), or a device description, the JSON of cuDNN's
 * CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR (cuDNN ≥ 9.8), to build and compile plans for a device
 * this machine does not have (tests/test_cudnn_attention.c: an H100's, on a CPU-only machine).
 * Private to kernels/cuda/ and its tests. */
#ifndef PT_KERNELS_CUDA_CUDNN_API_H
#define PT_KERNELS_CUDA_CUDNN_API_H

#include <cudnn_graph.h>
#include <stdbool.h>
#include <stddef.h>

#include "runtime/error.h"

typedef struct pt_cudnn_api {
    size_t (*get_version)(void);
    const char *(*get_error_string)(cudnnStatus_t);
    void (*get_last_error_string)(char *message, size_t max_size);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*create_descriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroy_descriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set_attribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                   cudnnBackendAttributeType_t, int64_t count, const void *);
    cudnnStatus_t (*get_attribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                   cudnnBackendAttributeType_t, int64_t requested,
                                   int64_t *count, void *);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t plan,
                             cudnnBackendDescriptor_t variant_pack);
} pt_cudnn_api;

typedef struct pt_cudnn {
    void *library; /* dlopen's */
    pt_cudnn_api api;
    size_t version; /* cudnnGetVersion: 91900 for 9.19.0 */
    cudnnHandle_t handle;             /* to run plans; NULL when built for a description */
    cudaStream_t stream;              /* the handle's */
    cudnnBackendDescriptor_t device;  /* the device description; NULL with a handle */
    struct pt_cudnn_attention_plans *attention; /* cudnn_attention.c's cache */
    void (*free_attention)(struct pt_cudnn *);   /* ... and how pt_cudnn_close frees it */
} pt_cudnn;

/* Loads libcudnn.so.9 and makes a handle on the current device that runs on `stream`.
 * PIPERT_ERR_UNSUPPORTED (the message says what was missing) where there is no libcudnn, or
 * one older than 9.8. */
pipert_result pt_cudnn_open(pt_cudnn **out, cudaStream_t stream);

/* Loads libcudnn.so.9 to build plans for the device `json` describes (no device needed). */
pipert_result pt_cudnn_open_described(pt_cudnn **out, const char *json);

void pt_cudnn_close(pt_cudnn *c);

/* The handle's device as cuDNN describes it (the JSON pt_cudnn_open_described takes), malloc'ed:
 * what a test's description of a device should be. */
pipert_result pt_cudnn_device_json(const pt_cudnn *c, char **json);

/* Fails with `code` and "what: CUDNN_STATUS_... (cuDNN's last error's reason)". */
pipert_result pt_cudnn_fail(const pt_cudnn *c, pipert_result code, cudnnStatus_t status,
                            const char *what);

#endif
