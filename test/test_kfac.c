/* K-FAC (tide_trainer_kfac, src/train/kfac.c, src/optim/kfac.c) on the nn
 * engine's layers:
 *   - bad options and layers give TIDE_EINVAL naming the field;
 *   - the distributed result (KAISA: each layer on one rank, preconditioned
 *     gradients all-gathered) equals every rank doing every layer, and both
 *     equal a single rank taking the whole global batch;
 *   - decompositions off the critical path (config.staleness): the
 *     decomposition in use at step t is that of the factors of step
 *     I floor((t - S) / I), the replicas agree bit for bit, and a run
 *     saved with a decomposition pending resumes bit for bit;
 *   - cheaper factors: a factor from sampled rows (config.sample) equals the
 *     full factor of those rows, a layer wider than config.max_dim keeps
 *     its plain gradient, and both resume bit for bit;
 *   - a conv layer's A from its backward pass's own im2col chunks equals
 *     one separate im2col's; sampled, it keeps its scale;
 *   - owners by measured cost (config.rebalance): costs that turn the
 *     formula round move layers, to the same owners on every rank, and the
 *     bits stay those of fixed owners, resumed or not;
 *   - `test_kfac reference`: one step's preconditioned gradient against an
 *     independent PyTorch computation (test/kfac_torch_ref.py; 77 without
 *     python3 and torch). */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "harness.h"
#include "nn/layers.h"
#include "nn/nn.h"
#include "optim/kfac.h"
#include "train/train.h"

static const char *const ARCH = "conv:4:3:1,relu,pool,flatten,dense:16,relu,dense:10";
enum { DATASET = 96 };

static void make_data(float *images, int32_t *labels, int n) {
  unsigned seed = 12345;
  for (int i = 0; i < n * NN_IMAGE_SIZE; i++) images[i] = (float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f;
  for (int i = 0; i < n; i++) labels[i] = (int32_t)(harness_rand(&seed) % NN_CLASSES);
}

/* How the hook hands the factors over (test_overlap): 0 as given; LATE_G2:
 * fc2's G in two halves, the second with conv's G, after the backward pass
 * has left fc2's bucket; SKIP_A1: rank 1 never adds fc1's A. Per process. */
enum { HOOK_PLAIN, HOOK_LATE_G2, HOOK_SKIP_A1, HOOK_KILL2 };
static int hook_mode, hook_rank, hook_step; /* HOOK_KILL2: rank 2 dies at step 2 after conv's G */
static float late_x[64 * 10], late_weight;
static size_t late_rows;

static int hook(void *trainer, size_t layer, tide_kfac_factor_t factor, const float *x, size_t rows, size_t ld,
                int transposed, float weight) {
  if (hook_mode == HOOK_SKIP_A1 && hook_rank == 1 && layer == 1 && factor == TIDE_KFAC_A) return 0;
  if (hook_mode == HOOK_LATE_G2 && layer == 2 && factor == TIDE_KFAC_G) {
    CHECK(rows <= 64 && ld == 10 && !transposed);
    memcpy(late_x, x, rows * 10 * sizeof(float));
    late_rows = rows;
    late_weight = weight / 2;
    return tide_trainer_kfac_add(trainer, layer, factor, x, rows, ld, transposed, weight / 2);
  }
  int rc = tide_trainer_kfac_add(trainer, layer, factor, x, rows, ld, transposed, weight);
  if (hook_mode == HOOK_KILL2 && hook_rank == 2 && hook_step == 2 && layer == 0 && factor == TIDE_KFAC_G)
    raise(SIGKILL); /* fc1 and fc2's bucket has started on every rank */
  if (rc == 0 && hook_mode == HOOK_LATE_G2 && layer == 0 && factor == TIDE_KFAC_G)
    rc = tide_trainer_kfac_add(trainer, 2, TIDE_KFAC_G, late_x, late_rows, 10, 0, late_weight);
  return rc;
}

/* What a run does: model, trainer, K-FAC, `steps` steps. */
typedef struct {
  int batch, steps, distribute, spread;
  float kl_clip, factor_decay, damping, lr, momentum;
  int factor_every, inverse_every;
  float sample;    /* > 0: config.sample */
  int max_dim;     /* config.max_dim; 0 keeps the default */
  int no_kfac;     /* 1: the same run without K-FAC */
  int diag_dim;    /* config.diag_dim */
  int staleness;   /* config.staleness */
  int lowrank_dim, lowrank; /* config's; 0: every A whole */
  int bucket_kb;   /* > 0: config.bucket_kb; < 0: 0 (one factor allreduce in the step); 0 keeps the default */
  int hook_mode;   /* HOOK_* */
  int no_rebalance; /* config.rebalance = 0 */
  const double *fake_costs; /* per layer: the seconds a step the owners report (tide__kfac_fake_costs) */
  int owners[3];    /* owners_main: the owners expected after the run */
  const char *out; /* each rank writes its final parameters to out.rankR */
  float *params0;  /* if non-NULL, gets the initial parameters (rank 0) */
} run_t;

static int train_steps(nn_model_t *m, tide_trainer_t *tr, int batch, int steps, int kfac);

static int run_training(tide_comm_t *comm, const run_t *r, nn_model_t **model_out, tide_trainer_t **tr_out) {
  nn_model_t *m;
  CHECK_OK(nn_model_create(ARCH, r->batch, 7, &m));
  size_t ntensors, nparams = nn_param_count(m);
  const tide_tensor_t *tensors = nn_tensors(m, &ntensors);
  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = DATASET;
  c.seed = 3;
  c.batch = r->batch;
  c.epochs = 100;
  tide_optim_config_default(r->momentum > 0 ? TIDE_OPTIM_MOMENTUM : TIDE_OPTIM_SGD, &c.optim);
  c.optim.momentum = r->momentum;
  c.optim.weight_decay = 0;
  c.schedule.kind = TIDE_LR_CONSTANT;
  c.schedule.base_lr = r->lr;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, nn_params(m), nn_grads(m), nparams, tensors, ntensors, &tr));
  tide_kfac_config_t kc;
  tide_kfac_config_default(&kc);
  kc.distribute = r->distribute;
  kc.spread = r->spread;
  kc.kl_clip = r->kl_clip;
  kc.factor_decay = r->factor_decay;
  kc.damping = r->damping;
  kc.factor_every = r->factor_every;
  kc.inverse_every = r->inverse_every;
  kc.sample = r->sample > 0 ? r->sample : 1.0f; /* the options off: main's checksums */
  if (r->max_dim != 0) kc.max_dim = r->max_dim;
  kc.diag_dim = r->diag_dim;
  kc.staleness = r->staleness;
  kc.lowrank_dim = r->lowrank_dim;
  if (r->lowrank > 0) kc.lowrank = r->lowrank;
  if (r->bucket_kb != 0) kc.bucket_kb = r->bucket_kb > 0 ? r->bucket_kb : 0;
  hook_mode = r->hook_mode;
  hook_rank = tide_comm_rank(comm);
  kc.rebalance = !r->no_rebalance;
  tide_kfac_layer_t layers[8];
  CHECK(nn_kfac_layer_count(m) == 3);
  CHECK_OK(nn_kfac_layers(m, layers));
  CHECK(layers[0].in_dim == 9 && layers[0].out_dim == 4 && layers[1].in_dim == 784 && layers[2].in_dim == 16);
  if (!r->no_kfac) CHECK_OK(tide_trainer_kfac(tr, &kc, layers, 3));
  if (r->fake_costs != NULL) tide__kfac_fake_costs(tr->kfac, r->fake_costs);
  if (r->params0 != NULL) memcpy(r->params0, nn_params(m), nparams * sizeof(float));
  *model_out = m;
  *tr_out = tr;
  return train_steps(m, tr, r->batch, r->steps, !r->no_kfac);
}

static int train_steps(nn_model_t *m, tide_trainer_t *tr, int batch, int steps, int kfac) {
  float *images = malloc(sizeof(float) * DATASET * NN_IMAGE_SIZE), *x = malloc(sizeof(float) * batch * NN_IMAGE_SIZE);
  int32_t *labels = malloc(sizeof(int32_t) * DATASET), y[64];
  CHECK(images != NULL && x != NULL);
  make_data(images, labels, DATASET);
  tide_batch_t b;
  tide_step_stats_t s;
  /* kfac_s is a part of each step: > 0 (K-FAC ran), at most that step's
   * step_s, and summed over the steps at most the loop's wall time (a
   * figure in the wrong unit or never reset fails these; no speed is
   * asserted). A trainer without K-FAC reports 0 (test_data). */
  double kfac_total = 0, loop_start = (double)tide__now_ns() * 1e-9;
  for (int step = 0; step < steps;) {
    CHECK_OK(tide_trainer_next(tr, &b));
    for (size_t i = 0; i < b.count; i++) {
      memcpy(x + i * NN_IMAGE_SIZE, images + b.indices[i] * NN_IMAGE_SIZE, NN_IMAGE_SIZE * sizeof(float));
      y[i] = labels[b.indices[i]];
    }
    nn_set_kfac_hook(m, tide_trainer_kfac_wanted(tr) ? hook : NULL, tr);
    float loss = 0;
    if (b.count > 0) CHECK_OK(nn_forward_backward(m, x, y, (int)b.count, &loss));
    CHECK_OK(tide_trainer_step(tr, loss, &s));
    if (s.stepped) {
      CHECK(kfac ? s.kfac_s > 0 : s.kfac_s == 0);
      CHECK(s.kfac_s <= s.step_s);
      kfac_total += s.kfac_s;
      step++;
    }
  }
  CHECK(kfac_total <= (double)tide__now_ns() * 1e-9 - loop_start);
  free(images);
  free(x);
  free(labels);
  return 0;
}

