/* Multiplexing (issue 27, item 4; docs/elastic.md, "Multiplexing"):
 *   - tiderun --background runs the ranks under SCHED_IDLE (or nice 19);
 *   - bad combinations of the options and variables are refused by name;
 *   - a background tide-train job guarded by a scripted foreground (this
 *     test writes the foreground's step times into a store) waits for the
 *     solo time, runs, pauses at a step boundary when the foreground's
 *     recent step time is too long, stays paused while it is, resumes when
 *     it is back, pauses while the foreground, resized, has no solo time at
 *     its new size and runs once it has one (its longer steps there not
 *     compared with the old size's solo time), pauses again, goes on
 *     unguarded when the foreground's store
 *     dies, and ends with the same parameters (checksum) as the same job run
 *     alone, with every step counted once;
 *   - a real foreground tide-train (--hosts-background) beside a background
 *     one (TIDE_FOREGROUND, at normal priority: under SCHED_IDLE on 2 busy
 *     cores it might not run until the foreground ended; TIDE_GUARD_PERCENT=1
 *     so that every judgement pauses it): both finish, neither loses or
 *     repeats a step,
 *     the foreground published its solo step time, the background's first
 *     step came after it, and the background's parameters equal the solo
 *     run's;
 *   - tide report prints each job's multiplexing line and draws multiplex.png. */
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static char tools[1024], runs[1024];

static void run_ok(const char *cmd) {
  char out[65536];
  int rc = harness_shell(cmd, out, sizeof out);
  if (rc != 0) {
    fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, out);
    exit(1);
  }
}

/* cmd must fail with a message containing expect. */
static void refused(const char *cmd, const char *expect) {
  char out[65536];
  int rc = harness_shell(cmd, out, sizeof out);
  if (rc == 0 || strstr(out, expect) == NULL) {
    fprintf(stderr, "%s\n-> exit %d, wanted a failure saying \"%s\":\n%s\n", cmd, rc, expect, out);
    exit(1);
  }
}

static double number_after(const char *text, const char *key) {
  const char *at = strstr(text, key);
  return at ? atof(at + strlen(key)) : -1;
}

/* The run's parameter checksum (summary.json). */
static void checksum(const char *name, char out[17]) {
  char path[2048], summary[8192];
  snprintf(path, sizeof path, "%s/%s/summary.json", runs, name);
  harness_slurp(path, summary, sizeof summary);
  const char *at = strstr(summary, "\"checksum\":\"");
  CHECK(at != NULL);
  snprintf(out, 17, "%.16s", at + 12);
}

/* metrics.jsonl's step lines: numbered 0, 1, ... with none missing or
 * repeated; returns how many, the pauses of the last and the sum of
 * paused_s; the first step's paused_s into *first_paused. */
static int steps_in_order(const char *name, long *pauses, double *paused_s, double *first_paused,
                          double *solo_step_s) {
  char path[2048], line[4096];
  snprintf(path, sizeof path, "%s/%s/metrics.jsonl", runs, name);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  int n = 0;
  *pauses = 0;
  *paused_s = 0;
  *solo_step_s = -1;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "\"type\":\"step\"") == NULL) continue;
    long step = (long)number_after(line, "\"step\":");
    if (step != n) {
      fprintf(stderr, "%s: step line %d says step %ld\n", name, n, step);
      exit(1);
    }
    double p = number_after(line, "\"paused_s\":");
    CHECK(p >= 0);
    if (n == 0) *first_paused = p;
    *paused_s += p;
    *pauses = (long)number_after(line, "\"pauses\":");
    if (strstr(line, "\"solo_step_s\":null") == NULL) *solo_step_s = number_after(line, "\"solo_step_s\":");
    n++;
  }
  fclose(f);
  return n;
}

/* The CNN: its steps (about 9 ms here) leave the scripted foreground time to
 * say its lines while the background runs; the MLP's (0.6 ms) did not. */
#define BG_ARGS "--model cnn --epochs 5 --batch 32 --subset 2000 --threads 1 --seed 3"
#define BG_STEPS 160 /* 5 x 32 steps (2000 images / (2 x 32), the last one short) */

/* The unix_s of the first step line of run name (with a solo time, when
 * with_solo): -1 when there is none. */
static double first_step_unix_s(const char *name, int with_solo) {
  char path[2048], line[4096];
  snprintf(path, sizeof path, "%s/%s/metrics.jsonl", runs, name);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  double at = -1;
  while (at < 0 && fgets(line, sizeof line, f))
    if (strstr(line, "\"type\":\"step\"") && (!with_solo || strstr(line, "\"solo_step_s\":null") == NULL))
      at = number_after(line, "\"unix_s\":");
  fclose(f);
  return at;
}

