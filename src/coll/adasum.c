/* Adasum allreduce (Maleki et al., MLSys 2021): per tensor,
 *   Adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b,
 * so orthogonal parts add and parallel parts average.
 *
 * Vector-halving, distance-doubling over the largest power of two p <= n
 * ranks: at distance d = 1, 2, ..., p/2 a rank keeps half of its segment,
 * swaps the other half with the rank d away, and combines its half of the
 * two groups' vectors, with the dot product and norms of every tensor
 * summed over the 2d ranks that hold the pieces of those vectors. Then the
 * halves travel back (distance-halving). The first 2(n - p) ranks are folded
 * first: rank 2i hands its vector to 2i+1, which combines the two and takes
 * part for both (docs/algorithms.md says what that does to the result).
 *
 * Hierarchical (ranks on several hosts, as many on each): an intra-host
 * reduce-scatter averages the host's vectors, each local rank runs the above
 * across hosts on its block (with the tensors' dot products summed over the
 * host's blocks too), and an intra-host allgather finishes.
 *
 * Every element of the result is computed on one rank and copied to the
 * others, and the sums of the dot products are made in mirrored pairs (x+y
 * on one rank, y+x on the other), so all ranks end with bitwise identical
 * results and use identical coefficients. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"

/* One Adasum over the ranks of `comm` on buf[0..count), which holds the
 * elements [base, base + count) of the whole vector. */
typedef struct {
  tide_comm_t *comm;   /* the ranks combined */
  tide_comm_t *parent; /* failures are lifted to it (comm itself when flat) */
  tide_comm_t *shards; /* NULL, or the ranks holding the rest of every tensor (hierarchical) */
  tide_dtype_t dtype;
  const size_t *end; /* end[s]: where segment (tensor) s ends; end[nseg-1] is the whole count */
  size_t nseg;
  size_t base;
  double *partial, *incoming; /* 3 * nseg: (a.b, |a|^2, |b|^2) per segment */
} adasum_t;

static int lift(tide_comm_t *comm, tide_comm_t *sub, int rc) {
  if (rc == 0 || comm == sub) return rc;
  return tide__comm_fail(comm, rc, 1, "%s", tide_comm_last_error(sub));
}

/* ---- kernels: dot products and norms in double, fixed order ---------------- */

/* Eight lanes per sum break the dependency chain and let the compiler
 * vectorise, with one fixed order of additions whatever the instruction
 * set: the clones for wider vectors compute the same bits (no contraction
 * into FMA in ISO C), only faster. */
/* Not under ThreadSanitizer: the clones' ifunc resolvers run while the
 * dynamic loader relocates, before TSan's runtime is up, and crash there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL_CLONES
#endif
#define LANES 8
/* Lane k of a sum takes the elements k, k + 8, k + 16, ...: GCC's vector
 * types make that one instruction per step whatever the clone (with plain
 * loops GCC left a.b scalar, or all three), and ISO C (no FMA contraction)
 * keeps the bits of the plain per-lane loops. */
typedef double lanes_t __attribute__((vector_size(LANES * sizeof(double))));
typedef float lanes_f32_t __attribute__((vector_size(LANES * sizeof(float))));
#define LOAD_LANES_f32(dst, p)                                                                     \
  do {                                                                                             \
    lanes_f32_t f_;                                                                                \
    memcpy(&f_, (p), sizeof f_);                                                                   \
    (dst) = __builtin_convertvector(f_, lanes_t);                                                  \
  } while (0)
#define LOAD_LANES_f64(dst, p) memcpy(&(dst), (p), sizeof(dst))
#define DEFINE_KERNELS(T, suffix)                                                                  \
  KERNEL_CLONES static void dots_##suffix(const T *a, const T *b, size_t n, double *out) {         \
    lanes_t ab = {0}, aa = {0}, bb = {0};                                                          \
    size_t i = 0;                                                                                  \
    for (; i + LANES <= n; i += LANES) {                                                           \
      lanes_t x, y;                                                                                \
      LOAD_LANES_##suffix(x, a + i);                                                               \
      LOAD_LANES_##suffix(y, b + i);                                                               \
      ab += x * y;                                                                                 \
      aa += x * x;                                                                                 \
      bb += y * y;                                                                                 \
    }                                                                                              \
    for (int k = 0; i < n; i++, k++) {                                                             \
      double x = a[i], y = b[i];                                                                   \
      ab[k] += x * y;                                                                              \
      aa[k] += x * x;                                                                              \
      bb[k] += y * y;                                                                              \
    }                                                                                              \
    for (int w = LANES / 2; w > 0; w /= 2)                                                         \
      for (int k = 0; k < w; k++) {                                                                \
        ab[k] += ab[k + w];                                                                        \
        aa[k] += aa[k + w];                                                                        \
        bb[k] += bb[k + w];                                                                        \
      }                                                                                            \
    out[0] += ab[0];                                                                               \
    out[1] += aa[0];                                                                               \
    out[2] += bb[0];                                                                               \
  }                                                                                                \
  KERNEL_CLONES static void combine_##suffix(T *out, const T *a, const T *b, size_t n, double ca,  \
                                             double cb) {                                          \
    T x = (T)ca, y = (T)cb;                                                                        \
    for (size_t i = 0; i < n; i++) out[i] = x * a[i] + y * b[i];                                   \
  }
DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)

/* The coefficients of a and b from (a.b, |a|^2, |b|^2); a vector with
 * |x|^2 < sqrt(DBL_MIN) (zero, in effect) keeps coefficient 1. */
static void coefficients(const double *t, double *ca, double *cb) {
  const double tiny = sqrt(DBL_MIN);
  *ca = t[1] >= tiny ? 1.0 - t[0] / (2.0 * t[1]) : 1.0;
  *cb = t[2] >= tiny ? 1.0 - t[0] / (2.0 * t[2]) : 1.0;
}

/* Loops over the segments s overlapping buf[lo, hi); [plo, phi) is the
 * piece of s inside it, in buf coordinates. */
#define FOR_PIECES(x, lo, hi, s, plo, phi)                                                         \
  for (size_t s = first_segment(x, lo), plo, phi;                                                  \
       s < (x)->nseg && (plo = piece_lo(x, s, lo)) < (hi) && (phi = piece_hi(x, s, hi), 1); s++)

static size_t first_segment(const adasum_t *x, size_t lo) {
  size_t g = x->base + lo, a = 0, b = x->nseg; /* the first s with end[s] > g */
  while (a < b) {
    size_t m = a + (b - a) / 2;
    if (x->end[m] > g) b = m;
    else a = m + 1;
  }
  return a;
}
static size_t piece_lo(const adasum_t *x, size_t s, size_t lo) {
  size_t start = s == 0 ? 0 : x->end[s - 1];
  return start > x->base + lo ? start - x->base : lo;
}
static size_t piece_hi(const adasum_t *x, size_t s, size_t hi) {
  return x->end[s] - x->base < hi ? x->end[s] - x->base : hi;
}

/* Adds the partial (a.b, |a|^2, |b|^2) of every segment piece in [lo, hi)
 * to x->partial; a and b point at element lo. */
static void partial_dots(adasum_t *x, const void *a, const void *b, size_t lo, size_t hi) {
  size_t esize = tide_dtype_size(x->dtype);
  FOR_PIECES(x, lo, hi, s, plo, phi) {
    const uint8_t *pa = (const uint8_t *)a + (plo - lo) * esize, *pb = (const uint8_t *)b + (plo - lo) * esize;
    if (x->dtype == TIDE_F32) dots_f32((const float *)pa, (const float *)pb, phi - plo, x->partial + 3 * s);
    else dots_f64((const double *)pa, (const double *)pb, phi - plo, x->partial + 3 * s);
  }
}

/* out[lo, hi) = ca*a + cb*b per segment, from the summed x->partial. */
static void combine(adasum_t *x, void *out, const void *a, const void *b, size_t lo, size_t hi) {
  size_t esize = tide_dtype_size(x->dtype);
  FOR_PIECES(x, lo, hi, s, plo, phi) {
    double ca, cb;
    coefficients(x->partial + 3 * s, &ca, &cb);
    size_t at = (plo - lo) * esize;
    if (x->dtype == TIDE_F32)
      combine_f32((float *)((uint8_t *)out + at), (const float *)((const uint8_t *)a + at),
                  (const float *)((const uint8_t *)b + at), phi - plo, ca, cb);
    else
      combine_f64((double *)((uint8_t *)out + at), (const double *)((const uint8_t *)a + at),
                  (const double *)((const uint8_t *)b + at), phi - plo, ca, cb);
  }
}

/* ---- communication --------------------------------------------------------- */

