/* The cluster scheduler (src/sched): the speedup function (linear without a
 * model, the exploration cap, memoised values equal fresh ones), the
 * allocator's constraints under every policy (node capacity, each job's
 * min/max, one multi-node job per node), determinism for a seed, the
 * genetic search at least as good as the greedy allocation on the same
 * inputs, the throughput fit on profiles of a known model, and a tiny
 * simulated workload (traces written here) in which every job completes
 * under every policy, plus bad input named in errors. No timings. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static int close_to(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b); }

static tide_sched_hints_t hints_for(unsigned seed, int seen) {
  unsigned s = seed;
  double u[6];
  for (int i = 0; i < 6; i++) u[i] = (harness_rand(&s) % 1000) / 1000.0;
  tide_sched_hints_t h = {
      .model = {.alpha_c = 0.01 + 0.05 * u[0], .beta_c = 0.0005 + 0.002 * u[1], .alpha_n = 0.05 + 0.2 * u[2],
                .beta_n = 0.005 * u[3], .alpha_r = 0.01 + 0.02 * u[4], .beta_r = 0.001 * u[3], .gamma = 1 + u[5]},
      .fitted = 1,
      .grad_sqr = 1,
      .grad_var = 2 + 50 * u[5],
      .limits = {.base_batch = 32, .max_batch = 4096, .min_atomic = 8, .max_atomic = 128, .max_passes = 8},
      .max_replicas_seen = seen};
  return h;
}

static void test_speedup(void) {
  tide_sched_hints_t none = {.fitted = 0, .max_replicas_seen = 3};
  tide_speedup_t *sp;
  CHECK_OK(tide_speedup_create(&none, &sp));
  CHECK(tide_speedup_max_slots(sp) == 12);
  for (int k = 1; k <= 12; k++) CHECK(tide_speedup_eval(sp, 1, k) == k && tide_speedup_eval(sp, k, k) == k);
  CHECK(tide_speedup_eval(sp, 2, 20) == 12); /* capped at 4x the largest measured */
  CHECK(tide_speedup_eval(sp, 1, 0) == 0 && tide_speedup_eval(sp, 3, 2) == 0);
  tide_speedup_destroy(sp);
  none.max_replicas_seen = 0; /* a new job: one slot */
  CHECK_OK(tide_speedup_create(&none, &sp));
  CHECK(tide_speedup_max_slots(sp) == 1 && tide_speedup_eval(sp, 1, 4) == 1);
  tide_speedup_destroy(sp);

  tide_sched_hints_t h = hints_for(7, 16);
  tide_speedup_t *fresh;
  CHECK_OK(tide_speedup_create(&h, &sp));
  CHECK(close_to(tide_speedup_eval(sp, 1, 1), 1, 1e-12));
  double phi = h.limits.base_batch * h.grad_var / h.grad_sqr;
  tide_pollux_choice_t one, c;
  CHECK_OK(tide_pollux_optimize(&h.model, &h.limits, 1, 1, phi, &one));
  for (int round = 0; round < 2; round++) /* the second round reads the memo */
    for (int k = 1; k <= 72; k++)
      for (int n = 1; n <= k && n <= 8; n++) {
        CHECK_OK(tide_speedup_create(&h, &fresh));
        double v = tide_speedup_eval(sp, n, k), w = tide_speedup_eval(fresh, n, k);
        tide_speedup_destroy(fresh);
        int kk = k > 64 ? 64 : k; /* 4 x the 16 measured */
        CHECK_OK(tide_pollux_optimize(&h.model, &h.limits, n, kk, phi, &c));
        CHECK(v == w && close_to(v, c.goodput / one.goodput, 1e-12));
      }
  CHECK(tide_speedup_eval(sp, 2, 72) == tide_speedup_eval(sp, 2, 64));
  tide_speedup_destroy(sp);
  h.grad_sqr = 0;
  CHECK_RC(tide_speedup_create(&h, &sp), TIDE_EINVAL);
  printf("speedup: ok\n");
}

