/* The step API and adaptation: the spec's test vectors against the
 * monitor's formulas; the noise-scale estimator on least squares with a
 * known tr(Sigma) and |G|^2; every sample used once per epoch across batch
 * size changes mid-epoch (with accumulation); policies that decide the
 * same on every rank at np 1, 2 and 4; state save/restore that resumes bit
 * for bit; and bad arguments that fail with TIDE_EINVAL. The "model" is a
 * linear least-squares problem computed here, so no dataset is needed. */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "policy/policy.h"

static int close_to(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b); }

/* ---- the spec's test vectors (../shared/spec/adaptation.md) ---- */

static int vectors_rank(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  double g2, tr;
  CHECK_OK(tide_gns_estimate(32, 256, 2.0, 1.2, &g2, &tr));
  CHECK(close_to(g2, 1.085714, 1e-6) && close_to(tr, 29.257143, 1e-6));
  CHECK(close_to(tr / g2, 26.947368, 1e-6));
  CHECK(close_to(tide_adascale_gain(3, 1, 4), 2.285714, 1e-6));
  CHECK(close_to(tide_adascale_gain(0, 1, 8), 1, 1e-5)); /* no noise: 1 (var clamped at 1e-6) */
  /* the clamp is AdaptDL's 1e-6, not 1e-12: var 1e-9 counts as 1e-6 */
  CHECK(tide_adascale_gain(1e-9, 1e-6, 8) == tide_adascale_gain(1e-6, 1e-6, 8));
  CHECK(close_to(tide_adascale_gain(1e-9, 1e-6, 8), 2 / (1.0 / 8 + 1), 1e-9));
  CHECK(close_to(tide_adascale_gain(1, 0, 8), 8, 1e-9)); /* pure noise: linear */
  CHECK(close_to(tide_pollux_efficiency(1000, 128, 1024), 0.557312, 1e-6));
  /* AdaptDL's form, E = gain / scale with var = phi / M0, sqr = 1, agrees */
  CHECK(close_to(tide_adascale_gain(1000.0 / 128, 1, 8) / 8, 0.557312, 1e-6));
  tide_pollux_model_t m = {.alpha_c = .01, .beta_c = .001, .alpha_n = .05, .beta_n = .005, .gamma = 2};
  CHECK(close_to(tide_pollux_throughput(&m, 2, 8, 64, 0), 4698.24, 1e-6));
  CHECK_RC(tide_gns_estimate(32, 32, 1, 1, &g2, &tr), TIDE_EINVAL);
  CHECK_RC(tide_gns_estimate(0.5, 32, 1, 1, &g2, &tr), TIDE_EINVAL);
  CHECK_RC(tide_gns_estimate(8, 32, -1, 1, &g2, &tr), TIDE_EINVAL);
  CHECK(isnan(tide_adascale_gain(1, 1, 0.5)) && isnan(tide_pollux_efficiency(-1, 1, 1)));
  CHECK(isnan(tide_pollux_throughput(NULL, 1, 1, 1, 0)));
  printf("test vectors: ok\n");
  return 0;
}

/* ---- least squares ---- */

/* Example i: x ~ N(0, I_D) and y = x.w_star + e, e ~ N(0, SIGMA^2), drawn
 * from i alone. At parameters w with delta = w - w_star the gradient of
 * 0.5 (x.w - y)^2 is x x^T delta - e x, so G = delta, |G|^2 = |delta|^2 and
 * (Isserlis) tr(Sigma) = (D + 1)|delta|^2 + D SIGMA^2. */
enum { D = 16 };
static const double SIGMA = 1.0;

