/* tide_adasum_allreduce against a scalar reference that applies the
 * pairwise recursion (in double), at np 1-8 over shared memory and at np 3
 * and 4 over TCP, f32 and f64:
 *  - the spec's vectors: Adasum((1,0), (1,1)) = (1.25, 0.75); the tree of
 *    (1,0), (0,1), (1,0), (0,1) gives (1,1);
 *  - orthogonal inputs give their sum and identical inputs give the input,
 *    both exactly;
 *  - tensor boundaries: a tensor's result depends on that tensor only
 *    (bitwise), and equals the tensor reduced on its own;
 *  - results bitwise identical on every rank; in place, nonblocking and
 *    tensors in any order give the same bits, and so do shm with pieces of
 *    two sizes and TCP (the dot products are taken as pieces arrive);
 *  - bad arguments and mismatched calls fail on every rank;
 *  - hierarchical (emulated hosts) against the reference of the host
 *    averages, against flat Adasum when a host's ranks hold the same input,
 *    and flat forced with TIDE_ADASUM_HIER=0. */
#include <math.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* ---- reference ---------------------------------------------------------------- */

typedef struct {
  size_t count, nseg;
  size_t end[16]; /* where each tensor ends, ascending */
} layout_t;

/* a = Adasum(a, b), tensor by tensor. */
static void ref_pair(double *a, const double *b, const layout_t *l) {
  for (size_t s = 0, lo = 0; s < l->nseg; lo = l->end[s++]) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = lo; i < l->end[s]; i++) {
      ab += a[i] * b[i];
      aa += a[i] * a[i];
      bb += b[i] * b[i];
    }
    double tiny = sqrt(2.2250738585072014e-308);
    double ca = aa >= tiny ? 1 - ab / (2 * aa) : 1, cb = bb >= tiny ? 1 - ab / (2 * bb) : 1;
    for (size_t i = lo; i < l->end[s]; i++) a[i] = ca * a[i] + cb * b[i];
  }
}

/* Combines g[lo..hi) into g[lo]: Adasum(left half, right half). */
static void ref_tree(double **g, int lo, int hi, const layout_t *l) {
  if (hi - lo < 2) return;
  int mid = lo + (hi - lo) / 2;
  ref_tree(g, lo, mid, l);
  ref_tree(g, mid, hi, l);
  ref_pair(g[lo], g[mid], l);
}

/* Adasum of g[0..n) into g[0] as tide folds it: with p the largest power
 * of two <= n, ranks 2i and 2i+1 (i < n - p) first, then a balanced tree. */
static void ref_adasum(double **g, int n, const layout_t *l) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int extra = n - p;
  double *leaf[64] = {0};
  for (int v = 0; v < p; v++) {
    if (v < extra) ref_pair(g[2 * v], g[2 * v + 1], l);
    leaf[v] = v < extra ? g[2 * v] : g[v + extra];
  }
  ref_tree(leaf, 0, p, l);
  if (leaf[0] != g[0]) memcpy(g[0], leaf[0], l->count * sizeof(double));
}

/* ---- inputs --------------------------------------------------------------------- */

enum { RANDOM, IDENTICAL, ORTHOGONAL, HOST_EQUAL };

/* Rank r's element i: a direction shared by all ranks plus the rank's own,
 * mixed per tensor so the coefficients range over (0, 1]. */
static double input(int kind, int r, size_t i, int size, int local_size) {
  unsigned st = (unsigned)(i * 2654435761u) ^ 0x9e37u;
  double common = (double)(harness_rand(&st) % 2001) / 1000.0 - 1.0;
  if (kind == IDENTICAL) return common;
  if (kind == ORTHOGONAL) return i % (size_t)size == (size_t)r ? common + 2.0 : 0.0;
  if (kind == HOST_EQUAL) r /= local_size;
  unsigned sr = (unsigned)(i * 7919u + (unsigned)r * 104729u + 17u);
  double own = (double)(harness_rand(&sr) % 2001) / 1000.0 - 1.0;
  double mix = (double)(i % 5) / 4.0;
  return mix * common + (1.5 - mix) * own;
}

