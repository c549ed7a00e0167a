/* Collective algorithms over a communicator's channels. Each takes the
 * communicator locked for execution and returns 0 or the communicator's
 * failure. Bytes on the wire per algorithm: docs/algorithms.md. */
#ifndef TIDE_COLL_H
#define TIDE_COLL_H

#include "comm/comm.h"

/* The one builder of a collective step's point-to-point op: src is what a
 * SEND sends and a RECV_REDUCE's local operand, dst where a RECV or
 * RECV_REDUCE lands; dtype and op matter to RECV_REDUCE only. */
static inline void tide__p2p_set(tide__p2p_t *p2p, tide__p2p_kind_t kind, int peer, const void *src, void *dst,
                                 size_t bytes, tide_dtype_t dtype, tide_op_t op) {
  *p2p = (tide__p2p_t){.kind = kind, .peer = peer, .src = src, .dst = dst, .bytes = bytes, .dtype = dtype, .op = op};
}

/* Hands a sub-communicator's failure (rc != 0) to its parent, so that the
 * parent's later calls fail too, and reports it on the parent's other
 * sub-communicator (local or cross): a hierarchical collective's members
 * there may be waiting for this rank's next stage, which will not come
 * (without the report they waited out TIDE_TIMEOUT_MS). 0 stays 0. */
static inline int tide__lift(tide_comm_t *comm, tide_comm_t *sub, int rc) {
  if (rc == 0) return 0;
  const char *why = tide_comm_last_error(sub);
  tide_comm_t *other = sub == comm->local ? comm->cross : sub == comm->cross ? comm->local : NULL;
  if (other != NULL) tide__comm_fail(other, rc, 0, "%s", why);
  return tide__comm_fail(comm, rc, 1, "%s", why);
}

/* TIDE__ALGO_MPI: MPI's own collective, on a communicator joined through
 * MPI (comm->mpi), for any dense call it supports (src/coll/mpi.c). */
typedef enum { TIDE__ALGO_NONE = 0, TIDE__ALGO_RD, TIDE__ALGO_RING, TIDE__ALGO_HIER, TIDE__ALGO_MPI,
              TIDE__ALGO_VHDD /* flat Adasum */,
              TIDE__ALGO_VHDD_CORES /* flat Adasum, ranks sharing a core first */ } tide__algo_t;

/* The allreduce algorithm for this call: the same on every rank given the
 * same count, dtype and TIDE_ALGO / TIDE_SMALL_BYTES. On an MPI
 * communicator auto (and mpi) pick MPI's own allreduce when it takes the
 * dtype; f16/bf16 use tide's algorithms over the MPI transport. */
tide__algo_t tide__allreduce_algo(const tide_comm_t *comm, size_t count, tide_dtype_t dtype);

int tide__allreduce_rd(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tide_dtype_t dtype, tide_op_t op);
int tide__allreduce_ring(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op);
int tide__allreduce_hier(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op);
/* Runs the chosen algorithm (AVG included). */
int tide__allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tide_dtype_t dtype, tide_op_t op, tide__algo_t algo);

/* Ring reduce-scatter of count elements (tide_block partition), summing
 * (or min/max); rank r's block goes to out. TIDE_AVG sums (caller scales). */
int tide__reduce_scatter_ring(tide_comm_t *comm, const void *sendbuf, void *out, size_t count,
                              tide_dtype_t dtype, tide_op_t op);
/* The same with explicit blocks: block b is counts[b] elements at
 * displacement displs[b] of sendbuf (in any order, not overlapping). */
int tide__reduce_scatterv_ring(tide_comm_t *comm, const void *sendbuf, void *out, const size_t *counts,
                               const size_t *displs, tide_dtype_t dtype, tide_op_t op);
/* Ring allgather of variable blocks: rank r's block (counts[r] elements at
 * displacement displs[r]) is already in buf (or copied from sendbuf when it
 * is not NULL). */
