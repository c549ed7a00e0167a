/* The burst-parallel planner (src/plan, docs/burst-parallel.md): the
 * dynamic program against exhaustive search on small chains and branch
 * blocks, the amplification bound on every layer of every plan, profile
 * files (tide's and DeepPool's) and the refusal of bad input with messages
 * that name it; nn_profile on tide's MLP. DeepPool's own files are used
 * when ../shared/data is there, never required. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "nn/nn.h"
#include "tide.h"

static const int batches[] = {1, 2, 4, 8, 16, 32, 64};

/* Layer i with inputs[..]: time t(b) = fixed + per_sample b (fwd 1/3, bwd
 * 2/3), random parameter and activation sizes. */
static tide_profile_t *random_profile(unsigned seed, int n, const int (*inputs)[3]) {
  tide_profile_t *p;
  CHECK_OK(tide_profile_create("toy", &p));
  unsigned s = seed;
  for (int i = 0; i < n; i++) {
    tide_profile_layer_t l = {.ninputs = 0};
    snprintf(l.name, sizeof l.name, "toy%d", i);
    for (int k = 0; k < 3 && inputs[i][k] != -2; k++) l.inputs[l.ninputs++] = inputs[i][k];
    l.param_bytes = (double)(harness_rand(&s) % 4 == 0 ? 0 : harness_rand(&s) % (8 << 20));
    l.act_bytes = (double)(harness_rand(&s) % (64 << 10));
    int idx;
    CHECK_OK(tide_profile_add_layer(p, &l, &idx));
    CHECK(idx == i);
    /* some layers mostly fixed cost (narrow is best), others mostly per sample */
    double fixed = 1e-4 * (harness_rand(&s) % 100) / 10.0, per = 1e-4 * (1 + harness_rand(&s) % 100) / 10.0;
    if (harness_rand(&s) % 2) per *= 0.05;
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
      double t = fixed + per * batches[b] * (0.8 + 0.4 * (harness_rand(&s) % 100) / 100.0);
      CHECK_OK(tide_profile_set_time(p, i, batches[b], t / 3, 2 * t / 3));
    }
  }
  return p;
}

/* Every layer's amplification within the limit, checked from the profile. */
static void check_bound(const tide_profile_t *p, const tide_plan_t *plan, const tide_plan_options_t *o) {
  const tide_plan_layer_t *L;
  int n = tide_plan_layers(plan, &L);
  CHECK(n == tide_profile_layer_count(p));
  CHECK(tide_plan_feasible(plan, o->amplification));
  for (int i = 0; i < n; i++) {
    int w = L[i].width;
    CHECK(w >= 1 && w <= o->workers && (w & (w - 1)) == 0);
    double base = tide_profile_time(p, i, o->global_batch);
    double mine = w * (tide_profile_time(p, i, (o->global_batch + w - 1) / w) + L[i].sync);
    CHECK(w == 1 || mine <= o->amplification * base * (1 + 1e-9));
  }
}

/* The least iteration time over all width assignments within the limit;
 * and in *least_work the least worker-time among those within `budget`
 * seconds. */
static double exhaustive(const tide_profile_t *p, const tide_plan_options_t *o, double budget, double *least_work) {
  int n = tide_profile_layer_count(p), nw = 0, widths[16], idx[16] = {0};
  for (int w = 1; w <= o->workers && w <= o->global_batch; w *= 2) nw++;
  double best = INFINITY;
  *least_work = INFINITY;
  for (;;) {
    for (int i = 0; i < n; i++) widths[i] = 1 << idx[i];
    tide_plan_t *q;
    CHECK_OK(tide_plan_evaluate(p, o, widths, &q));
    if (tide_plan_feasible(q, o->amplification) && tide_plan_iteration_time(q) < best)
      best = tide_plan_iteration_time(q);
    if (tide_plan_feasible(q, o->amplification) && tide_plan_iteration_time(q) <= budget &&
        tide_plan_worker_time(q) < *least_work)
      *least_work = tide_plan_worker_time(q);
    tide_plan_destroy(q);
    int i = 0;
    while (i < n && ++idx[i] == nw) idx[i++] = 0;
    if (i == n) break;
  }
  return best;
}

