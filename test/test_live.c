/* The live scheduler's library calls (src/sched/live.c) with a job that
 * publishes hints: tide_sched_serve in a child process on 2 slots, a job
 * submitted with tide_sched_submit, hints written to its store under
 * TIDE_SCHED_HINTS_KEY as its Pollux agent would; tide_sched_jobs then
 * shows the batch, goodput and speedup from them (not "linear"), the
 * allocator uses them, and tide_sched_cancel ends the job. Also: the
 * client calls without a daemon, and bad options. (test/sched_live.sh runs
 * the commands end to end with trace-replay jobs.) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "tide.h"

extern char **environ;

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The value of `key` in DIR/jobs/ID/FILE ("key value" lines), or "" */
static void job_field(const char *dir, const char *id, const char *key, char *out, size_t cap) {
  char path[600], k[64], v[256];
  snprintf(path, sizeof path, "%s/jobs/%s/state", dir, id);
  out[0] = 0;
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  while (fscanf(f, "%63s %255[^\n]", k, v) == 2)
    if (strcmp(k, key) == 0 && strlen(v) < cap) memcpy(out, v, strlen(v) + 1);
  fclose(f);
}

/* The row of job `id` in tide_sched_jobs' table. */
static int job_row(const char *dir, const char *id, char *row, size_t cap) {
  char *text;
  if (tide_sched_jobs(dir, &text) != 0) return -1;
  row[0] = 0;
  size_t idlen = strlen(id);
  for (char *line = text; line != NULL && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, id, idlen) == 0 && line[idlen] == ' ') {
      size_t n = strcspn(line, "\n");
      snprintf(row, cap, "%.*s", (int)(n < cap ? n : cap - 1), line);
    }
  tide_free(text);
  return row[0] ? 0 : -1;
}

