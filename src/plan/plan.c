/* The burst-parallel planner (DeepPool; docs/burst-parallel.md): a dynamic
 * program over layers x widths that minimises the predicted iteration time
 * (then worker-time) with every layer's amplification within a limit, or,
 * given a time slack, the worker-time of plans no slower than the slack
 * allows (the same program on time + lambda x worker-time, lambda searched);
 * branch blocks are planned as the sum of their chains given the widths of
 * their fork and join. Costs come from tide's alpha-beta model of its own
 * collectives (docs/algorithms.md). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

enum { MAX_WIDTHS = 17, SMALL_BYTES = 64 * 1024 };

struct tide_plan {
  char model[64];
  tide_plan_options_t opts;
  int n;
  tide_plan_layer_t *layers;
  double iteration_time, worker_time;
};

void tide_plan_options_init(tide_plan_options_t *o) {
  if (o == NULL) return;
  *o = (tide_plan_options_t){.workers = 1, .global_batch = 1, .amplification = 2.0, .bandwidth = 2.66e11,
                             .latency = 40e-6, .data_parallel = 0, .time_slack = 1.0};
}

static void graph_error(int quiet, const char *fmt, ...) {
  if (quiet) return;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  TIDE_ERROR("tide_plan: %s", msg);
}

static int graph_check(const tide_profile_layer_t *L, int n, int *member, int quiet) {
  int rc = TIDE_EINVAL;
  int *consumers = tide__calloc((size_t)n, sizeof(int)), *fork_uses = tide__calloc((size_t)n, sizeof(int));
  int *mem = tide__malloc((size_t)n * sizeof(int));
  if (consumers == NULL || fork_uses == NULL || mem == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    mem[i] = -1;
    for (int k = 0; k < L[i].ninputs; k++)
      if (L[i].inputs[k] >= 0) consumers[L[i].inputs[k]]++;
  }
  for (int i = 0; i < n - 1; i++)
    if (consumers[i] == 0) {
      graph_error(quiet, "layer %d (%s): its output is used by no layer (only the last layer may be the end)", i,
                  L[i].name);
      goto out;
    }
  for (int j = 0; j < n; j++) {
    if (L[j].ninputs < 2) continue;
    int fork = -2;
    for (int k = 0; k < L[j].ninputs; k++) {
      int x = L[j].inputs[k];
      while (x >= 0 && consumers[x] == 1 && L[x].ninputs == 1) {
        if (mem[x] != -1) {
          graph_error(quiet, "layer %d (%s) is in two branches", x, L[x].name);
          goto out;
        }
        mem[x] = j;
        x = L[x].inputs[0];
      }
      if (x >= 0 && consumers[x] < 2 && L[x].ninputs >= 2) {
        graph_error(quiet, "layer %d (%s): nested branches (a join inside a branch of layer %d) are not handled", x,
                    L[x].name, j);
        goto out;
      }
      if (fork != -2 && x != fork) {
        graph_error(quiet, "layer %d (%s) joins branches that start at different layers (%d and %d): only "
                           "single-fork blocks are handled", j, L[j].name, fork, x);
        goto out;
      }
      fork = x;
    }
    if (fork >= 0) {
      if (mem[fork] != -1) {
        graph_error(quiet, "layer %d: nested branches (its fork %d is inside another branch)", j, fork);
        goto out;
      }
      fork_uses[fork]++;
      if (consumers[fork] != L[j].ninputs || fork_uses[fork] != 1) {
        graph_error(quiet, "layer %d (%s) forks into %d layers but layer %d joins %d branches from it", fork,
                    L[fork].name, consumers[fork], j, L[j].ninputs);
        goto out;
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (consumers[i] >= 2 && fork_uses[i] != 1) {
      graph_error(quiet, "layer %d (%s) feeds %d layers that no one layer joins", i, L[i].name, consumers[i]);
      goto out;
    }
  /* a main-chain layer must not read a branch's inside */
  for (int i = 0; i < n; i++)
    if (mem[i] == -1 && L[i].ninputs == 1 && L[i].inputs[0] >= 0 && mem[L[i].inputs[0]] != -1) {
      graph_error(quiet, "layer %d reads layer %d inside a branch", i, L[i].inputs[0]);
      goto out;
    }
  if (member != NULL) memcpy(member, mem, (size_t)n * sizeof(int));
  rc = 0;