static void fill(void *buf, tide_dtype_t dt, int kind, int r, size_t count, int size, int local_size) {
  for (size_t i = 0; i < count; i++) {
    double v = input(kind, r, i, size, local_size);
    if (dt == TIDE_F32) ((float *)buf)[i] = (float)v;
    else ((double *)buf)[i] = v;
  }
}

static double get(const void *buf, tide_dtype_t dt, size_t i) {
  return dt == TIDE_F32 ? ((const float *)buf)[i] : ((const double *)buf)[i];
}

/* tensors for a layout, listed in reverse order (any order is allowed). */
static size_t tensors_of(const layout_t *l, tide_tensor_t *t) {
  for (size_t s = 0, lo = 0; s < l->nseg; lo = l->end[s++]) {
    t[l->nseg - 1 - s] = (tide_tensor_t){NULL, lo, l->end[s] - lo, 1, {(int)(l->end[s] - lo), 0, 0, 0}};
  }
  return l->nseg;
}

/* Every rank's result equals this one's, bit for bit. */
static void check_identical(tide_comm_t *comm, const void *buf, size_t bytes) {
  int size = tide_comm_size(comm);
  size_t words = (bytes + 3) / 4;
  int32_t *mine = calloc(words, 4), *all = malloc(words * 4 * (size_t)size);
  CHECK(mine != NULL && all != NULL);
  memcpy(mine, buf, bytes);
  CHECK_OK(tide_allgather(comm, mine, all, words, TIDE_I32));
  for (int r = 0; r < size; r++) CHECK(memcmp(all + (size_t)r * words, mine, words * 4) == 0);
  free(mine);
  free(all);
}

/* The reference of `kind` inputs on this layout: flat over every rank, or
 * (hosts > 1) over the hosts' averages. */
static double *reference(int kind, tide_dtype_t dt, const layout_t *l, int size, int local_size, int hosts) {
  int n = hosts > 1 ? hosts : size;
  double **g = malloc((size_t)n * sizeof *g);
  CHECK(g != NULL);
  for (int h = 0; h < n; h++) {
    g[h] = calloc(l->count ? l->count : 1, sizeof(double));
    CHECK(g[h] != NULL);
    int per = hosts > 1 ? local_size : 1;
    for (int j = 0; j < per; j++)
      for (size_t i = 0; i < l->count; i++) {
        /* the reference starts from the rounded inputs */
        double v = input(kind, h * per + j, i, size, local_size);
        g[h][i] += dt == TIDE_F32 ? (double)(float)v : v;
      }
    for (size_t i = 0; i < l->count; i++) g[h][i] /= per;
  }
  ref_adasum(g, n, l);
  for (int h = 1; h < n; h++) free(g[h]);
  double *out = g[0];
  free(g);
  return out;
}

/* |got - want| <= tol * (the tensor's largest |want| + 1), per tensor. */
static void check_close(const void *got, tide_dtype_t dt, const double *want, const layout_t *l, const char *what) {
  double tol = dt == TIDE_F32 ? 2e-5 : 1e-12;
  for (size_t s = 0, lo = 0; s < l->nseg; lo = l->end[s++]) {
    double scale = 1;
    for (size_t i = lo; i < l->end[s]; i++) scale = fmax(scale, fabs(want[i]) + 1);
    for (size_t i = lo; i < l->end[s]; i++)
      if (!(fabs(get(got, dt, i) - want[i]) <= tol * scale)) {
        fprintf(stderr, "%s: %s element %zu (tensor %zu): got %.17g, want %.17g\n", what, tide_dtype_name(dt), i, s,
                get(got, dt, i), want[i]);
        exit(1);
      }
  }
}

static const layout_t layouts[] = {
    {1, 1, {1}},
    {3, 1, {3}},
    {1315, 6, {1, 8, 308, 310, 1310, 1315}},
    {4099, 3, {2000, 2001, 4099}},
    /* halves of several 512 KiB pieces, cut inside a tensor */
    {300007, 3, {5, 150001, 300007}},
};
#define NLAYOUTS (sizeof layouts / sizeof layouts[0])

