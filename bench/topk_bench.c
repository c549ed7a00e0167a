/* Top-k selection benchmark: time (median of repeats after warm-up) and the
 * share of the exact top-k's squared L2 mass captured, for tide's selectors,
 * on gradient-like data, with a plain read of the same data as the floor.
 * One JSON line per measurement on stdout; scripts/bench-topk.sh runs it
 * beside std::nth_element (bench/nth_element_bench.cc) and torch.topk
 * (bench/topk_torch.py) on the same data, written by --write-data.
 *
 *   topk_bench [--d N[,N...]] [--density R[,R...]] [--dist normal|laplace|mixed]
 *              [--kinds exact,mstopk,sampled,randomk] [--repeats R] [--warmup W]
 *              [--threads T] [--seed S] [--write-data FILE] [--compress 0|1]
 *
 * --compress 1 also times one error-feedback step (tide_compressor_compress,
 * sampled, global: grad + residual, select, keep the rest) per density.
 * N accepts K/M suffixes (25.5M). --write-data writes the (last) d's data as
 * raw little-endian f32 to FILE and exits without timing. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tide.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- data: splitmix64 + Box-Muller, the same for every run of one seed -------------- */

static uint64_t state;
static uint64_t next64(void) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double uniform01(void) { return ((double)(next64() >> 11) + 0.5) / 9007199254740992.0; }

/* normal: N(0, 0.01^2). laplace: scale 0.01. mixed: "layers" of 100K
 * elements whose scales span three decades, every third one Laplace
 * (heavier tails), as gradients of a network's layers differ. */
static void generate(float *x, size_t d, const char *dist, uint64_t seed) {
  state = seed;
  double scale = 0.01;
  for (size_t i = 0; i < d; i += 2) {
    double r = sqrt(-2.0 * log(uniform01())), a = 6.283185307179586 * uniform01();
    double z0 = r * cos(a), z1 = r * sin(a);
    for (int j = 0; j < 2 && i + j < d; j++) {
      double z = j ? z1 : z0;
      size_t n = i + j;
      if (strcmp(dist, "laplace") == 0) {
        double u = uniform01() - 0.5;
        x[n] = (float)(-0.01 * (u < 0 ? -1 : 1) * log(1 - 2 * fabs(u)));
      } else if (strcmp(dist, "mixed") == 0) {
        if (n % 100000 == 0) scale = 0.01 * pow(10.0, -3.0 * uniform01());
        x[n] = (float)(scale * ((n / 100000) % 3 == 2 ? (z < 0 ? 1 : -1) * log(uniform01()) : z));
      } else {
        x[n] = (float)(0.01 * z);
      }
    }
  }
}

/* ---- the floor: one read of the data with the same threads ---------------------------- */

typedef struct {
  const float *x;
  size_t begin, end;
  uint32_t bits;
} read_arg_t;

/* ORs the bits of every element: the cheapest loop that reads them all
 * (it vectorises), so its time is the memory's. */
static void *read_main(void *p) {
  read_arg_t *a = p;
  uint32_t acc = 0;
  for (size_t i = a->begin; i < a->end; i++) {
    uint32_t u;
    memcpy(&u, &a->x[i], sizeof u);
    acc |= u;
  }
  a->bits = acc;
  return NULL;
}

static uint32_t read_once(const float *x, size_t d, int threads) {
  read_arg_t args[64];
  pthread_t tids[64];
  for (int t = 0; t < threads; t++) {
    args[t] = (read_arg_t){x, d * t / threads, d * (t + 1) / threads, 0};
    if (t > 0) pthread_create(&tids[t], NULL, read_main, &args[t]);
  }
  read_main(&args[0]);
  uint32_t bits = args[0].bits;
  for (int t = 1; t < threads; t++) {
    pthread_join(tids[t], NULL);
    bits |= args[t].bits;
  }
  return bits;
}

/* ---- main --------------------------------------------------------------------------------- */

