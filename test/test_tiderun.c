/* tiderun end to end: runs the built launcher ($TIDE_TOOLS_DIR/tiderun) on
 * small /bin/sh programs and on this test binary itself ("rank-child" mode,
 * which records its TIDE_* variables and meets the other ranks in the
 * store), and checks identities, exit statuses, failure handling, --prefix,
 * option errors, signals, --timeout and two nodes on one machine.
 *
 * Every tiderun's stdout and stderr are pipes read here until end of file:
 * without --prefix the ranks (and whatever they started) inherit them, so
 * end of file also shows that no process of the job outlived tiderun. */
#include "harness.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OUT_CAP 65536

static char tiderun_path[PATH_MAX];
static char self_path[PATH_MAX];
static char dir[PATH_MAX];

typedef struct {
  pid_t pid;
  int fds[2]; /* stdout, stderr; -1 at end of file */
  char text[2][OUT_CAP];
  size_t len[2];
  int status;
  int exited;
} proc_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Starts tiderun with args (NULL-terminated, without argv[0]). */
static void proc_start(proc_t *p, const char *const *args) {
  memset(p, 0, sizeof *p);
  int pipes[2][2];
  CHECK(pipe(pipes[0]) == 0 && pipe(pipes[1]) == 0);
  const char *argv[64] = {tiderun_path};
  int n = 1;
  while (args[n - 1] != NULL && n < 63) {
    argv[n] = args[n - 1];
    n++;
  }
  argv[n] = NULL;
  p->pid = fork();
  CHECK(p->pid >= 0);
  if (p->pid == 0) {
    dup2(pipes[0][1], 1);
    dup2(pipes[1][1], 2);
    for (int k = 0; k < 2; k++) {
      close(pipes[k][0]);
      close(pipes[k][1]);
    }
    execv(tiderun_path, (char *const *)argv);
    _exit(126);
  }
  for (int k = 0; k < 2; k++) {
    close(pipes[k][1]);
    p->fds[k] = pipes[k][0];
  }
}

/* Reads the output of procs until every one exited and closed its pipes;
 * fails (after killing them) when that takes longer than timeout_s. */
static void procs_finish(proc_t *procs, int n, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    int open_fds = 0, running = 0;
    struct pollfd pfds[16];
    char *dest[16];
    size_t *dest_len[16];
    for (int i = 0; i < n; i++) {
      proc_t *p = &procs[i];
      if (!p->exited) {
        int status;
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
          p->exited = 1;
          p->status = status;
        } else {
          running++;
        }
      }
      for (int k = 0; k < 2; k++) {
        if (p->fds[k] < 0) continue;
        pfds[open_fds] = (struct pollfd){.fd = p->fds[k], .events = POLLIN};
        dest[open_fds] = p->text[k];
        dest_len[open_fds] = &p->len[k];
        open_fds++;
      }
    }
    if (running == 0 && open_fds == 0) return;
    if (now_s() > deadline) {
      fprintf(stderr, "tiderun did not finish (%d running, %d pipes open) within %.0f s\n",
              running, open_fds, timeout_s);
      for (int i = 0; i < n; i++) {
        fprintf(stderr, "--- tiderun %d stdout:\n%.*s--- stderr:\n%.*s\n", i,
                (int)procs[i].len[0], procs[i].text[0], (int)procs[i].len[1], procs[i].text[1]);
        if (!procs[i].exited) kill(procs[i].pid, SIGKILL);
      }
      CHECK(!"timed out");
    }
    if (poll(pfds, (nfds_t)open_fds, 50) <= 0) continue;
    for (int j = 0; j < open_fds; j++) {
      if (pfds[j].revents == 0) continue;
      size_t room = OUT_CAP - 1 - *dest_len[j];
      ssize_t got = read(pfds[j].fd, dest[j] + *dest_len[j], room > 0 ? room : 1);
      if (got > 0 && room > 0) {
        *dest_len[j] += (size_t)got;
        dest[j][*dest_len[j]] = '\0';
      } else if (got <= 0) {
        for (int i = 0; i < n; i++)
          for (int k = 0; k < 2; k++)
            if (procs[i].fds[k] == pfds[j].fd) procs[i].fds[k] = -1;
        close(pfds[j].fd);
      }
    }
  }
}

/* Runs tiderun to completion; returns its exit code (-1 if killed). */
static int run(proc_t *p, const char *const *args, double timeout_s) {
  proc_start(p, args);
  procs_finish(p, 1, timeout_s);
  return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : -1;
}

