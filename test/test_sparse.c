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

/* One HiTopKComm case: the emulated hosts (NULL: one host), the size, and
 * the selector: the sampled one takes the pipelined path (reduce-scatter in
 * chunks, each selected from as it arrives) once shards reach 65536
 * elements, unless `mixed` gives rank 0 an exact one, which sends every
 * rank down the two-step path. */
typedef struct {
  const char *const *hosts;
  size_t d;
  tide_topk_kind_t kind;
  int mixed;
} hitopk_case_t;

/* Runs on every rank; recomputes each host's shard sums and selections. */
static int hitopk(int rank, int size, void *arg) {
  const hitopk_case_t *hc = arg;
  const char *const *hosts = hc->hosts;
  size_t d = hc->d;
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  int m = tide_comm_local_size(comm), nodes = tide_comm_node_count(comm);
  size_t offset, len;
  CHECK_OK(tide_hitopk_shard(comm, d, &offset, &len));
  double density = 0.01;
  tide_compressor_t *c;
  tide_topk_kind_t kind = hc->mixed && rank == 0 ? TIDE_TOPK_EXACT : hc->kind;
  CHECK_OK(tide_compressor_create(kind, density, TIDE_TOPK_GLOBAL, NULL, 0, len, NULL, &c));
  float *grad = malloc(d * sizeof *grad), *out = malloc(d * sizeof *out), *want = calloc(d, sizeof *want);
  for (size_t i = 0; i < d; i++) grad[i] = grad_value(rank, i);
  CHECK_OK(tide_hitopk_allreduce(comm, grad, out, d, c, TIDE_SUM));
  /* The reference: per host, the dense sum of its ranks; per shard j, the
   * exact top-k of that host's shard; summed over hosts. */
  float *host_sum = malloc(d * sizeof *host_sum);
  for (int h = 0; h < nodes; h++) {
    memset(host_sum, 0, d * sizeof *host_sum);
    for (int r = 0; r < size; r++) {
      int on_h = hosts == NULL ? h == 0 : strcmp(hosts[r], hosts[h * m]) == 0;
      if (on_h)
        for (size_t i = 0; i < d; i++) host_sum[i] += grad_value(r, i);
    }
    for (int j = 0; j < m; j++) {
      size_t so, sl;
      tide_block(d, m, j, &so, &sl);
      size_t k = tide_compressor_k(c) > 0 ? (size_t)((double)sl * density + 0.999999) : 0;
      float *v = malloc(k * sizeof *v);
      uint32_t *ix = malloc(k * sizeof *ix);
      CHECK_OK(tide_topk_select(TIDE_TOPK_EXACT, host_sum + so, sl, k, "ref", v, ix, NULL));
      for (size_t i = 0; i < k; i++) want[so + ix[i]] += v[i];
      free(v);
      free(ix);
    }
  }
  CHECK(memcmp(out, want, d * sizeof *out) == 0);
  /* in place, twice: the residual carries the unsent part forward */
  CHECK_OK(tide_hitopk_allreduce(comm, grad, grad, d, c, TIDE_AVG));
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
    hitopk_case_t exact = {NULL, D, TIDE_TOPK_EXACT, 0}, sampled = {NULL, 600000, TIDE_TOPK_SAMPLED, 0};
    CHECK(harness_run(&opts, hitopk, &exact) == 0);
    fprintf(stderr, "-- HiTopKComm np=%d, one host, pipelined\n", np);
    CHECK(harness_run(&opts, hitopk, &sampled) == 0);
  }
  const char *hosts[] = {"a", "a", "b", "b"};
  harness_opts_t two = {4, hosts, 0, 120, NULL};
  fprintf(stderr, "-- TopK-AllGather, 2 emulated hosts x 2\n");
  CHECK(harness_run(&two, sparse_allgather, NULL) == 0);
  fprintf(stderr, "-- HiTopKComm, 2 emulated hosts x 2\n");
  hitopk_case_t two_exact = {hosts, D, TIDE_TOPK_EXACT, 0}, two_sampled = {hosts, 600000, TIDE_TOPK_SAMPLED, 0},
                two_mixed = {hosts, 600000, TIDE_TOPK_SAMPLED, 1};
  CHECK(harness_run(&two, hitopk, &two_exact) == 0);
  fprintf(stderr, "-- HiTopKComm, 2 emulated hosts x 2, pipelined\n");
  CHECK(harness_run(&two, hitopk, &two_sampled) == 0);
  fprintf(stderr, "-- HiTopKComm, 2 emulated hosts x 2, one rank's selector exact: two-step path\n");
  CHECK(harness_run(&two, hitopk, &two_mixed) == 0);
  const char *one_each[] = {"a", "b"};
  harness_opts_t pair = {2, one_each, 0, 120, NULL};
  fprintf(stderr, "-- HiTopKComm, 2 emulated hosts x 1\n");
  hitopk_case_t pair_sampled = {one_each, 600000, TIDE_TOPK_SAMPLED, 0};
  CHECK(harness_run(&pair, hitopk, &pair_sampled) == 0);
  return 0;
}
