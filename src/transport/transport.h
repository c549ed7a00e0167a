/* Transports move bytes between two ranks behind one ops table; algorithms
 * never know which transport a channel uses.
 *
 * A channel is one connection to one peer, owned by a communicator and used
 * by one thread at a time (the one executing that communicator's
 * collective). Work is described as point-to-point operations that a
 * transport advances without blocking; the communicator's engine
 * (src/comm/progress.c) drives them and does the waiting. */
#ifndef TIDE_TRANSPORT_H
#define TIDE_TRANSPORT_H

#include <stdatomic.h>

#include "core/core.h"

typedef enum { TIDE__P2P_SEND, TIDE__P2P_RECV, TIDE__P2P_RECV_REDUCE } tide__p2p_kind_t;

/* A RECV's consumer: bytes [at, at + len) of the message, whole elements
 * of the op's dtype, are at data; it must leave them at dst + at (data may
 * already be there) and may look at them while they are in the cache. */
typedef void (*tide__consume_cb)(void *ctx, size_t at, const void *data, size_t len);
/* A SEND's producer: writes bytes [at, at + len) of the message, whole
 * elements of the op's dtype, to out, a transport's buffer or src + at. */
typedef void (*tide__produce_cb)(void *ctx, size_t at, void *out, size_t len);

/* One send or receive. RECV_REDUCE writes dst[i] = local[i] (op) incoming[i]
 * as data arrives (local may equal dst). done counts bytes finished. */
typedef struct {
  tide__p2p_kind_t kind;
  int peer;
  const void *src; /* SEND: the data; RECV_REDUCE: the local operand */
  void *dst;       /* RECV, RECV_REDUCE */
  size_t bytes;
  size_t done;
  tide_dtype_t dtype; /* RECV_REDUCE, and with a consumer or producer */
  tide_op_t op;       /* RECV_REDUCE (TIDE_AVG reduces as TIDE_SUM) */
  /* Optional, for RECV and SEND: the shm transport hands the consumer each
   * piece straight out of its ring, and has the producer write each piece
   * straight into it, instead of copying. With the other transports the
   * engine hands over what landed in dst, and has the producer fill src
   * (then writable) before the send starts (src/comm/progress.c). */
  tide__consume_cb consume;
  tide__produce_cb produce;
  void *ctx;
  size_t handed; /* bytes handed to consume, or made by produce */
} tide__p2p_t;

typedef struct tide__chan tide__chan_t;

/* What a waiter sleeps on while an op waits on its channel; the engine
 * gathers one per pending op and sleeps on all of them at once. */
typedef enum {
  TIDE__WAIT_FD,   /* poll fd for events */
  TIDE__WAIT_BELL, /* the transport's host-wide doorbell (bell_read, bell_sleep) */
  TIDE__WAIT_TEST, /* nothing to sleep on: data moves only inside progress (MPI), so test again */
} tide__wait_kind_t;

typedef struct {
  tide__wait_kind_t kind;
  int fd;       /* FD */
  short events; /* FD: POLLIN or POLLOUT */
} tide__wait_t;

/* Where a peer is, as a transport's can_connect sees it. */
typedef struct {
  int same_host;        /* the peer runs on this rank's host */
  const void *mpi_comm; /* the communicator's MPI_Comm (pointer to it), or NULL */
} tide__link_t;

/* What a transport that sets up all of a host's channels at once (shm)
 * needs: this rank's place on the host and the store to meet the others
 * through. The transport writes keys under ns only. */
typedef struct {
  int rank, local_rank, local_size;
  const int *local_ranks;  /* rank of each local rank */
  const int *peers;        /* local ranks this transport connects to (can_connect said yes) */
  int npeers;
  tide_store_t *store;
  const char *ns;
  const char *name; /* a name for this rank's host-wide resources, unique per job and rank */
  int timeout_ms;
} tide__host_setup_t;

/* What connect needs for one channel: a connected, authenticated socket
 * (tcp), or the communicator's MPI_Comm (mpi). */
typedef struct {
  int fd;
  const void *mpi_comm;
} tide__endpoint_t;

/* A transport (after NCCL's ncclTransports[]): the communicator picks,
 * per peer, the first transport of tide__transports[] whose can_connect
 * says yes, connects the channel through it, and then only calls these
 * functions, never a transport by name. */
