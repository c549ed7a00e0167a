/* The cluster simulation (tide_cluster_simulate, src/plan/cluster.c) on
 * hand-made profiles whose idle spans can be worked out by hand: the
 * foreground and data-parallel rates, the background in the spans a plan
 * leaves, cut into pieces, the last span of an iteration joined to its
 * first; bad options refused. */
#include <math.h>
#include <stdio.h>

#include "harness.h"
#include "tide.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(a) + fabs(b)) + 1e-12; }

/* Layers with no parameters and no activations (no sync, no transfer) and
 * times[i] seconds at every batch. */
static tide_profile_t *profile(int n, const double *times) {
  tide_profile_t *p = NULL;
  CHECK_OK(tide_profile_create("toy", &p));
  for (int i = 0; i < n; i++) {
    tide_profile_layer_t l = {.ninputs = 1, .inputs = {i - 1}};
    snprintf(l.name, sizeof l.name, "l%d", i);
    CHECK_OK(tide_profile_add_layer(p, &l, NULL));
    for (int b = 1; b <= 4; b *= 2) CHECK_OK(tide_profile_set_time(p, i, b, times[i], 0));
  }
  return p;
}

static void simulate(const tide_profile_t *p, const int *widths, double piece, tide_cluster_result_t *r) {
  tide_plan_options_t o;
  tide_plan_options_init(&o);
  o.workers = 4, o.global_batch = 4, o.latency = 0;
  tide_plan_t *plan = NULL;
  CHECK_OK(tide_plan_evaluate(p, &o, widths, &plan));
  tide_cluster_options_t co;
  tide_cluster_options_init(&co);
  CHECK(co.piece == 0.5e-3);
  co.background = p;
  co.background_batch = 4;
  co.piece = piece;
  CHECK_OK(tide_cluster_simulate(p, &o, plan, &co, r));
  tide_plan_destroy(plan);
}

