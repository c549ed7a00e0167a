/* Optimizers on a flat float32 buffer: SGD (plain, momentum, Nesterov),
 * Adam, AdamW as torch.optim computes them, and the per-tensor LARS and LAMB.
 * Elementwise math is float in plain loops the compiler vectorises; the
 * per-tensor norms of LARS and LAMB are accumulated in double, because a
 * float sum over millions of squares loses the digits the trust ratio needs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"

/* Header of the state blob: kind and size identify what the buffers are. */
#define STATE_MAGIC 0x504f4454u /* "TDOP" in little-endian bytes */
#define STATE_VERSION 1u
typedef struct {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;
  uint32_t nbuffers;
  uint64_t nparams;
  int64_t step;
} state_header_t;

typedef struct {
  size_t offset, count;
  char *name;  /* NULL when the caller gave none */
  size_t index; /* position in the caller's array, for messages */
  int ndim;
  int shape[4];
  int plain; /* exclude_1d matched: no weight decay, no trust ratio */
} tensor_t;

struct tide_optim {
  tide_optim_config_t config;
  size_t nparams;
  tensor_t *tensors; /* sorted by offset */
  size_t ntensors;
  /* The elements this optimizer updates: [offset, offset + count) of the
   * model (0, nparams unless it is a shard), and the tensors that meet
   * them, [first, last). */
  size_t offset, count;
  size_t first, last;
  /* A shard's per-tensor partial norms (2 per tensor) and how they are
   * summed over the shards (LARS, LAMB; sum NULL when not a shard). */
  double *norms;
  int (*sum)(double *values, size_t count, void *arg);
  void *sum_arg;
  int nbuffers; /* float buffers of `count` each in `state` */
  float *state; /* momentum, or first then second moments */
  int64_t step;
};

static const char *const kind_names[TIDE_OPTIM_KIND_COUNT] = {
    "sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"};

TIDE__NAMED_ENUM(optim, tide_optim_kind_t, "optimizer", kind_names, TIDE_OPTIM_KIND_COUNT)

void tide_optim_config_default(tide_optim_kind_t kind, tide_optim_config_t *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  out->kind = kind;
  switch (kind) {
    case TIDE_OPTIM_SGD:
      break;
    case TIDE_OPTIM_MOMENTUM:
    case TIDE_OPTIM_NESTEROV:
      out->momentum = 0.9f;
      break;
    case TIDE_OPTIM_ADAM:
    case TIDE_OPTIM_ADAMW:
      out->beta1 = 0.9f;
      out->beta2 = 0.999f;
      out->eps = 1e-8f;
      out->weight_decay = kind == TIDE_OPTIM_ADAMW ? 0.01f : 0.0f; /* torch's defaults */
      break;
    case TIDE_OPTIM_LARS:
      out->momentum = 0.9f;
      out->eps = 1e-5f; /* MindSpore nn.LARS */
      out->trust_coef = 0.001f;
      out->exclude_1d = 1;
      break;
    case TIDE_OPTIM_LAMB:
      out->beta1 = 0.9f;
      out->beta2 = 0.999f;
      out->eps = 1e-6f;
      out->weight_decay = 0.01f;
      out->exclude_1d = 1;
      break;
    default:
      break;
  }
}

/* value in [lo, hi) (hi_open) or [lo, hi]; NaN fails every comparison. */
static int check_range(const char *kind, const char *field, float value, float lo, float hi,
                       int lo_open, int hi_open, const char *why) {
  int ok = (lo_open ? value > lo : value >= lo) && (hi_open ? value < hi : value <= hi);
  if (ok) return 0;
  TIDE_ERROR("optimizer %s: %s=%g is outside %s%g, %g%s%s%s", kind, field, (double)value,
             lo_open ? "(" : "[", (double)lo, (double)hi, hi_open ? ")" : "]",
             why != NULL ? ": " : "", why != NULL ? why : "");
  return TIDE_EINVAL;
}

