/* dp.method=sparse (dp/sparse.c, ALGORITHMS.md §4.2).
 *
 * Through the coupling's own interface, between 2–3 real processes
 * (multiprocess.h), with a made-up stage of three tensors and a made-up
 * optimizer (θ_r += a small step that differs per replica and step):
 *   - with p = 1, every rule (ema, avg, delta) and dp.delay 0 and 2 give, step
 *     for step, what a serial simulation of all the replicas in the test gives
 *     (1e-5; only the order of the mean's additions differs), and the newest
 *     stash follows θ wherever an average is applied;
 *   - with p = 1/4 the partitions (of single elements, and of units of 4
 *     consecutive elements) are shared by the replicas, hold whole units,
 *     cover every element exactly once in P steps, change with the cycle, and
 *     the bytes reported are those of the ring all-reduce;
 *   - save, a fresh coupling, load, and the run goes on bitwise as if never
 *     interrupted (dp.delay = 3, three exchanges in flight at the save);
 *   - a replica that sends another size, another step or another method is
 *     named, and nothing is applied;
 *   - with one replica the method does nothing;
 *   - on a kernel table whose memory the host cannot read (cpu-guarded), θ and the stash
 *     end every step with the CPU table's bits, and only the partitions cross to the host.
 * Through `pipert launch`, as a user runs it:
 *   - identical data on both replicas (a token shard whose every sequence is
 *     the same, read sequentially): every replica takes the same steps from
 *     the same θ, so averaging them changes nothing, and sparse with p = 1,
 *     dp.delay = 0, rule avg (dense parameter averaging) must give the losses
 *     of one worker with the same batch, step for step (1e-5 relative). With
 *     dp.delay = 0 the drift d is 0, so p = 0.05 with rule ema must too;
 *   - with p = 0.05 on the fortunes the loss falls and each step sends about
 *     p of what dp.method=allreduce sends;
 *   - a replica throttled from outside (SIGSTOP/SIGCONT, 75 % of the time
 *     stopped) never deadlocks its peer with dp.delay = -1: the job finishes,
 *     and the fast replica applies averages several steps after it posted them;
 *   - a run killed after a checkpoint resumes and applies the exchanges that
 *     were in flight at the steps of an uninterrupted run; each replica
 *     resumes from its own file, so every step's loss and both replicas'
 *     final checkpoints are those of the uninterrupted run;
 *   - replicas started (pipert worker, under Open MPI's variables) with
 *     different dp.fraction fail naming each other and the rank. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dp/codec.h"
#include "dp/coupling.h"
#include "kernels/kernels.h"
#include "comm/collectives.h"
#include "runtime/config.h"
#include "runtime/data.h"
#include "runtime/fileio.h"
#include "runtime/safetensors.h"
#include "tests/command.h"

#define JOB_SECRET "dp sparse test"
#define JOB_ID 11u
#define JOB_DEADLINE_S 90.0
#define JOB_CONNECT_TIMEOUT_S 20.0
#define JOB_CONNECT_ALL_TIMEOUT_S 30.0
#include "multiprocess.h"

/* ============================================================================
 * The coupling between real processes, on a made-up stage
 * ========================================================================== */

/* Three tensors of awkward sizes: 151 parameters. */
static const struct {
    const char *name;
    size_t numel;
} TENSORS[] = {{"h.0.attn.c_attn.weight", 37}, {"h.0.attn.c_attn.bias", 11}, {"wte.weight", 103}};
enum { N_TENSORS = 3, N_PARAMS = 151, MAX_STEPS = 16 };

typedef struct fake_stage {
    pt_gpt_tensor tensors[N_TENSORS];
    pt_gpt_slice slice;
} fake_stage;

static void fake_stage_init(fake_stage *f)
{
    memset(f, 0, sizeof *f);
    size_t offset = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        snprintf(f->tensors[t].name, sizeof f->tensors[t].name, "%s", TENSORS[t].name);
        f->tensors[t].ndim = 1;
        f->tensors[t].shape[0] = (int64_t)TENSORS[t].numel;
        f->tensors[t].offset = offset;
        f->tensors[t].numel = TENSORS[t].numel;
        offset += TENSORS[t].numel;
    }
    f->slice.tensors = f->tensors;
    f->slice.n_tensors = N_TENSORS;
    f->slice.n_params = offset;
}

/* The settings of one coupling in these tests. */
typedef struct sparse_setup {
    double fraction;
    const char *rule;
    long delay;
    long steps, ema_warmup;
    double lambda;
    const char *method;
    const char *compress;
    int unit; /* dp.partition_block (0: 1, single elements) */
} sparse_setup;

static pipert_config config_for(const sparse_setup *u)
{
    pipert_config cfg;
    pt_config_defaults(&cfg);
    cfg.dp.method = pt_config_choice_value("dp.method", u->method ? u->method : "sparse");
    cfg.dp.rule = (pt_sparse_rule)pt_config_choice_value("dp.rule", u->rule);
    cfg.dp.compress = (pt_codec_kind)pt_config_choice_value("dp.compress",
                                                            u->compress ? u->compress : "none");
    cfg.dp.fraction = u->fraction;
    cfg.dp.delay = u->delay;
    cfg.dp.lambda = u->lambda;
    cfg.dp.ema_warmup_steps = u->ema_warmup;
    cfg.train.steps = u->steps;
    cfg.dp.partition_block = u->unit > 0 ? u->unit : 1;
    return cfg;
}

static pt_coupling *make_coupling(const pipert_config *cfg, pt_group *g, int replica)
{
    pt_coupling_options o = {.config = cfg, .replicas = g, .stage = 0, .replica = replica};
    pt_coupling *c = NULL;
    if (pt_coupling_create(&o, &c) != PIPERT_OK)
        fprintf(stderr, "replica %d: pt_coupling_create: %s\n", replica, pipert_last_error());
    return c;
}

/* The made-up optimizer: replica r's step t moves element i by this. */
static float local_step(int r, long t, size_t i)
{
    return 0.01f * sinf(1.3f * (float)r + 0.7f * (float)t + 0.11f * (float)i) + 0.002f * (float)r;
}

static float initial_theta(int r, size_t i) { return 0.1f * (float)r + 0.001f * (float)i; }

/* One step of a replica: the optimizer, then the coupling. */
static pipert_result take_step(pt_coupling *c, fake_stage *f, float *theta, float *stash, int r,
                               long t)
{
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] += local_step(r, t, i);
    pt_coupling_point at = {.model = &f->slice, .params = theta, .n_params = N_PARAMS,
                            .newest_stash = stash, .step = t};
    return pt_coupling_after_step(c, &at);
}