out:
  tide__free(consumers);
  tide__free(fork_uses);
  tide__free(mem);
  return rc;
}

int tide__plan_graph_check(const tide_profile_layer_t *layers, int n, int *member) {
  return graph_check(layers, n, member, member == NULL);
}

/* ---- the cost model ------------------------------------------------------------- */

static int log2i(int w) {
  int k = 0;
  while ((1 << k) < w) k++;
  return k;
}

/* tide's allreduce of `bytes` among n (a power of two) ranks under
 * TIDE_ALGO=auto: the header's alpha, then recursive doubling up to 64 KiB,
 * ring above (docs/algorithms.md). */
static double allreduce_time(double bytes, int n, double alpha, double beta) {
  if (n <= 1 || bytes <= 0) return 0.0;
  int lg = log2i(n);
  if (bytes <= SMALL_BYTES) return alpha * (1 + lg) + lg * bytes * beta;
  return alpha * (1 + 2.0 * (n - 1)) + 2.0 * (n - 1) / n * bytes * beta;
}

/* Moving a global tensor of `bytes` from wa to wb workers (the narrower group
 * being the first ranks of the wider): each worker of the narrow side
 * exchanges with hi/lo - 1 peers and keeps its own share. */
static double redistribute_time(double bytes, int wa, int wb, double alpha, double beta) {
  if (wa == wb || bytes <= 0) return 0.0;
  int lo = wa < wb ? wa : wb, hi = wa < wb ? wb : wa;
  return alpha * (hi / lo - 1) + (bytes / lo - bytes / hi) * beta;
}

typedef struct {
  const tide_profile_t *p;
  const tide_profile_layer_t *L;
  int n, nw, batch;
  int widths[MAX_WIDTHS];
  double alpha, beta, limit;
  double lambda;           /* the program minimises time + lambda x worker-time */
  double *node_time, *amp; /* [layer][k]: compute + sync; amplification */
  double *compute, *sync;
  unsigned char *ok;       /* [layer][k] within the limit */
} model_t;

typedef struct {
  double t, w;
} cost_t;

static const cost_t INF = {INFINITY, INFINITY};

static int cost_less(const model_t *m, cost_t a, cost_t b) {
  if (m->lambda == 0) return a.t < b.t || (a.t == b.t && a.w < b.w); /* INF's 0 x inf would be NaN */
  double x = a.t + m->lambda * a.w, y = b.t + m->lambda * b.w;
  return x < y || (x == y && a.w < b.w);
}
static cost_t cost_add(cost_t a, cost_t b) { return (cost_t){a.t + b.t, a.w + b.w}; }

static cost_t node_cost(const model_t *m, int i, int k) {
  size_t at = (size_t)i * m->nw + k;
  if (!m->ok[at]) return INF;
  double t = m->node_time[at];
  return (cost_t){t, t * m->widths[k]};
}

/* forward activations and backward gradients of layer x's output */
static cost_t edge_cost(const model_t *m, int x, int ka, int kb) {
  if (x < 0 || ka == kb) return (cost_t){0, 0};
  int wa = m->widths[ka], wb = m->widths[kb];
  double t = 2 * redistribute_time(m->L[x].act_bytes * m->batch, wa, wb, m->alpha, m->beta);
  return (cost_t){t, t * (wa > wb ? wa : wb)};
}

