/* The trace-driven cluster simulator (docs/scheduling.md): the jobs of a
 * workload arrive, the allocator (alloc.c) divides the cluster among them
 * every interval, and each job runs at the throughput its application's
 * traces give for its placement and batch, making progress at the
 * statistical efficiency of its batch, until it has made its last epoch's
 * progress. Under Pollux each job's agent fits its throughput model to the
 * step times it has seen (tide_pollux_fit) and picks its batch with the
 * agent's optimiser (tide_pollux_optimize); the scheduler sees only those
 * hints, never the traces. Baselines run at the workload's batch: FIFO and
 * Tiresias at its size, Optimus with speedups from the true throughput. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sched/sched.h"

enum { MAX_PROFILES = 256 };

typedef struct {
  tide_sim_job_t out;
  int app;
  int requested;       /* the workload's size */
  double fixed_batch;  /* the workload's batch (0: the agent chooses) */
  double work;         /* the fraction of its application's progress it runs (optional column, 1) */
  int *row;            /* slots per node now */
  int nodes, slots;    /* of row */
  double atomic;
  int accum;
  double progress, attained, pause;
  int epoch, started, done;
  /* the agent */
  tide_pollux_profile_t *profiles;
  int nprofiles, max_seen, fitted;
  tide_pollux_model_t model;
  double grad_sqr, grad_var;
  tide_speedup_t *speedup;
} job_t;


typedef struct {
  const tide_sim_options_t *opts;
  tide__sim_app_t *apps;
  int napps;
  job_t *jobs;
  int njobs;
  double now;
} sim_t;

void tide_sim_options_init(tide_sim_options_t *opts) {
  *opts = (tide_sim_options_t){.nodes = 16, .slots = 4, .interval = 60, .resize_cost = 30, .start_cost = -1,
                               .arrival_scale = 1,
                               .copies = 1, .max_time = 30 * 86400.0};
  tide_sched_options_init(&opts->sched);
}

/* ---- the workload ---- */

static int app_index(sim_t *s, const char *dir, const char *name, const char *path, int line) {
  for (int i = 0; i < s->napps; i++)
    if (strcmp(s->apps[i].name, name) == 0) return i;
  tide__sim_app_t *a = tide__realloc(s->apps, (size_t)(s->napps + 1) * sizeof *a);
  if (a == NULL) return TIDE_ENOMEM;
  s->apps = a;
  int rc = tide__sim_app_load(dir, name, &s->apps[s->napps]);
  if (rc != 0) {
    TIDE_ERROR("sim: %s:%d: application '%s' has no usable traces in %s", path, line, name, dir);
    return rc;
  }
  return s->napps++;
}

static int read_workload(sim_t *s, const char *dir, const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    TIDE_ERROR("sim: cannot read the workload %s: %s", path, strerror(errno));
    return errno == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  }
  char *line = NULL;
  size_t cap = 0;
  int rc = 0, no = 0, room = 0;
  while (getline(&line, &cap, f) > 0) {
    no++;
    if (no == 1 && strncmp(line, "name,", 5) == 0) continue;
    if (line[strspn(line, " \r\n")] == 0) continue;
    char name[64], app[32], *save = NULL;
    char *fields[6];
    int nf = 0;
    for (char *t = strtok_r(line, ",\r\n", &save); t != NULL && nf < 6; t = strtok_r(NULL, ",\r\n", &save))
      fields[nf++] = t;
    char *end1, *end2, *end3, *end4 = "";
    int ok = nf == 5 || nf == 6;
    double time = ok ? strtod(fields[1], &end1) : 0;
    long replicas = ok ? strtol(fields[3], &end2, 10) : 0;
    double batch = ok ? strtod(fields[4], &end3) : 0;
    double work = nf == 6 ? strtod(fields[5], &end4) : 1;
    if (!ok || *end1 != 0 || *end2 != 0 || *end3 != 0 || *end4 != 0 || !(time >= 0) || replicas < 1 ||
        replicas > 1 << 20 || !(batch > 0) || !(work > 0 && work <= 1) || strlen(fields[0]) >= sizeof name ||
        strlen(fields[2]) >= sizeof app) {
      TIDE_ERROR("sim: %s:%d: expected name,time,application,num_replicas,batch_size[,work] with time >= 0, "
                 "num_replicas >= 1, batch_size > 0 and work in (0, 1]",
                 path, no);
      rc = TIDE_EINVAL;
      break;
    }
    strcpy(name, fields[0]);
    strcpy(app, fields[2]);
    int a = app_index(s, dir, app, path, no);
    if (a < 0) {
      rc = a;
      break;
    }
    for (int c = 0; c < s->opts->copies; c++) {
      if (s->njobs == room) {
        room = room ? 2 * room : 256;
        job_t *j = tide__realloc(s->jobs, (size_t)room * sizeof *j);
        if (j == NULL) {
          rc = TIDE_ENOMEM;
          break;
        }
        s->jobs = j;
      }
      job_t *j = &s->jobs[s->njobs++];
      *j = (job_t){.app = a, .requested = (int)replicas, .fixed_batch = batch, .work = work};
      if (s->opts->copies > 1) snprintf(j->out.name, sizeof j->out.name, "%.50s#%d", name, c);
      else snprintf(j->out.name, sizeof j->out.name, "%s", name);
      snprintf(j->out.application, sizeof j->out.application, "%s", app);
      j->out.submit = time * s->opts->arrival_scale;
      j->out.start = j->out.finish = -1;
    }
    if (rc != 0) break;
  }
  free(line);
  fclose(f);
  if (rc == 0 && s->njobs == 0) {
    TIDE_ERROR("sim: the workload %s has no jobs", path);
    rc = TIDE_EINVAL;
  }
  return rc;
}

