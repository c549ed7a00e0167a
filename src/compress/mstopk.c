/* MSTopK (Shi et al., MLSys 2021), as the public re-implementations
 * transcribe its Algorithm 1: N bisection probes of a threshold
 * t = base + f * (top - base) between base = mean|x| and top = max|x|,
 * keeping the best bracket (t1: the lowest probe counting c <= k, whose
 * count is k1; t2: the highest probe counting c > k, count k2), then every
 * |x| >= t1 plus one contiguous run of k - k1 elements of the band
 * t2 <= |x| < t1, in index order, from an offset drawn uniformly in
 * [0, |band| - (k - k1)] (inclusive at both ends: the re-implementations'
 * randint(0, |band| - (k - k1) + 1) could return k - 1 elements).
 *
 * Same probes, counts and result as the N-pass scalar reference, but fewer
 * passes: a probe pass that counts k < c <= 2k + 65536 keeps those c
 * elements (while counting when they are few, else in one more pass); every
 * later probe lies above it, so later counts and the final selection run on
 * that collection. Typical cost: one pass for mean and max, then one to a
 * few probe passes. */
#include <math.h>

#include "compress/compress.h"

#define BLOCK 64

double tide__abs_block_sum(const float *x, size_t begin, size_t end) {
  double acc[16] = {0};
  size_t i = begin;
  for (; i + 256 <= end; i += 256) {
    float lane[16];
    for (int j = 0; j < 16; j++) lane[j] = fabsf(x[i + j]);
    for (int q = 1; q < 16; q++)
      for (int j = 0; j < 16; j++) lane[j] += fabsf(x[i + 16 * q + j]);
    for (int j = 0; j < 16; j++) acc[j] += (double)lane[j];
  }
  for (int j = 0; i < end; i++, j = (j + 1) % 16) acc[j] += (double)fabsf(x[i]);
  for (int half = 8; half >= 1; half /= 2)
    for (int j = 0; j < half; j++) acc[j] += acc[j + half];
  return acc[0];
}

/* The passes the worker threads run, in order (ms_work). */
typedef enum {
  PHASE_MEAN,          /* block sums and max */
  PHASE_PROBE,         /* count key >= probe over x, collecting up to budget */
  PHASE_COUNT_KEPT,    /* count over the collection */
  PHASE_DROP_BELOW,    /* drop collected keys < probe */
  PHASE_COUNT_FINAL,   /* sure and band counts per stream */
  PHASE_EMIT           /* write the selection */
} phase_t;

typedef struct {
  const float *x;
  size_t d;
  phase_t phase;
  /* PHASE_MEAN: block sums and max */
  double *block_sum;
  size_t nblocks;
  uint32_t max_key[256];
  /* PHASE_PROBE: count key >= probe over x, collecting those up to budget */
  uint32_t probe;
  size_t cap;    /* most elements kept in the collection */
  size_t budget; /* most collected while counting (stores to fresh memory cost) */
  size_t count[256];
  int overflow[256];
  atomic_size_t collected; /* elements the threads of a probe pass hold */
  atomic_int give_up;      /* set when that passed budget */
  tide__cand_t *cands;
  /* PHASE_COUNT_KEPT, PHASE_DROP_BELOW: over the collection */
  /* PHASE_COUNT_FINAL, PHASE_EMIT: sure and band counts, then emission */
  uint32_t key1, key2;
  int from_x;  /* the final phases stream over x, not the collection */
  int nlists;  /* lists in cands (= threads of the probe passes) */
  size_t sure[256], band[256];
  size_t off[256], band_start[256];
  size_t pick_from, pick_to; /* band positions [from, to) are taken */
  float *values;
  uint32_t *indices;
} ms_t;

