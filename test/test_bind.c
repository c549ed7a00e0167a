/* Placement: the shares tide__bind_shares computes on synthetic hwloc
 * topologies (disjoint, covering, contiguous, within NUMA nodes, wrapping),
 * then end to end on this machine: tiderun --bind core|numa|none, a cpuset
 * smaller than the machine (tiderun started with a narrower affinity), the
 * default compute threads following the share, `tide info`, and TIDE_BIND
 * binding a rank in tide_comm_init when another launcher started it.
 *
 * The ranks tiderun starts are this binary in "rank-affinity" mode, which
 * prints its local rank, its CPUs and its default compute threads. */
#include "harness.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

#define MAX_RANKS 32
#define OUT_CAP 16384

static char tiderun_path[PATH_MAX], tide_path[PATH_MAX], self_path[PATH_MAX];

/* ---- helpers ----------------------------------------------------------------- */

static int first_cpu(const cpu_set_t *s) {
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, s)) return c;
  return -1;
}

static int last_cpu(const cpu_set_t *s) {
  for (int c = CPU_SETSIZE - 1; c >= 0; c--)
    if (CPU_ISSET(c, s)) return c;
  return -1;
}

/* "0-3,8" -> set; 0 on success. */
static int parse_list(const char *text, cpu_set_t *out) {
  CPU_ZERO(out);
  while (*text != '\0' && *text != ' ' && *text != '\n') {
    char *end;
    long a = strtol(text, &end, 10), b = a;
    if (end == text) return -1;
    if (*end == '-') {
      text = end + 1;
      b = strtol(text, &end, 10);
      if (end == text) return -1;
    }
    for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET((int)c, out);
    text = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* Checks that shares[0..n) are disjoint and their union is `all`. */
static void check_partition(const cpu_set_t *shares, int n, const cpu_set_t *all) {
  cpu_set_t seen;
  CPU_ZERO(&seen);
  for (int r = 0; r < n; r++) {
    cpu_set_t both;
    CPU_AND(&both, &seen, &shares[r]);
    CHECK(CPU_COUNT(&both) == 0);
    CHECK(CPU_COUNT(&shares[r]) >= 1);
    CPU_OR(&seen, &seen, &shares[r]);
  }
  CHECK(CPU_EQUAL(&seen, all));
}

static void range_set(int a, int b, cpu_set_t *out) {
  CPU_ZERO(out);
  for (int c = a; c <= b; c++) CPU_SET(c, out);
}

/* ---- shares on synthetic topologies -------------------------------------------------- */

/* 2 NUMA nodes x 4 cores x 2 PUs: PUs 0-7 on node 0, 8-15 on node 1. */
#define TWO_NODES "pack:2 numa:1 core:4 pu:2"

static void test_shares_two_nodes(void) {
  cpu_set_t shares[MAX_RANKS], all, node0, node1;
  range_set(0, 15, &all);
  range_set(0, 7, &node0);
  range_set(8, 15, &node1);
  /* ranks <= cores: disjoint, covering, contiguous whole cores, and within
   * one node whenever there are at least as many ranks as nodes. */
  for (int n = 1; n <= 8; n++) {
    CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, n, TWO_NODES, NULL, shares));
    check_partition(shares, n, &all);
    for (int r = 0; r < n; r++) {
      int a = first_cpu(&shares[r]), b = last_cpu(&shares[r]);
      CHECK(CPU_COUNT(&shares[r]) == b - a + 1); /* contiguous */
      CHECK(a % 2 == 0 && b % 2 == 1);           /* whole cores */
      if (n >= 2) CHECK((a < 8) == (b < 8));     /* one node */
      if (r > 0) CHECK(a > first_cpu(&shares[r - 1])); /* in rank order */
    }
  }
  /* 2 ranks: a node each. */
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 2, TWO_NODES, NULL, shares));
  CHECK(CPU_EQUAL(&shares[0], &node0) && CPU_EQUAL(&shares[1], &node1));
  /* 3 ranks: node 0 holds two (2 cores each), node 1 one (4 cores): never
   * 8/3 cores straddling the nodes. */
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 3, TWO_NODES, NULL, shares));
  CHECK(CPU_COUNT(&shares[0]) == 4 && CPU_COUNT(&shares[1]) == 4 && CPU_EQUAL(&shares[2], &node1));
  /* More ranks than cores: one core each, wrapping, every core used. */
  int n = 20;
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, n, TWO_NODES, NULL, shares));
  int uses[8] = {0};
  for (int r = 0; r < n; r++) {
    CHECK(CPU_COUNT(&shares[r]) == 2);
    uses[first_cpu(&shares[r]) / 2]++;
  }
  for (int c = 0; c < 8; c++) CHECK(uses[c] == 2 || uses[c] == 3);
  /* numa: each rank gets its share's whole node. */
  CHECK_OK(tide__bind_shares(TIDE__BIND_NUMA, 4, TWO_NODES, NULL, shares));
  CHECK(CPU_EQUAL(&shares[0], &node0) && CPU_EQUAL(&shares[1], &node0));
  CHECK(CPU_EQUAL(&shares[2], &node1) && CPU_EQUAL(&shares[3], &node1));
  CHECK_OK(tide__bind_shares(TIDE__BIND_NUMA, 1, TWO_NODES, NULL, shares));
  CHECK(CPU_EQUAL(&shares[0], &all));
  /* none: everything allowed, for every rank. */
  CHECK_OK(tide__bind_shares(TIDE__BIND_NONE, 3, TWO_NODES, NULL, shares));
  for (int r = 0; r < 3; r++) CHECK(CPU_EQUAL(&shares[r], &all));
}