/* ---- flat ------------------------------------------------------------------------ */

static void spec_vectors(tide_comm_t *comm, int rank, int size) {
  if (size == 2) { /* (1,0) and (1,1) give (1.25, 0.75) */
    double v[2] = {1, rank == 0 ? 0 : 1};
    CHECK_OK(tide_adasum_allreduce(comm, v, v, 2, TIDE_F64, NULL, 0));
    CHECK(v[0] == 1.25 && v[1] == 0.75);
    float f[2] = {1, rank == 0 ? 0.0f : 1.0f}, out[2];
    CHECK_OK(tide_adasum_allreduce(comm, f, out, 2, TIDE_F32, NULL, 0));
    CHECK(out[0] == 1.25f && out[1] == 0.75f);
  }
  if (size == 4) { /* the tree of (1,0), (0,1), (1,0), (0,1) gives (1,1) */
    double v[2] = {rank % 2 == 0, rank % 2 == 1};
    CHECK_OK(tide_adasum_allreduce(comm, v, v, 2, TIDE_F64, NULL, 0));
    CHECK(v[0] == 1 && v[1] == 1);
  }
}

static void check_layout(tide_comm_t *comm, int rank, int size, tide_dtype_t dt, const layout_t *l) {
  size_t esize = tide_dtype_size(dt), bytes = l->count * esize;
  tide_tensor_t t[16];
  size_t nt = tensors_of(l, t);
  char *in = malloc(bytes), *out = malloc(bytes), *again = malloc(bytes);
  CHECK(in != NULL && out != NULL && again != NULL);

  /* random: against the reference, identical everywhere; out of place,
   * the peer's first half lands in out mid-call, so out starts as NaNs and
   * in must come back untouched */
  fill(in, dt, RANDOM, rank, l->count, size, 1);
  memset(out, 0xff, bytes);
  CHECK_OK(tide_adasum_allreduce(comm, in, out, l->count, dt, t, nt));
  fill(again, dt, RANDOM, rank, l->count, size, 1);
  CHECK(memcmp(again, in, bytes) == 0);
  double *want = reference(RANDOM, dt, l, size, 1, 1);
  check_close(out, dt, want, l, "flat vs reference");
  check_identical(comm, out, bytes);
  /* in place and nonblocking: the same bits */
  memcpy(again, in, bytes);
  tide_request_t *req;
  CHECK_OK(tide_iadasum_allreduce(comm, again, again, l->count, dt, t, nt, &req));
  CHECK_OK(tide_wait(req));
  CHECK(memcmp(again, out, bytes) == 0);
  /* a tensor's result depends on that tensor only: change the first
   * tensor on rank 0 and the others' bits stay */
  if (l->nseg > 1) {
    memcpy(again, in, bytes);
    if (rank == 0)
      for (size_t i = 0; i < l->end[0]; i++) memset(again + i * esize, 0x3f, esize);
    CHECK_OK(tide_adasum_allreduce(comm, again, again, l->count, dt, t, nt));
    CHECK(memcmp(again + l->end[0] * esize, out + l->end[0] * esize, bytes - l->end[0] * esize) == 0);
    /* and equals that tensor reduced on its own */
    size_t lo = l->end[0], n = l->end[1] - lo;
    CHECK_OK(tide_adasum_allreduce(comm, in + lo * esize, again, n, dt, NULL, 0));
    for (size_t i = 0; i < n; i++) {
      double a = get(again, dt, i), b = get(out, dt, lo + i);
      CHECK(fabs(a - b) <= (dt == TIDE_F32 ? 1e-5 : 1e-13) * (fabs(b) + 1));
    }
  }
  free(want);

  /* identical inputs give the input, exactly */
  fill(in, dt, IDENTICAL, rank, l->count, size, 1);
  CHECK_OK(tide_adasum_allreduce(comm, in, out, l->count, dt, t, nt));
  CHECK(memcmp(in, out, bytes) == 0);
  /* orthogonal inputs (disjoint supports) give the sum, exactly */
  fill(in, dt, ORTHOGONAL, rank, l->count, size, 1);
  CHECK_OK(tide_adasum_allreduce(comm, in, out, l->count, dt, t, nt));
  for (size_t i = 0; i < l->count; i++) {
    double v = input(ORTHOGONAL, (int)(i % (size_t)size), i, size, 1);
    CHECK(get(out, dt, i) == (dt == TIDE_F32 ? (double)(float)v : v));
  }
  free(in);
  free(out);
  free(again);
}

