/* The applications of the Pollux paper's simulator traces
 * (../shared/data/pollux-osdi21/README.md): step times per placement and
 * per-worker batch, and per-epoch progress and noise statistics per global
 * batch. Placements measured are looked up by their digits (ascending:
 * which node is which does not matter); others are interpolated linearly
 * over nodes, then replicas, then the per-worker batch. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

typedef struct {
  int nodes, replicas;
  char key[16];
  double local, step, sync;
} row_t;

typedef struct {
  row_t *rows;
  int n, cap;
} rows_t;

static int rows_add(rows_t *r, row_t row) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 256;
    row_t *p = tide__realloc(r->rows, (size_t)cap * sizeof *p);
    if (p == NULL) return TIDE_ENOMEM;
    r->rows = p;
    r->cap = cap;
  }
  r->rows[r->n++] = row;
  return 0;
}

static FILE *open_csv(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) TIDE_ERROR("sim: cannot read %s: %s", path, strerror(errno));
  return f;
}

/* Reads the numbers of one CSV line into v[0..want); the first field may be
 * text (placement digits) when key != NULL. */
static int parse_line(const char *path, int line, char *text, double *v, int want, char *key, size_t keylen) {
  char *save = NULL, *field = strtok_r(text, ",\r\n", &save);
  for (int i = 0; i < want; i++) {
    if (field == NULL) {
      TIDE_ERROR("sim: %s:%d: %d fields, expected %d", path, line, i, want);
      return TIDE_EINVAL;
    }
    if (i == 0 && key != NULL) {
      size_t len = strlen(field);
      if (len == 0 || len >= keylen || strspn(field, "0123456789") != len) {
        TIDE_ERROR("sim: %s:%d: placement '%s' is not a string of digits", path, line, field);
        return TIDE_EINVAL;
      }
      strcpy(key, field);
    } else {
      char *end;
      v[i] = strtod(field, &end);
      if (end == field || *end != 0 || !isfinite(v[i])) {
        TIDE_ERROR("sim: %s:%d: field %d '%s' is not a number", path, line, i + 1, field);
        return TIDE_EINVAL;
      }
    }
    field = strtok_r(NULL, ",\r\n", &save);
  }
  return 0;
}

static int by_local(const void *a, const void *b) {
  const tide__sim_point_t *x = a, *y = b;
  return x->local < y->local ? -1 : x->local > y->local;
}

/* Sorts a curve's points and averages those at the same batch. */
static void curve_finish(tide__sim_curve_t *c) {
  qsort(c->points, (size_t)c->npoints, sizeof *c->points, by_local);
  int out = 0;
  for (int i = 0; i < c->npoints;) {
    int k = i;
    tide__sim_point_t sum = {c->points[i].local, 0, 0};
    while (k < c->npoints && c->points[k].local == c->points[i].local) {
      sum.step += c->points[k].step;
      sum.sync += c->points[k].sync;
      k++;
    }
    sum.step /= k - i;
    sum.sync /= k - i;
    c->points[out++] = sum;
    i = k;
  }
  c->npoints = out;
}

/* Groups rows into curves by key (exact) or by (nodes, replicas). */
static int make_curves(const rows_t *rows, int exact, tide__sim_curve_t **out, int *nout) {
  tide__sim_curve_t *curves = NULL;
  int n = 0;
  for (int i = 0; i < rows->n; i++) {
    const row_t *r = &rows->rows[i];
    int at = 0;
    for (; at < n; at++)
      if (exact ? strcmp(curves[at].key, r->key) == 0
                : curves[at].nodes == r->nodes && curves[at].replicas == r->replicas)
        break;
    if (at == n) {
      tide__sim_curve_t *p = tide__realloc(curves, (size_t)(n + 1) * sizeof *p);
      if (p == NULL) goto nomem;
      curves = p;
      curves[n] = (tide__sim_curve_t){.nodes = r->nodes, .replicas = r->replicas};
      if (exact) strcpy(curves[n].key, r->key);
      n++;
    }
    tide__sim_curve_t *c = &curves[at];
    tide__sim_point_t *pts = tide__realloc(c->points, (size_t)(c->npoints + 1) * sizeof *pts);
    if (pts == NULL) goto nomem;
    c->points = pts;
    c->points[c->npoints++] = (tide__sim_point_t){r->local, r->step, r->sync};
  }
  for (int i = 0; i < n; i++) curve_finish(&curves[i]);
  *out = curves;
  *nout = n;
  return 0;
nomem:
  for (int i = 0; i < n; i++) tide__free(curves[i].points);
  tide__free(curves);
  return TIDE_ENOMEM;
}

