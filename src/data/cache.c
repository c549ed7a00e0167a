/* The per-node disk cache: one file per object under DIR/objects, named by
 * the SHA-256 of the object's identity (source, path or URL, size, mtime or
 * ETag). Each file is a header (magic, key, length, SHA-256 of the payload)
 * and the payload, written to DIR/tmp and renamed into place, so a killed
 * writer leaves at most a temporary file and a reader sees a whole entry or
 * none; a payload whose checksum fails is removed and refetched. Recency is
 * the file's mtime (touched on every hit); past the size bound the oldest
 * entries go, under an flock on DIR/lock that every job sharing DIR takes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data.h"

#define MAGIC "TIDEDC01"

struct tide__cache {
  char *dir;
  uint64_t max_bytes;
  _Atomic uint64_t hits, misses, bad, evicted, bytes_read, bytes_written;
  _Atomic uint64_t since_scan; /* bytes written since the last eviction scan */
  _Atomic uint64_t total;      /* the directory's bytes at the last scan, plus writes since */
  _Atomic uint64_t put_failed; /* objects that could not be written (a full disk): warned once, counted */
};

typedef struct {
  char magic[8];
  uint64_t len;
  uint32_t key_len, reserved;
  uint8_t sha[32];
} header_t;

static int mkdir_p(const char *path) {
  char buf[4096];
  if (strlen(path) >= sizeof buf) return TIDE_EINVAL;
  strcpy(buf, path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) return TIDE_EIO;
    *p = '/';
  }
  if (mkdir(buf, 0700) != 0 && errno != EEXIST) return TIDE_EIO;
  return 0;
}

void tide__cache_default_dir(char *out, size_t cap) {
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (xdg != NULL && xdg[0] == '/')
    snprintf(out, cap, "%s/tide/data", xdg);
  else if (home != NULL && home[0] == '/')
    snprintf(out, cap, "%s/.cache/tide/data", home);
  else
    snprintf(out, cap, "/tmp/tide-data-cache-%u", (unsigned)getuid());
}

static int lock_dir(const char *dir, int op) {
  char path[4200];
  snprintf(path, sizeof path, "%s/lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -1;
  while (flock(fd, op) != 0) {
    if (errno != EINTR) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

typedef struct {
  char name[80];
  int64_t mtime_ns;
  uint64_t bytes;
} entry_t;

static int by_age(const void *a, const void *b) {
  const entry_t *x = a, *y = b;
  return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* Lists DIR/objects; *entries malloc'd (may be NULL when empty). */
static int scan(const char *dir, entry_t **entries, size_t *count, uint64_t *bytes) {
  char path[4200];
  snprintf(path, sizeof path, "%s/objects", dir);
  DIR *d = opendir(path);
  *entries = NULL;
  *count = 0;
  *bytes = 0;
  if (d == NULL) return errno == ENOENT ? 0 : TIDE_EIO;
  size_t cap = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(*entries)->name) continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, 0) != 0) continue;
    if (*count == cap) {
      cap = cap ? cap * 2 : 256;
      entry_t *grown = tide__realloc(*entries, cap * sizeof **entries);
      if (grown == NULL) {
        closedir(d);
        tide__free(*entries);
        *entries = NULL;
        return TIDE_ENOMEM;
      }
      *entries = grown;
    }
    entry_t *e = &(*entries)[(*count)++];
    strcpy(e->name, de->d_name);
    e->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    e->bytes = (uint64_t)st.st_size;
    *bytes += e->bytes;
  }
  closedir(d);
  return 0;
}

/* Removes the least recently used entries until the directory holds at most
 * 90% of the bound. Under the directory's lock. */
static void evict(tide__cache_t *c) {
  int fd = lock_dir(c->dir, LOCK_EX);
  if (fd < 0) return;
  entry_t *entries;
  size_t count;
  uint64_t bytes;
  if (scan(c->dir, &entries, &count, &bytes) == 0) {
    if (bytes > c->max_bytes) {
      qsort(entries, count, sizeof *entries, by_age);
      uint64_t target = c->max_bytes / 10 * 9;
      char path[4300];
      for (size_t i = 0; i < count && bytes > target; i++) {
        snprintf(path, sizeof path, "%s/objects/%s", c->dir, entries[i].name);
        if (unlink(path) == 0) {
          bytes -= entries[i].bytes;
          atomic_fetch_add(&c->evicted, 1);
        }
      }
    }
    atomic_store(&c->total, bytes);
    tide__free(entries);
  }
  close(fd);
}

