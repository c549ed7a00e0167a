/* Scalar references for the selectors: the plainest code that computes each
 * definition, single-threaded, for the tests to compare the fast paths with.
 * Not used by the library's own paths. Their loops repeat the fast paths'
 * shape on purpose (duplicates lists src/compress/mstopk.c's probe loop
 * against this file's): a reference that shared code with what it checks
 * could not catch a bug in that code. */
#include <math.h>
#include <stdlib.h>

#include "compress/compress.h"

static size_t first_bad(const float *x, size_t d) {
  for (size_t i = 0; i < d; i++)
    if (!isfinite(x[i])) return i;
  return d;
}

/* Sort order of the exact top k: |x| descending, then index ascending. */
typedef struct {
  float mag;
  uint32_t index;
} ranked_t;

static int by_rank(const void *pa, const void *pb) {
  const ranked_t *a = pa, *b = pb;
  if (a->mag != b->mag) return a->mag > b->mag ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

static int by_index(const void *pa, const void *pb) {
  const ranked_t *a = pa, *b = pb;
  return a->index < b->index ? -1 : a->index > b->index;
}

int tide__topk_ref_rank(const float *x, size_t d, uint32_t *order) {
  ranked_t *r = tide__malloc((d > 0 ? d : 1) * sizeof *r);
  if (r == NULL) return TIDE_ENOMEM;
  for (size_t i = 0; i < d; i++) r[i] = (ranked_t){fabsf(x[i]), (uint32_t)i};
  qsort(r, d, sizeof *r, by_rank);
  for (size_t i = 0; i < d; i++) order[i] = r[i].index;
  tide__free(r);
  return 0;
}

int tide__topk_ref_exact(const float *x, size_t d, size_t k, float *values, uint32_t *indices,
                         size_t *bad_index) {
  size_t bad = first_bad(x, d);
  if (bad < d) {
    *bad_index = bad;
    return TIDE__NONFINITE;
  }
  if (k == 0) return 0;
  ranked_t *r = tide__malloc(d * sizeof *r);
  if (r == NULL) return TIDE_ENOMEM;
  for (size_t i = 0; i < d; i++) r[i] = (ranked_t){fabsf(x[i]), (uint32_t)i};
  qsort(r, d, sizeof *r, by_rank);
  qsort(r, k, sizeof *r, by_index);
  for (size_t j = 0; j < k; j++) {
    values[j] = x[r[j].index];
    indices[j] = r[j].index;
  }
  tide__free(r);
  return 0;
}

int tide__topk_ref_mstopk(const float *x, size_t d, size_t k, int rounds, uint64_t seed,
                          float *values, uint32_t *indices, size_t *bad_index) {
  size_t bad = first_bad(x, d);
  if (bad < d) {
    *bad_index = bad;
    return TIDE__NONFINITE;
  }
  if (d == 0) return 0;
  double sum = 0.0;
  for (size_t b = 0; b < d; b += TIDE__MEAN_BLOCK)
    sum += tide__abs_block_sum(x, b, b + TIDE__MEAN_BLOCK < d ? b + TIDE__MEAN_BLOCK : d);
  double base = sum / (double)d;
  float top = 0.0f;
  for (size_t i = 0; i < d; i++) top = fabsf(x[i]) > top ? fabsf(x[i]) : top;

  tide__mstopk_bracket_t b = {.l = 0.0, .r = 1.0, .k1 = 0, .k2 = d};
  for (int round = 0; round < rounds; round++) {
    double f = (b.l + b.r) / 2.0;
    float t = tide__mstopk_probe(base, top, f);
    size_t c = 0;
    for (size_t i = 0; i < d; i++) c += fabsf(x[i]) >= t;
    tide__mstopk_narrow(&b, k, f, t, c);
  }
  size_t k1 = b.k1;
  float t1 = b.t1, t2 = b.t2;
  /* k1 = 0: no probe counted <= k, nothing is sure and the band is |x| >= t2. */
  size_t band = 0;
  for (size_t i = 0; i < d; i++) {
    float a = fabsf(x[i]);
    band += a >= t2 && (k1 == 0 || a < t1);
  }
  size_t need = k - k1;
  uint64_t state = seed;
  size_t offset = need > 0 ? (size_t)tide__uniform(&state, band - need + 1) : 0;
  size_t n = 0, pos = 0;
  for (size_t i = 0; i < d; i++) {
    float a = fabsf(x[i]);
    int take = 0;
    if (k1 > 0 && a >= t1) {
      take = 1;
    } else if (a >= t2) {
      take = pos >= offset && pos < offset + need;
      pos++;
    }
    if (take) {
      values[n] = x[i];
      indices[n] = (uint32_t)i;
      n++;
    }
  }
  return 0;
}

int tide__topk_ref_randomk(const float *x, size_t d, size_t k, uint64_t seed, float *values,
                           uint32_t *indices, size_t *bad_index) {
  size_t bad = first_bad(x, d);
  if (bad < d) {
    *bad_index = bad;
    return TIDE__NONFINITE;
  }
  unsigned char *mark = tide__calloc(d > 0 ? d : 1, 1);
  if (mark == NULL) return TIDE_ENOMEM;
  /* Mark the smaller of the chosen set and its complement. */
  int complement = k > d - k;
  size_t want = complement ? d - k : k;
  uint64_t state = seed;
  size_t drawn = 0;
  while (drawn < want) {
    size_t i = (size_t)tide__uniform(&state, d);
    if (!mark[i]) {
      mark[i] = 1;
      drawn++;
    }
  }
  size_t n = 0;
  for (size_t i = 0; i < d; i++) {
    if (mark[i] != complement) {
      values[n] = x[i];
      indices[n] = (uint32_t)i;
      n++;
    }
  }
  tide__free(mark);
  return 0;
}