static void mean_work(ms_t *m, int tid, int nt) {
  size_t b0 = m->nblocks * (size_t)tid / (size_t)nt, b1 = m->nblocks * (size_t)(tid + 1) / (size_t)nt;
  uint32_t mk = 0;
  for (size_t b = b0; b < b1; b++) {
    size_t begin = b * TIDE__MEAN_BLOCK;
    size_t end = begin + TIDE__MEAN_BLOCK < m->d ? begin + TIDE__MEAN_BLOCK : m->d;
    m->block_sum[b] = tide__abs_block_sum(m->x, begin, end);
    uint32_t block_max = tide__max_key(m->x, begin, end); /* the block is in cache now */
    mk = block_max > mk ? block_max : mk;
  }
  m->max_key[tid] = mk;
}

static void probe_work(ms_t *m, int tid, int nt) {
  size_t b, e;
  tide__chunk(m->d, tid, nt, &b, &e);
  const tide__u32_alias *u = (const tide__u32_alias *)m->x;
  const uint32_t probe = m->probe;
  const int32_t sprobe = (int32_t)probe;
  tide__cand_t *c = &m->cands[tid];
  c->len = 0;
  int collecting = 1;
  size_t count = 0, reported = 0;
  size_t i = b;
  for (; i + BLOCK <= e; i += BLOCK) {
    if (((i - b) & 0xffff) == 0 && collecting) {
      /* Every 64K elements: add to the shared total and stop collecting
       * once all threads together hold more than cap. */
      size_t total = atomic_fetch_add(&m->collected, c->len - reported) + c->len - reported;
      reported = c->len;
      if (total > m->budget || atomic_load_explicit(&m->give_up, memory_order_relaxed)) {
        atomic_store(&m->give_up, 1);
        collecting = 0;
      }
    }
    uint32_t n = 0;
    for (int j = 0; j < BLOCK; j++) n += (int32_t)(u[i + j] & 0x7fffffffu) >= sprobe;
    count += n;
    if (n == 0 || !collecting) continue;
    if (tide__cand_grow(c, c->len + BLOCK) < 0) {
      collecting = 0;
      continue;
    }
    for (uint64_t mask = tide__hit_mask64(m->x, i, probe); mask != 0; mask &= mask - 1) {
      int j = __builtin_ctzll(mask);
      c->bits[c->len] = u[i + j];
      c->index[c->len] = (uint32_t)(i + j);
      c->len++;
    }
    if (c->len > m->budget) collecting = 0;
  }
  for (; i < e; i++) {
    uint32_t key = u[i] & 0x7fffffffu;
    if (key < probe) continue;
    count++;
    if (collecting && tide__cand_push(c, u[i], (uint32_t)i) < 0) collecting = 0;
  }
  m->count[tid] = count;
  m->overflow[tid] = !collecting;
}

/* Phases 2 and 3 work on the collection: lists tid, tid + nw, ... */
static void collected_work(ms_t *m, int tid, int nw) {
  const uint32_t probe = m->probe;
  for (int l = tid; l < m->nlists; l += nw) {
    tide__cand_t *c = &m->cands[l];
    if (m->phase == PHASE_COUNT_KEPT) {
      size_t count = 0;
      for (size_t i = 0; i < c->len; i++) count += (c->bits[i] & 0x7fffffffu) >= probe;
      m->count[l] = count;
    } else {
      size_t n = 0;
      for (size_t i = 0; i < c->len; i++) {
        if ((c->bits[i] & 0x7fffffffu) >= probe) {
          c->bits[n] = c->bits[i];
          c->index[n] = c->index[i];
          n++;
        }
      }
      c->len = n;
    }
  }
}

/* Emits a sure or picked band element (float bits, index) of one
 * index-ordered stream. */
static inline void take(ms_t *m, uint32_t bits, size_t i, size_t *band_pos, size_t *n) {
  uint32_t key = bits & 0x7fffffffu;
  int emit = 0;
  if (key >= m->key1) {
    emit = 1;
  } else if (key >= m->key2) {
    emit = *band_pos >= m->pick_from && *band_pos < m->pick_to;
    (*band_pos)++;
  }
  if (emit) {
    memcpy(&m->values[*n], &bits, sizeof bits);
    m->indices[*n] = (uint32_t)i;
    (*n)++;
  }
}

/* PHASE_COUNT_FINAL counts sure and band elements per stream, PHASE_EMIT emits them.
 * The streams (nlists of them) are the chunks of x, or the collection's
 * lists; worker tid takes streams tid, tid + nw, ... */
