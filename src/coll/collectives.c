/* The public collectives: check arguments, check that every rank made the
 * same call (a small header passed around the ring before any data moves),
 * pick the algorithm, and run it now (blocking) or on the progress thread
 * (nonblocking). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"

typedef enum {
  BARRIER = 1, BROADCAST, ALLREDUCE, REDUCE_SCATTER, ALLGATHER, ALLGATHERV, SPARSE_ALLGATHER, HITOPK, ADASUM
} kind_t;
static const char *kind_names[] = {"?", "barrier", "broadcast", "allreduce", "reduce_scatter", "allgather",
                                   "allgatherv", "sparse_allgather", "hitopk_allreduce", "adasum_allreduce"};
static const char *algo_names[] = {"-", "rd", "ring", "hier", "mpi", "vhdd", "vhdd-cores"};
#define ALGO_NAME(a) algo_names[(unsigned)(a) <= TIDE__ALGO_VHDD_CORES ? (unsigned)(a) : 0]

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

/* theirs came off the wire from their_rank: anything at all. 0 when it
 * matches mine; else TIDE_EPROTO or TIDE_EMISMATCH and the message. Pure
 * (fuzz/fuzz_coll_header.c runs it on arbitrary bytes). */
static int compare_headers(const header_t *mine, int my_rank, const header_t *theirs, int their_rank, char *msg,
                           size_t cap) {
  char what[160];
  describe(mine, what, sizeof what);
  if (theirs->magic != HEADER_MAGIC) {
    snprintf(msg, cap, "rank %d received a corrupt collective header from rank %d", my_rank, their_rank);
    return TIDE_EPROTO;
  }
  if (theirs->seq != mine->seq || theirs->kind != mine->kind || theirs->count != mine->count ||
      theirs->counts_hash != mine->counts_hash || theirs->dtype != mine->dtype || theirs->op != mine->op ||
      theirs->root != mine->root) {
    char other[160];
    describe(theirs, other, sizeof other);
    snprintf(msg, cap,
             "collective mismatch: rank %d called %s as collective #%llu while rank %d called %s as collective #%llu",
             my_rank, what, (unsigned long long)mine->seq, their_rank, other, (unsigned long long)theirs->seq);
    return TIDE_EMISMATCH;
  }
  if (theirs->algo != mine->algo) {
    snprintf(msg, cap,
             "rank %d chose algorithm %s while rank %d chose %s for %s: TIDE_ALGO, TIDE_SMALL_BYTES, "
             "TIDE_ADASUM_HIER or TIDE_SHM differ between ranks",
             my_rank, ALGO_NAME(mine->algo), their_rank, ALGO_NAME(theirs->algo), what);
    return TIDE_EMISMATCH;
  }
  return 0;
}

/* Every rank's header reaches every rank (an allgather of 48 bytes each,
 * ceil(log2 size) steps) before any payload moves, so every rank reaches the same verdict:
 * 0, or TIDE_EMISMATCH with the same message naming rank 0's call and the
 * first call that differs from it. A mismatch leaves the communicator
 * usable: no payload moved, and the ranks take the highest collective
 * number among them, so ranks that skipped a call (a local TIDE_EINVAL)
 * agree again from the next call on. A corrupt header fails the
 * communicator (TIDE_EPROTO). */
/* Bruck's allgather of the headers: ceil(log2 size) steps; in each, a rank
 * that holds the headers of ranks rank .. rank+have-1 sends them to
 * rank-have and receives the next ones from rank+have. rotated[i] ends as
 * rank (rank + i) % size's header. */
static int gather_headers(tide_comm_t *comm, const header_t *mine, header_t *rotated, header_t *all) {
  int n = comm->size, have = 1;
  rotated[0] = *mine;
  while (have < n) {
    int move = have < n - have ? have : n - have;
    tide__p2p_t ops[2];
    tide__p2p_set(&ops[0], TIDE__P2P_SEND, (comm->rank - have + n) % n, rotated, NULL, (size_t)move * sizeof *mine,
                  TIDE_I32, TIDE_SUM);
    tide__p2p_set(&ops[1], TIDE__P2P_RECV, (comm->rank + have) % n, NULL, rotated + have,
                  (size_t)move * sizeof *mine, TIDE_I32, TIDE_SUM);
    TIDE_CHECK(tide__comm_run(comm, ops, 2, "collective header exchange"));
    have += move;
  }
  for (int i = 0; i < n; i++) all[(comm->rank + i) % n] = rotated[i];
  return 0;
}

