/* tide over MPI, under a real mpirun: np = 1..4 through the collective suite
 * with MPI's own collectives (TIDE_ALGO=auto and mpi, the latter also under
 * MPI_THREAD_SERIALIZED) and with tide's algorithms over the MPI transport
 * (ring, rd, hier on emulated hosts, messages of many pieces); mismatches,
 * invalid arguments and timeouts fail every rank the same way as under
 * tiderun; tide_comm_init_from_mpi on a communicator the program split
 * itself, with split/local/cross, and TIDE_BACKEND=mpi with MPI started by
 * the program (tide must then leave MPI running).
 *
 * Without arguments this is the driver: it runs itself under
 * TIDE_TEST_MPIRUN (default Open MPI's `mpirun --oversubscribe`; MPICH's
 * run comes from test/mpi_suite.sh). With `--rank SCENARIO [ARG]` it is one
 * rank. Exit 77 (skipped) when tide was built without MPI or mpirun is
 * missing. */
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_suite.h"
#include "harness.h"

#ifdef TIDE_HAVE_MPI
#include <mpi.h>

/* The launcher's rank and size, before anything initialises MPI. */
static int launcher_env(const char *var_ompi, const char *var_pmi) {
  const char *v = getenv(var_ompi);
  if (v == NULL) v = getenv(var_pmi);
  return v ? atoi(v) : -1;
}

/* Messages of many transport pieces (4 MiB each, 4 in flight): allreduce in
 * place and not, and reduce-scatter in place, f32 sums of small integers
 * (exact). */
static void big_messages(tide_comm_t *comm) {
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  size_t count = ((size_t)9 << 20) + 7;
  float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
  CHECK(send && recv);
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < count; i++) send[i] = (float)((i + (size_t)rank) % 5);
    size_t off = 0, len = count;
    if (round == 0) CHECK_OK(tide_allreduce(comm, send, recv, count, TIDE_F32, TIDE_SUM));
    if (round == 1) CHECK_OK(tide_allreduce(comm, send, send, count, TIDE_F32, TIDE_SUM));
    if (round == 2) {
      CHECK_OK(tide_reduce_scatter(comm, send, send, count, TIDE_F32, TIDE_SUM));
      tide_block(count, size, rank, &off, &len);
    }
    const float *got = round == 0 ? recv : send;
    for (size_t i = 0; i < len; i++) {
      float want = 0;
      for (int r = 0; r < size; r++) want += (float)((off + i + (size_t)r) % 5);
      if (got[i] != want) {
        fprintf(stderr, "rank %d: big round %d: element %zu is %g, want %g\n", rank, round, off + i, got[i], want);
        exit(1);
      }
    }
  }
  free(send);
  free(recv);
}

/* TIDE_BACKEND=mpi: tide starts MPI, runs the suite, and finalizes MPI when
 * the communicator is destroyed. arg: the largest count ("0": all). */
static int scenario_suite(const char *arg) {
  int want_rank = launcher_env("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  int want_size = launcher_env("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  const char *hosts = getenv("TEST_HOSTS"); /* "aabb": emulated host of each rank */
  if (hosts != NULL && want_rank >= 0 && want_rank < (int)strlen(hosts)) {
    char id[2] = {hosts[want_rank], '\0'};
    setenv("TIDE_HOST_ID", id, 1);
  }
  int initialized = 1;
  MPI_Initialized(&initialized);
  CHECK(!initialized);
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  if (want_rank >= 0) CHECK(rank == want_rank && size == want_size);
  if (hosts == NULL) {
    CHECK(tide_comm_node_count(comm) == 1 && tide_comm_local_size(comm) == size);
    CHECK(tide_comm_local_rank(comm) == rank);
  } else {
    int nodes = 0;
    for (int r = 0; r < size; r++)
      if (strchr(hosts, hosts[r]) == hosts + r) nodes++;
    CHECK(tide_comm_node_count(comm) == nodes);
    int local = 0, local_rank = 0;
    for (int r = 0; r < size; r++)
      if (hosts[r] == hosts[rank]) local_rank += r < rank, local++;
    CHECK(tide_comm_local_size(comm) == local && tide_comm_local_rank(comm) == local_rank);
    /* the sub-communicators hierarchical allreduce uses */
    tide_comm_t *local_comm, *cross;
    CHECK_OK(tide_comm_local(comm, &local_comm));
    CHECK_OK(tide_comm_cross(comm, &cross));
    CHECK(tide_comm_size(local_comm) == local && tide_comm_rank(local_comm) == local_rank);
    int one = 1, sum = 0;
    CHECK_OK(tide_allreduce(cross, &one, &sum, 1, TIDE_I32, TIDE_SUM));
    CHECK(sum == tide_comm_size(cross));
  }
  coll_suite_run(comm, (size_t)atol(arg), -1);
  if (getenv("TEST_BIG") != NULL) big_messages(comm);
  tide_comm_destroy(comm);
  int finalized = 0;
  MPI_Finalized(&finalized);
  CHECK(finalized); /* tide started MPI, so tide finished it */
  if (rank == 0) printf("suite np=%d ok\n", size);
  return 0;
}

static tide_comm_t *world_comm(void) {
  MPI_Comm world = MPI_COMM_WORLD;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init_from_mpi(&world, &comm));
  return comm;
}

