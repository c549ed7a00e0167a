/* Burst-parallel execution (src/nn/burst.c, docs/burst-parallel.md): 4
 * ranks train a small CNN for 50 steps under mixed-width plans and must end
 * with data parallelism's parameters (the same global batch, each rank's
 * mean-loss gradient weighted by its share and summed, the same optimizer)
 * within float tolerance, over shared memory and over TCP; bad plans are
 * refused with a message naming the problem. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "nn/nn.h"
#include "tide.h"

/* conv0, pool1, flatten2, dense3, dense4 */
#define ARCH "conv:4:3:1,relu,pool,flatten,dense:16,relu,dense:10"
enum { LAYERS = 5, BATCH = 30, STEPS = 50 };
static const float LR = 0.05f;

/* Mixed plans: every kind of width change (4->2->1 gathers, 1->2->4
 * scatters, 1->4 and 4->1 jumps); the data-parallel plan itself; a CNN
 * whose flatten aliases its one-channel input (its gradient is its
 * output's) between two width changes; an MLP whose first layer (flatten)
 * runs no backward pass. kinds: c conv, p pool, f flatten, d dense. */
typedef struct {
  const char *arch, *kinds;
  int n, widths[LAYERS];
} case_t;
static const case_t cases[] = {
    {ARCH, "cpfdd", LAYERS, {4, 2, 1, 2, 4}},
    {ARCH, "cpfdd", LAYERS, {1, 4, 1, 4, 2}},
    {ARCH, "cpfdd", LAYERS, {2, 2, 4, 1, 1}},
    {ARCH, "cpfdd", LAYERS, {4, 4, 4, 4, 4}},
    {"conv:1:3:1,relu,pool,flatten,dense:16,relu,dense:10", "cpfdd", LAYERS, {2, 1, 4, 1, 2}},
    {"flatten,dense:16,relu,dense:10", "fdd", 3, {4, 1, 2}},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* Step s's global batch: images with a class-dependent bright square, so
 * the model learns and its parameters move far from their start. */
static void make_batch(int step, float *x, int32_t *labels) {
  unsigned st = 1234u + 977u * (unsigned)step;
  for (int i = 0; i < BATCH; i++) {
    int c = (int)(harness_rand(&st) % NN_CLASSES);
    labels[i] = c;
    for (int p = 0; p < NN_IMAGE_SIZE; p++) {
      int row = p / NN_IMAGE_SIDE, col = p % NN_IMAGE_SIDE;
      float noise = 2.0f * ((float)(harness_rand(&st) % 1000) / 1000.0f - 0.5f);
      int inside = row >= 2 * c && row < 2 * c + 6 && col >= 8 && col < 14;
      x[i * NN_IMAGE_SIZE + p] = noise + (inside ? 1.0f : 0.0f);
    }
  }
}

static void optim_config(tide_optim_config_t *c) {
  tide_optim_config_default(TIDE_OPTIM_MOMENTUM, c);
  c->weight_decay = 5e-4f;
}

/* Data parallelism: rank r takes a contiguous share of each batch. */
static float *train_dp(tide_comm_t *comm, const char *arch, float **init) {
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  nn_model_t *m = NULL;
  CHECK_OK(nn_model_create(arch, BATCH, 7, &m));
  size_t np = nn_param_count(m), nt;
  *init = malloc(np * sizeof(float));
  CHECK(*init != NULL);
  memcpy(*init, nn_params(m), np * sizeof(float));
  const tide_tensor_t *tensors = nn_tensors(m, &nt);
  tide_optim_config_t cfg;
  optim_config(&cfg);
  tide_optim_t *opt = NULL;
  CHECK_OK(tide_optim_create(&cfg, tensors, nt, np, &opt));
  float *x = malloc((size_t)BATCH * NN_IMAGE_SIZE * sizeof(float));
  int32_t labels[BATCH];
  CHECK(x != NULL);
  int lo = rank * BATCH / size, hi = (rank + 1) * BATCH / size;
  for (int s = 0; s < STEPS; s++) {
    make_batch(s, x, labels);
    float loss;
    CHECK_OK(nn_forward_backward(m, x + (size_t)lo * NN_IMAGE_SIZE, labels + lo, hi - lo, &loss));
    float *g = nn_grads(m);
    for (size_t k = 0; k < np; k++) g[k] *= (float)(hi - lo) / BATCH;
    CHECK_OK(tide_allreduce(comm, g, g, np, TIDE_F32, TIDE_SUM));
    CHECK_OK(tide_optim_step(opt, nn_params(m), g, LR));
  }
  float *out = malloc(np * sizeof(float));
  CHECK(out != NULL);
  memcpy(out, nn_params(m), np * sizeof(float));
  tide_optim_destroy(opt);
  nn_model_destroy(m);
  free(x);
  return out;
}

static int train_rank(int rank, int size, void *arg) {
  (void)arg;
  CHECK(size == 4);
  tide_comm_t *comm = NULL;
  CHECK_OK(tide_comm_init(&comm));
  float *x = malloc((size_t)BATCH * NN_IMAGE_SIZE * sizeof(float));
  int32_t labels[BATCH];
  CHECK(x != NULL);
  for (int c = 0; c < NCASES; c++) {
    const case_t *k = &cases[c];
    float *init = NULL, *dp = train_dp(comm, k->arch, &init);
    nn_model_t *m = NULL;
    CHECK_OK(nn_model_create(k->arch, BATCH, 7, &m));
    tide_optim_config_t cfg;
    optim_config(&cfg);
    nn_burst_t *b = NULL;
    CHECK_OK(nn_burst_create(m, comm, k->widths, k->n, BATCH, &cfg, &b));
    float first = NAN, loss = NAN;
    int last = k->widths[k->n - 1];
    for (int s = 0; s < STEPS; s++) {
      make_batch(s, x, labels);
      CHECK_OK(nn_burst_step(b, x, labels, LR, &loss));
      if (s == 0) first = loss;
      CHECK(nn_burst_runs(b, k->n - 1) == (rank < last));
      CHECK(isnan(loss) == (rank >= last));
    }
    /* Rank 0 runs every layer and holds the whole model; every rank holds
     * the current parameters of the layers it runs. Compare those with
     * data parallelism's. */
    size_t nt;
    const tide_tensor_t *t = nn_tensors(m, &nt);
    const float *got = nn_params(m);
    double worst = 0, moved = 0;
    int layer = 0;
    for (size_t j = 0; j < nt; j += 2) {
      while (layer < k->n && strchr("cd", k->kinds[layer]) == NULL) layer++;
      int runs = nn_burst_runs(b, layer);
      for (size_t e = t[j].offset; e < t[j + 1].offset + t[j + 1].count; e++) {
        double d = fabs((double)got[e] - dp[e]) / (1.0 + fabs((double)dp[e]));
        if (runs && d > worst) worst = d;
        if (fabs((double)dp[e] - init[e]) > moved) moved = fabs((double)dp[e] - init[e]);
      }
      layer++;
    }
    if (rank == 0 || worst > 1e-4) {
      printf("rank %d %s plan", rank, k->arch);
      for (int i = 0; i < k->n; i++) printf("%c%d", i ? ',' : ' ', k->widths[i]);
      printf(": loss %.4f -> %.4f, worst relative difference from data parallelism %.2e (parameters moved up to "
             "%.3f)\n", first, loss, worst, moved);
    }
    CHECK(worst <= 1e-4);
    CHECK(moved > 0.05); /* training did something the comparison can see */
    if (rank == 0) CHECK(loss < 0.7f * first);
    nn_burst_destroy(b);
    nn_model_destroy(m);
    free(dp);
    free(init);
  }
  free(x);
  tide_comm_destroy(comm);
  return 0;
}

/* The library's messages for a bad plan, through a file standing in for
 * stderr. */
static void expect_refused(tide_comm_t *comm, const int *widths, int n, int batch, const char *want) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/test_burst_%d_XXXXXX", (int)getpid());
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  nn_model_t *m = NULL;
  CHECK_OK(nn_model_create(ARCH, BATCH, 7, &m));
  tide_optim_config_t cfg;
  optim_config(&cfg);
  nn_burst_t *b = NULL;
  int rc = nn_burst_create(m, comm, widths, n, batch, &cfg, &b);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char text[2048] = "";
  lseek(fd, 0, SEEK_SET);
  ssize_t got = read(fd, text, sizeof text - 1);
  text[got > 0 ? got : 0] = '\0';
  close(fd);
  unlink(path);
  CHECK_RC(rc, TIDE_EINVAL);
  CHECK(b == NULL);
  if (strstr(text, want) == NULL) {
    fprintf(stderr, "wanted \"%s\" in the error, got: %s\n", want, text);
    exit(1);
  }
  nn_model_destroy(m);
}

