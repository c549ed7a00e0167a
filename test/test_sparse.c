/* TopK-AllGather and HiTopKComm equal the dense sum of what every rank (or
 * host shard) selected, duplicates summed, identical on every rank: np =
 * 1..4 on one host and 2x2 on two emulated hosts (TIDE_HOST_ID). */
#include <string.h>

#include "harness.h"

#define D 50000
#define K 700

/* Integer-valued floats: every sum is exact whatever its order. */
static float grad_value(int rank, size_t i) { return (float)((int)((i * 2654435761u + (unsigned)rank * 40503u) % 20001u) - 10000); }

static void pick(int rank, uint32_t *idx, float *val) {
  unsigned state = 1234u + (unsigned)rank * 77u;
  uint32_t at = 0;
  for (int i = 0; i < K; i++) { /* ascending, overlapping across ranks */
    at += 1 + harness_rand(&state) % (D / K - 1);
    idx[i] = at;
    val[i] = (float)(harness_rand(&state) % 2001) - 1000;
  }
}

static int sparse_allgather(int rank, int size, void *arg) {
  (void)arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  uint32_t idx[K];
  float val[K];
  pick(rank, idx, val);
  float *out = malloc(D * sizeof *out), *want = calloc(D, sizeof *want);
  size_t k = (size_t)(rank % 2 == 0 ? K : K / 2); /* k may differ per rank */
  CHECK_OK(tide_sparse_allgather(comm, val, idx, k, out, D, TIDE_SUM));
  for (int r = 0; r < size; r++) {
    uint32_t ri[K];
    float rv[K];
    pick(r, ri, rv);
    for (size_t i = 0; i < (size_t)(r % 2 == 0 ? K : K / 2); i++) want[ri[i]] += rv[i];
  }
  CHECK(memcmp(out, want, D * sizeof *out) == 0);
  CHECK_OK(tide_sparse_allgather(comm, val, idx, k, out, D, TIDE_AVG));
  for (size_t i = 0; i < D; i++) CHECK(out[i] == want[i] / (float)size || out[i] == want[i] * (1.0f / size));
  free(out);
  free(want);
  tide_comm_destroy(comm);
  return 0;
}

/* Runs on every rank; recomputes each host's shard sums and selections. */
static int hitopk(int rank, int size, void *arg) {
  const char *const *hosts = arg;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  int m = tide_comm_local_size(comm), nodes = tide_comm_node_count(comm);
  size_t offset, len;
  CHECK_OK(tide_hitopk_shard(comm, D, &offset, &len));
  double density = 0.01;
  tide_compressor_t *c;
  CHECK_OK(tide_compressor_create(TIDE_TOPK_EXACT, density, TIDE_TOPK_GLOBAL, NULL, 0, len, NULL, &c));
  float *grad = malloc(D * sizeof *grad), *out = malloc(D * sizeof *out), *want = calloc(D, sizeof *want);
  for (size_t i = 0; i < D; i++) grad[i] = grad_value(rank, i);
  CHECK_OK(tide_hitopk_allreduce(comm, grad, out, D, c, TIDE_SUM));
  /* The reference: per host, the dense sum of its ranks; per shard j, the
   * exact top-k of that host's shard; summed over hosts. */
  float *host_sum = malloc(D * sizeof *host_sum);
  for (int h = 0; h < nodes; h++) {
    memset(host_sum, 0, D * sizeof *host_sum);
    for (int r = 0; r < size; r++) {
      int on_h = hosts == NULL ? h == 0 : strcmp(hosts[r], hosts[h * m]) == 0;
      if (on_h)
        for (size_t i = 0; i < D; i++) host_sum[i] += grad_value(r, i);
    }
    for (int j = 0; j < m; j++) {
      size_t so, sl;
      tide_block(D, m, j, &so, &sl);
      size_t k = tide_compressor_k(c) > 0 ? (size_t)((double)sl * density + 0.999999) : 0;
      float *v = malloc(k * sizeof *v);
      uint32_t *ix = malloc(k * sizeof *ix);
      CHECK_OK(tide_topk_select(TIDE_TOPK_EXACT, host_sum + so, sl, k, "ref", v, ix, NULL));
      for (size_t i = 0; i < k; i++) want[so + ix[i]] += v[i];
      free(v);
      free(ix);
    }
  }
  CHECK(memcmp(out, want, D * sizeof *out) == 0);
  /* in place, twice: the residual carries the unsent part forward */
  CHECK_OK(tide_hitopk_allreduce(comm, grad, grad, D, c, TIDE_AVG));
  /* replicas agree bit for bit */
  float first = grad[0], check = 0;
  CHECK_OK(tide_allreduce(comm, &first, &check, 1, TIDE_F32, TIDE_MAX));
  CHECK(check == first);
  tide_compressor_destroy(c);
  free(grad);
  free(out);
  free(want);
  free(host_sum);
  tide_comm_destroy(comm);
  return 0;
}

int main(void) {
  for (int np = 1; np <= 4; np++) {
    harness_opts_t opts = {np, NULL, 0, 120, NULL};
    fprintf(stderr, "-- TopK-AllGather np=%d\n", np);
    CHECK(harness_run(&opts, sparse_allgather, NULL) == 0);
    fprintf(stderr, "-- HiTopKComm np=%d, one host\n", np);
    CHECK(harness_run(&opts, hitopk, NULL) == 0);
  }
  const char *hosts[] = {"a", "a", "b", "b"};
  harness_opts_t two = {4, hosts, 0, 120, NULL};
  fprintf(stderr, "-- TopK-AllGather, 2 emulated hosts x 2\n");
  CHECK(harness_run(&two, sparse_allgather, NULL) == 0);
  fprintf(stderr, "-- HiTopKComm, 2 emulated hosts x 2\n");
  CHECK(harness_run(&two, hitopk, (void *)hosts) == 0);
  const char *one_each[] = {"a", "b"};
  harness_opts_t pair = {2, one_each, 0, 120, NULL};
  fprintf(stderr, "-- HiTopKComm, 2 emulated hosts x 1\n");
  CHECK(harness_run(&pair, hitopk, (void *)one_each) == 0);
  return 0;
}
