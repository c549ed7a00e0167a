/* Sparse collectives for top-k gradients.
 *
 * TopK-AllGather: every rank's (value, index) pairs go to every rank, which
 * sums them by index into a dense buffer.
 *
 * HiTopKComm (Shi et al., MLSys 2021): intra-host dense reduce-scatter, so
 * each local rank owns the host's sum of one shard; top-k of that shard with
 * error feedback; the ranks with the same local rank all-gather their pairs
 * across hosts (one concurrent stream per local rank); an intra-host
 * all-gather of those pairs; every rank sums the pairs into the dense
 * result. Duplicate indices are always summed, never overwritten, in one
 * fixed order, so every rank ends with bitwise identical results. */
#include <string.h>

#include "coll/coll.h"

/* The packed form of k pairs: k floats then k uint32 indices. */
static size_t pair_words(size_t k) { return 2 * k; }

/* Every rank's one number (a size), in rank order, into out[0..size). */
static int allgather_size(tide_comm_t *comm, size_t mine, size_t *out) {
  int n = comm->size;
  uint64_t value = mine, *all = tide__malloc((size_t)n * sizeof *all);
  size_t *unit = tide__malloc(2 * (size_t)n * sizeof *unit);
  int rc = all == NULL || unit == NULL ? TIDE_ENOMEM : 0;
  for (int r = 0; rc == 0 && r < n; r++) {
    unit[r] = 1;
    unit[n + r] = (size_t)r;
  }
  if (rc == 0) rc = tide__allgatherv_ring(comm, &value, all, unit, unit + n, TIDE_I64);
  for (int r = 0; rc == 0 && r < n; r++) out[r] = (size_t)all[r];
  tide__free(all);
  tide__free(unit);
  return rc;
}

/* All-gathers variable numbers of pairs: counts[r] = rank r's k. The result
 * is rank after rank, each as k values then k indices. Owned by the caller
 * (tide__free). */
static int gather_pairs(tide_comm_t *comm, const float *values, const uint32_t *indices, size_t k,
                        size_t **counts_out, uint32_t **pairs_out) {
  int n = comm->size;
  size_t *counts = tide__calloc((size_t)n * 3, sizeof *counts);
  if (counts == NULL) return TIDE_ENOMEM;
  size_t *words = counts + n, *displs = counts + 2 * n;
  int rc = allgather_size(comm, k, counts); /* everyone's k first */
  size_t total = 0;
  for (int r = 0; rc == 0 && r < n; r++) {
    words[r] = pair_words(counts[r]);
    displs[r] = total;
    total += words[r];
  }
  uint32_t *pairs = rc == 0 ? tide__malloc((total ? total : 1) * sizeof *pairs) : NULL;
  if (rc == 0 && pairs == NULL) rc = TIDE_ENOMEM;
  if (rc == 0) {
    uint32_t *slot = pairs + displs[comm->rank];
    memcpy(slot, values, k * sizeof(float));
    memcpy(slot + k, indices, k * sizeof(uint32_t));
    rc = tide__allgatherv_ring(comm, NULL, pairs, words, displs, TIDE_I32);
  }
  if (rc != 0) {
    tide__free(counts);
    tide__free(pairs);
    return rc;
  }
  *counts_out = counts;
  *pairs_out = pairs;
  return 0;
}

/* Adds packed pair blocks (counts[0..n) of them, back to back) into out,
 * rejecting an index outside [0, d): a corrupt or mismatched peer must not
 * write out of bounds. */
static int scatter_add(tide_comm_t *comm, const uint32_t *pairs, const size_t *counts, int n, float *out, size_t d) {
  for (int r = 0; r < n; r++) {
    size_t k = counts[r];
    const float *values = (const float *)pairs;
    const uint32_t *indices = pairs + k;
    for (size_t i = 0; i < k; i++) {
      if (indices[i] >= d)
        return tide__comm_fail(comm, TIDE_EPROTO, 0,
                               "rank %d received index %u from a peer for a tensor of %zu elements", comm->rank,
                               indices[i], d);
      out[indices[i]] += values[i];
    }
    pairs += pair_words(k);
  }
  return 0;
}

int tide__sparse_allgather(tide_comm_t *comm, const float *values, const uint32_t *indices, size_t k, float *out,
                           size_t d, tide_op_t op) {
  size_t *counts;
  uint32_t *pairs;
  TIDE_CHECK(gather_pairs(comm, values, indices, k, &counts, &pairs));
  memset(out, 0, d * sizeof *out);
  int rc = scatter_add(comm, pairs, counts, comm->size, out, d);
  if (rc == 0 && op == TIDE_AVG) tide__scale(out, d, TIDE_F32, comm->size);
  tide__free(counts);
  tide__free(pairs);
  return rc;
}

int tide__hitopk_shard(tide_comm_t *comm, size_t d, size_t *offset, size_t *len) {
  if (!comm->uniform_nodes) {
    TIDE_ERROR("hierarchical top-k needs the same number of ranks on every host (this job has uneven hosts); "
               "use TopK-AllGather instead");
    return TIDE_EINVAL;
  }
  tide_block(d, comm->local_size, comm->local_rank, offset, len);
  return 0;
}

