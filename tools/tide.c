/* tide: the command-line tool (`tide help` prints the same list in full).
 *
 *   tiderun -np 2 tide bench [options]    collective benchmark, one JSON line per size
 *   tide info [--params [--markdown]]     version and this rank's binding, or the TIDE_* parameter table
 *   tide report RUN_DIR                   a tide-train run's metrics as PNG plots (gnuplot)
 *   tide data export|index|stats ...      Fashion-MNIST as a PNG ImageFolder, index.txt and shards,
 *                                         the data disk cache's contents and hit rates
 *   tide ctl --rdzv HOST:PORT resize N | status
 *                                         ask a running elastic job for N workers, or print its state
 *   tide sim [options] WORKLOAD.csv...    cluster scheduler simulation over the Pollux traces
 *   tide profile --model mlp|cnn ...      per-layer forward/backward times of tide's nn engine
 *   tide plan --profile FILE ...          burst-parallel plan: a width per layer
 *   tide help [COMMAND]                   usage, or one command's
 *
 * `tide bench` measures like nccl-tests and prints lines that bench/mpi_bench
 * and bench/gloo_bench print too (keep the three in step): buffers allocated
 * once per size and reused, warm-up, per-iteration times with the slowest
 * rank's time taken for each iteration, median, algbw and busbw. It uses only
 * the public API, as an application would. Single-threaded. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tide_nn.h"
#include "tide.h"

#define EXIT_USAGE 2

/* Each size runs about this long unless --iters is given. */
#define TARGET_SECONDS 0.3
#define MIN_ITERS 5
#define MAX_ITERS 1000

static const char usage_text[] =
    "usage: tide COMMAND [ARGS...]\n"
    "\n"
    "Commands:\n"
    "  bench [options]          benchmark the collectives; run it under the launcher:\n"
    "                           tiderun -np 2 tide bench --op allreduce\n"
    "  info [--params] [--markdown]\n"
    "                           print the version and the CPUs this rank is bound to (run\n"
    "                           it under tiderun to see each rank's), or the TIDE_*\n"
    "                           environment parameters\n"
    "                           (--markdown: as the table of docs/env.md)\n"
    "  report RUN_DIR           draw a tide-train run's metrics as PNG plots (gnuplot)\n"
    "  data export fashion-mnist DIR [--split train|test] [--limit N] [--shard-bytes N]\n"
    "                           write Fashion-MNIST as a PNG ImageFolder (DIR/CLASS/NNNNN.png)\n"
    "                           with DIR/index.txt, so it can be served over HTTP too;\n"
    "                           --shard-bytes: the PNGs packed into shards of about N bytes\n"
    "                           (DIR/shards/NNNNN.bin; K, M suffixes; --shards: 256K) instead\n"
    "                           of one file each: one request per shard, not per image\n"
    "  data index DIR [--shard-bytes N|--shards [--out OUT]]\n"
    "                           write DIR/index.txt for an ImageFolder directory, or pack its\n"
    "                           images into shards of about N bytes in OUT (default DIR)\n"
    "  data stats [CACHE_DIR]   what the data disk cache holds and its hit rates (default:\n"
    "                           TIDE_DATA_CACHE or its default)\n"
    "  ctl --rdzv HOST:PORT resize N | status\n"
    "                           ask a running elastic job (tiderun --elastic --rdzv HOST:PORT)\n"
    "                           for N workers (0: withdraw the request), or print its state;\n"
    "                           TIDE_JOB_TOKEN must be the job's\n"
    "  sim [options] WORKLOAD.csv...\n"
    "                           simulate a cluster scheduler over a workload of the Pollux\n"
    "                           traces (see tide help sim; docs/scheduling.md)\n"
    "  sched [--slots N | --hostfile F] [--dir DIR] [--interval S] [--policy P]\n"
    "                           the live scheduler: shares the slots among elastic jobs and\n"
    "                           resizes them in place (see tide help sched)\n"
    "  submit --min-np N --max-np M [--np K] [--name J] -- PROGRAM ARGS\n"
    "                           run a job under tide sched; jobs: list them; cancel JOB\n"
    "  profile --model mlp|cnn [--batches 1,2,4,...] --out FILE\n"
    "                           measure each layer of tide's nn engine (forward, backward)\n"
    "                           at each per-worker batch (see tide help profile)\n"
    "  plan --profile FILE --workers W --global-batch B [options] --out plan.json\n"
    "                           burst-parallel plan: a width per layer (see tide help plan;\n"
    "                           docs/burst-parallel.md)\n"
    "  help [COMMAND]           print this help, or a command's\n"
    "\n"
    "tide " TIDE_VERSION_STRING "\n";

static const char bench_usage_text[] =
    "usage: tiderun -np N tide bench [options]\n"
    "\n"
    "Times each collective over a range of sizes and prints, on rank 0, one JSON\n"
    "line per (op, size) on stdout: lib, op, dtype, bytes, np, iters, p50_s, min_s,\n"
    "algbw_GBps, busbw_GBps, ok, inplace (and reduce). bytes is the per-rank buffer\n"
    "(allgather: the whole output), as nccl-tests reports it; an iteration's time is\n"
    "its slowest rank's; p50_s is the median over iterations. Before the first size,\n"
    "0.1 s of untimed 64 KiB allreduces keeps start-up costs out of the figures.\n"
    "\n"
    "  --op LIST        allreduce, reduce_scatter, allgather, broadcast or all (the\n"
    "                   four), or adasum (tide_adasum_allreduce, f32/f64, one tensor);\n"
    "                   a comma-separated list is accepted (default all)\n"
    "  --dtype T        f32 f64 i32 i64 f16 bf16 (default f32)\n"
    "  --reduce R       sum avg min max (default sum)\n"
    "  --min-bytes N    smallest size; K, M, G suffixes (default 4K)\n"
    "  --max-bytes N    largest size (default 256M)\n"
    "  --factor F       integer multiplier from one size to the next (default 4)\n"
    "  --iters N        timed iterations per size (default: about 0.3 s per size,\n"
    "                   at least 5 and at most 1000)\n"
    "  --warmup N       untimed iterations per size (default 3)\n"
    "  --check          fill inputs with small rank-dependent integers and verify every\n"
    "                   element of the result exactly (ok=false and exit 1 on a mismatch;\n"
    "                   exact up to 12 ranks in bf16, 27 in f16); adasum: the same input\n"
    "                   on every rank, which must come back unchanged\n"
    "  --inplace        sendbuf == recvbuf (allgather: this rank's block of recvbuf)\n"
    "  --interleave     with several ops: at each size their iterations alternate\n"
    "                   (warm-up and timed), so all see the same stretch of the\n"
    "                   machine's time and their ratio is a fair one on a busy or\n"
    "                   shared machine (lines get \"interleaved\":true)\n";

/* ---- option parsing --------------------------------------------------------- */

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_ADASUM, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"allreduce", "reduce_scatter", "allgather",
                                               "broadcast", "adasum"};
#define OPS_ALL ((1u << OP_ADASUM) - 1) /* --op all: the dense four */

typedef struct {
  unsigned ops; /* bit per OP_* */
  tide_dtype_t dtype;
  tide_op_t reduce;
  size_t min_bytes, max_bytes, factor;
  int iters; /* 0 = adaptive */
  int warmup;
  int check;
  int inplace;
  int interleave; /* the ops' iterations alternate at each size */
} bench_options_t;

/* Every rank parses the same arguments; only one of them should complain. */
static int is_first_rank(void) {
  const char *r = getenv("TIDE_RANK");
  return !r || !*r || strcmp(r, "0") == 0;
}

/* "tide CMD: <message> (see tide help CMD)" once per job, and exit 2. */
static void __attribute__((format(printf, 2, 3), noreturn)) usage_error(const char *cmd, const char *fmt, ...) {
  if (is_first_rank()) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tide %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see tide help %s)\n", cmd);
    va_end(ap);
  }
  exit(EXIT_USAGE);
}

/* "4096", "4K", "256M", "1G" (binary units, optional trailing B). */
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

