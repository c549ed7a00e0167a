/* Top-k selection on a GPU: the sequences of select.cu's passes that make
 * each selector, queued on the caller's stream, and the error-feedback
 * backend of a compressor whose residual lives on the device.
 *
 * exact:   hist(MAG digit 0) over x  collect bucket and above + digit 1
 *          emit (+ digit 2, ranked)                                 ~2 reads
 * sampled: sample (one block)  collect x >= cut + digit 0  hist(digit 1)
 *          on the list  emit (+ digit 2, ranked)                    ~1 read
 *          (a cut that misses, or a last bucket too full to rank: the
 *          digits left, then [ties: hist(TIE 0..2)] and emit)
 * mstopk:  mean  probe x rounds (over x until one collects what the later
 *          probes need, then over that list)  band  hist(BAND_HI 0..2)
 *          [hist(BAND_LO 0..2)]  emit                 ~2-4 reads of x
 * Bracketed stages are queued always and skip themselves on the device
 * when not needed: the host waits once, at the end, to read the state (a
 * NaN/Inf, the counts for the stats), and queues a second round only when
 * that is rare: ties at the k-th key to break by index, or digits left
 * because a collection missed. The first round is the same sequence for
 * every call with the same arguments, so a repeated call (a compressor's
 * buffers, a training loop's tensors) replays it as one CUDA graph
 * (TIDE_GPU_GRAPHS): one launch instead of four to thirty, and shorter
 * gaps between the kernels on the device. */
#include <math.h>
#include <string.h>

#include "compress/fused.h"
#include "gpu/gpu.h"

/* Scratch list entries a selection may need: the collection after the
 * first histogram (bucket and above), the sampled cut's candidates, and
 * MSTopK's probes. A larger list only means an earlier collection. */
static size_t list_entries(size_t d, size_t k, const tide__sample_plan_t *plan, int sampled) {
  size_t cap = 4 * k + 65536;
  if (d / 16 > cap) cap = d / 16;
  if (sampled) {
    double n = (double)(plan->runs * TIDE__SAMPLE_RUN);
    double e = (double)k * n / (double)d, r = ceil(e + 4.0 * sqrt(e) + 4.0);
    size_t expect = (size_t)(r * (double)d / n), want = 3 * expect + 2 * k + 65536;
    if (want > cap) cap = want;
  }
  return cap < d ? cap : d;
}

typedef struct {
  tide__gpu_t *g;
  void *stream;
  int type; /* 0 f32, 1 f16, 2 bf16 */
  int rc;
} queue_t;
#define GRID 0 /* a pass over x's blocks (tide__gpu_launch_typed) */

static void run(queue_t *q, tide__gpu_kernel_t kernel, unsigned blocks, void **args) {
  if (q->rc == 0) q->rc = tide__gpu_launch_typed(q->g, kernel, q->type, blocks, q->stream, args);
}

/* One selection's queued work: the kernels' arguments (launches take their
 * addresses) and the histogram slots taken so far. */
typedef struct {
  queue_t q;
  tide_topk_kind_t kind;
  size_t k;
  int sampled, rounds;
  tide__sample_plan_t plan;
  tide__cu_ptr_t hist;
  tide__gpu_state_t *hs;
  void *xp, *lp, *sp, *pp, *values, *indices, *chp;
  int vec, index64, emit_kind, ties_done, slot;
} sel_t;

/* One histogram pass: its own zeroed slot of bins (stage MAG: the next
 * digit, whatever pass says). */
static void hist_pass(sel_t *s, int stage, int pass) {
  void *hp = (void *)(uintptr_t)(s->hist + (tide__cu_ptr_t)s->slot++ * TIDE__GPU_BINS * 4);
  void *args[] = {&s->xp, &s->lp, &s->sp, &hp, &stage, &pass, &s->vec};
  run(&s->q, TIDE__K_HIST, GRID, args);
}

