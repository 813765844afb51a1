/* cuDNN loaded at run time (cudnn_api.h). */
#include "kernels/cuda/cudnn_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIBRARY "libcudnn.so.9"
#define DEVICE_DESCRIPTIONS_SINCE 90800 /* CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR */

pipert_result pt_cudnn_fail(const pt_cudnn *c, pipert_result code, cudnnStatus_t status,
                            const char *what)
{
    char reason[512] = "";
    c->api.get_last_error_string(reason, sizeof reason);
    return pt_fail(code, "%s: %s%s%s%s", what, c->api.get_error_string(status),
                   reason[0] ? " (" : "", reason, reason[0] ? ")" : "");
}

/* Each entry point by name; PIPERT_ERR_UNSUPPORTED naming the one that is missing. */
static pipert_result resolve(pt_cudnn *c)
{
    const struct {
        void **slot;
        const char *name;
    } entries[] = {
        {(void **)&c->api.get_version, "cudnnGetVersion"},
        {(void **)&c->api.get_error_string, "cudnnGetErrorString"},
        {(void **)&c->api.get_last_error_string, "cudnnGetLastErrorString"},
        {(void **)&c->api.create, "cudnnCreate"},
        {(void **)&c->api.destroy, "cudnnDestroy"},
        {(void **)&c->api.set_stream, "cudnnSetStream"},
        {(void **)&c->api.create_descriptor, "cudnnBackendCreateDescriptor"},
        {(void **)&c->api.destroy_descriptor, "cudnnBackendDestroyDescriptor"},
        {(void **)&c->api.finalize, "cudnnBackendFinalize"},
        {(void **)&c->api.set_attribute, "cudnnBackendSetAttribute"},
        {(void **)&c->api.get_attribute, "cudnnBackendGetAttribute"},
        {(void **)&c->api.execute, "cudnnBackendExecute"},
    };
    for (size_t i = 0; i < sizeof entries / sizeof *entries; i++) {
        *entries[i].slot = dlsym(c->library, entries[i].name);
        if (!*entries[i].slot)
            return pt_fail(PIPERT_ERR_UNSUPPORTED, "cuDNN: %s has no %s", LIBRARY,
                           entries[i].name);
    }
    return PIPERT_OK;
}

static pipert_result load(pt_cudnn **out)
{
    *out = NULL;
    pt_cudnn *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "cuDNN: out of host memory");
    c->library = dlopen(LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!c->library) {
        const char *why = dlerror();
        free(c);
        return pt_fail(PIPERT_ERR_UNSUPPORTED,
                       "cuDNN: %s not found (%s); it comes with the CUDA toolkit's cuDNN or "
                       "PyTorch's nvidia-cudnn wheel (its lib/ on LD_LIBRARY_PATH)",
                       LIBRARY, why ? why : "dlopen failed");
    }
    pipert_result rc = resolve(c);
    if (rc == PIPERT_OK) {
        c->version = c->api.get_version();
        if (c->version < DEVICE_DESCRIPTIONS_SINCE)
            rc = pt_fail(PIPERT_ERR_UNSUPPORTED, "cuDNN: version %zu is older than 9.8",
                         c->version);
    }
    if (rc != PIPERT_OK) {
        pt_cudnn_close(c);
        return rc;
    }
    *out = c;
    return PIPERT_OK;
}

pipert_result pt_cudnn_open(pt_cudnn **out, cudaStream_t stream)
{
    PT_TRY(load(out));
    pt_cudnn *c = *out;
    c->stream = stream;
    cudnnStatus_t status = c->api.create(&c->handle);
    if (status == CUDNN_STATUS_SUCCESS) status = c->api.set_stream(c->handle, stream);
    if (status != CUDNN_STATUS_SUCCESS) {
        pipert_result rc =
            pt_cudnn_fail(c, PIPERT_ERR_UNSUPPORTED, status, "cuDNN: a handle on the device");
        pt_cudnn_close(c);
        *out = NULL;
        return rc;
    }
    return PIPERT_OK;
}

pipert_result pt_cudnn_open_described(pt_cudnn **out, const char *json)
{
    PT_TRY(load(out));
    pt_cudnn *c = *out;
    cudnnStatus_t status = c->api.create_descriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &c->device);
    if (status == CUDNN_STATUS_SUCCESS)
        status = c->api.set_attribute(c->device, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
                                      CUDNN_TYPE_CHAR, (int64_t)strlen(json) + 1, json);
    if (status == CUDNN_STATUS_SUCCESS) status = c->api.finalize(c->device);
    if (status != CUDNN_STATUS_SUCCESS) {
        pipert_result rc =
            pt_cudnn_fail(c, PIPERT_ERR_INVALID_ARG, status, "cuDNN: the device description");
        pt_cudnn_close(c);
        *out = NULL;
        return rc;
    }
    return PIPERT_OK;
}

pipert_result pt_cudnn_device_json(const pt_cudnn *c, char **json)
{
    *json = NULL;
    if (!c->handle) return pt_fail(PIPERT_ERR_INVALID_ARG, "cuDNN: a device description needs a handle");
    cudnnBackendDescriptor_t d = NULL;
    int64_t length = 0;
    cudnnStatus_t status = c->api.create_descriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d);
    if (!status)
        status = c->api.set_attribute(d, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                      &c->handle);
    if (!status) status = c->api.finalize(d);
    if (!status)
        status = c->api.get_attribute(d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                      0, &length, NULL);
    if (!status && !(*json = calloc((size_t)length + 1, 1))) status = CUDNN_STATUS_ALLOC_FAILED;
    if (!status)
        status = c->api.get_attribute(d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                      length, &length, *json);
    if (d) c->api.destroy_descriptor(d);
    if (!status) return PIPERT_OK;
    free(*json);
    *json = NULL;
    return pt_cudnn_fail(c, PIPERT_ERR_INTERNAL, status, "cuDNN: describing the device");
}

void pt_cudnn_close(pt_cudnn *c)
{
    if (!c) return;
    if (c->free_attention) c->free_attention(c);
    if (c->device) c->api.destroy_descriptor(c->device);
    if (c->handle) c->api.destroy(c->handle);
    if (c->library) dlclose(c->library);
    free(c);
}
