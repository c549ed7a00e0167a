/* Models: a layer list parsed from the arch string, one arena holding the
 * parameters, gradients and every activation buffer (sized for max_batch),
 * the forward and backward passes over the list, and seeded initialisation. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn/layers.h"
#include "nn/nn.h"

#include <cblas.h>

enum { LAYER_CONV, LAYER_POOL, LAYER_FLATTEN, LAYER_DENSE };
enum { MAX_LAYERS = 32, MAX_BATCH_LIMIT = 1 << 20 };

typedef struct {
  int kind;
  int relu;         /* a ReLU is fused on the output */
  int relu_by_pool; /* ... and the pool after it applies it, forward and backward */
  int pool_masks;   /* pool: applies the ReLU of the layer before it */
  int c, h, w;      /* input per sample; flat inputs are (features, 1, 1) */
  int oc, oh, ow;   /* output per sample */
  nn__conv_t conv;
  size_t w_off, b_off;  /* into params and grads */
  float *y;             /* output buffer, NULL for a flatten that aliases */
  const float *in, *out; /* of the last forward pass */
  uint8_t *arg;         /* pool: winner per window */
} layer_t;

struct nn_model {
  char *arch;
  int max_batch;
  int nlayers;
  int first_param; /* no input gradient is needed at or below this layer */
  layer_t layers[MAX_LAYERS];
  size_t nparams;
  float *params, *grads;
  float *dbuf[2]; /* gradient ping-pong, each as large as the largest activation */
  float *scratch; /* the convolutions' im2col chunks */
  size_t ntensors;
  tide_tensor_t tensors[2 * MAX_LAYERS];
  char names[2 * MAX_LAYERS][24];
  void *arena;
  nn_kfac_cb kfac_fn; /* NULL: no K-FAC hook */
  void *kfac_ctx;
  int64_t *timing; /* nn_profile: ns per layer, forward [0, n) and backward [n, 2n); NULL: off */
  int timing_cpu;  /* ... read from the process's CPU clock rather than the wall clock */
};

static const struct {
  const char *name, *layers;
} known_archs[] = {
    {"mlp", "flatten,dense:256,relu,dense:128,relu,dense:10"},
    {"cnn", "conv:32:3:1,relu,pool,conv:64:3:1,relu,pool,flatten,dense:128,relu,dense:10"},
};

#define ARCH_HELP                                                                           \
  "use \"mlp\", \"cnn\" or a layer list such as \"conv:8:3:1,relu,pool,flatten,dense:10\" " \
  "(conv:C:K:P, pool, relu, flatten, dense:N; relu only after conv or dense; flatten "      \
  "before the first dense; the last layer dense:10)"

/* ---- seeded random numbers: splitmix64 seeds xoshiro256** ---------------------- */