static void parse_bench_options(int argc, char **argv, bench_options_t *o) {
  *o = (bench_options_t){.ops = OPS_ALL, .dtype = TIDE_F32, .reduce = TIDE_SUM,
                         .min_bytes = 4096, .max_bytes = 256u << 20, .factor = 4, .warmup = 3};
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      if (is_first_rank()) fputs(bench_usage_text, stdout);
      exit(0);
    }
    if (strcmp(arg, "--check") == 0) { o->check = 1; continue; }
    if (strcmp(arg, "--inplace") == 0) { o->inplace = 1; continue; }
    if (strcmp(arg, "--interleave") == 0) { o->interleave = 1; continue; }
    /* Options with a value: "--opt value" or "--opt=value". */
    char name[32];
    const char *value;
    const char *eq = strchr(arg, '=');
    if (strncmp(arg, "--", 2) != 0 || (eq && (size_t)(eq - arg) >= sizeof name))
      usage_error("bench", "unexpected argument '%s'", arg);
    if (eq) {
      memcpy(name, arg, (size_t)(eq - arg));
      name[eq - arg] = '\0';
      value = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", arg);
      value = NULL;
    }
    static const char *const valued[] = {"--op", "--dtype", "--reduce", "--min-bytes",
                                         "--max-bytes", "--factor", "--iters", "--warmup"};
    int known = 0;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(name, valued[k]);
    if (!known) usage_error("bench", "unknown option '%s'", name);
    if (!value) {
      if (i + 1 >= argc) usage_error("bench", "%s needs a value", name);
      value = argv[++i];
    }

    if (strcmp(name, "--op") == 0) {
      char list[256];
      snprintf(list, sizeof list, "%s", value);
      o->ops = 0;
      char *save;
      for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int op = -1;
        for (int k = 0; k < OP_COUNT; k++)
          if (strcmp(tok, op_names[k]) == 0) op = k;
        if (strcmp(tok, "all") == 0) o->ops |= OPS_ALL;
        else if (op < 0)
          usage_error("bench", "--op: unknown collective '%s' (allreduce, reduce_scatter, allgather, "
                      "broadcast, all or adasum)", tok);
        else o->ops |= 1u << op;
      }
      if (!o->ops) usage_error("bench", "--op: no collective given");
    } else if (strcmp(name, "--dtype") == 0) {
      int found = -1;
      for (int k = 0; k < TIDE_DTYPE_COUNT; k++)
        if (strcmp(value, tide_dtype_name((tide_dtype_t)k)) == 0) found = k;
      if (found < 0) usage_error("bench", "--dtype: unknown type '%s' (f32, f64, i32, i64, f16 or bf16)", value);
      o->dtype = (tide_dtype_t)found;
    } else if (strcmp(name, "--reduce") == 0) {
      int found = -1;
      for (int k = 0; k < TIDE_OP_COUNT; k++)
        if (strcmp(value, tide_op_name((tide_op_t)k)) == 0) found = k;
      if (found < 0) usage_error("bench", "--reduce: unknown reduction '%s' (sum, avg, min or max)", value);
      o->reduce = (tide_op_t)found;
    } else if (strcmp(name, "--min-bytes") == 0 || strcmp(name, "--max-bytes") == 0) {
      size_t v;
      if (parse_bytes(value, &v) < 0 || v == 0)
        usage_error("bench", "%s: '%s' is not a positive size (e.g. 4096, 4K, 256M, 1G)", name, value);
      *(strcmp(name, "--min-bytes") == 0 ? &o->min_bytes : &o->max_bytes) = v;
    } else if (strcmp(name, "--factor") == 0) {
      int v;
      if (parse_int(value, 2, &v) < 0) usage_error("bench", "--factor: '%s' is not an integer >= 2", value);
      o->factor = (size_t)v;
    } else if (strcmp(name, "--iters") == 0) {
      if (parse_int(value, 1, &o->iters) < 0)
        usage_error("bench", "--iters: '%s' is not an integer >= 1", value);
    } else if (strcmp(name, "--warmup") == 0) {
      if (parse_int(value, 0, &o->warmup) < 0)
        usage_error("bench", "--warmup: '%s' is not an integer >= 0", value);
    }
  }
  if ((o->ops & (1u << OP_ADASUM)) && o->dtype != TIDE_F32 && o->dtype != TIDE_F64)
    usage_error("bench", "--op adasum takes --dtype f32 or f64, not %s", tide_dtype_name(o->dtype));
  if (o->min_bytes > o->max_bytes)
    usage_error("bench", "--min-bytes (%zu) is larger than --max-bytes (%zu)", o->min_bytes, o->max_bytes);
}

/* ---- element access, with the two 16-bit float formats ---------------------- */

static void store_value(void *buf, tide_dtype_t dt, size_t i, double v) { tide_element_set(buf, dt, i, v); }

static double load_value(const void *buf, tide_dtype_t dt, size_t i) { return tide_element_get(buf, dt, i); }

/* ---- check values ------------------------------------------------------------ */
/* Rank r contributes base(g) + 2r at global element g, base(g) = g % m + 1.
 * The offsets 2r sum to n(n-1), so sum, avg, min and max are all exact small
 * integers, and a block landing at the wrong rank or offset shows up. m keeps
 * the sums exact in the narrow types. Same values as bench/mpi_bench.c. */

static size_t check_modulus(tide_dtype_t dt) {
  return dt == TIDE_BF16 ? 5 : dt == TIDE_F16 ? 61 : 1021;
}

static double base_value(tide_dtype_t dt, size_t g) {
  return (double)(g % check_modulus(dt) + 1);
}

static double input_value(tide_dtype_t dt, size_t g, int rank) {
  return base_value(dt, g) + 2.0 * rank;
}

static double reduced_value(tide_dtype_t dt, tide_op_t red, size_t g, int nranks) {
  double b = base_value(dt, g), n = nranks;
  switch (red) {
    case TIDE_SUM: return n * b + n * (n - 1);
    case TIDE_AVG: return b + (n - 1);
    case TIDE_MIN: return b;
    default: return b + 2.0 * (n - 1);
  }
}

/* ---- one (op, size) measurement ------------------------------------------------ */

typedef struct {
  tide_comm_t *comm;
  int rank, nranks;
  const bench_options_t *opt;
  int op;
  size_t count;       /* count argument of the call */
  size_t bytes;       /* reported size, as nccl-tests */
  size_t send_elems;  /* 0 when in place */
  size_t recv_elems;
  size_t block_off, block_len; /* reduce_scatter: this rank's block */
  char *sendbuf, *recvbuf;
} bench_run_t;

static void fail(tide_comm_t *comm, int rank, const char *what, int rc) {
  const char *detail = comm ? tide_comm_last_error(comm) : "";
  fprintf(stderr, "tide bench: rank %d: %s failed: %s (%s)%s%s\n", rank, what, tide_strerror(rc),
          tide_err_name(rc), detail && detail[0] ? ": " : "", detail ? detail : "");
  tide_comm_destroy(comm);
  exit(1);
}

static void run_once(const bench_run_t *r) {
  const bench_options_t *o = r->opt;
  size_t esz = tide_dtype_size(o->dtype);
  int rc = 0;
  switch (r->op) {
    case OP_ALLREDUCE:
      rc = tide_allreduce(r->comm, o->inplace ? r->recvbuf : r->sendbuf, r->recvbuf, r->count,
                          o->dtype, o->reduce);
      break;
    case OP_REDUCE_SCATTER:
      rc = tide_reduce_scatter(r->comm, o->inplace ? r->recvbuf : r->sendbuf, r->recvbuf,
                               r->count, o->dtype, o->reduce);
      break;
    case OP_ALLGATHER:
      rc = tide_allgather(r->comm,
                          o->inplace ? r->recvbuf + (size_t)r->rank * r->count * esz : r->sendbuf,
                          r->recvbuf, r->count, o->dtype);
      break;
    case OP_BROADCAST:
      rc = tide_broadcast(r->comm, r->recvbuf, r->count, o->dtype, 0);
      break;
    case OP_ADASUM:
      rc = tide_adasum_allreduce(r->comm, o->inplace ? r->recvbuf : r->sendbuf, r->recvbuf, r->count,
                                 o->dtype, NULL, 0);
      break;
  }
  if (rc < 0) fail(r->comm, r->rank, op_names[r->op], rc);
}

/* Writes this rank's input for a checked call and poisons the output. */
static void fill(const bench_run_t *r) {
  tide_dtype_t dt = r->opt->dtype;
  size_t esz = tide_dtype_size(dt);
  memset(r->recvbuf, 0xff, r->recv_elems * esz); /* NaN or -1: never an expected value */
  switch (r->op) {
    case OP_ALLREDUCE:
    case OP_REDUCE_SCATTER: {
      char *in = r->opt->inplace ? r->recvbuf : r->sendbuf;
      for (size_t g = 0; g < r->count; g++) store_value(in, dt, g, input_value(dt, g, r->rank));
      break;
    }
    case OP_ALLGATHER: {
      char *in = r->opt->inplace ? r->recvbuf + (size_t)r->rank * r->count * esz : r->sendbuf;
      for (size_t j = 0; j < r->count; j++) store_value(in, dt, j, input_value(dt, j, r->rank));
      break;
    }
    case OP_BROADCAST:
      if (r->rank == 0)
        for (size_t g = 0; g < r->count; g++) store_value(r->recvbuf, dt, g, base_value(dt, g));
      break;
    case OP_ADASUM: { /* Adasum of identical vectors is that vector, exactly */
      char *in = r->opt->inplace ? r->recvbuf : r->sendbuf;
      for (size_t g = 0; g < r->count; g++) store_value(in, dt, g, base_value(dt, g));
      break;
    }
  }
}

/* 1 when every element of this rank's result is right; logs the first wrong one. */
static int verify(const bench_run_t *r) {
  tide_dtype_t dt = r->opt->dtype;
  size_t n = r->op == OP_ALLGATHER        ? r->count * (size_t)r->nranks
             : r->op == OP_REDUCE_SCATTER ? r->block_len
                                          : r->count;
  size_t bad = 0, first = 0;
  double got = 0, want = 0;
  for (size_t k = 0; k < n; k++) {
    double w;
    switch (r->op) {
      case OP_ALLREDUCE: w = reduced_value(dt, r->opt->reduce, k, r->nranks); break;
      case OP_REDUCE_SCATTER:
        w = reduced_value(dt, r->opt->reduce, r->block_off + k, r->nranks);
        break;
      case OP_ALLGATHER: w = input_value(dt, k % r->count, (int)(k / r->count)); break;
      default: w = base_value(dt, k); break;
    }
    double g = load_value(r->recvbuf, dt, k);
    if (g != w && !bad++) first = k, got = g, want = w;
  }
  if (bad)
    fprintf(stderr, "tide bench: rank %d: %s of %zu bytes: %zu of %zu elements wrong, the first "
            "at %zu: got %g, expected %g\n", r->rank, op_names[r->op], r->bytes, bad, n, first,
            got, want);
  return bad == 0;
}

