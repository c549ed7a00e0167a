/* Multiplexing a background job on a foreground's workers (DeepPool's
 * "background training", docs/elastic.md, "Multiplexing").
 *
 * The foreground (TIDE_HOSTS_BACKGROUND=1): after each step its rank 0
 * reads how many background jobs run now (KEY_ACTIVE, which their guards
 * keep) and publishes in its own store, under KEY_FOREGROUND,
 * "STEP SOLO RECENT": its solo step time (the median of its last SOLO_KEEP
 * steps taken while no background job ran, before and after) and its
 * recent one (the median of its last RECENT_KEEP steps); "done" at the end.
 *
 * The background (TIDE_FOREGROUND=HOST:PORT): in each step, before the
 * gradient exchange, its rank 0 reads that line from the foreground's store
 * and decides; the decision travels in the exchange's statistics
 * (TIDE__SLOT_GUARD), so every rank learns it without another message, and
 * all pause at the same boundary, the next one (a pause only delays the
 * next step: none is lost or repeated). While paused (and before the first
 * step) rank 0 asks again every POLL_MS and broadcasts each answer over the
 * background's own communicator until it says go, so the other ranks'
 * waits stay far inside TIDE_TIMEOUT_MS. A running background therefore
 * sends nothing more than its training does: on a link the foreground
 * fills, each extra round trip would cost it (and the foreground) dearly.
 * Rules, in the foreground's steps:
 *   - paused until the solo time is known; then it runs;
 *   - running, once JUDGE_STEPS foreground steps ran since it started (or
 *     last judged): pause when RECENT > TIDE_GUARD_PERCENT% of SOLO (and
 *     double the back-off, up to BACKOFF_MAX), else keep running (the
 *     back-off returns to JUDGE_STEPS);
 *   - paused: resume once the back-off has passed and RECENT is back under
 *     the limit;
 *   - the foreground done or its store gone: run unguarded.
 * A pause decided in step s takes effect at the boundary after it, one
 * background step late.
 * The guard also leaves its own progress in the foreground's store, under
 * KEY_BACKGROUND + its own store's address (TIDE_RDZV, which names the job
 * to whoever watches the foreground): "STEP running|paused PAUSES".
 */
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

#define KEY_FOREGROUND "multiplex/foreground"
#define KEY_ACTIVE "multiplex/active"
#define KEY_BACKGROUND "multiplex/background/" /* + its own store's HOST:PORT: "STEP running|paused PAUSES" */
#define SOLO_KEEP 16
#define RECENT_KEEP 3
#define SKIP_STEPS 2 /* the first steps (start-up, warm-up) are no solo sample */
#define JUDGE_STEPS 4
#define BACKOFF_MAX 64
#define POLL_MS 20
#define CONNECT_MS 10000
#define WAIT_WARN_S 30.0

struct tide__multiplex {
  tide_store_t *store; /* rank 0: the foreground's store (its own, or the one it guards for) */
  int foreground;      /* 1: publisher; 0: guard */
  char where[300];     /* HOST:PORT of that store */
  /* Foreground. */
  double solo[SOLO_KEEP], recent[RECENT_KEEP];
  long nsolo, nrecent; /* values pushed into each ring */
  long steps;
  int64_t active_before; /* background jobs running at the previous step's end */
  double solo_s;
  int active_now;
  /* Background. */
  int running, started, unguarded, warned;
  int hold; /* the last exchange voted to pause (and before the first step) */
  long mark, backoff, pauses;
  double paused_s;
  char key[400];      /* KEY_BACKGROUND + TIDE_RDZV */
  long shown_step;    /* what KEY_BACKGROUND says now */
  int shown_running;
  int64_t shown_ns;
};

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  double sorted[SOLO_KEEP];
  memcpy(sorted, v, (size_t)n * sizeof *v);
  qsort(sorted, (size_t)n, sizeof *sorted, compare_double);
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

/* Appends v to a ring of cap values; *pushed counts every value so far. */
static void push(double *ring, int cap, long *pushed, double v) {
  ring[*pushed % cap] = v;
  (*pushed)++;
}

static int held(long pushed, int cap) { return pushed < cap ? (int)pushed : cap; }

