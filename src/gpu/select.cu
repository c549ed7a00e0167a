/* tide's GPU top-k kernels. NVRTC compiles this file when a process first
 * selects on a GPU (src/gpu/driver.c), for the device it finds, so that
 * building tide needs no CUDA. src/gpu/select.c queues the kernels; the
 * algorithms are those of the CPU selectors (src/compress), made of passes
 * that each read a source once:
 *
 * - keys: the magnitude bits of an element (|x| as a uint32, sign cleared);
 *   comparing keys compares magnitudes, and a key >= 0x7f800000 is NaN/Inf.
 * - a histogram pass counts the keys (or, to break ties, the inverted
 *   indices) of a class of elements into 2^10 or 2^11 bins of one digit; the
 *   last block to finish picks the bin holding the sought rank (radix
 *   selection, three digits for 31 or 32 bits).
 * - a collection pass appends (key, index) of every element at or above a
 *   cut to a list; later passes read the list instead of x when it holds
 *   everything they need.
 * - the emission appends the selected pairs with warp-aggregated atomics:
 *   the pairs come out in no particular order.
 *
 * Every decision (which source, whether a stage runs) is taken on the
 * device from the state (state.h), so the host queues a fixed sequence and
 * synchronises once. Kernels end with the last-block pattern: each block
 * fences its writes and takes a ticket; the block with the last ticket
 * finishes the pass (reads the totals, updates the state, resets the
 * ticket). Loops over a source run the same number of iterations in every
 * thread of a block, so warp-wide votes see every lane. */
#include "state.h"

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

#define THREADS TIDE__GPU_THREADS
#define WARPS (THREADS / 32)
#define VEC 8 /* elements a thread reads per iteration over x */
#define FULL 0xffffffffu
#define NONFINITE 0x7f800000u

/* ---- keys --------------------------------------------------------------------------- */

__device__ __forceinline__ u32 key_of(float f) { return __float_as_uint(f) & 0x7fffffffu; }

