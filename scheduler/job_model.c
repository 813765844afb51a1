#include "scheduler/job_model.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/error.h"

static int site(const pt_job_model_input *in, int rank)
{
    return in->site_of ? in->site_of[rank] : 0;
}

static pt_sim_link between(const pt_job_model_input *in, int a, int b)
{
    if (!in->links) return in->local;
    if (a == b) /* the diagonal, where it says anything (a cluster file's does not) */
        return in->links[a * in->n_sites + a].bytes_per_s > 0 ? in->links[a * in->n_sites + a]
                                                               : in->local;
    const pt_sim_link x = in->links[a * in->n_sites + b], y = in->links[b * in->n_sites + a];
    return (pt_sim_link){x.bytes_per_s < y.bytes_per_s ? x.bytes_per_s : y.bytes_per_s,
                         x.latency_s > y.latency_s ? x.latency_s : y.latency_s};
}

static int compare_ints(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The sites stage s's replicas are in, each once, in increasing order; returns how many. */
static int stage_sites(const pt_job_model_input *in, int s, int *sites)
{
    const int S = in->plan->stages, R = in->replicas;
    for (int r = 0; r < R; r++) sites[r] = site(in, r * S + s);
    qsort(sites, (size_t)R, sizeof *sites, compare_ints);
    int n = 0;
    for (int r = 0; r < R; r++)
        if (!n || sites[r] != sites[n - 1]) sites[n++] = sites[r];
    return n;
}

/* Stage s's coupling: who takes part (every replica, or by sites one leader a site,
 * cost.h) and its link (job_model.h); `sites` is room for R ints. */
static void coupling_link(const pt_job_model_input *in, pt_job_model *m, int s, int *n_links,
                          int *sites)
{
    const int S = in->plan->stages, R = in->replicas;
    m->link_of[s] = 0;
    m->members[s] = R;
    if (R < 2) return;
    const int n = pt_cost_coupling_by_sites(in->config) ? stage_sites(in, s, sites) : 1;
    if (n > 1) m->members[s] = n;
    int worst_a = -1, worst_b = -1;
    pt_sim_link worst = in->local;
    for (int i = 0; i < m->members[s]; i++) { /* the ring's hops: leaders by site, or replicas */
        const int x = n > 1 ? sites[i] : site(in, i * S + s);
        const int y = n > 1 ? sites[(i + 1) % n] : site(in, ((i + 1) % R) * S + s);
        if (x == y) continue;
        const pt_sim_link l = between(in, x, y);
        if (worst_a < 0 || l.bytes_per_s < worst.bytes_per_s) worst = l, worst_a = x, worst_b = y;
    }
    if (worst_a < 0) { /* every replica of the stage in one site: its own link (the diagonal) */
        worst_a = worst_b = site(in, s);
        worst = between(in, worst_a, worst_a);
    }
    const int lo = worst_a < worst_b ? worst_a : worst_b, hi = worst_a ^ worst_b ^ lo;
    for (int l = 1; l < *n_links; l++)
        if (m->link_pairs[l][0] == lo && m->link_pairs[l][1] == hi) {
            m->link_of[s] = l;
            return;
        }
    m->link_pairs[*n_links][0] = lo;
    m->link_pairs[*n_links][1] = hi;
    m->coupling_links[*n_links] = worst;
    m->link_of[s] = (*n_links)++;
}

/* What each rank's step adds to its optimizer step for the coupling (cost.h): by sites, its
 * site's dense mean and broadcast (k replicas of the stage in that site); the method's own
 * CPU work. `count` is room for n_sites ints. */
static void coupling_work(const pt_job_model_input *in, pt_job_model *m, int *count)
{
    const int S = in->plan->stages, R = in->replicas;
    if (R < 2) return;
    for (int s = 0; s < S; s++) {
        const int n_sites = in->n_sites > 1 ? in->n_sites : 1;
        for (int i = 0; i < n_sites; i++) count[i] = 0;
        for (int r = 0; r < R; r++) count[site(in, r * S + s)]++;
        int sites = 0;
        for (int i = 0; i < n_sites; i++) sites += count[i] > 0;
        const bool by_sites = pt_cost_coupling_by_sites(in->config) && sites > 1;
        for (int r = 0; r < R; r++) {
            const int i = r * S + s, a = site(in, i);
            const double params = m->cost[i].params;
            if (by_sites)
                m->times[i].optimizer_s +=
                    pt_cost_site_coupling_s(in->config, count[a], params, between(in, a, a));
            m->times[i].optimizer_s += pt_cost_method_cpu_s(in->config, &in->devices[i], params);
        }
    }
}

static pipert_result allocate(pt_job_model *m, int S, int R)
{
    const size_t ranks = (size_t)R * (size_t)S;
    m->cost = calloc(ranks, sizeof *m->cost);
    m->times = calloc(ranks, sizeof *m->times);
    m->stage_links = calloc(ranks, sizeof *m->stage_links);
    m->stage_queue = calloc(2 * ranks, sizeof *m->stage_queue);
    m->coupling_bytes = calloc((size_t)S, sizeof *m->coupling_bytes);
    m->link_of = calloc((size_t)S, sizeof *m->link_of);
    m->members = calloc((size_t)S, sizeof *m->members);
    m->coupling_links = calloc((size_t)S + 1, sizeof *m->coupling_links);
    m->link_pairs = calloc((size_t)S + 1, sizeof *m->link_pairs);
    if (!m->cost || !m->times || !m->stage_links || !m->stage_queue || !m->coupling_bytes ||
        !m->link_of || !m->members ||
        !m->coupling_links || !m->link_pairs)
        return pt_fail(PIPERT_ERR_NOMEM, "job model: out of memory for %zu ranks", ranks);
    return PIPERT_OK;
}

/* The microbatches per optimizer step, as the executor runs them. */
static int microbatches(const pipert_config *config, pt_schedule_kind kind, int S)
{
    if (kind == PT_SCHEDULE_ASYNC_1F1B) return 1;
    return S == 1 ? config->train.grad_accum : config->pipeline.microbatches;
}

/* The queues of every pipeline boundary (simulate.h, a queue per direction): its own inside a
 * site; between two sites, the first boundary's (in replica-major order) that joins the same
 * two sites, oriented: queue 2f carries bytes from the lower-numbered site to the higher, 2f + 1
 * back. One pass, with the first boundary of each pair of sites in a table. */
static pipert_result crossing_queues(const pt_job_model_input *in, pt_job_model *m)
{
    const int S = in->plan->stages, R = in->replicas, n = in->n_sites > 1 ? in->n_sites : 1;
    int *first = malloc((size_t)n * (size_t)n * sizeof *first);
    if (!first) return pt_fail(PIPERT_ERR_NOMEM, "job model: out of memory for %d sites", n);
    for (int i = 0; i < n * n; i++) first[i] = -1;
    for (int r = 0; r < R; r++)
        for (int s = 0; s + 1 < S; s++) {
            const int at = r * (S - 1) + s, a = site(in, r * S + s), b = site(in, r * S + s + 1);
            m->stage_links[at] = between(in, a, b);
            m->stage_queue[2 * at] = 2 * at;
            m->stage_queue[2 * at + 1] = 2 * at + 1;
            if (a == b) continue;
            const int pair = a < b ? a * n + b : b * n + a;
            if (first[pair] < 0) first[pair] = at;
            m->stage_queue[2 * at] = 2 * first[pair] + (a > b);     /* activations, a to b */
            m->stage_queue[2 * at + 1] = 2 * first[pair] + (a < b); /* gradients, b to a */
        }
    free(first);
    return PIPERT_OK;
}

static pipert_result price_ranks(const pt_job_model_input *in, pt_job_model *m)
{
    const int S = in->plan->stages, R = in->replicas;
    double *params = calloc((size_t)S, sizeof *params);
    if (!params) return pt_fail(PIPERT_ERR_NOMEM, "job model: out of memory");
    pipert_result rc = PIPERT_OK;
    for (int i = 0; i < R * S && rc == PIPERT_OK; i++) {
        rc = pt_cost_stage(in->config, in->plan, i % S, &in->devices[i], &m->cost[i]);
        m->times[i] = m->cost[i].time;
        params[i % S] = m->cost[i].params;
    }
    if (rc == PIPERT_OK) rc = crossing_queues(in, m);
    int *scratch = calloc((size_t)(R > in->n_sites ? R : in->n_sites) + 1, sizeof *scratch);
    if (rc == PIPERT_OK && !scratch) rc = pt_fail(PIPERT_ERR_NOMEM, "job model: out of memory");
    int n_links = 1;
    m->coupling_links[0] = in->local;
    for (int s = 0; s < S && rc == PIPERT_OK; s++) coupling_link(in, m, s, &n_links, scratch);
    if (rc == PIPERT_OK) {
        m->in.coupling.n_links = n_links;
        coupling_work(in, m, scratch);
        rc = pt_cost_coupling(in->config, m->members, S, params, m->coupling_bytes,
                              &m->in.coupling);
    }
    free(scratch);
    free(params);
    return rc;
}

pipert_result pt_job_model_build(const pt_job_model_input *in, pt_job_model *out)
{
    *out = (pt_job_model){0};
    const int S = in->plan->stages, R = in->replicas;
    pipert_result rc = allocate(out, S, R);
    pt_sim_input *sim = &out->in;
    sim->kind = in->config->pipeline.schedule;
    if (rc == PIPERT_OK) rc = price_ranks(in, out);
    if (rc != PIPERT_OK) {
        pt_job_model_free(out);
        return rc;
    }
    const bool async = sim->kind == PT_SCHEDULE_ASYNC_1F1B;
    sim->stages = S;
    sim->replicas = R;
    sim->microbatches = microbatches(in->config, sim->kind, S);
    sim->steps = in->steps ? in->steps : async ? 12 * S + 20 : 10;
    sim->costs = out->times;
    sim->device_of = in->device_of;
    sim->n_devices = in->n_devices;
    sim->stage_links = out->stage_links;
    sim->stage_queue = out->stage_queue;
    sim->activation_bytes = out->cost[0].bytes_message;
    sim->coupling.link_of = out->link_of;
    sim->coupling.links = out->coupling_links;
    out->tokens_per_step = (double)R * sim->microbatches * in->config->train.batch_size *
                           in->config->model.block_size;
    return PIPERT_OK;
}

void pt_job_model_free(pt_job_model *m)
{
    free(m->cost);
    free(m->times);
    free(m->stage_links);
    free(m->stage_queue);
    free(m->coupling_bytes);
    free(m->link_of);
    free(m->members);
    free(m->coupling_links);
    free(m->link_pairs);
    *m = (pt_job_model){0};
}

double pt_job_model_peak_memory(const pt_job_model *m, const pt_sim_result *r, int *rank)
{
    double peak = 0;
    *rank = 0;
    for (int i = 0; i < m->in.replicas * m->in.stages; i++) {
        const double bytes = pt_cost_stage_memory(&m->cost[i], r->ranks[i].peak_activations);
        if (bytes > peak) peak = bytes, *rank = i;
    }
    return peak;
}

double pt_job_model_coupling_bytes_per_step(const pt_job_model *m, const pt_sim_result *r)
{
    double total = 0;
    for (int l = 0; l < m->in.coupling.n_links; l++) total += r->coupling_link_bytes[l];
    return total / m->in.replicas / m->in.steps;
}