/* The emission, then the state back to the host. */
static void emit(sel_t *s) {
  void *args[] = {&s->xp, &s->lp, &s->sp, &s->values, &s->indices, &s->pp, &s->index64, &s->emit_kind, &s->vec,
                  &s->ties_done};
  run(&s->q, TIDE__K_EMIT, GRID, args);
  if (s->q.rc == 0) s->q.rc = tide__gpu_copy(s->q.g, s->hs, s->sp, sizeof *s->hs, s->q.stream);
}

/* The first round, the same sequence for every call with the same
 * arguments: what a graph holds. */
static void first_round(sel_t *s) {
  queue_t *q = &s->q;
  /* The state to the device: the sampled selector's first kernel takes it
   * as an argument (one queued operation fewer); the others copy it. */
  if (!s->sampled) q->rc = tide__gpu_copy(q->g, s->sp, s->hs, sizeof *s->hs, q->stream);
  /* The collection counts a digit too: its own slot of bins. */
  s->chp = (void *)(uintptr_t)(s->hist + (tide__cu_ptr_t)s->slot++ * TIDE__GPU_BINS * 4);
  void *collect_args[] = {&s->xp, &s->lp, &s->sp, &s->chp, &s->vec};
  void *list_args[] = {&s->xp, &s->lp, &s->sp, &s->vec}; /* probe, band */
  if (s->k == 0) {
    void *args[] = {&s->xp, &s->sp, &s->vec};
    run(q, TIDE__K_CHECK, GRID, args);
    if (q->rc == 0) q->rc = tide__gpu_copy(q->g, s->hs, s->sp, sizeof *s->hs, q->stream);
  } else if (s->kind != TIDE_TOPK_MSTOPK) {
    if (s->sampled) { /* digit 0 in the collection; when the cut misses, the digits read x */
      unsigned long long runs = s->plan.runs, stride = s->plan.stride;
      void *args[] = {&s->xp, &s->sp, s->hs, &runs, &stride, &s->vec};
      run(q, TIDE__K_SAMPLE, 1, args);
      run(q, TIDE__K_COLLECT, GRID, collect_args);
      hist_pass(s, TIDE__GPU_STAGE_MAG, 0);
    } else { /* digit 1 in the collection of the bucket and above */
      hist_pass(s, TIDE__GPU_STAGE_MAG, 0);
      run(q, TIDE__K_COLLECT, GRID, collect_args);
    }
    /* The last digit in the emission (ranked), unless its bucket is too
     * full or a collection missed: then the host queues the digits left. */
    emit(s);
  } else {
    void *mean_args[] = {&s->xp, &s->sp, &s->pp, &s->vec};
    run(q, TIDE__K_MEAN, GRID, mean_args);
    for (int r = 0; r < s->rounds; r++) run(q, TIDE__K_PROBE, GRID, list_args);
    run(q, TIDE__K_BAND, GRID, list_args);
    for (int p = 0; p < 3; p++) hist_pass(s, TIDE__GPU_STAGE_BAND_HI, p);
    for (int p = 0; p < 3; p++) hist_pass(s, TIDE__GPU_STAGE_BAND_LO, p);
    emit(s);
  }
}

/* The histogram slots first_round takes: the collection's, then one
 * (exact, sampled) or six (MSTopK's band). A replayed graph takes them
 * without first_round running; queue_first_round checks the count each
 * time first_round does run. */
static int first_round_slots(const sel_t *s) {
  return 1 + (s->k == 0 ? 0 : s->kind == TIDE_TOPK_MSTOPK ? 6 : 1);
}

/* The first round as a graph when the same selection repeats
 * (TIDE_GPU_GRAPHS), else launched one by one. */