typedef struct {
  uint64_t s[4];
} rng_t;

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng_t *r) {
  uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* Uniform in [-bound, bound): 24 random bits, exact in float. */
static float rng_uniform(rng_t *r, float bound) {
  float u = (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * bound;
}

/* ---- building ----------------------------------------------------------------------- */

static int parse_int(const char **p, int lo, int hi, int *out) {
  char *end;
  long v = strtol(*p, &end, 10);
  if (end == *p || v < lo || v > hi) return -1;
  *p = end;
  *out = (int)v;
  return 0;
}

static int bad_arch(const char *arch, const char *why) {
  tide_log_error("nn_model_create: arch \"%s\": %s; %s", arch, why, ARCH_HELP);
  return TIDE_EINVAL;
}

/* Fills m->layers from the layer list, checking that shapes chain. */
static int parse_layers(nn_model_t *m, const char *arch, const char *list) {
  int c = 1, h = NN_IMAGE_SIDE, w = NN_IMAGE_SIDE, flat = 0;
  char why[160];
  const char *p = list;
  m->nlayers = 0;
  while (*p != '\0') {
    layer_t *prev = m->nlayers > 0 ? &m->layers[m->nlayers - 1] : NULL;
    if (strncmp(p, "relu", 4) == 0 && (p[4] == ',' || p[4] == '\0')) {
      if (prev == NULL || (prev->kind != LAYER_CONV && prev->kind != LAYER_DENSE) || prev->relu)
        return bad_arch(arch, "relu must come right after a conv or dense layer");
      prev->relu = 1;
      p += 4;
    } else {
      if (m->nlayers == MAX_LAYERS) return bad_arch(arch, "too many layers (at most 32)");
      layer_t *l = &m->layers[m->nlayers++];
      memset(l, 0, sizeof *l);
      l->c = c, l->h = h, l->w = w;
      if (strncmp(p, "conv:", 5) == 0) {
        p += 5;
        int k, pad;
        if (flat) return bad_arch(arch, "conv after flatten");
        if (parse_int(&p, 1, 4096, &l->oc) != 0 || *p++ != ':' || parse_int(&p, 1, 15, &k) != 0 ||
            *p++ != ':' || parse_int(&p, 0, 7, &pad) != 0)
          return bad_arch(arch, "conv takes conv:C:K:P with 1 <= C <= 4096, 1 <= K <= 15, 0 <= P <= 7");
        l->kind = LAYER_CONV;
        l->oh = h + 2 * pad - k + 1;
        l->ow = w + 2 * pad - k + 1;
        if (l->oh < 1 || l->ow < 1) {
          snprintf(why, sizeof why, "a %dx%d kernel with padding %d does not fit a %dx%d input", k, k, pad, h, w);
          return bad_arch(arch, why);
        }
        l->conv = (nn__conv_t){.cin = c, .cout = l->oc, .k = k, .pad = pad, .h = h, .w = w, .oh = l->oh, .ow = l->ow};
      } else if (strncmp(p, "pool", 4) == 0) {
        p += 4;
        if (flat) return bad_arch(arch, "pool after flatten");
        if (h < 2 || w < 2) return bad_arch(arch, "pool needs an input of at least 2x2");
        l->kind = LAYER_POOL;
        l->oc = c, l->oh = h / 2, l->ow = w / 2;
        if (prev != NULL && prev->relu) prev->relu_by_pool = l->pool_masks = 1;
      } else if (strncmp(p, "flatten", 7) == 0) {
        p += 7;
        if (flat) return bad_arch(arch, "flatten twice");
        l->kind = LAYER_FLATTEN;
        l->oc = c * h * w, l->oh = l->ow = 1;
        flat = 1;
      } else if (strncmp(p, "dense:", 6) == 0) {
        p += 6;
        if (!flat) return bad_arch(arch, "dense needs flatten before it");
        if (parse_int(&p, 1, 1 << 20, &l->oc) != 0) return bad_arch(arch, "dense takes dense:N with 1 <= N <= 1048576");
        l->kind = LAYER_DENSE;
        l->oh = l->ow = 1;
      } else {
        snprintf(why, sizeof why, "unknown layer \"%.*s\"", (int)strcspn(p, ","), p);
        return bad_arch(arch, why);
      }
      c = l->oc, h = l->oh, w = l->ow;
    }
    if (*p == ',') {
      p++;
      if (*p == '\0') return bad_arch(arch, "trailing comma");
    } else if (*p != '\0') {
      return bad_arch(arch, "layers are separated by commas");
    }
  }
  layer_t *last = m->nlayers > 0 ? &m->layers[m->nlayers - 1] : NULL;
  if (last == NULL || last->kind != LAYER_DENSE || last->oc != NN_CLASSES || last->relu)
    return bad_arch(arch, "the last layer must be dense:10 without relu (it gives the logits)");
  return 0;
}

static size_t layer_out_size(const layer_t *l) { return (size_t)l->oc * l->oh * l->ow; }

/* 64-byte aligned offsets into the arena. */
static size_t carve(size_t *cursor, size_t bytes) {
  size_t at = *cursor;
  *cursor += (bytes + 63) & ~(size_t)63;
  return at;
}

static void name_tensors(nn_model_t *m) {
  int convs = 0, denses = 0;
  m->ntensors = 0;
  for (int i = 0; i < m->nlayers; i++) {
    layer_t *l = &m->layers[i];
    if (l->kind != LAYER_CONV && l->kind != LAYER_DENSE) continue;
    const char *stem = l->kind == LAYER_CONV ? "conv" : "fc";
    int index = l->kind == LAYER_CONV ? ++convs : ++denses;
    size_t wt = m->ntensors, bt = m->ntensors + 1;
    tide_tensor_t *tw = &m->tensors[wt], *tb = &m->tensors[bt];
    snprintf(m->names[wt], sizeof m->names[wt], "%s%d.weight", stem, index);
    snprintf(m->names[bt], sizeof m->names[bt], "%s%d.bias", stem, index);
    memset(tw, 0, sizeof *tw);
    memset(tb, 0, sizeof *tb);
    tw->name = m->names[wt];
    tb->name = m->names[bt];
    tw->offset = l->w_off;
    tb->offset = l->b_off;
    tb->count = (size_t)l->oc;
    tb->ndim = 1;
    tb->shape[0] = l->oc;
    tw->shape[0] = l->oc;
    tw->shape[1] = l->c;
    if (l->kind == LAYER_CONV) {
      tw->ndim = 4;
      tw->shape[2] = tw->shape[3] = l->conv.k;
      tw->count = (size_t)l->oc * l->c * l->conv.k * l->conv.k;
    } else {
      tw->ndim = 2;
      tw->count = (size_t)l->oc * l->c;
    }
    m->ntensors += 2;
  }
}

/* PyTorch's default for Linear and Conv2d: weights and biases uniform in
 * +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5)), drawn in buffer order
 * from one xoshiro256** stream seeded through splitmix64. */
static void init_params(nn_model_t *m, uint64_t seed) {
  rng_t rng;
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) rng.s[i] = splitmix64(&x);
  for (size_t t = 0; t < m->ntensors; t += 2) {
    const tide_tensor_t *tw = &m->tensors[t], *tb = &m->tensors[t + 1];
    size_t fan_in = tw->count / (size_t)tw->shape[0];
    float bound = (float)(1.0 / sqrt((double)fan_in));
    for (size_t i = 0; i < tw->count; i++) m->params[tw->offset + i] = rng_uniform(&rng, bound);
    for (size_t i = 0; i < tb->count; i++) m->params[tb->offset + i] = rng_uniform(&rng, bound);
  }
}

int nn_model_create(const char *arch, int max_batch, uint64_t seed, nn_model_t **out) {
  if (arch == NULL || out == NULL) {
    tide_log_error("nn_model_create: %s must not be NULL", arch == NULL ? "arch" : "out");
    return TIDE_EINVAL;
  }
  if (max_batch < 1 || max_batch > MAX_BATCH_LIMIT) {
    tide_log_error("nn_model_create: max_batch %d must be in [1, %d]", max_batch, MAX_BATCH_LIMIT);
    return TIDE_EINVAL;
  }
  const char *list = NULL;
  for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++)
    if (strcmp(arch, known_archs[i].name) == 0) list = known_archs[i].layers;
  if (list == NULL) {
    if (strchr(arch, ':') == NULL && strchr(arch, ',') == NULL) return bad_arch(arch, "unknown model name");
    list = arch;
  }
  nn_model_t *m = tide_calloc(1, sizeof *m);
  if (m == NULL) return TIDE_ENOMEM;
  int rc = parse_layers(m, arch, list);
  if (rc != 0) {
    tide_free(m);
    return rc;
  }
  m->max_batch = max_batch;

  /* Lay out the arena: parameters, then gradients, then per-layer buffers. */
  size_t nparams = 0, biggest = NN_IMAGE_SIZE, bytes = 0;
  m->first_param = -1;
  for (int i = 0; i < m->nlayers; i++) {
    layer_t *l = &m->layers[i];
    if (l->kind == LAYER_CONV || l->kind == LAYER_DENSE) {
      size_t kk = l->kind == LAYER_CONV ? (size_t)l->conv.k * l->conv.k : 1;
      l->w_off = nparams;
      nparams += (size_t)l->oc * l->c * kk;
      l->b_off = nparams;
      nparams += (size_t)l->oc;
      if (m->first_param < 0) m->first_param = i;
    }
    if (layer_out_size(l) > biggest) biggest = layer_out_size(l);
  }
  /* Every activation, im2col chunk and BLAS dimension must fit an int. */
  size_t scratch = 0;
  for (int i = 0; i < m->nlayers; i++) {
    const layer_t *l = &m->layers[i];
    size_t col = l->kind == LAYER_CONV ? nn__conv_scratch_size(&l->conv, max_batch) : 0;
    if (col > scratch) scratch = col;
    if (layer_out_size(l) * (size_t)max_batch > INT_MAX || col > INT_MAX || nparams > INT_MAX) {
      tide_log_error("nn_model_create: arch \"%s\" with max_batch %d needs buffers over 2^31 floats; "
                     "use a smaller max_batch", arch, max_batch);
      tide_free(m);
      return TIDE_EINVAL;
    }
  }
  m->nparams = nparams;
  size_t params_at = carve(&bytes, nparams * sizeof(float));
  size_t grads_at = carve(&bytes, nparams * sizeof(float));
  size_t dbuf_at[2] = {carve(&bytes, biggest * max_batch * sizeof(float)),
                       carve(&bytes, biggest * max_batch * sizeof(float))};
  size_t scratch_at = carve(&bytes, scratch * sizeof(float));
  size_t y_at[MAX_LAYERS] = {0}, arg_at[MAX_LAYERS] = {0};
  for (int i = 0; i < m->nlayers; i++) {
    layer_t *l = &m->layers[i];
    if (!(l->kind == LAYER_FLATTEN && l->c == 1))
      y_at[i] = carve(&bytes, layer_out_size(l) * max_batch * sizeof(float));
    if (l->kind == LAYER_POOL) arg_at[i] = carve(&bytes, layer_out_size(l) * max_batch);
  }
  size_t list_len = strlen(list) + 1;
  m->arch = tide_malloc(list_len);
  /* 63 spare bytes to align the start. */
  m->arena = tide_malloc(bytes + 63);
  if (m->arch == NULL || m->arena == NULL) {
    tide_free(m->arch);
    tide_free(m->arena);
    tide_free(m);
    tide_log_error("nn_model_create: cannot allocate %zu bytes for arch \"%s\" with max_batch %d", bytes, arch,
                   max_batch);
    return TIDE_ENOMEM;
  }
  memcpy(m->arch, list, list_len);
  char *base = (char *)(((uintptr_t)m->arena + 63) & ~(uintptr_t)63);
  m->params = (float *)(base + params_at);
  m->grads = (float *)(base + grads_at);
  memset(m->grads, 0, nparams * sizeof(float));
  m->dbuf[0] = (float *)(base + dbuf_at[0]);
  m->dbuf[1] = (float *)(base + dbuf_at[1]);
  m->scratch = (float *)(base + scratch_at);
  for (int i = 0; i < m->nlayers; i++) {
    layer_t *l = &m->layers[i];
    if (!(l->kind == LAYER_FLATTEN && l->c == 1)) l->y = (float *)(base + y_at[i]);
    if (l->kind == LAYER_POOL) l->arg = (uint8_t *)(base + arg_at[i]);
  }
  name_tensors(m);
  init_params(m, seed);
  *out = m;
  return 0;
}

