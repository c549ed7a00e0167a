/* The data pipeline: decoders (PNG, JPEG, corrupt and truncated files), the
 * disk cache (checksums, refetch, LRU bound, two processes at once), the
 * loader over a directory and over HTTP (a small server in this process:
 * bytes counted at the server, 503s retried, a stalled server and a missing
 * object fail with a message instead of hanging), one and two emulated hosts
 * (every sample decoded once in the whole job), the trainer's data_s;
 * sharded sets (index version 2): the index round trip, the same samples in
 * the same order as the per-file layout, one request per shard, each host
 * fetching only its own shards, a corrupt sample in a shard, a truncated
 * shard, a damaged shard in the cache. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jpeglib.h>

#include "core/core.h"
#include "data/data.h"
#include "harness.h"

#define H 6
#define W 8
#define N 240
#define CLASSES 3

static char root[256];

static void fill(int id, uint8_t *px) {
  for (int p = 0; p < H * W; p++) px[p] = (uint8_t)(id * 7 + p * 13);
  px[0] = (uint8_t)(id & 255);
  px[1] = (uint8_t)(id >> 8);
}

static int sample_id(const uint8_t *px) { return px[0] | px[1] << 8; }

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, len, f) == len);
  CHECK(fclose(f) == 0);
}

/* N images, id -> class id % CLASSES, file c<k>/<id>.png. */
static void make_folder(const char *dir) {
  char path[512];
  mkdir(dir, 0777);
  for (int k = 0; k < CLASSES; k++) {
    snprintf(path, sizeof path, "%s/c%d", dir, k);
    mkdir(path, 0777);
  }
  for (int id = 0; id < N; id++) {
    uint8_t px[H * W], *png;
    size_t len;
    fill(id, px);
    CHECK_OK(tide__png_encode(px, H, W, 1, &png, &len));
    snprintf(path, sizeof path, "%s/c%d/%04d.png", dir, id % CLASSES, id);
    write_file(path, png, len);
    tide__free(png);
  }
  tide__source_t *src;
  CHECK_OK(tide__source_open(dir, NULL, NULL, &src));
  snprintf(path, sizeof path, "%s/index.txt", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  CHECK_OK(tide__source_write_index(src, f));
  fclose(f);
  tide__source_close(src);
}

static size_t jpeg_encode(const uint8_t *px, int h, int w, uint8_t **out) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned long len = 0;
  *out = NULL;
  jpeg_mem_dest(&c, out, &len);
  c.image_width = (JDIMENSION)w;
  c.image_height = (JDIMENSION)h;
  c.input_components = 1;
  c.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 100, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)(px + c.next_scanline * (size_t)w);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return len;
}

static void test_decode(void) {
  uint8_t px[H * W], out[4 * H * W], *png, *jpg;
  size_t len;
  char why[300];
  fill(77, px);
  CHECK_OK(tide__png_encode(px, H, W, 1, &png, &len));
  int h, w, c;
  CHECK_OK(tide__image_probe(png, len, &h, &w, &c, NULL, 0));
  CHECK(h == H && w == W && c == 1);
  CHECK_OK(tide__image_decode(png, len, H, W, 1, out, why, sizeof why));
  CHECK(memcmp(out, px, sizeof px) == 0);
  /* gray to RGB, and a nearest-neighbour resize to twice the size */
  CHECK_OK(tide__image_decode(png, len, H, W, 3, out, why, sizeof why));
  CHECK(out[3 * 5] == px[5] && out[3 * 5 + 2] == px[5]);
  CHECK_OK(tide__image_decode(png, len, 2 * H, 2 * W, 1, out, why, sizeof why));
  CHECK(out[0] == px[0] && out[1] == px[0] && out[2 * W * 2 + 2] == px[W + 1]);
  /* truncated and corrupt */
  CHECK_RC(tide__image_decode(png, len / 2, H, W, 1, out, why, sizeof why), TIDE_EINVAL);
  CHECK(strstr(why, "PNG") != NULL);
  uint8_t junk[64] = "this is not an image";
  CHECK_RC(tide__image_decode(junk, sizeof junk, H, W, 1, out, why, sizeof why), TIDE_EINVAL);
  CHECK(strstr(why, "neither PNG nor JPEG") != NULL);
  tide__free(png);
  /* JPEG: quality 100 gray is close, truncated is an error */
  size_t jlen = jpeg_encode(px, H, W, &jpg);
  CHECK_OK(tide__image_decode(jpg, jlen, H, W, 1, out, why, sizeof why));
  int maxdiff = 0;
  for (int p = 2; p < H * W; p++) maxdiff = abs((int)out[p] - (int)px[p]) > maxdiff ? abs((int)out[p] - (int)px[p]) : maxdiff;
  CHECK(maxdiff < 40);
  CHECK_RC(tide__image_decode(jpg, jlen / 2, H, W, 1, out, why, sizeof why), TIDE_EINVAL);
  CHECK(strstr(why, "JPEG") != NULL);
  free(jpg);
  fprintf(stderr, "decode: PNG exact, JPEG within %d, truncated and junk refused\n", maxdiff);
}

