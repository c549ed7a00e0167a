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

#include "compress/compress.h"

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
};

static int by_offset(const void *pa, const void *pb) {
  const ctensor_t *a = pa, *b = pb;
  return a->offset < b->offset ? -1 : a->offset > b->offset;
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
  for (size_t t = 0; t < c->ntensors; t++) tide__free(c->tensors[t].name);
  tide__free(c->tensors);
  tide__free(c->residual);
  tide__free(c->acc);
  tide__free(c);
}

int tide_compressor_create(tide_topk_kind_t kind, double density, tide_topk_scope_t scope,
                           const tide_tensor_t *tensors, size_t ntensors, size_t d,
                           const tide_topk_opts_t *opts, tide_compressor_t **out) {
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
  if (ntensors > 0 && tensors == NULL) {
    TIDE_ERROR("tide_compressor_create: tensors is NULL with ntensors = %zu", ntensors);
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
  for (size_t t = 0; t < ntensors && rc == 0; t++) {
    char fallback[32];
    snprintf(fallback, sizeof fallback, "tensor %zu", t);
    const char *name = tensors[t].name != NULL ? tensors[t].name : fallback;
    c->tensors[t] = (ctensor_t){tide__strdup(name), tensors[t].offset, tensors[t].count, 0};
    if (c->tensors[t].name == NULL) rc = TIDE_ENOMEM;
  }
  if (rc < 0) goto fail;
  qsort(c->tensors, c->ntensors, sizeof *c->tensors, by_offset);
  size_t end = 0;
  for (size_t t = 0; t < c->ntensors; t++) {
    const ctensor_t *ct = &c->tensors[t];
    if (ct->offset != end || ct->count > d - ct->offset) {
      TIDE_ERROR("tide_compressor_create: tensor \"%s\" covers [%zu, %zu) but the tensors must "
                 "tile [0, %zu) without gap or overlap (the previous one ends at %zu)",
                 ct->name, ct->offset, ct->offset + ct->count, d, end);
      rc = TIDE_EINVAL;
      goto fail;
    }
    end = ct->offset + ct->count;
  }
  if (end != d) {
    TIDE_ERROR("tide_compressor_create: the tensors cover [0, %zu) but d = %zu", end, d);
    rc = TIDE_EINVAL;
    goto fail;
  }
  set_k(c);
  c->residual = tide__calloc(d, sizeof(float));
  c->acc = tide__malloc(d * sizeof(float));
  if (c->residual == NULL || c->acc == NULL) {
    rc = TIDE_ENOMEM;
    goto fail;
  }
  *out = c;
  return 0;
fail:
  if (rc == TIDE_ENOMEM)
    TIDE_ERROR("tide_compressor_create: out of memory for %zu tensors, d = %zu", ntensors, d);
  tide_compressor_destroy(c);
  return rc;
}

size_t tide_compressor_k(const tide_compressor_t *c) { return c != NULL ? c->k : 0; }

int tide_compressor_set_density(tide_compressor_t *c, double density) {
  if (c == NULL || !density_ok(density)) {
    TIDE_ERROR("tide_compressor_set_density: density = %g; it must be in (0, 1]", density);
    return TIDE_EINVAL;
  }
  c->density = density;
  set_k(c);
  return 0;
}

const float *tide_compressor_residual(const tide_compressor_t *c) {
  return c != NULL ? c->residual : NULL;
}

int tide_compressor_reset(tide_compressor_t *c) {
  if (c == NULL) {
    TIDE_ERROR("tide_compressor_reset: c must not be NULL");
    return TIDE_EINVAL;
  }
  memset(c->residual, 0, c->d * sizeof(float));
  c->step = 0;
  c->last_error[0] = '\0';
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
  snprintf(c->last_error, sizeof c->last_error,
           "tide_compressor_compress: tensor \"%s\" element %zu (flat index %zu) of gradient + "
           "residual is %s (gradient %g, residual %g); the residual is unchanged, skip this step",
           t->name, flat - t->offset, flat, tide__nonfinite_name(c->acc[flat]),
           (double)grad[flat], (double)c->residual[flat]);
  TIDE_ERROR("%s", c->last_error);
  return TIDE_EINVAL;
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
