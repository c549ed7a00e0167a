/* Pollux's goodput policy (Qiao et al., OSDI 2021; AdaptDL's goodput.py is
 * the reference for the model and its priors): fit the throughput model to
 * the step times this rank measured, and every `every` steps choose the
 * global batch (micro-batch x accumulation) that maximises throughput x
 * statistical efficiency. The fit is local, so the trainer broadcasts rank
 * 0's choice (decide_every). The fit is NLopt's bounded BOBYQA on the
 * spec's RMSLE objective; the fit and the optimiser are public
 * (tide_pollux_fit, tide_pollux_optimize) and shared with the cluster
 * scheduler's speedup function (src/sched). */
#include <math.h>
#include <nlopt.h>
#include <string.h>

#include "policy/policy.h"

enum { PROFILES = 32, CANDIDATES = 50 };

/* Mean times seen for one micro-batch size. */
typedef struct {
  double atomic, n, t_acc, t_net;
} profile_t;

typedef struct {
  long every;
  double max, min_gain;
  int ranks, nodes, max_batch, max_accum;
  long base_batch;
  profile_t profiles[PROFILES];
  int nprofiles;
  tide_pollux_model_t model;
  int fitted;
} pollux_t;

/* The parameters in the order NLopt sees them, and which are pinned. */
enum { P_AC, P_BC, P_AN, P_BN, P_AR, P_BR, P_GAMMA, P_COUNT };

typedef struct {
  const tide_pollux_profile_t *profiles;
  int n;
  double full[P_COUNT];
  int free_at[P_COUNT], nfree;
  int logspace; /* the search runs over log(x) */
  double *log_acc, *log_opt; /* of the profiles' times */
} fit_t;

static tide_pollux_model_t model_of(const double *x) {
  return (tide_pollux_model_t){x[P_AC], x[P_BC], x[P_AN], x[P_BN], x[P_AR], x[P_BR], x[P_GAMMA]};
}

static double net_time(const tide_pollux_model_t *m, int nodes, int replicas) {
  double extra = replicas > 2 ? replicas - 2 : 0;
  if (nodes > 1) return m->alpha_n + m->beta_n * extra;
  if (replicas > 1) return m->alpha_r + m->beta_r * extra;
  return 0;
}

/* RMSLE of T_acc and of T_opt = (T_acc^g + T_net^g)^(1/g) over the
 * profiles, plus the spec's small regularisers. */
static double objective(unsigned n, const double *x, double *grad, void *data) {
  fit_t *f = data;
  (void)grad;
  for (unsigned i = 0; i < n; i++) f->full[f->free_at[i]] = f->logspace ? exp(x[i]) : x[i];
  tide_pollux_model_t m = model_of(f->full);
  double acc = 0, opt = 0, weight = 0;
  for (int i = 0; i < f->n; i++) {
    const tide_pollux_profile_t *pr = &f->profiles[i];
    double model_acc = m.alpha_c + m.beta_c * pr->atomic;
    double model_net = net_time(&m, pr->nodes, pr->replicas);
    /* gamma 1 (the agent's, pinned) needs no pow: the same value */
    double model_opt = m.gamma == 1 ? model_acc + model_net
                                    : pow(pow(model_acc, m.gamma) + pow(model_net, m.gamma), 1 / m.gamma);
    double d_acc = log(model_acc) - f->log_acc[i], d_opt = log(model_opt) - f->log_opt[i];
    acc += d_acc * d_acc;
    opt += d_opt * d_opt;
    weight += 1;
  }
  double r = sqrt(acc / weight) + sqrt(opt / weight) + 1e-3 * (m.gamma - 1) * (m.gamma - 1);
  if (m.alpha_n > 0) r += 1e-2 * (m.beta_n / m.alpha_n) * (m.beta_n / m.alpha_n);
  if (m.alpha_r > 0) r += 1e-2 * (m.beta_r / m.alpha_r) * (m.beta_r / m.alpha_r);
  return r;
}

/* One local BOBYQA (COBYLA for one free term) from x; 0 and the
 * objective in *value, or a negative NLopt result. */
