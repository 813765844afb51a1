/* The data plane between worker processes: tagged, checked, non-blocking
 * tensor messages over UCX (ucp).
 *
 * One pt_transport per process owns a ucp context, one worker and a progress
 * thread; it opens no listening socket of its own (UCX's TCP transport does:
 * see Connections). One thread at a time calls into UCX
 * (the worker runs in serialized mode): the progress thread, which drains a
 * queue of commands that other threads post; or, while the progress thread
 * sleeps, a thread posting a send or receive directly (an eager send then
 * completes without any thread hand-off). When there is nothing to do the
 * progress thread sleeps in epoll on the worker's event fd (armed with
 * ucp_worker_arm) and on an eventfd that posting threads write; it wakes at
 * least once a second for housekeeping (handshake deadlines).
 *
 * Connections. Each process has a rank. A bootstrap hands every process the
 * others' pt_transport_address() (its UCX worker address as hexadecimal text);
 * pt_transport_connect() opens an endpoint to one of them. The two then prove
 * to each other that they know the job's secret, without sending it: the
 * dialler's nonce, the other's nonce and proof, the dialler's proof
 * (challenge and response with HMAC-SHA-256 under a key derived from the
 * secret: comm/auth.h; transport_connect.c has the three messages).
 * A peer whose proof is wrong is refused: logged with pt_warn, naming the
 * rank, pid and host it claims; a dialler that meets an impostor fails at
 * once (PIPERT_ERR_AUTH), one that is refused by its timeout. Messages after
 * the handshake are not authenticated. The hellos also carry each side's protocol version
 * and job digest (runtime/job_digest.h): a peer of another build or with other settings is
 * refused on both sides, naming its rank and what differs, once its proof is checked (the
 * dialler's connect fails with PIPERT_ERR_CONFIG, the other side's pt_transport_wait_peer for
 * it too).
 *
 * Strangers. There is no sockaddr listener (ucp_listener): UCX 1.13's TCP
 * connection manager behind it aborts the process on the first bytes of a
 * connection whenever their header announces less than arrived (64 zero
 * bytes do it). UCX's TCP transport still listens, on each network device,
 * for the endpoints of worker addresses; it closes connections that do not
 * begin with its magic number, but asserts (aborts) on a malformed message
 * after it. That listening socket is UCX's, not ours: pt_transport_stop_listening
 * closes it to strangers once every peer is connected (docs/ARCHITECTURE.md,
 * "Connections, and strangers").
 *
 * Messages. A message is a pt_message_header followed by nbytes of payload.
 * The receiver posts pt_recv() with an expectation (kind, dtype, shape) and a
 * buffer of `capacity` bytes; the header is checked against the expectation
 * before the payload is trusted, and a header can never make the receiver
 * accept more than `capacity` bytes:
 *   - payloads of at most PT_TRANSPORT_INLINE_BYTES travel in one tagged
 *     message with the header; the receive is posted with room for exactly
 *     header + min(capacity, PT_TRANSPORT_INLINE_BYTES), so UCX truncates
 *     (and we refuse) anything longer;
 *   - larger payloads travel as a header message and then a payload message
 *     under a sibling tag; the payload receive is posted into the caller's
 *     buffer only after the header passed, with the header's nbytes (which
 *     is <= capacity). A refused header's payload is drained into a
 *     zero-length receive: UCX drops it without the receiver allocating it.
 *   - between two processes of one host that can read each other's memory
 *     (checked in the hello: boot id, pid and a probe word read back), a
 *     payload of 64 KiB or more travels as a small descriptor instead: the
 *     receiver copies it straight out of the sender's memory
 *     (process_vm_readv, one copy, as UCX's cma does) and acknowledges, and
 *     only the acknowledgement completes the send. UCX 1.13 offers no
 *     shared-memory transport to endpoints with peer error handling, which
 *     pipert needs to notice dead peers; this path stands in for it. It is
 *     off where UCX_TLS excludes cma (UCX_TLS=tcp between emulated sites), and
 *     a sender that left or died before the copy fails the receive with
 *     PIPERT_ERR_PEER. Acknowledgements use kind 0, internally.
 * A refused message completes the request with PIPERT_ERR_PEER and a message
 * naming the peer's rank and the offending field (magic, version, job,
 * src_rank, kind, dtype, shape, nbytes, flags, checksum); an inline payload may
 * already have been written to the first min(capacity, 4096) bytes of the
 * buffer, which is why the buffer is only to be trusted after success.
 *
 * Device payloads. Tensors in device memory (a GPU's; runtime.device=cpu-guarded's on any
 * machine) between two processes of one host go device to device: once the session hands the
 * transport its kernel table's peer functions (pt_transport_use_device_memory), a side that
 * can read a peer's memory (direct reads, above) tells it "I copy device memory of kind K from
 * you" (a control word); a sender whose kind is K may then pt_send_device a device buffer of
 * more than PT_TRANSPORT_INLINE_BYTES: its header (flag PT_MESSAGE_DEVICE_PAYLOAD, no
 * checksum) and, as the payload part, a descriptor naming the memory (runtime/peer_memory.h:
 * a CUDA IPC handle and offset). The receiver, posted with pt_recv_device (a host buffer and a
 * device buffer), copies it into the device buffer with the table's peer_copy and answers as
 * for a direct read: only the answer completes the send, so the sender keeps the buffer
 * untouched until then. A message that came as bytes (the offer not yet heard, another
 * host) lands in the host buffer instead; pt_request_on_device says which. Off under
 * authenticate_messages (a MAC covers the payload's bytes, which the host never sees) and
 * where direct reads are off (UCX_TLS without cma).
 *
 * Tags are 64 bits: kind (8) | source rank (23) | part (1: header or
 * payload) | user tag (32), so messages between a pair with different kinds
 * or user tags never match each other; messages with equal tags from one
 * peer match receives in the order they were sent.
 *
 * Failure. Endpoints use UCX peer error handling: an endpoint error marks the
 * peer dead, its pending receives fail with PIPERT_ERR_PEER naming the rank,
 * and later sends and receives to it fail at once. A peer that shuts down
 * with pt_transport_destroy() says goodbye first and is marked "left"
 * (same errors, no warning). Messages it sent before it left (or died) that
 * already arrived are still delivered to receives posted later. Dead stays
 * dead until pt_transport_forget_peer: a new process of that rank (elastic
 * replicas rejoining) may then connect, proving the job's secret like any.
 *
 * Environment: UCX reads its own UCX_* variables (UCX_TLS=tcp restricts the
 * transports, e.g. between emulated sites); pipert changes no UCX default.
 */
