/* Allreduce: recursive doubling for small messages, ring reduce-scatter +
 * allgather for large ones, and hierarchical (intra-host reduce-scatter,
 * inter-host allreduce, intra-host allgather) when ranks span hosts.
 * Every element of the result is combined in one order on one rank, or in
 * mirrored pairs (a+b on one side, b+a on the other), so all ranks end
 * with bitwise identical results. */
#include <string.h>

#include "coll/coll.h"

tide__algo_t tide__allreduce_algo(const tide_comm_t *comm, size_t count, tide_dtype_t dtype) {
  if (comm->size == 1) return TIDE__ALGO_NONE;
  size_t bytes = count * tide_dtype_size(dtype);
  const char *forced = tide__param_str(TIDE__PARAM_ALGO);
  if (tide__mpi_coll_choose(comm, TIDE__MPI_ALLREDUCE, count, dtype)) return TIDE__ALGO_MPI;
  int hier_ok = comm->node_count > 1 && comm->uniform_nodes && comm->local_size > 1 &&
                count >= (size_t)comm->size;
  if (strcmp(forced, "rd") == 0) return TIDE__ALGO_RD;
  if (strcmp(forced, "ring") == 0) return TIDE__ALGO_RING;
  if (strcmp(forced, "hier") == 0) return hier_ok ? TIDE__ALGO_HIER : TIDE__ALGO_RING;
  if (bytes <= (size_t)tide__param_int(TIDE__PARAM_SMALL_BYTES) || count < (size_t)comm->size)
    return TIDE__ALGO_RD;
  return hier_ok ? TIDE__ALGO_HIER : TIDE__ALGO_RING;
}

/* Recursive doubling; a non-power-of-two size first folds the extra ranks
 * into their neighbours and hands them the result at the end. */
int tide__allreduce_rd(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       tide_dtype_t dtype, tide_op_t op) {
  size_t bytes = count * tide_dtype_size(dtype);
  if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, bytes);
  if (comm->size == 1 || bytes == 0) return 0;
  void *incoming = tide__comm_scratch(comm, bytes);
  if (incoming == NULL) return TIDE_ENOMEM;
  int n = comm->size, r = comm->rank, pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  int extra = n - pof2, vrank;
  tide__p2p_t ops[2];
  if (r < 2 * extra) {
    if (r % 2 == 0) { /* hand our data to r+1, get the result back at the end */
      tide__p2p_set(&ops[0], TIDE__P2P_SEND, r + 1, recvbuf, NULL, bytes, dtype, op);
      TIDE_CHECK(tide__comm_run(comm, ops, 1, "allreduce (recursive doubling)"));
      tide__p2p_set(&ops[0], TIDE__P2P_RECV, r + 1, NULL, recvbuf, bytes, dtype, op);
      return tide__comm_run(comm, ops, 1, "allreduce (recursive doubling)");
    }
    tide__p2p_set(&ops[0], TIDE__P2P_RECV_REDUCE, r - 1, recvbuf, recvbuf, bytes, dtype, op);
    TIDE_CHECK(tide__comm_run(comm, ops, 1, "allreduce (recursive doubling)"));
    vrank = r / 2;
  } else {
    vrank = r - extra;
  }
  for (int mask = 1; mask < pof2; mask <<= 1) {
    int vpeer = vrank ^ mask;
    int peer = vpeer < extra ? vpeer * 2 + 1 : vpeer + extra;
    tide__p2p_set(&ops[0], TIDE__P2P_SEND, peer, recvbuf, NULL, bytes, dtype, op);
    tide__p2p_set(&ops[1], TIDE__P2P_RECV, peer, NULL, incoming, bytes, dtype, op);
    TIDE_CHECK(tide__comm_run(comm, ops, 2, "allreduce (recursive doubling)"));
    tide__reduce(recvbuf, recvbuf, incoming, count, dtype, op);
  }
  if (r < 2 * extra) {
    tide__p2p_set(&ops[0], TIDE__P2P_SEND, r - 1, recvbuf, NULL, bytes, dtype, op);
    TIDE_CHECK(tide__comm_run(comm, ops, 1, "allreduce (recursive doubling)"));
  }
  return 0;
}