void nn_model_destroy(nn_model_t *m) {
  if (m == NULL) return;
  tide_free(m->arena);
  tide_free(m->arch);
  tide_free(m);
}

const char *nn_model_arch(const nn_model_t *m) { return m->arch; }
int nn_model_max_batch(const nn_model_t *m) { return m->max_batch; }
size_t nn_param_count(const nn_model_t *m) { return m->nparams; }
float *nn_params(nn_model_t *m) { return m->params; }
float *nn_grads(nn_model_t *m) { return m->grads; }

const tide_tensor_t *nn_tensors(const nn_model_t *m, size_t *count) {
  if (count != NULL) *count = m->ntensors;
  return m->tensors;
}

/* ---- passes --------------------------------------------------------------------------- */

/* Runs layer i forward on in (its input, [C][batch][HW] or [batch][F]) and
 * returns its output (the layer's buffer, or in for a flatten that aliases). */
static const float *layer_forward(nn_model_t *m, int i, const float *in, int batch) {
  layer_t *l = &m->layers[i];
  const float *wt = m->params + l->w_off, *bias = m->params + l->b_off;
  l->in = in;
  switch (l->kind) {
    case LAYER_CONV:
      /* A ReLU the pool after it applies is left to the pool. */
      nn__conv_forward(&l->conv, batch, in, wt, bias, l->relu && !l->relu_by_pool, m->scratch, l->y);
      break;
    case LAYER_POOL:
      nn__maxpool_forward(in, (size_t)l->c * batch, l->h, l->w, l->pool_masks, l->y, l->arg);
      break;
    case LAYER_FLATTEN:
      /* [1][B][hw] already is [B][hw]. */
      if (l->y != NULL) nn__flatten_forward(in, l->c, batch, l->h * l->w, l->y);
      break;
    case LAYER_DENSE:
      nn__dense_forward(in, wt, bias, batch, l->c, l->oc, l->relu, l->y);
      break;
  }
  l->out = l->y != NULL ? l->y : in;
  return l->out;
}

