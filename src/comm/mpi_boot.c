/* The MPI backend of the communicator: join from an MPI communicator (or
 * MPI_COMM_WORLD under TIDE_BACKEND=mpi), learn the hosts from
 * MPI_Comm_split_type, open one MPI channel per peer on a private duplicate,
 * split with MPI_Comm_split, and broadcast failures the way the store does
 * for TCP jobs: every communicator keeps a receive posted on a control tag
 * from any rank; a rank that fails sends "code|collective#|message" to every
 * other rank there, and every wait loop tests that receive.
 *
 * Threads: MPI calls are made by whichever thread executes on the
 * communicator (the caller, or its progress thread for nonblocking calls).
 * Under less than MPI_THREAD_MULTIPLE tide serialises its own MPI calls
 * (tide__mpi_lock); the application must then not call MPI concurrently
 * with tide. A dead process is MPI's business: mpirun aborts the job. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"

#ifdef TIDE_HAVE_MPI
#include "comm/mpi.h"

#define REPORT_BYTES 1024
#define ZOMBIES 8

typedef struct {
  MPI_Request req;
  void *arrays; /* counts/displacements the request still reads */
} zombie_t;

struct tide__mpi_comm {
  MPI_Comm comm; /* our duplicate; every channel and tag lives on it */
  MPI_Request ctrl_req;
  char ctrl_buf[REPORT_BYTES];
  MPI_Request *report_reqs; /* our own report, one send per peer */
  char report[REPORT_BYTES];
  uint8_t sync_out, sync_in[64];
  zombie_t zombies[ZOMBIES]; /* collectives abandoned on failure */
  int nzombies;
  int lent; /* a request MPI could not give back still points into this struct */
};

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int started_mpi;       /* tide called MPI_Init_thread (init_lock) */
static _Atomic int open_comms; /* MPI communicators alive in this process */
static _Atomic int generation;

static int mpi_error(const char *what, int err) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(err, text, &len);
  TIDE_ERROR("%s failed: %s", what, text);
  return TIDE_EIO;
}

#define MPI_CHECK_GOTO(call, rc, label)    \
  do {                                     \
    tide__mpi_lock();                      \
    int mpi_err_ = (call);                 \
    tide__mpi_unlock();                    \
    if (mpi_err_ != MPI_SUCCESS) {         \
      (rc) = mpi_error(#call, mpi_err_);   \
      goto label;                          \
    }                                      \
  } while (0)

static void post_ctrl(tide__mpi_comm_t *m) {
  int err = MPI_Irecv(m->ctrl_buf, REPORT_BYTES - 1, MPI_CHAR, MPI_ANY_SOURCE, TIDE__MPI_TAG_CTRL, m->comm,
                      &m->ctrl_req);
  if (err != MPI_SUCCESS) {
    mpi_error("MPI_Irecv (failure reports)", err);
    m->ctrl_req = MPI_REQUEST_NULL;
  }
}

/* MPI_Testall, request by request (MPICH's MPI_STATUSES_IGNORE trips
 * GCC's access checks). */
static int test_all(MPI_Request *reqs, int n, int *done) {
  *done = 1;
  for (int i = 0; i < n; i++) {
    int flag = 1;
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    int err = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) return err;
    if (!flag) *done = 0;
  }
  return MPI_SUCCESS;
}

/* Tests reqs for up to ms milliseconds; frees what is still pending (its
 * buffers must then outlive it) and returns 0 if anything was. Caller holds
 * the MPI lock. */
static int settle(MPI_Request *reqs, int n, int ms) {
  int64_t deadline = tide__deadline_after_ms(ms);
  int done = 0;
  while (test_all(reqs, n, &done) == MPI_SUCCESS && !done && tide__ms_left(deadline) > 0)
    sched_yield();
  if (!done) {
    TIDE_DEBUG("%d MPI request(s) did not finish in %d ms; released to MPI", n, ms);
    for (int i = 0; i < n; i++)
      if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
  }
  return done;
}

/* ---- topology ------------------------------------------------------------ */

/* Hosts: the ranks MPI_COMM_TYPE_SHARED puts together, named by their lowest
 * rank (or TIDE_HOST_ID when set, to emulate hosts), grouped as the TCP path
 * groups them (tide__comm_set_hosts). */
