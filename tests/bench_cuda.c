/* Speed of the CUDA backend on GPT-2 124M, and a short training run.
 *
 *   bench_cuda                      GPT-2 124M (12 layers, 768 wide, 12 heads,
 *                                   T = 1024, vocabulary 50257), B = 16: 3
 *                                   warm-up steps, then 10 timed steps
 *   bench_cuda --train [--steps N]  N (default 100) steps, the loss of each
 *   options: --batch B --seq T --layers L --width C --heads H --vocab V
 *            --steps N --warmup W --lr LR --data PATH (text or llm.c shard)
 *            --tf32 (let fp32 GEMMs use TF32) --bf16 (runtime.precision=bf16: the matrix
 *            products' operands in bf16 on tensor cores) --profile (per-kernel times)
 *
 * Throughput is tokens per second over the median timed step (the executor
 * synchronizes the device at the end of each step). MFU counts the model's
 * FLOPs per token, 6·N + 12·L·C·T (ALGORITHMS.md §1), against the device's
 * dense bf16 tensor-core peak from pt_cuda_peak_flops (H100 SXM and H200:
 * 989 TFLOP/s, A100: 312); the fp32 CUDA-core peak is printed beside it, the
 * fairer yardstick while the matrix products run in fp32.
 *
 * Data: --data, else the fortunes corpus (bytes, which fit any vocabulary),
 * else, on a machine without it, a synthetic token stream whose next token
 * is one of 4 successors of the current one (a loss floor of ln 4 ≈ 1.39),
 * written once to a temporary shard.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/cuda.h"
#include "kernels/profile.h"
#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/stats.h"
#include "pipeline/executor.h"

typedef struct bench_options {
    int batch, seq, layers, width, heads, vocab;
    int steps, warmup;
    double lr;
    const char *data;
    int train, tf32, bf16, profile;
} bench_options;

static void usage(void)
{
    fprintf(stderr, "usage: bench_cuda [--train] [--steps N] [--warmup W] [--batch B] [--seq T] "
                    "[--layers L] [--width C] [--heads H] [--vocab V] [--lr LR] [--data PATH] "
                    "[--tf32] [--bf16] [--profile]\n");
}

static int parse_options(int argc, char **argv, bench_options *o)
{
    *o = (bench_options){.batch = 16, .seq = 1024, .layers = 12, .width = 768, .heads = 12,
                         .vocab = 50257, .steps = -1, .warmup = 3, .lr = 6e-4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int *number = !strcmp(a, "--batch")    ? &o->batch
                      : !strcmp(a, "--seq")    ? &o->seq
                      : !strcmp(a, "--layers") ? &o->layers
                      : !strcmp(a, "--width")  ? &o->width
                      : !strcmp(a, "--heads")  ? &o->heads
                      : !strcmp(a, "--vocab")  ? &o->vocab
                      : !strcmp(a, "--steps")  ? &o->steps
                      : !strcmp(a, "--warmup") ? &o->warmup
                                               : NULL;
        if (number && value) *number = atoi(value), i++;
        else if (!strcmp(a, "--lr") && value) o->lr = atof(value), i++;
        else if (!strcmp(a, "--data") && value) o->data = value, i++;
        else if (!strcmp(a, "--train")) o->train = 1;
        else if (!strcmp(a, "--tf32")) o->tf32 = 1;
        else if (!strcmp(a, "--bf16")) o->bf16 = 1;
        else if (!strcmp(a, "--profile")) o->profile = 1;
        else {
            usage();
            return 0;
        }
    }
    if (o->steps < 0) o->steps = o->train ? 100 : 10;
    if (o->train) o->warmup = 0; /* every step's loss is the point */
    return 1;
}

/* A shard of `count` tokens where each token's successor is one of 4 fixed
 * choices, picked at random: learnable down to ln 4 nats. */
static int write_synthetic_shard(const char *path, int vocab, size_t count)
{
    uint16_t *tokens = malloc(count * sizeof *tokens);
    if (!tokens) return 0;
    uint64_t state = 88172645463325252ull;
    int v = vocab < 65536 ? vocab : 65535, t = 0;
    for (size_t i = 0; i < count; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        t = (int)(((uint64_t)t * 2654435761u + (state & 3) * 40503u + 12345u) % (uint64_t)v);
        tokens[i] = (uint16_t)t;
    }
    int ok = pt_shard_write(path, tokens, count) == PIPERT_OK;
    free(tokens);
    return ok;
}

