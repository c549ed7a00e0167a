/* Open MPI baseline for `tide bench`: the same sizes, iteration counts,
 * median and JSON lines, with MPI_Allreduce, MPI_Reduce_scatter_block,
 * MPI_Allgather and MPI_Bcast on buffers allocated once per size.
 *
 *   mpirun --oversubscribe -np 2 build/bench/mpi_bench --op allreduce --check
 *
 * Keep the option parsing, sizes and check values in step with tools/tide.c
 * so the two sets of lines compare like for like. That code is copied here
 * on purpose (duplicates lists the pair): the baseline is a standalone MPI
 * program that must not link libtide, so that it measures MPI alone. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"allreduce", "reduce_scatter", "allgather",
                                               "broadcast"};

enum { DT_F32, DT_F64, DT_I32, DT_I64, DT_COUNT };
static const char *const dtype_names[DT_COUNT] = {"f32", "f64", "i32", "i64"};
static const size_t dtype_sizes[DT_COUNT] = {4, 8, 4, 8};

enum { RED_SUM, RED_MIN, RED_MAX, RED_COUNT };
static const char *const reduce_names[RED_COUNT] = {"sum", "min", "max"};

/* Each size runs about this long unless --iters is given. */
#define TARGET_SECONDS 0.3
#define MIN_ITERS 5
#define MAX_ITERS 1000

typedef struct {
  unsigned ops; /* bit per OP_* */
  int dtype;
  int reduce;
  size_t min_bytes, max_bytes, factor;
  int iters; /* 0 = adaptive */
  int warmup;
  int check;
  int inplace;
} options_t;

static int rank, nranks;

static void usage(FILE *out) {
  fprintf(out,
          "usage: mpirun -np N mpi_bench [options]\n"
          "  --op LIST          allreduce, reduce_scatter, allgather, broadcast or all\n"
          "                     (comma-separated list allowed; default all)\n"
          "  --dtype T          f32 f64 i32 i64 (default f32)\n"
          "  --reduce R         sum min max (default sum)\n"
          "  --min-bytes N      smallest size, K/M/G suffixes (default 4K)\n"
          "  --max-bytes N      largest size (default 256M)\n"
          "  --factor F         size multiplier between steps (default 4)\n"
          "  --iters N          timed iterations per size (default adaptive, ~%.1f s, %d..%d)\n"
          "  --warmup N         untimed iterations per size (default 3)\n"
          "  --check            verify results against exact expected values\n"
          "  --inplace          MPI_IN_PLACE\n",
          TARGET_SECONDS, MIN_ITERS, MAX_ITERS);
}

/* Reports a usage error once (rank 0) and stops every rank. */
__attribute__((format(printf, 1, 2))) static void die_usage(const char *fmt, ...) {
  if (rank == 0) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mpi_bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
  }
  MPI_Finalize();
  exit(2);
}

static int lookup(const char *value, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(value, names[i]) == 0) return i;
  return -1;
}

/* "4096", "4K", "256M", "1G" (binary units). */
static int parse_bytes(const char *text, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno || end == text || text[0] == '-') return -1;
  unsigned long long mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ULL << 10, end++;
  else if (*end == 'M' || *end == 'm') mult = 1ULL << 20, end++;
  else if (*end == 'G' || *end == 'g') mult = 1ULL << 30, end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v > (unsigned long long)SIZE_MAX / mult) return -1;
  *out = (size_t)(v * mult);
  return 0;
}

