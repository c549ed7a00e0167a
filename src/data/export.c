/* Datasets on disk (tide data export / index; docs/data.md): a dataset tide
 * reads natively exported as an ImageFolder directory or as shards, and an
 * ImageFolder directory indexed or packed into shards. The public
 * tide_data_export and tide_data_index; the `tide data` command only parses
 * its arguments and prints.
 *
 * Threads: any; two calls must not write the same directory at once. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data.h"

/* dir/index.txt of src, written under a temporary name and renamed. */
static int write_index(const tide__source_t *src, const char *dir) {
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s/index.txt", dir);
  snprintf(tmp, sizeof tmp, "%s/.index.txt.%d", dir, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    TIDE_ERROR("tide data: cannot write %s: %s", tmp, strerror(errno));
    return TIDE_EIO;
  }
  int rc = tide__source_write_index(src, f);
  if (fclose(f) != 0 || rc != 0 || rename(tmp, path) != 0) {
    TIDE_ERROR("tide data: cannot write %s", path);
    remove(tmp);
    return rc != 0 ? rc : TIDE_EIO;
  }
  return 0;
}

/* Writes the first count images of src (an idx source) as PNGs into dir: one
 * file per image (w NULL) or through the shard writer. *bytes: PNG bytes. */
static int write_images(const tide__source_t *src, size_t count, char *const *classes, const char *dir,
                        tide__shard_writer_t *w, uint64_t *bytes) {
  size_t pixels = (size_t)src->idx_height * (size_t)src->idx_width;
  int rc = 0;
  /* Sharded: by class, then by index, the per-file layout's sorted order. */
  for (size_t pass = 0; pass < (w != NULL ? src->nclasses : 1); pass++) {
    for (size_t i = 0; rc == 0 && i < count; i++) {
      int32_t label = src->items[i].label;
      if (w != NULL && (size_t)label != pass) continue;
      uint8_t *png;
      size_t len;
      rc = tide__png_encode(src->idx_pixels + i * pixels, src->idx_height, src->idx_width, 1, &png, &len);
      if (rc != 0) break;
      char rel[300], path[4600];
      snprintf(rel, sizeof rel, "%s/%05zu.png", classes[label], i);
      if (w != NULL) {
        rc = tide__shard_writer_add(w, label, rel, png, len);
      } else {
        snprintf(path, sizeof path, "%s/%s", dir, rel);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(png, 1, len, f) != len || fclose(f) != 0) {
          TIDE_ERROR("tide data export: cannot write %s: %s", path, strerror(errno));
          rc = TIDE_EIO;
        }
      }
      tide__free(png);
      *bytes += len;
    }
  }
  return rc;
}

int tide_data_export(const char *name, const char *dir, const char *split, const char *from, long limit,
                     uint64_t shard_bytes, tide_data_summary_t *out) {
  static const char fn[] = "tide_data_export";
  if (name == NULL || dir == NULL) return tide__null_arg(fn, name == NULL ? "name" : "dir");
  if (strcmp(name, "fashion-mnist") != 0) {
    TIDE_ERROR("%s: name \"%s\": only fashion-mnist can be exported", fn, name);
    return TIDE_EINVAL;
  }
  if (limit < 0) {
    TIDE_ERROR("%s: limit %ld must be >= 0 (0: all images)", fn, limit);
    return TIDE_EINVAL;
  }
  char spec[4200];
  snprintf(spec, sizeof spec, "fashion-mnist%s%s", from ? ":" : "", from ? from : "");
  tide__source_t *src;
  TIDE_CHECK(tide__source_open(spec, split != NULL ? split : "train", NULL, &src));
  size_t count = limit > 0 && (size_t)limit < src->count ? (size_t)limit : src->count;
  /* Class folders are named K_NAME, so their sorted order is Fashion-MNIST's
   * labels; a sharded export names its classes and samples the same way. */
  size_t nclasses = src->nclasses, shards = 0;
  char **classes = tide__calloc(nclasses, sizeof *classes);
  int rc = classes == NULL ? TIDE_ENOMEM : 0;
  for (size_t k = 0; rc == 0 && k < nclasses; k++) {
    char label[256];
    snprintf(label, sizeof label, "%zu_%s", k, src->classes[k]);
    if ((classes[k] = strdup(label)) == NULL) rc = TIDE_ENOMEM;
  }
  if (rc == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST) rc = TIDE_EIO;
  for (size_t k = 0; rc == 0 && shard_bytes == 0 && k < nclasses; k++) {
    char sub[4300];
    snprintf(sub, sizeof sub, "%s/%s", dir, classes[k]);
    if (mkdir(sub, 0777) != 0 && errno != EEXIST) rc = TIDE_EIO;
  }
  if (rc == TIDE_EIO) TIDE_ERROR("tide data export: cannot create %s: %s", dir, strerror(errno));
  tide__shard_writer_t *w = NULL;
  if (rc == 0 && shard_bytes > 0) rc = tide__shard_writer_open(dir, shard_bytes, classes, nclasses, &w);
  uint64_t bytes = 0;
  if (rc == 0) rc = write_images(src, count, classes, dir, w, &bytes);
  tide__source_close(src);
  if (rc == 0 && w != NULL)
    rc = tide__shard_writer_finish(w, &shards, NULL);
  else
    tide__shard_writer_abort(w);
  for (size_t k = 0; classes != NULL && k < nclasses; k++) free(classes[k]);
  tide__free(classes);
  if (rc == 0 && shard_bytes == 0) {
    /* The index lists the directory as written (sorted classes and names). */
    tide__source_t *folder;
    TIDE_CHECK(tide__source_open_listing(dir, &folder));
    rc = write_index(folder, dir);
    tide__source_close(folder);
  }
  if (rc == 0 && out != NULL) *out = (tide_data_summary_t){count, nclasses, shards, bytes};
  return rc;
}

int tide_data_index(const char *dir, uint64_t shard_bytes, const char *out_dir, tide_data_summary_t *out) {
  if (dir == NULL) return tide__null_arg("tide_data_index", "dir");
  tide__source_t *src;
  TIDE_CHECK(tide__source_open_listing(dir, &src));
  tide_data_summary_t sum = {src->count, src->nclasses, 0, 0};
  int rc;
  if (shard_bytes > 0)
    rc = tide__source_write_shards(src, out_dir != NULL ? out_dir : dir, shard_bytes, &sum.shards, &sum.bytes);
  else
    rc = write_index(src, dir);
  tide__source_close(src);
  if (rc == 0 && out != NULL) *out = sum;
  return rc;
}
