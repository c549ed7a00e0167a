/* Built-in policies (docs/adaptation.md, "Policies"): AdaScale, noise-scale
 * batch sizing, the exchange switch, elastic autoscaling, and Pollux
 * (pollux.c). Each reads the
 * all-reduced statistics every rank has, so every rank decides the same. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

enum { MAX_KEYS = 8 };

int tide__policy_number(const char *policy, const char *key, const char *text, double min, double max,
                        double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end || !(v >= min && v <= max)) {
    TIDE_ERROR("policy %s: %s=%s: give a number in [%g, %g]", policy, key, text, min, max);
    return TIDE_EINVAL;
  }
  *out = v;
  return 0;
}

static int unknown_key(const char *policy, const char *key, const char *known) {
  TIDE_ERROR("policy %s: unknown key '%s' (its keys: %s)", policy, key, known);
  return TIDE_EINVAL;
}

static int is_adam(tide_optim_kind_t k) { return k == TIDE_OPTIM_ADAM || k == TIDE_OPTIM_ADAMW || k == TIDE_OPTIM_LAMB; }

typedef int (*hook_cb)(void *state, const tide_step_stats_t *stats, tide_decision_t *decision);

/* Hands out a policy that decides before each step: its state, copied to
 * the heap (the trainer owns it from then on), and its hooks. */
static int with_before_step(const char *name, hook_cb before_step, const void *state, size_t size,
                            tide_policy_ops_t *ops, void **out) {
  void *p = tide__malloc(size);
  if (p == NULL) return TIDE_ENOMEM;
  memcpy(p, state, size);
  *ops = (tide_policy_ops_t){.name = name, .before_step = before_step, .destroy = tide__free, .state_size = size};
  *out = p;
  return 0;
}

/* ---- adascale --------------------------------------------------------------- */

/* AdaScale (Johnson et al. 2020): the step's learning rate is the schedule's
 * times the gain ratio r (r^0.5 for the Adam family, as AdaptDL), and the
 * step counts for r base-batch steps of progress. Before the monitor has an
 * estimate r is 1: a warm-up. */
typedef struct {
  int adam;
} adascale_t;

static int adascale_update(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  const adascale_t *a = state;
  double r = s->gain_ratio;
  if (!(r >= 1)) r = 1;
  /* A short last step of an epoch: its scale, not the plan's. */
  if (r > s->scale && s->scale >= 1) r = s->scale;
  d->lr_factor = a->adam ? sqrt(r) : r;
  d->gain = r;
  return 0;
}

static int adascale_create(int n, const char *const *keys, const tide__policy_env_t *env, tide_policy_ops_t *ops,
                           void **state) {
  if (n > 0) return unknown_key("adascale", keys[0], "none");
  adascale_t *a = tide__calloc(1, sizeof *a);
  if (a == NULL) return TIDE_ENOMEM;
  a->adam = is_adam(env->optim);
  *ops = (tide_policy_ops_t){.name = "adascale", .before_update = adascale_update, .destroy = tide__free,
                             .state_size = sizeof *a};
  *state = a;
  return 0;
}

/* ---- gns: batch size from the noise scale ----------------------------------- */

/* McCandlish et al.: the critical batch is about the noise scale B_simple,
 * and it grows as the loss falls. Every `every` steps (after `warmup`
 * steps with estimates) the global batch moves towards factor * B_simple,
 * within [base batch, max], growing by at most `growth` per decision and
 * never shrinking; changes under 10% are not made. */
typedef struct {
  double max, factor, growth;
  long every, warmup;
  long target;
} gns_t;

static int gns_before_step(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  gns_t *g = state;
  if (s->step < g->warmup || s->step % g->every != 0 || !isfinite(s->noise_scale)) return 0;
  double current = (double)s->planned_batch, want = g->factor * s->noise_scale;
  if (want > current * g->growth) want = current * g->growth;
  if (want > g->max) want = g->max;
  if (want < current * 1.1) return 0;
  g->target = (long)want;
  d->global_batch = g->target;
  return 0;
}

