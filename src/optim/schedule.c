/* Learning-rate schedules: pure functions of the step, so every rank (and a
 * rank that joins an elastic job late) computes the same rate from the same
 * step or progress count. Computed in double, returned as float. */
#include <math.h>
#include <strings.h>

#include "core/core.h"

static const double pi = 3.14159265358979323846;

static const char *const lr_names[TIDE_LR_KIND_COUNT] = {"constant", "step", "cosine", "poly"};

TIDE__NAMED_ENUM(lr, tide_lr_kind_t, "learning-rate schedule", lr_names, TIDE_LR_KIND_COUNT)

/* The first field of s that is out of range, with its allowed range in
 * *why; NULL when s is valid. Logs nothing, so tide_lr_at can use it. */
static const char *invalid_field(const tide_lr_schedule_t *s, const char **why) {
  if ((unsigned)s->kind >= TIDE_LR_KIND_COUNT) {
    *why = "must be a TIDE_LR_* value";
    return "kind";
  }
  if (!(s->base_lr >= 0.0f && s->base_lr < INFINITY)) {
    *why = "must be finite and >= 0";
    return "base_lr";
  }
  if (s->warmup_steps < 0) {
    *why = "must be >= 0";
    return "warmup_steps";
  }
  if (!(s->warmup_start_factor >= 0.0f && s->warmup_start_factor <= 1.0f)) {
    *why = "must be in [0, 1]";
    return "warmup_start_factor";
  }
  switch (s->kind) {
    case TIDE_LR_STEP:
      if (s->step_size <= 0) {
        *why = "must be > 0";
        return "step_size";
      }
      if (!(s->gamma > 0.0f && s->gamma <= 1.0f)) {
        *why = "must be in (0, 1]";
        return "gamma";
      }
      break;
    case TIDE_LR_POLY:
      if (!(s->power > 0.0f && s->power < INFINITY)) {
        *why = "must be finite and > 0";
        return "power";
      }
      break;
    default:
      break;
  }
  if (s->kind == TIDE_LR_COSINE || s->kind == TIDE_LR_POLY) {
    if (s->total_steps <= s->warmup_steps) {
      *why = "must be > warmup_steps (the decay needs at least one step)";
      return "total_steps";
    }
    if (!(s->final_lr >= 0.0f && s->final_lr <= s->base_lr)) {
      *why = "must be in [0, base_lr]";
      return "final_lr";
    }
  }
  return NULL;
}

int tide_lr_check(const tide_lr_schedule_t *s) {
  if (s == NULL) return tide__null_arg("tide_lr_check", "s");
  const char *why = NULL;
  const char *field = invalid_field(s, &why);
  if (field == NULL) return 0;
  TIDE_ERROR("learning-rate schedule %s: %s %s (base_lr=%g warmup_steps=%ld "
             "warmup_start_factor=%g total_steps=%ld step_size=%ld gamma=%g power=%g "
             "final_lr=%g)",
             tide_lr_name(s->kind), field, why, (double)s->base_lr, s->warmup_steps,
             (double)s->warmup_start_factor, s->total_steps, s->step_size, (double)s->gamma,
             (double)s->power, (double)s->final_lr);
  return TIDE_EINVAL;
}

float tide_lr_at(const tide_lr_schedule_t *s, long step) {
  const char *why;
  if (s == NULL || step < 0 || invalid_field(s, &why) != NULL) return NAN;
  double base = s->base_lr, final = s->final_lr;
  if (step < s->warmup_steps) {
    double f = s->warmup_start_factor;
    return (float)(base * (f + (1.0 - f) * (double)step / (double)s->warmup_steps));
  }
  double progress = 0.0;
  if (s->kind == TIDE_LR_COSINE || s->kind == TIDE_LR_POLY) {
    progress = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    if (progress > 1.0) progress = 1.0;
  }
  switch (s->kind) {
    case TIDE_LR_STEP:
      return (float)(base * pow((double)s->gamma, (double)(step / s->step_size)));
    case TIDE_LR_COSINE:
      return (float)(final + (base - final) * 0.5 * (1.0 + cos(pi * progress)));
    case TIDE_LR_POLY:
      return (float)(final + (base - final) * pow(1.0 - progress, (double)s->power));
    default:
      return (float)base;
  }
}

int tide_lr_schedule_from_epochs(tide_lr_kind_t kind, float base_lr, float final_lr, double epochs,
                                 double warmup_epochs, size_t dataset_size, long base_batch,
                                 tide_lr_schedule_t *out) {
  static const char fn[] = "tide_lr_schedule_from_epochs";
  if (out == NULL) return tide__null_arg(fn, "out");
  if (!(epochs > 0.0 && epochs < 1e9)) {
    TIDE_ERROR("%s: epochs %g must be finite and > 0", fn, epochs);
    return TIDE_EINVAL;
  }
  if (!(warmup_epochs >= 0.0 && warmup_epochs < 1e9)) {
    TIDE_ERROR("%s: warmup_epochs %g must be finite and >= 0", fn, warmup_epochs);
    return TIDE_EINVAL;
  }
  if (dataset_size == 0 || base_batch <= 0) {
    TIDE_ERROR("%s: dataset_size (%zu) and base_batch (%ld) must be > 0", fn, dataset_size, base_batch);
    return TIDE_EINVAL;
  }
  long per_epoch = (long)((dataset_size + (size_t)base_batch - 1) / (size_t)base_batch);
  tide_lr_schedule_t s = {.kind = kind, .base_lr = base_lr, .final_lr = final_lr, .gamma = 0.1f, .power = 1.0f};
  s.warmup_steps = (long)floor(warmup_epochs * (double)per_epoch);
  s.total_steps = (long)ceil(epochs * (double)per_epoch);
  long every = (long)floor(epochs / 3.0);
  s.step_size = per_epoch * (every > 1 ? every : 1);
  if ((kind == TIDE_LR_COSINE || kind == TIDE_LR_POLY) && s.warmup_steps >= s.total_steps) {
    TIDE_ERROR("%s: warmup_epochs (%g) must be less than epochs (%g): the %s decay needs a step after the warm-up",
               fn, warmup_epochs, epochs, tide_lr_name(kind));
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide_lr_check(&s));
  *out = s;
  return 0;
}