int tide_optim_config_check(const tide_optim_config_t *config) {
  if (config == NULL) return tide__null_arg("tide_optim_config_check", "config");
  if ((unsigned)config->kind >= TIDE_OPTIM_KIND_COUNT) {
    TIDE_ERROR("optimizer kind %d is unknown: use a TIDE_OPTIM_* value", (int)config->kind);
    return TIDE_EINVAL;
  }
  const char *name = kind_names[config->kind];
  tide_optim_kind_t kind = config->kind;
  if (config->exclude_1d != 0 && config->exclude_1d != 1) {
    TIDE_ERROR("optimizer %s: exclude_1d=%d must be 0 or 1", name, config->exclude_1d);
    return TIDE_EINVAL;
  }
  /* Every kind uses weight decay; INFINITY as the bound still rejects inf. */
  TIDE_CHECK(check_range(name, "weight_decay", config->weight_decay, 0.0f, INFINITY, 0, 1, NULL));
  switch (kind) {
    case TIDE_OPTIM_SGD:
      if (config->momentum != 0.0f) {
        TIDE_ERROR("optimizer sgd: momentum=%g has no effect: use TIDE_OPTIM_MOMENTUM or "
                   "TIDE_OPTIM_NESTEROV",
                   (double)config->momentum);
        return TIDE_EINVAL;
      }
      break;
    case TIDE_OPTIM_MOMENTUM:
    case TIDE_OPTIM_LARS:
      TIDE_CHECK(check_range(name, "momentum", config->momentum, 0.0f, 1.0f, 0, 1, NULL));
      break;
    case TIDE_OPTIM_NESTEROV:
      TIDE_CHECK(check_range(name, "momentum", config->momentum, 0.0f, 1.0f, 1, 1,
                             "Nesterov needs a momentum"));
      break;
    default:
      break;
  }
  if (kind == TIDE_OPTIM_ADAM || kind == TIDE_OPTIM_ADAMW || kind == TIDE_OPTIM_LAMB) {
    TIDE_CHECK(check_range(name, "beta1", config->beta1, 0.0f, 1.0f, 0, 1, NULL));
    TIDE_CHECK(check_range(name, "beta2", config->beta2, 0.0f, 1.0f, 0, 1, NULL));
    /* eps 0 would turn a zero gradient into 0/0. */
    TIDE_CHECK(check_range(name, "eps", config->eps, 0.0f, INFINITY, 1, 1, NULL));
  }
  if (kind == TIDE_OPTIM_LARS) {
    TIDE_CHECK(check_range(name, "eps", config->eps, 0.0f, INFINITY, 0, 1, NULL));
    TIDE_CHECK(check_range(name, "trust_coef", config->trust_coef, 0.0f, INFINITY, 1, 1, NULL));
  }
  return 0;
}

static int state_buffers(tide_optim_kind_t kind) {
  switch (kind) {
    case TIDE_OPTIM_SGD:
      return 0;
    case TIDE_OPTIM_MOMENTUM:
    case TIDE_OPTIM_NESTEROV:
    case TIDE_OPTIM_LARS:
      return 1;
    default:
      return 2;
  }
}

/* Biases and norm scales: 1-D by shape, or named as a bias whatever their
 * shape (some frameworks store a bias as 1xN). */
static int is_bias_or_1d(const tide_tensor_t *t) {
  if (t->ndim <= 1) return 1;
  if (t->name == NULL) return 0;
  size_t len = strlen(t->name);
  return len >= 4 && strcmp(t->name + len - 4, "bias") == 0;
}

static void free_tensors(tensor_t *tensors, size_t n) {
  if (tensors == NULL) return;
  for (size_t i = 0; i < n; i++) tide__free(tensors[i].name);
  tide__free(tensors);
}