/* ---- the serial simulation of every replica (p = 1) ---------------------- */

typedef struct serial_run {
    int R;
    float theta[MAX_RANKS][N_PARAMS], ema[MAX_RANKS][N_PARAMS];
    /* posted at step s: each replica's w_old, and their mean */
    float w_old[MAX_STEPS + 1][MAX_RANKS][N_PARAMS], average[MAX_STEPS + 1][N_PARAMS];
    long first_pending, posted; /* steps (first_pending, posted] are in flight */
} serial_run;

static float serial_mu(const sparse_setup *u, long t)
{
    if (t <= u->ema_warmup || u->steps <= u->ema_warmup) return 0.5f;
    double q = (double)(t - u->ema_warmup) / (double)(u->steps - u->ema_warmup);
    return (float)(0.5 + 0.49 * 0.5 * (1.0 - cos(M_PI * q)));
}

static void serial_apply(serial_run *s, const sparse_setup *u, long posted_at, long t)
{
    const float mu = serial_mu(u, t);
    for (int r = 0; r < s->R; r++)
        for (size_t i = 0; i < N_PARAMS; i++) {
            float d = s->theta[r][i] - s->w_old[posted_at][r][i], avg = s->average[posted_at][i];
            if (!strcmp(u->rule, "avg")) s->theta[r][i] = avg;
            else if (!strcmp(u->rule, "delta")) s->theta[r][i] = avg + d;
            else {
                s->ema[r][i] = mu * s->ema[r][i] + (1 - mu) * d;
                s->theta[r][i] = avg + (float)u->lambda * s->ema[r][i];
            }
        }
}

/* Step t of every replica; returns how many averages it applied. */
static int serial_step(serial_run *s, const sparse_setup *u, long t)
{
    int applied = 0;
    for (int r = 0; r < s->R; r++)
        for (size_t i = 0; i < N_PARAMS; i++) s->theta[r][i] += local_step(r, t, i);
    while (s->first_pending <= s->posted && s->first_pending + u->delay <= t) {
        serial_apply(s, u, s->first_pending++, t);
        applied++;
    }
    s->posted = t;
    for (size_t i = 0; i < N_PARAMS; i++) {
        double sum = 0;
        for (int r = 0; r < s->R; r++) sum += s->w_old[t][r][i] = s->theta[r][i];
        s->average[t][i] = (float)(sum / s->R);
    }
    while (s->first_pending <= s->posted && (u->delay == 0 || t == u->steps)) {
        serial_apply(s, u, s->first_pending++, t);
        applied++;
    }
    return applied;
}

static sparse_setup job_setup; /* what the bodies below run (set before the fork) */

static int serial_reference_body(rank_context *ctx)
{
    const sparse_setup *u = &job_setup;
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    pipert_config cfg = config_for(u);
    pt_coupling *c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    fake_stage f;
    fake_stage_init(&f);
    static serial_run s;
    memset(&s, 0, sizeof s);
    s.R = ctx->n;
    s.first_pending = 1;
    float theta[N_PARAMS], stash[N_PARAMS];
    for (int r = 0; r < ctx->n; r++)
        for (size_t i = 0; i < N_PARAMS; i++) s.theta[r][i] = initial_theta(r, i);
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = initial_theta(ctx->rank, i);
    for (long t = 1; t <= u->steps; t++) {
        for (size_t i = 0; i < N_PARAMS; i++) stash[i] = -999.0f;
        CHILD_CHECK(ctx, take_step(c, &f, theta, stash, ctx->rank, t) == PIPERT_OK,
                    "rule %s, delay %ld, step %ld", u->rule, u->delay, t);
        int applied = serial_step(&s, u, t);
        for (size_t i = 0; i < N_PARAMS; i++) {
            float expected = s.theta[ctx->rank][i];
            CHILD_CHECK(ctx, fabsf(theta[i] - expected) <= 1e-5f * fmaxf(1.0f, fabsf(expected)),
                        "rule %s, delay %ld, step %ld, element %zu: θ = %.9g, the serial "
                        "simulation gives %.9g",
                        u->rule, u->delay, t, i, theta[i], expected);
            CHILD_CHECK(ctx, stash[i] == (applied ? theta[i] : -999.0f),
                        "rule %s, delay %ld, step %ld, element %zu: the newest stash holds %g "
                        "(θ %g, %d averages applied)",
                        u->rule, u->delay, t, i, stash[i], theta[i], applied);
        }
        pt_coupling_metrics m = pt_coupling_take_metrics(c);
        if (applied && u->delay > 0 && t < u->steps)
            CHILD_CHECK(ctx, m.delay == (double)u->delay, "step %ld: delay %g, expected %ld", t,
                        m.delay, u->delay);
    }
    pt_coupling_free(c);
    pt_group_destroy(g);
    return 0;
}

static void check_against_serial(int replicas, const char *rule, long delay)
{
    job_setup = (sparse_setup){.fraction = 1.0, .rule = rule, .delay = delay, .steps = 9,
                               .ema_warmup = 3, .lambda = 0.8};
    job_spec spec = {.n = replicas, .body = serial_reference_body, .mesh = 1};
    RUN_JOB(spec);
}

Test(sparse_coupling, rule_avg_equals_a_serial_simulation)
{
    check_against_serial(3, "avg", 0);
    check_against_serial(3, "avg", 2);
}
Test(sparse_coupling, rule_delta_equals_a_serial_simulation)
{
    check_against_serial(3, "delta", 0);
    check_against_serial(2, "delta", 2);
}
Test(sparse_coupling, rule_ema_equals_a_serial_simulation)
{
    check_against_serial(3, "ema", 0);
    check_against_serial(3, "ema", 2);
}

/* ---- partitions ------------------------------------------------------------ */

/* Replica r holds 1000·r + i: exact, with the mean 500 + i for two replicas. */
static void own_values(float *theta, int r)
{
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = 1000.0f * (float)r + (float)i;
}

static int partition_unit; /* dp.partition_block of partition_body (set before the fork) */

/* The elements step t averaged (rule avg, dp.delay 0, θ reset before each step): those
 * holding the mean; each must hold the mean or its own value. */
static bool averaged_at(rank_context *ctx, const float *theta, long t, bool *averaged)
{
    for (size_t i = 0; i < N_PARAMS; i++) {
        const float mean = 500.0f + (float)i, own = 1000.0f * (float)ctx->rank + (float)i;
        CHILD_CHECK(ctx, theta[i] == mean || theta[i] == own,
                    "step %ld, element %zu is %g: neither its own %g nor the mean %g "
                    "(the replicas disagree on the partition?)",
                    t, i, theta[i], own, mean);
        averaged[i] = theta[i] == mean;
    }
    return true;
}

