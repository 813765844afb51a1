/* The runtime.device table: which kernel table runs a device, and what estimates need to
 * know of it without starting it. */
#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "runtime/error.h"
#include "runtime/name_table.h"

static pipert_result cpu_kernels(const pt_kernels **out)
{
    *out = pt_kernels_cpu();
    return PIPERT_OK;
}

static pipert_result cpu_guarded_kernels(const pt_kernels **out)
{
    *out = pt_kernels_cpu_guarded();
    return PIPERT_OK;
}

static size_t cpu_attention_saved_floats(int B, int T, int C, int NH)
{
    return pt_kernels_cpu()->attention_saved_floats(B, T, C, NH);
}

static const pt_device_traits devices[] = {
    {"cpu", false, cpu_attention_saved_floats, cpu_kernels},
    {"cuda", true, pt_cuda_attention_saved_floats, pt_kernels_cuda},
    /* the CPU's kernels on memory the host may not touch outside them (kernels/guarded.c):
     * host memory all the same */
    {"cpu-guarded", false, cpu_attention_saved_floats, cpu_guarded_kernels},
};
#define DEVICE_COUNT (int)(sizeof devices / sizeof devices[0])

const pt_device_traits *pt_device_named(const char *device)
{
    const int i = pt_name_table_find(devices, DEVICE_COUNT, device, "runtime.device");
    return i < 0 ? NULL : &devices[i];
}

pipert_result pt_kernels_for_device(const char *device, const pt_kernels **out)
{
    *out = NULL;
    const pt_device_traits *traits = pt_device_named(device);
    return traits ? traits->kernels(out) : PIPERT_ERR_CONFIG;
}

pt_attention_sizer pt_kernels_attention_sizer(const char *device)
{
    const pt_device_traits *traits = pt_device_named(device);
    if (!traits) pt_error_clear(); /* an estimate: the CPU's */
    return traits ? traits->attention_sizer : cpu_attention_saved_floats;
}