static void test_shares_allowed_and_odd(void) {
  cpu_set_t shares[MAX_RANKS], allowed, want;
  /* An allowed set of PUs 2-5 on 8 single-PU cores: shares stay inside it. */
  range_set(2, 5, &allowed);
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 2, "core:8 pu:1", &allowed, shares));
  check_partition(shares, 2, &allowed);
  range_set(2, 3, &want);
  CHECK(CPU_EQUAL(&shares[0], &want));
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 5, "core:8 pu:1", &allowed, shares));
  CHECK(CPU_COUNT(&shares[4]) == 1 && CPU_EQUAL(&shares[4], &shares[0])); /* wrapped */
  /* 5 cores for 2 ranks: 2 and 3, covering all. */
  range_set(0, 4, &allowed);
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 2, "core:5 pu:1", NULL, shares));
  check_partition(shares, 2, &allowed);
  CHECK(CPU_COUNT(&shares[0]) + CPU_COUNT(&shares[1]) == 5 && CPU_COUNT(&shares[0]) >= 2);
  /* 4 ranks on 2 nodes of 4 single-PU cores: 2 cores each, covering all. */
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 4, "pack:2 numa:1 core:4 pu:1", NULL, shares));
  range_set(0, 7, &allowed);
  check_partition(shares, 4, &allowed);
  /* Errors. */
  CHECK_RC(tide__bind_shares(TIDE__BIND_CORE, 0, "core:2 pu:1", NULL, shares), TIDE_EINVAL);
  CHECK_RC(tide__bind_shares(7, 1, "core:2 pu:1", NULL, shares), TIDE_EINVAL);
  CHECK_RC(tide__bind_shares(TIDE__BIND_CORE, 1, "bogus:2", NULL, shares), TIDE_EINVAL);
  range_set(100, 101, &allowed);
  CHECK_RC(tide__bind_shares(TIDE__BIND_CORE, 1, "core:2 pu:1", &allowed, shares), TIDE_EINVAL);
  int mode;
  CHECK_RC(tide__bind_parse("cores", TIDE__BIND_CORE, &mode), TIDE_EINVAL);
  CHECK_OK(tide__bind_parse("auto", TIDE__BIND_CORE, &mode));
  CHECK(mode == TIDE__BIND_CORE);
  char text[64];
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(0, &s), CPU_SET(1, &s), CPU_SET(2, &s), CPU_SET(5, &s), CPU_SET(7, &s), CPU_SET(8, &s);
  tide__cpuset_format(&s, text, sizeof text);
  CHECK(strcmp(text, "0-2,5,7-8") == 0);
}

/* ---- tiderun end to end ----------------------------------------------------------- */

typedef struct {
  int n;               /* ranks that reported */
  cpu_set_t cpus[MAX_RANKS];
  int threads[MAX_RANKS];
  char out[OUT_CAP];
} ranks_t;

