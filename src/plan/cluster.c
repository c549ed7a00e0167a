/* Cluster simulation (DeepPool's multiplexing; docs/burst-parallel.md): a
 * foreground job runs a plan on W accelerators, iteration after iteration;
 * a background job fills the spans in which an accelerator has no
 * foreground work, in pieces that never delay the foreground. Driven by the
 * plan's per-layer costs (the planner's model: profiles and network
 * constants) and the background's profile.
 *
 * One iteration's timeline: layer after layer, the transfer into a layer
 * (busy: the ranks below the wider of the two widths), then its compute and
 * gradient all-reduce (busy: the ranks below its width). Whatever else is
 * idle; the timeline repeats, so an accelerator's last idle span of an
 * iteration joins its first. The conservative reading: communication keeps
 * its accelerators busy (on a GPU the collectives take compute units too),
 * so data parallelism leaves nothing to a background job.
 *
 * Not the scheduler's simulator (src/sched/sim.c): that one replays job
 * arrivals and allocations over hours of a trace at scheduling intervals;
 * this one is inside one iteration of one job. They share nothing but the
 * word. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

void tide_cluster_options_init(tide_cluster_options_t *o) {
  if (o == NULL) return;
  *o = (tide_cluster_options_t){.background = NULL, .background_batch = 0, .piece = 0.5e-3, .comm_idle = 0};
}

/* What pieces of length `piece` fill of an idle span g. */
static double fill(double g, double piece) {
  if (piece <= 0) return g;
  return piece * floor(g / piece * (1 + 1e-12));
}

/* Background samples/s on one accelerator at per-accelerator batch b. */
static double background_rate(const tide_profile_t *p, int b) {
  double t = 0;
  for (int i = 0; i < tide_profile_layer_count(p); i++) t += tide_profile_time(p, i, b);
  return t > 0 ? b / t : 0;
}

/* Usable background seconds per iteration on one accelerator that is busy
 * wherever a segment's `busy` width exceeds rank. */
static double usable_for_rank(const double *len, const int *busy, int nseg, int rank, double period, double piece) {
  double first = -1, run = 0, used = 0;
  int any_busy = 0;
  for (int s = 0; s < nseg; s++) {
    if (rank < busy[s]) {
      if (!any_busy) first = run; /* the span before the first busy segment */
      else used += fill(run, piece);
      any_busy = 1;
      run = 0;
    } else {
      run += len[s];
    }
  }
  if (!any_busy) return period; /* never busy: the background runs throughout */
  return used + fill(run + first, piece);
}

/* Usable background seconds per iteration of plan over all W accelerators.
 * Segments, layer after layer: the transfer into it (its accelerators: those
 * below the wider of the widths), its compute (below its width), its
 * all-reduce (below its width); communication keeps its accelerators busy
 * unless copts->comm_idle. len and busy hold 3 n + 1 entries. */
static double plan_usable(const tide_profile_t *p, const tide_plan_t *plan, int W, const tide_cluster_options_t *copts,
                          double *len, int *busy) {
  const tide_plan_layer_t *L;
  int n = tide_plan_layers(plan, &L), nseg = 0, comm = copts->comm_idle ? 0 : 1;
  for (int i = 0; i < n; i++) {
    const tide_profile_layer_t *pl = tide_profile_layer(p, i);
    if (L[i].transfer > 0) {
      int wide = L[i].width;
      for (int k = 0; k < pl->ninputs; k++)
        if (pl->inputs[k] >= 0 && L[pl->inputs[k]].width > wide) wide = L[pl->inputs[k]].width;
      len[nseg] = L[i].transfer, busy[nseg++] = comm * wide;
    }
    len[nseg] = L[i].compute, busy[nseg++] = L[i].width;
    if (L[i].sync > 0) len[nseg] = L[i].sync, busy[nseg++] = comm * L[i].width;
  }
  double T = tide_plan_iteration_time(plan), usable = 0;
  /* ranks in [2^k, 2^(k+1)) are busy in the same segments */
  for (int lo = 0, hi = 1; lo < W; lo = hi, hi *= 2)
    usable += (hi - lo) * usable_for_rank(len, busy, nseg, lo, T, copts->piece);
  return usable;
}

