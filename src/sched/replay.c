/* One application of the Pollux traces as a live job replays it
 * (tools/tide-replay.c): its step time at a placement and micro-batch, the
 * progress a step of a given batch makes, and the progress that completes
 * it, the same figures the simulator (sim.c) uses. */
#include <math.h>

#include "sched/sched.h"
#include "tide.h"

struct tide_trace_app {
  tide__sim_app_t app;
};

int tide_trace_app_open(const char *traces_dir, const char *name, tide_trace_app_t **out) {
  if (traces_dir == NULL || name == NULL || out == NULL) {
    TIDE_ERROR("tide_trace_app_open: traces_dir, name and out must not be NULL");
    return TIDE_EINVAL;
  }
  tide_trace_app_t *a = tide__calloc(1, sizeof *a);
  if (a == NULL) return TIDE_ENOMEM;
  int rc = tide__sim_app_load(traces_dir, name, &a->app);
  if (rc != 0) {
    tide__free(a);
    return rc;
  }
  *out = a;
  return 0;
}

void tide_trace_app_close(tide_trace_app_t *app) {
  if (app == NULL) return;
  tide__sim_app_fini(&app->app);
  tide__free(app);
}

int tide_trace_app_limits(const tide_trace_app_t *app, tide_pollux_limits_t *out) {
  if (app == NULL || out == NULL) return TIDE_EINVAL;
  const tide__sim_app_t *a = &app->app;
  *out = (tide_pollux_limits_t){.base_batch = a->init_batch, .max_batch = a->max_batch,
                                .min_atomic = a->min_local, .max_atomic = a->max_local, .max_passes = 1 << 20};
  return 0;
}

int tide_trace_app_time(const tide_trace_app_t *app, const int *counts, int nodes, double local, double *step_s,
                        double *sync_s) {
  if (app == NULL || counts == NULL || nodes < 1 || !(local > 0) || step_s == NULL || sync_s == NULL) {
    TIDE_ERROR("tide_trace_app_time: needs an application, nodes >= 1 counts and a micro-batch > 0");
    return TIDE_EINVAL;
  }
  for (int n = 0; n < nodes; n++)
    if (counts[n] < 1) {
      TIDE_ERROR("tide_trace_app_time: counts[%d] = %d: every node used holds at least one worker", n, counts[n]);
      return TIDE_EINVAL;
    }
  tide__sim_app_time(&app->app, counts, nodes, local, step_s, sync_s);
  return 0;
}

/* The trace epoch progress falls in (0-based, at most the last). */
static int epoch_of(const tide__sim_app_t *a, double progress) {
  int e = 0;
  while (e + 1 < a->max_epochs && progress >= tide__sim_app_progress(a, e + 1)) e++;
  return e;
}

int tide_trace_app_noise(const tide_trace_app_t *app, double batch, double progress, double *grad_sqr,
                         double *grad_var) {
  if (app == NULL || !(batch > 0) || !(progress >= 0) || grad_sqr == NULL || grad_var == NULL) return TIDE_EINVAL;
  tide__sim_app_grad(&app->app, batch, epoch_of(&app->app, progress), grad_sqr, grad_var);
  return 0;
}

double tide_trace_app_gain(const tide_trace_app_t *app, double batch, double progress) {
  double sqr, var;
  if (tide_trace_app_noise(app, batch, progress, &sqr, &var) != 0) return NAN;
  double gain = tide_adascale_gain(var, sqr, batch / app->app.init_batch);
  return gain >= 1 ? gain : 1; /* as the simulator */
}

double tide_trace_app_total(const tide_trace_app_t *app) {
  return app == NULL ? NAN : tide__sim_app_progress(&app->app, app->app.max_epochs);
}