/* Field by field: the structs' padding bytes are not part of the value. */
static int same_hints(const tide_sched_hints_t *a, const tide_sched_hints_t *b) {
  return memcmp(&a->model, &b->model, sizeof a->model) == 0 && a->fitted == b->fitted &&
         a->grad_sqr == b->grad_sqr && a->grad_var == b->grad_var && a->limits.base_batch == b->limits.base_batch &&
         a->limits.max_batch == b->limits.max_batch && a->limits.min_atomic == b->limits.min_atomic &&
         a->limits.max_atomic == b->limits.max_atomic && a->limits.max_passes == b->limits.max_passes &&
         a->max_replicas_seen == b->max_replicas_seen;
}

static void test_hints(void) {
  tide_sched_hints_t h = hints_for(7, 16), back;
  h.model.alpha_c = 0.1 + 1e-17; /* not a short decimal: must round-trip exactly */
  char text[TIDE_SCHED_HINTS_MAX], small[40];
  CHECK_OK(tide_sched_hints_encode(&h, text, sizeof text));
  CHECK_OK(tide_sched_hints_decode(text, &back));
  CHECK(same_hints(&h, &back));
  CHECK_RC(tide_sched_hints_encode(&h, small, sizeof small), TIDE_EINVAL);
  CHECK_RC(tide_sched_hints_decode("tide-hints 2 fitted=1", &back), TIDE_EINVAL);
  CHECK_RC(tide_sched_hints_decode("tide-hints 1 fitted=1", &back), TIDE_EINVAL); /* fields missing */
  char bad[TIDE_SCHED_HINTS_MAX + 32];
  snprintf(bad, sizeof bad, "%s speed=3", text);
  CHECK_RC(tide_sched_hints_decode(bad, &back), TIDE_EINVAL);
  snprintf(bad, sizeof bad, "%s", text);
  char *g = strstr(bad, "gamma=");
  CHECK(g != NULL);
  g[6] = 'x';
  CHECK_RC(tide_sched_hints_decode(bad, &back), TIDE_EINVAL);
  CHECK_RC(tide_sched_hints_decode(NULL, &back), TIDE_EINVAL);
  CHECK(same_hints(&h, &back)); /* untouched by the failures */
  printf("hints: ok\n");
}

static void test_fit(void) {
  tide_pollux_model_t truth = {.alpha_c = 0.02, .beta_c = 0.001, .alpha_n = 0.08, .beta_n = 0.004,
                               .alpha_r = 0.02, .beta_r = 0.001, .gamma = 1.5};
  tide_pollux_profile_t p[32];
  int n = 0;
  static const int shapes[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 4}, {2, 8}, {4, 16}};
  for (int s = 0; s < 6; s++)
    for (int a = 16; a <= 64; a *= 2) {
      double t_acc = truth.alpha_c + truth.beta_c * a;
      double rate = tide_pollux_throughput(&truth, shapes[s][0], shapes[s][1], a, 0);
      p[n++] = (tide_pollux_profile_t){shapes[s][0], shapes[s][1], a, t_acc, shapes[s][1] * a / rate};
    }
  tide_pollux_model_t m;
  CHECK_OK(tide_pollux_fit(p, n, TIDE_POLLUX_FIT_OVERLAP | TIDE_POLLUX_FIT_RESTARTS, &m));
  for (int i = 0; i < n; i++) {
    double want = tide_pollux_throughput(&truth, p[i].nodes, p[i].replicas, p[i].atomic, 0);
    double got = tide_pollux_throughput(&m, p[i].nodes, p[i].replicas, p[i].atomic, 0);
    CHECK(close_to(got, want, 0.05));
  }
  /* one size seen: the exploration prior makes another host no cheaper */
  CHECK_OK(tide_pollux_fit(p + 6, 3, TIDE_POLLUX_FIT_OVERLAP | TIDE_POLLUX_FIT_EXPLORE, &m));
  CHECK(m.alpha_n >= 1.1 * m.alpha_r * (1 - 1e-12));
  CHECK_RC(tide_pollux_fit(p, 0, 0, &m), TIDE_EINVAL);
  p[0].t_acc = -1;
  CHECK_RC(tide_pollux_fit(p, 1, 0, &m), TIDE_EINVAL);
  printf("fit: ok\n");
}

