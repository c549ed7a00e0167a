/* Sparse vs dense allreduce of one large gradient, run under tiderun or
 * scripts/emulate-cluster.sh: dense (tide's choice: hierarchical across
 * hosts), TopK-AllGather and HiTopKComm at one density, each timed end to
 * end including selection. Rank 0 prints one JSON line per mode.
 *
 *   bench/sparse_bench [ELEMENTS (25500000)] [DENSITY (0.001)] [ITERS (5)] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tide.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define CHECK(call, what)                                                                       \
  do {                                                                                          \
    int rc_ = (call);                                                                           \
    if (rc_ != 0) {                                                                             \
      fprintf(stderr, "sparse_bench: %s: %s %s\n", what, tide_strerror(rc_), tide_comm_last_error(comm)); \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

int main(int argc, char **argv) {
  size_t d = argc > 1 ? (size_t)atof(argv[1]) : 25500000;
  double density = argc > 2 ? atof(argv[2]) : 0.001;
  int iters = argc > 3 ? atoi(argv[3]) : 5;
  if (d < 1 || d >= ((size_t)1 << 32) || !(density > 0 && density <= 1) || iters < 1) {
    fprintf(stderr, "sparse_bench: usage: sparse_bench [ELEMENTS in [1, 2^32)] [DENSITY in (0, 1]] [ITERS >= 1]\n");
    return 2;
  }
  double *times = malloc((size_t)iters * sizeof *times);
  tide_comm_t *comm = NULL;
  CHECK(tide_comm_init(&comm), "init");
  int rank = tide_comm_rank(comm);
  float *grad = malloc(d * sizeof *grad), *out = malloc(d * sizeof *out);
  unsigned state = 12345u + (unsigned)rank;
  for (size_t i = 0; i < d; i++) {
    state = state * 1664525u + 1013904223u;
    grad[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * ((i % 97) == 0 ? 10.0f : 1.0f);
  }
  tide_compressor_t *global, *shard;
  size_t offset, len;
  CHECK(tide_hitopk_shard(comm, d, &offset, &len), "shard");
  CHECK(tide_compressor_create(TIDE_TOPK_SAMPLED, density, TIDE_TOPK_GLOBAL, NULL, 0, d, NULL, &global), "compressor");
  CHECK(tide_compressor_create(TIDE_TOPK_SAMPLED, density, TIDE_TOPK_GLOBAL, NULL, 0, len, NULL, &shard), "compressor");
  size_t k = tide_compressor_k(global);
  float *values = malloc(k * sizeof *values);
  uint32_t *indices = malloc(k * sizeof *indices);
  const char *modes[] = {"dense", "topk_allgather", "hitopk"};
  for (int mode = 0; mode < 3; mode++) {
    for (int it = -1; it < iters; it++) {
      CHECK(tide_barrier(comm), "barrier");
      double t0 = now();
      if (mode == 0) {
        CHECK(tide_allreduce(comm, grad, out, d, TIDE_F32, TIDE_SUM), "dense allreduce");
      } else if (mode == 1) {
        size_t got;
        CHECK(tide_compressor_compress(global, grad, d, values, indices, &got), "top-k");
        CHECK(tide_sparse_allgather(comm, values, indices, got, out, d, TIDE_SUM), "TopK-AllGather");
      } else {
        CHECK(tide_hitopk_allreduce(comm, grad, out, d, shard, TIDE_SUM), "HiTopKComm");
      }
      double t = now() - t0;
      CHECK(tide_allreduce(comm, &t, &t, 1, TIDE_F64, TIDE_MAX), "time");
      if (it >= 0) times[it] = t;
    }
    qsort(times, (size_t)iters, sizeof *times, cmp);
    if (rank == 0)
      printf("{\"op\":\"%s\",\"elements\":%zu,\"density\":%g,\"np\":%d,\"hosts\":%d,\"iters\":%d,\"p50_s\":%.6f}\n",
             modes[mode], d, density, tide_comm_size(comm), tide_comm_node_count(comm), iters, times[iters / 2]);
    fflush(stdout);
  }
  tide_compressor_destroy(global);
  tide_compressor_destroy(shard);
  free(grad);
  free(out);
  free(values);
  free(indices);
  free(times);
  tide_comm_destroy(comm);
  return 0;
}
