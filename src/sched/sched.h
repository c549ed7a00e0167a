/* Internal side of the cluster scheduler: the applications of the Pollux
 * paper's traces (trace.c) as the simulator (sim.c) reads them. */
#ifndef TIDE_SCHED_H
#define TIDE_SCHED_H

#include "core/core.h"

/* Step and sync seconds of one per-worker batch on one placement. */
typedef struct {
  double local, step, sync;
} tide__sim_point_t;

/* A run of points (sorted by local batch) for one placement string or one
 * (nodes, replicas) pair. */
typedef struct {
  char key[16];  /* placement digits, ascending; "" for a (nodes, replicas) group */
  int nodes, replicas;
  tide__sim_point_t *points;
  int npoints;
} tide__sim_curve_t;

/* One validation file: per epoch, progress and the noise statistics. */
typedef struct {
  double batch;
  double *progress, *grad_sqr, *grad_var;
  int epochs;
} tide__sim_validation_t;

typedef struct {
  char name[32];
  tide__sim_curve_t *exact;  /* from placements.csv, by placement */
  int nexact;
  tide__sim_curve_t *groups; /* placements averaged + scalability.csv, by (nodes, replicas) */
  int ngroups;
  tide__sim_validation_t *validation; /* by batch, ascending */
  int nvalidation;
  int max_epochs;
  double init_batch, max_batch, min_local, max_local;
  /* As the paper's simulator: ncf runs on one worker at its largest batch
   * under the elastic policies. */
  int single_worker;
} tide__sim_app_t;

/* Reads dir/name/{placements,scalability,validation-*}.csv. TIDE_ENOENT
 * names a missing file, TIDE_EINVAL file:line of a bad line. */
int tide__sim_app_load(const char *dir, const char *name, tide__sim_app_t *app);
void tide__sim_app_fini(tide__sim_app_t *app);

/* Step and sync seconds of `local` samples per worker with counts[0..n)
 * workers on n nodes. */
void tide__sim_app_time(const tide__sim_app_t *app, const int *counts, int n, double local, double *step,
                        double *sync);
/* |G|^2 and the variance at batch `batch` during epoch `epoch`
 * (interpolated between the measured batches). */
void tide__sim_app_grad(const tide__sim_app_t *app, double batch, int epoch, double *sqr, double *var);
/* Progress made at the end of epoch `epoch` (1-based; 0: 0). */
double tide__sim_app_progress(const tide__sim_app_t *app, int epoch);

/* One allocation round of a simulation: its cells in the result. */
typedef struct {
  double time;
  int first, count;
} tide__sim_round_t;

/* A simulation's outcome (sim.c fills it, output.c writes it). */
struct tide_sim_result {
  char policy[16], workload[1024];
  tide_sim_job_t *jobs;
  int njobs;
  double round_mean, round_max, makespan;
  tide__sim_round_t *rounds;
  int nrounds, rounds_cap;
  int (*cells)[3]; /* job, node, slots */
  size_t ncells, cells_cap;
};

#endif