static int set(pipert_config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int set(pipert_config *cfg, const char *fmt, ...)
{
    char assignment[1200];
    va_list args;
    va_start(args, fmt);
    vsnprintf(assignment, sizeof assignment, fmt, args);
    va_end(args);
    if (pipert_config_set(cfg, assignment) == PIPERT_OK) return 1;
    fprintf(stderr, "bench_cuda: %s: %s\n", assignment, pipert_last_error());
    return 0;
}

static int configure(pipert_config *cfg, const bench_options *o, const char *data)
{
    return set(cfg, "runtime.device=cuda") && set(cfg, "model.n_layer=%d", o->layers) &&
           set(cfg, "model.n_embd=%d", o->width) && set(cfg, "model.n_head=%d", o->heads) &&
           set(cfg, "model.block_size=%d", o->seq) && set(cfg, "model.vocab_size=%d", o->vocab) &&
           set(cfg, "train.batch_size=%d", o->batch) &&
           set(cfg, "train.steps=%d", o->warmup + o->steps) && set(cfg, "train.lr=%g", o->lr) &&
           set(cfg, "train.warmup_steps=%d", o->train ? 10 : 0) &&
           set(cfg, "data.path=\"%s\"", data) &&
           set(cfg, "runtime.precision=%s", o->bf16 ? "bf16" : "fp32");
}

static void print_profile(void)
{
    pt_kernel_time times[64];
    int n = pt_kernel_profile_read(times, 64);
    double total = 0;
    for (int i = 0; i < n; i++) total += times[i].seconds;
    /* GB/s: the least traffic a memory-bound kernel had to move over its time (against the
     * device's bandwidth: H100 SXM 3.35 TB/s, H200 4.8); TFLOP/s: attention's products */
    printf("%-34s %6s %12s %7s %8s %8s\n", "kernel", "calls", "ms total", "share", "GB/s",
           "TFLOP/s");
    for (int i = 0; i < n; i++) {
        const pt_kernel_time *t = &times[i];
        char rate[16] = "", flops[16] = "";
        if (t->bytes > 0 && t->seconds > 0) snprintf(rate, sizeof rate, "%.0f", t->bytes / t->seconds / 1e9);
        if (t->flops > 0 && t->seconds > 0) snprintf(flops, sizeof flops, "%.1f", t->flops / t->seconds / 1e12);
        printf("%-34s %6ld %12.1f %6.1f%% %8s %8s\n", t->name, t->calls, 1e3 * t->seconds,
               total > 0 ? 100 * t->seconds / total : 0, rate, flops);
    }
    /* which products run under the device's rate: the classifier's beside the blocks' */
    pt_product_time products[64];
    const int shapes = pt_kernel_profile_products(products, 64);
    printf("%-34s %20s %6s %12s %9s\n", "product", "N × C → OC", "calls", "ms total",
           "TFLOP/s");
    for (int i = 0; i < shapes; i++) {
        const pt_product_time *p = &products[i];
        printf("%-34s %6d × %5d → %5d %6ld %12.1f %9.1f\n", p->name, p->N, p->C, p->OC,
               p->calls, 1e3 * p->seconds, p->seconds > 0 ? p->flops / p->seconds / 1e12 : 0.0);
    }
}

static int run(const bench_options *o, const char *data)
{
    pt_cuda_device_info device;
    if (pt_cuda_device_query(&device) != PIPERT_OK) {
        fprintf(stderr, "bench_cuda: %s\n", pipert_last_error());
        return 1;
    }
    if (o->tf32) pt_cuda_set_tf32(1);
    pipert_config *cfg;
    if (pipert_config_create(&cfg) != PIPERT_OK || !configure(cfg, o, data)) return 1;
    cfg->train.steps = o->warmup + o->steps;
    pt_stage_executor_options eo = {.config = cfg, .stages = 1, .replicas = 1,
                                    .last_layer = cfg->model.n_layer, .threads = 1,
                                    .prev_rank = -1, .next_rank = -1};
    pt_stage_executor *ex;
    if (pt_config_validate(cfg) != PIPERT_OK || pt_stage_executor_create(&ex, &eo) != PIPERT_OK) {
        fprintf(stderr, "bench_cuda: %s\n", pipert_last_error());
        pipert_config_free(cfg);
        return 1;
    }
    pt_gpt_slice *slice = pt_stage_executor_model(ex);
    const pt_gpt_config *model = &slice->config;
    const double tokens_per_step = (double)o->batch * o->seq;
    const double flops_per_token = pt_gpt_flops_per_token(model, o->seq);
    printf("%s (compute capability %d.%d, %d SMs), arena %zu MiB, TF32 %s, products in %s\n",
           device.name, device.major, device.minor, device.sm_count, device.arena_bytes >> 20,
           o->tf32 ? "on" : "off", o->bf16 ? "bf16" : "fp32");
    printf("model: %d layers, %d wide, %d heads, T=%d, vocabulary %d, %.1fM parameters; B=%d; "
           "data %s\n",
           model->n_layer, model->n_embd, model->n_head, o->seq, model->vocab_size,
           1e-6 * (double)slice->n_params, o->batch, data[0] ? data : "fortunes");

    double *seconds = calloc((size_t)o->steps, sizeof *seconds);
    int rc = seconds ? 0 : 1;
    for (int step = 0; step < o->warmup + o->steps && rc == 0; step++) {
        if (o->profile && step == o->warmup)
            pt_stage_executor_use_kernels(ex, pt_kernels_profiled(slice->kernels));
        pt_pipeline_step stats;
        if (pt_stage_executor_step(ex, &stats) != PIPERT_OK || pt_cuda_status() != PIPERT_OK) {
            fprintf(stderr, "bench_cuda: step %d: %s\n", step + 1, pipert_last_error());
            rc = 1;
            break;
        }
        if (step >= o->warmup) seconds[step - o->warmup] = stats.seconds;
        if (o->train || step >= o->warmup)
            printf("step %4d  loss %.4f  grad norm %.3f  %8.1f ms  %9.0f tokens/s\n", step + 1,
                   stats.loss, stats.grad_norm, 1e3 * stats.seconds,
                   tokens_per_step / stats.seconds);
    }
    if (rc == 0 && o->steps > 0) {
        double median = pt_median(seconds, (size_t)o->steps);
        double tokens_per_s = tokens_per_step / median, achieved = tokens_per_s * flops_per_token;
        double bf16_peak = pt_cuda_peak_flops(device.name, 1);
        double fp32_peak = pt_cuda_peak_flops(device.name, 0);
        printf("median step %.1f ms, %.0f tokens/s, %.1f TFLOP/s of model FLOPs "
               "(%.3g GFLOP/token)\n",
               1e3 * median, tokens_per_s, 1e-12 * achieved, 1e-9 * flops_per_token);
        if (bf16_peak > 0)
            printf("MFU %.1f%% of the dense bf16 peak (%.0f TFLOP/s); %.1f%% of the fp32 CUDA-core "
                   "peak (%.1f TFLOP/s)\n",
                   100 * achieved / bf16_peak, 1e-12 * bf16_peak, 100 * achieved / fp32_peak,
                   1e-12 * fp32_peak);
        else
            printf("MFU: no peak known for \"%s\" (kernels/cuda/device_peak.c)\n", device.name);
        pt_cuda_device_info after;
        if (pt_cuda_device_query(&after) == PIPERT_OK) /* what PyTorch's max_memory_allocated says */
            printf("peak device memory %.2f GB (the arena's high-water mark, of %.1f GB)\n",
                   1e-9 * (double)after.arena_peak_bytes, 1e-9 * (double)after.arena_bytes);
        if (o->profile) print_profile();
    }
    free(seconds);
    pt_stage_executor_free(ex);
    pipert_config_free(cfg);
    return rc;
}

int main(int argc, char **argv)
{
    bench_options o;
    if (!parse_options(argc, argv, &o)) return 2;
    char synthetic[] = "/tmp/pipert-bench-XXXXXX.bin";
    const char *data = o.data;
    int made_shard = 0;
    if (!data && access(PT_FORTUNES_DIR, R_OK) == 0) data = "";
    if (!data) {
        int fd = mkstemps(synthetic, 4);
        if (fd < 0 || (close(fd), !write_synthetic_shard(synthetic, o.vocab, (size_t)1 << 24))) {
            fprintf(stderr, "bench_cuda: cannot write a synthetic shard to %s\n", synthetic);
            return 1;
        }
        data = synthetic;
        made_shard = 1;
    }
    int rc = run(&o, data);
    if (made_shard) unlink(synthetic);
    return rc;
}
