/* The loader: source -> disk cache -> decoded samples in a per-host store
 * split across hosts -> this rank's batches, prefetched (docs/data.md).
 *
 * Ownership: sample i belongs to host i % nodes, at slot i / nodes of that
 * host's store, one shared-memory segment every rank of the host maps. A
 * slot's state (empty, loading, ready, bad, unreadable) is an atomic: the
 * first local rank to need a sample claims it, reads and decodes it, the
 * others wait for it. So the source is read once per sample by its owner
 * host, in the first epoch, and every later epoch comes from memory.
 *
 * A sharded source (index version 2) is owned by shards: shard s belongs to
 * host s % nodes with all its samples, which take that host's slots in
 * shard order (owner_of/slot_of, computed at open). A shard's state is an
 * atomic in the same segment: the local rank that needs one of its samples
 * first claims the whole shard, reads it (one object, one GET), decodes
 * every sample into its slot and marks the shard ready; the others wait for
 * the shard. Each host thus fetches only its own shards, each once.
 *
 * Rounds: round R is the trainer's step R (positions [k*G, k*G + G) of the
 * epoch's permutation, G = ranks x batch, dealt with tide_block). Every rank
 * computes every rank's share, so each knows what to serve and what it will
 * receive: a sample another host owns is sent by the rank of that host with
 * the receiver's local rank (mod that host's size), in one all-to-all per
 * round on the loader's own communicator. Before each round the ranks agree
 * (an allreduce) whether to go on, which is how close stops them together.
 *
 * Threads: the caller's (get/next/stats), one prefetch thread per rank that
 * runs the rounds and owns the loader's communicator, and `threads - 1`
 * decode workers that, with the prefetch thread, read and decode a round's
 * samples in parallel. A bounded queue of `prefetch` rounds sits between
 * the prefetch thread and the caller. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "data/data.h"

enum { EMPTY = 0, LOADING, READY, BAD, UNREADABLE };

typedef struct {
  uint64_t round, epoch;
  size_t count, cap;
  uint64_t *indices;
  uint8_t *pixels;
  int32_t *labels;
  size_t skipped;
  int rc;
  char error[600];
} slot_t;

typedef struct {
  int peer;   /* receiver (serve list) */
  uint64_t index;
} pair_t;

struct tide_loader {
  tide_loader_config_t config;
  char *source_spec, *split, *cache_dir;
  tide_comm_t *comm, *local;
  int rank, size, node, nodes, local_rank;
  int *node_of, *local_of, *node_size, **node_ranks;
  tide__source_t *src;
  tide__cache_t *cache;
  uint64_t n;
  int height, width, channels;
  size_t sample_bytes;

  /* this host's store */
  void *shm;
  size_t shm_bytes;
  uint64_t owned;
  _Atomic uint32_t *state;
  uint8_t *store;
  uint32_t *owner_of;  /* host of sample i */
  uint64_t *slot_of;   /* its slot in that host's store */
  int sharded;
  _Atomic uint32_t *shard_state; /* per shard (indexed by shard number) */
  uint64_t *shard_mark;          /* run_round's: the round + 1 that listed shard s */

  tide_sampler_t *sampler;
  uint64_t sampler_epoch;
  uint64_t global_batch, rounds_per_epoch;

  /* queue */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  slot_t *slots;
  int nslots;
  uint64_t produced, consumed;
  int stop, thread_done, thread_rc;
  int failed; /* a get/next returned an error (bad data, a stuck source): close does not wait on peers */
  pthread_t thread;
  int thread_started;

  /* consumer */
  slot_t *current;
  size_t cursor;

  /* decode workers */
  pthread_t *workers;
  int nworkers, workers_started;
  pthread_mutex_t job_lock;
  pthread_cond_t job_cond, job_done_cond;
  const uint64_t *job;
  int job_shards; /* the job's items are shards, not samples */
  size_t job_count, job_finished;
  _Atomic size_t job_next;
  uint64_t job_id;
  int workers_stop;
  tide__fetcher_t *main_fetcher;

  /* round scratch */
  pair_t *serve;
  size_t serve_cap;
  uint64_t *todo;
  size_t todo_cap;
  uint8_t *sendbuf, *recvbuf;
  size_t send_cap, recv_cap;
  size_t *send_bytes, *send_displs, *recv_bytes, *recv_displs;

  _Atomic uint64_t decoded, bad, remote_samples, remote_bytes;
  double wait_s;
  int64_t wait_deadline_ms;
};

/* ---- the store ----------------------------------------------------------------- */

/* Who owns what: sample i -> host i % nodes, slot i / nodes; in a sharded
 * source, shard s -> host s % nodes, and its samples the next slots there. */
static int ownership(tide_loader_t *l) {
  l->owner_of = tide__malloc((size_t)l->n * sizeof *l->owner_of + 1);
  l->slot_of = tide__malloc((size_t)l->n * sizeof *l->slot_of + 1);
  uint64_t *next = tide__calloc((size_t)l->nodes, sizeof *next);
  if (l->owner_of == NULL || l->slot_of == NULL || next == NULL) {
    tide__free(next);
    return TIDE_ENOMEM;
  }
  l->sharded = l->src->nshards > 0;
  if (l->sharded) {
    for (size_t s = 0; s < l->src->nshards; s++) {
      const tide__shard_t *sh = &l->src->shards[s];
      uint32_t host = (uint32_t)(s % (size_t)l->nodes);
      for (uint64_t i = sh->first; i < sh->first + sh->count; i++) {
        l->owner_of[i] = host;
        l->slot_of[i] = next[host]++;
      }
    }
  } else {
    for (uint64_t i = 0; i < l->n; i++) {
      l->owner_of[i] = (uint32_t)(i % (uint64_t)l->nodes);
      l->slot_of[i] = next[l->owner_of[i]]++;
    }
  }
  l->owned = next[l->node];
  tide__free(next);
  if (l->sharded && (l->shard_mark = tide__calloc(l->src->nshards, sizeof *l->shard_mark)) == NULL)
    return TIDE_ENOMEM;
  return 0;
}

/* Removes the sample stores that ranks killed while creating one left in
 * /dev/shm: a name is /tide-data-PID-NONCE, unlinked by its creator once
 * the host's ranks have mapped it, so one that is still there and whose
 * creator (this user's) is dead is garbage. Run by local rank 0 before it
 * makes its own. */
