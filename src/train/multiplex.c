/* Multiplexing a background job on foreground jobs' workers (DeepPool's
 * "background training", docs/elastic.md, "Multiplexing").
 *
 * The foreground (TIDE_HOSTS_BACKGROUND=1): after each step its rank 0 (the
 * current one: after an elastic membership change the new rank 0 takes
 * over) reads how many background jobs run now (KEY_ACTIVE, which their
 * guards keep) and publishes in its own store, under KEY_FOREGROUND,
 * "STEP SOLO RECENT SIZE": its step count, its solo step time at its current
 * membership size (the median of its last SOLO_KEEP steps at that size taken
 * while no background job ran, before and after; 0 while not yet known), its
 * recent one (the median of its last RECENT_KEEP steps at that size) and the
 * size; "done" at the end. The solo time is kept per size, in the store
 * (KEY_SOLO + size), so a size seen before is not measured again and a new
 * rank 0 finds it; at a size not seen yet SOLO is 0 until measured, and the
 * guards pause their jobs meanwhile (a resized foreground's step time changes
 * for good: the old size's solo time says nothing about the new one).
 *
 * The background: its guard watches a set of foregrounds. TIDE_FOREGROUND=
 * HOST:PORT names one; TIDE_FOREGROUND_LIST=1 (tide sched) reads the set
 * from the job's own store (KEY_FOREGROUNDS, "HOST:PORT TOKEN" per line,
 * which tide sched rewrites as foreground jobs start and end) and follows
 * it. In each step, before the gradient exchange, its rank 0 reads each
 * foreground's line and decides; the decision travels in the exchange's
 * statistics (TIDE__SLOT_GUARD), so every rank learns it without another
 * message, and all pause at the same boundary, the next one (a pause only
 * delays the next step: none is lost or repeated). While paused (and
 * before the first step) rank 0 asks again every POLL_MS and broadcasts
 * each answer over the background's own communicator until it says go, so
 * the other ranks' waits stay far inside TIDE_TIMEOUT_MS. A running
 * background therefore sends nothing more than its training does: on a
 * link the foreground fills, each extra round trip would cost it (and the
 * foreground) dearly.
 * Rules per foreground, in its steps; the background runs while no
 * foreground holds it:
 *   - held while its solo time (at its current size) is not known; let go
 *     once it is (under tide sched, one that has published nothing yet, not
 *     a tide trainer perhaps, does not hold it);
 *   - while the background runs, once JUDGE_STEPS of its steps passed since
 *     the background started (or it last judged, or changed size): held when
 *     RECENT > TIDE_GUARD_PERCENT% of SOLO (and its back-off doubles, up to
 *     BACKOFF_MAX), else not (the back-off returns to JUDGE_STEPS);
 *   - held for a slowdown: let go once the back-off has passed and RECENT is
 *     back under the limit;
 *   - done, its store gone, or off tide sched's list: no longer watched.
 * With TIDE_FOREGROUND, once its one foreground is no longer watched the
 * job runs unguarded; under tide sched, an empty list lets it run until a
 * foreground comes. A pause decided in step s takes effect at the boundary
 * after it, one background step late.
 * The guard also leaves its progress in each watched foreground's store,
 * under KEY_BACKGROUND + its own store's address (TIDE_RDZV, which names
 * the job to whoever watches the foreground), and under tide sched in its
 * own store (KEY_PROGRESS, which tide jobs shows): "STEP running|paused
 * PAUSES".
 */
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "train/train.h"

#define KEY_FOREGROUND "multiplex/foreground"
#define KEY_ACTIVE "multiplex/active"
#define KEY_BACKGROUND "multiplex/background/" /* + its own store's HOST:PORT: "STEP running|paused PAUSES" */
#define KEY_SOLO "multiplex/solo/"             /* + membership size: the foreground's solo step time there */
#define KEY_FOREGROUNDS TIDE_MULTIPLEX_FOREGROUNDS_KEY /* a background's own store (tide sched) */
#define KEY_PROGRESS TIDE_MULTIPLEX_PROGRESS_KEY       /* a background's own store */
#define SOLO_KEEP 16
#define RECENT_KEEP 3
#define SKIP_STEPS 2 /* the first steps of a membership (start-up, warm-up, connections) are no sample */
#define JUDGE_STEPS 4
#define BACKOFF_MAX 64
#define POLL_MS 20
#define CONNECT_MS 10000
#define WATCH_CONNECT_MS 2000
#define WAIT_WARN_S 30.0
#define MAX_WATCH 32
#define LIST_RUNNING_S 0.1 /* how often a running guard rereads tide sched's list */
#define LIST_PAUSED_S 0.05