int tide__reduce_scatterv_ring(tide_comm_t *comm, const void *sendbuf, void *out, const size_t *counts,
                               const size_t *displs, tide_dtype_t dtype, tide_op_t op) {
  int n = comm->size, r = comm->rank;
  size_t esize = tide_dtype_size(dtype);
  const uint8_t *in = sendbuf;
  if (n == 1) {
    if (out != in + displs[0] * esize) memmove(out, in + displs[0] * esize, counts[0] * esize);
    return 0;
  }
  /* Partial sums travel right; each rank adds its own block as it passes.
   * Step s sends block r-s-1 and receives block r-s-2; the last step
   * receives block r, which lands in out. Partial sums wait in work, the
   * blocks back to back (woff). */
  size_t *woff = tide__malloc((size_t)n * sizeof *woff), total = 0;
  if (woff == NULL) return TIDE_ENOMEM;
  for (int b = 0; b < n; b++) {
    woff[b] = total;
    total += counts[b];
  }
  uint8_t *work = tide__comm_scratch(comm, total * esize);
  int rc = work == NULL ? TIDE_ENOMEM : 0;
  int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int s = 0; rc == 0 && s < n - 1; s++) {
    int send_block = ((r - s - 1) % n + n) % n, recv_block = ((r - s - 2) % n + n) % n;
    tide__p2p_t ops[2];
    const uint8_t *sent = s == 0 ? in + displs[send_block] * esize : work + woff[send_block] * esize;
    size_t sent_bytes = counts[send_block] * esize, len = counts[recv_block];
    tide__p2p_set(&ops[0], TIDE__P2P_SEND, right, sent, NULL, sent_bytes, dtype, op);
    uint8_t *dst = s == n - 2 ? (uint8_t *)out : work + woff[recv_block] * esize;
    /* With two ranks in place, out may overlap the block still being sent
     * (a zero-copy transport reads it until the send completes): land the
     * result in work and copy it over afterwards. */
    int bounce = dst == (uint8_t *)out && dst < sent + sent_bytes && sent < dst + len * esize;
    if (bounce) dst = work + woff[recv_block] * esize;
    tide__p2p_set(&ops[1], TIDE__P2P_RECV_REDUCE, left, in + displs[recv_block] * esize, dst, len * esize, dtype, op);
    rc = tide__comm_run(comm, ops, 2, "reduce-scatter (ring)");
    if (rc == 0 && bounce) memcpy(out, dst, len * esize);
  }
  tide__free(woff);
  return rc;
}

/* Block sizes and offsets of the reduce-scatter partition. */
static int partition(tide_comm_t *comm, size_t count, size_t **counts, size_t **displs) {
  *counts = tide__malloc(2 * (size_t)comm->size * sizeof(size_t));
  if (*counts == NULL) return TIDE_ENOMEM;
  *displs = *counts + comm->size;
  for (int b = 0; b < comm->size; b++) tide_block(count, comm->size, b, &(*displs)[b], &(*counts)[b]);
  return 0;
}

int tide__reduce_scatter_ring(tide_comm_t *comm, const void *sendbuf, void *out, size_t count,
                              tide_dtype_t dtype, tide_op_t op) {
  size_t *counts, *displs;
  TIDE_CHECK(partition(comm, count, &counts, &displs));
  int rc = tide__reduce_scatterv_ring(comm, sendbuf, out, counts, displs, dtype, op);
  tide__free(counts);
  return rc;
}

