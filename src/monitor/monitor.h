/* Internal side of the monitor: the debiased moving averages behind the
 * noise scale and the gain ratio, shared by the trainer and the policies.
 * Pure computation. */
#ifndef TIDE_MONITOR_H
#define TIDE_MONITOR_H

#include "core/core.h"

/* A debiased exponential moving average: value = sum / weight, where each
 * update keeps `keep` of both (AdaptDL's form), so early values are not
 * pulled towards zero. */
typedef struct {
  double sum, weight;
} tide__ema_t;

void tide__ema_update(tide__ema_t *ema, double x, double keep);
/* NaN before the first update. */
double tide__ema_value(const tide__ema_t *ema);

/* The noise-scale estimator: |G|^2 and tr(Sigma) averaged separately;
 * with the second moment of the |G|^2 estimates and the sum of the
 * squared weights, the variance of the averaged |G|^2 (for the ratio's
 * bias correction). */
typedef struct {
  tide__ema_t grad_sq, trace_sigma, grad_sq2;
  double weight2; /* sum of the squared weights of grad_sq's average */
  long samples;   /* estimates taken */
} tide__gns_t;

/* One step's estimate from n >= 2 micro-batch gradients of b samples each:
 * sq_small = their mean squared norm, sq_big = the squared norm of their
 * mean. keep is the averages' per-step factor. Non-finite input is
 * skipped (returns 0 without updating). */
void tide__gns_update(tide__gns_t *gns, double b, double n, double sq_small, double sq_big, double keep);
/* Smoothed |G|^2 and tr(Sigma) (clamped >= 0); NaN before the first
 * estimate. |G|^2 is the one whose reciprocal is right to first order:
 * with g the average and v its variance (from the estimates' spread and
 * the weights), (g^2 + v) / g, since 1/g of a noisy g is biased upward by
 * v/g^2 (0 for g <= 0). */
double tide__gns_grad_sq(const tide__gns_t *gns);
double tide__gns_trace_sigma(const tide__gns_t *gns);
/* B_simple = tr(Sigma) / |G|^2 of the smoothed values; NaN when unknown,
 * +Inf when |G|^2 is 0. */
double tide__gns_noise_scale(const tide__gns_t *gns);

/* min, median and max of x[0..n) (n >= 1) and the index of the max; x is
 * not changed (scratch of n doubles is used). */
void tide__spread(const double *x, int n, double *scratch, double *min, double *median, double *max,
                  int *argmax);

#endif