/* One foreground a guard watches. */
typedef struct {
  tide_store_t *store;
  char where[300]; /* HOST:PORT */
  int counted;     /* the background is in its KEY_ACTIVE */
  int held;        /* it holds the background */
  int need_solo;   /* held until its solo time (at its current size) is known */
  int published, warned;
  long step, mark, backoff;
  double solo, recent;
  int size;
} watch_t;

struct tide__multiplex {
  int foreground;   /* 1: publisher; 0: guard */
  char where[300];  /* the foreground's store (its own) */
  char token[256];
  tide_store_t *store; /* publisher, rank 0: its own store */
  /* Foreground. */
  double solo[SOLO_KEEP], recent[RECENT_KEEP];
  long nsolo, nrecent; /* values pushed into each ring */
  long counted;        /* steps of this membership seen */
  long epoch;          /* the membership they belong to */
  int size;            /* membership size of the rings (0: none yet) */
  int64_t active_before; /* background jobs running at the previous step's end */
  double solo_s, saved_s; /* solo_s: NAN until known at this size; saved_s: what KEY_SOLO holds */
  int active_now, connect_failed;
  /* Background. */
  watch_t watch[MAX_WATCH];
  int nwatch;
  int list_mode;        /* TIDE_FOREGROUND_LIST */
  tide_store_t *own;    /* list mode: its own store */
  char list[4096];      /* the list as last applied */
  int list_seen;
  double list_read_s;
  int running, unguarded, warned;
  int hold; /* the last exchange voted to pause (and before the first step) */
  long pauses;
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
  if (n == 0) return 0;
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

static double now_s(void) { return (double)tide__now_ns() * 1e-9; }

/* A store's value as a NUL-terminated string in buf, now (no wait); the store's error otherwise. */
static int get_text(tide_store_t *store, const char *key, char *buf, size_t cap) {
  return tide__store_get_string(store, key, 0, buf, cap);
}

static int connect_to(const char *where, const char *token, int timeout_ms, tide_store_t **out) {
  char host[256];
  int port;
  if (tide__parse_host_port(where, host, sizeof host, &port) != 0) return TIDE_EINVAL;
  return tide_store_connect(host, port, token, timeout_ms, out);
}

/* Guard: starts watching the foreground whose store is at where. */
static watch_t *watch_add(struct tide__multiplex *m, const char *where, const char *token) {
  if (m->nwatch == MAX_WATCH) {
    TIDE_WARN("multiplexing: more than %d foregrounds; %s is not watched", MAX_WATCH, where);
    return NULL;
  }
  watch_t *w = &m->watch[m->nwatch];
  memset(w, 0, sizeof *w);
  snprintf(w->where, sizeof w->where, "%s", where);
  int rc = connect_to(where, token, m->list_mode ? WATCH_CONNECT_MS : CONNECT_MS, &w->store);
  if (rc != 0) {
    TIDE_WARN("multiplexing: cannot reach the foreground's store at %s (%s): it is not watched", where,
              tide_strerror(rc));
    return NULL;
  }
  w->held = w->need_solo = 1;
  w->backoff = JUDGE_STEPS;
  m->nwatch++;
  if (m->running) { /* a foreground that comes while the background runs counts it at once */
    int64_t now;
    if (tide_store_add(w->store, KEY_ACTIVE, 1, &now) == 0) w->counted = 1;
  }
  TIDE_INFO("multiplexing: watching the foreground at %s", where);
  return w;
}

/* Guard: stops watching foreground i (why: for the log). */
static void watch_drop(struct tide__multiplex *m, int i, const char *why) {
  watch_t *w = &m->watch[i];
  int64_t left;
  if (w->counted) tide_store_add(w->store, KEY_ACTIVE, -1, &left);
  tide_store_close(w->store);
  TIDE_INFO("multiplexing: the foreground at %s %s; no longer watched", w->where, why);
  m->watch[i] = m->watch[--m->nwatch];
  if (m->nwatch == 0 && !m->list_mode) {
    TIDE_INFO("multiplexing: no foreground left; this background job runs unguarded");
    m->unguarded = 1;
  }
}

int tide__multiplex_open(tide_trainer_t *tr) {
  const char *foreground = tide__param_str(TIDE__PARAM_FOREGROUND);
  int hosts = (int)tide__param_int(TIDE__PARAM_HOSTS_BACKGROUND);
  int list_mode = (int)tide__param_int(TIDE__PARAM_FOREGROUND_LIST);
  if (foreground[0] == '\0' && !hosts && !list_mode) return 0;
  if ((foreground[0] != '\0') + hosts + list_mode > 1) {
    TIDE_ERROR("%s are set together: a job is either a background job (TIDE_FOREGROUND names its foreground, or "
               "TIDE_FOREGROUND_LIST=1 under tide sched) or a foreground that hosts them "
               "(TIDE_HOSTS_BACKGROUND=1); unset all but one",
               list_mode && hosts                   ? "TIDE_FOREGROUND_LIST and TIDE_HOSTS_BACKGROUND"
               : list_mode                          ? "TIDE_FOREGROUND_LIST and TIDE_FOREGROUND"
               : "TIDE_FOREGROUND and TIDE_HOSTS_BACKGROUND");
    return TIDE_EINVAL;
  }
  const char *own = tide__param_str(TIDE__PARAM_RDZV), *own_token = tide__param_str(TIDE__PARAM_JOB_TOKEN);
  const char *where = foreground[0] != '\0' ? foreground : own;
  const char *token = foreground[0] != '\0' ? tide__param_str(TIDE__PARAM_FOREGROUND_TOKEN) : own_token;
  char host[256];
  int port;
  if (tide__parse_host_port(where, host, sizeof host, &port) != 0) {
    if (hosts) {
      TIDE_WARN("TIDE_HOSTS_BACKGROUND=1 but TIDE_RDZV (\"%s\") is no HOST:PORT store address: this job "
                "publishes no step times (start it with tiderun)", where);
      return 0;
    }
    if (list_mode) {
      TIDE_ERROR("TIDE_FOREGROUND_LIST=1 but TIDE_RDZV (\"%s\") is no HOST:PORT store address: the list of "
                 "foregrounds is in the job's own store (start it with tide submit --background)", where);
      return TIDE_EINVAL;
    }
    TIDE_ERROR("TIDE_FOREGROUND=\"%s\" is not HOST:PORT (the foreground job's store, its --rdzv)", where);
    return TIDE_EINVAL;
  }
  if (token[0] == '\0') {
    TIDE_ERROR("%s is empty: the %s store asks for its job token",
               foreground[0] != '\0' ? "TIDE_FOREGROUND_TOKEN" : "TIDE_JOB_TOKEN",
               foreground[0] != '\0' ? "foreground job's" : "job's");
    return TIDE_EINVAL;
  }
  struct tide__multiplex *m = tide__calloc(1, sizeof *m);
  if (m == NULL) return TIDE_ENOMEM;
  m->foreground = hosts;
  m->list_mode = list_mode;
  m->solo_s = NAN;
  snprintf(m->where, sizeof m->where, "%s", where);
  snprintf(m->token, sizeof m->token, "%s", token);
  snprintf(m->key, sizeof m->key, "%s%s", KEY_BACKGROUND, own);
  m->shown_step = -1;
  m->hold = 1;
  tr->multiplex = m;
  if (tr->rank != 0) return 0;
  if (hosts) {
    int rc = tide_store_connect(host, port, token, CONNECT_MS, &m->store);
    if (rc != 0) {
      TIDE_WARN("multiplexing: cannot reach the job's store at %s (%s): no step times are published", where,
                tide_strerror(rc));
      m->store = NULL;
      m->connect_failed = 1;
      return 0;
    }
    TIDE_INFO("multiplexing: foreground publishing its step times, store %s", where);
    return 0;
  }
  if (list_mode) {
    int rc = tide_store_connect(host, port, token, CONNECT_MS, &m->own);
    if (rc != 0) {
      /* Never fatal: the job runs, unguarded, and says so. */
      TIDE_WARN("multiplexing: cannot reach the job's own store at %s (%s): tide sched's list of foregrounds "
                "is not read and this background job runs unguarded", where, tide_strerror(rc));
      m->unguarded = 1;
      return 0;
    }
    TIDE_INFO("multiplexing: background guarded, following tide sched's foregrounds (store %s)", where);
    return 0;
  }
  if (watch_add(m, where, token) == NULL) {
    TIDE_WARN("multiplexing: this background job runs unguarded");
    m->unguarded = 1;
    return 0;
  }
  TIDE_INFO("multiplexing: background guarded, store %s", where);
  return 0;
}

void tide__multiplex_close(tide_trainer_t *tr) {
  struct tide__multiplex *m = tr->multiplex;
  if (m == NULL) return;
  /* "done" only from the job's current rank 0 (a member that leaves an
   * elastic foreground has no communicator left: the job goes on). */
  if (m->store != NULL && tr->rank == 0 && tr->comm != NULL) tide_store_set(m->store, KEY_FOREGROUND, "done", 4);
  tide_store_close(m->store);
  for (int i = 0; i < m->nwatch; i++) {
    int64_t left;
    if (m->watch[i].counted) tide_store_add(m->watch[i].store, KEY_ACTIVE, -1, &left);
    tide_store_close(m->watch[i].store);
  }
  tide_store_close(m->own);
  tide__free(m);
  tr->multiplex = NULL;
}

/* Foreground: a new membership size: fresh rings, and the solo time at that
 * size if an earlier membership (or rank 0) measured it. */
static void resize(struct tide__multiplex *m, int size) {
  char key[64], text[64];
  m->nsolo = m->nrecent = 0;
  m->solo_s = m->saved_s = NAN;
  m->size = size;
  snprintf(key, sizeof key, "%s%d", KEY_SOLO, size);
  /* The key may not exist: a get that waits 0 ms answers at once. */
  if (get_text(m->store, key, text, sizeof text) == 0 && atof(text) > 0) m->solo_s = m->saved_s = atof(text);
  TIDE_INFO("multiplexing: foreground on %d worker(s): solo step %s", size,
            isnan(m->solo_s) ? "not measured at this size yet" : text);
}

/* Foreground, rank 0: one step's time into the rings, then the line. */
static void publish(struct tide__multiplex *m, const tide_trainer_t *tr) {
  long epoch = tide_comm_epoch(tr->comm);
  if (tr->ranks != m->size) resize(m, tr->ranks);
  if (epoch != m->epoch) m->counted = 0; /* a new membership: its first steps set up connections */
  m->epoch = epoch;
  int64_t active = 0;
  if (tide_store_add(m->store, KEY_ACTIVE, 0, &active) != 0) return;
  double step_s = tr->stats.step_s;
  if (m->counted++ >= SKIP_STEPS) {
    if (active == 0 && m->active_before == 0) push(m->solo, SOLO_KEEP, &m->nsolo, step_s);
    push(m->recent, RECENT_KEEP, &m->nrecent, step_s);
  }
  m->active_before = active;
  m->active_now = (int)active;
  if (m->nsolo >= 3) m->solo_s = median(m->solo, held(m->nsolo, SOLO_KEEP));
  if (!isnan(m->solo_s) && !(fabs(m->solo_s - m->saved_s) <= 0.01 * m->saved_s)) {
    char key[64], text[32];
    snprintf(key, sizeof key, "%s%d", KEY_SOLO, m->size);
    int n = snprintf(text, sizeof text, "%.6g", m->solo_s);
    if (tide_store_set(m->store, key, text, (size_t)n) == 0) m->saved_s = m->solo_s;
  }
  char line[96];
  int n = snprintf(line, sizeof line, "%ld %.6g %.6g %d", tr->step, isnan(m->solo_s) ? 0.0 : m->solo_s,
                   median(m->recent, held(m->nrecent, RECENT_KEEP)), m->size);
  tide_store_set(m->store, KEY_FOREGROUND, line, (size_t)n);
}

void tide__multiplex_step_end(tide_trainer_t *tr) {
  struct tide__multiplex *m = tr->multiplex;
  if (m->foreground) {
    if (tr->rank != 0) {
      m->size = 0; /* should it be rank 0 again, it starts afresh */
      m->solo_s = NAN;
    } else {
      if (m->store == NULL && !m->connect_failed) { /* rank 0 now, after a membership change */
        int rc = connect_to(m->where, m->token, CONNECT_MS, &m->store);
        if (rc != 0) {
          TIDE_WARN("multiplexing: cannot reach the job's store at %s (%s): no step times are published", m->where,
                    tide_strerror(rc));
          m->store = NULL;
          m->connect_failed = 1;
        }
      }
      if (m->store != NULL) publish(m, tr);
    }
    tr->stats.solo_step_s = m->solo_s;
    tr->stats.background_jobs = m->active_now;
  } else {
    tr->stats.paused_s = m->paused_s;
    tr->stats.pauses = m->pauses;
    m->paused_s = 0;
  }
}

/* Background: enters or leaves every watched foreground's count. */
static void set_running(struct tide__multiplex *m, int running) {
  for (int i = m->nwatch - 1; i >= 0; i--) {
    watch_t *w = &m->watch[i];
    if (w->counted == running) continue;
    int64_t now;
    if (tide_store_add(w->store, KEY_ACTIVE, running ? 1 : -1, &now) != 0) {
      watch_drop(m, i, "cannot be reached");
      continue;
    }
    w->counted = running;
    w->mark = w->step; /* judged again JUDGE_STEPS after a start */
  }
  if (m->running && !running) m->pauses++;
  if (m->running != running)
    TIDE_INFO("multiplexing: %s (%ld pause(s) so far)", running ? "running" : "pausing", m->pauses);
  m->running = running;
}

/* Rank 0 of a background job, at a step boundary: its progress into the
 * foregrounds' stores (and its own under tide sched) when it paused or
 * resumed, else at most once a second. */
static void show(struct tide__multiplex *m, long step) {
  int64_t now = tide__now_ns();
  if ((m->nwatch == 0 && m->own == NULL) || (step == m->shown_step && m->running == m->shown_running) ||
      (m->running == m->shown_running && now - m->shown_ns < 1000000000))
    return;
  m->shown_ns = now;
  char line[96];
  int n = snprintf(line, sizeof line, "%ld %s %ld", step, m->running || m->unguarded ? "running" : "paused",
                   m->pauses);
  int ok = 1;
  for (int i = 0; i < m->nwatch; i++) ok &= tide_store_set(m->watch[i].store, m->key, line, (size_t)n) == 0;
  if (m->own != NULL) ok &= tide_store_set(m->own, KEY_PROGRESS, line, (size_t)n) == 0;
  if (ok) {
    m->shown_step = step;
    m->shown_running = m->running;
  }
}

/* List mode: applies tide sched's list of foregrounds ("HOST:PORT TOKEN"
 * lines): watches the new ones, drops those no longer on it. 0 once a list
 * was read, 1 while there is none yet. */
static int follow_list(struct tide__multiplex *m) {
  double now = now_s();
  if (m->list_seen && now - m->list_read_s < (m->running ? LIST_RUNNING_S : LIST_PAUSED_S)) return 0;
  m->list_read_s = now;
  char text[sizeof m->list];
  int rc = get_text(m->own, KEY_FOREGROUNDS, text, sizeof text);
  if (rc == TIDE_ETIMEDOUT || rc == TIDE_ENOENT) return m->list_seen ? 0 : 1;
  if (rc != 0) {
    TIDE_WARN("multiplexing: the job's own store is gone (%s): this background job runs unguarded",
              tide_strerror(rc));
    m->unguarded = 1;
    return 0;
  }
  m->list_seen = 1;
  if (strcmp(text, m->list) == 0) return 0;
  snprintf(m->list, sizeof m->list, "%s", text);
  char wanted[MAX_WATCH][300], tokens[MAX_WATCH][256];
  int nwanted = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL && nwanted < MAX_WATCH;
       line = strtok_r(NULL, "\n", &save))
    if (sscanf(line, "%299s %255s", wanted[nwanted], tokens[nwanted]) == 2) nwanted++;
  for (int i = m->nwatch - 1; i >= 0; i--) {
    int keep = 0;
    for (int k = 0; k < nwanted; k++) keep |= strcmp(m->watch[i].where, wanted[k]) == 0;
    if (!keep) watch_drop(m, i, "has ended (tide sched no longer lists it)");
  }
  for (int k = 0; k < nwanted; k++) {
    int have = 0;
    for (int i = 0; i < m->nwatch; i++) have |= strcmp(m->watch[i].where, wanted[k]) == 0;
    if (!have && watch_add(m, wanted[k], tokens[k]) == NULL) m->list[0] = '\0'; /* try again next time */
  }
  return 0;
}