int tide__allgatherv_ring(tide_comm_t *comm, const void *sendbuf, void *buf, const size_t *counts,
                          const size_t *displs, tide_dtype_t dtype);
int tide__broadcast(tide_comm_t *comm, void *buf, size_t bytes, int root);
/* Rank r sends send_bytes[p] bytes at sendbuf + send_displs[p] to each p and
 * receives recv_bytes[p] at recvbuf + recv_displs[p] from each; both sides
 * must agree on every size (no header checks them). Takes exec_lock itself
 * (src/coll/alltoallv.c; used by the data loader). */
int tide__alltoallv_bytes(tide_comm_t *comm, const void *sendbuf, const size_t *send_bytes,
                          const size_t *send_displs, void *recvbuf, const size_t *recv_bytes,
                          const size_t *recv_displs);
int tide__barrier(tide_comm_t *comm);

/* Sparse collectives (src/coll/sparse.c). */
int tide__sparse_allgather(tide_comm_t *comm, const float *values, const uint32_t *indices, size_t k, float *out,
                           size_t d, tide_op_t op);
int tide__hitopk_shard(tide_comm_t *comm, size_t d, size_t *offset, size_t *len);
int tide__hitopk_allreduce(tide_comm_t *comm, const float *grad, float *out, size_t d, tide_compressor_t *compressor,
                           tide_op_t op);

/* ---- MPI's own collectives (src/coll/mpi.c) ------------------------------ */

/* MPI's own collective on an MPI communicator: allreduce, reduce-scatter
 * (tide_block partition), allgatherv, broadcast. */
typedef enum { TIDE__MPI_ALLREDUCE, TIDE__MPI_REDUCE_SCATTER, TIDE__MPI_ALLGATHERV, TIDE__MPI_BROADCAST } tide__mpi_coll_kind_t;
/* 1 when this call runs as MPI's own collective: an MPI communicator,
 * TIDE_ALGO=mpi, or auto when MPI provides MPI_THREAD_MULTIPLE and the call
 * moves at most TIDE_MPI_REDUCE_MAX_BYTES (auto then takes MPI's blocking
 * collectives; otherwise tide's algorithms over the MPI transport), a dtype
 * MPI reduces (not f16/bf16) and every count within an int. count: the elements of the whole call (allgather(v):
 * the output). The same answer on every rank for the same call. */
int tide__mpi_coll_choose(const tide_comm_t *comm, tide__mpi_coll_kind_t kind, size_t count, tide_dtype_t dtype);
/* Runs it (AVG: sum, then scale). counts: allgatherv's counts per rank (NULL:
 * count each). Every rank must have passed the header check; returns 0 or
 * the communicator's failure. */
int tide__mpi_collective(tide_comm_t *comm, tide__mpi_coll_kind_t kind, const void *sendbuf, void *recvbuf,
                         size_t count, const size_t *counts, tide_dtype_t dtype, tide_op_t op, int root);

/* Adasum (src/coll/adasum.c). The segments of tensors that must tile
 * [0, count) (in any order; none: one tensor): *end_out receives where each
 * non-empty one ends, ascending (owned by the caller, tide__free), or
 * TIDE_EINVAL and `why` says what is wrong with the tensors. */
int tide__adasum_segments(const tide_tensor_t *tensors, size_t ntensors, size_t count, size_t **end_out,
                          size_t *nseg_out, char *why, size_t cap);
/* TIDE__ALGO_HIER on ranks spanning hosts (as many on each) unless
 * TIDE_ADASUM_HIER=0, TIDE__ALGO_VHDD (flat) otherwise, or
 * TIDE__ALGO_VHDD_CORES when ranks bound to the same CPUs can pair at the
 * first level over shared memory; NONE for one rank. */
tide__algo_t tide__adasum_algo(const tide_comm_t *comm);
int tide__adasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                           const size_t *end, size_t nseg, tide__algo_t algo);

#endif