#ifndef PT_TRANSPORT_H
#define PT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/error.h"
#include "runtime/job_digest.h"
#include "runtime/peer_memory.h"

/* ---- the message header -------------------------------------------------- */

#define PT_MESSAGE_MAGIC 0x314d5450u /* "PTM1" read as little-endian bytes */
#define PT_MESSAGE_VERSION 2u
#define PT_MESSAGE_MAC_BYTES 16
#define PT_MESSAGE_MAX_DIMS 4

/* Fixed layout, host byte order (every host of a job must share it; a peer
 * that does not fails the magic check). */
typedef struct pt_message_header {
    uint32_t magic, version;
    uint16_t kind, dtype; /* a pt_message_kind; a pt_dtype (runtime/safetensors.h) */
    uint32_t job;         /* the job id: receivers refuse other jobs' messages */
    int32_t replica, stage, microbatch, src_rank;
    int64_t step, weight_version;
    int32_t ndim;   /* 0..PT_MESSAGE_MAX_DIMS */
    uint32_t flags; /* PT_MESSAGE_* below (was padding: zero from older builds) */
    int64_t shape[PT_MESSAGE_MAX_DIMS];
    uint64_t nbytes;   /* prod(shape) * dtype size */
    uint64_t checksum; /* pt_checksum64 of the payload, or 0 for none */
    /* With authenticate_messages (the transport's options): the sender's count of messages
     * to this receiver, and the MAC of header and payload (0: none; transport_mac.c). */
    uint64_t sequence;
    uint8_t mac[PT_MESSAGE_MAC_BYTES];
} pt_message_header;

