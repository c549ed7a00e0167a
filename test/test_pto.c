/* The parallel tensor operation (PTO): sharded optimizers against the whole
 * model's, and the trainer with config.pto against the replicated trainer.
 *
 * - Element-wise kinds (sgd, momentum, nesterov, adam, adamw): shards cut
 *   anywhere (inside tensors, empty shards) give the whole optimizer's bits.
 * - LARS, LAMB: shards sum partial per-tensor norms (an allreduce of
 *   doubles), in another order than one pass over the tensor, so the trust
 *   ratios may differ in a double's last bits: parameters within 1e-6
 *   relative.
 * - The trainer at np 1-5 (uneven shards; at np 5 one rank's shard is
 *   empty), with TIDE_ALGO=ring so that the replicated allreduce is the ring
 *   PTO's reduce-scatter is the first half of: bit for bit for the
 *   element-wise kinds under dense, topk and hitopk; LARS/LAMB within 1e-6.
 * - State: a PTO trainer's state (gathered) restores into a replicated one
 *   and into PTO trainers on another number of ranks (re-sharded), and runs
 *   on identically.
 * - Bad arguments: TIDE_EINVAL. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static const tide_optim_kind_t elementwise[] = {TIDE_OPTIM_SGD, TIDE_OPTIM_MOMENTUM, TIDE_OPTIM_NESTEROV,
                                                TIDE_OPTIM_ADAM, TIDE_OPTIM_ADAMW};
#define NELEMENTWISE (sizeof elementwise / sizeof *elementwise)

/* 37 parameters: a 4x5 weight, a bias (excluded from decay and trust ratio
 * by LARS/LAMB), a 4x4 weight; given out of offset order. */
enum { N = 37 };
static const tide_tensor_t layout[3] = {{"b.weight", 21, 16, 2, {4, 4}},
                                        {"a.weight", 0, 20, 2, {4, 5}},
                                        {"a.bias", 20, 1, 1, {1}}};

static void config_of(tide_optim_kind_t kind, tide_optim_config_t *c) {
  tide_optim_config_default(kind, c);
  if (kind != TIDE_OPTIM_LARS && kind != TIDE_OPTIM_LAMB) c->weight_decay = 0.01f;
  if (kind == TIDE_OPTIM_LARS) c->trust_coef = 0.02f;
}

static float grad_at(int step, size_t i, const float *w) {
  unsigned s = (unsigned)(step * 1000003 + (int)i * 7919 + 17);
  return 0.3f * w[i] + (float)((int)(harness_rand(&s) % 2001) - 1000) / 997.0f;
}

static int rel_close(const float *a, const float *b, size_t n, double rel, const char *what) {
  for (size_t i = 0; i < n; i++) {
    double scale = fabs(b[i]) > 1e-3 ? fabs(b[i]) : 1e-3;
    if (!(fabs((double)a[i] - b[i]) <= rel * scale)) {
      fprintf(stderr, "%s: element %zu is %.9g, the replicated run's %.9g\n", what, i, (double)a[i], (double)b[i]);
      return 0;
    }
  }
  return 1;
}

/* ---- 1. element-wise shards in one process --------------------------------- */

