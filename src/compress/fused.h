/* The one internal interface between compress and coll: HiTopKComm's fused
 * path (src/coll/sparse.c) reduces the host's gradient shard chunk by chunk
 * and feeds each chunk to the compressor's error feedback while it is still
 * in the cache, instead of storing the sum and selecting from it afterwards
 * (docs/design.md, "compress and coll"). coll/sparse.c includes this header
 * and no other of src/compress; nothing else outside src/compress uses it.
 * Pure computation: no communication happens behind these calls. */
#ifndef TIDE_COMPRESS_FUSED_H
#define TIDE_COMPRESS_FUSED_H

#include <stddef.h>
#include <stdint.h>

#include "tide.h"

/* ---- the sampled selector's sample ---------------------------------------------------- */

/* A stratified sample of d elements: runs of TIDE__SAMPLE_RUN contiguous
 * elements (one cache line) evenly spread, at most 2^14 elements. */
#define TIDE__SAMPLE_RUN 16
typedef struct {
  size_t runs, stride;
} tide__sample_plan_t;

/* 1 and the plan when d is large enough for sampling to pay, else 0. */
int tide__sample_plan(size_t d, tide__sample_plan_t *plan);
/* Where run r starts: a multiple of TIDE__SAMPLE_RUN. */
static inline size_t tide__sample_start(const tide__sample_plan_t *plan, size_t r) {
  return r * plan->stride / TIDE__SAMPLE_RUN * TIDE__SAMPLE_RUN;
}
/* Copies the plan's runs of x, back to back, to sample (runs * RUN floats). */
void tide__sample_gather(const tide__sample_plan_t *plan, const float *x, float *sample);

/* ---- error feedback over a gradient that arrives in pieces ----------------------------- */

/* One pass instead of three: for a compressor of kind SAMPLED with scope
 * GLOBAL and 0 < k < d, acc = grad + residual is computed, stored (streaming
 * stores: acc is not read back) and tested against a cut in one pass, and
 * the exact top k is taken from what the pass collected. The gradient may
 * arrive in pieces, in index order: HiTopKComm feeds each chunk of the
 * host's sum of its shard as the reduce-scatter delivers it, while it is
 * still in the cache. tide_compressor_compress runs the same steps on a
 * whole gradient.
 *
 *   plan    tide__ef_plan: the sample positions (0: not this compressor, use
 *           tide_compressor_compress);
 *   begin   the gradient at the sample positions (tide__sample_gather
 *           layout); the residual is added here;
 *   feed    pieces, offsets increasing from 0 with no gap, until d;
 *   finish  exactly k pairs in index order, the residual updated; or an
 *           error with the residual unchanged (a NaN or Inf is named);
 *   abort   after a failed feed or begin, or to give up: residual unchanged.
 * The same thread calls all of them. */
int tide__ef_plan(const tide_compressor_t *c, tide__sample_plan_t *plan);
int tide__ef_begin(tide_compressor_t *c, const float *grad_sample);
int tide__ef_feed(tide_compressor_t *c, size_t offset, const float *piece, size_t len);
int tide__ef_finish(tide_compressor_t *c, const float *grad_or_null, float *values, uint32_t *indices,
                    size_t *k_out);
void tide__ef_abort(tide_compressor_t *c);

#endif