/* Each rank writes its final parameters to out.rankR. */
static void write_params(const char *out, int rank, nn_model_t *m) {
  char path[512];
  snprintf(path, sizeof path, "%s.rank%d", out, rank);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(nn_params(m), sizeof(float), nn_param_count(m), f) == nn_param_count(m));
  fclose(f);
}

static int rank_main(int rank, int size, void *arg) {
  const run_t *r = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  CHECK(tide_comm_size(comm) == size);
  nn_model_t *m;
  tide_trainer_t *tr;
  run_training(comm, r, &m, &tr);
  write_params(r->out, rank, m);
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  tide_comm_destroy(comm);
  return 0;
}

/* rank_main's run in two halves: after half of the steps the trainer's
 * state (factors, decompositions, momentum) and the parameters move to a new
 * model and trainer, which takes the other half. */
static int resume_main(int rank, int size, void *arg) {
  const run_t *r = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  run_t half = *r, fresh = *r;
  half.steps = r->steps / 2;
  fresh.steps = 0;
  nn_model_t *m, *m2;
  tide_trainer_t *tr, *tr2;
  run_training(comm, &half, &m, &tr);
  size_t len = tide_trainer_state_size(tr);
  char *state = malloc(len);
  CHECK(state != NULL);
  CHECK_OK(tide_trainer_state_get(tr, state, len));
  run_training(comm, &fresh, &m2, &tr2);
  /* A state that lost its end is refused, and nothing changes. */
  CHECK_RC(tide_trainer_state_set(tr2, state, len - 4), TIDE_EINVAL);
  CHECK_OK(tide_trainer_state_set(tr2, state, len));
  memcpy(nn_params(m2), nn_params(m), nn_param_count(m) * sizeof(float));
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  train_steps(m2, tr2, r->batch, r->steps - half.steps, !r->no_kfac);
  write_params(r->out, rank, m2);
  (void)size;
  free(state);
  tide_trainer_destroy(tr2);
  nn_model_destroy(m2);
  tide_comm_destroy(comm);
  return 0;
}

/* Reads a run's parameters and prints their checksum (the run's name
 * without the temporary directory), so that builds can be compared bit for
 * bit: the same runs before and after a change print the same lines. */
static size_t read_params(const char *path, float *out, size_t cap) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  size_t n = fread(out, sizeof(float), cap, f);
  fclose(f);
  const char *name = strrchr(path, '/');
  fprintf(stderr, "params %s: %zu floats, checksum %016llx\n", name != NULL ? name + 1 : path, n,
          (unsigned long long)tide__fnv1a(out, n * sizeof *out));
  return n;
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)a[i] - b[i]));
    scale = fmax(scale, fabs((double)b[i]));
  }
  return diff / scale;
}

static void remove_dir(const char *dir) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

/* Distributed (dir/a) and replicated (dir/b) runs' rank 0: the same bits
 * but for rounding (the sums' order), as test_distributed says. */
static void same_as_replicated(const char *dir, const char *a, const char *b, float *ref, float *got, size_t n,
                               const char *label) {
  char pa[300], pb[300];
  snprintf(pa, sizeof pa, "%s/%s.rank0", dir, a);
  snprintf(pb, sizeof pb, "%s/%s.rank0", dir, b);
  CHECK(read_params(pa, ref, 1 << 20) == n && read_params(pb, got, 1 << 20) == n);
  fprintf(stderr, "%s vs replicated max rel diff %.3g\n", label, rel_diff(got, ref, n));
  CHECK(rel_diff(got, ref, n) <= 1e-6);
}

static void test_distributed(void) {
  char dir[] = "/tmp/tide-kfac-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { GLOBAL = 12, CAP = 1 << 20 };
  struct {
    int np, distribute, spread, lowrank;
  } cases[] = {{1, 1, 0, 0}, {3, 1, 0, 0}, {3, 0, 0, 0}, {2, 1, 0, 0}, {3, 1, 1, 0}, {2, 1, 1, 0},
               {1, 1, 0, 1}, {3, 1, 0, 1}, {3, 0, 0, 1}, {2, 1, 1, 1}};
  float *ref = malloc(CAP * sizeof(float)), *got = malloc(CAP * sizeof(float));
  size_t n = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char out[256];
    snprintf(out, sizeof out, "%s/np%d-d%d-s%d%s", dir, cases[c].np, cases[c].distribute, cases[c].spread,
             cases[c].lowrank ? "-low" : "");
    run_t r = {.batch = GLOBAL / cases[c].np, .steps = 4, .distribute = cases[c].distribute,
               .spread = cases[c].spread, .kl_clip = 0.001f,
               .factor_decay = 0.9f, .damping = 0.03f, .lr = 0.002f, .momentum = 0.9f, .factor_every = 1,
               .inverse_every = 2, .out = out, .lowrank_dim = cases[c].lowrank ? 12 : 0, .lowrank = 4};
    harness_opts_t opts = {.np = cases[c].np, .timeout_s = 120};
    CHECK(harness_run(&opts, rank_main, &r) == 0);
    for (int rank = 0; rank < cases[c].np; rank++) {
      char path[300];
      snprintf(path, sizeof path, "%s.rank%d", out, rank);
      size_t got_n = read_params(path, got, CAP);
      if (cases[c].np == 1) { /* the reference of the cases after it */
        if (c > 0) { /* the low-rank A changes the run */
          CHECK(got_n == n);
          fprintf(stderr, "low-rank factors (lowrank_dim 12, lowrank 4: fc1's A 785 and G 16, fc2's A 17): "
                  "max |diff| / max |w| = %.3g against whole\n",
                  rel_diff(got, ref, n));
          CHECK(rel_diff(got, ref, n) > 1e-4);
        }
        memcpy(ref, got, got_n * sizeof *ref);
        n = got_n;
        continue;
      }
      CHECK(got_n == n);
      double d = rel_diff(got, ref, n);
      fprintf(stderr, "np %d distribute %d spread %d lowrank %d rank %d: max |diff| / max |w| = %.3g against np 1\n",
              cases[c].np, cases[c].distribute, cases[c].spread, cases[c].lowrank, rank, d);
      /* The same arithmetic but for the order of the sums over ranks; the
       * steps (K-FAC's are large: up to 1/damping times the gradient's)
       * carry that rounding into the ReLU and max-pool choices, so it grows
       * with lr and steps: 3e-7 after one step here, 7.5e-6 after four. */
      CHECK(d < 3e-5);
    }
  }
  /* Distributed (whole layers, or fc1's rows spread over the ranks) and
   * replicated preconditioning on 3 ranks: the same bits. */
  same_as_replicated(dir, "np3-d1-s0", "np3-d0-s0", ref, got, n, "np 3: distributed (spread 0)");
  same_as_replicated(dir, "np3-d1-s1", "np3-d0-s0", ref, got, n, "np 3: distributed (spread 1)");
  same_as_replicated(dir, "np3-d1-s0-low", "np3-d0-s0-low", ref, got, n, "np 3, low-rank factors: distributed");
  remove_dir(dir);
  free(ref);
  free(got);
}

/* The factor allreduce during the backward pass (config.bucket_kb): the
 * test model's layers make two buckets (fc1 and fc2, started when conv's
 * G arrives; conv with the counts in the step). Against one allreduce in
 * the step (bucket_kb 0, main's bits) on 3 ranks: the same sums, so the
 * same results but for the ring's rounding, with the replicas identical;
 * also when fc2's G gets half its rows after its bucket left (all-reduced
 * again whole in the step: without that it differs 1000x more) and when
 * rank 1 never adds fc1's A (its bucket starts at the micro-batch's end
 * there, in the backward pass on the others). */
static void test_overlap(void) {
  char dir[] = "/tmp/tide-kfac-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { CAP = 1 << 20, NP = 3 };
  float *ref = malloc(CAP * sizeof(float)), *got = malloc(CAP * sizeof(float));
  const int modes[] = {HOOK_PLAIN, HOOK_LATE_G2, HOOK_SKIP_A1};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    size_t n = 0;
    for (int on = 0; on < 2; on++) {
      char out[256];
      snprintf(out, sizeof out, "%s/case%zu-on%d", dir, m, on);
      run_t r = {.batch = 4, .steps = 4, .distribute = 1, .kl_clip = 0.001f, .factor_decay = 0.9f,
                 .damping = 0.03f, .lr = 0.002f, .momentum = 0.9f, .factor_every = 1, .inverse_every = 2,
                 .out = out, .bucket_kb = on ? 1024 : -1, .hook_mode = modes[m]};
      harness_opts_t opts = {.np = NP, .timeout_s = 120};
      CHECK(harness_run(&opts, rank_main, &r) == 0);
      for (int rank = 0; rank < NP; rank++) {
        char path[300];
        snprintf(path, sizeof path, "%s.rank%d", out, rank);
        size_t got_n = read_params(path, rank == 0 && !on ? ref : got, CAP);
        if (rank == 0 && !on) {
          n = got_n;
          continue;
        }
        CHECK(got_n == n);
        double d = rel_diff(got, ref, n);
        if (!on) { /* the replicas of one run: the same bits */
          CHECK(d == 0);
          continue;
        }
        fprintf(stderr, "overlap (hook mode %d) rank %d: max |diff| / max |w| = %.3g against one allreduce\n",
                modes[m], rank, d);
        CHECK(d < 1e-6); /* 3.6e-8 and 4.6e-8 here; 6.2e-5 with the late half of fc2's G left out */
      }
    }
    /* the overlapped run's replicas: the same bits */
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/case%zu-on1.rank0", dir, m);
    CHECK(read_params(pa, ref, CAP) == n);
    for (int rank = 1; rank < NP; rank++) {
      snprintf(pb, sizeof pb, "%s/case%zu-on1.rank%d", dir, m, rank);
      CHECK(read_params(pb, got, CAP) == n && memcmp(ref, got, n * sizeof(float)) == 0);
    }
  }
  hook_mode = HOOK_PLAIN;
  remove_dir(dir);
  free(ref);
  free(got);
}