int main(void) {
  const char *tools = getenv("TIDE_TOOLS_DIR");
  if (tools == NULL) {
    printf("SKIP: TIDE_TOOLS_DIR is not set (run under ctest)\n");
    return 77;
  }
  char dir[] = "/tmp/tide-test-live-XXXXXX", tiderun[1024], id[64], buf[256], row[512];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(tiderun, sizeof tiderun, "%s/tiderun", tools);

  /* no daemon yet; bad options */
  char *text;
  CHECK_RC(tide_sched_jobs(dir, &text), TIDE_ENOENT);
  CHECK_RC(tide_sched_cancel(dir, "1"), TIDE_ENOENT);
  tide_sched_daemon_options_t o;
  tide_sched_daemon_options_init(&o);
  int slots = 2;
  o.dir = dir, o.slots = &slots, o.tiderun = tiderun, o.interval = 0.3, o.quiet = 1;
  o.interval = 0;
  CHECK_RC(tide_sched_serve(&o), TIDE_EINVAL);
  o.interval = 0.3;
  o.tiderun = "/nonexistent/tiderun";
  CHECK_RC(tide_sched_serve(&o), TIDE_EINVAL);
  o.tiderun = tiderun;
  CHECK_RC(tide_sched_serve(NULL), TIDE_EINVAL);

  pid_t daemon = fork();
  CHECK(daemon >= 0);
  if (daemon == 0) _exit(tide_sched_serve(&o) == 0 ? 0 : 1);
  int up = 0;
  for (int i = 0; i < 100 && !up; i++, nap_ms(50)) up = tide_sched_jobs(dir, &text) == 0;
  CHECK(up);
  tide_free(text);

  char cwd[512];
  CHECK(getcwd(cwd, sizeof cwd) != NULL);
  char *argv[] = {"sleep", "60", NULL};
  CHECK_RC(tide_sched_submit(dir, "toobig", 1, 3, 0, cwd, 2, argv, environ, id, sizeof id), TIDE_EINVAL);
  /* Background submissions the daemon refuses: a size range, no size, more
   * workers than the pool's slots; and no options at all. */
  tide_sched_submit_options_t bo;
  tide_sched_submit_options_init(&bo);
  bo.name = "bg", bo.background = 1, bo.min_np = 1, bo.max_np = 1, bo.np = 1;
  CHECK_RC(tide_sched_submit_job(dir, &bo, cwd, 2, argv, environ, id, sizeof id), TIDE_EINVAL);
  bo.min_np = bo.max_np = bo.np = 0;
  CHECK_RC(tide_sched_submit_job(dir, &bo, cwd, 2, argv, environ, id, sizeof id), TIDE_EINVAL);
  bo.np = 3;
  CHECK_RC(tide_sched_submit_job(dir, &bo, cwd, 2, argv, environ, id, sizeof id), TIDE_EINVAL);
  CHECK_RC(tide_sched_submit_job(dir, NULL, cwd, 2, argv, environ, id, sizeof id), TIDE_EINVAL);
  CHECK_OK(tide_sched_submit(dir, "hinted", 1, 2, 0, cwd, 2, argv, environ, id, sizeof id));
  CHECK_OK(tide_sched_job_state(dir, "hinted", buf, sizeof buf));
  CHECK(strcmp(buf, "running") == 0); /* its minimum at once */

  /* The job's store: port and token from its directory. */
  char port[32] = "", token[128] = "", path[600];
  for (int i = 0; i < 100 && !port[0]; i++, nap_ms(50)) job_field(dir, id, "port", port, sizeof port);
  snprintf(path, sizeof path, "%s/jobs/%s/token", dir, id);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL && fscanf(f, "%127s", token) == 1);
  fclose(f);
  tide_store_t *store;
  CHECK_OK(tide_store_connect("127.0.0.1", atoi(port), token, 10000, &store));
  CHECK_OK(job_row(dir, id, row, sizeof row));
  CHECK(strstr(row, "linear") != NULL);
  tide_sched_hints_t h = {
      .model = {.alpha_c = 0.02, .beta_c = 0.001, .alpha_n = 0.1, .beta_n = 0.002, .alpha_r = 0.02,
                .beta_r = 0.0005, .gamma = 1.5},
      .fitted = 1, .grad_sqr = 1, .grad_var = 20,
      .limits = {.base_batch = 32, .max_batch = 4096, .min_atomic = 8, .max_atomic = 128, .max_passes = 8},
      .max_replicas_seen = 1};
  char hints[TIDE_SCHED_HINTS_MAX];
  CHECK_OK(tide_sched_hints_encode(&h, hints, sizeof hints));
  CHECK_OK(tide_store_set(store, TIDE_SCHED_HINTS_KEY, hints, strlen(hints)));
  /* The next rounds read them: speedup, batch and goodput from the model. */
  int seen = 0;
  for (int i = 0; i < 100 && !seen; i++, nap_ms(50))
    seen = job_row(dir, id, row, sizeof row) == 0 && strstr(row, "linear") == NULL;
  printf("  %s\n", row);
  CHECK(seen);
  char name[64], state[32], batch[32], goodput[32], speedup[32];
  int nslots, workers;
  CHECK(sscanf(row, "%*s %63s %31s %d %d %31s %31s %31s", name, state, &nslots, &workers, batch, goodput, speedup) ==
        7);
  CHECK(strcmp(name, "hinted") == 0 && strcmp(state, "running") == 0 && nslots == 2);
  CHECK(atof(batch) >= 32 && atof(goodput) > 0 && atof(speedup) > 1 && atof(speedup) <= 2);
  /* A request the store received: the job was asked for its 2 slots. */
  void *value;
  size_t len;
  CHECK_OK(tide_store_get(store, "elastic/target", 0, &value, &len));
  CHECK(len >= 1 && ((char *)value)[0] == '2');
  tide_free(value);
  tide_store_close(store);

  CHECK_OK(tide_sched_cancel(dir, "hinted"));
  int ended = 0;
  for (int i = 0; i < 200 && !ended; i++, nap_ms(50))
    ended = tide_sched_job_state(dir, id, buf, sizeof buf) == 0 && strcmp(buf, "cancelled") == 0;
  CHECK(ended);
  CHECK_RC(tide_sched_cancel(dir, "hinted"), TIDE_EINVAL); /* already ended */
  CHECK_RC(tide_sched_cancel(dir, "nosuchjob"), TIDE_EINVAL);
  char keeper[32];
  job_field(dir, id, "keeper", keeper, sizeof keeper);
  int keeper_gone = 0; /* reaped by the daemon within its next tick */
  for (int i = 0; i < 100 && !keeper_gone; i++, nap_ms(20)) keeper_gone = atoi(keeper) > 0 && kill(atoi(keeper), 0) != 0;
  CHECK(keeper_gone);

  CHECK(kill(daemon, SIGTERM) == 0);
  int status;
  CHECK(waitpid(daemon, &status, 0) == daemon && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  printf("live: ok\n");
  return 0;
}
