/* Internal interface of src/compress: the selectors' common pieces (magnitude
 * keys, the per-call thread runner, the candidate finisher) and the scalar
 * references the tests compare every fast path against.
 *
 * Magnitude keys: for a float v, key(v) = bits(v) & 0x7fffffff. For finite v
 * the key orders like |v| (IEEE-754 magnitudes sort as unsigned integers),
 * -0 and +0 share key 0, and every NaN or Inf has key >= 0x7f800000. The top-k
 * order used everywhere is: larger key first, then lower index first; the
 * exact selection of k is the first k elements in that order. */
#ifndef TIDE_COMPRESS_H
#define TIDE_COMPRESS_H

#include <stdatomic.h>
#include <string.h>

#include "compress/fused.h"
#include "core/core.h"

/* Loads the bits of floats without breaking strict aliasing. */
typedef uint32_t __attribute__((may_alias)) tide__u32_alias;

#define TIDE__KEY_NONFINITE 0x7f800000u /* keys >= this are NaN or Inf */
#define TIDE__KEY_NONE 0xffffffffu      /* a cut no key reaches */

/* Internal selection result beyond 0 and TIDE_E*: a NaN or Inf was found;
 * the first one's index is in *bad_index. Never returned by the public API. */
#define TIDE__NONFINITE 1

static inline uint32_t tide__key(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u & 0x7fffffffu;
}

/* The first index in [begin, end) whose key is non-finite, or end. */
size_t tide__first_nonfinite(const float *x, size_t begin, size_t end);

/* 1 if x[begin, end) holds a NaN or Inf (exponent bits all ones). An OR of
 * compares: no loop-carried chain longer than one instruction, so it runs
 * at the speed of the loads. */
static inline int tide__any_nonfinite(const float *x, size_t begin, size_t end) {
  const tide__u32_alias *u = (const tide__u32_alias *)x;
  uint32_t bad = 0;
  for (size_t i = begin; i < end; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
  return bad != 0;
}

/* The largest key of x[begin, end) (0 when empty). Sixteen independent
 * lanes, signed (keys are below 2^31): SSE2 has a signed compare only, and
 * one lane would make a chain of dependent compares. */
static inline uint32_t tide__max_key(const float *x, size_t begin, size_t end) {
  const tide__u32_alias *u = (const tide__u32_alias *)x;
  int32_t lane[16] = {0};
  size_t i = begin;
  for (; i + 16 <= end; i += 16)
    for (int j = 0; j < 16; j++) {
      int32_t key = (int32_t)(u[i + j] & 0x7fffffffu);
      lane[j] = key > lane[j] ? key : lane[j];
    }
  int32_t m = 0;
  for (; i < end; i++) {
    int32_t key = (int32_t)(u[i] & 0x7fffffffu);
    m = key > m ? key : m;
  }
  for (int j = 0; j < 16; j++) m = lane[j] > m ? lane[j] : m;
  return (uint32_t)m;
}

/* Bit j of the result is set when key(x[i + j]) >= cut, for j < 64. On
 * x86-64 four compares make four bits at once (movmskps); elsewhere a
 * branch-free loop. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline uint64_t tide__hit_mask64(const float *x, size_t i, uint32_t cut) {
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i below = _mm_set1_epi32((int32_t)cut - 1); /* key >= cut <=> key > cut - 1 */
  uint64_t mask = 0;
  for (int j = 0; j < 64; j += 4) {
    __m128i v = _mm_and_si128(_mm_loadu_si128((const __m128i *)(const void *)(x + i + j)), abs_mask);
    mask |= (uint64_t)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(v, below))) << j;
  }
  return mask;
}
#else
static inline uint64_t tide__hit_mask64(const float *x, size_t i, uint32_t cut) {
  const tide__u32_alias *u = (const tide__u32_alias *)x;
  uint64_t mask = 0;
  for (int j = 0; j < 64; j++) mask |= (uint64_t)((u[i + j] & 0x7fffffffu) >= cut) << j;
  return mask;
}
#endif

/* ---- threads -------------------------------------------------------------------------- */

/* Threads for one call over d elements: `requested` (> 0) or TIDE_NUM_THREADS,
 * else the online CPUs, reduced so that each thread gets at least
 * TIDE__GRAIN elements (thread start costs ~50 us; a chunk is worth it only
 * when reading it takes longer). TIDE_EINVAL (logged) for a bad variable. */
#define TIDE__GRAIN ((size_t)1 << 19)
/* Work on collected candidates is split between threads only above this
 * many: every fork-join is a point where a loaded machine can keep a thread
 * waiting for the CPU for milliseconds, and short phases do not pay that. */