__device__ __forceinline__ float half_bits_to_float(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

/* DT: 0 float32, 1 float16, 2 bfloat16. */
template <int DT>
__device__ __forceinline__ u32 key16(u32 bits) {
  u16 h = (u16)bits;
  return key_of(DT == 1 ? half_bits_to_float(h) : __uint_as_float((u32)h << 16));
}

template <int DT>
__device__ __forceinline__ u32 key_at(const void *x, u64 i) {
  if (DT == 0) return key_of(((const float *)x)[i]);
  return key16<DT>(((const u16 *)x)[i]);
}

/* Keys of x[i0 .. i0 + VEC), 0 past n. vec: x is 16-byte aligned. */
template <int DT>
__device__ __forceinline__ void load_keys(const void *x, u64 i0, u64 n, int vec, u32 key[VEC]) {
  if (vec && i0 + VEC <= n) {
    if (DT == 0) {
      const float4 *p = (const float4 *)((const float *)x + i0);
      float4 a = p[0], b = p[1];
      key[0] = key_of(a.x), key[1] = key_of(a.y), key[2] = key_of(a.z), key[3] = key_of(a.w);
      key[4] = key_of(b.x), key[5] = key_of(b.y), key[6] = key_of(b.z), key[7] = key_of(b.w);
    } else {
      uint4 a = *(const uint4 *)((const u16 *)x + i0);
      u32 w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        key[2 * j] = key16<DT>(w[j] & 0xffffu);
        key[2 * j + 1] = key16<DT>(w[j] >> 16);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; j++) key[j] = i0 + j < n ? key_at<DT>(x, i0 + j) : 0u;
  }
}

/* f(key, index, valid) for every element of x, VEC per thread and
 * iteration; every thread of the block makes the same calls. */
template <int DT, class F>
__device__ __forceinline__ void scan_x(const void *x, u64 n, int vec, F f) {
  const u64 step = (u64)gridDim.x * THREADS * VEC;
  for (u64 base = (u64)blockIdx.x * THREADS * VEC; base < n; base += step) {
    u64 i0 = base + (u64)threadIdx.x * VEC;
    u32 key[VEC];
    load_keys<DT>(x, i0, n, vec, key);
#pragma unroll
    for (int j = 0; j < VEC; j++) f(key[j], i0 + j, i0 + j < n);
  }
}

__device__ __forceinline__ u32 blocks_for(bool from_list, u64 n);

/* The same over the list's entries (key, index), by the blocks that take
 * part (blocks_for). */
template <class F>
__device__ __forceinline__ void scan_list(const uint2 *list, u64 n, F f) {
  const u64 step = (u64)blocks_for(true, n) * THREADS;
  for (u64 base = (u64)blockIdx.x * THREADS; base < n; base += step) {
    u64 i = base + threadIdx.x;
    uint2 e = i < n ? list[i] : make_uint2(0u, 0u);
    f(e.x, (u64)e.y, i < n);
  }
}

/* ---- block and warp helpers ---------------------------------------------------------- */

/* The block's reduction of v by op, every thread getting it, in a fixed
 * order: the same input gives the same bits (the mean's double sums). */
template <class T, class Op>
__device__ T block_reduce(T v, T identity, Op op) {
  __shared__ T part[WARPS];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(FULL, v, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  T t = identity;
  for (int w = 0; w < WARPS; w++) t = op(t, part[w]);
  __syncthreads();
  return t;
}

template <class T>
__device__ T block_sum(T v) {
  return block_reduce(v, (T)0, [](T a, T b) { return a + b; });
}
__device__ u32 block_min(u32 v) {
  return block_reduce(v, 0xffffffffu, [](u32 a, u32 b) { return min(a, b); });
}
__device__ u32 block_max(u32 v) {
  return block_reduce(v, 0u, [](u32 a, u32 b) { return max(a, b); });
}

/* Exclusive prefix sum over the block's threads in thread order; *total
 * receives the sum of all. */
__device__ u64 block_exclusive_scan(u64 v, u64 *total) {
  __shared__ u64 part[WARPS];
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  u64 inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    u64 y = __shfl_up_sync(FULL, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) part[w] = inc;
  __syncthreads();
  u64 off = 0, tot = 0;
  for (int i = 0; i < WARPS; i++) {
    if (i < w) off += part[i];
    tot += part[i];
  }
  __syncthreads();
  *total = tot;
  return off + inc - v;
}

/* Blocks that take part in a pass over n entries of the list: the others
 * return at once (a list is often far shorter than the grid). Over x: all. */
__device__ __forceinline__ u32 blocks_for(bool from_list, u64 n) {
  if (!from_list) return gridDim.x;
  u64 want = (n + THREADS - 1) / THREADS;
  return want < 1 ? 1u : want < gridDim.x ? (u32)want : gridDim.x;
}

/* True in the block that finishes last of the `blocks` taking part; its
 * loads then see every block's writes. Every thread of those must call it. */
__device__ bool last_block(tide__gpu_state_t *s, u32 blocks) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&s->blocks_done, 1u) == blocks - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

/* Positions in *counter for this thread's `count` entries (the first is
 * returned), one atomic per block and call: a single counter taken by
 * every warp of the grid serialises at the L2. Every thread of the block
 * must call it. */
__device__ u64 block_append(unsigned long long *counter, u32 count) {
  __shared__ u64 base;
  u64 total;
  u64 off = block_exclusive_scan(count, &total);
  if (total == 0) return 0;
  if (threadIdx.x == 0) base = atomicAdd(counter, (unsigned long long)total);
  __syncthreads();
  u64 first = base + off;
  __syncthreads(); /* read by all before a later call writes it */
  return first;
}

/* For every element of x: take(key, index) decides; put(pos, key, index)
 * stores the taken ones at consecutive positions of *counter. */
template <int DT, class T, class P>
__device__ __forceinline__ void append_x(const void *x, u64 n, int vec, unsigned long long *counter, T take, P put) {
  const u64 step = (u64)gridDim.x * THREADS * VEC;
  for (u64 base = (u64)blockIdx.x * THREADS * VEC; base < n; base += step) {
    u64 i0 = base + (u64)threadIdx.x * VEC;
    u32 key[VEC], mask = 0;
    load_keys<DT>(x, i0, n, vec, key);
#pragma unroll
    for (int j = 0; j < VEC; j++)
      if (i0 + j < n && take(key[j], i0 + j)) mask |= 1u << j;
    u64 pos = block_append(counter, __popc(mask));
#pragma unroll
    for (int j = 0; j < VEC; j++)
      if (mask >> j & 1u) put(pos++, key[j], i0 + j);
  }
}

/* The same over the list's entries, by the blocks that take part. */
template <class T, class P>
__device__ __forceinline__ void append_list(const uint2 *list, u64 n, unsigned long long *counter, T take, P put) {
  const u64 step = (u64)blocks_for(true, n) * THREADS;
  for (u64 base = (u64)blockIdx.x * THREADS; base < n; base += step) {
    u64 i = base + threadIdx.x;
    uint2 e = i < n ? list[i] : make_uint2(0u, 0u);
    bool t = i < n && take(e.x, (u64)e.y);
    u64 pos = block_append(counter, t ? 1u : 0u);
    if (t) put(pos, e.x, (u64)e.y);
  }
}

/* The bin of h[0..nb) (read as volatile: other blocks' atomics) holding the
 * rank-th element counted from the top bin down: *bin, *above (elements in
 * higher bins) and *count (elements in the bin), in shared memory for every
 * thread. Returns false when the bins hold fewer than rank elements. */
__device__ bool find_bin(const u32 *h, int nb, u64 rank, u32 *bin, u64 *above, u64 *count) {
  __shared__ u32 sbin;
  __shared__ u64 sabove, scount;
  const int per = nb / THREADS; /* 4 or 8 */
  const int top = nb - 1 - (int)threadIdx.x * per;
  u32 c[8];
  u64 sum = 0;
  for (int j = 0; j < per; j++) {
    c[j] = ((volatile const u32 *)h)[top - j];
    sum += c[j];
  }
  u64 total;
  u64 before = block_exclusive_scan(sum, &total);
  if (rank == 0 || rank > total) return false;
  if (before < rank && rank <= before + sum) {
    u64 cum = before;
    for (int j = 0; j < per; j++) {
      if (cum + c[j] >= rank) {
        sbin = (u32)(top - j);
        sabove = cum;
        scount = c[j];
        break;
      }
      cum += c[j];
    }
  }
  __syncthreads();
  *bin = sbin;
  *above = sabove;
  *count = scount;
  __syncthreads();
  return true;
}

/* ---- the passes ---------------------------------------------------------------------- */

/* Digits: magnitude keys have 31 bits (11 + 10 + 10), inverted indices 32
 * (11 + 11 + 10). */
__device__ __forceinline__ void digit(bool index_mode, int pass, int *bits, int *shift) {
  if (!index_mode) {
    *bits = pass == 0 ? 11 : 10;
    *shift = pass == 0 ? 20 : pass == 1 ? 10 : 0;
  } else {
    *bits = pass == 2 ? 10 : 11;
    *shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
  }
}

/* The end of a histogram pass over digit `pass` of `stage`, by the last
 * block (every thread of it calls this): the bin of hist holding the
 * sought rank, the bins zeroed for the next selection, the state moved on
 * to the next digit. */
__device__ void finish_digit(tide__gpu_state_t *s, u32 *hist, int stage, int pass, bool from_list) {
  int bits, shift;
  digit(stage != TIDE__GPU_STAGE_MAG, pass, &bits, &shift);
  const u32 nb = 1u << bits;
  u32 bin;
  u64 above, count;
  bool found = find_bin(hist, (int)nb, s->rank, &bin, &above, &count);
  for (u32 b = threadIdx.x; b < nb; b += THREADS) hist[b] = 0; /* zeroed for the next selection */
  if (threadIdx.x != 0) return;
  s->blocks_done = 0;
  if (!found) {
    s->failed = 1;
    return;
  }
  s->prefix |= bin << shift;
  s->mask |= (nb - 1u) << shift;
  s->rank -= above;
  s->above += above;
  s->equal = count;
  if (stage == TIDE__GPU_STAGE_MAG) s->digits = (u32)pass + 1u;
  if (stage == TIDE__GPU_STAGE_MAG && pass == 0 && !from_list && s->above + count <= s->cap) {
    /* The bucket and everything above fit the list: collect them. */
    s->collect = 1;
    s->list_cut = s->prefix;
  }
  if (pass != 2) return;
  if (stage == TIDE__GPU_STAGE_MAG) {
    s->kth = s->prefix;
    s->tie_needed = s->rank < s->equal;
    s->prefix = s->mask = 0;
    s->above = 0; /* rank: the ties still to take, lowest indices first */
  } else if (stage == TIDE__GPU_STAGE_TIE) {
    s->tie_index = ~s->prefix;
  } else if (stage == TIDE__GPU_STAGE_BAND_HI) {
    s->hi_index = ~s->prefix;
    s->prefix = s->mask = 0;
    s->above = 0;
    s->rank = s->offset;
  } else {
    s->lo_index = ~s->prefix;
  }
}

/* One digit of a radix selection. stage MAG: the next digit (s->digits)
 * of the rank-th largest key, nothing once all three are known (the
 * collection may have counted one); the other stages: digit `pass` of the
 * rank-th lowest index (largest inverted index) among the elements of a
 * key class. hist: this pass's zeroed bins. */
template <int DT>
__device__ void hist_pass(const void *x, const uint2 *list, tide__gpu_state_t *s, u32 *hist, int stage, int pass,
                          int vec) {
  __shared__ u32 sh[TIDE__GPU_BINS];
  bool active = !s->failed;
  if (stage == TIDE__GPU_STAGE_MAG) {
    pass = (int)s->digits;
    active = active && pass < 3;
  }
  if (stage == TIDE__GPU_STAGE_TIE) active = active && s->tie_needed;
  if (stage == TIDE__GPU_STAGE_BAND_HI) active = active && s->need > 0;
  if (stage == TIDE__GPU_STAGE_BAND_LO) active = active && s->need > 0 && s->offset > 0;
  if (!active) return;
  const bool from_list = s->use_list;
  const u64 n = from_list ? s->list_len : s->d;
  const u32 blocks = blocks_for(from_list, n);
  if (blockIdx.x >= blocks) return;
  const bool index_mode = stage != TIDE__GPU_STAGE_MAG;
  int bits, shift;
  digit(index_mode, pass, &bits, &shift);
  const u32 nb = 1u << bits, prefix = s->prefix, mask = s->mask;
  u32 lo = 0, hi = 0xffffffffu; /* the class: lo <= key <= hi */
  if (stage == TIDE__GPU_STAGE_TIE) {
    lo = hi = s->kth;
  } else if (index_mode) {
    lo = s->key2;
    hi = s->k1 > 0 ? s->key1 - 1u : 0xffffffffu;
  }
  const bool check = !index_mode && pass == 0 && !from_list;
  for (u32 b = threadIdx.x; b < nb; b += THREADS) sh[b] = 0;
  __syncthreads();
  u64 bad = TIDE__GPU_NONE;
  auto visit = [&](u32 key, u64 idx, bool valid) {
    if (!valid) return;
    if (check && key >= NONFINITE && idx < bad) bad = idx;
    u32 v = index_mode ? ~(u32)idx : key;
    if ((v & mask) == prefix && key >= lo && key <= hi) atomicAdd(&sh[(v >> shift) & (nb - 1u)], 1u);
  };
  if (from_list)
    scan_list(list, n, visit);
  else
    scan_x<DT>(x, n, vec, visit);
  if (bad != TIDE__GPU_NONE) atomicMin(&s->bad_index, bad);
  __syncthreads();
  for (u32 b = threadIdx.x; b < nb; b += THREADS)
    if (sh[b] != 0) atomicAdd(&hist[b], sh[b]);
  if (!last_block(s, blocks)) return;
  if (threadIdx.x == 0 && !from_list) s->full_passes++;
  finish_digit(s, hist, stage, pass, from_list);
}

#define STAGED 1024 /* list entries a block of the collection holds in shared memory */

/* Appends (key, index) of every element of x with key >= list_cut to the
 * list, when a previous pass asked for it (collect) and no list is in use;
 * and counts the next digit of the k-th largest key over the collected
 * elements of the class (prefix, mask) into hist: the collection is that
 * digit's pass too. The pass is one read of x: no block-wide barrier in
 * the loop. A warp takes positions in its block's staging area (shared
 * memory) with one shared atomic; the block appends what it staged with
 * one atomic at its end; positions past the staging area's room go to the
 * list at once (one atomic per warp). When the list holds fewer than k
 * or more than cap entries the digit is dropped and later passes read x. */
template <int DT>
__device__ void collect_pass(const void *x, uint2 *list, tide__gpu_state_t *s, u32 *hist, int vec) {
  __shared__ uint2 staged[STAGED];
  __shared__ u32 sh[TIDE__GPU_BINS];
  __shared__ u32 used;
  __shared__ u64 first_out;
  if (!s->collect || s->use_list || s->failed || s->digits >= 3) return;
  const u32 cut = s->list_cut, prefix = s->prefix, mask = s->mask;
  const u64 cap = s->cap, n = s->d;
  const int pass = (int)s->digits;
  int bits, shift;
  digit(false, pass, &bits, &shift);
  const u32 nb = 1u << bits;
  for (u32 b = threadIdx.x; b < nb; b += THREADS) sh[b] = 0;
  if (threadIdx.x == 0) used = 0;
  __syncthreads();
  const u32 lane = threadIdx.x & 31u;
  u64 bad = TIDE__GPU_NONE;
  const u64 step = (u64)gridDim.x * THREADS * VEC;
  for (u64 base = (u64)blockIdx.x * THREADS * VEC; base < n; base += step) {
    const u64 i0 = base + (u64)threadIdx.x * VEC;
    u32 key[VEC], take = 0;
    load_keys<DT>(x, i0, n, vec, key);
#pragma unroll
    for (int j = 0; j < VEC; j++)
      if (i0 + j < n && key[j] >= cut) take |= 1u << j;
    if (!__any_sync(FULL, take != 0)) continue;
    const u32 count = (u32)__popc(take);
    u32 inc = count; /* inclusive scan of the counts over the warp */
    for (u32 o = 1; o < 32; o <<= 1) {
      u32 y = __shfl_up_sync(FULL, inc, o);
      if (lane >= o) inc += y;
    }
    const u32 total = __shfl_sync(FULL, inc, 31);
    u32 first = 0;
    if (lane == 31) first = atomicAdd(&used, total);
    first = __shfl_sync(FULL, first, 31);
    /* The warp's positions first .. first + total: those from `room` on go to the list. */
    const u32 room = first > STAGED ? first : STAGED;
    const u32 spill = first + total > room ? first + total - room : 0;
    u64 out = 0;
    if (spill > 0) {
      if (lane == 31) out = atomicAdd(&s->list_len, (unsigned long long)spill);
      out = __shfl_sync(FULL, out, 31);
    }
    u32 p = first + inc - count;
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      if (!(take >> j & 1u)) continue;
      const u32 kj = key[j];
      const u64 idx = i0 + j;
      const uint2 e = make_uint2(kj, (u32)idx);
      if (p < STAGED) {
        staged[p] = e;
      } else {
        const u64 g = out + (p - room);
        if (g < cap) list[g] = e;
      }
      p++;
      if ((kj & mask) == prefix) atomicAdd(&sh[(kj >> shift) & (nb - 1u)], 1u);
      if (kj >= NONFINITE && idx < bad) bad = idx;
    }
  }
  if (bad != TIDE__GPU_NONE) atomicMin(&s->bad_index, bad);
  __syncthreads();
  const u32 kept = used < STAGED ? used : STAGED;
  if (threadIdx.x == 0 && kept > 0) first_out = atomicAdd(&s->list_len, (unsigned long long)kept);
  __syncthreads();
  for (u32 i = threadIdx.x; i < kept; i += THREADS)
    if (first_out + i < cap) list[first_out + i] = staged[i];
  for (u32 b = threadIdx.x; b < nb; b += THREADS)
    if (sh[b] != 0) atomicAdd(&hist[b], sh[b]);
  if (!last_block(s, gridDim.x)) return;
  const u64 m = ((volatile tide__gpu_state_t *)s)->list_len;
  const bool ok = m >= s->k && m <= cap;
  if (ok) {
    finish_digit(s, hist, TIDE__GPU_STAGE_MAG, pass, true);
  } else {
    for (u32 b = threadIdx.x; b < nb; b += THREADS) hist[b] = 0;
  }
  if (threadIdx.x != 0) return;
  s->full_passes++;
  s->collect = 0;
  s->blocks_done = 0;
  if (ok) {
    s->use_list = 1;
    s->candidates = m;
  } else {
    s->fallback = 1;
    s->list_len = 0;
  }
}