/* Monotonic seconds, from whole nanoseconds so short intervals stay exact. */
static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double seconds_since(int64_t t0_ns) { return 1e-9 * (double)(now_ns() - t0_ns); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void *alloc_or_die(size_t bytes, int rank) {
  void *p = NULL;
  if (bytes && posix_memalign(&p, 4096, bytes) != 0) {
    fprintf(stderr, "tide bench: rank %d: cannot allocate %zu bytes\n", rank, bytes);
    exit(1);
  }
  return p;
}

/* Sets up one (op, size) run: its sizes, buffers and inputs. Returns 0 when
 * the size holds no element for this op (nothing to measure). */
static int prepare(bench_run_t *r, tide_comm_t *comm, const bench_options_t *o, int op,
                   size_t bytes_target) {
  *r = (bench_run_t){.comm = comm, .rank = tide_comm_rank(comm), .nranks = tide_comm_size(comm),
                     .opt = o, .op = op};
  size_t esz = tide_dtype_size(o->dtype), n = (size_t)r->nranks;
  /* Sizes as nccl-tests reports them: reduce_scatter the send buffer,
   * allgather the whole output; both a multiple of the ranks so that every
   * library runs the same element counts. */
  switch (op) {
    case OP_ALLREDUCE:
    case OP_ADASUM:
    case OP_BROADCAST:
      r->count = bytes_target / esz;
      r->bytes = r->count * esz;
      r->send_elems = op != OP_BROADCAST && !o->inplace ? r->count : 0;
      r->recv_elems = r->count;
      break;
    case OP_REDUCE_SCATTER:
      r->count = bytes_target / esz / n * n;
      r->bytes = r->count * esz;
      tide_block(r->count, r->nranks, r->rank, &r->block_off, &r->block_len);
      r->send_elems = o->inplace ? 0 : r->count;
      r->recv_elems = o->inplace ? r->count : r->block_len;
      break;
    case OP_ALLGATHER:
      r->count = bytes_target / esz / n;
      r->bytes = r->count * n * esz;
      r->send_elems = o->inplace ? 0 : r->count;
      r->recv_elems = r->count * n;
      break;
  }
  if (r->count == 0) return 0;
  r->sendbuf = alloc_or_die(r->send_elems * esz, r->rank);
  r->recvbuf = alloc_or_die(r->recv_elems * esz, r->rank);
  fill(r); /* also touches every page before the clock starts */
  return 1;
}

/* Reduces one run's iteration times, checks its result (--check) and prints
 * its line on rank 0. Returns 0 when --check found a wrong result on any rank. */
static int report(bench_run_t *r, double *times, int iters) {
  const bench_options_t *o = r->opt;
  tide_comm_t *comm = r->comm;
  /* An iteration lasts as long as its slowest rank. */
  int rc = tide_allreduce(comm, times, times, (size_t)iters, TIDE_F64, TIDE_MAX);
  if (rc < 0) fail(comm, r->rank, "allreduce of the iteration times", rc);
  qsort(times, (size_t)iters, sizeof *times, cmp_double);
  double p50 = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
  double tmin = times[0];

  int32_t ok = 1;
  if (o->check) {
    fill(r);
    run_once(r);
    ok = verify(r);
    rc = tide_allreduce(comm, &ok, &ok, 1, TIDE_I32, TIDE_MIN);
    if (rc < 0) fail(comm, r->rank, "allreduce of the check result", rc);
  }

  int op = r->op;
  if (r->rank == 0) {
    double factor = op == OP_ALLREDUCE || op == OP_ADASUM ? 2.0 * (r->nranks - 1) / r->nranks
                    : op == OP_BROADCAST ? 1.0
                                         : (double)(r->nranks - 1) / r->nranks;
    double algbw = (double)r->bytes / p50 / 1e9;
    printf("{\"lib\":\"tide\",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"np\":%d,"
           "\"iters\":%d,\"p50_s\":%.9g,\"min_s\":%.9g,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,"
           "\"ok\":%s,\"inplace\":%s",
           op_names[op], tide_dtype_name(o->dtype), r->bytes, r->nranks, iters, p50, tmin, algbw,
           algbw * factor, ok ? "true" : "false",
           o->inplace && op != OP_BROADCAST ? "true" : "false");
    if (op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER)
      printf(",\"reduce\":\"%s\"", tide_op_name(o->reduce));
    if (o->interleave) printf(",\"interleaved\":true");
    printf("}\n");
    fflush(stdout);
  }
  return ok;
}

/* Measures the ops of `ops` (nops of them) at one size. With more than one
 * (--interleave), their iterations alternate, warm-up and timed alike: each
 * op's i-th timed iteration follows the previous op's, so all of them see the
 * same stretch of the machine's time and their ratio does not depend on
 * which one a slow moment of a shared machine fell on. Returns 0 when --check
 * found a wrong result on any rank, else 1. */
static int measure(tide_comm_t *comm, const bench_options_t *o, const int *ops, int nops,
                   size_t bytes_target) {
  bench_run_t runs[OP_COUNT];
  int n = 0, rank = tide_comm_rank(comm);
  for (int k = 0; k < nops; k++) n += prepare(&runs[n], comm, o, ops[k], bytes_target);
  if (n == 0) return 1;

  int rc = tide_barrier(comm);
  if (rc < 0) fail(comm, rank, "barrier", rc);
  double warm_min[OP_COUNT];
  for (int k = 0; k < n; k++) warm_min[k] = INFINITY;
  for (int i = 0; i < o->warmup; i++)
    for (int k = 0; k < n; k++) {
      int64_t t0 = now_ns();
      run_once(&runs[k]);
      double t = seconds_since(t0);
      if (t < warm_min[k]) warm_min[k] = t;
    }
  int iters = o->iters;
  if (iters == 0) {
    /* Every rank must run the same number of iterations: agree on the
     * estimate. Interleaved ops share the count, the largest of theirs. */
    iters = MIN_ITERS;
    for (int k = 0; k < n; k++) {
      if (o->warmup == 0) {
        int64_t t0 = now_ns();
        run_once(&runs[k]);
        warm_min[k] = seconds_since(t0);
      }
      rc = tide_allreduce(comm, &warm_min[k], &warm_min[k], 1, TIDE_F64, TIDE_MAX);
      if (rc < 0) fail(comm, rank, "allreduce of the warm-up time", rc);
      double want = warm_min[k] > 0 ? ceil(TARGET_SECONDS / warm_min[k]) : MAX_ITERS;
      int it = want < MIN_ITERS ? MIN_ITERS : want > MAX_ITERS ? MAX_ITERS : (int)want;
      if (it > iters) iters = it;
    }
  }

  double *times = alloc_or_die((size_t)n * (size_t)iters * sizeof *times, rank);
  rc = tide_barrier(comm);
  if (rc < 0) fail(comm, rank, "barrier", rc);
  for (int i = 0; i < iters; i++)
    for (int k = 0; k < n; k++) {
      int64_t t0 = now_ns();
      run_once(&runs[k]);
      times[(size_t)k * (size_t)iters + (size_t)i] = seconds_since(t0);
    }
  int ok = 1;
  for (int k = 0; k < n; k++) {
    ok &= report(&runs[k], times + (size_t)k * (size_t)iters, iters);
    free(runs[k].sendbuf);
    free(runs[k].recvbuf);
  }
  free(times);
  return ok;
}

/* Untimed, once per job: 64 KiB allreduces for at least 0.1 s (ranks agree
 * on the elapsed time, so they stop together). Start-up costs such as the
 * first pass through freshly mapped transport rings (page faults) would
 * otherwise land in the first sizes measured; a training job pays them once. */
static void warm_up_job(tide_comm_t *comm, int rank) {
  enum { COUNT = 16384, ROUND = 32 };
  float *buf = calloc(2 * COUNT, sizeof *buf);
  if (!buf) {
    fprintf(stderr, "tide bench: rank %d: out of memory\n", rank);
    exit(1);
  }
  int64_t t0 = now_ns();
  for (double elapsed = 0; elapsed < 0.1;) {
    for (int i = 0; i < ROUND; i++) {
      int rc = tide_allreduce(comm, buf, buf + COUNT, COUNT, TIDE_F32, TIDE_SUM);
      if (rc < 0) fail(comm, rank, "warm-up allreduce", rc);
    }
    elapsed = seconds_since(t0);
    int rc = tide_allreduce(comm, &elapsed, &elapsed, 1, TIDE_F64, TIDE_MAX);
    if (rc < 0) fail(comm, rank, "warm-up allreduce", rc);
  }
  free(buf);
}

static int cmd_bench(int argc, char **argv) {
  bench_options_t o;
  parse_bench_options(argc, argv, &o);

  tide_comm_t *comm = NULL;
  int rc = tide_comm_init(&comm);
  if (rc < 0) {
    fprintf(stderr, "tide bench: joining the job failed: %s (%s)\n", tide_strerror(rc),
            tide_err_name(rc));
    return 1;
  }
  warm_up_job(comm, tide_comm_rank(comm));
  int all_ok = 1, ops[OP_COUNT], nops = 0;
  for (int op = 0; op < OP_COUNT; op++)
    if (o.ops & (1u << op)) ops[nops++] = op;
  /* One op after another, each over the sizes; interleaved: the sizes one
   * after another, the ops together at each. */
  for (int k = 0; k < nops; k += o.interleave ? nops : 1) {
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      all_ok &= measure(comm, &o, ops + k, o.interleave ? nops : 1, bytes);
      if (bytes > SIZE_MAX / o.factor) break;
    }
  }
  int rank = tide_comm_rank(comm);
  tide_comm_destroy(comm);
  if (!all_ok && rank == 0) fprintf(stderr, "tide bench: --check found wrong results (ok=false)\n");
  return all_ok ? 0 : 1;
}

/* ---- info ----------------------------------------------------------------------- */

/* One line: the CPUs this process may run on, who bound it, and its default
 * compute threads. */
static int print_binding(void) {
  int threads;
  if (tide_compute_threads(NULL, &threads) != 0) {
    fprintf(stderr, "tide info: fix the TIDE_* variable named above\n");
    return 1;
  }
  char cpus[512];
  int bound;
  tide_process_cpus(cpus, sizeof cpus, &bound);
  const char *rank = getenv("TIDE_RANK"), *local = getenv("TIDE_LOCAL_RANK"), *local_size = getenv("TIDE_LOCAL_SIZE");
  const char *by_tiderun = getenv("TIDE_CPUS"), *bind = getenv("TIDE_BIND");
  if (rank != NULL && local != NULL && local_size != NULL)
    printf("binding: rank %s (local %s of %s): ", rank, local, local_size);
  else
    printf("binding: ");
  if (by_tiderun != NULL && bound)
    printf("cpus %s, bound by tiderun (--bind %s)", cpus, bind != NULL ? bind : "?");
  else if (by_tiderun != NULL)
    printf("cpus %s, unbound (tiderun --bind none)", cpus);
  else
    printf("cpus %s, not bound by tide (TIDE_BIND applies in tide_comm_init)", cpus);
  printf("; compute threads %d\n", threads);
  return 0;
}