static void reclaim_stores(void) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, "tide-data-", 10) != 0) continue;
    char *end;
    long pid = strtol(de->d_name + 10, &end, 10);
    struct stat st;
    if (pid <= 0 || *end != '-' || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        st.st_uid != geteuid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
      continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", de->d_name);
    if (shm_unlink(name) == 0)
      TIDE_INFO("data: removed /dev/shm%s, the sample store of a rank that died while creating it", name);
  }
  closedir(d);
}

static int store_create(tide_loader_t *l) {
  TIDE_CHECK(ownership(l));
  size_t states = ((size_t)l->owned * sizeof(uint32_t) + 63) & ~(size_t)63;
  size_t shard_states = l->sharded ? ((l->src->nshards * sizeof(uint32_t) + 63) & ~(size_t)63) : 0;
  l->shm_bytes = states + shard_states + (size_t)l->owned * l->sample_bytes;
  if (l->shm_bytes == 0) l->shm_bytes = 64;
  char name[64] = "";
  int rc = 0, fd = -1;
  if (l->local_rank == 0) {
    reclaim_stores();
    uint64_t nonce;
    tide__random_bytes(&nonce, sizeof nonce);
    snprintf(name, sizeof name, "/tide-data-%d-%016llx", (int)getpid(), (unsigned long long)nonce);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || (errno = posix_fallocate(fd, 0, (off_t)l->shm_bytes)) != 0) {
      TIDE_ERROR("tide_loader_open: cannot make the host's sample store (%zu bytes of shared memory in "
                 "/dev/shm): %s",
                 l->shm_bytes, strerror(errno));
      if (fd >= 0) shm_unlink(name);
      name[0] = '\0';
      rc = TIDE_ENOMEM;
    }
  }
  int lrc = tide_broadcast(l->local, name, sizeof name / 4, TIDE_I32, 0);
  if (lrc < 0) rc = lrc;
  if (rc == 0 && name[0] == '\0') rc = TIDE_ENOMEM;
  if (rc == 0 && l->local_rank != 0) {
    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) rc = TIDE_EIO;
  }
  if (rc == 0) {
    l->shm = mmap(NULL, l->shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (l->shm == MAP_FAILED) {
      l->shm = NULL;
      rc = TIDE_ENOMEM;
    }
  }
  if (fd >= 0) close(fd);
  int barrier = tide_barrier(l->local);
  if (l->local_rank == 0 && name[0] != '\0') shm_unlink(name);
  if (rc == 0) rc = barrier;
  if (rc < 0) return rc;
  l->state = (_Atomic uint32_t *)l->shm;
  if (l->sharded) l->shard_state = (_Atomic uint32_t *)((uint8_t *)l->shm + states);
  l->store = (uint8_t *)l->shm + states + shard_states;
  return 0;
}

/* Reads and decodes sample i (owned by this host) into its slot. */
static void load_sample(tide_loader_t *l, uint64_t i, tide__fetcher_t *f) {
  uint64_t slot = l->slot_of[i];
  uint8_t *out = l->store + slot * l->sample_bytes;
  uint32_t result = READY;
  if (l->src->kind == TIDE__SOURCE_IDX) {
    memcpy(out, l->src->idx_pixels + i * l->sample_bytes, l->sample_bytes);
  } else {
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = tide__source_read(l->src, (size_t)i, l->cache, f, &data, &len);
    if (rc < 0) {
      result = UNREADABLE;
    } else {
      char why[300];
      rc = tide__image_decode(data, len, l->height, l->width, l->channels, out, why, sizeof why);
      if (rc < 0) {
        result = BAD;
        atomic_fetch_add(&l->bad, 1);
        if (l->config.on_bad_sample == TIDE_BAD_SAMPLE_SKIP)
          TIDE_WARN("data: skipping %s/%s: %s", l->src->root, l->src->items[i].path, why);
        else
          TIDE_ERROR("data: %s/%s is corrupt or truncated: %s", l->src->root, l->src->items[i].path, why);
      }
      tide__free(data);
    }
  }
  if (result == READY) atomic_fetch_add(&l->decoded, 1);
  atomic_store_explicit(&l->state[slot], result, memory_order_release);
}

/* Reads shard k (owned by this host) and decodes every sample of it into
 * its slot; then marks the shard READY (or UNREADABLE when it could not be
 * read: its samples are then all UNREADABLE). */
static void load_shard(tide_loader_t *l, uint64_t k, tide__fetcher_t *f) {
  const tide__shard_t *sh = &l->src->shards[k];
  uint8_t *data = NULL;
  size_t len = 0;
  int rc = tide__source_read_shard(l->src, (size_t)k, l->cache, f, &data, &len);
  for (uint64_t i = sh->first; i < sh->first + sh->count; i++) {
    const tide__item_t *it = &l->src->items[i];
    uint32_t result = READY;
    if (rc < 0) {
      result = UNREADABLE;
    } else {
      char why[300];
      uint8_t *out = l->store + l->slot_of[i] * l->sample_bytes;
      if (tide__image_decode(data + it->offset, (size_t)it->size, l->height, l->width, l->channels, out, why,
                             sizeof why) < 0) {
        result = BAD;
        atomic_fetch_add(&l->bad, 1);
        if (l->config.on_bad_sample == TIDE_BAD_SAMPLE_SKIP)
          TIDE_WARN("data: skipping sample %llu (%s) in shard %s/%s (bytes %llu+%llu): %s", (unsigned long long)i,
                    it->path, l->src->root, sh->path, (unsigned long long)it->offset, (unsigned long long)it->size,
                    why);
        else
          TIDE_ERROR("data: sample %llu (%s) in shard %s/%s (bytes %llu+%llu) is corrupt or truncated: %s",
                     (unsigned long long)i, it->path, l->src->root, sh->path, (unsigned long long)it->offset,
                     (unsigned long long)it->size, why);
      } else {
        atomic_fetch_add(&l->decoded, 1);
      }
    }
    atomic_store_explicit(&l->state[l->slot_of[i]], result, memory_order_release);
  }
  tide__free(data);
  atomic_store_explicit(&l->shard_state[k], rc < 0 ? UNREADABLE : READY, memory_order_release);
}

