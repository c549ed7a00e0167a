/* Internal to the trainer's K-FAC stage (src/train/kfac*.c): its layers and
 * state, and what its files share. kfac.c collects the factors and runs the
 * stage; kfac_state.c is its part of the trainer's state (checkpoints);
 * kfac_owners.c assigns the layers to their owners, by formula and by
 * measured cost. The arithmetic is src/optim/kfac.c. */
#ifndef TIDE_TRAIN_KFAC_H
#define TIDE_TRAIN_KFAC_H

#include <pthread.h>

#include "optim/kfac.h"
#include "train/train.h"

#define KFAC_STAGES 7

typedef struct {
  tide_kfac_layer_t desc;
  size_t w_off, b_off; /* into the flat gradient */
  int dim_a, dim_g;
  int diag;            /* A is kept as its diagonal (config.diag_dim): a, sum[A] and d[A] hold dim_a floats, no q[A] */
  int rank[2];         /* eigenvectors in use of A, G: the dimension, or config.lowrank for a factor
                          wider than config.lowrank_dim (q[f]'s first rank rows; d[f][rank..] the
                          others' mean); a diagonal A's layer keeps G whole */
  int owner;           /* the rank that decomposes and preconditions (distribute = 1) */
  float *a, *g;        /* running averages */
  float *sum[2];       /* this step's sums over micro-batches (upper triangles) */
  int added[2];        /* this micro-batch added to A / G */
  int micros[2];       /* micro-batches of this step that added */
  size_t pk;           /* where its packed A, then G, sit in the factor allreduce's pack */
  size_t bucket;       /* its bucket of the pack (config.bucket_kb) */
  int late;            /* added to after its bucket's allreduce started (this step) */
  float *q[2], *d[2];  /* eigenvectors (rows) and eigenvalues; NULL where not ours */
  int decomposed;
  /* Spread: a layer too big for one rank (see spread_layers) is
   * preconditioned by every rank, rows [row0, row1) of its W here; its
   * owner decomposes and broadcasts, and pw holds the whole W, then P. */
  int spread, row0, row1;
  float *pw;
  /* Background decompositions (config.staleness > 0): at an inverse step
   * the owner copies the factors into qn (d_A into dn for a diagonal A) and
   * its job decomposes them there; staleness steps later they are swapped
   * with q, d. pending: in that job (on every rank for a spread layer, whose
   * owner broadcasts at the swap); qn, dn only where ours. */
  float *qn[2], *dn[2];
  int pending;
  /* Owners by measured cost (config.rebalance): this rank's seconds on the
   * layer since the last share (decompositions; preconditioning over
   * precond_n steps), and the all-reduced seconds a step it was last
   * assigned by (-1: never measured). */
  double decomp_s, precond_s, cost_s;
  long precond_n;
} layer_t;

struct tide__kfac {
  tide_kfac_config_t config;
  size_t nlayers;
  layer_t *layers;   /* the preconditioned layers (those within config.max_dim) */
  size_t ncaller;    /* the caller's layers: descs[ncaller], and their index in */
  tide_kfac_layer_t *descs;
  long *index;       /* layers, or -1 for one skipped by max_dim */
  float *rows;       /* config.sample < 1: the sampled rows of one tide_trainer_kfac_add */
  size_t rows_cap;
  int rank, ranks;
  /* The factor allreduce: the pack holds the buckets in the order they
   * start (the last layers first; layer order within one), then 2 *
   * nlayers counts and, with more than one bucket, nlayers late flags.
   * The last bucket (layer 0's), the counts and flags are all-reduced in
   * the step; the others start during the backward pass (start_bucket),
   * each its own nonblocking request, waited for in the step. */
  float *pack;
  size_t pack_len, count_off;
  size_t nbuckets, started; /* buckets [0, started) are in flight this step */
  size_t *bucket_off;       /* bucket b: pack[bucket_off[b], bucket_off[b + 1]) */
  size_t *bucket_lo;        /* bucket b: layers[bucket_lo[b], bucket_hi(b)) */
  tide_request_t **reqs;    /* of the started buckets; NULL where the start failed */
  int start_rc;             /* the first failed start this step */
  long started_step;        /* the step they were started in */
  double start_s;           /* this step's time starting buckets (packing, submitting) */
  long early, buckets;      /* the profile: buckets started inside tide_trainer_kfac_add, of all started */
  float *m, *p, *work; /* one layer's gradient, result and product scratch */
  float *send, *recv;  /* allgatherv of [P_l, dot_l] per layer, owners in rank order */
  size_t *counts;
  double *dots;
  size_t *at;        /* where each layer's result starts in recv (not spread ones) */
  double add_s;      /* this step's time in tide_trainer_kfac_add */
  /* The stage profile (docs/adaptation.md, "K-FAC's step, stage by
   * stage"): seconds per stage summed over the run, logged at the end. */
  double prof[KFAC_STAGES];
  long prof_steps, prof_factor_steps, prof_inverse_steps;
  /* The background job: one thread per inverse step, decomposing this
   * rank's pending layers; joined at the swap (or by state_get and
   * destroy). job_rc and job_s are the job's, read after the join.
   * swap_step: the step that swaps the pending decompositions in; -1 after
   * a restore, derived from the step at the next stage. */
  pthread_t job;
  int job_started, job_rc;
  long swap_step, jobs;
  double job_s, wait_s;
  const double *fake_s; /* tests: the seconds the owners report instead (tide__kfac_fake_costs) */
};