static void show(const proc_t *p) {
  fprintf(stderr, "--- stdout:\n%s--- stderr:\n%s---\n", p->text[0], p->text[1]);
}

#define CHECK_OUT(p, cond)                                                           \
  do {                                                                               \
    if (!(cond)) show(p);                                                            \
    CHECK(cond);                                                                     \
  } while (0)

/* Contents of dir/name (static buffer), or NULL. */
static const char *read_file(const char *name) {
  static char buf[8192];
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (f == NULL) return NULL;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

/* The value of "NAME=value" lines in text, copied to out. */
static int env_value(const char *text, const char *name, char *out, size_t cap) {
  size_t name_len = strlen(name);
  for (const char *line = text; line != NULL && *line; line = strchr(line, '\n')) {
    if (*line == '\n') line++;
    if (strncmp(line, name, name_len) == 0 && line[name_len] == '=') {
      const char *value = line + name_len + 1;
      size_t len = strcspn(value, "\n");
      if (len >= cap) return -1;
      memcpy(out, value, len);
      out[len] = '\0';
      return 0;
    }
  }
  return -1;
}

static void remove_dir_files(void) {
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "rm -f '%s'/*", dir);
  CHECK(system(cmd) == 0);
}

/* ---- the rank side (this binary run by tiderun) ---------------------------- */

static const char *const vars[] = {"TIDE_RANK",      "TIDE_SIZE",   "TIDE_LOCAL_RANK",
                                   "TIDE_LOCAL_SIZE", "TIDE_NODE_RANK", "TIDE_NNODES",
                                   "TIDE_RDZV",      "TIDE_JOB_TOKEN", "TIDE_JOB_ID"};

/* Writes its TIDE_* variables to <dir>/env.<rank>, then sets "rank/<rank>"
 * in the store and waits for every rank's key. */
static int rank_child(const char *out_dir) {
  const char *rank_text = getenv("TIDE_RANK");
  const char *size_text = getenv("TIDE_SIZE");
  const char *rdzv = getenv("TIDE_RDZV");
  const char *token = getenv("TIDE_JOB_TOKEN");
  if (rank_text == NULL || size_text == NULL || rdzv == NULL || token == NULL) return 10;
  char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/env.%s", out_dir, rank_text);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (f == NULL) return 11;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    fprintf(f, "%s=%s\n", vars[i], v != NULL ? v : "(unset)");
  }
  fclose(f);
  if (rename(tmp, path) != 0) return 12;

  char host[256];
  const char *colon = strrchr(rdzv, ':');
  if (colon == NULL || (size_t)(colon - rdzv) >= sizeof host) return 13;
  memcpy(host, rdzv, (size_t)(colon - rdzv));
  host[colon - rdzv] = '\0';
  tide_store_t *store;
  int rc = tide_store_connect(host, atoi(colon + 1), token, 10000, &store);
  if (rc != 0) {
    fprintf(stderr, "rank %s: tide_store_connect(%s): %s\n", rank_text, rdzv, tide_strerror(rc));
    return 14;
  }
  char key[64];
  snprintf(key, sizeof key, "rank/%s", rank_text);
  rc = tide_store_set(store, key, rank_text, strlen(rank_text));
  int size = atoi(size_text);
  char names[64][24]; /* "rank/" and any int */
  const char *keys[64];
  for (int r = 0; r < size && r < 64; r++) {
    snprintf(names[r], sizeof names[r], "rank/%d", r);
    keys[r] = names[r];
  }
  if (rc == 0) rc = tide_store_wait(store, keys, (size_t)size, 10000);
  tide_store_close(store);
  if (rc != 0) {
    fprintf(stderr, "rank %s: store set/wait: %s\n", rank_text, tide_strerror(rc));
    return 15;
  }
  return 0;
}

/* ---- tests ----------------------------------------------------------------- */