enum { NODES = 4, SLOTS = 4, JOBS = 10 };

static void check_valid(const tide_sched_job_t *jobs, int njobs, const int *alloc, int allow_interference) {
  int used[NODES] = {0}, multi[NODES] = {0};
  for (int j = 0; j < njobs; j++) {
    int k = 0, nodes = 0;
    for (int n = 0; n < NODES; n++) {
      int v = alloc[j * NODES + n];
      CHECK(v >= 0);
      k += v;
      nodes += v > 0;
      used[n] += v;
    }
    CHECK(k == 0 || k >= (jobs[j].min_slots > 0 ? jobs[j].min_slots : 1));
    CHECK(jobs[j].max_slots == 0 || k <= jobs[j].max_slots);
    for (int n = 0; n < NODES; n++) multi[n] += nodes > 1 && alloc[j * NODES + n] > 0;
  }
  for (int n = 0; n < NODES; n++) {
    CHECK(used[n] <= SLOTS);
    if (!allow_interference) CHECK(multi[n] <= 1);
  }
}

static void make_jobs(tide_sched_job_t *jobs, tide_speedup_t **sp, int njobs, unsigned seed) {
  for (int j = 0; j < njobs; j++) {
    tide_sched_hints_t h = hints_for(seed * 100 + (unsigned)j, 1 + j % 8);
    CHECK_OK(tide_speedup_create(&h, &sp[j]));
    jobs[j] = (tide_sched_job_t){.id = (uint64_t)j + 1, .submit_time = 10.0 * j, .min_slots = j == 3 ? 2 : 0,
                                 .max_slots = j == 4 ? 3 : tide_speedup_max_slots(sp[j]), .requested = 1 + j % 5,
                                 .attained = 100.0 * (j % 4), .resize_cost = 30, .resizes = j % 3,
                                 .remaining = 1000.0 * (1 + j), .speedup = tide_speedup_cb, .speedup_arg = sp[j]};
  }
}