/* Runs argv (NULL-terminated) with its affinity set to mask (NULL: ours),
 * collects stdout+stderr within 60 s and the exit status. */
static int run_cmd(const cpu_set_t *mask, const char *const *argv, char *out, size_t cap) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    if (mask != NULL && sched_setaffinity(0, sizeof *mask, mask) != 0) _exit(125);
    execv(argv[0], (char *const *)argv);
    _exit(126);
  }
  close(fds[1]);
  size_t len = 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 60) {
      kill(pid, SIGKILL);
      fprintf(stderr, "%s did not finish in 60 s; output so far:\n%.*s\n", argv[0], (int)len, out);
      CHECK(!"timed out");
    }
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t got = read(fds[0], out + len, cap - 1 - len);
    if (got <= 0) break;
    len += (size_t)got;
    if (len == cap - 1) break;
  }
  out[len] = '\0';
  close(fds[0]);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* tiderun -np n [--bind mode] this-binary rank-affinity, under mask. */
static void run_ranks(const cpu_set_t *mask, int n, const char *mode, ranks_t *ranks) {
  char np[16];
  snprintf(np, sizeof np, "%d", n);
  const char *argv[12];
  int k = 0;
  argv[k++] = tiderun_path;
  argv[k++] = "--timeout";
  argv[k++] = "50";
  argv[k++] = "-np";
  argv[k++] = np;
  if (mode != NULL) {
    argv[k++] = "--bind";
    argv[k++] = mode;
  }
  argv[k++] = self_path;
  argv[k++] = "rank-affinity";
  argv[k] = NULL;
  memset(ranks, 0, sizeof *ranks);
  int rc = run_cmd(mask, argv, ranks->out, sizeof ranks->out);
  if (rc != 0) fprintf(stderr, "tiderun exited %d:\n%s\n", rc, ranks->out);
  CHECK(rc == 0);
  for (const char *line = ranks->out; line != NULL && *line != '\0';) {
    int local, threads, used;
    char list[512];
    if (sscanf(line, "R %d %511s %d%n", &local, list, &threads, &used) == 3 && local >= 0 && local < n) {
      CHECK_OK(parse_list(list, &ranks->cpus[local]));
      ranks->threads[local] = threads;
      ranks->n++;
    }
    line = strchr(line, '\n');
    if (line != NULL) line++;
  }
  if (ranks->n != n) fprintf(stderr, "%d of %d ranks reported:\n%s\n", ranks->n, n, ranks->out);
  CHECK(ranks->n == n);
}

static int rank_affinity(void) {
  cpu_set_t own;
  CHECK(sched_getaffinity(0, sizeof own, &own) == 0);
  char text[512];
  tide__cpuset_format(&own, text, sizeof text);
  int threads;
  CHECK_OK(tide_compute_threads(NULL, &threads));
  const char *local = getenv("TIDE_LOCAL_RANK"), *cpus = getenv("TIDE_CPUS");
  CHECK(local != NULL && cpus != NULL);
  /* TIDE_CPUS names what the rank got. */
  CHECK(strcmp(cpus, "unbound") == 0 || strcmp(cpus, text) == 0);
  printf("R %s %s %d\n", local, text, threads);
  fflush(stdout);
  return 0;
}

