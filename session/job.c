#include "session/job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/topology.h"

/* How long a worker waits for every rank to register. */
#define TABLE_TIMEOUT_S (PT_REGISTER_TIMEOUT_S + 30.0)
/* How long connecting the data plane to every peer may take. */
#define CONNECT_TIMEOUT_S 60.0

static bool asked_to_stop(const pt_job *job)
{
    return job->should_stop && job->should_stop(job->context);
}

/* ---- the data plane ------------------------------------------------------ */

/* Connects to every rank this one exchanges tensors with: the other stages
 * of its replica (pipeline) and, with along_replicas, the other replicas of
 * its stage (coupling; a joiner's come to it later: pt_job_admit_joiners).
 * Each pair connects once: the higher rank dials. */
static pipert_result connect_peers(pt_job *job, bool along_replicas)
{
    const pt_layout *l = &job->layout;
    const int axes = l->stages + (along_replicas ? l->replicas : 0);
    pipert_result rc = PIPERT_OK;
    for (int pass = 0; pass < 2 && rc == PIPERT_OK; pass++) /* dial lower ranks, then wait for higher */
        for (int i = 0; i < axes && rc == PIPERT_OK; i++) {
            const bool along_stages = i < l->stages;
            const int peer = along_stages ? pt_layout_rank(l, i, job->replica)
                                          : pt_layout_rank(l, job->stage, i - l->stages);
            if (peer == job->rank || (!along_stages && i - l->stages == job->replica)) continue;
            if (pass == 0 && peer < job->rank)
                rc = pt_transport_connect(job->transport, peer, job->addresses[peer]);
            else if (pass == 1 && peer > job->rank)
                rc = pt_transport_wait_peer(job->transport, peer, CONNECT_TIMEOUT_S);
        }
    return rc;
}

/* A group of this job is stale once the membership moved past the epoch it was formed at (the
 * others regroup without whoever still waits in it), or when the job told this rank to stop:
 * its blocking collectives then stop waiting (collectives.h). */
static bool group_interrupted(void *context)
{
    pt_job *job = context;
    if (job->client && pt_coord_client_aborted(job->client)) return true;
    /* a joiner's replica is out of the job until its switch: the groups it starts with (its
     * own replica's) wait on until then */
    if (job->joining && !job->regrouped) return false;
    if (pt_job_aborted(job)) return true;
    if (!job->elastic) return false;
    pt_membership_news news;
    pt_job_membership(job, &news);
    return news.epoch > job->groups_epoch;
}

static pt_group_options group_options(pt_job *job)
{
    pt_group_options options = PT_GROUP_OPTIONS_INIT;
    options.interrupted = group_interrupted;
    options.context = job;
    return options;
}

/* The ranks along one axis of the (stage, replica) grid through this rank, their
 * collectives numbered from first_sequence. */
static pipert_result make_group(pt_job *job, bool along_stages, uint32_t id,
                                uint32_t first_sequence, pt_group **out)
{
    const pt_layout *l = &job->layout;
    const int n = along_stages ? l->stages : l->replicas;
    if (n == 1) return PIPERT_OK;
    int *ranks = calloc((size_t)n, sizeof *ranks);
    if (!ranks) return pt_fail(PIPERT_ERR_NOMEM, "group: out of memory");
    for (int i = 0; i < n; i++)
        ranks[i] = along_stages ? pt_layout_rank(l, i, job->replica) : pt_layout_rank(l, job->stage, i);
    pt_group_options options = group_options(job);
    options.id = id;
    options.first_sequence = first_sequence;
    pipert_result rc = pt_group_create(job->transport, ranks, n, &options, out);
    free(ranks);
    return rc;
}

/* Ids of the groups one rank is in: its replicas, its stages, its site, the
 * leaders, the site census and the world. An id only has to tell apart groups
 * that share a pair of members (a message's tag is the id and a sequence):
 * two ranks share a replica group when they are of one stage and a stage
 * group when they are of one replica, never both, so every replica group and
 * every stage group can have one id each, whatever the stages and replicas. */
#define REPLICA_GROUP_ID 0u
#define STAGE_GROUP_ID 1u
#define WORLD_GROUP_ID 252u
#define SITE_GROUP_ID 254u
#define LEADERS_GROUP_ID 255u
#define CENSUS_GROUP_ID 253u

/* Every replica's site (sites[replica]), by an all-gather among the replicas
 * of this stage. */
static pipert_result site_census(pt_job *job, int *sites)
{
    pt_group *census;
    PT_TRY(make_group(job, false, CENSUS_GROUP_ID, 0, &census));
    pipert_result rc = pt_allgather(census, &job->site, sizeof job->site, sites);
    pt_group_destroy(census);
    if (rc != PIPERT_OK) pt_error_prefix("learning the replicas' sites");
    return rc;
}

/* The ranks of the replicas of this stage (replicas[0..count), in sites[0..count)) in
 * order of (site, replica), and where this worker's site starts and ends among them. */
static void order_by_site(const pt_job *job, const int *sites, const int *replicas, int count,
                          int *ranks, int *site_first, int *site_count, int *leaders,
                          int *n_leaders)
{
    int n = 0;
    *n_leaders = 0;
    *site_first = *site_count = 0;
    for (int site = 0; n < count; site++) {
        const int first = n;
        for (int i = 0; i < count; i++)
            if (sites[i] == site) ranks[n++] = pt_layout_rank(&job->layout, job->stage, replicas[i]);
        if (n == first) continue;
        leaders[(*n_leaders)++] = ranks[first];
        if (site == job->site) *site_first = first, *site_count = n - first;
    }
}

