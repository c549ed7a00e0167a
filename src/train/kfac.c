/* The trainer's K-FAC stage (tide.h, "K-FAC gradient preconditioning";
 * docs/algorithms.md): collects the caller's factor contributions during a
 * step, and between the gradient exchange and the optimizer all-reduces the
 * factors, refreshes the eigendecompositions, preconditions the averaged
 * gradient and shares the result (KAISA's layer-wise distribution, or every
 * rank doing every layer). Its state and its owners' assignment are
 * kfac_state.c and kfac_owners.c (train/kfac.h); the arithmetic is
 * src/optim/kfac.c. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/kfac.h"

enum { STATS, ALLREDUCE, BLEND, EIGEN, PRECOND, ALLGATHER, APPLY };
static const char *const stage_name[KFAC_STAGES] = {"factor statistics", "factor allreduce", "pack and blend",
                                                    "eigendecompositions", "preconditioning",
                                                    "allgather of the results", "kl-clip and scatter"};

/* Adds the time since *t to stage s of the profile and restarts *t. */
static void lap(tide__kfac_t *k, int s, int64_t *t) {
  int64_t now = tide__now_ns();
  k->prof[s] += (double)(now - *t) * 1e-9;
  *t = now;
}

/* Factor f's decomposition into q, d: whole (ssyevd) or its top
 * l->rank[f] eigenpairs; m (the factor) may be q. */
static int decompose(const layer_t *l, int f, const float *m, float *q, float *d) {
  int dim = f == TIDE_KFAC_A ? l->dim_a : l->dim_g;
  if (l->rank[f] < dim) return tide__kfac_eigen_top(m, dim, l->rank[f], q, d);
  return m == q ? tide__kfac_eigen_inplace(q, dim, d) : tide__kfac_eigen(m, dim, q, d);
}

void tide_kfac_config_default(tide_kfac_config_t *out) {
  if (out == NULL) return;
  *out = (tide_kfac_config_t){.factor_every = 10, .inverse_every = 50, .damping = 0.001f, .factor_decay = 0.95f,
                              .kl_clip = 0.001f, .distribute = 1, .sample = 0.25f, .max_dim = 0,
                              .staleness = 0, .lowrank = 64, .lowrank_dim = 200, .bucket_kb = 0,
                              .rebalance = 1};
}

/* The first field of c out of range, and why; NULL when all are fine. */
static const char *config_problem(const tide_kfac_config_t *c, const char **why) {
  if (c->factor_every < 1) return *why = "must be >= 1", "factor_every";
  if (c->inverse_every < 1 || c->inverse_every % c->factor_every != 0)
    return *why = "must be >= 1 and a multiple of factor_every", "inverse_every";
  if (!(c->damping > 0 && isfinite(c->damping))) return *why = "must be finite and > 0", "damping";
  if (!(c->factor_decay >= 0 && c->factor_decay < 1)) return *why = "must be in [0, 1)", "factor_decay";
  if (!(c->kl_clip >= 0 && isfinite(c->kl_clip)))
    return *why = "must be finite and >= 0 (0 turns clipping off)", "kl_clip";
  if (c->distribute != 0 && c->distribute != 1) return *why = "must be 0 or 1", "distribute";
  if (c->spread != 0 && c->spread != 1) return *why = "must be 0 or 1", "spread";
  if (!(c->sample > 0 && c->sample <= 1)) return *why = "must be in (0, 1] (1: every row)", "sample";
  if (c->max_dim < 0) return *why = "must be >= 0 (0: no layer is skipped)", "max_dim";
  if (c->diag_dim < 0) return *why = "must be >= 0 (0: every A whole)", "diag_dim";
  if (c->staleness < 0)
    return *why = "must be >= 0 (0: decompositions in the step that is due; above inverse_every: inverse_every)",
           "staleness";
  if (c->lowrank < 1) return *why = "must be >= 1 (the eigenpairs a wide factor keeps)", "lowrank";
  if (c->lowrank_dim < 0) return *why = "must be >= 0 (0: every factor decomposed whole)", "lowrank_dim";
  if (c->bucket_kb < 0 || c->bucket_kb > (1 << 21))
    return *why = "must be in [0, 2097152] (0: one factor allreduce in the step)", "bucket_kb";
  if (c->rebalance != 0 && c->rebalance != 1)
    return *why = "must be 0 (owners by the cost formula) or 1 (by measured cost)", "rebalance";
  return NULL;
}

int tide_kfac_config_check(const tide_kfac_config_t *c) {
  const char *why = "must not be NULL", *field = c == NULL ? "config" : config_problem(c, &why);
  if (field == NULL) return 0;
  TIDE_ERROR("K-FAC: kfac.%s %s", field, why);
  return TIDE_EINVAL;
}

int tide_kfac_config_parse(const char *text, tide_kfac_config_t *inout) {
  if (text == NULL || inout == NULL) {
    TIDE_ERROR("tide_kfac_config_parse: %s must not be NULL", text == NULL ? "text" : "inout");
    return TIDE_EINVAL;
  }
  tide_kfac_config_t c = *inout;
  for (const char *p = text; *p;) {
    size_t n = strcspn(p, ",:"), eq = strcspn(p, "=");
    char key[32], *end;
    if (eq >= n || eq == 0 || eq >= sizeof key) {
      TIDE_ERROR("K-FAC options \"%s\": \"%.*s\" is not key=value", text, (int)n, p);
      return TIDE_EINVAL;
    }
    memcpy(key, p, eq);
    key[eq] = 0;
    double v = strtod(p + eq + 1, &end);
    int is_int = strcmp(key, "factor_every") == 0 || strcmp(key, "inverse_every") == 0 || strcmp(key, "distribute") == 0 ||
                 strcmp(key, "spread") == 0 || strcmp(key, "max_dim") == 0 ||
                 strcmp(key, "diag_dim") == 0 || strcmp(key, "staleness") == 0 || strcmp(key, "lowrank") == 0 ||
                 strcmp(key, "lowrank_dim") == 0 || strcmp(key, "bucket_kb") == 0 || strcmp(key, "rebalance") == 0;
    if (end != p + n || end == p + eq + 1 || !isfinite(v) || (is_int && (v != floor(v) || fabs(v) > 1e9))) {
      TIDE_ERROR("K-FAC options: kfac.%s: \"%.*s\" is not a%s number", key, (int)(n - eq - 1), p + eq + 1,
                 is_int ? "n integer" : "");
      return TIDE_EINVAL;
    }
    if (strcmp(key, "factor_every") == 0)
      c.factor_every = (int)v;
    else if (strcmp(key, "inverse_every") == 0)
      c.inverse_every = (int)v;
    else if (strcmp(key, "distribute") == 0)
      c.distribute = (int)v;
    else if (strcmp(key, "spread") == 0)
      c.spread = (int)v;
    else if (strcmp(key, "max_dim") == 0)
      c.max_dim = (int)v;
    else if (strcmp(key, "diag_dim") == 0)
      c.diag_dim = (int)v;
    else if (strcmp(key, "staleness") == 0)
      c.staleness = (int)v;
    else if (strcmp(key, "lowrank") == 0)
      c.lowrank = (int)v;
    else if (strcmp(key, "lowrank_dim") == 0)
      c.lowrank_dim = (int)v;
    else if (strcmp(key, "bucket_kb") == 0)
      c.bucket_kb = (int)v;
    else if (strcmp(key, "rebalance") == 0)
      c.rebalance = (int)v;
    else if (strcmp(key, "sample") == 0)
      c.sample = (float)v;
    else if (strcmp(key, "damping") == 0)
      c.damping = (float)v;
    else if (strcmp(key, "factor_decay") == 0)
      c.factor_decay = (float)v;
    else if (strcmp(key, "kl_clip") == 0)
      c.kl_clip = (float)v;
    else {
      TIDE_ERROR("K-FAC options: unknown key \"%s\" (use factor_every, inverse_every, damping, factor_decay, "
                 "kl_clip, distribute, spread, sample, max_dim, diag_dim, lowrank, lowrank_dim, staleness, "
                 "bucket_kb, rebalance)", key);
      return TIDE_EINVAL;
    }
    p += n;
    if (*p) p++;
  }
  TIDE_CHECK(tide_kfac_config_check(&c));
  *inout = c;
  return 0;
}