/* Removes DIR/tmp/PID-* and stats-PID files whose writer (PID) is dead: a
 * writer killed between its open and its rename. */
static void sweep_tmp(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/tmp", dir);
  DIR *d = opendir(path);
  if (d == NULL) return;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    char *end;
    const char *p = strncmp(de->d_name, "stats-", 6) == 0 ? de->d_name + 6 : de->d_name;
    long pid = strtol(p, &end, 10);
    if (pid <= 0 || (*end != '-' && !(*end == '\0' && p != de->d_name)) || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    unlinkat(dirfd(d), de->d_name, 0);
  }
  closedir(d);
}

int tide__cache_open(const char *dir, uint64_t max_bytes, tide__cache_t **out) {
  if (dir == NULL || dir[0] == '\0') {
    TIDE_ERROR("tide__cache_open: no cache directory given");
    return TIDE_EINVAL;
  }
  char sub[4200];
  snprintf(sub, sizeof sub, "%s/objects", dir);
  int rc = mkdir_p(sub);
  snprintf(sub, sizeof sub, "%s/tmp", dir);
  if (rc == 0) rc = mkdir_p(sub);
  if (rc != 0) {
    TIDE_ERROR("data cache: cannot create the directory %s: %s (set TIDE_DATA_CACHE or --cache-dir to a "
               "writable place)",
               dir, strerror(errno));
    return TIDE_EIO;
  }
  /* the fallback under /tmp has a predictable name: one another user made
   * first could read or plant entries */
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
    TIDE_ERROR("data cache: %s is not a directory of this user (uid %u; it belongs to uid %u): refused (set "
               "TIDE_DATA_CACHE or --cache-dir to a directory of your own)",
               dir, (unsigned)geteuid(), (unsigned)st.st_uid);
    return TIDE_EINVAL;
  }
  sweep_tmp(dir);
  tide__cache_t *c = tide__calloc(1, sizeof *c);
  if (c == NULL || (c->dir = tide__strdup(dir)) == NULL) {
    tide__free(c);
    return TIDE_ENOMEM;
  }
  c->max_bytes = max_bytes;
  entry_t *entries;
  size_t count;
  uint64_t bytes;
  if (scan(dir, &entries, &count, &bytes) == 0) {
    atomic_store(&c->total, bytes);
    tide__free(entries);
  }
  if (max_bytes > 0 && bytes > max_bytes) evict(c);
  *out = c;
  return 0;
}

static void key_path(const tide__cache_t *c, const char *key, char *out, size_t cap) {
  uint8_t sha[32];
  tide__sha256(key, strlen(key), sha);
  int n = snprintf(out, cap, "%s/objects/", c->dir);
  for (int i = 0; i < 20 && (size_t)n + 3 < cap; i++) n += snprintf(out + n, cap - (size_t)n, "%02x", sha[i]);
}

/* An entry is a regular file the cache wrote: a symlink is not followed
 * (O_NOFOLLOW), a FIFO cannot block the open (O_NONBLOCK), and anything
 * but a regular file is NOT_REGULAR (then removed and refetched). */
enum { NOT_REGULAR = 1 };
static int read_file(const char *path, uint8_t **data, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ELOOP) return NOT_REGULAR;
  if (fd < 0) return errno == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return TIDE_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return NOT_REGULAR;
  }
  size_t n = (size_t)st.st_size, got = 0;
  uint8_t *buf = tide__malloc(n ? n : 1);
  if (buf == NULL) {
    close(fd);
    return TIDE_ENOMEM;
  }
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  *data = buf;
  *len = got;
  return 0;
}