int tide__multiplex_open(tide_trainer_t *tr) {
  const char *foreground = tide__param_str(TIDE__PARAM_FOREGROUND);
  int hosts = (int)tide__param_int(TIDE__PARAM_HOSTS_BACKGROUND);
  if (foreground[0] == '\0' && !hosts) return 0;
  if (foreground[0] != '\0' && hosts) {
    TIDE_ERROR("TIDE_FOREGROUND and TIDE_HOSTS_BACKGROUND are both set: a job is either a background job "
               "(TIDE_FOREGROUND names its foreground) or a foreground that hosts them; unset one");
    return TIDE_EINVAL;
  }
  const char *where = hosts ? tide__param_str(TIDE__PARAM_RDZV) : foreground;
  const char *token =
      hosts ? tide__param_str(TIDE__PARAM_JOB_TOKEN) : tide__param_str(TIDE__PARAM_FOREGROUND_TOKEN);
  char host[256];
  int port;
  if (tide__parse_host_port(where, host, sizeof host, &port) != 0) {
    if (hosts) {
      TIDE_WARN("TIDE_HOSTS_BACKGROUND=1 but TIDE_RDZV (\"%s\") is no HOST:PORT store address: this job "
                "publishes no step times (start it with tiderun)", where);
      return 0;
    }
    TIDE_ERROR("TIDE_FOREGROUND=\"%s\" is not HOST:PORT (the foreground job's store, its --rdzv)", where);
    return TIDE_EINVAL;
  }
  if (token[0] == '\0') {
    TIDE_ERROR("%s is empty: the %s store asks for its job token", hosts ? "TIDE_JOB_TOKEN" : "TIDE_FOREGROUND_TOKEN",
               hosts ? "job's" : "foreground job's");
    return TIDE_EINVAL;
  }
  struct tide__multiplex *m = tide__calloc(1, sizeof *m);
  if (m == NULL) return TIDE_ENOMEM;
  m->foreground = hosts;
  m->solo_s = NAN;
  m->mark = -BACKOFF_MAX;
  snprintf(m->where, sizeof m->where, "%s", where);
  snprintf(m->key, sizeof m->key, "%s%s", KEY_BACKGROUND, tide__param_str(TIDE__PARAM_RDZV));
  m->shown_step = -1;
  m->hold = 1;
  tr->multiplex = m;
  if (tr->rank != 0) return 0;
  int rc = tide_store_connect(host, port, token, CONNECT_MS, &m->store);
  if (rc != 0) {
    /* Never fatal: the job runs, unguarded or unpublished, and says so. */
    TIDE_WARN("multiplexing: cannot reach the %s store at %s (%s): %s", hosts ? "job's" : "foreground's", where,
              tide_strerror(rc), hosts ? "no step times are published" : "this background job runs unguarded");
    m->store = NULL;
    m->unguarded = 1;
    return 0;
  }
  TIDE_INFO("multiplexing: %s, store %s", hosts ? "foreground publishing its step times" : "background guarded",
            where);
  return 0;
}

void tide__multiplex_close(tide_trainer_t *tr) {
  struct tide__multiplex *m = tr->multiplex;
  if (m == NULL) return;
  if (m->store != NULL) {
    int64_t left;
    if (m->foreground)
      tide_store_set(m->store, KEY_FOREGROUND, "done", 4);
    else if (m->running && !m->unguarded)
      tide_store_add(m->store, KEY_ACTIVE, -1, &left);
    tide_store_close(m->store);
  }
  tide__free(m);
  tr->multiplex = NULL;
}

/* Foreground, rank 0: one step's time into the rings, then the line. */
static void publish(struct tide__multiplex *m, double step_s) {
  int64_t active = 0;
  if (tide_store_add(m->store, KEY_ACTIVE, 0, &active) != 0) return;
  long index = m->steps++;
  if (index >= SKIP_STEPS && active == 0 && m->active_before == 0) push(m->solo, SOLO_KEEP, &m->nsolo, step_s);
  m->active_before = active;
  m->active_now = (int)active;
  push(m->recent, RECENT_KEEP, &m->nrecent, step_s);
  if (m->nsolo >= 3) m->solo_s = median(m->solo, held(m->nsolo, SOLO_KEEP));
  char line[96];
  int n = snprintf(line, sizeof line, "%ld %.6g %.6g", m->steps, m->nsolo >= 3 ? m->solo_s : 0.0,
                   median(m->recent, held(m->nrecent, RECENT_KEEP)));
  tide_store_set(m->store, KEY_FOREGROUND, line, (size_t)n);
}

void tide__multiplex_step_end(tide_trainer_t *tr) {
  struct tide__multiplex *m = tr->multiplex;
  if (m->foreground) {
    if (m->store != NULL) publish(m, tr->stats.step_s);
    tr->stats.solo_step_s = m->solo_s;
    tr->stats.background_jobs = m->active_now;
  } else {
    tr->stats.paused_s = m->paused_s;
    tr->stats.pauses = m->pauses;
    m->paused_s = 0;
  }
}

static void set_running(struct tide__multiplex *m, int running, long fg_step) {
  int64_t now;
  if (!m->unguarded && tide_store_add(m->store, KEY_ACTIVE, running ? 1 : -1, &now) != 0) m->unguarded = 1;
  m->running = running;
  m->mark = fg_step;
}

/* Rank 0 of a background job, at a step boundary: its progress into the
 * foreground's store when it paused or resumed, else at most once a second. */
