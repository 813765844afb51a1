/* Which kernel table runs a runtime.device. */
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/kernels.h"
#include "runtime/error.h"

pipert_result pt_kernels_for_device(const char *device, const pt_kernels **out)
{
    *out = NULL;
    if (!strcmp(device, "cpu")) *out = pt_kernels_cpu();
    else if (!strcmp(device, "cpu-guarded")) *out = pt_kernels_cpu_guarded();
    else if (!strcmp(device, "cuda")) return pt_kernels_cuda(out);
    else
        return pt_fail(PIPERT_ERR_CONFIG,
                       "runtime.device: unknown \"%s\" (expected cpu, cuda or cpu-guarded)", device);
    return PIPERT_OK;
}

pt_attention_sizer pt_kernels_attention_sizer(const char *device)
{
    if (!strcmp(device, "cuda")) return pt_cuda_attention_saved_floats;
    return pt_kernels_cpu()->attention_saved_floats;
}
