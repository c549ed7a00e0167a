/* The table of gradient exchanges the trainer picks from (one row each,
 * train.h says what a row owns). Each sums the exchange buffer
 * [gradient | statistics] over the ranks: dense in one allreduce; the
 * sparse ones send the gradient as top-k pairs with error feedback and the
 * few statistics in a small allreduce beside it. adasum combines the ranks'
 * parameter updates instead of their gradients. PTO's reduce-scatter is
 * the last row (pto.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/simd.h"
#include "train/train.h"

void tide__exchange_average(tide_trainer_t *tr, float inv, tide__mean_t *mean) {
  double *tensor_sq = tr->config.tensor_stats ? tr->monitor.tensor_sq : NULL, total = 0;
  for (size_t t = 0; t < tr->ntensors; t++) {
    double sq = tide__scale_in_place(tr->exchange + tr->tensors[t].offset, tr->tensors[t].count, inv);
    if (tensor_sq != NULL) tensor_sq[t] = sq;
    total += sq;
  }
  *mean = (tide__mean_t){tr->exchange + tr->shard_offset, total, 0, tr->exchange};
}

/* The rows that sum the whole gradient. */
static int sum_average(tide_trainer_t *tr, void *state, double total, tide__mean_t *mean) {
  (void)state;
  tide__exchange_average(tr, (float)(1.0 / total), mean);
  return 0;
}

int tide__exchange_update(tide_trainer_t *tr, void *state, const tide__mean_t *mean, float lr, tide__update_t *out) {
  (void)state;
  int rc = tide_optim_step(tr->optim, tr->params + tr->shard_offset, mean->grad, lr);
  if (rc != 0)
    return tide__trainer_fail(tr, rc, tr->pto ? "optimizer step %ld failed on this rank's shard"
                                              : "optimizer step %ld failed", tr->step);
  return tr->pto ? tide__pto_gather_params(tr, &out->comm_s) : 0;
}

void tide__exchange_close_all(tide_trainer_t *tr) {
  for (int k = 0; k < TIDE__EXCHANGE_ROWS; k++)
    if (tr->exchange_state[k] != NULL) {
      tide__exchanges[k].close(tr->exchange_state[k]);
      tr->exchange_state[k] = NULL;
    }
}

static int dense_open(tide_trainer_t *tr, void **state) {
  (void)tr;
  *state = NULL;
  return 0;
}

static int dense_run(tide_trainer_t *tr, void *state) {
  (void)state;
  size_t count = tr->nparams + tr->monitor.nslots;
  int rc = tide_allreduce(tr->comm, tr->exchange, tr->exchange, count, TIDE_F32, TIDE_SUM);
  if (rc != 0) return tide__trainer_fail(tr, rc, "gradient allreduce: %s", tide_comm_last_error(tr->comm));
  return 0;
}

static void dense_close(void *state) { (void)state; }

static tide_compressor_t *no_compressor(void *state) {
  (void)state;
  return NULL;
}

/* topk and hitopk: a compressor over the whole gradient (topk) or over
 * this rank's shard of the host's sum (hitopk), and the pair buffers. */
typedef struct {
  int hierarchical;
  tide_compressor_t *compressor;
  size_t len;
  float *values;
  uint32_t *indices;
  double density;
} sparse_t;

/* DGC's density warm-up over the first data epochs. */
static double density_at(const tide_trainer_t *tr) {
  double n = tr->config.sparse_warmup_epochs, rho = tr->config.density;
  if ((double)tr->epoch >= n) return rho;
  return pow(rho, ((double)tr->epoch + 1.0) / (n + 1.0));
}

static void sparse_close(void *state) {
  sparse_t *s = state;
  if (s == NULL) return;
  tide_compressor_destroy(s->compressor);
  tide__free(s->values);
  tide__free(s->indices);
  tide__free(s);
}

static int sparse_open(tide_trainer_t *tr, int hierarchical, void **state) {
  sparse_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  s->hierarchical = hierarchical;
  size_t offset = 0;
  s->len = tr->nparams;
  int rc = 0;
  if (hierarchical && (rc = tide_hitopk_shard(tr->comm, tr->nparams, &offset, &s->len)) != 0) {
    sparse_close(s);
    return tide__trainer_fail(tr, rc, "hitopk needs the same number of ranks on every host: %s",
                              tide_comm_last_error(tr->comm));
  }
  tide_topk_opts_t opts = {.seed = tr->config.seed};
  s->density = density_at(tr);
  if ((rc = tide_compressor_create(tr->config.selector, s->density, TIDE_TOPK_GLOBAL, NULL, 0,
                                   s->len ? s->len : 1, &opts, &s->compressor)) != 0) {
    sparse_close(s);
    return tide__trainer_fail(tr, rc, "cannot create the top-k compressor for %zu elements", s->len);
  }
  s->values = tide__malloc((s->len ? s->len : 1) * sizeof *s->values);
  s->indices = tide__malloc((s->len ? s->len : 1) * sizeof *s->indices);
  if (s->values == NULL || s->indices == NULL) {
    sparse_close(s);
    return TIDE_ENOMEM;
  }
  *state = s;
  return 0;
}

static int topk_open(tide_trainer_t *tr, void **state) { return sparse_open(tr, 0, state); }
static int hitopk_open(tide_trainer_t *tr, void **state) { return sparse_open(tr, 1, state); }

