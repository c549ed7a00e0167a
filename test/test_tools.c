/* The tide tool's commands that only the demo ran (issue 24, item 5), one
 * ctest entry each (test_tools_cases.h):
 *   ctl     `tide ctl` against a store server standing in for an elastic
 *           job's: status decodes the job's keys (counters, the target
 *           tide_elastic_request writes, done), resize writes the target and
 *           0 withdraws it; a wrong token, an unreachable store, bad
 *           arguments and no TIDE_JOB_TOKEN are errors that say what to do;
 *   report  `tide report` on a real tide-train run (2 ranks, 512 images):
 *           every key report reads is a number in each of tide-train's
 *           metrics lines (the schema they share by string keys), the seven
 *           PNGs are written and the scratch files removed; a folder
 *           without metrics, one without step records and bad usage fail;
 *   bench   `tide bench --interleave` at 2 ranks: at each size one checked
 *           line per op, in the order given, marked interleaved; without it
 *           the ops run one after another over the sizes; an unknown op
 *           says which ops there are.
 * Skips (77): report without gnuplot or Fashion-MNIST. */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static char tools_dir[1024];
static char output[1 << 16];

/* Runs the shell command made from fmt (stdout and stderr into output);
 * returns its exit status, or -1 when it did not exit. */
static int run(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[4200];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  CHECK(p != NULL);
  size_t len = fread(output, 1, sizeof output - 1, p);
  output[len] = '\0';
  int status = pclose(p);
  fprintf(stderr, "$ %s\n%s[exit %d]\n", cmd, output, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define CHECK_SAYS(text) CHECK(strstr(output, (text)) != NULL)

/* ---- tide ctl ------------------------------------------------------------------- */

static int case_ctl(void) {
  int server_pid;
  int port = harness_store_start("ctl-token", &server_pid);
  CHECK(port > 0);
  char rdzv[64];
  snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", port);
  const char *tide = tools_dir;

  /* Nothing set yet: every key is "-". */
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s status", tide, rdzv) == 0);
  CHECK_SAYS("epoch: -\n");
  CHECK_SAYS("target: -\n");
  CHECK_SAYS("done: -\n");

  /* The keys as a job writes them: counters (tide_store_add) and text. */
  tide_store_t *store;
  CHECK_OK(tide_store_connect("127.0.0.1", port, "ctl-token", 5000, &store));
  int64_t v;
  CHECK_OK(tide_store_add(store, "elastic/epoch", 3, &v));
  CHECK_OK(tide_store_add(store, "elastic/joiners", 5, &v));
  CHECK_OK(tide_store_add(store, "elastic/admitted", 4, &v));
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s resize 6", tide, rdzv) == 0);
  CHECK_SAYS("asked the job for 6 worker(s)");
  void *value;
  size_t len;
  CHECK_OK(tide_store_get(store, "elastic/target", 0, &value, &len));
  CHECK(len >= 1 && strncmp(value, "6", len) == 0);
  tide_free(value);
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s status", tide, rdzv) == 0);
  CHECK_SAYS("epoch: 3\n");
  CHECK_SAYS("target: 6\n");
  CHECK_SAYS("joiners: 5\n");
  CHECK_SAYS("admitted: 4\n");
  CHECK_SAYS("waiting: 1\n");
  CHECK_SAYS("done: -\n");
  /* The same state through the public accessor: epoch 3's members listed */
  tide_elastic_status_t st;
  CHECK_OK(tide_store_set(store, "elastic/e3/members", "r0 r1 j2", 8));
  CHECK_OK(tide_elastic_status(store, &st));
  CHECK(st.epoch == 3 && st.members == 3 && !st.failed && st.target == 6 && st.joiners == 5 && st.admitted == 4 &&
        st.waiting == 1 && !st.done);
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s status", tide, rdzv) == 0);
  CHECK_SAYS("members: 3\n");
  CHECK_OK(tide_store_set(store, "elastic/e3/members", "! too few", 9));
  CHECK_OK(tide_store_set(store, "elastic/done", "1", 1));
  CHECK_OK(tide_elastic_status(store, &st));
  CHECK(st.members == 0 && st.failed && st.done);
  CHECK(tide_elastic_status(NULL, &st) == TIDE_EINVAL && tide_elastic_status(store, NULL) == TIDE_EINVAL);
  /* resize 0 withdraws the request */
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s resize 0", tide, rdzv) == 0);
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s status", tide, rdzv) == 0);
  CHECK_SAYS("target: 0\n");
  tide_store_close(store);

  /* Errors: each names what to fix, none hangs. */
  CHECK(run("TIDE_JOB_TOKEN=not-the-token TIDE_TIMEOUT_MS=5000 %s/tide ctl --rdzv %s status", tide, rdzv) == 1);
  CHECK_SAYS("cannot reach the job's store");
  CHECK_SAYS("job token");
  CHECK(run("env -u TIDE_JOB_TOKEN %s/tide ctl --rdzv %s status", tide, rdzv) == 2);
  CHECK_SAYS("TIDE_JOB_TOKEN");
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv 127.0.0.1 status", tide) == 2);
  CHECK_SAYS("--rdzv expects HOST:PORT");
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s resize -1", tide, rdzv) == 2);
  CHECK_SAYS("worker count >= 0");
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s grow", tide, rdzv) == 2);
  CHECK_SAYS("usage: tide ctl");
  kill(server_pid, SIGKILL);
  waitpid(server_pid, NULL, 0);
  /* the store gone: a clear error within the connect timeout */
  CHECK(run("TIDE_JOB_TOKEN=ctl-token %s/tide ctl --rdzv %s status", tide, rdzv) == 1);
  CHECK_SAYS("cannot reach the job's store");
  return 0;
}

/* ---- tide report ---------------------------------------------------------------- */

/* Each line of metrics.jsonl of type `type` has every key as a number. */
static void check_keys(const char *path, const char *type, const char *const *keys, size_t nkeys) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char line[8192], want_type[64];
  snprintf(want_type, sizeof want_type, "\"type\":\"%s\"", type);
  int lines = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, want_type) == NULL) continue;
    lines++;
    for (size_t k = 0; k < nkeys; k++) {
      char pattern[96];
      snprintf(pattern, sizeof pattern, "\"%s\":", keys[k]);
      const char *at = strstr(line, pattern);
      char *end = NULL;
      if (at != NULL) strtod(at + strlen(pattern), &end);
      if (at == NULL || end == at + strlen(pattern)) {
        fprintf(stderr, "%s: a %s line has no number for \"%s\", which tide report reads:\n%s", path, type, keys[k],
                line);
        exit(1);
      }
    }
  }
  fclose(f);
  CHECK(lines > 0);
}