int tide__cache_get(tide__cache_t *c, const char *key, uint8_t **data, size_t *len) {
  char path[4300];
  key_path(c, key, path, sizeof path);
  uint8_t *buf;
  size_t n;
  int rc = read_file(path, &buf, &n);
  if (rc == TIDE_ENOENT) {
    atomic_fetch_add(&c->misses, 1);
    return TIDE_ENOENT;
  }
  if (rc == NOT_REGULAR) {
    TIDE_WARN("data cache: the entry %s for %s is not a regular file (a symlink, FIFO or device: the cache never "
              "writes one); removed, fetching the object again",
              path, key);
    unlink(path);
    atomic_fetch_add(&c->bad, 1);
    atomic_fetch_add(&c->misses, 1);
    return TIDE_ENOENT;
  }
  if (rc < 0) return rc;
  header_t h;
  size_t key_len = strlen(key);
  int ok = n >= sizeof h;
  if (ok) memcpy(&h, buf, sizeof h);
  ok = ok && memcmp(h.magic, MAGIC, 8) == 0 && h.key_len == key_len && n - sizeof h >= key_len &&
       h.len == n - sizeof h - key_len && memcmp(buf + sizeof h, key, key_len) == 0;
  if (ok) {
    uint8_t sha[32];
    tide__sha256(buf + sizeof h + key_len, (size_t)h.len, sha);
    ok = memcmp(sha, h.sha, 32) == 0;
  }
  if (!ok) {
    TIDE_WARN("data cache: the entry %s for %s fails its checksum; removed, fetching the object again", path, key);
    unlink(path);
    tide__free(buf);
    atomic_fetch_add(&c->bad, 1);
    atomic_fetch_add(&c->misses, 1);
    return TIDE_ENOENT;
  }
  memmove(buf, buf + sizeof h + key_len, (size_t)h.len);
  utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW); /* recency for LRU */
  atomic_fetch_add(&c->hits, 1);
  atomic_fetch_add(&c->bytes_read, h.len);
  *data = buf;
  *len = (size_t)h.len;
  return 0;
}

/* A write that failed: warned the first time only (a full disk fails every
 * one), counted, and the count given at close. */
static void put_failed(tide__cache_t *c, const char *path) {
  if (atomic_fetch_add(&c->put_failed, 1) == 0)
    TIDE_WARN("data cache: cannot write %s: %s (the object is used uncached; later failures are counted, not "
              "reported one by one)",
              path, strerror(errno));
}

int tide__cache_put(tide__cache_t *c, const char *key, const void *data, size_t len) {
  header_t h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, MAGIC, 8);
  h.len = len;
  h.key_len = (uint32_t)strlen(key);
  tide__sha256(data, len, h.sha);
  char final[4300], tmp[4400];
  key_path(c, key, final, sizeof final);
  uint64_t nonce;
  tide__random_bytes(&nonce, sizeof nonce);
  snprintf(tmp, sizeof tmp, "%s/tmp/%d-%016llx", c->dir, (int)getpid(), (unsigned long long)nonce);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    put_failed(c, tmp);
    return TIDE_EIO;
  }
  const struct {
    const void *p;
    size_t n;
  } parts[3] = {{&h, sizeof h}, {key, h.key_len}, {data, len}};
  int rc = 0;
  for (int i = 0; i < 3 && rc == 0; i++) {
    size_t done = 0;
    while (done < parts[i].n) {
      ssize_t w = write(fd, (const uint8_t *)parts[i].p + done, parts[i].n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        rc = TIDE_EIO;
        break;
      }
      done += (size_t)w;
    }
  }
  if (close(fd) != 0) rc = TIDE_EIO;
  if (rc == 0 && rename(tmp, final) != 0) rc = TIDE_EIO;
  if (rc != 0) {
    int saved = errno;
    unlink(tmp);
    errno = saved;
    put_failed(c, final);
    return rc;
  }
  uint64_t bytes = sizeof h + h.key_len + len;
  atomic_fetch_add(&c->bytes_written, len);
  uint64_t total = atomic_fetch_add(&c->total, bytes) + bytes;
  if (c->max_bytes > 0 && total > c->max_bytes) evict(c);
  return 0;
}

