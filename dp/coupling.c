#include "dp/coupling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp/device_collective.h"
#include "dp/methods.h"
#include "dp/wait.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* A collective that failed because a peer died is a departure if the
 * coordinator says so within this long (it hears of deaths by heartbeat
 * silence, PT_DEAD_AFTER_S, or at once from a closed connection). */
#define DEPARTURE_NOTICE_S 12.0

struct pt_coupling {
    const pt_coupling_method *method;
    pt_coupling_options options;        /* as the session gave them */
    pt_coupling_options method_options; /* as the method sees them (sites: the leaders) */
    bool by_sites;                      /* dense in each site, the method among the leaders */
    bool site_on_device;                /* the site's mean and broadcast in device memory */
    pt_device_collective *site_collective; /* for them: made when first needed, kept to the end */
    bool runs_method;                   /* this replica runs the method's exchanges */
    void *state;
    pt_coupling_metrics metrics;
    pt_coupling_blocked blocked;        /* options.blocked points here */
    double blocked_reported_s;          /* blocked.wall_s at the last take_metrics */
    /* elastic replicas */
    bool elastic, suspended;
    float *scratch;     /* [n_params + 1]: after_backward's gradient and loss (elastic, or
                           kernels whose memory the host cannot read); the table's
                           alloc_host (page-locked on cuda: the copies run at full speed) */
    size_t scratch_n;
    /* host copies of θ and the newest stash, for host_parameters and the site
     * broadcast when the host cannot read the kernels' memory */
    float *host_params, *host_stash;
    size_t host_n;
    void **retired;     /* buffers a cut-short collective may still write: kept to the end */
    int n_retired;
};

/* Indexed by dp.method's values (runtime/settings.h); the names are the configuration's. */
static const pt_coupling_method *const methods[PT_DP_BUILT_IN_METHODS] = {
    [PT_DP_ALLREDUCE] = &pt_dp_allreduce,
    [PT_DP_SPARSE] = &pt_dp_sparse,
    [PT_DP_DILOCO] = &pt_dp_diloco,
    [PT_DP_STREAMING_DILOCO] = &pt_dp_streaming_diloco,
    [PT_DP_CO2] = &pt_dp_co2,
    [PT_DP_NONE] = &pt_dp_none,
};

/* Methods a program added (pt_coupling_add_method), and the dp.method value of each. */
typedef struct added_method {
    const pt_coupling_method *method;
    int value;
} added_method;
static added_method added[PT_COUPLING_ADDED_MAX];
static int added_count;

const pt_coupling_method *pt_coupling_method_of(int value)
{
    if (value >= 0 && value < PT_DP_BUILT_IN_METHODS) return methods[value];
    for (int i = 0; i < added_count; i++)
        if (added[i].value == value) return added[i].method;
    char known[512];
    pt_fail(PIPERT_ERR_CONFIG, "dp.method: no method has the value %d (known: %s)", value,
            pt_config_choices("dp.method", known, sizeof known));
    return NULL;
}

pipert_result pt_coupling_add_method(const pt_coupling_method *method)
{
    for (int i = 0; i < PT_DP_BUILT_IN_METHODS + added_count; i++) {
        const pt_coupling_method *known = i < PT_DP_BUILT_IN_METHODS
                                              ? methods[i]
                                              : added[i - PT_DP_BUILT_IN_METHODS].method;
        if (!strcmp(known->name, method->name))
            return pt_fail(PIPERT_ERR_CONFIG, "dp.method: a method called \"%s\" is known already",
                           method->name);
    }
    if (added_count == PT_COUPLING_ADDED_MAX)
        return pt_fail(PIPERT_ERR_UNSUPPORTED, "dp.method: at most %d methods can be added",
                       PT_COUPLING_ADDED_MAX);
    int value; /* configurations may name it from now on */
    PT_TRY(pt_config_allow_choice("dp.method", method->name, &value));
    added[added_count++] = (added_method){method, value};
    return PIPERT_OK;
}

static pipert_result choose_site_path(pt_coupling *c); /* below, with the sites */

