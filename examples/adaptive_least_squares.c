/* A C program that trains with tide's step API and adaptation, using only
 * tide.h: linear least squares on synthetic data (y = x . w_true + noise),
 * 64 samples per rank to start, with noise-scale batch sizing and AdaScale.
 *
 *   tiderun -np 4 ./adaptive_least_squares
 *
 * The trainer deals the samples, exchanges the gradients, measures the
 * noise scale and grows the batch; the program only computes gradients.
 * At the end every rank measures the loss of the trained w on samples it
 * never trained on and exits 1 unless it is within 10% of the noise floor
 * (the label noise is uniform on [-0.5, 0.5]: E[r^2 / 2] = 1/24 = 0.0417),
 * so the example doubles as a test (ctest: example_adaptive_least_squares). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tide.h"

enum { DIM = 32, SAMPLES = 200000, HELD_OUT = 20000 };
static const double noise_floor = 1.0 / 24;

/* Sample i, drawn from i alone so every rank sees the same data set. */
static void sample(uint64_t i, float *x, float *y) {
  uint64_t s = i * 0x9e3779b97f4a7c15ull + 1;
  float dot = 0;
  for (int j = 0; j < DIM; j++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x[j] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    dot += x[j] * (float)(j % 5 - 2); /* w_true */
  }
  s ^= s << 13, s ^= s >> 7, s ^= s << 17;
  *y = dot + 0.5f * (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
}

/* The mean loss of w on HELD_OUT samples past the training set. */
static double held_out_loss(const float *w) {
  double loss = 0;
  for (uint64_t i = SAMPLES; i < SAMPLES + HELD_OUT; i++) {
    float x[DIM], y, r = 0;
    sample(i, x, &y);
    for (int j = 0; j < DIM; j++) r += x[j] * w[j];
    r -= y;
    loss += 0.5 * r * r;
  }
  return loss / HELD_OUT;
}

int main(void) {
  tide_comm_t *comm;
  int rc = tide_comm_init(&comm);
  if (rc != 0) {
    fprintf(stderr, "cannot join the job: %s\n", tide_strerror(rc));
    return 1;
  }
  float w[DIM] = {0}, grad[DIM];
  tide_trainer_config_t config;
  tide_trainer_config_default(&config);
  config.dataset_size = SAMPLES;
  config.batch = 64;
  config.max_batch = 1024;
  config.epochs = 3;
  tide_optim_config_default(TIDE_OPTIM_SGD, &config.optim);
  config.schedule.kind = TIDE_LR_CONSTANT;
  config.schedule.base_lr = 0.05f;
  tide_trainer_t *trainer;
  if ((rc = tide_trainer_create(comm, &config, w, grad, DIM, NULL, 0, &trainer)) != 0 ||
      (rc = tide_trainer_adapt(trainer, "gns:warmup=20,adascale")) != 0) {
    fprintf(stderr, "cannot set up the trainer: %s\n", tide_strerror(rc));
    tide_comm_destroy(comm);
    return 1;
  }
  tide_batch_t batch;
  tide_step_stats_t s;
  while ((rc = tide_trainer_next(trainer, &batch)) == 0 && !batch.done) {
    double g[DIM] = {0}, loss = 0;
    for (size_t k = 0; k < batch.count; k++) {
      float x[DIM], y, r = 0;
      sample(batch.indices[k], x, &y);
      for (int j = 0; j < DIM; j++) r += x[j] * w[j];
      r -= y;
      loss += 0.5 * r * r;
      for (int j = 0; j < DIM; j++) g[j] += r * x[j];
    }
    for (int j = 0; j < DIM; j++) grad[j] = batch.count ? (float)(g[j] / (double)batch.count) : 0;
    if ((rc = tide_trainer_step(trainer, batch.count ? loss / (double)batch.count : 0, &s)) != 0) break;
    if (s.stepped && s.step % 100 == 0 && tide_comm_rank(comm) == 0)
      printf("step %5ld  progress %6.2f epochs  loss %.5f  global batch %5ld  noise scale %8.1f  lr x %.2f\n",
             s.step, s.epochs_done, s.loss, s.global_batch, s.noise_scale, s.lr_factor);
  }
  int failed = rc != 0;
  if (rc != 0) {
    fprintf(stderr, "training failed: %s: %s\n", tide_strerror(rc), tide_trainer_last_error(trainer));
  } else {
    double held_out = held_out_loss(w);
    if (tide_comm_rank(comm) == 0)
      printf("done: %ld steps, final loss %.5f, held-out loss %.5f (the noise floor is %.4f), global batch %ld\n",
             s.step, s.loss, held_out, noise_floor, s.global_batch);
    if (!(held_out <= 1.1 * noise_floor)) {
      fprintf(stderr, "rank %d: held-out loss %.5f is not within 10%% of the noise floor %.4f: training did not "
              "converge\n", tide_comm_rank(comm), held_out, noise_floor);
      failed = 1;
    }
  }
  tide_trainer_destroy(trainer);
  tide_comm_destroy(comm);
  return failed;
}