static int cmd_info(int argc, char **argv) {
  int params = 0, markdown = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--params") == 0) params = 1;
    else if (strcmp(argv[i], "--markdown") == 0) params = markdown = 1;
    else {
      fprintf(stderr, "tide info: unknown option '%s' (--params, --markdown)\n", argv[i]);
      return EXIT_USAGE;
    }
  }
  if (params) {
    tide_params_print(stdout, markdown);
    return 0;
  }
  printf("tide %s\n", TIDE_VERSION_STRING);
  return argv == NULL ? 0 : print_binding();
}

/* ---- report ---------------------------------------------------------------------- */

/* A number of a metrics.jsonl line (the schema is libtide's: tide_metric_read). */
#define METRIC(name) tide_metric_read(line, TIDE_METRIC_##name)

/* Multiplexing (docs/elastic.md): a background job's pauses, or a
 * foreground's step time while background jobs ran against its solo one. */
typedef struct {
  const char *role; /* "background", "foreground" or NULL: neither */
  long steps, pauses;
  double step_total_s, paused_s, solo_s;
  double *shared_s; /* a foreground's step_s while a background ran */
  size_t nshared, cap;
} multiplex_t;

static void multiplex_add(multiplex_t *m, const char *line) {
  double paused = METRIC(PAUSED_S), solo = METRIC(SOLO_STEP_S),
         jobs = METRIC(BACKGROUND_JOBS), step_s = METRIC(STEP_S),
         pauses = METRIC(PAUSES);
  m->steps++;
  if (step_s > 0) m->step_total_s += step_s;
  if (paused > 0 || pauses > 0) m->role = "background";
  if (paused > 0) m->paused_s += paused;
  if (pauses > 0) m->pauses = (long)pauses;
  if (solo > 0) {
    m->role = "foreground";
    m->solo_s = solo;
  }
  if (jobs > 0 && step_s > 0) {
    if (m->nshared == m->cap) {
      size_t cap = m->cap ? 2 * m->cap : 256;
      double *grown = realloc(m->shared_s, cap * sizeof *grown);
      if (grown == NULL) return;
      m->shared_s = grown;
      m->cap = cap;
    }
    m->shared_s[m->nshared++] = step_s;
  }
}

/* multiplex.png: step time per step, with the pauses (background) or the
 * solo step time and its 110% guard (foreground). Columns as cmd_report
 * writes them: 15 step_s, 16 paused_s, 17 solo_step_s, 18 background_jobs. */
static void multiplex_plot(FILE *gp, const multiplex_t *m, const char *dir) {
  fprintf(gp, "set output '%s/multiplex.png'\nset terminal pngcairo size 900,560 noenhanced\nset yrange [0:*]\n"
              "set xlabel 'step'\nset ylabel 'seconds'\n", dir);
  if (strcmp(m->role, "background") == 0)
    fprintf(gp, "set title 'background job: step time and time paused by the guard (%ld pauses)'\n"
                "plot s u 1:15 w l lc rgb '#0000c0' t 'step_s', s u 1:16 w l lc rgb '#c00000' t 'paused_s'\n",
            m->pauses);
  else
    fprintf(gp, "set title 'foreground job: step time, solo step time and the guard (110%%)'\n"
                "plot s u 1:15 w l lc rgb '#c0c0ff' t 'step_s', s u 1:17 w l lw 2 lc rgb '#008000' t 'solo', "
                "s u 1:($17 * 1.1) w l lc rgb '#c00000' t 'solo x 1.1', "
                "s u 1:($18 > 0 ? $15 : 1/0) w p pt 7 ps 0.4 lc rgb '#0000c0' t 'with a background job'\n");
}

static void multiplex_print(multiplex_t *m) {
  if (m->role != NULL && strcmp(m->role, "background") == 0)
    printf("multiplexing: background job, %ld steps, %ld pauses, %.1f s paused of %.1f s of steps (%.0f%%)\n",
           m->steps, m->pauses, m->paused_s, m->step_total_s,
           m->step_total_s > 0 ? 100 * m->paused_s / m->step_total_s : 0.0);
  if (m->role != NULL && strcmp(m->role, "foreground") == 0) {
    double shared = NAN;
    if (m->nshared > 0) {
      qsort(m->shared_s, m->nshared, sizeof *m->shared_s, cmp_double);
      shared = m->shared_s[m->nshared / 2];
    }
    printf("multiplexing: foreground job, solo step %.4f s; median step %.4f s (%.3fx) over the %zu of %ld steps "
           "that ended while a background job ran\n",
           m->solo_s, shared, shared / m->solo_s, m->nshared, m->steps);
  }
  free(m->shared_s);
}

/* Draws runs/NAME's metrics with gnuplot: loss and accuracy against time and
 * steps, throughput, and the share of time spent communicating; with
 * multiplexing, the pauses or the step time against the solo one. */
static int cmd_report(int argc, char **argv) {
  if (argc != 1 || argv[0][0] == '-') {
    fprintf(stderr, "usage: tide report RUN_DIR   (e.g. tide report runs/mlp-np4)\n");
    return EXIT_USAGE;
  }
  const char *dir = argv[0];
  char path[4096], steps_path[4096], epochs_path[4096];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *in = fopen(path, "r");
  if (in == NULL) {
    fprintf(stderr, "tide report: cannot read %s: %s (is %s a tide-train run folder?)\n", path, strerror(errno),
            dir);
    return 1;
  }
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    fprintf(stderr, "tide report: gnuplot not found: install the Debian package gnuplot-nox\n");
    fclose(in);
    return 1;
  }
  snprintf(steps_path, sizeof steps_path, "%s/.steps.dat", dir);
  snprintf(epochs_path, sizeof epochs_path, "%s/.epochs.dat", dir);
  FILE *steps = fopen(steps_path, "w"), *epochs = fopen(epochs_path, "w");
  if (steps == NULL || epochs == NULL) {
    fprintf(stderr, "tide report: cannot write in %s: %s\n", dir, strerror(errno));
    fclose(in);
    if (steps) fclose(steps);
    if (epochs) fclose(epochs);
    return 1;
  }
  char line[4096];
  long nsteps = 0, nepochs = 0;
  double comm_sum = 0, compute_sum = 0;
  multiplex_t mux = {.solo_s = NAN};
  while (fgets(line, sizeof line, in) != NULL) {
    tide_metrics_line_t kind = tide_metrics_line_kind(line);
    if (kind == TIDE_METRICS_STEP) {
      multiplex_add(&mux, line);
      double c = METRIC(COMM_S), k = METRIC(COMPUTE_S);
      comm_sum += c;
      compute_sum += k;
      fprintf(steps, "%g %g %g %g %g %g %g %g %g %g %g %g %g ", METRIC(STEP),
              METRIC(TIME_S), METRIC(LOSS), METRIC(IMAGES_PER_S), c / (c + k),
              METRIC(LR), METRIC(NOISE_SCALE), METRIC(GLOBAL_BATCH),
              METRIC(LR_FACTOR), METRIC(GAIN_RATIO),
              METRIC(RANK_COMPUTE_MIN_S), METRIC(RANK_COMPUTE_MEDIAN_S),
              METRIC(RANK_COMPUTE_MAX_S));
      fprintf(steps, "%g %g %g %g %g\n", METRIC(DATA_S), METRIC(STEP_S),
              METRIC(PAUSED_S), METRIC(SOLO_STEP_S), METRIC(BACKGROUND_JOBS));
      nsteps++;
    } else if (kind != TIDE_METRICS_NONE) {
      /* Test evaluations at data-epoch ends, every --eval-every steps and
       * at the end; "epoch" is the progress in epochs, fractional. */
      int end = kind != TIDE_METRICS_EVAL;
      fprintf(epochs, "%g %g %g %g %g\n", METRIC(EPOCH), METRIC(STEP),
              METRIC(TIME_S), METRIC(TEST_LOSS),
              100 * METRIC(TEST_ACCURACY));
      nepochs += end;
    }
  }
  fclose(in);
  fclose(steps);
  fclose(epochs);
  if (nsteps == 0) {
    fprintf(stderr, "tide report: %s has no step records\n", path);
    free(mux.shared_s);
    return 1;
  }
  char script_path[4096];
  snprintf(script_path, sizeof script_path, "%s/.report.gp", dir);
  FILE *gp = fopen(script_path, "w");
  if (gp == NULL) {
    fprintf(stderr, "tide report: cannot write %s: %s\n", script_path, strerror(errno));
    return 1;
  }
  /* A smoothed trend over the faint per-step line. */
  fprintf(gp,
          "set terminal pngcairo size 900,560 noenhanced\n"
          "set grid\nset key top right\n"
          "s = '%s'; e = '%s'\n"
          "set output '%s/loss_time.png'\nset title 'training loss'\nset xlabel 'seconds'\nset ylabel 'loss'\n"
          "plot s u 2:3 w l lc rgb '#c0c0ff' t 'per step', s u 2:3 smooth bezier lw 2 lc rgb '#0000c0' t 'trend'%s\n"
          "set output '%s/loss_steps.png'\nset xlabel 'step'\n"
          "plot s u 1:3 w l lc rgb '#c0c0ff' t 'per step', s u 1:3 smooth bezier lw 2 lc rgb '#0000c0' t 'trend'%s\n"
          "set output '%s/accuracy.png'\nset title 'test accuracy'\nset ylabel 'accuracy (%%)'\nset xlabel 'seconds'\n"
          "%s\n"
          "set output '%s/throughput.png'\nset title 'throughput'\nset xlabel 'step'\nset ylabel 'images/s'\n"
          "plot s u 1:4 w l lc rgb '#c0e0c0' t 'per step', s u 1:4 smooth bezier lw 2 lc rgb '#008000' t 'trend'\n"
          "set output '%s/comm_share.png'\nset title sprintf('share of step time communicating (mean %%.1f%%%%)', %g)\n"
          "set ylabel 'communication / (compute + communication)'\nset yrange [0:1]\n"
          "plot s u 1:5 w l lc rgb '#f0c0c0' t 'per step', s u 1:5 smooth bezier lw 2 lc rgb '#c00000' t 'trend'\n"
          "set output '%s/adaptation.png'\nset terminal pngcairo size 900,1100 noenhanced\nset yrange [*:*]\n"
          "set multiplot layout 3,1\n"
          "set title 'noise scale (B_simple) and global batch'\nset xlabel 'step'\nset ylabel 'samples'\n"
          "set logscale y\n"
          "plot s u 1:7 w l lw 2 lc rgb '#0000c0' t 'noise scale', s u 1:8 w l lw 2 lc rgb '#c00000' t 'global batch'\n"
          "unset logscale y\nset title 'learning-rate factor and AdaScale gain ratio'\nset ylabel 'factor'\nset yrange [0:*]\n"
          "plot s u 1:9 w l lw 2 lc rgb '#008000' t 'lr factor', s u 1:10 w l lc rgb '#806000' t 'gain ratio'\n"
          "set title 'per-rank compute time of each step (fastest, median, slowest rank)'\nset ylabel 'seconds'\n"
          "set yrange [*:*]\n"
          "plot s u 1:11 w l lc rgb '#80c080' t 'fastest', s u 1:12 w l lc rgb '#0000c0' t 'median', "
          "s u 1:13 w l lc rgb '#c00000' t 'slowest'\nunset multiplot\n"
          "set output '%s/data_wait.png'\nset terminal pngcairo size 900,560 noenhanced\n"
          "set title 'time each step waited for its data (data_s; 0 without the loader)'\n"
          "set xlabel 'step'\nset ylabel 'share of step time'\nset yrange [0:*]\n"
          /* all zeros (no loader) would make gnuplot warn of an empty range */
          "stats s u ($15 > 0 ? $14 / $15 : 0) nooutput\nif (STATS_max <= 0) set yrange [0:1]\n"
          "plot s u 1:($15 > 0 ? $14 / $15 : 0) w l lc rgb '#c08000' t 'data_s / step_s'\n",
          steps_path, epochs_path, dir,
          nepochs > 0 ? ", e u 3:4 w lp pt 7 lw 2 lc rgb '#c00000' t 'test loss'" : "", dir,
          nepochs > 0 ? ", e u 2:4 w lp pt 7 lw 2 lc rgb '#c00000' t 'test loss'" : "", dir,
          /* a run stopped before its first evaluation (a background job stopped with its foreground) */
          nepochs > 0 ? "plot e u 3:5 w lp pt 7 lw 2 t 'test accuracy'"
                      : "set label 1 'no test evaluation' at graph 0.5,0.5 center\nplot [0:1] [0:1] 1/0 notitle\n"
                        "unset label 1",
          dir, dir,
          100 * comm_sum / (comm_sum + compute_sum), dir, dir);
  if (mux.role != NULL) multiplex_plot(gp, &mux, dir);
  fclose(gp);
  char cmd[8300];
  snprintf(cmd, sizeof cmd, "gnuplot '%s'", script_path);
  if (system(cmd) != 0) {
    fprintf(stderr, "tide report: gnuplot failed on %s\n", script_path);
    return 1;
  }
  remove(script_path);
  remove(steps_path);
  remove(epochs_path);
  printf("tide report: %s/{loss_time,loss_steps,accuracy,throughput,comm_share,adaptation,data_wait%s}.png (%ld steps, %ld epochs)\n", dir,
         mux.role != NULL ? ",multiplex" : "", nsteps, nepochs);
  multiplex_print(&mux);
  return 0;
}

