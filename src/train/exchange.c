/* The table of gradient exchanges the trainer picks from (one row each).
 * Each sums the exchange buffer [gradient | statistics] over the ranks:
 * dense in one allreduce; the sparse ones send the gradient as top-k pairs
 * with error feedback and the few statistics in a small allreduce beside
 * it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

static int dense_open(tide_trainer_t *tr, void **state) {
  (void)tr;
  *state = NULL;
  return 0;
}

static int dense_run(tide_trainer_t *tr, void *state) {
  (void)state;
  int rc = tide_allreduce(tr->comm, tr->exchange, tr->exchange, tr->nparams + tr->nslots, TIDE_F32, TIDE_SUM);
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

static int sparse_run(tide_trainer_t *tr, void *state) {
  sparse_t *s = state;
  double density = density_at(tr);
  int rc;
  if (density != s->density) {
    if ((rc = tide_compressor_set_density(s->compressor, density)) != 0) return rc;
    s->density = density;
  }
  /* The statistics travel densely, the gradient sparsely. */
  if ((rc = tide_allreduce(tr->comm, tr->exchange + tr->nparams, tr->exchange + tr->nparams, tr->nslots, TIDE_F32,
                           TIDE_SUM)) != 0)
    return tide__trainer_fail(tr, rc, "statistics allreduce: %s", tide_comm_last_error(tr->comm));
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

const tide__exchange_ops_t tide__exchanges[TIDE_EXCHANGE_COUNT] = {
    [TIDE_EXCHANGE_DENSE] = {"dense", dense_open, dense_run, dense_close, no_compressor},
    [TIDE_EXCHANGE_TOPK] = {"topk", topk_open, sparse_run, sparse_close, sparse_compressor},
    [TIDE_EXCHANGE_HITOPK] = {"hitopk", hitopk_open, sparse_run, sparse_close, sparse_compressor},
};
