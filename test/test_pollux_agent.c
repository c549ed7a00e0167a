/* The per-job Pollux agent (issue 28, item 2): step times grouped by
 * (hosts, workers, micro-batch), so a resized job neither mixes sizes nor
 * stops evaluating other sizes; the network terms fitted once several sizes
 * were seen; the lower per-worker batch bound; a single worker above the
 * base batch keeps two passes (in the optimiser and in the trainer's plan);
 * the fit's restarts; and the hints it publishes to the job's store under
 * TIDE_SCHED_HINTS_KEY, read back and decoded. Step times are synthetic
 * (from a known model) in the unit cases; the live ones train least
 * squares on 2 ranks under the harness's store, and the MLP in an elastic
 * tide-train job that grows from 2 workers to 3. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "policy/policy.h"

static const tide_pollux_model_t truth = {.alpha_c = 0.02, .beta_c = 0.001, .alpha_n = 0.06, .beta_n = 0.004,
                                          .alpha_r = 0.01, .beta_r = 0.002, .gamma = 1};

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* What the agent published: the calls and the last text. */
typedef struct {
  int calls;
  char text[TIDE_SCHED_HINTS_MAX];
} sink_t;

static int sink(void *ctx, const char *key, const char *text) {
  sink_t *s = ctx;
  CHECK(strcmp(key, TIDE_SCHED_HINTS_KEY) == 0 && strlen(text) < sizeof s->text);
  strcpy(s->text, text);
  s->calls++;
  return 0;
}

/* One step at a shape, timed by the true model (one pass per step); 1 s
 * of step time each. */
static tide_step_stats_t shaped(long step, int nodes, int ranks, int batch, double phi) {
  double t_acc = truth.alpha_c + truth.beta_c * batch;
  double t_net = nodes > 1 ? truth.alpha_n + truth.beta_n * (ranks > 2 ? ranks - 2 : 0)
                 : ranks > 1 ? truth.alpha_r + truth.beta_r * (ranks > 2 ? ranks - 2 : 0)
                             : 0;
  return (tide_step_stats_t){.step = step, .nodes = nodes, .ranks = ranks, .batch = batch, .accum = 1,
                             .global_batch = (long)ranks * batch, .planned_batch = (long)ranks * batch,
                             .compute_max_s = t_acc, .exchange_s = t_net, .optim_s = 0, .mean_step_s = 1,
                             .noise_scale = phi, .grad_sq = 1, .trace_sigma = phi};
}

static void feed(const tide_policy_ops_t *ops, void *state, long *step, int nodes, int ranks, int batch, int n,
                 double phi) {
  for (int i = 0; i < n; i++) {
    tide_step_stats_t s = shaped(++*step, nodes, ranks, batch, phi);
    tide_decision_t d = {.exchange = -1};
    CHECK_OK(ops->before_update(state, &s, &d));
  }
}

static long decide(const tide_policy_ops_t *ops, void *state, long step, int nodes, int ranks, int batch,
                   double phi) {
  tide_step_stats_t s = shaped(step, nodes, ranks, batch, phi);
  tide_decision_t d = {.exchange = -1};
  CHECK_OK(ops->before_step(state, &s, &d));
  return d.global_batch;
}

static tide_sched_hints_t hints_of(const sink_t *s) {
  tide_sched_hints_t h;
  CHECK_OK(tide_sched_hints_decode(s->text, &h));
  return h;
}

/* Modelled against true throughput at a shape. */
static double model_error(const tide_pollux_model_t *m, int nodes, int ranks, int batch) {
  return rel(tide_pollux_throughput(m, nodes, ranks, batch, 0), tide_pollux_throughput(&truth, nodes, ranks, batch, 0));
}

