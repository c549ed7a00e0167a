// Gloo baseline for `tide bench`: ring allreduce and allgather over Gloo's
// TCP transport on loopback, rendezvous through a FileStore directory. The
// same sizes, iteration counts, median and JSON lines as tools/tide.c.
// Like bench/mpi_bench.c it repeats tide's option parsing and usage text on
// purpose (duplicates lists the pair): each baseline stands alone, linked
// against its own library only.
//
// Start one process per rank, e.g. for two ranks:
//   d=$(mktemp -d)
//   gloo_bench --rank 1 --size 2 --store $d --op allreduce &
//   gloo_bench --rank 0 --size 2 --store $d --op allreduce; wait; rm -rf $d
// Rank, size and store may also come from GLOO_BENCH_RANK / GLOO_BENCH_SIZE /
// GLOO_BENCH_STORE, or rank and size from TIDE_RANK/TIDE_SIZE (tiderun) or
// OMPI_COMM_WORLD_RANK/SIZE (mpirun).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

enum Op { OP_ALLREDUCE, OP_ALLGATHER, OP_COUNT };
const char *const kOpNames[OP_COUNT] = {"allreduce", "allgather"};
enum Dtype { DT_F32, DT_F64, DT_I32, DT_I64, DT_COUNT };
const char *const kDtypeNames[DT_COUNT] = {"f32", "f64", "i32", "i64"};
enum Reduce { RED_SUM, RED_MIN, RED_MAX, RED_COUNT };
const char *const kReduceNames[RED_COUNT] = {"sum", "min", "max"};
// ring: gloo::allreduce(AllreduceOptions) with the ring algorithm, the call
// PyTorch's ProcessGroupGloo makes. ring_legacy: the older gloo::AllreduceRing
// object (in place, buffers registered once): lower latency for small
// messages on this transport, lower bandwidth for large ones.
enum Algo { ALGO_RING, ALGO_RING_LEGACY, ALGO_COUNT };
const char *const kAlgoNames[ALGO_COUNT] = {"ring", "ring_legacy"};

constexpr double kTargetSeconds = 0.3;
constexpr int kMinIters = 5;
constexpr int kMaxIters = 1000;

struct Options {
  unsigned ops = (1u << OP_COUNT) - 1;
  int dtype = DT_F32;
  int reduce = RED_SUM;
  int algo = ALGO_RING;
  size_t min_bytes = 4096, max_bytes = 256u << 20, factor = 4;
  int iters = 0;  // 0 = adaptive
  int warmup = 3;
  bool check = false;
  bool inplace = false;
  int rank = -1, size = -1;
  std::string store, prefix = "gloo_bench", iface = "lo";
  int timeout_s = 300;
};

[[noreturn]] void die(const std::string &msg, int code = 2) {
  std::fprintf(stderr, "gloo_bench: %s\n", msg.c_str());
  std::exit(code);
}

void usage(FILE *out) {
  std::fprintf(out,
               "usage: gloo_bench --rank R --size N --store DIR [options]\n"
               "  --rank R, --size N  this process's rank and the number of ranks\n"
               "                      (or GLOO_BENCH_RANK/SIZE, TIDE_RANK/SIZE, OMPI_COMM_WORLD_*)\n"
               "  --store DIR         FileStore directory shared by all ranks (or GLOO_BENCH_STORE)\n"
               "  --prefix P          key prefix in the store (default gloo_bench)\n"
               "  --iface IF          network interface of the TCP transport (default lo)\n"
               "  --timeout S         Gloo timeout in seconds (default 300)\n"
               "  --op LIST           allreduce, allgather or all (comma list allowed; default all)\n"
               "  --dtype T           f32 f64 i32 i64 (default f32)\n"
               "  --reduce R          sum min max (default sum)\n"
               "  --algo A            allreduce: ring (AllreduceOptions, as PyTorch) or\n"
               "                      ring_legacy (gloo::AllreduceRing, always in place)\n"
               "  --min-bytes N       smallest size, K/M/G suffixes (default 4K)\n"
               "  --max-bytes N       largest size (default 256M)\n"
               "  --factor F          size multiplier between steps (default 4)\n"
               "  --iters N           timed iterations per size (default adaptive, ~%.1f s, %d..%d)\n"
               "  --warmup N          untimed iterations per size (default 3)\n"
               "  --check             verify results against exact expected values\n"
               "  --inplace           input and output share one buffer\n",
               kTargetSeconds, kMinIters, kMaxIters);
}

int lookup(const std::string &v, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (v == names[i]) return i;
  return -1;
}