/* A peer killed in the backward pass just after the factor allreduce's
 * first bucket started (it may or may not have finished): the survivors'
 * step fails with TIDE_EPEER (at the gradient exchange, queued behind the
 * bucket), nothing hangs, and destroy waits the request out. */
static int killed_main(int rank, int size, void *arg) {
  (void)size;
  run_t r = *(const run_t *)arg;
  r.steps = 0;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  nn_model_t *m;
  tide_trainer_t *tr;
  CHECK_OK(run_training(comm, &r, &m, &tr));
  hook_mode = HOOK_KILL2;
  float *images = malloc(sizeof(float) * DATASET * NN_IMAGE_SIZE), *x = malloc(sizeof(float) * 4 * NN_IMAGE_SIZE);
  int32_t *labels = malloc(sizeof(int32_t) * DATASET), y[4];
  CHECK(images != NULL && x != NULL && labels != NULL);
  make_data(images, labels, DATASET);
  int rc = 0;
  double start = (double)tide__now_ns() * 1e-9;
  for (hook_step = 0; hook_step < 6 && rc == 0; hook_step++) {
    tide_batch_t b;
    tide_step_stats_t st;
    CHECK_OK(tide_trainer_next(tr, &b));
    for (size_t i = 0; i < b.count; i++) {
      memcpy(x + i * NN_IMAGE_SIZE, images + b.indices[i] * NN_IMAGE_SIZE, NN_IMAGE_SIZE * sizeof(float));
      y[i] = labels[b.indices[i]];
    }
    nn_set_kfac_hook(m, tide_trainer_kfac_wanted(tr) ? hook : NULL, tr);
    float loss = 0;
    CHECK_OK(nn_forward_backward(m, x, y, (int)b.count, &loss));
    rc = tide_trainer_step(tr, loss, &st);
  }
  fprintf(stderr, "rank %d: step %d: %s after %.2f s: %s\n", rank, hook_step - 1, tide_err_name(rc),
          (double)tide__now_ns() * 1e-9 - start, tide_trainer_last_error(tr));
  CHECK_RC(rc, TIDE_EPEER);
  CHECK(hook_step - 1 == 2);
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  tide_comm_destroy(comm);
  free(images);
  free(x);
  free(labels);
  return 0;
}

static void test_killed(void) {
  run_t r = {.batch = 4, .distribute = 1, .kl_clip = 0.001f, .factor_decay = 0.9f, .damping = 0.03f, .lr = 0.002f,
             .momentum = 0.9f, .factor_every = 1, .inverse_every = 2, .bucket_kb = 1024};
  harness_opts_t opts = {.np = 3, .timeout_s = 60};
  harness_run(&opts, killed_main, &r);
  CHECK(WIFSIGNALED(harness_status[2]) && WTERMSIG(harness_status[2]) == SIGKILL);
  CHECK(WIFEXITED(harness_status[0]) && WEXITSTATUS(harness_status[0]) == 0);
  CHECK(WIFEXITED(harness_status[1]) && WEXITSTATUS(harness_status[1]) == 0);
}

/* Save and restore mid-run, between two decompositions, on 2 ranks with
 * the decompositions spread over them: the resumed run ends with the
 * uninterrupted run's bits. */
static void test_resume(void) {
  char dir[] = "/tmp/tide-kfac-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { CAP = 1 << 20 };
  float *a = malloc(CAP * sizeof(float)), *b = malloc(CAP * sizeof(float));
  CHECK(a != NULL && b != NULL);
  char whole[300], resumed[300];
  /* whole layers, then fc1's rows spread over the two ranks, then (2)
   * whole layers with the factors from half of the rows, shifted each
   * step, and the 785-wide layer left out (max_dim), then (3) that layer
   * with the diagonal of its A (diag_dim); then (4) background
   * decompositions (staleness 2) and (5) the same with the layer spread
   * and staleness 3, each saved after step 3 with step 3's decomposition
   * pending (swapped in at step 5, 6); then (6) factors wider than 12 at
   * rank 4 (lowrank_dim: fc1's A and G, fc2's A), in the step, and (7)
   * with staleness 2; then (8) owners moved by (fake) measured costs in
   * both halves (test_owners), with staleness 2 */
  static const double fake[3] = {2e-3, 1e-3, 10e-3};
  for (int spread = 0; spread < 9; spread++) {
  snprintf(whole, sizeof whole, "%s/whole%d", dir, spread);
  snprintf(resumed, sizeof resumed, "%s/resumed%d", dir, spread);
  run_t r = {.batch = 6, .steps = 8, .distribute = 1, .spread = spread == 1, .kl_clip = 0.001f, .factor_decay = 0.9f,
             .damping = 0.03f, .lr = 0.002f, .momentum = 0.9f, .factor_every = 1, .inverse_every = 3, .out = whole,
             .sample = spread == 2 ? 0.5f : 0, .max_dim = spread == 2 ? 100 : 0, .diag_dim = spread == 3 ? 100 : 0,
             .staleness = spread == 4 ? 2 : spread == 5 ? 3 : 0};
  if (spread == 4) r.diag_dim = 100;
  if (spread == 5) r.spread = 1;
  if (spread == 6 || spread == 7) r.lowrank_dim = 12, r.lowrank = 4, r.staleness = spread == 7 ? 2 : 0;
  if (spread == 8) r.staleness = 2, r.fake_costs = fake;
  harness_opts_t opts = {.np = 2, .timeout_s = 120};
  CHECK(harness_run(&opts, rank_main, &r) == 0);
  r.out = resumed;
  CHECK(harness_run(&opts, resume_main, &r) == 0);
  for (int rank = 0; rank < 2; rank++) {
    char pa[320], pb[320];
    snprintf(pa, sizeof pa, "%s.rank%d", whole, rank);
    snprintf(pb, sizeof pb, "%s.rank%d", resumed, rank);
    size_t n = read_params(pa, a, CAP);
    CHECK(n > 0 && read_params(pb, b, CAP) == n);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
  }
  fprintf(stderr, "resume (spread %d): 4 + 4 steps with the state moved between them = 8 steps, bit for bit\n",
          spread);
  }
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  free(a);
  free(b);
}

/* Background decompositions (staleness 2, inverse_every 3, factor_every 1,
 * 8 steps) on 1 rank, 3 ranks distributed and replicated, and 2 ranks
 * with the 785-wide layer spread: every rank of a run ends with the same
 * bits, distributed and replicated agree as in test_distributed, every run
 * agrees with 1 rank to the sums' rounding, and the run differs from the
 * synchronous one (the staleness does something). */
static void test_async_replicas(void) {
  char dir[] = "/tmp/tide-kfac-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { GLOBAL = 12, CAP = 1 << 20 };
  struct {
    int np, distribute, spread, staleness;
  } cases[] = {{1, 1, 0, 2}, {3, 1, 0, 2}, {3, 0, 0, 2}, {2, 1, 1, 2}, {1, 1, 0, 0}};
  float *ref = malloc(CAP * sizeof(float)), *got = malloc(CAP * sizeof(float)), *rank0 = malloc(CAP * sizeof(float));
  CHECK(ref != NULL && got != NULL && rank0 != NULL);
  size_t n = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    char out[256];
    snprintf(out, sizeof out, "%s/async-np%d-d%d-s%d-S%d", dir, cases[c].np, cases[c].distribute, cases[c].spread,
             cases[c].staleness);
    run_t r = {.batch = GLOBAL / cases[c].np, .steps = 8, .distribute = cases[c].distribute,
               .spread = cases[c].spread, .kl_clip = 0.001f, .factor_decay = 0.9f, .damping = 0.03f, .lr = 0.002f,
               .momentum = 0.9f, .factor_every = 1, .inverse_every = 3, .staleness = cases[c].staleness, .out = out};
    harness_opts_t opts = {.np = cases[c].np, .timeout_s = 120};
    CHECK(harness_run(&opts, rank_main, &r) == 0);
    for (int rank = 0; rank < cases[c].np; rank++) {
      char path[300];
      snprintf(path, sizeof path, "%s.rank%d", out, rank);
      size_t got_n = read_params(path, c == 0 ? ref : rank == 0 ? rank0 : got, CAP);
      if (c == 0) {
        n = got_n;
        continue;
      }
      CHECK(got_n == n);
      if (rank > 0) CHECK(memcmp(got, rank0, n * sizeof(float)) == 0); /* the replicas: the same bits */
      double d = rel_diff(rank == 0 ? rank0 : got, ref, n);
      fprintf(stderr, "staleness %d, np %d distribute %d spread %d rank %d: max |diff| / max |w| = %.3g against np 1 "
              "staleness 2\n", cases[c].staleness, cases[c].np, cases[c].distribute, cases[c].spread, rank, d);
      if (cases[c].staleness == 0)
        CHECK(d > 1e-4); /* synchronous decompositions: another run */
      else
        CHECK(d < 3e-5);
    }
  }
  same_as_replicated(dir, "async-np3-d1-s0-S2", "async-np3-d0-s0-S2", ref, got, n, "staleness 2, np 3: distributed");
  remove_dir(dir);
  free(ref);
  free(got);
  free(rank0);
}

/* The swap at the documented step: with staleness S and inverse_every I,
 * the decomposition in use after step t (the state's: the one step t
 * preconditioned with) is the eigendecomposition of the factors the state
 * held after step I max(0, floor((t - S) / I)), and the pending one (from
 * an inverse step s > 0 until s + S) that of step s's; computed here with
 * tide__kfac_eigen, compared bit for bit. Run on 1 and 2 ranks (the state
 * gathers each layer's from its owner). */
