/* Top-k selectors and error feedback: every selector against its scalar
 * reference (exact and sampled against the sorted reference, MSTopK against
 * the N-pass transcription, random-k against the plain draw) on random,
 * heavy-tailed, tied, all-zero and tiny inputs with k = 0 and k = d; the
 * squared mass MSTopK captures on gradient-like data; NaN/Inf rejected with
 * the tensor's name; argument errors; TIDE_NUM_THREADS; the compressor's
 * residual identity, bit for bit, over several steps. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compress/compress.h"
#include "harness.h"

/* ---- inputs ------------------------------------------------------------------------------ */

typedef enum { D_NORMAL, D_LAPLACE, D_MIXED, D_HEAVY, D_TIES, D_ZERO, D_SPIKES, D_COUNT } dist_t;
static const char *const dist_names[D_COUNT] = {"normal", "laplace", "mixed", "heavy",
                                                "ties",   "zero",    "spikes"};

static uint64_t rng_state;
static double uniform01(void) { /* (0, 1) */
  return ((double)(tide__splitmix64(&rng_state) >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) {
  return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01());
}

/* Gradient-like and adversarial inputs. */
static void fill(float *x, size_t d, dist_t dist, uint64_t seed) {
  rng_state = seed * 7919 + dist;
  double scale = 1.0;
  for (size_t i = 0; i < d; i++) {
    switch (dist) {
      case D_NORMAL:
        x[i] = (float)(0.01 * normal());
        break;
      case D_LAPLACE: {
        double u = uniform01() - 0.5;
        x[i] = (float)(-0.01 * (u < 0 ? -1 : 1) * log(1 - 2 * fabs(u) + 1e-300));
        break;
      }
      case D_MIXED: /* "layers" of 1000 elements, scales over three decades */
        if (i % 1000 == 0) scale = pow(10.0, -3.0 * uniform01());
        x[i] = (float)(scale * (i % 3000 < 2000 ? normal() : normal() * normal()));
        break;
      case D_HEAVY: /* Cauchy */
        x[i] = (float)tan(3.141592653589793 * (uniform01() - 0.5));
        break;
      case D_TIES: /* five values, both zeros */
        x[i] = (float)((int)(uniform01() * 5) - 2) * 0.5f;
        if (x[i] == 0 && uniform01() < 0.5) x[i] = -0.0f;
        break;
      case D_ZERO:
        x[i] = (i % 3 == 0) ? -0.0f : 0.0f;
        break;
      case D_SPIKES: /* small noise plus a few far-out values: unambiguous threshold */
        x[i] = (float)(0.001 * normal());
        break;
      default:
        break;
    }
  }
  if (dist == D_SPIKES)
    for (size_t i = 0; i < d; i += 997) x[i] = (float)((i % 2 ? -1 : 1) * (10.0 + uniform01()));
}

/* ---- checks ------------------------------------------------------------------------------- */

static void check_pairs(const char *what, const float *x, size_t k, const float *values,
                        const uint32_t *indices, size_t d) {
  for (size_t j = 0; j < k; j++) {
    if (indices[j] >= d || (j > 0 && indices[j] <= indices[j - 1]) ||
        memcmp(&values[j], &x[indices[j]], sizeof(float)) != 0) {
      fprintf(stderr, "%s: pair %zu (index %u, value %g) is wrong (d %zu, k %zu)\n", what, j,
              indices[j], (double)values[j], d, k);
      exit(1);
    }
  }
}

static void check_same(const char *what, size_t k, const float *v1, const uint32_t *i1,
                       const float *v2, const uint32_t *i2) {
  for (size_t j = 0; j < k; j++) {
    if (i1[j] != i2[j] || memcmp(&v1[j], &v2[j], sizeof(float)) != 0) {
      fprintf(stderr, "%s: pair %zu differs from the reference: (%u, %g) vs (%u, %g), k %zu\n",
              what, j, i1[j], (double)v1[j], i2[j], (double)v2[j], k);
      exit(1);
    }
  }
}

static double mass(const float *values, size_t k) {
  double s = 0;
  for (size_t j = 0; j < k; j++) s += (double)values[j] * values[j];
  return s;
}

typedef struct {
  float *v, *rv;
  uint32_t *i, *ri;
} outbuf_t;

static outbuf_t out_alloc(size_t k) {
  size_t n = k > 0 ? k : 1;
  outbuf_t o = {malloc(n * sizeof(float)), malloc(n * sizeof(float)), malloc(n * 4),
                malloc(n * 4)};
  CHECK(o.v && o.rv && o.i && o.ri);
  return o;
}
static void out_free(outbuf_t *o) {
  free(o->v);
  free(o->rv);
  free(o->i);
  free(o->ri);
}

/* ---- 1. selectors against their references ------------------------------------------ */

static int threads_of(int variant) { return variant == 0 ? 1 : variant == 1 ? 2 : 3; }

/* One selection of every kind on x, each against its reference. */
/* The exact top k from a reference ranking (tide__topk_ref_rank): its first
 * k indices, in index order. On small inputs also checked against
 * tide__topk_ref_exact, which sorts anew for every k. */
static void exact_from_rank(const float *x, size_t d, size_t k, const uint32_t *order,
                            float *values, uint32_t *indices) {
  unsigned char *mark = calloc(d, 1);
  CHECK(mark != NULL);
  for (size_t j = 0; j < k; j++) mark[order[j]] = 1;
  size_t n = 0;
  for (size_t i = 0; i < d; i++) {
    if (mark[i]) {
      values[n] = x[i];
      indices[n++] = (uint32_t)i;
    }
  }
  CHECK(n == k);
  free(mark);
  if (d <= 5000) {
    outbuf_t o = out_alloc(k);
    size_t bad;
    CHECK_OK(tide__topk_ref_exact(x, d, k, o.rv, o.ri, &bad));
    check_same("tide__topk_ref_exact", k, o.rv, o.ri, values, indices);
    out_free(&o);
  }
}

static void compare_all(const char *label, const float *x, size_t d, size_t k,
                        const uint32_t *order, int nthreads, uint64_t seed) {
  char what[160];
  outbuf_t o = out_alloc(k);
  size_t bad = 0;
  tide_topk_opts_t opts = {.seed = seed, .num_threads = nthreads};
  tide_topk_stats_t st;

  exact_from_rank(x, d, k, order, o.rv, o.ri);
  for (int kind = TIDE_TOPK_EXACT; kind <= TIDE_TOPK_SAMPLED; kind += TIDE_TOPK_SAMPLED) {
    snprintf(what, sizeof what, "%s %s d=%zu k=%zu threads=%d", tide_topk_name(kind), label, d,
             k, nthreads);
    memset(o.v, 0xff, (k > 0 ? k : 1) * sizeof(float));
    CHECK_OK(tide_topk_select_opts(kind, &opts, x, d, k, "t", o.v, o.i, &st));
    check_pairs(what, x, k, o.v, o.i, d);
    check_same(what, k, o.v, o.i, o.rv, o.ri);
    if (k > 0 && k < d) {
      float kth = o.rv[0] < 0 ? -o.rv[0] : o.rv[0];
      for (size_t j = 1; j < k; j++) kth = fminf(kth, fabsf(o.rv[j]));
      CHECK(st.threshold == kth);
    }
  }
  double exact_mass = mass(o.rv, k);

  /* N = 20 (GradCompressionUtility's) and, on small inputs, 25 (ARTopk's). */
  for (int rounds = 20; rounds <= (d < 65536 ? 25 : 20); rounds += 5) {
    opts.mstopk_rounds = rounds;
    snprintf(what, sizeof what, "mstopk(N=%d) %s d=%zu k=%zu threads=%d", rounds, label, d, k,
             nthreads);
    CHECK_OK(tide__topk_ref_mstopk(x, d, k, rounds, seed, o.rv, o.ri, &bad));
    CHECK_OK(tide_topk_select_opts(TIDE_TOPK_MSTOPK, &opts, x, d, k, "t", o.v, o.i, &st));
    check_pairs(what, x, k, o.v, o.i, d);
    check_same(what, k, o.v, o.i, o.rv, o.ri);
    CHECK(mass(o.v, k) <= exact_mass * (1 + 1e-12));
  }

  snprintf(what, sizeof what, "randomk %s d=%zu k=%zu threads=%d", label, d, k, nthreads);
  CHECK_OK(tide__topk_ref_randomk(x, d, k, seed, o.rv, o.ri, &bad));
  CHECK_OK(tide_topk_select_opts(TIDE_TOPK_RANDOMK, &opts, x, d, k, "t", o.v, o.i, &st));
  check_pairs(what, x, k, o.v, o.i, d);
  check_same(what, k, o.v, o.i, o.rv, o.ri);
  out_free(&o);
}

static void test_against_references(void) {
  /* Tiny, around the small-input and sampling cut-overs, and multi-chunk. */
  static const size_t sizes[] = {1, 2, 3, 7, 64, 65, 1000, 4096, 4097, 65536, 70001, 140000};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t d = sizes[s];
    float *x = malloc(d * sizeof *x);
    uint32_t *order = malloc(d * sizeof *order);
    CHECK(x != NULL && order != NULL);
    for (int dist = 0; dist < D_COUNT; dist++) {
      fill(x, d, (dist_t)dist, 11 + s);
      CHECK_OK(tide__topk_ref_rank(x, d, order));
      size_t ks[] = {0, 1, 2, d / 1000, d / 100, d / 10, d / 2, d - 1, d};
      for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
        size_t k = ks[j] > d ? d : ks[j];
        if (j > 0 && ks[j] == ks[j - 1]) continue;
        /* Large inputs: the interesting k only (k = 0 and k = d take the
         * same path at any d). */
        if (d >= 65536 && (k == 0 || k == 2 || k == d / 100 || k == d)) continue;
        compare_all(dist_names[dist], x, d, k, order, threads_of((int)(s + j) % 3), 5 + j);
      }
    }
    free(x);
    free(order);
  }
}