/* Checks the tensors (tide__tensors_check) and copies them in offset order. */
static int copy_tensors(const tide_optim_config_t *config, const tide_tensor_t *tensors,
                        size_t ntensors, size_t nparams, tensor_t **out, size_t *count_out) {
  static const tide_tensor_t whole = {"params", 0, 0, 2, {0, 0, 0, 0}};
  size_t n = ntensors > 0 ? ntensors : 1;
  tensor_t *copy = tide__calloc(n, sizeof *copy);
  size_t *order = tide__calloc(n, sizeof *order);
  if (copy == NULL || order == NULL) {
    TIDE_ERROR("tide_optim_create: out of memory copying %zu tensors", n);
    tide__free(copy);
    tide__free(order);
    return TIDE_ENOMEM;
  }
  int rc = 0;
  TIDE_CHECK_GOTO(tide__tensors_check("tide_optim_create", tensors, ntensors, nparams, order), rc, fail);
  for (size_t j = 0; j < n; j++) {
    size_t i = order[j];
    const tide_tensor_t *t = ntensors > 0 ? &tensors[i] : &whole;
    copy[j].offset = t->offset;
    copy[j].count = ntensors > 0 ? t->count : nparams;
    copy[j].index = i;
    copy[j].ndim = t->ndim;
    memcpy(copy[j].shape, t->shape, sizeof copy[j].shape);
    copy[j].plain = config->exclude_1d && is_bias_or_1d(t);
    if (t->name != NULL) {
      copy[j].name = tide__strdup(t->name);
      if (copy[j].name == NULL) {
        TIDE_ERROR("tide_optim_create: out of memory copying tensor names");
        rc = TIDE_ENOMEM;
        goto fail;
      }
    }
  }
  tide__free(order);
  *out = copy;
  *count_out = n;
  return 0;
fail:
  tide__free(order);
  free_tensors(copy, n);
  return rc;
}

static int create(const char *fn, const tide_optim_config_t *config, const tide_tensor_t *tensors, size_t ntensors,
                  size_t nparams, const tide_optim_shard_t *shard, tide_optim_t **out) {
  if (out == NULL) return tide__null_arg(fn, "out");
  TIDE_CHECK(tide_optim_config_check(config));
  if (nparams == 0) {
    TIDE_ERROR("%s: nparams is 0: there is nothing to optimize", fn);
    return TIDE_EINVAL;
  }
  if (ntensors > 0 && tensors == NULL) {
    TIDE_ERROR("%s: tensors is NULL but ntensors=%zu", fn, ntensors);
    return TIDE_EINVAL;
  }
  size_t offset = 0, count = nparams;
  if (shard != NULL) {
    offset = shard->offset, count = shard->count;
    if (offset > nparams || count > nparams - offset) {
      TIDE_ERROR("%s: shard [%zu, %zu + %zu) lies outside the %zu parameters", fn, offset, offset, count, nparams);
      return TIDE_EINVAL;
    }
    int layerwise = config->kind == TIDE_OPTIM_LARS || config->kind == TIDE_OPTIM_LAMB;
    if (layerwise && count < nparams && shard->sum == NULL) {
      TIDE_ERROR("%s: shard.sum is NULL: %s needs each tensor's norm over all shards (give a sum over the ranks, "
                 "e.g. an allreduce of doubles)", fn, kind_names[config->kind]);
      return TIDE_EINVAL;
    }
  }
  int nbuffers = state_buffers(config->kind);
  if (nbuffers > 0 && nparams > SIZE_MAX / sizeof(float) / (size_t)nbuffers) {
    TIDE_ERROR("%s: nparams=%zu is too large for the optimizer state", fn, nparams);
    return TIDE_EINVAL;
  }
  int rc = 0;
  tide_optim_t *opt = tide__calloc(1, sizeof *opt);
  if (opt == NULL) {
    TIDE_ERROR("%s: out of memory", fn);
    return TIDE_ENOMEM;
  }
  opt->config = *config;
  opt->nparams = nparams;
  opt->nbuffers = nbuffers;
  opt->offset = offset;
  opt->count = count;
  TIDE_CHECK_GOTO(copy_tensors(config, tensors, ntensors, nparams, &opt->tensors, &opt->ntensors),
                  rc, fail);
  opt->first = opt->ntensors, opt->last = 0;
  for (size_t k = 0; k < opt->ntensors; k++) {
    const tensor_t *t = &opt->tensors[k];
    if (t->offset < offset + count && t->offset + t->count > offset) {
      if (opt->first > k) opt->first = k;
      opt->last = k + 1;
    }
  }
  if (opt->first > opt->last) opt->first = opt->last;
  if (shard != NULL && count < nparams && shard->sum != NULL) {
    opt->sum = shard->sum;
    opt->sum_arg = shard->arg;
    opt->norms = tide__calloc(2 * opt->ntensors, sizeof *opt->norms);
    if (opt->norms == NULL) {
      rc = TIDE_ENOMEM;
      goto fail;
    }
  }
  if (nbuffers > 0) {
    opt->state = tide__calloc((size_t)nbuffers * (count ? count : 1), sizeof(float));
    if (opt->state == NULL) {
      TIDE_ERROR("%s: cannot allocate %zu bytes of %s state", fn, (size_t)nbuffers * count * sizeof(float),
                 kind_names[config->kind]);
      rc = TIDE_ENOMEM;
      goto fail;
    }
  }
  *out = opt;
  return 0;
fail:
  tide_optim_destroy(opt);
  return rc;
}

