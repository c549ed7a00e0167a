/* A short tour of tide's collectives, run under tiderun:
 *
 *   tiderun -np 4 ./collectives_demo
 *
 * Each rank contributes its rank; rank 0 prints what every collective
 * produced and how fast a few allreduce sizes run. Uses only tide.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tide.h"

#define CHECK(call)                                                                       \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    if (rc_ != 0) {                                                                       \
      fprintf(stderr, "%s failed: %s %s\n", #call, tide_strerror(rc_),                  \
              comm ? tide_comm_last_error(comm) : "");                                    \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void) {
  tide_comm_t *comm = NULL;
  CHECK(tide_comm_init(&comm));
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  if (rank == 0)
    printf("tide %s: %d ranks on %d host(s), %d on this host\n\n", TIDE_VERSION_STRING, size,
           tide_comm_node_count(comm), tide_comm_local_size(comm));

  /* allreduce: the sum and the max of every rank's number */
  double mine = rank + 1, sum, max;
  CHECK(tide_allreduce(comm, &mine, &sum, 1, TIDE_F64, TIDE_SUM));
  CHECK(tide_allreduce(comm, &mine, &max, 1, TIDE_F64, TIDE_MAX));
  /* allgather: everyone's rank */
  int *ranks = malloc(sizeof(int) * (size_t)size);
  CHECK(tide_allgather(comm, &rank, ranks, 1, TIDE_I32));
  /* broadcast: rank 0's message reaches everyone */
  char message[32] = "";
  if (rank == 0) snprintf(message, sizeof message, "hello from rank 0");
  CHECK(tide_broadcast(comm, message, sizeof message / 4, TIDE_I32, 0));
  /* reduce-scatter: each rank receives its block of the sum */
  float grad[8], block[8];
  for (int i = 0; i < 8; i++) grad[i] = (float)(i * size);
  CHECK(tide_reduce_scatter(comm, grad, block, 8, TIDE_F32, TIDE_AVG));
  size_t off, len;
  tide_block(8, size, rank, &off, &len);
  int ok = sum == size * (size + 1) / 2.0 && max == size && strcmp(message, "hello from rank 0") == 0 &&
           (len == 0 || block[0] == (float)(off * (size_t)size));
  for (int r = 0; r < size; r++) ok = ok && ranks[r] == r;
  int all_ok;
  CHECK(tide_allreduce(comm, &ok, &all_ok, 1, TIDE_I32, TIDE_MIN));
  if (rank == 0) {
    printf("allreduce sum of 1..%d      = %g\n", size, sum);
    printf("allreduce max               = %g\n", max);
    printf("allgather of ranks          = [");
    for (int r = 0; r < size; r++) printf("%s%d", r ? ", " : "", ranks[r]);
    printf("]\nbroadcast from rank 0       = \"%s\"\n", message);
    printf("reduce_scatter (avg), rank 0's block starts at %zu: %g\n", off, block[0]);
    printf("every rank agrees           = %s\n\n", all_ok ? "yes" : "NO");
    printf("%12s %12s %12s\n", "allreduce", "median", "algbw");
  }
  /* a few sizes, as a training step would use them */
  size_t sizes[] = {4096, 1 << 20, 16 << 20, 64 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t count = sizes[s] / 4;
    float *buf = calloc(count, sizeof *buf);
    double times[21];
    int iters = sizes[s] <= (1 << 20) ? 21 : 7;
    for (int i = 0; i < iters; i++) {
      CHECK(tide_barrier(comm));
      double t0 = now();
      CHECK(tide_allreduce(comm, buf, buf, count, TIDE_F32, TIDE_SUM));
      times[i] = now() - t0;
    }
    for (int i = 1; i < iters; i++) /* insertion sort for the median */
      for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
        double t = times[j];
        times[j] = times[j - 1];
        times[j - 1] = t;
      }
    double median = times[iters / 2];
    if (rank == 0)
      printf("%9zu KiB %9.1f us %8.2f GB/s\n", sizes[s] / 1024, median * 1e6, (double)sizes[s] / median / 1e9);
    free(buf);
  }
  free(ranks);
  tide_comm_destroy(comm);
  return all_ok ? 0 : 1;
}