typedef struct {
  const char *name;
  /* 1: progress hands RECV pieces to op->consume and has op->produce fill
   * SEND pieces itself; 0: the engine hands over what landed in dst, and
   * has the producer fill src before the send starts. */
  int hands_pieces;
  /* Whether this transport can carry a channel to the peer at link. */
  int (*can_connect)(const tide__link_t *link);
  /* Transports whose channels share host-wide state (shm: the segments):
   * sets the state up, meeting the host's other ranks through the store,
   * and connects chans[local_ranks[p]] for each p of setup->peers. NULL
   * for transports that connect one channel at a time. *state is owned by
   * the caller, released with host_close (also after a failed host_open). */
  int (*host_open)(const tide__host_setup_t *setup, tide__chan_t *chans, void **state);
  void (*host_close)(void *state);
  /* Connects one channel to peer from ep; on failure the channel owns
   * nothing (an fd in ep is closed). NULL for host_open transports. */
  int (*connect)(tide__chan_t *chan, int peer, const tide__endpoint_t *ep);
  /* Advances op as far as it can without blocking. 0 (check op->done), or
   * TIDE_EPEER when the peer closed the connection. */
  int (*progress)(tide__chan_t *chan, tide__p2p_t *op);
  /* What to sleep on until op, pending on chan, can move again. */
  void (*wait_source)(const tide__chan_t *chan, const tide__p2p_t *op, tide__wait_t *out);
  /* TIDE__WAIT_BELL: the doorbell's count now; sleep until it moves from
   * seen or timeout_ms passes; ring it (wakes a sleeper; any thread). */
  uint32_t (*bell_read)(void *state);
  void (*bell_sleep)(void *state, uint32_t seen, int timeout_ms);
  void (*bell_ring)(void *state);
  /* Around each batch of ops the engine runs (host-wide transports; NULL
   * otherwise): begin before the first progress, with the bytes the batch
   * sends; when it returns 1, end gets the batch's nanoseconds once it
   * finished (shm times how it writes into its rings, with auto stores). */
  int (*batch_begin)(void *state, size_t send_bytes);
  void (*batch_end)(void *state, int64_t ns);
  /* Withdraws what the transport still holds of a failed batch's ops
   * (their buffers), so nothing touches them once the engine returns;
   * NULL when progress never keeps hold of a buffer. */
  void (*cancel)(tide__chan_t *chan);
  /* Releases the channel's resources (not the struct). */
  void (*close)(tide__chan_t *chan);
} tide__transport_ops_t;

typedef struct tide__shm_ring tide__shm_ring_t;
typedef struct tide__mpi_chan tide__mpi_chan_t;

struct tide__chan {
  const tide__transport_ops_t *ops;
  int peer;
  /* tcp */
  int fd;
  uint8_t *stage; /* staging buffer for RECV_REDUCE */
  size_t stage_cap, stage_len;
  /* shm */
  tide__shm_ring_t *send_ring, *recv_ring; /* in the peer's / our segment */
  size_t ring_bytes;
  _Atomic uint32_t *peer_bell, *peer_sleepers;
  void *host; /* the host-wide state of the rank's shm channels */
  /* mpi (fd stays -1) */
  tide__mpi_chan_t *mpi;
};

/* Every transport, in the order they are tried. NULL-terminated. */
extern const tide__transport_ops_t *const tide__transports[];

/* The first transport in tide__transports[] that can carry link, or NULL. */
const tide__transport_ops_t *tide__transport_pick(const tide__link_t *link);

extern const tide__transport_ops_t tide__tcp_ops;
extern const tide__transport_ops_t tide__shm_ops;
extern const tide__transport_ops_t tide__mpi_ops;

/* ---- MPI (src/transport/mpi/; built with TIDE_HAVE_MPI) ------------------ */

/* tide__mpi_ops: point-to-point over a communicator's private MPI_Comm
 * (ep->mpi_comm points to it; the channel keeps a copy of the handle, not
 * ownership): each message is cut into pieces, a few in flight, with
 * MPI_Isend / MPI_Irecv on tag TIDE__MPI_TAG_DATA, advanced by MPI_Test.
 * connect returns TIDE_ENOSYS without MPI. */

/* Tags on a communicator's MPI_Comm: collective data, failure reports, the
 * agreement before MPI's blocking collectives, and tide_comm_split's. */
enum { TIDE__MPI_TAG_DATA = 1, TIDE__MPI_TAG_CTRL, TIDE__MPI_TAG_SYNC, TIDE__MPI_TAG_SPLIT };

/* MPI calls from several threads: when MPI provides less than
 * MPI_THREAD_MULTIPLE, tide serialises its own MPI calls with one process-wide
 * lock (tide__mpi_set_multiple(0)); otherwise lock/unlock do nothing. */
void tide__mpi_set_multiple(int multiple);
int tide__mpi_multiple(void);
void tide__mpi_lock(void);
void tide__mpi_unlock(void);

/* ---- reduction kernels (src/transport/reduce.c) ------------------------- */

/* dst[i] = a[i] (op) b[i] for n elements; dst may alias a or b. TIDE_AVG
 * reduces as TIDE_SUM (the caller scales). */
void tide__reduce(void *dst, const void *a, const void *b, size_t n, tide_dtype_t dtype,
                  tide_op_t op);
/* buf[i] *= 1/divisor (integer types: divides). */
void tide__scale(void *buf, size_t n, tide_dtype_t dtype, int divisor);

#endif