static void test_tiderun_bind(const cpu_set_t *machine) {
  int ncpus = CPU_COUNT(machine);
  ranks_t ranks;
  /* Default (core): disjoint and covering when ranks <= CPUs; one thread
   * each when every rank has one CPU. */
  for (int n = 1; n <= ncpus && n <= 4; n++) {
    run_ranks(NULL, n, NULL, &ranks);
    check_partition(ranks.cpus, n, machine);
    for (int r = 0; r < n; r++) CHECK(ranks.threads[r] == CPU_COUNT(&ranks.cpus[r]));
  }
  /* Twice as many ranks as CPUs (at most 4): one CPU each, wrapped, one
   * compute thread each. */
  int n = ncpus * 2 <= 4 ? ncpus * 2 : 4;
  run_ranks(NULL, n, "core", &ranks);
  for (int r = 0; r < n; r++) {
    CHECK(CPU_COUNT(&ranks.cpus[r]) >= 1);
    CHECK(ranks.threads[r] == CPU_COUNT(&ranks.cpus[r]));
  }
  /* none: every rank keeps tiderun's CPUs; threads divided among the ranks. */
  run_ranks(NULL, 2, "none", &ranks);
  for (int r = 0; r < 2; r++) {
    CHECK(CPU_EQUAL(&ranks.cpus[r], machine));
    CHECK(ranks.threads[r] == (ncpus / 2 >= 1 ? ncpus / 2 : 1));
  }
  /* numa: a rank's CPUs include its core share's NUMA node: on this machine
   * the union still covers everything. */
  run_ranks(NULL, 2, "numa", &ranks);
  cpu_set_t both;
  CPU_OR(&both, &ranks.cpus[0], &ranks.cpus[1]);
  CHECK(CPU_EQUAL(&both, machine));
  /* A cpuset smaller than the machine: tiderun on its last CPU only. */
  if (ncpus >= 2) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last_cpu(machine), &one);
    run_ranks(&one, 2, NULL, &ranks);
    CHECK(CPU_EQUAL(&ranks.cpus[0], &one) && CPU_EQUAL(&ranks.cpus[1], &one));
    run_ranks(&one, 2, "none", &ranks);
    CHECK(CPU_EQUAL(&ranks.cpus[0], &one) && CPU_EQUAL(&ranks.cpus[1], &one));
    /* The rest: the first ncpus-1 CPUs for ncpus-1 ranks, each its own. */
    cpu_set_t rest = *machine;
    CPU_CLR(last_cpu(machine), &rest);
    int m = CPU_COUNT(&rest) <= 4 ? CPU_COUNT(&rest) : 4;
    run_ranks(&rest, m, "core", &ranks);
    if (m == CPU_COUNT(&rest)) check_partition(ranks.cpus, m, &rest);
    for (int r = 0; r < m; r++) {
      cpu_set_t inside;
      CPU_AND(&inside, &ranks.cpus[r], &rest);
      CHECK(CPU_EQUAL(&inside, &ranks.cpus[r]));
    }
  }
  /* TIDE_NUM_THREADS overrides the share. */
  setenv("TIDE_NUM_THREADS", "3", 1);
  run_ranks(NULL, 2, NULL, &ranks);
  CHECK(ranks.threads[0] == 3 && ranks.threads[1] == 3);
  unsetenv("TIDE_NUM_THREADS");
  /* A bad --bind or TIDE_BIND is a usage error naming it. */
  char out[OUT_CAP];
  const char *bad[] = {tiderun_path, "--bind", "socket", "true", NULL};
  CHECK(run_cmd(NULL, bad, out, sizeof out) == 2 && strstr(out, "--bind must be core, numa or none") != NULL);
  setenv("TIDE_BIND", "cores", 1);
  const char *bad_env[] = {tiderun_path, "true", NULL};
  CHECK(run_cmd(NULL, bad_env, out, sizeof out) == 2 && strstr(out, "TIDE_BIND=\"cores\"") != NULL);
  /* TIDE_BIND=none is tiderun's default when --bind is not given. */
  setenv("TIDE_BIND", "none", 1);
  run_ranks(NULL, 2, NULL, &ranks);
  CHECK(CPU_EQUAL(&ranks.cpus[0], machine) && CPU_EQUAL(&ranks.cpus[1], machine));
  unsetenv("TIDE_BIND");
}

/* `tide info` under tiderun names each rank's CPUs; start-up logs them at info. */
static void test_info_and_log(const cpu_set_t *machine) {
  char out[OUT_CAP], want[512];
  const char *argv[] = {tiderun_path, "--timeout", "50", "-l", "-np", "2", tide_path, "info", NULL};
  setenv("TIDE_LOG_LEVEL", "info", 1);
  CHECK(run_cmd(NULL, argv, out, sizeof out) == 0);
  unsetenv("TIDE_LOG_LEVEL");
  cpu_set_t shares[2];
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, 2, NULL, machine, shares));
  for (int r = 0; r < 2; r++) {
    char cpus[256];
    tide__cpuset_format(&shares[r], cpus, sizeof cpus);
    snprintf(want, sizeof want, "[%d] binding: rank %d (local %d of 2): cpus %s, bound by tiderun (--bind core)", r,
             r, r, cpus);
    if (strstr(out, want) == NULL) fprintf(stderr, "no \"%s\" in:\n%s\n", want, out);
    CHECK(strstr(out, want) != NULL);
    snprintf(want, sizeof want, "tiderun: rank %d is pid", r);
    CHECK(strstr(out, want) != NULL);
    snprintf(want, sizeof want, "bound to cpus %s (--bind core)", cpus);
    CHECK(strstr(out, want) != NULL);
  }
}

