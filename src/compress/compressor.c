/* Error feedback: the compressor keeps, for every element of a flat
 * gradient, what earlier steps did not send, and adds it to the next
 * gradient before selecting.
 *
 * The exactness of selected + residual_after == grad + residual_before comes
 * from doing one float add per element, acc = grad + residual, and then only
 * moving values: the selected pairs are copies of acc, the new residual is
 * acc with those entries set to zero. acc is a second buffer, swapped with
 * the residual on success, so a failed step (a NaN or Inf) leaves the
 * residual exactly as it was. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "compress/compress.h"
#include "gpu/gpu.h"

typedef struct {
  char *name; /* never NULL: the caller's, or "tensor <i>" */
  size_t offset, count;
  size_t k;
} ctensor_t;

struct tide_compressor {
  tide_topk_kind_t kind;
  tide_topk_scope_t scope;
  tide_topk_opts_t opts;
  double density;
  size_t d;
  ctensor_t *tensors; /* sorted by offset, tiling [0, d) */
  size_t ntensors;
  size_t k; /* pairs per compress */
  float *residual;
  float *acc;
  uint64_t step;
  char last_error[512];
  /* A step in progress (tide__ef_begin .. tide__ef_finish). */
  tide__scratch_t *scratch; /* its candidate lists; NULL when no step is open */
  tide__cut_t cut;
  size_t fed;   /* elements fed so far */
  int nlists;   /* candidate lists used so far, in index order */
  int overflow; /* stopped collecting: select exactly from acc */
  int nonfinite;
  tide__gpu_ef_t *gpu; /* tide_compressor_create_gpu: residual and selection on a GPU */
};

/* Asks for transparent huge pages over the whole pages of a large buffer:
 * a fault then maps 2 MiB instead of 4 KiB (the first step of a 25M
 * gradient faulted for half a second here), and passes over it miss the
 * TLB less. Only advice: ignored where unsupported. */
