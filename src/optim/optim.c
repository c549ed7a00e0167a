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
  int nbuffers; /* float buffers of nparams each in `state` */
  float *state; /* momentum, or first then second moments */
  int64_t step;
};

static const char *const kind_names[TIDE_OPTIM_KIND_COUNT] = {
    "sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"};

const char *tide_optim_name(tide_optim_kind_t kind) {
  if ((unsigned)kind >= TIDE_OPTIM_KIND_COUNT) return "?";
  return kind_names[kind];
}

int tide_optim_parse(const char *name, tide_optim_kind_t *out) {
  if (name == NULL || out == NULL) {
    TIDE_ERROR("tide_optim_parse: name and out must not be NULL");
    return TIDE_EINVAL;
  }
  for (int k = 0; k < TIDE_OPTIM_KIND_COUNT; k++) {
    if (strcasecmp(name, kind_names[k]) == 0) {
      *out = (tide_optim_kind_t)k;
      return 0;
    }
  }
  TIDE_ERROR("unknown optimizer '%s': use sgd, momentum, nesterov, adam, adamw, lars or lamb",
             name);
  return TIDE_EINVAL;
}

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
  if (config == NULL) {
    TIDE_ERROR("optimizer config is NULL");
    return TIDE_EINVAL;
  }
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

static int compare_offset(const void *a, const void *b) {
  const tensor_t *x = a, *y = b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

static const char *tensor_label(const tensor_t *t, char *buf, size_t cap) {
  if (t->name != NULL) snprintf(buf, cap, "'%s' (tensors[%zu])", t->name, t->index);
  else snprintf(buf, cap, "tensors[%zu]", t->index);
  return buf;
}

static void free_tensors(tensor_t *tensors, size_t n) {
  if (tensors == NULL) return;
  for (size_t i = 0; i < n; i++) tide__free(tensors[i].name);
  tide__free(tensors);
}

/* Checks each tensor on its own; the tiling is checked after sorting. */
static int check_tensor(const tide_tensor_t *t, size_t index, size_t nparams) {
  char label[160];
  if (t->name != NULL) snprintf(label, sizeof label, "'%s' (tensors[%zu])", t->name, index);
  else snprintf(label, sizeof label, "tensors[%zu]", index);
  if (t->ndim < 0 || t->ndim > 4) {
    TIDE_ERROR("tensor %s: ndim=%d must be 0 to 4", label, t->ndim);
    return TIDE_EINVAL;
  }
  if (t->count == 0) {
    TIDE_ERROR("tensor %s: count is 0: leave empty tensors out", label);
    return TIDE_EINVAL;
  }
  size_t product = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] <= 0) {
      TIDE_ERROR("tensor %s: shape[%d]=%d must be > 0", label, d, t->shape[d]);
      return TIDE_EINVAL;
    }
    if (__builtin_mul_overflow(product, (size_t)t->shape[d], &product)) {
      TIDE_ERROR("tensor %s: its shape holds more than SIZE_MAX elements", label);
      return TIDE_EINVAL;
    }
  }
  if (product != t->count) {
    TIDE_ERROR("tensor %s: count=%zu but its shape holds %zu elements", label, t->count, product);
    return TIDE_EINVAL;
  }
  if (t->offset > nparams || t->count > nparams - t->offset) {
    TIDE_ERROR("tensor %s: offset=%zu count=%zu runs past nparams=%zu", label, t->offset,
               t->count, nparams);
    return TIDE_EINVAL;
  }
  return 0;
}

