/* Pollux's goodput policy (Qiao et al., OSDI 2021; AdaptDL's goodput.py is
 * the reference for the model and its priors): fit the throughput model to
 * the step times this rank measured, and every `every` steps choose the
 * global batch (micro-batch x accumulation) that maximises throughput x
 * statistical efficiency. The fit is local, so the trainer broadcasts rank
 * 0's choice (decide_every). The fit is NLopt's bounded BOBYQA on the
 * spec's RMSLE objective. */
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
  const pollux_t *p;
  double full[P_COUNT];
  int free_at[P_COUNT], nfree;
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
  for (unsigned i = 0; i < n; i++) f->full[f->free_at[i]] = x[i];
  tide_pollux_model_t m = model_of(f->full);
  double acc = 0, opt = 0, weight = 0;
  for (int i = 0; i < f->p->nprofiles; i++) {
    const profile_t *pr = &f->p->profiles[i];
    double t_acc = pr->t_acc / pr->n, t_net = pr->t_net / pr->n;
    double model_acc = m.alpha_c + m.beta_c * pr->atomic;
    double model_net = net_time(&m, f->p->nodes, f->p->ranks);
    double model_opt = pow(pow(model_acc, m.gamma) + pow(model_net, m.gamma), 1 / m.gamma);
    double seen_opt = t_acc + t_net;
    acc += pow(log(model_acc) - log(t_acc), 2);
    opt += pow(log(model_opt) - log(seen_opt), 2);
    weight += 1;
  }
  double r = sqrt(acc / weight) + sqrt(opt / weight) + 1e-3 * pow(m.gamma - 1, 2);
  if (m.alpha_n > 0) r += 1e-2 * pow(m.beta_n / m.alpha_n, 2);
  if (m.alpha_r > 0) r += 1e-2 * pow(m.beta_r / m.alpha_r, 2);
  return r;
}

/* Fits the model. Pinned as AdaptDL does for regimes never seen: one
 * micro-batch size pins alpha_c at half the mean T_acc; a fixed number of
 * ranks pins the per-rank slopes; the network of the other kind (across
 * hosts or within one) is pinned at its lower bound. gamma is pinned at 1:
 * the trainer exchanges after the backward pass, with no overlap. */
static void fit(pollux_t *p) {
  fit_t f = {.p = p};
  double lower[P_COUNT], upper[P_COUNT], start[P_COUNT] = {0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.0};
  int pinned[P_COUNT] = {0};
  for (int i = 0; i < P_COUNT; i++) lower[i] = 1e-8, upper[i] = 1e3;
  lower[P_GAMMA] = upper[P_GAMMA] = 1;
  pinned[P_GAMMA] = pinned[P_BN] = pinned[P_BR] = 1;
  start[P_BN] = start[P_BR] = 1e-8;
  pinned[p->nodes > 1 ? P_AR : P_AN] = 1;
  start[p->nodes > 1 ? P_AR : P_AN] = 1e-8;
  if (p->ranks == 1) pinned[P_AN] = pinned[P_AR] = 1, start[P_AN] = start[P_AR] = 1e-8;
  double acc_mean = 0;
  for (int i = 0; i < p->nprofiles; i++) acc_mean += p->profiles[i].t_acc / p->profiles[i].n / p->nprofiles;
  if (p->nprofiles == 1) {
    pinned[P_AC] = 1;
    start[P_AC] = acc_mean / 2;
    start[P_BC] = acc_mean / 2 / p->profiles[0].atomic;
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
  nlopt_opt opt = nlopt_create(f.nfree >= 2 ? NLOPT_LN_BOBYQA : NLOPT_LN_COBYLA, (unsigned)f.nfree);
  if (opt == NULL) return;
  nlopt_set_lower_bounds(opt, lb);
  nlopt_set_upper_bounds(opt, ub);
  nlopt_set_min_objective(opt, objective, &f);
  nlopt_set_xtol_rel(opt, 1e-6);
  nlopt_set_maxeval(opt, 2000);
  double best;
  nlopt_result r = nlopt_optimize(opt, x, &best);
  nlopt_destroy(opt);
  if (r < 0) {
    TIDE_DEBUG("pollux: throughput fit failed (NLopt %d); keeping the last model", (int)r);
    return;
  }
  for (int i = 0; i < f.nfree; i++) f.full[f.free_at[i]] = x[i];
  p->model = model_of(f.full);
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

/* The plan a global batch gets: micro-batch and extra passes (spec's s). */
static void shape(const pollux_t *p, double global, double *atomic, int *accum) {
  double local = ceil(global / p->ranks);
  int passes = (int)ceil(local / p->max_batch);
  if (passes < 1) passes = 1;
  if (passes > p->max_accum) passes = p->max_accum;
  *accum = passes - 1;
  *atomic = ceil(local / passes);
  if (*atomic > p->max_batch) *atomic = p->max_batch;
}

static double goodput(const pollux_t *p, double global, double phi, double *actual) {
  double atomic;
  int accum;
  shape(p, global, &atomic, &accum);
  *actual = (double)p->ranks * atomic * (accum + 1);
  double rate = tide_pollux_throughput(&p->model, p->nodes, p->ranks, atomic, accum);
  return rate * tide_pollux_efficiency(phi, (double)p->base_batch, *actual);
}

static int pollux_decide(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  pollux_t *p = state;
  if (p->nprofiles == 0 || !isfinite(s->noise_scale)) return 0;
  fit(p);
  if (!p->fitted) return 0;
  double lo = (double)p->base_batch > p->ranks ? (double)p->base_batch : p->ranks, hi = p->max, actual;
  double current = goodput(p, (double)s->planned_batch, s->noise_scale, &actual), best = current, best_batch = 0;
  for (int i = 0; i < CANDIDATES; i++) {
    double m = hi > lo ? lo * pow(hi / lo, i / (CANDIDATES - 1.0)) : lo;
    double g = goodput(p, m, s->noise_scale, &actual);
    if (g > best) best = g, best_batch = actual;
  }
  TIDE_DEBUG("pollux: step %ld noise scale %.1f; current batch %ld goodput %.1f, best %.0f goodput %.1f", s->step,
             s->noise_scale, s->planned_batch, current, best_batch, best);
  if (best_batch > 0 && best > current * p->min_gain && (long)best_batch != s->planned_batch)
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