#define TIDE__CAND_GRAIN ((size_t)1 << 22)
int tide__compress_threads(int requested, size_t d, int *out);

/* Runs fn(arg, tid, nthreads) for tid in [0, nthreads): tid 0 on the caller,
 * the others on fresh threads, and returns when all have finished. If a
 * thread cannot be started its share runs on the caller, so this never
 * fails. fn must not wait for another tid (no barriers). */
typedef void (*tide__par_cb)(void *arg, int tid, int nthreads);
void tide__parallel_run(int nthreads, tide__par_cb fn, void *arg);

/* Thread tid's share [*begin, *end) of [0, d), cut at multiples of 64. */
void tide__chunk(size_t d, int tid, int nthreads, size_t *begin, size_t *end);

/* ---- candidates: a superset of the top k, in index order ----------------------------- */

/* Per-thread lists of (float bits, index) in increasing index order; thread
 * t's indices all precede thread t+1's. The bits are the element's own, so
 * emitting a value needs no gather from x. A candidate set is complete for
 * k when it holds every element whose key is >= the k-th largest key. */
typedef struct {
  uint32_t *bits;
  uint32_t *index;
  size_t len, cap;
} tide__cand_t;

/* Makes room for `need` entries; TIDE_ENOMEM when growing fails. */
int tide__cand_grow(tide__cand_t *c, size_t need);
static inline int tide__cand_push(tide__cand_t *c, uint32_t bits, uint32_t index) {
  if (c->len == c->cap) {
    int rc = tide__cand_grow(c, c->len + 1);
    if (rc < 0) return rc;
  }
  c->bits[c->len] = bits;
  c->index[c->len] = index;
  c->len++;
  return 0;
}
void tide__cand_free(tide__cand_t *c);

/* The candidate lists of one selection, one per thread. Each calling
 * thread keeps its scratch between calls, so that a training loop does not
 * fault fresh pages in for every step (in a VM a page fault costs
 * microseconds: 20 MB of fresh candidates cost more than reading 100 MB).
 * Lists whose capacity adds up to more than TIDE__SCRATCH_KEEP bytes are
 * freed on release; the rest is freed when the thread exits. */
#define TIDE__MAX_THREADS 256
#define TIDE__SCRATCH_KEEP ((size_t)256 << 20)
typedef struct {
  tide__cand_t cands[TIDE__MAX_THREADS];
} tide__scratch_t;

/* This thread's scratch with every list empty (len 0), or a fresh one if
 * this thread's is in use; NULL when out of memory. */
tide__scratch_t *tide__scratch_acquire(void);
void tide__scratch_release(tide__scratch_t *s);

/* Exact top k of a complete candidate set whose keys are all >= cut and
 * finite (total >= k >= 1): writes the k pairs in index order, and the
 * k-th largest key to *kth_key. Uses up to nthreads threads. */
int tide__cand_finish(tide__cand_t *cands, int ncands, uint32_t cut, size_t k, int nthreads,
                      float *values, uint32_t *indices, uint32_t *kth_key);

/* ---- the sampled selector's cut (its sample: compress/fused.h) ------------------------ */

/* A collection cut from a sample: every key >= cut is collected. It sits at
 * the lower edge of the bucket (key >> 16) holding the sample's r-th largest
 * key, r four binomial standard deviations above the expected count, so
 * that the collection finds k or more with near certainty. cut == 0 means
 * the cut would take everything. expect: candidates expected; cap: stop
 * collecting past this many (the cut was wrong: select exactly instead). */
typedef struct {
  uint32_t cut;
  size_t expect, cap;
} tide__cut_t;
int tide__sample_cut(const float *sample, size_t n, size_t d, size_t k, tide__cut_t *out);
/* Room to reserve in each of nlists candidate lists: the expected share and
 * then some, so that the collection rarely grows by copying (untouched pages
 * cost nothing). */
static inline size_t tide__cut_reserve(const tide__cut_t *cut, int nlists) {
  return (size_t)(1.3 * (double)cut->expect / nlists) + 4096;
}

/* 0, or TIDE__NONFINITE with the first non-finite index in *bad_index; one
 * parallel pass. */
int tide__check_finite(const float *x, size_t d, int nthreads, size_t *bad_index);

/* ---- selectors (no argument checks, no logging: tide_topk_select does those) --------- */

/* Common arguments: 1 <= k < d < 2^32 (k = 0 and k = d are handled by the
 * caller), values/indices hold k. Return 0, TIDE_ENOMEM, or TIDE__NONFINITE
 * with *bad_index set. Output is written only on success. */
