/* The data pipeline's internals (docs/data.md): where samples come from
 * (sources), the per-node disk cache in front of remote ones, and the
 * decoders. The loader (loader.c) puts them together with the in-memory
 * store split across nodes and the prefetch threads.
 *
 * Threads: a source and a cache may be read by any number of threads at
 * once; each thread that fetches over HTTP passes its own tide__fetcher_t. */
#ifndef TIDE_DATA_H
#define TIDE_DATA_H

#include <stdint.h>

#include "core/core.h"

/* ---- disk cache (cache.c) -------------------------------------------------- */

typedef struct tide__cache tide__cache_t;

/* Counters of one process's use of a cache (atomics inside the cache). */
typedef struct {
  uint64_t hits, misses, bad, evicted, bytes_read, bytes_written;
} tide__cache_counts_t;

/* Opens (creating) the cache directory dir, bounded to max_bytes (0: no
 * bound). TIDE_EINVAL/TIDE_EIO name the directory. */
int tide__cache_open(const char *dir, uint64_t max_bytes, tide__cache_t **out);
/* Flushes this process's counters into dir/stats (under the lock) and frees. */
void tide__cache_close(tide__cache_t *cache);
/* The entry of key (a source's identity of an object): 0 and a malloc'd
 * copy in *data and *len when present and its checksum holds; TIDE_ENOENT when
 * absent; an entry that fails its checksum is removed, counted as bad and
 * reported as TIDE_ENOENT (so the caller refetches). */
int tide__cache_get(tide__cache_t *cache, const char *key, uint8_t **data, size_t *len);
/* Stores data under key: written to a temporary file and renamed into
 * place, so readers see a whole entry or none; evicts least recently used
 * entries (under an flock shared by every process using dir) past the bound. */
int tide__cache_put(tide__cache_t *cache, const char *key, const void *data, size_t len);
void tide__cache_counts(const tide__cache_t *cache, tide__cache_counts_t *out);
/* The default directory: $XDG_CACHE_HOME/tide/data, ~/.cache/tide/data, or
 * /tmp/tide-data-cache-UID. */
void tide__cache_default_dir(char *out, size_t cap);
/* What dir holds and the counters every run has added to dir/stats: the
 * public tide_data_cache_stats. */

/* ---- sources (source.c) ---------------------------------------------------- */

typedef enum { TIDE__SOURCE_DIR = 0, TIDE__SOURCE_HTTP, TIDE__SOURCE_IDX } tide__source_kind_t;

typedef struct {
  char *path;   /* relative to the root (dir, http); in a sharded set, the
                   sample's name (its file's path when it was packed); NULL for idx */
  uint64_t size; /* bytes, from the listing (0 unknown) */
  int32_t label;
  int64_t shard;   /* a sharded set: the shard holding it; -1: its own object */
  uint64_t offset; /* a sharded set: its first byte within the shard */
} tide__item_t;

/* A shard: one object holding the encoded samples [first, first + count)
 * (index version 2: the plain concatenation of their files). */
typedef struct {
  char *path; /* relative to the root, e.g. shards/00000.bin */
  uint64_t size;
  uint64_t first, count;
} tide__shard_t;

typedef struct tide__source {
  tide__source_kind_t kind;
  char *root;     /* directory or URL without the trailing slash */
  char *identity; /* dir: root; http: root + the index's ETag or Last-Modified */
  tide__item_t *items;
  size_t count;
  char **classes;
  size_t nclasses;
  /* sharded (index version 2): the shards, and the decoded shape the index
   * gives (0: not given) */
  tide__shard_t *shards;
  size_t nshards;
  int shape[3];
  /* idx: every image decoded already (count x 28 x 28). */
  uint8_t *idx_pixels;
  int idx_height, idx_width;
  _Atomic uint64_t source_bytes, source_requests, retries;
} tide__source_t;

/* A thread's HTTP connection (keep-alive across requests). */
typedef struct tide__fetcher tide__fetcher_t;
int tide__fetcher_create(tide__fetcher_t **out);
void tide__fetcher_destroy(tide__fetcher_t *f);

