/* MPI transport: a channel is a peer rank on the communicator's private
 * MPI_Comm (a duplicate of the user's, so tide's messages never match the
 * user's). A message is cut into CHUNK-byte pieces, the same on both sides
 * since both know its length; up to DEPTH pieces are in flight per
 * direction, posted with MPI_Isend / MPI_Irecv and completed in order with
 * MPI_Test, so progress never blocks. RECV_REDUCE receives straight into
 * dst when dst does not overlap the local operand, else into a staging
 * buffer, and reduces each piece as it completes. MPI's non-overtaking
 * order on one (peer, tag) keeps the pieces of consecutive messages
 * matched. */
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "transport/transport.h"

#ifdef TIDE_HAVE_MPI
#include <mpi.h>

/* 4 MiB pieces keep every count far inside an int and, two or more in
 * flight, keep the link busy while a finished piece is reduced. */
#define CHUNK ((size_t)4 << 20)
#define DEPTH 4

typedef struct {
  MPI_Request req;
  size_t off, len;
  uint8_t *land; /* where a received piece lands */
} piece_t;

typedef struct {
  tide__p2p_t *op; /* the message this direction is working on, or NULL */
  size_t posted;   /* bytes handed to MPI */
  int head, count; /* FIFO of pieces in flight */
  int staged;      /* RECV_REDUCE through the staging buffer */
  piece_t piece[DEPTH];
} flow_t;

struct tide__mpi_chan {
  MPI_Comm comm;
  flow_t send, recv;
  uint8_t *stage;
  size_t stage_cap;
};

static pthread_mutex_t mpi_mutex = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int mpi_multiple;

void tide__mpi_set_multiple(int multiple) { atomic_store(&mpi_multiple, multiple != 0); }
int tide__mpi_multiple(void) { return atomic_load(&mpi_multiple); }

void tide__mpi_lock(void) {
  if (!atomic_load_explicit(&mpi_multiple, memory_order_relaxed)) pthread_mutex_lock(&mpi_mutex);
}

void tide__mpi_unlock(void) {
  if (!atomic_load_explicit(&mpi_multiple, memory_order_relaxed)) pthread_mutex_unlock(&mpi_mutex);
}

static int mpi_connect(tide__chan_t *chan, int peer, const tide__endpoint_t *ep) {
  memset(chan, 0, sizeof *chan);
  chan->ops = &tide__mpi_ops;
  chan->peer = peer;
  chan->fd = -1;
  chan->mpi = tide__calloc(1, sizeof *chan->mpi);
  if (chan->mpi == NULL) return TIDE_ENOMEM;
  chan->mpi->comm = *(const MPI_Comm *)ep->mpi_comm;
  return 0;
}

static int mpi_failed(const tide__chan_t *chan, const char *call, int err) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(err, text, &len);
  TIDE_ERROR("%s with rank %d failed: %s", call, chan->peer, text);
  return TIDE_EPEER;
}

static int overlaps(const void *a, const void *b, size_t bytes) {
  const uint8_t *x = a, *y = b;
  return x < y + bytes && y < x + bytes;
}

/* Sets up a direction for a new message: for a staged reduction, a buffer
 * for DEPTH pieces (or the whole message when it is smaller). */
static int flow_start(tide__mpi_chan_t *st, flow_t *flow, tide__p2p_t *op) {
  memset(flow, 0, sizeof *flow);
  flow->op = op;
  if (op->kind != TIDE__P2P_RECV_REDUCE || !overlaps(op->src, op->dst, op->bytes)) return 0;
  flow->staged = 1;
  size_t need = op->bytes < DEPTH * CHUNK ? op->bytes : DEPTH * CHUNK;
  if (need > st->stage_cap) {
    tide__free(st->stage);
    st->stage_cap = 0;
    st->stage = tide__malloc(need);
    if (st->stage == NULL) return TIDE_ENOMEM;
    st->stage_cap = need;
  }
  return 0;
}

static int post(tide__chan_t *chan, flow_t *flow) {
  tide__p2p_t *op = flow->op;
  while (flow->count < DEPTH && flow->posted < op->bytes) {
    int slot = (flow->head + flow->count) % DEPTH;
    piece_t *p = &flow->piece[slot];
    p->off = flow->posted;
    p->len = op->bytes - p->off < CHUNK ? op->bytes - p->off : CHUNK;
    int err;
    if (op->kind == TIDE__P2P_SEND) {
      err = MPI_Isend((const uint8_t *)op->src + p->off, (int)p->len, MPI_BYTE, chan->peer, TIDE__MPI_TAG_DATA,
                      chan->mpi->comm, &p->req);
    } else {
      p->land = flow->staged ? chan->mpi->stage + (size_t)slot * CHUNK : (uint8_t *)op->dst + p->off;
      err = MPI_Irecv(p->land, (int)p->len, MPI_BYTE, chan->peer, TIDE__MPI_TAG_DATA, chan->mpi->comm, &p->req);
    }
    if (err != MPI_SUCCESS) return mpi_failed(chan, op->kind == TIDE__P2P_SEND ? "MPI_Isend" : "MPI_Irecv", err);
    flow->posted += p->len;
    flow->count++;
  }
  return 0;
}

