/* The data pipeline's bounds (docs/data.md, "What is bounded"): an HTTP
 * body is read up to the size the index gives (or TIDE_DATA_INDEX_MAX_BYTES
 * for index.txt), whatever the server sends (a huge Content-Length, an
 * endless chunked body, an endless index); an image whose header claims
 * more than TIDE_DATA_MAX_IMAGE_PIXELS is refused before decoding (PNG and
 * JPEG, first image and later); ranks that read different listings fail
 * together with TIDE_EMISMATCH; a FIFO or a symlink to /dev/zero in an
 * ImageFolder, and a FIFO or symlink among the cache's objects, are refused
 * without hanging; a silent server's TIDE_ETIMEDOUT names
 * TIDE_DATA_TIMEOUT_MS; no /dev/shm/tide-data-* name survives a store that
 * cannot be sized, or a rank that died making one; the cache's directory
 * is 0700 and its own, a full disk is one warning, no temporary file stays. The HTTP server runs in this process on 127.0.0.1 and
 * bounds what it sends (64 MiB, 20 s per connection). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <jpeglib.h>

#include "core/core.h"
#include "data/data.h"
#include "harness.h"

#define H 6
#define W 8
#define N 12
/* The bombs' side (5000 x 5000 = 25 M pixels, over the default 16 M) and
 * how much the misbehaving server offers (64 MiB). scripts/data-limits-check.sh
 * raises both (TIDE_TEST_BOMB_SIDE, TIDE_TEST_SERVER_MAX_MB) so that a bound
 * that stopped holding shows in the peak RSS it measures from outside. */
static int BOMB = 5000;
static long SERVER_MAX = 64l << 20;

static char root[256];

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, len, f) == len);
  CHECK(fclose(f) == 0);
}

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[2000];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  CHECK(system(cmd) == 0);
}

/* N small PNGs in two classes, and index.txt (version 1). */
static void make_folder(const char *dir) {
  char path[600];
  mkdir(dir, 0777);
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/c%d", dir, k);
    mkdir(path, 0777);
  }
  for (int id = 0; id < N; id++) {
    uint8_t px[H * W], *png;
    size_t len;
    for (int p = 0; p < H * W; p++) px[p] = (uint8_t)(id * 7 + p);
    CHECK_OK(tide__png_encode(px, H, W, 1, &png, &len));
    snprintf(path, sizeof path, "%s/c%d/%04d.png", dir, id % 2, id);
    write_file(path, png, len);
    tide__free(png);
  }
  tide__source_t *src;
  CHECK_OK(tide__source_open(dir, NULL, NULL, &src));
  snprintf(path, sizeof path, "%s/index.txt", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  CHECK_OK(tide__source_write_index(src, f));
  CHECK(fclose(f) == 0);
  tide__source_close(src);
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* A valid gray PNG of side x side zeros: about 25 KB for 25 M pixels. */
static size_t png_bomb(int side, uint8_t **out) {
  size_t raw_len = (size_t)side * ((size_t)side + 1);
  uint8_t *raw = calloc(1, raw_len); /* filter byte 0 and zeros, each row */
  uLongf zlen = compressBound((uLong)raw_len);
  uint8_t *z = malloc(zlen);
  CHECK(raw != NULL && z != NULL && compress2(z, &zlen, raw, (uLong)raw_len, 9) == Z_OK);
  free(raw);
  size_t len = 8 + 25 + 12 + zlen + 12;
  uint8_t *p = malloc(len), *q = p;
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  memcpy(q, sig, 8);
  q += 8;
  put_be32(q, 13);
  memcpy(q + 4, "IHDR", 4);
  put_be32(q + 8, (uint32_t)side);
  put_be32(q + 12, (uint32_t)side);
  q[16] = 8, q[17] = 0, q[18] = 0, q[19] = 0, q[20] = 0; /* 8-bit gray */
  put_be32(q + 21, (uint32_t)crc32(0, q + 4, 17));
  q += 25;
  put_be32(q, (uint32_t)zlen);
  memcpy(q + 4, "IDAT", 4);
  memcpy(q + 8, z, zlen);
  put_be32(q + 8 + zlen, (uint32_t)crc32(0, q + 4, (uInt)(4 + zlen)));
  q += 12 + zlen;
  put_be32(q, 0);
  memcpy(q + 4, "IEND", 4);
  put_be32(q + 8, (uint32_t)crc32(0, q + 4, 4));
  free(z);
  *out = p;
  return len;
}

/* A valid gray JPEG of side x side (encoded a row at a time). */
static size_t jpeg_bomb(int side, uint8_t **out) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned long len = 0;
  *out = NULL;
  jpeg_mem_dest(&c, out, &len);
  c.image_width = (JDIMENSION)side;
  c.image_height = (JDIMENSION)side;
  c.input_components = 1;
  c.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  uint8_t *row = calloc(1, (size_t)side);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = row;
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  free(row);
  return len;
}