/* Opens spec: "fashion-mnist[:DIR]" (split "train" or "test"), an http://
 * or https:// URL serving index.txt, or a directory in the ImageFolder
 * layout (listed; an index.txt inside is used only when it is a sharded
 * one, version 2, and then the directory is its shards). A URL's
 * index is kept in cache (when not NULL) and revalidated with its ETag.
 * Retries an
 * unanswered index request (TIDE_DATA_RETRIES, back-off) before failing. */
int tide__source_open(const char *spec, const char *split, tide__cache_t *cache, tide__source_t **out);
/* The kind spec names (without opening anything). */
tide__source_kind_t tide__source_kind(const char *spec);
void tide__source_close(tide__source_t *src);
/* The encoded bytes of item i: through the cache when cache is not NULL
 * (a hit reads nothing from the source; a miss fetches and stores). HTTP
 * errors are retried TIDE_DATA_RETRIES times with doubling back-off, each
 * attempt bounded by TIDE_DATA_TIMEOUT_MS. *data is malloc'd. */
int tide__source_read(tide__source_t *src, size_t i, tide__cache_t *cache, tide__fetcher_t *f, uint8_t **data,
                      size_t *len);
/* Opens the directory dir's ImageFolder listing, whatever index.txt it
 * holds (tide data index DIR). */
int tide__source_open_listing(const char *dir, tide__source_t **out);
/* The whole of shard s of a sharded source, through the cache like any
 * object (one GET over HTTP); TIDE_EIO naming the shard when its size is not
 * the index's. *data is malloc'd. */
int tide__source_read_shard(tide__source_t *src, size_t s, tide__cache_t *cache, tide__fetcher_t *f, uint8_t **data,
                            size_t *len);
/* The text of index.txt for src (tide data index): version 1 for a
 * listing, version 2 for a sharded source. */
int tide__source_write_index(const tide__source_t *src, FILE *out);

/* Packs samples into shards of about shard_bytes each (a sample larger
 * than that gets a shard of its own), as dir/shards/NNNNN.bin, and at
 * finish writes dir/index.txt (version 2, written to a temporary file and
 * renamed). add takes the samples in index order; name is the sample's
 * name in messages (its ImageFolder path). One thread. */
typedef struct tide__shard_writer tide__shard_writer_t;
int tide__shard_writer_open(const char *dir, uint64_t shard_bytes, char *const *classes, size_t nclasses,
                            tide__shard_writer_t **out);
int tide__shard_writer_add(tide__shard_writer_t *w, int32_t label, const char *name, const void *data, size_t len);
/* Closes the last shard, writes the index and frees w (also on error);
 * the number of shards and bytes packed in *shards and *bytes (may be NULL). */
int tide__shard_writer_finish(tide__shard_writer_t *w, size_t *shards, uint64_t *bytes);
/* Frees w without writing the index (NULL is fine). */
void tide__shard_writer_abort(tide__shard_writer_t *w);
/* Packs every image of src (a listing) into shards under out_dir
 * (tide data index DIR --shard-bytes N [--out OUT]). */
int tide__source_write_shards(tide__source_t *src, const char *out_dir, uint64_t shard_bytes, size_t *shards,
                              uint64_t *bytes);

/* ---- decoding (decode.c) --------------------------------------------------- */

/* The size of an encoded PNG or JPEG image (reads the header only).
 * TIDE_EINVAL, with the reason in why (cap bytes; why may be NULL), for a
 * damaged header or one that claims more than TIDE_DATA_MAX_IMAGE_PIXELS. */
int tide__image_probe(const uint8_t *data, size_t len, int *height, int *width, int *channels, char *why,
                      size_t cap);
/* Decodes a PNG or JPEG image to out (height x width x channels, uint8,
 * channels 1 or 3), resized by nearest neighbour when its size differs.
 * TIDE_EINVAL for a corrupt or truncated image, or one whose header claims
 * more than TIDE_DATA_MAX_IMAGE_PIXELS pixels (refused before decoding),
 * with the decoder's message in why (cap bytes). */
int tide__image_decode(const uint8_t *data, size_t len, int height, int width, int channels, uint8_t *out,
                       char *why, size_t cap);
/* Encodes height x width x channels pixels as PNG into *data (malloc'd). */
int tide__png_encode(const uint8_t *pixels, int height, int width, int channels, uint8_t **data, size_t *len);

#endif