#define SAMPLE_RUNS 4 /* runs a thread of the sample holds: tide__sample_plan's at most 1024 */

/* The sampled selector's cut, by one block: a stratified sample of `runs`
 * runs of 16 elements, run r at (r * stride / 16) * 16, held in
 * registers (a scattered sample is latency-bound: all its loads are in
 * flight at once); the cut is the lower edge of the sub-bucket (key >> 9)
 * holding the sample's r-th largest key, r four binomial standard
 * deviations above the expected count of sampled elements at or above the
 * k-th key (two histograms in shared memory, the second over the first's
 * bucket). It starts the selection: the state is set from init. */
template <int DT>
__device__ void sample_cut(const void *x, tide__gpu_state_t *s, const tide__gpu_state_t &init, u64 runs, u64 stride,
                           int vec) {
  __shared__ u32 sh[TIDE__GPU_BINS];
  if (threadIdx.x == 0) *s = init; /* the selection's first kernel: no copy of the state before it */
  const u64 n = runs * 16, d = init.d, k = init.k;
  double e = (double)k * (double)n / (double)d;
  double r = ceil(e + 4.0 * sqrt(e) + 4.0);
  if (r >= (double)n || runs > (u64)SAMPLE_RUNS * THREADS) { /* the cut would take (nearly) everything */
    if (threadIdx.x == 0) s->fallback = 1;
    return;
  }
  for (u32 b = threadIdx.x; b < TIDE__GPU_BINS; b += THREADS) sh[b] = 0;
  __syncthreads();
  u32 key[SAMPLE_RUNS][16];
#pragma unroll
  for (int q = 0; q < SAMPLE_RUNS; q++) {
    const u64 run = threadIdx.x + (u64)q * THREADS;
    const u64 start = run < runs ? run * stride / 16 * 16 : 0;
    load_keys<DT>(x, start, d, vec, key[q]);
    load_keys<DT>(x, start + VEC, d, vec, key[q] + VEC);
  }
#pragma unroll
  for (int q = 0; q < SAMPLE_RUNS; q++)
    if (threadIdx.x + (u64)q * THREADS < runs)
#pragma unroll
      for (int j = 0; j < 16; j++) atomicAdd(&sh[key[q][j] >> 20], 1u);
  __syncthreads();
  u32 b1, b2 = 0;
  u64 above, count;
  bool found = find_bin(sh, TIDE__GPU_BINS, (u64)r, &b1, &above, &count);
  for (u32 b = threadIdx.x; b < TIDE__GPU_BINS; b += THREADS) sh[b] = 0;
  __syncthreads();
  if (found) {
#pragma unroll
    for (int q = 0; q < SAMPLE_RUNS; q++)
      if (threadIdx.x + (u64)q * THREADS < runs)
#pragma unroll
        for (int j = 0; j < 16; j++)
          if ((key[q][j] >> 20) == b1) atomicAdd(&sh[(key[q][j] >> 9) & 2047u], 1u);
    __syncthreads();
    found = find_bin(sh, TIDE__GPU_BINS, (u64)r - above, &b2, &above, &count);
  }
  if (threadIdx.x != 0) return;
  u32 cut = (b1 << 20) | (b2 << 9);
  if (cut > NONFINITE) cut = NONFINITE; /* every NaN/Inf is a candidate */
  if (!found || cut == 0) {
    s->fallback = 1;
    return;
  }
  s->list_cut = cut;
  s->collect = 1;
}