/* Large enough for two and three threads' chunks (TIDE__GRAIN each), and
 * for the sampled selector's full sample. */
static void test_large(void) {
  size_t d = 1600000;
  float *x = malloc(d * sizeof *x);
  uint32_t *order = malloc(d * sizeof *order);
  CHECK(x != NULL && order != NULL);
  static const dist_t dists[] = {D_NORMAL, D_MIXED, D_TIES, D_ZERO};
  for (size_t i = 0; i < sizeof dists / sizeof dists[0]; i++) {
    fill(x, d, dists[i], 3);
    CHECK_OK(tide__topk_ref_rank(x, d, order));
    size_t k = i % 2 ? d / 100 : d / 1000;
    compare_all(dist_names[dists[i]], x, d, k, order, i % 2 ? 3 : 2, 42);
    if (i == 0) /* many candidates */
      compare_all(dist_names[dists[i]], x, d, d / 10, order, 2, 42);
  }
  free(x);
  free(order);

  /* An input that fools the sample: for d = 2^20 the sampled runs are
   * exactly the elements with i % 256 < 16 (4096 runs of 16, 256 apart).
   * They hold the large values, so the cut lands above the true k-th
   * magnitude, the collection pass counts fewer than k, and the selector
   * must fall back to exact selection, with the same result. */
  d = (size_t)1 << 20;
  x = malloc(d * sizeof *x);
  order = malloc(d * sizeof *order);
  CHECK(x != NULL && order != NULL);
  fill(x, d, D_NORMAL, 8);
  for (size_t i = 0; i < d; i++)
    x[i] = i % 256 < 16 ? 1.0f + (float)(i % 1000) / 1000.0f : x[i] * 0.01f;
  CHECK_OK(tide__topk_ref_rank(x, d, order));
  size_t k = d / 10;
  outbuf_t o = out_alloc(k);
  tide_topk_stats_t st;
  exact_from_rank(x, d, k, order, o.rv, o.ri);
  CHECK_OK(tide_topk_select(TIDE_TOPK_SAMPLED, x, d, k, "fooled", o.v, o.i, &st));
  check_same("sampled, fooled sample", k, o.v, o.i, o.rv, o.ri);
  CHECK(st.fallback == 1);
  out_free(&o);
  free(x);
  free(order);
}