static int topology(tide_comm_t *comm) {
  tide__mpi_comm_t *m = comm->mpi;
  int rc = 0, n = comm->size;
  char mine[24], (*names)[24] = tide__calloc((size_t)n, sizeof *names);
  const char **host_of = tide__calloc((size_t)n, sizeof *host_of);
  if (names == NULL || host_of == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  const char *forced = tide__param_str(TIDE__PARAM_HOST_ID);
  if (forced[0] != '\0') {
    snprintf(mine, sizeof mine, "h%016llx", (unsigned long long)tide__fnv1a_str(forced));
  } else {
    MPI_Comm shared = MPI_COMM_NULL;
    int leader = comm->rank;
    MPI_CHECK_GOTO(MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared), rc, out);
    tide__mpi_lock();
    int err = MPI_Allreduce(&comm->rank, &leader, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
    tide__mpi_unlock();
    if (err != MPI_SUCCESS) {
      rc = mpi_error("MPI_Allreduce (host leaders)", err);
      goto out;
    }
    snprintf(mine, sizeof mine, "r%d", leader);
  }
  MPI_CHECK_GOTO(MPI_Allgather(mine, sizeof mine, MPI_CHAR, names, sizeof mine, MPI_CHAR, m->comm), rc, out);
  for (int r = 0; r < n; r++) {
    names[r][sizeof mine - 1] = '\0';
    host_of[r] = names[r];
  }
  rc = tide__comm_set_hosts(comm, host_of, NULL);
out:
  tide__free(names);
  tide__free(host_of);
  return rc;
}

/* Takes ownership of dup (a duplicate or split of the user's communicator)
 * and makes comm a member of it: topology, channels, the failure-report
 * receive. Collective over dup. */
static int setup(tide_comm_t *comm, MPI_Comm dup) {
  tide__mpi_comm_t *m = tide__calloc(1, sizeof *m);
  if (m == NULL) {
    tide__mpi_lock();
    MPI_Comm_free(&dup);
    tide__mpi_unlock();
    return TIDE_ENOMEM;
  }
  m->comm = dup;
  m->ctrl_req = MPI_REQUEST_NULL;
  comm->mpi = m;
  atomic_fetch_add(&open_comms, 1);
  int rc = 0;
  MPI_CHECK_GOTO(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), rc, out);
  MPI_CHECK_GOTO(MPI_Comm_rank(dup, &comm->rank), rc, out);
  MPI_CHECK_GOTO(MPI_Comm_size(dup, &comm->size), rc, out);
  TIDE_CHECK_GOTO(topology(comm), rc, out);
  comm->chans = tide__calloc((size_t)comm->size, sizeof *comm->chans);
  if (comm->chans == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int r = 0; r < comm->size; r++) {
    comm->chans[r].fd = -1;
    if (r == comm->rank) continue;
    tide__link_t link = {comm->node_of[r] == comm->node, &m->comm};
    tide__endpoint_t ep = {-1, &m->comm};
    TIDE_CHECK_GOTO(tide__transport_pick(&link)->connect(&comm->chans[r], r, &ep), rc, out);
  }
  comm->spin_us = tide__wait_spin_us();
  tide__mpi_lock();
  post_ctrl(m);
  tide__mpi_unlock();
  if (m->ctrl_req == MPI_REQUEST_NULL) rc = TIDE_EIO;
  TIDE_DEBUG("communicator %s over MPI: rank %d of %d, node %d of %d, local rank %d of %d", comm->ns, comm->rank,
             comm->size, comm->node, comm->node_count, comm->local_rank, comm->local_size);
out:
  return rc;
}

/* ---- joining -------------------------------------------------------------- */