static void huge_pages(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  const uintptr_t page = 4096;
  uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + bytes) & ~(page - 1);
  if (bytes >= ((size_t)4 << 20) && end > begin) madvise((void *)begin, end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

static int density_ok(double density) { return density > 0.0 && density <= 1.0; }

static void set_k(tide_compressor_t *c) {
  c->k = 0;
  for (size_t t = 0; t < c->ntensors; t++) {
    c->tensors[t].k = tide_topk_count(c->density, c->tensors[t].count);
    c->k += c->tensors[t].k;
  }
  if (c->scope == TIDE_TOPK_GLOBAL) c->k = tide_topk_count(c->density, c->d);
}

void tide_compressor_destroy(tide_compressor_t *c) {
  if (c == NULL) return;
  tide__ef_abort(c);
  tide__gpu_ef_destroy(c->gpu);
  for (size_t t = 0; t < c->ntensors; t++) tide__free(c->tensors[t].name);
  tide__free(c->tensors);
  tide__free(c->residual);
  tide__free(c->acc);
  tide__free(c);
}

/* Both creates: the host buffers, or the GPU's when gpu is set. */
static int create(tide_topk_kind_t kind, double density, tide_topk_scope_t scope, const tide_tensor_t *tensors,
                  size_t ntensors, size_t d, const tide_topk_opts_t *opts, int gpu, void *stream,
                  tide_compressor_t **out) {
  if (out == NULL) {
    TIDE_ERROR("tide_compressor_create: out must not be NULL");
    return TIDE_EINVAL;
  }
  if ((unsigned)kind >= TIDE_TOPK_KIND_COUNT) {
    TIDE_ERROR("tide_compressor_create: unknown kind %d: use TIDE_TOPK_EXACT, _MSTOPK, "
               "_RANDOMK or _SAMPLED", (int)kind);
    return TIDE_EINVAL;
  }
  if (!density_ok(density)) {
    TIDE_ERROR("tide_compressor_create: density = %g; it must be in (0, 1]", density);
    return TIDE_EINVAL;
  }
  if (scope != TIDE_TOPK_PER_TENSOR && scope != TIDE_TOPK_GLOBAL) {
    TIDE_ERROR("tide_compressor_create: scope = %d; use TIDE_TOPK_PER_TENSOR or "
               "TIDE_TOPK_GLOBAL", (int)scope);
    return TIDE_EINVAL;
  }
  if (d == 0 || d > (size_t)UINT32_MAX) {
    TIDE_ERROR("tide_compressor_create: d = %zu; it must be in [1, 2^32) (indices are "
               "uint32: use one compressor per shard)", d);
    return TIDE_EINVAL;
  }
  if (opts != NULL && (opts->mstopk_rounds < 0 || opts->mstopk_rounds > 64)) {
    TIDE_ERROR("tide_compressor_create: mstopk_rounds = %d; use 1..64, or 0 for 20",
               opts->mstopk_rounds);
    return TIDE_EINVAL;
  }
  int rc = 0;
  tide_compressor_t *c = tide__calloc(1, sizeof *c);
  if (c == NULL) return TIDE_ENOMEM;
  c->kind = kind;
  c->scope = scope;
  c->density = density;
  c->d = d;
  if (opts != NULL) c->opts = *opts;
  c->ntensors = ntensors > 0 ? ntensors : 1;
  c->tensors = tide__calloc(c->ntensors, sizeof *c->tensors);
  if (c->tensors == NULL) {
    rc = TIDE_ENOMEM;
    goto fail;
  }
  if (ntensors == 0) {
    c->tensors[0] = (ctensor_t){tide__strdup("tensor"), 0, d, 0};
    if (c->tensors[0].name == NULL) rc = TIDE_ENOMEM;
  }
  /* order: the tensors' indices by offset (they tile [0, d)) */
  size_t *order = ntensors > 0 ? tide__calloc(ntensors, sizeof *order) : NULL;
  if (ntensors > 0 && order == NULL) rc = TIDE_ENOMEM;
  if (rc == 0) rc = tide__tensors_check("tide_compressor_create", tensors, ntensors, d, order);
  for (size_t j = 0; j < ntensors && rc == 0; j++) {
    size_t t = order[j];
    char fallback[32];
    snprintf(fallback, sizeof fallback, "tensor %zu", t);
    const char *name = tensors[t].name != NULL ? tensors[t].name : fallback;
    c->tensors[j] = (ctensor_t){tide__strdup(name), tensors[t].offset, tensors[t].count, 0};
    if (c->tensors[j].name == NULL) rc = TIDE_ENOMEM;
  }
  tide__free(order);
  if (rc < 0) goto fail;
  set_k(c);
  if (gpu) {
    if ((rc = tide__gpu_ef_create(d, stream, &c->gpu)) < 0) goto fail;
    *out = c;
    return 0;
  }
  c->residual = tide__calloc(d, sizeof(float));
  c->acc = tide__malloc(d * sizeof(float));
  if (c->residual == NULL || c->acc == NULL) {
    rc = TIDE_ENOMEM;
    goto fail;
  }
  huge_pages(c->residual, d * sizeof(float));
  huge_pages(c->acc, d * sizeof(float));
  *out = c;
  return 0;
fail:
  if (rc == TIDE_ENOMEM)
    TIDE_ERROR("tide_compressor_create: out of memory for %zu tensors, d = %zu", ntensors, d);
  tide_compressor_destroy(c);
  return rc;
}

int tide_compressor_create(tide_topk_kind_t kind, double density, tide_topk_scope_t scope,
                           const tide_tensor_t *tensors, size_t ntensors, size_t d,
                           const tide_topk_opts_t *opts, tide_compressor_t **out) {
  return create(kind, density, scope, tensors, ntensors, d, opts, 0, NULL, out);
}

int tide_compressor_create_gpu(tide_topk_kind_t kind, double density, size_t d, const tide_topk_opts_t *opts,
                               void *stream, tide_compressor_t **out) {
  if (kind == TIDE_TOPK_RANDOMK) {
    TIDE_ERROR("tide_compressor_create_gpu: random-k has no GPU kernels: use exact, sampled or mstopk");
    return TIDE_EINVAL;
  }
  return create(kind, density, TIDE_TOPK_GLOBAL, NULL, 0, d, opts, 1, stream, out);
}

int tide_compressor_set_residual(tide_compressor_t *c, const float *residual, size_t d) {
  if (c == NULL || residual == NULL) {
    TIDE_ERROR("tide_compressor_set_residual: compressor and residual must not be NULL");
    return TIDE_EINVAL;
  }
  if (d != c->d) {
    TIDE_ERROR("tide_compressor_set_residual: d is %zu but the compressor was created for %zu elements", d, c->d);
    return TIDE_EINVAL;
  }
  if (c->gpu != NULL) return tide__gpu_ef_set_residual(c->gpu, residual);
  memcpy(c->residual, residual, d * sizeof *residual);
  return 0;
}

size_t tide_compressor_k(const tide_compressor_t *c) { return c != NULL ? c->k : 0; }

size_t tide_compressor_size(const tide_compressor_t *c) { return c != NULL ? c->d : 0; }

int tide_compressor_set_density(tide_compressor_t *c, double density) {
  if (c == NULL) return tide__null_arg("tide_compressor_set_density", "c");
  if (!density_ok(density)) {
    TIDE_ERROR("tide_compressor_set_density: density = %g; it must be in (0, 1]", density);
    return TIDE_EINVAL;
  }
  c->density = density;
  set_k(c);
  return 0;
}

const float *tide_compressor_residual(const tide_compressor_t *c) {
  if (c != NULL && c->gpu != NULL) return tide__gpu_ef_residual(c->gpu);
  return c != NULL ? c->residual : NULL;
}

int tide_compressor_reset(tide_compressor_t *c) {
  if (c == NULL) {
    TIDE_ERROR("tide_compressor_reset: c must not be NULL");
    return TIDE_EINVAL;
  }
  tide__ef_abort(c);
  c->step = 0;
  c->last_error[0] = '\0';
  if (c->gpu != NULL) return tide__gpu_ef_reset(c->gpu);
  memset(c->residual, 0, c->d * sizeof(float));
  return 0;
}

const char *tide_compressor_last_error(const tide_compressor_t *c) {
  return c != NULL ? c->last_error : "";
}

typedef struct {
  const float *grad, *residual;
  float *acc;
  size_t d;
  int bad[256];
} acc_t;

static void acc_work(void *arg, int tid, int nt) {
  acc_t *a = arg;
  size_t b, e;
  tide__chunk(a->d, tid, nt, &b, &e);
  const float *restrict g = a->grad, *restrict r = a->residual;
  float *restrict out = a->acc;
  /* In blocks, so that the check reads acc from the cache. */
  for (size_t i = b; i < e; i += 4096) {
    size_t stop = i + 4096 < e ? i + 4096 : e;
    for (size_t j = i; j < stop; j++) out[j] = g[j] + r[j];
    a->bad[tid] |= tide__any_nonfinite(out, i, stop);
  }
}

/* The seed of one selection: different for every step and tensor. */
static uint64_t step_seed(const tide_compressor_t *c, size_t tensor) {
  uint64_t state = c->opts.seed ^ (c->step * 0xd1342543de82ef95ull) ^
                   ((uint64_t)tensor * 0x9e3779b97f4a7c15ull);
  return tide__splitmix64(&state);
}

/* The message for a NaN or Inf at flat index `flat` of acc; grad is the
 * caller's gradient, or NULL when it came in pieces. */
static int fail_nonfinite(tide_compressor_t *c, const float *grad, size_t flat) {
  size_t lo = 0, hi = c->ntensors; /* the tensor holding flat */
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (c->tensors[mid].offset <= flat)
      lo = mid;
    else
      hi = mid;
  }
  const ctensor_t *t = &c->tensors[lo];
  char from[96] = "";
  if (grad != NULL) snprintf(from, sizeof from, "gradient %g, ", (double)grad[flat]);
  snprintf(c->last_error, sizeof c->last_error,
           "tide_compressor_compress: tensor \"%s\" element %zu (flat index %zu) of gradient + "
           "residual is %s (%sresidual %g); the residual is unchanged, skip this step",
           t->name, flat - t->offset, flat, tide__nonfinite_name(c->acc[flat]), from,
           (double)c->residual[flat]);
  TIDE_ERROR("%s", c->last_error);
  return TIDE_EINVAL;
}