static int check_headers(tide_comm_t *comm, const header_t *mine) {
  if (comm->size == 1) return 0;
  size_t n = (size_t)comm->size;
  header_t *all = tide__malloc(2 * n * sizeof *all);
  if (all == NULL)
    return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: no memory for %zu collective headers", comm->rank, n);
  int rc = gather_headers(comm, mine, all + n, all);
  char msg[700];
  for (size_t r = 0; rc == 0 && r < n; r++)
    if (all[r].magic != HEADER_MAGIC) {
      snprintf(msg, sizeof msg, "rank %d received a corrupt collective header from rank %zu", comm->rank, r);
      rc = TIDE_EPROTO;
    }
  for (size_t r = 1; rc == 0 && r < n; r++) rc = compare_headers(&all[0], 0, &all[r], (int)r, msg, sizeof msg);
  if (rc == TIDE_EMISMATCH) {
    uint64_t seq = comm->seq;
    for (size_t r = 0; r < n; r++)
      if (all[r].seq > seq) seq = all[r].seq;
    comm->seq = seq;
    tide__comm_note(comm, rc, "%s", msg);
  } else if (rc == TIDE_EPROTO) {
    rc = tide__comm_fail(comm, rc, 0, "%s", msg);
  }
  tide__free(all);
  return rc;
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
    h.counts_hash = tide__fnv1a(a->counts, (size_t)comm->size * sizeof *a->counts);
    h.count = 0;
    for (int r = 0; r < comm->size; r++) h.count += a->counts[r];
  }
  if (a->kind == ADASUM) h.counts_hash = tide__fnv1a(a->counts, a->k * sizeof *a->counts);
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

/* An invalid call is refused on this rank alone and leaves the
 * communicator usable: nothing is sent. It still takes a collective
 * number, so that if the other ranks made the call, this rank's next call
 * is reported on every rank as a mismatch (#n+1 against #n), after which
 * all agree again. */
__attribute__((format(printf, 2, 3))) static int invalid(tide_comm_t *comm, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tide__task_drain(comm);
  pthread_mutex_lock(&comm->exec_lock);
  comm->seq++; /* the refused call takes the number the others see */
  tide__comm_note(comm, TIDE_EINVAL, "rank %d called %s", comm->rank, msg);
  pthread_mutex_unlock(&comm->exec_lock);
  return TIDE_EINVAL;
}

/* Counts whose bytes overflow (or pass PTRDIFF_MAX) would wrap the kernels'
 * and the transports' arithmetic; an index of our own outside [0, d) is the
 * caller's mistake, not a peer's. */
static int validate_sizes(tide_comm_t *comm, const args_t *a, const size_t *counts) {
  const char *kind = kind_names[a->kind];
  size_t esize = tide_dtype_size(a->dtype), elements = a->count, bytes;
  char detail[200];
  if (a->kind == ALLGATHER && __builtin_mul_overflow(a->count, (size_t)comm->size, &elements)) elements = SIZE_MAX;
  for (int r = 0; a->kind == ALLGATHERV && r < comm->size; r++)
    if (__builtin_add_overflow(r == 0 ? 0 : elements, counts[r], &elements)) elements = SIZE_MAX;
  if (__builtin_mul_overflow(elements, esize, &bytes) || bytes > (size_t)PTRDIFF_MAX) {
    if (a->kind == ALLGATHERV)
      snprintf(detail, sizeof detail, "counts that add up to more than PTRDIFF_MAX bytes of %s",
               tide_dtype_name(a->dtype));
    else
      snprintf(detail, sizeof detail, "%s = %zu: %s elements of %s are more than PTRDIFF_MAX bytes",
               a->kind >= SPARSE_ALLGATHER ? "d" : "count", a->count,
               a->kind == ALLGATHER ? "count * size" : "that many", tide_dtype_name(a->dtype));
    return invalid(comm, "%s with %s", kind, detail);
  }
  if (a->kind == SPARSE_ALLGATHER) {
    if (a->k > (size_t)PTRDIFF_MAX / (sizeof(float) + sizeof(uint32_t))) {
      snprintf(detail, sizeof detail, "k = %zu pairs: more bytes than PTRDIFF_MAX", a->k);
      return invalid(comm, "%s with %s", kind, detail);
    }
    for (size_t i = 0; i < a->k; i++)
      if (a->indices[i] >= a->count) {
        snprintf(detail, sizeof detail, "indices[%zu] = %u outside [0, d = %zu)", i, a->indices[i], a->count);
        return invalid(comm, "%s with %s", kind, detail);
      }
  }
  return 0;
}