static void test_allocator(void) {
  int slots[NODES], current[JOBS * NODES] = {0}, next[JOBS * NODES], again[JOBS * NODES], greedy[JOBS * NODES];
  for (int n = 0; n < NODES; n++) slots[n] = SLOTS;
  /* jobs 0 and 1 run now: 0 over nodes 0 and 1, 1 on node 2 */
  current[0 * NODES + 0] = 2, current[0 * NODES + 1] = 2, current[1 * NODES + 2] = 3;
  tide_sched_job_t jobs[JOBS];
  tide_speedup_t *sp[JOBS];
  make_jobs(jobs, sp, JOBS, 1);
  for (int policy = TIDE_SCHED_POLLUX; policy <= TIDE_SCHED_OPTIMUS; policy++)
    for (int allow = 0; allow < 2; allow++) {
      tide_sched_options_t o;
      tide_sched_options_init(&o);
      o.policy = (tide_sched_policy_t)policy;
      o.allow_interference = allow;
      o.seed = 42;
      tide_sched_t *a, *b;
      CHECK_OK(tide_sched_create(&o, NODES, slots, &a));
      CHECK_OK(tide_sched_create(&o, NODES, slots, &b));
      for (int round = 0; round < 3; round++) {
        const int *cur = round == 0 ? current : next;
        int tmp[JOBS * NODES];
        memcpy(tmp, cur, sizeof tmp);
        CHECK_OK(tide_sched_allocate(a, 600.0 + 60 * round, jobs, JOBS, tmp, next));
        CHECK_OK(tide_sched_allocate(b, 600.0 + 60 * round, jobs, JOBS, tmp, again));
        CHECK(memcmp(next, again, sizeof next) == 0); /* same seed, same answer */
        check_valid(jobs, JOBS, next, allow || policy >= TIDE_SCHED_FIFO);
        if (policy == TIDE_SCHED_FIFO || policy == TIDE_SCHED_TIRESIAS) {
          int used = 0;
          for (int j = 0; j < JOBS; j++) {
            int k = 0;
            for (int n = 0; n < NODES; n++) k += next[j * NODES + n];
            if (j >= 2 || policy == TIDE_SCHED_TIRESIAS) CHECK(k == 0 || k == jobs[j].requested || (j == 4 && k == 3));
            used += k;
          }
          CHECK(used > 0);
        }
      }
      tide_sched_destroy(a);
      tide_sched_destroy(b);
    }
  /* The genetic search against the greedy allocation it is seeded with,
   * over several random instances. */
  for (unsigned seed = 1; seed <= 6; seed++) {
    tide_sched_job_t more[JOBS];
    tide_speedup_t *msp[JOBS];
    make_jobs(more, msp, JOBS, seed + 10);
    tide_sched_options_t o;
    tide_sched_options_init(&o);
    tide_sched_t *ga, *gr;
    o.seed = seed;
    CHECK_OK(tide_sched_create(&o, NODES, slots, &ga));
    o.policy = TIDE_SCHED_GREEDY;
    CHECK_OK(tide_sched_create(&o, NODES, slots, &gr));
    CHECK_OK(tide_sched_allocate(ga, 600, more, JOBS, current, next));
    CHECK_OK(tide_sched_allocate(gr, 600, more, JOBS, current, greedy));
    double f_ga = tide_sched_fitness(ga, 600, more, JOBS, current, next);
    double f_gr = tide_sched_fitness(ga, 600, more, JOBS, current, greedy);
    double f_now = tide_sched_fitness(ga, 600, more, JOBS, current, current);
    printf("  instance %u: fitness genetic %.4f, greedy %.4f, current %.4f\n", seed, f_ga, f_gr, f_now);
    CHECK(f_ga >= f_gr && f_ga >= f_now);
    tide_sched_destroy(ga);
    tide_sched_destroy(gr);
    for (int j = 0; j < JOBS; j++) tide_speedup_destroy(msp[j]);
  }
  /* bad arguments */
  tide_sched_options_t o;
  tide_sched_options_init(&o);
  tide_sched_t *s;
  int bad[NODES] = {4, 0, 4, 4};
  CHECK_RC(tide_sched_create(&o, NODES, bad, &s), TIDE_EINVAL);
  CHECK_RC(tide_sched_create(&o, 0, slots, &s), TIDE_EINVAL);
  CHECK_OK(tide_sched_create(&o, NODES, slots, &s));
  int over[JOBS * NODES] = {0};
  over[0] = 3, over[NODES] = 3; /* 6 slots on node 0 */
  CHECK_RC(tide_sched_allocate(s, 0, jobs, JOBS, over, next), TIDE_EINVAL);
  jobs[2].min_slots = 5, jobs[2].max_slots = 2;
  CHECK_RC(tide_sched_allocate(s, 0, jobs, JOBS, NULL, next), TIDE_EINVAL);
  tide_sched_destroy(s);
  tide_sched_policy_t p;
  CHECK_RC(tide_sched_policy_parse("lottery", &p), TIDE_EINVAL);
  CHECK_OK(tide_sched_policy_parse("tiresias", &p));
  CHECK(p == TIDE_SCHED_TIRESIAS && strcmp(tide_sched_policy_name(p), "tiresias") == 0);
  for (int j = 0; j < JOBS; j++) tide_speedup_destroy(sp[j]);
  printf("allocator: ok\n");
}

/* ---- a tiny simulated workload ---- */

static void write_file(const char *dir, const char *name, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fputs(text, f);
  fclose(f);
}

/* A toy application: compute 0.02 + 0.002 s per sample, exchange 0.02 s
 * within a host and 0.06 s across, 3 epochs of 2000 base steps. */
