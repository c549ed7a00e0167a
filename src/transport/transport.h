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

typedef struct {
  const char *name;
  /* Advances op as far as it can without blocking. 0 (check op->done), or
   * TIDE_EPEER when the peer closed the connection. */
  int (*progress)(tide__chan_t *chan, tide__p2p_t *op);
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
  /* mpi (fd stays -1) */
  tide__mpi_chan_t *mpi;
};

extern const tide__transport_ops_t tide__tcp_ops;
extern const tide__transport_ops_t tide__shm_ops;
extern const tide__transport_ops_t tide__mpi_ops;

/* Sets up a TCP channel on a connected, authenticated socket. */
int tide__tcp_chan_init(tide__chan_t *chan, int peer, int fd);

/* ---- shared memory ---------------------------------------------------- */

/* A rank's segment: its doorbell and one inbound ring per local rank. */
typedef struct tide__shm_segment tide__shm_segment_t;

/* Creates (owner) or maps (peer) the segment `name` with `slots` rings of
 * ring_bytes each. */
int tide__shm_segment_create(const char *name, int slots, size_t ring_bytes,
                             tide__shm_segment_t **out);
int tide__shm_segment_open(const char *name, int slots, size_t ring_bytes,
                           tide__shm_segment_t **out);
/* Removes the name (mappings stay valid). */
void tide__shm_segment_unlink(const char *name);
void tide__shm_segment_close(tide__shm_segment_t *seg);
/* Connects a channel: we (local slot `me`) send into the peer's segment and
 * receive from our own. */
void tide__shm_chan_init(tide__chan_t *chan, int peer, tide__shm_segment_t *mine,
                         tide__shm_segment_t *theirs, int me_slot, int peer_slot);
/* The doorbell of a segment: incremented by every peer that publishes data
 * or frees space for the owner. */
_Atomic uint32_t *tide__shm_bell(tide__shm_segment_t *seg);
/* Sleeps until the owner's doorbell moves from `seen` or timeout_ms passes. */
void tide__shm_wait(tide__shm_segment_t *seg, uint32_t seen, int timeout_ms);
/* Rings the doorbell (wakes the owner if it sleeps). */
void tide__shm_ring_bell(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers);
_Atomic uint32_t *tide__shm_sleepers(tide__shm_segment_t *seg);

/* ---- MPI (src/transport/mpi/; built with TIDE_HAVE_MPI) ------------------ */

/* Point-to-point over a communicator's private MPI_Comm (mpi_comm points to
 * it; the channel keeps a copy of the handle, not ownership): each message is
 * cut into TIDE__MPI_CHUNK-byte pieces, a few in flight, with MPI_Isend /
 * MPI_Irecv on tag TIDE__MPI_TAG_DATA, advanced by MPI_Test. TIDE_ENOSYS
 * without MPI. */
int tide__mpi_chan_init(tide__chan_t *chan, int peer, const void *mpi_comm);
/* Withdraws the pieces still in flight after a failed batch (MPI holds the
 * ops' buffers, unlike tcp and shm once progress returns), so nothing
 * touches them once the engine returns. */
void tide__mpi_chan_cancel(tide__chan_t *chan);

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