pipert_result pt_coupling_create(const pt_coupling_options *options, pt_coupling **out)
{
    *out = NULL;
    /* dp.nccl: allreduce on the GPUs (its create refuses any other method) */
    const pt_coupling_method *method = options->config->dp.nccl
                                           ? &pt_dp_allreduce_nccl
                                           : pt_coupling_method_of(options->config->dp.method);
    if (!method) return PIPERT_ERR_CONFIG; /* its message is set */
    pt_coupling *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "coupling: out of memory");
    c->method = method;
    c->options = *options;
    if (!c->options.kernels) c->options.kernels = pt_kernels_cpu();
    c->options.blocked = &c->blocked;
    c->method_options = c->options;
    c->by_sites = !method->over_all_replicas && options->sites > 1;
    if (c->by_sites) c->method_options.replicas = options->leaders;
    c->runs_method = !c->by_sites || options->leaders;
    c->metrics.method = method->name;
    pipert_result rc = choose_site_path(c);
    if (rc == PIPERT_OK) rc = method->create(&c->method_options, &c->state);
    if (rc != PIPERT_OK) {
        pt_device_collective_free(c->site_collective);
        free(c);
        return rc;
    }
    *out = c;
    return PIPERT_OK;
}

void pt_coupling_free(pt_coupling *c)
{
    if (!c) return;
    c->method->destroy(c->state);
    pt_device_collective_free(c->site_collective);
    if (c->scratch) c->options.kernels->free_host(c->scratch);
    if (c->host_params) c->options.kernels->free_host(c->host_params);
    if (c->host_stash) c->options.kernels->free_host(c->host_stash);
    for (int i = 0; i < c->n_retired; i++) c->options.kernels->free_host(c->retired[i]);
    free(c->retired);
    free(c);
}

static pipert_result method_call(pt_coupling *c,
                                 pipert_result (*call)(void *, pt_coupling_point *,
                                                       pt_coupling_metrics *),
                                 pt_coupling_point *at)
{
    return call ? call(c->state, at, &c->metrics) : PIPERT_OK;
}

/* ---- sites: dense inside, the method between them -------------------------- */

/* Where the site's replicas average and follow their leader: in device memory when every one
 * of them copies every other's (a site on one host of GPUs: dp/device_collective.h), else
 * through host copies. The site's replicas decide together, whenever the groups are formed. */
static pipert_result choose_site_path(pt_coupling *c)
{
    c->site_on_device = false;
    pt_group *site = c->by_sites ? c->options.site_replicas : NULL;
    PT_TRY(pt_device_collective_agree(&c->options, site, &c->site_on_device));
    if (site && !c->options.kernels->host_accessible)
        pt_info("stage %d: the %d replicas of this site average their gradients and take their "
                "leader's parameters %s", c->options.stage, pt_group_size(site),
                c->site_on_device ? "in device memory, device to device" : "through host copies");
    if (!c->site_on_device || c->site_collective) return PIPERT_OK;
    return pt_device_collective_create(c->options.kernels, 0, &c->site_collective);
}

/* The site's mean of a tensor in the kernels' memory, or its leader's copy of it. */
static pipert_result site_collective(pt_coupling *c, float *data, size_t count, bool mean,
                                     const char *what)
{
    pt_group *site = c->options.site_replicas;
    if (mean) {
        PT_TRY(pt_device_collective_mean_start(c->site_collective, site, data, count));
        c->metrics.bytes_sent += (double)pt_device_collective_mean_bytes(site, count);
    } else {
        PT_TRY(pt_device_collective_broadcast_start(c->site_collective, site, data, count, 0));
        c->metrics.bytes_sent += (double)pt_device_collective_broadcast_bytes(site, count, 0);
    }
    return pt_coupling_wait_device_collective(&c->options, c->site_collective, what);
}

/* The site's mean of data[count]: in the kernels' memory where the site agreed to (`device`:
 * data is there), else in host memory. */
static pipert_result site_mean(pt_coupling *c, float *data, size_t count, long step, bool device)
{
    char what[96];
    snprintf(what, sizeof what, "averaging the gradients of step %ld in this site", step);
    if (device && c->site_on_device) return site_collective(c, data, count, true, what);
    pt_allreduce_handle *handle;
    PT_TRY(pt_allreduce_start(c->options.site_replicas, data, count, PT_REDUCE_MEAN, &handle));
    c->metrics.bytes_sent += (double)pt_allreduce_bytes_sent(c->options.site_replicas, count);
    return pt_coupling_wait_allreduce(&c->options, handle, what);
}

