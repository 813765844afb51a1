/* pipert bench: times training steps after warm-up and compares the achieved
 * FLOP rate with this machine's fp32 GEMM peak, measured in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/peak.h"
#include "kernels/profile.h"
#include "models/gpt.h"
#include "runtime/config.h"
#include "runtime/stats.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "pipeline/executor.h"
#include "runtime/topology.h"

/* The reference configuration of the foundation issue. */
static const char *const bench_model[] = {
    "model.n_layer=4",  "model.n_embd=256",  "model.n_head=4", "model.block_size=256",
    "model.vocab_size=4096", "train.batch_size=4", NULL,
};

/* Median and mean seconds per step over `steps` timed steps. */
static pipert_result time_steps(pt_stage_executor *ex, int warmup, int steps, double *median_s,
                                double *mean_s)
{
    pt_pipeline_step stats;
    for (int i = 0; i < warmup; i++) PT_TRY(pt_stage_executor_step(ex, &stats));
    double *seconds = calloc((size_t)steps, sizeof *seconds);
    if (!seconds) return pt_fail(PIPERT_ERR_NOMEM, "out of memory");
    pipert_result rc = PIPERT_OK;
    double total = 0;
    for (int i = 0; i < steps && rc == PIPERT_OK; i++) {
        rc = pt_stage_executor_step(ex, &stats);
        seconds[i] = stats.seconds;
        total += stats.seconds;
    }
    *median_s = pt_median(seconds, (size_t)steps);
    *mean_s = total / steps;
    free(seconds);
    return rc;
}

static void print_profile(double mean_step_seconds, int steps)
{
    pt_kernel_time times[64];
    int n = pt_kernel_profile_read(times, 64);
    double total = 0;
    for (int i = 0; i < n; i++) total += times[i].seconds;
    printf("\nwhere a step's time goes (profiled run, kernels synchronised one by one):\n");
    printf("  %-34s %10s %7s %8s %8s %8s\n", "kernel", "ms/step", "share", "calls", "GB/s",
           "TFLOP/s");
    for (int i = 0; i < n; i++) {
        const pt_kernel_time *t = &times[i];
        char rate[16] = "", flops[16] = ""; /* the least traffic, attention's operations */
        if (t->bytes > 0 && t->seconds > 0) snprintf(rate, sizeof rate, "%.1f", t->bytes / t->seconds / 1e9);
        if (t->flops > 0 && t->seconds > 0) snprintf(flops, sizeof flops, "%.2f", t->flops / t->seconds / 1e12);
        printf("  %-34s %10.2f %6.1f%% %8ld %8s %8s\n", t->name, 1e3 * t->seconds / steps,
               100 * t->seconds / total, t->calls / steps, rate, flops);
    }
    printf("  %-34s %10.2f\n", "outside kernels", 1e3 * (mean_step_seconds - total / steps));
    printf("  %-34s %10.2f\n", "step (mean)", 1e3 * mean_step_seconds);
    pt_product_time products[64];
    const int shapes = pt_kernel_profile_products(products, 64);
    printf("\nthe matrix products by shape ([N, C] → [N, OC]):\n");
    printf("  %-34s %20s %10s %9s\n", "kernel", "N × C → OC", "ms/step", "TFLOP/s");
    for (int i = 0; i < shapes; i++) {
        const pt_product_time *p = &products[i];
        printf("  %-34s %6d × %5d → %5d %10.2f %9.2f\n", p->name, p->N, p->C, p->OC,
               1e3 * p->seconds / steps, p->seconds > 0 ? p->flops / p->seconds / 1e12 : 0.0);
    }
}

/* One worker's engine: the executor with a single stage. */
static pipert_result create_engine(pipert_config *cfg, int threads, pt_stage_executor **out)
{
    PT_TRY(pt_config_validate(cfg));
    pt_stage_executor_options o = {.config = cfg, .stage = 0, .stages = 1, .replica = 0,
                                   .replicas = 1, .first_layer = 0,
                                   .last_layer = cfg->model.n_layer, .threads = threads,
                                   .prev_rank = -1, .next_rank = -1};
    return pt_stage_executor_create(out, &o);
}

