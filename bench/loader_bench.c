/* The data loader's throughput: every rank pulls its share of each step
 * (tide_loader_next) and turns the pixels into normalised floats, as a
 * training loop would, for --epochs epochs; rank 0 prints one JSON line per
 * epoch: images delivered over all ranks per second, the time spent waiting
 * for the prefetch threads, bytes read from the source, decoded bytes held
 * by this host's store. bench/loader_vs_torch.sh runs it beside torch's
 * DataLoader; docs/data.md has results. Run under tiderun. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tide.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  tide_loader_config_t cfg;
  tide_loader_config_default(&cfg);
  int epochs = 3;
  double compute_ms = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "loader_bench: %s needs a value\n", a);
      return 2;
    }
    if (strcmp(a, "--data") == 0) cfg.source = v;
    else if (strcmp(a, "--cache-dir") == 0) cfg.cache_dir = v;
    else if (strcmp(a, "--batch") == 0) cfg.batch = atoi(v);
    else if (strcmp(a, "--threads") == 0) cfg.threads = atoi(v);
    else if (strcmp(a, "--prefetch") == 0) cfg.prefetch = atoi(v);
    else if (strcmp(a, "--epochs") == 0) epochs = atoi(v);
    else if (strcmp(a, "--compute-ms") == 0) compute_ms = atof(v);
    else {
      fprintf(stderr, "usage: tiderun -np N loader_bench --data SRC [--batch B] [--threads T] [--prefetch P] "
                      "[--epochs E] [--cache-dir D] [--compute-ms MS per step]\n");
      return 2;
    }
    i++;
  }
  tide_comm_t *comm;
  if (tide_comm_init(&comm) != 0) return 1;
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  tide_loader_t *l;
  int rc = tide_loader_open(comm, &cfg, &l);
  if (rc != 0) {
    fprintf(stderr, "loader_bench: cannot open %s: %s\n", cfg.source, tide_strerror(rc));
    tide_comm_destroy(comm);
    return 1;
  }
  uint64_t n = tide_loader_size(l), per_step = (uint64_t)cfg.batch * (uint64_t)size;
  uint64_t steps = (n + per_step - 1) / per_step;
  int h, w, c;
  tide_loader_shape(l, &h, &w, &c);
  float *x = malloc((size_t)cfg.batch * (size_t)(h * w * c) * sizeof *x);
  double checksum = 0;
  tide_loader_stats_t before, after;
  for (int e = 0; e < epochs && rc == 0; e++) {
    tide_loader_stats(l, &before);
    tide_barrier(comm);
    double t0 = now(), images = 0;
    for (uint64_t s = 0; s < steps && rc == 0; s++) {
      tide_loader_batch_t b;
      if ((rc = tide_loader_next(l, &b)) != 0) break;
      size_t total = b.count * b.sample_bytes;
      for (size_t k = 0; k < total; k++) x[k] = (float)b.pixels[k] * (1.0f / 255.0f);
      if (total > 0) checksum += x[total - 1];
      images += (double)b.count;
      if (compute_ms > 0) {
        struct timespec ts = {(time_t)(compute_ms / 1000), (long)(compute_ms * 1e6) % 1000000000L};
        nanosleep(&ts, NULL);
      }
    }
    if (rc != 0) break;
    tide_barrier(comm);
    double t = now() - t0;
    tide_loader_stats(l, &after);
    double sums[3] = {images, (double)(after.source_bytes - before.source_bytes), after.wait_s - before.wait_s};
    tide_allreduce(comm, sums, sums, 3, TIDE_F64, TIDE_SUM);
    if (rank == 0)
      printf("{\"lib\":\"tide\",\"epoch\":%d,\"np\":%d,\"images\":%.0f,\"seconds\":%.4f,\"images_per_s\":%.1f,"
             "\"source_bytes\":%.0f,\"source_MBps\":%.3f,\"wait_s_per_rank\":%.4f,\"store_bytes\":%llu,"
             "\"window_bytes\":%llu}\n",
             e + 1, size, sums[0], t, sums[0] / t, sums[1], sums[1] / t / 1e6, sums[2] / size,
             (unsigned long long)after.store_bytes, (unsigned long long)after.window_bytes);
    fflush(stdout);
  }
  if (rc != 0) fprintf(stderr, "loader_bench: %s\n", tide_strerror(rc));
  if (checksum < 0) printf("impossible\n");
  free(x);
  tide_loader_close(l);
  tide_comm_destroy(comm);
  return rc != 0;
}
