/* FNV-1a, the one non-cryptographic hash of the library: store buckets,
 * communicator namespaces, host ids, the counts of a collective's header and
 * tide-train's parameter checksums. Values are the same on every host of one
 * architecture, which is all the callers compare. */
#include "core.h"

uint64_t tide__fnv1a(const void *data, size_t len) {
  const uint8_t *p = data;
  uint64_t h = TIDE__FNV1A_BASIS;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * TIDE__FNV1A_PRIME;
  return h;
}

uint64_t tide_checksum(const void *data, size_t bytes) { return tide__fnv1a(data, bytes); }

uint64_t tide__fnv1a_str(const char *s) {
  uint64_t h = TIDE__FNV1A_BASIS;
  for (; *s != '\0'; s++) h = (h ^ (uint8_t)*s) * TIDE__FNV1A_PRIME;
  return h;
}
