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
 * Memory traffic, which sets the time on one host: the dot products are
 * taken as the peer's half comes out of the transport (a consumer on the
 * receive), and a level's combination is not made in a pass of its own but
 * piece by piece while the next swap moves it (a producer on the send for
 * the half given away, the consumer for the half kept; the last level's in
 * the first gather swap). The first level's incoming half, which must be
 * kept until the dot products are summed, lands in the part of the result
 * where its combination goes (unless in place), so that combination is
 * made where it lies rather than read from a scratch buffer into fresh
 * lines of the result (docs/algorithms.md, "Memory traffic").
 *
 * Every element of the result is computed on one rank and copied to the
 * others, and every rank of a group adds the group's partial dot products
 * in the same order, so all ranks end with bitwise identical results and
 * use identical coefficients. */
#include <float.h>
#include <stdatomic.h>
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
  double *partial;  /* 3 * nseg: (a.b, |a|^2, |b|^2) per segment */
  double *incoming; /* DIRECT_WIDTH times that: the group's partials */
  double *sums;               /* SUMS * nseg: the running lanes of a level's dot products */
  int cores_first;            /* pair ranks bound to the same CPUs first (TIDE__ALGO_VHDD_CORES) */
  int stream;                 /* how make() writes into the transport (see choose_stores) */
  int64_t made_bytes;          /* bytes make() wrote into a transport's memory */
  int64_t swap_ns, swap_bytes; /* the swaps that made them: time, bytes sent and received */
} adasum_t;

static int lift(tide_comm_t *comm, tide_comm_t *sub, int rc) {
  if (rc == 0 || comm == sub) return rc;
  return tide__comm_fail(comm, rc, 1, "%s", tide_comm_last_error(sub));
}

/* ---- kernels: dot products and norms, fixed order ---------------------------- */

/* Not under ThreadSanitizer: the clones' ifunc resolvers run while the
 * dynamic loader relocates, before TSan's runtime is up, and crash there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL_CLONES
#endif
/* Per segment, the running sums of mine.in, mine.mine and in.in over the
 * elements g = 0, 1, 2, ... of the segment, in LANES double lanes each:
 * lane k takes the elements with g % LANES == k in order. f64 adds each
 * product to its double lane. f32 (Horovod's CPU Adasum rounds every
 * product to float too) adds it to float lane g % FLANES, and every BLOCK
 * elements adds float lanes k and k + LANES to double lane k, in that
 * order, and clears them. Either way the sums come out the same however
 * the elements arrive (in pieces of any size, straight out of a
 * transport), whatever the clone: GCC's vector types make a lane step one
 * instruction, and ISO C (no FMA contraction) keeps the bits of the plain
 * per-lane loops. A float lane sums BLOCK / FLANES = 16 products: their
 * rounding is within about 2e-6 of the sum of |products|. */
#define LANES 8
#define FLANES 16
#define BLOCK 256
/* per segment: 3 double lanes sets, then (f32) 3 float lane sets */
#define SUMS (3 * LANES + 3 * FLANES / 2)
typedef double lanes_t __attribute__((vector_size(LANES * sizeof(double))));
typedef float flanes_t __attribute__((vector_size(FLANES * sizeof(float))));

/* Adds float lanes k and k + LANES of f to double lane k of d, and clears f. */
#define FLUSH(d, f)                                                                                \
  do {                                                                                             \
    (d) += __builtin_convertvector(__builtin_shufflevector((f), (f), 0, 1, 2, 3, 4, 5, 6, 7), lanes_t); \
    (d) += __builtin_convertvector(__builtin_shufflevector((f), (f), 8, 9, 10, 11, 12, 13, 14, 15), lanes_t); \
    (f) = (flanes_t){0};                                                                           \
  } while (0)

/* Stores one 64-byte vector at dst, which is 16-byte aligned, with
 * non-temporal stores: into the transport's ring they need not own the
 * lines the peer has just read first (what that saved where it was
 * measured: docs/performance.md, "Adasum's stores into the ring"). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void stream64(void *dst, const void *v) {
  for (int k = 0; k < 4; k++)
    _mm_stream_si128((__m128i *)dst + k, _mm_loadu_si128((const __m128i *)v + k));
}
static inline void stream_fence(void) { _mm_sfence(); }
#else
static inline void stream64(void *dst, const void *v) { memcpy(dst, v, 64); }
static inline void stream_fence(void) {}
#endif

/* The vector of mine at element i into m (of vector type V): made as
 * ca pa + cb pb and stored in mine when pa is set, else loaded. */
