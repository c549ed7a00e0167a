/* Top-k selection by magnitude: the public entry points (argument checks,
 * messages, k = 0 and k = d), exact radix selection and the sampled
 * selector, which is exact too but reads x once.
 *
 * Both work on magnitude keys (compress.h). Radix selection: a histogram of
 * key >> 16 (exponent and 7 mantissa bits: 32768 buckets, each 2^-7 of its
 * value wide) finds the bucket B holding the k-th largest key; a second pass
 * collects every key >= B << 16 (k plus the rest of bucket B, usually a few
 * thousand more) with its bits and index; among those, a short histogram
 * and a quickselect of bucket B's low bits give the exact k-th key T. Ties
 * at T go to the lower indices. When bucket B alone is huge (ties, zeros) a
 * histogram of its low bits over x replaces the collection.
 *
 * The sampled selector replaces the first histogram pass by one over a
 * stratified sample (runs of 16 elements evenly spread, at most 2^14
 * elements): it cuts at the lower edge of the bucket holding the sample's
 * r-th largest key, r four binomial standard deviations above the expected
 * count, so that the collection pass finds k or more with near certainty.
 * That pass counts what it collects, which checks the cut: fewer than k, or
 * far more than expected, falls back to radix selection (same result). */
#include <math.h>
#include <stdlib.h>
#include <strings.h>

#include "compress/compress.h"

#define HI_BUCKETS 32768u /* key >> 16 */
#define LO_BUCKETS 65536u /* key & 0xffff */
#define SMALL_D 4096      /* below this, quickselect beats histograms */
#define BLOCK 64          /* elements per vector test in the scan loops */

static const char *const kind_names[TIDE_TOPK_KIND_COUNT] = {"exact", "mstopk", "randomk",
                                                               "sampled"};

TIDE__NAMED_ENUM(topk, tide_topk_kind_t, "top-k selector", kind_names, TIDE_TOPK_KIND_COUNT)

size_t tide_topk_count(double density, size_t count) {
  if (!(density >= 0.0 && density <= 1.0)) return 0;
  double p = density * (double)count;
  double r = nearbyint(p);
  double k = fabs(p - r) <= 1e-9 * (p > 1.0 ? p : 1.0) ? r : ceil(p);
  if (k <= 0.0) return 0;
  if (k >= (double)count) return count;
  return (size_t)k;
}

/* ---- whole-input passes: finiteness check and k = d ------------------------------------ */

typedef struct {
  const float *x;
  size_t d;
  float *values;
  uint32_t *indices;
  int bad[256];
} whole_t;

static void check_work(void *arg, int tid, int nt) {
  whole_t *w = arg;
  size_t b, e;
  tide__chunk(w->d, tid, nt, &b, &e);
  w->bad[tid] = tide__any_nonfinite(w->x, b, e);
}

int tide__check_finite(const float *x, size_t d, int nt, size_t *bad_index) {
  whole_t w = {.x = x, .d = d};
  tide__parallel_run(nt, check_work, &w);
  for (int t = 0; t < nt; t++) {
    if (w.bad[t]) {
      size_t b, e;
      tide__chunk(d, t, nt, &b, &e);
      *bad_index = tide__first_nonfinite(x, b, e);
      return TIDE__NONFINITE;
    }
  }
  return 0;
}

static void copy_work(void *arg, int tid, int nt) {
  whole_t *w = arg;
  size_t b, e;
  tide__chunk(w->d, tid, nt, &b, &e);
  memcpy(w->values + b, w->x + b, (e - b) * sizeof(float));
  for (size_t i = b; i < e; i++) w->indices[i] = (uint32_t)i;
}

/* ---- small inputs: quickselect on unique composite keys ------------------------------- */

