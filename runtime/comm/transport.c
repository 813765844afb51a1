/* The UCX data plane: see transport.h for the protocol.
 *
 * Threads. Only one thread at a time calls into UCX (ucp_*): the holder of
 * `ucx_lock`. That is the progress thread, which drains a command queue that
 * other threads fill and runs ucp_worker_progress() (UCX calls our callbacks
 * from there), except while it sleeps in epoll: then a user thread may take
 * the lock and post its send or receive itself (post_directly), or, blocked in
 * pt_request_wait, drive UCX for a bounded while (poll_while_waiting). Either
 * leaves the worker progressed and armed, as the sleeping progress thread
 * expects, and wakes it only if the worker cannot be armed. Polling is always
 * bounded (SPIN_US, WAIT_SPIN_US): an idle transport sleeps. Everything
 * UCX-facing (connections, the in-flight list, a request's UCX side) is
 * touched only under ucx_lock. Shared state that waiters read (request
 * completion, the peer table, connection outcomes) is guarded by one
 * process-wide mutex, `state_lock`, with one condition variable
 * `state_changed` that every waiter sleeps on; it is process-wide so that a
 * request outlives its transport. The command queue has its own lock.
 * Neither of those two is held while calling UCX or a user callback; user
 * callbacks do run under ucx_lock (which is why they must be short, and why
 * requests they post are queued rather than posted on the spot).
 *
 * Objects. A `connection` is one UCX endpoint and its handshake; connections
 * live in the transport's list until destroy. A `peer` is a rank: its state
 * and the connection we send on. A pt_request is one user send or receive;
 * while it has UCX operations in flight it sits in the transport's in-flight
 * list.
 *
 * Same-host direct reads. Endpoints use UCX peer error handling, and UCX 1.13
 * then refuses its shared-memory transports (sysv/posix: "no peer failure
 * handler"; cma as a rendezvous lane needs memory invalidation), so two
 * workers on one host would talk over TCP on loopback: two copies through the
 * kernel and about a fifth of what cma reaches. So large payloads between
 * processes of one host take the path UCX's cma transport would: the receiver
 * copies them straight out of the sender's memory with process_vm_readv (one
 * copy, by the kernel). The handshake proves it can: each hello carries the
 * sender's boot id, pid and the address and value of a random probe word; a
 * side that reads that word back from the peer's memory tells the peer
 * CONTROL_DIRECT_OK on the stream. From then on that peer sends payloads of
 * DIRECT_MIN_BYTES or more as a `direct_descriptor` (address, nbytes, ack id)
 * in place of the payload part, under the same tag; the receiver tells the two
 * apart by length (a real separate payload is longer than 4096 bytes), reads
 * into the caller's buffer, then answers with a `direct_ack` under kind 0
 * (never a user kind) and the ack id, and only that answer completes the send,
 * so the payload stays untouched until it was read. Control words, headers,
 * descriptors and acks all travel over the error-handled UCX endpoint, so
 * failures are detected as before; a read from a peer that has failed or left
 * is refused rather than attempted (its memory may already be reused). Direct
 * reads stand in for UCX's cma, so they are used only where UCX_TLS allows
 * cma (unset, all, sm, shm, cma, or a ^list excluding none of those); with
 * UCX_TLS=tcp everything goes through UCX.
 */
#include "runtime/comm/transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "runtime/comm/bootstrap.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/safetensors.h"

#define TEXT_CAPACITY 256
#define REASON_CAPACITY 160  /* why a peer is gone */
#define MESSAGE_CAPACITY 512 /* a request's failure */
#define ADDRESS_CAPACITY 64
#define HELLO_MAGIC 0x4c485450u /* "PTHL" */
#define HELLO_VERSION 2u
#define CONTROL_BYE 0x45594221u
#define CONTROL_BYE_ACK 0x4b434121u
#define CONTROL_DIRECT_OK 0x4b4f5244u /* "I can read your memory" */
#define DIRECT_MAGIC 0x44525450u      /* "PTRD": a direct_descriptor */
#define DIRECT_ACK_MAGIC 0x41525450u  /* "PTRA": a direct_ack */
/* Payloads of at least this many bytes go by direct read where the peer can (see above). */
#define DIRECT_MIN_BYTES (64u << 10)
/* The kind of transport-internal tagged messages (user kinds are 1..255). */
#define KIND_INTERNAL 0u
/* Shutdown waits at most this long for goodbyes, and again for endpoints to close. */
#define SHUTDOWN_STEP_S 2.0
/* An idle progress thread still wakes this often (UCX keepalive, handshake deadlines). */
#define IDLE_WAKE_MS 1000
/* Bounded polling, so that a protocol step or an answer that comes soon costs no wake-up.
 * The progress thread, while requests are in flight, polls UCX this long after the last thing
 * that happened before it arms the worker and sleeps; with nothing in flight it sleeps at once.
 * So a transport with nothing happening polls at most SPIN_US per IDLE_WAKE_MS (a receive that
 * waits long: 0.005% of a core), never continuously. */
#define SPIN_US 50
/* A thread blocked in pt_request_wait drives UCX itself (if the progress thread sleeps) for at
 * most this long per call before it sleeps on the condition variable: an answer within that time
 * (a round trip on one host takes ~20 us) wakes neither the progress thread nor the waiter. */
#define WAIT_SPIN_US 100

/* ---- checksum ------------------------------------------------------------ */

static const uint64_t prime1 = 0x9E3779B185EBCA87ull, prime2 = 0xC2B2AE3D27D4EB4Full,
                      prime3 = 0x165667B19E3779F9ull, prime4 = 0x85EBCA77C2B2AE63ull,
                      prime5 = 0x27D4EB2F165667C5ull;

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t lane_round(uint64_t acc, uint64_t input)
{
    return rotl64(acc + input * prime2, 31) * prime1;
}

uint64_t pt_checksum64(const void *data, size_t nbytes)
{
    const unsigned char *p = data, *end = p + nbytes;
    uint64_t h;
    if (nbytes >= 32) {
        uint64_t v[4] = {prime1 + prime2, prime2, 0, -prime1};
        for (; end - p >= 32; p += 32)
            for (int lane = 0; lane < 4; lane++)
                v[lane] = lane_round(v[lane], read64(p + 8 * lane));
        h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
        for (int lane = 0; lane < 4; lane++) h = (h ^ lane_round(0, v[lane])) * prime1 + prime4;
    } else {
        h = prime5;
    }
    h += (uint64_t)nbytes;
    for (; end - p >= 8; p += 8) h = rotl64(h ^ lane_round(0, read64(p)), 27) * prime1 + prime4;
    for (; p < end; p++) h = rotl64(h ^ (*p * prime5), 11) * prime1;
    h ^= h >> 33;
    h *= prime2;
    h ^= h >> 29;
    h *= prime3;
    h ^= h >> 32;
    return h ? h : 1; /* 0 means "no checksum" in a header */
}

/* ---- types --------------------------------------------------------------- */

typedef enum peer_state { PEER_UNKNOWN, PEER_ALIVE, PEER_DEAD, PEER_LEFT } peer_state;

typedef struct connection connection;

typedef struct peer {
    peer_state state;
    connection *conn; /* the endpoint we send on while ALIVE */
    pid_t read_pid;   /* > 0: its memory is readable from here (direct reads), at this pid */
    int reads_us;     /* it said it can read ours: send it descriptors in place of payloads */
    char address[ADDRESS_CAPACITY];
    char reason[REASON_CAPACITY]; /* why it is DEAD or LEFT */
} peer;

/* The first message each way on an endpoint (stream API, fixed size). */
typedef struct hello {
    uint32_t magic, version, job;
    int32_t rank;
    uint32_t secret_length;
    uint8_t secret[PT_TRANSPORT_SECRET_MAX];
    /* For same-host direct reads: who we are, and a word the peer may try to read back. */
    int32_t pid;
    uint32_t reserved;
    uint64_t probe_address, probe_word;
    uint8_t boot_id[16];
} hello;

/* Sent in place of a payload to a peer that reads it from our memory. */
typedef struct direct_descriptor {
    uint32_t magic, ack_id;
    uint64_t address, nbytes;
} direct_descriptor;

/* The receiver's answer to a descriptor; it completes the send. */
enum { ACK_READ = 0, ACK_REFUSED = 1, ACK_FAILED = 2 };
typedef struct direct_ack {
    uint32_t magic, ack_id;
    int32_t status; /* ACK_*: read; refused (its header was refused, nothing read); read failed */
    uint32_t reserved;
} direct_ack;

typedef enum conn_state {
    CONN_HANDSHAKE, /* hellos not yet exchanged */
    CONN_READY,     /* authenticated; the peer's rank is known */
    CONN_FAILED,    /* refused, timed out or errored: to be closed */
    CONN_CLOSING,   /* ucp_ep_close_nbx in flight */
    CONN_CLOSED
} conn_state;

struct connection {
    pt_transport *t;
    ucp_ep_h ep;
    int accepted; /* created from a connection request on our listener */
    int rank;     /* expected (we connected) or claimed in its hello (accepted); -1 unknown */
    char address[ADDRESS_CAPACITY];
    conn_state state;
    double deadline; /* of the handshake */
    hello hello_out, hello_in;
    struct sockaddr_storage target; /* where we connect (not accepted) */
    socklen_t target_length;
    uint32_t control_in;
    int peer_left;  /* it said goodbye on this endpoint */
    int ops;        /* UCX operations in flight with this connection as user data */
    int hello_sent; /* our hello left (its send completed) */
    int bye_sent, bye_acked;
    /* Outcome of the handshake, for a pt_transport_connect() caller; under state_lock. */
    int finished, waiter;
    pipert_result result;
    char message[TEXT_CAPACITY];
    connection *next;
};

/* What runs when a receive part (or a direct send's answer) completes. */
typedef void (*arrival_fn)(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info);

typedef enum request_type { REQUEST_SEND, REQUEST_RECV, REQUEST_DISCARD } request_type;
typedef enum request_state { REQUEST_PENDING, REQUEST_COMPLETING, REQUEST_DONE } request_state;

struct pt_request {
    pt_transport *t; /* NULL once the transport is destroyed */
    request_type type;
    int peer;
    uint32_t user_tag;
    uint16_t kind;
    /* Completion, under state_lock. result and message are written by the
     * progress thread before state leaves PENDING and are constant after. */
    request_state state;
    pipert_result result;
    char message[MESSAGE_CAPACITY];
    pt_request_callback callback;
    void *callback_arg;
    int free_requested; /* pt_request_free() called from the request's own callback */
    /* UCX side, under ucx_lock. */
    pt_message_header header; /* send: as sent; receive: as received */
    ucp_dt_iov_t iov[2];
    ucp_tag_recv_info_t info;
    const void *payload; /* send */
    void *buffer;        /* receive */
    size_t capacity;
    pt_recv_expect expect;
    void *op;    /* receive: the UCX operation in flight; direct send: the ack's receive */
    int part;    /* receive: which part `op` is (PART_HEADER or PART_PAYLOAD) */
    arrival_fn arrived; /* runs when `op` ends */
    int posting; /* inside ucp_tag_recv_nbx for `op` (its callback may run there) */
    int completed_in_post;
    ucs_status_t completed_status;
    /* Direct reads. Send: the descriptor sent and the ack received. Receive: the descriptor
     * received. Discard: room for a descriptor to refuse. */
    direct_descriptor descriptor;
    direct_ack ack;
    int ops_pending; /* send: header and payload parts (and a direct send's ack) in flight */
    int failed;      /* a failure was recorded in result/message */
    pipert_result cancel_result;
    char cancel_reason[TEXT_CAPACITY];
    int in_flight;
    pt_request *prev, *next; /* the transport's in-flight list (under ucx_lock) */
};

