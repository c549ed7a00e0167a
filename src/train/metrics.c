/* The metrics line schema (metrics.jsonl): every key defined once, here,
 * for the writer (tide-train, any program over the trainer) and the reader
 * (tide report). A line is one flat JSON object; a statistic not measured
 * is null.
 *
 * Threads: pure functions of their arguments; any thread. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static const char *const metric_keys[TIDE_METRIC_COUNT] = {
    [TIDE_METRIC_STEP] = "step",
    [TIDE_METRIC_EPOCH] = "epoch",
    [TIDE_METRIC_PROGRESS] = "progress",
    [TIDE_METRIC_EPOCHS_DONE] = "epochs_done",
    [TIDE_METRIC_LOSS] = "loss",
    [TIDE_METRIC_LR] = "lr",
    [TIDE_METRIC_GLOBAL_BATCH] = "global_batch",
    [TIDE_METRIC_BATCH] = "batch",
    [TIDE_METRIC_ACCUM] = "accum",
    [TIDE_METRIC_EXCHANGE] = "exchange",
    [TIDE_METRIC_IMAGES_PER_S] = "images_per_s",
    [TIDE_METRIC_COMPUTE_S] = "compute_s",
    [TIDE_METRIC_COMM_S] = "comm_s",
    [TIDE_METRIC_OPTIM_S] = "optim_s",
    [TIDE_METRIC_STEP_S] = "step_s",
    [TIDE_METRIC_TIME_S] = "time_s",
    [TIDE_METRIC_NOISE_SCALE] = "noise_scale",
    [TIDE_METRIC_GRAD_SQ] = "grad_sq",
    [TIDE_METRIC_TRACE_SIGMA] = "trace_sigma",
    [TIDE_METRIC_GAIN_RATIO] = "gain_ratio",
    [TIDE_METRIC_LR_FACTOR] = "lr_factor",
    [TIDE_METRIC_GAIN] = "gain",
    [TIDE_METRIC_KFAC_S] = "kfac_s",
    [TIDE_METRIC_COMM_SHARE] = "comm_share",
    [TIDE_METRIC_RANK_COMPUTE_MIN_S] = "rank_compute_min_s",
    [TIDE_METRIC_RANK_COMPUTE_MEDIAN_S] = "rank_compute_median_s",
    [TIDE_METRIC_RANK_COMPUTE_MAX_S] = "rank_compute_max_s",
    [TIDE_METRIC_DATA_S] = "data_s",
    [TIDE_METRIC_PAUSED_S] = "paused_s",
    [TIDE_METRIC_SOLO_STEP_S] = "solo_step_s",
    [TIDE_METRIC_PAUSES] = "pauses",
    [TIDE_METRIC_BACKGROUND_JOBS] = "background_jobs",
    [TIDE_METRIC_UNIX_S] = "unix_s",
    [TIDE_METRIC_SLOWEST_RANK] = "slowest_rank",
    [TIDE_METRIC_DATA_EPOCH] = "data_epoch",
    [TIDE_METRIC_TEST_LOSS] = "test_loss",
    [TIDE_METRIC_TEST_ACCURACY] = "test_accuracy",
    [TIDE_METRIC_EVAL_S] = "eval_s",
};

static const char *const line_types[] = {[TIDE_METRICS_STEP] = "step", [TIDE_METRICS_EPOCH] = "epoch",
                                         [TIDE_METRICS_EVAL] = "eval", [TIDE_METRICS_FINAL] = "final"};
#define NLINE_TYPES (sizeof line_types / sizeof line_types[0])

const char *tide_metric_key(tide_metric_t metric) {
  return (unsigned)metric < TIDE_METRIC_COUNT ? metric_keys[metric] : "?";
}

/* Where the value of "key": starts in line, or NULL. */
static const char *value_of(const char *line, const char *key) {
  size_t n = strlen(key);
  for (const char *at = strchr(line, '"'); at != NULL; at = strchr(at + 1, '"'))
    if (strncmp(at + 1, key, n) == 0 && at[n + 1] == '"' && at[n + 2] == ':') return at + n + 3;
  return NULL;
}

tide_metrics_line_t tide_metrics_line_kind(const char *line) {
  if (line == NULL) return TIDE_METRICS_NONE;
  const char *v = value_of(line, "type");
  if (v == NULL || *v != '"') return TIDE_METRICS_NONE;
  for (size_t k = 1; k < NLINE_TYPES; k++) {
    size_t n = strlen(line_types[k]);
    if (strncmp(v + 1, line_types[k], n) == 0 && v[n + 1] == '"') return (tide_metrics_line_t)k;
  }
  return TIDE_METRICS_NONE;
}

double tide_metric_read(const char *line, tide_metric_t metric) {
  if (line == NULL || (unsigned)metric >= TIDE_METRIC_COUNT) return NAN;
  const char *v = value_of(line, metric_keys[metric]);
  if (v == NULL) return NAN;
  char *end;
  double x = strtod(v, &end);
  return end == v ? NAN : x; /* null, or a name */
}

/* A line being written into buf: appends until it no longer fits. */
typedef struct {
  char *buf;
  size_t cap, len;
  int overflow;
} line_t;

static void put(line_t *l, const char *fmt, ...) {
  if (l->overflow) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(l->buf + l->len, l->cap - l->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= l->cap - l->len)
    l->overflow = 1;
  else
    l->len += (size_t)n;
}

/* ,"key":value with value printed by fmt. */
#define PUT(l, metric, fmt, value) put((l), ",\"%s\":" fmt, metric_keys[metric], (value))

/* A statistic that may be unmeasured (NaN): null then. */
static void put_stat(line_t *l, tide_metric_t metric, double v) {
  if (isfinite(v))
    PUT(l, metric, "%.6g", v);
  else
    PUT(l, metric, "%s", "null");
}

