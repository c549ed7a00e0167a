/* A job's token and id, as a launcher makes them (tiderun; docs/security.md):
 * the token from the system's random source, the id random for a one-node
 * job or derived from the token (HMAC-SHA256) so that every node of a
 * multi-node job computes the same id without talking.
 *
 * Threads: any. */
#include <string.h>

#include "core/core.h"

static void to_hex(const uint8_t *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * n] = '\0';
}

int tide_job_token_create(char *token, size_t cap) {
  if (token == NULL || cap < 65) {
    TIDE_ERROR("tide_job_token_create: token must hold 65 bytes (64 hex digits and the NUL)");
    return TIDE_EINVAL;
  }
  uint8_t bytes[32];
  if (tide__random_bytes(bytes, sizeof bytes) != 0) {
    TIDE_ERROR("tide_job_token_create: cannot read random bytes for the job token");
    return TIDE_EIO;
  }
  to_hex(bytes, sizeof bytes, token);
  return 0;
}

int tide_job_id(const char *token, char *id, size_t cap) {
  if (id == NULL || cap < 17) {
    TIDE_ERROR("tide_job_id: id must hold 17 bytes (16 hex digits and the NUL)");
    return TIDE_EINVAL;
  }
  uint8_t bytes[32];
  if (token != NULL) {
    tide__hmac_sha256(token, strlen(token), "tide-job-id", 11, bytes);
  } else if (tide__random_bytes(bytes, 8) != 0) {
    TIDE_ERROR("tide_job_id: cannot read random bytes for the job id");
    return TIDE_EIO;
  }
  to_hex(bytes, 8, id);
  return 0;
}