/* Reads foreground w's line: 0 to judge it, 1 when it was dropped, 2 when
 * it has published nothing yet and under tide sched (which lists whatever
 * runs, tide trainer or not) does not hold the background. */
static int watch_read(struct tide__multiplex *m, int i, double waited_s) {
  watch_t *w = &m->watch[i];
  char line[96];
  int rc = get_text(w->store, KEY_FOREGROUND, line, sizeof line);
  if (rc == TIDE_ETIMEDOUT || rc == TIDE_ENOENT) {
    if (waited_s > WAIT_WARN_S && !w->warned) {
      w->warned = 1;
      TIDE_WARN("multiplexing: the foreground at %s has published no step times for %.0f s: is it a tide trainer "
                "started with tiderun --hosts-background (TIDE_HOSTS_BACKGROUND=1)? This job waits for it",
                w->where, waited_s);
    }
    return m->list_mode ? 2 : 0; /* nothing yet: its solo time is not known */
  }
  if (rc != 0) {
    watch_drop(m, i, "has gone (its store does not answer)");
    return 1;
  }
  if (strcmp(line, "done") == 0) {
    watch_drop(m, i, "is done");
    return 1;
  }
  long step;
  double solo, recent;
  int size = 0;
  if (sscanf(line, "%ld %lf %lf %d", &step, &solo, &recent, &size) < 3) {
    TIDE_WARN("multiplexing: cannot read the foreground's step times (\"%s\" at %s)", line, w->where);
    watch_drop(m, i, "publishes what this guard cannot read");
    return 1;
  }
  if (w->published && size != w->size) {
    if (solo > 0)
      TIDE_INFO("multiplexing: the foreground at %s runs on %d worker(s) now (was %d); its solo step there: known, "
                "%.4f s", w->where, size, w->size, solo);
    else
      TIDE_INFO("multiplexing: the foreground at %s runs on %d worker(s) now (was %d); its solo step there: to be "
                "measured (the background waits)", w->where, size, w->size);
    w->mark = step; /* judged at the new size only */
  }
  w->published = 1;
  w->step = step, w->solo = solo, w->recent = recent, w->size = size;
  return 0;
}