/* Waits for a job started with popen(cmd): it must exit 0. */
static void finish(FILE *job, const char *cmd) {
  char out[65536];
  size_t n = fread(out, 1, sizeof out - 1, job);
  out[n] = 0;
  int status = pclose(job);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s\n-> %d\n%s\n", cmd, status, out);
    exit(1);
  }
}

/* The scripted foreground: a store, and what the guard reads from it. */
static tide_store_t *fg;
static int bg_port; /* the background's own store */

static void say(const char *line) { CHECK_OK(tide_store_set(fg, "multiplex/foreground", line, strlen(line))); }

static int64_t active(void) {
  int64_t v;
  CHECK_OK(tide_store_add(fg, "multiplex/active", 0, &v));
  return v;
}

/* The background's "STEP running|paused PAUSES" (step -1 before any). */
static long bg_progress(char state[16]) {
  char key[96];
  snprintf(key, sizeof key, "multiplex/background/127.0.0.1:%d", bg_port);
  void *value;
  size_t len;
  strcpy(state, "none");
  if (tide_store_get(fg, key, 0, &value, &len) != 0) return -1;
  char text[96];
  snprintf(text, sizeof text, "%.*s", (int)(len < 95 ? len : 95), (const char *)value);
  tide_free(value);
  long step = -1;
  CHECK(sscanf(text, "%ld %15s", &step, state) == 2);
  return step;
}

/* Waits (up to 120 s: a test deadline, not a timing assertion) until the
 * background's guard says want ("running" or "paused") with the count of
 * running background jobs matching. */
static long wait_state(const char *want) {
  for (int i = 0; i < 60000; i++) {
    char state[16];
    long step = bg_progress(state);
    if (strcmp(state, want) == 0 && active() == (strcmp(want, "running") == 0)) return step;
    poll(NULL, 0, 1);
  }
  fprintf(stderr, "the background never became %s\n", want);
  exit(1);
}

static void scripted_foreground(const char *solo) {
  int store_pid;
  int port = harness_store_start("fg-token", &store_pid);
  CHECK_OK(tide_store_connect("127.0.0.1", port, "fg-token", 10000, &fg));
  bg_port = harness_free_port();
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "TIDE_FOREGROUND=127.0.0.1:%d TIDE_FOREGROUND_TOKEN=fg-token "
           "%s/tiderun -np 2 --rdzv 127.0.0.1:%d %s/tide-train " BG_ARGS " --name guarded --runs %s 2>&1",
           port, tools, bg_port, tools, runs);
  FILE *bg = popen(cmd, "r");
  CHECK(bg != NULL);
  /* Nothing published, then no solo time yet: it waits at its first boundary. */
  CHECK(wait_state("paused") == 0);
  say("3 0 0.01");
  poll(NULL, 0, 200);
  char st[16];
  CHECK(bg_progress(st) == 0 && strcmp(st, "paused") == 0 && active() == 0);
  /* The solo time known: it runs (the first start does not look at RECENT). */
  say("6 0.01 0.01");
  wait_state("running");
  /* The foreground slowed (recent 2x solo) after its judging window of 4
   * steps: it pauses at its next boundary. */
  say("20 0.01 0.02");
  long paused_at = wait_state("paused");
  CHECK(paused_at < BG_STEPS);
  /* While the foreground stays slow, the background takes no step, even
   * past its back-off (8 foreground steps). */
  for (int fg_step = 21; fg_step <= 40; fg_step++) {
    char line[64];
    snprintf(line, sizeof line, "%d 0.01 0.02", fg_step);
    say(line);
    poll(NULL, 0, 30);
  }
  CHECK(bg_progress(st) == paused_at && strcmp(st, "paused") == 0);
  /* Back under 110%: it resumes and finishes; the foreground then ends. */
  say("41 0.01 0.0105");
  long resumed_at = wait_state("running");
  fprintf(stderr, "scripted foreground: paused at step %ld, resumed at step %ld (solo %s)\n", paused_at,
          resumed_at, solo);
  CHECK(resumed_at >= paused_at);
  /* The foreground runs on 2 workers now (an elastic resize), a size it has
   * no solo time for: the background pauses until it has one. Its steps
   * there (0.02 s) are twice the old size's solo time, which the guard does
   * not compare them with: at the new size's solo time it runs. */
  say("42 0 0.02 2");
  long resized_at = wait_state("paused");
  say("46 0.02 0.02 2");
  CHECK(wait_state("running") >= resized_at);
  for (int fg_step = 47; fg_step <= 52; fg_step++) {
    char line[64];
    snprintf(line, sizeof line, "%d 0.02 0.021 2", fg_step);
    say(line);
    poll(NULL, 0, 30);
  }
  CHECK(bg_progress(st) >= resized_at && strcmp(st, "running") == 0);
  /* Slow again after its window: another pause; then the foreground's
   * store goes away (the foreground died): the background goes on unguarded
   * and finishes. */
  say("57 0.02 0.05 2");
  long second = wait_state("paused");
  CHECK(second >= resumed_at && second < BG_STEPS);
  tide_store_close(fg);
  kill(store_pid, SIGKILL);
  waitpid(store_pid, NULL, 0);
  finish(bg, cmd);
  char sum[17];
  checksum("guarded", sum);
  long pauses;
  double paused_s, first, solo_s;
  CHECK(steps_in_order("guarded", &pauses, &paused_s, &first, &solo_s) == BG_STEPS);
  fprintf(stderr, "guarded background: %d steps, %ld pause(s), %.2f s paused, checksum %s (solo %s)\n", BG_STEPS,
          pauses, paused_s, sum, solo);
  CHECK(pauses == 3 && first > 0 && paused_s > first);
  CHECK(strcmp(sum, solo) == 0);
}