/* ---- the one-pass path ------------------------------------------------------------------ */

int tide__ef_plan(const tide_compressor_t *c, tide__sample_plan_t *plan) {
  return c != NULL && c->gpu == NULL && c->kind == TIDE_TOPK_SAMPLED && c->scope == TIDE_TOPK_GLOBAL && c->k > 0 &&
         c->k < c->d && tide__sample_plan(c->d, plan);
}

void tide__ef_abort(tide_compressor_t *c) {
  if (c == NULL || c->scratch == NULL) return;
  tide__scratch_release(c->scratch);
  c->scratch = NULL;
}

int tide__ef_begin(tide_compressor_t *c, const float *grad_sample) {
  tide__sample_plan_t plan;
  if (!tide__ef_plan(c, &plan) || c->scratch != NULL) return TIDE_EINVAL; /* a caller's bug */
  size_t n = plan.runs * TIDE__SAMPLE_RUN;
  float *sample = tide__malloc(n * sizeof *sample);
  if (sample == NULL) return TIDE_ENOMEM;
  for (size_t r = 0; r < plan.runs; r++) {
    const float *res = c->residual + tide__sample_start(&plan, r);
    for (size_t j = 0; j < TIDE__SAMPLE_RUN; j++) {
      size_t i = r * TIDE__SAMPLE_RUN + j;
      sample[i] = grad_sample[i] + res[j];
    }
  }
  int rc = tide__sample_cut(sample, n, c->d, c->k, &c->cut);
  tide__free(sample);
  if (rc < 0) return rc;
  c->scratch = tide__scratch_acquire();
  if (c->scratch == NULL) return TIDE_ENOMEM;
  c->fed = 0;
  c->nlists = 0;
  c->overflow = c->cut.cut == 0; /* the cut would take everything: select exactly */
  c->nonfinite = 0;
  return 0;
}

