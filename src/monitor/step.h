/* The trainer's statistics of one step and across steps: what each rank
 * measures while it accumulates (samples, loss, micro-batch norms, compute
 * time), the slots that carry it through the exchange, and what is made of
 * their sum (noise scale, gain ratio, the ranks' compute-time spread, the
 * communication share). Pure computation: the trainer sums the slots over
 * the ranks. Called by the trainer's thread only. */
#ifndef TIDE_MONITOR_STEP_H
#define TIDE_MONITOR_STEP_H

#include "monitor/monitor.h"

/* Slots of the statistics that travel with the gradient (floats after the
 * nparams gradient entries of the exchange buffer), summed over ranks:
 * rank r writes its own compute time at TIMES + r and 0 elsewhere, so the
 * sum hands every rank everyone's. Per-tensor squared norms follow the
 * times when tensor statistics are on. */
enum {
  TIDE__SLOT_COUNT = 0,   /* samples */
  TIDE__SLOT_LOSS,        /* loss * samples */
  TIDE__SLOT_SQ_MICRO,    /* sum of |g_i|^2 over full micro-batches */
  TIDE__SLOT_FULL_MICRO,  /* number of full micro-batches */
  TIDE__SLOT_EXCHANGE_S,  /* previous step's exchange time */
  TIDE__SLOT_STEP_S,      /* previous step's wall time */
  TIDE__SLOT_GUARD,       /* a background job's rank 0: 1 to pause at the next boundary */
  TIDE__SLOT_TIMES        /* ranks entries, then ntensors */
};

typedef struct {
  int ranks, tensor_stats;
  size_t ntensors;
  size_t nslots; /* the slots' floats for this many ranks and tensors */
  /* The step being accumulated, on this rank. */
  double sq_micro, full_micro, count, loss_sum, compute_s;
  double *tensor_sq; /* per-tensor sums of |g_i|^2 (full micro-batches); |G|^2 after the average */
  /* Across steps. */
  tide__gns_t gns, *tensor_gns;
  double prev_exchange_s, prev_step_s;
  double *times, *scratch; /* the last step's compute time of each rank */
} tide__step_monitor_t;

/* init: a monitor for ranks ranks and ntensors (>= 1) tensors; fini frees
 * it (a zeroed monitor too). resize: for a new rank count (the averages
 * stay). Both return 0 or TIDE_ENOMEM. */
int tide__step_monitor_init(tide__step_monitor_t *m, int ranks, size_t ntensors, int tensor_stats);
int tide__step_monitor_resize(tide__step_monitor_t *m, int ranks);
void tide__step_monitor_fini(tide__step_monitor_t *m);
/* A new step: this rank's sums back to 0. */
void tide__step_monitor_begin(tide__step_monitor_t *m);
/* A micro-batch of count samples with loss and |g|^2 = sq (full: of the
 * planned micro-batch size; its per-tensor squares went to tensor_sq). */
void tide__step_monitor_micro(tide__step_monitor_t *m, double count, double loss, double sq, int full);
/* Writes this rank's slots (nslots floats) before the exchange. */
void tide__step_monitor_pack(const tide__step_monitor_t *m, float *slots, int rank, float guard);

/* What the monitor needs of the step to read the summed slots. */
typedef struct {
  double sq_big;     /* |G|^2 of the averaged gradient (its tensors' in tensor_sq) */
  int combined;      /* the exchange combined updates: no |G_big|^2, no noise-scale update */
  int batch, accum;  /* the plan: micro-batch size and micro-batches per rank */
  double base_batch, gns_decay;
} tide__step_read_t;

/* After the exchange: the noise-scale averages, the ranks' compute times
 * and the step's statistics into s (global_batch, loss, scale, grad_sq,
 * trace_sigma, noise_scale, gain_ratio, the compute spread, comm_share,
 * mean_step_s, compute_s). */
void tide__step_monitor_read(tide__step_monitor_t *m, const float *slots, const tide__step_read_t *in,
                             tide_step_stats_t *s);
/* After the update: the step's exchange and wall time, sent with the next. */
void tide__step_monitor_end(tide__step_monitor_t *m, double exchange_s, double step_s);

/* Resource Elasticity's straggler averages: ewma[r] moves by alpha towards
 * median / times[r] (1 for a rank with no time); returns the rank other
 * than 0 with the lowest average below threshold, or -1. */
int tide__straggler_update(double *ewma, const double *times, int ranks, double median, double alpha,
                           double threshold);

#endif
