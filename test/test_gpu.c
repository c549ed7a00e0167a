/* GPU top-k (src/gpu): `test_gpu compile` compiles the kernels with NVRTC
 * for two architectures (no GPU needed; 77 without NVRTC). `test_gpu`
 * runs them (77 without a GPU, after checking that every entry point then
 * says TIDE_ENOSYS): exact and sampled against the CPU's exact selector as
 * sets, on normal, heavy-tailed, tied, zero and spiky inputs, f32, f16 and
 * bf16, int32 and int64 indices, k = 0, 1, d; MSTopK's guarantees (exactly
 * k distinct, everything >= t1 kept, nothing below t2) and its agreement
 * with the CPU's MSTopK; NaN/Inf refused with nothing written; the GPU
 * compressor against the CPU compressor over several steps, residual bit
 * for bit. scripts/gpu-check.sh runs it on a GPU machine. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"
#include "gpu/gpu.h"
#include "harness.h"

int tide__gpu_compile(const char *arch, char **image, size_t *size);

static uint64_t rng;
static double uniform01(void) { return ((double)(tide__splitmix64(&rng) >> 11) + 0.5) / 9007199254740992.0; }
static double normal(void) { return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()); }

typedef enum { D_NORMAL, D_HEAVY, D_TIES, D_ZERO, D_SPIKES, D_COUNT } dist_t;
static const char *const dist_names[D_COUNT] = {"normal", "heavy", "ties", "zero", "spikes"};

static void fill(float *x, size_t d, dist_t dist, uint64_t seed) {
  rng = seed * 7919 + (uint64_t)dist;
  for (size_t i = 0; i < d; i++) {
    switch (dist) {
      case D_NORMAL: x[i] = (float)(0.01 * normal()); break;
      case D_HEAVY: x[i] = (float)tan(3.141592653589793 * (uniform01() - 0.5)); break;
      case D_TIES: x[i] = (float)((int)(uniform01() * 5) - 2) * 0.5f; break;
      case D_ZERO: x[i] = i % 7 == 0 ? (float)normal() : (i % 2 ? -0.0f : 0.0f); break;
      default: x[i] = i % 1000 == 17 ? (float)(100.0 * normal()) : (float)(1e-3 * normal()); break;
    }
  }
}

/* f32 -> f16 / bf16 bits (round to nearest even), and back. */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t to_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static float from_f16(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

static tide__gpu_t *gpu;
static void *dev_alloc(size_t bytes) {
  tide__cu_ptr_t p;
  CHECK_OK(tide__gpu_alloc(gpu, bytes, &p));
  return (void *)(uintptr_t)p;
}
static void to_dev(void *dst, const void *src, size_t bytes) {
  CHECK_OK(tide__gpu_copy(gpu, dst, src, bytes, NULL));
  CHECK_OK(tide__gpu_sync(gpu, NULL));
}
static void to_host(void *dst, const void *src, size_t bytes) { to_dev(dst, src, bytes); }
static void dev_free(void *p) { tide__gpu_free(gpu, (tide__cu_ptr_t)(uintptr_t)p); }

static int by_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int by_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Runs one GPU selection of x (host copy xf as floats for the checks) and
 * returns the sorted indices (malloc'd) after checking values match x. */
static uint32_t *gpu_select(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const void *xh, const float *xf,
                            tide_dtype_t dtype, size_t d, size_t k, tide_dtype_t index_dtype,
                            tide_topk_stats_t *stats) {
  size_t esize = dtype == TIDE_F32 ? 4 : 2, isize = index_dtype == TIDE_I64 ? 8 : 4;
  void *xd = dev_alloc(d * esize), *vd = dev_alloc((k + 1) * esize), *id = dev_alloc((k + 1) * isize);
  to_dev(xd, xh, d * esize);
  CHECK_OK(tide_gpu_topk_select(kind, opts, xd, dtype, d, k, "x", vd, id, index_dtype, NULL, stats));
  unsigned char *vals = malloc((k + 1) * esize), *idx = malloc((k + 1) * isize);
  to_host(vals, vd, k * esize);
  to_host(idx, id, k * isize);
  uint32_t *out = malloc((k + 1) * sizeof *out);
  for (size_t j = 0; j < k; j++) {
    uint64_t i = index_dtype == TIDE_I64 ? (uint64_t)((int64_t *)idx)[j] : ((uint32_t *)idx)[j];
    CHECK(i < d);
    out[j] = (uint32_t)i;
    float v = dtype == TIDE_F32 ? ((float *)vals)[j]
                                : dtype == TIDE_F16 ? from_f16(((uint16_t *)vals)[j]) : from_bf16(((uint16_t *)vals)[j]);
    if (!(v == xf[i] || (isnan(v) && isnan(xf[i])))) {
      fprintf(stderr, "value %g at pair %zu for index %llu, x there is %g\n", (double)v, j, (unsigned long long)i,
              (double)xf[i]);
      CHECK(0);
    }
  }
  qsort(out, k, sizeof *out, by_u32);
  for (size_t j = 1; j < k; j++) CHECK(out[j] > out[j - 1]); /* distinct */
  free(vals);
  free(idx);
  dev_free(xd);
  dev_free(vd);
  dev_free(id);
  return out;
}

static void check_exact(tide_topk_kind_t kind, const float *xf, const void *xh, tide_dtype_t dtype, size_t d,
                        size_t k, tide_dtype_t index_dtype, const char *what) {
  float *rv = malloc((k + 1) * sizeof *rv);
  uint32_t *ri = malloc((k + 1) * sizeof *ri);
  CHECK_OK(tide_topk_select(TIDE_TOPK_EXACT, xf, d, k, "x", rv, ri, NULL));
  tide_topk_stats_t st;
  uint32_t *gi = gpu_select(kind, NULL, xh, xf, dtype, d, k, index_dtype, &st);
  if (d >= (1u << 20) && k * 100 <= d && strncmp(what, "normal", 6) == 0) {
    /* The fast paths are taken: sampled reads x once (its cut holds),
     * exact twice (the k-th key's bucket and above fit the list). */
    if (st.full_passes != (kind == TIDE_TOPK_SAMPLED ? 1 : 2) || st.fallback) {
      fprintf(stderr, "%s %s d=%zu k=%zu: %u full passes, fallback %d\n", tide_topk_name(kind), what, d, k,
              st.full_passes, st.fallback);
      CHECK(0);
    }
  }
  for (size_t j = 0; j < k; j++) {
    if (gi[j] != ri[j]) {
      fprintf(stderr, "%s %s d=%zu k=%zu: pair %zu: GPU index %u, CPU index %u\n", tide_topk_name(kind), what, d, k, j,
              gi[j], ri[j]);
      CHECK(0);
    }
  }
  free(rv);
  free(ri);
  free(gi);
}

static void test_selectors(void) {
  const size_t sizes[] = {1, 1000, 4099, 100003, 1u << 20, 3000007};
  const double densities[] = {0.0001, 0.001, 0.01, 0.1};
  int cases = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t d = sizes[s];
    float *x = malloc(d * sizeof *x), *xf = malloc(d * sizeof *xf);
    uint16_t *h = malloc(d * sizeof *h);
    for (int dist = 0; dist < D_COUNT; dist++) {
      fill(x, d, (dist_t)dist, d);
      for (size_t q = 0; q < sizeof densities / sizeof *densities + 2; q++) {
        size_t k = q < 4 ? tide_topk_count(densities[q], d) : q == 4 ? 1 : d;
        if (k == 0) k = 1;
        if (k == d && d > 200000) continue; /* the CPU reference's qsort of everything is slow */
        char what[64];
        snprintf(what, sizeof what, "%s f32", dist_names[dist]);
        check_exact(TIDE_TOPK_EXACT, x, x, TIDE_F32, d, k, TIDE_I32, what);
        check_exact(TIDE_TOPK_SAMPLED, x, x, TIDE_F32, d, k, TIDE_I64, what);
        cases += 2;
        if (q == 1 || q == 2) { /* the 16-bit inputs at two densities */
          for (size_t i = 0; i < d; i++) h[i] = to_bf16(x[i]), xf[i] = from_bf16(h[i]);
          snprintf(what, sizeof what, "%s bf16", dist_names[dist]);
          check_exact(TIDE_TOPK_SAMPLED, xf, h, TIDE_BF16, d, k, TIDE_I32, what);
          for (size_t i = 0; i < d; i++) h[i] = to_f16(fmaxf(fminf(x[i], 6e4f), -6e4f)), xf[i] = from_f16(h[i]);
          snprintf(what, sizeof what, "%s f16", dist_names[dist]);
          check_exact(TIDE_TOPK_EXACT, xf, h, TIDE_F16, d, k, TIDE_I64, what);
          cases += 2;
        }
      }
    }
    free(x);
    free(xf);
    free(h);
  }
  printf("exact and sampled: %d cases identical to the CPU's exact selection\n", cases);
}

/* MSTopK's guarantees, and how often its set equals the CPU MSTopK's. */
static void test_mstopk(void) {
  const size_t sizes[] = {1000, 100003, 1u << 20, 3000007};
  const double densities[] = {0.001, 0.01, 0.1};
  int cases = 0, same = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    size_t d = sizes[s];
    float *x = malloc(d * sizeof *x);
    for (int dist = 0; dist < D_COUNT; dist++) {
      fill(x, d, (dist_t)dist, d + 1);
      for (size_t q = 0; q < 3; q++) {
        size_t k = tide_topk_count(densities[q], d);
        tide_topk_opts_t opts = {.seed = 42 + q, .mstopk_rounds = q == 2 ? 8 : 20};
        tide_topk_stats_t st;
        uint32_t *gi = gpu_select(TIDE_TOPK_MSTOPK, &opts, x, x, TIDE_F32, d, k, TIDE_I32, &st);
        char *taken = calloc(d, 1);
        for (size_t j = 0; j < k; j++) taken[gi[j]] = 1;
        for (size_t i = 0; i < d; i++) {
          float a = fabsf(x[i]);
          if (a >= st.t1 && !taken[i]) {
            fprintf(stderr, "mstopk %s d=%zu k=%zu: |x[%zu]| = %g >= t1 = %g not taken\n", dist_names[dist], d, k,
                    i, (double)a, (double)st.t1);
            CHECK(0);
          }
          if (taken[i] && a < st.t2) {
            fprintf(stderr, "mstopk %s d=%zu k=%zu: |x[%zu]| = %g < t2 = %g taken\n", dist_names[dist], d, k, i,
                    (double)a, (double)st.t2);
            CHECK(0);
          }
        }
        float *cv = malloc(k * sizeof *cv);
        uint32_t *ci = malloc(k * sizeof *ci);
        CHECK_OK(tide_topk_select_opts(TIDE_TOPK_MSTOPK, &opts, x, d, k, "x", cv, ci, NULL));
        same += memcmp(ci, gi, k * sizeof *ci) == 0; /* both ascending */
        cases++;
        free(cv);
        free(ci);
        free(taken);
        free(gi);
      }
    }
    free(x);
  }
  printf("mstopk: %d cases keep the bracket; %d of them the CPU's MSTopK set exactly\n", cases, same);
  CHECK(same * 10 >= cases * 8); /* the mean's summation order may move a probe by an ulp */
}