/* Copies and sorts the tensors and checks that they tile [0, nparams). */
static int copy_tensors(const tide_optim_config_t *config, const tide_tensor_t *tensors,
                        size_t ntensors, size_t nparams, tensor_t **out, size_t *count_out) {
  static const tide_tensor_t whole = {"params", 0, 0, 2, {0, 0, 0, 0}};
  size_t n = ntensors > 0 ? ntensors : 1;
  tensor_t *copy = tide__calloc(n, sizeof *copy);
  if (copy == NULL) {
    TIDE_ERROR("tide_optim_create: out of memory copying %zu tensors", n);
    return TIDE_ENOMEM;
  }
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    const tide_tensor_t *t = ntensors > 0 ? &tensors[i] : &whole;
    if (ntensors > 0) TIDE_CHECK_GOTO(check_tensor(t, i, nparams), rc, fail);
    copy[i].offset = t->offset;
    copy[i].count = ntensors > 0 ? t->count : nparams;
    copy[i].index = i;
    copy[i].ndim = t->ndim;
    memcpy(copy[i].shape, t->shape, sizeof copy[i].shape);
    copy[i].plain = config->exclude_1d && is_bias_or_1d(t);
    if (t->name != NULL) {
      copy[i].name = tide__strdup(t->name);
      if (copy[i].name == NULL) {
        TIDE_ERROR("tide_optim_create: out of memory copying tensor names");
        rc = TIDE_ENOMEM;
        goto fail;
      }
    }
  }
  qsort(copy, n, sizeof *copy, compare_offset);
  size_t end = 0;
  char a[160], b[160];
  for (size_t i = 0; i < n; i++) {
    if (copy[i].offset < end) {
      TIDE_ERROR("tensor %s [%zu, %zu) overlaps tensor %s [%zu, %zu)",
                 tensor_label(&copy[i], a, sizeof a), copy[i].offset,
                 copy[i].offset + copy[i].count, tensor_label(&copy[i - 1], b, sizeof b),
                 copy[i - 1].offset, copy[i - 1].offset + copy[i - 1].count);
      rc = TIDE_EINVAL;
      goto fail;
    }
    if (copy[i].offset > end) {
      TIDE_ERROR("elements [%zu, %zu) belong to no tensor (the next is tensor %s): the tensors "
                 "must tile [0, nparams)",
                 end, copy[i].offset, tensor_label(&copy[i], a, sizeof a));
      rc = TIDE_EINVAL;
      goto fail;
    }
    end = copy[i].offset + copy[i].count;
  }
  if (end != nparams) {
    TIDE_ERROR("the tensors cover [0, %zu) but nparams=%zu: elements [%zu, %zu) belong to no "
               "tensor",
               end, nparams, end, nparams);
    rc = TIDE_EINVAL;
    goto fail;
  }
  *out = copy;
  *count_out = n;
  return 0;
fail:
  free_tensors(copy, n);
  return rc;
}