bool parse_bytes(const char *text, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno || end == text || text[0] == '-') return false;
  unsigned long long mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ULL << 10, end++;
  else if (*end == 'M' || *end == 'm') mult = 1ULL << 20, end++;
  else if (*end == 'G' || *end == 'g') mult = 1ULL << 30, end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v > SIZE_MAX / mult) return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

bool parse_int(const char *text, int min, int *out) {
  char *end;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (errno || end == text || *end != '\0' || v < min || v > INT32_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

int env_int(const char *a, const char *b, const char *c) {
  for (const char *name : {a, b, c}) {
    const char *v = std::getenv(name);
    int out;
    if (v && parse_int(v, 0, &out)) return out;
  }
  return -1;
}

Options parse_options(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      std::exit(0);
    }
    if (arg == "--check") { o.check = true; continue; }
    if (arg == "--inplace") { o.inplace = true; continue; }
    std::string name = arg, value;
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) die("unknown option or missing value: " + arg);
      value = argv[++i];
    }
    const char *v = value.c_str();
    int iv;
    if (name == "--op") {
      o.ops = 0;
      size_t start = 0;
      while (start <= value.size()) {
        size_t comma = value.find(',', start);
        std::string tok = value.substr(start, comma == std::string::npos ? std::string::npos
                                                                          : comma - start);
        int op = lookup(tok, kOpNames, OP_COUNT);
        if (tok == "all") o.ops = (1u << OP_COUNT) - 1;
        else if (op < 0) die("--op: '" + tok + "' is not supported here (allreduce, allgather or all)");
        else o.ops |= 1u << op;
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (name == "--dtype") {
      if ((o.dtype = lookup(value, kDtypeNames, DT_COUNT)) < 0)
        die("--dtype: '" + value + "' is not supported here (f32, f64, i32 or i64)");
    } else if (name == "--reduce") {
      if ((o.reduce = lookup(value, kReduceNames, RED_COUNT)) < 0)
        die("--reduce: '" + value + "' is not supported here (sum, min or max)");
    } else if (name == "--algo") {
      if ((o.algo = lookup(value, kAlgoNames, ALGO_COUNT)) < 0)
        die("--algo: '" + value + "' is not supported (ring or ring_legacy)");
    } else if (name == "--min-bytes" || name == "--max-bytes") {
      size_t b;
      if (!parse_bytes(v, &b) || b == 0)
        die(name + ": '" + value + "' is not a positive size (e.g. 4096, 4K, 256M, 1G)");
      (name == "--min-bytes" ? o.min_bytes : o.max_bytes) = b;
    } else if (name == "--factor") {
      if (!parse_int(v, 2, &iv)) die("--factor: '" + value + "' is not an integer >= 2");
      o.factor = static_cast<size_t>(iv);
    } else if (name == "--iters") {
      if (!parse_int(v, 1, &o.iters)) die("--iters: '" + value + "' is not an integer >= 1");
    } else if (name == "--warmup") {
      if (!parse_int(v, 0, &o.warmup)) die("--warmup: '" + value + "' is not an integer >= 0");
    } else if (name == "--rank") {
      if (!parse_int(v, 0, &o.rank)) die("--rank: '" + value + "' is not an integer >= 0");
    } else if (name == "--size") {
      if (!parse_int(v, 1, &o.size)) die("--size: '" + value + "' is not an integer >= 1");
    } else if (name == "--timeout") {
      if (!parse_int(v, 1, &o.timeout_s)) die("--timeout: '" + value + "' is not an integer >= 1");
    } else if (name == "--store") {
      o.store = value;
    } else if (name == "--prefix") {
      o.prefix = value;
    } else if (name == "--iface") {
      o.iface = value;
    } else {
      die("unknown option: " + name + " (see --help)");
    }
  }
  if (o.rank < 0) o.rank = env_int("GLOO_BENCH_RANK", "TIDE_RANK", "OMPI_COMM_WORLD_RANK");
  if (o.size < 0) o.size = env_int("GLOO_BENCH_SIZE", "TIDE_SIZE", "OMPI_COMM_WORLD_SIZE");
  if (o.store.empty() && std::getenv("GLOO_BENCH_STORE")) o.store = std::getenv("GLOO_BENCH_STORE");
  if (o.rank < 0 || o.size < 1) die("--rank and --size are required (or GLOO_BENCH_RANK/SIZE)");
  if (o.rank >= o.size) die("--rank must be smaller than --size");
  if (o.store.empty()) die("--store DIR is required (or GLOO_BENCH_STORE): a directory all ranks share");
  if (o.min_bytes > o.max_bytes) die("--min-bytes is larger than --max-bytes");
  return o;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return 1e-9 * static_cast<double>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// Check values as in tools/tide.c: rank r contributes base(g) + 2r.
double base_value(size_t g) { return static_cast<double>(g % 1021 + 1); }
double input_value(size_t g, int r) { return base_value(g) + 2.0 * r; }
double reduced_value(size_t g, int red, int n) {
  double b = base_value(g);
  if (red == RED_SUM) return n * b + static_cast<double>(n) * (n - 1);
  if (red == RED_MIN) return b;
  return b + 2.0 * (n - 1);
}

std::shared_ptr<gloo::Context> g_context;

// The slowest rank's time for every iteration (in place, element-wise max).
void max_across_ranks(std::vector<double> &v) {
  if (g_context->size == 1) return;
  gloo::AllreduceOptions opts(g_context);
  opts.setOutput(v.data(), v.size());
  opts.setReduceFunction(
      static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::max<double>));
  opts.setTag(1000);
  gloo::allreduce(opts);
}