static int bad_rank(int rank, int size, void *arg) {
  (void)arg, (void)size;
  tide_comm_t *comm = NULL;
  CHECK_OK(tide_comm_init(&comm));
  static const int three[LAYERS] = {4, 3, 1, 1, 1}, eight[LAYERS] = {1, 8, 1, 1, 1}, ok[LAYERS] = {4, 2, 1, 2, 4};
  expect_refused(comm, three, LAYERS, BATCH, "layer 1: width 3 must be a power of two in [1, 4]");
  expect_refused(comm, eight, LAYERS, BATCH, "layer 1: width 8 must be a power of two in [1, 4]");
  expect_refused(comm, ok, LAYERS - 1, BATCH, "the plan has 4 layers but the model");
  expect_refused(comm, ok, LAYERS, 3, "global_batch 3 is smaller than the widest layer's 4 workers");
  /* the model's max_batch a plan needs: 30 samples on one rank; 8 on 4 */
  CHECK(nn_burst_max_batch(ok, LAYERS, BATCH) == 30);
  CHECK(nn_burst_max_batch((const int[]){4, 4, 4, 4, 4}, LAYERS, BATCH) == 8);
  CHECK(nn_burst_max_batch(ok, LAYERS, 3) == 0);
  /* a model too small for a narrow layer's share */
  nn_model_t *small = NULL;
  CHECK_OK(nn_model_create(ARCH, 8, 7, &small));
  tide_optim_config_t cfg;
  optim_config(&cfg);
  nn_burst_t *b = NULL;
  CHECK_RC(nn_burst_create(small, comm, ok, LAYERS, BATCH, &cfg, &b), TIDE_EINVAL); /* "max_batch >= 30" */
  CHECK(b == NULL);
  nn_model_destroy(small);
  /* ranks given different plans (collective: found by all) */
  static const int other[LAYERS] = {4, 2, 2, 2, 4};
  expect_refused(comm, rank == 2 ? other : ok, LAYERS, BATCH, "the ranks were given different plans");
  /* one rank's plan is bad: it says why, the others that it refused, and
   * nobody is left waiting in a collective */
  expect_refused(comm, rank == 2 ? three : ok, LAYERS, BATCH,
                 rank == 2 ? "layer 1: width 3 must be a power of two" : "another rank refused the plan");
  /* the communicator is still usable afterwards */
  CHECK_OK(tide_barrier(comm));
  tide_comm_destroy(comm);
  return 0;
}

int main(void) {
  harness_opts_t shm = {.np = 4}, tcp = {.np = 4, .tcp_only = 1};
  CHECK(harness_run(&shm, train_rank, NULL) == 0);
  CHECK(harness_run(&tcp, train_rank, NULL) == 0);
  CHECK(harness_run(&shm, bad_rank, NULL) == 0);
  printf("test_burst: ok\n");
  return 0;
}
