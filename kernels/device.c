/* The runtime.device table: which kernel table runs a device, and what estimates need to
 * know of it without starting it. */
#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "runtime/error.h"

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

/* Indexed by runtime.device's values (runtime/settings.h). */
static const pt_device_traits devices[PT_DEVICE_KINDS] = {
    /* the GELU kept: recomputing it costs 1.4% of the reference model's step (`pipert bench
     * --profile`), and host memory is rarely what runs short */
    [PT_DEVICE_CPU] = {false, false, false, cpu_attention_saved_floats, cpu_kernels},
    [PT_DEVICE_CUDA] = {true, true, true, pt_cuda_attention_saved_floats, pt_kernels_cuda},
    /* the CPU's kernels on memory the host may not touch outside them (kernels/guarded.c):
     * host memory all the same, the model run and its memory counted as on a GPU */
    [PT_DEVICE_CPU_GUARDED] = {false, true, true, cpu_attention_saved_floats,
                               cpu_guarded_kernels},
};

const pt_device_traits *pt_device_traits_of(pt_device_kind device)
{
    if ((unsigned)device < PT_DEVICE_KINDS) return &devices[device];
    pt_fail(PIPERT_ERR_CONFIG, "runtime.device: no device has the value %d", (int)device);
    return NULL;
}

pipert_result pt_kernels_for_device(pt_device_kind device, const pt_kernels **out)
{
    *out = NULL;
    const pt_device_traits *traits = pt_device_traits_of(device);
    return traits ? traits->kernels(out) : PIPERT_ERR_CONFIG;
}

pt_attention_sizer pt_kernels_attention_sizer(pt_device_kind device)
{
    const pt_device_traits *traits = pt_device_traits_of(device);
    if (!traits) pt_error_clear(); /* an estimate: the CPU's */
    return traits ? traits->attention_sizer : cpu_attention_saved_floats;
}