/* A selection repeated with the same buffers runs one by one, then is
 * captured as a graph, then replays it (TIDE_GPU_GRAPHS): each call's
 * pairs follow x's contents of that call. Two contents alternate, so a
 * replay is compared bit for bit with the first, eager call on the same
 * contents, and exact and sampled with the CPU's exact selection too. */
static void test_graphs(void) {
  const size_t sizes[] = {100003, 1u << 20};
  const tide_topk_kind_t kinds[] = {TIDE_TOPK_EXACT, TIDE_TOPK_SAMPLED, TIDE_TOPK_MSTOPK};
  int calls = 0;
  for (size_t s = 0; s < 2; s++) {
    size_t d = sizes[s], k = tide_topk_count(0.001, d);
    float *x[2] = {malloc(d * 4), malloc(d * 4)};
    fill(x[0], d, D_NORMAL, 71);
    fill(x[1], d, D_NORMAL, 72);
    uint32_t *ref[2] = {malloc(k * 4), malloc(k * 4)};
    float *rv = malloc(k * 4);
    for (int c = 0; c < 2; c++) {
      CHECK_OK(tide_topk_select(TIDE_TOPK_EXACT, x[c], d, k, "x", rv, ref[c], NULL));
      qsort(ref[c], k, 4, by_u32);
    }
    void *xd = dev_alloc(d * 4), *vd = dev_alloc(k * 4), *id = dev_alloc(k * 4);
    for (int q = 0; q < 3; q++) {
      tide_topk_opts_t opts = {.seed = 9};
      uint32_t *first[2] = {malloc(k * 4), malloc(k * 4)}, *got = malloc(k * 4);
      float *vals = malloc(k * 4);
      for (int call = 0; call < 6; call++) {
        int c = call % 2;
        to_dev(xd, x[c], d * 4);
        CHECK_OK(tide_gpu_topk_select(kinds[q], &opts, xd, TIDE_F32, d, k, "x", vd, id, TIDE_I32, NULL, NULL));
        to_host(got, id, k * 4);
        to_host(vals, vd, k * 4);
        for (size_t j = 0; j < k; j++) CHECK(got[j] < d && vals[j] == x[c][got[j]]);
        qsort(got, k, 4, by_u32); /* the pairs' order is the device's */
        if (call < 2) memcpy(first[c], got, k * 4);
        if (memcmp(got, first[c], k * 4) != 0) {
          fprintf(stderr, "%s d=%zu call %d: pairs differ from call %d's on the same x\n", tide_topk_name(kinds[q]),
                  d, call, c);
          CHECK(0);
        }
        if (kinds[q] != TIDE_TOPK_MSTOPK) CHECK(memcmp(got, ref[c], k * 4) == 0);
        calls++;
      }
      free(first[0]);
      free(first[1]);
      free(got);
      free(vals);
    }
    dev_free(xd);
    dev_free(vd);
    dev_free(id);
    free(x[0]);
    free(x[1]);
    free(ref[0]);
    free(ref[1]);
    free(rv);
  }
  const char *graphs = getenv("TIDE_GPU_GRAPHS");
  printf("repeated selections (graphs %s): %d calls follow x's contents\n",
         graphs != NULL && strcmp(graphs, "0") == 0 ? "off" : "on", calls);
}