/* Waits while *st is LOADING. Its final state, or TIDE_ETIMEDOUT. */
static int wait_loaded(const tide_loader_t *l, _Atomic uint32_t *st) {
  int64_t deadline = tide__deadline_after_ms(l->wait_deadline_ms);
  uint32_t s;
  while ((s = atomic_load_explicit(st, memory_order_acquire)) == LOADING) {
    if (tide__now_ns() > deadline) return TIDE_ETIMEDOUT;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  return (int)s;
}

/* Makes shard k (owned by this host) loaded, or waits for the local rank
 * that claimed it. Its final state, or TIDE_ETIMEDOUT. */
static int ensure_shard(tide_loader_t *l, uint64_t k, tide__fetcher_t *f) {
  _Atomic uint32_t *st = &l->shard_state[k];
  uint32_t expected = EMPTY;
  if (atomic_load_explicit(st, memory_order_acquire) == EMPTY &&
      atomic_compare_exchange_strong(st, &expected, LOADING)) {
    load_shard(l, k, f);
    return (int)atomic_load(st);
  }
  return wait_loaded(l, st);
}

/* Makes sample i (owned by this host) ready, or waits for the local rank
 * that claimed it (or its shard). Returns its final state, or
 * TIDE_ETIMEDOUT. */
static int ensure(tide_loader_t *l, uint64_t i, tide__fetcher_t *f) {
  _Atomic uint32_t *st = &l->state[l->slot_of[i]];
  if (l->sharded) {
    int rc = ensure_shard(l, (uint64_t)l->src->items[i].shard, f);
    return rc < 0 ? rc : (int)atomic_load_explicit(st, memory_order_acquire);
  }
  uint32_t s = atomic_load_explicit(st, memory_order_acquire);
  if (s == EMPTY) {
    uint32_t expected = EMPTY;
    if (atomic_compare_exchange_strong(st, &expected, LOADING)) {
      load_sample(l, i, f);
      return (int)atomic_load(st);
    }
  }
  int64_t deadline = tide__deadline_after_ms(l->wait_deadline_ms);
  while ((s = atomic_load_explicit(st, memory_order_acquire)) == LOADING) {
    if (tide__now_ns() > deadline) return TIDE_ETIMEDOUT;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  return (int)s;
}

/* ---- decode workers ---------------------------------------------------------------- */

static void work(tide_loader_t *l, tide__fetcher_t *f) {
  for (;;) {
    size_t k = atomic_fetch_add(&l->job_next, 1);
    if (k >= l->job_count) break;
    if (l->job_shards) ensure_shard(l, l->job[k], f);
    else ensure(l, l->job[k], f);
    pthread_mutex_lock(&l->job_lock);
    if (++l->job_finished == l->job_count) pthread_cond_broadcast(&l->job_done_cond);
    pthread_mutex_unlock(&l->job_lock);
  }
}

static void *worker_main(void *arg) {
  tide_loader_t *l = arg;
  tide__fetcher_t *f = NULL;
  if (l->src->kind == TIDE__SOURCE_HTTP) tide__fetcher_create(&f);
  uint64_t seen = 0;
  pthread_mutex_lock(&l->job_lock);
  for (;;) {
    while (!l->workers_stop && l->job_id == seen) pthread_cond_wait(&l->job_cond, &l->job_lock);
    if (l->workers_stop) break;
    seen = l->job_id;
    pthread_mutex_unlock(&l->job_lock);
    work(l, f);
    pthread_mutex_lock(&l->job_lock);
  }
  pthread_mutex_unlock(&l->job_lock);
  tide__fetcher_destroy(f);
  return NULL;
}

/* Ensures samples[0..count) (or shards, when shards) with every worker and
 * this thread. */
static void run_job(tide_loader_t *l, const uint64_t *samples, size_t count, int shards) {
  if (count == 0) return;
  pthread_mutex_lock(&l->job_lock);
  l->job = samples;
  l->job_shards = shards;
  l->job_count = count;
  l->job_finished = 0;
  atomic_store(&l->job_next, 0);
  l->job_id++;
  pthread_cond_broadcast(&l->job_cond);
  pthread_mutex_unlock(&l->job_lock);
  work(l, l->main_fetcher);
  pthread_mutex_lock(&l->job_lock);
  while (l->job_finished < l->job_count) pthread_cond_wait(&l->job_done_cond, &l->job_lock);
  pthread_mutex_unlock(&l->job_lock);
}

/* ---- rounds ------------------------------------------------------------------------ */

static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap : 64;
  while (n < need) n *= 2;
  void *p = tide__realloc(*buf, n * elem);
  if (p == NULL) return TIDE_ENOMEM;
  *buf = p;
  *cap = n;
  return 0;
}

static int server_of(const tide_loader_t *l, int receiver, uint64_t i) {
  int m = (int)l->owner_of[i];
  if (m == l->node_of[receiver]) return receiver;
  return l->node_ranks[m][l->local_of[receiver] % l->node_size[m]];
}

static void describe_state(const tide_loader_t *l, uint64_t i, int state, slot_t *s) {
  if (s->rc != 0) return;
  const char *path = l->src->items[i].path != NULL ? l->src->items[i].path : "?";
  char shard[300] = "";
  if (l->sharded)
    snprintf(shard, sizeof shard, " in shard %.180s/%.80s", l->src->root, l->src->shards[l->src->items[i].shard].path);
  if (l->sharded && state == BAD) {
    s->rc = TIDE_EINVAL;
    snprintf(s->error, sizeof s->error,
             "sample %llu (%.100s)%s is a corrupt or truncated image (the log of the rank that decoded it says how); "
             "fix it, or skip bad samples (on_bad_sample = skip, tide-train --on-bad-sample skip)",
             (unsigned long long)i, path, shard);
  } else if (l->sharded) {
    s->rc = state < 0 ? state : TIDE_EIO;
    snprintf(s->error, sizeof s->error, "sample %llu (%.100s)%s could not be read from the source (%s; the log says why)",
             (unsigned long long)i, path, shard, state < 0 ? tide_strerror(state) : "unreadable or not the size the index says");
  } else if (state == BAD) {
    s->rc = TIDE_EINVAL;
    snprintf(s->error, sizeof s->error,
             "sample %llu, %s/%s, is a corrupt or truncated image (the log of the rank that decoded it says how); "
             "fix or remove it, or skip bad samples (on_bad_sample = skip, tide-train --on-bad-sample skip)",
             (unsigned long long)i, l->src->root, path);
  } else {
    s->rc = state < 0 ? state : TIDE_EIO;
    snprintf(s->error, sizeof s->error,
             "sample %llu, %s/%s, could not be read from the source (%s; the log says why)", (unsigned long long)i,
             l->src->root, path, state < 0 ? tide_strerror(state) : "gave up after retries");
  }
}

/* Runs round R into slot s. 0, or a communication failure (fatal). Data
 * errors go into s->rc for the consumer. */
static int run_round(tide_loader_t *l, uint64_t R, slot_t *s) {
  uint64_t epoch = l->config.start_epoch + R / l->rounds_per_epoch, k = R % l->rounds_per_epoch;
  if (epoch != l->sampler_epoch) {
    TIDE_CHECK(tide_sampler_set_epoch(l->sampler, epoch));
    l->sampler_epoch = epoch;
  }
  const uint64_t *order = tide_sampler_order(l->sampler, NULL);
  uint64_t first = k * l->global_batch, left = l->n - first;
  size_t step = (size_t)(left < l->global_batch ? left : l->global_batch);
  size_t sb = l->sample_bytes + 1; /* a state byte, then the pixels */
  s->round = R;
  s->epoch = epoch;
  s->skipped = 0;
  s->rc = 0;
  s->error[0] = '\0';

  /* What this rank serves to others, and what it needs from its own host. */
  size_t nserve = 0, ntodo = 0;
  for (int t = 0; t < l->size; t++) {
    size_t off, len;
    tide_block(step, l->size, t, &off, &len);
    for (size_t j = 0; j < len; j++) {
      uint64_t i = order[first + off + j];
      int server = server_of(l, t, i);
      if (server != l->rank) continue;
      TIDE_CHECK(grow((void **)&l->todo, &l->todo_cap, ntodo + 1, sizeof *l->todo));
      l->todo[ntodo++] = i;
      if (t != l->rank) {
        TIDE_CHECK(grow((void **)&l->serve, &l->serve_cap, nserve + 1, sizeof *l->serve));
        l->serve[nserve++] = (pair_t){t, i};
      }
    }
  }
  if (l->sharded) {
    /* The shards this round needs that nobody on this host has claimed yet:
     * the workers fetch and decode them in parallel, whole. */
    size_t nshards = 0;
    for (size_t j = 0; j < ntodo; j++) {
      uint64_t k = (uint64_t)l->src->items[l->todo[j]].shard;
      if (l->shard_mark[k] == R + 1 || atomic_load_explicit(&l->shard_state[k], memory_order_acquire) != EMPTY)
        continue;
      l->shard_mark[k] = R + 1;
      l->todo[nshards++] = k; /* overwrites entries already read */
    }
    run_job(l, l->todo, nshards, 1);
  } else {
    run_job(l, l->todo, ntodo, 0);
  }

  /* Pack what goes to each peer (serve is in receiver order). */
  memset(l->send_bytes, 0, (size_t)l->size * sizeof(size_t));
  memset(l->recv_bytes, 0, (size_t)l->size * sizeof(size_t));
  TIDE_CHECK(grow((void **)&l->sendbuf, &l->send_cap, nserve * sb + 1, 1));
  for (size_t j = 0; j < nserve; j++) {
    uint64_t i = l->serve[j].index;
    int state = ensure(l, i, l->main_fetcher);
    uint8_t *p = l->sendbuf + j * sb;
    p[0] = (uint8_t)(state < 0 ? UNREADABLE : state);
    if (state == READY)
      memcpy(p + 1, l->store + l->slot_of[i] * l->sample_bytes, l->sample_bytes);
    else
      memset(p + 1, 0, l->sample_bytes);
    l->send_bytes[l->serve[j].peer] += sb;
  }
  size_t off, mine;
  tide_block(step, l->size, l->rank, &off, &mine);
  if (mine > s->cap) {
    uint64_t *ix = tide__realloc(s->indices, mine * sizeof *ix);
    if (ix != NULL) s->indices = ix;
    uint8_t *px = tide__realloc(s->pixels, mine * l->sample_bytes);
    if (px != NULL) s->pixels = px;
    int32_t *lb = tide__realloc(s->labels, mine * sizeof *lb);
    if (lb != NULL) s->labels = lb;
    if (ix == NULL || px == NULL || lb == NULL) return TIDE_ENOMEM;
    s->cap = mine;
  }
  s->count = mine;
  size_t nremote = 0;
  for (size_t j = 0; j < mine; j++) {
    uint64_t i = order[first + off + j];
    s->indices[j] = i;
    int server = server_of(l, l->rank, i);
    if (server != l->rank) {
      l->recv_bytes[server] += sb;
      nremote++;
    }
  }
  size_t total_send = 0, total_recv = 0;
  for (int p = 0; p < l->size; p++) {
    l->send_displs[p] = total_send;
    l->recv_displs[p] = total_recv;
    total_send += l->send_bytes[p];
    total_recv += l->recv_bytes[p];
  }
  TIDE_CHECK(grow((void **)&l->recvbuf, &l->recv_cap, total_recv + 1, 1));
  if (l->size > 1)
    TIDE_CHECK(tide__alltoallv_bytes(l->comm, l->sendbuf, l->send_bytes, l->send_displs, l->recvbuf, l->recv_bytes,
                                     l->recv_displs));
  atomic_fetch_add(&l->remote_samples, nremote);
  atomic_fetch_add(&l->remote_bytes, total_recv);

  /* Assemble this rank's share in order: remote ones in the order each
   * server packed them (position order), local ones from the store. */
  for (int p = 0; p < l->size; p++) l->recv_bytes[p] = l->recv_displs[p]; /* now read cursors */
  for (size_t j = 0; j < mine; j++) {
    uint64_t i = s->indices[j];
    int server = server_of(l, l->rank, i), state;
    const uint8_t *px;
    if (server == l->rank) {
      state = ensure(l, i, l->main_fetcher);
      px = l->store + l->slot_of[i] * l->sample_bytes;
    } else {
      const uint8_t *p = l->recvbuf + l->recv_bytes[server];
      l->recv_bytes[server] += sb;
      state = p[0];
      px = p + 1;
    }
    uint8_t *dst = s->pixels + j * l->sample_bytes;
    s->labels[j] = l->src->items[i].label;
    if (state == READY) {
      memcpy(dst, px, l->sample_bytes);
      continue;
    }
    memset(dst, 0, l->sample_bytes);
    s->labels[j] = -1;
    if (state == BAD && l->config.on_bad_sample == TIDE_BAD_SAMPLE_SKIP)
      s->skipped++;
    else
      describe_state(l, i, state, s);
  }
  return 0;
}

static void *prefetch_main(void *arg) {
  tide_loader_t *l = arg;
  int rc = 0;
  for (uint64_t R = 0;; R++) {
    pthread_mutex_lock(&l->lock);
    while (!l->stop && l->produced - l->consumed >= (uint64_t)l->nslots) pthread_cond_wait(&l->cond, &l->lock);
    int stop = l->stop;
    pthread_mutex_unlock(&l->lock);
    if (l->size > 1) {
      int32_t any = stop;
      rc = tide_allreduce(l->comm, &any, &any, 1, TIDE_I32, TIDE_MAX);
      if (rc < 0) break;
      stop = any;
    }
    if (stop) break;
    slot_t *s = &l->slots[R % (uint64_t)l->nslots];
    rc = run_round(l, R, s);
    if (rc < 0) break;
    pthread_mutex_lock(&l->lock);
    l->produced++;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
  }
  pthread_mutex_lock(&l->lock);
  l->thread_done = 1;
  l->thread_rc = rc;
  pthread_cond_broadcast(&l->cond);
  pthread_mutex_unlock(&l->lock);
  return NULL;
}

/* ---- the public calls ------------------------------------------------------------------ */

void tide_loader_config_default(tide_loader_config_t *out) {
  if (out == NULL) return;
  *out = (tide_loader_config_t){.split = "train", .batch = 64, .seed = 1, .prefetch = 4};
}

static int check_config(const tide_loader_config_t *c) {
  const char *fn = "tide_loader_open";
  if (c->source == NULL || c->source[0] == '\0') {
    TIDE_ERROR("%s: config.source must name a directory, an http(s):// URL or fashion-mnist", fn);
    return TIDE_EINVAL;
  }
  if (c->batch < 1) {
    TIDE_ERROR("%s: config.batch = %d must be > 0 (this rank's samples per step)", fn, c->batch);
    return TIDE_EINVAL;
  }
  if (c->prefetch < 1 || c->prefetch > 1024) {
    TIDE_ERROR("%s: config.prefetch = %d must be in [1, 1024]", fn, c->prefetch);
    return TIDE_EINVAL;
  }
  if (c->threads < 0 || c->threads > 64) {
    TIDE_ERROR("%s: config.threads = %d must be in [0, 64]", fn, c->threads);
    return TIDE_EINVAL;
  }
  if (c->channels != 0 && c->channels != 1 && c->channels != 3) {
    TIDE_ERROR("%s: config.channels = %d must be 0, 1 or 3", fn, c->channels);
    return TIDE_EINVAL;
  }
  if (c->height < 0 || c->width < 0 || c->height > 16384 || c->width > 16384 || (c->height == 0) != (c->width == 0)) {
    TIDE_ERROR("%s: config.height = %d and width = %d must both be 0 or both in [1, 16384]", fn, c->height,
               c->width);
    return TIDE_EINVAL;
  }
  if ((unsigned)c->on_bad_sample > TIDE_BAD_SAMPLE_SKIP) {
    TIDE_ERROR("%s: config.on_bad_sample = %d is not a tide_bad_sample_t", fn, (int)c->on_bad_sample);
    return TIDE_EINVAL;
  }
  return 0;
}

/* The cache directory for the source spec names, or "" (no cache) in dir. */
static void pick_cache(const tide_loader_t *l, tide__source_kind_t kind, char *dir, size_t cap) {
  const char *given = l->config.cache_dir;
  int explicit = 1;
  if (given == NULL || given[0] == '\0') {
    given = tide__param_str(TIDE__PARAM_DATA_CACHE);
    explicit = given[0] != '\0';
  }
  dir[0] = '\0';
  if (strcmp(given, "none") == 0 || kind == TIDE__SOURCE_IDX) return;
  /* A local directory is cached only when asked (it may be a network file
   * system); a URL always. */
  if (!explicit && kind == TIDE__SOURCE_DIR) return;
  if (given[0] != '\0')
    snprintf(dir, cap, "%s", given);
  else
    tide__cache_default_dir(dir, cap);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 1099511628211ULL;
  return h;
}

/* FNV-1a over the listing every rank read: classes, shards, and each
 * sample's name, size, label, shard and offset. */
static uint64_t listing_checksum(const tide__source_t *s) {
  uint64_t h = 1469598103934665603ULL, n[4] = {s->count, s->nclasses, s->nshards, 0};
  h = fnv(h, n, sizeof n);
  for (size_t k = 0; k < s->nclasses; k++) h = fnv(h, s->classes[k], strlen(s->classes[k]) + 1);
  for (size_t k = 0; k < s->nshards; k++) {
    h = fnv(h, s->shards[k].path, strlen(s->shards[k].path) + 1);
    h = fnv(h, &s->shards[k].size, sizeof s->shards[k].size);
  }
  h = fnv(h, s->shape, sizeof s->shape);
  for (size_t i = 0; i < s->count; i++) {
    const tide__item_t *it = &s->items[i];
    uint64_t f[4] = {it->size, (uint64_t)(int64_t)it->label, (uint64_t)it->shard, it->offset};
    if (it->path != NULL) h = fnv(h, it->path, strlen(it->path) + 1);
    h = fnv(h, f, sizeof f);
  }
  return h;
}

/* Every rank must have read the same listing before the store is sized
 * from it: an index republished (or a server that alternates) while the
 * job starts would otherwise give ranks different data sets, or a store
 * sized for fewer samples than a peer indexes into. A disagreement fails
 * every rank with TIDE_EMISMATCH; rank 0 names the ranks that differ. */
static int agree_listing(tide_loader_t *l) {
  int64_t *all = tide__calloc(2 * (size_t)l->size, sizeof *all);
  if (all == NULL) return TIDE_ENOMEM;
  int64_t mine[2] = {(int64_t)listing_checksum(l->src), (int64_t)l->src->count};
  int rc = tide_allgather(l->comm, mine, all, 2, TIDE_I64);
  int differ = 0, first = -1;
  for (int r = 0; rc == 0 && r < l->size; r++)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      differ++;
      if (first < 0) first = r;
    }
  if (rc == 0 && differ > 0) {
    if (l->rank == 0)
      TIDE_ERROR("tide_loader_open: the ranks read different listings of %s: rank 0 has %lld samples (checksum "
                 "%016llx), rank %d has %lld (%016llx), %d of %d ranks differ from rank 0. The index or directory "
                 "changed while the job started (republished, or servers that disagree), or the hosts see "
                 "different files: make the source the same for every rank and start the job again",
                 l->source_spec, (long long)all[1], (unsigned long long)all[0], first, (long long)all[2 * first + 1],
                 (unsigned long long)all[2 * first], differ, l->size);
    rc = TIDE_EMISMATCH;
  }
  tide__free(all);
  return rc;
}