/* Partition t − 1 of a tensor: whole units of U consecutive elements (the last one of the
 * tensor short), ⌊t·n_U/P⌋ − ⌊(t−1)·n_U/P⌋ of them for n_U units; its element count. */
static bool check_units(rank_context *ctx, const pt_gpt_tensor *tensor, const bool *averaged,
                        long t, long P, size_t *count)
{
    const size_t U = (size_t)partition_unit, n_units = (tensor->numel + U - 1) / U;
    size_t units = 0;
    *count = 0;
    for (size_t u = 0; u < n_units; u++) {
        const size_t first = tensor->offset + u * U;
        const size_t last = u + 1 < n_units ? first + U : tensor->offset + tensor->numel;
        for (size_t i = first; i < last; i++)
            CHILD_CHECK(ctx, averaged[i] == averaged[first],
                        "step %ld, %s: unit %zu is split (element %zu %s, element %zu %s)", t,
                        tensor->name, u, first, averaged[first] ? "averaged" : "not",
                        i, averaged[i] ? "averaged" : "not");
        units += averaged[first];
        *count += averaged[first] ? last - first : 0;
    }
    const size_t expected = (size_t)t * n_units / (size_t)P - (size_t)(t - 1) * n_units / (size_t)P;
    CHILD_CHECK(ctx, units == expected, "step %ld, %s: %zu of its %zu units averaged, expected %zu",
                t, tensor->name, units, n_units, expected);
    return true;
}

static int partition_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    const long P = 4;
    const sparse_setup u = {.fraction = 1.0 / P, .rule = "avg", .delay = 0, .steps = 100,
                            .unit = partition_unit};
    pipert_config cfg = config_for(&u);
    pt_coupling *c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    fake_stage f;
    fake_stage_init(&f);
    float theta[N_PARAMS];
    bool averaged[N_PARAMS], first_partition[N_PARAMS];
    int times[N_PARAMS] = {0};
    for (long t = 1; t <= P; t++) {
        own_values(theta, ctx->rank);
        pt_coupling_point at = {.model = &f.slice, .params = theta, .n_params = N_PARAMS, .step = t};
        CHILD_CHECK(ctx, pt_coupling_after_step(c, &at) == PIPERT_OK, "step %ld", t);
        CHILD_CHECK(ctx, averaged_at(ctx, theta, t, averaged), "step %ld", t);
        size_t step_count = 0;
        for (int k = 0; k < N_TENSORS; k++) {
            size_t count;
            CHILD_CHECK(ctx, check_units(ctx, &f.tensors[k], averaged, t, P, &count), "units");
            step_count += count;
        }
        for (size_t i = 0; i < N_PARAMS; i++) times[i] += averaged[i];
        if (t == 1) memcpy(first_partition, averaged, sizeof averaged);
        pt_coupling_metrics m = pt_coupling_take_metrics(c);
        /* ring all-reduce of R = 2: (R−1)·2/R = 1 buffer each, plus the 2 × 12 descriptor values */
        CHILD_CHECK(ctx, m.bytes_sent == (double)(step_count + 24) * 4,
                    "step %ld: %g bytes reported, expected %zu", t, m.bytes_sent,
                    (step_count + 24) * 4);
    }
    for (size_t i = 0; i < N_PARAMS; i++)
        CHILD_CHECK(ctx, times[i] == 1, "element %zu was averaged %d times in the cycle's %ld steps",
                    i, times[i], P);
    /* The next cycle draws another permutation: step 5 averages another set. */
    own_values(theta, ctx->rank);
    pt_coupling_point at = {.model = &f.slice, .params = theta, .n_params = N_PARAMS, .step = P + 1};
    CHILD_CHECK(ctx, pt_coupling_after_step(c, &at) == PIPERT_OK, "step %ld", P + 1);
    CHILD_CHECK(ctx, averaged_at(ctx, theta, P + 1, averaged), "step %ld", P + 1);
    size_t same = 0, count = 0;
    for (size_t i = 0; i < N_PARAMS; i++) {
        count += averaged[i];
        same += averaged[i] && first_partition[i];
    }
    CHILD_CHECK(ctx, count > N_PARAMS / 8 && same < count,
                "step 5 averaged %zu elements, %zu of them those of step 1: the permutation did "
                "not change with the cycle", count, same);
    pt_coupling_free(c);
    pt_group_destroy(g);
    return 0;
}

/* Single elements (dp.partition_block = 1, ALGORITHMS.md's permutation of the elements). */
Test(sparse_coupling, partitions_are_shared_cover_everything_and_change_per_cycle)
{
    partition_unit = 1;
    job_spec spec = {.n = 2, .body = partition_body, .mesh = 1};
    RUN_JOB(spec);
}

/* Units of 4: the tensors of 37, 11 and 103 elements end in a short unit, which sits in a
 * different partition each cycle. */
