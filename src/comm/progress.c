/* The engine that drives a set of point-to-point operations to completion:
 * progress every channel, spin briefly when nothing moves, then sleep on
 * what the channels' transports name (sockets, a doorbell), never past the
 * deadline, and stop as soon as the communicator fails. */
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "comm/comm.h"

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void *tide__comm_scratch(tide_comm_t *comm, size_t bytes) {
  if (bytes == 0) bytes = 64;
  if (bytes > comm->scratch_cap) {
    void *grown = tide__realloc(comm->scratch, bytes);
    if (grown == NULL) return NULL;
    comm->scratch = grown;
    comm->scratch_cap = bytes;
  }
  return comm->scratch;
}

void tide__comm_idle(int64_t idle_since_ns, int left_ms) {
  int64_t idle_ns = tide__now_ns() - idle_since_ns;
  if (idle_ns < 50 * 1000000ll || left_ms <= 0) {
    sched_yield();
    return;
  }
  /* A long wait (a slow rank): test every 100 us instead of spinning. */
  struct timespec ts = {0, 100 * 1000};
  nanosleep(&ts, NULL);
}

/* Gives the watcher up to 200 ms to deliver another rank's failure
 * report; returns the failure it applied, or 0. */
static int wait_for_report(tide_comm_t *comm) {
  int64_t deadline = tide__deadline_after_ms(200);
  for (;;) {
    if (comm->mpi != NULL) tide__mpi_comm_poll(comm);
    if (atomic_load(&comm->abort_seq) != UINT64_MAX) return tide__comm_check(comm, UINT64_MAX - 1);
    int failed = atomic_load(&comm->failed);
    if (failed) return failed;
    int left = tide__ms_left(deadline);
    if (left == 0) return 0;
    if (comm->mpi != NULL) {
      tide__comm_idle(tide__now_ns(), left < 10 ? left : 10);
      continue;
    }
    struct pollfd p = {comm->wake_fd, POLLIN, 0};
    poll(&p, 1, left < 10 ? left : 10);
  }
}

/* An op may start only when no earlier op in the batch on the same
 * channel and direction is unfinished (channels are ordered streams). */
static int blocked(const tide__p2p_t *ops, int i) {
  int sending = ops[i].kind == TIDE__P2P_SEND;
  for (int j = 0; j < i; j++)
    if (ops[j].peer == ops[i].peer && (ops[j].kind == TIDE__P2P_SEND) == sending && ops[j].done < ops[j].bytes)
      return 1;
  return 0;
}

/* A consumer or producer on a transport that moves bytes from src or into
 * dst itself (one whose progress does not hand pieces itself): hands the
 * consumer the whole elements that landed since the last call, or has the
 * producer fill all of src before the first byte goes (TCP and MPI may
 * send any part of src at once). */
static void hand_over(tide__p2p_t *op) {
  size_t upto = op->kind == TIDE__P2P_SEND ? op->bytes : op->done - op->done % tide_dtype_size(op->dtype);
  if (upto <= op->handed) return;
  if (op->kind == TIDE__P2P_SEND) op->produce(op->ctx, op->handed, (uint8_t *)op->src + op->handed, upto - op->handed);
  else op->consume(op->ctx, op->handed, (uint8_t *)op->dst + op->handed, upto - op->handed);
  op->handed = upto;
}

/* A failed batch: a transport may still hold the ops' buffers (MPI does;
 * often the caller's stack frame); take them back before returning. */
static int abandon(tide_comm_t *comm, tide__p2p_t *ops, int n, int rc) {
  for (int i = 0; i < n; i++) {
    tide__chan_t *chan = &comm->chans[ops[i].peer];
    if (chan->ops != NULL && chan->ops->cancel != NULL) chan->ops->cancel(chan);
  }
  return rc;
}

/* The poll set for n ops and the wake-up eventfd, grown as needed: every
 * op waiting on a socket is polled, however many are posted. */
static struct pollfd *poll_set(tide_comm_t *comm, int n) {
  size_t need = (size_t)n + 1;
  if (need > comm->wait_cap) {
    struct pollfd *grown = tide__realloc(comm->wait_fds, need * sizeof *grown);
    if (grown == NULL) return NULL;
    comm->wait_fds = grown;
    comm->wait_cap = need;
  }
  return comm->wait_fds;
}

/* After a sleep that ran to its timeout: whether any op the engine could
 * advance was ready on its socket all along (a wait that overslept its
 * data). Checked op by op, independently of the poll set. */
static int overslept(tide_comm_t *comm, const tide__p2p_t *ops, int n) {
  for (int i = 0; i < n; i++) {
    if (ops[i].done >= ops[i].bytes || blocked(ops, i)) continue;
    tide__chan_t *chan = &comm->chans[ops[i].peer];
    tide__wait_t w;
    chan->ops->wait_source(chan, &ops[i], &w);
    if (w.kind != TIDE__WAIT_FD) continue;
    struct pollfd p = {w.fd, w.events, 0};
    if (poll(&p, 1, 0) > 0) return ops[i].peer + 1;
  }
  return 0;
}