static void against_exhaustive(const char *what, int n, const int (*inputs)[3], int cases) {
  const double limits[] = {1.0, 1.3, 2.0, 4.0, 1e9};
  const double bandwidths[] = {1e9, 1e10, 1e11};
  int compared = 0, mixed = 0, slack_optimal = 0;
  for (int c = 0; c < cases; c++) {
    tide_profile_t *p = random_profile(1000u + (unsigned)c * 7919u, n, inputs);
    tide_plan_options_t o;
    tide_plan_options_init(&o);
    o.workers = c % 2 ? 8 : 4;
    o.global_batch = c % 3 ? 64 : 32;
    o.amplification = limits[c % 5];
    o.bandwidth = bandwidths[c % 3];
    o.latency = c % 2 ? 40e-6 : 0;
    tide_plan_t *plan;
    CHECK_OK(tide_plan_create(p, &o, &plan));
    check_bound(p, plan, &o);
    double unused, want = exhaustive(p, &o, 0, &unused), got = tide_plan_iteration_time(plan);
    if (!(fabs(got - want) <= 1e-9 * want)) {
      fprintf(stderr, "%s case %d: planner %.12g s, exhaustive search %.12g s\n", what, c, got, want);
      exit(1);
    }
    /* the plan's own widths evaluate to the same time */
    const tide_plan_layer_t *L;
    int widths[16];
    tide_plan_layers(plan, &L);
    for (int i = 0; i < n; i++) widths[i] = L[i].width;
    for (int i = 1; i < n; i++)
      if (widths[i] != widths[0]) {
        mixed++;
        break;
      }
    tide_plan_t *again;
    CHECK_OK(tide_plan_evaluate(p, &o, widths, &again));
    CHECK(fabs(tide_plan_iteration_time(again) - got) <= 1e-12 * got);
    tide_plan_destroy(again);
    /* data parallelism is one of the candidates when the limit allows it */
    tide_plan_options_t od = o;
    od.data_parallel = 1;
    tide_plan_t *dp;
    CHECK_OK(tide_plan_create(p, &od, &dp));
    for (int i = 0; i < n; i++) CHECK(tide_plan_layers(dp, &L) == n && L[i].width == o.workers);
    if (tide_plan_feasible(dp, o.amplification)) CHECK(got <= tide_plan_iteration_time(dp) * (1 + 1e-12));
    tide_plan_destroy(dp);
    /* time_slack: within the budget, no more worker-time than the fastest
     * plan; how often the least there is (the search is not exact) */
    tide_plan_options_t os = o;
    os.time_slack = 1.25;
    tide_plan_t *lean;
    CHECK_OK(tide_plan_create(p, &os, &lean));
    check_bound(p, lean, &os);
    double least, budget = got * os.time_slack * (1 + 1e-9);
    exhaustive(p, &o, budget, &least);
    CHECK(tide_plan_iteration_time(lean) <= budget);
    CHECK(tide_plan_worker_time(lean) <= tide_plan_worker_time(plan) * (1 + 1e-12));
    CHECK(tide_plan_worker_time(lean) >= least * (1 - 1e-12));
    slack_optimal += tide_plan_worker_time(lean) <= least * (1 + 1e-9);
    tide_plan_destroy(lean);
    tide_plan_destroy(plan);
    tide_profile_destroy(p);
    compared++;
  }
  printf("%s: %d cases identical to exhaustive search (%d with mixed widths); with time_slack 1.25, %d of them "
         "the least worker-time within it\n",
         what, compared, mixed, slack_optimal);
  CHECK(mixed >= compared / 3);
}

#define END -2

