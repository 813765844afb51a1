/* Token and position embeddings.
 *
 * Naive reading:
 *   forward:  out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
 *   backward: dwte[tokens[b,t], :] += dout[b,t,:];  dwpe[t, :] += dout[b,t,:]
 */
#include "kernels/cpu/cpu.h"

void pt_cpu_encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C)
{
    /* out[B·T, C], tokens[B·T], wte[V, C], wpe[T_max, C] */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        float *out_row = out + (size_t)n * C;
        const float *token_row = wte + (size_t)tokens[n] * C;
        const float *position_row = wpe + (size_t)(n % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) out_row[c] = token_row[c] + position_row[c];
    }
}

void pt_cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C)
{
    /* Positions are disjoint rows of dwpe: one thread per t, no races. */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *dpos = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
#pragma omp simd
            for (int c = 0; c < C; c++) dpos[c] += d[c];
        }
    }
    /* Tokens repeat, so rows of dwte may collide: serial over positions (this
     * is B·T·C additions, negligible beside the matmuls). */
    for (int n = 0; n < B * T; n++) {
        float *dtok = dwte + (size_t)tokens[n] * C;
        const float *d = dout + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) dtok[c] += d[c];
    }
}