/* Starts MPI. TEST_SERIALIZED asks for less than MPI_THREAD_MULTIPLE, so
 * tide serialises its MPI calls (and TIDE_ALGO=mpi takes MPI's nonblocking
 * collectives). */
static void mpi_init(void) {
  int want = getenv("TEST_SERIALIZED") ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, provided;
  MPI_Init_thread(NULL, NULL, want, &provided);
  CHECK(provided >= want);
}

/* Mismatched calls, a bad argument and a timeout: the same code on every
 * rank, with a message that names the calls, as under tiderun. */
static int scenario_fault(const char *arg) {
  mpi_init();
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  float buf[16] = {0};
  if (strcmp(arg, "timeout") == 0) {
    tide_comm_t *comm = world_comm();
    CHECK_OK(tide_barrier(comm));
    if (rank == 1) sleep(3); /* longer than TIDE_TIMEOUT_MS: rank 0 gives up first */
    int rc = tide_barrier(comm);
    fprintf(stderr, "rank %d: %s: %s\n", rank, tide_err_name(rc), tide_comm_last_error(comm));
    CHECK_RC(rc, TIDE_ETIMEDOUT);
    CHECK(strstr(tide_comm_last_error(comm), "rank 0 timed out") != NULL);
    tide_comm_destroy(comm);
  } else {
    int last = size - 1;
    for (int variant = 0; variant < 4; variant++) {
      tide_comm_t *comm = world_comm();
      CHECK_OK(tide_allreduce(comm, buf, buf, 16, TIDE_F32, TIDE_SUM)); /* a matched one first */
      int rc, want = TIDE_EMISMATCH;
      if (variant == 0) {
        rc = tide_allreduce(comm, buf, buf, rank == last ? 12 : 10, TIDE_F32, TIDE_SUM);
      } else if (variant == 1) {
        rc = rank == last ? tide_broadcast(comm, buf, 10, TIDE_F32, 0)
                          : tide_allreduce(comm, buf, buf, 10, TIDE_F32, TIDE_SUM);
      } else if (variant == 2) {
        rc = tide_allreduce(comm, buf, buf, 10, rank == 0 ? TIDE_I32 : TIDE_F32, TIDE_SUM);
      } else {
        rc = tide_allreduce(comm, buf, rank == 0 ? NULL : buf, 4, TIDE_F32, TIDE_SUM);
        want = TIDE_EINVAL;
      }
      const char *msg = tide_comm_last_error(comm);
      fprintf(stderr, "rank %d variant %d: %s: %s\n", rank, variant, tide_err_name(rc), msg);
      if (variant == 3 && rank != 0) want = TIDE_EMISMATCH; /* rank 0's next call meets this one */
      CHECK_RC(rc, want);
      if (variant < 3) CHECK(strstr(msg, "collective #2") != NULL);
      if (variant == 0) CHECK(strstr(msg, "count=12") != NULL && strstr(msg, "count=10") != NULL);
      if (variant == 1) CHECK(strstr(msg, "broadcast(") != NULL && strstr(msg, "allreduce(") != NULL);
      if (variant == 2) CHECK(strstr(msg, "i32") != NULL && strstr(msg, "f32") != NULL);
      if (variant == 3 && rank == 0) {
        CHECK(strstr(msg, "rank 0 called allreduce with a NULL recvbuf") != NULL);
        CHECK_RC(tide_allreduce(comm, buf, buf, 4, TIDE_F32, TIDE_SUM), TIDE_EMISMATCH);
      }
      CHECK_OK(tide_allreduce(comm, buf, buf, 16, TIDE_F32, TIDE_SUM)); /* still usable */
      tide_comm_destroy(comm);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD); /* MPI itself is still fine */
  MPI_Finalize();
  if (rank == 0) printf("fault %s np=%d ok\n", arg, size);
  return 0;
}

/* The program owns MPI: tide joins a communicator it split, and
 * TIDE_BACKEND=mpi reuses the running MPI and leaves it running. */
static int scenario_user(const char *arg) {
  mpi_init();
  int wrank, wsize;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  tide_comm_t *comm = NULL;
  CHECK_RC(tide_comm_init_from_mpi(NULL, &comm), TIDE_EINVAL);
  MPI_Comm null_comm = MPI_COMM_NULL;
  CHECK_RC(tide_comm_init_from_mpi(&null_comm, &comm), TIDE_EINVAL);
  CHECK(comm == NULL);

  /* Odd and even world ranks, the odd ones in reverse order. */
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, wrank % 2, wrank % 2 ? -wrank : wrank, &half);
  int hrank, hsize;
  MPI_Comm_rank(half, &hrank);
  MPI_Comm_size(half, &hsize);
  CHECK_OK(tide_comm_init_from_mpi(&half, &comm));
  MPI_Comm_free(&half); /* tide holds its own duplicate */
  CHECK(tide_comm_rank(comm) == hrank && tide_comm_size(comm) == hsize);
  /* The user's traffic on the same ranks never meets tide's. */
  int token = wrank, got = -1;
  MPI_Request req;
  MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &req);
  coll_suite_run(comm, (size_t)atol(arg), -1);
  MPI_Send(&token, 1, MPI_INT, wrank, 1, MPI_COMM_WORLD);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  CHECK(got == wrank);
  /* split, as in test_launchers: key -rank reverses the order */
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  tide_comm_t *sub, *none;
  CHECK_OK(tide_comm_split(comm, rank % 2, -rank, &sub));
  int one = 1, count = 0;
  CHECK_OK(tide_allreduce(sub, &one, &count, 1, TIDE_I32, TIDE_SUM));
  CHECK(count == (size + 1 - rank % 2) / 2);
  CHECK(tide_comm_rank(sub) == count - 1 - rank / 2);
  CHECK_OK(tide_comm_split(comm, rank == 0 ? -1 : 0, 0, &none));
  CHECK((rank == 0) == (none == NULL));
  tide_comm_destroy(none);
  tide_comm_destroy(sub);
  tide_comm_t *local, *cross;
  CHECK_OK(tide_comm_local(comm, &local));
  CHECK_OK(tide_comm_cross(comm, &cross));
  CHECK(tide_comm_size(local) == size && tide_comm_size(cross) == 1);
  tide_comm_destroy(comm);

  /* TIDE_BACKEND=mpi (set by the driver): MPI_COMM_WORLD, MPI left running */
  tide_comm_t *world;
  CHECK_OK(tide_comm_init(&world));
  CHECK(tide_comm_rank(world) == wrank && tide_comm_size(world) == wsize);
  int64_t sum = 0, mine = wrank;
  CHECK_OK(tide_allreduce(world, &mine, &sum, 1, TIDE_I64, TIDE_SUM));
  CHECK(sum == (int64_t)wsize * (wsize - 1) / 2);
  tide_comm_destroy(world);
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(!finalized);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  if (wrank == 0) printf("user np=%d ok\n", wsize);
  return 0;
}

