/* Inside the UCX transport: the types its files share (each file's functions for the others
 * are in a header of its own, transport_progress.h and the like). comm/transport.h says
 * what the transport offers and how its protocol goes. One concern per file:
 *   transport.c            creating and destroying a transport (UCX context, worker, fds)
 *   transport_address.c    the address peers connect to: the UCX worker address, as text
 *   transport_connect.c    connections: endpoints, the hello handshake, control words on
 *                          their stream, the peer table, and connecting
 *   transport_direct.c     same-host direct reads (process_vm_readv) in place of UCX's cma
 *   transport_device.c     same-host device payloads: copies from a peer's device memory
 *   transport_send_recv.c  messages: the checksum, sending, and receiving with the header
 *                          checked before the payload is trusted
 *   transport_request.c    a request's life: completion, test, wait, callbacks, free
 *   transport_progress.c   who drives UCX: the command queue, the progress thread, and user
 *                          threads that post or poll while it sleeps
 * Functions one file offers the others are named pt_transport_* and are hidden from the
 * library's exported symbols.
 *
 * Threads. Only one thread at a time calls into UCX (ucp_*): the holder of
 * `ucx_lock`. That is the progress thread, which drains a command queue that
 * other threads fill and runs ucp_worker_progress() (UCX calls our callbacks
 * from there), except while it sleeps in epoll: then a user thread may take
 * the lock and post its send or receive itself (post_directly), or, blocked in
 * pt_request_wait, drive UCX for a bounded while
 * (pt_transport_poll_while_waiting). Either leaves the worker progressed and
 * armed, as the sleeping progress thread expects, and wakes it only if the
 * worker cannot be armed. Polling is always bounded (SPIN_US, WAIT_SPIN_US):
 * an idle transport sleeps. Everything UCX-facing (connections, the in-flight
 * list, a request's UCX side) is touched only under ucx_lock. Shared state
 * that waiters read (request completion, the peer table, connection outcomes)
 * is guarded by one process-wide mutex, `pt_transport_state_lock`, with one
 * condition variable `pt_transport_state_changed` that every waiter sleeps
 * on; it is process-wide so that a request outlives its transport. The
 * command queue has its own lock. Neither of those two is held while calling
 * UCX or a user callback; user callbacks do run under ucx_lock (which is why
 * they must be short, and why requests they post are queued rather than
 * posted on the spot).
 *
 * Objects. A `connection` is one UCX endpoint and its handshake; connections
 * live in the transport's list until destroy. A `peer` is a rank: its state
 * and the connection we send on. A pt_request is one user send or receive;
 * while it has UCX operations in flight it sits in the transport's in-flight
 * list.
 */
#ifndef PT_TRANSPORT_INTERNAL_H
#define PT_TRANSPORT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include <ucp/api/ucp.h>

#include "comm/auth.h"
#include "comm/transport.h"
#include "runtime/error.h"

#define TEXT_CAPACITY 256
#define REASON_CAPACITY 160  /* why a peer is gone */
#define MESSAGE_CAPACITY 512 /* a request's failure */
#define WHO_CAPACITY 96 /* "rank R (pid P on HOST)": a peer, in log lines */
/* The longest UCX worker address a hello carries (UCX 1.13: a few dozen bytes per device). */
#define WORKER_ADDRESS_MAX (PT_TRANSPORT_ADDRESS_MAX / 2)
#define CONTROL_BYE 0x45594221u
#define CONTROL_BYE_ACK 0x4b434121u
#define CONTROL_DIRECT_OK 0x4b4f5244u /* "I can read your memory" */
/* "I copy device memory of kind K from you": the high half, and K's 16-bit hash below it. */
#define CONTROL_DEVICE_OK 0x56440000u
#define CONTROL_DEVICE_MASK 0xffff0000u
/* Payloads of at least this many bytes go by direct read where the peer can
 * (transport_direct.c). */