int tide_optim_create(const tide_optim_config_t *config, const tide_tensor_t *tensors,
                      size_t ntensors, size_t nparams, tide_optim_t **out) {
  if (out == NULL) {
    TIDE_ERROR("tide_optim_create: out is NULL");
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide_optim_config_check(config));
  if (nparams == 0) {
    TIDE_ERROR("tide_optim_create: nparams is 0: there is nothing to optimize");
    return TIDE_EINVAL;
  }
  if (ntensors > 0 && tensors == NULL) {
    TIDE_ERROR("tide_optim_create: tensors is NULL but ntensors=%zu", ntensors);
    return TIDE_EINVAL;
  }
  int nbuffers = state_buffers(config->kind);
  if (nbuffers > 0 && nparams > SIZE_MAX / sizeof(float) / (size_t)nbuffers) {
    TIDE_ERROR("tide_optim_create: nparams=%zu is too large for the optimizer state", nparams);
    return TIDE_EINVAL;
  }
  int rc = 0;
  tide_optim_t *opt = tide__calloc(1, sizeof *opt);
  if (opt == NULL) {
    TIDE_ERROR("tide_optim_create: out of memory");
    return TIDE_ENOMEM;
  }
  opt->config = *config;
  opt->nparams = nparams;
  opt->nbuffers = nbuffers;
  TIDE_CHECK_GOTO(copy_tensors(config, tensors, ntensors, nparams, &opt->tensors, &opt->ntensors),
                  rc, fail);
  if (nbuffers > 0) {
    opt->state = tide__calloc((size_t)nbuffers * nparams, sizeof(float));
    if (opt->state == NULL) {
      TIDE_ERROR("tide_optim_create: cannot allocate %zu bytes of %s state",
                 (size_t)nbuffers * nparams * sizeof(float), kind_names[config->kind]);
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

void tide_optim_destroy(tide_optim_t *opt) {
  if (opt == NULL) return;
  free_tensors(opt->tensors, opt->ntensors);
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

static void step_lars(tide_optim_t *opt, float *params, const float *grads, float lr) {
  const tide_optim_config_t *c = &opt->config;
  for (size_t k = 0; k < opt->ntensors; k++) {
    const tensor_t *t = &opt->tensors[k];
    float *w = params + t->offset;
    const float *g = grads + t->offset;
    float *buf = opt->state + t->offset;
    double local_lr = 1.0;
    float wd = t->plain ? 0.0f : c->weight_decay;
    if (!t->plain) {
      double w_norm = sqrt(sum_squares(w, t->count));
      double g_norm = sqrt(sum_squares(g, t->count));
      double denom = g_norm + (double)wd * w_norm;
      /* Ratio 1 when either norm is 0: a zero layer must still be able to
       * move, and a zero update must not divide by zero. */
      if (w_norm > 0 && denom > 0)
        local_lr = (double)c->trust_coef * w_norm / (denom + (double)c->eps);
    }
    lars_kernel(w, g, buf, t->count, (float)((double)lr * local_lr), wd, c->momentum);
  }
}

static void step_lamb(tide_optim_t *opt, float *params, const float *grads, float lr) {
  const tide_optim_config_t *c = &opt->config;
  double t = (double)opt->step;
  float inv_bc1 = (float)(1.0 / (1.0 - pow((double)c->beta1, t)));
  float sqrt_bc2 = (float)sqrt(1.0 - pow((double)c->beta2, t));
  for (size_t k = 0; k < opt->ntensors; k++) {
    const tensor_t *x = &opt->tensors[k];
    float *w = params + x->offset;
    const float *g = grads + x->offset;
    float *m = opt->state + x->offset;
    float *v = opt->state + opt->nparams + x->offset;
    float wd = x->plain ? 0.0f : c->weight_decay;
    double u_norm = sqrt(lamb_moments(w, g, m, v, x->count, c->beta1, c->beta2, c->eps, wd,
                                      inv_bc1, sqrt_bc2));
    double trust = 1.0;
    if (!x->plain) {
      double w_norm = sqrt(sum_squares(w, x->count));
      if (w_norm > 0 && u_norm > 0) trust = w_norm / u_norm;
    }
    lamb_apply(w, m, v, x->count, c->eps, wd, inv_bc1, sqrt_bc2, (float)((double)lr * trust));
  }
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
  switch (c->kind) {
    case TIDE_OPTIM_LARS:
      step_lars(opt, params, grads, lr);
      return 0;
    case TIDE_OPTIM_LAMB:
      step_lamb(opt, params, grads, lr);
      return 0;
    default:
      break;
  }
  /* torch computes the bias corrections in double and the step in float. */
  double t = (double)opt->step;
  float step_size = (float)((double)lr / (1.0 - pow((double)c->beta1, t)));
  float sqrt_bc2 = (float)sqrt(1.0 - pow((double)c->beta2, t));
  for (size_t k = 0; k < opt->ntensors; k++) {
    const tensor_t *x = &opt->tensors[k];
    float *w = params + x->offset;
    const float *g = grads + x->offset;
    float *s0 = opt->state != NULL ? opt->state + x->offset : NULL;
    float wd = x->plain ? 0.0f : c->weight_decay;
    switch (c->kind) {
      case TIDE_OPTIM_SGD:
        sgd_kernel(w, g, x->count, lr, wd);
        break;
      case TIDE_OPTIM_MOMENTUM:
        momentum_kernel(w, g, s0, x->count, lr, wd, c->momentum);
        break;
      case TIDE_OPTIM_NESTEROV:
        nesterov_kernel(w, g, s0, x->count, lr, wd, c->momentum);
        break;
      case TIDE_OPTIM_ADAM:
        adam_kernel(w, g, s0, s0 + opt->nparams, x->count, c->beta1, c->beta2, c->eps, wd, 1.0f,
                    step_size, sqrt_bc2);
        break;
      case TIDE_OPTIM_ADAMW:
        adam_kernel(w, g, s0, s0 + opt->nparams, x->count, c->beta1, c->beta2, c->eps, 0.0f,
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
  if (opt->nbuffers > 0)
    memcpy((char *)buf + sizeof h, opt->state, need - sizeof h);
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
  if (opt->nbuffers > 0) memcpy(opt->state, (const char *)buf + sizeof h, need - sizeof h);
  opt->step = h.step;
  return 0;
}
