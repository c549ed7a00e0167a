/* One allocation round's time (docs/scheduling.md): JOBS jobs with fitted
 * speedup functions on NODES x SLOTS slots, from the allocation of the
 * greedy allocation (the same for every policy); the median and the longest of ROUNDS rounds, one JSON
 * line per policy. Single-threaded: the time is one core's.
 *
 *   sched_bench [JOBS NODES SLOTS ROUNDS]   (default 30 16 4 5) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tide.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double uniform(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (*s >> 8) / 16777216.0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int jobs = argc > 1 ? atoi(argv[1]) : 30, nodes = argc > 2 ? atoi(argv[2]) : 16;
  int slots = argc > 3 ? atoi(argv[3]) : 4, rounds = argc > 4 ? atoi(argv[4]) : 5;
  if (jobs < 1 || nodes < 1 || slots < 1 || rounds < 1) {
    fprintf(stderr, "usage: sched_bench [JOBS NODES SLOTS ROUNDS]\n");
    return 2;
  }
  tide_sched_job_t *job = calloc((size_t)jobs, sizeof *job);
  tide_speedup_t **sp = calloc((size_t)jobs, sizeof *sp);
  int *per = malloc((size_t)nodes * sizeof *per), *cur = calloc((size_t)jobs * nodes, sizeof *cur);
  int *next = malloc((size_t)jobs * nodes * sizeof *next);
  double *times = malloc((size_t)rounds * sizeof *times);
  if (!job || !sp || !per || !cur || !next || !times) return 1;
  for (int n = 0; n < nodes; n++) per[n] = slots;
  unsigned seed = 12345;
  for (int j = 0; j < jobs; j++) {
    tide_sched_hints_t h = {
        .model = {.alpha_c = 0.01 + 0.1 * uniform(&seed), .beta_c = 0.0002 + 0.002 * uniform(&seed),
                  .alpha_n = 0.05 + 0.3 * uniform(&seed), .beta_n = 0.01 * uniform(&seed),
                  .alpha_r = 0.01 + 0.05 * uniform(&seed), .beta_r = 0.002 * uniform(&seed),
                  .gamma = 1 + 2 * uniform(&seed)},
        .fitted = 1, .grad_sqr = 1, .grad_var = 1 + 100 * uniform(&seed),
        .limits = {.base_batch = 64, .max_batch = 8192, .min_atomic = 16, .max_atomic = 256, .max_passes = 16},
        .max_replicas_seen = 1 + (int)(32 * uniform(&seed))};
    if (tide_speedup_create(&h, &sp[j]) != 0) return 1;
    job[j] = (tide_sched_job_t){.id = (uint64_t)j + 1, .submit_time = 10.0 * j, .requested = 1 + j % 8,
                                .attained = 1000 * uniform(&seed), .resize_cost = 30, .remaining = 1e4,
                                .max_slots = tide_speedup_max_slots(sp[j]), .speedup = tide_speedup_cb,
                                .speedup_arg = sp[j]};
  }
  /* The same inputs for every policy: the greedy allocation of the jobs
   * from nothing is the current one; fitness is Pollux's objective. */
  int *start = malloc((size_t)jobs * nodes * sizeof *start);
  tide_sched_options_t o;
  tide_sched_options_init(&o);
  tide_sched_t *judge;
  double t = 3600;
  if (start == NULL || tide_sched_create(&o, nodes, per, &judge) != 0) return 1;
  o.policy = TIDE_SCHED_GREEDY;
  tide_sched_t *g;
  if (tide_sched_create(&o, nodes, per, &g) != 0 || tide_sched_allocate(g, t - 60, job, jobs, cur, start) != 0)
    return 1;
  tide_sched_destroy(g);
  for (int policy = TIDE_SCHED_POLLUX; policy <= TIDE_SCHED_OPTIMUS; policy++) {
    o.policy = (tide_sched_policy_t)policy;
    tide_sched_t *s;
    if (tide_sched_create(&o, nodes, per, &s) != 0) return 1;
    for (int r = 0; r < rounds; r++) {
      double t0 = now_s();
      if (tide_sched_allocate(s, t, job, jobs, start, next) != 0) return 1;
      times[r] = now_s() - t0;
    }
    int used = 0;
    for (int k = 0; k < jobs * nodes; k++) used += next[k];
    double fit = tide_sched_fitness(judge, t, job, jobs, start, next);
    qsort(times, (size_t)rounds, sizeof *times, cmp);
    printf("{\"policy\": \"%s\", \"jobs\": %d, \"nodes\": %d, \"slots_per_node\": %d, \"rounds\": %d, "
           "\"median_s\": %.4f, \"max_s\": %.4f, \"slots_used\": %d, \"fitness\": %.5f}\n",
           tide_sched_policy_name(o.policy), jobs, nodes, slots, rounds, times[rounds / 2], times[rounds - 1], used,
           fit);
    fflush(stdout);
    tide_sched_destroy(s);
  }
  tide_sched_destroy(judge);
  free(start);
  for (int j = 0; j < jobs; j++) tide_speedup_destroy(sp[j]);
  free(job), free(sp), free(per), free(cur), free(next), free(times);
  return 0;
}