static void queue_first_round(sel_t *s, const void *x, tide_dtype_t dtype, size_t d, tide_dtype_t index_dtype,
                              uint64_t seed) {
  struct {
    const void *x, *values, *indices;
    uint64_t d, k, seed, hist, list, state, partials;
    int32_t kind, dtype, index_dtype, rounds;
  } key;
  memset(&key, 0, sizeof key); /* no padding bytes left unset in the comparison */
  key.x = x;
  key.values = s->values;
  key.indices = s->indices;
  key.d = d;
  key.k = s->k;
  key.seed = seed;
  key.hist = s->hist;
  key.list = (uint64_t)(uintptr_t)s->lp;
  key.state = (uint64_t)(uintptr_t)s->sp;
  key.partials = (uint64_t)(uintptr_t)s->pp;
  key.kind = (int32_t)s->kind;
  key.dtype = (int32_t)dtype;
  key.index_dtype = (int32_t)index_dtype;
  key.rounds = s->rounds;
  void *exec = NULL, *capture;
  int graph_slot = 0, slot = s->slot;
  int found = tide__gpu_graph_find(s->q.g, &key, sizeof key, &exec, &graph_slot);
  if (found == 1 && tide__gpu_capture_begin(s->q.g, &capture) == 0) {
    void *stream = s->q.stream;
    s->q.stream = capture;
    first_round(s);
    s->q.stream = stream;
    tide__gpu_capture_end(s->q.g, graph_slot, s->q.rc, &exec);
    s->q.rc = 0;
    s->slot = slot;
  }
  if (exec != NULL) {
    s->q.rc = tide__gpu_graph_launch(s->q.g, exec, s->q.stream);
  } else {
    first_round(s);
    if (s->q.rc == 0 && s->slot != slot + first_round_slots(s)) {
      TIDE_ERROR("tide_gpu_topk_select: internal error: the first round took %d histogram slots, not %d: "
                 "please report it", s->slot - slot, first_round_slots(s));
      s->q.rc = TIDE_EIO;
    }
  }
  s->slot = slot + first_round_slots(s);
}

