/* One Adam-family step over the regions of a flat buffer, one thread per
 * element, a batch of regions a launch (adam_batch.h); the coefficients (AdamW or
 * NAdamW, bias corrections, learning rate) come folded into pt_adam_coeffs
 * (kernels.h, train/optimizer.c), one set for decayed regions and one for the
 * rest. Parameters and moments are fp32 (the master copy, also when the matrix
 * products run in bf16).
 *
 * Naive reading, per element, g = grad_scale·grad:
 *   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  d = √(v/bias2) + ε
 *   θ ← θ·decay − c_grad·g/d − c_mom·m/d
 *
 * Weight prediction (lookahead = predict, kernels.h), m and v only read:
 *   out = θ − (steps·(1 − decay)·θ + steps·c_mom·m/d)
 *
 * And the delay compensation of lookahead = dc-asgd (kernels.h), v only read:
 *   g ← g + λ·g·g·(now − used)/d
 * and nesterov-secant's, with a running secant κ per element (kernels.h).
 */
#include "kernels/cuda/common.cuh" /* first: it takes kernels.h in as C */
#include "kernels/cuda/adam_batch.h"
#include "kernels/cuda/vector.cuh"

/* __grid_constant__: the batch is read where the parameters live, not copied per thread. W
 * elements a step (W = 4: 16-byte loads, vector.cuh, where every region of the batch starts at a
 * multiple of 4 and the buffers are 16-byte aligned: a GPT-2's tensors are all multiples of 4
 * long; the region's search then once per 4 elements). */
template <int W>
__global__ void adam_update_kernel(float *param, const float *grad, float *m, float *v,
                                   const __grid_constant__ pt_adam_batch batch,
                                   pt_adam_coeffs decayed, pt_adam_coeffs plain, float grad_scale)
{
    /* param, grad, m, v: the flat buffers; each element of the batch's regions once; the
     * gradient read as grad_scale·grad */
    const float inv_plain = 1.0f / plain.bias2, inv_decayed = 1.0f / decayed.bias2;
    const size_t total = (size_t)batch.start[batch.count];
    PT_GRID_STRIDE_LOOP(step, (total + W - 1) / W)
    {
        const size_t j = step * W;
        const int r = pt_adam_batch_region(&batch, j);
        const pt_adam_coeffs c = batch.decay[r] ? decayed : plain;
        const float inv_bias2 = batch.decay[r] ? inv_decayed : inv_plain;
        const size_t i = batch.offset[r] + (j - batch.start[r]);
        pt_elements<float, W> g = pt_load<W>(grad + i);
#pragma unroll
        for (int k = 0; k < W; k++) g.e[k] *= grad_scale;
        pt_elements<float, W> p = pt_load<W>(param + i), mi = pt_load<W>(m + i),
                              vi = pt_load<W>(v + i);
#pragma unroll
        for (int k = 0; k < W; k++) {
            mi.e[k] = c.beta1 * mi.e[k] + (1.0f - c.beta1) * g.e[k];
            vi.e[k] = c.beta2 * vi.e[k] + (1.0f - c.beta2) * g.e[k] * g.e[k];
            const float d = sqrtf(vi.e[k] * inv_bias2) + c.eps;
            p.e[k] = p.e[k] * c.decay - (c.c_grad * g.e[k] + c.c_mom * mi.e[k]) / d;
        }
        pt_store<W>(param + i, p);
        pt_store<W>(m + i, mi);
        pt_store<W>(v + i, vi);
    }
}