#define DIRECT_MIN_BYTES (64u << 10)
/* An idle progress thread still wakes this often (UCX keepalive, handshake deadlines). */
#define IDLE_WAKE_MS 1000

/* ---- types --------------------------------------------------------------- */

typedef enum peer_state { PEER_UNKNOWN, PEER_ALIVE, PEER_DEAD, PEER_LEFT } peer_state;

typedef struct connection connection;

/* A connection's message keys (transport_mac.c), from its handshake. */
typedef struct message_keys {
    int ready;
    uint8_t send[PT_AUTH_KEY_BYTES], receive[PT_AUTH_KEY_BYTES];
    uint64_t sent;      /* sequence numbers used so far, to this peer */
    uint64_t highest;   /* the highest sequence number received from it */
    uint64_t *window;   /* which of the REPLAY_WINDOW numbers up to `highest` came */
} message_keys;

typedef struct peer {
    peer_state state;
    /* Counts the processes that stood for this rank (pt_transport_forget_peer starts the next):
     * a connection stands for the rank only while its own number is this one. */
    unsigned incarnation;
    message_keys keys; /* under pt_transport_state_lock */
    connection *conn; /* the endpoint we send on while ALIVE */
    pid_t read_pid;   /* > 0: its memory is readable from here (direct reads), at this pid */
    int reads_us;     /* it said it can read ours: send it descriptors in place of payloads */
    uint32_t copies_our_device; /* its CONTROL_DEVICE_OK word: the kind of device memory it
                                 * copies from us (0: none) */
    char who[WHO_CAPACITY];
    char reason[REASON_CAPACITY]; /* why it is DEAD or LEFT */
    char mismatch[TEXT_CAPACITY]; /* not "": a process of this rank was refused for another
                                   * protocol version or job digest (until one connects) */
} peer;

/* The handshake's messages, in order (transport_connect.c). */
typedef enum hello_stage {
    HELLO_DIAL = 1,
    HELLO_ANSWER = 2,
    HELLO_CONFIRM = 3,
    HELLO_REFUSED = 4, /* the dialler's answer to a wrong proof: it proves nothing itself */
} hello_stage;

/* The handshake's messages between two ranks (tagged messages of this fixed size): the
 * dialler's nonce; the answerer's nonce and proof; the dialler's proof (auth.h). */
typedef struct hello {
    uint32_t magic, version, job;
    int32_t rank;
    uint32_t stage; /* hello_stage */
    /* The sender's build and settings (runtime/job_digest.h): the other side refuses a peer
     * that differs. REFUSED: refused_settings 1 for a refusal of those (0: of the proof). */
    uint32_t protocol, refused_settings;
    uint64_t digest[PT_DIGEST_PARTS];
    uint8_t nonce[PT_AUTH_NONCE_BYTES]; /* DIAL, ANSWER: the sender's challenge */
    uint8_t proof[PT_AUTH_PROOF_BYTES]; /* ANSWER, CONFIRM: the sender's proof */
    /* For same-host direct reads: who we are, and a word the peer may try to read back. */
    int32_t pid;
    uint32_t reserved;
    uint64_t probe_address, probe_word;
    uint8_t boot_id[16];
    char host[64]; /* the sender's host name, for log lines only */
    /* The sender's UCX worker address: the side that did not dial connects back to it. */
    uint32_t address_length, reserved2;
    uint8_t address[WORKER_ADDRESS_MAX];
} hello;

/* A control word on a connection's stream (CONTROL_*: goodbyes, the direct-read offer):
 * pt_control_record (transport.h), sealed by transport_mac.c. */
typedef pt_control_record control_record;

/* Sent in place of a payload to a peer that reads it from our memory. */
typedef struct direct_descriptor {
    uint32_t magic, ack_id;
    uint64_t address, nbytes;
} direct_descriptor;

/* Sent in place of a device payload to a peer that copies it (transport_device.c). */
typedef struct device_descriptor {
    uint32_t magic, ack_id;
    uint64_t nbytes;
    pt_peer_memory memory;
} device_descriptor;

