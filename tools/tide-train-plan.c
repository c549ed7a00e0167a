/* tide-train --plan FILE: each layer on its plan's width of ranks
 * (nn_burst_*); this file only reads the plan, feeds the global batches and
 * reports. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "tide-train-plan.h"

/* CPU seconds this process has used (all its threads). */
static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int train_plan(tide_comm_t *comm, const train_plan_args_t *a, const nn_dataset_t *train, const nn_dataset_t *test) {
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm), status = 1, rc;
  if (a->conflict != NULL) {
    if (rank == 0) fprintf(stderr, "tide-train: --plan runs without %s: leave it out\n", a->conflict);
    return 2;
  }
  if (train == NULL || test == NULL) {
    if (rank == 0) fprintf(stderr, "tide-train: --plan reads Fashion-MNIST's idx files (--data DIR), not the loader\n");
    return 2;
  }
  tide_optim_kind_t kind;
  if (tide_optim_parse(a->optim, &kind) != 0) {
    if (rank == 0)
      fprintf(stderr,
              "tide-train: --plan takes --optim sgd, momentum, nesterov, adam, adamw, lars or lamb, got \"%s\"\n",
              a->optim);
    return 2;
  }
  tide_optim_config_t cfg;
  tide_optim_config_default(kind, &cfg);
  if (a->momentum >= 0) cfg.momentum = (float)a->momentum;
  cfg.weight_decay = (float)a->weight_decay;
  int global = a->batch * size, n = 0;
  tide_profile_t *layers = NULL;
  nn_model_t *m = NULL;
  nn_burst_t *b = NULL;
  tide_sampler_t *sampler = NULL;
  float *x = NULL;
  int32_t *labels = NULL;
  double *times = NULL;
  int *widths = NULL;
  if ((rc = nn_profile_layers(a->model, &layers)) != 0) goto out;
  n = tide_profile_layer_count(layers);
  if ((widths = calloc((size_t)n, sizeof *widths)) == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  if ((rc = tide_plan_read_widths(a->plan, layers, size, widths)) != 0) {
    if (rank == 0) fprintf(stderr, "tide-train: --plan %s refused (the line above says why)\n", a->plan);
    goto out;
  }
  int max_batch = nn_burst_max_batch(widths, n, global);
  if ((rc = nn_model_create(a->model, max_batch > 0 ? max_batch : global, a->seed, &m)) != 0 ||
      (rc = nn_burst_create(m, comm, widths, n, global, &cfg, &b)) != 0)
    goto out;
  size_t count = nn_dataset_count(train);
  if (a->subset > 0 && (size_t)a->subset < count) count = (size_t)a->subset;
  long steps_per_epoch = (long)(count / (size_t)global), steps = steps_per_epoch * a->epochs;
  if (steps_per_epoch < 1) {
    if (rank == 0) fprintf(stderr, "tide-train: %zu images give no step of the global batch %d\n", count, global);
    goto out;
  }
  if ((rc = tide_sampler_create(count, a->seed, 0, 1, &sampler)) != 0) goto out;
  x = malloc((size_t)global * NN_IMAGE_SIZE * sizeof *x);
  labels = malloc((size_t)global * sizeof *labels);
  times = calloc((size_t)steps, sizeof *times);
  if (x == NULL || labels == NULL || times == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  if (rank == 0) {
    printf("tide-train: plan %s on %d ranks, global batch %d, widths", a->plan, size, global);
    for (int i = 0; i < n; i++) printf(" %d", widths[i]);
    printf("\n");
  }
  const float *images = nn_dataset_images(train);
  const int32_t *all_labels = nn_dataset_labels(train);
  float loss = NAN, first = NAN;
  long skip = steps > 3 ? 2 : 0; /* warm-up steps, left out of the timings */
  double cpu0 = 0;
  for (long s = 0; s < steps; s++) {
    if (s == skip) cpu0 = cpu_seconds();
    long e = s / steps_per_epoch, at = (s % steps_per_epoch) * global;
    uint64_t total;
    if (at == 0 && (rc = tide_sampler_set_epoch(sampler, (uint64_t)e)) != 0) goto out;
    const uint64_t *order = tide_sampler_order(sampler, &total);
    for (int i = 0; i < global; i++) {
      uint64_t k = order[at + i];
      memcpy(x + (size_t)i * NN_IMAGE_SIZE, images + k * NN_IMAGE_SIZE, NN_IMAGE_SIZE * sizeof *x);
      labels[i] = all_labels[k];
    }
    double t0 = now_s();
    if ((rc = nn_burst_step(b, x, labels, (float)a->lr, &loss)) != 0) goto out;
    times[s] = now_s() - t0;
    if (s == 0) first = loss;
  }
  /* the CPU-seconds a step takes over all ranks: the measured worker-time,
   * whatever else loads the machine */
  double cpu = (cpu_seconds() - cpu0) / (double)(steps - skip);
  if ((rc = tide_allreduce(comm, &cpu, &cpu, 1, TIDE_F64, TIDE_SUM)) != 0) goto out;
  if (rank == 0) {
    /* rank 0 runs every layer: its model is the whole, current one */
    float test_loss;
    int correct;
    if ((rc = nn_evaluate(m, nn_dataset_images(test), nn_dataset_labels(test), (int)nn_dataset_count(test), &test_loss,
                          &correct)) != 0)
      goto out;
    double mean = 0;
    for (long s = skip; s < steps; s++) mean += times[s];
    mean /= (double)(steps - skip);
    qsort(times + skip, (size_t)(steps - skip), sizeof *times, cmp_double);
    double median = times[skip + (steps - skip) / 2];
    printf("tide-train: %ld steps: loss %.4f -> %.4f, test accuracy %.2f%%\n", steps, first, loss,
           100.0 * correct / (double)nn_dataset_count(test));
    printf("{\"plan\":\"%s\",\"model\":\"%s\",\"workers\":%d,\"global_batch\":%d,\"steps\":%ld,"
           "\"step_time_median_s\":%.6f,\"step_time_mean_s\":%.6f,\"cpu_s_per_step\":%.6f,\"loss\":%.6f,"
           "\"test_accuracy\":%.6f}\n",
           a->plan, a->model, size, global, steps, median, mean, cpu, loss, correct / (double)nn_dataset_count(test));
  }
  status = 0;
out:
  if (status != 0 && rc != 0 && rank == 0)
    fprintf(stderr, "tide-train: --plan: %s%s%s\n", tide_strerror(rc), *tide_comm_last_error(comm) ? ": " : "",
            tide_comm_last_error(comm));
  nn_burst_destroy(b);
  nn_model_destroy(m);
  tide_profile_destroy(layers);
  tide_sampler_destroy(sampler);
  free(widths);
  free(x);
  free(labels);
  free(times);
  return status;
}
