/* Burst-parallel execution of a plan (DeepPool; docs/burst-parallel.md):
 * each layer of an nn model on its own power-of-two number of ranks, the
 * global batch split among them, activations moved at each width change
 * and their gradients on the way back, each layer's gradients summed among
 * the ranks that ran it and its optimizer stepped there.
 *
 * Samples. The global batch is cut into C chunks, C = the widest layer's
 * width (chunk j: samples [floor(jB/C), floor((j+1)B/C))). At width w,
 * rank r < w holds the chunks j = r (mod w), in increasing j. Doubling the
 * width hands every other chunk of rank r to rank r + w, so a width change
 * from lo to hi = k lo ranks is k-rank groups {s, s + lo, ..., s + (k-1) lo}
 * (s < lo): the narrow rank s keeps its own share and exchanges the rest
 * with the k - 1 others, the transfer tide's planner costs. Within a
 * group, narrow to wide is a reduce-scatter in which only s contributes
 * (the others add zeros, exact in floating point), wide to narrow an
 * all-gather(v) of which s keeps the result. Both are one collective on a
 * sub-communicator made once, in tide_comm_split.
 *
 * Ranks that do not run a layer hold its parameters (initialised like
 * everyone's) but never read or update them: they skip its optimizer step,
 * and their copy goes stale. Layers run on the first `width` ranks, so
 * rank 0 runs every layer and holds the whole, current model. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/layers.h"
#include "nn/model_layers.h"
#include "nn/nn.h"

enum { MAX_LOG = 16 }; /* widths up to 2^15 */

typedef struct {
  int width, lw;     /* width and its log2 */
  int planes;        /* output layout */
  size_t per_plane;
  size_t poff, pcount; /* parameters */
  float *in;         /* input after a width change (this rank runs the layer), else NULL */
  tide_optim_t *optim; /* NULL: no parameters or not run here */
} burst_layer_t;

struct nn_burst {
  nn_model_t *model;
  tide_comm_t *comm;
  int rank, size, global_batch, nlayers, first_param;
  int chunks;                  /* C */
  int *chunk_start, *chunk_len; /* [C] */
  int *chunk_off[MAX_LOG];     /* [log2 w][C]: chunk j's first sample on its owner at width w */
  int local[MAX_LOG];          /* this rank's samples at width w (0 when rank >= w) */
  tide_comm_t *width_comm[MAX_LOG];          /* the first w ranks */
  tide_comm_t *pair_comm[MAX_LOG][MAX_LOG];  /* [log2 lo][log2 hi]: this rank's group */
  burst_layer_t *layers;
  int32_t *labels;          /* the last layer's labels on this rank */
  float *grad[2];           /* backward ping-pong */
  float *send, *recv;       /* transfers */
  size_t *counts;           /* allgatherv */
};

static int log2i(int w) {
  int l = 0;
  while ((1 << l) < w) l++;
  return l;
}

static int is_pow2(int w) { return w >= 1 && (w & (w - 1)) == 0; }

/* Samples of member `owner` (< w) at width w. */
static int samples_at(const nn_burst_t *b, int w, int owner) {
  int n = 0;
  for (int j = owner; j < b->chunks; j += w) n += b->chunk_len[j];
  return n;
}

static int sum_identity(double *values, size_t count, void *arg) {
  (void)values, (void)count, (void)arg; /* the shard is one layer's whole tensors */
  return 0;
}

/* Moves a tensor [planes][n][per_plane] from its layout at width `from`
 * (src, on ranks < from) to width `to` (dst, on ranks < to). Collective
 * over the ranks < max(from, to). */
