/* A job's speedup function for the cluster scheduler (Pollux, Qiao et al.,
 * OSDI 2021): the best goodput the job's own optimiser finds on an
 * allocation (tide_pollux_optimize, the agent's), over the best on one
 * slot. Evaluations are memoised in a small open-addressing table keyed
 * by (nodes, slots): the allocator asks for the same few sizes millions of
 * times. */
#include <math.h>

#include "core/core.h"

/* Exploration: slots beyond EXPLORE x the largest allocation the job has
 * been measured on count as that many (the fit's extrapolation is trusted
 * that far). Pollux's paper uses 2; 4 spends fewer 30 s restarts on a new
 * job's way up (1, 4, 16, 64) and gave the lowest average JCT of 2, 3, 4
 * and 8 at every load of the paper's workloads (docs/scheduling.md). */
#define EXPLORE 4

struct tide_speedup {
  tide_sched_hints_t hints;
  double phi, base;
  int cap;
  /* keys[i] = nodes << 32 | slots, 0 = empty */
  uint64_t *keys;
  double *values;
  size_t size, used;
};

int tide_speedup_create(const tide_sched_hints_t *hints, tide_speedup_t **out) {
  if (hints == NULL || out == NULL) return tide__null_arg("tide_speedup_create", "hints or out");
  if (hints->max_replicas_seen < 0) {
    TIDE_ERROR("speedup: max_replicas_seen %d is negative", hints->max_replicas_seen);
    return TIDE_EINVAL;
  }
  tide_speedup_t sp = {.hints = *hints};
  sp.cap = hints->max_replicas_seen > 0 ? EXPLORE * hints->max_replicas_seen : 1;
  if (hints->fitted) {
    tide_pollux_choice_t one;
    if (!(hints->grad_sqr > 0) || !(hints->grad_var >= 0)) {
      TIDE_ERROR("speedup: grad_sqr %g must be > 0 and grad_var %g >= 0", hints->grad_sqr, hints->grad_var);
      return TIDE_EINVAL;
    }
    sp.phi = hints->limits.base_batch * hints->grad_var / hints->grad_sqr;
    int rc = tide_pollux_optimize(&hints->model, &hints->limits, 1, 1, sp.phi, &one);
    if (rc != 0 || !(one.goodput > 0)) {
      TIDE_ERROR("speedup: the hints' model or limits give no goodput on one slot (base %g, max %g, atomic "
                 "[%g, %g], passes %d)",
                 hints->limits.base_batch, hints->limits.max_batch, hints->limits.min_atomic,
                 hints->limits.max_atomic, hints->limits.max_passes);
      return TIDE_EINVAL;
    }
    sp.base = one.goodput;
  }
  tide_speedup_t *s = tide__malloc(sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  *s = sp;
  s->size = 64;
  s->keys = tide__calloc(s->size, sizeof *s->keys);
  s->values = tide__malloc(s->size * sizeof *s->values);
  if (s->keys == NULL || s->values == NULL) {
    tide_speedup_destroy(s);
    return TIDE_ENOMEM;
  }
  *out = s;
  return 0;
}

void tide_speedup_destroy(tide_speedup_t *sp) {
  if (sp == NULL) return;
  tide__free(sp->keys);
  tide__free(sp->values);
  tide__free(sp);
}

int tide_speedup_max_slots(const tide_speedup_t *sp) { return sp == NULL ? 0 : sp->cap; }

static size_t slot_of(uint64_t key, size_t size) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return (size_t)key & (size - 1);
}

static int grow(tide_speedup_t *sp) {
  size_t size = sp->size * 2;
  uint64_t *keys = tide__calloc(size, sizeof *keys);
  double *values = tide__malloc(size * sizeof *values);
  if (keys == NULL || values == NULL) {
    tide__free(keys);
    tide__free(values);
    return TIDE_ENOMEM;
  }
  for (size_t i = 0; i < sp->size; i++) {
    if (sp->keys[i] == 0) continue;
    size_t at = slot_of(sp->keys[i], size);
    while (keys[at] != 0) at = (at + 1) & (size - 1);
    keys[at] = sp->keys[i];
    values[at] = sp->values[i];
  }
  tide__free(sp->keys);
  tide__free(sp->values);
  sp->keys = keys;
  sp->values = values;
  sp->size = size;
  return 0;
}

double tide_speedup_eval(tide_speedup_t *sp, int nodes, int slots) {
  if (sp == NULL || slots < 1 || nodes < 1 || nodes > slots) return 0;
  if (slots > sp->cap) slots = sp->cap;
  if (nodes > slots) nodes = slots;
  if (!sp->hints.fitted) return slots;
  uint64_t key = (uint64_t)nodes << 32 | (uint64_t)slots;
  size_t at = slot_of(key, sp->size);
  while (sp->keys[at] != 0) {
    if (sp->keys[at] == key) return sp->values[at];
    at = (at + 1) & (sp->size - 1);
  }
  tide_pollux_choice_t best;
  double v = 0;
  if (tide_pollux_optimize(&sp->hints.model, &sp->hints.limits, nodes, slots, sp->phi, &best) == 0)
    v = best.goodput / sp->base;
  if (!(v > 0) || !isfinite(v)) v = 1e-9; /* an allocation the limits rule out */
  if ((sp->used + 1) * 2 > sp->size && grow(sp) != 0) return v;
  at = slot_of(key, sp->size);
  while (sp->keys[at] != 0) at = (at + 1) & (sp->size - 1);
  sp->keys[at] = key;
  sp->values[at] = v;
  sp->used++;
  return v;
}

double tide_speedup_cb(void *sp, int nodes, int slots) { return tide_speedup_eval(sp, nodes, slots); }
