/* pt_exchange: a non-blocking mean over a group of one float vector, with a
 * codec (dp/codec.h), for the asynchronous coupling methods (ALGORITHMS.md
 * §4.2–§4.6).
 *
 * Start it, compute, then collect the mean: everything after the start runs
 * from request callbacks on the transport's progress thread (decoding and
 * averaging included). Reduction is in fp32 and each phase quantizes once;
 * nothing is re-quantized hop by hop. Every member gets the bitwise same mean.
 *
 *   none                the ring all-reduce of comm/collectives.h
 *                       (fp32 all the way).
 *   int8, e3m0, e2m1    each member encodes its vector once; the encodings
 *                       are all-gathered; every member decodes them and adds
 *                       them in member order in fp32, then divides by n.
 *   onebit              the two-phase collective of 1-bit Adam/LAMB: with
 *                       W members the vector is padded to N, a multiple of
 *                       8W, and cut into W chunks of C = N/W elements (the
 *                       padding is layout only: padded positions carry no
 *                       value, have no error and count in no scale).
 *                         1. each member adds its worker error to its
 *                            vector and encodes it with one scale (onebit,
 *                            worker error feedback); chunk j's signs, with
 *                            that scale, go to member j (all-to-all);
 *                         2. member j decodes the W chunks it got, adds them
 *                            in member order and divides by W, then encodes
 *                            that once more with its server error (server
 *                            error feedback);
 *                         3. the W compressed chunks are all-gathered and
 *                            decoded.
 *                       The error buffers live in a pt_exchange_state that
 *                       outlives the exchanges (save it in checkpoints).
 * An empty vector ends at once, without messages.
 *
 * Members start the group's exchanges and other collectives in the same order
 * (collectives.h); an exchange reserves all its collectives' places in that
 * order when it starts.
 */
#ifndef PT_EXCHANGE_H
#define PT_EXCHANGE_H

#include <stddef.h>

#include "dp/codec.h"
#include "comm/collectives.h"

/* ---- the error feedback of onebit ---------------------------------------- */

/* The error buffers of one stream of onebit exchanges (one vector of n
 * elements over one group): worker error [n], and the server error of this
 * member's chunk. Both start at zero. One exchange at a time may use it; it
 * stays alive while one does, even if freed meanwhile. */
typedef struct pt_exchange_state pt_exchange_state;

pipert_result pt_exchange_state_create(const pt_group *g, size_t n, pt_exchange_state **out);
void pt_exchange_state_free(pt_exchange_state *s);

/* The buffers, to save and restore (between exchanges only). *count gets
 * their length: n for the worker error; for the server error, the elements
 * of this member's chunk that are inside the vector (0 for a chunk of
 * padding only). */
float *pt_exchange_state_worker_error(pt_exchange_state *s, size_t *count);
float *pt_exchange_state_server_error(pt_exchange_state *s, size_t *count);

/* ---- the exchange --------------------------------------------------------- */

typedef struct pt_exchange pt_exchange;

/* Starts the mean over g of data[0..n) (the same n on every member). `data`
 * is encoded or copied before this returns and may be reused at once; the
 * mean is written to out[0..n) (which may be `data`) just before the
 * exchange ends, and never after pt_exchange_abandon returned. `state` is
 * required by onebit (created for this group and n), ignored otherwise (may
 * be NULL). A NaN or infinity in data is refused (PIPERT_ERR_INVALID_ARG,
 * naming the element), as is a state that is busy or of another shape; a
 * refused start sends nothing. */
pipert_result pt_exchange_start(pt_group *g, const pt_codec *codec, pt_exchange_state *state,
                                const float *data, size_t n, float *out, pt_exchange **handle);

/* Bytes this member sends for the exchange (payloads, without message
 * headers): none, pt_allreduce_bytes_sent(n floats); int8/e3m0/e2m1,
 * (W−1)·pt_codec_encoded_bytes(n); onebit, 2(W−1)·(4 + C/8). Valid until the
 * handle is waited for or abandoned. */
size_t pt_exchange_bytes_sent(const pt_exchange *handle);

/* 1 once the exchange has ended (a wait returns at once), else 0. */
int pt_exchange_test(pt_exchange *handle);

/* Waits for the exchange and releases the handle; returns its result. */
pipert_result pt_exchange_wait(pt_exchange *handle);

/* Waits at most timeout_s: PIPERT_ERR_TIMEOUT (no message set, the handle
 * still live) if the exchange has not ended, else as pt_exchange_wait. */
pipert_result pt_exchange_wait_for(pt_exchange *handle, double timeout_s);

/* Gives up waiting (a stop request): `out` is not written after this returns
 * (if the mean is being written at that moment, which takes no network, this
 * waits for that), and the state may be freed at once. The exchange still
 * runs its part with the peers and frees itself when it ends (they answer,
 * or the transport closes): the group must outlive it, so destroy the
 * transport before the group. */
void pt_exchange_abandon(pt_exchange *handle);

#endif