/* A NaN/Inf anywhere (k = 0 still checks x). */
template <int DT>
__device__ void check_pass(const void *x, tide__gpu_state_t *s, int vec) {
  u64 bad = TIDE__GPU_NONE;
  scan_x<DT>(x, s->d, vec, [&](u32 key, u64 idx, bool valid) {
    if (valid && key >= NONFINITE && idx < bad) bad = idx;
  });
  if (bad != TIDE__GPU_NONE) atomicMin(&s->bad_index, bad);
}

/* ---- MSTopK -------------------------------------------------------------------------- */

/* mean|x| (block sums in partials[], added in block order by the last
 * block: the same bits every run) and max|x|; then the bisection starts. */
template <int DT>
__device__ void mean_pass(const void *x, tide__gpu_state_t *s, double *partials, int vec) {
  double acc = 0.0;
  u32 mk = 0;
  u64 bad = TIDE__GPU_NONE;
  scan_x<DT>(x, s->d, vec, [&](u32 key, u64 idx, bool valid) {
    if (!valid) return;
    acc += (double)__uint_as_float(key);
    mk = max(mk, key);
    if (key >= NONFINITE && idx < bad) bad = idx;
  });
  double sum = block_sum(acc);
  mk = block_max(mk);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sum;
    atomicMax(&s->max_key, mk);
  }
  if (bad != TIDE__GPU_NONE) atomicMin(&s->bad_index, bad);
  if (!last_block(s, gridDim.x)) return;
  double total = 0.0;
  for (u32 b = threadIdx.x; b < gridDim.x; b += THREADS) total += ((volatile double *)partials)[b];
  total = block_sum(total);
  if (threadIdx.x != 0) return;
  s->base = total / (double)s->d;
  s->top = (double)__uint_as_float(((volatile tide__gpu_state_t *)s)->max_key);
  s->lo_f = 0.0;
  s->hi_f = 1.0;
  s->k1 = 0;
  s->k2 = s->d;
  s->key1 = s->key2 = 0;
  s->full_passes++;
  s->blocks_done = 0;
}