/* P shards with the given cuts step alongside the whole optimizer. */
static void elementwise_shards(tide_optim_kind_t kind, const size_t *cuts, int nshards) {
  tide_optim_config_t c;
  config_of(kind, &c);
  tide_optim_t *whole, *shard[6];
  CHECK_OK(tide_optim_create(&c, layout, 3, N, &whole));
  for (int s = 0; s < nshards; s++) {
    tide_optim_shard_t sh = {cuts[s], cuts[s + 1] - cuts[s], NULL, NULL};
    CHECK_OK(tide_optim_create_shard(&c, layout, 3, N, &sh, &shard[s]));
  }
  float w[N], ws[N], g[N];
  for (size_t i = 0; i < N; i++) w[i] = ws[i] = (float)((int)(i % 7) - 3) * 0.25f;
  for (int step = 0; step < 20; step++) {
    for (size_t i = 0; i < N; i++) g[i] = grad_at(step, i, w);
    CHECK_OK(tide_optim_step(whole, w, g, 0.05f));
    for (int s = 0; s < nshards; s++) CHECK_OK(tide_optim_step(shard[s], ws + cuts[s], g + cuts[s], 0.05f));
  }
  if (memcmp(w, ws, sizeof w) != 0) {
    fprintf(stderr, "%s over %d shards differs from the whole optimizer\n", tide_optim_name(kind), nshards);
    exit(1);
  }
  /* The shards' states, gathered, are the whole optimizer's blob; the blob
   * restores into shards cut elsewhere. */
  size_t len = tide_optim_state_size(whole), first, off, count;
  int nb;
  CHECK(tide_optim_state_size(shard[0]) == len);
  char *want = malloc(len), *got = malloc(len), *part = malloc(len);
  CHECK_OK(tide_optim_state_get(whole, want, len));
  memset(got, 0x7f, len);
  for (int s = 0; s < nshards; s++) {
    CHECK_OK(tide_optim_state_get(shard[s], part, len));
    CHECK_OK(tide_optim_state_layout(shard[s], &first, &nb, &off, &count));
    CHECK(off == cuts[s] && count == cuts[s + 1] - cuts[s]);
    if (s == 0) memcpy(got, part, first);
    for (int b = 0; b < nb; b++) {
      size_t at = first + ((size_t)b * N + off) * sizeof(float);
      memcpy(got + at, part + at, count * sizeof(float));
    }
  }
  CHECK(memcmp(got, want, len) == 0);
  tide_optim_t *other;
  tide_optim_shard_t sh = {5, 23, NULL, NULL};
  CHECK_OK(tide_optim_create_shard(&c, layout, 3, N, &sh, &other));
  CHECK_OK(tide_optim_state_set(other, want, len));
  CHECK(tide_optim_step_count(other) == 20);
  for (size_t i = 0; i < N; i++) g[i] = grad_at(20, i, w);
  memcpy(ws, w, sizeof w);
  CHECK_OK(tide_optim_step(whole, w, g, 0.05f));
  CHECK_OK(tide_optim_step(other, ws + 5, g + 5, 0.05f));
  CHECK(memcmp(w + 5, ws + 5, 23 * sizeof(float)) == 0);
  free(want), free(got), free(part);
  tide_optim_destroy(other);
  tide_optim_destroy(whole);
  for (int s = 0; s < nshards; s++) tide_optim_destroy(shard[s]);
}

static int elementwise_rank(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  static const size_t one[] = {0, N}, two[] = {0, 20, N}, uneven[] = {0, 3, 3, 21, 22, 30, N};
  for (size_t k = 0; k < NELEMENTWISE; k++) {
    elementwise_shards(elementwise[k], one, 1);
    elementwise_shards(elementwise[k], two, 2);
    elementwise_shards(elementwise[k], uneven, 6); /* an empty shard, cuts inside both weights */
  }
  printf("element-wise optimizers: shards give the whole optimizer's bits; states gather and re-shard\n");
  /* bad arguments */
  tide_optim_config_t c;
  config_of(TIDE_OPTIM_LAMB, &c);
  tide_optim_t *opt;
  tide_optim_shard_t sh = {0, 10, NULL, NULL};
  CHECK_RC(tide_optim_create_shard(&c, layout, 3, N, &sh, &opt), TIDE_EINVAL); /* LAMB on a part, no sum */
  sh.count = N;
  CHECK_OK(tide_optim_create_shard(&c, layout, 3, N, &sh, &opt)); /* the whole model needs no sum */
  tide_optim_destroy(opt);
  config_of(TIDE_OPTIM_ADAM, &c);
  sh = (tide_optim_shard_t){30, 8, NULL, NULL};
  CHECK_RC(tide_optim_create_shard(&c, layout, 3, N, &sh, &opt), TIDE_EINVAL); /* past the end */
  sh = (tide_optim_shard_t){SIZE_MAX, 2, NULL, NULL};
  CHECK_RC(tide_optim_create_shard(&c, layout, 3, N, &sh, &opt), TIDE_EINVAL);
  CHECK_RC(tide_optim_create_shard(&c, layout, 3, N, NULL, &opt), TIDE_EINVAL);
  CHECK_RC(tide_optim_state_layout(NULL, NULL, NULL, NULL, NULL), TIDE_EINVAL);
  return 0;
}

/* ---- 2. LARS and LAMB shards over ranks ----------------------------------- */

static int sum_doubles(double *values, size_t count, void *arg) {
  return tide_allreduce(arg, values, values, count, TIDE_F64, TIDE_SUM);
}

