/* Start-up under Slurm's environment on one host (the real Slurm runs in
 * test/slurm_cluster.sh): the hostlist parser (against `scontrol show
 * hostnames` when installed), the ports derived from the job and step ids,
 * ranks that find their rendezvous with no TIDE_RDZV (also when the first
 * derived ports are taken and when two jobs share a first host), a port in
 * use reported as such, the derived-token warning printed once per job, a
 * batch script's environment (no SLURM_STEP_ID) refused at once, and never a
 * loopback address published for a multi-host job. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "harness.h"

/* ---- hostlist ---------------------------------------------------------------- */

static void expect_hosts(const char *list, const char *want) {
  char all[4096] = "", host[256];
  int count = 0;
  CHECK_OK(tide__hostlist_nth("SLURM_JOB_NODELIST", list, 0, host, sizeof host, &count));
  for (int i = 0; i < count; i++) {
    CHECK_OK(tide__hostlist_nth("SLURM_JOB_NODELIST", list, i, host, sizeof host, NULL));
    size_t used = strlen(all);
    snprintf(all + used, sizeof all - used, "%s%s", i ? " " : "", host);
  }
  if (strcmp(all, want) != 0) {
    fprintf(stderr, "hostlist \"%s\": got \"%s\", want \"%s\"\n", list, all, want);
    CHECK(0);
  }
  /* Slurm's own expansion, when its client is installed (it needs a
   * slurm.conf to start, not a cluster; it refuses some lists tide takes). */
  char cmd[768], got[4096];
  if (system("command -v scontrol >/dev/null 2>&1") != 0) return;
  snprintf(cmd, sizeof cmd,
           "printf 'ClusterName=x\\nSlurmctldHost=localhost\\n' >/tmp/tide-test-slurm-%d.conf && "
           "SLURM_CONF=/tmp/tide-test-slurm-%d.conf scontrol show hostnames '%s' 2>/dev/null | tr '\\n' ' ' | "
           "sed 's/ $//'; rm -f /tmp/tide-test-slurm-%d.conf",
           (int)getpid(), (int)getpid(), list, (int)getpid());
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  size_t n = fread(got, 1, sizeof got - 1, p);
  got[n] = '\0';
  pclose(p);
  if (n > 0) fprintf(stderr, "   scontrol show hostnames '%s': %s\n", list, got);
  if (n > 0 && strcmp(got, want) != 0) {
    fprintf(stderr, "scontrol show hostnames '%s' gives \"%s\", tide \"%s\"\n", list, got, want);
    CHECK(0);
  }
}

static void test_hostlist(void) {
  expect_hosts("node1", "node1");
  expect_hosts("a,b,c", "a b c");
  expect_hosts("node[1-3]", "node1 node2 node3");
  expect_hosts("node[08-11,20]", "node08 node09 node10 node11 node20");
  expect_hosts("gpu[1-2]-ib,cpu7", "gpu1-ib gpu2-ib cpu7");
  expect_hosts("r[1-2]n[01-02]", "r1n01 r1n02 r2n01 r2n02");
  expect_hosts("h.example.org,x_[9-10]", "h.example.org x_9 x_10");
  expect_hosts("emu[0-1],head", "emu0 emu1 head");
  char host[64];
  int count;
  const char *bad[] = {"", "node[1-", "node1-3]", "node[3-1]", "node[a-b]", "node[]", "node[1,]", "a,,b",
                       "a b", "n[[1]]", "node[1-2", "x[1-2]y[", "node[,1]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fprintf(stderr, "   bad hostlist \"%s\": ", bad[i]);
    CHECK_RC(tide__hostlist_nth("SLURM_JOB_NODELIST", bad[i], 0, host, sizeof host, &count), TIDE_EINVAL);
  }
  CHECK_RC(tide__hostlist_nth("SLURM_JOB_NODELIST", "n[1-2]", 2, host, sizeof host, &count), TIDE_EINVAL);
  CHECK_RC(tide__hostlist_nth("SLURM_JOB_NODELIST", "averyveryverylongname", 0, host, 8, &count), TIDE_EINVAL);
  CHECK_RC(tide__hostlist_nth("SLURM_JOB_NODELIST", "n[1-99999999]", 0, host, sizeof host, &count), TIDE_EINVAL);
}

/* ---- derived ports ----------------------------------------------------------- */