/* One bisection probe: counts key >= t over x (collecting those elements
 * while they fit the list) or over the list once one holds them all. */
template <int DT>
__device__ void probe_pass(const void *x, uint2 *list, tide__gpu_state_t *s, int vec) {
  const bool from_list = s->use_list;
  const u32 blocks = blocks_for(from_list, s->list_len);
  if (blockIdx.x >= blocks) return;
  const double f = (s->lo_f + s->hi_f) / 2.0;
  const float t = (float)(s->base + f * (s->top - s->base));
  const u32 tk = key_of(t);
  const u64 cap = s->cap;
  u64 c = 0;
  if (from_list) {
    scan_list(list, s->list_len, [&](u32 key, u64 idx, bool valid) { c += valid && key >= tk; });
  } else {
    /* Collect while counting; positions past cap only count (overflow). */
    append_x<DT>(
        x, s->d, vec, &s->list_len,
        [&](u32 key, u64 idx) {
          bool take = key >= tk;
          c += take;
          return take;
        },
        [&](u64 pos, u32 key, u64 idx) {
          if (pos < cap)
            list[pos] = make_uint2(key, (u32)idx);
          else
            s->overflow = 1;
        });
  }
  c = block_sum(c);
  if (threadIdx.x == 0) atomicAdd(&s->count, (unsigned long long)c);
  if (!last_block(s, blocks) || threadIdx.x != 0) return;
  c = s->count;
  if (c <= s->k) {
    s->hi_f = f;
    if (c > s->k1) {
      s->k1 = c;
      s->key1 = tk;
    }
  } else {
    s->lo_f = f;
    if (c < s->k2) {
      s->k2 = c;
      s->key2 = tk;
    }
  }
  if (!from_list) {
    s->full_passes++;
    /* Every later probe lies above this one: the list serves them all. */
    if (c > s->k && c <= cap && !s->overflow && s->list_len == c) {
      s->use_list = 1;
      s->candidates = c;
    } else {
      s->list_len = 0;
      s->overflow = 0;
    }
  }
  s->count = 0;
  s->blocks_done = 0;
}