static pipert_result site_broadcast(pt_coupling *c, float *data, size_t count)
{
    if (c->site_on_device)
        return site_collective(c, data, count, false, "taking the site leader's parameters");
    const size_t nbytes = count * sizeof(float);
    c->metrics.bytes_sent += (double)pt_broadcast_bytes_sent(c->options.site_replicas, nbytes, 0);
    /* blocking: all of it is waiting for the site's replicas */
    const double started = pt_now_s(), cpu_started = pt_process_cpu_s();
    pipert_result rc = pt_broadcast(c->options.site_replicas, data, nbytes, 0);
    c->blocked.wall_s += pt_now_s() - started;
    c->blocked.cpu_s += pt_process_cpu_s() - cpu_started;
    return rc;
}

/* The site's replicas took the same gradients, so they differ only by what
 * the method changed on the leader: its parameters (and newest stash) go out
 * to the site. */
static pipert_result site_follow_leader(pt_coupling *c, pt_coupling_point *at)
{
    PT_TRY(site_broadcast(c, at->params, at->n_params));
    if (at->newest_stash) PT_TRY(site_broadcast(c, at->newest_stash, at->n_params));
    return PIPERT_OK;
}

/* The site's mean, then the method's; at's gradient in the kernels' memory, or (`copied`) a
 * host copy of it. */
static pipert_result average_gradients(pt_coupling *c, pt_coupling_point *at, bool copied)
{
    if (c->by_sites && c->options.site_replicas) {
        PT_TRY(site_mean(c, at->grads, at->n_params, at->step, !copied));
        if (at->loss) PT_TRY(site_mean(c, at->loss, 1, at->step, false)); /* a host float */
    }
    return c->runs_method ? method_call(c, c->method->after_backward, at) : PIPERT_OK;
}

/* ---- kernels whose memory the host cannot read ----------------------------- */

static bool host_reads_kernel_memory(const pt_coupling *c)
{
    return c->options.kernels->host_accessible;
}

/* Whether the method has replicas to exchange with: alone (no group), a method does nothing
 * with θ or the gradient, and nothing need be copied for it. */
static bool method_has_peers(const pt_coupling *c)
{
    return c->runs_method && c->method_options.replicas;
}

static pipert_result host_params_alloc(pt_coupling *c, size_t n)
{
    if (c->host_params && c->host_n == n) return PIPERT_OK;
    const pt_kernels *k = c->options.kernels;
    if (c->host_params) k->free_host(c->host_params);
    if (c->host_stash) k->free_host(c->host_stash);
    c->host_params = c->host_stash = NULL;
    c->host_n = n;
    PT_TRY(k->alloc_host((void **)&c->host_params, n * sizeof(float), "a host copy of θ"));
    return k->alloc_host((void **)&c->host_stash, n * sizeof(float),
                         "a host copy of the newest weight stash");
}

/* Runs `call` on a view of `at` whose θ and newest stash are host copies,
 * and copies them back after it. */
static pipert_result on_host_parameters(pt_coupling *c, pt_coupling_point *at,
                                        pipert_result (*call)(pt_coupling *, pt_coupling_point *))
{
    const pt_kernels *k = c->options.kernels;
    const size_t bytes = at->n_params * sizeof(float);
    PT_TRY(host_params_alloc(c, at->n_params));
    pt_coupling_point view = *at;
    view.params = c->host_params;
    view.newest_stash = at->newest_stash ? c->host_stash : NULL;
    k->copy_to_host(view.params, at->params, bytes);
    if (view.newest_stash) k->copy_to_host(view.newest_stash, at->newest_stash, bytes);
    const pipert_result rc = call(c, &view);
    k->copy_to_device(at->params, view.params, bytes);
    if (view.newest_stash) k->copy_to_device(at->newest_stash, view.newest_stash, bytes);
    return rc;
}