int tide_optim_create(const tide_optim_config_t *config, const tide_tensor_t *tensors,
                      size_t ntensors, size_t nparams, tide_optim_t **out) {
  return create("tide_optim_create", config, tensors, ntensors, nparams, NULL, out);
}

int tide_optim_create_shard(const tide_optim_config_t *config, const tide_tensor_t *tensors, size_t ntensors,
                            size_t nparams, const tide_optim_shard_t *shard, tide_optim_t **out) {
  if (shard == NULL) {
    TIDE_ERROR("tide_optim_create_shard: shard is NULL (tide_optim_create makes an optimizer of the whole model)");
    return TIDE_EINVAL;
  }
  return create("tide_optim_create_shard", config, tensors, ntensors, nparams, shard, out);
}

void tide_optim_destroy(tide_optim_t *opt) {
  if (opt == NULL) return;
  free_tensors(opt->tensors, opt->ntensors);
  tide__free(opt->norms);
  tide__free(opt->state);
  tide__free(opt);
}

int64_t tide_optim_step_count(const tide_optim_t *opt) { return opt != NULL ? opt->step : 0; }

/* ---- kernels: one tensor each, float math, no branches in the loops ---- */

/* Double sums run in LANES independent partial sums: the compiler may then
 * vectorise them without reassociating, and the order (so the result) is
 * fixed, the same on every rank. */
#define LANES 8