static double gauss(uint64_t *s) {
  double u[2];
  for (int k = 0; k < 2; k++) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    u[k] = ((double)((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Mean gradient over the examples idx[0..n) at w (w_star = 0). */
static void lsq_grad(const float *w, const uint64_t *idx, size_t n, float *grad) {
  double g[D] = {0};
  for (size_t k = 0; k < n; k++) {
    uint64_t s = idx[k] * 7919 + 1;
    double x[D], r = 0;
    for (int j = 0; j < D; j++) x[j] = gauss(&s), r += x[j] * w[j];
    r -= SIGMA * gauss(&s);
    for (int j = 0; j < D; j++) g[j] += r * x[j];
  }
  for (int j = 0; j < D; j++) grad[j] = (float)(g[j] / (double)n);
}

static const tide_tensor_t halves[2] = {{"a.weight", 0, D / 2, 1, {D / 2}}, {"b.weight", D / 2, D / 2, 1, {D / 2}}};

static void config_for(tide_trainer_config_t *c, uint64_t n, int batch, double lr) {
  tide_trainer_config_default(c);
  c->dataset_size = n;
  c->batch = batch;
  c->epochs = 1;
  tide_optim_config_default(TIDE_OPTIM_SGD, &c->optim);
  c->schedule.kind = TIDE_LR_CONSTANT;
  c->schedule.base_lr = (float)lr;
}

/* Runs the trainer to the end; *steps and the final stats. */
static void run_all(tide_trainer_t *tr, float *w, float *grad, long *steps, tide_step_stats_t *last) {
  tide_batch_t b;
  *steps = 0;
  while (tide_trainer_next(tr, &b) == 0 && !b.done) {
    if (b.count > 0) lsq_grad(w, b.indices, b.count, grad);
    tide_step_stats_t s;
    CHECK_OK(tide_trainer_step(tr, 0.5, &s));
    if (s.stepped) *steps += 1, *last = s;
  }
  CHECK(b.done);
}

/* At fixed parameters (lr 0) the smoothed B_simple, |G|^2 and tr(Sigma)
 * converge to the true ones: 4 ranks x 8 samples, B_small 8, B_big 32. */
static int gns_rank(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D], grad[D];
  for (int j = 0; j < D; j++) w[j] = 0.5f;
  tide_trainer_config_t c;
  config_for(&c, 96000, 8, 0.0);
  c.gns_decay = 0.999;
  c.tensor_stats = 1;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, halves, 2, &tr));
  long steps;
  tide_step_stats_t s = {0};
  run_all(tr, w, grad, &steps, &s);
  double delta2 = D * 0.25, want_tr = (D + 1) * delta2 + D * SIGMA * SIGMA, want = want_tr / delta2;
  if (rank == 0)
    printf("noise scale at np %d: %.2f (true %.2f), |G|^2 %.3f (%.3f), tr(Sigma) %.2f (%.2f) after %ld steps\n",
           size, s.noise_scale, want, s.grad_sq, delta2, s.trace_sigma, want_tr, steps);
  CHECK(close_to(s.noise_scale, want, 0.10));
  CHECK(close_to(s.grad_sq, delta2, 0.10) && close_to(s.trace_sigma, want_tr, 0.10));
  /* per tensor: each half has |G|^2 = 2 and tr = (D+1)*2... half of the trace */
  double g2, t2;
  CHECK_OK(tide_trainer_tensor_stats(tr, 1, &g2, &t2));
  CHECK(close_to(g2, delta2 / 2, 0.15) && close_to(t2, want_tr / 2, 0.15));
  CHECK_RC(tide_trainer_tensor_stats(tr, 2, &g2, &t2), TIDE_EINVAL);
  tide_trainer_destroy(tr);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- every sample once per epoch across batch changes ---- */

/* A policy that sets the global batch from a fixed list of steps. */
typedef struct {
  long at[4], batch[4];
} schedule_policy_t;

static int scheduled_batch(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  schedule_policy_t *p = state;
  for (int i = 0; i < 4; i++)
    if (p->at[i] == s->step) d->global_batch = p->batch[i];
  return 0;
}

enum { COVER_N = 1237 };

static int cover_rank(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D] = {0}, grad[D];
  tide_trainer_config_t c;
  config_for(&c, COVER_N, 5, 0.01);
  c.max_batch = 7; /* larger shares accumulate micro-batches */
  c.epochs = 2.5;  /* ends mid-epoch 2 */
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, NULL, 0, &tr));
  schedule_policy_t *p = malloc(sizeof *p);
  *p = (schedule_policy_t){{3, 7, 20, 30}, {13, 61, 2, 29}};
  tide_policy_ops_t ops = {.name = "schedule", .before_step = scheduled_batch, .destroy = free,
                           .state_size = sizeof *p};
  CHECK_OK(tide_trainer_add_policy(tr, &ops, p));
  int64_t *seen = calloc(2 * COVER_N, sizeof *seen);
  tide_batch_t b;
  int max_accum = 0;
  while (tide_trainer_next(tr, &b) == 0 && !b.done) {
    CHECK(b.count <= 7 && b.epoch < 3);
    if (b.micro_count > max_accum) max_accum = b.micro_count;
    if (b.epoch < 2)
      for (size_t i = 0; i < b.count; i++) seen[b.epoch * COVER_N + b.indices[i]]++;
    if (b.count > 0) lsq_grad(w, b.indices, b.count, grad);
    CHECK_OK(tide_trainer_step(tr, 1.0, NULL));
  }
  CHECK_OK(tide_allreduce(comm, seen, seen, 2 * COVER_N, TIDE_I64, TIDE_SUM));
  for (int i = 0; i < 2 * COVER_N; i++) CHECK(seen[i] == 1);
  CHECK(max_accum >= 2 || size * 7 >= 61);
  const tide_step_stats_t *s = tide_trainer_stats(tr);
  CHECK(s->epochs_done >= 2.5);
  if (rank == 0) printf("coverage at np %d: every sample once in epochs 0 and 1 across 4 batch changes\n", size);
  tide_trainer_destroy(tr);
  free(seen);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- policies decide the same on every rank ---- */

