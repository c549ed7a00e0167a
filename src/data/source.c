/* Sources of samples: an ImageFolder directory (one sub-folder per class),
 * the same layout behind HTTP(S) (index.txt listing classes and objects,
 * fetched with libcurl), and Fashion-MNIST's idx files. Remote reads go
 * through the disk cache; HTTP failures are retried with back-off. */
#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data.h"

#define INDEX_V1 "tide-imagefolder 1"
#define INDEX_V2 "tide-imagefolder 2"
#define MAX_ITEMS 100000000u

static const char *fashion_classes[10] = {"T-shirt", "Trouser", "Pullover", "Dress", "Coat",
                                          "Sandal",  "Shirt",   "Sneaker",  "Bag",   "Ankle-boot"};

/* ---- HTTP ------------------------------------------------------------------ */

struct tide__fetcher {
  CURL *curl;
};

typedef struct {
  uint8_t *data;
  size_t len, cap;
  int failed;
  uint64_t max;       /* the most bytes the body may have */
  int too_long;       /* the server sent (or announced) more than max */
  CURL *curl;         /* for the status: an error page is not kept */
  uint64_t discarded; /* bytes of an error page */
} buffer_t;

/* An error page (a 404's HTML) is read and dropped, up to this much. */
#define ERROR_BODY_MAX 65536

static int append(buffer_t *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n) cap *= 2;
    uint8_t *grown = tide__realloc(b->data, cap);
    if (grown == NULL) return -1;
    b->data = grown;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  buffer_t *b = arg;
  long status = 0;
  if (b->curl != NULL) curl_easy_getinfo(b->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 300) {
    b->discarded += size * n;
    return b->discarded > ERROR_BODY_MAX ? 0 : size * n;
  }
  if (size * n > b->max - b->len) {
    b->too_long = 1;
    return 0;
  }
  if (append(b, p, size * n) != 0) {
    b->failed = 1;
    return 0;
  }
  return size * n;
}

/* Keeps an ETag or Last-Modified header value in arg (char[256]). */
static size_t on_header(char *p, size_t size, size_t n, void *arg) {
  size_t len = size * n;
  char *out = arg;
  for (int k = 0; k < 2; k++) {
    const char *name = k == 0 ? "etag:" : "last-modified:";
    size_t nl = strlen(name);
    if (len > nl && strncasecmp(p, name, nl) == 0 && (k == 0 || out[0] == '\0')) {
      while (nl < len && (p[nl] == ' ' || p[nl] == '\t')) nl++;
      size_t v = len - nl;
      if (v > 255) v = 255;
      memcpy(out, p + nl, v);
      out[v] = '\0';
      for (char *e = out + strlen(out); e > out && isspace((unsigned char)e[-1]);) *--e = '\0';
    }
  }
  return len;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

int tide__fetcher_create(tide__fetcher_t **out) {
  pthread_once(&curl_once, curl_init);
  tide__fetcher_t *f = tide__calloc(1, sizeof *f);
  if (f == NULL) return TIDE_ENOMEM;
  if ((f->curl = curl_easy_init()) == NULL) {
    tide__free(f);
    return TIDE_ENOMEM;
  }
  *out = f;
  return 0;
}

void tide__fetcher_destroy(tide__fetcher_t *f) {
  if (f == NULL) return;
  curl_easy_cleanup(f->curl);
  tide__free(f);
}

/* GETs url into *data with retries: 404 (and other 4xx) fail at once,
 * anything else (refused, reset, timed out, 5xx) is retried
 * TIDE_DATA_RETRIES times, waiting 100 ms, 200 ms, ... (at most 5 s).
 * At most max bytes of body are read: a larger Content-Length, or a body
 * (chunked or not) that goes past max, is TIDE_EIO at once, not retried;
 * bound says where max comes from, for the message. */
static int http_get(tide__source_t *src, tide__fetcher_t *f, const char *url, uint64_t max, const char *bound,
                    uint8_t **data, size_t *len, char *etag, const char *if_none_match) {
  int retries = (int)tide__param_int(TIDE__PARAM_DATA_RETRIES);
  long timeout_ms = (long)tide__param_int(TIDE__PARAM_DATA_TIMEOUT_MS);
  char errbuf[CURL_ERROR_SIZE];
  int rc = TIDE_EIO;
  for (int attempt = 0; attempt <= retries; attempt++) {
    if (attempt > 0) {
      int64_t ms = 100LL << (attempt - 1 < 6 ? attempt - 1 : 6);
      if (ms > 5000) ms = 5000;
      struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
      nanosleep(&ts, NULL);
      if (src != NULL) atomic_fetch_add(&src->retries, 1);
    }
    buffer_t b = {0};
    CURL *c = f->curl;
    b.max = max;
    b.curl = c;
    char tag[256] = "";
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, tag);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)(max < INT64_MAX ? max : INT64_MAX));
    struct curl_slist *headers = NULL;
    if (if_none_match != NULL && if_none_match[0] != '\0') {
      char h[300];
      snprintf(h, sizeof h, "If-None-Match: %s", if_none_match);
      headers = curl_slist_append(NULL, h);
      curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    }
    errbuf[0] = '\0';
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    int cut = b.too_long || b.discarded > ERROR_BODY_MAX || cc == CURLE_FILESIZE_EXCEEDED;
    if (cut && status >= 300) {
      cc = CURLE_OK; /* an error page cut short: its status is the answer */
    } else if (cut) {
      tide__free(b.data);
      TIDE_ERROR("data source: %s sent (or announced) more than %llu bytes, %s; refused after reading at most "
                 "that much",
                 url, (unsigned long long)max, bound);
      return TIDE_EIO;
    }
    if (cc == CURLE_OK && status == 304) {
      tide__free(b.data);
      if (src != NULL) atomic_fetch_add(&src->source_requests, 1);
      return 1; /* not modified */
    }
    if (cc == CURLE_OK && status >= 200 && status < 300) {
      if (src != NULL) {
        atomic_fetch_add(&src->source_bytes, b.len);
        atomic_fetch_add(&src->source_requests, 1);
      }
      if (etag != NULL) strcpy(etag, tag);
      *data = b.data != NULL ? b.data : tide__malloc(1);
      *len = b.len;
      return *data != NULL ? 0 : TIDE_ENOMEM;
    }
    tide__free(b.data);
    if (cc == CURLE_OK && status >= 400 && status < 500) {
      TIDE_ERROR("data source: %s answered HTTP %ld%s", url, status,
                 status == 404 ? " (not found: check the URL and the index)" : "");
      return status == 404 ? TIDE_ENOENT : TIDE_EIO;
    }
    if (cc == CURLE_OK)
      TIDE_WARN("data source: %s answered HTTP %ld (attempt %d of %d)", url, status, attempt + 1, retries + 1);
    else
      TIDE_WARN("data source: %s: %s (attempt %d of %d)", url, errbuf[0] ? errbuf : curl_easy_strerror(cc),
                attempt + 1, retries + 1);
    rc = cc == CURLE_OPERATION_TIMEDOUT ? TIDE_ETIMEDOUT : TIDE_EIO;
  }
  TIDE_ERROR("data source: giving up on %s after %d attempts (TIDE_DATA_RETRIES=%d, each bounded by "
             "TIDE_DATA_TIMEOUT_MS=%ld)",
             url, retries + 1, retries, timeout_ms);
  return rc;
}