/* So many candidates that the work on them is split between threads too
 * (TIDE__CAND_GRAIN): one thread and two give the same pairs, and the
 * one-thread result is checked against the references above. */
static void test_threads_agree(void) {
  size_t d = 10000000, k = d * 45 / 100;
  float *x = malloc(d * sizeof *x);
  outbuf_t o = out_alloc(k);
  CHECK(x != NULL);
  fill(x, d, D_NORMAL, 21);
  for (int kind = 0; kind < TIDE_TOPK_KIND_COUNT; kind++) {
    if (kind == TIDE_TOPK_RANDOMK) continue;
    tide_topk_opts_t one = {.seed = 3, .num_threads = 1}, two = {.seed = 3, .num_threads = 2};
    tide_topk_stats_t st1, st2;
    CHECK_OK(tide_topk_select_opts((tide_topk_kind_t)kind, &one, x, d, k, "t", o.rv, o.ri, &st1));
    CHECK_OK(tide_topk_select_opts((tide_topk_kind_t)kind, &two, x, d, k, "t", o.v, o.i, &st2));
    CHECK(st1.threads == 1 && st2.threads == 2);
    CHECK(st2.candidates >= TIDE__CAND_GRAIN);
    check_same(tide_topk_name(kind), k, o.v, o.i, o.rv, o.ri);
  }
  out_free(&o);
  free(x);
}

/* Selections on several threads at once: each thread keeps its own
 * scratch between its calls (freed when it exits; ASan checks that), and a
 * selection repeated on a thread that reuses it gives the same pairs. */
typedef struct {
  const float *x;
  size_t d;
  int failed;
} worker_arg_t;

static void *selection_worker(void *p) {
  worker_arg_t *a = p;
  for (int round = 0; round < 6; round++) {
    size_t k = a->d / (round % 2 ? 10 : 1000) + (size_t)round;
    outbuf_t o = out_alloc(k);
    for (int kind = 0; kind < TIDE_TOPK_KIND_COUNT; kind++) {
      tide_topk_opts_t one = {.seed = 9, .num_threads = 1};
      if (tide_topk_select_opts((tide_topk_kind_t)kind, &one, a->x, a->d, k, "w", o.rv, o.ri, NULL) ||
          tide_topk_select_opts((tide_topk_kind_t)kind, &one, a->x, a->d, k, "w", o.v, o.i, NULL) ||
          memcmp(o.i, o.ri, k * 4) != 0)
        a->failed = 1;
    }
    out_free(&o);
  }
  return NULL;
}

