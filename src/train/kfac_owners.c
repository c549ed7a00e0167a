/* The trainer's K-FAC stage, which rank owns (decomposes and
 * preconditions) each layer: KAISA's greedy assignment by a cost formula
 * at creation, and by the layers' measured cost at inverse steps
 * (config.rebalance). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train/kfac.h"

/* What rank r sends in the allgather: [P_l, dot_l] of each layer it owns
 * that is not spread, then its rows of W of each spread layer. */
size_t tide__kfac_rank_floats(const tide__kfac_t *k, int r) {
  size_t n = 0;
  for (size_t i = 0; i < k->nlayers; i++) {
    const layer_t *l = &k->layers[i];
    if (l->spread) {
      size_t off, len;
      tide_block((size_t)l->dim_g, k->ranks, r, &off, &len);
      n += len * (size_t)l->dim_a;
    } else if (l->owner == r) {
      n += layer_floats(l) + 1;
    }
  }
  return n;
}

/* The cost formula of a layer's decompositions: dim^3 a factor (ssyevd),
 * ~4 (rank + extra) dim^2 at low rank, dim for a diagonal A. */
static double formula_cost(const layer_t *l) {
  double cost = 0;
  for (int f = 0; f < 2; f++) {
    double dim = f == TIDE_KFAC_A ? l->dim_a : l->dim_g;
    cost += f == TIDE_KFAC_A && l->diag ? dim
            : l->rank[f] < dim           ? 4.0 * (l->rank[f] + TIDE__KFAC_TOP_EXTRA) * dim * dim
                                         : pow(dim, 3);
  }
  return cost;
}

/* KAISA's greedy assignment: layers by cost[i] from the largest (the first
 * on ties), each to the least loaded rank (the lowest on ties), into
 * owner; returns the busiest rank's load. load holds ranks doubles, done n
 * chars. */
static double greedy(const double *cost, size_t n, int ranks, double *load, char *done, int *owner) {
  memset(load, 0, (size_t)ranks * sizeof *load);
  memset(done, 0, n);
  for (size_t m = 0; m < n; m++) {
    size_t best = 0;
    double best_cost = -1;
    for (size_t i = 0; i < n; i++)
      if (!done[i] && cost[i] > best_cost) best = i, best_cost = cost[i];
    int r = 0;
    for (int q = 1; q < ranks; q++)
      if (load[q] < load[r]) r = q;
    done[best] = 1;
    load[r] += best_cost;
    owner[best] = r;
  }
  double most = 0;
  for (int r = 0; r < ranks; r++) most = fmax(most, load[r]);
  return most;
}

/* The owners at creation, by the cost formula. */
int tide__kfac_assign(tide__kfac_t *k) {
  double *load = tide__calloc((size_t)k->ranks, sizeof *load), *cost = tide__calloc(k->nlayers, sizeof *cost);
  char *done = tide__calloc(k->nlayers, 1);
  int *owner = tide__calloc(k->nlayers, sizeof *owner);
  int rc = load == NULL || cost == NULL || done == NULL || owner == NULL ? TIDE_ENOMEM : 0;
  if (rc == 0) {
    for (size_t i = 0; i < k->nlayers; i++) {
      cost[i] = formula_cost(&k->layers[i]);
      k->layers[i].cost_s = -1;
    }
    greedy(cost, k->nlayers, k->ranks, load, done, owner);
    for (size_t i = 0; i < k->nlayers; i++) k->layers[i].owner = owner[i];
  }
  tide__free(load);
  tide__free(cost);
  tide__free(done);
  tide__free(owner);
  return rc;
}

/* ---- by measured cost (config.rebalance) ---------------------------------- */

void tide__kfac_fake_costs(tide__kfac_t *k, const double *seconds) {
  if (k != NULL) k->fake_s = seconds;
}