/* A bad argument fails the call on the rank that made it, alone and at
 * once; that rank's next call meets the others' pending one as a mismatch
 * on every rank, and then the communicator works again. Boundaries that
 * differ across ranks are a mismatch on every rank. */
static void check_bad_args(tide_comm_t *comm, int rank, int size, int variant) {
  float buf[8] = {0};
  tide_tensor_t t[2] = {{NULL, 0, 4, 1, {4, 0, 0, 0}}, {NULL, 4, 4, 1, {4, 0, 0, 0}}};
  int rc;
  const char *expect;
  if (variant == 0) { /* a gap: rank 0 describes 7 of 8 elements */
    if (rank == 0) t[1].count = 3;
    rc = tide_adasum_allreduce(comm, buf, buf, 8, TIDE_F32, t, 2);
    expect = "rank 0 called adasum_allreduce with tensors that cover 7 of count=8";
  } else if (variant == 1) { /* f16 */
    rc = tide_adasum_allreduce(comm, buf, buf, 4, rank == 0 ? TIDE_F16 : TIDE_F32, NULL, 0);
    expect = "rank 0 called adasum_allreduce with dtype f16: Adasum supports only f32 and f64";
  } else { /* boundaries that differ: a mismatch */
    if (rank == size - 1) t[0].count = 3, t[1].offset = 3, t[1].count = 5;
    rc = tide_adasum_allreduce(comm, buf, buf, 8, TIDE_F32, t, 2);
    expect = "collective mismatch";
  }
  const char *msg = tide_comm_last_error(comm);
  fprintf(stderr, "rank %d: %s: %s\n", rank, tide_err_name(rc), msg);
  if (variant == 2 || rank != 0) {
    CHECK_RC(rc, TIDE_EMISMATCH);
    CHECK(strstr(msg, "collective mismatch") != NULL);
  } else {
    CHECK_RC(rc, TIDE_EINVAL);
    CHECK(strstr(msg, expect) != NULL);
    CHECK_RC(tide_adasum_allreduce(comm, buf, buf, 8, TIDE_F32, NULL, 0), TIDE_EMISMATCH);
  }
  for (int i = 0; i < 8; i++) buf[i] = (float)(i + 1);
  CHECK_OK(tide_adasum_allreduce(comm, buf, buf, 8, TIDE_F32, NULL, 0));
  for (int i = 0; i < 8; i++) CHECK(fabsf(buf[i] - (float)(i + 1)) < 1e-4f); /* Adasum of equal vectors: that vector */
}

typedef struct {
  int bad_variant;  /* -1: the correctness checks; 0-2: check_bad_args */
  int flat;         /* TIDE_ADASUM_HIER=0 */
  const char *ring; /* NULL, or TIDE_SHM_RING_BYTES */
  const char *save; /* NULL, or where rank 0 writes its results of the largest layout */
} run_t;

/* Rank 0 writes the f32 and f64 results of the largest layout to path:
 * the dot products must not depend on how a transport cuts the message. */
