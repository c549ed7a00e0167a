/* Communicator life cycle: join the job through the store, learn where the
 * other ranks are, connect (shared memory on the same host, TCP across
 * hosts), watch for failures, split, destroy. */
#include <assert.h>
#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"

typedef struct {
  char addr[64];
  int port;
  char host[200];
} peer_info_t;

/* ---- failure state ---------------------------------------------------- */

static void wake_waiters(tide_comm_t *comm) {
  if (comm->host_state != NULL) comm->host_ops->bell_ring(comm->host_state);
  uint64_t one = 1;
  /* Only fails when the counter is saturated: then a wake-up is pending anyway. */
  if (comm->wake_fd >= 0) (void)!write(comm->wake_fd, &one, sizeof one);
}

static int set_failed(tide_comm_t *comm, int rc, const char *msg) {
  pthread_mutex_lock(&comm->error_lock);
  int first = atomic_load(&comm->failed) == 0;
  if (first) {
    snprintf(comm->error, sizeof comm->error, "%s", msg);
    atomic_store(&comm->failed, rc);
  }
  pthread_mutex_unlock(&comm->error_lock);
  if (first) {
    TIDE_ERROR("%s", msg);
    wake_waiters(comm);
  }
  return first;
}

int tide__comm_fail(tide_comm_t *comm, int rc, int from_peer, const char *fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (set_failed(comm, rc, msg) && !from_peer && (comm->store != NULL || comm->mpi != NULL)) {
    char key[200], value[1000];
    snprintf(key, sizeof key, "event/abort/%s", comm->ns);
    int n = snprintf(value, sizeof value, "%d|%llu|%s", rc, (unsigned long long)comm->seq, msg);
    size_t len = (size_t)(n < (int)sizeof value ? n : (int)sizeof value - 1);
    if (comm->mpi != NULL)
      tide__mpi_comm_report(comm, value, len);
    else
      tide_store_set(comm->store, key, value, len);
  }
  return atomic_load(&comm->failed);
}

int tide__comm_note(tide_comm_t *comm, int rc, const char *fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&comm->error_lock);
  snprintf(comm->note, sizeof comm->note, "%s", msg);
  pthread_mutex_unlock(&comm->error_lock);
  TIDE_ERROR("%s (%s; the communicator stays usable)", msg, tide_err_name(rc));
  return rc;
}

int tide__comm_check(tide_comm_t *comm, uint64_t seq) {
  int failed = atomic_load_explicit(&comm->failed, memory_order_acquire);
  if (failed) return failed;
  if (seq >= atomic_load(&comm->abort_seq)) {
    char msg[1024];
    pthread_mutex_lock(&comm->error_lock);
    int rc = comm->abort_rc;
    memcpy(msg, comm->abort_msg, sizeof msg);
    pthread_mutex_unlock(&comm->error_lock);
    set_failed(comm, rc, msg);
    return atomic_load(&comm->failed);
  }
  if (seq > atomic_load(&comm->left_after))
    return tide__comm_fail(comm, TIDE_EPEER, 0,
                           "rank %d left the communicator (tide_comm_destroy) after %llu collectives, while "
                           "rank %d is in collective #%llu",
                           atomic_load(&comm->left_rank), (unsigned long long)atomic_load(&comm->left_after),
                           comm->rank, (unsigned long long)seq);
  return 0;
}

/* Events from the store: another rank's failure report, a rank that died
 * (its watch connection dropped) or one that left (destroyed the
 * communicator after n collectives). */
void tide__comm_apply_report(tide_comm_t *comm, const char *value) {
  int rc = 0, at = 0;
  unsigned long long seq = 0;
  if (sscanf(value, "%d|%llu|%n", &rc, &seq, &at) < 2 || at == 0) return;
  pthread_mutex_lock(&comm->error_lock);
  if (seq < atomic_load(&comm->abort_seq)) {
    comm->abort_rc = rc < 0 ? rc : TIDE_EABORTED;
    snprintf(comm->abort_msg, sizeof comm->abort_msg, "%s", value + at);
    atomic_store(&comm->abort_seq, (uint64_t)seq);
  }
  pthread_mutex_unlock(&comm->error_lock);
  wake_waiters(comm);
}

static void handle_event(tide_comm_t *comm, const char *key, const char *value) {
  size_t ns_len = strlen(comm->ns);
  if (strncmp(key, "event/abort/", 12) == 0 && strcmp(key + 12, comm->ns) == 0) {
    tide__comm_apply_report(comm, value);
  } else if (strncmp(key, "event/lost/", 11) == 0 && strncmp(key + 11, comm->ns, ns_len) == 0 &&
             key[11 + ns_len] == ':') {
    int rank = atoi(key + 12 + ns_len);
    char msg[300];
    snprintf(msg, sizeof msg,
             "rank %d died (its connection to the rendezvous store dropped); rank %d stops", rank,
             comm->rank);
    set_failed(comm, TIDE_EPEER, msg);
  } else if (strncmp(key, "event/left/", 11) == 0 && strcmp(key + 11, comm->ns) == 0) {
    int rank = -1;
    unsigned long long after = 0;
    if (sscanf(value, "%d %llu", &rank, &after) == 2 && rank != comm->rank &&
        after < atomic_load(&comm->left_after)) {
      atomic_store(&comm->left_rank, rank);
      atomic_store(&comm->left_after, (uint64_t)after);
      wake_waiters(comm);
    }
  }
}