/* The stage profile as one log line: each stage's mean per step (and the
 * eigendecompositions' per inverse step), this rank's own. */
static void log_profile(const tide__kfac_t *k) {
  if (k->prof_steps == 0) return;
  char line[1024];
  int n = snprintf(line, sizeof line, "K-FAC stage profile, rank %d of %d, %ld steps (%ld with factors, %ld with "
                   "decompositions), ms per step:", k->rank, k->ranks, k->prof_steps, k->prof_factor_steps,
                   k->prof_inverse_steps);
  double total = 0;
  for (int s = 0; s < KFAC_STAGES && n > 0 && (size_t)n < sizeof line; s++) {
    total += k->prof[s];
    n += snprintf(line + n, sizeof line - (size_t)n, "%s %s %.3f", s ? ";" : "", stage_name[s],
                  1e3 * k->prof[s] / (double)k->prof_steps);
  }
  if (n > 0 && (size_t)n < sizeof line)
    n += snprintf(line + n, sizeof line - (size_t)n, "; total %.3f; eigendecompositions per inverse step %.1f",
                  1e3 * total / (double)k->prof_steps,
                  k->prof_inverse_steps ? 1e3 * k->prof[EIGEN] / (double)k->prof_inverse_steps : 0.0);
  if (k->buckets > 0 && n > 0 && (size_t)n < sizeof line)
    n += snprintf(line + n, sizeof line - (size_t)n, "; factor allreduce buckets started in the backward pass %ld "
                  "of %ld (the others at its end)", k->early, k->buckets);
  /* staleness > 0: the background jobs' own time (off the step), and the
   * part of the eigendecompositions stage spent waiting for them at a swap */
  if (k->jobs > 0 && n > 0 && (size_t)n < sizeof line)
    snprintf(line + n, sizeof line - (size_t)n, "; background decompositions %ld, %.1f each (%.3f per step), "
             "waited for at the swap %.3f per step", k->jobs, 1e3 * k->job_s / (double)k->jobs,
             1e3 * k->job_s / (double)k->prof_steps, 1e3 * k->wait_s / (double)k->prof_steps);
  TIDE_INFO("%s", line);
}

/* ---- background decompositions (config.staleness > 0) --------------------- */

/* Decomposes this rank's pending layers in qn, dn: the job's body, or the
 * caller's when no thread could be started. */
static int decompose_pending(tide__kfac_t *k) {
  int64_t t0 = tide__now_ns();
  int rc = 0;
  for (size_t i = 0; i < k->nlayers && rc == 0; i++) {
    layer_t *l = &k->layers[i];
    if (!l->pending || !mine(k, l)) continue;
    int64_t t = tide__now_ns();
    if (!l->diag) rc = decompose(l, TIDE_KFAC_A, l->qn[TIDE_KFAC_A], l->qn[TIDE_KFAC_A], l->dn[TIDE_KFAC_A]);
    if (rc == 0) rc = decompose(l, TIDE_KFAC_G, l->qn[TIDE_KFAC_G], l->qn[TIDE_KFAC_G], l->dn[TIDE_KFAC_G]);
    l->decomp_s += (double)(tide__now_ns() - t) * 1e-9; /* read after the join */
    if (rc != 0) TIDE_ERROR("K-FAC: background eigendecomposition of layer %zu's factors failed", i);
  }
  k->job_s += (double)(tide__now_ns() - t0) * 1e-9;
  return rc;
}

static void *job_main(void *arg) {
  tide__kfac_t *k = arg;
  k->job_rc = decompose_pending(k);
  return NULL;
}

/* Waits for the job, if one runs; its result. The job is arithmetic on
 * buffers it alone touches until then, so it ends on its own (no deadline
 * or abort flag to poll). */
int tide__kfac_finish_job(tide__kfac_t *k) {
  if (k->job_started) {
    int64_t t0 = tide__now_ns();
    pthread_join(k->job, NULL);
    k->job_started = 0;
    k->wait_s += (double)(tide__now_ns() - t0) * 1e-9;
  }
  return k->job_rc;
}

/* At inverse step `step`: copies the pending layers' factors (this rank's)
 * into qn, dn and starts the job, to be swapped in at step + staleness.
 * Where the thread cannot start, decomposes here: the same bits, on the
 * step's time. */
static void start_job(tide__kfac_t *k, long step) {
  int ours = 0;
  for (size_t i = 0; i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    if (!l->pending || !mine(k, l)) continue;
    ours = 1;
    if (l->diag) /* A's eigenvalues are its diagonal */
      for (int j = 0; j < l->dim_a; j++) l->dn[TIDE_KFAC_A][j] = l->a[j] > 0 ? l->a[j] : 0.0f;
    else
      memcpy(l->qn[TIDE_KFAC_A], l->a, a_floats(l) * sizeof(float));
    memcpy(l->qn[TIDE_KFAC_G], l->g, (size_t)l->dim_g * l->dim_g * sizeof(float));
  }
  k->swap_step = step + stale(k);
  k->job_rc = 0;
  if (!ours) return; /* only spread layers, whose owners decompose */
  k->jobs++;
  if (pthread_create(&k->job, NULL, job_main, k) == 0) {
    k->job_started = 1;
    return;
  }
  static tide__ratelimit_t limit;
  TIDE_WARN_RATELIMITED(&limit, "K-FAC: no thread for the background decompositions: decomposing in the step");
  k->job_rc = decompose_pending(k);
}