/* ---- tide data -------------------------------------------------------------- */

/* "262144", "256K", "1M": bytes, > 0. */
static int parse_byte_count(const char *what, const char *v, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (end != v && (*end == 'K' || *end == 'k')) n <<= 10, end++;
  else if (end != v && (*end == 'M' || *end == 'm')) n <<= 20, end++;
  if (end == v || *end != '\0' || errno != 0 || n == 0 || v[0] == '-' || n > (1ULL << 40)) {
    fprintf(stderr, "tide data: %s %s must be a byte count > 0 (e.g. 262144, 256K, 1M)\n", what, v);
    return -1;
  }
  *out = n;
  return 0;
}

#define DEFAULT_SHARD_BYTES (256u << 10)

static int data_export(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[0], "fashion-mnist") != 0) {
    fprintf(stderr, "usage: tide data export fashion-mnist DIR [--split train|test] [--limit N] [--from IDX_DIR] "
                    "[--shard-bytes N]\n");
    return EXIT_USAGE;
  }
  const char *dir = argv[1], *split = "train", *from = NULL;
  long limit = -1;
  uint64_t shard_bytes = 0;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--split") == 0 && i + 1 < argc) split = argv[++i];
    else if (strcmp(argv[i], "--from") == 0 && i + 1 < argc) from = argv[++i];
    else if (strcmp(argv[i], "--shards") == 0) shard_bytes = DEFAULT_SHARD_BYTES;
    else if (strcmp(argv[i], "--shard-bytes") == 0 && i + 1 < argc) {
      if (parse_byte_count("--shard-bytes", argv[++i], &shard_bytes) != 0) return EXIT_USAGE;
    } else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc) {
      char *end;
      limit = strtol(argv[++i], &end, 10);
      if (*end != '\0' || limit < 1) {
        fprintf(stderr, "tide data export: --limit %s must be a positive count\n", argv[i]);
        return EXIT_USAGE;
      }
    } else {
      fprintf(stderr, "tide data export: unknown argument '%s'\n", argv[i]);
      return EXIT_USAGE;
    }
  }
  tide_data_summary_t sum;
  if (tide_data_export("fashion-mnist", dir, split, from, limit > 0 ? limit : 0, shard_bytes, &sum) != 0) return 1;
  if (shard_bytes > 0)
    printf("tide data export: %zu images (%.1f MiB of PNG) in %zu shards of about %llu bytes in %s/shards, index "
           "%s/index.txt\n",
           sum.images, (double)sum.bytes / 1048576.0, sum.shards, (unsigned long long)shard_bytes, dir, dir);
  else
    printf("tide data export: %zu images (%.1f MiB of PNG) in %s, index %s/index.txt\n", sum.images,
           (double)sum.bytes / 1048576.0, dir, dir);
  return 0;
}

static int data_index(int argc, char **argv) {
  const char *dir = argc >= 1 ? argv[0] : NULL, *out = NULL;
  uint64_t shard_bytes = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--shards") == 0) {
      shard_bytes = DEFAULT_SHARD_BYTES;
    } else if (strcmp(argv[i], "--shard-bytes") == 0 && i + 1 < argc) {
      if (parse_byte_count("--shard-bytes", argv[++i], &shard_bytes) != 0) return EXIT_USAGE;
    } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
      out = argv[++i];
    } else {
      dir = NULL;
      break;
    }
  }
  if (dir == NULL || (out != NULL && shard_bytes == 0)) {
    fprintf(stderr, "usage: tide data index DIR [--shard-bytes N|--shards [--out OUT_DIR]]\n");
    return EXIT_USAGE;
  }
  tide_data_summary_t sum;
  if (tide_data_index(dir, shard_bytes, out, &sum) != 0) return 1;
  if (shard_bytes > 0)
    printf("tide data index: %zu images in %zu classes packed into %zu shards (%.1f MiB) -> %s/shards, "
           "%s/index.txt\n",
           sum.images, sum.classes, sum.shards, (double)sum.bytes / 1048576.0, out != NULL ? out : dir,
           out != NULL ? out : dir);
  else
    printf("tide data index: %zu images in %zu classes -> %s/index.txt\n", sum.images, sum.classes, dir);
  return 0;
}

static int cmd_data(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "export") == 0) return data_export(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[0], "index") == 0) return data_index(argc - 1, argv + 1);
  if (argc >= 1 && argc <= 2 && strcmp(argv[0], "stats") == 0) {
    char dir[4096];
    tide_data_cache_stats_t st;
    if (argc == 2)
      snprintf(dir, sizeof dir, "%s", argv[1]);
    else if (tide_data_cache_dir(dir, sizeof dir) != 0)
      return 1;
    if (tide_data_cache_stats(dir, &st) != 0) return 1;
    uint64_t lookups = st.hits + st.misses;
    printf("cache %s\n", dir);
    printf("  entries %zu, %.1f MiB (bound TIDE_DATA_CACHE_BYTES=%llu)\n", st.entries, (double)st.bytes / 1048576.0,
           (unsigned long long)st.bound_bytes);
    printf("  lookups %llu: hits %llu, misses %llu, hit rate %.1f%%\n", (unsigned long long)lookups,
           (unsigned long long)st.hits, (unsigned long long)st.misses,
           lookups ? 100.0 * (double)st.hits / (double)lookups : 0.0);
    printf("  bad entries refetched %llu, evicted %llu\n", (unsigned long long)st.refetched,
           (unsigned long long)st.evicted);
    printf("  bytes served from the cache %llu, fetched from sources and stored %llu\n",
           (unsigned long long)st.bytes_served, (unsigned long long)st.bytes_fetched);
    return 0;
  }
  fprintf(stderr, "usage: tide data export fashion-mnist DIR [--split S] [--limit N] [--shard-bytes N] | tide data "
                  "index DIR [--shard-bytes N [--out OUT]] | tide data stats [CACHE_DIR]\n");
  return EXIT_USAGE;
}