#define LOAD_MINE(V, m)                                                                            \
  do {                                                                                             \
    if (pa != NULL) {                                                                              \
      V va_, vb_;                                                                                  \
      memcpy(&va_, pa + i, sizeof va_);                                                            \
      memcpy(&vb_, pb + i, sizeof vb_);                                                            \
      (m) = ca * va_ + cb * vb_;                                                                   \
      memcpy(mine + i, &(m), sizeof(m));                                                           \
    } else {                                                                                       \
      memcpy(&(m), mine + i, sizeof(m));                                                           \
    }                                                                                              \
  } while (0)

/* take: adds n elements of mine and in, the first of them element g of
 * its segment, to acc (SUMS doubles), copying in to dst on the way unless
 * dst is NULL. When pa is not NULL, mine is made first, in the same loop:
 * mine = ca pa + cb pb (the previous level's combination, as combine()
 * makes it). */
KERNEL_CLONES static void take_f32(float *dst, float *mine, const float *in, size_t n, size_t g, double *acc,
                                   const float *pa, const float *pb, float ca, float cb) {
  lanes_t xy, xx, yy;
  flanes_t fxy, fxx, fyy;
  memcpy(&xy, acc, sizeof xy);
  memcpy(&xx, acc + LANES, sizeof xx);
  memcpy(&yy, acc + 2 * LANES, sizeof yy);
  float *f = (float *)(acc + 3 * LANES);
  memcpy(&fxy, f, sizeof fxy);
  memcpy(&fxx, f + FLANES, sizeof fxx);
  memcpy(&fyy, f + 2 * FLANES, sizeof fyy);
  size_t i = 0;
#define TAKE_ONE_F32                                                                               \
  do {                                                                                             \
    size_t k = (g + i) % FLANES;                                                                   \
    if (pa != NULL) mine[i] = ca * pa[i] + cb * pb[i];                                             \
    float x = mine[i], y = in[i];                                                                  \
    fxy[k] += x * y;                                                                               \
    fxx[k] += x * x;                                                                               \
    fyy[k] += y * y;                                                                               \
    if (dst != NULL) dst[i] = y;                                                                   \
    if ((g + i + 1) % BLOCK == 0) {                                                                \
      FLUSH(xy, fxy);                                                                              \
      FLUSH(xx, fxx);                                                                              \
      FLUSH(yy, fyy);                                                                              \
    }                                                                                              \
  } while (0)
  for (; i < n && (g + i) % FLANES != 0; i++) TAKE_ONE_F32;
  for (; i + FLANES <= n; i += FLANES) {
    flanes_t m, r;
    LOAD_MINE(flanes_t, m);
    memcpy(&r, in + i, sizeof r);
    if (dst != NULL) memcpy(dst + i, &r, sizeof r);
    fxy += m * r;
    fxx += m * m;
    fyy += r * r;
    if ((g + i + FLANES) % BLOCK == 0) {
      FLUSH(xy, fxy);
      FLUSH(xx, fxx);
      FLUSH(yy, fyy);
    }
  }
  for (; i < n; i++) TAKE_ONE_F32;
#undef TAKE_ONE_F32
  memcpy(acc, &xy, sizeof xy);
  memcpy(acc + LANES, &xx, sizeof xx);
  memcpy(acc + 2 * LANES, &yy, sizeof yy);
  memcpy(f, &fxy, sizeof fxy);
  memcpy(f + FLANES, &fxx, sizeof fxx);
  memcpy(f + 2 * FLANES, &fyy, sizeof fyy);
}

