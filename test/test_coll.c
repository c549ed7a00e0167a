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
  coll_suite_run(comm, max_count != NULL ? strtoull(max_count, NULL, 10) : 0, -1);
  tide_comm_destroy(comm);
  return 0;
}

/* Emulated hosts of the hierarchical cases: 2 hosts of 2 ranks, and 2
 * hosts of 3 and 2 ranks interleaved. */
static const char *const hosts_2x2[] = {"a", "a", "b", "b"};
static const char *const hosts_3_2[] = {"a", "b", "a", "b", "a"};

static int run_case(const char *name, int np, int tcp_only, const char *const *hosts) {
  harness_opts_t opts = {np, hosts, tcp_only, 240, NULL};
  fprintf(stderr, "test_coll %s: np=%d %s%s\n", name, np, tcp_only ? "tcp" : "shm",
          hosts != NULL ? " on emulated hosts" : "");
  return harness_run(&opts, all_collectives, NULL) != 0;
}

static int case_shm_names(void) {
  shm_names_per_job(); /* last in a whole run: it loads the parameters, which the ranks forked before read themselves */
  return 0;
}

#define COLL_CASE(name, np, tcp_only, hosts) \
  static int case_##name(void) { return run_case(#name, np, tcp_only, hosts); }
#define COLL_CHECK(name)
#include "test_coll_cases.h"
#undef COLL_CASE
#undef COLL_CHECK

/* test_coll CASE runs one case (ctest registers each on its own: see
 * test_coll_cases.h); no argument runs them all, one after another. */
int main(int argc, char **argv) {
  static const harness_case_t cases[] = {
#define COLL_CASE(name, np, tcp_only, hosts) {#name, case_##name},
#define COLL_CHECK(name) {#name, case_##name},
#include "test_coll_cases.h"
#undef COLL_CASE
#undef COLL_CHECK
  };
  return harness_cases_main("test_coll", cases, sizeof cases / sizeof cases[0], argc, argv);
}