/* Steps between an inverse step and the swap: config.staleness, at most
 * inverse_every (one job at a time). */
static inline long stale(const tide__kfac_t *k) {
  return k->config.staleness < k->config.inverse_every ? k->config.staleness : k->config.inverse_every;
}

static inline int mine(const tide__kfac_t *k, const layer_t *l) { return !k->config.distribute || l->owner == k->rank; }

static inline size_t layer_floats(const layer_t *l) { return (size_t)l->dim_g * l->dim_a; }

/* Floats of A as stored (its diagonal, or the whole matrix) and packed for the allreduce. */
static inline size_t a_floats(const layer_t *l) { return l->diag ? (size_t)l->dim_a : (size_t)l->dim_a * l->dim_a; }
static inline size_t a_packed(const layer_t *l) { return l->diag ? (size_t)l->dim_a : tide__kfac_packed(l->dim_a); }
/* Floats of A's eigenvectors in use (none for a diagonal A). */
static inline size_t qa_floats(const layer_t *l) { return l->diag ? 0 : (size_t)l->rank[TIDE_KFAC_A] * l->dim_a; }
static inline size_t qg_floats(const layer_t *l) { return (size_t)l->rank[TIDE_KFAC_G] * l->dim_g; }
static inline int low_rank(const layer_t *l) {
  return l->rank[TIDE_KFAC_A] < l->dim_a || l->rank[TIDE_KFAC_G] < l->dim_g;
}

/* One decomposition of a layer in the state: a 0/1 flag, Q_A, d_A, Q_G, d_G. */
static inline size_t eigen_floats(const layer_t *l) {
  return 1 + qa_floats(l) + (size_t)l->dim_a + qg_floats(l) + (size_t)l->dim_g;
}

/* The decompositions a layer's state holds: in use, and pending. */
static inline size_t sections(const tide__kfac_t *k) { return k->config.staleness > 0 ? 2 : 1; }

/* kfac.c: waits for the background decompositions, if they run; their result. */
int tide__kfac_finish_job(tide__kfac_t *k);

/* kfac_state.c: the layer's decompositions (sections of them) from its
 * owner into out, eigen_floats(l) floats each; and one back from p (after
 * its flag) into q, d, returning where it ends. */
void tide__kfac_eigen_pack(const tide__kfac_t *k, const layer_t *l, float *out);
const char *tide__kfac_eigen_unpack(const layer_t *l, float *const *q, float *const *d, const char *p);

/* kfac_owners.c: what rank r sends in the allgather; the owners at
 * creation, by the cost formula; and at an inverse step, by measured cost. */
size_t tide__kfac_rank_floats(const tide__kfac_t *k, int r);
int tide__kfac_assign(tide__kfac_t *k);
int tide__kfac_rebalance(tide_trainer_t *tr, tide__kfac_t *k);

#endif
