/* tide sched's pool inside a Slurm allocation (src/sched/slurm.c; the real
 * Slurm run is test/sched_slurm.sh): SLURM_JOB_CPUS_PER_NODE's "4(x2),2"
 * form and its bad forms, the pool from SLURM_JOB_NODELIST, the daemon's
 * address as the other hosts reach it, and `tide sched` with a malformed
 * variable or outside any allocation (an error naming it, exit 2). */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "sched/slurm.h"

static void expect_cpus(const char *text, int nodes, const char *want) {
  int slots[TIDE__SCHED_MAX_NODES];
  char got[1024] = "";
  CHECK_OK(tide__slurm_cpus_per_node("SLURM_JOB_CPUS_PER_NODE", text, nodes, slots));
  for (int i = 0; i < nodes; i++) {
    size_t used = strlen(got);
    snprintf(got + used, sizeof got - used, "%s%d", i ? " " : "", slots[i]);
  }
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "\"%s\" on %d nodes: got \"%s\", want \"%s\"\n", text, nodes, got, want);
    CHECK(0);
  }
}

static void test_cpus(void) {
  fprintf(stderr, "-- SLURM_JOB_CPUS_PER_NODE\n");
  expect_cpus("4(x2),2", 3, "4 4 2");
  expect_cpus("8", 1, "8");
  expect_cpus("1,2,3", 3, "1 2 3");
  expect_cpus("2(x1)", 1, "2");
  expect_cpus("2,36(x3),1(x2)", 6, "2 36 36 36 1 1");
  int slots[TIDE__SCHED_MAX_NODES];
  CHECK_OK(tide__slurm_cpus_per_node("SLURM_JOB_CPUS_PER_NODE", "16(x64)", 64, slots));
  CHECK(slots[0] == 16 && slots[63] == 16);
  struct {
    const char *text;
    int nodes;
  } bad[] = {{"", 1},        {"4(x2),2", 4}, {"4(x2),2", 2}, {"4(x2", 2},  {"4(2)", 2},      {"0", 1},
             {"4(x0)", 1},   {"a", 1},       {"4,", 1},      {",4", 1},    {"4 ", 1},        {"-1", 1},
             {"4(x2)x", 2},  {"4(x)", 1},    {"4,,2", 2},    {"1234567890", 1}, {"4(x2),", 2}, {"4(x99999)", 3},
             {"4", 0},       {"4", 65}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    slots[0] = -7;
    CHECK_RC(tide__slurm_cpus_per_node("SLURM_JOB_CPUS_PER_NODE", bad[i].text, bad[i].nodes, slots), TIDE_EINVAL);
    CHECK(slots[0] == -7); /* written only on success */
  }
  CHECK_RC(tide__slurm_cpus_per_node("SLURM_JOB_CPUS_PER_NODE", NULL, 1, slots), TIDE_EINVAL);
}

static void test_pool(void) {
  fprintf(stderr, "-- the pool of SLURM_JOB_NODELIST\n");
  static tide__sched_pool_t pool;
  CHECK_OK(tide__sched_slurm_pool("emu[0-3]", "4(x4)", 0, &pool));
  CHECK(pool.nodes == 4);
  for (int i = 0; i < 4; i++) {
    char want[16];
    snprintf(want, sizeof want, "emu%d", i);
    CHECK(strcmp(pool.names[i], want) == 0 && pool.slots[i] == 4);
  }
  CHECK_OK(tide__sched_slurm_pool("n[08-09],gpu3", "2,6(x2)", 0, &pool));
  CHECK(pool.nodes == 3 && strcmp(pool.names[0], "n08") == 0 && strcmp(pool.names[2], "gpu3") == 0);
  CHECK(pool.slots[0] == 2 && pool.slots[1] == 6 && pool.slots[2] == 6);
  /* --slots-per-node: the CPU counts are not read at all. */
  CHECK_OK(tide__sched_slurm_pool("a,b", "garbage", 3, &pool));
  CHECK(pool.nodes == 2 && pool.slots[0] == 3 && pool.slots[1] == 3);
  CHECK_OK(tide__sched_slurm_pool("a,b", NULL, 1, &pool));
  CHECK_RC(tide__sched_slurm_pool("a,b", NULL, 0, &pool), TIDE_EINVAL);       /* no CPU counts */
  CHECK_RC(tide__sched_slurm_pool("a,b", "4", 0, &pool), TIDE_EINVAL);        /* one count for 2 nodes */
  CHECK_RC(tide__sched_slurm_pool("emu[0-", "4", 0, &pool), TIDE_EINVAL);     /* bad hostlist */
  CHECK_RC(tide__sched_slurm_pool("", "4", 0, &pool), TIDE_EINVAL);
  CHECK_RC(tide__sched_slurm_pool(NULL, "4", 0, &pool), TIDE_EINVAL);
  CHECK_RC(tide__sched_slurm_pool("n[1-65]", "1(x65)", 0, &pool), TIDE_EINVAL); /* more nodes than handled */
  CHECK_OK(tide__sched_slurm_pool("n[1-64]", "1(x64)", 0, &pool));
  CHECK(pool.nodes == 64 && strcmp(pool.names[63], "n64") == 0);
}