static int transfer(nn_burst_t *b, int from, int to, int planes, size_t pp, const float *src, float *dst) {
  int lo = from < to ? from : to, hi = from < to ? to : from, r = b->rank;
  if (r >= hi) return 0;
  int k = hi / lo, s = r % lo, me = r / lo, llo = log2i(lo), lhi = log2i(hi);
  tide_comm_t *g = b->pair_comm[llo][lhi];
  const int *off_lo = b->chunk_off[llo], *off_hi = b->chunk_off[lhi];
  int n_root = b->local[llo], maxlen = 0;
  for (int mm = 0; mm < k; mm++) {
    int n = samples_at(b, hi, s + mm * lo);
    if (n > maxlen) maxlen = n;
  }
  size_t block = (size_t)planes * maxlen * pp;
  if (from == lo) { /* scatter from s */
    memset(b->send, 0, (size_t)k * block * sizeof(float));
    if (me == 0)
      for (int mm = 0; mm < k; mm++)
        for (int j = s + mm * lo; j < b->chunks; j += hi)
          for (int p = 0; p < planes; p++)
            memcpy(b->send + mm * block + ((size_t)p * maxlen + off_hi[j]) * pp,
                   src + ((size_t)p * n_root + off_lo[j]) * pp, (size_t)b->chunk_len[j] * pp * sizeof(float));
    TIDE_CHECK(tide_reduce_scatter(g, b->send, b->recv, (size_t)k * block, TIDE_F32, TIDE_SUM));
    int n_me = b->local[lhi];
    for (int p = 0; p < planes; p++)
      memcpy(dst + (size_t)p * n_me * pp, b->recv + (size_t)p * maxlen * pp, (size_t)n_me * pp * sizeof(float));
    return 0;
  }
  /* gather to s */
  for (int mm = 0; mm < k; mm++) b->counts[mm] = (size_t)planes * samples_at(b, hi, s + mm * lo) * pp;
  TIDE_CHECK(tide_allgatherv(g, src, b->counts[me], b->recv, b->counts, TIDE_F32));
  if (me != 0) return 0;
  size_t base = 0;
  for (int mm = 0; mm < k; mm++) {
    int n_mm = samples_at(b, hi, s + mm * lo);
    for (int j = s + mm * lo; j < b->chunks; j += hi)
      for (int p = 0; p < planes; p++)
        memcpy(dst + ((size_t)p * n_root + off_lo[j]) * pp, b->recv + base + ((size_t)p * n_mm + off_hi[j]) * pp,
               (size_t)b->chunk_len[j] * pp * sizeof(float));
    base += b->counts[mm];
  }
  return 0;
}

/* The layout of layer i's input: layer i-1's output, or the image. */
static void input_shape(const nn_burst_t *b, int i, int *planes, size_t *pp) {
  if (i == 0) {
    *planes = 1;
    *pp = NN_IMAGE_SIZE;
  } else {
    *planes = b->layers[i - 1].planes;
    *pp = b->layers[i - 1].per_plane;
  }
}

static int make_comms(nn_burst_t *b) {
  int used[MAX_LOG] = {0}, pairs[MAX_LOG][MAX_LOG] = {{0}};
  for (int i = 0; i < b->nlayers; i++) {
    used[b->layers[i].lw] = 1;
    if (i > 0 && b->layers[i].width != b->layers[i - 1].width) {
      int a = b->layers[i - 1].lw, c = b->layers[i].lw;
      pairs[a < c ? a : c][a < c ? c : a] = 1;
    }
  }
  /* Every rank splits in the same order (the widths are the same everywhere). */
  for (int l = 1; l < MAX_LOG; l++)
    if (used[l]) TIDE_CHECK(tide_comm_split(b->comm, b->rank < (1 << l) ? 0 : -1, b->rank, &b->width_comm[l]));
  for (int lo = 0; lo < MAX_LOG; lo++)
    for (int hi = lo + 1; hi < MAX_LOG; hi++)
      if (pairs[lo][hi])
        TIDE_CHECK(tide_comm_split(b->comm, b->rank < (1 << hi) ? b->rank % (1 << lo) : -1, b->rank,
                                   &b->pair_comm[lo][hi]));
  return 0;
}