static uint64_t mix(uint64_t h, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  return (h ^ bits) * 1099511628211ull;
}

static int policies_rank(int rank, int size, void *arg) {
  const char *list = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D], grad[D];
  for (int j = 0; j < D; j++) w[j] = 1.0f;
  tide_trainer_config_t c;
  config_for(&c, 40000, 4, 0.02);
  c.max_batch = 32;
  c.max_accum = 4;
  c.base_batch = 8;
  c.epochs = 0.5;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, halves, 2, &tr));
  CHECK_OK(tide_trainer_adapt(tr, list));
  tide_batch_t b;
  uint64_t h = 1469598103934665603ull;
  long first = 0, last = 0, steps = 0;
  while (tide_trainer_next(tr, &b) == 0 && !b.done) {
    if (b.count > 0) lsq_grad(w, b.indices, b.count, grad);
    tide_step_stats_t s;
    CHECK_OK(tide_trainer_step(tr, 1.0, &s));
    if (!s.stepped) continue;
    if (steps++ == 0) first = s.planned_batch;
    last = s.planned_batch;
    h = mix(mix(mix(mix(h, (double)s.planned_batch), s.lr), s.gain), s.exchange);
  }
  uint64_t all[8];
  CHECK_OK(tide_allgather(comm, &h, all, 1, TIDE_I64));
  for (int r = 0; r < size; r++) CHECK(all[r] == all[0]);
  for (int j = 0; j < D; j++) CHECK(isfinite(w[j]));
  uint64_t pw = 1469598103934665603ull;
  for (int j = 0; j < D; j++) pw = mix(pw, w[j]);
  CHECK_OK(tide_allgather(comm, &pw, all, 1, TIDE_I64));
  for (int r = 0; r < size; r++) CHECK(all[r] == all[0]);
  if (rank == 0)
    printf("policies %s at np %d: same decisions on every rank, %ld steps, global batch %ld -> %ld\n", list, size,
           steps, first, last);
  tide_trainer_destroy(tr);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- adasum: each rank's SGD step, the changes combined by Adasum ---- */

/* a = Adasum(a, b) on each half (the two tensors), in double. */
static void adasum_pair(double *a, const double *b) {
  for (int lo = 0; lo < D; lo += D / 2) {
    double ab = 0, aa = 0, bb = 0;
    for (int j = lo; j < lo + D / 2; j++) ab += a[j] * b[j], aa += a[j] * a[j], bb += b[j] * b[j];
    for (int j = lo; j < lo + D / 2; j++) a[j] = (1 - ab / (2 * aa)) * a[j] + (1 - ab / (2 * bb)) * b[j];
  }
}

/* np 2 and 4: after every step the parameters are the start plus the
 * Adasum tree of the ranks' SGD changes -lr g_r, per tensor, and the
 * replicas are identical; the run converges towards w_star = 0. */