/* The first non-loopback IPv4 address of this machine, "" when none. */
static void other_address(char *out, size_t cap) {
  struct ifaddrs *list;
  out[0] = 0;
  if (getifaddrs(&list) != 0) return;
  for (struct ifaddrs *it = list; it != NULL && out[0] == 0; it = it->ifa_next)
    if (it->ifa_addr != NULL && it->ifa_addr->sa_family == AF_INET && (it->ifa_flags & IFF_UP) &&
        !(it->ifa_flags & IFF_LOOPBACK))
      inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, out, (socklen_t)cap);
  freeifaddrs(list);
}

static void test_address(void) {
  fprintf(stderr, "-- the daemon's address\n");
  char addr[64], self[256] = "", mine[64];
  gethostname(self, sizeof self - 1);
  const char *local[] = {"localhost", self, "127.0.0.1"};
  CHECK_OK(tide__sched_address(local, 3, "the hostfile", addr, sizeof addr));
  CHECK(strcmp(addr, "127.0.0.1") == 0); /* every host is this machine */
  const char *unknown[] = {self, "no-such-node.invalid"};
  CHECK_RC(tide__sched_address(unknown, 2, "SLURM_JOB_NODELIST", addr, sizeof addr), TIDE_EINVAL);
  other_address(mine, sizeof mine);
  if (mine[0] != 0) { /* another host at this machine's own address: never loopback */
    const char *pool[] = {self, mine};
    CHECK_OK(tide__sched_address(pool, 2, "SLURM_JOB_NODELIST", addr, sizeof addr));
    fprintf(stderr, "   hosts {%s, %s}: %s\n", self, mine, addr);
    CHECK(strcmp(addr, mine) == 0);
  }
}

/* `tide sched` with env (VAR=VALUE ...) and args: its exit status; its
 * stderr must hold `want`. */
static void expect_tool_error(const char *env, const char *args, const char *want) {
  const char *tools = getenv("TIDE_TOOLS_DIR");
  char cmd[2048], out[4096];
  snprintf(cmd, sizeof cmd, "env -u SLURM_JOB_ID -u SLURM_JOB_NODELIST -u SLURM_JOB_CPUS_PER_NODE %s %s/tide sched "
           "--dir /tmp/tide-test-sched-slurm-%d %s 2>&1 >/dev/null; echo \"rc=$?\"",
           env, tools, (int)getpid(), args);
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  pclose(p);
  fprintf(stderr, "   %s tide sched %s:\n%s", env, args, out);
  CHECK(strstr(out, "rc=2") != NULL);
  CHECK(strstr(out, want) != NULL);
}

static void test_tool(void) {
  if (getenv("TIDE_TOOLS_DIR") == NULL) {
    fprintf(stderr, "-- tide sched's errors: skipped (no TIDE_TOOLS_DIR)\n");
    return;
  }
  fprintf(stderr, "-- tide sched's errors\n");
  expect_tool_error("", "", "run tide sched inside a Slurm allocation");
  expect_tool_error("SLURM_JOB_ID=7 SLURM_JOB_NODELIST='emu[0-' SLURM_JOB_CPUS_PER_NODE=2", "",
                    "SLURM_JOB_NODELIST");
  expect_tool_error("SLURM_JOB_ID=7 SLURM_JOB_NODELIST='emu[0-1]' SLURM_JOB_CPUS_PER_NODE='2(x'", "",
                    "SLURM_JOB_CPUS_PER_NODE=\"2(x\"");
  expect_tool_error("SLURM_JOB_ID=7 SLURM_JOB_NODELIST='emu[0-1]' SLURM_JOB_CPUS_PER_NODE='2(x3)'", "",
                    "for more than the 2 node(s)");
  expect_tool_error("SLURM_JOB_ID=7 SLURM_JOB_NODELIST='emu[0-1]'", "", "give --slots-per-node N");
  expect_tool_error("", "--slots 2 --slots-per-node 2", "--slots-per-node is for a Slurm allocation");
  expect_tool_error("", "--slots-per-node 0", "--slots-per-node: '0'");
  expect_tool_error("SLURM_JOB_ID=7 SLURM_JOB_NODELIST='nosuch-a.invalid,nosuch-b.invalid' "
                    "SLURM_JOB_CPUS_PER_NODE='2(x2)'",
                    "", "give --address ADDR");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/tide-test-sched-slurm-%d", (int)getpid());
  CHECK(system(cmd) == 0);
}

int main(void) {
  test_cpus();
  test_pool();
  test_address();
  test_tool();
  fprintf(stderr, "ok\n");
  return 0;
}
