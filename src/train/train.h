/* Internal side of the trainer (src/train): the object, and the table of
 * gradient exchanges it picks from. */
#ifndef TIDE_TRAIN_H
#define TIDE_TRAIN_H

#include "core/core.h"
#include "monitor/step.h"
#include "policy/policy.h"

/* What a row's average hands the update: the mean gradient of this rank's
 * part (the whole gradient; [shard_offset, shard_offset + shard_len) under
 * PTO) and the squared norm of the mean over all ranks (per tensor into
 * monitor.tensor_sq under config.tensor_stats). own: the gradient is this
 * rank's own mean (a row that combines the ranks' updates): no |G|^2.
 * whole: the whole averaged gradient (nparams floats, grad inside it), which
 * the precondition stage changes in place; NULL when the row averaged only
 * this rank's shard. */
typedef struct {
  const float *grad;
  double sq;
  int own;
  float *whole;
} tide__mean_t;

/* What the update reports: seconds of communication inside it (counted as
 * exchange time) and of the K-FAC stage. */
typedef struct {
  double comm_s, kfac_s;
} tide__update_t;

/* The K-FAC stage's state (src/train/kfac.c): tr->kfac, NULL while K-FAC is
 * off. */
typedef struct tide__kfac tide__kfac_t;

/* One row of the exchange table owns the whole exchange of a step:
 *   open     its state, once, when the row first runs (collective);
 *   reduce   sums tr->exchange's statistics slots over the ranks, exactly,
 *            and the gradient (or its part) exactly or compressed with
 *            error feedback;
 *   average  divides the sum by the samples (total over the ranks) and
 *            fills the mean (|G|^2 included, reduced over ranks if needed);
 *   precondition  the stage between the average and the update, with its
 *            own state (the K-FAC stage, tide__kfac_stage, and tr->kfac;
 *            the step runs it while that state is on): changes mean->whole
 *            in place and adds its seconds to out->kfac_s. NULL for a row
 *            whose mean is not the averaged gradient of the whole model
 *            (adasum: each rank's own; pto: one shard): K-FAC refuses the
 *            first and takes the exchange's own row instead of the second;
 *   update   applies it: tide__exchange_update (the optimizer, PTO's
 *            all-gather) or the row's own around it;
 *   close    frees the state (NULL accepted).
 * compressor: the one holding this rank's error-feedback residual (NULL
 * for exact rows). */
typedef struct {
  const char *name;
  int (*open)(tide_trainer_t *tr, void **state);
  int (*reduce)(tide_trainer_t *tr, void *state);
  int (*average)(tide_trainer_t *tr, void *state, double total, tide__mean_t *mean);
  int (*precondition)(tide_trainer_t *tr, tide__kfac_t *stage, const tide__mean_t *mean, float lr,
                      tide__update_t *out);
  int (*update)(tide_trainer_t *tr, void *state, const tide__mean_t *mean, float lr, tide__update_t *out);
  void (*close)(void *state);
  tide_compressor_t *(*compressor)(void *state);
} tide__exchange_ops_t;

/* The rows: one per tide_exchange_t, then PTO's reduce-scatter (the dense
 * exchange under PTO without K-FAC, src/train/pto.c). */
enum { TIDE__EXCHANGE_PTO = TIDE_EXCHANGE_COUNT, TIDE__EXCHANGE_ROWS };
extern const tide__exchange_ops_t tide__exchanges[TIDE__EXCHANGE_ROWS];
/* PTO's row (pto.c): the statistics allreduce and the gradient
 * reduce-scatter into its own shard buffer; the average of the shard. */
int tide__pto_open(tide_trainer_t *tr, void **state);
int tide__pto_reduce(tide_trainer_t *tr, void *state);
int tide__pto_average(tide_trainer_t *tr, void *state, double total, tide__mean_t *mean);
void tide__pto_row_close(void *state);