/* ---- TIDE_BIND under another launcher ------------------------------------------------ */

static int bind_rank(int rank, int size, void *arg) {
  (void)arg;
  cpu_set_t shares[MAX_RANKS], own;
  CHECK_OK(tide__bind_shares(TIDE__BIND_CORE, size, NULL, NULL, shares));
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  CHECK(sched_getaffinity(0, sizeof own, &own) == 0);
  CHECK(CPU_EQUAL(&own, &shares[tide_comm_local_rank(comm)]));
  int threads;
  CHECK_OK(tide_compute_threads(comm, &threads));
  CHECK(threads == CPU_COUNT(&own));
  CHECK_RC(tide_compute_threads(comm, NULL), TIDE_EINVAL);
  CHECK_OK(tide_barrier(comm));
  tide_comm_destroy(comm);
  (void)rank;
  return 0;
}

static int unbound_rank(int rank, int size, void *arg) {
  const cpu_set_t *machine = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  cpu_set_t own;
  CHECK(sched_getaffinity(0, sizeof own, &own) == 0);
  CHECK(CPU_EQUAL(&own, machine)); /* auto: the launcher's binding stays */
  int threads, want = CPU_COUNT(machine) / size;
  CHECK_OK(tide_compute_threads(comm, &threads));
  CHECK(threads == (want >= 1 ? want : 1));
  CHECK_OK(tide_compute_threads(NULL, &threads)); /* the local size recorded at init */
  CHECK(threads == (want >= 1 ? want : 1));
  CHECK_OK(tide_barrier(comm));
  tide_comm_destroy(comm);
  (void)rank;
  return 0;
}

