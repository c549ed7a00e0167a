/* The collective checks every test runs on a communicator, whatever joined
 * it (tiderun-style store, MPI): every collective against a scalar
 * reference, every dtype and op, odd counts, in place and not, blocking and
 * nonblocking. Exits non-zero, naming the call, at the first wrong element. */
#include "coll_suite.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static const size_t counts_list[] = {0, 1, 3, 7, 1000, 16411, 300007};
#define NCOUNTS (sizeof counts_list / sizeof counts_list[0])

static int value(int rank, size_t i) { return (int)((i * 7 + (size_t)rank * 13) % 17) - 8; }

static uint16_t to_half(double v, int bf) {
  /* exact for the small integers used here */
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, 4);
  if (bf) return (uint16_t)(x >> 16);
  if (f == 0) return (uint16_t)((x >> 16) & 0x8000);
  uint32_t sign = (x >> 16) & 0x8000, exp = ((x >> 23) & 0xff) - 112, mant = (x >> 13) & 0x3ff;
  return (uint16_t)(sign | exp << 10 | mant);
}

static double from_half(uint16_t h, int bf) {
  if (bf) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
  }
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? ldexp(mant, -24) : ldexp(mant + 1024, exp - 25);
  return (h & 0x8000) ? -v : v;
}

static void store(void *buf, tide_dtype_t t, size_t i, double v) {
  switch (t) {
    case TIDE_F32: ((float *)buf)[i] = (float)v; break;
    case TIDE_F64: ((double *)buf)[i] = v; break;
    case TIDE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case TIDE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case TIDE_F16: ((uint16_t *)buf)[i] = to_half(v, 0); break;
    case TIDE_BF16: ((uint16_t *)buf)[i] = to_half(v, 1); break;
    default: break;
  }
}

static double load(const void *buf, tide_dtype_t t, size_t i) {
  switch (t) {
    case TIDE_F32: return ((const float *)buf)[i];
    case TIDE_F64: return ((const double *)buf)[i];
    case TIDE_I32: return ((const int32_t *)buf)[i];
    case TIDE_I64: return (double)((const int64_t *)buf)[i];
    case TIDE_F16: return from_half(((const uint16_t *)buf)[i], 0);
    case TIDE_BF16: return from_half(((const uint16_t *)buf)[i], 1);
    default: return NAN;
  }
}

static double expect(tide_op_t op, tide_dtype_t t, int size, size_t i) {
  double acc = value(0, i);
  for (int r = 1; r < size; r++) {
    double v = value(r, i);
    if (op == TIDE_MIN) acc = v < acc ? v : acc;
    else if (op == TIDE_MAX) acc = v > acc ? v : acc;
    else acc += v;
  }
  if (op == TIDE_AVG) {
    if (t == TIDE_I32 || t == TIDE_I64) return (double)((int64_t)acc / size);
    return acc / size;
  }
  return acc;
}

static void verify(const void *buf, tide_dtype_t t, tide_op_t op, int size, size_t first, size_t n,
                   const char *what, int rank) {
  double tol = (t == TIDE_F16 || t == TIDE_BF16) ? 2e-2 : 1e-5;
  for (size_t i = 0; i < n; i++) {
    double want = expect(op, t, size, first + i), got = load(buf, t, i);
    if (fabs(got - want) > tol * (1 + fabs(want))) {
      fprintf(stderr, "rank %d: %s %s %s np=%d: element %zu is %g, want %g\n", rank, what, tide_dtype_name(t),
              tide_op_name(op), size, first + i, got, want);
      exit(1);
    }
  }
}

/* Floats whose sum depends on the order of the additions (magnitudes from
 * 2^-20 to 2^20, both signs): allreduce must give every rank the same bits,
 * whatever the algorithm, and be close to the sum in double. */
