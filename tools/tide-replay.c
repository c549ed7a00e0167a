/* tide-replay: a trace-replay worker. It plays one application of the
 * Pollux traces (../shared/data/pollux-osdi21) as an elastic tide job, so
 * that live scheduling runs of many slots fit a small machine and compare
 * with `tide sim` on the same jobs:
 *   - each micro-batch sleeps the trace's compute time (step - sync) at the
 *     job's current placement and micro-batch (divided by --speed);
 *   - each step exchanges a real gradient-sized buffer (--grad-floats,
 *     scaled down) through the step API (tide_trainer_step), so the
 *     exchange, the policies (--adapt, the Pollux agent) and the elastic
 *     paths are tide's own. The gradient has the trace's noise statistics
 *     at that epoch (a fixed mean of norm^2 grad_sqr plus Gaussian noise of
 *     variance grad_var * base_batch / micro-batch, drawn per rank), so the
 *     trainer's noise-scale monitor and the agent see the application's;
 *   - progress advances by the statistical efficiency of the step's global
 *     batch (tide_trace_app_gain), and the job exits when it has made the
 *     trace's progress times --work.
 * The progress lives in three parameters the gradient never touches, so it
 * travels with the parameters to workers that join and survives a
 * failure like the rest of the state.
 *
 * With --adapt pollux the job runs the Pollux agent through the step API
 * (as tide-train --adapt pollux does): under tide sched its rank 0
 * publishes the job's scheduling hints to the job's store, at its first
 * step, at its first fit and every TIDE_SCHED_HINTS_INTERVAL seconds.
 *
 *   tiderun --elastic --min-np 1 --max-np 4 -np 2 tide-replay --app cifar10 --speed 20 --work 0.01
 */
#include <errno.h>
#include <stdint.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tide.h"

#define PROGRESS_SLOTS 3
#define PROGRESS_UNIT 1024.0 /* progress is kept in 1/1024 steps */
#define CHUNK (1 << 21)      /* a float holds integers below 2^24 exactly */

static const char usage_text[] =
    "usage: tide-replay --app NAME [options]   (under tiderun --elastic, or tide submit)\n"
    "\n"
    "  --app NAME          the application: bert, cifar10, deepspeech2, imagenet, ncf, yolov3\n"
    "  --traces DIR        the traces (default ../shared/data/pollux-osdi21/traces)\n"
    "  --batch B           global batch at the start (default: the trace's smallest)\n"
    "  --speed S           run S times faster than the trace's step times (default 1)\n"
    "  --work F            the fraction of the application's progress to make (default 1)\n"
    "  --grad-floats N     floats exchanged per step (default 262144)\n"
    "  --adapt LIST        the trainer's policies (e.g. pollux: the Pollux agent, which publishes\n"
    "                      the job's scheduling hints to tide sched; docs/adaptation.md)\n"
    "  --log-every K       rank 0 prints a line every K steps (default 10; 0: none)\n"
    "  --name J            a label (shows in ps and the lines printed)\n";

typedef struct {
  const char *app, *traces, *adapt, *name;
  double batch, speed, work;
  long grad_floats;
  int log_every;
} options_t;

static int fail_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "tide-replay: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see tide-replay --help)\n");
  return 2;
}

static int parse(int argc, char **argv, options_t *o) {
  *o = (options_t){.traces = "../shared/data/pollux-osdi21/traces", .speed = 1, .work = 1, .grad_floats = 262144,
                   .log_every = 10, .name = "replay"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage_text, stdout);
      return 1;
    }
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) return fail_usage("%s needs a value", a);
    i++;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    int number = errno == 0 && end != v && *end == '\0';
    if (strcmp(a, "--app") == 0) o->app = v;
    else if (strcmp(a, "--traces") == 0) o->traces = v;
    else if (strcmp(a, "--adapt") == 0) o->adapt = v;
    else if (strcmp(a, "--name") == 0) o->name = v;
    else if (strcmp(a, "--batch") == 0) {
      if (!number || !(x >= 1)) return fail_usage("--batch: '%s' is not a batch size >= 1", v);
      o->batch = x;
    } else if (strcmp(a, "--speed") == 0) {
      if (!number || !(x > 0)) return fail_usage("--speed: '%s' is not a number > 0", v);
      o->speed = x;
    } else if (strcmp(a, "--work") == 0) {
      if (!number || !(x > 0 && x <= 1)) return fail_usage("--work: '%s' is not a fraction in (0, 1]", v);
      o->work = x;
    } else if (strcmp(a, "--grad-floats") == 0) {
      if (!number || !(x >= 1 && x <= 1 << 28) || x != floor(x))
        return fail_usage("--grad-floats: '%s' is not an integer in [1, 2^28]", v);
      o->grad_floats = (long)x;
    } else if (strcmp(a, "--log-every") == 0) {
      if (!number || !(x >= 0 && x <= INT_MAX) || x != floor(x))
        return fail_usage("--log-every: '%s' is not an integer >= 0", v);
      o->log_every = (int)x;
    } else return fail_usage("unknown option '%s'", a);
  }
  if (o->app == NULL) return fail_usage("%s is required", "--app");
  return 0;
}

