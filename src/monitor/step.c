/* The trainer's step statistics (step.h): this rank's sums, their slots in
 * the exchange, and the noise scale, gain ratio and compute spread made of
 * the ranks' sum. */
#include <math.h>
#include <string.h>

#include "monitor/step.h"

int tide__step_monitor_init(tide__step_monitor_t *m, int ranks, size_t ntensors, int tensor_stats) {
  memset(m, 0, sizeof *m);
  m->ntensors = ntensors;
  m->tensor_stats = tensor_stats;
  m->tensor_sq = tide__calloc(ntensors, sizeof *m->tensor_sq);
  m->tensor_gns = tide__calloc(ntensors, sizeof *m->tensor_gns);
  if (m->tensor_sq == NULL || m->tensor_gns == NULL) return TIDE_ENOMEM;
  return tide__step_monitor_resize(m, ranks);
}

int tide__step_monitor_resize(tide__step_monitor_t *m, int ranks) {
  tide__free(m->times);
  tide__free(m->scratch);
  m->ranks = ranks;
  m->nslots = TIDE__SLOT_TIMES + (size_t)ranks + (m->tensor_stats ? m->ntensors : 0);
  m->times = tide__calloc((size_t)ranks, sizeof *m->times);
  m->scratch = tide__calloc((size_t)ranks, sizeof *m->scratch);
  return m->times == NULL || m->scratch == NULL ? TIDE_ENOMEM : 0;
}

void tide__step_monitor_fini(tide__step_monitor_t *m) {
  tide__free(m->tensor_sq);
  tide__free(m->tensor_gns);
  tide__free(m->times);
  tide__free(m->scratch);
  m->tensor_sq = m->times = m->scratch = NULL;
  m->tensor_gns = NULL;
}

void tide__step_monitor_begin(tide__step_monitor_t *m) {
  m->sq_micro = m->full_micro = m->count = m->loss_sum = m->compute_s = 0;
  memset(m->tensor_sq, 0, m->ntensors * sizeof *m->tensor_sq);
}

void tide__step_monitor_micro(tide__step_monitor_t *m, double count, double loss, double sq, int full) {
  if (full) {
    m->sq_micro += sq;
    m->full_micro += 1;
  }
  m->count += count;
  m->loss_sum += loss * count;
}

void tide__step_monitor_pack(const tide__step_monitor_t *m, float *slots, int rank, float guard) {
  memset(slots, 0, m->nslots * sizeof *slots);
  slots[TIDE__SLOT_COUNT] = (float)m->count;
  slots[TIDE__SLOT_LOSS] = (float)m->loss_sum;
  slots[TIDE__SLOT_SQ_MICRO] = (float)m->sq_micro;
  slots[TIDE__SLOT_FULL_MICRO] = (float)m->full_micro;
  slots[TIDE__SLOT_EXCHANGE_S] = (float)m->prev_exchange_s;
  slots[TIDE__SLOT_STEP_S] = (float)m->prev_step_s;
  slots[TIDE__SLOT_GUARD] = guard;
  slots[TIDE__SLOT_TIMES + rank] = (float)m->compute_s;
  float *tensor_slots = slots + TIDE__SLOT_TIMES + m->ranks;
  if (m->tensor_stats)
    for (size_t t = 0; t < m->ntensors; t++) tensor_slots[t] = (float)m->tensor_sq[t];
}

void tide__step_monitor_read(tide__step_monitor_t *m, const float *slots, const tide__step_read_t *in,
                             tide_step_stats_t *s) {
  double total = slots[TIDE__SLOT_COUNT], base = in->base_batch, scale = total / base;
  double micro_total = slots[TIDE__SLOT_FULL_MICRO], keep = pow(in->gns_decay, scale);
  const float *tensor_slots = slots + TIDE__SLOT_TIMES + m->ranks;
  if (!in->combined && micro_total >= 2 && micro_total == (double)m->ranks * in->accum) {
    tide__gns_update(&m->gns, in->batch, micro_total, slots[TIDE__SLOT_SQ_MICRO] / micro_total, in->sq_big, keep);
    if (m->tensor_stats)
      for (size_t t = 0; t < m->ntensors; t++)
        tide__gns_update(&m->tensor_gns[t], in->batch, micro_total, tensor_slots[t] / micro_total, m->tensor_sq[t],
                         keep);
  }
  for (int r = 0; r < m->ranks; r++) m->times[r] = slots[TIDE__SLOT_TIMES + r];
  tide__spread(m->times, m->ranks, m->scratch, &s->compute_min_s, &s->compute_median_s, &s->compute_max_s,
               &s->slowest_rank);
  s->comm_share = slots[TIDE__SLOT_STEP_S] > 0 ? slots[TIDE__SLOT_EXCHANGE_S] / slots[TIDE__SLOT_STEP_S] : NAN;
  s->mean_step_s = slots[TIDE__SLOT_STEP_S] / m->ranks;
  s->global_batch = (long)total;
  s->loss = slots[TIDE__SLOT_LOSS] / total;
  s->scale = scale;
  s->grad_sq = tide__gns_grad_sq(&m->gns);
  s->trace_sigma = tide__gns_trace_sigma(&m->gns);
  s->noise_scale = tide__gns_noise_scale(&m->gns);
  s->gain_ratio = isnan(s->grad_sq) ? 1.0 : tide_adascale_gain(s->trace_sigma / base, s->grad_sq, scale < 1 ? 1 : scale);
  s->compute_s = m->compute_s;
}

void tide__step_monitor_end(tide__step_monitor_t *m, double exchange_s, double step_s) {
  m->prev_exchange_s = exchange_s;
  m->prev_step_s = step_s;
}

int tide__straggler_update(double *ewma, const double *times, int ranks, double median, double alpha,
                           double threshold) {
  int worst = -1;
  for (int r = 0; r < ranks; r++) {
    double t = times[r], ratio = t > 0 ? median / t : 1;
    ewma[r] = (1 - alpha) * ewma[r] + alpha * ratio;
    if (r != 0 && ewma[r] < threshold && (worst < 0 || ewma[r] < ewma[worst])) worst = r;
  }
  return worst;
}