int tide__kfac_owner(const tide__kfac_t *k, size_t layer) {
  return k != NULL && layer < k->nlayers ? k->layers[layer].owner : -1;
}

/* Allocates (have) or frees the decomposition buffers an owner keeps and
 * other ranks do not: q, d (a spread layer's are on every rank) and, with
 * staleness, qn, dn. */
static int owner_buffers(tide__kfac_t *k, layer_t *l, int have) {
  size_t na = a_floats(l), ng = (size_t)l->dim_g * l->dim_g;
  const size_t n[2][2] = {{l->diag ? 0 : na, ng}, {(size_t)l->dim_a, (size_t)l->dim_g}};
  float **bufs[2][2] = {{l->q, l->d}, {l->qn, l->dn}};
  int rc = 0;
  for (int set = l->spread ? 1 : 0; set < (k->config.staleness > 0 ? 2 : 1); set++)
    for (int f = 0; f < 2; f++) {
      float **q = &bufs[set][0][f], **d = &bufs[set][1][f];
      tide__free(*q);
      tide__free(*d);
      *q = have && n[0][f] > 0 ? tide__malloc(n[0][f] * sizeof **q) : NULL;
      *d = have ? tide__malloc(n[1][f] * sizeof **d) : NULL;
      if (have && ((n[0][f] > 0 && *q == NULL) || *d == NULL)) rc = TIDE_ENOMEM;
    }
  return rc;
}

/* Layer i moves from its owner to rank `to`. With staleness the
 * decomposition in use serves until the swap, so the old owner broadcasts
 * it (with its decomposed flag); without, the new owner decomposes it in
 * this step anyway (it is due). */
static int move_layer(tide_trainer_t *tr, tide__kfac_t *k, size_t i, int to) {
  layer_t *l = &k->layers[i];
  int from = l->owner, rc = 0;
  size_t n = eigen_floats(l);
  float *buf = NULL;
  if (stale(k) > 0 && !l->spread) {
    if ((buf = tide__malloc(sections(k) * n * sizeof *buf)) == NULL) return TIDE_ENOMEM;
    if (k->rank == from) tide__kfac_eigen_pack(k, l, buf);
    if ((rc = tide_broadcast(tr->comm, buf, n, TIDE_F32, from)) != 0) {
      tide__free(buf);
      return tide__trainer_fail(tr, rc, "K-FAC: moving layer %zu's decomposition to rank %d: %s", i, to,
                                tide_comm_last_error(tr->comm));
    }
  }
  if (k->rank == from) rc = owner_buffers(k, l, 0);
  if (k->rank == to && (rc = owner_buffers(k, l, 1)) == 0 && buf != NULL) {
    l->decomposed = buf[0] == 1.0f;
    tide__kfac_eigen_unpack(l, l->q, l->d, (const char *)(buf + 1));
  }
  if (!l->spread && k->rank != to) l->decomposed = 0;
  l->owner = to;
  tide__free(buf);
  return rc;
}

/* At an inverse step s > 0, nothing pending: the owners share what their
 * layers cost them since the last share, in seconds a step (the
 * decompositions over inverse_every, plus the mean preconditioning), in
 * one allreduce (MAX: only the owner's is >= 0), and every rank re-runs
 * the greedy assignment with them: the formula, scaled to seconds by the
 * measured layers, for one never measured. The layers move when that takes
 * more than a tenth off the busiest rank's load. The inputs are the
 * all-reduced seconds, so every rank computes the same owners; which rank
 * decomposes and preconditions a layer changes no bit (the same LAPACK
 * and BLAS calls on the same bits). */
