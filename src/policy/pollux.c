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

enum { PROFILES = 64, CANDIDATES = 50 };

/* Mean times seen at one shape: hosts, workers and micro-batch size
 * (AdaptDL's profile key), so sizes are never mixed after a resize. */
typedef struct {
  int nodes, replicas;
  double atomic, n, t_acc, t_net;
} profile_t;

/* The agent's state: plain data, saved and restored with the trainer's
 * (and handed over at an elastic resize). */
typedef struct {
  long every;
  double max, min_gain, min_atomic;
  int max_batch, max_accum;
  long base_batch;
  profile_t profiles[PROFILES];
  int nprofiles, max_replicas_seen;
  tide_pollux_model_t model;
  int fitted;
  double hints_interval, since_hints; /* seconds of steps between reports, and since the last */
  int reported;                       /* 1 once the hints were published */
  double reported_phi, reported_rate; /* what the last report said (0: not known then) */
} pollux_t;

/* The state and, after it (not saved: local to this process), where the
 * hints go. */
typedef struct {
  pollux_t saved;
  tide__policy_publish_cb publish;
  void *publish_ctx;
} agent_t;

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

/* Fits the agent's model to its profiles, of every size it has run at:
 * the per-host and per-worker network terms become free once several sizes
 * were seen (tide_pollux_fit pins what the profiles cannot identify), from
 * several starting points, with AdaptDL's optimistic prior for a network
 * never measured. */
static void fit(pollux_t *p) {
  tide_pollux_profile_t profiles[PROFILES];
  int n = 0;
  for (int i = 0; i < p->nprofiles; i++) {
    const profile_t *pr = &p->profiles[i];
    if (pr->n < 1) continue;
    double t_acc = pr->t_acc / pr->n, t_net = pr->t_net / pr->n;
    profiles[n++] = (tide_pollux_profile_t){pr->nodes, pr->replicas, pr->atomic, t_acc, t_acc + t_net};
  }
  if (n == 0) return;
  tide_pollux_model_t m;
  int rc = tide_pollux_fit(profiles, n, TIDE_POLLUX_FIT_RESTARTS | TIDE_POLLUX_FIT_EXPLORE, &m);
  if (rc != 0) {
    TIDE_DEBUG("pollux: throughput fit failed (%s); keeping the last model", tide_err_name(rc));
    return;
  }
  p->model = m;
  p->fitted = 1;
}

static tide_pollux_limits_t limits_of(const pollux_t *p) {
  return (tide_pollux_limits_t){.base_batch = (double)p->base_batch, .max_batch = p->max,
                                .min_atomic = p->min_atomic, .max_atomic = p->max_batch,
                                .max_passes = p->max_accum};
}

int tide__pollux_hints(const void *state, const tide_step_stats_t *s, tide_sched_hints_t *out) {
  const pollux_t *p = state;
  if (p == NULL || s == NULL || out == NULL) return TIDE_EINVAL;
  *out = (tide_sched_hints_t){.model = p->model, .fitted = p->fitted, .grad_sqr = s->grad_sq,
                              .grad_var = s->trace_sigma / (double)p->base_batch, .limits = limits_of(p),
                              .max_replicas_seen = p->max_replicas_seen};
  if (!p->fitted) out->model = (tide_pollux_model_t){.gamma = 1};
  return 0;
}

/* The figures a report is judged stale by: the noise scale, and the
 * modelled throughput at the current size and batch. */
static void report_figures(const pollux_t *p, const tide_step_stats_t *s, double *phi, double *rate) {
  *phi = isfinite(s->noise_scale) ? s->noise_scale : 0;
  *rate = p->fitted && s->batch > 0 && s->ranks >= s->nodes && s->nodes > 0
              ? tide_pollux_throughput(&p->model, s->nodes, s->ranks, s->batch, s->accum > 0 ? s->accum - 1 : 0)
              : 0;
  if (!isfinite(*rate)) *rate = 0;
}

/* Publishes the hints when `interval` seconds of steps have passed since
 * the last report, or when force is set (the model changed a lot). Needs a
 * job store: without a publisher nothing happens. A failed write is
 * logged, and tried again at the next interval. */
static void report(agent_t *a, const tide_step_stats_t *s, int force) {
  pollux_t *p = &a->saved;
  if (a->publish == NULL) return;
  if (!force && p->reported && p->since_hints < p->hints_interval) return;
  tide_sched_hints_t h;
  char text[TIDE_SCHED_HINTS_MAX];
  if (tide__pollux_hints(p, s, &h) != 0 || tide_sched_hints_encode(&h, text, sizeof text) != 0) return;
  int rc = a->publish(a->publish_ctx, TIDE_SCHED_HINTS_KEY, text);
  if (rc != 0) TIDE_WARN("pollux: could not publish the scheduling hints: %s", tide_strerror(rc));
  p->since_hints = 0;
  p->reported = 1;
  report_figures(p, s, &p->reported_phi, &p->reported_rate);
}

/* Whether the model moved by more than a quarter since the last report:
 * its throughput at the current shape, or the noise scale; or it was fitted
 * for the first time. */
static int changed_a_lot(const pollux_t *p, const tide_step_stats_t *s) {
  double phi, rate;
  report_figures(p, s, &phi, &rate);
  double was_phi = p->reported_phi, was_rate = p->reported_rate;
  if (rate > 0 && !(was_rate > 0)) return 1;
  if (rate > 0 && fabs(rate - was_rate) > 0.25 * was_rate) return 1;
  if (phi > 0 && was_phi > 0 && (phi > 1.25 * was_phi || phi < was_phi / 1.25)) return 1;
  return phi > 0 && !(was_phi > 0);
}

