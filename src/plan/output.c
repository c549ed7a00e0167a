/* The planner's plots: width per layer, and iteration time and worker-time
 * as the amplification limit varies (gnuplot, when it is on PATH). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "plan/plan.h"

static FILE *open_in(const char *prefix, const char *suffix, char *path, size_t len) {
  snprintf(path, len, "%s%s", prefix, suffix);
  FILE *f = fopen(path, "w");
  if (f == NULL) TIDE_ERROR("tide_plan_plot: cannot write %s: %s", path, strerror(errno));
  return f;
}

static const double sweep_limits[] = {1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 64.0};

int tide_plan_plot(const tide_plan_t *plan, const tide_profile_t *p, const tide_plan_options_t *opts,
                   const char *prefix, int *plotted) {
  if (plan == NULL || p == NULL || opts == NULL || prefix == NULL) {
    TIDE_ERROR("tide_plan_plot: plan, profile, options and prefix must not be NULL");
    return TIDE_EINVAL;
  }
  if (plotted != NULL) *plotted = 0;
  char path[4096];
  int rc = 0;
  const tide_plan_layer_t *layers;
  int n = tide_plan_layers(plan, &layers);
  FILE *f = open_in(prefix, "-widths.dat", path, sizeof path);
  if (f == NULL) return TIDE_EIO;
  fprintf(f, "# layer width compute_s sync_s transfer_s amplification\n");
  for (int i = 0; i < n; i++)
    fprintf(f, "%d %d %.9g %.9g %.9g %.9g\n", i, layers[i].width, layers[i].compute, layers[i].sync,
            layers[i].transfer, layers[i].amplification);
  if (fclose(f) != 0) return TIDE_EIO;
  /* the sweep over the limit, with data parallelism beside it */
  tide_plan_options_t o = *opts;
  o.data_parallel = 1;
  tide_plan_t *dp = NULL;
  TIDE_CHECK(tide_plan_create(p, &o, &dp));
  double dp_t = tide_plan_iteration_time(dp), dp_w = tide_plan_worker_time(dp);
  tide_plan_destroy(dp);
  f = open_in(prefix, "-sweep.dat", path, sizeof path);
  if (f == NULL) return TIDE_EIO;
  fprintf(f, "# limit iteration_s worker_s dp_iteration_s dp_worker_s\n");
  o.data_parallel = 0;
  for (size_t k = 0; k < sizeof sweep_limits / sizeof *sweep_limits && rc == 0; k++) {
    tide_plan_t *q = NULL;
    o.amplification = sweep_limits[k];
    rc = tide_plan_create(p, &o, &q);
    if (rc == 0)
      fprintf(f, "%g %.9g %.9g %.9g %.9g\n", sweep_limits[k], tide_plan_iteration_time(q), tide_plan_worker_time(q),
              dp_t, dp_w);
    tide_plan_destroy(q);
  }
  if (fclose(f) != 0 && rc == 0) rc = TIDE_EIO;
  if (rc != 0) return rc;
  const char *base = strrchr(prefix, '/');
  base = base ? base + 1 : prefix;
  f = open_in(prefix, ".gp", path, sizeof path);
  if (f == NULL) return TIDE_EIO;
  fprintf(f,
          "set terminal pngcairo size 1000,420\nset output '%s-widths.png'\n"
          "set title 'width per layer (%s, W = %d, B = %d, amplification <= %g)'\n"
          "set xlabel 'layer'\nset ylabel 'workers'\nset logscale y 2\nset yrange [0.8:%d]\nset style fill solid 0.6\n"
          "plot '%s-widths.dat' using 1:2 with boxes notitle\n",
          base, tide_profile_model(p), opts->workers, opts->global_batch, opts->amplification,
          opts->workers * 2, base);
  fprintf(f,
          "reset\nset terminal pngcairo size 1000,420\nset output '%s-sweep.png'\n"
          "set title 'plan against data parallelism as the amplification limit varies'\n"
          "set xlabel 'amplification limit'\nset logscale x 2\nset ylabel 'iteration time (ms)'\n"
          "set y2label 'worker-time (worker-ms)'\nset ytics nomirror\nset y2tics\nset key outside right\n"
          "plot '%s-sweep.dat' using 1:($2*1e3) with linespoints title 'plan: iteration', "
          "'' using 1:($4*1e3) with lines dt 2 title 'DP: iteration', "
          "'' using 1:($3*1e3) axes x1y2 with linespoints title 'plan: worker-time', "
          "'' using 1:($5*1e3) axes x1y2 with lines dt 3 title 'DP: worker-time'\n",
          base, base);
  if (fclose(f) != 0) return TIDE_EIO;
  char dir[4096], script[4096];
  snprintf(dir, sizeof dir, "%.*s", base == prefix ? 1 : (int)(base - prefix), base == prefix ? "." : prefix);
  snprintf(script, sizeof script, "%s.gp", base);
  if (tide__gnuplot(dir, script) > 0 && plotted != NULL) *plotted = 1;
  return 0;
}