static void test_cache(void) {
  char dir[300], path[600];
  snprintf(dir, sizeof dir, "%s/cache", root);
  tide__cache_t *c;
  CHECK_OK(tide__cache_open(dir, 0, &c));
  uint8_t *data;
  size_t len;
  CHECK_RC(tide__cache_get(c, "k1", &data, &len), TIDE_ENOENT);
  CHECK_OK(tide__cache_put(c, "k1", "hello", 5));
  CHECK_OK(tide__cache_get(c, "k1", &data, &len));
  CHECK(len == 5 && memcmp(data, "hello", 5) == 0);
  tide__free(data);
  /* corrupt the entry's payload: refused, removed, counted */
  char cmd[900];
  snprintf(cmd, sizeof cmd, "f=$(ls %s/objects/* | head -1); printf X | dd of=$f bs=1 seek=$(( $(stat -c %%s $f) - 1 )) conv=notrunc 2>/dev/null", dir);
  CHECK(system(cmd) == 0);
  CHECK_RC(tide__cache_get(c, "k1", &data, &len), TIDE_ENOENT);
  tide__cache_counts_t k;
  tide__cache_counts(c, &k);
  CHECK(k.bad == 1 && k.hits == 1);
  /* a truncated entry (a killed writer could not leave one, but a disk could) */
  CHECK_OK(tide__cache_put(c, "k2", "0123456789", 10));
  snprintf(cmd, sizeof cmd, "for f in %s/objects/*; do truncate -s -3 $f; done", dir);
  CHECK(system(cmd) == 0);
  CHECK_RC(tide__cache_get(c, "k2", &data, &len), TIDE_ENOENT);
  tide__cache_close(c);
  /* LRU: a 3000-byte bound keeps the recently used entries */
  CHECK_OK(tide__cache_open(dir, 3000, &c));
  char value[500];
  memset(value, 'v', sizeof value);
  for (int i = 0; i < 20; i++) {
    char key[32];
    snprintf(key, sizeof key, "lru%d", i);
    CHECK_OK(tide__cache_put(c, key, value, sizeof value));
    /* keep lru0 warm */
    if (tide__cache_get(c, "lru0", &data, &len) == 0) tide__free(data);
    usleep(2000);
  }
  CHECK_OK(tide__cache_get(c, "lru0", &data, &len));
  tide__free(data);
  CHECK_RC(tide__cache_get(c, "lru1", &data, &len), TIDE_ENOENT);
  CHECK_OK(tide__cache_get(c, "lru19", &data, &len));
  tide__free(data);
  tide__cache_counts(c, &k);
  CHECK(k.evicted > 0);
  tide__cache_close(c);
  snprintf(path, sizeof path, "%s/stats", dir);
  CHECK(access(path, R_OK) == 0);
  /* two processes writing and reading the same keys at once */
  pid_t pids[2];
  for (int p = 0; p < 2; p++) {
    if ((pids[p] = fork()) == 0) {
      tide__cache_t *cc;
      if (tide__cache_open(dir, 20000, &cc) != 0) _exit(1);
      for (int i = 0; i < 300; i++) {
        char key[32], v[300];
        snprintf(key, sizeof key, "shared%d", i % 40);
        memset(v, 'a' + i % 20, sizeof v);
        if (tide__cache_put(cc, key, v, sizeof v) != 0) _exit(2);
        uint8_t *d;
        size_t l;
        if (tide__cache_get(cc, key, &d, &l) == 0) {
          if (l != sizeof v || d[0] != v[0] || d[l - 1] != v[0]) {
            fprintf(stderr, "key %s len %zu d0 %c v0 %c\n", key, l, d[0], v[0]);
            _exit(3);
          }
          tide__free(d);
        }
      }
      tide__cache_close(cc);
      _exit(0);
    }
  }
  for (int p = 0; p < 2; p++) {
    int st;
    CHECK(waitpid(pids[p], &st, 0) == pids[p]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fprintf(stderr, "writer %d: status %d\n", p, st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  tide_data_cache_stats_t cs;
  CHECK_OK(tide_data_cache_stats(dir, &cs));
  CHECK(cs.entries > 0 && cs.bytes > 0 && cs.hits + cs.misses > 0);
  fprintf(stderr, "cache: checksums, truncation, LRU bound, two processes\n");
}

/* ---- a small HTTP server: counts body bytes, can fail or stall -------------- */

static int http_port;
static _Atomic long http_bytes, http_requests, http_shard_requests, http_index_bodies;
static _Atomic int http_fail_next; /* answer this many requests with 503 */
static _Atomic int http_stall;     /* accept, read, never answer */
static char http_root[512];

static void *http_conn(void *arg) {
  int fd = (int)(intptr_t)arg;
  char req[2048];
  size_t got = 0;
  while (got < sizeof req - 1) {
    ssize_t r = recv(fd, req + got, sizeof req - 1 - got, 0);
    if (r <= 0) break;
    got += (size_t)r;
    req[got] = '\0';
    if (strstr(req, "\r\n\r\n") != NULL) break;
  }
  req[got] = '\0';
  atomic_fetch_add(&http_requests, 1);
  if (atomic_load(&http_stall)) {
    sleep(30);
    close(fd);
    return NULL;
  }
  char path[1024] = "", file[1600], head[256];
  sscanf(req, "GET %1000s", path);
  if (strstr(path, "/shards/") != NULL) atomic_fetch_add(&http_shard_requests, 1);
  if (atomic_load(&http_fail_next) > 0) {
    atomic_fetch_sub(&http_fail_next, 1);
    const char *r = "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    send(fd, r, strlen(r), MSG_NOSIGNAL);
    close(fd);
    return NULL;
  }
  if (strstr(req, "If-None-Match: \"v1\"") != NULL) {
    const char *r = "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n";
    send(fd, r, strlen(r), MSG_NOSIGNAL);
    close(fd);
    return NULL;
  }
  snprintf(file, sizeof file, "%s%s", http_root, path);
  FILE *f = strstr(path, "..") == NULL ? fopen(file, "rb") : NULL;
  if (f == NULL) {
    const char *r = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    send(fd, r, strlen(r), MSG_NOSIGNAL);
    close(fd);
    return NULL;
  }
  char *body = malloc(1 << 20);
  size_t n = fread(body, 1, 1 << 20, f);
  fclose(f);
  int hl = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n", n);
  send(fd, head, (size_t)hl, MSG_NOSIGNAL);
  send(fd, body, n, MSG_NOSIGNAL);
  if (strstr(path, "index.txt") != NULL) atomic_fetch_add(&http_index_bodies, 1);
  atomic_fetch_add(&http_bytes, (long)n);
  free(body);
  close(fd);
  return NULL;
}

static void http_start(const char *dir) {
  snprintf(http_root, sizeof http_root, "%s", dir);
  http_port = harness_http_serve(http_conn);
}

/* ---- the loader ----------------------------------------------------------------- */

typedef struct {
  const char *source, *cache;
  int epochs, batch;
  tide_bad_sample_t on_bad;
  int expect_rc; /* of the first failing next */
  const char *expect_in_error;
  const char *order_file; /* each rank writes the hash of what it got, in order, to order_file.RANK */
  int shards;             /* a sharded source of this many shards: each host reads its own, once */
} run_t;

static int run_loader(int rank, int size, void *arg) {
  run_t *r = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  tide_loader_config_t cfg;
  tide_loader_config_default(&cfg);
  cfg.source = r->source;
  cfg.cache_dir = r->cache;
  cfg.batch = r->batch;
  cfg.seed = 5;
  cfg.prefetch = 2;
  cfg.on_bad_sample = r->on_bad;
  tide_loader_t *l;
  int rc = tide_loader_open(comm, &cfg, &l);
  if (r->expect_rc != 0 && rc != 0) {
    CHECK(rc == r->expect_rc);
    tide_comm_destroy(comm);
    return 0;
  }
  CHECK_OK(rc);
  CHECK(tide_loader_size(l) == N && tide_loader_classes(l) == CLASSES);
  int h, w, c;
  CHECK_OK(tide_loader_shape(l, &h, &w, &c));
  CHECK(h == H && w == W && c == 1);
  uint64_t steps = (N + (uint64_t)r->batch * (uint64_t)size - 1) / ((uint64_t)r->batch * (uint64_t)size);
  int failed = 0;
  uint64_t order = 1469598103934665603ULL; /* FNV-1a over (id, label) in delivery order */
  for (int e = 0; e < r->epochs && !failed; e++) {
    double count = 0, sum = 0, skipped = 0;
    for (uint64_t s = 0; s < steps; s++) {
      tide_loader_batch_t b;
      rc = tide_loader_next(l, &b);
      if (rc != 0) {
        CHECK(rc == r->expect_rc);
        failed = 1;
        break;
      }
      CHECK(b.epoch == (uint64_t)e && b.sample_bytes == H * W);
      for (size_t j = 0; j < b.count; j++) {
        const uint8_t *px = b.pixels + j * b.sample_bytes;
        if (b.labels[j] < 0) {
          skipped++;
          continue;
        }
        int id = sample_id(px);
        order = (order ^ (uint64_t)(id * 16 + b.labels[j])) * 1099511628211ULL;
        uint8_t want[H * W];
        fill(id, want);
        CHECK(memcmp(px, want, sizeof want) == 0);
        CHECK(b.labels[j] == id % CLASSES);
        count++;
        sum += id;
      }
    }
    /* a bad sample fails only the ranks whose share holds it */
    int any = failed;
    CHECK_OK(tide_allreduce(comm, &any, &any, 1, TIDE_I32, TIDE_MAX));
    if (any) {
      failed = 1;
      break;
    }
    double t[2] = {count, sum};
    CHECK_OK(tide_allreduce(comm, t, t, 2, TIDE_F64, TIDE_SUM));
    double sk = skipped;
    CHECK_OK(tide_allreduce(comm, &sk, &sk, 1, TIDE_F64, TIDE_SUM));
    CHECK(t[0] + sk == N);
    CHECK(r->on_bad == TIDE_BAD_SAMPLE_SKIP || sk == 0);
  }
  tide_loader_stats_t st;
  CHECK_OK(tide_loader_stats(l, &st));
  double d[3] = {(double)st.decoded, (double)st.remote_samples, (double)st.source_requests};
  CHECK_OK(tide_allreduce(comm, d, d, 3, TIDE_F64, TIDE_SUM));
  if (!failed && r->on_bad == TIDE_BAD_SAMPLE_FAIL && r->expect_rc == 0) {
    /* every sample decoded exactly once in the whole job, whatever the epochs */
    CHECK(d[0] == N);
    if (tide_comm_node_count(comm) > 1) CHECK(d[1] > 0);
    else CHECK(d[1] == 0);
  }
  if (!failed && r->shards > 0 && r->cache == NULL) {
    /* each host read exactly its own shards (s % hosts), once */
    int hosts = tide_comm_node_count(comm), node = tide_comm_node(comm);
    double per[8] = {0};
    CHECK(hosts <= 8);
    per[node] = (double)st.source_requests - (strncmp(r->source, "http", 4) == 0); /* a URL's index.txt */
    CHECK_OK(tide_allreduce(comm, per, per, 8, TIDE_F64, TIDE_SUM));
    for (int m = 0; m < hosts; m++) CHECK(per[m] == (double)((r->shards - m + hosts - 1) / hosts));
  }
  if (r->order_file != NULL && !failed) {
    char path[600];
    snprintf(path, sizeof path, "%s.%d", r->order_file, rank);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "%016llx\n", (unsigned long long)order);
    CHECK(fclose(f) == 0);
  }
  if (rank == 0)
    fprintf(stderr, "  loader np=%d hosts=%d: decoded %.0f, remote %.0f, source reads %.0f, store %llu B, wait %.3f s%s\n",
            size, tide_comm_node_count(comm), d[0], d[1], d[2], (unsigned long long)st.store_bytes, st.wait_s,
            failed ? " (failed as expected)" : "");
  CHECK(r->expect_rc == 0 || failed);
  tide_loader_close(l);
  tide_comm_destroy(comm);
  return 0;
}

/* The trainer's micro-batches through tide_loader_get; data_s reported. */
static int run_trainer(int rank, int size, void *arg) {
  const char *dir = arg;
  (void)rank;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float params[4] = {0}, grads[4] = {0};
  tide_trainer_config_t tc;
  tide_trainer_config_default(&tc);
  tc.dataset_size = N;
  tc.seed = 9;
  tc.batch = 10;
  tc.epochs = 2;
  tide_trainer_t *tr;
  CHECK_OK(tide_trainer_create(comm, &tc, params, grads, 4, NULL, 0, &tr));
  tide_loader_config_t cfg;
  tide_loader_config_default(&cfg);
  cfg.source = dir;
  cfg.batch = tc.batch;
  cfg.seed = tc.seed;
  tide_loader_t *l;
  CHECK_OK(tide_loader_open(comm, &cfg, &l));
  tide_batch_t b;
  double count = 0, data_s = 0, waited = 0;
  while (tide_trainer_next(tr, &b) == 0 && !b.done) {
    tide_loader_batch_t lb;
    CHECK_OK(tide_loader_get(l, &b, &lb));
    CHECK(lb.count == b.count);
    for (size_t j = 0; j < lb.count; j++) {
      uint8_t want[H * W];
      fill(sample_id(lb.pixels + j * lb.sample_bytes), want);
      CHECK(memcmp(want, lb.pixels + j * lb.sample_bytes, sizeof want) == 0);
    }
    count += (double)lb.count;
    /* data_s is the sum of this step's waits: the loader's, and a known
     * 0.125 s per micro-batch, so a figure dropped, kept from an earlier
     * step or counted twice fails (no time is measured here). */
    CHECK_OK(tide_trainer_data_wait(tr, lb.wait_s));
    CHECK_OK(tide_trainer_data_wait(tr, 0.125));
    waited += lb.wait_s + 0.125;
    tide_step_stats_t st;
    CHECK_OK(tide_trainer_step(tr, 0.0, &st));
    if (st.stepped) {
      CHECK(fabs(st.data_s - waited) <= 1e-9 * waited);
      CHECK(st.kfac_s == 0); /* no K-FAC on this trainer */
      data_s += st.data_s;
      waited = 0;
    }
  }
  CHECK_OK(tide_allreduce(comm, &count, &count, 1, TIDE_F64, TIDE_SUM));
  CHECK(count == 2 * N);
  CHECK_RC(tide_trainer_data_wait(tr, -1), TIDE_EINVAL);
  tide_loader_close(l);
  tide_trainer_destroy(tr);
  tide_comm_destroy(comm);
  (void)size;
  return 0;
}

/* The files a.RANK and b.RANK (ranks 0..np-1) say the same. */
static void same_order(const char *a, const char *b, int np) {
  for (int r = 0; r < np; r++) {
    char pa[600], pb[600], ta[64] = "", tb[64] = "";
    snprintf(pa, sizeof pa, "%s.%d", a, r);
    snprintf(pb, sizeof pb, "%s.%d", b, r);
    FILE *fa = fopen(pa, "r"), *fb = fopen(pb, "r");
    CHECK(fa != NULL && fb != NULL);
    CHECK(fgets(ta, sizeof ta, fa) != NULL && fgets(tb, sizeof tb, fb) != NULL);
    fclose(fa);
    fclose(fb);
    CHECK(strcmp(ta, tb) == 0);
  }
}

/* Packs dir's images into shards of about shard_bytes in out; checks the
 * sharded source against the per-file one (every sample's bytes, label and
 * name; the index written back is the one on disk; version 1 still reads).
 * Returns the number of shards. */
static int make_shards(const char *dir, const char *out, uint64_t shard_bytes) {
  tide__source_t *files, *sharded;
  CHECK_OK(tide__source_open_listing(dir, &files));
  size_t nshards = 0;
  uint64_t bytes = 0;
  CHECK_OK(tide__source_write_shards(files, out, shard_bytes, &nshards, &bytes));
  CHECK(nshards > 1);
  CHECK_OK(tide__source_open(out, NULL, NULL, &sharded));
  CHECK(sharded->nshards == nshards && sharded->count == files->count && sharded->nclasses == files->nclasses);
  CHECK(sharded->shape[0] == H && sharded->shape[1] == W && sharded->shape[2] == 1);
  uint64_t total = 0;
  for (size_t k = 0; k < nshards; k++) {
    CHECK(sharded->shards[k].count > 0);
    total += sharded->shards[k].size;
  }
  CHECK(total == bytes);
  for (size_t i = 0; i < files->count; i++) {
    uint8_t *a, *b;
    size_t la, lb;
    CHECK_OK(tide__source_read(files, i, NULL, NULL, &a, &la));
    CHECK_OK(tide__source_read(sharded, i, NULL, NULL, &b, &lb));
    CHECK(la == lb && memcmp(a, b, la) == 0);
    CHECK(files->items[i].label == sharded->items[i].label && strcmp(files->items[i].path, sharded->items[i].path) == 0);
    tide__free(a);
    tide__free(b);
  }
  /* the index round trip: what the sharded source writes is its index.txt */
  char path[600], *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  CHECK_OK(tide__source_write_index(sharded, mem));
  fclose(mem);
  snprintf(path, sizeof path, "%s/index.txt", out);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  char *disk = malloc(len + 2);
  CHECK(fread(disk, 1, len + 1, f) == len && memcmp(disk, text, len) == 0);
  fclose(f);
  free(disk);
  free(text);
  /* a directory with a version 1 index is still listed, as before */
  tide__source_t *again;
  CHECK_OK(tide__source_open(dir, NULL, NULL, &again));
  CHECK(again->nshards == 0 && again->count == files->count);
  tide__source_close(again);
  tide__source_close(files);
  tide__source_close(sharded);
  return (int)nshards;
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/tide-test-data-%d", (int)getpid());
  mkdir(root, 0777);
  setenv("TIDE_DATA_CACHE", "none", 1);
  char dir[400], sdir[400], cache[400], url[200], surl[200], cmd[900], order_files[400], order_sharded[400];
  snprintf(dir, sizeof dir, "%s/folder", root);
  snprintf(sdir, sizeof sdir, "%s/sharded", root);
  snprintf(order_files, sizeof order_files, "%s/order-files", root);
  snprintf(order_sharded, sizeof order_sharded, "%s/order-sharded", root);
  /* In a child: this process must not read the TIDE_* table before the
   * harness sets the job's variables (it is read once per process). */
  pid_t pid = fork();
  if (pid == 0) {
    test_decode();
    test_cache();
    make_folder(dir);
    int nshards = make_shards(dir, sdir, 1500);
    fprintf(stderr, "shards: %d of about 1500 bytes, the same samples as the files, the index round trip\n", nshards);
    _exit(nshards);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) > 1);
  int nshards = WEXITSTATUS(status);

  fprintf(stderr, "-- directory, 1 rank and 2 emulated hosts x 2 ranks\n");
  run_t plain = {dir, NULL, 3, 16, TIDE_BAD_SAMPLE_FAIL, 0, NULL, NULL, 0};
  harness_opts_t one = {1, NULL, 0, 120, NULL};
  CHECK(harness_run(&one, run_loader, &plain) == 0);
  const char *hosts[] = {"a", "a", "b", "b"};
  harness_opts_t two = {4, hosts, 0, 120, NULL};
  plain.order_file = order_files;
  CHECK(harness_run(&two, run_loader, &plain) == 0);
  plain.order_file = NULL;

  fprintf(stderr, "-- a sharded directory: the same samples in the same order; each host reads its own shards\n");
  run_t sharded = {sdir, NULL, 3, 16, TIDE_BAD_SAMPLE_FAIL, 0, NULL, order_sharded, nshards};
  CHECK(harness_run(&one, run_loader, &sharded) == 0);
  CHECK(harness_run(&two, run_loader, &sharded) == 0);
  same_order(order_files, order_sharded, 4);
  harness_opts_t local2 = {2, NULL, 0, 120, NULL};
  CHECK(harness_run(&local2, run_loader, &plain) == 0);

  fprintf(stderr, "-- the trainer's micro-batches, 2 ranks\n");
  CHECK(harness_run(&local2, run_trainer, dir) == 0);

  fprintf(stderr, "-- HTTP with a disk cache: the second run reads no object from the server\n");
  http_start(root);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/folder", http_port);
  snprintf(surl, sizeof surl, "http://127.0.0.1:%d/sharded", http_port);
  snprintf(cache, sizeof cache, "%s/httpcache", root);
  run_t http = {url, cache, 2, 16, TIDE_BAD_SAMPLE_FAIL, 0, NULL, NULL, 0};
  CHECK(harness_run(&two, run_loader, &http) == 0);
  long first = atomic_load(&http_bytes), index_bytes;
  {
    struct stat st;
    snprintf(cmd, sizeof cmd, "%s/index.txt", dir);
    CHECK(stat(cmd, &st) == 0);
    index_bytes = (long)st.st_size;
  }
  CHECK(harness_run(&two, run_loader, &http) == 0);
  long second = atomic_load(&http_bytes) - first;
  fprintf(stderr, "  first run %ld bytes from the server, second run %ld (index.txt is %ld bytes, 4 ranks)\n", first,
          second, index_bytes);
  CHECK(second == 0);

  fprintf(stderr, "-- sharded HTTP: one request per shard, each host its own; the same samples in the same order\n");
  long before = atomic_load(&http_shard_requests);
  run_t shttp = {surl, NULL, 3, 16, TIDE_BAD_SAMPLE_FAIL, 0, NULL, order_sharded, nshards};
  CHECK(harness_run(&two, run_loader, &shttp) == 0);
  fprintf(stderr, "  %ld shard requests for %d shards\n", atomic_load(&http_shard_requests) - before, nshards);
  CHECK(atomic_load(&http_shard_requests) - before == nshards);
  same_order(order_files, order_sharded, 4);
  snprintf(cache, sizeof cache, "%s/shardcache", root);
  run_t scached = {surl, cache, 2, 16, TIDE_BAD_SAMPLE_FAIL, 0, NULL, NULL, nshards};
  before = atomic_load(&http_shard_requests);
  long index_before = atomic_load(&http_index_bodies);
  CHECK(harness_run(&two, run_loader, &scached) == 0);
  CHECK(atomic_load(&http_shard_requests) - before == nshards);
  /* with a cache, a host's other ranks revalidate the index its local rank
   * 0 fetched: at most one body per host (one when the second host's rank
   * found it in the cache the two share here) */
  long index_bodies = atomic_load(&http_index_bodies) - index_before;
  fprintf(stderr, "  index.txt sent %ld times to 4 ranks on 2 hosts\n", index_bodies);
  CHECK(index_bodies >= 1 && index_bodies <= 2);
  before = atomic_load(&http_shard_requests);
  CHECK(harness_run(&two, run_loader, &scached) == 0);
  CHECK(atomic_load(&http_shard_requests) - before == 0);
  /* a cached shard whose checksum fails is refetched (once), never used */
  snprintf(cmd, sizeof cmd,
           "f=$(grep -l 'shards/00000.bin|' %s/objects/*) && [ $(echo \"$f\" | wc -l) = 1 ] && "
           "printf X | dd of=$f bs=1 seek=$(( $(stat -c %%s $f) - 1 )) conv=notrunc 2>/dev/null",
           cache);
  CHECK(system(cmd) == 0);
  before = atomic_load(&http_shard_requests);
  CHECK(harness_run(&two, run_loader, &scached) == 0);
  CHECK(atomic_load(&http_shard_requests) - before == 1);

  fprintf(stderr, "-- HTTP: 503s are retried\n");
  setenv("TIDE_DATA_RETRIES", "4", 1);
  snprintf(cache, sizeof cache, "%s/httpcache2", root);
  run_t retry = {url, cache, 1, 16, TIDE_BAD_SAMPLE_FAIL, 0, NULL, NULL, 0};
  atomic_store(&http_fail_next, 3);
  CHECK(harness_run(&one, run_loader, &retry) == 0);

  fprintf(stderr, "-- HTTP: a missing object is a clear error naming it\n");
  snprintf(cmd, sizeof cmd, "mv %s/c1/0001.png %s/moved.png", dir, root);
  CHECK(system(cmd) == 0);
  snprintf(cache, sizeof cache, "%s/httpcache3", root);
  run_t missing = {url, cache, 1, 16, TIDE_BAD_SAMPLE_FAIL, TIDE_EIO, "0001.png", NULL, 0};
  CHECK(harness_run(&one, run_loader, &missing) == 0);
  snprintf(cmd, sizeof cmd, "mv %s/moved.png %s/c1/0001.png", root, dir);
  CHECK(system(cmd) == 0);

  fprintf(stderr, "-- HTTP: a server that stops answering fails after the retries, no hang\n");
  setenv("TIDE_DATA_RETRIES", "1", 1);
  setenv("TIDE_DATA_TIMEOUT_MS", "300", 1);
  atomic_store(&http_stall, 1);
  run_t stalled = {url, NULL, 1, 16, TIDE_BAD_SAMPLE_FAIL, TIDE_ETIMEDOUT, NULL, NULL, 0};
  int64_t t0 = tide__now_ns();
  CHECK(harness_run(&one, run_loader, &stalled) == 0);
  fprintf(stderr, "  gave up after %.1f s\n", (double)(tide__now_ns() - t0) * 1e-9);
  atomic_store(&http_stall, 0);
  unsetenv("TIDE_DATA_RETRIES");
  unsetenv("TIDE_DATA_TIMEOUT_MS");

  fprintf(stderr, "-- a corrupt image: an error naming it, or skipped and counted\n");
  snprintf(cmd, sizeof cmd, "truncate -s 30 %s/c2/0005.png && printf 'garbage' > %s/c0/0006.png", dir, dir);
  CHECK(system(cmd) == 0);
  run_t fail = {dir, NULL, 2, 16, TIDE_BAD_SAMPLE_FAIL, TIDE_EINVAL, "0005.png", NULL, 0};
  CHECK(harness_run(&two, run_loader, &fail) == 0);
  run_t skip = {dir, NULL, 2, 16, TIDE_BAD_SAMPLE_SKIP, 0, NULL, NULL, 0};
  CHECK(harness_run(&two, run_loader, &skip) == 0);

  fprintf(stderr, "-- a corrupt sample inside a shard: named, or skipped and counted\n");
  /* In a child, as above: opening a sharded directory reads the TIDE_* table
   * (its index's bound). It damages sample 5 and says which shard holds it. */
  char shard_path[600], victim_file[600];
  unsigned long long shard_size = 0;
  snprintf(victim_file, sizeof victim_file, "%s/victim", root);
  if ((pid = fork()) == 0) {
    tide__source_t *shards;
    CHECK_OK(tide__source_open(sdir, NULL, NULL, &shards));
    const tide__item_t *victim = &shards->items[5];
    snprintf(shard_path, sizeof shard_path, "%s/%s", sdir, shards->shards[victim->shard].path);
    FILE *f = fopen(shard_path, "r+b");
    CHECK(f != NULL);
    CHECK(fseek(f, (long)victim->offset, SEEK_SET) == 0);
    for (uint64_t b = 0; b < victim->size; b++) fputc('X', f);
    CHECK(fclose(f) == 0);
    f = fopen(victim_file, "w");
    CHECK(f != NULL);
    fprintf(f, "%llu %s\n", (unsigned long long)shards->shards[victim->shard].size, shard_path);
    CHECK(fclose(f) == 0);
    tide__source_close(shards);
    _exit(0);
  }
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  {
    FILE *f = fopen(victim_file, "r");
    CHECK(f != NULL && fscanf(f, "%llu %599s", &shard_size, shard_path) == 2);
    fclose(f);
  }
  run_t sfail = {sdir, NULL, 2, 16, TIDE_BAD_SAMPLE_FAIL, TIDE_EINVAL, NULL, NULL, 0};
  CHECK(harness_run(&two, run_loader, &sfail) == 0);
  run_t sskip = {sdir, NULL, 2, 16, TIDE_BAD_SAMPLE_SKIP, 0, NULL, NULL, 0};
  CHECK(harness_run(&two, run_loader, &sskip) == 0);

  fprintf(stderr, "-- a truncated shard: a clear error naming it\n");
  CHECK(truncate(shard_path, (off_t)(shard_size - 10)) == 0);
  run_t struncated = {sdir, NULL, 1, 16, TIDE_BAD_SAMPLE_FAIL, TIDE_EIO, NULL, NULL, 0};
  CHECK(harness_run(&one, run_loader, &struncated) == 0);

  fprintf(stderr, "-- bad arguments\n");
  tide_loader_config_t cfg;
  tide_loader_config_default(&cfg);
  CHECK_RC(tide_loader_open(NULL, &cfg, NULL), TIDE_EINVAL);
  tide__source_t *src;
  CHECK_RC(tide__source_open("/nonexistent/tide", NULL, NULL, &src), TIDE_ENOENT);
  CHECK_RC(tide__source_open("fashion-mnist", "validation", NULL, &src), TIDE_EINVAL);

  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  CHECK(system(cmd) == 0);
  fprintf(stderr, "test_data: ok\n");
  return 0;
}