Test(sparse_coupling, partitions_of_units_are_shared_whole_and_cover_everything)
{
    partition_unit = 4;
    job_spec spec = {.n = 2, .body = partition_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- checkpoints ------------------------------------------------------------- */

static const char *job_compress; /* dp.compress of the bodies below (set before the fork) */

static int checkpoint_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    const sparse_setup u = {.fraction = 0.25, .rule = "ema", .delay = 3, .steps = 12,
                            .ema_warmup = 2, .lambda = 1.0, .compress = job_compress};
    pipert_config cfg = config_for(&u);
    fake_stage f;
    fake_stage_init(&f);
    float straight[13][N_PARAMS], theta[N_PARAMS];
    /* Uninterrupted. */
    pt_coupling *c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = initial_theta(ctx->rank, i);
    for (long t = 1; t <= u.steps; t++) {
        CHILD_CHECK(ctx, take_step(c, &f, theta, NULL, ctx->rank, t) == PIPERT_OK, "step %ld", t);
        memcpy(straight[t], theta, sizeof theta);
    }
    pt_coupling_free(c);
    /* Saved after step 6 (steps 4, 5, 6 in flight), restored into a new coupling. */
    char path[128];
    snprintf(path, sizeof path, "/tmp/pipert-dp-sparse-%d-rank-%d.safetensors", (int)getppid(),
             ctx->rank);
    c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = initial_theta(ctx->rank, i);
    for (long t = 1; t <= 6; t++)
        CHILD_CHECK(ctx, take_step(c, &f, theta, NULL, ctx->rank, t) == PIPERT_OK, "step %ld", t);
    pt_safetensors_writer *w;
    CHILD_CHECK(ctx, pt_safetensors_writer_create(&w) == PIPERT_OK, "writer");
    CHILD_CHECK(ctx, pt_coupling_save(c, w) == PIPERT_OK, "save");
    CHILD_CHECK(ctx, pt_safetensors_writer_write(w, path) == PIPERT_OK, "write %s", path);
    pt_safetensors_writer_free(w);
    pt_coupling_free(c);
    c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    pt_safetensors *st;
    CHILD_CHECK(ctx, pt_safetensors_open(&st, path) == PIPERT_OK, "open %s", path);
    CHILD_CHECK(ctx, pt_safetensors_find(st, "dp.sparse.pending.2.average"),
                "the checkpoint does not hold the three exchanges in flight");
    CHILD_CHECK(ctx, pt_safetensors_find(st, "dp.sparse.ema"), "the checkpoint holds no EMA");
    if (!strcmp(u.compress, "onebit"))
        CHILD_CHECK(ctx, pt_safetensors_find(st, "dp.sparse.worker_error") &&
                             pt_safetensors_find(st, "dp.sparse.server_error"),
                    "the checkpoint holds no error feedback");
    CHILD_CHECK(ctx, pt_coupling_load(c, st, path) == PIPERT_OK, "load");
    pt_safetensors_close(st);
    unlink(path);
    for (long t = 7; t <= u.steps; t++) {
        CHILD_CHECK(ctx, take_step(c, &f, theta, NULL, ctx->rank, t) == PIPERT_OK, "step %ld", t);
        for (size_t i = 0; i < N_PARAMS; i++)
            CHILD_CHECK(ctx, theta[i] == straight[t][i],
                        "dp.compress=%s, resumed, step %ld, element %zu: %.9g, uninterrupted "
                        "%.9g", u.compress, t, i, theta[i], straight[t][i]);
    }
    pt_coupling_free(c);
    pt_group_destroy(g);
    return 0;
}

Test(sparse_coupling, a_restored_coupling_continues_bitwise)
{
    const char *codecs[] = {"none", "onebit"}; /* onebit: its error feedback is saved too */
    for (int k = 0; k < 2; k++) {
        job_compress = codecs[k];
        job_spec spec = {.n = 2, .body = checkpoint_body, .mesh = 1};
        RUN_JOB(spec);
    }
}

/* A checkpoint's exchange in flight must fit the stage that resumes it. Saved on the three
 * tensors, where a partition of p = 1/4 holds up to 10 + 3 + 26 = 39 elements (step 4's
 * does), and resumed on a stage of the same 151 parameters in one tensor, whose partitions
 * hold at most 38: refused by name, nothing written past the partition's buffers (which the
 * sanitizer build would see). */
static int oversized_exchange_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    const sparse_setup u = {.fraction = 0.25, .rule = "ema", .delay = 3, .steps = 12,
                            .ema_warmup = 2, .lambda = 1.0};
    pipert_config cfg = config_for(&u);
    fake_stage f;
    fake_stage_init(&f);
    float theta[N_PARAMS];
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = initial_theta(ctx->rank, i);
    pt_coupling *c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    for (long t = 1; t <= 6; t++)
        CHILD_CHECK(ctx, take_step(c, &f, theta, NULL, ctx->rank, t) == PIPERT_OK, "step %ld", t);
    char path[128];
    snprintf(path, sizeof path, "/tmp/pipert-dp-sparse-oversized-%d-rank-%d.safetensors",
             (int)getppid(), ctx->rank);
    pt_safetensors_writer *w;
    CHILD_CHECK(ctx, pt_safetensors_writer_create(&w) == PIPERT_OK, "writer");
    CHILD_CHECK(ctx, pt_coupling_save(c, w) == PIPERT_OK, "save");
    CHILD_CHECK(ctx, pt_safetensors_writer_write(w, path) == PIPERT_OK, "write %s", path);
    pt_safetensors_writer_free(w);
    pt_coupling_free(c);
    pt_gpt_tensor whole = {.ndim = 1, .shape = {N_PARAMS}, .numel = N_PARAMS};
    snprintf(whole.name, sizeof whole.name, "wte.weight");
    pt_gpt_slice one = {.tensors = &whole, .n_tensors = 1, .n_params = N_PARAMS};
    c = make_coupling(&cfg, g, ctx->rank);
    pt_safetensors *st;
    CHILD_CHECK(ctx, c && pt_safetensors_open(&st, path) == PIPERT_OK, "open %s", path);
    CHILD_CHECK(ctx, pt_coupling_load(c, st, path) == PIPERT_OK, "load: %s", pipert_last_error());
    pt_safetensors_close(st);
    unlink(path);
    pt_coupling_point at = {.model = &one, .params = theta, .n_params = N_PARAMS, .step = 7};
    const pipert_result rc = pt_coupling_after_step(c, &at);
    CHILD_CHECK(ctx, rc == PIPERT_ERR_FORMAT &&
                         strstr(pipert_last_error(), "exchange of step 4 holds 39 elements") &&
                         strstr(pipert_last_error(), "more than a partition of this stage (38)"),
                "step 7 on the other stage: %s: %s", pipert_result_str(rc), pipert_last_error());
    pt_coupling_free(c);
    pt_group_destroy(g);
    return 0;
}