static int options_check(const tide_profile_t *p, const tide_plan_options_t *o, const char *who) {
  if (p == NULL || o == NULL) {
    TIDE_ERROR("%s: %s must not be NULL", who, p == NULL ? "profile" : "options");
    return TIDE_EINVAL;
  }
  if (o->workers < 1 || o->workers > 1 << 16 || (o->workers & (o->workers - 1)) != 0) {
    TIDE_ERROR("%s: workers = %d must be a power of two in [1, 65536]", who, o->workers);
    return TIDE_EINVAL;
  }
  if (o->global_batch < 1) {
    TIDE_ERROR("%s: global batch = %d must be >= 1", who, o->global_batch);
    return TIDE_EINVAL;
  }
  if (!(o->amplification >= 1) || !isfinite(o->amplification)) {
    TIDE_ERROR("%s: amplification = %g must be a number >= 1", who, o->amplification);
    return TIDE_EINVAL;
  }
  if (!(o->bandwidth > 0) || !isfinite(o->bandwidth)) {
    TIDE_ERROR("%s: bandwidth = %g must be a number of bytes/s > 0", who, o->bandwidth);
    return TIDE_EINVAL;
  }
  if (o->cores < 0) {
    TIDE_ERROR("%s: cores = %d must be >= 0 (0: one core per worker)", who, o->cores);
    return TIDE_EINVAL;
  }
  if (!(o->latency >= 0) || !isfinite(o->latency)) {
    TIDE_ERROR("%s: latency = %g must be a number of seconds >= 0", who, o->latency);
    return TIDE_EINVAL;
  }
  if (!(o->time_slack >= 1) || !isfinite(o->time_slack)) {
    TIDE_ERROR("%s: time slack = %g must be a number >= 1 (1: the fastest plan)", who, o->time_slack);
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide__profile_check(p, who));
  return 0;
}

static void model_free(model_t *m) {
  tide__free(m->node_time);
  tide__free(m->amp);
  tide__free(m->compute);
  tide__free(m->sync);
  tide__free(m->ok);
}

static int model_init(model_t *m, const tide_profile_t *p, const tide_plan_options_t *o) {
  memset(m, 0, sizeof *m);
  m->p = p;
  m->n = tide_profile_layer_count(p);
  m->L = tide_profile_layer(p, 0);
  m->batch = o->global_batch;
  m->alpha = o->latency;
  m->beta = 1.0 / o->bandwidth;
  m->limit = o->amplification;
  for (int w = 1; w <= o->workers && w <= o->global_batch; w *= 2) m->widths[m->nw++] = w;
  size_t cells = (size_t)m->n * m->nw;
  m->node_time = tide__malloc(cells * sizeof(double));
  m->amp = tide__malloc(cells * sizeof(double));
  m->compute = tide__malloc(cells * sizeof(double));
  m->sync = tide__malloc(cells * sizeof(double));
  m->ok = tide__malloc(cells);
  if (!m->node_time || !m->amp || !m->compute || !m->sync || !m->ok) {
    model_free(m);
    return TIDE_ENOMEM;
  }
  for (int i = 0; i < m->n; i++) {
    double base = tide_profile_time(p, i, m->batch);
    for (int k = 0; k < m->nw; k++) {
      size_t at = (size_t)i * m->nw + k;
      int w = m->widths[k];
      double c = tide_profile_time(p, i, (m->batch + w - 1) / w);
      if (o->cores > 0 && w > o->cores) c *= (double)w / o->cores; /* time-shared cores */
      double s = allreduce_time(m->L[i].param_bytes, w, m->alpha, m->beta);
      double a = w * (c + s);
      a = a <= base ? 1.0 : base > 0 ? a / base : INFINITY;
      m->compute[at] = c, m->sync[at] = s, m->node_time[at] = c + s, m->amp[at] = a;
      m->ok[at] = o->data_parallel ? k == m->nw - 1 : (k == 0 || a <= m->limit * (1 + 1e-12));
    }
  }
  return 0;
}