/* ---- driver --------------------------------------------------------------- */

static char self[1024];
static const char *mpirun;
static int failures;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs `ENV mpirun -np NP self --rank SCENARIO ARG`; ENV is shell words. */
static void run(const char *env, int np, const char *scenario, const char *arg) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s timeout -k 5 120 %s -np %d %s --rank %s %s", env, mpirun, np, self, scenario, arg);
  fprintf(stderr, "-- %s\n", cmd);
  fflush(stderr);
  double start = now_s();
  int status = system(cmd);
  int ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  fprintf(stderr, "   %s in %.1f s\n", ok ? "ok" : "FAILED", now_s() - start);
  if (!ok) failures++;
}

static int driver(void) {
  mpirun = getenv("TIDE_TEST_MPIRUN");
  if (mpirun == NULL || mpirun[0] == '\0') {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
      fprintf(stderr, "mpirun not found: skipped\n");
      return 77;
    }
    mpirun = "mpirun --oversubscribe";
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  CHECK(n > 0);
  self[n] = '\0';
  /* Open MPI's own allocations are reported as leaks under ASan. */
  setenv("ASAN_OPTIONS", "detect_leaks=0", 0);
  setenv("TIDE_TIMEOUT_MS", "60000", 1);
  unsetenv("TIDE_RANK");
  unsetenv("TIDE_SIZE");
  unsetenv("TIDE_RDZV");
  unsetenv("TIDE_HOST_ID");
  unsetenv("TIDE_ALGO");
  const char *max = getenv("TEST_MPI_MAX_COUNT"); /* the MPICH run trims the suite */
  char full[32], small[32];
  snprintf(full, sizeof full, "%s", max ? max : "0");
  snprintf(small, sizeof small, "%s", max ? max : "20000");
  /* MPICH's run (test/mpi_suite.sh) leaves out the variants that exercise
   * nothing MPI-specific beyond the others: its busy polling makes 3-4 ranks
   * on 2 cores slow. */
  int quick = getenv("TEST_MPI_QUICK") != NULL;
  for (int np = 1; np <= 4; np++) {
    run(np == 2 ? "TIDE_BACKEND=mpi TIDE_ALGO=auto TEST_BIG=1" : "TIDE_BACKEND=mpi TIDE_ALGO=auto", np, "suite", full);
    if (np == 1) continue;
    run(np <= 3 ? "TIDE_BACKEND=mpi TIDE_ALGO=ring TEST_BIG=1" : "TIDE_BACKEND=mpi TIDE_ALGO=ring", np, "suite", small);
    if (!quick || np == 2) run("TIDE_BACKEND=mpi TIDE_ALGO=rd", np, "suite", small);
  }
  run("TIDE_BACKEND=mpi TIDE_ALGO=hier TEST_HOSTS=aabb", 4, "suite", small);
  if (!quick) run("TIDE_BACKEND=mpi TIDE_ALGO=auto TEST_HOSTS=abab", 4, "suite", small);
  if (!quick) run("TIDE_BACKEND=mpi TIDE_ALGO=hier TEST_HOSTS=aba", 3, "suite", small);
  run(quick ? "TIDE_BACKEND=mpi TIDE_ALGO=mpi" : "TIDE_BACKEND=mpi TIDE_ALGO=mpi TEST_BIG=1", 3, "suite", small);
  run("TIDE_ALGO=auto", 3, "fault", "mismatch");
  if (!quick) run("TIDE_ALGO=ring", 3, "fault", "mismatch");
  if (!quick) run("TIDE_ALGO=auto", 2, "fault", "mismatch");
  run("TIDE_ALGO=mpi TEST_SERIALIZED=1", 3, "fault", "mismatch");
  run("TIDE_TIMEOUT_MS=1500", 2, "fault", "timeout");
  run("TIDE_BACKEND=mpi", 4, "user", small);
  run("TIDE_BACKEND=mpi TIDE_ALGO=mpi TEST_SERIALIZED=1", 3, "user", small);
  if (failures) fprintf(stderr, "%d mpirun run(s) FAILED\n", failures);
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "--rank") == 0) {
    const char *arg = argc >= 4 ? argv[3] : "0";
    if (strcmp(argv[2], "suite") == 0) return scenario_suite(arg);
    if (strcmp(argv[2], "fault") == 0) return scenario_fault(arg);
    if (strcmp(argv[2], "user") == 0) return scenario_user(arg);
    fprintf(stderr, "unknown scenario %s\n", argv[2]);
    return 2;
  }
  return driver();
}

#else /* tide built without MPI */

int main(void) {
  /* The API is there and says why it cannot work. (Parameters are read
   * once, at the first call that logs: set them first.) */
  setenv("TIDE_BACKEND", "mpi", 1);
  int fake = 0;
  tide_comm_t *comm = NULL;
  CHECK_RC(tide_comm_init_from_mpi(&fake, &comm), TIDE_ENOSYS);
  CHECK_RC(tide_comm_init(&comm), TIDE_ENOSYS);
  CHECK(comm == NULL);
  fprintf(stderr, "tide was built without MPI: skipped\n");
  return 77;
}

#endif