/* ---- listings ---------------------------------------------------------------- */

static int is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  if (dot == NULL) return 0;
  return strcasecmp(dot, ".png") == 0 || strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir that pass keep (d_type: want_dir). */
static int list_names(const char *dir, int want_dir, char ***out, size_t *count) {
  DIR *d = opendir(dir);
  if (d == NULL) return errno == ENOENT || errno == ENOTDIR ? TIDE_ENOENT : TIDE_EIO;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  int rc = 0;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    int isdir = de->d_type == DT_DIR;
    if (de->d_type == DT_UNKNOWN || de->d_type == DT_LNK) {
      struct stat st;
      if (fstatat(dirfd(d), de->d_name, &st, 0) != 0) continue;
      isdir = S_ISDIR(st.st_mode);
    }
    if (isdir != want_dir || (!want_dir && !is_image_name(de->d_name))) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **grown = tide__realloc(names, cap * sizeof *names);
      if (grown == NULL) {
        rc = TIDE_ENOMEM;
        break;
      }
      names = grown;
    }
    if ((names[n] = tide__strdup(de->d_name)) == NULL) {
      rc = TIDE_ENOMEM;
      break;
    }
    n++;
  }
  closedir(d);
  if (rc != 0) {
    for (size_t i = 0; i < n; i++) tide__free(names[i]);
    tide__free(names);
    return rc;
  }
  if (n > 1) qsort(names, n, sizeof *names, cmp_str);
  *out = names;
  *count = n;
  return 0;
}

/* The array (count used of *cap) with room for one more element: itself,
 * or a larger copy (doubling from first); NULL when out of memory (the
 * array is then unchanged). */
static void *grow(void *array, size_t *cap, size_t count, size_t esize, size_t first) {
  if (count < *cap) return array;
  size_t grown_cap = *cap ? *cap * 2 : first;
  void *grown = tide__realloc(array, grown_cap * esize);
  if (grown != NULL) *cap = grown_cap;
  return grown;
}

static int add_item(tide__source_t *s, size_t *cap, char *path, uint64_t size, int32_t label) {
  tide__item_t *items = grow(s->items, cap, s->count, sizeof *items, 1024);
  if (items == NULL) {
    tide__free(path);
    return TIDE_ENOMEM;
  }
  s->items = items;
  s->items[s->count++] = (tide__item_t){path, size, label, -1, 0};
  return 0;
}

/* Takes the sub-folder "shards" out of the classes when it holds tide's
 * shards (shards/00000.bin), so that a folder packed in place (tide data
 * index DIR --shard-bytes N) still lists as it did. */
static void drop_shard_folder(tide__source_t *s) {
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/shards/00000.bin", s->root);
  if (access(probe, F_OK) != 0) return;
  for (size_t k = 0; k < s->nclasses; k++)
    if (strcmp(s->classes[k], "shards") == 0) {
      tide__free(s->classes[k]);
      memmove(&s->classes[k], &s->classes[k + 1], (s->nclasses - k - 1) * sizeof *s->classes);
      s->nclasses--;
      return;
    }
}

static int open_dir(tide__source_t *s) {
  int rc = list_names(s->root, 1, &s->classes, &s->nclasses);
  if (rc == 0) drop_shard_folder(s);
  if (rc == TIDE_ENOENT) {
    TIDE_ERROR("data source: no directory %s (give an ImageFolder directory, an http:// URL or fashion-mnist)",
               s->root);
    return rc;
  }
  if (rc < 0) {
    TIDE_ERROR("data source: cannot list %s: %s", s->root, strerror(errno));
    return rc;
  }
  size_t cap = 0;
  for (size_t k = 0; k < s->nclasses; k++) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", s->root, s->classes[k]);
    char **files;
    size_t nfiles;
    TIDE_CHECK(list_names(dir, 0, &files, &nfiles));
    for (size_t i = 0; i < nfiles; i++) {
      size_t plen = strlen(s->classes[k]) + strlen(files[i]) + 2;
      char *path = tide__malloc(plen);
      if (path != NULL) snprintf(path, plen, "%s/%s", s->classes[k], files[i]);
      tide__free(files[i]);
      if (rc == 0) rc = path == NULL ? TIDE_ENOMEM : add_item(s, &cap, path, 0, (int32_t)k);
    }
    tide__free(files);
    TIDE_CHECK(rc);
  }
  if (s->count == 0) {
    TIDE_ERROR("data source: %s holds no images (expected CLASS/NAME.png or .jpg, one sub-folder per class)",
               s->root);
    return TIDE_EINVAL;
  }
  return 0;
}