typedef struct {
  const float *piece, *residual; /* at the piece's offset */
  float *acc;                    /* likewise */
  size_t len, offset;
  uint32_t cut;
  size_t cap;
  int collect;
  tide__cand_t *lists; /* nt of them */
  int rc[TIDE__MAX_THREADS], bad[TIDE__MAX_THREADS];
} feed_t;

/* One element of feed_range, without vectors. */
static inline int feed_one(const feed_t *f, size_t i, tide__cand_t *list, int *collect, int *nonfinite) {
  float v = f->piece[i] + f->residual[i];
  f->acc[i] = v;
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  *nonfinite |= (bits & 0x7fffffffu) >= TIDE__KEY_NONFINITE;
  if (*collect && (bits & 0x7fffffffu) >= f->cut) {
    TIDE_CHECK(tide__cand_push(list, bits, (uint32_t)(f->offset + i)));
    if (list->len > f->cap) *collect = 0;
  }
  return 0;
}

/* acc[i] = piece[i] + residual[i] for i in [b, e), and every i whose key
 * is >= cut appended to list (index offset + i) while list stays under
 * cap. Returns 0 or TIDE_ENOMEM; *bad is set for a NaN or Inf. */
static int feed_range(const feed_t *f, size_t b, size_t e, tide__cand_t *list, int *bad) {
  int collect = f->collect, nonfinite = 0;
  size_t i = b;
#if defined(__SSE2__)
  const float *restrict p = f->piece, *restrict r = f->residual;
  float *restrict acc = f->acc;
  const uint32_t cut = f->cut;
  /* Scalar until acc is 16-byte aligned, then blocks of 64. */
  for (; i < e && ((uintptr_t)(acc + i) & 15) != 0; i++) TIDE_CHECK(feed_one(f, i, list, &collect, &nonfinite));
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i below = _mm_set1_epi32((int32_t)cut - 1);
  const __m128i finite_max = _mm_set1_epi32((int32_t)TIDE__KEY_NONFINITE - 1);
  for (; i + 64 <= e; i += 64) {
    uint64_t mask = 0;
    int bad_bits = 0;
    for (int j = 0; j < 64; j += 4) {
      __m128 v = _mm_add_ps(_mm_loadu_ps(p + i + j), _mm_loadu_ps(r + i + j));
      _mm_stream_ps(acc + i + j, v);
      __m128i key = _mm_and_si128(_mm_castps_si128(v), abs_mask);
      mask |= (uint64_t)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(key, below))) << j;
      bad_bits |= _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(key, finite_max)));
    }
    nonfinite |= bad_bits != 0;
    if (mask == 0 || !collect) continue;
    TIDE_CHECK(tide__cand_grow(list, list->len + 64));
    for (; mask != 0; mask &= mask - 1) {
      int j = __builtin_ctzll(mask);
      float v = p[i + j] + r[i + j]; /* the same add: the same bits as acc */
      memcpy(&list->bits[list->len], &v, sizeof v);
      list->index[list->len] = (uint32_t)(f->offset + i + j);
      list->len++;
    }
    if (list->len > f->cap) collect = 0;
  }
  _mm_sfence(); /* the streaming stores are visible before the join */