static int parse_int(const char *text, int min, int *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end != '\0' || v < min || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

static void parse_options(int argc, char **argv, options_t *o) {
  *o = (options_t){.ops = (1u << OP_COUNT) - 1, .dtype = DT_F32, .reduce = RED_SUM,
                   .min_bytes = 4096, .max_bytes = 256u << 20, .factor = 4, .warmup = 3};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (rank == 0) usage(stdout);
      MPI_Finalize();
      exit(0);
    }
    if (strcmp(arg, "--check") == 0) { o->check = 1; continue; }
    if (strcmp(arg, "--inplace") == 0) { o->inplace = 1; continue; }
    /* Options with a value: "--opt value" or "--opt=value". */
    char name[32];
    const char *value;
    const char *eq = strchr(arg, '=');
    if (eq && (size_t)(eq - arg) < sizeof name) {
      memcpy(name, arg, (size_t)(eq - arg));
      name[eq - arg] = '\0';
      value = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", arg);
      if (i + 1 >= argc) die_usage("unknown option or missing value: %s", arg);
      value = argv[++i];
    }
    if (strcmp(name, "--op") == 0) {
      char list[256];
      snprintf(list, sizeof list, "%s", value);
      o->ops = 0;
      for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int op = lookup(tok, op_names, OP_COUNT);
        if (strcmp(tok, "all") == 0) o->ops = (1u << OP_COUNT) - 1;
        else if (op < 0)
          die_usage("--op: unknown collective '%s' (allreduce, reduce_scatter, allgather, "
                    "broadcast or all)", tok);
        else o->ops |= 1u << op;
      }
      if (!o->ops) die_usage("--op: empty list");
    } else if (strcmp(name, "--dtype") == 0) {
      if ((o->dtype = lookup(value, dtype_names, DT_COUNT)) < 0)
        die_usage("--dtype: '%s' is not supported here (f32, f64, i32 or i64)", value);
    } else if (strcmp(name, "--reduce") == 0) {
      if ((o->reduce = lookup(value, reduce_names, RED_COUNT)) < 0)
        die_usage("--reduce: '%s' is not supported here (sum, min or max; MPI has no avg)", value);
    } else if (strcmp(name, "--min-bytes") == 0 || strcmp(name, "--max-bytes") == 0) {
      size_t v;
      if (parse_bytes(value, &v) < 0 || v == 0)
        die_usage("%s: '%s' is not a positive size (e.g. 4096, 4K, 256M, 1G)", name, value);
      *(strcmp(name, "--min-bytes") == 0 ? &o->min_bytes : &o->max_bytes) = v;
    } else if (strcmp(name, "--factor") == 0) {
      int v;
      if (parse_int(value, 2, &v) < 0)
        die_usage("--factor: '%s' is not an integer >= 2", value);
      o->factor = (size_t)v;
    } else if (strcmp(name, "--iters") == 0) {
      if (parse_int(value, 1, &o->iters) < 0)
        die_usage("--iters: '%s' is not an integer >= 1", value);
    } else if (strcmp(name, "--warmup") == 0) {
      if (parse_int(value, 0, &o->warmup) < 0)
        die_usage("--warmup: '%s' is not an integer >= 0", value);
    } else {
      die_usage("unknown option: %s (see --help)", name);
    }
  }
  if (o->min_bytes > o->max_bytes) die_usage("--min-bytes is larger than --max-bytes");
}

/* Monotonic seconds, from whole nanoseconds so short intervals stay exact. */
static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double seconds_since(int64_t t0_ns) { return 1e-9 * (double)(now_ns() - t0_ns); }

static MPI_Datatype mpi_dtype(int dt) {
  switch (dt) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_I32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

static MPI_Op mpi_op(int red) { return red == RED_SUM ? MPI_SUM : red == RED_MIN ? MPI_MIN : MPI_MAX; }

/* ---- check values: small integers, exact in every dtype ------------------- */
/* Rank r contributes base(g) + 2r at global element g, base(g) = g % 1021 + 1,
 * so every sum, min and max stays an exact integer and a misplaced block
 * shows up. Same values as tools/tide.c. */
static double base_value(size_t g) { return (double)(g % 1021 + 1); }
static double input_value(size_t g, int r) { return base_value(g) + 2.0 * r; }
static double reduced_value(size_t g, int red) {
  double b = base_value(g), n = nranks;
  if (red == RED_SUM) return n * b + n * (n - 1);
  if (red == RED_MIN) return b;
  return b + 2.0 * (n - 1);
}

static void store(void *buf, int dt, size_t i, double v) {
  switch (dt) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((int64_t *)buf)[i] = (int64_t)v; break;
  }
}

static double load(const void *buf, int dt, size_t i) {
  switch (dt) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
  }
}

/* ---- one (op, size) measurement ------------------------------------------- */

typedef struct {
  int op;
  size_t count;      /* elements per rank in the call (send count; recv for reduce_scatter) */
  size_t bytes;      /* reported size, as nccl-tests */
  size_t send_elems; /* elements in sendbuf / recvbuf */
  size_t recv_elems;
  char *sendbuf, *recvbuf;
} run_t;