static int add_shard(tide__source_t *s, size_t *cap, char *path, uint64_t size) {
  tide__shard_t *shards = grow(s->shards, cap, s->nshards, sizeof *shards, 64);
  if (shards == NULL) {
    tide__free(path);
    return TIDE_ENOMEM;
  }
  s->shards = shards;
  s->shards[s->nshards++] = (tide__shard_t){path, size, 0, 0};
  return 0;
}

/* A sharded index's samples: each shard's are consecutive, in shard order,
 * and lie inside it. */
static int check_shards(tide__source_t *s, const char *where) {
  if (s->nshards == 0) {
    TIDE_ERROR("data source: %s (version 2) lists no shards", where);
    return TIDE_EINVAL;
  }
  int64_t last = -1;
  for (size_t i = 0; i < s->count; i++) {
    const tide__item_t *it = &s->items[i];
    if (it->shard < last || (uint64_t)it->shard >= s->nshards) {
      TIDE_ERROR("data source: %s: sample %zu (%s) names shard %lld: the samples of a shard must be consecutive, "
                 "in shard order, and the shard listed (write the index again with tide data index)",
                 where, i, it->path, (long long)it->shard);
      return TIDE_EINVAL;
    }
    tide__shard_t *sh = &s->shards[it->shard];
    if (it->shard != last) sh->first = i;
    sh->count++;
    last = it->shard;
    if (it->offset > sh->size || it->size > sh->size - it->offset) {
      TIDE_ERROR("data source: %s: sample %zu (%s) at bytes %llu+%llu lies outside %s (%llu bytes)", where, i,
                 it->path, (unsigned long long)it->offset, (unsigned long long)it->size, sh->path,
                 (unsigned long long)sh->size);
      return TIDE_EINVAL;
    }
  }
  for (size_t k = 0; k < s->nshards; k++)
    if (s->shards[k].count == 0) {
      TIDE_ERROR("data source: %s: shard %zu (%s) holds no sample", where, k, s->shards[k].path);
      return TIDE_EINVAL;
    }
  return 0;
}

/* Parses index.txt (text, len bytes, NUL-terminated by the caller):
 * version 1 lists one object per sample ("file K BYTES PATH"), version 2
 * shards ("shard S BYTES PATH") and the samples inside them ("sample K S
 * OFFSET LENGTH NAME"), and may give the decoded shape ("shape H W C"). */
static int parse_index(tide__source_t *s, char *text, const char *where) {
  char *save = NULL, *line = strtok_r(text, "\n", &save);
  int version = 0;
  if (line != NULL && strncmp(line, INDEX_V1, strlen(INDEX_V1)) == 0) version = 1;
  if (line != NULL && strncmp(line, INDEX_V2, strlen(INDEX_V2)) == 0) version = 2;
  if (version == 0) {
    TIDE_ERROR("data source: %s is not a tide index (first line must be \"%s\" or \"%s\"; tide data index DIR "
               "writes one)",
               where, INDEX_V1, INDEX_V2);
    return TIDE_EINVAL;
  }
  size_t cap = 0, class_cap = 0, shard_cap = 0, lineno = 1;
  while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
    lineno++;
    unsigned long long a, b, c, d;
    int off = 0, h, w, ch;
    if (sscanf(line, "class %llu %n", &a, &off) == 1 && off > 0) {
      if (a != s->nclasses || line[off] == '\0') goto bad;
      if (s->nclasses == class_cap) {
        class_cap = class_cap ? class_cap * 2 : 16;
        char **grown = tide__realloc(s->classes, class_cap * sizeof *grown);
        if (grown == NULL) return TIDE_ENOMEM;
        s->classes = grown;
      }
      if ((s->classes[s->nclasses] = tide__strdup(line + off)) == NULL) return TIDE_ENOMEM;
      s->nclasses++;
    } else if (version == 1 && sscanf(line, "file %llu %llu %n", &a, &b, &off) == 2 && off > 0) {
      if (a >= s->nclasses || line[off] == '\0' || strstr(line + off, "..") != NULL || s->count >= MAX_ITEMS)
        goto bad;
      char *path = tide__strdup(line + off);
      if (path == NULL) return TIDE_ENOMEM;
      TIDE_CHECK(add_item(s, &cap, path, b, (int32_t)a));
    } else if (version == 2 && sscanf(line, "shard %llu %llu %n", &a, &b, &off) == 2 && off > 0) {
      if (a != s->nshards || line[off] == '\0' || strstr(line + off, "..") != NULL || s->nshards >= MAX_ITEMS)
        goto bad;
      char *path = tide__strdup(line + off);
      if (path == NULL) return TIDE_ENOMEM;
      TIDE_CHECK(add_shard(s, &shard_cap, path, b));
    } else if (version == 2 && sscanf(line, "sample %llu %llu %llu %llu %n", &a, &b, &c, &d, &off) == 4 &&
               off > 0) {
      if (a >= s->nclasses || line[off] == '\0' || s->count >= MAX_ITEMS) goto bad;
      char *name = tide__strdup(line + off);
      if (name == NULL) return TIDE_ENOMEM;
      TIDE_CHECK(add_item(s, &cap, name, d, (int32_t)a));
      s->items[s->count - 1].shard = (int64_t)b;
      s->items[s->count - 1].offset = c;
    } else if (version == 2 && sscanf(line, "shape %d %d %d", &h, &w, &ch) == 3) {
      if (h < 1 || w < 1 || h > 16384 || w > 16384 || (ch != 1 && ch != 3)) goto bad;
      s->shape[0] = h, s->shape[1] = w, s->shape[2] = ch;
    } else if (line[0] != '\0' && line[0] != '#') {
      goto bad;
    }
  }
  if (s->count == 0) {
    TIDE_ERROR("data source: %s lists no %s", where, version == 1 ? "files" : "samples");
    return TIDE_EINVAL;
  }
  return version == 2 ? check_shards(s, where) : 0;