static int exchange(adasum_t *x, int peer, const void *src, size_t send_bytes, void *dst, size_t recv_bytes) {
  tide__p2p_t ops[2];
  int n = 0;
  memset(ops, 0, sizeof ops);
  if (send_bytes > 0) {
    ops[n].kind = TIDE__P2P_SEND;
    ops[n].peer = peer;
    ops[n].src = src;
    ops[n++].bytes = send_bytes;
  }
  if (recv_bytes > 0) {
    ops[n].kind = TIDE__P2P_RECV;
    ops[n].peer = peer;
    ops[n].dst = dst;
    ops[n++].bytes = recv_bytes;
  }
  if (n == 0) return 0;
  return lift(x->parent, x->comm, tide__comm_run(x->comm, ops, n, "adasum_allreduce"));
}

/* The real rank of virtual rank v (folded pairs count once). */
static int real_rank(int v, int extra) { return v < extra ? 2 * v + 1 : v + extra; }

/* Bytes per piece of a level's swap: each piece's dot products are taken
 * as soon as it arrives, while it is still in the cache. */
#define PIECE_BYTES ((size_t)512 << 10)

/* Sends give[0..give_n) to peer while receiving its keep_n elements into
 * theirs, piece by piece (both sides cut the same pieces), and sets
 * x->partial to the dot products of (a, b) over buf[keep_lo, keep_lo +
 * keep_n): mine is ours, theirs the peer's, a the lower group's. */
static int swap_and_dot(adasum_t *x, int peer, const uint8_t *give, size_t give_n, const uint8_t *mine,
                        uint8_t *theirs, size_t keep_lo, size_t keep_n, int upper) {
  size_t esize = tide_dtype_size(x->dtype), most = give_n > keep_n ? give_n : keep_n;
  int pieces = most == 0 ? 1 : (int)((most * esize + PIECE_BYTES - 1) / PIECE_BYTES);
  memset(x->partial, 0, 3 * x->nseg * sizeof *x->partial);
  for (int q = 0; q < pieces; q++) {
    size_t go, gl, ko, kl;
    tide_block(give_n, pieces, q, &go, &gl);
    tide_block(keep_n, pieces, q, &ko, &kl);
    TIDE_CHECK(exchange(x, peer, give + go * esize, gl * esize, theirs + ko * esize, kl * esize));
    const uint8_t *a = upper ? theirs : mine, *b = upper ? mine : theirs;
    partial_dots(x, a + ko * esize, b + ko * esize, keep_lo + ko, keep_lo + ko + kl);
  }
  return 0;
}

/* The last level: base[lo, hi) = the combination of a and b (which start
 * at element lo), piece by piece, each piece sent to peer as soon as it is
 * made, while the peer's finished base[other_lo, other_hi) comes in (both
 * sides cut the same pieces). */
static int combine_and_swap(adasum_t *x, int peer, const uint8_t *a, const uint8_t *b, uint8_t *base, size_t lo,
                            size_t hi, size_t other_lo, size_t other_hi) {
  size_t esize = tide_dtype_size(x->dtype), n = hi - lo, other_n = other_hi - other_lo;
  size_t most = n > other_n ? n : other_n;
  int pieces = most == 0 ? 1 : (int)((most * esize + PIECE_BYTES - 1) / PIECE_BYTES);
  for (int q = 0; q < pieces; q++) {
    size_t go, gl, ko, kl;
    tide_block(n, pieces, q, &go, &gl);
    tide_block(other_n, pieces, q, &ko, &kl);
    combine(x, base + (lo + go) * esize, a + go * esize, b + go * esize, lo + go, lo + go + gl);
    TIDE_CHECK(exchange(x, peer, base + (lo + go) * esize, gl * esize, base + (other_lo + ko) * esize, kl * esize));
  }
  return 0;
}

/* Sums x->partial over the virtual ranks v ^ m, m = 1, 2, ..., width/2
 * (recursive doubling: x+y here, y+x there), then over the shards. */
static int sum_partials(adasum_t *x, int v, int width, int extra) {
  size_t bytes = 3 * x->nseg * sizeof(double);
  for (int m = 1; m < width; m <<= 1) {
    TIDE_CHECK(exchange(x, real_rank(v ^ m, extra), x->partial, bytes, x->incoming, bytes));
    for (size_t i = 0; i < 3 * x->nseg; i++) x->partial[i] += x->incoming[i];
  }
  if (x->shards == NULL) return 0;
  return lift(x->parent, x->shards,
              tide__allreduce_rd(x->shards, x->partial, x->partial, 3 * x->nseg, TIDE_F64, TIDE_SUM));
}

/* Adasum over x->comm of in[0..count) into buf (in may equal buf; in is
 * only read before buf is written, so a separate input costs no copy). */
