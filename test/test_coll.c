/* Every collective against a scalar reference: np = 1..5, shared memory and
 * TCP, every dtype and op, odd counts, in place and not, blocking and
 * nonblocking, and hierarchical layouts over emulated hosts.
 * TIDE_TEST_MAX_COUNT=N leaves out the counts above N (make test-tsan: the
 * instrumented large counts cost minutes and add no thread interleaving). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_suite.h"
#include "comm/comm.h"
#include "harness.h"

/* Two jobs with the same token and communicator name on one host (two test
 * runs at once) named their segments alike, so one's start unlinked the
 * other's live segment as a leftover (shm_open: ENOENT). */
static void shm_names_per_job(void) {
  tide_comm_t *a = tide__comm_alloc(), *b = tide__comm_alloc();
  CHECK(a != NULL && b != NULL);
  char name_a[260], name_b[260];
  static char token[] = "test-token";
  a->token = b->token = token;
  snprintf(a->ns, sizeof a->ns, "w0");
  snprintf(b->ns, sizeof b->ns, "w0");
  snprintf(a->store_host, sizeof a->store_host, "127.0.0.1");
  snprintf(b->store_host, sizeof b->store_host, "127.0.0.1");
  a->store_port = 40001;
  b->store_port = 40002;
  tide__comm_shm_name(a, name_a, sizeof name_a);
  tide__comm_shm_name(b, name_b, sizeof name_b);
  CHECK(strcmp(name_a, name_b) != 0);
  b->store_port = 40001;
  tide__comm_shm_name(b, name_b, sizeof name_b);
  CHECK(strcmp(name_a, name_b) == 0); /* one job: the same name (leftovers are found) */
  a->token = b->token = NULL;
  tide_comm_destroy(a);
  tide_comm_destroy(b);
}

static int all_collectives(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  CHECK(tide_comm_rank(comm) == rank && tide_comm_size(comm) == size);
  const char *max_count = getenv("TIDE_TEST_MAX_COUNT");
  coll_suite_run(comm, max_count != NULL ? strtoull(max_count, NULL, 10) : 0);
  tide_comm_destroy(comm);
  return 0;
}

int main(void) {
  const char *hosts4[] = {"a", "a", "b", "b"};
  const char *hosts5[] = {"a", "b", "a", "b", "a"};
  int failed = 0;
  for (int np = 1; np <= 5; np++) {
    for (int tcp = 0; tcp <= 1; tcp++) {
      harness_opts_t opts = {np, NULL, tcp, 240, NULL};
      fprintf(stderr, "np=%d %s\n", np, tcp ? "tcp" : "shm");
      if (harness_run(&opts, all_collectives, NULL) != 0) {
        fprintf(stderr, "FAILED: np=%d %s\n", np, tcp ? "tcp" : "shm");
        failed = 1;
      }
    }
  }
  harness_opts_t hier = {4, hosts4, 0, 240, NULL};
  fprintf(stderr, "np=4 on 2 emulated hosts (hierarchical)\n");
  if (harness_run(&hier, all_collectives, NULL) != 0) failed = 1;
  harness_opts_t uneven = {5, hosts5, 0, 240, NULL};
  fprintf(stderr, "np=5 on 2 uneven emulated hosts\n");
  if (harness_run(&uneven, all_collectives, NULL) != 0) failed = 1;
  shm_names_per_job(); /* last: it loads the parameters, which the ranks forked above read themselves */
  return failed;
}