static void *watcher_main(void *arg) {
  tide_comm_t *comm = arg;
  struct pollfd fds[2] = {{tide__store_watch_fd(comm->watch), POLLIN, 0}, {comm->stop_fd, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents) break;
    for (;;) {
      char *key = NULL;
      void *value = NULL;
      size_t len = 0;
      int rc = tide__store_watch_next(comm->watch, &key, &value, &len);
      if (rc < 0) {
        TIDE_DEBUG("the rendezvous store closed the watch connection; peer failures are now "
                   "seen through connections and timeouts only");
        return NULL;
      }
      if (rc == 0) break;
      char text[1024];
      size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
      memcpy(text, value, n);
      text[n] = '\0';
      handle_event(comm, key, text);
      tide__free(key);
      tide__free(value);
    }
  }
  return NULL;
}

/* ---- identity and topology -------------------------------------------- */

static int env_int(const char *name, int *out) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0') return 0;
  char *end;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20) {
    TIDE_ERROR("%s=\"%s\" is not a valid rank or size", name, v);
    return TIDE_EINVAL;
  }
  *out = (int)x;
  return 1;
}

/* Rank and size from tiderun, Open MPI, PMI (MPICH, Slurm's PMI) or Slurm.
 * *tiderun is 1 when TIDE_RANK is set: tiderun (or a test) hosts the store. */