static int vhdd(adasum_t *x, const void *in, void *buf, size_t count) {
  tide_comm_t *c = x->comm;
  int n = c->size, r = c->rank, p = 1;
  while (p * 2 <= n) p *= 2;
  int extra = n - p, v;
  size_t esize = tide_dtype_size(x->dtype);
  uint8_t *base = buf;
  const uint8_t *src = in; /* where this rank's current vector is */
  uint8_t *scratch = tide__comm_scratch(c, (extra > 0 ? count : count - count / 2) * esize);
  if (scratch == NULL) return tide__comm_fail(x->parent, TIDE_ENOMEM, 0, "rank %d: out of memory in adasum_allreduce",
                                              x->parent->rank);
  int64_t t_move = 0, t_sum = 0, t_combine = 0, t0 = tide__now_ns(), t1;
  if (r < 2 * extra) {
    if (r % 2 == 0) { /* folded: the odd neighbour combines for both of us */
      TIDE_CHECK(swap_and_dot(x, r + 1, src, count, scratch, scratch, 0, 0, 0));
      return exchange(x, r + 1, NULL, 0, buf, count * esize);
    }
    TIDE_CHECK(swap_and_dot(x, r - 1, NULL, 0, src, scratch, 0, count, 1));
    TIDE_CHECK(sum_partials(x, 0, 1, extra));
    combine(x, buf, scratch, src, 0, count);
    src = base;
    v = r / 2;
  } else {
    v = r - extra;
  }
  /* Reduce phase: the segment [lo, hi) halves at every level. The last
   * level's combination waits: it is made piece by piece just before the
   * piece goes out in the first gather swap, while it is in the cache. */
  size_t lo = 0, hi = count, seg_lo[32], seg_hi[32];
  const uint8_t *last_a = NULL, *last_b = NULL;
  int levels = 0;
  for (int d = 1; d < p; d <<= 1, levels++) {
    size_t mid = lo + (hi - lo) / 2;
    int upper = (v & d) != 0;
    size_t keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    size_t give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    TIDE_CHECK(swap_and_dot(x, real_rank(v ^ d, extra), src + give_lo * esize, give_hi - give_lo,
                            src + keep_lo * esize, scratch, keep_lo, keep_hi - keep_lo, upper));
    t_move += (t1 = tide__now_ns()) - t0;
    TIDE_CHECK(sum_partials(x, v, 2 * d, extra));
    t_sum += (t0 = tide__now_ns()) - t1;
    const uint8_t *mine = src + keep_lo * esize;
    last_a = upper ? scratch : mine;
    last_b = upper ? mine : scratch;
    if (2 * d < p) {
      combine(x, base + keep_lo * esize, last_a, last_b, keep_lo, keep_hi);
      src = base;
    }
    t_combine += (t1 = tide__now_ns()) - t0;
    t0 = t1;
    seg_lo[levels] = lo;
    seg_hi[levels] = hi;
    lo = keep_lo;
    hi = keep_hi;
  }
  /* Gather phase: swap the finished halves back, distance-halving. */
  for (int l = levels - 1; l >= 0; l--) {
    int d = 1 << l;
    size_t mid = seg_lo[l] + (seg_hi[l] - seg_lo[l]) / 2;
    int upper = (v & d) != 0; /* then the peer holds the lower half */
    size_t other_lo = upper ? seg_lo[l] : mid, other_hi = upper ? mid : seg_hi[l];
    if (l == levels - 1) {
      TIDE_CHECK(combine_and_swap(x, real_rank(v ^ d, extra), last_a, last_b, base, lo, hi, other_lo, other_hi));
    } else {
      TIDE_CHECK(exchange(x, real_rank(v ^ d, extra), base + lo * esize, (hi - lo) * esize, base + other_lo * esize,
                          (other_hi - other_lo) * esize));
    }
    lo = seg_lo[l];
    hi = seg_hi[l];
  }
  t_move += tide__now_ns() - t0;
  TIDE_DEBUG("adasum of %zu elements: moving and dot products %.2f ms, summing them %.2f ms, combining %.2f ms",
             count, t_move / 1e6, t_sum / 1e6, t_combine / 1e6);
  if (r < 2 * extra) TIDE_CHECK(exchange(x, r - 1, buf, count * esize, NULL, 0));
  return 0;
}

/* ---- the collective -------------------------------------------------------- */

static int by_offset(const void *a, const void *b) {
  size_t x = ((const tide_tensor_t *)a)->offset, y = ((const tide_tensor_t *)b)->offset;
  return (x > y) - (x < y);
}