bad:
  if (version == 1)
    TIDE_ERROR("data source: %s line %zu is not \"class K NAME\" (K = 0, 1, ... in order) or \"file K BYTES PATH\"",
               where, lineno);
  else
    TIDE_ERROR("data source: %s line %zu is not \"class K NAME\", \"shard S BYTES PATH\" (K, S = 0, 1, ... in "
               "order), \"sample K S OFFSET LENGTH NAME\" or \"shape H W C\"",
               where, lineno);
  return TIDE_EINVAL;
}

/* index.txt, revalidated against the copy in the cache (If-None-Match:
 * a 304 moves no body), so a run with a warm cache reads no bytes of the
 * source. The cached copy is "ETAG\n" + the index. */
static int open_http(tide__source_t *s, tide__cache_t *cache) {
  tide__fetcher_t *f;
  TIDE_CHECK(tide__fetcher_create(&f));
  char url[4200], tag[256] = "", key[4300], cached_tag[256] = "";
  snprintf(url, sizeof url, "%s/index.txt", s->root);
  snprintf(key, sizeof key, "index|%s", url);
  uint8_t *cached = NULL, *data = NULL;
  size_t cached_len = 0, len = 0;
  if (cache != NULL && tide__cache_get(cache, key, &cached, &cached_len) == 0) {
    uint8_t *nl = memchr(cached, '\n', cached_len);
    if (nl != NULL && (size_t)(nl - cached) < sizeof cached_tag) {
      memcpy(cached_tag, cached, (size_t)(nl - cached));
      cached_tag[nl - cached] = '\0';
    }
  }
  int rc = http_get(s, f, url, (uint64_t)tide__param_int(TIDE__PARAM_DATA_INDEX_MAX_BYTES),
                    "the bound on an index (TIDE_DATA_INDEX_MAX_BYTES): check that the URL serves a tide index, "
                    "or raise the bound if the index really is that large",
                    &data, &len, tag, cached_tag[0] ? cached_tag : NULL);
  tide__fetcher_destroy(f);
  if (rc == 1) { /* not modified: the cached index */
    size_t head = strlen(cached_tag) + 1;
    strcpy(tag, cached_tag);
    len = cached_len - head;
    data = tide__malloc(len + 1);
    if (data == NULL) rc = TIDE_ENOMEM;
    else {
      memcpy(data, cached + head, len);
      rc = 0;
    }
  } else if (rc == 0 && cache != NULL && tag[0] != '\0') {
    size_t n = strlen(tag) + 1 + len;
    uint8_t *entry = tide__malloc(n);
    if (entry != NULL) {
      memcpy(entry, tag, strlen(tag));
      entry[strlen(tag)] = '\n';
      memcpy(entry + strlen(tag) + 1, data, len);
      tide__cache_put(cache, key, entry, n);
      tide__free(entry);
    }
  }
  tide__free(cached);
  if (rc < 0) return rc;
  char *text = tide__realloc(data, len + 1);
  if (text == NULL) {
    tide__free(data);
    return TIDE_ENOMEM;
  }
  text[len] = '\0';
  rc = parse_index(s, text, url);
  tide__free(text);
  if (rc < 0) return rc;
  size_t n = strlen(s->root) + strlen(tag) + 4;
  tide__free(s->identity);
  if ((s->identity = tide__malloc(n)) == NULL) return TIDE_ENOMEM;
  snprintf(s->identity, n, "%s|%s", s->root, tag);
  return 0;
}

/* ---- Fashion-MNIST idx -------------------------------------------------------- */

static int read_idx(const char *path, uint32_t magic, int dims, uint32_t *shape, uint8_t **data, size_t *len) {
  gzFile g = gzopen(path, "rb");
  if (g == NULL) {
    TIDE_ERROR("data source: cannot open %s: %s (install the Debian package dataset-fashion-mnist)", path,
               strerror(errno));
    return errno == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  }
  uint8_t head[16];
  int need = 4 + 4 * dims, rc = 0;
  size_t total = 1;
  if (gzread(g, head, (unsigned)need) != need) rc = TIDE_EINVAL;
  for (int d = 0; rc == 0 && d <= dims; d++) {
    uint32_t v = (uint32_t)head[4 * d] << 24 | (uint32_t)head[4 * d + 1] << 16 | (uint32_t)head[4 * d + 2] << 8 |
                 head[4 * d + 3];
    if (d == 0 && v != magic) rc = TIDE_EINVAL;
    if (d > 0) {
      shape[d - 1] = v;
      if (v == 0 || v > MAX_ITEMS) rc = TIDE_EINVAL;
      total *= v;
    }
  }
  uint8_t *buf = rc == 0 ? tide__malloc(total) : NULL;
  if (rc == 0 && buf == NULL) rc = TIDE_ENOMEM;
  if (rc == 0 && gzread(g, buf, (unsigned)total) != (int)total) rc = TIDE_EINVAL;
  gzclose(g);
  if (rc != 0) {
    tide__free(buf);
    if (rc == TIDE_EINVAL) TIDE_ERROR("data source: %s is not a whole idx file (bad header or truncated)", path);
    return rc;
  }
  *data = buf;
  *len = total;
  return 0;
}