typedef enum command_op { COMMAND_POST, COMMAND_CANCEL, COMMAND_CONNECT } command_op;

typedef struct command {
    command_op op;
    pt_request *request;
    connection *conn;
    struct command *next;
} command;

struct pt_transport {
    int rank;
    uint32_t job;
    char secret[PT_TRANSPORT_SECRET_MAX];
    size_t secret_length;
    double connect_timeout_s;
    char listen_address[ADDRESS_CAPACITY + 8];

    /* Same-host direct reads: whether UCX_TLS allows them, what our hellos offer, and the id of
     * the next descriptor (under ucx_lock). */
    int direct_allowed;
    uint64_t probe_word;
    uint8_t boot_id[16];
    uint32_t next_ack_id;

    ucp_context_h context;
    ucp_worker_h worker;
    ucp_listener_h listener;
    int worker_fd, wake_fd, epoll_fd;
    pthread_t thread;
    /* 1 while the progress thread sleeps (or is about to) in epoll: only then does a queued
     * command need a write to wake_fd. */
    atomic_int in_epoll;
    int pollers; /* threads in pt_request_wait driving UCX (under state_lock): release waits */

    /* Under state_lock. */
    peer *peers;
    int peer_capacity;

    /* Held by whoever calls into UCX: the progress thread, except while it
     * sleeps in epoll, or a user thread posting directly (see submit()). */
    pthread_mutex_t ucx_lock;

    /* Under queue_lock. */
    pthread_mutex_t queue_lock;
    command *queue_head, *queue_tail;
    int stopping;

    /* Under ucx_lock. */
    connection *connections;
    pt_request *in_flight;
};

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set while this thread holds a transport's ucx_lock: callbacks run then,
 * and a wait there would wait for ourselves. */
static _Thread_local int holding_ucx_lock;
static pthread_cond_t state_changed = PTHREAD_COND_INITIALIZER;

/* ---- small helpers ------------------------------------------------------- */

static void format_sockaddr(const struct sockaddr_storage *sa, char *out, size_t capacity)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(out, capacity, "%s:%d", host, port);
    } else if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        snprintf(out, capacity, "[%s]:%d", host, port);
    } else {
        snprintf(out, capacity, "(unknown address family %d)", sa->ss_family);
    }
}

/* Splits "host:port" or "[v6host]:port" and resolves it. */
static pipert_result resolve_address(const char *address, int passive, struct sockaddr_storage *out,
                                     socklen_t *out_length)
{
    char host[256];
    const char *colon = strrchr(address, ':');
    if (!colon || colon == address || !colon[1])
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport address \"%s\": expected host:port",
                       address);
    size_t host_length = (size_t)(colon - address);
    const char *host_start = address;
    if (address[0] == '[' && colon[-1] == ']') {
        host_start++;
        host_length -= 2;
    }
    if (host_length >= sizeof host)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport address \"%s\": host too long", address);
    memcpy(host, host_start, host_length);
    host[host_length] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *found = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &found);
    if (rc != 0)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport address \"%s\": %s", address,
                       gai_strerror(rc));
    memcpy(out, found->ai_addr, found->ai_addrlen);
    *out_length = found->ai_addrlen;
    freeaddrinfo(found);
    return PIPERT_OK;
}

/* This host's first non-loopback IPv4 address (what peers elsewhere can reach
 * when we listen on every interface), or 127.0.0.1. */
static void first_external_ipv4(char *out, size_t capacity)
{
    snprintf(out, capacity, "127.0.0.1");
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return;
    for (struct ifaddrs *it = list; it; it = it->ifa_next) {
        if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
        if (!(it->ifa_flags & IFF_UP) || (it->ifa_flags & IFF_LOOPBACK)) continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, out,
                  (socklen_t)capacity);
        break;
    }
    freeifaddrs(list);
}

/* The secret in a hello against ours (in constant time: pt_secret_equal). */
static int hello_secret_matches(const pt_transport *t, const hello *h)
{
    if (h->secret_length > PT_TRANSPORT_SECRET_MAX) return 0;
    char theirs[PT_TRANSPORT_SECRET_MAX + 1], ours[PT_TRANSPORT_SECRET_MAX + 1];
    memcpy(theirs, h->secret, h->secret_length);
    theirs[h->secret_length] = '\0';
    memcpy(ours, t->secret, t->secret_length);
    ours[t->secret_length] = '\0';
    /* A NUL inside their secret shortens it: it then differs in length. */
    return pt_secret_equal(theirs, ours) && strlen(theirs) == h->secret_length;
}

static void format_shape(char *out, size_t capacity, int32_t ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(out, capacity, "[");
    for (int32_t d = 0; d < ndim && d < PT_MESSAGE_MAX_DIMS && used < capacity; d++)
        used += (size_t)snprintf(out + used, capacity - used, d ? ", %lld" : "%lld",
                                 (long long)shape[d]);
    if (used < capacity) snprintf(out + used, capacity - used, "]");
}

/* kind (8) | source rank (23) | part (1) | user tag (32) */
enum { PART_HEADER = 0, PART_PAYLOAD = 1 };

static ucp_tag_t make_tag(unsigned kind, int src_rank, int part, uint32_t user_tag)
{
    return ((ucp_tag_t)(kind & 0xff) << 56) | ((ucp_tag_t)((unsigned)src_rank & 0x7fffff) << 33) |
           ((ucp_tag_t)part << 32) | user_tag;
}

static void ucx_lock_acquire(pt_transport *t)
{
    pthread_mutex_lock(&t->ucx_lock);
    holding_ucx_lock = 1;
}

static int ucx_lock_try(pt_transport *t)
{
    if (holding_ucx_lock || pthread_mutex_trylock(&t->ucx_lock) != 0) return 0;
    holding_ucx_lock = 1;
    return 1;
}

static void ucx_lock_release(pt_transport *t)
{
    holding_ucx_lock = 0;
    pthread_mutex_unlock(&t->ucx_lock);
}

static void wake_progress_thread(pt_transport *t)
{
    uint64_t one = 1;
    ssize_t written = write(t->wake_fd, &one, sizeof one);
    (void)written; /* EAGAIN means the counter is already non-zero: the thread will wake */
}

/* After queueing a command: a progress thread that is awake finds it before it sleeps (it sets
 * in_epoll, then looks at the queue). */
static void wake_progress_thread_if_asleep(pt_transport *t)
{
    if (atomic_load(&t->in_epoll)) wake_progress_thread(t);
}

/* ---- peers (under state_lock) -------------------------------------------- */

static peer *peer_slot_locked(pt_transport *t, int rank)
{
    if (rank < 0 || rank >= PT_TRANSPORT_MAX_RANKS) return NULL;
    if (rank >= t->peer_capacity) {
        int capacity = t->peer_capacity ? t->peer_capacity : 16;
        while (capacity <= rank) capacity *= 2;
        peer *grown = realloc(t->peers, (size_t)capacity * sizeof *grown);
        if (!grown) return NULL;
        memset(grown + t->peer_capacity, 0, (size_t)(capacity - t->peer_capacity) * sizeof *grown);
        t->peers = grown;
        t->peer_capacity = capacity;
    }
    return &t->peers[rank];
}

static peer_state peer_state_locked(const pt_transport *t, int rank)
{
    return rank >= 0 && rank < t->peer_capacity ? t->peers[rank].state : PEER_UNKNOWN;
}

/* ---- request completion -------------------------------------------------- */

static void record_failure(pt_request *r, pipert_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Keeps the first failure of a request (a later one is a consequence). */
static void record_failure(pt_request *r, pipert_result code, const char *fmt, ...)
{
    if (r->failed) return;
    r->failed = 1;
    r->result = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof r->message, fmt, ap);
    va_end(ap);
}

static void in_flight_remove(pt_transport *t, pt_request *r)
{
    if (!r->in_flight) return;
    if (r->prev)
        r->prev->next = r->next;
    else
        t->in_flight = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->in_flight = 0;
}

static void in_flight_add(pt_transport *t, pt_request *r)
{
    r->prev = NULL;
    r->next = t->in_flight;
    if (t->in_flight) t->in_flight->prev = r;
    t->in_flight = r;
    r->in_flight = 1;
}

/* The last touch of a request by the transport: publishes the result, runs
 * the callback, then wakes waiters (so a callback has run before wait returns). */
static void complete_request(pt_request *r)
{
    if (r->t) in_flight_remove(r->t, r);
    if (!r->failed) r->result = PIPERT_OK;
    if (r->type == REQUEST_DISCARD) {
        free(r);
        return;
    }
    pthread_mutex_lock(&state_lock);
    r->state = REQUEST_COMPLETING;
    pt_request_callback callback = r->callback;
    void *arg = r->callback_arg;
    pthread_mutex_unlock(&state_lock);
    if (callback) callback(r, r->result, arg);
    pthread_mutex_lock(&state_lock);
    int free_now = r->free_requested;
    r->state = REQUEST_DONE;
    pthread_cond_broadcast(&state_changed);
    pthread_mutex_unlock(&state_lock);
    if (free_now) free(r);
}

static void fail_request(pt_request *r, pipert_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail_request(pt_request *r, pipert_result code, const char *fmt, ...)
{
    if (!r->failed) {
        r->failed = 1;
        r->result = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->message, sizeof r->message, fmt, ap);
        va_end(ap);
    }
    complete_request(r);
}

static const char *request_verb(const pt_request *r)
{
    return r->type == REQUEST_SEND ? "send to" : "receive from";
}

/* "receive from rank 3 (kind 1, tag 7)" */
static void describe_request(const pt_request *r, char *out, size_t capacity)
{
    snprintf(out, capacity, "%s rank %d (kind %u, tag %u)", request_verb(r), r->peer, r->kind,
             r->user_tag);
}

/* ---- command queue ------------------------------------------------------- */

static pipert_result enqueue(pt_transport *t, command_op op, pt_request *request, connection *conn)
{
    command *c = malloc(sizeof *c);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a command");
    *c = (command){.op = op, .request = request, .conn = conn};
    pthread_mutex_lock(&t->queue_lock);
    if (t->stopping) {
        pthread_mutex_unlock(&t->queue_lock);
        free(c);
        return pt_fail(PIPERT_ERR_INTERRUPTED, "transport of rank %d is shutting down", t->rank);
    }
    if (t->queue_tail)
        t->queue_tail->next = c;
    else
        t->queue_head = c;
    t->queue_tail = c;
    pthread_mutex_unlock(&t->queue_lock);
    wake_progress_thread_if_asleep(t);
    return PIPERT_OK;
}

static int commands_queued(pt_transport *t)
{
    pthread_mutex_lock(&t->queue_lock);
    int queued = t->queue_head != NULL;
    pthread_mutex_unlock(&t->queue_lock);
    return queued;
}

static command *take_commands(pt_transport *t)
{
    pthread_mutex_lock(&t->queue_lock);
    command *list = t->queue_head;
    t->queue_head = t->queue_tail = NULL;
    pthread_mutex_unlock(&t->queue_lock);
    return list;
}

/* ---- connections --------------------------------------------------------- */

