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

#include "core/simd.h"
#include "store/store.h"
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

typedef struct segment segment_t;

struct segment {
  uint8_t *base;
  size_t len;
  int slots;
  size_t ring_bytes;
};

static void segment_close(segment_t *seg);

/* How a send writes into the ring (TIDE_SHM_STORES): memcpy, whose plain
 * stores leave the lines in this core's cache for the peer to take from
 * there (plain, the default), or non-temporal stores, which send them to
 * memory (stream). Plain is the faster where the cores pass lines
 * quickly. On the 2-core AMD EPYC VM of docs/performance.md
 * ("Shared-memory stores") there are spells, seconds to minutes long, in
 * which a 1 MiB allreduce with plain copies takes 8x its time and
 * non-temporal ones make it 5x faster (outside them they make it 2.4x
 * slower); auto is for such a machine. With auto each process times both
 * ways, per byte of whole batches (tide__comm_run; receives included:
 * non-temporal stores are cheap to make, but the peer then reads the lines
 * from memory), in classes of the bytes a batch sends (from
 * STORE_MIN_BYTES up, by factors of 4; smaller batches copy plainly). A
 * way's cost is the least of its last STORE_WINDOW timings (a preempted
 * batch only adds time). A class writes non-temporally only where that
 * costs under half as much (a batch's time is not all a way costs: with a
 * smaller margin they were taken where they made the allreduce slower),
 * and the other way every STORE_TRY-th batch, so that a change of the
 * machine is seen within that many batches. A producer (Adasum's) writes
 * its own way (src/coll/adasum.c, choose_stores), and its bytes are not
 * timed here. The bytes are the same either way, so each rank chooses
 * for itself. */
#define STORE_MIN_BYTES 65536
#define STORE_CLASSES 6
#define STORE_WINDOW 4
#define STORE_TRY 64

typedef struct {
  int64_t ps[2][STORE_WINDOW]; /* picoseconds per byte, plain and non-temporal, the last timings */
  unsigned timed[2];           /* timings of each way so far */
  unsigned batches;
} store_class_t;

/* A rank's host-wide state: its own segment and the local peers' (by
 * local rank; NULL for itself and peers on other transports), and how its
 * sends write into their rings (see above). */
typedef struct {
  segment_t *mine;
  segment_t **peers;
  int slots;
  int stream;          /* this batch's sends: 1 non-temporal, 0 memcpy */
  int klass;           /* this batch's class, or -1: not timed */
  int64_t sent;        /* bytes this batch's sends wrote into rings */
  int pinned;          /* TIDE_SHM_STORES: -1 auto, else the way every send takes (0 plain, 1 stream) */
  store_class_t classes[STORE_CLASSES];
} host_t;

static size_t seg_len(int slots, size_t ring_bytes) {
  return HEADER_BYTES + (size_t)slots * (sizeof(tide__shm_ring_t) + ring_bytes);
}

static tide__shm_ring_t *ring_at(segment_t *seg, int slot) {
  return (tide__shm_ring_t *)(seg->base + HEADER_BYTES +
                              (size_t)slot * (sizeof(tide__shm_ring_t) + seg->ring_bytes));
}

static uint8_t *ring_data(tide__shm_ring_t *ring) { return (uint8_t *)(ring + 1); }

static int map(const char *name, int create, int slots, size_t ring_bytes,
               segment_t **out) {
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
  segment_t *seg = tide__calloc(1, sizeof *seg);
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
    segment_close(seg);
    return TIDE_EIO;
  }
  *out = seg;
  return 0;
}

static int segment_create(const char *name, int slots, size_t ring_bytes,
                             segment_t **out) {
  return map(name, 1, slots, ring_bytes, out);
}

static int segment_open(const char *name, int slots, size_t ring_bytes,
                           segment_t **out) {
  return map(name, 0, slots, ring_bytes, out);
}

static void segment_unlink(const char *name) { shm_unlink(name); }

static void segment_close(segment_t *seg) {
  if (seg == NULL) return;
  munmap(seg->base, seg->len);
  tide__free(seg);
}

static _Atomic uint32_t *bell_of(segment_t *seg) {
  return &((seg_header_t *)seg->base)->bell;
}