/* Buffers: inputs after width changes, gradient ping-pong, transfers. */
static int make_buffers(nn_burst_t *b) {
  int r = b->rank, cmax = b->chunks;
  size_t grad = 1, xfer = 1;
  for (int i = 0; i < b->nlayers; i++) {
    burst_layer_t *l = &b->layers[i];
    int planes;
    size_t pp;
    input_shape(b, i, &planes, &pp);
    int n = b->local[l->lw];
    if (r < l->width) {
      size_t in = (size_t)planes * pp * n, out = (size_t)l->planes * l->per_plane * n;
      if (in > grad) grad = in;
      if (out > grad) grad = out;
      if (i == 0 || l->width != b->layers[i - 1].width) {
        if ((l->in = tide_malloc(in * sizeof(float))) == NULL) return TIDE_ENOMEM;
      }
    }
    if (i > 0 && l->width != b->layers[i - 1].width) {
      int lo = l->width < b->layers[i - 1].width ? l->width : b->layers[i - 1].width;
      int hi = l->width ^ b->layers[i - 1].width ^ lo;
      if (r < hi) {
        int s = r % lo, maxlen = 0;
        for (int mm = 0; mm < hi / lo; mm++) {
          int m = samples_at(b, hi, s + mm * lo);
          if (m > maxlen) maxlen = m;
        }
        /* reduce-scatter: k padded blocks; all-gather: at most that */
        size_t need = (size_t)(hi / lo) * maxlen * planes * pp;
        if (need > xfer) xfer = need;
      }
    }
  }
  b->grad[0] = tide_malloc(grad * sizeof(float));
  b->grad[1] = tide_malloc(grad * sizeof(float));
  b->send = tide_malloc(xfer * sizeof(float));
  b->recv = tide_malloc(xfer * sizeof(float));
  b->counts = tide_calloc((size_t)cmax, sizeof *b->counts);
  b->labels = tide_calloc((size_t)b->global_batch, sizeof *b->labels);
  if (b->grad[0] == NULL || b->grad[1] == NULL || b->send == NULL || b->recv == NULL || b->counts == NULL ||
      b->labels == NULL)
    return TIDE_ENOMEM;
  return 0;
}

static int make_optimizers(nn_burst_t *b, const tide_optim_config_t *config) {
  size_t ntensors;
  const tide_tensor_t *tensors = nn_tensors(b->model, &ntensors);
  for (int i = 0; i < b->nlayers; i++) {
    burst_layer_t *l = &b->layers[i];
    if (l->pcount == 0 || b->rank >= l->width) continue;
    tide_optim_shard_t shard = {.offset = l->poff, .count = l->pcount, .sum = sum_identity};
    TIDE_CHECK(tide_optim_create_shard(config, tensors, ntensors, nn_param_count(b->model), &shard, &l->optim));
  }
  return 0;
}

/* The most samples any rank gets at width w: C = widest chunks of B. */
static int largest_share(int global_batch, int widest, int w) {
  int most = 0;
  for (int o = 0; o < w; o++) {
    int n = 0;
    for (int j = o; j < widest; j += w)
      n += (int)((int64_t)(j + 1) * global_batch / widest - (int64_t)j * global_batch / widest);
    if (n > most) most = n;
  }
  return most;
}

int nn_burst_max_batch(const int *widths, int nwidths, int global_batch) {
  int widest = 1, need = 0;
  if (widths == NULL || nwidths < 1 || global_batch < 1) return 0;
  for (int i = 0; i < nwidths; i++)
    if (widths[i] > widest) widest = widths[i];
  if (widest > global_batch) return 0;
  for (int i = 0; i < nwidths; i++)
    if (widths[i] >= 1 && largest_share(global_batch, widest, widths[i]) > need)
      need = largest_share(global_batch, widest, widths[i]);
  return need;
}

/* This rank's checks of the arguments: 0, or TIDE_EINVAL with the reason
 * logged. */