static void connection_finish(connection *c, pipert_result result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Publishes the handshake's outcome to a pt_transport_connect() caller. */
static void connection_finish(connection *c, pipert_result result, const char *fmt, ...)
{
    pthread_mutex_lock(&state_lock);
    if (!c->finished) {
        c->finished = 1;
        c->result = result;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->message, sizeof c->message, fmt, ap);
        va_end(ap);
        pthread_cond_broadcast(&state_changed);
    }
    pthread_mutex_unlock(&state_lock);
}

static void cancel_receives_from(pt_transport *t, int rank, pipert_result code, const char *reason);

/* Marks a rank dead (or gone) and fails what waits on it. */
static void peer_fail(pt_transport *t, int rank, int departed, const char *reason)
{
    pthread_mutex_lock(&state_lock);
    peer *p = peer_slot_locked(t, rank);
    int changed = p && (p->state == PEER_ALIVE || p->state == PEER_UNKNOWN);
    if (changed) {
        p->state = departed ? PEER_LEFT : PEER_DEAD;
        p->conn = NULL;
        snprintf(p->reason, sizeof p->reason, "%s", reason);
        pthread_cond_broadcast(&state_changed);
    }
    char address[ADDRESS_CAPACITY] = "";
    if (p) snprintf(address, sizeof address, "%s", p->address);
    pthread_mutex_unlock(&state_lock);
    if (!changed) return;
    if (departed)
        pt_debug("transport: rank %d (%s) left", rank, address);
    else
        pt_warn("transport: rank %d (%s) failed: %s", rank, address, reason);
    char text[TEXT_CAPACITY];
    snprintf(text, sizeof text, "rank %d %s: %s", rank, departed ? "has left" : "failed", reason);
    cancel_receives_from(t, rank, PIPERT_ERR_PEER, text);
}

static void connection_mark_failed(connection *c)
{
    if (c->state == CONN_HANDSHAKE || c->state == CONN_READY) c->state = CONN_FAILED;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    connection *c = arg;
    pt_transport *t = c->t;
    conn_state before = c->state;
    connection_mark_failed(c);
    if (before == CONN_HANDSHAKE) {
        if (c->hello_sent && !c->accepted)
            connection_finish(c, PIPERT_ERR_AUTH,
                              "rank %d at %s closed the connection during the hello (%s): "
                              "does it have the same job secret and id?",
                              c->rank, c->address, ucs_status_string(status));
        else
            connection_finish(c, PIPERT_ERR_TRANSPORT, "connection to %s failed: %s", c->address,
                              ucs_status_string(status));
    } else if (before == CONN_READY) {
        /* Once either side said goodbye on this endpoint, its end is no failure. */
        int leaving = c->bye_sent || c->peer_left;
        char reason[TEXT_CAPACITY];
        snprintf(reason, sizeof reason,
                 leaving ? "its endpoint closed during shutdown (%s)" : "endpoint error: %s",
                 ucs_status_string(status));
        peer_fail(t, c->rank, leaving, reason);
    }
}

static void on_close_done(void *request, ucs_status_t status, void *user_data)
{
    connection *c = user_data;
    c->ops--;
    c->state = CONN_CLOSED;
    ucp_request_free(request);
}

/* Always forced: see shut_down() for why a graceful close is not used. */
static void connection_close(connection *c)
{
    if (c->state == CONN_CLOSING || c->state == CONN_CLOSED) return;
    if (!c->ep) { /* never had one (ucp_ep_create failed) */
        c->state = CONN_CLOSED;
        return;
    }
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = on_close_done,
        .user_data = c,
    };
    /* Counted before the call: the callback may run inside it. */
    c->ops++;
    c->state = CONN_CLOSING;
    ucs_status_ptr_t op = ucp_ep_close_nbx(c->ep, &param);
    c->ep = NULL;
    if (op == NULL || UCS_PTR_IS_ERR(op)) {
        if (UCS_PTR_IS_ERR(op))
            pt_debug("transport: closing the endpoint to %s: %s", c->address,
                     ucs_status_string(UCS_PTR_STATUS(op)));
        c->ops--;
        c->state = CONN_CLOSED;
    }
}

static void connection_refuse(connection *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Refuses a peer's hello: logs, fails the handshake and closes the endpoint. */
static void connection_refuse(connection *c, const char *fmt, ...)
{
    char reason[TEXT_CAPACITY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    pt_warn("transport: refused the connection %s %s: %s", c->accepted ? "from" : "to", c->address,
            reason);
    connection_finish(c, PIPERT_ERR_AUTH, "refused the connection %s %s: %s",
                      c->accepted ? "from" : "to", c->address, reason);
    c->state = CONN_FAILED;
    connection_close(c);
}

/* Posts a stream operation whose completion calls done(c, status); handles
 * immediate completion and failure to start the same way. */
typedef void (*stream_done_fn)(connection *c, ucs_status_t status);

typedef struct stream_op_context {
    connection *c;
    stream_done_fn done;
} stream_op_context;

static void on_stream_send_done(void *request, ucs_status_t status, void *user_data);
static void on_stream_recv_done(void *request, ucs_status_t status, size_t length, void *user_data);

static void stream_post(connection *c, int is_send, void *buffer, size_t bytes, stream_done_fn done)
{
    stream_op_context *context = malloc(sizeof *context);
    if (!context) {
        done(c, UCS_ERR_NO_MEMORY);
        return;
    }
    *context = (stream_op_context){c, done};
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .user_data = context,
    };
    ucs_status_ptr_t op;
    size_t received = 0;
    c->ops++; /* before the call: the callback may run inside it */
    if (is_send) {
        param.cb.send = on_stream_send_done;
        op = ucp_stream_send_nbx(c->ep, buffer, bytes, &param);
    } else {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_STREAM_RECV_FLAG_WAITALL;
        param.cb.recv_stream = on_stream_recv_done;
        op = ucp_stream_recv_nbx(c->ep, buffer, bytes, &received, &param);
    }
    if (op == NULL || UCS_PTR_IS_ERR(op)) {
        free(context);
        c->ops--;
        done(c, op ? UCS_PTR_STATUS(op) : UCS_OK);
    }
}

static void stream_op_finished(void *request, ucs_status_t status, void *user_data)
{
    stream_op_context *context = user_data;
    connection *c = context->c;
    stream_done_fn done = context->done;
    free(context);
    ucp_request_free(request);
    c->ops--;
    done(c, status);
}

static void on_stream_send_done(void *request, ucs_status_t status, void *user_data)
{
    stream_op_finished(request, status, user_data);
}

static void on_stream_recv_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    stream_op_finished(request, status, user_data);
}

static void on_control_received(connection *c, ucs_status_t status);

static void post_control_receive(connection *c)
{
    if (c->ep) stream_post(c, 0, &c->control_in, sizeof c->control_in, on_control_received);
}

static void on_control_sent(connection *c, ucs_status_t status) { (void)c, (void)status; }

static void send_control(connection *c, uint32_t word)
{
    static const uint32_t bye = CONTROL_BYE, bye_ack = CONTROL_BYE_ACK,
                          direct_ok = CONTROL_DIRECT_OK;
    const uint32_t *stored = word == CONTROL_BYE       ? &bye
                             : word == CONTROL_BYE_ACK ? &bye_ack
                                                       : &direct_ok;
    if (c->ep) stream_post(c, 1, (void *)stored, sizeof word, on_control_sent);
}

/* The peer can read our memory: large payloads to it go as descriptors from now on. */
static void peer_reads_us(connection *c)
{
    if (!c->t->direct_allowed) return; /* UCX_TLS keeps us off cma: we send through UCX */
    pthread_mutex_lock(&state_lock);
    peer *p = peer_slot_locked(c->t, c->rank);
    if (p) p->reads_us = 1;
    pthread_mutex_unlock(&state_lock);
    pt_debug("transport: rank %d reads payloads of %u bytes or more from our memory", c->rank,
             DIRECT_MIN_BYTES);
}

static void on_control_received(connection *c, ucs_status_t status)
{
    if (status != UCS_OK) return; /* the endpoint closed; its error callback reports why */
    if (c->control_in == CONTROL_BYE) {
        c->peer_left = 1;
        peer_fail(c->t, c->rank, 1, "it shut its transport down");
        send_control(c, CONTROL_BYE_ACK);
    } else if (c->control_in == CONTROL_BYE_ACK) {
        c->bye_acked = 1;
    } else if (c->control_in == CONTROL_DIRECT_OK) {
        peer_reads_us(c);
    } else {
        pt_warn("transport: rank %d (%s) sent an unknown control word 0x%08x", c->rank, c->address,
                c->control_in);
    }
    post_control_receive(c);
}

/* The peer is authenticated: it becomes ALIVE and this connection its sending endpoint. */
static int connection_register(connection *c)
{
    pt_transport *t = c->t;
    pthread_mutex_lock(&state_lock);
    peer *p = peer_slot_locked(t, c->rank);
    peer_state before = p ? p->state : PEER_DEAD;
    if (p && (before == PEER_UNKNOWN || before == PEER_ALIVE)) {
        p->state = PEER_ALIVE;
        if (!p->conn) p->conn = c;
        snprintf(p->address, sizeof p->address, "%s", c->address);
        pthread_cond_broadcast(&state_changed);
    }
    pthread_mutex_unlock(&state_lock);
    if (!p) {
        connection_refuse(c, "no memory for rank %d", c->rank);
        return 0;
    }
    if (before == PEER_DEAD || before == PEER_LEFT) {
        connection_refuse(c, "rank %d already failed or left; it cannot come back", c->rank);
        return 0;
    }
    c->state = CONN_READY;
    post_control_receive(c);
    return 1;
}

static void fill_hello(const pt_transport *t, hello *h)
{
    memset(h, 0, sizeof *h);
    h->magic = HELLO_MAGIC;
    h->version = HELLO_VERSION;
    h->job = t->job;
    h->rank = t->rank;
    h->secret_length = (uint32_t)t->secret_length;
    memcpy(h->secret, t->secret, t->secret_length);
    h->pid = (int32_t)getpid();
    h->probe_address = (uint64_t)(uintptr_t)&t->probe_word;
    h->probe_word = t->probe_word;
    memcpy(h->boot_id, t->boot_id, sizeof h->boot_id);
}

/* Copies nbytes at `address` in process `pid` into `into`, by the kernel in one copy
 * (process_vm_readv, as UCX's cma transport does). Returns 0 or an errno. */
static int read_remote(pid_t pid, void *into, uint64_t address, uint64_t nbytes)
{
    uint64_t done = 0;
    while (done < nbytes) {
        struct iovec local = {(char *)into + done, (size_t)(nbytes - done)},
                     remote = {(void *)(uintptr_t)(address + done), (size_t)(nbytes - done)};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EFAULT;
        done += (uint64_t)got;
    }
    return 0;
}

/* Whether we can read the memory of the peer that sent hello `h`: same kernel (boot id), and
 * its probe word reads back (same pid namespace, and ptrace rules let us). */
static int can_read_peer(const pt_transport *t, const hello *h)
{
    if (!t->direct_allowed || h->pid <= 0 || memcmp(h->boot_id, t->boot_id, sizeof h->boot_id))
        return 0;
    uint64_t seen = 0;
    return read_remote((pid_t)h->pid, &seen, h->probe_address, sizeof seen) == 0 &&
           seen == h->probe_word;
}

