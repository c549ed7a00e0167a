/* Accepting peer connections at start-up: one poll loop over the listening
 * socket and every connection still proving the job token, all
 * nonblocking, so no connection (a stranger's that sends nothing, a port
 * scanner's, a slow real peer's) holds up another. The steps are those of
 * tide__auth_handshake's accepting side (tide__auth_server_*), then the
 * peer's hello names its communicator and rank.
 *
 * Threads: runs on the thread that builds the communicator. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"

/* Connections proving the token at once, at most: a new one past this
 * closes the oldest that has sent nothing (else the oldest), so strangers
 * cannot use up the descriptors. A real peer sends its hello as soon as it
 * connects, so it is never the one that has sent nothing for long. */
#define MAX_PENDING 64

typedef struct {
  int fd;
  uint64_t order;     /* accept order: lower is older */
  char who[32];       /* "1.2.3.4:5678" */
  uint8_t hello[TIDE__AUTH_HELLO_BYTES];
  uint8_t in[TIDE__AUTH_CLIENT_BYTES + sizeof(tide__peer_hello_t)];
  size_t got;
  uint8_t out[TIDE__AUTH_HELLO_BYTES + TIDE__AUTH_PROOF_BYTES];
  size_t out_off, out_len;
  int proved;
} pending_t;

int tide__peer_hello_check(const tide__peer_hello_t *hello, uint64_t ns_hash, int my_rank, int size) {
  if (hello->magic != TIDE__PEER_HELLO_MAGIC || hello->ns_hash != ns_hash || hello->rank <= my_rank ||
      hello->rank >= size)
    return TIDE_EPROTO;
  return 0;
}

static void refuse(pending_t *p, const char *why) {
  static tide__ratelimit_t limit;
  TIDE_WARN_RATELIMITED(&limit, "refused a connection from %s: %s", p->who, why);
  close(p->fd);
  p->fd = -1;
}