/* What a message carries; the transport only needs kinds to be 1..255.
 * Modules above add their own from PT_KIND_FIRST_FREE on. */
typedef enum pt_message_kind {
    PT_KIND_ACTIVATION = 1,      /* pipeline: activations forward */
    PT_KIND_ACTIVATION_GRAD = 2, /* pipeline: gradients backward */
    PT_KIND_COLLECTIVE = 3,      /* runtime/collectives */
    PT_KIND_WEIGHTS = 4,         /* parameters or their deltas between replicas */
    PT_KIND_FIRST_FREE = 16,
    PT_KIND_MAX = 255
} pt_message_kind;

/* Header flags. DEVICE_PAYLOAD: the payload stays in the sender's device memory and comes as
 * a device descriptor (Device payloads, above): no checksum, since the bytes never reach a
 * host. */
enum { PT_MESSAGE_DEVICE_PAYLOAD = 1u, PT_MESSAGE_KNOWN_FLAGS = PT_MESSAGE_DEVICE_PAYLOAD };

/* Payloads up to this many bytes travel in the header's message. */
#define PT_TRANSPORT_INLINE_BYTES 4096

/* A fast 64-bit checksum of a payload (4 lanes of multiply-rotate mixing in
 * the style of xxHash64; not bit-compatible with it). Never returns 0, which
 * in a header means "no checksum". */
uint64_t pt_checksum64(const void *data, size_t nbytes);

/* ---- the transport ------------------------------------------------------- */

typedef struct pt_transport pt_transport;

typedef struct pt_transport_options {
    int rank;                 /* this process's rank, 0 <= rank < PT_TRANSPORT_MAX_RANKS */
    const char *secret;       /* the job's shared secret, 1..PT_TRANSPORT_SECRET_MAX bytes */
    uint32_t job;             /* the job id carried in every header */
    double connect_timeout_s; /* deadline of a connection's hello exchange */
    /* Every message to and from every peer carries a MAC under keys of its connection (drawn
     * from the handshake), and a sequence number that a replay cannot reuse; a message
     * without one, or with a wrong or used one, is refused naming the peer. Both sides must
     * agree (transport_mac.c). */
    int authenticate_messages;
    /* What every peer's hello must match (runtime/job_digest.h): protocol 0 stands for this
     * build's (PT_PROTOCOL_VERSION; another value is for tests); without a digest the settings
     * are not compared. */
    pt_job_identity identity;
} pt_transport_options;

#define PT_TRANSPORT_MAX_RANKS (1 << 20)
#define PT_TRANSPORT_SECRET_MAX 128
#define PT_TRANSPORT_OPTIONS_INIT                                                                  \
    {                                                                                              \
        .rank = -1, .secret = NULL, .job = 0, .connect_timeout_s = 30.0,                           \
        .authenticate_messages = 0, .identity = {0}                                                \
    }

/* Creates the ucp context and worker, and starts the progress thread. */
pipert_result pt_transport_create(const pt_transport_options *options, pt_transport **out);

/* Says goodbye to every connected peer, closes the endpoints (waiting a
 * bounded time for them to flush), fails requests still pending with
 * PIPERT_ERR_INTERRUPTED, stops the thread and releases UCX. Requests that
 * were not freed stay valid for pt_request_test/wait/free only. */
void pt_transport_destroy(pt_transport *t);

int pt_transport_rank(const pt_transport *t);