/* Three ranks: identities, one rendezvous address, token and job id. */
static void test_identity(void) {
  remove_dir_files();
  proc_t p;
  const char *args[] = {"-np", "3", self_path, "rank-child", dir, NULL};
  int code = run(&p, args, 20);
  CHECK_OUT(&p, code == 0);
  char first_rdzv[300] = "", first_token[300] = "", first_id[300] = "";
  for (int r = 0; r < 3; r++) {
    char name[32], value[300], want[32];
    snprintf(name, sizeof name, "env.%d", r);
    const char *text = read_file(name);
    CHECK_OUT(&p, text != NULL);
    snprintf(want, sizeof want, "%d", r);
    CHECK(env_value(text, "TIDE_RANK", value, sizeof value) == 0 && strcmp(value, want) == 0);
    CHECK(env_value(text, "TIDE_LOCAL_RANK", value, sizeof value) == 0 && strcmp(value, want) == 0);
    CHECK(env_value(text, "TIDE_SIZE", value, sizeof value) == 0 && strcmp(value, "3") == 0);
    CHECK(env_value(text, "TIDE_LOCAL_SIZE", value, sizeof value) == 0 && strcmp(value, "3") == 0);
    CHECK(env_value(text, "TIDE_NODE_RANK", value, sizeof value) == 0 && strcmp(value, "0") == 0);
    CHECK(env_value(text, "TIDE_NNODES", value, sizeof value) == 0 && strcmp(value, "1") == 0);
    CHECK(env_value(text, "TIDE_RDZV", value, sizeof value) == 0);
    CHECK(strncmp(value, "127.0.0.1:", 10) == 0 && atoi(value + 10) > 0);
    if (r == 0) snprintf(first_rdzv, sizeof first_rdzv, "%s", value);
    CHECK(strcmp(value, first_rdzv) == 0);
    CHECK(env_value(text, "TIDE_JOB_TOKEN", value, sizeof value) == 0);
    CHECK(strlen(value) == 64 && strspn(value, "0123456789abcdef") == 64);
    if (r == 0) snprintf(first_token, sizeof first_token, "%s", value);
    CHECK(strcmp(value, first_token) == 0);
    CHECK(env_value(text, "TIDE_JOB_ID", value, sizeof value) == 0 && strlen(value) > 0);
    if (r == 0) snprintf(first_id, sizeof first_id, "%s", value);
    CHECK(strcmp(value, first_id) == 0);
  }
  CHECK(read_file("env.3") == NULL);

  /* A token from the environment is passed on unchanged. */
  remove_dir_files();
  setenv("TIDE_JOB_TOKEN", "token-from-env", 1);
  const char *args1[] = {"-np", "1", self_path, "rank-child", dir, NULL};
  code = run(&p, args1, 20);
  unsetenv("TIDE_JOB_TOKEN");
  CHECK_OUT(&p, code == 0);
  char value[300];
  CHECK(env_value(read_file("env.0"), "TIDE_JOB_TOKEN", value, sizeof value) == 0);
  CHECK(strcmp(value, "token-from-env") == 0);
}

/* Rank 1 exits 3 while the others sleep: tiderun names it, stops the rest
 * after the grace period and exits 3, and no sleeper survives. */
static void test_rank_failure(void) {
  proc_t p;
  const char *args[] = {"-np", "3", "/bin/sh", "-c",
                        "if [ \"$TIDE_RANK\" = 1 ]; then exit 3; fi; sleep 30", NULL};
  double start = now_s();
  int code = run(&p, args, 15);
  double took = now_s() - start;
  CHECK_OUT(&p, code == 3);
  CHECK_OUT(&p, strstr(p.text[1], "rank 1 (pid ") != NULL);
  CHECK_OUT(&p, strstr(p.text[1], "exited with status 3") != NULL);
  CHECK_OUT(&p, strstr(p.text[1], "rank 0 (pid") == NULL); /* stopped by tiderun: not a failure */
  CHECK_OUT(&p, took < 10);

  /* Killed by a signal: named, exit status 1; --grace-ms 0 stops the rest at once. */
  const char *args2[] = {"--grace-ms", "0", "-np", "2", "/bin/sh", "-c",
                         "if [ \"$TIDE_RANK\" = 0 ]; then kill -SEGV $$; fi; sleep 30", NULL};
  start = now_s();
  code = run(&p, args2, 15);
  CHECK_OUT(&p, code == 1);
  CHECK_OUT(&p, strstr(p.text[1], "rank 0 (pid ") != NULL);
  CHECK_OUT(&p, strstr(p.text[1], "was killed by signal SIGSEGV") != NULL);
  CHECK_OUT(&p, now_s() - start < 5);

  /* A program that cannot be run fails the job with 127. */
  const char *args3[] = {"-np", "2", "/nonexistent/tide-prog", NULL};
  code = run(&p, args3, 15);
  CHECK_OUT(&p, code == 127);
  CHECK_OUT(&p, strstr(p.text[1], "tiderun: cannot run /nonexistent/tide-prog: ") != NULL);
}