static int case_report(void) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr, "gnuplot not found (apt-get install gnuplot-nox): skipped\n");
    return 77;
  }
  if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
    fprintf(stderr, "no Fashion-MNIST in /usr/share/datasets/fashion-mnist: skipped\n");
    return 77;
  }
  char dir[] = "/tmp/tide-test-report-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK(run("%s/tiderun -np 2 %s/tide-train --subset 512 --epochs 2 --batch 32 --eval-every 4 --runs %s --name r",
            tools_dir, tools_dir, dir) == 0);
  char run_dir[1200], metrics[1300];
  snprintf(run_dir, sizeof run_dir, "%s/r", dir);
  snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
  static const char *const step_keys[] = {"step", "time_s", "loss", "images_per_s", "comm_s", "compute_s", "lr",
                                          "noise_scale", "global_batch", "lr_factor", "gain_ratio",
                                          "rank_compute_min_s", "rank_compute_median_s", "rank_compute_max_s",
                                          "data_s", "step_s"};
  static const char *const eval_keys[] = {"epoch", "step", "time_s", "test_loss", "test_accuracy"};
  check_keys(metrics, "step", step_keys, sizeof step_keys / sizeof step_keys[0]);
  check_keys(metrics, "epoch", eval_keys, sizeof eval_keys / sizeof eval_keys[0]);
  check_keys(metrics, "eval", eval_keys, sizeof eval_keys / sizeof eval_keys[0]);

  CHECK(run("%s/tide report %s", tools_dir, run_dir) == 0);
  CHECK_SAYS("(16 steps, 2 epochs)"); /* 512 images / 64 per step x 2 epochs; 2 epoch ends */
  static const char *const plots[] = {"loss_time", "loss_steps", "accuracy", "throughput", "comm_share",
                                      "adaptation", "data_wait"};
  for (size_t i = 0; i < sizeof plots / sizeof plots[0]; i++) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s.png", run_dir, plots[i]);
    FILE *f = fopen(path, "rb");
    unsigned char head[8] = {0};
    CHECK(f != NULL && fread(head, 1, 8, f) == 8);
    fclose(f);
    CHECK(memcmp(head, "\x89PNG\r\n\x1a\n", 8) == 0);
  }
  static const char *const scratch[] = {".steps.dat", ".epochs.dat", ".report.gp"};
  for (size_t i = 0; i < 3; i++) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", run_dir, scratch[i]);
    CHECK(access(path, F_OK) != 0);
  }

  /* Failures: no metrics, no step records, bad usage. */
  CHECK(run("%s/tide report %s/none", tools_dir, dir) == 1);
  CHECK_SAYS("a tide-train run folder?");
  char empty[1300];
  snprintf(empty, sizeof empty, "%s/empty", dir);
  CHECK(mkdir(empty, 0700) == 0);
  CHECK(run("grep -v '\"type\":\"step\"' %s > %s/metrics.jsonl", metrics, empty) == 0);
  CHECK(run("%s/tide report %s", tools_dir, empty) == 1);
  CHECK_SAYS("has no step records");
  CHECK(run("%s/tide report", tools_dir) == 2);
  CHECK_SAYS("usage: tide report RUN_DIR");
  CHECK(run("rm -rf %s", dir) == 0);
  return 0;
}