static void final_work(ms_t *m, int tid, int nw) {
  const tide__u32_alias *u = (const tide__u32_alias *)m->x;
  for (int s = tid; s < m->nlists; s += nw) {
    size_t b = 0, e = 0;
    const tide__cand_t *c = &m->cands[s];
    if (m->from_x)
      tide__chunk(m->d, s, m->nlists, &b, &e);
    else
      e = c->len;
    if (m->phase == PHASE_COUNT_FINAL) {
      size_t sure = 0, band = 0;
      for (size_t i = b; i < e; i++) {
        uint32_t key = (m->from_x ? u[i] : c->bits[i]) & 0x7fffffffu;
        sure += key >= m->key1;
        band += key >= m->key2 && key < m->key1;
      }
      m->sure[s] = sure;
      m->band[s] = band;
    } else {
      size_t band_pos = m->band_start[s], n = m->off[s];
      for (size_t i = b; i < e; i++) {
        if (m->from_x)
          take(m, u[i], i, &band_pos, &n);
        else
          take(m, c->bits[i], c->index[i], &band_pos, &n);
      }
    }
  }
}

static void ms_work(void *arg, int tid, int nw) {
  ms_t *m = arg;
  switch (m->phase) {
    case PHASE_MEAN:
      mean_work(m, tid, nw);
      break;
    case PHASE_PROBE:
      probe_work(m, tid, nw);
      break;
    case PHASE_COUNT_KEPT:
    case PHASE_DROP_BELOW:
      collected_work(m, tid, nw);
      break;
    case PHASE_COUNT_FINAL:
    case PHASE_EMIT:
      final_work(m, tid, nw);
      break;
  }
}