/* ---- one job ---- */

static int elastic(const sim_t *s) {
  tide_sched_policy_t p = s->opts->sched.policy;
  return p == TIDE_SCHED_POLLUX || p == TIDE_SCHED_GREEDY;
}

/* Per-worker micro-batch and extra passes for global batch `batch`. */
static void shape(const tide__sim_app_t *app, int replicas, double batch, double *atomic, int *accum) {
  double local = ceil(batch / replicas - 1e-8);
  int passes = (int)ceil(local / app->max_local - 1e-8);
  if (passes < 1) passes = 1;
  *accum = passes - 1;
  *atomic = ceil(local / passes - 1e-8);
  if (*atomic < app->min_local) *atomic = app->min_local;
}

static tide_pollux_limits_t limits_of(const tide__sim_app_t *app) {
  return (tide_pollux_limits_t){.base_batch = app->init_batch, .max_batch = app->max_batch,
                                .min_atomic = app->min_local, .max_atomic = app->max_local, .max_passes = 1 << 20};
}

/* The batch the job runs at on its current allocation. */
static void choose_batch(const sim_t *s, job_t *j) {
  const tide__sim_app_t *app = &s->apps[j->app];
  if (j->slots == 0) return;
  if (!elastic(s)) {
    shape(app, j->slots, j->fixed_batch, &j->atomic, &j->accum);
  } else if (app->single_worker) {
    shape(app, j->slots, app->max_batch, &j->atomic, &j->accum);
  } else if (!j->fitted) {
    double b = app->init_batch > app->min_local * j->slots ? app->init_batch : app->min_local * j->slots;
    shape(app, j->slots, b, &j->atomic, &j->accum);
  } else {
    tide_pollux_limits_t limits = limits_of(app);
    tide_pollux_choice_t c;
    double phi = j->grad_sqr > 0 ? app->init_batch * j->grad_var / j->grad_sqr : 1e9;
    if (tide_pollux_optimize(&j->model, &limits, j->nodes, j->slots, phi, &c) == 0)
      j->atomic = c.atomic, j->accum = c.accum;
    else
      shape(app, j->slots, app->init_batch, &j->atomic, &j->accum);
  }
  j->out.batch = (double)j->slots * j->atomic * (j->accum + 1);
}

/* What the agent saw on a step: refit when the profile is new (the
 * traces have no noise, so a profile seen again adds nothing). */
static void observe(const sim_t *s, job_t *j, double step, double sync) {
  if (!elastic(s)) return;
  for (int i = 0; i < j->nprofiles; i++) {
    const tide_pollux_profile_t *p = &j->profiles[i];
    if (p->nodes == j->nodes && p->replicas == j->slots && p->atomic == j->atomic) return;
  }
  if (j->nprofiles == MAX_PROFILES) return;
  if (j->profiles == NULL) {
    j->profiles = tide__malloc(MAX_PROFILES * sizeof *j->profiles);
    if (j->profiles == NULL) return;
  }
  double t_acc = step - sync > 1e-6 ? step - sync : 1e-6;
  j->profiles[j->nprofiles++] = (tide_pollux_profile_t){j->nodes, j->slots, j->atomic, t_acc, step};
  if (j->slots > j->max_seen) j->max_seen = j->slots;
  tide_pollux_model_t m;
  if (tide_pollux_fit(j->profiles, j->nprofiles,
                      TIDE_POLLUX_FIT_OVERLAP | TIDE_POLLUX_FIT_EXPLORE | TIDE_POLLUX_FIT_RESTARTS, &m) == 0) {
    j->model = m;
    j->fitted = 1;
  }
}