/* The statistics alone, for the exchanges that send the gradient otherwise. */
static int statistics_run(tide_trainer_t *tr) {
  float *slots = tr->exchange + tr->nparams;
  int rc = tide_allreduce(tr->comm, slots, slots, tr->monitor.nslots, TIDE_F32, TIDE_SUM);
  if (rc != 0) return tide__trainer_fail(tr, rc, "statistics allreduce: %s", tide_comm_last_error(tr->comm));
  return 0;
}

static int sparse_run(tide_trainer_t *tr, void *state) {
  sparse_t *s = state;
  double density = density_at(tr);
  int rc;
  if (density != s->density) {
    if ((rc = tide_compressor_set_density(s->compressor, density)) != 0) return rc;
    s->density = density;
  }
  /* The statistics travel densely, the gradient sparsely. */
  TIDE_CHECK(statistics_run(tr));
  /* A diverged rank's gradient would fail its selection alone; every rank
   * sees the loss first and stops together (tide_trainer_step says why). */
  if (!isfinite(tr->exchange[tr->nparams + TIDE__SLOT_LOSS])) return 0;
  if (s->hierarchical) {
    rc = tide_hitopk_allreduce(tr->comm, tr->exchange, tr->exchange, tr->nparams, s->compressor, TIDE_SUM);
    if (rc != 0) return tide__trainer_fail(tr, rc, "HiTopKComm allreduce: %s", tide_comm_last_error(tr->comm));
    return 0;
  }
  size_t k = 0;
  if ((rc = tide_compressor_compress(s->compressor, tr->exchange, tr->nparams, s->values, s->indices, &k)) != 0)
    return tide__trainer_fail(tr, rc, "top-k selection: %s", tide_compressor_last_error(s->compressor));
  if ((rc = tide_sparse_allgather(tr->comm, s->values, s->indices, k, tr->exchange, tr->nparams, TIDE_SUM)) != 0)
    return tide__trainer_fail(tr, rc, "TopK-AllGather: %s", tide_comm_last_error(tr->comm));
  return 0;
}

static tide_compressor_t *sparse_compressor(void *state) { return ((sparse_t *)state)->compressor; }

/* adasum (Maleki et al.; Horovod's _DistributedAdasumOptimizer): every rank
 * steps its own optimizer (its own momentum or moments) on its own mean
 * gradient from the shared start w0, and the ranks' changes w - w0 are
 * combined per tensor by tide_adasum_allreduce, identical on every rank. */
typedef struct {
  float *start;
} adasum_t;

static int adasum_open(tide_trainer_t *tr, void **state) {
  adasum_t *a = tide__calloc(1, sizeof *a);
  if (a == NULL || (a->start = tide__malloc(tr->nparams * sizeof *a->start)) == NULL) {
    tide__free(a);
    return TIDE_ENOMEM;
  }
  *state = a;
  return 0;
}

static void adasum_close(void *state) {
  adasum_t *a = state;
  if (a == NULL) return;
  tide__free(a->start);
  tide__free(a);
}

static int adasum_reduce(tide_trainer_t *tr, void *state) {
  (void)state;
  return statistics_run(tr);
}

/* This rank's own mean: its optimizer steps on it. */
static int adasum_average(tide_trainer_t *tr, void *state, double total, tide__mean_t *mean) {
  (void)state;
  (void)total;
  double own = tr->monitor.count;
  tide__exchange_average(tr, own > 0 ? (float)(1.0 / own) : 0.0f, mean);
  mean->own = 1;
  return 0;
}

/* The default update from the shared start, then the changes combined. */
static int adasum_update(tide_trainer_t *tr, void *state, const tide__mean_t *mean, float lr, tide__update_t *out) {
  adasum_t *a = state;
  float *w = tr->params;
  size_t n = tr->nparams;
  memcpy(a->start, w, n * sizeof *w);
  if (tr->monitor.count > 0) {
    TIDE_CHECK(tide__exchange_update(tr, NULL, mean, lr, out));
    for (size_t i = 0; i < n; i++) w[i] -= a->start[i];
  } else {
    memset(w, 0, n * sizeof *w); /* no samples this step: no change to add */
  }
  int64_t t0 = tide__now_ns();
  int rc = tide_adasum_allreduce(tr->comm, w, w, n, TIDE_F32, tr->tensors, tr->ntensors);
  if (rc != 0) return tide__trainer_fail(tr, rc, "Adasum allreduce: %s", tide_comm_last_error(tr->comm));
  out->comm_s += (double)(tide__now_ns() - t0) * 1e-9;
  for (size_t i = 0; i < n; i++) w[i] += a->start[i];
  return 0;
}

#define UPDATE tide__exchange_update
#define KFAC tide__kfac_stage
const tide__exchange_ops_t tide__exchanges[TIDE__EXCHANGE_ROWS] = {
    [TIDE_EXCHANGE_DENSE] = {"dense", dense_open, dense_run, sum_average, KFAC, UPDATE, dense_close, no_compressor},
    [TIDE_EXCHANGE_TOPK] = {"topk", topk_open, sparse_run, sum_average, KFAC, UPDATE, sparse_close,
                            sparse_compressor},
    [TIDE_EXCHANGE_HITOPK] = {"hitopk", hitopk_open, sparse_run, sum_average, KFAC, UPDATE, sparse_close,
                              sparse_compressor},
    [TIDE_EXCHANGE_ADASUM] = {"adasum", adasum_open, adasum_reduce, adasum_average, NULL, adasum_update,
                              adasum_close, no_compressor},
    [TIDE__EXCHANGE_PTO] = {"pto", tide__pto_open, tide__pto_reduce, tide__pto_average, NULL, UPDATE,
                            tide__pto_row_close, no_compressor},
};