static int open_idx(tide__source_t *s, const char *split) {
  const char *prefix = strcmp(split, "test") == 0 ? "t10k" : "train";
  char images[4200], labels[4200];
  for (int gz = 1; gz >= 0; gz--) {
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte%s", s->root, prefix, gz ? ".gz" : "");
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte%s", s->root, prefix, gz ? ".gz" : "");
    if (access(images, R_OK) == 0) break;
  }
  uint32_t ishape[3], lshape[1];
  uint8_t *label_bytes;
  size_t ilen, llen;
  TIDE_CHECK(read_idx(images, 0x803, 3, ishape, &s->idx_pixels, &ilen));
  TIDE_CHECK(read_idx(labels, 0x801, 1, lshape, &label_bytes, &llen));
  if (lshape[0] != ishape[0]) {
    tide__free(label_bytes);
    TIDE_ERROR("data source: %s has %u labels for %u images in %s", labels, lshape[0], ishape[0], images);
    return TIDE_EINVAL;
  }
  s->idx_height = (int)ishape[1];
  s->idx_width = (int)ishape[2];
  size_t cap = 0;
  int rc = 0;
  for (uint32_t i = 0; rc == 0 && i < ishape[0]; i++) rc = add_item(s, &cap, NULL, 0, label_bytes[i]);
  tide__free(label_bytes);
  TIDE_CHECK(rc);
  if ((s->classes = tide__calloc(10, sizeof *s->classes)) == NULL) return TIDE_ENOMEM;
  for (int k = 0; k < 10; k++)
    if ((s->classes[k] = tide__strdup(fashion_classes[k])) == NULL) return TIDE_ENOMEM;
  s->nclasses = 10;
  return 0;
}

/* ---- the source ---------------------------------------------------------------- */

/* Frees the listing: items, classes, shards and root (not s itself). */
static void free_listing(tide__source_t *s) {
  for (size_t i = 0; i < s->count; i++) tide__free(s->items[i].path);
  for (size_t k = 0; k < s->nclasses; k++) tide__free(s->classes[k]);
  for (size_t k = 0; k < s->nshards; k++) tide__free(s->shards[k].path);
  tide__free(s->shards);
  tide__free(s->items);
  tide__free(s->classes);
  tide__free(s->root);
}

void tide__source_close(tide__source_t *s) {
  if (s == NULL) return;
  free_listing(s);
  tide__free(s->idx_pixels);
  tide__free(s->identity);
  tide__free(s);
}

tide__source_kind_t tide__source_kind(const char *spec) {
  if (strncmp(spec, "fashion-mnist", 13) == 0 && (spec[13] == '\0' || spec[13] == ':')) return TIDE__SOURCE_IDX;
  if (strncmp(spec, "http://", 7) == 0 || strncmp(spec, "https://", 8) == 0) return TIDE__SOURCE_HTTP;
  return TIDE__SOURCE_DIR;
}

static int read_local(const char *path, uint64_t max, uint8_t **data, size_t *len);

/* A directory whose index.txt is a sharded one (version 2) is read through
 * it; *used says whether it was. */
static int open_dir_index(tide__source_t *s, int *used) {
  char path[4200], head[32] = "";
  snprintf(path, sizeof path, "%s/index.txt", s->root);
  *used = 0;
  FILE *f = fopen(path, "rb");
  if (f == NULL) return 0;
  size_t n = fread(head, 1, strlen(INDEX_V2), f);
  fclose(f);
  if (n != strlen(INDEX_V2) || memcmp(head, INDEX_V2, n) != 0) return 0;
  uint8_t *data;
  size_t len;
  TIDE_CHECK(read_local(path, (uint64_t)tide__param_int(TIDE__PARAM_DATA_INDEX_MAX_BYTES), &data, &len));
  char *text = tide__realloc(data, len + 1);
  if (text == NULL) {
    tide__free(data);
    return TIDE_ENOMEM;
  }
  text[len] = '\0';
  int rc = parse_index(s, text, path);
  tide__free(text);
  *used = 1;
  return rc;
}