static void test_planner(void) {
  static const int chain[5][3] = {{-1, END}, {0, END}, {1, END}, {2, END}, {3, END}};
  against_exhaustive("chain of 5", 5, chain, 30);
  /* fork 0 -> {1 -> 2}, {3}, identity -> join 4 -> 5 */
  static const int branch[6][3] = {{-1, END}, {0, END}, {1, END}, {0, END}, {2, 3, 0}, {4, END}};
  against_exhaustive("branch block", 6, branch, 30);
  /* two blocks back to back: 0 -> {1}, {2} -> 3 -> {4}, identity -> 5 */
  static const int two[6][3] = {{-1, END}, {0, END}, {0, END}, {1, 2, END}, {3, END}, {4, 3, END}};
  against_exhaustive("two blocks", 6, two, 20);
  /* branches from the model's input */
  static const int at_input[4][3] = {{-1, END}, {-1, END}, {1, END}, {0, 2, END}};
  against_exhaustive("branches from the input", 4, at_input, 20);
}

/* Captures what the library logs (stderr) during fn. */
static char captured[8192];

static int capture(int (*fn)(void *), void *arg) {
  fflush(stderr);
  int saved = dup(2);
  char path[] = "/tmp/test_plan_logXXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0 && saved >= 0);
  dup2(fd, 2);
  int rc = fn(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  lseek(fd, 0, SEEK_SET);
  ssize_t got = read(fd, captured, sizeof captured - 1);
  captured[got > 0 ? got : 0] = '\0';
  close(fd);
  unlink(path);
  return rc;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  fputs(text, f);
  CHECK(fclose(f) == 0);
}

static const char *read_path;
static tide_profile_t *read_out;
static int do_read(void *arg) {
  (void)arg;
  return tide_profile_read(read_path, NULL, &read_out);
}

static void expect_bad_profile(const char *dir, const char *text, const char *want) {
  char path[512];
  snprintf(path, sizeof path, "%s/bad.prof", dir);
  write_file(path, text);
  read_path = path;
  read_out = NULL;
  CHECK_RC(capture(do_read, NULL), TIDE_EINVAL);
  CHECK(read_out == NULL);
  if (strstr(captured, want) == NULL) {
    fprintf(stderr, "wanted \"%s\" in the error, got: %s\n", want, captured);
    exit(1);
  }
}

static const tide_profile_t *plan_profile;
static tide_plan_options_t plan_opts;
static int do_plan(void *arg) {
  tide_plan_t *q = NULL;
  int rc = tide_plan_create(plan_profile, &plan_opts, &q);
  tide_plan_destroy(q);
  (void)arg;
  return rc;
}

static const char *widths_path;
static int widths_workers, widths_out[8];
static int do_widths(void *arg) {
  (void)arg;
  return tide_plan_read_widths(widths_path, plan_profile, widths_workers, widths_out);
}

static void expect_bad_widths(const char *path, int workers, const char *want) {
  widths_path = path;
  widths_workers = workers;
  CHECK_RC(capture(do_widths, NULL), TIDE_EINVAL);
  if (strstr(captured, want) == NULL) {
    fprintf(stderr, "wanted \"%s\" in the error, got: %s\n", want, captured);
    exit(1);
  }
}

static void test_files(void) {
  char dir[] = "/tmp/test_planXXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[512], plan_path[512];
  static const int chain[3][3] = {{-1, END}, {0, END}, {1, END}};
  tide_profile_t *p = random_profile(5, 3, chain);
  /* round trip */
  snprintf(path, sizeof path, "%s/toy.prof", dir);
  CHECK_OK(tide_profile_write(p, path));
  tide_profile_t *q;
  CHECK_OK(tide_profile_read(path, NULL, &q));
  CHECK(strcmp(tide_profile_model(q), "toy") == 0 && tide_profile_layer_count(q) == 3);
  for (int i = 0; i < 3; i++)
    for (int b = 1; b <= 128; b++)
      CHECK(fabs(tide_profile_time(q, i, b) - tide_profile_time(p, i, b)) <= 1e-8 * tide_profile_time(p, i, b));
  tide_profile_destroy(q);
  /* interpolation and extrapolation */
  CHECK(fabs(tide_profile_time(p, 0, 3) - 0.5 * (tide_profile_time(p, 0, 2) + tide_profile_time(p, 0, 4))) < 1e-15);
  CHECK(fabs(tide_profile_time(p, 0, 128) - 2 * tide_profile_time(p, 0, 64)) < 1e-15);

  /* malformed profiles name file:line */
  expect_bad_profile(dir, "tide-profile 1\nmodel m\nlayer 0 a inputs=-1 params=0 act=4\ntime 0 1 x 2\n", "bad.prof:4:");
  expect_bad_profile(dir, "tide-profile 1\nmodel m\nlayer 0 a inputs=3 params=0 act=4\n", "bad.prof:3:");
  expect_bad_profile(dir, "tide-profile 1\nmodel m\nlayer 0 a inputs=-1 params=0 act=4\nlayer 2 b inputs=0 params=0 act=4\n",
                     "bad.prof:4: layer indices");
  expect_bad_profile(dir, "tide-profile 1\nmodel m\nlayer 0 a inputs=-1 params=0 act=4\nlayer 1 b inputs=0 params=0 act=4\n"
                          "time 0 1 1 1\ntime 1 2 1 1\n", "has no time at batch");
  expect_bad_profile(dir, "tide-profile 2\n", "bad.prof:1: unknown version");
  expect_bad_profile(dir, "#config avg(ms) p50 p90 p99\nconv2d{\"in_channels\":3}[8][3,32,32] 1.0 1 1 1\nbogus line\n",
                     "bad.prof:3:");
  expect_bad_profile(dir,
                     "#config avg(ms) p50 p90 p99\nconv2d{\"in_channels\":3,\"kernel_size\":3,\"out_channels\":8,"
                     "\"padding\":1,\"stride\":1}[8][3,32,32] 1.0 1 1 1\nSUM(avg) 1\n#config avg(ms)\nlinear{\"in_features\":3}"
                     "[4]3 1.0 1 1 1\nSUM(avg) 1\n", "bad.prof:5: layer 0 is");

  /* bad options name the argument */
  plan_profile = p;
  tide_plan_options_init(&plan_opts);
  plan_opts.workers = 12, plan_opts.global_batch = 64;
  CHECK_RC(capture(do_plan, NULL), TIDE_EINVAL);
  CHECK(strstr(captured, "workers = 12 must be a power of two") != NULL);
  plan_opts.workers = 8, plan_opts.global_batch = 0;
  CHECK_RC(capture(do_plan, NULL), TIDE_EINVAL);
  CHECK(strstr(captured, "global batch = 0") != NULL);
  plan_opts.global_batch = 64, plan_opts.amplification = 0.5;
  CHECK_RC(capture(do_plan, NULL), TIDE_EINVAL);
  CHECK(strstr(captured, "amplification = 0.5") != NULL);
  plan_opts.amplification = 2, plan_opts.bandwidth = -1;
  CHECK_RC(capture(do_plan, NULL), TIDE_EINVAL);
  CHECK(strstr(captured, "bandwidth") != NULL);
  plan_opts.bandwidth = 1e10, plan_opts.time_slack = 0.9;
  CHECK_RC(capture(do_plan, NULL), TIDE_EINVAL);
  CHECK(strstr(captured, "time slack = 0.9") != NULL);
  plan_opts.time_slack = 1;

  /* a graph the planner does not take: an output nobody reads */
  {
    tide_profile_t *g;
    CHECK_OK(tide_profile_create("dangling", &g));
    tide_profile_layer_t l = {.name = "a", .ninputs = 1, .inputs = {-1}};
    CHECK_OK(tide_profile_add_layer(g, &l, NULL));
    CHECK_OK(tide_profile_add_layer(g, &l, NULL)); /* also from the input: layer 0 is never read */
    CHECK_OK(tide_profile_set_time(g, 0, 1, 1e-3, 0));
    CHECK_OK(tide_profile_set_time(g, 1, 1, 1e-3, 0));
    plan_profile = g;
    CHECK_RC(capture(do_plan, NULL), TIDE_EINVAL);
    CHECK(strstr(captured, "layer 0") != NULL && strstr(captured, "used by no layer") != NULL);
    tide_profile_destroy(g);
    plan_profile = p;
  }
  /* a layer whose input is not earlier */
  tide_profile_layer_t later = {.name = "x", .ninputs = 1, .inputs = {5}};
  CHECK_RC(tide_profile_add_layer(p, &later, NULL), TIDE_EINVAL);
  tide_profile_layer_t spaced = {.name = "a b", .ninputs = 1, .inputs = {0}};
  CHECK_RC(tide_profile_add_layer(p, &spaced, NULL), TIDE_EINVAL);

  /* plan files: written, read back; bad ones refused naming the field */
  tide_plan_t *plan;
  CHECK_OK(tide_plan_create(p, &plan_opts, &plan));
  snprintf(plan_path, sizeof plan_path, "%s/plan.json", dir);
  CHECK_OK(tide_plan_write(plan, p, plan_path));
  int widths[3];
  CHECK_OK(tide_plan_read_widths(plan_path, p, 8, widths));
  const tide_plan_layer_t *L;
  tide_plan_layers(plan, &L);
  for (int i = 0; i < 3; i++) CHECK(widths[i] == L[i].width);
  tide_plan_destroy(plan);
  snprintf(path, sizeof path, "%s/p.json", dir);
  write_file(path, "{\n\"model\": \"toy\",\n\"workers\": 8,\n\"layers\": [\n{\"index\": 0, \"width\": 3},\n"
                   "{\"index\": 1, \"width\": 2},\n{\"index\": 2, \"width\": 1}\n]\n}\n");
  expect_bad_widths(path, 8, "p.json:5: layer 0: \"width\" = 3 must be a power of two");
  write_file(path, "{\n\"model\": \"toy\",\n\"workers\": 8,\n\"layers\": [\n{\"index\": 0, \"width\": 8},\n"
                   "{\"index\": 1, \"width\": 2},\n{\"index\": 2, \"width\": 1}\n]\n}\n");
  expect_bad_widths(path, 4, "\"workers\" = 8 but the job has 4 workers");
  write_file(path, "{\n\"model\": \"other\",\n\"workers\": 8,\n\"layers\": []\n}\n");
  expect_bad_widths(path, 8, "\"model\" is \"other\" but the profile is of \"toy\"");
  write_file(path, "{\n\"model\": \"toy\",\n\"workers\": 8,\n\"layers\": [\n{\"index\": 0, \"width\": 8}\n]\n}\n");
  expect_bad_widths(path, 8, "1 layers, but the profile of toy has 3");
  int bad[3] = {1, 6, 1};
  tide_plan_t *ev = NULL;
  CHECK_RC(tide_plan_evaluate(p, &plan_opts, bad, &ev), TIDE_EINVAL);
  CHECK(ev == NULL);

  /* the command line refuses a W that is not a power of two, naming --workers */
  const char *tools = getenv("TIDE_TOOLS_DIR");
  char cmd[2048];
  if (tools != NULL) {
    snprintf(cmd, sizeof cmd, "%s/tide plan --profile %s/toy.prof --workers 12 --global-batch 64 --out %s/x.json "
             "2>%s/err.txt", tools, dir, dir, dir);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    snprintf(path, sizeof path, "%s/err.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t got = fread(captured, 1, sizeof captured - 1, f);
    captured[got] = '\0';
    fclose(f);
    CHECK(strstr(captured, "--workers: '12' is not a power of two") != NULL);
    snprintf(cmd, sizeof cmd, "%s/tide plan --profile %s/toy.prof --workers 8 --global-batch 64 --out %s/t.json "
             "--no-plot --quiet >/dev/null && %s/tide plan --profile %s/toy.prof --workers 8 --global-batch 64 "
             "--check %s/t.json --quiet >/dev/null", tools, dir, dir, tools, dir, dir);
    CHECK(system(cmd) == 0);
  }
  tide_profile_destroy(p);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
}

/* DeepPool's files, when the shared data is there: VGG-16 as a chain,
 * ResNet-152 with its downsample branches; plans within the bound and no
 * slower than data parallelism. */
static void test_deeppool(void) {
  const char *src = getenv("TIDE_SOURCE_DIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/../shared/data/deeppool-a100/vggLayerGpuProfileA100.txt", src ? src : ".");
  if (access(path, R_OK) != 0) {
    printf("deeppool: ../shared/data not here, skipped\n");
    return;
  }
  tide_profile_t *p;
  CHECK_OK(tide_profile_read(path, NULL, &p));
  CHECK(tide_profile_layer_count(p) == 22);
  const int *bs;
  CHECK(tide_profile_batches(p, &bs) == 8 && bs[0] == 1 && bs[7] == 128);
  CHECK(fabs(tide_profile_time(p, 0, 64) - 6.955e-3) < 1e-12);
  for (int w = 8; w <= 64; w *= 2) {
    tide_plan_options_t o;
    tide_plan_options_init(&o);
    o.workers = w, o.global_batch = 256;
    tide_plan_t *plan, *dp;
    CHECK_OK(tide_plan_create(p, &o, &plan));
    check_bound(p, plan, &o);
    o.data_parallel = 1;
    CHECK_OK(tide_plan_create(p, &o, &dp));
    CHECK(tide_plan_iteration_time(plan) <= tide_plan_iteration_time(dp));
    tide_plan_destroy(plan);
    tide_plan_destroy(dp);
  }
  tide_profile_destroy(p);
  snprintf(path, sizeof path, "%s/../shared/data/deeppool-a100/resnetLayerGpuProfileA100V2.txt", src ? src : ".");
  CHECK_OK(tide_profile_read(path, "RESNET152", &p));
  int joins = 0;
  for (int i = 0; i < tide_profile_layer_count(p); i++) joins += tide_profile_layer(p, i)->ninputs > 1;
  CHECK(joins >= 4); /* the downsample branch of each stage */
  tide_plan_options_t o;
  tide_plan_options_init(&o);
  o.workers = 64, o.global_batch = 256;
  tide_plan_t *plan;
  CHECK_OK(tide_plan_create(p, &o, &plan));
  check_bound(p, plan, &o);
  printf("deeppool: VGG-16 and ResNet-152 (%d layers, %d joins) planned within the bound\n",
         tide_profile_layer_count(p), joins);
  tide_plan_destroy(plan);
  tide_profile_destroy(p);
}

static void test_nn_profile(void) {
  tide_profile_t *p;
  const int bs[] = {1, 4};
  nn_set_threads(1);
  CHECK_OK(nn_profile("mlp", bs, 2, 1, 3, 0, &p));
  CHECK(tide_profile_layer_count(p) == 4); /* flatten, 3 dense */
  CHECK(tide_profile_layer(p, 1)->act_bytes == 256 * 4);
  CHECK(tide_profile_layer(p, 1)->param_bytes == (784 * 256 + 256) * 4);
  for (int i = 0; i < 4; i++) CHECK(tide_profile_time(p, i, 4) >= 0 && isfinite(tide_profile_time(p, i, 4)));
  CHECK(tide_profile_time(p, 1, 4) > 0);
  tide_profile_destroy(p);
  /* by CPU time: the same layers, a dense layer costs some CPU */
  CHECK_OK(nn_profile("mlp", bs, 2, 1, 3, NN_PROFILE_CPU_CLOCK, &p));
  CHECK(tide_profile_layer_count(p) == 4 && tide_profile_time(p, 1, 4) > 0);
  tide_profile_destroy(p);
  /* the layers alone, without times, for checking plan files */
  CHECK_OK(nn_profile_layers("cnn", &p));
  CHECK(tide_profile_layer_count(p) == 7 && strcmp(tide_profile_model(p), "cnn") == 0);
  CHECK(tide_profile_layer(p, 5)->param_bytes == (3136 * 128 + 128) * 4);
  tide_profile_destroy(p);
  CHECK_RC(nn_profile_layers("nope", &p), TIDE_EINVAL);
  CHECK_RC(nn_profile("mlp", bs, 0, 1, 3, 0, &p), TIDE_EINVAL);
  CHECK_RC(nn_profile("nope", bs, 2, 1, 3, 0, &p), TIDE_EINVAL);
}

int main(void) {
  test_planner();
  test_files();
  test_deeppool();
  test_nn_profile();
  return 0;
}