static void counts_of(const sim_t *s, const job_t *j, int *counts) {
  int k = 0;
  for (int n = 0; n < s->opts->nodes; n++)
    if (j->row[n] > 0) counts[k++] = j->row[n];
}

/* Runs job j for `seconds` from s->now at a slowdown `slow`. */
static void run_job(sim_t *s, job_t *j, double seconds, double slow, int *counts) {
  const tide__sim_app_t *app = &s->apps[j->app];
  double t = s->now;
  if (j->slots == 0 || j->done) return;
  double pause = j->pause < seconds ? j->pause : seconds;
  j->pause -= pause;
  j->attained += pause * j->slots;
  t += pause;
  seconds -= pause;
  counts_of(s, j, counts);
  while (seconds > 0 && !j->done) {
    double step, sync;
    tide__sim_app_time(app, counts, j->nodes, j->atomic, &step, &sync);
    double batch = (double)j->slots * j->atomic * (j->accum + 1);
    double sqr, var;
    tide__sim_app_grad(app, batch, j->epoch, &sqr, &var);
    j->grad_sqr = sqr, j->grad_var = var;
    observe(s, j, step, sync);
    double gain = tide_adascale_gain(var, sqr, batch / app->init_batch);
    if (!(gain >= 1)) gain = 1;
    double total = step + j->accum * (step - sync);
    double rate = gain / total * (1 - slow);
    double next = tide__sim_app_progress(app, j->epoch + 1);
    /* A job that runs part of its application ends at that part's progress. */
    double target = j->work * tide__sim_app_progress(app, app->max_epochs);
    int last = j->work < 1 && next >= target;
    if (last) next = target;
    if (j->progress + rate * seconds < next) {
      j->progress += rate * seconds;
      j->attained += seconds * j->slots;
      break;
    }
    double dt = (next - j->progress) / rate;
    j->progress = next;
    j->epoch++;
    j->attained += dt * j->slots;
    t += dt;
    seconds -= dt;
    if (last || j->epoch >= app->max_epochs) {
      j->done = 1;
      j->out.finish = t;
      break;
    }
    choose_batch(s, j);
  }
}

/* ---- the allocator's view ---- */

/* Optimus's oracle: progress per second at the job's own batch on `slots`
 * packed slots, relative to one slot. */
typedef struct {
  const sim_t *s;
  const job_t *j;
  double one;
} oracle_t;

static double true_rate(const sim_t *s, const job_t *j, int nodes, int slots) {
  const tide__sim_app_t *app = &s->apps[j->app];
  int counts[64], per = s->opts->slots, left = slots;
  if (nodes > 64) nodes = 64;
  for (int n = 0; n < nodes; n++) {
    counts[n] = left < per ? left : per;
    left -= counts[n];
  }
  if (left > 0) counts[nodes - 1] += left;
  double atomic;
  int accum;
  shape(app, slots, j->fixed_batch, &atomic, &accum);
  double step, sync, sqr, var;
  tide__sim_app_time(app, counts, nodes, atomic, &step, &sync);
  double batch = (double)slots * atomic * (accum + 1);
  tide__sim_app_grad(app, batch, j->epoch, &sqr, &var);
  double gain = tide_adascale_gain(var, sqr, batch / app->init_batch);
  return gain / (step + accum * (step - sync));
}

static double oracle_speedup(void *arg, int nodes, int slots) {
  oracle_t *o = arg;
  return true_rate(o->s, o->j, nodes, slots) / o->one;
}

static int max_slots_of(const sim_t *s, const job_t *j) {
  const tide__sim_app_t *app = &s->apps[j->app];
  if (app->single_worker && s->opts->sched.policy != TIDE_SCHED_FIFO &&
      s->opts->sched.policy != TIDE_SCHED_TIRESIAS)
    return 1;
  int cap = 64; /* the traces measure up to 64 workers */
  double batch = elastic(s) ? app->max_batch : j->fixed_batch;
  int by_batch = (int)(batch / app->min_local);
  if (by_batch < 1) by_batch = 1;
  if (by_batch < cap) cap = by_batch;
  if (elastic(s) && j->speedup != NULL && tide_speedup_max_slots(j->speedup) < cap)
    cap = tide_speedup_max_slots(j->speedup);
  return cap;
}

