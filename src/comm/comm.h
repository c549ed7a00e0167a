/* The communicator: members, where they are, the channels to them, the
 * failure state every wait checks, and the engine that drives
 * point-to-point operations with a deadline.
 *
 * Threads: one thread at a time executes on a communicator (exec_lock);
 * the watcher thread only sets the failure state and rings the doorbells. */
#ifndef TIDE_COMM_H
#define TIDE_COMM_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "store/store.h"
#include "transport/transport.h"

typedef struct tide__task tide__task_t;
typedef struct tide__mpi_comm tide__mpi_comm_t;

struct tide_comm {
  int rank, size;
  int local_rank, local_size, node, node_count;
  int *node_of;       /* node index of every rank */
  int *local_rank_of; /* local rank of every rank */
  int uniform_nodes;  /* every node has the same number of ranks */
  int *cpus_of;       /* NULL, or by rank: -1 unbound, else the lowest rank of its node bound to the same CPUs */
  char ns[160];       /* store namespace; identifies the communicator */

  char store_host[256];
  int store_port;
  char *token;
  tide_store_t *store;
  tide__store_watch_t *watch;
  pthread_t watcher;
  int watcher_running;
  int stop_fd; /* eventfd: stops the watcher */
  int wake_fd; /* eventfd: the watcher wakes TCP waits */

  tide__chan_t *chans; /* by rank; chans[rank] unused */
  /* The host-wide state of the transport whose channels share one (shm's
   * segments and doorbell), NULL when no channel uses such a transport. */
  const tide__transport_ops_t *host_ops;
  void *host_state;
  /* The engine's poll set (src/comm/progress.c), grown to the ops posted. */
  struct pollfd *wait_fds;
  size_t wait_cap;
  /* Sleeps of the engine that ran to their timeout while one of the ops it
   * waited for could already move: a wait that overslept its data. Stays
   * 0 (tests check it). */
  uint64_t overslept;

  _Atomic int failed; /* 0 or the TIDE_E* every call now returns */
  pthread_mutex_t error_lock;
  char error[1024];
  /* The last recoverable error (a local argument error, a mismatch): the
   * communicator stays usable; tide_comm_last_error returns it while the
   * communicator has not failed. Under error_lock. */
  char note[1024];
  _Atomic uint64_t left_after; /* a rank left after this many collectives */
  _Atomic int left_rank;
  /* Another rank's failure report applies from its collective on: ranks
   * still finishing an earlier one complete it first. */
  _Atomic uint64_t abort_seq;
  int abort_rc;
  char abort_msg[1024];

  pthread_mutex_t exec_lock;
  uint64_t seq; /* collectives started */
  int64_t spin_us; /* a wait polls this long before sleeping */
  int64_t timeout_ms;

  void *scratch;
  size_t scratch_cap;

  tide_comm_t *local, *cross;
  /* local and cross: the communicator whose hierarchical collectives run
   * on this one; a wait here also fails when that one fails (another rank
   * may have left the collective before its first stage). NULL otherwise. */
  tide_comm_t *parent;
  int splits; /* split calls made, names sub-communicators */

  /* nonblocking requests, executed in order by the progress thread (or by
   * a thread waiting for one of them: request.c) */
  pthread_mutex_t queue_lock;
  pthread_cond_t queue_cond;
  tide__task_t *queue_head, *queue_tail;
  uint64_t issued, completed;
  pthread_t progress_thread;
  int progress_running, progress_stop;
  int executing; /* a task taken from the queue is running */

  /* MPI backend (src/comm/mpi_boot.c): the communicator's MPI_Comm and
   * failure reports; NULL for communicators joined through the store. */
  tide__mpi_comm_t *mpi;

  /* Elastic jobs (src/comm/elastic.c): this communicator's membership
   * epoch and members; NULL outside elastic jobs. */
  struct tide__membership *membership;
};

/* Marks the communicator failed with rc (first failure wins), records and
 * logs the message, and tells the other ranks through the store unless the
 * failure came from them. Returns the communicator's failure code. */