static int share_spread(tide_trainer_t *tr, tide__kfac_t *k, size_t i);
static int settle(tide__kfac_t *k);

/* Swaps the pending decompositions in (every rank, at the same step). */
static int swap_in(tide_trainer_t *tr, tide__kfac_t *k) {
  int rc = tide__kfac_finish_job(k);
  if (rc != 0)
    return tide__trainer_fail(tr, rc, "K-FAC: a background eigendecomposition started at step %ld failed",
                              k->swap_step - stale(k));
  for (size_t i = 0; i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    if (!l->pending) continue;
    l->pending = 0;
    if (mine(k, l))
      for (int f = 0; f < 2; f++) {
        float *q = l->q[f], *d = l->d[f];
        l->q[f] = l->qn[f], l->d[f] = l->dn[f];
        l->qn[f] = q, l->dn[f] = d;
      }
    if (l->spread && (rc = share_spread(tr, k, i)) != 0) return rc;
    if (mine(k, l)) l->decomposed = 1;
  }
  k->swap_step = -1;
  return 0;
}

static int any_pending(const tide__kfac_t *k) {
  for (size_t i = 0; i < k->nlayers; i++)
    if (k->layers[i].pending) return 1;
  return 0;
}

void tide__kfac_destroy(tide__kfac_t *k) {
  if (k == NULL) return;
  (void)tide__kfac_finish_job(k);
  if (k->reqs != NULL) (void)settle(k); /* the pack is lent to them */
  log_profile(k);
  for (size_t i = 0; k->layers != NULL && i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    tide__free(l->a);
    tide__free(l->g);
    for (int f = 0; f < 2; f++) {
      tide__free(l->sum[f]);
      tide__free(l->q[f]);
      tide__free(l->d[f]);
      tide__free(l->qn[f]);
      tide__free(l->dn[f]);
    }
    tide__free(l->pw);
  }
  tide__free(k->layers);
  tide__free(k->descs);
  tide__free(k->index);
  tide__free(k->rows);
  tide__free(k->at);
  tide__free(k->pack);
  tide__free(k->bucket_off);
  tide__free(k->bucket_lo);
  tide__free(k->reqs);
  tide__free(k->m);
  tide__free(k->p);
  tide__free(k->work);
  tide__free(k->send);
  tide__free(k->recv);
  tide__free(k->counts);
  tide__free(k->dots);
  tide__free(k);
}

/* Checks a layer against the trainer's tensors; 0 or TIDE_EINVAL with the
 * reason in the trainer's last error. used marks tensors already taken. */
static int check_layer(tide_trainer_t *tr, size_t i, const tide_kfac_layer_t *d, char *used) {
  const char *why = NULL;
  char buf[160];
  if (d->in_dim < 1 || d->out_dim < 1 || d->in_dim + (d->bias >= 0) > TIDE__KFAC_MAX_DIM ||
      d->out_dim > TIDE__KFAC_MAX_DIM) {
    snprintf(buf, sizeof buf, "in_dim %d and out_dim %d must be in [1, %d] (leave larger layers out)", d->in_dim,
             d->out_dim, TIDE__KFAC_MAX_DIM - 1);
    why = buf;
  } else if (d->weight >= tr->ntensors || (d->bias >= 0 && (size_t)d->bias >= tr->ntensors) || d->bias < -1) {
    snprintf(buf, sizeof buf, "weight %zu or bias %ld is not a tensor index (the trainer has %zu)", d->weight,
             d->bias, tr->ntensors);
    why = buf;
  } else if (tr->tensors[d->weight].count != (size_t)d->in_dim * d->out_dim) {
    snprintf(buf, sizeof buf, "weight tensor %s has %zu elements, not out_dim x in_dim = %d x %d",
             tr->tensors[d->weight].name, tr->tensors[d->weight].count, d->out_dim, d->in_dim);
    why = buf;
  } else if (d->bias >= 0 && tr->tensors[d->bias].count != (size_t)d->out_dim) {
    snprintf(buf, sizeof buf, "bias tensor %s has %zu elements, not out_dim = %d", tr->tensors[d->bias].name,
             tr->tensors[d->bias].count, d->out_dim);
    why = buf;
  } else if (used[d->weight] || (d->bias >= 0 && used[d->bias]) || (size_t)d->bias == d->weight) {
    why = "uses a tensor another layer (or its own weight) already uses";
  }
  if (why != NULL) return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: layers[%zu]: %s", i, why);
  used[d->weight] = 1;
  if (d->bias >= 0) used[d->bias] = 1;
  return 0;
}

/* Bucket b's layers are [bucket_lo[b], bucket_hi(b)). */
static size_t bucket_hi(const tide__kfac_t *k, size_t b) { return b == 0 ? k->nlayers : k->bucket_lo[b - 1]; }

/* The factor allreduce's buckets (config.bucket_kb; one with one rank):
 * layers from the last, a bucket closed once it holds bucket_kb KiB, the
 * rest (with layer 0) the last; each layer's place in the pack. With one
 * bucket the pack is the layers in order, then the counts, as it was
 * before the buckets. */
static int plan_buckets(tide__kfac_t *k) {
  size_t n = k->nlayers, limit = k->ranks > 1 ? (size_t)k->config.bucket_kb * 1024 / sizeof(float) : 0, nb = 0;
  k->bucket_lo = tide__malloc(n * sizeof *k->bucket_lo);
  k->bucket_off = tide__malloc((n + 1) * sizeof *k->bucket_off);
  k->reqs = tide__calloc(n, sizeof *k->reqs);
  if (k->bucket_lo == NULL || k->bucket_off == NULL || k->reqs == NULL) return TIDE_ENOMEM;
  size_t held = 0;
  for (size_t i = n; limit > 0 && i-- > 1;) {
    const layer_t *l = &k->layers[i];
    held += a_packed(l) + tide__kfac_packed(l->dim_g);
    if (held >= limit) k->bucket_lo[nb++] = i, held = 0;
  }
  k->bucket_lo[nb++] = 0;
  k->nbuckets = nb;
  size_t off = 0;
  for (size_t b = 0; b < nb; b++) {
    k->bucket_off[b] = off;
    for (size_t i = k->bucket_lo[b]; i < bucket_hi(k, b); i++) {
      k->layers[i].pk = off;
      k->layers[i].bucket = b;
      off += a_packed(&k->layers[i]) + tide__kfac_packed(k->layers[i].dim_g);
    }
  }
  k->count_off = off;
  k->pack_len = off + 2 * n + (nb > 1 ? n : 0);
  k->bucket_off[nb] = k->pack_len;
  return 0;
}

/* A layer whose preconditioning (dim_G dim_A (dim_G + dim_A) multiply-adds
 * a step) is more than 1/ranks of all layers' cannot be balanced by whole
 * layers (the CNN's fc1: docs/adaptation.md, "K-FAC's step, stage by
 * stage"): with config.spread, its rows are spread over the ranks
 * (tide_block). Only with distribute and more than one rank. */
