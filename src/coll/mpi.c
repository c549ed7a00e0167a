/* MPI's own collectives on a communicator joined through MPI (comm->mpi):
 * the TIDE__ALGO_MPI path beside tide's algorithms. comm/mpi.h gives the
 * communicator's MPI_Comm, the agreement before a blocking collective and
 * the waits; the collectives themselves live here, so comm never calls up
 * into coll. Built without MPI, nothing chooses them. */
#include <limits.h>
#include <string.h>

#include "coll/coll.h"

#ifdef TIDE_HAVE_MPI
#include "comm/mpi.h"

static MPI_Datatype mpi_type(tide_dtype_t dtype) {
  switch (dtype) {
    case TIDE_F32: return MPI_FLOAT;
    case TIDE_F64: return MPI_DOUBLE;
    case TIDE_I32: return MPI_INT32_T;
    case TIDE_I64: return MPI_INT64_T;
    default: return MPI_UINT16_T; /* f16, bf16: moved, never reduced by MPI */
  }
}

static MPI_Op mpi_op(tide_op_t op) { return op == TIDE_MIN ? MPI_MIN : op == TIDE_MAX ? MPI_MAX : MPI_SUM; }

int tide__mpi_coll_choose(const tide_comm_t *comm, tide__mpi_coll_kind_t kind, size_t count, tide_dtype_t dtype) {
  if (comm->mpi == NULL || comm->size == 1 || count > INT_MAX) return 0;
  const char *algo = tide__param_str(TIDE__PARAM_ALGO);
  int reduction = kind == TIDE__MPI_ALLREDUCE || kind == TIDE__MPI_REDUCE_SCATTER;
  if (strcmp(algo, "auto") == 0) {
    /* MPI's blocking collectives only (see tide__mpi_collective); for
     * reductions only while they are latency-bound: above, tide's ring over
     * MPI point-to-point is ahead (docs/mpi.md: measured, and MPI's
     * reductions malloc fresh temporary buffers per call, which costs page
     * faults every time once they are large). */
    if (!tide__mpi_multiple()) return 0;
    if (reduction && count * tide_dtype_size(dtype) > (uint64_t)tide__param_int(TIDE__PARAM_MPI_REDUCE_MAX_BYTES))
      return 0;
  } else if (strcmp(algo, "mpi") != 0) {
    return 0;
  }
  /* sum, min, max are MPI's; avg is a sum, then scaled; MPI has no halves */
  return !(reduction && (dtype == TIDE_F16 || dtype == TIDE_BF16));
}

static const char *coll_name(tide__mpi_coll_kind_t kind) {
  static const char *names[] = {"MPI_Allreduce", "MPI_Reduce_scatter", "MPI_Allgatherv", "MPI_Bcast"};
  return names[kind];
}