KERNEL_CLONES static void take_f64(double *dst, double *mine, const double *in, size_t n, size_t g, double *acc,
                                   const double *pa, const double *pb, double ca, double cb) {
  lanes_t xy, xx, yy;
  memcpy(&xy, acc, sizeof xy);
  memcpy(&xx, acc + LANES, sizeof xx);
  memcpy(&yy, acc + 2 * LANES, sizeof yy);
  size_t i = 0;
#define TAKE_ONE_F64                                                                               \
  do {                                                                                             \
    size_t k = (g + i) % LANES;                                                                    \
    if (pa != NULL) mine[i] = ca * pa[i] + cb * pb[i];                                             \
    double x = mine[i], y = in[i];                                                                 \
    xy[k] += x * y;                                                                                \
    xx[k] += x * x;                                                                                \
    yy[k] += y * y;                                                                                \
    if (dst != NULL) dst[i] = y;                                                                   \
  } while (0)
  for (; i < n && (g + i) % LANES != 0; i++) TAKE_ONE_F64;
  for (; i + LANES <= n; i += LANES) {
    lanes_t x, y;
    LOAD_MINE(lanes_t, x);
    memcpy(&y, in + i, sizeof y);
    if (dst != NULL) memcpy(dst + i, &y, sizeof y);
    xy += x * y;
    xx += x * x;
    yy += y * y;
  }
  for (; i < n; i++) TAKE_ONE_F64;
#undef TAKE_ONE_F64
  memcpy(acc, &xy, sizeof xy);
  memcpy(acc + LANES, &xx, sizeof xx);
  memcpy(acc + 2 * LANES, &yy, sizeof yy);
}

/* The three sums of acc: (f32) the float lanes flushed, then the double
 * lanes added pairwise (lane k + w into k for w = 4, 2, 1). */
static void sums_total(double *acc, tide_dtype_t dtype, double *out) {
  lanes_t d[3];
  for (int j = 0; j < 3; j++) memcpy(&d[j], acc + j * LANES, sizeof d[j]);
  if (dtype == TIDE_F32)
    for (int j = 0; j < 3; j++) {
      flanes_t f;
      memcpy(&f, (float *)(acc + 3 * LANES) + j * FLANES, sizeof f);
      FLUSH(d[j], f);
    }
  for (int j = 0; j < 3; j++) {
    for (int w = LANES / 2; w > 0; w /= 2)
      for (int k = 0; k < w; k++) d[j][k] += d[j][k + w];
    out[j] = d[j][0];
  }
}

/* out = ca a + cb b, and keep = out too unless keep is NULL; out by
 * non-temporal stores when stream is set. */
#define DEFINE_COMBINE(T, V, suffix)                                                               \
  KERNEL_CLONES static void combine_##suffix(T *keep, T *out, const T *a, const T *b, size_t n,    \
                                             double ca, double cb, int stream) {                   \
    enum { W = sizeof(V) / sizeof(T) };                                                            \
    T x = (T)ca, y = (T)cb;                                                                        \
    size_t i = 0;                                                                                  \
    for (; i < n && stream && ((uintptr_t)(out + i) & 15) != 0; i++) {                             \
      out[i] = x * a[i] + y * b[i];                                                                \
      if (keep != NULL) keep[i] = out[i];                                                          \
    }                                                                                              \
    for (; i + W <= n; i += W) {                                                                   \
      V va, vb, r;                                                                                 \
      memcpy(&va, a + i, sizeof va);                                                               \
      memcpy(&vb, b + i, sizeof vb);                                                               \
      r = x * va + y * vb;                                                                         \
      if (keep != NULL) memcpy(keep + i, &r, sizeof r);                                            \
      if (stream) stream64(out + i, &r);                                                           \
      else memcpy(out + i, &r, sizeof r);                                                          \
    }                                                                                              \
    for (; i < n; i++) {                                                                           \
      out[i] = x * a[i] + y * b[i];                                                                \
      if (keep != NULL) keep[i] = out[i];                                                          \
    }                                                                                              \
    if (stream) stream_fence();                                                                    \
  }
DEFINE_COMBINE(float, flanes_t, f32)
DEFINE_COMBINE(double, lanes_t, f64)

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

/* out[lo, hi) = ca*a + cb*b per segment, from the summed x->partial, and
 * keep[lo, hi) too unless keep is NULL; a, b, out and keep start at
 * element lo; stream: out by non-temporal stores. */