/* After the handshake: if we can read the peer's memory, it may send us descriptors. */
static void offer_direct_reads(connection *c, const hello *h)
{
    if (!can_read_peer(c->t, h)) return;
    pthread_mutex_lock(&state_lock);
    peer *p = peer_slot_locked(c->t, c->rank);
    if (p) p->read_pid = (pid_t)h->pid;
    pthread_mutex_unlock(&state_lock);
    if (p) send_control(c, CONTROL_DIRECT_OK);
}

static void on_hello_sent(connection *c, ucs_status_t status)
{
    if (status == UCS_OK) c->hello_sent = 1;
}

static void on_hello_received(connection *c, ucs_status_t status)
{
    pt_transport *t = c->t;
    if (c->state != CONN_HANDSHAKE) return;
    if (status != UCS_OK) return; /* the endpoint failed or closed: on_ep_error tells why */
    const hello *h = &c->hello_in;
    if (h->magic != HELLO_MAGIC || h->version != HELLO_VERSION) {
        connection_refuse(c, "not a pipert hello (magic 0x%08x, version %u)", h->magic, h->version);
        return;
    }
    if (!hello_secret_matches(t, h)) {
        connection_refuse(c, "wrong job secret (claimed rank %d)", h->rank);
        return;
    }
    if (h->job != t->job) {
        connection_refuse(c, "job %u is not this job (%u)", h->job, t->job);
        return;
    }
    if (h->rank < 0 || h->rank >= PT_TRANSPORT_MAX_RANKS || h->rank == t->rank) {
        connection_refuse(c, "impossible rank %d", h->rank);
        return;
    }
    if (!c->accepted && h->rank != c->rank) {
        connection_refuse(c, "expected rank %d there, found rank %d", c->rank, h->rank);
        return;
    }
    c->rank = h->rank;
    if (c->accepted) {
        /* Our secret goes only to a peer that proved it knows it. */
        fill_hello(t, &c->hello_out);
        stream_post(c, 1, &c->hello_out, sizeof c->hello_out, on_hello_sent);
    }
    if (!connection_register(c)) return;
    offer_direct_reads(c, h);
    pt_debug("transport: rank %d connected %s %s", c->rank, c->accepted ? "from" : "to",
             c->address);
    connection_finish(c, PIPERT_OK, "connected");
}

static connection *connection_new(pt_transport *t, int accepted, int rank, const char *address)
{
    connection *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->t = t;
    c->accepted = accepted;
    c->rank = rank;
    snprintf(c->address, sizeof c->address, "%s", address);
    c->state = CONN_HANDSHAKE;
    return c;
}

static void connection_link(pt_transport *t, connection *c)
{
    c->next = t->connections;
    t->connections = c;
    c->deadline = pt_now_s() + t->connect_timeout_s;
}

static void on_connection_request(ucp_conn_request_h request, void *arg)
{
    pt_transport *t = arg;
    char address[ADDRESS_CAPACITY] = "(unknown address)";
    ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    if (ucp_conn_request_query(request, &attr) == UCS_OK)
        format_sockaddr(&attr.client_address, address, sizeof address);
    pthread_mutex_lock(&t->queue_lock);
    int stopping = t->stopping;
    pthread_mutex_unlock(&t->queue_lock);
    connection *c = stopping ? NULL : connection_new(t, 1, -1, address);
    if (!c) {
        ucp_listener_reject(t->listener, request);
        return;
    }
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .conn_request = request,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = c},
    };
    ucs_status_t status = ucp_ep_create(t->worker, &params, &c->ep);
    if (status != UCS_OK) {
        pt_warn("transport: could not accept the connection from %s: %s", address,
                ucs_status_string(status));
        free(c);
        return;
    }
    connection_link(t, c);
    stream_post(c, 0, &c->hello_in, sizeof c->hello_in, on_hello_received);
}

static void start_connect(pt_transport *t, connection *c)
{
    connection_link(t, c);
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .sockaddr = {.addr = (const struct sockaddr *)&c->target, .addrlen = c->target_length},
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error, .arg = c},
    };
    ucs_status_t status = ucp_ep_create(t->worker, &params, &c->ep);
    if (status != UCS_OK) {
        c->ep = NULL;
        c->state = CONN_CLOSED;
        connection_finish(c, PIPERT_ERR_TRANSPORT, "cannot connect to rank %d at %s: %s", c->rank,
                          c->address, ucs_status_string(status));
        return;
    }
    fill_hello(t, &c->hello_out);
    stream_post(c, 1, &c->hello_out, sizeof c->hello_out, on_hello_sent);
    stream_post(c, 0, &c->hello_in, sizeof c->hello_in, on_hello_received);
}

/* Closes failed endpoints, times handshakes out and frees what is finished. */
static void maintain_connections(pt_transport *t)
{
    double now = pt_now_s();
    connection **link = &t->connections;
    while (*link) {
        connection *c = *link;
        if (c->state == CONN_HANDSHAKE && now > c->deadline) {
            if (c->accepted)
                pt_warn("transport: no valid hello from %s within %.0f s; closing", c->address,
                        t->connect_timeout_s);
            connection_finish(c, PIPERT_ERR_TIMEOUT, "no hello from rank %d at %s within %.0f s",
                              c->rank, c->address, t->connect_timeout_s);
            c->state = CONN_FAILED;
        }
        if (c->state == CONN_FAILED) connection_close(c);
        pthread_mutex_lock(&state_lock);
        int reapable = c->state == CONN_CLOSED && c->ops == 0 && !c->waiter &&
                       !(c->rank >= 0 && c->rank < t->peer_capacity && t->peers[c->rank].conn == c);
        if (reapable) *link = c->next;
        pthread_mutex_unlock(&state_lock);
        if (reapable)
            free(c);
        else
            link = &c->next;
    }
}

static int next_deadline_ms(const pt_transport *t)
{
    double now = pt_now_s(), wait_s = IDLE_WAKE_MS / 1000.0;
    for (const connection *c = t->connections; c; c = c->next)
        if (c->state == CONN_HANDSHAKE && c->deadline - now < wait_s) wait_s = c->deadline - now;
    return wait_s <= 0 ? 0 : (int)(wait_s * 1000.0) + 1;
}

/* ---- messages: sending --------------------------------------------------- */

static void on_send_part_done(void *request, ucs_status_t status, void *user_data);

static void send_part_finished(pt_request *r, ucs_status_t status)
{
    if (status != UCS_OK) {
        char what[96];
        describe_request(r, what, sizeof what);
        record_failure(r, PIPERT_ERR_PEER, "%s failed: %s", what, ucs_status_string(status));
    }
    if (--r->ops_pending == 0) complete_request(r);
}

static void on_send_part_done(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    send_part_finished(user_data, status);
}

static void send_part(pt_request *r, ucp_ep_h ep, const void *buffer, size_t count, int iov,
                      int part)
{
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.send = on_send_part_done,
        .user_data = r,
        .datatype = iov ? UCP_DATATYPE_IOV : ucp_dt_make_contig(1),
    };
    r->ops_pending++;
    ucs_status_ptr_t op = ucp_tag_send_nbx(
        ep, buffer, count, make_tag(r->kind, r->t->rank, part, r->user_tag), &param);
    if (op == NULL || UCS_PTR_IS_ERR(op)) send_part_finished(r, op ? UCS_PTR_STATUS(op) : UCS_OK);
}

static void post_part_receive(pt_request *r, ucp_tag_t tag, void *buffer, size_t count, int iov,
                              arrival_fn arrived);

static void ack_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info)
{
    (void)info;
    char what[96];
    describe_request(r, what, sizeof what);
    if (status == UCS_ERR_CANCELED && r->cancel_reason[0])
        record_failure(r, r->cancel_result, "%s: %s", what, r->cancel_reason);
    else if (status != UCS_OK)
        record_failure(r, PIPERT_ERR_PEER, "%s: no answer to the direct read: %s", what,
                       ucs_status_string(status));
    else if (r->ack.magic != DIRECT_ACK_MAGIC || r->ack.ack_id != r->descriptor.ack_id)
        record_failure(r, PIPERT_ERR_PEER, "%s: a malformed answer to the direct read", what);
    else if (r->ack.status == ACK_FAILED)
        record_failure(r, PIPERT_ERR_PEER,
                       "%s: rank %d could not read the payload from this process's memory", what,
                       r->peer);
    /* ACK_REFUSED: the receiver refused the header; the message was taken all the same. */
    send_part_finished(r, UCS_OK);
}

/* A direct send waits for the receiver's answer under (KIND_INTERNAL, peer, ack id); posted
 * before the descriptor leaves, so it is never unexpected. */
static void post_ack_receive(pt_request *r)
{
    r->ops_pending++;
    post_part_receive(r, make_tag(KIND_INTERNAL, r->peer, PART_PAYLOAD, r->descriptor.ack_id),
                      &r->ack, sizeof r->ack, 0, ack_arrived);
}

static void post_send(pt_transport *t, pt_request *r)
{
    pthread_mutex_lock(&state_lock);
    peer_state state = peer_state_locked(t, r->peer);
    connection *c = state == PEER_ALIVE ? t->peers[r->peer].conn : NULL;
    int reads_us = state == PEER_ALIVE && t->peers[r->peer].reads_us;
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "%s", t->peers[r->peer].reason);
    pthread_mutex_unlock(&state_lock);
    char what[96];
    describe_request(r, what, sizeof what);
    if (!c || !c->ep) {
        if (state == PEER_DEAD || state == PEER_LEFT)
            fail_request(r, PIPERT_ERR_PEER, "%s: rank %d %s: %s", what, r->peer,
                         state == PEER_LEFT ? "has left" : "failed", reason);
        else
            fail_request(r, PIPERT_ERR_PEER, "%s: rank %d is not connected", what, r->peer);
        return;
    }
    in_flight_add(t, r);
    /* Hold one count while posting so that a part finishing at once cannot complete the request
     * early. */
    r->ops_pending = 1;
    uint64_t nbytes = r->header.nbytes;
    if (nbytes > 0 && nbytes <= PT_TRANSPORT_INLINE_BYTES) {
        r->iov[0] = (ucp_dt_iov_t){&r->header, sizeof r->header};
        r->iov[1] = (ucp_dt_iov_t){(void *)r->payload, (size_t)nbytes};
        send_part(r, c->ep, r->iov, 2, 1, PART_HEADER);
    } else if (reads_us && nbytes >= DIRECT_MIN_BYTES) {
        r->descriptor = (direct_descriptor){.magic = DIRECT_MAGIC,
                                            .ack_id = t->next_ack_id++,
                                            .address = (uint64_t)(uintptr_t)r->payload,
                                            .nbytes = nbytes};
        post_ack_receive(r);
        if (!r->failed) { /* no descriptor goes out unless its answer can be received */
            send_part(r, c->ep, &r->header, sizeof r->header, 0, PART_HEADER);
            send_part(r, c->ep, &r->descriptor, sizeof r->descriptor, 0, PART_PAYLOAD);
        }
    } else {
        send_part(r, c->ep, &r->header, sizeof r->header, 0, PART_HEADER);
        if (nbytes > 0) send_part(r, c->ep, r->payload, (size_t)nbytes, 0, PART_PAYLOAD);
    }
    send_part_finished(r, UCS_OK);
}

/* ---- messages: receiving ------------------------------------------------- */

static void on_recv_part_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                              void *user_data);
static void header_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info);
static void payload_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info);