static void test_concurrent(void) {
  size_t d = 300000;
  float *x = malloc(d * sizeof *x);
  CHECK(x != NULL);
  fill(x, d, D_LAPLACE, 31);
  pthread_t threads[3];
  worker_arg_t args[3];
  for (int t = 0; t < 3; t++) {
    args[t] = (worker_arg_t){x, d, 0};
    CHECK(pthread_create(&threads[t], NULL, selection_worker, &args[t]) == 0);
  }
  for (int t = 0; t < 3; t++) {
    CHECK(pthread_join(threads[t], NULL) == 0);
    CHECK(!args[t].failed);
  }
  free(x);
}

/* Threshold unambiguous (spikes far above the noise): every selector but
 * random-k returns exactly the spikes. */
static void test_unambiguous(void) {
  size_t d = 500000;
  float *x = malloc(d * sizeof *x);
  CHECK(x != NULL);
  fill(x, d, D_SPIKES, 9);
  size_t k = (d + 996) / 997;
  outbuf_t o = out_alloc(k);
  for (int kind = 0; kind < TIDE_TOPK_KIND_COUNT; kind++) {
    if (kind == TIDE_TOPK_RANDOMK) continue;
    size_t got = 0;
    CHECK_OK(tide_topk_select((tide_topk_kind_t)kind, x, d, k, "spikes", o.v, o.i, NULL));
    for (size_t j = 0; j < k; j++) got += o.i[j] % 997 == 0;
    CHECK(got == k);
  }
  out_free(&o);
  free(x);
}

/* ---- 2. squared mass captured by MSTopK -------------------------------------------- */

static void test_mass(void) {
  size_t d = 1000000;
  float *x = malloc(d * sizeof *x);
  CHECK(x != NULL);
  static const dist_t dists[] = {D_NORMAL, D_LAPLACE, D_MIXED, D_HEAVY};
  static const double densities[] = {0.001, 0.01, 0.1};
  for (size_t i = 0; i < sizeof dists / sizeof dists[0]; i++) {
    fill(x, d, dists[i], 77);
    for (size_t j = 0; j < 3; j++) {
      size_t k = tide_topk_count(densities[j], d);
      outbuf_t o = out_alloc(k);
      tide_topk_stats_t st;
      CHECK_OK(tide_topk_select(TIDE_TOPK_EXACT, x, d, k, "g", o.rv, o.ri, NULL));
      double want = mass(o.rv, k);
      for (int kind = TIDE_TOPK_MSTOPK; kind <= TIDE_TOPK_SAMPLED; kind += 2) {
        CHECK_OK(tide_topk_select((tide_topk_kind_t)kind, x, d, k, "g", o.v, o.i, &st));
        check_pairs("mass", x, k, o.v, o.i, d);
        double share = mass(o.v, k) / want;
        if (!(share >= 0.99)) {
          fprintf(stderr, "%s %s density %g: captured %.5f of the exact top-k's squared mass\n",
                  tide_topk_name(kind), dist_names[dists[i]], densities[j], share);
          exit(1);
        }
        if (kind == TIDE_TOPK_SAMPLED) CHECK(share == 1.0 && st.full_passes == 1);
      }
      out_free(&o);
    }
  }
  free(x);
}

/* ---- 3. random-k: reproducible, seed-dependent, uniform ------------------------------ */

static void test_randomk(void) {
  size_t d = 1000, k = 100;
  float x[1000];
  fill(x, d, D_NORMAL, 1);
  outbuf_t o = out_alloc(k);
  tide_topk_opts_t a = {.seed = 17}, b = {.seed = 18};
  CHECK_OK(tide_topk_select_opts(TIDE_TOPK_RANDOMK, &a, x, d, k, "r", o.v, o.i, NULL));
  CHECK_OK(tide_topk_select_opts(TIDE_TOPK_RANDOMK, &a, x, d, k, "r", o.rv, o.ri, NULL));
  check_same("randomk same seed", k, o.v, o.i, o.rv, o.ri);
  CHECK_OK(tide_topk_select_opts(TIDE_TOPK_RANDOMK, &b, x, d, k, "r", o.rv, o.ri, NULL));
  CHECK(memcmp(o.i, o.ri, k * 4) != 0);
  /* Each index is drawn with probability k/d: 1000 seeds (the odd ones) give
   * 100 per index on average, with a standard deviation of ~9.5. */
  int hits[1000] = {0};
  for (uint64_t seed = 0; seed < 2000; seed++) {
    tide_topk_opts_t s = {.seed = seed};
    size_t kk = seed % 2 ? k : d - k; /* both the marked and the complement path */
    uint32_t idx[1000];
    float val[1000];
    CHECK_OK(tide_topk_select_opts(TIDE_TOPK_RANDOMK, &s, x, d, kk, "r", val, idx, NULL));
    check_pairs("randomk", x, kk, val, idx, d);
    if (seed % 2)
      for (size_t j = 0; j < kk; j++) hits[idx[j]]++;
  }
  for (size_t i = 0; i < d; i++) CHECK(hits[i] > 50 && hits[i] < 150);
  out_free(&o);
}