#endif
  for (; i < e; i++) TIDE_CHECK(feed_one(f, i, list, &collect, &nonfinite));
  *bad = nonfinite;
  return 0;
}

static void feed_work(void *arg, int tid, int nt) {
  feed_t *f = arg;
  size_t b, e;
  tide__chunk(f->len, tid, nt, &b, &e);
  f->rc[tid] = feed_range(f, b, e, &f->lists[tid], &f->bad[tid]);
}

int tide__ef_feed(tide_compressor_t *c, size_t offset, const float *piece, size_t len) {
  if (c == NULL || c->scratch == NULL || offset != c->fed || len > c->d - offset) return TIDE_EINVAL;
  int nt;
  TIDE_CHECK(tide__compress_threads(c->opts.num_threads, len, &nt));
  /* Fresh lists for this piece, after the earlier pieces' (index order);
   * when they run out, the last one takes the rest on one thread. */
  int first = c->nlists;
  if (first + nt > TIDE__MAX_THREADS) {
    nt = 1;
    first = TIDE__MAX_THREADS - 1;
  }
  feed_t f = {.piece = piece, .residual = c->residual + offset, .acc = c->acc + offset, .len = len,
              .offset = offset, .cut = c->cut.cut, .cap = c->cut.cap, .collect = !c->overflow,
              .lists = c->scratch->cands + first};
  for (int t = 0; t < nt && f.collect && first + t >= c->nlists; t++)
    TIDE_CHECK(tide__cand_grow(&f.lists[t], tide__cut_reserve(&c->cut, nt) * len / c->d + 64));
  tide__parallel_run(nt, feed_work, &f);
  c->nlists = first + nt;
  c->fed += len;
  size_t total = 0;
  for (int t = 0; t < c->nlists; t++) total += c->scratch->cands[t].len;
  for (int t = 0; t < nt; t++) {
    TIDE_CHECK(f.rc[t]);
    c->nonfinite |= f.bad[t];
  }
  if (total > c->cut.cap) c->overflow = 1;
  return 0;
}

int tide__ef_finish(tide_compressor_t *c, const float *grad_or_null, float *values, uint32_t *indices,
                    size_t *k_out) {
  if (c == NULL || c->scratch == NULL || c->fed != c->d) {
    tide__ef_abort(c);
    return TIDE_EINVAL;
  }
  int nt, rc = tide__compress_threads(c->opts.num_threads, c->d, &nt);
  if (rc == 0 && c->nonfinite) rc = fail_nonfinite(c, grad_or_null, tide__first_nonfinite(c->acc, 0, c->d));
  size_t total = 0;
  for (int t = 0; t < c->nlists; t++) total += c->scratch->cands[t].len;
  if (rc == 0 && !c->overflow && total >= c->k) {
    uint32_t kth;
    rc = tide__cand_finish(c->scratch->cands, c->nlists, c->cut.cut, c->k, nt, values, indices, &kth);
  } else if (rc == 0) { /* the cut was wrong: exact selection over acc */
    tide_topk_stats_t stats;
    size_t bad = 0;
    rc = tide__topk_exact(c->acc, c->d, c->k, nt, values, indices, &stats, &bad);
  }
  tide__ef_abort(c);
  if (rc != 0) {
    if (rc != TIDE_EINVAL)
      snprintf(c->last_error, sizeof c->last_error, "tide_compressor_compress: selection failed: %s",
               tide_strerror(rc));
    return rc;
  }
  /* The selected entries leave acc; what stays is the new residual. */
  float *residual = c->acc;
  c->acc = c->residual;
  c->residual = residual;
  for (size_t j = 0; j < c->k; j++) residual[indices[j]] = 0.0f;
  c->step++;
  *k_out = c->k;
  return 0;
}

/* The one-pass path on a whole gradient. */
static int compress_one_pass(tide_compressor_t *c, const tide__sample_plan_t *plan, const float *grad,
                             float *values, uint32_t *indices, size_t *k_out) {
  float *sample = tide__malloc(plan->runs * TIDE__SAMPLE_RUN * sizeof *sample);
  if (sample == NULL) return TIDE_ENOMEM;
  tide__sample_gather(plan, grad, sample);
  int rc = tide__ef_begin(c, sample);
  tide__free(sample);
  if (rc == 0) rc = tide__ef_feed(c, 0, grad, c->d);
  if (rc == 0) return tide__ef_finish(c, grad, values, indices, k_out);
  tide__ef_abort(c);
  return rc;
}