static void spread_layers(tide__kfac_t *k) {
  if (!k->config.spread || !k->config.distribute || k->ranks < 2) return;
  double total = 0;
  for (size_t i = 0; i < k->nlayers; i++) {
    const layer_t *l = &k->layers[i];
    total += (double)l->dim_g * l->dim_a * ((double)l->dim_g + l->dim_a);
  }
  for (size_t i = 0; i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    double cost = (double)l->dim_g * l->dim_a * ((double)l->dim_g + l->dim_a);
    if (cost * k->ranks <= total || l->dim_g < k->ranks || l->diag || low_rank(l)) continue;
    size_t off, len;
    tide_block((size_t)l->dim_g, k->ranks, k->rank, &off, &len);
    l->spread = 1;
    l->row0 = (int)off;
    l->row1 = (int)(off + len);
  }
}

int tide_trainer_kfac(tide_trainer_t *tr, const tide_kfac_config_t *config, const tide_kfac_layer_t *layers,
                      size_t nlayers) {
  if (tr == NULL) {
    TIDE_ERROR("tide_trainer_kfac: trainer must not be NULL");
    return TIDE_EINVAL;
  }
  if (config == NULL || (nlayers > 0 && layers == NULL) || nlayers == 0)
    return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: %s",
                              config == NULL ? "config must not be NULL" : "give at least one layer (layers, nlayers)");
  if (tr->kfac != NULL || tr->step > 0 || tr->in_step)
    return tide__trainer_fail(tr, TIDE_ESTATE, "tide_trainer_kfac: call it once, before the first step");
  if (tr->elastic != NULL)
    return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: K-FAC is not elastic yet (its layer owners are "
                              "fixed): turn it on only in a job that is not elastic");
  if (tide__exchanges[tr->exchange_kind].precondition == NULL)
    return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: K-FAC preconditions the averaged gradient, and the "
                              "adasum exchange has none (each rank steps on its own): use dense, topk or hitopk");
  const char *why, *field = config_problem(config, &why);
  if (field != NULL) return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: config.%s %s", field, why);
  int rc = 0;
  char *used = tide__calloc(tr->ntensors, 1);
  tide__kfac_t *k = tide__calloc(1, sizeof *k);
  if (k != NULL) {
    k->layers = tide__calloc(nlayers, sizeof *k->layers);
    k->descs = tide__malloc(nlayers * sizeof *k->descs);
    k->index = tide__malloc(nlayers * sizeof *k->index);
  }
  if (used == NULL || k == NULL || k->layers == NULL || k->descs == NULL || k->index == NULL) {
    tide__free(used);
    tide__kfac_destroy(k);
    return TIDE_ENOMEM;
  }
  k->config = *config;
  k->ncaller = nlayers;
  memcpy(k->descs, layers, nlayers * sizeof *layers);
  k->rank = tr->rank;
  k->ranks = tr->ranks;
  size_t biggest = 0, total = 0;
  for (size_t i = 0; i < nlayers && rc == 0; i++) {
    if ((rc = check_layer(tr, i, &layers[i], used)) != 0) break;
    int max = config->max_dim;
    if (max > 0 && (layers[i].in_dim + (layers[i].bias >= 0) > max || layers[i].out_dim > max)) {
      k->index[i] = -1; /* preconditioning it would not pay (config.max_dim) */
      continue;
    }
    k->index[i] = (long)k->nlayers;
    layer_t *l = &k->layers[k->nlayers++];
    l->desc = layers[i];
    l->w_off = tr->tensors[layers[i].weight].offset;
    l->b_off = layers[i].bias >= 0 ? tr->tensors[layers[i].bias].offset : 0;
    l->dim_a = layers[i].in_dim + (layers[i].bias >= 0);
    l->dim_g = layers[i].out_dim;
    l->diag = config->diag_dim > 0 && l->dim_a > config->diag_dim;
    for (int f = 0; f < 2; f++) {
      int dim = f == TIDE_KFAC_A ? l->dim_a : l->dim_g, max = config->lowrank_dim;
      l->rank[f] = !l->diag && max > 0 && dim > max && config->lowrank < dim ? config->lowrank : dim;
    }
    /* m, p and work hold a layer; work the low-rank preconditioner's scratch too */
    size_t scratch = layer_floats(l);
    if (low_rank(l)) {
      size_t low = tide__kfac_lowrank_work(l->rank[TIDE_KFAC_G], l->dim_g, l->rank[TIDE_KFAC_A], l->dim_a);
      if (low > scratch) scratch = low;
    }
    if (scratch > biggest) biggest = scratch;
    total += layer_floats(l) + 1;
  }
  tide__free(used);
  if (rc == 0 && k->nlayers == 0)
    rc = tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: config.max_dim %d leaves none of the %zu layers to "
                            "precondition: raise it, or 0 to keep every layer", config->max_dim, nlayers);
  if (rc == 0) rc = tide__kfac_assign(k);
  if (rc == 0) spread_layers(k);
  /* Every rank must run the same layers and options: compare a digest. */
  if (rc == 0) {
    uint64_t digest = tide__fnv1a(config, sizeof *config) ^ tide__fnv1a(layers, nlayers * sizeof *layers);
    /* min of x and of -x: the ranks agree when min == max. */
    double lo_hi[2] = {(double)(digest >> 11), -(double)(digest >> 11)};
    if ((rc = tide_allreduce(tr->comm, lo_hi, lo_hi, 2, TIDE_F64, TIDE_MIN)) != 0)
      rc = tide__trainer_fail(tr, rc, "tide_trainer_kfac: allreduce: %s", tide_comm_last_error(tr->comm));
    else if (lo_hi[0] != -lo_hi[1])
      rc = tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac: ranks passed different configs or layers");
  }
  if (rc == 0) rc = plan_buckets(k);
  size_t own = 0;
  for (size_t i = 0; i < k->nlayers && rc == 0; i++) {
    layer_t *l = &k->layers[i];
    size_t na = a_floats(l), ng = (size_t)l->dim_g * l->dim_g;
    l->a = tide__calloc(na, sizeof *l->a);
    l->g = tide__calloc(ng, sizeof *l->g);
    l->sum[TIDE_KFAC_A] = tide__calloc(na, sizeof(float));
    l->sum[TIDE_KFAC_G] = tide__calloc(ng, sizeof(float));
    if (mine(k, l) || l->spread) {
      own += layer_floats(l) + 1;
      l->q[TIDE_KFAC_A] = l->diag ? NULL : tide__malloc(na * sizeof(float));
      l->q[TIDE_KFAC_G] = tide__malloc(ng * sizeof(float));
      l->d[TIDE_KFAC_A] = tide__malloc((size_t)l->dim_a * sizeof(float));
      l->d[TIDE_KFAC_G] = tide__malloc((size_t)l->dim_g * sizeof(float));
      if ((l->q[0] == NULL && !l->diag) || l->q[1] == NULL || l->d[0] == NULL || l->d[1] == NULL) rc = TIDE_ENOMEM;
    }
    if (mine(k, l) && config->staleness > 0) {
      l->qn[TIDE_KFAC_A] = l->diag ? NULL : tide__malloc(na * sizeof(float));
      l->qn[TIDE_KFAC_G] = tide__malloc(ng * sizeof(float));
      l->dn[TIDE_KFAC_A] = tide__malloc((size_t)l->dim_a * sizeof(float));
      l->dn[TIDE_KFAC_G] = tide__malloc((size_t)l->dim_g * sizeof(float));
      if ((l->qn[0] == NULL && !l->diag) || l->qn[1] == NULL || l->dn[0] == NULL || l->dn[1] == NULL)
        rc = TIDE_ENOMEM;
    }
    if (l->spread && (l->pw = tide__malloc(layer_floats(l) * sizeof *l->pw)) == NULL) rc = TIDE_ENOMEM;
    if (l->a == NULL || l->g == NULL || l->sum[0] == NULL || l->sum[1] == NULL) rc = TIDE_ENOMEM;
    if (rc != 0) break;
    /* The running averages start from I (kfac-pytorch). */
    for (int j = 0; j < l->dim_a; j++) l->a[l->diag ? (size_t)j : (size_t)j * l->dim_a + j] = 1.0f;
    for (int j = 0; j < l->dim_g; j++) l->g[(size_t)j * l->dim_g + j] = 1.0f;
  }
  if (rc == 0) {
    k->pack = tide__malloc(k->pack_len * sizeof *k->pack);
    k->m = tide__malloc(biggest * sizeof *k->m);
    k->p = tide__malloc(biggest * sizeof *k->p);
    k->work = tide__malloc(biggest * sizeof *k->work);
    k->send = tide__malloc((own ? own : 1) * sizeof *k->send);
    k->recv = tide__malloc(total * sizeof *k->recv);
    k->counts = tide__calloc((size_t)k->ranks, sizeof *k->counts);
    k->dots = tide__calloc(k->nlayers, sizeof *k->dots);
    k->at = tide__calloc(k->nlayers, sizeof *k->at);
    if (k->at == NULL) rc = TIDE_ENOMEM;
    if (k->pack == NULL || k->m == NULL || k->p == NULL || k->work == NULL || k->send == NULL || k->recv == NULL ||
        k->counts == NULL || k->dots == NULL)
      rc = TIDE_ENOMEM;
  }
  if (rc != 0) {
    tide__kfac_destroy(k);
    return rc == TIDE_ENOMEM ? tide__trainer_fail(tr, rc, "tide_trainer_kfac: out of memory for the factors") : rc;
  }
  for (int r = 0; r < k->ranks; r++) k->counts[r] = tide__kfac_rank_floats(k, r);
  k->swap_step = -1;
  tr->kfac = k;
  if (tr->rank == 0)
    for (size_t i = 0; i < nlayers; i++) {
      const layer_t *l = k->index[i] >= 0 ? &k->layers[k->index[i]] : NULL;
      if (l == NULL)
        TIDE_INFO("K-FAC: layer %zu (%s): A %d x %d, G %d x %d: not preconditioned (wider than max_dim %d)", i,
                  tr->tensors[layers[i].weight].name, layers[i].in_dim + (layers[i].bias >= 0),
                  layers[i].in_dim + (layers[i].bias >= 0), layers[i].out_dim, layers[i].out_dim, config->max_dim);
      else
        TIDE_INFO("K-FAC: layer %zu (%s): A %d x %d%s, G %d x %d%s, rank %d%s", i, tr->tensors[layers[i].weight].name,
                  l->dim_a, l->dim_a,
                  l->diag ? " (its diagonal: wider than diag_dim)"
                  : l->rank[TIDE_KFAC_A] < l->dim_a ? " (its top lowrank eigenpairs)" : "",
                  l->dim_g, l->dim_g, l->rank[TIDE_KFAC_G] < l->dim_g ? " (its top lowrank eigenpairs)" : "",
                  config->distribute ? l->owner : -1,
                  l->spread ? " (its preconditioning's rows spread over all ranks)" : "");
    }
  return 0;
}