static void test_success_and_prefix(void) {
  proc_t p;
  const char *args[] = {"-np", "4", "/bin/sh", "-c", "exit 0", NULL};
  CHECK_OUT(&p, run(&p, args, 15) == 0);

  const char *args2[] = {"--prefix", "-np", "2", "/bin/sh", "-c",
                         "echo out$TIDE_RANK; echo err$TIDE_RANK >&2; echo two; "
                         "printf partial$TIDE_RANK",
                         NULL};
  CHECK_OUT(&p, run(&p, args2, 15) == 0);
  for (int r = 0; r < 2; r++) {
    char line[64];
    snprintf(line, sizeof line, "[%d] out%d\n", r, r);
    CHECK_OUT(&p, strstr(p.text[0], line) != NULL);
    snprintf(line, sizeof line, "[%d] two\n", r);
    CHECK_OUT(&p, strstr(p.text[0], line) != NULL);
    snprintf(line, sizeof line, "[%d] partial%d\n", r, r);
    CHECK_OUT(&p, strstr(p.text[0], line) != NULL);
    snprintf(line, sizeof line, "[%d] err%d\n", r, r);
    CHECK_OUT(&p, strstr(p.text[1], line) != NULL);
  }
  CHECK_OUT(&p, strstr(p.text[0], "err") == NULL);
  CHECK_OUT(&p, strstr(p.text[1], "out") == NULL);
  /* Every line is whole and prefixed. */
  for (const char *line = p.text[0]; *line; line = strchr(line, '\n') + 1) {
    CHECK_OUT(&p, line[0] == '[' && strchr(line, '\n') != NULL);
  }

  /* What a rank leaves running in its process group is killed when it exits:
   * the background sleep would otherwise hold the output pipes for 30 s. */
  const char *leftover[] = {"-np", "2", "/bin/sh", "-c", "sleep 30 & exit 0", NULL};
  double start = now_s();
  CHECK_OUT(&p, run(&p, leftover, 15) == 0);
  CHECK_OUT(&p, now_s() - start < 10);

  /* -l is --prefix; "--" ends the options. */
  const char *args3[] = {"-l", "-np", "1", "--", "/bin/sh", "-c", "echo hi", NULL};
  CHECK_OUT(&p, run(&p, args3, 15) == 0);
  CHECK_OUT(&p, strcmp(p.text[0], "[0] hi\n") == 0);
}