int tide__gpu_select(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const void *x, tide_dtype_t dtype,
                     size_t d, size_t k, void *values, void *indices, tide_dtype_t index_dtype, void *stream,
                     tide_topk_stats_t *stats, size_t *bad_index) {
  static const char *const fn = "tide_gpu_topk_select";
  if (kind != TIDE_TOPK_EXACT && kind != TIDE_TOPK_SAMPLED && kind != TIDE_TOPK_MSTOPK) {
    TIDE_ERROR("%s: selector %s has no GPU kernels: use exact, sampled or mstopk", fn, tide_topk_name(kind));
    return TIDE_EINVAL;
  }
  if (dtype != TIDE_F32 && dtype != TIDE_F16 && dtype != TIDE_BF16) {
    TIDE_ERROR("%s: dtype %s is not selectable: use f32, f16 or bf16", fn, tide_dtype_name(dtype));
    return TIDE_EINVAL;
  }
  if (index_dtype != TIDE_I32 && index_dtype != TIDE_I64) {
    TIDE_ERROR("%s: index_dtype %s: use i32 or i64", fn, tide_dtype_name(index_dtype));
    return TIDE_EINVAL;
  }
  if (d >= ((size_t)1 << 32) || k > d) {
    TIDE_ERROR("%s: k = %zu, d = %zu: need k <= d < 2^32 (select over shards beyond)", fn, k, d);
    return TIDE_EINVAL;
  }
  if (index_dtype == TIDE_I32 && d > (size_t)INT32_MAX) {
    TIDE_ERROR("%s: d = %zu needs i64 indices (i32 holds indices below 2^31)", fn, d);
    return TIDE_EINVAL;
  }
  if (x == NULL && d > 0) return tide__null_arg(fn, "x");
  if (k > 0 && (values == NULL || indices == NULL)) return tide__null_arg(fn, "values/indices");
  int rounds = opts != NULL && opts->mstopk_rounds > 0 ? opts->mstopk_rounds : 20;
  if (opts != NULL && (opts->mstopk_rounds < 0 || opts->mstopk_rounds > 64)) {
    TIDE_ERROR("%s: mstopk_rounds = %d; use 1..64, or 0 for 20", fn, opts->mstopk_rounds);
    return TIDE_EINVAL;
  }
  tide_topk_stats_t st = {0};
  if (d == 0) {
    if (stats != NULL) *stats = st;
    return 0;
  }
  tide__gpu_t *g;
  TIDE_CHECK(tide__gpu_for_pointer(fn, x, &g));
  for (int i = 0; k > 0 && i < 2; i++) {
    const void *p = i == 0 ? values : indices;
    if (!tide__gpu_is_device_pointer(p)) {
      TIDE_ERROR("%s: %s (%p) is not GPU memory: the pairs are written on the device", fn,
                 i == 0 ? "values" : "indices", p);
      return TIDE_EINVAL;
    }
  }
  tide__sample_plan_t plan = {0};
  int sampled = kind == TIDE_TOPK_SAMPLED && k > 0 && k < d && tide__sample_plan(d, &plan);

  tide__gpu_lock(g);
  tide__cu_ptr_t state, hist, partials, list;
  tide__gpu_state_t *hs;
  int *hist_dirty;
  int rc = tide__gpu_scratch(g, list_entries(d, k, &plan, sampled), &state, &hist, &partials, &list, &hs,
                             &hist_dirty);
  if (rc < 0) goto out;
  memset(hs, 0, sizeof *hs);
  hs->d = d;
  hs->k = k;
  hs->rank = k; /* the first selection seeks the k-th largest key */
  hs->cap = list_entries(d, k, &plan, sampled);
  hs->seed = opts != NULL ? opts->seed : 0;
  hs->bad_index = TIDE__GPU_NONE;
  hs->min_taken = 0xffffffffu;
  sel_t sel = {.q = {g, stream, dtype == TIDE_F32 ? 0 : dtype == TIDE_F16 ? 1 : 2, 0},
               .kind = kind,
               .k = k,
               .sampled = sampled,
               .rounds = rounds,
               .plan = plan,
               .hist = hist,
               .hs = hs,
               .xp = (void *)x,
               .lp = (void *)(uintptr_t)list,
               .sp = (void *)(uintptr_t)state,
               .pp = (void *)(uintptr_t)partials,
               .values = values,
               .indices = indices,
               .vec = ((uintptr_t)x % 16) == 0,
               .index64 = index_dtype == TIDE_I64,
               .emit_kind = kind == TIDE_TOPK_MSTOPK ? TIDE__GPU_MSTOPK : TIDE__GPU_EXACT};
  queue_t *q = &sel.q;
  /* Each histogram pass zeroes its bins when done; after a failed call
   * (or the first) they are zeroed here. */
  if (*hist_dirty) q->rc = tide__gpu_memset32(g, hist, 0, (size_t)TIDE__GPU_HISTS * TIDE__GPU_BINS, stream);
  *hist_dirty = 1;
  if (q->rc == 0) queue_first_round(&sel, x, dtype, d, index_dtype, hs->seed);
  if (q->rc == 0) q->rc = tide__gpu_sync(g, stream);
  int more = k > 0 && sel.emit_kind == TIDE__GPU_EXACT && hs->bad_index == TIDE__GPU_NONE && !hs->failed;
  if (q->rc == 0 && more && hs->digits < 3) {
    /* A collection that missed (sampled: the cut was too high or too
     * low; exact: the bucket too full for the list): the digits left,
     * over x. */
    for (unsigned p = hs->digits; p < 3; p++) hist_pass(&sel, TIDE__GPU_STAGE_MAG, 0);
    emit(&sel);
    if (q->rc == 0) q->rc = tide__gpu_sync(g, stream);
  }
  more = more && hs->bad_index == TIDE__GPU_NONE && !hs->failed;
  if (q->rc == 0 && more && hs->tie_needed) {
    /* Ties at the k-th key, more than are taken: the lowest indices among
     * them (three more passes). Rare in gradients; a second round keeps the
     * common case free of them. */
    for (int p = 0; p < 3; p++) hist_pass(&sel, TIDE__GPU_STAGE_TIE, p);
    sel.ties_done = 1;
    emit(&sel);
    if (q->rc == 0) q->rc = tide__gpu_sync(g, stream);
  }
  rc = q->rc;
  if (rc < 0) goto out;
  *hist_dirty = hs->failed != 0; /* a failed pass leaves its bins */
  if (hs->bad_index != TIDE__GPU_NONE) {
    *bad_index = (size_t)hs->bad_index;
    rc = TIDE__GPU_NONFINITE;
    goto out;
  }
  if (hs->failed || hs->written != k) {
    TIDE_ERROR("%s: internal error: %s selection of k = %zu of d = %zu wrote %llu pairs (failed %u): "
               "please report it",
               fn, tide_topk_name(kind), k, d, hs->written, hs->failed);
    rc = TIDE_EIO;
    goto out;
  }
  if (k > 0) memcpy(&st.threshold, &hs->min_taken, sizeof st.threshold);
  if (kind == TIDE_TOPK_MSTOPK && k > 0) {
    st.t1 = hs->k1 > 0 ? 0.0f : INFINITY;
    if (hs->k1 > 0) memcpy(&st.t1, &hs->key1, sizeof st.t1);
    memcpy(&st.t2, &hs->key2, sizeof st.t2);
  }
  st.full_passes = hs->full_passes;
  st.candidates = hs->candidates;
  st.fallback = (int)hs->fallback && kind == TIDE_TOPK_SAMPLED;
  st.threads = tide__gpu_blocks(g) * TIDE__GPU_THREADS;
  if (stats != NULL) *stats = st;
out:
  tide__gpu_unlock(g);
  return rc;
}