static int factor_step(const tide_trainer_t *tr) {
  return tr->kfac != NULL && tr->step % tr->kfac->config.factor_every == 0;
}

int tide_trainer_kfac_wanted(const tide_trainer_t *tr) {
  return tr != NULL && tr->in_step && factor_step(tr);
}

/* ---- the factor allreduce, bucket by bucket (config.bucket_kb) ------------ */

/* Packs layer l's sums (upper triangles, or a diagonal A) at p, scaled to
 * the mean over the micro-batches that added (this one included). */
static void pack_layer(const layer_t *l, float *p) {
  for (int f = 0; f < 2; f++) {
    int dim = f == TIDE_KFAC_A ? l->dim_a : l->dim_g, n = l->micros[f] + l->added[f];
    float scale = n > 0 ? 1.0f / (float)n : 0.0f;
    if (f == TIDE_KFAC_A && l->diag)
      for (int j = 0; j < dim; j++) p[j] = l->sum[f][j] * scale;
    else
      tide__kfac_pack(l->sum[f], dim, scale, p);
    p += f == TIDE_KFAC_A ? a_packed(l) : tide__kfac_packed(dim);
  }
}

/* Packs the next bucket and starts its allreduce. Every rank starts the
 * buckets in the same order, all of them before the step's gradient
 * exchange (the last micro-batch's end starts those left), so the
 * collectives match whatever each rank's backward pass added. A failed
 * start is kept for the step to report; the later buckets are then not
 * started. */
static void start_bucket(tide_trainer_t *tr, tide__kfac_t *k) {
  int64_t t = tide__now_ns(), t0 = t;
  size_t b = k->started++;
  k->buckets++;
  for (size_t i = k->bucket_lo[b]; i < bucket_hi(k, b); i++) pack_layer(&k->layers[i], k->pack + k->layers[i].pk);
  lap(k, BLEND, &t);
  k->started_step = tr->step;
  k->reqs[b] = NULL;
  if (k->start_rc == 0) {
    float *p = k->pack + k->bucket_off[b];
    k->start_rc = tide_iallreduce(tr->comm, p, p, k->bucket_off[b + 1] - k->bucket_off[b], TIDE_F32, TIDE_SUM,
                                  &k->reqs[b]);
    if (k->start_rc != 0) k->reqs[b] = NULL;
  }
  lap(k, ALLREDUCE, &t);
  k->start_s += (double)(t - t0) * 1e-9;
}

/* Waits for the started buckets' requests and frees them; the first
 * failure (a failed start first). After it nothing is in flight. */
