/* The one check of a tensor layout (tide_tensor_t's rules), shared by the
 * optimizers (src/optim) and the compressor (src/compress): both take the
 * same tensors of one flat buffer. */
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

typedef struct {
  size_t offset, index;
} placed_t;

static int by_offset(const void *pa, const void *pb) {
  const placed_t *a = pa, *b = pb;
  return (a->offset > b->offset) - (a->offset < b->offset);
}

static const char *label(const tide_tensor_t *tensors, size_t i, char *buf, size_t cap) {
  if (tensors[i].name != NULL) snprintf(buf, cap, "'%s' (tensors[%zu])", tensors[i].name, i);
  else snprintf(buf, cap, "tensors[%zu]", i);
  return buf;
}

static int check_one(const char *fn, const tide_tensor_t *tensors, size_t i, size_t nparams) {
  const tide_tensor_t *t = &tensors[i];
  char name[160];
  label(tensors, i, name, sizeof name);
  if (t->ndim < 0 || t->ndim > 4) {
    TIDE_ERROR("%s: tensor %s: ndim=%d must be 0 to 4", fn, name, t->ndim);
    return TIDE_EINVAL;
  }
  if (t->count == 0) {
    TIDE_ERROR("%s: tensor %s: count is 0: leave empty tensors out", fn, name);
    return TIDE_EINVAL;
  }
  size_t product = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] <= 0) {
      TIDE_ERROR("%s: tensor %s: shape[%d]=%d must be > 0", fn, name, d, t->shape[d]);
      return TIDE_EINVAL;
    }
    if (__builtin_mul_overflow(product, (size_t)t->shape[d], &product)) {
      TIDE_ERROR("%s: tensor %s: its shape holds more than SIZE_MAX elements", fn, name);
      return TIDE_EINVAL;
    }
  }
  if (product != t->count) {
    TIDE_ERROR("%s: tensor %s: count=%zu but its shape holds %zu elements", fn, name, t->count, product);
    return TIDE_EINVAL;
  }
  if (t->offset > nparams || t->count > nparams - t->offset) {
    TIDE_ERROR("%s: tensor %s: offset=%zu count=%zu runs past the %zu elements", fn, name, t->offset, t->count,
               nparams);
    return TIDE_EINVAL;
  }
  return 0;
}

int tide__tensors_check(const char *fn, const tide_tensor_t *tensors, size_t n, size_t nparams, size_t *order) {
  if (n > 0 && tensors == NULL) {
    TIDE_ERROR("%s: tensors is NULL with ntensors=%zu", fn, n);
    return TIDE_EINVAL;
  }
  for (size_t i = 0; i < n; i++) TIDE_CHECK(check_one(fn, tensors, i, nparams));
  placed_t *placed = tide__malloc((n > 0 ? n : 1) * sizeof *placed);
  if (placed == NULL) {
    TIDE_ERROR("%s: out of memory checking %zu tensors", fn, n);
    return TIDE_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) placed[i] = (placed_t){tensors[i].offset, i};
  qsort(placed, n, sizeof *placed, by_offset);
  int rc = 0;
  size_t end = 0;
  char a[160], b[160];
  for (size_t j = 0; j < n && rc == 0; j++) {
    const tide_tensor_t *t = &tensors[placed[j].index];
    if (t->offset < end) {
      const tide_tensor_t *prev = &tensors[placed[j - 1].index];
      TIDE_ERROR("%s: tensor %s [%zu, %zu) overlaps tensor %s [%zu, %zu)", fn,
                 label(tensors, placed[j].index, a, sizeof a), t->offset, t->offset + t->count,
                 label(tensors, placed[j - 1].index, b, sizeof b), prev->offset, prev->offset + prev->count);
      rc = TIDE_EINVAL;
    } else if (t->offset > end) {
      TIDE_ERROR("%s: elements [%zu, %zu) belong to no tensor (the next is tensor %s): the tensors must tile "
                 "[0, %zu)",
                 fn, end, t->offset, label(tensors, placed[j].index, a, sizeof a), nparams);
      rc = TIDE_EINVAL;
    }
    end = t->offset + t->count;
  }
  if (rc == 0 && n > 0 && end != nparams) {
    TIDE_ERROR("%s: the tensors cover [0, %zu) of %zu elements: elements [%zu, %zu) belong to no tensor", fn, end,
               nparams, end, nparams);
    rc = TIDE_EINVAL;
  }
  for (size_t j = 0; rc == 0 && order != NULL && j < n; j++) order[j] = placed[j].index;
  tide__free(placed);
  return rc;
}