static void resize_case(void) {
  sink_t out = {0};
  tide__policy_env_t env = {.base_batch = 64, .ranks = 2, .nodes = 1, .batch = 32, .max_batch = 128,
                            .max_accum = 4, .publish = sink, .publish_ctx = &out};
  tide_policy_ops_t ops;
  void *state;
  long step = 0;
  CHECK_OK(tide__policy_builtin("pollux:min_batch=16", &env, &ops, &state));
  /* 2 workers on one host, two micro-batch sizes */
  feed(&ops, state, &step, 1, 2, 32, 10, 1000);
  CHECK(out.calls == 1); /* the first step reports (nothing fitted yet) */
  CHECK(hints_of(&out).fitted == 0 && hints_of(&out).max_replicas_seen == 2);
  feed(&ops, state, &step, 1, 2, 64, 10, 1000);
  decide(&ops, state, step, 1, 2, 64, 1000);
  CHECK(out.calls == 2); /* the first model is a big change */
  tide_sched_hints_t h = hints_of(&out);
  CHECK(h.fitted == 1 && h.limits.base_batch == 64 && h.limits.min_atomic == 16 && h.limits.max_atomic == 128 &&
        h.limits.max_passes == 4 && h.grad_sqr == 1 && h.grad_var == 1000.0 / 64);
  CHECK(model_error(&h.model, 1, 2, 32) < 0.02 && model_error(&h.model, 1, 2, 64) < 0.02);
  /* Resized to 4 workers: the new size is its own profile; once both are
   * seen the per-worker slope is fitted, and both sizes are right. Grouped
   * by micro-batch alone, 2 and 4 workers' times would be averaged. */
  feed(&ops, state, &step, 1, 4, 32, 10, 1000);
  feed(&ops, state, &step, 1, 4, 64, 10, 1000);
  decide(&ops, state, step, 1, 4, 64, 1000);
  h = hints_of(&out);
  CHECK(h.max_replicas_seen == 4);
  for (int k = 2; k <= 4; k += 2)
    for (int b = 32; b <= 64; b += 32) CHECK(model_error(&h.model, 1, k, b) < 0.02);
  CHECK(rel(h.model.beta_r, truth.beta_r) < 0.1);
  /* no multi-host profile: the across-host network is explored optimistically, not for free */
  CHECK(h.model.alpha_n >= 1.1 * h.model.alpha_r && h.model.beta_n >= 1.1 * h.model.beta_r);
  /* Across hosts: fitted too, without spoiling the single-host sizes. */
  feed(&ops, state, &step, 2, 4, 32, 10, 1000);
  feed(&ops, state, &step, 2, 4, 64, 10, 1000);
  int before = out.calls;
  decide(&ops, state, step, 2, 4, 64, 1000);
  CHECK(out.calls == before + 1); /* its modelled throughput at 2 x 4 moved by far more than a quarter */
  h = hints_of(&out);
  CHECK(model_error(&h.model, 2, 4, 32) < 0.02 && model_error(&h.model, 2, 4, 64) < 0.02);
  CHECK(model_error(&h.model, 1, 4, 64) < 0.02 && model_error(&h.model, 1, 2, 32) < 0.02);
  /* Nothing changes: a report every TIDE_SCHED_HINTS_INTERVAL (30) seconds of steps. */
  before = out.calls;
  feed(&ops, state, &step, 2, 4, 64, 29, 1000);
  CHECK(out.calls == before);
  feed(&ops, state, &step, 2, 4, 64, 2, 1000);
  CHECK(out.calls == before + 1);
  /* The batch is chosen at the size the job has now, within the bound:
   * with no noise (phi 0) the smallest global batch wins, which on 4
   * workers is min_batch x 4 = 64 (the base), and on 8 would be 128. */
  CHECK(decide(&ops, state, step, 2, 4, 128, 0) == 64);
  feed(&ops, state, &step, 2, 8, 16, 3, 0);
  CHECK(decide(&ops, state, step, 2, 8, 256, 0) == 128);
  ops.destroy(state);

  /* Bad keys name themselves. */
  const char *bad[] = {"pollux:min_batch=0", "pollux:min_batch=129", "pollux:max=64:min_batch=64", "pollux:x=1"};
  for (int i = 0; i < 4; i++) CHECK_RC(tide__policy_builtin(bad[i], &env, &ops, &state), TIDE_EINVAL);
  printf("pollux agent: profiles per (hosts, workers, micro-batch), network terms fitted over sizes, hints "
         "reported on change and every 30 s of steps, batch bounded below per worker\n");
}

/* One worker above the base batch keeps two passes, in the optimiser and
 * in the trainer's plan, so its noise scale keeps updating. */
static void single_worker_case(void) {
  tide_pollux_limits_t l = {.base_batch = 64, .max_batch = 1024, .min_atomic = 1, .max_atomic = 512, .max_passes = 8};
  tide_pollux_choice_t c;
  CHECK_OK(tide_pollux_goodput(&truth, &l, 1, 1, 100, 256, &c));
  CHECK(c.accum == 1 && c.atomic == 128 && c.batch == 256);
  CHECK_OK(tide_pollux_goodput(&truth, &l, 1, 1, 100, 64, &c));
  CHECK(c.accum == 0 && c.atomic == 64);
  CHECK_OK(tide_pollux_goodput(&truth, &l, 1, 2, 100, 256, &c)); /* two workers: two gradients already */
  CHECK(c.accum == 0 && c.atomic == 128);
  l.max_passes = 1; /* no accumulation allowed: one pass */
  CHECK_OK(tide_pollux_goodput(&truth, &l, 1, 1, 100, 256, &c));
  CHECK(c.accum == 0);
}