static int gns_create(int n, const char *const *keys, const char *const *values, const tide__policy_env_t *env,
                      tide_policy_ops_t *ops, void **state) {
  double cap = (double)env->ranks * env->max_batch * env->max_accum;
  gns_t g = {.max = cap, .factor = 1, .growth = 2, .every = 10, .warmup = 20};
  for (int i = 0; i < n; i++) {
    double v;
    if (strcmp(keys[i], "max") == 0) {
      TIDE_CHECK(tide__policy_number("gns", keys[i], values[i], (double)env->base_batch, 1e12, &g.max));
      if (g.max > cap) {
        TIDE_ERROR("policy gns: max=%s is above what %d ranks x max batch %d x %d micro-batches allow (%.0f): raise "
                   "the max batch or the accumulation limit",
                   values[i], env->ranks, env->max_batch, env->max_accum, cap);
        return TIDE_EINVAL;
      }
    } else if (strcmp(keys[i], "factor") == 0) {
      TIDE_CHECK(tide__policy_number("gns", keys[i], values[i], 1e-3, 1e3, &g.factor));
    } else if (strcmp(keys[i], "growth") == 0) {
      TIDE_CHECK(tide__policy_number("gns", keys[i], values[i], 1.1, 100, &g.growth));
    } else if (strcmp(keys[i], "every") == 0) {
      TIDE_CHECK(tide__policy_number("gns", keys[i], values[i], 1, 1e9, &v));
      g.every = (long)v;
    } else if (strcmp(keys[i], "warmup") == 0) {
      TIDE_CHECK(tide__policy_number("gns", keys[i], values[i], 0, 1e9, &v));
      g.warmup = (long)v;
    } else {
      return unknown_key("gns", keys[i], "max, factor, growth, every, warmup");
    }
  }
  return with_before_step("gns", gns_before_step, &g, sizeof g, ops, state);
}

/* ---- exchange: dense or sparse from the communication share ------------------ */

/* KungFu-style adaptive communication: after `window` steps of dense
 * exchange whose mean communication share is above `high`, try the sparse
 * exchange for a window; keep whichever moved more samples per second. */
typedef struct {
  double high, dense_rate;
  int sparse;
  int mode; /* 0 dense, measuring; 1 sparse, on trial; 2 settled */
  long since, window;
  double share_sum, time_sum, samples_sum;
} switch_t;

static int switch_before_step(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  switch_t *w = state;
  /* Only all-reduced figures, so every rank switches at the same step. */
  if (s->step < 2 || w->mode == 2 || !isfinite(s->comm_share) || !(s->mean_step_s > 0)) return 0;
  w->share_sum += s->comm_share;
  w->time_sum += s->mean_step_s;
  w->samples_sum += (double)s->global_batch;
  if (++w->since < w->window) return 0;
  double rate = w->samples_sum / w->time_sum, share = w->share_sum / (double)w->since;
  w->since = 0;
  w->share_sum = w->time_sum = w->samples_sum = 0;
  if (w->mode == 0) {
    if (share > w->high) {
      w->dense_rate = rate;
      w->mode = 1;
      d->exchange = w->sparse;
    }
  } else {
    w->mode = 2;
    if (rate < w->dense_rate) d->exchange = TIDE_EXCHANGE_DENSE;
  }
  return 0;
}