/* Records this step's times under its shape (hosts, workers, micro-batch):
 * the slowest rank's pass time, and the exchange. The first step at a new
 * shape is left out (it pays for the change). */
static int pollux_observe(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  agent_t *a = state;
  pollux_t *p = &a->saved;
  (void)d;
  if (s->mean_step_s > 0) p->since_hints += s->mean_step_s;
  if (s->ranks > p->max_replicas_seen) p->max_replicas_seen = s->ranks;
  report(a, s, 0);
  if (s->global_batch != s->planned_batch || s->step < 1 || !(s->compute_max_s > 0) || s->accum < 1) return 0;
  double t_acc = s->compute_max_s / s->accum;
  int at = 0;
  while (at < p->nprofiles && !(p->profiles[at].atomic == s->batch && p->profiles[at].replicas == s->ranks &&
                                p->profiles[at].nodes == s->nodes))
    at++;
  if (at == p->nprofiles) {
    if (p->nprofiles == PROFILES) return 0;
    /* n = -1: the first step at this shape, not counted */
    p->profiles[p->nprofiles++] = (profile_t){.nodes = s->nodes, .replicas = s->ranks, .atomic = s->batch, .n = -1};
    return 0;
  }
  profile_t *pr = &p->profiles[at];
  if (pr->n < 0) {
    pr->n = 0;
    if (s->step > 1) return 0;
  }
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
  /* One worker above the base batch keeps two passes, so that its noise
   * scale still has two gradients to compare (AdaptDL). */
  if (replicas == 1 && local > limits->base_batch && passes < 2) passes = 2;
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

/* Fits, and evaluates the batches at the size the job has now. */
static int pollux_decide(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  agent_t *a = state;
  pollux_t *p = &a->saved;
  if (p->nprofiles == 0 || !isfinite(s->noise_scale) || s->ranks < 1 || s->nodes < 1) return 0;
  fit(p);
  if (!p->fitted) return 0;
  if (changed_a_lot(p, s)) report(a, s, 1);
  tide_pollux_limits_t limits = limits_of(p);
  tide_pollux_choice_t current, best;
  if (tide_pollux_goodput(&p->model, &limits, s->nodes, s->ranks, s->noise_scale, (double)s->planned_batch,
                          &current) != 0 ||
      tide_pollux_optimize(&p->model, &limits, s->nodes, s->ranks, s->noise_scale, &best) != 0)
    return 0;
  double best_batch = best.goodput > current.goodput ? best.batch : 0;
  TIDE_DEBUG("pollux: step %ld on %d worker(s) over %d host(s), noise scale %.1f; current batch %ld goodput %.1f, "
             "best %.0f goodput %.1f", s->step, s->ranks, s->nodes, s->noise_scale, s->planned_batch,
             current.goodput, best_batch, best.goodput > current.goodput ? best.goodput : current.goodput);
  if (best_batch > 0 && best.goodput > current.goodput * p->min_gain && (long)best_batch != s->planned_batch)
    d->global_batch = (long)best_batch;
  return 0;
}

int tide__pollux_create(const char *const *keys, const char *const *values, int n, const tide__policy_env_t *env,
                        tide_policy_ops_t *ops, void **state) {
  double cap = (double)env->ranks * env->max_batch * env->max_accum;
  pollux_t p = {.every = 20, .max = cap, .min_gain = 1.05, .min_atomic = 1, .max_batch = env->max_batch,
                .max_accum = env->max_accum, .base_batch = env->base_batch,
                .hints_interval = (double)tide__param_int(TIDE__PARAM_SCHED_HINTS_INTERVAL)};
  for (int i = 0; i < n; i++) {
    double v;
    if (strcmp(keys[i], "every") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], 1, 1e9, &v));
      p.every = (long)v;
    } else if (strcmp(keys[i], "max") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], (double)env->base_batch, cap, &p.max));
    } else if (strcmp(keys[i], "min_gain") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], 1, 10, &p.min_gain));
    } else if (strcmp(keys[i], "min_batch") == 0) {
      TIDE_CHECK(tide__policy_number("pollux", keys[i], values[i], 1, env->max_batch, &p.min_atomic));
      p.min_atomic = floor(p.min_atomic);
    } else {
      TIDE_ERROR("policy pollux: unknown key '%s' (its keys: every, max, min_gain, min_batch)", keys[i]);
      return TIDE_EINVAL;
    }
  }
  if (p.min_atomic * env->ranks > p.max) {
    TIDE_ERROR("policy pollux: min_batch=%.0f on %d worker(s) is above the largest global batch %.0f: lower "
               "min_batch or raise max", p.min_atomic, env->ranks, p.max);
    return TIDE_EINVAL;
  }
  agent_t *a = tide__calloc(1, sizeof *a);
  if (a == NULL) return TIDE_ENOMEM;
  a->saved = p;
  a->publish = env->publish;
  a->publish_ctx = env->publish_ctx;
  /* state_size: the plain part only; the publisher stays this process's */
  *ops = (tide_policy_ops_t){.name = "pollux", .before_step = pollux_decide, .before_update = pollux_observe,
                             .destroy = tide__free, .state_size = sizeof a->saved, .decide_every = (int)p.every};
  *state = a;
  return 0;
}
