/* The distributed sampler covers every sample exactly once per epoch across
 * ranks, agrees across ranks, and reshuffles per epoch. */
#include <string.h>

#include "harness.h"

int main(void) {
  const uint64_t sizes_n[] = {0, 1, 7, 100, 60000, 60001};
  for (size_t t = 0; t < sizeof sizes_n / sizeof sizes_n[0]; t++) {
    uint64_t n = sizes_n[t];
    for (int size = 1; size <= 5; size++) {
      unsigned char *seen = calloc(n + 1, 1);
      for (uint64_t epoch = 0; epoch < 3; epoch++) {
        memset(seen, 0, n + 1);
        size_t total = 0;
        for (int rank = 0; rank < size; rank++) {
          tide_sampler_t *s;
          CHECK_OK(tide_sampler_create(n, 42, rank, size, &s));
          CHECK_OK(tide_sampler_set_epoch(s, epoch));
          size_t count;
          const uint64_t *idx = tide_sampler_indices(s, &count);
          CHECK(count <= tide_sampler_max_count(s));
          CHECK(count + 1 >= tide_sampler_max_count(s) || n < (uint64_t)size);
          for (size_t i = 0; i < count; i++) {
            CHECK(idx[i] < n);
            CHECK(seen[idx[i]] == 0); /* disjoint shards */
            seen[idx[i]] = 1;
          }
          total += count;
          tide_sampler_destroy(s);
        }
        CHECK(total == n); /* every sample exactly once */
      }
      free(seen);
    }
  }
  /* epochs differ, the same (seed, epoch) agrees, another seed differs */
  tide_sampler_t *a, *b, *c;
  CHECK_OK(tide_sampler_create(1000, 7, 0, 2, &a));
  CHECK_OK(tide_sampler_create(1000, 7, 0, 2, &b));
  CHECK_OK(tide_sampler_create(1000, 8, 0, 2, &c));
  size_t na, nb, nc;
  uint64_t first[500];
  memcpy(first, tide_sampler_indices(a, &na), sizeof first);
  CHECK(memcmp(first, tide_sampler_indices(b, &nb), sizeof first) == 0);
  CHECK(memcmp(first, tide_sampler_indices(c, &nc), sizeof first) != 0);
  CHECK_OK(tide_sampler_set_epoch(a, 1));
  CHECK(memcmp(first, tide_sampler_indices(a, &na), sizeof first) != 0);
  tide_sampler_destroy(a);
  tide_sampler_destroy(b);
  tide_sampler_destroy(c);
  tide_sampler_t *bad;
  CHECK_RC(tide_sampler_create(10, 1, 3, 3, &bad), TIDE_EINVAL);
  CHECK_RC(tide_sampler_create(10, 1, 0, 0, &bad), TIDE_EINVAL);
  return 0;
}