static _Atomic uint32_t *sleepers_of(segment_t *seg) {
  return &((seg_header_t *)seg->base)->sleepers;
}

static void chan_init(tide__chan_t *chan, int peer, host_t *host, segment_t *theirs, int me_slot, int peer_slot) {
  segment_t *mine = host->mine;
  memset(chan, 0, sizeof *chan);
  chan->ops = &tide__shm_ops;
  chan->peer = peer;
  chan->fd = -1;
  chan->send_ring = ring_at(theirs, me_slot);
  chan->recv_ring = ring_at(mine, peer_slot);
  chan->ring_bytes = mine->ring_bytes;
  chan->peer_bell = bell_of(theirs);
  chan->peer_sleepers = sleepers_of(theirs);
  chan->host = host;
}

static void ring_bell(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers) {
  atomic_fetch_add_explicit(bell, 1, memory_order_seq_cst);
  if (atomic_load_explicit(sleepers, memory_order_seq_cst) != 0)
    syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

static void bell_wait(segment_t *seg, uint32_t seen, int timeout_ms) {
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
    host_t *host = chan->host;
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
        if (host->stream) tide__copy_stream(data + offset, (const uint8_t *)op->src + op->done, copy);
        else memcpy(data + offset, (const uint8_t *)op->src + op->done, copy);
        host->sent += (int64_t)copy;
      }
      head += n;
      atomic_store_explicit(&ring->head, head, memory_order_release);
      op->done += copy;
      ring_bell(chan->peer_bell, chan->peer_sleepers);
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
      ring_bell(chan->peer_bell, chan->peer_sleepers);
    }
  }
  return 0;
}

static void shm_close(tide__chan_t *chan) {
  chan->send_ring = chan->recv_ring = NULL;
}

static int shm_can_connect(const tide__link_t *link) {
  return link->same_host && link->mpi_comm == NULL && tide__param_int(TIDE__PARAM_SHM) != 0;
}

static void shm_host_close(void *state) {
  host_t *host = state;
  if (host == NULL) return;
  for (int l = 0; host->peers != NULL && l < host->slots; l++) segment_close(host->peers[l]);
  segment_close(host->mine);
  tide__free(host->peers);
  tide__free(host);
}

/* After a failed set-up (a peer died or timed out) the epoch is abandoned
 * and the next one uses names of its own: a local peer killed between
 * creating its segment and unlinking it would leave its name in /dev/shm,
 * so the survivors unlink the names of every local peer (ENOENT when the
 * peer did it itself). The names are ours with the peer's rank. */
static void unlink_peers(const tide__host_setup_t *setup) {
  const char *dash = strrchr(setup->name, '-');
  if (dash == NULL) return;
  int prefix = (int)(dash - setup->name);
  for (int p = 0; p < setup->npeers; p++) {
    char name[300];
    snprintf(name, sizeof name, "%.*s-%d", prefix, setup->name, setup->local_ranks[setup->peers[p]]);
    segment_unlink(name);
  }
}

/* Creates our segment, publishes its name under ns, maps each peer's and
 * connects the channels; then, once every peer has mapped ours, unlinks
 * its name, so a crash later leaves nothing behind in /dev/shm. */