int main(void) {
  /* layer 0 on 4 ranks for 2 ms, layer 1 on rank 0 for 1.2 ms */
  const double two[2] = {2e-3, 1.2e-3};
  tide_profile_t *p = profile(2, two);
  tide_cluster_result_t r;
  simulate(p, (const int[]){4, 1}, 0, &r);
  double T = 3.2e-3, alone = 4 / 3.2e-3; /* the background: batch 4 in 3.2 ms on one accelerator */
  CHECK(near(r.iteration_time, T));
  CHECK(near(r.foreground_rate, 4 / T));
  CHECK(near(r.dp_iteration_time, T) && near(r.dp_rate, 4 / T)); /* times do not depend on the batch here */
  CHECK(near(r.background_per_accelerator, alone) && r.background_batch == 4);
  CHECK(near(r.usable_fraction, 3 * 1.2e-3 / (4 * T)) && near(r.idle_fraction, r.usable_fraction));
  CHECK(near(r.background_rate, 3 * 1.2e-3 / T * alone));
  CHECK(near(r.total_rate, r.foreground_rate + r.background_rate) && near(r.gain, r.total_rate / r.dp_rate));
  /* 0.5 ms pieces fill 1.0 ms of each 1.2 ms span */
  simulate(p, (const int[]){4, 1}, 0.5e-3, &r);
  CHECK(near(r.background_rate, 3 * 1.0e-3 / T * alone));
  /* data parallelism leaves nothing */
  simulate(p, (const int[]){4, 4}, 0.5e-3, &r);
  CHECK(r.background_rate == 0 && near(r.gain, 1.0));
  /* the background's default batch: its profiled batch with the most samples/s (all take 3.2 ms: 4) */
  tide_plan_options_t o;
  tide_plan_options_init(&o);
  o.workers = 4, o.global_batch = 4;
  tide_cluster_options_t co;
  tide_cluster_options_init(&co);
  co.background = p;
  CHECK_OK(tide_cluster_simulate(p, &o, NULL, &co, &r));
  CHECK(r.background_batch == 4);
  co.piece = -1;
  CHECK_RC(tide_cluster_simulate(p, &o, NULL, &co, &r), TIDE_EINVAL);
  co.piece = 0.5e-3, co.background_batch = -2;
  CHECK_RC(tide_cluster_simulate(p, &o, NULL, &co, &r), TIDE_EINVAL);
  CHECK_RC(tide_cluster_simulate(p, &o, NULL, NULL, &r), TIDE_EINVAL);
  /* a plan for 4 workers simulated on 2 */
  tide_plan_t *four = NULL;
  CHECK_OK(tide_plan_evaluate(p, &o, (const int[]){4, 1}, &four));
  o.workers = 2;
  co.background_batch = 0;
  CHECK_RC(tide_cluster_simulate(p, &o, four, &co, &r), TIDE_EINVAL);
  o.workers = 4;
  tide_plan_destroy(four);
  /* four workers on two cores: a layer on 4 workers takes twice as long,
   * one on 2 or 1 no longer (tide_plan_options_t.cores) */
  o.cores = 2;
  tide_plan_t *shared = NULL;
  CHECK_OK(tide_plan_evaluate(p, &o, (const int[]){4, 2}, &shared));
  CHECK(near(tide_plan_iteration_time(shared), 2 * 2e-3 + 1.2e-3));
  tide_plan_destroy(shared);
  o.cores = -1;
  CHECK_RC(tide_plan_evaluate(p, &o, (const int[]){4, 2}, &shared), TIDE_EINVAL);
  tide_profile_destroy(p);

  /* comm_idle: the background also runs during all-reduces, beside data
   * parallelism too. Each layer: 4 bytes of parameters, all-reduced by
   * recursive doubling on 4 ranks, 3 latencies of 1 ms. */
  tide_profile_t *q = NULL;
  CHECK_OK(tide_profile_create("toy", &q));
  for (int i = 0; i < 2; i++) {
    tide_profile_layer_t l = {.ninputs = 1, .inputs = {i - 1}, .param_bytes = 4};
    snprintf(l.name, sizeof l.name, "l%d", i);
    CHECK_OK(tide_profile_add_layer(q, &l, NULL));
    for (int b = 1; b <= 4; b *= 2) CHECK_OK(tide_profile_set_time(q, i, b, 2e-3, 0));
  }
  tide_plan_options_init(&o);
  o.workers = 4, o.global_batch = 4, o.latency = 1e-3, o.bandwidth = 1e15;
  tide_plan_t *dpq = NULL;
  CHECK_OK(tide_plan_evaluate(q, &o, (const int[]){4, 4}, &dpq));
  double Tq = tide_plan_iteration_time(dpq);
  CHECK(fabs(Tq - 2 * (2e-3 + 3e-3)) < 1e-9);
  tide_cluster_options_init(&co);
  co.background = q, co.background_batch = 4, co.piece = 0;
  CHECK_OK(tide_cluster_simulate(q, &o, dpq, &co, &r));
  CHECK(r.background_rate == 0 && r.dp_background_rate == 0); /* communication keeps them busy */
  co.comm_idle = 1;
  CHECK_OK(tide_cluster_simulate(q, &o, dpq, &co, &r));
  double alone_q = 4 / 4e-3; /* the background: batch 4 in 2 x 2 ms */
  CHECK(near(r.usable_fraction, 2 * 3e-3 / Tq)); /* every accelerator, both all-reduces */
  CHECK(near(r.background_rate, 4 * 2 * 3e-3 / Tq * alone_q));
  CHECK(near(r.dp_background_rate, r.background_rate)); /* the plan is data parallelism's */
  tide_plan_destroy(dpq);
  tide_profile_destroy(q);

  /* 1, 4, 1 ranks for 0.3, 2, 0.3 ms: ranks 1-3 idle 0.3 ms at the end of
   * an iteration and 0.3 ms at the start of the next, one 0.6 ms span that
   * takes one 0.5 ms piece (two separate spans would take none) */
  const double three[3] = {0.3e-3, 2e-3, 0.3e-3};
  p = profile(3, three);
  simulate(p, (const int[]){1, 4, 1}, 0.5e-3, &r);
  double T3 = 2.6e-3;
  CHECK(near(r.usable_fraction, 3 * 0.5e-3 / (4 * T3)));
  CHECK(near(r.idle_fraction, 3 * 0.6e-3 / (4 * T3)));
  /* no background profile: no background */
  tide_plan_options_init(&o);
  o.workers = 4, o.global_batch = 4;
  tide_cluster_options_init(&co);
  CHECK_OK(tide_cluster_simulate(p, &o, NULL, &co, &r));
  CHECK(r.background_rate == 0 && r.background_batch == 0);
  tide_profile_destroy(p);
  printf("test_cluster_sim: ok\n");
  return 0;
}