/* The plan of given width indices ks[layer]. */
static int plan_build(const model_t *m, const tide_plan_options_t *o, const int *ks, tide_plan_t **out) {
  tide_plan_t *plan = tide__calloc(1, sizeof *plan);
  if (plan == NULL || (plan->layers = tide__calloc((size_t)m->n, sizeof *plan->layers)) == NULL) {
    tide__free(plan);
    return TIDE_ENOMEM;
  }
  snprintf(plan->model, sizeof plan->model, "%s", tide_profile_model(m->p));
  plan->opts = *o;
  plan->n = m->n;
  double t = 0, work = 0;
  for (int i = 0; i < m->n; i++) {
    size_t at = (size_t)i * m->nw + ks[i];
    tide_plan_layer_t *l = &plan->layers[i];
    l->width = m->widths[ks[i]];
    l->compute = m->compute[at];
    l->sync = m->sync[at];
    l->amplification = m->amp[at];
    for (int k = 0; k < m->L[i].ninputs; k++) {
      int x = m->L[i].inputs[k];
      cost_t e = edge_cost(m, x, x >= 0 ? ks[x] : ks[i], ks[i]);
      l->transfer += e.t;
      work += e.w;
    }
    t += l->compute + l->sync + l->transfer;
    work += l->width * (l->compute + l->sync);
  }
  plan->iteration_time = t;
  plan->worker_time = work;
  *out = plan;
  return 0;
}

static int width_index(const model_t *m, int w) {
  for (int k = 0; k < m->nw; k++)
    if (m->widths[k] == w) return k;
  return -1;
}

int tide_plan_evaluate(const tide_profile_t *p, const tide_plan_options_t *o, const int *widths, tide_plan_t **out) {
  TIDE_CHECK(options_check(p, o, "tide_plan_evaluate"));
  if (widths == NULL || out == NULL) {
    TIDE_ERROR("tide_plan_evaluate: %s must not be NULL", widths == NULL ? "widths" : "out");
    return TIDE_EINVAL;
  }
  model_t m;
  TIDE_CHECK(model_init(&m, p, o));
  int rc = 0, *ks = tide__malloc((size_t)m.n * sizeof(int));
  if (ks == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int i = 0; i < m.n; i++)
    if ((ks[i] = width_index(&m, widths[i])) < 0) {
      TIDE_ERROR("tide_plan_evaluate: layer %d: width %d is not a power of two in [1, min(workers = %d, global "
                 "batch = %d)]", i, widths[i], o->workers, o->global_batch);
      rc = TIDE_EINVAL;
      goto out;
    }
  rc = plan_build(&m, o, ks, out);
out:
  tide__free(ks);
  model_free(&m);
  return rc;
}

/* Best costs through branch chain `chain[0..len)` (from fork F at width kf)
 * into d[k] = cost of the chain's last layer at width k; arg[j][k] keeps
 * the previous layer's width (NULL: not kept). */
static void chain_dp(const model_t *m, int fork, int kf, const int *chain, int len, cost_t *d, cost_t *tmp,
                     int *arg) {
  int nw = m->nw;
  for (int k = 0; k < nw; k++) d[k] = cost_add(edge_cost(m, fork, kf, k), node_cost(m, chain[0], k));
  for (int j = 1; j < len; j++) {
    for (int k = 0; k < nw; k++) {
      cost_t node = node_cost(m, chain[j], k), best = INF;
      int bk = 0;
      if (!isinf(node.t))
        for (int kp = 0; kp < nw; kp++) {
          cost_t c = cost_add(d[kp], edge_cost(m, chain[j - 1], kp, k));
          if (cost_less(m, c, best)) best = c, bk = kp;
        }
      tmp[k] = cost_add(best, node);
      if (arg != NULL) arg[(size_t)j * nw + k] = bk;
    }
    memcpy(d, tmp, (size_t)nw * sizeof *d);
  }
}

/* The widths ks[layer] of the plan minimising time + m->lambda x
 * worker-time within the amplification limit. */