static int shm_host_open(const tide__host_setup_t *setup, tide__chan_t *chans, void **state) {
  size_t ring = (size_t)tide__param_int(TIDE__PARAM_SHM_RING_BYTES) & ~(size_t)63;
  host_t *host = tide__calloc(1, sizeof *host);
  if (host == NULL) return TIDE_ENOMEM;
  *state = host;
  host->pinned = tide__param_enum(TIDE__PARAM_SHM_STORES) - 1; /* auto, plain, stream: -1, 0, 1 */
  host->slots = setup->local_size;
  host->peers = tide__calloc((size_t)setup->local_size, sizeof *host->peers);
  if (host->peers == NULL) return TIDE_ENOMEM;
  char key[220];
  segment_unlink(setup->name); /* a leftover from a killed run */
  TIDE_CHECK(segment_create(setup->name, setup->local_size, ring, &host->mine));
  snprintf(key, sizeof key, "%s/shm/%d", setup->ns, setup->rank);
  int rc = tide_store_set(setup->store, key, setup->name, strlen(setup->name));
  for (int p = 0; rc == 0 && p < setup->npeers; p++) {
    int l = setup->peers[p], peer = setup->local_ranks[l];
    char peer_name[260];
    snprintf(key, sizeof key, "%s/shm/%d", setup->ns, peer);
    rc = tide__store_get_string(setup->store, key, setup->timeout_ms, peer_name, sizeof peer_name);
    if (rc == 0) rc = segment_open(peer_name, setup->local_size, ring, &host->peers[l]);
    if (rc == 0) chan_init(&chans[peer], peer, host, host->peers[l], setup->local_rank, l);
  }
  if (rc == 0) {
    snprintf(key, sizeof key, "%s/mapped/%d", setup->ns, setup->rank);
    rc = tide_store_set(setup->store, key, "1", 1);
  }
  for (int p = 0; rc == 0 && p < setup->npeers; p++) {
    snprintf(key, sizeof key, "%s/mapped/%d", setup->ns, setup->local_ranks[setup->peers[p]]);
    const char *keys[1] = {key};
    rc = tide_store_wait(setup->store, keys, 1, setup->timeout_ms);
  }
  segment_unlink(setup->name);
  if (rc != 0) unlink_peers(setup);
  return rc;
}

static void shm_wait_source(const tide__chan_t *chan, const tide__p2p_t *op, tide__wait_t *out) {
  (void)chan;
  (void)op;
  *out = (tide__wait_t){TIDE__WAIT_BELL, -1, 0};
}

static int64_t least(const store_class_t *c, int way) {
  unsigned n = c->timed[way] < STORE_WINDOW ? c->timed[way] : STORE_WINDOW;
  int64_t m = c->ps[way][0];
  for (unsigned i = 1; i < n; i++)
    if (c->ps[way][i] < m) m = c->ps[way][i];
  return m;
}

/* Chooses this batch's way; 1 when it is to be timed. */
static int shm_batch_begin(void *state, size_t send_bytes) {
  host_t *host = state;
  host->sent = 0;
  host->stream = host->pinned > 0;
  host->klass = -1;
  if (send_bytes < STORE_MIN_BYTES || host->pinned >= 0) return 0;
  int k = 0;
  for (size_t b = send_bytes / STORE_MIN_BYTES; b >= 4 && k < STORE_CLASSES - 1; b /= 4) k++;
  store_class_t *c = &host->classes[k];
  int best = c->timed[0] == 0 ? 0 : c->timed[1] == 0 ? 1 : 2 * least(c, 1) < least(c, 0);
  host->stream = c->batches++ % STORE_TRY == STORE_TRY - 1 ? !best : best;
  host->klass = k;
  return 1;
}

static void shm_batch_end(void *state, int64_t ns) {
  host_t *host = state;
  if (host->klass < 0 || host->sent < STORE_MIN_BYTES) return;
  store_class_t *c = &host->classes[host->klass];
  int way = host->stream;
  c->ps[way][c->timed[way]++ % STORE_WINDOW] = ns * 1000 / host->sent;
}

static uint32_t shm_bell_read(void *state) {
  return atomic_load(bell_of(((host_t *)state)->mine));
}

static void shm_bell_sleep(void *state, uint32_t seen, int timeout_ms) {
  bell_wait(((host_t *)state)->mine, seen, timeout_ms);
}

static void shm_bell_ring(void *state) {
  segment_t *mine = ((host_t *)state)->mine;
  ring_bell(bell_of(mine), sleepers_of(mine));
}

const tide__transport_ops_t tide__shm_ops = {
    .name = "shm",
    .hands_pieces = 1,
    .can_connect = shm_can_connect,
    .host_open = shm_host_open,
    .host_close = shm_host_close,
    .progress = shm_progress,
    .wait_source = shm_wait_source,
    .bell_read = shm_bell_read,
    .bell_sleep = shm_bell_sleep,
    .bell_ring = shm_bell_ring,
    .batch_begin = shm_batch_begin,
    .batch_end = shm_batch_end,
    .close = shm_close,
};