static void real_foreground(const char *solo) {
  int port = harness_free_port();
  char bg_cmd[4096], fg_cmd[4096];
  snprintf(bg_cmd, sizeof bg_cmd,
           "TIDE_GUARD_PERCENT=1 TIDE_FOREGROUND=127.0.0.1:%d TIDE_FOREGROUND_TOKEN=fg-token %s/tiderun -np 2 "
           "%s/tide-train " BG_ARGS " --name background --runs %s 2>&1",
           port, tools, tools, runs);
  snprintf(fg_cmd, sizeof fg_cmd,
           "TIDE_JOB_TOKEN=fg-token %s/tiderun -np 2 --hosts-background --rdzv 127.0.0.1:%d %s/tide-train "
           "--model mlp --epochs 1 --batch 32 --subset 3000 --threads 1 --name foreground --runs %s 2>&1",
           tools, port, tools, runs);
  FILE *bg = popen(bg_cmd, "r");
  CHECK(bg != NULL);
  run_ok(fg_cmd);
  finish(bg, bg_cmd);
  long pauses;
  double paused_s, first, solo_s;
  int fg_steps = steps_in_order("foreground", &pauses, &paused_s, &first, &solo_s);
  CHECK(fg_steps == (3000 + 63) / 64 && pauses == 0 && paused_s == 0);
  CHECK(solo_s > 0);
  double fg_solo_s = solo_s;
  int bg_steps = steps_in_order("background", &pauses, &paused_s, &first, &solo_s);
  char sum[17];
  checksum("background", sum);
  /* It took its first step once the foreground knew its solo time: its first
   * step line after the foreground's first with one (unix_s has 1 ms steps).
   * Whether it had to wait for that depends on which job started first. */
  double fg_solo_at = first_step_unix_s("foreground", 1), bg_first_at = first_step_unix_s("background", 0);
  fprintf(stderr, "real foreground: %d steps, solo step %.4f s; background: %d steps, %ld pause(s), %.2f s paused "
          "(%.2f s before its first step, which ended %.3f s after the foreground's solo time), checksum %s (solo %s)\n",
          fg_steps, fg_solo_s, bg_steps, pauses, paused_s, first, bg_first_at - fg_solo_at, sum, solo);
  CHECK(bg_steps == BG_STEPS && fg_solo_at > 0 && bg_first_at + 0.001 >= fg_solo_at);
  CHECK(strcmp(sum, solo) == 0);
}