/* The fit's restarts: on profiles from random true models (two micro-batch
 * sizes, 2 and 4 workers on one host and 4 over two hosts), the fit with
 * restarts reproduces every profile; a single local search is counted. */
static void restarts_case(void) {
  unsigned seed = 7;
  int single_off = 0, cases = 40;
  for (int c = 0; c < cases; c++) {
    double u[6];
    for (int i = 0; i < 6; i++) u[i] = (harness_rand(&seed) % 10000) / 10000.0;
    tide_pollux_model_t t = {.alpha_c = 0.005 * pow(20, u[0]), .beta_c = 1e-4 * pow(20, u[1]),
                             .alpha_r = 0.005 * pow(20, u[2]), .beta_r = 5e-4 * pow(10, u[3]),
                             .alpha_n = 0.02 * pow(20, u[4]), .beta_n = 1e-3 * pow(10, u[5]), .gamma = 1};
    static const int shapes[3][2] = {{1, 2}, {1, 4}, {2, 4}};
    tide_pollux_profile_t p[6];
    int n = 0;
    for (int s = 0; s < 3; s++)
      for (int b = 32; b <= 128; b *= 4) {
        double t_acc = t.alpha_c + t.beta_c * b, rate = tide_pollux_throughput(&t, shapes[s][0], shapes[s][1], b, 0);
        p[n++] = (tide_pollux_profile_t){shapes[s][0], shapes[s][1], b, t_acc, shapes[s][1] * b / rate};
      }
    tide_pollux_model_t with, single;
    CHECK_OK(tide_pollux_fit(p, n, TIDE_POLLUX_FIT_RESTARTS, &with));
    CHECK_OK(tide_pollux_fit(p, n, 0, &single));
    double worst_with = 0, worst_single = 0;
    for (int i = 0; i < n; i++) {
      double want = tide_pollux_throughput(&t, p[i].nodes, p[i].replicas, p[i].atomic, 0);
      worst_with = fmax(worst_with, rel(tide_pollux_throughput(&with, p[i].nodes, p[i].replicas, p[i].atomic, 0), want));
      worst_single =
          fmax(worst_single, rel(tide_pollux_throughput(&single, p[i].nodes, p[i].replicas, p[i].atomic, 0), want));
    }
    if (worst_with >= 0.05) printf("restarts: case %d is %.1f%% off\n", c, 100 * worst_with);
    CHECK(worst_with < 0.05);
    single_off += worst_single >= 0.05;
  }
  printf("fit restarts: %d of %d random models within 5%% on every profile (one local search: %d)\n", cases, cases,
         cases - single_off);
}

/* ---- live: the hints in the harness's store ---- */

enum { D = 16 };

/* Least squares y = x.w* + noise with w* = 0: the mean gradient over idx. */
static void lsq_grad(const float *w, const uint64_t *idx, size_t n, float *grad) {
  double g[D] = {0};
  for (size_t k = 0; k < n; k++) {
    unsigned s = (unsigned)(idx[k] * 2654435761u + 1);
    double x[D], r = 0;
    for (int j = 0; j < D; j++) x[j] = (harness_rand(&s) % 2001) / 1000.0 - 1, r += x[j] * w[j];
    r -= (harness_rand(&s) % 2001) / 1000.0 - 1;
    for (int j = 0; j < D; j++) g[j] += r * x[j];
  }
  for (int j = 0; j < D; j++) grad[j] = (float)(g[j] / (double)n);
}

static const tide_tensor_t whole = {"w", 0, D, 1, {D}};

/* A policy that asks for global batch `*state` once, at step 1. */
static int ask_batch(void *state, const tide_step_stats_t *s, tide_decision_t *d) {
  if (s->step == 1) d->global_batch = *(long *)state;
  return 0;
}