__device__ __forceinline__ u64 splitmix64(u64 *state) {
  u64 z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, n), 1 <= n <= 2^32 (Lemire's method, as the CPU's). */
__device__ u64 uniform(u64 *state, u64 n) {
  for (;;) {
    u64 r = splitmix64(state) >> 32;
    u64 m = r * n;
    u64 low = m & 0xffffffffull;
    if (low >= n || low >= ((1ull << 32) - n) % n) return m >> 32;
  }
}

__device__ __forceinline__ bool in_band(const tide__gpu_state_t *s, u32 key, u64 k1, u32 key1, u32 key2) {
  (void)s;
  return key >= key2 && (k1 == 0 || key < key1);
}

/* Counts the band t2 <= |x| < t1 and draws the offset of the run of
 * k - k1 band elements (in index order) that pads the selection. */
template <int DT>
__device__ void band_pass(const void *x, const uint2 *list, tide__gpu_state_t *s, int vec) {
  const bool from_list = s->use_list;
  const u32 blocks = blocks_for(from_list, s->list_len);
  if (blockIdx.x >= blocks) return;
  const u64 k1 = s->k1;
  const u32 key1 = s->key1, key2 = s->key2;
  u64 c = 0;
  auto visit = [&](u32 key, u64 idx, bool valid) { c += valid && in_band(s, key, k1, key1, key2); };
  if (from_list)
    scan_list(list, s->list_len, visit);
  else
    scan_x<DT>(x, s->d, vec, visit);
  c = block_sum(c);
  if (threadIdx.x == 0) atomicAdd(&s->count, (unsigned long long)c);
  if (!last_block(s, blocks) || threadIdx.x != 0) return;
  u64 band = s->count, need = s->k - k1, seed = s->seed;
  s->band = band;
  s->need = need;
  s->offset = need > 0 ? uniform(&seed, band - need + 1) : 0;
  s->prefix = s->mask = 0;
  s->above = 0;
  s->rank = s->offset + need;
  s->count = 0;
  if (!from_list) s->full_passes++;
  s->blocks_done = 0;
}