static void combine(adasum_t *x, void *keep, void *out, const void *a, const void *b, size_t lo, size_t hi,
                    int stream) {
  size_t esize = tide_dtype_size(x->dtype);
  FOR_PIECES(x, lo, hi, s, plo, phi) {
    double ca, cb;
    coefficients(x->partial + 3 * s, &ca, &cb);
    size_t at = (plo - lo) * esize;
    uint8_t *k = keep == NULL ? NULL : (uint8_t *)keep + at;
    if (x->dtype == TIDE_F32)
      combine_f32((float *)k, (float *)((uint8_t *)out + at), (const float *)((const uint8_t *)a + at),
                  (const float *)((const uint8_t *)b + at), phi - plo, ca, cb, stream);
    else
      combine_f64((double *)k, (double *)((uint8_t *)out + at), (const double *)((const uint8_t *)a + at),
                  (const double *)((const uint8_t *)b + at), phi - plo, ca, cb, stream);
  }
}

/* A level's combination not made yet: element i of it, for i from lo on,
 * comes from a[i - lo] and b[i - lo], with the coefficients in x->partial
 * (kept until the next level's swap is over). It is made piece by piece
 * while the next level's swap moves it: the half given away straight into
 * the transport, the half kept just before its dot products are taken. */
typedef struct {
  const uint8_t *a, *b;
  size_t lo;
} pending_t;

static void combine_pending(adasum_t *x, const pending_t *p, void *keep, void *out, size_t lo, size_t hi, int stream) {
  size_t at = (lo - p->lo) * tide_dtype_size(x->dtype);
  combine(x, keep, out, p->a + at, p->b + at, lo, hi, stream);
}

/* One side of a swap, for its producer or consumer: elements from lo on.
 * Sending: made from pend, kept in base too when keep is set. Receiving:
 * theirs is where they land; mine (made from pend first, when there is
 * one) is what their dot products are taken with. */
typedef struct {
  adasum_t *x;
  size_t lo;
  const pending_t *pend;
  uint8_t *base;
  int keep;
  const uint8_t *mine;
  uint8_t *theirs;
} side_t;

/* How make() writes into a transport's memory (the shm ring): by
 * non-temporal stores (stream64), or made with plain stores (in base first
 * when kept, then memcpy). Which is cheaper depends on the machine and on
 * how busy its memory is (docs/performance.md, "Adasum's stores into the
 * ring"), so each process measures the two: the cheaper per byte so far,
 * and the other every eighth call, so a change in the machine is seen. What
 * is timed is the whole swap a producer takes part in, not make() alone:
 * non-temporal stores are cheap to make but leave the lines out of the
 * cache the peer reads them from, which only its side of the swap pays
 * (ranks choose alike, calling alike). The first call of each kind is not
 * counted: it touches the buffers' pages for the first time. The choice is
 * this rank's alone: the bytes are the same either way. */
static _Atomic int64_t store_ps_per_byte[2]; /* smoothed, 0 = not measured yet */
static atomic_uint store_calls, store_seen[2];

static int choose_stores(void) {
  unsigned call = atomic_fetch_add(&store_calls, 1);
  int64_t plain = atomic_load(&store_ps_per_byte[0]), streamed = atomic_load(&store_ps_per_byte[1]);
  int best = plain == 0 ? 0 : streamed == 0 ? 1 : streamed <= plain;
  return call % 8 == 7 ? !best : best;
}

static void stores_measured(const adasum_t *x) {
  if (x->made_bytes < 65536 || atomic_fetch_add(&store_seen[x->stream], 1) == 0) return;
  int64_t ps = x->swap_ns * 1000 / x->swap_bytes, old = atomic_load(&store_ps_per_byte[x->stream]);
  atomic_store(&store_ps_per_byte[x->stream], old == 0 ? ps : (3 * old + ps) / 4);
}

/* The producer of a swap's outgoing elements (tide__produce_cb): makes
 * them straight into the transport's memory, and into base too when they
 * are kept (see choose_stores). TCP and MPI have them made in base itself. */