/* Rank 0 reads the first image's shape; everyone takes it. */
static int agree_shape(tide_loader_t *l) {
  int32_t shape[4] = {l->config.height, l->config.width, l->config.channels, 0};
  if (l->src->kind == TIDE__SOURCE_IDX) {
    if ((shape[0] != 0 && (shape[0] != l->src->idx_height || shape[1] != l->src->idx_width)) || shape[2] == 3) {
      TIDE_ERROR("tide_loader_open: Fashion-MNIST is %dx%dx1; leave config.height, width and channels 0",
                 l->src->idx_height, l->src->idx_width);
      return TIDE_EINVAL;
    }
    shape[0] = l->src->idx_height;
    shape[1] = l->src->idx_width;
    shape[2] = 1;
  } else {
    /* a sharded index gives the shape: no object to read for it */
    if (shape[0] == 0 && l->src->shape[0] > 0) shape[0] = l->src->shape[0], shape[1] = l->src->shape[1];
    if (shape[2] == 0 && l->src->shape[2] > 0) shape[2] = l->src->shape[2];
  }
  if (l->src->kind != TIDE__SOURCE_IDX && l->rank == 0 && (shape[0] == 0 || shape[2] == 0)) {
    tide__fetcher_t *f = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    int h = 0, w = 0, c = 0;
    int rc = l->src->kind == TIDE__SOURCE_HTTP ? tide__fetcher_create(&f) : 0;
    if (rc == 0) rc = tide__source_read(l->src, 0, l->cache, f, &data, &len);
    char why[300] = "";
    if (rc == 0) rc = tide__image_probe(data, len, &h, &w, &c, why, sizeof why);
    if (rc < 0 && data != NULL)
      TIDE_ERROR("tide_loader_open: the first image, %s/%s, is not a readable PNG or JPEG: %s (give config.height, "
                 "width and channels to skip the probe)",
                 l->src->root, l->src->items[0].path, why);
    tide__free(data);
    tide__fetcher_destroy(f);
    if (rc < 0) shape[3] = rc;
    if (shape[0] == 0) shape[0] = h, shape[1] = w;
    if (shape[2] == 0) shape[2] = c;
  }
  TIDE_CHECK(tide_broadcast(l->comm, shape, 4, TIDE_I32, 0));
  if (shape[3] < 0) return shape[3];
  l->height = shape[0];
  l->width = shape[1];
  l->channels = shape[2];
  l->sample_bytes = (size_t)l->height * (size_t)l->width * (size_t)l->channels;
  return 0;
}