/* Sends what is queued; 0, or TIDE_EPEER when the peer went away. */
static int flush(pending_t *p) {
  while (p->out_off < p->out_len) {
    ssize_t n = send(p->fd, p->out + p->out_off, p->out_len - p->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p->out_off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return TIDE_EPEER;
  }
  p->out_off = p->out_len = 0;
  return 0;
}

static void queue(pending_t *p, const void *bytes, size_t len) {
  memcpy(p->out + p->out_len, bytes, len);
  p->out_len += len;
}

/* Reads what has arrived, no more than the handshake and hello (data
 * behind them belongs to the channel). 0, or TIDE_EPEER on close. */
static int receive(pending_t *p) {
  size_t want = (p->proved ? sizeof p->in : TIDE__AUTH_CLIENT_BYTES) - p->got;
  while (want > 0) {
    ssize_t n = recv(p->fd, p->in + p->got, want, MSG_DONTWAIT);
    if (n > 0) {
      p->got += (size_t)n;
      want -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return TIDE_EPEER;
  }
  return 0;
}

/* Moves one connection on. Returns the peer's rank once it has proved the
 * token and named itself (the connection is then handed over), -1 while it
 * is in progress or after it was refused (fd -1). */
static int advance(tide_comm_t *comm, pending_t *p, const tide__transport_ops_t *const *by_socket, uint64_t ns_hash) {
  if (flush(p) != 0 || receive(p) != 0) {
    refuse(p, p->proved ? "closed before naming its rank" : "closed during the job-token handshake");
    return -1;
  }
  if (!p->proved) {
    uint8_t answer[TIDE__AUTH_PROOF_BYTES];
    const char *why = "";
    int rc = tide__auth_server_check(p->hello, comm->token, p->in, p->got, answer, &why);
    if (rc == 0) return -1;
    if (rc < 0) {
      if (rc == TIDE_EAUTH) { /* so that it reports a refusal, not a lost peer */
        memset(answer, 0, sizeof answer);
        queue(p, answer, sizeof answer);
        flush(p);
      }
      refuse(p, why);
      return -1;
    }
    p->proved = 1;
    queue(p, answer, sizeof answer);
    if (flush(p) != 0 || receive(p) != 0) {
      refuse(p, "closed before naming its rank");
      return -1;
    }
  }
  if (p->got < sizeof p->in || p->out_len > 0) return -1;
  tide__peer_hello_t hello;
  memcpy(&hello, p->in + TIDE__AUTH_CLIENT_BYTES, sizeof hello);
  if (tide__peer_hello_check(&hello, ns_hash, comm->rank, comm->size) != 0 || by_socket[hello.rank] == NULL ||
      comm->chans[hello.rank].ops != NULL) {
    char why[160];
    snprintf(why, sizeof why, "it proved the token but its hello (rank %d, communicator %016llx) is not one rank %d "
             "expects", (int)hello.rank, (unsigned long long)hello.ns_hash, comm->rank);
    refuse(p, why);
    return -1;
  }
  return hello.rank;
}

/* Closes the oldest connection that has sent nothing, else the oldest.
 * Connections are accepted one per turn of the loop, which reads every
 * readable one first, so a peer whose hello has arrived is not taken for
 * silent. */
static void evict_one(pending_t *pending, int count) {
  int victim = -1, victim_silent = 0;
  for (int i = 0; i < count; i++) {
    pending_t *p = &pending[i];
    if (p->fd < 0) continue;
    int silent = p->got == 0;
    if (victim < 0 || (silent && !victim_silent) ||
        (silent == victim_silent && p->order < pending[victim].order)) {
      victim = i;
      victim_silent = silent;
    }
  }
  if (victim >= 0)
    refuse(&pending[victim], "too many connections are proving the job token at once; closing the oldest");
}

static void accept_one(int listen_fd, pending_t *pending, int *count, uint64_t *order) {
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  int fd = accept4(listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return; /* EAGAIN, a connection reset while queued, EMFILE: poll tells us again */
  int live = 0;
  for (int i = 0; i < *count; i++) live += pending[i].fd >= 0;
  if (live >= MAX_PENDING) evict_one(pending, *count);
  int slot = 0;
  while (slot < *count && pending[slot].fd >= 0) slot++;
  if (slot == *count) (*count)++;
  pending_t *p = &pending[slot];
  memset(p, 0, sizeof *p);
  p->fd = fd;
  p->order = (*order)++;
  char ip[INET_ADDRSTRLEN] = "?";
  if (len >= sizeof sa && sa.sin_family == AF_INET) inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  snprintf(p->who, sizeof p->who, "%s:%d", ip, ntohs(sa.sin_port));
  tide__socket_tune(fd, 1);
  if (tide__auth_server_hello(p->hello) != 0) {
    refuse(p, "no random bytes for the handshake nonce");
    return;
  }
  queue(p, p->hello, sizeof p->hello);
  if (flush(p) != 0) refuse(p, "closed during the job-token handshake");
}

int tide__comm_accept_peers(tide_comm_t *comm, int listen_fd, const tide__transport_ops_t *const *by_socket,
                            uint64_t ns_hash, int64_t deadline_ns) {
  int expected = 0;
  for (int peer = comm->rank + 1; peer < comm->size; peer++) expected += by_socket[peer] != NULL;
  if (expected == 0) return 0;
  /* poll can report a connection that is gone before accept takes it: never block there. */
  if (tide__socket_tune(listen_fd, 1) != 0) return TIDE_EIO;
  pending_t *pending = tide__calloc(MAX_PENDING + 1, sizeof *pending);
  struct pollfd *pfds = tide__calloc(MAX_PENDING + 2, sizeof *pfds);
  int rc = pending == NULL || pfds == NULL ? TIDE_ENOMEM : 0, count = 0;
  uint64_t order = 0;
  while (rc == 0 && expected > 0) {
    pfds[0] = (struct pollfd){listen_fd, POLLIN, 0};
    for (int i = 0; i < count; i++)
      pfds[1 + i] = (struct pollfd){pending[i].fd, (short)(POLLIN | (pending[i].out_len > 0 ? POLLOUT : 0)), 0};
    int n = poll(pfds, (nfds_t)count + 1, tide__ms_left(deadline_ns));
    if (n < 0 && errno != EINTR) {
      rc = TIDE_EIO;
      break;
    }
    if (n == 0 && tide__now_ns() >= deadline_ns) {
      char missing[256] = "";
      size_t at = 0;
      for (int peer = comm->rank + 1; peer < comm->size && at < sizeof missing - 16; peer++)
        if (by_socket[peer] != NULL && comm->chans[peer].ops == NULL)
          at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%d", at ? ", " : "", peer);
      TIDE_ERROR("rank %d waited %lld ms for TCP connections from ranks %s (are they running? can they reach "
                 "this host?)", comm->rank, (long long)comm->timeout_ms, missing);
      rc = TIDE_ETIMEDOUT;
      break;
    }
    for (int i = 0; n > 0 && i < count && expected > 0; i++) {
      if (pending[i].fd < 0 || pfds[1 + i].revents == 0) continue;
      int peer = advance(comm, &pending[i], by_socket, ns_hash);
      if (peer < 0) continue;
      tide__endpoint_t ep = {pending[i].fd, NULL};
      rc = by_socket[peer]->connect(&comm->chans[peer], peer, &ep);
      pending[i].fd = -1; /* the channel owns it, even when set-up failed */
      if (rc != 0) break;
      TIDE_DEBUG("rank %d: rank %d connected from %s", comm->rank, peer, pending[i].who);
      expected--;
    }
    if (rc == 0 && expected > 0 && n > 0 && (pfds[0].revents & POLLIN))
      accept_one(listen_fd, pending, &count, &order);
  }
  for (int i = 0; pending != NULL && i < count; i++)
    if (pending[i].fd >= 0) close(pending[i].fd);
  tide__free(pending);
  tide__free(pfds);
  return rc;
}