/* Posts one receive of r's under `tag`; `arrived` runs when it completes, at once or later. */
static void post_part_receive(pt_request *r, ucp_tag_t tag, void *buffer, size_t count, int iov,
                              arrival_fn arrived)
{
    pt_transport *t = r->t;
    /* No immediate completion: UCX 1.13 leaves recv_info unfilled when an
     * IOV receive completes at once, so every completion comes through the
     * callback (which may run inside ucp_tag_recv_nbx: see on_recv_part_done). */
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = on_recv_part_done,
        .user_data = r,
        .datatype = iov ? UCP_DATATYPE_IOV : ucp_dt_make_contig(1),
    };
    r->arrived = arrived;
    r->posting = 1;
    r->completed_in_post = 0;
    ucs_status_ptr_t op = ucp_tag_recv_nbx(t->worker, buffer, count, tag, ~(ucp_tag_t)0, &param);
    r->posting = 0;
    if (r->completed_in_post || op == NULL || UCS_PTR_IS_ERR(op)) {
        ucs_status_t status = r->completed_in_post ? r->completed_status
                              : op                 ? UCS_PTR_STATUS(op)
                                                   : UCS_ERR_NO_PROGRESS;
        arrived(r, status, &r->info);
        return;
    }
    r->op = op;
    /* A message from a peer that is already gone may still be waiting in
     * UCX's unexpected queue: we posted first, so it is delivered; if it
     * was not there, nothing more will come. */
    pthread_mutex_lock(&state_lock);
    peer_state state = peer_state_locked(t, r->peer);
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "rank %d %s: %s", r->peer,
                 state == PEER_LEFT ? "has left" : "failed", t->peers[r->peer].reason);
    pthread_mutex_unlock(&state_lock);
    if (reason[0] && r->op) {
        r->cancel_result = PIPERT_ERR_PEER;
        snprintf(r->cancel_reason, sizeof r->cancel_reason, "%s", reason);
        ucp_request_cancel(t->worker, r->op);
    }
}

/* Posts the header or payload part of a receive. */
static void recv_part(pt_request *r, void *buffer, size_t count, int iov, int part)
{
    r->part = part;
    post_part_receive(r, make_tag(r->kind, r->peer, part, r->user_tag), buffer, count, iov,
                      part == PART_HEADER ? header_arrived : payload_arrived);
}

static void on_recv_part_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                              void *user_data)
{
    pt_request *r = user_data;
    ucp_request_free(request);
    if (status == UCS_OK) r->info = *info;
    if (r->posting) { /* finish in post_part_receive, after ucp_tag_recv_nbx returned */
        r->completed_in_post = 1;
        r->completed_status = status;
        return;
    }
    r->op = NULL;
    r->arrived(r, status, info);
}

static int receive_failed_status(pt_request *r, ucs_status_t status, const char *part_name)
{
    if (status == UCS_OK) return 0;
    char what[96];
    describe_request(r, what, sizeof what);
    if (status == UCS_ERR_CANCELED && r->cancel_reason[0])
        fail_request(r, r->cancel_result, "%s: %s", what, r->cancel_reason);
    else if (status == UCS_ERR_MESSAGE_TRUNCATED)
        fail_request(r, PIPERT_ERR_PEER,
                     "%s: nbytes: the %s is longer than the %zu bytes this receive allows", what,
                     part_name, r->capacity);
    else
        fail_request(r, PIPERT_ERR_PEER, "%s: %s", what, ucs_status_string(status));
    return 1;
}

/* Drains the payload of a refused header so it neither lingers in UCX nor
 * matches a later receive: a receive with no room for it truncates it away. */
static void discard_payload(pt_request *r)
{
    pt_request *d = calloc(1, sizeof *d);
    if (!d) return;
    d->t = r->t;
    d->type = REQUEST_DISCARD;
    d->peer = r->peer;
    d->kind = r->kind;
    d->user_tag = r->user_tag;
    in_flight_add(r->t, d);
    /* Room for a descriptor only: it is answered (so its sender's send ends); a real payload is
     * longer and truncated away. */
    recv_part(d, &d->descriptor, sizeof d->descriptor, 0, PART_PAYLOAD);
}

/* The header checks, in the order a reader would ask them. Returns 0 and fills `why` on refusal. */
static int header_acceptable(const pt_transport *t, const pt_request *r, char *why, size_t capacity)
{
    const pt_message_header *h = &r->header;
    const pt_recv_expect *e = &r->expect;
    char got[96], want[96];
    if (h->magic != PT_MESSAGE_MAGIC)
        return snprintf(why, capacity, "magic: 0x%08x is not a pipert message", h->magic), 0;
    if (h->version != PT_MESSAGE_VERSION)
        return snprintf(why, capacity, "version: %u, this build speaks %u", h->version,
                        PT_MESSAGE_VERSION),
               0;
    if (h->job != t->job)
        return snprintf(why, capacity, "job: %u is not this job (%u)", h->job, t->job), 0;
    if (h->src_rank != r->peer)
        return snprintf(why, capacity, "src_rank: %d in a message from rank %d", h->src_rank,
                        r->peer),
               0;
    if (h->kind != e->kind)
        return snprintf(why, capacity, "kind: %u, expected %u", h->kind, e->kind), 0;
    if (h->dtype >= PT_DTYPE_COUNT)
        return snprintf(why, capacity, "dtype: %u is not a dtype", h->dtype), 0;
    if (e->dtype >= 0 && h->dtype != e->dtype)
        return snprintf(why, capacity, "dtype: %s, expected %s", pt_dtype_name(h->dtype),
                        pt_dtype_name(e->dtype)),
               0;
    if (h->ndim < 0 || h->ndim > PT_MESSAGE_MAX_DIMS)
        return snprintf(why, capacity, "ndim: %d is outside 0..%d", h->ndim, PT_MESSAGE_MAX_DIMS),
               0;
    format_shape(got, sizeof got, h->ndim, h->shape);
    uint64_t numel = 1;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] < 0)
            return snprintf(why, capacity, "shape: %s has a negative size", got), 0;
        if (h->shape[d] && numel > UINT64_MAX / (uint64_t)h->shape[d])
            return snprintf(why, capacity, "shape: %s overflows", got), 0;
        numel *= (uint64_t)h->shape[d];
    }
    if (e->ndim >= 0) {
        int same = h->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = h->shape[d] == e->shape[d];
        format_shape(want, sizeof want, e->ndim, e->shape);
        if (!same) return snprintf(why, capacity, "shape: %s, expected %s", got, want), 0;
    }
    size_t element = pt_dtype_size(h->dtype);
    if (numel > UINT64_MAX / element || h->nbytes != numel * element)
        return snprintf(why, capacity, "nbytes: %llu does not match shape %s of %s",
                        (unsigned long long)h->nbytes, got, pt_dtype_name(h->dtype)),
               0;
    if (h->nbytes > r->capacity)
        return snprintf(why, capacity, "nbytes: %llu exceeds the %zu bytes this receive allows",
                        (unsigned long long)h->nbytes, r->capacity),
               0;
    if (e->require_checksum && h->checksum == 0 && h->nbytes > 0)
        return snprintf(why, capacity, "checksum: none, and this receive requires one"), 0;
    return 1;
}

static void finish_receive(pt_request *r)
{
    const pt_message_header *h = &r->header;
    if (h->checksum && h->nbytes) {
        uint64_t actual = pt_checksum64(r->buffer, (size_t)h->nbytes);
        if (actual != h->checksum) {
            char what[96];
            describe_request(r, what, sizeof what);
            fail_request(r, PIPERT_ERR_PEER,
                         "%s: checksum: the payload hashes to 0x%016llx, the header says 0x%016llx",
                         what, (unsigned long long)actual, (unsigned long long)h->checksum);
            return;
        }
    }
    complete_request(r);
}

static void header_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info)
{
    if (receive_failed_status(r, status, "message")) return;
    char what[96], why[TEXT_CAPACITY];
    describe_request(r, what, sizeof what);
    if (info->length < sizeof r->header) {
        fail_request(r, PIPERT_ERR_PEER, "%s: a %zu-byte message is shorter than a header", what,
                     info->length);
        return;
    }
    if (!header_acceptable(r->t, r, why, sizeof why)) {
        if (r->header.nbytes > PT_TRANSPORT_INLINE_BYTES) discard_payload(r);
        fail_request(r, PIPERT_ERR_PEER, "%s: refused: %s", what, why);
        return;
    }
    uint64_t nbytes = r->header.nbytes;
    if (nbytes <= PT_TRANSPORT_INLINE_BYTES) {
        if (info->length != sizeof r->header + nbytes) {
            fail_request(r, PIPERT_ERR_PEER,
                         "%s: nbytes: the header says %llu but %zu payload bytes came", what,
                         (unsigned long long)nbytes, info->length - sizeof r->header);
            return;
        }
        finish_receive(r);
        return;
    }
    if (info->length != sizeof r->header) {
        fail_request(r, PIPERT_ERR_PEER,
                     "%s: nbytes: %llu should travel apart from the header, not inline", what,
                     (unsigned long long)nbytes);
        return;
    }
    recv_part(r, r->buffer, (size_t)nbytes, 0, PART_PAYLOAD);
}

static void on_ack_sent(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    free(user_data);
}

/* Answers the descriptor `ack_id` from `rank`: its send completes with this. */
static void acknowledge(pt_transport *t, int rank, uint32_t ack_id, int32_t status)
{
    pthread_mutex_lock(&state_lock);
    connection *c = peer_state_locked(t, rank) == PEER_ALIVE ? t->peers[rank].conn : NULL;
    pthread_mutex_unlock(&state_lock);
    if (!c || !c->ep) return; /* it failed or left: nobody waits for the answer */
    direct_ack *a = malloc(sizeof *a);
    if (!a) {
        pt_warn("transport: no memory to answer rank %d's direct read; its send stays pending",
                rank);
        return;
    }
    *a = (direct_ack){.magic = DIRECT_ACK_MAGIC, .ack_id = ack_id, .status = status};
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.send = on_ack_sent,
        .user_data = a,
        .datatype = ucp_dt_make_contig(1),
    };
    ucs_status_ptr_t op = ucp_tag_send_nbx(
        c->ep, a, sizeof *a, make_tag(KIND_INTERNAL, t->rank, PART_PAYLOAD, ack_id), &param);
    if (op == NULL || UCS_PTR_IS_ERR(op)) free(a);
}

static int is_descriptor(const direct_descriptor *d, size_t length)
{
    return length == sizeof *d && d->magic == DIRECT_MAGIC;
}

/* The payload part was a descriptor: copy the payload out of the sender's memory. */
static void read_directly(pt_request *r)
{
    pt_transport *t = r->t;
    const direct_descriptor *d = &r->descriptor;
    char what[96];
    describe_request(r, what, sizeof what);
    pthread_mutex_lock(&state_lock);
    peer_state state = peer_state_locked(t, r->peer);
    pid_t pid = state == PEER_ALIVE ? t->peers[r->peer].read_pid : 0;
    pthread_mutex_unlock(&state_lock);
    if (state != PEER_ALIVE) {
        /* Its memory may be reused by now: nothing is read. */
        fail_request(r, PIPERT_ERR_PEER,
                     "%s: rank %d %s before its %llu-byte payload was read from its memory", what,
                     r->peer, state == PEER_LEFT ? "left" : "failed",
                     (unsigned long long)r->header.nbytes);
        return;
    }
    if (pid <= 0 || d->nbytes != r->header.nbytes) {
        acknowledge(t, r->peer, d->ack_id, ACK_FAILED);
        if (pid <= 0)
            fail_request(r, PIPERT_ERR_PEER,
                         "%s: the payload came as a direct-read descriptor, but rank %d's memory "
                         "is not readable from here",
                         what, r->peer);
        else
            fail_request(r, PIPERT_ERR_PEER,
                         "%s: nbytes: the header says %llu but the payload descriptor %llu", what,
                         (unsigned long long)r->header.nbytes, (unsigned long long)d->nbytes);
        return;
    }
    int error = read_remote(pid, r->buffer, d->address, d->nbytes);
    acknowledge(t, r->peer, d->ack_id, error ? ACK_FAILED : ACK_READ);
    if (error) {
        fail_request(r, PIPERT_ERR_PEER,
                     "%s: reading the %llu-byte payload from the memory of rank %d (pid %d): %s",
                     what, (unsigned long long)d->nbytes, r->peer, (int)pid, strerror(error));
        return;
    }
    finish_receive(r);
}