/* The transport counts bytes to replicas in other sites apart (the link
 * class between sites); the stages of a replica, see mark_remote_stages. */
static pipert_result mark_remote_replicas(pt_job *job, const int *sites)
{
    for (int r = 0; r < job->layout.replicas; r++)
        if (sites[r] != job->site)
            PT_TRY(pt_transport_mark_remote(job->transport,
                                            pt_layout_rank(&job->layout, job->stage, r)));
    return PIPERT_OK;
}

/* The groups of this stage's replicas that are still in the job (left[r]:
 * replica r left; NULL: all are in), from the sites the census found. */
static pipert_result build_replica_groups(pt_job *job, const bool *left, uint32_t first_sequence)
{
    const int R = job->layout.replicas;
    int *sites = calloc((size_t)R, sizeof *sites), *ranks = calloc((size_t)R, sizeof *ranks),
        *leaders = calloc((size_t)R, sizeof *leaders), *replicas = calloc((size_t)R, sizeof *replicas);
    pipert_result rc = sites && ranks && leaders && replicas
                           ? PIPERT_OK
                           : pt_fail(PIPERT_ERR_NOMEM, "groups: out of memory");
    int n = 0, site_first = 0, site_count = 0, n_leaders = 0;
    for (int r = 0; rc == PIPERT_OK && r < R; r++)
        if (!left || !left[r]) replicas[n] = r, sites[n++] = job->replica_sites[r];
    if (rc == PIPERT_OK) {
        order_by_site(job, sites, replicas, n, ranks, &site_first, &site_count, leaders, &n_leaders);
        job->sites = n_leaders;
    }
    pt_group_options options = group_options(job);
    options.first_sequence = first_sequence;
    options.id = REPLICA_GROUP_ID;
    if (rc == PIPERT_OK && n > 1)
        rc = pt_group_create(job->transport, ranks, n, &options, &job->replica_group);
    options.id = SITE_GROUP_ID;
    if (rc == PIPERT_OK && site_count > 1)
        rc = pt_group_create(job->transport, ranks + site_first, site_count, &options,
                             &job->site_group);
    options.id = LEADERS_GROUP_ID;
    if (rc == PIPERT_OK && n_leaders > 1 && ranks[site_first] == job->rank)
        rc = pt_group_create(job->transport, leaders, n_leaders, &options, &job->leaders_group);
    free(sites);
    free(ranks);
    free(leaders);
    free(replicas);
    return rc;
}

static pipert_result make_replica_groups(pt_job *job)
{
    const int R = job->layout.replicas;
    if (R == 1) return PIPERT_OK;
    int *sites = calloc((size_t)R, sizeof *sites);
    pipert_result rc = sites ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "groups: out of memory");
    if (rc == PIPERT_OK) rc = site_census(job, sites);
    if (rc == PIPERT_OK) rc = mark_remote_replicas(job, sites);
    if (rc == PIPERT_OK) {
        job->replica_sites = sites;
        return build_replica_groups(job, NULL, 0);
    }
    free(sites);
    return rc;
}

/* Closes UCX's listening sockets to strangers (pt_transport_stop_listening) once every peer
 * of this rank has connected to it: each of them is in one of its groups, and entered the
 * group's barrier only after connecting. */
static pipert_result stop_listening(pt_job *job)
{
    if (job->replica_group) PT_TRY(pt_barrier(job->replica_group));
    if (job->stage_group) PT_TRY(pt_barrier(job->stage_group));
    return pt_transport_stop_listening(job->transport);
}

/* A replica's stages may be in different sites (a plan that spans sites
 * with a pipeline): its neighbours' sites, by an all-gather along it. */
static pipert_result mark_remote_stages(pt_job *job)
{
    const int S = job->layout.stages;
    if (!job->stage_group || S == 1) return PIPERT_OK;
    int *sites = calloc((size_t)S, sizeof *sites);
    if (!sites) return pt_fail(PIPERT_ERR_NOMEM, "groups: out of memory");
    pipert_result rc = pt_allgather(job->stage_group, &job->site, sizeof job->site, sites);
    if (rc != PIPERT_OK) pt_error_prefix("learning the stages' sites");
    for (int s = 0; s < S && rc == PIPERT_OK; s++)
        if (sites[s] != job->site)
            rc = pt_transport_mark_remote(job->transport,
                                          pt_layout_rank(&job->layout, s, job->replica));
    free(sites);
    return rc;
}

/* Under pipert launch, and with a standalone coordinator (PIPERT_COORD_STANDALONE), the
 * coordinator is a process apart from the workers, and they can outlive it: they agree on
 * when to stop over a group of every rank (session/coordinator_loss.c). Its ring only uses
 * connections the job has (pt_layout_world_ring). Elsewhere rank 0 hosts the coordinator: its
 * loss is rank 0's death, which the transport reports. */
static bool outlives_coordinator(const pt_job *job)
{
    return job->mode == PT_JOB_LAUNCHER && job->world > 1 &&
           (job->boot.launcher == PT_LAUNCHER_PIPERT || job->boot.coord_standalone);
}

/* Over the replicas still in the job (left: NULL, all): the ring of a job of
 * that many replicas, each of its replicas mapped to a live one. */