static int check_plan(const nn_model_t *m, int size, const int *widths, int nwidths, int global_batch,
                      const tide_optim_config_t *optim) {
  if (widths == NULL || optim == NULL) {
    tide_log_error("nn_burst_create: %s must not be NULL", widths == NULL ? "widths" : "optim");
    return TIDE_EINVAL;
  }
  int n = nn__layer_count(m), widest = 1;
  if (nwidths != n) {
    tide_log_error("nn_burst_create: the plan has %d layers but the model (%s) has %d: make the plan from this "
                   "model's profile (tide profile --model ...)", nwidths, nn_model_arch(m), n);
    return TIDE_EINVAL;
  }
  for (int i = 0; i < n; i++) {
    if (!is_pow2(widths[i]) || widths[i] > size || widths[i] >= (1 << (MAX_LOG - 1))) {
      tide_log_error("nn_burst_create: layer %d: width %d must be a power of two in [1, %d] (the job's ranks)", i,
                     widths[i], size);
      return TIDE_EINVAL;
    }
    if (widths[i] > widest) widest = widths[i];
  }
  if (global_batch < widest) {
    tide_log_error("nn_burst_create: global_batch %d is smaller than the widest layer's %d workers: every worker of "
                   "a layer needs a sample", global_batch, widest);
    return TIDE_EINVAL;
  }
  int need = 0;
  for (int i = 0; i < n; i++)
    if (largest_share(global_batch, widest, widths[i]) > need) need = largest_share(global_batch, widest, widths[i]);
  if (need > nn_model_max_batch(m)) {
    tide_log_error("nn_burst_create: a layer runs on %d samples per rank but the model takes batches of at most %d: "
                   "build it with max_batch >= %d", need, nn_model_max_batch(m), need);
    return TIDE_EINVAL;
  }
  return tide_optim_config_check(optim);
}

/* Collective: 0 when every rank's `failed` is 0 (and, with h, every rank's
 * h is the same), else TIDE_EINVAL on every rank, so that no rank goes on
 * into collectives the others have left. */
static int agree(tide_comm_t *comm, int failed, uint64_t h, const char *what) {
  int64_t mine[3] = {failed != 0, (int64_t)(h >> 1), -(int64_t)(h >> 1)}, all[3];
  TIDE_CHECK(tide_allreduce(comm, mine, all, 3, TIDE_I64, TIDE_MAX));
  if (all[0] != 0) {
    if (!failed) tide_log_error("nn_burst_create: another rank %s (its log says why)", what);
    return TIDE_EINVAL;
  }
  if (all[1] != -all[2]) {
    tide_log_error("nn_burst_create: the ranks were given different plans or global batches: give every rank the "
                   "same plan file and batch");
    return TIDE_EINVAL;
  }
  return 0;
}

/* The sample chunks and layer table of b. */
static int setup_tables(nn_burst_t *b, nn_model_t *m, tide_comm_t *comm, const int *widths, int global_batch,
                        int widest) {
  int n = nn__layer_count(m);
  b->model = m;
  b->comm = comm;
  b->rank = tide_comm_rank(comm);
  b->size = tide_comm_size(comm);
  b->global_batch = global_batch;
  b->nlayers = n;
  b->first_param = nn__first_param(m);
  b->chunks = widest;
  b->chunk_start = tide_calloc((size_t)widest, sizeof(int));
  b->chunk_len = tide_calloc((size_t)widest, sizeof(int));
  b->layers = tide_calloc((size_t)n, sizeof *b->layers);
  if (b->chunk_start == NULL || b->chunk_len == NULL || b->layers == NULL) return TIDE_ENOMEM;
  for (int j = 0; j < widest; j++) {
    b->chunk_start[j] = (int)((int64_t)j * global_batch / widest);
    b->chunk_len[j] = (int)((int64_t)(j + 1) * global_batch / widest) - b->chunk_start[j];
  }
  for (int lw = 0; (1 << lw) <= widest; lw++) {
    int w = 1 << lw;
    if ((b->chunk_off[lw] = tide_calloc((size_t)widest, sizeof(int))) == NULL) return TIDE_ENOMEM;
    for (int j = w; j < widest; j++) b->chunk_off[lw][j] = b->chunk_off[lw][j - w] + b->chunk_len[j - w];
    b->local[lw] = b->rank < w ? samples_at(b, w, b->rank) : 0;
  }
  for (int i = 0; i < n; i++) {
    burst_layer_t *l = &b->layers[i];
    l->width = widths[i];
    l->lw = log2i(widths[i]);
    nn__layer_shape(m, i, &l->planes, &l->per_plane);
    nn__layer_params(m, i, &l->poff, &l->pcount);
  }
  return 0;
}