static void save_results(tide_comm_t *comm, int rank, int size, const char *path) {
  const layout_t *l = &layouts[NLAYOUTS - 1];
  tide_tensor_t t[16];
  size_t nt = tensors_of(l, t);
  FILE *f = rank == 0 ? fopen(path, "wb") : NULL;
  CHECK(rank != 0 || f != NULL);
  for (int dt = 0; dt < 2; dt++) {
    tide_dtype_t type = dt ? TIDE_F64 : TIDE_F32;
    size_t bytes = l->count * tide_dtype_size(type);
    char *in = malloc(bytes), *out = malloc(bytes);
    CHECK(in != NULL && out != NULL);
    fill(in, type, RANDOM, rank, l->count, size, 1);
    CHECK_OK(tide_adasum_allreduce(comm, in, out, l->count, type, t, nt));
    if (f != NULL) CHECK(fwrite(out, 1, bytes, f) == bytes);
    free(in);
    free(out);
  }
  if (f != NULL) CHECK(fclose(f) == 0);
}

static int flat_rank(int rank, int size, void *arg) {
  const run_t *run = arg;
  if (run->flat) setenv("TIDE_ADASUM_HIER", "0", 1);
  if (run->ring != NULL) setenv("TIDE_SHM_RING_BYTES", run->ring, 1);
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  if (run->bad_variant >= 0) {
    check_bad_args(comm, rank, size, run->bad_variant);
  } else if (run->save != NULL) {
    save_results(comm, rank, size, run->save);
  } else {
    spec_vectors(comm, rank, size);
    for (int dt = 0; dt < 2; dt++)
      for (size_t k = 0; k < NLAYOUTS; k++) check_layout(comm, rank, size, dt ? TIDE_F64 : TIDE_F32, &layouts[k]);
    /* count 0 is a valid call */
    CHECK_OK(tide_adasum_allreduce(comm, NULL, NULL, 0, TIDE_F32, NULL, 0));
  }
  tide_comm_destroy(comm);
  return 0;
}

/* ---- ranks that share a CPU ------------------------------------------------------- */

/* The first two CPUs this process may run on, or -1. */
static int two_cpus[2] = {-1, -1};

/* Rank r bound to CPU r % 2 of two_cpus, as tiderun binds 4 or 8 ranks on
 * 2 cores. Over shared memory Adasum pairs the ranks that share a core
 * first (distances 2, 4, then 1), so the result is the tree over the ranks
 * in the order 0, 2, 1, 3 (np 4) or 0, 2, 4, 6, 1, 3, 5, 7 (np 8), and not
 * the tree over 0, 1, 2, 3; over TCP the other way round. */
static int bound_rank(int rank, int size, void *arg) {
  (void)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(two_cpus[rank % 2], &set);
  CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  const layout_t *l = &layouts[2];
  tide_tensor_t t[16];
  size_t nt = tensors_of(l, t);
  double *out = malloc(l->count * sizeof *out);
  CHECK(out != NULL);
  fill(out, TIDE_F64, RANDOM, rank, l->count, size, 1);
  CHECK_OK(tide_adasum_allreduce(comm, out, out, l->count, TIDE_F64, t, nt));
  check_identical(comm, out, l->count * sizeof *out);
  double *g[8], *ordered[8];
  for (int r = 0; r < size; r++) {
    g[r] = malloc(l->count * sizeof(double));
    CHECK(g[r] != NULL);
  }
  /* Over TCP (TIDE_SHM=0) a pair on one core swaps slower than two cores
   * do, and the ranks keep the order of their numbers. */
  const char *shm = getenv("TIDE_SHM");
  int cores = shm == NULL || strcmp(shm, "0") != 0;
  for (int pass = 0; pass < 2; pass++) { /* pass 0: the order tide must not take; 1: the one it must */
    int by_core = pass == cores;
    for (int r = 0; r < size; r++)
      for (size_t i = 0; i < l->count; i++) g[r][i] = input(RANDOM, r, i, size, 1);
    for (int j = 0; j < size; j++) ordered[j] = g[!by_core ? j : j < size / 2 ? 2 * j : 2 * (j - size / 2) + 1];
    ref_adasum(ordered, size, l);
    double worst = 0;
    for (size_t i = 0; i < l->count; i++) worst = fmax(worst, fabs(out[i] - ordered[0][i]));
    if (pass == 0) CHECK(worst > 1e-6); /* the two trees differ: this test tells them apart */
    else check_close(out, TIDE_F64, ordered[0], l, "ranks on shared cores vs reference in the expected order");
  }
  for (int r = 0; r < size; r++) free(g[r]);
  free(out);
  tide_comm_destroy(comm);
  return 0;
}

