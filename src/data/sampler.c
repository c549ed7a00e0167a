/* The distributed sampler: one permutation per epoch from (seed, epoch),
 * the same on every rank, dealt round-robin. */
#include <string.h>

#include "core/core.h"

struct tide_sampler {
  uint64_t n, seed;
  int rank, size;
  uint64_t *permutation; /* n entries */
  uint64_t *shard;       /* this rank's, ceil(n / size) entries at most */
  size_t count;
};

/* splitmix64: a fixed, portable generator, so every rank and every
 * machine draws the same permutation. */
static uint64_t next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, bound) without modulo bias. */
static uint64_t below(uint64_t *state, uint64_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  for (;;) {
    uint64_t x = next(state);
    if (x < limit) return x % bound;
  }
}

int tide_sampler_create(uint64_t n, uint64_t seed, int rank, int size, tide_sampler_t **out) {
  if (out == NULL) return tide__null_arg("tide_sampler_create", "out");
  if (size < 1 || rank < 0 || rank >= size) {
    TIDE_ERROR("tide_sampler_create: rank %d and size %d must satisfy 0 <= rank < size", rank, size);
    return TIDE_EINVAL;
  }
  size_t bytes; /* the permutation holds n indices */
  if (n > SIZE_MAX) {
    TIDE_ERROR("tide_sampler_create: n = %llu does not fit in size_t", (unsigned long long)n);
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide__array_bytes("tide_sampler_create", "n", (size_t)n, sizeof(uint64_t), &bytes));
  tide_sampler_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  s->n = n;
  s->seed = seed;
  s->rank = rank;
  s->size = size;
  s->permutation = tide__malloc((n ? n : 1) * sizeof(uint64_t));
  s->shard = tide__malloc((tide_sampler_max_count(s) + 1) * sizeof(uint64_t));
  if (s->permutation == NULL || s->shard == NULL) {
    tide_sampler_destroy(s);
    return TIDE_ENOMEM;
  }
  *out = s;
  return tide_sampler_set_epoch(s, 0);
}

int tide_sampler_set_epoch(tide_sampler_t *s, uint64_t epoch) {
  if (s == NULL) return tide__null_arg("tide_sampler_set_epoch", "sampler");
  uint64_t state = s->seed * 0x2545f4914f6cdd1dull ^ (epoch + 1) * 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < s->n; i++) s->permutation[i] = i;
  for (uint64_t i = s->n; i > 1; i--) { /* Fisher-Yates */
    uint64_t j = below(&state, i), t = s->permutation[i - 1];
    s->permutation[i - 1] = s->permutation[j];
    s->permutation[j] = t;
  }
  s->count = 0;
  for (uint64_t i = (uint64_t)s->rank; i < s->n; i += (uint64_t)s->size) s->shard[s->count++] = s->permutation[i];
  return 0;
}

const uint64_t *tide_sampler_indices(const tide_sampler_t *s, size_t *count) {
  if (s == NULL) {
    tide__null_arg("tide_sampler_indices", "sampler");
    return NULL;
  }
  if (count != NULL) *count = s->count;
  return s->shard;
}

const uint64_t *tide_sampler_order(const tide_sampler_t *s, uint64_t *count) {
  if (s == NULL) return NULL;
  if (count != NULL) *count = s->n;
  return s->permutation;
}

size_t tide_sampler_max_count(const tide_sampler_t *s) {
  return s == NULL ? 0 : (size_t)((s->n + (uint64_t)s->size - 1) / (uint64_t)s->size);
}

void tide_sampler_destroy(tide_sampler_t *s) {
  if (s == NULL) return;
  tide__free(s->permutation);
  tide__free(s->shard);
  tide__free(s);
}