static size_t parse_count(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1e3;
  if (*end == 'M' || *end == 'm') v *= 1e6;
  if (*end == 'G' || *end == 'g') v *= 1e9;
  return (size_t)(v + 0.5);
}

static int split(char *list, char **items, int max) {
  int n = 0;
  for (char *tok = strtok(list, ","); tok != NULL && n < max; tok = strtok(NULL, ",")) items[n++] = tok;
  return n;
}

static double sq_mass(const float *v, size_t k) {
  double s = 0;
  for (size_t j = 0; j < k; j++) s += (double)v[j] * v[j];
  return s;
}

int main(int argc, char **argv) {
  char d_list[256] = "1M,4M,16M,25.5M,64M", density_list[256] = "0.001,0.01,0.1";
  char kind_list[256] = "exact,mstopk,sampled";
  const char *dist = "normal", *write_data = NULL;
  int repeats = 7, warmup = 2, threads = 0, compress = 0;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "topk_bench: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (strcmp(a, "--d") == 0) snprintf(d_list, sizeof d_list, "%s", v);
    else if (strcmp(a, "--density") == 0) snprintf(density_list, sizeof density_list, "%s", v);
    else if (strcmp(a, "--kinds") == 0) snprintf(kind_list, sizeof kind_list, "%s", v);
    else if (strcmp(a, "--dist") == 0) dist = v;
    else if (strcmp(a, "--repeats") == 0) repeats = atoi(v);
    else if (strcmp(a, "--warmup") == 0) warmup = atoi(v);
    else if (strcmp(a, "--threads") == 0) threads = atoi(v);
    else if (strcmp(a, "--seed") == 0) seed = strtoull(v, NULL, 10);
    else if (strcmp(a, "--write-data") == 0) write_data = v;
    else if (strcmp(a, "--compress") == 0) compress = atoi(v);
    else {
      fprintf(stderr, "topk_bench: unknown option %s (see the comment at the top of "
                      "bench/topk_bench.c)\n", a);
      return 2;
    }
  }
  if (repeats < 1 || repeats > 1000 || warmup < 0) {
    fprintf(stderr, "topk_bench: --repeats must be in [1, 1000], --warmup >= 0\n");
    return 2;
  }
  if (strcmp(dist, "normal") != 0 && strcmp(dist, "laplace") != 0 && strcmp(dist, "mixed") != 0) {
    fprintf(stderr, "topk_bench: --dist must be normal, laplace or mixed\n");
    return 2;
  }
  char *ds[32], *rs[32], *ks[8];
  int nd = split(d_list, ds, 32), nr = split(density_list, rs, 32), nk = split(kind_list, ks, 8);
  tide_topk_kind_t kinds[8];
  for (int i = 0; i < nk; i++)
    if (tide_topk_parse(ks[i], &kinds[i]) != 0) return 2;
  int read_threads = threads;
  if (read_threads <= 0) {
    const char *env = getenv("TIDE_NUM_THREADS");
    read_threads = env != NULL && atoi(env) > 0 ? atoi(env) : 2;
  }
  if (read_threads > 64) read_threads = 64;

  for (int di = 0; di < nd; di++) {
    size_t d = parse_count(ds[di]);
    if (d == 0 || d >= ((size_t)1 << 32)) {
      fprintf(stderr, "topk_bench: --d %s is out of range\n", ds[di]);
      return 2;
    }
    float *x = malloc(d * sizeof *x);
    if (x == NULL) {
      fprintf(stderr, "topk_bench: out of memory for d = %zu\n", d);
      return 1;
    }
    generate(x, d, dist, seed);
    if (write_data != NULL && di == nd - 1) {
      FILE *f = fopen(write_data, "wb");
      if (f == NULL || fwrite(x, sizeof *x, d, f) != d || fclose(f) != 0) {
        fprintf(stderr, "topk_bench: cannot write %s\n", write_data);
        return 1;
      }
      free(x);
      return 0;
    }
    if (write_data != NULL) {
      free(x);
      continue;
    }
    double *ms = malloc((size_t)repeats * sizeof *ms);
    volatile uint32_t sink = 0;
    for (int r = 0; r < warmup + repeats; r++) {
      double t0 = now_ms();
      sink += read_once(x, d, read_threads);
      if (r >= warmup) ms[r - warmup] = now_ms() - t0;
    }
    (void)sink;
    double read_min = ms[0];
    for (int r = 1; r < repeats; r++) read_min = fmin(read_min, ms[r]);
    printf("{\"bench\":\"topk\",\"impl\":\"read\",\"dist\":\"%s\",\"d\":%zu,\"threads\":%d,"
           "\"median_ms\":%.3f,\"min_ms\":%.3f}\n",
           dist, d, read_threads, median(ms, repeats), read_min);
    fflush(stdout);

    for (int ri = 0; ri < nr; ri++) {
      double density = strtod(rs[ri], NULL);
      size_t k = tide_topk_count(density, d);
      float *values = malloc((k ? k : 1) * sizeof *values);
      uint32_t *indices = malloc((k ? k : 1) * sizeof *indices);
      if (values == NULL || indices == NULL) return 1;
      tide_topk_opts_t opts = {.seed = seed, .num_threads = threads};
      tide_topk_stats_t st;
      if (tide_topk_select_opts(TIDE_TOPK_EXACT, &opts, x, d, k, "bench", values, indices, NULL))
        return 1;
      double exact_mass = sq_mass(values, k);
      for (int ki = 0; ki < nk; ki++) {
        for (int r = 0; r < warmup + repeats; r++) {
          double t0 = now_ms();
          int rc = tide_topk_select_opts(kinds[ki], &opts, x, d, k, "bench", values, indices, &st);
          double t = now_ms() - t0;
          if (rc != 0) {
            fprintf(stderr, "topk_bench: %s failed: %s\n", ks[ki], tide_strerror(rc));
            return 1;
          }
          if (r >= warmup) ms[r - warmup] = t;
        }
        double min = ms[0];
        for (int r = 1; r < repeats; r++) min = fmin(min, ms[r]);
        double share = exact_mass > 0 ? sq_mass(values, k) / exact_mass : 1.0;
        printf("{\"bench\":\"topk\",\"impl\":\"tide\",\"kind\":\"%s\",\"dist\":\"%s\",\"d\":%zu,"
               "\"density\":%g,\"k\":%zu,\"threads\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,"
               "\"mass_share\":%.6f,\"mass\":%.9g,\"full_passes\":%u,\"candidates\":%llu,"
               "\"fallback\":%d}\n",
               tide_topk_name(kinds[ki]), dist, d, density, k, st.threads, median(ms, repeats),
               min, share, sq_mass(values, k), st.full_passes,
               (unsigned long long)st.candidates, st.fallback);
        fflush(stdout);
      }
      if (compress) {
        tide_compressor_t *c = NULL;
        if (tide_compressor_create(TIDE_TOPK_SAMPLED, density, TIDE_TOPK_GLOBAL, NULL, 0, d, &opts,
                                   &c) != 0)
          return 1;
        size_t n = 0;
        for (int r = 0; r < warmup + repeats; r++) {
          double t0 = now_ms();
          int rc = tide_compressor_compress(c, x, d, values, indices, &n);
          double t = now_ms() - t0;
          if (rc != 0) return 1;
          if (r >= warmup) ms[r - warmup] = t;
        }
        tide_compressor_destroy(c);
        printf("{\"bench\":\"topk\",\"impl\":\"tide\",\"kind\":\"compress\",\"dist\":\"%s\","
               "\"d\":%zu,\"density\":%g,\"k\":%zu,\"median_ms\":%.3f}\n",
               dist, d, density, n, median(ms, repeats));
        fflush(stdout);
      }
      free(values);
      free(indices);
    }
    free(ms);
    free(x);
  }
  return 0;
}
