/* The public collectives: check arguments, check that every rank made the
 * same call (a small header passed around the ring before any data moves),
 * pick the algorithm, and run it now (blocking) or on the progress thread
 * (nonblocking). */
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"

typedef enum {
  BARRIER = 1, BROADCAST, ALLREDUCE, REDUCE_SCATTER, ALLGATHER, ALLGATHERV, SPARSE_ALLGATHER, HITOPK, ADASUM
} kind_t;
static const char *kind_names[] = {"?", "barrier", "broadcast", "allreduce", "reduce_scatter", "allgather",
                                   "allgatherv", "sparse_allgather", "hitopk_allreduce", "adasum_allreduce"};
static const char *algo_names[] = {"-", "rd", "ring", "hier", "mpi", "vhdd"};
#define ALGO_NAME(a) algo_names[(unsigned)(a) <= TIDE__ALGO_VHDD ? (unsigned)(a) : 0]

typedef struct {
  kind_t kind;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  size_t *counts; /* allgatherv: owned copy */
  tide_dtype_t dtype;
  tide_op_t op;
  int root;
  const uint32_t *indices;        /* sparse_allgather: the k indices */
  size_t k;                       /* sparse_allgather: pairs this rank sends */
  tide_compressor_t *compressor;  /* hitopk: this rank's shard compressor */
} args_t; /* adasum: counts holds the tensors' ends (owned), k their number */

/* What every rank must agree on; sent to the right neighbour, compared
 * with the left one's: if every neighbour pair matches, all match. */
typedef struct {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;
  uint64_t count;
  uint64_t counts_hash;
  int32_t dtype, op, root, algo;
} header_t;

#define HEADER_MAGIC 0x74636f6cu

static void describe(const header_t *h, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s(", kind_names[h->kind <= ADASUM ? h->kind : 0]);
  switch (h->kind) {
    case BARRIER:
      break;
    case BROADCAST:
      n += snprintf(out + n, cap - (size_t)n, "count=%llu, %s, root=%d", (unsigned long long)h->count,
                    tide_dtype_name(h->dtype), h->root);
      break;
    case ALLREDUCE:
    case REDUCE_SCATTER:
      n += snprintf(out + n, cap - (size_t)n, "count=%llu, %s, %s", (unsigned long long)h->count,
                    tide_dtype_name(h->dtype), tide_op_name(h->op));
      break;
    case ALLGATHER:
      n += snprintf(out + n, cap - (size_t)n, "count=%llu, %s", (unsigned long long)h->count,
                    tide_dtype_name(h->dtype));
      break;
    default:
      n += snprintf(out + n, cap - (size_t)n, "total=%llu, counts#%08llx, %s", (unsigned long long)h->count,
                    (unsigned long long)(h->counts_hash & 0xffffffff), tide_dtype_name(h->dtype));
  }
  snprintf(out + n, cap - (size_t)n, ")");
}

static int check_headers(tide_comm_t *comm, const header_t *mine) {
  if (comm->size == 1) return 0;
  header_t theirs;
  int left = (comm->rank + comm->size - 1) % comm->size;
  tide__p2p_t ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].kind = TIDE__P2P_SEND;
  ops[0].peer = (comm->rank + 1) % comm->size;
  ops[0].src = mine;
  ops[0].bytes = sizeof *mine;
  ops[1].kind = TIDE__P2P_RECV;
  ops[1].peer = left;
  ops[1].dst = &theirs;
  ops[1].bytes = sizeof theirs;
  char what[160];
  describe(mine, what, sizeof what);
  TIDE_CHECK(tide__comm_run(comm, ops, 2, what));
  if (theirs.magic != HEADER_MAGIC)
    return tide__comm_fail(comm, TIDE_EPROTO, 0, "rank %d received a corrupt collective header from rank %d",
                           comm->rank, left);
  if (theirs.seq != mine->seq || theirs.kind != mine->kind || theirs.count != mine->count ||
      theirs.counts_hash != mine->counts_hash || theirs.dtype != mine->dtype || theirs.op != mine->op ||
      theirs.root != mine->root) {
    char other[160];
    describe(&theirs, other, sizeof other);
    return tide__comm_fail(comm, TIDE_EMISMATCH, 0,
                           "collective mismatch: rank %d called %s as collective #%llu while rank %d called "
                           "%s as collective #%llu",
                           comm->rank, what, (unsigned long long)mine->seq, left, other,
                           (unsigned long long)theirs.seq);
  }
  if (theirs.algo != mine->algo)
    return tide__comm_fail(comm, TIDE_EMISMATCH, 0,
                           "rank %d chose algorithm %s while rank %d chose %s for %s: TIDE_ALGO, "
                           "TIDE_SMALL_BYTES or TIDE_ADASUM_HIER differ between ranks",
                           comm->rank, ALGO_NAME(mine->algo), left, ALGO_NAME(theirs.algo), what);
  return 0;
}

