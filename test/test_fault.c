/* Faults return errors, never hangs: a rank killed mid-allreduce, a
 * mismatched call, an invalid argument, a rank that leaves early, and
 * connections without the job token. */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "harness.h"

#define TIMEOUT_MS 20000

static double now_s(void) { return (double)tide__now_ns() * 1e-9; }

/* Rank 1 dies in the middle of a stream of large allreduces. */
static int killed_peer(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  size_t n = 1 << 20;
  float *buf = calloc(n, sizeof *buf);
  int rc = 0;
  double start = 0;
  for (int i = 0; i < 100000 && rc == 0; i++) {
    if (rank == 1 && i == 20) raise(SIGKILL);
    start = now_s(); /* the call that fails must fail within the timeout */
    rc = tide_allreduce(comm, buf, buf, n, TIDE_F32, TIDE_SUM);
  }
  double took = now_s() - start;
  fprintf(stderr, "rank %d: %s after %.3f s: %s\n", rank, tide_err_name(rc), took, tide_comm_last_error(comm));
  CHECK_RC(rc, TIDE_EPEER);
  CHECK(took < TIMEOUT_MS / 1000.0);
  /* every later call fails the same way, at once */
  CHECK_RC(tide_barrier(comm), TIDE_EPEER);
  free(buf);
  tide_comm_destroy(comm);
  return 0;
}

static int check_killed(int tcp) {
  harness_opts_t opts = {3, NULL, tcp, 60, NULL};
  harness_run(&opts, killed_peer, NULL);
  CHECK(WIFSIGNALED(harness_status[1]) && WTERMSIG(harness_status[1]) == SIGKILL);
  CHECK(WIFEXITED(harness_status[0]) && WEXITSTATUS(harness_status[0]) == 0);
  CHECK(WIFEXITED(harness_status[2]) && WEXITSTATUS(harness_status[2]) == 0);
  return 0;
}

/* Correct collectives after errors give correct results. */
static int check_usable(tide_comm_t *comm, int rank, int size) {
  float buf[16];
  for (int i = 0; i < 16; i++) buf[i] = (float)(rank + i);
  CHECK_OK(tide_allreduce(comm, buf, buf, 16, TIDE_F32, TIDE_SUM));
  for (int i = 0; i < 16; i++) CHECK(buf[i] == (float)(size * (size - 1) / 2 + size * i));
  int32_t mine = 7 * rank, all[8];
  CHECK_OK(tide_allgather(comm, &mine, all, 1, TIDE_I32));
  for (int r = 0; r < size; r++) CHECK(all[r] == 7 * r);
  int32_t word = rank == 1 ? 42 : -1;
  CHECK_OK(tide_broadcast(comm, &word, 1, TIDE_I32, 1));
  CHECK(word == 42);
  return 0;
}

/* Rank 2 calls with another count, then (second round) another op kind,
 * (third) another dtype: every rank gets TIDE_EMISMATCH naming both calls,
 * 100 times in a row, and the communicator stays usable. */
static int mismatched(int rank, int size, void *arg) {
  int variant = *(int *)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float buf[16] = {0};
  CHECK_OK(tide_allreduce(comm, buf, buf, 16, TIDE_F32, TIDE_SUM)); /* a matched one first */
  for (int round = 0; round < 100; round++) {
    int rc;
    if (variant == 0)
      rc = tide_allreduce(comm, buf, buf, rank == 2 ? 12 : 10, TIDE_F32, TIDE_SUM);
    else if (variant == 1)
      rc = rank == 2 ? tide_broadcast(comm, buf, 10, TIDE_F32, 0) : tide_allreduce(comm, buf, buf, 10, TIDE_F32, TIDE_SUM);
    else
      rc = tide_allreduce(comm, buf, buf, 10, rank == 0 ? TIDE_I32 : TIDE_F32, TIDE_SUM);
    const char *msg = tide_comm_last_error(comm);
    if (round == 0) fprintf(stderr, "rank %d: %s: %s\n", rank, tide_err_name(rc), msg);
    CHECK_RC(rc, TIDE_EMISMATCH);
    char nth[40];
    snprintf(nth, sizeof nth, "collective #%d ", round + 2);
    CHECK(strstr(msg, nth) != NULL);
    if (variant == 0) CHECK(strstr(msg, "count=12") != NULL && strstr(msg, "count=10") != NULL);
    if (variant == 1) CHECK(strstr(msg, "broadcast(") != NULL && strstr(msg, "allreduce(") != NULL);
    if (variant == 2) CHECK(strstr(msg, "i32") != NULL && strstr(msg, "f32") != NULL);
  }
  CHECK_OK(check_usable(comm, rank, size));
  tide_comm_destroy(comm);
  return 0;
}

/* Rank 0 passes NULL: it alone gets TIDE_EINVAL at once (nothing is sent).
 * Its next call meets the others' pending one: a mismatch on every rank
 * (#3 against #2), after which all agree again. Then an argument error on
 * every rank (an unknown reduction op), 100 times: the communicator stays usable. */