/* The message for a NaN/Inf: its index and what it is (read back). */
static int fail_nonfinite(const char *name, const void *x, tide_dtype_t dtype, size_t bad) {
  const char *what = "NaN or Inf";
  if (dtype == TIDE_F32) {
    float v = 0.0f;
    tide__gpu_t *g;
    if (tide__gpu_for_pointer("tide_gpu_topk_select", x, &g) == 0 &&
        tide__gpu_copy(g, &v, (const float *)x + bad, sizeof v, NULL) == 0 && tide__gpu_sync(g, NULL) == 0)
      what = isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
  }
  TIDE_ERROR("tide_gpu_topk_select: tensor \"%s\" element %zu is %s; nothing was written", name ? name : "tensor",
             bad, what);
  return TIDE_EINVAL;
}

int tide_gpu_topk_select(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const void *x, tide_dtype_t dtype,
                         size_t d, size_t k, const char *name, void *values, void *indices, tide_dtype_t index_dtype,
                         void *stream, tide_topk_stats_t *stats_or_null) {
  size_t bad = 0;
  int rc = tide__gpu_select(kind, opts, x, dtype, d, k, values, indices, index_dtype, stream, stats_or_null, &bad);
  if (rc == TIDE__GPU_NONFINITE) return fail_nonfinite(name, x, dtype, bad);
  return rc;
}

/* ---- error feedback ----------------------------------------------------------------------- */

struct tide__gpu_ef {
  tide__gpu_t *g;
  void *stream;
  size_t d;
  tide__cu_ptr_t residual, acc, grad, values, indices; /* grad: staging for a host gradient */
  size_t pairs;                                         /* entries values and indices hold */
};

int tide__gpu_ef_create(size_t d, void *stream, tide__gpu_ef_t **out) {
  tide__gpu_t *g;
  TIDE_CHECK(tide__gpu_for_pointer("tide_compressor_create_gpu", NULL, &g));
  tide__gpu_ef_t *ef = tide__calloc(1, sizeof *ef);
  if (ef == NULL) return TIDE_ENOMEM;
  ef->g = g;
  ef->stream = stream;
  ef->d = d;
  int rc = tide__gpu_alloc(g, d * sizeof(float), &ef->residual);
  if (rc == 0) rc = tide__gpu_alloc(g, d * sizeof(float), &ef->acc);
  if (rc == 0) rc = tide__gpu_memset32(g, ef->residual, 0, d, stream);
  if (rc == 0) rc = tide__gpu_sync(g, stream);
  if (rc < 0) {
    tide__gpu_ef_destroy(ef);
    return rc;
  }
  *out = ef;
  return 0;
}