Test(sparse_coupling, an_exchange_larger_than_this_stages_partitions_is_refused)
{
    job_spec spec = {.n = 2, .body = oversized_exchange_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ---- compression ------------------------------------------------------------- */

/* p = 1/2, rule avg, dp.delay = 0, two steps: every element is averaged once
 * through the codec. The replicas start from the same θ0 (seen at the first
 * after_backward) and drift apart by ~0.01 before they average: what is
 * quantized is the drift, so the average is near the true mean at the
 * drift's scale (quantizing θ itself would miss it by the weights' scale).
 * Both replicas hold the bitwise same θ, and each step sent what the exchange
 * says it sends: the codec's bytes, not fp32. */
static int compressed_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    const sparse_setup u = {.fraction = 0.5, .rule = "avg", .delay = 0, .steps = 100,
                            .compress = job_compress};
    pipert_config cfg = config_for(&u);
    pt_coupling *c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    fake_stage f;
    fake_stage_init(&f);
    float theta[N_PARAMS], mean[N_PARAMS];
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = sinf(0.37f * (float)i);
    pt_coupling_point start = {.model = &f.slice, .params = theta, .n_params = N_PARAMS, .step = 1};
    CHILD_CHECK(ctx, pt_coupling_after_backward(c, &start) == PIPERT_OK, "%s: after_backward",
                u.compress);
    for (size_t i = 0; i < N_PARAMS; i++) {
        const float drift0 = 0.01f * sinf(0.37f * (float)i), drift1 = 0.01f * sinf(0.37f * (float)i + 1.0f);
        mean[i] = theta[i] + 0.5f * (drift0 + drift1);
        theta[i] += ctx->rank ? drift1 : drift0;
    }
    pt_codec codec;
    CHILD_CHECK(ctx, pt_codec_init(&codec, cfg.dp.compress, (size_t)cfg.dp.block) == PIPERT_OK, "codec");
    for (long t = 1; t <= 2; t++) {
        pt_coupling_point at = {.model = &f.slice, .params = theta, .n_params = N_PARAMS, .step = t};
        CHILD_CHECK(ctx, pt_coupling_after_step(c, &at) == PIPERT_OK, "%s, step %ld", u.compress, t);
        size_t count = 0;
        for (int k = 0; k < N_TENSORS; k++)
            count += t == 1 ? f.tensors[k].numel / 2 : f.tensors[k].numel - f.tensors[k].numel / 2;
        size_t expected = 24 * 4; /* the descriptors */
        if (codec.kind == PT_CODEC_ONEBIT) {
            size_t padded = (count + 15) / 16 * 16;
            expected += 2 * (4 + padded / 2 / 8);
        } else {
            expected += pt_codec_encoded_bytes(&codec, count);
        }
        const double sent = pt_coupling_take_metrics(c).bytes_sent;
        CHILD_CHECK(ctx, sent == (double)expected && sent < 0.6 * (double)(4 * count + 88),
                    "%s, step %ld: %g bytes sent for %zu values, expected %zu", u.compress, t,
                    sent, count, expected);
    }
    float copy[N_PARAMS];
    memcpy(copy, theta, sizeof theta);
    CHILD_CHECK(ctx, pt_allreduce(g, copy, N_PARAMS, PT_REDUCE_MEAN) == PIPERT_OK, "compare");
    /* the drifts' absmax is 0.01: int8 rounds to 0.01/254, the 4-bit codes
     * to a third of a block's scale, onebit to the scale of the signs */
    const float tolerance = codec.kind == PT_CODEC_INT8 ? 1e-4f : 0.012f;
    for (size_t i = 0; i < N_PARAMS; i++) {
        CHILD_CHECK(ctx, copy[i] == theta[i], "%s, element %zu: the replicas hold different values",
                    u.compress, i);
        CHILD_CHECK(ctx, fabsf(theta[i] - mean[i]) <= tolerance,
                    "%s, element %zu: %g, the mean is %g", u.compress, i, theta[i], mean[i]);
    }
    pt_coupling_free(c);
    pt_group_destroy(g);
    return 0;
}

Test(sparse_coupling, compressed_partitions_average_through_the_exchange)
{
    const char *codecs[] = {"int8", "e3m0", "e2m1", "onebit"};
    for (int k = 0; k < 4; k++) {
        job_compress = codecs[k];
        job_spec spec = {.n = 2, .body = compressed_body, .mesh = 1};
        RUN_JOB(spec);
    }
}

/* ---- a wrong peer ------------------------------------------------------------ */

typedef enum wrong_kind { WRONG_SIZE, WRONG_STEP, WRONG_METHOD } wrong_kind;
static wrong_kind wrong;

/* Replica 1 posts something else than replica 0: both fail with
 * PIPERT_ERR_PEER naming the other, and θ is left as the optimizer made it. */
static int wrong_peer_body(rank_context *ctx)
{
    pt_group *g = whole_group(ctx, 3);
    CHILD_CHECK(ctx, g, "group");
    sparse_setup u = {.fraction = wrong == WRONG_SIZE ? 0.25 : 1.0, .rule = "avg", .delay = 0,
                      .steps = 100};
    if (ctx->rank == 1 && wrong == WRONG_SIZE) u.fraction = 0.5;
    if (ctx->rank == 1 && wrong == WRONG_METHOD) u.method = "allreduce";
    pipert_config cfg = config_for(&u);
    pt_coupling *c = make_coupling(&cfg, g, ctx->rank);
    CHILD_CHECK(ctx, c, "coupling");
    fake_stage f;
    fake_stage_init(&f);
    float theta[N_PARAMS], before[N_PARAMS], grads[N_PARAMS] = {0}, loss = 1;
    own_values(theta, ctx->rank);
    memcpy(before, theta, sizeof theta);
    long step = ctx->rank == 1 && wrong == WRONG_STEP ? 2 : 1;
    pt_coupling_point at = {.model = &f.slice, .params = theta, .grads = grads, .loss = &loss,
                            .n_params = N_PARAMS, .step = step};
    pipert_result rc = ctx->rank == 1 && wrong == WRONG_METHOD ? pt_coupling_after_backward(c, &at)
                                                               : pt_coupling_after_step(c, &at);
    const char *message = pipert_last_error();
    CHILD_CHECK(ctx, rc == PIPERT_ERR_PEER, "the wrong peer was not noticed (result %d): %s", rc,
                message);
    char peer[32];
    snprintf(peer, sizeof peer, wrong == WRONG_METHOD ? "rank %d" : "replica %d", 1 - ctx->rank);
    if (ctx->rank == 0 || wrong != WRONG_METHOD)
        CHILD_CHECK(ctx, strstr(message, peer), "the error does not name %s: %s", peer, message);
    CHILD_CHECK(ctx, memcmp(theta, before, sizeof theta) == 0, "θ changed after the error: %s",
                message);
    fprintf(stderr, "rank %d, as expected: %s\n", ctx->rank, message);
    /* What is still in flight is abandoned: the transport goes first. */
    pt_transport_destroy(ctx->t);
    ctx->t = NULL;
    pt_coupling_free(c);
    pt_group_destroy(g);
    return 0;
}

static void check_wrong_peer(wrong_kind kind)
{
    wrong = kind;
    job_spec spec = {.n = 2, .body = wrong_peer_body, .mesh = 1};
    RUN_JOB(spec);
}

Test(sparse_coupling, a_replica_with_another_fraction_is_named) { check_wrong_peer(WRONG_SIZE); }
Test(sparse_coupling, a_replica_at_another_step_is_named) { check_wrong_peer(WRONG_STEP); }
Test(sparse_coupling, a_replica_with_another_method_is_named) { check_wrong_peer(WRONG_METHOD); }

/* With one replica there is nothing to average. */
Test(sparse_coupling, one_replica_does_nothing)
{
    const sparse_setup u = {.fraction = 0.05, .rule = "ema", .delay = -1, .steps = 10};
    pipert_config cfg = config_for(&u);
    pt_coupling *c = make_coupling(&cfg, NULL, 0);
    cr_assert_not_null(c, "%s", pipert_last_error());
    fake_stage f;
    fake_stage_init(&f);
    float theta[N_PARAMS], before[N_PARAMS];
    own_values(theta, 0);
    memcpy(before, theta, sizeof theta);
    for (long t = 1; t <= 10; t++) {
        pt_coupling_point at = {.model = &f.slice, .params = theta, .n_params = N_PARAMS, .step = t};
        cr_assert_eq(pt_coupling_after_step(c, &at), PIPERT_OK, "%s", pipert_last_error());
    }
    cr_expect_eq(memcmp(theta, before, sizeof theta), 0, "θ changed");
    cr_expect_eq(pt_coupling_take_metrics(c).bytes_sent, 0.0);
    pt_coupling_free(c);
}

/* ---- θ where the host cannot read it (cuda; here runtime.device=cpu-guarded) ---------- */

static pt_kernels counted_table; /* the guarded table, its host copies counted */
static size_t counted_bytes;

static void counted_to_host(void *dst, const void *src, size_t bytes)
{
    counted_bytes += bytes;
    pt_kernels_cpu_guarded()->copy_to_host(dst, src, bytes);
}

static void counted_to_device(void *dst, const void *src, size_t bytes)
{
    counted_bytes += bytes;
    pt_kernels_cpu_guarded()->copy_to_device(dst, src, bytes);
}

/* The same coupling on the CPU table and, over a group of its own, on the guarded one with θ
 * and the newest stash in its memory, side by side: θ and the stash the same bits after every
 * step, and only partitions cross between the table and the host (p = 1/4, units of 4: at
 * most 44 of the 151 elements; a post moves its indices and values, an apply its indices,
 * θ's values and the new ones: at most 20 bytes an element a step, against 32 for host copies
 * of θ and the stash both ways). */
static int guarded_body(rank_context *ctx)
{
    const sparse_setup u = {.fraction = 0.25, .rule = "ema", .delay = 1, .steps = 12,
                            .ema_warmup = 3, .lambda = 0.8, .unit = 4};
    enum { MAX_PARTITION = 44 };
    const pt_kernels *guarded = pt_kernels_cpu_guarded();
    counted_table = *guarded;
    counted_table.copy_to_host = counted_to_host;
    counted_table.copy_to_device = counted_to_device;
    pt_group *g_host = whole_group(ctx, 3), *g_device = whole_group(ctx, 4);
    CHILD_CHECK(ctx, g_host && g_device, "groups");
    pipert_config cfg = config_for(&u);
    pt_coupling *on_host = make_coupling(&cfg, g_host, ctx->rank), *on_device = NULL;
    pt_coupling_options o = {.config = &cfg, .kernels = &counted_table, .replicas = g_device,
                             .replica = ctx->rank};
    CHILD_CHECK(ctx, on_host && pt_coupling_create(&o, &on_device) == PIPERT_OK, "couplings");
    fake_stage f;
    fake_stage_init(&f);
    const size_t bytes = N_PARAMS * sizeof(float);
    float theta[N_PARAMS], stash[N_PARAMS], got[N_PARAMS], *theta_d = NULL, *stash_d = NULL;
    CHILD_CHECK(ctx, guarded->alloc((void **)&theta_d, bytes, "θ") == PIPERT_OK &&
                         guarded->alloc((void **)&stash_d, bytes, "stash") == PIPERT_OK,
                "memory");
    for (size_t i = 0; i < N_PARAMS; i++) theta[i] = initial_theta(ctx->rank, i);
    guarded->copy_to_device(theta_d, theta, bytes);
    size_t crossed = 0;
    for (long t = 1; t <= u.steps; t++) {
        for (size_t i = 0; i < N_PARAMS; i++) stash[i] = -999.0f;
        guarded->copy_to_device(stash_d, stash, bytes);
        CHILD_CHECK(ctx, take_step(on_host, &f, theta, stash, ctx->rank, t) == PIPERT_OK, "step %ld", t);
        guarded->copy_to_host(got, theta_d, bytes); /* the device θ takes the same local step */
        for (size_t i = 0; i < N_PARAMS; i++) got[i] += local_step(ctx->rank, t, i);
        guarded->copy_to_device(theta_d, got, bytes);
        counted_bytes = 0;
        pt_coupling_point at = {.model = &f.slice, .params = theta_d, .n_params = N_PARAMS,
                                .newest_stash = stash_d, .step = t};
        CHILD_CHECK(ctx, pt_coupling_after_step(on_device, &at) == PIPERT_OK, "step %ld on the device", t);
        crossed += counted_bytes;
        guarded->copy_to_host(got, theta_d, bytes);
        CHILD_CHECK(ctx, memcmp(got, theta, bytes) == 0, "step %ld: θ on the device differs", t);
        guarded->copy_to_host(got, stash_d, bytes);
        CHILD_CHECK(ctx, memcmp(got, stash, bytes) == 0, "step %ld: the stash on the device differs", t);
    }
    CHILD_CHECK(ctx, crossed > 0 && crossed <= (size_t)u.steps * 20 * MAX_PARTITION,
                "%zu bytes crossed between the table and the host in %ld steps: more than the "
                "partitions' (at most %d bytes)",
                crossed, u.steps, (int)u.steps * 20 * MAX_PARTITION);
    guarded->free(theta_d);
    guarded->free(stash_d);
    pt_coupling_free(on_device);
    pt_coupling_free(on_host);
    pt_group_destroy(g_device);
    pt_group_destroy(g_host);
    return 0;
}

Test(sparse_coupling, on_device_memory_only_the_partitions_cross)
{
    job_spec spec = {.n = 2, .body = guarded_body, .mesh = 1};
    RUN_JOB(spec);
}

/* ============================================================================
 * pipert launch
 * ========================================================================== */

#define MODEL                                                                                      \
    "--model.n_layer=4 --model.n_embd=32 --model.n_head=2 --model.block_size=32 "                 \
    "--train.warmup_steps=1 --train.val_every=0 --train.val_batches=2 --train.log_every=1 "       \
    "--runtime.threads=1"
enum { PATTERN = 32, STEPS = 20 };


/* A token shard of one scrambled 32-token pattern (T = model.block_size),
 * repeated: 1600 tokens. With data.val_fraction = 0.2 the train split is
 * 1280 = 40·T tokens, so with sequential sampling every sequence starts at a
 * multiple of T (q·T mod (1280 − T)) and every sequence of every replica is
 * the same pattern. */
static void write_repeating_shard(const char *path)
{
    uint16_t tokens[50 * PATTERN];
    for (int k = 0; k < 50 * PATTERN; k++) tokens[k] = (uint16_t)((k % PATTERN) * 97u % 251u);
    cr_assert_eq(pt_shard_write(path, tokens, 50 * PATTERN), PIPERT_OK, "%s", pipert_last_error());
}

#define SAME_DATA "--data.sampling=sequential --data.val_fraction=0.2"

static void expect_same_losses(const char *reference, const char *dir, const char *what)
{
    double expected[STEPS], got[STEPS];
    cr_assert_eq(read_metric_steps(reference, "metrics.jsonl", "loss", expected, STEPS), STEPS);
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", got, STEPS), STEPS, "%s: steps missing",
                 what);
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabs(got[i] - expected[i]) <= 1e-5 * fabs(expected[i]),
                  "%s, step %d: %.9g, one worker %.9g", what, i + 1, got[i], expected[i]);
}