/* ---- an HTTP server that can send too much ---------------------------------- */

enum { SERVE_FILE, SERVE_HUGE_LENGTH, SERVE_ENDLESS_CHUNKED, SERVE_ENDLESS_INDEX, SERVE_404_PAGE, SERVE_SILENT };
static int http_port;
static _Atomic int http_mode; /* for the objects (and index.txt when ENDLESS_INDEX) */
static _Atomic long http_sent; /* body bytes of the last misbehaving answer */
static char http_root[512];

static int send_all(int fd, const void *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

static void *http_conn(void *arg) {
  int fd = (int)(intptr_t)arg;
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
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
  char path[1024] = "", file[1600];
  sscanf(req, "GET %1000s", path);
  int is_index = strstr(path, "index.txt") != NULL;
  int mode = atomic_load(&http_mode);
  if (is_index && mode != SERVE_ENDLESS_INDEX) mode = SERVE_FILE;
  if (!is_index && mode == SERVE_ENDLESS_INDEX) mode = SERVE_FILE;
  if (mode == SERVE_SILENT) { /* a head, then nothing for 5 s */
    const char *head = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n";
    send_all(fd, head, strlen(head));
    sleep(5);
    close(fd);
    return NULL;
  }
  if (mode == SERVE_404_PAGE) { /* an error page larger than the object: its status is the answer */
    static char page[4096];
    memset(page, 'x', sizeof page);
    char head[256];
    int hl = snprintf(head, sizeof head, "HTTP/1.1 404 Not Found\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      sizeof page);
    send_all(fd, head, (size_t)hl);
    send_all(fd, page, sizeof page);
    close(fd);
    return NULL;
  }
  if (mode == SERVE_FILE) {
    snprintf(file, sizeof file, "%s%s", http_root, path);
    FILE *f = strstr(path, "..") == NULL ? fopen(file, "rb") : NULL;
    char *body = malloc(1 << 20);
    size_t n = f != NULL ? fread(body, 1, 1 << 20, f) : 0;
    if (f != NULL) fclose(f);
    char head[256];
    int hl = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      f != NULL ? "200 OK" : "404 Not Found", n);
    send_all(fd, head, (size_t)hl);
    send_all(fd, body, n);
    free(body);
    close(fd);
    return NULL;
  }
  const char *head = mode == SERVE_HUGE_LENGTH
                         ? "HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\nConnection: close\r\n\r\n"
                     : mode == SERVE_ENDLESS_CHUNKED
                         ? "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                         : "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"; /* the index: until closed */
  send_all(fd, head, strlen(head));
  static char block[65536];
  memset(block, '#', sizeof block);
  for (size_t k = 0; k < sizeof block; k += 64) block[k + 63] = '\n';
  long sent = 0;
  if (mode == SERVE_ENDLESS_INDEX) {
    const char *first = "tide-imagefolder 1\nclass 0 c0\n";
    send_all(fd, first, strlen(first));
  }
  while (sent < SERVER_MAX) {
    char chunk_head[32];
    if (mode == SERVE_ENDLESS_CHUNKED) {
      int cl = snprintf(chunk_head, sizeof chunk_head, "%zx\r\n", sizeof block);
      if (send_all(fd, chunk_head, (size_t)cl) != 0) break;
    }
    if (send_all(fd, block, sizeof block) != 0) break;
    if (mode == SERVE_ENDLESS_CHUNKED && send_all(fd, "\r\n", 2) != 0) break;
    sent += (long)sizeof block;
  }
  atomic_store(&http_sent, sent);
  close(fd);
  return NULL;
}

/* ---- the loader --------------------------------------------------------------- */

typedef struct {
  const char *source[2]; /* per rank (rank 1 takes source[0] when source[1] is NULL) */
  int height;            /* config.height = width (0: from the first image) */
  int expect_open, expect_next;
  long fsize_limit; /* RLIMIT_FSIZE (0: none): the store's posix_fallocate fails past it */
} run_t;

static int run_loader(int rank, int size, void *arg) {
  const run_t *r = arg;
  (void)size;
  if (getenv("TIDE_SANITIZED") == NULL) {
    /* before the fix a rank read /dev/zero until the kernel killed it: here
     * it runs out of address space instead (4 GiB: malloc's per-thread
     * arenas reserve 64 MiB each, more threads on larger machines) */
    struct rlimit lim = {4ull << 30, 4ull << 30};
    setrlimit(RLIMIT_AS, &lim);
  }
  if (r->fsize_limit > 0) {
    struct rlimit lim = {(rlim_t)r->fsize_limit, (rlim_t)r->fsize_limit};
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  char pid_file[400];
  snprintf(pid_file, sizeof pid_file, "%s/pid-%d", root, rank);
  FILE *pf = fopen(pid_file, "w");
  CHECK(pf != NULL && fprintf(pf, "%d\n", (int)getpid()) > 0 && fclose(pf) == 0);
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  tide_loader_config_t cfg;
  tide_loader_config_default(&cfg);
  cfg.source = rank == 1 && r->source[1] != NULL ? r->source[1] : r->source[0];
  cfg.batch = 4;
  cfg.prefetch = 1;
  cfg.height = cfg.width = r->height;
  cfg.channels = r->height > 0 ? 1 : 0;
  tide_loader_t *l;
  int rc = tide_loader_open(comm, &cfg, &l);
  if (rc != 0) /* what a program shows its user */
    fprintf(stderr, "rank %d: tide_loader_open: %s\n", rank, tide_strerror(rc));
  if (r->expect_open != 0) {
    CHECK_RC(rc, r->expect_open);
    tide_comm_destroy(comm);
    return 0;
  }
  CHECK_OK(rc);
  int failed = 0;
  for (int s = 0; s < 2 * N && !failed; s++) {
    tide_loader_batch_t b;
    rc = tide_loader_next(l, &b);
    if (rc != 0) {
      fprintf(stderr, "rank %d: tide_loader_next: %s\n", rank, tide_strerror(rc));
      CHECK_RC(rc, r->expect_next);
      failed = 1;
    }
  }
  CHECK(failed == (r->expect_next != 0));
  tide_loader_close(l);
  tide_comm_destroy(comm);
  return 0;
}

/* Runs the loader with stderr into a file; the log must hold want, and not
 * unwanted (when not NULL). */
static void run_logged_without(const harness_opts_t *o, const run_t *r, const char *want, const char *unwanted) {
  char log[400];
  snprintf(log, sizeof log, "%s/log", root);
  fflush(stderr);
  int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  close(fd);
  int64_t t0 = tide__now_ns();
  int rc = harness_run(o, run_loader, (void *)r);
  double s = (double)(tide__now_ns() - t0) * 1e-9;
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  FILE *f = fopen(log, "r");
  CHECK(f != NULL);
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  fprintf(stderr, "%s  (%.1f s)\n", text, s);
  CHECK(rc == 0);
  if (want != NULL && strstr(text, want) == NULL) {
    fprintf(stderr, "test_data_limits: the log does not say \"%s\"\n", want);
    exit(1);
  }
  if (unwanted != NULL && strstr(text, unwanted) != NULL) {
    fprintf(stderr, "test_data_limits: the log says \"%s\"\n", unwanted);
    exit(1);
  }
}

static void run_logged(const harness_opts_t *o, const run_t *r, const char *want) {
  run_logged_without(o, r, want, NULL);
}

/* A FIFO or a symlink among the cache's objects: refused (no hang on the
 * FIFO, no read through the symlink), removed, counted, reported absent. */
static void test_cache_objects(void) {
  char dir[400], cmd[1600];
  snprintf(dir, sizeof dir, "%s/cache", root);
  tide__cache_t *c;
  CHECK_OK(tide__cache_open(dir, 0, &c));
  uint8_t *data;
  size_t len;
  CHECK_OK(tide__cache_put(c, "fifo", "payload", 7));
  snprintf(cmd, sizeof cmd, "f=$(ls %s/objects/*) && rm $f && mkfifo $f", dir);
  CHECK(system(cmd) == 0);
  alarm(20); /* before the fix the open blocked forever */
  CHECK_RC(tide__cache_get(c, "fifo", &data, &len), TIDE_ENOENT);
  snprintf(cmd, sizeof cmd, "[ -z \"$(ls %s/objects/)\" ]", dir);
  CHECK(system(cmd) == 0);
  CHECK_OK(tide__cache_put(c, "link", "payload", 7));
  snprintf(cmd, sizeof cmd, "f=$(ls %s/objects/*) && mv $f %s/elsewhere && ln -s %s/elsewhere $f", dir, root, root);
  CHECK(system(cmd) == 0);
  CHECK_RC(tide__cache_get(c, "link", &data, &len), TIDE_ENOENT);
  alarm(0);
  tide__cache_counts_t k;
  tide__cache_counts(c, &k);
  CHECK(k.bad == 2 && k.hits == 0);
  tide__cache_close(c);
  fprintf(stderr, "cache: a FIFO and a symlink among the objects refused, removed, counted\n");
}

static int mode_of(const char *path) {
  struct stat st;
  CHECK(stat(path, &st) == 0);
  return (int)(st.st_mode & 07777);
}

/* Counts the lines of path that hold what. */
static int count_lines(const char *path, const char *what) {
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char line[2000];
  int n = 0;
  while (fgets(line, sizeof line, f) != NULL) n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

/* The cache's directory: created 0700; refused when another user owns it;
 * a full disk (here RLIMIT_FSIZE) warned once with a count at close; no
 * temporary file left, a dead writer's swept at open; its lock and
 * temporary files opened without following a symlink. */
static void test_cache_dir(void) {
  char dir[400], path[600], log[400], cmd[1600];
  snprintf(dir, sizeof dir, "%s/cache-dir/a/b", root);
  tide__cache_t *c;
  CHECK_OK(tide__cache_open(dir, 0, &c));
  CHECK(mode_of(dir) == 0700);
  snprintf(path, sizeof path, "%s/cache-dir/a", root);
  CHECK(mode_of(path) == 0700);
  snprintf(path, sizeof path, "%s/objects", dir);
  CHECK(mode_of(path) == 0700);
  tide__cache_close(c);

  /* a writer killed between its open and its rename */
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  int status;
  CHECK(waitpid(dead, &status, 0) == dead);
  char stale[600], stale_stats[600], live[600];
  snprintf(stale, sizeof stale, "%s/tmp/%d-0011223344556677", dir, (int)dead);
  snprintf(stale_stats, sizeof stale_stats, "%s/tmp/stats-%d", dir, (int)dead);
  snprintf(live, sizeof live, "%s/tmp/%d-8899aabbccddeeff", dir, (int)getpid());
  write_file(stale, "x", 1);
  write_file(stale_stats, "x", 1);
  write_file(live, "x", 1);
  CHECK_OK(tide__cache_open(dir, 0, &c));
  CHECK(access(stale, F_OK) != 0 && access(stale_stats, F_OK) != 0 && access(live, F_OK) == 0);
  unlink(live);

  /* the lock a symlink: not followed */
  char planted[400];
  snprintf(planted, sizeof planted, "%s/planted", root);
  snprintf(cmd, sizeof cmd, "rm -f %s/lock && ln -s %s %s/lock", dir, planted, dir);
  CHECK(system(cmd) == 0);
  CHECK_OK(tide__cache_put(c, "key", "payload", 7));
  tide__cache_close(c); /* takes the lock to add its counts */
  CHECK(access(planted, F_OK) != 0);
  snprintf(cmd, sizeof cmd, "rm -f %s/lock", dir);
  CHECK(system(cmd) == 0);

  /* a full disk: 50 objects that cannot be written, one warning */
  snprintf(log, sizeof log, "%s/cache-log", root);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1024, 1024};
    setrlimit(RLIMIT_FSIZE, &lim);
    static uint8_t payload[4096];
    CHECK_OK(tide__cache_open(dir, 0, &c));
    for (int k = 0; k < 50; k++) {
      char key[32];
      snprintf(key, sizeof key, "full-%d", k);
      CHECK_RC(tide__cache_put(c, key, payload, sizeof payload), TIDE_EIO);
    }
    tide__cache_close(c);
    _exit(0);
  }
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  snprintf(cmd, sizeof cmd, "cat %s >&2", log);
  system(cmd);
  CHECK(count_lines(log, "cannot write") == 1);
  CHECK(count_lines(log, "50 objects could not be written") == 1);
  snprintf(cmd, sizeof cmd, "[ -z \"$(ls %s/tmp/)\" ]", dir);
  CHECK(system(cmd) == 0);

  /* another user's directory (the predictable fallback under /tmp) */
  if (geteuid() == 0) {
    snprintf(path, sizeof path, "%s/cache-other", root);
    CHECK(mkdir(path, 0755) == 0 && chown(path, 65534, 65534) == 0);
    CHECK_RC(tide__cache_open(path, 0, &c), TIDE_EINVAL);
  } else {
    fprintf(stderr, "cache: another user's directory not checked (needs root to chown)\n");
  }
  fprintf(stderr, "cache: directory 0700, another user's refused, one warning for a full disk, no temporary "
                  "file left, the lock not followed\n");
}

static void test_decode_bombs(const uint8_t *png, size_t png_len, const uint8_t *jpg, size_t jpg_len) {
  uint8_t out[H * W];
  char why[400];
  int h, w, c;
  CHECK_RC(tide__image_decode(png, png_len, H, W, 1, out, why, sizeof why), TIDE_EINVAL);
  char claim[40];
  snprintf(claim, sizeof claim, "%dx%d", BOMB, BOMB);
  CHECK(strstr(why, "TIDE_DATA_MAX_IMAGE_PIXELS") != NULL && strstr(why, claim) != NULL);
  CHECK_RC(tide__image_probe(png, png_len, &h, &w, &c, why, sizeof why), TIDE_EINVAL);
  CHECK_RC(tide__image_decode(jpg, jpg_len, H, W, 1, out, why, sizeof why), TIDE_EINVAL);
  CHECK(strstr(why, "JPEG") != NULL && strstr(why, "TIDE_DATA_MAX_IMAGE_PIXELS") != NULL);
  fprintf(stderr, "decode: %dx%d PNG (%zu bytes) and JPEG (%zu bytes) refused before decoding\n", BOMB, BOMB, png_len,
          jpg_len);
}

/* A section named on the command line runs alone (to see each fail on its own). */
static const char *only;
static int section(const char *name) { return only == NULL || strcmp(only, name) == 0; }

int main(int argc, char **argv) {
  only = argc > 1 ? argv[1] : NULL;
  const char *side = getenv("TIDE_TEST_BOMB_SIDE"), *server_mb = getenv("TIDE_TEST_SERVER_MAX_MB");
  if (side != NULL) BOMB = atoi(side);
  if (server_mb != NULL) SERVER_MAX = atol(server_mb) << 20;
  CHECK(BOMB > 4096 && BOMB <= 65535 && SERVER_MAX >= 1l << 20);
  snprintf(root, sizeof root, "/tmp/tide-test-data-limits-%d", (int)getpid());
  mkdir(root, 0777);
  setenv("TIDE_DATA_CACHE", "none", 1);
  setenv("TIDE_DATA_RETRIES", "0", 1);
  char dir[400], fewer[400], renamed[400], bomb_first[400], bomb_later[400], odd[400], fifo_first[400], url[300],
      path[600];
  snprintf(dir, sizeof dir, "%s/folder", root);
  snprintf(fewer, sizeof fewer, "%s/fewer", root);
  snprintf(renamed, sizeof renamed, "%s/renamed", root);
  snprintf(bomb_first, sizeof bomb_first, "%s/bomb-first", root);
  snprintf(bomb_later, sizeof bomb_later, "%s/bomb-later", root);
  snprintf(odd, sizeof odd, "%s/odd", root);
  snprintf(fifo_first, sizeof fifo_first, "%s/fifo-first", root);
  /* In a child: this process must not read the TIDE_* table before the
   * harness sets the job's variables (it is read once per process). */
  pid_t pid = fork();
  if (pid == 0) {
    make_folder(dir);
    /* The bombs take seconds to make: only for the section that reads them
     * (scripts/data-limits-check.sh runs each section as its own process). */
    uint8_t *png = NULL, *jpg = NULL;
    size_t png_len = 0, jpg_len = 0;
    if (section("bombs")) {
      png_len = png_bomb(BOMB, &png);
      jpg_len = jpeg_bomb(BOMB, &jpg);
      test_decode_bombs(png, png_len, jpg, jpg_len);
    }
    if (section("cache")) test_cache_objects();
    if (section("cachedir")) test_cache_dir();
    /* the bombs as the first image (it sizes the store), and as later ones */
    if (section("bombs")) {
      sh("cp -r %s %s", dir, bomb_first);
      snprintf(path, sizeof path, "%s/c0/0000.png", bomb_first);
      write_file(path, png, png_len);
      sh("cp -r %s %s", dir, bomb_later);
      snprintf(path, sizeof path, "%s/c1/0005.jpg", bomb_later);
      write_file(path, jpg, jpg_len);
    }
    free(png);
    free(jpg);
    _exit(0);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  harness_opts_t one = {1, NULL, 0, 60, NULL}, two = {2, NULL, 0, 60, NULL};

  if (section("bombs")) {
    fprintf(stderr, "-- a decompression bomb as the first image, and as a later one\n");
    run_t first = {{bomb_first, NULL}, 0, TIDE_EINVAL, 0, 0};
    run_logged(&one, &first, "TIDE_DATA_MAX_IMAGE_PIXELS");
    run_t later = {{bomb_later, NULL}, 0, 0, TIDE_EINVAL, 0};
    char claim[120];
    snprintf(claim, sizeof claim, "0005.jpg is corrupt or truncated: JPEG: its header claims %dx%d", BOMB, BOMB);
    run_logged(&one, &later, claim);

  }
  if (section("listing")) {
    fprintf(stderr, "-- ranks that read different listings fail together\n");
    sh("cp -r %s %s", dir, fewer);
    sh("rm %s/c1/0011.png%s", fewer, "");
    run_t count = {{dir, fewer}, 0, TIDE_EMISMATCH, 0, 0};
    run_logged(&two, &count, "the ranks read different listings");
    sh("cp -r %s %s", dir, renamed);
    sh("mv %s/c1/0011.png %s/c1/0011b.png", renamed, renamed);
    run_t names = {{dir, renamed}, 0, TIDE_EMISMATCH, 0, 0};
    run_logged(&two, &names, "the ranks read different listings");
    run_t same = {{dir, NULL}, 0, 0, 0, 0};
    run_logged(&two, &same, NULL);

  }
  if (section("local")) {
    fprintf(stderr, "-- a symlink to /dev/zero and a FIFO in an ImageFolder: refused, no hang\n");
    sh("cp -r %s %s", dir, odd);
    sh("rm %s/c0/0000.png && ln -s /dev/zero %s/c0/0000.png", odd, odd);
    run_t zero_first = {{odd, NULL}, 0, TIDE_EINVAL, 0, 0};
    run_logged(&one, &zero_first, "0000.png is a device, not a regular file");
    sh("rm %s/c0/0000.png%s", odd, "");
    sh("cp %s/c0/0000.png %s/c0/", dir, odd);
    sh("rm %s/c1/0003.png && ln -s /dev/zero %s/c1/0003.png", odd, odd);
    sh("rm %s/c0/0006.png && mkfifo %s/c0/0006.png", odd, odd);
    run_t odd_later = {{odd, NULL}, 0, 0, TIDE_EIO, 0};
    run_logged(&one, &odd_later, ", not a regular file");
    sh("cp -r %s %s", dir, fifo_first);
    sh("rm %s/c0/0000.png && mkfifo %s/c0/0000.png", fifo_first, fifo_first);
    harness_opts_t one_short = {1, NULL, 0, 30, NULL}; /* before the fix: hung until this ran out */
    run_t fifo = {{fifo_first, NULL}, 0, TIDE_EINVAL, 0, 0};
    run_logged(&one_short, &fifo, "0000.png is a FIFO");

  }
  if (section("http")) {
    fprintf(stderr, "-- HTTP: a server that sends more than the index says is cut off\n");
    snprintf(http_root, sizeof http_root, "%s", root);
    http_port = harness_http_serve(http_conn);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/folder", http_port);
    setenv("TIDE_DATA_TIMEOUT_MS", "20000", 1);
    setenv("TIDE_DATA_INDEX_MAX_BYTES", "1048576", 1);
    run_t http = {{url, NULL}, 0, 0, 0, 0};
    run_logged(&one, &http, NULL); /* it serves the folder as it is */
    /* config.height: no probe, so the first object is read by the loader's threads */
    run_t object = {{url, NULL}, H, 0, TIDE_EIO, 0};
    atomic_store(&http_mode, SERVE_HUGE_LENGTH);
    atomic_store(&http_sent, 0);
    run_logged(&one, &object, "more than");
    usleep(200000); /* the server thread notices the close */
    long huge = atomic_load(&http_sent);
    atomic_store(&http_mode, SERVE_ENDLESS_CHUNKED);
    atomic_store(&http_sent, 0);
    run_logged(&one, &object, "the size the index gives it");
    usleep(200000);
    long chunked = atomic_load(&http_sent);
    atomic_store(&http_mode, SERVE_ENDLESS_INDEX);
    atomic_store(&http_sent, 0);
    run_t index = {{url, NULL}, 0, TIDE_EIO, 0, 0};
    run_logged(&one, &index, "TIDE_DATA_INDEX_MAX_BYTES");
    usleep(200000); /* the server thread notices the close */
    long endless = atomic_load(&http_sent);
    fprintf(stderr, "  the server got to send %ld (10 GB Content-Length), %ld (chunked) and %ld (index) bytes of its "
            "%ld before the loader hung up\n", huge, chunked, endless, SERVER_MAX);
    /* what the socket buffers hold, not the whole 64 MiB the server offers */
    CHECK(huge < SERVER_MAX / 2 && chunked < SERVER_MAX / 2 && endless < SERVER_MAX / 2);
    atomic_store(&http_mode, SERVE_404_PAGE);
    run_logged(&one, &object, "answered HTTP 404");
    fprintf(stderr, "-- HTTP: a server that goes silent: the timeout named is TIDE_DATA_TIMEOUT_MS\n");
    atomic_store(&http_mode, SERVE_SILENT);
    setenv("TIDE_DATA_TIMEOUT_MS", "1000", 1);
    run_t silent = {{url, NULL}, 0, TIDE_ETIMEDOUT, 0, 0};
    run_logged_without(&one, &silent, "TIDE_DATA_TIMEOUT_MS", "waiting for a peer");
    setenv("TIDE_DATA_TIMEOUT_MS", "20000", 1);
    atomic_store(&http_mode, SERVE_FILE);
  }

  if (section("shm")) {
    fprintf(stderr, "-- the sample store's /dev/shm name: removed when the store cannot be made, and reclaimed "
                    "from a rank that died making it\n");
    char pid_path[400], cmd[1200];
    /* 512 x 512 samples: 3 MiB, past a 1 MiB RLIMIT_FSIZE */
    run_t full = {{dir, NULL}, 512, TIDE_ENOMEM, 0, 1l << 20};
    run_logged(&one, &full, "cannot make the host's sample store");
    snprintf(pid_path, sizeof pid_path, "%s/pid-0", root);
    FILE *f = fopen(pid_path, "r");
    int rank_pid = 0;
    CHECK(f != NULL && fscanf(f, "%d", &rank_pid) == 1);
    fclose(f);
    snprintf(cmd, sizeof cmd, "! ls /dev/shm/tide-data-%d-* 2>/dev/null", rank_pid);
    CHECK(system(cmd) == 0);
    /* a rank killed between shm_open and the unlink leaves this behind; the
     * name of a live process (this one) stays */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    CHECK(waitpid(dead, &status, 0) == dead);
    char stale[200], live[200];
    snprintf(stale, sizeof stale, "/dev/shm/tide-data-%d-00000000deadbeef", (int)dead);
    snprintf(live, sizeof live, "/dev/shm/tide-data-%d-00000000000a11fe", (int)getpid());
    write_file(stale, "x", 1);
    write_file(live, "x", 1);
    run_t same = {{dir, NULL}, 0, 0, 0, 0};
    run_logged(&one, &same, NULL);
    CHECK(access(stale, F_OK) != 0 && errno == ENOENT);
    CHECK(access(live, F_OK) == 0);
    unlink(live);
  }

  sh("rm -rf %s%s", root, "");
  fprintf(stderr, "test_data_limits: ok\n");
  return 0;
}
