/* pt_kernels_cuda for builds without the CUDA backend (meson -Dcuda=disabled,
 * or no nvcc found): asking for it is a clear error, not a crash. */
#include "kernels/kernels.h"
#include "runtime/error.h"

pipert_result pt_kernels_cuda(const pt_kernels **out)
{
    *out = NULL;
    return pt_fail(PIPERT_ERR_UNSUPPORTED,
                   "this build has no CUDA backend (rebuild with meson -Dcuda=enabled on a "
                   "machine with the CUDA toolkit), use runtime.device=\"cpu\"");
}