static void make(void *ctx, size_t at, void *out, size_t len) {
  side_t *o = ctx;
  adasum_t *x = o->x;
  size_t esize = tide_dtype_size(x->dtype), lo = o->lo + at / esize, hi = lo + len / esize;
  uint8_t *kept = o->base + lo * esize;
  if (out == kept) {
    combine_pending(x, o->pend, NULL, out, lo, hi, 0);
    return;
  }
  if (x->stream) {
    combine_pending(x, o->pend, o->keep ? kept : NULL, out, lo, hi, 1);
  } else if (o->keep) {
    combine_pending(x, o->pend, NULL, kept, lo, hi, 0);
    memcpy(out, kept, len);
  } else {
    combine_pending(x, o->pend, NULL, out, lo, hi, 0);
  }
  x->made_bytes += (int64_t)len;
}

/* The consumer of a swap's incoming elements (tide__consume_cb): copies
 * each piece out of the transport while adding it to the dot products,
 * and makes the pending combination of mine in the same pass. */
static void take(void *ctx, size_t at, const void *data, size_t len) {
  side_t *l = ctx;
  adasum_t *x = l->x;
  size_t esize = tide_dtype_size(x->dtype), lo = l->lo + at / esize, hi = lo + len / esize;
  int landed = data == l->theirs + at; /* the transport put it in place itself */
  FOR_PIECES(x, lo, hi, s, plo, phi) {
    size_t in_at = (plo - lo) * esize;
    size_t g = x->base + plo - (s == 0 ? 0 : x->end[s - 1]);
    const uint8_t *in = (const uint8_t *)data + in_at, *pa = NULL, *pb = NULL;
    uint8_t *dst = landed ? NULL : l->theirs + at + in_at, *mine = (uint8_t *)l->mine + (plo - l->lo) * esize;
    double ca = 1, cb = 1;
    if (l->pend != NULL) {
      coefficients(x->partial + 3 * s, &ca, &cb);
      pa = l->pend->a + (plo - l->pend->lo) * esize;
      pb = l->pend->b + (plo - l->pend->lo) * esize;
    }
    if (x->dtype == TIDE_F32)
      take_f32((float *)dst, (float *)mine, (const float *)in, phi - plo, g, x->sums + SUMS * s, (const float *)pa,
               (const float *)pb, (float)ca, (float)cb);
    else
      take_f64((double *)dst, (double *)mine, (const double *)in, phi - plo, g, x->sums + SUMS * s,
               (const double *)pa, (const double *)pb, ca, cb);
  }
}

/* ---- communication --------------------------------------------------------- */

/* Sends n_out elements to peer, from out or made by out_side's producer,
 * while receiving n_in into in, through in_side's consumer when given. */
static int exchange(adasum_t *x, int peer, const void *out, size_t n_out, side_t *out_side, void *in, size_t n_in,
                    side_t *in_side) {
  size_t esize = tide_dtype_size(x->dtype);
  tide__p2p_t ops[2];
  int n = 0;
  if (n_out > 0) {
    ops[n] = (tide__p2p_t){.kind = TIDE__P2P_SEND, .peer = peer, .src = out, .bytes = n_out * esize,
                           .dtype = x->dtype, .produce = out_side ? make : NULL, .ctx = out_side};
    n++;
  }
  if (n_in > 0) {
    ops[n] = (tide__p2p_t){.kind = TIDE__P2P_RECV, .peer = peer, .dst = in, .bytes = n_in * esize,
                           .dtype = x->dtype, .consume = in_side ? take : NULL, .ctx = in_side};
    n++;
  }
  if (n == 0) return 0;
  int64_t t0 = tide__now_ns(), made = x->made_bytes;
  TIDE_CHECK(lift(x->parent, x->comm, tide__comm_run(x->comm, ops, n, "adasum_allreduce")));
  if (x->made_bytes > made) {
    x->swap_ns += tide__now_ns() - t0;
    x->swap_bytes += (int64_t)((n_out + n_in) * esize);
  }
  return 0;
}

/* The real rank of virtual rank v (folded pairs count once). */
static int real_rank(int v, int extra) { return v < extra ? 2 * v + 1 : v + extra; }

/* Sends the n_out elements of `out` (or of *give's producer) to peer while
 * its elements [keep->lo, keep->lo + n_in) come into keep->theirs, and
 * sets x->partial to the dot products of (a, b) over them, taken as the
 * pieces arrive: a is the lower group's, upper says whether that is the
 * peer's. */