int nn_burst_create(nn_model_t *m, tide_comm_t *comm, const int *widths, int nwidths, int global_batch,
                    const tide_optim_config_t *optim, nn_burst_t **out) {
  if (m == NULL || comm == NULL || out == NULL) {
    tide_log_error("nn_burst_create: %s must not be NULL", m == NULL ? "model" : comm == NULL ? "comm" : "out");
    return TIDE_EINVAL;
  }
  int n = nn__layer_count(m), size = tide_comm_size(comm), widest = 1;
  /* Every rank checks, then all agree, so that a plan refused on one rank is refused on all (nobody is left
   * waiting in a collective) and every rank runs the same plan on the same batch. */
  int bad = check_plan(m, size, widths, nwidths, global_batch, optim) != 0;
  uint64_t h = bad ? 0
                   : tide_checksum(widths, (size_t)n * sizeof *widths) ^ (uint64_t)global_batch * 0x9e3779b97f4a7c15ull;
  TIDE_CHECK(agree(comm, bad, h, "refused the plan"));
  for (int i = 0; i < n; i++)
    if (widths[i] > widest) widest = widths[i];
  nn_burst_t *b = tide_calloc(1, sizeof *b);
  int rc = b != NULL ? setup_tables(b, m, comm, widths, global_batch, widest) : TIDE_ENOMEM;
  /* a failure anywhere fails every rank, before and after the splits (themselves collective) */
  int agreed = agree(comm, rc != 0, 0, "could not set up (out of memory?)");
  if (rc == 0) rc = agreed;
  if (rc == 0 && (rc = make_comms(b)) == 0) {
    rc = make_buffers(b);
    if (rc == 0) rc = make_optimizers(b, optim);
    agreed = agree(comm, rc != 0, 0, "could not set up (out of memory?)");
    if (rc == 0) rc = agreed;
  }
  if (rc != 0) goto fail;
  *out = b;
  return 0;
fail:
  if (rc == TIDE_ENOMEM) tide_log_error("nn_burst_create: out of memory");
  nn_burst_destroy(b);
  return rc;
}

void nn_burst_destroy(nn_burst_t *b) {
  if (b == NULL) return;
  for (int l = 0; l < MAX_LOG; l++) {
    tide_comm_destroy(b->width_comm[l]);
    tide_free(b->chunk_off[l]);
    for (int h = 0; h < MAX_LOG; h++) tide_comm_destroy(b->pair_comm[l][h]);
  }
  for (int i = 0; b->layers != NULL && i < b->nlayers; i++) {
    tide_free(b->layers[i].in);
    tide_optim_destroy(b->layers[i].optim);
  }
  tide_free(b->layers);
  tide_free(b->chunk_start);
  tide_free(b->chunk_len);
  tide_free(b->labels);
  tide_free(b->grad[0]);
  tide_free(b->grad[1]);
  tide_free(b->send);
  tide_free(b->recv);
  tide_free(b->counts);
  tide_free(b);
}

int nn_burst_runs(const nn_burst_t *b, int layer) {
  if (b == NULL || layer < 0 || layer >= b->nlayers) return 0;
  return b->rank < b->layers[layer].width;
}