/* ---- 4. NaN, Inf and argument errors ------------------------------------------------- */

static FILE *capture_file;
static int saved_stderr = -1;

static void capture_begin(void) {
  fflush(stderr);
  capture_file = tmpfile();
  CHECK(capture_file != NULL);
  saved_stderr = dup(2);
  CHECK(dup2(fileno(capture_file), 2) >= 0);
}

/* Stops capturing; returns what was logged (static storage). */
static const char *capture_end(void) {
  static char text[8192];
  fflush(stderr);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  rewind(capture_file);
  size_t n = fread(text, 1, sizeof text - 1, capture_file);
  text[n] = '\0';
  fclose(capture_file);
  return text;
}

static void test_nonfinite(void) {
  static const size_t sizes[] = {10, 5000, 200000, 1600000};
  for (size_t s = 0; s < 4; s++) {
    size_t d = sizes[s];
    float *x = malloc(d * sizeof *x);
    CHECK(x != NULL);
    fill(x, d, D_NORMAL, 4);
    size_t bad = d * 3 / 4 + 1; /* in the last chunk when there are several */
    float poison[3] = {NAN, INFINITY, -INFINITY};
    for (int p = 0; p < 3; p++) {
      x[bad] = poison[p];
      x[d - 1] = NAN; /* a later one must not be the one reported */
      for (int kind = 0; kind < TIDE_TOPK_KIND_COUNT; kind++) {
        size_t ks[] = {0, 1, d / 100 + 1, d};
        for (int j = 0; j < 4; j++) {
          size_t k = ks[j];
          float v[16] = {0};
          uint32_t i[16] = {0};
          float *vals = k <= 16 ? v : malloc(k * sizeof(float));
          uint32_t *idx = k <= 16 ? i : malloc(k * 4);
          CHECK(vals && idx);
          if (k > 0) memset(vals, 0x5a, k * sizeof(float));
          capture_begin();
          int rc = tide_topk_select((tide_topk_kind_t)kind, x, d, k, "layer3.conv2.weight", vals,
                                    idx, NULL);
          const char *msg = capture_end();
          char want[64];
          snprintf(want, sizeof want, "element %zu of", bad);
          if (rc != TIDE_EINVAL || strstr(msg, "\"layer3.conv2.weight\"") == NULL ||
              strstr(msg, want) == NULL) {
            fprintf(stderr, "%s d=%zu k=%zu poison %d: rc %d, message: %s\n",
                    tide_topk_name(kind), d, k, p, rc, msg);
            exit(1);
          }
          for (size_t q = 0; q < k; q++) CHECK(((uint32_t *)vals)[q] == 0x5a5a5a5au);
          if (vals != v) free(vals);
          if (idx != i) free(idx);
        }
      }
      size_t got = 0;
      CHECK(tide__topk_ref_exact(x, d, 1, &(float){0}, &(uint32_t){0}, &got) == TIDE__NONFINITE);
      CHECK(got == bad);
    }
    free(x);
  }
}