static int swap_and_dot(adasum_t *x, int peer, const uint8_t *out, size_t n_out, side_t *give, size_t n_in,
                        side_t *keep, int upper) {
  size_t keep_lo = keep->lo, keep_hi = keep_lo + n_in;
  /* the segments [first, last) overlap the kept half */
  size_t first = first_segment(x, keep_lo), last = n_in == 0 ? first : first_segment(x, keep_hi - 1) + 1;
  memset(x->sums + SUMS * first, 0, SUMS * (last - first) * sizeof *x->sums);
  TIDE_CHECK(exchange(x, peer, out, n_out, give, keep->theirs, n_in, keep));
  memset(x->partial, 0, 3 * x->nseg * sizeof *x->partial);
  for (size_t s = first; s < last; s++) {
    double sum[3], *t = x->partial + 3 * s; /* mine.in, mine.mine, in.in */
    sums_total(x->sums + SUMS * s, x->dtype, sum);
    t[0] = sum[0];
    t[1] = upper ? sum[2] : sum[1];
    t[2] = upper ? sum[1] : sum[2];
  }
  return 0;
}

/* The j-th member (in increasing order) of the group of virtual rank v
 * whose ranks differ from v only in the bits of mask. */
static int member(int v, int mask, int j) {
  int w = v & ~mask;
  for (int bit = 1; mask != 0; bit <<= 1)
    if (mask & bit) {
      if (j & 1) w |= bit;
      j >>= 1;
      mask &= ~bit;
    }
  return w;
}

/* Sums x->partial over the group of virtual ranks that differ from v only
 * in the bits of mask (the distances of the levels so far: they hold the
 * pieces of the same segment), then over the shards. Up to DIRECT_WIDTH
 * ranks swap their partials in one round and each adds them up in the
 * group's order; wider groups use recursive doubling (x+y here, y+x
 * there). Either way every rank gets the same bits. */
#define DIRECT_WIDTH 8
static int sum_partials(adasum_t *x, int v, int mask, int extra) {
  size_t n = 3 * x->nseg, bytes = n * sizeof(double);
  int width = 1 << __builtin_popcount((unsigned)mask);
  if (width <= DIRECT_WIDTH) {
    tide__p2p_t ops[2 * DIRECT_WIDTH];
    int k = 0, self = 0;
    for (int j = 0; j < width; j++) {
      int w = member(v, mask, j);
      if (w == v) {
        self = j;
        continue;
      }
      tide__p2p_set(&ops[k++], TIDE__P2P_SEND, real_rank(w, extra), x->partial, NULL, bytes, TIDE_F64, TIDE_SUM);
      tide__p2p_set(&ops[k++], TIDE__P2P_RECV, real_rank(w, extra), NULL, x->incoming + (size_t)j * n, bytes,
                    TIDE_F64, TIDE_SUM);
    }
    if (k > 0) {
      memcpy(x->incoming + (size_t)self * n, x->partial, bytes);
      TIDE_CHECK(lift(x->parent, x->comm, tide__comm_run(x->comm, ops, k, "adasum_allreduce")));
      for (size_t i = 0; i < n; i++) {
        double t = x->incoming[i];
        for (int j = 1; j < width; j++) t += x->incoming[(size_t)j * n + i];
        x->partial[i] = t;
      }
    }
  } else {
    for (int m = 1; m <= mask; m <<= 1) {
      if (!(mask & m)) continue;
      tide__p2p_t ops[2];
      tide__p2p_set(&ops[0], TIDE__P2P_SEND, real_rank(v ^ m, extra), x->partial, NULL, bytes, TIDE_F64, TIDE_SUM);
      tide__p2p_set(&ops[1], TIDE__P2P_RECV, real_rank(v ^ m, extra), NULL, x->incoming, bytes, TIDE_F64, TIDE_SUM);
      TIDE_CHECK(lift(x->parent, x->comm, tide__comm_run(x->comm, ops, 2, "adasum_allreduce")));
      for (size_t i = 0; i < n; i++) x->partial[i] += x->incoming[i];
    }
  }
  if (x->shards == NULL) return 0;
  return lift(x->parent, x->shards,
              tide__allreduce_rd(x->shards, x->partial, x->partial, 3 * x->nseg, TIDE_F64, TIDE_SUM));
}