static int swap_rank(int rank, int size, void *arg) {
  enum { I = 3, STEPS = 10, NL = 3 };
  int staleness = *(const int *)arg, S = staleness < I ? staleness : I; /* above I: I */
  (void)rank;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  run_t r = {.batch = 12 / size, .steps = 0, .distribute = 1, .kl_clip = 0.001f, .factor_decay = 0.9f,
             .damping = 0.03f, .lr = 0.002f, .momentum = 0.9f, .factor_every = 1, .inverse_every = I,
             .staleness = staleness};
  nn_model_t *m;
  tide_trainer_t *tr;
  run_training(comm, &r, &m, &tr);
  tide_kfac_layer_t layers[NL];
  CHECK_OK(nn_kfac_layers(m, layers));
  size_t dim[NL][2], at[NL], kfac = 0;
  for (int i = 0; i < NL; i++) {
    dim[i][0] = (size_t)layers[i].in_dim + 1;
    dim[i][1] = (size_t)layers[i].out_dim;
    at[i] = kfac;
    size_t na = dim[i][0], ng = dim[i][1], eig = 1 + na * na + na + ng * ng + ng;
    kfac += na * na + ng * ng + 2 * eig; /* A, G, in use, pending */
  }
  float *saved[STEPS / I + 1][NL][2] = {{{NULL}}}, *q = malloc(785 * 785 * sizeof(float)), d[785];
  CHECK(q != NULL);
  int checked_pending = 0, want_pending = 0;
  for (int t = 0; t < STEPS; t++) {
    CHECK(train_steps(m, tr, r.batch, 1, 1) == 0);
    size_t len = tide_trainer_state_size(tr);
    char *state = malloc(len);
    CHECK(state != NULL && kfac * sizeof(float) < len);
    CHECK_OK(tide_trainer_state_get(tr, state, len));
    const float *k = (const float *)(void *)(state + len - kfac * sizeof(float));
    int use = t - S >= 0 ? (t - S) / I : 0, last = t / I, pending = last > 0 && t < last * I + S;
    want_pending += pending;
    for (int i = 0; i < NL; i++) {
      const float *p = k + at[i], *f[2] = {p, p + dim[i][0] * dim[i][0]};
      if (t % I == 0)
        for (int x = 0; x < 2; x++) {
          saved[last][i][x] = malloc(dim[i][x] * dim[i][x] * sizeof(float));
          memcpy(saved[last][i][x], f[x], dim[i][x] * dim[i][x] * sizeof(float));
        }
      const float *e = f[1] + dim[i][1] * dim[i][1];
      for (int section = 0; section < 2; section++) {
        int from = section == 0 ? use : last, want = section == 0 ? 1 : pending;
        CHECK(*e == (float)want);
        e++;
        for (int x = 0; x < 2; x++) {
          size_t nd = dim[i][x];
          if (want) {
            CHECK_OK(tide__kfac_eigen(saved[from][i][x], (int)nd, q, d));
            CHECK(memcmp(e, q, nd * nd * sizeof(float)) == 0 && memcmp(e + nd * nd, d, nd * sizeof(float)) == 0);
          }
          e += nd * nd + nd;
        }
        checked_pending += section == 1 && want;
      }
    }
    free(state);
  }
  CHECK(want_pending > 0 && checked_pending == want_pending * NL);
  for (int s = 0; s <= STEPS / I; s++)
    for (int i = 0; i < NL; i++) free(saved[s][i][0]), free(saved[s][i][1]);
  free(q);
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  tide_comm_destroy(comm);
  fprintf(stderr, "staleness %d, inverse_every %d, np %d: step t used the factors of step %d max(0, floor((t - %d) / "
          "%d)), bit for bit, steps 0-%d\n", staleness, I, size, I, S, I, STEPS - 1);
  return 0;
}

/* The rows config.sample takes, written out independently: n = ceil(f *
 * rows), row j = floor(j * rows / n) + shift mod floor(rows / n). */
static size_t picked_rows(size_t rows, float f, size_t shift, size_t *out) {
  size_t n = (size_t)ceil((double)f * (double)rows);
  if (n < 1) n = 1;
  for (size_t j = 0; j < n; j++) out[j] = j * rows / n + shift % (rows / n);
  return n;
}

/* A factor from sampled rows (tide__kfac_sample, then the SYRK with the
 * weight times rows / n) is the same bits as the SYRK of a matrix holding
 * just those rows, in both layouts, with and without the bias column. */
static void test_sample_rows(void) {
  enum { ROWS = 37, COLS = 5, LD = 7 };
  float x[ROWS * LD], xt[COLS * (ROWS + 3)], sampled[ROWS * COLS], picked[ROWS * COLS];
  unsigned seed = 99;
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f;
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++) xt[c * (ROWS + 3) + r] = x[r * LD + c];
  const float fractions[] = {0.25f, 0.5f, 0.3f, 1.0f / ROWS, 0.9f, 1.0f};
  int cases = 0;
  for (size_t fi = 0; fi < sizeof fractions / sizeof fractions[0]; fi++)
    for (size_t shift = 0; shift < 6; shift++)
      for (int transposed = 0; transposed < 2; transposed++)
        for (int bias = 0; bias < 2; bias++) {
          float f = fractions[fi], weight = 0.3f;
          size_t idx[ROWS], n = picked_rows(ROWS, f, shift, idx), stride;
          CHECK(tide__kfac_sample_count(ROWS, f, &stride) == n && stride == ROWS / n);
          const float *src = transposed ? xt : x;
          size_t ld = transposed ? ROWS + 3 : LD;
          CHECK(tide__kfac_sample(src, ROWS, COLS, ld, transposed, f, shift, sampled) == n);
          for (size_t j = 0; j < n; j++) {
            CHECK(idx[j] < ROWS && (j == 0 || idx[j] > idx[j - 1]));
            for (int c = 0; c < COLS; c++) picked[j * COLS + c] = x[idx[j] * LD + c];
          }
          int dim = COLS + bias;
          float want[(COLS + 1) * (COLS + 1)] = {0}, got[(COLS + 1) * (COLS + 1)] = {0};
          float w = weight * (float)((double)ROWS / (double)n);
          tide__kfac_syrk(want, dim, bias, picked, n, COLS, 0, w);
          tide__kfac_syrk(got, dim, bias, sampled, n, transposed ? n : COLS, transposed, w);
          for (int i = 0; i < dim; i++)
            for (int j = i; j < dim; j++) CHECK(fabsf(got[i * dim + j] - want[i * dim + j]) <= 1e-6f * (1 + fabsf(want[i * dim + j])));
          if (!transposed) CHECK(memcmp(got, want, sizeof got) == 0);
          cases++;
        }
  fprintf(stderr, "sampled factors: %d cases equal the factor of the picked rows\n", cases);
}

/* A's diagonal form: the column sums of squares are the SYRK's diagonal,
 * and the diagonal preconditioner is the whole one with Q_A = I. */
static void test_diag(void) {
  enum { ROWS = 23, COLS = 6, DG = 5 };
  int dim = COLS + 1;
  float x[ROWS * COLS], full[(COLS + 1) * (COLS + 1)] = {0}, diag[COLS + 1] = {0}, diag_t[COLS + 1] = {0};
  float xt[COLS * ROWS];
  unsigned seed = 5;
  for (int i = 0; i < ROWS * COLS; i++) x[i] = (float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f;
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++) xt[c * ROWS + r] = x[r * COLS + c];
  tide__kfac_syrk(full, dim, 1, x, ROWS, COLS, 0, 0.7f);
  tide__kfac_sumsq(diag, dim, 1, x, ROWS, COLS, 0, 0.7f);
  tide__kfac_sumsq(diag_t, dim, 1, xt, ROWS, ROWS, 1, 0.7f);
  for (int j = 0; j < dim; j++) {
    CHECK(fabsf(diag[j] - full[j * dim + j]) <= 1e-5f * full[j * dim + j]);
    CHECK(fabsf(diag_t[j] - full[j * dim + j]) <= 1e-5f * full[j * dim + j]);
  }
  /* G's decomposition from a random symmetric matrix; A = diag. */
  float g[DG * DG], qg[DG * DG], dg[DG], qa[(COLS + 1) * (COLS + 1)] = {0}, m[DG * (COLS + 1)];
  float p_whole[DG * (COLS + 1)], p_diag[DG * (COLS + 1)], work[DG * (COLS + 1)];
  for (int i = 0; i < DG; i++)
    for (int j = 0; j <= i; j++) g[i * DG + j] = g[j * DG + i] = (float)(harness_rand(&seed) % 2001) / 1000.0f + (i == j ? 5 : 0);
  CHECK_OK(tide__kfac_eigen(g, DG, qg, dg));
  for (int j = 0; j < dim; j++) qa[j * dim + j] = 1.0f;
  for (int i = 0; i < DG * dim; i++) m[i] = (float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f;
  tide__kfac_precondition(qg, dg, DG, qa, diag, dim, 0.01f, m, p_whole, work);
  tide__kfac_precondition_diag(qg, dg, DG, diag, dim, 0.01f, m, p_diag, work);
  CHECK(rel_diff(p_diag, p_whole, DG * (size_t)dim) < 1e-6);
  fprintf(stderr, "diagonal A: sums of squares = the SYRK's diagonal; preconditioner = the whole one with Q_A = I\n");
}

/* out (n x n) = U^T diag(d_U) U + c (I - U^T U): the factor that
 * tide__kfac_eigen_top's q, d (rank r) stand for. */
static void approximate(const float *q, const float *d, int n, int r, float *out) {
  memset(out, 0, sizeof(float) * (size_t)n * n);
  for (int i = 0; i < n; i++) out[i * n + i] = d[r];
  for (int k = 0; k < r; k++)
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) out[i * n + j] += (d[k] - d[r]) * q[k * n + i] * q[k * n + j];
}

/* A low-rank factor (config.lowrank_dim): the top eigenpairs against ssyevd's
 * on a factor with a decaying spectrum, the tail the others' mean, the
 * same bits in place and again; and the low-rank preconditioner against
 * the whole one with the approximated A's own decomposition. In a child
 * (harness_run): its refusal logs, and the log reads the parameters. */