static void test_nonfinite(void) {
  size_t d = 200003, k = 100;
  float *x = malloc(d * sizeof *x);
  fill(x, d, D_NORMAL, 5);
  const float bad[] = {NAN, INFINITY, -INFINITY};
  const tide_topk_kind_t kinds[] = {TIDE_TOPK_EXACT, TIDE_TOPK_SAMPLED, TIDE_TOPK_MSTOPK};
  void *xd = dev_alloc(d * 4), *vd = dev_alloc(k * 4), *id = dev_alloc(k * 4);
  for (int b = 0; b < 3; b++) {
    for (int q = 0; q < 3; q++) {
      size_t at = 1000 + 77 * (size_t)b;
      float keep = x[at];
      x[at] = bad[b];
      to_dev(xd, x, d * 4);
      x[at] = keep;
      CHECK_OK(tide__gpu_memset32(gpu, (tide__cu_ptr_t)(uintptr_t)vd, 0x12345678u, k, NULL));
      CHECK_RC(tide_gpu_topk_select(kinds[q], NULL, xd, TIDE_F32, d, k, "grad", vd, id, TIDE_I32, NULL, NULL),
               TIDE_EINVAL);
      uint32_t *v = malloc(k * 4);
      to_host(v, vd, k * 4);
      for (size_t j = 0; j < k; j++) CHECK(v[j] == 0x12345678u); /* nothing written */
      free(v);
    }
  }
  /* k = 0 still checks x. */
  x[5] = NAN;
  to_dev(xd, x, d * 4);
  CHECK_RC(tide_gpu_topk_select(TIDE_TOPK_EXACT, NULL, xd, TIDE_F32, d, 0, "grad", vd, id, TIDE_I32, NULL, NULL),
           TIDE_EINVAL);
  /* Arguments. */
  CHECK_RC(tide_gpu_topk_select(TIDE_TOPK_RANDOMK, NULL, xd, TIDE_F32, d, k, "x", vd, id, TIDE_I32, NULL, NULL),
           TIDE_EINVAL);
  CHECK_RC(tide_gpu_topk_select(TIDE_TOPK_EXACT, NULL, x, TIDE_F32, d, k, "x", vd, id, TIDE_I32, NULL, NULL),
           TIDE_EINVAL); /* host memory */
  CHECK_RC(tide_gpu_topk_select(TIDE_TOPK_EXACT, NULL, xd, TIDE_F32, d, d + 1, "x", vd, id, TIDE_I32, NULL, NULL),
           TIDE_EINVAL);
  CHECK_RC(tide_gpu_topk_select(TIDE_TOPK_EXACT, NULL, xd, TIDE_F64, d, k, "x", vd, id, TIDE_I32, NULL, NULL),
           TIDE_EINVAL);
  dev_free(xd);
  dev_free(vd);
  dev_free(id);
  free(x);
  printf("NaN/Inf refused with nothing written; bad arguments refused\n");
}