/* Whether every pair of ranks d apart (virtual ranks, p of them) is
 * bound to the same CPUs. */
static int shares_cpus(const tide_comm_t *c, int p, int extra, int d) {
  for (int v = 0; v < p; v++) {
    int a = c->cpus_of[real_rank(v, extra)], b = c->cpus_of[real_rank(v ^ d, extra)];
    if (a < 0 || a != b) return 0;
  }
  return 1;
}

/* The distances of the levels, in the order they are taken, into dist;
 * returns how many (log2 p). With cores_first, distances at which ranks
 * bound to the same CPUs pair (tiderun binds rank r to core r % cores when
 * ranks outnumber cores) come first: the first level moves the most data,
 * and between two ranks on one core, over shared memory, it stays in that
 * core's cache (on a 2-core VM, 4 ranks: Adasum 1.01-1.12x the allreduce's
 * time, from 1.10-1.35x pairing neighbours first; over TCP it is slower,
 * so only shared memory does this). Then the other distances in
 * increasing order, as the paper's vector-halving distance-doubling takes
 * them all. The order decides the pairing, so the result depends on it
 * (docs/algorithms.md). */
static int distances(const adasum_t *x, int p, int extra, int *dist) {
  int levels = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int d = 1; d < p; d <<= 1) {
      int first = x->cores_first && shares_cpus(x->comm, p, extra, d);
      if (first == (pass == 0)) dist[levels++] = d;
    }
  return levels;
}

/* Adasum over x->comm of in[0..count) into buf (in may equal buf; in is
 * never written, and read at an element only before buf's is written). */