int tide__mpi_collective(tide_comm_t *comm, tide__mpi_coll_kind_t kind, const void *sendbuf, void *recvbuf,
                         size_t count, const size_t *counts, tide_dtype_t dtype, tide_op_t op, int root) {
  MPI_Comm mpi_comm = tide__mpi_comm_handle(comm);
  int n = comm->size;
  size_t esize = tide_dtype_size(dtype);
  MPI_Datatype type = mpi_type(dtype);
  int *ints = NULL; /* counts and displacements, for MPI */
  if (kind == TIDE__MPI_REDUCE_SCATTER || (kind == TIDE__MPI_ALLGATHERV && counts != NULL)) {
    ints = tide__malloc(2 * (size_t)n * sizeof *ints);
    if (ints == NULL) return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: out of memory", comm->rank);
    size_t at = 0;
    for (int r = 0; r < n; r++) {
      size_t off, len;
      if (kind == TIDE__MPI_REDUCE_SCATTER)
        tide_block(count, n, r, &off, &len);
      else
        len = counts[r];
      ints[r] = (int)len;
      ints[n + r] = (int)at;
      at += len;
    }
  }
  const void *in = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
  int send_count = 0; /* allgather(v) when not in place */
  /* Allgather(v): in place when our block is already in its place, or
   * overlaps it (then it moves there first). */
  if (kind == TIDE__MPI_ALLGATHERV) {
    size_t mine = (counts ? (size_t)ints[comm->rank] : count) * esize, total = 0;
    for (int r = 0; r < n; r++) total += counts ? (size_t)ints[r] : count;
    uint8_t *at = (uint8_t *)recvbuf + (counts ? (size_t)ints[n + comm->rank] : count * (size_t)comm->rank) * esize;
    const uint8_t *from = sendbuf, *out = recvbuf;
    in = sendbuf;
    send_count = (int)(mine / esize);
    if (mine == 0 || from == at || (from < out + total * esize && out < from + mine)) {
      if (mine > 0 && from != at) memmove(at, from, mine);
      in = MPI_IN_PLACE;
    }
  }
  /* With MPI_THREAD_MULTIPLE, MPI's blocking collective (Open MPI's tuned
   * ones are far faster than the nonblocking ones), entered only once every
   * rank agrees it is in this call, since it cannot be left half way.
   * Otherwise the nonblocking one, tested with the deadline, so tide never
   * holds its MPI lock across a wait. */
  int blocking = tide__mpi_multiple();
  int rc = 0, err = MPI_SUCCESS;
  MPI_Request req = MPI_REQUEST_NULL;
  if (blocking) {
    rc = tide__mpi_comm_agree(comm, TIDE__MPI_TAG_SYNC, coll_name(kind));
    if (rc == 0) {
      switch (kind) {
        case TIDE__MPI_ALLREDUCE:
          err = MPI_Allreduce(in, recvbuf, (int)count, type, mpi_op(op), mpi_comm);
          break;
        case TIDE__MPI_REDUCE_SCATTER:
          err = MPI_Reduce_scatter(in, recvbuf, ints, type, mpi_op(op), mpi_comm);
          break;
        case TIDE__MPI_ALLGATHERV:
          err = counts ? MPI_Allgatherv(in, send_count, type, recvbuf, ints, ints + n, type, mpi_comm)
                       : MPI_Allgather(in, send_count, type, recvbuf, (int)count, type, mpi_comm);
          break;
        case TIDE__MPI_BROADCAST:
          err = MPI_Bcast(recvbuf, (int)count, type, root, mpi_comm);
          break;
      }
    }
  } else {
    tide__mpi_lock();
    switch (kind) {
      case TIDE__MPI_ALLREDUCE:
        err = MPI_Iallreduce(in, recvbuf, (int)count, type, mpi_op(op), mpi_comm, &req);
        break;
      case TIDE__MPI_REDUCE_SCATTER:
        err = MPI_Ireduce_scatter(in, recvbuf, ints, type, mpi_op(op), mpi_comm, &req);
        break;
      case TIDE__MPI_ALLGATHERV:
        err = counts ? MPI_Iallgatherv(in, send_count, type, recvbuf, ints, ints + n, type, mpi_comm, &req)
                     : MPI_Iallgather(in, send_count, type, recvbuf, (int)count, type, mpi_comm, &req);
        break;
      case TIDE__MPI_BROADCAST:
        err = MPI_Ibcast(recvbuf, (int)count, type, root, mpi_comm, &req);
        break;
    }
    tide__mpi_unlock();
    if (err == MPI_SUCCESS) {
      rc = tide__mpi_comm_wait(comm, &req, 1, coll_name(kind));
      if (rc != 0 && req != MPI_REQUEST_NULL) {
        /* A collective cannot be cancelled: keep what it reads until destroy. */
        tide__mpi_comm_keep(comm, req, ints);
        return rc;
      }
    }
  }
  if (rc == 0 && err != MPI_SUCCESS) rc = tide__mpi_comm_fail_mpi(comm, err, coll_name(kind));
  if (rc == 0 && op == TIDE_AVG) {
    if (kind == TIDE__MPI_ALLREDUCE) tide__scale(recvbuf, count, dtype, n);
    if (kind == TIDE__MPI_REDUCE_SCATTER) tide__scale(recvbuf, (size_t)ints[comm->rank], dtype, n);
  }
  tide__free(ints);
  return rc;
}

#else /* built without MPI */

int tide__mpi_coll_choose(const tide_comm_t *comm, tide__mpi_coll_kind_t kind, size_t count, tide_dtype_t dtype) {
  (void)comm;
  (void)kind;
  (void)count;
  (void)dtype;
  return 0;
}

int tide__mpi_collective(tide_comm_t *comm, tide__mpi_coll_kind_t kind, const void *sendbuf, void *recvbuf,
                         size_t count, const size_t *counts, tide_dtype_t dtype, tide_op_t op, int root) {
  (void)comm;
  (void)kind;
  (void)sendbuf;
  (void)recvbuf;
  (void)count;
  (void)counts;
  (void)dtype;
  (void)op;
  (void)root;
  return TIDE_ENOSYS;
}

#endif