static int live_rank(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[D], grad[D];
  for (int j = 0; j < D; j++) w[j] = 0.5f;
  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = 4096;
  c.batch = 16;
  c.epochs = 1;
  c.max_batch = 64;
  tide_optim_config_default(TIDE_OPTIM_SGD, &c.optim);
  c.schedule.kind = TIDE_LR_CONSTANT;
  c.schedule.base_lr = 0.01f;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, w, grad, D, &whole, 1, &tr));
  long want = 64;
  if (size == 1) { /* one worker, asked for 4x the base batch: two passes */
    tide_policy_ops_t ops = {.name = "ask", .before_step = ask_batch};
    long *state = malloc(sizeof *state);
    *state = want;
    ops.destroy = free;
    ops.state_size = sizeof *state;
    CHECK_OK(tide_trainer_add_policy(tr, &ops, state));
  } else {
    CHECK_OK(tide_trainer_adapt(tr, "pollux:every=5"));
  }
  tide_batch_t b;
  tide_step_stats_t s = {0}, last = {0};
  while (tide_trainer_next(tr, &b) == 0 && !b.done) {
    if (b.count > 0) lsq_grad(w, b.indices, b.count, grad);
    CHECK_OK(tide_trainer_step(tr, 0.5, &s));
    if (s.stepped) last = s;
  }
  CHECK(b.done);
  if (size == 1) {
    CHECK(last.planned_batch == want && last.accum == 2 && last.batch == 32);
    CHECK(isfinite(last.noise_scale));
    printf("one worker at 4x the base batch: %d passes of %d, noise scale %.1f\n", last.accum, last.batch,
           last.noise_scale);
  } else if (rank == 0) {
    const char *rdzv = getenv("TIDE_RDZV");
    const char *colon = strrchr(rdzv, ':');
    char host[64];
    snprintf(host, sizeof host, "%.*s", (int)(colon - rdzv), rdzv);
    tide_store_t *store;
    CHECK_OK(tide_store_connect(host, atoi(colon + 1), getenv("TIDE_JOB_TOKEN"), 5000, &store));
    void *value;
    size_t len;
    CHECK_OK(tide_store_get(store, TIDE_SCHED_HINTS_KEY, 5000, &value, &len));
    char text[TIDE_SCHED_HINTS_MAX];
    CHECK(len < sizeof text);
    memcpy(text, value, len);
    text[len] = 0;
    tide_free(value);
    tide_sched_hints_t h;
    CHECK_OK(tide_sched_hints_decode(text, &h));
    printf("hints in the store: %s\n", text);
    CHECK(h.fitted == 1 && h.max_replicas_seen == 2 && h.limits.base_batch == (double)c.batch * size);
    CHECK(h.grad_sqr > 0 && h.grad_var > 0 && isfinite(h.grad_var) && h.model.beta_c >= 0);
    tide_store_close(store);
  }
  tide_trainer_destroy(tr);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- end to end: tide-train --elastic with the agent, grown 2 -> 3 ---- */

/* The autoscale policy asks for a third worker (tiderun starts it); the
 * agent must then evaluate batches on 3 workers, where it used to keep the
 * size it was created with. Skipped without tide-train or Fashion-MNIST. */
static void elastic_case(void) {
  const char *tools = getenv("TIDE_TOOLS_DIR");
  FILE *probe = fopen("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", "rb");
  if (tools == NULL || probe == NULL) {
    printf("elastic: skipped (no TIDE_TOOLS_DIR or no Fashion-MNIST)\n");
    if (probe != NULL) fclose(probe);
    return;
  }
  fclose(probe);
  char dir[] = "/tmp/tide-test-pollux-XXXXXX", cmd[4096], line[1024];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(cmd, sizeof cmd,
           "TIDE_LOG_LEVEL=debug TIDE_JOB_TOKEN=test-pollux-%d %s/tiderun --rdzv 127.0.0.1:%d --timeout 120 "
           "--elastic --min-np 2 --max-np 3 -np 2 %s/tide-train --elastic --model mlp --epochs 3 --batch 32 "
           "--threads 1 --adapt autoscale:window=30:settle=1:max=3,pollux:every=5 --name elastic --runs %s "
           ">%s/log 2>&1",
           (int)getpid(), tools, harness_free_port(), tools, dir, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "%s/log", dir);
  FILE *log = fopen(cmd, "r");
  CHECK(log != NULL);
  int on2 = 0, on3 = 0, grown = 0, identical = 0;
  while (fgets(line, sizeof line, log) != NULL) {
    on2 += strstr(line, "pollux: step") != NULL && strstr(line, "on 2 worker(s)") != NULL;
    on3 += strstr(line, "pollux: step") != NULL && strstr(line, "on 3 worker(s)") != NULL;
    grown |= strstr(line, "the first on 3 worker(s)") != NULL;
    identical |= strstr(line, "replicas identical: yes") != NULL;
  }
  fclose(log);
  if (rc != 0 || !grown || !identical || on2 == 0 || on3 == 0) {
    fprintf(stderr, "%s -> exit %d; grown to 3 %d, replicas identical %d, decisions on 2 workers %d, on 3 %d\n",
            cmd, rc, grown, identical, on2, on3);
    exit(1);
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  printf("elastic: the agent decided %d times on 2 workers and %d times on 3 after the job grew\n", on2, on3);
}

int main(void) {
  /* The live runs first: the cases below load the parameter table, which
   * the ranks must read from their own environment. */
  harness_opts_t one = {.np = 1}, two = {.np = 2};
  CHECK(harness_run(&two, live_rank, NULL) == 0);
  CHECK(harness_run(&one, live_rank, NULL) == 0);
  resize_case();
  single_worker_case();
  restarts_case();
  elastic_case();
  printf("ok\n");
  return 0;
}
