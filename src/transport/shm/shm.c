/* Shared-memory transport between ranks on one host.
 *
 * Each rank owns a segment holding its doorbell and one inbound ring per
 * local rank. A sender copies into the ring in the receiver's segment and
 * publishes its head; the receiver copies (or reduces) straight out of the
 * ring and publishes its tail. Every message occupies a multiple of 64
 * bytes so elements never straddle the ring's end. Waiters spin briefly,
 * then sleep on their doorbell futex; whoever publishes rings it. */
#include <fcntl.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport/transport.h"

#define SEG_MAGIC 0x746964657368ull /* "tideshm" */
#define HEADER_BYTES 256
#define CHUNK_BYTES (256 * 1024)

struct tide__shm_ring {
  _Atomic uint64_t head; /* written by the sender */
  char pad0[56];
  _Atomic uint64_t tail; /* written by the receiver */
  char pad1[56];
  /* ring data follows */
};

typedef struct {
  uint64_t magic;
  uint64_t ring_bytes;
  uint32_t slots;
  char pad0[44];
  _Atomic uint32_t bell;
  char pad1[60];
  _Atomic uint32_t sleepers;
} seg_header_t;

struct tide__shm_segment {
  uint8_t *base;
  size_t len;
  int slots;
  size_t ring_bytes;
};

static size_t seg_len(int slots, size_t ring_bytes) {
  return HEADER_BYTES + (size_t)slots * (sizeof(tide__shm_ring_t) + ring_bytes);
}

static tide__shm_ring_t *ring_at(tide__shm_segment_t *seg, int slot) {
  return (tide__shm_ring_t *)(seg->base + HEADER_BYTES +
                              (size_t)slot * (sizeof(tide__shm_ring_t) + seg->ring_bytes));
}

static uint8_t *ring_data(tide__shm_ring_t *ring) { return (uint8_t *)(ring + 1); }

static int map(const char *name, int create, int slots, size_t ring_bytes,
               tide__shm_segment_t **out) {
  size_t len = seg_len(slots, ring_bytes);
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) {
    TIDE_ERROR("shm_open(%s): %s", name, strerror(errno));
    return TIDE_EIO;
  }
  if (create) {
    /* Reserve the pages now: a full /dev/shm must fail here, not raise
     * SIGBUS in the middle of a collective. */
    int err = posix_fallocate(fd, 0, (off_t)len);
    if (err != 0) {
      TIDE_ERROR("cannot reserve %zu bytes of shared memory for %s: %s (free space in /dev/shm, "
                 "lower TIDE_SHM_RING_BYTES or set TIDE_SHM=0)",
                 len, name, strerror(err));
      close(fd);
      shm_unlink(name);
      return TIDE_ENOMEM;
    }
  } else {
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != len) {
      TIDE_ERROR("shared memory segment %s has the wrong size", name);
      close(fd);
      return TIDE_EIO;
    }
  }
  /* MAP_POPULATE maps every page now: first touches inside a collective
   * would otherwise cost a page fault per 4 KiB. */
  void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    if (create) shm_unlink(name);
    return TIDE_ENOMEM;
  }
  tide__shm_segment_t *seg = tide__calloc(1, sizeof *seg);
  if (seg == NULL) {
    munmap(base, len);
    return TIDE_ENOMEM;
  }
  seg->base = base;
  seg->len = len;
  seg->slots = slots;
  seg->ring_bytes = ring_bytes;
  seg_header_t *h = (seg_header_t *)base;
  if (create) {
    h->ring_bytes = ring_bytes;
    h->slots = (uint32_t)slots;
    atomic_store(&h->bell, 0);
    atomic_store(&h->sleepers, 0);
    h->magic = SEG_MAGIC;
  } else if (h->magic != SEG_MAGIC || h->slots != (uint32_t)slots || h->ring_bytes != ring_bytes) {
    TIDE_ERROR("shared memory segment %s does not match this job's layout", name);
    tide__shm_segment_close(seg);
    return TIDE_EIO;
  }
  *out = seg;
  return 0;
}

int tide__shm_segment_create(const char *name, int slots, size_t ring_bytes,
                             tide__shm_segment_t **out) {
  return map(name, 1, slots, ring_bytes, out);
}

int tide__shm_segment_open(const char *name, int slots, size_t ring_bytes,
                           tide__shm_segment_t **out) {
  return map(name, 0, slots, ring_bytes, out);
}

void tide__shm_segment_unlink(const char *name) { shm_unlink(name); }

void tide__shm_segment_close(tide__shm_segment_t *seg) {
  if (seg == NULL) return;
  munmap(seg->base, seg->len);
  tide__free(seg);
}

