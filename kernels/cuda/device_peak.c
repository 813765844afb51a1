/* Peak FLOP/s of NVIDIA devices by the name CUDA reports, for MFU
 * (ALGORITHMS.md §1: "from a table by device name on GPU"). Dense (no
 * sparsity) figures from NVIDIA's data sheets. Pure C, in every build. */
#include <stddef.h>
#include <string.h>

#include "kernels/cuda/cuda.h"

typedef struct device_peak {
    const char *name_part;   /* matched with strstr, first match wins */
    double bf16_tensor_flops; /* dense bf16 tensor-core peak */
    double fp32_flops;        /* fp32 on CUDA cores */
} device_peak;

static const device_peak peaks[] = {
    {"H100 PCIe", 756e12, 51e12},
    {"H100 NVL", 835e12, 60e12},
    {"H100", 989e12, 67e12}, /* SXM ("H100 80GB HBM3") */
    {"H200", 989e12, 67e12}, /* also GH200 */
    {"H800", 989e12, 67e12},
    {"A100", 312e12, 19.5e12},
    {"A800", 312e12, 19.5e12},
};

double pt_cuda_peak_flops(const char *device_name, int bf16)
{
    if (!device_name) return 0;
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        if (strstr(device_name, peaks[i].name_part))
            return bf16 ? peaks[i].bf16_tensor_flops : peaks[i].fp32_flops;
    return 0;
}