static double sum_squares(const float *x, size_t n) {
  double acc[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (size_t k = 0; k < LANES; k++) acc[k] += (double)x[i + k] * x[i + k];
  double s = 0;
  for (; i < n; i++) s += (double)x[i] * x[i];
  for (size_t k = 0; k < LANES; k++) s += acc[k];
  return s;
}

/* torch SGD: d = g + wd*w; buf = mu*buf + d; d = nesterov ? d + mu*buf : buf. */
static void sgd_kernel(float *restrict w, const float *restrict g, size_t n, float lr, float wd) {
  for (size_t i = 0; i < n; i++) w[i] -= lr * (g[i] + wd * w[i]);
}

static void momentum_kernel(float *restrict w, const float *restrict g, float *restrict buf,
                            size_t n, float lr, float wd, float mu) {
  for (size_t i = 0; i < n; i++) {
    float d = g[i] + wd * w[i];
    buf[i] = mu * buf[i] + d;
    w[i] -= lr * buf[i];
  }
}

static void nesterov_kernel(float *restrict w, const float *restrict g, float *restrict buf,
                            size_t n, float lr, float wd, float mu) {
  for (size_t i = 0; i < n; i++) {
    float d = g[i] + wd * w[i];
    buf[i] = mu * buf[i] + d;
    w[i] -= lr * (d + mu * buf[i]);
  }
}

/* torch Adam/AdamW: l2 is added to the gradient (Adam), keep = 1 - lr*wd
 * scales w first (AdamW). With step_size = lr/(1 - b1^t) and sqrt_bc2 =
 * sqrt(1 - b2^t) this is lr * m_hat/(sqrt(v_hat)+eps), in torch's order. */
static void adam_kernel(float *restrict w, const float *restrict g, float *restrict m,
                        float *restrict v, size_t n, float b1, float b2, float eps, float l2,
                        float keep, float step_size, float sqrt_bc2) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] + l2 * w[i];
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    w[i] = w[i] * keep - step_size * (m[i] / (sqrtf(v[i]) / sqrt_bc2 + eps));
  }
}

/* LAMB's direction u = m_hat/(sqrt(v_hat)+eps) + wd*w. The first pass
 * updates the moments and returns |u|^2; the second recomputes u with the
 * same expression (same bits), so no scratch buffer is needed. */
static inline float lamb_direction(float m, float v, float w, float inv_bc1, float sqrt_bc2,
                                   float eps, float wd) {
  return (m * inv_bc1) / (sqrtf(v) / sqrt_bc2 + eps) + wd * w;
}

static double lamb_moments(const float *restrict w, const float *restrict g, float *restrict m,
                           float *restrict v, size_t n, float b1, float b2, float eps, float wd,
                           float inv_bc1, float sqrt_bc2) {
  double acc[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    for (size_t k = 0; k < LANES; k++) {
      size_t j = i + k;
      m[j] = b1 * m[j] + (1.0f - b1) * g[j];
      v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
      float u = lamb_direction(m[j], v[j], w[j], inv_bc1, sqrt_bc2, eps, wd);
      acc[k] += (double)u * u;
    }
  }
  double s = 0;
  for (; i < n; i++) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    float u = lamb_direction(m[i], v[i], w[i], inv_bc1, sqrt_bc2, eps, wd);
    s += (double)u * u;
  }
  for (size_t k = 0; k < LANES; k++) s += acc[k];
  return s;
}

static void lamb_apply(float *restrict w, const float *restrict m, const float *restrict v,
                       size_t n, float eps, float wd, float inv_bc1, float sqrt_bc2, float scale) {
  for (size_t i = 0; i < n; i++)
    w[i] -= scale * lamb_direction(m[i], v[i], w[i], inv_bc1, sqrt_bc2, eps, wd);
}

/* LARS (paper form): v = mu*v + lr*local_lr*(g + beta*w); w -= v. */
static void lars_kernel(float *restrict w, const float *restrict g, float *restrict buf, size_t n,
                        float scale, float wd, float mu) {
  for (size_t i = 0; i < n; i++) {
    buf[i] = mu * buf[i] + scale * (g[i] + wd * w[i]);
    w[i] -= buf[i];
  }
}

/* ---- one step ---- */

/* Tensor k's piece of the elements this optimizer updates: returns its
 * length, *at its start in the caller's buffers (which hold just those
 * elements). */
static size_t piece(const tide_optim_t *opt, size_t k, size_t *at) {
  const tensor_t *t = &opt->tensors[k];
  size_t lo = t->offset > opt->offset ? t->offset : opt->offset;
  size_t end = t->offset + t->count, shard_end = opt->offset + opt->count;
  size_t hi = end < shard_end ? end : shard_end;
  *at = lo - opt->offset;
  return hi > lo ? hi - lo : 0;
}