static pipert_result run_bench(pipert_config *cfg, int warmup, int steps, bool profile)
{
    int threads;
    PT_TRY(pt_topology_compute_threads(cfg->runtime.threads, &threads));
    cfg->train.steps = warmup + 2L * steps; /* the timed runs, and the lr schedule in range */
    pt_stage_executor *ex;
    PT_TRY(create_engine(cfg, threads, &ex));
    const pt_gpt_slice *model = pt_stage_executor_model(ex);
    pt_gemm_peak peak;
    pipert_result rc = pt_cpu_gemm_peak(threads, &peak);
    pt_kernels_cpu_set_threads(threads);
    double step_s = 0, mean_s = 0;
    if (rc == PIPERT_OK) rc = time_steps(ex, warmup, steps, &step_s, &mean_s);
    if (rc == PIPERT_OK) {
        const pt_model_settings *m = &cfg->model;
        double tokens = (double)cfg->train.batch_size * m->block_size * cfg->train.grad_accum;
        double flops = pt_gpt_flops_per_token(&model->config, m->block_size) * tokens;
        double gflops = flops / step_s / 1e9;
        printf("model n_layer=%d n_embd=%d n_head=%d T=%d B=%d vocab=%d (%.2fM params), "
               "%d threads, %s backend\n",
               m->n_layer, m->n_embd, m->n_head, m->block_size, cfg->train.batch_size,
               m->vocab_size, (double)model->n_params / 1e6, threads, model->kernels->name);
        printf("fp32 GEMM peak (sgemm %d³, median of %d): %.1f GFLOP/s\n", peak.size,
               peak.repeats, peak.gflops_median);
        printf("step: median %.2f ms over %d steps (after %d warm-up) | %.0f tokens/s | "
               "%.1f GFLOP/s | %.1f%% of peak\n",
               1e3 * step_s, steps, warmup, tokens / step_s, gflops,
               100 * gflops / peak.gflops_median);
    }
    if (rc == PIPERT_OK && profile) {
        pt_stage_executor_use_kernels(ex, pt_kernels_profiled(model->kernels));
        pt_kernel_profile_reset();
        rc = time_steps(ex, 0, steps, &step_s, &mean_s);
        if (rc == PIPERT_OK) print_profile(mean_s, steps);
    }
    pt_stage_executor_free(ex);
    return rc;
}

int pt_cmd_bench(int argc, char **argv)
{
    const char *steps_text = NULL, *warmup_text = NULL;
    bool profile = false;
    const pt_cli_flag flags[] = {
        {"--steps", "N", "timed steps (default 10)", &steps_text, NULL},
        {"--warmup", "N", "untimed steps first (default 3)", &warmup_text, NULL},
        {"--profile", NULL, "also time each kernel (where the step's time goes)", NULL, &profile},
    };
    const pt_cli cli = {"bench", "[--steps N] [--warmup N] [--profile] [--section.key=value ...]",
                        "Times training steps of the reference model (n_layer=4, n_embd=256,\n"
                        "n_head=4, T=256, B=4, vocab=4096 unless overridden) and reports the median\n"
                        "ms/step, tokens/s, achieved GFLOP/s (6N + 12LCT per token) and the share of\n"
                        "this machine's fp32 GEMM peak, measured in the same run.",
                        flags, (int)(sizeof flags / sizeof flags[0]), true, bench_model};
    pipert_config *cfg;
    pt_cli_outcome outcome = pt_cli_parse(&cli, argc, argv, &cfg);
    if (outcome != PT_CLI_OK) return pt_cli_exit_status(outcome);
    int steps, warmup;
    pipert_result rc = pt_cli_parse_int("--steps", steps_text, 1, 100000, 10, &steps);
    if (rc == PIPERT_OK) rc = pt_cli_parse_int("--warmup", warmup_text, 0, 100000, 3, &warmup);
    if (rc == PIPERT_OK) rc = run_bench(cfg, warmup, steps, profile);
    pipert_config_free(cfg);
    return rc == PIPERT_OK ? 0 : pt_cmd_report_failure("bench");
}