int main(void) {
  const char *dir = getenv("TIDE_TOOLS_DIR");
  if (dir == NULL) {
    fprintf(stderr, "TIDE_TOOLS_DIR is not set: skipped\n");
    return 77;
  }
  snprintf(tools, sizeof tools, "%s", dir);
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist", &st) != 0) {
    fprintf(stderr, "Fashion-MNIST is not installed (dataset-fashion-mnist): skipped\n");
    return 77;
  }
  snprintf(runs, sizeof runs, "/tmp/tide-test-multiplex-XXXXXX");
  CHECK(mkdtemp(runs) != NULL);
  unsetenv("TIDE_FOREGROUND");
  unsetenv("TIDE_HOSTS_BACKGROUND");
  unsetenv("TIDE_BACKGROUND");
  char cmd[4096], out[4096];

  /* SCHED_IDLE is policy 5 in /proc/PID/stat's 41st field; nice 19 the 19th. */
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 2 --background -- sh -c 'cut -d\" \" -f19,41 /proc/self/stat' 2>&1",
           tools);
  CHECK(harness_shell(cmd, out, sizeof out) == 0);
  fprintf(stderr, "tiderun --background: nice and policy of each rank: %s", out);
  CHECK(strstr(out, "0 5\n0 5\n") != NULL || strstr(out, "19 0\n19 0\n") != NULL);
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 1 -- sh -c 'cut -d\" \" -f41 /proc/self/stat' 2>&1", tools);
  CHECK(harness_shell(cmd, out, sizeof out) == 0 && strcmp(out, "0\n") == 0);

  snprintf(cmd, sizeof cmd,
           "TIDE_FOREGROUND_TOKEN=x %s/tiderun --background --foreground 127.0.0.1:7 -- sh -c "
           "'echo $TIDE_BACKGROUND $TIDE_FOREGROUND' 2>&1", tools);
  CHECK(harness_shell(cmd, out, sizeof out) == 0 && strcmp(out, "1 127.0.0.1:7\n") == 0);
  snprintf(cmd, sizeof cmd, "%s/tiderun --hosts-background -- sh -c 'echo $TIDE_HOSTS_BACKGROUND' 2>&1", tools);
  CHECK(harness_shell(cmd, out, sizeof out) == 0 && strcmp(out, "1\n") == 0);
  snprintf(cmd, sizeof cmd, "%s/tiderun --foreground 127.0.0.1:1 true 2>&1", tools);
  refused(cmd, "--foreground needs --background");
  snprintf(cmd, sizeof cmd, "TIDE_FOREGROUND_TOKEN= %s/tiderun --background --foreground 127.0.0.1:1 true 2>&1",
           tools);
  refused(cmd, "--foreground needs TIDE_FOREGROUND_TOKEN");
  snprintf(cmd, sizeof cmd, "TIDE_FOREGROUND_TOKEN=x %s/tiderun --background --foreground nowhere true 2>&1", tools);
  refused(cmd, "--foreground expects HOST:PORT");
  snprintf(cmd, sizeof cmd, "%s/tiderun --background --hosts-background true 2>&1", tools);
  refused(cmd, "--background and --hosts-background exclude each other");
  snprintf(cmd, sizeof cmd, "TIDE_FOREGROUND=nowhere TIDE_FOREGROUND_TOKEN=x %s/tiderun %s/tide-train " BG_ARGS
           " --name bad --runs %s 2>&1", tools, tools, runs);
  refused(cmd, "TIDE_FOREGROUND=\"nowhere\" is not HOST:PORT");
  snprintf(cmd, sizeof cmd, "TIDE_FOREGROUND=127.0.0.1:1 TIDE_FOREGROUND_TOKEN= %s/tiderun %s/tide-train " BG_ARGS
           " --name bad --runs %s 2>&1", tools, tools, runs);
  refused(cmd, "TIDE_FOREGROUND_TOKEN is empty");
  snprintf(cmd, sizeof cmd, "TIDE_GUARD_PERCENT=0 %s/tiderun %s/tide-train " BG_ARGS " --name bad --runs %s 2>&1",
           tools, tools, runs);
  refused(cmd, "TIDE_GUARD_PERCENT");

  /* The reference: the background job alone, unguarded. */
  snprintf(cmd, sizeof cmd, "%s/tiderun -np 2 %s/tide-train " BG_ARGS " --name alone --runs %s 2>&1", tools, tools,
           runs);
  run_ok(cmd);
  char solo[17];
  checksum("alone", solo);
  long pauses;
  double paused_s, first, solo_s;
  CHECK(steps_in_order("alone", &pauses, &paused_s, &first, &solo_s) == BG_STEPS && pauses == 0 && paused_s == 0);

  scripted_foreground(solo);
  real_foreground(solo);
  /* tide report shows both jobs' multiplexing (when gnuplot is there to draw). */
  const char *expect[][2] = {{"guarded", "multiplexing: background job, 160 steps, 3 pauses"},
                             {"foreground", "multiplexing: foreground job, solo step 0."}};
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "%s/tide report %s/%s 2>&1", tools, runs, expect[i][0]);
    char report[8192];
    int rc = harness_shell(cmd, report, sizeof report);
    if (strstr(report, "gnuplot not found") != NULL) break;
    if (rc != 0 || strstr(report, expect[i][1]) == NULL || strstr(report, "multiplex}.png") == NULL) {
      fprintf(stderr, "%s\n-> exit %d, wanted \"%s\":\n%s\n", cmd, rc, expect[i][1], report);
      return 1;
    }
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", runs);
  return system(cmd) == 0 ? 0 : 1;
}