void tide__cache_counts(const tide__cache_t *c, tide__cache_counts_t *out) {
  *out = (tide__cache_counts_t){atomic_load(&c->hits),    atomic_load(&c->misses),     atomic_load(&c->bad),
                                atomic_load(&c->evicted), atomic_load(&c->bytes_read), atomic_load(&c->bytes_written)};
}

#define NCOUNTS 6
static const char *count_names[NCOUNTS] = {"hits", "misses", "bad", "evicted", "bytes_read", "bytes_written"};

static void read_stats(const char *dir, uint64_t v[NCOUNTS]) {
  char path[4200], name[64];
  snprintf(path, sizeof path, "%s/stats", dir);
  memset(v, 0, NCOUNTS * sizeof *v);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
  if (f == NULL) {
    if (fd >= 0) close(fd);
    return;
  }
  unsigned long long x;
  while (fscanf(f, "%63s %llu", name, &x) == 2)
    for (int i = 0; i < NCOUNTS; i++)
      if (strcmp(name, count_names[i]) == 0) v[i] = x;
  fclose(f);
}

void tide__cache_close(tide__cache_t *c) {
  if (c == NULL) return;
  tide__cache_counts_t k;
  tide__cache_counts(c, &k);
  uint64_t failed = atomic_load(&c->put_failed);
  if (failed > 1)
    TIDE_WARN("data cache: %llu objects could not be written to %s (the first failure was reported above)",
              (unsigned long long)failed, c->dir);
  uint64_t add[NCOUNTS] = {k.hits, k.misses, k.bad, k.evicted, k.bytes_read, k.bytes_written}, v[NCOUNTS];
  int fd = lock_dir(c->dir, LOCK_EX);
  if (fd >= 0) {
    read_stats(c->dir, v);
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/stats", c->dir);
    snprintf(tmp, sizeof tmp, "%s/tmp/stats-%d", c->dir, (int)getpid());
    int sfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = sfd >= 0 ? fdopen(sfd, "w") : NULL;
    if (f == NULL && sfd >= 0) close(sfd);
    if (f != NULL) {
      for (int i = 0; i < NCOUNTS; i++) fprintf(f, "%s %llu\n", count_names[i], (unsigned long long)(v[i] + add[i]));
      if (fclose(f) == 0) rename(tmp, path);
    }
    close(fd);
  }
  tide__free(c->dir);
  tide__free(c);
}

int tide_data_cache_dir(char *out, size_t cap) {
  if (out == NULL || cap < 2) {
    TIDE_ERROR("tide_data_cache_dir: out must hold at least 2 bytes (give 4096)");
    return TIDE_EINVAL;
  }
  const char *env = tide__param_str(TIDE__PARAM_DATA_CACHE);
  int n;
  if (env[0] != '\0' && strcmp(env, "none") != 0) {
    n = snprintf(out, cap, "%s", env);
  } else {
    char dir[4096];
    tide__cache_default_dir(dir, sizeof dir);
    n = snprintf(out, cap, "%s", dir);
  }
  if (n < 0 || (size_t)n >= cap) {
    TIDE_ERROR("tide_data_cache_dir: the directory does not fit in %zu bytes (give 4096)", cap);
    return TIDE_EINVAL;
  }
  return 0;
}

int tide_data_cache_stats(const char *dir, tide_data_cache_stats_t *out) {
  if (dir == NULL || out == NULL) return tide__null_arg("tide_data_cache_stats", dir == NULL ? "dir" : "out");
  struct stat st;
  if (stat(dir, &st) != 0) {
    TIDE_ERROR("tide data stats: no cache at %s: %s", dir, strerror(errno));
    return TIDE_ENOENT;
  }
  entry_t *entries;
  size_t count;
  uint64_t bytes, v[NCOUNTS];
  TIDE_CHECK(scan(dir, &entries, &count, &bytes));
  tide__free(entries);
  read_stats(dir, v);
  *out = (tide_data_cache_stats_t){.entries = count, .bytes = bytes,
                                   .bound_bytes = (uint64_t)tide__param_int(TIDE__PARAM_DATA_CACHE_BYTES),
                                   .hits = v[0], .misses = v[1], .refetched = v[2], .evicted = v[3],
                                   .bytes_served = v[4], .bytes_fetched = v[5]};
  return 0;
}