static double progress_get(const float *p) {
  double units = 0;
  for (int i = PROGRESS_SLOTS - 1; i >= 0; i--) units = units * CHUNK + p[i];
  return units / PROGRESS_UNIT;
}

static void progress_set(float *p, double progress) {
  double units = floor(progress * PROGRESS_UNIT);
  for (int i = 0; i < PROGRESS_SLOTS; i++) {
    double chunk = fmod(units, CHUNK);
    p[i] = (float)chunk;
    units = (units - chunk) / CHUNK;
  }
}

static void sleep_s(double s) {
  if (!(s > 0)) return;
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

#define NOISE_SHIFTS 4096

/* A uniform double in (0, 1) from an xorshift64* stream. */
static double uniform(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
  *state = x;
  return ((double)((x * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) / 9007199254740992.0;
}

/* d + NOISE_SHIFTS standard normal values (Box-Muller), drawn once per
 * rank: a micro-batch's noise is the window at a random shift, so no two
 * micro-batches or ranks of a step share it element for element, at the
 * cost of one multiply-add per element instead of a logarithm. */
static float *noise_table(size_t d, int rank) {
  size_t n = d + NOISE_SHIFTS;
  float *t = malloc(n * sizeof *t);
  if (t == NULL) return NULL;
  uint64_t state = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)(rank + 1) << 32);
  for (size_t k = 0; k < n; k += 2) {
    double r = sqrt(-2 * log(uniform(&state))), a = 2 * M_PI * uniform(&state);
    t[k] = (float)(r * cos(a));
    if (k + 1 < n) t[k + 1] = (float)(r * sin(a));
  }
  return t;
}

/* The micro-batch's mean gradient with the trace's statistics: every
 * element sqrt(grad_sqr / d) plus N(0, grad_var * base_batch / (count * d)). */
static void synthetic_gradient(const tide_trace_app_t *app, const tide_pollux_limits_t *limits, const float *noise,
                               uint64_t *state, const tide_batch_t *b, double progress, float *g, size_t d) {
  double sqr = 0, var = 0;
  double batch = (double)b->count * (b->micro_count > 0 ? b->micro_count : 1);
  if (b->count == 0 || tide_trace_app_noise(app, batch, progress, &sqr, &var) != 0) {
    memset(g, 0, d * sizeof *g);
    return;
  }
  float mean = (float)sqrt(sqr / (double)d), sigma = (float)sqrt(var * limits->base_batch / ((double)b->count * (double)d));
  const float *z = noise + (size_t)(uniform(state) * NOISE_SHIFTS) % NOISE_SHIFTS;
  for (size_t k = 0; k < d; k++) g[k] = mean + sigma * z[k];
}

int main(int argc, char **argv) {
  options_t o;
  int rc = parse(argc, argv, &o);
  if (rc != 0) return rc == 1 ? 0 : rc;
  tide_trace_app_t *app;
  if ((rc = tide_trace_app_open(o.traces, o.app, &app)) != 0) {
    fprintf(stderr, "tide-replay: cannot read the traces of %s under %s: %s (--traces, --app)\n", o.app, o.traces,
            tide_strerror(rc));
    return 2;
  }
  tide_pollux_limits_t limits;
  tide_trace_app_limits(app, &limits);
  double target = tide_trace_app_total(app) * o.work;
  tide_comm_t *comm;
  if ((rc = tide_comm_init(&comm)) != 0) {
    tide_trace_app_close(app);
    if (rc == TIDE_ESTATE) {
      fprintf(stderr, "tide-replay: the job finished before this worker was admitted\n");
      return 0;
    }
    fprintf(stderr, "tide-replay: cannot join the job: %s\n", tide_strerror(rc));
    return 1;
  }
  int elastic = tide_comm_epoch(comm) >= 0;
  double batch = o.batch > 0 ? o.batch : limits.base_batch;
  int ranks = tide_comm_size(comm);
  size_t n = (size_t)o.grad_floats + PROGRESS_SLOTS;
  float *params = calloc(n, sizeof *params), *grads = calloc(n, sizeof *grads);
  if (params == NULL || grads == NULL) {
    fprintf(stderr, "tide-replay: out of memory for %zu floats\n", n);
    return 1;
  }
  tide_trainer_config_t c;
  tide_trainer_config_default(&c);
  c.dataset_size = 1 << 16;
  c.epochs = 1e9; /* the trace's progress ends the job, not the trainer's */
  int per_rank = (int)ceil(batch / ranks);
  if (per_rank < 1) per_rank = 1;
  c.batch = per_rank;
  /* At most the trace's largest micro-batch per pass; the trainer splits a
   * larger share into passes when the batch grows. */
  c.max_batch = limits.max_atomic >= 1 ? (int)limits.max_atomic : per_rank;
  if (c.batch > c.max_batch) c.batch = c.max_batch;
  c.base_batch = (long)limits.base_batch;
  c.schedule.base_lr = 1e-6f;
  tide_trainer_t *tr;
  if ((rc = tide_trainer_create(comm, &c, params, grads, n, NULL, 0, &tr)) != 0) {
    fprintf(stderr, "tide-replay: cannot create the trainer: %s\n", tide_strerror(rc));
    return 1;
  }
  if (o.adapt != NULL && (rc = tide_trainer_adapt(tr, o.adapt)) != 0) {
    fprintf(stderr, "tide-replay: --adapt %s: %s\n", o.adapt, tide_trainer_last_error(tr));
    return 2;
  }
  if (elastic && (rc = tide_trainer_elastic(tr)) != 0) {
    fprintf(stderr, "tide-replay: cannot take part in the elastic job: %s\n", tide_strerror(rc));
    return 1;
  }
  int done = 0, noise_rank = -1;
  float *noise = NULL;
  uint64_t rng = 0;
  for (;;) {
    tide_batch_t b;
    rc = tide_trainer_next(tr, &b);
    if (rc == 0 && b.done) break; /* released by the scheduler, or finished */
    if (rc == 0) {
      tide_comm_t *cm = tide_trainer_comm(tr);
      int size = tide_comm_size(cm), nodes = tide_comm_node_count(cm);
      if (nodes < 1 || nodes > size) nodes = 1;
      int counts[64];
      if (nodes > 64) nodes = 64;
      for (int k = 0; k < nodes; k++) counts[k] = size / nodes + (k < size % nodes);
      double step_s, sync_s;
      if (b.count > 0 && tide_trace_app_time(app, counts, nodes, (double)b.count, &step_s, &sync_s) == 0)
        sleep_s((step_s - sync_s) / o.speed);
      int rank = tide_comm_rank(cm);
      if (noise == NULL || rank != noise_rank) {
        free(noise);
        noise_rank = rank;
        rng = 0x2545F4914F6CDD1DULL ^ (uint64_t)(rank + 1);
        if ((noise = noise_table(n - PROGRESS_SLOTS, rank)) == NULL) {
          fprintf(stderr, "tide-replay: out of memory for the gradient noise\n");
          rc = TIDE_ENOMEM;
          break;
        }
      }
      synthetic_gradient(app, &limits, noise, &rng, &b, progress_get(params), grads + PROGRESS_SLOTS,
                         n - PROGRESS_SLOTS);
      for (int k = 0; k < PROGRESS_SLOTS; k++) grads[k] = 0;
      tide_step_stats_t st;
      rc = tide_trainer_step(tr, 0.0, &st);
      if (rc == 0 && st.stepped) {
        double progress = progress_get(params) + tide_trace_app_gain(app, (double)st.global_batch, progress_get(params));
        progress_set(params, progress);
        done = progress >= target;
        int rank = tide_comm_rank(tide_trainer_comm(tr));
        if (rank == 0 && o.log_every > 0 && (st.step % o.log_every == 0 || done))
          printf("tide-replay %s: step %ld workers %d batch %ld progress %.1f of %.1f noise_scale %.0f\n", o.name,
                 st.step, st.ranks, st.global_batch, progress, target, st.noise_scale),
              fflush(stdout);
        if (done) break;
      }
    }
    if (rc != 0 && (!elastic || (rc = tide_trainer_recover(tr, rc)) != 0)) {
      fprintf(stderr, "tide-replay: %s\n", tide_trainer_last_error(tr)[0] ? tide_trainer_last_error(tr) : tide_strerror(rc));
      break;
    }
  }
  if (rc == 0 && done && elastic && tide_trainer_comm(tr) != NULL) tide_comm_elastic_finish(tide_trainer_comm(tr));
  tide_trainer_destroy(tr);
  if (!elastic) tide_comm_destroy(comm); /* an elastic trainer owned its communicator */
  free(params);
  free(grads);
  free(noise);
  tide_trace_app_close(app);
  return rc == 0 ? 0 : 1;
}