static int fit_from(fit_t *f, const double *lb, const double *ub, double *x, double *value) {
  nlopt_opt opt = nlopt_create(f->logspace ? NLOPT_LN_SBPLX : f->nfree >= 2 ? NLOPT_LN_BOBYQA : NLOPT_LN_COBYLA, (unsigned)f->nfree);
  if (opt == NULL) return TIDE_ENOMEM;
  nlopt_set_lower_bounds(opt, lb);
  nlopt_set_upper_bounds(opt, ub);
  nlopt_set_min_objective(opt, objective, f);
  nlopt_set_xtol_rel(opt, 1e-6);
  nlopt_set_maxeval(opt, 2000);
  nlopt_result r = nlopt_optimize(opt, x, value);
  nlopt_destroy(opt);
  return r < 0 ? (int)r : 0;
}

/* Pinned as AdaptDL does for regimes never seen; gamma at 1 unless the
 * exchange overlaps the backward pass (TIDE_POLLUX_FIT_OVERLAP). */
int tide_pollux_fit(const tide_pollux_profile_t *profiles, int n, unsigned flags, tide_pollux_model_t *model) {
  if (profiles == NULL || model == NULL) return tide__null_arg("tide_pollux_fit", "profiles or model");
  if (n < 1) {
    TIDE_ERROR("tide_pollux_fit: n = %d profiles; give at least 1", n);
    return TIDE_EINVAL;
  }
  int multi_node = 0, multi_local = 0, one_atomic = 1, max_replicas = 0, counts = 0, last_count = -1;
  double acc_mean = 0;
  for (int i = 0; i < n; i++) {
    const tide_pollux_profile_t *pr = &profiles[i];
    if (pr->nodes < 1 || pr->replicas < pr->nodes || !(pr->atomic > 0) || !(pr->t_acc > 0) ||
        !(pr->t_opt > 0) || !isfinite(pr->t_acc) || !isfinite(pr->t_opt))
      return TIDE_EINVAL;
    multi_node |= pr->nodes > 1;
    multi_local |= pr->nodes == 1 && pr->replicas > 1;
    if (pr->atomic != profiles[0].atomic) one_atomic = 0;
    if (pr->replicas > max_replicas) max_replicas = pr->replicas;
    if (pr->replicas != last_count) {
      int seen = 0;
      for (int k = 0; k < i; k++) seen |= profiles[k].replicas == pr->replicas;
      counts += !seen;
      last_count = pr->replicas;
    }
    acc_mean += pr->t_acc / n;
  }
  fit_t f = {.profiles = profiles, .n = n};
  f.log_acc = tide__malloc((size_t)n * 2 * sizeof *f.log_acc);
  if (f.log_acc == NULL) return TIDE_ENOMEM;
  f.log_opt = f.log_acc + n;
  for (int i = 0; i < n; i++) f.log_acc[i] = log(profiles[i].t_acc), f.log_opt[i] = log(profiles[i].t_opt);
  double lower[P_COUNT], upper[P_COUNT], start[P_COUNT] = {0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.0};
  int pinned[P_COUNT] = {0};
  for (int i = 0; i < P_COUNT; i++) lower[i] = 1e-8, upper[i] = 1e3;
  lower[P_GAMMA] = 1;
  upper[P_GAMMA] = flags & TIDE_POLLUX_FIT_OVERLAP ? 10 : 1;
  pinned[P_GAMMA] = !(flags & TIDE_POLLUX_FIT_OVERLAP);
  if (max_replicas <= 2 || counts < 2) pinned[P_BN] = pinned[P_BR] = 1, start[P_BN] = start[P_BR] = 1e-8;
  if (!multi_node) pinned[P_AN] = pinned[P_BN] = 1, start[P_AN] = start[P_BN] = 1e-8;
  if (!multi_local) pinned[P_AR] = pinned[P_BR] = 1, start[P_AR] = start[P_BR] = 1e-8;
  if (one_atomic) {
    pinned[P_AC] = 1;
    start[P_AC] = acc_mean / 2;
    start[P_BC] = acc_mean / 2 / profiles[0].atomic;
  }
  double x[P_COUNT], lb[P_COUNT], ub[P_COUNT];
  for (int i = 0; i < P_COUNT; i++) {
    f.full[i] = start[i];
    if (!pinned[i]) {
      f.free_at[f.nfree] = i;
      x[f.nfree] = start[i];
      lb[f.nfree] = lower[i];
      ub[f.nfree++] = upper[i];
    }
  }
  double best_x[P_COUNT], best = INFINITY, value;
  int rc = TIDE_ESTATE;
  if (f.nfree == 0) {
    rc = 0;
  } else if (!(flags & TIDE_POLLUX_FIT_RESTARTS)) {
    int r = fit_from(&f, lb, ub, x, &value);
    if (r == TIDE_ENOMEM) rc = r;
    else if (r < 0) TIDE_DEBUG("pollux: throughput fit failed (NLopt %d)", r);
    else memcpy(best_x, x, sizeof x), rc = 0;
  } else {
    /* Over log(x), from several starts (the terms span decades, and one
     * local search from one start can stall far from the optimum): the
     * first start scaled by decades, gamma from 1 to 8. */
    static const double scales[4] = {1, 0.1, 1, 10}, gammas[4] = {1, 1, 3, 8};
    double llb[P_COUNT], lub[P_COUNT];
    for (int i = 0; i < f.nfree; i++) llb[i] = log(lb[i]), lub[i] = log(ub[i]);
    f.logspace = 1;
    for (int t = 0; t < 4 && rc != TIDE_ENOMEM; t++) {
      double xt[P_COUNT];
      for (int i = 0; i < f.nfree; i++) {
        xt[i] = log(f.free_at[i] == P_GAMMA ? gammas[t] : x[i] * scales[t]);
        xt[i] = fmin(fmax(xt[i], llb[i]), lub[i]);
      }
      int r = fit_from(&f, llb, lub, xt, &value);
      if (r == TIDE_ENOMEM) rc = r;
      if (r < 0 && r != NLOPT_ROUNDOFF_LIMITED) continue;
      if (value < best) {
        best = value, rc = 0;
        for (int i = 0; i < f.nfree; i++) best_x[i] = exp(xt[i]);
      }
    }
  }
  tide__free(f.log_acc);
  if (rc != 0) return rc;
  /* NLopt may end a hair outside a bound (gamma 1 - 1e-16). */
  for (int i = 0; i < f.nfree; i++) f.full[f.free_at[i]] = fmin(fmax(best_x[i], lb[i]), ub[i]);
  tide_pollux_model_t m = model_of(f.full);
  if ((flags & TIDE_POLLUX_FIT_EXPLORE) && !multi_node) {
    if (m.alpha_n < 1.1 * m.alpha_r) m.alpha_n = 1.1 * m.alpha_r;
    if (m.beta_n < 1.1 * m.beta_r) m.beta_n = 1.1 * m.beta_r;
  }
  *model = m;
  return 0;
}