/* tide ctl: requests to a running elastic job, through its store. */
static int cmd_ctl(int argc, char **argv) {
  const char *ctl_usage = "usage: tide ctl --rdzv HOST:PORT resize N | status   (TIDE_JOB_TOKEN: the job's)\n";
  if (argc < 3 || strcmp(argv[0], "--rdzv") != 0 ||
      !(strcmp(argv[2], "status") == 0 || (strcmp(argv[2], "resize") == 0 && argc == 4))) {
    fputs(ctl_usage, stderr);
    return EXIT_USAGE;
  }
  char host[256];
  int port, size = 0;
  if (tide_host_port_parse(argv[1], host, sizeof host, &port) != 0) {
    fprintf(stderr, "tide ctl: --rdzv expects HOST:PORT, got \"%s\"\n", argv[1]);
    return EXIT_USAGE;
  }
  if (argc == 4 && parse_int(argv[3], 0, &size) < 0) {
    fprintf(stderr, "tide ctl: resize expects a worker count >= 0, got \"%s\"\n", argv[3]);
    return EXIT_USAGE;
  }
  const char *token = getenv("TIDE_JOB_TOKEN");
  if (token == NULL || *token == 0) {
    fprintf(stderr, "tide ctl: set TIDE_JOB_TOKEN to the job's token\n");
    return EXIT_USAGE;
  }
  tide_store_t *store;
  int rc = tide_store_connect(host, port, token, 5000, &store);
  if (rc != 0) {
    fprintf(stderr, "tide ctl: cannot reach the job's store at %s: %s\n", argv[1], tide_strerror(rc));
    return 1;
  }
  if (argc == 4) {
    rc = tide_elastic_request(store, size);
    if (rc == 0) printf("asked the job for %d worker(s)\n", size);
  } else {
    tide_elastic_status_t st;
    rc = tide_elastic_status(store, &st);
    if (rc == 0) {
      if (st.epoch >= 0)
        printf("epoch: %ld\n", st.epoch);
      else
        printf("epoch: -\n");
      if (st.members >= 0) printf("members: %d%s\n", st.members, st.failed ? " (the epoch cannot start)" : "");
      if (st.target >= 0)
        printf("target: %d\n", st.target);
      else
        printf("target: -\n");
      printf("joiners: %ld\nadmitted: %ld\nwaiting: %d\n", st.joiners, st.admitted, st.waiting);
      printf("done: %s\n", st.done ? "1" : "-");
    }
  }
  tide_store_close(store);
  if (rc != 0) fprintf(stderr, "tide ctl: %s\n", tide_strerror(rc));
  return rc != 0;
}

static const char sim_usage_text[] =
    "usage: tide sim [options] WORKLOAD.csv [WORKLOAD.csv...]\n"
    "\n"
    "Replays each workload (name,time,application,num_replicas,batch_size) on a simulated\n"
    "cluster under each policy, with throughput and statistical efficiency from the Pollux\n"
    "paper's traces, and writes OUT/summary.json and plots (docs/scheduling.md).\n"
    "\n"
    "  --policy P[,P...]    pollux (default), greedy, fifo, tiresias, optimus\n"
    "  --cluster NxS        N nodes of S slots (default 16x4)\n"
    "  --interval S         seconds between allocation rounds (default 60)\n"
    "  --resize-cost S      seconds each change of a job's allocation costs it (default 30)\n"
    "  --start-cost S       seconds a job's start costs it (launch; default: the resize cost)\n"
    "  --start-at-once      a job submitted between rounds starts then on one free slot, as\n"
    "                       tide sched starts it (not fifo, tiresias; default: at the next round)\n"
    "  --traces DIR         the traces (default ../shared/data/pollux-osdi21/traces)\n"
    "  --out DIR            where summary.json and the plots go (default sim-out)\n"
    "  --p P                the power mean's exponent, <= 1 (default -1)\n"
    "  --interference F     slowdown in [0, 1) of multi-node jobs sharing a node (default 0)\n"
    "  --no-avoid           let multi-node jobs share nodes (Pollux's avoidance off)\n"
    "  --seed N             the allocator's seed (default 1)\n"
    "  --arrival-scale F    multiply submission times by F (default 1)\n"
    "  --copies K           submit each job K times (default 1)\n"
    "  --population N, --generations N   the genetic search's (default: 100, 100)\n"
    "  --quiet              no progress bar\n";


static int parse_double(const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || end == text || *end != '\0' || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

typedef struct {
  const char *policy, *workload;
  int last;
} sim_bar_t;

static void sim_progress(void *arg, double done, double now) {
  sim_bar_t *b = arg;
  int pct = (int)(done * 100);
  if (pct == b->last && (long)now % 3600 != 0) return;
  b->last = pct;
  char bar[31];
  for (int i = 0; i < 30; i++) bar[i] = i < pct * 30 / 100 ? '#' : '.';
  bar[30] = 0;
  const char *name = strrchr(b->workload, '/');
  fprintf(stderr, "\r%-8s %-16.16s [%s] %3d%%  t=%.0fs ", b->policy, name ? name + 1 : b->workload, bar, pct, now);
}

static int cmd_sim(int argc, char **argv) {
  tide_sim_options_t o;
  tide_sim_options_init(&o);
  const char *policies = "pollux", *traces = NULL, *out = "sim-out";
  const char **workloads = calloc((size_t)argc + 1, sizeof *workloads);
  int nworkloads = 0, quiet = 0;
  if (workloads == NULL) return 1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(sim_usage_text, stdout);
      free(workloads);
      return 0;
    }
    if (strcmp(a, "--no-avoid") == 0) {
      o.sched.allow_interference = 1;
      continue;
    }
    if (strcmp(a, "--start-at-once") == 0) {
      o.start_at_once = 1;
      continue;
    }
    if (strcmp(a, "--quiet") == 0) {
      quiet = 1;
      continue;
    }
    if (a[0] != '-' || a[1] == 0) {
      workloads[nworkloads++] = a;
      continue;
    }
    if (v == NULL) usage_error("sim", "%s needs a value", a);
    i++;
    double d;
    int k;
    if (strcmp(a, "--policy") == 0) policies = v;
    else if (strcmp(a, "--traces") == 0) traces = v;
    else if (strcmp(a, "--out") == 0) out = v;
    else if (strcmp(a, "--cluster") == 0) {
      char *x;
      long n = strtol(v, &x, 10), per = *x == 'x' ? strtol(x + 1, &x, 10) : 0;
      if (*x != 0 || n < 1 || per < 1 || n > 1 << 16 || per > 1 << 10)
        usage_error("sim", "--cluster: '%s' is not NODESxSLOTS (e.g. 16x4)", v);
      o.nodes = (int)n, o.slots = (int)per;
    } else if (strcmp(a, "--interval") == 0) {
      if (parse_double(v, &d) || !(d > 0)) usage_error("sim", "--interval: '%s' is not a number of seconds > 0", v);
      o.interval = d;
    } else if (strcmp(a, "--start-cost") == 0) {
      if (parse_double(v, &d) || !(d >= 0)) usage_error("sim", "--start-cost: '%s' is not a number of seconds >= 0", v);
      o.start_cost = d;
    } else if (strcmp(a, "--resize-cost") == 0) {
      if (parse_double(v, &d) || !(d >= 0)) usage_error("sim", "--resize-cost: '%s' is not a number of seconds >= 0", v);
      o.resize_cost = d;
    } else if (strcmp(a, "--p") == 0) {
      if (parse_double(v, &d) || !(d <= 1)) usage_error("sim", "--p: '%s' is not a number <= 1", v);
      o.sched.p = d;
    } else if (strcmp(a, "--interference") == 0) {
      if (parse_double(v, &d) || !(d >= 0 && d < 1)) usage_error("sim", "--interference: '%s' is not in [0, 1)", v);
      o.interference = d;
    } else if (strcmp(a, "--arrival-scale") == 0) {
      if (parse_double(v, &d) || !(d > 0)) usage_error("sim", "--arrival-scale: '%s' is not a number > 0", v);
      o.arrival_scale = d;
    } else if (strcmp(a, "--seed") == 0) {
      if (parse_int(v, 0, &k)) usage_error("sim", "--seed: '%s' is not an integer >= 0", v);
      o.sched.seed = (uint64_t)k;
    } else if (strcmp(a, "--copies") == 0) {
      if (parse_int(v, 1, &k)) usage_error("sim", "--copies: '%s' is not an integer >= 1", v);
      o.copies = k;
    } else if (strcmp(a, "--population") == 0) {
      if (parse_int(v, 2, &k)) usage_error("sim", "--population: '%s' is not an integer >= 2", v);
      o.sched.population = k;
    } else if (strcmp(a, "--generations") == 0) {
      if (parse_int(v, 1, &k)) usage_error("sim", "--generations: '%s' is not an integer >= 1", v);
      o.sched.generations = k;
    } else {
      usage_error("sim", "unknown option '%s'", a);
    }
  }
  if (nworkloads == 0) usage_error("sim", "no workload given%s", "");
  if (traces == NULL) traces = "../shared/data/pollux-osdi21/traces";
  if (mkdir(out, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "tide sim: --out: cannot create %s: %s\n", out, strerror(errno));
    free(workloads);
    return 1;
  }
  /* the policies, comma-separated */
  tide_sched_policy_t list[8];
  int npolicies = 0;
  char copy[256];
  snprintf(copy, sizeof copy, "%s", policies);
  for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
    if (npolicies == 8 || tide_sched_policy_parse(p, &list[npolicies]) != 0)
      usage_error("sim", "--policy: '%s' is not a list of pollux, greedy, fifo, tiresias, optimus", policies);
    npolicies++;
  }
  int n = npolicies * nworkloads, done = 0, rc = 0;
  tide_sim_result_t **runs = calloc((size_t)n, sizeof *runs);
  if (runs == NULL) return 1;
  printf("%-9s %-40s %10s %10s %5s %10s %10s\n", "policy", "workload", "avg_jct_s", "makespan_s", "left",
         "round_ms", "round_max");
  for (int p = 0; p < npolicies && rc == 0; p++) {
    for (int w = 0; w < nworkloads && rc == 0; w++) {
      sim_bar_t bar = {tide_sched_policy_name(list[p]), workloads[w], -1};
      o.sched.policy = list[p];
      o.progress = quiet ? NULL : sim_progress;
      o.progress_arg = &bar;
      rc = tide_sim_run(&o, traces, workloads[w], &runs[done]);
      if (!quiet) fputs("\r\033[K", stderr);
      if (rc != 0) {
        fprintf(stderr, "tide sim: %s under %s: %s\n", workloads[w], bar.policy, tide_strerror(rc));
        break;
      }
      int left;
      double avg = tide_sim_result_avg_jct(runs[done], &left), mean, max;
      tide_sim_result_round_time(runs[done], &mean, &max);
      printf("%-9s %-40s %10.0f %10.0f %5d %10.2f %10.2f\n", bar.policy, workloads[w], avg,
             tide_sim_result_makespan(runs[done]), left, mean * 1e3, max * 1e3);
      fflush(stdout);
      done++;
    }
  }
  if (done > 0) {
    for (int p = 0; p < npolicies; p++) {
      double sum = 0;
      int count = 0;
      for (int i = 0; i < done; i++)
        if (i / nworkloads == p) sum += tide_sim_result_avg_jct(runs[i], NULL), count++;
      if (count > 0)
        printf("mean over %d workloads: %s %.0f s\n", count, tide_sched_policy_name(list[p]), sum / count);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", out);
    int wrc = tide_sim_write_summary((const tide_sim_result_t *const *)runs, done, path);
    int plotted = 0;
    if (wrc == 0) wrc = tide_sim_plot((const tide_sim_result_t *const *)runs, done, out, &plotted);
    if (wrc != 0) fprintf(stderr, "tide sim: writing %s: %s\n", out, tide_strerror(wrc));
    else printf("wrote %s%s\n", path, plotted ? " and plots" : " (no gnuplot: no plots)");
    if (rc == 0) rc = wrc;
  }
  for (int i = 0; i < done; i++) tide_sim_result_free(runs[i]);
  free(runs);
  free(workloads);
  return rc == 0 ? 0 : 1;
}