int tide__adasum_segments(const tide_tensor_t *tensors, size_t ntensors, size_t count, size_t **end_out,
                          size_t *nseg_out, char *why, size_t cap) {
  if (ntensors > 0 && tensors == NULL) {
    snprintf(why, cap, "tensors == NULL and ntensors = %zu", ntensors);
    return TIDE_EINVAL;
  }
  size_t n = ntensors > 0 ? ntensors : 1;
  tide_tensor_t *sorted = tide__malloc(n * sizeof *sorted);
  size_t *end = tide__malloc(n * sizeof *end);
  if (sorted == NULL || end == NULL) {
    tide__free(sorted);
    tide__free(end);
    snprintf(why, cap, "out of memory");
    return TIDE_ENOMEM;
  }
  if (ntensors > 0) memcpy(sorted, tensors, n * sizeof *sorted);
  else sorted[0] = (tide_tensor_t){.offset = 0, .count = count};
  qsort(sorted, n, sizeof *sorted, by_offset);
  size_t at = 0, nseg = 0;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const tide_tensor_t *t = &sorted[i];
    if (t->offset != at || t->count > count - at) {
      snprintf(why, cap,
               "tensors that do not tile [0, count=%zu): a tensor at offset %zu of %zu elements where the "
               "previous ones end at %zu",
               count, t->offset, t->count, at);
      rc = TIDE_EINVAL;
    }
    at += t->count;
    if (t->count > 0) end[nseg++] = at;
  }
  if (rc == 0 && at != count) {
    snprintf(why, cap, "tensors that cover %zu of count=%zu elements", at, count);
    rc = TIDE_EINVAL;
  }
  tide__free(sorted);
  if (rc != 0) {
    tide__free(end);
    return rc;
  }
  *end_out = end;
  *nseg_out = nseg;
  return 0;
}

tide__algo_t tide__adasum_algo(const tide_comm_t *comm) {
  int hier = comm->node_count > 1 && comm->uniform_nodes && comm->local_size > 1 &&
             tide__param_int(TIDE__PARAM_ADASUM_HIER) != 0;
  return comm->size == 1 ? TIDE__ALGO_NONE : hier ? TIDE__ALGO_HIER : TIDE__ALGO_VHDD;
}

static int adasum_hier(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, adasum_t *x) {
  tide_comm_t *local, *cross;
  /* Creating them waits on the store, blind to a failure elsewhere (a rank
   * that chose flat Adasum fails the header check and leaves): a barrier
   * first sees that failure. */
  if (comm->local == NULL || comm->cross == NULL) TIDE_CHECK(tide__barrier(comm));
  TIDE_CHECK(tide_comm_local(comm, &local));
  TIDE_CHECK(tide_comm_cross(comm, &cross));
  int m = local->size;
  size_t *counts = tide__malloc(2 * (size_t)m * sizeof *counts), *displs = counts + m;
  if (counts == NULL) return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: out of memory in adasum_allreduce",
                                             comm->rank);
  for (int j = 0; j < m; j++) tide_block(count, m, j, &displs[j], &counts[j]);
  size_t esize = tide_dtype_size(x->dtype), mine_count = counts[local->rank];
  uint8_t *mine = (uint8_t *)recvbuf + displs[local->rank] * esize;
  int rc = lift(comm, local, tide__reduce_scatter_ring(local, sendbuf, mine, count, x->dtype, TIDE_SUM));
  if (rc == 0) {
    tide__scale(mine, mine_count, x->dtype, m);
    x->comm = cross;
    x->shards = local;
    x->base = displs[local->rank];
    rc = vhdd(x, mine, mine, mine_count);
  }
  if (rc == 0) rc = lift(comm, local, tide__allgatherv_ring(local, NULL, recvbuf, counts, displs, x->dtype));
  tide__free(counts);
  return rc;
}

int tide__adasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                           const size_t *end, size_t nseg, tide__algo_t algo) {
  if (algo == TIDE__ALGO_NONE || count == 0) {
    if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * tide_dtype_size(dtype));
    return 0;
  }
  adasum_t x = {comm, comm, NULL, dtype, end, nseg, 0, NULL, NULL};
  x.partial = tide__malloc(6 * nseg * sizeof *x.partial);
  if (x.partial == NULL)
    return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: out of memory in adasum_allreduce", comm->rank);
  x.incoming = x.partial + 3 * nseg;
  int rc;
  if (algo == TIDE__ALGO_HIER) {
    rc = adasum_hier(comm, sendbuf, recvbuf, count, &x);
  } else {
    rc = vhdd(&x, sendbuf, recvbuf, count);
  }
  tide__free(x.partial);
  return rc;
}
