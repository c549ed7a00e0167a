/* Test helpers: checks that report file:line, and a runner that starts a
 * store server and N rank processes the way tiderun would. */
#ifndef TIDE_TEST_HARNESS_H
#define TIDE_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include "tide.h"

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);       \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

#define CHECK_RC(call, want)                                                         \
  do {                                                                               \
    int check_rc_ = (call);                                                          \
    if (check_rc_ != (want)) {                                                       \
      fprintf(stderr, "%s:%d: %s returned %d (%s), wanted %d (%s)\n", __FILE__,      \
              __LINE__, #call, check_rc_, tide_err_name(check_rc_), (want),          \
              tide_err_name(want));                                                  \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

#define CHECK_OK(call) CHECK_RC(call, 0)

typedef struct {
  int np;
  /* Host id per rank (TIDE_HOST_ID), NULL: all ranks on this host. */
  const char *const *host_ids;
  /* 0: let tide detect shared memory; 1: TIDE_SHM=0 (TCP only). */
  int tcp_only;
  int timeout_s; /* the whole run; 0 = 120 */
  const char *token; /* NULL: "test-token" */
} harness_opts_t;

/* Runs fn(rank, size, arg) in np forked processes with TIDE_RANK, TIDE_SIZE,
 * TIDE_LOCAL_RANK, TIDE_RDZV and TIDE_JOB_TOKEN set, and a store server in
 * another process. Returns 0 when every rank returned 0; otherwise prints
 * which rank failed and returns 1. fn may also kill itself. */
int harness_run(const harness_opts_t *opts, int (*fn)(int rank, int size, void *arg), void *arg);

/* Exit status per rank of the last harness_run (as from waitpid). */
extern int harness_status[64];

/* A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick;
 * a port made up from the pid can be an ephemeral port in use). */
int harness_free_port(void);

/* Serves HTTP for a test on 127.0.0.1, on a port the kernel picks (returned):
 * a thread accepts and runs conn((void *)(intptr_t)fd) on a detached
 * thread per connection, which answers and closes fd. Runs until the
 * process exits. */
int harness_http_serve(void *(*conn)(void *fd));

/* Runs a shell command, its output (stdout; add 2>&1 for stderr) in
 * out[0..cap) NUL-terminated; returns its exit status (128 when killed). */
int harness_shell(const char *cmd, char *out, size_t cap);

/* Reads a whole (small) file into buf, NUL-terminated; exits the test
 * after saying which file when it cannot. */
void harness_slurp(const char *path, char *buf, size_t cap);

/* Starts a store server process; returns its port, writes its pid. */
int harness_store_start(const char *token, int *pid_out);

/* One case of a test with a case list (test_NAME_cases.h; docs/testing.md). */
typedef struct {
  const char *name;
  int (*fn)(void); /* 0 passed, 77 skipped, else failed */
} harness_case_t;

/* A case-list test's main: `test CASE` runs that case and returns its
 * status (ctest registers each case on its own); no argument runs every
 * case in turn (a skipped one is passed over); an unknown name prints the
 * names and returns 2. */
int harness_cases_main(const char *test, const harness_case_t *cases, size_t ncases, int argc, char **argv);

/* Deterministic pseudo-random numbers for test inputs. */
static inline unsigned harness_rand(unsigned *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state >> 8;
}

#endif
