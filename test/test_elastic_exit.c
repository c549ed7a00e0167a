/* tiderun --elastic follows torchrun's rule: a worker's exit status 0 means
 * training is over, so a program that never says elastic/done itself ends
 * the job (exit 0) instead of tiderun starting new workers, failing with
 * "none said training is over", or hanging; and tide-train started by
 * tiderun --elastic is elastic without its own --elastic (issue 26, item 2). */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* A worker that knows nothing of elasticity: join, allreduce, leave. */
static int worker_main(void) {
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  int one = 1, sum = 0;
  CHECK_OK(tide_allreduce(comm, &one, &sum, 1, TIDE_I32, TIDE_SUM));
  CHECK(sum == tide_comm_size(comm));
  tide_comm_destroy(comm);
  return 0;
}

/* Runs cmd; its exit status, and whether its output contains needle. */
static int run(const char *cmd, const char *needle, int *seen) {
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  char line[4096];
  *seen = 0;
  while (fgets(line, sizeof line, p) != NULL) {
    fputs(line, stderr);
    if (strstr(line, needle) != NULL) *seen = 1;
  }
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int main(int argc, char **argv) {
  (void)argc;
  if (getenv("TIDE_RANK") != NULL) return worker_main();
  const char *tools = getenv("TIDE_TOOLS_DIR");
  if (tools == NULL) {
    fprintf(stderr, "TIDE_TOOLS_DIR is not set (run under ctest): skipped\n");
    return 77;
  }
  char cmd[2048];
  int started;
  fprintf(stderr, "-- tiderun --elastic -np 2 PROGRAM that exits 0 without saying training is over\n");
  snprintf(cmd, sizeof cmd, "%s/tiderun --elastic -np 2 --timeout 60 %s 2>&1", tools, argv[0]);
  int rc = run(cmd, "starting worker", &started);
  fprintf(stderr, "   exit status %d, new workers started: %s\n", rc, started ? "yes" : "no");
  CHECK(rc == 0);
  CHECK(!started);

  fprintf(stderr, "-- tiderun --elastic -np 2 tide-train (no --elastic of its own)\n");
  snprintf(cmd, sizeof cmd,
           "cd /tmp && %s/tiderun --elastic -np 2 --timeout 120 %s/tide-train --model mlp --epochs 1 --batch 32 "
           "--subset 800 --runs /tmp/tide-test-elastic-exit-%d 2>&1; rc=$?; rm -rf /tmp/tide-test-elastic-exit-%d; "
           "exit $rc",
           tools, tools, (int)getpid(), (int)getpid());
  int trained;
  rc = run(cmd, "replicas identical: yes", &trained);
  fprintf(stderr, "   exit status %d, trained to the end: %s\n", rc, trained ? "yes" : "no");
  CHECK(rc == 0);
  CHECK(trained);
  fprintf(stderr, "ok\n");
  return 0;
}