int tide__comm_fail(tide_comm_t *comm, int rc, int from_peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records and logs a recoverable error (TIDE_EINVAL of a local argument,
 * TIDE_EMISMATCH agreed on by every rank): the communicator stays usable
 * and tide_comm_last_error returns the message until the next one. Returns
 * rc. Any thread. */
int tide__comm_note(tide_comm_t *comm, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* 0, or the failure every call from collective number seq on returns
 * (applying a pending report from another rank when seq has reached it). */
int tide__comm_check(tide_comm_t *comm, uint64_t seq);

/* Runs ops until all are done, the communicator fails or the deadline
 * (TIDE_TIMEOUT_MS from now) passes; `what` names the collective in
 * messages. Ops on one channel in one direction run in order. */
int tide__comm_run(tide_comm_t *comm, tide__p2p_t *ops, int n, const char *what);

/* A scratch buffer of at least bytes, owned by comm, valid until the next
 * call. */
void *tide__comm_scratch(tide_comm_t *comm, size_t bytes);

/* Applies another rank's failure report "code|collective#|message" (the
 * store's event/abort value, or the same record sent over MPI). */
void tide__comm_apply_report(tide_comm_t *comm, const char *value);

/* Groups the ranks into nodes: host_of[r] names rank r's host (equal names,
 * one node; nodes numbered in order of their lowest rank). Sets node_of,
 * local_rank_of, node, node_count, local_rank, local_size and
 * uniform_nodes, and cpus_of from key_of (tide__placement_key of every
 * rank; NULL leaves cpus_of NULL) (src/comm/topology.c). */
int tide__comm_set_hosts(tide_comm_t *comm, const char *const *host_of, const uint64_t *key_of);

/* ---- peer connections (src/comm/accept.c) --------------------------------- */

/* What a connecting rank sends after the token handshake: the communicator
 * (a hash of its name) and its rank. Host byte order: peers share one
 * build. */
#define TIDE__PEER_HELLO_MAGIC 0x7469646568656c6full /* "tidehello" */
typedef struct {
  uint64_t magic;
  uint64_t ns_hash;
  int32_t rank;
  int32_t pad;
} tide__peer_hello_t;

/* 0 when hello is for communicator ns_hash from a rank in (my_rank, size),
 * the ranks that connect to my_rank; TIDE_EPROTO otherwise. */
int tide__peer_hello_check(const tide__peer_hello_t *hello, uint64_t ns_hash, int my_rank, int size);

/* Accepts the peers that connect to this rank over a socket (the higher
 * ranks r with by_socket[r] set, the transport to connect them with) on
 * listen_fd and sets up their channels. Every connection is
 * authenticated at once, nonblocking, so a stranger's connection that sends
 * nothing or garbage costs the real peers nothing. TIDE_ETIMEDOUT at the
 * deadline, naming the ranks that never connected. */
int tide__comm_accept_peers(tide_comm_t *comm, int listen_fd, const tide__transport_ops_t *const *by_socket,
                            uint64_t ns_hash, int64_t deadline_ns);

/* The name of this rank's shared-memory segment: unique per job (token and
 * store address), communicator and rank. */
void tide__comm_shm_name(const tide_comm_t *comm, char *out, size_t cap);

/* A wait with nothing to sleep on (MPI moves data only inside its calls):
 * yields the core, and after 50 ms idle sleeps 100 us per call. */
void tide__comm_idle(int64_t idle_since_ns, int left_ms);

/* A communicator with no members yet (comm.c's constructor). */
tide_comm_t *tide__comm_alloc(void);

/* A communicator named ns (store namespace) of size ranks, this process
 * being rank, over the store at host:port; new members meet there within
 * connect_timeout_ms (then the communicator's own TIDE_TIMEOUT_MS applies). */
int tide__comm_create(const char *host, int port, const char *token, const char *ns, int rank, int size,
                      int64_t connect_timeout_ms, tide_comm_t **out);

/* ---- other launchers' environments (src/comm/launcher.c) ------------------- */

/* Host n (from 0) of a Slurm hostlist ("node[01-03,7],gpu-a[1-2]b": ranges
 * keep their zero padding; several bracket groups multiply, as Slurm's
 * `scontrol show hostnames` expands them) into out (size cap); *count_out
 * (may be NULL) gets the number of hosts. TIDE_EINVAL, with a message naming
 * `what` (the variable), for bad syntax or n out of range. */
int tide__hostlist_nth(const char *what, const char *list, int n, char *out, size_t cap, int *count_out);
/* A Slurm step's rendezvous without TIDE_RDZV: its store is on the first
 * host of the step's nodes, at one of TIDE__SLURM_PORT_TRIES ports derived
 * from "JOBID.STEPID" (tide__slurm_port, attempt 0, 1 ...: rank 0
 * takes the first one free, the others try each in turn). */
enum { TIDE__SLURM_PORT_BASE = 20000, TIDE__SLURM_PORT_SPAN = 8000, TIDE__SLURM_PORT_TRIES = 8 };
int tide__slurm_port(const char *job_step, int attempt);
/* 1 under srun (SLURM_PROCID and SLURM_JOB_ID set): host gets rank 0's host
 * and job_out "JOBID.STEPID"; 0 when not under Slurm; TIDE_EINVAL for a bad
 * SLURM_JOB_NODELIST or a batch script's environment (no SLURM_STEP_ID). */
int tide__slurm_rdzv(char *host, size_t cap, char *job_out, size_t job_cap);
/* The hosts the launcher says the job spans (Slurm's node counts, tiderun's
 * TIDE_NNODES, Open MPI's sizes), 0 when it does not say. */
int tide__launcher_hosts(void);
int tide__addr_is_loopback(const char *addr);
/* The local IPv4 address of this host's route to host (a name or an
 * address; nothing is sent): TIDE_EINVAL when host does not resolve,
 * TIDE_EIO when there is no route. */
int tide__route_addr(const char *host, char *addr, size_t cap);
/* The address peers should use to reach this rank, from the route to the
 * store: when that is loopback but the launcher says the job spans hosts,
 * the address that reaches the launch host or this host's only other one;
 * TIDE_EINVAL naming TIDE_SOCKET_IFNAME when it cannot tell. */
int tide__publish_addr(const char *store_host, int store_port, char *addr, size_t cap);

/* ---- elastic membership (src/comm/elastic.c) ------------------------------- */

/* Joins a running elastic job as a new worker (TIDE_ELASTIC_JOIN=1):
 * waits to be admitted to a membership epoch and connects to its members. */
int tide__elastic_join(tide_comm_t **out);
/* Records epoch 0 on comm, the job's first communicator (TIDE_ELASTIC=1). */
int tide__membership_start(tide_comm_t *comm);
void tide__membership_free(struct tide__membership *m);

/* ---- MPI backend (src/comm/mpi_boot.c) ------------------------------------ */

/* tide_comm_init under TIDE_BACKEND=mpi: MPI_COMM_WORLD, initialising MPI
 * first when nobody has. TIDE_ENOSYS without MPI in the build. */
int tide__mpi_comm_init(tide_comm_t **out);
/* tide_comm_split on an MPI communicator (MPI_Comm_split). */
int tide__mpi_comm_split(tide_comm_t *comm, int color, int key, tide_comm_t **out);
/* Sends a failure record to every other rank (bounded, never blocks long). */
void tide__mpi_comm_report(tide_comm_t *comm, const char *value, size_t len);
/* Applies a failure record that has arrived, if any (the engine's loop). */
void tide__mpi_comm_poll(tide_comm_t *comm);
/* Frees the MPI side of comm after its channels are closed (destroy). */
void tide__mpi_comm_fini(tide_comm_t *comm);

/* ---- nonblocking tasks (src/comm/request.c) ------------------------------ */

typedef int (*tide__task_cb)(tide_comm_t *comm, void *args);

/* Queues fn(comm, args) for the progress thread; args (args_size bytes) is
 * copied. */
int tide__task_submit(tide_comm_t *comm, tide__task_cb fn, const void *args, size_t args_size,
                      tide_request_t **out);
/* Waits until every queued task has completed (before a blocking call). */
void tide__task_drain(tide_comm_t *comm);
/* Stops the progress thread (destroy). */
void tide__task_fini(tide_comm_t *comm);

#endif