static int source_open(const char *spec, const char *split, tide__cache_t *cache, int listing,
                       tide__source_t **out) {
  if (spec == NULL || spec[0] == '\0') {
    TIDE_ERROR("data source: the source is empty: give a directory, an http:// URL or fashion-mnist[:DIR]");
    return TIDE_EINVAL;
  }
  if (split == NULL) split = "train";
  if (strcmp(split, "train") != 0 && strcmp(split, "test") != 0) {
    TIDE_ERROR("data source: split \"%s\" must be train or test", split);
    return TIDE_EINVAL;
  }
  tide__source_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  const char *root = spec;
  s->kind = listing ? TIDE__SOURCE_DIR : tide__source_kind(spec);
  if (s->kind == TIDE__SOURCE_IDX) root = spec[13] == ':' ? spec + 14 : "/usr/share/datasets/fashion-mnist";
  int rc = TIDE_ENOMEM;
  if ((s->root = tide__strdup(root)) != NULL) {
    for (size_t n = strlen(s->root); n > 1 && s->root[n - 1] == '/'; n--) s->root[n - 1] = '\0';
    if ((s->identity = tide__strdup(s->root)) != NULL) {
      int used = 0;
      rc = s->kind == TIDE__SOURCE_IDX    ? open_idx(s, split)
           : s->kind == TIDE__SOURCE_HTTP ? open_http(s, cache)
           : listing                      ? 0
                                          : open_dir_index(s, &used);
      if (rc == 0 && s->kind == TIDE__SOURCE_DIR && !used) rc = open_dir(s);
    }
  }
  if (rc < 0) {
    tide__source_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

int tide__source_open(const char *spec, const char *split, tide__cache_t *cache, tide__source_t **out) {
  return source_open(spec, split, cache, 0, out);
}

int tide__source_open_listing(const char *dir, tide__source_t **out) { return source_open(dir, NULL, NULL, 1, out); }

/* Reads the regular file path whole, at most max bytes. Anything else (a
 * FIFO, a device such as /dev/zero behind a symlink, a socket) is refused
 * before a byte is read: opened non-blocking, so a FIFO cannot hang the
 * open, and checked with fstat. The read has TIDE_DATA_TIMEOUT_MS, as an
 * HTTP request has (a stuck network file system fails between chunks). */
static int read_local(const char *path, uint64_t max, uint8_t **data, size_t *len) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    TIDE_ERROR("data source: cannot open %s: %s", path, strerror(e));
    return e == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    TIDE_ERROR("data source: cannot stat %s: %s", path, strerror(errno));
    close(fd);
    return TIDE_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    const char *what = S_ISFIFO(st.st_mode)                          ? "a FIFO"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                       : S_ISDIR(st.st_mode)                        ? "a directory"
                                                                    : "something else";
    TIDE_ERROR("data source: %s is %s, not a regular file (a symlink is followed); refused: a data set holds "
               "only regular files, so remove it or replace it with the image",
               path, what);
    close(fd);
    return TIDE_EINVAL;
  }
  if ((uint64_t)st.st_size > max) {
    TIDE_ERROR("data source: %s is %lld bytes, more than TIDE_DATA_INDEX_MAX_BYTES=%llu (the bound on an index, "
               "and on a file the index gives no size); refused: raise the bound if the file really is that large",
               path, (long long)st.st_size, (unsigned long long)max);
    close(fd);
    return TIDE_EINVAL;
  }
  int64_t timeout_ms = tide__param_int(TIDE__PARAM_DATA_TIMEOUT_MS);
  int64_t deadline = tide__now_ns() + timeout_ms * 1000000;
  size_t n = (size_t)st.st_size, got = 0;
  uint8_t *buf = tide__malloc(n ? n : 1);
  int rc = buf == NULL ? TIDE_ENOMEM : 0;
  while (rc == 0 && got < n) {
    ssize_t r = read(fd, buf + got, n - got < 65536 ? n - got : 65536);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      TIDE_ERROR("data source: read error on %s: %s", path, strerror(errno));
      rc = TIDE_EIO;
    } else if (r == 0) {
      TIDE_ERROR("data source: %s shrank from %zu to %zu bytes while it was read; refused", path, n, got);
      rc = TIDE_EIO;
    } else {
      got += (size_t)r;
      if (got < n && tide__now_ns() > deadline) {
        TIDE_ERROR("data source: reading %s took more than TIDE_DATA_TIMEOUT_MS=%lld ms (%zu of %zu bytes)", path,
                   (long long)timeout_ms, got, n);
        rc = TIDE_ETIMEDOUT;
      }
    }
  }
  close(fd);
  if (rc < 0) {
    tide__free(buf);
    return rc;
  }
  *data = buf;
  *len = n;
  return 0;
}

/* Reads the object rel (size bytes by the index, 0: unknown) through the
 * cache. */
static int read_object(tide__source_t *s, const char *rel, uint64_t size, int shard, tide__cache_t *cache,
                       tide__fetcher_t *f, uint8_t **data, size_t *len) {
  char where[4400], key[4700];
  snprintf(where, sizeof where, "%s/%s", s->root, rel);
  if (s->kind == TIDE__SOURCE_DIR && cache != NULL) {
    struct stat st;
    if (stat(where, &st) != 0) {
      TIDE_ERROR("data source: cannot open %s: %s", where, strerror(errno));
      return TIDE_ENOENT;
    }
    snprintf(key, sizeof key, "file|%s|%lld|%lld.%09ld", where, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
             st.st_mtim.tv_nsec);
  } else if (s->kind == TIDE__SOURCE_HTTP) {
    snprintf(key, sizeof key, "http|%s|%llu|%s", where, (unsigned long long)size, s->identity);
  }
  if (cache != NULL && tide__cache_get(cache, key, data, len) == 0) {
    if (size == 0 || *len == size) return 0;
    tide__free(*data); /* an entry of another length under this key cannot be the object: refetch */
  }
  int rc;
  if (s->kind == TIDE__SOURCE_DIR) {
    /* the file's own size sizes the buffer; a size other than the index's is refused below */
    rc = read_local(where, (uint64_t)tide__param_int(TIDE__PARAM_DATA_INDEX_MAX_BYTES), data, len);
    if (rc == 0) {
      atomic_fetch_add(&s->source_bytes, *len);
      atomic_fetch_add(&s->source_requests, 1);
    }
  } else {
    if (size != 0)
      rc = http_get(s, f, where, size, shard ? "the size the index gives this shard: write the shards and their "
                                               "index again (tide data export|index --shard-bytes)"
                                             : "the size the index gives it: the object changed after the index "
                                               "was written; write the index again (tide data index DIR)",
                    data, len, NULL, NULL);
    else
      rc = http_get(s, f, where, (uint64_t)tide__param_int(TIDE__PARAM_DATA_INDEX_MAX_BYTES),
                    "the bound on an object the index gives no size (TIDE_DATA_INDEX_MAX_BYTES)", data, len, NULL,
                    NULL);
  }
  if (rc == 0 && size != 0 && *len != size) {
    if (shard)
      TIDE_ERROR("data source: shard %s is %zu bytes, the index says %llu: it was changed or truncated after it "
                 "was written; write the shards and their index again (tide data export|index --shard-bytes)",
                 where, *len, (unsigned long long)size);
    else
      TIDE_ERROR("data source: %s sent %zu bytes, the index says %llu", where, *len, (unsigned long long)size);
    tide__free(*data);
    *data = NULL;
    return TIDE_EIO;
  }
  if (rc == 0 && cache != NULL) tide__cache_put(cache, key, *data, *len);
  return rc;
}