static int switch_create(int n, const char *const *keys, const char *const *values, tide_policy_ops_t *ops,
                         void **state) {
  switch_t w = {.high = 0.5, .sparse = TIDE_EXCHANGE_HITOPK, .window = 20};
  for (int i = 0; i < n; i++) {
    double v;
    if (strcmp(keys[i], "high") == 0) {
      TIDE_CHECK(tide__policy_number("exchange", keys[i], values[i], 0, 1, &w.high));
    } else if (strcmp(keys[i], "window") == 0) {
      TIDE_CHECK(tide__policy_number("exchange", keys[i], values[i], 1, 1e9, &v));
      w.window = (long)v;
    } else if (strcmp(keys[i], "sparse") == 0) {
      tide_exchange_t e;
      if (tide_exchange_parse(values[i], &e) != 0 || (e != TIDE_EXCHANGE_TOPK && e != TIDE_EXCHANGE_HITOPK)) {
        TIDE_ERROR("policy exchange: sparse=%s: give topk or hitopk", values[i]);
        return TIDE_EINVAL;
      }
      w.sparse = e;
    } else {
      return unknown_key("exchange", keys[i], "high, window, sparse");
    }
  }
  return with_before_step("exchange", switch_before_step, &w, sizeof w, ops, state);
}

/* ---- autoscale -------------------------------------------------------------- */

/* Resource Elasticity's scaling rule (Or et al., MLSys 2020; spec §8): the
 * job's throughput is measured over `window` steps at its size, then `add`
 * more workers are asked for; once they are members it is measured again.
 * The added workers stay, and more are asked for, while the throughput
 * gained per added worker is at least `threshold` times the per-worker
 * throughput of the smaller size; otherwise they are given back and the size
 * stays. Throughput: samples over the all-reduced mean step time, after
 * `settle` steps at a new size. Workers that do not come within `patience`
 * seconds of training (no capacity, or the job's --max-np) end the search
 * at the size the job has; seconds, not steps, since a new worker's start
 * takes the same time however short the steps are. */
enum { AUTOSCALE_MEASURE = 0, AUTOSCALE_WAIT, AUTOSCALE_SETTLED };

typedef struct {
  double threshold, patience;
  long window, settle;
  int add, max;
  int mode;
  int size, asked;        /* the members being measured; the size asked for */
  int kept_size;          /* the last size kept, and its throughput (0: none yet) */
  double kept_rate;
  long since, skip;
  double waited, samples, seconds; /* waited: seconds of steps since the request */
} autoscale_t;

static void autoscale_settle(autoscale_t *a, int size, tide_decision_t *d) {
  a->mode = AUTOSCALE_SETTLED;
  d->world_size = size;
  TIDE_INFO("policy autoscale: staying at %d worker(s)", size);
}

static int autoscale_before_step(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  autoscale_t *a = state;
  if (a->mode == AUTOSCALE_SETTLED || s->step < 1 || !(s->mean_step_s > 0)) return 0;
  if (s->ranks != a->size) { /* a new membership: measure it afresh */
    a->size = s->ranks;
    a->since = 0;
    a->samples = a->seconds = 0;
    a->skip = a->settle;
  }
  if (a->mode == AUTOSCALE_WAIT) {
    if (s->ranks != a->asked) {
      if ((a->waited += s->mean_step_s) >= a->patience) autoscale_settle(a, s->ranks, d);
      return 0;
    }
    a->mode = AUTOSCALE_MEASURE;
  }
  if (a->skip > 0) {
    a->skip--;
    return 0;
  }
  a->samples += (double)s->global_batch;
  a->seconds += s->mean_step_s;
  if (++a->since < a->window) return 0;
  double rate = a->samples / a->seconds;
  a->since = 0;
  a->samples = a->seconds = 0;
  if (a->kept_size > 0 && a->size > a->kept_size) {
    double per_worker = a->kept_rate / a->kept_size, gained = (rate - a->kept_rate) / (a->size - a->kept_size);
    TIDE_INFO("policy autoscale: %d -> %d worker(s): %.0f -> %.0f samples/s, %.2f of a worker's throughput per "
              "added worker (threshold %.2f)", a->kept_size, a->size, a->kept_rate, rate, gained / per_worker,
              a->threshold);
    if (gained < a->threshold * per_worker) {
      autoscale_settle(a, a->kept_size, d);
      return 0;
    }
  }
  a->kept_size = a->size;
  a->kept_rate = rate;
  int next = a->size + a->add;
  if (a->max > 0 && next > a->max) next = a->max;
  if (next <= a->size) {
    autoscale_settle(a, a->size, d);
    return 0;
  }
  a->mode = AUTOSCALE_WAIT;
  a->asked = next;
  a->waited = 0;
  d->world_size = next;
  return 0;
}

