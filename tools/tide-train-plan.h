/* tide-train --plan: burst-parallel training (nn_burst_*, docs/burst-parallel.md).
 * Kept apart from tide-train.c, whose trainer owns data-parallel steps. */
#ifndef TIDE_TRAIN_PLAN_H
#define TIDE_TRAIN_PLAN_H

#include "tide_nn.h"
#include "tide.h"

typedef struct {
  const char *plan;      /* --plan FILE */
  const char *model, *optim;
  int batch, epochs, subset;
  double lr, momentum, weight_decay; /* momentum < 0: the optimizer's default */
  uint64_t seed;
  /* options a plan cannot run with: named in the refusal when set */
  const char *conflict;
} train_plan_args_t;

/* Trains under the plan on comm with Fashion-MNIST's train and test sets
 * (train may be NULL when the data comes through the loader: refused):
 * global batch = batch x ranks, constant learning rate, epochs over subset
 * (0: all) images. Rank 0 prints the median step time and the test
 * accuracy. Returns the process's exit status. */
int train_plan(tide_comm_t *comm, const train_plan_args_t *a, const nn_dataset_t *train, const nn_dataset_t *test);
/* Seconds on the monotonic clock (tide-train.c). */
double now_s(void);

#endif