static void write_toy(const char *dir) {
  char app[256], path[512];
  snprintf(app, sizeof app, "%s/toy", dir);
  CHECK(mkdir(app, 0700) == 0);
  snprintf(path, sizeof path, "%s/placements.csv", app);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fputs("placement,local_bsz,step_time,sync_time\n", f);
  static const char *const keys[] = {"1", "2", "3", "4", "11", "12", "13", "14", "22", "23", "24", "33", "34", "44"};
  for (unsigned k = 0; k < sizeof keys / sizeof *keys; k++)
    for (int b = 8; b <= 64; b *= 2) {
      int nodes = (int)strlen(keys[k]), replicas = 0;
      for (int i = 0; i < nodes; i++) replicas += keys[k][i] - '0';
      double sync = nodes > 1 ? 0.06 + 0.002 * replicas : replicas > 1 ? 0.02 : 0.0;
      fprintf(f, "%s,%d,%g,%g\n", keys[k], b, 0.02 + 0.002 * b + sync, sync);
    }
  fclose(f);
  snprintf(path, sizeof path, "%s/scalability.csv", app);
  f = fopen(path, "w");
  CHECK(f != NULL);
  fputs("num_nodes,num_replicas,local_bsz,step_time,sync_time\n", f);
  for (int nodes = 3; nodes <= 4; nodes++)
    for (int replicas = nodes; replicas <= 4 * nodes; replicas++)
      for (int b = 8; b <= 64; b *= 2) {
        double sync = 0.06 + 0.002 * replicas;
        fprintf(f, "%d,%d,%d,%g,%g\n", nodes, replicas, b, 0.02 + 0.002 * b + sync, sync);
      }
  fclose(f);
  write_file(app, "validation-32.csv",
             "progress,iteration,metric,grad_sqr,grad_var\n2000,2000,0.5,1.0,20\n4000,4000,0.6,0.5,20\n"
             "6000,6000,0.7,0.2,20\n");
  write_file(app, "validation-256.csv",
             "progress,iteration,metric,grad_sqr,grad_var\n2001,300,0.5,1.0,22\n4002,600,0.6,0.5,22\n"
             "6003,900,0.7,0.2,22\n");
}

static void test_sim(void) {
  char dir[] = "/tmp/tide-test-sched-XXXXXX", path[512], bad[512];
  CHECK(mkdtemp(dir) != NULL);
  write_toy(dir);
  write_file(dir, "workload.csv",
             "name,time,application,num_replicas,batch_size\nt0,0,toy,2,64\nt1,30,toy,4,128\nt2,100,toy,1,32\n"
             "t3,200,toy,8,256\nt4,250,toy,2,64\nt5,900,toy,1,32\n");
  snprintf(path, sizeof path, "%s/workload.csv", dir);
  tide_sim_options_t o;
  tide_sim_options_init(&o);
  o.nodes = 2, o.slots = 4;
  for (int policy = TIDE_SCHED_POLLUX; policy <= TIDE_SCHED_OPTIMUS; policy++) {
    o.sched.policy = (tide_sched_policy_t)policy;
    tide_sim_result_t *r;
    CHECK_OK(tide_sim_run(&o, dir, path, &r));
    const tide_sim_job_t *jobs;
    int left, n = tide_sim_result_jobs(r, &jobs);
    double avg = tide_sim_result_avg_jct(r, &left);
    CHECK(n == 6 && left == 0 && avg > 0);
    for (int j = 0; j < n; j++) CHECK(jobs[j].start >= jobs[j].submit && jobs[j].finish > jobs[j].start);
    printf("  %-8s average JCT %.0f s, makespan %.0f s\n", tide_sched_policy_name(o.sched.policy), avg,
           tide_sim_result_makespan(r));
    if (policy == TIDE_SCHED_POLLUX) {
      char out[600];
      snprintf(out, sizeof out, "%s/summary.json", dir);
      CHECK_OK(tide_sim_write_summary((const tide_sim_result_t *const *)&r, 1, out));
      CHECK(access(out, R_OK) == 0);
      CHECK_RC(tide_sim_write_summary((const tide_sim_result_t *const *)&r, 1, "/nonexistent/dir/s.json"),
               TIDE_EIO);
    }
    tide_sim_result_free(r);
  }
  /* the command: a run with its summary and plots, then bad arguments */
  const char *tools = getenv("TIDE_TOOLS_DIR");
  if (tools != NULL) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s/tide' sim --quiet --cluster 2x4 --policy pollux,fifo --traces '%s' --out '%s/out' '%s' >/dev/null",
             tools, dir, dir, path);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/out/summary.json", dir);
    CHECK(access(cmd, R_OK) == 0);
    snprintf(cmd, sizeof cmd, "'%s/tide' sim --cluster 2y4 '%s' 2>/dev/null", tools, path);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
    snprintf(cmd, sizeof cmd, "'%s/tide' sim --quiet --traces '%s' --out '%s/out' '%s/none.csv' >/dev/null 2>&1",
             tools, dir, dir, dir);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    printf("  tide sim: ok\n");
  }
  /* bad input: a missing workload, a malformed line, an unknown
   * application, a missing traces directory, a bad option */
  tide_sim_result_t *r = NULL;
  snprintf(bad, sizeof bad, "%s/none.csv", dir);
  CHECK_RC(tide_sim_run(&o, dir, bad, &r), TIDE_ENOENT);
  write_file(dir, "bad.csv", "name,time,application,num_replicas,batch_size\nt0,0,toy,2,64\nt1,x,toy,4\n");
  snprintf(bad, sizeof bad, "%s/bad.csv", dir);
  CHECK_RC(tide_sim_run(&o, dir, bad, &r), TIDE_EINVAL);
  write_file(dir, "unknown.csv", "name,time,application,num_replicas,batch_size\nt0,0,nope,2,64\n");
  snprintf(bad, sizeof bad, "%s/unknown.csv", dir);
  CHECK(tide_sim_run(&o, dir, bad, &r) != 0);
  CHECK_RC(tide_sim_run(&o, "/nonexistent/traces", path, &r), TIDE_ENOENT);
  o.interval = 0;
  CHECK_RC(tide_sim_run(&o, dir, path, &r), TIDE_EINVAL);
  CHECK(r == NULL);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  printf("sim: ok\n");
}

