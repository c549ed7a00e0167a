/* The trainer's checkpoint format (tide_trainer_state_*): a fixed header,
 * the per-tensor noise-scale averages, each policy's state, the optimizer's
 * state (gathered from the shards under PTO), the exchange's error-feedback
 * residual and K-FAC's part. Everything a rank needs to resume the same
 * step sequence; the caller writes the bytes where it likes. */
#include <string.h>

#include "train/train.h"

enum { STATE_MAGIC = 0x54524e32 /* "TRN2" */ };

typedef struct {
  uint32_t magic, ntensors;
  uint64_t nparams, dataset_size, epoch, position;
  int64_t step, base_batch;
  double progress, prev_exchange_s, prev_step_s;
  int32_t batch, accum, exchange, npolicies;
  tide__gns_t gns;
  uint64_t optim_bytes, residual_len, kfac_len;
} state_header_t;

static size_t policy_bytes(const tide_trainer_t *tr) {
  size_t n = 0;
  for (size_t i = 0; i < tr->npolicies; i++) n += sizeof(uint64_t) + tr->policies[i].ops.state_size;
  return n;
}

static const float *residual_of(const tide_trainer_t *tr, size_t *len) {
  void *state = tr->exchange_state[tr->exchange_kind];
  tide_compressor_t *c = state != NULL ? tide__exchanges[tr->exchange_kind].compressor(state) : NULL;
  if (c != NULL) {
    *len = tide_compressor_size(c);
    return tide_compressor_residual(c);
  }
  *len = tr->pending_residual != NULL ? tr->pending_len : 0;
  return tr->pending_residual;
}

size_t tide_trainer_state_size(const tide_trainer_t *tr) {
  if (tr == NULL) return 0;
  size_t residual;
  residual_of(tr, &residual);
  return sizeof(state_header_t) + tr->ntensors * sizeof(tide__gns_t) + policy_bytes(tr) +
         tide_optim_state_size(tr->optim) + (residual + tide__kfac_state_floats(tr->kfac)) * sizeof(float);
}

int tide_trainer_state_get(const tide_trainer_t *tr, void *buf, size_t len) {
  if (tr == NULL || buf == NULL) {
    TIDE_ERROR("tide_trainer_state_get: trainer and buf must not be NULL");
    return TIDE_EINVAL;
  }
  if (tr->in_step) {
    TIDE_ERROR("tide_trainer_state_get: a step is half accumulated; save between steps");
    return TIDE_ESTATE;
  }
  size_t need = tide_trainer_state_size(tr), residual_len;
  if (len < need) {
    TIDE_ERROR("tide_trainer_state_get: len %zu is below tide_trainer_state_size's %zu", len, need);
    return TIDE_EINVAL;
  }
  const float *residual = residual_of(tr, &residual_len);
  state_header_t h = {STATE_MAGIC, (uint32_t)tr->ntensors, tr->nparams, tr->config.dataset_size, tr->epoch,
                      tr->position, tr->step, tr->config.base_batch, tr->progress, tr->monitor.prev_exchange_s,
                      tr->monitor.prev_step_s, tr->batch, tr->accum, tr->exchange_kind, (int32_t)tr->npolicies,
                      tr->monitor.gns,
                      tide_optim_state_size(tr->optim), residual_len, tide__kfac_state_floats(tr->kfac)};
  char *p = buf;
  memcpy(p, &h, sizeof h);
  p += sizeof h;
  memcpy(p, tr->monitor.tensor_gns, tr->ntensors * sizeof *tr->monitor.tensor_gns);
  p += tr->ntensors * sizeof *tr->monitor.tensor_gns;
  for (size_t i = 0; i < tr->npolicies; i++) {
    uint64_t n = tr->policies[i].ops.state_size;
    memcpy(p, &n, sizeof n);
    p += sizeof n;
    if (n) memcpy(p, tr->policies[i].state, n);
    p += n;
  }
  TIDE_CHECK(tide_optim_state_get(tr->optim, p, h.optim_bytes));
  TIDE_CHECK(tide__pto_gather_state(tr, p));
  p += h.optim_bytes;
  if (residual_len) memcpy(p, residual, residual_len * sizeof(float));
  p += residual_len * sizeof(float);
  return tide__kfac_state_get(tr, p);
}