/* Bad arguments: non-zero exit and a message naming the option. */
static void test_bad_options(void) {
  struct {
    const char *args[12];
    const char *want;
  } cases[] = {
      {{"-np", "0", "/bin/true", NULL}, "-np"},
      {{"-np", "abc", "/bin/true", NULL}, "-np"},
      {{"--nproc-per-node", "-2", "/bin/true", NULL}, "--nproc-per-node"},
      {{"-np", NULL}, "-np needs a value"},
      {{"-np", "2", NULL}, "no program"},
      {{"--bogus", "/bin/true", NULL}, "unknown option \"--bogus\""},
      {{"--nnodes", "2", "--node-rank", "2", "--rdzv", "127.0.0.1:1", "/bin/true", NULL},
       "--node-rank"},
      {{"--rdzv", "no-port", "/bin/true", NULL}, "--rdzv"},
      {{"--rdzv", "host:99999", "/bin/true", NULL}, "--rdzv"},
      {{"--nnodes", "2", "/bin/true", NULL}, "--rdzv"},
      {{"--nnodes", "2", "--rdzv", "127.0.0.1:1", "/bin/true", NULL}, "export TIDE_JOB_TOKEN"},
      {{"--prefix=1", "/bin/true", NULL}, "--prefix takes no value"},
      {{"--nnodes", "1:2", "--rdzv", "127.0.0.1:1", "/bin/true", NULL}, "--nnodes MIN:MAX needs --elastic"},
      {{"--elastic", "--nnodes", "3:2", "--rdzv", "127.0.0.1:1", "/bin/true", NULL}, "MIN <= MAX"},
      {{"--elastic", "--nnodes", ":2", "--rdzv", "127.0.0.1:1", "/bin/true", NULL}, "K or MIN:MAX"},
      {{"--elastic", "--nnodes", "2", "--min-np", "5", "-np", "2", "--rdzv", "127.0.0.1:1", "/bin/true", NULL},
       "--min-np (5) <= the first nodes' workers (2 x 2)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    proc_t p;
    int code = run(&p, cases[i].args, 15);
    if (code == 0 || strstr(p.text[1], cases[i].want) == NULL)
      fprintf(stderr, "case %zu: wanted an error mentioning \"%s\"\n", i, cases[i].want);
    CHECK_OUT(&p, code != 0 && code != -1);
    CHECK_OUT(&p, strstr(p.text[1], cases[i].want) != NULL);
  }
  proc_t p;
  const char *unknown[] = {"--bogus", "/bin/true", NULL};
  run(&p, unknown, 15);
  CHECK_OUT(&p, strstr(p.text[1], "usage: tiderun") != NULL);
  const char *help[] = {"--help", NULL};
  CHECK_OUT(&p, run(&p, help, 15) == 0 && strstr(p.text[0], "usage: tiderun") != NULL);
  const char *eq[] = {"--nproc-per-node=2", "/bin/true", NULL};
  CHECK_OUT(&p, run(&p, eq, 15) == 0);
}

/* SIGTERM to tiderun reaches every rank; --timeout stops a job that hangs. */
static void test_signals_and_timeout(void) {
  remove_dir_files();
  const char *script = "trap 'echo term > \"$TEST_DIR/term.$TIDE_RANK\"; exit 0' TERM; "
                       "touch \"$TEST_DIR/ready.$TIDE_RANK\"; sleep 30 & wait";
  const char *args[] = {"-np", "2", "/bin/sh", "-c", script, NULL};
  proc_t p;
  proc_start(&p, args);
  double deadline = now_s() + 10;
  while (now_s() < deadline && (read_file("ready.0") == NULL || read_file("ready.1") == NULL))
    usleep(20000);
  CHECK(read_file("ready.1") != NULL && read_file("ready.0") != NULL);
  kill(p.pid, SIGTERM);
  procs_finish(&p, 1, 10);
  CHECK_OUT(&p, WIFEXITED(p.status) && WEXITSTATUS(p.status) == 128 + SIGTERM);
  CHECK_OUT(&p, read_file("term.0") != NULL && read_file("term.1") != NULL);
  CHECK_OUT(&p, strstr(p.text[1], "received SIGTERM") != NULL);

  const char *args2[] = {"--timeout", "1", "-np", "2", "/bin/sh", "-c", "sleep 30", NULL};
  double start = now_s();
  CHECK_OUT(&p, run(&p, args2, 10) == 124);
  CHECK_OUT(&p, now_s() - start < 5);
  CHECK_OUT(&p, strstr(p.text[1], "--timeout") != NULL);
}

/* Two tiderun processes as two nodes of two ranks each: ranks 0..3 meet in
 * node 0's store. */
static void test_two_nodes(void) {
  remove_dir_files();
  char rdzv[64];
  snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", harness_free_port());
  setenv("TIDE_JOB_TOKEN", "two-node-test-token", 1);
  proc_t nodes[2];
  for (int node = 1; node >= 0; node--) { /* node 1 first: it waits for node 0's store */
    const char *args[] = {"--nnodes", "2", "--node-rank", node ? "1" : "0", "--nproc-per-node",
                          "2", "--rdzv", rdzv, self_path, "rank-child", dir, NULL};
    proc_start(&nodes[node], args);
  }
  unsetenv("TIDE_JOB_TOKEN");
  procs_finish(nodes, 2, 25);
  for (int node = 0; node < 2; node++)
    CHECK_OUT(&nodes[node], WIFEXITED(nodes[node].status) && WEXITSTATUS(nodes[node].status) == 0);
  char first_id[300] = "";
  for (int r = 0; r < 4; r++) {
    char name[32], value[300], want[32];
    snprintf(name, sizeof name, "env.%d", r);
    const char *text = read_file(name);
    CHECK(text != NULL);
    snprintf(want, sizeof want, "%d", r);
    CHECK(env_value(text, "TIDE_RANK", value, sizeof value) == 0 && strcmp(value, want) == 0);
    snprintf(want, sizeof want, "%d", r % 2);
    CHECK(env_value(text, "TIDE_LOCAL_RANK", value, sizeof value) == 0 && strcmp(value, want) == 0);
    snprintf(want, sizeof want, "%d", r / 2);
    CHECK(env_value(text, "TIDE_NODE_RANK", value, sizeof value) == 0 && strcmp(value, want) == 0);
    CHECK(env_value(text, "TIDE_SIZE", value, sizeof value) == 0 && strcmp(value, "4") == 0);
    CHECK(env_value(text, "TIDE_LOCAL_SIZE", value, sizeof value) == 0 && strcmp(value, "2") == 0);
    CHECK(env_value(text, "TIDE_NNODES", value, sizeof value) == 0 && strcmp(value, "2") == 0);
    CHECK(env_value(text, "TIDE_RDZV", value, sizeof value) == 0 && strcmp(value, rdzv) == 0);
    CHECK(env_value(text, "TIDE_JOB_TOKEN", value, sizeof value) == 0 &&
          strcmp(value, "two-node-test-token") == 0);
    CHECK(env_value(text, "TIDE_JOB_ID", value, sizeof value) == 0 && strlen(value) > 0);
    if (r == 0) snprintf(first_id, sizeof first_id, "%s", value);
    CHECK(strcmp(value, first_id) == 0); /* both nodes derive the same id */
  }
  CHECK(read_file("env.4") == NULL);

  /* A node with another token is refused with a message saying what to do. */
  snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", harness_free_port());
  setenv("TIDE_JOB_TOKEN", "token-a", 1);
  const char *args0[] = {"--nnodes", "2", "--node-rank", "0", "--rdzv", rdzv,
                         "/bin/sh", "-c", "sleep 3", NULL};
  proc_start(&nodes[0], args0);
  setenv("TIDE_JOB_TOKEN", "token-b", 1);
  const char *args1[] = {"--nnodes", "2", "--node-rank", "1", "--rdzv", rdzv,
                         "/bin/true", NULL};
  proc_start(&nodes[1], args1);
  unsetenv("TIDE_JOB_TOKEN");
  procs_finish(nodes, 2, 20);
  CHECK_OUT(&nodes[1], WIFEXITED(nodes[1].status) && WEXITSTATUS(nodes[1].status) != 0);
  CHECK_OUT(&nodes[1], strstr(nodes[1].text[1], "TIDE_JOB_TOKEN") != NULL);
}

/* tiderun raises its own soft RLIMIT_NOFILE to the hard limit (the store
 * holds a descriptor per connection) and gives the ranks the one it started
 * with. */
static void test_fd_limit(void) {
  struct rlimit saved, low;
  CHECK(getrlimit(RLIMIT_NOFILE, &saved) == 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 256) return; /* nothing to raise */
  low = (struct rlimit){256, saved.rlim_max};
  CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  proc_t p;
  const char *args[] = {"-np", "1", "/bin/sh", "-c",
                        "grep 'Max open files' /proc/$PPID/limits; echo rank=$(ulimit -Sn)", NULL};
  int code = run(&p, args, 20);
  CHECK(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK_OUT(&p, code == 0);
  unsigned long long soft = 0, hard = 0;
  const char *line = strstr(p.text[0], "Max open files");
  CHECK_OUT(&p, line != NULL && sscanf(line, "Max open files %llu %llu", &soft, &hard) == 2);
  CHECK_OUT(&p, soft == hard && soft > 256);
  CHECK_OUT(&p, strstr(p.text[0], "rank=256") != NULL);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "rank-child") == 0) return rank_child(argv[2]);
  const char *tools = getenv("TIDE_TOOLS_DIR");
  if (tools == NULL || tools[0] == '\0') {
    fprintf(stderr, "TIDE_TOOLS_DIR is not set: skipped\n");
    return 77;
  }
  snprintf(tiderun_path, sizeof tiderun_path, "%s/tiderun", tools);
  if (access(tiderun_path, X_OK) != 0) {
    fprintf(stderr, "%s: %s: skipped\n", tiderun_path, strerror(errno));
    return 77;
  }
  ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  CHECK(n > 0);
  self_path[n] = '\0';
  snprintf(dir, sizeof dir, "/tmp/test_tiderun.XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  setenv("TEST_DIR", dir, 1); /* for the /bin/sh ranks */
  unsetenv("TIDE_JOB_TOKEN");
  unsetenv("TIDE_RANK");
  unsetenv("TIDE_SIZE");
  unsetenv("TIDE_LOCAL_RANK");

  double start = now_s();
  test_bad_options();
  test_success_and_prefix();
  test_identity();
  test_rank_failure();
  test_signals_and_timeout();
  test_two_nodes();
  test_fd_limit();
  fprintf(stderr, "test_tiderun: all passed in %.1f s\n", now_s() - start);

  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  return 0;
}