static int by_char(const void *a, const void *b) { return *(const char *)a - *(const char *)b; }

static int read_times(const char *path, int placements, rows_t *rows) {
  FILE *f = open_csv(path);
  if (f == NULL) return errno == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  char *line = NULL;
  size_t cap = 0;
  int rc = 0, no = 0;
  while (getline(&line, &cap, f) > 0) {
    no++;
    if (no == 1 || line[strspn(line, " \r\n")] == 0) continue;
    double v[5];
    row_t r = {0};
    if (placements) {
      rc = parse_line(path, no, line, v, 4, r.key, sizeof r.key);
      if (rc != 0) break;
      r.nodes = (int)strlen(r.key);
      for (int i = 0; i < r.nodes; i++) r.replicas += r.key[i] - '0';
      qsort(r.key, (size_t)r.nodes, 1, by_char);
      r.local = v[1], r.step = v[2], r.sync = v[3];
    } else {
      rc = parse_line(path, no, line, v, 5, NULL, 0);
      if (rc != 0) break;
      r.nodes = (int)v[0], r.replicas = (int)v[1], r.local = v[2], r.step = v[3], r.sync = v[4];
    }
    if (r.nodes < 1 || r.replicas < r.nodes || !(r.local > 0) || !(r.step > 0) || !(r.sync >= 0)) {
      TIDE_ERROR("sim: %s:%d: nodes %d, replicas %d, batch %g, step %g, sync %g out of range", path, no, r.nodes,
                 r.replicas, r.local, r.step, r.sync);
      rc = TIDE_EINVAL;
      break;
    }
    rc = rows_add(rows, r);
    if (rc != 0) break;
  }
  free(line);
  fclose(f);
  if (rc == 0 && no < 2) {
    TIDE_ERROR("sim: %s has no measurements", path);
    rc = TIDE_EINVAL;
  }
  return rc;
}

static int read_validation(const char *path, tide__sim_validation_t *v) {
  FILE *f = open_csv(path);
  if (f == NULL) return TIDE_EIO;
  char *line = NULL;
  size_t cap = 0;
  int rc = 0, no = 0, n = 0, room = 0;
  while (getline(&line, &cap, f) > 0) {
    no++;
    if (no == 1 || line[strspn(line, " \r\n")] == 0) continue;
    double x[5];
    rc = parse_line(path, no, line, x, 5, NULL, 0);
    if (rc != 0) break;
    if (!(x[0] >= 0) || !(x[3] >= 0) || !(x[4] >= 0) || (n > 0 && x[0] < v->progress[n - 1])) {
      TIDE_ERROR("sim: %s:%d: progress %g (not below the last), grad_sqr %g and grad_var %g must be >= 0", path, no,
                 x[0], x[3], x[4]);
      rc = TIDE_EINVAL;
      break;
    }
    if (n == room) {
      room = room ? 2 * room : 128;
      double *p = tide__realloc(v->progress, (size_t)room * sizeof *p);
      double *s = p ? tide__realloc(v->grad_sqr, (size_t)room * sizeof *s) : NULL;
      if (p) v->progress = p;
      if (s) v->grad_sqr = s;
      double *g = s ? tide__realloc(v->grad_var, (size_t)room * sizeof *g) : NULL;
      if (g) v->grad_var = g;
      if (!p || !s || !g) {
        rc = TIDE_ENOMEM;
        break;
      }
    }
    v->progress[n] = x[0], v->grad_sqr[n] = x[3], v->grad_var[n] = x[4];
    n++;
  }
  free(line);
  fclose(f);
  v->epochs = n;
  if (rc == 0 && n == 0) {
    TIDE_ERROR("sim: %s has no epochs", path);
    rc = TIDE_EINVAL;
  }
  return rc;
}

static int by_batch(const void *a, const void *b) {
  const tide__sim_validation_t *x = a, *y = b;
  return x->batch < y->batch ? -1 : x->batch > y->batch;
}