static int finish(line_t *l, const char *fn) {
  put(l, "}\n");
  if (!l->overflow) return (int)l->len;
  TIDE_ERROR("%s: the line does not fit in %zu bytes (give 1024)", fn, l->cap);
  return TIDE_EINVAL;
}

int tide_metrics_step_line(const tide_step_stats_t *s, double time_s, double unix_s, char *buf, size_t cap) {
  static const char fn[] = "tide_metrics_step_line";
  if (s == NULL || buf == NULL) return tide__null_arg(fn, s == NULL ? "s" : "buf");
  line_t l = {buf, cap, 0, cap == 0};
  put(&l, "{\"type\":\"%s\"", line_types[TIDE_METRICS_STEP]);
  PUT(&l, TIDE_METRIC_STEP, "%ld", s->step - 1);
  PUT(&l, TIDE_METRIC_EPOCH, "%llu", (unsigned long long)s->epoch);
  PUT(&l, TIDE_METRIC_PROGRESS, "%.4f", s->progress);
  PUT(&l, TIDE_METRIC_EPOCHS_DONE, "%.5f", s->epochs_done);
  PUT(&l, TIDE_METRIC_LOSS, "%.6f", s->loss);
  PUT(&l, TIDE_METRIC_LR, "%.6g", s->lr);
  PUT(&l, TIDE_METRIC_GLOBAL_BATCH, "%ld", s->global_batch);
  PUT(&l, TIDE_METRIC_BATCH, "%d", s->batch);
  PUT(&l, TIDE_METRIC_ACCUM, "%d", s->accum);
  PUT(&l, TIDE_METRIC_EXCHANGE, "\"%s\"", tide_exchange_name(s->exchange));
  PUT(&l, TIDE_METRIC_IMAGES_PER_S, "%.1f", s->throughput);
  PUT(&l, TIDE_METRIC_COMPUTE_S, "%.6f", s->compute_s);
  PUT(&l, TIDE_METRIC_COMM_S, "%.6f", s->exchange_s);
  PUT(&l, TIDE_METRIC_OPTIM_S, "%.6f", s->optim_s);
  PUT(&l, TIDE_METRIC_STEP_S, "%.6f", s->step_s);
  PUT(&l, TIDE_METRIC_TIME_S, "%.4f", time_s);
  put_stat(&l, TIDE_METRIC_NOISE_SCALE, s->noise_scale);
  put_stat(&l, TIDE_METRIC_GRAD_SQ, s->grad_sq);
  put_stat(&l, TIDE_METRIC_TRACE_SIGMA, s->trace_sigma);
  put_stat(&l, TIDE_METRIC_GAIN_RATIO, s->gain_ratio);
  put_stat(&l, TIDE_METRIC_LR_FACTOR, s->lr_factor);
  put_stat(&l, TIDE_METRIC_GAIN, s->gain);
  put_stat(&l, TIDE_METRIC_KFAC_S, s->kfac_s);
  put_stat(&l, TIDE_METRIC_COMM_SHARE, s->comm_share);
  put_stat(&l, TIDE_METRIC_RANK_COMPUTE_MIN_S, s->compute_min_s);
  put_stat(&l, TIDE_METRIC_RANK_COMPUTE_MEDIAN_S, s->compute_median_s);
  put_stat(&l, TIDE_METRIC_RANK_COMPUTE_MAX_S, s->compute_max_s);
  put_stat(&l, TIDE_METRIC_DATA_S, s->data_s);
  put_stat(&l, TIDE_METRIC_PAUSED_S, s->paused_s); /* multiplexing: a background job's pause */
  put_stat(&l, TIDE_METRIC_SOLO_STEP_S, s->solo_step_s);
  PUT(&l, TIDE_METRIC_PAUSES, "%ld", s->pauses);
  PUT(&l, TIDE_METRIC_BACKGROUND_JOBS, "%d", s->background_jobs);
  PUT(&l, TIDE_METRIC_UNIX_S, "%.3f", unix_s);
  PUT(&l, TIDE_METRIC_SLOWEST_RANK, "%d", s->slowest_rank);
  return finish(&l, fn);
}

int tide_metrics_eval_line(tide_metrics_line_t kind, const tide_step_stats_t *s, double test_loss,
                           double test_accuracy, double time_s, double eval_s, char *buf, size_t cap) {
  static const char fn[] = "tide_metrics_eval_line";
  if (s == NULL || buf == NULL) return tide__null_arg(fn, s == NULL ? "s" : "buf");
  if (kind != TIDE_METRICS_EPOCH && kind != TIDE_METRICS_EVAL && kind != TIDE_METRICS_FINAL) {
    TIDE_ERROR("%s: kind %d must be TIDE_METRICS_EPOCH, _EVAL or _FINAL", fn, (int)kind);
    return TIDE_EINVAL;
  }
  line_t l = {buf, cap, 0, cap == 0};
  put(&l, "{\"type\":\"%s\"", line_types[kind]);
  PUT(&l, TIDE_METRIC_STEP, "%ld", s->step);
  PUT(&l, TIDE_METRIC_EPOCH, "%.4f", s->epochs_done);
  PUT(&l, TIDE_METRIC_DATA_EPOCH, "%llu", (unsigned long long)s->epoch);
  PUT(&l, TIDE_METRIC_TEST_LOSS, "%.6f", test_loss);
  PUT(&l, TIDE_METRIC_TEST_ACCURACY, "%.6f", test_accuracy);
  PUT(&l, TIDE_METRIC_TIME_S, "%.4f", time_s);
  PUT(&l, TIDE_METRIC_EVAL_S, "%.4f", eval_s);
  return finish(&l, fn);
}
