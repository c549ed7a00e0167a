/* The step's building blocks outside the trainer: the float scale kernels
 * (src/core/simd.c) against a scalar double reference, and the step
 * monitor (src/monitor/step.c): slots packed on 3 ranks and summed by hand
 * give the figures of the sum, the noise-scale estimate of the two-batch
 * formula, and the straggler averages. */
#include <math.h>
#include <string.h>

#include "core/simd.h"
#include "harness.h"
#include "monitor/step.h"

static void check_kernels(void) {
  const size_t sizes[] = {0, 1, 7, 8, 9, 4095, 4096, 4097, 10001};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    float *g = malloc((n + 1) * sizeof *g), *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y);
    uint64_t seed = 12345 + n;
    for (size_t i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      g[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5);
      y[i] = g[i] * 0.25f;
    }
    double ref_g = 0;
    for (size_t i = 0; i < n; i++) ref_g += (double)g[i] * g[i];
    /* set: x = 3 g; add: x += 0.5 g; both return |g|^2 */
    double sq = tide__scale_into(x, g, n, 3.0f, 0);
    CHECK(fabs(sq - ref_g) <= 1e-6 * (ref_g + 1));
    for (size_t i = 0; i < n; i++) CHECK(x[i] == g[i] * 3.0f);
    sq = tide__scale_into(x, g, n, 0.5f, 1);
    CHECK(fabs(sq - ref_g) <= 1e-6 * (ref_g + 1));
    for (size_t i = 0; i < n; i++) CHECK(x[i] == g[i] * 3.0f + g[i] * 0.5f);
    /* in place: y *= 2, returns |y|^2 after */
    sq = tide__scale_in_place(y, n, 2.0f);
    double ref_y = 0;
    for (size_t i = 0; i < n; i++) {
      CHECK(y[i] == g[i] * 0.25f * 2.0f);
      ref_y += (double)y[i] * y[i];
    }
    CHECK(fabs(sq - ref_y) <= 1e-6 * (ref_y + 1));
    free(g);
    free(x);
    free(y);
  }
}

static void check_monitor(void) {
  enum { RANKS = 3 };
  tide__step_monitor_t m[RANKS];
  float slots[RANKS][64], sum[64] = {0};
  for (int r = 0; r < RANKS; r++) {
    CHECK_OK(tide__step_monitor_init(&m[r], RANKS, 2, 1));
    CHECK(m[r].nslots == TIDE__SLOT_TIMES + RANKS + 2);
    tide__step_monitor_begin(&m[r]);
    /* two full micro-batches of 4 samples, |g|^2 = 2 and 4, per tensor 1+1 and 3+1 */
    m[r].tensor_sq[0] = 1 + 3;
    m[r].tensor_sq[1] = 1 + 1;
    tide__step_monitor_micro(&m[r], 4, 1.0 + r, 2, 1);
    tide__step_monitor_micro(&m[r], 4, 1.0 + r, 4, 1);
    m[r].compute_s = 0.1 * (r + 1);
    tide__step_monitor_pack(&m[r], slots[r], r, r == 0 ? 1.0f : 0.0f);
    for (size_t i = 0; i < m[r].nslots; i++) sum[i] += slots[r][i];
  }
  CHECK(sum[TIDE__SLOT_COUNT] == 24);
  CHECK(sum[TIDE__SLOT_FULL_MICRO] == 6);
  CHECK(sum[TIDE__SLOT_GUARD] == 1);
  tide_step_stats_t s;
  memset(&s, 0, sizeof s);
  m[0].tensor_sq[0] = 0.5; /* |G_big|^2 per tensor, as the row's average leaves it */
  m[0].tensor_sq[1] = 0.25;
  tide__step_read_t in = {0.75, 0, 4, 2, 12, 0.97};
  tide__step_monitor_read(&m[0], sum, &in, &s);
  CHECK(s.global_batch == 24);
  CHECK(fabs(s.loss - (4 * 2 * (1 + 2 + 3)) / 24.0) < 1e-6);
  CHECK(s.scale == 2);
  CHECK(s.slowest_rank == 2);
  CHECK(fabs(s.compute_median_s - 0.2) < 1e-6 && fabs(s.compute_max_s - 0.3) < 1e-6);
  /* one estimate: the two-batch formula on b = 4, B = 24 */
  double grad_sq, trace_sigma;
  CHECK_OK(tide_gns_estimate(4, 24, 3.0, 0.75, &grad_sq, &trace_sigma));
  CHECK(fabs(s.trace_sigma - trace_sigma) <= 1e-9 * fabs(trace_sigma) + 1e-12);
  CHECK(isfinite(s.noise_scale));
  /* a combined exchange gives no estimate */
  tide__step_monitor_t fresh;
  CHECK_OK(tide__step_monitor_init(&fresh, RANKS, 2, 1));
  in.combined = 1;
  tide__step_monitor_read(&fresh, sum, &in, &s);
  CHECK(isnan(s.noise_scale));
  tide__step_monitor_fini(&fresh);
  /* resize keeps the averages and sizes the slots for the new count */
  tide__gns_t kept = m[0].gns;
  CHECK_OK(tide__step_monitor_resize(&m[0], 5));
  CHECK(m[0].nslots == TIDE__SLOT_TIMES + 5 + 2);
  CHECK(memcmp(&kept, &m[0].gns, sizeof kept) == 0);
  for (int r = 0; r < RANKS; r++) tide__step_monitor_fini(&m[r]);
  /* stragglers: rank 2 at half the median's speed drops below 0.8 after a
   * few steps; rank 0 is never flagged */
  double ewma[4] = {1, 1, 1, 1}, times[4] = {0.2, 0.1, 0.2, 0.1};
  int flagged = -1, steps = 0;
  while (flagged < 0 && steps < 50) flagged = tide__straggler_update(ewma, times, 4, 0.1, 0.3, 0.8), steps++;
  CHECK(flagged == 2);
  CHECK(ewma[1] == 1 && ewma[0] < 0.8);
}

int main(void) {
  check_kernels();
  check_monitor();
  return 0;
}