/* The text that peers pass to pt_transport_connect(): this worker's UCX
 * address in hexadecimal, at most PT_TRANSPORT_ADDRESS_MAX characters. */
#define PT_TRANSPORT_ADDRESS_MAX 8192
const char *pt_transport_address(const pt_transport *t);

/* Connects to `peer_rank` at its pt_transport_address() and exchanges hellos;
 * returns when the peer is authenticated (PIPERT_OK), fails or is unreachable
 * (PIPERT_ERR_TRANSPORT), proves it does not know the secret (PIPERT_ERR_AUTH),
 * the address is malformed (PIPERT_ERR_INVALID_ARG) or
 * the connect timeout passed (PIPERT_ERR_TIMEOUT: also what a peer that refused
 * our hello, for another secret or job, leads to; it logs why), or the peer is of another
 * protocol version or job digest (PIPERT_ERR_CONFIG, naming what differs). Peers that
 * connect to us need no call: the progress thread answers them. */
pipert_result pt_transport_connect(pt_transport *t, int peer_rank, const char *address);

/* Waits until `peer_rank` is connected in either direction (PIPERT_OK), is
 * known dead (PIPERT_ERR_PEER), was refused for another protocol version or job
 * digest (PIPERT_ERR_CONFIG) or timeout_s passed (PIPERT_ERR_TIMEOUT). */
pipert_result pt_transport_wait_peer(pt_transport *t, int peer_rank, double timeout_s);

/* The usual bootstrap for a group of n_ranks processes that all know every
 * address (addresses[r] for rank r): connects to every lower rank, then waits
 * for every higher rank to connect to us, all within timeout_s. */
pipert_result pt_transport_connect_all(pt_transport *t, int n_ranks, const char *const *addresses,
                                       double timeout_s);

/* Every peer this process will ever have is connected: closes the listening
 * sockets of UCX's TCP transport to new connections (their packets are dropped
 * by a socket filter from now on), and to connections that have not sent a
 * byte yet, so that no stranger's bytes reach UCX any more (why: Strangers,
 * above). Connections already made go on. Call it once every peer has
 * connected to this process, and has flushed (pt_transport_connect and
 * pt_transport_wait_peer return after that), e.g. after a barrier with them. */
pipert_result pt_transport_stop_listening(pt_transport *t);

/* Opens UCX's listening sockets again, for a new peer (a replica rejoining an
 * elastic job): pt_transport_stop_listening closes them once it is in. A
 * connection in either direction needs both sides' sockets open: the side
 * that answers a hello dials the other's worker address back. */
pipert_result pt_transport_listen_again(pt_transport *t);

/* The job's membership says that `peer_rank`'s process is gone while its
 * connection still looks alive (a site cut off: UCX notices when its
 * keepalive times out, which may be after a new process of the rank is
 * back): its connections close and it is marked failed with `reason`, as an
 * endpoint error would mark it, so that pt_transport_forget_peer may replace
 * it. Its pending receives fail. Returns once done; a rank that is not alive
 * is left as it is. */
pipert_result pt_transport_drop_peer(pt_transport *t, int peer_rank, const char *reason);

/* Forgets a rank that failed or left (nothing waits on it any more: its
 * receives failed), so that a new process of that rank can connect under the
 * same rank; what its connection class was (pt_transport_mark_remote) stays.
 * PIPERT_ERR_INVALID_ARG for a rank that is alive. */
pipert_result pt_transport_forget_peer(pt_transport *t, int peer_rank);

/* 1 while `peer_rank` is connected and has neither failed nor left. */
int pt_transport_peer_alive(pt_transport *t, int peer_rank);

/* Link classes: traffic to a peer marked remote (in another site, behind a
 * slow link) is counted apart from the rest. Mark before sending to it
 * (not thread-safe against concurrent sends). */
pipert_result pt_transport_mark_remote(pt_transport *t, int peer_rank);