static int topology(tide_loader_t *l) {
  l->node_of = tide__calloc((size_t)l->size, sizeof(int));
  l->local_of = tide__calloc((size_t)l->size, sizeof(int));
  l->node_size = tide__calloc((size_t)l->size, sizeof(int));
  l->node_ranks = tide__calloc((size_t)l->size, sizeof(int *));
  int32_t *mine = tide__calloc(2 * (size_t)l->size, sizeof(int32_t));
  if (l->node_of == NULL || l->local_of == NULL || l->node_size == NULL || l->node_ranks == NULL || mine == NULL) {
    tide__free(mine);
    return TIDE_ENOMEM;
  }
  int32_t me[2] = {l->node, l->local_rank};
  int rc = tide_allgather(l->comm, me, mine, 2, TIDE_I32);
  for (int r = 0; rc == 0 && r < l->size; r++) {
    l->node_of[r] = mine[2 * r];
    l->local_of[r] = mine[2 * r + 1];
    if (l->node_of[r] < 0 || l->node_of[r] >= l->nodes) rc = TIDE_EINVAL;
    else l->node_size[l->node_of[r]]++;
  }
  for (int m = 0; rc == 0 && m < l->nodes; m++)
    if ((l->node_ranks[m] = tide__calloc((size_t)l->node_size[m] + 1, sizeof(int))) == NULL) rc = TIDE_ENOMEM;
  for (int r = 0; rc == 0 && r < l->size; r++) {
    int m = l->node_of[r];
    if (l->local_of[r] >= l->node_size[m]) rc = TIDE_EINVAL;
    else l->node_ranks[m][l->local_of[r]] = r;
  }
  tide__free(mine);
  return rc;
}