/* ---- hierarchical ----------------------------------------------------------------- */

static int hier_rank(int rank, int size, void *arg) {
  const run_t *run = arg;
  if (run->flat) setenv("TIDE_ADASUM_HIER", "0", 1);
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  int m = tide_comm_local_size(comm), hosts = tide_comm_node_count(comm);
  CHECK(hosts > 1 && size == m * hosts);
  for (int dt = 0; dt < 2; dt++)
    for (size_t k = 0; k < NLAYOUTS; k++) {
      tide_dtype_t d = dt ? TIDE_F64 : TIDE_F32;
      const layout_t *l = &layouts[k];
      size_t bytes = l->count * tide_dtype_size(d);
      tide_tensor_t t[16];
      size_t nt = tensors_of(l, t);
      char *buf = malloc(bytes);
      CHECK(buf != NULL);
      for (int kind = RANDOM; kind <= HOST_EQUAL; kind += HOST_EQUAL - RANDOM) {
        fill(buf, d, kind, rank, l->count, size, m);
        CHECK_OK(tide_adasum_allreduce(comm, buf, buf, l->count, d, t, nt));
        check_identical(comm, buf, bytes);
        /* hierarchical: Adasum over the hosts' averages; flat: over every rank */
        double *want = reference(kind, d, l, size, m, run->flat ? 1 : hosts);
        check_close(buf, d, want, l, run->flat ? "flat on hosts vs reference" : "hierarchical vs reference");
        free(want);
        if (kind == HOST_EQUAL) { /* a host's ranks agree: hierarchical = flat */
          want = reference(kind, d, l, size, m, 1);
          check_close(buf, d, want, l, "hierarchical vs flat");
          free(want);
        }
      }
      free(buf);
    }
  tide_comm_destroy(comm);
  return 0;
}

/* One rank runs flat, the others hierarchical: a mismatch naming it. */
static int hier_mismatch(int rank, int size, void *arg) {
  (void)size;
  (void)arg;
  if (rank == 1) setenv("TIDE_ADASUM_HIER", "0", 1);
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float buf[8] = {0};
  int rc = tide_adasum_allreduce(comm, buf, buf, 8, TIDE_F32, NULL, 0);
  fprintf(stderr, "rank %d: %s: %s\n", rank, tide_err_name(rc), tide_comm_last_error(comm));
  CHECK_RC(rc, TIDE_EMISMATCH);
  CHECK(strstr(tide_comm_last_error(comm), "TIDE_ADASUM_HIER") != NULL);
  tide_comm_destroy(comm);
  return 0;
}

/* A token of our own: shared-memory segment names derive from it, so jobs
 * of other test processes on the machine never collide with ours. */
static char token[64];

static int run(const char *what, int np, const char *const *hosts, int tcp, int (*fn)(int, int, void *), run_t r) {
  harness_opts_t opts = {np, hosts, tcp, 240, token};
  fprintf(stderr, "%s: np=%d%s\n", what, np, tcp ? " tcp" : "");
  if (harness_run(&opts, fn, &r) == 0) return 0;
  fprintf(stderr, "FAILED: %s np=%d%s\n", what, np, tcp ? " tcp" : "");
  return 1;
}

/* ---- the cases (test_adasum_cases.h: one ctest entry each) ---------------- */

static const run_t checks = {-1, 0, NULL, NULL};

static int case_flat(void) {
  int failed = 0;
  for (int np = 1; np <= 5; np++) failed |= run("flat", np, NULL, 0, flat_rank, checks);
  failed |= run("flat", 3, NULL, 1, flat_rank, checks);
  failed |= run("flat", 4, NULL, 1, flat_rank, checks);
  return failed;
}

