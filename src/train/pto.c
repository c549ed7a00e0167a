/* The parallel tensor operation (PTO, Shi et al. MLSys 2021, in ZeRO stage
 * 1's arrangement): each rank updates one shard of the parameters and keeps
 * optimizer state for it alone, then the parameters are all-gathered
 * (docs/algorithms.md, "PTO").
 *
 * The shards are the blocks of the dense exchange's ring allreduce over
 * [gradient | statistics slots], cut at the gradient's end. The dense
 * exchange under PTO is the first half of that allreduce, a reduce-scatter
 * of the same buffer, so every gradient element is summed in the same order
 * as the replicated step's ring: with the element-wise optimizers the
 * parameters match the replicated run bit for bit whenever its allreduce
 * takes the ring. The sparse exchanges leave the whole gradient on every
 * rank; PTO then shards only the update. */
#include <math.h>
#include <string.h>

#include "core/simd.h"
#include "train/train.h"

int tide__pto_supports(int exchange) {
  return exchange == TIDE_EXCHANGE_DENSE || exchange == TIDE_EXCHANGE_TOPK || exchange == TIDE_EXCHANGE_HITOPK;
}

/* LARS and LAMB: per-tensor partial norms summed over the ranks. The
 * allreduce hands every rank the same bits, so the pieces of a tensor cut
 * by a shard end get the same trust ratio. */
static int sum_over_ranks(double *values, size_t count, void *arg) {
  tide_trainer_t *tr = arg;
  int rc = tide_allreduce(tr->comm, values, values, count, TIDE_F64, TIDE_SUM);
  if (rc != 0) return tide__trainer_fail(tr, rc, "PTO: allreduce of per-tensor norms: %s", tide_comm_last_error(tr->comm));
  return 0;
}

int tide__pto_optim_create(tide_trainer_t *tr, const tide_tensor_t *tensors, size_t ntensors) {
  if (!tr->config.pto || tr->ranks == 1)
    return tide_optim_create(&tr->config.optim, tensors, ntensors, tr->nparams, &tr->optim);
  int n = tr->ranks;
  tr->pto = 1;
  tr->shard_counts = tide__calloc((size_t)n, sizeof *tr->shard_counts);
  if (tr->shard_counts == NULL) return TIDE_ENOMEM;
  size_t total = tr->nparams + tr->monitor.nslots;
  for (int r = 0; r < n; r++) {
    size_t off, len;
    tide_block(total, n, r, &off, &len);
    size_t lo = off < tr->nparams ? off : tr->nparams, hi = off + len < tr->nparams ? off + len : tr->nparams;
    tr->shard_counts[r] = hi - lo;
    if (r == tr->rank) {
      tr->shard_offset = lo;
      tr->shard_len = hi - lo;
      tr->block_len = len;
    }
  }
  tide_optim_shard_t shard = {tr->shard_offset, tr->shard_len, sum_over_ranks, tr};
  return tide_optim_create_shard(&tr->config.optim, tensors, ntensors, tr->nparams, &shard, &tr->optim);
}

void tide__pto_close(tide_trainer_t *tr) {
  tide__free(tr->shard_counts);
  tr->shard_counts = NULL;
  tr->shard_offset = tr->shard_len = tr->block_len = 0; /* the update then steps the whole gradient */
}

int tide__pto_reshard(tide_trainer_t *tr) {
  tide_optim_destroy(tr->optim);
  tr->optim = NULL;
  tide__pto_close(tr);
  tr->pto = 0;
  return tide__pto_optim_create(tr, tr->tensors, tr->ntensors);
}

/* The PTO row's state: this rank's block of the reduce-scatter and the
 * per-tensor partial |G|^2 of its shard. */
typedef struct {
  float *shard_grad;
  double *shard_sq;
} pto_row_t;

void tide__pto_row_close(void *state) {
  pto_row_t *p = state;
  if (p == NULL) return;
  tide__free(p->shard_grad);
  tide__free(p->shard_sq);
  tide__free(p);
}

int tide__pto_open(tide_trainer_t *tr, void **state) {
  pto_row_t *p = tide__calloc(1, sizeof *p);
  if (p == NULL) return TIDE_ENOMEM;
  p->shard_grad = tide__malloc((tr->block_len ? tr->block_len : 1) * sizeof *p->shard_grad);
  p->shard_sq = tide__calloc(tr->ntensors, sizeof *p->shard_sq);
  if (p->shard_grad == NULL || p->shard_sq == NULL) {
    tide__pto_row_close(p);
    return TIDE_ENOMEM;
  }
  *state = p;
  return 0;
}