/* The row this step runs (pto.c). */
int tide__exchange_row(const tide_trainer_t *tr);
/* The default update: the optimizer steps this rank's part (its one call
 * in the trainer), then under PTO the parameters are all-gathered. */
int tide__exchange_update(tide_trainer_t *tr, void *state, const tide__mean_t *mean, float lr, tide__update_t *out);
/* Divides the whole gradient sum by its samples (inv = 1 / samples) into
 * the mean (whole: the exchange buffer). */
void tide__exchange_average(tide_trainer_t *tr, float inv, tide__mean_t *mean);
/* Closes every row's state (they reopen at the next step). */
void tide__exchange_close_all(tide_trainer_t *tr);

typedef struct {
  tide_policy_ops_t ops;
  void *state;
} tide__policy_slot_t;

/* The K-FAC stage (src/train/kfac.c): its state k (tr->kfac) is made by
 * tide_trainer_kfac and freed here (NULL accepted). */
void tide__kfac_destroy(tide__kfac_t *k);
/* At the end of each micro-batch: counts the factors it added to; at a
 * factor step's last, starts the factor allreduce's buckets not yet
 * started (before the gradient exchange, on every rank). */
void tide__kfac_micro_end(tide_trainer_t *tr, tide__kfac_t *k);
/* A step left before its K-FAC stage: waits for its factor allreduce
 * requests and drops its factor sums (NULL accepted). */
void tide__kfac_abandon(tide__kfac_t *k);
/* The rows' precondition stage: factors, eigendecompositions,
 * preconditioning of mean->whole in place, sharing. Collective.
 * out->kfac_s gets the stage's time plus this step's tide_trainer_kfac_add
 * time. */
int tide__kfac_stage(tide_trainer_t *tr, tide__kfac_t *k, const tide__mean_t *mean, float lr, tide__update_t *out);
/* Its part of the trainer state: factors and decompositions (floats; 0
 * without K-FAC). get gathers the decompositions from their owners
 * (collective when they are spread over the ranks); check returns why a
 * state's part does not fit (NULL: it does; 0 floats always fits and
 * leaves the factors as they are); set takes it. */
size_t tide__kfac_state_floats(const tide__kfac_t *k);
int tide__kfac_state_get(const tide_trainer_t *tr, void *out);
const char *tide__kfac_state_check(const tide__kfac_t *k, const void *in, size_t floats);
void tide__kfac_state_set(tide__kfac_t *k, const void *in, size_t floats);
/* Tests of config.rebalance: the seconds a step each preconditioned layer
 * (in order) costs, reported by its owner at the shares instead of its
 * clock (NULL: the clock; borrowed); and the layer's owner (-1: none). */
void tide__kfac_fake_costs(tide__kfac_t *k, const double *seconds);
int tide__kfac_owner(const tide__kfac_t *k, size_t layer);

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

  /* [gradient sum (nparams) | statistics slots (monitor.nslots)], on a
   * 64-byte boundary inside exchange_mem (the passes over it are 8 floats
   * wide: a misaligned buffer splits every other store across two cache
   * lines, about 20% of a pass). */
  float *exchange;
  void *exchange_mem;
  int accumulated; /* the exchange buffer holds this step's sum so far */
  double data_s; /* this step's wait for data (tide_trainer_data_wait) */
  tide__step_monitor_t monitor; /* the step's statistics (src/monitor/step.c) */

  tide_exchange_t exchange_kind;
  void *exchange_state[TIDE__EXCHANGE_ROWS];
  float *pending_residual; /* restored, applied when the exchange opens */
  size_t pending_len;

  int64_t last_step_end_ns;

  long step;
  double progress, total_progress;
  tide_step_stats_t stats;

  tide__policy_slot_t *policies;
  size_t npolicies;
  char last_error[512];

  /* PTO (src/train/pto.c): config.pto on more than one rank. This rank
   * updates [shard_offset, shard_offset + shard_len) and keeps optimizer
   * state for it alone; shard_counts[r] is rank r's length (the shards are
   * contiguous, in rank order). block_len: this rank's block of the dense
   * exchange's reduce-scatter (the shard, then statistics slots on the
   * last ranks). */
  int pto;
  size_t shard_offset, shard_len, block_len;
  size_t *shard_counts;

  tide__kfac_t *kfac; /* NULL: no K-FAC */
  /* Elastic jobs (src/train/elastic.c): NULL until tide_trainer_elastic. */
  struct tide__elastic_trainer *elastic;
  /* Multiplexing (src/train/multiplex.c): NULL unless TIDE_FOREGROUND or
   * TIDE_HOSTS_BACKGROUND. */
  struct tide__multiplex *multiplex;
};