static int settle(tide__kfac_t *k) {
  int rc = k->start_rc;
  for (size_t b = 0; b < k->started; b++) {
    if (k->reqs[b] == NULL) continue;
    int r = tide_wait(k->reqs[b]);
    k->reqs[b] = NULL;
    if (rc == 0) rc = r;
  }
  k->started = 0;
  k->start_rc = 0;
  return rc;
}

/* A step left before its stage (a failed step, an elastic change): its
 * requests waited for, its sums dropped. */
static void drop_step(tide__kfac_t *k) {
  (void)settle(k);
  for (size_t i = 0; i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    for (int f = 0; f < 2; f++) {
      memset(l->sum[f], 0, (f == TIDE_KFAC_A ? a_floats(l) : (size_t)l->dim_g * l->dim_g) * sizeof(float));
      l->added[f] = l->micros[f] = 0;
    }
    l->late = 0;
  }
}

void tide__kfac_abandon(tide__kfac_t *k) {
  if (k != NULL) drop_step(k);
}

/* Buckets still out from an earlier step that never reached its stage (a
 * step that failed and was not abandoned): waited for, their late marks
 * dropped; the sums stay, as they did before the buckets. */
static void settle_stale(const tide_trainer_t *tr, tide__kfac_t *k) {
  if (k->started == 0 || k->started_step == tr->step) return;
  (void)settle(k);
  for (size_t i = 0; i < k->nlayers; i++) k->layers[i].late = 0;
}

/* Before tide_trainer_kfac_add adds to layer li (of layers) on a factor
 * step's last micro-batch: starts each bucket in turn that the backward
 * pass has left (li is not in it) with A and G of all its layers added in
 * this micro-batch; marks li late if its bucket has already started. */
static void overlap_poll(tide_trainer_t *tr, tide__kfac_t *k, size_t li) {
  if (k->nbuckets < 2 || tr->micro != tr->micro_count - 1) return;
  settle_stale(tr, k);
  while (k->started < k->nbuckets - 1) {
    size_t b = k->started;
    if (li >= k->bucket_lo[b] && li < bucket_hi(k, b)) break;
    for (size_t i = k->bucket_lo[b]; i < bucket_hi(k, b); i++)
      if (!k->layers[i].added[TIDE_KFAC_A] || !k->layers[i].added[TIDE_KFAC_G]) return;
    start_bucket(tr, k);
    k->early++;
  }
  if (k->layers[li].bucket < k->started) k->layers[li].late = 1;
}

int tide_trainer_kfac_add(tide_trainer_t *tr, size_t layer, tide_kfac_factor_t factor, const float *x, size_t rows,
                          size_t ld, int transposed, float weight) {
  if (tr == NULL) {
    TIDE_ERROR("tide_trainer_kfac_add: trainer must not be NULL");
    return TIDE_EINVAL;
  }
  tide__kfac_t *k = tr->kfac;
  if (k == NULL || !tr->micro_handed || !factor_step(tr))
    return tide__trainer_fail(tr, TIDE_ESTATE, "tide_trainer_kfac_add: %s",
                              k == NULL ? "K-FAC is off (tide_trainer_kfac first)"
                                        : "only between tide_trainer_next and tide_trainer_step of a step that "
                                          "updates factors (tide_trainer_kfac_wanted)");
  const char *why = NULL;
  if (layer >= k->ncaller)
    why = "layer is out of range";
  else if (factor != TIDE_KFAC_A && factor != TIDE_KFAC_G)
    why = "factor must be TIDE_KFAC_A or TIDE_KFAC_G";
  else if (rows > 0 && x == NULL)
    why = "x must not be NULL";
  else if (!(weight >= 0 && isfinite(weight)))
    why = "weight must be finite and >= 0";
  else if (rows > INT32_MAX)
    why = "rows must be below 2^31";
  size_t cols = 0;
  if (why == NULL) {
    cols = factor == TIDE_KFAC_A ? (size_t)k->descs[layer].in_dim : (size_t)k->descs[layer].out_dim;
    if (transposed ? ld < rows : ld < cols) why = "ld is below the row length (rows when transposed, else the dimension)";
  }
  if (why != NULL)
    return tide__trainer_fail(tr, TIDE_EINVAL, "tide_trainer_kfac_add(layer %zu, factor %d): %s", layer, (int)factor,
                              why);
  if (k->index[layer] < 0) return 0; /* not preconditioned (config.max_dim) */
  overlap_poll(tr, k, (size_t)k->index[layer]);
  int64_t t0 = tide__now_ns();
  layer_t *l = &k->layers[k->index[layer]];
  int dim = factor == TIDE_KFAC_A ? l->dim_a : l->dim_g;
  if (k->config.sample < 1 && rows > 1) {
    /* A subsample of the rows, shifted each factor step (the same on
     * every rank and in a resumed run: it follows the step). */
    size_t n = tide__kfac_sample_count(rows, k->config.sample, NULL);
    if (n * cols > k->rows_cap) {
      float *grown = tide__realloc(k->rows, n * cols * sizeof *grown);
      if (grown == NULL)
        return tide__trainer_fail(tr, TIDE_ENOMEM, "tide_trainer_kfac_add: out of memory for %zu sampled rows", n);
      k->rows = grown;
      k->rows_cap = n * cols;
    }
    size_t shift = (size_t)(tr->step / k->config.factor_every);
    tide__kfac_sample(x, rows, cols, ld, transposed, k->config.sample, shift, k->rows);
    weight *= (float)((double)rows / (double)n);
    x = k->rows;
    ld = transposed ? n : cols;
    rows = n;
  }
  if (factor == TIDE_KFAC_A && l->diag)
    tide__kfac_sumsq(l->sum[factor], dim, l->desc.bias >= 0, x, rows, ld, transposed, weight);
  else
    tide__kfac_syrk(l->sum[factor], dim, factor == TIDE_KFAC_A && l->desc.bias >= 0, x, rows, ld, transposed, weight);
  l->added[factor] = 1;
  k->add_s += (double)(tide__now_ns() - t0) * 1e-9;
  return 0;
}

void tide__kfac_micro_end(tide_trainer_t *tr, tide__kfac_t *k) {
  if (k == NULL) return;
  if (k->nbuckets > 1 && factor_step(tr) && tr->micro == tr->micro_count - 1) {
    settle_stale(tr, k);
    while (k->started < k->nbuckets - 1) start_bucket(tr, k);
  }
  for (size_t i = 0; i < k->nlayers; i++)
    for (int f = 0; f < 2; f++) {
      k->layers[i].micros[f] += k->layers[i].added[f];
      k->layers[i].added[f] = 0;
    }
}

/* All-reduces the step's factors and folds them into the running averages:
 * the last bucket, the counts and the late flags here (after the buckets
 * started during the backward pass, which the blocking call waits for),
 * then again, whole, each layer some rank added to after its bucket left. */