/* The GPU compressor against the CPU's, step by step, with the gradient on
 * the device and on the host. */
static void test_compressor(void) {
  size_t d = 1000003;
  const tide_topk_kind_t kinds[] = {TIDE_TOPK_EXACT, TIDE_TOPK_SAMPLED};
  for (int q = 0; q < 2; q++) {
    tide_compressor_t *cpu, *gc;
    CHECK_OK(tide_compressor_create(TIDE_TOPK_EXACT, 0.01, TIDE_TOPK_GLOBAL, NULL, 0, d, NULL, &cpu));
    CHECK_OK(tide_compressor_create_gpu(kinds[q], 0.01, d, NULL, NULL, &gc));
    size_t k = tide_compressor_k(cpu);
    CHECK(tide_compressor_k(gc) == k);
    float *grad = malloc(d * 4), *cv = malloc(k * 4), *gv = malloc(k * 4), *cr = malloc(d * 4), *gr = malloc(d * 4);
    uint32_t *ci = malloc(k * 4), *gi = malloc(k * 4);
    float *gd = dev_alloc(d * 4);
    for (int step = 0; step < 6; step++) { /* two buffers: eager, captured, replayed */
      fill(grad, d, step % 2 ? D_NORMAL : D_SPIKES, 100 + (uint64_t)step);
      size_t kc, kg;
      CHECK_OK(tide_compressor_compress(cpu, grad, d, cv, ci, &kc));
      const float *src = grad;
      if (step % 2) {
        to_dev(gd, grad, d * 4);
        src = gd;
      }
      CHECK_OK(tide_compressor_compress(gc, src, d, gv, gi, &kg));
      CHECK(kc == k && kg == k);
      /* Sort the GPU's pairs by index to compare. */
      uint64_t *pair = malloc(k * 8);
      for (size_t j = 0; j < k; j++) {
        uint32_t vb;
        memcpy(&vb, &gv[j], 4);
        pair[j] = ((uint64_t)gi[j] << 32) | vb;
      }
      qsort(pair, k, 8, by_u64); /* by index (the high word) */
      for (size_t j = 0; j < k; j++) {
        uint32_t vb = (uint32_t)pair[j];
        float v;
        memcpy(&v, &vb, 4);
        CHECK((uint32_t)(pair[j] >> 32) == ci[j]);
        CHECK(memcmp(&v, &cv[j], 4) == 0);
      }
      free(pair);
      to_host(gr, tide_compressor_residual(gc), d * 4);
      memcpy(cr, tide_compressor_residual(cpu), d * 4);
      CHECK(memcmp(gr, cr, d * 4) == 0);
    }
    /* A NaN leaves the residual as it was. */
    grad[12345] = NAN;
    size_t kg;
    CHECK_RC(tide_compressor_compress(gc, grad, d, gv, gi, &kg), TIDE_EINVAL);
    to_host(gr, tide_compressor_residual(gc), d * 4);
    CHECK(memcmp(gr, cr, d * 4) == 0);
    CHECK_OK(tide_compressor_reset(gc));
    to_host(gr, tide_compressor_residual(gc), d * 4);
    for (size_t i = 0; i < d; i++) CHECK(gr[i] == 0.0f);
    dev_free(gd);
    free(grad);
    free(cv);
    free(gv);
    free(cr);
    free(gr);
    free(ci);
    free(gi);
    tide_compressor_destroy(cpu);
    tide_compressor_destroy(gc);
  }
  printf("GPU compressor: pairs and residual identical to the CPU's over 6 steps\n");
}