int tide_cluster_simulate(const tide_profile_t *p, const tide_plan_options_t *opts, const tide_plan_t *plan,
                          const tide_cluster_options_t *copts, tide_cluster_result_t *out) {
  if (p == NULL || opts == NULL || copts == NULL || out == NULL) {
    TIDE_ERROR("tide_cluster_simulate: %s must not be NULL", p == NULL ? "profile" : opts == NULL ? "options"
                                                              : copts == NULL ? "cluster options" : "out");
    return TIDE_EINVAL;
  }
  if (!(copts->piece >= 0) || !isfinite(copts->piece)) {
    TIDE_ERROR("tide_cluster_simulate: piece = %g must be a number of seconds >= 0 (DeepPool: 0.5e-3)", copts->piece);
    return TIDE_EINVAL;
  }
  if (copts->background_batch < 0) {
    TIDE_ERROR("tide_cluster_simulate: background_batch = %d must be >= 1, or 0 for the background profile's most "
               "efficient batch", copts->background_batch);
    return TIDE_EINVAL;
  }
  tide_plan_t *own = NULL, *dp = NULL;
  int rc, n = tide_profile_layer_count(p), W = opts->workers;
  if (plan == NULL) TIDE_CHECK(tide_plan_create(p, opts, &own));
  const tide_plan_t *fg = plan != NULL ? plan : own;
  tide_plan_options_t od = *opts;
  od.data_parallel = 1;
  double *len = tide__malloc((size_t)(3 * n + 1) * sizeof *len);
  int *busy = tide__malloc((size_t)(3 * n + 1) * sizeof *busy);
  if (len == NULL || busy == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  if ((rc = tide_plan_create(p, &od, &dp)) != 0) goto out;
  const tide_plan_layer_t *L;
  if (tide_plan_layers(fg, &L) != n) {
    TIDE_ERROR("tide_cluster_simulate: the plan has a different number of layers from the profile");
    rc = TIDE_EINVAL;
    goto out;
  }
  for (int i = 0; i < n; i++)
    if (L[i].width > W) {
      TIDE_ERROR("tide_cluster_simulate: layer %d of the plan runs on %d workers but the options have %d: simulate "
                 "the plan with the options it was made with", i, L[i].width, W);
      rc = TIDE_EINVAL;
      goto out;
    }
  double T = tide_plan_iteration_time(fg), Td = tide_plan_iteration_time(dp);
  double usable = plan_usable(p, fg, W, copts, len, busy), usable_dp = plan_usable(p, dp, W, copts, len, busy);
  const tide_profile_t *bg = copts->background;
  int bb = copts->background_batch;
  double per_acc = 0;
  if (bg != NULL) {
    if ((rc = tide__profile_check(bg, "tide_cluster_simulate (background)")) != 0) goto out;
    if (bb == 0) {
      const int *batches;
      int nb = tide_profile_batches(bg, &batches);
      for (int k = 0; k < nb; k++)
        if (background_rate(bg, batches[k]) > per_acc) per_acc = background_rate(bg, batches[k]), bb = batches[k];
    } else {
      per_acc = background_rate(bg, bb);
    }
  }
  tide_cluster_result_t r = {.workers = W, .background_batch = bg != NULL ? bb : 0};
  r.iteration_time = T;
  r.dp_iteration_time = Td;
  r.foreground_rate = opts->global_batch / T;
  r.dp_rate = opts->global_batch / r.dp_iteration_time;
  r.idle_fraction = 1.0 - tide_plan_worker_time(fg) / (W * T);
  r.usable_fraction = usable / (W * T);
  r.background_per_accelerator = per_acc;
  r.background_rate = usable / T * per_acc;
  r.total_rate = r.foreground_rate + r.background_rate;
  r.gain = r.total_rate / r.dp_rate;
  r.dp_background_rate = usable_dp / Td * per_acc;
  *out = r;
  rc = 0;
out:
  tide__free(len);
  tide__free(busy);
  tide_plan_destroy(own);
  tide_plan_destroy(dp);
  return rc;
}