void tide__sim_app_fini(tide__sim_app_t *app) {
  if (app == NULL) return;
  for (int i = 0; i < app->nexact; i++) tide__free(app->exact[i].points);
  for (int i = 0; i < app->ngroups; i++) tide__free(app->groups[i].points);
  for (int i = 0; i < app->nvalidation; i++) {
    tide__free(app->validation[i].progress);
    tide__free(app->validation[i].grad_sqr);
    tide__free(app->validation[i].grad_var);
  }
  tide__free(app->exact);
  tide__free(app->groups);
  tide__free(app->validation);
  memset(app, 0, sizeof *app);
}

int tide__sim_app_load(const char *dir, const char *name, tide__sim_app_t *app) {
  memset(app, 0, sizeof *app);
  if (strlen(name) >= sizeof app->name || strchr(name, '/') != NULL) {
    TIDE_ERROR("sim: application name '%s' is not a traces folder name", name);
    return TIDE_EINVAL;
  }
  strcpy(app->name, name);
  char path[4096];
  rows_t placed = {0}, all = {0};
  int rc;
  snprintf(path, sizeof path, "%s/%s/placements.csv", dir, name);
  TIDE_CHECK_GOTO(read_times(path, 1, &placed), rc, out);
  TIDE_CHECK_GOTO(make_curves(&placed, 1, &app->exact, &app->nexact), rc, out);
  for (int i = 0; i < placed.n; i++) {
    row_t r = placed.rows[i];
    r.key[0] = 0;
    TIDE_CHECK_GOTO(rows_add(&all, r), rc, out);
  }
  snprintf(path, sizeof path, "%s/%s/scalability.csv", dir, name);
  TIDE_CHECK_GOTO(read_times(path, 0, &all), rc, out);
  TIDE_CHECK_GOTO(make_curves(&all, 0, &app->groups, &app->ngroups), rc, out);
  app->min_local = INFINITY;
  for (int i = 0; i < placed.n; i++) {
    if (placed.rows[i].local < app->min_local) app->min_local = placed.rows[i].local;
    if (placed.rows[i].local > app->max_local) app->max_local = placed.rows[i].local;
  }
  snprintf(path, sizeof path, "%s/%s", dir, name);
  DIR *d = opendir(path);
  if (d == NULL) {
    TIDE_ERROR("sim: cannot list %s: %s", path, strerror(errno));
    rc = TIDE_ENOENT;
    goto out;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "validation-", 11) != 0) continue;
    char *end;
    double batch = (double)strtol(e->d_name + 11, &end, 10);
    if (end == e->d_name + 11 || strcmp(end, ".csv") != 0 || !(batch > 0)) continue;
    tide__sim_validation_t *v = tide__realloc(app->validation, (size_t)(app->nvalidation + 1) * sizeof *v);
    if (v == NULL) {
      rc = TIDE_ENOMEM;
      break;
    }
    app->validation = v;
    v = &app->validation[app->nvalidation++];
    *v = (tide__sim_validation_t){.batch = batch};
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, e->d_name);
    rc = read_validation(path, v);
    if (rc != 0) break;
  }
  closedir(d);
  if (rc != 0) goto out;
  if (app->nvalidation == 0) {
    TIDE_ERROR("sim: %s/%s has no validation-B.csv file", dir, name);
    rc = TIDE_ENOENT;
    goto out;
  }
  qsort(app->validation, (size_t)app->nvalidation, sizeof *app->validation, by_batch);
  app->max_epochs = app->validation[0].epochs;
  for (int i = 1; i < app->nvalidation; i++)
    if (app->validation[i].epochs < app->max_epochs) app->max_epochs = app->validation[i].epochs;
  app->init_batch = app->validation[0].batch;
  app->max_batch = app->validation[app->nvalidation - 1].batch;
  /* As the paper's simulator (../shared/data/pollux-osdi21/README.md). */
  if (strcmp(name, "yolov3") == 0 && app->max_local > 8) app->max_local = 8;
  if (strcmp(name, "ncf") == 0) app->single_worker = 1;
out:
  tide__free(placed.rows);
  tide__free(all.rows);
  if (rc != 0) tide__sim_app_fini(app);
  return rc;
}

static void curve_at(const tide__sim_curve_t *c, double local, double *step, double *sync) {
  const tide__sim_point_t *p = c->points;
  int n = c->npoints;
  if (local <= p[0].local || n == 1) {
    *step = p[0].step, *sync = p[0].sync;
    return;
  }
  if (local >= p[n - 1].local) {
    *step = p[n - 1].step, *sync = p[n - 1].sync;
    return;
  }
  int i = 1;
  while (p[i].local < local) i++;
  double w = (local - p[i - 1].local) / (p[i].local - p[i - 1].local);
  *step = p[i - 1].step + w * (p[i].step - p[i - 1].step);
  *sync = p[i - 1].sync + w * (p[i].sync - p[i - 1].sync);
}