/* Hands a sub-communicator's failure to the parent. */
static int lift(tide_comm_t *comm, tide_comm_t *sub, int rc) {
  if (rc == 0) return 0;
  return tide__comm_fail(comm, rc, 1, "%s", tide_comm_last_error(sub));
}

int tide__hitopk_allreduce(tide_comm_t *comm, const float *grad, float *out, size_t d, tide_compressor_t *compressor,
                           tide_op_t op) {
  size_t offset, len;
  TIDE_CHECK(tide__hitopk_shard(comm, d, &offset, &len));
  /* Small tensors: selection and three exchanges cost more than they save. */
  if (d < (size_t)tide__param_int(TIDE__PARAM_SPARSE_MIN))
    return tide__allreduce(comm, grad, out, d, TIDE_F32, op, tide__allreduce_algo(comm, d, TIDE_F32));
  tide_comm_t *local, *cross;
  TIDE_CHECK(tide_comm_local(comm, &local));
  TIDE_CHECK(tide_comm_cross(comm, &cross));
  /* 1. The host's sum of our shard, written where the shard belongs in out. */
  float *shard = out + offset;
  int rc = lift(comm, local, tide__reduce_scatter_ring(local, grad, shard, d, TIDE_F32, TIDE_SUM));
  if (rc != 0) return rc;
  /* 2. Top-k of the shard with error feedback (indices within the shard). */
  size_t k = tide_compressor_k(compressor), got = 0;
  float *values = tide__malloc((k ? k : 1) * sizeof *values);
  uint32_t *indices = tide__malloc((k ? k : 1) * sizeof *indices);
  if (values == NULL || indices == NULL) {
    tide__free(values);
    tide__free(indices);
    return TIDE_ENOMEM;
  }
  rc = tide_compressor_compress(compressor, shard, len, values, indices, &got);
  if (rc != 0)
    rc = tide__comm_fail(comm, rc, 0, "rank %d: top-k selection failed: %s", comm->rank,
                         tide_compressor_last_error(compressor));
  /* 3. Across hosts: every host's pairs for this shard. */
  size_t *node_counts = NULL;
  uint32_t *node_pairs = NULL, *all = NULL;
  if (rc == 0) rc = lift(comm, cross, gather_pairs(cross, values, indices, got, &node_counts, &node_pairs));
  tide__free(values);
  tide__free(indices);
  /* 4. Within the host: every local rank's block, [n pair counts | the n
   * hosts' pairs], so each rank can walk every shard's pairs. */
  int n = cross->size, m = local->size;
  size_t mine_words = (size_t)n;
  for (int h = 0; rc == 0 && h < n; h++) mine_words += pair_words(node_counts[h]);
  size_t *words = rc == 0 ? tide__calloc(2 * (size_t)m, sizeof *words) : NULL;
  if (rc == 0 && words == NULL) rc = TIDE_ENOMEM;
  if (rc == 0) rc = lift(comm, local, allgather_size(local, mine_words, words));
  size_t total = 0;
  for (int r = 0; rc == 0 && r < m; r++) {
    words[m + r] = total;
    total += words[r];
  }
  if (rc == 0 && (all = tide__malloc((total ? total : 1) * sizeof *all)) == NULL) rc = TIDE_ENOMEM;
  if (rc == 0) {
    uint32_t *block = all + words[m + local->rank];
    for (int h = 0; h < n; h++) block[h] = (uint32_t)node_counts[h];
    memcpy(block + n, node_pairs, (mine_words - (size_t)n) * sizeof *block);
    rc = lift(comm, local, tide__allgatherv_ring(local, NULL, all, words, words + m, TIDE_I32));
  }
  /* 5. Sum every shard's pairs into the dense result, shard by shard and
   * host by host: one order on every rank. */
  if (rc == 0) {
    memset(out, 0, d * sizeof *out);
    for (int j = 0; rc == 0 && j < m; j++) {
      size_t shard_offset, shard_len, counts[1024], *c = counts;
      tide_block(d, m, j, &shard_offset, &shard_len);
      const uint32_t *block = all + words[m + j];
      if (n > 1024 && (c = tide__malloc((size_t)n * sizeof *c)) == NULL) {
        rc = TIDE_ENOMEM;
        break;
      }
      size_t expect = (size_t)n;
      for (int h = 0; h < n; h++) expect += pair_words(c[h] = block[h]);
      if (expect != words[j])
        rc = tide__comm_fail(comm, TIDE_EPROTO, 0, "rank %d received a malformed top-k block from local rank %d",
                             comm->rank, j);
      if (rc == 0) rc = scatter_add(comm, block + n, c, n, out + shard_offset, shard_len);
      if (c != counts) tide__free(c);
    }
  }
  tide__free(node_counts);
  tide__free(node_pairs);
  tide__free(words);
  tide__free(all);
  if (rc == 0 && op == TIDE_AVG) tide__scale(out, d, TIDE_F32, comm->size);
  return rc;
}