static int solve(const model_t *mp, int *ks) {
  const model_t m = *mp;
  int n = m.n, nw = m.nw, rc = 0;
  const tide_profile_layer_t *L = m.L;
  int *member = tide__malloc((size_t)n * sizeof(int)), *arg = tide__malloc((size_t)n * nw * sizeof(int));
  int *chain = tide__malloc((size_t)n * sizeof(int));
  int *carg = tide__malloc((size_t)n * nw * sizeof(int));
  cost_t *cost = tide__malloc((size_t)n * nw * sizeof(cost_t));
  cost_t *d = tide__malloc((size_t)nw * sizeof(cost_t)), *tmp = tide__malloc((size_t)nw * sizeof(cost_t));
  cost_t *block = tide__malloc((size_t)nw * nw * sizeof(cost_t)); /* [kf][kj] */
  if (!member || !arg || !chain || !carg || !cost || !d || !tmp || !block) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  TIDE_CHECK_GOTO(graph_check(L, n, member, 0), rc, out);
  for (int i = 0; i < n; i++) {
    if (member[i] != -1) continue;
    if (L[i].ninputs == 1) {
      int x = L[i].inputs[0];
      for (int k = 0; k < nw; k++) {
        cost_t node = node_cost(&m, i, k), best = x < 0 ? (cost_t){0, 0} : INF;
        int bk = k;
        if (x >= 0 && !isinf(node.t))
          for (int kp = 0; kp < nw; kp++) {
            cost_t c = cost_add(cost[(size_t)x * nw + kp], edge_cost(&m, x, kp, k));
            if (cost_less(&m, c, best)) best = c, bk = kp;
          }
        cost[(size_t)i * nw + k] = cost_add(best, node);
        arg[(size_t)i * nw + k] = bk;
      }
      continue;
    }
    /* a join: its fork is where every input's chain starts */
    int fork = L[i].inputs[0];
    while (fork >= 0 && member[fork] == i) fork = L[fork].inputs[0];
    for (int kf = 0; kf < nw; kf++) {
      cost_t start = fork >= 0 ? cost[(size_t)fork * nw + kf] : (cost_t){0, 0};
      for (int kj = 0; kj < nw; kj++) block[(size_t)kf * nw + kj] = start;
      if (isinf(start.t)) continue;
      for (int b = 0; b < L[i].ninputs; b++) {
        int e = L[i].inputs[b], len = 0;
        for (int x = e; x != fork; x = L[x].inputs[0]) chain[len++] = x;
        if (len == 0) { /* the fork itself feeds the join */
          for (int kj = 0; kj < nw; kj++)
            block[(size_t)kf * nw + kj] = cost_add(block[(size_t)kf * nw + kj], edge_cost(&m, fork, kf, kj));
          continue;
        }
        for (int a = 0, z = len - 1; a < z; a++, z--) {
          int t = chain[a];
          chain[a] = chain[z], chain[z] = t;
        }
        chain_dp(&m, fork, kf, chain, len, d, tmp, NULL);
        for (int kj = 0; kj < nw; kj++) {
          cost_t best = INF;
          for (int k = 0; k < nw; k++) {
            cost_t c = cost_add(d[k], edge_cost(&m, e, k, kj));
            if (cost_less(&m, c, best)) best = c;
          }
          block[(size_t)kf * nw + kj] = cost_add(block[(size_t)kf * nw + kj], best);
        }
      }
    }
    for (int kj = 0; kj < nw; kj++) {
      cost_t node = node_cost(&m, i, kj), best = INF;
      int bk = 0;
      for (int kf = 0; kf < nw; kf++)
        if (cost_less(&m, block[(size_t)kf * nw + kj], best)) best = block[(size_t)kf * nw + kj], bk = kf;
      cost[(size_t)i * nw + kj] = cost_add(best, node);
      arg[(size_t)i * nw + kj] = bk;
    }
  }
  /* the end, then back through the stored choices */
  int kbest = 0;
  for (int k = 1; k < nw; k++)
    if (cost_less(&m, cost[(size_t)(n - 1) * nw + k], cost[(size_t)(n - 1) * nw + kbest])) kbest = k;
  if (isinf(cost[(size_t)(n - 1) * nw + kbest].t)) {
    TIDE_ERROR("tide_plan_create: no plan within the limits");
    rc = TIDE_EINVAL;
    goto out;
  }
  for (int i = n - 1, k = kbest; i >= 0;) {
    ks[i] = k;
    if (L[i].ninputs == 1) {
      int x = L[i].inputs[0];
      k = arg[(size_t)i * nw + k];
      if (x < 0) {
        i = -1;
        break;
      }
      i = x;
      continue;
    }
    int fork = L[i].inputs[0], kj = k, kf = arg[(size_t)i * nw + k];
    while (fork >= 0 && member[fork] == i) fork = L[fork].inputs[0];
    for (int b = 0; b < L[i].ninputs; b++) {
      int e = L[i].inputs[b], len = 0;
      for (int x = e; x != fork; x = L[x].inputs[0]) chain[len++] = x;
      if (len == 0) continue;
      for (int a = 0, z = len - 1; a < z; a++, z--) {
        int t = chain[a];
        chain[a] = chain[z], chain[z] = t;
      }
      chain_dp(&m, fork, kf, chain, len, d, tmp, carg);
      cost_t best = INF;
      int kl = 0;
      for (int kk = 0; kk < nw; kk++) {
        cost_t c = cost_add(d[kk], edge_cost(&m, e, kk, kj));
        if (cost_less(&m, c, best)) best = c, kl = kk;
      }
      for (int j = len - 1; j >= 0; j--) {
        ks[chain[j]] = kl;
        if (j > 0) kl = carg[(size_t)j * nw + kl];
      }
    }
    if (fork < 0) break;
    i = fork;
    k = kf;
  }
out:
  tide__free(member);
  tide__free(arg);
  tide__free(chain);
  tide__free(carg);
  tide__free(cost);
  tide__free(d);
  tide__free(tmp);
  tide__free(block);
  return rc;
}

