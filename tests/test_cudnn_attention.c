/* cuDNN's fused attention graphs (kernels/cuda/cudnn_attention.c), without a GPU: cuDNN is
 * asked, for an H100 described to it, whether its engines take the forward and backward
 * graphs pipert builds at GPT-2's shapes and others (head sizes 64 and 128, T up to 4,096),
 * and compiles the first one's kernel.
 *
 * cuDNN (≥ 9.8) builds plans for a described device; its runtime-compiled engines, which run
 * these graphs, compile with NVRTC and then load the result through the driver, libcuda.so.1.
 * tests/meson.build points LD_LIBRARY_PATH at the CUDA toolkit's stub of it, which answers
 * every call with CUDA_ERROR_STUB_LIBRARY: so a plan that ends in
 * CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER was recognised and compiled, and failed only in
 * the load that needs a device. What this catches (each tried by a mutation, session 38): an
 * operation no engine's pattern has (the forward's softmax dividing by a product) leaves no
 * configuration; operands whose shapes do not compose (dq from kᵀ) are refused as the graph is
 * built. What it cannot: an operation swapped for another the pattern allows (the backward's
 * dP − D made dP + D; Pᵀ given untransposed, square either way), or an accumulator's order;
 * whether the kernels compute the right thing is test_cuda_bf16's, on a GPU. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cudnn_attention.h"

/* An H100 SXM5 80GB as cuDNN's device description: the CUDA attributes it reads, with the
 * values NVIDIA documents for that device (compute capability 9.0, 132 SMs, 50 MiB of L2,
 * 227 KiB of shared memory a block at most). A GPU session can replace it with the device's
 * own (CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION of a description made from a handle). */
static const char h100[] =
    "{\"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": [1024, 1024, 64],"
    " \"regsPerBlock\": 65536, \"multiProcessorCount\": 132, \"warpSize\": 32,"
    " \"maxSharedMemoryPerBlock\": 49152, \"maxSharedMemoryPerBlockOptin\": 232448,"
    " \"reservedSharedMemoryPerBlock\": 1024, \"maxRegistersPerSM\": 65536, \"maxCtasPerSM\": 32,"
    " \"maxThreadsPerBlock\": 1024, \"maxThreadsPerSM\": 2048, \"pciDeviceId\": 0,"
    " \"isTccDriver\": 0, \"supportCoopLaunch\": 1, \"totalGlobalMem\": 84934656000,"
    " \"smClockRateKHz\": 1980000, \"memClockRateKHz\": 2619000, \"l2CacheSize\": 52428800,"
    " \"cudaDeviceId\": 0, \"deviceVer\": 900, \"driverVer\": 13000,"
    " \"deviceName\": \"NVIDIA H100 80GB HBM3\"}";

static const pt_cudnn_attention_shape shapes[] = {
    {16, 1024, 12, 64}, /* GPT-2 124M at B = 16 */
    {4, 4096, 12, 64},
    {8, 1024, 8, 128},
    {2, 4096, 16, 128},
    {3, 200, 4, 64}, /* a T no tile divides */
};

static pt_cudnn *open_h100(void)
{
    pt_cudnn *c = NULL;
    pipert_result rc = pt_cudnn_open_described(&c, h100);
    cr_assert_eq(rc, PIPERT_OK, "cuDNN with an H100's description: %s", pipert_last_error());
    return c;
}

/* Every shape's graph for `pass` recognised by an engine, and its kernel compiled. */
static void check_pass(pt_cudnn_attention_pass pass)
{
    pt_cudnn *c = open_h100();
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const pt_cudnn_attention_shape s = shapes[i];
        pt_cudnn_attention_report r;
        cr_assert_eq(pt_cudnn_attention_plan(c, pass, s, &r), PIPERT_OK, "B %d T %d hs %d: %s",
                     s.B, s.T, s.hs, pipert_last_error());
        printf("B %2d T %4d NH %2d hs %3d: %d configurations, engine %d: %s\n", s.B, s.T, s.NH,
               s.hs, r.engine_configs, r.engine, c->api.get_error_string(r.plan_status));
        cr_expect_gt(r.engine_configs, 0, "B %d T %d hs %d: no engine takes the graph", s.B, s.T,
                     s.hs);
        cr_expect(r.plan_status == CUDNN_STATUS_SUCCESS ||
                      r.plan_status == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER,
                  "B %d T %d hs %d: engine %d's plan did not compile: %s (%s)", s.B, s.T, s.hs,
                  r.engine, c->api.get_error_string(r.plan_status), r.plan_reason);
    }
    pt_cudnn_close(c);
}

Test(cudnn_attention, forward_graphs_compile_for_an_h100, .timeout = 120)
{
    check_pass(PT_CUDNN_ATTENTION_FORWARD);
}

Test(cudnn_attention, backward_graphs_compile_for_an_h100, .timeout = 120)
{
    check_pass(PT_CUDNN_ATTENTION_BACKWARD);
}

Test(cudnn_attention, a_description_cudnn_refuses_is_named)
{
    pt_cudnn *c = NULL;
    pipert_result rc = pt_cudnn_open_described(&c, "{\"maxGridSize\": [1, 1, 1]}");
    cr_expect_eq(rc, PIPERT_ERR_INVALID_ARG);
    cr_expect_null(c);
    cr_expect(strstr(pipert_last_error(), "the device description") != NULL, "%s",
              pipert_last_error());
    cr_expect(strstr(pipert_last_error(), "maxBlockSize") != NULL, "cuDNN's reason: %s",
              pipert_last_error());
}

Test(cudnn_attention, no_plan_is_kept_for_a_described_device)
{
    /* the plans compile for the description, but only a device runs them */
    pt_cudnn *c = open_h100();
    size_t bytes = 0;
    cr_expect_eq(pt_cudnn_attention_workspace(c, PT_CUDNN_ATTENTION_FORWARD, shapes[0], &bytes),
                 PIPERT_ERR_UNSUPPORTED);
    cr_expect(strstr(pipert_last_error(), "no plan") != NULL, "%s", pipert_last_error());
    pt_cudnn_close(c);
}

Test(cudnn_attention, a_gpu_here_describes_itself_with_the_fields_of_ours)
{
    /* on a GPU (gpu-check carries this test): the device's own description, printed so that a
     * session can keep it, with the same fields as the H100's above; skipped without one */
    pt_cudnn *c = NULL;
    if (pt_cudnn_open(&c, NULL) != PIPERT_OK) cr_skip_test("no device for cuDNN: %s", pipert_last_error());
    char *json = NULL;
    cr_assert_eq(pt_cudnn_device_json(c, &json), PIPERT_OK, "%s", pipert_last_error());
    printf("this device, as cuDNN describes it: %s\n", json);
    json_t *own = json_loads(json, 0, NULL), *ours = json_loads(h100, 0, NULL);
    cr_assert(own && ours, "both descriptions are JSON objects");
    const char *key;
    json_t *value;
    json_object_foreach(ours, key, value)
        cr_expect(json_object_get(own, key) != NULL, "the device's description has no %s", key);
    json_object_foreach(own, key, value)
        cr_expect(json_object_get(ours, key) != NULL, "ours has no %s", key);
    json_decref(own), json_decref(ours), free(json);
    pt_cudnn_close(c);
}