static int update_factors(tide_trainer_t *tr, tide__kfac_t *k) {
  int64_t t = tide__now_ns();
  settle_stale(tr, k);
  while (k->started + 1 < k->nbuckets) start_bucket(tr, k); /* none: the last micro-batch's end started them */
  size_t last = k->nbuckets - 1, n = k->nlayers;
  float *counts = k->pack + k->count_off, *late = counts + 2 * n;
  for (size_t i = k->bucket_lo[last]; i < bucket_hi(k, last); i++)
    pack_layer(&k->layers[i], k->pack + k->layers[i].pk);
  for (size_t i = 0; i < n; i++) {
    layer_t *l = &k->layers[i];
    for (int f = 0; f < 2; f++) counts[2 * i + f] = l->micros[f] > 0 ? 1.0f : 0.0f;
    if (k->nbuckets > 1) late[i] = l->late ? 1.0f : 0.0f;
  }
  lap(k, BLEND, &t);
  size_t off = k->bucket_off[last];
  int rc = k->start_rc != 0 ? 0 : tide_allreduce(tr->comm, k->pack + off, k->pack + off, k->pack_len - off, TIDE_F32,
                                                 TIDE_SUM);
  int waited = settle(k);
  if (rc == 0) rc = waited;
  for (size_t i = 0; rc == 0 && k->nbuckets > 1 && i < n; i++) {
    const layer_t *l = &k->layers[i];
    if (late[i] == 0) continue;
    float *p = k->pack + l->pk;
    pack_layer(l, p);
    rc = tide_allreduce(tr->comm, p, p, a_packed(l) + tide__kfac_packed(l->dim_g), TIDE_F32, TIDE_SUM);
  }
  if (rc != 0) {
    drop_step(k);
    return tide__trainer_fail(tr, rc, "K-FAC factor allreduce: %s", tide_comm_last_error(tr->comm));
  }
  lap(k, ALLREDUCE, &t);
  for (size_t i = 0; i < n; i++) {
    layer_t *l = &k->layers[i];
    float *p = k->pack + l->pk;
    for (int f = 0; f < 2; f++) {
      int dim = f == TIDE_KFAC_A ? l->dim_a : l->dim_g;
      float ranks = counts[2 * i + f];
      int diag = f == TIDE_KFAC_A && l->diag;
      /* No rank added this factor: the average keeps its value. */
      if (ranks > 0 && diag) {
        float keep = k->config.factor_decay, take = (1.0f - keep) / ranks;
        for (int j = 0; j < dim; j++) l->a[j] = keep * l->a[j] + take * p[j];
      } else if (ranks > 0) {
        tide__kfac_blend(f == TIDE_KFAC_A ? l->a : l->g, dim, p, 1.0f / ranks, k->config.factor_decay);
      }
      p += diag ? a_packed(l) : tide__kfac_packed(dim);
      memset(l->sum[f], 0, (diag ? a_floats(l) : (size_t)dim * dim) * sizeof(float));
      l->micros[f] = 0;
    }
    l->late = 0;
  }
  lap(k, BLEND, &t);
  k->prof_factor_steps++;
  return 0;
}

/* A spread layer's owner broadcasts the decomposition in use to every rank. */
static int share_spread(tide_trainer_t *tr, tide__kfac_t *k, size_t i) {
  layer_t *l = &k->layers[i];
  const size_t n[4] = {(size_t)l->dim_a * l->dim_a, (size_t)l->dim_a, (size_t)l->dim_g * l->dim_g, (size_t)l->dim_g};
  float *bufs[4] = {l->q[TIDE_KFAC_A], l->d[TIDE_KFAC_A], l->q[TIDE_KFAC_G], l->d[TIDE_KFAC_G]};
  for (int j = 0; j < 4; j++) {
    int rc = tide_broadcast(tr->comm, bufs[j], n[j], TIDE_F32, l->owner);
    if (rc != 0)
      return tide__trainer_fail(tr, rc, "K-FAC: broadcast of layer %zu's decomposition: %s", i,
                                tide_comm_last_error(tr->comm));
  }
  l->decomposed = 1;
  return 0;
}

/* The layer's gradient as [out, in | bias] from the flat buffer, and back. */
static void gather(const layer_t *l, const float *grad, float *m) {
  int in = l->desc.in_dim;
  for (int o = 0; o < l->dim_g; o++) {
    memcpy(m + (size_t)o * l->dim_a, grad + l->w_off + (size_t)o * in, (size_t)in * sizeof *m);
    if (l->desc.bias >= 0) m[(size_t)o * l->dim_a + in] = grad[l->b_off + o];
  }
}

static void scatter(const layer_t *l, const float *p, float scale, float *grad) {
  int in = l->desc.in_dim;
  for (int o = 0; o < l->dim_g; o++) {
    const float *row = p + (size_t)o * l->dim_a;
    float *w = grad + l->w_off + (size_t)o * in;
    for (int j = 0; j < in; j++) w[j] = row[j] * scale;
    if (l->desc.bias >= 0) grad[l->b_off + o] = row[in] * scale;
  }
}

/* Preconditions layer l of grad into out (layer_floats floats) and returns
 * sum(P .* M). */
static double precondition(tide__kfac_t *k, const layer_t *l, const float *grad, float *out) {
  gather(l, grad, k->m);
  if (l->diag)
    tide__kfac_precondition_diag(l->q[TIDE_KFAC_G], l->d[TIDE_KFAC_G], l->dim_g, l->d[TIDE_KFAC_A], l->dim_a,
                                 k->config.damping, k->m, out, k->work);
  else if (low_rank(l))
    tide__kfac_precondition_lowrank(l->q[TIDE_KFAC_G], l->d[TIDE_KFAC_G], l->rank[TIDE_KFAC_G], l->dim_g,
                                    l->q[TIDE_KFAC_A], l->d[TIDE_KFAC_A], l->rank[TIDE_KFAC_A], l->dim_a,
                                    k->config.damping, k->m, out, k->work);
  else
    tide__kfac_precondition(l->q[TIDE_KFAC_G], l->d[TIDE_KFAC_G], l->dim_g, l->q[TIDE_KFAC_A], l->d[TIDE_KFAC_A],
                            l->dim_a, k->config.damping, k->m, out, k->work);
  double dot = 0;
  for (size_t j = 0, n = layer_floats(l); j < n; j++) dot += (double)out[j] * k->m[j];
  return dot;
}