/* The predicted iteration time and worker-time of widths ks. */
static int plan_costs(const model_t *m, const tide_plan_options_t *o, const int *ks, double *t, double *w) {
  tide_plan_t *plan;
  TIDE_CHECK(plan_build(m, o, ks, &plan));
  *t = plan->iteration_time;
  *w = plan->worker_time;
  tide_plan_destroy(plan);
  return 0;
}

int tide_plan_create(const tide_profile_t *p, const tide_plan_options_t *o, tide_plan_t **out) {
  TIDE_CHECK(options_check(p, o, "tide_plan_create"));
  if (out == NULL) {
    TIDE_ERROR("tide_plan_create: out must not be NULL");
    return TIDE_EINVAL;
  }
  model_t m;
  TIDE_CHECK(model_init(&m, p, o));
  int rc = TIDE_ENOMEM, *ks = tide__malloc((size_t)m.n * sizeof(int)), *try = tide__malloc((size_t)m.n * sizeof(int));
  if (ks == NULL || try == NULL) goto out;
  m.lambda = 0;
  TIDE_CHECK_GOTO(solve(&m, ks), rc, out);
  if (o->time_slack > 1 && !o->data_parallel) {
    /* The least worker-time within time_slack x the fastest plan's time:
     * the program on time + lambda x worker-time, whose time grows and
     * worker-time falls with lambda; the largest lambda within the budget
     * by doubling, then bisection (on the plans' convex hull). */
    double t, w, budget, best_w;
    TIDE_CHECK_GOTO(plan_costs(&m, o, ks, &t, &w), rc, out);
    budget = t * o->time_slack * (1 + 1e-12);
    best_w = w;
    double lo = 0, hi = 1e-3;
    for (int i = 0; i < 80; i++, hi *= 4) {
      m.lambda = hi;
      TIDE_CHECK_GOTO(solve(&m, try), rc, out);
      TIDE_CHECK_GOTO(plan_costs(&m, o, try, &t, &w), rc, out);
      if (t > budget) break;
      if (w < best_w) best_w = w, memcpy(ks, try, (size_t)m.n * sizeof(int));
      lo = hi;
    }
    for (int i = 0; i < 30 && hi > lo * (1 + 1e-6); i++) {
      m.lambda = lo > 0 ? sqrt(lo * hi) : hi / 4;
      TIDE_CHECK_GOTO(solve(&m, try), rc, out);
      TIDE_CHECK_GOTO(plan_costs(&m, o, try, &t, &w), rc, out);
      if (t <= budget) {
        if (w < best_w) best_w = w, memcpy(ks, try, (size_t)m.n * sizeof(int));
        lo = m.lambda;
      } else {
        hi = m.lambda;
      }
    }
    /* The hull skips plans between its corners: then one layer at a time
     * to the width that saves the most worker-time within the budget,
     * while any does. */
    for (int improved = 1; improved;) {
      improved = 0;
      int bi = -1, bk = 0;
      double bw = best_w;
      for (int i = 0; i < m.n; i++) {
        int k0 = ks[i];
        for (int k = 0; k < m.nw; k++) {
          if (k == k0 || !m.ok[(size_t)i * m.nw + k]) continue;
          ks[i] = k;
          TIDE_CHECK_GOTO(plan_costs(&m, o, ks, &t, &w), rc, out);
          if (t <= budget && w < bw) bw = w, bi = i, bk = k;
        }
        ks[i] = k0;
      }
      if (bi >= 0) ks[bi] = bk, best_w = bw, improved = 1;
    }
  }
  rc = plan_build(&m, o, ks, out);
out:
  tide__free(ks);
  tide__free(try);
  model_free(&m);
  return rc;
}