/* One application as the trace-replay worker reads it (tide_trace_app_*):
 * the toy's step times, limits, progress and gain, and bad arguments. */
static void test_trace_app(void) {
  char dir[] = "/tmp/tide-test-sched-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  write_toy(dir);
  tide_trace_app_t *app;
  CHECK_RC(tide_trace_app_open("/nonexistent/traces", "toy", &app), TIDE_ENOENT);
  CHECK_RC(tide_trace_app_open(dir, "../toy", &app), TIDE_EINVAL);
  CHECK_OK(tide_trace_app_open(dir, "toy", &app));
  tide_pollux_limits_t l;
  CHECK_OK(tide_trace_app_limits(app, &l));
  CHECK(l.base_batch == 32 && l.max_batch == 256 && l.min_atomic == 8 && l.max_atomic == 64);
  double step, sync;
  int two[] = {2}, ones[] = {1, 1}, none[] = {0};
  CHECK_OK(tide_trace_app_time(app, two, 1, 16, &step, &sync));
  CHECK(close_to(step, 0.02 + 0.002 * 16 + 0.02, 1e-9) && close_to(sync, 0.02, 1e-9));
  CHECK_OK(tide_trace_app_time(app, ones, 2, 16, &step, &sync));
  CHECK(close_to(step, 0.02 + 0.002 * 16 + 0.064, 1e-9) && close_to(sync, 0.064, 1e-9));
  CHECK_RC(tide_trace_app_time(app, none, 1, 16, &step, &sync), TIDE_EINVAL);
  CHECK_RC(tide_trace_app_time(app, two, 1, 0, &step, &sync), TIDE_EINVAL);
  CHECK(tide_trace_app_total(app) == 6000); /* the least of the last epoch's progress */
  CHECK(tide_trace_app_gain(app, 32, 0) == 1);
  CHECK(close_to(tide_trace_app_gain(app, 256, 0), tide_adascale_gain(22, 1.0, 8), 1e-9));
  CHECK(close_to(tide_trace_app_gain(app, 256, 4500), tide_adascale_gain(22, 0.2, 8), 1e-9));
  CHECK(isnan(tide_trace_app_gain(app, 0, 0)));
  tide_trace_app_close(app);
  tide_trace_app_close(NULL);
  /* tide sim's optional sixth column: a job that runs part of its application (as a live
   * trace-replay job with --work does) completes sooner; a work out of (0, 1] is refused. */
  char path[600];
  double finish[2];
  for (int k = 0; k < 2; k++) {
    write_file(dir, "part.csv", k == 0 ? "name,time,application,num_replicas,batch_size,work\nt0,0,toy,2,64,0.5\n"
                                       : "name,time,application,num_replicas,batch_size,work\nt0,0,toy,2,64,1\n");
    snprintf(path, sizeof path, "%s/part.csv", dir);
    tide_sim_options_t o;
    tide_sim_options_init(&o);
    o.nodes = 1, o.slots = 4, o.resize_cost = 0, o.sched.policy = TIDE_SCHED_FIFO;
    tide_sim_result_t *r;
    CHECK_OK(tide_sim_run(&o, dir, path, &r));
    const tide_sim_job_t *jobs;
    CHECK(tide_sim_result_jobs(r, &jobs) == 1 && jobs[0].finish > 0);
    finish[k] = jobs[0].finish - jobs[0].start;
    tide_sim_result_free(r);
  }
  CHECK(close_to(finish[0], finish[1] / 2, 0.05));
  /* start_cost: a job's start pauses it that long (the launch a live job pays), not the resize cost */
  double took[2];
  for (int k = 0; k < 2; k++) {
    tide_sim_options_t o;
    tide_sim_options_init(&o);
    o.nodes = 1, o.slots = 4, o.resize_cost = 0, o.start_cost = k == 0 ? 0 : 7, o.sched.policy = TIDE_SCHED_FIFO;
    tide_sim_result_t *r;
    CHECK_OK(tide_sim_run(&o, dir, path, &r));
    const tide_sim_job_t *jobs;
    CHECK(tide_sim_result_jobs(r, &jobs) == 1 && jobs[0].finish > 0);
    took[k] = jobs[0].finish - jobs[0].start;
    tide_sim_result_free(r);
  }
  CHECK(fabs(took[1] - took[0] - 7) < 1e-6);
  /* start_at_once: a job submitted between rounds starts at its submission under pollux (as tide
   * sched starts it), at the next round without it and under fifo */
  write_file(dir, "late.csv", "name,time,application,num_replicas,batch_size,work\nt0,30,toy,2,64,0.5\n");
  char late[600];
  snprintf(late, sizeof late, "%s/late.csv", dir);
  for (int k = 0; k < 3; k++) {
    tide_sim_options_t o;
    tide_sim_options_init(&o);
    o.nodes = 1, o.slots = 4, o.interval = 60, o.start_at_once = k > 0;
    o.sched.policy = k == 2 ? TIDE_SCHED_FIFO : TIDE_SCHED_POLLUX;
    tide_sim_result_t *r;
    CHECK_OK(tide_sim_run(&o, dir, late, &r));
    const tide_sim_job_t *jobs;
    CHECK(tide_sim_result_jobs(r, &jobs) == 1 && jobs[0].finish > jobs[0].start);
    CHECK(jobs[0].start == (k == 1 ? 30 : 60));
    tide_sim_result_free(r);
  }
  {
    tide_sim_options_t o;
    tide_sim_options_init(&o);
    o.start_cost = -2;
    tide_sim_result_t *r = NULL;
    CHECK_RC(tide_sim_run(&o, dir, path, &r), TIDE_EINVAL);
    CHECK(r == NULL);
  }
  write_file(dir, "part.csv", "name,time,application,num_replicas,batch_size,work\nt0,0,toy,2,64,1.5\n");
  tide_sim_options_t o;
  tide_sim_options_init(&o);
  tide_sim_result_t *r;
  CHECK_RC(tide_sim_run(&o, dir, path, &r), TIDE_EINVAL);
  printf("trace app: ok\n");
}

int main(void) {
  test_speedup();
  test_hints();
  test_fit();
  test_allocator();
  test_sim();
  test_trace_app();
  return 0;
}