/* PTO's row, whose mean is one shard, has no precondition stage: with
 * K-FAC on (it needs the whole averaged gradient on every rank) the dense
 * exchange keeps its own row and PTO shards only the update. */
int tide__exchange_row(const tide_trainer_t *tr) {
  int row = tr->pto && tr->exchange_kind == TIDE_EXCHANGE_DENSE ? TIDE__EXCHANGE_PTO : (int)tr->exchange_kind;
  return tr->kfac != NULL && tide__exchanges[row].precondition == NULL ? (int)tr->exchange_kind : row;
}

int tide__pto_reduce(tide_trainer_t *tr, void *state) {
  pto_row_t *p = state;
  float *slots = tr->exchange + tr->nparams;
  size_t nslots = tr->monitor.nslots;
  int rc = tide_allreduce(tr->comm, slots, slots, nslots, TIDE_F32, TIDE_SUM);
  if (rc != 0) return tide__trainer_fail(tr, rc, "PTO: statistics allreduce: %s", tide_comm_last_error(tr->comm));
  /* Every rank sees a diverged loss and stops (tide_trainer_step says why). */
  if (!isfinite(slots[TIDE__SLOT_LOSS])) return 0;
  /* The statistics ride along (summed again in the last block, unused) so
   * that the blocks are the replicated allreduce's. */
  rc = tide_reduce_scatter(tr->comm, tr->exchange, p->shard_grad, tr->nparams + nslots, TIDE_F32, TIDE_SUM);
  if (rc != 0) return tide__trainer_fail(tr, rc, "PTO: gradient reduce-scatter: %s", tide_comm_last_error(tr->comm));
  return 0;
}

int tide__pto_average(tide_trainer_t *tr, void *state, double total, tide__mean_t *mean) {
  pto_row_t *p = state;
  float inv = (float)(1.0 / total);
  size_t lo = tr->shard_offset, hi = lo + tr->shard_len;
  for (size_t t = 0; t < tr->ntensors; t++) {
    size_t a = tr->tensors[t].offset, b = a + tr->tensors[t].count;
    a = a > lo ? a : lo;
    b = b < hi ? b : hi;
    p->shard_sq[t] = b > a ? tide__scale_in_place(p->shard_grad + (a - lo), b - a, inv) : 0;
  }
  int rc = tide_allreduce(tr->comm, p->shard_sq, p->shard_sq, tr->ntensors, TIDE_F64, TIDE_SUM);
  if (rc != 0) return tide__trainer_fail(tr, rc, "PTO: allreduce of |G|^2: %s", tide_comm_last_error(tr->comm));
  double *tensor_sq = tr->config.tensor_stats ? tr->monitor.tensor_sq : NULL, sq = 0;
  for (size_t t = 0; t < tr->ntensors; t++) {
    if (tensor_sq != NULL) tensor_sq[t] = p->shard_sq[t];
    sq += p->shard_sq[t];
  }
  *mean = (tide__mean_t){p->shard_grad, sq, 0, NULL};
  return 0;
}

int tide__pto_gather_params(tide_trainer_t *tr, double *seconds) {
  int64_t t0 = tide__now_ns();
  int rc = tide_allgatherv(tr->comm, tr->params + tr->shard_offset, tr->shard_len, tr->params, tr->shard_counts,
                           TIDE_F32);
  if (rc != 0) return tide__trainer_fail(tr, rc, "PTO: parameter all-gather: %s", tide_comm_last_error(tr->comm));
  *seconds += (double)(tide__now_ns() - t0) * 1e-9;
  return 0;
}

int tide__pto_gather_state(const tide_trainer_t *tr, void *optim_blob) {
  if (!tr->pto) return 0;
  size_t first;
  int nbuffers;
  TIDE_CHECK(tide_optim_state_layout(tr->optim, &first, &nbuffers, NULL, NULL));
  for (int b = 0; b < nbuffers; b++) {
    char *buffer = (char *)optim_blob + first + (size_t)b * tr->nparams * sizeof(float);
    int rc = tide_allgatherv(tr->comm, buffer + tr->shard_offset * sizeof(float), tr->shard_len, buffer,
                             tr->shard_counts, TIDE_F32);
    if (rc != 0) {
      TIDE_ERROR("tide_trainer_state_get: gathering the optimizer's shards: %s", tide_comm_last_error(tr->comm));
      return rc;
    }
  }
  return 0;
}

size_t tide_trainer_optim_bytes(const tide_trainer_t *tr) {
  if (tr == NULL) return 0;
  int nbuffers;
  size_t count;
  if (tide_optim_state_layout(tr->optim, NULL, &nbuffers, NULL, &count) != 0) return 0;
  return (size_t)nbuffers * count * sizeof(float);
}