/* The receiver's answer to a descriptor; it completes the send. */
enum { ACK_READ = 0, ACK_REFUSED = 1, ACK_FAILED = 2 };
typedef struct direct_ack {
    uint32_t magic, ack_id;
    int32_t status; /* ACK_*: read; refused (its header was refused, nothing read); read failed */
    uint32_t reserved;
    uint64_t sequence; /* its seal (transport_mac.c) */
    uint8_t mac[PT_MESSAGE_MAC_BYTES];
} direct_ack;

/* A listening socket of UCX's TCP transport (transport_listeners.c). */
typedef struct ucx_listener {
    int fd;
    ino_t inode; /* so that a reused fd number is not taken for it */
    struct sockaddr_storage local;
    int port;
} ucx_listener;

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
    int accepted; /* created for a peer whose hello reached us first (it dialled) */
    int authenticated; /* its hello passed; the endpoint is being flushed, or was */
    int rank;     /* the peer's: expected (we dialled) or from its authenticated hello */
    char who[WHO_CAPACITY];
    conn_state state;
    double deadline; /* of the handshake */
    hello hello_out, hello_in; /* ours, sent (DIAL or ANSWER); the peer's (DIAL or ANSWER) */
    hello confirm_out;         /* our CONFIRM (or REFUSED), when we dialled */
    uint8_t nonce[PT_AUTH_NONCE_BYTES];      /* our challenge to the peer */
    uint8_t peer_nonce[PT_AUTH_NONCE_BYTES]; /* the peer's challenge to us */
    uint8_t target[WORKER_ADDRESS_MAX]; /* the peer's worker address (we dial) */
    size_t target_length;
    control_record control_in;
    int peer_left;  /* it said goodbye on this endpoint */
    unsigned incarnation; /* the rank's process it reached (peer.incarnation when it was ready) */
    int ops;        /* UCX operations in flight with this connection as user data */
    int bye_sent, bye_acked;
    /* Outcome of the handshake, for a pt_transport_connect() caller; under
     * pt_transport_state_lock. */
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
    /* Completion, under pt_transport_state_lock. result and message are written by the
     * progress thread before state leaves PENDING and are constant after. */
    request_state state;
    pipert_result result;
    char message[MESSAGE_CAPACITY];
    pt_request_callback callback;
    void *callback_arg;
    int free_requested; /* pt_request_free() called from the request's own callback */
    /* Cancel commands queued for it and not yet run: it is not freed before
     * they ran (the progress thread reads it then, whatever became of it). */
    int commands;
    int free_when_idle; /* freed as the last command ends */
    /* UCX side, under ucx_lock. */
    pt_message_header header; /* send: as sent; receive: as received */
    ucp_dt_iov_t iov[2];
    ucp_tag_recv_info_t info;
    const void *payload; /* send */
    void *buffer;        /* receive */
    /* Device payloads (transport_device.c). Send: the payload is device memory. Receive: where
     * a device payload goes (NULL: this receive takes bytes only), and whether it went there. */
    int device_payload;
    void *device_buffer;
    int on_device;
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
    device_descriptor device;
    direct_ack ack;
    int ops_pending; /* send: header and payload parts (and a direct send's ack) in flight */
    int failed;      /* a failure was recorded in result/message */
    pipert_result cancel_result;
    char cancel_reason[TEXT_CAPACITY];
    int in_flight;
    pt_request *prev, *next; /* the transport's in-flight list (under ucx_lock) */
};

typedef enum command_op { COMMAND_POST, COMMAND_CANCEL, COMMAND_CONNECT, COMMAND_DROP } command_op;

typedef struct command {
    command_op op;
    pt_request *request;
    connection *conn;
    int rank;                      /* DROP: the peer, and why */
    char reason[REASON_CAPACITY];
    struct command *next;
} command;