static void payload_arrived(pt_request *r, ucs_status_t status, const ucp_tag_recv_info_t *info)
{
    if (r->type == REQUEST_DISCARD) {
        if (status == UCS_OK && is_descriptor(&r->descriptor, info->length))
            acknowledge(r->t, r->peer, r->descriptor.ack_id, ACK_REFUSED);
        complete_request(r);
        return;
    }
    if (receive_failed_status(r, status, "payload")) return;
    /* A separate payload is longer than PT_TRANSPORT_INLINE_BYTES: a descriptor-sized one is a
     * descriptor (or a lie, refused below as before). */
    if (info->length == sizeof r->descriptor) {
        memcpy(&r->descriptor, r->buffer, sizeof r->descriptor);
        if (is_descriptor(&r->descriptor, info->length)) {
            read_directly(r);
            return;
        }
    }
    if (info->length != r->header.nbytes) {
        char what[96];
        describe_request(r, what, sizeof what);
        fail_request(r, PIPERT_ERR_PEER, "%s: nbytes: the header says %llu but the payload has %zu",
                     what, (unsigned long long)r->header.nbytes, info->length);
        return;
    }
    finish_receive(r);
}

static void post_receive(pt_transport *t, pt_request *r)
{
    in_flight_add(t, r);
    size_t inline_room =
        r->capacity < PT_TRANSPORT_INLINE_BYTES ? r->capacity : PT_TRANSPORT_INLINE_BYTES;
    r->iov[0] = (ucp_dt_iov_t){&r->header, sizeof r->header};
    r->iov[1] = (ucp_dt_iov_t){r->buffer, inline_room};
    recv_part(r, r->iov, inline_room ? 2 : 1, 1, PART_HEADER);
}

/* Fails every receive from `rank` (every rank if < 0) that is still waiting in UCX. */
static void cancel_receives_from(pt_transport *t, int rank, pipert_result code, const char *reason)
{
    /* Cancelling may complete (and unlink) a request at once: step before it. */
    pt_request *next;
    for (pt_request *r = t->in_flight; r; r = next) {
        next = r->next;
        /* Receives, and direct sends waiting for their answer. */
        if ((rank >= 0 && r->peer != rank) || !r->op) continue;
        r->cancel_result = code;
        snprintf(r->cancel_reason, sizeof r->cancel_reason, "%s", reason);
        ucp_request_cancel(t->worker, r->op);
    }
}

/* ---- the progress thread ------------------------------------------------- */

static void run_command(pt_transport *t, command *c)
{
    pt_request *r = c->request;
    switch (c->op) {
    case COMMAND_POST:
        r->t = t;
        if (r->type == REQUEST_SEND)
            post_send(t, r);
        else
            post_receive(t, r);
        break;
    case COMMAND_CANCEL:
        /* Only while its header has not matched: cancelling the payload part would leave the
         * payload (or a descriptor whose sender waits for an answer) to match a later receive. */
        if (r->in_flight && r->op && r->type == REQUEST_RECV && r->part == PART_HEADER &&
            !r->cancel_reason[0]) {
            r->cancel_result = PIPERT_ERR_INTERRUPTED;
            snprintf(r->cancel_reason, sizeof r->cancel_reason, "cancelled");
            ucp_request_cancel(t->worker, r->op);
        }
        break;
    case COMMAND_CONNECT:
        start_connect(t, c->conn);
        break;
    }
}

static void run_commands(pt_transport *t)
{
    command *c = take_commands(t);
    while (c) {
        command *next = c->next;
        run_command(t, c);
        free(c);
        c = next;
    }
}

/* Polls UCX for at most SPIN_US; 1 as soon as something happened (progress or a command). */
static int poll_briefly(pt_transport *t)
{
    double until = pt_now_s() + SPIN_US * 1e-6;
    do {
        if (ucp_worker_progress(t->worker) || commands_queued(t)) return 1;
    } while (pt_now_s() < until);
    return 0;
}

/* One round: commands, UCX progress until it has nothing left, upkeep; then,
 * with requests in flight, polls briefly (SPIN_US); then sleeps on the
 * worker's event fd and the wake fd for at most max_wait_ms. */
static void progress_round(pt_transport *t, int max_wait_ms)
{
    run_commands(t);
    while (ucp_worker_progress(t->worker)) {
    }
    maintain_connections(t);
    if (t->in_flight && poll_briefly(t)) return;
    atomic_store(&t->in_epoll, 1);
    ucs_status_t status = commands_queued(t) ? UCS_ERR_BUSY : ucp_worker_arm(t->worker);
    if (status == UCS_ERR_BUSY) {
        atomic_store(&t->in_epoll, 0);
        return;
    }
    if (status != UCS_OK) pt_warn("transport: ucp_worker_arm: %s", ucs_status_string(status));
    int wait_ms = next_deadline_ms(t);
    if (wait_ms > max_wait_ms) wait_ms = max_wait_ms;
    struct epoll_event events[2];
    ucx_lock_release(t);
    int n = epoll_wait(t->epoll_fd, events, 2, status == UCS_OK ? wait_ms : 1);
    atomic_store(&t->in_epoll, 0);
    ucx_lock_acquire(t);
    for (int i = 0; i < n; i++) {
        if (events[i].data.fd == t->wake_fd) {
            uint64_t count;
            ssize_t got = read(t->wake_fd, &count, sizeof count);
            (void)got;
        }
    }
}

static int all_byes_acknowledged(const pt_transport *t)
{
    for (const connection *c = t->connections; c; c = c->next)
        if (c->state == CONN_READY && c->bye_sent && !c->bye_acked) return 0;
    return 1;
}

static int all_connections_closed(const pt_transport *t)
{
    for (const connection *c = t->connections; c; c = c->next)
        if (c->state != CONN_CLOSED || c->ops > 0) return 0;
    return 1;
}

static void progress_until(pt_transport *t, int (*done)(const pt_transport *), double seconds)
{
    double deadline = pt_now_s() + seconds;
    while (!done(t) && pt_now_s() < deadline) progress_round(t, 50);
}

/* Goodbyes first, so that peers see us leave rather than fail; then closes.
 *
 * Endpoints are closed with UCP_EP_CLOSE_FLAG_FORCE: a peer that acknowledged
 * our goodbye has received everything we sent before it (one ordered lane),
 * and what is still in flight (a rendezvous send the peer never matched) is
 * to be cancelled anyway. A graceful close would also trip an assertion in
 * UCX 1.13 when such a rendezvous request is still attached to the endpoint. */
static void shut_down(pt_transport *t)
{
    if (t->listener) {
        ucp_listener_destroy(t->listener);
        t->listener = NULL;
    }
    for (connection *c = t->connections; c; c = c->next) {
        if (c->state != CONN_READY || c->peer_left) continue;
        c->bye_sent = 1;
        send_control(c, CONTROL_BYE);
    }
    progress_until(t, all_byes_acknowledged, SHUTDOWN_STEP_S);
    cancel_receives_from(t, -1, PIPERT_ERR_INTERRUPTED, "the transport was shut down");
    for (connection *c = t->connections; c; c = c->next) connection_close(c);
    progress_until(t, all_connections_closed, SHUTDOWN_STEP_S);
}

static void *progress_main(void *arg)
{
    pt_transport *t = arg;
    ucx_lock_acquire(t);
    for (;;) {
        pthread_mutex_lock(&t->queue_lock);
        int stopping = t->stopping;
        pthread_mutex_unlock(&t->queue_lock);
        if (stopping) break;
        progress_round(t, IDLE_WAKE_MS);
    }
    run_commands(t); /* commands queued before `stopping` was set */
    shut_down(t);
    ucx_lock_release(t);
    return NULL;
}

/* ---- creation and destruction -------------------------------------------- */

static pipert_result ucx_fail(ucs_status_t status, const char *what)
{
    return pt_fail(PIPERT_ERR_TRANSPORT, "transport: %s: %s", what, ucs_status_string(status));
}

static pipert_result open_listener(pt_transport *t, const pt_transport_options *options)
{
    const char *host =
        options->listen_host && options->listen_host[0] ? options->listen_host : "0.0.0.0";
    char bind_address[ADDRESS_CAPACITY + 16];
    snprintf(bind_address, sizeof bind_address, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host,
             options->listen_port);
    struct sockaddr_storage address;
    socklen_t length;
    PT_TRY(resolve_address(bind_address, 1, &address, &length));
    ucp_listener_params_t params = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (const struct sockaddr *)&address, .addrlen = length},
        .conn_handler = {.cb = on_connection_request, .arg = t},
    };
    ucs_status_t status = ucp_listener_create(t->worker, &params, &t->listener);
    if (status != UCS_OK) {
        t->listener = NULL;
        return pt_fail(PIPERT_ERR_TRANSPORT, "transport: cannot listen on %s: %s", bind_address,
                       ucs_status_string(status));
    }
    ucp_listener_attr_t attr = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    status = ucp_listener_query(t->listener, &attr);
    if (status != UCS_OK) return ucx_fail(status, "ucp_listener_query");
    char bound[ADDRESS_CAPACITY];
    format_sockaddr(&attr.sockaddr, bound, sizeof bound);
    const char *port = strrchr(bound, ':') + 1;
    char advertised[INET6_ADDRSTRLEN + 2];
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::"))
        first_external_ipv4(advertised, sizeof advertised);
    else
        snprintf(advertised, sizeof advertised, strchr(host, ':') ? "[%s]" : "%s", host);
    snprintf(t->listen_address, sizeof t->listen_address, "%s:%s", advertised, port);
    return PIPERT_OK;
}

/* /proc/sys/kernel/random/boot_id as 16 bytes (zeros if unreadable): same value, same kernel. */
static void read_boot_id(uint8_t out[16])
{
    memset(out, 0, 16);
    char text[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(text, sizeof text, f)) text[0] = '\0';
        fclose(f);
    }
    int digits = 0;
    for (const char *p = text; *p && digits < 32; p++) {
        int value = *p >= '0' && *p <= '9'   ? *p - '0'
                    : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                    : *p >= 'A' && *p <= 'F' ? *p - 'A' + 10
                                             : -1;
        if (value < 0) continue;
        out[digits / 2] = (uint8_t)(out[digits / 2] << 4 | value);
        digits++;
    }
}

static int tls_item_is(const char *item, const char *name) { return !strcmp(item, name); }

/* Direct reads stand in for UCX's cma transport: allowed where UCX_TLS allows cma. */
static int tls_allows_direct_reads(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !tls[0]) return 1;
    int excluding = tls[0] == '^';
    char list[256];
    snprintf(list, sizeof list, "%s", tls + excluding);
    int named = 0;
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save))
        named |= tls_item_is(item, "cma") || tls_item_is(item, "sm") ||
                 tls_item_is(item, "shm") || (!excluding && tls_item_is(item, "all"));
    return excluding ? !named : named;
}