/* Fits the agent's model to its profiles, all at its own size. */
static void fit(pollux_t *p) {
  tide_pollux_profile_t profiles[PROFILES];
  for (int i = 0; i < p->nprofiles; i++) {
    const profile_t *pr = &p->profiles[i];
    double t_acc = pr->t_acc / pr->n, t_net = pr->t_net / pr->n;
    profiles[i] = (tide_pollux_profile_t){p->nodes, p->ranks, pr->atomic, t_acc, t_acc + t_net};
  }
  tide_pollux_model_t m;
  int rc = tide_pollux_fit(profiles, p->nprofiles, 0, &m);
  if (rc != 0) {
    TIDE_DEBUG("pollux: throughput fit failed (%s); keeping the last model", tide_err_name(rc));
    return;
  }
  p->model = m;
  p->fitted = 1;
}

/* Records this step's times under its micro-batch size: the slowest rank's
 * pass time, and the exchange. */
static int pollux_observe(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  pollux_t *p = state;
  (void)d;
  if (s->global_batch != s->planned_batch || s->step < 1 || !(s->compute_max_s > 0)) return 0;
  double t_acc = s->compute_max_s / s->accum;
  int at = 0;
  while (at < p->nprofiles && p->profiles[at].atomic != s->batch) at++;
  if (at == p->nprofiles) {
    if (p->nprofiles == PROFILES) return 0;
    p->profiles[p->nprofiles++] = (profile_t){.atomic = s->batch};
  }
  profile_t *pr = &p->profiles[at];
  pr->n += 1;
  pr->t_acc += t_acc;
  pr->t_net += s->exchange_s + s->optim_s;
  return 0;
}

static int limits_ok(const tide_pollux_limits_t *l) {
  return l != NULL && l->base_batch > 0 && l->min_atomic > 0 && l->max_atomic >= l->min_atomic &&
         l->max_batch > 0 && l->max_passes >= 1;
}