int tide_loader_open(tide_comm_t *comm, const tide_loader_config_t *config, tide_loader_t **out) {
  if (comm == NULL) return tide__null_arg("tide_loader_open", "comm");
  if (config == NULL) return tide__null_arg("tide_loader_open", "config");
  if (out == NULL) return tide__null_arg("tide_loader_open", "out");
  TIDE_CHECK(tide_params_load());
  int bad = check_config(config) < 0, any_bad = bad;
  TIDE_CHECK(tide_allreduce(comm, &bad, &any_bad, 1, TIDE_I32, TIDE_MAX));
  if (any_bad) return TIDE_EINVAL;
  tide_loader_t *l = tide__calloc(1, sizeof *l);
  if (l == NULL) return TIDE_ENOMEM;
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->cond, NULL);
  pthread_mutex_init(&l->job_lock, NULL);
  pthread_cond_init(&l->job_cond, NULL);
  pthread_cond_init(&l->job_done_cond, NULL);
  l->config = *config;
  l->source_spec = tide__strdup(config->source);
  l->split = tide__strdup(config->split != NULL ? config->split : "train");
  l->cache_dir = config->cache_dir != NULL ? tide__strdup(config->cache_dir) : NULL;
  l->config.source = l->source_spec;
  l->config.split = l->split;
  l->config.cache_dir = l->cache_dir;
  if (l->config.threads == 0) l->config.threads = (int)tide__param_int(TIDE__PARAM_DATA_THREADS);
  if (l->config.threads == 0) l->config.threads = 2;
  l->wait_deadline_ms = tide__param_int(TIDE__PARAM_DATA_TIMEOUT_MS) * (tide__param_int(TIDE__PARAM_DATA_RETRIES) + 2) +
                        60000;
  int rc = l->source_spec == NULL || l->split == NULL ? TIDE_ENOMEM : 0;
  if (rc == 0) rc = tide_comm_split(comm, 0, tide_comm_rank(comm), &l->comm);
  if (rc < 0) {
    tide_loader_close(l);
    return rc;
  }
  l->rank = tide_comm_rank(l->comm);
  l->size = tide_comm_size(l->comm);
  l->node = tide_comm_node(l->comm);
  l->nodes = tide_comm_node_count(l->comm);
  l->local_rank = tide_comm_local_rank(l->comm);
  rc = tide_comm_local(l->comm, &l->local);
  if (rc == 0) rc = topology(l);

  /* Every rank opens the cache and the source (a listing; idx files are
   * read whole). */
  char dir[4096] = "";
  int src_rc = rc;
  pick_cache(l, tide__source_kind(l->source_spec), dir, sizeof dir);
  if (src_rc == 0 && dir[0] != '\0') {
    uint64_t bound = (uint64_t)tide__param_int(TIDE__PARAM_DATA_CACHE_BYTES);
    src_rc = tide__cache_open(dir, bound, &l->cache);
  }
  /* A URL with a disk cache: the host's local rank 0 fetches index.txt
   * first and caches it; the other local ranks then revalidate that copy
   * (a 304, no body), so the index crosses the storage link once per host,
   * not once per rank (Fashion-MNIST's sharded index is 2.5 MB). */
  int staged = rc == 0 && dir[0] != '\0' && tide__source_kind(l->source_spec) == TIDE__SOURCE_HTTP && l->local != NULL &&
               tide_comm_size(l->local) > 1;
  if (staged && l->local_rank != 0) rc = tide_barrier(l->local);
  if (rc == 0 && src_rc == 0) src_rc = tide__source_open(l->source_spec, l->split, l->cache, &l->src);
  if (staged && l->local_rank == 0) rc = tide_barrier(l->local);
  if (rc < 0 && src_rc == 0) src_rc = rc;
  int any = src_rc;
  if (rc == 0) rc = tide_allreduce(l->comm, &src_rc, &any, 1, TIDE_I32, TIDE_MIN);
  if (rc == 0) rc = any;
  if (rc == 0) rc = agree_listing(l);
  if (rc == 0) l->n = l->src->count;
  if (rc == 0) rc = agree_shape(l);
  if (rc == 0) rc = store_create(l);
  if (rc == 0) rc = tide_sampler_create(l->n, l->config.seed, 0, 1, &l->sampler);
  if (rc == 0) {
    l->sampler_epoch = 0;
    rc = tide_sampler_set_epoch(l->sampler, l->config.start_epoch);
    l->sampler_epoch = l->config.start_epoch;
  }
  if (rc < 0) {
    tide_loader_close(l);
    return rc;
  }
  l->global_batch = (uint64_t)l->config.batch * (uint64_t)l->size;
  l->rounds_per_epoch = (l->n + l->global_batch - 1) / l->global_batch;
  l->nslots = l->config.prefetch + 1; /* one held by the caller */
  l->slots = tide__calloc((size_t)l->nslots, sizeof *l->slots);
  l->send_bytes = tide__calloc(4 * (size_t)l->size, sizeof(size_t));
  if (l->slots == NULL || l->send_bytes == NULL) {
    tide_loader_close(l);
    return TIDE_ENOMEM;
  }
  l->send_displs = l->send_bytes + l->size;
  l->recv_bytes = l->send_bytes + 2 * l->size;
  l->recv_displs = l->send_bytes + 3 * l->size;
  if (l->src->kind == TIDE__SOURCE_HTTP && tide__fetcher_create(&l->main_fetcher) < 0) {
    tide_loader_close(l);
    return TIDE_ENOMEM;
  }
  l->nworkers = l->config.threads - 1;
  l->workers = tide__calloc((size_t)l->nworkers + 1, sizeof *l->workers);
  for (int w = 0; w < l->nworkers && l->workers != NULL; w++) {
    if (pthread_create(&l->workers[w], NULL, worker_main, l) != 0) break;
    l->workers_started++;
  }
  if (pthread_create(&l->thread, NULL, prefetch_main, l) == 0) l->thread_started = 1;
  if (!l->thread_started) {
    tide_loader_close(l);
    return TIDE_ENOMEM;
  }
  TIDE_INFO("data: %s, %llu samples %dx%dx%d in %zu shards, %d hosts (this one owns %llu, %.1f MiB), cache %s, "
            "%d threads, prefetch %d steps",
            l->source_spec, (unsigned long long)l->n, l->height, l->width, l->channels, l->src->nshards, l->nodes,
            (unsigned long long)l->owned, (double)l->owned * (double)l->sample_bytes / 1048576.0,
            dir[0] ? dir : "none", l->config.threads, l->config.prefetch);
  *out = l;
  return 0;
}