static void init_direct_reads(pt_transport *t)
{
    t->direct_allowed = tls_allows_direct_reads();
    read_boot_id(t->boot_id);
    /* Only has to be unlikely to sit at that address by chance (another host's process). */
    if (getrandom(&t->probe_word, sizeof t->probe_word, GRND_NONBLOCK) !=
        (ssize_t)sizeof t->probe_word)
        t->probe_word = (uint64_t)(pt_now_s() * 1e9) ^ ((uint64_t)getpid() << 32) ^
                        (uint64_t)(uintptr_t)t;
    t->probe_word |= 1;
}

static pipert_result open_ucx(pt_transport *t)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
    };
    /* NULL config: UCX reads its UCX_* environment variables, nothing else changes. */
    ucs_status_t status = ucp_init(&params, NULL, &t->context);
    if (status != UCS_OK) {
        t->context = NULL;
        return ucx_fail(status, "ucp_init");
    }
    ucp_worker_params_t worker_params = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        /* Created here, driven by the progress thread, destroyed here: one at a time. */
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    status = ucp_worker_create(t->context, &worker_params, &t->worker);
    if (status != UCS_OK) {
        t->worker = NULL;
        return ucx_fail(status, "ucp_worker_create");
    }
    status = ucp_worker_get_efd(t->worker, &t->worker_fd);
    if (status != UCS_OK) return ucx_fail(status, "ucp_worker_get_efd");
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (t->wake_fd < 0 || t->epoll_fd < 0)
        return pt_fail(PIPERT_ERR_TRANSPORT, "transport: eventfd/epoll: %s", strerror(errno));
    int fds[2] = {t->worker_fd, t->wake_fd};
    for (int i = 0; i < 2; i++) {
        struct epoll_event event = {.events = EPOLLIN, .data.fd = fds[i]};
        if (epoll_ctl(t->epoll_fd, EPOLL_CTL_ADD, fds[i], &event) != 0)
            return pt_fail(PIPERT_ERR_TRANSPORT, "transport: epoll_ctl: %s", strerror(errno));
    }
    return PIPERT_OK;
}

/* Ends a connection's life with its transport: freed now, or by the
 * pt_transport_connect() call still waiting on it. */
static void connection_orphan(connection *c)
{
    connection_finish(c, PIPERT_ERR_INTERRUPTED, "the transport was destroyed");
    pthread_mutex_lock(&state_lock);
    int waited_on = c->waiter;
    c->t = NULL;
    pthread_mutex_unlock(&state_lock);
    if (!waited_on) free(c);
}

static void release(pt_transport *t)
{
    ucx_lock_acquire(t); /* no other thread is left, but callbacks may run here */
    if (t->listener) ucp_listener_destroy(t->listener);
    /* Destroying the worker may still call our callbacks for operations it
     * purges: connections and requests must outlive it. */
    if (t->worker) ucp_worker_destroy(t->worker);
    if (t->context) ucp_cleanup(t->context);
    while (t->in_flight) {
        pt_request *r = t->in_flight;
        r->op = NULL;
        r->ops_pending = 0;
        fail_request(r, PIPERT_ERR_INTERRUPTED, "%s rank %d: the transport was destroyed",
                     request_verb(r), r->peer);
    }
    for (command *c = take_commands(t); c;) {
        command *next = c->next;
        if (c->op == COMMAND_POST)
            fail_request(c->request, PIPERT_ERR_INTERRUPTED, "the transport was destroyed");
        if (c->op == COMMAND_CONNECT) connection_orphan(c->conn);
        free(c);
        c = next;
    }
    while (t->connections) {
        connection *c = t->connections;
        t->connections = c->next;
        connection_orphan(c);
    }
    if (t->epoll_fd >= 0) close(t->epoll_fd);
    if (t->wake_fd >= 0) close(t->wake_fd);
    ucx_lock_release(t);
    pthread_mutex_lock(&state_lock);
    while (t->pollers > 0) pthread_cond_wait(&state_changed, &state_lock);
    pthread_mutex_unlock(&state_lock);
    pthread_mutex_destroy(&t->queue_lock);
    pthread_mutex_destroy(&t->ucx_lock);
    free(t->peers);
    free(t);
}

pipert_result pt_transport_create(const pt_transport_options *options, pt_transport **out)
{
    *out = NULL;
    if (!options || options->rank < 0 || options->rank >= PT_TRANSPORT_MAX_RANKS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: rank %d is outside 0..%d",
                       options ? options->rank : -1, PT_TRANSPORT_MAX_RANKS - 1);
    size_t secret_length = options->secret ? strlen(options->secret) : 0;
    if (secret_length == 0 || secret_length > PT_TRANSPORT_SECRET_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "transport: the job secret must have 1..%d bytes (it has %zu)",
                       PT_TRANSPORT_SECRET_MAX, secret_length);
    if (options->listen_port < 0 || options->listen_port > 65535)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: listen_port %d is outside 0..65535",
                       options->listen_port);
    pt_transport *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory");
    t->rank = options->rank;
    t->job = options->job;
    t->secret_length = secret_length;
    memcpy(t->secret, options->secret, secret_length);
    t->connect_timeout_s = options->connect_timeout_s > 0 ? options->connect_timeout_s : 30.0;
    t->wake_fd = t->epoll_fd = -1;
    pthread_mutex_init(&t->queue_lock, NULL);
    pthread_mutex_init(&t->ucx_lock, NULL);
    init_direct_reads(t);
    pipert_result rc = open_ucx(t);
    if (rc == PIPERT_OK) rc = open_listener(t, options);
    if (rc == PIPERT_OK && pthread_create(&t->thread, NULL, progress_main, t) != 0)
        rc = pt_fail(PIPERT_ERR_TRANSPORT, "transport: cannot start the progress thread");
    if (rc != PIPERT_OK) {
        release(t);
        return rc;
    }
    pt_debug("transport: rank %d listening on %s", t->rank, t->listen_address);
    *out = t;
    return PIPERT_OK;
}

void pt_transport_destroy(pt_transport *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->queue_lock);
    t->stopping = 1;
    pthread_mutex_unlock(&t->queue_lock);
    wake_progress_thread(t);
    pthread_join(t->thread, NULL);
    release(t);
}

int pt_transport_rank(const pt_transport *t) { return t->rank; }

const char *pt_transport_listen_address(const pt_transport *t) { return t->listen_address; }

/* ---- connecting ---------------------------------------------------------- */

static int wait_on_state(const struct timespec *deadline)
{
    return deadline ? pthread_cond_timedwait(&state_changed, &state_lock, deadline)
                    : pthread_cond_wait(&state_changed, &state_lock);
}

static void deadline_after(double seconds, struct timespec *out)
{
    clock_gettime(CLOCK_REALTIME, out);
    double whole = (double)(long)seconds;
    out->tv_sec += (time_t)whole;
    out->tv_nsec += (long)((seconds - whole) * 1e9);
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

pipert_result pt_transport_connect(pt_transport *t, int peer_rank, const char *address)
{
    if (peer_rank < 0 || peer_rank >= PT_TRANSPORT_MAX_RANKS || peer_rank == t->rank)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: cannot connect rank %d to rank %d",
                       t->rank, peer_rank);
    connection *c = connection_new(t, 0, peer_rank, address);
    if (!c) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a connection");
    pipert_result resolved = resolve_address(address, 0, &c->target, &c->target_length);
    if (resolved != PIPERT_OK) {
        free(c);
        return resolved;
    }
    c->waiter = 1;
    pipert_result rc = enqueue(t, COMMAND_CONNECT, NULL, c);
    if (rc != PIPERT_OK) {
        free(c);
        return rc;
    }
    /* The progress thread enforces the handshake deadline; the margin here only guards against a
     * stuck thread. */
    struct timespec deadline;
    deadline_after(t->connect_timeout_s + 5.0, &deadline);
    pthread_mutex_lock(&state_lock);
    while (!c->finished)
        if (wait_on_state(&deadline) == ETIMEDOUT) break;
    pipert_result result = c->finished ? c->result : PIPERT_ERR_TIMEOUT;
    char message[TEXT_CAPACITY];
    snprintf(message, sizeof message, "%s",
             c->finished ? c->message : "connect: no answer from the progress thread");
    c->waiter = 0;
    int orphan = c->t == NULL;
    pthread_mutex_unlock(&state_lock);
    if (orphan) free(c);
    if (result != PIPERT_OK) return pt_fail(result, "%s", message);
    return PIPERT_OK;
}

pipert_result pt_transport_wait_peer(pt_transport *t, int peer_rank, double timeout_s)
{
    struct timespec deadline;
    deadline_after(timeout_s < 0 ? 0 : timeout_s, &deadline);
    pthread_mutex_lock(&state_lock);
    peer_state state;
    while ((state = peer_state_locked(t, peer_rank)) == PEER_UNKNOWN)
        if (wait_on_state(&deadline) == ETIMEDOUT) break;
    state = peer_state_locked(t, peer_rank);
    char reason[TEXT_CAPACITY] = "";
    if (state == PEER_DEAD || state == PEER_LEFT)
        snprintf(reason, sizeof reason, "%s", t->peers[peer_rank].reason);
    pthread_mutex_unlock(&state_lock);
    if (state == PEER_ALIVE) return PIPERT_OK;
    if (state == PEER_UNKNOWN)
        return pt_fail(PIPERT_ERR_TIMEOUT,
                       "transport: rank %d did not connect to rank %d within %.1f s", peer_rank,
                       t->rank, timeout_s);
    return pt_fail(PIPERT_ERR_PEER, "transport: rank %d %s: %s", peer_rank,
                   state == PEER_LEFT ? "has left" : "failed", reason);
}

pipert_result pt_transport_connect_all(pt_transport *t, int n_ranks, const char *const *addresses,
                                       double timeout_s)
{
    if (t->rank >= n_ranks)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "transport: rank %d is not below n_ranks %d",
                       t->rank, n_ranks);
    double deadline = pt_now_s() + timeout_s;
    for (int rank = 0; rank < t->rank; rank++) {
        pipert_result rc = pt_transport_connect(t, rank, addresses[rank]);
        if (rc != PIPERT_OK) {
            pt_error_prefix("rank %d connecting to rank %d", t->rank, rank);
            return rc;
        }
    }
    for (int rank = t->rank + 1; rank < n_ranks; rank++) {
        double left = deadline - pt_now_s();
        PT_TRY(pt_transport_wait_peer(t, rank, left > 0 ? left : 0));
    }
    return PIPERT_OK;
}

int pt_transport_peer_alive(pt_transport *t, int peer_rank)
{
    pthread_mutex_lock(&state_lock);
    int alive = peer_state_locked(t, peer_rank) == PEER_ALIVE;
    pthread_mutex_unlock(&state_lock);
    return alive;
}

/* ---- requests ------------------------------------------------------------ */

static pipert_result check_peer_argument(const pt_transport *t, int rank, const char *what)
{
    if (rank < 0 || rank >= PT_TRANSPORT_MAX_RANKS || rank == t->rank)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: rank %d is not a peer of rank %d", what, rank,
                       t->rank);
    return PIPERT_OK;
}

static pipert_result check_kind(unsigned kind, const char *what)
{
    if (kind < 1 || kind > PT_KIND_MAX)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "%s: kind %u is outside 1..%d", what, kind,
                       PT_KIND_MAX);
    return PIPERT_OK;
}