Test(sparse_launch, on_identical_data_parameter_averaging_equals_one_worker)
{
    char *shard_dir = make_temp_dir(), shard[600];
    snprintf(shard, sizeof shard, "%s/pattern.bin", shard_dir);
    write_repeating_shard(shard);
    char *reference = make_temp_dir();
    run_pipert_ok("train --quiet --out %s " MODEL " " SAME_DATA " --data.path=%s --train.steps=%d "
           "--train.batch_size=2",
           reference, shard, STEPS);
    const char *variants[] = {
        "--dp.fraction=1 --dp.delay=0 --dp.rule=avg",    /* dense parameter averaging */
        "--dp.fraction=0.05 --dp.delay=0 --dp.rule=ema", /* d = 0: e stays 0 */
    };
    for (int v = 0; v < 2; v++) {
        char *dir = make_temp_dir();
        run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s " MODEL " " SAME_DATA
               " --data.path=%s --train.steps=%d --train.batch_size=2 --dp.method=sparse %s",
               dir, shard, STEPS, variants[v]);
        double bytes[STEPS];
        cr_expect_eq(read_metric_steps(dir, "metrics-stage-0.jsonl", "dp_bytes", bytes, STEPS), STEPS);
        cr_expect_gt(bytes[STEPS - 1], 0, "%s: nothing was sent", variants[v]);
        expect_same_losses(reference, dir, variants[v]);
        remove_dir(dir);
    }
    remove_dir(reference);
    remove_dir(shard_dir);
}