static int compress_gpu(tide_compressor_t *c, const float *grad, float *values, uint32_t *indices,
                        size_t *k_out) {
  tide_topk_opts_t opts = c->opts;
  opts.seed = step_seed(c, 0);
  size_t bad = 0;
  int rc = tide__gpu_ef_compress(c->gpu, c->kind, &opts, grad, c->k, c->tensors[0].name, values, indices, &bad);
  if (rc == TIDE__GPU_NONFINITE) {
    snprintf(c->last_error, sizeof c->last_error,
             "tide_compressor_compress: element %zu of gradient + residual is NaN or Inf (on the GPU); the "
             "residual is unchanged, skip this step", bad);
    TIDE_ERROR("%s", c->last_error);
    return TIDE_EINVAL;
  }
  if (rc < 0) {
    snprintf(c->last_error, sizeof c->last_error, "tide_compressor_compress: GPU selection failed: %s",
             tide__gpu_last_error()[0] ? tide__gpu_last_error() : tide_strerror(rc));
    return rc;
  }
  c->step++;
  *k_out = c->k;
  return 0;
}

int tide_compressor_compress(tide_compressor_t *c, const float *grad, size_t d, float *values,
                             uint32_t *indices, size_t *k_out) {
  if (c == NULL || grad == NULL || k_out == NULL) {
    TIDE_ERROR("tide_compressor_compress: c, grad and k_out must not be NULL");
    return TIDE_EINVAL;
  }
  if (d != c->d) {
    snprintf(c->last_error, sizeof c->last_error,
             "tide_compressor_compress: d = %zu but the compressor was created for %zu", d, c->d);
    TIDE_ERROR("%s", c->last_error);
    return TIDE_EINVAL;
  }
  if (c->k > 0 && (values == NULL || indices == NULL)) {
    snprintf(c->last_error, sizeof c->last_error,
             "tide_compressor_compress: values and indices must hold %zu pairs, got NULL", c->k);
    TIDE_ERROR("%s", c->last_error);
    return TIDE_EINVAL;
  }
  if (c->gpu != NULL) return compress_gpu(c, grad, values, indices, k_out);
  tide__sample_plan_t plan;
  if (tide__ef_plan(c, &plan)) return compress_one_pass(c, &plan, grad, values, indices, k_out);
  int nt;
  TIDE_CHECK(tide__compress_threads(c->opts.num_threads, d, &nt));
  acc_t a = {grad, c->residual, c->acc, d, {0}};
  tide__parallel_run(nt, acc_work, &a);
  /* Check here, so that no output is written for a step that fails. */
  for (int t = 0; t < nt; t++) {
    if (a.bad[t]) {
      size_t b, e;
      tide__chunk(d, t, nt, &b, &e);
      return fail_nonfinite(c, grad, tide__first_nonfinite(c->acc, b, e));
    }
  }

  tide_topk_opts_t opts = c->opts;
  size_t bad = 0, n = 0;
  int rc = 0;
  if (c->scope == TIDE_TOPK_GLOBAL) {
    opts.seed = step_seed(c, 0);
    rc = tide__topk_run(c->kind, &opts, c->acc, d, c->k, c->tensors[0].name, values, indices,
                        NULL, &bad);
    n = c->k;
  } else {
    for (size_t t = 0; t < c->ntensors && rc == 0; t++) {
      const ctensor_t *ct = &c->tensors[t];
      opts.seed = step_seed(c, t);
      rc = tide__topk_run(c->kind, &opts, c->acc + ct->offset, ct->count, ct->k, ct->name,
                          values + n, indices + n, NULL, &bad);
      if (rc == TIDE__NONFINITE) bad += ct->offset;
      for (size_t j = n; rc == 0 && j < n + ct->k; j++) indices[j] += (uint32_t)ct->offset;
      n += ct->k;
    }
  }
  if (rc == TIDE__NONFINITE) return fail_nonfinite(c, grad, bad);
  if (rc < 0) {
    snprintf(c->last_error, sizeof c->last_error,
             "tide_compressor_compress: selection failed: %s", tide_strerror(rc));
    return rc;
  }
  /* The selected entries leave acc; what stays is the new residual. */
  float *residual = c->acc;
  c->acc = c->residual;
  c->residual = residual;
  for (size_t j = 0; j < n; j++) residual[indices[j]] = 0.0f;
  c->step++;
  *k_out = n;
  return 0;
}