static void bitwise_identical(tide_comm_t *comm, size_t count, tide_dtype_t t, tide_op_t op) {
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  size_t es = tide_dtype_size(t);
  uint8_t *mine = malloc(count * es), *all = malloc(count * es * (size_t)size);
  double *want = calloc(count, sizeof *want);
  CHECK(mine && all && want);
  for (int r = 0; r < size; r++) {
    unsigned seed = 12345u + (unsigned)r * 7919u;
    for (size_t i = 0; i < count; i++) {
      unsigned u = harness_rand(&seed);
      double v = ldexp((double)(u & 0xffff) / 65536.0 + 0.5, (int)((u >> 16) % 41) - 20) * ((u & 1) ? -1 : 1);
      v = t == TIDE_F32 ? (double)(float)v : v;
      want[i] += v;
      if (r == rank) store(mine, t, i, v);
    }
  }
  CHECK_OK(tide_allreduce(comm, mine, mine, count, t, op));
  CHECK_OK(tide_allgather(comm, mine, all, count * es / 4, TIDE_I32));
  for (int r = 0; r < size; r++)
    if (memcmp(all + (size_t)r * count * es, mine, count * es) != 0) {
      fprintf(stderr, "rank %d: allreduce %s %s of %zu floats: rank %d's result differs in its bits from ours\n",
              rank, tide_dtype_name(t), tide_op_name(op), count, r);
      exit(1);
    }
  double tol = t == TIDE_F32 ? 1e-5 : 1e-12;
  for (size_t i = 0; i < count; i++) {
    double w = op == TIDE_AVG ? want[i] / size : want[i], got = load(mine, t, i);
    /* order-dependent rounding, relative to the largest operand (2^20 * size) */
    if (fabs(got - w) > tol * 2.1e6 * size) {
      fprintf(stderr, "rank %d: allreduce %s of floats: element %zu is %.17g, want %.17g\n", rank,
              tide_dtype_name(t), i, got, w);
      exit(1);
    }
  }
  free(mine);
  free(all);
  free(want);
}