static int case_flat_6_to_8(void) {
  int failed = 0;
  for (int np = 6; np <= 8; np++) failed |= run("flat", np, NULL, 0, flat_rank, checks);
  return failed;
}

static int case_bound(void) {
  cpu_set_t allowed;
  CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  for (int cpu = 0, k = 0; cpu < CPU_SETSIZE && k < 2; cpu++)
    if (CPU_ISSET(cpu, &allowed)) two_cpus[k++] = cpu;
  if (two_cpus[1] < 0) {
    fprintf(stderr, "ranks bound to 2 CPUs: skipped (this process may run on one CPU only)\n");
    return 77;
  }
  int failed = 0;
  failed |= run("ranks bound to 2 CPUs, rank r to CPU r % 2", 4, NULL, 0, bound_rank, checks);
  failed |= run("ranks bound to 2 CPUs, rank r to CPU r % 2", 8, NULL, 0, bound_rank, checks);
  failed |= run("ranks bound to 2 CPUs, rank r to CPU r % 2", 4, NULL, 1, bound_rank, checks);
  return failed;
}

static int case_bad_arguments(void) {
  int failed = 0;
  for (int v = 0; v < 3; v++) failed |= run("bad arguments", 3, NULL, 0, flat_rank, (run_t){v, 0, NULL, NULL});
  return failed;
}

static int case_hierarchical(void) {
  const char *hosts4[] = {"a", "a", "b", "b"};
  const char *hosts6[] = {"a", "a", "b", "b", "c", "c"};
  int failed = 0;
  failed |= run("hierarchical, 2 hosts x 2", 4, hosts4, 0, hier_rank, checks);
  failed |= run("hierarchical, 3 hosts x 2", 6, hosts6, 0, hier_rank, checks);
  failed |= run("flat on 2 hosts x 2 (TIDE_ADASUM_HIER=0)", 4, hosts4, 0, hier_rank, (run_t){-1, 1, NULL, NULL});
  failed |= run("hierarchical vs flat mismatch", 4, hosts4, 0, hier_mismatch, checks);
  return failed;
}

/* The same bits whatever the pieces the transport hands over: shm with
 * its 256 KiB pieces, shm with a 64 KiB ring, TCP. */
static int case_same_bits(void) {
  int failed = 0;
  const char *how[] = {"shm", "shm with a 64 KiB ring", "tcp"};
  char path[3][128];
  for (int k = 0; k < 3; k++) {
    snprintf(path[k], sizeof path[k], "/tmp/%s-%d.bin", token, k);
    failed |= run(how[k], 4, NULL, k == 2, flat_rank, (run_t){-1, 0, k == 1 ? "65536" : NULL, path[k]});
  }
  if (!failed) {
    char *bits[3] = {0};
    size_t len[3] = {0};
    for (int k = 0; k < 3; k++) {
      FILE *f = fopen(path[k], "rb");
      if (f == NULL) continue;
      bits[k] = malloc(4 << 20);
      if (bits[k] != NULL) len[k] = fread(bits[k], 1, 4 << 20, f);
      fclose(f);
    }
    for (int k = 1; k < 3; k++)
      if (bits[0] == NULL || bits[k] == NULL || len[k] != len[0] || len[0] == 0 ||
          memcmp(bits[0], bits[k], len[0]) != 0) {
        fprintf(stderr, "FAILED: the results over %s differ from those over %s\n", how[k], how[0]);
        failed = 1;
      }
    for (int k = 0; k < 3; k++) free(bits[k]);
  }
  for (int k = 0; k < 3; k++) unlink(path[k]);
  return failed;
}

/* test_adasum CASE runs one case; no argument runs them all in turn. */
int main(int argc, char **argv) {
  snprintf(token, sizeof token, "test-adasum-%d", (int)getpid());
  static const harness_case_t cases[] = {
#define ADASUM_CASE(name) {#name, case_##name},
#include "test_adasum_cases.h"
#undef ADASUM_CASE
  };
  return harness_cases_main("test_adasum", cases, sizeof cases / sizeof cases[0], argc, argv);
}