static void test_ports(void) {
  int seen_diff = 0;
  for (int attempt = 0; attempt < TIDE__SLURM_PORT_TRIES; attempt++) {
    int p = tide__slurm_port("4242.0", attempt);
    CHECK(p >= TIDE__SLURM_PORT_BASE && p < TIDE__SLURM_PORT_BASE + TIDE__SLURM_PORT_SPAN);
    CHECK(p == tide__slurm_port("4242.0", attempt)); /* every rank derives the same */
    for (int earlier = 0; earlier < attempt; earlier++) CHECK(p != tide__slurm_port("4242.0", earlier));
  }
  for (int job = 1; job < 50; job++) {
    char a[32], b[32];
    snprintf(a, sizeof a, "%d.0", job);
    snprintf(b, sizeof b, "%d.1", job);
    seen_diff += tide__slurm_port(a, 0) != tide__slurm_port(b, 0);
  }
  CHECK(seen_diff >= 45); /* steps of one job get different ports */
}

/* ---- ranks under a hand-made Slurm environment --------------------------------- */

static int rank_main(void) {
  tide_comm_t *comm;
  int rc = tide_comm_init(&comm);
  if (rc == TIDE_EADDRINUSE) return 10;
  if (rc != 0) return 11;
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm), sum = 0;
  CHECK_OK(tide_allreduce(comm, &rank, &sum, 1, TIDE_I32, TIDE_SUM));
  CHECK(sum == size * (size - 1) / 2);
  tide_comm_destroy(comm);
  return 0;
}

typedef struct {
  const char *job, *nodelist, *rdzv;
  int np;
  pid_t pids[8];
} job_t;

/* Starts job->np ranks of this program with Slurm's variables; rank r's
 * stderr goes to PREFIX.r. */
static void job_start(job_t *job, const char *self, const char *log_prefix) {
  for (int r = 0; r < job->np; r++) {
    job->pids[r] = fork();
    if (job->pids[r] != 0) continue;
    char text[256];
    snprintf(text, sizeof text, "%d", r);
    setenv("SLURM_PROCID", text, 1);
    setenv("SLURM_LOCALID", text, 1);
    snprintf(text, sizeof text, "%d", job->np);
    setenv("SLURM_NTASKS", text, 1);
    setenv("SLURM_JOB_ID", job->job, 1);
    if (getenv("TEST_SLURM_NO_STEP") == NULL) setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_JOB_NODELIST", job->nodelist, 1);
    setenv("SLURM_JOB_NUM_NODES", "1", 1);
    if (job->rdzv != NULL) setenv("TIDE_RDZV", job->rdzv, 1);
    setenv("TEST_SLURM_RANK", "1", 1);
    if (log_prefix != NULL) {
      snprintf(text, sizeof text, "%s.%d", log_prefix, r);
      int fd = open(text, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) dup2(fd, 2);
    }
    execl(self, self, (char *)NULL);
    _exit(127);
  }
}

/* The ranks' exit codes: 0 when all are 0, else the first other one. */
static int job_wait(job_t *job) {
  int first = 0;
  for (int r = 0; r < job->np; r++) {
    int status;
    waitpid(job->pids[r], &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && first == 0) first = code;
  }
  return first;
}

static int count_in_files(const char *prefix, int np, const char *needle) {
  int count = 0;
  for (int r = 0; r < np; r++) {
    char path[256], line[4096];
    snprintf(path, sizeof path, "%s.%d", prefix, r);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    while (fgets(line, sizeof line, f) != NULL) {
      count += strstr(line, needle) != NULL;
      fprintf(stderr, "   [rank %d] %s", r, line);
    }
    fclose(f);
    unlink(path);
  }
  return count;
}

/* A listening socket on port, accepting nothing (a stranger's service). */
static int occupy(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    fprintf(stderr, "cannot occupy port %d (in use already?)\n", port);
    return -1;
  }
  return fd;
}

/* Whether this machine has an IPv4 address other than loopback, up. */
static int has_other_address(void) {
  struct ifaddrs *list;
  int found = 0;
  if (getifaddrs(&list) != 0) return 0;
  for (struct ifaddrs *it = list; it != NULL; it = it->ifa_next)
    found |= it->ifa_addr != NULL && it->ifa_addr->sa_family == AF_INET && (it->ifa_flags & IFF_UP) &&
             !(it->ifa_flags & IFF_LOOPBACK);
  freeifaddrs(list);
  return found;
}