/* ---- the metrics line schema (what tide-train writes, tide report reads) ------- */

static int case_metrics(void) {
  tide_step_stats_t s;
  memset(&s, 0, sizeof s);
  s.step = 8, s.epoch = 2, s.progress = 7.5, s.epochs_done = 0.75, s.loss = 1.25, s.lr = 0.0125;
  s.global_batch = 128, s.batch = 32, s.accum = 2, s.exchange = TIDE_EXCHANGE_DENSE, s.throughput = 4000.5;
  s.compute_s = 0.5, s.exchange_s = 0.25, s.optim_s = 0.125, s.step_s = 1.5, s.noise_scale = 321.5;
  s.grad_sq = NAN, s.trace_sigma = 2, s.gain_ratio = 1.5, s.lr_factor = 1, s.gain = 1.25, s.kfac_s = 0;
  s.comm_share = 0.25, s.compute_min_s = 0.25, s.compute_median_s = 0.5, s.compute_max_s = 0.75, s.data_s = 0.01;
  s.paused_s = 0, s.solo_step_s = NAN, s.pauses = 3, s.background_jobs = 1, s.slowest_rank = 1;
  char line[1024];
  int n = tide_metrics_step_line(&s, 12.5, 1700000000.25, line, sizeof line);
  fprintf(stderr, "%s", line);
  CHECK(n > 0 && (size_t)n == strlen(line) && line[n - 1] == '\n');
  CHECK(tide_metrics_line_kind(line) == TIDE_METRICS_STEP);
  const struct {
    tide_metric_t metric;
    double want;
  } step_values[] = {{TIDE_METRIC_STEP, 7}, {TIDE_METRIC_EPOCH, 2}, {TIDE_METRIC_PROGRESS, 7.5},
                     {TIDE_METRIC_EPOCHS_DONE, 0.75}, {TIDE_METRIC_LOSS, 1.25}, {TIDE_METRIC_LR, 0.0125},
                     {TIDE_METRIC_GLOBAL_BATCH, 128}, {TIDE_METRIC_BATCH, 32}, {TIDE_METRIC_ACCUM, 2},
                     {TIDE_METRIC_IMAGES_PER_S, 4000.5}, {TIDE_METRIC_COMPUTE_S, 0.5}, {TIDE_METRIC_COMM_S, 0.25},
                     {TIDE_METRIC_OPTIM_S, 0.125}, {TIDE_METRIC_STEP_S, 1.5}, {TIDE_METRIC_TIME_S, 12.5},
                     {TIDE_METRIC_NOISE_SCALE, 321.5}, {TIDE_METRIC_TRACE_SIGMA, 2}, {TIDE_METRIC_GAIN_RATIO, 1.5},
                     {TIDE_METRIC_LR_FACTOR, 1}, {TIDE_METRIC_GAIN, 1.25}, {TIDE_METRIC_KFAC_S, 0},
                     {TIDE_METRIC_COMM_SHARE, 0.25}, {TIDE_METRIC_RANK_COMPUTE_MIN_S, 0.25},
                     {TIDE_METRIC_RANK_COMPUTE_MEDIAN_S, 0.5}, {TIDE_METRIC_RANK_COMPUTE_MAX_S, 0.75},
                     {TIDE_METRIC_DATA_S, 0.01}, {TIDE_METRIC_PAUSED_S, 0}, {TIDE_METRIC_PAUSES, 3},
                     {TIDE_METRIC_BACKGROUND_JOBS, 1}, {TIDE_METRIC_UNIX_S, 1700000000.25},
                     {TIDE_METRIC_SLOWEST_RANK, 1}};
  for (size_t i = 0; i < sizeof step_values / sizeof step_values[0]; i++) {
    double got = tide_metric_read(line, step_values[i].metric);
    if (!(fabs(got - step_values[i].want) <= 1e-9 * fabs(step_values[i].want) + 1e-12)) {
      fprintf(stderr, "%s: read %g, wrote %g\n", tide_metric_key(step_values[i].metric), got, step_values[i].want);
      return 1;
    }
  }
  /* unmeasured statistics are null, names are not numbers, eval keys absent */
  CHECK(isnan(tide_metric_read(line, TIDE_METRIC_GRAD_SQ)) && strstr(line, "\"grad_sq\":null") != NULL);
  CHECK(isnan(tide_metric_read(line, TIDE_METRIC_SOLO_STEP_S)));
  CHECK(isnan(tide_metric_read(line, TIDE_METRIC_EXCHANGE)) && strstr(line, "\"exchange\":\"dense\"") != NULL);
  CHECK(isnan(tide_metric_read(line, TIDE_METRIC_TEST_LOSS)));
  /* "step" the key is not "step" the type, nor a prefix of "step_s" */
  CHECK(tide_metric_read("{\"type\":\"step\",\"step_s\":2,\"step\":5}", TIDE_METRIC_STEP) == 5);

  n = tide_metrics_eval_line(TIDE_METRICS_EVAL, &s, 0.5, 0.875, 13, 0.5, line, sizeof line);
  fprintf(stderr, "%s", line);
  CHECK(n > 0 && tide_metrics_line_kind(line) == TIDE_METRICS_EVAL);
  CHECK(tide_metric_read(line, TIDE_METRIC_STEP) == 8 && tide_metric_read(line, TIDE_METRIC_EPOCH) == 0.75);
  CHECK(tide_metric_read(line, TIDE_METRIC_DATA_EPOCH) == 2 && tide_metric_read(line, TIDE_METRIC_TEST_LOSS) == 0.5);
  CHECK(tide_metric_read(line, TIDE_METRIC_TEST_ACCURACY) == 0.875 && tide_metric_read(line, TIDE_METRIC_TIME_S) == 13);
  CHECK(tide_metric_read(line, TIDE_METRIC_EVAL_S) == 0.5);
  CHECK(tide_metrics_eval_line(TIDE_METRICS_FINAL, &s, 0.5, 0.875, 13, 0.5, line, sizeof line) > 0 &&
        tide_metrics_line_kind(line) == TIDE_METRICS_FINAL);
  CHECK(tide_metrics_eval_line(TIDE_METRICS_EPOCH, &s, 0.5, 0.875, 13, 0.5, line, sizeof line) > 0 &&
        tide_metrics_line_kind(line) == TIDE_METRICS_EPOCH);

  /* every key named, each once */
  for (int a = 0; a < TIDE_METRIC_COUNT; a++) {
    CHECK(strcmp(tide_metric_key((tide_metric_t)a), "?") != 0);
    for (int b = 0; b < a; b++) CHECK(strcmp(tide_metric_key((tide_metric_t)a), tide_metric_key((tide_metric_t)b)) != 0);
  }
  CHECK(strcmp(tide_metric_key(TIDE_METRIC_COUNT), "?") == 0);
  /* errors: a short buffer, NULLs, a bad kind; other lines */
  char small[64];
  CHECK(tide_metrics_step_line(&s, 1, 1, small, sizeof small) == TIDE_EINVAL);
  CHECK(tide_metrics_step_line(NULL, 1, 1, line, sizeof line) == TIDE_EINVAL);
  CHECK(tide_metrics_eval_line(TIDE_METRICS_STEP, &s, 0, 0, 0, 0, line, sizeof line) == TIDE_EINVAL);
  CHECK(tide_metrics_line_kind("{\"type\":\"steps\"}") == TIDE_METRICS_NONE);
  CHECK(tide_metrics_line_kind(NULL) == TIDE_METRICS_NONE && isnan(tide_metric_read(NULL, TIDE_METRIC_LR)));
  return 0;
}