static int record_round(tide_sim_result_t *r, double now, const sim_t *s, const int *active, int nactive,
                        const int *next) {
  if (r->nrounds == r->rounds_cap) {
    int cap = r->rounds_cap ? 2 * r->rounds_cap : 1024;
    tide__sim_round_t *p = tide__realloc(r->rounds, (size_t)cap * sizeof *p);
    if (p == NULL) return TIDE_ENOMEM;
    r->rounds = p;
    r->rounds_cap = cap;
  }
  tide__sim_round_t *rec = &r->rounds[r->nrounds++];
  rec->time = now;
  rec->first = (int)r->ncells;
  rec->count = 0;
  int N = s->opts->nodes;
  for (int a = 0; a < nactive; a++)
    for (int n = 0; n < N; n++) {
      int v = next[(size_t)a * N + n];
      if (v == 0) continue;
      if (r->ncells == r->cells_cap) {
        size_t cap = r->cells_cap ? 2 * r->cells_cap : 4096;
        int(*p)[3] = tide__realloc(r->cells, cap * sizeof *p);
        if (p == NULL) return TIDE_ENOMEM;
        r->cells = p;
        r->cells_cap = cap;
      }
      r->cells[r->ncells][0] = active[a];
      r->cells[r->ncells][1] = n;
      r->cells[r->ncells][2] = v;
      r->ncells++;
      rec->count++;
    }
  return 0;
}

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* start_at_once: the jobs submitted in [now, now + interval) that have not
 * started take one free slot each at their submission (tide sched starts a
 * new job on its minimum at once under the elastic policies); the pause
 * covers the time before it and the start cost. */
static void start_arrivals(sim_t *s, int *used) {
  const tide_sim_options_t *o = s->opts;
  if (!o->start_at_once || o->sched.policy == TIDE_SCHED_FIFO || o->sched.policy == TIDE_SCHED_TIRESIAS) return;
  int N = o->nodes;
  for (int n = 0; n < N; n++) used[n] = 0;
  for (int j = 0; j < s->njobs; j++)
    for (int n = 0; n < N; n++) used[n] += s->jobs[j].row[n];
  for (int j = 0; j < s->njobs; j++) {
    job_t *job = &s->jobs[j];
    if (job->started || job->done || job->out.submit < s->now || job->out.submit >= s->now + o->interval) continue;
    int n = 0;
    while (n < N && used[n] >= o->slots) n++;
    if (n == N) return;
    used[n]++;
    job->row[n] = 1, job->slots = job->nodes = 1;
    job->started = 1, job->out.start = job->out.submit;
    job->pause = job->out.submit - s->now + (o->start_cost >= 0 ? o->start_cost : o->resize_cost);
    choose_batch(s, job);
  }
}

static int check_options(const tide_sim_options_t *o) {
  if (o->nodes < 1 || o->slots < 1 || (long)o->nodes * o->slots > 1 << 20) {
    TIDE_ERROR("sim: cluster %d x %d: nodes and slots must be >= 1", o->nodes, o->slots);
    return TIDE_EINVAL;
  }
  if (!(o->start_cost >= 0 || o->start_cost == -1)) {
    TIDE_ERROR("sim: start cost %g must be >= 0 seconds (or -1: the resize cost)", o->start_cost);
    return TIDE_EINVAL;
  }
  if (!(o->interval > 0) || !(o->resize_cost >= 0) || !(o->interference >= 0 && o->interference < 1) ||
      !(o->arrival_scale > 0) || o->copies < 1 || !(o->max_time > 0)) {
    TIDE_ERROR("sim: interval %g must be > 0, resize cost %g >= 0, interference %g in [0, 1), arrival scale %g > 0, "
               "copies %d >= 1, max time %g > 0",
               o->interval, o->resize_cost, o->interference, o->arrival_scale, o->copies, o->max_time);
    return TIDE_EINVAL;
  }
  return 0;
}