int main(int argc, char **argv) {
  (void)argc;
  if (getenv("TEST_SLURM_RANK") != NULL) return rank_main();
  static const char *clear[] = {"TIDE_RANK", "TIDE_SIZE", "TIDE_RDZV", "TIDE_JOB_TOKEN", "TIDE_SOCKET_IFNAME",
                                "TIDE_HOST_ID", "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NUM_NODES",
                                "SLURM_NNODES", "SLURM_LAUNCH_NODE_IPADDR", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                                "PMI_SIZE", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
  setenv("TIDE_TIMEOUT_MS", "30000", 1);

  fprintf(stderr, "-- hostlist syntax\n");
  test_hostlist();
  fprintf(stderr, "-- ports from the job and step ids\n");
  test_ports();

  char logs[128];
  snprintf(logs, sizeof logs, "/tmp/tide-test-slurm-%d", (int)getpid());
  unsigned seed = (unsigned)getpid();
  char job_a[32], job_b[32];
  snprintf(job_a, sizeof job_a, "%u", 100000 + harness_rand(&seed) % 800000);
  snprintf(job_b, sizeof job_b, "%u", 100000 + harness_rand(&seed) % 800000 + 900000);

  fprintf(stderr, "-- 3 ranks, SLURM_* only (no TIDE_RDZV, no TIDE_JOB_TOKEN): job %s\n", job_a);
  job_t a = {job_a, "localhost", NULL, 3, {0}};
  job_start(&a, argv[0], logs);
  int failed = job_wait(&a);
  if (failed != 0) count_in_files(logs, 3, "(printing the ranks' logs)");
  CHECK(failed == 0);
  int warnings = count_in_files(logs, 3, "TIDE_JOB_TOKEN is not set");
  fprintf(stderr, "   the derived-token warning was printed %d time(s)\n", warnings);
  CHECK(warnings == 1);

  fprintf(stderr, "-- the first two derived ports taken (a silent listener, another job's store), and two jobs "
                  "at once on the same first host\n");
  char step_a[64];
  snprintf(step_a, sizeof step_a, "%s.0", job_a);
  int squatter = occupy(tide__slurm_port(step_a, 0));
  CHECK(squatter >= 0);
  tide_store_server_t *other = NULL;
  CHECK_OK(tide_store_server_start(NULL, tide__slurm_port(step_a, 1), "another-jobs-token", &other));
  job_t b = {job_b, "localhost,otherhost", NULL, 2, {0}};
  job_start(&a, argv[0], NULL);
  job_start(&b, argv[0], NULL);
  CHECK(job_wait(&a) == 0);
  CHECK(job_wait(&b) == 0);
  tide_store_server_stop(other);

  fprintf(stderr, "-- TIDE_RDZV on a port in use: \"address already in use\"\n");
  char rdzv[64];
  int port = harness_free_port();
  snprintf(rdzv, sizeof rdzv, "127.0.0.1:%d", port);
  close(squatter);
  squatter = occupy(port);
  CHECK(squatter >= 0);
  setenv("TIDE_TIMEOUT_MS", "3000", 1);
  job_t c = {job_a, "localhost", rdzv, 1, {0}};
  c.np = 1; /* rank 0 alone of 2: it fails before waiting for anyone */
  c.pids[0] = fork();
  if (c.pids[0] == 0) {
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_JOB_ID", job_a, 1);
    setenv("TIDE_RDZV", rdzv, 1);
    setenv("TEST_SLURM_RANK", "1", 1);
    execl(argv[0], argv[0], (char *)NULL);
    _exit(127);
  }
  CHECK(job_wait(&c) == 10);
  close(squatter);

  fprintf(stderr, "-- a bad SLURM_JOB_NODELIST fails at once\n");
  job_t d = {job_a, "node[1-", NULL, 2, {0}};
  job_start(&d, argv[0], NULL);
  CHECK(job_wait(&d) == 11);

  fprintf(stderr, "-- a batch script's environment (no SLURM_STEP_ID): every rank fails at once, naming srun\n");
  setenv("TEST_SLURM_NO_STEP", "1", 1);
  job_t e = {job_a, "localhost", NULL, 2, {0}};
  job_start(&e, argv[0], logs);
  failed = job_wait(&e);
  int named = count_in_files(logs, 2, "start the program with srun");
  CHECK(failed == 11);
  CHECK(named == 2);
  unsetenv("TEST_SLURM_NO_STEP");

  fprintf(stderr, "-- a job on 2 hosts never publishes a loopback address\n");
  char addr[64];
  CHECK_OK(tide__publish_addr("127.0.0.1", 9, addr, sizeof addr));
  CHECK(tide__addr_is_loopback(addr)); /* one host (the launcher says nothing): loopback is right */
  setenv("SLURM_JOB_NUM_NODES", "2", 1);
  CHECK_OK(tide__publish_addr("127.0.0.1", 9, addr, sizeof addr));
  int has_other = has_other_address();
  fprintf(stderr, "   2 hosts, the store host resolving to loopback: publishes %s (%s)\n", addr,
          has_other ? "this machine has a non-loopback address" : "this machine has only loopback: kept");
  CHECK(!has_other || !tide__addr_is_loopback(addr));
  unsetenv("SLURM_JOB_NUM_NODES");
  fprintf(stderr, "ok\n");
  return 0;
}