static void run_once(const options_t *o, run_t *r) {
  MPI_Datatype dt = mpi_dtype(o->dtype);
  int rc = MPI_SUCCESS;
  switch (r->op) {
    case OP_ALLREDUCE:
      rc = MPI_Allreduce(o->inplace ? MPI_IN_PLACE : r->sendbuf, r->recvbuf, (int)r->count, dt,
                         mpi_op(o->reduce), MPI_COMM_WORLD);
      break;
    case OP_REDUCE_SCATTER:
      rc = MPI_Reduce_scatter_block(o->inplace ? MPI_IN_PLACE : r->sendbuf, r->recvbuf,
                                    (int)r->count, dt, mpi_op(o->reduce), MPI_COMM_WORLD);
      break;
    case OP_ALLGATHER:
      rc = MPI_Allgather(o->inplace ? MPI_IN_PLACE : r->sendbuf, (int)r->count, dt, r->recvbuf,
                         (int)r->count, dt, MPI_COMM_WORLD);
      break;
    case OP_BROADCAST:
      rc = MPI_Bcast(r->recvbuf, (int)r->count, dt, 0, MPI_COMM_WORLD);
      break;
  }
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "mpi_bench: rank %d: %s failed: %s\n", rank, op_names[r->op], msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

/* Writes this rank's input for the checked call; poisons the output. */
static void fill(const options_t *o, run_t *r) {
  int dt = o->dtype;
  size_t esz = dtype_sizes[dt];
  memset(r->recvbuf, 0xff, r->recv_elems * esz); /* NaN / -1: never an expected value */
  switch (r->op) {
    case OP_ALLREDUCE:
    case OP_REDUCE_SCATTER: {
      char *in = o->inplace ? r->recvbuf : r->sendbuf;
      size_t n = r->op == OP_ALLREDUCE ? r->count : r->count * (size_t)nranks;
      for (size_t g = 0; g < n; g++) store(in, dt, g, input_value(g, rank));
      break;
    }
    case OP_ALLGATHER: {
      char *in = o->inplace ? r->recvbuf + (size_t)rank * r->count * esz : r->sendbuf;
      for (size_t j = 0; j < r->count; j++) store(in, dt, j, input_value(j, rank));
      break;
    }
    case OP_BROADCAST:
      if (rank == 0)
        for (size_t g = 0; g < r->count; g++) store(r->recvbuf, dt, g, base_value(g));
      break;
  }
}

static int verify(const options_t *o, const run_t *r) {
  int dt = o->dtype;
  size_t bad = 0, first = 0;
  double got = 0, want = 0;
  size_t n = r->op == OP_ALLGATHER ? r->count * (size_t)nranks : r->count;
  for (size_t k = 0; k < n; k++) {
    double w;
    if (r->op == OP_ALLREDUCE) w = reduced_value(k, o->reduce);
    else if (r->op == OP_REDUCE_SCATTER) w = reduced_value((size_t)rank * r->count + k, o->reduce);
    else if (r->op == OP_ALLGATHER) w = input_value(k % r->count, (int)(k / r->count));
    else w = base_value(k);
    double g = load(r->recvbuf, dt, k);
    if (g != w) {
      if (!bad++) first = k, got = g, want = w;
    }
  }
  if (bad)
    fprintf(stderr, "mpi_bench: rank %d: %s %zu bytes: %zu wrong elements, first at %zu: got %g, "
            "expected %g\n", rank, op_names[r->op], r->bytes, bad, first, got, want);
  return bad == 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Returns 0 when --check found a wrong result on any rank, else 1. */
static int measure(const options_t *o, int op, size_t bytes_target) {
  size_t esz = dtype_sizes[o->dtype];
  size_t n = (size_t)nranks;
  run_t r = {.op = op};
  /* Sizes as nccl-tests reports them: reduce_scatter the send buffer,
   * allgather the whole output; both rounded to a multiple of the ranks. */
  switch (op) {
    case OP_ALLREDUCE:
    case OP_BROADCAST:
      r.count = bytes_target / esz;
      r.send_elems = op == OP_ALLREDUCE && !o->inplace ? r.count : 0;
      r.recv_elems = r.count;
      r.bytes = r.count * esz;
      break;
    case OP_REDUCE_SCATTER:
      r.count = bytes_target / esz / n;
      r.send_elems = o->inplace ? 0 : r.count * n;
      r.recv_elems = o->inplace ? r.count * n : r.count;
      r.bytes = r.count * n * esz;
      break;
    case OP_ALLGATHER:
      r.count = bytes_target / esz / n;
      r.send_elems = o->inplace ? 0 : r.count;
      r.recv_elems = r.count * n;
      r.bytes = r.count * n * esz;
      break;
  }
  if (r.count == 0 || r.count > INT_MAX) return 1;
  if ((r.send_elems && posix_memalign((void **)&r.sendbuf, 4096, r.send_elems * esz)) ||
      posix_memalign((void **)&r.recvbuf, 4096, r.recv_elems * esz)) {
    fprintf(stderr, "mpi_bench: rank %d: out of memory for %zu bytes\n", rank, r.bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  fill(o, &r); /* touches every page before timing */

  MPI_Barrier(MPI_COMM_WORLD);
  double warm_min = INFINITY;
  for (int i = 0; i < o->warmup; i++) {
    int64_t t0 = now_ns();
    run_once(o, &r);
    double t = seconds_since(t0);
    if (t < warm_min) warm_min = t;
  }
  int iters = o->iters;
  if (iters == 0) {
    if (o->warmup == 0) {
      int64_t t0 = now_ns();
      run_once(o, &r);
      warm_min = seconds_since(t0);
    }
    double est;
    MPI_Allreduce(&warm_min, &est, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double want = est > 0 ? ceil(TARGET_SECONDS / est) : MAX_ITERS;
    iters = want < MIN_ITERS ? MIN_ITERS : want > MAX_ITERS ? MAX_ITERS : (int)want;
  }

  double *times = malloc((size_t)iters * sizeof *times);
  if (!times) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < iters; i++) {
    int64_t t0 = now_ns();
    run_once(o, &r);
    times[i] = seconds_since(t0);
  }
  /* An iteration lasts as long as its slowest rank. */
  MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  qsort(times, (size_t)iters, sizeof *times, cmp_double);
  double p50 = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
  double tmin = times[0];
  free(times);

  int ok = 1;
  if (o->check) {
    fill(o, &r);
    run_once(o, &r);
    ok = verify(o, &r);
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  }

  if (rank == 0) {
    double factor = op == OP_ALLREDUCE ? 2.0 * (nranks - 1) / nranks
                    : op == OP_BROADCAST ? 1.0
                                         : (double)(nranks - 1) / nranks;
    double algbw = (double)r.bytes / p50 / 1e9;
    printf("{\"lib\":\"openmpi\",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"np\":%d,"
           "\"iters\":%d,\"p50_s\":%.9g,\"min_s\":%.9g,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,"
           "\"ok\":%s,\"inplace\":%s",
           op_names[op], dtype_names[o->dtype], r.bytes, nranks, iters, p50, tmin, algbw,
           algbw * factor, ok ? "true" : "false", o->inplace ? "true" : "false");
    if (op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER)
      printf(",\"reduce\":\"%s\"", reduce_names[o->reduce]);
    printf("}\n");
    fflush(stdout);
  }
  free(r.sendbuf);
  free(r.recvbuf);
  return ok;
}

/* Untimed, once per job, as in tools/tide.c: 64 KiB allreduces for at least
 * 0.1 s, so start-up costs stay out of the first sizes. */
static void warm_up_job(void) {
  enum { COUNT = 16384, ROUND = 32 };
  float *buf = calloc(2 * COUNT, sizeof *buf);
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  int64_t t0 = now_ns();
  for (double elapsed = 0; elapsed < 0.1;) {
    for (int i = 0; i < ROUND; i++)
      MPI_Allreduce(buf, buf + COUNT, COUNT, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    elapsed = seconds_since(t0);
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  free(buf);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  options_t o;
  parse_options(argc, argv, &o);
  warm_up_job();
  int all_ok = 1;
  for (int op = 0; op < OP_COUNT; op++) {
    if (!(o.ops & (1u << op))) continue;
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      all_ok &= measure(&o, op, bytes);
      if (bytes > SIZE_MAX / o.factor) break;
    }
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