static int adasum_rank(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D], grad[D], all[4 * D], ws[4 * D];
  for (int j = 0; j < D; j++) w[j] = 1.0f;
  tide_trainer_config_t c;
  config_for(&c, 640, 8, 0.05);
  c.exchange = TIDE_EXCHANGE_ADASUM;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, halves, 2, &tr));
  tide_batch_t b;
  double start = 0, end = 0;
  for (int j = 0; j < D; j++) start += (double)w[j] * w[j];
  long steps = 0;
  while (tide_trainer_next(tr, &b) == 0 && !b.done) {
    CHECK(b.count == 8);
    lsq_grad(w, b.indices, b.count, grad);
    CHECK_OK(tide_allgather(comm, grad, all, D, TIDE_F32));
    double delta[4][D];
    for (int r = 0; r < size; r++)
      for (int j = 0; j < D; j++) delta[r][j] = (double)((w[j] - 0.05f * all[r * D + j]) - w[j]);
    for (int half = 1; half < size; half *= 2) /* the tree: pairs, then pairs of pairs */
      for (int r = 0; r < size; r += 2 * half) adasum_pair(delta[r], delta[r + half]);
    double want[D];
    for (int j = 0; j < D; j++) want[j] = (double)w[j] + delta[0][j];
    tide_step_stats_t s;
    CHECK_OK(tide_trainer_step(tr, 1.0, &s));
    CHECK(s.stepped && s.global_batch == 8L * size && isnan(s.noise_scale));
    for (int j = 0; j < D; j++) CHECK(fabs(w[j] - want[j]) <= 1e-5 * (fabs(want[j]) + 1e-3));
    CHECK_OK(tide_allgather(comm, w, ws, D, TIDE_F32));
    for (int r = 1; r < size; r++) CHECK(memcmp(ws, ws + r * D, sizeof w) == 0);
    steps++;
  }
  CHECK(b.done && steps == 640 / (8 * size));
  for (int j = 0; j < D; j++) end += (double)w[j] * w[j];
  CHECK(end < 0.1 * start);
  if (rank == 0) printf("adasum exchange (np %d): %ld steps match the Adasum tree of the SGD changes, |w|^2 %.3g -> %.3g\n",
                        size, steps, start, end);
  tide_trainer_destroy(tr);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- save/restore resumes bit for bit ---- */

static void run_steps(tide_trainer_t *tr, float *w, float *grad, long n) {
  tide_batch_t b;
  for (long done = 0; done < n;) {
    CHECK_OK(tide_trainer_next(tr, &b));
    CHECK(!b.done);
    if (b.count > 0) lsq_grad(w, b.indices, b.count, grad);
    tide_step_stats_t s;
    CHECK_OK(tide_trainer_step(tr, 1.0, &s));
    done += s.stepped;
  }
}

static int restore_rank(int rank, int size, void *arg) {
  tide_exchange_t exchange = *(tide_exchange_t *)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D], grad[D], w2[D], grad2[D];
  for (int j = 0; j < D; j++) w[j] = 1.0f;
  tide_trainer_config_t c;
  config_for(&c, 5000, 8, 0.01);
  tide_optim_config_default(TIDE_OPTIM_ADAM, &c.optim);
  c.exchange = exchange;
  c.density = 0.25;
  c.epochs = 3;
  tide_trainer_t *a, *b;
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, halves, 2, &a));
  CHECK_OK(tide_trainer_adapt(a, "gns:warmup=5:every=5,adascale"));
  run_steps(a, w, grad, 37);
  size_t len = tide_trainer_state_size(a);
  char *state = malloc(len);
  CHECK_OK(tide_trainer_state_get(a, state, len));
  memcpy(w2, w, sizeof w);
  CHECK_OK(tide_trainer_create(comm, &c, w2, grad2, D, halves, 2, &b));
  CHECK_OK(tide_trainer_adapt(b, "gns:warmup=5:every=5,adascale"));
  CHECK_RC(tide_trainer_state_set(b, state, len - 1), TIDE_EINVAL);
  CHECK_OK(tide_trainer_state_set(b, state, len));
  run_steps(a, w, grad, 40);
  run_steps(b, w2, grad2, 40);
  CHECK(memcmp(w, w2, sizeof w) == 0);
  CHECK(tide_trainer_stats(a)->progress == tide_trainer_stats(b)->progress);
  /* a state from another trainer shape is refused, nothing changed */
  tide_trainer_t *other;
  float w3[D / 2], g3[D / 2];
  memset(w3, 0, sizeof w3);
  CHECK_OK(tide_trainer_create(comm, &c, w3, g3, D / 2, NULL, 0, &other));
  CHECK_RC(tide_trainer_state_set(other, state, len), TIDE_EINVAL);
  if (rank == 0) printf("save/restore (%s, np %d): resumed run identical after 40 more steps\n",
                        tide_exchange_name(exchange), size);
  free(state);
  tide_trainer_destroy(a);
  tide_trainer_destroy(b);
  tide_trainer_destroy(other);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- bad arguments ---- */