static pipert_result run_after_step(pt_coupling *c, pt_coupling_point *at)
{
    return method_call(c, c->method->after_step, at);
}

static pipert_result follow_step(pt_coupling *c, pt_coupling_point *at)
{
    const bool host = host_reads_kernel_memory(c);
    if (c->runs_method && c->method->after_step) {
        if (host || !c->method->host_parameters || !method_has_peers(c))
            PT_TRY(run_after_step(c, at));
        else
            PT_TRY(on_host_parameters(c, at, run_after_step));
    }
    if (!c->by_sites || !c->options.site_replicas || !c->method->after_step) return PIPERT_OK;
    if (host || c->site_on_device) return site_follow_leader(c, at);
    return on_host_parameters(c, at, site_follow_leader);
}

/* ---- elastic replicas ------------------------------------------------------- */

static bool membership_changed(const pt_coupling *c)
{
    return c->options.membership_changed && c->options.membership_changed(c->options.context);
}

/* Whether a failed call failed because replicas left: the coordinator said
 * so, or says so soon after a peer was found dead. */
static bool departed(pt_coupling *c, pipert_result rc)
{
    if (!c->elastic || rc == PIPERT_OK) return false;
    if (membership_changed(c)) return true;
    if (rc != PIPERT_ERR_PEER && rc != PIPERT_ERR_TRANSPORT) return false;
    for (const double until = pt_now_s() + DEPARTURE_NOTICE_S; pt_now_s() < until;) {
        if (membership_changed(c)) return true;
        if (c->options.should_stop && c->options.should_stop(c->options.context)) return false;
        struct timespec pause = {0, 20 * 1000000L};
        nanosleep(&pause, NULL);
    }
    return false;
}

static pipert_result retire(pt_coupling *c, void *buffer)
{
    void **grown = realloc(c->retired, (size_t)(c->n_retired + 1) * sizeof *grown);
    if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "coupling: out of memory");
    c->retired = grown;
    c->retired[c->n_retired++] = buffer;
    return PIPERT_OK;
}

/* A call cut short by a departure: this step averages nothing. */
static pipert_result cut_short(pt_coupling *c, const pt_coupling_point *at, const char *where)
{
    pt_warn("replicas left the job during step %ld's %s: this step keeps its own values%s; the "
            "coupling pauses until the survivors regroup", at->step, where,
            c->method->gradients_on_device && c->method->gradients_on_device(c->state)
                ? " (those averaged in device memory before: the regroup makes replicas equal)"
                : "");
    pt_coupling_suspend(c);
    return PIPERT_OK;
}

/* after_backward on a host copy of the gradient, copied back when it
 * succeeded: elastic replicas, so that a collective cut short, which may still
 * write into its buffer (then retired), never writes the model's gradient;
 * and kernels whose memory the host cannot read. */
static pipert_result average_gradients_copied(pt_coupling *c, pt_coupling_point *at)
{
    const pt_kernels *k = c->options.kernels;
    if (!c->scratch || c->scratch_n != at->n_params) {
        if (c->scratch) PT_TRY(retire(c, c->scratch));
        c->scratch = NULL;
        PT_TRY(k->alloc_host((void **)&c->scratch, (at->n_params + 1) * sizeof *c->scratch,
                             "the coupling's host copy of the gradient"));
        c->scratch_n = at->n_params;
    }
    pt_coupling_point copy = *at;
    copy.grads = c->scratch;
    k->copy_to_host(copy.grads, at->grads, at->n_params * sizeof *at->grads);
    if (at->loss) {
        copy.loss = c->scratch + at->n_params;
        *copy.loss = *at->loss;
    }
    pipert_result rc = average_gradients(c, &copy, true);
    if (rc == PIPERT_OK) {
        k->copy_to_device(at->grads, copy.grads, at->n_params * sizeof *at->grads);
        if (at->loss) *at->loss = *copy.loss;
        return PIPERT_OK;
    }
    if (!departed(c, rc)) return rc;
    PT_TRY(retire(c, c->scratch));
    c->scratch = NULL;
    return cut_short(c, at, "gradient averaging");
}

/* Whether after_backward reads the gradient on the host: the site's dense mean, or a method
 * that averages gradients there with other replicas. */