int tide__source_read_shard(tide__source_t *s, size_t k, tide__cache_t *cache, tide__fetcher_t *f, uint8_t **data,
                            size_t *len) {
  if (s->kind == TIDE__SOURCE_IDX || k >= s->nshards) return TIDE_EINVAL;
  return read_object(s, s->shards[k].path, s->shards[k].size, 1, cache, f, data, len);
}

int tide__source_read(tide__source_t *s, size_t i, tide__cache_t *cache, tide__fetcher_t *f, uint8_t **data,
                      size_t *len) {
  if (s->kind == TIDE__SOURCE_IDX || i >= s->count) return TIDE_EINVAL;
  const tide__item_t *it = &s->items[i];
  if (it->shard < 0) return read_object(s, it->path, it->size, 0, cache, f, data, len);
  uint8_t *whole;
  size_t whole_len;
  TIDE_CHECK(tide__source_read_shard(s, (size_t)it->shard, cache, f, &whole, &whole_len));
  uint8_t *copy = tide__malloc(it->size ? it->size : 1);
  if (copy != NULL) memcpy(copy, whole + it->offset, it->size);
  tide__free(whole);
  if (copy == NULL) return TIDE_ENOMEM;
  *data = copy;
  *len = it->size;
  return 0;
}

int tide__source_write_index(const tide__source_t *s, FILE *out) {
  fprintf(out, "%s\n", s->nshards > 0 ? INDEX_V2 : INDEX_V1);
  if (s->nshards > 0 && s->shape[0] > 0) fprintf(out, "shape %d %d %d\n", s->shape[0], s->shape[1], s->shape[2]);
  for (size_t k = 0; k < s->nclasses; k++) fprintf(out, "class %zu %s\n", k, s->classes[k]);
  for (size_t k = 0; k < s->nshards; k++)
    fprintf(out, "shard %zu %llu %s\n", k, (unsigned long long)s->shards[k].size, s->shards[k].path);
  for (size_t i = 0; i < s->count; i++) {
    const tide__item_t *it = &s->items[i];
    if (it->shard >= 0) {
      fprintf(out, "sample %d %lld %llu %llu %s\n", (int)it->label, (long long)it->shard,
              (unsigned long long)it->offset, (unsigned long long)it->size, it->path);
      continue;
    }
    uint64_t size = it->size;
    if (s->kind == TIDE__SOURCE_DIR) {
      char where[4400];
      struct stat st;
      snprintf(where, sizeof where, "%s/%s", s->root, it->path);
      if (stat(where, &st) != 0) {
        TIDE_ERROR("tide data index: cannot stat %s: %s", where, strerror(errno));
        return TIDE_EIO;
      }
      size = (uint64_t)st.st_size;
    }
    fprintf(out, "file %d %llu %s\n", (int)it->label, (unsigned long long)size, it->path != NULL ? it->path : "?");
  }
  return ferror(out) ? TIDE_EIO : 0;
}

/* ---- writing shards ------------------------------------------------------------ */

struct tide__shard_writer {
  tide__source_t set; /* what the index will list: classes, shards, samples */
  size_t item_cap, shard_cap;
  uint64_t shard_bytes, total;
  FILE *cur;
  char cur_path[4400], cur_tmp[4500];
};

static int shard_close(tide__shard_writer_t *w) {
  if (w->cur == NULL) return 0;
  int bad = ferror(w->cur) != 0;
  bad |= fclose(w->cur) != 0;
  w->cur = NULL;
  if (!bad && rename(w->cur_tmp, w->cur_path) != 0) bad = 1;
  if (bad) {
    TIDE_ERROR("tide data: cannot write %s: %s", w->cur_path, strerror(errno));
    remove(w->cur_tmp);
    return TIDE_EIO;
  }
  return 0;
}

int tide__shard_writer_open(const char *dir, uint64_t shard_bytes, char *const *classes, size_t nclasses,
                            tide__shard_writer_t **out) {
  if (shard_bytes == 0) {
    TIDE_ERROR("tide data: --shard-bytes must be > 0");
    return TIDE_EINVAL;
  }
  tide__shard_writer_t *w = tide__calloc(1, sizeof *w);
  if (w == NULL) return TIDE_ENOMEM;
  w->shard_bytes = shard_bytes;
  w->set.kind = TIDE__SOURCE_DIR;
  int rc = 0;
  char sub[4200];
  snprintf(sub, sizeof sub, "%s/shards", dir);
  if ((w->set.root = tide__strdup(dir)) == NULL || (w->set.classes = tide__calloc(nclasses + 1, sizeof(char *))) == NULL)
    rc = TIDE_ENOMEM;
  for (size_t k = 0; rc == 0 && k < nclasses; k++) {
    if ((w->set.classes[k] = tide__strdup(classes[k])) == NULL) rc = TIDE_ENOMEM;
    else w->set.nclasses++;
  }
  if (rc == 0 && ((mkdir(dir, 0777) != 0 && errno != EEXIST) || (mkdir(sub, 0777) != 0 && errno != EEXIST))) {
    TIDE_ERROR("tide data: cannot create %s: %s", sub, strerror(errno));
    rc = TIDE_EIO;
  }
  if (rc < 0) {
    tide__shard_writer_abort(w);
    return rc;
  }
  *out = w;
  return 0;
}