/* PTO (src/train/pto.c). Whether PTO runs under this exchange; creates
 * tr->optim (a shard under PTO, needs monitor.nslots); frees the shard plan. */
int tide__pto_supports(int exchange);
int tide__pto_optim_create(tide_trainer_t *tr, const tide_tensor_t *tensors, size_t ntensors);
void tide__pto_close(tide_trainer_t *tr);
/* After a membership change: the shards of the new member count (the state
 * is restored into them after). */
int tide__pto_reshard(tide_trainer_t *tr);
/* Under PTO, after the optimizer stepped this rank's shard: the parameter
 * all-gather, whose seconds are added to *seconds. */
int tide__pto_gather_params(tide_trainer_t *tr, double *seconds);
/* tide_trainer_state_get under PTO: gathers every rank's slices of the
 * optimizer state into optim_blob (collective). */
int tide__pto_gather_state(const tide_trainer_t *tr, void *optim_blob);

/* Checks that every rank passed the same dataset_size and base_batch
 * (collective; tide_trainer_create, and again after a membership change). */
int tide__trainer_agree(tide_trainer_t *tr);
/* comm's rank, size and node count into the trainer, and what is sized by
 * them (the monitor's per-rank slots, the exchange buffer): at create and
 * after each membership change. */
int tide__trainer_bind(tide_trainer_t *tr, tide_comm_t *comm);
/* A half-done step dropped (a membership change): its exchanges closed. */
void tide__trainer_abandon_step(tide_trainer_t *tr);
/* The error-feedback residual a restored state left for the next step, dropped. */
void tide__trainer_drop_residual(tide_trainer_t *tr);
/* Plans full steps of about global_batch samples over the current ranks. */
void tide__trainer_replan(tide_trainer_t *tr, long global_batch);
/* ranks x batch x accum: the samples of a full step under the current plan. */
long tide__trainer_planned_batch(const tide_trainer_t *tr);

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

/* ---- multiplexing (src/train/multiplex.c) --------------------------------- */

/* At creation: a foreground's publisher (TIDE_HOSTS_BACKGROUND, rank 0) or
 * a background's guard (TIDE_FOREGROUND); nothing otherwise. Not
 * collective (a guard that cannot reach the foreground logs why and lets
 * the job run unguarded). */
int tide__multiplex_open(tide_trainer_t *tr);
/* Background, before a step's exchange: rank 0's guard's vote (1: pause at
 * the next boundary), which travels in TIDE__SLOT_GUARD; 0 elsewhere. */
float tide__multiplex_vote(tide_trainer_t *tr);
/* After the exchange: the vote every rank received. */
void tide__multiplex_voted(tide_trainer_t *tr, float vote);
/* Background, at a step boundary: when the last exchange voted to pause
 * (and before the first step), waits while the guard on rank 0 says pause
 * (collective then: rank 0 broadcasts each decision). */
int tide__multiplex_boundary(tide_trainer_t *tr);
/* After each step: a foreground publishes its step times (rank 0); both
 * write their figures into tr->stats. */
void tide__multiplex_step_end(tide_trainer_t *tr);
/* A foreground says it is done; a running background leaves the count. */
void tide__multiplex_close(tide_trainer_t *tr);

/* Records the message of a failure (also logged). */
int tide__trainer_fail(tide_trainer_t *tr, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