static int autoscale_create(int n, const char *const *keys, const char *const *values, tide_policy_ops_t *ops,
                            void **state) {
  autoscale_t a = {.threshold = 0.5, .window = 20, .settle = 5, .patience = 120, .add = 1};
  for (int i = 0; i < n; i++) {
    double v;
    if (strcmp(keys[i], "threshold") == 0) {
      TIDE_CHECK(tide__policy_number("autoscale", keys[i], values[i], 0, 10, &a.threshold));
    } else if (strcmp(keys[i], "window") == 0) {
      TIDE_CHECK(tide__policy_number("autoscale", keys[i], values[i], 1, 1e9, &v));
      a.window = (long)v;
    } else if (strcmp(keys[i], "settle") == 0) {
      TIDE_CHECK(tide__policy_number("autoscale", keys[i], values[i], 0, 1e9, &v));
      a.settle = (long)v;
    } else if (strcmp(keys[i], "patience") == 0) {
      TIDE_CHECK(tide__policy_number("autoscale", keys[i], values[i], 0.001, 1e9, &a.patience));
    } else if (strcmp(keys[i], "add") == 0) {
      TIDE_CHECK(tide__policy_number("autoscale", keys[i], values[i], 1, 1048576, &v));
      a.add = (int)v;
    } else if (strcmp(keys[i], "max") == 0) {
      TIDE_CHECK(tide__policy_number("autoscale", keys[i], values[i], 0, 1048576, &v));
      a.max = (int)v;
    } else {
      return unknown_key("autoscale", keys[i], "threshold, window, settle, patience, add, max");
    }
  }
  return with_before_step("autoscale", autoscale_before_step, &a, sizeof a, ops, state);
}

/* ---- the table ------------------------------------------------------------- */

int tide__policy_builtin(const char *spec, const tide__policy_env_t *env, tide_policy_ops_t *ops, void **state) {
  char copy[256];
  if (spec == NULL || strlen(spec) >= sizeof copy) {
    TIDE_ERROR("policy spec too long or NULL");
    return TIDE_EINVAL;
  }
  strcpy(copy, spec);
  const char *keys[MAX_KEYS], *values[MAX_KEYS];
  int n = 0;
  char *name = copy, *rest = strchr(copy, ':');
  if (rest != NULL) *rest++ = 0;
  while (rest != NULL) {
    char *next = strchr(rest, ':');
    if (next != NULL) *next++ = 0;
    char *eq = strchr(rest, '=');
    if (eq == NULL || eq == rest || eq[1] == 0 || n == MAX_KEYS) {
      TIDE_ERROR("policy %s: bad setting '%s': give key=value (at most %d)", name, rest, MAX_KEYS);
      return TIDE_EINVAL;
    }
    *eq = 0;
    keys[n] = rest;
    values[n++] = eq + 1;
    rest = next;
  }
  if (strcmp(name, "adascale") == 0) return adascale_create(n, keys, env, ops, state);
  if (strcmp(name, "gns") == 0) return gns_create(n, keys, values, env, ops, state);
  if (strcmp(name, "exchange") == 0) return switch_create(n, keys, values, ops, state);
  if (strcmp(name, "pollux") == 0) return tide__pollux_create(keys, values, n, env, ops, state);
  if (strcmp(name, "autoscale") == 0) return autoscale_create(n, keys, values, ops, state);
  TIDE_ERROR("unknown policy '%s': use adascale, gns, pollux, exchange or autoscale (docs/adaptation.md)", name);
  return TIDE_EINVAL;
}
