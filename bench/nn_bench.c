/* nn_bench: one-process training throughput of the src/nn engine: forward,
 * backward and a plain SGD step on random batches, the same work
 * bench/nn_torch_bench.py times in PyTorch. One JSON line per measurement
 * (the median of --repeats timed runs after a warm-up).
 *
 *   nn_bench [--model mlp|cnn|LAYERS] [--batch N] [--threads T] [--seconds S] [--repeats R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tide_nn.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (every thread), to tell the engine's cost
 * from a busy machine's: on a shared machine wall-clock rates move with the
 * neighbours, CPU seconds per image much less. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void usage(void) {
  fprintf(stderr, "usage: nn_bench [--model mlp|cnn|LAYERS] [--batch N] [--threads T] [--seconds S] [--repeats R]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *model = "mlp";
  int batch = 64, threads = 2, repeats = 5;
  double seconds = 5.0;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) usage();
    if (strcmp(argv[i], "--model") == 0)
      model = argv[++i];
    else if (strcmp(argv[i], "--batch") == 0)
      batch = atoi(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0)
      threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seconds") == 0)
      seconds = atof(argv[++i]);
    else if (strcmp(argv[i], "--repeats") == 0)
      repeats = atoi(argv[++i]);
    else
      usage();
  }
  if (batch < 1 || threads < 1 || repeats < 1 || seconds <= 0) usage();
  nn_set_threads(threads);
  nn_model_t *m;
  int rc = nn_model_create(model, batch, 1, &m);
  if (rc != 0) {
    fprintf(stderr, "nn_bench: cannot build %s: %s\n", model, tide_strerror(rc));
    return 1;
  }
  /* A few distinct random batches, so the input is not always cache-hot. */
  enum { BATCHES = 8 };
  float *x = malloc((size_t)BATCHES * batch * NN_IMAGE_SIZE * sizeof *x);
  int32_t *labels = malloc((size_t)BATCHES * batch * sizeof *labels);
  uint64_t s = 42;
  for (size_t i = 0; i < (size_t)BATCHES * batch * NN_IMAGE_SIZE; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(s >> 40) / 16777216.0 * 2.0 - 1.0);
  }
  for (size_t i = 0; i < (size_t)BATCHES * batch; i++) labels[i] = (int32_t)(i * 7 % NN_CLASSES);
  size_t n = nn_param_count(m);
  float *params = nn_params(m), *grads = nn_grads(m), lr = 0.01f, loss;
  long step = 0;
  /* Warm-up: first touches, BLAS thread start. */
  for (double t0 = now_s(); now_s() - t0 < seconds / 5;) {
    nn_forward_backward(m, x + (size_t)(step % BATCHES) * batch * NN_IMAGE_SIZE, labels + (step % BATCHES) * batch,
                        batch, &loss);
    for (size_t i = 0; i < n; i++) params[i] -= lr * grads[i];
    step++;
  }
  double *rates = malloc((size_t)repeats * sizeof *rates), cpu0 = cpu_s(), wall0 = now_s();
  long timed_steps = 0;
  for (int r = 0; r < repeats; r++) {
    long steps = 0;
    double t0 = now_s(), t;
    do {
      long b = (step + steps) % BATCHES;
      nn_forward_backward(m, x + (size_t)b * batch * NN_IMAGE_SIZE, labels + b * batch, batch, &loss);
      for (size_t i = 0; i < n; i++) params[i] -= lr * grads[i];
      steps++;
      t = now_s() - t0;
    } while (t < seconds / repeats);
    step += steps;
    timed_steps += steps;
    rates[r] = (double)steps * batch / t;
  }
  double cpu = cpu_s() - cpu0, wall = now_s() - wall0;
  qsort(rates, (size_t)repeats, sizeof *rates, cmp_double);
  printf("{\"lib\":\"tide\",\"model\":\"%s\",\"batch\":%d,\"threads\":%d,\"images_per_s\":%.1f,"
         "\"min\":%.1f,\"max\":%.1f,\"repeats\":%d,\"images_per_cpu_s\":%.1f,\"cpu_per_wall\":%.2f,"
         "\"blas\":\"%s\"}\n",
         model, batch, threads, rates[repeats / 2], rates[0], rates[repeats - 1], repeats,
         (double)timed_steps * batch / cpu, cpu / wall, nn_blas_info());
  free(rates);
  free(x);
  free(labels);
  nn_model_destroy(m);
  return 0;
}