static void show(struct tide__multiplex *m, long step) {
  int64_t now = tide__now_ns();
  if (m->unguarded || (step == m->shown_step && m->running == m->shown_running) ||
      (m->running == m->shown_running && now - m->shown_ns < 1000000000))
    return;
  m->shown_ns = now;
  char line[96];
  int n = snprintf(line, sizeof line, "%ld %s %ld", step, m->running ? "running" : "paused", m->pauses);
  if (tide_store_set(m->store, m->key, line, (size_t)n) == 0) {
    m->shown_step = step;
    m->shown_running = m->running;
  }
}

/* Rank 0 of a background job: 1 to take the next step, 0 to wait. */
static int decide(struct tide__multiplex *m, double waited_s) {
  if (m->unguarded) return 1;
  void *value = NULL;
  size_t len = 0;
  int rc = tide_store_get(m->store, KEY_FOREGROUND, 0, &value, &len);
  if (rc == TIDE_ETIMEDOUT || rc == TIDE_ENOENT) {
    if (waited_s > WAIT_WARN_S && !m->warned) {
      m->warned = 1;
      TIDE_WARN("multiplexing: the foreground at %s has published no step times for %.0f s: is it a tide trainer "
                "started with tiderun --hosts-background (TIDE_HOSTS_BACKGROUND=1)? This job waits for it",
                m->where, waited_s);
    }
    return m->running;
  }
  if (rc != 0) {
    TIDE_WARN("multiplexing: the foreground's store at %s is gone (%s): this background job runs unguarded",
              m->where, tide_strerror(rc));
    m->unguarded = 1;
    return 1;
  }
  char line[96];
  size_t n = len < sizeof line - 1 ? len : sizeof line - 1;
  memcpy(line, value, n);
  line[n] = '\0';
  tide_free(value);
  if (strcmp(line, "done") == 0) {
    TIDE_INFO("multiplexing: the foreground at %s is done; this background job runs unguarded", m->where);
    if (m->running) set_running(m, 0, 0);
    m->unguarded = 1;
    return 1;
  }
  long fg_step;
  double solo, recent;
  if (sscanf(line, "%ld %lf %lf", &fg_step, &solo, &recent) != 3) {
    TIDE_WARN("multiplexing: cannot read the foreground's step times (\"%s\" at %s): running unguarded", line,
              m->where);
    m->unguarded = 1;
    return 1;
  }
  if (!(solo > 0)) return m->running;
  double limit = solo * (double)tide__param_int(TIDE__PARAM_GUARD_PERCENT) / 100.0;
  if (!m->started) {
    m->started = 1;
    m->backoff = JUDGE_STEPS;
    set_running(m, 1, fg_step);
    TIDE_INFO("multiplexing: the foreground's solo step is %.4f s; starting (pause above %.4f s)", solo, limit);
  } else if (m->running && fg_step >= m->mark + JUDGE_STEPS) {
    if (recent > limit) {
      m->pauses++;
      m->backoff = m->backoff * 2 < BACKOFF_MAX ? m->backoff * 2 : BACKOFF_MAX;
      set_running(m, 0, fg_step);
      TIDE_INFO("multiplexing: the foreground's recent step %.4f s > %.4f s: pausing (pause %ld, at least %ld of "
                "its steps)", recent, limit, m->pauses, m->backoff);
    } else {
      m->mark = fg_step;
      m->backoff = JUDGE_STEPS;
    }
  } else if (!m->running && fg_step >= m->mark + m->backoff && recent <= limit) {
    set_running(m, 1, fg_step);
    TIDE_INFO("multiplexing: the foreground's recent step %.4f s <= %.4f s: resuming", recent, limit);
  }
  return m->running;
}

float tide__multiplex_vote(tide_trainer_t *tr) {
  struct tide__multiplex *m = tr->multiplex;
  if (m->foreground || tr->rank != 0) return 0;
  return decide(m, 0) ? 0.0f : 1.0f;
}

void tide__multiplex_voted(tide_trainer_t *tr, float vote) {
  struct tide__multiplex *m = tr->multiplex;
  if (!m->foreground) m->hold = vote > 0.5f;
}

int tide__multiplex_boundary(tide_trainer_t *tr) {
  struct tide__multiplex *m = tr->multiplex;
  if (m->foreground) return 0;
  if (!m->hold) {
    if (tr->rank == 0) show(m, tr->step);
    return 0;
  }
  int64_t start = tide__now_ns();
  int held = 0;
  for (;;) {
    int32_t go = 1;
    if (tr->rank == 0) {
      go = decide(m, (double)(tide__now_ns() - start) * 1e-9);
      show(m, tr->step);
    }
    if (tr->ranks > 1) {
      int rc = tide_broadcast(tr->comm, &go, 1, TIDE_I32, 0);
      if (rc != 0) return tide__trainer_fail(tr, rc, "the background guard's broadcast at step %ld failed", tr->step);
    }
    if (go) break;
    held = 1;
    if (tr->rank == 0) poll(NULL, 0, POLL_MS);
  }
  if (held) m->paused_s += (double)(tide__now_ns() - start) * 1e-9;
  m->hold = 0;
  return 0;
}