static pipert_result make_world_group(pt_job *job, const bool *left, uint32_t first_sequence)
{
    if (!outlives_coordinator(job)) return PIPERT_OK;
    const int S = job->layout.stages;
    int *live = calloc((size_t)job->layout.replicas, sizeof *live),
        *ranks = calloc((size_t)job->world, sizeof *ranks);
    pipert_result rc = live && ranks ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "world group: out of memory");
    int n = 0;
    for (int r = 0; rc == PIPERT_OK && r < job->layout.replicas; r++)
        if (!left || !left[r]) live[n++] = r;
    const pt_layout survivors = {.stages = S, .replicas = n};
    if (rc == PIPERT_OK) pt_layout_world_ring(&survivors, ranks);
    for (int i = 0; rc == PIPERT_OK && i < n * S; i++)
        ranks[i] = pt_layout_rank(&job->layout, pt_layout_stage(&survivors, ranks[i]),
                                  live[pt_layout_replica(&survivors, ranks[i])]);
    pt_group_options options = group_options(job);
    options.id = WORLD_GROUP_ID;
    options.first_sequence = first_sequence;
    if (rc == PIPERT_OK && n * S > 1)
        rc = pt_group_create(job->transport, ranks, n * S, &options, &job->world_group);
    free(live);
    free(ranks);
    return rc;
}

static pipert_result connect_groups(pt_job *job)
{
    pt_membership_news news;
    pt_job_membership(job, &news);
    job->groups_epoch = news.epoch;
    if (job->joining) {
        /* Its replica's pipeline now; the replicas of its stage dial it at the switch. */
        job->listening = true;
        PT_TRY(connect_peers(job, false));
        PT_TRY(make_group(job, true, STAGE_GROUP_ID, 0, &job->stage_group));
        job->replica_sites = calloc((size_t)job->layout.replicas, sizeof *job->replica_sites);
        if (!job->replica_sites) return pt_fail(PIPERT_ERR_NOMEM, "job: out of memory");
        return mark_remote_stages(job);
    }
    PT_TRY(connect_peers(job, true));
    PT_TRY(make_replica_groups(job));
    PT_TRY(make_group(job, true, STAGE_GROUP_ID, 0, &job->stage_group));
    PT_TRY(make_world_group(job, NULL, 0));
    PT_TRY(mark_remote_stages(job));
    return stop_listening(job);
}

static pipert_result create_transport(pt_job *job, const char *secret, uint32_t job_id)
{
    pt_transport_options options = PT_TRANSPORT_OPTIONS_INIT;
    options.rank = job->rank;
    options.secret = secret;
    options.job = job_id;
    options.authenticate_messages = job->authenticate_messages;
    options.identity = job->identity;
    return pt_transport_create(&options, &job->transport);
}

static pipert_result place(pt_job *job, int stages)
{
    PT_TRY(pt_layout_make(job->world, stages, &job->layout));
    job->replica_left = calloc((size_t)job->layout.replicas, sizeof *job->replica_left);
    job->admitted = calloc((size_t)job->layout.replicas, sizeof *job->admitted);
    job->room_made = calloc((size_t)job->layout.replicas, sizeof *job->room_made);
    if (!job->replica_left || !job->admitted || !job->room_made)
        return pt_fail(PIPERT_ERR_NOMEM, "job: out of memory");
    job->stage = pt_layout_stage(&job->layout, job->rank);
    job->replica = pt_layout_replica(&job->layout, job->rank);
    return PIPERT_OK;
}

static pipert_result alloc_addresses(pt_job *job)
{
    job->addresses = calloc((size_t)job->world, sizeof *job->addresses);
    if (!job->addresses) return pt_fail(PIPERT_ERR_NOMEM, "peer addresses: out of memory");
    return PIPERT_OK;
}

/* ---- launched: pipert launch, SLURM, Open MPI, PMI ------------------------ */

static pipert_result bind_cores(const pt_job *job)
{
    if (job->boot.cores_count == 0) return PIPERT_OK;
    pt_topology *topology;
    PT_TRY(pt_topology_load(&topology));
    pipert_result rc = pt_topology_bind_process_to_cores(topology, job->boot.cores_first,
                                                         job->boot.cores_count);
    pt_topology_free(topology);
    if (rc != PIPERT_OK)
        pt_error_prefix("PIPERT_CORES=%d,%d", job->boot.cores_first, job->boot.cores_count);
    return rc;
}

/* Under SLURM, Open MPI and PMI rank 0 hosts the coordinator; PIPERT_MIN_REPLICAS makes its
 * job elastic as pipert launch --min-replicas does. */
static pipert_result start_coordinator(pt_job *job, const char *secret,
                                       const char *const *envp)
{
    pt_coordinator_options options = PT_COORDINATOR_OPTIONS_INIT;
    options.port = job->boot.coord_port;
    options.world = job->world;
    options.secret = secret;
    options.stages = job->layout.stages;
    options.min_replicas = job->min_replicas;
    if (job->boot.heartbeat_timeout_s > 0) options.dead_after_s = job->boot.heartbeat_timeout_s;
    PT_TRY(pt_coordinator_create(&job->coordinator, &options));
    pt_info("coordinator listening on port %d (workers reach it at %s:%d)", job->boot.coord_port,
            job->boot.coord_host, job->boot.coord_port);
    return pt_coordinator_start(job->coordinator);
}

/* Waits for every rank's registration in short slices, so a stop request is
 * not ignored for minutes. */
static pipert_result wait_for_table(pt_job *job, const pt_peer_table **peers)
{
    const double deadline = pt_now_s() + TABLE_TIMEOUT_S;
    for (;;) {
        pipert_result rc = pt_coord_client_wait_table(job->client, 0.5, peers);
        if (rc != PIPERT_ERR_TIMEOUT) return rc;
        if (asked_to_stop(job))
            return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while waiting for the other ranks");
        if (pt_now_s() > deadline) return pt_coord_client_wait_table(job->client, 0, peers);
    }
}