/* Payload bytes sent so far (headers not counted) to peers not marked
 * remote, and to those marked remote. */
void pt_transport_bytes_sent(pt_transport *t, uint64_t *local, uint64_t *remote);

/* ---- requests ------------------------------------------------------------ */

typedef struct pt_request pt_request;

/* What a receive accepts. Anything else completes it with PIPERT_ERR_PEER. */
typedef struct pt_recv_expect {
    uint16_t kind; /* required kind (1..PT_KIND_MAX) */
    int32_t dtype; /* required pt_dtype, or -1 for any */
    int32_t ndim;  /* -1: any shape (only the capacity bounds it); else the exact shape */
    int64_t shape[PT_MESSAGE_MAX_DIMS];
    int require_checksum; /* refuse messages sent without a checksum */
} pt_recv_expect;

/* Send flags. */
enum { PT_SEND_CHECKSUM = 1 }; /* compute and send pt_checksum64 of the payload */

/* Sends `payload` (header->nbytes bytes, which must equal prod(shape) * dtype
 * size) to dst_rank under (header->kind, user_tag). The caller fills kind,
 * dtype, ndim, shape, nbytes and the free fields (replica, stage, microbatch,
 * step, weight_version); the transport sets magic, version, job, src_rank and
 * checksum. The payload must stay untouched until the request completes. */
pipert_result pt_send(pt_transport *t, int dst_rank, uint32_t user_tag,
                      const pt_message_header *header, const void *payload, unsigned flags,
                      pt_request **out);

/* Sends `header` exactly as given (no field is filled in or checked), with
 * header->nbytes bytes of payload: for fault-injection tests of receivers. */
pipert_result pt_send_raw(pt_transport *t, int dst_rank, uint32_t user_tag,
                          const pt_message_header *header, const void *payload, pt_request **out);

/* A control record on a connection's stream: a goodbye, its answer, or the direct-read offer
 * (transport_connect.c), with the seal of runtime.authenticate_messages (a sequence number
 * from the messages' count and a MAC; zeros without). */
typedef struct pt_control_record {
    uint32_t word, reserved;
    uint64_t sequence;
    uint8_t mac[PT_MESSAGE_MAC_BYTES];
} pt_control_record;

/* For fault-injection tests of receivers: a control record of `word` to `rank`, sealed as
 * the transport seals its own (it uses up a sequence number); and sending a record to `rank`
 * exactly as given. */
pipert_result pt_transport_seal_control(pt_transport *t, int rank, uint32_t word,
                                        pt_control_record *out);
pipert_result pt_transport_send_control_raw(pt_transport *t, int rank,
                                            const pt_control_record *record);

/* ---- device payloads (Device payloads, above) ---------------------------- */

/* A kernel table's functions for memory peers copy from (kernels/kernels.h), and its kind:
 * two processes copy from each other only if their kinds are equal. */
typedef struct pt_device_memory {
    const char *kind; /* the table's name: "cuda", "cpu-guarded" */
    pipert_result (*export_memory)(const void *device, pt_peer_memory *out);
    pipert_result (*copy_from_peer)(void *device_dst, const pt_peer_memory *src, size_t bytes);
} pt_device_memory;

/* From now on this transport copies device payloads from peers that send them, and sends its
 * own to peers that copy them: it tells each peer whose memory it can read (and every such
 * peer that connects later) that it copies device memory of d->kind. `d` must outlive the
 * transport. Does nothing under authenticate_messages or where direct reads are off. */
void pt_transport_use_device_memory(pt_transport *t, const pt_device_memory *d);

/* 1 if `rank` said it copies device memory of this transport's kind from us (and is alive):
 * pt_send_device may send it device buffers. */
int pt_transport_peer_copies_device_memory(pt_transport *t, int rank);