/* Foreground w's verdict: 1 to hold the background. */
static int watch_judge(struct tide__multiplex *m, watch_t *w) {
  if (!(w->solo > 0)) {
    if (!w->need_solo) { /* held for a slowdown too, perhaps: now it waits for the solo time */
      w->held = w->need_solo = 1;
      TIDE_INFO("multiplexing: the foreground at %s has no solo step time at its size (%d worker(s)): pausing so it "
                "measures one", w->where, w->size);
    }
    return 1;
  }
  double limit = w->solo * (double)tide__param_int(TIDE__PARAM_GUARD_PERCENT) / 100.0;
  if (w->held && w->need_solo) {
    w->held = w->need_solo = 0;
    w->backoff = JUDGE_STEPS;
    w->mark = w->step;
    TIDE_INFO("multiplexing: the foreground at %s: solo step %.4f s on %d worker(s) (pause above %.4f s)", w->where,
              w->solo, w->size, limit);
  } else if (w->held && w->step >= w->mark + w->backoff && w->recent <= limit) {
    w->held = 0;
    TIDE_INFO("multiplexing: the foreground at %s: recent step %.4f s <= %.4f s", w->where, w->recent, limit);
  } else if (!w->held && m->running && w->step >= w->mark + JUDGE_STEPS) {
    w->mark = w->step;
    if (w->recent > limit) {
      w->held = 1;
      w->backoff = w->backoff * 2 < BACKOFF_MAX ? w->backoff * 2 : BACKOFF_MAX;
      TIDE_INFO("multiplexing: the foreground at %s: recent step %.4f s > %.4f s (its solo step x %d%%): pausing "
                "for at least %ld of its steps", w->where, w->recent, limit,
                (int)tide__param_int(TIDE__PARAM_GUARD_PERCENT), w->backoff);
    } else {
      w->backoff = JUDGE_STEPS;
    }
  }
  return w->held;
}

/* Rank 0 of a background job: 1 to take the next step, 0 to wait. */
static int decide(struct tide__multiplex *m, double waited_s) {
  if (m->unguarded) return 1;
  if (m->list_mode && follow_list(m) != 0) {
    if (waited_s > WAIT_WARN_S && !m->warned) {
      m->warned = 1;
      TIDE_WARN("multiplexing: no list of foregrounds in this job's store after %.0f s: TIDE_FOREGROUND_LIST=1 is "
                "for jobs tide sched starts (tide submit --background); this job waits for it", waited_s);
    }
    return 0;
  }
  if (m->unguarded) return 1;
  int hold = 0;
  for (int i = m->nwatch - 1; i >= 0; i--)
    if (watch_read(m, i, waited_s) == 0) hold |= watch_judge(m, &m->watch[i]);
  if (m->unguarded) return 1;
  if (hold == m->running) set_running(m, !hold);
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