void pt_cuda_adam_update(float *param, const float *grad, float *m, float *v,
                         const pt_param_region *regions, int n_regions,
                         const pt_adam_coeffs *decayed, const pt_adam_coeffs *plain,
                         float grad_scale)
{
    const bool aligned = pt_aligned16(param, grad, m, v);
    for (int first = 0; first < n_regions;) {
        pt_adam_batch batch;
        first = pt_adam_batch_fill(&batch, regions, n_regions, first);
        const size_t total = batch.start[batch.count];
        if (total == 0) continue;
        if (aligned && pt_adam_batch_in_steps_of(&batch, 4))
            adam_update_kernel<4><<<pt_cuda_blocks_for(total / 4), PT_CUDA_THREADS, 0,
                                    pt_cuda.compute>>>(param, grad, m, v, batch, *decayed, *plain,
                                                       grad_scale);
        else
            adam_update_kernel<1><<<pt_cuda_blocks_for(total), PT_CUDA_THREADS, 0,
                                    pt_cuda.compute>>>(param, grad, m, v, batch, *decayed, *plain,
                                                       grad_scale);
        PT_CUDA_LAUNCHED("adam_update_kernel");
    }
}

__global__ void adam_extrapolate_kernel(float *out, const float *param, const float *m,
                                        const float *v, size_t n, float inv_bias2, float eps,
                                        float shrink, float push)
{
    /* out[n], param[n], m[n], v[n]; out may be param */
    PT_GRID_STRIDE_LOOP(i, n)
    {
        float d = sqrtf(v[i] * inv_bias2) + eps;
        float p = param[i];
        /* the correction summed first, as on the CPU: steps = 0 gives θ exactly */
        out[i] = p - (shrink * p + push * m[i] / d);
    }
}

void pt_cuda_adam_extrapolate(float *out, const float *param, const float *m, const float *v,
                              size_t n, const pt_adam_coeffs *coeffs, float steps)
{
    const float shrink = steps * (1.0f - coeffs->decay), push = steps * coeffs->c_mom;
    PT_LAUNCH_ELEMENTWISE(adam_extrapolate_kernel, n, out, param, m, v, n, 1.0f / coeffs->bias2,
                          coeffs->eps, shrink, push);
}

__global__ void delay_compensate_kernel(float *grad, const float *now, const float *used,
                                        const float *v, size_t n, float inv_bias2, float eps,
                                        float lambda)
{
    /* grad[n], now[n], used[n], v[n] */
    PT_GRID_STRIDE_LOOP(i, n)
    {
        float g = grad[i];
        float d = sqrtf(v[i] * inv_bias2) + eps;
        grad[i] = g + lambda * g * g * (now[i] - used[i]) / d;
    }
}

void pt_cuda_delay_compensate(float *grad, const float *now, const float *used, const float *v,
                              size_t n, const pt_adam_coeffs *coeffs, float lambda)
{
    PT_LAUNCH_ELEMENTWISE(delay_compensate_kernel, n, grad, now, used, v, n, 1.0f / coeffs->bias2,
                          coeffs->eps, lambda);
}

__global__ void secant_compensate_kernel(float *grad, const float *now, const float *used,
                                         float *prev_grad, float *prev_used, float *num,
                                         float *den, const float *v, size_t n, pt_secant_coeffs c)
{
    /* grad[n], now[n], used[n], prev_grad[n], prev_used[n], num[n], den[n], v[n] */
    PT_GRID_STRIDE_LOOP(i, n)
    {
        float g = grad[i], w = used[i];
        if (c.learn) {
            float dw = w - prev_used[i], dg = g - prev_grad[i];
            num[i] = c.beta * num[i] + (1.0f - c.beta) * dg * dw;
            den[i] = c.beta * den[i] + (1.0f - c.beta) * dw * dw;
        }
        prev_grad[i] = g;
        prev_used[i] = w;
        if (c.apply && den[i] > 0.0f) {
            float cap = c.cap * (sqrtf(v[i] * c.inv_bias2) + c.eps);
            float kappa = fminf(fmaxf(num[i] / den[i], 0.0f), cap);
            grad[i] = g + c.scale * kappa * (now[i] - w);
        }
    }
}

void pt_cuda_secant_compensate(float *grad, const float *now, const float *used, float *prev_grad,
                               float *prev_used, float *num, float *den, const float *v, size_t n,
                               const pt_secant_coeffs *coeffs)
{
    PT_LAUNCH_ELEMENTWISE(secant_compensate_kernel, n, grad, now, used, prev_grad, prev_used, num,
                          den, v, n, *coeffs);
}