int tide__shard_writer_add(tide__shard_writer_t *w, int32_t label, const char *name, const void *data, size_t len) {
  if (label < 0 || (size_t)label >= w->set.nclasses || name == NULL || name[0] == '\0' || strchr(name, '\n')) {
    TIDE_ERROR("tide data: sample %zu (%s) has label %d of %zu classes or no one-line name", w->set.count,
               name ? name : "?", (int)label, w->set.nclasses);
    return TIDE_EINVAL;
  }
  if (w->cur == NULL || (w->set.shards[w->set.nshards - 1].size > 0 &&
                         w->set.shards[w->set.nshards - 1].size + len > w->shard_bytes)) {
    TIDE_CHECK(shard_close(w));
    char rel[64];
    snprintf(rel, sizeof rel, "shards/%05zu.bin", w->set.nshards);
    snprintf(w->cur_path, sizeof w->cur_path, "%s/%s", w->set.root, rel);
    snprintf(w->cur_tmp, sizeof w->cur_tmp, "%s.tmp%d", w->cur_path, (int)getpid());
    char *path = tide__strdup(rel);
    if (path == NULL) return TIDE_ENOMEM;
    TIDE_CHECK(add_shard(&w->set, &w->shard_cap, path, 0));
    if ((w->cur = fopen(w->cur_tmp, "wb")) == NULL) {
      TIDE_ERROR("tide data: cannot write %s: %s", w->cur_tmp, strerror(errno));
      return TIDE_EIO;
    }
  }
  tide__shard_t *sh = &w->set.shards[w->set.nshards - 1];
  if (len > 0 && fwrite(data, 1, len, w->cur) != len) {
    TIDE_ERROR("tide data: cannot write %s: %s", w->cur_tmp, strerror(errno));
    return TIDE_EIO;
  }
  if (w->set.count == 0) {
    int h, wd, c;
    if (tide__image_probe(data, len, &h, &wd, &c, NULL, 0) == 0 && (c == 1 || c == 3)) {
      w->set.shape[0] = h, w->set.shape[1] = wd, w->set.shape[2] = c;
    }
  }
  char *copy = tide__strdup(name);
  if (copy == NULL) return TIDE_ENOMEM;
  TIDE_CHECK(add_item(&w->set, &w->item_cap, copy, len, label));
  w->set.items[w->set.count - 1].shard = (int64_t)(w->set.nshards - 1);
  w->set.items[w->set.count - 1].offset = sh->size;
  sh->size += len;
  w->total += len;
  return 0;
}

void tide__shard_writer_abort(tide__shard_writer_t *w) {
  if (w == NULL) return;
  if (w->cur != NULL) {
    fclose(w->cur);
    remove(w->cur_tmp);
  }
  free_listing(&w->set);
  tide__free(w);
}

int tide__shard_writer_finish(tide__shard_writer_t *w, size_t *shards, uint64_t *bytes) {
  int rc = shard_close(w);
  if (rc == 0 && w->set.count == 0) {
    TIDE_ERROR("tide data: no samples to pack into shards");
    rc = TIDE_EINVAL;
  }
  char path[4400], tmp[4400];
  snprintf(path, sizeof path, "%s/index.txt", w->set.root);
  snprintf(tmp, sizeof tmp, "%s/.index.txt.%d", w->set.root, (int)getpid());
  FILE *f = rc == 0 ? fopen(tmp, "w") : NULL;
  if (rc == 0 && f == NULL) rc = TIDE_EIO;
  if (f != NULL) {
    rc = tide__source_write_index(&w->set, f);
    if (fclose(f) != 0 && rc == 0) rc = TIDE_EIO;
    if (rc == 0 && rename(tmp, path) != 0) rc = TIDE_EIO;
    if (rc != 0) remove(tmp);
  }
  if (rc == TIDE_EIO) TIDE_ERROR("tide data: cannot write %s: %s", path, strerror(errno));
  /* shards a previous packing of this folder left beyond the new ones */
  for (size_t k = w->set.nshards; rc == 0; k++) {
    char stale[4500];
    snprintf(stale, sizeof stale, "%s/shards/%05zu.bin", w->set.root, k);
    if (remove(stale) != 0) break;
  }
  if (rc == 0 && shards != NULL) *shards = w->set.nshards;
  if (rc == 0 && bytes != NULL) *bytes = w->total;
  tide__shard_writer_abort(w);
  return rc;
}

int tide__source_write_shards(tide__source_t *src, const char *out_dir, uint64_t shard_bytes, size_t *shards,
                              uint64_t *bytes) {
  if (src->kind == TIDE__SOURCE_IDX || src->nshards > 0) {
    TIDE_ERROR("tide data: %s is not a per-file ImageFolder listing to pack into shards", src->root);
    return TIDE_EINVAL;
  }
  tide__shard_writer_t *w;
  TIDE_CHECK(tide__shard_writer_open(out_dir, shard_bytes, src->classes, src->nclasses, &w));
  tide__fetcher_t *f = NULL;
  int rc = src->kind == TIDE__SOURCE_HTTP ? tide__fetcher_create(&f) : 0;
  for (size_t i = 0; rc == 0 && i < src->count; i++) {
    uint8_t *data;
    size_t len;
    rc = tide__source_read(src, i, NULL, f, &data, &len);
    if (rc == 0) {
      rc = tide__shard_writer_add(w, src->items[i].label, src->items[i].path, data, len);
      tide__free(data);
    }
  }
  tide__fetcher_destroy(f);
  if (rc < 0) {
    tide__shard_writer_abort(w);
    return rc;
  }
  return tide__shard_writer_finish(w, shards, bytes);
}
