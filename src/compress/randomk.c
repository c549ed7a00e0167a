/* Random-k: k distinct indices drawn uniformly from the seed, in ascending
 * order. Draws min(k, d - k) distinct indices into a bitmap by rejection
 * (at most ~1.4 draws per index, since at most half the bits get set) and
 * emits the marked indices, or the unmarked ones when k > d / 2. */
#include "compress/compress.h"

int tide__topk_randomk(const float *x, size_t d, size_t k, uint64_t seed, int nt,
                       float *values, uint32_t *indices, tide_topk_stats_t *stats,
                       size_t *bad_index) {
  int rc = tide__check_finite(x, d, nt, bad_index);
  if (rc != 0) return rc;
  size_t words = (d + 63) / 64;
  uint64_t *mark = tide__calloc(words, sizeof *mark);
  if (mark == NULL) return TIDE_ENOMEM;
  int complement = k > d - k;
  size_t want = complement ? d - k : k;
  uint64_t state = seed;
  for (size_t drawn = 0; drawn < want;) {
    uint64_t i = tide__uniform(&state, d);
    uint64_t bit = 1ull << (i % 64);
    if (mark[i / 64] & bit) continue;
    mark[i / 64] |= bit;
    drawn++;
  }
  size_t n = 0;
  for (size_t w = 0; w < words; w++) {
    uint64_t bits = complement ? ~mark[w] : mark[w];
    if (w == words - 1 && d % 64 != 0) bits &= (1ull << (d % 64)) - 1;
    while (bits != 0) {
      size_t i = w * 64 + (size_t)__builtin_ctzll(bits);
      bits &= bits - 1;
      values[n] = x[i];
      indices[n] = (uint32_t)i;
      n++;
    }
  }
  tide__free(mark);
  stats->full_passes = 1;
  stats->candidates = k;
  stats->threshold = 0.0f;
  for (size_t j = 0; j < n; j++) {
    float a = values[j] < 0 ? -values[j] : values[j];
    if (j == 0 || a < stats->threshold) stats->threshold = a;
  }
  return 0;
}