int tide_comm_init_from_mpi(const void *mpi_comm, tide_comm_t **out) {
  if (mpi_comm == NULL || out == NULL) {
    TIDE_ERROR("tide_comm_init_from_mpi: %s is NULL", mpi_comm == NULL ? "mpi_comm" : "out");
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide_params_load());
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    TIDE_ERROR("tide_comm_init_from_mpi: MPI is %s; call MPI_Init_thread (MPI_THREAD_MULTIPLE) first",
               finalized ? "already finalized" : "not initialised");
    return TIDE_ESTATE;
  }
  MPI_Comm user = *(const MPI_Comm *)mpi_comm;
  if (user == MPI_COMM_NULL) {
    TIDE_ERROR("tide_comm_init_from_mpi: the communicator is MPI_COMM_NULL");
    return TIDE_EINVAL;
  }
  int provided = MPI_THREAD_SINGLE, world_rank = 0;
  MPI_Query_thread(&provided);
  tide__mpi_set_multiple(provided == MPI_THREAD_MULTIPLE);
  if (provided < MPI_THREAD_SERIALIZED) {
    static _Atomic int warned;
    if (atomic_exchange(&warned, 1) == 0)
      TIDE_WARN("MPI was initialised with thread level %s: tide serialises its own MPI calls, but its "
                "nonblocking collectives call MPI from tide's progress thread; initialise MPI with "
                "MPI_Init_thread(MPI_THREAD_MULTIPLE) (or at least SERIALIZED)",
                provided == MPI_THREAD_SINGLE ? "SINGLE" : "FUNNELED");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  tide__log_set_rank(world_rank);
  MPI_Comm dup = MPI_COMM_NULL;
  int rc = 0;
  tide_comm_t *comm = NULL;
  MPI_CHECK_GOTO(MPI_Comm_dup(user, &dup), rc, fail);
  comm = tide__comm_alloc();
  if (comm == NULL) {
    tide__mpi_lock();
    MPI_Comm_free(&dup);
    tide__mpi_unlock();
    return TIDE_ENOMEM;
  }
  snprintf(comm->ns, sizeof comm->ns, "m%d", atomic_fetch_add(&generation, 1));
  TIDE_CHECK_GOTO(setup(comm, dup), rc, fail);
  *out = comm;
  return 0;
fail:
  TIDE_ERROR("rank %d could not join through MPI: %s", world_rank, tide_strerror(rc));
  tide_comm_destroy(comm);
  return rc;
}

int tide__mpi_comm_init(tide_comm_t **out) {
  int initialized = 0, finalized = 0;
  pthread_mutex_lock(&init_lock);
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rc = 0;
  if (finalized) {
    TIDE_ERROR("TIDE_BACKEND=mpi: MPI is already finalized (tide finalizes the MPI it started when its "
               "last communicator is destroyed; keep one communicator for the life of the process)");
    rc = TIDE_ESTATE;
  } else if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (err != MPI_SUCCESS) {
      rc = mpi_error("MPI_Init_thread", err);
    } else {
      started_mpi = 1;
      if (provided < MPI_THREAD_MULTIPLE)
        TIDE_INFO("MPI provides thread level %d, not MPI_THREAD_MULTIPLE: tide serialises its MPI calls",
                  provided);
    }
  }
  pthread_mutex_unlock(&init_lock);
  if (rc != 0) return rc;
  MPI_Comm world = MPI_COMM_WORLD;
  return tide_comm_init_from_mpi(&world, out);
}

/* ---- waiting -------------------------------------------------------------- */

void tide__mpi_comm_poll(tide_comm_t *comm) {
  tide__mpi_comm_t *m = comm->mpi;
  while (m->ctrl_req != MPI_REQUEST_NULL) {
    int done = 0, len = 0;
    MPI_Status status;
    tide__mpi_lock();
    int err = MPI_Test(&m->ctrl_req, &done, &status);
    if (err == MPI_SUCCESS && done) MPI_Get_count(&status, MPI_CHAR, &len);
    tide__mpi_unlock();
    if (err != MPI_SUCCESS || !done) return;
    m->ctrl_buf[len > 0 && len < REPORT_BYTES ? len : 0] = '\0';
    TIDE_DEBUG("failure report from rank %d: %s", status.MPI_SOURCE, m->ctrl_buf);
    tide__comm_apply_report(comm, m->ctrl_buf);
    tide__mpi_lock();
    post_ctrl(m);
    tide__mpi_unlock();
  }
}

void tide__mpi_comm_report(tide_comm_t *comm, const char *value, size_t len) {
  tide__mpi_comm_t *m = comm->mpi;
  if (m->report_reqs != NULL || comm->size == 1) return;
  m->report_reqs = tide__calloc((size_t)comm->size, sizeof *m->report_reqs);
  if (m->report_reqs == NULL) return;
  if (len >= REPORT_BYTES) len = REPORT_BYTES - 1;
  memcpy(m->report, value, len);
  tide__mpi_lock();
  for (int r = 0; r < comm->size; r++) {
    m->report_reqs[r] = MPI_REQUEST_NULL;
    if (r != comm->rank)
      MPI_Isend(m->report, (int)len, MPI_CHAR, r, TIDE__MPI_TAG_CTRL, m->comm, &m->report_reqs[r]);
  }
  /* Small sends complete at once (eager); give them a moment, no more. */
  int64_t deadline = tide__deadline_after_ms(100);
  int done = 0;
  while (test_all(m->report_reqs, comm->size, &done) == MPI_SUCCESS && !done &&
         tide__ms_left(deadline) > 0) {
    tide__mpi_unlock();
    sched_yield();
    tide__mpi_lock();
  }
  tide__mpi_unlock();
}

