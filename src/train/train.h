/* Internal side of the trainer (src/train): the object, and the table of
 * gradient exchanges it picks from. */
#ifndef TIDE_TRAIN_H
#define TIDE_TRAIN_H

#include "core/core.h"
#include "monitor/monitor.h"
#include "policy/policy.h"

/* Slots of the statistics that travel with the gradient (floats after the
 * nparams gradient entries of the exchange buffer), summed over ranks:
 * rank r writes its own compute time at TIMES + r and 0 elsewhere, so the
 * sum hands every rank everyone's. Per-tensor squared norms follow the
 * times when config.tensor_stats is set. */
enum {
  TIDE__SLOT_COUNT = 0,   /* samples */
  TIDE__SLOT_LOSS,        /* loss * samples */
  TIDE__SLOT_SQ_MICRO,    /* sum of |g_i|^2 over full micro-batches */
  TIDE__SLOT_FULL_MICRO,  /* number of full micro-batches */
  TIDE__SLOT_EXCHANGE_S,  /* previous step's exchange time */
  TIDE__SLOT_STEP_S,      /* previous step's wall time */
  TIDE__SLOT_TIMES        /* ranks entries, then ntensors */
};

/* One way of exchanging the step's gradient. run sums tr->exchange over the
 * ranks in place: [0, nparams) the gradient (exactly or compressed with
 * error feedback), then the statistics slots exactly. */
typedef struct {
  const char *name;
  int (*open)(tide_trainer_t *tr, void **state);
  int (*run)(tide_trainer_t *tr, void *state);
  void (*close)(void *state);
  /* The compressor holding this rank's error-feedback residual (NULL for
   * exact exchanges). */
  tide_compressor_t *(*compressor)(void *state);
} tide__exchange_ops_t;

extern const tide__exchange_ops_t tide__exchanges[TIDE_EXCHANGE_COUNT];

typedef struct {
  tide_policy_ops_t ops;
  void *state;
} tide__policy_slot_t;

struct tide_trainer {
  tide_comm_t *comm;
  tide_trainer_config_t config;
  float *params, *grads;
  size_t nparams;
  tide_tensor_t *tensors; /* copies, names included */
  size_t ntensors;
  int rank, ranks, nodes;
  tide_optim_t *optim;
  tide_sampler_t *sampler;

  /* The plan of full steps: ranks x batch x accum samples. */
  int batch, accum;
  /* The data: position in the current epoch's order. */
  uint64_t epoch, position;
  /* The step being accumulated: its global range of positions, this rank's
   * part of it, and the micro-batch handed out last. */
  int in_step;
  uint64_t step_first, step_count;
  uint64_t my_first, my_count;
  int micro, micro_count;
  size_t current_count;
  int micro_handed; /* next gave a micro-batch that step has not taken yet */
  int64_t micro_start_ns;

  /* [gradient sum (nparams) | statistics slots (nslots)]. */
  float *exchange;
  size_t nslots;
  int accumulated; /* the exchange buffer holds this step's sum so far */
  double sq_micro, full_micro, count, loss_sum;
  double *tensor_sq; /* this step's per-tensor sums of |g_i|^2 */
  double compute_s;

  tide_exchange_t exchange_kind;
  void *exchange_state[TIDE_EXCHANGE_COUNT];
  float *pending_residual; /* restored, applied when the exchange opens */
  size_t pending_len;

  tide__gns_t gns;
  tide__gns_t *tensor_gns;
  double prev_exchange_s, prev_step_s;
  int64_t last_step_end_ns;
  double *times, *scratch;

  long step;
  double progress, total_progress;
  tide_step_stats_t stats;

  tide__policy_slot_t *policies;
  size_t npolicies;
  char last_error[512];

  /* Elastic jobs (src/train/elastic.c): NULL until tide_trainer_elastic. */
  struct tide__elastic_trainer *elastic;
};

/* Checks that every rank passed the same dataset_size and base_batch
 * (collective; tide_trainer_create, and again after a membership change). */
int tide__trainer_agree(tide_trainer_t *tr);
/* Plans full steps of about global_batch samples over the current ranks. */
void tide__trainer_replan(tide_trainer_t *tr, long global_batch);

/* ---- elastic jobs (src/train/elastic.c) ----------------------------------- */

/* At a step boundary: acts on the job's requests, waiting workers and
 * stragglers (collective); comm is NULL afterwards when this rank left. */
int tide__trainer_elastic_boundary(tide_trainer_t *tr);
/* A policy asked for world_size workers. */
void tide__trainer_elastic_request(tide_trainer_t *tr, int world_size);
/* Training is over: tells the job's waiting workers (rank 0). */
void tide__trainer_elastic_done(tide_trainer_t *tr);
/* Frees the elastic state and the communicator the trainer owns. */
void tide__trainer_elastic_fini(tide_trainer_t *tr);

/* Records the message of a failure (also logged). */
int tide__trainer_fail(tide_trainer_t *tr, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