static int lowrank_main(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  enum { N = 300, R = 40, ROWS = 600, DG = 7 };
  float *x = malloc(sizeof(float) * ROWS * N), *f = calloc((size_t)N * N, sizeof(float));
  float *q = malloc(sizeof(float) * N * N), *d = malloc(sizeof(float) * N), *qt = malloc(sizeof(float) * N * N);
  float *dt = malloc(sizeof(float) * N), *q2 = malloc(sizeof(float) * N * N), *d2 = malloc(sizeof(float) * N);
  float *approx = calloc((size_t)N * N, sizeof(float));
  CHECK(x && f && q && d && qt && dt && q2 && d2 && approx);
  unsigned seed = 9;
  /* ReLU-like inputs whose scale decays over the columns */
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < N; c++) {
      float v = ((float)(harness_rand(&seed) % 2001) / 1000.0f - 0.6f) * expf(-(float)c / 40.0f);
      x[r * N + c] = v > 0 ? v : 0;
    }
  tide__kfac_syrk(f, N, 0, x, ROWS, N, 0, 1.0f / ROWS);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < i; j++) f[i * N + j] = f[j * N + i];
  CHECK_OK(tide__kfac_eigen(f, N, q, d));
  CHECK_OK(tide__kfac_eigen_top(f, N, R, qt, dt));
  double worst = 0, rest = 0, trace = 0, others = 0;
  for (int j = 0; j < R; j++) worst = fmax(worst, fabs((double)dt[j] - d[N - R + j]) / d[N - 1]);
  for (int j = 0; j < N; j++) trace += f[j * N + j];
  for (int j = 0; j < R; j++) rest += dt[j];
  for (int j = 0; j < N - R; j++) others += d[j];
  fprintf(stderr, "low-rank A: top %d of %d eigenvalues within %.2g of ssyevd's (of the largest); tail %.4g, the "
          "others' mean by ssyevd %.4g\n", R, N, worst, dt[R], others / (N - R));
  CHECK(worst < 1e-3);
  CHECK(fabs(dt[R] - (trace - rest) / (N - R)) <= 1e-5 * trace);
  for (int j = R; j < N; j++) CHECK(dt[j] == dt[R]);
  /* orthonormal rows, each an eigenvector: |F u - d u| small */
  for (int a = 0; a < R; a++) {
    for (int b = 0; b <= a; b++) {
      double dot = 0;
      for (int i = 0; i < N; i++) dot += (double)qt[a * N + i] * qt[b * N + i];
      CHECK(fabs(dot - (a == b)) < 1e-4);
    }
  }
  /* the same bits again, and in place */
  memcpy(q2, f, sizeof(float) * N * N);
  CHECK_OK(tide__kfac_eigen_top(q2, N, R, q2, d2));
  CHECK(memcmp(q2, qt, sizeof(float) * R * N) == 0 && memcmp(d2, dt, sizeof(float) * N) == 0);
  CHECK_RC(tide__kfac_eigen_top(f, N, N, q2, d2), TIDE_EINVAL);
  /* The preconditioner, A and/or G low-rank, against the whole one with
   * each approximated factor decomposed whole (approx = U^T diag(d_U) U +
   * c (I - U^T U)). G: a 60-wide factor at rank 12, made the same way. */
  enum { NG = 60, RG = 12 };
  float *approx_g = calloc((size_t)NG * NG, sizeof(float)), *g = calloc((size_t)NG * NG, sizeof(float));
  float *qg = malloc(sizeof(float) * NG * NG), *dg = malloc(sizeof(float) * NG), *qgt = malloc(sizeof(float) * NG * NG);
  float *dgt = malloc(sizeof(float) * NG), *qga = malloc(sizeof(float) * NG * NG), *dga = malloc(sizeof(float) * NG);
  float *m = malloc(sizeof(float) * NG * N), *p_whole = malloc(sizeof(float) * NG * N);
  float *p_low = malloc(sizeof(float) * NG * N), *work = malloc(sizeof(float) * NG * (N + N) + sizeof(float) * N * N);
  CHECK(approx_g && g && qg && dg && qgt && dgt && qga && dga && m && p_whole && p_low && work);
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < NG; c++)
      x[r * NG + c] = ((float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f) * expf(-(float)c / 8.0f);
  tide__kfac_syrk(g, NG, 0, x, ROWS, NG, 0, 1.0f / ROWS);
  for (int i = 0; i < NG; i++)
    for (int j = 0; j < i; j++) g[i * NG + j] = g[j * NG + i];
  CHECK_OK(tide__kfac_eigen(g, NG, qg, dg));
  CHECK_OK(tide__kfac_eigen_top(g, NG, RG, qgt, dgt));
  approximate(qt, dt, N, R, approx);
  approximate(qgt, dgt, NG, RG, approx_g);
  CHECK_OK(tide__kfac_eigen(approx, N, q, d));
  CHECK_OK(tide__kfac_eigen(approx_g, NG, qga, dga));
  for (int i = 0; i < NG * N; i++) m[i] = (float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f;
  CHECK_OK(tide__kfac_eigen(f, N, q2, d2)); /* A whole */
  static const char *const names[3] = {"A", "G", "A and G"};
  for (int which = 0; which < 3; which++) {
    int low_a = which != 1, low_g = which != 0;
    tide__kfac_precondition(low_g ? qga : qg, low_g ? dga : dg, NG, low_a ? q : q2, low_a ? d : d2, N, 0.1f, m,
                            p_whole, work);
    tide__kfac_precondition_lowrank(low_g ? qgt : qg, low_g ? dgt : dg, low_g ? RG : NG, NG, low_a ? qt : q2,
                                    low_a ? dt : d2, low_a ? R : N, N, 0.1f, m, p_low, work);
    double diff = rel_diff(p_low, p_whole, NG * (size_t)N);
    fprintf(stderr, "low-rank %s: preconditioner vs the whole one of the approximated factors: max rel diff %.3g\n",
            names[which], diff);
    CHECK(diff < 1e-4);
  }
  free(approx_g), free(g), free(qg), free(dg), free(qgt), free(dgt), free(qga), free(dga), free(m), free(p_whole);
  free(p_low);
  free(x), free(f), free(q), free(d), free(qt), free(dt), free(q2), free(d2), free(approx), free(work);
  return 0;
}

/* Through the trainer: with config.sample 0.5, what tide_trainer_kfac_add
 * makes of 10 rows is what a trainer taking every row makes of the 5 rows
 * the rule picks, given twice the weight; at step 0 (shift 0) and step 1
 * (shift 1). factor_decay 0, so the state holds each step's factor. */
static int sample_trainer(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  nn_model_t *m[2];
  tide_trainer_t *tr[2];
  tide_kfac_layer_t layers[3];
  float x[10 * 16];
  unsigned seed = 7;
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)(harness_rand(&seed) % 2001) / 1000.0f - 1.0f;
  for (int t = 0; t < 2; t++) {
    CHECK_OK(nn_model_create(ARCH, 8, 7, &m[t]));
    size_t ntensors;
    const tide_tensor_t *tensors = nn_tensors(m[t], &ntensors);
    tide_trainer_config_t c;
    tide_trainer_config_default(&c);
    c.dataset_size = DATASET;
    c.batch = 8;
    CHECK_OK(tide_trainer_create(comm, &c, nn_params(m[t]), nn_grads(m[t]), nn_param_count(m[t]), tensors, ntensors,
                                 &tr[t]));
    CHECK_OK(nn_kfac_layers(m[t], layers));
    tide_kfac_config_t kc;
    tide_kfac_config_default(&kc);
    kc.factor_every = kc.inverse_every = 1;
    kc.factor_decay = 0;
    kc.staleness = 0; /* the state's layout below: no pending decompositions, */
    kc.lowrank_dim = 0; /* every Q_A whole */
    kc.sample = t == 0 ? 0.5f : 1.0f;
    CHECK_OK(tide_trainer_kfac(tr[t], &kc, layers, 3));
  }
  for (int step = 0; step < 2; step++) {
    size_t idx[10], n = picked_rows(10, 0.5f, (size_t)step, idx);
    float rows[10 * 16];
    for (size_t j = 0; j < n; j++) memcpy(rows + j * 16, x + idx[j] * 16, 16 * sizeof *rows);
    for (int t = 0; t < 2; t++) {
      tide_batch_t b;
      tide_step_stats_t st;
      CHECK_OK(tide_trainer_next(tr[t], &b));
      memset(nn_grads(m[t]), 0, nn_param_count(m[t]) * sizeof(float));
      /* layer 2 is dense 16 -> 10 (A 17 with the bias, G 10) */
      if (t == 0) {
        CHECK_OK(tide_trainer_kfac_add(tr[t], 2, TIDE_KFAC_A, x, 10, 16, 0, 0.1f));
        CHECK_OK(tide_trainer_kfac_add(tr[t], 2, TIDE_KFAC_G, x, 10, 16, 0, 2.0f));
      } else {
        CHECK_OK(tide_trainer_kfac_add(tr[t], 2, TIDE_KFAC_A, rows, n, 16, 0, 0.1f * 2));
        CHECK_OK(tide_trainer_kfac_add(tr[t], 2, TIDE_KFAC_G, rows, n, 16, 0, 2.0f * 2));
      }
      CHECK_OK(tide_trainer_step(tr[t], 0.0f, &st));
      CHECK(st.stepped);
    }
    size_t len = tide_trainer_state_size(tr[0]);
    CHECK(len == tide_trainer_state_size(tr[1]));
    char *sa = malloc(len), *sb = malloc(len);
    CHECK(sa != NULL && sb != NULL);
    CHECK_OK(tide_trainer_state_get(tr[0], sa, len));
    CHECK_OK(tide_trainer_state_get(tr[1], sb, len));
    /* The state ends with K-FAC's part: per layer A, G, a flag, Q_A, d_A, Q_G, d_G
     * (the header before it has step times, which differ). */
    size_t kfac = 0;
    for (int i = 0; i < 3; i++) {
      size_t a = (size_t)layers[i].in_dim + 1, g = (size_t)layers[i].out_dim;
      kfac += (a * a + g * g + 1 + a * (a + 1) + g * (g + 1)) * sizeof(float);
    }
    CHECK(kfac < len);
    CHECK(memcmp(sa + len - kfac, sb + len - kfac, kfac) == 0);
    free(sa);
    free(sb);
  }
  for (int t = 0; t < 2; t++) {
    tide_trainer_destroy(tr[t]);
    nn_model_destroy(m[t]);
  }
  tide_comm_destroy(comm);
  fprintf(stderr, "sample 0.5 through the trainer: the factors (state) of the picked rows, steps 0 and 1\n");
  return 0;
}