_Atomic uint32_t *tide__shm_bell(tide__shm_segment_t *seg) {
  return &((seg_header_t *)seg->base)->bell;
}

_Atomic uint32_t *tide__shm_sleepers(tide__shm_segment_t *seg) {
  return &((seg_header_t *)seg->base)->sleepers;
}

void tide__shm_chan_init(tide__chan_t *chan, int peer, tide__shm_segment_t *mine,
                         tide__shm_segment_t *theirs, int me_slot, int peer_slot) {
  memset(chan, 0, sizeof *chan);
  chan->ops = &tide__shm_ops;
  chan->peer = peer;
  chan->fd = -1;
  chan->send_ring = ring_at(theirs, me_slot);
  chan->recv_ring = ring_at(mine, peer_slot);
  chan->ring_bytes = mine->ring_bytes;
  chan->peer_bell = tide__shm_bell(theirs);
  chan->peer_sleepers = tide__shm_sleepers(theirs);
}

void tide__shm_ring_bell(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers) {
  atomic_fetch_add_explicit(bell, 1, memory_order_seq_cst);
  if (atomic_load_explicit(sleepers, memory_order_seq_cst) != 0)
    syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

void tide__shm_wait(tide__shm_segment_t *seg, uint32_t seen, int timeout_ms) {
  seg_header_t *h = (seg_header_t *)seg->base;
  atomic_fetch_add_explicit(&h->sleepers, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&h->bell, memory_order_seq_cst) == seen) {
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000};
    syscall(SYS_futex, (uint32_t *)&h->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
  }
  atomic_fetch_sub_explicit(&h->sleepers, 1, memory_order_seq_cst);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t min3(size_t a, size_t b, size_t c) {
  size_t m = a < b ? a : b;
  return m < c ? m : c;
}

static int shm_progress(tide__chan_t *chan, tide__p2p_t *op) {
  const size_t size = chan->ring_bytes;
  const size_t footprint = align64(op->bytes);
  if (op->kind == TIDE__P2P_SEND) {
    tide__shm_ring_t *ring = chan->send_ring;
    uint8_t *data = ring_data(ring);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    while (op->done < op->bytes) {
      uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_acquire);
      size_t space = size - (size_t)(head - tail);
      size_t offset = (size_t)(head % size);
      size_t n = min3(footprint - op->done, space, size - offset);
      if (n > CHUNK_BYTES) n = CHUNK_BYTES;
      if (n == 0) break;
      size_t copy = op->bytes - op->done < n ? op->bytes - op->done : n;
      if (op->produce != NULL) {
        op->produce(op->ctx, op->done, data + offset, copy);
        op->handed = op->done + copy;
      } else {
        memcpy(data + offset, (const uint8_t *)op->src + op->done, copy);
      }
      head += n;
      atomic_store_explicit(&ring->head, head, memory_order_release);
      op->done += copy;
      tide__shm_ring_bell(chan->peer_bell, chan->peer_sleepers);
      /* A producer computes: one piece per call lets the engine drain the
       * peer's ring between pieces, so neither side waits on a full ring. */
      if (op->produce != NULL) break;
    }
  } else {
    tide__shm_ring_t *ring = chan->recv_ring;
    uint8_t *data = ring_data(ring);
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    size_t esize = tide_dtype_size(op->dtype);
    while (op->done < op->bytes) {
      uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
      size_t offset = (size_t)(tail % size);
      size_t n = min3(footprint - op->done, (size_t)(head - tail), size - offset);
      if (n > CHUNK_BYTES) n = CHUNK_BYTES;
      if (n == 0) break;
      size_t copy = op->bytes - op->done < n ? op->bytes - op->done : n;
      if (op->kind == TIDE__P2P_RECV && op->consume != NULL) {
        op->consume(op->ctx, op->done, data + offset, copy);
        op->handed = op->done + copy;
      } else if (op->kind == TIDE__P2P_RECV) {
        memcpy((uint8_t *)op->dst + op->done, data + offset, copy);
      } else {
        tide__reduce((uint8_t *)op->dst + op->done, (const uint8_t *)op->src + op->done,
                     data + offset, copy / esize, op->dtype, op->op);
      }
      tail += n;
      atomic_store_explicit(&ring->tail, tail, memory_order_release);
      op->done += copy;
      tide__shm_ring_bell(chan->peer_bell, chan->peer_sleepers);
    }
  }
  return 0;
}

static void shm_close(tide__chan_t *chan) {
  chan->send_ring = chan->recv_ring = NULL;
}

const tide__transport_ops_t tide__shm_ops = {"shm", shm_progress, shm_close};
