/* TCP transport: nonblocking sends and receives on one socket per peer.
 * RECV_REDUCE receives into a staging buffer and reduces whole elements
 * out of it, keeping a partial element for the next round. */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/transport.h"

#define STAGE_BYTES (512 * 1024)

static int tcp_can_connect(const tide__link_t *link) { return link->mpi_comm == NULL; }

/* Takes ep->fd, a connected, authenticated socket: the channel owns it
 * from here, even when set-up fails. */
static int tcp_connect(tide__chan_t *chan, int peer, const tide__endpoint_t *ep) {
  memset(chan, 0, sizeof *chan);
  chan->ops = &tide__tcp_ops;
  chan->peer = peer;
  chan->fd = ep->fd;
  int size = 4 << 20;
  setsockopt(chan->fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  setsockopt(chan->fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  return tide__socket_tune(chan->fd, 1);
}

/* Returns bytes moved (>= 0), or TIDE_EPEER. */
static ssize_t io(int fd, int sending, void *buf, size_t len) {
  for (;;) {
    ssize_t n = sending ? send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0 && !sending) return TIDE_EPEER;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return TIDE_EPEER;
  }
}

static int tcp_progress(tide__chan_t *chan, tide__p2p_t *op) {
  if (op->kind == TIDE__P2P_SEND) {
    while (op->done < op->bytes) {
      ssize_t n = io(chan->fd, 1, (char *)op->src + op->done, op->bytes - op->done);
      if (n < 0) return (int)n;
      if (n == 0) return 0;
      op->done += (size_t)n;
    }
    return 0;
  }
  if (op->kind == TIDE__P2P_RECV) {
    while (op->done < op->bytes) {
      ssize_t n = io(chan->fd, 0, (char *)op->dst + op->done, op->bytes - op->done);
      if (n < 0) return (int)n;
      if (n == 0) return 0;
      op->done += (size_t)n;
    }
    return 0;
  }
  /* RECV_REDUCE: op->done counts reduced bytes; stage_len bytes wait. */
  size_t esize = tide_dtype_size(op->dtype);
  if (chan->stage == NULL) {
    chan->stage = tide__malloc(STAGE_BYTES);
    if (chan->stage == NULL) return TIDE_ENOMEM;
    chan->stage_cap = STAGE_BYTES;
  }
  while (op->done < op->bytes) {
    size_t want = op->bytes - op->done - chan->stage_len;
    if (want > chan->stage_cap - chan->stage_len) want = chan->stage_cap - chan->stage_len;
    ssize_t n = want > 0 ? io(chan->fd, 0, chan->stage + chan->stage_len, want) : 0;
    if (n < 0) return (int)n;
    chan->stage_len += (size_t)n;
    size_t elems = chan->stage_len / esize;
    if (elems > 0) {
      size_t bytes = elems * esize;
      tide__reduce((char *)op->dst + op->done, (const char *)op->src + op->done, chan->stage,
                   elems, op->dtype, op->op);
      op->done += bytes;
      chan->stage_len -= bytes;
      if (chan->stage_len > 0) memmove(chan->stage, chan->stage + bytes, chan->stage_len);
    }
    if (n == 0) return 0;
  }
  return 0;
}

static void tcp_close(tide__chan_t *chan) {
  if (chan->fd >= 0) close(chan->fd);
  chan->fd = -1;
  tide__free(chan->stage);
  chan->stage = NULL;
}

static void tcp_wait_source(const tide__chan_t *chan, const tide__p2p_t *op, tide__wait_t *out) {
  *out = (tide__wait_t){TIDE__WAIT_FD, chan->fd, op->kind == TIDE__P2P_SEND ? POLLOUT : POLLIN};
}

const tide__transport_ops_t tide__tcp_ops = {
    .name = "tcp",
    .can_connect = tcp_can_connect,
    .connect = tcp_connect,
    .progress = tcp_progress,
    .wait_source = tcp_wait_source,
    .close = tcp_close,
};
