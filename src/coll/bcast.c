/* Broadcast (binomial tree for small messages, a pipelined chain for large
 * ones) and the dissemination barrier. */
#include <string.h>

#include "coll/coll.h"

#define CHAIN_MIN_BYTES (256 * 1024)
#define CHAIN_SEGMENT (512 * 1024)

static int binomial(tide_comm_t *comm, void *buf, size_t bytes, int root) {
  int n = comm->size, vr = (comm->rank - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      tide__p2p_t op;
      tide__p2p_set(&op, TIDE__P2P_RECV, (vr - mask + root) % n, NULL, buf, bytes, TIDE_I32, TIDE_SUM);
      TIDE_CHECK(tide__comm_run(comm, &op, 1, "broadcast (tree)"));
      break;
    }
    mask <<= 1;
  }
  tide__p2p_t ops[32];
  int k = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n)
      tide__p2p_set(&ops[k++], TIDE__P2P_SEND, (vr + mask + root) % n, buf, NULL, bytes, TIDE_I32, TIDE_SUM);
  return tide__comm_run(comm, ops, k, "broadcast (tree)");
}

/* root -> root+1 -> ... in segments: each rank forwards segment k-1 while
 * receiving segment k. */
static int chain(tide_comm_t *comm, void *buf, size_t bytes, int root) {
  int n = comm->size, vr = (comm->rank - root + n) % n;
  int prev = (comm->rank + n - 1) % n, next = (comm->rank + 1) % n;
  size_t segments = (bytes + CHAIN_SEGMENT - 1) / CHAIN_SEGMENT;
  uint8_t *base = buf;
  for (size_t k = 0; k <= segments; k++) {
    tide__p2p_t ops[2];
    int m = 0;
    if (vr > 0 && k < segments) {
      size_t len = bytes - k * CHAIN_SEGMENT < CHAIN_SEGMENT ? bytes - k * CHAIN_SEGMENT : CHAIN_SEGMENT;
      tide__p2p_set(&ops[m++], TIDE__P2P_RECV, prev, NULL, base + k * CHAIN_SEGMENT, len, TIDE_I32, TIDE_SUM);
    }
    if (vr < n - 1 && k > 0) {
      size_t at = (k - 1) * CHAIN_SEGMENT;
      size_t len = bytes - at < CHAIN_SEGMENT ? bytes - at : CHAIN_SEGMENT;
      tide__p2p_set(&ops[m++], TIDE__P2P_SEND, next, base + at, NULL, len, TIDE_I32, TIDE_SUM);
    }
    TIDE_CHECK(tide__comm_run(comm, ops, m, "broadcast (chain)"));
  }
  return 0;
}

int tide__broadcast(tide_comm_t *comm, void *buf, size_t bytes, int root) {
  if (comm->size == 1 || bytes == 0) return 0;
  if (bytes < CHAIN_MIN_BYTES || comm->size == 2) return binomial(comm, buf, bytes, root);
  return chain(comm, buf, bytes, root);
}

int tide__barrier(tide_comm_t *comm) {
  int n = comm->size;
  uint8_t out = 1, in[32];
  for (int k = 1, i = 0; k < n; k <<= 1, i++) {
    tide__p2p_t ops[2];
    tide__p2p_set(&ops[0], TIDE__P2P_SEND, (comm->rank + k) % n, &out, NULL, 1, TIDE_I32, TIDE_SUM);
    tide__p2p_set(&ops[1], TIDE__P2P_RECV, (comm->rank - k + n) % n, NULL, &in[i], 1, TIDE_I32, TIDE_SUM);
    TIDE_CHECK(tide__comm_run(comm, ops, 2, "barrier"));
  }
  return 0;
}