/* p = 0.05 on the fortunes: the loss falls, and a step sends p of the dense bytes. */
Test(sparse_launch, a_twentieth_trains_and_sends_a_twentieth)
{
    enum { N = 60 };
    char *dense = make_temp_dir(), *sparse = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s " MODEL
           " --train.steps=%d --train.batch_size=4 --dp.method=allreduce",
           dense, N);
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s " MODEL
           " --train.steps=%d --train.batch_size=4 --dp.method=sparse --dp.fraction=0.05",
           sparse, N);
    double loss[N], dense_bytes[N], sparse_bytes[N];
    cr_assert_eq(read_metric_steps(sparse, "metrics.jsonl", "loss", loss, N), N);
    cr_assert_eq(read_metric_steps(dense, "metrics-stage-0.jsonl", "dp_bytes", dense_bytes, N), N);
    cr_assert_eq(read_metric_steps(sparse, "metrics-stage-0.jsonl", "dp_bytes", sparse_bytes, N), N);
    cr_expect_lt(loss[N - 1], loss[0] - 0.3, "the loss did not fall: %g → %g", loss[0], loss[N - 1]);
    double d = 0, s = 0;
    for (int i = 0; i < N; i++) d += dense_bytes[i], s += sparse_bytes[i];
    cr_expect(s / d > 0.045 && s / d < 0.056,
              "sparse sent %.0f bytes a step, allreduce %.0f: a ratio of %.4f, not about 0.05",
              s / N, d / N, s / d);
    remove_dir(dense);
    remove_dir(sparse);
}

/* Checkpoints through the session: a run killed at step 30 resumes from the
 * checkpoint of step 20, where the exchanges of steps 18, 19 and 20 were in
 * flight (dp.delay = 3). They come back from the file and are applied at
 * steps 21, 22 and 23 as in the run that was never interrupted. Each replica
 * resumes from its own file (replica 1 from ckpt-00000020-stage-0-replica-1:
 * its own θ, moments, EMA buffer and exchanges), so every step's loss is the
 * uninterrupted run's, and so is the final checkpoint of each replica, bitwise.
 * (Before replicas had files of their own, replica 1 resumed from replica 0's
 * state and the losses differed from step 24 on, once the first average
 * posted after the resume came back.) */
Test(sparse_launch, a_resumed_run_applies_the_exchanges_in_flight_at_their_steps)
{
    enum { N = 40 };
#define RESUMED MODEL " --train.steps=40 --train.batch_size=4 --dp.method=sparse --dp.delay=3 " \
                      "--train.checkpoint_every=20"
    char *straight = make_temp_dir(), *resumed = make_temp_dir();
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --out %s " RESUMED, straight);
    run_result r = run_pipert_with("PIPERT_TEST_DIE_AT_STEP=30 PIPERT_TEST_DIE_RANK=1",
                                   "launch --quiet --stages 1 --replicas 2 --out %s " RESUMED,
                                   resumed);
    cr_assert_eq(r.status, 1, "the run that should die at step 30 ended with %d: %s", r.status,
                 r.err);
    run_pipert_ok("launch --quiet --stages 1 --replicas 2 --resume --out %s " RESUMED, resumed);
#undef RESUMED
    double expected[N], got[N];
    cr_assert_eq(read_metric_steps(straight, "metrics.jsonl", "loss", expected, N), N);
    cr_assert_eq(read_metric_steps(resumed, "metrics.jsonl", "loss", got, N), N);
    for (int i = 0; i < N; i++)
        cr_expect(fabs(got[i] - expected[i]) <= 1e-6 * fabs(expected[i]),
                  "resumed at step 20, step %d: loss %.9g, uninterrupted %.9g", i + 1, got[i],
                  expected[i]);
    expect_same_tensors(straight, resumed, "ckpt-00000040-stage-0.safetensors",
                        "replica 0 at the end");
    expect_same_tensors(straight, resumed, "ckpt-00000040-stage-0-replica-1.safetensors",
                        "replica 1 at the end");
    remove_dir(straight);
    remove_dir(resumed);
}

/* Replica 1 stopped 30 ms of every 40 from outside (SIGSTOP/SIGCONT): with
 * dp.delay = -1 replica 0 keeps training and applies each average when it
 * comes, up to 16 steps later; the job ends. (The throttling starts once
 * workers.pid lists both ranks: up to 120 s, for a sanitized build started
 * beside other suites.) */