/* PIPERT_MIN_REPLICAS (pipert launch --min-replicas sets it): below the replicas, a failed
 * replica leaves and the others go on. */
static pipert_result read_min_replicas(pt_job *job, const char *const *envp)
{
    const char *text = pt_env_lookup(envp, "PIPERT_MIN_REPLICAS");
    if (!text) return PIPERT_OK;
    char *end;
    const long min = strtol(text, &end, 10);
    if (end == text || *end || min < 1 || min > job->layout.replicas)
        return pt_fail(PIPERT_ERR_CONFIG, "PIPERT_MIN_REPLICAS=%s: not a number of replicas in "
                                          "1..%d", text, job->layout.replicas);
    job->min_replicas = (int)min;
    job->elastic = min < job->layout.replicas;
    return PIPERT_OK;
}

/* On the coordinator client's thread: `replica` came back with new processes. This stage's
 * may dial this rank as soon as the switch that lets it in comes, which is after its join:
 * a joiner must have cleared its old process's place by then (a connection is refused from a
 * rank the transport saw fail, and one cut off may still look alive), also while its main
 * thread restores a state for seconds. Members dial the joiners at the switch themselves,
 * and their main thread may still be in a collective with the old process: only a joiner
 * (which has none with other replicas) does it here. */
static void make_room_at_once(void *context, int replica, long epoch)
{
    pt_job *job = context;
    if (replica == job->replica || !atomic_load(&job->makes_room)) return;
    const int rank = pt_layout_rank(&job->layout, job->stage, replica);
    if (pt_transport_drop_peer(job->transport, rank, "its replica left the job and a new "
                                                     "process takes its place") == PIPERT_OK &&
        pt_transport_forget_peer(job->transport, rank) == PIPERT_OK)
        atomic_store(&job->room_made[replica], epoch);
}

static pipert_result join_launched(pt_job *job, int stages, const char *const *envp)
{
    if (job->replacement_world > 0)
        PT_TRY(pt_bootstrap_replacement(&job->boot, envp, job->replacement_rank,
                                        job->replacement_world));
    else
        PT_TRY(pt_bootstrap_from_env(&job->boot, envp));
    job->rank = job->boot.rank;
    job->world = job->boot.world_size;
    if (job->site < 0) job->site = job->boot.site;
    PT_TRY(place(job, stages));
    PT_TRY(read_min_replicas(job, envp));
    PT_TRY(bind_cores(job));
    pt_info("rank %d of %d (stage %d, replica %d) under %s; coordinator %s:%d%s", job->rank,
            job->world, job->stage, job->replica, pt_launcher_name(job->boot.launcher),
            job->boot.coord_host, job->boot.coord_port, job->boot.hosts_coordinator ? " (here)" : "");
    char secret[PT_SECRET_MAX + 1];
    PT_TRY(pt_bootstrap_read_secret(&job->boot, secret));
    if (job->boot.hosts_coordinator) PT_TRY(start_coordinator(job, secret, envp));
    PT_TRY(create_transport(job, secret, (uint32_t)job->boot.coord_port));
    pt_coord_client_options options = PT_COORD_CLIENT_OPTIONS_INIT;
    options.host = job->boot.coord_host;
    options.port = job->boot.coord_port;
    options.secret = secret;
    options.rank = job->rank;
    options.world = job->world;
    options.address = pt_transport_address(job->transport);
    if (job->boot.heartbeat_timeout_s > 0) options.dead_after_s = job->boot.heartbeat_timeout_s;
    options.outlive_coordinator = outlives_coordinator(job);
    options.reconnect_s = job->boot.coord_reconnect_s;
    options.stages = stages;
    options.join = job->joining;
    options.identity = job->identity;
    options.on_join = make_room_at_once;
    options.on_join_context = job;
    atomic_store(&job->makes_room, job->joining);
    if (job->joining && !job->elastic)
        return pt_fail(PIPERT_ERR_CONFIG, "rejoining (pipert worker --join) needs elastic replicas: "
                                          "PIPERT_MIN_REPLICAS below the replicas (launch "
                                          "--min-replicas)");
    PT_TRY(pt_coord_client_connect(&job->client, &options));
    const pt_peer_table *peers;
    PT_TRY(wait_for_table(job, &peers));
    PT_TRY(alloc_addresses(job));
    for (int r = 0; r < job->world; r++) {
        pt_debug("peer rank %d: host %s, pid %d, data plane %s", r, peers->peers[r].host,
                 peers->peers[r].pid, peers->peers[r].address);
        job->addresses[r] = strdup(peers->peers[r].address);
        if (!job->addresses[r]) return pt_fail(PIPERT_ERR_NOMEM, "peer addresses: out of memory");
    }
    return connect_groups(job);
}

/* ---- out of band: the host program's allgather ---------------------------- */

/* What rank 0 tells every rank first: the job's secret and id. */
typedef struct oob_job_record {
    char secret[PT_SECRET_MAX + 1];
    uint32_t job_id;
} oob_job_record;

static pipert_result oob_allgather(const pipert_oob *oob, const void *send, void *recv,
                                   size_t bytes, const char *what)
{
    int rc = oob->allgather(oob->user, send, recv, bytes);
    if (rc != 0)
        return pt_fail(PIPERT_ERR_TRANSPORT, "the out-of-band allgather of %s failed (it returned %d)",
                       what, rc);
    return PIPERT_OK;
}