/* rank_main, and then the layer owners: the expected ones, the same on
 * every rank. */
static int owners_main(int rank, int size, void *arg) {
  const run_t *r = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  nn_model_t *m;
  tide_trainer_t *tr;
  run_training(comm, r, &m, &tr);
  double lo[3], hi[3];
  for (int i = 0; i < 3; i++) lo[i] = -(hi[i] = tide__kfac_owner(tr->kfac, (size_t)i));
  CHECK_OK(tide_allreduce(comm, lo, lo, 3, TIDE_F64, TIDE_MAX));
  CHECK_OK(tide_allreduce(comm, hi, hi, 3, TIDE_F64, TIDE_MAX));
  for (int i = 0; i < 3; i++) CHECK(-lo[i] == hi[i] && hi[i] == r->owners[i]);
  write_params(r->out, rank, m);
  (void)size;
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  tide_comm_destroy(comm);
  return 0;
}

/* Owners by measured cost (config.rebalance) on 2 ranks, inverse_every 2:
 * the owners report costs (fake, so that the test is not timed) that turn
 * the formula's order round: conv 2, fc1 1, fc2 10 ms a step, where the
 * formula put fc1 (785^3) on rank 0 and fc2 and conv on rank 1 (loads 1
 * and 12). The greedy pass on the measured costs puts fc2 on rank 0 and
 * conv and fc1 on rank 1 (10 and 3) at step 2, the same on both ranks; the
 * run ends with the bits of the run whose owners never move, in the step
 * and with background decompositions (staleness 2: the decomposition in
 * use moves with the layer), whole layers and fc1 spread. */
static void test_owners(void) {
  char dir[] = "/tmp/tide-kfac-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { CAP = 1 << 20 };
  static const double fake[3] = {2e-3, 1e-3, 10e-3};
  float *a = malloc(CAP * sizeof(float)), *b = malloc(CAP * sizeof(float));
  CHECK(a != NULL && b != NULL);
  for (int c = 0; c < 4; c++) {
    int spread = c & 1, staleness = c & 2;
    char fixed[300], moved[300];
    snprintf(fixed, sizeof fixed, "%s/fixed-s%d-S%d", dir, spread, staleness);
    snprintf(moved, sizeof moved, "%s/moved-s%d-S%d", dir, spread, staleness);
    run_t r = {.batch = 6, .steps = 7, .distribute = 1, .spread = spread, .kl_clip = 0.001f, .factor_decay = 0.9f,
               .damping = 0.03f, .lr = 0.002f, .momentum = 0.9f, .factor_every = 1, .inverse_every = 2,
               .staleness = staleness, .out = fixed, .no_rebalance = 1, .owners = {1, 0, 1}};
    harness_opts_t opts = {.np = 2, .timeout_s = 120};
    CHECK(harness_run(&opts, owners_main, &r) == 0);
    r.out = moved, r.no_rebalance = 0, r.fake_costs = fake;
    r.owners[0] = 1, r.owners[1] = 1, r.owners[2] = 0;
    CHECK(harness_run(&opts, owners_main, &r) == 0);
    for (int rank = 0; rank < 2; rank++) {
      char pa[320], pb[320];
      snprintf(pa, sizeof pa, "%s.rank%d", fixed, rank);
      snprintf(pb, sizeof pb, "%s.rank%d", moved, rank);
      size_t n = read_params(pa, a, CAP);
      CHECK(n > 0 && read_params(pb, b, CAP) == n);
      CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    }
    fprintf(stderr, "owners by measured cost (spread %d, staleness %d): fc1 and fc2 moved at step 2, the same owners "
            "on both ranks, the bits of the run whose owners stay\n", spread, staleness);
  }
  remove_dir(dir);
  free(a);
  free(b);
}

/* The conv layer's A from its backward pass's own im2col chunks (the hook
 * is called once per chunk, as the weight gradient is formed from it),
 * against one separate im2col of the whole batch (nn__conv_patches: the
 * path before the fusion) and one SYRK; the weight gradient is the same
 * bits with and without the hook. Through the trainer (one step,
 * factor_decay 0): sample 1 gives that factor, and sample 0.25, drawn per
 * chunk, about a quarter of the rows and the factor's scale. */
enum { FUSED_BATCH = DATASET, CONV_A = 10 }; /* conv 1 -> 4, 3x3, 28x28: chunks of 37 samples */

typedef struct {
  float a[CONV_A * CONV_A];
  int calls;
  size_t rows, sampled; /* rows handed over; what sample 0.25 takes of them */
} conv_a_t;

static int record_conv_a(void *ctx, size_t layer, tide_kfac_factor_t factor, const float *x, size_t rows, size_t ld,
                         int transposed, float weight) {
  conv_a_t *c = ctx;
  if (layer != 0 || factor != TIDE_KFAC_A) return 0;
  CHECK(transposed && ld == rows);
  tide__kfac_syrk(c->a, CONV_A, 1, x, rows, ld, 1, weight);
  c->calls++;
  c->rows += rows;
  c->sampled += tide__kfac_sample_count(rows, 0.25f, NULL);
  return 0;
}

/* max |a - b| over the upper triangle of two dim x dim matrices, over max |b| there */
static double upper_diff(const float *a, const float *b, int dim) {
  double diff = 0, scale = 0;
  for (int i = 0; i < dim; i++)
    for (int j = i; j < dim; j++) {
      diff = fmax(diff, fabs((double)a[i * dim + j] - b[i * dim + j]));
      scale = fmax(scale, fabs((double)b[i * dim + j]));
    }
  return diff / scale;
}

static int fused_patches(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  enum { B = FUSED_BATCH, POS = 28 * 28 };
  float *images = malloc(sizeof(float) * DATASET * NN_IMAGE_SIZE), *col = malloc(sizeof(float) * 9 * B * POS);
  int32_t labels[DATASET];
  CHECK(images != NULL && col != NULL);
  make_data(images, labels, DATASET);
  /* the old path: the whole batch's patches at once */
  nn__conv_t conv = {.cin = 1, .cout = 4, .k = 3, .pad = 1, .h = 28, .w = 28, .oh = 28, .ow = 28};
  float ref[CONV_A * CONV_A] = {0};
  nn__conv_patches(&conv, B, 0, B, images, col);
  tide__kfac_syrk(ref, CONV_A, 1, col, (size_t)B * POS, (size_t)B * POS, 1, 1.0f / (float)(B * POS));
  /* the backward pass's chunks */
  nn_model_t *m;
  CHECK_OK(nn_model_create(ARCH, B, 7, &m));
  size_t np = nn_param_count(m);
  float loss, *plain = malloc(np * sizeof(float));
  CHECK(plain != NULL);
  CHECK_OK(nn_forward_backward(m, images, labels, B, &loss));
  memcpy(plain, nn_grads(m), np * sizeof(float));
  conv_a_t got;
  memset(&got, 0, sizeof got);
  nn_set_kfac_hook(m, record_conv_a, &got);
  CHECK_OK(nn_forward_backward(m, images, labels, B, &loss));
  CHECK(memcmp(plain, nn_grads(m), np * sizeof(float)) == 0);
  double d = upper_diff(got.a, ref, CONV_A);
  fprintf(stderr, "conv A from the backward pass's %d im2col chunks against one separate im2col: max rel diff %.3g\n",
          got.calls, d);
  CHECK(got.calls == (B + 36) / 37 && got.rows == (size_t)B * POS);
  CHECK(d <= 1e-5);
  CHECK(got.sampled >= (size_t)B * POS / 4 && got.sampled <= (size_t)B * POS / 4 + (size_t)got.calls);
  nn_model_destroy(m);
  /* through the trainer, sample 1 and 0.25 */
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float a[2][CONV_A * CONV_A];
  for (int t = 0; t < 2; t++) {
    tide_trainer_t *tr;
    tide_kfac_layer_t layers[3];
    CHECK_OK(nn_model_create(ARCH, B, 7, &m));
    size_t ntensors;
    const tide_tensor_t *tensors = nn_tensors(m, &ntensors);
    tide_trainer_config_t c;
    tide_trainer_config_default(&c);
    c.dataset_size = DATASET;
    c.batch = B;
    CHECK_OK(tide_trainer_create(comm, &c, nn_params(m), nn_grads(m), nn_param_count(m), tensors, ntensors, &tr));
    CHECK_OK(nn_kfac_layers(m, layers));
    tide_kfac_config_t kc;
    tide_kfac_config_default(&kc);
    kc.factor_every = kc.inverse_every = 1;
    kc.factor_decay = 0;
    kc.staleness = 0;
    kc.lowrank_dim = 0;
    kc.sample = t == 0 ? 1.0f : 0.25f;
    CHECK_OK(tide_trainer_kfac(tr, &kc, layers, 3));
    tide_batch_t b;
    tide_step_stats_t st;
    CHECK_OK(tide_trainer_next(tr, &b));
    nn_set_kfac_hook(m, hook, tr);
    CHECK_OK(nn_forward_backward(m, images, labels, B, &loss));
    CHECK_OK(tide_trainer_step(tr, loss, &st));
    size_t len = tide_trainer_state_size(tr), kfac = 0;
    for (int i = 0; i < 3; i++) {
      size_t na = (size_t)layers[i].in_dim + 1, ng = (size_t)layers[i].out_dim;
      kfac += (na * na + ng * ng + 1 + na * (na + 1) + ng * (ng + 1)) * sizeof(float);
    }
    char *state = malloc(len);
    CHECK(state != NULL && kfac < len);
    CHECK_OK(tide_trainer_state_get(tr, state, len));
    memcpy(a[t], state + len - kfac, sizeof a[t]); /* layer 0's A comes first */
    free(state);
    tide_trainer_destroy(tr);
    nn_model_destroy(m);
  }
  double full = upper_diff(a[0], ref, CONV_A), sampled = upper_diff(a[1], ref, CONV_A), tr_full = 0, tr_sampled = 0;
  for (int j = 0; j < CONV_A; j++) tr_full += a[0][j * CONV_A + j], tr_sampled += a[1][j * CONV_A + j];
  fprintf(stderr, "through the trainer: conv A, sample 1 against the separate im2col: max rel diff %.3g; sample "
          "0.25 (%zu of %zu rows): max rel diff %.3g, trace ratio %.4f\n", full, got.sampled, got.rows, sampled,
          tr_sampled / tr_full);
  CHECK(full <= 1e-5);
  CHECK(sampled <= 0.05 && fabs(tr_sampled / tr_full - 1) <= 0.05);
  tide_comm_destroy(comm);
  free(plain);
  free(images);
  free(col);
  return 0;
}