Test(sparse_launch, a_throttled_replica_never_deadlocks_its_peer)
{
    enum { N = 150 };
    char *dir = make_temp_dir(), command[4096], err_path[600];
    snprintf(err_path, sizeof err_path, "%s/launcher.err", dir);
    snprintf(command, sizeof command,
             "%s launch --quiet --stages 1 --replicas 2 --out %s " MODEL
             " --train.steps=%d --train.batch_size=4 --dp.method=sparse --dp.delay=-1 "
             ">/dev/null 2>%s & launcher=$!; "
             "for i in $(seq 2400); do [ -f %s/workers.pid ] && [ $(wc -l < %s/workers.pid) -ge 2 ] "
             "&& break; kill -0 $launcher 2>/dev/null || break; sleep 0.05; done; "
             "slow=$(awk '$1 == 1 {print $2}' %s/workers.pid); "
             "while kill -0 $launcher 2>/dev/null; do "
             "kill -STOP $slow 2>/dev/null; sleep 0.03; kill -CONT $slow 2>/dev/null; sleep 0.01; "
             "done; wait $launcher",
             pipert_bin(), dir, N, err_path, dir, dir, dir);
    const double started = pt_now_s();
    int raw = system(command);
    const double took = pt_now_s() - started;
    char *err = NULL;
    size_t size;
    if (pt_read_file(err_path, &err, &size) != PIPERT_OK) err = strdup("(no stderr)");
    cr_assert(WIFEXITED(raw) && WEXITSTATUS(raw) == 0, "the job failed (%d): %s",
              WEXITSTATUS(raw), err);
    free(err);
    double delay[N], loss[N];
    cr_assert_eq(read_metric_steps(dir, "metrics-stage-0.jsonl", "dp_delay", delay, N), N);
    cr_assert_eq(read_metric_steps(dir, "metrics.jsonl", "loss", loss, N), N);
    double most = 0;
    for (int i = 0; i < N; i++) most = fmax(most, delay[i]);
    /* (stderr, not cr_log_info: Criterion's logger leaks 48 bytes under LeakSanitizer) */
    fprintf(stderr, "throttled peer: the job took %.1f s, averages applied up to %g steps late, "
                    "loss %.3f -> %.3f\n", took, most, loss[0], loss[N - 1]);
    cr_expect_geq(most, 3.0, "replica 0 never applied an average later than %g steps: was it "
                             "waiting for its throttled peer?", most);
    cr_expect_leq(most, 16.0, "an average applied %g steps late: more than the 16 in flight", most);
    cr_expect_lt(took, 180.0, "the job took %.0f s", took);
    remove_dir(dir);
}

/* Two `pipert worker`s under Open MPI's variables, rank 1 with `rank1_setting` added; their
 * stderr into *rank0 and *rank1 (free them) and the directory into *dir (remove_dir it). */
static void two_workers(const char *rank1_setting, char **dir, char **rank0, char **rank1)
{
    char command[4096];
    *dir = make_temp_dir();
    const int port = 20000 + (int)(getpid() % 20000);
    snprintf(command, sizeof command,
             "export PIPERT_SECRET=0123456789abcdef0123456789abcdef PIPERT_COORD=127.0.0.1:%d "
             "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=2; "
             "for r in 0 1; do extra=; [ $r = 1 ] && extra=%s; "
             "OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_LOCAL_RANK=$r timeout 60 %s worker --quiet --out %s " MODEL " --train.steps=20 "
             "--train.batch_size=2 --dp.method=sparse --dp.fraction=0.05 $extra "
             "2>%s/rank-$r.err & done; wait",
             port, rank1_setting, pipert_bin(), *dir, *dir);
    cr_assert_eq(system(command), 0);
    char path[600];
    size_t size;
    snprintf(path, sizeof path, "%s/rank-0.err", *dir);
    cr_assert_eq(pt_read_file(path, rank0, &size), PIPERT_OK);
    snprintf(path, sizeof path, "%s/rank-1.err", *dir);
    cr_assert_eq(pt_read_file(path, rank1, &size), PIPERT_OK);
}

/* Rank 1 with p = 0.1: the coordinator refuses whichever of the two registers second (the
 * first sets the job's digest, runtime/job_digest.h), naming it and the group of settings that
 * differs; neither trains. */
Test(sparse_launch, replicas_with_different_fractions_are_refused_by_name)
{
    char *dir, *rank0, *rank1;
    two_workers("--dp.fraction=0.1", &dir, &rank0, &rank1);
    const char *refused = "is not of this job's build or settings";
    const char *named = strstr(rank0, refused) ? rank0 : strstr(rank1, refused) ? rank1 : NULL;
    cr_expect(named && strstr(named, "dp method/codec") &&
                  (strstr(named, "rank 0 is not") || strstr(named, "rank 1 is not")),
              "no refusal naming a rank and its dp settings:\nrank 0:\n%s\nrank 1:\n%s", rank0,
              rank1);
    cr_expect_not(strstr(rank0, "done: 20 steps"), "rank 0 trained to the end:\n%s", rank0);
    cr_expect_not(strstr(rank1, "done: 20 steps"), "rank 1 trained to the end:\n%s", rank1);
    free(rank0);
    free(rank1);
    remove_dir(dir);
}

/* Rank 1 with another seed (not in the job digest: replicas may draw other data) draws other
 * partitions: the exchange's descriptors differ, neither trains on, and the coordinator's line
 * names the rank that failed and, in its reason, the replica that sent the other draw. */
Test(sparse_launch, replicas_with_different_partitions_fail_naming_each_other)
{
    char *dir, *rank0, *rank1;
    two_workers("--seed=7", &dir, &rank0, &rank1);
    /* Either may notice first; the other may then stop on the job's abort
     * before it reports its own view. The coordinator (rank 0) names the
     * rank that failed, and its reason names the other replica. */
    const char *aborted = strstr(rank0, "job aborted: rank ");
    cr_assert(aborted, "the coordinator names no rank:\n%s", rank0);
    const int failed = atoi(aborted + strlen("job aborted: rank "));
    cr_assert(failed == 0 || failed == 1, "%s", aborted);
    char expected[128];
    snprintf(expected, sizeof expected,
             "job aborted: rank %d: dp sparse, stage 0: replica %d sent step 1", failed, 1 - failed);
    cr_expect(strstr(rank0, expected), "expected \"%s\" in:\n%s", expected, rank0);
    cr_expect(strstr(aborted, "nothing of it was applied"), "%s", aborted);
    cr_expect_not(strstr(rank0, "done: 20 steps"), "rank 0 trained to the end:\n%s", rank0);
    cr_expect_not(strstr(rank1, "done: 20 steps"), "rank 1 trained to the end:\n%s", rank1);
    free(rank0);
    free(rank1);
    remove_dir(dir);
}