/* After an error on this rank alone, its peers may be in the middle of a
 * step (their prefetch threads waiting for room, their callers in the
 * training's collectives): the prefetch thread then cannot agree with them
 * to stop. close gives it FAILED_CLOSE_MS, and otherwise returns without
 * freeing: the threads keep the loader's memory until the process exits,
 * which is what tells the peers this rank is gone (TIDE_EPEER). */
#define FAILED_CLOSE_MS 1000

void tide_loader_close(tide_loader_t *l) {
  if (l == NULL) return;
  if (l->thread_started) {
    pthread_mutex_lock(&l->lock);
    l->stop = 1;
    pthread_cond_broadcast(&l->cond);
    int64_t deadline = tide__deadline_after_ms(FAILED_CLOSE_MS);
    while (l->failed && !l->thread_done && tide__now_ns() < deadline) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 50000000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&l->cond, &l->lock, &ts);
    }
    int abandon = l->failed && !l->thread_done;
    pthread_mutex_unlock(&l->lock);
    if (abandon) {
      TIDE_WARN("tide_loader_close: after the error above, the other ranks' loaders are mid-step: this rank's "
                "loader is left to the process's exit");
      return;
    }
    pthread_join(l->thread, NULL);
  }
  pthread_mutex_lock(&l->job_lock);
  l->workers_stop = 1;
  pthread_cond_broadcast(&l->job_cond);
  pthread_mutex_unlock(&l->job_lock);
  for (int w = 0; w < l->workers_started; w++) pthread_join(l->workers[w], NULL);
  tide__free(l->workers);
  tide__fetcher_destroy(l->main_fetcher);
  for (int k = 0; l->slots != NULL && k < l->nslots; k++) {
    tide__free(l->slots[k].indices);
    tide__free(l->slots[k].pixels);
    tide__free(l->slots[k].labels);
  }
  tide__free(l->slots);
  tide__free(l->send_bytes);
  tide__free(l->serve);
  tide__free(l->todo);
  tide__free(l->sendbuf);
  tide__free(l->recvbuf);
  if (l->shm != NULL) munmap(l->shm, l->shm_bytes);
  tide__free(l->owner_of);
  tide__free(l->slot_of);
  tide__free(l->shard_mark);
  tide_sampler_destroy(l->sampler);
  tide__cache_close(l->cache);
  tide__source_close(l->src);
  for (int m = 0; l->node_ranks != NULL && m < l->nodes; m++) tide__free(l->node_ranks[m]);
  tide__free(l->node_ranks);
  tide__free(l->node_of);
  tide__free(l->local_of);
  tide__free(l->node_size);
  if (l->comm != NULL) tide_comm_destroy(l->comm);
  tide__free(l->source_spec);
  tide__free(l->split);
  tide__free(l->cache_dir);
  pthread_mutex_destroy(&l->lock);
  pthread_cond_destroy(&l->cond);
  pthread_mutex_destroy(&l->job_lock);
  pthread_cond_destroy(&l->job_cond);
  pthread_cond_destroy(&l->job_done_cond);
  tide__free(l);
}