/* A layer wider than max_dim keeps its plain gradient: one step of SGD with
 * max_dim 100 (the 785-wide dense layer left out) moves that layer exactly
 * as a run without K-FAC does and the other layers not; on 1 and 2 ranks
 * (the layer owners then leave it out alike). */
static void test_skip(void) {
  char dir[] = "/tmp/tide-kfac-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  enum { CAP = 1 << 20 };
  float *plain = malloc(CAP * sizeof(float)), *got = malloc(CAP * sizeof(float));
  CHECK(plain != NULL && got != NULL);
  nn_model_t *m;
  CHECK_OK(nn_model_create(ARCH, 8, 7, &m));
  size_t ntensors;
  const tide_tensor_t *t = nn_tensors(m, &ntensors);
  CHECK(ntensors == 6);
  for (int np = 1; np <= 2; np++)
    for (int kfac = 0; kfac < 2; kfac++) {
      char out[256], path[300];
      snprintf(out, sizeof out, "%s/skip-np%d-k%d", dir, np, kfac);
      run_t r = {.batch = 8 / np, .steps = 1, .distribute = 1, .kl_clip = 0, .factor_decay = 0, .damping = 0.01f,
                 .lr = 0.1f, .momentum = 0, .factor_every = 1, .inverse_every = 1, .out = out, .max_dim = 100,
                 .no_kfac = !kfac};
      harness_opts_t opts = {.np = np, .timeout_s = 120};
      CHECK(harness_run(&opts, rank_main, &r) == 0);
      snprintf(path, sizeof path, "%s.rank0", out);
      size_t n = read_params(path, kfac ? got : plain, CAP);
      CHECK(n == nn_param_count(m));
      if (!kfac) continue;
      /* tensors 2 and 3: the dense 784 -> 16 layer, left out; 0, 1 and 4, 5 preconditioned */
      for (size_t i = 0; i < ntensors; i++) {
        int same = memcmp(got + t[i].offset, plain + t[i].offset, t[i].count * sizeof(float)) == 0;
        CHECK(same == (i == 2 || i == 3));
      }
      fprintf(stderr, "max_dim 100, np %d: the 785-wide layer moved as without K-FAC, the others not\n", np);
    }
  nn_model_destroy(m);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  free(plain);
  free(got);
}

/* Bad options name the field; bad layers name the layer. One rank. */
static int bad_options(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  nn_model_t *m;
  CHECK_OK(nn_model_create(ARCH, 8, 7, &m));
  size_t ntensors;
  const tide_tensor_t *tensors = nn_tensors(m, &ntensors);
  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = DATASET;
  c.batch = 8;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &c, nn_params(m), nn_grads(m), nn_param_count(m), tensors, ntensors, &tr));
  tide_kfac_layer_t layers[3];
  CHECK_OK(nn_kfac_layers(m, layers));
  tide_kfac_config_t kc, d;
  tide_kfac_config_default(&d);
  CHECK_OK(tide_kfac_config_check(&d));