static pipert_result agree_on_job(pt_job *job, const pipert_oob *oob, oob_job_record *agreed)
{
    oob_job_record mine = {0};
    if (job->rank == 0) {
        PT_TRY(pt_secret_generate(mine.secret));
        mine.job_id = (uint32_t)strtoul((char[9]){mine.secret[0], mine.secret[1], mine.secret[2],
                                                  mine.secret[3], mine.secret[4], mine.secret[5],
                                                  mine.secret[6], mine.secret[7], 0},
                                        NULL, 16);
    }
    oob_job_record *all = calloc((size_t)job->world, sizeof *all);
    if (!all) return pt_fail(PIPERT_ERR_NOMEM, "out-of-band bootstrap: out of memory");
    pipert_result rc = oob_allgather(oob, &mine, all, sizeof mine, "the job's secret");
    if (rc == PIPERT_OK) *agreed = all[0];
    free(all);
    agreed->secret[PT_SECRET_MAX] = '\0';
    if (rc == PIPERT_OK && strlen(agreed->secret) < PT_SECRET_MIN)
        rc = pt_fail(PIPERT_ERR_PEER, "out-of-band bootstrap: rank 0 sent no job secret (do all "
                                      "ranks call pipert_session_create?)");
    return rc;
}

static pipert_result exchange_addresses(pt_job *job, const pipert_oob *oob)
{
    const char *mine = pt_transport_address(job->transport);
    if (strlen(mine) >= PT_ADDRESS_MAX)
        return pt_fail(PIPERT_ERR_INTERNAL, "transport address longer than %d", PT_ADDRESS_MAX);
    char *send = calloc(1, PT_ADDRESS_MAX), *all = calloc((size_t)job->world, PT_ADDRESS_MAX);
    pipert_result rc = send && all ? PIPERT_OK : pt_fail(PIPERT_ERR_NOMEM, "addresses: out of memory");
    if (rc == PIPERT_OK) {
        strcpy(send, mine);
        rc = oob_allgather(oob, send, all, PT_ADDRESS_MAX, "the transport addresses");
    }
    if (rc == PIPERT_OK) rc = alloc_addresses(job);
    for (int r = 0; rc == PIPERT_OK && r < job->world; r++) {
        char *address = all + (size_t)r * PT_ADDRESS_MAX;
        address[PT_ADDRESS_MAX - 1] = '\0';
        job->addresses[r] = strdup(address);
        if (!job->addresses[r]) rc = pt_fail(PIPERT_ERR_NOMEM, "addresses: out of memory");
    }
    free(send);
    free(all);
    return rc;
}

static pipert_result join_oob(pt_job *job, int stages, const pipert_oob *oob)
{
    if (!oob->allgather || oob->size < 1 || oob->rank < 0 || oob->rank >= oob->size)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "options.oob: rank %d of size %d%s", oob->rank,
                       oob->size, oob->allgather ? "" : " and no allgather");
    job->rank = oob->rank;
    job->world = oob->size;
    if (job->site < 0) {
        const char *site = getenv("PIPERT_SITE");
        job->site = site ? atoi(site) : 0;
    }
    PT_TRY(place(job, stages));
    pt_info("rank %d of %d (stage %d, replica %d), bootstrapped by the host program", job->rank,
            job->world, job->stage, job->replica);
    if (job->world == 1) return PIPERT_OK;
    oob_job_record agreed;
    PT_TRY(agree_on_job(job, oob, &agreed));
    PT_TRY(create_transport(job, agreed.secret, agreed.job_id));
    PT_TRY(exchange_addresses(job, oob));
    return connect_groups(job);
}

/* ---- joining and leaving ------------------------------------------------- */

/* Whether the environment names a launcher at all (its rank variable). */
static bool launched(const char *const *envp)
{
    static const char *const rank_variables[] = {"PIPERT_RANK", "OMPI_COMM_WORLD_RANK",
                                                 "SLURM_PROCID", "PMI_RANK"};
    for (size_t i = 0; i < sizeof rank_variables / sizeof rank_variables[0]; i++)
        if (pt_env_lookup(envp, rank_variables[i])) return true;
    return false;
}

pipert_result pt_job_join(pt_job *job, int stages, int site, const pipert_oob *oob,
                          const char *const *envp, bool alone)
{
    job->site = site;
    job->sites = 1;
    const bool replacement = job->joining && job->replacement_world > 0;
    if (job->joining && (oob || alone || !envp || (!launched(envp) && !replacement)))
        return pt_fail(PIPERT_ERR_INVALID_ARG, "rejoining a job (--join) needs a launcher's "
                                               "environment with a coordinator (pipert launch), "
                                               "or --rank and --world with PIPERT_COORD");
    if (oob) {
        job->mode = PT_JOB_OOB;
        return join_oob(job, stages, oob);
    }
    if (!alone && envp && (launched(envp) || replacement)) {
        job->mode = PT_JOB_LAUNCHER;
        return join_launched(job, stages, envp);
    }
    job->mode = PT_JOB_ALONE;
    if (job->site < 0) job->site = 0;
    job->rank = 0;
    job->world = 1;
    return place(job, stages);
}

/* Under SLURM, Open MPI and PMI rank 0 hosts the coordinator. When its replica left an
 * elastic job the other replicas go on, and need it still: it serves until they finish or the
 * job aborts (or this process is asked to stop). */
static void serve_the_others(pt_job *job)
{
    if (!job->coordinator || !job->elastic) return;
    pt_job_status status;
    pt_coordinator_status(job->coordinator, &status);
    if (status.phase != PT_JOB_RUNNING) return;
    pt_warn("this rank's replica is out of the job; it serves the job's coordinator until the "
            "other replicas finish");
    while (status.phase == PT_JOB_RUNNING && !asked_to_stop(job)) {
        pt_coordinator_wait(job->coordinator, 0.5);
        pt_coordinator_status(job->coordinator, &status);
    }
    pt_job_log_progress(job);
}