int tide__comm_run(tide_comm_t *comm, tide__p2p_t *ops, int n, const char *what) {
  int64_t deadline = tide__deadline_after_ms(comm->timeout_ms);
  int64_t spin_ns = comm->spin_us * 1000, spin_start = 0;
  int idle = 0;
  struct pollfd *fds = poll_set(comm, n);
  if (fds == NULL) /* fail the communicator, so the peers do not wait for us until their deadline */
    return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: no memory for the poll set of %d operations in %s",
                           comm->rank, n, what);
  int timed = 0;
  if (comm->host_state != NULL && comm->host_ops->batch_begin != NULL) {
    size_t send_bytes = 0;
    for (int i = 0; i < n; i++)
      if (ops[i].kind == TIDE__P2P_SEND) send_bytes += ops[i].bytes;
    timed = comm->host_ops->batch_begin(comm->host_state, send_bytes);
  }
  int64_t began = timed ? tide__now_ns() : 0;
  for (;;) {
    if (comm->mpi != NULL) tide__mpi_comm_poll(comm); /* another rank's failure report */
    int rc = tide__comm_check(comm, comm->seq);
    if (rc == 0 && comm->parent != NULL && (rc = tide__comm_check(comm->parent, comm->parent->seq)) != 0)
      rc = tide__comm_fail(comm, rc, 1, "%s", tide_comm_last_error(comm->parent));
    if (rc) return abandon(comm, ops, n, rc);
    uint32_t bell = comm->host_state != NULL ? comm->host_ops->bell_read(comm->host_state) : 0;
    int progressed = 0, pending = 0, bell_pending = 0, test_pending = 0, nfds = 0, waiting_on = -1;
    for (int i = 0; i < n; i++) {
      tide__p2p_t *op = &ops[i];
      if (op->done >= op->bytes) continue;
      pending++;
      if (blocked(ops, i)) continue;
      tide__chan_t *chan = &comm->chans[op->peer];
      size_t before = op->done;
      int handing = (op->consume != NULL || op->produce != NULL) && !chan->ops->hands_pieces;
      if (handing && op->kind == TIDE__P2P_SEND) hand_over(op);
      rc = chan->ops->progress(chan, op);
      if (rc < 0) {
        /* A peer that failed (a mismatch, a bad argument) closes its
         * connections right after reporting why: prefer its report. */
        int report = wait_for_report(comm);
        if (report) return abandon(comm, ops, n, report);
        return abandon(comm, ops, n,
                       tide__comm_fail(comm, rc == TIDE_EPEER ? TIDE_EPEER : rc, 0,
                                       "rank %d lost its connection to rank %d during %s (that rank died, or "
                                       "destroyed the communicator early): %s",
                                       comm->rank, op->peer, what, tide_strerror(rc)));
      }
      if (handing && op->kind != TIDE__P2P_SEND) hand_over(op);
      if (op->done != before) progressed = 1;
      if (op->done >= op->bytes) {
        pending--;
        continue;
      }
      waiting_on = op->peer;
      tide__wait_t w;
      chan->ops->wait_source(chan, op, &w);
      if (w.kind == TIDE__WAIT_FD)
        fds[nfds++] = (struct pollfd){w.fd, w.events, 0};
      else if (w.kind == TIDE__WAIT_BELL)
        bell_pending++;
      else
        test_pending++;
    }
    if (pending == 0) {
      if (timed) comm->host_ops->batch_end(comm->host_state, tide__now_ns() - began);
      return 0;
    }
    if (progressed) {
      idle = 0;
      continue;
    }
    /* Nothing moved: poll hard for a moment (the peer is usually
     * microseconds away), then keep polling but yield the core (on a busy
     * or oversubscribed machine the peer may need it), then sleep. */
    if (idle++ == 0) spin_start = tide__now_ns();
    if (idle < 128) {
      cpu_relax();
      continue;
    }
    if (tide__now_ns() - spin_start < spin_ns) {
      sched_yield();
      continue;
    }
    int left = tide__ms_left(deadline);
    if (left == 0)
      return abandon(comm, ops, n,
                     tide__comm_fail(comm, TIDE_ETIMEDOUT, 0,
                                     "rank %d timed out after %lld ms in %s waiting for rank %d (a rank is "
                                     "stuck or did not make this call; raise TIDE_TIMEOUT_MS if it is just "
                                     "slow)",
                                     comm->rank, (long long)comm->timeout_ms, what, waiting_on));
    if (test_pending > 0) {
      /* Data moves only inside progress (MPI): keep testing, yield the core. */
      tide__comm_idle(spin_start, left);
    } else if (nfds > 0) {
      fds[nfds] = (struct pollfd){comm->wake_fd, POLLIN, 0};
      int timeout = bell_pending ? 1 : (left < 1000 ? left : 1000);
      int peer;
      if (poll(fds, (nfds_t)nfds + 1, timeout) == 0 && timeout > 1 && (peer = overslept(comm, ops, n)) > 0) {
        comm->overslept++;
        TIDE_WARN("rank %d slept %d ms in %s while rank %d's data was ready", comm->rank, timeout, what, peer - 1);
      }
    } else if (bell_pending > 0) {
      comm->host_ops->bell_sleep(comm->host_state, bell, left < 1000 ? left : 1000);
    } else {
      sched_yield(); /* not reached: an unfinished op that is not blocked always names a wait source */
    }
  }
}