#define EXPECT_BAD(field, assign)                                                    \
  do {                                                                               \
    kc = d;                                                                          \
    kc.assign;                                                                       \
    CHECK_RC(tide_kfac_config_check(&kc), TIDE_EINVAL);                              \
    CHECK_RC(tide_trainer_kfac(tr, &kc, layers, 3), TIDE_EINVAL);                    \
    CHECK(strstr(tide_trainer_last_error(tr), field) != NULL);                       \
  } while (0)
  EXPECT_BAD("factor_every", factor_every = 0);
  EXPECT_BAD("inverse_every", inverse_every = 15);
  EXPECT_BAD("inverse_every", inverse_every = -10);
  EXPECT_BAD("damping", damping = 0);
  EXPECT_BAD("damping", damping = NAN);
  EXPECT_BAD("factor_decay", factor_decay = 1);
  EXPECT_BAD("factor_decay", factor_decay = -0.1f);
  EXPECT_BAD("kl_clip", kl_clip = -1);
  EXPECT_BAD("distribute", distribute = 2);
  EXPECT_BAD("spread", spread = -1);
  EXPECT_BAD("sample", sample = 0);
  EXPECT_BAD("sample", sample = 1.5f);
  EXPECT_BAD("sample", sample = NAN);
  EXPECT_BAD("max_dim", max_dim = -1);
  EXPECT_BAD("diag_dim", diag_dim = -2);
  EXPECT_BAD("staleness", staleness = -1);
  EXPECT_BAD("lowrank", lowrank = 0);
  EXPECT_BAD("lowrank_dim", lowrank_dim = -1);
  EXPECT_BAD("bucket_kb", bucket_kb = -1);
  EXPECT_BAD("rebalance", rebalance = 2);
  /* The option string. */
  kc = d;
  CHECK_OK(tide_kfac_config_parse("damping=0.003,inverse_every=50:factor_every=5", &kc));
  CHECK(kc.damping == 0.003f && kc.inverse_every == 50 && kc.factor_every == 5 && kc.kl_clip == d.kl_clip);
  CHECK_RC(tide_kfac_config_parse("dampening=0.1", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("damping=x", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("inverse_every=7", &kc), TIDE_EINVAL); /* not a multiple of 5 */
  CHECK_RC(tide_kfac_config_parse("factor_every=2.5", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("spread=0.5", &kc), TIDE_EINVAL);
  CHECK_OK(tide_kfac_config_parse("spread=1", &kc));
  CHECK(kc.spread == 1);
  CHECK(kc.damping == 0.003f && kc.inverse_every == 50);
  CHECK_RC(tide_kfac_config_parse("sample=2", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("sample=0", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("max_dim=1.5", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("bucket_kb=-1", &kc), TIDE_EINVAL);
  CHECK_OK(tide_kfac_config_parse("bucket_kb=0", &kc));
  CHECK(kc.bucket_kb == 0 && d.bucket_kb == 0);
  CHECK_RC(tide_kfac_config_parse("max_dim=-3", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("diag_dim=x", &kc), TIDE_EINVAL);
  CHECK_OK(tide_kfac_config_parse("diag_dim=512", &kc));
  CHECK_RC(tide_kfac_config_parse("staleness=1.5", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("staleness=-3", &kc), TIDE_EINVAL);
  CHECK_OK(tide_kfac_config_parse("staleness=70", &kc)); /* above inverse_every 50: acts as 50 (swap_rank) */
  CHECK(kc.staleness == 70);
  CHECK_RC(tide_kfac_config_parse("lowrank=12.5", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("lowrank=0", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("lowrank_dim=-1", &kc), TIDE_EINVAL);
  CHECK_OK(tide_kfac_config_parse("lowrank=64,lowrank_dim=300", &kc));
  CHECK(kc.lowrank == 64 && kc.lowrank_dim == 300);
  CHECK(kc.rebalance == 1);
  CHECK_RC(tide_kfac_config_parse("rebalance=0.5", &kc), TIDE_EINVAL);
  CHECK_RC(tide_kfac_config_parse("rebalance=2", &kc), TIDE_EINVAL);
  CHECK_OK(tide_kfac_config_parse("rebalance=0", &kc));
  CHECK(kc.rebalance == 0);
  CHECK(kc.diag_dim == 512);
  CHECK_OK(tide_kfac_config_parse("sample=0.5,max_dim=100", &kc));
  CHECK(kc.sample == 0.5f && kc.max_dim == 100 && kc.spread == 1);
  /* A max_dim that leaves no layer (conv A 10, dense A 785 and 17): refused, naming it. */
  kc = d;
  kc.max_dim = 5;
  CHECK_RC(tide_trainer_kfac(tr, &kc, layers, 3), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "max_dim") != NULL);
  /* Layers that do not fit the tensors. */
  tide_kfac_layer_t spoilt[3];
  memcpy(spoilt, layers, sizeof spoilt);
  spoilt[1].in_dim = 783;
  CHECK_RC(tide_trainer_kfac(tr, &d, spoilt, 3), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "layers[1]") != NULL);
  memcpy(spoilt, layers, sizeof spoilt);
  spoilt[2].weight = 99;
  CHECK_RC(tide_trainer_kfac(tr, &d, spoilt, 3), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "layers[2]") != NULL);
  memcpy(spoilt, layers, sizeof spoilt);
  spoilt[2].bias = (long)layers[1].bias;
  CHECK_RC(tide_trainer_kfac(tr, &d, spoilt, 3), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "layers[2]") != NULL);
  CHECK_RC(tide_trainer_kfac(tr, &d, layers, 0), TIDE_EINVAL);
  /* The adasum row has no precondition stage in the exchange table (each
   * rank steps on its own mean): refused, naming it. */
  tide_trainer_config_t ca = c;
  ca.exchange = TIDE_EXCHANGE_ADASUM;
  tide_trainer_t *tra;
  CHECK_OK(tide_trainer_create(comm, &ca, nn_params(m), nn_grads(m), nn_param_count(m), tensors, ntensors, &tra));
  CHECK_RC(tide_trainer_kfac(tra, &d, layers, 3), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tra), "adasum") != NULL);
  tide_trainer_destroy(tra);
  /* Adding outside a step, and bad arguments inside one. */
  float x[16] = {0};
  CHECK_RC(tide_trainer_kfac_add(tr, 0, TIDE_KFAC_A, x, 1, 9, 0, 1.0f), TIDE_ESTATE);
  CHECK_OK(tide_trainer_kfac(tr, &d, layers, 3));
  CHECK_RC(tide_trainer_kfac(tr, &d, layers, 3), TIDE_ESTATE);
  tide_batch_t b;
  CHECK_OK(tide_trainer_next(tr, &b));
  CHECK(tide_trainer_kfac_wanted(tr) == 1);
  CHECK_RC(tide_trainer_kfac_add(tr, 3, TIDE_KFAC_A, x, 1, 9, 0, 1.0f), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "layer") != NULL);
  CHECK_RC(tide_trainer_kfac_add(tr, 0, (tide_kfac_factor_t)2, x, 1, 9, 0, 1.0f), TIDE_EINVAL);
  CHECK_RC(tide_trainer_kfac_add(tr, 0, TIDE_KFAC_A, x, 1, 8, 0, 1.0f), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "ld") != NULL);
  CHECK_RC(tide_trainer_kfac_add(tr, 0, TIDE_KFAC_G, x, 1, 4, 0, -1.0f), TIDE_EINVAL);
  CHECK(strstr(tide_trainer_last_error(tr), "weight") != NULL);
  CHECK_OK(tide_trainer_kfac_add(tr, 0, TIDE_KFAC_G, x, 1, 4, 0, 1.0f));
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  tide_comm_destroy(comm);
  return 0;
}

/* One step of plain SGD at lr: params1 = params0 - lr * P, so P comes back
 * exactly enough to compare. Writes the case for kfac_torch_ref.py. */
static void reference_case(FILE *f, float kl_clip, float decay) {
  enum { BATCH = 8 };
  float lr = 0.1f;
  run_t r = {.batch = BATCH, .steps = 1, .distribute = 1, .kl_clip = kl_clip, .factor_decay = decay,
             .damping = 0.01f, .lr = lr, .momentum = 0, .factor_every = 1, .inverse_every = 1};
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  nn_model_t *m0;
  CHECK_OK(nn_model_create(ARCH, BATCH, 7, &m0));
  size_t n = nn_param_count(m0);
  r.params0 = malloc(n * sizeof(float));
  nn_model_t *m;
  tide_trainer_t *tr;
  run_training(comm, &r, &m, &tr);
  /* The batch the step took: the trainer's order for epoch 0, first BATCH. */
  tide_sampler_t *sampler;
  CHECK_OK(tide_sampler_create(DATASET, 3, 0, 1, &sampler));
  CHECK_OK(tide_sampler_set_epoch(sampler, 0));
  uint64_t count;
  const uint64_t *order = tide_sampler_order(sampler, &count);
  float *images = malloc(sizeof(float) * DATASET * NN_IMAGE_SIZE);
  int32_t labels[DATASET];
  make_data(images, labels, DATASET);
  fprintf(f, "{\"arch\":\"%s\",\"lr\":%.9g,\"damping\":%.9g,\"kl_clip\":%.9g,\"decay\":%.9g,\"batch\":%d,", ARCH,
          (double)lr, (double)r.damping, (double)kl_clip, (double)decay, BATCH);
  fprintf(f, "\"labels\":[");
  for (int i = 0; i < BATCH; i++) fprintf(f, "%s%d", i ? "," : "", labels[order[i]]);
  fprintf(f, "],\"images\":[");
  for (int i = 0; i < BATCH; i++)
    for (int j = 0; j < NN_IMAGE_SIZE; j++)
      fprintf(f, "%s%.9g", i || j ? "," : "", (double)images[order[i] * NN_IMAGE_SIZE + j]);
  fprintf(f, "],\"params\":[");
  for (size_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? "," : "", (double)r.params0[i]);
  fprintf(f, "],\"precond\":[");
  const float *p1 = nn_params(m);
  for (size_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? "," : "", (double)((r.params0[i] - p1[i]) / lr));
  fprintf(f, "]}\n");
  free(images);
  free(r.params0);
  tide_sampler_destroy(sampler);
  tide_trainer_destroy(tr);
  nn_model_destroy(m);
  nn_model_destroy(m0);
  tide_comm_destroy(comm);
}

static int test_reference(void) {
  const char *src = getenv("TIDE_SOURCE_DIR");
  char path[] = "/tmp/tide-kfac-ref-XXXXXX", cmd[1024];
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  FILE *f = fdopen(fd, "w");
  CHECK(f != NULL);
  reference_case(f, 0.0f, 0.0f);     /* no clipping, the factors of this batch alone */
  reference_case(f, 0.001f, 0.95f);  /* KL clipping, the running average from I */
  fclose(f);
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/test/kfac_torch_ref.py %s", src ? src : ".", path);
  int status = system(cmd);
  unlink(path);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (rc == 77) fprintf(stderr, "test_kfac reference: skipped (no python3 with torch)\n");
  return rc;
}

/* tide-train --optim kfac end to end (2 workers, the MLP on a subset), and
 * a bad --kfac option naming its key. */
static void test_tide_train(void) {
  const char *tools = getenv("TIDE_TOOLS_DIR");
  if (tools == NULL) {
    fprintf(stderr, "test_kfac: TIDE_TOOLS_DIR unset, tide-train part skipped\n");
    return;
  }
  char dir[] = "/tmp/tide-kfac-train-XXXXXX", cmd[2048], out[16384];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(cmd, sizeof cmd,
           "%s/tiderun -np 2 %s/tide-train --model mlp --epochs 1 --batch 32 --subset 2000 --optim kfac "
           "--kfac factor_every=2,inverse_every=6,damping=0.003 --threads 1 --name k --runs %s 2>&1",
           tools, tools, dir);
  int rc = harness_shell(cmd, out, sizeof out);
  if (rc != 0 || strstr(out, "replicas identical: yes") == NULL) {
    fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, out);
    exit(1);
  }
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 1 %s/tide-train --model mlp --epochs 1 --subset 500 --optim kfac "
           "--kfac damping=-1 --name bad --runs %s 2>&1", tools, tools, dir);
  rc = harness_shell(cmd, out, sizeof out);
  CHECK(rc != 0 && strstr(out, "kfac.damping") != NULL);
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 1 %s/tide-train --model mlp --epochs 1 --subset 500 --optim kfac "
           "--kfac sample=2 --name bad3 --runs %s 2>&1", tools, tools, dir);
  rc = harness_shell(cmd, out, sizeof out);
  CHECK(rc != 0 && strstr(out, "kfac.sample") != NULL);
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 1 %s/tide-train --model mlp --epochs 1 --subset 500 --optim kfac "
           "--kfac inverse_every=20,staleness=-1 --name bad4 --runs %s 2>&1", tools, tools, dir);
  rc = harness_shell(cmd, out, sizeof out);
  CHECK(rc != 0 && strstr(out, "kfac.staleness") != NULL);
  /* Sampled factors, a layer left out and background decompositions, end
   * to end: the replicas agree. */
  snprintf(cmd, sizeof cmd,
           "%s/tiderun -np 2 %s/tide-train --model mlp --epochs 1 --batch 32 --subset 1000 --optim kfac "
           "--kfac factor_every=2,inverse_every=6,sample=0.5,max_dim=300,staleness=4 --threads 1 --name ks --runs %s "
           "2>&1",
           tools, tools, dir);
  rc = harness_shell(cmd, out, sizeof out);
  if (rc != 0 || strstr(out, "replicas identical: yes") == NULL) {
    fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, out);
    exit(1);
  }
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 1 %s/tide-train --model mlp --epochs 1 --subset 500 "
           "--kfac damping=0.01 --name bad2 --runs %s 2>&1", tools, tools, dir);
  rc = harness_shell(cmd, out, sizeof out);
  CHECK(rc != 0 && strstr(out, "needs --optim kfac") != NULL);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

int main(int argc, char **argv) {
  setenv("TIDE_NUM_THREADS", "1", 0);
  if (argc > 1 && strcmp(argv[1], "reference") == 0) {
    setenv("TIDE_SIZE", "1", 1);
    setenv("TIDE_RANK", "0", 1);
    return test_reference();
  }
  harness_opts_t one = {.np = 1, .timeout_s = 60};
  CHECK(harness_run(&one, bad_options, NULL) == 0);
  test_sample_rows();
  test_diag();
  CHECK(harness_run(&one, lowrank_main, NULL) == 0);
  CHECK(harness_run(&one, sample_trainer, NULL) == 0);
  CHECK(harness_run(&one, fused_patches, NULL) == 0);
  test_distributed();
  test_overlap();
  test_killed();
  test_resume();
  test_owners();
  test_async_replicas();
  harness_opts_t two = {.np = 2, .timeout_s = 120};
  int stale2 = 2, stale5 = 5; /* 5 > inverse_every 3: acts as 3 */
  CHECK(harness_run(&one, swap_rank, &stale2) == 0);
  CHECK(harness_run(&two, swap_rank, &stale2) == 0);
  CHECK(harness_run(&one, swap_rank, &stale5) == 0);
  test_skip();
  test_tide_train();
  fprintf(stderr, "test_kfac: ok\n");
  return 0;
}