int tide__kfac_stage(tide_trainer_t *tr, tide__kfac_t *k, const tide__mean_t *mean, float lr, tide__update_t *out) {
  if (mean->whole == NULL) /* a row without this stage in the table (tide__exchange_row avoids them) */
    return tide__trainer_fail(tr, TIDE_ESTATE, "K-FAC: step %ld's exchange averaged only a shard of the gradient",
                              tr->step);
  int64_t t0 = tide__now_ns(), t;
  int rc;
  float *grad = mean->whole;
  if (factor_step(tr) && (rc = update_factors(tr, k)) != 0) return rc;
  long every = k->config.inverse_every, lag = stale(k);
  int refresh = tr->step % every == 0, eigen = 0, later = 0;
  t = tide__now_ns();
  if (any_pending(k)) {
    /* After a restore: the job was started at the last inverse step before this one. */
    if (k->swap_step < 0) k->swap_step = (tr->step > 0 ? (tr->step - 1) / every * every : 0) + lag;
    if (tr->step >= k->swap_step && (rc = swap_in(tr, k)) != 0) return rc;
  }
  /* Nothing is pending here (staleness <= inverse_every): the owners may move. */
  if (refresh && tr->step > 0 && k->config.rebalance && k->config.distribute && k->ranks > 1 && !any_pending(k) &&
      (rc = tide__kfac_rebalance(tr, k)) != 0)
    return rc;
  for (size_t i = 0; i < k->nlayers; i++) {
    layer_t *l = &k->layers[i];
    /* decomposed is the same on every rank for a spread layer */
    int due = refresh || !l->decomposed;
    if (due && l->decomposed && lag > 0) { /* to the background job, swapped in at step + staleness */
      if (mine(k, l) || l->spread) l->pending = later = 1;
      continue;
    }
    if (mine(k, l) && due && l->diag) /* A's eigenvalues are its diagonal */
      for (int j = 0; j < l->dim_a; j++) l->d[TIDE_KFAC_A][j] = l->a[j] > 0 ? l->a[j] : 0.0f;
    if (mine(k, l) && due) {
      int64_t t1 = tide__now_ns();
      if ((!l->diag && (rc = decompose(l, TIDE_KFAC_A, l->a, l->q[TIDE_KFAC_A], l->d[TIDE_KFAC_A])) != 0) ||
          (rc = decompose(l, TIDE_KFAC_G, l->g, l->q[TIDE_KFAC_G], l->d[TIDE_KFAC_G])) != 0)
        return tide__trainer_fail(tr, rc, "K-FAC: eigendecomposition of layer %zu's factors failed at step %ld", i,
                                  tr->step);
      l->decomp_s += (double)(tide__now_ns() - t1) * 1e-9;
      l->decomposed = 1;
      eigen = 1;
    }
    if (l->spread && due && (rc = share_spread(tr, k, i)) != 0) return rc;
  }
  if (later) start_job(k, tr->step);
  lap(k, EIGEN, &t);
  k->prof_inverse_steps += eigen;
  if (k->config.distribute && k->ranks > 1) {
    /* Each owner preconditions its layers, and every rank its rows of the
     * spread ones; one allgatherv shares them. */
    float *s = k->send;
    for (size_t i = 0; i < k->nlayers; i++) {
      layer_t *l = &k->layers[i];
      if (l->owner != k->rank || l->spread) continue;
      int64_t t1 = tide__now_ns();
      s[layer_floats(l)] = (float)precondition(k, l, grad, s);
      l->precond_s += (double)(tide__now_ns() - t1) * 1e-9;
      l->precond_n++;
      s += layer_floats(l) + 1;
    }
    for (size_t i = 0; i < k->nlayers; i++) {
      const layer_t *l = &k->layers[i];
      if (!l->spread) continue;
      gather(l, grad, k->m);
      tide__kfac_precondition_rows(l->q[TIDE_KFAC_G], l->d[TIDE_KFAC_G], l->dim_g, l->q[TIDE_KFAC_A],
                                   l->d[TIDE_KFAC_A], l->dim_a, k->config.damping, k->m, l->row0, l->row1, s,
                                   k->work);
      s += (size_t)(l->row1 - l->row0) * l->dim_a;
    }
    lap(k, PRECOND, &t);
    if ((rc = tide_allgatherv(tr->comm, k->send, k->counts[k->rank], k->recv, k->counts, TIDE_F32)) != 0)
      return tide__trainer_fail(tr, rc, "K-FAC allgatherv of the preconditioned gradients: %s",
                                tide_comm_last_error(tr->comm));
    lap(k, ALLGATHER, &t);
  } else {
    float *s = k->recv;
    for (size_t i = 0; i < k->nlayers; i++) {
      const layer_t *l = &k->layers[i];
      s[layer_floats(l)] = (float)precondition(k, l, grad, s);
      s += layer_floats(l) + 1;
    }
    lap(k, PRECOND, &t);
  }
  /* Where each layer's result sits in recv: per rank in rank order, its
   * layers, then its rows of the spread ones (or layer order when every
   * rank did every layer). A spread layer's W is put together in pw and
   * finished into it (P = Q_G W) by every rank. */
  double vg = 0;
  size_t offset = 0;
  int ranks = k->config.distribute ? k->ranks : 1;
  for (int r = 0; r < ranks; r++) {
    for (size_t i = 0; i < k->nlayers; i++) {
      const layer_t *l = &k->layers[i];
      if (l->spread || (k->config.distribute && l->owner != r)) continue;
      k->at[i] = offset;
      k->dots[i] = k->recv[offset + layer_floats(l)];
      offset += layer_floats(l) + 1;
    }
    for (size_t i = 0; i < k->nlayers; i++) {
      const layer_t *l = &k->layers[i];
      if (!l->spread) continue;
      size_t off, len;
      tide_block((size_t)l->dim_g, k->ranks, r, &off, &len);
      memcpy(l->pw + off * l->dim_a, k->recv + offset, len * l->dim_a * sizeof *l->pw);
      offset += len * l->dim_a;
      if (r == ranks - 1) {
        tide__kfac_precondition_finish(l->q[TIDE_KFAC_G], l->dim_g, l->dim_a, l->pw, k->p);
        memcpy(l->pw, k->p, layer_floats(l) * sizeof *l->pw);
        gather(l, grad, k->m);
        double dot = 0;
        for (size_t j = 0, n = layer_floats(l); j < n; j++) dot += (double)l->pw[j] * k->m[j];
        k->dots[i] = (float)dot;
      }
    }
  }
  for (size_t i = 0; i < k->nlayers; i++) vg += k->dots[i];
  float nu = 1.0f;
  if (k->config.kl_clip > 0) {
    double v = fabs(vg * (double)lr * (double)lr);
    if (v > 0) nu = (float)fmin(1.0, sqrt((double)k->config.kl_clip / v));
  }
  for (size_t i = 0; i < k->nlayers; i++) {
    const layer_t *l = &k->layers[i];
    scatter(l, l->spread ? l->pw : k->recv + k->at[i], nu, grad);
  }
  lap(k, APPLY, &t);
  out->kfac_s += (double)(tide__now_ns() - t0) * 1e-9 + k->add_s + k->start_s;
  k->prof[STATS] += k->add_s;
  k->prof_steps++;
  k->add_s = k->start_s = 0;
  return 0;
}