int tide_pollux_goodput(const tide_pollux_model_t *model, const tide_pollux_limits_t *limits, int nodes,
                        int replicas, double phi, double batch, tide_pollux_choice_t *out) {
  if (model == NULL || limits == NULL || out == NULL)
    return tide__null_arg("tide_pollux_goodput", "model, limits or out");
  if (!limits_ok(limits) || nodes < 1 || replicas < nodes || !(batch > 0) || !(phi >= 0)) return TIDE_EINVAL;
  double local = ceil(batch / replicas);
  int passes = (int)ceil(local / limits->max_atomic);
  if (passes < 1) passes = 1;
  if (passes > limits->max_passes) passes = limits->max_passes;
  double atomic = ceil(local / passes);
  if (atomic > limits->max_atomic) atomic = limits->max_atomic;
  double actual = (double)replicas * atomic * passes;
  double rate = tide_pollux_throughput(model, nodes, replicas, atomic, passes - 1);
  double g = rate * tide_pollux_efficiency(phi, limits->base_batch, actual);
  if (isnan(g)) return TIDE_EINVAL;
  *out = (tide_pollux_choice_t){.goodput = g, .batch = actual, .atomic = atomic, .accum = passes - 1};
  return 0;
}

int tide_pollux_optimize(const tide_pollux_model_t *model, const tide_pollux_limits_t *limits, int nodes,
                         int replicas, double phi, tide_pollux_choice_t *out) {
  if (model == NULL || limits == NULL || out == NULL)
    return tide__null_arg("tide_pollux_optimize", "model, limits or out");
  if (!limits_ok(limits)) return TIDE_EINVAL;
  double lo = limits->base_batch > limits->min_atomic * replicas ? limits->base_batch : limits->min_atomic * replicas;
  double hi = limits->max_batch;
  tide_pollux_choice_t best = {.goodput = -1}, c;
  for (int i = 0; i < CANDIDATES; i++) {
    double m = hi > lo ? lo * pow(hi / lo, i / (CANDIDATES - 1.0)) : lo;
    TIDE_CHECK(tide_pollux_goodput(model, limits, nodes, replicas, phi, m, &c));
    if (c.goodput > best.goodput) best = c;
  }
  *out = best;
  return 0;
}

static int pollux_decide(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  pollux_t *p = state;
  if (p->nprofiles == 0 || !isfinite(s->noise_scale)) return 0;
  fit(p);
  if (!p->fitted) return 0;
  tide_pollux_limits_t limits = {.base_batch = (double)p->base_batch, .max_batch = p->max, .min_atomic = 1,
                                 .max_atomic = p->max_batch, .max_passes = p->max_accum};
  tide_pollux_choice_t current, best;
  if (tide_pollux_goodput(&p->model, &limits, p->nodes, p->ranks, s->noise_scale, (double)s->planned_batch,
                          &current) != 0 ||
      tide_pollux_optimize(&p->model, &limits, p->nodes, p->ranks, s->noise_scale, &best) != 0)
    return 0;
  double best_batch = best.goodput > current.goodput ? best.batch : 0;
  TIDE_DEBUG("pollux: step %ld noise scale %.1f; current batch %ld goodput %.1f, best %.0f goodput %.1f", s->step,
             s->noise_scale, s->planned_batch, current.goodput, best_batch,
             best.goodput > current.goodput ? best.goodput : current.goodput);
  if (best_batch > 0 && best.goodput > current.goodput * p->min_gain && (long)best_batch != s->planned_batch)
    d->global_batch = (long)best_batch;
  return 0;
}

int tide__pollux_create(const char *const *keys, const char *const *values, int n, const tide__policy_env_t *env,
                        tide_policy_ops_t *ops, void **state) {
  double cap = (double)env->ranks * env->max_batch * env->max_accum;
  pollux_t p = {.every = 20, .max = cap, .min_gain = 1.05, .ranks = env->ranks, .nodes = env->nodes,
                .max_batch = env->max_batch, .max_accum = env->max_accum, .base_batch = env->base_batch};
  for (int i = 0; i < n; i++) {
    double v;
    if (strcmp(keys[i], "every") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], 1, 1e9, &v));
      p.every = (long)v;
    } else if (strcmp(keys[i], "max") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], (double)env->base_batch, cap, &p.max));
    } else if (strcmp(keys[i], "min_gain") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], 1, 10, &p.min_gain));
    } else {
      TIDE_ERROR("policy pollux: unknown key '%s' (its keys: every, max, min_gain)", keys[i]);
      return TIDE_EINVAL;
    }
  }
  pollux_t *s = tide__malloc(sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  *s = p;
  *ops = (tide_policy_ops_t){.name = "pollux", .before_step = pollux_decide, .before_update = pollux_observe,
                             .destroy = tide__free, .state_size = sizeof *s, .decide_every = (int)p.every};
  *state = s;
  return 0;
}
