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
#include "compress/fused.h"

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
    if (counts[r] > (size_t)PTRDIFF_MAX / 8 || total > (size_t)PTRDIFF_MAX / 4) /* each checked its own k */
      rc = tide__comm_fail(comm, TIDE_EPROTO, 0, "rank %d received a pair count of %zu from rank %d: too many",
                           comm->rank, counts[r], r);
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
  int64_t t0 = tide__now_ns();
  TIDE_CHECK(gather_pairs(comm, values, indices, k, &counts, &pairs));
  int64_t t1 = tide__now_ns();
  memset(out, 0, d * sizeof *out);
  int64_t t2 = tide__now_ns();
  int rc = scatter_add(comm, pairs, counts, comm->size, out, d);
  TIDE_DEBUG("topk-allgather: gather %.2f ms, zero %.2f ms, sum %.2f ms", (t1 - t0) / 1e6, (t2 - t1) / 1e6,
             (tide__now_ns() - t2) / 1e6);
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

/* Fails the communicator, so that the other ranks stop waiting for this one. */
static int out_of_memory(tide_comm_t *comm, const char *what) {
  return tide__comm_fail(comm, TIDE_ENOMEM, 0, "rank %d: out of memory for %s in hitopk_allreduce", comm->rank, what);
}

/* Elements of one rank's shard per pipelined reduce-scatter step: 1 MiB,
 * so that the chunk is still in the cache when it is selected from. */
#define HITOPK_CHUNK ((size_t)1 << 18)

/* Steps 1 and 2 pipelined: the shards' samples are reduced first (they
 * give the cut), then the shards in chunks, each chunk of this rank's
 * shard going through the one-pass error feedback (acc, cut, collection)
 * as it arrives. The host's sum of the shard is never stored. Returns 1,
 * having done nothing else, when some local rank's compressor cannot take
 * pieces (then every local rank returns 1). */
static int reduce_select_pipelined(tide_comm_t *comm, tide_comm_t *local, const float *grad, size_t d,
                                   tide_compressor_t *compressor, float *values, uint32_t *indices, size_t *got) {
  int m = local->size, me = local->rank;
  tide__sample_plan_t plan, mine_plan;
  float able = tide__ef_plan(compressor, &mine_plan) ? 1.0f : 0.0f;
  size_t *shard = tide__malloc(6 * (size_t)m * sizeof *shard); /* offset, len; counts, displs twice */
  if (shard == NULL) return out_of_memory(comm, "the shard table");
  size_t *len = shard + m, *counts = shard + 2 * m, *displs = shard + 3 * m, *ccounts = shard + 4 * m,
         *cdispls = shard + 5 * m, total = 0;
  for (int j = 0; j < m; j++) {
    tide_block(d, m, j, &shard[j], &len[j]);
    counts[j] = 1 + (tide__sample_plan(len[j], &plan) ? plan.runs * TIDE__SAMPLE_RUN : 0);
    displs[j] = total;
    total += counts[j];
  }
  /* Every block: [how many ranks can take pieces | that shard's sample]. */
  float *samples = tide__malloc(total * sizeof *samples), *chunk = NULL;
  float *mine = tide__malloc(counts[me] * sizeof *mine);
  int rc = samples == NULL || mine == NULL ? out_of_memory(comm, "the samples") : 0;
  for (int j = 0; rc == 0 && j < m; j++) {
    samples[displs[j]] = able;
    if (counts[j] > 1 && tide__sample_plan(len[j], &plan))
      tide__sample_gather(&plan, grad + shard[j], samples + displs[j] + 1);
  }
  if (rc == 0)
    rc = tide__lift(comm, local, tide__reduce_scatterv_ring(local, samples, mine, counts, displs, TIDE_F32, TIDE_SUM));
  if (rc == 0 && mine[0] != (float)m) rc = 1;
  if (rc == 0 && (rc = tide__ef_begin(compressor, mine + 1)) != 0)
    rc = tide__comm_fail(comm, rc, 0, "rank %d: top-k selection failed: %s", comm->rank, tide_strerror(rc));
  size_t steps = (len[0] + HITOPK_CHUNK - 1) / HITOPK_CHUNK; /* len[0] is the longest */
  if (rc == 0 && (chunk = tide__malloc(HITOPK_CHUNK * sizeof *chunk)) == NULL) rc = out_of_memory(comm, "a chunk");
  for (size_t q = 0; rc == 0 && q < steps; q++) {
    for (int j = 0; j < m; j++) {
      tide_block(len[j], steps, q, &cdispls[j], &ccounts[j]);
      cdispls[j] += shard[j];
    }
    rc = tide__lift(comm, local, tide__reduce_scatterv_ring(local, grad, chunk, ccounts, cdispls, TIDE_F32, TIDE_SUM));
    if (rc == 0 && (rc = tide__ef_feed(compressor, cdispls[me] - shard[me], chunk, ccounts[me])) != 0)
      rc = tide__comm_fail(comm, rc, 0, "rank %d: top-k selection failed: %s", comm->rank, tide_strerror(rc));
  }
  if (rc == 0 && (rc = tide__ef_finish(compressor, NULL, values, indices, got)) != 0)
    rc = tide__comm_fail(comm, rc, 0, "rank %d: top-k selection failed: %s", comm->rank,
                         tide_compressor_last_error(compressor));
  tide__ef_abort(compressor); /* after a failure: the residual stays as it was */
  tide__free(chunk);
  tide__free(mine);
  tide__free(samples);
  tide__free(shard);
  return rc;
}