/* 1 if this transport copies device memory from `rank` (it uses device memory, the peer is
 * alive and its memory readable from here): it has told the peer so, or tells it as soon as
 * their connection is ready. The other half of pt_transport_peer_copies_device_memory, known
 * here without waiting for a message. */
int pt_transport_copies_device_memory_from(pt_transport *t, int rank);

/* pt_send for a payload in device memory, to a peer that copies it (PIPERT_ERR_INVALID_ARG for
 * a live peer that does not, or a payload of at most PT_TRANSPORT_INLINE_BYTES: stage those
 * through the host; a peer that failed or left fails the request as pt_send's does). The device work that wrote the payload must have finished (synchronize first); the
 * payload stays untouched until the request completes. */
pipert_result pt_send_device(pt_transport *t, int dst_rank, uint32_t user_tag,
                             const pt_message_header *header, const void *device_payload,
                             pt_request **out);

/* pt_recv into `host_buffer`, or, for a device payload (from a peer this transport told it
 * copies device memory), into `device_buffer`: both of `capacity` bytes. Without device memory
 * in use (pt_transport_use_device_memory) it is pt_recv into host_buffer. */
pipert_result pt_recv_device(pt_transport *t, int src_rank, uint32_t user_tag,
                             const pt_recv_expect *expect, void *host_buffer, void *device_buffer,
                             size_t capacity, pt_request **out);

/* 1 if a completed pt_recv_device's payload is in its device buffer, 0 if in its host one. */
int pt_request_on_device(const pt_request *request);

/* Receives one message of expect->kind and user_tag from src_rank into
 * `buffer` (capacity bytes). On success pt_request_header() describes it. */
pipert_result pt_recv(pt_transport *t, int src_rank, uint32_t user_tag,
                      const pt_recv_expect *expect, void *buffer, size_t capacity,
                      pt_request **out);

/* 1 and *result set if the request has completed, else 0. On failure the
 * request's message also becomes this thread's pipert_last_error(). */
int pt_request_test(pt_request *request, pipert_result *result);

/* Blocks (without spinning) until the request completes or timeout_s passes
 * (timeout_s < 0: no limit); returns its result, or PIPERT_ERR_TIMEOUT with
 * the request still pending. */
pipert_result pt_request_wait(pt_request *request, double timeout_s);

/* Calls fn(request, result, arg) once the request completes: right away on
 * this thread if it already has, else on whichever thread completes it (the
 * progress thread, a thread posting a request at that moment, or one driving
 * UCX briefly inside pt_request_wait), with the
 * transport's UCX lock held. So fn must be short and must not wait on
 * requests (pt_request_wait fails there with PIPERT_ERR_INTERNAL); it may
 * post new ones (they are queued), and it may free `request`. */
typedef void (*pt_request_callback)(pt_request *request, pipert_result result, void *arg);
void pt_request_on_complete(pt_request *request, pt_request_callback fn, void *arg);

/* The failure message of a completed request ("" if it succeeded); also valid
 * inside its callback. */
const char *pt_request_error(const pt_request *request);

/* The header of a completed receive (magic..checksum as received). */
const pt_message_header *pt_request_header(const pt_request *request);

/* Asks a pending receive to stop; it completes with PIPERT_ERR_INTERRUPTED
 * unless its message already matched. Sends cannot be cancelled. */
void pt_request_cancel(pt_request *request);

/* Releases a request. A pending receive is cancelled first; a pending send is
 * waited for (it ends when the peer takes it or fails), since its payload may
 * still be read. */
void pt_request_free(pt_request *request);

/* Releases a request without waiting: a pending receive is cancelled, and a
 * request still pending is freed when it ends (a send, when its peer takes it
 * or fails, or the transport closes). A pending send's payload must stay
 * readable until then: for a peer that will never take it (it gave the
 * collective up), nothing reads it, but its memory must not be unmapped while
 * the transport lives (on the same host the peer reads it directly). */
void pt_request_abandon(pt_request *request);

#endif