/* Each in a child of its own: the TIDE_* table is read once per process. */
static void test_env_bind(const cpu_set_t *machine) {
  for (int k = 0; k < 2; k++) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      harness_opts_t opts = {.np = 2};
      if (k == 0) setenv("TIDE_BIND", "core", 1);
      _exit(harness_run(&opts, k == 0 ? bind_rank : unbound_rank, (void *)machine));
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

/* The public forms tiderun uses (tide.h): they agree with the internal ones. */
static void test_public_calls(const cpu_set_t *machine) {
  char text[64];
  const int list[] = {0, 1, 2, 3, 8, 10, 11};
  tide_cpus_format(list, 7, text, sizeof text);
  CHECK(strcmp(text, "0-3,8,10-11") == 0);
  tide_cpus_format(list, 0, text, sizeof text);
  CHECK(strcmp(text, "none") == 0);
  tide_cpus_format(list + 4, 1, text, sizeof text);
  CHECK(strcmp(text, "8") == 0);
  tide_cpus_format(list, 7, text, 5); /* cut at cap: "0-3," and the NUL */
  CHECK(strcmp(text, "0-3,") == 0);
  cpu_set_t set;
  CHECK(parse_list("0-3,8,10-11", &set) == 0);
  tide__cpuset_format(&set, text, sizeof text);
  CHECK(strcmp(text, "0-3,8,10-11") == 0);

  tide_bind_t mode = TIDE_BIND_NONE;
  CHECK_OK(tide_bind_parse("auto", TIDE_BIND_CORE, &mode));
  CHECK(mode == TIDE_BIND_CORE);
  CHECK_OK(tide_bind_parse("numa", TIDE_BIND_CORE, &mode));
  CHECK(mode == TIDE_BIND_NUMA && strcmp(tide_bind_name(mode), "numa") == 0);
  CHECK_RC(tide_bind_parse("cores", TIDE_BIND_CORE, &mode), TIDE_EINVAL);
  CHECK_RC(tide_bind_parse(NULL, TIDE_BIND_CORE, &mode), TIDE_EINVAL);
  CHECK(mode == TIDE_BIND_NUMA);
  CHECK(strcmp(tide_bind_name((tide_bind_t)7), "?") == 0);

  enum { N = 3 };
  size_t cap = (size_t)N * CPU_SETSIZE, first[N + 1];
  int *cpus = calloc(cap, sizeof *cpus);
  cpu_set_t shares[N];
  CHECK(cpus != NULL);
  for (int m = TIDE_BIND_NONE; m <= TIDE_BIND_NUMA; m++) {
    CHECK_OK(tide_bind_plan((tide_bind_t)m, N, cpus, cap, first));
    CHECK_OK(tide__bind_shares(m, N, NULL, machine, shares));
    CHECK(first[0] == 0);
    for (int r = 0; r < N; r++) {
      cpu_set_t got;
      CPU_ZERO(&got);
      for (size_t k = first[r]; k < first[r + 1]; k++) {
        CHECK(k == first[r] || cpus[k] > cpus[k - 1]);
        CPU_SET(cpus[k], &got);
      }
      CHECK(CPU_EQUAL(&got, &shares[r]));
    }
  }
  cpus[0] = -7;
  first[0] = 99;
  CHECK_RC(tide_bind_plan(TIDE_BIND_NONE, N, cpus, (size_t)CPU_COUNT(machine), first), TIDE_EINVAL);
  CHECK(cpus[0] == -7 && first[0] == 99); /* nothing written */
  CHECK_RC(tide_bind_plan(TIDE_BIND_CORE, 0, cpus, cap, first), TIDE_EINVAL);
  CHECK_RC(tide_bind_plan(TIDE_BIND_CORE, N, NULL, cap, first), TIDE_EINVAL);
  free(cpus);

  int64_t value = -1;
  const char *param = NULL;
  CHECK_OK(tide_param_get("TIDE_TIMEOUT_MS", &param, &value));
  CHECK(value == tide__param_int(TIDE__PARAM_TIMEOUT_MS) && strcmp(param, tide__param_str(TIDE__PARAM_TIMEOUT_MS)) == 0);
  CHECK_OK(tide_param_get("TIDE_BIND", &param, &value)); /* unset in main */
  CHECK(strcmp(param, "auto") == 0 && value == 0);
  CHECK_OK(tide_param_get("TIDE_LOG_FILE", &param, NULL));
  CHECK(param == tide__param_str(TIDE__PARAM_LOG_FILE));
  CHECK_RC(tide_param_get("TIDE_LOG_FILE", NULL, &value), TIDE_EINVAL);
  CHECK_RC(tide_param_get("TIDE_NO_SUCH", &param, &value), TIDE_EINVAL);
  CHECK_RC(tide_param_get(NULL, &param, &value), TIDE_EINVAL);
  CHECK_RC(tide_param_get("TIDE_BIND", NULL, NULL), TIDE_EINVAL);

  int64_t t0 = tide_now_ns(), deadline = tide_deadline_after_ms(1000);
  CHECK(t0 > 0 && deadline >= t0 + 1000000000 && tide_now_ns() >= t0);
  CHECK(tide_deadline_after_ms(-1) == INT64_MAX);
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "rank-affinity") == 0) return rank_affinity();
  unsetenv("TIDE_BIND");
  unsetenv("TIDE_NUM_THREADS");
  unsetenv("TIDE_CPUS");
  unsetenv("TIDE_LOCAL_SIZE");
  cpu_set_t machine;
  CHECK(sched_getaffinity(0, sizeof machine, &machine) == 0);
  test_env_bind(&machine); /* first: a logged error below reads the TIDE_* table */
  test_shares_two_nodes();
  test_shares_allowed_and_odd();
  test_public_calls(&machine);
  const char *tools = getenv("TIDE_TOOLS_DIR");
  if (tools == NULL || tools[0] == '\0') {
    fprintf(stderr, "TIDE_TOOLS_DIR is not set: tiderun cases skipped\n");
    return 77;
  }
  snprintf(tiderun_path, sizeof tiderun_path, "%s/tiderun", tools);
  snprintf(tide_path, sizeof tide_path, "%s/tide", tools);
  ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  CHECK(n > 0);
  self_path[n] = '\0';
  unsetenv("TIDE_JOB_TOKEN");
  unsetenv("TIDE_RANK");
  unsetenv("TIDE_SIZE");
  unsetenv("TIDE_LOCAL_RANK");
  test_tiderun_bind(&machine);
  test_info_and_log(&machine);
  fprintf(stderr, "test_bind: all passed\n");
  return 0;
}