/* Steps 1 and 2 one after the other, for any compressor: the host's sum of
 * the shard is stored in out (where it belongs), then selected from. */
static int reduce_select(tide_comm_t *comm, tide_comm_t *local, const float *grad, float *out, size_t d,
                         tide_compressor_t *compressor, float *values, uint32_t *indices, size_t *got) {
  size_t offset, len;
  tide_block(d, local->size, local->rank, &offset, &len);
  float *shard = out + offset;
  TIDE_CHECK(tide__lift(comm, local, tide__reduce_scatter_ring(local, grad, shard, d, TIDE_F32, TIDE_SUM)));
  int rc = tide_compressor_compress(compressor, shard, len, values, indices, got);
  if (rc != 0)
    rc = tide__comm_fail(comm, rc, 0, "rank %d: top-k selection failed: %s", comm->rank,
                         tide_compressor_last_error(compressor));
  return rc;
}

int tide__hitopk_allreduce(tide_comm_t *comm, const float *grad, float *out, size_t d, tide_compressor_t *compressor,
                           tide_op_t op) {
  size_t offset, len;
  TIDE_CHECK(tide__hitopk_shard(comm, d, &offset, &len));
  if (tide_compressor_size(compressor) != len)
    return tide__comm_fail(comm, TIDE_EINVAL, 0,
                           "rank %d: hitopk_allreduce of %zu elements needs a compressor for this rank's shard "
                           "of %zu elements (tide_hitopk_shard), but it has one for %zu",
                           comm->rank, d, len, tide_compressor_size(compressor));
  /* Small tensors: selection and three exchanges cost more than they save. */
  if (d < (size_t)tide__param_int(TIDE__PARAM_SPARSE_MIN))
    return tide__allreduce(comm, grad, out, d, TIDE_F32, op, tide__allreduce_algo(comm, d, TIDE_F32));
  tide_comm_t *local, *cross;
  TIDE_CHECK(tide_comm_local(comm, &local));
  TIDE_CHECK(tide_comm_cross(comm, &cross));
  /* 1 and 2. The host's sum of our shard, and its top k with error
   * feedback (indices within the shard). */
  size_t k = tide_compressor_k(compressor), got = 0;
  float *values = tide__malloc((k ? k : 1) * sizeof *values);
  uint32_t *indices = tide__malloc((k ? k : 1) * sizeof *indices);
  if (values == NULL || indices == NULL) {
    tide__free(values);
    tide__free(indices);
    return out_of_memory(comm, "the selected pairs");
  }
  int64_t t0 = tide__now_ns();
  int rc = reduce_select_pipelined(comm, local, grad, d, compressor, values, indices, &got);
  if (rc == 1) rc = reduce_select(comm, local, grad, out, d, compressor, values, indices, &got);
  int64_t t1 = tide__now_ns();
  /* 3. Across hosts: every host's pairs for this shard. */
  size_t *node_counts = NULL;
  uint32_t *node_pairs = NULL, *all = NULL;
  if (rc == 0) rc = tide__lift(comm, cross, gather_pairs(cross, values, indices, got, &node_counts, &node_pairs));
  int64_t t2 = tide__now_ns();
  tide__free(values);
  tide__free(indices);
  /* 4. Within the host: every local rank's block, [n pair counts | the n
   * hosts' pairs], so each rank can walk every shard's pairs. */
  int n = cross->size, m = local->size;
  size_t mine_words = (size_t)n;
  for (int h = 0; rc == 0 && h < n; h++) mine_words += pair_words(node_counts[h]);
  size_t *words = rc == 0 ? tide__calloc(2 * (size_t)m, sizeof *words) : NULL;
  if (rc == 0 && words == NULL) rc = TIDE_ENOMEM;
  if (rc == 0) rc = tide__lift(comm, local, allgather_size(local, mine_words, words));
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
    rc = tide__lift(comm, local, tide__allgatherv_ring(local, NULL, all, words, words + m, TIDE_I32));
  }
  /* 5. Sum every shard's pairs into the dense result, shard by shard and
   * host by host: one order on every rank. */
  int64_t t3 = tide__now_ns();
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
  int64_t t4 = tide__now_ns();
  TIDE_DEBUG("hitopk: reduce-scatter and select %.2f ms, across hosts %.2f ms, within the host %.2f ms, sum %.2f ms",
             (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6, (t4 - t3) / 1e6);
  tide__free(node_counts);
  tide__free(node_pairs);
  tide__free(words);
  tide__free(all);
  if (rc == 0 && op == TIDE_AVG) tide__scale(out, d, TIDE_F32, comm->size);
  return rc;
}