static int bad_rank(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D] = {0}, grad[D];
  tide_trainer_config_t c;
  tide_trainer_t *tr;
  config_for(&c, 0, 8, 0.1);
  CHECK_RC(tide_trainer_create(comm, &c, w, grad, D, NULL, 0, &tr), TIDE_EINVAL); /* dataset_size 0 */
  config_for(&c, 100, 8, 0.1);
  c.max_batch = 4;
  CHECK_RC(tide_trainer_create(comm, &c, w, grad, D, NULL, 0, &tr), TIDE_EINVAL); /* max_batch < batch */
  config_for(&c, 100, 8, 0.1);
  c.gns_decay = 1;
  CHECK_RC(tide_trainer_create(comm, &c, w, grad, D, NULL, 0, &tr), TIDE_EINVAL);
  config_for(&c, 100, 8, 0.1);
  CHECK_RC(tide_trainer_create(comm, &c, w, grad, D, halves, 1, &tr), TIDE_EINVAL); /* tensors leave a gap */
  CHECK_RC(tide_trainer_create(NULL, &c, w, grad, D, NULL, 0, &tr), TIDE_EINVAL);
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, NULL, 0, &tr));
  const char *bad[] = {"foo", "gns:max=abc", "gns:bogus=1", "adascale:x=1", "exchange:sparse=dense", "gns:max=1",
                       "pollux:every=0", "", ",gns", "gns:every", "exchange:high=2"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = tide_trainer_adapt(tr, bad[i]);
    if (rc != TIDE_EINVAL) {
      fprintf(stderr, "--adapt \"%s\" returned %d, wanted TIDE_EINVAL\n", bad[i], rc);
      exit(1);
    }
  }
  tide_step_stats_t s;
  CHECK_RC(tide_trainer_step(tr, 1.0, &s), TIDE_ESTATE); /* no micro-batch handed out */
  tide_batch_t b;
  CHECK_OK(tide_trainer_next(tr, &b));
  CHECK_RC(tide_trainer_next(tr, &b), TIDE_ESTATE); /* step not called */
  CHECK(strstr(tide_trainer_last_error(tr), "tide_trainer_step") != NULL);
  CHECK(tide_exchange_parse("HiTopK", &c.exchange) == 0 && c.exchange == TIDE_EXCHANGE_HITOPK);
  CHECK_RC(tide_exchange_parse("sparse", &c.exchange), TIDE_EINVAL);
  tide_trainer_destroy(tr);
  tide_trainer_destroy(NULL);
  tide_comm_destroy(comm);
  return 0;
}

/* Every check runs in harness processes: tide reads its TIDE_* parameters
 * once, so this process calls nothing of tide's. */
/* The autoscale policy's decisions, fed synthetic all-reduced statistics:
 * `steps` steps at `ranks` workers and `rate` samples/s; returns the last
 * world_size it asked for in them (0: none). */
static int feed(const tide_policy_ops_t *ops, void *state, long *step, int ranks, double rate, int steps) {
  int asked = 0;
  for (int i = 0; i < steps; i++) {
    tide_step_stats_t st = {.step = ++*step, .ranks = ranks, .global_batch = 256, .mean_step_s = 256.0 / rate};
    tide_decision_t d = {.world_size = 0, .exchange = -1};
    CHECK_OK(ops->before_step(state, &st, &d));
    if (d.world_size > 0) asked = d.world_size;
  }
  return asked;
}