int tide_sim_run(const tide_sim_options_t *opts, const char *traces_dir, const char *workload_csv,
                 tide_sim_result_t **out) {
  if (opts == NULL || traces_dir == NULL || workload_csv == NULL || out == NULL)
    return tide__null_arg("tide_sim_run", "opts, traces_dir, workload_csv or out");
  TIDE_CHECK(check_options(opts));
  struct stat st;
  if (stat(traces_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    TIDE_ERROR("sim: the traces directory %s does not exist (--traces DIR)", traces_dir);
    return TIDE_ENOENT;
  }
  sim_t s = {.opts = opts};
  tide_sched_t *sched = NULL;
  tide_sim_result_t *res = NULL;
  int N = opts->nodes, rc = 0;
  int *slots = NULL, *active = NULL, *current = NULL, *next = NULL, *counts = NULL, *owner = NULL;
  tide_sched_job_t *views = NULL;
  oracle_t *oracles = NULL;
  TIDE_CHECK_GOTO(read_workload(&s, traces_dir, workload_csv), rc, out);
  int J = s.njobs;
  res = tide__calloc(1, sizeof *res);
  slots = tide__malloc((size_t)N * sizeof *slots);
  active = tide__malloc((size_t)J * sizeof *active);
  current = tide__malloc((size_t)J * N * sizeof *current);
  next = tide__malloc((size_t)J * N * sizeof *next);
  counts = tide__malloc((size_t)N * sizeof *counts);
  owner = tide__malloc((size_t)N * sizeof *owner);
  views = tide__calloc((size_t)J, sizeof *views);
  oracles = tide__calloc((size_t)J, sizeof *oracles);
  if (res == NULL || slots == NULL || active == NULL || current == NULL || next == NULL || counts == NULL ||
      owner == NULL || views == NULL || oracles == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int j = 0; j < J; j++) {
    s.jobs[j].row = tide__calloc((size_t)N, sizeof(int));
    if (s.jobs[j].row == NULL) {
      rc = TIDE_ENOMEM;
      goto out;
    }
  }
  snprintf(res->policy, sizeof res->policy, "%s", tide_sched_policy_name(opts->sched.policy));
  snprintf(res->workload, sizeof res->workload, "%s", workload_csv);
  for (int n = 0; n < N; n++) slots[n] = opts->slots;
  TIDE_CHECK_GOTO(tide_sched_create(&opts->sched, N, slots, &sched), rc, out);
  int complete = 0;
  double round_sum = 0;
  for (s.now = 0; complete < J && s.now < opts->max_time; s.now += opts->interval) {
    start_arrivals(&s, counts);
    /* Interference: nodes that two multi-node jobs share. */
    for (int n = 0; n < N; n++) owner[n] = 0;
    for (int j = 0; j < J; j++)
      if (s.jobs[j].nodes > 1)
        for (int n = 0; n < N; n++) owner[n] += s.jobs[j].row[n] > 0;
    for (int j = 0; j < J; j++) {
      job_t *job = &s.jobs[j];
      double slow = 0;
      if (opts->interference > 0 && job->nodes > 1)
        for (int n = 0; n < N; n++)
          if (job->row[n] > 0 && owner[n] > 1) slow = opts->interference;
      run_job(&s, job, opts->interval, slow, counts);
      if (job->done && job->slots > 0) {
        memset(job->row, 0, (size_t)N * sizeof(int));
        job->slots = job->nodes = 0;
        complete++;
      }
    }
    double t = s.now + opts->interval;
    int nactive = 0;
    for (int j = 0; j < J; j++)
      if (!s.jobs[j].done && s.jobs[j].out.submit <= t) active[nactive++] = j;
    if (nactive > 0) {
      for (int a = 0; a < nactive; a++) {
        job_t *job = &s.jobs[active[a]];
        tide_sched_job_t *v = &views[a];
        const tide__sim_app_t *app = &s.apps[job->app];
        *v = (tide_sched_job_t){.id = (uint64_t)active[a] + 1, .submit_time = job->out.submit, .min_slots = 0,
                                .requested = job->requested, .attained = job->attained,
                                .resize_cost = opts->resize_cost, .resizes = job->out.resizes};
        memcpy(current + (size_t)a * N, job->row, (size_t)N * sizeof(int));
        if (elastic(&s)) {
          tide_speedup_destroy(job->speedup);
          job->speedup = NULL;
          tide_sched_hints_t h = {.model = job->model, .fitted = job->fitted, .grad_sqr = job->grad_sqr,
                                  .grad_var = job->grad_var, .limits = limits_of(app),
                                  .max_replicas_seen = job->max_seen};
          if (!(h.grad_sqr > 0)) h.fitted = 0;
          TIDE_CHECK_GOTO(tide_speedup_create(&h, &job->speedup), rc, out);
          v->speedup = tide_speedup_cb;
          v->speedup_arg = job->speedup;
        } else if (opts->sched.policy == TIDE_SCHED_OPTIMUS) {
          oracles[a] = (oracle_t){.s = &s, .j = job, .one = true_rate(&s, job, 1, 1)};
          v->speedup = oracle_speedup;
          v->speedup_arg = &oracles[a];
          double left = tide__sim_app_progress(app, app->max_epochs) - job->progress;
          v->remaining = left / oracles[a].one;
        }
        v->max_slots = max_slots_of(&s, job);
      }
      double t0 = seconds_now();
      TIDE_CHECK_GOTO(tide_sched_allocate(sched, t, views, nactive, current, next), rc, out);
      double spent = seconds_now() - t0;
      round_sum += spent;
      if (spent > res->round_max) res->round_max = spent;
      for (int a = 0; a < nactive; a++) {
        job_t *job = &s.jobs[active[a]];
        int *row = next + (size_t)a * N;
        if (memcmp(row, job->row, (size_t)N * sizeof(int)) == 0) continue;
        memcpy(job->row, row, (size_t)N * sizeof(int));
        job->nodes = job->slots = 0;
        for (int n = 0; n < N; n++)
          if (row[n] > 0) job->nodes++, job->slots += row[n];
        if (job->slots == 0) continue;
        job->pause = opts->resize_cost;
        if (job->started) {
          job->out.resizes++;
        } else {
          job->started = 1, job->out.start = t;
          if (opts->start_cost >= 0) job->pause = opts->start_cost;
        }
        choose_batch(&s, job);
      }
      TIDE_CHECK_GOTO(record_round(res, t, &s, active, nactive, next), rc, out);
    }
    if (opts->progress != NULL) opts->progress(opts->progress_arg, (double)complete / J, t);
  }
  res->round_mean = res->nrounds > 0 ? round_sum / res->nrounds : 0;
  res->jobs = tide__malloc((size_t)J * sizeof *res->jobs);
  if (res->jobs == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  res->njobs = J;
  for (int j = 0; j < J; j++) {
    res->jobs[j] = s.jobs[j].out;
    if (res->jobs[j].finish > res->makespan) res->makespan = res->jobs[j].finish;
  }
  if (complete < J)
    TIDE_WARN("sim: %d of %d jobs of %s did not complete within %g s", J - complete, J, workload_csv,
              opts->max_time);
out:
  for (int j = 0; j < s.njobs; j++) {
    tide__free(s.jobs[j].row);
    tide__free(s.jobs[j].profiles);
    tide_speedup_destroy(s.jobs[j].speedup);
  }
  tide__free(s.jobs);
  for (int i = 0; i < s.napps; i++) tide__sim_app_fini(&s.apps[i]);
  tide__free(s.apps);
  tide_sched_destroy(sched);
  tide__free(slots);
  tide__free(active);
  tide__free(current);
  tide__free(next);
  tide__free(counts);
  tide__free(owner);
  tide__free(views);
  tide__free(oracles);
  if (rc != 0) {
    tide_sim_result_free(res);
    return rc;
  }
  *out = res;
  return 0;
}

void tide_sim_result_free(tide_sim_result_t *r) {
  if (r == NULL) return;
  tide__free(r->jobs);
  tide__free(r->rounds);
  tide__free(r->cells);
  tide__free(r);
}

int tide_sim_result_jobs(const tide_sim_result_t *r, const tide_sim_job_t **jobs) {
  if (r == NULL) return 0;
  if (jobs != NULL) *jobs = r->jobs;
  return r->njobs;
}

double tide_sim_result_avg_jct(const tide_sim_result_t *r, int *incomplete) {
  double sum = 0;
  int n = 0, left = 0;
  for (int j = 0; r != NULL && j < r->njobs; j++) {
    if (r->jobs[j].finish < 0) {
      left++;
      continue;
    }
    sum += r->jobs[j].finish - r->jobs[j].submit;
    n++;
  }
  if (incomplete != NULL) *incomplete = left;
  return n > 0 ? sum / n : NAN;
}

double tide_sim_result_makespan(const tide_sim_result_t *r) { return r == NULL ? NAN : r->makespan; }

void tide_sim_result_round_time(const tide_sim_result_t *r, double *mean_s, double *max_s) {
  if (mean_s != NULL) *mean_s = r ? r->round_mean : NAN;
  if (max_s != NULL) *max_s = r ? r->round_max : NAN;
}