int tide__kfac_rebalance(tide_trainer_t *tr, tide__kfac_t *k) {
  size_t n = k->nlayers;
  double *cost = tide__malloc(n * sizeof *cost), *load = tide__malloc((size_t)k->ranks * sizeof *load);
  int *owner = tide__malloc(n * sizeof *owner);
  char *done = tide__malloc(n);
  int rc = cost == NULL || load == NULL || owner == NULL || done == NULL ? TIDE_ENOMEM : 0;
  if (rc != 0) rc = tide__trainer_fail(tr, rc, "K-FAC: out of memory for the layer owners");
  for (size_t i = 0; rc == 0 && i < n; i++) {
    layer_t *l = &k->layers[i];
    cost[i] = -1;
    if (l->owner == k->rank && (l->decomp_s > 0 || l->precond_n > 0))
      cost[i] = l->decomp_s / (double)k->config.inverse_every + (l->precond_n ? l->precond_s / l->precond_n : 0);
    if (l->owner == k->rank && k->fake_s != NULL) cost[i] = k->fake_s[i];
    l->decomp_s = l->precond_s = 0;
    l->precond_n = 0;
  }
  if (rc == 0 && (rc = tide_allreduce(tr->comm, cost, cost, n, TIDE_F64, TIDE_MAX)) != 0)
    rc = tide__trainer_fail(tr, rc, "K-FAC: allreduce of the layers' measured costs: %s",
                            tide_comm_last_error(tr->comm));
  double measured = 0, formula = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    layer_t *l = &k->layers[i];
    if (cost[i] >= 0) l->cost_s = cost[i];
    if (l->cost_s >= 0) measured += l->cost_s, formula += formula_cost(l);
  }
  if (rc != 0 || measured <= 0 || formula <= 0) goto out;
  double now = 0;
  memset(load, 0, (size_t)k->ranks * sizeof *load);
  for (size_t i = 0; i < n; i++) {
    const layer_t *l = &k->layers[i];
    cost[i] = l->cost_s >= 0 ? l->cost_s : formula_cost(l) * measured / formula;
    load[l->owner] += cost[i];
  }
  for (int r = 0; r < k->ranks; r++) now = fmax(now, load[r]);
  double after = greedy(cost, n, k->ranks, load, done, owner);
  int moved = 0;
  if (after < 0.9 * now) {
    for (size_t i = 0; rc == 0 && i < n; i++)
      if (owner[i] != k->layers[i].owner && (rc = move_layer(tr, k, i, owner[i])) == 0) moved++;
    size_t own = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
      if (mine(k, &k->layers[i]) || k->layers[i].spread) own += layer_floats(&k->layers[i]) + 1;
    float *send = rc == 0 ? tide__realloc(k->send, (own ? own : 1) * sizeof *send) : NULL;
    if (rc == 0 && send == NULL) rc = TIDE_ENOMEM;
    if (rc == TIDE_ENOMEM) rc = tide__trainer_fail(tr, rc, "K-FAC: out of memory moving layers to new owners");
    if (rc != 0) goto out;
    k->send = send;
    for (int r = 0; r < k->ranks; r++) k->counts[r] = tide__kfac_rank_floats(k, r);
  }
  if (k->rank == 0) { /* a move at INFO; the owners kept at DEBUG */
    char line[1024];
    int len = snprintf(line, sizeof line, "K-FAC: %d layer%s moved at step %ld by measured cost (busiest rank "
                       "%.3f ms a step, %s %.3f): owners", moved, moved == 1 ? "" : "s", tr->step,
                       1e3 * (moved ? after : now), moved ? "was" : "greedy", 1e3 * (moved ? now : after));
    for (size_t i = 0; i < n && len > 0 && (size_t)len < sizeof line; i++)
      len += snprintf(line + len, sizeof line - (size_t)len, "%s %s %d (%.3f ms)", i ? "," : "",
                      tr->tensors[k->layers[i].desc.weight].name, k->layers[i].owner, 1e3 * cost[i]);
    if (moved)
      TIDE_INFO("%s", line);
    else
      TIDE_DEBUG("%s", line);
  }
out:
  tide__free(cost);
  tide__free(load);
  tide__free(owner);
  tide__free(done);
  return rc;
}
