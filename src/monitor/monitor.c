/* The monitor's formulas: McCandlish et al.'s noise scale, AdaScale's gain
 * ratio, Pollux's efficiency and throughput model (docs/adaptation.md has
 * the derivations and the references' test vectors). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "monitor/monitor.h"

int tide_gns_estimate(double b_small, double b_big, double sq_small, double sq_big, double *grad_sq,
                      double *trace_sigma) {
  if (!(b_small >= 1 && b_big > b_small && isfinite(b_big))) {
    TIDE_ERROR("tide_gns_estimate: batch sizes must satisfy 1 <= b_small (%g) < b_big (%g)", b_small, b_big);
    return TIDE_EINVAL;
  }
  if (!(sq_small >= 0 && sq_big >= 0 && isfinite(sq_small) && isfinite(sq_big))) {
    TIDE_ERROR("tide_gns_estimate: squared norms must be finite and >= 0, got sq_small %g and sq_big %g", sq_small,
               sq_big);
    return TIDE_EINVAL;
  }
  if (grad_sq != NULL) *grad_sq = (b_big * sq_big - b_small * sq_small) / (b_big - b_small);
  if (trace_sigma != NULL) *trace_sigma = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big);
  return 0;
}

double tide_adascale_gain(double var, double sqr, double scale) {
  if (isnan(var) || isnan(sqr) || !(scale >= 1)) return NAN;
  if (var < 1e-6) var = 1e-6; /* AdaptDL's floor (spec §6) */
  if (sqr < 0) sqr = 0;
  if (isinf(var)) return scale;
  return (var + sqr) / (var / scale + sqr);
}

double tide_pollux_efficiency(double phi, double base_batch, double batch) {
  if (!(phi >= 0 && base_batch > 0 && batch > 0)) return NAN;
  if (isinf(phi)) return 1.0;
  return (phi + base_batch) / (phi + batch);
}

double tide_pollux_throughput(const tide_pollux_model_t *p, int nodes, int replicas, double atomic, int accum) {
  if (p == NULL || nodes < 1 || replicas < nodes || !(atomic > 0) || accum < 0 || !(p->gamma >= 1))
    return NAN;
  double t_acc = p->alpha_c + p->beta_c * atomic, extra = replicas > 2 ? replicas - 2 : 0, t_net = 0;
  if (nodes > 1)
    t_net = p->alpha_n + p->beta_n * extra;
  else if (replicas > 1)
    t_net = p->alpha_r + p->beta_r * extra;
  double t_opt = pow(pow(t_acc, p->gamma) + pow(t_net, p->gamma), 1.0 / p->gamma);
  double t_iter = accum * t_acc + t_opt;
  return (double)replicas * atomic * (accum + 1) / t_iter;
}

void tide__ema_update(tide__ema_t *ema, double x, double keep) {
  ema->sum = keep * ema->sum + (1 - keep) * x;
  ema->weight = keep * ema->weight + (1 - keep);
}

double tide__ema_value(const tide__ema_t *ema) { return ema->weight > 0 ? ema->sum / ema->weight : NAN; }

void tide__gns_update(tide__gns_t *gns, double b, double n, double sq_small, double sq_big, double keep) {
  double grad_sq, trace_sigma;
  if (!(n >= 2) || !isfinite(sq_small) || !isfinite(sq_big)) return;
  if (tide_gns_estimate(b, b * n, sq_small, sq_big, &grad_sq, &trace_sigma) != 0) return;
  tide__ema_update(&gns->grad_sq, grad_sq, keep);
  tide__ema_update(&gns->grad_sq2, grad_sq * grad_sq, keep);
  gns->weight2 = keep * keep * gns->weight2 + (1 - keep) * (1 - keep);
  tide__ema_update(&gns->trace_sigma, trace_sigma, keep);
  gns->samples++;
}

double tide__gns_grad_sq(const tide__gns_t *gns) {
  double g = tide__ema_value(&gns->grad_sq);
  if (!(g > 0)) return isnan(g) ? g : 0;
  /* The average's variance: the estimates' (weighted, made unbiased by
   * n/(n-1) with n = the weights' effective count) times sum w^2 / (sum w)^2. */
  double w = gns->grad_sq.weight, n = w * w / gns->weight2, spread = tide__ema_value(&gns->grad_sq2) - g * g;
  double v = n > 1 && spread > 0 ? spread * n / (n - 1) / n : 0;
  return g + v / g;
}

double tide__gns_trace_sigma(const tide__gns_t *gns) {
  double v = tide__ema_value(&gns->trace_sigma);
  return v < 0 ? 0 : v;
}

double tide__gns_noise_scale(const tide__gns_t *gns) {
  double g = tide__gns_grad_sq(gns), s = tide__gns_trace_sigma(gns);
  if (isnan(g) || isnan(s)) return NAN;
  return g > 0 ? s / g : INFINITY;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void tide__spread(const double *x, int n, double *scratch, double *min, double *median, double *max, int *argmax) {
  int at = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[at]) at = i;
  memcpy(scratch, x, (size_t)n * sizeof *x);
  qsort(scratch, (size_t)n, sizeof *scratch, by_value);
  *min = scratch[0];
  *max = scratch[n - 1];
  *median = n % 2 ? scratch[n / 2] : (scratch[n / 2 - 1] + scratch[n / 2]) / 2;
  *argmax = at;
}