/* ---- small public calls the tools use (element access, HOST:PORT) ------------------ */

static int case_calls(void) {
  /* every dtype round-trips a value it holds exactly; f16 and bf16 round */
  uint8_t buf[64];
  for (int dt = 0; dt < TIDE_DTYPE_COUNT; dt++) {
    CHECK_OK(tide_element_set(buf, (tide_dtype_t)dt, 3, -12.5));
    CHECK(tide_element_get(buf, (tide_dtype_t)dt, 3) == (dt == TIDE_I32 || dt == TIDE_I64 ? -12.0 : -12.5));
  }
  CHECK_OK(tide_element_set(buf, TIDE_F16, 0, 1.0 + 1.0 / 4096)); /* below f16's half ulp: rounds to 1 */
  CHECK(tide_element_get(buf, TIDE_F16, 0) == 1.0);
  CHECK_OK(tide_element_set(buf, TIDE_BF16, 0, 3.0));
  CHECK(tide_element_get(buf, TIDE_BF16, 0) == 3.0);
  CHECK(tide_element_set(buf, TIDE_DTYPE_COUNT, 0, 1.0) == TIDE_EINVAL && tide_element_set(NULL, TIDE_F32, 0, 1) == TIDE_EINVAL);
  CHECK(isnan(tide_element_get(buf, TIDE_DTYPE_COUNT, 0)) && isnan(tide_element_get(NULL, TIDE_F32, 0)));
  char host[16];
  int port = 0;
  CHECK_OK(tide_host_port_parse("node-7:29500", host, sizeof host, &port));
  CHECK(strcmp(host, "node-7") == 0 && port == 29500);
  port = -1;
  CHECK(tide_host_port_parse("node-7", host, sizeof host, &port) == TIDE_EINVAL && port == -1);
  CHECK(tide_host_port_parse("node-7:0", host, sizeof host, &port) == TIDE_EINVAL);
  CHECK(tide_host_port_parse("node-7:65536", host, sizeof host, &port) == TIDE_EINVAL);
  CHECK(tide_host_port_parse("a-very-long-host-name:1", host, sizeof host, &port) == TIDE_EINVAL);
  CHECK(tide_host_port_parse(NULL, host, sizeof host, &port) == TIDE_EINVAL);
  /* job tokens are fresh; a token's id is the same wherever it is computed */
  char t1[65], t2[65], id1[17], id2[17];
  CHECK_OK(tide_job_token_create(t1, sizeof t1));
  CHECK_OK(tide_job_token_create(t2, sizeof t2));
  CHECK(strlen(t1) == 64 && strspn(t1, "0123456789abcdef") == 64 && strcmp(t1, t2) != 0);
  CHECK_OK(tide_job_id(t1, id1, sizeof id1));
  CHECK_OK(tide_job_id(t1, id2, sizeof id2));
  CHECK(strlen(id1) == 16 && strspn(id1, "0123456789abcdef") == 16 && strcmp(id1, id2) == 0);
  CHECK_OK(tide_job_id(t2, id2, sizeof id2));
  CHECK(strcmp(id1, id2) != 0);
  CHECK_OK(tide_job_id(NULL, id2, sizeof id2));
  CHECK(strlen(id2) == 16);
  CHECK(tide_job_token_create(t1, 64) == TIDE_EINVAL && tide_job_id(NULL, id1, 16) == TIDE_EINVAL);
  return 0;
}