static uint64_t hash_counts(const size_t *counts, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) h = (h ^ counts[i]) * 1099511628211ull;
  return h;
}

/* MPI's own collective for the dense calls other than allreduce, on an MPI
 * communicator under TIDE_ALGO=auto or mpi; total: the elements of the
 * whole call (allgather(v): the output). */
static tide__algo_t mpi_algo(const tide_comm_t *comm, const args_t *a, size_t total) {
  static const int kinds[] = {[REDUCE_SCATTER] = TIDE__MPI_REDUCE_SCATTER, [ALLGATHER] = TIDE__MPI_ALLGATHERV,
                              [ALLGATHERV] = TIDE__MPI_ALLGATHERV, [BROADCAST] = TIDE__MPI_BROADCAST};
  if (comm->size == 1 || a->kind == BARRIER || a->kind == ALLREDUCE || a->kind > ALLGATHERV) return TIDE__ALGO_NONE;
  return tide__mpi_coll_choose(comm, kinds[a->kind], total, a->dtype) ? TIDE__ALGO_MPI : TIDE__ALGO_NONE;
}

/* Runs one collective; the caller holds exec_lock. */
static int execute(tide_comm_t *comm, void *raw) {
  args_t *a = raw;
  comm->seq++;
  int rc = tide__comm_check(comm, comm->seq);
  if (rc) goto out;
  header_t h = {HEADER_MAGIC, a->kind, comm->seq, a->count, 0, a->dtype, a->op, a->root, 0};
  if (a->kind == ALLGATHERV) {
    h.counts_hash = hash_counts(a->counts, comm->size);
    h.count = 0;
    for (int r = 0; r < comm->size; r++) h.count += a->counts[r];
  }
  if (a->kind == ADASUM) h.counts_hash = hash_counts(a->counts, (int)a->k);
  tide__algo_t algo = a->kind == ALLREDUCE ? tide__allreduce_algo(comm, a->count, a->dtype)
                      : a->kind == ADASUM  ? tide__adasum_algo(comm)
                      : mpi_algo(comm, a, a->kind == ALLGATHER ? a->count * (size_t)comm->size : h.count);
  h.algo = (int32_t)algo;
  TIDE_CHECK_GOTO(check_headers(comm, &h), rc, out);
  size_t esize = tide_dtype_size(a->dtype);
  if (algo == TIDE__ALGO_MPI && a->kind != ALLREDUCE) {
    tide__mpi_coll_kind_t kind = a->kind == REDUCE_SCATTER ? TIDE__MPI_REDUCE_SCATTER
                                 : a->kind == BROADCAST    ? TIDE__MPI_BROADCAST
                                                           : TIDE__MPI_ALLGATHERV;
    rc = tide__mpi_collective(comm, kind, a->sendbuf, a->recvbuf, a->count, a->counts, a->dtype, a->op, a->root);
    goto done;
  }
  switch (a->kind) {
    case BARRIER:
      rc = tide__barrier(comm);
      break;
    case BROADCAST:
      rc = tide__broadcast(comm, a->recvbuf, a->count * esize, a->root);
      break;
    case ALLREDUCE:
      rc = tide__allreduce(comm, a->sendbuf, a->recvbuf, a->count, a->dtype, a->op, algo);
      break;
    case REDUCE_SCATTER: {
      rc = tide__reduce_scatter_ring(comm, a->sendbuf, a->recvbuf, a->count, a->dtype, a->op);
      size_t off, len;
      tide_block(a->count, comm->size, comm->rank, &off, &len);
      if (rc == 0 && a->op == TIDE_AVG) tide__scale(a->recvbuf, len, a->dtype, comm->size);
      break;
    }
    case SPARSE_ALLGATHER:
      rc = tide__sparse_allgather(comm, a->sendbuf, a->indices, a->k, a->recvbuf, a->count, a->op);
      break;
    case HITOPK:
      rc = tide__hitopk_allreduce(comm, a->sendbuf, a->recvbuf, a->count, a->compressor, a->op);
      break;
    case ADASUM:
      rc = tide__adasum_allreduce(comm, a->sendbuf, a->recvbuf, a->count, a->dtype, a->counts, a->k, algo);
      break;
    case ALLGATHER:
    case ALLGATHERV: {
      size_t *counts = a->counts, *displs = tide__malloc((size_t)comm->size * 2 * sizeof(size_t));
      if (displs == NULL) {
        rc = TIDE_ENOMEM;
        break;
      }
      if (counts == NULL) {
        counts = displs + comm->size;
        for (int r = 0; r < comm->size; r++) counts[r] = a->count;
      }
      size_t at = 0;
      for (int r = 0; r < comm->size; r++) {
        displs[r] = at;
        at += counts[r];
      }
      rc = tide__allgatherv_ring(comm, a->sendbuf, a->recvbuf, counts, displs, a->dtype);
      tide__free(displs);
      break;
    }
  }
done:
  if (rc == 0) rc = atomic_load(&comm->failed);
out:
  tide__free(a->counts);
  a->counts = NULL;
  return rc;
}