void coll_suite_run(tide_comm_t *comm, size_t max_count, int dtype) {
  int rank = tide_comm_rank(comm), size = tide_comm_size(comm);
  size_t max = counts_list[NCOUNTS - 1] * (size_t)size + 64;
  uint8_t *send = malloc(max * 8), *recv = malloc(max * 8);
  CHECK(send && recv);
  for (int t = 0; t < TIDE_DTYPE_COUNT; t++) {
    if (dtype >= 0 && t != dtype) continue;
    size_t es = tide_dtype_size((tide_dtype_t)t);
    for (size_t c = 0; c < NCOUNTS; c++) {
      size_t count = counts_list[c];
      if (max_count > 0 && count > max_count) continue;
      if ((t == TIDE_F16 || t == TIDE_BF16 || t == TIDE_I64) && count > 20000 && size > 2) continue;
      for (int op = 0; op < TIDE_OP_COUNT; op++) {
        for (size_t i = 0; i < count; i++) store(send, (tide_dtype_t)t, i, value(rank, i));
        memset(recv, 0x5a, count * es);
        CHECK_OK(tide_allreduce(comm, send, recv, count, (tide_dtype_t)t, (tide_op_t)op));
        verify(recv, (tide_dtype_t)t, (tide_op_t)op, size, 0, count, "allreduce", rank);
        CHECK_OK(tide_allreduce(comm, send, send, count, (tide_dtype_t)t, (tide_op_t)op));
        verify(send, (tide_dtype_t)t, (tide_op_t)op, size, 0, count, "allreduce in place", rank);
        /* reduce-scatter */
        for (size_t i = 0; i < count; i++) store(send, (tide_dtype_t)t, i, value(rank, i));
        size_t off, len;
        tide_block(count, size, rank, &off, &len);
        CHECK_OK(tide_reduce_scatter(comm, send, recv, count, (tide_dtype_t)t, (tide_op_t)op));
        verify(recv, (tide_dtype_t)t, (tide_op_t)op, size, off, len, "reduce_scatter", rank);
        CHECK_OK(tide_reduce_scatter(comm, send, send, count, (tide_dtype_t)t, (tide_op_t)op));
        verify(send, (tide_dtype_t)t, (tide_op_t)op, size, off, len, "reduce_scatter in place", rank);
      }
      /* allgather: rank r contributes value(r, i) */
      for (size_t i = 0; i < count; i++) store(send, (tide_dtype_t)t, i, value(rank, i));
      CHECK_OK(tide_allgather(comm, send, recv, count, (tide_dtype_t)t));
      for (int r = 0; r < size; r++)
        for (size_t i = 0; i < count; i++) CHECK(load(recv, (tide_dtype_t)t, (size_t)r * count + i) == value(r, i));
      /* allgather in place: our block already sits at rank * count */
      memset(recv, 0x5a, (size_t)size * count * es);
      for (size_t i = 0; i < count; i++) store(recv, (tide_dtype_t)t, (size_t)rank * count + i, value(rank, i));
      CHECK_OK(tide_allgather(comm, recv + (size_t)rank * count * es, recv, count, (tide_dtype_t)t));
      for (int r = 0; r < size; r++)
        for (size_t i = 0; i < count; i++) CHECK(load(recv, (tide_dtype_t)t, (size_t)r * count + i) == value(r, i));
      /* allgatherv with uneven counts, some zero */
      size_t *vcounts = calloc((size_t)size, sizeof *vcounts), total = 0; /* any size (tests run up to 64 ranks) */
      CHECK(vcounts != NULL);
      for (int r = 0; r < size; r++) total += vcounts[r] = (count * (size_t)(r + 1)) % (count + 3);
      size_t at = 0;
      for (int r = 0; r < rank; r++) at += vcounts[r];
      for (size_t i = 0; i < vcounts[rank]; i++) store(send, (tide_dtype_t)t, i, value(rank, i));
      CHECK_OK(tide_allgatherv(comm, send, vcounts[rank], recv, vcounts, (tide_dtype_t)t));
      at = 0;
      for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < vcounts[r]; i++) CHECK(load(recv, (tide_dtype_t)t, at + i) == value(r, i));
        at += vcounts[r];
      }
      (void)total;
      free(vcounts);
      /* broadcast from every root */
      for (int root = 0; root < size; root++) {
        for (size_t i = 0; i < count; i++) store(recv, (tide_dtype_t)t, i, rank == root ? value(root, i) : 99);
        CHECK_OK(tide_broadcast(comm, recv, count, (tide_dtype_t)t, root));
        for (size_t i = 0; i < count; i++) CHECK(load(recv, (tide_dtype_t)t, i) == value(root, i));
      }
    }
  }
  CHECK_OK(tide_barrier(comm));
  /* real floats: both allreduce paths (small: recursive doubling or MPI's;
   * large: ring or hierarchical) */
  static const size_t float_counts[] = {1000, 300007};
  for (size_t c = 0; c < 2; c++) {
    if (max_count > 0 && float_counts[c] > max_count) continue;
    bitwise_identical(comm, float_counts[c], TIDE_F32, TIDE_SUM);
    bitwise_identical(comm, float_counts[c], TIDE_F64, TIDE_SUM);
    bitwise_identical(comm, float_counts[c], TIDE_F32, TIDE_AVG);
  }
  /* nonblocking: several in flight, then a blocking call after them */
  size_t count = 100003;
  float *a = malloc(count * 4), *b = malloc(count * 4), *c = malloc(count * 4);
  for (size_t i = 0; i < count; i++) a[i] = b[i] = (float)value(rank, i);
  tide_request_t *r1, *r2, *r3;
  CHECK_OK(tide_iallreduce(comm, a, a, count, TIDE_F32, TIDE_SUM, &r1));
  CHECK_OK(tide_iallgather(comm, b, c, 5, TIDE_F32, &r2));
  CHECK_OK(tide_ibarrier(comm, &r3));
  int done = -1;
  CHECK_OK(tide_test(r3, &done));
  CHECK(done == 0 || done == 1);
  CHECK_OK(tide_wait(r1));
  CHECK_OK(tide_wait(r2));
  /* Every rank's progress thread runs the barrier after those two: tide_test
   * must come to say so without a wait (60 s at most). */
  for (int tries = 0; tries < 60000 && (done = -1, tide_test(r3, &done) == 0) && done == 0; tries++)
    usleep(1000);
  CHECK(done == 1);
  CHECK_OK(tide_wait(r3));
  verify(a, TIDE_F32, TIDE_SUM, size, 0, count, "iallreduce", rank);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < 5; i++) CHECK(c[(size_t)r * 5 + i] == value(r, i));
  CHECK_OK(tide_iallreduce(comm, b, b, count, TIDE_F32, TIDE_MAX, &r1));
  CHECK_OK(tide_allreduce(comm, a, c, 7, TIDE_F32, TIDE_MIN)); /* waits for r1 first */
  CHECK_OK(tide_wait(r1));
  verify(b, TIDE_F32, TIDE_MAX, size, 0, count, "iallreduce max", rank);
  free(a);
  free(b);
  free(c);
  free(send);
  free(recv);
}