template <typename T>
class Bench {
 public:
  explicit Bench(const Options &o) : o_(o), n_(g_context->size), rank_(g_context->rank) {}

  // Returns false when --check found a wrong result on any rank.
  bool measure(int op, size_t bytes_target) {
    size_t count = bytes_target / sizeof(T);
    if (op == OP_ALLGATHER) count /= n_;  // per-rank input
    if (count == 0) return true;
    size_t bytes = (op == OP_ALLGATHER ? count * n_ : count) * sizeof(T);
    size_t out_elems = op == OP_ALLGATHER ? count * n_ : count;
    bool legacy = op == OP_ALLREDUCE && o_.algo == ALGO_RING_LEGACY;
    bool inplace = o_.inplace || legacy;  // AllreduceRing reduces in place only
    if (legacy && count > INT32_MAX) return true;
    // Allocated once per size and reused by every iteration.
    std::vector<T> out(out_elems), in(inplace ? 0 : count);
    T *in_ptr = inplace ? (op == OP_ALLGATHER ? out.data() + rank_ * count : out.data())
                        : in.data();

    std::unique_ptr<gloo::AllreduceOptions> ar;
    std::unique_ptr<gloo::AllreduceRing<T>> ring;
    std::unique_ptr<gloo::AllgatherOptions> ag;
    if (legacy) {
      std::vector<T *> ptrs{out.data()};
      const gloo::ReductionFunction<T> *fn = o_.reduce == RED_SUM   ? gloo::ReductionFunction<T>::sum
                                             : o_.reduce == RED_MIN ? gloo::ReductionFunction<T>::min
                                                                    : gloo::ReductionFunction<T>::max;
      ring.reset(new gloo::AllreduceRing<T>(g_context, ptrs, static_cast<int>(count), fn));
    } else if (op == OP_ALLREDUCE) {
      ar.reset(new gloo::AllreduceOptions(g_context));
      ar->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      if (!inplace) ar->setInput(in_ptr, count);
      ar->setOutput(out.data(), count);
      using Fn = void (*)(void *, const void *, const void *, size_t);
      ar->setReduceFunction(o_.reduce == RED_SUM   ? static_cast<Fn>(&gloo::sum<T>)
                            : o_.reduce == RED_MIN ? static_cast<Fn>(&gloo::min<T>)
                                                   : static_cast<Fn>(&gloo::max<T>));
      ar->setTag(1);
    } else {
      ag.reset(new gloo::AllgatherOptions(g_context));
      // In place (no input): Gloo takes this rank's block from the output.
      if (!inplace) ag->setInput(in_ptr, count);
      ag->setOutput(out.data(), out_elems);
      ag->setTag(2);
    }
    auto run = [&] {
      if (ring) ring->run();
      else if (ar) gloo::allreduce(*ar);
      else gloo::allgather(*ag);
    };

    fill(in_ptr, out.data(), count, out_elems);
    barrier();
    double warm_min = INFINITY;
    for (int i = 0; i < o_.warmup; i++) {
      auto t0 = Clock::now();
      run();
      warm_min = std::min(warm_min, seconds_since(t0));
    }
    int iters = o_.iters;
    if (iters == 0) {
      if (o_.warmup == 0) {
        auto t0 = Clock::now();
        run();
        warm_min = seconds_since(t0);
      }
      std::vector<double> est(1, warm_min);
      max_across_ranks(est);
      double want = est[0] > 0 ? std::ceil(kTargetSeconds / est[0]) : kMaxIters;
      iters = want < kMinIters ? kMinIters : want > kMaxIters ? kMaxIters : static_cast<int>(want);
    }
    std::vector<double> times(iters);
    barrier();
    for (int i = 0; i < iters; i++) {
      auto t0 = Clock::now();
      run();
      times[i] = seconds_since(t0);
    }
    max_across_ranks(times);
    std::sort(times.begin(), times.end());
    double p50 = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);