static void autoscale_case(void) {
  tide__policy_env_t env = {.base_batch = 256, .ranks = 2, .nodes = 1, .batch = 128, .max_batch = 128};
  tide_policy_ops_t ops;
  void *state;
  long step = 0;
  /* Scales well from 2 to 3 (0.9 of a worker's throughput gained), badly
   * from 3 to 4 (0.31): asks for 3, then 4, then gives the fourth back. */
  CHECK_OK(tide__policy_builtin("autoscale:window=4:settle=1", &env, &ops, &state));
  CHECK(feed(&ops, state, &step, 2, 100, 4) == 0); /* settle 1 + 3 of the window */
  CHECK(feed(&ops, state, &step, 2, 100, 1) == 3);
  CHECK(feed(&ops, state, &step, 2, 100, 10) == 0); /* waiting for the third */
  CHECK(feed(&ops, state, &step, 3, 145, 5) == 4);
  CHECK(feed(&ops, state, &step, 4, 160, 5) == 3);
  CHECK(feed(&ops, state, &step, 3, 145, 50) == 0); /* settled */
  ops.destroy(state);
  /* Workers that never come: after `patience` seconds of steps (2.56 s
   * each here) it stays where it is. */
  step = 0;
  CHECK_OK(tide__policy_builtin("autoscale:window=2:settle=0:patience=15", &env, &ops, &state));
  CHECK(feed(&ops, state, &step, 2, 100, 2) == 3);
  CHECK(feed(&ops, state, &step, 2, 100, 5) == 0);
  CHECK(feed(&ops, state, &step, 2, 100, 1) == 2);
  CHECK(feed(&ops, state, &step, 2, 100, 20) == 0);
  ops.destroy(state);
  /* At max it stops asking; a higher threshold gives back sooner. */
  step = 0;
  CHECK_OK(tide__policy_builtin("autoscale:window=2:settle=0:max=3:threshold=0.95", &env, &ops, &state));
  CHECK(feed(&ops, state, &step, 2, 100, 2) == 3);
  CHECK(feed(&ops, state, &step, 3, 145, 2) == 2); /* 0.9 < 0.95: back to 2 */
  ops.destroy(state);
  step = 0;
  CHECK_OK(tide__policy_builtin("autoscale:window=2:settle=0:max=3", &env, &ops, &state));
  CHECK(feed(&ops, state, &step, 2, 100, 2) == 3);
  CHECK(feed(&ops, state, &step, 3, 145, 2) == 3); /* kept, and 3 is the max */
  CHECK(feed(&ops, state, &step, 3, 145, 20) == 0);
  ops.destroy(state);
  const char *bad[] = {"autoscale:threshold=-1", "autoscale:window=0", "autoscale:add=0", "autoscale:speed=2"};
  for (int i = 0; i < 4; i++) CHECK_RC(tide__policy_builtin(bad[i], &env, &ops, &state), TIDE_EINVAL);
  printf("autoscale: grows while an added worker adds >= threshold of one, gives back, waits, caps\n");
}

int main(void) {
  harness_opts_t one = {.np = 1}, two = {.np = 2}, four = {.np = 4};
  setvbuf(stdout, NULL, _IONBF, 0);
  CHECK(harness_run(&one, vectors_rank, NULL) == 0);
  CHECK(harness_run(&one, bad_rank, NULL) == 0);
  CHECK(harness_run(&four, gns_rank, NULL) == 0);
  CHECK(harness_run(&one, cover_rank, NULL) == 0);
  CHECK(harness_run(&two, cover_rank, NULL) == 0);
  CHECK(harness_run(&four, cover_rank, NULL) == 0);
  const char *lists[] = {"gns:warmup=10:every=5,adascale", "pollux:every=10,adascale", "exchange:window=5:high=0"};
  for (int i = 0; i < 3; i++) {
    CHECK(harness_run(&one, policies_rank, (void *)lists[i]) == 0);
    CHECK(harness_run(&two, policies_rank, (void *)lists[i]) == 0);
    CHECK(harness_run(&four, policies_rank, (void *)lists[i]) == 0);
  }
  tide_exchange_t dense = TIDE_EXCHANGE_DENSE, topk = TIDE_EXCHANGE_TOPK;
  CHECK(harness_run(&two, restore_rank, &dense) == 0);
  CHECK(harness_run(&two, restore_rank, &topk) == 0);
  tide_exchange_t adasum = TIDE_EXCHANGE_ADASUM;
  CHECK(harness_run(&two, restore_rank, &adasum) == 0);
  CHECK(harness_run(&two, adasum_rank, NULL) == 0);
  CHECK(harness_run(&four, adasum_rank, NULL) == 0);
  autoscale_case();
  printf("all adaptation checks passed\n");
  return 0;
}