/* (key << 32) | ~index: larger is earlier in top-k order, and no two are equal. */
static inline uint64_t comp_key(uint32_t key, size_t i) {
  return ((uint64_t)key << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

/* The want-th (0-based) largest of a[0..n); reorders a. */
static uint64_t nth_largest(uint64_t *a, size_t n, size_t want) {
  size_t lo = 0, hi = n;
  while (hi - lo > 1) {
    uint64_t p0 = a[lo], p1 = a[lo + (hi - lo) / 2], p2 = a[hi - 1];
    uint64_t p = p0 > p1 ? (p1 > p2 ? p1 : (p0 > p2 ? p2 : p0)) : (p0 > p2 ? p0 : (p1 > p2 ? p2 : p1));
    size_t lt = lo, i = lo, gt = hi; /* [lo,lt) > p, [lt,i) == p, [gt,hi) < p */
    while (i < gt) {
      uint64_t v = a[i];
      if (v > p) {
        a[i++] = a[lt];
        a[lt++] = v;
      } else if (v < p) {
        a[i] = a[--gt];
        a[gt] = v;
      } else {
        i++;
      }
    }
    if (want < lt)
      hi = lt;
    else if (want >= gt)
      lo = gt;
    else
      return p;
  }
  return a[lo];
}

static int small_select(const float *x, size_t d, size_t k, float *values, uint32_t *indices,
                        uint32_t *kth_key, size_t *bad_index) {
  size_t bad = tide__first_nonfinite(x, 0, d);
  if (bad < d) {
    *bad_index = bad;
    return TIDE__NONFINITE;
  }
  uint64_t *comp = tide__malloc(d * sizeof *comp);
  if (comp == NULL) return TIDE_ENOMEM;
  for (size_t i = 0; i < d; i++) comp[i] = comp_key(tide__key(x[i]), i);
  uint64_t cut = nth_largest(comp, d, k - 1);
  tide__free(comp);
  size_t n = 0;
  for (size_t i = 0; i < d; i++) {
    if (comp_key(tide__key(x[i]), i) >= cut) {
      values[n] = x[i];
      indices[n] = (uint32_t)i;
      n++;
    }
  }
  *kth_key = (uint32_t)(cut >> 32);
  return 0;
}

/* ---- the collection scan ----------------------------------------------------------------- */

/* Appends every (key, index) of x[begin, end) with key >= cut to c. Stops
 * early (returning 0) when c grows past cap or *stop is set; sets *stop
 * then. The 64-element test is the vectorised part: most blocks hold no
 * candidate. */
static int collect_range(const float *x, size_t begin, size_t end, uint32_t cut, tide__cand_t *c,
                         size_t cap, atomic_int *stop) {
  const tide__u32_alias *u = (const tide__u32_alias *)x;
  const int32_t scut = (int32_t)cut;
  size_t i = begin;
  for (; i + BLOCK <= end; i += BLOCK) {
    if (((i - begin) & 0xffff) == 0 && stop != NULL &&
        atomic_load_explicit(stop, memory_order_relaxed))
      return 0;
    int hit = 0;
    for (int j = 0; j < BLOCK; j++) hit |= (int32_t)(u[i + j] & 0x7fffffffu) >= scut;
    if (!hit) continue;
    /* A bit mask of the hits, then one step per hit: no branch per element
     * to mispredict. */
    uint64_t mask = tide__hit_mask64(x, i, cut);
    TIDE_CHECK(tide__cand_grow(c, c->len + BLOCK));
    for (; mask != 0; mask &= mask - 1) {
      int j = __builtin_ctzll(mask);
      c->bits[c->len] = u[i + j];
      c->index[c->len] = (uint32_t)(i + j);
      c->len++;
    }
    if (c->len > cap) {
      if (stop != NULL) atomic_store(stop, 1);
      return 0;
    }
  }
  for (; i < end; i++) {
    if ((u[i] & 0x7fffffffu) >= cut) TIDE_CHECK(tide__cand_push(c, u[i], (uint32_t)i));
  }
  if (c->len > cap && stop != NULL) atomic_store(stop, 1);
  return 0;
}

/* ---- exact top k of a complete candidate set --------------------------------------------- */

/* Candidates hold every key >= cut, so the histogram of key >> 16 needs only
 * the buckets from cut >> 16 up (a few, usually). Within the bucket of the
 * k-th key, its few keys are gathered and quickselected. Values come from
 * the stored bits: no gather from x. */
typedef struct {
  tide__cand_t *c;
  int nc;
  int phase;
  uint32_t base;   /* first histogram bucket: cut >> 16 */
  uint32_t range;  /* buckets from base up to the non-finite ones */
  uint32_t *hist;  /* per worker, range each */
  uint64_t **gathered; /* per worker: low 16 bits of the bucket's keys */
  uint32_t bucket, kth;
  size_t *gt, *eq, *take, *off; /* per list */
  float *values;
  uint32_t *indices;
} finish_t;

static void finish_work(void *arg, int tid, int nw) {
  finish_t *f = arg;
  uint32_t *h = f->hist + (size_t)tid * f->range;
  size_t ng = 0;
  if (f->phase == 0) memset(h, 0, f->range * sizeof *h);
  for (int l = tid; l < f->nc; l += nw) {
    const uint32_t *bits = f->c[l].bits;
    size_t len = f->c[l].len;
    if (f->phase == 0) {
      for (size_t i = 0; i < len; i++) h[((bits[i] & 0x7fffffffu) >> 16) - f->base]++;
    } else if (f->phase == 1) {
      uint64_t *g = f->gathered[tid];
      for (size_t i = 0; i < len; i++)
        if (((bits[i] & 0x7fffffffu) >> 16) == f->bucket) g[ng++] = bits[i] & 0xffffu;
    } else if (f->phase == 2) {
      size_t gt = 0, eq = 0;
      for (size_t i = 0; i < len; i++) {
        uint32_t key = bits[i] & 0x7fffffffu;
        gt += key > f->kth;
        eq += key == f->kth;
      }
      f->gt[l] = gt;
      f->eq[l] = eq;
    } else {
      const uint32_t *index = f->c[l].index;
      size_t n = f->off[l], take = f->take[l];
      for (size_t i = 0; i < len; i++) {
        uint32_t key = bits[i] & 0x7fffffffu;
        if (key > f->kth || (key == f->kth && take > 0)) {
          take -= key == f->kth;
          memcpy(&f->values[n], &bits[i], sizeof(float));
          f->indices[n] = index[i];
          n++;
        }
      }
    }
  }
}

int tide__cand_finish(tide__cand_t *cands, int ncands, uint32_t cut, size_t k, int nthreads,
                      float *values, uint32_t *indices, uint32_t *kth_key) {
  size_t total = 0;
  for (int l = 0; l < ncands; l++) total += cands[l].len;
  int nw = nthreads;
  if ((size_t)nw > total / TIDE__CAND_GRAIN + 1) nw = (int)(total / TIDE__CAND_GRAIN + 1);
  if (nw > ncands) nw = ncands;
  if (nw < 1) nw = 1;
  int rc = 0;
  finish_t f = {.c = cands, .nc = ncands, .values = values, .indices = indices};
  uint64_t *gathered[256] = {NULL};
  f.gathered = gathered;
  f.base = cut >> 16;
  f.range = (TIDE__KEY_NONFINITE >> 16) - f.base;
  f.hist = tide__malloc((size_t)nw * f.range * sizeof(uint32_t));
  size_t *per_list = tide__calloc((size_t)ncands * 4, sizeof(size_t));
  if (f.hist == NULL || per_list == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  f.gt = per_list;
  f.eq = per_list + ncands;
  f.take = per_list + 2 * (size_t)ncands;
  f.off = per_list + 3 * (size_t)ncands;

  /* The bucket of the k-th largest key, and how many of it to take. */
  f.phase = 0;
  tide__parallel_run(nw, finish_work, &f);
  size_t above = 0, need = 0, in_bucket = 0;
  uint32_t b = f.range;
  while (b-- > 0) {
    size_t n = 0;
    for (int w = 0; w < nw; w++) n += f.hist[(size_t)w * f.range + b];
    if (above + n >= k || b == 0) {
      in_bucket = n;
      break;
    }
    above += n;
  }
  need = k - above;
  f.bucket = f.base + b;

  /* The exact key within it: quickselect its low bits. */
  for (int w = 0; w < nw; w++) {
    gathered[w] = tide__malloc((f.hist[(size_t)w * f.range + b] + 1) * sizeof(uint64_t));
    if (gathered[w] == NULL) {
      rc = TIDE_ENOMEM;
      goto out;
    }
  }
  f.phase = 1;
  tide__parallel_run(nw, finish_work, &f);
  uint64_t *all = gathered[0];
  if (nw > 1) {
    all = tide__malloc(in_bucket * sizeof *all);
    if (all == NULL) {
      rc = TIDE_ENOMEM;
      goto out;
    }
    size_t n = 0;
    for (int w = 0; w < nw; w++) {
      size_t len = f.hist[(size_t)w * f.range + b];
      memcpy(all + n, gathered[w], len * sizeof *all);
      n += len;
    }
  }
  uint32_t lo = (uint32_t)nth_largest(all, in_bucket, need - 1);
  if (all != gathered[0]) tide__free(all);
  f.kth = (f.bucket << 16) | lo;

  f.phase = 2;
  tide__parallel_run(nw, finish_work, &f);
  /* Elements with key == kth to take, lowest indices first. */
  size_t gt = 0;
  for (int l = 0; l < ncands; l++) gt += f.gt[l];
  size_t ties = k - gt, n = 0;
  for (int l = 0; l < ncands; l++) {
    f.take[l] = f.eq[l] < ties ? f.eq[l] : ties;
    ties -= f.take[l];
    f.off[l] = n;
    n += f.gt[l] + f.take[l];
  }
  f.phase = 3;
  tide__parallel_run(nw, finish_work, &f);
  *kth_key = f.kth;
out:
  for (int w = 0; w < nw; w++) tide__free(gathered[w]);
  tide__free(f.hist);
  tide__free(per_list);
  return rc;
}

/* ---- exact radix selection ------------------------------------------------------------- */

typedef struct {
  const float *x;
  size_t d;
  int phase;
  uint32_t *hi;  /* per thread, HI_BUCKETS each */
  uint32_t *lo;  /* per thread, LO_BUCKETS each (direct path only) */
  uint32_t bucket, kth;
  tide__cand_t *cands;
  int rc[256];
  size_t off[256], take[256];
  float *values;
  uint32_t *indices;
} exact_t;

/* Two interleaved histograms halve the stalls when neighbours share a
 * bucket (gradients crowd into a few hundred buckets). */
static void hist_hi_range(const float *x, size_t begin, size_t end, uint32_t *h0, uint32_t *h1) {
  const tide__u32_alias *u = (const tide__u32_alias *)x;
  size_t i = begin;
  for (; i + 2 <= end; i += 2) {
    h0[(u[i] >> 16) & 0x7fff]++;
    h1[(u[i + 1] >> 16) & 0x7fff]++;
  }
  for (; i < end; i++) h0[(u[i] >> 16) & 0x7fff]++;
}

static void exact_work(void *arg, int tid, int nt) {
  exact_t *e = arg;
  size_t b, end;
  tide__chunk(e->d, tid, nt, &b, &end);
  const tide__u32_alias *u = (const tide__u32_alias *)e->x;
  uint32_t *hi = e->hi + (size_t)tid * 2 * HI_BUCKETS;
  uint32_t *lo = e->lo + (size_t)tid * LO_BUCKETS;
  if (e->phase == 0) {
    memset(hi, 0, 2 * HI_BUCKETS * sizeof *hi);
    hist_hi_range(e->x, b, end, hi, hi + HI_BUCKETS);
    for (unsigned i = 0; i < HI_BUCKETS; i++) hi[i] += hi[HI_BUCKETS + i];
  } else if (e->phase == 1) {
    /* Collect every key >= bucket << 16; the capacity was counted exactly. */
    e->rc[tid] = collect_range(e->x, b, end, e->bucket << 16, &e->cands[tid], SIZE_MAX, NULL);
  } else if (e->phase == 2) {
    memset(lo, 0, LO_BUCKETS * sizeof *lo);
    for (size_t i = b; i < end; i++) {
      uint32_t key = u[i] & 0x7fffffffu;
      if ((key >> 16) == e->bucket) lo[key & 0xffff]++;
    }
  } else {
    /* Emit key > kth, and the first take[tid] keys == kth. */
    size_t n = e->off[tid], take = e->take[tid];
    const int32_t skth = (int32_t)e->kth;
    size_t i = b;
    for (; i < end; i += BLOCK) {
      size_t stop = i + BLOCK <= end ? i + BLOCK : end;
      if (stop - i == BLOCK) {
        int hit = 0;
        for (int j = 0; j < BLOCK; j++) hit |= (int32_t)(u[i + j] & 0x7fffffffu) >= skth;
        if (!hit) continue;
      }
      for (size_t j = i; j < stop; j++) {
        uint32_t key = u[j] & 0x7fffffffu;
        if (key > e->kth || (key == e->kth && take > 0)) {
          take -= key == e->kth;
          e->values[n] = e->x[j];
          e->indices[n] = (uint32_t)j;
          n++;
        }
      }
    }
  }
}

int tide__topk_exact(const float *x, size_t d, size_t k, int nt, float *values,
                     uint32_t *indices, tide_topk_stats_t *stats, size_t *bad_index) {
  if (d <= SMALL_D) {
    uint32_t kth;
    int rc = small_select(x, d, k, values, indices, &kth, bad_index);
    if (rc == 0) {
      uint32_t bits = kth;
      memcpy(&stats->threshold, &bits, sizeof bits);
      stats->full_passes = 2;
      stats->candidates = d;
    }
    return rc;
  }
  int rc = 0;
  exact_t e = {.x = x, .d = d, .values = values, .indices = indices};
  tide__scratch_t *scratch = tide__scratch_acquire();
  if (scratch == NULL) return TIDE_ENOMEM;
  tide__cand_t *cands = scratch->cands;
  e.cands = cands;
  uint32_t *hist = NULL;
  e.hi = tide__malloc((size_t)nt * 2 * HI_BUCKETS * sizeof(uint32_t));
  if (e.hi == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  e.phase = 0;
  tide__parallel_run(nt, exact_work, &e);
  hist = tide__calloc(LO_BUCKETS, sizeof *hist); /* hi, then lo sums */
  if (hist == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int t = 0; t < nt; t++)
    for (unsigned i = 0; i < HI_BUCKETS; i++) hist[i] += e.hi[(size_t)t * 2 * HI_BUCKETS + i];
  for (int t = 0; t < nt; t++) {
    uint32_t *h = e.hi + (size_t)t * 2 * HI_BUCKETS;
    size_t bad = 0;
    for (unsigned i = TIDE__KEY_NONFINITE >> 16; i < HI_BUCKETS; i++) bad += h[i];
    if (bad > 0) {
      size_t b, end;
      tide__chunk(d, t, nt, &b, &end);
      *bad_index = tide__first_nonfinite(x, b, end);
      rc = TIDE__NONFINITE;
      goto out;
    }
  }
  size_t above = 0;
  uint32_t bucket = (TIDE__KEY_NONFINITE >> 16) - 1;
  for (;; bucket--) {
    if (above + hist[bucket] >= k || bucket == 0) break;
    above += hist[bucket];
  }
  e.bucket = bucket;
  stats->full_passes = 2;
  size_t slack = k > 65536 ? k : 65536;
  if (hist[bucket] <= slack) {
    /* Few enough: collect the bucket and everything above it. */
    for (int t = 0; t < nt; t++) {
      size_t n = 0;
      for (unsigned i = bucket; i < HI_BUCKETS; i++) n += e.hi[(size_t)t * 2 * HI_BUCKETS + i];
      TIDE_CHECK_GOTO(tide__cand_grow(&cands[t], n), rc, out);
    }
    e.phase = 1;
    tide__parallel_run(nt, exact_work, &e);
    for (int t = 0; t < nt; t++) TIDE_CHECK_GOTO(e.rc[t], rc, out);
    size_t total = 0;
    for (int t = 0; t < nt; t++) total += cands[t].len;
    uint32_t kth;
    TIDE_CHECK_GOTO(tide__cand_finish(cands, nt, e.bucket << 16, k, nt, values, indices, &kth), rc, out);
    memcpy(&stats->threshold, &kth, sizeof kth);
    stats->candidates = total;
  } else {
    /* Many ties or near-ties (all zeros, say): a histogram of the low bits
     * within the bucket, then emit straight from x. */
    e.lo = tide__malloc((size_t)nt * LO_BUCKETS * sizeof(uint32_t));
    if (e.lo == NULL) {
      rc = TIDE_ENOMEM;
      goto out;
    }
    e.phase = 2;
    tide__parallel_run(nt, exact_work, &e);
    uint32_t *lo_sum = hist;
    memset(lo_sum, 0, LO_BUCKETS * sizeof *lo_sum);
    for (int t = 0; t < nt; t++)
      for (unsigned i = 0; i < LO_BUCKETS; i++) lo_sum[i] += e.lo[(size_t)t * LO_BUCKETS + i];
    size_t need = k - above, above_lo = 0;
    uint32_t lo = LO_BUCKETS - 1;
    for (;; lo--) {
      if (above_lo + lo_sum[lo] >= need || lo == 0) break;
      above_lo += lo_sum[lo];
    }
    e.kth = (bucket << 16) | lo;
    size_t ties = need - above_lo, n = 0;
    for (int t = 0; t < nt; t++) {
      const uint32_t *h = e.hi + (size_t)t * 2 * HI_BUCKETS;
      const uint32_t *l = e.lo + (size_t)t * LO_BUCKETS;
      size_t gt = 0;
      for (unsigned i = bucket + 1; i < HI_BUCKETS; i++) gt += h[i];
      for (unsigned i = lo + 1; i < LO_BUCKETS; i++) gt += l[i];
      e.take[t] = l[lo] < ties ? l[lo] : ties;
      ties -= e.take[t];
      e.off[t] = n;
      n += gt + e.take[t];
    }
    e.phase = 3;
    tide__parallel_run(nt, exact_work, &e);
    memcpy(&stats->threshold, &e.kth, sizeof e.kth);
    stats->full_passes = 4;
    stats->candidates = d;
  }
out:
  tide__scratch_release(scratch);
  tide__free(hist);
  tide__free(e.hi);
  tide__free(e.lo);
  return rc;
}

/* ---- sampled selection --------------------------------------------------------------- */

#define SAMPLE_MAX ((size_t)1 << 14) /* elements sampled at most */

int tide__sample_plan(size_t d, tide__sample_plan_t *plan) {
  /* The sample must be small next to d for the one pass to pay. */
  size_t runs = d / (16 * TIDE__SAMPLE_RUN);
  if (runs > SAMPLE_MAX / TIDE__SAMPLE_RUN) runs = SAMPLE_MAX / TIDE__SAMPLE_RUN;
  if (runs < 256) return 0;
  plan->runs = runs;
  plan->stride = (d - TIDE__SAMPLE_RUN) / (runs - 1);
  return 1;
}

void tide__sample_gather(const tide__sample_plan_t *plan, const float *x, float *sample) {
  for (size_t r = 0; r < plan->runs; r++)
    memcpy(sample + r * TIDE__SAMPLE_RUN, x + tide__sample_start(plan, r), TIDE__SAMPLE_RUN * sizeof *x);
}

int tide__sample_cut(const float *sample, size_t n, size_t d, size_t k, tide__cut_t *out) {
  uint32_t *hist = tide__calloc(HI_BUCKETS, sizeof *hist);
  if (hist == NULL) return TIDE_ENOMEM;
  for (size_t i = 0; i < n; i++) hist[tide__key(sample[i]) >> 16]++;
  /* Expect e sampled elements at or above the k-th key; cut below the
   * r-th sampled key, r four standard deviations (of a binomial count)
   * above e, at the bucket's lower edge. */
  double e = (double)k * (double)n / (double)d;
  double r = ceil(e + 4.0 * sqrt(e) + 4.0);
  uint32_t cut = 0;
  if (r < (double)n) {
    size_t seen = 0;
    for (uint32_t bucket = HI_BUCKETS - 1; bucket > 0; bucket--) {
      seen += hist[bucket];
      if ((double)seen >= r) {
        cut = bucket << 16;
        break;
      }
    }
  }
  tide__free(hist);
  if (cut > TIDE__KEY_NONFINITE) cut = TIDE__KEY_NONFINITE; /* every NaN/Inf is a candidate */
  /* Expected candidates: (r / n) * d; stop collecting at several times that. */
  out->cut = cut;
  out->expect = (size_t)(r * (double)d / (double)n);
  out->cap = 3 * out->expect + 2 * k + 65536;
  return 0;
}

typedef struct {
  const float *x;
  size_t d;
  tide__cut_t cut;
  atomic_int stop;
  tide__cand_t *cands;
  int rc[256];
} sampled_t;

static void scan_work(void *arg, int tid, int nt) {
  sampled_t *s = arg;
  size_t b, e;
  tide__chunk(s->d, tid, nt, &b, &e);
  s->rc[tid] = collect_range(s->x, b, e, s->cut.cut, &s->cands[tid], s->cut.cap, &s->stop);
}

int tide__topk_sampled(const float *x, size_t d, size_t k, int nt, float *values,
                       uint32_t *indices, tide_topk_stats_t *stats, size_t *bad_index) {
  tide__sample_plan_t plan;
  if (!tide__sample_plan(d, &plan)) return tide__topk_exact(x, d, k, nt, values, indices, stats, bad_index);
  size_t sampled = plan.runs * TIDE__SAMPLE_RUN;
  int rc = 0;
  sampled_t s = {.x = x, .d = d};
  tide__scratch_t *scratch = tide__scratch_acquire();
  if (scratch == NULL) return TIDE_ENOMEM;
  tide__cand_t *cands = scratch->cands;
  s.cands = cands;
  /* On the calling thread: ~0.2 ms, less than a fork-join costs on a
   * loaded machine. */
  float *sample = tide__malloc(sampled * sizeof *sample);
  if (sample == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  tide__sample_gather(&plan, x, sample);
  rc = tide__sample_cut(sample, sampled, d, k, &s.cut);
  tide__free(sample);
  if (rc < 0) goto out;
  if (s.cut.cut == 0) /* the cut would take everything: a dense selection */
    goto fallback;
  for (int t = 0; t < nt; t++) TIDE_CHECK_GOTO(tide__cand_grow(&cands[t], tide__cut_reserve(&s.cut, nt)), rc, out);
  atomic_init(&s.stop, 0);
  tide__parallel_run(nt, scan_work, &s);
  for (int t = 0; t < nt; t++) TIDE_CHECK_GOTO(s.rc[t], rc, out);
  if (atomic_load(&s.stop)) goto fallback;
  /* Every NaN and Inf is a candidate (its key is above any finite cut). */
  size_t total = 0;
  for (int t = 0; t < nt; t++) {
    for (size_t i = 0; i < cands[t].len; i++) {
      if ((cands[t].bits[i] & 0x7fffffffu) >= TIDE__KEY_NONFINITE) {
        *bad_index = cands[t].index[i];
        rc = TIDE__NONFINITE;
        goto out;
      }
    }
    total += cands[t].len;
  }
  if (total < k) goto fallback;
  uint32_t kth;
  TIDE_CHECK_GOTO(tide__cand_finish(cands, nt, s.cut.cut, k, nt, values, indices, &kth), rc, out);
  memcpy(&stats->threshold, &kth, sizeof kth);
  stats->full_passes = 1;
  stats->candidates = total;
  goto out;

fallback:
  tide__scratch_release(scratch);
  scratch = NULL;
  rc = tide__topk_exact(x, d, k, nt, values, indices, stats, bad_index);
  if (rc == 0) {
    stats->fallback = 1;
    stats->full_passes += s.cut.cut != 0;
  }
out:
  tide__scratch_release(scratch);
  return rc;
}

/* ---- public entry points ----------------------------------------------------------------- */

/* Everything but the message for a non-finite input: validates the
 * arguments (logging), runs the selector, and returns 0, a TIDE_E* code, or
 * TIDE__NONFINITE with *bad_index. stats_or_null is written on success. */
int tide__topk_run(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const float *x, size_t d,
                   size_t k, const char *name, float *values, uint32_t *indices,
                   tide_topk_stats_t *stats_or_null, size_t *bad_index) {
  static const tide_topk_opts_t defaults = {0};
  if (opts == NULL) opts = &defaults;
  if (name == NULL) name = "tensor";
  if ((unsigned)kind >= TIDE_TOPK_KIND_COUNT) {
    TIDE_ERROR("tide_topk_select(%s): unknown kind %d: use TIDE_TOPK_EXACT, _MSTOPK, _RANDOMK "
               "or _SAMPLED", name, (int)kind);
    return TIDE_EINVAL;
  }
  if (opts->mstopk_rounds < 0 || opts->mstopk_rounds > 64) {
    TIDE_ERROR("tide_topk_select(%s): mstopk_rounds = %d; use 1..64, or 0 for 20", name,
               opts->mstopk_rounds);
    return TIDE_EINVAL;
  }
  if (d > (size_t)UINT32_MAX) {
    TIDE_ERROR("tide_topk_select(%s): d = %zu elements, but indices are uint32: d must be below "
               "2^32; select over shards of the tensor", name, d);
    return TIDE_EINVAL;
  }
  if (k > d) {
    TIDE_ERROR("tide_topk_select(%s): k = %zu is larger than d = %zu", name, k, d);
    return TIDE_EINVAL;
  }
  if (d > 0 && x == NULL) {
    TIDE_ERROR("tide_topk_select(%s): x is NULL with d = %zu", name, d);
    return TIDE_EINVAL;
  }
  if (k > 0 && (values == NULL || indices == NULL)) {
    TIDE_ERROR("tide_topk_select(%s): values and indices must hold k = %zu pairs, got NULL",
               name, k);
    return TIDE_EINVAL;
  }
  int nt;
  TIDE_CHECK(tide__compress_threads(opts->num_threads, d, &nt));
  tide_topk_stats_t stats = {.threads = nt};
  int rc = 0;
  if (d == 0) {
    rc = 0;
  } else if (k == 0 || k == d) {
    rc = tide__check_finite(x, d, nt, bad_index);
    stats.full_passes = 1;
    if (rc == 0 && k == d) {
      whole_t w = {.x = x, .d = d, .values = values, .indices = indices};
      tide__parallel_run(nt, copy_work, &w);
      stats.full_passes = 2;
      stats.threshold = fabsf(x[0]);
      for (size_t i = 1; i < d; i++) stats.threshold = fminf(stats.threshold, fabsf(x[i]));
    }
  } else {
    int rounds = opts->mstopk_rounds > 0 ? opts->mstopk_rounds : 20;
    switch (kind) {
      case TIDE_TOPK_EXACT:
        rc = tide__topk_exact(x, d, k, nt, values, indices, &stats, bad_index);
        break;
      case TIDE_TOPK_MSTOPK:
        rc = tide__topk_mstopk(x, d, k, rounds, opts->seed, nt, values, indices, &stats,
                               bad_index);
        break;
      case TIDE_TOPK_RANDOMK:
        rc = tide__topk_randomk(x, d, k, opts->seed, nt, values, indices, &stats, bad_index);
        break;
      default:
        rc = tide__topk_sampled(x, d, k, nt, values, indices, &stats, bad_index);
        break;
    }
  }
  if (rc == TIDE_ENOMEM)
    TIDE_ERROR("tide_topk_select(%s): out of memory for the scratch of d = %zu, k = %zu", name,
               d, k);
  if (rc == 0 && stats_or_null != NULL) *stats_or_null = stats;
  return rc;
}

const char *tide__nonfinite_name(float v) {
  return isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
}

static int select_checked(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const float *x,
                          size_t d, size_t k, const char *name, float *values,
                          uint32_t *indices, tide_topk_stats_t *stats_or_null) {
  size_t bad = 0;
  int rc = tide__topk_run(kind, opts, x, d, k, name, values, indices, stats_or_null, &bad);
  if (rc == TIDE__NONFINITE) {
    TIDE_ERROR("tide_topk_select(%s): tensor \"%s\" element %zu of %zu is %s; top-k selection "
               "needs finite values (skip this step, or lower the loss scale)",
               tide_topk_name(kind), name != NULL ? name : "tensor", bad, d,
               tide__nonfinite_name(x[bad]));
    return TIDE_EINVAL;
  }
  return rc;
}

int tide_topk_select_opts(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const float *x,
                          size_t d, size_t k, const char *name, float *values,
                          uint32_t *indices, tide_topk_stats_t *stats_or_null) {
  return select_checked(kind, opts, x, d, k, name, values, indices, stats_or_null);
}

int tide_topk_select(tide_topk_kind_t kind, const float *x, size_t d, size_t k, const char *name,
                     float *values, uint32_t *indices, tide_topk_stats_t *stats_or_null) {
  return select_checked(kind, NULL, x, d, k, name, values, indices, stats_or_null);
}