static int validate(tide_comm_t *comm, const args_t *a, const size_t *counts, size_t sendcount) {
  const char *kind = kind_names[a->kind];
  if ((unsigned)a->dtype >= TIDE_DTYPE_COUNT) return invalid(comm, "%s with an unknown dtype", kind);
  if ((unsigned)a->op >= TIDE_OP_COUNT) return invalid(comm, "%s with an unknown reduction op", kind);
  if (a->kind == BROADCAST && (a->root < 0 || a->root >= comm->size))
    return invalid(comm, "%s with root outside [0, size)", kind);
  size_t total = a->count;
  if (a->kind == ALLGATHERV) {
    if (counts == NULL) return invalid(comm, "%s with counts == NULL", kind);
    if (sendcount != counts[comm->rank])
      return invalid(comm, "%s with sendcount != counts[rank]", kind);
    total = 1;
  }
  if (a->kind == ALLGATHER) total = a->count;
  if (total > 0 && a->kind != BARRIER) {
    if (a->recvbuf == NULL) return invalid(comm, "%s with a NULL %s", kind, a->kind == BROADCAST ? "buf" : "recvbuf");
    if (a->kind != BROADCAST && a->sendbuf == NULL && (a->kind != ALLGATHERV || sendcount > 0))
      return invalid(comm, "%s with a NULL %s", kind, "sendbuf");
  }
  if (a->kind >= SPARSE_ALLGATHER && a->op != TIDE_SUM && a->op != TIDE_AVG)
    return invalid(comm, "%s supports only sum and avg", kind);
  if (a->kind == SPARSE_ALLGATHER && a->k > 0 && (a->sendbuf == NULL || a->indices == NULL))
    return invalid(comm, "%s with NULL values or indices", kind);
  if (a->kind == HITOPK && a->compressor == NULL) return invalid(comm, "%s with a NULL compressor", kind);
  TIDE_CHECK(validate_sizes(comm, a, counts));
  if (a->kind == ADASUM && a->dtype != TIDE_F32 && a->dtype != TIDE_F64)
    return invalid(comm, "%s with dtype %s: Adasum supports only f32 and f64", kind, tide_dtype_name(a->dtype));
  return 0;
}

static int start(tide_comm_t *comm, args_t *a, const size_t *counts, size_t sendcount, tide_request_t **req) {
  if (comm == NULL) {
    TIDE_ERROR("tide_%s: comm must not be NULL", kind_names[a->kind]);
    return TIDE_EINVAL;
  }
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
  if (size < 1 || rank < 0 || rank >= size || offset == NULL || len == NULL) {
    TIDE_ERROR("tide_block: size = %d and rank = %d must satisfy 0 <= rank < size, and offset (%s) and "
               "len (%s) must not be NULL; writing an empty block", size, rank, offset ? "set" : "NULL",
               len ? "set" : "NULL");
    if (offset != NULL) *offset = 0;
    if (len != NULL) *len = 0;
    return;
  }
  size_t base = count / (size_t)size, rem = count % (size_t)size, r = (size_t)rank;
  *len = base + (r < rem ? 1 : 0);
  *offset = r * base + (r < rem ? r : rem);
}