/* ---- tide bench ----------------------------------------------------------------- */

/* The "op" of each JSON line of output, in order, joined by spaces. */
static void ops_of_lines(char *out, size_t cap) {
  out[0] = '\0';
  for (const char *p = strstr(output, "{\"lib\""); p; p = strstr(p + 1, "{\"lib\"")) {
    const char *op = strstr(p, "\"op\":\"");
    if (!op) break;
    op += 6;
    size_t n = strcspn(op, "\""), len = strlen(out);
    snprintf(out + len, cap - len, "%s%.*s", len ? " " : "", (int)n, op);
  }
}

static int case_bench(void) {
  char ops[256];
  CHECK(run("%s/tiderun -np 2 %s/tide bench --op allreduce,adasum --min-bytes 4K --max-bytes 64K --factor 16 "
            "--iters 5 --check --interleave", tools_dir, tools_dir) == 0);
  ops_of_lines(ops, sizeof ops);
  CHECK(strcmp(ops, "allreduce adasum allreduce adasum") == 0);
  CHECK(strstr(output, "\"ok\":false") == NULL);
  int marked = 0;
  for (const char *p = output; (p = strstr(p, "\"interleaved\":true")) != NULL; p++) marked++;
  CHECK(marked == 4);
  CHECK(run("%s/tiderun -np 2 %s/tide bench --op allreduce,adasum --min-bytes 4K --max-bytes 64K --factor 16 "
            "--iters 5 --check", tools_dir, tools_dir) == 0);
  ops_of_lines(ops, sizeof ops);
  CHECK(strcmp(ops, "allreduce allreduce adasum adasum") == 0);
  CHECK(strstr(output, "interleaved") == NULL);
  CHECK(run("%s/tide bench --op allreduce,gather", tools_dir) == 2);
  CHECK_SAYS("--op: unknown collective 'gather' (allreduce, reduce_scatter, allgather, broadcast, all or adasum)");
  return 0;
}

/* test_tools CASE runs one case; no argument runs them all. */
int main(int argc, char **argv) {
  const char *dir = getenv("TIDE_TOOLS_DIR");
  snprintf(tools_dir, sizeof tools_dir, "%s", dir != NULL ? dir : "tools");
  static const harness_case_t cases[] = {
#define TOOL_CASE(name) {#name, case_##name},
#include "test_tools_cases.h"
#undef TOOL_CASE
  };
  return harness_cases_main("test_tools", cases, sizeof cases / sizeof cases[0], argc, argv);
}