uint64_t tide_loader_size(const tide_loader_t *l) { return l != NULL ? l->n : 0; }
size_t tide_loader_classes(const tide_loader_t *l) { return l != NULL ? l->src->nclasses : 0; }

int tide_loader_shape(const tide_loader_t *l, int *height, int *width, int *channels) {
  if (l == NULL) return tide__null_arg("tide_loader_shape", "loader");
  if (height != NULL) *height = l->height;
  if (width != NULL) *width = l->width;
  if (channels != NULL) *channels = l->channels;
  return 0;
}

/* Moves the caller to the next prefetched round (releasing the one it
 * held), waiting at most the loader's deadline. */
static int advance(tide_loader_t *l, double *waited) {
  int64_t t0 = tide__now_ns(), deadline = tide__deadline_after_ms(l->wait_deadline_ms);
  pthread_mutex_lock(&l->lock);
  if (l->current != NULL) {
    l->consumed++;
    l->current = NULL;
    pthread_cond_broadcast(&l->cond);
  }
  int rc = 0;
  while (l->produced == l->consumed && !l->thread_done) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&l->cond, &l->lock, &ts);
    if (tide__now_ns() > deadline) {
      rc = TIDE_ETIMEDOUT;
      break;
    }
  }
  if (rc == 0 && l->produced == l->consumed) rc = l->thread_rc < 0 ? l->thread_rc : TIDE_ESTATE;
  if (rc == 0) {
    l->current = &l->slots[l->consumed % (uint64_t)l->nslots];
    l->cursor = 0;
  }
  pthread_mutex_unlock(&l->lock);
  if (rc < 0) l->failed = 1;
  *waited = (double)(tide__now_ns() - t0) * 1e-9;
  l->wait_s += *waited;
  if (rc == TIDE_ETIMEDOUT)
    TIDE_ERROR("data: no batch after %lld ms (TIDE_DATA_TIMEOUT_MS x (TIDE_DATA_RETRIES + 2) + 60 s): the "
               "prefetch thread is stuck reading the source",
               (long long)l->wait_deadline_ms);
  else if (rc < 0)
    TIDE_ERROR("data: the prefetch thread stopped: %s", l->thread_rc < 0 ? tide_strerror(l->thread_rc)
                                                                         : "the loader was closed on another rank");
  return rc;
}

static int deliver(tide_loader_t *l, size_t first, size_t count, double waited, tide_loader_batch_t *out) {
  slot_t *s = l->current;
  if (s->rc != 0) {
    TIDE_ERROR("data: %s", s->error);
    l->failed = 1;
    return s->rc;
  }
  size_t skipped = 0;
  for (size_t j = first; j < first + count; j++) skipped += s->labels[j] < 0;
  *out = (tide_loader_batch_t){.pixels = s->pixels + first * l->sample_bytes, .labels = s->labels + first,
                               .count = count, .sample_bytes = l->sample_bytes, .epoch = s->epoch,
                               .wait_s = waited, .skipped = skipped};
  return 0;
}

int tide_loader_get(tide_loader_t *l, const tide_batch_t *batch, tide_loader_batch_t *out) {
  if (l == NULL) return tide__null_arg("tide_loader_get", "loader");
  if (batch == NULL) return tide__null_arg("tide_loader_get", "batch");
  if (out == NULL) return tide__null_arg("tide_loader_get", "out");
  if (batch->done || (batch->count > 0 && batch->indices == NULL)) {
    TIDE_ERROR("tide_loader_get: batch is %s", batch->done ? "the trainer's done marker" : "without indices");
    return TIDE_EINVAL;
  }
  double waited = 0;
  if (batch->micro == 0 || l->current == NULL) TIDE_CHECK(advance(l, &waited));
  slot_t *s = l->current;
  if (batch->epoch != s->epoch || l->cursor + batch->count > s->count ||
      (batch->count > 0 && memcmp(batch->indices, s->indices + l->cursor, batch->count * sizeof(uint64_t)) != 0)) {
    TIDE_ERROR("tide_loader_get: the trainer's micro-batch (epoch %llu, step %ld, %zu samples) is not the next "
               "one in the loader's plan (epoch %llu, %zu samples per step here): give the loader the trainer's "
               "seed and batch x accum, and no policy that changes the batch",
               (unsigned long long)batch->epoch, batch->step, batch->count, (unsigned long long)s->epoch, s->count);
    return TIDE_ESTATE;
  }
  size_t first = l->cursor;
  l->cursor += batch->count;
  return deliver(l, first, batch->count, waited, out);
}

int tide_loader_next(tide_loader_t *l, tide_loader_batch_t *out) {
  if (l == NULL) return tide__null_arg("tide_loader_next", "loader");
  if (out == NULL) return tide__null_arg("tide_loader_next", "out");
  double waited = 0;
  TIDE_CHECK(advance(l, &waited));
  l->cursor = l->current->count;
  return deliver(l, 0, l->current->count, waited, out);
}

int tide_loader_stats(const tide_loader_t *l, tide_loader_stats_t *out) {
  if (l == NULL) return tide__null_arg("tide_loader_stats", "loader");
  if (out == NULL) return tide__null_arg("tide_loader_stats", "out");
  tide__cache_counts_t c = {0};
  if (l->cache != NULL) tide__cache_counts(l->cache, &c);
  uint64_t ready = 0;
  for (uint64_t k = 0; k < l->owned; k++) ready += atomic_load(&l->state[k]) == READY;
  *out = (tide_loader_stats_t){
      .decoded = atomic_load(&l->decoded),
      .bad = atomic_load(&l->bad),
      .source_bytes = atomic_load(&l->src->source_bytes),
      .source_requests = atomic_load(&l->src->source_requests),
      .retries = atomic_load(&l->src->retries),
      .cache_hits = c.hits,
      .cache_misses = c.misses,
      .cache_bad = c.bad,
      .remote_samples = atomic_load(&l->remote_samples),
      .remote_bytes = atomic_load(&l->remote_bytes),
      .store_bytes = ready * l->sample_bytes,
      .window_bytes = (uint64_t)l->nslots * (uint64_t)l->config.batch * l->sample_bytes,
      .wait_s = l->wait_s,
  };
  return 0;
}