static int layerwise_rank(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  for (int lamb = 0; lamb <= 1; lamb++) {
    tide_optim_kind_t kind = lamb ? TIDE_OPTIM_LAMB : TIDE_OPTIM_LARS;
    tide_optim_config_t c;
    config_of(kind, &c);
    tide_optim_t *whole, *shard;
    size_t off, len;
    tide_block(N + 3, size, rank, &off, &len); /* uneven, the last rank's cut short */
    if (off > N) off = N;
    if (off + len > N) len = N - off;
    tide_optim_shard_t sh = {off, len, sum_doubles, comm};
    CHECK_OK(tide_optim_create(&c, layout, 3, N, &whole));
    CHECK_OK(tide_optim_create_shard(&c, layout, 3, N, &sh, &shard));
    float w[N], ws[N], g[N];
    size_t counts[8];
    for (int r = 0; r < size; r++) {
      size_t o, l;
      tide_block(N + 3, size, r, &o, &l);
      o = o > N ? N : o;
      counts[r] = o + l > N ? N - o : l;
    }
    for (size_t i = 0; i < N; i++) w[i] = ws[i] = (float)((int)(i % 7) - 3) * 0.25f + 0.1f;
    for (int step = 0; step < 30; step++) {
      for (size_t i = 0; i < N; i++) g[i] = grad_at(step, i, w);
      CHECK_OK(tide_optim_step(whole, w, g, 0.05f));
      for (size_t i = 0; i < N; i++) g[i] = grad_at(step, i, ws);
      CHECK_OK(tide_optim_step(shard, ws + off, g + off, 0.05f));
      CHECK_OK(tide_allgatherv(comm, ws + off, len, ws, counts, TIDE_F32));
    }
    CHECK(rel_close(ws, w, N, 1e-6, tide_optim_name(kind)));
    tide_optim_destroy(whole);
    tide_optim_destroy(shard);
  }
  if (rank == 0) printf("LARS, LAMB over %d shards: within 1e-6 of the whole optimizer\n", size);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- 3. the trainer ------------------------------------------------------ */

/* The mean gradient over idx[0..n) of 0.5 |w - x_i|^2 with x_i drawn from i. */
static void batch_grad(const float *w, const uint64_t *idx, size_t n, float *grad) {
  double g[N] = {0};
  for (size_t k = 0; k < n; k++) {
    unsigned s = (unsigned)(idx[k] * 2654435761u + 1);
    for (size_t j = 0; j < N; j++) g[j] += w[j] - ((double)(harness_rand(&s) % 1000) / 500.0 - 1.0);
  }
  for (size_t j = 0; j < N; j++) grad[j] = (float)(g[j] / (double)n);
}

static void trainer_config(tide_optim_kind_t kind, tide_exchange_t exchange, int pto, tide_trainer_config_t *c) {
  tide_trainer_config_default(c);
  c->dataset_size = 3000;
  c->batch = 4;
  c->epochs = 1;
  c->base_batch = 12; /* not ranks-dependent: states move between np */
  c->seed = 7;
  config_of(kind, &c->optim);
  c->schedule.base_lr = kind == TIDE_OPTIM_LARS ? 0.5f : 0.02f;
  c->exchange = exchange;
  c->density = 0.3;
  c->tensor_stats = 1;
  c->pto = pto;
}

static void run_steps(tide_trainer_t *tr, float *w, float *grad, long steps, tide_step_stats_t *last) {
  tide_batch_t b;
  for (long done = 0; done < steps;) {
    CHECK_OK(tide_trainer_next(tr, &b));
    CHECK(!b.done);
    if (b.count > 0) batch_grad(w, b.indices, b.count, grad);
    tide_step_stats_t s;
    CHECK_OK(tide_trainer_step(tr, 1.0, &s));
    if (s.stepped) done++, *last = s;
  }
}

typedef struct {
  tide_optim_kind_t kind;
  tide_exchange_t exchange;
} trainer_case_t;

static void init_params(float *w) {
  for (size_t i = 0; i < N; i++) w[i] = (float)((int)(i % 5) - 2) * 0.3f + 0.05f;
}

static int trainer_rank(int rank, int size, void *arg) {
  const trainer_case_t *tc = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[N], g[N], wp[N], gp[N];
  init_params(w);
  init_params(wp);
  tide_trainer_config_t c;
  tide_trainer_t *rep, *pto;
  trainer_config(tc->kind, tc->exchange, 0, &c);
  CHECK_OK(tide_trainer_create(comm, &c, w, g, N, layout, 3, &rep));
  trainer_config(tc->kind, tc->exchange, 1, &c);
  CHECK_OK(tide_trainer_create(comm, &c, wp, gp, N, layout, 3, &pto));
  tide_step_stats_t a, b;
  run_steps(rep, w, g, 25, &a);
  run_steps(pto, wp, gp, 25, &b);
  int layerwise = tc->kind == TIDE_OPTIM_LARS || tc->kind == TIDE_OPTIM_LAMB;
  char what[80];
  snprintf(what, sizeof what, "%s, %s, np %d", tide_optim_name(tc->kind), tide_exchange_name(tc->exchange), size);
  if (layerwise)
    CHECK(rel_close(wp, w, N, 1e-6, what));
  else if (memcmp(w, wp, sizeof w) != 0) {
    rel_close(wp, w, N, 0, what);
    fprintf(stderr, "%s: PTO is not bitwise the replicated run\n", what);
    exit(1);
  }
  /* the statistics agree too (|G|^2 summed in another order) */
  CHECK(a.loss == b.loss && a.global_batch == b.global_batch);
  CHECK(isnan(a.grad_sq) == isnan(b.grad_sq));
  CHECK(isnan(a.grad_sq) || fabs(a.grad_sq - b.grad_sq) <= 1e-5 * fabs(a.grad_sq));
  double g2a, g2b;
  CHECK_OK(tide_trainer_tensor_stats(rep, 0, &g2a, NULL));
  CHECK_OK(tide_trainer_tensor_stats(pto, 0, &g2b, NULL));
  CHECK(isnan(g2a) ? isnan(g2b) : fabs(g2a - g2b) <= 1e-5 * fabs(g2a));
  /* each rank keeps the state of its shard: 1/size of the whole, summed */
  size_t bytes[2] = {tide_trainer_optim_bytes(rep), tide_trainer_optim_bytes(pto)};
  CHECK_OK(tide_allreduce(comm, bytes, bytes, 2, TIDE_I64, TIDE_SUM));
  CHECK(bytes[0] == (size_t)size * tide_trainer_optim_bytes(rep) && bytes[1] == tide_trainer_optim_bytes(rep));
  CHECK(tide_trainer_optim_bytes(NULL) == 0);
  /* every rank holds the same parameters */
  float all[5 * N];
  CHECK_OK(tide_allgather(comm, wp, all, N, TIDE_F32));
  for (int r = 0; r < size; r++) CHECK(memcmp(all + (size_t)r * N, wp, sizeof wp) == 0);
  if (rank == 0) printf("trainer %s: PTO %s the replicated run after 25 steps\n", what,
                        layerwise ? "within 1e-6 of" : "bitwise equal to");
  tide_trainer_destroy(rep);
  tide_trainer_destroy(pto);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- 4. state: gathered, restored replicated and re-sharded ------------- */

static char state_path[256];

/* Phase 0 (np 3): a PTO trainer runs 20 steps, saves (collective), rank 0
 * writes the state and the parameters; the run goes on 15 steps, a
 * replicated trainer restored from the state goes the same 15 steps, bit for
 * bit. Phase 1 (another np): a PTO trainer and a replicated one both
 * restore the file and run 15 steps: the same bits (re-sharded). */
static int state_rank(int rank, int size, void *arg) {
  int phase = *(int *)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[N], g[N], w2[N], g2[N];
  tide_trainer_config_t c;
  tide_trainer_t *a, *b;
  tide_step_stats_t s;
  trainer_config(TIDE_OPTIM_ADAM, TIDE_EXCHANGE_DENSE, 1, &c);
  if (phase == 0) {
    init_params(w);
    CHECK_OK(tide_trainer_create(comm, &c, w, g, N, layout, 3, &a));
    run_steps(a, w, g, 20, &s);
    size_t len = tide_trainer_state_size(a);
    char *state = malloc(len);
    CHECK_OK(tide_trainer_state_get(a, state, len));
    if (rank == 0) {
      FILE *f = fopen(state_path, "wb");
      CHECK(f != NULL && fwrite(w, sizeof w, 1, f) == 1 && fwrite(state, len, 1, f) == 1 && fclose(f) == 0);
    }
    memcpy(w2, w, sizeof w);
    c.pto = 0;
    CHECK_OK(tide_trainer_create(comm, &c, w2, g2, N, layout, 3, &b));
    CHECK_OK(tide_trainer_state_set(b, state, len));
    run_steps(a, w, g, 15, &s);
    run_steps(b, w2, g2, 15, &s);
    CHECK(memcmp(w, w2, sizeof w) == 0);
    free(state);
  } else {
    FILE *f = fopen(state_path, "rb");
    CHECK(f != NULL);
    char *state = malloc(1 << 16);
    CHECK(fread(w, sizeof w, 1, f) == 1);
    size_t len = fread(state, 1, 1 << 16, f);
    fclose(f);
    memcpy(w2, w, sizeof w);
    CHECK_OK(tide_trainer_create(comm, &c, w, g, N, layout, 3, &a));
    c.pto = 0;
    CHECK_OK(tide_trainer_create(comm, &c, w2, g2, N, layout, 3, &b));
    CHECK(tide_trainer_state_size(a) == len);
    CHECK_RC(tide_trainer_state_set(a, state, len - 4), TIDE_EINVAL);
    CHECK_OK(tide_trainer_state_set(a, state, len));
    CHECK_OK(tide_trainer_state_set(b, state, len));
    run_steps(a, w, g, 15, &s);
    run_steps(b, w2, g2, 15, &s);
    CHECK(memcmp(w, w2, sizeof w) == 0);
    free(state);
  }
  if (rank == 0)
    printf("state %s at np %d: the restored run equals the %s one bit for bit\n",
           phase == 0 ? "saved under PTO" : "re-sharded", size, phase == 0 ? "PTO" : "replicated");
  tide_trainer_destroy(a);
  tide_trainer_destroy(b);
  tide_comm_destroy(comm);
  return 0;
}

static int bad_rank(int rank, int size, void *arg) {
  (void)rank, (void)size, (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float w[N] = {0}, g[N];
  tide_trainer_config_t c;
  tide_trainer_t *tr;
  trainer_config(TIDE_OPTIM_ADAM, TIDE_EXCHANGE_DENSE, 2, &c);
  CHECK_RC(tide_trainer_create(comm, &c, w, g, N, layout, 3, &tr), TIDE_EINVAL);
  trainer_config(TIDE_OPTIM_ADAM, TIDE_EXCHANGE_COUNT, 1, &c);
  CHECK_RC(tide_trainer_create(comm, &c, w, g, N, layout, 3, &tr), TIDE_EINVAL);
  tide_comm_destroy(comm);
  return 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  /* The replicated dense exchange as the ring allreduce PTO's reduce-scatter
   * halves (read by the ranks forked below). */
  setenv("TIDE_ALGO", "ring", 1);
  snprintf(state_path, sizeof state_path, "/tmp/tide-test-pto-%d.state", (int)getpid());
  harness_opts_t one = {.np = 1};
  CHECK(harness_run(&one, elementwise_rank, NULL) == 0);
  CHECK(harness_run(&one, bad_rank, NULL) == 0);
  for (int np = 1; np <= 5; np++) {
    harness_opts_t o = {.np = np, .timeout_s = 240};
    CHECK(harness_run(&o, layerwise_rank, NULL) == 0);
    for (size_t k = 0; k < NELEMENTWISE; k++) {
      trainer_case_t tc = {elementwise[k], TIDE_EXCHANGE_DENSE};
      CHECK(harness_run(&o, trainer_rank, &tc) == 0);
    }
    trainer_case_t lars = {TIDE_OPTIM_LARS, TIDE_EXCHANGE_DENSE}, lamb = {TIDE_OPTIM_LAMB, TIDE_EXCHANGE_DENSE};
    CHECK(harness_run(&o, trainer_rank, &lars) == 0);
    CHECK(harness_run(&o, trainer_rank, &lamb) == 0);
  }
  harness_opts_t three = {.np = 3}, four = {.np = 4}, two = {.np = 2};
  trainer_case_t sparse[] = {{TIDE_OPTIM_ADAM, TIDE_EXCHANGE_TOPK}, {TIDE_OPTIM_MOMENTUM, TIDE_EXCHANGE_HITOPK},
                             {TIDE_OPTIM_LAMB, TIDE_EXCHANGE_TOPK}};
  for (size_t i = 0; i < 3; i++) CHECK(harness_run(&three, trainer_rank, &sparse[i]) == 0);
  CHECK(harness_run(&four, trainer_rank, &sparse[1]) == 0);
  int phase0 = 0, phase1 = 1;
  CHECK(harness_run(&three, state_rank, &phase0) == 0);
  CHECK(harness_run(&two, state_rank, &phase1) == 0);
  CHECK(harness_run(&four, state_rank, &phase1) == 0);
  remove(state_path);
  printf("all PTO checks passed\n");
  return 0;
}