static int mpi_progress(tide__chan_t *chan, tide__p2p_t *op) {
  tide__mpi_chan_t *st = chan->mpi;
  flow_t *flow = op->kind == TIDE__P2P_SEND ? &st->send : &st->recv;
  if (flow->op != op) {
    /* The engine finishes one message per direction before the next. */
    if (flow->op != NULL && flow->count > 0) return TIDE_EPROTO;
    TIDE_CHECK(flow_start(st, flow, op));
  }
  int rc = 0;
  while (rc == 0) {
    tide__mpi_lock();
    rc = post(chan, flow);
    int done = 0;
    piece_t *p = &flow->piece[flow->head];
    if (rc == 0 && flow->count > 0) {
      int err = MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
      if (err != MPI_SUCCESS) rc = mpi_failed(chan, "MPI_Test", err);
    }
    tide__mpi_unlock();
    if (rc != 0 || !done) break;
    if (op->kind == TIDE__P2P_RECV_REDUCE) {
      size_t esize = tide_dtype_size(op->dtype);
      tide__reduce((uint8_t *)op->dst + p->off, (const uint8_t *)op->src + p->off, p->land, p->len / esize,
                   op->dtype, op->op);
    }
    op->done += p->len;
    flow->head = (flow->head + 1) % DEPTH;
    flow->count--;
    if (op->done >= op->bytes) {
      flow->op = NULL;
      break;
    }
  }
  return rc;
}

/* A failed batch leaves pieces in flight that point into the caller's
 * buffers (often stack frames about to go away): cancel them (receives
 * surely; sends where MPI can) and give them a short time to finish; what
 * still will not finish is handed over to MPI (MPI_Request_free). */
static void flow_abandon(flow_t *flow) {
  if (flow->count > 0) {
    for (int i = 0; i < flow->count; i++) {
      piece_t *p = &flow->piece[(flow->head + i) % DEPTH];
      int done = 0;
      MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
      if (!done) MPI_Cancel(&p->req);
    }
    int64_t deadline = tide__deadline_after_ms(100);
    for (int i = 0; i < flow->count; i++) {
      piece_t *p = &flow->piece[(flow->head + i) % DEPTH];
      int done = 0;
      while (p->req != MPI_REQUEST_NULL && MPI_Test(&p->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
             tide__ms_left(deadline) > 0)
        sched_yield();
      if (p->req != MPI_REQUEST_NULL && !done) {
        TIDE_WARN("an MPI %s with rank %d could not be cancelled; MPI may still access its buffer",
                  flow->op->kind == TIDE__P2P_SEND ? "send" : "receive", flow->op->peer);
        MPI_Request_free(&p->req);
      }
    }
  }
  memset(flow, 0, sizeof *flow);
}

/* The pieces still in flight after a failed batch: MPI holds the ops'
 * buffers, unlike tcp and shm once progress returns. */
static void mpi_cancel(tide__chan_t *chan) {
  tide__mpi_chan_t *st = chan->mpi;
  if (st == NULL || (st->send.count == 0 && st->recv.count == 0)) {
    if (st != NULL) st->send.op = st->recv.op = NULL;
    return;
  }
  tide__mpi_lock();
  flow_abandon(&st->send);
  flow_abandon(&st->recv);
  tide__mpi_unlock();
}

static void mpi_close(tide__chan_t *chan) {
  tide__mpi_chan_t *st = chan->mpi;
  if (st == NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) mpi_cancel(chan);
  tide__free(st->stage);
  tide__free(st);
  chan->mpi = NULL;
}

#else /* no MPI in this build */

void tide__mpi_set_multiple(int multiple) { (void)multiple; }
int tide__mpi_multiple(void) { return 0; }
void tide__mpi_lock(void) {}
void tide__mpi_unlock(void) {}

static int mpi_connect(tide__chan_t *chan, int peer, const tide__endpoint_t *ep) {
  (void)chan;
  (void)peer;
  (void)ep;
  return TIDE_ENOSYS;
}

static int mpi_progress(tide__chan_t *chan, tide__p2p_t *op) {
  (void)chan;
  (void)op;
  return TIDE_ENOSYS;
}

static void mpi_close(tide__chan_t *chan) { (void)chan; }
static void mpi_cancel(tide__chan_t *chan) { (void)chan; }

#endif

static int mpi_can_connect(const tide__link_t *link) { return link->mpi_comm != NULL; }

/* MPI moves data only inside its calls: nothing to sleep on. */
static void mpi_wait_source(const tide__chan_t *chan, const tide__p2p_t *op, tide__wait_t *out) {
  (void)chan;
  (void)op;
  *out = (tide__wait_t){TIDE__WAIT_TEST, -1, 0};
}

const tide__transport_ops_t tide__mpi_ops = {
    .name = "mpi",
    .can_connect = mpi_can_connect,
    .connect = mpi_connect,
    .progress = mpi_progress,
    .wait_source = mpi_wait_source,
    .cancel = mpi_cancel,
    .close = mpi_close,
};