int tide_trainer_state_set(tide_trainer_t *tr, const void *buf, size_t len) {
  if (tr == NULL || buf == NULL) {
    TIDE_ERROR("tide_trainer_state_set: trainer and buf must not be NULL");
    return TIDE_EINVAL;
  }
  state_header_t h;
  if (len < sizeof h) goto bad;
  memcpy(&h, buf, sizeof h);
  if (h.magic != STATE_MAGIC || h.nparams != tr->nparams || h.ntensors != tr->ntensors ||
      h.dataset_size != tr->config.dataset_size || h.base_batch != tr->config.base_batch ||
      h.npolicies != (int32_t)tr->npolicies || h.exchange < 0 || h.exchange >= TIDE_EXCHANGE_COUNT ||
      h.batch < 1 || h.accum < 1 || h.position > h.dataset_size)
    goto bad;
  const char *p = (const char *)buf + sizeof h;
  size_t need = sizeof h + tr->ntensors * sizeof(tide__gns_t) + policy_bytes(tr) + h.optim_bytes +
                (h.residual_len + h.kfac_len) * sizeof(float);
  if (len < need) goto bad;
  const char *kfac = p + need - sizeof h - h.kfac_len * sizeof(float);
  const char *why = tide__kfac_state_check(tr->kfac, kfac, h.kfac_len);
  if (why != NULL) {
    TIDE_ERROR("tide_trainer_state_set: %s", why);
    return TIDE_EINVAL;
  }
  const char *policies = p + tr->ntensors * sizeof(tide__gns_t), *q = policies;
  for (size_t i = 0; i < tr->npolicies; i++) {
    uint64_t n;
    memcpy(&n, q, sizeof n);
    if (n != tr->policies[i].ops.state_size) goto bad;
    q += sizeof n + n;
  }
  /* The optimizer checks its own part before anything changes. */
  int rc = tide_optim_state_set(tr->optim, q, h.optim_bytes);
  if (rc != 0) return rc;
  float *residual = NULL;
  if (h.residual_len) {
    residual = tide__malloc(h.residual_len * sizeof *residual);
    if (residual == NULL) return TIDE_ENOMEM;
    memcpy(residual, q + h.optim_bytes, h.residual_len * sizeof *residual);
  }
  memcpy(tr->monitor.tensor_gns, p, tr->ntensors * sizeof *tr->monitor.tensor_gns);
  tide__kfac_state_set(tr->kfac, kfac, h.kfac_len);
  q = policies;
  for (size_t i = 0; i < tr->npolicies; i++) {
    uint64_t n;
    memcpy(&n, q, sizeof n);
    q += sizeof n;
    if (n) memcpy(tr->policies[i].state, q, n);
    q += n;
  }
  tr->epoch = h.epoch;
  tr->position = h.position;
  tr->step = h.step;
  tr->progress = h.progress;
  tr->monitor.prev_exchange_s = h.prev_exchange_s;
  tr->monitor.prev_step_s = h.prev_step_s;
  tr->batch = h.batch;
  tr->accum = h.accum;
  tr->monitor.gns = h.gns;
  tr->in_step = 0;
  /* Exchanges are reopened (collectively) at the next step; the residual
   * waits for it. */
  tide__exchange_close_all(tr);
  tr->exchange_kind = (tide_exchange_t)h.exchange;
  tide__trainer_drop_residual(tr);
  tr->pending_residual = residual;
  tr->pending_len = h.residual_len;
  tr->stats.step = tr->step;
  tr->stats.progress = tr->progress;
  tr->stats.batch = tr->batch;
  tr->stats.accum = tr->accum;
  tr->stats.planned_batch = tide__trainer_planned_batch(tr);
  tr->stats.exchange = tr->exchange_kind;
  return tide_sampler_set_epoch(tr->sampler, tr->epoch);
bad:
  TIDE_ERROR("tide_trainer_state_set: the state (%zu bytes) is not from a trainer with this config, %zu parameters "
             "and these %zu policies",
             len, tr->nparams, tr->npolicies);
  return TIDE_EINVAL;
}

void tide__trainer_drop_residual(tide_trainer_t *tr) {
  tide__free(tr->pending_residual);
  tr->pending_residual = NULL;
  tr->pending_len = 0;
}