/* This rank's chunks at width w of a [n][per] array into dst. */
static void take_samples(const nn_burst_t *b, int w, const void *src, size_t bytes_per_sample, void *dst) {
  const int *off = b->chunk_off[log2i(w)];
  for (int j = b->rank; j < b->chunks; j += w)
    memcpy((char *)dst + (size_t)off[j] * bytes_per_sample,
           (const char *)src + (size_t)b->chunk_start[j] * bytes_per_sample, (size_t)b->chunk_len[j] * bytes_per_sample);
}

int nn_burst_step(nn_burst_t *b, const float *x, const int32_t *labels, float lr, float *loss_out) {
  if (b == NULL || x == NULL || labels == NULL) {
    tide_log_error("nn_burst_step: %s must not be NULL", b == NULL ? "burst" : x == NULL ? "x" : "labels");
    return TIDE_EINVAL;
  }
  for (int i = 0; i < b->global_batch; i++)
    if (labels[i] < 0 || labels[i] >= NN_CLASSES) {
      tide_log_error("nn_burst_step: labels[%d] = %d is outside [0, %d)", i, (int)labels[i], NN_CLASSES);
      return TIDE_EINVAL;
    }
  int r = b->rank, n = b->nlayers;
  nn_model_t *m = b->model;
  const float *out = NULL;
  /* forward */
  for (int i = 0; i < n; i++) {
    burst_layer_t *l = &b->layers[i];
    const float *in = out;
    if (i == 0) {
      if (r < l->width) take_samples(b, l->width, x, NN_IMAGE_SIZE * sizeof(float), l->in);
      in = l->in;
    } else if (l->width != b->layers[i - 1].width) {
      TIDE_CHECK(transfer(b, b->layers[i - 1].width, l->width, b->layers[i - 1].planes, b->layers[i - 1].per_plane,
                          out, l->in));
      in = l->in;
    }
    out = r < l->width ? nn__layer_forward(m, i, in, b->local[l->lw]) : NULL;
  }
  /* loss: the mean over the global batch, so its gradient sums over ranks */
  const burst_layer_t *last = &b->layers[n - 1];
  double loss = NAN;
  if (r < last->width) {
    int nl = b->local[last->lw];
    take_samples(b, last->width, labels, sizeof *labels, b->labels);
    double share = (double)nl / b->global_batch;
    loss = nn__softmax_xent(out, b->labels, nl, NN_CLASSES, b->grad[0], NULL) * share;
    for (size_t k = 0; k < (size_t)nl * NN_CLASSES; k++) b->grad[0][k] *= (float)share;
  }
  /* backward: each layer's gradient summed among its ranks, then its step */
  float *dout = b->grad[0];
  for (int i = n - 1; i >= b->first_param; i--) {
    burst_layer_t *l = &b->layers[i];
    float *dx = NULL;
    if (r < l->width) {
      float *spare = dout == b->grad[0] ? b->grad[1] : b->grad[0];
      dx = nn__layer_backward(m, i, b->local[l->lw], dout, i > b->first_param ? spare : NULL);
      if (l->pcount > 0) {
        float *g = nn_grads(m) + l->poff;
        if (l->width > 1) TIDE_CHECK(tide_allreduce(b->width_comm[l->lw], g, g, l->pcount, TIDE_F32, TIDE_SUM));
        TIDE_CHECK(tide_optim_step(l->optim, nn_params(m) + l->poff, g, lr));
      }
    }
    if (i == b->first_param) break;
    const burst_layer_t *prev = &b->layers[i - 1];
    if (prev->width == l->width) {
      dout = dx;
    } else {
      float *dst = dx == b->grad[0] ? b->grad[1] : b->grad[0];
      TIDE_CHECK(transfer(b, l->width, prev->width, prev->planes, prev->per_plane, dx, dst));
      dout = dst;
    }
  }
  if (r < last->width && last->width > 1) {
    TIDE_CHECK(tide_allreduce(b->width_comm[last->lw], &loss, &loss, 1, TIDE_F64, TIDE_SUM));
  }
  if (loss_out != NULL) *loss_out = (float)loss;
  return 0;
}