/* LARS's squared norms of tensor k's piece: out[0] = |w|^2, out[1] = |g|^2
 * (0 for an excluded tensor). */
static void lars_norms(const tide_optim_t *opt, size_t k, const float *params, const float *grads, double *out) {
  size_t at, n = piece(opt, k, &at);
  out[0] = out[1] = 0;
  if (n == 0 || opt->tensors[k].plain) return;
  out[0] = sum_squares(params + at, n);
  out[1] = sum_squares(grads + at, n);
}

static void lars_update(tide_optim_t *opt, size_t k, float *params, const float *grads, float lr,
                        const double *norms) {
  const tide_optim_config_t *c = &opt->config;
  const tensor_t *t = &opt->tensors[k];
  size_t at, n = piece(opt, k, &at);
  if (n == 0) return;
  double local_lr = 1.0;
  float wd = t->plain ? 0.0f : c->weight_decay;
  if (!t->plain) {
    double w_norm = sqrt(norms[0]), g_norm = sqrt(norms[1]);
    double denom = g_norm + (double)wd * w_norm;
    /* Ratio 1 when either norm is 0: a zero layer must still be able to
     * move, and a zero update must not divide by zero. */
    if (w_norm > 0 && denom > 0) local_lr = (double)c->trust_coef * w_norm / (denom + (double)c->eps);
  }
  lars_kernel(params + at, grads + at, opt->state + at, n, (float)((double)lr * local_lr), wd, c->momentum);
}

/* LAMB: updates the moments of tensor k's piece; out[0] = |u|^2, out[1] =
 * |w|^2 (0 for an excluded tensor). */
static void lamb_norms(tide_optim_t *opt, size_t k, const float *params, const float *grads, float inv_bc1,
                       float sqrt_bc2, double *out) {
  const tide_optim_config_t *c = &opt->config;
  const tensor_t *t = &opt->tensors[k];
  size_t at, n = piece(opt, k, &at);
  out[0] = out[1] = 0;
  if (n == 0) return;
  float wd = t->plain ? 0.0f : c->weight_decay;
  out[0] = lamb_moments(params + at, grads + at, opt->state + at, opt->state + opt->count + at, n, c->beta1,
                        c->beta2, c->eps, wd, inv_bc1, sqrt_bc2);
  if (!t->plain) out[1] = sum_squares(params + at, n);
}

static void lamb_update(tide_optim_t *opt, size_t k, float *params, float lr, float inv_bc1, float sqrt_bc2,
                        const double *norms) {
  const tide_optim_config_t *c = &opt->config;
  const tensor_t *t = &opt->tensors[k];
  size_t at, n = piece(opt, k, &at);
  if (n == 0) return;
  float wd = t->plain ? 0.0f : c->weight_decay;
  double u_norm = sqrt(norms[0]), trust = 1.0;
  if (!t->plain) {
    double w_norm = sqrt(norms[1]);
    if (w_norm > 0 && u_norm > 0) trust = w_norm / u_norm;
  }
  lamb_apply(params + at, opt->state + at, opt->state + opt->count + at, n, c->eps, wd, inv_bc1, sqrt_bc2,
             (float)((double)lr * trust));
}

/* LARS and LAMB need each tensor's norms before its update. The whole
 * model's optimizer takes them tensor by tensor (the tensor is still in
 * cache); a shard takes its partial norms of every tensor, has them summed
 * over the shards in one call, then updates. */