/* ---- profile and plan (docs/burst-parallel.md) ------------------------------------ */

static const char profile_usage_text[] =
    "usage: tide profile --model mlp|cnn|LAYERS [--batches LIST] [--reps N] [--warmup N]\n"
    "                    [--threads N] [--clock wall|cpu] --out FILE\n"
    "\n"
    "Times each layer of tide's nn engine, forward and backward, at each per-worker batch\n"
    "on this machine: --warmup untimed passes (default 3), then --reps timed ones\n"
    "(default 9), the median of each; --threads OpenBLAS threads (default 1, one worker\n"
    "per core). Writes tide's profile format (docs/burst-parallel.md) to FILE.\n"
    "  --batches LIST   comma-separated per-worker batches (default 1,2,4,...,256)\n"
    "  --clock wall|cpu time by the wall clock (default) or by this process's CPU time:\n"
    "                   what a layer costs whatever else runs on the machine\n";

static const char plan_usage_text[] =
    "usage: tide plan --profile FILE [--section NAME] --workers W --global-batch B\n"
    "                 [--amplification A] [--time-slack S] [--bandwidth BYTES_PER_S] [--latency S]\n"
    "                 [--out plan.json] [--no-plot] [--quiet]\n"
    "\n"
    "Chooses each layer's width (a power of two <= W) from a per-layer profile (tide's,\n"
    "or a DeepPool A100 profile file: --section RESNET152 picks a section) so that the\n"
    "predicted iteration time at global batch B is least while no layer's amplification\n"
    "(worker-time at its width over worker-time on one worker) exceeds A (default 2.0).\n"
    "Prints a per-layer table and the plan against plain data parallelism; writes the\n"
    "plan (default plan.json) and, beside it, PREFIX-widths.dat, PREFIX-sweep.dat,\n"
    "PREFIX.gp and (gnuplot on PATH) PREFIX-widths.png, PREFIX-sweep.png.\n"
    "  --time-slack S   the plan with the least worker-time among those at most S times\n"
    "                   slower than the fastest (S >= 1; default 1: the fastest): the\n"
    "                   workers it leaves idle go to a background job\n"
    "  --bandwidth      bytes/s per worker link (default 2.66e11, DeepPool's A100 figure)\n"
    "  --latency        seconds per message (default 40e-6)\n"
    "  --cores N        the workers share N cores (CPU ranks on one host): a layer on w > N\n"
    "                   workers computes w/N times slower (default: a core each)\n"
    "  --check PLAN     evaluate the widths of an existing plan file instead of planning\n"
    "  --simulate       also simulate the cluster: the plan as a foreground job on W\n"
    "                   accelerators and a background job in its idle spans, against plain\n"
    "                   data parallelism (docs/burst-parallel.md); one JSON line\n"
    "  --background FILE [--background-section NAME]  the background job's profile\n"
    "                   (default: the foreground's)\n"
    "  --background-batch N  its batch per accelerator (default: its most efficient)\n"
    "  --piece S        length of the background's pieces (default 0.5e-3, DeepPool's)\n"
    "  --comm-idle      the background also runs while accelerators only communicate\n"
    "                   (beside data parallelism too; default: communication keeps them busy)\n";


static int cmd_profile(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *batch_list = "1,2,4,8,16,32,64,128,256";
  int reps = 9, warmup = 3, threads = 1, cpu_clock = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(profile_usage_text, stdout);
      return 0;
    }
    if (v == NULL) {
      fprintf(stderr, "tide profile: %s needs a value (see tide help profile)\n", a);
      return EXIT_USAGE;
    }
    i++;
    int bad = 0;
    if (strcmp(a, "--model") == 0) model = v;
    else if (strcmp(a, "--out") == 0) out = v;
    else if (strcmp(a, "--batches") == 0) batch_list = v;
    else if (strcmp(a, "--reps") == 0) bad = parse_int(v, 1, &reps);
    else if (strcmp(a, "--warmup") == 0) bad = parse_int(v, 0, &warmup);
    else if (strcmp(a, "--threads") == 0) bad = parse_int(v, 1, &threads);
    else if (strcmp(a, "--clock") == 0) {
      if (strcmp(v, "wall") != 0 && strcmp(v, "cpu") != 0) {
        fprintf(stderr, "tide profile: --clock must be wall or cpu, got '%s'\n", v);
        return EXIT_USAGE;
      }
      cpu_clock = strcmp(v, "cpu") == 0;
    } else {
      fprintf(stderr, "tide profile: unknown option '%s' (see tide help profile)\n", a);
      return EXIT_USAGE;
    }
    if (bad) {
      fprintf(stderr, "tide profile: %s: '%s' is not a valid count\n", a, v);
      return EXIT_USAGE;
    }
  }
  if (model == NULL || out == NULL) {
    fprintf(stderr, "tide profile: %s is required (see tide help profile)\n", model == NULL ? "--model" : "--out");
    return EXIT_USAGE;
  }
  int batches[32], nb = 0;
  for (const char *q = batch_list; *q;) {
    char *end;
    long b = strtol(q, &end, 10);
    if (end == q || b < 1 || b > 65536 || nb == 32 || (*end != ',' && *end != '\0')) {
      fprintf(stderr, "tide profile: --batches: '%s' is not a list of up to 32 batches in [1, 65536]\n", batch_list);
      return EXIT_USAGE;
    }
    batches[nb++] = (int)b;
    q = *end == ',' ? end + 1 : end;
  }
  tide_profile_t *p = NULL;
  nn_set_threads(threads);
  int rc = nn_profile(model, batches, nb, warmup, reps, cpu_clock ? NN_PROFILE_CPU_CLOCK : 0, &p);
  if (rc == 0) rc = tide_profile_write(p, out);
  if (rc == 0) {
    printf("%-28s %6s %12s %12s %12s\n", "layer", "batch", "fwd+bwd_ms", "params_B", "act_B/sample");
    for (int i = 0; i < tide_profile_layer_count(p); i++) {
      const tide_profile_layer_t *l = tide_profile_layer(p, i);
      printf("%-28s %6d %12.4f %12.0f %12.0f\n", l->name, batches[nb - 1],
             tide_profile_time(p, i, batches[nb - 1]) * 1e3, l->param_bytes, l->act_bytes);
    }
    printf("wrote %s (%d layers x %d batches, median of %d)\n", out, tide_profile_layer_count(p), nb, reps);
  } else {
    fprintf(stderr, "tide profile: %s\n", tide_strerror(rc));
  }
  tide_profile_destroy(p);
  return rc == 0 ? 0 : 1;
}

/* tide plan --simulate: the cluster with a background job (tide_cluster_simulate). */
static int plan_simulate(const tide_profile_t *p, const tide_plan_options_t *o, const tide_plan_t *plan,
                         const char *bg_file, const char *bg_section, tide_cluster_options_t *co) {
  tide_profile_t *bg = NULL;
  int rc = bg_file != NULL ? tide_profile_read(bg_file, bg_section, &bg) : 0;
  tide_cluster_result_t r;
  co->background = bg != NULL ? bg : p;
  if (rc == 0) rc = tide_cluster_simulate(p, o, plan, co, &r);
  tide_profile_destroy(bg);
  if (rc != 0) {
    fprintf(stderr, "tide plan --simulate: %s\n", tide_strerror(rc));
    return rc;
  }
  printf("cluster: W %d, foreground %.1f samples/s (iteration %.4f ms), background %.1f samples/s (batch %d, %.1f "
         "samples/s per accelerator alone; it fills %.1f%% of the accelerators' time, %.1f%% idle), total %.1f "
         "samples/s; data parallel alone %.1f samples/s (iteration %.4f ms): %.3fx\n",
         r.workers, r.foreground_rate, r.iteration_time * 1e3, r.background_rate, r.background_batch,
         r.background_per_accelerator, 100 * r.usable_fraction, 100 * r.idle_fraction, r.total_rate, r.dp_rate,
         r.dp_iteration_time * 1e3, r.gain);
  if (co->comm_idle)
    printf("cluster: with the background in communication spans too, data parallel + background %.1f samples/s: "
           "%.3fx\n", r.dp_rate + r.dp_background_rate, r.total_rate / (r.dp_rate + r.dp_background_rate));
  printf("{\"workers\":%d,\"iteration_time_s\":%.6g,\"dp_iteration_time_s\":%.6g,\"foreground_rate\":%.2f,"
         "\"background_rate\":%.2f,\"total_rate\":%.2f,\"dp_rate\":%.2f,\"gain\":%.4f,\"idle_fraction\":%.4f,"
         "\"usable_fraction\":%.4f,\"background_batch\":%d,\"piece_s\":%g,\"comm_idle\":%d,"
         "\"dp_background_rate\":%.2f}\n",
         r.workers, r.iteration_time, r.dp_iteration_time, r.foreground_rate, r.background_rate, r.total_rate,
         r.dp_rate, r.gain, r.idle_fraction, r.usable_fraction, r.background_batch, co->piece, co->comm_idle,
         r.dp_background_rate);
  return 0;
}