static pipert_result new_request(pt_transport *t, request_type type, int peer_rank,
                                 uint32_t user_tag, unsigned kind, pt_request **out)
{
    pt_request *r = calloc(1, sizeof *r);
    if (!r) return pt_fail(PIPERT_ERR_NOMEM, "transport: no memory for a request");
    r->t = t;
    r->type = type;
    r->peer = peer_rank;
    r->user_tag = user_tag;
    r->kind = (uint16_t)kind;
    r->state = REQUEST_PENDING;
    *out = r;
    return PIPERT_OK;
}

/* The UCX lock for a user thread: only if it is free (the progress thread sleeps in epoll) and
 * the transport is not shutting down (its worker may be gone). */
static int ucx_lock_try_while_running(pt_transport *t)
{
    if (!ucx_lock_try(t)) return 0;
    pthread_mutex_lock(&t->queue_lock);
    int stopping = t->stopping;
    pthread_mutex_unlock(&t->queue_lock);
    if (stopping) ucx_lock_release(t);
    return !stopping;
}

/* Before a user thread gives the lock back: leaves the worker as the sleeping progress thread
 * left it, progressed and armed, so that what comes next wakes it. Returns 1 if it cannot be
 * armed (events wait): then the progress thread must be woken to look. */
static int progress_and_arm(pt_transport *t)
{
    while (ucp_worker_progress(t->worker)) {
    }
    return ucp_worker_arm(t->worker) != UCS_OK;
}

/* Posts on this thread when UCX is free (the progress thread sleeps), which
 * saves a thread hand-off: an eager send then completes before we return,
 * and a receive waits without waking anyone. Commands already queued run
 * first, so requests keep the order in which they were made. Returns 0 if
 * the caller must queue the request instead. */
static int post_directly(pt_transport *t, pt_request *r)
{
    if (!ucx_lock_try_while_running(t)) return 0;
    run_commands(t);
    if (r->type == REQUEST_SEND)
        post_send(t, r);
    else
        post_receive(t, r);
    int busy = progress_and_arm(t);
    ucx_lock_release(t);
    if (busy) wake_progress_thread(t);
    return 1;
}

static pipert_result submit(pt_transport *t, pt_request *r, pt_request **out)
{
    if (post_directly(t, r)) {
        *out = r;
        return PIPERT_OK;
    }
    pipert_result rc = enqueue(t, COMMAND_POST, r, NULL);
    if (rc != PIPERT_OK) {
        free(r);
        return rc;
    }
    *out = r;
    return PIPERT_OK;
}

pipert_result pt_send_raw(pt_transport *t, int dst_rank, uint32_t user_tag,
                          const pt_message_header *header, const void *payload, pt_request **out)
{
    *out = NULL;
    PT_TRY(check_peer_argument(t, dst_rank, "pt_send"));
    PT_TRY(check_kind(header->kind, "pt_send"));
    if (header->nbytes > 0 && !payload)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: %llu bytes to send but no payload",
                       (unsigned long long)header->nbytes);
    pt_request *r = NULL;
    PT_TRY(new_request(t, REQUEST_SEND, dst_rank, user_tag, header->kind, &r));
    r->header = *header;
    r->payload = payload;
    return submit(t, r, out);
}

pipert_result pt_send(pt_transport *t, int dst_rank, uint32_t user_tag,
                      const pt_message_header *header, const void *payload, unsigned flags,
                      pt_request **out)
{
    *out = NULL;
    if (header->dtype >= PT_DTYPE_COUNT)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: dtype %u is not a dtype", header->dtype);
    if (header->ndim < 0 || header->ndim > PT_MESSAGE_MAX_DIMS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: ndim %d is outside 0..%d", header->ndim,
                       PT_MESSAGE_MAX_DIMS);
    uint64_t numel = 1;
    for (int d = 0; d < header->ndim; d++) {
        if (header->shape[d] < 0)
            return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: shape[%d] is negative", d);
        if (__builtin_mul_overflow(numel, (uint64_t)header->shape[d], &numel))
            return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_send: the shape overflows");
    }
    if (header->nbytes != numel * pt_dtype_size(header->dtype))
        return pt_fail(PIPERT_ERR_INVALID_ARG,
                       "pt_send: nbytes %llu is not the %llu bytes of its shape",
                       (unsigned long long)header->nbytes,
                       (unsigned long long)(numel * pt_dtype_size(header->dtype)));
    /* A fresh header (padding zeroed), with the fields the transport owns. */
    pt_message_header wire;
    memset(&wire, 0, sizeof wire);
    wire.magic = PT_MESSAGE_MAGIC;
    wire.version = PT_MESSAGE_VERSION;
    wire.kind = header->kind;
    wire.dtype = header->dtype;
    wire.job = t->job;
    wire.replica = header->replica;
    wire.stage = header->stage;
    wire.microbatch = header->microbatch;
    wire.src_rank = t->rank;
    wire.step = header->step;
    wire.weight_version = header->weight_version;
    wire.ndim = header->ndim;
    for (int d = 0; d < header->ndim; d++) wire.shape[d] = header->shape[d];
    wire.nbytes = header->nbytes;
    wire.checksum =
        (flags & PT_SEND_CHECKSUM) && header->nbytes ? pt_checksum64(payload, header->nbytes) : 0;
    return pt_send_raw(t, dst_rank, user_tag, &wire, payload, out);
}

pipert_result pt_recv(pt_transport *t, int src_rank, uint32_t user_tag,
                      const pt_recv_expect *expect, void *buffer, size_t capacity, pt_request **out)
{
    *out = NULL;
    PT_TRY(check_peer_argument(t, src_rank, "pt_recv"));
    PT_TRY(check_kind(expect->kind, "pt_recv"));
    if (expect->ndim > PT_MESSAGE_MAX_DIMS)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_recv: expected ndim %d is above %d",
                       expect->ndim, PT_MESSAGE_MAX_DIMS);
    if (capacity > 0 && !buffer)
        return pt_fail(PIPERT_ERR_INVALID_ARG, "pt_recv: capacity %zu but no buffer", capacity);
    pt_request *r = NULL;
    PT_TRY(new_request(t, REQUEST_RECV, src_rank, user_tag, expect->kind, &r));
    r->expect = *expect;
    r->buffer = buffer;
    r->capacity = capacity;
    return submit(t, r, out);
}

static pipert_result report(const pt_request *r)
{
    if (r->result != PIPERT_OK) return pt_fail(r->result, "%s", r->message);
    return PIPERT_OK;
}

static int request_done(pt_request *r)
{
    pthread_mutex_lock(&state_lock);
    int done = r->state == REQUEST_DONE;
    pthread_mutex_unlock(&state_lock);
    return done;
}

int pt_request_test(pt_request *request, pipert_result *result)
{
    int done = request_done(request);
    if (done) *result = report(request);
    return done;
}

/* What the progress thread's epoll reports for the worker's event fd: EPOLLIN, or 0 while a
 * waiter polls (the waiter handles those events; waking the progress thread for them would only
 * take a core from it). */
static void set_worker_events(pt_transport *t, uint32_t events)
{
    struct epoll_event event = {.events = events, .data.fd = t->worker_fd};
    if (epoll_ctl(t->epoll_fd, EPOLL_CTL_MOD, t->worker_fd, &event) != 0)
        pt_warn("transport: epoll_ctl on the worker's event fd: %s", strerror(errno));
}

/* Before sleeping, a waiter drives UCX itself for at most `seconds` if the
 * progress thread sleeps: it holds the UCX lock meanwhile, mutes the worker's
 * fd in the progress thread's epoll, and leaves the worker progressed and
 * armed (as post_directly does). */
static void poll_while_waiting(pt_request *r, double seconds)
{
    pthread_mutex_lock(&state_lock);
    pt_transport *t = r->state == REQUEST_PENDING ? r->t : NULL;
    if (t) t->pollers++; /* keeps t alive: release() waits for pollers to leave */
    pthread_mutex_unlock(&state_lock);
    if (!t) return;
    if (ucx_lock_try_while_running(t)) {
        set_worker_events(t, 0);
        double until = pt_now_s() + seconds;
        do {
            run_commands(t);
            while (ucp_worker_progress(t->worker)) {
            }
        } while (!request_done(r) && pt_now_s() < until);
        int busy = progress_and_arm(t);
        /* Unmuted once armed: an event from here on makes the fd readable, and epoll sees it. */
        set_worker_events(t, EPOLLIN);
        ucx_lock_release(t);
        if (busy) wake_progress_thread(t);
    }
    pthread_mutex_lock(&state_lock);
    if (--t->pollers == 0) pthread_cond_broadcast(&state_changed);
    pthread_mutex_unlock(&state_lock);
}

pipert_result pt_request_wait(pt_request *request, double timeout_s)
{
    if (holding_ucx_lock)
        return pt_fail(PIPERT_ERR_INTERNAL, "pt_request_wait called from a transport callback");
    double spin_s = WAIT_SPIN_US * 1e-6;
    poll_while_waiting(request, timeout_s >= 0 && timeout_s < spin_s ? timeout_s : spin_s);
    struct timespec deadline;
    if (timeout_s >= 0) deadline_after(timeout_s, &deadline);
    pthread_mutex_lock(&state_lock);
    while (request->state != REQUEST_DONE)
        if (wait_on_state(timeout_s >= 0 ? &deadline : NULL) == ETIMEDOUT) break;
    int done = request->state == REQUEST_DONE;
    pthread_mutex_unlock(&state_lock);
    if (!done) {
        char what[96];
        describe_request(request, what, sizeof what);
        return pt_fail(PIPERT_ERR_TIMEOUT, "%s: not complete after %.3g s", what, timeout_s);
    }
    return report(request);
}

void pt_request_on_complete(pt_request *request, pt_request_callback fn, void *arg)
{
    pthread_mutex_lock(&state_lock);
    if (request->state == REQUEST_PENDING) {
        request->callback = fn;
        request->callback_arg = arg;
        pthread_mutex_unlock(&state_lock);
        return;
    }
    /* Completing on this very thread (we are inside a callback): it cannot become DONE while we
     * wait. */
    while (request->state != REQUEST_DONE && !holding_ucx_lock)
        pthread_cond_wait(&state_changed, &state_lock);
    pthread_mutex_unlock(&state_lock);
    fn(request, request->result, arg);
}

const pt_message_header *pt_request_header(const pt_request *request) { return &request->header; }

const char *pt_request_error(const pt_request *request)
{
    return request->result == PIPERT_OK ? "" : request->message;
}

void pt_request_cancel(pt_request *request)
{
    pthread_mutex_lock(&state_lock);
    int pending = request->state == REQUEST_PENDING;
    pt_transport *t = request->t;
    pthread_mutex_unlock(&state_lock);
    if (pending && t && request->type == REQUEST_RECV) enqueue(t, COMMAND_CANCEL, request, NULL);
}

void pt_request_free(pt_request *request)
{
    if (!request) return;
    pt_request_cancel(request);
    pthread_mutex_lock(&state_lock);
    if (request->state != REQUEST_DONE && holding_ucx_lock) {
        /* From a callback, where waiting would wait for ourselves: complete_request frees it when
         * it is done. */
        request->free_requested = 1;
        pthread_mutex_unlock(&state_lock);
        return;
    }
    while (request->state != REQUEST_DONE) pthread_cond_wait(&state_changed, &state_lock);
    pthread_mutex_unlock(&state_lock);
    free(request);
}