/* ---- emission ------------------------------------------------------------------------ */

/* One selected pair at output position pos (< k). */
template <int DT>
__device__ __forceinline__ void put_pair(const void *x, void *values, void *indices, int index64, u64 pos, u64 idx) {
  if (DT == 0)
    ((float *)values)[pos] = ((const float *)x)[idx];
  else
    ((u16 *)values)[pos] = ((const u16 *)x)[idx];
  if (index64)
    ((long long *)indices)[pos] = (long long)idx;
  else
    ((u32 *)indices)[pos] = (u32)idx;
}

/* emit_pass's ranked form (see there); sb: TIDE__GPU_BUCKET entries of
 * shared memory. */
template <int DT>
__device__ void emit_ranked(const void *x, const uint2 *list, tide__gpu_state_t *s, void *values, void *indices,
                            uint2 *bucket, int index64, uint2 *sb) {
  const u64 n = s->list_len, k = s->k;
  const u32 blocks = blocks_for(true, n);
  if (blockIdx.x >= blocks) return;
  const u32 prefix = s->prefix, mask = s->mask;
  u32 least = 0xffffffffu;
  const u64 step = (u64)blocks * THREADS;
  for (u64 base = (u64)blockIdx.x * THREADS; base < n; base += step) {
    const u64 i = base + threadIdx.x;
    const uint2 e = i < n ? list[i] : make_uint2(0u, 0u);
    const bool above = i < n && (e.x & mask) > prefix, in = i < n && (e.x & mask) == prefix;
    const u64 pos = block_append(&s->written, above ? 1u : 0u);
    if (above && pos < k) {
      put_pair<DT>(x, values, indices, index64, pos, e.y);
      least = min(least, e.x);
    }
    const u64 at = block_append(&s->count, in ? 1u : 0u);
    if (in && at < TIDE__GPU_BUCKET) bucket[at] = e;
  }
  least = block_min(least);
  if (threadIdx.x == 0 && least != 0xffffffffu) atomicMin(&s->min_taken, least);
  if (!last_block(s, blocks)) return;
  /* The last block: the bucket's elements ranked, the top `rank` written
   * after those above it. */
  const volatile tide__gpu_state_t *vs = s;
  const u64 m = vs->count < TIDE__GPU_BUCKET ? vs->count : TIDE__GPU_BUCKET, first = vs->written;
  const u64 take = s->rank;
  for (u64 i = threadIdx.x; i < m; i += THREADS) {
    const u64 v = ((volatile u64 *)bucket)[i]; /* written by other blocks */
    sb[i] = make_uint2((u32)v, (u32)(v >> 32));
  }
  __syncthreads();
  u32 kth = 0xffffffffu;
  for (u64 i = threadIdx.x; i < m; i += THREADS) {
    const uint2 e = sb[i];
    u64 r = 0; /* elements ranked before e */
    for (u64 j = 0; j < m; j++) r += sb[j].x > e.x || (sb[j].x == e.x && sb[j].y < e.y);
    if (r < take && first + r < k) {
      put_pair<DT>(x, values, indices, index64, first + r, e.y);
      kth = min(kth, e.x);
    }
  }
  kth = block_min(kth);
  if (threadIdx.x != 0) return;
  if (m != vs->equal || take > m || first + take != k) { /* the digits and the list disagree: a bug */
    s->failed = 1;
    return;
  }
  s->kth = kth;
  if (kth < s->min_taken) s->min_taken = kth;
  s->written = first + take;
  s->digits = 3;
  s->count = 0;
  s->blocks_done = 0;
}

/* Appends the selected (value, index) pairs: values in x's type, indices
 * uint32 or int64. kind: TIDE__GPU_EXACT (exact and sampled) or
 * TIDE__GPU_MSTOPK. Writes nothing after a NaN/Inf or a failed check.
 *
 * Exact, from the list, with the k-th key known but for its last digit
 * and at most TIDE__GPU_BUCKET list elements in its bucket (the common
 * case): the emission is that digit's pass too. It appends everything
 * above the bucket, gathers the bucket's elements into `bucket`, and its
 * last block ranks them (larger key first, lower index first among equal
 * keys, as the CPU breaks ties) and writes the top `rank` of them. */