void tide_plan_destroy(tide_plan_t *plan) {
  if (plan == NULL) return;
  tide__free(plan->layers);
  tide__free(plan);
}

int tide_plan_layers(const tide_plan_t *plan, const tide_plan_layer_t **layers) {
  if (layers != NULL) *layers = plan != NULL ? plan->layers : NULL;
  return plan != NULL ? plan->n : 0;
}

double tide_plan_iteration_time(const tide_plan_t *plan) { return plan != NULL ? plan->iteration_time : NAN; }
double tide_plan_worker_time(const tide_plan_t *plan) { return plan != NULL ? plan->worker_time : NAN; }

int tide_plan_feasible(const tide_plan_t *plan, double limit) {
  if (plan == NULL) return 0;
  for (int i = 0; i < plan->n; i++)
    if (plan->layers[i].width > 1 && !(plan->layers[i].amplification <= limit * (1 + 1e-9))) return 0;
  return 1;
}

/* ---- plan files ------------------------------------------------------------------ */

int tide_plan_write(const tide_plan_t *plan, const tide_profile_t *p, const char *path) {
  if (plan == NULL || p == NULL || path == NULL) {
    TIDE_ERROR("tide_plan_write: %s must not be NULL", plan == NULL ? "plan" : p == NULL ? "profile" : "path");
    return TIDE_EINVAL;
  }
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    TIDE_ERROR("tide_plan_write: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  const tide_plan_options_t *o = &plan->opts;
  fprintf(f, "{\n\"model\": \"%s\",\n\"workers\": %d,\n\"global_batch\": %d,\n\"amplification_limit\": %.17g,\n",
          plan->model, o->workers, o->global_batch, o->amplification);
  fprintf(f, "\"bandwidth\": %.17g,\n\"latency\": %.17g,\n\"data_parallel\": %d,\n", o->bandwidth, o->latency,
          o->data_parallel);
  if (o->cores > 0) fprintf(f, "\"cores\": %d,\n", o->cores);
  fprintf(f, "\"iteration_time\": %.17g,\n\"worker_time\": %.17g,\n\"layers\": [\n", plan->iteration_time,
          plan->worker_time);
  for (int i = 0; i < plan->n; i++) {
    const tide_plan_layer_t *l = &plan->layers[i];
    const tide_profile_layer_t *pl = tide_profile_layer(p, i);
    fprintf(f, "{\"index\": %d, \"name\": \"", i);
    for (const char *c = pl != NULL ? pl->name : ""; *c; c++) fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
    fprintf(f, "\", \"width\": %d, \"compute\": %.9g, \"sync\": %.9g, \"transfer\": %.9g, \"amplification\": %.9g}%s\n",
            l->width, l->compute, l->sync, l->transfer, l->amplification, i + 1 < plan->n ? "," : "");
  }
  fprintf(f, "]\n}\n");
  if (fclose(f) != 0) {
    TIDE_ERROR("tide_plan_write: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  return 0;
}

int tide_plan_read_widths(const char *path, const tide_profile_t *p, int workers, int *widths) {
  if (path == NULL || p == NULL || widths == NULL) {
    TIDE_ERROR("tide_plan_read_widths: %s must not be NULL", path == NULL ? "path" : p == NULL ? "profile" : "widths");
    return TIDE_EINVAL;
  }
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    int e = errno;
    TIDE_ERROR("tide_plan_read_widths: cannot open %s: %s", path, strerror(e));
    return e == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  }
  int n = tide_profile_layer_count(p), seen = 0, rc = TIDE_EINVAL, line = 0, have_model = 0;
  char buf[4096];
  int *got = tide__calloc((size_t)(n > 0 ? n : 1), sizeof(int));
  if (got == NULL) {
    fclose(f);
    return TIDE_ENOMEM;
  }
  while (fgets(buf, sizeof buf, f) != NULL) {
    line++;
    char model[64];
    int v;
    if (sscanf(buf, " \"model\": \"%63[^\"]\"", model) == 1) {
      have_model = 1;
      if (strcmp(model, tide_profile_model(p)) != 0) {
        TIDE_ERROR("tide_plan_read_widths: %s:%d: \"model\" is \"%s\" but the profile is of \"%s\": make the plan "
                   "from this model's profile", path, line, model, tide_profile_model(p));
        goto out;
      }
    } else if (sscanf(buf, " \"workers\": %d", &v) == 1) {
      if (v > workers) {
        TIDE_ERROR("tide_plan_read_widths: %s:%d: \"workers\" = %d but the job has %d workers", path, line, v,
                   workers);
        goto out;
      }
    } else if (strstr(buf, "\"index\":") != NULL) {
      const char *wat = strstr(buf, "\"width\":");
      int index = -1, w = 0;
      if (sscanf(strstr(buf, "\"index\":"), "\"index\": %d", &index) != 1 || wat == NULL ||
          sscanf(wat, "\"width\": %d", &w) != 1) {
        TIDE_ERROR("tide_plan_read_widths: %s:%d: a layer needs \"index\" and \"width\"", path, line);
        goto out;
      }
      if (index < 0 || index >= n || got[index]) {
        TIDE_ERROR("tide_plan_read_widths: %s:%d: layer \"index\" %d is %s (the profile has %d layers)", path, line,
                   index, index >= 0 && index < n ? "given twice" : "out of range", n);
        goto out;
      }
      if (w < 1 || (w & (w - 1)) != 0 || w > workers) {
        TIDE_ERROR("tide_plan_read_widths: %s:%d: layer %d: \"width\" = %d must be a power of two in [1, %d "
                   "workers]", path, line, index, w, workers);
        goto out;
      }
      got[index] = w;
      seen++;
    }
  }
  if (!have_model) {
    TIDE_ERROR("tide_plan_read_widths: %s: no \"model\" field: not a plan file", path);
    goto out;
  }
  if (seen != n) {
    TIDE_ERROR("tide_plan_read_widths: %s: %d layers, but the profile of %s has %d: make the plan from this "
               "model's profile", path, seen, tide_profile_model(p), n);
    goto out;
  }
  memcpy(widths, got, (size_t)n * sizeof(int));
  rc = 0;
out:
  tide__free(got);
  fclose(f);
  return rc;
}