/* Cancels requests on m's buffers and gives them a moment; what will not
 * finish keeps m allocated past destroy. */
static void abandon(tide__mpi_comm_t *m, MPI_Request *reqs, int n) {
  tide__mpi_lock();
  for (int i = 0; i < n; i++) {
    int done = 0;
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Cancel(&reqs[i]);
  }
  m->lent |= !settle(reqs, n, 100);
  tide__mpi_unlock();
}

MPI_Comm tide__mpi_comm_handle(const tide_comm_t *comm) { return comm->mpi->comm; }

int tide__mpi_comm_fail_mpi(tide_comm_t *comm, int err, const char *what) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(err, text, &len);
  return tide__comm_fail(comm, TIDE_EIO, 0, "rank %d: MPI failed in %s: %s", comm->rank, what, text);
}

void tide__mpi_comm_keep(tide_comm_t *comm, MPI_Request req, void *arrays) {
  tide__mpi_comm_t *m = comm->mpi;
  if (m->nzombies < ZOMBIES) {
    m->zombies[m->nzombies].req = req;
    m->zombies[m->nzombies++].arrays = arrays;
  } else {
    m->lent = 1; /* more than we track: keep m (and the arrays) for good */
  }
}

int tide__mpi_comm_wait(tide_comm_t *comm, MPI_Request *reqs, int n, const char *what) {
  int64_t deadline = tide__deadline_after_ms(comm->timeout_ms);
  int64_t idle_since = 0;
  int idle = 0;
  for (;;) {
    tide__mpi_comm_poll(comm);
    int rc = tide__comm_check(comm, comm->seq);
    if (rc) return rc;
    int done = 0;
    tide__mpi_lock();
    int err = test_all(reqs, n, &done);
    tide__mpi_unlock();
    if (err != MPI_SUCCESS) return tide__mpi_comm_fail_mpi(comm, err, what);
    if (done) return 0;
    int left = tide__ms_left(deadline);
    if (left == 0)
      return tide__comm_fail(comm, TIDE_ETIMEDOUT, 0,
                             "rank %d timed out after %lld ms in %s (a rank is stuck or did not make this "
                             "call; raise TIDE_TIMEOUT_MS if it is just slow)",
                             comm->rank, (long long)comm->timeout_ms, what);
    if (idle++ == 0) idle_since = tide__now_ns();
    if (idle < 128) continue;
    if (tide__now_ns() - idle_since < comm->spin_us * 1000) {
      sched_yield();
      continue;
    }
    tide__comm_idle(idle_since, left);
  }
}

int tide__mpi_comm_agree(tide_comm_t *comm, int tag, const char *what) {
  tide__mpi_comm_t *m = comm->mpi;
  int n = comm->size, round = 0;
  m->sync_out = 1;
  for (int k = 1; k < n; k <<= 1, round++) {
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    tide__mpi_lock();
    int err = MPI_Irecv(&m->sync_in[round], 1, MPI_BYTE, (comm->rank - k + n) % n, tag, m->comm, &reqs[0]);
    if (err == MPI_SUCCESS) err = MPI_Isend(&m->sync_out, 1, MPI_BYTE, (comm->rank + k) % n, tag, m->comm, &reqs[1]);
    tide__mpi_unlock();
    int rc = err == MPI_SUCCESS ? tide__mpi_comm_wait(comm, reqs, 2, what)
                                : tide__mpi_comm_fail_mpi(comm, err, what);
    if (rc != 0) {
      abandon(m, reqs, 2);
      return rc;
    }
  }
  return 0;
}

/* ---- split and destroy ----------------------------------------------------- */