    bool ok = true;
    if (o_.check) {
      fill(in_ptr, out.data(), count, out_elems);
      run();
      std::vector<double> bad(1, verify(op, out.data(), count, out_elems, bytes) ? 0.0 : 1.0);
      max_across_ranks(bad);
      ok = bad[0] == 0.0;
    }
    if (rank_ == 0) {
      double factor = op == OP_ALLREDUCE ? 2.0 * (n_ - 1) / n_ : static_cast<double>(n_ - 1) / n_;
      double algbw = static_cast<double>(bytes) / p50 / 1e9;
      std::printf("{\"lib\":\"gloo\",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"np\":%d,"
                  "\"iters\":%d,\"p50_s\":%.9g,\"min_s\":%.9g,\"algbw_GBps\":%.4f,"
                  "\"busbw_GBps\":%.4f,\"ok\":%s,\"inplace\":%s",
                  kOpNames[op], kDtypeNames[o_.dtype], bytes, n_, iters, p50, times[0], algbw,
                  algbw * factor, ok ? "true" : "false", inplace ? "true" : "false");
      if (op == OP_ALLREDUCE)
        std::printf(",\"reduce\":\"%s\",\"algo\":\"%s\"", kReduceNames[o_.reduce],
                    kAlgoNames[o_.algo]);
      std::printf("}\n");
      std::fflush(stdout);
    }
    return ok;
  }

 private:
  void barrier() {
    std::vector<double> token(1, 0.0);
    max_across_ranks(token);
  }

  void fill(T *in, T *out, size_t count, size_t out_elems) {
    // Poison the output first: in place, the input lives inside it.
    for (size_t k = 0; k < out_elems; k++) out[k] = static_cast<T>(-1);
    for (size_t j = 0; j < count; j++)
      in[j] = static_cast<T>(input_value(j, rank_));
  }

  bool verify(int op, const T *out, size_t count, size_t out_elems, size_t bytes) {
    size_t bad = 0, first = 0;
    double got = 0, want = 0;
    for (size_t k = 0; k < out_elems; k++) {
      double w = op == OP_ALLREDUCE ? reduced_value(k, o_.reduce, n_)
                                    : input_value(k % count, static_cast<int>(k / count));
      double g = static_cast<double>(out[k]);
      if (g != w && !bad++) first = k, got = g, want = w;
    }
    if (bad)
      std::fprintf(stderr, "gloo_bench: rank %d: %s %zu bytes: %zu wrong elements, first at %zu: "
                   "got %g, expected %g\n", rank_, kOpNames[op], bytes, bad, first, got, want);
    return bad == 0;
  }

  const Options &o_;
  int n_, rank_;
};

// Untimed, once per job, as in tools/tide.c: 64 KiB allreduces for at least
// 0.1 s, so start-up costs stay out of the first sizes.
void warm_up_job() {
  std::vector<float> in(16384), out(16384);
  gloo::AllreduceOptions opts(g_context);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setInput(in.data(), in.size());
  opts.setOutput(out.data(), out.size());
  opts.setReduceFunction(
      static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
  opts.setTag(3);
  auto t0 = Clock::now();
  for (std::vector<double> elapsed(1, 0.0); elapsed[0] < 0.1;) {
    for (int i = 0; i < 32; i++) gloo::allreduce(opts);
    elapsed[0] = seconds_since(t0);
    max_across_ranks(elapsed);
  }
}

template <typename T>
bool run_all(const Options &o) {
  Bench<T> bench(o);
  warm_up_job();
  bool ok = true;
  for (int op = 0; op < OP_COUNT; op++) {
    if (!(o.ops & (1u << op))) continue;
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      ok &= bench.measure(op, bytes);
      if (bytes > SIZE_MAX / o.factor) break;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char **argv) {
  Options o = parse_options(argc, argv);
  try {
    gloo::transport::tcp::attr attr;
    attr.iface = o.iface;
    attr.ai_family = AF_INET;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(o.store);
    gloo::rendezvous::PrefixStore store(o.prefix, file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(std::chrono::seconds(o.timeout_s));
    context->connectFullMesh(store, dev);
    g_context = context;
    bool ok;
    switch (o.dtype) {
      case DT_F32: ok = run_all<float>(o); break;
      case DT_F64: ok = run_all<double>(o); break;
      case DT_I32: ok = run_all<int32_t>(o); break;
      default: ok = run_all<int64_t>(o); break;
    }
    g_context.reset();
    return ok ? 0 : 1;
  } catch (const std::exception &e) {
    die(std::string("rank ") + std::to_string(o.rank) + ": " + e.what(), 1);
  }
}
