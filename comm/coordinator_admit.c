/* A worker's way into the job, on the coordinator's side (coordinator_register.c is the
 * worker's): its hello, answered with a challenge and our proof of the job's secret; its
 * registration, checked (its proof, its fields, its build and settings against the job's) and
 * then taken as the first (the table goes out once every rank is in), as a joiner's
 * (coordinator_join.c) or as one again after a lost connection (coordinator_recover.c); and the
 * refusals, each naming what is wrong. Runs under the coordinator's lock. */
#include "comm/coordinator_internal.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/auth.h"
#include "comm/coordinator_protocol.h"
#include "runtime/log.h"

json_t *pt_coord_table_message(const pt_coordinator *c)
{
    json_t *peers = json_array();
    for (int r = 0; r < c->options.world; r++) {
        const rank_state *s = &c->ranks[r];
        json_array_append_new(peers, json_pack("{s:i, s:s, s:i, s:s}", "rank", r, "host", s->host,
                                               "pid", s->pid, "address",
                                               s->address ? s->address : ""));
    }
    return json_pack("{s:s, s:i, s:o}", "type", "table", "world", c->options.world, "peers", peers);
}

static void send_table(pt_coordinator *c)
{
    pt_coord_broadcast(c, pt_coord_table_message(c));
    c->phase = PT_JOB_RUNNING;
    pt_debug("coordinator: all %d ranks registered; the job runs", c->options.world);
    pthread_cond_broadcast(&c->changed);
}

void pt_coord_refuse(connection *conn, const char *reason, bool wrong_secret)
{
    pt_coord_send(conn, json_pack("{s:s, s:s, s:b}", "type", "refused", "reason", reason, "auth",
                                 wrong_secret));
    conn->close_when_sent = true;
}

void pt_coord_refuse_for_now(connection *conn, const char *reason)
{
    pt_coord_send(conn, json_pack("{s:s, s:s, s:b, s:b}", "type", "refused", "reason", reason,
                                 "auth", false, "retry", true));
    conn->close_when_sent = true;
}

/* Fields of a registration, checked; false with `why` filled when malformed. */
static bool read_registration(json_t *m, long *rank, long *world, long *pid, const char **host,
                              const char **address, char *why, size_t cap)
{
    *host = pt_coord_get_string(m, "host");
    *address = pt_coord_get_string(m, "address");
    if (!pt_coord_get_long(m, "rank", rank) || !pt_coord_get_long(m, "world", world) ||
        !pt_coord_get_long(m, "pid", pid) || !*host || !*address)
        snprintf(why, cap, "malformed registration (rank, world, pid, host, address expected)");
    else if (strlen(*host) >= PT_HOST_MAX) snprintf(why, cap, "host name too long");
    else if (strlen(*address) > PT_ADDRESS_MAX)
        snprintf(why, cap, "data-plane address longer than %d characters", PT_ADDRESS_MAX);
    else return true;
    return false;
}

/* The protocol version and job digest a registration carries (coordinator_protocol.h, "What must
 * match"); false when its digest is malformed. */
static bool read_identity(json_t *m, pt_job_identity *identity)
{
    long protocol = 0;
    *identity = (pt_job_identity){0};
    if (pt_coord_get_long(m, "protocol", &protocol) && protocol > 0 && protocol <= UINT32_MAX)
        identity->protocol = (uint32_t)protocol;
    const char *digest = pt_coord_get_string(m, "digest");
    return !json_object_get(m, "digest") || (digest && pt_job_digest_from_hex(digest, identity));
}

/* A registration of another build or other settings than the job's (the first rank's) is refused,
 * naming the rank and what differs; a rank the job needs to start aborts it, while one rejoining
 * an elastic job is refused alone. True when refused. */
static bool refuse_other_settings(pt_coordinator *c, connection *conn, long rank, bool joining,
                                  const pt_job_identity *theirs)
{
    if (!c->identity_known || (!pt_job_identity_has_digest(&c->identity) &&
                               theirs->protocol == c->identity.protocol)) {
        c->identity = *theirs;
        c->identity_known = true;
    }
    char mismatch[256], why[512];
    if (!pt_job_identity_mismatch(theirs, &c->identity, mismatch, sizeof mismatch)) return false;
    snprintf(why, sizeof why, "rank %ld%s is not of this job's build or settings (its vs the "
             "job's): %s", rank, joining ? " (rejoining)" : "", mismatch);
    pt_warn("coordinator: refused rank %ld from %s: %s", rank, conn->peer, why);
    pt_coord_send(conn, json_pack("{s:s, s:s, s:b, s:b}", "type", "refused", "reason", why, "auth",
                                 false, "settings", true));
    conn->close_when_sent = true;
    if (!joining && c->phase == PT_JOB_REGISTERING) pt_coord_abort_locked(c, -1, why);
    return true;
}