static int step_layerwise(tide_optim_t *opt, float *params, const float *grads, float lr) {
  const tide_optim_config_t *c = &opt->config;
  double t = (double)opt->step;
  float inv_bc1 = (float)(1.0 / (1.0 - pow((double)c->beta1, t)));
  float sqrt_bc2 = (float)sqrt(1.0 - pow((double)c->beta2, t));
  int lars = c->kind == TIDE_OPTIM_LARS;
  if (opt->sum == NULL) {
    for (size_t k = opt->first; k < opt->last; k++) {
      double norms[2];
      if (lars) {
        lars_norms(opt, k, params, grads, norms);
        lars_update(opt, k, params, grads, lr, norms);
      } else {
        lamb_norms(opt, k, params, grads, inv_bc1, sqrt_bc2, norms);
        lamb_update(opt, k, params, lr, inv_bc1, sqrt_bc2, norms);
      }
    }
    return 0;
  }
  for (size_t k = 0; k < opt->ntensors; k++) {
    if (lars)
      lars_norms(opt, k, params, grads, opt->norms + 2 * k);
    else
      lamb_norms(opt, k, params, grads, inv_bc1, sqrt_bc2, opt->norms + 2 * k);
  }
  int rc = opt->sum(opt->norms, 2 * opt->ntensors, opt->sum_arg);
  if (rc != 0) {
    TIDE_ERROR("tide_optim_step: summing the %s norms over the shards failed (%s): the shard's state is part "
               "updated; restore it from a saved state", kind_names[c->kind], tide_strerror(rc));
    return rc;
  }
  for (size_t k = opt->first; k < opt->last; k++) {
    if (lars)
      lars_update(opt, k, params, grads, lr, opt->norms + 2 * k);
    else
      lamb_update(opt, k, params, lr, inv_bc1, sqrt_bc2, opt->norms + 2 * k);
  }
  return 0;
}

int tide_optim_step(tide_optim_t *opt, float *params, const float *grads, float lr) {
  if (opt == NULL || params == NULL || grads == NULL) {
    TIDE_ERROR("tide_optim_step: opt, params and grads must not be NULL");
    return TIDE_EINVAL;
  }
  if (!(lr >= 0.0f && lr < INFINITY)) {
    TIDE_ERROR("tide_optim_step: lr=%g must be finite and >= 0", (double)lr);
    return TIDE_EINVAL;
  }
  const tide_optim_config_t *c = &opt->config;
  opt->step++;
  if (c->kind == TIDE_OPTIM_LARS || c->kind == TIDE_OPTIM_LAMB) return step_layerwise(opt, params, grads, lr);
  /* torch computes the bias corrections in double and the step in float. */
  double t = (double)opt->step;
  float step_size = (float)((double)lr / (1.0 - pow((double)c->beta1, t)));
  float sqrt_bc2 = (float)sqrt(1.0 - pow((double)c->beta2, t));
  for (size_t k = opt->first; k < opt->last; k++) {
    const tensor_t *x = &opt->tensors[k];
    size_t at, n = piece(opt, k, &at);
    float *w = params + at;
    const float *g = grads + at;
    float *s0 = opt->state != NULL ? opt->state + at : NULL;
    float wd = x->plain ? 0.0f : c->weight_decay;
    switch (c->kind) {
      case TIDE_OPTIM_SGD:
        sgd_kernel(w, g, n, lr, wd);
        break;
      case TIDE_OPTIM_MOMENTUM:
        momentum_kernel(w, g, s0, n, lr, wd, c->momentum);
        break;
      case TIDE_OPTIM_NESTEROV:
        nesterov_kernel(w, g, s0, n, lr, wd, c->momentum);
        break;
      case TIDE_OPTIM_ADAM:
        adam_kernel(w, g, s0, s0 + opt->count, n, c->beta1, c->beta2, c->eps, wd, 1.0f, step_size, sqrt_bc2);
        break;
      case TIDE_OPTIM_ADAMW:
        adam_kernel(w, g, s0, s0 + opt->count, n, c->beta1, c->beta2, c->eps, 0.0f,
                    (float)(1.0 - (double)lr * wd), step_size, sqrt_bc2);
        break;
      default:
        break;
    }
  }
  return 0;
}

/* ---- state ---- */

size_t tide_optim_state_size(const tide_optim_t *opt) {
  if (opt == NULL) return 0;
  return sizeof(state_header_t) + (size_t)opt->nbuffers * opt->nparams * sizeof(float);
}