static int cmd_plan(int argc, char **argv) {
  tide_plan_options_t o;
  tide_plan_options_init(&o);
  o.workers = 0, o.global_batch = 0;
  const char *profile = NULL, *section = NULL, *out = "plan.json", *check = NULL;
  int plot = 1, quiet = 0;
  /* --simulate */
  const char *bg_file = NULL, *bg_section = NULL;
  int simulate = 0;
  tide_cluster_options_t co;
  tide_cluster_options_init(&co);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(plan_usage_text, stdout);
      return 0;
    }
    if (strcmp(a, "--no-plot") == 0) {
      plot = 0;
      continue;
    }
    if (strcmp(a, "--quiet") == 0) {
      quiet = 1;
      continue;
    }
    if (strcmp(a, "--simulate") == 0) {
      simulate = 1;
      continue;
    }
    if (strcmp(a, "--comm-idle") == 0) {
      co.comm_idle = 1;
      continue;
    }
    if (v == NULL) usage_error("plan", "%s needs a value", a);
    i++;
    if (strcmp(a, "--profile") == 0) profile = v;
    else if (strcmp(a, "--section") == 0) section = v;
    else if (strcmp(a, "--out") == 0) out = v;
    else if (strcmp(a, "--check") == 0) check = v;
    else if (strcmp(a, "--background") == 0) bg_file = v;
    else if (strcmp(a, "--background-section") == 0) bg_section = v;
    else if (strcmp(a, "--background-batch") == 0) {
      if (parse_int(v, 1, &co.background_batch))
        usage_error("plan", "--background-batch: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--piece") == 0) {
      if (parse_double(v, &co.piece) || !(co.piece >= 0))
        usage_error("plan", "--piece: '%s' is not a number of seconds >= 0", v);
    } else if (strcmp(a, "--cores") == 0) {
      if (parse_int(v, 1, &o.cores)) usage_error("plan", "--cores: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--workers") == 0) {
      if (parse_int(v, 1, &o.workers) || (o.workers & (o.workers - 1)) != 0)
        usage_error("plan", "--workers: '%s' is not a power of two >= 1", v);
    } else if (strcmp(a, "--global-batch") == 0) {
      if (parse_int(v, 1, &o.global_batch)) usage_error("plan", "--global-batch: '%s' is not an integer >= 1", v);
    } else if (strcmp(a, "--amplification") == 0) {
      if (parse_double(v, &o.amplification) || !(o.amplification >= 1))
        usage_error("plan", "--amplification: '%s' is not a number >= 1", v);
    } else if (strcmp(a, "--time-slack") == 0) {
      if (parse_double(v, &o.time_slack) || !(o.time_slack >= 1))
        usage_error("plan", "--time-slack: '%s' is not a number >= 1", v);
    } else if (strcmp(a, "--bandwidth") == 0) {
      if (parse_double(v, &o.bandwidth) || !(o.bandwidth > 0))
        usage_error("plan", "--bandwidth: '%s' is not a number of bytes/s > 0", v);
    } else if (strcmp(a, "--latency") == 0) {
      if (parse_double(v, &o.latency) || !(o.latency >= 0))
        usage_error("plan", "--latency: '%s' is not a number of seconds >= 0", v);
    } else {
      usage_error("plan", "unknown option '%s'", a);
    }
  }
  if (profile == NULL) usage_error("plan", "%s is required", "--profile");
  if ((bg_file != NULL || bg_section != NULL || co.background_batch != 0 || co.comm_idle) && !simulate)
    usage_error("plan", "%s", "--background, --background-section, --background-batch and --comm-idle go with --simulate");
  if (bg_section != NULL && bg_file == NULL) usage_error("plan", "%s", "--background-section needs --background FILE");
  if (o.workers == 0) usage_error("plan", "%s is required", "--workers");
  if (o.global_batch == 0) usage_error("plan", "%s is required", "--global-batch");
  tide_profile_t *p = NULL;
  tide_plan_t *plan = NULL, *dp = NULL;
  int *widths = NULL;
  int rc = tide_profile_read(profile, section, &p);
  if (rc == 0 && check != NULL) {
    widths = malloc((size_t)tide_profile_layer_count(p) * sizeof *widths);
    rc = widths == NULL ? TIDE_ENOMEM : tide_plan_read_widths(check, p, o.workers, widths);
    if (rc == 0) rc = tide_plan_evaluate(p, &o, widths, &plan);
  } else if (rc == 0) {
    int64_t t0 = now_ns();
    rc = tide_plan_create(p, &o, &plan);
    if (rc == 0 && !quiet) printf("planned %d layers in %.6f s\n", tide_profile_layer_count(p),
                                  seconds_since(t0));
  }
  tide_plan_options_t od = o;
  od.data_parallel = 1;
  if (rc == 0) rc = tide_plan_create(p, &od, &dp);
  if (rc != 0) {
    fprintf(stderr, "tide plan: %s\n", tide_strerror(rc));
    goto out;
  }
  const tide_plan_layer_t *L;
  int n = tide_plan_layers(plan, &L);
  if (!quiet) {
    printf("%4s %-44s %6s %11s %11s %11s %8s\n", "#", "layer", "width", "compute_ms", "sync_ms", "transfer_ms", "amp");
    for (int i = 0; i < n; i++)
      printf("%4d %-44.44s %6d %11.4f %11.4f %11.4f %8.3f\n", i, tide_profile_layer(p, i)->name, L[i].width,
             L[i].compute * 1e3, L[i].sync * 1e3, L[i].transfer * 1e3, L[i].amplification);
  }
  double t = tide_plan_iteration_time(plan), w = tide_plan_worker_time(plan);
  double td = tide_plan_iteration_time(dp), wd = tide_plan_worker_time(dp);
  printf("model %s  W %d  B %d  amplification <= %g  feasible %s\n", tide_profile_model(p), o.workers,
         o.global_batch, o.amplification, tide_plan_feasible(plan, o.amplification) ? "yes" : "NO");
  printf("iteration time: plan %.4f ms, data parallel %.4f ms (%.3fx)\n", t * 1e3, td * 1e3, td / t);
  printf("worker-time:    plan %.4f worker-ms, data parallel %.4f worker-ms (%.1f%% less)\n", w * 1e3, wd * 1e3,
         100.0 * (1.0 - w / wd));
  if (simulate && (rc = plan_simulate(p, &o, plan, bg_file, bg_section, &co)) != 0) goto out;
  if (check == NULL) {
    rc = tide_plan_write(plan, p, out);
    if (rc == 0 && plot) {
      char prefix[4096];
      size_t len = strlen(out);
      snprintf(prefix, sizeof prefix, "%.*s", (int)(len > 5 && strcmp(out + len - 5, ".json") == 0 ? len - 5 : len),
               out);
      int plotted = 0;
      rc = tide_plan_plot(plan, p, &o, prefix, &plotted);
      if (rc == 0 && !quiet) printf("plots: %s-widths%s, %s-sweep%s\n", prefix, plotted ? ".png" : ".dat", prefix,
                                    plotted ? ".png" : ".dat (no gnuplot)");
    }
    if (rc == 0) printf("wrote %s\n", out);
    else fprintf(stderr, "tide plan: %s\n", tide_strerror(rc));
  }
out:
  free(widths);
  tide_plan_destroy(plan);
  tide_plan_destroy(dp);
  tide_profile_destroy(p);
  return rc == 0 ? 0 : 1;
}

/* tools/tide-sched.c: the live scheduler's commands. */
extern const char tide_cli_sched_usage[];
int tide_cli_sched(int argc, char **argv);
int tide_cli_submit(int argc, char **argv);
int tide_cli_jobs(int argc, char **argv);
int tide_cli_cancel(int argc, char **argv);

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    if (argc >= 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "bench") == 0)
      fputs(bench_usage_text, stdout);
    else if (argc >= 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "sim") == 0)
      fputs(sim_usage_text, stdout);
    else if (argc >= 3 && strcmp(argv[1], "help") == 0 &&
             (strcmp(argv[2], "sched") == 0 || strcmp(argv[2], "submit") == 0 || strcmp(argv[2], "jobs") == 0 ||
              strcmp(argv[2], "cancel") == 0))
      fputs(tide_cli_sched_usage, stdout);
    else if (argc >= 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "plan") == 0)
      fputs(plan_usage_text, stdout);
    else if (argc >= 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "profile") == 0)
      fputs(profile_usage_text, stdout);
    else if (argc >= 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "info") == 0)
      fputs("usage: tide info [--params] [--markdown]\n", stdout);
    else fputs(usage_text, argc < 2 ? stderr : stdout);
    return argc < 2 ? EXIT_USAGE : 0;
  }
  if (strcmp(argv[1], "--version") == 0) return cmd_info(0, NULL);
  if (strcmp(argv[1], "info") == 0) return cmd_info(argc - 2, argv + 2);
  if (strcmp(argv[1], "bench") == 0) return cmd_bench(argc - 2, argv + 2);
  if (strcmp(argv[1], "report") == 0) return cmd_report(argc - 2, argv + 2);
  if (strcmp(argv[1], "data") == 0) return cmd_data(argc - 2, argv + 2);
  if (strcmp(argv[1], "ctl") == 0) return cmd_ctl(argc - 2, argv + 2);
  if (strcmp(argv[1], "sim") == 0) return cmd_sim(argc - 2, argv + 2);
  if (strcmp(argv[1], "sched") == 0) return tide_cli_sched(argc - 2, argv + 2);
  if (strcmp(argv[1], "submit") == 0) return tide_cli_submit(argc - 2, argv + 2);
  if (strcmp(argv[1], "jobs") == 0) return tide_cli_jobs(argc - 2, argv + 2);
  if (strcmp(argv[1], "cancel") == 0) return tide_cli_cancel(argc - 2, argv + 2);
  if (strcmp(argv[1], "profile") == 0) return cmd_profile(argc - 2, argv + 2);
  if (strcmp(argv[1], "plan") == 0) return cmd_plan(argc - 2, argv + 2);
  fprintf(stderr, "tide: unknown command '%s' (see tide help)\n", argv[1]);
  return EXIT_USAGE;
}