/* An invalid call fails the communicator for everyone: the other ranks
 * would otherwise wait for a call that never comes. */
static int invalid(tide_comm_t *comm, const char *fmt, const char *kind, const char *detail) {
  char msg[300];
  snprintf(msg, sizeof msg, fmt, kind, detail);
  tide__task_drain(comm);
  pthread_mutex_lock(&comm->exec_lock);
  comm->seq++; /* the failed call takes the number the others see */
  tide__comm_fail(comm, TIDE_EINVAL, 0, "rank %d called %s", comm->rank, msg);
  pthread_mutex_unlock(&comm->exec_lock);
  return TIDE_EINVAL;
}

static int validate(tide_comm_t *comm, const args_t *a, const size_t *counts, size_t sendcount) {
  const char *kind = kind_names[a->kind];
  if ((unsigned)a->dtype >= TIDE_DTYPE_COUNT) return invalid(comm, "%s with an unknown dtype%s", kind, "");
  if ((unsigned)a->op >= TIDE_OP_COUNT) return invalid(comm, "%s with an unknown reduction op%s", kind, "");
  if (a->kind == BROADCAST && (a->root < 0 || a->root >= comm->size))
    return invalid(comm, "%s with root outside [0, size)%s", kind, "");
  size_t total = a->count;
  if (a->kind == ALLGATHERV) {
    if (counts == NULL) return invalid(comm, "%s with counts == NULL%s", kind, "");
    if (sendcount != counts[comm->rank])
      return invalid(comm, "%s with sendcount != counts[rank]%s", kind, "");
    total = 1;
  }
  if (a->kind == ALLGATHER) total = a->count;
  if (total > 0 && a->kind != BARRIER) {
    if (a->recvbuf == NULL) return invalid(comm, "%s with a NULL %s", kind, a->kind == BROADCAST ? "buf" : "recvbuf");
    if (a->kind != BROADCAST && a->sendbuf == NULL && (a->kind != ALLGATHERV || sendcount > 0))
      return invalid(comm, "%s with a NULL %s", kind, "sendbuf");
  }
  if (a->kind >= SPARSE_ALLGATHER && a->op != TIDE_SUM && a->op != TIDE_AVG)
    return invalid(comm, "%s supports only sum and avg%s", kind, "");
  if (a->kind == SPARSE_ALLGATHER && a->k > 0 && (a->sendbuf == NULL || a->indices == NULL))
    return invalid(comm, "%s with NULL values or indices%s", kind, "");
  if (a->kind == HITOPK && a->compressor == NULL) return invalid(comm, "%s with a NULL compressor%s", kind, "");
  if (a->kind == ADASUM && a->dtype != TIDE_F32 && a->dtype != TIDE_F64)
    return invalid(comm, "%s with dtype %s: Adasum supports only f32 and f64", kind, tide_dtype_name(a->dtype));
  if ((a->dtype == TIDE_F16 || a->dtype == TIDE_BF16) && (a->kind == ALLREDUCE || a->kind == REDUCE_SCATTER) &&
      a->op != TIDE_SUM && a->op != TIDE_AVG)
    return invalid(comm, "%s: f16/bf16 support only sum and avg%s", kind, "");
  return 0;
}

static int start(tide_comm_t *comm, args_t *a, const size_t *counts, size_t sendcount, tide_request_t **req) {
  if (comm == NULL) return TIDE_EINVAL;
  int rc = atomic_load(&comm->failed);
  if (rc) return rc;
  if ((rc = validate(comm, a, counts, sendcount)) != 0) {
    tide__free(a->counts); /* adasum's */
    return rc;
  }
  if (a->kind == ALLGATHERV && counts != NULL) {
    a->counts = tide__malloc((size_t)comm->size * sizeof(size_t));
    if (a->counts == NULL) return TIDE_ENOMEM;
    memcpy(a->counts, counts, (size_t)comm->size * sizeof(size_t));
  }

  if (req != NULL) {
    rc = tide__task_submit(comm, execute, a, sizeof *a, req);
    if (rc != 0) tide__free(a->counts);
    return rc;
  }
  tide__task_drain(comm);
  pthread_mutex_lock(&comm->exec_lock);
  rc = execute(comm, a);
  pthread_mutex_unlock(&comm->exec_lock);
  return rc;
}