void pt_job_leave(pt_job *job)
{
    /* The transport goes first: it fails what is still pending, so nothing
     * writes into a buffer after its owner has freed it. */
    pt_coord_client_stop_join_callback(job->client);
    pt_transport_destroy(job->transport);
    job->transport = NULL;
    pt_group_destroy(job->replica_group);
    pt_group_destroy(job->stage_group);
    pt_group_destroy(job->site_group);
    pt_group_destroy(job->leaders_group);
    pt_group_destroy(job->world_group);
    job->replica_group = job->stage_group = job->site_group = job->leaders_group = NULL;
    for (int i = 0; i < job->n_retired; i++) pt_group_destroy(job->retired[i]);
    free(job->retired);
    job->retired = NULL;
    job->n_retired = 0;
    free(job->replica_sites);
    job->replica_sites = NULL;
    free(job->replica_left);
    job->replica_left = NULL;
    free(job->admitted);
    job->admitted = NULL;
    free((void *)job->room_made);
    job->room_made = NULL;
    job->world_group = NULL;
    pt_coord_client_close(job->client);
    job->client = NULL;
    serve_the_others(job);
    pt_coordinator_free(job->coordinator);
    job->coordinator = NULL;
    if (job->addresses)
        for (int r = 0; r < job->world; r++) free(job->addresses[r]);
    free(job->addresses);
    job->addresses = NULL;
}

/* ---- the control path ---------------------------------------------------- */

pipert_result pt_job_check(pt_job *job)
{
    if (!job->client) return PIPERT_OK;
    char dropped_why[96];
    const long dropped = pt_coord_client_dropped_lines(job->client, dropped_why, sizeof dropped_why);
    if (dropped > job->dropped_logged) {
        pt_warn("dropped %ld line%s on the coordinator's connection that it did not send (the "
                "last: %s)", dropped - job->dropped_logged,
                dropped - job->dropped_logged == 1 ? "" : "s", dropped_why);
        job->dropped_logged = dropped;
    }
    PT_TRY(pt_coord_client_check(job->client));
    char why[600];
    if (pt_coord_client_replica_left(job->client, job->replica, why, sizeof why))
        return pt_fail(PIPERT_ERR_PEER, "replica %d left the job (%s); the other replicas go on",
                       job->replica, why);
    return PIPERT_OK;
}

bool pt_job_aborted(pt_job *job)
{
    return job->client && (pt_coord_client_aborted(job->client) ||
                           pt_coord_client_replica_left(job->client, job->replica, NULL, 0));
}

/* ---- elastic replicas ------------------------------------------------------ */

void pt_job_membership(pt_job *job, pt_membership_news *news)
{
    *news = (pt_membership_news){0};
    if (job->client) pt_coord_client_membership(job->client, news);
}

static uint32_t next_sequence(const pt_group *g)
{
    return g ? pt_group_next_sequence(g) : 0;
}

pipert_result pt_job_acknowledge(pt_job *job, long epoch, long step)
{
    uint32_t sequence = next_sequence(job->replica_group);
    const uint32_t others[] = {next_sequence(job->site_group), next_sequence(job->leaders_group),
                               next_sequence(job->world_group), next_sequence(job->stage_group)};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (others[i] > sequence) sequence = others[i];
    return pt_coord_client_send_ack(job->client, epoch, step, sequence);
}

pipert_result pt_job_ready_to_join(pt_job *job)
{
    return pt_coord_client_send_ready(job->client);
}

pipert_result pt_job_joined(pt_job *job, long epoch)
{
    return pt_coord_client_send_joined(job->client, epoch);
}

bool pt_job_replica_in(pt_job *job, long epoch)
{
    return pt_coord_client_in_epoch(job->client, job->replica) >= epoch;
}

/* Groups that were replaced stay alive until the job ends: an abandoned
 * collective may still use its group until the transport closes. */
static pipert_result retire(pt_job *job, pt_group **g)
{
    if (!*g) return PIPERT_OK;
    pt_group **grown = realloc(job->retired, (size_t)(job->n_retired + 1) * sizeof *grown);
    if (!grown) return pt_fail(PIPERT_ERR_NOMEM, "groups: out of memory");
    job->retired = grown;
    job->retired[job->n_retired++] = *g;
    *g = NULL;
    return PIPERT_OK;
}

pipert_result pt_job_regroup(pt_job *job, long epoch, uint32_t first_sequence)
{
    job->groups_epoch = epoch;
    job->regrouped = true;
    const int R = job->layout.replicas;
    bool *left = job->replica_left;
    int live = 0;
    for (int r = 0; r < R; r++) {
        /* out as of this switch: it left, or it came back after (its own switch lets it in) */
        left[r] = pt_coord_client_replica_left(job->client, r, NULL, 0) ||
                  pt_coord_client_join_epoch(job->client, r) > epoch;
        live += !left[r];
    }
    pipert_result rc = retire(job, &job->replica_group);
    if (rc == PIPERT_OK) rc = retire(job, &job->site_group);
    if (rc == PIPERT_OK) rc = retire(job, &job->leaders_group);
    if (rc == PIPERT_OK) rc = retire(job, &job->world_group);
    if (rc == PIPERT_OK) rc = retire(job, &job->stage_group);
    if (rc == PIPERT_OK) rc = build_replica_groups(job, left, first_sequence);
    if (rc == PIPERT_OK) rc = make_world_group(job, left, first_sequence);
    /* Its members stay, but the ranks of a replica hear of a change steps apart: one may have
     * skipped (as regrouping) a checkpoint the other wrote, and given up on gathering its
     * outcomes there. Numbered afresh, that message is never taken for a later one. */
    if (rc == PIPERT_OK)
        rc = make_group(job, true, STAGE_GROUP_ID, first_sequence, &job->stage_group);
    if (rc == PIPERT_OK)
        pt_info("stage %d now couples %d replica%s (collectives from #%u)", job->stage, live,
                live == 1 ? "" : "s", first_sequence);
    return rc;
}