static void test_arguments(void) {
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v[8];
  uint32_t i[8];
  capture_begin();
  CHECK_RC(tide_topk_select(TIDE_TOPK_EXACT, x, 8, 9, "a", v, i, NULL), TIDE_EINVAL);
  CHECK_RC(tide_topk_select(TIDE_TOPK_EXACT, x, (size_t)1 << 32, 1, "a", v, i, NULL),
           TIDE_EINVAL);
  CHECK_RC(tide_topk_select(TIDE_TOPK_EXACT, NULL, 8, 1, "a", v, i, NULL), TIDE_EINVAL);
  CHECK_RC(tide_topk_select(TIDE_TOPK_EXACT, x, 8, 1, "a", NULL, i, NULL), TIDE_EINVAL);
  CHECK_RC(tide_topk_select(TIDE_TOPK_EXACT, x, 8, 1, "a", v, NULL, NULL), TIDE_EINVAL);
  CHECK_RC(tide_topk_select((tide_topk_kind_t)99, x, 8, 1, "a", v, i, NULL), TIDE_EINVAL);
  tide_topk_opts_t bad_rounds = {.mstopk_rounds = 65};
  CHECK_RC(tide_topk_select_opts(TIDE_TOPK_MSTOPK, &bad_rounds, x, 8, 1, "a", v, i, NULL),
           TIDE_EINVAL);
  tide_topk_kind_t kind;
  CHECK_RC(tide_topk_parse("topk", &kind), TIDE_EINVAL);
  const char *msg = capture_end();
  CHECK(strstr(msg, "2^32") != NULL);
  CHECK(strstr(msg, "k = 9 is larger than d = 8") != NULL);
  /* Valid corner cases: d = 0, k = 0 with NULL outputs, k = d. */
  CHECK_OK(tide_topk_select(TIDE_TOPK_SAMPLED, NULL, 0, 0, NULL, NULL, NULL, NULL));
  CHECK_OK(tide_topk_select(TIDE_TOPK_SAMPLED, x, 8, 0, NULL, NULL, NULL, NULL));
  tide_topk_stats_t st;
  CHECK_OK(tide_topk_select(TIDE_TOPK_MSTOPK, x, 8, 8, NULL, v, i, &st));
  check_pairs("k=d", x, 8, v, i, 8);
  CHECK(st.threshold == 1.0f);
  for (int k = 0; k < TIDE_TOPK_KIND_COUNT; k++) {
    CHECK_OK(tide_topk_parse(tide_topk_name((tide_topk_kind_t)k), &kind));
    CHECK((int)kind == k);
  }
  CHECK_OK(tide_topk_parse("MSTopK", &kind));
  CHECK(kind == TIDE_TOPK_MSTOPK);
  CHECK(strcmp(tide_topk_name((tide_topk_kind_t)42), "?") == 0);
  /* tide_topk_count */
  CHECK(tide_topk_count(0.07, 100) == 7);
  CHECK(tide_topk_count(0.001, 25500000) == 25500);
  CHECK(tide_topk_count(0.0015, 1000) == 2);
  CHECK(tide_topk_count(0.01, 5) == 1);
  CHECK(tide_topk_count(0.0, 5) == 0);
  CHECK(tide_topk_count(1.0, 5) == 5);
  CHECK(tide_topk_count(1.5, 5) == 0);
  CHECK(tide_topk_count(NAN, 5) == 0);
}

/* TIDE_NUM_THREADS is read once per process: each case runs in a child. */
static int child_threads(const char *value, size_t d, int *threads_out) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    setenv("TIDE_NUM_THREADS", value, 1);
    float *x = calloc(d, sizeof *x);
    float v[4];
    uint32_t i[4];
    tide_topk_stats_t st = {0};
    for (size_t j = 0; j < d; j += 1000) x[j] = 1.0f + (float)j;
    int rc = tide_topk_select(TIDE_TOPK_SAMPLED, x, d, 4, "t", v, i, &st);
    _exit(rc == 0 ? st.threads : 100 + (rc == TIDE_EINVAL));
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
  *threads_out = WEXITSTATUS(status);
  return 0;
}

static void test_num_threads(void) {
  int t;
  child_threads("3", 4000000, &t);
  CHECK(t == 3);
  child_threads("3", 1000000, &t); /* two grains only */
  CHECK(t == 1 || t == 2);
  child_threads("1", 4000000, &t);
  CHECK(t == 1);
  capture_begin();
  child_threads("many", 1000, &t);
  const char *msg = capture_end();
  CHECK(t == 101);
  CHECK(strstr(msg, "TIDE_NUM_THREADS=\"many\"") != NULL);
}

/* ---- 5. error feedback ------------------------------------------------------------------- */

/* One step, checked bit for bit: selected + residual_after == grad + residual_before. */
static void ef_step(tide_compressor_t *c, const float *grad, size_t d, float *before,
                    float *values, uint32_t *indices) {
  size_t k = tide_compressor_k(c), k_out = 0;
  memcpy(before, tide_compressor_residual(c), d * sizeof(float));
  CHECK_OK(tide_compressor_compress(c, grad, d, values, indices, &k_out));
  CHECK(k_out == k);
  const float *after = tide_compressor_residual(c);
  size_t j = 0;
  for (size_t i = 0; i < d; i++) {
    float acc = grad[i] + before[i];
    int selected = j < k && indices[j] == i;
    if (j < k) CHECK(indices[j] >= i); /* ascending, none skipped */
    float sent = selected ? values[j] : 0.0f;
    if (selected) {
      CHECK(memcmp(&sent, &acc, 4) == 0 && after[i] == 0.0f && !signbit(after[i]));
      j++;
    } else {
      CHECK(memcmp(&after[i], &acc, 4) == 0);
    }
  }
  CHECK(j == k);
}

/* Zeroes the residual, then fills grad with one value: every element ties. */
static void reset_and_fill(tide_compressor_t *c, float *grad, size_t d, float value) {
  CHECK_OK(tide_compressor_reset(c));
  for (size_t i = 0; i < d; i++) grad[i] = value;
}