static int vhdd(adasum_t *x, const void *in, void *buf, size_t count) {
  tide_comm_t *c = x->comm;
  int n = c->size, r = c->rank, p = 1;
  while (p * 2 <= n) p *= 2;
  int extra = n - p, v;
  size_t esize = tide_dtype_size(x->dtype);
  uint8_t *base = buf;
  const uint8_t *src = in; /* where this rank's current vector is */
  /* A level's incoming half lands in one of two regions, the other still
   * holding the previous level's, which its pending combination needs. */
  size_t half = count - count / 2, quarter = half - half / 2;
  uint8_t *scratch = tide__comm_scratch(c, (extra > 0 && count > half + quarter ? count : half + quarter) * esize);
  if (scratch == NULL) return tide__comm_fail(x->parent, TIDE_ENOMEM, 0, "rank %d: out of memory in adasum_allreduce",
                                              x->parent->rank);
  uint8_t *region[2] = {scratch, scratch + half * esize};
  int64_t t_reduce = 0, t_sum = 0, t0 = tide__now_ns(), t1;
  x->stream = choose_stores();
  x->made_bytes = x->swap_ns = x->swap_bytes = 0;
  if (r < 2 * extra) {
    side_t fold = {.x = x, .lo = 0, .mine = src, .theirs = scratch};
    if (r % 2 == 0) { /* folded: the odd neighbour combines for both of us */
      TIDE_CHECK(swap_and_dot(x, r + 1, src, count, NULL, 0, &fold, 0));
      return exchange(x, r + 1, NULL, 0, NULL, buf, count, NULL);
    }
    TIDE_CHECK(swap_and_dot(x, r - 1, NULL, 0, NULL, count, &fold, 1));
    TIDE_CHECK(sum_partials(x, 0, 0, extra));
    combine(x, NULL, buf, scratch, src, 0, count, 0);
    src = base;
    v = r / 2;
  } else {
    v = r - extra;
  }
  /* Reduce phase: the segment [lo, hi) halves at every level. Each level's
   * combination is pending until the next level's swap (or, at the last
   * level, the first gather swap) makes it piece by piece. */
  size_t lo = 0, hi = count, seg_lo[32], seg_hi[32];
  pending_t pend = {NULL, NULL, 0}, prev;
  int dist[32], levels = distances(x, p, extra, dist), mask = 0;
  for (int l = 0; l < levels; l++) {
    size_t mid = lo + (hi - lo) / 2;
    int d = dist[l], upper = (v & d) != 0, first = l == 0;
    size_t keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    size_t give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    prev = pend;
    side_t give = {.x = x, .lo = give_lo, .pend = &prev, .base = base};
    /* Not in place, the first level's incoming half lands where its
     * combination goes (buf is free until then; see the top of the file). */
    uint8_t *theirs = first && src != base ? base + keep_lo * esize : region[l % 2];
    side_t keep = {.x = x, .lo = keep_lo, .pend = first ? NULL : &prev, .mine = (first ? src : base) + keep_lo * esize,
                   .theirs = theirs};
    TIDE_CHECK(swap_and_dot(x, real_rank(v ^ d, extra), first ? src + give_lo * esize : base + give_lo * esize,
                            give_hi - give_lo, first ? NULL : &give, keep_hi - keep_lo, &keep, upper));
    t_reduce += (t1 = tide__now_ns()) - t0;
    TIDE_CHECK(sum_partials(x, v, mask |= d, extra));
    t_sum += (t0 = tide__now_ns()) - t1;
    pend.a = upper ? keep.theirs : keep.mine;
    pend.b = upper ? keep.mine : keep.theirs;
    pend.lo = keep_lo;
    seg_lo[l] = lo;
    seg_hi[l] = hi;
    lo = keep_lo;
    hi = keep_hi;
  }
  /* Gather phase: swap the finished halves back, distance-halving; the
   * first swap makes the last level's combination as it goes out. */
  for (int l = levels - 1; l >= 0; l--) {
    int d = dist[l];
    size_t mid = seg_lo[l] + (seg_hi[l] - seg_lo[l]) / 2;
    int upper = (v & d) != 0; /* then the peer holds the lower half */
    size_t other_lo = upper ? seg_lo[l] : mid, other_hi = upper ? mid : seg_hi[l];
    side_t made = {.x = x, .lo = lo, .pend = &pend, .base = base, .keep = 1};
    TIDE_CHECK(exchange(x, real_rank(v ^ d, extra), base + lo * esize, hi - lo, l == levels - 1 ? &made : NULL,
                        base + other_lo * esize, other_hi - other_lo, NULL));
    lo = seg_lo[l];
    hi = seg_hi[l];
  }
  stores_measured(x);
  TIDE_DEBUG("adasum of %zu elements: reduce phase %.3f ms, summing dot products %.3f ms, gather phase %.3f ms; "
             "%s stores into the transport, the swaps that made them %.1f ps per byte",
             count, t_reduce / 1e6, t_sum / 1e6, (tide__now_ns() - t0) / 1e6, x->stream ? "non-temporal" : "plain",
             x->swap_bytes > 0 ? 1000.0 * (double)x->swap_ns / (double)x->swap_bytes : 0.0);
  if (r < 2 * extra) TIDE_CHECK(exchange(x, r - 1, buf, count, NULL, NULL, 0, NULL));
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
  if (comm->size == 1) return TIDE__ALGO_NONE;
  if (hier) return TIDE__ALGO_HIER;
  if (comm->cpus_of == NULL || tide__param_int(TIDE__PARAM_SHM) == 0) return TIDE__ALGO_VHDD;
  int p = 1;
  while (p * 2 <= comm->size) p *= 2;
  for (int d = 1; d < p; d <<= 1)
    if (shares_cpus(comm, p, comm->size - p, d)) return TIDE__ALGO_VHDD_CORES;
  return TIDE__ALGO_VHDD;
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
  adasum_t x = {.comm = comm, .parent = comm, .dtype = dtype, .end = end, .nseg = nseg,
                .cores_first = algo == TIDE__ALGO_VHDD_CORES};
  x.partial = tide__malloc((3 + 3 * DIRECT_WIDTH + SUMS) * nseg * sizeof *x.partial);
  if (x.partial == NULL)
    return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: out of memory in adasum_allreduce", comm->rank);
  x.incoming = x.partial + 3 * nseg;
  x.sums = x.incoming + 3 * DIRECT_WIDTH * nseg;
  int rc;
  if (algo == TIDE__ALGO_HIER) {
    rc = adasum_hier(comm, sendbuf, recvbuf, count, &x);
  } else {
    rc = vhdd(&x, sendbuf, recvbuf, count);
  }
  tide__free(x.partial);
  return rc;
}