int tide__mpi_comm_split(tide_comm_t *comm, int color, int key, tide_comm_t **out) {
  int split = ++comm->splits;
  /* MPI_Comm_split has no deadline: enter it only once every rank is here. */
  TIDE_CHECK(tide__mpi_comm_agree(comm, TIDE__MPI_TAG_SPLIT, "tide_comm_split"));
  MPI_Comm sub_comm = MPI_COMM_NULL;
  int rc = 0;
  MPI_CHECK_GOTO(MPI_Comm_split(comm->mpi->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub_comm), rc, fail);
  if (color < 0) {
    *out = NULL;
    return 0;
  }
  tide_comm_t *sub = tide__comm_alloc();
  if (sub == NULL) {
    tide__mpi_lock();
    MPI_Comm_free(&sub_comm);
    tide__mpi_unlock();
    return TIDE_ENOMEM;
  }
  snprintf(sub->ns, sizeof sub->ns, "%.100s.s%dc%d", comm->ns, split, color);
  rc = setup(sub, sub_comm);
  if (rc != 0) {
    tide_comm_destroy(sub);
    return rc;
  }
  *out = sub;
  return 0;
fail:
  return tide__comm_fail(comm, rc, 0, "rank %d: MPI_Comm_split failed in tide_comm_split", comm->rank);
}

void tide__mpi_comm_fini(tide_comm_t *comm) {
  tide__mpi_comm_t *m = comm->mpi;
  comm->mpi = NULL;
  int finalized = 0, in_use = m->lent; /* MPI may still write into m */
  MPI_Finalized(&finalized);
  if (!finalized) {
    tide__mpi_lock();
    if (m->ctrl_req != MPI_REQUEST_NULL) {
      MPI_Cancel(&m->ctrl_req);
      in_use |= !settle(&m->ctrl_req, 1, 100);
    }
    if (m->report_reqs != NULL) in_use |= !settle(m->report_reqs, comm->size, 100);
    /* A collective request may be neither cancelled nor freed: test it a
     * moment; if it still runs, its arrays stay allocated. */
    for (int i = 0; i < m->nzombies; i++) {
      int64_t deadline = tide__deadline_after_ms(20);
      int done = 0;
      while (MPI_Test(&m->zombies[i].req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             tide__ms_left(deadline) > 0)
        sched_yield();
      if (done) tide__free(m->zombies[i].arrays);
    }
    /* A failed communicator may leave messages unreceived (a report, data
     * a failed peer never took). Freeing it would let MPI hand its context
     * id to the next communicator, where those messages would match: keep
     * it allocated instead (failures end a communicator's life, and are
     * rare). */
    if (m->comm != MPI_COMM_NULL && atomic_load(&comm->failed) == 0) MPI_Comm_free(&m->comm);
    tide__mpi_unlock();
  }
  if (!in_use) {
    tide__free(m->report_reqs);
    tide__free(m);
  }
  if (atomic_fetch_sub(&open_comms, 1) == 1) {
    pthread_mutex_lock(&init_lock);
    if (started_mpi && !finalized) {
      MPI_Finalize();
      started_mpi = 0;
    }
    pthread_mutex_unlock(&init_lock);
  }
}

int tide_mpi_built(void) { return 1; }

#else /* built without MPI */

int tide_mpi_built(void) { return 0; }

int tide_comm_init_from_mpi(const void *mpi_comm, tide_comm_t **out) {
  (void)mpi_comm;
  (void)out;
  TIDE_ERROR("tide_comm_init_from_mpi: this tide was built without MPI (configure with -DTIDE_WITH_MPI=ON "
             "and an MPI installed)");
  return TIDE_ENOSYS;
}

int tide__mpi_comm_init(tide_comm_t **out) {
  (void)out;
  TIDE_ERROR("TIDE_BACKEND=mpi, but this tide was built without MPI (configure with -DTIDE_WITH_MPI=ON and "
             "an MPI installed, or unset TIDE_BACKEND)");
  return TIDE_ENOSYS;
}

int tide__mpi_comm_split(tide_comm_t *comm, int color, int key, tide_comm_t **out) {
  (void)comm;
  (void)color;
  (void)key;
  (void)out;
  return TIDE_ENOSYS;
}

void tide__mpi_comm_report(tide_comm_t *comm, const char *value, size_t len) {
  (void)comm;
  (void)value;
  (void)len;
}

void tide__mpi_comm_poll(tide_comm_t *comm) { (void)comm; }

void tide__mpi_comm_fini(tide_comm_t *comm) { (void)comm; }

#endif
