/* Fashion-MNIST from the gzip'd idx files Debian's dataset-fashion-mnist
 * installs. Every header field is checked before it sizes an allocation, so a
 * damaged file is an error naming it, never a crash or a huge malloc. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <zlib.h>

#include "nn/nn.h"

#define DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
/* The dataset's own mean and standard deviation of p / 255. */
#define PIXEL_MEAN 0.2860f
#define PIXEL_STD 0.3530f
/* Far above the 60000 of the real files; only guards against absurd headers. */
#define MAX_IMAGES 10000000u

struct nn_dataset {
  size_t count;
  float *images;
  int32_t *labels;
};

size_t nn_dataset_count(const nn_dataset_t *ds) { return ds->count; }
const float *nn_dataset_images(const nn_dataset_t *ds) { return ds->images; }
const int32_t *nn_dataset_labels(const nn_dataset_t *ds) { return ds->labels; }

void nn_dataset_free(nn_dataset_t *ds) {
  if (ds == NULL) return;
  tide_free(ds->images);
  tide_free(ds->labels);
  tide_free(ds);
}

static int not_found(const char *dir, const char *path) {
  tide_log_error("nn_fashion_load: Fashion-MNIST not found at %s: install the Debian package "
                 "dataset-fashion-mnist (apt-get install dataset-fashion-mnist); missing %s",
                 dir, path);
  return TIDE_ENOENT;
}

static int open_idx(const char *dir, const char *path, gzFile *out) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return not_found(dir, path);
    tide_log_error("nn_fashion_load: cannot read %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  gzFile f = gzopen(path, "rb");
  if (f == NULL) {
    tide_log_error("nn_fashion_load: cannot open %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  *out = f;
  return 0;
}

/* Reads exactly len bytes; anything short (truncated or corrupt stream) is a
 * malformed file. */
static int read_exact(gzFile f, const char *path, void *buf, unsigned len) {
  int got = gzread(f, buf, len);
  if (got == (int)len) return 0;
  int zerr = 0;
  const char *why = got < 0 ? gzerror(f, &zerr) : "unexpected end of file";
  tide_log_error("nn_fashion_load: %s is not a valid idx file: %s (wanted %u more bytes)", path, why, len);
  return TIDE_EINVAL;
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads an idx header: magic 0x0000080<ndim> (unsigned bytes), then ndim
 * big-endian sizes. */
static int read_header(gzFile f, const char *path, int ndim, uint32_t *dims) {
  unsigned char head[16];
  TIDE_CHECK(read_exact(f, path, head, 4 + 4 * (unsigned)ndim));
  uint32_t magic = be32(head);
  if (magic != (0x800u | (uint32_t)ndim)) {
    tide_log_error("nn_fashion_load: %s is not an idx%d-ubyte file: magic 0x%08x, wanted 0x%08x", path, ndim, magic,
                   0x800u | (uint32_t)ndim);
    return TIDE_EINVAL;
  }
  for (int i = 0; i < ndim; i++) dims[i] = be32(head + 4 + 4 * i);
  return 0;
}

static int load_labels(const char *dir, const char *path, nn_dataset_t *ds) {
  gzFile f;
  TIDE_CHECK(open_idx(dir, path, &f));
  uint32_t n;
  int rc = read_header(f, path, 1, &n);
  if (rc == 0 && (n == 0 || n > MAX_IMAGES)) {
    tide_log_error("nn_fashion_load: %s claims %u labels; expected 1 to %u", path, n, MAX_IMAGES);
    rc = TIDE_EINVAL;
  }
  unsigned char *raw = NULL;
  if (rc == 0) {
    raw = tide_malloc(n);
    ds->labels = tide_malloc((size_t)n * sizeof *ds->labels);
    rc = raw == NULL || ds->labels == NULL ? TIDE_ENOMEM : read_exact(f, path, raw, n);
  }
  for (uint32_t i = 0; rc == 0 && i < n; i++) {
    if (raw[i] >= NN_CLASSES) {
      tide_log_error("nn_fashion_load: %s: label %u of item %u is not a class in [0, %d)", path, raw[i], i, NN_CLASSES);
      rc = TIDE_EINVAL;
    }
    ds->labels[i] = raw[i];
  }
  if (rc == 0) ds->count = n;
  tide_free(raw);
  gzclose(f);
  return rc;
}

static int load_images(const char *dir, const char *path, nn_dataset_t *ds) {
  gzFile f;
  TIDE_CHECK(open_idx(dir, path, &f));
  uint32_t dims[3];
  int rc = read_header(f, path, 3, dims);
  if (rc == 0 && (dims[0] != ds->count || dims[1] != NN_IMAGE_SIDE || dims[2] != NN_IMAGE_SIDE)) {
    tide_log_error("nn_fashion_load: %s holds %u images of %ux%u; wanted %zu (as many as labels) of 28x28", path,
                   dims[0], dims[1], dims[2], ds->count);
    rc = TIDE_EINVAL;
  }
  enum { CHUNK = 512 };
  unsigned char *raw = NULL;
  if (rc == 0) {
    raw = tide_malloc((size_t)CHUNK * NN_IMAGE_SIZE);
    ds->images = tide_malloc(ds->count * NN_IMAGE_SIZE * sizeof *ds->images);
    if (raw == NULL || ds->images == NULL) rc = TIDE_ENOMEM;
  }
  float table[256];
  for (int p = 0; p < 256; p++) table[p] = ((float)p / 255.0f - PIXEL_MEAN) / PIXEL_STD;
  for (size_t at = 0; rc == 0 && at < ds->count; at += CHUNK) {
    size_t items = ds->count - at < CHUNK ? ds->count - at : CHUNK, bytes = items * NN_IMAGE_SIZE;
    rc = read_exact(f, path, raw, (unsigned)bytes);
    float *dst = ds->images + at * NN_IMAGE_SIZE;
    for (size_t i = 0; rc == 0 && i < bytes; i++) dst[i] = table[raw[i]];
  }
  tide_free(raw);
  gzclose(f);
  return rc;
}

int nn_fashion_load(const char *dir, const char *split, nn_dataset_t **out) {
  if (split == NULL || (strcmp(split, "train") != 0 && strcmp(split, "test") != 0) || out == NULL) {
    if (out == NULL)
      tide_log_error("nn_fashion_load: out must not be NULL");
    else
      tide_log_error("nn_fashion_load: split must be \"train\" or \"test\", got %s%s%s", split ? "\"" : "",
                     split ? split : "NULL", split ? "\"" : "");
    return TIDE_EINVAL;
  }
  if (dir == NULL) dir = DEFAULT_DIR;
  const char *stem = strcmp(split, "train") == 0 ? "train" : "t10k";
  char labels_path[4096], images_path[4096];
  if (snprintf(labels_path, sizeof labels_path, "%s/%s-labels-idx1-ubyte.gz", dir, stem) >= (int)sizeof labels_path ||
      snprintf(images_path, sizeof images_path, "%s/%s-images-idx3-ubyte.gz", dir, stem) >= (int)sizeof images_path) {
    tide_log_error("nn_fashion_load: dir is too long (%zu bytes)", strlen(dir));
    return TIDE_EINVAL;
  }
  nn_dataset_t *ds = tide_calloc(1, sizeof *ds);
  if (ds == NULL) return TIDE_ENOMEM;
  int rc;
  TIDE_CHECK_GOTO(load_labels(dir, labels_path, ds), rc, fail);
  TIDE_CHECK_GOTO(load_images(dir, images_path, ds), rc, fail);
  *out = ds;
  return 0;
fail:
  nn_dataset_free(ds);
  return rc;
}