static bool reads_gradients(const pt_coupling *c)
{
    const pt_coupling_method *method = c->method;
    const bool on_device = method->gradients_on_device && method->gradients_on_device(c->state);
    return (c->by_sites && c->options.site_replicas && !c->site_on_device) ||
           (method_has_peers(c) && method->after_backward && method->host_gradients && !on_device);
}

pipert_result pt_coupling_after_backward(pt_coupling *c, pt_coupling_point *at)
{
    if (c->suspended) return PIPERT_OK;
    if (reads_gradients(c) && (c->elastic || !host_reads_kernel_memory(c)))
        return average_gradients_copied(c, at);
    /* the kernels' memory itself: a mean on the devices (or nothing to average) */
    const pipert_result rc = average_gradients(c, at, false);
    if (rc == PIPERT_OK || !departed(c, rc)) return rc;
    return cut_short(c, at, "gradient averaging");
}

pipert_result pt_coupling_after_step(pt_coupling *c, pt_coupling_point *at)
{
    if (c->suspended) return PIPERT_OK;
    pipert_result rc = follow_step(c, at);
    if (rc == PIPERT_OK || !departed(c, rc)) return rc;
    return cut_short(c, at, "parameter averaging");
}

void pt_coupling_set_elastic(pt_coupling *c, bool elastic) { c->elastic = elastic; }

void pt_coupling_suspend(pt_coupling *c)
{
    if (c->suspended) return;
    c->suspended = true;
    if (c->method->suspend) c->method->suspend(c->state);
}

bool pt_coupling_suspended(const pt_coupling *c) { return c->suspended; }

/* The groups as the method sees them: with sites, the leaders run it. */
static void adopt_groups(pt_coupling *c, const pt_coupling_options *groups)
{
    c->options.replicas = groups->replicas;
    c->options.site_replicas = groups->site_replicas;
    c->options.leaders = groups->leaders;
    c->options.sites = groups->sites;
    c->method_options = c->options;
    c->by_sites = !c->method->over_all_replicas && c->options.sites > 1;
    if (c->by_sites) c->method_options.replicas = c->options.leaders;
    c->runs_method = !c->by_sites || c->options.leaders;
}

pipert_result pt_coupling_regroup(pt_coupling *c, const pt_coupling_options *groups,
                                  const pt_coupling_point *at)
{
    if (!c->method->regroup)
        return pt_fail(PIPERT_ERR_UNSUPPORTED, "dp.method=%s cannot go on after a replica left "
                                               "the job (not supported yet)", c->method->name);
    adopt_groups(c, groups);
    PT_TRY(choose_site_path(c));
    PT_TRY(c->method->regroup(c->state, &c->method_options, at));
    c->suspended = false;
    return PIPERT_OK;
}

pipert_result pt_coupling_save(pt_coupling *c, pt_safetensors_writer *w)
{
    PT_TRY(pt_safetensors_writer_set_metadata(w, "dp_method", c->method->name));
    return c->method->save ? c->method->save(c->state, w) : PIPERT_OK;
}

pipert_result pt_coupling_load(pt_coupling *c, const pt_safetensors *st, const char *path)
{
    return c->method->load ? c->method->load(c->state, st, path) : PIPERT_OK;
}

pt_coupling_blocked pt_coupling_blocked_time(const pt_coupling *c) { return c->blocked; }

pt_coupling_metrics pt_coupling_take_metrics(pt_coupling *c)
{
    pt_coupling_metrics m = c->metrics;
    m.wait_ms = 1e3 * (c->blocked.wall_s - c->blocked_reported_s);
    c->blocked_reported_s = c->blocked.wall_s;
    c->metrics = (pt_coupling_metrics){.method = c->method->name, .delay = m.delay};
    return m;
}

const char *pt_coupling_method_name(const pt_coupling *c) { return c->method->name; }

bool pt_coupling_replicas_identical(const pt_coupling *c) { return c->method->replicas_identical; }

const float *pt_coupling_eval_params(const pt_coupling *c)
{
    return c && c->runs_method && c->method->eval_params ? c->method->eval_params(c->state) : NULL;
}