template <int DT>
__device__ void emit_pass(const void *x, const uint2 *list, tide__gpu_state_t *s, void *values, void *indices,
                          uint2 *bucket, int index64, int kind, int vec, int ties_done) {
  __shared__ uint2 sb[TIDE__GPU_BUCKET];
  if (s->bad_index != TIDE__GPU_NONE || s->failed) return;
  const bool ranked = kind == TIDE__GPU_EXACT && s->digits == 2 && s->use_list && s->equal <= TIDE__GPU_BUCKET;
  if (kind == TIDE__GPU_EXACT && s->digits < 3 && !ranked) return; /* the host queues the missing digits */
  if (kind == TIDE__GPU_EXACT && s->tie_needed && !ties_done) return; /* the host queues the tie passes */
  if (ranked) {
    emit_ranked<DT>(x, list, s, values, indices, bucket, index64, sb);
    return;
  }
  const bool from_list = s->use_list;
  const u32 blocks = blocks_for(from_list, s->list_len);
  if (blockIdx.x >= blocks) return;
  const u64 k = s->k;
  const u32 kth = s->kth, tie_index = s->tie_index, tie_needed = s->tie_needed;
  const u64 k1 = s->k1, need = s->need, offset = s->offset;
  const u32 key1 = s->key1, key2 = s->key2, hi_index = s->hi_index, lo_index = s->lo_index;
  u32 least = 0xffffffffu;
  auto take = [&](u32 key, u64 idx) {
    if (kind == TIDE__GPU_EXACT) return key > kth || (key == kth && (!tie_needed || idx <= tie_index));
    return (k1 > 0 && key >= key1) ||
           (need > 0 && in_band(s, key, k1, key1, key2) && idx <= hi_index && (offset == 0 || idx > lo_index));
  };
  auto put = [&](u64 pos, u32 key, u64 idx) {
    if (pos < k) {
      put_pair<DT>(x, values, indices, index64, pos, idx);
      least = min(least, key);
    }
  };
  if (from_list)
    append_list(list, s->list_len, &s->written, take, put);
  else
    append_x<DT>(x, s->d, vec, &s->written, take, put);
  least = block_min(least);
  if (threadIdx.x == 0 && least != 0xffffffffu) atomicMin(&s->min_taken, least);
  if (!last_block(s, blocks) || threadIdx.x != 0) return;
  if (!from_list) s->full_passes++;
  s->blocks_done = 0;
}

/* ---- error feedback ------------------------------------------------------------------ */

/* acc = grad + residual, element by element. */
extern "C" __global__ void __launch_bounds__(THREADS) tide_gpu_ef_add(const float *grad, const float *residual,
                                                                       float *acc, u64 n) {
  const u64 step = (u64)gridDim.x * THREADS;
  for (u64 i = (u64)blockIdx.x * THREADS + threadIdx.x; i < n; i += step) acc[i] = grad[i] + residual[i];
}

/* residual[indices[j]] = 0 for j < k: what was sent leaves the residual. */
extern "C" __global__ void __launch_bounds__(THREADS) tide_gpu_ef_zero(float *residual, const u32 *indices, u64 k) {
  const u64 step = (u64)gridDim.x * THREADS;
  for (u64 j = (u64)blockIdx.x * THREADS + threadIdx.x; j < k; j += step) residual[indices[j]] = 0.0f;
}

/* ---- entry points: one per pass and input type ---------------------------------------- */

#define TIDE_GPU_ENTRIES(SUFFIX, DT)                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_hist_##SUFFIX(const void *x, const uint2 *list, tide__gpu_state_t *s, u32 *hist, int stage,     \
                             int pass, int vec) {                                                              \
    hist_pass<DT>(x, list, s, hist, stage, pass, vec);                                                         \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_collect_##SUFFIX(const void *x, uint2 *list, tide__gpu_state_t *s, u32 *hist, int vec) {        \
    collect_pass<DT>(x, list, s, hist, vec);                                                                   \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_sample_##SUFFIX(const void *x, tide__gpu_state_t *s, tide__gpu_state_t init, u64 runs,          \
                               u64 stride, int vec) {                                                          \
    sample_cut<DT>(x, s, init, runs, stride, vec);                                                             \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS) tide_gpu_check_##SUFFIX(const void *x,                 \
                                                                                tide__gpu_state_t *s, int vec) { \
    check_pass<DT>(x, s, vec);                                                                                 \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_mean_##SUFFIX(const void *x, tide__gpu_state_t *s, double *partials, int vec) {                 \
    mean_pass<DT>(x, s, partials, vec);                                                                        \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_probe_##SUFFIX(const void *x, uint2 *list, tide__gpu_state_t *s, int vec) {                     \
    probe_pass<DT>(x, list, s, vec);                                                                           \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_band_##SUFFIX(const void *x, const uint2 *list, tide__gpu_state_t *s, int vec) {                \
    band_pass<DT>(x, list, s, vec);                                                                            \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      tide_gpu_emit_##SUFFIX(const void *x, const uint2 *list, tide__gpu_state_t *s, void *values,             \
                             void *indices, uint2 *bucket, int index64, int kind, int vec, int ties_done) {    \
    emit_pass<DT>(x, list, s, values, indices, bucket, index64, kind, vec, ties_done);                         \
  }

TIDE_GPU_ENTRIES(f32, 0)
TIDE_GPU_ENTRIES(f16, 1)
TIDE_GPU_ENTRIES(bf16, 2)