/* Interpolated over replicas among the groups on `nodes` nodes. */
static int group_at(const tide__sim_app_t *app, int nodes, double replicas, double local, double *step,
                    double *sync) {
  const tide__sim_curve_t *lo = NULL, *hi = NULL;
  for (int i = 0; i < app->ngroups; i++) {
    const tide__sim_curve_t *c = &app->groups[i];
    if (c->nodes != nodes) continue;
    if (c->replicas <= replicas && (lo == NULL || c->replicas > lo->replicas)) lo = c;
    if (c->replicas >= replicas && (hi == NULL || c->replicas < hi->replicas)) hi = c;
  }
  if (lo == NULL) lo = hi;
  if (hi == NULL) hi = lo;
  if (lo == NULL) return -1;
  double s0, y0, s1, y1;
  curve_at(lo, local, &s0, &y0);
  curve_at(hi, local, &s1, &y1);
  double w = hi->replicas > lo->replicas ? (replicas - lo->replicas) / (hi->replicas - lo->replicas) : 0;
  *step = s0 + w * (s1 - s0);
  *sync = y0 + w * (y1 - y0);
  return 0;
}

void tide__sim_app_time(const tide__sim_app_t *app, const int *counts, int n, double local, double *step,
                        double *sync) {
  int replicas = 0, small = n <= 9;
  char key[16];
  for (int i = 0; i < n; i++) {
    replicas += counts[i];
    if (counts[i] > 9) small = 0;
    if (small) key[i] = (char)('0' + counts[i]);
  }
  if (small) {
    key[n] = 0;
    qsort(key, (size_t)n, 1, by_char);
    for (int i = 0; i < app->nexact; i++)
      if (strcmp(app->exact[i].key, key) == 0) {
        curve_at(&app->exact[i], local, step, sync);
        return;
      }
  }
  /* Node counts measured on either side of n. */
  int lo = 0, hi = 0;
  for (int i = 0; i < app->ngroups; i++) {
    int m = app->groups[i].nodes;
    if (m <= n && m > lo) lo = m;
    if (m >= n && (hi == 0 || m < hi)) hi = m;
  }
  if (lo == 0) lo = hi;
  if (hi == 0) hi = lo;
  double s0, y0, s1, y1;
  if (group_at(app, lo, replicas, local, &s0, &y0) != 0) s0 = y0 = 1;
  if (group_at(app, hi, replicas, local, &s1, &y1) != 0) s1 = s0, y1 = y0;
  double w = hi > lo ? (double)(n - lo) / (hi - lo) : 0;
  *step = s0 + w * (s1 - s0);
  *sync = y0 + w * (y1 - y0);
}

void tide__sim_app_grad(const tide__sim_app_t *app, double batch, int epoch, double *sqr, double *var) {
  if (epoch < 0) epoch = 0;
  if (epoch >= app->max_epochs) epoch = app->max_epochs - 1;
  const tide__sim_validation_t *v = app->validation;
  int n = app->nvalidation, i = 0;
  if (batch <= v[0].batch || n == 1) {
    *sqr = v[0].grad_sqr[epoch], *var = v[0].grad_var[epoch];
    return;
  }
  if (batch >= v[n - 1].batch) {
    *sqr = v[n - 1].grad_sqr[epoch], *var = v[n - 1].grad_var[epoch];
    return;
  }
  while (v[i + 1].batch < batch) i++;
  double w = (batch - v[i].batch) / (v[i + 1].batch - v[i].batch);
  *sqr = v[i].grad_sqr[epoch] + w * (v[i + 1].grad_sqr[epoch] - v[i].grad_sqr[epoch]);
  *var = v[i].grad_var[epoch] + w * (v[i + 1].grad_var[epoch] - v[i].grad_var[epoch]);
}

double tide__sim_app_progress(const tide__sim_app_t *app, int epoch) {
  if (epoch <= 0) return 0;
  if (epoch > app->max_epochs) epoch = app->max_epochs;
  double p = INFINITY;
  for (int i = 0; i < app->nvalidation; i++)
    if (app->validation[i].progress[epoch - 1] < p) p = app->validation[i].progress[epoch - 1];
  return p;
}