int tide__topk_exact(const float *x, size_t d, size_t k, int nthreads, float *values,
                     uint32_t *indices, tide_topk_stats_t *stats, size_t *bad_index);
int tide__topk_sampled(const float *x, size_t d, size_t k, int nthreads, float *values,
                       uint32_t *indices, tide_topk_stats_t *stats, size_t *bad_index);
int tide__topk_mstopk(const float *x, size_t d, size_t k, int rounds, uint64_t seed,
                      int nthreads, float *values, uint32_t *indices, tide_topk_stats_t *stats,
                      size_t *bad_index);
int tide__topk_randomk(const float *x, size_t d, size_t k, uint64_t seed, int nthreads,
                       float *values, uint32_t *indices, tide_topk_stats_t *stats,
                       size_t *bad_index);

/* tide_topk_select_opts without the message for a NaN/Inf: returns
 * TIDE__NONFINITE and *bad_index instead, so that callers can say more
 * (the compressor names the tensor of a flat index). Other errors are
 * logged. */
int tide__topk_run(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const float *x, size_t d,
                   size_t k, const char *name, float *values, uint32_t *indices,
                   tide_topk_stats_t *stats_or_null, size_t *bad_index);
/* "NaN", "+Inf" or "-Inf" for a non-finite v. */
const char *tide__nonfinite_name(float v);

/* ---- shared definitions the fast paths and the references must agree on ------------- */

/* mean(|x|) exactly as MSTopK here defines it: blocks of TIDE__MEAN_BLOCK
 * elements; within a block, groups of 256 summed in 16 float lanes (lane j
 * takes the elements at 16q + j, q = 0..15, in order), each group's lanes
 * added to 16 double lanes, the tail (< 256) added to double lane
 * (i - begin) % 16, then the lanes added pairwise (j + 8, j + 4, j + 2,
 * j + 1); block sums added in block order in double; divided by d. A fixed
 * order, so the result does not depend on the thread count, and float lanes
 * so that it runs at the speed of memory (the float partial sums of 16
 * values cost ~1e-6 relative, nothing to a threshold search). */
#define TIDE__MEAN_BLOCK ((size_t)1 << 16)
double tide__abs_block_sum(const float *x, size_t begin, size_t end);

/* MSTopK's probe threshold for bisection fraction f: (float)(base + f * (top - base)). */
static inline float tide__mstopk_probe(double base, double top, double f) {
  return (float)(base + f * (top - base));
}

/* MSTopK's bisection state: the bracket [l, r] of fractions, the largest
 * count <= k seen (k1, at threshold t1) and the smallest count > k (k2, t2). */
typedef struct {
  double l, r;
  size_t k1, k2;
  float t1, t2;
} tide__mstopk_bracket_t;

/* One probe's count c at threshold t (fraction f) narrows the bracket. */
static inline void tide__mstopk_narrow(tide__mstopk_bracket_t *b, size_t k, double f, float t, size_t c) {
  if (c <= k) {
    b->r = f;
    if (c > b->k1) {
      b->k1 = c;
      b->t1 = t;
    }
  } else {
    b->l = f;
    if (c < b->k2) {
      b->k2 = c;
      b->t2 = t;
    }
  }
}

/* splitmix64: seeds and draws. */
static inline uint64_t tide__splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [0, n), 1 <= n <= 2^32, without bias (Lemire's method). */
static inline uint64_t tide__uniform(uint64_t *state, uint64_t n) {
  for (;;) {
    uint64_t r = tide__splitmix64(state) >> 32;
    uint64_t m = r * n;
    uint64_t low = m & 0xffffffffull;
    if (low >= n || low >= ((1ull << 32) - n) % n) return m >> 32;
  }
}

/* ---- scalar references (src/compress/reference.c): simple, single-threaded -------- */

/* Same contracts as the selectors above, including k = 0 and k = d. */
int tide__topk_ref_exact(const float *x, size_t d, size_t k, float *values, uint32_t *indices,
                         size_t *bad_index);
/* All of x's indices in top-k order (|x| descending, then index), for
 * tests that need the exact top k for many k of one input. x finite. */
int tide__topk_ref_rank(const float *x, size_t d, uint32_t *order);
int tide__topk_ref_mstopk(const float *x, size_t d, size_t k, int rounds, uint64_t seed,
                          float *values, uint32_t *indices, size_t *bad_index);
int tide__topk_ref_randomk(const float *x, size_t d, size_t k, uint64_t seed, float *values,
                           uint32_t *indices, size_t *bad_index);

#endif