struct pt_transport {
    int rank;
    uint32_t job;
    pt_job_identity identity; /* what every peer's hello must match */
    pt_auth_key key; /* from the job's secret (auth.h); the secret itself is not kept */
    double connect_timeout_s;
    char host[64];
    /* Our UCX worker address, and as text (pt_transport_address). */
    uint8_t worker_address[WORKER_ADDRESS_MAX];
    size_t worker_address_length;
    char address_text[2 * WORKER_ADDRESS_MAX + 1];

    /* Same-host direct reads: whether UCX_TLS allows them, what our hellos offer, and the id of
     * the next descriptor (under ucx_lock). */
    int direct_allowed;
    uint64_t probe_word;
    uint8_t boot_id[16];
    uint32_t next_ack_id;
    /* Device payloads: the table's peer functions once pt_transport_use_device_memory, and the
     * CONTROL_DEVICE_OK word of their kind (set under ucx_lock). */
    const pt_device_memory *device;
    uint32_t device_word;

    ucp_context_h context;
    ucp_worker_h worker;
    /* UCX's listening sockets; those of the process before the worker was created. */
    ucx_listener *listeners;
    int n_listeners;
    ino_t *listening_before;
    int n_listening_before;
    int worker_fd, wake_fd, epoll_fd;
    pthread_t thread;
    /* 1 while the progress thread sleeps (or is about to) in epoll: only then does a queued
     * command need a write to wake_fd. */
    atomic_int in_epoll;
    /* When the progress thread last finished its upkeep (pt_now_s() in milliseconds): a caller
     * that waited on it in vain says how long ago that was. */
    atomic_llong upkeep_ms;
    /* Threads in pt_request_wait driving UCX (under pt_transport_state_lock): release waits. */
    int pollers;

    /* Under pt_transport_state_lock. */
    peer *peers;
    int peer_capacity;

    /* Held by whoever calls into UCX: the progress thread, except while it
     * sleeps in epoll, or a user thread posting directly (see pt_transport_submit()). */
    pthread_mutex_t ucx_lock;

    /* Under queue_lock. */
    pthread_mutex_t queue_lock;
    command *queue_head, *queue_tail;
    int stopping;

    /* Under ucx_lock. */
    connection *connections;
    pt_request *in_flight;
    /* Every rank's hello arrives in one wildcard receive (transport_connect.c). */
    hello hello_in;
    void *hello_op;
    int hello_posting, hello_ready, hello_closed;
    ucs_status_t hello_status; /* of the receive, once hello_ready */
    ucp_tag_recv_info_t hello_info;

    /* Bytes sent, by link class: peers marked remote (another site) or not.
     * The marks are set before traffic starts and only read afterwards. */
    uint8_t *remote_peers; /* bitmap over ranks, or NULL: none remote */
    int authenticate_messages; /* every message carries a MAC (transport_mac.c) */
    _Atomic uint64_t bytes_local, bytes_remote;
};

/* kind (8) | source rank (23) | part (1) | user tag (32) */
enum { PART_HEADER = 0, PART_PAYLOAD = 1 };
/* The kind of transport-internal tagged messages (user kinds are 1..255): hellos are its
 * headers (transport_connect.c), direct-read acknowledgements its payloads
 * (transport_direct.c). */
#define KIND_INTERNAL 0u

static inline ucp_tag_t pt_transport_make_tag(unsigned kind, int src_rank, int part,
                                              uint32_t user_tag)
{
    return ((ucp_tag_t)(kind & 0xff) << 56) | ((ucp_tag_t)((unsigned)src_rank & 0x7fffff) << 33) |
           ((ucp_tag_t)part << 32) | user_tag;
}

/* ---- shared between the files -------------------------------------------- */

#pragma GCC visibility push(hidden)

/* transport.c: the process-wide state lock and its condition variable (see Threads above). */
extern pthread_mutex_t pt_transport_state_lock;
extern pthread_cond_t pt_transport_state_changed;
pipert_result pt_transport_ucx_fail(ucs_status_t status, const char *what);

#pragma GCC visibility pop

#endif