int tide__topk_mstopk(const float *x, size_t d, size_t k, int rounds, uint64_t seed,
                      int nthreads, float *values, uint32_t *indices, tide_topk_stats_t *stats,
                      size_t *bad_index) {
  int nt = nthreads;
  int rc = 0;
  tide__scratch_t *scratch = tide__scratch_acquire();
  ms_t *m = tide__calloc(1, sizeof *m);
  if (scratch == NULL || m == NULL) {
    tide__scratch_release(scratch);
    tide__free(m);
    return TIDE_ENOMEM;
  }
  tide__cand_t *cands = scratch->cands;
  m->x = x;
  m->d = d;
  m->cands = cands;
  m->nlists = nt;
  m->values = values;
  m->indices = indices;
  m->nblocks = (d + TIDE__MEAN_BLOCK - 1) / TIDE__MEAN_BLOCK;
  m->block_sum = tide__malloc(m->nblocks * sizeof(double));
  if (m->block_sum == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  int nmean = nt < (int)m->nblocks ? nt : (int)m->nblocks;
  m->phase = PHASE_MEAN;
  tide__parallel_run(nmean, ms_work, m);
  uint32_t max_key = 0;
  for (int t = 0; t < nmean; t++) max_key = m->max_key[t] > max_key ? m->max_key[t] : max_key;
  if (max_key >= TIDE__KEY_NONFINITE) {
    *bad_index = tide__first_nonfinite(x, 0, d);
    rc = TIDE__NONFINITE;
    goto out;
  }
  double sum = 0.0;
  for (size_t b = 0; b < m->nblocks; b++) sum += m->block_sum[b];
  double base = sum / (double)d;
  float top_f;
  memcpy(&top_f, &max_key, sizeof top_f);
  double top = top_f;
  stats->full_passes = 1;

  tide__mstopk_bracket_t b = {.l = 0.0, .r = 1.0, .k1 = 0, .k2 = d};
  int collected = 0;
  m->cap = 2 * k + 65536;
  m->budget = d / 32 + 65536 < m->cap ? d / 32 + 65536 : m->cap;
  /* Address space for a full collection up front: pages never written cost
   * nothing, and growing by copies would. */
  for (int i = 0; i < nt; i++) {
    rc = tide__cand_grow(&cands[i], m->cap / (size_t)nt + m->cap / (4 * (size_t)nt) + 1024);
    if (rc < 0) goto out;
  }
  for (int round = 0; round < rounds; round++) {
    double f = (b.l + b.r) / 2.0;
    float t = tide__mstopk_probe(base, top, f);
    m->probe = tide__key(t);
    size_t c = 0;
    if (!collected) {
      atomic_init(&m->collected, 0);
      atomic_init(&m->give_up, 0);
      m->phase = PHASE_PROBE;
      tide__parallel_run(nt, ms_work, m);
      stats->full_passes++;
      int overflow = 0;
      for (int i = 0; i < nt; i++) {
        c += m->count[i];
        overflow |= m->overflow[i];
      }
      if (c > k && !overflow && c <= m->budget) {
        collected = 1;
      } else if (c > k && c <= m->cap) {
        /* Worth keeping but too many to have collected while counting:
         * one pass that only collects. */
        m->budget = m->cap;
        atomic_init(&m->collected, 0);
        atomic_init(&m->give_up, 0);
        tide__parallel_run(nt, ms_work, m);
        stats->full_passes++;
        collected = 1;
        for (int i = 0; i < nt; i++) collected &= !m->overflow[i];
      }
    } else {
      size_t have = 0;
      for (int i = 0; i < nt; i++) have += cands[i].len;
      int nw = have >= TIDE__CAND_GRAIN ? nt : 1;
      m->phase = PHASE_COUNT_KEPT;
      tide__parallel_run(nw, ms_work, m);
      for (int i = 0; i < nt; i++) c += m->count[i];
      if (c > k && c * 4 < have) { /* later probes lie above: keep less */
        m->phase = PHASE_DROP_BELOW;
        tide__parallel_run(nw, ms_work, m);
      }
    }
    tide__mstopk_narrow(&b, k, f, t, c);
  }
  size_t k1 = b.k1, k2 = b.k2;
  float t1 = b.t1, t2 = b.t2;
  for (int i = 0; i < nt && !collected; i++) cands[i].len = 0;

  /* The sure set and the band; with no probe <= k nothing is sure. */
  m->key1 = k1 > 0 ? tide__key(t1) : TIDE__KEY_NONE;
  m->key2 = tide__key(t2);
  size_t band = k2 - k1; /* count(|x| >= t2) - count(|x| >= t1) */
  size_t need = k - k1;
  uint64_t state = seed;
  size_t offset = need > 0 ? (size_t)tide__uniform(&state, band - need + 1) : 0;
  m->pick_from = offset;
  m->pick_to = offset + need;
  m->from_x = !collected;
  size_t have = 0;
  for (int i = 0; i < nt; i++) have += cands[i].len;
  int nw = m->from_x || have >= TIDE__CAND_GRAIN ? nt : 1;
  m->phase = PHASE_COUNT_FINAL;
  tide__parallel_run(nw, ms_work, m);
  size_t n = 0, pos = 0;
  for (int t = 0; t < nt; t++) {
    m->off[t] = n;
    m->band_start[t] = pos;
    size_t lo = pos > m->pick_from ? pos : m->pick_from;
    size_t hi = pos + m->band[t] < m->pick_to ? pos + m->band[t] : m->pick_to;
    n += m->sure[t] + (hi > lo ? hi - lo : 0);
    pos += m->band[t];
  }
  m->phase = PHASE_EMIT;
  tide__parallel_run(nw, ms_work, m);
  if (!collected) stats->full_passes += 2;
  stats->t1 = k1 > 0 ? t1 : INFINITY;
  stats->t2 = t2;
  stats->threshold = n > 0 ? fabsf(values[0]) : 0.0f;
  for (size_t i = 1; i < n; i++) stats->threshold = fminf(stats->threshold, fabsf(values[i]));
  size_t total = 0;
  for (int i = 0; i < nt; i++) total += cands[i].len;
  stats->candidates = collected ? total : d;
out:
  tide__scratch_release(scratch);
  if (m != NULL) tide__free(m->block_sum);
  tide__free(m);
  return rc;
}