int tide__allgatherv_ring(tide_comm_t *comm, const void *sendbuf, void *buf, const size_t *counts,
                          const size_t *displs, tide_dtype_t dtype) {
  int n = comm->size, r = comm->rank;
  size_t esize = tide_dtype_size(dtype);
  uint8_t *base = buf;
  if (sendbuf != NULL && sendbuf != base + displs[r] * esize)
    memmove(base + displs[r] * esize, sendbuf, counts[r] * esize);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int s = 0; s < n - 1; s++) {
    int send_block = ((r - s) % n + n) % n, recv_block = ((r - s - 1) % n + n) % n;
    tide__p2p_t ops[2];
    tide__p2p_set(&ops[0], TIDE__P2P_SEND, right, base + displs[send_block] * esize, NULL,
            counts[send_block] * esize, dtype, TIDE_SUM);
    tide__p2p_set(&ops[1], TIDE__P2P_RECV, left, NULL, base + displs[recv_block] * esize,
            counts[recv_block] * esize, dtype, TIDE_SUM);
    TIDE_CHECK(tide__comm_run(comm, ops, 2, "allgather (ring)"));
  }
  return 0;
}

int tide__allreduce_ring(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op) {
  size_t *counts, *displs;
  TIDE_CHECK(partition(comm, count, &counts, &displs));
  size_t esize = tide_dtype_size(dtype);
  uint8_t *mine = (uint8_t *)recvbuf + displs[comm->rank] * esize;
  int rc = tide__reduce_scatter_ring(comm, sendbuf, mine, count, dtype, op);
  if (rc == 0 && op == TIDE_AVG) tide__scale(mine, counts[comm->rank], dtype, comm->size);
  if (rc == 0) rc = tide__allgatherv_ring(comm, NULL, recvbuf, counts, displs, dtype);
  tide__free(counts);
  return rc;
}

int tide__allreduce_hier(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op) {
  tide_comm_t *local, *cross;
  TIDE_CHECK(tide_comm_local(comm, &local));
  TIDE_CHECK(tide_comm_cross(comm, &cross));
  size_t *counts, *displs;
  TIDE_CHECK(partition(local, count, &counts, &displs));
  size_t esize = tide_dtype_size(dtype);
  size_t mine_count = counts[local->rank];
  uint8_t *mine = (uint8_t *)recvbuf + displs[local->rank] * esize;
  tide_op_t sum_op = op == TIDE_AVG ? TIDE_SUM : op;
  int rc = tide__lift(comm, local, tide__reduce_scatter_ring(local, sendbuf, mine, count, dtype, sum_op));
  if (rc == 0)
    rc = tide__lift(comm, cross,
              tide__allreduce(cross, mine, mine, mine_count, dtype, sum_op,
                              tide__allreduce_algo(cross, mine_count, dtype)));
  if (rc == 0 && op == TIDE_AVG) tide__scale(mine, mine_count, dtype, comm->size);
  if (rc == 0) rc = tide__lift(comm, local, tide__allgatherv_ring(local, NULL, recvbuf, counts, displs, dtype));
  tide__free(counts);
  return rc;
}

int tide__allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tide_dtype_t dtype, tide_op_t op, tide__algo_t algo) {
  switch (algo) {
    case TIDE__ALGO_RD: {
      int rc = tide__allreduce_rd(comm, sendbuf, recvbuf, count, dtype, op == TIDE_AVG ? TIDE_SUM : op);
      if (rc == 0 && op == TIDE_AVG) tide__scale(recvbuf, count, dtype, comm->size);
      return rc;
    }
    case TIDE__ALGO_RING:
      return tide__allreduce_ring(comm, sendbuf, recvbuf, count, dtype, op);
    case TIDE__ALGO_HIER:
      return tide__allreduce_hier(comm, sendbuf, recvbuf, count, dtype, op);
    case TIDE__ALGO_MPI:
      return tide__mpi_collective(comm, TIDE__MPI_ALLREDUCE, sendbuf, recvbuf, count, NULL, dtype, op, 0);
    default:
      if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * tide_dtype_size(dtype));
      return 0;
  }
}