/* nn_profile's clock: wall, or this process's CPU time (all its threads). */
static int64_t timing_now(const nn_model_t *m) {
  if (!m->timing_cpu) return tide_now_ns();
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Returns the logits [batch][10]. */
static const float *forward(nn_model_t *m, const float *x, int batch) {
  const float *in = x;
  for (int i = 0; i < m->nlayers; i++) {
    int64_t t0 = m->timing != NULL ? timing_now(m) : 0;
    in = layer_forward(m, i, in, batch);
    if (m->timing != NULL) m->timing[i] = timing_now(m) - t0;
  }
  return in;
}

/* What the K-FAC hook gets for a conv layer's A: its im2col chunks, handed
 * over by nn__conv_backward as it forms the weight gradient from them. */
typedef struct {
  nn_model_t *m;
  size_t index;
  float weight;
} patches_t;

static int feed_patches(void *ctx, const float *col, size_t cols) {
  const patches_t *p = ctx;
  return p->m->kfac_fn(p->m->kfac_ctx, p->index, TIDE_KFAC_A, col, cols, cols, 1, p->weight);
}

/* Hands K-FAC hook layer `index` (counted over dense and conv layers) its
 * input and its masked output gradient dout, weighted so that the factors
 * are the per-sample Fisher's whatever the batch: dout is the gradient of
 * the mean loss, batch times smaller than a sample's, so G's weight is
 * batch^2 / batch; a conv's s = oh*ow positions count as samples for A,
 * and G keeps their sum (KFC's |T| factor). A conv's A goes later, chunk
 * by chunk from its backward pass (feed_patches): *patches gets what that
 * needs. */
static int kfac_feed(nn_model_t *m, const layer_t *l, size_t index, const float *dout, int batch,
                     patches_t *patches) {
  nn_kfac_cb fn = m->kfac_fn;
  int rc;
  float wg = (float)batch;
  if (l->kind == LAYER_DENSE) {
    if ((rc = fn(m->kfac_ctx, index, TIDE_KFAC_G, dout, (size_t)batch, (size_t)l->oc, 0, wg)) != 0) return rc;
    return fn(m->kfac_ctx, index, TIDE_KFAC_A, l->in, (size_t)batch, (size_t)l->c, 0, 1.0f / (float)batch);
  }
  const nn__conv_t *c = &l->conv;
  size_t n = (size_t)batch * c->oh * c->ow;
  *patches = (patches_t){.m = m, .index = index, .weight = (float)(1.0 / (double)n)};
  return fn(m->kfac_ctx, index, TIDE_KFAC_G, dout, n, n, 1, wg);
}

/* Runs layer i backward: dout is the gradient at its output (a ReLU's mask
 * is applied to it in place), its parameter gradients are written, and the
 * gradient at its input goes to dx (NULL: not wanted); *dx_out gets where it
 * is (dout itself for a flatten that aliases). kfac_index >= 0 feeds the
 * K-FAC hook as that layer. */
static int layer_backward(nn_model_t *m, int i, int batch, float *dout, float *dx, long kfac_index,
                          float **dx_out) {
  layer_t *l = &m->layers[i];
  const float *wt = m->params + l->w_off;
  float *gw = m->grads + l->w_off, *gb = m->grads + l->b_off;
  size_t outs = layer_out_size(l) * (size_t)batch;
  switch (l->kind) {
    case LAYER_CONV: {
      patches_t patches;
      if (l->relu && !l->relu_by_pool) nn__relu_backward(l->y, dout, outs);
      if (kfac_index >= 0) TIDE_CHECK(kfac_feed(m, l, (size_t)kfac_index, dout, batch, &patches));
      TIDE_CHECK(nn__conv_backward(&l->conv, batch, l->in, m->scratch, wt, dout, gw, gb, dx,
                                   kfac_index >= 0 ? feed_patches : NULL, &patches));
      break;
    }
    case LAYER_POOL:
      nn__maxpool_backward(dout, l->y, l->arg, (size_t)l->c * batch, l->h, l->w, l->pool_masks, dx);
      break;
    case LAYER_FLATTEN:
      if (l->y == NULL)
        dx = dout;
      else if (dx != NULL)
        nn__flatten_backward(dout, l->c, batch, l->h * l->w, dx);
      break;
    case LAYER_DENSE:
      if (l->relu) nn__relu_backward(l->y, dout, outs);
      if (kfac_index >= 0) TIDE_CHECK(kfac_feed(m, l, (size_t)kfac_index, dout, batch, NULL));
      nn__dense_backward(l->in, wt, dout, batch, l->c, l->oc, gw, gb, dx);
      break;
  }
  *dx_out = dx;
  return 0;
}

/* dlogits is in m->dbuf[0]. */
static int backward(nn_model_t *m, int batch) {
  float *dout = m->dbuf[0];
  long kfac_index = 0;
  if (m->kfac_fn != NULL)
    for (int i = 0; i < m->nlayers; i++)
      kfac_index += m->layers[i].kind == LAYER_CONV || m->layers[i].kind == LAYER_DENSE;
  for (int i = m->nlayers - 1; i >= m->first_param; i--) {
    const layer_t *l = &m->layers[i];
    float *dx = i > m->first_param ? (dout == m->dbuf[0] ? m->dbuf[1] : m->dbuf[0]) : NULL;
    int feeds = m->kfac_fn != NULL && (l->kind == LAYER_CONV || l->kind == LAYER_DENSE);
    int64_t t0 = m->timing != NULL ? timing_now(m) : 0;
    TIDE_CHECK(layer_backward(m, i, batch, dout, dx, feeds ? --kfac_index : -1, &dx));
    dout = dx;
    if (m->timing != NULL) m->timing[m->nlayers + i] = timing_now(m) - t0;
  }
  return 0;
}

/* ---- one layer at a time (src/nn/burst.c; src/nn/model_layers.h) ----------------------- */

int nn__layer_count(const nn_model_t *m) { return m->nlayers; }
int nn__first_param(const nn_model_t *m) { return m->first_param; }

void nn__layer_shape(const nn_model_t *m, int i, int *planes, size_t *per_plane) {
  const layer_t *l = &m->layers[i];
  int flat = l->kind == LAYER_FLATTEN || l->kind == LAYER_DENSE;
  *planes = flat ? 1 : l->oc;
  *per_plane = flat ? layer_out_size(l) : (size_t)l->oh * l->ow;
}

void nn__layer_params(const nn_model_t *m, int i, size_t *offset, size_t *count) {
  const layer_t *l = &m->layers[i];
  int has = l->kind == LAYER_CONV || l->kind == LAYER_DENSE;
  *offset = has ? l->w_off : 0;
  *count = has ? l->b_off + (size_t)l->oc - l->w_off : 0;
}

const float *nn__layer_forward(nn_model_t *m, int i, const float *in, int batch) {
  return layer_forward(m, i, in, batch);
}

float *nn__layer_backward(nn_model_t *m, int i, int batch, float *dout, float *dx) {
  float *where = NULL;
  (void)layer_backward(m, i, batch, dout, dx, -1, &where); /* without K-FAC it cannot fail */
  return where;
}

/* need_labels 0: nn_forward. chunked: n may exceed max_batch (nn_evaluate). */
static int check_call(const char *fn, const nn_model_t *m, const float *x, const int32_t *labels,
                      int need_labels, int n, int chunked) {
  if (m == NULL || x == NULL || (need_labels && labels == NULL)) {
    tide_log_error("%s: %s must not be NULL", fn, m == NULL ? "model" : x == NULL ? "x" : "labels");
    return TIDE_EINVAL;
  }
  if (n < 1 || (!chunked && n > m->max_batch)) {
    if (chunked)
      tide_log_error("%s: n = %d must be at least 1", fn, n);
    else
      tide_log_error("%s: batch = %d must be in [1, max_batch = %d]", fn, n, m->max_batch);
    return TIDE_EINVAL;
  }
  for (int i = 0; labels != NULL && i < n; i++)
    if (labels[i] < 0 || labels[i] >= NN_CLASSES) {
      tide_log_error("%s: labels[%d] = %d is outside [0, %d)", fn, i, (int)labels[i], NN_CLASSES);
      return TIDE_EINVAL;
    }
  return 0;
}

int nn_forward_backward(nn_model_t *m, const float *x, const int32_t *labels, int batch,
                        float *loss_out) {
  TIDE_CHECK(check_call("nn_forward_backward", m, x, labels, 1, batch, 0));
  const float *logits = forward(m, x, batch);
  double loss = nn__softmax_xent(logits, labels, batch, NN_CLASSES, m->dbuf[0], NULL);
  TIDE_CHECK(backward(m, batch));
  if (loss_out != NULL) *loss_out = (float)loss;
  return 0;
}

int nn_evaluate(nn_model_t *m, const float *x, const int32_t *labels, int n, float *loss_out,
                int *correct_out) {
  TIDE_CHECK(check_call("nn_evaluate", m, x, labels, 1, n, 1));
  double loss = 0.0;
  int correct = 0;
  for (int at = 0; at < n; at += m->max_batch) {
    int batch = n - at < m->max_batch ? n - at : m->max_batch, right;
    const float *logits = forward(m, x + (size_t)at * NN_IMAGE_SIZE, batch);
    loss += nn__softmax_xent(logits, labels + at, batch, NN_CLASSES, NULL, &right) * batch;
    correct += right;
  }
  if (loss_out != NULL) *loss_out = (float)(loss / n);
  if (correct_out != NULL) *correct_out = correct;
  return 0;
}

int nn_forward(nn_model_t *m, const float *x, int batch, float *logits_out) {
  TIDE_CHECK(check_call("nn_forward", m, x, NULL, 0, batch, 0));
  if (logits_out == NULL) {
    tide_log_error("nn_forward: logits_out must not be NULL");
    return TIDE_EINVAL;
  }
  memcpy(logits_out, forward(m, x, batch), (size_t)batch * NN_CLASSES * sizeof *logits_out);
  return 0;
}

/* ---- K-FAC ------------------------------------------------------------------------------ */

size_t nn_kfac_layer_count(const nn_model_t *m) { return m != NULL ? m->ntensors / 2 : 0; }

int nn_kfac_layers(const nn_model_t *m, tide_kfac_layer_t *out) {
  if (m == NULL || out == NULL) {
    tide_log_error("nn_kfac_layers: %s must not be NULL", m == NULL ? "model" : "out");
    return TIDE_EINVAL;
  }
  /* name_tensors lays out weight, bias per dense or conv layer. */
  for (size_t t = 0; t < m->ntensors; t += 2) {
    const tide_tensor_t *w = &m->tensors[t];
    out[t / 2] = (tide_kfac_layer_t){.weight = t, .bias = (long)t + 1, .in_dim = (int)(w->count / (size_t)w->shape[0]),
                                     .out_dim = w->shape[0]};
  }
  return 0;
}

void nn_set_kfac_hook(nn_model_t *m, nn_kfac_cb fn, void *ctx) {
  if (m == NULL) return;
  m->kfac_fn = fn;
  m->kfac_ctx = ctx;
}

/* ---- BLAS ------------------------------------------------------------------------------ */

void nn_set_threads(int n) {
  if (n >= 1) openblas_set_num_threads(n);
}

const char *nn_blas_info(void) {
  static char info[128];
  snprintf(info, sizeof info, "OpenBLAS %s", openblas_get_corename());
  return info;
}

/* ---- per-layer profile (docs/burst-parallel.md) ------------------------------------------ */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static const char *const kind_names[] = {"conv", "pool", "flatten", "dense"};

/* A profile of m's layers (named arch) without times. */
static int profile_layers(const char *arch, const nn_model_t *m, tide_profile_t **out) {
  tide_profile_t *p = NULL;
  int rc;
  TIDE_CHECK(tide_profile_create(arch, &p));
  for (int i = 0; i < m->nlayers; i++) {
    const layer_t *l = &m->layers[i];
    tide_profile_layer_t pl = {.ninputs = 1, .inputs = {i - 1}};
    snprintf(pl.name, sizeof pl.name, "%s%d:%dx%dx%d->%dx%dx%d", kind_names[l->kind], i, l->c, l->h, l->w, l->oc,
             l->oh, l->ow);
    pl.act_bytes = 4.0 * (double)layer_out_size(l);
    if (l->kind == LAYER_CONV || l->kind == LAYER_DENSE)
      pl.param_bytes = 4.0 * (double)((l->kind == LAYER_CONV ? (size_t)l->oc * l->c * l->conv.k * l->conv.k
                                                              : (size_t)l->oc * l->c) + (size_t)l->oc);
    if ((rc = tide_profile_add_layer(p, &pl, NULL)) != 0) {
      tide_profile_destroy(p);
      return rc;
    }
  }
  *out = p;
  return 0;
}

int nn_profile_layers(const char *arch, tide_profile_t **out) {
  if (arch == NULL || out == NULL) {
    tide_log_error("nn_profile_layers: %s must not be NULL", arch == NULL ? "arch" : "out");
    return TIDE_EINVAL;
  }
  nn_model_t *m = NULL;
  TIDE_CHECK(nn_model_create(arch, 1, 1, &m));
  int rc = profile_layers(arch, m, out);
  nn_model_destroy(m);
  return rc;
}

int nn_profile(const char *arch, const int *batches, int nbatches, int warmup, int reps, unsigned flags,
               tide_profile_t **out) {
  if (arch == NULL || batches == NULL || out == NULL || nbatches < 1 || warmup < 0 || reps < 1) {
    tide_log_error("nn_profile: %s", arch == NULL      ? "arch must not be NULL"
                                     : batches == NULL ? "batches must not be NULL"
                                     : out == NULL     ? "out must not be NULL"
                                     : nbatches < 1    ? "nbatches must be >= 1"
                                     : warmup < 0      ? "warmup must be >= 0"
                                                       : "reps must be >= 1");
    return TIDE_EINVAL;
  }
  int max_batch = 0;
  for (int b = 0; b < nbatches; b++) {
    if (batches[b] < 1 || batches[b] > 65536) {
      tide_log_error("nn_profile: batches[%d] = %d must be in [1, 65536]", b, batches[b]);
      return TIDE_EINVAL;
    }
    if (batches[b] > max_batch) max_batch = batches[b];
  }
  nn_model_t *m = NULL;
  tide_profile_t *p = NULL;
  float *x = NULL;
  int32_t *labels = NULL;
  int64_t *samples = NULL;
  int rc;
  TIDE_CHECK_GOTO(nn_model_create(arch, max_batch, 1, &m), rc, out);
  int n = m->nlayers;
  x = tide_malloc((size_t)max_batch * NN_IMAGE_SIZE * sizeof *x);
  labels = tide_malloc((size_t)max_batch * sizeof *labels);
  samples = tide_malloc((size_t)reps * 2 * n * sizeof *samples);
  m->timing = tide_calloc((size_t)2 * n, sizeof *m->timing);
  m->timing_cpu = (flags & NN_PROFILE_CPU_CLOCK) != 0;
  if (x == NULL || labels == NULL || samples == NULL || m->timing == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  rng_t r;
  uint64_t seed = 7;
  for (int k = 0; k < 4; k++) r.s[k] = splitmix64(&seed);
  for (size_t i = 0; i < (size_t)max_batch * NN_IMAGE_SIZE; i++) x[i] = rng_uniform(&r, 1.0f);
  for (int i = 0; i < max_batch; i++) labels[i] = (int32_t)(rng_next(&r) % NN_CLASSES);
  TIDE_CHECK_GOTO(profile_layers(arch, m, &p), rc, out);
  for (int b = 0; b < nbatches; b++) {
    for (int it = 0; it < warmup + reps; it++) {
      const float *logits = forward(m, x, batches[b]);
      nn__softmax_xent(logits, labels, batches[b], NN_CLASSES, m->dbuf[0], NULL);
      TIDE_CHECK_GOTO(backward(m, batches[b]), rc, out);
      if (it >= warmup)
        for (int k = 0; k < 2 * n; k++) samples[(size_t)k * reps + (it - warmup)] = m->timing[k];
    }
    for (int i = 0; i < n; i++) {
      int64_t *fw = samples + (size_t)i * reps, *bw = samples + (size_t)(n + i) * reps;
      qsort(fw, (size_t)reps, sizeof *fw, cmp_i64);
      qsort(bw, (size_t)reps, sizeof *bw, cmp_i64);
      /* layers below the first with parameters run no backward pass */
      double f = (double)fw[reps / 2] * 1e-9, g = i >= m->first_param ? (double)bw[reps / 2] * 1e-9 : 0.0;
      TIDE_CHECK_GOTO(tide_profile_set_time(p, i, batches[b], f, g), rc, out);
    }
  }
  *out = p;
  p = NULL;
  rc = 0;
out:
  if (m != NULL) {
    tide_free(m->timing);
    m->timing = NULL;
  }
  nn_model_destroy(m);
  tide_profile_destroy(p);
  tide_free(x);
  tide_free(labels);
  tide_free(samples);
  return rc;
}