void pt_coord_hello(pt_coordinator *c, connection *conn, json_t *m)
{
    const char *nonce = pt_coord_get_string(m, "nonce");
    if (conn->challenged || !nonce ||
        !pt_auth_from_hex(nonce, conn->peer_nonce, PT_AUTH_NONCE_BYTES)) {
        pt_warn("coordinator: refused a connection from %s: %s", conn->peer,
                conn->challenged ? "a second hello" : "a hello without a nonce");
        pt_coord_refuse(conn, "malformed hello", false);
        return;
    }
    if (pt_auth_new_nonce(conn->nonce) != PIPERT_OK) {
        pt_coord_refuse(conn, "the coordinator cannot draw a nonce", false);
        return;
    }
    conn->challenged = true;
    uint8_t proof[PT_AUTH_PROOF_BYTES];
    pt_auth_prove(&c->key, &PT_COORD_PROVER, conn->peer_nonce, conn->nonce, proof);
    char nonce_hex[PT_AUTH_HEX_CAPACITY], proof_hex[PT_AUTH_HEX_CAPACITY];
    pt_auth_to_hex(conn->nonce, sizeof conn->nonce, nonce_hex);
    pt_auth_to_hex(proof, sizeof proof, proof_hex);
    pt_coord_send(conn, json_pack("{s:s, s:s, s:s}", "type", "challenge", "nonce", nonce_hex,
                                 "proof", proof_hex));
}

/* Whether a registration's proof answers our challenge, for the rank it claims. */
static bool worker_proved(const pt_coordinator *c, const connection *conn, json_t *m)
{
    const char *text = pt_coord_get_string(m, "proof");
    uint8_t proof[PT_AUTH_PROOF_BYTES];
    long rank;
    return conn->challenged && text && pt_coord_get_long(m, "rank", &rank) &&
           pt_auth_from_hex(text, proof, sizeof proof) &&
           pt_auth_verify(&c->key, &(pt_auth_party){PT_COORD_WORKER_ROLE, rank, -1},
                          conn->nonce, conn->peer_nonce, proof);
}

void pt_coord_register(pt_coordinator *c, connection *conn, json_t *m)
{
    if (!worker_proved(c, conn, m)) {
        pt_warn("coordinator: refused a connection from %s: %s", conn->peer,
                conn->challenged ? "its proof of the job's secret is wrong"
                                 : "it registered without a challenge (no hello)");
        pt_coord_refuse(conn, conn->challenged ? "wrong job secret" : "hello first", true);
        return;
    }
    long rank, world, pid;
    const char *host, *address;
    char why[1024];
    if (!read_registration(m, &rank, &world, &pid, &host, &address, why, sizeof why)) {
        pt_warn("coordinator: refused %s: %s", conn->peer, why);
        pt_coord_refuse(conn, why, false);
        return;
    }
    const int expected = c->options.world;
    if (world != expected || rank < 0 || rank >= expected) {
        snprintf(why, sizeof why, "rank %ld of %ld does not fit this job of %d ranks (from %s)",
                 rank, world, expected, conn->peer);
        pt_coord_refuse(conn, why, false);
        pt_coord_abort_locked(c, -1, why); /* a misconfigured job would wait for ranks forever */
        return;
    }
    const bool joining = json_is_true(json_object_get(m, "join"));
    pt_job_identity identity;
    if (!read_identity(m, &identity)) {
        snprintf(why, sizeof why, "rank %ld: a malformed job digest (%d hexadecimal digits "
                 "expected)", rank, PT_JOB_DIGEST_HEX - 1);
        pt_warn("coordinator: refused %s: %s", conn->peer, why);
        pt_coord_refuse(conn, why, false);
        return;
    }
    if (refuse_other_settings(c, conn, rank, joining, &identity)) return;
    json_t *view = json_object_get(m, "resume");
    if (view) {
        pt_coord_register_again(c, conn, (int)rank, (int)pid, host, address, json_incref(view));
        return;
    }
    if (c->recovery.on && !joining) {
        snprintf(why, sizeof why, "rank %ld registered as if the job were starting, but it runs "
                 "(this coordinator was started again to take it over)", rank);
        pt_warn("coordinator: refused %s: %s", conn->peer, why);
        pt_coord_refuse(conn, why, false);
        return;
    }
    if (joining) {
        pt_coord_admit_joiner(c, conn, (int)rank, (int)pid, host, address);
        return;
    }
    rank_state *s = &c->ranks[rank];
    if (s->registered) {
        snprintf(why, sizeof why, "rank %ld registered twice: from %s (pid %d) and %s (pid %ld)",
                 rank, s->host, s->pid, host, pid);
        pt_coord_refuse(conn, why, false);
        pt_coord_abort_locked(c, -1, why);
        return;
    }
    if (c->phase == PT_JOB_ABORTED) {
        snprintf(why, sizeof why, "the job was aborted: %s", c->abort_reason);
        pt_coord_refuse(conn, why, false);
        return;
    }
    char *copy = strdup(address);
    if (!copy) {
        pt_coord_refuse(conn, "coordinator out of memory", false);
        return;
    }
    *s = (rank_state){.registered = true, .pid = (int)pid, .address = copy, .conn = conn};
    snprintf(s->host, sizeof s->host, "%s", host);
    conn->rank = (int)rank;
    c->registered++;
    pt_debug("coordinator: rank %ld registered from %s (host %s, pid %ld)", rank, conn->peer, host,
             pid);
    pt_coord_welcome(c, conn);
    if (c->registered == expected) send_table(c);
}