int tide_optim_state_get(const tide_optim_t *opt, void *buf, size_t len) {
  if (opt == NULL || buf == NULL) {
    TIDE_ERROR("tide_optim_state_get: opt and buf must not be NULL");
    return TIDE_EINVAL;
  }
  size_t need = tide_optim_state_size(opt);
  if (len < need) {
    TIDE_ERROR("tide_optim_state_get: buffer of %zu bytes, the state needs %zu "
               "(tide_optim_state_size)",
               len, need);
    return TIDE_EINVAL;
  }
  state_header_t h = {STATE_MAGIC,       STATE_VERSION, (uint32_t)opt->config.kind,
                      (uint32_t)opt->nbuffers, (uint64_t)opt->nparams, opt->step};
  memcpy(buf, &h, sizeof h);
  /* A shard fills its slice of each buffer and zeroes the rest. */
  char *data = (char *)buf + sizeof h;
  if (opt->count < opt->nparams) memset(data, 0, need - sizeof h);
  for (int b = 0; b < opt->nbuffers; b++)
    if (opt->count > 0)
      memcpy(data + ((size_t)b * opt->nparams + opt->offset) * sizeof(float), opt->state + (size_t)b * opt->count,
             opt->count * sizeof(float));
  return 0;
}

int tide_optim_state_layout(const tide_optim_t *opt, size_t *first, int *nbuffers, size_t *offset, size_t *count) {
  if (opt == NULL) {
    TIDE_ERROR("tide_optim_state_layout: opt must not be NULL");
    return TIDE_EINVAL;
  }
  if (first != NULL) *first = sizeof(state_header_t);
  if (nbuffers != NULL) *nbuffers = opt->nbuffers;
  if (offset != NULL) *offset = opt->offset;
  if (count != NULL) *count = opt->count;
  return 0;
}

int tide_optim_state_set(tide_optim_t *opt, const void *buf, size_t len) {
  if (opt == NULL || buf == NULL) {
    TIDE_ERROR("tide_optim_state_set: opt and buf must not be NULL");
    return TIDE_EINVAL;
  }
  state_header_t h;
  if (len < sizeof h) {
    TIDE_ERROR("tide_optim_state_set: %zu bytes is shorter than a state header", len);
    return TIDE_EINVAL;
  }
  memcpy(&h, buf, sizeof h);
  if (h.magic != STATE_MAGIC || h.version != STATE_VERSION) {
    TIDE_ERROR("tide_optim_state_set: not an optimizer state of this tide version (magic "
               "0x%08x version %u; from another byte order?)",
               h.magic, h.version);
    return TIDE_EINVAL;
  }
  if (h.kind != (uint32_t)opt->config.kind || h.nparams != (uint64_t)opt->nparams ||
      h.nbuffers != (uint32_t)opt->nbuffers) {
    TIDE_ERROR("tide_optim_state_set: the state is for %s over %llu parameters; this optimizer "
               "is %s over %zu",
               h.kind < TIDE_OPTIM_KIND_COUNT ? kind_names[h.kind] : "?",
               (unsigned long long)h.nparams, kind_names[opt->config.kind], opt->nparams);
    return TIDE_EINVAL;
  }
  size_t need = tide_optim_state_size(opt);
  if (len != need || h.step < 0) {
    TIDE_ERROR("tide_optim_state_set: %zu bytes with step %lld; a valid state is %zu bytes "
               "with step >= 0",
               len, (long long)h.step, need);
    return TIDE_EINVAL;
  }
  const char *data = (const char *)buf + sizeof h;
  for (int b = 0; b < opt->nbuffers; b++)
    if (opt->count > 0)
      memcpy(opt->state + (size_t)b * opt->count, data + ((size_t)b * opt->nparams + opt->offset) * sizeof(float),
             opt->count * sizeof(float));
  opt->step = h.step;
  return 0;
}