static int compile_check(void) {
  char *image = NULL;
  size_t size = 0;
  int rc = tide__gpu_compile("sm_80", &image, &size);
  if (rc == TIDE_ENOSYS) {
    printf("skipped: %s\n", tide__gpu_last_error());
    return 77;
  }
  if (rc != 0) {
    fprintf(stderr, "%s\n", tide__gpu_last_error());
    return 1;
  }
  printf("select.cu compiles for sm_80 (%zu bytes of CUBIN)\n", size);
  tide__free(image);
  CHECK_OK(tide__gpu_compile("sm_90", &image, &size));
  printf("select.cu compiles for sm_90 (%zu bytes of CUBIN)\n", size);
  tide__free(image);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "compile") == 0) return compile_check();
  char why[256];
  if (!tide_gpu_available(why, sizeof why)) {
    float x[4] = {1, 2, 3, 4};
    tide_compressor_t *c = NULL;
    CHECK_RC(tide_gpu_topk_select(TIDE_TOPK_EXACT, NULL, x, TIDE_F32, 4, 1, "x", x, x, TIDE_I32, NULL, NULL),
             TIDE_ENOSYS);
    CHECK_RC(tide_compressor_create_gpu(TIDE_TOPK_EXACT, 0.5, 4, NULL, NULL, &c), TIDE_ENOSYS);
    CHECK(c == NULL);
    printf("skipped: no GPU (%s); the GPU calls answer TIDE_ENOSYS\n", why);
    return 77;
  }
  CHECK_OK(tide__gpu_for_pointer("test_gpu", NULL, &gpu));
  char name[256];
  CHECK_OK(tide_gpu_device_name(name, sizeof name));
  printf("device: %s\n", name);
  test_nonfinite();
  test_selectors();
  test_mstopk();
  test_graphs();
  test_compressor();
  printf("test_gpu: all passed\n");
  return 0;
}