/* ---- replicas coming back ------------------------------------------------------ */

/* Whether `replica` has processes newer than those this rank connected to (or made room
 * for), that are in the groups of switch `epoch` (a later join has its own switch). */
static bool renewed(pt_job *job, int replica, long epoch)
{
    const long joined = pt_coord_client_join_epoch(job->client, replica);
    return replica != job->replica && !pt_coord_client_replica_left(job->client, replica, NULL, 0) &&
           joined > job->admitted[replica] && joined <= epoch;
}

pipert_result pt_job_switch_joiners(pt_job *job, long epoch, bool *joiners, bool *fresh)
{
    const long listed = pt_coord_client_switch_joiners(job->client, joiners);
    if (listed != epoch)
        return pt_fail(PIPERT_ERR_INTERNAL, "switch %ld came while this rank switched at %ld",
                       listed, epoch);
    for (int r = 0; r < job->layout.replicas; r++) {
        joiners[r] = joiners[r] && r != job->replica &&
                     !pt_coord_client_replica_left(job->client, r, NULL, 0);
        fresh[r] = renewed(job, r, epoch);
    }
    return PIPERT_OK;
}

/* The new process of `rank` at the address the coordinator gave. */
static pipert_result readdress(pt_job *job, int rank)
{
    char *address = pt_coord_client_peer_address(job->client, rank);
    if (!address) return pt_fail(PIPERT_ERR_NOMEM, "job: out of memory");
    free(job->addresses[rank]);
    job->addresses[rank] = address;
    /* Its old process left the job (the coordinator's word) but its connection may not have
     * failed yet: a site cut off is noticed by UCX only when its keepalive times out. */
    PT_TRY(pt_transport_drop_peer(job->transport, rank,
                                  "its replica left the job and a new process took its place"));
    return pt_transport_forget_peer(job->transport, rank);
}

/* A joiner counts as admitted only once connected: one that could not be (its site cut off)
 * is connected again at the next switch that lists it, and the others of the same switch are
 * connected all the same (the churn bed: two replicas back in one switch, the first one's
 * hello timed out, and the second, left unconnected but counted in, could never be given its
 * state). The first failure is the result. */
pipert_result pt_job_admit_joiners(pt_job *job, const bool *fresh)
{
    bool any = false;
    for (int r = 0; r < job->layout.replicas; r++)
        if (fresh[r]) {
            PT_TRY(readdress(job, pt_layout_rank(&job->layout, job->stage, r)));
            any = true;
        }
    if (!any) return PIPERT_OK;
    PT_TRY(pt_transport_listen_again(job->transport));
    job->listening = true;
    pipert_result first = PIPERT_OK;
    char why[512] = "";
    for (int r = 0; r < job->layout.replicas; r++) {
        if (!fresh[r]) continue;
        const int rank = pt_layout_rank(&job->layout, job->stage, r);
        const pipert_result rc = pt_transport_connect(job->transport, rank, job->addresses[rank]);
        if (rc == PIPERT_OK) {
            job->admitted[r] = pt_coord_client_join_epoch(job->client, r);
        } else if (first == PIPERT_OK) {
            first = rc;
            snprintf(why, sizeof why, "connecting to rank %d (replica %d, coming back): %s", rank,
                     r, pipert_last_error());
        }
    }
    return first == PIPERT_OK ? PIPERT_OK : pt_fail(first, "%s", why);
}

pipert_result pt_job_make_room(pt_job *job)
{
    for (int r = 0; r < job->layout.replicas; r++) {
        const long joined = pt_coord_client_join_epoch(job->client, r);
        if (r == job->replica || joined <= job->admitted[r]) continue;
        const int rank = pt_layout_rank(&job->layout, job->stage, r);
        if (atomic_load(&job->room_made[r]) < joined) {
            PT_TRY(readdress(job, rank)); /* the client's thread could not */
        } else { /* the new process may have connected since: only its address */
            char *address = pt_coord_client_peer_address(job->client, rank);
            if (!address) return pt_fail(PIPERT_ERR_NOMEM, "job: out of memory");
            free(job->addresses[rank]);
            job->addresses[rank] = address;
        }
        job->admitted[r] = joined;
    }
    return PIPERT_OK;
}

/* Replicas that come back in the same switch dial each other as survivors dial them: the
 * lower replica dials the higher (pt_job_make_room gave each its new address). */
static pipert_result dial_fellow_joiners(pt_job *job, const bool *joiners)
{
    for (int r = job->replica + 1; r < job->layout.replicas; r++) {
        const int rank = pt_layout_rank(&job->layout, job->stage, r);
        if (!joiners[r] || pt_transport_peer_alive(job->transport, rank)) continue;
        pipert_result rc = pt_transport_connect(job->transport, rank, job->addresses[rank]);
        if (rc != PIPERT_OK) {
            pt_error_prefix("connecting to rank %d (replica %d, coming back with this one)", rank,
                            r);
            return rc;
        }
    }
    return PIPERT_OK;
}