void tide_block(size_t count, int size, int rank, size_t *offset, size_t *len) {
  size_t base = count / (size_t)size, rem = count % (size_t)size, r = (size_t)rank;
  *len = base + (r < rem ? 1 : 0);
  *offset = r * base + (r < rem ? r : rem);
}

int tide_ibarrier(tide_comm_t *comm, tide_request_t **req) {
  args_t a = {BARRIER, NULL, NULL, 0, NULL, TIDE_I32, TIDE_SUM, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

int tide_ibroadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root,
                    tide_request_t **req) {
  args_t a = {BROADCAST, buf, buf, count, NULL, dtype, TIDE_SUM, root, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

int tide_iallreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                    tide_op_t op, tide_request_t **req) {
  args_t a = {ALLREDUCE, sendbuf, recvbuf, count, NULL, dtype, op, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

int tide_ireduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op, tide_request_t **req) {
  args_t a = {REDUCE_SCATTER, sendbuf, recvbuf, count, NULL, dtype, op, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

int tide_iallgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                    tide_request_t **req) {
  args_t a = {ALLGATHER, sendbuf, recvbuf, count, NULL, dtype, TIDE_SUM, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

int tide_iallgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                     const size_t *counts, tide_dtype_t dtype, tide_request_t **req) {
  args_t a = {ALLGATHERV, sendbuf, recvbuf, 0, NULL, dtype, TIDE_SUM, 0, NULL, 0, NULL};
  return start(comm, &a, counts, sendcount, req);
}

/* The blocking forms: the same path, run now on the calling thread. */
int tide_barrier(tide_comm_t *comm) { return tide_ibarrier(comm, NULL); }

int tide_broadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root) {
  return tide_ibroadcast(comm, buf, count, dtype, root, NULL);
}

int tide_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                   tide_op_t op) {
  return tide_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

int tide_reduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                        tide_dtype_t dtype, tide_op_t op) {
  return tide_ireduce_scatter(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

int tide_allgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype) {
  return tide_iallgather(comm, sendbuf, recvbuf, count, dtype, NULL);
}

int tide_allgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                    const size_t *counts, tide_dtype_t dtype) {
  return tide_iallgatherv(comm, sendbuf, sendcount, recvbuf, counts, dtype, NULL);
}

int tide_iadasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                           const tide_tensor_t *tensors, size_t ntensors, tide_request_t **req) {
  if (comm == NULL) return TIDE_EINVAL;
  int rc = atomic_load(&comm->failed);
  if (rc) return rc;
  args_t a = {ADASUM, sendbuf, recvbuf, count, NULL, dtype, TIDE_SUM, 0, NULL, 0, NULL};
  char why[200];
  if (tide__adasum_segments(tensors, ntensors, count, &a.counts, &a.k, why, sizeof why) != 0)
    return invalid(comm, "%s with %s", kind_names[ADASUM], why);
  return start(comm, &a, NULL, 0, req);
}

int tide_adasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                          const tide_tensor_t *tensors, size_t ntensors) {
  return tide_iadasum_allreduce(comm, sendbuf, recvbuf, count, dtype, tensors, ntensors, NULL);
}

int tide_sparse_allgather(tide_comm_t *comm, const float *values, const uint32_t *indices, size_t k, float *out,
                          size_t d, tide_op_t op) {
  args_t a = {SPARSE_ALLGATHER, values, out, d, NULL, TIDE_F32, op, 0, indices, k, NULL};
  return start(comm, &a, NULL, 0, NULL);
}

int tide_hitopk_shard(tide_comm_t *comm, size_t d, size_t *offset, size_t *len) {
  if (comm == NULL || offset == NULL || len == NULL) return TIDE_EINVAL;
  return tide__hitopk_shard(comm, d, offset, len);
}

int tide_hitopk_allreduce(tide_comm_t *comm, const float *grad, float *out, size_t d, tide_compressor_t *compressor,
                          tide_op_t op) {
  args_t a = {HITOPK, grad, out, d, NULL, TIDE_F32, op, 0, NULL, 0, compressor};
  return start(comm, &a, NULL, 0, NULL);
}