static int run_barrier(tide_comm_t *comm, tide_request_t **req) {
  args_t a = {BARRIER, NULL, NULL, 0, NULL, TIDE_I32, TIDE_SUM, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

static int run_broadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root,
                         tide_request_t **req) {
  args_t a = {BROADCAST, buf, buf, count, NULL, dtype, TIDE_SUM, root, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

static int run_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                         tide_op_t op, tide_request_t **req) {
  args_t a = {ALLREDUCE, sendbuf, recvbuf, count, NULL, dtype, op, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

static int run_reduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              tide_dtype_t dtype, tide_op_t op, tide_request_t **req) {
  args_t a = {REDUCE_SCATTER, sendbuf, recvbuf, count, NULL, dtype, op, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

static int run_allgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                         tide_request_t **req) {
  args_t a = {ALLGATHER, sendbuf, recvbuf, count, NULL, dtype, TIDE_SUM, 0, NULL, 0, NULL};
  return start(comm, &a, NULL, 0, req);
}

static int run_allgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                          const size_t *counts, tide_dtype_t dtype, tide_request_t **req) {
  args_t a = {ALLGATHERV, sendbuf, recvbuf, 0, NULL, dtype, TIDE_SUM, 0, NULL, 0, NULL};
  return start(comm, &a, counts, sendcount, req);
}

/* The nonblocking forms need somewhere to put the request. */
static int null_request(const char *fn) {
  TIDE_ERROR("%s: req must not be NULL (the blocking form takes no request)", fn);
  return TIDE_EINVAL;
}

int tide_ibarrier(tide_comm_t *comm, tide_request_t **req) {
  return req != NULL ? run_barrier(comm, req) : null_request("tide_ibarrier");
}

int tide_ibroadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root,
                    tide_request_t **req) {
  return req != NULL ? run_broadcast(comm, buf, count, dtype, root, req) : null_request("tide_ibroadcast");
}

int tide_iallreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                    tide_op_t op, tide_request_t **req) {
  return req != NULL ? run_allreduce(comm, sendbuf, recvbuf, count, dtype, op, req) : null_request("tide_iallreduce");
}

int tide_ireduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op, tide_request_t **req) {
  return req != NULL ? run_reduce_scatter(comm, sendbuf, recvbuf, count, dtype, op, req)
                     : null_request("tide_ireduce_scatter");
}

int tide_iallgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                    tide_request_t **req) {
  return req != NULL ? run_allgather(comm, sendbuf, recvbuf, count, dtype, req) : null_request("tide_iallgather");
}

int tide_iallgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                     const size_t *counts, tide_dtype_t dtype, tide_request_t **req) {
  return req != NULL ? run_allgatherv(comm, sendbuf, sendcount, recvbuf, counts, dtype, req)
                     : null_request("tide_iallgatherv");
}

/* The blocking forms: the same path, run now on the calling thread. */
int tide_barrier(tide_comm_t *comm) { return run_barrier(comm, NULL); }

int tide_broadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root) {
  return run_broadcast(comm, buf, count, dtype, root, NULL);
}

int tide_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                   tide_op_t op) {
  return run_allreduce(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

int tide_reduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                        tide_dtype_t dtype, tide_op_t op) {
  return run_reduce_scatter(comm, sendbuf, recvbuf, count, dtype, op, NULL);
}

int tide_allgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype) {
  return run_allgather(comm, sendbuf, recvbuf, count, dtype, NULL);
}

int tide_allgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                    const size_t *counts, tide_dtype_t dtype) {
  return run_allgatherv(comm, sendbuf, sendcount, recvbuf, counts, dtype, NULL);
}

int tide_iadasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                           const tide_tensor_t *tensors, size_t ntensors, tide_request_t **req) {
  if (comm == NULL) return tide__null_arg("tide_iadasum_allreduce", "comm");
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
  if (comm == NULL) return tide__null_arg("tide_hitopk_shard", "comm");
  if (offset == NULL || len == NULL) return tide__null_arg("tide_hitopk_shard", "offset or len");
  return tide__hitopk_shard(comm, d, offset, len);
}

int tide_hitopk_allreduce(tide_comm_t *comm, const float *grad, float *out, size_t d, tide_compressor_t *compressor,
                          tide_op_t op) {
  args_t a = {HITOPK, grad, out, d, NULL, TIDE_F32, op, 0, NULL, 0, compressor};
  return start(comm, &a, NULL, 0, NULL);
}