static void test_error_feedback(void) {
  /* Three tensors given out of order; the middle one tiny. */
  const tide_tensor_t tensors[3] = {{"fc.bias", 3000, 10, 1, {10, 0, 0, 0}},
                                    {"conv.weight", 0, 3000, 2, {30, 100, 0, 0}},
                                    {"fc.weight", 3010, 5000, 2, {10, 500, 0, 0}}};
  size_t d = 8010;
  float *grad = malloc(d * sizeof *grad), *before = malloc(d * sizeof *before);
  float *values = malloc(d * sizeof *values);
  uint32_t *indices = malloc(d * sizeof *indices);
  CHECK(grad && before && values && indices);
  for (int kind = 0; kind < TIDE_TOPK_KIND_COUNT; kind++) {
    for (int scope = 0; scope < 2; scope++) {
      tide_compressor_t *c = NULL;
      tide_topk_opts_t opts = {.seed = 5};
      CHECK_OK(tide_compressor_create((tide_topk_kind_t)kind, 0.01, (tide_topk_scope_t)scope,
                                      tensors, 3, d, &opts, &c));
      CHECK(tide_compressor_k(c) == (scope ? 81u : 30u + 1 + 50));
      for (size_t i = 0; i < d; i++) CHECK(tide_compressor_residual(c)[i] == 0.0f);
      uint32_t first[81];
      for (int step = 0; step < 6; step++) {
        fill(grad, d, step % 2 ? D_MIXED : D_NORMAL, 100 + step);
        ef_step(c, grad, d, before, values, indices);
        if (step == 0) memcpy(first, indices, tide_compressor_k(c) * 4);
        if (scope == TIDE_TOPK_PER_TENSOR) { /* k_i per tensor: 30, 1, 50 */
          size_t in[3] = {0, 0, 0};
          for (size_t j = 0; j < tide_compressor_k(c); j++)
            in[indices[j] < 3000 ? 0 : indices[j] < 3010 ? 1 : 2]++;
          CHECK(in[0] == 30 && in[1] == 1 && in[2] == 50);
        }
      }
      /* Density warm-up: more pairs from the next step on. */
      CHECK_OK(tide_compressor_set_density(c, 0.1));
      CHECK(tide_compressor_k(c) == (scope ? 801u : 300u + 1 + 500));
      ef_step(c, grad, d, before, values, indices);
      CHECK_OK(tide_compressor_set_density(c, 0.01));
      /* A NaN: TIDE_EINVAL naming the tensor; residual and outputs unchanged. */
      memcpy(before, tide_compressor_residual(c), d * sizeof(float));
      grad[3010 + 77] = NAN;
      memset(values, 0x5a, 81 * sizeof(float));
      size_t k_out = 12345;
      capture_begin();
      CHECK_RC(tide_compressor_compress(c, grad, d, values, indices, &k_out), TIDE_EINVAL);
      const char *msg = capture_end();
      CHECK(k_out == 12345);
      CHECK(strstr(msg, "\"fc.weight\" element 77") != NULL);
      CHECK(strstr(tide_compressor_last_error(c), "\"fc.weight\" element 77") != NULL);
      CHECK(memcmp(before, tide_compressor_residual(c), d * sizeof(float)) == 0);
      for (size_t j = 0; j < 81; j++) CHECK(((uint32_t *)values)[j] == 0x5a5a5a5au);
      grad[3010 + 77] = 0.5f;
      ef_step(c, grad, d, before, values, indices);
      /* Reset: residual zero, seed rewound (random-k repeats its first draw). */
      CHECK_OK(tide_compressor_reset(c));
      for (size_t i = 0; i < d; i++) CHECK(tide_compressor_residual(c)[i] == 0.0f);
      fill(grad, d, D_NORMAL, 100);
      ef_step(c, grad, d, before, values, indices);
      CHECK(memcmp(first, indices, tide_compressor_k(c) * 4) == 0);
      tide_compressor_destroy(c);
    }
  }
  /* One flat tensor, large enough for threads, global selection. */
  size_t big = 1200000;
  float *g = malloc(big * sizeof *g), *b = malloc(big * sizeof *b), *v = malloc(big * 4);
  uint32_t *ix = malloc(big * 4);
  CHECK(g && b && v && ix);
  /* This is the one-pass path (acc, cut and collection fused): its pairs
   * must be the exact top k of gradient + residual, also when the cut fails
   * (all zeros, all ties) and with a NaN. */
  float *acc = malloc(big * 4), *ev = malloc(big * 4);
  uint32_t *eix = malloc(big * 4);
  CHECK(acc && ev && eix);
  for (int threads = 1; threads <= 2; threads++) {
    tide_compressor_t *c = NULL;
    tide_topk_opts_t opts = {.num_threads = threads};
    CHECK_OK(tide_compressor_create(TIDE_TOPK_SAMPLED, 0.001, TIDE_TOPK_GLOBAL, NULL, 0, big, &opts, &c));
    size_t k = tide_compressor_k(c);
    for (int step = 0; step < 6; step++) {
      if (step < 3) fill(g, big, D_LAPLACE, 50 + step);
      if (step == 3) memset(g, 0, big * sizeof *g); /* the residual decides */
      if (step == 4) reset_and_fill(c, g, big, 0.25f);  /* all ties */
      if (step == 5) fill(g, big, D_MIXED, 60);
      for (size_t i = 0; i < big; i++) acc[i] = g[i] + tide_compressor_residual(c)[i];
      CHECK_OK(tide_topk_select(TIDE_TOPK_EXACT, acc, big, k, "acc", ev, eix, NULL));
      ef_step(c, g, big, b, v, ix);
      CHECK(memcmp(ix, eix, k * 4) == 0 && memcmp(v, ev, k * 4) == 0);
    }
    memcpy(b, tide_compressor_residual(c), big * sizeof *b);
    g[big - 5] = -INFINITY;
    size_t k_out = 0;
    capture_begin();
    CHECK_RC(tide_compressor_compress(c, g, big, v, ix, &k_out), TIDE_EINVAL);
    CHECK(strstr(capture_end(), "element 1199995") != NULL);
    CHECK(memcmp(b, tide_compressor_residual(c), big * sizeof *b) == 0);
    tide_compressor_destroy(c);
  }
  free(acc);
  free(ev);
  free(eix);
  free(g);
  free(b);
  free(v);
  free(ix);

  /* Creation errors. */
  tide_compressor_t *c = NULL;
  tide_tensor_t gap[2] = {{"a", 0, 10, 1, {10, 0, 0, 0}}, {"b", 11, 10, 1, {10, 0, 0, 0}}};
  capture_begin();
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.1, TIDE_TOPK_PER_TENSOR, gap, 2, 21, NULL,
                                  &c),
           TIDE_EINVAL);
  gap[1].offset = 10;
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.1, TIDE_TOPK_PER_TENSOR, gap, 2, 21, NULL,
                                  &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.0, TIDE_TOPK_GLOBAL, NULL, 0, 5, NULL, &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 1.5, TIDE_TOPK_GLOBAL, NULL, 0, 5, NULL, &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.5, TIDE_TOPK_GLOBAL, NULL, 0, 0, NULL, &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.5, TIDE_TOPK_GLOBAL, NULL, 0, 5, NULL,
                                  NULL),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create((tide_topk_kind_t)9, 0.5, TIDE_TOPK_GLOBAL, NULL, 0, 5, NULL,
                                  &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.5, (tide_topk_scope_t)7, NULL, 0, 5, NULL,
                                  &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_create(TIDE_TOPK_EXACT, 0.5, TIDE_TOPK_GLOBAL, NULL, 2, 5, NULL, &c),
           TIDE_EINVAL);
  tide_topk_opts_t bad_rounds = {.mstopk_rounds = -1};
  CHECK_RC(tide_compressor_create(TIDE_TOPK_MSTOPK, 0.5, TIDE_TOPK_GLOBAL, NULL, 0, 5,
                                  &bad_rounds, &c),
           TIDE_EINVAL);
  CHECK_RC(tide_compressor_reset(NULL), TIDE_EINVAL);
  CHECK_RC(tide_compressor_set_density(NULL, 0.5), TIDE_EINVAL);
  const char *msg = capture_end();
  CHECK(strstr(msg, "elements [10, 11) belong to no tensor (the next is tensor 'b'") != NULL);
  CHECK(strstr(msg, "the tensors cover [0, 20) of 21 elements") != NULL);
  CHECK_OK(tide_compressor_create(TIDE_TOPK_EXACT, 0.1, TIDE_TOPK_PER_TENSOR, gap, 2, 20, NULL,
                                  &c));
  capture_begin();
  CHECK_RC(tide_compressor_compress(c, grad, 19, values, indices, &(size_t){0}), TIDE_EINVAL);
  CHECK(strstr(tide_compressor_last_error(c), "d = 19") != NULL);
  CHECK_RC(tide_compressor_compress(c, NULL, 20, values, indices, &(size_t){0}), TIDE_EINVAL);
  CHECK_RC(tide_compressor_compress(c, grad, 20, NULL, indices, &(size_t){0}), TIDE_EINVAL);
  CHECK_RC(tide_compressor_set_density(c, 0.0), TIDE_EINVAL);
  capture_end();
  CHECK(tide_compressor_k(c) == 2);
  tide_compressor_destroy(c);
  tide_compressor_destroy(NULL);
  free(grad);
  free(before);
  free(values);
  free(indices);
}

int main(void) {
  unsetenv("TIDE_LOG_FILE");
  unsetenv("TIDE_NUM_THREADS");
  test_num_threads();
  test_arguments();
  test_against_references();
  test_large();
  test_threads_agree();
  test_concurrent();
  test_unambiguous();
  test_mass();
  test_randomk();
  test_nonfinite();
  test_error_feedback();
  printf("test_compress: ok\n");
  return 0;
}