static int invalid_arg(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float buf[4] = {0};
  CHECK_OK(tide_allreduce(comm, buf, buf, 4, TIDE_F32, TIDE_SUM));
  int rc = tide_allreduce(comm, buf, rank == 0 ? NULL : buf, 4, TIDE_F32, TIDE_SUM);
  fprintf(stderr, "rank %d: %s: %s\n", rank, tide_err_name(rc), tide_comm_last_error(comm));
  if (rank == 0) {
    CHECK_RC(rc, TIDE_EINVAL);
    CHECK(strstr(tide_comm_last_error(comm), "rank 0 called allreduce with a NULL recvbuf") != NULL);
    rc = tide_allreduce(comm, buf, buf, 4, TIDE_F32, TIDE_SUM);
  }
  CHECK_RC(rc, TIDE_EMISMATCH);
  CHECK(strstr(tide_comm_last_error(comm), "#2") != NULL && strstr(tide_comm_last_error(comm), "#3") != NULL);
  CHECK_OK(check_usable(comm, rank, size));
  uint16_t half[4] = {0};
  for (int round = 0; round < 100; round++) {
    CHECK_RC(tide_allreduce(comm, half, half, 4, TIDE_F16, TIDE_OP_COUNT), TIDE_EINVAL);
    CHECK(strstr(tide_comm_last_error(comm), "allreduce with an unknown reduction op") != NULL);
  }
  CHECK_OK(check_usable(comm, rank, size));
  tide_comm_destroy(comm);
  return 0;
}

/* Rank 1 destroys the communicator while rank 0 still calls allreduce. */
static int left_early(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float buf[4] = {0};
  CHECK_OK(tide_allreduce(comm, buf, buf, 4, TIDE_F32, TIDE_SUM));
  if (rank == 1) {
    tide_comm_destroy(comm);
    return 0;
  }
  double start = now_s();
  int rc = tide_allreduce(comm, buf, buf, 4, TIDE_F32, TIDE_SUM);
  fprintf(stderr, "rank %d: %s after %.3f s: %s\n", rank, tide_err_name(rc), now_s() - start,
          tide_comm_last_error(comm));
  CHECK_RC(rc, TIDE_EPEER);
  CHECK(now_s() - start < TIMEOUT_MS / 1000.0);
  tide_comm_destroy(comm);
  return 0;
}

/* A rank with the wrong token is refused by the store and cannot join. */
static int wrong_token(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  if (rank == 1) setenv("TIDE_JOB_TOKEN", "not-the-job-token", 1);
  setenv("TIDE_TIMEOUT_MS", "2000", 1);
  tide_comm_t *comm = NULL;
  int rc = tide_comm_init(&comm);
  fprintf(stderr, "rank %d: init %s\n", rank, tide_err_name(rc));
  CHECK(rc != 0 && comm == NULL);
  if (rank == 1) CHECK_RC(rc, TIDE_EAUTH);
  return 0;
}

typedef struct {
  int fd;
  const char *token;
  int rc;
} side_t;

static void *server_side(void *arg) {
  side_t *s = arg;
  s->rc = tide__auth_handshake(s->fd, s->token, 1, tide__deadline_after_ms(5000));
  return NULL;
}

/* The handshake itself: matching tokens pass, different ones fail on both
 * sides, and a peer that sends garbage is refused. */
static void handshake(void) {
  const char *pairs[][2] = {{"secret", "secret"}, {"secret", "guess"}};
  for (int i = 0; i < 2; i++) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    side_t server = {sv[0], pairs[i][0], 1};
    pthread_t t;
    pthread_create(&t, NULL, server_side, &server);
    int rc = tide__auth_handshake(sv[1], pairs[i][1], 0, tide__deadline_after_ms(5000));
    close(sv[1]);
    pthread_join(t, NULL);
    close(sv[0]);
    CHECK_RC(rc, i == 0 ? 0 : TIDE_EAUTH);
    CHECK_RC(server.rc, i == 0 ? 0 : TIDE_EAUTH);
  }
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  side_t server = {sv[0], "secret", 1};
  pthread_t t;
  pthread_create(&t, NULL, server_side, &server);
  char garbage[128];
  memset(garbage, 'x', sizeof garbage);
  CHECK(write(sv[1], garbage, sizeof garbage) == sizeof garbage);
  pthread_join(t, NULL);
  CHECK_RC(server.rc, TIDE_EAUTH);
  close(sv[0]);
  close(sv[1]);
}

int main(void) {
  char timeout[32];
  snprintf(timeout, sizeof timeout, "%d", TIMEOUT_MS);
  setenv("TIDE_TIMEOUT_MS", timeout, 1);
  setenv("TIDE_LOG_LEVEL", "error", 1);
  handshake();
  fprintf(stderr, "-- killed peer, shared memory\n");
  check_killed(0);
  fprintf(stderr, "-- killed peer, tcp\n");
  check_killed(1);
  for (int variant = 0; variant < 3; variant++) {
    for (int tcp = 0; tcp <= 1; tcp++) {
      fprintf(stderr, "-- mismatch %d %s\n", variant, tcp ? "tcp" : "shm");
      harness_opts_t opts = {3, NULL, tcp, 60, NULL};
      CHECK(harness_run(&opts, mismatched, &variant) == 0);
    }
  }
  for (int tcp = 0; tcp <= 1; tcp++) {
    fprintf(stderr, "-- invalid argument %s\n", tcp ? "tcp" : "shm");
    harness_opts_t opts = {3, NULL, tcp, 60, NULL};
    CHECK(harness_run(&opts, invalid_arg, NULL) == 0);
  }
  fprintf(stderr, "-- rank leaves early\n");
  harness_opts_t two = {2, NULL, 0, 60, NULL};
  CHECK(harness_run(&two, left_early, NULL) == 0);
  fprintf(stderr, "-- wrong token\n");
  CHECK(harness_run(&two, wrong_token, NULL) == 0);
  return 0;
}