void tide__gpu_ef_destroy(tide__gpu_ef_t *ef) {
  if (ef == NULL) return;
  tide__gpu_free(ef->g, ef->residual);
  tide__gpu_free(ef->g, ef->acc);
  tide__gpu_free(ef->g, ef->grad);
  tide__gpu_free(ef->g, ef->values);
  tide__gpu_free(ef->g, ef->indices);
  tide__free(ef);
}

const float *tide__gpu_ef_residual(const tide__gpu_ef_t *ef) {
  return ef != NULL ? (const float *)(uintptr_t)ef->residual : NULL;
}

int tide__gpu_ef_set_residual(tide__gpu_ef_t *ef, const float *residual) {
  TIDE_CHECK(tide__gpu_copy(ef->g, (void *)(uintptr_t)ef->residual, residual, ef->d * sizeof(float), ef->stream));
  return tide__gpu_sync(ef->g, ef->stream);
}

int tide__gpu_ef_reset(tide__gpu_ef_t *ef) {
  TIDE_CHECK(tide__gpu_memset32(ef->g, ef->residual, 0, ef->d, ef->stream));
  return tide__gpu_sync(ef->g, ef->stream);
}

int tide__gpu_ef_compress(tide__gpu_ef_t *ef, tide_topk_kind_t kind, const tide_topk_opts_t *opts,
                          const float *grad, size_t k, const char *name, float *values, uint32_t *indices,
                          size_t *bad_index) {
  (void)name;
  tide__gpu_t *g = ef->g;
  const size_t d = ef->d;
  if (k > ef->pairs) {
    tide__gpu_free(g, ef->values);
    tide__gpu_free(g, ef->indices);
    ef->values = ef->indices = 0;
    ef->pairs = 0;
    TIDE_CHECK(tide__gpu_alloc(g, k * sizeof(float), &ef->values));
    TIDE_CHECK(tide__gpu_alloc(g, k * sizeof(uint32_t), &ef->indices));
    ef->pairs = k;
  }
  const float *dgrad = grad;
  if (!tide__gpu_is_device_pointer(grad)) { /* a host gradient (HiTopKComm's shard): to the device first */
    if (ef->grad == 0) TIDE_CHECK(tide__gpu_alloc(g, d * sizeof(float), &ef->grad));
    TIDE_CHECK(tide__gpu_copy(g, (void *)(uintptr_t)ef->grad, grad, d * sizeof(float), ef->stream));
    dgrad = (const float *)(uintptr_t)ef->grad;
  }
  void *gp = (void *)dgrad, *rp = (void *)(uintptr_t)ef->residual, *ap = (void *)(uintptr_t)ef->acc;
  unsigned long long n = d;
  void *add_args[] = {&gp, &rp, &ap, &n};
  TIDE_CHECK(tide__gpu_launch(g, "tide_gpu_ef_add", GRID, ef->stream, add_args));
  void *dv = (void *)(uintptr_t)ef->values, *di = (void *)(uintptr_t)ef->indices;
  int rc = tide__gpu_select(kind, opts, ap, TIDE_F32, d, k, dv, di, TIDE_I32, ef->stream, NULL, bad_index);
  if (rc != 0) return rc; /* the residual is as it was: acc was a buffer of its own */
  /* acc becomes the residual, less what was sent. */
  tide__cu_ptr_t t = ef->residual;
  ef->residual = ef->acc;
  ef->acc = t;
  rp = (void *)(uintptr_t)ef->residual;
  unsigned long long kk = k;
  void *zero_args[] = {&rp, &di, &kk};
  TIDE_CHECK(tide__gpu_launch(g, "tide_gpu_ef_zero", GRID, ef->stream, zero_args));
  TIDE_CHECK(tide__gpu_copy(g, values, dv, k * sizeof(float), ef->stream));
  TIDE_CHECK(tide__gpu_copy(g, indices, di, k * sizeof(uint32_t), ef->stream));
  return tide__gpu_sync(g, ef->stream);
}