pipert_result pt_job_await_replicas(pt_job *job, long epoch, double timeout_s)
{
    const double until = pt_now_s() + timeout_s;
    const int R = job->layout.replicas;
    bool *joiners = calloc((size_t)job->world, sizeof *joiners);
    if (!joiners) return pt_fail(PIPERT_ERR_NOMEM, "job: out of memory");
    pipert_result rc = PIPERT_OK;
    if (pt_coord_client_switch_joiners(job->client, joiners) != epoch) rc = PIPERT_ERR_TIMEOUT;
    if (rc == PIPERT_OK) rc = pt_job_make_room(job);
    if (rc == PIPERT_OK) rc = dial_fellow_joiners(job, joiners);
    for (int r = 0; rc == PIPERT_OK && r < R; r++) {
        if (r == job->replica || pt_coord_client_replica_left(job->client, r, NULL, 0) ||
            pt_coord_client_join_epoch(job->client, r) > epoch)
            continue; /* out of this switch's groups */
        if (r > job->replica && joiners[r]) continue; /* dialled */
        const int rank = pt_layout_rank(&job->layout, job->stage, r);
        while ((rc = pt_transport_wait_peer(job->transport, rank, 0.1)) == PIPERT_ERR_TIMEOUT) {
            pt_membership_news news;
            pt_job_membership(job, &news);
            if (news.epoch > epoch) break; /* superseded: PIPERT_ERR_TIMEOUT */
            rc = pt_job_check(job);
            if (rc == PIPERT_OK && asked_to_stop(job))
                rc = pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while waiting for the replicas");
            if (rc == PIPERT_OK && pt_coord_client_replica_left(job->client, r, NULL, 0))
                rc = pt_fail(PIPERT_ERR_PEER, "replica %d (rank %d) left the job while this "
                                              "replica waited for it to connect", r, rank);
            if (rc != PIPERT_OK) break;
            if (pt_now_s() > until) {
                rc = pt_fail(PIPERT_ERR_TIMEOUT, "rank %d (replica %d) did not connect within "
                                                 "%.0f s", rank, r, timeout_s);
                pt_error_prefix("waiting for rank %d (replica %d) to connect", rank, r);
                break;
            }
        }
    }
    free(joiners);
    return rc;
}

pipert_result pt_job_take_sites(pt_job *job, const int *sites)
{
    memcpy(job->replica_sites, sites, (size_t)job->layout.replicas * sizeof *sites);
    return mark_remote_replicas(job, sites);
}

pipert_result pt_job_settle_joiners(pt_job *job)
{
    /* Every member passed pt_job_admit_joiners or pt_job_await_replicas: all are connected
     * both ways, and nobody dials any more. Every member of the switch waits here, joiners
     * or not, so that none waits for one that did not come. */
    if (job->replica_group) PT_TRY(pt_barrier(job->replica_group));
    job->joining = false;
    atomic_store(&job->makes_room, false);
    if (!job->listening) return PIPERT_OK;
    job->listening = false;
    return pt_transport_stop_listening(job->transport);
}

long pt_job_coordinator_reconnections(pt_job *job)
{
    return job->client ? pt_coord_client_reconnections(job->client) : 0;
}

bool pt_job_coordinator_lost(pt_job *job, char *why, size_t cap)
{
    return job->client && pt_coord_client_coordinator_lost(job->client, why, cap);
}

pipert_result pt_job_report_progress(pt_job *job, const pt_rank_progress *progress)
{
    return job->client ? pt_coord_client_send_progress(job->client, progress) : PIPERT_OK;
}

void pt_job_log_progress(pt_job *job)
{
    if (!job->coordinator) return;
    pt_job_status status;
    pt_coordinator_status(job->coordinator, &status);
    char line[256];
    pt_job_progress_line(&status, line, sizeof line);
    pt_info("job: %s", line);
}

pipert_result pt_job_leave_together(pt_job *job)
{
    /* A barrier along the stages, then one along the replicas, waits for every rank of the
     * grid: none closes its endpoints while another still talks to it (or still copies its
     * last payload from its memory: device payloads and direct reads). */
    if (job->stage_group) PT_TRY(pt_barrier(job->stage_group));
    if (job->replica_group) PT_TRY(pt_barrier(job->replica_group));
    return PIPERT_OK;
}

pipert_result pt_job_finish(pt_job *job)
{
    if (!job->client) return pt_job_leave_together(job); /* out of band */
    PT_TRY(pt_coord_client_send_done(job->client));
    if (!job->coordinator) return PIPERT_OK;
    pt_job_status status;
    do {
        pt_coordinator_wait(job->coordinator, 0.5);
        pt_coordinator_status(job->coordinator, &status);
    } while (status.phase != PT_JOB_FINISHED && status.phase != PT_JOB_ABORTED && !asked_to_stop(job));
    pt_job_log_progress(job);
    if (status.phase == PT_JOB_FINISHED) return PIPERT_OK;
    if (status.phase != PT_JOB_ABORTED)
        return pt_fail(PIPERT_ERR_INTERRUPTED, "stopped while the other ranks ran (this process "
                                               "hosts the coordinator)");
    return status.abort_rank >= 0 ? pt_fail(PIPERT_ERR_PEER, "job aborted: rank %d: %s",
                                            status.abort_rank, status.abort_reason)
                                  : pt_fail(PIPERT_ERR_PEER, "job aborted: %s", status.abort_reason);
}

void pt_job_report_failure(pt_job *job, const char *message)
{
    const bool aborted = pt_job_aborted(job);
    if (job->client && !aborted) pt_coord_client_send_error(job->client, message);
    /* Rank 0 hosting the coordinator gives the others a moment to hear it. */
    if (job->coordinator && !aborted) pt_coordinator_wait(job->coordinator, 1.0);
}