static int job_identity(int *rank, int *size, int *tiderun) {
  static const char *pairs[][2] = {{"TIDE_RANK", "TIDE_SIZE"},
                                   {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                   {"PMI_RANK", "PMI_SIZE"},
                                   {"PMIX_RANK", "TIDE_SIZE"},
                                   {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    int r = -1, s = -1;
    int got_r = env_int(pairs[i][0], &r), got_s = env_int(pairs[i][1], &s);
    if (got_r < 0 || got_s < 0) return TIDE_EINVAL;
    if (got_r == 0 && got_s == 0) continue;
    if (got_r == 0 || got_s == 0 || s < 1 || r >= s) {
      TIDE_ERROR("%s and %s must both be set, with 0 <= rank < size", pairs[i][0], pairs[i][1]);
      return TIDE_EINVAL;
    }
    *rank = r;
    *size = s;
    *tiderun = i == 0;
    return 0;
  }
  *rank = 0;
  *size = 1;
  *tiderun = 0;
  return 0;
}

static void host_identity(char *out, size_t cap) {
  const char *forced = tide__param_str(TIDE__PARAM_HOST_ID);
  if (forced[0] != '\0') {
    snprintf(out, cap, "id:%s", forced);
    return;
  }
  char host[64] = "?", boot[64] = "?";
  gethostname(host, sizeof host - 1);
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f != NULL) {
    if (fgets(boot, sizeof boot, f) == NULL) strcpy(boot, "?");
    boot[strcspn(boot, "\n")] = '\0';
    fclose(f);
  }
  /* Network namespaces on one kernel are separate (emulated) hosts. */
  struct stat st;
  unsigned long long netns = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
  snprintf(out, cap, "%s/%s/%llu", host, boot, netns);
}

/* The address peers should use to reach us: TIDE_SOCKET_IFNAME's, or the
 * one this host uses to reach the store. */
static int ifname_address(const char *ifname, char *addr, size_t cap) {
  if (tide__ifname_addr(ifname, addr, cap) == 0) return 0;
  TIDE_ERROR("TIDE_SOCKET_IFNAME=%s: no IPv4 address on that interface (see `ip addr`)", ifname);
  return TIDE_EINVAL;
}

static int local_address(const tide_comm_t *comm, char *addr, size_t cap) {
  const char *ifname = tide__param_str(TIDE__PARAM_SOCKET_IFNAME);
  if (ifname[0] != '\0') return ifname_address(ifname, addr, cap);
  return tide__publish_addr(comm->store_host, comm->store_port, addr, cap);
}

/* A rank on another host that published a loopback address cannot be
 * reached, nor can it reach a peer's loopback: every rank sees the whole
 * table, so every rank fails now, not after TIDE_TIMEOUT_MS. Hosts are
 * compared by boot id and network namespace (the part after the host name);
 * TIDE_HOST_ID (tests faking hosts on one machine) turns the check off. */
static int check_reachable(const tide_comm_t *comm, const peer_info_t *peers) {
  if (tide__param_str(TIDE__PARAM_HOST_ID)[0] != '\0') return 0;
  for (int a = 0; a < comm->size; a++) {
    const char *host_a = strchr(peers[a].host, '/');
    if (host_a == NULL || !tide__addr_is_loopback(peers[a].addr)) continue;
    for (int b = 0; b < comm->size; b++) {
      const char *host_b = strchr(peers[b].host, '/');
      if (host_b == NULL || strcmp(host_a, host_b) == 0) continue;
      TIDE_ERROR("rank %d published the loopback address %s but rank %d runs on another host: rank %d's host "
                 "reaches the rendezvous host \"%s\" through loopback (Debian maps a host's own name to "
                 "127.0.1.1); set TIDE_SOCKET_IFNAME to the interface the hosts reach each other on (e.g. eth0) "
                 "for every rank",
                 a, peers[a].addr, b, a, comm->store_host);
      return TIDE_EINVAL;
    }
  }
  return 0;
}

/* ---- connecting -------------------------------------------------------- */

static int set_string(tide_store_t *store, const char *key, const char *value) {
  return tide_store_set(store, key, value, strlen(value));
}

void tide__comm_shm_name(const tide_comm_t *comm, char *out, size_t cap) {
  /* The store's address is in the hash: two jobs on one host with the same
   * token (tests, a user's repeated runs) must not take, or unlink as a
   * leftover, each other's live segments. */
  char job[600];
  snprintf(job, sizeof job, "%s %s:%d", comm->token, comm->store_host, comm->store_port);
  uint8_t digest[32];
  tide__sha256(job, strlen(job), digest);
  snprintf(out, cap, "/tide-%02x%02x%02x%02x%02x%02x-%s-%d", digest[0], digest[1], digest[2], digest[3], digest[4],
           digest[5], comm->ns, comm->rank);
  for (char *p = out + 1; *p; p++)
    if (*p == '/') *p = '_';
}

/* Sets up the transport whose channels share host-wide state (shm), for the
 * local peers picked[] gave it; at most one such transport. */
static int connect_host(tide_comm_t *comm, const int *local_ranks, const tide__transport_ops_t *const *picked) {
  int *peers = tide__calloc((size_t)comm->local_size, sizeof *peers), npeers = 0;
  if (peers == NULL) return TIDE_ENOMEM;
  const tide__transport_ops_t *ops = NULL;
  for (int l = 0; l < comm->local_size; l++) {
    const tide__transport_ops_t *t = picked[local_ranks[l]];
    if (t == NULL || t->host_open == NULL) continue;
    assert(ops == NULL || ops == t);
    ops = t;
    peers[npeers++] = l;
  }
  int rc = 0;
  if (ops != NULL) {
    char name[260];
    tide__comm_shm_name(comm, name, sizeof name);
    tide__host_setup_t setup = {comm->rank, comm->local_rank, comm->local_size, local_ranks, peers, npeers,
                                comm->store, comm->ns, name, (int)comm->timeout_ms};
    comm->host_ops = ops;
    rc = ops->host_open(&setup, comm->chans, &comm->host_state);
  }
  tide__free(peers);
  return rc;
}

/* Connects the channels whose transport takes a socket (by_socket[peer]
 * set): an authenticated TCP connection to each peer. */
static int connect_sockets(tide_comm_t *comm, int listen_fd, const peer_info_t *peers,
                           const tide__transport_ops_t *const *by_socket) {
  int64_t deadline = tide__deadline_after_ms(comm->timeout_ms);
  uint64_t ns_hash = tide__fnv1a_str(comm->ns);
  /* Connect to lower ranks, then accept the higher ones: rank 0 only
   * accepts, so nobody waits in a cycle. */
  for (int peer = 0; peer < comm->rank; peer++) {
    if (by_socket[peer] == NULL) continue;
    int fd;
    TIDE_CHECK(tide__tcp_connect(peers[peer].addr, peers[peer].port, deadline, &fd));
    int rc = tide__auth_handshake(fd, comm->token, 0, deadline);
    tide__peer_hello_t hello = {TIDE__PEER_HELLO_MAGIC, ns_hash, comm->rank, 0};
    if (rc == 0) rc = tide__send_all(fd, &hello, sizeof hello, deadline);
    if (rc == 0) {
      tide__endpoint_t ep = {fd, NULL};
      rc = by_socket[peer]->connect(&comm->chans[peer], peer, &ep);
    }
    if (rc != 0) {
      if (comm->chans[peer].ops == NULL) close(fd); /* else the channel owns it */
      TIDE_ERROR("rank %d cannot connect to rank %d at %s:%d: %s", comm->rank, peer, peers[peer].addr,
                 peers[peer].port, tide_strerror(rc));
      return rc;
    }
  }
  return tide__comm_accept_peers(comm, listen_fd, by_socket, ns_hash, deadline);
}

/* Fills in topology and channels for comm (rank, size, ns, store set). */
static int comm_connect(tide_comm_t *comm) {
  int rc = 0, listen_fd = -1;
  int timeout = (int)comm->timeout_ms;
  peer_info_t *peers = tide__calloc((size_t)comm->size, sizeof *peers);
  /* by rank: the transport picked, and the same for those connected over a socket */
  const tide__transport_ops_t **picked = tide__calloc((size_t)comm->size, sizeof *picked);
  const tide__transport_ops_t **by_socket = tide__calloc((size_t)comm->size, sizeof *by_socket);
  int *local_ranks = tide__calloc((size_t)comm->size, sizeof *local_ranks);
  const char **hosts = tide__calloc((size_t)comm->size, sizeof *hosts);
  uint64_t *keys = tide__calloc((size_t)comm->size, sizeof *keys);
  comm->chans = tide__calloc((size_t)comm->size, sizeof *comm->chans);
  if (!peers || !picked || !by_socket || !local_ranks || !hosts || !keys || !comm->chans) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  for (int r = 0; r < comm->size; r++) comm->chans[r].fd = -1;

  char addr[64], host[200], key[220], value[400];
  TIDE_CHECK_GOTO(local_address(comm, addr, sizeof addr), rc, out);
  int port;
  TIDE_CHECK_GOTO(tide__tcp_listen(addr, 0, &listen_fd, &port), rc, out);
  host_identity(host, sizeof host);
  snprintf(key, sizeof key, "%s/peer/%d", comm->ns, comm->rank);
  snprintf(value, sizeof value, "%s %d %s %llx", addr, port, host, (unsigned long long)tide__placement_key());
  TIDE_CHECK_GOTO(set_string(comm->store, key, value), rc, out);
  for (int r = 0; r < comm->size; r++) {
    snprintf(key, sizeof key, "%s/peer/%d", comm->ns, r);
    rc = tide__store_get_string(comm->store, key, timeout, value, sizeof value);
    if (rc == TIDE_ETIMEDOUT)
      TIDE_ERROR("rank %d waited %d ms for rank %d to join (is it running, with the same "
                 "TIDE_RDZV and size?)", comm->rank, timeout, r);
    if (rc != 0) goto out;
    unsigned long long placement;
    if (sscanf(value, "%63s %d %199s %llx", peers[r].addr, &peers[r].port, peers[r].host, &placement) != 4) {
      rc = TIDE_EPROTO;
      goto out;
    }
    keys[r] = placement;
  }
  TIDE_CHECK_GOTO(check_reachable(comm, peers), rc, out);
  for (int r = 0; r < comm->size; r++) hosts[r] = peers[r].host;
  TIDE_CHECK_GOTO(tide__comm_set_hosts(comm, hosts, keys), rc, out);
  for (int r = 0; r < comm->size; r++) {
    if (comm->node_of[r] == comm->node) local_ranks[comm->local_rank_of[r]] = r;
    if (r == comm->rank) continue;
    tide__link_t link = {comm->node_of[r] == comm->node, NULL};
    picked[r] = tide__transport_pick(&link);
    if (picked[r] == NULL) {
      TIDE_ERROR("rank %d: no transport can reach rank %d", comm->rank, r);
      rc = TIDE_ENOSYS;
      goto out;
    }
    if (picked[r]->host_open == NULL) by_socket[r] = picked[r];
  }
  TIDE_CHECK_GOTO(connect_host(comm, local_ranks, picked), rc, out);
  TIDE_CHECK_GOTO(connect_sockets(comm, listen_fd, peers, by_socket), rc, out);

  comm->spin_us = tide__wait_spin_us();

  char name[200];
  snprintf(name, sizeof name, "%s:%d", comm->ns, comm->rank);
  TIDE_CHECK_GOTO(tide__store_watch_open(comm->store_host, comm->store_port, comm->token, name, timeout,
                                         &comm->watch),
                  rc, out);
  if (pthread_create(&comm->watcher, NULL, watcher_main, comm) != 0) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  comm->watcher_running = 1;
  /* Nobody starts a collective (and so publishes an event) before every
   * rank watches: events are pushed, not stored for late watchers. */
  snprintf(key, sizeof key, "%s/ready/%d", comm->ns, comm->rank);
  TIDE_CHECK_GOTO(set_string(comm->store, key, "1"), rc, out);
  for (int r = 0; r < comm->size; r++) {
    snprintf(key, sizeof key, "%s/ready/%d", comm->ns, r);
    const char *keys[1] = {key};
    TIDE_CHECK_GOTO(tide_store_wait(comm->store, keys, 1, timeout), rc, out);
  }
  TIDE_DEBUG("communicator %s: rank %d of %d, node %d of %d, local rank %d of %d", comm->ns, comm->rank,
             comm->size, comm->node, comm->node_count, comm->local_rank, comm->local_size);
out:
  if (listen_fd >= 0) close(listen_fd);
  tide__free(peers);
  tide__free(picked);
  tide__free(by_socket);
  tide__free(local_ranks);
  tide__free(hosts);
  tide__free(keys);
  return rc;
}

static tide_comm_t *comm_alloc(void) {
  tide_comm_t *comm = tide__calloc(1, sizeof *comm);
  if (comm == NULL) return NULL;
  pthread_mutex_init(&comm->error_lock, NULL);
  pthread_mutex_init(&comm->exec_lock, NULL);
  pthread_mutex_init(&comm->queue_lock, NULL);
  pthread_cond_init(&comm->queue_cond, NULL);
  atomic_store(&comm->left_after, UINT64_MAX);
  atomic_store(&comm->left_rank, -1);
  atomic_store(&comm->abort_seq, UINT64_MAX);
  comm->stop_fd = eventfd(0, EFD_CLOEXEC);
  comm->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  comm->timeout_ms = tide__param_int(TIDE__PARAM_TIMEOUT_MS);
  if (comm->stop_fd < 0 || comm->wake_fd < 0) {
    tide_comm_destroy(comm);
    return NULL;
  }
  return comm;
}

tide_comm_t *tide__comm_alloc(void) { return comm_alloc(); }

/* The store this process hosts under mpirun or srun (rank 0), and how many
 * communicators of this process still hold connections to a store. */
static tide_store_server_t *hosted_store;
static _Atomic int open_comms;

/* A derived token when another launcher started us without TIDE_JOB_TOKEN:
 * it keeps strangers' stray connections out but is no secret. Rank 0 says
 * so, once for the job. */
static char *derived_token(const char *rdzv, int rank) {
  const char *parts[] = {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID", "PMI_JOBID"};
  char text[512];
  int n = snprintf(text, sizeof text, "tide-derived:%s", rdzv);
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    const char *v = getenv(parts[i]);
    if (v != NULL) n += snprintf(text + n, sizeof text - (size_t)n, ":%s", v);
  }
  if (rank == 0)
    TIDE_WARN("TIDE_JOB_TOKEN is not set: the ranks authenticate with a token derived from the launcher's job id "
              "and the rendezvous address. It keeps other jobs' ranks and stray connections out of this job; it "
              "does not keep out anyone who can see the job id (squeue, ps) and reach the hosts. For that, export "
              "the same random TIDE_JOB_TOKEN on every rank (e.g. TIDE_JOB_TOKEN=$(openssl rand -hex 16) before "
              "srun)");
  return tide__strdup(text);
}

/* Under srun without TIDE_RDZV, rank 0 starts the store on the first of the
 * step's derived ports that is free. */
static int slurm_store_start(tide_comm_t *comm, const char *job) {
  int rc = TIDE_EADDRINUSE;
  for (int attempt = 0; attempt < TIDE__SLURM_PORT_TRIES && rc == TIDE_EADDRINUSE; attempt++) {
    comm->store_port = tide__slurm_port(job, attempt);
    tide__log_mute(1);
    rc = tide_store_server_start(NULL, comm->store_port, comm->token, &hosted_store);
    tide__log_mute(0);
    if (rc == TIDE_EADDRINUSE)
      TIDE_INFO("Slurm job %s: port %d is in use, trying the next", job, comm->store_port);
  }
  if (rc == TIDE_EADDRINUSE)
    TIDE_ERROR("Slurm job %s: the %d ports derived from the job and step ids (%d, %d, ...) are all in use on %s; "
               "export TIDE_RDZV=%s:PORT with a free PORT for every rank",
               job, TIDE__SLURM_PORT_TRIES, tide__slurm_port(job, 0), tide__slurm_port(job, 1),
               comm->store_host, comm->store_host);
  else if (rc != 0)
    TIDE_ERROR("Slurm job %s: cannot start the store on port %d: %s", job, comm->store_port, tide_strerror(rc));
  return rc;
}

/* The other ranks try each derived port in turn until one holds a store that
 * knows the job's token (another job's store refuses it). */
static int slurm_store_connect(tide_comm_t *comm, const char *job) {
  int64_t deadline = tide__deadline_after_ms(comm->timeout_ms);
  int rc = TIDE_ETIMEDOUT;
  for (int attempt = 0;; attempt = (attempt + 1) % TIDE__SLURM_PORT_TRIES) {
    int port = tide__slurm_port(job, attempt);
    tide__log_mute(1);
    rc = tide_store_connect(comm->store_host, port, comm->token, 300, &comm->store);
    tide__log_mute(0);
    if (rc == 0) {
      comm->store_port = port;
      return 0;
    }
    if (rc == TIDE_EINVAL || tide__now_ns() >= deadline) break;
  }
  TIDE_ERROR("Slurm job %s: no store of this job answered on %s, ports %d, %d, ... (%d tried) within "
             "TIDE_TIMEOUT_MS=%lld ms (last: %s): is rank 0 running, and does %s resolve to its host here?",
             job, comm->store_host, tide__slurm_port(job, 0), tide__slurm_port(job, 1),
             TIDE__SLURM_PORT_TRIES, (long long)comm->timeout_ms, tide_strerror(rc), comm->store_host);
  return rc;
}

static int comm_join(tide_comm_t **out) {
  TIDE_CHECK(tide_params_load());
  if (strcmp(tide__param_str(TIDE__PARAM_BACKEND), "mpi") == 0) return tide__mpi_comm_init(out);
  if (tide__param_int(TIDE__PARAM_ELASTIC_JOIN)) return tide__elastic_join(out);
  int rank, size, tiderun;
  TIDE_CHECK(job_identity(&rank, &size, &tiderun));
  tide__log_set_rank(rank);
  static int generation;
  int gen = generation++;
  tide_comm_t *comm = comm_alloc();
  if (comm == NULL) return TIDE_ENOMEM;
  comm->rank = rank;
  comm->size = size;
  snprintf(comm->ns, sizeof comm->ns, "w%d", gen);
  const char *rdzv = tide__param_str(TIDE__PARAM_RDZV);
  int rc = 0, slurm = 0;
  char slurm_job[128] = "", rdzv_text[sizeof comm->store_host + 128 + 16];
  if (size == 1 && rdzv[0] == '\0') {
    comm->local_size = comm->node_count = 1;
    comm->uniform_nodes = 1;
    *out = comm;
    return 0;
  }
  /* A bad interface name fails every rank now, not only those that get as
   * far as connecting to their peers (the others would wait for them). */
  const char *ifname = tide__param_str(TIDE__PARAM_SOCKET_IFNAME);
  char if_addr[64];
  if (ifname[0] != '\0') TIDE_CHECK_GOTO(ifname_address(ifname, if_addr, sizeof if_addr), rc, fail);
  if (rdzv[0] == '\0' && !tiderun) {
    slurm = tide__slurm_rdzv(comm->store_host, sizeof comm->store_host, slurm_job, sizeof slurm_job);
    if (slurm < 0) {
      rc = slurm;
      goto fail;
    }
  }
  if (slurm) {
    snprintf(rdzv_text, sizeof rdzv_text, "slurm:%s:%s", comm->store_host, slurm_job);
    TIDE_DEBUG("Slurm step %s: the store is on %s, ports from %d", slurm_job, comm->store_host,
               tide__slurm_port(slurm_job, 0));
  } else if (rdzv[0] == '\0') {
    TIDE_ERROR("rank %d of %d: TIDE_RDZV is not set; start the job with tiderun or srun, or export "
               "TIDE_RDZV=host:port (rank 0's host) for every rank, or TIDE_BACKEND=mpi to join through MPI",
               rank, size);
    rc = TIDE_EINVAL;
    goto fail;
  } else if (tide__parse_host_port(rdzv, comm->store_host, sizeof comm->store_host, &comm->store_port) != 0) {
    TIDE_ERROR("TIDE_RDZV=\"%s\" is not host:port", rdzv);
    rc = TIDE_EINVAL;
    goto fail;
  } else {
    snprintf(rdzv_text, sizeof rdzv_text, "%s", rdzv);
  }
  const char *token = tide__param_str(TIDE__PARAM_JOB_TOKEN);
  comm->token = token[0] != '\0' ? tide__strdup(token) : derived_token(rdzv_text, gen == 0 ? rank : -1);
  if (comm->token == NULL) {
    rc = TIDE_ENOMEM;
    goto fail;
  }
  /* Under mpirun or srun nobody hosts the store: rank 0 does, for the
   * life of the process (later communicators meet there too). */
  if (slurm && rank == 0 && hosted_store == NULL) {
    TIDE_CHECK_GOTO(slurm_store_start(comm, slurm_job), rc, fail);
  } else if (slurm && rank == 0) {
    comm->store_port = tide_store_server_port(hosted_store);
  } else if (!tiderun && rank == 0 && hosted_store == NULL) {
    rc = tide_store_server_start(NULL, comm->store_port, comm->token, &hosted_store);
    if (rc == TIDE_EADDRINUSE)
      TIDE_ERROR("TIDE_RDZV=%s: port %d is already in use on this host (another job's store?); give every rank "
                 "a free port",
                 rdzv, comm->store_port);
    if (rc != 0) goto fail;
  }
  if (slurm && rank != 0)
    TIDE_CHECK_GOTO(slurm_store_connect(comm, slurm_job), rc, fail);
  else
    TIDE_CHECK_GOTO(tide_store_connect(comm->store_host, comm->store_port, comm->token, (int)comm->timeout_ms,
                                       &comm->store),
                    rc, fail);
  atomic_fetch_add(&open_comms, 1);
  TIDE_CHECK_GOTO(comm_connect(comm), rc, fail);
  if (tide__param_int(TIDE__PARAM_ELASTIC)) TIDE_CHECK_GOTO(tide__membership_start(comm), rc, fail);
  *out = comm;
  return 0;
fail:
  TIDE_ERROR("rank %d could not join the job: %s", rank, tide_strerror(rc));
  tide_comm_destroy(comm);
  return rc;
}

int tide_comm_init(tide_comm_t **out) {
  if (out == NULL) return tide__null_arg("tide_comm_init", "out");
  int rc = comm_join(out);
  /* Now that the local rank is known: TIDE_BIND under mpirun or srun. */
  if (rc == 0) tide__place_self((*out)->local_rank, (*out)->local_size);
  /* After the joining threads started, so that they are lowered too. */
  if (rc == 0 && tide__param_int(TIDE__PARAM_BACKGROUND)) tide_background_enter(NULL);
  return rc;
}

void tide_comm_destroy(tide_comm_t *comm) {
  if (comm == NULL) return;
  tide__task_fini(comm);
  tide_comm_destroy(comm->local);
  tide_comm_destroy(comm->cross);
  if (comm->store != NULL && atomic_load(&comm->failed) == 0) {
    /* Ranks still in a later collective with us learn we are gone. */
    char key[200], value[64];
    snprintf(key, sizeof key, "event/left/%s", comm->ns);
    snprintf(value, sizeof value, "%d %llu", comm->rank, (unsigned long long)comm->seq);
    tide_store_set(comm->store, key, value, strlen(value));
  }
  if (comm->watcher_running) {
    uint64_t one = 1;
    (void)!write(comm->stop_fd, &one, sizeof one); /* fails only when already signalled */
    pthread_join(comm->watcher, NULL);
  }
  tide__store_watch_close(comm->watch);
  if (comm->chans != NULL)
    for (int r = 0; r < comm->size; r++)
      if (comm->chans[r].ops != NULL) comm->chans[r].ops->close(&comm->chans[r]);
  if (comm->mpi != NULL) tide__mpi_comm_fini(comm);
  if (comm->host_ops != NULL) comm->host_ops->host_close(comm->host_state);
  if (comm->store != NULL) atomic_fetch_sub(&open_comms, 1);
  tide_store_close(comm->store);
  /* Its liveness watch is a connection to the store too: closed before a
   * process hosting the store waits for the connections to go (under srun
   * rank 0 hosts it, and waited on its own watch until TIDE_TIMEOUT_MS). */
  tide__membership_free(comm->membership);
  comm->membership = NULL;
  /* Hosting the store, stay until the other ranks are done with it (their
   * exit or destroy closes their connections), so they do not see it vanish.
   * Only when this process's last communicator goes: an elastic job's old
   * epoch or a split, destroyed while the others go on in a newer one, must
   * not wait for them (that waited TIDE_TIMEOUT_MS under srun). */
  if (hosted_store != NULL && comm->store != NULL && atomic_load(&open_comms) == 0)
    tide__store_server_wait_clients(hosted_store, 0, (int)comm->timeout_ms);
  if (comm->stop_fd >= 0) close(comm->stop_fd);
  if (comm->wake_fd >= 0) close(comm->wake_fd);
  pthread_mutex_destroy(&comm->error_lock);
  pthread_mutex_destroy(&comm->exec_lock);
  pthread_mutex_destroy(&comm->queue_lock);
  pthread_cond_destroy(&comm->queue_cond);
  tide__free(comm->wait_fds);
  tide__free(comm->chans);
  tide__free(comm->node_of);
  tide__free(comm->local_rank_of);
  tide__free(comm->cpus_of);
  tide__free(comm->scratch);
  tide__free(comm->token);
  tide__free(comm);
}

int tide__comm_create(const char *host, int port, const char *token, const char *ns, int rank, int size,
                      int64_t connect_timeout_ms, tide_comm_t **out) {
  tide_comm_t *comm = comm_alloc();
  if (comm == NULL) return TIDE_ENOMEM;
  comm->rank = rank;
  comm->size = size;
  snprintf(comm->ns, sizeof comm->ns, "%s", ns);
  snprintf(comm->store_host, sizeof comm->store_host, "%s", host);
  comm->store_port = port;
  comm->token = tide__strdup(token);
  int rc = comm->token != NULL ? 0 : TIDE_ENOMEM;
  if (rc == 0) rc = tide_store_connect(host, port, token, (int)comm->timeout_ms, &comm->store);
  if (rc == 0) {
    atomic_fetch_add(&open_comms, 1);
    int64_t timeout = comm->timeout_ms;
    comm->timeout_ms = connect_timeout_ms < timeout ? connect_timeout_ms : timeout;
    rc = comm_connect(comm);
    comm->timeout_ms = timeout;
  }
  if (rc != 0) {
    tide_comm_destroy(comm);
    return rc;
  }
  *out = comm;
  return 0;
}

int tide_comm_rank(const tide_comm_t *comm) { return comm ? comm->rank : tide__null_arg("tide_comm_rank", "comm"); }
int tide_comm_size(const tide_comm_t *comm) { return comm ? comm->size : tide__null_arg("tide_comm_size", "comm"); }
int tide_comm_local_rank(const tide_comm_t *comm) {
  return comm ? comm->local_rank : tide__null_arg("tide_comm_local_rank", "comm");
}
int tide_comm_local_size(const tide_comm_t *comm) {
  return comm ? comm->local_size : tide__null_arg("tide_comm_local_size", "comm");
}
int tide_compute_threads(const tide_comm_t *comm, int *threads_out) {
  if (threads_out == NULL) {
    TIDE_ERROR("tide_compute_threads: threads_out is NULL");
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide_params_load());
  *threads_out = tide__default_threads(comm != NULL ? comm->local_size : 0);
  return 0;
}
int tide_comm_node(const tide_comm_t *comm) { return comm ? comm->node : tide__null_arg("tide_comm_node", "comm"); }
int tide_comm_node_count(const tide_comm_t *comm) {
  return comm ? comm->node_count : tide__null_arg("tide_comm_node_count", "comm");
}

const char *tide_comm_last_error(const tide_comm_t *comm) {
  if (comm == NULL) return "comm is NULL";
  return atomic_load(&((tide_comm_t *)comm)->failed) ? comm->error : comm->note;
}

/* ---- split ------------------------------------------------------------------- */

int tide_comm_split(tide_comm_t *comm, int color, int key, tide_comm_t **out) {
  if (comm == NULL || out == NULL) return tide__null_arg("tide_comm_split", comm == NULL ? "comm" : "out");
  int failed = atomic_load(&comm->failed);
  if (failed) return failed;
  if (comm->mpi != NULL) return tide__mpi_comm_split(comm, color, key, out);
  int split = ++comm->splits;
  if (comm->size == 1 && comm->store == NULL) {
    if (color < 0) {
      *out = NULL;
      return 0;
    }
    tide_comm_t *solo = comm_alloc();
    if (solo == NULL) return TIDE_ENOMEM;
    solo->size = solo->local_size = solo->node_count = solo->uniform_nodes = 1;
    if (snprintf(solo->ns, sizeof solo->ns, "%s.s%dc%d", comm->ns, split, color) >= (int)sizeof solo->ns) {
      tide_comm_destroy(solo);
      return TIDE_EINVAL;
    }
    *out = solo;
    return 0;
  }
  char skey[220], value[64];
  snprintf(skey, sizeof skey, "%s/split%d/%d", comm->ns, split, comm->rank);
  snprintf(value, sizeof value, "%d %d", color, key);
  TIDE_CHECK(set_string(comm->store, skey, value));
  int my_rank = 0, count = 0;
  for (int r = 0; r < comm->size; r++) {
    snprintf(skey, sizeof skey, "%s/split%d/%d", comm->ns, split, r);
    TIDE_CHECK(tide__store_get_string(comm->store, skey, (int)comm->timeout_ms, value, sizeof value));
    int c, k;
    if (sscanf(value, "%d %d", &c, &k) != 2) return TIDE_EPROTO;
    if (c != color || color < 0) continue;
    count++;
    if (k < key || (k == key && r < comm->rank)) my_rank++;
  }
  if (color < 0) {
    *out = NULL;
    return 0;
  }
  tide_comm_t *sub = comm_alloc();
  if (sub == NULL) return TIDE_ENOMEM;
  sub->rank = my_rank;
  sub->size = count;
  if (snprintf(sub->ns, sizeof sub->ns, "%s.s%dc%d", comm->ns, split, color) >= (int)sizeof sub->ns) {
    TIDE_ERROR("communicators split too many times (name %s too long)", comm->ns);
    tide_comm_destroy(sub);
    return TIDE_EINVAL;
  }
  memcpy(sub->store_host, comm->store_host, sizeof sub->store_host);
  sub->store_port = comm->store_port;
  sub->token = tide__strdup(comm->token);
  int rc = sub->token ? 0 : TIDE_ENOMEM;
  if (rc == 0)
    rc = tide_store_connect(sub->store_host, sub->store_port, sub->token, (int)sub->timeout_ms, &sub->store);
  if (rc == 0) {
    atomic_fetch_add(&open_comms, 1);
    rc = comm_connect(sub);
  }
  if (rc != 0) {
    tide_comm_destroy(sub);
    return rc;
  }
  *out = sub;
  return 0;
}

int tide_comm_local(tide_comm_t *comm, tide_comm_t **out) {
  if (comm == NULL || out == NULL) return tide__null_arg("tide_comm_local", comm == NULL ? "comm" : "out");
  if (comm->local == NULL) {
    TIDE_CHECK(tide_comm_split(comm, comm->node, comm->rank, &comm->local));
    comm->local->parent = comm;
  }
  *out = comm->local;
  return 0;
}

int tide_comm_cross(tide_comm_t *comm, tide_comm_t **out) {
  if (comm == NULL || out == NULL) return tide__null_arg("tide_comm_cross", comm == NULL ? "comm" : "out");
  if (comm->cross == NULL) {
    TIDE_CHECK(tide_comm_split(comm, comm->local_rank, comm->rank, &comm->cross));
    comm->cross->parent = comm;
  }
  *out = comm->cross;
  return 0;
}
